import { afterAll, describe, expect, it } from 'vitest';
import { AppError, userAgentFilterCostProblems } from '@warren/shared';
import { createUserAgentChecks, LruCache, userAgentFilterKey, type UserAgentChecks } from './user-agent-check.js';
import { botAlternation, hostileUserAgentFilter } from './user-agent-check.testing.js';

/** The user_agent_filter cost check in worker threads: verdicts, limits, time cap, cache. */

const open: UserAgentChecks[] = [];
function checker(opts: Parameters<typeof createUserAgentChecks>[0] = {}): UserAgentChecks {
  const c = createUserAgentChecks(opts);
  open.push(c);
  return c;
}
afterAll(() => Promise.all(open.map((c) => c.close())));

/** The AppError a promise rejects with (null when it resolves). */
async function rejection(p: Promise<unknown>): Promise<AppError | null> {
  try {
    await p;
    return null;
  } catch (err) {
    if (!(err instanceof AppError)) throw err;
    return err;
  }
}

type Filter = ReturnType<typeof hostileUserAgentFilter>;

/** Accepted by the full check, but explored beyond the quick budget: it needs a worker, briefly. */
const MEDIUM = { allow: ['(?i)^curl/\\d+', 'Mozilla/5\\.0 \\(X11;.*'], deny: [] };

describe('LruCache', () => {
  it('keeps the most recently used keys, up to its capacity', () => {
    const c = new LruCache<number>(3);
    c.set('a', 1);
    c.set('b', 2);
    c.set('c', 3);
    expect(c.get('a')).toBe(1); // a is now the most recent; b the least
    c.set('d', 4);
    expect(c.size).toBe(3);
    expect(c.get('b')).toBeUndefined();
    expect([c.get('a'), c.get('c'), c.get('d')]).toEqual([1, 3, 4]);
    c.set('c', 30); // replacing refreshes too
    c.set('e', 5);
    expect(c.get('a')).toBeUndefined();
    expect([c.get('c'), c.get('d'), c.get('e'), c.size]).toEqual([30, 4, 5, 3]);
    expect(() => new LruCache(0)).toThrow();
  });

  it('keys a filter by both lists, keeping patterns and lists apart', () => {
    const keys = [
      userAgentFilterKey(['a', 'b'], []),
      userAgentFilterKey(['a'], ['b']),
      userAgentFilterKey([], ['a', 'b']),
      userAgentFilterKey(['a,b'], []),
      userAgentFilterKey(['ab'], []),
    ];
    expect(new Set(keys).size).toBe(keys.length);
    expect(userAgentFilterKey(['a', 'b'], [])).toBe(keys[0]);
  });
});

describe('user_agent_filter cost check', () => {
  it('finds what userAgentFilterCostProblems finds, in a worker, and answers the same filter again from its cache', async () => {
    const c = checker();
    const h = hostileUserAgentFilter('same', 'allow');
    const expected = userAgentFilterCostProblems(h.allow, h.deny);
    expect(expected.map((p) => p.list)).toEqual(['allow']);
    expect(await c.problems('ac_1', h.allow, h.deny)).toEqual(expected);
    expect(c.stats()).toMatchObject({ runs: 1, cacheHits: 0, workers: 1 });
    expect(await c.problems('ac_1', h.allow, h.deny)).toEqual(expected);
    // The counters prove the cache answered (no second run); no wall-clock bound, which a loaded CI box can overrun.
    expect(c.stats()).toMatchObject({ runs: 1, cacheHits: 1 });
    // Another account's verdict is its own (a cached answer would tell it, by its speed, that
    // someone had saved the same lists).
    expect(await c.problems('ac_2', h.allow, h.deny)).toEqual(expected);
    expect(c.stats()).toMatchObject({ runs: 2, cacheHits: 1 });
    // One pattern too costly alone is named, as before.
    expect(await c.problems('ac_1', ['(?i)bot'], ['ok', 'a[ab]{20}b'])).toEqual(userAgentFilterCostProblems(['(?i)bot'], ['ok', 'a[ab]{20}b']));
    expect(await c.problems('ac_1', MEDIUM.allow, MEDIUM.deny)).toEqual([]);
    expect(c.stats()).toMatchObject({ runs: 4, quick: 0 });
  }, 120_000);

  it('accepts small lists on the spot, without a worker', async () => {
    const c = checker();
    expect(await c.problems('ac_1', ['(?i)curl/', '^$', '(?i)google-images'], ['(?i)google', '[Bb]ing'])).toEqual([]);
    expect(await c.problems('ac_1', [], [])).toEqual([]);
    expect(await c.problems('ac_1', [], ['(?i)badbot'])).toEqual([]);
    expect(c.stats()).toMatchObject({ runs: 0, quick: 3, workers: 0 });
    // Larger lists go to a worker, even when accepted.
    expect(await c.problems('ac_1', [botAlternation('x')], [])).toEqual([]);
    expect(await c.problems('ac_1', ['\\pL+/\\d'], [])).toEqual([]);
    expect(c.stats()).toMatchObject({ runs: 2, quick: 3, workers: 1 });
  });

  it('runs one check per account at a time and queues a bounded number; beyond, 429 with Retry-After', async () => {
    const c = checker({ workers: 1, maxQueued: 1, timeoutMs: 20_000 });
    const [x1, x2, x3, x4] = [1, 2, 3, 4].map((i) => hostileUserAgentFilter(`q${i}`, 'allow')) as [Filter, Filter, Filter, Filter];
    const first = c.problems('ac_a', x1.allow, x1.deny); // runs
    const sameAccount = rejection(c.problems('ac_a', x2.allow, x2.deny));
    const queued = c.problems('ac_b', x3.allow, x3.deny); // waits for the worker
    const overflow = rejection(c.problems('ac_c', x4.allow, x4.deny));
    const shared = c.problems('ac_a', x1.allow, x1.deny); // the account's running check again: shares it
    const otherAccount = rejection(c.problems('ac_d', x1.allow, x1.deny)); // the same lists, another account: its own check (no room)
    const small = c.problems('ac_a', ['(?i)bot'], []); // no worker needed: not limited
    const busy = await sameAccount;
    expect([busy?.code, busy?.status, busy?.headers['Retry-After']]).toEqual([8000, 429, '1']);
    expect(busy?.message).toBe('another user_agent_filter check of this account is running (one at a time); retry in 1 s');
    const full = await overflow;
    expect([full?.code, full?.status, full?.headers['Retry-After']]).toEqual([8000, 429, '2']);
    expect(full?.message).toBe('too many user_agent_filter checks are waiting on this server; retry in 2 s');
    expect((await otherAccount)?.status).toBe(429);
    expect(await small).toEqual([]);
    const [r1, r3, rShared] = await Promise.all([first, queued, shared]);
    expect(r1.map((p) => p.list)).toEqual(['allow']);
    expect(r3.map((p) => p.list)).toEqual(['allow']);
    expect(rShared).toEqual(r1);
    expect(c.stats()).toMatchObject({ runs: 2, queued: 0 });
    // The account's check is over: it may check again.
    expect(await c.problems('ac_a', x2.allow, x2.deny)).toHaveLength(1);
  }, 120_000);

  it('refuses a list whose check runs out of time as too costly to check, and replaces the worker', async () => {
    const c = checker({ workers: 1, timeoutMs: 100 });
    const h = hostileUserAgentFilter('slow');
    expect(await c.problems('ac_1', h.allow, h.deny)).toEqual([{ list: 'allow', message: expect.stringMatching(/^too costly to check: checking the 32 allow patterns took more than 100 ms/) }]);
    expect(c.stats()).toMatchObject({ runs: 1, timeouts: 1, workers: 0 });
    // A new worker takes the next check; a time-out is not kept as a verdict.
    expect(await c.problems('ac_1', MEDIUM.allow, MEDIUM.deny)).toEqual([]);
    expect(c.stats()).toMatchObject({ runs: 2, timeouts: 1, workers: 1 });
    expect(await c.problems('ac_1', h.allow, h.deny)).toEqual([{ list: 'allow', message: expect.stringMatching(/too costly to check/) }]);
    expect(c.stats()).toMatchObject({ runs: 3, timeouts: 2, cacheHits: 0 });
    // The list it was on is named: here the allow list is cheap and deny is not.
    expect(await c.problems('ac_1', ['(?i)bot'], h.deny)).toEqual([{ list: 'deny', message: expect.stringMatching(/^too costly to check: checking the 32 deny patterns/) }]);
  }, 120_000);

  it('close() terminates the workers and refuses further checks with 503', async () => {
    const c = createUserAgentChecks();
    expect(await c.problems('ac_1', MEDIUM.allow, MEDIUM.deny)).toEqual([]);
    expect(c.stats().workers).toBe(1);
    const h = hostileUserAgentFilter('closing', 'allow');
    const running = rejection(c.problems('ac_2', h.allow, h.deny));
    await c.close();
    expect((await running)?.status).toBe(503);
    expect(c.stats().workers).toBe(0);
    expect((await rejection(c.problems('ac_1', ['(?i)x'], [])))?.code).toBe(9002);
  });
});
