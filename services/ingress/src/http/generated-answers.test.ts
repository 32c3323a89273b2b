import http from 'node:http';
import net from 'node:net';
import zlib from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger, type DataPlaneConfig, type DpRoute } from '@warren/shared';
import { createIngressMetrics } from '../metrics.js';
import { pipelineStageFactories } from '../modules/index.js';
import { FakeLimiter } from '../policy/testing.js';
import { sendOutcome } from './public.js';
import { TrafficEvents } from '../events/traffic-events.js';
import { capturingPublisher, listen, startPublicListener } from './testing.js';

/**
 * A request stage's own answer (deny, custom-response, the rate-limit 429, a module's refusal)
 * goes through the route's response stages as the upstream's response does: the traffic
 * policy's outbound rules see `res.status_code` / `res.headers` of the answer and may edit or
 * replace it, response_headers applies, compression compresses a large one; the metrics record
 * the status sent. A route without response stages sends it as it is. 204 and 304 go out
 * without Content-Length or body.
 */

const log = createLogger('test', 'silent');
const closers: Array<() => void> = [];
const unhandled: unknown[] = [];
const onUnhandled = (err: unknown) => unhandled.push(err);


const BIG = 'x'.repeat(4096);

const policy = {
  inbound: [
    { expressions: ["req.url.path.startsWith('/tp/deny')"], actions: [{ type: 'deny' }] },
    { expressions: ["req.url.path.startsWith('/tp/teapot')"], actions: [{ type: 'custom-response', config: { status_code: 418, body: 'short and stout', headers: { 'x-own': 'mine', 'content-type': 'text/plain' } } }] },
    { expressions: ["req.url.path.startsWith('/tp/empty')"], actions: [{ type: 'custom-response', config: { status_code: 204, body: 'hello' } }] },
    { expressions: ["req.url.path.startsWith('/tp/big')"], actions: [{ type: 'custom-response', config: { status_code: 200, body: BIG, headers: { 'content-type': 'text/plain' } } }] },
    { expressions: ["req.url.path.startsWith('/tp/rl')"], actions: [{ type: 'rate-limit', config: { name: 'one', algorithm: 'sliding_window', capacity: 1, rate: '60s', bucket_key: ['req.host'] } }] },
  ],
  outbound: [
    { actions: [{ type: 'add-headers', config: { headers: { 'x-out': "ran ${res.status_code} own=${size(getResHeader('x-own')) > 0 ? getResHeader('x-own')[0] : ''}" } } }] },
    { expressions: ['actions.ngrok.rate_limit.limited'], actions: [{ type: 'add-headers', config: { headers: { 'x-limited': 'yes' } } }] },
    { expressions: ["res.status_code == 418 && req.url.path.endsWith('/strip')"], actions: [{ type: 'remove-headers', config: { headers: ['x-own'] } }] },
    { expressions: ["res.status_code == 418 && req.url.path.endsWith('/replace')"], actions: [{ type: 'custom-response', config: { status_code: 200, body: 'replaced' } }] },
    { expressions: ["res.status_code == 403 && req.url.path.endsWith('/allow')"], actions: [{ type: 'deny', config: { status_code: 451 } }] },
  ],
};

const route = (id: string, match: string, modules: Record<string, unknown>, trafficPolicy: unknown = null): [string, DpRoute] => [
  id,
  { id, accountId: 'ac_1', edgeId: 'edghts_1', matchType: 'path_prefix', match, modules, backendId: 'bkdtg_up', ipPolicyIds: [], trafficPolicy: trafficPolicy ? { enabled: true, value: trafficPolicy } : null },
];

const cfg: DataPlaneConfig = {
  version: 1,
  edges: new Map([['edghts_1', { id: 'edghts_1', accountId: 'ac_1', hostports: ['app.test:443'], mutualTls: null, tlsTermination: null }]]),
  routes: new Map([
    route('r_tp', '/tp', { response_headers: { add: { 'x-rh': 'yes' } }, compression: { enabled: true } }, policy),
    // Only inbound rules and no response module: answers go out as they are.
    route('r_in', '/in', {}, {
      inbound: [
        { expressions: ["req.url.path.startsWith('/in/deny')"], actions: [{ type: 'deny' }] },
        { expressions: ["req.url.path.startsWith('/in/empty')"], actions: [{ type: 'custom-response', config: { status_code: 204, body: 'hello' } }] },
      ],
    }),
    // A module's refusal (user_agent_filter) on a route with outbound rules and response_headers.
    route('r_mod', '/mod', { user_agent_filter: { deny: ['(?i)^refused'] }, response_headers: { add: { 'x-rh': 'yes' } } }, { outbound: [{ actions: [{ type: 'add-headers', config: { headers: { 'x-out': 'ran ${res.status_code}' } } }] }] }),
  ]),
  backends: new Map([['bkdtg_up', { id: 'bkdtg_up', accountId: 'ac_1', labels: { app: 'up' } }]]),
  ipPolicies: new Map(),
  certificateAuthorities: new Map(),
  credentials: new Map(),
  credentialsByTokenHash: new Map(),
  eventSubscriptions: new Map([['esb_1', { id: 'esb_1', accountId: 'ac_1', types: ['http_request_complete.v0'], destinations: [{ id: 'ed_1', kind: 'datadog' }] }]]),
};

/** The http_request_complete.v0 events published. */
const { publisher, published } = capturingPublisher();

let port = 0;
let upstreamHits = 0;
const metrics = createIngressMetrics('n1');

beforeAll(async () => {
  process.on('unhandledRejection', onUnhandled);
  const upstream = http.createServer((req, res) => {
    upstreamHits++;
    req.resume();
    res.writeHead(200, { 'content-type': 'text/plain' });
    res.end('from upstream');
  });
  const upstreamPort = await listen(upstream);
  const events = new TrafficEvents({ publisher, metrics: metrics.events, log, maxQueued: 1000, flushMs: 5 });
  events.setConfig(cfg);
  const pub = await startPublicListener({ cfg, stages: pipelineStageFactories, limiter: new FakeLimiter(), metrics, log, events, labels: { app: 'up' }, upstreamPort });
  port = pub.port;
  closers.push(() => {
    pub.close();
    upstream.closeAllConnections();
    upstream.close();
  });
});

afterAll(() => {
  for (const c of closers) c();
  process.off('unhandledRejection', onUnhandled);
});

interface Got {
  status: number;
  headers: http.IncomingHttpHeaders;
  raw: Buffer;
  body: string;
}

function get(path: string, o: { method?: string; headers?: Record<string, string> } = {}): Promise<Got> {
  return new Promise((resolve, reject) => {
    const req = http.request({ port, host: '127.0.0.1', path, method: o.method ?? 'GET', agent: false, headers: { host: 'app.test', ...o.headers } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const raw = Buffer.concat(chunks);
        resolve({ status: res.statusCode!, headers: res.headers, raw, body: raw.toString('latin1') });
      });
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

/** The requests counted for `route` with `status`. */
async function counted(route: string, status: number): Promise<number> {
  const m = await metrics.registry.getSingleMetric('warren_ingress_requests_total')!.get();
  return m.values.find((v) => v.labels.route === route && v.labels.status === String(status))?.value ?? 0;
}

describe('outbound rules and response stages on a stage answer', () => {
  it("the upstream's response: outbound rules and response_headers as before", async () => {
    const r = await get('/tp/ok');
    expect([r.status, r.headers['x-out'], r.headers['x-rh'], r.body]).toEqual([200, 'ran 200 own=', 'yes', 'from upstream']);
  });

  it('an inbound deny: the outbound rules see its status; response_headers applies; counted as 403', async () => {
    const before = await counted('r_tp', 403);
    const hits = upstreamHits;
    const r = await get('/tp/deny');
    expect([r.status, r.headers['x-out'], r.headers['x-rh']]).toEqual([403, 'ran 403 own=', 'yes']);
    expect(Number(r.headers['content-length'])).toBe(r.raw.length);
    expect(upstreamHits).toBe(hits);
    expect(await counted('r_tp', 403)).toBe(before + 1);
  });

  it('a custom-response: res.headers are its own; an outbound remove-headers edits it', async () => {
    const r = await get('/tp/teapot');
    expect([r.status, r.headers['x-out'], r.headers['x-own'], r.body]).toEqual([418, 'ran 418 own=mine', 'mine', 'short and stout']);
    const stripped = await get('/tp/teapot/strip');
    expect([stripped.status, stripped.headers['x-out'], stripped.headers['x-own'], stripped.body]).toEqual([418, 'ran 418 own=mine', undefined, 'short and stout']);
  });

  it('an outbound custom-response or deny replaces the answer (once: no second pass), and the metrics count what was sent', async () => {
    const before = await counted('r_tp', 200);
    const r = await get('/tp/teapot/replace');
    // As on an upstream response: the replacing answer is sent as it is (what response_headers and earlier rules set is gone).
    expect([r.status, r.body, r.headers['x-own'], r.headers['x-rh'], r.headers['x-out']]).toEqual([200, 'replaced', undefined, undefined, undefined]);
    expect(await counted('r_tp', 200)).toBe(before + 1);
    const d = await get('/tp/deny/allow');
    expect(d.status).toBe(451);
    expect(await counted('r_tp', 451)).toBe(1);
    // The traffic event too: the status the client got, not the inbound deny's 403.
    await new Promise((r) => setTimeout(r, 50));
    const ev = published.find((e) => e.object.http.request.url.path === '/tp/deny/allow');
    expect(ev?.object.http.response.status_code).toBe(451);
  });

  it('the rate-limit 429: later outbound rules see actions.ngrok.rate_limit.limited', async () => {
    const first = await get('/tp/rl');
    expect([first.status, first.headers['x-limited'], first.headers['x-out']]).toEqual([200, undefined, 'ran 200 own=']);
    const limited = await get('/tp/rl');
    expect([limited.status, limited.headers['x-limited'], limited.headers['x-out'], limited.headers['x-rh']]).toEqual([429, 'yes', 'ran 429 own=', 'yes']);
    expect(limited.headers['retry-after']).toBe('13');
    await new Promise((r) => setTimeout(r, 50));
    const ev = published.filter((e) => e.object.http.request.url.path === '/tp/rl').at(-1);
    expect(ev?.object.http.response.status_code).toBe(429);
    expect(ev?.object.warren).toMatchObject({ rate_limited: true, tunnel_id: null });
  });

  it('a 204 answer: no Content-Length and no body, the outbound rules still run', async () => {
    const r = await get('/tp/empty');
    expect([r.status, r.headers['content-length'], r.headers['transfer-encoding'], r.raw.length, r.headers['x-out']]).toEqual([204, undefined, undefined, 0, 'ran 204 own=']);
  });

  it('HEAD: the Content-Length a GET would get, no body', async () => {
    const r = await get('/tp/deny', { method: 'HEAD' });
    const g = await get('/tp/deny');
    expect([r.status, r.headers['content-length'], r.raw.length, r.headers['x-out']]).toEqual([403, String(g.raw.length), 0, 'ran 403 own=']);
  });

  it('a large answer is compressed by the compression module, as an upstream response would be', async () => {
    const r = await get('/tp/big', { headers: { 'accept-encoding': 'gzip' } });
    expect([r.status, r.headers['content-encoding'], r.headers['content-length'], r.headers['x-out']]).toEqual([200, 'gzip', undefined, 'ran 200 own=']);
    expect(zlib.gunzipSync(r.raw).toString()).toBe(BIG);
    const plain = await get('/tp/big');
    expect([plain.headers['content-encoding'], plain.headers['content-length'], plain.body]).toEqual([undefined, String(BIG.length), BIG]);
  });

  it("a module's refusal goes through the outbound rules and response_headers too", async () => {
    const r = await get('/mod/x', { headers: { 'user-agent': 'refused/1' } });
    expect([r.status, r.headers['warren-error-code'], r.headers['x-out'], r.headers['x-rh']]).toEqual([403, 'ERR_WARREN_7101', 'ran 403', 'yes']);
  });

  it('a route without response stages sends the answer as it is; 204 without Content-Length', async () => {
    const d = await get('/in/deny');
    expect([d.status, d.headers['x-out'], Number(d.headers['content-length'])]).toEqual([403, undefined, d.raw.length]);
    const e = await get('/in/empty');
    expect([e.status, e.headers['content-length'], e.raw.length]).toEqual([204, undefined, 0]);
    expect(await counted('r_in', 204)).toBe(1);
  });

  it('nothing was left unhandled', () => {
    expect(unhandled).toEqual([]);
  });
});

describe('sendOutcome', () => {
  const server = http.createServer((req, res) => {
    const status = Number(req.url!.slice(1));
    sendOutcome(req, res, { status, headers: { 'x-a': ['1', '2'], ...(status === 304 ? { 'content-length': '10' } : {}) }, body: 'hello' });
  });
  let p = 0;
  beforeAll(async () => {
    p = await listen(server);
  });
  afterAll(() => server.close());

  const raw = (path: string, method = 'GET') =>
    new Promise<string>((resolve, reject) => {
      const s = net.connect(p, '127.0.0.1', () => s.write(`${method} ${path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`));
      const chunks: Buffer[] = [];
      s.on('data', (c: Buffer) => chunks.push(c));
      s.on('end', () => resolve(Buffer.concat(chunks).toString('latin1')));
      s.on('error', reject);
    });

  it('204 and 304: no Content-Length (a stated one dropped), no body, no chunked framing', async () => {
    for (const status of [204, 304]) {
      const text = await raw(`/${status}`);
      expect(text.startsWith(`HTTP/1.1 ${status} `)).toBe(true);
      expect(text.toLowerCase()).not.toContain('content-length');
      expect(text.toLowerCase()).not.toContain('transfer-encoding');
      expect(text.endsWith('\r\n\r\n')).toBe(true);
      expect(text.match(/x-a: \d/g)).toEqual(['x-a: 1', 'x-a: 2']);
    }
  });

  it('200: Content-Length and body; HEAD: the same Content-Length, no body', async () => {
    const text = await raw('/200');
    expect(text).toContain('content-length: 5\r\n');
    expect(text.endsWith('\r\n\r\nhello')).toBe(true);
    const head = await raw('/200', 'HEAD');
    expect(head).toContain('content-length: 5\r\n');
    expect(head.endsWith('\r\n\r\n')).toBe(true);
  });
});
