import { deleteKeys } from '../../../../test/support/redis-keys.js';
import { randomBytes } from 'node:crypto';
import { spawn, type ChildProcess } from 'node:child_process';
import net from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it, vi } from 'vitest';
import { Redis } from 'ioredis';
import pg from 'pg';
import { Registry } from 'prom-client';
import { bufferKey, createLogger, type EventEnvelope } from '@warren/shared';
import { EventProducer } from '../../../shared/src/events/producer.js';
import { auditEnvelope } from '../../../shared/src/events/envelope.js';
import { writeOutbox } from '../../../control-plane/src/events/outbox.js';
import { setAccountDisabled } from '../../../control-plane/src/modules/accounts/accounts.service.js';
import { startTestApi, type Account, type TestApi } from '../../../../test/support/api.js';
import { OutboxRelay, type OutboxRelayOptions } from './index.js';

const log = createLogger('relay-test', 'silent');
let api: TestApi;
let a: Account;
let b: Account;
let redis: Redis;
let databaseUrl: string;
const prefixes: string[] = [];
const cleanup: (() => Promise<void> | void)[] = [];

beforeAll(async () => {
  api = await startTestApi();
  databaseUrl = api.db.pool.options.connectionString!;
  a = await api.account('a');
  b = await api.account('b');
  redis = new Redis(inject('redisUrl'), { enableOfflineQueue: false, maxRetriesPerRequest: 1, lazyConnect: true });
  await redis.connect();
});

afterEach(async () => {
  while (cleanup.length > 0) await cleanup.pop()!();
});

afterAll(async () => {
  for (const prefix of prefixes) await deleteKeys(redis, `${prefix}:*`);
  redis.disconnect();
  await api.close();
});

function newPrefix(): string {
  const p = `warren_test_${inject('runId')}_${randomBytes(3).toString('hex')}`;
  prefixes.push(p);
  return p;
}

/** A producer on the shared test Redis under a fresh prefix. */
function producer(prefix = newPrefix(), connection: Redis = redis): EventProducer {
  const p = new EventProducer({ connection, prefix, lingerMs: 60_000 });
  cleanup.push(() => p.close());
  return p;
}

function relay(p: OutboxRelayOptions['producer'], over: Partial<OutboxRelayOptions> = {}): OutboxRelay {
  const r = new OutboxRelay({ pool: api.db.pool, databaseUrl, producer: p, log, pollIntervalMs: 50, backoff: { initialMs: 20, maxMs: 200 }, ...over });
  cleanup.push(() => r.stop());
  return r;
}

const q = <T extends pg.QueryResultRow = any>(sql: string, params?: unknown[]) => api.db.pool.query<T>(sql, params);
const dbCursor = async () => Number((await q('SELECT version FROM event_relay_state WHERE id = 1')).rows[0].version);
const head = async () => Number((await q('SELECT version FROM config_state')).rows[0].version);
/** Starts the relay cursor at the head: earlier history is not the test's business. */
const skipHistory = async () => q('UPDATE event_relay_state SET version = (SELECT version FROM config_state) WHERE id = 1');

async function buffer(prefix: string, destId: string, conn: Redis = redis): Promise<EventEnvelope[]> {
  return (await conn.lrange(bufferKey(prefix, destId), 0, -1)).map((s) => JSON.parse(s) as EventEnvelope);
}

/** The envelopes the outbox rows of these event ids make, in the order given. */
async function expectedEnvelopes(eventIds: string[]): Promise<EventEnvelope[]> {
  const { rows } = await q('SELECT * FROM outbox WHERE event_id = ANY($1::text[])', [eventIds]);
  const byId = new Map(rows.map((r) => [r.event_id, r]));
  return eventIds.map((id) => auditEnvelope(byId.get(id)!));
}

async function versionsOf(eventIds: string[]): Promise<number[]> {
  const { rows } = await q('SELECT event_id, version FROM outbox WHERE event_id = ANY($1::text[])', [eventIds]);
  const byId = new Map(rows.map((r) => [r.event_id, Number(r.version)]));
  return eventIds.map((id) => byId.get(id)!);
}

async function eventIdsOf(resourceId: string, types?: string[]): Promise<string[]> {
  const { rows } = await q('SELECT event_id, event_type FROM outbox WHERE resource_id = $1 ORDER BY version', [resourceId]);
  return rows.filter((r) => !types || types.includes(r.event_type)).map((r) => r.event_id);
}

const destination = async (acct: Account, target: Record<string, unknown> = { datadog: { api_key: 'k' } }) => {
  const r = await acct.call('POST', '/event_destinations', { target });
  expect(r.status).toBe(201);
  return r.body as { id: string };
};
const FIREHOSE = { firehose: { auth: { role: { role_arn: 'arn:aws:iam::123456789012:role/w' } }, delivery_stream_arn: 'arn:aws:firehose:us-east-1:123456789012:deliverystream/w' } };
const subscribe = async (acct: Account, types: string[], destIds: string[]) => {
  const r = await acct.call('POST', '/event_subscriptions', { sources: types.map((type) => ({ type })), destination_ids: destIds });
  expect(r.status).toBe(201);
  return r.body as { id: string };
};
const ipPolicy = async (acct: Account, description = 'p') => {
  const r = await acct.call('POST', '/ip_policies', { description });
  expect(r.status).toBe(201);
  return r.body as { id: string };
};

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

describe('outbox relay', () => {
  it('puts every subscribed audit event in its destination buffers once, in version order, with the §11 envelope', async () => {
    const d1 = await destination(a);
    const d2 = await destination(a, FIREHOSE);
    const dIdle = await destination(a);
    const db1 = await destination(b);
    // d1 through two subscriptions (no duplicates), d2 through one, dIdle subscribed to nothing that happens.
    await subscribe(a, ['ip_policy_created.v0', 'ip_policy_deleted.v0'], [d1.id]);
    await subscribe(a, ['ip_policy_created.v0'], [d1.id, d2.id]);
    await subscribe(a, ['tcp_address_created.v0'], [dIdle.id]);
    await subscribe(b, ['ip_policy_created.v0'], [db1.id]);
    await skipHistory();
    const start = await dbCursor();

    const p1 = await ipPolicy(a, 'one');
    const p2 = await ipPolicy(a, 'two');
    expect((await a.call('PATCH', `/ip_policies/${p1.id}`, { description: 'one!' })).status).toBe(200); // not subscribed
    expect((await a.call('DELETE', `/ip_policies/${p1.id}`)).status).toBe(204);
    await setAccountDisabled(api.db, a.accountId, true); // account_updated.v0: nobody can subscribe
    await setAccountDisabled(api.db, a.accountId, false);
    const pb = await ipPolicy(b, 'b');

    const prefix = newPrefix();
    const registry = new Registry();
    const r = relay(producer(prefix), { registry });
    expect(await r.drain()).toBe('done');

    const [c1, d1p1, c2] = [...(await eventIdsOf(p1.id, ['ip_policy_created.v0', 'ip_policy_deleted.v0'])), ...(await eventIdsOf(p2.id))];
    const d1Buf = await buffer(prefix, d1.id);
    expect(d1Buf).toEqual(await expectedEnvelopes([c1!, c2!, d1p1!]));
    const versions = await versionsOf(d1Buf.map((e) => e.event_id));
    expect(versions).toEqual([...versions].sort((x, y) => x - y));
    expect(await buffer(prefix, d2.id)).toEqual(await expectedEnvelopes([c1!, c2!]));
    expect(await buffer(prefix, db1.id)).toEqual(await expectedEnvelopes(await eventIdsOf(pb.id)));
    expect(await redis.exists(bufferKey(prefix, dIdle.id))).toBe(0);

    // The envelope, spelled out once.
    const e = d1Buf[0]!;
    expect(e).toEqual({
      event_id: expect.stringMatching(/^ev_[0-9A-Za-z]{27}$/),
      event_type: 'ip_policy_created.v0',
      event_timestamp: expect.stringMatching(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/),
      account_id: a.accountId,
      object: expect.objectContaining({ id: p1.id, description: 'one' }),
      principal: { id: a.apiKeyId, subject: expect.any(String), source: 'API', credential: { id: a.apiKeyId, uri: expect.stringContaining(`/api_keys/${a.apiKeyId}`) } },
    });
    expect(d1Buf[2]!.object).toMatchObject({ id: p1.id, description: 'one!' }); // a delete carries the last state

    // The cursor moved past every row, subscribed or not; metrics say so.
    const h = await head();
    expect(await dbCursor()).toBe(h);
    expect(r.cursor).toBe(h);
    const metrics = await registry.getMetricsAsJSON();
    const value = (name: string) => metrics.find((m) => m.name === name)!.values[0]!.value;
    expect(value('warren_event_relay_rows_total')).toBe(h - start);
    expect(value('warren_event_relay_events_total')).toBe(3 + 2 + 1);
    expect(value('warren_event_relay_lag_versions')).toBe(0);
    expect(value('warren_event_relay_errors_total')).toBe(0);

    // Nothing new: nothing more.
    expect(await r.drain()).toBe('done');
    expect(await redis.llen(bufferKey(prefix, d1.id))).toBe(3);
  });

  it('is woken by NOTIFY: a change committed after start lands within moments', async () => {
    const d = await destination(a);
    await subscribe(a, ['ip_policy_created.v0'], [d.id]);
    await skipHistory();
    const prefix = newPrefix();
    const r = relay(producer(prefix), { pollIntervalMs: 60_000 }); // no help from the poll
    await r.start();
    const p = await ipPolicy(a);
    await vi.waitFor(async () => expect(await buffer(prefix, d.id)).toEqual(await expectedEnvelopes(await eventIdsOf(p.id))), { timeout: 5_000, interval: 20 });
  });

  it('never skips a version: rows become visible in commit order, a rolled-back version is reused', async () => {
    const d = await destination(a);
    await subscribe(a, ['ip_policy_created.v0'], [d.id]);
    await skipHistory();
    const prefix = newPrefix();
    const r = relay(producer(prefix));
    const base = await head();
    const principal = { id: a.apiKeyId, subject: 'k', source: 'API' as const, credential: { id: a.apiKeyId, uri: 'u' } };
    const change = (id: string) => ({ accountId: a.accountId, eventStem: 'ip_policy', kind: 'created' as const, resourceId: id, object: { id }, principal });
    const c1 = await api.db.pool.connect();
    const c2 = await api.db.pool.connect();
    const c3 = await api.db.pool.connect();
    try {
      await c1.query('BEGIN');
      await c2.query('BEGIN');
      await c3.query('BEGIN');
      expect(await writeOutbox(c1, change('x1'))).toBe(base + 1);
      // c2's insert waits for c1's counter row lock.
      const v2 = writeOutbox(c2, change('x2'));
      await new Promise((res) => setTimeout(res, 100));
      expect(await r.drain()).toBe('done');
      expect(await dbCursor()).toBe(base); // x1 not committed: nothing to see
      await c1.query('COMMIT');
      expect(await v2).toBe(base + 2);
      expect(await r.drain()).toBe('done');
      expect(await dbCursor()).toBe(base + 1); // x2 not committed yet, and not skipped
      const v3 = writeOutbox(c3, change('x3'));
      await new Promise((res) => setTimeout(res, 100));
      await c2.query('ROLLBACK'); // version base + 2 goes back to the counter
      expect(await v3).toBe(base + 2);
      expect(await r.drain()).toBe('done');
      expect(await dbCursor()).toBe(base + 1);
      await c3.query('COMMIT');
      expect(await r.drain()).toBe('done');
      expect(await dbCursor()).toBe(base + 2);
      expect((await buffer(prefix, d.id)).map((e) => (e.object as { id: string }).id)).toEqual(['x1', 'x3']);
    } finally {
      for (const c of [c1, c2, c3]) {
        await c.query('ROLLBACK').catch(() => {});
        c.release();
      }
    }
  });

  it('two relays at once, with concurrent writers: each event exactly once per destination, in version order', async () => {
    const da = await destination(a);
    const da2 = await destination(a, FIREHOSE);
    const db = await destination(b);
    await subscribe(a, ['ip_policy_created.v0', 'ip_policy_updated.v0'], [da.id]);
    await subscribe(a, ['ip_policy_created.v0', 'ip_policy_updated.v0'], [da.id, da2.id]);
    await subscribe(b, ['ip_policy_created.v0'], [db.id]);
    await skipHistory();
    const start = await dbCursor();
    const prefix = newPrefix();
    // Two instances, as two worker replicas would be (own producer and pool client each).
    const r1 = relay(producer(prefix), { batchSize: 3 });
    const r2 = relay(producer(prefix), { batchSize: 3 });
    await Promise.all([r1.start(), r2.start()]);

    // 30 writers at once through the API (its pool of 10): the versions commit interleaved.
    await Promise.all(
      Array.from({ length: 30 }, async (_, i) => {
        const acct = i % 3 === 2 ? b : a;
        const p = await ipPolicy(acct, `c${i}`);
        if (acct === a) expect((await acct.call('PATCH', `/ip_policies/${p.id}`, { description: `u${i}` })).status).toBe(200);
      }),
    );
    const h = await head();
    await vi.waitFor(async () => expect(await dbCursor()).toBe(h), { timeout: 15_000, interval: 50 });
    await Promise.all([r1.stop(), r2.stop()]);

    const { rows } = await q(
      `SELECT o.event_id, o.account_id FROM outbox o WHERE o.version > $1 AND o.resource_type = 'ip_policy' ORDER BY o.version`,
      [start],
    );
    const ofA = rows.filter((r) => r.account_id === a.accountId).map((r) => r.event_id);
    const ofB = rows.filter((r) => r.account_id === b.accountId).map((r) => r.event_id);
    expect(ofA).toHaveLength(40);
    expect(ofB).toHaveLength(10);
    for (const [dest, ids] of [
      [da.id, ofA],
      [da2.id, ofA],
      [db.id, ofB],
    ] as const) {
      const got = (await buffer(prefix, dest)).map((e) => e.event_id);
      expect(got).toEqual(ids); // exactly once each, in version order
    }
    // Between them the two relays handled each row once.
    const rowsOf = async (r: OutboxRelay) => (await r.metrics.rows.get()).values[0]?.value ?? 0;
    expect((await rowsOf(r1)) + (await rowsOf(r2))).toBe(h - start);
  });

  it('keeps the cursor while Redis is unreachable and catches up once it is back', async () => {
    const d = await destination(a);
    await subscribe(a, ['ip_policy_created.v0'], [d.id]);
    await skipHistory();
    const start = await dbCursor();
    const p1 = await ipPolicy(a);

    // A producer pointed at a closed port; a Redis server appears there later.
    const port = await freePort();
    const conn = new Redis(`redis://127.0.0.1:${port}`, { enableOfflineQueue: false, maxRetriesPerRequest: 1, retryStrategy: () => 50 });
    conn.on('error', () => {});
    cleanup.push(() => conn.disconnect());
    const prefix = newPrefix();
    const r = relay(producer(prefix, conn), { publishTimeoutMs: 2_000 });
    await expect(r.drain()).rejects.toThrow();
    expect(await dbCursor()).toBe(start);

    await r.start();
    await vi.waitFor(async () => expect((await r.metrics.errors.get()).values[0]?.value).toBeGreaterThanOrEqual(2), { timeout: 5_000, interval: 20 });
    const p2 = await ipPolicy(a);
    await new Promise((res) => setTimeout(res, 200));
    expect(await dbCursor()).toBe(start);

    let server: ChildProcess | undefined;
    try {
      server = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
      await vi.waitFor(async () => expect(await dbCursor()).toBe(await head()), { timeout: 10_000, interval: 50 });
      const got = await buffer(prefix, d.id, conn);
      expect(got).toEqual(await expectedEnvelopes([...(await eventIdsOf(p1.id)), ...(await eventIdsOf(p2.id))]));
      await r.stop();
    } finally {
      conn.disconnect();
      if (server && server.exitCode === null) {
        const exited = new Promise((res) => server!.once('exit', res));
        server.kill('SIGTERM');
        await exited;
      }
    }
  });

  it('calls onDestinationChanged after a PATCH or DELETE of a destination, on every instance', async () => {
    const seen1: [string, boolean][] = [];
    const seen2: [string, boolean][] = [];
    const prefix = newPrefix();
    const r1 = relay(producer(prefix), { onDestinationChanged: (id, deleted) => void seen1.push([id, deleted]) });
    const r2 = relay(producer(prefix), {
      onDestinationChanged: async (id, deleted) => {
        seen2.push([id, deleted]);
        throw new Error('a failing callback is only logged');
      },
    });
    await Promise.all([r1.start(), r2.start()]);
    const d = await destination(a);
    const other = await destination(b);
    const s = await subscribe(a, ['ip_policy_created.v0'], [d.id]);
    expect((await a.call('PATCH', `/event_destinations/${d.id}`, { description: 'x' })).status).toBe(200);
    // No change and no event, but still announced (a PATCH resumes a paused destination).
    expect((await a.call('PATCH', `/event_destinations/${d.id}`, { description: 'x' })).status).toBe(200);
    expect((await a.call('DELETE', `/event_destinations/${d.id}`)).status).toBe(409);
    expect((await a.call('PATCH', `/event_subscriptions/${s.id}`, { destination_ids: [] })).status).toBe(200);
    expect((await a.call('DELETE', `/event_destinations/${d.id}`)).status).toBe(204);
    expect((await b.call('PATCH', `/event_destinations/${other.id}`, { metadata: 'm' })).status).toBe(200);
    // The unchanged PATCH comes by NOTIFY, the others in version order: compare as sets of calls.
    const want = [`${d.id} false`, `${d.id} false`, `${d.id} true`, `${other.id} false`].sort();
    const calls = (seen: [string, boolean][]) => seen.map(([id, del]) => `${id} ${del}`).sort();
    await vi.waitFor(() => expect(calls(seen1)).toEqual(want), { timeout: 5_000, interval: 20 });
    await vi.waitFor(() => expect(calls(seen2)).toEqual(want), { timeout: 5_000, interval: 20 });
    // The delete is announced after the update that came by the outbox.
    expect(seen1.findIndex(([, del]) => del)).toBeGreaterThan(0);
    // Still running after the callback threw.
    await new Promise((res) => setTimeout(res, 150));
    expect(calls(seen2)).toEqual(want);
  });

  it('stop() lets the batch in flight commit', async () => {
    const d = await destination(a);
    await subscribe(a, ['ip_policy_created.v0'], [d.id]);
    await skipHistory();
    const prefix = newPrefix();
    const real = producer(prefix);
    let release!: () => void;
    const gate = new Promise<void>((res) => (release = res));
    let entered!: () => void;
    const inPublish = new Promise<void>((res) => (entered = res));
    const slow = {
      async publish(items: Parameters<EventProducer['publish']>[0]) {
        entered();
        await gate;
        return real.publish(items);
      },
    };
    await ipPolicy(a);
    const r = relay(slow);
    await r.start();
    await inPublish;
    const stopped = r.stop();
    release();
    await stopped;
    expect(await dbCursor()).toBe(await head());
    expect(await redis.llen(bufferKey(prefix, d.id))).toBe(1);
  });

  it('validates its options', () => {
    const base = { pool: api.db.pool, databaseUrl, producer: { publish: async () => ({ accepted: 0, overflowed: 0 }) }, log };
    expect(() => new OutboxRelay({ ...base, batchSize: 0 })).toThrow(/batchSize/);
    expect(() => new OutboxRelay({ ...base, pollIntervalMs: 0 })).toThrow(/pollIntervalMs/);
  });
});

describe('migration 0004', () => {
  it('starts the relay cursor at the head of an upgraded database, not at 0', async () => {
    const { mkdtemp, copyFile, readdir, rm } = await import('node:fs/promises');
    const path = await import('node:path');
    const { tmpdir } = await import('node:os');
    const { MIGRATIONS_DIR, migrate } = await import('../../../control-plane/src/db/migrate.js');
    const { createPool } = await import('../../../control-plane/src/db/pool.js');
    const { withDatabase } = await import('../../../../test/support/global-setup.js');
    const name = `warren_test_m4_${randomBytes(4).toString('hex')}_${inject('runId')}`;
    const admin = new pg.Client({ connectionString: inject('pgAdminUrl') });
    await admin.connect();
    await admin.query(`CREATE DATABASE ${name}`);
    const dir = await mkdtemp(path.join(tmpdir(), 'warren-m3-'));
    const p = createPool(withDatabase(inject('pgAdminUrl'), name), 2);
    try {
      for (const f of (await readdir(MIGRATIONS_DIR)).filter((f) => /^\d{4}_[a-z0-9_]+\.sql$/.test(f) && f < '0004'))
        await copyFile(path.join(MIGRATIONS_DIR, f), path.join(dir, f));
      await migrate(p, dir);
      await p.query(`INSERT INTO accounts (id) VALUES ('ac_1')`);
      for (const id of ['ev_a', 'ev_b', 'ev_c'])
        await p.query(`INSERT INTO outbox (event_id, account_id, event_type, resource_type, resource_id, object) VALUES ($1, 'ac_1', 'x_created.v0', 'x', $1, '{}')`, [id]);
      const before = Number((await p.query('SELECT version FROM config_state')).rows[0].version);
      expect(before).toBeGreaterThanOrEqual(3);
      expect(await migrate(p)).toContain('0004_event_relay.sql');
      expect((await p.query('SELECT id, version FROM event_relay_state')).rows).toEqual([{ id: 1, version: before }]);
      await expect(p.query('INSERT INTO event_relay_state (id, version) VALUES (2, 0)')).rejects.toThrow();
    } finally {
      await p.end();
      await rm(dir, { recursive: true, force: true });
      await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await admin.end();
    }
  });
});
