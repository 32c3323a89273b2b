import { describe, expect, it } from 'vitest';
import { userAgentFilterCostProblems } from '@warren/shared';
import { userAgentFilterStage } from './user-agent-filter.js';
import { makeConfig, makeState, stageFor } from './testing.js';
import { cpuMicros } from '../../../../test/support/cpu-time.js';

type Mod = { enabled?: boolean; allow?: string[]; deny?: string[] };

/** The status a request with these User-Agent headers gets (200: the stage lets it through). */
async function status(mod: Mod, ...uas: string[]): Promise<number> {
  const s = stageFor(userAgentFilterStage, { user_agent_filter: { enabled: true, ...mod } })!;
  const out = await s.onRequest!(makeState({ headers: ['Host', 'a.test', ...uas.flatMap((ua) => ['User-Agent', ua])] }));
  return out ? out.status : 200;
}

describe('user_agent_filter', () => {
  it('refuses a stored list the control plane would refuse as too costly (saved before it checked), before any request', () => {
    // Each pattern compiles and the old JavaScript check accepted it; together they would cost
    // seconds per fresh 16 KiB User-Agent.
    const deny = Array.from({ length: 32 }, (_, i) => `[a-z]{${i % 5}}[a-z0-9 ]{0,40}[^a-z0-9 ;/]{3}`);
    expect(userAgentFilterCostProblems([], deny).length).toBeGreaterThan(0);
    expect(() => stageFor(userAgentFilterStage, { user_agent_filter: { enabled: true, allow: [], deny } })).toThrow(/deny: the list is too costly/);
  }, 120_000); // ~1 s of CPU (the cost check explores the DFA): 25 times that in wall time on a box running two test runs and more at once

  it('is absent when missing, disabled or empty', () => {
    expect(stageFor(userAgentFilterStage, {})).toBeNull();
    expect(stageFor(userAgentFilterStage, { user_agent_filter: { enabled: false, allow: [], deny: ['.*'] } })).toBeNull();
    expect(stageFor(userAgentFilterStage, { user_agent_filter: { enabled: true, allow: [], deny: [] } })).toBeNull();
  });

  it('deny rules: a match is refused, anything else passes (unanchored RE2 match)', async () => {
    const m = { deny: ['curl/', '(?i)python-requests'] };
    expect(await status(m, 'curl/8.4.0')).toBe(403);
    expect(await status(m, 'Python-Requests/2.31')).toBe(403);
    expect(await status(m, 'Mozilla/5.0')).toBe(200);
  });

  it('allow rules only: a match passes, anything else is refused', async () => {
    const m = { allow: ['^Mozilla/5\\.0 '] };
    expect(await status(m, 'Mozilla/5.0 (X11)')).toBe(200);
    expect(await status(m, 'curl/8')).toBe(403);
    expect(await status(m, 'xMozilla/5.0 ')).toBe(403);
  });

  it('an allow rule overrides deny rules (ngrok: all Google bots but Google Images)', async () => {
    const m = { allow: ['(?i)google-images'], deny: ['(?i)google', '[Bb]ing'] };
    expect(await status(m, 'Google-Images/1.0')).toBe(200);
    expect(await status(m, 'Mozilla/5.0 (compatible; Googlebot/2.1)')).toBe(403);
    expect(await status(m, 'Bingbot/2.0')).toBe(403);
    expect(await status(m, 'Mozilla/5.0 (X11; Linux x86_64)')).toBe(200);
    // Allow is checked first, whatever deny says.
    expect(await status({ allow: ['Mozilla'], deny: ['(?i)bot'] }, 'Mozilla/5.0 Googlebot')).toBe(200);
    expect(await status({ allow: ['Mozilla'], deny: ['(?i)bot'] }, 'Googlebot')).toBe(403);
  });

  it('a missing or empty User-Agent is refused unless an allow rule matches the empty string', async () => {
    for (const m of [{ deny: ['(?i)bot'] }, { allow: ['curl'] }, { allow: ['curl'], deny: ['bot'] }]) {
      expect(await status(m)).toBe(403);
      expect(await status(m, '')).toBe(403);
    }
    expect(await status({ allow: ['^$'], deny: ['(?i)bot'] })).toBe(200);
    expect(await status({ allow: ['^$'], deny: ['(?i)bot'] }, '')).toBe(200);
    expect(await status({ allow: ['^$'], deny: ['(?i)bot'] }, 'Googlebot')).toBe(403);
    expect(await status({ allow: ['^$'], deny: ['(?i)bot'] }, 'curl/8')).toBe(200);
    // ^$ alone: only requests without a User-Agent.
    expect(await status({ allow: ['^$'] })).toBe(200);
    expect(await status({ allow: ['^$'] }, 'curl/8')).toBe(403);
  });

  it('checks only the first User-Agent header', async () => {
    const m = { deny: ['(?i)badbot'] };
    expect(await status(m, 'BadBot/1.0', 'Mozilla/5.0')).toBe(403);
    expect(await status(m, 'Mozilla/5.0', 'BadBot/1.0')).toBe(200);
    expect(await status({ allow: ['^curl/'] }, 'curl/8', 'Mozilla/5.0')).toBe(200);
    expect(await status({ allow: ['^curl/'] }, 'Mozilla/5.0', 'curl/8')).toBe(403);
  });

  it('matches the whole header: a long User-Agent does not hide a deny match', async () => {
    const m = { deny: ['(?i)badbot'] };
    expect(await status(m, `Mozilla/5.0 ${'a'.repeat(600)} BadBot/1.0`)).toBe(403);
    expect(await status(m, `Mozilla/5.0 ${'a'.repeat(16_000)} BadBot/1.0`)).toBe(403);
    expect(await status({ allow: ['Chrome/1\\d\\d$'] }, `Mozilla/5.0 ${'a'.repeat(8000)} Chrome/120`)).toBe(200);
  });

  it('runs RE2 syntax: inline flags', async () => {
    expect(await status({ deny: ['foo(?i)bar'] }, 'fooBAR')).toBe(403);
    expect(await status({ deny: ['foo(?i)bar'] }, 'FOObar')).toBe(200);
    expect(await status({ deny: ['(?i)^mozilla.*(?-i)X11'] }, 'MOZILLA/5.0 (X11)')).toBe(403);
    expect(await status({ deny: ['(?i)^mozilla.*(?-i)X11'] }, 'MOZILLA/5.0 (x11)')).toBe(200);
  });

  it('matches each list as one program: flags stay in their pattern, anchors keep their meaning', async () => {
    // (?i) of the first allow rule does not reach [Bb]ing: BING matches no allow rule.
    const m = { allow: ['(?i)google-images', '[Bb]ing'] };
    expect(await status(m, 'GOOGLE-IMAGES/1.0')).toBe(200);
    expect(await status(m, 'bingbot/2.0')).toBe(200);
    expect(await status(m, 'BING')).toBe(403);
    expect(await status({ deny: ['(?i)google', '[Bb]ing'] }, 'BINGBOT')).toBe(200);
    expect(await status({ deny: ['(?i)google', '[Bb]ing'] }, 'GoogleBot')).toBe(403);
    expect(await status({ deny: ['foo(?i)bar', 'x'] }, 'X')).toBe(200);
    // Anchors: each pattern's own.
    const a = { allow: ['^curl/', 'bot$'] };
    expect(await status(a, 'curl/8')).toBe(200);
    expect(await status(a, 'my curl/8')).toBe(403);
    expect(await status(a, 'Googlebot')).toBe(200);
    expect(await status(a, 'Googlebot/2.1')).toBe(403);
    // ^$ among other allow rules still lets requests without a User-Agent through, and only them.
    const e = { allow: ['(?i)^mozilla/', '^$'], deny: ['(?i)bot'] };
    expect(await status(e)).toBe(200);
    expect(await status(e, '')).toBe(200);
    expect(await status(e, 'Googlebot')).toBe(403);
    expect(await status(e, 'Mozilla/5.0 Googlebot')).toBe(200);
    // Unterminated \Q and named groups used by two patterns.
    expect(await status({ deny: ['\\Qa)b', '(?P<v>x)y', '(?P<v>z)w'] }, '_a)b_')).toBe(403);
    expect(await status({ deny: ['\\Qa)b', '(?P<v>x)y', '(?P<v>z)w'] }, 'zw')).toBe(403);
    expect(await status({ deny: ['\\Qa)b', '(?P<v>x)y', '(?P<v>z)w'] }, 'ab')).toBe(200);
  });

  it('matches patterns with wide Unicode classes, in their own program', async () => {
    const m = { deny: ['(?i)bot', '^\\pL+/\\d', 'curl'] };
    expect(await status(m, Buffer.from('Überbrowser/5', 'utf8').toString('latin1'))).toBe(403);
    expect(await status(m, 'Googlebot')).toBe(403);
    expect(await status(m, 'Mozilla 5')).toBe(200);
  });

  it('a new config with a changed list applies it; an unchanged list keeps working', async () => {
    const cfgA = makeConfig();
    const cfgB = makeConfig();
    const route = (deny: string[]) => ({ user_agent_filter: { enabled: true, deny } });
    const a1 = stageFor(userAgentFilterStage, route(['(?i)alpha']), cfgA)!;
    const a2 = stageFor(userAgentFilterStage, route(['(?i)beta']), cfgA)!;
    const b1 = stageFor(userAgentFilterStage, route(['(?i)alpha']), cfgB)!;
    const b2 = stageFor(userAgentFilterStage, route(['(?i)gamma']), cfgB)!;
    const code = async (s: typeof a1, ua: string) => ((await s.onRequest!(makeState({ headers: ['User-Agent', ua] }))) ?? { status: 200 }).status;
    expect([await code(a1, 'ALPHA'), await code(a1, 'beta')]).toEqual([403, 200]);
    expect([await code(a2, 'ALPHA'), await code(a2, 'beta')]).toEqual([200, 403]);
    expect([await code(b1, 'ALPHA'), await code(b1, 'gamma')]).toEqual([403, 200]);
    expect([await code(b2, 'ALPHA'), await code(b2, 'beta'), await code(b2, 'GAMMA')]).toEqual([200, 200, 403]);
    // A refused list refuses the route in every config.
    expect(() => stageFor(userAgentFilterStage, route(['ok', '(']), cfgB)).toThrow(/is not a valid pattern/);
  });

  it('reads the header as UTF-8, as Go does', async () => {
    // Node keeps header bytes as Latin-1 characters.
    const ua = Buffer.from('Café-Bot/1.0', 'utf8').toString('latin1');
    expect(await status({ deny: ['(?i)^café-bot'] }, ua)).toBe(403);
    expect(await status({ deny: ['^Caf.-Bot'] }, ua)).toBe(403);
    // A byte in no UTF-8 sequence is U+FFFD, one per byte, as Go's regexp reads it.
    expect(await status({ deny: ['^Bot\\x{FFFD}\\x{FFFD}/1$'] }, 'Bot\u00ff\u00c3/1')).toBe(403);
  });

  it('never backtracks: (a|a)*$ answers a hostile User-Agent at once', async () => {
    const hostile = `${'a'.repeat(40)}!`;
    // CPU time (test/support/cpu-time.ts): wall time also counts the waits for a core of a busy box.
    const c0 = cpuMicros();
    expect(await status({ allow: ['^(a|a)*$'] }, hostile)).toBe(403);
    expect(await status({ deny: ['^(a|a)*$'] }, hostile)).toBe(200);
    expect(await status({ deny: ['^(a+)+$'] }, `${'a'.repeat(16_000)}!`)).toBe(200);
    expect(await status({ allow: ['^(a|a)*$'] }, 'a'.repeat(40))).toBe(200);
    // A JavaScript RegExp would take hours on the first one; RE2 well under a millisecond each.
    expect((cpuMicros() - c0) / 1000).toBeLessThan(2000);
  });

  it('costs little per request with the most patterns on the longest User-Agent', async () => {
    // 32 allow and 32 deny patterns, none matching, on a 16 KiB User-Agent: each list is one
    // program, so the header is scanned twice, not 64 times.
    const words = ['googlebot', 'bingbot', 'slurp', 'duckduckbot', 'baiduspider', 'yandexbot', 'sogou', 'exabot', 'facebot', 'ia_archiver'];
    const allow = Array.from({ length: 32 }, (_, i) => `(?i)^${words[i % 10]}/${i}\\.\\d+`);
    const deny = Array.from({ length: 32 }, (_, i) => `(?i)${words[i % 10]}[ /-]v${i}`);
    expect(userAgentFilterCostProblems(allow, deny)).toEqual([]);
    const s = stageFor(userAgentFilterStage, { user_agent_filter: { enabled: true, allow, deny } })!;
    // The same User-Agents through one allow and one deny pattern: the two scans every request pays.
    const two = stageFor(userAgentFilterStage, { user_agent_filter: { enabled: true, allow: [allow[0]!], deny: [deny[0]!] } })!;
    const chars = 'abcdefghijklmnopqrstuvwxyz0123456789/ .;()-';
    const ua = (n: number) => Array.from({ length: n }, () => chars[Math.floor(Math.random() * chars.length)]).join('');
    // CPU ms of each request (test/support/cpu-time.ts): wall time also counts the waits for a
    // core of a busy box.
    const run = async (stage: typeof s, n: number, count: number) => {
      const times: number[] = [];
      for (let i = 0; i < count; i++) {
        const state = makeState({ headers: ['User-Agent', ua(n)] });
        const c0 = cpuMicros();
        const out = await stage.onRequest!(state);
        times.push((cpuMicros() - c0) / 1000);
        expect(out).toBeNull();
      }
      return times;
    };
    const long = await run(s, 16_384, 40);
    const first = long.shift()!;
    const short = (await run(s, 120, 400)).sort((a, b) => a - b);
    long.sort((a, b) => a - b);
    await run(two, 16_384, 1);
    const twoLong = (await run(two, 16_384, 39)).sort((a, b) => a - b);
    const median = (xs: number[]) => xs[xs.length >> 1]!;
    console.log(
      `user_agent_filter, 64 patterns: first 16 KiB request ${first.toFixed(1)} ms of CPU (builds the DFAs), then median ${median(long).toFixed(3)} ms, max ${long.at(-1)!.toFixed(2)} ms; 120 bytes: median ${median(short).toFixed(4)} ms; 2 patterns, 16 KiB: median ${median(twoLong).toFixed(3)} ms`,
    );
    // Measured ~5–30 ms, then ~0.2–0.4 ms (1.3–1.5 times the two patterns'); pattern by pattern
    // it was ~6–12 ms, and a backtracking or thrashing engine would take seconds. In CPU time a
    // busy box adds little, so the bounds leave room for a slower box and no more than that.
    expect(first).toBeLessThan(1000);
    expect(median(long)).toBeLessThan(5);
    expect(median(long)).toBeLessThan(4 * median(twoLong));
    expect(median(short)).toBeLessThan(0.5);
  }, 60_000); // ~0.7 s of CPU, as above

  it('answers 403 with ERR_WARREN_7101', async () => {
    const s = stageFor(userAgentFilterStage, { user_agent_filter: { enabled: true, allow: [], deny: ['x'] } })!;
    const out = (await s.onRequest!(makeState({ headers: ['User-Agent', 'x'] })))!;
    expect(out.status).toBe(403);
    expect(out.headers!['warren-error-code']).toBe('ERR_WARREN_7101');
  });

  it('refuses a route whose pattern does not compile under RE2', () => {
    for (const bad of ['(', 'bot(?=x)', '(a)\\1']) {
      expect(() => stageFor(userAgentFilterStage, { user_agent_filter: { enabled: true, allow: [bad], deny: [] } })).toThrow(/user_agent_filter: .* is not a valid pattern: invalid RE2 pattern/);
    }
  });
});
