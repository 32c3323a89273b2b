import { describe, expect, it } from 'vitest';
import { RE2JS } from 're2js';
import {
  checkUserAgentPattern,
  compileUserAgentList,
  compileUserAgentPattern,
  exploreUserAgentDfa,
  userAgentAlternative,
  userAgentFilterCostProblems,
  userAgentListCheapWithin,
  userAgentListCostProblem,
  USER_AGENT_FILTER_EXPLORE_STEPS,
  USER_AGENT_FILTER_EXPLORE_WORK,
} from './user-agent.js';
import { regexCostInfo } from './traffic-policy/regex.js';

/** A list's programs; throws if it is refused. */
function programs(patterns: string[]): RE2JS[] {
  const r = compileUserAgentList(patterns);
  if (!Array.isArray(r)) throw new Error(r.message);
  return r;
}
/** Whether `ua` matches the list (any of its programs). */
const matches = (patterns: string[], ua: string) => programs(patterns).some((re) => re.test(ua));
/** re2js's program, as text. */
const progText = (re: RE2JS) => String((re as unknown as { re2Input: { prog: unknown } }).re2Input.prog);

describe('user agent patterns', () => {
  it('compile under RE2: flags, inline flags, and patterns a backtracking engine would choke on', () => {
    for (const ok of ['(?i)curl/.*', 'foo(?i)bar', '(?s)a.b', '^$', '(ab){2,3}', '(?i)(bad|evil)bot', 'Mozilla/5\\.0 .*', '(a|a)*$', '(a+)+$', '(\\w*x)*', '\\pL']) {
      expect(checkUserAgentPattern(ok), ok).toBeUndefined();
    }
  });

  it('refuse what RE2 refuses, with its error', () => {
    expect(checkUserAgentPattern('(unclosed')).toMatch(/^invalid RE2 pattern: missing closing \)/);
    expect(checkUserAgentPattern('bot(?=x)')).toMatch(/RE2 syntax: no lookaround or backreferences/);
    expect(checkUserAgentPattern('(?<!x)bot')).toMatch(/invalid RE2 pattern/);
    expect(checkUserAgentPattern('(a)\\1')).toMatch(/invalid escape sequence/);
    expect(checkUserAgentPattern('x{1001}')).toMatch(/invalid repeat count/);
  });

  it('match anywhere with RE2 semantics, in linear time', () => {
    const re = (p: string) => {
      const r = compileUserAgentPattern(p);
      if (typeof r === 'string') throw new Error(r);
      return r;
    };
    expect(re('foo(?i)bar').test('xx fooBaR')).toBe(true);
    expect(re('foo(?i)bar').test('FOObar')).toBe(false);
    expect(re('^$').test('')).toBe(true);
    expect(re('^$').test('a')).toBe(false);
    const t0 = performance.now();
    expect(re('^(a|a)*$').test(`${'a'.repeat(40)}!`)).toBe(false);
    expect(re('(a+)+$').test(`${'a'.repeat(16_000)}!`)).toBe(false);
    expect(re('(a+)+$').test(`!${'a'.repeat(16_000)}`)).toBe(true);
    expect(performance.now() - t0).toBeLessThan(2000); // a JavaScript RegExp: hours
  });

  it('a filter is refused when a list cannot be matched in constant work per character', () => {
    expect(userAgentFilterCostProblems(['(?i)google-images', '^$', 'curl/'], ['(?i)google', '[Bb]ing', '(a|a)*$', '(?i)^mozilla/5\\.0 \\(compatible; (googlebot|bingbot)/2\\.[01]'])).toEqual([]);
    // Each is linear, but its DFA has ~2^20 states: RE2 would build one for nearly every character.
    // The list is refused as a whole; the first pattern too costly even alone is named.
    expect(userAgentFilterCostProblems(['ok'], ['x', 'a[ab]{20}b', 'a.{20}b'])).toEqual([{ list: 'deny', index: 1, message: expect.stringMatching(/too costly to match/) }]);
    expect(userAgentFilterCostProblems(['a[ab]{20}b'], ['a.{20}b'])).toEqual([
      { list: 'allow', index: 0, message: expect.stringMatching(/too costly to match/) },
      { list: 'deny', index: 0, message: expect.stringMatching(/too costly to match/) },
    ]);
    // Patterns that do not compile are left to checkUserAgentPattern.
    expect(userAgentFilterCostProblems(['('], [])).toEqual([]);
  });

  it('refuses a list whose patterns are each cheap but too costly together, naming the list', () => {
    // 8 alternations of 2-character words: small DFAs alone, but every state of the combined DFA
    // holds the start of all of them (~600 NFA states per transition).
    const chars = 'abcdefghijklmnopqrstuvwxyz0123456789';
    const alternation = (i: number) => {
      let s = '(?i)(';
      for (let j = 0; s.length < 240; j++) s += (j ? '|' : '') + chars[(i * 7 + j * 13) % 36]! + chars[(i * 7 + j * 13 + 5) % 36]!;
      return `${s})`;
    };
    const many = Array.from({ length: 8 }, (_, i) => alternation(i));
    for (const p of many) expect(userAgentFilterCostProblems([], [p]), p).toEqual([]);
    expect(userAgentFilterCostProblems(['curl'], many)).toEqual([
      { list: 'deny', message: expect.stringMatching(new RegExp(`^the 8 deny patterns are too costly to match together: .*more than ${USER_AGENT_FILTER_EXPLORE_STEPS} transitions or ${USER_AGENT_FILTER_EXPLORE_WORK} steps`)) },
    ]);
    // So is a list of 32 dozen-word alternations (each accepted alone).
    const names = ['googlebot', 'bingbot', 'slurp', 'duckduckbot', 'baiduspider', 'yandexbot', 'sogou', 'exabot', 'facebot', 'ia_archiver', 'ahrefsbot', 'semrushbot', 'mj12bot', 'dotbot', 'petalbot', 'bytespider', 'gptbot', 'ccbot', 'claudebot', 'amazonbot'];
    const bots = Array.from({ length: 32 }, (_, i) => `(?i)(${names.map((n) => `${n}${i}`).join('|')})`.slice(0, 250).replace(/\|[^|]*$/, ')'));
    expect(userAgentFilterCostProblems(bots, [])).toEqual([{ list: 'allow', message: expect.stringContaining('the 32 allow patterns are too costly to match together') }]);
  });

  it('measures the DFA as re2js stores it: long lists of literals are accepted', () => {
    // regexCostInfo bounds a DFA state by the whole program (right for one pattern): it would
    // refuse these 32 literals together; their states hold a few instructions each.
    const names = ['Googlebot', 'bingbot', 'Slurp', 'DuckDuckBot', 'Baiduspider', 'YandexBot', 'Sogou', 'Exabot', 'facebot', 'ia_archiver', 'AhrefsBot', 'SemrushBot', 'MJ12bot', 'DotBot', 'PetalBot', 'Bytespider'];
    const names2 = ['GPTBot', 'CCBot', 'ClaudeBot', 'Amazonbot', 'Applebot', 'SeznamBot', 'curl', 'Wget', 'python-requests', 'Go-http-client', 'okhttp', 'Scrapy', 'HttpClient', 'libwww-perl', 'masscan', 'zgrab'];
    const literals = [...names, ...names2].map((n, i) => `${n}/2\\.${i}; `);
    const [re] = programs(literals);
    expect(regexCostInfo(re!, { steps: 1e6 }, 0).dfaStates).toBeUndefined();
    const budget = { steps: USER_AGENT_FILTER_EXPLORE_STEPS, work: USER_AGENT_FILTER_EXPLORE_WORK };
    expect(exploreUserAgentDfa(re!, budget)).toBe('cheap');
    expect(userAgentFilterCostProblems(literals, literals)).toEqual([]);
    // A plain literal is not explored at all (RE2 searches it as a string).
    expect(exploreUserAgentDfa(programs(['curl/'])[0]!, { steps: 0, work: 0 })).toBe('cheap');
    expect(exploreUserAgentDfa(programs(['a[ab]{20}b'])[0]!, { steps: 1e6, work: 1e9 })).toBe('large');
    expect(exploreUserAgentDfa(programs(['(?i)googlebot'])[0]!, { steps: 10, work: 1e9 })).toBe('budget');
  });
});

describe('user agent lists checked one by one', () => {
  it('userAgentListCostProblem is userAgentFilterCostProblems for one list', () => {
    expect(userAgentListCostProblem('deny', ['x', 'a[ab]{20}b'])).toEqual({ list: 'deny', index: 1, message: expect.stringMatching(/too costly to match/) });
    expect(userAgentListCostProblem('allow', ['(?i)google-images', '^$', 'curl/'])).toBeUndefined();
    expect(userAgentListCostProblem('allow', ['('])).toBeUndefined();
    expect(userAgentListCostProblem('allow', [])).toBeUndefined();
  });

  it('userAgentListCheapWithin accepts only lists the full check accepts, within the budget given', () => {
    const small = { steps: 2_000, work: 60_000 };
    const bots = ['(?i)googlebot', '(?i)bingbot', 'curl/', '^$', '[Bb]ing'];
    expect(userAgentListCheapWithin(bots, { ...small })).toBe(true);
    expect(userAgentListCostProblem('deny', bots)).toBeUndefined();
    expect(userAgentListCheapWithin([], { steps: 0, work: 0 })).toBe(true);
    // Cheap, but not within a tiny budget: undecided.
    expect(userAgentListCheapWithin(['(?i)googlebot'], { steps: 10, work: 1e9 })).toBe(false);
    // Refused by the full check: never accepted, whatever the budget.
    expect(userAgentListCheapWithin(['a[ab]{20}b'], { steps: 1e6, work: 1e9 })).toBe(false);
    expect(userAgentListCheapWithin(['('], { ...small })).toBe(false);
    // The budget is counted down, as exploreUserAgentDfa does.
    const budget = { ...small };
    userAgentListCheapWithin(['(?i)googlebot'], budget);
    expect(budget.steps).toBeLessThan(small.steps);
  });
});

describe('user agent lists, one RE2 program each', () => {
  it('flags set in one pattern apply to it alone', () => {
    const list = ['(?i)google-images', '[Bb]ing'];
    expect(programs(list)).toHaveLength(1);
    expect(matches(list, 'GOOGLE-IMAGES/1.0')).toBe(true);
    expect(matches(list, 'bingbot')).toBe(true);
    expect(matches(list, 'Bingbot')).toBe(true);
    expect(matches(list, 'BING')).toBe(false); // (?i) of the first pattern does not reach [Bb]ing
    expect(matches(list, 'BINGBOT/2.0')).toBe(false);
    // Flags set mid-pattern, turned off, or last: still scoped to their pattern.
    expect(matches(['foo(?i)bar', 'x'], 'fooBAR')).toBe(true);
    expect(matches(['foo(?i)bar', 'x'], 'X')).toBe(false);
    expect(matches(['a(?i)', 'B'], 'b')).toBe(false);
    expect(matches(['(?i)a(?-i)b', 'C'], 'AB')).toBe(false);
    expect(matches(['(?i)a(?-i)b', 'C'], 'Ab')).toBe(true);
    expect(matches(['(?i)a(?-i)b', 'C'], 'c')).toBe(false);
    // (?s) and (?m) too.
    expect(matches(['(?s)a.b', 'c.d'], 'a\nb')).toBe(true);
    expect(matches(['(?s)a.b', 'c.d'], 'c\nd')).toBe(false);
    expect(matches(['(?m)^a$', '^b$'], 'x\na\ny')).toBe(true);
    expect(matches(['(?m)^a$', '^b$'], 'x\nb\ny')).toBe(false);
    // A pattern's own flags still reach its own alternatives.
    expect(matches(['(?i)bad|evil', 'x'], 'EVIL')).toBe(true);
  });

  it('anchors keep their meaning in each pattern, and ^$ matches only the empty string', () => {
    const list = ['^curl/', 'bot$', '^$'];
    expect(matches(list, 'curl/8')).toBe(true);
    expect(matches(list, 'xcurl/8')).toBe(false);
    expect(matches(list, 'Googlebot')).toBe(true);
    expect(matches(list, 'Googlebot/2.1')).toBe(false);
    expect(matches(list, '')).toBe(true);
    expect(matches(list, 'x')).toBe(false);
    expect(matches(['^$', '(?i)bot'], '')).toBe(true);
    expect(matches(['^$', '(?i)bot'], ' ')).toBe(false);
    expect(matches(['(?i)bot'], '')).toBe(false);
    // An alternation inside a pattern stays inside it: ^a|b is (^a)|b, not ^(a|b).
    expect(matches(['^a|b', '^c'], 'xb')).toBe(true);
    expect(matches(['^a|b', '^c'], 'xc')).toBe(false);
  });

  it('keeps every pattern whole: \\Q…, named groups, classes, escapes', () => {
    expect(userAgentAlternative('(?i)bot')).toBe('(?:(?i)bot)');
    // An unterminated \Q would swallow the closing parenthesis.
    expect(userAgentAlternative('\\Qa)b')).toBe('(?:\\Qa)b\\E)');
    expect(userAgentAlternative('x\\Qa\\')).toBe('(?:x\\Qa\\\\E)');
    expect(userAgentAlternative('\\Q(?P<n>\\Ey')).toBe('(?:\\Q(?P<n>\\Ey)');
    expect(matches(['\\Qa)b', 'zzz'], 'a)b')).toBe(true);
    expect(matches(['\\Qa)b', 'zzz'], 'zzz')).toBe(true);
    expect(matches(['\\Qa)b', 'zzz'], 'b')).toBe(false);
    expect(matches(['x\\Qa\\', 'zzz'], 'xa\\')).toBe(true);
    // Two patterns may name a group alike: names are dropped (only a match counts).
    expect(userAgentAlternative('(?P<v>a)(?<w>b)')).toBe('(?:(a)(b))');
    expect(matches(['(?P<v>a)x', '(?P<v>b)y'], 'by')).toBe(true);
    // Not a group: in a class, escaped.
    expect(userAgentAlternative('[(?P<n>]\\(?P<m>')).toBe('(?:[(?P<n>]\\(?P<m>)');
    expect(userAgentAlternative('[]a(?P<n>]')).toBe('(?:[]a(?P<n>])');
    expect(userAgentAlternative('[^]a(?P<n>]')).toBe('(?:[^]a(?P<n>])');
    expect(userAgentAlternative('[[:alpha:](?P<n>]')).toBe('(?:[[:alpha:](?P<n>])');
    expect(userAgentAlternative('[\\](?P<n>]')).toBe('(?:[\\](?P<n>])');
  });

  it('an alternative is always the same RE2 program as its pattern, and a list matches as any of its patterns (random patterns)', () => {
    const tokens = ['a', 'b', 'A', 'B', 'x', '(?i)', '(?-i)', '(?s)', '(?m)', '(?U)', '^', '$', '.', '\\Q', '\\E', '(', ')', '(?:', '(?i:', '(?P<n>', '(?<m>', '[', ']', '[^', '[:alpha:]', '|', '*', '+', '?', '{2}', '\\', '\\d', '\\b', '\\A', '\\z', '\\n', '-', ':'];
    const inputs = ['', 'a', 'b', 'A', 'B', 'x', 'ab', 'AB', 'aB', 'a\nb', 'b\n', '\na', 'xx', '1', 'a1', 'ba', 'aab', ')', '(', '[', '\\', 'Q', 'E', '-', ':', 'a b', 'n'];
    let seed = 12345;
    const rand = (n: number) => {
      seed = (seed * 1103515245 + 12345) % 2147483648;
      return seed % n;
    };
    const pattern = () => Array.from({ length: 1 + rand(8) }, () => tokens[rand(tokens.length)]).join('');
    const valid: string[] = [];
    while (valid.length < 400) {
      const p = pattern();
      const re = compileUserAgentPattern(p);
      if (typeof re === 'string') continue;
      valid.push(p);
      const alt = RE2JS.compile(userAgentAlternative(p));
      expect(progText(alt), p).toBe(progText(re));
    }
    for (let i = 0; i + 1 < valid.length; i += 2) {
      const [p, q] = [valid[i]!, valid[i + 1]!];
      const [rp, rq] = [compileUserAgentPattern(p) as RE2JS, compileUserAgentPattern(q) as RE2JS];
      for (const s of inputs) expect(matches([p, q], s), `${JSON.stringify([p, q])} on ${JSON.stringify(s)}`).toBe(rp.test(s) || rq.test(s));
    }
  });

  it('puts patterns with wide Unicode classes in a second program', () => {
    const list = ['(?i)bot', '\\pL+/\\d', 'curl', '\\p{Greek}x'];
    expect(programs(list)).toHaveLength(2);
    expect(programs(['(?i)bot', 'curl'])).toHaveLength(1);
    expect(programs([])).toEqual([]);
    for (const ua of ['Googlebot', 'curl/8', 'été/5', 'αx', '/5', 'x']) expect(matches(list, ua), ua).toBe(list.some((p) => (compileUserAgentPattern(p) as RE2JS).test(ua)));
    // A dozen patterns with \pL among them: accepted (together, 1,400 classes × their states would not be).
    const ok = ['(?i)curl/.*', 'foo(?i)bar', '(?is)^mozilla.*gecko', '^$', '(?i)google-images', '[Bb]ing', '(a|a)*$', '(a+)+$', '(\\w*x)*', '(ab){2,3}', '\\pL+/\\d', 'Mozilla/5\\.0 \\(X11;.*'];
    expect(userAgentFilterCostProblems(ok, [])).toEqual([]);
  });

  it('refuses a list that does not compile, naming the pattern', () => {
    expect(compileUserAgentList(['ok', '(unclosed'])).toEqual({ index: 1, message: expect.stringMatching(/^invalid RE2 pattern: missing closing \)/) });
  });
});
