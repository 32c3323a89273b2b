import http from 'node:http';
import { randomBytes } from 'node:crypto';
import ngrok from '@ngrok/ngrok';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../../services/agent/src/client.js';
import { freshDatabase } from '../support/databases.js';
import { startControlPlane, type ControlPlaneProcess } from '../support/processes.js';
import { callApi, callApiExpecting, cleanupTempDirs, nodesAtHead, startIngress, tempDir, waitFor, type IngressProcess } from '../support/cluster.js';
import { createDb, createPool } from '../../services/control-plane/src/db/pool.js';
import { migrate } from '../../services/control-plane/src/db/migrate.js';
import { createAccountWithKey } from '../../services/control-plane/src/modules/accounts/accounts.service.js';
import { ensureLocalTls } from '../../services/ingress/src/tls.js';
import { NODES_HOOK_MS } from '../support/timeouts.js';

/**
 * StopTunnel (server → agent, agent-protocol.md §3) with real processes: a control plane, two
 * ingress nodes, the official SDK (`@ngrok/ngrok` 1.7.0, unmodified) and our agent.
 * - A credential's ACL narrowed through the API (PATCH) stops the tunnels it no longer allows, in
 *   the same agent session: gone from the API and from routing, the SDK's listener closed with the
 *   error, while the session keeps serving the tunnel still allowed (on new proxy streams, so its
 *   accept loop lives).
 * - Two accounts binding one hostname on two nodes that cannot hear of each other (the control
 *   plane is down): once they do, the node holding the later tunnel stops it.
 */

const DOMAIN = 'stop.e2e.test';
let db: Awaited<ReturnType<typeof freshDatabase>>;
let cp: ControlPlaneProcess;
let nodeToken: string;
let a: IngressProcess;
let b: IngressProcess;
let key: string;
let otherKey: string;
let tls: Awaited<ReturnType<typeof ensureLocalTls>>;
const servers: http.Server[] = [];
const sessions: ngrok.Session[] = [];
const agents: AgentClient[] = [];

const api = (k: string, method: string, p: string, body?: unknown) => callApi(cp.baseUrl, k, method, p, body);

function request(port: number, host: string, p = '/'): Promise<{ status: number; code: string; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path: p, agent: false, headers: { host } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, code: String(res.headers['warren-error-code'] ?? ''), body: Buffer.concat(chunks).toString() }));
    });
    req.setTimeout(10_000, () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end();
  });
}

/**
 * An upstream answering `<answer> <host>`, with Connection: close: the agent's connection to it
 * ends with each answer, so does the proxy stream, and every request needs a new one.
 */
async function upstream(answer: string): Promise<string> {
  const s = http.createServer((req, res) => {
    res.setHeader('connection', 'close');
    res.end(`${answer} ${req.headers.host ?? ''}`);
  });
  servers.push(s);
  const port = await new Promise<number>((r) => s.listen(0, '127.0.0.1', () => r((s.address() as { port: number }).port)));
  return `http://127.0.0.1:${port}`;
}

/** Every node has applied the database's head version (credentials usable on any node). */
const applied = () => nodesAtHead(db.url, [a, b]);

const tunnelIds = async (k: string) => ((await api(k, 'GET', '/tunnels')).body.tunnels as Array<{ id: string }>).map((t) => t.id);
const joined = (l: ngrok.Listener) => l.join().then(() => null, (e: Error) => e);
const sdk = (port: number, token: string) => new ngrok.SessionBuilder().serverAddr(`localhost:${port}`).caCert(Buffer.from(tls.caPem!)).authtoken(token).connect();
const startCp = (grpcPort?: number) => startControlPlane({ databaseUrl: db.url, env: { WARREN_NODE_TOKEN: nodeToken, ...(grpcPort ? { GRPC_PORT: String(grpcPort) } : {}) } });

beforeAll(async () => {
  db = await freshDatabase();
  const pool = createPool(db.url, 2);
  await migrate(pool);
  key = (await createAccountWithKey(createDb(pool), 'stop-tunnel')).token;
  otherKey = (await createAccountWithKey(createDb(pool), 'stop-tunnel-other')).token;
  await pool.end();
  tls = await ensureLocalTls(tempDir('warren-stop-tls-'));
  nodeToken = randomBytes(16).toString('hex');
  cp = await startCp();
  // OUTHELD_BIND_GRACE_MS: the race below is stopped 3 s after node b learns of the older tunnel (15 s by default).
  const env = { TLS_CERT_FILE: tls.caFile.replace(/ca\.pem$/, 'cert.pem'), TLS_KEY_FILE: tls.caFile.replace(/ca\.pem$/, 'key.pem'), OUTHELD_BIND_GRACE_MS: '3000' };
  [a, b] = (await Promise.all(['stop-a', 'stop-b'].map((nodeId) => startIngress({ nodeId, controlPlane: [`127.0.0.1:${cp.grpcPort}`], nodeToken, env })))) as [IngressProcess, IngressProcess];
}, NODES_HOOK_MS);

afterAll(async () => {
  for (const s of sessions) await s.close().catch(() => {});
  for (const c of agents) await c.close().catch(() => {});
  await Promise.allSettled([a, b, cp].map((p) => p?.stop({ timeoutMs: 10_000 })));
  for (const s of servers) s.close();
  await db?.drop();
  cleanupTempDirs();
}, 60_000);

describe("StopTunnel when a credential's ACL is narrowed", () => {
  it('the official SDK: the tunnel no longer allowed is stopped in its session, the other one keeps serving', async () => {
    const hostA = `a.${DOMAIN}`;
    const hostB = `b.${DOMAIN}`;
    const up = await upstream('sdk');
    const cred = await callApiExpecting(cp.baseUrl, key, 201, 'POST', '/credentials', { acl: [`bind:${hostA}`, `bind:${hostB}`] });
    await applied();
    const session = await sdk(a.agent, cred.token);
    sessions.push(session);
    const la = await session.httpEndpoint().domain(hostA).listenAndForward(up);
    const lb = await session.httpEndpoint().domain(hostB).listenAndForward(up);
    const aClosed = joined(la);
    let bEnded = false;
    void joined(lb).then(() => (bEnded = true));
    for (const n of [a, b]) for (const host of [hostA, hostB]) await waitFor(`${n.nodeId} serves ${host}`, async () => (await request(n.http, host)).body === `sdk ${host}`, 20_000);
    expect(await tunnelIds(key)).toEqual(expect.arrayContaining([la.id(), lb.id()]));

    const patched = await api(key, 'PATCH', `/credentials/${cred.id as string}`, { acl: [`bind:${hostB}`] });
    expect(patched.status).toBe(200);
    expect(patched.body.acl).toEqual([`bind:${hostB}`]);
    const t0 = Date.now();
    // Gone from the API within a few seconds; the other tunnel is still there.
    await waitFor('the stopped tunnel leaves the API', async () => !(await tunnelIds(key)).includes(la.id()), 10_000);
    expect(Date.now() - t0).toBeLessThan(5_000);
    expect(await tunnelIds(key)).toContain(lb.id());
    // The SDK's listener was closed with our message and code (no session.close needed).
    const err = await aClosed;
    expect(err?.message).toMatch(/ListenerClosed/);
    expect(err?.message).toContain(`the authtoken's ACL no longer allows binding ${hostA} (ERR_WARREN_1100)`);
    expect(err?.message).toContain('ERR_WARREN_1100');
    // Requests to a get what a hostname without a tunnel gets, on every node.
    for (const n of [a, b]) {
      const r = await waitFor(`${n.nodeId} no longer routes ${hostA}`, async () => {
        const x = await request(n.http, hostA);
        return x.status !== 200 ? x : null;
      });
      expect([r.status, r.code]).toEqual([404, 'ERR_WARREN_7000']);
      expect(r.body).toContain(`no endpoint is configured for ${hostA}`);
    }
    const none = await request(a.http, `nothing.${DOMAIN}`);
    expect([none.status, none.code]).toEqual([404, 'ERR_WARREN_7000']);
    // b keeps serving through the same session, on new proxy streams (Connection: close upstream):
    // the SDK's accept loop survived the StopTunnel stream.
    for (let i = 0; i < 5; i++) for (const n of [a, b]) expect((await request(n.http, hostB, `/after/${i}`)).body).toBe(`sdk ${hostB}`);
    expect(bEnded).toBe(false);
    const sessionsOfCred = ((await api(key, 'GET', '/tunnel_sessions')).body.tunnel_sessions as Array<{ id: string; credential: { id: string } }>).filter((s) => s.credential.id === cred.id);
    expect(sessionsOfCred).toHaveLength(1);
    // A new Bind of a on that session is refused by the new ACL.
    const again = await session.httpEndpoint().domain(hostA).listenAndForward(up).then(
      () => null,
      (e: Error) => e,
    );
    expect(again?.message).toMatch(/ACL does not allow binding .*ERR_WARREN_1100/);
    expect((await request(a.http, hostB, '/last')).body).toBe(`sdk ${hostB}`);
  }, 90_000);

  it('warren-agent: tunnelLost with the message, the other tunnel and the session carry on', async () => {
    const hostA = `agent-a.${DOMAIN}`;
    const hostB = `agent-b.${DOMAIN}`;
    const up = await upstream('agent');
    const cred = await callApiExpecting(cp.baseUrl, key, 201, 'POST', '/credentials', { acl: [`bind:${hostA}`, `bind:${hostB}`] });
    await applied();
    const client = new AgentClient({ serverAddr: `localhost:${b.agent}`, authtoken: cred.token as string, ca: tls.caPem!, backoff: { initialMs: 50, maxMs: 500 } });
    agents.push(client);
    const sessionId = await client.connect();
    const lost: Array<[string, string]> = [];
    client.on('tunnelLost', (id, why) => lost.push([id, why]));
    const ta = await client.bind({ domain: hostA, forwardsTo: up });
    const tb = await client.bind({ domain: hostB, forwardsTo: up });
    for (const host of [hostA, hostB]) await waitFor(`${host} served`, async () => (await request(b.http, host)).body === `agent ${host}`, 20_000);

    expect((await api(key, 'PATCH', `/credentials/${cred.id as string}`, { acl: [`bind:${hostB}`] })).status).toBe(200);
    await waitFor('tunnelLost', () => lost.length === 1, 10_000);
    expect(lost).toEqual([[ta.id, `the authtoken's ACL no longer allows binding ${hostA} (ERR_WARREN_1100)`]]);
    await waitFor('the stopped tunnel leaves the API', async () => !(await tunnelIds(key)).includes(ta.id), 10_000);
    expect(client.list().map((t) => t.id)).toEqual([tb.id]);
    expect(client.session).toBe(sessionId);
    expect([(await request(b.http, hostA)).status, (await request(b.http, hostB)).body]).toEqual([404, `agent ${hostB}`]);
  }, 60_000);
});

describe('StopTunnel of the later tunnel of a cross-account hostname race', () => {
  it('two accounts bind one hostname on two nodes at once: the node holding the later tunnel stops it', async () => {
    const host = `raced.${DOMAIN}`;
    const firstUp = await upstream('first');
    const laterUp = await upstream('later');
    const firstCred = await callApiExpecting(cp.baseUrl, key, 201, 'POST', '/credentials', {});
    const laterCred = await callApiExpecting(cp.baseUrl, otherKey, 201, 'POST', '/credentials', {});
    await applied();
    const grpcPort = cp.grpcPort;
    // Neither node can hear of the other's tunnel: both Binds pass their node's check.
    await cp.stop();
    const fs = await sdk(a.agent, firstCred.token);
    sessions.push(fs);
    const first = await fs.httpEndpoint().domain(host).listenAndForward(firstUp);
    const firstClosed = joined(first);
    await new Promise((r) => setTimeout(r, 50)); // a later start, whatever the clocks' resolution
    const ls = await sdk(b.agent, laterCred.token);
    sessions.push(ls);
    const later = await ls.httpEndpoint().domain(host).listenAndForward(laterUp);
    const laterClosed = joined(later);
    const other = await ls.httpEndpoint().domain(`later-own.${DOMAIN}`).listenAndForward(laterUp);
    expect((await request(a.http, host)).body).toBe(`first ${host}`);
    expect((await request(b.http, host)).body).toBe(`later ${host}`);

    cp = await startCp(grpcPort);
    // Node b learns of the first tunnel: routing gives it the host at once, and the later tunnel is
    // stopped only after OUTHELD_BIND_GRACE_MS (the first may be a dead node's stale report).
    await waitFor('node b serves the first claimer', async () => (await request(b.http, host)).body === `first ${host}`, 30_000);
    const early = await Promise.race([laterClosed.then(() => 'closed'), new Promise((r) => setTimeout(() => r('open'), 300))]);
    expect(early).toBe('open');
    // Then it is stopped, with the Bind refusal's words.
    const err = await Promise.race([laterClosed, new Promise<Error>((_, reject) => setTimeout(() => reject(new Error('the later listener was not closed')), 30_000))]);
    expect(err?.message).toMatch(/ListenerClosed/);
    expect(err?.message).toContain(`the hostname ${host} is in use by another account (ERR_WARREN_4101)`);
    expect(err?.message).toContain('ERR_WARREN_4101');
    await waitFor('the later tunnel leaves the API', async () => {
      const ids = await tunnelIds(otherKey);
      return !ids.includes(later.id()) && ids.includes(other.id());
    }, 30_000);
    await waitFor('the first tunnel is in the API', async () => (await tunnelIds(key)).includes(first.id()), 30_000);
    for (const n of [a, b]) await waitFor(`${n.nodeId} serves the first claimer`, async () => (await request(n.http, host)).body === `first ${host}`, 30_000);
    // The first holder is not stopped, and the later account's session serves its other endpoint.
    const settled = await Promise.race([firstClosed.then(() => 'closed'), new Promise((r) => setTimeout(() => r('open'), 500))]);
    expect(settled).toBe('open');
    expect((await request(b.http, `later-own.${DOMAIN}`)).body).toBe(`later later-own.${DOMAIN}`);
    // The first holder going away now leaves the hostname without a tunnel, not to the later one.
    await first.close();
    for (const n of [a, b]) await waitFor(`${n.nodeId} has no tunnel for ${host}`, async () => (await request(n.http, host)).code === 'ERR_WARREN_7000', 15_000);
  }, 120_000);
});
