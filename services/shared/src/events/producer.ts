import { randomBytes } from 'node:crypto';
import { Queue, type JobsOptions } from 'bullmq';
import type { Redis } from 'ioredis';
import {
  DEFAULT_BUFFER_CAP,
  DEFAULT_EVENT_PREFIX,
  DEFAULT_LINGER_MS,
  TARGET_QUEUES,
  bufferKey,
  overflowKey,
  type EventTargetKind,
  type FlushJobData,
  type PublishItem,
} from './types.js';

/**
 * The producing side of event delivery (event-delivery.md §2.1): appends serialized envelopes to
 * each destination's buffer list and makes sure one deduplicated `flush` job exists for it.
 * Used by the outbox relay (audit events) and by every ingress (traffic events).
 */

/** BullMQ job name of a flush. */
export const FLUSH_JOB_NAME = 'flush';
/** Name of the worker's custom backoff strategy (`backoff: {type}`); the worker registers it. */
export const FLUSH_BACKOFF_TYPE = 'warren-schedule';
/**
 * BullMQ attempts of a flush job. Only an upper bound: the worker's retry schedule
 * (RETRY_SCHEDULE_MS) decides when a failing batch goes to the dead letters.
 */
export const FLUSH_JOB_ATTEMPTS = 1000;
/** §3: keep finished jobs a while for inspection, never unbounded. */
export const FLUSH_REMOVE_ON_COMPLETE = { age: 3600, count: 1000 } as const;
export const FLUSH_REMOVE_ON_FAIL = { age: 7 * 24 * 3600 } as const;

/** The options of every flush job (producer and worker alike). */
export function flushJobOptions(destId: string, delayMs: number, attempts = FLUSH_JOB_ATTEMPTS): JobsOptions {
  return {
    deduplication: { id: destId },
    delay: delayMs > 0 ? delayMs : undefined,
    attempts,
    backoff: { type: FLUSH_BACKOFF_TYPE },
    removeOnComplete: { ...FLUSH_REMOVE_ON_COMPLETE },
    removeOnFail: { ...FLUSH_REMOVE_ON_FAIL },
  };
}

/** A fresh custom job id (never an integer, no ':'): lets the producer see whether add() created a job or hit the dedup key. */
export function newFlushJobId(destId: string): string {
  return `f-${destId}-${Date.now().toString(36)}-${randomBytes(4).toString('hex')}`;
}

export interface EventProducerOptions {
  /**
   * A dedicated ioredis connection for producing (recommended: enableOfflineQueue false,
   * maxRetriesPerRequest 1, so a dead Redis fails fast and the caller keeps/counts the events).
   * The producer never closes it.
   */
  connection: Redis;
  prefix?: string;
  lingerMs?: number;
  bufferCap?: number;
  /** Cap of the overflow list (default: bufferCap). Events beyond it are dropped and counted. */
  overflowCap?: number;
}

export interface PublishResult {
  /** Events appended to their destination buffers. */
  accepted: number;
  /** Events refused because a buffer was full (overflow list, later dead letters `buffer_full`) or dropped because the overflow was full too. */
  overflowed: number;
  /** Of `overflowed`: events dropped because even the overflow list was full. */
  dropped: number;
}

/**
 * One round trip for a whole publish: for each destination (KEYS buf_i, ovf_i) append its events
 * to the buffer up to the cap, the excess to the overflow list up to its cap, the rest dropped.
 * ARGV: cap, overflowCap, n, count_1..count_n, events… Returns {accepted_i, overflowed_i, dropped_i}….
 */
const APPEND_SCRIPT = `
local cap = tonumber(ARGV[1])
local ocap = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local pos = 4 + n
local out = {}
local function push(key, from, to)
  local i = from
  while i <= to do
    local j = math.min(i + 999, to)
    redis.call('RPUSH', key, unpack(ARGV, i, j))
    i = j + 1
  end
end
for k = 1, n do
  local cnt = tonumber(ARGV[3 + k])
  local buf = KEYS[2 * k - 1]
  local ovf = KEYS[2 * k]
  local room = cap - redis.call('LLEN', buf)
  if room < 0 then room = 0 end
  local take = math.min(room, cnt)
  if take > 0 then push(buf, pos, pos + take - 1) end
  local rest = cnt - take
  local otake = 0
  if rest > 0 then
    local oroom = ocap - redis.call('LLEN', ovf)
    if oroom < 0 then oroom = 0 end
    otake = math.min(oroom, rest)
    if otake > 0 then push(ovf, pos + take, pos + take + otake - 1) end
  end
  out[#out + 1] = take
  out[#out + 1] = otake
  out[#out + 1] = rest - otake
  pos = pos + cnt
end
return out
`;

type AppendingRedis = Redis & { warrenEventAppend(numKeys: number, ...args: (string | number)[]): Promise<number[]> };

// Remembered "a fresh flush job runs no earlier than t" entries kept at most.
const MAX_SCHEDULED_ENTRIES = 10_000;

export class EventProducer {
  readonly prefix: string;
  readonly lingerMs: number;
  readonly bufferCap: number;
  readonly overflowCap: number;
  private readonly connection: AppendingRedis;
  private readonly queues = new Map<EventTargetKind, Queue<FlushJobData>>();
  /**
   * destId → time (ms) before which a flush job we created ourselves is known to be still
   * delayed, so it will claim anything appended now: publishing again within that window skips
   * queue.add. Only fresh jobs count (never a dedup hit on an existing, maybe active, job), and
   * the window is half the linger, as a margin for clock skew between hosts. The worker's
   * periodic buffer sweep backs this up.
   */
  private readonly scheduledUntil = new Map<string, number>();
  private closed = false;

  constructor(o: EventProducerOptions) {
    this.connection = o.connection as AppendingRedis;
    this.prefix = o.prefix ?? DEFAULT_EVENT_PREFIX;
    this.lingerMs = o.lingerMs ?? DEFAULT_LINGER_MS;
    this.bufferCap = o.bufferCap ?? DEFAULT_BUFFER_CAP;
    this.overflowCap = o.overflowCap ?? this.bufferCap;
    if (typeof this.connection.warrenEventAppend !== 'function') {
      this.connection.defineCommand('warrenEventAppend', { lua: APPEND_SCRIPT });
    }
  }

  /** The (lazily created) BullMQ queue of one target kind; shares the producer's connection. */
  queue(kind: EventTargetKind): Queue<FlushJobData> {
    let q = this.queues.get(kind);
    if (!q) {
      q = new Queue<FlushJobData>(TARGET_QUEUES[kind], { connection: this.connection, prefix: this.prefix });
      // Errors surface through the rejected add(); keep the emitter from throwing.
      q.on('error', () => {});
      this.queues.set(kind, q);
    }
    return q;
  }

  /**
   * For each item: atomically appends its events to the destination's buffer unless it holds
   * bufferCap (the excess goes to the overflow list, itself capped), then makes sure a
   * deduplicated flush job exists. Resolves when Redis has them; rejects if Redis fails (events
   * may then already sit in a buffer: the worker's sweep flushes them, and a retry by the
   * caller only adds duplicates, which at-least-once allows).
   */
  async publish(items: PublishItem[]): Promise<PublishResult> {
    if (this.closed) throw new Error('event producer is closed');
    const used = items.filter((i) => i.events.length > 0);
    if (used.length === 0) return { accepted: 0, overflowed: 0, dropped: 0 };
    // Fail fast (connection configured without an offline queue and not connected): nothing is
    // sent, and no queue.add is left waiting for the connection to come back.
    if (this.connection.options.enableOfflineQueue === false && this.connection.status !== 'ready') {
      throw new Error(`event producer: Redis connection is ${this.connection.status}`);
    }
    const keys: string[] = [];
    const counts: number[] = [];
    const events: string[] = [];
    for (const item of used) {
      keys.push(bufferKey(this.prefix, item.dest.id), overflowKey(this.prefix, item.dest.id));
      counts.push(item.events.length);
      for (const e of item.events) events.push(e);
    }
    // The flush jobs are added right behind the append on the same connection, without waiting
    // for its answer: Redis runs one connection's commands in order, so a job never precedes its
    // events, and the publish costs one round trip instead of two. (A job for events that were
    // all dropped, or whose append failed, finds an empty buffer: harmless.)
    const now = Date.now();
    const append = this.connection.warrenEventAppend(keys.length, ...keys, this.bufferCap, this.overflowCap, used.length, ...counts, ...events);
    const adds: Promise<void>[] = [];
    const seen = new Set<string>();
    for (const item of used) {
      if (seen.has(item.dest.id)) continue;
      seen.add(item.dest.id);
      const until = this.scheduledUntil.get(item.dest.id);
      if (until !== undefined && now < until) continue;
      adds.push(this.schedule(item.dest.id, item.dest.kind, now));
    }
    const [res] = await Promise.all([append, Promise.all(adds)]);
    let accepted = 0;
    let overflowed = 0;
    let dropped = 0;
    used.forEach((_item, k) => {
      const a = Number(res[3 * k]);
      const o = Number(res[3 * k + 1]);
      const d = Number(res[3 * k + 2]);
      accepted += a;
      overflowed += o + d;
      dropped += d;
    });
    return { accepted, overflowed, dropped };
  }

  private async schedule(destId: string, kind: EventTargetKind, now: number): Promise<void> {
    const jobId = newFlushJobId(destId);
    const job = await this.queue(kind).add(FLUSH_JOB_NAME, { destId }, { ...flushJobOptions(destId, this.lingerMs), jobId });
    if (job.id === jobId && this.lingerMs >= 2) {
      if (this.scheduledUntil.size >= MAX_SCHEDULED_ENTRIES) this.pruneScheduled(now);
      this.scheduledUntil.set(destId, now + Math.floor(this.lingerMs / 2));
    } else {
      this.scheduledUntil.delete(destId);
    }
  }

  private pruneScheduled(now: number): void {
    for (const [k, t] of this.scheduledUntil) if (t <= now) this.scheduledUntil.delete(k);
    if (this.scheduledUntil.size >= MAX_SCHEDULED_ENTRIES) this.scheduledUntil.clear();
  }

  /** Closes the BullMQ Queue objects (not the connection it was given). */
  async close(): Promise<void> {
    this.closed = true;
    const qs = [...this.queues.values()];
    this.queues.clear();
    await Promise.all(qs.map((q) => q.close().catch(() => {})));
  }
}
