import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { RedisSlidingWindowLimiter } from './redis.js';
import { deleteServerKeys } from './testing.js';

/**
 * Atomicity and scope, on Redis' own clock (TIME): the processes of one ingress server share a
 * bucket and together admit exactly L; different servers count apart. In both modes: `exact`
 * (capacities ≤ exactMax, the default 10,000: the sliding log) and `counter` (exactMax 0).
 */
const tag = `${inject('runId')}-${randomBytes(3).toString('hex')}`;
const serverA = `t-conc-a-${tag}`;
const serverB = `t-conc-b-${tag}`;
let admin: Redis;
const limiters: RedisSlidingWindowLimiter[] = [];

type Transport = 'pipe' | 'ioredis' | 'ioredis+autopipelining';
type Mode = 'exact' | 'counter';

function limiter(serverId: string, transport: Transport = 'pipe', mode: Mode = 'exact'): RedisSlidingWindowLimiter {
  // A URL, so each instance owns a separate connection, like separate processes.
  const l = new RedisSlidingWindowLimiter({
    redis: inject('redisUrl'),
    serverId,
    transport: transport === 'pipe' ? 'pipe' : 'ioredis',
    autoPipelining: transport === 'ioredis+autopipelining',
    timeoutMs: 5_000,
    exactMax: mode === 'exact' ? undefined : 0,
  });
  limiters.push(l);
  return l;
}

/** Waits, if needed, so that at least `needMs` remain in the current window of `windowSeconds` (Redis clock). */
async function roomInWindow(windowSeconds: number, needMs: number): Promise<void> {
  const [s, us] = await admin.time();
  const now = Number(s) * 1000 + Math.floor(Number(us) / 1000);
  const left = windowSeconds * 1000 - (now % (windowSeconds * 1000));
  if (left < needMs) await new Promise((r) => setTimeout(r, left + 5));
}

/** `workers` concurrent loops on one limiter, `perWorker` hits each; returns the admitted count. */
async function hammer(l: RedisSlidingWindowLimiter, key: string, L: number, W: number, workers: number, perWorker: number): Promise<{ admitted: number; errors: number }> {
  let admitted = 0;
  let errors = 0;
  await Promise.all(
    Array.from({ length: workers }, async () => {
      for (let i = 0; i < perWorker; i++) {
        const r = await l.hit(key, L, W);
        if (r.error) errors++;
        if (!r.limited) admitted++;
      }
    }),
  );
  return { admitted, errors };
}

beforeAll(async () => {
  admin = new Redis(inject('redisUrl'));
});

afterAll(async () => {
  await deleteServerKeys(admin, serverA);
  await deleteServerKeys(admin, serverB);
  await Promise.all(limiters.map((l) => l.close()));
  await admin.quit();
});

describe('RedisSlidingWindowLimiter, several processes', () => {
  it.each([
    [100, 'pipe', 'exact'],
    [10_000, 'pipe', 'exact'],
    [10_000, 'ioredis', 'exact'],
    [10_000, 'ioredis+autopipelining', 'exact'],
    [100, 'pipe', 'counter'],
    [10_000, 'pipe', 'counter'],
    [10_000, 'ioredis', 'counter'],
  ] as Array<[number, Transport, Mode]>)('three instances of one server, 200 concurrent requests each, one key: exactly L = %i admitted (transport %s, %s mode)', async (L, transport, mode) => {
    const W = 600;
    const ls = [limiter(serverA, transport, mode), limiter(serverA, transport, mode), limiter(serverA, transport, mode)];
    await Promise.all(ls.map((l) => l.ready()));
    await roomInWindow(W, 10_000);
    const key = `hot-${L}-${transport}-${mode}`;
    const perWorker = Math.ceil((1.5 * L) / 600) + 1;
    const results = await Promise.all(ls.map((l) => hammer(l, key, L, W, 200, perWorker)));
    const admitted = results.reduce((a, r) => a + r.admitted, 0);
    console.log(`[${mode}] 3 × 200 concurrent, L=${L} (${transport}): ${3 * 200 * perWorker} requests, ${admitted} admitted (${results.map((r) => r.admitted).join(' + ')})`);
    expect(results.every((r) => r.errors === 0)).toBe(true);
    expect(admitted).toBe(L);
  }, 60_000);

  it.each(['exact', 'counter'] as Mode[])('two servers count apart: each admits L on the same key (%s mode)', async (mode) => {
    const L = 50;
    const W = 600;
    const a = limiter(serverA, 'pipe', mode);
    const b = limiter(serverB, 'pipe', mode);
    await Promise.all([a.ready(), b.ready()]);
    await roomInWindow(W, 10_000);
    const [ra, rb] = await Promise.all([hammer(a, `shared-key-${mode}`, L, W, 20, 10), hammer(b, `shared-key-${mode}`, L, W, 20, 10)]);
    expect(ra.admitted).toBe(L);
    expect(rb.admitted).toBe(L);
  });

  it.each(['exact', 'counter'] as Mode[])("on Redis' own clock, a probe at exactly +Retry-After is admitted (W = 1 s, %s mode)", async (mode) => {
    const l = limiter(serverA, 'pipe', mode);
    await l.ready();
    let probes = 0;
    for (let round = 0; round < 3; round++) {
      const key = `probe-${round}-${mode}`;
      let r = await l.hit(key, 3, 1);
      while (!r.limited) r = await l.hit(key, 3, 1);
      expect(r.retryAfterSeconds).toBeGreaterThanOrEqual(1);
      expect(r.retryAfterSeconds).toBeLessThanOrEqual(2);
      await new Promise((res) => setTimeout(res, r.retryAfterSeconds * 1000));
      expect((await l.hit(key, 3, 1)).limited).toBe(false);
      probes++;
    }
    expect(probes).toBe(3);
  }, 15_000);
});
