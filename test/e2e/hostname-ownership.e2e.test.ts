import http from 'node:http';
import { randomBytes } from 'node:crypto';
import ngrok from '@ngrok/ngrok';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freshDatabase } from '../support/databases.js';
import { startControlPlane, type ControlPlaneProcess } from '../support/processes.js';
import { callApi, cleanupTempDirs, nodesAtHead, startAgentProcess, startIngress, tempDir, waitFor, type AgentProcess, type IngressProcess } from '../support/cluster.js';
import { createDb, createPool } from '../../services/control-plane/src/db/pool.js';
import { migrate } from '../../services/control-plane/src/db/migrate.js';
import { createAccountWithKey } from '../../services/control-plane/src/modules/accounts/accounts.service.js';
import { ensureLocalTls } from '../../services/ingress/src/tls.js';
import { AGENT_ONLINE_MS, CONTROL_PLANE_START_MS, NODES_HOOK_MS, WORK_MS } from '../support/timeouts.js';

/**
 * A hostname belongs to one account (README), with real processes: a control plane, two ingress
 * nodes, accounts V and X.
 * - V serves `victim-ep` with our agent (a Bind); X, with its own API key, cannot put an HTTPS
 *   edge on that host (409 ERR_WARREN_4101), and V's traffic keeps going to V.
 * - X and V bind one hostname with the official SDK on two nodes that cannot hear of each other
 *   (the control plane is down: the race of two simultaneous Binds, made certain). Both Binds
 *   succeed; once the control plane is back and each node learns the other's tunnel, every node
 *   sends the hostname to the account that bound it first, not each to its local tunnel.
 */

let db: Awaited<ReturnType<typeof freshDatabase>>;
let cp: ControlPlaneProcess;
let nodeToken: string;
let a: IngressProcess;
let b: IngressProcess;
let vKey: string;
let xKey: string;
let tls: Awaited<ReturnType<typeof ensureLocalTls>>;
const servers: http.Server[] = [];
const sessions: ngrok.Session[] = [];
const agents: AgentProcess[] = [];

const api = (key: string, method: string, p: string, body?: unknown) => callApi(cp.baseUrl, key, method, p, body);

function request(port: number, host: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path: '/', agent: false, headers: { host } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }));
    });
    req.setTimeout(10_000, () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end();
  });
}

async function upstream(answer: string): Promise<number> {
  const s = http.createServer((_req, res) => res.end(answer));
  servers.push(s);
  return new Promise((r) => s.listen(0, '127.0.0.1', () => r((s.address() as { port: number }).port)));
}

/** Every node has applied the database's head version (credentials usable on any node). */
const applied = () => nodesAtHead(db.url, [a, b]);

const startCp = (grpcPort?: number) =>
  startControlPlane({ databaseUrl: db.url, env: { WARREN_NODE_TOKEN: nodeToken, ...(grpcPort ? { GRPC_PORT: String(grpcPort) } : {}) } });

beforeAll(async () => {
  db = await freshDatabase();
  const pool = createPool(db.url, 2);
  await migrate(pool);
  vKey = (await createAccountWithKey(createDb(pool), 'victim')).token;
  xKey = (await createAccountWithKey(createDb(pool), 'claimer')).token;
  await pool.end();
  tls = await ensureLocalTls(tempDir('warren-hostname-tls-'));
  nodeToken = randomBytes(16).toString('hex');
  cp = await startCp();
  const env = { TLS_CERT_FILE: tls.caFile.replace(/ca\.pem$/, 'cert.pem'), TLS_KEY_FILE: tls.caFile.replace(/ca\.pem$/, 'key.pem') };
  [a, b] = (await Promise.all(['hostname-a', 'hostname-b'].map((nodeId) => startIngress({ nodeId, controlPlane: [`127.0.0.1:${cp.grpcPort}`], nodeToken, env })))) as [IngressProcess, IngressProcess];
}, NODES_HOOK_MS);

afterAll(async () => {
  for (const s of sessions) await s.close().catch(() => {});
  await Promise.allSettled([...agents, a, b, cp].map((p) => p?.stop({ timeoutMs: 10_000 })));
  for (const s of servers) s.close();
  await db?.drop();
  cleanupTempDirs();
}, 60_000);

describe('hostname ownership across accounts', () => {
  it("refuses an HTTPS edge on another account's live agent endpoint host; the endpoint keeps its traffic", async () => {
    const host = 'victim-ep.e2e.test';
    const vUp = await upstream('victim');
    const xUp = await upstream('claimer');
    const vCred = (await api(vKey, 'POST', '/credentials', {})).body;
    const xCred = (await api(xKey, 'POST', '/credentials', {})).body;
    await applied();
    const agent = startAgentProcess(['http', String(vUp), '--domain', host, '--authtoken', vCred.token, '--server', `localhost:${a.agent}`, '--ca', tls.caFile]);
    agents.push(agent);
    await agent.waitForOutput('online');
    // The control plane has recorded the endpoint (the edge check reads its tunnels).
    await waitFor('the endpoint is recorded', async () => ((await api(vKey, 'GET', '/tunnels')).body.tunnels as unknown[]).length === 1);
    for (const n of [a, b]) await waitFor(`${n.nodeId} serves the endpoint`, async () => (await request(n.http, host)).body === 'victim');

    const edge = await api(xKey, 'POST', '/edges/https', { hostports: [`${host}:443`] });
    expect(edge.status).toBe(409);
    expect(edge.body).toMatchObject({ error_code: 'ERR_WARREN_4101', details: { field: 'hostports' } });
    // Nor by extending an edge of its own host onto it.
    const own = await api(xKey, 'POST', '/edges/https', { hostports: ['claimer-own.e2e.test:443'] });
    expect(own.status).toBe(201);
    const patched = await api(xKey, 'PATCH', `/edges/https/${own.body.id}`, { hostports: ['claimer-own.e2e.test:443', `${host}:8443`] });
    expect(patched.status).toBe(409);
    expect(patched.body.error_code).toBe('ERR_WARREN_4101');

    // Had the edge been created, a route to X's backend would take V's traffic: X tries it all.
    const backend = (await api(xKey, 'POST', '/backends/tunnel_group', { labels: { app: 'claimer' } })).body;
    const x = startAgentProcess(['http', String(xUp), '--label', 'app=claimer', '--authtoken', xCred.token, '--server', `localhost:${b.agent}`, '--ca', tls.caFile]);
    agents.push(x);
    await x.waitForOutput('online');
    if (edge.status === 201) await api(xKey, 'POST', `/edges/https/${edge.body.id as string}/routes`, { match_type: 'path_prefix', match: '/', backend: { enabled: true, backend_id: backend.id } });
    await applied();
    for (const n of [a, b]) for (let i = 0; i < 3; i++) expect((await request(n.http, host)).body).toBe('victim');
  }, 2 * AGENT_ONLINE_MS + 2 * WORK_MS); // two agents, and waits for the nodes of up to 110 s in all

  it('two Binds of one hostname by two accounts on two nodes: every node ends up serving the first', async () => {
    const host = 'raced.e2e.test';
    const firstUp = await upstream('first');
    const laterUp = await upstream('later');
    const xCred = (await api(xKey, 'POST', '/credentials', {})).body;
    const vCred = (await api(vKey, 'POST', '/credentials', {})).body;
    await applied();
    const grpcPort = cp.grpcPort;
    // Neither node can hear of the other's tunnel: both Binds pass their node's check.
    await cp.stop();
    const connect = (port: number, token: string) => new ngrok.SessionBuilder().serverAddr(`localhost:${port}`).caCert(Buffer.from(tls.caPem!)).authtoken(token).connect();
    const xs = await connect(a.agent, xCred.token);
    sessions.push(xs);
    await xs.httpEndpoint().domain(host).listenAndForward(`http://127.0.0.1:${firstUp}`);
    await new Promise((r) => setTimeout(r, 50)); // a later start, whatever the clocks' resolution
    const vs = await connect(b.agent, vCred.token);
    sessions.push(vs);
    await vs.httpEndpoint().domain(host).listenAndForward(`http://127.0.0.1:${laterUp}`);
    expect((await request(a.http, host)).body).toBe('first');
    expect((await request(b.http, host)).body).toBe('later');

    cp = await startCp(grpcPort);
    // Both nodes report their tunnels again and hear of the other's.
    await waitFor('the control plane has both tunnels', async () => ((await api(xKey, 'GET', '/tunnels')).body.tunnels?.length ?? 0) >= 1 && ((await api(vKey, 'GET', '/tunnels')).body.tunnels?.length ?? 0) >= 1, 30_000);
    for (const n of [a, b]) await waitFor(`${n.nodeId} serves the first claimer`, async () => (await request(n.http, host)).body === 'first', 30_000).catch(async (err: unknown) => {
      throw new Error(`${(err as Error).message}; ${n.nodeId} answers ${JSON.stringify(await request(n.http, host))}`);
    });
    const seen: string[] = [];
    for (const n of [a, b]) for (let i = 0; i < 4; i++) seen.push((await request(n.http, host)).body);
    expect(new Set(seen)).toEqual(new Set(['first']));
  }, CONTROL_PLANE_START_MS + 3 * WORK_MS); // a control plane restarted, and waits of up to 40 + 20 + 90 s
});
