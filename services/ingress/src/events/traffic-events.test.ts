import http from 'node:http';
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Counter, Registry } from 'prom-client';
import { createLogger, decodeTrafficPolicy, isId, rfc3339, type DataPlaneConfig, type DestinationRef, type DpEventSubscription, type DpRoute, type EventEnvelope, type PublishItem } from '@warren/shared';
import { createIngressMetrics } from '../metrics.js';
import { TunnelRegistry } from '../tunnels/registry.js';
import { tcpTunnel } from '../tunnels/testing.js';
import { Forwarder } from '../http/proxy.js';
import { PublicHandler } from '../http/public.js';
import { RoutingTable } from '../http/routing.js';
import { createPipelineCompiler } from '../pipeline/runner.js';
import { pipelineStageFactories } from '../modules/index.js';
import { FakeLimiter } from '../policy/testing.js';
import { NO_DESTINATIONS, TrafficSubscriptionIndex } from './subscriptions.js';
import { HTTP_REQUEST_COMPLETE, TCP_CONNECTION_CLOSED, TrafficEventQueue, TrafficEvents, eventTimestamp, trafficEnvelope, trafficTs, type EventPublisher } from './traffic-events.js';

const log = createLogger('test', 'silent');
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** Polls `fn`; the deadline only bounds a hang (a loaded machine may stall this process for seconds). */
async function waitFor(fn: () => boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!fn()) {
    if (Date.now() > deadline) throw new Error('timed out');
    await sleep(10);
  }
}

function counters() {
  const registry = new Registry();
  const emitted = new Counter({ name: 'emitted', help: 'x', registers: [registry] });
  const dropped = new Counter({ name: 'dropped', help: 'x', labelNames: ['reason'] as const, registers: [registry] });
  const value = async (c: Counter<string>, labels?: Record<string, string>) => {
    const v = (await c.get()).values.find((x) => !labels || Object.entries(labels).every(([k, l]) => x.labels[k] === l));
    return v?.value ?? 0;
  };
  return { metrics: { emitted, dropped }, emitted: () => value(emitted), dropped: (reason: string) => value(dropped, { reason }) };
}

/** A publisher that records every call and answers as told. */
class FakePublisher implements EventPublisher {
  calls: PublishItem[][] = [];
  inFlight = 0;
  maxInFlight = 0;
  delayMs = 0;
  fail: Error | null = null;
  overflowEvery = 0;
  async publish(items: PublishItem[]) {
    this.calls.push(items);
    this.inFlight++;
    this.maxInFlight = Math.max(this.maxInFlight, this.inFlight);
    try {
      if (this.delayMs) await sleep(this.delayMs);
      if (this.fail) throw this.fail;
      const n = items.reduce((s, i) => s + i.events.length, 0);
      const overflowed = this.overflowEvery ? Math.floor(n / this.overflowEvery) : 0;
      return { accepted: n - overflowed, overflowed };
    } finally {
      this.inFlight--;
    }
  }
  events(destId?: string): EventEnvelope[] {
    return this.calls.flatMap((c) => c.filter((i) => !destId || i.dest.id === destId).flatMap((i) => i.events.map((e) => JSON.parse(e) as EventEnvelope)));
  }
}

const D1: DestinationRef = { id: 'ed_1', kind: 'datadog' };
const D2: DestinationRef = { id: 'ed_2', kind: 'kinesis' };
const tcpObject = (n: number) => ({
  conn: { client_ip: '203.0.113.1', server_addr: '127.0.0.1', server_port: 443, start_ts: '', end_ts: '', bytes_in: n, bytes_out: 0 },
  warren: { edge_id: null, route_id: null, tunnel_id: null },
});
const env = (n: number) => trafficEnvelope(TCP_CONNECTION_CLOSED, 'ac_1', tcpObject(n), Date.UTC(2026, 2, 1, 9, 30, 12, 345));

describe('traffic event queue', () => {
  it('publishes after flushMs, grouped per destination, events in order, each serialized once', async () => {
    const pub = new FakePublisher();
    const c = counters();
    const q = new TrafficEventQueue({ publisher: pub, metrics: c.metrics, log, maxQueued: 100, flushMs: 30 });
    q.push([D1, D2], env(1));
    q.push([D2], env(2));
    q.push([D1], env(3));
    expect(pub.calls).toHaveLength(0);
    expect(q.held).toBe(3);
    await sleep(80);
    expect(pub.calls).toHaveLength(1);
    const [call] = pub.calls;
    expect(call!.map((i) => i.dest)).toEqual([D1, D2]);
    expect(call![0]!.events.map((e) => JSON.parse(e).object.conn.bytes_in)).toEqual([1, 3]);
    expect(call![1]!.events.map((e) => JSON.parse(e).object.conn.bytes_in)).toEqual([1, 2]);
    // The same event to two destinations is the same text (one id).
    expect(call![0]!.events[0]).toBe(call![1]!.events[0]);
    expect(await c.emitted()).toBe(4);
    expect(q.held).toBe(0);
  });

  it('publishes at once when the batch size is reached, with at most one publish in flight', async () => {
    const pub = new FakePublisher();
    pub.delayMs = 40;
    const q = new TrafficEventQueue({ publisher: pub, metrics: counters().metrics, log, maxQueued: 10_000, flushMs: 10_000, batchSize: 500 });
    for (let i = 0; i < 499; i++) q.push([D1], env(i));
    await sleep(5);
    expect(pub.calls).toHaveLength(0);
    q.push([D1], env(499));
    expect(pub.calls).toHaveLength(1);
    expect(pub.calls[0]![0]!.events).toHaveLength(500);
    // More batches while the first is in flight: they wait for it.
    for (let i = 0; i < 1200; i++) q.push([D1], env(500 + i));
    expect(pub.calls).toHaveLength(1);
    // Both publishes done (the second right after the first, ~80 ms, not after flushMs): polled,
    // as a stall of this process delays the second publish's timer behind the first's.
    await waitFor(() => q.held === 0);
    expect(pub.maxInFlight).toBe(1);
    expect(pub.events().map((e) => (e.object as { conn: { bytes_in: number } }).conn.bytes_in)).toEqual(Array.from({ length: 1700 }, (_, i) => i));
  });

  it('drops and counts what does not fit (queue_full), what Redis refuses (redis_error) and what overflows (buffer_full)', async () => {
    const pub = new FakePublisher();
    pub.delayMs = 30;
    const c = counters();
    const q = new TrafficEventQueue({ publisher: pub, metrics: c.metrics, log, maxQueued: 5, flushMs: 5, batchSize: 500 });
    for (let i = 0; i < 5; i++) expect(q.push([D1, D2], env(i))).toBe(true);
    expect(q.push([D1, D2], env(5))).toBe(false);
    expect(await c.dropped('queue_full')).toBe(2); // one event, two destinations
    await sleep(15);
    // Being published still counts against the bound.
    expect(q.held).toBe(5);
    expect(q.push([D1], env(6))).toBe(false);
    expect(await c.dropped('queue_full')).toBe(3);
    await sleep(40);
    expect(q.held).toBe(0);
    expect(await c.emitted()).toBe(10);

    pub.fail = new Error('Connection is closed.');
    q.push([D1, D2], env(7));
    q.push([D1], env(8));
    // The flush timer, then the publish's own delay: polled (a stall delays the chained timer).
    await waitFor(() => q.held === 0);
    expect(await c.dropped('redis_error')).toBe(3);
    expect(q.held).toBe(0);

    pub.fail = null;
    pub.overflowEvery = 2;
    q.push([D1, D2], env(9));
    await waitFor(() => q.held === 0);
    expect(await c.dropped('buffer_full')).toBe(1);
  });

  it('drains on close within its bound; later events are dropped as shutdown', async () => {
    const pub = new FakePublisher();
    pub.delayMs = 20;
    const c = counters();
    const q = new TrafficEventQueue({ publisher: pub, metrics: c.metrics, log, maxQueued: 10_000, flushMs: 10_000, batchSize: 500, maxPerPublish: 500 });
    for (let i = 0; i < 1200; i++) q.push([D1], env(i));
    // The bound is loose (the three publishes take ~60 ms): a drain cut short by it would leave events.
    expect(await q.close(10_000)).toBe(0);
    expect(pub.events()).toHaveLength(1200);
    expect(q.push([D1], env(0))).toBe(false);
    expect(await c.dropped('shutdown')).toBe(1);

    const slow = new FakePublisher();
    // A publish far longer than close's bound of 100 ms: a close that waited for it would take 5 s.
    slow.delayMs = 5_000;
    const c2 = counters();
    const q2 = new TrafficEventQueue({ publisher: slow, metrics: c2.metrics, log, maxQueued: 10_000, flushMs: 10_000, batchSize: 10, maxPerPublish: 10 });
    for (let i = 0; i < 30; i++) q2.push([D1], env(i));
    const t0 = Date.now();
    const left = await q2.close(100);
    expect(Date.now() - t0).toBeLessThan(2_500);
    expect(left).toBe(30); // 10 in flight, 20 queued and dropped
    expect(await c2.dropped('shutdown')).toBe(20);
  });
});

function sub(id: string, accountId: string, types: DpEventSubscription['types'], destinations: DestinationRef[]): DpEventSubscription {
  return { id, accountId, types, destinations };
}

describe('traffic subscription index', () => {
  it('maps account and type to destinations, each once, and shares one empty answer', () => {
    const subs = new Map([
      ['esb_2', sub('esb_2', 'ac_1', ['http_request_complete.v0'], [D2, D1])],
      ['esb_1', sub('esb_1', 'ac_1', ['http_request_complete.v0', 'tcp_connection_closed.v0'], [D1])],
      ['esb_3', sub('esb_3', 'ac_2', ['tcp_connection_closed.v0'], [D2])],
      ['esb_4', sub('esb_4', 'ac_3', ['http_request_complete.v0'], [])],
    ]);
    const idx = TrafficSubscriptionIndex.build(subs);
    expect(idx.trafficDestinations('ac_1', 'http_request_complete.v0')).toEqual([D1, D2]);
    expect(idx.trafficDestinations('ac_1', 'tcp_connection_closed.v0')).toEqual([D1]);
    expect(idx.trafficDestinations('ac_2', 'tcp_connection_closed.v0')).toEqual([D2]);
    expect(idx.trafficDestinations('ac_2', 'http_request_complete.v0')).toBe(NO_DESTINATIONS);
    expect(idx.trafficDestinations('ac_3', 'http_request_complete.v0')).toBe(NO_DESTINATIONS);
    expect(idx.trafficDestinations('ac_9', 'http_request_complete.v0')).toBe(NO_DESTINATIONS);
    expect(idx.accounts).toBe(2);
  });

  it('is rebuilt only when the config brings other subscriptions', () => {
    const subs = new Map([['esb_1', sub('esb_1', 'ac_1', ['http_request_complete.v0'], [D1])]]);
    const cfg = { eventSubscriptions: subs } as unknown as DataPlaneConfig;
    const a = TrafficSubscriptionIndex.forConfig(cfg, null);
    expect(TrafficSubscriptionIndex.forConfig({ ...cfg, version: 2 }, a)).toBe(a);
    const b = TrafficSubscriptionIndex.forConfig({ eventSubscriptions: new Map() } as unknown as DataPlaneConfig, a);
    expect(b).not.toBe(a);
    expect(b.trafficDestinations('ac_1', 'http_request_complete.v0')).toBe(NO_DESTINATIONS);
  });
});

// ------------------------------------------------------------------ through the public handler

const RL_POLICY = decodeTrafficPolicy(
  JSON.stringify({ inbound: [{ name: 'limit', actions: [{ type: 'rate-limit', config: { name: 'rl', algorithm: 'sliding_window', capacity: 2, rate: '60s', bucket_key: ['conn.client_ip'] } }] }] }),
);

function route(id: string, accountId: string, edgeId: string, match: string, backendId: string, trafficPolicy: unknown = null): [string, DpRoute] {
  return [id, { id, accountId, edgeId, matchType: 'path_prefix', match, modules: {}, backendId, ipPolicyIds: [], trafficPolicy: trafficPolicy ? { enabled: true, value: trafficPolicy } : null }];
}

function config(subs: DpEventSubscription[]): DataPlaneConfig {
  return {
    version: 1,
    edges: new Map([
      ['edghts_1', { id: 'edghts_1', accountId: 'ac_1', hostports: ['app.test:443'], mutualTls: null, tlsTermination: null }],
      ['edghts_2', { id: 'edghts_2', accountId: 'ac_2', hostports: ['other.test:443'], mutualTls: null, tlsTermination: null }],
    ]),
    routes: new Map([route('rt_rl', 'ac_1', 'edghts_1', '/rl', 'bkdtg_1', RL_POLICY), route('rt_plain', 'ac_1', 'edghts_1', '/plain', 'bkdtg_1'), route('rt_other', 'ac_2', 'edghts_2', '/', 'bkdtg_2')]),
    backends: new Map([
      ['bkdtg_1', { id: 'bkdtg_1', accountId: 'ac_1', labels: { app: 'up' } }],
      ['bkdtg_2', { id: 'bkdtg_2', accountId: 'ac_2', labels: { app: 'up2' } }],
    ]),
    ipPolicies: new Map(),
    certificateAuthorities: new Map(),
    credentials: new Map(),
    credentialsByTokenHash: new Map(),
    eventSubscriptions: new Map(subs.map((s) => [s.id, s])),
  };
}

describe('http_request_complete.v0 from the public handler', () => {
  const pub = new FakePublisher();
  let events: TrafficEvents;
  let port = 0;
  let upstream: http.Server;
  let server: http.Server;
  let forwarder: Forwarder;
  /** Called when a `slow` request reaches the upstream (through the edge). */
  let onSlow: () => void = () => {};

  beforeAll(async () => {
    upstream = http.createServer((req, res) => {
      const slow = req.url?.includes('slow') ?? false;
      if (slow) onSlow();
      req.resume();
      req.on('end', () => {
        setTimeout(() => {
          if (res.destroyed) return;
          res.writeHead(200, { 'content-type': 'text/plain' });
          res.end('hello world'); // 11 bytes
        }, slow ? 1_500 : 0);
      });
    });
    const upPort = await new Promise<number>((r) => upstream.listen(0, '127.0.0.1', () => r((upstream.address() as net.AddressInfo).port)));
    const registry = new TunnelRegistry('n1');
    registry.addLocal(tcpTunnel('tn_1', { app: 'up' }, () => upPort));
    registry.addLocal(tcpTunnel('tn_2', { app: 'up2' }, () => upPort, { accountId: 'ac_2' }));
    const metrics = createIngressMetrics('n1');
    events = new TrafficEvents({ publisher: pub, metrics: metrics.events, log, maxQueued: 1000, flushMs: 10 });
    forwarder = new Forwarder({ registry, hopToken: '', log, upstreamTimeoutMs: 2_000, maxStreamsPerTunnel: 8, maxQueuedPerTunnel: 100 });
    const handler = new PublicHandler({ registry, forwarder, metrics, log, events });
    const cfg = config([sub('esb_1', 'ac_1', ['http_request_complete.v0'], [D1])]);
    const compile = createPipelineCompiler(pipelineStageFactories, { limiter: new FakeLimiter(), log, registry: new Registry() });
    handler.setTable(new RoutingTable(cfg, compile));
    events.setConfig(cfg);
    server = http.createServer(handler.handler('http'));
    port = await new Promise<number>((r) => server.listen(0, '127.0.0.1', () => r((server.address() as net.AddressInfo).port)));
  });

  afterAll(() => {
    server?.closeAllConnections();
    server?.close();
    upstream?.close();
    forwarder?.close();
  });

  function request(path: string, host = 'app.test', method = 'GET', body?: string): Promise<{ status: number; body: string }> {
    return new Promise((resolve, reject) => {
      const req = http.request({ port, host: '127.0.0.1', path, method, agent: false, headers: { host } }, (res) => {
        let data = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (data += c));
        res.on('end', () => resolve({ status: res.statusCode!, body: data }));
      });
      req.on('error', reject);
      req.end(body);
    });
  }

  it('emits one event per request with the documented shape, including the rate-limit result', async () => {
    const before = Date.now();
    const results = [await request('/rl/a?secret=1'), await request('/rl/b'), await request('/rl/c'), await request('/plain/x', 'app.test', 'POST', 'abc'), await request('/teapot', 'other.test')];
    expect(results.map((r) => r.status)).toEqual([200, 200, 429, 200, 200]);
    // Polled: the last event is queued when the edge has finished its answer, then flushed after
    // flushMs; a fixed sleep assumed this process is never stalled meanwhile.
    await waitFor(() => pub.events('ed_1').length >= 4);
    const evs = pub.events('ed_1');
    expect(evs).toHaveLength(4); // ac_2 has no subscription
    const [first, , limited, plain] = evs as Array<EventEnvelope & { object: any }>;
    expect(Object.keys(first!)).toEqual(['event_id', 'event_type', 'event_timestamp', 'account_id', 'object', 'principal']);
    expect(isId('ev', first!.event_id)).toBe(true);
    expect(new Set(evs.map((e) => e.event_id)).size).toBe(4);
    expect(first!.event_type).toBe(HTTP_REQUEST_COMPLETE);
    expect(first!.event_timestamp).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    expect(first!.account_id).toBe('ac_1');
    expect(first!.principal).toBeNull();
    const o = first!.object;
    expect(o.conn).toEqual({ client_ip: '127.0.0.1', server_name: 'app.test', server_port: 80 });
    expect(o.http.request).toMatchObject({ method: 'GET', url: { path: '/rl/a' }, version: 'HTTP/1.1' });
    expect(o.http.response).toMatchObject({ status_code: 200, body_length: 11 });
    const ts = [o.http.request.first_byte_ts, o.http.request.last_byte_ts, o.http.response.first_byte_ts, o.http.response.last_byte_ts];
    for (const t of ts) expect(t).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    const ms = ts.map((t: string) => Date.parse(t));
    expect(ms[0]).toBeGreaterThanOrEqual(before - 5);
    expect(ms[0]).toBeLessThanOrEqual(ms[2]!);
    expect(ms[2]).toBeLessThanOrEqual(ms[3]!);
    expect(ms[3]).toBeLessThanOrEqual(Date.now());
    expect(o.warren).toEqual({
      edge_id: 'edghts_1',
      route_id: 'rt_rl',
      tunnel_id: 'tn_1',
      rate_limited: false,
      rate_limit: { bucket_key: '["127.0.0.1"]', limited: false, error: { code: '', message: '' } },
    });
    expect(limited!.object.http.response).toMatchObject({ status_code: 429 });
    expect(limited!.object.http.response.body_length).toBeGreaterThan(0);
    expect(limited!.object.warren).toMatchObject({ rate_limited: true, tunnel_id: null, rate_limit: { limited: true } });
    expect(plain!.object.http.request).toMatchObject({ method: 'POST', url: { path: '/plain/x' } });
    expect(plain!.object.warren).toEqual({ edge_id: 'edghts_1', route_id: 'rt_plain', tunnel_id: 'tn_1', rate_limited: false, rate_limit: null });
  });

  it('emits for answers of the edge itself (no route) and for a client that went away', async () => {
    pub.calls = [];
    expect((await request('/nothing-here')).status).toBe(404);
    await waitFor(() => pub.events('ed_1').length > 0);
    const [e] = pub.events('ed_1') as Array<EventEnvelope & { object: any }>;
    expect(e!.object.http.response.status_code).toBe(404);
    expect(e!.object.warren).toMatchObject({ edge_id: 'edghts_1', route_id: null, tunnel_id: null, rate_limit: null });

    pub.calls = [];
    await new Promise<void>((resolve) => {
      const req = http.request({ port, host: '127.0.0.1', path: '/plain/slow', agent: false, headers: { host: 'app.test' } });
      req.on('error', () => resolve());
      req.end();
      // Gone once the edge has forwarded the request (the upstream answers 1.5 s later): after a
      // fixed 50 ms, a loaded machine could have the client gone before the edge saw a request.
      onSlow = () => req.destroy();
    });
    onSlow = () => {};
    await waitFor(() => pub.events('ed_1').length > 0);
    const [gone] = pub.events('ed_1') as Array<EventEnvelope & { object: any }>;
    expect(gone!.object.http.response).toMatchObject({ status_code: 499, body_length: 0, first_byte_ts: null });
    expect(gone!.object.warren.tunnel_id).toBe('tn_1');
  });

  it('stops when the subscription goes away', async () => {
    pub.calls = [];
    events.setConfig(config([]));
    await request('/plain/y');
    await sleep(40);
    expect(pub.calls).toHaveLength(0);
  });
});

describe('traffic timestamps', () => {
  it('formats like Date#toISOString (milliseconds) and rfc3339 (whole seconds)', () => {
    for (const ms of [0, 1, 999, 1000, 1_772_357_412_345, 1_772_357_412_005.7, 1_772_357_413_050, 1_772_357_412_999, 4_102_444_799_999]) {
      expect(trafficTs(ms)).toBe(new Date(Math.floor(ms)).toISOString());
      expect(eventTimestamp(ms)).toBe(rfc3339(ms));
    }
  });
});
