/**
 * ngrok's string, encoding, hash and JSON macros (https://ngrok.com/docs/traffic-policy/macros/,
 * the sections String, Base64, URL, Hash and JSON), as ngrok's Go engine computes them (cel-go's string
 * extensions for `charAt`, `replace`, `reverse` and `strings.quote`; Go's standard library for
 * the rest):
 *
 * - `s.lower()`, `s.upper()`: Go's `strings.ToLower` / `ToUpper`, Unicode simple case mapping per
 *   code point (`'İSTANBUL'.lower()` is `'istanbul'`, `'ß'.upper()` stays `'ß'`, a final `Σ`
 *   lower-cases to `σ`): never longer than the string.
 * - `s.replace(old, new)`, `s.replace(old, new, n)`: Go's `strings.Replace` (at most `n`
 *   replacements, all when `n < 0`; an empty `old` matches before each code point and at the
 *   end). A result over `MAX_BUILT_STRING` characters is not built: an evaluation error.
 * - `s.charAt(i)`: the code point at `i`, `''` at `i == size(s)`, an evaluation error past it or
 *   for `i < 0`. `s.reverse()`: the code points in reverse order.
 * - `base64.decode(string) -> bytes` (standard alphabet, padded: `'aGVsbG8'` is an error, as
 *   ngrok documents; line breaks are skipped, as Go's decoder does), `base64.encode(bytes) ->
 *   string`, and `s.decodeBase64()` / `s.encodeBase64()` on strings (UTF-8; decoded bytes that
 *   are not UTF-8 read as U+FFFD).
 * - `url.escape(string)` / `s.escapeUrl()`: Go's `url.QueryEscape` (`' '` → `+`, all but
 *   `A-Za-z0-9-_.~` percent-encoded as UTF-8); `url.unescape(string)` / `s.unescapeUrl()`: Go's
 *   `url.QueryUnescape` (`+` → `' '`; a `%` not followed by two hex digits is an error).
 * - `hash.md5|sha1|sha256|sha512|crc32(string[, format])` and `s.md5()`, … `s.crc32(format)`:
 *   the digest of the string's UTF-8 as lower-case hex (`format` `'hex'`, the default) or
 *   standard padded base64 (`'base64'`); any other format is an evaluation error. CRC-32 is
 *   IEEE's, its 4 bytes big-endian (`'hello'` → `'3610a686'`).
 * - `s.isJson()`: Go's `json.Valid` (any JSON value; nested at most 10,000 deep).
 * - `json.decode(s)` / `s.decodeJson()`: the value (maps, lists, doubles, strings, bools, null);
 *   invalid JSON, or JSON nested more than `MAX_JSON_DECODE_DEPTH` (100) deep, is an error.
 * - `strings.quote(s)`: cel-go's (`"` + `s` with CEL's escapes for `\a \b \f \n \r \t \v \\ "` +
 *   `"`; a lone surrogate as U+FFFD).
 *
 * Every failure is a CEL `EvaluationError` (the rule does not apply / the interpolation fails),
 * never another exception. Their worst-case costs are in `cost.ts`.
 */
import { createHash } from 'node:crypto';
import { crc32 } from 'node:zlib';
import { bytesText, escapesAsReplacement, textBytes } from '../http-headers.js';
import { EvaluationError, type Environment } from '@marcbachmann/cel-js';

/**
 * Longest string `replace()` builds (UTF-16 units): a longer result is an evaluation error,
 * found before anything is built. Bounds what a replacement that lengthens the string (an empty
 * `old`, a long `new`) can cost and hand on to later operations.
 */
export const MAX_BUILT_STRING = 65_536;

/** The hashes ngrok has that Warren computes (`hash.<name>()`, `s.<name>()`). */
export const NGROK_HASHES = ['md5', 'sha1', 'sha256', 'sha512', 'crc32'] as const;
export type NgrokHash = (typeof NGROK_HASHES)[number];

/** Bytes of each hash's digest (the cost estimate's shapes: twice as many hex digits). */
export const HASH_DIGEST_BYTES: Readonly<Record<NgrokHash, number>> = { md5: 16, sha1: 20, sha256: 32, sha512: 64, crc32: 4 };

const evalError = (code: string, message: string) => new EvaluationError({ code, message });

/** Go's simple upper-case mapping of the code points whose full mapping (JavaScript's) is longer. */
const UPPER_SPECIAL = new Map<number, { full: number; simple: number }>();
{
  const cps = [0xdf, 0x149, 0x1f0, 0x390, 0x3b0, 0x587, 0x1e96, 0x1e97, 0x1e98, 0x1e99, 0x1e9a, 0x1f50, 0x1f52, 0x1f54, 0x1f56];
  for (let c = 0x1f80; c <= 0x1faf; c++) cps.push(c);
  cps.push(0x1fb2, 0x1fb3, 0x1fb4, 0x1fb6, 0x1fb7, 0x1fbc, 0x1fc2, 0x1fc3, 0x1fc4, 0x1fc6, 0x1fc7, 0x1fcc, 0x1fd2, 0x1fd3, 0x1fd6, 0x1fd7);
  cps.push(0x1fe2, 0x1fe3, 0x1fe4, 0x1fe6, 0x1fe7, 0x1ff2, 0x1ff3, 0x1ff4, 0x1ff6, 0x1ff7, 0x1ffc);
  cps.push(0xfb00, 0xfb01, 0xfb02, 0xfb03, 0xfb04, 0xfb05, 0xfb06, 0xfb13, 0xfb14, 0xfb15, 0xfb16, 0xfb17);
  for (const c of cps) {
    // UnicodeData's simple mappings: the small letters with ypogegrammeni map to the title-case
    // letters (ᾀ → ᾈ); those have none, nor have the others (ß stays ß).
    const low = (c >= 0x1f80 && c <= 0x1f87) || (c >= 0x1f90 && c <= 0x1f97) || (c >= 0x1fa0 && c <= 0x1fa7);
    const simple = low ? c + 8 : c === 0x1fb3 || c === 0x1fc3 || c === 0x1ff3 ? c + 9 : c;
    UPPER_SPECIAL.set(c, { full: String.fromCharCode(c).toUpperCase().length, simple });
  }
}

/** A string of UTF-16 units as they are (Buffer's UTF-16 decoding keeps lone surrogates). */
const fromUnits = (units: Uint16Array): string => Buffer.from(units.buffer, units.byteOffset, units.byteLength).toString('utf16le');

/** The code points whose upper case is longer in JavaScript than in Go (a test checks them against V8). */
export const UPPER_SPECIAL_CODE_POINTS: readonly number[] = [...UPPER_SPECIAL.keys()];

/** `s.lower()`: Go's `strings.ToLower`. */
export function lower(text: string): string {
  // A byte of a header in no UTF-8 sequence (`headerText`'s escape) comes out as U+FFFD, as from Go's strings.Map.
  const s = escapesAsReplacement(text);
  // JavaScript's full mapping differs only for İ (→ i + U+0307) and a word-final Σ (→ ς): those
  // are mapped first, as Go does.
  if (!s.includes('\u0130') && !s.includes('\u03a3')) return s.toLowerCase();
  const units = new Uint16Array(s.length);
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    units[i] = c === 0x130 ? 0x69 : c === 0x3a3 ? 0x3c3 : c;
  }
  return fromUnits(units).toLowerCase();
}

/** `s.upper()`: Go's `strings.ToUpper`. */
export function upper(text: string): string {
  const s = escapesAsReplacement(text);
  const t = s.toUpperCase();
  // Only the code points of UPPER_SPECIAL map to more than one (all in the BMP, each one code
  // unit); every other keeps its length. So an unchanged length means none is there.
  if (t.length === s.length) return t;
  // Unit by unit: the simple mapping keeps the length.
  const units = new Uint16Array(s.length);
  let j = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    const special = c >= 0xdf ? UPPER_SPECIAL.get(c) : undefined;
    if (special === undefined) units[i] = t.charCodeAt(j++);
    else {
      units[i] = special.simple;
      j += special.full;
    }
  }
  return fromUnits(units);
}

/** Index just past the code point at `i` (a surrogate pair is one). */
function nextCodePoint(s: string, i: number): number {
  const c = s.charCodeAt(i);
  if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length) {
    const d = s.charCodeAt(i + 1);
    if (d >= 0xdc00 && d <= 0xdfff) return i + 2;
  }
  return i + 1;
}

/** `s.charAt(i)`: the code point at `i`; `''` at the end; an error past it. */
export function charAt(s: string, index: bigint): string {
  if (index < 0n || index > BigInt(s.length)) throw evalError('index_out_of_range', `charAt(): index out of range: ${index}`);
  const n = Number(index);
  let i = 0;
  for (let k = 0; k < n; k++) {
    if (i >= s.length) throw evalError('index_out_of_range', `charAt(): index out of range: ${index}`);
    i = nextCodePoint(s, i);
  }
  return i >= s.length ? '' : s.slice(i, nextCodePoint(s, i));
}

/** `s.reverse()`: the code points in reverse order. */
export function reverse(s: string): string {
  if (s.length < 2) return s;
  const units = new Uint16Array(s.length);
  const last = s.length - 1;
  for (let i = 0; i <= last; i++) units[last - i] = s.charCodeAt(i);
  // A surrogate pair reversed is in the wrong order: swap it back.
  if (/[\ud800-\udfff]/.test(s)) {
    for (let i = 0; i < last; i++) {
      const a = units[i]!;
      const b = units[i + 1]!;
      if (a >= 0xdc00 && a <= 0xdfff && b >= 0xd800 && b <= 0xdbff) {
        units[i] = b;
        units[i + 1] = a;
        i++;
      }
    }
  }
  return fromUnits(units);
}

/** Number of code points in `s` (lone surrogates count one each). */
function codePoints(s: string): number {
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

/** `by` as a `String.prototype.replace` replacement that inserts it as it is (`$` escaped). */
const literalReplacement = (by: string) => (by.includes('$') ? by.replaceAll('$', '$$$$') : by);
/** The empty match before each code point and at the end. */
const EVERY_CODE_POINT = /(?:)/gu;

/** `s.replace(old, new[, n])`: Go's `strings.Replace`. */
export function replace(s: string, old: string, by: string, count: bigint = -1n): string {
  if (count === 0n || old === by) return s;
  const limit = count < 0n || count > BigInt(s.length + 1) ? Infinity : Number(count);
  const tooLong = (k: number) => {
    const chars = s.length + k * (by.length - old.length);
    if (chars > MAX_BUILT_STRING) throw evalError('invalid_argument', `replace(): result too long (${chars} characters, at most ${MAX_BUILT_STRING})`);
  };
  if (old === '') {
    const rep = literalReplacement(by);
    // Before each code point, and at the end (Go's rune-wise empty matches): at most `limit`.
    const all = codePoints(s) + 1;
    const k = Math.min(limit, all);
    tooLong(k);
    if (k === all) return s.replace(EVERY_CODE_POINT, rep);
    // The first k code points each get one before them.
    let end = 0;
    for (let r = 0; r < k; r++) end = nextCodePoint(s, end);
    return s.slice(0, end).replace(EVERY_CODE_POINT, rep).slice(0, -by.length) + s.slice(end);
  }
  // Non-overlapping occurrences from the left, as Go counts them; only up to `limit`.
  let k = 0;
  let end = 0;
  for (let i = s.indexOf(old); i >= 0 && k < limit; i = s.indexOf(old, i + old.length)) {
    k++;
    end = i + old.length;
  }
  if (k === 0) return s;
  tooLong(k);
  // Concatenated (V8 builds a rope): steadier than replaceAll / split+join over many matches.
  let out = '';
  let from = 0;
  for (let i = s.indexOf(old); from < end; i = s.indexOf(old, i + old.length)) {
    out += s.slice(from, i) + by;
    from = i + old.length;
  }
  return out + s.slice(from);
}

/** Go's `base64.StdEncoding`: the alphabet, then at most two `=` (length checked separately). */
const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

/** `base64.decode(s)`: standard, padded base64 (Go's decoder skips CR and LF). */
export function base64Decode(s: string, fn = 'base64.decode()'): Buffer {
  const text = s.includes('\n') || s.includes('\r') ? s.replace(/[\r\n]/g, '') : s;
  if (text.length % 4 !== 0 || !BASE64.test(text)) throw evalError('invalid_argument', `${fn}: illegal base64 data`);
  return Buffer.from(text, 'base64');
}

/** `base64.encode(b)`. */
export const base64Encode = (b: Uint8Array): string => Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString('base64');

/** The bytes Go's `url.QueryEscape` keeps: letters, digits and `-_.~`. */
const UNRESERVED = new Uint8Array(256);
for (const c of 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~') UNRESERVED[c.charCodeAt(0)] = 1;
/** `%XX` of each byte: its two hex digits (upper case) at 2b, 2b + 1. */
const HEX_DIGITS = new Uint8Array(512);
for (let b = 0; b < 256; b++) {
  const h = b.toString(16).toUpperCase().padStart(2, '0');
  HEX_DIGITS[2 * b] = h.charCodeAt(0);
  HEX_DIGITS[2 * b + 1] = h.charCodeAt(1);
}
/** What `encodeURIComponent` keeps but `url.QueryEscape` does not (and the space it escapes otherwise). */
const URI_COMPONENT_DIFFERS = /[!'()* ]/;

/** `url.escape(s)`: Go's `url.QueryEscape` (a lone surrogate is encoded as U+FFFD). */
export function urlEscape(s: string): string {
  if (!URI_COMPONENT_DIFFERS.test(s)) {
    try {
      return encodeURIComponent(s);
    } catch {
      // A lone surrogate (URIError): encoded below, as U+FFFD.
    }
  }
  // Byte by byte (an escaped byte as itself, any other lone surrogate as U+FFFD's bytes).
  const src = textBytes(s);
  const out = new Uint8Array(3 * src.length);
  let j = 0;
  for (let i = 0; i < src.length; i++) {
    const c = src[i]!;
    if (UNRESERVED[c] === 1) out[j++] = c;
    else if (c === 0x20) out[j++] = 0x2b;
    else {
      out[j++] = 0x25;
      out[j++] = HEX_DIGITS[2 * c]!;
      out[j++] = HEX_DIGITS[2 * c + 1]!;
    }
  }
  return Buffer.from(out.buffer, 0, j).toString('latin1');
}

const BAD_ESCAPE = /%(?![0-9A-Fa-f]{2})/;

/** `url.unescape(s)`: Go's `url.QueryUnescape`; bytes that are not UTF-8 read as U+FFFD. */
export function urlUnescape(s: string, fn = 'url.unescape()'): string {
  if (!s.includes('%') && !s.includes('+')) return s;
  const bad = BAD_ESCAPE.exec(s);
  if (bad) throw evalError('invalid_argument', `${fn}: invalid URL escape ${JSON.stringify(s.slice(bad.index, bad.index + 3))}`);
  const src = textBytes(s);
  const out = Buffer.allocUnsafe(src.length);
  let n = 0;
  for (let i = 0; i < src.length; i++) {
    const c = src[i]!;
    if (c === 0x25) {
      out[n++] = (hexValue(src[i + 1]!) << 4) | hexValue(src[i + 2]!);
      i += 2;
    } else out[n++] = c === 0x2b ? 0x20 : c;
  }
  return bytesText(out.subarray(0, n));
}

function hexValue(c: number): number {
  if (c <= 0x39) return c - 0x30;
  return (c | 0x20) - 0x61 + 10;
}

/** `hash.<name>(s[, format])` and `s.<name>([format])`: the digest as hex or base64. */
export function hashOf(name: NgrokHash, s: string, format = 'hex'): string {
  if (format !== 'hex' && format !== 'base64') throw evalError('invalid_argument', `${name}(): unknown format ${JSON.stringify(format.slice(0, 32))} (hex or base64)`);
  if (name === 'crc32') {
    const b = Buffer.allocUnsafe(4);
    b.writeUInt32BE(crc32(textBytes(s)) >>> 0);
    return b.toString(format);
  }
  return createHash(name).update(textBytes(s)).digest(format);
}

/** Escapes of `strings.quote()` (cel-go's: CEL's escape sequences), by code unit. */
const QUOTE_ESCAPES = new Map<number, string>([
  [0x07, '\\a'],
  [0x08, '\\b'],
  [0x0c, '\\f'],
  [0x0a, '\\n'],
  [0x0d, '\\r'],
  [0x09, '\\t'],
  [0x0b, '\\v'],
  [0x5c, '\\\\'],
  [0x22, '\\"'],
]);
const NEEDS_QUOTING = /[\x07-\x0d\\"\ud800-\udfff]/;

/**
 * `strings.quote(s)`: cel-go's, `s` in double quotes with `\a \b \f \n \r \t \v \\ \"`
 * escaped, other characters as they are, a lone surrogate (invalid UTF-8 in Go) as U+FFFD.
 */
export function quote(s: string): string {
  if (!NEEDS_QUOTING.test(s)) return `"${s}"`;
  const units = new Uint16Array(2 * s.length + 2);
  let j = 0;
  units[j++] = 0x22;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    const esc = c <= 0x5c ? QUOTE_ESCAPES.get(c) : undefined;
    if (esc !== undefined) {
      units[j++] = 0x5c;
      units[j++] = esc.charCodeAt(1);
    } else if (c >= 0xd800 && c <= 0xdfff) {
      const next = i + 1 < s.length ? s.charCodeAt(i + 1) : 0;
      if (c <= 0xdbff && next >= 0xdc00 && next <= 0xdfff) {
        units[j++] = c;
        units[j++] = next;
        i++;
      } else units[j++] = 0xfffd;
    } else units[j++] = c;
  }
  units[j++] = 0x22;
  return fromUnits(units.subarray(0, j));
}

/** Deepest nesting Go's `json.Valid` accepts (`encoding/json`'s scanner). */
const JSON_MAX_DEPTH = 10_000;

/** `s.isJson()`: Go's `json.Valid`: any JSON value, nested at most 10,000 deep. */
export function isJson(s: string): boolean {
  try {
    JSON.parse(s);
  } catch {
    return false;
  }
  // Only a string of more than 2 × JSON_MAX_DEPTH characters can nest deeper.
  return s.length <= 2 * JSON_MAX_DEPTH || jsonDepth(s) <= JSON_MAX_DEPTH;
}

/**
 * Deepest nesting `json.decode()` / `decodeJson()` return (Go's decoder takes 10,000): the CEL
 * library walks values recursively (equality, type checks), and a value nested a few thousand
 * deep would exhaust the stack there. Deeper JSON is an evaluation error.
 */
export const MAX_JSON_DECODE_DEPTH = 100;

/**
 * `json.decode(s)` / `s.decodeJson()`: the JSON value (objects as maps, numbers as doubles, as
 * Go decodes into `any`); invalid JSON, or JSON nested deeper than `MAX_JSON_DECODE_DEPTH`, is
 * an evaluation error.
 */
export function jsonDecode(s: string, fn = 'json.decode()'): unknown {
  let v: unknown;
  try {
    v = JSON.parse(s);
  } catch {
    // Not V8's message: it quotes the text, which may be a header's value.
    throw evalError('invalid_argument', `${fn}: invalid JSON`);
  }
  if (s.length > 2 * MAX_JSON_DECODE_DEPTH && jsonDepth(s) > MAX_JSON_DECODE_DEPTH) throw evalError('invalid_argument', `${fn}: JSON nested more than ${MAX_JSON_DECODE_DEPTH} deep`);
  return v;
}

/** The deepest nesting of arrays and objects in valid JSON text (brackets in strings skipped). */
function jsonDepth(s: string): number {
  let depth = 0;
  let max = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c === 0x22) {
      // A string: to its closing quote, past escapes.
      for (i++; i < s.length; i++) {
        const d = s.charCodeAt(i);
        if (d === 0x5c) i++;
        else if (d === 0x22) break;
      }
    } else if (c === 0x5b || c === 0x7b) {
      if (++depth > max) max = depth;
    } else if (c === 0x5d || c === 0x7d) depth--;
  }
  return max;
}

class Base64Namespace {}
class UrlNamespace {}
class HashNamespace {}
class StringsNamespace {}
class JsonNamespace {}

/**
 * Registers the macros on `env`: the string methods on `string` and on each of `stringLike`
 * (types that stand for their string, `cel.ts`'s `STRING_LIKE`), and the `base64`, `url` and
 * `hash` namespaces as constants whose methods take the string.
 */
export function registerNgrokMacros(env: Environment, stringLike: readonly string[]): void {
  env
    .registerType('Base64Namespace', Base64Namespace)
    .registerConstant('base64', 'Base64Namespace', new Base64Namespace())
    .registerType('UrlNamespace', UrlNamespace)
    .registerConstant('url', 'UrlNamespace', new UrlNamespace())
    .registerType('HashNamespace', HashNamespace)
    .registerConstant('hash', 'HashNamespace', new HashNamespace())
    .registerType('JsonNamespace', JsonNamespace)
    .registerConstant('json', 'JsonNamespace', new JsonNamespace())
    .registerType('StringsNamespace', StringsNamespace)
    .registerConstant('strings', 'StringsNamespace', new StringsNamespace())
    .registerFunction('StringsNamespace.quote(string): string', (_: unknown, s: string) => quote(s))
    .registerFunction('Base64Namespace.decode(string): bytes', (_: unknown, s: string) => base64Decode(s))
    .registerFunction('Base64Namespace.encode(bytes): string', (_: unknown, b: Uint8Array) => base64Encode(b));
  for (const t of ['string', ...stringLike]) {
    const text = t === 'string' ? (v: unknown) => v as string : (v: unknown) => String(v);
    env
      .registerFunction(`${t}.lower(): string`, (v: unknown) => lower(text(v)))
      .registerFunction(`${t}.upper(): string`, (v: unknown) => upper(text(v)))
      .registerFunction(`${t}.replace(string, string): string`, (v: unknown, a: string, b: string) => replace(text(v), a, b))
      .registerFunction(`${t}.replace(string, string, int): string`, (v: unknown, a: string, b: string, n: bigint) => replace(text(v), a, b, n))
      .registerFunction(`${t}.charAt(int): string`, (v: unknown, i: bigint) => charAt(text(v), i))
      .registerFunction(`${t}.reverse(): string`, (v: unknown) => reverse(text(v)))
      .registerFunction(`${t}.encodeBase64(): string`, (v: unknown) => textBytes(text(v)).toString('base64'))
      .registerFunction(`${t}.decodeBase64(): string`, (v: unknown) => bytesText(base64Decode(text(v), 'decodeBase64()')))
      .registerFunction(`${t}.escapeUrl(): string`, (v: unknown) => urlEscape(text(v)))
      .registerFunction(`${t}.unescapeUrl(): string`, (v: unknown) => urlUnescape(text(v), 'unescapeUrl()'))
      .registerFunction(`${t}.isJson(): bool`, (v: unknown) => isJson(text(v)))
      .registerFunction(`${t}.decodeJson(): dyn`, (v: unknown) => jsonDecode(text(v), 'decodeJson()'))
      .registerFunction(`JsonNamespace.decode(${t}): dyn`, (_: unknown, v: unknown) => jsonDecode(text(v)));
    for (const h of NGROK_HASHES) {
      env.registerFunction(`${t}.${h}(): string`, (v: unknown) => hashOf(h, text(v)));
      env.registerFunction(`${t}.${h}(string): string`, (v: unknown, f: string) => hashOf(h, text(v), f));
      env.registerFunction(`HashNamespace.${h}(${t}): string`, (_: unknown, v: unknown) => hashOf(h, text(v)));
      env.registerFunction(`HashNamespace.${h}(${t}, string): string`, (_: unknown, v: unknown, f: string) => hashOf(h, text(v), f));
    }
    env
      .registerFunction(`UrlNamespace.escape(${t}): string`, (_: unknown, v: unknown) => urlEscape(text(v)))
      .registerFunction(`UrlNamespace.unescape(${t}): string`, (_: unknown, v: unknown) => urlUnescape(text(v)));
  }
}
