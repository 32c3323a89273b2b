import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { copyFile, mkdtemp, rm } from 'node:fs/promises';
import { randomBytes } from 'node:crypto';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pg from 'pg';
import { freshDatabase } from '../../../../test/support/databases.js';
import { withDatabase } from '../../../../test/support/global-setup.js';
import { createDb, createPool, type Db } from '../db/pool.js';
import { migrate, MIGRATIONS_DIR } from '../db/migrate.js';
import { CONFIG_CHANNEL, writeOutbox } from '../events/outbox.js';
import { setAccountDisabled } from '../modules/accounts/accounts.service.js';

let database: Awaited<ReturnType<typeof freshDatabase>>;
let pool: pg.Pool;
let db: Db;

beforeAll(async () => {
  database = await freshDatabase();
  pool = createPool(database.url, 12);
  db = createDb(pool);
  await pool.query(`INSERT INTO accounts (id) VALUES ('ac_versions')`);
});
afterAll(async () => {
  await pool.end();
  await database.drop();
});

const change = (i: number) => ({ accountId: 'ac_versions', eventStem: 'tcp_address', kind: 'created' as const, resourceId: `ra_${i}`, object: { id: `ra_${i}` }, principal: null });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function head(): Promise<number> {
  return (await pool.query<{ version: number }>('SELECT version FROM config_state')).rows[0]!.version;
}

describe('config versions', () => {
  it('follow commit order, not start order, and a late commit is never skipped', async () => {
    const start = await head();
    const listener = new pg.Client({ connectionString: database.url });
    await listener.connect();
    const notified: number[] = [];
    listener.on('notification', (n) => notified.push(Number(n.payload)));
    await listener.query(`LISTEN ${CONFIG_CHANNEL}`);

    // A writes its outbox row first and commits late; B queues behind A's counter lock.
    const a = await pool.connect();
    const b = await pool.connect();
    try {
      await a.query('BEGIN');
      const va = await writeOutbox(a, change(1));
      await b.query('BEGIN');
      const bDone = writeOutbox(b, change(2)).then(async (v) => {
        await b.query('COMMIT');
        return v;
      });
      await sleep(100);
      expect(notified).toEqual([]); // B cannot have a version while A holds the counter
      await a.query('COMMIT');
      const vb = await bDone;
      expect([va, vb]).toEqual([start + 1, start + 2]);
    } finally {
      a.release();
      b.release();
    }

    // Many concurrent transactions with random work before and after the outbox write.
    const n = 60;
    await Promise.all(
      Array.from({ length: n }, (_, i) =>
        db.tx(async (q) => {
          await q.query('SELECT pg_sleep($1)', [Math.random() * 0.02]);
          await writeOutbox(q, change(100 + i));
          if (i % 3 === 0) await writeOutbox(q, change(1000 + i)); // two rows in one transaction
        }),
      ),
    );
    // A rolled-back transaction gives its version back: no gaps.
    await db.tx(async (q) => {
      await writeOutbox(q, change(9999));
      throw new Error('rollback');
    }).catch(() => {});

    const total = 2 + n + Math.ceil(n / 3);
    await expect.poll(() => notified.length, { timeout: 5_000 }).toBe(total);
    await listener.end();
    // Notifications arrive in commit order; versions must rise strictly along it, densely.
    expect(notified).toEqual(Array.from({ length: total }, (_, i) => start + 1 + i));
    const { rows } = await pool.query<{ version: number }>('SELECT version FROM outbox WHERE version > $1 ORDER BY version', [start]);
    expect(rows.map((r) => r.version)).toEqual(notified);
    expect(await head()).toBe(start + total);
    // Rows of one transaction have consecutive versions and committed_at in version order.
    const ordered = await pool.query<{ ok: boolean }>('SELECT bool_and(a.committed_at <= b.committed_at) AS ok FROM outbox a JOIN outbox b ON b.version = a.version + 1');
    expect(ordered.rows[0]!.ok).toBe(true);
  });

  it('records disabling or enabling an account as a config change', async () => {
    const before = await head();
    await setAccountDisabled(db, 'ac_versions', true);
    await setAccountDisabled(db, 'ac_versions', true); // no change, no version
    await setAccountDisabled(db, 'ac_versions', false);
    const { rows } = await pool.query('SELECT version, resource_type, resource_id, object FROM outbox WHERE version > $1 ORDER BY version', [before]);
    expect(rows).toEqual([
      { version: before + 1, resource_type: 'account', resource_id: 'ac_versions', object: { id: 'ac_versions', disabled: true } },
      { version: before + 2, resource_type: 'account', resource_id: 'ac_versions', object: { id: 'ac_versions', disabled: false } },
    ]);
  });
});

describe('migration 0002', () => {
  it('numbers existing outbox rows in seq order and starts the counter after them', async () => {
    const name = `warren_test_m2_${randomBytes(4).toString('hex')}_${inject('runId')}`;
    const admin = new pg.Client({ connectionString: inject('pgAdminUrl') });
    await admin.connect();
    await admin.query(`CREATE DATABASE ${name}`);
    const dir = await mkdtemp(path.join(tmpdir(), 'warren-m1-'));
    const p = createPool(withDatabase(inject('pgAdminUrl'), name), 2);
    try {
      await copyFile(path.join(MIGRATIONS_DIR, '0001_init.sql'), path.join(dir, '0001_init.sql'));
      expect(await migrate(p, dir)).toEqual(['0001_init.sql']);
      await p.query(`INSERT INTO accounts (id) VALUES ('ac_1')`);
      for (const id of ['ev_c', 'ev_a', 'ev_b'])
        await p.query(`INSERT INTO outbox (event_id, account_id, event_type, resource_type, resource_id, object) VALUES ($1, 'ac_1', 'x_created.v0', 'x', $1, '{}')`, [id]);
      expect(await migrate(p)).toContain('0002_config_versions_and_presence.sql');
      const { rows } = await p.query('SELECT event_id, version FROM outbox ORDER BY seq');
      expect(rows).toEqual([
        { event_id: 'ev_c', version: 1 },
        { event_id: 'ev_a', version: 2 },
        { event_id: 'ev_b', version: 3 },
      ]);
      const state = await p.query('SELECT version, length(epoch) AS n FROM config_state');
      expect(state.rows).toEqual([{ version: 3, n: 32 }]);
      const next = await p.query(`INSERT INTO outbox (event_id, account_id, event_type, resource_type, resource_id, object) VALUES ('ev_d', 'ac_1', 'x_created.v0', 'x', 'x', '{}') RETURNING version`);
      expect(next.rows[0].version).toBe(4);
    } finally {
      await p.end();
      await rm(dir, { recursive: true, force: true });
      await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await admin.end();
    }
  });
});
