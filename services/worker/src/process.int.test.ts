import { deleteKeys } from '../../../test/support/redis-keys.js';
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import pg from 'pg';
import { Redis } from 'ioredis';
import { TARGET_QUEUES } from '@warren/shared';
import { Queue } from 'bullmq';
import { freshDatabase } from '../../../test/support/databases.js';
import { WORKER_START_MS, WORK_MS } from '../../../test/support/timeouts.js';
import { startDatadogFake, type DatadogFake } from '../../../test/support/fakes/index.js';
import { EventProducer } from '../../shared/src/events/producer.js';
import { envelope, startWorkerProcess, waitFor, type WorkerProcess } from './testing.js';

/**
 * The worker as a child process (`node --import tsx services/worker/src/main.ts`): SIGKILL in
 * the middle of a call loses nothing (only the in-flight call may arrive twice); SIGTERM drains
 * without duplicates; queues end empty.
 */

const DD_KEY = 'dd_process_SECRET_key_000000';
let db: Awaited<ReturnType<typeof freshDatabase>>;
let pool: pg.Pool;
let redis: Redis;
let producerConn: Redis;
let producer: EventProducer;
let dd: DatadogFake;
const prefix = `warren_test_${inject('runId')}_${randomBytes(3).toString('hex')}`;
const workers: WorkerProcess[] = [];

beforeAll(async () => {
  db = await freshDatabase();
  pool = new pg.Pool({ connectionString: db.url, max: 2 });
  redis = new Redis(inject('redisUrl'), { maxRetriesPerRequest: null });
  producerConn = new Redis(inject('redisUrl'), { enableOfflineQueue: false, maxRetriesPerRequest: 1, lazyConnect: true });
  await producerConn.connect();
  producer = new EventProducer({ connection: producerConn, prefix, lingerMs: 20 });
  dd = await startDatadogFake({ apiKeys: [DD_KEY] });
  await pool.query(`INSERT INTO accounts (id) VALUES ('ac_proc')`);
});
afterAll(async () => {
  for (const w of workers) await w.stop('SIGKILL').catch(() => {});
  await producer?.close();
  producerConn?.disconnect();
  if (redis) {
    await deleteKeys(redis, `${prefix}:*`);
    redis.disconnect();
  }
  await dd?.close();
  await pool?.end();
  await db?.drop();
});

function start(): Promise<WorkerProcess> {
  return startWorkerProcess({
    DATABASE_URL: db.url,
    REDIS_URL: inject('redisUrl'),
    EVENTS_PREFIX: prefix,
    DATADOG_BASE_URL: dd.url,
    RETRY_SCHEDULE_MS: '200,300,400',
    LOCK_DURATION_MS: '2000',
    STALLED_INTERVAL_MS: '1000',
    SHUTDOWN_TIMEOUT_MS: '8000',
    WORKER_CONCURRENCY: '5',
    REQUEST_TIMEOUT_MS: '10000',
    LOG_LEVEL: 'warn',
  }).then((w) => {
    workers.push(w);
    return w;
  });
}

async function unfinished(): Promise<number> {
  const q = new Queue(TARGET_QUEUES.datadog, { connection: redis, prefix });
  const c = await q.getJobCounts('active', 'waiting', 'delayed', 'prioritized');
  await q.close();
  return Object.values(c).reduce((a, b) => a + b, 0);
}

async function destination(): Promise<string> {
  const id = `ed_${randomBytes(5).toString('hex')}`;
  await pool.query(`INSERT INTO event_destinations (id, account_id, target_kind, target) VALUES ($1, 'ac_proc', 'datadog', $2)`, [id, JSON.stringify({ api_key: DD_KEY, ddtags: '', service: 'warren', ddsite: 'datadoghq.com' })]);
  return id;
}

const idsOf = (tag: string, n: number) => Array.from({ length: n }, (_, i) => `ev_${tag}_${String(i).padStart(5, '0')}`);
const accepted = (tag: string) => dd.entries.map((e) => (JSON.parse(e.message) as { event_id: string }).event_id).filter((x) => x.startsWith(`ev_${tag}_`));

describe('worker process', () => {
  it('SIGKILL mid-call: a new worker takes the job over; every event arrives, duplicates only from the call in flight', async () => {
    const dest = await destination();
    const ids = idsOf('kill', 2500);
    dd.reset();
    const a = await start();
    dd.fail({ kind: 'slow', ms: 2500 });
    for (let i = 0; i < ids.length; i += 500) await producer.publish([{ dest: { id: dest, kind: 'datadog' }, events: ids.slice(i, i + 500).map((e) => envelope(e, { account: 'ac_proc' })) }]);
    await waitFor('the slow call', () => dd.requests.some((r) => r.fault === 'slow'));
    const inFlight = dd.requests.find((r) => r.fault === 'slow')!.entries!;
    await a.stop('SIGKILL');
    const b = await start();
    await waitFor('every event', () => new Set(accepted('kill')).size >= ids.length, 20_000);
    await waitFor('queues drained', async () => (await unfinished()) === 0, 10_000);
    const got = accepted('kill');
    expect(new Set(got)).toEqual(new Set(ids));
    // Only the first call (claimed first, in flight when killed) may have arrived twice.
    const counts = new Map<string, number>();
    for (const x of got) counts.set(x, (counts.get(x) ?? 0) + 1);
    const dups = [...counts].filter(([, n]) => n > 1).map(([x]) => x);
    expect(dups.length).toBeLessThanOrEqual(inFlight);
    for (const x of dups) expect(ids.indexOf(x)).toBeLessThan(inFlight);
    expect(await redis.llen(`${prefix}:evbuf:${dest}`)).toBe(0);
    await b.stop();
  }, 90_000); // its own deadlines (20 s + 10 s delivery, plus start-up) can exceed the 30 s default under load

  it('SIGTERM drains the call in flight and exits 0; the next worker delivers the rest with no duplicates', async () => {
    const dest = await destination();
    const ids = idsOf('term', 2500);
    dd.reset();
    const a = await start();
    dd.fail({ kind: 'slow', ms: 1500 });
    for (let i = 0; i < ids.length; i += 500) await producer.publish([{ dest: { id: dest, kind: 'datadog' }, events: ids.slice(i, i + 500).map((e) => envelope(e, { account: 'ac_proc' })) }]);
    await waitFor('the slow call', () => dd.requests.some((r) => r.fault === 'slow' && r.entries));
    const exit = await a.stop('SIGTERM', 15_000);
    expect(exit.code, a.output()).toBe(0);
    expect(accepted('term').length).toBeGreaterThan(0);
    expect(accepted('term').length).toBeLessThan(ids.length);
    const b = await start();
    await waitFor('every event', () => accepted('term').length >= ids.length, 20_000);
    await waitFor('queues drained', async () => (await unfinished()) === 0, 10_000);
    expect(accepted('term')).toEqual(ids);
    const metrics = await (await fetch(`http://127.0.0.1:${b.metricsPort}/metrics`)).text();
    expect(metrics).toMatch(/warren_events_delivered_total\{kind="datadog"\} \d+/);
    expect((await fetch(`http://127.0.0.1:${b.metricsPort}/healthz`)).status).toBe(200);
    await b.stop();
  }, 90_000); // its own deadlines (15 s stop, 20 s + 10 s delivery) exceed the 30 s default: it timed out at 30 s with two full runs at once

  it('start-up problems are one line, no stack trace', async () => {
    await expect(startWorkerProcess({ DATABASE_URL: db.url, REDIS_URL: '' }, WORKER_START_MS)).rejects.toThrow(/warren worker: invalid environment:\n\s+REDIS_URL/);
    const err = await startWorkerProcess({ DATABASE_URL: db.url, REDIS_URL: 'redis://127.0.0.1:1', EVENTS_PREFIX: prefix }, WORKER_START_MS).catch((e: Error) => e);
    expect(String(err)).toMatch(/warren worker: .*ECONNREFUSED/);
    expect(String(err)).not.toMatch(/\n\s+at /);
  }, 2 * WORKER_START_MS + WORK_MS); // each run exits by itself; the waits are hang detectors (15 s ran out with two full runs at once)
});
