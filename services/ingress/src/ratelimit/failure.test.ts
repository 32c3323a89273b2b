import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import type { RateLimitResult } from '../pipeline/types.js';
import { RedisSlidingWindowLimiter, STORE_ERROR_CODE } from './redis.js';
import { closedPort, deleteServerKeys, FaultyProxy, handshakeStaller } from './testing.js';

/**
 * Redis failures (performance.md §3 "Redis stall"): the local fallback decides within the
 * timeout, the result says so, metrics count it, and the limiter recovers by itself. Failures
 * are simulated by a TCP proxy in front of the shared Redis, so other test runs are unaffected.
 */
const serverId = `t-fail-${inject('runId')}-${randomBytes(3).toString('hex')}`;
let admin: Redis;
const closers: Array<() => Promise<void>> = [];

async function timed(call: () => Promise<RateLimitResult>): Promise<RateLimitResult & { ms: number }> {
  // The clock starts before the call arms its timeout: started after it, a pause of this
  // process between the two (GC, preemption on a loaded machine) made the timeout look early.
  const t = performance.now();
  const r = await call();
  return { ...r, ms: performance.now() - t };
}

async function metric(registry: Registry, name: string, labels: Record<string, string>): Promise<number> {
  for (const m of await registry.getMetricsAsJSON()) {
    const v = m.values.find((x) => ((x as { metricName?: string }).metricName ?? m.name) === name && Object.entries(labels).every(([k, val]) => x.labels[k] === val));
    if (v) return v.value;
  }
  return 0;
}

async function until(cond: () => Promise<boolean>, ms: number): Promise<number> {
  const t = performance.now();
  while (!(await cond())) {
    if (performance.now() - t > ms) throw new Error(`condition not met within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
  return performance.now() - t;
}

beforeAll(async () => {
  admin = new Redis(inject('redisUrl'));
});

afterAll(async () => {
  for (const c of closers.reverse()) await c();
  await deleteServerKeys(admin, serverId);
  await admin.quit();
});

/**
 * "At once", for limiters given a long timeout (SLOW_TIMEOUT_MS): a wait on Redis would take
 * ≥ 5 s, a decision takes µs; the bound only has to stay clear of a GC pause or a preemption of
 * this process on a loaded CI machine.
 */
const SLOW_TIMEOUT_MS = 5000;
const FAST_MS = 1000;
/** Circuit open (timeoutMs 50): a wait on Redis would take ≥ 50 ms (the timeout, counted from the write). */
const UNDER_TIMEOUT_MS = 49;

describe('RedisSlidingWindowLimiter when Redis fails', () => {
  it('Redis not reachable (closed port): the local limiter decides at once, with the error set and counted', async () => {
    const registry = new Registry();
    const l = new RedisSlidingWindowLimiter({ redis: `redis://127.0.0.1:${await closedPort()}`, serverId, registry, timeoutMs: SLOW_TIMEOUT_MS });
    closers.push(() => l.close());
    const results = [];
    for (let i = 0; i < 5; i++) results.push(await timed(() => l.hit('k', 3, 60)));
    expect(results.map((r) => r.limited)).toEqual([false, false, false, true, true]);
    for (const r of results) {
      expect(r.error).toEqual({ code: STORE_ERROR_CODE, message: expect.stringMatching(/rate-limit store unavailable \(Redis is not connected\)/) });
      expect(r.ms).toBeLessThan(FAST_MS);
    }
    expect(results[3]!.retryAfterSeconds).toBeGreaterThanOrEqual(1);
    expect(await metric(registry, 'warren_ingress_ratelimit_fallback_total', { reason: 'unavailable' })).toBe(5);
    expect(await metric(registry, 'warren_ingress_ratelimit_decisions_total', { result: 'limited' })).toBe(2);
    expect(await metric(registry, 'warren_ingress_ratelimit_decisions_total', { result: 'admitted' })).toBe(3);
  });

  it.each(['pipe', 'ioredis'] as const)('Redis accepts but stalls in the handshake (%s): the connection is dropped after 1 s and the next one serves', async (transport) => {
    // Without a deadline on the handshake, the limiter stayed `connecting` (falling back) until
    // TCP keepalive gave up, minutes later.
    const staller = await handshakeStaller(inject('redisUrl'));
    closers.push(() => staller.close());
    // The clock starts before the constructor, which (pipe) connects and arms the 1 s handshake
    // deadline at once: started after it, a pause of this process in between made the drop look early.
    const t = performance.now();
    const l = new RedisSlidingWindowLimiter({ redis: staller.url, serverId, transport });
    closers.push(() => l.close());
    await new Promise((r) => setTimeout(r, 200));
    // Still on the stalled first connection (unless this process itself stalled past the 1 s
    // deadline meanwhile, which a loaded machine can do): the fallback decides.
    if (staller.connections() === 1) expect((await l.hit('handshake', 5, 60)).error?.code).toBe(STORE_ERROR_CODE);
    else console.log(`handshake stall (${transport}): the first connection was already dropped when checked`);
    await l.ready(15_000);
    expect(performance.now() - t).toBeGreaterThanOrEqual(900);
    expect(staller.connections()).toBe(2);
    // Redis decides on the second connection. Polled: one call gets 50 ms (with ioredis an
    // EVALSHA, and an EVAL too when Redis does not know the script yet), which a loaded machine
    // does not always give.
    await until(async () => !(await l.hit('handshake', 5, 60)).error, 10_000);
  }, 40_000);

  it('Redis stalls (connection open, no answers): fallback within timeoutMs, circuit opens, then recovers when Redis answers again', async () => {
    const url = new URL(inject('redisUrl'));
    const proxy = await new FaultyProxy({ host: url.hostname, port: Number(url.port || 6379) }).start();
    closers.push(() => proxy.close());
    const registry = new Registry();
    const l = new RedisSlidingWindowLimiter({ redis: proxy.url, serverId, registry, timeoutMs: 50, breaker: { threshold: 3, openMs: 1000 } });
    closers.push(() => l.close());
    await l.ready();
    // Redis decides first. Polled: one call gets 50 ms, which a loaded machine does not always
    // give; a success closes the circuit again, and the fallbacks below are counted from here.
    await until(async () => !(await l.hit('k', 1000, 60)).error, 10_000);
    const base = { timeout: await metric(registry, 'warren_ingress_ratelimit_fallback_total', { reason: 'timeout' }), open: await metric(registry, 'warren_ingress_ratelimit_fallback_total', { reason: 'circuit_open' }) };
    const fallbacks = async (reason: 'timeout' | 'circuit_open') => (await metric(registry, 'warren_ingress_ratelimit_fallback_total', { reason })) - (reason === 'timeout' ? base.timeout : base.open);

    proxy.stall();
    const slow = [];
    for (let i = 0; i < 3; i++) slow.push(await timed(() => l.hit('k', 1000, 60)));
    for (const r of slow) {
      expect(r.limited).toBe(false);
      expect(r.error).toEqual({ code: STORE_ERROR_CODE, message: expect.stringMatching(/did not answer within 50 ms/) });
      expect(r.ms).toBeGreaterThanOrEqual(49);
      // Each: only that it did not wait for Redis to answer again (it would until resume() below);
      // a stall of this process on a loaded machine can delay any one call by hundreds of ms.
      expect(r.ms).toBeLessThan(2_000);
    }
    // A stalled Redis costs a call the timeout plus a tick (not twice the timeout, the rule for a
    // Redis that answers slowly): the quickest of the three shows it, a stall of this process
    // would have to delay all three to hide it.
    console.log(`stall: calls given up after ${slow.map((r) => r.ms.toFixed(1)).join(', ')} ms (timeoutMs 50)`);
    expect(Math.min(...slow.map((r) => r.ms))).toBeLessThan(2 * 50);
    // Three timeouts opened the circuit: no more waiting on Redis (each of five calls says so, and
    // the quickest is under the timeout; a GC pause or a preemption may delay any one of them).
    const expectCircuitOpen = async () => {
      const calls = [];
      for (let i = 0; i < 5; i++) calls.push(await timed(() => l.hit('k', 1000, 60)));
      for (const r of calls) expect(r.error?.message).toMatch(/failed repeatedly/);
      expect(Math.min(...calls.map((r) => r.ms))).toBeLessThan(UNDER_TIMEOUT_MS);
    };
    await expectCircuitOpen();
    expect(await fallbacks('timeout')).toBe(3);
    expect(await fallbacks('circuit_open')).toBe(5);

    // Still stalled after a second: one request probes (and times out), the circuit opens again.
    await new Promise((r) => setTimeout(r, 1050));
    const probe = await timed(() => l.hit('k', 1000, 60));
    expect(probe.error?.message).toMatch(/did not answer/);
    await expectCircuitOpen();
    expect(await fallbacks('timeout')).toBe(4);
    expect(await fallbacks('circuit_open')).toBe(10);

    proxy.resume();
    const recovery = await until(async () => !(await l.hit('k', 1000, 60)).error, 10_000);
    // The first probe once the circuit's second is over decides it. On a loaded machine that probe
    // may itself miss its 50 ms (and open the circuit for another second): each such probe is
    // counted, and allowed its second.
    const missedProbes = (await fallbacks('timeout')) - 4;
    console.log(`stall: recovered ${recovery.toFixed(0)} ms after Redis answered again (circuit open 1 s; probes that missed 50 ms: ${missedProbes})`);
    expect(recovery).toBeLessThan(2000 + missedProbes * 1100);
    expect(await metric(registry, 'warren_ingress_ratelimit_redis_seconds_count', {})).toBeGreaterThanOrEqual(2);
  }, 30_000);

  it.each(['pipe', 'ioredis'] as const)('a connection gone silent without a reset (blackholed) is dropped after staleMs and made again: Redis decides again by itself (%s)', async (transport) => {
    const url = new URL(inject('redisUrl'));
    const proxy = await new FaultyProxy({ host: url.hostname, port: Number(url.port || 6379) }).start();
    closers.push(() => proxy.close());
    const registry = new Registry();
    const l = new RedisSlidingWindowLimiter({ redis: proxy.url, serverId, registry, transport, timeoutMs: 50, staleMs: 400, breaker: { threshold: 3, openMs: 100 } });
    closers.push(() => l.close());
    await l.ready();
    // Redis decides before the blackhole. Polled: one call gets 50 ms (through the proxy; with
    // ioredis an EVALSHA, and an EVAL too when Redis does not know the script yet), which a loaded
    // machine does not always give; calls that timed out may even have had the connection made
    // again (staleMs counts from the start).
    await until(async () => !(await l.hit('bh', 1000, 60)).error, 10_000);
    const timeoutsBefore = await metric(registry, 'warren_ingress_ratelimit_fallback_total', { reason: 'timeout' });
    proxy.blackhole();
    // Before: the pipe stayed `ready` on the dead socket (until TCP gave up, ~15 min), every call
    // falling back. Bounded by seconds, not by staleMs: a loaded machine may also let the calls on
    // the new connection miss their 50 ms a few times.
    const recovery = await until(async () => !(await l.hit('bh', 1000, 60)).error, 15_000);
    console.log(`blackholed connection (${transport}): Redis decides again ${recovery.toFixed(0)} ms later (staleMs 400)`);
    // The blackhole did cost calls their timeout (these are the calls it was detected by).
    expect(await metric(registry, 'warren_ingress_ratelimit_fallback_total', { reason: 'timeout' })).toBeGreaterThan(timeoutsBefore);
  }, 40_000);

  it('a lost connection does not open the breaker: Redis decides again as soon as the pipe has reconnected', async () => {
    const url = new URL(inject('redisUrl'));
    const target = { host: url.hostname, port: Number(url.port || 6379) };
    const proxy = await new FaultyProxy(target).start();
    closers.push(() => proxy.close());
    const registry = new Registry();
    // A long timeout: only the lost connection's failures may reach the breaker here, not calls
    // that miss 50 ms on a loaded machine (three of those would rightly open it).
    const l = new RedisSlidingWindowLimiter({ redis: proxy.url, serverId, registry, timeoutMs: SLOW_TIMEOUT_MS, breaker: { threshold: 3, openMs: 5000 } });
    closers.push(() => l.close());
    await l.ready();
    // A batch in flight when the connection drops (CLIENT KILL, a Redis restart): each call fails at once.
    const batch = Array.from({ length: 20 }, () => l.hit('lost', 1000, 60));
    proxy.retarget(target);
    const results = await Promise.all(batch);
    expect(results.some((r) => r.error !== undefined)).toBe(true);
    // Before: those failures counted as consecutive ones and the breaker skipped Redis for openMs (here 5 s).
    // (An open circuit would also show as circuit_open fallbacks below.)
    const recovery = await until(async () => !(await l.hit('lost', 1000, 60)).error, 10_000);
    console.log(`lost connection: Redis decides again ${recovery.toFixed(0)} ms later`);
    expect(await metric(registry, 'warren_ingress_ratelimit_fallback_total', { reason: 'circuit_open' })).toBe(0);
  }, 15_000);

  it('close() returns within about a second while Redis is silent (ioredis transport; the pipe closes at once)', async () => {
    const url = new URL(inject('redisUrl'));
    const proxy = await new FaultyProxy({ host: url.hostname, port: Number(url.port || 6379) }).start();
    closers.push(() => proxy.close());
    for (const transport of ['ioredis', 'pipe'] as const) {
      const l = new RedisSlidingWindowLimiter({ redis: proxy.url, serverId, transport });
      await l.ready();
      // Silent both ways and never closed, as a Redis under kill -STOP.
      proxy.blackhole();
      const t = performance.now();
      await l.close();
      // Before: QUIT waited for Redis's reply, holding a SIGTERM shutdown for as long as Redis stalled.
      expect(performance.now() - t, transport).toBeLessThan(2500);
    }
  }, 15_000);

  it('Redis goes away and comes back: not-connected decisions are immediate, the client reconnects and Redis decides again', async () => {
    const url = new URL(inject('redisUrl'));
    const proxy = await new FaultyProxy({ host: url.hostname, port: Number(url.port || 6379) }).start();
    closers.push(() => proxy.close());
    const registry = new Registry();
    const l = new RedisSlidingWindowLimiter({ redis: proxy.url, serverId, registry, timeoutMs: SLOW_TIMEOUT_MS });
    closers.push(() => l.close());
    await l.ready();
    // L = 2 in Redis: used up before the outage.
    expect((await l.hit('gone', 2, 60)).limited).toBe(false);
    expect((await l.hit('gone', 2, 60)).limited).toBe(false);
    expect((await l.hit('gone', 2, 60)).limited).toBe(true);

    proxy.down();
    await until(async () => l.status !== 'ready', 2000);
    const during = [];
    for (let i = 0; i < 4; i++) during.push(await timed(() => l.hit('gone', 2, 60)));
    // The fallback knows nothing of Redis' counts: it admits its own L (fail-open, bounded).
    expect(during.map((r) => r.limited)).toEqual([false, false, true, true]);
    for (const r of during) {
      expect(r.error?.code).toBe(STORE_ERROR_CODE);
      expect(r.ms).toBeLessThan(FAST_MS);
    }

    proxy.up();
    const recovery = await until(async () => !(await l.hit('gone', 2, 60)).error, 15_000);
    console.log(`outage: recovered ${recovery.toFixed(0)} ms after Redis accepted connections again`);
    // Back on Redis, whose bucket is still full.
    const after = await l.hit('gone', 2, 60);
    expect(after.error).toBeUndefined();
    expect(after.limited).toBe(true);
    expect(await metric(registry, 'warren_ingress_ratelimit_fallback_total', { reason: 'unavailable' })).toBeGreaterThanOrEqual(4);
  }, 15_000);

  it.each([
    ['log', 10],
    ['counter', 20_000],
  ] as const)('a Redis error reply (script cannot run, %s mode) falls back with the error message, and never rejects', async (mode, capacity) => {
    // A client given by the caller: used as is, not closed by the limiter.
    const client = new Redis(inject('redisUrl'), { enableOfflineQueue: false });
    closers.push(async () => void (await client.quit()));
    const l = new RedisSlidingWindowLimiter({ redis: client, serverId, breaker: { threshold: 100 } });
    await l.ready();
    // A key of the wrong type makes LINDEX or HMGET fail inside the script.
    const { digestKey, redisKey } = await import('./keys.js');
    const rk = redisKey(serverId, 60, digestKey(`wrongtype-${mode}`), mode);
    await admin.set(rk, 'x', 'EX', 60);
    const r = await l.hit(`wrongtype-${mode}`, capacity, 60);
    expect(r.limited).toBe(false);
    expect(r.error?.message).toMatch(/Redis error: .*WRONGTYPE/);
    await l.close();
    expect(client.status).toBe('ready');
  });
});
