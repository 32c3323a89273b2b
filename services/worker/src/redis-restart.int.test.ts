import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, expect, it } from 'vitest';
import pg from 'pg';
import { Redis } from 'ioredis';
import { Queue } from 'bullmq';
import { TARGET_QUEUES } from '@warren/shared';
import { freshDatabase } from '../../../test/support/databases.js';
import { startDatadogFake, type DatadogFake } from '../../../test/support/fakes/index.js';
import { startRedisServer, type RedisServer } from '../../../test/support/redis-server.js';
import { EventProducer } from '../../shared/src/events/producer.js';
import { envelope, startWorkerProcess, waitFor, type WorkerProcess } from './testing.js';

/**
 * Redis restarts (with its append-only file, as production runs it) while the worker process is
 * delivering: the worker reconnects on its own and every event arrives; the producer fails fast
 * while Redis is down and works again afterwards.
 */

const DD_KEY = 'dd_restart_SECRET_key_00000';
let db: Awaited<ReturnType<typeof freshDatabase>>;
let pool: pg.Pool;
let server: RedisServer;
let dd: DatadogFake;
let worker: WorkerProcess | undefined;
let producerConn: Redis;
let producer: EventProducer;
const prefix = `warren_test_${randomBytes(3).toString('hex')}`;

beforeAll(async () => {
  [db, server, dd] = await Promise.all([freshDatabase(), startRedisServer({ persist: true }), startDatadogFake({ apiKeys: [DD_KEY] })]);
  pool = new pg.Pool({ connectionString: db.url, max: 2 });
  await pool.query(`INSERT INTO accounts (id) VALUES ('ac_rr')`);
  producerConn = new Redis(server.url, { enableOfflineQueue: false, maxRetriesPerRequest: 1, lazyConnect: true, retryStrategy: () => 100 });
  producerConn.on('error', () => {});
  await producerConn.connect();
  producer = new EventProducer({ connection: producerConn, prefix, lingerMs: 20 });
});
afterAll(async () => {
  await worker?.stop('SIGKILL').catch(() => {});
  await producer?.close();
  producerConn?.disconnect();
  await server?.dispose();
  await dd?.close();
  await pool?.end();
  await db?.drop();
});

it('survives a Redis restart mid-delivery without losing events', async () => {
  const dest = `ed_${randomBytes(5).toString('hex')}`;
  await pool.query(`INSERT INTO event_destinations (id, account_id, target_kind, target) VALUES ($1, 'ac_rr', 'datadog', $2)`, [dest, JSON.stringify({ api_key: DD_KEY, ddtags: '', service: 'warren', ddsite: 'datadoghq.com' })]);
  worker = await startWorkerProcess({
    DATABASE_URL: db.url,
    REDIS_URL: server.url,
    EVENTS_PREFIX: prefix,
    DATADOG_BASE_URL: dd.url,
    RETRY_SCHEDULE_MS: '200,300,400',
    LOCK_DURATION_MS: '3000',
    STALLED_INTERVAL_MS: '1000',
    SWEEP_INTERVAL_MS: '1000',
    LOG_LEVEL: 'error',
  });
  const ids = Array.from({ length: 3000 }, (_, i) => `ev_rr_${String(i).padStart(5, '0')}`);
  const publish = async (slice: string[]) => {
    await waitFor(
      'a publish that Redis accepts',
      async () => {
        await producer.publish([{ dest: { id: dest, kind: 'datadog' }, events: slice.map((e) => envelope(e, { account: 'ac_rr' })) }]);
        return true;
      },
      15_000,
      100,
    );
  };
  dd.fail({ kind: 'slow', ms: 1000 });
  await publish(ids.slice(0, 1500));
  await waitFor('the slow call', () => dd.requests.some((r) => r.fault === 'slow'));
  await server.restart();
  // Down-time is short; the producer may fail at first (fail fast) and succeeds after reconnecting.
  await publish(ids.slice(1500));
  const accepted = () => dd.entries.map((e) => (JSON.parse(e.message) as { event_id: string }).event_id);
  await waitFor('every event', () => new Set(accepted()).size >= ids.length, 25_000);
  expect(new Set(accepted())).toEqual(new Set(ids));
  const redis = new Redis(server.url);
  const q = new Queue(TARGET_QUEUES.datadog, { connection: redis, prefix });
  await waitFor('queues drained', async () => Object.values(await q.getJobCounts('active', 'waiting', 'delayed', 'prioritized')).every((n) => n === 0), 10_000);
  await q.close();
  redis.disconnect();
  const exit = await worker.stop('SIGTERM', 15_000);
  expect(exit.code, worker.output()).toBe(0);
});
