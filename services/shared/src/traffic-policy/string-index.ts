/**
 * `s.indexOf(sub[, offset])`, `s.lastIndexOf(sub[, offset])` and `s.substring(start[, end])` as
 * cel-go's strings extension (ngrok's engine) computes them: on code points (Go's `[]rune`),
 * not on UTF-16 units as the CEL library's built-ins count (`'😀abc'.indexOf('a')` is 1, not 2;
 * `'😀abc'.substring(1, 2)` is `'a'`, not half of the emoji). `size()` counts code points too
 * (`codePoints`), so the indices agree with it.
 *
 * The semantics are cel-go's (ext/strings.go, after cel-go#1051 and cel-go#1173):
 * - `indexOf(sub, offset)`: an empty `sub` gives `offset` as it is; a negative `offset` is an
 *   evaluation error (`index out of range: -1`); an `offset` at or past the end gives -1.
 *   `indexOf(sub)` is `indexOf(sub, 0)`, so `''.indexOf('a')` is -1.
 * - `lastIndexOf(sub, offset)`: the last occurrence starting at or before `offset`; an empty
 *   `sub` gives `offset` as it is, a negative `offset` is an error, one at or past the end
 *   gives -1. `lastIndexOf(sub)`: the string's size for an empty `sub`, -1 on an empty string,
 *   else `lastIndexOf(sub, size - 1)`.
 * - `substring(start)`: `start` from 0 to the size included, else an error;
 *   `substring(start, end)`: `start > end` is an error (`invalid substring range`), as is
 *   either past the size or negative.
 * - Go reads a byte in no UTF-8 sequence as U+FFFD (one rune each): a lone surrogate (how a header
 *   holds such a byte, `headerText`) is one code point, compares as U+FFFD, and `substring()`
 *   writes it as U+FFFD.
 *
 * A string without surrogates (nearly every one: ASCII and the rest of the BMP) has as many
 * code points as UTF-16 units: the native search and slice, one regexp test per string. Only a
 * string with a character past U+FFFF (or a lone surrogate) walks its units to convert indices.
 *
 * The library finds methods by name and argument count, and refuses a second `string.indexOf`
 * overload, so each is taken over as a macro (as `matches()` is in `cel.ts`): declared on another
 * receiver type, it expands every `x.indexOf(y)` call and type-checks the operands itself (a
 * string or one of `stringLike`, then a string and an int). Their costs are in `cost.ts`.
 */
import type { Environment } from '@marcbachmann/cel-js';
import { evalError } from './cel-values.js';
import type { CheckedType, MacroCall, MacroChecker, MacroEvaluator } from './macro-hooks.js';

const SURROGATE = /[\ud800-\udfff]/;

/**
 * `s` (which has surrogates) as Go's `[]rune` reads it: each lone surrogate (a byte in no UTF-8
 * sequence) as U+FFFD; and its code points. One pass over its units.
 */
function runes(s: string): { t: string; size: number } {
  let units: Uint16Array | undefined;
  let pairs = 0;
  const n = s.length;
  for (let i = 0; i < n; i++) {
    const c = s.charCodeAt(i);
    if (c < 0xd800 || c > 0xdfff) continue;
    if (c <= 0xdbff && i + 1 < n) {
      const d = s.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) {
        pairs++;
        i++;
        continue;
      }
    }
    if (!units) {
      units = new Uint16Array(n);
      for (let k = 0; k < n; k++) units[k] = s.charCodeAt(k);
    }
    units[i] = 0xfffd;
  }
  return { t: units ? Buffer.from(units.buffer, units.byteOffset, units.byteLength).toString('utf16le') : s, size: n - pairs };
}

/** `s` as Go's `[]rune` reads it (see `runes`). */
const runeText = (s: string): string => (SURROGATE.test(s) ? runes(s).t : s);

/** Index of the UTF-16 unit where code point `cp` starts in `s` (no lone surrogates), `s.length` at the end. */
function unitIndex(s: string, cp: number): number {
  let i = 0;
  for (let k = 0; k < cp && i < s.length; k++) {
    const c = s.charCodeAt(i);
    i += c >= 0xd800 && c <= 0xdbff ? 2 : 1;
  }
  return i;
}

/** Code points before unit `unit` of `s` (no lone surrogates; `unit` at a code point's start). */
function codePointIndex(s: string, unit: number): number {
  let pairs = 0;
  for (let i = 0; i < unit; i++) {
    const c = s.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff) {
      pairs++;
      i++;
    }
  }
  return unit - pairs;
}

const outOfRange = (fn: string, i: bigint) => evalError('index_out_of_range', `${fn}: index out of range: ${i}`);

/** `s.indexOf(sub[, offset])`: cel-go's, in code points. */
export function indexOf(s: string, sub: string, offset?: bigint): bigint {
  if (sub === '') return offset ?? 0n;
  const off = offset ?? 0n;
  if (off < 0n) throw outOfRange('indexOf()', off);
  const needle = runeText(sub);
  if (!SURROGATE.test(s)) {
    if (off >= BigInt(s.length)) return -1n;
    return BigInt(s.indexOf(needle, Number(off)));
  }
  const { t, size } = runes(s);
  if (off >= BigInt(size)) return -1n;
  const i = t.indexOf(needle, unitIndex(t, Number(off)));
  return i < 0 ? -1n : BigInt(codePointIndex(t, i));
}

/** `s.lastIndexOf(sub[, offset])`: cel-go's, in code points. */
export function lastIndexOf(s: string, sub: string, offset?: bigint): bigint {
  const fast = !SURROGATE.test(s);
  const { t, size } = fast ? { t: s, size: s.length } : runes(s);
  if (sub === '') return offset ?? BigInt(size);
  // Without an offset: from the last code point (none in an empty string: -1).
  if (offset === undefined && size === 0) return -1n;
  const off = offset ?? BigInt(size - 1);
  if (off < 0n) throw outOfRange('lastIndexOf()', off);
  if (off >= BigInt(size)) return -1n;
  const needle = runeText(sub);
  // The last start at or before `off` (JavaScript's lastIndexOf clamps a start past the end).
  if (fast) return BigInt(t.lastIndexOf(needle, Number(off)));
  const i = t.lastIndexOf(needle, unitIndex(t, Number(off)));
  return i < 0 ? -1n : BigInt(codePointIndex(t, i));
}

/** `s.substring(start[, end])`: cel-go's, in code points. */
export function substring(s: string, start: bigint, end?: bigint): string {
  const fast = !SURROGATE.test(s);
  const r = fast ? { t: s, size: s.length } : runes(s);
  const t = r.t;
  const size = BigInt(r.size);
  if (end !== undefined && start > end) throw evalError('index_out_of_range', `substring(): invalid substring range. start: ${start}, end: ${end}`);
  if (start < 0n || start > size) throw outOfRange('substring()', start);
  if (end !== undefined && (end < 0n || end > size)) throw outOfRange('substring()', end);
  if (fast) return end === undefined ? t.slice(Number(start)) : t.slice(Number(start), Number(end));
  const from = unitIndex(t, Number(start));
  return end === undefined ? t.slice(from) : t.slice(from, unitIndex(t, Number(end)));
}


/** The methods taken over, with what each argument must be. */
const METHODS = {
  indexOf: { args: [['string'], ['string', 'int']], result: 'int' },
  lastIndexOf: { args: [['string'], ['string', 'int']], result: 'int' },
  substring: { args: [['int'], ['int', 'int']], result: 'string' },
} as const;
type Method = keyof typeof METHODS;

/** The CEL type name of a runtime argument (for messages). */
const argTypeName = (v: unknown) => (v === null ? 'null' : typeof v === 'bigint' ? 'int' : typeof v === 'string' ? 'string' : typeof v === 'number' ? 'double' : typeof v);

function codePointMacro(method: Method, params: readonly ('string' | 'int')[], stringLike: readonly string[], stringLikeText: (v: unknown) => string | undefined) {
  return ({ ast, args, receiver }: MacroCall) => ({
    typeCheck(checker: MacroChecker, _macro: unknown, ctx: unknown) {
      const rt = checker.check(receiver, ctx);
      const ats = args.map((a) => checker.check(a, ctx));
      // A `dyn` (or a type parameter) is checked when evaluated.
      const open = (t: CheckedType) => t.kind === 'dyn' || t.kind === 'param';
      const receiverOk = open(rt) || rt.name === 'string' || stringLike.includes(rt.name);
      if (!receiverOk || ats.some((t, i) => !open(t) && t.name !== params[i])) {
        throw checker.createError('no_matching_overload', `found no matching overload for '${rt.name}.${method}(${ats.map((t) => t.name).join(', ')})'`, ast);
      }
      return METHODS[method].result === 'int' ? checker.intType : checker.stringType;
    },
    evaluate(ev: MacroEvaluator, _macro: unknown, ctx: unknown): bigint | string {
      const r = ev.run(receiver, ctx);
      const s = typeof r === 'string' ? r : stringLikeText(r);
      const xs = args.map((a) => ev.run(a, ctx));
      if (s === undefined || xs.some((x, i) => (params[i] === 'int' ? typeof x !== 'bigint' : typeof x !== 'string'))) {
        throw ev.createError('no_matching_overload', `found no matching overload for '${argTypeName(r)}.${method}(${xs.map(argTypeName).join(', ')})'`, ast);
      }
      switch (method) {
        case 'indexOf':
          return indexOf(s, xs[0] as string, xs[1] as bigint | undefined);
        case 'lastIndexOf':
          return lastIndexOf(s, xs[0] as string, xs[1] as bigint | undefined);
        case 'substring':
          return substring(s, xs[0] as bigint, xs[1] as bigint | undefined);
      }
    },
  });
}

/** The methods' names (the cost estimate reads these calls as the library's string methods). */
export const CODE_POINT_METHODS: ReadonlySet<string> = new Set(Object.keys(METHODS));

/**
 * Registers `indexOf`, `lastIndexOf` and `substring` (each with one and two arguments) as macros
 * on `receiverType`, a registered type that is not `string` nor `dyn` (the library refuses an
 * overload that overlaps the built-in one); they apply to strings and `stringLike` values.
 */
export function registerCodePointStringMethods(env: Environment, receiverType: string, stringLike: readonly string[], stringLikeText: (v: unknown) => string | undefined): void {
  for (const method of Object.keys(METHODS) as Method[]) {
    for (const params of METHODS[method].args) {
      const sig = `${receiverType}.${method}(${params.map(() => 'ast').join(', ')}): ${METHODS[method].result}`;
      env.registerFunction(sig, codePointMacro(method, params, stringLike, stringLikeText) as never);
    }
  }
}
