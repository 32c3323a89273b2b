import { describe, expect, it } from 'vitest';
import { AppError } from '@warren/shared';
import { createAccountRateLimiter } from './rate-limit.js';

const W = 60_000;
const auth = (accountId: string) => ({ accountId }) as never;

/** The Retry-After seconds of a refusal, or 0 when the request was admitted. */
function attempt(check: (a: never) => void, account: string): number {
  try {
    check(auth(account));
    return 0;
  } catch (err) {
    if (!(err instanceof AppError)) throw err;
    expect(err.code).toBe(8000);
    const h = err.headers?.['Retry-After'];
    expect(h).toMatch(/^[1-9]\d*$/);
    return Number(h);
  }
}

describe('account rate limiter (one replica)', () => {
  it('admits `limit` requests in a window, then refuses with an integer Retry-After that is never early', () => {
    // Windows of 60 s; the counts fill at several offsets, including the boundary cases.
    for (const [offsetMs, limit] of [[5_000, 10], [0, 1], [59_999, 7], [30_000, 1200], [12_345, 3]] as const) {
      let t = 1_700_000_040_000 - (1_700_000_040_000 % W) + offsetMs;
      const rl = createAccountRateLimiter(limit, { now: () => t });
      for (let i = 0; i < limit; i++) expect(attempt(rl.check, 'a')).toBe(0);
      const retry = attempt(rl.check, 'a');
      expect(retry).toBeGreaterThanOrEqual(1);
      // Never early: after Retry-After seconds the request is admitted.
      t += retry * 1000;
      expect(attempt(rl.check, 'a'), `offset ${offsetMs}, limit ${limit}, retry ${retry}`).toBe(0);
    }
  });

  it('Retry-After is never early while the previous window still weighs (random traffic)', () => {
    let seed = 42;
    const rand = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
    for (let round = 0; round < 200; round++) {
      let t = 1_700_000_000_000 + Math.floor(rand() * 10 * W);
      const limit = 1 + Math.floor(rand() * 50);
      const rl = createAccountRateLimiter(limit, { now: () => t });
      let retry = 0;
      while (!(retry = attempt(rl.check, 'a'))) t += Math.floor(rand() * 3_000);
      t += retry * 1000;
      expect(attempt(rl.check, 'a'), `round ${round}`).toBe(0);
    }
  });

  it('a flood of distinct accounts does not reset an active account\'s count', () => {
    const t = 1_700_000_010_000;
    const rl = createAccountRateLimiter(10, { now: () => t, maxAccounts: 100 });
    for (let i = 0; i < 10; i++) expect(attempt(rl.check, 'busy')).toBe(0);
    expect(attempt(rl.check, 'busy')).toBeGreaterThan(0);
    // 1,000 other accounts, ten times the table's room, one request each.
    for (let i = 0; i < 1_000; i++) expect(attempt(rl.check, `flood-${i}`)).toBe(0);
    expect(rl.size).toBeLessThanOrEqual(100);
    expect(attempt(rl.check, 'busy')).toBeGreaterThan(0);
  });

  it('evicts the entries of old windows first', () => {
    let t = 1_700_000_010_000;
    const rl = createAccountRateLimiter(5, { now: () => t, maxAccounts: 3 });
    for (const a of ['old1', 'old2']) attempt(rl.check, a);
    t += 3 * W;
    for (let i = 0; i < 5; i++) attempt(rl.check, 'hot');
    attempt(rl.check, 'new1');
    attempt(rl.check, 'new2');
    expect(rl.size).toBe(3);
    expect(attempt(rl.check, 'hot')).toBeGreaterThan(0);
  });

  it('0 turns the limit off', () => {
    const rl = createAccountRateLimiter(0);
    for (let i = 0; i < 10_000; i++) rl.check(auth('a'));
  });
});
