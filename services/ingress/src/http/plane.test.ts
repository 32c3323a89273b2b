import http from 'node:http';
import net from 'node:net';
import { createHash } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger, type DataPlaneConfig, type DpTunnel } from '@warren/shared';
import { createIngressMetrics } from '../metrics.js';
import { TunnelRegistry } from '../tunnels/registry.js';
import { tcpTunnel } from '../tunnels/testing.js';
import { listen, rawHttpServer } from './testing.js';
import { upgradeEcho } from '../../../../test/support/upgrade.js';
import { createInternalServer } from './internal.js';
import { Forwarder } from './proxy.js';
import { PublicHandler } from './public.js';
import { RoutingTable } from './routing.js';
import { createPipelineCompiler, type PipelineCompiler } from '../pipeline/runner.js';
import type { RouteStage, StageFactory } from '../pipeline/types.js';
import { Transform } from 'node:stream';

/**
 * The HTTP plane of two nodes in one process, with real sockets: tunnels whose "proxy streams" are
 * plain TCP connections to an upstream (what an agent does after reading the proxy header), so
 * routing, forwarding, keep-alive, upgrades and hops are tested without the agent protocol.
 */
const log = createLogger('test', 'silent');
const closers: Array<() => void> = [];


const upstreamConnections = { count: 0 };
let upstreamPort = 0;
let slowPort = 0;
/** An upstream that answers with exact bytes (per path), for the client's edge cases. */
let rawPort = 0;
const rawConnections = { count: 0, closed: 0 };
/** Request targets the raw upstream read, in order. */
const rawPaths: string[] = [];
const RAW_ANSWERS: Record<string, string> = {
  '/raw/close': 'HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok',
  '/raw/chunked': 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Kind: chunked\r\n\r\n3\r\nabc\r\n4;ext=1\r\ndefg\r\n0\r\nX-Trailer: t\r\n\r\n',
  '/raw/early': 'HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfinal',
  '/raw/garbage': 'THIS IS NOT HTTP\r\n\r\n',
  '/raw/head': 'HTTP/1.1 200 OK\r\nContent-Length: 1234\r\nX-Kind: head\r\n\r\n',
  '/raw/nocontent': 'HTTP/1.1 204 No Content\r\nX-Kind: empty\r\n\r\n',
  '/raw/hopbyhop': 'HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Private\r\nX-Private: secret\r\nKeep-Alive: timeout=77\r\nX-Warren-Tunnel: spoof\r\nX-Public: 1\r\nContent-Length: 2\r\n\r\nok',
};

const cfg: DataPlaneConfig = {
  version: 7,
  edges: new Map([['edghts_1', { id: 'edghts_1', accountId: 'ac_1', hostports: ['app.test:443'], mutualTls: null, tlsTermination: null }]]),
  routes: new Map([
    ['r_api', { id: 'r_api', accountId: 'ac_1', edgeId: 'edghts_1', matchType: 'path_prefix', match: '/api', modules: {}, backendId: 'bkdtg_up', ipPolicyIds: [], trafficPolicy: null }],
    ['r_slow', { id: 'r_slow', accountId: 'ac_1', edgeId: 'edghts_1', matchType: 'path_prefix', match: '/slow', modules: {}, backendId: 'bkdtg_slow', ipPolicyIds: [], trafficPolicy: null }],
    ['r_none', { id: 'r_none', accountId: 'ac_1', edgeId: 'edghts_1', matchType: 'path_prefix', match: '/none', modules: {}, backendId: 'bkdtg_none', ipPolicyIds: [], trafficPolicy: null }],
    ['r_remote', { id: 'r_remote', accountId: 'ac_1', edgeId: 'edghts_1', matchType: 'path_prefix', match: '/remote', modules: {}, backendId: 'bkdtg_remote', ipPolicyIds: [], trafficPolicy: null }],
    ['r_raw', { id: 'r_raw', accountId: 'ac_1', edgeId: 'edghts_1', matchType: 'path_prefix', match: '/raw', modules: {}, backendId: 'bkdtg_raw', ipPolicyIds: [], trafficPolicy: null }],
    ['r_post', { id: 'r_post', accountId: 'ac_1', edgeId: 'edghts_1', matchType: 'path_prefix', match: '/post', modules: {}, backendId: 'bkdtg_post', ipPolicyIds: [], trafficPolicy: null }],
    ['r_nob', { id: 'r_nob', accountId: 'ac_1', edgeId: 'edghts_1', matchType: 'exact_path', match: '/nobackend', modules: {}, backendId: null, ipPolicyIds: [], trafficPolicy: null }],
  ]),
  backends: new Map([
    ['bkdtg_up', { id: 'bkdtg_up', accountId: 'ac_1', labels: { app: 'up' } }],
    ['bkdtg_slow', { id: 'bkdtg_slow', accountId: 'ac_1', labels: { app: 'slow' } }],
    ['bkdtg_none', { id: 'bkdtg_none', accountId: 'ac_1', labels: { app: 'none' } }],
    ['bkdtg_remote', { id: 'bkdtg_remote', accountId: 'ac_1', labels: { app: 'far' } }],
    ['bkdtg_raw', { id: 'bkdtg_raw', accountId: 'ac_1', labels: { app: 'raw' } }],
    ['bkdtg_post', { id: 'bkdtg_post', accountId: 'ac_1', labels: { app: 'post' } }],
  ]),
  ipPolicies: new Map(),
  certificateAuthorities: new Map(),
  credentials: new Map(),
  credentialsByTokenHash: new Map(),
  eventSubscriptions: new Map(),
};

async function node(nodeId: string, compile?: PipelineCompiler) {
  const registry = new TunnelRegistry(nodeId);
  const metrics = createIngressMetrics(nodeId);
  // 3 s: room for the 8 MB upload on a loaded CI machine (two suites at once); /slow never answers.
  const forwarder = new Forwarder({ registry, hopToken: 'secret', log, upstreamTimeoutMs: 3000, maxStreamsPerTunnel: 8, maxQueuedPerTunnel: 100 });
  const handler = new PublicHandler({ registry, forwarder, metrics, log });
  handler.setTable(new RoutingTable(cfg, compile));
  const pub = http.createServer(handler.handler('http'));
  pub.on('upgrade', handler.upgradeHandler('http'));
  const internal = createInternalServer({ forwarder, registry: metrics.registry, hopToken: 'secret', isReady: () => true, status: () => ({}), log });
  const port = await listen(pub);
  const internalPort = await listen(internal);
  closers.push(() => {
    pub.closeAllConnections();
    pub.close();
    internal.closeAllConnections();
    internal.close();
    forwarder.close();
  });
  return { registry, metrics, port, internalPort };
}

function get(port: number, path: string, opts: { host?: string; method?: string; body?: Buffer; agent?: http.Agent; headers?: Record<string, string> } = {}): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: Buffer }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ port, host: '127.0.0.1', path, method: opts.method ?? 'GET', agent: opts.agent ?? false, headers: { host: opts.host ?? 'app.test', ...opts.headers } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks) }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(opts.body);
  });
}

let a: Awaited<ReturnType<typeof node>>;
let b: Awaited<ReturnType<typeof node>>;
/**
 * Node C runs a test pipeline on routes r_api, r_none, r_raw and r_post: deny by header, add a
 * request header (after buffering the body), edit and transform the response. Its r_raw tunnel is
 * on node A (a hop); r_post has two local tunnels, one to an upstream that reads the request and
 * hangs up, one to an upstream that counts what it gets.
 */
let c: Awaited<ReturnType<typeof node>>;
const results: Array<number | 'error' | 'none'> = [];
/** Paths the r_post counting upstream received. */
const postsReceived: string[] = [];
const testStage: StageFactory = (route) => {
  if (route.id !== 'r_api' && route.id !== 'r_none' && route.id !== 'r_raw' && route.id !== 'r_post') return null;
  const stage: RouteStage = {
    name: 'test',
    needsBody: true,
    onRequest: (s) => {
      if (s.req.headers['x-deny']) return { status: 451, headers: { 'x-why': 'test' }, body: 'denied by test' };
      if (s.req.headers['x-throw']) throw new Error('stage failed');
      s.headers.push('X-Body-Seen', String(s.body?.length ?? -1));
      return null;
    },
    onResponse: (_s, r) => {
      r.headers.push('X-Stage', 'yes');
      return undefined;
    },
    transformBody: () =>
      new Transform({
        transform(chunk: Buffer, _enc, cb) {
          cb(null, Buffer.from(chunk.toString('latin1').toUpperCase(), 'latin1'));
        },
      }),
    onResult: (_s, result) => results.push(result),
  };
  return stage;
};

beforeAll(async () => {
  const upstream = http.createServer((req, res) => {
    const h = createHash('sha256');
    let n = 0;
    req.on('data', (c: Buffer) => {
      h.update(c);
      n += c.length;
    });
    req.on('end', () => {
      if (req.url?.startsWith('/api/big')) {
        res.writeHead(200, { 'content-type': 'application/octet-stream' });
        const chunk = Buffer.alloc(64 * 1024, 7);
        for (let i = 0; i < 160; i++) res.write(chunk); // 10 MiB, streamed
        res.end();
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json', connection: 'keep-alive', 'x-up': '1' });
      res.end(JSON.stringify({ url: req.url, method: req.method, headers: req.headers, bytes: n, sha: h.digest('hex') }));
    });
  });
  upstream.on('connection', () => upstreamConnections.count++);
  upstream.on('upgrade', (_req, socket: net.Socket) => {
    socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n');
    socket.pipe(socket);
  });
  upstreamPort = await listen(upstream);
  const raw = rawHttpServer(
    (path, sock) => {
      rawPaths.push(path);
      if (path === '/raw/eof') {
        sock.destroy();
        return 'stop';
      }
      if (path === '/raw/endless') {
        // A body that never ends, as fast as the reader takes it.
        sock.write('HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\r\n');
        const chunk = Buffer.alloc(64 * 1024, 1);
        const pump = () => {
          while (!sock.destroyed && sock.write(chunk));
        };
        sock.on('drain', pump);
        pump();
        return 'stop';
      }
      sock.write(RAW_ANSWERS[path] ?? 'HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n');
      if (path === '/raw/close') sock.end();
    },
    (sock) => {
      rawConnections.count++;
      sock.on('close', () => rawConnections.closed++);
    },
  );
  rawPort = await listen(raw);
  const slow = http.createServer(() => {
    /* never answers */
  });
  slowPort = await listen(slow);
  closers.push(() => {
    upstream.closeAllConnections();
    upstream.close();
    slow.closeAllConnections();
    slow.close();
    raw.close();
  });
  a = await node('node-a');
  b = await node('node-b');
  c = await node('node-c', createPipelineCompiler([testStage], { limiter: { hit: async () => ({ limited: false, retryAfterSeconds: 0 }) }, log, registry: a.metrics.registry }));
  a.registry.addLocal(tcpTunnel('tn_up', { app: 'up', env: 'x' }, () => upstreamPort));
  c.registry.addLocal(tcpTunnel('tn_up', { app: 'up', env: 'x' }, () => upstreamPort));
  a.registry.addLocal(tcpTunnel('tn_slow', { app: 'slow' }, () => slowPort));
  a.registry.addLocal(tcpTunnel('tn_far', { app: 'far' }, () => upstreamPort));
  a.registry.addLocal(tcpTunnel('tn_raw', { app: 'raw' }, () => rawPort));
  const far: DpTunnel = { ...tcpTunnel('tn_far', { app: 'far' }, () => upstreamPort), nodeId: 'node-a', nodeAddress: `127.0.0.1:${a.internalPort}` };
  b.registry.addRemote(far);
  const hangUp = http.createServer((req) => {
    req.resume();
    req.on('end', () => req.socket.destroy()); // read the whole request, then hang up unanswered
  });
  const counting = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      postsReceived.push(req.url ?? '');
      res.end('ok');
    });
  });
  const hangUpPort = await listen(hangUp);
  const countingPort = await listen(counting);
  closers.push(() => {
    hangUp.closeAllConnections();
    hangUp.close();
    counting.closeAllConnections();
    counting.close();
  });
  c.registry.addLocal(tcpTunnel('tn_post_hangup', { app: 'post' }, () => hangUpPort));
  c.registry.addLocal(tcpTunnel('tn_post_ok', { app: 'post' }, () => countingPort));
  c.registry.addRemote({ ...tcpTunnel('tn_raw', { app: 'raw' }, () => rawPort), nodeId: 'node-a', nodeAddress: `127.0.0.1:${a.internalPort}` });
});

afterAll(() => {
  for (const c of closers) c();
});

describe('ingress HTTP plane', () => {
  it('routes by host and path to a tunnel whose labels include the backend labels, with forwarding headers', async () => {
    const r = await get(a.port, '/api/x?y=1', { headers: { 'x-forwarded-for': '203.0.113.9', 'x-warren-tunnel': 'tn_spoofed' } });
    expect(r.status).toBe(200);
    const body = JSON.parse(r.body.toString());
    expect(body.url).toBe('/api/x?y=1');
    expect(body.headers.host).toBe('app.test');
    expect(body.headers['x-forwarded-for']).toBe('203.0.113.9, 127.0.0.1');
    expect(body.headers['x-forwarded-proto']).toBe('http');
    expect(body.headers['x-forwarded-host']).toBe('app.test');
    expect(body.headers['x-warren-tunnel']).toBeUndefined();
    expect(r.headers['x-up']).toBe('1');
  });

  it("keeps Host and Content-Length when the client's Connection header lists them (other listed headers are dropped)", async () => {
    const r = await get(a.port, '/api/conn', { method: 'POST', body: Buffer.from('abc'), headers: { connection: 'close, Host, Content-Length, X-Private', 'x-private': 'p' } });
    const body = JSON.parse(r.body.toString());
    expect([body.headers.host, body.bytes, body.headers['x-private']]).toEqual(['app.test', 3, undefined]);
  });

  it('routes, checks and forwards one normalised path: escaped unreserved characters decoded, dot segments removed, slashes merged; a backslash refused', async () => {
    for (const target of ['//api/n', '/%61pi/n', '/x/../api/n', '/%2e/api/./n', '/api//n']) {
      const r = await get(a.port, target);
      expect([target, r.status, JSON.parse(r.body.toString()).url]).toEqual([target, 200, '/api/n']);
    }
    // Other escapes and the query are kept as sent.
    expect(JSON.parse((await get(a.port, '/api/a%2Fb%20c?x=/../y')).body.toString()).url).toBe('/api/a%2Fb%20c?x=/../y');
    for (const target of ['/api\\n', '/api/%5Cn']) {
      const r = await get(a.port, target);
      expect([target, r.status, r.headers['warren-error-code']]).toEqual([target, 400, 'ERR_WARREN_7011']);
    }
  });

  it('streams large bodies both ways', async () => {
    const payload = Buffer.alloc(8 * 1024 * 1024, 3);
    const r = await get(a.port, '/api/upload', { method: 'POST', body: payload });
    const body = JSON.parse(r.body.toString());
    expect(body.bytes).toBe(payload.length);
    expect(body.sha).toBe(createHash('sha256').update(payload).digest('hex'));
    const big = await get(a.port, '/api/big');
    expect(big.body.length).toBe(160 * 64 * 1024);
  });

  it('reuses upstream streams across requests (keep-alive pool per tunnel)', async () => {
    await get(a.port, '/api/warm');
    const before = upstreamConnections.count;
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    for (let i = 0; i < 20; i++) expect((await get(a.port, '/api/k', { agent })).status).toBe(200);
    agent.destroy();
    expect(upstreamConnections.count - before).toBeLessThanOrEqual(1);
  });

  it('answers unknown hosts, unmatched paths, missing backends and offline tunnels with clear errors', async () => {
    const unknown = await get(a.port, '/', { host: 'nope.test' });
    expect(unknown.status).toBe(404);
    expect(unknown.headers['warren-error-code']).toBe('ERR_WARREN_7000');
    expect(JSON.parse(unknown.body.toString()).msg).toContain('nope.test');
    const noRoute = await get(a.port, '/other');
    expect([noRoute.status, noRoute.headers['warren-error-code']]).toEqual([404, 'ERR_WARREN_7001']);
    const noBackend = await get(a.port, '/nobackend');
    expect([noBackend.status, noBackend.headers['warren-error-code']]).toEqual([502, 'ERR_WARREN_7002']);
    const offline = await get(a.port, '/none', { headers: { accept: 'text/html' } });
    expect([offline.status, offline.headers['warren-error-code']]).toEqual([503, 'ERR_WARREN_7003']);
    expect(offline.headers['content-type']).toContain('text/html');
    const badHost = await get(a.port, '/', { host: 'a b' });
    expect(badHost.status).toBe(400);
  });

  it('passes on what an upstream answers, byte-exact cases of the keep-alive client', async () => {
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    // Connection: close from the upstream: answered, and the next request gets a new stream.
    for (let i = 0; i < 3; i++) {
      const r = await get(a.port, '/raw/close', { agent });
      expect([r.status, r.body.toString()]).toEqual([200, 'ok']);
    }
    const chunked = await get(a.port, '/raw/chunked', { agent });
    expect([chunked.status, chunked.body.toString(), chunked.headers['x-kind']]).toEqual([200, 'abcdefg', 'chunked']);
    // 1xx interim answers are not passed on; the final one is.
    const early = await get(a.port, '/raw/early', { agent });
    expect([early.status, early.body.toString()]).toEqual([200, 'final']);
    // HEAD: the Content-Length is the GET's, no body follows, and the stream stays usable.
    const head = await get(a.port, '/raw/head', { agent, method: 'HEAD' });
    expect([head.status, head.headers['content-length'], head.headers['x-kind'], head.body.length]).toEqual([200, '1234', 'head', 0]);
    const empty = await get(a.port, '/raw/nocontent', { agent });
    expect([empty.status, empty.headers['x-kind'], empty.body.length]).toEqual([204, 'empty', 0]);
    // Hop-by-hop headers (and those the Connection header lists) stay between us and the upstream.
    const hop = await get(a.port, '/raw/hopbyhop', { agent });
    expect(hop.headers['x-public']).toBe('1');
    expect(hop.headers['x-private']).toBeUndefined();
    expect(hop.headers['keep-alive']).not.toBe('timeout=77');
    expect(hop.headers['x-warren-tunnel']).toBeUndefined();
    agent.destroy();
  });

  it('answers 502 for an upstream that is not HTTP or hangs up without an answer', async () => {
    const garbage = await get(a.port, '/raw/garbage');
    expect([garbage.status, garbage.headers['warren-error-code']]).toEqual([502, 'ERR_WARREN_7004']);
    const eof = await get(a.port, '/raw/eof');
    expect([eof.status, eof.headers['warren-error-code']]).toEqual([502, 'ERR_WARREN_7004']);
    // The tunnel still serves afterwards.
    expect((await get(a.port, '/raw/close')).status).toBe(200);
  });

  it('answers 400 for a request target the tunnel client will not send (absolute-form, not http)', async () => {
    const answer = await new Promise<string>((resolve, reject) => {
      const sock = net.connect(a.port, '127.0.0.1', () => sock.end('GET ftp://app.test/raw/close HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n'));
      let out = '';
      sock.on('data', (c: Buffer) => (out += c.toString('latin1')));
      sock.on('close', () => resolve(out));
      sock.on('error', reject);
    });
    expect(answer).toMatch(/^HTTP\/1\.1 400 /);
    expect(answer.toLowerCase()).toContain('warren-error-code: err_warren_7011');
  });

  it('stops the upstream when the client goes away in the middle of an endless body', async () => {
    const closedBefore = rawConnections.closed;
    await new Promise<void>((resolve, reject) => {
      const req = http.get({ port: a.port, host: '127.0.0.1', path: '/raw/endless', agent: false, headers: { host: 'app.test' } }, (res) => {
        let n = 0;
        res.on('data', (c: Buffer) => {
          n += c.length;
          if (n > 1024 * 1024) {
            req.destroy();
            resolve();
          }
        });
      });
      req.on('error', () => {});
      setTimeout(() => reject(new Error('no body arrived')), 5000);
    });
    const deadline = Date.now() + 5000;
    while (rawConnections.closed === closedBefore && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    expect(rawConnections.closed).toBeGreaterThan(closedBefore);
  });

  it('answers 504 when the upstream does not answer in time', async () => {
    const r = await get(a.port, '/slow');
    expect([r.status, r.headers['warren-error-code']]).toEqual([504, 'ERR_WARREN_7005']);
  });

  it('carries a request to the node that holds the tunnel (internal hop), streaming', async () => {
    const payload = Buffer.alloc(2 * 1024 * 1024, 9);
    const r = await get(b.port, '/remote/x', { method: 'PUT', body: payload });
    expect(r.status).toBe(200);
    const body = JSON.parse(r.body.toString());
    expect(body.bytes).toBe(payload.length);
    expect(body.headers['x-forwarded-for']).toBe('127.0.0.1');
    expect(body.headers['x-warren-tunnel']).toBeUndefined();
    const text = await b.metrics.registry.getSingleMetricAsString('warren_ingress_hops_total');
    expect(text).toMatch(/warren_ingress_hops_total\{node="node-b"\} [1-9]/);
  });

  it("answers the holding node's own errors over a hop as it would a local one: same code and message, no response stages", async () => {
    // The holding node (A) fails the request itself; C, which has the route's response stages,
    // must answer with A's error as a local one (not run its stages on A's error page, not call
    // an upstream failure "the tunnel has moved or gone").
    const before = results.length;
    for (const [path, status, code, retryable] of [
      ['/raw/garbage', 502, 'ERR_WARREN_7004', false], // the upstream is not HTTP: not retryable
      ['/raw/eof', 502, 'ERR_WARREN_7004', true], // the upstream hung up before answering: retryable, no other tunnel
    ] as const) {
      const local = await get(a.port, path);
      const hopped = await get(c.port, path);
      expect([local.status, local.headers['warren-error-code']], path).toEqual([status, code]);
      expect([hopped.status, hopped.headers['warren-error-code'], hopped.headers['x-stage']], `${path} (retryable ${retryable})`).toEqual([status, code, undefined]);
      // A's words, not C's and not A's error page upper-cased by C's body transform.
      expect(JSON.parse(hopped.body.toString()).msg).toBe(JSON.parse(local.body.toString()).msg);
      expect(Object.keys(hopped.headers).filter((h) => h.startsWith('x-warren'))).toEqual([]);
    }
    // The route's stages saw a failed forward, not an upstream status ('none' may follow a result).
    expect(results.slice(before).filter((r) => r !== 'none')).toEqual(['error', 'error']);
    expect((await get(c.port, '/raw/close')).status).toBe(200);
  });

  it('sends a request that may have reached the upstream to another tunnel only when it is safe to repeat (not a buffered POST)', async () => {
    // r_post alternates between an upstream that reads the request and hangs up and one that
    // answers; node C buffers bodies (its test pipeline), so a POST could be sent again, but the
    // first upstream may have acted on it.
    const posts = [];
    for (let i = 0; i < 4; i++) posts.push(await get(c.port, `/post/${i}`, { method: 'POST', body: Buffer.from(`order ${i}`) }));
    expect(posts.map((r) => r.status).sort()).toEqual([200, 200, 502, 502]);
    expect(posts.filter((r) => r.status === 502).map((r) => r.headers['warren-error-code'])).toEqual(['ERR_WARREN_7004', 'ERR_WARREN_7004']);
    // Each POST reached one upstream once: none was repeated on the answering one.
    expect(postsReceived.sort()).toEqual(posts.flatMap((r, i) => (r.status === 200 ? [`/post/${i}`] : [])).sort());
    // A GET met the same way goes to the other tunnel and is answered.
    for (let i = 0; i < 4; i++) expect((await get(c.port, `/post/get-${i}`)).status).toBe(200);
  });

  it('refuses hop requests without the node token', async () => {
    const r = await get(a.internalPort, '/remote', { headers: { 'x-warren-tunnel': 'tn_far' } });
    expect(r.status).toBe(403);
  });

  it('answers 503 when the remote node no longer has the tunnel, and retries elsewhere first', async () => {
    b.registry.addRemote({ ...tcpTunnel('tn_gone', { app: 'far' }, () => upstreamPort), nodeId: 'node-a', nodeAddress: `127.0.0.1:${a.internalPort}` });
    for (let i = 0; i < 4; i++) expect((await get(b.port, '/remote/y')).status).toBe(200);
    b.registry.removeRemote('tn_far');
    const r = await get(b.port, '/remote/y');
    expect([r.status, r.headers['warren-error-code']]).toEqual([503, 'ERR_WARREN_7003']);
    b.registry.removeRemote('tn_gone');
    b.registry.addRemote({ ...tcpTunnel('tn_far', { app: 'far' }, () => upstreamPort), nodeId: 'node-a', nodeAddress: `127.0.0.1:${a.internalPort}` });
  });

  it('skips a node that cannot be reached for one that can, and says so when none can', async () => {
    // A closed port: the "node" refuses connections.
    const dead = net.createServer();
    const deadPort = await listen(dead);
    await new Promise<void>((r) => dead.close(() => r()));
    b.registry.addRemote({ ...tcpTunnel('tn_dead', { app: 'far' }, () => upstreamPort), nodeId: 'node-x', nodeAddress: `127.0.0.1:${deadPort}` });
    for (let i = 0; i < 4; i++) expect((await get(b.port, '/remote/z')).status).toBe(200);
    b.registry.removeRemote('tn_far');
    const r = await get(b.port, '/remote/z');
    expect([r.status, r.headers['warren-error-code']]).toEqual([502, 'ERR_WARREN_7004']);
    expect(JSON.parse(r.body.toString()).msg).toContain('unreachable');
    b.registry.removeRemote('tn_dead');
    b.registry.addRemote({ ...tcpTunnel('tn_far', { app: 'far' }, () => upstreamPort), nodeId: 'node-a', nodeAddress: `127.0.0.1:${a.internalPort}` });
  });

  it('passes upgrades through, locally and across a hop', async () => {
    for (const port of [a.port, b.port]) {
      const path = port === a.port ? '/api/ws' : '/remote/ws';
      const echoed = await upgradeEcho(port, 'app.test', path);
      expect(echoed).toMatch(/^HTTP\/1.1 101/);
      expect(echoed.endsWith('ping')).toBe(true);
    }
  });

  it('joins an upgrade only once the upstream switched protocols: a plain answer is relayed and the connection closed (no smuggling)', async () => {
    // The raw upstream answers any request as plain HTTP and keeps reading the connection, like
    // an app with no WebSocket handler. Were the two sides joined at once, the second request
    // below would reach it unrouted and unchecked.
    for (const port of [a.port, c.port]) {
      const before = rawPaths.length;
      const answer = await new Promise<string>((resolve, reject) => {
        const sock = net.connect(port, '127.0.0.1');
        let got = '';
        sock.on('data', (d: Buffer) => {
          if (!got) setTimeout(() => sock.write('GET /raw/smuggled HTTP/1.1\r\nHost: app.test\r\n\r\n'), 50);
          got += d.toString('latin1');
        });
        sock.on('error', reject);
        sock.on('close', () => resolve(got));
        // /raw/hopbyhop: 200, Content-Length 2, the connection kept open for more requests.
        sock.write('GET /raw/hopbyhop HTTP/1.1\r\nHost: app.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n');
        setTimeout(() => sock.destroy(), 5_000);
      });
      expect(answer, `port ${port}`).toMatch(/^HTTP\/1\.1 200 OK\r\n/);
      const head = answer.slice(0, answer.indexOf('\r\n\r\n')).toLowerCase().split('\r\n').slice(1).sort();
      // The upstream's own headers, less the hop's (Connection, Keep-Alive, what Connection lists, X-Warren-*).
      expect(head).toEqual(['connection: close', 'content-length: 2', 'x-public: 1']);
      expect(answer.endsWith('\r\n\r\nok')).toBe(true);
      expect(rawPaths.slice(before)).toEqual(['/raw/hopbyhop']);
    }
    // An upstream that switches still gets the connection (and the client's early bytes).
    expect(await upgradeEcho(a.port, 'app.test', '/api/ws')).toMatch(/^HTTP\/1.1 101[\s\S]*ping$/);
  });

  it('counts requests by edge, route and status', async () => {
    const text = await a.metrics.registry.getSingleMetricAsString('warren_ingress_requests_total');
    expect(text).toMatch(/edge="edghts_1",route="r_api",status="200"/);
    expect(text).toMatch(/edge="",route="",status="404"/);
  });

  it('answers 502 (not a crash) when a request stage throws', async () => {
    const r = await get(c.port, '/api/x', { headers: { 'x-throw': '1' } });
    expect([r.status, r.headers['warren-error-code']]).toEqual([502, 'ERR_WARREN_7004']);
    expect((await get(c.port, '/api/x')).status).toBe(200);
  });

  it('runs a route pipeline: request stages (with the buffered body), response stages, body transforms and results', async () => {
    const denied = await get(c.port, '/api/x', { headers: { 'x-deny': '1' } });
    // A stage's own answer goes through the response stages as an upstream response would (head edits and body transforms).
    expect([denied.status, denied.headers['x-why'], denied.headers['x-stage'], denied.body.toString()]).toEqual([451, 'test', 'yes', 'DENIED BY TEST']);
    const r = await get(c.port, '/api/x', { method: 'POST', body: Buffer.from('hello') });
    expect(r.status).toBe(200);
    expect(r.headers['x-stage']).toBe('yes');
    const body = JSON.parse(r.body.toString().toLowerCase());
    expect(body['headers']['x-body-seen']).toBe('5');
    expect(body['bytes']).toBe(5);
    expect(results).toContain(200);
    const offline = await get(c.port, '/none');
    expect(offline.status).toBe(503);
    expect(results).toContain('error');
    const big = await get(c.port, '/api/big-upload', { method: 'POST', body: Buffer.alloc(1024 * 1024 + 1) });
    expect([big.status, big.headers['warren-error-code']]).toEqual([413, 'ERR_WARREN_7009']);
  });
});
