import { deleteKeys } from '../../../test/support/redis-keys.js';
import { randomBytes } from 'node:crypto';
import { inject } from 'vitest';
import pg from 'pg';
import { Redis } from 'ioredis';
import { createLogger, TARGET_QUEUES, bufferKey, type EventTargetKind } from '@warren/shared';
import { freshDatabase } from '../../../test/support/databases.js';
import { DeliveryService, type DeliveryServiceOptions } from './service.js';
import type { EventRecord, LoadedDestination, SendOutcome, Target, TargetEnv, TargetFactory, TargetLimits } from './targets/types.js';
import { WORKER_START_MS } from '../../../test/support/timeouts.js';

/** Test helpers of the delivery worker (in-process service on real Redis and Postgres). */

pg.types.setTypeParser(20, (v) => Number(v));

export function envelope(i: number | string, o: { account?: string; timestamp?: string; pad?: number } = {}): string {
  return JSON.stringify({
    event_id: typeof i === 'string' ? i : `ev_${String(i).padStart(6, '0')}`,
    event_type: 'ip_policy_created.v0',
    event_timestamp: o.timestamp ?? new Date(Math.floor(Date.now() / 1000) * 1000).toISOString().replace('.000Z', 'Z'),
    account_id: o.account ?? 'ac_test',
    object: { id: 'ipp_1', description: o.pad ? 'x'.repeat(o.pad) : '' },
    principal: null,
  });
}

export async function waitFor<T>(what: string, fn: () => Promise<T | undefined | false | null> | T | undefined | false | null, timeoutMs = 15_000, everyMs = 50): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v !== undefined && v !== false && v !== null) return v as T;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}${last ? `: ${(last as Error).message}` : ''}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

export interface Harness {
  prefix: string;
  pool: pg.Pool;
  databaseUrl: string;
  redis: Redis;
  service: DeliveryService;
  accountId: string;
  /** Inserts a destination row; returns its id. */
  addDestination(kind: EventTargetKind, target: unknown, id?: string): Promise<string>;
  updateDestination(id: string, target: unknown): Promise<void>;
  deleteDestination(id: string): Promise<void>;
  publish(destId: string, kind: EventTargetKind, events: string[]): Promise<void>;
  /** Jobs of every target queue not finished (active, waiting, delayed, prioritized). */
  unfinishedJobs(): Promise<number>;
  waitDrained(timeoutMs?: number): Promise<void>;
  deadLetters(destId?: string): Promise<Array<{ id: number; destination_id: string; reason: string; event_ids: string[]; payload: unknown[] }>>;
  health(destId: string): Promise<{ paused: boolean; reason: string; failing_since: Date | null } | undefined>;
  /** Every Redis value under the prefix, as text (for the secrets scan). */
  dumpRedis(): Promise<string>;
  restartService(patch?: Partial<DeliveryServiceOptions>): Promise<void>;
  close(): Promise<void>;
}

export async function startHarness(opts: Partial<DeliveryServiceOptions> & { createTarget: TargetFactory; targetEnv?: TargetEnv }): Promise<Harness> {
  const db = await freshDatabase();
  const pool = new pg.Pool({ connectionString: db.url, max: 5 });
  pool.on('error', () => {});
  const prefix = `warren_test_${inject('runId')}_${randomBytes(3).toString('hex')}`;
  const redisUrl = inject('redisUrl');
  const redis = new Redis(redisUrl, { maxRetriesPerRequest: null });
  const accountId = `ac_${randomBytes(4).toString('hex')}`;
  await pool.query('INSERT INTO accounts (id) VALUES ($1)', [accountId]);
  const base: DeliveryServiceOptions = {
    pool,
    redisUrl,
    prefix,
    concurrency: 5,
    retryScheduleMs: [100, 200, 300],
    pauseProbeMs: 600_000,
    autoPauseAfterMs: 72 * 3_600_000,
    destCacheMs: 0,
    sweepIntervalMs: 60_000,
    maxBatchesPerJob: 10,
    targetEnv: opts.targetEnv ?? {},
    log: createLogger('worker-test'),
    lingerMs: 20,
    lockDurationMs: 10_000,
    ...opts,
  };
  let service = await DeliveryService.start(base);
  let n = 0;
  const h: Harness = {
    prefix,
    pool,
    databaseUrl: db.url,
    redis,
    get service() {
      return service;
    },
    accountId,
    async addDestination(kind, target, id) {
      const destId = id ?? `ed_${randomBytes(5).toString('hex')}${n++}`;
      await pool.query('INSERT INTO event_destinations (id, account_id, target_kind, target) VALUES ($1, $2, $3, $4)', [destId, accountId, kind, JSON.stringify(target)]);
      return destId;
    },
    async updateDestination(id, target) {
      await pool.query('UPDATE event_destinations SET target = $2 WHERE id = $1', [id, JSON.stringify(target)]);
      await service.onDestinationChanged(id, false);
    },
    async deleteDestination(id) {
      await pool.query('DELETE FROM event_destinations WHERE id = $1', [id]);
      await service.onDestinationChanged(id, true);
    },
    async publish(destId, kind, events) {
      await service.producer.publish([{ dest: { id: destId, kind }, events }]);
    },
    async unfinishedJobs() {
      let total = 0;
      for (const kind of Object.keys(TARGET_QUEUES) as EventTargetKind[]) {
        const c = await service.queue(kind).getJobCounts('active', 'waiting', 'delayed', 'prioritized');
        total += Object.values(c).reduce((a, b) => a + b, 0);
      }
      return total;
    },
    async waitDrained(timeoutMs = 15_000) {
      await waitFor('queues to drain', async () => (await h.unfinishedJobs()) === 0, timeoutMs);
    },
    async deadLetters(destId) {
      const { rows } = await pool.query('SELECT id, destination_id, reason, event_ids, payload FROM event_dead_letters WHERE ($1::text IS NULL OR destination_id = $1) ORDER BY id', [destId ?? null]);
      return rows;
    },
    async health(destId) {
      const { rows } = await pool.query('SELECT paused, reason, failing_since FROM event_destination_health WHERE destination_id = $1', [destId]);
      return rows[0];
    },
    async dumpRedis() {
      const out: string[] = [];
      let cursor = '0';
      do {
        const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
        cursor = next;
        for (const k of keys) {
          const type = await redis.type(k);
          if (type === 'string') out.push(k, String(await redis.get(k)));
          else if (type === 'list') out.push(k, ...(await redis.lrange(k, 0, -1)));
          else if (type === 'hash') out.push(k, JSON.stringify(await redis.hgetall(k)));
          else if (type === 'set') out.push(k, ...(await redis.smembers(k)));
          else if (type === 'zset') out.push(k, ...(await redis.zrange(k, '0', '-1')));
          else if (type === 'stream') out.push(k, JSON.stringify(await redis.xrange(k, '-', '+')));
        }
      } while (cursor !== '0');
      return out.join('\n');
    },
    async restartService(patch = {}) {
      await service.stop(5_000);
      service = await DeliveryService.start({ ...base, ...patch });
    },
    async close() {
      await service.stop(5_000).catch(() => {});
      await deleteKeys(redis, `${prefix}:*`);
      redis.disconnect();
      await pool.end();
      await db.drop();
    },
  };
  return h;
}

export function bufferLength(h: Harness, destId: string): Promise<number> {
  return h.redis.llen(bufferKey(h.prefix, destId));
}

type Step = SendOutcome | ((records: EventRecord[]) => SendOutcome | Promise<SendOutcome>);

/**
 * An in-memory target: accepts everything unless a scripted outcome is queued for the
 * destination. `accepted` holds event ids in arrival order (accepted records only).
 */
export class ScriptedTargets {
  readonly accepted = new Map<string, string[]>();
  readonly calls = new Map<string, number[]>();
  private readonly scripts = new Map<string, Step[]>();
  limits: TargetLimits = { maxRecords: 100, maxBatchBytes: 100_000, maxRecordBytes: 10_000, overheadBytes: 0 };
  /** Applies to calls of every destination (per-call delay, ms). */
  delayMs = 0;

  script(destId: string, ...steps: Step[]): void {
    this.scripts.set(destId, [...(this.scripts.get(destId) ?? []), ...steps]);
  }

  ids(destId: string): string[] {
    return this.accepted.get(destId) ?? [];
  }

  factory: TargetFactory = (dest: LoadedDestination): Target => {
    const self = this;
    return {
      kind: dest.kind,
      get limits() {
        return self.limits;
      },
      recordBytes: (r) => Buffer.byteLength(r.body),
      async send(records) {
        const calls = self.calls.get(dest.id) ?? [];
        calls.push(records.length);
        self.calls.set(dest.id, calls);
        if (self.delayMs) await new Promise((r) => setTimeout(r, self.delayMs));
        const steps = self.scripts.get(dest.id);
        const step = steps?.shift();
        const outcome: SendOutcome = step === undefined ? { kind: 'done', retry: [], dead: [] } : typeof step === 'function' ? await step(records) : step;
        if (outcome.kind === 'done') {
          const skip = new Set([...outcome.retry, ...outcome.dead.map((d) => d.index)]);
          const list = self.accepted.get(dest.id) ?? [];
          records.forEach((r, i) => !skip.has(i) && list.push(r.eventId));
          self.accepted.set(dest.id, list);
        }
        return outcome;
      },
      close() {},
    };
  };
}

export interface WorkerProcess {
  child: import('node:child_process').ChildProcess;
  metricsPort: number;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  output(): string;
  /** Sends `signal` (default SIGTERM) and waits for the exit (SIGKILL after `timeoutMs`). */
  stop(signal?: NodeJS.Signals, timeoutMs?: number): Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

const liveWorkers = new Set<import('node:child_process').ChildProcess>();

/** Runs services/worker/src/main.ts as a child process (`node --import tsx`) and waits for its 'listening' message. */
export async function startWorkerProcess(env: Record<string, string>, timeoutMs = WORKER_START_MS): Promise<WorkerProcess> {
  const { spawn } = await import('node:child_process');
  const { REPO_ROOT } = await import('../../../test/support/processes.js');
  if (liveWorkers.size === 0)
    process.once('exit', () => {
      for (const c of liveWorkers) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    });
  const child = spawn(process.execPath, ['--import', 'tsx', 'services/worker/src/main.ts'], {
    cwd: REPO_ROOT,
    env: { ...process.env, VITEST: undefined, LOG_LEVEL: 'info', METRICS_PORT: '0', ...env } as NodeJS.ProcessEnv,
    stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
  });
  liveWorkers.add(child);
  let out = '';
  const add = (d: Buffer) => (out = (out + d.toString()).slice(-65_536));
  child.stdout!.on('data', add);
  child.stderr!.on('data', add);
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once('exit', (code, signal) => {
      liveWorkers.delete(child);
      resolve({ code, signal });
    }),
  );
  const metricsPort = await new Promise<number>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`worker did not start within ${timeoutMs} ms:\n${out}`)), timeoutMs);
    child.on('message', (m: { type?: string; metricsPort?: number }) => {
      if (m?.type === 'listening') {
        clearTimeout(timer);
        resolve(m.metricsPort!);
      }
    });
    void exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`worker exited (${code ?? signal}) before listening:\n${out}`));
    });
  });
  return {
    child,
    metricsPort,
    exited,
    output: () => out,
    async stop(signal = 'SIGTERM', ms = 30_000) {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      const timer = setTimeout(() => child.kill('SIGKILL'), ms);
      const r = await exited;
      clearTimeout(timer);
      return r;
    },
  };
}
