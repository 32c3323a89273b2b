/**
 * User agent filter patterns (`user_agent_filter` `allow` and `deny`). ngrok documents them as
 * RE2 regular expressions (Go's regexp): Warren compiles and runs them with RE2 (`re2js`, the
 * engine of the traffic policy's `matches()`, `traffic-policy/regex.ts`). So the syntax is RE2's
 * (flags such as `(?i)`, also inside a pattern as in `foo(?i)bar`; no lookaround, no
 * backreferences), a pattern matches anywhere in the User-Agent (Go's `MatchString`; `^` and `$`
 * anchor), and matching never backtracks: `(a|a)*$` is harmless.
 *
 * One pass per list. ngrok's rules only ask whether any allow pattern matches, then whether any
 * deny pattern does, so each list is compiled (when a config arrives) into a single RE2 program,
 * the alternation of its patterns (`compileUserAgentList`): one scan of the header per list,
 * whatever the number of patterns (pattern by pattern, 64 patterns cost ~6–12 ms of CPU per
 * 16 KiB User-Agent; as two programs, ~0.2–0.4 ms). Each pattern is wrapped in its own group,
 * `(?:p)`, which keeps it whole: RE2 scopes flags set inside a group to that group
 * (`(?:(?i)a)|(?:b)` does not match `B`), `^` and `$` anchor each alternative as they anchored
 * the pattern, and the text of one pattern cannot reach into the next (an unterminated `\Q` is
 * closed with `\E`; a named group loses its name, since two patterns may use the same one). A
 * list mixing patterns of wide Unicode classes (`\pL`) with others is two programs
 * (`WIDE_PATTERN_CLASSES`).
 *
 * Linear is not yet cheap: RE2 runs a lazy DFA, and a program whose DFA has many states
 * (`a[ab]{20}[^ab]`: about 2^20) makes it build a state for nearly every character, or fall back
 * to its NFA, at some 5–15 µs per character: 100–250 ms on a User-Agent of 16 KiB (the most
 * Node accepts in a request head), on a process every tenant shares. So a filter is accepted
 * only when each list's programs run in constant work per character
 * (`userAgentFilterCostProblems`): a literal or one-pass program, or one whose whole DFA is
 * small enough to be built once (`exploreUserAgentDfa`, when the filter is saved, within a
 * budget per list). The ingress then matches the whole header: a table look-up per character
 * and per program once the DFA is built, and building it never costs more than the exploration
 * did (once per list and process: the ingress keeps a list's programs while configs leave it
 * unchanged).
 */
import { RE2JS } from 're2js';
import { compileRegex, regexCostInfo, RegexError } from './traffic-policy/regex.js';

/** Most patterns in each of `allow` and `deny`. */
export const MAX_USER_AGENT_PATTERNS = 32;
/** Longest pattern, in bytes of UTF-8. */
export const MAX_USER_AGENT_PATTERN_BYTES = 256;
/**
 * Largest program of a list, its programs together (RE2 instructions; a pattern alone may have
 * up to `MAX_REGEX_PROGRAM_SIZE`, 2,500). 32 case-insensitive patterns of 250 characters come to
 * about 8,000. Bounds the time to compile a list.
 */
export const MAX_USER_AGENT_LIST_PROGRAM_SIZE = 10_000;
/**
 * What exploring a list's DFAs may spend (`exploreUserAgentDfa`), per list: DFA transitions, and
 * NFA states stepped through to compute them (~50–150 ns each, so ~0.2–0.5 s at most per list).
 * This is the work of saving a filter, and a bound on what building the DFAs costs the ingress,
 * once per list and process (it computes each transition at most once, as the exploration
 * did). 32 bot names (`(?i)googlebot`, …) take ~17,000 transitions and 1,000,000 NFA steps; 32
 * names with a version (`Googlebot/2\.1; `) ~32,000 and 1,900,000; 4 alternations of 20 bot
 * names (250 bytes each) ~12,000 and 1,900,000. 32 literals of 30 characters or more, or 8 such
 * alternations, take more and are refused.
 */
export const USER_AGENT_FILTER_EXPLORE_STEPS = 100_000;
export const USER_AGENT_FILTER_EXPLORE_WORK = 3_000_000;

/** The RE2 program a pattern stands for, or the reason it is refused (one line). */
export function compileUserAgentPattern(pattern: string): RE2JS | string {
  try {
    return compileRegex(pattern);
  } catch (err) {
    if (err instanceof RegexError) return err.message;
    throw err;
  }
}

/** `undefined` when the pattern compiles under RE2, else the reason (e.g. `invalid RE2 pattern: missing closing ): …`). */
export function checkUserAgentPattern(pattern: string): string | undefined {
  const r = compileUserAgentPattern(pattern);
  return typeof r === 'string' ? r : undefined;
}

/** `(?P<name>` or `(?<name>`: a named group (lookbehind, `(?<=`, does not compile). */
const NAMED_GROUP = /\(\?P?<[^>]*>/y;

/**
 * The index just past the `]` closing the class that opens at `p[i]`, as RE2 parses it: a `]`
 * right after `[` or `[^` is a literal, `[:alpha:]` is one item, `\` escapes one character (the
 * rest of `\p{…}` or `\x{…}` holds no `]`).
 */
function classEnd(p: string, i: number): number {
  let j = i + 1;
  if (p[j] === '^') j++;
  let first = true;
  while (j < p.length && (p[j] !== ']' || first)) {
    first = false;
    if (p[j] === '[' && p[j + 1] === ':') {
      const close = p.indexOf(':]', j + 2);
      if (close >= 0) {
        j = close + 2;
        continue;
      }
    }
    j += p[j] === '\\' ? 2 : 1;
  }
  return j + 1;
}

/**
 * A pattern that compiles under RE2 as one alternative of its list's combined program:
 * `(?:pattern)`, with an unterminated `\Q` closed (it would swallow the `)`) and named groups
 * made plain capturing groups (two patterns may use the same name). Its RE2 program is the
 * pattern's own (`compileUserAgentList` checks it when it had to change the text).
 */
export function userAgentAlternative(pattern: string): string {
  let out = '';
  let i = 0;
  while (i < pattern.length) {
    const c = pattern[i]!;
    if (c === '\\' && pattern[i + 1] === 'Q') {
      const end = pattern.indexOf('\\E', i + 2);
      if (end < 0) return `(?:${out}${pattern.slice(i)}\\E)`;
      out += pattern.slice(i, end + 2);
      i = end + 2;
    } else if (c === '\\') {
      out += pattern.slice(i, i + 2);
      i += 2;
    } else if (c === '[') {
      const j = classEnd(pattern, i);
      out += pattern.slice(i, j);
      i = j;
    } else {
      NAMED_GROUP.lastIndex = i;
      const named = c === '(' ? NAMED_GROUP.exec(pattern) : null;
      out += named ? '(' : c;
      i += named ? named[0].length : 1;
    }
  }
  return `(?:${out})`;
}

/** re2js's internals read here (re2js 2.10, pinned; absent in another version). */
interface PatternInternals {
  prog?: { toString(): string };
  dfa?: { numClasses?: unknown };
}
const internalsOf = (re: RE2JS) => (re as unknown as { re2Input?: PatternInternals }).re2Input;

/** re2js's compiled program as text, to compare two patterns' programs. */
function programText(re: RE2JS): string {
  const prog = internalsOf(re)?.prog;
  return prog ? prog.toString() : String(re.programSize());
}

/**
 * The character classes a pattern's DFA tells apart (its alphabet; 0 if unknown): 2–100 for
 * ASCII patterns, case-insensitive ones included; ~1,400 for `\pL`.
 */
function dfaClasses(re: RE2JS): number {
  try {
    const n = internalsOf(re)?.dfa?.numClasses;
    return typeof n === 'number' ? n : 0;
  } catch {
    return 0;
  }
}

/**
 * Patterns with more DFA character classes than this (Unicode classes such as `\pL`, `\p{Han}`)
 * are combined apart from the others. A combined program's DFA has the union of its patterns'
 * classes and, roughly, the product of their states: a `\pL` pattern among a dozen ASCII ones
 * would give each of their states ~1,400 transitions (500,000 in all, too many to build), while
 * alone it has a handful of states.
 */
export const WIDE_PATTERN_CLASSES = 256;

/**
 * A list's programs, or the reason it is refused: a pattern that does not compile (`index`),
 * one whose alternative would not be the same program (a safety net that no RE2 pattern is known
 * to trip), or programs over `MAX_USER_AGENT_LIST_PROGRAM_SIZE` in all. Usually one program, the
 * alternation `(?:p1)|(?:p2)|…` of the patterns (`userAgentAlternative`), in order; two when
 * the list has patterns with wide Unicode classes (`WIDE_PATTERN_CLASSES`): the others, then
 * these. `[]` for an empty list. A User-Agent matches the list when it matches one of them.
 */
export function compileUserAgentList(patterns: readonly string[]): RE2JS[] | { index?: number; message: string } {
  const narrow: string[] = [];
  const wide: string[] = [];
  for (const [index, pattern] of patterns.entries()) {
    const re = compileUserAgentPattern(pattern);
    if (typeof re === 'string') return { index, message: re };
    const alt = userAgentAlternative(pattern);
    if (alt !== `(?:${pattern})`) {
      let same = false;
      try {
        same = programText(RE2JS.compile(alt)) === programText(re);
      } catch {
        // same stays false
      }
      if (!same) return { index, message: 'cannot be combined with the other patterns of its list (RE2 reads it differently inside a group): rewrite it' };
    }
    (dfaClasses(re) > WIDE_PATTERN_CLASSES ? wide : narrow).push(alt);
  }
  const programs: RE2JS[] = [];
  let size = 0;
  for (const group of [narrow, wide]) {
    if (group.length === 0) continue;
    try {
      programs.push(RE2JS.compile(group.join('|')));
    } catch (err) {
      // Not expected: every alternative compiles alone and is a group.
      return { message: `the patterns do not compile together: ${String((err as Error).message).split('\n')[0]}` };
    }
    size += programs.at(-1)!.programSize();
  }
  if (size > MAX_USER_AGENT_LIST_PROGRAM_SIZE) {
    return { message: `the patterns are too large together (${size} RE2 instructions, at most ${MAX_USER_AGENT_LIST_PROGRAM_SIZE}): shorten or remove some` };
  }
  return programs;
}

/** A filter refused for its matching cost: a whole list (`index` undefined), or one pattern of it. */
export interface UserAgentPatternProblem {
  list: 'allow' | 'deny';
  index?: number;
  message: string;
}

/** What exploring a list's DFA may spend (`exploreUserAgentDfa`); both are counted down. */
export interface UserAgentExploreBudget {
  /** DFA transitions computed. */
  steps: number;
  /** NFA states stepped through to compute them (a transition costs ~50–200 ns per NFA state). */
  work: number;
}

/** The parts of re2js's lazy DFA the exploration drives (re2js 2.10, pinned; as `regexCostInfo`). */
interface DfaState {
  nfaStates: readonly number[];
}
interface Dfa {
  failed: boolean;
  numClasses: number;
  classBounds: Int32Array;
  memBudget: number;
  makeState(pcs: number[], flag: number, ids: number[]): DfaState | null;
  step(state: DfaState, cls: number, rune: number, anchor: number): DfaState | null;
}
interface Re2Internals {
  prog?: { start: number };
  dfa?: Dfa;
}

/** `EMPTY_BEGIN_TEXT | EMPTY_BEGIN_LINE`: where `test()` starts its search; re2js `UNANCHORED`; its end-of-text rune. */
const BEGIN_TEXT_FLAGS = 4 | 1;
const UNANCHORED = 0;
const END_TEXT = -1;
/**
 * DFA memory the exploration allows a list, in re2js's own accounting: half of what re2js gives
 * each program (8 MB) before it drops its states and starts over (or falls back to its NFA).
 */
const DFA_EXPLORE_MEMORY = 4 * 1024 * 1024;

/**
 * Explores the DFA of `re` as the ingress runs it (`test()`: an unanchored search from the start
 * of the text), breadth-first on a private copy: every transition from every reachable state,
 * and each state's end of text. `cheap` when the whole DFA fits in `DFA_EXPLORE_MEMORY` (then
 * the ingress builds it once, each transition at most once, and afterwards matches with one
 * table look-up per character), `large` when it does not (or re2js is not the expected
 * version), `budget` when `budget` ran out first.
 *
 * The memory is counted as re2js counts it, state by state, rather than bounded by the
 * program's size as `regexCostInfo` does for the traffic policy (a state holding at most every
 * instruction): right for one pattern, but a combined list has many instructions and states
 * that each hold few of them, and that bound would refuse 32 plain 15-character literals. The
 * work is counted too (the NFA states each transition steps through): a list's states all hold
 * the start of every pattern, so a transition of a long list costs more than one of a pattern.
 */
export function exploreUserAgentDfa(re: RE2JS, budget: UserAgentExploreBudget): 'cheap' | 'large' | 'budget' {
  if (regexCostInfo(re, { steps: 0 }, 0).linear) return 'cheap';
  try {
    const internals = (re as unknown as { re2Input?: Re2Internals }).re2Input;
    const prog = internals?.prog;
    const runtime = internals?.dfa;
    if (!prog || !runtime || typeof runtime.step !== 'function' || typeof runtime.makeState !== 'function') return 'large';
    const dfa = new (runtime.constructor as new (p: unknown, maxMem: number) => Dfa)(prog, DFA_EXPLORE_MEMORY);
    if (dfa.failed || !(dfa.classBounds instanceof Int32Array) || typeof dfa.memBudget !== 'number') return 'large';
    const classes = dfa.numClasses;
    const start = dfa.makeState([prog.start], BEGIN_TEXT_FLAGS, []);
    if (!start) return 'large';
    const seen = new Set<DfaState>([start]);
    const queue = [start];
    for (let i = 0; i < queue.length; i++) {
      const state = queue[i]!;
      for (let cls = 0; cls <= classes; cls++) {
        budget.work -= state.nfaStates.length;
        if (--budget.steps < 0 || budget.work < 0) return 'budget';
        const end = cls === classes;
        const next = dfa.step(state, cls, end ? END_TEXT : cls === 0 ? 0 : dfa.classBounds[cls - 1]!, UNANCHORED);
        if (!next) return 'large';
        if (end || seen.has(next)) continue;
        seen.add(next);
        queue.push(next);
      }
    }
    return 'cheap';
  } catch {
    return 'large';
  }
}

const TOO_COSTLY =
  'too costly to match: its RE2 automaton (DFA) is too large to be built once, so matching it could cost microseconds per character of every User-Agent (e.g. a counted repetition of a wide class, as in a[ab]{20}b); simplify it';

/**
 * Why the filter's lists cannot be matched in constant work per character, list by list (see
 * the top of this file): each list's programs (`compileUserAgentList`, as the ingress runs
 * them) are explored (`exploreUserAgentDfa`) within the list's budget
 * (`USER_AGENT_FILTER_EXPLORE_STEPS`, `USER_AGENT_FILTER_EXPLORE_WORK`). This subsumes checking
 * each pattern alone, since the ingress runs only these programs, and a program's DFA has, in
 * effect, the states and character classes of each of its patterns' DFAs. When a list is refused, its patterns are explored one by one (within a third of
 * such a budget) to name one too costly even alone; otherwise the problem names the list. A list
 * with a pattern that does not compile is skipped (`checkUserAgentPattern` reports it).
 * Each list is checked on its own (`userAgentListCostProblem`), allow first.
 */
export function userAgentFilterCostProblems(allow: readonly string[], deny: readonly string[]): UserAgentPatternProblem[] {
  const problems: UserAgentPatternProblem[] = [];
  for (const [list, patterns] of [['allow', allow], ['deny', deny]] as const) {
    const problem = userAgentListCostProblem(list, patterns);
    if (problem) problems.push(problem);
  }
  return problems;
}

/**
 * The cost problem of one list of a filter (`userAgentFilterCostProblems`), or `undefined` when
 * it can be matched in constant work per character (or has a pattern that does not compile).
 * Takes up to ~0.2–0.5 s of CPU for a list built to be costly (more on a busy machine); the
 * control plane runs it in a worker thread (control-plane `user-agent-check.ts`).
 */
export function userAgentListCostProblem(list: 'allow' | 'deny', patterns: readonly string[]): UserAgentPatternProblem | undefined {
  if (patterns.some((p) => checkUserAgentPattern(p) !== undefined)) return undefined;
  const programs = compileUserAgentList(patterns);
  if (!Array.isArray(programs)) return { list, index: programs.index, message: programs.message };
  const spent: UserAgentExploreBudget = { steps: USER_AGENT_FILTER_EXPLORE_STEPS, work: USER_AGENT_FILTER_EXPLORE_WORK };
  let verdict: 'cheap' | 'large' | 'budget' = 'cheap';
  for (const re of programs) if (verdict === 'cheap') verdict = exploreUserAgentDfa(re, spent);
  if (verdict === 'cheap') return undefined;
  // Enough to find a pattern whose DFA outgrows the memory alone (a[ab]{20}b: ~300,000 steps).
  const alone = { steps: USER_AGENT_FILTER_EXPLORE_STEPS, work: USER_AGENT_FILTER_EXPLORE_WORK / 3 };
  const culprit = patterns.findIndex((p) => alone.steps > 0 && alone.work > 0 && exploreUserAgentDfa(compileUserAgentPattern(p) as RE2JS, alone) === 'large');
  const what = verdict === 'budget' ? `would take more than ${USER_AGENT_FILTER_EXPLORE_STEPS} transitions or ${USER_AGENT_FILTER_EXPLORE_WORK} steps of RE2's NFA to build` : `would not fit in ${DFA_EXPLORE_MEMORY / 1024 / 1024} MB`;
  return culprit >= 0
    ? { list, index: culprit, message: TOO_COSTLY }
    : {
        list,
        message: `the ${patterns.length} ${list} patterns are too costly to match together: each list is matched in one pass, as one RE2 program, and its automaton (DFA) ${what}; remove some patterns, merge similar ones or make them simpler`,
      };
}

/**
 * Whether the list's programs are all explored, and found cheap, within `budget` (counted down
 * as in `exploreUserAgentDfa`). `true` means `userAgentListCostProblem` accepts the list too:
 * the exploration is deterministic, and a larger budget only lets it run longer. `false` decides
 * nothing (the list may need more of its budget, or be refused). Lets a caller accept a small
 * list at a cost bounded by a budget of its choice, and leave the others to the full check.
 */
export function userAgentListCheapWithin(patterns: readonly string[], budget: UserAgentExploreBudget): boolean {
  if (patterns.length === 0) return true;
  const programs = compileUserAgentList(patterns);
  if (!Array.isArray(programs)) return false;
  for (const re of programs) if (exploreUserAgentDfa(re, budget) !== 'cheap') return false;
  return true;
}
