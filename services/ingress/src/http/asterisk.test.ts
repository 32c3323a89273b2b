import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger, type DataPlaneConfig } from '@warren/shared';
import { createIngressMetrics } from '../metrics.js';
import { pipelineStageFactories } from '../modules/index.js';
import { FakeLimiter } from '../policy/testing.js';
import { listen, startPublicListener } from './testing.js';

/**
 * `OPTIONS *` (RFC 9112 §3.2.4) through a public listener to a tunnel whose streams are TCP
 * connections to a raw upstream: the upstream gets `OPTIONS *` as the client sent it (on a
 * connection of its own, closed after the answer) and its answer is relayed; when it does not
 * answer in time, answers garbage or hangs up, the client gets a clear error, not a hang.
 */

const log = createLogger('test', 'silent');
const closers: Array<() => void> = [];
let port = 0;
/** What the upstream does with the next request. */
let mode: 'answer' | 'hang' | 'garbage' | 'close' = 'answer';
/** Each request head (with its body, if any) the upstream read. */
const heads: string[] = [];

const cfg: DataPlaneConfig = {
  version: 1,
  edges: new Map([['edghts_1', { id: 'edghts_1', accountId: 'ac_1', hostports: ['app.test:443'], mutualTls: null, tlsTermination: null }]]),
  routes: new Map([['r_root', { id: 'r_root', accountId: 'ac_1', edgeId: 'edghts_1', matchType: 'path_prefix', match: '/', modules: {}, backendId: 'bkdtg_up', ipPolicyIds: [], trafficPolicy: null }]]),
  backends: new Map([['bkdtg_up', { id: 'bkdtg_up', accountId: 'ac_1', labels: { app: 'up' } }]]),
  ipPolicies: new Map(),
  certificateAuthorities: new Map(),
  credentials: new Map(),
  credentialsByTokenHash: new Map(),
  eventSubscriptions: new Map(),
};

beforeAll(async () => {
  const upstream = net.createServer((sock) => {
    sock.on('error', () => {});
    let buf = '';
    sock.on('data', (c: Buffer) => {
      buf += c.toString('latin1');
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      const cl = /\r\ncontent-length: *(\d+)/i.exec(buf.slice(0, end));
      if (cl && buf.length < end + 4 + Number(cl[1])) return;
      heads.push(buf);
      buf = '';
      if (mode === 'answer') sock.write('HTTP/1.1 200 OK\r\nAllow: GET, OPTIONS\r\nContent-Length: 2\r\n\r\nok');
      else if (mode === 'garbage') sock.end('NOT HTTP AT ALL\r\n\r\n');
      else if (mode === 'close') sock.destroy();
    });
  });
  const upstreamPort = await listen(upstream);
  const pub = await startPublicListener({ cfg, stages: pipelineStageFactories, limiter: new FakeLimiter(), metrics: createIngressMetrics('n1'), log, labels: { app: 'up' }, upstreamPort });
  port = pub.port;
  closers.push(() => {
    pub.close();
    upstream.close();
  });
});

afterAll(() => {
  for (const c of closers) c();
});

/** Sends `raw` on a new connection; the answer once the ingress closes it or 8 s pass. */
function send(raw: string): Promise<string> {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1', () => sock.write(raw));
    let out = '';
    const timer = setTimeout(() => sock.destroy(), 8000);
    sock.on('data', (c: Buffer) => (out += c.toString('latin1')));
    sock.on('error', () => {});
    sock.on('close', () => {
      clearTimeout(timer);
      resolve(out);
    });
  });
}

describe('OPTIONS *', () => {
  it('goes upstream as it is, on a connection of its own, and its answer comes back', async () => {
    mode = 'answer';
    const from = heads.length;
    const out = await send('OPTIONS * HTTP/1.1\r\nHost: app.test\r\nX-Mine: 1\r\nConnection: close\r\n\r\n');
    expect(out).toMatch(/^HTTP\/1\.1 200 OK\r\n/);
    expect(out.toLowerCase()).toContain('allow: get, options');
    expect(out.endsWith('\r\n\r\nok')).toBe(true);
    const head = heads[from]!;
    expect(head.startsWith('OPTIONS * HTTP/1.1\r\n')).toBe(true);
    expect(head).toContain('\r\nHost: app.test\r\n');
    expect(head).toContain('\r\nX-Mine: 1\r\n');
    expect(head.toLowerCase()).toContain('\r\nconnection: close\r\n');
    expect(head.toLowerCase()).toContain('\r\nx-forwarded-for: 127.0.0.1\r\n');
  });

  it('carries a body with its length, chunked when the client sent it chunked', async () => {
    mode = 'answer';
    const from = heads.length;
    expect(await send('OPTIONS * HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello')).toMatch(/^HTTP\/1\.1 200 /);
    expect(heads[from]!.toLowerCase()).toContain('\r\ncontent-length: 5\r\n');
    expect(heads[from]!.endsWith('\r\n\r\nhello')).toBe(true);
    expect(await send('OPTIONS * HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n')).toMatch(/^HTTP\/1\.1 200 /);
    expect(heads[from + 1]!.toLowerCase()).toContain('\r\ntransfer-encoding: chunked\r\n');
  });

  it('answers 502 when the upstream answers garbage or hangs up, 504 when it does not answer in time', async () => {
    mode = 'garbage';
    expect(await send('OPTIONS * HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n')).toMatch(/^HTTP\/1\.1 502 [^]*warren-error-code: ERR_WARREN_7004/i);
    mode = 'close';
    expect(await send('OPTIONS * HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n')).toMatch(/^HTTP\/1\.1 502 [^]*warren-error-code: ERR_WARREN_7004/i);
    mode = 'hang';
    expect(await send('OPTIONS * HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n')).toMatch(/^HTTP\/1\.1 504 [^]*warren-error-code: ERR_WARREN_7005/i);
  });

  it('another method with * is a 400 that never reaches the upstream', async () => {
    const from = heads.length;
    for (const m of ['GET', 'POST', 'PUT']) {
      expect(await send(`${m} * HTTP/1.1\r\nHost: app.test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n`)).toMatch(/^HTTP\/1\.1 400 [^]*warren-error-code: ERR_WARREN_7011/i);
    }
    expect(heads.length).toBe(from);
  });
});
