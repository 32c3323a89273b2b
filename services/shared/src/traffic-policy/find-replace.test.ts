import { RE2JS } from 're2js';
import { describe, expect, it } from 'vitest';
import { applyFindReplace, compileFindReplace, FIND_REPLACE_BODY_COST, FIND_REPLACE_LIMITS, findReplaceBodyCost, findReplaceCost, literalPattern } from './find-replace.js';
import { validateTrafficPolicy } from './parse.js';
import { oneAction, refusal } from './testing.js';
import { MAX_POLICY_COST } from './cost.js';
import type { CelProgram } from './cel.js';

const REQ = 'request-body-find-replace';
const RES = 'response-body-find-replace';
const req = (config: unknown) => oneAction({ type: REQ, config }, 'inbound');
const res = (config: unknown) => oneAction({ type: RES, config }, 'outbound');
const accepted = (doc: unknown) => validateTrafficPolicy(doc, { checkCost: true });

describe('find-replace: save-time validation', () => {
  it('accepts ngrok’s examples; to defaults to empty (deletion)', () => {
    const p = accepted(req({ replacements: [{ from: 'api_key=([a-zA-Z0-9]+)', to: 'api_key=REDACTED' }, { from: '\\b\\d{3}-\\d{2}-\\d{4}\\b' }] }));
    expect(p.inbound[0]!.actions[0]).toEqual({ type: REQ, config: { replacements: [{ from: 'api_key=([a-zA-Z0-9]+)', to: 'api_key=REDACTED' }, { from: '\\b\\d{3}-\\d{2}-\\d{4}\\b', to: '' }] } });
    accepted(res({ replacements: [{ from: '${vars.sensitive_pattern}', to: "[REDACTED by ${req.headers['x-request-id'].join(',')}]" }] }));
  });

  it.each([
    [req({ replacements: [{ from: 'a(' }] }), 'inbound[0].actions[0].config.replacements[0].from', 'invalid RE2 pattern'],
    [req({ replacements: [{ from: '(?=x)' }] }), 'inbound[0].actions[0].config.replacements[0].from', 'RE2 syntax'],
    [req({ replacements: [{ from: 'a', to: 'x' }, { from: '(a)', to: '$2' }] }), 'inbound[0].actions[0].config.replacements[1].to', 'capture group 2'],
    [req({ replacements: [{ from: '(?P<k>a)', to: '$key' }] }), 'inbound[0].actions[0].config.replacements[0].to', 'no capture group'],
    [req({ replacements: [{ to: 'x' }] }), 'inbound[0].actions[0].config.replacements[0].from', 'is required'],
    [req({ replacements: [{ from: '' }] }), 'inbound[0].actions[0].config.replacements[0].from', 'must not be empty'],
    [req({ replacements: [{ from: 7 }] }), 'inbound[0].actions[0].config.replacements[0].from', 'must be a string'],
    [req({ replacements: [{ from: 'a', to: ['x'] }] }), 'inbound[0].actions[0].config.replacements[0].to', 'must be a string'],
    [req({ replacements: [{ from: 'a', field: 'data' }] }), 'inbound[0].actions[0].config.replacements[0].field', 'unknown field'],
    [req({ replacements: [{ from: 'x'.repeat(4097) }] }), 'inbound[0].actions[0].config.replacements[0].from', 'over 4096'],
    [req({ replacements: [{ from: 'a', to: 'x'.repeat(4097) }] }), 'inbound[0].actions[0].config.replacements[0].to', 'over 4096'],
    [req({ replacements: [{ from: '${nope(}' }] }), 'inbound[0].actions[0].config.replacements[0].from', ''],
    [req({ replacements: [] }), 'inbound[0].actions[0].config.replacements', 'at least one'],
    [req({}), 'inbound[0].actions[0].config.replacements', 'is required'],
    [req({ replacements: 'a' }), 'inbound[0].actions[0].config.replacements', 'must be a list'],
    [req({ replacements: ['a'] }), 'inbound[0].actions[0].config.replacements[0]', 'must be a mapping'],
    [req({ replacements: Array.from({ length: 11 }, () => ({ from: 'a' })) }), 'inbound[0].actions[0].config.replacements', 'at most 10'],
    [req({ replacements: [{ from: 'a' }], max: 1 }), 'inbound[0].actions[0].config.max', 'unknown field'],
    [oneAction({ type: REQ, config: { replacements: [{ from: 'a' }] } }, 'outbound'), 'outbound[0].actions[0].type', 'inbound rules'],
    [oneAction({ type: RES, config: { replacements: [{ from: 'a' }] } }, 'inbound'), 'inbound[0].actions[0].type', 'outbound rules'],
    [oneAction({ type: RES }, 'outbound'), 'outbound[0].actions[0].config', 'is required'],
  ])('refuses %j at %s', (doc, path, reason) => {
    const e = refusal(doc, true);
    expect(e.path).toBe(path);
    expect(e.reason).toContain(reason);
  });

  it('charges every replacement to the policy cost bound (5 ms): a handful fit, complex ones do not', () => {
    const ssn = '\\b\\d{3}-\\d{2}-\\d{4}\\b';
    accepted(res({ replacements: [{ from: 'secret' }, { from: ssn, to: 'XXX-XX-XXXX' }] }));
    // Each NFA search of a 4 KiB body is about 2 ms at worst: the third takes the policy over.
    const e = refusal(res({ replacements: [{ from: ssn }, { from: 'api_key=([a-z0-9]+)' }, { from: '[a-z]+@[a-z]+\\.com' }] }), true);
    expect(e.path).toBe('outbound[0].actions[0].config.replacements[2].from');
    expect(e.reason).toMatch(/replacing from \(RE2, up to 32 matches\) in a response body of up to 4 KiB .* estimated at .* more than the 5.00 ms allowed/);
    // A large pattern alone is too much.
    const big = refusal(req({ replacements: [{ from: '(\\w+\\s*){10}x' }] }), true);
    expect(big.path).toBe('inbound[0].actions[0].config.replacements[0].from');
  });

  it('an action of literal replacements rewrites 128 KiB bodies (one such replacement fits a policy); a regex in it brings it to 4 KiB', () => {
    const lit = compileFindReplace('inbound', { replacements: [{ from: 'secret', to: '[$0]' }, { from: 'a\\.b\\n', to: 'x' }] });
    expect(lit.bodyBytes).toBe(128 * 1024);
    expect(lit.replacements.map((r) => r.literal)).toEqual([['secret'], ['a.b\n']]);
    expect(compileFindReplace('inbound', { replacements: [{ from: 'secret', to: '' }, { from: 'a+', to: '' }] }).bodyBytes).toBe(4096);
    accepted(res({ replacements: [{ from: 'api_key=SECRET', to: 'api_key=REDACTED' }] }));
    const two = refusal(res({ replacements: [{ from: 'one' }, { from: 'two' }] }), true);
    expect(two.path).toBe('outbound[0].actions[0].config.replacements[1].from');
    expect(two.reason).toContain('replacing a literal from (plain search, up to 1024 matches) in a response body of up to 128 KiB');
    // Mixed with a regex: 4 KiB, cheap.
    accepted(res({ replacements: [{ from: 'one' }, { from: 'two' }, { from: '\\d{3}' }] }));
  });

  it('tells literal patterns from regexes', () => {
    expect(literalPattern('api_key=SECRET')).toBe('api_key=SECRET');
    expect(literalPattern('a\\.b\\\\c\\$\\t')).toBe('a.b\\c$\t');
    for (const p of ['a.b', 'a+', '(?i)x', '^x', 'x$', '[a]', 'a{2}', 'a|b', '\\d', '\\bx', '\\Qx\\E', 'x\\']) expect(literalPattern(p), p).toBeNull();
    expect(() => compileFindReplace('inbound', { replacements: [{ from: 'x', to: '$1' }] })).toThrow(/capture group 1/);
  });

  it('a literal from over 128 bytes of UTF-8 is a regex (Buffer.indexOf is roughly quadratic for long needles): 4 KiB bodies, charged as RE2', () => {
    const max = FIND_REPLACE_LIMITS.literalNeedleBytes;
    expect(max).toBe(128);
    const at = (from: string) => compileFindReplace('inbound', { replacements: [{ from, to: 'x' }] });
    expect(at('a'.repeat(max - 1) + 'b').bodyBytes).toBe(FIND_REPLACE_LIMITS.literalBodyBytes);
    expect(at('é'.repeat(max / 2)).replacements[0]!.literal).toEqual(['é'.repeat(max / 2)]);
    for (const from of ['a'.repeat(max) + 'b', 'é'.repeat(max / 2 + 1), 'a'.repeat(1240) + 'b' + 'a'.repeat(1240), 'k='.repeat(65) + '${vars.v}']) {
      const c = at(from);
      expect(c.replacements[0]!.literal, from.slice(0, 20)).toBeNull();
      expect(c.bodyBytes).toBe(FIND_REPLACE_LIMITS.bodyBytes);
    }
    // The reviewer's case: four 2481-byte literals were accepted and took ~540 ms on 256 KiB of `a`: now a 4 KiB regex.
    const from = 'a'.repeat(1240) + 'b' + 'a'.repeat(1240);
    const c = at(from);
    expect(() => applyFindReplace(c, Buffer.from('a'.repeat(FIND_REPLACE_LIMITS.literalBodyBytes - 1)), () => '')).toThrow(/over 4096/);
    const started = process.cpuUsage();
    expect(applyFindReplace(c, Buffer.from('a'.repeat(FIND_REPLACE_LIMITS.bodyBytes)), () => '')).toBeNull();
    expect(cpuMs(started)).toBeLessThan(50);
  });

  it('a literal from whose ${…} make it over 128 bytes leaves the body alone; ${…} over 128 characters together are an evaluation error (as url-rewrite)', () => {
    const c = compileFindReplace('inbound', { replacements: [{ from: "${req.headers['x-find'][0]}", to: 'x' }] });
    expect(c.replacements[0]!.literal).not.toBeNull();
    expect(c.bodyBytes).toBe(FIND_REPLACE_LIMITS.literalBodyBytes);
    const body = Buffer.from('a'.repeat(FIND_REPLACE_LIMITS.literalBodyBytes - 1));
    // The reviewer's client-sent 8001-byte needle took ~510 ms; refused before any search.
    const started = process.cpuUsage();
    expect(() => applyFindReplace(c, body, () => 'a'.repeat(4000) + 'b' + 'a'.repeat(4000))).toThrow(expect.objectContaining({ code: 'invalid_pattern' }));
    expect(cpuMs(started)).toBeLessThan(20);
    expect(() => applyFindReplace(c, body, () => 'a'.repeat(129))).toThrow(/over 128 characters together/);
    expect(applyFindReplace(c, Buffer.from('a'.repeat(127) + 'b'), () => 'a'.repeat(127) + 'b')?.toString()).toBe('x');
    // 128 characters, but 256 bytes of UTF-8.
    expect(() => applyFindReplace(c, body, () => 'é'.repeat(128))).toThrow(expect.objectContaining({ code: 'url_too_long' }));
    const mixed = compileFindReplace('inbound', { replacements: [{ from: 'k='.repeat(60) + '${vars.v}', to: 'x' }] });
    expect(() => applyFindReplace(mixed, body, () => 'v'.repeat(9))).toThrow(/from \(once its \$\{…\} are evaluated\) is over 128 bytes/);
    expect(applyFindReplace(mixed, Buffer.from(`${'k='.repeat(60)}vvvvvvvv`), () => 'v'.repeat(8))?.toString()).toBe('x');
  });

  it('literal estimates are within 2x of measured worst cases on the 128 KiB bound (best of 9)', () => {
    const n = FIND_REPLACE_LIMITS.literalBodyBytes;
    const m = FIND_REPLACE_LIMITS.literalNeedleBytes;
    const k = FIND_REPLACE_LIMITS.literalMaxMatches;
    const rep = (s: string, len: number) => s.repeat(Math.ceil(len / s.length)).slice(0, len);
    const cases: [string, string, string][] = [
      // Nearly every byte starts a partial match (Node's search is slowest there: ~6 ns per byte).
      ['ab', 'a'.repeat(n), 'x'],
      ['aaab', 'a'.repeat(n), 'x'],
      ['aaaaaab', 'a'.repeat(n), 'x'],
      ['ab' + 'a', 'a'.repeat(n), 'x'],
      // The longest needles: a repeated prefix, a mismatch in the middle, periodic patterns.
      ['a'.repeat(m - 1) + 'b', 'a'.repeat(n), 'x'],
      ['a'.repeat(m / 2) + 'b' + 'a'.repeat(m / 2 - 1), 'a'.repeat(n), 'x'],
      ['b' + 'a'.repeat(m - 1), 'a'.repeat(n), 'x'],
      ['abababc', 'ab'.repeat(n / 2), 'x'],
      [rep('ab', m - 1) + 'c', 'ab'.repeat(n / 2), 'x'],
      [rep('abc', m / 2) + 'x' + rep('abc', m / 2 - 1), rep('abc', n), 'x'],
      ['b'.repeat(63) + 'a' + 'b'.repeat(62) + 'c', rep('b'.repeat(63) + 'a', n), 'x'],
      // Every match a longest needle, as many as allowed, with `a`s between.
      ['a'.repeat(m - 1) + 'b', rep('a'.repeat(n / k - m) + 'a'.repeat(m - 1) + 'b', n), 'x'],
      // As many matches as allowed, the result as long as allowed (fresh memory: page faults).
      ['x', `${'x'.repeat(k)}${'y'.repeat(n - k)}`, 'z'.repeat(n / k + 1)],
      // All at once: the slowest search, every match, the longest result.
      ['ab', rep('a'.repeat(n / k - 2) + 'ab', n), 'z'.repeat(n / k + 2)],
      // Ordinary text.
      ['Product name', '<div class="item"><a href="/p/1">Product name</a><span>text</span></div>\n'.repeat(n / 72).slice(0, n), 'Item'],
    ];
    const report: string[] = [];
    for (const [from, text, to] of cases) {
      const c = compileFindReplace('outbound', { replacements: [{ from, to }] });
      const body = Buffer.from(text);
      const est = findReplaceCost(c.replacements[0]!, c.bodyBytes) + findReplaceBodyCost(c.bodyBytes);
      let ms = Infinity;
      for (let i = 0; i < 9; i++) {
        const started = process.cpuUsage();
        try {
          applyFindReplace(c, body, () => '');
        } catch {
          // over a bound (ordinary text: more than 1024 matches): the search ran all the same
        }
        ms = Math.min(ms, cpuMs(started));
      }
      report.push(`${from.slice(0, 16)}… (${Buffer.byteLength(from)} B): ${ms.toFixed(2)} ms measured, ${(est / 1e6).toFixed(2)} ms estimated`);
      expect(c.replacements[0]!.literal, from).not.toBeNull();
      expect(est).toBeLessThan(MAX_POLICY_COST);
      // Each coefficient was set at about twice the slowest run measured on a quiet box (page
      // faults vary most). The fastest of the runs is held to the same bound as the regex cases
      // below (within 2x of the estimate): a fresh-clone CI run beside another test run measured
      // 2.59 ms against 3.45 estimated, outside the 1.5x room once asked for here. A modelling
      // error worth catching is an order of magnitude; calibration belongs to the benchmarks.
      expect(ms, report.at(-1)).toBeLessThan((2 * est) / 1e6);
    }
    console.log(`literal find-replace on ${n / 1024} KiB:\n  ${report.join('\n  ')}`);
  });

  it('estimates cover measured worst cases on the bounded body', () => {
    const patterns = ['secret', 'api_key=([a-zA-Z0-9]+)', '\\b\\d{3}-\\d{2}-\\d{4}\\b', '(\\w+)@(\\w+)', '[a-z]{3}'];
    // Adversarial text: every position starts a partial match, many full matches.
    const text = 'api_key=a1 ab@cd 123-45-6789 x'.repeat(Math.ceil(FIND_REPLACE_LIMITS.bodyBytes / 30)).slice(0, FIND_REPLACE_LIMITS.bodyBytes);
    for (const from of patterns) {
      const ts = compileFindReplace('outbound', { replacements: [{ from, to: '<$0>' }] });
      const est = findReplaceCost(ts.replacements[0]!, ts.bodyBytes) + FIND_REPLACE_BODY_COST;
      const body = Buffer.from(text);
      // The fastest of a few runs (the first compiles re2js's machines; a loaded machine slows some).
      let ms = Infinity;
      for (let i = 0; i < 9; i++) {
        const started = process.cpuUsage();
        try {
          applyFindReplace(ts, body, () => '');
        } catch {
          // too many matches: the search ran all the same
        }
        ms = Math.min(ms, cpuMs(started));
      }
      expect(est).toBeLessThan(MAX_POLICY_COST);
      expect(ms, `${from}: measured ${ms.toFixed(2)} ms, estimated ${(est / 1e6).toFixed(2)} ms`).toBeLessThan((2 * est) / 1e6);
    }
  });
});

/**
 * CPU milliseconds this process spent since `started` (`process.cpuUsage`): the cost checks above
 * compare an estimate with the work done, which wall time overstates whenever the machine is busy
 * (two test runs at once preempt this process mid-measurement). Vitest runs files in forks, so
 * no other test's work is counted.
 */
function cpuMs(started: NodeJS.CpuUsage): number {
  const d = process.cpuUsage(started);
  return (d.user + d.system) / 1000;
}

describe('applyFindReplace', () => {
  const run = (replacements: { from: string; to?: string }[], text: string, values: Record<string, string> = {}) => {
    const ts = compileFindReplace('inbound', { replacements: replacements.map((r) => ({ from: r.from, to: r.to ?? '' })) });
    const programs: CelProgram[] = ts.programs;
    const names = Object.keys(values);
    return applyFindReplace(ts, Buffer.from(text), (p) => values[names[programs.indexOf(p)] ?? ''] ?? '')?.toString() ?? null;
  };

  it('replaces every match, in order, later rules seeing earlier results; null when nothing matched', () => {
    expect(run([{ from: 'api_key=([a-zA-Z0-9]+)', to: 'api_key=REDACTED' }], 'a api_key=abc&api_key=def')).toBe('a api_key=REDACTED&api_key=REDACTED');
    expect(run([{ from: 'cat', to: 'dog' }, { from: 'dog', to: 'wolf' }], 'cat dog')).toBe('wolf wolf');
    expect(run([{ from: 'x+' }], 'axxbx')).toBe('ab');
    expect(run([{ from: 'zzz', to: 'y' }], 'abc')).toBeNull();
    expect(run([{ from: '(?P<user>\\w+)@(\\w+)', to: '$user at ${2} ($$)' }], 'mail bob@example now')).toBe('mail bob at example ($) now');
  });

  it('works on UTF-16 text the way Go works on runes; ${…} values are literal text', () => {
    expect(run([{ from: 'é+', to: 'e' }], 'cafééé ☕')).toBe('cafe ☕');
    expect(run([{ from: '${vars.v}', to: '[${vars.w}]' }], 'a.b a+b', { v: 'a+b', w: '$1' })).toBe('a.b [$1]');
  });

  it('literal replacements: byte search, $0, ${…} values as literal text, UTF-8; an empty ${…} falls back to the regex rules', () => {
    expect(run([{ from: 'a.b', to: '[$0]' }], 'a.b axb')).toBe('[a.b] [axb]'); // a regex: `.` is any character
    expect(run([{ from: 'a\\.b', to: '[$0|${0}]' }], 'a.b axb a.b')).toBe('[a.b|a.b] axb [a.b|a.b]');
    expect(run([{ from: 'é☕', to: '€' }], 'café☕ é☕')).toBe('caf€ €');
    expect(run([{ from: 'k=${vars.v}', to: '${vars.w}' }], 'k=a+b k=ab', { v: 'a+b', w: '$1' })).toBe('$1 k=ab');
    expect(run([{ from: '${vars.v}', to: '-' }], 'ab', { v: '' })).toBe('-a-b-');
    expect(() => run([{ from: '${vars.v}', to: '-' }], 'a'.repeat(5000), { v: '' })).toThrow(/empty/);
    const big = `${'x'.repeat(100 * 1024)} api_key=SECRET `;
    expect(run([{ from: 'api_key=SECRET', to: 'api_key=REDACTED' }], big)).toBe(big.replace('SECRET', 'REDACTED'));
    expect(() => run([{ from: 'a', to: 'b' }], 'a '.repeat(FIND_REPLACE_LIMITS.literalMaxMatches + 1))).toThrow(/more than 1024 times/);
    expect(() => run([{ from: 'a' }], 'a'.repeat(FIND_REPLACE_LIMITS.literalBodyBytes + 1))).toThrow(/over 131072/);
  });

  it('refuses more than maxMatches matches and results over outBytes (the body is then left alone)', () => {
    expect(() => run([{ from: 'a+' }], 'a '.repeat(FIND_REPLACE_LIMITS.maxMatches + 1))).toThrow(/more than 32 times/);
    expect(() => run([{ from: 'a(b)c', to: 'x'.repeat(4000) }], 'abc abc abc')).toThrow(/over 8192/);
    expect(RE2JS.quote('a+b')).toBe('a\\+b');
  });
});
