import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import type { TLSSocket } from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCertificate, type SelfSigned } from '@warren/shared';
import { freshDatabase } from '../support/databases.js';
import { startControlPlane, type ControlPlaneProcess } from '../support/processes.js';
import { callApi, callApiExpecting, cleanupTempDirs, startAgentProcess, startIngress, tempDir, waitFor, type AgentProcess, type IngressProcess } from '../support/cluster.js';
import { OPCODE, openWebSocket, type WsOpenOptions } from '../support/websocket-client.js';
import { createDb, createPool } from '../../services/control-plane/src/db/pool.js';
import { migrate } from '../../services/control-plane/src/db/migrate.js';
import { createAccountWithKey } from '../../services/control-plane/src/modules/accounts/accounts.service.js';
import { ensureLocalTls } from '../../services/ingress/src/tls.js';
import { collect, type Res } from '../support/http-answer.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * Edge TLS settings and the websocket_tcp_converter on live traffic, through real processes: a
 * control plane, two ingress nodes (both agents connect to node A; node B reaches their tunnels
 * over a hop), our agent three times (an HTTP upstream that answers the request as JSON, a raw TCP
 * echo server, and a TCP server that speaks first) and client certificates made on the fly. Everything is configured through the
 * REST API.
 */

const WS_HOST = 'ws.e2e.test';
const MTLS_HOST = 'mtls.e2e.test';
const TLS13_HOST = 'tls13.e2e.test';
const PLAIN_HOST = 'plain.e2e.test';
const GREET_HOST = 'greet.e2e.test';

let db: Awaited<ReturnType<typeof freshDatabase>>;
let cp: ControlPlaneProcess;
let a: IngressProcess;
let b: IngressProcess;
let nodes: IngressProcess[];
const agents: AgentProcess[] = [];
let apiKey: string;
let ingressCa: string;
let upstream: http.Server;
let echo: net.Server;
const echoSockets = new Set<net.Socket>();
let echoConnections = 0;
let webBackend: string;
let echoBackend: string;
let greeterBackend: string;
let greeter: net.Server;
const GREETING = '220 greeter ready\r\n';

const api = (method: string, p: string, body?: unknown) => callApi(cp.baseUrl, apiKey, method, p, body);

const apiOk = (method: string, p: string, body: unknown, status: number) => callApiExpecting(cp.baseUrl, apiKey, status, method, p, body);



function httpGet(port: number, host: string, p: string): Promise<Res> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path: p, agent: false, headers: { host } }, (res) => collect(res, resolve));
    req.setTimeout(10_000, () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end();
  });
}

interface TlsOpts {
  cert?: string;
  key?: string;
  minVersion?: 'TLSv1.2' | 'TLSv1.3';
  maxVersion?: 'TLSv1.2' | 'TLSv1.3';
}

/** A GET over HTTPS to the node's https port, with SNI and Host `host`, trusting the ingress CA. */
function httpsGet(port: number, host: string, p: string, o: TlsOpts = {}): Promise<Res> {
  return new Promise((resolve, reject) => {
    const req = https.request(
      { host: '127.0.0.1', port, path: p, servername: host, ca: ingressCa, agent: false, headers: { host }, cert: o.cert, key: o.key, minVersion: o.minVersion, maxVersion: o.maxVersion },
      (res) => collect(res, resolve, (res.socket as TLSSocket).getProtocol()),
    );
    req.setTimeout(10_000, () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end();
  });
}

async function edge(hostname: string): Promise<string> {
  return (await apiOk('POST', '/edges/https', { hostports: [`${hostname}:443`] }, 201)).id;
}

async function route(edgeId: string, match: string, backendId: string, modules: Record<string, unknown> = {}): Promise<string> {
  return (await apiOk('POST', `/edges/https/${edgeId}/routes`, { match_type: 'path_prefix', match, backend: { enabled: true, backend_id: backendId }, ...modules }, 201)).id;
}

/** Waits until every node routes `host` + `p` (no longer "no route" / "no tunnel"). */
async function applied(host: string, p: string): Promise<void> {
  for (const n of nodes) {
    await waitFor(`${n.nodeId} routes ${host}${p}`, async () => {
      const code = (await httpGet(n.http, host, p)).headers['warren-error-code'];
      return code !== 'ERR_WARREN_7001' && code !== 'ERR_WARREN_7003';
    });
  }
}

/** Waits until a WebSocket to `host` opens on every node (B also knows the tunnel on A). */
async function wsReachable(host: string): Promise<void> {
  for (const n of nodes) {
    await waitFor(`${n.nodeId} opens a WebSocket to ${host}`, async () => {
      const { handshake, client } = await openWebSocket({ port: n.http, host });
      client?.destroy();
      return handshake.status === 101;
    });
  }
}

beforeAll(async () => {
  db = await freshDatabase();
  const pool = createPool(db.url, 2);
  await migrate(pool);
  apiKey = (await createAccountWithKey(createDb(pool), 'edge-tls-e2e')).token;
  await pool.end();
  const tlsDir = tempDir('warren-edge-tls-');
  const tls = await ensureLocalTls(tlsDir, [WS_HOST, MTLS_HOST, TLS13_HOST, PLAIN_HOST]);
  ingressCa = tls.caPem!;
  const nodeToken = randomBytes(16).toString('hex');
  cp = await startControlPlane({ databaseUrl: db.url, env: { WARREN_NODE_TOKEN: nodeToken } });
  // 150 WebSockets from 127.0.0.1 to one session below (50 of them abandoned, their slots held
  // by design): this file is about WebSockets through the hop, not one address's share of a
  // session (client-stream-share.e2e.test.ts), so the share is the session's whole cap here.
  const env = { TLS_CERT_FILE: path.join(tlsDir, 'cert.pem'), TLS_KEY_FILE: path.join(tlsDir, 'key.pem'), MAX_STREAMS_PER_CLIENT: '500' };
  [a, b] = (await Promise.all(['edge-tls-a', 'edge-tls-b'].map((nodeId) => startIngress({ nodeId, controlPlane: [`127.0.0.1:${cp.grpcPort}`], nodeToken, env })))) as [IngressProcess, IngressProcess];
  nodes = [a, b];

  upstream = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json', 'x-upstream': 'yes' });
      res.end(JSON.stringify({ url: req.url, host: req.headers.host }));
    });
  });
  echo = net.createServer({ allowHalfOpen: true }, (s) => {
    echoConnections++;
    echoSockets.add(s);
    s.on('close', () => echoSockets.delete(s));
    s.on('error', () => s.destroy());
    s.pipe(s);
  });
  const listen = (srv: net.Server) => new Promise<number>((r) => srv.listen(0, '127.0.0.1', () => r((srv.address() as net.AddressInfo).port)));
  // A server-first protocol (SMTP, SSH, MySQL…): the upstream speaks before the client does.
  greeter = net.createServer((s) => {
    echoSockets.add(s);
    s.on('close', () => echoSockets.delete(s));
    s.on('error', () => s.destroy());
    s.write(GREETING);
    s.pipe(s);
  });
  const [upPort, echoPort, greeterPort] = await Promise.all([listen(upstream), listen(echo), listen(greeter)]);

  const cred = await apiOk('POST', '/credentials', {}, 201);
  webBackend = (await apiOk('POST', '/backends/tunnel_group', { labels: { app: 'web' } }, 201)).id;
  echoBackend = (await apiOk('POST', '/backends/tunnel_group', { labels: { app: 'echo' } }, 201)).id;
  greeterBackend = (await apiOk('POST', '/backends/tunnel_group', { labels: { app: 'greeter' } }, 201)).id;
  const common = ['--authtoken', cred.token, '--server', `localhost:${a.agent}`, '--ca', tls.caFile];
  agents.push(startAgentProcess(['http', `http://127.0.0.1:${upPort}`, '--label', 'app=web', ...common]));
  agents.push(startAgentProcess(['http', `tcp://127.0.0.1:${echoPort}`, '--label', 'app=echo', ...common]));
  agents.push(startAgentProcess(['http', `tcp://127.0.0.1:${greeterPort}`, '--label', 'app=greeter', ...common]));
  await Promise.all(agents.map((p) => p.waitForOutput('online')));
}, CLUSTER_HOOK_MS);

afterAll(async () => {
  await Promise.allSettled([...agents.map((p) => p.stop({ timeoutMs: 10_000 })), a?.stop({ timeoutMs: 10_000 }), b?.stop({ timeoutMs: 10_000 }), cp?.stop({ timeoutMs: 10_000 })]);
  for (const s of echoSockets) s.destroy();
  await Promise.allSettled([upstream && new Promise((r) => upstream.close(r)), echo && new Promise((r) => echo.close(r)), greeter && new Promise((r) => greeter.close(r))]);
  await db?.drop();
  cleanupTempDirs();
}, 60_000);

describe('websocket_tcp_converter', () => {
  let wsReady = false;
  const viaNodes = () => [
    { name: 'node A over http (agent here)', opts: (): WsOpenOptions => ({ port: a.http, host: WS_HOST }) },
    { name: 'node A over https', opts: (): WsOpenOptions => ({ port: a.https, host: WS_HOST, tls: { ca: ingressCa } }) },
    { name: 'node B over http (hop to A)', opts: (): WsOpenOptions => ({ port: b.http, host: WS_HOST }) },
    { name: 'node B over https (hop to A)', opts: (): WsOpenOptions => ({ port: b.https, host: WS_HOST, tls: { ca: ingressCa } }) },
  ];

  beforeAll(async () => {
    const id = await edge(WS_HOST);
    await route(id, '/', echoBackend, { websocket_tcp_converter: { enabled: true } });
    await applied(WS_HOST, '/');
    await wsReachable(WS_HOST);
    wsReady = true;
  }, 30_000);

  it('answers a plain GET (and a bad handshake) with 426 ERR_WARREN_7105', async () => {
    expect(wsReady).toBe(true);
    for (const n of nodes) {
      const r = await httpGet(n.http, WS_HOST, '/chat');
      expect(r.status, r.text).toBe(426);
      expect(r.headers['warren-error-code']).toBe('ERR_WARREN_7105');
      expect(r.headers.upgrade).toBe('websocket');
      expect(r.headers['sec-websocket-version']).toBe('13');
      const s = await httpsGet(n.https, WS_HOST, '/chat');
      expect([s.status, s.headers['warren-error-code']]).toEqual([426, 'ERR_WARREN_7105']);
      // An upgrade with the wrong version is refused by the route, never reaches the agent.
      const bad = await openWebSocket({ port: n.http, host: WS_HOST, headers: { 'Sec-WebSocket-Version': '8' } });
      expect(bad.client).toBeNull();
      expect(bad.handshake.status, bad.handshake.body).toBe(426);
      expect(bad.handshake.headers['warren-error-code']).toBe('ERR_WARREN_7105');
    }
  });

  for (const via of viaNodes()) {
    it(`carries a WebSocket as raw TCP to the echo server through ${via.name}`, async () => {
      const before = echoConnections;
      const { handshake, client } = await openWebSocket(via.opts());
      expect(handshake.status, `${handshake.statusLine}\n${handshake.body}`).toBe(101);
      expect(handshake.headers.upgrade?.toLowerCase()).toBe('websocket');
      expect(handshake.headers.connection?.toLowerCase()).toBe('upgrade');
      expect(handshake.headers['sec-websocket-accept']).toBe(handshake.expectedAccept);
      const ws = client!;
      try {
        // A small binary frame comes back as one unmasked binary frame.
        ws.send(OPCODE.binary, Buffer.from('hello over tcp'));
        const small = await ws.readData(14);
        expect(small.data.toString()).toBe('hello over tcp');
        for (const f of small.frames) expect([f.opcode, f.masked]).toEqual([OPCODE.binary, false]);
        // A text frame's payload travels as bytes too; the answer is binary.
        ws.send(OPCODE.text, 'ünïcode');
        expect((await ws.readData(Buffer.byteLength('ünïcode'))).data.toString()).toBe('ünïcode');
        // 16- and 64-bit lengths, possibly split into several frames on the way back.
        const big = randomBytes(70_000);
        ws.send(OPCODE.binary, big);
        expect((await ws.readData(big.length)).data.equals(big)).toBe(true);
        // Fragments: bytes are passed on in order.
        ws.send(OPCODE.binary, Buffer.from('frag-'), false);
        ws.send(OPCODE.continuation, Buffer.from('ment'), true);
        expect((await ws.readData(9)).data.toString()).toBe('frag-ment');
        // A ping is answered by the ingress itself.
        ws.send(OPCODE.ping, Buffer.from('p1'));
        const pong = await ws.nextFrame();
        expect([pong.opcode, pong.payload.toString(), pong.masked]).toEqual([OPCODE.pong, 'p1', false]);
        expect(echoConnections).toBe(before + 1);
        // A close is echoed with the same code.
        const code = Buffer.alloc(2);
        code.writeUInt16BE(1000);
        ws.send(OPCODE.close, code);
        let closeFrame = await ws.nextFrame();
        while (closeFrame.opcode !== OPCODE.close) closeFrame = await ws.nextFrame();
        expect(closeFrame.payload.readUInt16BE(0)).toBe(1000);
        await waitFor('the ingress closes the connection after the close handshake', () => ws.closed, 5_000);
      } finally {
        ws.destroy();
      }
    });
  }
});

describe('websocket_tcp_converter, server speaks first', () => {
  beforeAll(async () => {
    const id = await edge(GREET_HOST);
    await route(id, '/', greeterBackend, { websocket_tcp_converter: { enabled: true } });
    await applied(GREET_HOST, '/');
    await wsReachable(GREET_HOST);
  }, 30_000);

  /** Opens `count` WebSockets at once; each must receive the greeting first. Returns the failures. */
  async function burst(n: IngressProcess, count: number): Promise<string[]> {
    const results = await Promise.all(
      Array.from({ length: count }, async () => {
        const { handshake, client } = await openWebSocket({ port: n.http, host: GREET_HOST });
        if (handshake.status !== 101) return `status ${handshake.status} ${handshake.body}`;
        try {
          const got = (await client!.readData(GREETING.length, 2_000)).data.toString();
          return got === GREETING ? 'ok' : `got ${JSON.stringify(got)}`;
        } catch (err) {
          return (err as Error).message;
        } finally {
          client!.destroy();
        }
      }),
    );
    return results.filter((r) => r !== 'ok');
  }

  it("delivers the upstream's greeting through node A (agent here)", async () => {
    expect(await burst(a, 50)).toEqual([]);
  });

  it("delivers the upstream's greeting through node B (raw hop to A)", async () => {
    // Timing-dependent: the loss this guards against needs the greeting to arrive in the same read
    // as the hop's 101; a burst of connections makes that likely (before the fix, 2 runs in 3).
    const failures = await burst(b, 100);
    expect(
      failures,
      `${failures.length} of 100 WebSockets through node B never got the upstream's first bytes: the raw hop (Forwarder.rawStream) ` +
        'must pause the socket before handing over the bytes that came with its 101, or they are emitted to no listener.',
    ).toEqual([]);
  });
});

describe('edge mutual_tls', () => {
  let ca: SelfSigned;
  let good: SelfSigned;
  let foreign: SelfSigned;

  beforeAll(async () => {
    ca = await createCertificate({ commonName: 'e2e client CA', days: 1, ca: true, keyType: 'ec' });
    good = await createCertificate({ commonName: 'client', days: 1, issuer: ca, keyType: 'ec', dnsNames: ['client.test'] });
    const otherCa = await createCertificate({ commonName: 'e2e other CA', days: 1, ca: true, keyType: 'ec' });
    foreign = await createCertificate({ commonName: 'client', days: 1, issuer: otherCa, keyType: 'ec', dnsNames: ['client.test'] });

    const caId = (await apiOk('POST', '/certificate_authorities', { ca_pem: ca.certificatePem }, 201)).id;
    const id = await edge(MTLS_HOST);
    await route(id, '/', webBackend);
    await applied(MTLS_HOST, '/');
    const put = await apiOk('PUT', `/edges/https/${id}/mutual_tls`, { certificate_authority_ids: [caId] }, 200);
    expect(put.enabled).toBe(true);
    expect(put.certificate_authorities.map((r: { id: string }) => r.id)).toEqual([caId]);
    for (const n of nodes) {
      await waitFor(`${n.nodeId} enforces mutual TLS`, async () => (await httpsGet(n.https, MTLS_HOST, '/probe')).headers['warren-error-code'] === 'ERR_WARREN_7104');
    }
  }, 30_000);

  it('refuses a client without a certificate with 403 ERR_WARREN_7104', async () => {
    for (const n of nodes) {
      const r = await httpsGet(n.https, MTLS_HOST, '/none');
      expect([r.status, r.headers['warren-error-code']], r.text).toEqual([403, 'ERR_WARREN_7104']);
      expect(r.headers['x-upstream']).toBeUndefined();
    }
  });

  it('refuses a certificate from another CA with 403', async () => {
    for (const n of nodes) {
      const r = await httpsGet(n.https, MTLS_HOST, '/foreign', { cert: foreign.certificatePem, key: foreign.privateKeyPem });
      expect([r.status, r.headers['warren-error-code']], r.text).toEqual([403, 'ERR_WARREN_7104']);
    }
  });

  it('lets a certificate from the edge CA through to the upstream', async () => {
    for (const n of nodes) {
      for (const version of ['TLSv1.2', 'TLSv1.3'] as const) {
        const r = await httpsGet(n.https, MTLS_HOST, `/ok/${version}`, { cert: good.certificatePem, key: good.privateKeyPem, minVersion: version, maxVersion: version });
        expect(r.status, r.text).toBe(200);
        expect(r.protocol).toBe(version);
        expect(r.headers['x-upstream']).toBe('yes');
        expect(JSON.parse(r.text).url).toBe(`/ok/${version}`);
      }
    }
  });

  it('refuses plain HTTP on the mutual TLS edge', async () => {
    for (const n of nodes) {
      const r = await httpGet(n.http, MTLS_HOST, '/plain');
      expect([r.status, r.headers['warren-error-code']], r.text).toEqual([403, 'ERR_WARREN_7104']);
    }
  });
});

describe('edge tls_termination min_version', () => {
  beforeAll(async () => {
    const id = await edge(TLS13_HOST);
    await route(id, '/', webBackend);
    const plain = await edge(PLAIN_HOST);
    await route(plain, '/', webBackend);
    const put = await apiOk('PUT', `/edges/https/${id}/tls_termination`, { min_version: '1.3' }, 200);
    expect([put.enabled, put.min_version]).toEqual([true, '1.3']);
    // Config snapshots are applied in order: once a route added after the PUT answers on a node,
    // that node runs with the new TLS settings too.
    await route(id, '/after-tls', webBackend);
    await applied(TLS13_HOST, '/after-tls');
    await applied(PLAIN_HOST, '/');
  }, 30_000);

  it('accepts TLS 1.3 for the hostname', async () => {
    for (const n of nodes) {
      const r = await httpsGet(n.https, TLS13_HOST, '/v13', { minVersion: 'TLSv1.3' });
      expect([r.status, r.protocol]).toEqual([200, 'TLSv1.3']);
      expect(JSON.parse(r.text).url).toBe('/v13');
    }
  });

  it('fails the handshake of a TLS 1.2-only client for the hostname (SNI)', async () => {
    for (const n of nodes) {
      const outcome = await httpsGet(n.https, TLS13_HOST, '/v12', { maxVersion: 'TLSv1.2' }).then(
        (r) => `handshake succeeded with ${r.protocol} and answered ${r.status}`,
        (err: Error & { code?: string }) => `failed: ${err.code ?? ''} ${err.message}`,
      );
      expect(
        outcome,
        `${n.nodeId}: tls_termination min_version 1.3 not enforced for ${TLS13_HOST}. OpenSSL picks the version before the SNI callback ` +
          "swaps contexts, so main.ts closes such connections in a 'secureConnection' listener.",
      ).toMatch(/^failed: .*(protocol.version|PROTOCOL_VERSION|unsupported protocol|ECONNRESET|socket hang up)/i);
    }
  });

  it('still accepts TLS 1.2 for another edge', async () => {
    for (const n of nodes) {
      const r = await httpsGet(n.https, PLAIN_HOST, '/v12', { maxVersion: 'TLSv1.2' });
      expect([r.status, r.protocol]).toEqual([200, 'TLSv1.2']);
      expect(JSON.parse(r.text).url).toBe('/v12');
    }
  });
});
