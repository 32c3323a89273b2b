/**
 * `s.format(list)`: ngrok's `string.format()` (https://ngrok.com/docs/traffic-policy/macros/),
 * which is cel-go's strings extension `format` (its current formatter, as of strings version 4):
 * printf-style substitution of the list's elements, in order, into the clauses of `s`.
 *
 * - `%%` is a `%`; any other `%` starts a clause: an optional precision `.N` (digits; used by
 *   `%f` and `%e`, accepted and ignored by the others, as cel-go does), then one of the verbs
 *   ngrok documents. A clause takes the next element of the list.
 * - `%s`: strings as they are; bools `true` / `false`; ints and uints in decimal; doubles as Go's
 *   `strconv.FormatFloat(x, 'f', -1, 64)` (shortest, never an exponent: `1e21` is
 *   `1000000000000000000000`), `NaN`, `Infinity`, `-Infinity`; bytes as their text; `null`;
 *   timestamps as RFC 3339 in UTC; durations as seconds (`6347s`, `1.5s`); types as their name;
 *   lists as `[a, b]` and maps as `{k: v, …}` (keys in Go's string order), their elements
 *   formatted as by `%s`; `req.url` and the other values that stand for a string as that string.
 * - `%d`: ints, uints in decimal; doubles as `%s` writes them.
 * - `%f`: ints, uints, doubles in fixed point, `N` (default 6) digits after the point, as Go's
 *   `%.Nf` (an exact tie rounds to even: `'%.0f'.format([2.5])` is `2`, JavaScript's `toFixed`
 *   would give `3`); `%e`: the same in scientific notation as Go's `%.Ne` (`2.718280e+00`).
 * - `%b`: ints, uints in binary (a negative int with a `-`), bools as `1` / `0`.
 * - `%x` / `%X`: ints, uints in hexadecimal (lower / upper case, a negative int with a `-`);
 *   strings and bytes as the hexadecimal of each byte (a string's UTF-8).
 * - `%o`: ints, uints in octal.
 *
 * Where cel-go's own documentation and its code differ, the code is followed: `%e` writes Go's
 * `2.718280e+00` (the README still shows its first formatter's `2.718280 × 10⁰⁰`), and `%s` writes
 * a map's keys and strings without quotes (`{a: x}`, the README shows `{"a":"x"}`). ngrok
 * documents only the verbs and six examples, all of which this gives.
 *
 * Any other verb (`%q`, `%v`, `%c`, a `%` at the end, …), a precision over `MAX_FORMAT_PRECISION`,
 * a clause without a list element left, a value a clause does not take (`'%d'.format(['a'])`), a
 * value nested more than `MAX_VALUE_DEPTH` deep and a result over `MAX_BUILT_STRING` characters
 * are evaluation errors naming `format()`. Elements past the last clause are ignored (cel-go
 * refuses them only when it checks a literal format string against a literal list).
 */
import type { Environment } from '@marcbachmann/cel-js';
import { bytesText, textBytes } from '../http-headers.js';
import { celTypeName, className, compareOrderKeys, evalError, listItems, mapEntries, MAX_BUILT_STRING, MAX_VALUE_DEPTH, goTimeText, utf8OrderKeys } from './cel-values.js';

/** Largest precision of a `%.Nf` / `%.Ne` clause (JavaScript's `toFixed` / `toExponential` take up to 100). */
export const MAX_FORMAT_PRECISION = 100;
/** Digits after the point of `%f` and `%e` without a precision (cel-go's default). */
const DEFAULT_PRECISION = 6;
/** The verbs ngrok documents, for messages. */
const VERBS = '%s, %d, %f, %e, %b, %x, %X, %o (and %% for a %)';

const fail = (why: string) => evalError('invalid_argument', `format(): ${why}`);
const tooLong = () => evalError('invalid_argument', `format(): result too long (over ${MAX_BUILT_STRING} characters)`);

/** A uint's value (the library's `UnsignedInt`), undefined for other values. */
function uintValue(v: unknown): bigint | undefined {
  return v !== null && typeof v === 'object' && className(v) === 'UnsignedInt' ? (v as { value: bigint }).value : undefined;
}

/** 5^n and 10^n as BigInts (n at most a few hundred: what ties need), each computed once. */
const POW5: bigint[] = [];
const POW10: bigint[] = [];
const pow5 = (n: number): bigint => (POW5[n] ??= 5n ** BigInt(n));
const pow10 = (n: number): bigint => (POW10[n] ??= 10n ** BigInt(n));

/** A tie `n + 1/2`, given as the odd integer `2n + 1`, rounded half to even: `n` or `n + 1`, whichever is even. */
const halfEven = (twice: bigint): bigint => {
  const n = (twice - 1n) / 2n;
  return n % 2n === 0n ? n : n + 1n;
};

const NON_FINITE = (x: number): string | undefined => (Number.isNaN(x) ? 'NaN' : x === Infinity ? 'Infinity' : x === -Infinity ? '-Infinity' : undefined);

/** A double as Go's `strconv.FormatFloat(x, 'f', -1, 64)`: the shortest digits that read back as `x`, without an exponent. */
export function shortestFixed(x: number): string {
  const special = NON_FINITE(x);
  if (special !== undefined) return special;
  if (x === 0) return Object.is(x, -0) ? '-0' : '0';
  // toExponential() without digits: the shortest that round-trips, as Go's.
  const [mant, exp] = Math.abs(x).toExponential().split('e') as [string, string];
  const digits = mant.replace('.', '');
  const e = Number(exp);
  let out: string;
  if (e < 0) out = `0.${'0'.repeat(-e - 1)}${digits}`;
  else if (digits.length <= e + 1) out = digits + '0'.repeat(e + 1 - digits.length);
  else out = `${digits.slice(0, e + 1)}.${digits.slice(e + 1)}`;
  return x < 0 ? `-${out}` : out;
}

/** `n` with a decimal point `p` digits from its end. */
function withPoint(n: bigint, p: number): string {
  const s = n.toString().padStart(p + 1, '0');
  return p > 0 ? `${s.slice(0, -p)}.${s.slice(-p)}` : s;
}

/** A double as Go's `%.{p}f` (`fmt`): exact decimal digits, an exact tie rounded to even, a sign on -0. */
export function formatFixed(x: number, p: number): string {
  const special = NON_FINITE(x);
  if (special !== undefined) return special;
  const a = Math.abs(x);
  let body: string;
  if (a >= 1e21) {
    // An integer (toFixed would write an exponent).
    body = BigInt(a).toString() + (p > 0 ? `.${'0'.repeat(p)}` : '');
  } else {
    // toFixed rounds the exact value, as Go; only an exact tie (a · 10^p = n + 1/2, that is
    // a = m · 2^-(p+1) with m odd) rounds differently: away from zero there, to even in Go.
    body = a.toFixed(p);
    const t = a * 2 ** (p + 1);
    if (Number.isInteger(t) && t % 2 === 1) body = withPoint(halfEven(BigInt(t) * pow5(p)), p);
  }
  return x < 0 || Object.is(x, -0) ? `-${body}` : body;
}

/** A double as Go's `%.{p}e` (`fmt`): `d.ddde+XX`, exact digits, an exact tie rounded to even. */
export function formatScientific(x: number, p: number): string {
  const special = NON_FINITE(x);
  if (special !== undefined) return special;
  const a = Math.abs(x);
  const sign = x < 0 || Object.is(x, -0) ? '-' : '';
  const write = (digits: string, e: number) => `${sign}${digits[0]}${p > 0 ? `.${digits.slice(1)}` : ''}e${e < 0 ? '-' : '+'}${String(Math.abs(e)).padStart(2, '0')}`;
  if (a === 0) return write('0'.repeat(p + 1), 0);
  const [mant, exp] = a.toExponential(p).split('e') as [string, string];
  const e1 = Number(exp);
  // toExponential rounds the exact value, as Go, but an exact tie away from zero: with E the
  // exponent before rounding (e1, or e1 - 1 when rounding carried into a new digit) and
  // k = p - E, a tie is a · 10^k = n + 1/2, which needs u = a · 2^(k+1) to be an odd integer
  // (exact: a power-of-two scaling) and, for k < 0, divisible by 5^-k.
  for (const E of [e1, e1 - 1]) {
    const k = p - E;
    const u = a * 2 ** (k + 1);
    if (!Number.isInteger(u) || u % 2 !== 1) continue;
    const U = BigInt(u);
    let twice: bigint;
    if (k >= 0) twice = U * pow5(k);
    else {
      const f = pow5(-k);
      if (U % f !== 0n) continue;
      twice = U / f;
    }
    // E is a's exponent: 10^p ≤ a · 10^k < 10^(p+1).
    const lo = 2n * pow10(p);
    if (twice < lo || twice >= 10n * lo) continue;
    const n = halfEven(twice);
    return n === pow10(p + 1) ? write(`1${'0'.repeat(p)}`, E + 1) : write(n.toString(), E);
  }
  return write(mant.replace('.', ''), e1);
}

/** A string's or bytes' bytes as hexadecimal (Go's `%x` of a string: its bytes). */
function hexOf(b: Uint8Array, upper: boolean): string {
  const h = Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString('hex');
  return upper ? h.toUpperCase() : h;
}

/** An int or uint in `radix` (a negative int with a `-`), undefined for other values. */
function integerIn(v: unknown, radix: number): string | undefined {
  const n = typeof v === 'bigint' ? v : uintValue(v);
  return n === undefined ? undefined : n.toString(radix);
}

/** An int, uint or double as a double (`%f`, `%e`), undefined for other values. */
function asDouble(v: unknown): number | undefined {
  if (typeof v === 'number') return v;
  if (typeof v === 'bigint') return Number(v);
  const u = uintValue(v);
  return u === undefined ? undefined : Number(u);
}

/** Text being built, at most `limit` characters (past it: an evaluation error). */
interface Writer {
  out: string;
  limit: number;
}

function push(w: Writer, s: string): void {
  if (w.out.length + s.length > w.limit) throw tooLong();
  w.out += s;
}

/**
 * `%s` of `v`, appended to `w`: lists and maps element by element, each map entry formatted on
 * its own within what is left of the limit, so a long value stops at the limit.
 */
function writeString(w: Writer, v: unknown, depth: number, stringLike: (v: unknown) => string | undefined): void {
  if (v === null) return push(w, 'null');
  switch (typeof v) {
    case 'string':
      return push(w, v);
    case 'boolean':
      return push(w, v ? 'true' : 'false');
    case 'bigint':
      return push(w, v.toString());
    case 'number':
      return push(w, shortestFixed(v));
  }
  if (v instanceof Uint8Array) {
    // At least half a character per byte (4 bytes of UTF-8 are 2 UTF-16 units): one that cannot fit is not decoded.
    if (w.out.length + v.length / 2 > w.limit) throw tooLong();
    return push(w, bytesText(Buffer.from(v.buffer, v.byteOffset, v.byteLength)));
  }
  if (v instanceof Date) {
    if (Number.isNaN(v.getTime())) throw fail('invalid timestamp');
    return push(w, goTimeText(v));
  }
  const text = stringLike(v);
  if (text !== undefined) return push(w, text);
  const u = uintValue(v);
  if (u !== undefined) return push(w, u.toString());
  const name = typeof v === 'object' ? className(v as object) : typeof v;
  if (name === 'Duration') {
    const d = v as { seconds: bigint; nanos: number };
    return push(w, `${shortestFixed(Number(d.seconds) + d.nanos / 1e9)}s`);
  }
  if (name === 'Type') return push(w, (v as { name: string }).name);
  const items = listItems(v);
  const entries = items === undefined ? mapEntries(v) : undefined;
  if (items === undefined && entries === undefined) {
    throw fail(`string clause can only be used on strings, bools, bytes, ints, doubles, maps, lists, types, durations, and timestamps, was given ${celTypeName(v)}`);
  }
  if (depth >= MAX_VALUE_DEPTH) throw fail(`value nested more than ${MAX_VALUE_DEPTH} deep`);
  if (items !== undefined) {
    push(w, '[');
    for (let i = 0; i < items.length; i++) {
      if (i > 0) push(w, ', ');
      writeString(w, items[i], depth + 1, stringLike);
    }
    return push(w, ']');
  }
  // Each entry takes at least 4 characters (`k: v`, or `, ` and 2): a map that cannot fit is refused before anything is formatted.
  const left = () => w.limit - w.out.length - 2;
  if (4 * entries!.length - 2 > left()) throw tooLong();
  const parts: [string, string][] = [];
  let used = 0;
  for (const [k, e] of entries!) {
    const key: Writer = { out: '', limit: left() - used };
    writeString(key, k, depth + 1, stringLike);
    const val: Writer = { out: '', limit: left() - used - key.out.length - 2 };
    writeString(val, e, depth + 1, stringLike);
    used += key.out.length + val.out.length + 4;
    parts.push([key.out, val.out]);
  }
  // Sorted by key as Go compares strings (cel-go sorts the formatted keys), stably.
  const { keys } = utf8OrderKeys(parts.map((p) => p[0]));
  const order = parts.map((_, i) => i).sort((i, j) => compareOrderKeys(keys[i]!, keys[j]!) || i - j);
  push(w, '{');
  order.forEach((i, n) => push(w, `${n > 0 ? ', ' : ''}${parts[i]![0]}: ${parts[i]![1]}`));
  return push(w, '}');
}

/**
 * `s.format(list)` (see the file's comment). `stringLike` gives the string of a value that stands
 * for one (`req.url`, …), undefined for any other.
 */
export function formatString(format: string, args: readonly unknown[], stringLike: (v: unknown) => string | undefined = () => undefined): string {
  const w: Writer = { out: '', limit: MAX_BUILT_STRING };
  let argIndex = 0;
  let literalFrom = 0;
  for (let i = format.indexOf('%'); i >= 0; i = format.indexOf('%', i)) {
    push(w, format.slice(literalFrom, i));
    if (format[i + 1] === '%') {
      push(w, '%');
      literalFrom = i += 2;
      continue;
    }
    // The clause: `.N`, then the verb.
    let j = i + 1;
    let precision = DEFAULT_PRECISION;
    if (format[j] === '.') {
      const m = /^\d+/.exec(format.slice(j + 1, j + 8));
      if (!m) throw fail(`invalid precision at position ${i} (a "." must be followed by digits)`);
      precision = Number(m[0]);
      if (precision > MAX_FORMAT_PRECISION) throw fail(`precision ${precision} is too large (at most ${MAX_FORMAT_PRECISION})`);
      j += 1 + m[0].length;
    }
    if (j >= format.length) throw fail(`the format ends inside a clause at position ${i} (write %% for a %)`);
    const verb = format[j]!;
    if (!'sdfebxXo'.includes(verb)) throw fail(`unrecognized formatting clause "%${format.slice(i + 1, j + 1)}" at position ${i} (the clauses are ${VERBS})`);
    if (argIndex >= args.length) throw fail(`the clause "%${format.slice(i + 1, j + 1)}" at position ${i} has no argument (the list has ${args.length})`);
    const v = args[argIndex++];
    const given = () => celTypeName(v);
    switch (verb) {
      case 's':
        writeString(w, v, 0, stringLike);
        break;
      case 'd': {
        const s = typeof v === 'number' ? shortestFixed(v) : integerIn(v, 10);
        if (s === undefined) throw fail(`decimal clause can only be used on ints, uints, and doubles, was given ${given()}`);
        push(w, s);
        break;
      }
      case 'f':
      case 'e': {
        const x = asDouble(v);
        if (x === undefined) throw fail(`${verb === 'f' ? 'fixed-point' : 'scientific'} clause can only be used on ints, uints, and doubles, was given ${given()}`);
        push(w, verb === 'f' ? formatFixed(x, precision) : formatScientific(x, precision));
        break;
      }
      case 'b': {
        const s = typeof v === 'boolean' ? (v ? '1' : '0') : integerIn(v, 2);
        if (s === undefined) throw fail(`only ints, uints, and bools can be formatted as binary, was given ${given()}`);
        push(w, s);
        break;
      }
      case 'x':
      case 'X': {
        const upper = verb === 'X';
        let s = integerIn(v, 16);
        if (s !== undefined) s = upper ? s.toUpperCase() : s;
        else if (typeof v === 'string' || v instanceof Uint8Array) {
          // Two digits per byte (a string's UTF-8: up to 3 bytes per unit): one that cannot fit is refused before it is encoded.
          const bytes = typeof v === 'string' ? (w.out.length + 2 * v.length > w.limit ? undefined : textBytes(v)) : v;
          if (bytes === undefined || w.out.length + 2 * bytes.length > w.limit) throw tooLong();
          s = hexOf(bytes, upper);
        } else throw fail(`only ints, uints, bytes, and strings can be formatted as hex, was given ${given()}`);
        push(w, s);
        break;
      }
      case 'o': {
        const s = integerIn(v, 8);
        if (s === undefined) throw fail(`octal clause can only be used on ints and uints, was given ${given()}`);
        push(w, s);
        break;
      }
    }
    literalFrom = i = j + 1;
  }
  push(w, format.slice(literalFrom));
  return w.out;
}

/**
 * Registers `format(list)` on `string` and on each of `stringLike` (types that stand for their
 * string; `stringLikeText` gives it, also for elements formatted by `%s`).
 */
export function registerStringFormat(env: Environment, stringLike: readonly string[], stringLikeText: (v: unknown) => string | undefined): void {
  for (const t of ['string', ...stringLike]) {
    const text = t === 'string' ? (v: unknown) => v as string : (v: unknown) => String(v);
    env.registerFunction(`${t}.format(list): string`, (v: unknown, args: unknown) => {
      const items = listItems(args);
      if (items === undefined) throw fail(`needs a list, got ${celTypeName(args)}`);
      return formatString(text(v), items, stringLikeText);
    });
  }
}

/**
 * What the cost estimate (`cost.ts`) reads off a literal format string: how many clauses take an
 * argument, and their largest precision (`MAX_FORMAT_PRECISION` for none given: the default is
 * smaller, so any bound holds).
 */
export function formatClauses(format: string): { clauses: number; precision: number } {
  let clauses = 0;
  let precision = DEFAULT_PRECISION;
  for (let i = format.indexOf('%'); i >= 0; i = format.indexOf('%', i)) {
    if (format[i + 1] === '%') {
      i += 2;
      continue;
    }
    clauses++;
    const m = /^\.(\d+)/.exec(format.slice(i + 1, i + 9));
    if (m) precision = Math.max(precision, Math.min(MAX_FORMAT_PRECISION, Number(m[1])));
    i++;
  }
  return { clauses, precision };
}
