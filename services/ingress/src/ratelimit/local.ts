import type { Registry } from 'prom-client';
import type { RateLimiter, RateLimitResult } from '../pipeline/types.js';
import { digestKey } from './keys.js';
import { createRateLimitMetrics, type RateLimitMetrics } from './metrics.js';
import { admits, checkArgs, retryAfterMs, retryAfterSeconds, viewAt, type WindowState } from './window.js';

export interface LocalLimiterOptions {
  /** Most buckets kept; beyond it the least recently used bucket is forgotten (default 100,000). */
  maxKeys?: number;
  /** Milliseconds since the epoch, integer (default: a monotonic clock anchored at process start). */
  clock?: () => number;
  /** Counts decisions in `warren_ingress_ratelimit_decisions_total` (leave unset when used as a fallback). */
  registry?: Registry;
}

/** Wall time that never steps back: performance.now() runs monotonic from the process' start. */
const monotonicNow = (): number => Math.floor(performance.timeOrigin + performance.now());

/**
 * The sliding-window counter of window.ts in process memory: the fail-open fallback of the Redis
 * limiter, and a limiter of its own for a single process. Memory is bounded: at most `maxKeys`
 * buckets of ~100 bytes each (keys are digested), evicted least recently used; a bucket idle for
 * two windows holds nothing that still counts, so evicting it loses nothing, and evicting an
 * active one under pressure only forgets counts (fails open).
 *
 * It is the two-counter estimate for every capacity, also for buckets that Redis keeps as an
 * exact log (capacity ≤ `exactMax`): during a Redis outage decisions are approximate (besides
 * being per process), the price of keeping this fallback at a fixed size per bucket.
 */
export class LocalSlidingWindowLimiter implements RateLimiter {
  private readonly buckets = new Map<string, WindowState>();
  private readonly maxKeys: number;
  private readonly clock: () => number;
  private readonly metrics: RateLimitMetrics;

  constructor(opts: LocalLimiterOptions = {}) {
    this.maxKeys = Math.max(1, opts.maxKeys ?? 100_000);
    this.clock = opts.clock ?? monotonicNow;
    this.metrics = createRateLimitMetrics(opts.registry);
  }

  /** Buckets currently held (for tests and metrics). */
  get size(): number {
    return this.buckets.size;
  }

  hit(key: string, capacity: number, windowSeconds: number): Promise<RateLimitResult> {
    try {
      return Promise.resolve(this.hitSync(key, capacity, windowSeconds));
    } catch (err) {
      return Promise.reject(err as Error);
    }
  }

  /** The same as `hit`, synchronously. */
  hitSync(key: string, capacity: number, windowSeconds: number): RateLimitResult {
    checkArgs(capacity, windowSeconds);
    const windowMs = windowSeconds * 1000;
    const id = `${windowSeconds}:${digestKey(key)}`;
    const now = this.clock();
    const stored = this.buckets.get(id);
    const v = viewAt(stored, now, windowMs);
    const ok = admits(v, capacity, windowMs);
    // Re-inserting keeps the Map in least-recently-used order (a denied bucket is in use too: it
    // is full, and forgetting it would let its client through).
    if (stored) this.buckets.delete(id);
    this.buckets.set(id, ok ? { window: v.window, cur: v.cur + 1, prev: v.prev } : stored ?? { window: v.window, cur: v.cur, prev: v.prev });
    if (this.buckets.size > this.maxKeys) this.evictOldest();
    this.metrics.decision(!ok);
    return ok ? { limited: false, retryAfterSeconds: 0 } : { limited: true, retryAfterSeconds: retryAfterSeconds(retryAfterMs(v, capacity, windowMs)) };
  }

  /** Forgets every bucket. */
  clear(): void {
    this.buckets.clear();
  }

  private evictOldest(): void {
    const first = this.buckets.keys().next();
    if (!first.done) this.buckets.delete(first.value);
  }
}
