import net from 'node:net';
import { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import type { RateLimiter, RateLimitResult } from '../pipeline/types.js';
import { CircuitBreaker, type BreakerOptions } from './breaker.js';
import { digestKey, redisKey } from './keys.js';
import { LocalSlidingWindowLimiter } from './local.js';
import { createRateLimitMetrics, type FallbackReason, type RateLimitMetrics } from './metrics.js';
import { SLIDING_WINDOW_LUA } from './script.js';
import { PipeTimeout, PipeUnavailable, redisEndpoint, ScriptPipe } from './script-pipe.js';
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
  /**
   * How the script reaches Redis when `redis` is a URL: `pipe` (default), the lean pipelined
   * connection of script-pipe.ts, or `ioredis`, a client of its own (the measured comparison, see
   * test/load/proxy-bench.ts). A client passed in is always used through ioredis.
   */
  transport?: 'pipe' | 'ioredis';
  /** ioredis auto-pipelining on an owned ioredis client (transport `ioredis` only; default off). */
  autoPipelining?: boolean;
  /** How long a connection may go without an answer while calls time out before it is made again (default 5,000 ms). */
  staleMs?: number;
  /**
   * Buckets of capacity up to this keep an exact sliding log in Redis (≤ L entries of ~10 bytes
   * per key): decisions agree with an exact log, the rolling count never exceeds L. Larger
   * capacities keep the two-counter estimate (constant size, approximate). 0 turns the log off.
   * Default 10,000 (`RATE_LIMIT_EXACT_MAX`).
   */
  exactMax?: number;
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
/** The script's answer (script.ts): 1 when admitted; refused, counter mode [0, P, C, e, ahead], log mode [0, ms until admitted, 0, 0, 0]. */
type ScriptReply = 1 | [admitted: 0, a: number, b: number, c: number, d: number];
type WithCommand = Redis & { [COMMAND](key: string, capacity: number, windowMs: number, now: string, mode: ModeArg): Promise<ScriptReply> };
/** ARGV[4] of the script. */
type ModeArg = '1' | '0';

/** Default of {@link RedisLimiterOptions.exactMax}. */
export const DEFAULT_EXACT_MAX = 10_000;

class StoreTimeout extends Error {}

/** Recent buckets kept by {@link RedisSlidingWindowLimiter.bucket}; cleared when full. */
const BUCKET_CACHE_MAX = 10_000;

interface Bucket {
  digest: string;
  rkey: string;
  /** The script's ARGV[4]: '1' for the exact log (capacity ≤ exactMax), '0' for the counter. */
  mode: ModeArg;
  /** The pipe's EVALSHA for this bucket on Redis' clock. */
  cmd: string | undefined;
}

/**
 * The `rate-limit` action's limiter: a sliding window in Redis, one atomic script and one round
 * trip per request, scoped to one ingress server (see script.ts and window.ts). Buckets of
 * capacity up to `exactMax` keep an exact sliding log (a list of the last L admission times);
 * larger ones the two-counter estimate (a hash of two counts). Each mode has its own key.
 *
 * Fail-open: when Redis errs, is not connected, or answers later than `timeoutMs`, the local
 * in-memory limiter decides and the result carries `error` (ERR_WARREN_RATE_LIMIT_STORE). A
 * circuit breaker keeps a dead Redis from costing the timeout on every request, and probes it so
 * the limiter recovers by itself. A request whose answer came too late may still have been
 * counted in Redis; that only errs on the strict side. The local limiter is the counter whatever
 * the mode: during an outage decisions are approximate (and per process).
 */
export class RedisSlidingWindowLimiter implements RateLimiter {
  /** The ioredis client (transport `ioredis`, or a client passed in); null with the pipe. */
  readonly client: Redis | null;
  private readonly pipe: ScriptPipe | null;
  private readonly owned: boolean;
  /** ioredis transport: when Redis last answered a call (or the limiter started). */
  private lastAnswerAt = performance.now();
  private readonly staleMs: number;
  private readonly serverId: string;
  private readonly timeoutMs: number;
  private readonly fallback: RateLimiter;
  private readonly metrics: RateLimitMetrics;
  private readonly log: Logger | undefined;
  private readonly breaker: CircuitBreaker;
  private readonly clock: (() => number) | undefined;
  private readonly exactMax: number;
  private loggedError = false;
  private readonly buckets = new Map<string, Bucket>();

  constructor(opts: RedisLimiterOptions) {
    if (!opts.serverId) throw new Error('RedisSlidingWindowLimiter needs a serverId');
    this.serverId = opts.serverId;
    this.timeoutMs = opts.timeoutMs ?? 50;
    this.clock = opts.clock;
    this.exactMax = opts.exactMax ?? DEFAULT_EXACT_MAX;
    if (!Number.isSafeInteger(this.exactMax) || this.exactMax < 0) throw new RangeError(`exactMax must be a non-negative integer, got ${opts.exactMax}`);
    this.fallback = opts.fallback ?? new LocalSlidingWindowLimiter(opts.clock ? { clock: opts.clock } : {});
    this.metrics = createRateLimitMetrics(opts.registry);
    this.log = opts.log;
    this.breaker = new CircuitBreaker(opts.breaker);
    this.owned = typeof opts.redis === 'string';
    this.staleMs = opts.staleMs ?? 5000;
    const onError = (err: Error) => {
      // Log the first error of an outage only; the breaker's transitions tell the rest.
      if (this.loggedError) return;
      this.loggedError = true;
      this.log?.warn({ err: err.message, serverId: this.serverId }, 'rate-limit store: Redis connection error');
    };
    const onReady = () => {
      if (this.loggedError) this.log?.info({ serverId: this.serverId }, 'rate-limit store: Redis connected again');
      this.loggedError = false;
    };
    if (typeof opts.redis === 'string' && (opts.transport ?? 'pipe') === 'pipe') {
      this.client = null;
      this.pipe = new ScriptPipe({ url: opts.redis, script: SLIDING_WINDOW_LUA, argCount: 4, timeoutMs: this.timeoutMs, staleMs: opts.staleMs });
      this.pipe.on('error', onError);
      this.pipe.on('ready', onReady);
      return;
    }
    this.pipe = null;
    this.client = typeof opts.redis === 'string' ? createClient(opts.redis, opts.autoPipelining ?? false) : opts.redis;
    if (typeof (this.client as unknown as Partial<WithCommand>)[COMMAND] !== 'function') {
      this.client.defineCommand(COMMAND, { numberOfKeys: 1, lua: SLIDING_WINDOW_LUA });
    }
    if (this.owned) {
      // An 'error' listener is required (ioredis would otherwise report unhandled errors).
      this.client.on('error', onError);
      this.client.on('ready', onReady);
    }
  }

  /** 'ready' when Redis decides; anything else means the fallback does. */
  get status(): string {
    return this.pipe ? this.pipe.status : this.client!.status;
  }

  /** Resolves once the client is connected (or rejects after `ms`); decisions before that come from the fallback. */
  async ready(ms = 5000): Promise<void> {
    if (this.status === 'ready') return;
    const emitter = (this.pipe ?? this.client!) as unknown as { on(e: 'ready', f: () => void): void; off(e: 'ready', f: () => void): void };
    await new Promise<void>((resolve, reject) => {
      const t = setTimeout(() => (cleanup(), reject(new Error(`Redis not ready within ${ms} ms`))), ms);
      const onReady = () => (cleanup(), resolve());
      const cleanup = () => (clearTimeout(t), emitter.off('ready', onReady));
      emitter.on('ready', onReady);
    });
  }

  hit(key: string, capacity: number, windowSeconds: number): Promise<RateLimitResult> {
    checkArgs(capacity, windowSeconds);
    const b = this.bucket(key, capacity, windowSeconds);
    if (this.status !== 'ready') return this.fallBack('unavailable', 'Redis is not connected', b.digest, capacity, windowSeconds);
    if (!this.breaker.allow()) return this.fallBack('circuit_open', 'Redis failed repeatedly; retrying it shortly', b.digest, capacity, windowSeconds);
    const windowMs = windowSeconds * 1000;
    const now = this.clock ? String(this.clock()) : '';
    const started = performance.now();
    if (this.pipe) {
      const pipe = this.pipe;
      const cmd = now === '' ? b.cmd! : pipe.encode(b.rkey, [String(capacity), String(windowMs), now, b.mode]);
      return new Promise<RateLimitResult>((resolve) => {
        pipe.callEncoded(cmd, (err, reply) => {
          resolve(err ? this.failed(err, b.digest, capacity, windowSeconds) : this.decide(reply as ScriptReply, b.mode, capacity, windowMs, started));
        });
      });
    }
    return this.hitIoredis(b, now, capacity, windowSeconds, started);
  }

  /**
   * What one bucket needs on every request, made once: the key's digest, its mode (capacity ≤
   * exactMax: the log), its Redis key and (pipe) the encoded command. A hot key is hashed and
   * encoded once, not per request. The capacity is part of the cache key, so a capacity change
   * picks the other mode (and key) with its first request.
   */
  private bucket(key: string, capacity: number, windowSeconds: number): Bucket {
    const ck = `${capacity}|${windowSeconds}|${key}`;
    let b = this.buckets.get(ck);
    if (b === undefined) {
      if (this.buckets.size >= BUCKET_CACHE_MAX) this.buckets.clear();
      const digest = digestKey(key);
      const log = capacity <= this.exactMax;
      const mode: ModeArg = log ? '1' : '0';
      const rkey = redisKey(this.serverId, windowSeconds, digest, log ? 'log' : 'counter');
      b = { digest, rkey, mode, cmd: this.pipe?.encode(rkey, [String(capacity), String(windowSeconds * 1000), '', mode]) };
      this.buckets.set(ck, b);
    }
    return b;
  }

  private async hitIoredis(b: Bucket, now: string, capacity: number, windowSeconds: number, started: number): Promise<RateLimitResult> {
    const windowMs = windowSeconds * 1000;
    let timer: NodeJS.Timeout | undefined;
    let reply: ScriptReply;
    try {
      const call = (this.client as unknown as WithCommand)[COMMAND](b.rkey, capacity, windowMs, now, b.mode);
      const timeout = new Promise<never>((_, reject) => {
        // Rejected after the next poll for I/O, not in the timer itself: timers run before the poll,
        // so after a stall of this process's event loop Redis' reply may be waiting unread (see
        // ScriptPipe.checkTimeouts). A reply read in that poll settles the race first.
        timer = setTimeout(() => setImmediate(reject, new StoreTimeout()), this.timeoutMs);
      });
      // race() subscribes to both, so a late rejection of `call` is handled, never unhandled.
      reply = await Promise.race([call, timeout]);
    } catch (err) {
      if (err instanceof StoreTimeout) this.maybeStale();
      return this.failed(err as Error, b.digest, capacity, windowSeconds);
    } finally {
      clearTimeout(timer);
    }
    this.lastAnswerAt = performance.now();
    return this.decide(reply, b.mode, capacity, windowMs, started);
  }

  /**
   * ioredis transport: a connection with no answer for `staleMs` while calls time out is taken
   * for dead (a peer gone without a reset) and made again, as the pipe does; ioredis itself would
   * wait for TCP to give up. Only an owned client: one passed in is its owner's.
   */
  private maybeStale(): void {
    if (!this.owned || !this.client || performance.now() - this.lastAnswerAt < this.staleMs) return;
    this.lastAnswerAt = performance.now();
    this.log?.warn({ serverId: this.serverId }, `rate-limit store: no answer from Redis for ${this.staleMs} ms; connecting again`);
    this.client.disconnect(true);
  }

  private decide(reply: ScriptReply, mode: ModeArg, capacity: number, windowMs: number, started: number): RateLimitResult {
    if (this.breaker.success()) this.log?.info({ serverId: this.serverId }, 'rate-limit store: Redis answering again');
    this.metrics.redisLatency((performance.now() - started) / 1000);
    if (typeof reply === 'number') {
      this.metrics.decision(false);
      return ADMITTED;
    }
    this.metrics.decision(true);
    // Log mode answers the wait itself (reply[1], ms); the counter's view is turned into one here.
    if (mode === '1') return { limited: true, retryAfterSeconds: retryAfterSeconds(Number(reply[1])) };
    const [, prev, cur, elapsed, ahead] = reply;
    const view = { window: 0, prev: Number(prev), cur: Number(cur), elapsed: Number(elapsed), ahead: Number(ahead) };
    return { limited: true, retryAfterSeconds: retryAfterSeconds(retryAfterMs(view, capacity, windowMs)) };
  }

  private failed(err: Error, digest: string, capacity: number, windowSeconds: number): Promise<RateLimitResult> {
    // The breaker spares requests the wait of a slow or failing Redis. A pipe that is not connected
    // refuses at once (nothing is waited for): not counted, or a lost connection's batch (and the
    // requests of the milliseconds until it is back) would open it for a whole second.
    if (err instanceof PipeUnavailable) this.breaker.abstain();
    else if (this.breaker.failure()) this.log?.warn({ serverId: this.serverId, err: err.message }, 'rate-limit store: Redis failing, using the local limiter');
    if (err instanceof StoreTimeout || err instanceof PipeTimeout) return this.fallBack('timeout', `Redis did not answer within ${this.timeoutMs} ms`, digest, capacity, windowSeconds);
    if (err instanceof PipeUnavailable) return this.fallBack('unavailable', 'Redis is not connected', digest, capacity, windowSeconds);
    return this.fallBack('error', `Redis error: ${err.message}`, digest, capacity, windowSeconds);
  }

  /** Closes an owned connection (a client passed in is left to its owner). */
  async close(): Promise<void> {
    if (this.pipe) return this.pipe.close();
    if (!this.owned) return;
    // QUIT waits for Redis's reply: a stalled Redis would hold shutdown (SIGTERM) for as long as
    // it stalls. At most a second, then the connection is dropped.
    let timer: NodeJS.Timeout | undefined;
    const quit = this.client!.quit().then(
      () => undefined,
      () => undefined,
    );
    await Promise.race([quit, new Promise<void>((r) => (timer = setTimeout(r, 1000)))]);
    clearTimeout(timer);
    this.client!.disconnect();
  }

  private async fallBack(reason: FallbackReason, why: string, digest: string, capacity: number, windowSeconds: number): Promise<RateLimitResult> {
    this.metrics.fallback(reason);
    const r = await this.fallback.hit(digest, capacity, windowSeconds);
    this.metrics.decision(r.limited);
    return { ...r, error: { code: STORE_ERROR_CODE, message: `rate-limit store unavailable (${why}); decided by this server's local limiter` } };
  }
}

const ADMITTED: RateLimitResult = Object.freeze({ limited: false, retryAfterSeconds: 0 }) as RateLimitResult;

/** ioredis's `connectTimeout` and ours for the rest of the way to ready (AUTH, SELECT, its ready check). */
const CONNECT_TIMEOUT_MS = 1000;

/**
 * An owned client tuned to fail fast: no offline queue, one retry, reconnects backing off to 1 s.
 * ioredis's `connectTimeout` ends at the TCP connect; a Redis that accepts and then stalls in the
 * handshake would keep the client `connecting` until TCP keepalive gives up, so a connection not
 * ready within `CONNECT_TIMEOUT_MS` of connecting is dropped and retried (as the pipe does).
 */
function createClient(url: string, autoPipelining: boolean): Redis {
  const ep = redisEndpoint(url);
  const where = ep.path
    ? { path: ep.path }
    : { host: ep.host, port: ep.port, ...(ep.tls ? { tls: { servername: net.isIP(ep.host) ? undefined : ep.host } } : {}) };
  const client = new Redis({
    ...where,
    ...(ep.user ? { username: ep.user } : {}),
    ...(ep.password ? { password: ep.password } : {}),
    db: Number(ep.db || 0),
    enableOfflineQueue: false,
    maxRetriesPerRequest: 1,
    connectTimeout: CONNECT_TIMEOUT_MS,
    enableAutoPipelining: autoPipelining,
    retryStrategy: (times) => Math.min(50 * 2 ** Math.min(times, 5), 1000),
  });
  let handshake: NodeJS.Timeout | null = null;
  const clear = () => {
    if (handshake) clearTimeout(handshake);
    handshake = null;
  };
  client.on('connect', () => {
    clear();
    handshake = setTimeout(() => {
      handshake = null;
      // disconnect(true): drop this connection and reconnect through retryStrategy.
      if (client.status !== 'ready' && client.status !== 'end') client.disconnect(true);
    }, CONNECT_TIMEOUT_MS);
  });
  client.on('ready', clear);
  client.on('close', clear);
  client.on('end', clear);
  return client;
}
