import http from 'node:http';
import https from 'node:https';
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freshDatabase } from '../support/databases.js';
import { freePort, startControlPlane, type ControlPlaneProcess } from '../support/processes.js';
import { callApi, cleanupTempDirs, startAgentProcess, startIngress, tempDir, waitFor, type AgentProcess, type IngressProcess } from '../support/cluster.js';
import { createDb, createPool } from '../../services/control-plane/src/db/pool.js';
import { migrate } from '../../services/control-plane/src/db/migrate.js';
import { createAccountWithKey } from '../../services/control-plane/src/modules/accounts/accounts.service.js';
import { ensureLocalTls } from '../../services/ingress/src/tls.js';
import { listenEchoingUpgrades, upgradeEcho } from '../support/upgrade.js';
import { AGENT_ONLINE_MS, CONTROL_PLANE_START_MS, INGRESS_START_MS, NODES_HOOK_MS, WORK_MS } from '../support/timeouts.js';

/**
 * Live traffic end to end, every piece a real process on real Postgres: a control plane, two
 * ingress nodes and our agent. Config made through the API reaches both nodes over gRPC; traffic
 * enters either node and reaches the upstream behind the agent (connected to node A only); both
 * keep serving while the control plane is down, a node restarted during the outage serves from
 * disk, and everything catches up when the control plane returns.
 */

const HOST = 'app.e2e.test';
let db: Awaited<ReturnType<typeof freshDatabase>>;
let cp: ControlPlaneProcess;
let grpcPort: number;
const nodeToken = randomBytes(16).toString('hex');
let a: IngressProcess;
let b: IngressProcess;
let agent: AgentProcess;
let upstream: http.Server;
let upstreamPort: number;
let tls: Awaited<ReturnType<typeof ensureLocalTls>>;
let apiKey: string;
const hits: string[] = [];

const api = (method: string, p: string, body?: unknown) => callApi(cp.baseUrl, apiKey, method, p, body);

function request(port: number, p: string, opts: { secure?: boolean; host?: string } = {}): Promise<{ status: number; body: string; headers: http.IncomingHttpHeaders }> {
  return new Promise((resolve, reject) => {
    const mod = opts.secure ? https : http;
    const req = mod.request(
      { host: '127.0.0.1', port, path: p, agent: false, headers: { host: opts.host ?? HOST }, ...(opts.secure ? { ca: tls.caPem!, servername: opts.host ?? HOST } : {}) },
      (res) => {
        let data = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (data += c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: data, headers: res.headers }));
      },
    );
    req.setTimeout(10_000, () => req.destroy(new Error('request timed out')));
    req.on('error', reject);
    req.end();
  });
}

function ingressEnv() {
  // info: the config client's connects, syncs and resyncs are in the output a failure prints.
  return { TLS_CERT_FILE: path.join(tls.caFile, '..', 'cert.pem'), TLS_KEY_FILE: path.join(tls.caFile, '..', 'key.pem'), LOG_LEVEL: 'info' };
}

async function startCp(): Promise<ControlPlaneProcess> {
  return startControlPlane({ databaseUrl: db.url, env: { GRPC_PORT: String(grpcPort), WARREN_NODE_TOKEN: nodeToken, LOG_LEVEL: 'info' } });
}

let routeId: string;
let edgeId: string;
let backendId: string;

beforeAll(async () => {
  db = await freshDatabase();
  const pool = createPool(db.url, 2);
  await migrate(pool);
  apiKey = (await createAccountWithKey(createDb(pool), 'e2e')).token;
  await pool.end();
  tls = await ensureLocalTls(tempDir('warren-tls-'), [HOST]);
  grpcPort = await freePort();
  cp = await startCp();

  upstream = http.createServer((req, res) => {
    hits.push(req.url ?? '');
    res.writeHead(200, { 'content-type': 'text/plain', 'x-upstream': 'yes' });
    res.end(`hello ${req.method} ${req.url} xff=${req.headers['x-forwarded-for']} proto=${req.headers['x-forwarded-proto']}`);
  });
  upstreamPort = await listenEchoingUpgrades(upstream);

  const started = await Promise.all(
    ['e2e-a', 'e2e-b'].map((nodeId) => startIngress({ nodeId, controlPlane: [`127.0.0.1:${grpcPort}`], nodeToken, env: ingressEnv() })),
  );
  a = started[0]!;
  b = started[1]!;
}, NODES_HOOK_MS);

afterAll(async () => {
  await Promise.allSettled([agent?.stop({ timeoutMs: 10_000 }), a?.stop({ timeoutMs: 10_000 }), b?.stop({ timeoutMs: 10_000 }), cp?.stop({ timeoutMs: 10_000 })]);
  upstream?.close();
  await db?.drop();
  cleanupTempDirs();
}, 60_000);

describe('live traffic through two ingress nodes', () => {
  let authtoken: string;

  it('serves /readyz once the config is applied and refuses unknown hosts', async () => {
    for (const n of [a, b]) {
      await waitFor(`${n.nodeId} ready`, async () => (await fetch(`${n.internalUrl}/readyz`)).status === 200);
      const r = await request(n.http, '/', { host: 'unknown.e2e.test' });
      expect(r.status).toBe(404);
      expect(r.headers['warren-error-code']).toBe('ERR_WARREN_7000');
    }
  });

  it('configures an edge, a backend and a route through the API; no tunnel yet is a 503', async () => {
    const cred = await api('POST', '/credentials', { description: 'e2e agent' });
    expect(cred.status).toBe(201);
    authtoken = cred.body.token;
    const backend = await api('POST', '/backends/tunnel_group', { labels: { app: 'e2e' } });
    backendId = backend.body.id;
    const edge = await api('POST', '/edges/https', { hostports: [`${HOST}:443`] });
    edgeId = edge.body.id;
    const route = await api('POST', `/edges/https/${edgeId}/routes`, { match_type: 'path_prefix', match: '/', backend: { enabled: true, backend_id: backendId } });
    expect(route.status).toBe(201);
    routeId = route.body.id;
    for (const n of [a, b]) {
      const r = await waitFor(`${n.nodeId} applies the route`, async () => {
        const x = await request(n.http, '/');
        return x.status === 503 ? x : null;
      });
      expect(r.headers['warren-error-code']).toBe('ERR_WARREN_7003');
    }
  });

  it('connects our agent to node A; its session and tunnel show in the API promptly', async () => {
    agent = startAgentProcess(['http', String(upstreamPort), '--label', 'app=e2e', '--authtoken', authtoken, '--server', `localhost:${a.agent}`, '--ca', tls.caFile]);
    await agent.waitForOutput('online');
    const t0 = Date.now();
    // Reported at once (agent → node → control plane → database): well under a second when idle.
    // The bound is for a loaded CI machine (four spawned services and other test files on two
    // cores); the figure is logged.
    const tunnels = await waitFor('tunnel listed', async () => {
      const r = await api('GET', '/tunnels');
      return r.body?.tunnels?.length === 1 ? r.body.tunnels : null;
    }, 5_000);
    const listedMs = Date.now() - t0;
    console.log(`agent online → tunnel listed in the API: ${listedMs} ms`);
    expect(listedMs).toBeLessThan(5_000);
    expect(tunnels[0].labels).toEqual({ app: 'e2e' });
    const sessions = await api('GET', '/tunnel_sessions');
    expect(sessions.body.tunnel_sessions).toHaveLength(1);
    const be = await api('GET', `/backends/tunnel_group/${backendId}`);
    expect(be.body.tunnels.map((t: { id: string }) => t.id)).toEqual([tunnels[0].id]);
  }, AGENT_ONLINE_MS + WORK_MS);

  it('carries requests through both nodes (B hops to A), over HTTP and HTTPS', async () => {
    for (const n of [a, b]) {
      const r = await waitFor(`${n.nodeId} reaches the tunnel`, async () => {
        const x = await request(n.http, '/hello?x=1');
        return x.status === 200 ? x : null;
      });
      expect(r.body).toBe('hello GET /hello?x=1 xff=127.0.0.1 proto=http');
      expect(r.headers['x-upstream']).toBe('yes');
      const s = await request(n.https, '/secure', { secure: true });
      expect([s.status, s.body]).toEqual([200, 'hello GET /secure xff=127.0.0.1 proto=https']);
    }
    for (const n of [a, b]) expect(await upgradeEcho(n.http, HOST, '/ws')).toMatch(/^HTTP\/1.1 101[\s\S]*ping$/);
    const metrics = await (await fetch(`${b.internalUrl}/metrics`)).text();
    expect(metrics).toMatch(/warren_ingress_hops_total\{node="e2e-b"\} [1-9]/);
    expect(metrics).toMatch(/warren_ingress_requests_total\{edge="edghts_[^"]+",route="edghtsrt_[^"]+",status="200",node="e2e-b"\} [1-9]/);
  });

  it('applies a PATCHed route on both nodes', async () => {
    const p = await api('PATCH', `/edges/https/${edgeId}/routes/${routeId}`, { match: '/api' });
    expect(p.status).toBe(200);
    for (const n of [a, b]) {
      await waitFor(`${n.nodeId} applies the PATCH`, async () => (await request(n.http, '/hello')).status === 404, 5_000);
      expect((await request(n.http, '/api/x')).status).toBe(200);
    }
  });

  it('keeps serving with the control plane down, and a node restarted during the outage serves from disk', async () => {
    await cp.stop();
    for (const n of [a, b]) expect((await request(n.http, '/api/during-outage')).status).toBe(200);
    await b.stop();
    b = await startIngress({ nodeId: 'e2e-b', controlPlane: [`127.0.0.1:${grpcPort}`], nodeToken, stateDir: b.stateDir, env: ingressEnv() });
    await waitFor('restarted B ready from disk', async () => (await fetch(`${b.internalUrl}/readyz`)).status === 200, 10_000);
    const r = await request(b.http, '/api/after-restart');
    expect(r.status).toBe(200);
    expect((await request(b.http, '/hello')).status).toBe(404); // the PATCHed route, from disk
  }, INGRESS_START_MS + WORK_MS); // a node restarted

  it('catches up when the control plane returns', async () => {
    cp = await startCp();
    const p = await api('PATCH', `/edges/https/${edgeId}/routes/${routeId}`, { match: '/v2' });
    expect(p.status).toBe(200);
    for (const n of [a, b]) {
      // B reconnects after at most the 5 s backoff cap; the rest is slack for a loaded machine
      // (two suites at once). On a miss, say where the node stood.
      await waitFor(`${n.nodeId} catches up`, async () => (await request(n.http, '/v2/x')).status === 200, 30_000).catch(async (err: Error) => {
        const status = await fetch(`${n.internalUrl}/status`).then((r) => r.text(), (e: Error) => e.message);
        const other = n === a ? b : a;
        const otherStatus = await fetch(`${other.internalUrl}/status`).then((r) => r.text(), (e: Error) => e.message);
        throw new Error(`${err.message}\n/status: ${status}\n${other.nodeId} /status: ${otherStatus}\n--- ${n.nodeId} output ---\n${n.output().slice(-6000)}\n--- control plane output ---\n${cp.output().slice(-8000)}`);
      });
      expect((await request(n.http, '/api/x')).status).toBe(404);
    }
    const status = (await (await fetch(`${b.internalUrl}/status`)).json()) as { control_plane_connected: boolean };
    expect(status.control_plane_connected).toBe(true);
    // The stall watchdog (a node behind the announced head for 15 s syncs afresh) may have been
    // what brought a node up to date: it works, but the stall behind it is worth a look.
    for (const n of [a, b]) {
      if (n.output().includes('config stays behind the control plane head')) {
        console.warn(`${n.nodeId} caught up only through the stall watchdog\n--- ${n.nodeId} output ---\n${n.output().slice(-6000)}\n--- control plane output ---\n${cp.output().slice(-8000)}`);
      }
    }
  }, CONTROL_PLANE_START_MS + 2 * WORK_MS); // a control plane restarted, and two waits of up to 30 s

  it('removes the tunnel from the API when the agent stops', async () => {
    await agent.stop();
    await waitFor('tunnel gone', async () => (await api('GET', '/tunnels')).body?.tunnels?.length === 0, 5_000);
    for (const n of [a, b]) await waitFor(`${n.nodeId} sees no tunnel`, async () => (await request(n.http, '/v2/x')).status === 503, 5_000);
  });
});

describe('revoking an agent credential', () => {
  it('ends the sessions of a deleted credential at once; the agent exits with our error', async () => {
    const cred = await api('POST', '/credentials', { description: 'to revoke' });
    const revoked = startAgentProcess(['http', String(upstreamPort), '--label', 'app=e2e', '--authtoken', cred.body.token, '--server', `localhost:${b.agent}`, '--ca', tls.caFile]);
    await revoked.waitForOutput('online');
    await waitFor('revocable tunnel listed', async () => (await api('GET', '/tunnels')).body?.tunnels?.length === 1, 5_000);
    expect((await api('DELETE', `/credentials/${cred.body.id}`)).status).toBe(204);
    const exit = await Promise.race([revoked.exited, new Promise<null>((r) => setTimeout(() => r(null), 15_000))]);
    expect(exit?.code).toBe(1);
    expect(revoked.output()).toMatch(/ERR_WARREN_1004/);
    await waitFor('revoked tunnel gone', async () => (await api('GET', '/tunnels')).body?.tunnels?.length === 0, 5_000);
  }, AGENT_ONLINE_MS + WORK_MS);
});
