import http from 'node:http';
import net from 'node:net';
import { randomBytes } from 'node:crypto';
import ngrok from '@ngrok/ngrok';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../../services/agent/src/client.js';
import { freshDatabase } from '../support/databases.js';
import { startControlPlane, type ControlPlaneProcess } from '../support/processes.js';
import { callApiExpecting, cleanupTempDirs, nodesAtHead, startAgentProcess, startIngress, tempDir, waitFor, type IngressProcess } from '../support/cluster.js';
import { createDb, createPool } from '../../services/control-plane/src/db/pool.js';
import { migrate } from '../../services/control-plane/src/db/migrate.js';
import { createAccountWithKey } from '../../services/control-plane/src/modules/accounts/accounts.service.js';
import { ensureLocalTls } from '../../services/ingress/src/tls.js';
import { AGENT_ONLINE_MS, NODES_HOOK_MS, WORK_MS } from '../support/timeouts.js';

/**
 * A tunnel that goes away while it carries requests, with real processes (a control plane, two
 * ingress nodes, our agent in-process and as the executable, the official SDK):
 * - Unbind: the tunnel leaves routing at once, but the requests it was carrying finish, on the
 *   node that holds it and through a hop from the other node; the ingress cuts them only after
 *   DRAIN_TIMEOUT_MS. The SDK's `listener.close()` (an Unbind) keeps forwarding what it had
 *   accepted, so its requests finish too.
 * - Upgraded connections: after an Unbind they are the agent's to end; a tunnel the server stops
 *   (a narrowed ACL) has them closed DRAIN_TIMEOUT_MS later.
 * - warren-agent on SIGTERM unbinds, lets the requests in progress finish (bounded by
 *   --drain-timeout), then closes the session and exits 0: a graceful agent restart loses nothing.
 */

const DOMAIN = 'drain.e2e.test';
/** The ingress's DRAIN_TIMEOUT_MS here: how long a released tunnel's requests may still run. */
const INGRESS_DRAIN_MS = 3_000;
let db: Awaited<ReturnType<typeof freshDatabase>>;
let cp: ControlPlaneProcess;
let a: IngressProcess;
let b: IngressProcess;
let key: string;
let tls: Awaited<ReturnType<typeof ensureLocalTls>>;
let upstreamUrl: string;
let upstreamServer: http.Server;
/** Paths the upstream has been asked for, in order. */
const seen: string[] = [];
const agents: AgentClient[] = [];

/**
 * `/slow/<ms>/<tag>`: the head and `first ` at once, `last` after <ms>; anything else: `ok <path>`.
 * Keep-alive, so the ingress's pool also holds idle streams when the tunnel goes away.
 */
async function startUpstream(): Promise<void> {
  upstreamServer = http.createServer((req, res) => {
    seen.push(req.url ?? '');
    const m = /^\/slow\/(\d+)\//.exec(req.url ?? '');
    if (!m) return void res.end(`ok ${req.url}`);
    res.writeHead(200, { 'content-type': 'text/plain' });
    res.write('first ');
    const t = setTimeout(() => res.end('last'), Number(m[1]));
    res.on('close', () => clearTimeout(t));
  });
  // An Upgrade: 101, then an echo of whatever comes.
  upstreamServer.on('upgrade', (req, socket: net.Socket) => {
    seen.push(req.url ?? '');
    socket.on('error', () => {});
    socket.write('HTTP/1.1 101 Switching Protocols\r\nupgrade: echo\r\nconnection: upgrade\r\n\r\n');
    socket.pipe(socket);
  });
  const port = await new Promise<number>((r) => upstreamServer.listen(0, '127.0.0.1', () => r((upstreamServer.address() as { port: number }).port)));
  upstreamUrl = `http://127.0.0.1:${port}`;
}

interface Answer {
  status: number;
  code: string;
  body: string;
  /** The response ended normally (false: the connection was cut under it). */
  complete: boolean;
  /** ms from the request to its end. */
  ms: number;
}

function request(port: number, host: string, p: string): Promise<Answer> {
  const t0 = performance.now();
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path: p, agent: false, headers: { host } }, (res) => {
      const chunks: Buffer[] = [];
      const done = (complete: boolean) => resolve({ status: res.statusCode ?? 0, code: String(res.headers['warren-error-code'] ?? ''), body: Buffer.concat(chunks).toString(), complete, ms: performance.now() - t0 });
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => done(true));
      res.on('aborted', () => done(false));
      res.on('error', () => done(false));
    });
    req.setTimeout(20_000, () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end();
  });
}

/** An upgraded connection to `host` through node `port`'s public listener, echoed by the upstream. */
function upgrade(port: number, host: string, p: string): Promise<{ socket: net.Socket; echo: (text: string) => Promise<string>; closed: Promise<number> }> {
  // `closed`: performance.now() when the connection closed.
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path: p, agent: false, headers: { host, connection: 'upgrade', upgrade: 'echo' } });
    req.on('upgrade', (_res, socket: net.Socket) => {
      socket.on('error', () => {});
      const closed = new Promise<number>((r) => socket.once('close', () => r(performance.now())));
      const echo = (text: string) =>
        new Promise<string>((res, rej) => {
          let got = '';
          const onData = (c: Buffer) => {
            got += c.toString();
            if (got.length >= text.length) {
              socket.off('data', onData);
              res(got);
            }
          };
          socket.on('data', onData);
          socket.once('close', () => rej(new Error(`closed before the echo of ${text}`)));
          socket.write(text);
        });
      resolve({ socket, echo, closed });
    });
    req.on('response', (res) => reject(new Error(`no upgrade: ${res.statusCode}`)));
    req.on('error', reject);
    req.end();
  });
}

/** Resolves once the upstream has received `path`. */
const reached = (path: string) => waitFor(`upstream saw ${path}`, () => seen.includes(path), 10_000);

beforeAll(async () => {
  db = await freshDatabase();
  const pool = createPool(db.url, 2);
  await migrate(pool);
  key = (await createAccountWithKey(createDb(pool), 'graceful-unbind')).token;
  await pool.end();
  tls = await ensureLocalTls(tempDir('warren-drain-tls-'));
  const nodeToken = randomBytes(16).toString('hex');
  cp = await startControlPlane({ databaseUrl: db.url, env: { WARREN_NODE_TOKEN: nodeToken } });
  const env = { TLS_CERT_FILE: tls.caFile.replace(/ca\.pem$/, 'cert.pem'), TLS_KEY_FILE: tls.caFile.replace(/ca\.pem$/, 'key.pem'), DRAIN_TIMEOUT_MS: String(INGRESS_DRAIN_MS) };
  [a, b] = (await Promise.all(['drain-a', 'drain-b'].map((nodeId) => startIngress({ nodeId, controlPlane: [`127.0.0.1:${cp.grpcPort}`], nodeToken, env })))) as [IngressProcess, IngressProcess];
  await startUpstream();
}, NODES_HOOK_MS);

afterAll(async () => {
  for (const c of agents) await c.close().catch(() => {});
  await Promise.allSettled([a, b, cp].map((p) => p?.stop({ timeoutMs: 10_000 })));
  upstreamServer?.close();
  upstreamServer?.closeAllConnections();
  await db?.drop();
  cleanupTempDirs();
}, 60_000);

async function credential(host: string): Promise<string> {
  const cred = await callApiExpecting(cp.baseUrl, key, 201, 'POST', '/credentials', { acl: [`bind:${host}`] });
  await nodesAtHead(db.url, [a, b]);
  return cred.token as string;
}

/** Both nodes route `host` to the tunnel (node b by a hop to node a). */
async function served(host: string): Promise<void> {
  for (const n of [a, b]) await waitFor(`${n.nodeId} serves ${host}`, async () => (await request(n.http, host, '/ping')).body === 'ok /ping', 20_000);
}

/** Our agent, in-process, with one tunnel on `host` (a credential of its own) served by both nodes. */
async function boundAgent(host: string) {
  const client = new AgentClient({ serverAddr: `localhost:${a.agent}`, authtoken: await credential(host), ca: tls.caPem!, reconnect: false });
  agents.push(client);
  await client.connect();
  const t = await client.bind({ domain: host, forwardsTo: upstreamUrl });
  await served(host);
  return { client, t };
}

describe('a tunnel unbound while it carries requests', () => {
  it('its requests finish, on its node and through a hop; new ones are no longer routed to it', async () => {
    const host = `unbind.${DOMAIN}`;
    const { client, t } = await boundAgent(host);

    const local = request(a.http, host, '/slow/1500/local');
    const hop = request(b.http, host, '/slow/1500/hop');
    await reached('/slow/1500/local');
    await reached('/slow/1500/hop');
    await client.unbind(t.id);
    // Out of routing at once on the node that held it.
    const after = await request(a.http, host, '/after-unbind');
    expect(after.status).not.toBe(200);
    expect(seen).not.toContain('/after-unbind');

    for (const r of [await local, await hop]) {
      expect(r).toMatchObject({ status: 200, body: 'first last', complete: true });
    }
  });

  it('the ingress cuts what still runs DRAIN_TIMEOUT_MS after the Unbind', async () => {
    const host = `deadline.${DOMAIN}`;
    const { client, t } = await boundAgent(host);

    const long = request(a.http, host, '/slow/15000/long');
    await reached('/slow/15000/long');
    const t0 = performance.now();
    await client.unbind(t.id);
    const r = await long;
    const cutAfter = performance.now() - t0;
    expect(r).toMatchObject({ status: 200, body: 'first ', complete: false });
    expect(cutAfter).toBeGreaterThan(INGRESS_DRAIN_MS - 500);
    expect(cutAfter).toBeLessThan(INGRESS_DRAIN_MS + 3_000);
  });
});

describe('upgraded connections (WebSocket, any Upgrade)', () => {
  it('a tunnel the server stops (narrowed ACL): its connections still run within DRAIN_TIMEOUT_MS, then are closed', async () => {
    const host = `ws-stop.${DOMAIN}`;
    const keep = `ws-keep.${DOMAIN}`;
    const cred = await callApiExpecting(cp.baseUrl, key, 201, 'POST', '/credentials', { acl: [`bind:${host}`, `bind:${keep}`] });
    await nodesAtHead(db.url, [a, b]);
    const client = new AgentClient({ serverAddr: `localhost:${a.agent}`, authtoken: cred.token as string, ca: tls.caPem!, reconnect: false });
    agents.push(client);
    await client.connect();
    await client.bind({ domain: host, forwardsTo: upstreamUrl });
    await client.bind({ domain: keep, forwardsTo: upstreamUrl });
    await served(host);
    await served(keep);
    const stopped = await upgrade(a.http, host, '/ws/stopped');
    const kept = await upgrade(a.http, keep, '/ws/kept');
    expect(await stopped.echo('one')).toBe('one');

    const t0 = performance.now();
    await callApiExpecting(cp.baseUrl, key, 200, 'PATCH', `/credentials/${cred.id as string}`, { acl: [`bind:${keep}`] });
    await waitFor(`${host} no longer routed`, async () => (await request(a.http, host, '/ping')).status !== 200, 10_000);
    expect(await stopped.echo('two')).toBe('two');
    // t0 is before the PATCH, so before the node stopped the tunnel: the close comes at least the drain after it.
    const closedAfter = (await stopped.closed) - t0;
    expect(closedAfter).toBeGreaterThan(INGRESS_DRAIN_MS);
    expect(closedAfter).toBeLessThan(INGRESS_DRAIN_MS + 3_000);
    // The tunnel still allowed, in the same session, keeps its connection.
    expect(await kept.echo('three')).toBe('three');
    kept.socket.destroy();
  });

  it("a tunnel its agent unbinds: its connections are the agent's to end, and outlive DRAIN_TIMEOUT_MS", async () => {
    const host = `ws-unbind.${DOMAIN}`;
    const { client, t } = await boundAgent(host);
    const conn = await upgrade(a.http, host, '/ws/unbound');
    expect(await conn.echo('one')).toBe('one');
    await client.unbind(t.id);
    await new Promise((r) => setTimeout(r, INGRESS_DRAIN_MS + 1_000));
    expect(await conn.echo('two')).toBe('two');
    conn.socket.destroy();
  });
});

describe('the official SDK (@ngrok/ngrok 1.7.0, unmodified)', () => {
  it('listener.close() (Unbind) while a request runs: the request finishes', async () => {
    const host = `sdk.${DOMAIN}`;
    const session = await new ngrok.SessionBuilder().serverAddr(`localhost:${a.agent}`).caCert(Buffer.from(tls.caPem!)).authtoken(await credential(host)).connect();
    try {
      const listener = await session.httpEndpoint().domain(host).listenAndForward(upstreamUrl);
      await served(host);
      const local = request(a.http, host, '/slow/1500/sdk-local');
      const hop = request(b.http, host, '/slow/1500/sdk-hop');
      await reached('/slow/1500/sdk-local');
      await reached('/slow/1500/sdk-hop');
      await listener.close();
      for (const r of [await local, await hop]) expect(r).toMatchObject({ status: 200, body: 'first last', complete: true });
    } finally {
      await session.close().catch(() => {});
    }
  });
});

// Each test starts an agent (up to AGENT_ONLINE_MS); the shutdown timings are the point and stay tight.
describe('warren-agent on SIGTERM', { timeout: AGENT_ONLINE_MS + WORK_MS }, () => {
  async function agentFor(host: string, extra: string[] = []) {
    const agent = startAgentProcess(['http', upstreamUrl, '--domain', host, '--server', `localhost:${a.agent}`, '--ca', tls.caFile, ...extra], { WARREN_AUTHTOKEN: await credential(host), LOG_LEVEL: 'warn' });
    await agent.waitForOutput(/tunnel tn_\w+ online/);
    await served(host);
    return agent;
  }

  it('lets the requests in progress finish, then exits 0 without waiting out the drain timeout', async () => {
    const host = `sigterm.${DOMAIN}`;
    const agent = await agentFor(host);
    const local = request(a.http, host, '/slow/1500/sigterm-local');
    const hop = request(b.http, host, '/slow/1500/sigterm-hop');
    await reached('/slow/1500/sigterm-local');
    await reached('/slow/1500/sigterm-hop');
    const t0 = performance.now();
    agent.child.kill('SIGTERM');
    const results = await Promise.all([local, hop]);
    const exit = await agent.exited;
    const exitedAfter = performance.now() - t0;
    for (const r of results) expect(r).toMatchObject({ status: 200, body: 'first last', complete: true });
    expect(exit).toEqual({ code: 0, signal: null });
    // Once the last request ended (the idle streams were closed by the ingress), not after 10 s.
    expect(exitedAfter).toBeLessThan(6_000);
    expect(agent.output()).toMatch(/warren-agent: waiting up to 10 s for \d+ connections? in progress to finish \(signal again to quit now\)\n/);
    expect(agent.output()).not.toMatch(/still open after the drain timeout/);
  });

  it('with nothing in progress (only idle kept-alive streams) exits at once and says nothing', async () => {
    const host = `idle.${DOMAIN}`;
    const agent = await agentFor(host);
    for (let i = 0; i < 3; i++) expect((await request(a.http, host, `/idle/${i}`)).body).toBe(`ok /idle/${i}`);
    const t0 = performance.now();
    agent.child.kill('SIGTERM');
    expect(await agent.exited).toEqual({ code: 0, signal: null });
    expect(performance.now() - t0).toBeLessThan(3_000);
    expect(agent.output()).not.toMatch(/waiting up to/);
  });

  it('--drain-timeout bounds the wait: what still runs is cut, and the agent exits 0', async () => {
    const host = `bounded.${DOMAIN}`;
    const agent = await agentFor(host, ['--drain-timeout', '1']);
    const long = request(a.http, host, '/slow/15000/bounded');
    await reached('/slow/15000/bounded');
    const t0 = performance.now();
    agent.child.kill('SIGTERM');
    const r = await long;
    const exit = await agent.exited;
    const exitedAfter = performance.now() - t0;
    expect(r).toMatchObject({ status: 200, body: 'first ', complete: false });
    expect(exit).toEqual({ code: 0, signal: null });
    expect(exitedAfter).toBeGreaterThan(800);
    expect(exitedAfter).toBeLessThan(INGRESS_DRAIN_MS + 2_000);
    expect(agent.output()).toMatch(/waiting up to 1 s for \d+ connections? in progress to finish/);
    expect(agent.output()).toMatch(/still open after the drain timeout/);
  });
});
