import { Counter, type Registry } from 'prom-client';
import { LeanCounter, LeanHistogram, registerLean } from '../lean-metrics.js';

/** Why a decision came from the local fallback instead of Redis (a bounded label set). */
export type FallbackReason = 'timeout' | 'error' | 'unavailable' | 'circuit_open';

export interface RateLimitMetrics {
  decision(limited: boolean): void;
  fallback(reason: FallbackReason): void;
  /** Seconds one successful Redis round trip took. */
  redisLatency(seconds: number): void;
}

export const NO_METRICS: RateLimitMetrics = { decision() {}, fallback() {}, redisLatency() {} };

/**
 * The limiter's series. Get-or-create, so several limiters (or a re-created one after a config
 * reload) can share one registry. Children are bound once; the per-request series are lean ones
 * (an addition per decision, no label validation or hashing).
 */
export function createRateLimitMetrics(registry: Registry | undefined): RateLimitMetrics {
  if (!registry) return NO_METRICS;
  // Per request: lean (lean-metrics.ts). The fallback counter is on the rare path.
  const decisions = registerLean(registry, new LeanCounter('warren_ingress_ratelimit_decisions_total', 'Rate-limit decisions by result (admitted or limited), whichever store decided', ['result']));
  const fallbacks = getOrCreate(registry, 'warren_ingress_ratelimit_fallback_total', () => new Counter({
    name: 'warren_ingress_ratelimit_fallback_total',
    help: 'Rate-limit decisions taken by the local fallback because Redis was slow or unavailable, by reason',
    labelNames: ['reason'] as const,
    registers: [registry],
  }));
  const latency = registerLean(
    registry,
    new LeanHistogram('warren_ingress_ratelimit_redis_seconds', 'Round-trip time of successful rate-limit checks against Redis', [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1]),
  );
  const rtt = latency.child();
  const admitted = decisions.child('admitted');
  const limited = decisions.child('limited');
  const byReason: Record<FallbackReason, { inc(): void }> = {
    timeout: fallbacks.labels('timeout'),
    error: fallbacks.labels('error'),
    unavailable: fallbacks.labels('unavailable'),
    circuit_open: fallbacks.labels('circuit_open'),
  };
  return {
    decision: (l) => (l ? limited : admitted).inc(),
    fallback: (r) => byReason[r].inc(),
    redisLatency: (s) => rtt.observe(s),
  };
}

function getOrCreate<T>(registry: Registry, name: string, create: () => T): T {
  return (registry.getSingleMetric(name) as T | undefined) ?? create();
}
