import { describe, expect, it } from 'vitest';
import { trafficPolicyStage } from './index.js';
import { CONFIG, deps, EDGE, request, route } from './testing.js';
import type { RateLimiter } from '../pipeline/types.js';
import { rateLimitCost, validateTrafficPolicy, type RateLimitAction } from '@warren/shared';
import { cpuMicros, fastestCpuMsAsync, machineSlowdown } from '../../../../test/support/cpu-time.js';

/**
 * Per-request cost of the stage for a policy with one expression and one rate-limit action,
 * with a limiter that answers at once (the Redis round trip is not ours to measure here).
 */
describe('traffic policy cost', () => {
  it('one expression + one rate-limit action', async () => {
    const limiter: RateLimiter = { hit: async () => ({ limited: false, retryAfterSeconds: 0 }) };
    const s = trafficPolicyStage(
      route({ inbound: [{ expressions: ["req.url.path.startsWith('/api')"], actions: [{ type: 'rate-limit', config: { name: 'api', algorithm: 'sliding_window', capacity: 1_000_000_000, rate: '60s', bucket_key: ['conn.client_ip'] } }] }] }),
      EDGE,
      CONFIG,
      deps(limiter),
    )!;
    const reqs = Array.from({ length: 1000 }, (_, i) => request({ ip: `10.0.${i >> 8}.${i & 255}` }));
    const N = 50_000;
    for (let i = 0; i < 10_000; i++) await s.onRequest!(reqs[i % 1000]!); // warm-up
    // CPU time (test/support/cpu-time.ts): wall time also counts the waits for a core of a busy box.
    const c0 = cpuMicros();
    for (let i = 0; i < N; i++) {
      const r = reqs[i % 1000]!;
      r.vars = {};
      await s.onRequest!(r);
    }
    const us = (cpuMicros() - c0) / N;
    // Also: an expression only (no limiter call), the synchronous path.
    const s2 = trafficPolicyStage(route({ inbound: [{ expressions: ["req.url.path.startsWith('/nope')"], actions: [{ type: 'deny' }] }] }), EDGE, CONFIG, deps())!;
    const c1 = cpuMicros();
    for (let i = 0; i < N; i++) s2.onRequest!(reqs[i % 1000]!);
    const us2 = (cpuMicros() - c1) / N;
    console.log(`traffic policy per request: ${us.toFixed(2)} µs of CPU (1 expression + rate-limit, immediate limiter); ${us2.toFixed(2)} µs (1 expression, no match)`);
    expect(us).toBeLessThan(50);
  });

  it("a rate-limit keyed on ten 16 KiB header values runs within its cost estimate (the charge that bounds how many a policy holds)", async () => {
    const limiter: RateLimiter = { hit: async () => ({ limited: false, retryAfterSeconds: 0 }) };
    const doc = { inbound: [{ actions: [{ type: 'rate-limit', config: { name: 'big', algorithm: 'sliding_window', capacity: 1_000_000_000, rate: '60s', bucket_key: Array(10).fill("getReqHeader('a')") } }] }] };
    const estimateNs = rateLimitCost((validateTrafficPolicy(doc).inbound[0]!.actions[0] as RateLimitAction).config);
    const s = trafficPolicyStage(route(doc), EDGE, CONFIG, deps(limiter))!;
    const r = request({ headers: ['Host', 'a.test', 'a', 'b'.repeat(16 * 1024)] });
    // CPU time, the fastest of 9 batches of 5 runs (test/support/cpu-time.ts): with two full test
    // runs at once on this 2-core box, the fastest wall-clock batch took 4.1 times the estimate;
    // CPU time stays near what a run takes alone (0.9 times the estimate alone, up to 1.25 beside
    // two test runs and four busy loops).
    const slowdown = machineSlowdown();
    const best =
      (await fastestCpuMsAsync(
        async () => {
          r.vars = {};
          await s.onRequest!(r);
        },
        { runs: 9, reps: 5, warmup: 5 },
      )) * 1e6;
    console.log(`rate-limit, ten 16 KiB header values: ${(best / 1000).toFixed(0)} µs of CPU per run (estimate ${(estimateNs / 1000).toFixed(0)} µs; box ${slowdown.toFixed(2)} times slower than the calibration)`);
    // The estimates are calibrated on this kind of box: 2.5 times the estimate leaves room for a
    // loaded one (whose caches other processes share), and a slower box raises the bound with it;
    // code 3 times slower fails.
    expect(best).toBeLessThan(2.5 * estimateNs * slowdown);
  });
});
