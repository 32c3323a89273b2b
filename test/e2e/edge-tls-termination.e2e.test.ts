import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import path from 'node:path';
import tls, { type TLSSocket } from 'node:tls';
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCertificate, type SelfSigned } from '@warren/shared';
import { freshDatabase } from '../support/databases.js';
import { startControlPlane, type ControlPlaneProcess } from '../support/processes.js';
import { callApiExpecting, cleanupTempDirs, startAgentProcess, startIngress, tempDir, waitFor, type AgentProcess, type IngressProcess } from '../support/cluster.js';
import { createDb, createPool } from '../../services/control-plane/src/db/pool.js';
import { migrate } from '../../services/control-plane/src/db/migrate.js';
import { createAccountWithKey } from '../../services/control-plane/src/modules/accounts/accounts.service.js';
import { ensureLocalTls } from '../../services/ingress/src/tls.js';
import { collect, type Res } from '../support/http-answer.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * An edge's TLS settings hold per request, not only per handshake: the ingress routes by Host,
 * while the handshake saw the SNI (which may name another hostname, or be absent, or the request
 * came over plain HTTP). Through real processes (control plane, ingress, our agent) configured by
 * the REST API: a `tls_termination` min_version 1.3 edge answers 421 ERR_WARREN_7113 to requests
 * over TLS 1.2 under another SNI and over plain HTTP, on normal and Upgrade requests alike, and is
 * served over TLS 1.3; an edge without tls_termination is unaffected; `mutual_tls` refuses
 * whatever context the handshake used.
 */

const V13_HOST = 'v13.tlsterm.e2e.test';
const PLAIN_HOST = 'plain.tlsterm.e2e.test';
const MTLS_HOST = 'mtls.tlsterm.e2e.test';
/** The SNI of the "other hostname" connections: the node certificate's own name, served by the default context. */
const OTHER_SNI = 'localhost';

let db: Awaited<ReturnType<typeof freshDatabase>>;
let cp: ControlPlaneProcess;
let node: IngressProcess;
let agent: AgentProcess;
let apiKey: string;
let ingressCa: string;
let upstream: http.Server;
let upstreamHits = 0;
const upgradedSockets = new Set<net.Socket>();
let webBackend: string;

const apiOk = (method: string, p: string, body: unknown, status: number) => callApiExpecting(cp.baseUrl, apiKey, status, method, p, body);



function httpGet(host: string, p: string): Promise<Res> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: node.http, path: p, agent: false, headers: { host } }, (res) => collect(res, resolve));
    req.setTimeout(10_000, () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end();
  });
}

interface TlsOpts {
  /** SNI; default the Host. */
  servername?: string;
  version?: 'TLSv1.2' | 'TLSv1.3';
  cert?: SelfSigned;
}

/** A GET over HTTPS with Host `host`, trusting the ingress CA. */
function httpsGet(host: string, p: string, o: TlsOpts = {}): Promise<Res> {
  return new Promise((resolve, reject) => {
    const req = https.request(
      {
        host: '127.0.0.1', port: node.https, path: p, servername: o.servername ?? host, ca: ingressCa, agent: false, headers: { host },
        minVersion: o.version, maxVersion: o.version, cert: o.cert?.certificatePem, key: o.cert?.privateKeyPem,
      },
      (res) => collect(res, resolve, (res.socket as TLSSocket).getProtocol()),
    );
    req.setTimeout(10_000, () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end();
  });
}

interface RawAnswer {
  statusLine: string;
  headers: Record<string, string>;
  body: string;
  /** The negotiated TLS version (TLS only). */
  protocol: string | null;
}

/**
 * A WebSocket-style Upgrade request written raw, over plain TCP or TLS at one version; reads until
 * the server closes, or until the upstream's `upgraded` greeting has arrived.
 */
function upgradeRequest(host: string, o: { tls?: TlsOpts } = {}): Promise<RawAnswer> {
  return new Promise((resolve, reject) => {
    const request =
      `GET /ws HTTP/1.1\r\nHost: ${host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n` +
      `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${randomBytes(16).toString('base64')}\r\n\r\n`;
    const t = o.tls;
    const s: net.Socket = t
      ? tls.connect({ host: '127.0.0.1', port: node.https, servername: t.servername ?? host, ca: ingressCa, minVersion: t.version, maxVersion: t.version }, () => s.write(request))
      : net.connect(node.http, '127.0.0.1', () => s.write(request));
    let buf = '';
    let protocol: string | null = null;
    if (t) s.once('secureConnect', () => (protocol = (s as TLSSocket).getProtocol()));
    const timer = setTimeout(() => s.destroy(new Error(`no complete answer within 10 s: ${JSON.stringify(buf)}`)), 10_000);
    const finish = () => {
      clearTimeout(timer);
      const end = buf.indexOf('\r\n\r\n');
      const head = (end === -1 ? buf : buf.slice(0, end)).split('\r\n');
      const headers: Record<string, string> = {};
      for (const line of head.slice(1)) {
        const i = line.indexOf(':');
        if (i > 0) headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
      }
      resolve({ statusLine: head[0] ?? '', headers, body: end === -1 ? '' : buf.slice(end + 4), protocol });
    };
    s.on('data', (c: Buffer) => {
      buf += c.toString();
      if (buf.startsWith('HTTP/1.1 101') && buf.includes('upgraded')) s.destroy();
    });
    s.on('close', finish);
    s.on('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
  });
}

async function edge(hostname: string): Promise<string> {
  return (await apiOk('POST', '/edges/https', { hostports: [`${hostname}:443`] }, 201)).id;
}

async function route(edgeId: string, match: string): Promise<string> {
  return (await apiOk('POST', `/edges/https/${edgeId}/routes`, { match_type: 'path_prefix', match, backend: { enabled: true, backend_id: webBackend } }, 201)).id;
}

/** Waits until the node answers `host` + `p` from the upstream (over TLS 1.3 with SNI = host). */
async function served(host: string, p: string): Promise<void> {
  await waitFor(`${node.nodeId} serves ${host}${p}`, async () => (await httpsGet(host, p, { version: 'TLSv1.3' })).headers['x-upstream'] === 'yes', 20_000);
}

beforeAll(async () => {
  db = await freshDatabase();
  const pool = createPool(db.url, 2);
  await migrate(pool);
  apiKey = (await createAccountWithKey(createDb(pool), 'edge-tls-termination-e2e')).token;
  await pool.end();
  const tlsDir = tempDir('warren-edge-tlsterm-');
  const material = await ensureLocalTls(tlsDir, [V13_HOST, PLAIN_HOST, MTLS_HOST]);
  ingressCa = material.caPem!;
  const nodeToken = randomBytes(16).toString('hex');
  cp = await startControlPlane({ databaseUrl: db.url, env: { WARREN_NODE_TOKEN: nodeToken } });
  node = await startIngress({
    nodeId: 'edge-tlsterm',
    controlPlane: [`127.0.0.1:${cp.grpcPort}`],
    nodeToken,
    env: { TLS_CERT_FILE: path.join(tlsDir, 'cert.pem'), TLS_KEY_FILE: path.join(tlsDir, 'key.pem') },
  });

  upstream = http.createServer((req, res) => {
    upstreamHits++;
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json', 'x-upstream': 'yes' });
      res.end(JSON.stringify({ url: req.url, host: req.headers.host }));
    });
  });
  // Any upgrade is accepted: a 101, a greeting, then the connection stays open until the client goes.
  upstream.on('upgrade', (_req, socket: net.Socket) => {
    upstreamHits++;
    upgradedSockets.add(socket);
    socket.on('close', () => upgradedSockets.delete(socket));
    socket.on('error', () => socket.destroy());
    socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nupgraded');
  });
  const upPort = await new Promise<number>((r) => upstream.listen(0, '127.0.0.1', () => r((upstream.address() as net.AddressInfo).port)));

  const cred = await apiOk('POST', '/credentials', {}, 201);
  webBackend = (await apiOk('POST', '/backends/tunnel_group', { labels: { app: 'web' } }, 201)).id;
  agent = startAgentProcess(['http', `http://127.0.0.1:${upPort}`, '--label', 'app=web', '--authtoken', cred.token, '--server', `localhost:${node.agent}`, '--ca', material.caFile]);
  await agent.waitForOutput('online');

  const v13 = await edge(V13_HOST);
  await route(v13, '/');
  const put = await apiOk('PUT', `/edges/https/${v13}/tls_termination`, { min_version: '1.3' }, 200);
  expect([put.enabled, put.terminate_at, put.min_version]).toEqual([true, 'edge', '1.3']);
  const plain = await edge(PLAIN_HOST);
  await route(plain, '/');
  // Config snapshots apply in order: a route added after the PUT being served means the PUT is in effect.
  await route(v13, '/after-tls');
  await served(V13_HOST, '/after-tls');
  await served(PLAIN_HOST, '/');
}, CLUSTER_HOOK_MS);

afterAll(async () => {
  await Promise.allSettled([agent?.stop({ timeoutMs: 10_000 }), node?.stop({ timeoutMs: 10_000 }), cp?.stop({ timeoutMs: 10_000 })]);
  for (const s of upgradedSockets) s.destroy();
  if (upstream) {
    upstream.closeAllConnections();
    await new Promise((r) => upstream.close(r));
  }
  await db?.drop();
  cleanupTempDirs();
}, 60_000);

/** A refusal of tls_termination: 421 ERR_WARREN_7113 naming the edge's minimum version. */
function expectMisdirected(status: number, code: string | undefined, body: string, via: string): void {
  expect([status, code], `${via}: ${body}`).toEqual([421, 'ERR_WARREN_7113']);
  const parsed = JSON.parse(body) as { error_code: string; status_code: number; msg: string };
  expect([parsed.error_code, parsed.status_code]).toEqual(['ERR_WARREN_7113', 421]);
  expect(parsed.msg, via).toMatch(/requires TLS 1\.3 or newer \(tls_termination min_version 1\.3\)/);
}

describe('tls_termination min_version 1.3, per request', () => {
  it('still fails the handshake of TLS 1.2 when the SNI names the edge', async () => {
    const outcome = await httpsGet(V13_HOST, '/sni', { version: 'TLSv1.2' }).then(
      (r) => `handshake succeeded with ${r.protocol} and answered ${r.status}`,
      (err: Error & { code?: string }) => `failed: ${err.code ?? ''} ${err.message}`,
    );
    expect(outcome).toMatch(/^failed: .*(protocol.version|PROTOCOL_VERSION|unsupported protocol|ECONNRESET|socket hang up)/i);
  });

  it('refuses TLS 1.2 under another SNI (Host names the edge) with 421', async () => {
    const before = upstreamHits;
    const r = await httpsGet(V13_HOST, '/other-sni', { servername: OTHER_SNI, version: 'TLSv1.2' });
    expect(r.protocol).toBe('TLSv1.2');
    expectMisdirected(r.status, r.headers['warren-error-code'] as string | undefined, r.text, 'TLS 1.2, SNI localhost');
    expect(JSON.parse(r.text).msg).toMatch(/came over TLSv1\.2/);
    expect(r.headers['x-upstream']).toBeUndefined();
    // The client is to retry on a new connection: this one is not kept.
    expect(r.headers.connection).toBe('close');
    expect(upstreamHits).toBe(before);
  });

  it('refuses plain HTTP with 421', async () => {
    const before = upstreamHits;
    const r = await httpGet(V13_HOST, '/plain');
    expectMisdirected(r.status, r.headers['warren-error-code'] as string | undefined, r.text, 'plain HTTP');
    expect(JSON.parse(r.text).msg).toMatch(/came over plain HTTP/);
    expect(upstreamHits).toBe(before);
  });

  it('serves TLS 1.3, with the SNI naming the edge or another hostname', async () => {
    for (const servername of [V13_HOST, OTHER_SNI]) {
      const r = await httpsGet(V13_HOST, '/v13', { servername, version: 'TLSv1.3' });
      expect([r.status, r.protocol, r.headers['x-upstream']], `${servername}: ${r.text}`).toEqual([200, 'TLSv1.3', 'yes']);
      expect(JSON.parse(r.text)).toEqual({ url: '/v13', host: V13_HOST });
    }
  });

  it('refuses an Upgrade over TLS 1.2 under another SNI and over plain HTTP the same way', async () => {
    const before = upstreamHits;
    for (const [via, opts] of [
      ['TLS 1.2, SNI localhost', { tls: { servername: OTHER_SNI, version: 'TLSv1.2' as const } }],
      ['plain HTTP', {}],
    ] as const) {
      const a = await upgradeRequest(V13_HOST, opts);
      expect(a.statusLine, `${via}: ${a.body}`).toBe('HTTP/1.1 421 Misdirected Request');
      expectMisdirected(421, a.headers['warren-error-code'], a.body.trim(), via);
      expect(a.headers.connection).toBe('close');
    }
    expect(upstreamHits).toBe(before);
  });

  it('passes an Upgrade over TLS 1.3 through to the upstream', async () => {
    const a = await upgradeRequest(V13_HOST, { tls: { servername: OTHER_SNI, version: 'TLSv1.3' } });
    expect(a.protocol).toBe('TLSv1.3');
    expect(a.statusLine, a.body).toBe('HTTP/1.1 101 Switching Protocols');
    expect(a.body).toBe('upgraded');
  });
});

describe('an edge without tls_termination', () => {
  it('is served as before: plain HTTP, TLS 1.2 under any SNI, TLS 1.3', async () => {
    const plain = await httpGet(PLAIN_HOST, '/p');
    expect([plain.status, plain.headers['x-upstream']], plain.text).toEqual([200, 'yes']);
    for (const servername of [PLAIN_HOST, OTHER_SNI]) {
      for (const version of ['TLSv1.2', 'TLSv1.3'] as const) {
        const r = await httpsGet(PLAIN_HOST, `/${version}`, { servername, version });
        expect([r.status, r.protocol], `${servername} ${version}: ${r.text}`).toEqual([200, version]);
      }
    }
  });

  it('still takes Upgrades over plain HTTP', async () => {
    const a = await upgradeRequest(PLAIN_HOST);
    expect(a.statusLine, a.body).toBe('HTTP/1.1 101 Switching Protocols');
  });

  it('refuses an absolute-form target naming another edge (400), and sends its own in origin form', async () => {
    // Over TLS 1.2 to this edge, a target naming the 1.3 edge: an upstream routing by the target's
    // authority (RFC 9112 §3.2.2) would have served it past that edge's minimum.
    const before = upstreamHits;
    const other = await httpsGet(PLAIN_HOST, `https://${V13_HOST}/secret`, { version: 'TLSv1.2' });
    expect([other.status, other.headers['warren-error-code']], other.text).toEqual([400, 'ERR_WARREN_7011']);
    expect(upstreamHits).toBe(before);
    const own = await httpsGet(PLAIN_HOST, `https://${PLAIN_HOST}/a/../own?q=1`, { version: 'TLSv1.2' });
    // In origin form, with its path normalised (dot segments removed) like any request's.
    expect([own.status, JSON.parse(own.text).url], own.text).toEqual([200, '/own?q=1']);
  });
});

describe('mutual_tls when the SNI names another hostname', () => {
  let good: SelfSigned;
  let foreign: SelfSigned;

  beforeAll(async () => {
    const ca = await createCertificate({ commonName: 'tlsterm e2e client CA', days: 1, ca: true, keyType: 'ec' });
    good = await createCertificate({ commonName: 'client', days: 1, issuer: ca, keyType: 'ec', dnsNames: ['client.test'] });
    const otherCa = await createCertificate({ commonName: 'tlsterm e2e other CA', days: 1, ca: true, keyType: 'ec' });
    foreign = await createCertificate({ commonName: 'client', days: 1, issuer: otherCa, keyType: 'ec', dnsNames: ['client.test'] });
    const caId = (await apiOk('POST', '/certificate_authorities', { ca_pem: ca.certificatePem }, 201)).id;
    const id = await edge(MTLS_HOST);
    await route(id, '/');
    await apiOk('PUT', `/edges/https/${id}/mutual_tls`, { certificate_authority_ids: [caId] }, 200);
    await waitFor('mutual TLS is enforced', async () => (await httpsGet(MTLS_HOST, '/probe')).headers['warren-error-code'] === 'ERR_WARREN_7104', 20_000);
  }, 30_000);

  it('refuses no certificate and a foreign one (403), lets the edge CA through, over TLS 1.2 and 1.3', async () => {
    for (const version of ['TLSv1.2', 'TLSv1.3'] as const) {
      const none = await httpsGet(MTLS_HOST, '/none', { servername: OTHER_SNI, version });
      expect([none.status, none.headers['warren-error-code']], none.text).toEqual([403, 'ERR_WARREN_7104']);
      const bad = await httpsGet(MTLS_HOST, '/foreign', { servername: OTHER_SNI, version, cert: foreign });
      expect([bad.status, bad.headers['warren-error-code']], bad.text).toEqual([403, 'ERR_WARREN_7104']);
      const ok = await httpsGet(MTLS_HOST, '/ok', { servername: OTHER_SNI, version, cert: good });
      expect([ok.status, ok.protocol, ok.headers['x-upstream']], ok.text).toEqual([200, version, 'yes']);
    }
  });

  it('refuses an Upgrade without a certificate under another SNI, and over plain HTTP', async () => {
    const overTls = await upgradeRequest(MTLS_HOST, { tls: { servername: OTHER_SNI, version: 'TLSv1.2' } });
    expect(overTls.statusLine, overTls.body).toMatch(/^HTTP\/1\.1 403 /);
    const plain = await upgradeRequest(MTLS_HOST);
    expect(plain.statusLine, plain.body).toMatch(/^HTTP\/1\.1 403 /);
  });
});
