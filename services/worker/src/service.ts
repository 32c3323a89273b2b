import { Queue, Worker, type Job } from 'bullmq';
import { Redis } from 'ioredis';
import type pg from 'pg';
import type { Logger } from '@warren/shared';
import { EVENT_TARGET_KINDS, TARGET_QUEUES, bufferKey, type EventTargetKind, type FlushJobData } from '@warren/shared';
import { EventProducer, FLUSH_JOB_NAME, FLUSH_REMOVE_ON_COMPLETE, FLUSH_REMOVE_ON_FAIL, flushJobOptions, newFlushJobId } from '../../shared/src/events/producer.js';
import { DeadLetters } from './dead-letters.js';
import { FlushProcessor, TargetCache, scheduleBackoff, type FlushResult } from './flush.js';
import { createWorkerMetrics, type WorkerMetrics } from './metrics.js';
import { DestinationStore } from './store.js';
import type { TargetEnv, TargetFactory } from './targets/types.js';

/** Queue of the worker's own periodic jobs (probes of paused destinations, safety sweep). */
export const MAINTENANCE_QUEUE = 'events-maintenance';

export interface DeliveryServiceOptions {
  pool: pg.Pool;
  redisUrl: string;
  prefix: string;
  /** Concurrent flush jobs per target queue. */
  concurrency: number;
  retryScheduleMs: number[];
  pauseProbeMs: number;
  autoPauseAfterMs: number;
  destCacheMs: number;
  sweepIntervalMs: number;
  maxBatchesPerJob: number;
  targetEnv: TargetEnv;
  createTarget: TargetFactory;
  log: Logger;
  metrics?: WorkerMetrics;
  /** BullMQ lock of an active job (§3: 60 s, longer than the worst request). */
  lockDurationMs?: number;
  /** How often stalled jobs (dead workers) are looked for (default 30 s). */
  stalledIntervalMs?: number;
  /** Producer settings for replays and the relay. */
  lingerMs?: number;
  bufferCap?: number;
  /** Target kinds to run workers for (default all). */
  kinds?: readonly EventTargetKind[];
}

// Destinations remembered for the buffer gauge.
const MAX_KNOWN_DESTINATIONS = 1000;
const FAILED_GUARD_TTL_S = 8 * 24 * 3600;

/**
 * The delivery side: one BullMQ worker per target queue running {@link FlushProcessor}, plus a
 * maintenance queue with two job schedulers (probe of paused destinations, safety sweep), and
 * an {@link EventProducer} for the outbox relay and dead-letter replays.
 *
 * Connections (§3): workers get their own (BullMQ opens a regular and a blocking one per worker,
 * `maxRetriesPerRequest: null`); `commands` (buffer reads/trims, follow-up jobs) waits through a
 * Redis restart rather than failing a job; the producer's fails fast (`enableOfflineQueue: false`).
 */
export class DeliveryService {
  readonly metrics: WorkerMetrics;
  readonly store: DestinationStore;
  readonly deadLetters: DeadLetters;
  readonly producer: EventProducer;
  readonly flush: FlushProcessor;
  private readonly targets: TargetCache;
  private readonly queues = new Map<EventTargetKind, Queue<FlushJobData>>();
  private readonly workers: Worker[] = [];
  private maintenanceQueue?: Queue;
  private readonly known = new Map<string, EventTargetKind>();
  private stopping?: Promise<void>;

  private constructor(
    private readonly o: DeliveryServiceOptions,
    private readonly commands: Redis,
    private readonly producerConnection: Redis,
  ) {
    this.metrics = o.metrics ?? createWorkerMetrics();
    this.store = new DestinationStore(o.pool, o.destCacheMs);
    this.deadLetters = new DeadLetters(o.pool);
    this.targets = new TargetCache(o.createTarget, o.targetEnv);
    this.producer = new EventProducer({ connection: producerConnection, prefix: o.prefix, lingerMs: o.lingerMs, bufferCap: o.bufferCap });
    this.flush = new FlushProcessor({
      redis: commands,
      prefix: o.prefix,
      store: this.store,
      deadLetters: this.deadLetters,
      targets: this.targets,
      metrics: this.metrics,
      log: o.log,
      retryScheduleMs: o.retryScheduleMs,
      autoPauseAfterMs: o.autoPauseAfterMs,
      maxBatchesPerJob: o.maxBatchesPerJob,
      queueFor: (kind) => this.queue(kind),
    });
  }

  /** Connects to Redis, starts the workers and the schedulers. */
  static async start(o: DeliveryServiceOptions): Promise<DeliveryService> {
    const commands = new Redis(o.redisUrl, { maxRetriesPerRequest: null, lazyConnect: true, connectionName: `${o.prefix}:worker-commands` });
    const producerConnection = new Redis(o.redisUrl, { enableOfflineQueue: false, maxRetriesPerRequest: 1, lazyConnect: true, connectionName: `${o.prefix}:worker-producer` });
    // Start-up: the first connection error fails the start (one line, see main.ts); later ones are logged.
    const connected = (c: Redis) =>
      new Promise<void>((resolve, reject) => {
        const onError = (err: Error) => reject(err);
        c.once('error', onError);
        c.connect().then(
          () => {
            c.off('error', onError);
            resolve();
          },
          (err: Error) => reject(err),
        );
      });
    try {
      await Promise.all([connected(commands), connected(producerConnection)]);
    } catch (err) {
      for (const c of [commands, producerConnection]) {
        c.on('error', () => {});
        c.disconnect();
      }
      throw err;
    }
    for (const c of [commands, producerConnection]) c.on('error', (err: Error) => o.log.warn({ err: err.message }, 'redis connection error'));
    const svc = new DeliveryService(o, commands, producerConnection);
    await svc.run();
    return svc;
  }

  queue(kind: EventTargetKind): Queue<FlushJobData> {
    let q = this.queues.get(kind);
    if (!q) {
      q = new Queue<FlushJobData>(TARGET_QUEUES[kind], { connection: this.commands, prefix: this.o.prefix });
      q.on('error', (err) => this.o.log.warn({ err: err.message, queue: TARGET_QUEUES[kind] }, 'queue error'));
      this.queues.set(kind, q);
    }
    return q;
  }

  private async run(): Promise<void> {
    const o = this.o;
    const connection = { url: o.redisUrl, maxRetriesPerRequest: null };
    const common = {
      connection,
      prefix: o.prefix,
      lockDuration: o.lockDurationMs ?? 60_000,
      stalledInterval: o.stalledIntervalMs ?? 30_000,
      maxStalledCount: 1,
      removeOnComplete: { ...FLUSH_REMOVE_ON_COMPLETE },
      removeOnFail: { ...FLUSH_REMOVE_ON_FAIL },
    };
    for (const kind of o.kinds ?? EVENT_TARGET_KINDS) {
      const queueName = TARGET_QUEUES[kind];
      const worker = new Worker<FlushJobData, FlushResult>(
        queueName,
        async (job, token, signal) => {
          this.remember(job.data.destId, kind);
          return this.flush.process(job, token, signal);
        },
        { ...common, concurrency: o.concurrency, settings: { backoffStrategy: (attemptsMade: number) => scheduleBackoff(o.retryScheduleMs, attemptsMade) } },
      );
      worker.on('error', (err) => o.log.error({ err: err.message, queue: queueName }, 'worker error'));
      worker.on('stalled', (jobId) => o.log.warn({ job: jobId, queue: queueName }, 'flush job stalled (its worker died or blocked); taken over'));
      worker.on('failed', (job, err) => {
        if (job) void this.onFailed(job as Job<FlushJobData>, kind, err);
      });
      this.workers.push(worker);
    }
    // Maintenance: one job at a time across replicas (job schedulers keep one pending job each).
    const mq = new Queue(MAINTENANCE_QUEUE, { connection: this.commands, prefix: o.prefix });
    mq.on('error', (err) => o.log.warn({ err: err.message, queue: MAINTENANCE_QUEUE }, 'queue error'));
    this.maintenanceQueue = mq;
    const mw = new Worker(
      MAINTENANCE_QUEUE,
      async (job) => {
        if (job.name === 'probe') return { resumed: await this.probe() };
        if (job.name === 'sweep') return await this.sweep();
        return null;
      },
      { ...common, concurrency: 1, removeOnComplete: { age: 3600, count: 10 }, removeOnFail: { age: 24 * 3600, count: 100 } },
    );
    mw.on('error', (err) => o.log.error({ err: err.message, queue: MAINTENANCE_QUEUE }, 'worker error'));
    mw.on('failed', (job, err) => o.log.warn({ job: job?.name, err: err.message }, 'maintenance job failed'));
    this.workers.push(mw);
    const probeEvery = Math.max(100, Math.min(60_000, Math.floor(o.pauseProbeMs / 4)));
    await mq.upsertJobScheduler('probe-paused', { every: probeEvery }, { name: 'probe', opts: { removeOnComplete: { count: 10 }, removeOnFail: { count: 100 } } });
    await mq.upsertJobScheduler('sweep', { every: o.sweepIntervalMs }, { name: 'sweep', opts: { removeOnComplete: { count: 10 }, removeOnFail: { count: 100 } } });
    await Promise.all(this.workers.map((w) => w.waitUntilReady()));

    this.metrics.sources.jobCounts = async () =>
      Promise.all((o.kinds ?? EVENT_TARGET_KINDS).map(async (kind) => ({ kind, counts: await this.queue(kind).getJobCounts('active', 'waiting', 'delayed', 'failed', 'completed', 'prioritized') })));
    this.metrics.sources.bufferSizes = async () => {
      const entries = [...this.known];
      if (!entries.length) return [];
      const pipe = this.commands.pipeline();
      for (const [id] of entries) pipe.llen(bufferKey(o.prefix, id));
      const res = (await pipe.exec()) ?? [];
      const sums = new Map<string, number>();
      entries.forEach(([, kind], i) => sums.set(kind, (sums.get(kind) ?? 0) + Number(res[i]?.[1] ?? 0)));
      return [...sums].map(([kind, events]) => ({ kind, events }));
    };
    this.metrics.sources.pausedCount = () => this.store.pausedCount();
  }

  private remember(destId: string, kind: EventTargetKind): void {
    if (this.known.has(destId)) return;
    if (this.known.size >= MAX_KNOWN_DESTINATIONS) this.known.delete(this.known.keys().next().value!);
    this.known.set(destId, kind);
  }

  /** A job failed for good (deleted destination, stalled twice, BullMQ's attempts cap): dead-letter what it held, once. */
  private async onFailed(job: Job<FlushJobData>, kind: string, err: Error): Promise<void> {
    try {
      if (!job.data.pending?.length) return;
      if ((await job.getState()) !== 'failed') return;
      await this.deadLetterFailed(job, kind, err.message);
    } catch (e) {
      this.o.log.warn({ err: (e as Error).message, job: job.id }, 'dead-lettering a failed job failed');
    }
  }

  private async deadLetterFailed(job: Job<FlushJobData>, kind: string, reason: string): Promise<number> {
    const guard = `${this.o.prefix}:evdlguard:${job.queueName}:${job.id}`;
    if ((await this.commands.set(guard, '1', 'EX', FAILED_GUARD_TTL_S, 'NX')) !== 'OK') return 0;
    const n = await this.flush.deadLetterFailedJob(job, kind, reason);
    if (n) this.o.log.warn({ dest: job.data.destId, events: n, reason }, 'flush job failed; its records dead-lettered');
    return n;
  }

  /** Adds a flush job for a destination now (deduplicated). */
  async schedule(destId: string, kind: EventTargetKind): Promise<void> {
    await this.queue(kind).add(FLUSH_JOB_NAME, { destId }, { ...flushJobOptions(destId, 0), jobId: newFlushJobId(destId) });
  }

  /**
   * The relay saw `event_destination_updated.v0` / `_deleted.v0`: drop the cached destination and
   * target; an update resumes a paused destination at once.
   */
  async onDestinationChanged(destId: string, deleted: boolean): Promise<void> {
    this.store.invalidate(destId);
    this.targets.drop(destId);
    if (deleted) return; // its buffer goes to the dead letters with the next flush or sweep
    const dest = await this.store.get(destId);
    if (!dest) return;
    if (await this.store.unpause(destId)) this.o.log.info({ dest: destId }, 'destination updated; resumed');
    this.store.invalidate(destId);
    await this.schedule(destId, dest.kind);
  }

  /** Unpauses destinations paused at least PAUSE_PROBE_MS ago and flushes them (an auth failure pauses again). */
  async probe(): Promise<number> {
    const due = await this.store.pausedDue(this.o.pauseProbeMs);
    for (const d of due) {
      await this.store.unpause(d.id);
      this.store.invalidate(d.id);
      await this.schedule(d.id, d.kind);
      this.o.log.info({ dest: d.id, reason: d.reason }, 'probing paused destination');
    }
    return due.length;
  }

  /**
   * Safety net: every buffer or overflow list gets a flush job (a producer may have died
   * between its append and its add); buffers of deleted destinations and overflows of paused ones
   * go to the dead letters; records of finally failed jobs too.
   */
  async sweep(): Promise<{ destinations: number; failedJobs: number }> {
    const ids = new Set<string>();
    for (const kind of ['evbuf', 'evoverflow']) {
      const match = `${this.o.prefix}:${kind}:*`;
      let cursor = '0';
      do {
        const [next, keys] = await this.commands.scan(cursor, 'MATCH', match, 'COUNT', 1000);
        cursor = next;
        for (const k of keys) ids.add(k.slice(match.length - 1));
      } while (cursor !== '0' && ids.size < 100_000);
    }
    for (const id of ids) {
      const dest = await this.store.get(id);
      if (!dest) {
        // Only when no flush job holds the destination (that job handles it itself).
        const held = await this.commands.exists(...EVENT_TARGET_KINDS.map((k) => `${this.o.prefix}:${TARGET_QUEUES[k]}:de:${id}`));
        if (!held) await this.flush.dropDeleted(id);
      } else if (dest.paused) await this.flush.drainOverflow(id, dest);
      else await this.schedule(id, dest.kind);
    }
    let failedJobs = 0;
    for (const kind of this.o.kinds ?? EVENT_TARGET_KINDS) {
      const failed = (await this.queue(kind).getFailed(0, 199)) as Job<FlushJobData>[];
      for (const job of failed) {
        if (job?.data?.pending?.length && (await this.deadLetterFailed(job, kind, job.failedReason || 'failed'))) failedJobs++;
      }
    }
    return { destinations: ids.size, failedJobs };
  }

  /**
   * Stops taking jobs and waits for the active ones, at most `timeoutMs`; then force-closes
   * (the unfinished jobs keep their records in job data and are taken over as stalled).
   */
  stop(timeoutMs: number): Promise<void> {
    this.stopping ??= (async () => {
      this.flush.stopping = true;
      let timer: NodeJS.Timeout | undefined;
      const graceful = Promise.all(this.workers.map((w) => w.close())).then(() => true);
      const timedOut = new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), timeoutMs)));
      const ok = await Promise.race([graceful, timedOut]).catch(() => false);
      clearTimeout(timer);
      if (!ok) {
        this.o.log.warn({ timeout_ms: timeoutMs }, 'shutdown timed out; abandoning active jobs (they are taken over as stalled)');
        await Promise.all(this.workers.map((w) => w.close(true).catch(() => {})));
      }
      await this.producer.close();
      await Promise.all([...this.queues.values(), ...(this.maintenanceQueue ? [this.maintenanceQueue] : [])].map((q) => q.close().catch(() => {})));
      this.targets.closeAll();
      await Promise.all([this.commands.quit().catch(() => this.commands.disconnect()), this.producerConnection.quit().catch(() => this.producerConnection.disconnect())]);
    })();
    return this.stopping;
  }
}
