import { deleteKeys } from '../../../../test/support/redis-keys.js';
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { Redis } from 'ioredis';
import { Queue } from 'bullmq';
import { EventProducer, FLUSH_JOB_NAME } from './producer.js';
import { TARGET_QUEUES, bufferKey, overflowKey, type FlushJobData } from './types.js';

const prefix = `warren_test_${inject('runId')}_${randomBytes(3).toString('hex')}`;
let redis: Redis;

beforeAll(async () => {
  redis = new Redis(inject('redisUrl'), { enableOfflineQueue: false, maxRetriesPerRequest: 1, lazyConnect: true });
  await redis.connect();
});
afterAll(async () => {
  await deleteKeys(redis, `${prefix}:*`);
  redis.disconnect();
});

const ev = (i: number) => JSON.stringify({ event_id: `ev_${i}`, event_type: 'x.v0', event_timestamp: '2026-01-01T00:00:00Z', account_id: 'ac_1', object: {}, principal: null });

describe('EventProducer', () => {
  it('buffers events per destination and creates one deduplicated flush job per destination', async () => {
    const p = new EventProducer({ connection: redis, prefix, lingerMs: 60_000 });
    const a = { id: 'ed_a', kind: 'datadog' as const };
    const b = { id: 'ed_b', kind: 'firehose' as const };
    const r1 = await p.publish([
      { dest: a, events: [ev(1), ev(2)] },
      { dest: b, events: [ev(3)] },
    ]);
    expect(r1).toEqual({ accepted: 3, overflowed: 0, dropped: 0 });
    for (let i = 4; i < 10; i++) await p.publish([{ dest: a, events: [ev(i)] }]);
    expect(await redis.lrange(bufferKey(prefix, 'ed_a'), 0, -1)).toEqual([1, 2, 4, 5, 6, 7, 8, 9].map(ev));
    expect(await redis.lrange(bufferKey(prefix, 'ed_b'), 0, -1)).toEqual([ev(3)]);
    const qa = new Queue<FlushJobData>(TARGET_QUEUES.datadog, { connection: redis, prefix });
    const qb = new Queue<FlushJobData>(TARGET_QUEUES.firehose, { connection: redis, prefix });
    const ja = await qa.getJobs(['delayed', 'waiting']);
    const jb = await qb.getJobs(['delayed', 'waiting']);
    expect(ja.map((j) => [j.name, j.data])).toEqual([[FLUSH_JOB_NAME, { destId: 'ed_a' }]]);
    expect(jb.map((j) => j.data)).toEqual([{ destId: 'ed_b' }]);
    expect(ja[0]!.opts.attempts).toBeGreaterThan(1);
    await qa.close();
    await qb.close();
    await p.close();
    // The producer never closes the connection it was given.
    expect(await redis.ping()).toBe('PONG');
  });

  it('sends the excess of a full buffer to the capped overflow list', async () => {
    const p = new EventProducer({ connection: redis, prefix, lingerMs: 60_000, bufferCap: 5, overflowCap: 3 });
    const c = { id: 'ed_c', kind: 'kinesis' as const };
    expect(await p.publish([{ dest: c, events: [1, 2, 3].map(ev) }])).toEqual({ accepted: 3, overflowed: 0, dropped: 0 });
    expect(await p.publish([{ dest: c, events: [4, 5, 6, 7, 8, 9].map(ev) }])).toEqual({ accepted: 2, overflowed: 4, dropped: 1 });
    expect(await redis.lrange(bufferKey(prefix, 'ed_c'), 0, -1)).toEqual([1, 2, 3, 4, 5].map(ev));
    expect(await redis.lrange(overflowKey(prefix, 'ed_c'), 0, -1)).toEqual([6, 7, 8].map(ev));
    await p.close();
  });

  it('appends large batches (beyond Lua unpack limits) in order', async () => {
    const p = new EventProducer({ connection: redis, prefix, lingerMs: 60_000 });
    const events = Array.from({ length: 5000 }, (_, i) => ev(i));
    expect(await p.publish([{ dest: { id: 'ed_big', kind: 'azure_logs_ingestion' }, events }])).toMatchObject({ accepted: 5000 });
    expect(await redis.lrange(bufferKey(prefix, 'ed_big'), 0, -1)).toEqual(events);
    await p.close();
  });

  it('rejects when Redis is unreachable', async () => {
    const dead = new Redis('redis://127.0.0.1:1', { enableOfflineQueue: false, maxRetriesPerRequest: 1, lazyConnect: true, retryStrategy: () => null });
    dead.on('error', () => {});
    const p = new EventProducer({ connection: dead, prefix });
    await expect(p.publish([{ dest: { id: 'ed_x', kind: 'datadog' }, events: [ev(1)] }])).rejects.toThrow();
    await p.close();
    dead.disconnect();
  });

  it('publishes many small batches quickly', async () => {
    const p = new EventProducer({ connection: redis, prefix, lingerMs: 50 });
    const dests = Array.from({ length: 20 }, (_, i) => ({ id: `ed_perf${i}`, kind: 'datadog' as const }));
    const n = 2000;
    const t0 = performance.now();
    for (let i = 0; i < n; i++) await p.publish([{ dest: dests[i % dests.length]!, events: [ev(i)] }]);
    const ms = performance.now() - t0;
    console.log(`producer: ${n} sequential publishes in ${ms.toFixed(0)} ms (${((ms / n) * 1000).toFixed(0)} µs each)`);
    let total = 0;
    for (const d of dests) total += await redis.llen(bufferKey(prefix, d.id));
    expect(total).toBe(n);
    await p.close();
  });
});
