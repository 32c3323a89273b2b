import { CelCompileError, compileExpression, goTimeText, headerWire, parseTemplate, RESPONSE_LIMITS, type CelProgram, type PolicyDirection } from '@warren/shared';

/** Edits of raw `[name, value, …]` header pairs, by lower-case name; header values a policy sets. */

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

/** Field-value characters Node and HTTP/1.1 accept, one character per byte (no CR, LF or NUL). */
const VALUE_RE = /^[\t\x20-\x7e\x80-\xff]*$/;

/** Whether `v`, one character per byte (as it is sent), can be a header value. */
export function isValidHeaderValue(v: string): boolean {
  return VALUE_RE.test(v);
}

/** Longest header value a policy's interpolation may make, bytes as sent (`MAX_INTERPOLATED_VALUE` in the shared parser's cost estimate). */
export const MAX_HEADER_VALUE = 8192;

/**
 * Bytes (name, value and 4 of line each) the headers of an answer the policy makes itself
 * (custom-response, redirect) may take. Outbound rules run on those answers too, and the cost
 * bound charges them for a head of at most `RESPONSE_LIMITS.headBytes`, as an upstream's is (Node
 * refuses larger); 32 interpolated values of 8 KiB made a 256 KiB head and outbound expressions
 * ten times their charge. The last KiB is left for the headers the ingress adds.
 */
export const GENERATED_HEAD_BYTES = RESPONSE_LIMITS.headBytes - 1024;

/**
 * Adds `name: value` to an answer's `headers` when it fits in `GENERATED_HEAD_BYTES` with the
 * `used` bytes before it; returns the bytes used after it, or -1 (nothing added) when it does not fit.
 */
export function addWithinHead(headers: Record<string, string>, name: string, value: string, used: number): number {
  const after = used + name.length + value.length + 4;
  if (after > GENERATED_HEAD_BYTES) return -1;
  headers[name] = value;
  return after;
}

/** The evaluation error of a header left out of a generated answer by {@link addWithinHead}. */
export function overHeadError(name: string): Error {
  return new Error(`header ${name} is left out: the answer's headers would be over ${GENERATED_HEAD_BYTES} bytes`);
}

/** Text with `${expr}` parts compiled, in order; the text itself when it has none. */
export type TextTemplate = string | (string | CelProgram)[];

/**
 * `raw` with its `${expr}` parts compiled. Throws `CelCompileError`, unless `lenient`: then a
 * value whose `${…}` does not compile stays literal text (custom-response: only a document
 * stored before it interpolated can have one, the control plane refuses it on save, and it keeps
 * answering as it did then; `parse.ts` `customResponseTemplate`).
 */
export function compileTemplate(raw: string, direction: PolicyDirection, lenient = false): TextTemplate {
  if (lenient && !raw.includes('${')) return raw;
  try {
    const parts = parseTemplate(raw);
    return parts.every((p) => typeof p === 'string') ? raw : parts.map((p) => (typeof p === 'string' ? p : compileExpression(direction, p.expr, false)));
  } catch (err) {
    if (lenient && err instanceof CelCompileError) return raw;
    throw err;
  }
}

/**
 * A header value a policy sets (add-headers, custom-response, redirect), compiled: a literal is
 * already as it is sent (its UTF-8 bytes, `headerWire`: the policy's text is UTF-8, as in
 * ngrok's); else the text's parts, for `interpolateHeader`.
 */
export type HeaderValue = TextTemplate;

export function compileHeaderValue(raw: string, direction: PolicyDirection, lenient = false): HeaderValue {
  const t = compileTemplate(raw, direction, lenient);
  return typeof t === 'string' ? headerWire(t) : t;
}

/**
 * The value of a compiled header, as it is sent: `${…}` parts evaluated by `evaluate` as text
 * (`celToHeaderText`), the whole sent as its UTF-8 bytes (`headerWire`: a header's bytes that
 * are no UTF-8, read by CEL as escapes, go out as they came). Throws what `evaluate` throws, or
 * an Error when the value has a control character or is over `MAX_HEADER_VALUE` bytes: the
 * caller leaves the header out (counted and logged as an evaluation error).
 */
export function interpolateHeader(value: HeaderValue, evaluate: (p: CelProgram) => unknown): string {
  if (typeof value === 'string') return value;
  let text = '';
  for (const p of value) {
    text += typeof p === 'string' ? p : celToHeaderText(evaluate(p));
    if (text.length > MAX_HEADER_VALUE) break;
  }
  const wire = text.length > MAX_HEADER_VALUE ? null : headerWire(text);
  if (wire === null || wire.length > MAX_HEADER_VALUE || !isValidHeaderValue(wire)) throw new Error(`the interpolated value is not a valid header value (a control character, or over ${MAX_HEADER_VALUE} bytes)`);
  return wire;
}

/**
 * A CEL value as header text: strings as is, lists joined with `, `, timestamps in RFC 3339 (as Go
 * writes a time: the fraction without trailing zeros),
 * bytes as UTF-8. A map has no text form (it used to come out as `[object Map]`): it throws, so
 * the interpolation fails as any evaluation error does (counted, logged, the header left out).
 */
export function celToHeaderText(v: unknown): string {
  if (typeof v === 'string') return v;
  if (Array.isArray(v)) return v.map(celToHeaderText).join(', ');
  if (v instanceof Date) return goTimeText(v);
  if (v === null || v === undefined) return '';
  if (v instanceof Uint8Array) return Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString('utf8');
  if (typeof v === 'object' && !(v instanceof Number) && !(v instanceof String) && !(v instanceof Boolean) && String(v) === '[object Object]') {
    throw new Error('a map cannot be written as text: pick one of its values (e.g. req.headers[\'x-name\'])');
  }
  if (v instanceof Map) throw new Error('a map cannot be written as text: pick one of its values (e.g. req.headers[\'x-name\'])');
  return String(v);
}
