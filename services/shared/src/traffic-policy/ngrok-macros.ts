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
 * - `s.charAt(i)`: the code point at `i` (a header byte in no UTF-8 sequence as U+FFFD, as Go's
 *   `[]rune` reads it), `''` at `i == size(s)`, an evaluation error past it or for `i < 0`.
 *   `s.reverse()`: the code points in reverse order.
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
 * - `hash.crc64|xxhash64(s[, format])`, `s.crc64()`, `s.xxhash64()`: Go's `crc64.ISO` and xxHash64
 *   (seed 0), 8 bytes big-endian, as the other hashes.
 * - `json.encode(v)`, `list.encodeJson()`, `map.encodeJson()`: Go's `json.Marshal` (keys sorted
 *   by UTF-8 bytes, HTML-safe escapes; see `jsonEncode`).
 * - `queryString.decode(s)` / `s.decodeQueryString()`: Go's `url.ParseQuery`, each key's first
 *   value; `queryString.encode(m)` / `m.encodeQueryString()`: Go's `url.Values.Encode`.
 * - `url.parse(s)` / `s.parseUrl()`: Go's `url.Parse` as a map of strings (`parseUrl`);
 *   `s.isURL()`: it parses with a scheme and a host.
 * - `basic_auth.encode(user, password)`: `Basic ` + base64 of `user:password`.
 * - `lists.range(n)`: `[0, …, n-1]`, n at most `MAX_LIST_RANGE`. `rand.double()`: [0, 1).
 * - `rand.int()`, `rand.int(min, max)`: an int from `min` to `max` included (see `randInt` for
 *   how ngrok's self-contradicting page is read).
 * - `s.isQueryString()` (see `isQueryString`), `s.isPrivateIp()` (RFC 1918 and `fc00::/7`, as
 *   Go's `net.IP.IsPrivate`).
 * - `s.format(list)`: cel-go's `format` (`string-format.ts`); the list methods `slice`,
 *   `flatten`, `sort`, `sortBy`, `distinct` of cel-go's lists extension (`list-macros.ts`).
 *
 * Every failure is a CEL `EvaluationError` (the rule does not apply / the interpolation fails),
 * never another exception. Their worst-case costs are in `cost.ts`.
 */
import { createHash, randomFillSync, randomInt } from 'node:crypto';
import { crc32 } from 'node:zlib';
import { bytesText, escapesAsReplacement, textBytes } from '../http-headers.js';
import { EvaluationError, type Environment } from '@marcbachmann/cel-js';
import { parseIPv4, parseIPv6 } from '../cidr.js';
import { celTypeName, codePoints, evalError, MAX_BUILT_STRING, MAX_VALUE_DEPTH, mapEntries, goTimeText, sortUtf8 } from './cel-values.js';
import { registerListMacros } from './list-macros.js';
import { registerStringFormat } from './string-format.js';

/**
 * Longest string `replace()` (and `json.encode()`, `queryString.encode()`, `format()`) builds
 * (UTF-16 units): a longer result is an evaluation error, found before anything is built. Bounds
 * what a replacement that lengthens the string (an empty `old`, a long `new`) can cost and hand
 * on to later operations. (Defined in `cel-values.ts`.)
 */
export { MAX_BUILT_STRING, sortUtf8 };

/** The hashes ngrok has that Warren computes (`hash.<name>()`, `s.<name>()`). */
export const NGROK_HASHES = ['md5', 'sha1', 'sha256', 'sha512', 'crc32', 'crc64', 'xxhash64'] as const;
export type NgrokHash = (typeof NGROK_HASHES)[number];

/** Bytes of each hash's digest (the cost estimate's shapes: twice as many hex digits). */
export const HASH_DIGEST_BYTES: Readonly<Record<NgrokHash, number>> = { md5: 16, sha1: 20, sha256: 32, sha512: 64, crc32: 4, crc64: 8, xxhash64: 8 };


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
  if (i >= s.length) return '';
  const c = s.charCodeAt(i);
  // A lone surrogate (a header byte in no UTF-8 sequence) is U+FFFD to Go's `[]rune`.
  return c >= 0xd800 && c <= 0xdfff && nextCodePoint(s, i) === i + 1 ? '\ufffd' : s.slice(i, nextCodePoint(s, i));
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
  if (name === 'crc64') return crc64Iso(textBytes(s)).toString(format);
  if (name === 'xxhash64') return xxhash64(textBytes(s)).toString(format);
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
export const MAX_JSON_DECODE_DEPTH = MAX_VALUE_DEPTH;

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

/** Go's `hash/crc64` table for the ISO polynomial (reversed `0xD800000000000000`), as 32-bit halves. */
const CRC64_HI = new Uint32Array(256);
const CRC64_LO = new Uint32Array(256);
for (let i = 0; i < 256; i++) {
  let hi = 0;
  let lo = i;
  for (let k = 0; k < 8; k++) {
    const odd = lo & 1;
    lo = ((lo >>> 1) | (hi << 31)) >>> 0;
    hi >>>= 1;
    if (odd) hi = (hi ^ 0xd8000000) >>> 0;
  }
  CRC64_HI[i] = hi;
  CRC64_LO[i] = lo;
}

/** Go's `crc64.Checksum(b, crc64.MakeTable(crc64.ISO))`, as its 8 bytes big-endian. */
export function crc64Iso(b: Uint8Array): Buffer {
  let hi = 0xffffffff;
  let lo = 0xffffffff;
  for (let i = 0; i < b.length; i++) {
    const t = (lo ^ b[i]!) & 0xff;
    lo = (((lo >>> 8) | (hi << 24)) ^ CRC64_LO[t]!) >>> 0;
    hi = ((hi >>> 8) ^ CRC64_HI[t]!) >>> 0;
  }
  const out = Buffer.allocUnsafe(8);
  out.writeUInt32BE(~hi >>> 0, 0);
  out.writeUInt32BE(~lo >>> 0, 4);
  return out;
}

/** High 32 bits of the 64-bit product of two unsigned 32-bit numbers (16-bit halves: exact in doubles). */
function mulHi32(a: number, b: number): number {
  const a0 = a & 0xffff;
  const a1 = a >>> 16;
  const b0 = b & 0xffff;
  const b1 = b >>> 16;
  const lo = a0 * b0;
  const m1 = a1 * b0;
  const m2 = a0 * b1;
  const mid = (lo >>> 16) + (m1 & 0xffff) + (m2 & 0xffff);
  return (a1 * b1 + Math.floor(m1 / 0x10000) + Math.floor(m2 / 0x10000) + Math.floor(mid / 0x10000)) >>> 0;
}

/** A 64-bit unsigned number as two 32-bit halves (xxHash64's arithmetic, modulo 2^64). */
interface U64 {
  hi: number;
  lo: number;
}
const u64 = (hi: number, lo: number): U64 => ({ hi: hi >>> 0, lo: lo >>> 0 });
function add64(a: U64, b: U64): U64 {
  const lo = a.lo + b.lo;
  return u64(a.hi + b.hi + (lo > 0xffffffff ? 1 : 0), lo);
}
const sub64 = (a: U64, b: U64): U64 => add64(a, add64(u64(~b.hi, ~b.lo), u64(0, 1)));
const mul64 = (a: U64, b: U64): U64 => u64(mulHi32(a.lo, b.lo) + Math.imul(a.hi, b.lo) + Math.imul(a.lo, b.hi), Math.imul(a.lo, b.lo));
const xor64 = (a: U64, b: U64): U64 => u64(a.hi ^ b.hi, a.lo ^ b.lo);
function rotl64(a: U64, r: number): U64 {
  if (r >= 32) return rotl64(u64(a.lo, a.hi), r - 32);
  if (r === 0) return a;
  return u64((a.hi << r) | (a.lo >>> (32 - r)), (a.lo << r) | (a.hi >>> (32 - r)));
}
const shr64 = (a: U64, r: number): U64 => (r >= 32 ? u64(0, a.hi >>> (r - 32)) : u64(a.hi >>> r, (a.lo >>> r) | (a.hi << (32 - r))));

const XXH_P1 = u64(0x9e3779b1, 0x85ebca87);
const XXH_P2 = u64(0xc2b2ae3d, 0x27d4eb4f);
const XXH_P3 = u64(0x165667b1, 0x9e3779f9);
const XXH_P4 = u64(0x85ebca77, 0xc2b2ae63);
const XXH_P5 = u64(0x27d4eb2f, 0x165667c5);

const read64 = (b: Uint8Array, i: number): U64 => u64(b[i + 4]! | (b[i + 5]! << 8) | (b[i + 6]! << 16) | (b[i + 7]! << 24), b[i]! | (b[i + 1]! << 8) | (b[i + 2]! << 16) | (b[i + 3]! << 24));
const read32 = (b: Uint8Array, i: number): U64 => u64(0, b[i]! | (b[i + 1]! << 8) | (b[i + 2]! << 16) | (b[i + 3]! << 24));
const xxRound = (acc: U64, input: U64): U64 => mul64(rotl64(add64(acc, mul64(input, XXH_P2)), 31), XXH_P1);
const xxMerge = (acc: U64, val: U64): U64 => add64(mul64(xor64(acc, xxRound(u64(0, 0), val)), XXH_P1), XXH_P4);

/** xxHash64 with seed 0 (Go's `github.com/cespare/xxhash/v2`), as its 8 bytes big-endian. */
export function xxhash64(b: Uint8Array): Buffer {
  const n = b.length;
  let i = 0;
  let h: U64;
  if (n >= 32) {
    let v1 = add64(XXH_P1, XXH_P2);
    let v2 = XXH_P2;
    let v3 = u64(0, 0);
    let v4 = sub64(u64(0, 0), XXH_P1);
    for (; i + 32 <= n; i += 32) {
      v1 = xxRound(v1, read64(b, i));
      v2 = xxRound(v2, read64(b, i + 8));
      v3 = xxRound(v3, read64(b, i + 16));
      v4 = xxRound(v4, read64(b, i + 24));
    }
    h = add64(add64(rotl64(v1, 1), rotl64(v2, 7)), add64(rotl64(v3, 12), rotl64(v4, 18)));
    h = xxMerge(xxMerge(xxMerge(xxMerge(h, v1), v2), v3), v4);
  } else h = XXH_P5;
  h = add64(h, u64(Math.floor(n / 0x100000000), n));
  for (; i + 8 <= n; i += 8) h = add64(mul64(rotl64(xor64(h, xxRound(u64(0, 0), read64(b, i))), 27), XXH_P1), XXH_P4);
  if (i + 4 <= n) {
    h = add64(mul64(rotl64(xor64(h, mul64(read32(b, i), XXH_P1)), 23), XXH_P2), XXH_P3);
    i += 4;
  }
  for (; i < n; i++) h = mul64(rotl64(xor64(h, mul64(u64(0, b[i]!), XXH_P5)), 11), XXH_P1);
  h = mul64(xor64(h, shr64(h, 33)), XXH_P2);
  h = mul64(xor64(h, shr64(h, 29)), XXH_P3);
  h = xor64(h, shr64(h, 32));
  const out = Buffer.allocUnsafe(8);
  out.writeUInt32BE(h.hi, 0);
  out.writeUInt32BE(h.lo, 4);
  return out;
}

/** A character `jsonString` must do more than quote. */
const JSON_SPECIAL = /[\x00-\x1f"\\<>&\u2028\u2029\ud800-\udfff]/;
/**
 * How `jsonString` writes each character below U+0080 that it escapes: control characters as
 * `JSON.stringify` does (`\n`, `\u001f`, …), `"` and `\`, and `<`, `>`, `&` as `\u003c` … (Go's
 * HTML-safe escapes).
 */
const JSON_ESCAPES: readonly (string | undefined)[] = Array.from({ length: 0x80 }, (_, c) => {
  const ch = String.fromCharCode(c);
  if (c < 0x20 || ch === '"' || ch === '\\') return JSON.stringify(ch).slice(1, -1);
  if (ch === '<' || ch === '>' || ch === '&') return `\\u00${c.toString(16)}`;
  return undefined;
});

/**
 * A string as Go's `json.Marshal` writes it: the characters of `JSON_ESCAPES` escaped, U+2028 and
 * U+2029 as `\u2028` and `\u2029`, and a byte in no UTF-8 sequence (an escaped header byte) or
 * any other lone surrogate as U+FFFD. One pass, copying the runs between escapes (three regexp
 * replaces took 1.4 ms on a 16 KB header of `\xff<`).
 */
function jsonString(text: string): string {
  // Nearly every string: nothing to escape.
  if (!JSON_SPECIAL.test(text)) return `"${text}"`;
  let out = '"';
  let from = 0;
  const n = text.length;
  for (let i = 0; i < n; i++) {
    const c = text.charCodeAt(i);
    let esc: string | undefined;
    if (c < 0x80) {
      esc = JSON_ESCAPES[c];
      if (esc === undefined) continue;
    } else if (c === 0x2028 || c === 0x2029) esc = c === 0x2028 ? '\\u2028' : '\\u2029';
    else if (c >= 0xd800 && c <= 0xdfff) {
      if (c <= 0xdbff && i + 1 < n) {
        const d = text.charCodeAt(i + 1);
        if (d >= 0xdc00 && d <= 0xdfff) {
          i++; // a pair: an astral character, copied as it is
          continue;
        }
      }
      esc = '\ufffd';
    } else continue;
    if (i > from) out += text.slice(from, i);
    out += esc;
    from = i + 1;
  }
  if (from < n) out += text.slice(from);
  return out + '"';
}

/** Deepest nesting `json.encode()` writes (what `json.decode()` reads: `MAX_JSON_DECODE_DEPTH`). */
export const MAX_JSON_ENCODE_DEPTH = MAX_JSON_DECODE_DEPTH;

/**
 * `json.encode(v)` / `v.encodeJson()`: the value as Go's `json.Marshal` writes it. Maps' keys
 * (strings; ints and uints written as strings, as Go writes `map[int64]…` keys) in the order
 * of their UTF-8 bytes, as Go sorts them; no spaces; `<`, `>`, `&`, U+2028 and U+2029 escaped
 * as `\u003c` …; ints and uints as integers; doubles as Go writes them (shortest, `-0`, `1e+21`,
 * `1e-7`); bytes as standard base64 strings; timestamps as RFC 3339 strings; `req.url` and the
 * other values that stand for a string as that string. NaN and infinities, durations, `bool`
 * keys and other objects have no JSON here (an evaluation error), as does a value nested more
 * than `MAX_JSON_ENCODE_DEPTH` deep or whose JSON would be over `MAX_BUILT_STRING` characters
 * (found while it is written).
 */
export function jsonEncode(value: unknown, fn = 'json.encode()', stringLike: (v: unknown) => string | undefined = () => undefined): string {
  const parts: string[] = [];
  let chars = 0;
  const tooLong = () => evalError('invalid_argument', `${fn}: result too long (over ${MAX_BUILT_STRING} characters)`);
  const push = (s: string) => {
    chars += s.length;
    if (chars > MAX_BUILT_STRING) throw tooLong();
    parts.push(s);
  };
  const fail = (why: string) => evalError('invalid_argument', `${fn}: ${why}`);
  const write = (v: unknown, depth: number): void => {
    if (v === null) return push('null');
    switch (typeof v) {
      case 'string':
        // Escaped, it is at least 2 characters longer: one that cannot fit is not escaped.
        if (chars + v.length + 2 > MAX_BUILT_STRING) throw tooLong();
        return push(jsonString(v));
      case 'boolean':
        return push(v ? 'true' : 'false');
      case 'bigint':
        return push(v.toString());
      case 'number':
        if (!Number.isFinite(v)) throw fail(`unsupported value: ${v === v ? (v > 0 ? '+Inf' : '-Inf') : 'NaN'}`);
        return push(Object.is(v, -0) ? '-0' : String(v));
    }
    if (v instanceof Uint8Array) return push(`"${base64Encode(v)}"`);
    if (v instanceof Date) {
      if (Number.isNaN(v.getTime())) throw fail('invalid timestamp');
      return push(`"${goTimeText(v)}"`);
    }
    const text = stringLike(v);
    if (text !== undefined) return write(text, depth);
    if ((v as object).constructor?.name === 'UnsignedInt') return push(String((v as { value: bigint }).value));
    if (depth >= MAX_JSON_ENCODE_DEPTH) throw fail(`value nested more than ${MAX_JSON_ENCODE_DEPTH} deep`);
    if (Array.isArray(v)) {
      push('[');
      for (let i = 0; i < v.length; i++) {
        if (i > 0) push(',');
        write(v[i], depth + 1);
      }
      return push(']');
    }
    const entries = mapEntries(v);
    if (entries === undefined) throw fail(`cannot encode a value of type ${celTypeName(v)}`);
    // Each entry takes at least 5 characters (`"":0,`): one that cannot fit is refused before its keys are sorted.
    if (chars + 5 * entries.length + 1 > MAX_BUILT_STRING) throw tooLong();
    const values = new Map<string, unknown>();
    for (const [k, e] of entries) {
      const key = typeof k === 'string' ? k : typeof k === 'bigint' || celTypeName(k) === 'uint' ? String(k) : undefined;
      if (key === undefined) throw fail(`cannot encode a map key of type ${celTypeName(k)}`);
      if (values.has(key)) throw fail(`duplicate key ${jsonString(key.slice(0, 32))}`);
      values.set(key, e);
    }
    push('{');
    let first = true;
    for (const key of sortUtf8([...values.keys()])) {
      if (!first) push(',');
      first = false;
      write(key, depth + 1);
      push(':');
      write(values.get(key), depth + 1);
    }
    return push('}');
  };
  write(value, 0);
  return parts.join('');
}

/**
 * `queryString.decode(s)` / `s.decodeQueryString()`: Go's `url.ParseQuery` (pairs split at `&`,
 * each `key=value` or `key` alone, both unescaped as by `url.QueryUnescape`), as a map of each
 * key to its first value (as `url.Values.Get` reads it: ngrok's `queryString.decode(q)['q'] ==
 * 'hello'`). A pair with `;` or an invalid escape is an evaluation error (Go returns one).
 */
export function queryDecode(s: string, fn = 'queryString.decode()'): Map<string, string> {
  // Any `;` is in a pair; an invalid escape is one in its pair too.
  if (s.includes(';')) throw evalError('invalid_argument', `${fn}: invalid semicolon separator in query`);
  const bad = BAD_ESCAPE.exec(s);
  if (bad) throw evalError('invalid_argument', `${fn}: invalid URL escape ${JSON.stringify(s.slice(bad.index, bad.index + 3))}`);
  const plain = !s.includes('%') && !s.includes('+');
  const out = new Map<string, string>();
  for (const pair of s.split('&')) {
    if (pair === '') continue;
    const eq = pair.indexOf('=');
    const key = eq < 0 ? pair : pair.slice(0, eq);
    const value = eq < 0 ? '' : pair.slice(eq + 1);
    const k = plain ? key : queryUnescape(key, fn);
    if (!out.has(k)) out.set(k, plain ? value : queryUnescape(value, fn));
  }
  return out;
}

/**
 * A request's query as ngrok reads it (`req.url.query_params`, `getQueryParam()`,
 * `hasQueryParam()`): Go's `url.ParseQuery`, its error ignored (as `URL.Query()` does). Pairs are
 * split at `&` only; a pair holding a `;` is dropped (Go: "invalid semicolon separator in query"),
 * as are an empty pair and one whose key or value has a `%` not followed by two hex digits (an
 * invalid escape: nothing is kept literally); `+` is a space; a key without `=` has the value
 * `""`. Each key's values in order. One pass over the query, a split and an unescape per pair.
 */
export function parseQueryValues(s: string): Map<string, string[]> {
  const out = new Map<string, string[]>();
  if (s === '') return out;
  const plain = !s.includes('%') && !s.includes('+');
  const semicolons = s.includes(';');
  for (const pair of s.split('&')) {
    if (pair === '' || (semicolons && pair.includes(';'))) continue;
    // An escape cannot span the `=` (not a hex digit): checking the pair checks its key and value.
    if (!plain && pair.includes('%') && BAD_ESCAPE.test(pair)) continue;
    const eq = pair.indexOf('=');
    let key = eq < 0 ? pair : pair.slice(0, eq);
    let value = eq < 0 ? '' : pair.slice(eq + 1);
    if (!plain) {
      key = queryUnescape(key, 'req.url.query_params');
      value = queryUnescape(value, 'req.url.query_params');
    }
    const list = out.get(key);
    if (list) list.push(value);
    else out.set(key, [value]);
  }
  return out;
}

/** `url.QueryUnescape` of a part already checked for invalid escapes: without a `Buffer` or a regexp per part. */
function queryUnescape(s: string, fn: string): string {
  let p = s.indexOf('%');
  if (p < 0) return s.includes('+') ? s.replaceAll('+', ' ') : s;
  // A header byte in no UTF-8 sequence may make one with escaped bytes: byte by byte.
  if (SURROGATE_UNIT.test(s)) return urlUnescape(s, fn);
  let out = '';
  let from = 0;
  while (p >= 0) {
    if (p > from) out += plusAsSpace(s.slice(from, p));
    // The run of escapes from `p` (each checked: `%` and two hex digits).
    let end = p;
    while (end < s.length && s.charCodeAt(end) === 0x25 /* % */) end += 3;
    out += decodeEscapes(s, p, end);
    from = end;
    p = s.indexOf('%', from);
  }
  return from < s.length ? out + plusAsSpace(s.slice(from)) : out;
}

const SURROGATE_UNIT = /[\ud800-\udfff]/;
const plusAsSpace = (s: string): string => (s.includes('+') ? s.replaceAll('+', ' ') : s);

/**
 * The escapes `%XX` of `s` from `start` to `end` (a run of them) as text: their bytes as UTF-8,
 * a byte in no UTF-8 sequence as `bytesText` writes it.
 */
function decodeEscapes(s: string, start: number, end: number): string {
  const n = (end - start) / 3;
  const byte = (k: number) => (hexValue(s.charCodeAt(start + 3 * k + 1)) << 4) | hexValue(s.charCodeAt(start + 3 * k + 2));
  let out = '';
  for (let i = 0; i < n; ) {
    const c = byte(i);
    if (c < 0x80) {
      out += String.fromCharCode(c);
      i++;
      continue;
    }
    // UTF-8's well-formed sequences (Unicode table 3-7): length, and the range of the second byte.
    let len = 0;
    let lo = 0x80;
    let hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c === 0xe0) [len, lo] = [3, 0xa0];
    else if (c === 0xed) [len, hi] = [3, 0x9f];
    else if (c >= 0xe1 && c <= 0xef) len = 3;
    else if (c === 0xf0) [len, lo] = [4, 0x90];
    else if (c === 0xf4) [len, hi] = [4, 0x8f];
    else if (c >= 0xf1 && c <= 0xf3) len = 4;
    let ok = len > 0 && i + len <= n;
    let cp = c & (len === 2 ? 0x1f : len === 3 ? 0x0f : 0x07);
    for (let k = 1; ok && k < len; k++) {
      const b = byte(i + k);
      ok = k === 1 ? b >= lo && b <= hi : b >= 0x80 && b <= 0xbf;
      cp = (cp << 6) | (b & 0x3f);
    }
    if (!ok) {
      // As `headerText` escapes it (`bytesText`): U+DC00 + the byte.
      out += String.fromCharCode(0xdc00 + c);
      i++;
      continue;
    }
    out += String.fromCodePoint(cp);
    i += len;
  }
  return out;
}

/**
 * `queryString.encode(m)` / `m.encodeQueryString()`: Go's `url.Values.Encode`: `key=value`
 * pairs joined by `&`, sorted by key (UTF-8 bytes), both escaped as by `url.QueryEscape`. A
 * value is a string, or a list of strings (one pair each, in order: `req.url.query_params`
 * encodes back); any other value is an evaluation error, as is a result over `MAX_BUILT_STRING`.
 */
export function queryEncode(m: unknown, fn = 'queryString.encode()'): string {
  const entries = mapEntries(m);
  if (entries === undefined) throw evalError('invalid_argument', `${fn}: needs a map, got ${celTypeName(m)}`);
  // Each pair takes at least 2 characters (`k=`, `&`): a map that cannot fit is refused before its keys are sorted.
  if (2 * entries.length - 1 > MAX_BUILT_STRING) throw evalError('invalid_argument', `${fn}: result too long (over ${MAX_BUILT_STRING} characters)`);
  const byKey = new Map<string, readonly string[]>();
  for (const [k, v] of entries) {
    if (typeof k !== 'string') throw evalError('invalid_argument', `${fn}: a key is not a string (${celTypeName(k)})`);
    const values = typeof v === 'string' ? [v] : Array.isArray(v) && v.every((e) => typeof e === 'string') ? (v as string[]) : undefined;
    if (values === undefined) throw evalError('invalid_argument', `${fn}: the value of ${JSON.stringify(k.slice(0, 32))} is not a string or a list of strings (${celTypeName(v)})`);
    byKey.set(k, values);
  }
  let out = '';
  for (const k of sortUtf8([...byKey.keys()])) {
    const key = urlEscape(k);
    for (const v of byKey.get(k)!) {
      out += `${out === '' ? '' : '&'}${key}=${urlEscape(v)}`;
      if (out.length > MAX_BUILT_STRING) throw evalError('invalid_argument', `${fn}: result too long (over ${MAX_BUILT_STRING} characters)`);
    }
  }
  return out;
}

/** `basic_auth.encode(user, password)`: `Basic ` and the standard base64 of `user:password` (UTF-8). */
export const basicAuthEncode = (user: string, password: string): string => `Basic ${textBytes(`${user}:${password}`).toString('base64')}`;

/** Longest list `lists.range(n)` builds: a larger `n` is an evaluation error. */
export const MAX_LIST_RANGE = 10_000;

/** `lists.range(n)`: `[0, 1, …, n - 1]` (empty for n ≤ 0, as cel-go's); n over `MAX_LIST_RANGE` is an evaluation error. */
export function listsRange(n: bigint): bigint[] {
  if (n > BigInt(MAX_LIST_RANGE)) throw evalError('invalid_argument', `lists.range(): ${n} is too large (at most ${MAX_LIST_RANGE})`);
  const out: bigint[] = [];
  for (let i = 0n; i < n; i++) out.push(i);
  return out;
}

/** Largest `max` of `rand.int(min, max)`: CEL's largest int. */
export const MAX_RAND_INT = 9_223_372_036_854_775_807n;

/** Random 64-bit draws, filled 64 at a time (a `randomFillSync` call takes microseconds). */
const RANDOM_POOL = new BigUint64Array(64);
let randomPoolNext = RANDOM_POOL.length;

/** 8 random bytes as an unsigned 64-bit integer. */
function random64(): bigint {
  if (randomPoolNext >= RANDOM_POOL.length) {
    randomFillSync(RANDOM_POOL);
    randomPoolNext = 0;
  }
  return RANDOM_POOL[randomPoolNext++]!;
}

/**
 * `rand.int()`, `rand.int(min, max)`: a uniformly random int from `min` to `max`, both included;
 * `rand.int()` is `rand.int(0, 1)`. ngrok's page says "only supports positive integers and `min`
 * must be larger than the provided `max`", and its examples are `rand.int() == 1` (with the
 * defaults 0 and 1: only meaningful if 1 can come out, so `max` is included) and
 * `rand.int(0, 10) >= 5` (`min` below `max`). The examples are taken as the truth: `min` must be
 * at most `max` (the sentence has them swapped), and both at least 0 ("positive" read as not
 * negative, since the default `min` is 0). Any other arguments are an evaluation error. The
 * arguments are CEL ints (up to `MAX_RAND_INT`, 2^63 - 1); the draw is constant time (crypto
 * randomness, rejection sampling over 64 bits only for ranges of 2^48 or more).
 */
export function randInt(min = 0n, max = 1n): bigint {
  if (min < 0n || max < 0n) throw evalError('invalid_argument', `rand.int(): min and max must not be negative (got ${min}, ${max})`);
  if (min > max) throw evalError('invalid_argument', `rand.int(): min must not be larger than max (got ${min}, ${max})`);
  if (max > MAX_RAND_INT) throw evalError('invalid_argument', `rand.int(): max ${max} is too large (at most ${MAX_RAND_INT})`);
  const range = max - min + 1n;
  if (range < 2n ** 48n) return min + BigInt(randomInt(Number(range)));
  // Uniform over [0, range) from 64 random bits: draws past the largest multiple of range are
  // drawn again (fewer than half of them, so in all but 2^-64 of cases at most a few draws).
  const limit = 2n ** 64n - (2n ** 64n % range);
  for (;;) {
    const r = random64();
    if (r < limit) return min + (r % range);
  }
}

/** What no query string holds: white space, control characters, and `#` (which ends the query of a URL). */
const NOT_IN_QUERY = /[\s\x00-\x1f\x7f#]/;

/**
 * `s.isQueryString()`: whether `s` is a query string (the part of a URL after `?`). ngrok's page
 * gives `'a=b&c=d'` as one and `'not a query string'` as not, which Go's `url.ParseQuery` alone
 * accepts (one key with an empty value), so more is asked: a non-empty string that
 * `url.ParseQuery` reads without an error (no `;`, every `%` followed by two hex digits, as
 * `queryString.decode()` requires), holding no white space, control character or `#`, and whose
 * every `&`-separated pair has a key (`=b` has none; empty pairs, `a=1&&b=2`, are skipped as Go
 * skips them; a key alone, `debug`, is a key with an empty value as for `hasQueryParam`).
 */
export function isQueryString(s: string): boolean {
  if (s === '' || NOT_IN_QUERY.test(s) || s.includes(';') || BAD_ESCAPE.test(s)) return false;
  let pairs = 0;
  for (const pair of s.split('&')) {
    if (pair === '') continue;
    if (pair.startsWith('=')) return false;
    pairs++;
  }
  return pairs > 0;
}

/**
 * `s.isPrivateIp()`: whether `s` is an IP address in a private range, as Go's `net.IP.IsPrivate`
 * (of `net.ParseIP(s)`) says: ngrok documents the IPv4 ranges of RFC 1918 (`10.0.0.0/8`,
 * `172.16.0.0/12`, `192.168.0.0/16`), and Go adds IPv6's unique local addresses (`fc00::/7`,
 * RFC 4193). An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`) is its IPv4 address, as in Go.
 * Loopback (`127.0.0.0/8`, `::1`), link-local (`169.254.0.0/16`, `fe80::/10`) and other special
 * ranges are not private, as in Go. Anything that is not an address (a zone `%eth0`, a port, a
 * CIDR, leading zeros `010.0.0.1`, as Go refuses them) is false.
 */
export function isPrivateIp(s: string): boolean {
  if (s.length > 64) return false;
  let b = parseIPv4(s);
  if (!b) {
    if (!s.includes(':')) return false;
    const v6 = parseIPv6(s);
    if (!v6) return false;
    const mapped = v6.slice(0, 10).every((x) => x === 0) && v6[10] === 0xff && v6[11] === 0xff;
    if (!mapped) return (v6[0]! & 0xfe) === 0xfc;
    b = v6.slice(12);
  }
  return b[0] === 10 || (b[0] === 172 && (b[1]! & 0xf0) === 16) || (b[0] === 192 && b[1] === 168);
}

/** Go's `net/url` escaping modes (`shouldEscape`). */
type UrlMode = 'path' | 'host' | 'zone' | 'userPassword' | 'fragment';

function isAlnum(c: number): boolean {
  return (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5a) || (c >= 0x61 && c <= 0x7a);
}

/** Go's `url.shouldEscape(c, mode)` for one byte. */
function shouldEscape(c: number, mode: UrlMode): boolean {
  if (isAlnum(c)) return false;
  const ch = String.fromCharCode(c);
  if ((mode === 'host' || mode === 'zone') && `!$&'()*+,;=:[]<>"`.includes(ch)) return false;
  if ('-_.~'.includes(ch)) return false;
  if ('$&+,/:;=?@'.includes(ch)) {
    if (mode === 'path') return ch === '?';
    if (mode === 'userPassword') return ch === '@' || ch === '/' || ch === '?' || ch === ':';
    if (mode === 'fragment') return false;
    return true;
  }
  if (mode === 'fragment' && "!()*".includes(ch)) return false;
  return true;
}

const urlError = (fn: string, why: string) => evalError('invalid_argument', `${fn}: ${why}`);

/** Go's `url.unescape(s, mode)` over a byte string (one character per byte). */
function unescapeBytes(s: string, mode: UrlMode, fn: string): string {
  let n = 0;
  for (let i = 0; i < s.length; ) {
    const c = s.charCodeAt(i);
    if (c === 0x25) {
      n++;
      if (i + 2 >= s.length || !isHex(s.charCodeAt(i + 1)) || !isHex(s.charCodeAt(i + 2))) throw urlError(fn, `invalid URL escape ${JSON.stringify(visible(s.slice(i, i + 3)))}`);
      // Only %25 and bytes past ASCII may be escaped in a host (RFC 6874 allows more in a zone).
      if (mode === 'host' && hexValue(s.charCodeAt(i + 1)) < 8 && s.slice(i, i + 3) !== '%25') throw urlError(fn, `invalid URL escape ${JSON.stringify(s.slice(i, i + 3))}`);
      if (mode === 'zone') {
        const v = (hexValue(s.charCodeAt(i + 1)) << 4) | hexValue(s.charCodeAt(i + 2));
        if (s.slice(i, i + 3) !== '%25' && v !== 0x20 && shouldEscape(v, 'host')) throw urlError(fn, `invalid URL escape ${JSON.stringify(s.slice(i, i + 3))}`);
      }
      i += 3;
    } else {
      if ((mode === 'host' || mode === 'zone') && c < 0x80 && shouldEscape(c, mode)) throw urlError(fn, `invalid character ${JSON.stringify(String.fromCharCode(c))} in host name`);
      i++;
    }
  }
  if (n === 0) return s;
  return s.replace(/%([0-9A-Fa-f]{2})/g, (_, h: string) => String.fromCharCode(parseInt(h, 16)));
}

function isHex(c: number): boolean {
  return (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x46) || (c >= 0x61 && c <= 0x66);
}

/** A byte string's bytes as text, for messages (UTF-8, else escaped). */
const visible = (bytes: string): string => bytesText(Buffer.from(bytes, 'latin1'));

/** Go's `url.escape(s, mode)` over a byte string (upper-case `%XX`). */
function escapeBytes(s: string, mode: UrlMode): string {
  let out = '';
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    out += shouldEscape(c, mode) ? `%${HEX_UPPER[c]!}` : s[i];
  }
  return out;
}
const HEX_UPPER = Array.from({ length: 256 }, (_, b) => b.toString(16).toUpperCase().padStart(2, '0'));

/** Go's `validUserinfo`: the characters RFC 3986 allows in userinfo, and `%`, `@`. */
function validUserinfo(s: string): boolean {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (isAlnum(c) || "-._:~!$&'()*+,;=%@".includes(s[i]!)) continue;
    return false;
  }
  return true;
}

/** Go's `validOptionalPort`: empty, or `:` and digits. */
const validOptionalPort = (p: string): boolean => p === '' || /^:[0-9]*$/.test(p);

/** Go's `parseHost`. */
function parseHost(host: string, fn: string): string {
  if (host.startsWith('[')) {
    const i = host.lastIndexOf(']');
    if (i < 0) throw urlError(fn, "missing ']' in host");
    const colonPort = host.slice(i + 1);
    if (!validOptionalPort(colonPort)) throw urlError(fn, `invalid port ${JSON.stringify(visible(colonPort))} after host`);
    const zone = host.slice(0, i).indexOf('%25');
    if (zone >= 0) return unescapeBytes(host.slice(0, zone), 'host', fn) + unescapeBytes(host.slice(zone, i), 'zone', fn) + unescapeBytes(host.slice(i), 'host', fn);
  } else {
    const i = host.lastIndexOf(':');
    if (i >= 0) {
      const colonPort = host.slice(i);
      if (!validOptionalPort(colonPort)) throw urlError(fn, `invalid port ${JSON.stringify(visible(colonPort))} after host`);
    }
  }
  return unescapeBytes(host, 'host', fn);
}

/** Go's `url.URL`, its fields as byte strings. */
interface GoUrl {
  scheme: string;
  opaque: string;
  user?: { username: string; password?: string };
  host: string;
  path: string;
  rawPath: string;
  rawQuery: string;
  fragment: string;
  rawFragment: string;
}

/** Go's `url.Parse` (of its `net/url`, Go 1.22) over a byte string; an error as a CEL evaluation error. */
function goParseUrl(raw: string, fn: string): GoUrl {
  const hash = raw.indexOf('#');
  const [rest0, frag] = hash < 0 ? [raw, undefined] : [raw.slice(0, hash), raw.slice(hash + 1)];
  // The control characters Go refuses anywhere in the URL.
  if (/[\x00-\x1f\x7f]/.test(rest0)) throw urlError(fn, 'invalid control character in URL');
  const u: GoUrl = { scheme: '', opaque: '', host: '', path: '', rawPath: '', rawQuery: '', fragment: '', rawFragment: '' };
  if (rest0 === '*') u.path = '*';
  else {
    // getScheme: letters, then letters, digits, + - . up to a colon.
    let rest = rest0;
    for (let i = 0; i < rest0.length; i++) {
      const c = rest0.charCodeAt(i);
      const letter = (c >= 0x41 && c <= 0x5a) || (c >= 0x61 && c <= 0x7a);
      if (letter) continue;
      if ((c >= 0x30 && c <= 0x39) || c === 0x2b || c === 0x2d || c === 0x2e) {
        if (i === 0) break;
        continue;
      }
      if (c === 0x3a) {
        if (i === 0) throw urlError(fn, 'missing protocol scheme');
        u.scheme = rest0.slice(0, i).toLowerCase();
        rest = rest0.slice(i + 1);
      }
      break;
    }
    if (rest.endsWith('?') && rest.indexOf('?') === rest.length - 1) rest = rest.slice(0, -1);
    else {
      const q = rest.indexOf('?');
      if (q >= 0) {
        u.rawQuery = rest.slice(q + 1);
        rest = rest.slice(0, q);
      }
    }
    if (!rest.startsWith('/')) {
      if (u.scheme !== '') {
        // An opaque URL (`mailto:x@example.com`): the rest as it is.
        u.opaque = rest;
        return withFragment(u, frag, fn);
      }
      const slash = rest.indexOf('/');
      if ((slash < 0 ? rest : rest.slice(0, slash)).includes(':')) throw urlError(fn, 'first path segment in URL cannot contain colon');
    }
    if ((u.scheme !== '' || !rest.startsWith('///')) && rest.startsWith('//')) {
      let authority = rest.slice(2);
      rest = '';
      const slash = authority.indexOf('/');
      if (slash >= 0) {
        rest = authority.slice(slash);
        authority = authority.slice(0, slash);
      }
      const at = authority.lastIndexOf('@');
      u.host = parseHost(at < 0 ? authority : authority.slice(at + 1), fn);
      if (at >= 0) {
        const userinfo = authority.slice(0, at);
        if (!validUserinfo(userinfo)) throw urlError(fn, 'invalid userinfo');
        const colon = userinfo.indexOf(':');
        u.user =
          colon < 0
            ? { username: unescapeBytes(userinfo, 'userPassword', fn) }
            : { username: unescapeBytes(userinfo.slice(0, colon), 'userPassword', fn), password: unescapeBytes(userinfo.slice(colon + 1), 'userPassword', fn) };
      }
    }
    // setPath: RawPath only when the path's default escaping would not give it back.
    u.path = unescapeBytes(rest, 'path', fn);
    if (escapeBytes(u.path, 'path') !== rest) u.rawPath = rest;
  }
  return withFragment(u, frag, fn);
}

function withFragment(u: GoUrl, frag: string | undefined, fn: string): GoUrl {
  if (frag === undefined || frag === '') return u;
  u.fragment = unescapeBytes(frag, 'fragment', fn);
  if (escapeBytes(u.fragment, 'fragment') !== frag) u.rawFragment = frag;
  return u;
}

/** Go's `Userinfo.String()`: the user name and password escaped as in a URL. */
function userinfoString(user: GoUrl['user']): string {
  if (!user) return '';
  const name = escapeBytes(user.username, 'userPassword');
  return user.password === undefined ? name : `${name}:${escapeBytes(user.password, 'userPassword')}`;
}

/** Go's `URL.Hostname()` / `URL.Port()`. */
function hostPort(host: string): [string, string] {
  let name = host;
  let port = '';
  const colon = host.lastIndexOf(':');
  if (colon >= 0 && validOptionalPort(host.slice(colon))) {
    name = host.slice(0, colon);
    port = host.slice(colon + 1);
  }
  if (name.startsWith('[') && name.endsWith(']')) name = name.slice(1, -1);
  return [name, port];
}

/** The keys of the map `url.parse()` returns. */
export const PARSED_URL_KEYS = ['scheme', 'opaque', 'user', 'username', 'password', 'host', 'hostname', 'port', 'path', 'raw_path', 'raw_query', 'fragment', 'raw_fragment'] as const;

/**
 * `url.parse(s)` / `s.parseUrl()`: Go's `url.Parse` (an invalid URL is an evaluation error),
 * as a map of strings named after Go's `url.URL` fields: `scheme` (lower-case), `opaque`,
 * `user` (`Userinfo.String()`: `name:password`, escaped), `host` (with the port, as Go's
 * `Host`), `path` (unescaped), `raw_path`, `raw_query`, `fragment` (unescaped), `raw_fragment`;
 * and what Go's methods read from them: `username`, `password`, `hostname` (`Hostname()`:
 * without the port and IPv6 brackets), `port` (`Port()`: a string, `''` when none). Every key
 * is there (`''` for a part the URL does not have).
 */
export function parseUrl(s: string, fn = 'url.parse()'): Map<string, string> {
  const u = goParseUrl(textBytes(s).toString('latin1'), fn);
  const [hostname, port] = hostPort(u.host);
  const text = (b: string) => (/[\x80-\xff]/.test(b) ? bytesText(Buffer.from(b, 'latin1')) : b);
  const fields: Record<(typeof PARSED_URL_KEYS)[number], string> = {
    scheme: u.scheme,
    opaque: u.opaque,
    user: userinfoString(u.user),
    username: u.user?.username ?? '',
    password: u.user?.password ?? '',
    host: u.host,
    hostname,
    port,
    path: u.path,
    raw_path: u.rawPath,
    raw_query: u.rawQuery,
    fragment: u.fragment,
    raw_fragment: u.rawFragment,
  };
  return new Map(PARSED_URL_KEYS.map((k) => [k, text(fields[k])]));
}

/** `s.isURL()`: whether Go's `url.Parse` reads it as an absolute URL with a host (a scheme and a host). */
export function isUrl(s: string): boolean {
  try {
    const u = goParseUrl(textBytes(s).toString('latin1'), 'isURL()');
    return u.scheme !== '' && u.host !== '';
  } catch (err) {
    if (err instanceof EvaluationError) return false;
    throw err;
  }
}

class Base64Namespace {}
class UrlNamespace {}
class HashNamespace {}
class StringsNamespace {}
class JsonNamespace {}
class QueryStringNamespace {}
class BasicAuthNamespace {}
class ListsNamespace {}
class RandNamespace {}

/**
 * Registers the macros on `env`: the string methods on `string` and on each of `stringLike`
 * (types that stand for their string, `cel.ts`'s `STRING_LIKE`; `stringLikeText` gives the
 * string of such a value, for `json.encode()`), and the `base64`, `url` and `hash` namespaces
 * as constants whose methods take the string.
 */
export function registerNgrokMacros(env: Environment, stringLike: readonly string[], stringLikeText: (v: unknown) => string | undefined): void {
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
    .registerFunction('Base64Namespace.encode(bytes): string', (_: unknown, b: Uint8Array) => base64Encode(b))
    .registerFunction('JsonNamespace.encode(dyn): string', (_: unknown, v: unknown) => jsonEncode(v, 'json.encode()', stringLikeText))
    .registerFunction('list.encodeJson(): string', (v: unknown) => jsonEncode(v, 'encodeJson()', stringLikeText))
    .registerFunction('map.encodeJson(): string', (v: unknown) => jsonEncode(v, 'encodeJson()', stringLikeText))
    .registerType('QueryStringNamespace', QueryStringNamespace)
    .registerConstant('queryString', 'QueryStringNamespace', new QueryStringNamespace())
    .registerFunction('QueryStringNamespace.encode(map): string', (_: unknown, m: unknown) => queryEncode(m))
    .registerFunction('map.encodeQueryString(): string', (m: unknown) => queryEncode(m, 'encodeQueryString()'))
    .registerType('BasicAuthNamespace', BasicAuthNamespace)
    .registerConstant('basic_auth', 'BasicAuthNamespace', new BasicAuthNamespace())
    .registerFunction('BasicAuthNamespace.encode(string, string): string', (_: unknown, u: string, p: string) => basicAuthEncode(u, p))
    .registerType('ListsNamespace', ListsNamespace)
    .registerConstant('lists', 'ListsNamespace', new ListsNamespace())
    .registerFunction('ListsNamespace.range(int): list<int>', (_: unknown, n: bigint) => listsRange(n))
    .registerType('RandNamespace', RandNamespace)
    .registerConstant('rand', 'RandNamespace', new RandNamespace())
    .registerFunction('RandNamespace.double(): double', () => Math.random())
    .registerFunction('RandNamespace.int(): int', () => randInt())
    .registerFunction('RandNamespace.int(int, int): int', (_: unknown, min: bigint, max: bigint) => randInt(min, max));
  registerListMacros(env);
  registerStringFormat(env, stringLike, stringLikeText);
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
      .registerFunction(`UrlNamespace.unescape(${t}): string`, (_: unknown, v: unknown) => urlUnescape(text(v)))
      .registerFunction(`UrlNamespace.parse(${t}): map<string, string>`, (_: unknown, v: unknown) => parseUrl(text(v)))
      .registerFunction(`${t}.parseUrl(): map<string, string>`, (v: unknown) => parseUrl(text(v), 'parseUrl()'))
      .registerFunction(`${t}.isURL(): bool`, (v: unknown) => isUrl(text(v)))
      .registerFunction(`QueryStringNamespace.decode(${t}): map<string, string>`, (_: unknown, v: unknown) => queryDecode(text(v)))
      .registerFunction(`${t}.decodeQueryString(): map<string, string>`, (v: unknown) => queryDecode(text(v), 'decodeQueryString()'))
      .registerFunction(`${t}.isQueryString(): bool`, (v: unknown) => isQueryString(text(v)))
      .registerFunction(`${t}.isPrivateIp(): bool`, (v: unknown) => isPrivateIp(text(v)));
  }
}
