import { DelayedError, UnrecoverableError, type Job, type Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import type { Logger } from '@warren/shared';
import { bufferKey, overflowKey, type EventTargetKind, type FlushJobData } from '@warren/shared';
import { FLUSH_JOB_NAME, flushJobOptions, newFlushJobId } from '../../shared/src/events/producer.js';
import type { DeadLetters } from './dead-letters.js';
import type { DeadLetterReason, WorkerMetrics } from './metrics.js';
import type { DestinationState, DestinationStore } from './store.js';
import type { EventRecord, Target, TargetEnv, TargetFactory } from './targets/types.js';

/**
 * The flush job (event-delivery.md §2.3). One job per destination at a time (BullMQ
 * deduplication by destination id):
 *
 * 1. Records left in `job.data.pending` (a retry, a throttled job, or a job taken over after its
 *    worker died) are sent first.
 * 2. Otherwise it claims one batch from the head of the buffer: LRANGE, `job.updateData({pending})`,
 *    and only then LTRIM, so a crash between the two loses nothing (it duplicates at most).
 * 3. The outcome of each call decides (see {@link FlushProcessor.process}); after success it goes
 *    on with the next claim, at most `maxBatchesPerJob` rounds per job.
 * 4. At the end: removes its deduplication key, then checks LLEN again and adds a new flush job
 *    if events arrived meanwhile (closing the race with producers that found the key still set).
 *
 * Where records live when the destination is paused (auth failure, or failing for too long): back
 * at the HEAD of the buffer (LPUSH in reverse, so the order is kept) and the job completes. A paused
 * destination's whole backlog is therefore in its buffer; the next flush after a probe or an update
 * starts from it. LPUSH happens before the job data is cleared: a crash in between duplicates
 * those records, never loses them.
 */

export interface FlushDeps {
  /** Command connection (maxRetriesPerRequest null): buffer reads and trims. */
  redis: Redis;
  prefix: string;
  store: DestinationStore;
  deadLetters: DeadLetters;
  targets: TargetCache;
  metrics: WorkerMetrics;
  log: Logger;
  /** Waits between attempts; attempts = length + 1. */
  retryScheduleMs: number[];
  autoPauseAfterMs: number;
  maxBatchesPerJob: number;
  /** The target queue of a kind (used to add follow-up flush jobs). */
  queueFor(kind: EventTargetKind): Queue<FlushJobData>;
}

export interface FlushResult {
  delivered: number;
  paused?: boolean;
  more?: boolean;
}

/** Jitter ±20 %. */
export function jitter(ms: number, rnd = Math.random): number {
  return Math.max(0, Math.round(ms * (0.8 + 0.4 * rnd())));
}

/** The custom backoff: the schedule's entry for this attempt (the last one repeats), ±20 %. */
export function scheduleBackoff(schedule: number[], attemptsMade: number): number {
  const i = Math.min(Math.max(attemptsMade - 1, 0), schedule.length - 1);
  return jitter(schedule[i] ?? 5_000);
}

const DAY = 86_400_000;
/** CloudWatch accepts [now − 14 d + 5 min, now + 2 h]; one call spans at most 24 h. */
const CW_MAX_AGE_MS = 14 * DAY - 5 * 60_000;
const CW_MAX_FUTURE_MS = 2 * 3_600_000;
const CW_MAX_SPAN_MS = DAY;

/** An envelope's record, or null when the text is no usable envelope. */
export function toRecord(body: string): EventRecord | null {
  try {
    const e = JSON.parse(body) as { event_id?: unknown; event_timestamp?: unknown } | null;
    if (!e || typeof e !== 'object' || typeof e.event_id !== 'string' || !e.event_id) return null;
    const ts = typeof e.event_timestamp === 'string' ? Date.parse(e.event_timestamp) : NaN;
    return { eventId: e.event_id, body, timestamp: Number.isFinite(ts) ? ts : Date.now() };
  } catch {
    return null;
  }
}

interface Dead {
  records: EventRecord[];
  reason: DeadLetterReason;
  detail?: string;
}

/**
 * Splits records into calls that respect the target's limits. A record larger than one call
 * allows is dead (`record_too_large`); CloudWatch also drops what it would reject for its time
 * (`timestamp_out_of_range`), sorts by time and starts a new call at a 24 h span.
 */
export function makeBatches(records: EventRecord[], target: Pick<Target, 'kind' | 'limits' | 'recordBytes'>, now = Date.now()): { batches: EventRecord[][]; dead: Dead[] } {
  const { maxRecords, maxBatchBytes, maxRecordBytes } = target.limits;
  const tooLarge: EventRecord[] = [];
  const outOfRange: EventRecord[] = [];
  let list: Array<{ r: EventRecord; size: number }> = [];
  for (const r of records) {
    const size = target.recordBytes(r);
    if (size > maxRecordBytes || size > maxBatchBytes) tooLarge.push(r);
    else if (target.kind === 'cloudwatch_logs' && (r.timestamp < now - CW_MAX_AGE_MS || r.timestamp > now + CW_MAX_FUTURE_MS)) outOfRange.push(r);
    else list.push({ r, size });
  }
  const cw = target.kind === 'cloudwatch_logs';
  if (cw) list = list.map((x, i) => ({ ...x, i })).sort((a, b) => a.r.timestamp - b.r.timestamp || a.i - b.i);
  const batches: EventRecord[][] = [];
  let cur: EventRecord[] = [];
  let bytes = 0;
  for (const { r, size } of list) {
    if (cur.length > 0 && (cur.length >= maxRecords || bytes + size > maxBatchBytes || (cw && r.timestamp - cur[0]!.timestamp >= CW_MAX_SPAN_MS))) {
      batches.push(cur);
      cur = [];
      bytes = 0;
    }
    cur.push(r);
    bytes += size;
  }
  if (cur.length) batches.push(cur);
  const dead: Dead[] = [];
  if (tooLarge.length) dead.push({ records: tooLarge, reason: 'record_too_large', detail: `larger than ${maxRecordBytes} bytes` });
  if (outOfRange.length) dead.push({ records: outOfRange, reason: 'timestamp_out_of_range', detail: 'outside [now - 14 d + 5 min, now + 2 h]' });
  return { batches, dead };
}

type Stop = { kind: 'throttled'; reason: string; retryAfterMs?: number } | { kind: 'auth'; reason: string } | { kind: 'retry'; reason: string };

interface RoundResult {
  delivered: number;
  /** Records that must be sent again (partial failures, the stopped call, calls not made yet), in order. */
  rest: EventRecord[];
  stop?: Stop;
  /** Some records were reported failed-but-retryable while the call itself succeeded. */
  partial: boolean;
}

/** Caches one target per destination, rebuilt when the stored target changes. */
export class TargetCache {
  private readonly targets = new Map<string, { key: string; target: Target }>();

  constructor(
    private readonly factory: TargetFactory,
    private readonly env: TargetEnv,
  ) {}

  get(dest: DestinationState): Target {
    const key = `${dest.kind}|${dest.accountId}|${JSON.stringify(dest.target)}`;
    const hit = this.targets.get(dest.id);
    if (hit && hit.key === key) return hit.target;
    if (hit) closeQuietly(hit.target);
    const target = this.factory({ id: dest.id, accountId: dest.accountId, kind: dest.kind, target: dest.target }, this.env);
    this.targets.set(dest.id, { key, target });
    return target;
  }

  drop(destId: string): void {
    const hit = this.targets.get(destId);
    if (hit) closeQuietly(hit.target);
    this.targets.delete(destId);
  }

  closeAll(): void {
    for (const { target } of this.targets.values()) closeQuietly(target);
    this.targets.clear();
  }
}

function closeQuietly(t: Target): void {
  try {
    t.close();
  } catch {
    /* a target that fails to close has nothing left to lose */
  }
}

/** Atomically takes up to `count` items from the head of a list (used where nobody else claims). */
const POP_SCRIPT = `
local items = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
if #items > 0 then redis.call('LTRIM', KEYS[1], #items, -1) end
return items
`;

type PoppingRedis = Redis & { warrenListPop(key: string, count: number): Promise<string[]> };

export class FlushProcessor {
  private readonly redis: PoppingRedis;
  /** Set on shutdown: active jobs finish their current call and claim nothing more. */
  stopping = false;

  constructor(private readonly d: FlushDeps) {
    this.redis = d.redis as PoppingRedis;
    if (typeof this.redis.warrenListPop !== 'function') this.redis.defineCommand('warrenListPop', { numberOfKeys: 1, lua: POP_SCRIPT });
  }

  private buf(destId: string): string {
    return bufferKey(this.d.prefix, destId);
  }

  /** The BullMQ processor. */
  process = async (job: Job<FlushJobData>, token?: string, signal?: AbortSignal): Promise<FlushResult> => {
    const { destId } = job.data;
    const dest = await this.d.store.get(destId);
    await this.drainOverflow(destId, dest);
    if (!dest) {
      await this.dropDeleted(destId, job);
      throw new UnrecoverableError(`destination ${destId} no longer exists`);
    }
    if (dest.paused) {
      await this.requeue(job, dest, job.data.pending ?? []);
      return { delivered: 0, paused: true };
    }
    const target = this.d.targets.get(dest);
    let pending = job.data.pending ?? [];
    // The parsed records of a fresh claim (parsed once, to size it): the round reuses them.
    let claimedRecords: Array<EventRecord | null> | undefined;
    let rounds = 0;
    let delivered = 0;
    for (;;) {
      if (pending.length === 0) {
        if (rounds >= this.d.maxBatchesPerJob || this.stopping) break;
        const claimed = await this.claim(job, target);
        pending = claimed.bodies;
        claimedRecords = claimed.records;
        if (pending.length === 0) break;
      }
      rounds++;
      const round = await this.round(job, dest, target, pending, signal, claimedRecords);
      claimedRecords = undefined;
      delivered += round.delivered;
      if (round.delivered > 0) await this.d.store.recordSuccess(dest).catch((err: unknown) => this.d.log.warn({ err, dest: destId }, 'recording a success failed'));
      if (round.rest.length === 0) {
        pending = [];
        // A retried job got its records through: hand the rest of the buffer to a fresh job, so
        // new records get the whole retry schedule rather than what this job has left.
        if (job.attemptsMade > 0) break;
        continue;
      }
      const stop: Stop = round.stop ?? { kind: 'retry', reason: 'partial failure: some records were not accepted' };
      if (stop.kind === 'auth') {
        await this.pause(job, dest, round.rest, stop.reason, false);
        return { delivered, paused: true };
      }
      if (stop.kind === 'throttled') {
        this.d.metrics.throttled(dest.kind);
        const wait = Math.max(stop.retryAfterMs ?? 0, jitter(this.d.retryScheduleMs[0] ?? 5_000));
        await job.updateData({ destId, pending: round.rest.map((r) => r.body) });
        this.d.log.info({ dest: destId, kind: dest.kind, wait_ms: wait, reason: stop.reason }, 'destination throttled; flush delayed');
        await job.moveToDelayed(Date.now() + wait, token);
        throw new DelayedError();
      }
      // A failed attempt (whole call, or records of a partial failure).
      this.d.metrics.failed(dest.kind, round.rest.length);
      if (job.attemptsMade >= this.d.retryScheduleMs.length) {
        // Schedule exhausted: these records go to the dead letters; anything claimed but never
        // tried goes back to the buffer, and a fresh job (fresh attempts) takes over.
        await this.deadLetter(dest.id, dest.accountId, dest.kind, [{ records: round.rest, reason: 'exhausted', detail: `${this.d.retryScheduleMs.length + 1} attempts: ${stop.reason}` }], job);
        await job.updateData({ destId });
        this.d.log.warn({ dest: destId, kind: dest.kind, events: round.rest.length, reason: stop.reason }, 'retries exhausted; events dead-lettered');
        pending = [];
        break;
      }
      if (!round.partial || round.delivered === 0) {
        const since = await this.d.store.recordFailure(dest.id);
        if (Date.now() - since.getTime() >= this.d.autoPauseAfterMs) {
          this.d.log.warn({ dest: destId, kind: dest.kind, failing_since: since.toISOString(), reason: stop.reason }, 'destination failing continuously; paused');
          await this.pause(job, dest, round.rest, `failing since ${since.toISOString()}: ${stop.reason}`, true);
          return { delivered, paused: true };
        }
      }
      await job.updateData({ destId, pending: round.rest.map((r) => r.body) });
      this.d.metrics.retried(dest.kind, round.rest.length);
      throw new Error(stop.reason);
    }
    // Everything claimed was delivered (or dead-lettered): a completed job keeps no event bodies
    // in Redis (completed jobs are kept for an hour).
    if (job.data.pending?.length) await job.updateData({ destId });
    const more = await this.finish(job, dest.kind);
    return { delivered, more };
  };

  /** Claims one call's worth from the head of the buffer (job data first, then LTRIM). */
  private async claim(job: Job<FlushJobData>, target: Target): Promise<{ bodies: string[]; records: Array<EventRecord | null> }> {
    const destId = job.data.destId;
    const items = await this.d.redis.lrange(this.buf(destId), 0, target.limits.maxRecords - 1);
    if (items.length === 0) return { bodies: [], records: [] };
    const records: Array<EventRecord | null> = [];
    let bytes = 0;
    for (const body of items) {
      const rec = toRecord(body);
      const size = rec ? target.recordBytes(rec) : 0;
      if (records.length > 0 && bytes + size > target.limits.maxBatchBytes) break;
      bytes += Math.min(size, target.limits.maxBatchBytes);
      records.push(rec);
    }
    const claimed = records.length === items.length ? items : items.slice(0, records.length);
    await job.updateData({ destId, pending: claimed });
    await this.d.redis.ltrim(this.buf(destId), claimed.length, -1);
    return { bodies: claimed, records };
  }

  /** Sends `pending` (one claim, or what a previous attempt left), call by call. */
  private async round(job: Job<FlushJobData>, dest: DestinationState, target: Target, pending: string[], signal?: AbortSignal, parsed?: Array<EventRecord | null>): Promise<RoundResult> {
    const records: EventRecord[] = [];
    const invalid: EventRecord[] = [];
    for (let i = 0; i < pending.length; i++) {
      const body = pending[i]!;
      const r = parsed ? parsed[i]! : toRecord(body);
      if (r) records.push(r);
      else invalid.push({ eventId: '', body, timestamp: Date.now() });
    }
    const { batches, dead } = makeBatches(records, target);
    if (invalid.length) dead.push({ records: invalid, reason: 'invalid_envelope', detail: 'not a JSON envelope with an event_id' });
    await this.deadLetter(dest.id, dest.accountId, dest.kind, dead, job);
    const failed: EventRecord[] = [];
    let delivered = 0;
    for (let i = 0; i < batches.length; i++) {
      const work: EventRecord[][] = [batches[i]!];
      while (work.length) {
        const b = work.shift()!;
        const o = await target.send(b, signal);
        switch (o.kind) {
          case 'done': {
            const retry = new Set(o.retry);
            const deadIdx = new Map(o.dead.map((x) => [x.index, x.reason]));
            const byReason = new Map<string, EventRecord[]>();
            b.forEach((r, idx) => {
              if (retry.has(idx) && !deadIdx.has(idx)) failed.push(r);
              else if (deadIdx.has(idx)) {
                const why = deadIdx.get(idx)!;
                const list = byReason.get(why) ?? [];
                list.push(r);
                byReason.set(why, list);
              }
            });
            const ok = b.length - retry.size - [...deadIdx.keys()].filter((k) => !retry.has(k)).length;
            if (ok > 0) {
              delivered += ok;
              this.d.metrics.delivered(dest.kind, ok);
              this.d.metrics.delivery(dest.kind, (Date.now() - job.timestamp) / 1000);
            }
            await this.deadLetter(
              dest.id,
              dest.accountId,
              dest.kind,
              [...byReason].map(([why, recs]) => ({ records: recs, reason: /too old|too new|future|past|timestamp/i.test(why) ? ('timestamp_out_of_range' as const) : ('record_failed' as const), detail: why })),
              job,
            );
            break;
          }
          case 'too_large':
            if (b.length === 1) await this.deadLetter(dest.id, dest.accountId, dest.kind, [{ records: b, reason: 'record_too_large', detail: o.reason }], job);
            else {
              const half = Math.ceil(b.length / 2);
              work.unshift(b.slice(0, half), b.slice(half));
            }
            break;
          case 'rejected':
            await this.deadLetter(dest.id, dest.accountId, dest.kind, [{ records: b, reason: 'rejected', detail: o.reason }], job);
            break;
          case 'throttled':
          case 'auth':
          case 'retry': {
            const rest = [...failed, ...b, ...work.flat(), ...batches.slice(i + 1).flat()];
            const stop: Stop = o.kind === 'throttled' ? { kind: 'throttled', reason: o.reason, retryAfterMs: o.retryAfterMs } : { kind: o.kind, reason: o.reason };
            if (o.kind === 'retry') this.d.log.info({ dest: dest.id, kind: dest.kind, reason: o.reason, unknown_outcome: o.unknownOutcome }, 'delivery attempt failed');
            return { delivered, rest, stop, partial: false };
          }
        }
      }
      // Between calls of one claim: what is left, so a crash does not resend accepted calls.
      if (i < batches.length - 1) await job.updateData({ destId: dest.id, pending: [...failed, ...batches.slice(i + 1).flat()].map((r) => r.body) });
    }
    return { delivered, rest: failed, partial: failed.length > 0 };
  }

  /** Pauses the destination: records back to the head of its buffer, job data cleared, job done. */
  private async pause(job: Job<FlushJobData>, dest: DestinationState, rest: EventRecord[], reason: string, auto: boolean): Promise<void> {
    await this.d.store.pause(dest.id, reason);
    this.d.metrics.paused(dest.kind, auto);
    if (!auto) this.d.log.warn({ dest: dest.id, kind: dest.kind, reason }, 'destination paused (authentication or authorization failure)');
    await this.requeue(job, dest, rest.map((r) => r.body));
  }

  /** Puts records back at the head of the buffer in their order, then clears the job's pending. */
  private async requeue(job: Job<FlushJobData>, dest: DestinationState, bodies: string[]): Promise<void> {
    if (bodies.length) await this.d.redis.lpush(this.buf(dest.id), ...[...bodies].reverse());
    if (job.data.pending?.length || bodies.length) await job.updateData({ destId: dest.id });
  }

  /** End of a job: drop our deduplication key, then look again (race with producers). */
  private async finish(job: Job<FlushJobData>, kind: EventTargetKind): Promise<boolean> {
    const destId = job.data.destId;
    await job.removeDeduplicationKey();
    const [[, len], [, olen]] = (await this.d.redis.multi().llen(this.buf(destId)).llen(overflowKey(this.d.prefix, destId)).exec()) as [[unknown, number], [unknown, number]];
    if (len > 0 || olen > 0) {
      await this.d.queueFor(kind).add(FLUSH_JOB_NAME, { destId }, { ...flushJobOptions(destId, 0), jobId: newFlushJobId(destId) });
      return true;
    }
    return false;
  }

  /** Overflow (buffer was full) → dead letters `buffer_full`. */
  async drainOverflow(destId: string, dest: DestinationState | null, kind?: string): Promise<number> {
    let total = 0;
    for (;;) {
      const items = await this.redis.warrenListPop(overflowKey(this.d.prefix, destId), 1000);
      if (items.length === 0) return total;
      total += items.length;
      await this.deadLetterBodies(destId, dest?.accountId ?? '', dest?.kind ?? kind ?? 'unknown', items, 'buffer_full', undefined, null);
    }
  }

  /** A deleted destination: its buffer and whatever the job held → dead letters. */
  async dropDeleted(destId: string, job?: Job<FlushJobData>): Promise<number> {
    let total = 0;
    const pending = job?.data.pending ?? [];
    if (pending.length) {
      await this.deadLetterBodies(destId, '', 'unknown', pending, 'destination_deleted', undefined, new Date(job!.timestamp));
      await job!.updateData({ destId });
      total += pending.length;
    }
    for (;;) {
      const items = await this.redis.warrenListPop(this.buf(destId), 1000);
      if (items.length === 0) break;
      total += items.length;
      await this.deadLetterBodies(destId, '', 'unknown', items, 'destination_deleted', undefined, null);
    }
    total += await this.drainOverflow(destId, null);
    if (total) this.d.log.info({ dest: destId, events: total }, 'destination deleted; its events dead-lettered');
    return total;
  }

  private async deadLetter(destId: string, accountId: string, kind: string, dead: Dead[], job?: Job<FlushJobData>): Promise<void> {
    for (const x of dead) {
      if (!x.records.length) continue;
      await this.deadLetterBodies(
        destId,
        accountId,
        kind,
        x.records.map((r) => r.body),
        x.reason,
        x.detail,
        job ? new Date(job.timestamp) : null,
      );
    }
  }

  private async deadLetterBodies(destId: string, accountId: string, kind: string, bodies: string[], reason: DeadLetterReason, detail: string | undefined, firstAttemptAt: Date | null): Promise<void> {
    await this.d.deadLetters.add({ destinationId: destId, accountId, envelopes: bodies, reason: detail ? `${reason}: ${detail}` : reason, firstAttemptAt, lastAttemptAt: new Date() });
    this.d.metrics.deadLettered(kind, reason, bodies.length);
  }

  /** Dead-letters what a finally failed job still held (called once per job, see the guard in service.ts). */
  async deadLetterFailedJob(job: Job<FlushJobData>, kind: string, reason: string): Promise<number> {
    const pending = job.data.pending ?? [];
    if (!pending.length) return 0;
    const dest = await this.d.store.get(job.data.destId).catch(() => null);
    await this.deadLetterBodies(job.data.destId, dest?.accountId ?? '', kind, pending, 'job_failed', reason, new Date(job.timestamp));
    await job.updateData({ destId: job.data.destId }).catch(() => {});
    return pending.length;
  }
}
