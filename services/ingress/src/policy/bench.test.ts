import { describe, expect, it } from 'vitest';
import { trafficPolicyStage } from './index.js';
import { CONFIG, deps, EDGE, request, route } from './testing.js';
import type { RateLimiter } from '../pipeline/types.js';
import { rateLimitCost, validateTrafficPolicy, type RateLimitAction } from '@warren/shared';

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
    const t0 = performance.now();
    for (let i = 0; i < N; i++) {
      const r = reqs[i % 1000]!;
      r.vars = {};
      await s.onRequest!(r);
    }
    const us = ((performance.now() - t0) * 1000) / N;
    // Also: an expression only (no limiter call), the synchronous path.
    const s2 = trafficPolicyStage(route({ inbound: [{ expressions: ["req.url.path.startsWith('/nope')"], actions: [{ type: 'deny' }] }] }), EDGE, CONFIG, deps())!;
    const t1 = performance.now();
    for (let i = 0; i < N; i++) s2.onRequest!(reqs[i % 1000]!);
    const us2 = ((performance.now() - t1) * 1000) / N;
    console.log(`traffic policy per request: ${us.toFixed(2)} µs (1 expression + rate-limit, immediate limiter); ${us2.toFixed(2)} µs (1 expression, no match)`);
    expect(us).toBeLessThan(50);
  });

  it("a rate-limit keyed on ten 16 KiB header values runs within its cost estimate (the charge that bounds how many a policy holds)", async () => {
    const limiter: RateLimiter = { hit: async () => ({ limited: false, retryAfterSeconds: 0 }) };
    const doc = { inbound: [{ actions: [{ type: 'rate-limit', config: { name: 'big', algorithm: 'sliding_window', capacity: 1_000_000_000, rate: '60s', bucket_key: Array(10).fill("getReqHeader('a')") } }] }] };
    const estimateNs = rateLimitCost((validateTrafficPolicy(doc).inbound[0]!.actions[0] as RateLimitAction).config);
    const s = trafficPolicyStage(route(doc), EDGE, CONFIG, deps(limiter))!;
    const r = request({ headers: ['Host', 'a.test', 'a', 'b'.repeat(16 * 1024)] });
    let best = Infinity;
    for (let batch = 0; batch < 6; batch++) {
      const t0 = performance.now();
      for (let i = 0; i < 20; i++) {
        r.vars = {};
        await s.onRequest!(r);
      }
      best = Math.min(best, ((performance.now() - t0) * 1e6) / 20);
    }
    console.log(`rate-limit, ten 16 KiB header values: ${(best / 1000).toFixed(0)} µs per run (estimate ${(estimateNs / 1000).toFixed(0)} µs)`);
    // The estimates are calibrated on this kind of box; 4x leaves room for a loaded CI run.
    expect(best).toBeLessThan(4 * estimateNs);
  });
});
