import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { inject } from 'vitest';
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { createPool } from './pool.js';
import { migrate } from './migrate.js';
import { withDatabase } from '../../../../test/support/global-setup.js';

// A database whose default collation is not "C" (ICU en-US sorts case-insensitively): ids must
// still sort bytewise, or "newest first" lists and before_id cursors break.
const name = `warren_test_icu_${randomBytes(4).toString('hex')}_${inject('runId')}`;
let admin: pg.Client;
let pool: pg.Pool;

beforeAll(async () => {
  admin = new pg.Client({ connectionString: inject('pgAdminUrl') });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${name} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'`);
  pool = createPool(withDatabase(inject('pgAdminUrl'), name), 4);
});
afterAll(async () => {
  await pool.end();
  await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
  await admin.end();
});

describe('migrations', () => {
  it('apply once, concurrently, and are recorded', async () => {
    const results = await Promise.all([migrate(pool), migrate(pool), migrate(pool)]);
    expect(results.filter((r) => r.length > 0)).toHaveLength(1);
    const { rows } = await pool.query('SELECT name FROM schema_migrations ORDER BY name');
    expect(rows.map((r) => r.name)).toContain('0001_init.sql');
    expect(await migrate(pool)).toEqual([]);
  });

  it('make id columns sort bytewise whatever the database collation', async () => {
    await pool.query(`INSERT INTO accounts (id) VALUES ('ac_x')`);
    const ids = ['ra_3MTiKz6YizOzOMCGEYR5syFqyo0', 'ra_3MTiKz6tkMBkFJVRoVp1rc4VmPJ']; // 'Y' < 't' bytewise, not in en-US
    for (const [i, id] of ids.entries()) await pool.query(`INSERT INTO reserved_addrs (id, account_id, region, addr) VALUES ($1, 'ac_x', 'us', $2)`, [id, `h:${i}`]);
    const { rows } = await pool.query(`SELECT id FROM reserved_addrs WHERE account_id = 'ac_x' ORDER BY id DESC`);
    expect(rows.map((r) => r.id)).toEqual([...ids].reverse());
    const before = await pool.query(`SELECT id FROM reserved_addrs WHERE account_id = 'ac_x' AND id < $1`, [ids[1]]);
    expect(before.rows.map((r) => r.id)).toEqual([ids[0]]);
  });
});
