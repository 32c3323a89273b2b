/** Edits of raw `[name, value, …]` header pairs, by lower-case name. */

/** The pairs without any header whose lower-case name is in `lower`; the same array when none matched. */
export function withoutHeaders(pairs: string[], lower: ReadonlySet<string>): string[] {
  let out: string[] | null = null;
  for (let i = 0; i + 1 < pairs.length; i += 2) {
    const drop = lower.has(pairs[i]!.toLowerCase());
    if (drop && !out) out = pairs.slice(0, i);
    else if (!drop && out) out.push(pairs[i]!, pairs[i + 1]!);
  }
  return out ?? pairs;
}

/** Field-value characters Node and HTTP/1.1 accept (no CR, LF or NUL). */
const VALUE_RE = /^[\t\x20-\x7e\x80-\xff]*$/;

export function isValidHeaderValue(v: string): boolean {
  return VALUE_RE.test(v);
}

/**
 * A CEL value as header text: strings as is, lists joined with `, `, timestamps in RFC 3339,
 * bytes as UTF-8. A map has no text form (it used to come out as `[object Map]`): it throws, so
 * the interpolation fails as any evaluation error does (counted, logged, the header left out).
 */
export function celToHeaderText(v: unknown): string {
  if (typeof v === 'string') return v;
  if (Array.isArray(v)) return v.map(celToHeaderText).join(', ');
  if (v instanceof Date) return v.toISOString();
  if (v === null || v === undefined) return '';
  if (v instanceof Uint8Array) return Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString('utf8');
  if (typeof v === 'object' && !(v instanceof Number) && !(v instanceof String) && !(v instanceof Boolean) && String(v) === '[object Object]') {
    throw new Error('a map cannot be written as text: pick one of its values (e.g. req.headers[\'x-name\'])');
  }
  if (v instanceof Map) throw new Error('a map cannot be written as text: pick one of its values (e.g. req.headers[\'x-name\'])');
  return String(v);
}
