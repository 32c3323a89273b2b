import http from 'node:http';
import { createHash, randomBytes } from 'node:crypto';
import ngrok from '@ngrok/ngrok';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freshDatabase } from '../support/databases.js';
import { startControlPlane, type ControlPlaneProcess } from '../support/processes.js';
import { callApi, cleanupTempDirs, startIngress, tempDir, waitFor, type IngressProcess } from '../support/cluster.js';
import { createDb, createPool } from '../../services/control-plane/src/db/pool.js';
import { migrate } from '../../services/control-plane/src/db/migrate.js';
import { createAccountWithKey } from '../../services/control-plane/src/modules/accounts/accounts.service.js';
import { ensureLocalTls } from '../../services/ingress/src/tls.js';
import { listenEchoingUpgrades, upgradeEcho } from '../support/upgrade.js';
import { NODES_HOOK_MS } from '../support/timeouts.js';

/**
 * The official agent SDK (`@ngrok/ngrok` 1.7.0, unmodified) against real Warren processes: a
 * control plane and two ingress nodes. The SDK authenticates with an authtoken made through the
 * API, opens a labeled tunnel that an HTTPS edge's route reaches and an endpoint (Bind) tunnel;
 * real HTTP, large bodies and a WebSocket-style upgrade flow through either node. Killing the node
 * that holds a session (SIGKILL, no goodbye) removes its tunnels once the lease runs out.
 */

const EDGE_HOST = 'sdk.e2e.test';
const ENDPOINT_HOST = 'endpoint.e2e.test';
let db: Awaited<ReturnType<typeof freshDatabase>>;
let cp: ControlPlaneProcess;
let a: IngressProcess;
let b: IngressProcess;
let apiKey: string;
let upstream: http.Server;
let upstreamUrl: string;
let tls: Awaited<ReturnType<typeof ensureLocalTls>>;
const sessions: ngrok.Session[] = [];

const api = (method: string, p: string, body?: unknown) => callApi(cp.baseUrl, apiKey, method, p, body);

function request(port: number, host: string, p: string, body?: Buffer): Promise<{ status: number; body: Buffer }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path: p, method: body ? 'POST' : 'GET', agent: false, headers: { host } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks) }));
    });
    req.setTimeout(15_000, () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end(body);
  });
}

beforeAll(async () => {
  db = await freshDatabase();
  const pool = createPool(db.url, 2);
  await migrate(pool);
  apiKey = (await createAccountWithKey(createDb(pool), 'sdk-e2e')).token;
  await pool.end();
  tls = await ensureLocalTls(tempDir('warren-sdk-tls-'));
  const nodeToken = randomBytes(16).toString('hex');
  cp = await startControlPlane({ databaseUrl: db.url, env: { WARREN_NODE_TOKEN: nodeToken, TUNNEL_LEASE_MS: '3000', NODE_KEEPALIVE_INTERVAL_MS: '1000', TUNNEL_SWEEP_INTERVAL_MS: '250' } });
  const env = { TLS_CERT_FILE: tls.caFile.replace(/ca\.pem$/, 'cert.pem'), TLS_KEY_FILE: tls.caFile.replace(/ca\.pem$/, 'key.pem') };
  [a, b] = (await Promise.all(['sdk-a', 'sdk-b'].map((nodeId) => startIngress({ nodeId, controlPlane: [`127.0.0.1:${cp.grpcPort}`], nodeToken, env })))) as [IngressProcess, IngressProcess];

  upstream = http.createServer((req, res) => {
    const h = createHash('sha256');
    let n = 0;
    req.on('data', (c: Buffer) => {
      h.update(c);
      n += c.length;
    });
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ path: req.url, host: req.headers.host, xff: req.headers['x-forwarded-for'], bytes: n, sha: h.digest('hex') }));
    });
  });
  upstreamUrl = `http://127.0.0.1:${await listenEchoingUpgrades(upstream)}`;
}, NODES_HOOK_MS);

afterAll(async () => {
  for (const s of sessions) await s.close().catch(() => {});
  await Promise.allSettled([a?.stop({ timeoutMs: 10_000 }), b?.stop({ timeoutMs: 10_000 }), cp?.stop({ timeoutMs: 10_000 })]);
  upstream?.close();
  await db?.drop();
  cleanupTempDirs();
}, 60_000);

describe('the official agent SDK through real ingress nodes', () => {
  let authtoken: string;

  it('is refused with our message for an unknown authtoken', async () => {
    const err = await new ngrok.SessionBuilder().serverAddr(`localhost:${a.agent}`).caCert(Buffer.from(tls.caPem!)).authtoken('wrn_agt_not_a_real_token').connect().then(
      () => null,
      (e: Error) => e,
    );
    expect(err?.message).toMatch(/ERR_WARREN_1004/);
  });

  it('serves an edge route from a labeled SDK tunnel on node A, through A and (hop) B', async () => {
    authtoken = (await api('POST', '/credentials', { description: 'sdk' })).body.token;
    const backend = await api('POST', '/backends/tunnel_group', { labels: { app: 'sdk' } });
    const edge = await api('POST', '/edges/https', { hostports: [`${EDGE_HOST}:443`] });
    expect((await api('POST', `/edges/https/${edge.body.id}/routes`, { match_type: 'path_prefix', match: '/', backend: { enabled: true, backend_id: backend.body.id } })).status).toBe(201);

    const session = await new ngrok.SessionBuilder().serverAddr(`localhost:${a.agent}`).caCert(Buffer.from(tls.caPem!)).authtoken(authtoken).connect();
    sessions.push(session);
    const listener = await session.labeledListener().label('app', 'sdk').listenAndForward(upstreamUrl);
    await waitFor('tunnel in the API', async () => (await api('GET', '/tunnels')).body.tunnels.some((t: { id: string }) => t.id === listener.id()), 2_000);
    const be = await api('GET', `/backends/tunnel_group/${backend.body.id}`);
    expect(be.body.tunnels.map((t: { id: string }) => t.id)).toEqual([listener.id()]);

    const payload = randomBytes(3 * 1024 * 1024);
    for (const n of [a, b]) {
      const r = await waitFor(`${n.nodeId} routes to the SDK tunnel`, async () => {
        const x = await request(n.http, EDGE_HOST, '/sdk?q=1');
        return x.status === 200 ? x : null;
      });
      expect(JSON.parse(r.body.toString())).toMatchObject({ path: '/sdk?q=1', host: EDGE_HOST, xff: '127.0.0.1', bytes: 0 });
      const up = await request(n.http, EDGE_HOST, '/upload', payload);
      expect(JSON.parse(up.body.toString())).toMatchObject({ bytes: payload.length, sha: createHash('sha256').update(payload).digest('hex') });
    }
  });

  it('carries upgrades (WebSocket-style) to the SDK tunnel through both nodes', async () => {
    for (const n of [a, b]) {
      const out = await upgradeEcho(n.http, EDGE_HOST, '/ws', 'marco');
      expect(out).toMatch(/^HTTP\/1.1 101/);
    }
  });

  it('serves an SDK endpoint (Bind) on node B through both nodes; a second non-pooled Bind is refused', async () => {
    const session = await new ngrok.SessionBuilder().serverAddr(`localhost:${b.agent}`).caCert(Buffer.from(tls.caPem!)).authtoken(authtoken).connect();
    sessions.push(session);
    const listener = await session.httpEndpoint().domain(ENDPOINT_HOST).listenAndForward(upstreamUrl);
    expect(listener.url()).toMatch(new RegExp(`^https://${ENDPOINT_HOST.replace(/\./g, '\\.')}`));
    for (const n of [b, a]) {
      const r = await waitFor(`${n.nodeId} serves the endpoint`, async () => {
        const x = await request(n.http, ENDPOINT_HOST, '/ep');
        return x.status === 200 ? x : null;
      });
      expect(JSON.parse(r.body.toString())).toMatchObject({ path: '/ep' });
    }
    const again = await session.httpEndpoint().domain(ENDPOINT_HOST).listenAndForward(upstreamUrl).then(
      () => null,
      (e: Error) => e,
    );
    expect(again?.message).toMatch(/already online/);
  });

  it('drops the tunnels of a node killed without a goodbye once the lease runs out', async () => {
    const before = (await api('GET', '/tunnels')).body.tunnels.length;
    expect(before).toBe(2);
    await b.stop({ signal: 'SIGKILL' });
    const t0 = Date.now();
    await waitFor('lease expiry', async () => (await api('GET', '/tunnels')).body.tunnels.length === 1, 10_000);
    expect(Date.now() - t0).toBeLessThan(6_000);
    await waitFor('A stops routing to the dead endpoint', async () => (await request(a.http, ENDPOINT_HOST, '/ep')).status !== 200, 10_000);
    expect((await request(a.http, EDGE_HOST, '/still')).status).toBe(200);
  });
});
