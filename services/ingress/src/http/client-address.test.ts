import http from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger, type DataPlaneConfig } from '@warren/shared';
import { createIngressMetrics } from '../metrics.js';
import { pipelineStageFactories } from '../modules/index.js';
import { FakeLimiter } from '../policy/testing.js';
import { TrafficEvents } from '../events/traffic-events.js';
import { remoteIp } from './client-address.js';
import { capturingPublisher, listen, startPublicListener } from './testing.js';

/**
 * A dual-stack public listener (`::`) sees an IPv4 client as `::ffff:a.b.c.d`; policies, the
 * forwarding headers, rate-limit keys and traffic events show it as `a.b.c.d`, as an IPv4
 * listener (and ngrok) would.
 */

const log = createLogger('test', 'silent');
const closers: Array<() => void> = [];

const cfg: DataPlaneConfig = {
  version: 1,
  edges: new Map([['edghts_1', { id: 'edghts_1', accountId: 'ac_1', hostports: ['app.test:443'], mutualTls: null, tlsTermination: null }]]),
  routes: new Map([
    [
      'r_ip',
      {
        id: 'r_ip', accountId: 'ac_1', edgeId: 'edghts_1', matchType: 'path_prefix', match: '/', modules: {}, backendId: 'bkdtg_up', ipPolicyIds: [],
        trafficPolicy: {
          enabled: true,
          value: {
            inbound: [
              { expressions: ["conn.client_ip == '127.0.0.1'"], actions: [{ type: 'add-headers', config: { headers: { 'x-ipv4-rule': 'matched' } } }] },
              { actions: [{ type: 'add-headers', config: { headers: { 'x-client-ip': '${conn.client_ip}' } } }] },
              { actions: [{ type: 'rate-limit', config: { name: 'ip', algorithm: 'sliding_window', capacity: 100, rate: '60s', bucket_key: ['conn.client_ip'] } }] },
            ],
            outbound: [{ actions: [{ type: 'add-headers', config: { headers: { 'x-bucket': '${actions.ngrok.rate_limit.bucket_key}' } } }] }],
          },
        },
      },
    ],
  ]),
  backends: new Map([['bkdtg_up', { id: 'bkdtg_up', accountId: 'ac_1', labels: { app: 'up' } }]]),
  ipPolicies: new Map(),
  certificateAuthorities: new Map(),
  credentials: new Map(),
  credentialsByTokenHash: new Map(),
  eventSubscriptions: new Map([['esb_1', { id: 'esb_1', accountId: 'ac_1', types: ['http_request_complete.v0'], destinations: [{ id: 'ed_1', kind: 'datadog' }] }]]),
};

const { publisher, published } = capturingPublisher();

let port = 0;

beforeAll(async () => {
  const upstream = http.createServer((req, res) => {
    req.resume();
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify(req.headers));
  });
  const upstreamPort = await listen(upstream);
  const metrics = createIngressMetrics('n1');
  const events = new TrafficEvents({ publisher, metrics: metrics.events, log, maxQueued: 1000, flushMs: 5 });
  events.setConfig(cfg);
  const pub = await startPublicListener({ cfg, stages: pipelineStageFactories, limiter: new FakeLimiter(), metrics, log, events, labels: { app: 'up' }, upstreamPort, host: '::' });
  port = pub.port;
  closers.push(() => {
    pub.close();
    upstream.closeAllConnections();
    upstream.close();
  });
});

afterAll(() => {
  for (const c of closers) c();
});

describe('the client address on a dual-stack listener', () => {
  it('normalises only IPv4-mapped addresses', () => {
    expect(remoteIp({ remoteAddress: '::ffff:127.0.0.1' })).toBe('127.0.0.1');
    expect(remoteIp({ remoteAddress: '::FFFF:10.1.2.3' })).toBe('10.1.2.3');
    expect(remoteIp({ remoteAddress: '::ffff:7f00:1' })).toBe('::ffff:7f00:1'); // not the dotted form Node reports
    expect(remoteIp({ remoteAddress: '::1' })).toBe('::1');
    expect(remoteIp({ remoteAddress: '2001:db8::1' })).toBe('2001:db8::1');
    expect(remoteIp({ remoteAddress: '192.0.2.1' })).toBe('192.0.2.1');
    expect(remoteIp({})).toBe('');
  });

  it('shows an IPv4 client as IPv4 to policies, the upstream, rate-limit keys and events', async () => {
    const r = await new Promise<{ headers: http.IncomingHttpHeaders; body: string }>((resolve, reject) => {
      const req = http.request({ port, host: '127.0.0.1', path: '/x', agent: false, headers: { host: 'app.test' } }, (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (body += c));
        res.on('end', () => resolve({ headers: res.headers, body }));
      });
      req.on('error', reject);
      req.end();
    });
    const seen = JSON.parse(r.body) as Record<string, string>;
    expect([seen['x-forwarded-for'], seen['x-client-ip'], seen['x-ipv4-rule']]).toEqual(['127.0.0.1', '127.0.0.1', 'matched']);
    expect(r.headers['x-bucket']).toBe('["127.0.0.1"]');
    await expect.poll(() => published.length).toBeGreaterThan(0);
    expect(published[0]!.object.conn.client_ip).toBe('127.0.0.1');
  });
});
