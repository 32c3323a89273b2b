import { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import type { RateLimiter, RateLimitResult } from '../pipeline/types.js';
import { CircuitBreaker, type BreakerOptions } from './breaker.js';
import { digestKey, redisKey } from './keys.js';
import { LocalSlidingWindowLimiter } from './local.js';
import { createRateLimitMetrics, type FallbackReason, type RateLimitMetrics } from './metrics.js';
import { SLIDING_WINDOW_LUA } from './script.js';
import { checkArgs, retryAfterMs, retryAfterSeconds } from './window.js';

export interface RedisLimiterOptions {
  /** An ioredis client (not closed by `close()`), or a URL for a client this limiter owns and configures. */
  redis: Redis | string;
  /** The ingress server whose capacity this is: its processes share keys, other servers never do. */
  serverId: string;
  /** A Redis answer slower than this counts as a failure and the fallback decides (default 50 ms). */
  timeoutMs?: number;
  /** Decides while Redis is slow or down (default: a LocalSlidingWindowLimiter). */
  fallback?: RateLimiter;
  registry?: Registry;
  log?: Logger;
  /** Circuit breaker for Redis failures (default: open after 3 consecutive failures, probe after 1 s). */
  breaker?: BreakerOptions;
  /** ioredis auto-pipelining on an owned client (default off; see the bench in test/load/ratelimit-bench.ts). */
  autoPipelining?: boolean;
  /**
   * Sends the scripts of all decisions asked for in one event-loop turn as one pipeline (one
   * socket write and one timeout timer per batch instead of per request). Default false: through
   * the ingress it halved Redis's CPU per decision (20 → 11 µs) but left the ingress's own cost and
   * throughput unchanged and made open-loop p99 worse (README, "Benchmarks").
   */
  batch?: boolean;
  /**
   * Tests only: milliseconds since the epoch (integer) passed into the script instead of Redis'
   * own `TIME`, so window boundaries can be tested without waiting for them. Leave unset in
   * production: then the clocks of the ingress processes play no part.
   */
  clock?: () => number;
}

export const STORE_ERROR_CODE = 'ERR_WARREN_RATE_LIMIT_STORE';

/** The script as a custom ioredis command: EVALSHA, with EVAL once per connection and after NOSCRIPT. */
const COMMAND = 'warrenSlidingWindow';
type ScriptReply = [admitted: number, prev: number, cur: number, elapsed: number, ahead: number];
type WithCommand = Redis & { [COMMAND](key: string, capacity: number, windowMs: number, now: string): Promise<ScriptReply> };

class StoreTimeout extends Error {}

/**
 * The `rate-limit` action's limiter: a sliding-window counter in Redis, one atomic script and one
 * round trip per request, scoped to one ingress server (see script.ts and window.ts).
 *
 * Fail-open: when Redis errs, is not connected, or answers later than `timeoutMs`, the local
 * in-memory limiter decides and the result carries `error` (ERR_WARREN_RATE_LIMIT_STORE). A
 * circuit breaker keeps a dead Redis from costing the timeout on every request, and probes it so
 * the limiter recovers by itself. A request whose answer came too late may still have been
 * counted in Redis; that only errs on the strict side.
 */
export class RedisSlidingWindowLimiter implements RateLimiter {
  readonly client: Redis;
  private readonly owned: boolean;
  private readonly serverId: string;
  private readonly timeoutMs: number;
  private readonly fallback: RateLimiter;
  private readonly metrics: RateLimitMetrics;
  private readonly log: Logger | undefined;
  private readonly breaker: CircuitBreaker;
  private readonly clock: (() => number) | undefined;
  private loggedError = false;
  private readonly batching: boolean;
  private queue: Array<{ args: [string, number, number, string]; resolve: (r: ScriptReply) => void; reject: (e: Error) => void }> = [];
  private flushScheduled = false;

  constructor(opts: RedisLimiterOptions) {
    if (!opts.serverId) throw new Error('RedisSlidingWindowLimiter needs a serverId');
    this.serverId = opts.serverId;
    this.timeoutMs = opts.timeoutMs ?? 50;
    this.clock = opts.clock;
    this.fallback = opts.fallback ?? new LocalSlidingWindowLimiter(opts.clock ? { clock: opts.clock } : {});
    this.metrics = createRateLimitMetrics(opts.registry);
    this.log = opts.log;
    this.breaker = new CircuitBreaker(opts.breaker);
    this.batching = opts.batch ?? false;
    this.owned = typeof opts.redis === 'string';
    this.client = typeof opts.redis === 'string' ? createClient(opts.redis, opts.autoPipelining ?? false) : opts.redis;
    if (typeof (this.client as unknown as Partial<WithCommand>)[COMMAND] !== 'function') {
      this.client.defineCommand(COMMAND, { numberOfKeys: 1, lua: SLIDING_WINDOW_LUA });
    }
    if (this.owned) {
      // An 'error' listener is required (ioredis would otherwise report unhandled errors); log the
      // first error of an outage only, the breaker's transitions tell the rest.
      this.client.on('error', (err: Error) => {
        if (this.loggedError) return;
        this.loggedError = true;
        this.log?.warn({ err: err.message, serverId: this.serverId }, 'rate-limit store: Redis connection error');
      });
      this.client.on('ready', () => {
        if (this.loggedError) this.log?.info({ serverId: this.serverId }, 'rate-limit store: Redis connected again');
        this.loggedError = false;
      });
    }
  }

  /** Resolves once the client is connected (or rejects after `ms`); decisions before that come from the fallback. */
  async ready(ms = 5000): Promise<void> {
    if (this.client.status === 'ready') return;
    await new Promise<void>((resolve, reject) => {
      const t = setTimeout(() => (cleanup(), reject(new Error(`Redis not ready within ${ms} ms`))), ms);
      const onReady = () => (cleanup(), resolve());
      const cleanup = () => (clearTimeout(t), this.client.off('ready', onReady));
      this.client.on('ready', onReady);
    });
  }

  async hit(key: string, capacity: number, windowSeconds: number): Promise<RateLimitResult> {
    checkArgs(capacity, windowSeconds);
    const digest = digestKey(key);
    if (this.client.status !== 'ready') return this.fallBack('unavailable', 'Redis is not connected', digest, capacity, windowSeconds);
    if (!this.breaker.allow()) return this.fallBack('circuit_open', 'Redis failed repeatedly; retrying it shortly', digest, capacity, windowSeconds);

    const windowMs = windowSeconds * 1000;
    const started = performance.now();
    let timer: NodeJS.Timeout | undefined;
    let reply: ScriptReply;
    try {
      const args: [string, number, number, string] = [redisKey(this.serverId, windowSeconds, digest), capacity, windowMs, this.clock ? String(this.clock()) : ''];
      if (this.batching) {
        reply = await this.enqueue(args);
      } else {
        const call = (this.client as unknown as WithCommand)[COMMAND](...args);
        const timeout = new Promise<never>((_, reject) => {
          timer = setTimeout(() => reject(new StoreTimeout()), this.timeoutMs);
        });
        // race() subscribes to both, so a late rejection of `call` is handled, never unhandled.
        reply = await Promise.race([call, timeout]);
      }
    } catch (err) {
      if (this.breaker.failure()) this.log?.warn({ serverId: this.serverId, err: (err as Error).message }, 'rate-limit store: Redis failing, using the local limiter');
      return err instanceof StoreTimeout
        ? this.fallBack('timeout', `Redis did not answer within ${this.timeoutMs} ms`, digest, capacity, windowSeconds)
        : this.fallBack('error', `Redis error: ${(err as Error).message}`, digest, capacity, windowSeconds);
    } finally {
      clearTimeout(timer);
    }
    if (this.breaker.success()) this.log?.info({ serverId: this.serverId }, 'rate-limit store: Redis answering again');
    this.metrics.redisLatency((performance.now() - started) / 1000);

    const [admitted, prev, cur, elapsed, ahead] = reply;
    if (admitted === 1) {
      this.metrics.decision(false);
      return { limited: false, retryAfterSeconds: 0 };
    }
    this.metrics.decision(true);
    const view = { window: 0, prev: Number(prev), cur: Number(cur), elapsed: Number(elapsed), ahead: Number(ahead) };
    return { limited: true, retryAfterSeconds: retryAfterSeconds(retryAfterMs(view, capacity, windowMs)) };
  }

  /** Queues one script call for the batch of this event-loop turn. */
  private enqueue(args: [string, number, number, string]): Promise<ScriptReply> {
    return new Promise<ScriptReply>((resolve, reject) => {
      this.queue.push({ args, resolve, reject });
      if (!this.flushScheduled) {
        this.flushScheduled = true;
        // setImmediate runs after the poll phase: every request read in this turn joins the batch.
        setImmediate(this.flush);
      }
    });
  }

  /** Sends the queued calls as one pipeline with one timeout for all of them. */
  private readonly flush = (): void => {
    this.flushScheduled = false;
    const batch = this.queue;
    this.queue = [];
    let settled = false;
    const timer = setTimeout(() => {
      settled = true;
      for (const e of batch) e.reject(new StoreTimeout());
    }, this.timeoutMs);
    const done = (fn: () => void) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      fn();
    };
    if (batch.length === 1) {
      const e = batch[0]!;
      (this.client as unknown as WithCommand)[COMMAND](...e.args).then(
        (r) => done(() => e.resolve(r)),
        (err: Error) => done(() => e.reject(err)),
      );
      return;
    }
    const pipeline = this.client.pipeline() as unknown as Record<string, (...a: unknown[]) => unknown> & { exec(): Promise<Array<[Error | null, unknown]> | null> };
    for (const e of batch) pipeline[COMMAND]!(...e.args);
    pipeline.exec().then(
      (results) =>
        done(() => {
          batch.forEach((e, i) => {
            const [err, r] = results?.[i] ?? [new Error('no reply in the pipeline'), null];
            if (err) e.reject(err);
            else e.resolve(r as ScriptReply);
          });
        }),
      (err: Error) => done(() => batch.forEach((e) => e.reject(err))),
    );
  };

  /** Closes an owned client (a client passed in is left to its owner). */
  async close(): Promise<void> {
    if (!this.owned) return;
    await this.client.quit().catch(() => this.client.disconnect());
  }

  private async fallBack(reason: FallbackReason, why: string, digest: string, capacity: number, windowSeconds: number): Promise<RateLimitResult> {
    this.metrics.fallback(reason);
    const r = await this.fallback.hit(digest, capacity, windowSeconds);
    this.metrics.decision(r.limited);
    return { ...r, error: { code: STORE_ERROR_CODE, message: `rate-limit store unavailable (${why}); decided by this server's local limiter` } };
  }
}

/** An owned client tuned to fail fast: no offline queue, one retry, reconnects backing off to 1 s. */
function createClient(url: string, autoPipelining: boolean): Redis {
  return new Redis(url, {
    enableOfflineQueue: false,
    maxRetriesPerRequest: 1,
    connectTimeout: 1000,
    enableAutoPipelining: autoPipelining,
    retryStrategy: (times) => Math.min(50 * 2 ** Math.min(times, 5), 1000),
  });
}
