import http from 'node:http';
import { createHmac, randomBytes } from 'node:crypto';
import { gunzipSync, brotliDecompressSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { Redis } from 'ioredis';
import { redisKeyPattern } from '../../services/ingress/src/ratelimit/index.js';
import { freshDatabase } from '../support/databases.js';
import { startControlPlane, type ControlPlaneProcess } from '../support/processes.js';
import { callApi, cleanupTempDirs, startAgentProcess, startIngress, tempDir, waitFor, type AgentProcess, type IngressProcess } from '../support/cluster.js';
import { createDb, createPool } from '../../services/control-plane/src/db/pool.js';
import { migrate } from '../../services/control-plane/src/db/migrate.js';
import { createAccountWithKey } from '../../services/control-plane/src/modules/accounts/accounts.service.js';
import { ensureLocalTls } from '../../services/ingress/src/tls.js';

/**
 * Route modules and the traffic policy on live traffic, through real processes: a control plane,
 * two ingress nodes (each its own rate-limit server, sharing one Redis), our agent and an upstream
 * that echoes what reached it. Every module is configured through the REST API.
 */

const HOST = 'mods.e2e.test';
let db: Awaited<ReturnType<typeof freshDatabase>>;
let cp: ControlPlaneProcess;
let a: IngressProcess;
let b: IngressProcess;
let agent: AgentProcess;
let apiKey: string;
let upstream: http.Server;
let edgeId: string;
let backendId: string;
const prefix = `e2e-${randomBytes(4).toString('hex')}`;
const redisUrl = inject('redisUrl');

const api = (method: string, p: string, body?: unknown) => callApi(cp.baseUrl, apiKey, method, p, body);

interface Res {
  status: number;
  headers: http.IncomingHttpHeaders;
  raw: Buffer;
  json: () => any;
}
function request(port: number, p: string, opts: { method?: string; headers?: Record<string, string>; body?: string | Buffer } = {}): Promise<Res> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path: p, method: opts.method ?? 'GET', agent: false, headers: { host: HOST, ...opts.headers } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const raw = Buffer.concat(chunks);
        resolve({ status: res.statusCode ?? 0, headers: res.headers, raw, json: () => JSON.parse(raw.toString()) });
      });
    });
    req.setTimeout(10_000, () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end(opts.body);
  });
}

async function route(match: string, modules: Record<string, unknown>): Promise<string> {
  const r = await api('POST', `/edges/https/${edgeId}/routes`, { match_type: 'path_prefix', match, backend: { enabled: true, backend_id: backendId }, ...modules });
  if (r.status !== 201) throw new Error(`route ${match}: ${r.status} ${JSON.stringify(r.body)}`);
  // Both nodes have applied it once the path no longer answers "no route".
  for (const n of [a, b]) await waitFor(`${n.nodeId} applies ${match}`, async () => (await request(n.http, `${match}/probe-${randomBytes(2).toString('hex')}`, { headers: { 'user-agent': 'probe' } })).headers['warren-error-code'] !== 'ERR_WARREN_7001');
  return r.body.id;
}

beforeAll(async () => {
  db = await freshDatabase();
  const pool = createPool(db.url, 2);
  await migrate(pool);
  apiKey = (await createAccountWithKey(createDb(pool), 'modules-e2e')).token;
  await pool.end();
  const tls = await ensureLocalTls(tempDir('warren-mods-tls-'));
  const nodeToken = randomBytes(16).toString('hex');
  cp = await startControlPlane({ databaseUrl: db.url, env: { WARREN_NODE_TOKEN: nodeToken } });
  const env = { TLS_CERT_FILE: tls.caFile.replace(/ca\.pem$/, 'cert.pem'), TLS_KEY_FILE: tls.caFile.replace(/ca\.pem$/, 'key.pem'), REDIS_URL: redisUrl };
  // Each node is its own rate-limit server; the run's own ids keep its Redis keys apart.
  [a, b] = (await Promise.all(
    ['mods-a', 'mods-b'].map((nodeId) => startIngress({ nodeId, controlPlane: [`127.0.0.1:${cp.grpcPort}`], nodeToken, env: { ...env, RATE_LIMIT_SERVER_ID: `${prefix}-${nodeId}` } })),
  )) as [IngressProcess, IngressProcess];

  upstream = http.createServer((req, res) => {
    let n = 0;
    req.on('data', (c: Buffer) => (n += c.length));
    req.on('end', () => {
      const m = /\/status\/(\d{3})/.exec(req.url ?? '');
      const text = JSON.stringify({ url: req.url, method: req.method, headers: req.headers, bytes: n, pad: 'x'.repeat(4096) });
      res.writeHead(m ? Number(m[1]) : 200, { 'content-type': 'application/json', 'x-upstream': 'yes' });
      res.end(text);
    });
  });
  const upPort = await new Promise<number>((r) => upstream.listen(0, '127.0.0.1', () => r((upstream.address() as { port: number }).port)));

  const cred = await api('POST', '/credentials', {});
  backendId = (await api('POST', '/backends/tunnel_group', { labels: { app: 'mods' } })).body.id;
  edgeId = (await api('POST', '/edges/https', { hostports: [`${HOST}:443`] })).body.id;
  agent = startAgentProcess(['http', String(upPort), '--label', 'app=mods', '--authtoken', cred.body.token, '--server', `localhost:${a.agent}`, '--ca', tls.caFile]);
  await agent.waitForOutput('online');
}, 90_000);

afterAll(async () => {
  await Promise.allSettled([agent?.stop({ timeoutMs: 10_000 }), a?.stop({ timeoutMs: 10_000 }), b?.stop({ timeoutMs: 10_000 }), cp?.stop({ timeoutMs: 10_000 })]);
  upstream?.close();
  await db?.drop();
  const redis = new Redis(redisUrl);
  for (const node of ['mods-a', 'mods-b']) {
    const keys = await redis.keys(redisKeyPattern(`${prefix}-${node}`));
    if (keys.length) await redis.del(...keys);
  }
  redis.disconnect();
  cleanupTempDirs();
}, 60_000);

describe('traffic policy on live traffic', () => {
  it('rate-limits per ingress server with 429 + retry-after; results reach later expressions', async () => {
    await route('/rl', {
      traffic_policy: {
        value: JSON.stringify({
          inbound: [
            { name: 'limit', actions: [{ type: 'rate-limit', config: { name: 'per-user', algorithm: 'sliding_window', capacity: 3, rate: '60s', bucket_key: ['req.host', "getReqHeader('X-User')"] } }] },
            { name: 'mark', expressions: ['actions.ngrok.rate_limit.limited == false'], actions: [{ type: 'add-headers', config: { headers: { 'x-rl': 'admitted' } } }] },
          ],
        }),
      },
    });
    for (const n of [a, b]) {
      // Each server admits the capacity on its own (the probe above used another bucket).
      for (let i = 0; i < 3; i++) {
        const r = await request(n.http, '/rl/x', { headers: { 'x-user': 'alice' } });
        expect(r.status, r.raw.toString()).toBe(200);
        expect(r.json().headers['x-rl']).toBe('admitted');
      }
      const limited = await request(n.http, '/rl/x', { headers: { 'X-USER': 'alice' } });
      expect(limited.status).toBe(429);
      expect(Number(limited.headers['retry-after'])).toBeGreaterThanOrEqual(1);
      expect(String(limited.headers['retry-after'])).toMatch(/^\d+$/);
      expect((await request(n.http, '/rl/x', { headers: { 'x-user': 'bob' } })).status).toBe(200);
    }
  });

  it('denies and answers custom responses by expression', async () => {
    await route('/deny', {
      traffic_policy: {
        value: `inbound:
  - expressions: ["req.method == 'DELETE'"]
    actions:
      - type: deny
        config: { status_code: 405 }
  - expressions: ["req.path.endsWith('/teapot')"]
    actions:
      - type: custom-response
        config: { status_code: 418, body: "short and stout", headers: { x-kind: teapot } }
outbound:
  - actions:
      - type: remove-headers
        config: { headers: [x-upstream] }
`,
      },
    });
    expect((await request(a.http, '/deny/x', { method: 'DELETE' })).status).toBe(405);
    const tea = await request(b.http, '/deny/teapot');
    expect([tea.status, tea.raw.toString(), tea.headers['x-kind']]).toEqual([418, 'short and stout', 'teapot']);
    const ok = await request(a.http, '/deny/ok');
    expect([ok.status, ok.headers['x-upstream']]).toEqual([200, undefined]);
  });

  it('matches() runs RE2: denies by pattern, never backtracks, and refuses a non-RE2 pattern with a 400', async () => {
    const bad = await api('POST', `/edges/https/${edgeId}/routes`, {
      match_type: 'path_prefix',
      match: '/rx-bad',
      backend: { enabled: true, backend_id: backendId },
      traffic_policy: { value: `inbound:\n  - expressions: ["req.path.matches('^/(?=admin)')"]\n    actions: [{type: deny}]\n` },
    });
    expect(bad.status).toBe(400);
    expect(JSON.stringify(bad.body)).toMatch(/inbound\[0\]\.expressions\[0\].*matches\(\): invalid RE2 pattern/);

    await route('/rx', {
      traffic_policy: {
        value: `inbound:
  - expressions: ["req.path.matches('^/rx/admin(/|$)')"]
    actions:
      - type: deny
        config: { status_code: 403 }
  - expressions: ["matches(req.path, '^/rx/(a+)+$')"]
    actions:
      - type: custom-response
        config: { status_code: 200, body: "all a" }
`,
      },
    });
    for (const n of [a, b]) {
      expect((await request(n.http, '/rx/admin')).status).toBe(403);
      expect((await request(n.http, '/rx/admin/users')).status).toBe(403);
      const other = await request(n.http, '/rx/administrator');
      expect([other.status, other.json().url]).toEqual([200, '/rx/administrator']);
      // With a backtracking engine this path would hang the ingress.
      const evil = `/rx/${'a'.repeat(4000)}!`;
      const t = Date.now();
      const redos = await request(n.http, evil);
      expect([redos.status, redos.json().url]).toEqual([200, evil]);
      expect(Date.now() - t).toBeLessThan(2000);
      const allA = await request(n.http, `/rx/${'a'.repeat(4000)}`);
      expect([allA.status, allA.raw.toString()]).toEqual([200, 'all a']);
    }
  });
});

describe('route modules on live traffic', () => {
  it('request_headers and response_headers add and remove; a disabled module does nothing', async () => {
    await route('/hdr', { request_headers: { add: { 'X-Added': 'yes' }, remove: ['X-Drop'] }, response_headers: { add: { 'X-Resp': 'r' }, remove: ['X-Upstream'] } });
    await route('/off', { request_headers: { enabled: false, add: { 'X-Off': 'on' }, remove: [] } });
    for (const n of [a, b]) {
      const r = await request(n.http, '/hdr/x', { headers: { 'x-drop': 'gone', 'x-keep': 'kept' } });
      const seen = r.json().headers;
      expect([seen['x-added'], seen['x-drop'], seen['x-keep']]).toEqual(['yes', undefined, 'kept']);
      expect([r.headers['x-resp'], r.headers['x-upstream']]).toEqual(['r', undefined]);
      expect((await request(n.http, '/off/x')).json().headers['x-off']).toBeUndefined();
    }
  });

  it('ip_restriction denies a client in a denied CIDR and lets others through', async () => {
    const policy = await api('POST', '/ip_policies', { description: 'no loopback' });
    await api('POST', '/ip_policy_rules', { ip_policy_id: policy.body.id, cidr: '127.0.0.0/8', action: 'deny' });
    const allowOnly = await api('POST', '/ip_policies', { description: 'loopback only' });
    await api('POST', '/ip_policy_rules', { ip_policy_id: allowOnly.body.id, cidr: '127.0.0.0/8', action: 'allow' });
    await route('/ipdeny', { ip_restriction: { ip_policy_ids: [policy.body.id] } });
    await route('/ipallow', { ip_restriction: { ip_policy_ids: [allowOnly.body.id] } });
    for (const n of [a, b]) {
      expect((await request(n.http, '/ipdeny/x')).status).toBe(403);
      expect((await request(n.http, '/ipallow/x')).status).toBe(200);
    }
  });

  it('user_agent_filter denies by regular expression', async () => {
    await route('/ua', { user_agent_filter: { allow: [], deny: ['(?i)badbot'] } });
    expect((await request(a.http, '/ua/x', { headers: { 'user-agent': 'BadBot/1.0' } })).status).toBe(403);
    expect((await request(b.http, '/ua/x', { headers: { 'user-agent': 'curl/8' } })).status).toBe(200);
  });

  it('compression: gzip and brotli by Accept-Encoding', async () => {
    await route('/gz', { compression: {} });
    const gz = await request(a.http, '/gz/x', { headers: { 'accept-encoding': 'gzip' } });
    expect(gz.headers['content-encoding']).toBe('gzip');
    expect(JSON.parse(gunzipSync(gz.raw).toString()).url).toBe('/gz/x');
    const br = await request(b.http, '/gz/y', { headers: { 'accept-encoding': 'br' } });
    expect(br.headers['content-encoding']).toBe('br');
    expect(JSON.parse(brotliDecompressSync(br.raw).toString()).url).toBe('/gz/y');
    const plain = await request(a.http, '/gz/z');
    expect(plain.headers['content-encoding']).toBeUndefined();
  });

  it('circuit_breaker trips on upstream errors and answers 503 itself', async () => {
    await route('/cb', { circuit_breaker: { tripped_duration: 30, rolling_window: 10, num_buckets: 10, volume_threshold: 5, error_threshold_percentage: 0.5 } });
    const statuses: number[] = [];
    for (let i = 0; i < 10; i++) statuses.push((await request(a.http, '/cb/status/500')).status);
    // The route's probe (one success) counts toward the volume: 1 + 4 errors trip it at 80 %.
    expect(statuses.slice(0, 4)).toEqual([500, 500, 500, 500]);
    expect(statuses.at(-1)).toBe(503);
    expect((await request(a.http, '/cb/fine')).status).toBe(503); // tripped: nothing reaches the upstream
  });

  it('webhook_verification checks a GitHub signature', async () => {
    await route('/wh', { webhook_verification: { provider: 'GITHUB', secret: 's3cret' } });
    const body = JSON.stringify({ zen: 'Keep it logically awesome.' });
    const sig = `sha256=${createHmac('sha256', 's3cret').update(body).digest('hex')}`;
    const ok = await request(a.http, '/wh/hook', { method: 'POST', body, headers: { 'content-type': 'application/json', 'x-hub-signature-256': sig, 'x-github-event': 'ping' } });
    expect(ok.status).toBe(200);
    expect(ok.json().bytes).toBe(Buffer.byteLength(body));
    const bad = await request(b.http, '/wh/hook', { method: 'POST', body, headers: { 'content-type': 'application/json', 'x-hub-signature-256': 'sha256=00', 'x-github-event': 'ping' } });
    expect(bad.status).toBe(403);
  });

  it('refuses traffic on a route with an authentication module it does not enforce, never serving it open', async () => {
    const r = await api('POST', `/edges/https/${edgeId}/routes`, { match_type: 'path_prefix', match: '/auth', backend: { enabled: true, backend_id: backendId }, oauth: { provider: { google: {} } } });
    expect(r.status).toBe(201);
    for (const n of [a, b]) {
      const res = await waitFor(`${n.nodeId} refuses /auth`, async () => {
        const x = await request(n.http, '/auth/x');
        return x.headers['warren-error-code'] === 'ERR_WARREN_7010' ? x : null;
      });
      expect(res.status).toBe(503);
      expect(res.json().msg).toMatch(/oauth: client_id and client_secret are required/); // no managed app: 503, never open
    }
  });
});
