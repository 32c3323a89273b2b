/**
 * Helpers over CEL values as `@marcbachmann/cel-js` holds them (strings, BigInt ints, `UnsignedInt`
 * uints, number doubles, `Uint8Array` bytes, `Date` timestamps, `Duration`s, arrays, `Map`s or
 * plain objects for maps, registered object types), shared by the ngrok macros
 * (`ngrok-macros.ts`, `string-format.ts`, `list-macros.ts`): their limits, their errors, Go's
 * order of strings, and type names for messages.
 */
import { EvaluationError } from '@marcbachmann/cel-js';
import { textBytes } from '../http-headers.js';

/**
 * Longest string a macro builds (UTF-16 units): a longer result is an evaluation error, found
 * before (or while) it is built. Bounds what a macro that lengthens a string (`replace()` with an
 * empty `old`, `json.encode()`, `format()`) can cost and hand on to later operations.
 */
export const MAX_BUILT_STRING = 65_536;

/**
 * Deepest nesting of lists and maps a macro walks (`json.decode()` reads no deeper, `json.encode()`,
 * `format()`'s `%s` and `distinct()` refuse deeper values): the CEL library walks values
 * recursively, and a value nested thousands deep would exhaust the stack there.
 */
export const MAX_VALUE_DEPTH = 100;

/** A CEL evaluation error (the rule does not apply, the interpolation fails). */
export const evalError = (code: string, message: string) => new EvaluationError({ code, message });

/** A map's entries (a `Map` or a plain object, as the CEL library holds them), undefined for other values. */
export function mapEntries(v: unknown): [unknown, unknown][] | undefined {
  if (v instanceof Map) return [...v.entries()];
  if (v !== null && typeof v === 'object' && Object.getPrototypeOf(v) === Object.prototype) return Object.entries(v);
  return undefined;
}

/** A list's elements (an array, or a `Set` as the library may hold a list), undefined for other values. */
export function listItems(v: unknown): readonly unknown[] | undefined {
  if (Array.isArray(v)) return v;
  if (v instanceof Set) return [...v];
  return undefined;
}

/** The class name of an object value (the library's `UnsignedInt`, `Duration`, `Type`, …). */
export const className = (v: object): string => (v as { constructor?: { name?: string } }).constructor?.name ?? 'object';

/** The CEL type name of a value, for messages. */
export function celTypeName(v: unknown): string {
  if (v === null) return 'null';
  if (typeof v === 'bigint') return 'int';
  if (typeof v === 'number') return 'double';
  if (typeof v === 'string') return 'string';
  if (typeof v === 'boolean') return 'bool';
  if (v instanceof Uint8Array) return 'bytes';
  if (v instanceof Date) return 'google.protobuf.Timestamp';
  if (listItems(v) !== undefined) return 'list';
  if (mapEntries(v) !== undefined) return 'map';
  const name = className(v as object);
  if (name === 'UnsignedInt') return 'uint';
  if (name === 'Duration') return 'google.protobuf.Duration';
  if (name === 'Type') return 'type';
  return name.startsWith('Cel') ? name.slice(3) : name;
}

/** A timestamp as Go's `time.Time` writes it (RFC 3339 in UTC, the fraction without trailing zeros; `time.ts`'s `rfc3339` drops the fraction, as the API writes times). */
export function goTimeText(d: Date): string {
  const iso = d.toISOString();
  return iso.replace(/\.?0*Z$/, 'Z');
}

/** A lone surrogate (no UTF-8 in Go: a header byte in no UTF-8 sequence, written as U+FFFD). */
export const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;
const LONE_SURROGATE_1 = new RegExp(LONE_SURROGATE.source);
const HIGH_UNIT = /[\ud800-\uffff]/;

/**
 * For strings, keys whose UTF-16 order (JavaScript's `<`, `Array.prototype.sort`'s, the fastest)
 * is Go's order (`strings.Compare`: by their UTF-8 bytes, which is code point order). That is
 * UTF-16's order but for code units past U+D7FF: those are remapped (U+E000… before surrogates)
 * to sort in code point order; strings with a lone surrogate (a header byte in no UTF-8
 * sequence) are compared byte by byte, as `Buffer`s. Every key is a string when the result's
 * `bytes` is false; all are `Buffer`s when it is true.
 */
export function utf8OrderKeys(strings: readonly string[]): { keys: (string | Buffer)[]; bytes: boolean } {
  if (utf16IsUtf8Order(strings)) return { keys: [...strings], bytes: false };
  if (strings.some((k) => HIGH_UNIT.test(k) && LONE_SURROGATE_1.test(k))) return { keys: strings.map((k) => textBytes(k)), bytes: true };
  return { keys: strings.map(toUtf8OrderKey), bytes: false };
}

/**
 * A string without lone surrogates as a key whose UTF-16 order is the string's UTF-8 order:
 * U+E000–U+FFFF moved down to U+D800–U+F7FF, surrogates (of characters past U+FFFF) up to
 * U+F800–U+FFFF. A bijection: `fromUtf8OrderKey` undoes it.
 */
export const toUtf8OrderKey = (k: string): string => remapHigh(k, (c) => (c >= 0xe000 ? c - 0x800 : c + 0x2000));
export const fromUtf8OrderKey = (k: string): string => remapHigh(k, (c) => (c >= 0xf800 ? c - 0x2000 : c + 0x800));

/** `k` with each code unit past U+D7FF mapped by `f` (a loop: several times faster than a replace with a callback). */
function remapHigh(k: string, f: (c: number) => number): string {
  let out = '';
  let from = 0;
  for (let i = 0; i < k.length; i++) {
    const c = k.charCodeAt(i);
    if (c < 0xd800) continue;
    out += k.slice(from, i) + String.fromCharCode(f(c));
    from = i + 1;
  }
  return from === 0 ? k : out + k.slice(from);
}

/** Whether a string holds a lone surrogate (a header byte in no UTF-8 sequence). */
export const hasLoneSurrogate = (k: string): boolean => LONE_SURROGATE_1.test(k);

/** Whether JavaScript's order of these strings (UTF-16) is Go's (UTF-8): none has a code unit past U+D7FF. */
export const utf16IsUtf8Order = (strings: readonly string[]): boolean => !strings.some((k) => HIGH_UNIT.test(k));

/** Compares two keys of one `utf8OrderKeys` result. */
export function compareOrderKeys(a: string | Buffer, b: string | Buffer): number {
  if (typeof a === 'string') return a < (b as string) ? -1 : a > (b as string) ? 1 : 0;
  return Buffer.compare(a, b as Buffer);
}

/**
 * Distinct strings sorted in place as Go sorts them (`strings.Compare`: by their UTF-8 bytes; see
 * `utf8OrderKeys`).
 */
export function sortUtf8(keys: string[]): string[] {
  if (!keys.some((k) => HIGH_UNIT.test(k))) return keys.sort();
  const { keys: order } = utf8OrderKeys(keys);
  const idx = keys.map((_, i) => i).sort((i, j) => compareOrderKeys(order[i]!, order[j]!));
  const sorted = idx.map((i) => keys[i]!);
  for (let i = 0; i < sorted.length; i++) keys[i] = sorted[i]!;
  return keys;
}

/** Number of code points in `s` (lone surrogates count one each). */
export function codePoints(s: string): number {
  let pairs = 0;
  for (let i = s.search(/[\ud800-\udbff]/); i >= 0 && i < s.length - 1; i++) {
    const c = s.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff) {
      const d = s.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) {
        pairs++;
        i++;
      }
    }
  }
  return s.length - pairs;
}
