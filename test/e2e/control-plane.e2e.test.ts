import http from 'node:http';
import { execFile } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { inject } from 'vitest';
import pg from 'pg';
import { freshDatabase } from '../support/databases.js';
import { withDatabase } from '../support/global-setup.js';
import { REPO_ROOT, startControlPlane, type ControlPlaneProcess } from '../support/processes.js';
import { createDb, createPool } from '../../services/control-plane/src/db/pool.js';
import { MIGRATIONS_DIR } from '../../services/control-plane/src/db/migrate.js';
import { createAccountWithKey } from '../../services/control-plane/src/modules/accounts/accounts.service.js';
import { CLI_RUN_MS, CONTROL_PLANE_START_MS, WORK_MS } from '../support/timeouts.js';

const run = promisify(execFile);

/** Every process this file started, stopped in afterAll even when a test failed half-way. */
const started: ControlPlaneProcess[] = [];
async function start(...args: Parameters<typeof startControlPlane>): Promise<ControlPlaneProcess> {
  const p = await startControlPlane(...args);
  started.push(p);
  return p;
}
afterAll(async () => {
  await Promise.allSettled(started.map((p) => p.stop({ timeoutMs: 15_000 })));
});

function api(baseUrl: string, token: string) {
  return async (method: string, path: string, body?: unknown) => {
    const res = await fetch(baseUrl + path, {
      method,
      headers: { Authorization: `Bearer ${token}`, 'Ngrok-Version': '2', ...(body === undefined ? {} : { 'Content-Type': 'application/json' }) },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    return { status: res.status, headers: res.headers, body: text ? JSON.parse(text) : undefined };
  };
}

/** A POST whose body arrives in two parts, so the request is still in flight between them. */
function slowPost(baseUrl: string, path: string, token: string, body: string) {
  const url = new URL(baseUrl + path);
  const req = http.request({
    host: url.hostname,
    port: url.port,
    path: url.pathname,
    method: 'POST',
    agent: false,
    headers: { Authorization: `Bearer ${token}`, 'Service-Version': '2', 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) },
  });
  const response = new Promise<{ status: number; body: string }>((resolve, reject) => {
    req.on('response', (res) => {
      let data = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (data += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: data }));
      res.on('error', reject);
    });
    req.on('error', reject);
  });
  response.catch(() => {}); // awaited by the test; a test failing earlier must not leave it unhandled
  req.flushHeaders();
  const cut = Math.floor(body.length / 2);
  req.write(body.slice(0, cut));
  return { finish: () => req.end(body.slice(cut)), response };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('control plane process', () => {
  let db: Awaited<ReturnType<typeof freshDatabase>>;
  beforeAll(async () => {
    db = await freshDatabase();
  });
  afterAll(async () => {
    await db?.drop();
  });

  it('starts, answers health checks and a first authenticated call (account from the admin CLI)', async () => {
    const cp = await start({ databaseUrl: db.url });
    expect(cp.pid).toBeGreaterThan(0);
    expect((await fetch(`${cp.baseUrl}/healthz`)).status).toBe(200);
    const ready = await fetch(`${cp.baseUrl}/readyz`);
    expect(ready.status).toBe(200);
    expect(await ready.json()).toEqual({ status: 'ready' });

    // The bootstrap path an operator uses: `npm run admin -- create-account --json`.
    const { stdout } = await run('npm', ['run', '--silent', 'admin', '--', 'create-account', '--name', 'e2e', '--json'], {
      cwd: REPO_ROOT,
      env: { ...process.env, DATABASE_URL: db.url, LOG_LEVEL: 'warn' },
      timeout: 60_000,
    });
    const line = stdout.trim().split('\n').filter((l) => l.startsWith('{')).pop();
    expect(line, `admin CLI printed no JSON line:\n${stdout}`).toBeDefined();
    const acct = JSON.parse(line!) as { account_id: string; api_key_id: string; token: string };
    expect(acct.account_id).toMatch(/^ac_[0-9A-Za-z]{27}$/);
    expect(acct.api_key_id).toMatch(/^ak_[0-9A-Za-z]{27}$/);

    const call = api(cp.baseUrl, acct.token);
    const list = await call('GET', '/reserved_addrs');
    expect(list.status).toBe(200);
    expect(list.headers.get('content-type')).toBe('application/json; charset=utf-8');
    expect(list.headers.get('warren-operation-id')).toMatch(/^op_[0-9A-Za-z]{27}$/);
    expect(list.headers.get('ngrok-operation-id')).toBe(list.headers.get('warren-operation-id'));
    expect(list.body).toEqual({ reserved_addrs: [], uri: `${cp.baseUrl}/reserved_addrs`, next_page_uri: null });

    const created = await call('POST', '/reserved_addrs', { description: 'first', region: 'eu' });
    expect(created.status).toBe(201);
    expect(created.body.uri).toBe(`${cp.baseUrl}/reserved_addrs/${created.body.id}`);
    expect((await call('GET', `/reserved_addrs/${created.body.id}`)).body).toEqual(created.body);

    const anon = await fetch(`${cp.baseUrl}/reserved_addrs`, { headers: { 'Ngrok-Version': '2' } });
    expect(anon.status).toBe(401);
    expect(anon.headers.get('www-authenticate')).toBe('Bearer');
    const err = (await anon.json()) as { error_code: string; details: { operation_id: string } };
    expect(err.error_code).toBe('ERR_WARREN_1000');
    expect(err.details.operation_id).toBe(anon.headers.get('warren-operation-id'));

    const exit = await cp.stop();
    expect(exit).toEqual({ code: 0, signal: null });
  }, CONTROL_PLANE_START_MS + CLI_RUN_MS + WORK_MS); // a control plane, then the admin CLI

  it('drains on SIGTERM: the in-flight request completes, then the process exits 0', async () => {
    const cp = await start({ databaseUrl: db.url, env: { LOG_LEVEL: 'info' } });
    const pool = createPool(db.url, 2);
    try {
      const acct = await createAccountWithKey(createDb(pool), 'drain');
      const inflight = slowPost(cp.baseUrl, '/reserved_addrs', acct.token, JSON.stringify({ description: 'in flight during SIGTERM', metadata: 'x'.repeat(64) }));
      await sleep(400); // headers and half the body are in: the handler is waiting for the rest
      const stopping = cp.stop({ timeoutMs: 15_000 });
      await sleep(400); // SIGTERM delivered: the listener closes, this request stays
      expect(cp.child.exitCode, 'exited before the in-flight request finished').toBeNull();
      inflight.finish();
      const res = await inflight.response;
      expect(res.status, res.body).toBe(201);
      const body = JSON.parse(res.body) as { id: string; description: string };
      expect(body.description).toBe('in flight during SIGTERM');

      expect(await stopping).toEqual({ code: 0, signal: null });
      // The response was not a lie: the row is committed.
      const { rows } = await pool.query('SELECT id FROM reserved_addrs WHERE id = $1', [body.id]);
      expect(rows).toHaveLength(1);
      expect(cp.output()).toMatch(/"msg":"draining"/);
      expect(cp.output()).toMatch(/"msg":"stopped"/);
      // Nothing listens any more.
      await expect(fetch(`${cp.baseUrl}/healthz`)).rejects.toThrow();
    } finally {
      await pool.end();
    }
  }, CONTROL_PLANE_START_MS + WORK_MS);

  it('PORT=0: the port comes from the listening message; uris follow PUBLIC_BASE_URL', async () => {
    const cp = await start({ databaseUrl: db.url, port: 0, env: { PUBLIC_BASE_URL: 'https://api.warren.test/v2' } });
    expect(cp.port).toBeGreaterThan(0);
    expect(cp.baseUrl).toBe(`http://127.0.0.1:${cp.port}`);
    const pool = createPool(db.url, 1);
    try {
      const acct = await createAccountWithKey(createDb(pool), 'port0');
      const created = await api(cp.baseUrl, acct.token)('POST', '/reserved_addrs', {});
      expect(created.status).toBe(201);
      // built from the configured base, never from the Host header
      expect(created.body.uri).toBe(`https://api.warren.test/v2/reserved_addrs/${created.body.id}`);
    } finally {
      await pool.end();
    }
    expect(await cp.stop()).toEqual({ code: 0, signal: null });
  }, CONTROL_PLANE_START_MS + WORK_MS);

  it('fails fast with the child output when the database is unusable', async () => {
    const missing = withDatabase(inject('pgAdminUrl'), `warren_test_missing_${randomBytes(3).toString('hex')}`);
    const t0 = Date.now();
    // Fast: the process exits by itself ("exited before listening"), it does not wait or retry
    // until the caller gives up ("sent no 'listening' message within"). How long that takes is
    // mostly the process's own start: about a second when idle, 20 s and more on a loaded machine.
    await expect(startControlPlane({ databaseUrl: missing })).rejects.toThrow(/exited before listening \(code 1[\s\S]*child output[\s\S]*does not exist/);
    expect(Date.now() - t0).toBeLessThan(CONTROL_PLANE_START_MS);
  }, CONTROL_PLANE_START_MS + WORK_MS);
});

describe('two processes on an empty database', () => {
  const adminUrl = () => inject('pgAdminUrl');
  // Named like the other test databases so global teardown sweeps it if this file crashes.
  const name = `warren_test_empty_${randomBytes(4).toString('hex')}_${inject('runId')}`;
  let url: string;

  beforeAll(async () => {
    const admin = new pg.Client({ connectionString: adminUrl() });
    await admin.connect();
    try {
      await admin.query(`CREATE DATABASE ${name}`); // from template1: no tables at all
    } finally {
      await admin.end();
    }
    url = withDatabase(adminUrl(), name);
  });
  afterAll(async () => {
    const admin = new pg.Client({ connectionString: adminUrl() });
    await admin.connect();
    await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).catch(() => {});
    await admin.end();
  });

  it('both migrate safely under the advisory lock and both serve', async () => {
    const pool = createPool(url, 2);
    try {
      const before = await pool.query(`SELECT count(*)::int AS n FROM information_schema.tables WHERE table_schema = 'public'`);
      expect(before.rows[0].n).toBe(0);

      const [a, b] = await Promise.all([start({ databaseUrl: url, env: { LOG_LEVEL: 'info' } }), start({ databaseUrl: url, env: { LOG_LEVEL: 'info' } })]);
      expect(a.pid).not.toBe(b.pid);

      // Each migration applied exactly once, by exactly one of the two.
      const files = readdirSync(MIGRATIONS_DIR).filter((f) => /^\d{4}_[a-z0-9_]+\.sql$/.test(f)).sort();
      const { rows } = await pool.query<{ name: string }>('SELECT name FROM schema_migrations ORDER BY name');
      expect(rows.map((r) => r.name)).toEqual(files);
      const appliedBy = [a, b].filter((p) => /migrations applied/.test(p.output()));
      expect(appliedBy).toHaveLength(1);

      const acct = await createAccountWithKey(createDb(pool), 'two');
      const ca = api(a.baseUrl, acct.token);
      const cb = api(b.baseUrl, acct.token);
      const x = await ca('POST', '/reserved_addrs', { description: 'via a' });
      const y = await cb('POST', '/reserved_addrs', { description: 'via b' });
      expect([x.status, y.status]).toEqual([201, 201]);
      // One database behind both: each sees what the other wrote.
      expect((await cb('GET', `/reserved_addrs/${x.body.id}`)).status).toBe(200);
      expect((await ca('GET', `/reserved_addrs/${y.body.id}`)).status).toBe(200);
      const listA = await ca('GET', '/reserved_addrs');
      expect(listA.body.reserved_addrs.map((r: { id: string }) => r.id)).toEqual([y.body.id, x.body.id].sort().reverse());

      expect(await Promise.all([a.stop(), b.stop()])).toEqual([
        { code: 0, signal: null },
        { code: 0, signal: null },
      ]);
    } finally {
      await pool.end();
    }
  }, CONTROL_PLANE_START_MS + WORK_MS); // two control planes at once
});
