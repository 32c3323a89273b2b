import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { userAgentFilterCostProblems } from '@warren/shared';
import { freshDatabase } from '../../../../../test/support/databases.js';
import { startControlPlane, type ControlPlaneProcess } from '../../../../../test/support/processes.js';
import { CONTROL_PLANE_START_MS, WORK_MS } from '../../../../../test/support/timeouts.js';
import { createDb, createPool } from '../../db/pool.js';
import { createAccountWithKey } from '../accounts/accounts.service.js';
import { hostileUserAgentFilter } from './user-agent-check.testing.js';

/**
 * The user_agent_filter cost check through real control-plane processes (`node --import tsx
 * services/control-plane/src/main.ts`, as deployed): it runs in a worker thread, so the API keeps
 * answering while a costly filter is checked; one check per account, a bounded queue (429), a
 * time cap (400 naming the list), and the API's answers for costly filters as before.
 */

let database: Awaited<ReturnType<typeof freshDatabase>>;
/** One worker, one waiting check at most; a time cap no check of a loaded test box reaches. */
let cp: ControlPlaneProcess;
/** One worker, checks capped at 100 ms. */
let capped: ControlPlaneProcess;
const tokens: Record<string, string> = {};

beforeAll(async () => {
  database = await freshDatabase();
  [cp, capped] = await Promise.all([
    startControlPlane({ databaseUrl: database.url, env: { PG_POOL_MAX: '5', USER_AGENT_CHECK_WORKERS: '1', USER_AGENT_CHECK_QUEUE: '1', USER_AGENT_CHECK_TIMEOUT_MS: '60000' } }),
    startControlPlane({ databaseUrl: database.url, env: { PG_POOL_MAX: '5', USER_AGENT_CHECK_WORKERS: '1', USER_AGENT_CHECK_TIMEOUT_MS: '100' } }),
  ]);
  const pool = createPool(database.url, 2);
  try {
    for (const name of ['a', 'b', 'c', 'd', 'e']) tokens[name] = (await createAccountWithKey(createDb(pool), name)).token;
  } finally {
    await pool.end();
  }
}, CONTROL_PLANE_START_MS + WORK_MS);
afterAll(async () => {
  await Promise.allSettled([cp?.stop(), capped?.stop()]);
  await database?.drop();
});

interface Answer {
  status: number;
  body: any;
  retryAfter: string | null;
  ms: number;
}

async function call(p: ControlPlaneProcess, account: string, method: string, path: string, body?: unknown): Promise<Answer> {
  const t0 = performance.now();
  const res = await fetch(p.baseUrl + path, {
    method,
    headers: { Authorization: `Bearer ${tokens[account]}`, 'Service-Version': '2', ...(body === undefined ? {} : { 'Content-Type': 'application/json' }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : undefined, retryAfter: res.headers.get('retry-after'), ms: performance.now() - t0 };
}

async function edge(p: ControlPlaneProcess, account: string): Promise<string> {
  const r = await call(p, account, 'POST', '/edges/https', {});
  expect(r.status).toBe(201);
  return r.body.id;
}

let n = 0;
const route = (filter: unknown, extra: Record<string, unknown> = {}) => ({ match_type: 'path_prefix', match: `/r${++n}`, user_agent_filter: filter, ...extra });
/** Accepted, but explored beyond what is checked on the event loop: a worker checks it. */
const MEDIUM = { allow: ['(?i)^curl/\\d+', 'Mozilla/5\\.0 \\(X11;.*'] };

describe('user_agent_filter cost check in a spawned control plane', () => {
  it('keeps answering other accounts while a costly filter is checked, and answers the check as before', async () => {
    const edgeA = await edge(cp, 'a');
    const edgeB = await edge(cp, 'b');
    // The worker is started (started on first use), so the save below is the check itself.
    expect((await call(cp, 'a', 'POST', `/edges/https/${edgeA}/routes`, route(MEDIUM))).status).toBe(201);

    const h = hostileUserAgentFilter('loop');
    const [expected] = userAgentFilterCostProblems(h.allow, h.deny);
    let saving = true;
    const latencies: number[] = [];
    /** When each GET's answer arrived. */
    const answeredAt: number[] = [];
    const gets = (async () => {
      while (saving) {
        const g = await call(cp, 'b', 'GET', `/edges/https/${edgeB}`);
        answeredAt.push(performance.now());
        expect(g.status).toBe(200);
        latencies.push(g.ms);
      }
    })();
    const saveStart = performance.now();
    const save = await call(cp, 'a', 'POST', `/edges/https/${edgeA}/routes`, route(h));
    const saveEnd = performance.now();
    saving = false;
    await gets;

    expect([save.status, save.body.error_code, save.body.details?.field]).toEqual([400, 'ERR_WARREN_2104', 'user_agent_filter.allow']);
    expect(save.body.msg).toBe(`user_agent_filter.allow: ${expected!.message}`);
    // The check took a while (~0.4-0.65 s of CPU on a quiet 2-core box); meanwhile account b was
    // answered. On the event loop, the check would block the server for ~all of the save, and
    // the GETs go one at a time: at most one (answered just before, read late) could arrive in
    // the middle half of the save. Two or more did: the server kept answering while it checked.
    // (Not the slowest GET: one GC pause or preemption on a loaded machine sets that.)
    const quarter = (saveEnd - saveStart) / 4;
    const duringCheck = answeredAt.filter((t) => t >= saveStart + quarter && t <= saveEnd - quarter).length;
    console.log(`save ${save.ms.toFixed(0)} ms; ${latencies.length} GETs meanwhile, ${duringCheck} answered in its middle half, slowest ${Math.max(...latencies).toFixed(1)} ms`);
    expect(save.ms).toBeGreaterThan(250);
    expect(latencies.length).toBeGreaterThanOrEqual(3);
    expect(duringCheck).toBeGreaterThanOrEqual(2);
  }, 120_000);

  it('reports a costly filter as before on module PUT (bare or wrapped), PATCH and POST, with other errors as before', async () => {
    const edgeC = await edge(cp, 'c');
    const created = await call(cp, 'c', 'POST', `/edges/https/${edgeC}/routes`, { match_type: 'path_prefix', match: '/ua' });
    const id = created.body.id;
    const module = `/edges/https/${edgeC}/routes/${id}/user_agent_filter`;
    const costly = { allow: ['(?i)bot'], deny: ['ok', 'a[ab]{20}b'] };
    const refused = (r: Answer, field: string, msg: RegExp = /too costly to match/) => {
      expect([r.status, r.body.error_code, r.body.details?.field], JSON.stringify(r.body)).toEqual([400, 'ERR_WARREN_2104', field]);
      expect(r.body.msg.startsWith(`${field}: `)).toBe(true);
      expect(r.body.msg).toMatch(msg);
    };
    refused(await call(cp, 'c', 'PUT', module, costly), 'deny[1]');
    refused(await call(cp, 'c', 'PUT', module, { id, edge_id: edgeC, module: costly }), 'module.deny[1]');
    refused(await call(cp, 'c', 'PATCH', `/edges/https/${edgeC}/routes/${id}`, { user_agent_filter: costly }), 'user_agent_filter.deny[1]');
    refused(await call(cp, 'c', 'POST', `/edges/https/${edgeC}/routes`, route(costly)), 'user_agent_filter.deny[1]');
    // Nothing was stored.
    expect((await call(cp, 'c', 'GET', module)).body.error_code).toBe('ERR_WARREN_4002');

    // As when the schema checked the cost: the filter's problem comes after those of the fields
    // before it and of the filter's own patterns, and before those of the fields after it.
    const tooLong = (await call(cp, 'c', 'POST', `/edges/https/${edgeC}/routes`, route(costly, { description: 'd'.repeat(256) }))).body;
    expect([tooLong.error_code, tooLong.details.field]).toEqual(['ERR_WARREN_5000', 'description']);
    const badPattern = (await call(cp, 'c', 'POST', `/edges/https/${edgeC}/routes`, route({ allow: ['a[ab]{20}b'], deny: ['('] }))).body;
    expect([badPattern.error_code, badPattern.details.field]).toEqual(['ERR_WARREN_2104', 'user_agent_filter.deny[0]']);
    refused(await call(cp, 'c', 'POST', `/edges/https/${edgeC}/routes`, route(costly, { traffic_policy: { value: 5 } })), 'user_agent_filter.deny[1]');
    refused(await call(cp, 'c', 'PATCH', `/edges/https/${edgeC}/routes/${id}`, { user_agent_filter: costly, policy: 'x' }), 'user_agent_filter.deny[1]');
    refused(await call(cp, 'c', 'POST', `/edges/https/${edgeC}/routes`, route(costly, { colour: 'red' })), 'user_agent_filter.deny[1]');
    const unknown = (await call(cp, 'c', 'POST', `/edges/https/${edgeC}/routes`, route({ allow: ['(?i)bot'] }, { colour: 'red' }))).body;
    expect([unknown.error_code, unknown.details.field]).toEqual(['ERR_WARREN_2101', 'colour']);

    const ok = await call(cp, 'c', 'PUT', module, { allow: ['(?i)bot'], deny: ['ok'] });
    expect([ok.status, ok.body]).toEqual([200, { enabled: true, allow: ['(?i)bot'], deny: ['ok'] }]);
  }, 120_000);

  it('runs one check per account and queues a bounded number: beyond, 429 with Retry-After', async () => {
    const edgeD = await edge(cp, 'd');
    const created = await call(cp, 'd', 'POST', `/edges/https/${edgeD}/routes`, { match_type: 'path_prefix', match: '/put' });
    const [h1, h2] = [hostileUserAgentFilter('d1', 'allow'), hostileUserAgentFilter('d2', 'allow')];
    const answers = await Promise.all([
      call(cp, 'd', 'POST', `/edges/https/${edgeD}/routes`, route(h1)),
      call(cp, 'd', 'PUT', `/edges/https/${edgeD}/routes/${created.body.id}/user_agent_filter`, h2),
    ]);
    expect(answers.map((a) => a.status).sort()).toEqual([400, 429]);
    const limited = answers.find((a) => a.status === 429)!;
    expect(limited.retryAfter).toBe('1');
    expect(limited.body).toEqual({
      error_code: 'ERR_WARREN_8000',
      status_code: 429,
      msg: 'another user_agent_filter check of this account is running (one at a time); retry in 1 s',
      details: { operation_id: expect.stringMatching(/^op_/) },
    });
    expect(answers.find((a) => a.status === 400)!.body.details.field).toMatch(/^(user_agent_filter\.)?allow$/);

    // Three accounts at once, one worker, one place in the queue: the third is refused.
    const edges = await Promise.all(['a', 'b', 'e'].map((acct) => edge(cp, acct)));
    const three = await Promise.all(['a', 'b', 'e'].map((acct, i) => call(cp, acct, 'POST', `/edges/https/${edges[i]}/routes`, route(hostileUserAgentFilter(`q${i}`, 'allow')))));
    expect(three.map((a) => a.status).sort()).toEqual([400, 400, 429]);
    const full = three.find((a) => a.status === 429)!;
    expect([full.retryAfter, full.body.error_code, full.body.status_code]).toEqual(['2', 'ERR_WARREN_8000', 429]);
    expect(full.body.msg).toBe('too many user_agent_filter checks are waiting on this server; retry in 2 s');
  }, 120_000);

  it('refuses a filter whose check outlasts USER_AGENT_CHECK_TIMEOUT_MS as too costly to check, and goes on with a new worker', async () => {
    const edgeE = await edge(capped, 'e');
    const h = hostileUserAgentFilter('cap', 'allow');
    const r = await call(capped, 'e', 'POST', `/edges/https/${edgeE}/routes`, route(h));
    expect([r.status, r.body.error_code, r.body.details?.field]).toEqual([400, 'ERR_WARREN_2104', 'user_agent_filter.allow']);
    expect(r.body.msg).toMatch(/^user_agent_filter\.allow: too costly to check: checking the 32 allow patterns took more than 100 ms/);
    expect((await call(capped, 'e', 'GET', `/edges/https/${edgeE}`)).status).toBe(200);
    expect((await call(capped, 'e', 'POST', `/edges/https/${edgeE}/routes`, route(MEDIUM))).status).toBe(201);
    // SIGTERM: the process stops, its check workers with it.
    expect(await capped.stop({ timeoutMs: 15_000 })).toEqual({ code: 0, signal: null });
  }, 120_000);
});
