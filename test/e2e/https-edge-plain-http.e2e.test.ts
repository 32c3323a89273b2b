import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freshDatabase } from '../support/databases.js';
import { startControlPlane, type ControlPlaneProcess } from '../support/processes.js';
import { callApiExpecting, cleanupTempDirs, startAgentProcess, startIngress, tempDir, waitFor, type AgentProcess, type IngressProcess } from '../support/cluster.js';
import { acceptFor, openWebSocket } from '../support/websocket-client.js';
import { createDb, createPool } from '../../services/control-plane/src/db/pool.js';
import { migrate } from '../../services/control-plane/src/db/migrate.js';
import { createAccountWithKey } from '../../services/control-plane/src/modules/accounts/accounts.service.js';
import { ensureLocalTls } from '../../services/ingress/src/tls.js';
import { collect, type Res } from '../support/http-answer.js';
import { CLUSTER_HOOK_MS, WORK_MS } from '../support/timeouts.js';

/**
 * HTTPS edges are not served in cleartext on the plain-HTTP listener (HTTPS_EDGES_ON_HTTP), through
 * real processes configured by the REST API: a control plane, our agent (a labeled tunnel for the
 * edges and an `http` Bind endpoint) and four ingress nodes, the agents on the first:
 *   - `redirect`: the default (the harness's `serve` taken away), HTTPS_PORT picked by the kernel,
 *     so the Location carries that port;
 *   - `redirect443`: the default with PUBLIC_HTTPS_PORT=443 (the Location without a port);
 *   - `refuse`: 421 ERR_WARREN_7114;
 *   - `serve`: the test harness's setting, cleartext as before.
 * Hosts without an edge and Bind endpoints are unchanged; an edge with tls_termination is redirected too.
 */

const EDGE_HOST = 'app.plainhttp.e2e.test';
const TLS13_HOST = 'v13.plainhttp.e2e.test';
const BIND_HOST = 'bind.plainhttp.e2e.test';
const NO_EDGE_HOST = 'nothing.plainhttp.e2e.test';

let db: Awaited<ReturnType<typeof freshDatabase>>;
let cp: ControlPlaneProcess;
let redirect: IngressProcess;
let redirect443: IngressProcess;
let refuse: IngressProcess;
let serve: IngressProcess;
let nodes: IngressProcess[];
const agents: AgentProcess[] = [];
let apiKey: string;
let ingressCa: string;
let upstream: http.Server;
let upstreamHits = 0;
const upgradedSockets = new Set<net.Socket>();

const apiOk = (method: string, p: string, body: unknown, status: number) => callApiExpecting(cp.baseUrl, apiKey, status, method, p, body);



/** A request over plain HTTP to the node's public HTTP port with Host `host` (redirects are not followed). */
function plain(n: IngressProcess, host: string, p: string, o: { method?: string; body?: string } = {}): Promise<Res> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: n.http, path: p, method: o.method ?? 'GET', agent: false, headers: { host } }, (res) => collect(res, resolve));
    req.setTimeout(10_000, () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end(o.body);
  });
}

/** A GET over HTTPS to the node's public HTTPS port, SNI and Host `host`, trusting the ingress CA. */
function secure(n: IngressProcess, host: string, p: string): Promise<Res> {
  return new Promise((resolve, reject) => {
    const req = https.request({ host: '127.0.0.1', port: n.https, path: p, servername: host, ca: ingressCa, agent: false, headers: { host } }, (res) => collect(res, resolve));
    req.setTimeout(10_000, () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end();
  });
}

beforeAll(async () => {
  db = await freshDatabase();
  const pool = createPool(db.url, 2);
  await migrate(pool);
  apiKey = (await createAccountWithKey(createDb(pool), 'https-edge-plain-http-e2e')).token;
  await pool.end();
  const tlsDir = tempDir('warren-plainhttp-');
  const material = await ensureLocalTls(tlsDir, [EDGE_HOST, TLS13_HOST, BIND_HOST]);
  ingressCa = material.caPem!;
  const nodeToken = randomBytes(16).toString('hex');
  cp = await startControlPlane({ databaseUrl: db.url, env: { WARREN_NODE_TOKEN: nodeToken } });
  const tlsEnv = { TLS_CERT_FILE: path.join(tlsDir, 'cert.pem'), TLS_KEY_FILE: path.join(tlsDir, 'key.pem') };
  const start = (nodeId: string, env: Record<string, string | undefined>) => startIngress({ nodeId, controlPlane: [`127.0.0.1:${cp.grpcPort}`], nodeToken, env: { ...tlsEnv, ...env } });
  [redirect, redirect443, refuse, serve] = await Promise.all([
    // No HTTPS_EDGES_ON_HTTP at all: the ingress's own default.
    start('plainhttp-redirect', { HTTPS_EDGES_ON_HTTP: undefined }),
    start('plainhttp-redirect443', { HTTPS_EDGES_ON_HTTP: undefined, PUBLIC_HTTPS_PORT: '443' }),
    start('plainhttp-refuse', { HTTPS_EDGES_ON_HTTP: 'refuse' }),
    start('plainhttp-serve', {}),
  ]);
  nodes = [redirect, redirect443, refuse, serve];

  upstream = http.createServer((req, res) => {
    upstreamHits++;
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json', 'x-upstream': 'yes' });
      res.end(JSON.stringify({ url: req.url, host: req.headers.host, method: req.method }));
    });
  });
  // A WebSocket handshake is accepted; the connection then stays open until the client goes.
  upstream.on('upgrade', (req: http.IncomingMessage, socket: net.Socket) => {
    upstreamHits++;
    upgradedSockets.add(socket);
    socket.on('close', () => upgradedSockets.delete(socket));
    socket.on('error', () => socket.destroy());
    socket.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${acceptFor(String(req.headers['sec-websocket-key']))}\r\n\r\n`);
  });
  const upPort = await new Promise<number>((r) => upstream.listen(0, '127.0.0.1', () => r((upstream.address() as net.AddressInfo).port)));

  const cred = await apiOk('POST', '/credentials', {}, 201);
  const backend = (await apiOk('POST', '/backends/tunnel_group', { labels: { app: 'web' } }, 201)).id;
  const common = ['--authtoken', cred.token, '--server', `localhost:${redirect.agent}`, '--ca', material.caFile];
  agents.push(startAgentProcess(['http', `http://127.0.0.1:${upPort}`, '--label', 'app=web', ...common]));
  // A Bind endpoint whose agent asked for an http:// URL: not an edge, served on plain HTTP as before.
  agents.push(startAgentProcess(['http', `http://127.0.0.1:${upPort}`, '--domain', BIND_HOST, '--scheme', 'http', ...common]));
  await Promise.all(agents.map((p) => p.waitForOutput('online')));

  for (const host of [EDGE_HOST, TLS13_HOST]) {
    const edge = (await apiOk('POST', '/edges/https', { hostports: [`${host}:443`] }, 201)).id;
    if (host === TLS13_HOST) await apiOk('PUT', `/edges/https/${edge}/tls_termination`, { min_version: '1.3' }, 200);
    await apiOk('POST', `/edges/https/${edge}/routes`, { match_type: 'path_prefix', match: '/', backend: { enabled: true, backend_id: backend } }, 201);
  }
  for (const n of nodes) {
    for (const host of [EDGE_HOST, TLS13_HOST]) {
      await waitFor(`${n.nodeId} serves ${host} over HTTPS`, async () => (await secure(n, host, '/ready')).headers['x-upstream'] === 'yes', 20_000);
    }
  }
}, CLUSTER_HOOK_MS + 2 * WORK_MS); // and eight waits of up to 20 s for the nodes to serve

afterAll(async () => {
  await Promise.allSettled([...agents.map((p) => p.stop({ timeoutMs: 10_000 })), ...(nodes ?? []).map((n) => n.stop({ timeoutMs: 10_000 })), cp?.stop({ timeoutMs: 10_000 })]);
  for (const s of upgradedSockets) s.destroy();
  await new Promise((r) => (upstream ? upstream.close(r) : r(undefined)));
  await db?.drop();
  cleanupTempDirs();
}, 60_000);

describe('HTTPS_EDGES_ON_HTTP=redirect (the default)', () => {
  it('answers a plain-HTTP GET to an HTTPS edge with a 308 to https:// on the HTTPS port, path and query kept, without reaching the upstream', async () => {
    const before = upstreamHits;
    const r = await plain(redirect, EDGE_HOST, '/a/b?x=1&y=two');
    expect(r.status, r.text).toBe(308);
    expect(r.headers.location).toBe(`https://${EDGE_HOST}:${redirect.https}/a/b?x=1&y=two`);
    expect(r.text).toContain(r.headers.location);
    expect(r.headers['x-upstream']).toBeUndefined();
    expect(r.headers['warren-error-code']).toBeUndefined();
    // The port of the Host is the plain listener's: it is not carried over.
    const withPort = await plain(redirect, `${EDGE_HOST.toUpperCase()}:${redirect.http}`, '/p');
    expect([withPort.status, withPort.headers.location]).toEqual([308, `https://${EDGE_HOST}:${redirect.https}/p`]);
    expect(upstreamHits).toBe(before);
  });

  it('serves the same URL over HTTPS (200 from the upstream)', async () => {
    const r = await secure(redirect, EDGE_HOST, '/a/b?x=1&y=two');
    expect(r.status, r.text).toBe(200);
    expect(r.headers['x-upstream']).toBe('yes');
    expect(JSON.parse(r.text).url).toBe('/a/b?x=1&y=two');
  });

  it('leaves the port out when PUBLIC_HTTPS_PORT is 443', async () => {
    const r = await plain(redirect443, EDGE_HOST, '/x?y=1');
    expect([r.status, r.headers.location]).toEqual([308, `https://${EDGE_HOST}/x?y=1`]);
  });

  it('redirects HEAD (no body) and POST (308 keeps the method) alike', async () => {
    const before = upstreamHits;
    const head = await plain(redirect, EDGE_HOST, '/h', { method: 'HEAD' });
    expect([head.status, head.headers.location, head.text]).toEqual([308, `https://${EDGE_HOST}:${redirect.https}/h`, '']);
    const post = await plain(redirect, EDGE_HOST, '/form?a=1', { method: 'POST', body: 'secret=1' });
    expect([post.status, post.headers.location]).toEqual([308, `https://${EDGE_HOST}:${redirect.https}/form?a=1`]);
    expect(upstreamHits).toBe(before);
  });

  it('refuses a WebSocket Upgrade over plain HTTP with 421 ERR_WARREN_7114 naming the https URL; over TLS it is carried', async () => {
    const before = upstreamHits;
    const refused = await openWebSocket({ port: redirect.http, host: EDGE_HOST, path: '/ws' });
    expect(refused.client).toBeNull();
    expect(refused.handshake.status, refused.handshake.body).toBe(421);
    expect(refused.handshake.headers['warren-error-code']).toBe('ERR_WARREN_7114');
    expect(refused.handshake.headers.connection).toBe('close');
    expect(JSON.parse(refused.handshake.body).msg).toContain(`https://${EDGE_HOST}:${redirect.https}/ws`);
    expect(upstreamHits).toBe(before);
    const ok = await openWebSocket({ port: redirect.https, host: EDGE_HOST, path: '/ws', tls: { ca: ingressCa } });
    ok.client?.destroy();
    expect(ok.handshake.status, ok.handshake.body).toBe(101);
  });

  it('redirects an edge with tls_termination too (the redirect meets its minimum)', async () => {
    const r = await plain(redirect, TLS13_HOST, '/x?y=1');
    expect([r.status, r.headers.location], r.text).toEqual([308, `https://${TLS13_HOST}:${redirect.https}/x?y=1`]);
  });

  it('serves a Bind endpoint (an agent asking for an http:// URL) over plain HTTP as before', async () => {
    const r = await waitFor(`${redirect.nodeId} serves ${BIND_HOST}`, async () => {
      const res = await plain(redirect, BIND_HOST, '/bound?q=1');
      return res.status === 200 ? res : null;
    });
    expect(r.headers['x-upstream']).toBe('yes');
    expect(JSON.parse(r.text).url).toBe('/bound?q=1');
  });
});

describe('HTTPS_EDGES_ON_HTTP=refuse', () => {
  it('answers 421 ERR_WARREN_7114 over plain HTTP and closes the connection; HTTPS is served', async () => {
    const before = upstreamHits;
    const r = await plain(refuse, EDGE_HOST, '/a?b=1');
    expect([r.status, r.headers['warren-error-code']], r.text).toEqual([421, 'ERR_WARREN_7114']);
    expect(r.headers.location).toBeUndefined();
    expect(r.headers.connection).toBe('close');
    expect(JSON.parse(r.text)).toMatchObject({ error_code: 'ERR_WARREN_7114', status_code: 421 });
    expect(JSON.parse(r.text).msg).toContain(`https://${EDGE_HOST}:${refuse.https}/a?b=1`);
    const ws = await openWebSocket({ port: refuse.http, host: EDGE_HOST });
    expect([ws.client, ws.handshake.status, ws.handshake.headers['warren-error-code']]).toEqual([null, 421, 'ERR_WARREN_7114']);
    expect(upstreamHits).toBe(before);
    const s = await secure(refuse, EDGE_HOST, '/a?b=1');
    expect([s.status, s.headers['x-upstream']]).toEqual([200, 'yes']);
  });
});

describe('HTTPS_EDGES_ON_HTTP=serve (the test harness)', () => {
  it('serves an HTTPS edge over plain HTTP, Upgrades included', async () => {
    const r = await plain(serve, EDGE_HOST, '/a?b=1');
    expect([r.status, r.headers['x-upstream']], r.text).toEqual([200, 'yes']);
    expect(JSON.parse(r.text).url).toBe('/a?b=1');
    const ws = await openWebSocket({ port: serve.http, host: EDGE_HOST });
    ws.client?.destroy();
    expect(ws.handshake.status, ws.handshake.body).toBe(101);
  });
});

describe('a Host without an edge', () => {
  it('gets the same 404 ERR_WARREN_7000 on every node, never a redirect', async () => {
    for (const n of nodes) {
      const r = await plain(n, NO_EDGE_HOST, '/x');
      expect([n.nodeId, r.status, r.headers['warren-error-code'], r.headers.location], r.text).toEqual([n.nodeId, 404, 'ERR_WARREN_7000', undefined]);
      const ws = await openWebSocket({ port: n.http, host: NO_EDGE_HOST });
      expect([n.nodeId, ws.handshake.status, ws.handshake.headers['warren-error-code']]).toEqual([n.nodeId, 404, 'ERR_WARREN_7000']);
    }
  });
});
