import http from 'node:http';
import net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { createLogger, type DataPlaneConfig } from '@warren/shared';
import { TunnelStreamError, type ProxyHeaderInit, type TunnelStream } from '../agents/server.js';
import { createIngressMetrics } from '../metrics.js';
import { TunnelRegistry } from '../tunnels/registry.js';
import { tcpTunnel } from '../tunnels/testing.js';
import { errorAnswer } from './error-page.js';
import { forwardErrorOf, Forwarder } from './proxy.js';
import { PublicHandler } from './public.js';
import { RoutingTable } from './routing.js';
import { listen } from './testing.js';

/**
 * How the public side answers a client whose address holds its share of the tunnel's session
 * (MAX_STREAMS_PER_CLIENT, the agent connection's 'CLIENT_STREAM_CAP'): 429 ERR_WARREN_7014 with
 * Retry-After: 1, for requests and upgrades alike. And the stream a request with a body opens
 * carries that request's client address (undici opens it a microtask after the dispatch), so its
 * slot counts against the right client.
 */
const log = createLogger('test', 'silent');
const closers: Array<() => unknown> = [];
afterEach(async () => {
  while (closers.length) await closers.pop()!();
});

const cfg: DataPlaneConfig = {
  version: 1,
  edges: new Map([['edghts_1', { id: 'edghts_1', accountId: 'ac_1', hostports: ['share.test:443'], mutualTls: null, tlsTermination: null }]]),
  routes: new Map([['r_all', { id: 'r_all', accountId: 'ac_1', edgeId: 'edghts_1', matchType: 'path_prefix', match: '/', modules: {}, backendId: 'bkdtg_share', ipPolicyIds: [], trafficPolicy: null }]]),
  backends: new Map([['bkdtg_share', { id: 'bkdtg_share', accountId: 'ac_1', labels: { app: 'share' } }]]),
  ipPolicies: new Map(),
  certificateAuthorities: new Map(),
  credentials: new Map(),
  credentialsByTokenHash: new Map(),
  eventSubscriptions: new Map(),
};

/** A public listener in front of one tunnel (streams: TCP to an echoing upstream) that refuses `refused` addresses as the agent connection would. */
async function setup(refused: (clientAddr: string) => boolean) {
  const upstream = http.createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.on('end', () => res.end(`got ${Buffer.concat(parts).length}`));
  });
  upstream.on('upgrade', (_req, socket: net.Socket) => socket.end('HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n'));
  const upstreamPort = await listen(upstream);
  closers.push(() => {
    upstream.closeAllConnections();
    upstream.close();
  });
  const registry = new TunnelRegistry('n1');
  const metrics = createIngressMetrics('n1');
  const forwarder = new Forwarder({ registry, hopToken: 'secret', log, upstreamTimeoutMs: 3000, maxStreamsPerTunnel: 8, maxQueuedPerTunnel: 100 });
  const handler = new PublicHandler({ registry, forwarder, metrics, log });
  handler.setTable(new RoutingTable(cfg));
  const pub = http.createServer(handler.handler('http'));
  pub.on('upgrade', handler.upgradeHandler('http'));
  const port = await listen(pub);
  closers.push(() => {
    pub.closeAllConnections();
    pub.close();
    forwarder.close();
  });
  /** The client address of each stream opened, in order. */
  const opened: string[] = [];
  const open = (h: ProxyHeaderInit): TunnelStream => {
    opened.push(h.clientAddr);
    if (refused(h.clientAddr)) throw new TunnelStreamError('CLIENT_STREAM_CAP', 'this client has too many requests open to this tunnel: 5 at most from one address (MAX_STREAMS_PER_CLIENT)');
    return net.connect(upstreamPort, '127.0.0.1') as unknown as TunnelStream;
  };
  registry.addLocal(
    tcpTunnel('tn_share', { app: 'share' }, () => upstreamPort, {
      openStreamSync: open,
      openStream: (h) => {
        try {
          return Promise.resolve(open(h));
        } catch (err) {
          return Promise.reject(err as Error);
        }
      },
    }),
  );
  return { port, opened };
}

function request(port: number, opts: { localAddress?: string; method?: string; body?: string; slowBody?: boolean } = {}) {
  return new Promise<{ status: number; headers: http.IncomingHttpHeaders; body: string; localPort: number }>((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, localAddress: opts.localAddress, path: '/x', method: opts.method ?? 'GET', agent: false, headers: { host: 'share.test', accept: 'application/json' } }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body, localPort }));
    });
    let localPort = 0;
    req.on('socket', (s) => s.on('connect', () => (localPort = s.localPort!)));
    req.on('error', reject);
    if (opts.slowBody) {
      // The body is still streaming when the ingress dispatches the request.
      req.setHeader('content-length', '6');
      req.flushHeaders();
      req.write('abc');
      setTimeout(() => req.end('def'), 100);
    } else req.end(opts.body);
  });
}

describe('a client past its share of the session', () => {
  it('maps CLIENT_STREAM_CAP to 429 ERR_WARREN_7014 with Retry-After: 1, a retryable error (nothing was sent)', () => {
    const fe = forwardErrorOf(Object.assign(new Error('this client has too many requests open to this tunnel'), { code: 'CLIENT_STREAM_CAP' }), false);
    expect(fe).toMatchObject({ code: 7014, retry: 'any', message: 'this client has too many requests open to this tunnel' });
    const a = errorAnswer('application/json', 7014);
    expect(a.status).toBe(429);
    expect(a.headers['retry-after']).toBe('1');
    expect(a.headers['warren-error-code']).toBe('ERR_WARREN_7014');
    expect(JSON.parse(a.body).msg).toMatch(/too many requests open to this tunnel/);
    // Other answers carry no Retry-After of ours.
    expect(errorAnswer(undefined, 7006).headers['retry-after']).toBeUndefined();
  });

  it('is answered 429 with Retry-After: 1 while another address is served; an upgrade too', async () => {
    const { port } = await setup((addr) => addr.startsWith('127.0.0.2:'));
    const refused = await request(port, { localAddress: '127.0.0.2' });
    expect(refused.status).toBe(429);
    expect(refused.headers['retry-after']).toBe('1');
    expect(refused.headers['warren-error-code']).toBe('ERR_WARREN_7014');
    expect(JSON.parse(refused.body)).toMatchObject({ error_code: 'ERR_WARREN_7014', status_code: 429 });
    expect(JSON.parse(refused.body).msg).toMatch(/too many requests open to this tunnel/);
    const served = await request(port, { localAddress: '127.0.0.1' });
    expect(served).toMatchObject({ status: 200, body: 'got 0' });

    const raw = await new Promise<string>((resolve, reject) => {
      const s = net.connect({ port, host: '127.0.0.1', localAddress: '127.0.0.2' }, () => s.write('GET /ws HTTP/1.1\r\nHost: share.test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n'));
      let buf = '';
      s.on('data', (c: Buffer) => (buf += c.toString()));
      s.on('end', () => resolve(buf));
      s.on('error', reject);
    });
    expect(raw).toMatch(/^HTTP\/1.1 429 Too Many Requests\r\n/);
    expect(raw).toMatch(/\r\nretry-after: 1\r\n/i);
    expect(raw).toContain('ERR_WARREN_7014');
  });

  it('a request whose body is still streaming opens its stream with its own client address', async () => {
    const { port, opened } = await setup((addr) => addr.startsWith('127.0.0.2:'));
    // A client past its share is refused for its POSTs too, not let through as "no client".
    const refused = await request(port, { method: 'POST', slowBody: true, localAddress: '127.0.0.2' });
    expect(refused.status).toBe(429);
    expect(refused.headers['retry-after']).toBe('1');
    const served = await request(port, { method: 'POST', slowBody: true });
    expect(served).toMatchObject({ status: 200, body: 'got 6' });
    expect(opened).toEqual([`127.0.0.2:${refused.localPort}`, `127.0.0.1:${served.localPort}`]);
    expect(opened).not.toContain('0.0.0.0:0');
  });
});
