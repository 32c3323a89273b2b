import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freshDatabase } from '../support/databases.js';
import { startControlPlane, type ControlPlaneProcess } from '../support/processes.js';
import { createDb, createPool } from '../../services/control-plane/src/db/pool.js';
import { createAccountWithKey } from '../../services/control-plane/src/modules/accounts/accounts.service.js';
import { CONTROL_PLANE_START_MS, WORK_MS } from '../support/timeouts.js';

// Two real control-plane processes on one database share the per-account management API limit
// (API_RATE_LIMIT_PER_MINUTE) through Postgres (API_RATE_LIMIT_SYNC_MS).

const LIMIT = 30;
const SYNC_MS = 100;
let database: Awaited<ReturnType<typeof freshDatabase>>;
const replicas: ControlPlaneProcess[] = [];

beforeAll(async () => {
  database = await freshDatabase();
  const env = { API_RATE_LIMIT_PER_MINUTE: String(LIMIT), API_RATE_LIMIT_SYNC_MS: String(SYNC_MS) };
  replicas.push(...(await Promise.all([startControlPlane({ databaseUrl: database.url, env }), startControlPlane({ databaseUrl: database.url, env })])));
}, CONTROL_PLANE_START_MS + WORK_MS); // two control planes at once
afterAll(async () => {
  await Promise.allSettled(replicas.map((p) => p.stop({ timeoutMs: 15_000 })));
  await database?.drop();
});

async function get(baseUrl: string, token: string): Promise<{ status: number; retryAfter: string | null; code?: string }> {
  const res = await fetch(`${baseUrl}/reserved_addrs`, { headers: { Authorization: `Bearer ${token}`, 'Ngrok-Version': '2' } });
  const body = (await res.json()) as { error_code?: string };
  return { status: res.status, retryAfter: res.headers.get('retry-after'), code: body.error_code };
}

describe('management API rate limit across two control-plane replicas', () => {
  it('one API key through both replicas gets 429 near the limit, not at twice the limit; another account is unaffected', async () => {
    const pool = createPool(database.url, 2);
    const db = createDb(pool);
    const [one, two] = await Promise.all([createAccountWithKey(db, 'busy'), createAccountWithKey(db, 'quiet')]);

    // 2 × LIMIT requests alternating between the replicas, 25 ms apart (one sync interval is
    // about 4 requests: the documented bound, 2 intervals of the other replica's traffic at
    // worst plus the queries' time, is a handful, far from another LIMIT).
    let admitted = 0;
    const refusals: Array<{ retryAfter: string | null; code?: string }> = [];
    for (let i = 0; i < 2 * LIMIT; i++) {
      const r = await get(replicas[i % 2]!.baseUrl, one.token);
      if (r.status === 200) admitted++;
      else {
        expect(r.status).toBe(429);
        refusals.push(r);
      }
      await new Promise((res) => setTimeout(res, 25));
    }
    expect(admitted).toBeGreaterThanOrEqual(LIMIT);
    expect(admitted).toBeLessThanOrEqual(LIMIT + 8);
    for (const r of refusals) {
      expect(r.code).toBe('ERR_WARREN_8000');
      expect(r.retryAfter).toMatch(/^[1-9]\d*$/);
    }
    // Both replicas now refuse the key; another account has its own limit on both.
    for (const cp of replicas) expect((await get(cp.baseUrl, one.token)).status).toBe(429);
    for (const cp of replicas) expect((await get(cp.baseUrl, two.token)).status).toBe(200);

    // SIGTERM: both exit 0, their last counts flushed (each replica's rows hold what it admitted).
    const exits = await Promise.all(replicas.map((p) => p.stop({ timeoutMs: 15_000 })));
    expect(exits.map((e) => e.code)).toEqual([0, 0]);
    const { rows } = await pool.query(`SELECT account_id, count(DISTINCT replica_id)::int AS replicas, sum(count)::int AS n FROM api_rate_counts GROUP BY 1`);
    await pool.end();
    expect(rows).toContainEqual({ account_id: one.accountId, replicas: 2, n: admitted });
    expect(rows).toContainEqual({ account_id: two.accountId, replicas: 2, n: 2 });
  });
});
