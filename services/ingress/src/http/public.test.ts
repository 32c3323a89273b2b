import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import tls, { type TLSSocket } from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCertificate, createLogger, type DataPlaneConfig, type DpEdge, type DpRoute, type SelfSigned } from '@warren/shared';
import { createIngressMetrics } from '../metrics.js';
import { TunnelRegistry } from '../tunnels/registry.js';
import { tcpTunnel } from '../tunnels/testing.js';
import { listen } from './testing.js';
import { Forwarder } from './proxy.js';
import { PublicHandler } from './public.js';
import { RoutingTable } from './routing.js';
import { createPipelineCompiler } from '../pipeline/runner.js';
import type { StageFactory } from '../pipeline/types.js';
import { mutualTlsStage } from '../modules/index.js';
import { collect, type Res } from '../../../../test/support/http-answer.js';

/**
 * The per-request checks of an edge's TLS settings in the public handler, through real sockets:
 * an HTTPS listener with one default context (as when the SNI names another hostname than Host,
 * or none) and the plain-HTTP listener. `tls_termination`'s minimum version must hold for every
 * request routed to its edge (421 ERR_WARREN_7113 otherwise); `mutual_tls` must refuse whatever
 * context the handshake used.
 */
const log = createLogger('test', 'silent');

const V13 = 'v13.test';
const V12 = 'v12.test';
const PLAIN = 'plain.test';
const OFF = 'off.test';
const PIPE = 'pipe.test';
const MTLS = 'mtls.test';

const edge = (id: string, host: string, extra: Partial<DpEdge> = {}): DpEdge => ({ id, accountId: 'ac_1', hostports: [`${host}:443`], mutualTls: null, tlsTermination: null, ...extra });
const route = (id: string, edgeId: string): DpRoute => ({ id, accountId: 'ac_1', edgeId, matchType: 'path_prefix', match: '/', modules: {}, backendId: 'bkdtg_up', ipPolicyIds: [], trafficPolicy: null });

let serverCert: SelfSigned;
let clientCa: SelfSigned;
let goodClient: SelfSigned;
let foreignClient: SelfSigned;
let httpPort = 0;
let httpsPort = 0;
let upstreamRequests = 0;
let stageRuns = 0;
const closers: Array<() => void> = [];




function httpGet(host: string, p = '/'): Promise<Res> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: httpPort, path: p, agent: false, headers: { host } }, (res) => collect(res, resolve));
    req.on('error', reject);
    req.end();
  });
}

/** A GET over HTTPS with Host `host` and SNI `localhost` (the default context serves it). */
function httpsGet(host: string, o: { version?: 'TLSv1.2' | 'TLSv1.3'; cert?: SelfSigned } = {}): Promise<Res> {
  return new Promise((resolve, reject) => {
    const req = https.request(
      {
        host: '127.0.0.1', port: httpsPort, path: '/', servername: 'localhost', rejectUnauthorized: false, agent: false, headers: { host },
        minVersion: o.version, maxVersion: o.version, cert: o.cert?.certificatePem, key: o.cert?.privateKeyPem,
      },
      (res) => collect(res, resolve, (res.socket as TLSSocket).getProtocol()),
    );
    req.on('error', reject);
    req.end();
  });
}

/** An Upgrade request written raw; resolves with everything read until the server closes (or `until` shows up). */
function upgrade(host: string, o: { tls?: 'TLSv1.2' | 'TLSv1.3'; until?: string } = {}): Promise<string> {
  return new Promise((resolve, reject) => {
    const request = `GET /ws HTTP/1.1\r\nHost: ${host}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n`;
    const s: net.Socket = o.tls
      ? tls.connect({ host: '127.0.0.1', port: httpsPort, servername: 'localhost', rejectUnauthorized: false, minVersion: o.tls, maxVersion: o.tls }, () => s.write(request))
      : net.connect(httpPort, '127.0.0.1', () => s.write(request));
    let buf = '';
    const timer = setTimeout(() => s.destroy(new Error(`no answer: ${JSON.stringify(buf)}`)), 10_000);
    s.on('data', (c: Buffer) => {
      buf += c.toString();
      if (o.until && buf.includes(o.until)) s.end();
    });
    s.on('close', () => {
      clearTimeout(timer);
      resolve(buf);
    });
    s.on('error', reject);
  });
}

beforeAll(async () => {
  serverCert = await createCertificate({ commonName: 'localhost', days: 1, keyType: 'ec', dnsNames: ['localhost'] });
  clientCa = await createCertificate({ commonName: 'unit client CA', days: 1, ca: true, keyType: 'ec' });
  goodClient = await createCertificate({ commonName: 'client', days: 1, issuer: clientCa, keyType: 'ec', dnsNames: ['client.test'] });
  const otherCa = await createCertificate({ commonName: 'unit other CA', days: 1, ca: true, keyType: 'ec' });
  foreignClient = await createCertificate({ commonName: 'client', days: 1, issuer: otherCa, keyType: 'ec', dnsNames: ['client.test'] });

  const edges = [
    edge('edghts_v13', V13, { tlsTermination: { enabled: true, minVersion: '1.3' } }),
    edge('edghts_v12', V12, { tlsTermination: { enabled: true, minVersion: null } }),
    edge('edghts_plain', PLAIN),
    edge('edghts_off', OFF, { tlsTermination: { enabled: false, minVersion: '1.3' } }),
    edge('edghts_pipe', PIPE, { tlsTermination: { enabled: true, minVersion: '1.3' } }),
    edge('edghts_mtls', MTLS, { mutualTls: { enabled: true, certificateAuthorityIds: ['ca_1'] } }),
  ];
  const cfg: DataPlaneConfig = {
    version: 1,
    edges: new Map(edges.map((e) => [e.id, e])),
    routes: new Map(edges.map((e) => [`r_${e.id}`, route(`r_${e.id}`, e.id)])),
    backends: new Map([['bkdtg_up', { id: 'bkdtg_up', accountId: 'ac_1', labels: { app: 'up' } }]]),
    ipPolicies: new Map(),
    certificateAuthorities: new Map([['ca_1', { id: 'ca_1', accountId: 'ac_1', caPem: clientCa.certificatePem }]]),
    credentials: new Map(),
    credentialsByTokenHash: new Map(),
    eventSubscriptions: new Map(),
  };

  const upstream = http.createServer((req, res) => {
    upstreamRequests++;
    req.resume();
    res.writeHead(200, { 'x-upstream': 'yes' });
    res.end(req.headers.host);
  });
  upstream.on('upgrade', (_req, socket: net.Socket) => {
    upstreamRequests++;
    socket.end('HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\nupgraded');
  });
  const upstreamPort = await listen(upstream);

  const registry = new TunnelRegistry('node-t');
  const metrics = createIngressMetrics('node-t');
  const forwarder = new Forwarder({ registry, hopToken: 'secret', log, upstreamTimeoutMs: 5000, maxStreamsPerTunnel: 8, maxQueuedPerTunnel: 100 });
  registry.addLocal(tcpTunnel('tn_up', { app: 'up' }, () => upstreamPort));
  // As main.ts: the edge's mutual TLS first; plus a counting stage on the pipe.test edge.
  const counting: StageFactory = (_route, e) => (e.id === 'edghts_pipe' ? { name: 'count', onRequest: () => (stageRuns++, null) } : null);
  const compile = createPipelineCompiler([(_route, e, config) => mutualTlsStage(e, config), counting], { limiter: { hit: async () => ({ limited: false, retryAfterSeconds: 0 }) }, log, registry: metrics.registry });
  const handler = new PublicHandler({ registry, forwarder, metrics, log });
  handler.setTable(new RoutingTable(cfg, compile));

  const pub = http.createServer(handler.handler('http'));
  pub.on('upgrade', handler.upgradeHandler('http'));
  // One context for every SNI, client certificates requested but not required (as main.ts).
  const sec = https.createServer({ cert: serverCert.certificatePem, key: serverCert.privateKeyPem, requestCert: true, rejectUnauthorized: false }, handler.handler('https'));
  sec.on('upgrade', handler.upgradeHandler('https'));
  httpPort = await listen(pub);
  httpsPort = await listen(sec);
  closers.push(() => {
    for (const s of [pub, sec, upstream]) {
      s.closeAllConnections();
      s.close();
    }
    forwarder.close();
  });
});

afterAll(() => {
  for (const c of closers) c();
});

describe('tls_termination min_version, per request', () => {
  it('refuses a 1.3 edge over TLS 1.2 under another SNI with 421 ERR_WARREN_7113, and closes the connection', async () => {
    const before = upstreamRequests;
    const r = await httpsGet(V13, { version: 'TLSv1.2' });
    expect(r.protocol).toBe('TLSv1.2');
    expect([r.status, r.headers['warren-error-code']], r.text).toEqual([421, 'ERR_WARREN_7113']);
    expect(r.headers.connection).toBe('close');
    const body = JSON.parse(r.text);
    expect(body).toMatchObject({ error_code: 'ERR_WARREN_7113', status_code: 421 });
    expect(body.msg).toMatch(/requires TLS 1\.3 or newer .*came over TLSv1\.2/);
    expect(upstreamRequests).toBe(before);
  });

  it('refuses a 1.3 edge over plain HTTP with 421', async () => {
    const r = await httpGet(V13);
    expect([r.status, r.headers['warren-error-code']], r.text).toEqual([421, 'ERR_WARREN_7113']);
    expect(JSON.parse(r.text).msg).toMatch(/TLS 1\.3 .*plain HTTP/);
    expect(r.headers['x-upstream']).toBeUndefined();
  });

  it('serves a 1.3 edge over TLS 1.3', async () => {
    const r = await httpsGet(V13, { version: 'TLSv1.3' });
    expect([r.status, r.protocol, r.headers['x-upstream'], r.text]).toEqual([200, 'TLSv1.3', 'yes', V13]);
  });

  it('holds an enabled tls_termination without min_version to TLS 1.2: TLS 1.2 served, plain HTTP refused', async () => {
    expect((await httpsGet(V12, { version: 'TLSv1.2' })).status).toBe(200);
    const r = await httpGet(V12);
    expect([r.status, r.headers['warren-error-code']]).toEqual([421, 'ERR_WARREN_7113']);
    expect(JSON.parse(r.text).msg).toMatch(/TLS 1\.2 or newer/);
  });

  it('leaves edges without tls_termination (or with it disabled) as they were, plain HTTP included', async () => {
    for (const host of [PLAIN, OFF]) {
      expect((await httpGet(host)).status, host).toBe(200);
      expect((await httpsGet(host, { version: 'TLSv1.2' })).status, host).toBe(200);
    }
  });

  it('refuses before any route stage runs', async () => {
    const before = stageRuns;
    expect((await httpGet(PIPE)).status).toBe(421);
    expect((await httpsGet(PIPE, { version: 'TLSv1.2' })).status).toBe(421);
    expect(stageRuns).toBe(before);
    expect((await httpsGet(PIPE, { version: 'TLSv1.3' })).status).toBe(200);
    expect(stageRuns).toBe(before + 1);
  });

  it('refuses an Upgrade the same way, with a proper 421 status line', async () => {
    const before = upstreamRequests;
    for (const via of [{}, { tls: 'TLSv1.2' as const }]) {
      const raw = await upgrade(V13, via);
      expect(raw, JSON.stringify(via)).toMatch(/^HTTP\/1\.1 421 Misdirected Request\r\n/);
      expect(raw).toMatch(/\r\nwarren-error-code: ERR_WARREN_7113\r\n/);
      expect(raw).toMatch(/\r\nconnection: close\r\n/);
      expect(JSON.parse(raw.slice(raw.indexOf('\r\n\r\n') + 4))).toMatchObject({ error_code: 'ERR_WARREN_7113', status_code: 421 });
    }
    expect(upstreamRequests).toBe(before);
    expect(await upgrade(V13, { tls: 'TLSv1.3', until: 'upgraded' })).toMatch(/^HTTP\/1\.1 101 /);
    expect(await upgrade(PLAIN, { until: 'upgraded' })).toMatch(/^HTTP\/1\.1 101 /);
  });
});

describe('mutual_tls when the handshake context is not the edge', () => {
  it('refuses no certificate and a foreign one, and plain HTTP, whatever the SNI; a certificate from the edge CA passes', async () => {
    for (const version of ['TLSv1.2', 'TLSv1.3'] as const) {
      const none = await httpsGet(MTLS, { version });
      expect([none.status, none.headers['warren-error-code']], none.text).toEqual([403, 'ERR_WARREN_7104']);
      const foreign = await httpsGet(MTLS, { version, cert: foreignClient });
      expect([foreign.status, foreign.headers['warren-error-code']], foreign.text).toEqual([403, 'ERR_WARREN_7104']);
      const good = await httpsGet(MTLS, { version, cert: goodClient });
      expect([good.status, good.headers['x-upstream']], good.text).toEqual([200, 'yes']);
    }
    const plain = await httpGet(MTLS);
    expect([plain.status, plain.headers['warren-error-code']]).toEqual([403, 'ERR_WARREN_7104']);
    const up = await upgrade(MTLS, { tls: 'TLSv1.3' });
    expect(up).toMatch(/^HTTP\/1\.1 403 /);
  });
});
