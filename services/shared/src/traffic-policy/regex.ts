/**
 * Regular expressions for CEL's `matches()` in traffic policies, run by RE2 (`re2js`): matching
 * takes time linear in the input whatever the pattern, so one tenant's pattern cannot stall the
 * shared ingress the way a backtracking JavaScript `RegExp` (`^(a+)+$`) would.
 *
 * Semantics are CEL's: RE2 syntax (no backreferences or lookaround; flags such as `(?i)`), and
 * an unanchored search — true when the pattern matches anywhere in the string (`^`/`$` anchor).
 */
import { RE2JS } from 're2js';

/** Longest pattern accepted, in UTF-16 code units. */
export const MAX_REGEX_PATTERN_LENGTH = 4096;
/**
 * Largest compiled program accepted (RE2's "program size": about one instruction per literal
 * character or class, `[a-z]{1,1000}` is 2,001). Worst-case matching time grows with it (a
 * pattern near this size that defeats RE2's DFA costs hundreds of milliseconds on 16 KB): a
 * saved policy's cost estimate (`cost.ts`) refuses such a pattern on request data unless its
 * DFA is small, so this cap bounds compilation and patterns computed at evaluation time.
 */
export const MAX_REGEX_PROGRAM_SIZE = 2500;
/**
 * Total program size of the literal patterns of one policy (checked when it is saved): bounds
 * the time to compile a policy and the memory its regexps may hold (RE2's lazy DFA keeps up to
 * ~8 MB of states per pattern that sees adversarial input).
 */
export const MAX_POLICY_REGEX_PROGRAM_SIZE = 10_000;
/**
 * Longest string `matches()` searches, in UTF-16 code units. RE2's time is linear in the input,
 * but the factor grows with the pattern (up to tens of ns per character and instruction when
 * its lazy DFA thrashes), so `cost.ts` charges each call for its longest possible string. The cap
 * is above any one string a request or response can carry (its head is at most 16 KB, and
 * `req.url` is scheme + host + path of that one head), so it never turns a deny rule on request
 * data into a skipped rule; it bounds strings a policy builds itself (`s + s + …`). A longer string
 * is an evaluation error ("string too long"): the rule does not apply, like any evaluation error
 * (the ingress counts and logs it).
 */
export const MAX_MATCH_INPUT = 32_768;
/** Distinct non-literal patterns kept compiled (each can hold a few MB of lazy-DFA states). */
export const REGEX_CACHE_SIZE = 128;

/** A pattern RE2 refuses or that exceeds the limits; `message` is one line. */
export class RegexError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'RegexError';
  }
}

/**
 * A cheap estimate (within a few instructions for the patterns tried) of the program size, before compiling: compiling expands
 * counted repetitions (`.{1000}` is 1,000 instructions), which takes time proportional to the
 * result, so a 4 KB pattern of `.{1000}`s would take seconds to compile just to be refused.
 * Counts above 1000 are clamped (RE2 refuses them while parsing, cheaply, with its own message).
 */
export function estimateProgramSize(p: string): number {
  // One frame per open group: the size so far and the size of the last atom (what a quantifier
  // that follows repeats).
  const stack: { size: number; last: number }[] = [{ size: 0, last: 0 }];
  let top = stack[0]!;
  const atom = (n: number) => {
    top.size += n;
    top.last = n;
  };
  let i = 0;
  while (i < p.length) {
    const c = p[i]!;
    if (c === '\\') {
      const n = p[i + 1];
      if (n === 'Q') {
        const end = p.indexOf('\\E', i + 2);
        const stop = end < 0 ? p.length : end;
        atom(stop - (i + 2));
        i = end < 0 ? p.length : end + 2;
        continue;
      }
      let j = i + 2;
      if ((n === 'p' || n === 'P' || n === 'x') && p[j] === '{') {
        const close = p.indexOf('}', j);
        j = close < 0 ? p.length : close + 1;
      }
      atom(1);
      i = j;
      continue;
    }
    if (c === '[') {
      // A class is one instruction; skip to its `]` (a `]` first in the class is literal).
      let j = i + 1;
      if (p[j] === '^') j++;
      if (p[j] === ']') j++;
      while (j < p.length && p[j] !== ']') {
        if (p[j] === '\\') j += 2;
        else if (p[j] === '[' && p[j + 1] === ':') {
          const close = p.indexOf(':]', j + 2);
          j = close < 0 ? j + 1 : close + 2;
        } else j++;
      }
      atom(1);
      i = j + 1;
      continue;
    }
    if (c === '(') {
      top = { size: 0, last: 0 };
      stack.push(top);
      i++;
      continue;
    }
    if (c === ')') {
      if (stack.length > 1) {
        const group = stack.pop()!;
        top = stack[stack.length - 1]!;
        atom(group.size + 2);
      }
      i++;
      continue;
    }
    if (c === '{') {
      const m = /^\{(\d+)(,(\d*))?\}/.exec(p.slice(i, i + 24));
      if (m) {
        const min = Math.min(Number(m[1]), 1001);
        const max = m[2] === undefined ? min : m[3] === '' ? min + 1 : Math.min(Number(m[3]), 1001);
        const whole = top.last * Math.max(min, 1) + (top.last + 1) * Math.max(max - min, 0);
        top.size += whole - top.last;
        top.last = whole;
        i += m[0].length;
        continue;
      }
      atom(1);
      i++;
      continue;
    }
    if (c === '*' || c === '+' || c === '?' || c === '|') {
      top.size += 1;
      i++;
      continue;
    }
    atom(1);
    i++;
  }
  let total = 0;
  for (const f of stack) total += f.size;
  return total;
}

const PERL_HINT = ' (RE2 syntax: no lookaround or backreferences)';

/** Compiles `pattern` with RE2 or throws `RegexError`. */
export function compileRegex(pattern: string): RE2JS {
  if (pattern.length > MAX_REGEX_PATTERN_LENGTH) throw new RegexError(`pattern too long (${pattern.length} characters, at most ${MAX_REGEX_PATTERN_LENGTH})`);
  if (estimateProgramSize(pattern) > 2 * MAX_REGEX_PROGRAM_SIZE) throw new RegexError(`pattern too large (more than ${MAX_REGEX_PROGRAM_SIZE} RE2 instructions)`);
  let re: RE2JS;
  try {
    re = RE2JS.compile(pattern);
  } catch (err) {
    const e = err as { message?: unknown };
    let msg = String(e.message ?? err).split('\n')[0]!.replace(/^error parsing regexp: /, '');
    if (/unsupported Perl syntax|invalid named capture: `\(\?<[=!]|invalid escape sequence: `\\[0-9]/.test(msg)) msg += PERL_HINT;
    throw new RegexError(`invalid RE2 pattern: ${msg}`);
  }
  const size = re.programSize();
  if (size > MAX_REGEX_PROGRAM_SIZE) throw new RegexError(`pattern too large (${size} RE2 instructions, at most ${MAX_REGEX_PROGRAM_SIZE})`);
  return re;
}

/**
 * CEL `matches`: does `re` match anywhere in `s`. Throws `RegexError` for a string over
 * `MAX_MATCH_INPUT` characters.
 */
export function regexSearch(re: RE2JS, s: string): boolean {
  if (s.length > MAX_MATCH_INPUT) throw new RegexError(`string too long to search (${s.length} characters, at most ${MAX_MATCH_INPUT})`);
  return re.test(s);
}

/** The parts of re2js's lazy DFA `dfaStateCount` drives (re2js 2.10, pinned). */
interface DfaInternals {
  failed: boolean;
  numClasses: number;
  classBounds: Int32Array;
  makeState(pcs: number[], flag: number, ids: number[]): object | null;
  step(state: object, cls: number, rune: number, anchor: number): object | null;
}

/** re2js internals read by `regexCostInfo` (absent in another version: the estimate assumes the worst). */
interface Re2Internals {
  onepass?: unknown;
  prefixComplete?: unknown;
  prog?: { start: number; numInst(): number };
  dfa?: DfaInternals;
}

/** `EMPTY_BEGIN_TEXT | EMPTY_BEGIN_LINE`: the context `test()` starts its search in. */
const BEGIN_TEXT_FLAGS = 4 | 1;
/** re2js `RE2Flags.UNANCHORED` and `ANCHOR_START` (a pattern starting with `^` runs anchored). */
const UNANCHORED = 0;
const ANCHOR_START = 1;
/** DFA memory re2js allows a pattern (8 MB); an explored DFA must fit in half of it. */
const DFA_CACHE_BYTES = 8 * 1024 * 1024;

/** A budget of DFA transitions `regexCostInfo` may explore (one per policy being checked). */
export interface DfaExploreBudget {
  steps: number;
}

/**
 * The number of states of `re`'s DFA, unanchored and anchored searches together, explored
 * breadth-first on a private DFA (one transition per state and character class), or
 * `undefined` when there are more than
 * fit comfortably in re2js's DFA cache, when the exploration budget runs out first, or when
 * re2js's internals are not the expected ones. A DFA that fits is built once per process and
 * never thrashes, so matching costs one table look-up per character whatever the pattern's size.
 */
function dfaStateCount(internals: Re2Internals, budget: DfaExploreBudget): number | undefined {
  try {
    const prog = internals.prog;
    const runtime = internals.dfa;
    if (!prog || !runtime || typeof runtime.step !== 'function' || typeof runtime.makeState !== 'function') return undefined;
    const dfa = new (runtime.constructor as new (p: unknown) => DfaInternals)(prog);
    if (dfa.failed || !(dfa.classBounds instanceof Int32Array)) return undefined;
    const classes = dfa.numClasses;
    // One state's bytes in re2js's accounting: the state, its instruction list and its table.
    const stateBytes = 150 + 8 * prog.numInst() + 48 + 8 * (classes + 1);
    const maxStates = Math.floor(DFA_CACHE_BYTES / 2 / stateBytes);
    let total = 0;
    for (const anchor of [UNANCHORED, ANCHOR_START]) {
      const start = dfa.makeState([prog.start], BEGIN_TEXT_FLAGS, []);
      if (!start) return undefined;
      const seen = new Set<object>([start]);
      const queue = [start];
      for (let i = 0; i < queue.length; i++) {
        for (let cls = 0; cls < classes; cls++) {
          if (--budget.steps < 0) return undefined;
          const rune = cls === 0 ? 0 : dfa.classBounds[cls - 1]!;
          const next = dfa.step(queue[i]!, cls, rune, anchor);
          if (!next) return undefined;
          if (seen.has(next)) continue;
          if (total + seen.size >= maxStates) return undefined;
          seen.add(next);
          queue.push(next);
        }
      }
      total += seen.size;
    }
    return total;
  } catch {
    return undefined;
  }
}

/** How a literal pattern runs, for the cost estimate (`cost.ts`). */
export interface RegexRunInfo {
  programSize: number;
  /** Constant work per character whatever the size: a one-pass program, or a plain string. */
  linear: boolean;
  /** The number of states of its DFA, when they all fit the cache (see `dfaStateCount`). */
  dfaStates?: number;
}

/**
 * How `re` runs, for the cost estimate (`cost.ts`): its program size, whether it runs in
 * constant work per character (one-pass, or a plain string RE2 searches as such), and for a
 * larger program whether its whole DFA fits the cache (explored within `budget`).
 */
export function regexCostInfo(re: RE2JS, budget: DfaExploreBudget, smallProgram: number): RegexRunInfo {
  const internals = (re as unknown as { re2Input?: Re2Internals }).re2Input;
  const programSize = re.programSize();
  const linear = internals !== undefined && (internals.prefixComplete === true || (internals.onepass !== null && internals.onepass !== undefined));
  if (linear || programSize <= smallProgram || !internals) return { programSize, linear };
  return { programSize, linear, dfaStates: dfaStateCount(internals, budget) };
}

/** Compiled (or refused, as the message) non-literal patterns, least recently used first. */
const cache = new Map<string, RE2JS | string>();

/**
 * `compileRegex` for a pattern known only at evaluation time, through a bounded LRU cache so a
 * pattern read from each request is not recompiled every time. Refusals are cached too.
 */
export function cachedRegex(pattern: string): RE2JS {
  let hit = cache.get(pattern);
  if (hit !== undefined) {
    cache.delete(pattern);
    cache.set(pattern, hit);
  } else {
    if (pattern.length > MAX_REGEX_PATTERN_LENGTH) return compileRegex(pattern); // throws; not worth a slot
    try {
      hit = compileRegex(pattern);
    } catch (err) {
      if (!(err instanceof RegexError)) throw err;
      hit = err.message;
    }
    if (cache.size >= REGEX_CACHE_SIZE) cache.delete(cache.keys().next().value!);
    cache.set(pattern, hit);
  }
  if (typeof hit === 'string') throw new RegexError(hit);
  return hit;
}

/** For tests. */
export function regexCacheSize(): number {
  return cache.size;
}
