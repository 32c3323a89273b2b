import { describe, expect, it } from 'vitest';
import { digestKey, redisKey, redisKeyPattern } from './keys.js';
import { LocalSlidingWindowLimiter } from './local.js';
import { fakeClock, seededRandom } from './testing.js';
import { admits, logAdmits, logRecord, logRetryAfterMs, retryAfterMs, retryAfterSeconds, viewAt, type WindowView } from './window.js';

const W = 60_000;
const view = (prev: number, cur: number, elapsed: number): WindowView => ({ window: 10, prev, cur, elapsed, ahead: 0 });

/** The real-valued formula as performance.md §3 writes it, in ms. */
function docFormula(P: number, C: number, e: number, L: number, w: number): number {
  return C < L ? Math.max(0, w * (1 - (L - 1 - C) / P) - e) : w - e + w * (1 - (L - 1) / C);
}

/** The state after waiting d ms from view v with nothing admitted meanwhile. */
function after(v: WindowView, d: number, w: number): WindowView {
  const now = v.window * w + v.elapsed + d;
  return viewAt({ window: v.window, prev: v.prev, cur: v.cur }, now, w);
}

describe('window math', () => {
  it('rolls the stored state forward', () => {
    const s = { window: 5, prev: 7, cur: 3 };
    expect(viewAt(s, 5 * W + 10, W)).toEqual({ window: 5, prev: 7, cur: 3, elapsed: 10, ahead: 0 });
    expect(viewAt(s, 6 * W + 10, W)).toEqual({ window: 6, prev: 3, cur: 0, elapsed: 10, ahead: 0 });
    expect(viewAt(s, 7 * W, W)).toEqual({ window: 7, prev: 0, cur: 0, elapsed: 0, ahead: 0 });
    expect(viewAt(undefined, 7 * W + 1, W)).toEqual({ window: 7, prev: 0, cur: 0, elapsed: 1, ahead: 0 });
    // Clock stepped back 2 s into window 4: read window 5 from its start, and say how far that is.
    expect(viewAt(s, 5 * W - 2000, W)).toEqual({ window: 5, prev: 7, cur: 3, elapsed: 0, ahead: 2000 });
  });

  it('admits while P·(1 − e/W) + C + 1 ≤ L', () => {
    expect(admits(view(0, 99, 0), 100, W)).toBe(true);
    expect(admits(view(0, 100, 0), 100, W)).toBe(false);
    // P = 100 at e = W/2 weighs 50: C = 49 fits (50 + 49 + 1 = 100), C = 50 does not.
    expect(admits(view(100, 49, W / 2), 100, W)).toBe(true);
    expect(admits(view(100, 50, W / 2), 100, W)).toBe(false);
    // Exact at large values (products below 2^53).
    expect(admits(view(2_000_000_000, 0, 1), 2_000_000_000, 86_400_000)).toBe(true);
    expect(admits(view(2_000_000_000, 1, 0), 2_000_000_000, 86_400_000)).toBe(false);
  });

  it('retry-after: the two cases of the formula, worked by hand', () => {
    // C < L: P = 100, C = 40, L = 100, e = 20 s: wait until 100·(1 − x/60) ≤ 59, x ≥ 24.6 s → 4.6 s.
    expect(retryAfterMs(view(100, 40, 20_000), 100, W)).toBe(4_600);
    expect(retryAfterSeconds(4_600)).toBe(5);
    // C ≥ L: C = 100, e = 30 s: 30 s to the boundary, then 100·(1 − e′/60) ≤ 99 → e′ ≥ 0.6 s.
    expect(retryAfterMs(view(0, 100, 30_000), 100, W)).toBe(30_600);
    expect(retryAfterSeconds(30_600)).toBe(31);
    // L = 1: the one request of the window blocks until the next window is over.
    expect(retryAfterMs(view(0, 1, 0), 1, W)).toBe(2 * W);
    // Whole seconds, at least 1.
    expect(retryAfterSeconds(1)).toBe(1);
    expect(retryAfterSeconds(1000)).toBe(1);
    expect(retryAfterSeconds(1001)).toBe(2);
    // A state from a later window (clock stepped back) adds the distance to it.
    expect(retryAfterMs({ ...view(0, 100, 0), ahead: 2000 }, 100, W)).toBe(2000 + W + 600);
  });

  it('retry-after is the exact first admitted millisecond, never early, and agrees with the documented formula', () => {
    const rnd = seededRandom(42);
    for (let i = 0; i < 20_000; i++) {
      const w = [1000, 10_000, 60_000][i % 3]!;
      const L = 1 + Math.floor(rnd() * (i % 2 ? 10 : 1000));
      const P = Math.floor(rnd() * 2 * L);
      const C = Math.floor(rnd() * 1.5 * L);
      const e = Math.floor(rnd() * w);
      const v = view(P, C, e);
      const d = retryAfterMs(v, L, w);
      if (admits(v, L, w)) {
        expect(d).toBe(0);
        continue;
      }
      expect(d).toBeGreaterThan(0);
      expect(admits(after(v, d, w), L, w), `admitted at +${d} ms (P=${P} C=${C} e=${e} L=${L} W=${w})`).toBe(true);
      expect(admits(after(v, d - 1, w), L, w), `not admitted a ms earlier (P=${P} C=${C} e=${e} L=${L} W=${w})`).toBe(false);
      // The doc's real-valued formula, rounded up to ms, is the same instant.
      expect(d).toBe(Math.ceil(docFormula(P, C, e, L, w) - 1e-9));
      // Whole seconds rounded up: admitted at +Retry-After, and at most 1 s late.
      const s = retryAfterSeconds(d);
      expect(Number.isInteger(s) && s >= 1).toBe(true);
      expect(admits(after(v, s * 1000, w), L, w)).toBe(true);
      expect(s * 1000 - d).toBeLessThan(1000);
    }
  });
});

describe('exact log', () => {
  it('admits iff fewer than L admissions lie in (now − W, now], waits exactly until the L-th most recent leaves, keeps L entries', () => {
    const rnd = seededRandom(5);
    for (let run = 0; run < 100; run++) {
      const L = 1 + Math.floor(rnd() * 20);
      const w = [1000, 60_000][run % 2]!;
      const log: number[] = [];
      // Every admission, independently of the log: the brute-force oracle.
      const all: number[] = [];
      const inWindow = (now: number) => all.filter((a) => a > now - w && a <= now).length;
      let t = 0;
      for (let i = 0; i < 300; i++) {
        t += Math.floor(rnd() * ((3 * w) / L));
        const ok = logAdmits(log, t, L, w);
        expect(ok).toBe(inWindow(t) < L);
        const d = logRetryAfterMs(log, t, L, w);
        if (ok) {
          expect(d).toBe(0);
          logRecord(log, t, L);
          all.push(t);
        } else {
          // With nothing admitted meanwhile: admitted at +d, not at +d − 1.
          expect(d).toBeGreaterThan(0);
          expect(inWindow(t + d)).toBeLessThan(L);
          expect(inWindow(t + d - 1)).toBe(L);
          expect(logAdmits(log, t + d, L, w)).toBe(true);
          expect(logAdmits(log, t + d - 1, L, w)).toBe(false);
        }
        expect(log.length).toBeLessThanOrEqual(L);
        expect(log).toEqual(all.slice(-L).reverse());
      }
    }
  });

  it('a clock stepping back pushes the head time again (sorted, the strict reading); a lower capacity reads the L-th entry', () => {
    const log: number[] = [];
    logRecord(log, 5000, 3);
    logRecord(log, 4000, 3);
    expect(log).toEqual([5000, 5000]);
    expect(logAdmits(log, 4000, 2, W)).toBe(false);
    expect(logRetryAfterMs(log, 4000, 2, W)).toBe(W + 1000);
    // Capacity 3 → 1: the newest entry decides; a record trims to the new capacity.
    logRecord(log, 6000, 3);
    expect(log).toEqual([6000, 5000, 5000]);
    expect(logRetryAfterMs(log, 7000, 1, W)).toBe(W - 1000);
    logRecord(log, 6000 + W, 1);
    expect(log).toEqual([6000 + W]);
  });
});

describe('bucket keys', () => {
  it('digests arbitrary keys to 27 characters and scopes them by server and window', () => {
    const long = 'h'.repeat(100_000);
    expect(digestKey(long)).toMatch(/^[A-Za-z0-9_-]{27}$/);
    expect(digestKey('a')).not.toBe(digestKey('b'));
    expect(redisKey('srv-1', 60, digestKey('a'), 'counter')).toBe(`warren:rl:srv-1:60:${digestKey('a')}`);
    expect(redisKey('srv-1', 60, digestKey('a'), 'log')).toBe(`warren:rl:srv-1:60:L:${digestKey('a')}`);
    expect(redisKeyPattern('a*b')).toBe('warren:rl:a\\*b:*');
    // The pattern covers both modes; no key of one server id and mode is a key of another.
    for (const mode of ['counter', 'log'] as const) expect(redisKey('srv-1', 60, digestKey('a'), mode).startsWith(redisKeyPattern('srv-1').slice(0, -1))).toBe(true);
    const keys = new Set<string>();
    for (const server of ['a', 'a:60', 'a:60:L', 'a:L', '60']) for (const w of [1, 60]) for (const mode of ['counter', 'log'] as const) keys.add(redisKey(server, w, digestKey('k'), mode));
    expect(keys.size).toBe(5 * 2 * 2);
  });
});

describe('LocalSlidingWindowLimiter', () => {
  it('admits L per window, does not count denied requests, and answers retry-after', async () => {
    const clock = fakeClock(1000 * W);
    const l = new LocalSlidingWindowLimiter({ clock: clock.now });
    for (let i = 0; i < 3; i++) expect(await l.hit('k', 3, 60)).toEqual({ limited: false, retryAfterSeconds: 0 });
    clock.advance(30_000);
    // Denied requests, many of them: they must not extend the block.
    for (let i = 0; i < 50; i++) expect(await l.hit('k', 3, 60)).toEqual({ limited: true, retryAfterSeconds: 50 });
    // (W − e) + W·(1 − 2/3) = 30 + 20 s.
    clock.advance(49_999);
    expect((await l.hit('k', 3, 60)).limited).toBe(true);
    clock.advance(1);
    expect((await l.hit('k', 3, 60)).limited).toBe(false);
    // Other keys and other window lengths are other buckets.
    expect((await l.hit('other', 3, 60)).limited).toBe(false);
    expect((await l.hit('k', 3, 120)).limited).toBe(false);
  });

  it('keeps at most maxKeys buckets, forgetting the least recently used', async () => {
    const clock = fakeClock(1000 * W);
    const l = new LocalSlidingWindowLimiter({ clock: clock.now, maxKeys: 100 });
    for (let i = 0; i < 1000; i++) await l.hit(`key-${i}`, 1, 60);
    expect(l.size).toBe(100);
    // key-999 is still held (denied), key-0 was forgotten (admitted again).
    expect((await l.hit('key-999', 1, 60)).limited).toBe(true);
    expect((await l.hit('key-0', 1, 60)).limited).toBe(false);
  });

  it('refuses arguments no policy can produce', async () => {
    const l = new LocalSlidingWindowLimiter();
    await expect(l.hit('k', 0, 60)).rejects.toThrow(RangeError);
    await expect(l.hit('k', 10, 0.5)).rejects.toThrow(RangeError);
  });
});
