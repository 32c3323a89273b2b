import http from 'node:http';
import { randomBytes } from 'node:crypto';
import { brotliDecompressSync, gunzipSync, gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { Redis } from 'ioredis';
import { bufferKey, createCertificate, type SelfSigned } from '@warren/shared';
import { redisKeyPattern } from '../../services/ingress/src/ratelimit/index.js';
import { waitFor } from '../support/cluster.js';
import { metricValue } from '../support/events.js';
import { startPolicyCluster, type PolicyCluster, type PolicyRequestOptions, type PolicyResponse } from '../support/policy-cluster.js';
import { deleteKeys } from '../support/redis-keys.js';
import { startRedisServer, type RedisServer } from '../support/redis-server.js';
import { httpsRequest } from '../support/route-modules-https.js';
import { FaultyProxy } from '../../services/ingress/src/ratelimit/testing.js';
import { TestSamlIdp } from '../support/saml-idp.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * Route modules on live traffic, through real processes: a control plane on its own database,
 * an ingress node listening on `::` (IPv4 clients arrive as IPv4-mapped IPv6 addresses, IPv6
 * clients as ::1), our agent and an upstream. The node's rate limiter counts in a private
 * redis-server of this file (stopped below, then replaced by a new one); its traffic events go to the
 * run's shared Redis under a prefix of this file. Every module is configured through the REST API.
 *
 * - every route module with `enabled: false` leaves traffic as a route without it would;
 * - circuit_breaker: trips, answers 503 while open, half-open probe closes it or re-opens it;
 * - compression: Accept-Encoding q-values, identity, HEAD, 304 and already-encoded responses;
 * - ip_restriction with IPv6 and IPv4-mapped IPv6 clients;
 * - edge mutual_tls with a client certificate issued by an intermediate CA;
 * - the rate-limit action while its Redis is down: fail-open to the local limiter, the error in
 *   `actions.ngrok.rate_limit.error`, in the traffic event and in the fallback metric, then recovery.
 */

const HOST = 'live.e2e.test';
const MTLS_HOST = 'mtls-live.e2e.test';
const sharedRedisUrl = inject('redisUrl');
const prefix = `warren_test_${inject('runId')}_${randomBytes(3).toString('hex')}`;
const rlServerId = `${prefix}-rl`;
const STORE_ERROR = 'ERR_WARREN_RATE_LIMIT_STORE';

let c: PolicyCluster;
/** The rate limiter's Redis: a private redis-server (replaced by a new one after the outage) behind a front that keeps its address. */
let rlRedis: RedisServer;
let rlFront: FaultyProxy;
let shared: Redis;

/** Circuit-breaker upstream: its answer's status, and how many requests reached it. */
let cbStatus = 200;
let cbHits = 0;
const PRE_GZIPPED_TEXT = JSON.stringify({ pre: 'compressed upstream '.repeat(400) });
const PRE_GZIPPED = gzipSync(Buffer.from(PRE_GZIPPED_TEXT));
/** The same body whatever the request (`…/fixed…`). */
const FIXED_TEXT = JSON.stringify({ fixed: 'the same representation every time '.repeat(200) });

const hex = (n = 3) => randomBytes(n).toString('hex');
const request = (p: string, opts?: PolicyRequestOptions) => c.request(p, opts);

/** The upstream: `/cb/…` answers `cbStatus`; `…/pre-gzip…` an already gzipped body; `…/fixed…` FIXED_TEXT; `…/not-modified…` a 304; anything else echoes the request as JSON (4 KiB of padding), `/status/NNN` with that status. */
const upstream: http.RequestListener = (req, res) => {
  req.resume();
  req.on('end', () => {
    const url = req.url ?? '';
    if (url.startsWith('/cb/')) {
      cbHits++;
      res.writeHead(cbStatus, { 'content-type': 'application/json', 'x-upstream': 'yes' });
      res.end(JSON.stringify({ url, status: cbStatus }));
      return;
    }
    if (url.includes('/pre-gzip')) {
      res.writeHead(200, { 'content-type': 'application/json', 'content-encoding': 'gzip', 'content-length': String(PRE_GZIPPED.length), 'x-upstream': 'yes' });
      res.end(PRE_GZIPPED);
      return;
    }
    if (url.includes('/fixed')) {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(FIXED_TEXT)), etag: '"fixed"', 'x-upstream': 'yes' });
      res.end(FIXED_TEXT);
      return;
    }
    if (url.includes('/not-modified')) {
      res.writeHead(304, { etag: '"v1"', 'cache-control': 'max-age=60', 'x-upstream': 'yes' });
      res.end();
      return;
    }
    const m = /\/status\/(\d{3})/.exec(url);
    const text = JSON.stringify({ url, method: req.method, headers: req.headers, pad: 'x'.repeat(4096) });
    res.writeHead(m ? Number(m[1]) : 200, { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(text)), etag: '"strong-etag"', 'x-upstream': 'yes' });
    res.end(text);
  });
};

beforeAll(async () => {
  rlRedis = await startRedisServer();
  rlFront = await new FaultyProxy({ host: '127.0.0.1', port: rlRedis.port }).start();
  shared = new Redis(sharedRedisUrl);
  c = await startPolicyCluster({
    name: 'rmlive',
    host: HOST,
    ingressEnv: () => ({
      // IPv4 and IPv6 clients alike.
      HOST: '::',
      REDIS_URL: sharedRedisUrl,
      EVENTS_PREFIX: prefix,
      RATE_LIMIT_REDIS_URL: rlFront.url,
      RATE_LIMIT_SERVER_ID: rlServerId,
      // A loaded machine must not turn a slow Redis answer into a fallback decision.
      RATE_LIMIT_TIMEOUT_MS: '2000',
    }),
    upstream,
  });
  await c.route('/plain', {});
}, CLUSTER_HOOK_MS);

afterAll(async () => {
  await c?.stop();
  await rlFront?.close();
  await rlRedis?.dispose();
  if (shared) {
    await deleteKeys(shared, `${prefix}:*`).catch(() => {});
    await deleteKeys(shared, redisKeyPattern(rlServerId)).catch(() => {});
    shared.disconnect();
  }
}, 60_000);

const code = (r: { headers: http.IncomingHttpHeaders }) => r.headers['warren-error-code'];

describe('route modules with enabled: false', () => {
  interface Case {
    module: string;
    config: Record<string, unknown>;
    /** The request the enabled module would change or refuse. */
    send: (path: string) => Promise<PolicyResponse>;
    /** What the enabled module does to it. */
    enabledEffect: (r: PolicyResponse) => void;
  }
  let ipPolicy: string;
  let saml: TestSamlIdp;

  beforeAll(async () => {
    ipPolicy = (await c.apiExpecting(201, 'POST', '/ip_policies', { description: 'deny everyone' })).id;
    await c.apiExpecting(201, 'POST', '/ip_policy_rules', { ip_policy_id: ipPolicy, cidr: '0.0.0.0/0', action: 'deny' });
    await c.apiExpecting(201, 'POST', '/ip_policy_rules', { ip_policy_id: ipPolicy, cidr: '::/0', action: 'deny' });
    saml = await TestSamlIdp.create();
  }, 30_000);

  const get = (headers: Record<string, string> = {}) => (p: string) => request(p, { headers: { accept: 'application/json', ...headers } });
  const refusedWith = (status: number, errorCode: string) => (r: PolicyResponse) => {
    expect([r.status, code(r)], r.body).toEqual([status, errorCode]);
    expect(r.headers['x-upstream']).toBeUndefined();
  };
  const cases = (): Case[] => [
    {
      module: 'request_headers',
      config: { add: { 'x-rm-added': 'on' }, remove: ['x-rm-drop'] },
      send: get({ 'x-rm-drop': 'kept' }),
      enabledEffect: (r) => expect([r.json().headers['x-rm-added'], r.json().headers['x-rm-drop']]).toEqual(['on', undefined]),
    },
    {
      module: 'response_headers',
      config: { add: { 'x-rm-resp': 'on' }, remove: ['x-upstream'] },
      send: get(),
      enabledEffect: (r) => expect([r.status, r.headers['x-rm-resp'], r.headers['x-upstream']]).toEqual([200, 'on', undefined]),
    },
    { module: 'compression', config: {}, send: get({ 'accept-encoding': 'gzip' }), enabledEffect: (r) => expect([r.status, r.headers['content-encoding']]).toEqual([200, 'gzip']) },
    { module: 'ip_restriction', config: { ip_policy_ids: [ipPolicy] }, send: get(), enabledEffect: refusedWith(403, 'ERR_WARREN_7100') },
    { module: 'user_agent_filter', config: { deny: ['(?i)badbot'] }, send: get({ 'user-agent': 'BadBot/1.0' }), enabledEffect: refusedWith(403, 'ERR_WARREN_7101') },
    {
      module: 'circuit_breaker',
      config: { tripped_duration: 120, rolling_window: 120, num_buckets: 10, volume_threshold: 2, error_threshold_percentage: 0.1 },
      // Three upstream errors, then a request to a healthy path.
      send: async (p) => {
        for (let i = 0; i < 3; i++) await request(`${p}/status/500`);
        return get()(p);
      },
      enabledEffect: refusedWith(503, 'ERR_WARREN_7103'),
    },
    {
      module: 'webhook_verification',
      config: { provider: 'github', secret: 'gh-secret' },
      send: (p) => request(p, { method: 'POST', body: '{"unsigned":true}', headers: { accept: 'application/json', 'content-type': 'application/json' } }),
      enabledEffect: refusedWith(403, 'ERR_WARREN_7102'),
    },
    // Google without a client id: enabled, the route cannot be served (there is no managed app).
    { module: 'oauth', config: { provider: { google: {} } }, send: get(), enabledEffect: refusedWith(503, 'ERR_WARREN_7010') },
    { module: 'oidc', config: { issuer: 'https://idp.example.test/', client_id: 'e2e-client', client_secret: 'e2e-secret' }, send: get(), enabledEffect: refusedWith(401, 'ERR_WARREN_7106') },
    { module: 'saml', config: { idp_metadata: saml.metadata() }, send: get(), enabledEffect: refusedWith(401, 'ERR_WARREN_7106') },
    { module: 'websocket_tcp_converter', config: {}, send: get(), enabledEffect: refusedWith(426, 'ERR_WARREN_7105') },
    {
      module: 'traffic_policy',
      config: { value: JSON.stringify({ inbound: [{ actions: [{ type: 'deny', config: { status_code: 451 } }] }] }) },
      send: get(),
      enabledEffect: (r) => expect([r.status, r.headers['x-upstream']]).toEqual([451, undefined]),
    },
  ];

  /** What a route without modules answers to the same request. */
  async function expectLikePlain(module: string, r: PolicyResponse, p: string): Promise<void> {
    const what = `${module} disabled: ${r.status} ${r.body.slice(0, 300)}`;
    expect(r.status, what).toBe(200);
    expect(code(r), what).toBeUndefined();
    expect(r.headers['x-upstream'], what).toBe('yes');
    expect(r.headers['content-encoding'], what).toBeUndefined();
    expect(r.headers['x-rm-resp'], what).toBeUndefined();
    const seen = r.json();
    expect(seen.url, what).toBe(p);
    expect([seen.headers['x-rm-added'], seen.headers['x-rm-drop']], what).toEqual([undefined, module === 'request_headers' ? 'kept' : undefined]);
  }

  it('the API keeps each module with enabled: false', async () => {
    for (const k of cases()) {
      const r = await c.api('POST', `/edges/https/${c.edgeId}/routes`, c.routeBody(`/keep-${k.module.replace(/_/g, '-')}`, { [k.module]: { ...k.config, enabled: false } }));
      expect(r.status, `${k.module}: ${JSON.stringify(r.body)}`).toBe(201);
      expect(r.body[k.module].enabled, k.module).toBe(false);
      await c.apiExpecting(204, 'DELETE', `/edges/https/${c.edgeId}/routes/${r.body.id}`);
    }
  });

  it('a disabled module leaves the request as a route without it would; the same module enabled changes or refuses it', async () => {
    const list = cases();
    for (const k of list) {
      const name = k.module.replace(/_/g, '-');
      await c.route(`/on-${name}`, { [k.module]: { ...k.config, enabled: true } });
      await c.route(`/off-${name}`, { [k.module]: { ...k.config, enabled: false } });
    }
    // The same request to a route without modules, for reference.
    const plain = await get({ 'x-rm-drop': 'kept', 'user-agent': 'BadBot/1.0', 'accept-encoding': 'gzip' })('/plain/ref');
    expect([plain.status, plain.headers['content-encoding'], plain.headers['x-upstream']]).toEqual([200, undefined, 'yes']);

    for (const k of list) {
      const name = k.module.replace(/_/g, '-');
      const on = await k.send(`/on-${name}/x`);
      k.enabledEffect(on);
      const p = `/off-${name}/x`;
      await expectLikePlain(k.module, await k.send(p), p);
    }
  });
});

describe('circuit_breaker through the ingress', () => {
  const TRIPPED_S = 8;
  const TRIPPED_MS = TRIPPED_S * 1000;

  /**
   * Sends requests (the upstream answering 5xx) until the breaker answers 503. Returns every
   * status, and when the last request that reached the upstream was sent: the circuit tripped on
   * that request's result, so not before then (a lower bound that holds on any machine).
   */
  async function tripIt(max = 30): Promise<{ statuses: number[]; trippedNotBefore: number }> {
    cbStatus = 500;
    const statuses: number[] = [];
    let sent = 0;
    let trippedNotBefore = 0;
    for (let i = 0; i < max; i++) {
      sent = Date.now();
      const r = await request(`/cb/trip-${i}`);
      statuses.push(r.status);
      if (r.status === 503) {
        expect(code(r)).toBe('ERR_WARREN_7103');
        expect(r.headers['retry-after']).toBe(String(TRIPPED_S));
        break;
      }
      trippedNotBefore = sent;
    }
    return { statuses, trippedNotBefore };
  }

  /** Polls until a request is not refused by the open circuit (the half-open probe): its answer and when it was sent. */
  async function probe(name: string): Promise<{ r: PolicyResponse; sent: number }> {
    return waitFor(`the half-open probe (${name}) reaches the upstream`, async () => {
      const sent = Date.now();
      const r = await request(`/cb/${name}-${hex()}`);
      return r.status === 503 ? null : { r, sent };
    }, 60_000);
  }

  it('trips after the volume threshold, answers 503 while open; a successful half-open probe closes it, a failing one re-opens it', { timeout: 150_000 }, async () => {
    // The route's own probe (route()) is one success in the window.
    await c.route('/cb', { circuit_breaker: { tripped_duration: TRIPPED_S, rolling_window: 120, num_buckets: 12, volume_threshold: 4, error_threshold_percentage: 0.5 } });

    // 1 success + 3 errors: the volume (4) is reached at 75 % errors, the third error trips it.
    const first = await tripIt();
    expect(first.statuses, 'the circuit must trip once the window holds volume_threshold requests, half of them errors').toEqual([500, 500, 500, 503]);

    // Open: nothing reaches the upstream, healthy or not (checked only while surely still open:
    // a machine too slow for that leaves it to the probe below).
    cbStatus = 200;
    const hits = cbHits;
    for (let i = 0; i < 3; i++) {
      const r = await request(`/cb/open-${i}`);
      if (Date.now() - first.trippedNotBefore >= TRIPPED_MS) break;
      expect([r.status, code(r)], r.body).toEqual([503, 'ERR_WARREN_7103']);
      expect(cbHits).toBe(hits);
    }

    // Half-open after tripped_duration: one probe goes through; it succeeds and closes the circuit.
    const ok = await probe('probe');
    expect(Date.now() - first.trippedNotBefore, 'the probe must wait for tripped_duration').toBeGreaterThanOrEqual(TRIPPED_MS);
    expect([ok.r.status, ok.r.headers['x-upstream']]).toEqual([200, 'yes']);
    const closedHits = cbHits;
    for (let i = 0; i < 5; i++) expect((await request(`/cb/closed-${i}`)).status).toBe(200);
    expect(cbHits).toBe(closedHits + 5);

    // Trip it again (a fresh window: the 5 successes count, so 5 errors are needed) …
    const second = await tripIt();
    expect(second.statuses, 'closing starts a fresh window').toEqual([500, 500, 500, 500, 500, 503]);

    // … and let its probe fail: the upstream's 500 reaches the client, and the circuit is open again.
    const failing = await probe('failing-probe');
    expect(Date.now() - second.trippedNotBefore).toBeGreaterThanOrEqual(TRIPPED_MS);
    expect([failing.r.status, failing.r.headers['x-upstream']]).toEqual([500, 'yes']);
    // The failed probe re-opened it, not before the probe was sent.
    const afterProbe = cbHits;
    for (let i = 0; i < 3; i++) {
      const r = await request(`/cb/reopened-${i}`);
      if (Date.now() - failing.sent >= TRIPPED_MS) break;
      expect([r.status, code(r)], r.body).toEqual([503, 'ERR_WARREN_7103']);
      expect(cbHits).toBe(afterProbe);
    }

    // A later probe that succeeds closes it for good.
    cbStatus = 200;
    const last = await probe('final-probe');
    expect(Date.now() - failing.sent).toBeGreaterThanOrEqual(TRIPPED_MS);
    expect(last.r.status).toBe(200);
    for (let i = 0; i < 3; i++) expect((await request(`/cb/flowing-${i}`)).status).toBe(200);
  });
});

describe('compression through the ingress', () => {
  beforeAll(async () => {
    await c.route('/cz', { compression: {} });
  }, 30_000);

  it('picks brotli when gzip is refused with q=0', async () => {
    const r = await request('/cz/q0', { headers: { 'accept-encoding': 'gzip;q=0, br' } });
    expect([r.status, r.headers['content-encoding']]).toEqual([200, 'br']);
    expect(JSON.parse(brotliDecompressSync(r.raw).toString()).url).toBe('/cz/q0');
    const gzOnly = await request('/cz/q0-br', { headers: { 'accept-encoding': 'br;q=0, gzip;q=0.5' } });
    expect([gzOnly.status, gzOnly.headers['content-encoding']]).toEqual([200, 'gzip']);
    expect(JSON.parse(gunzipSync(gzOnly.raw).toString()).url).toBe('/cz/q0-br');
  });

  it('does not compress for a client that accepts identity only (or refuses both codings)', async () => {
    for (const ae of ['identity', 'gzip;q=0, br;q=0', 'identity, *;q=0']) {
      const r = await request('/cz/identity', { headers: { 'accept-encoding': ae } });
      expect([r.status, r.headers['content-encoding']], ae).toEqual([200, undefined]);
      expect(r.json().url, ae).toBe('/cz/identity');
      expect(Number(r.headers['content-length'] ?? r.raw.length)).toBe(r.raw.length);
    }
  });

  it("answers HEAD with no body and the GET's head: the same Content-Encoding, Vary and weakened ETag, no identity length (RFC 9110 §9.3.2)", async () => {
    // The same resource by GET is compressed for this client …
    const gz = await request('/cz/fixed', { headers: { 'accept-encoding': 'gzip, br' } });
    expect([gz.status, gz.headers['content-encoding']]).toEqual([200, 'br']);
    expect(brotliDecompressSync(gz.raw).toString()).toBe(FIXED_TEXT);
    // … and HEAD shows what GET would send, without a body (nothing is compressed for it).
    const head = await request('/cz/fixed', { method: 'HEAD', headers: { 'accept-encoding': 'gzip, br' } });
    expect(head.status).toBe(200);
    expect(head.raw.length).toBe(0);
    expect([head.headers['content-encoding'], head.headers.vary, head.headers.etag, head.headers['content-length']]).toEqual(['br', gz.headers.vary, gz.headers.etag, undefined]);
    expect(head.headers.etag).toBe('W/"fixed"');
  });

  it('leaves a 304 untouched', async () => {
    const r = await request('/cz/not-modified', { headers: { 'accept-encoding': 'gzip, br', 'if-none-match': '"v1"' } });
    expect(r.status).toBe(304);
    expect(r.raw.length).toBe(0);
    expect(r.headers['content-encoding']).toBeUndefined();
    expect(r.headers.etag).toBe('"v1"'); // not weakened: nothing was transformed
    expect(r.headers['x-upstream']).toBe('yes');
  });

  it('passes an already gzipped upstream response through unchanged, never compressing it twice', async () => {
    for (const ae of ['gzip', 'br', 'gzip, br']) {
      const r = await request('/cz/pre-gzip', { headers: { 'accept-encoding': ae } });
      expect([r.status, r.headers['content-encoding']], ae).toEqual([200, 'gzip']);
      expect(r.raw.equals(PRE_GZIPPED), `${ae}: the body must be the upstream's gzip bytes`).toBe(true);
      expect(gunzipSync(r.raw).toString()).toBe(PRE_GZIPPED_TEXT);
    }
  });
});

describe('ip_restriction with IPv6 and IPv4-mapped IPv6 clients', () => {
  /** A GET to the node from an IPv4-mapped IPv6 address (the node listens on `::`). */
  function fromMapped(p: string): Promise<number> {
    return new Promise((resolve, reject) => {
      const req = http.request({ host: '::ffff:127.0.0.1', port: c.a.http, path: p, agent: false, headers: { host: HOST } }, (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode ?? 0));
      });
      req.setTimeout(10_000, () => req.destroy(new Error('timed out')));
      req.on('error', reject);
      req.end();
    });
  }
  const status = async (p: string, from: '127.0.0.1' | '::1') => {
    const r = await request(p, { from });
    if (r.status === 403) expect(code(r)).toBe('ERR_WARREN_7100');
    return r.status;
  };
  async function policy(rules: Array<[string, 'allow' | 'deny']>): Promise<string> {
    const id: string = (await c.apiExpecting(201, 'POST', '/ip_policies', { description: 'ipv6 e2e' })).id;
    for (const [cidr, action] of rules) await c.apiExpecting(201, 'POST', '/ip_policy_rules', { ip_policy_id: id, cidr, action });
    return id;
  }

  it('denies and allows ::1 by IPv6 rules, and checks IPv4-mapped clients as IPv4', async () => {
    await c.route('/ip6-deny-v6', { ip_restriction: { ip_policy_ids: [await policy([['::1/128', 'deny']])] } });
    await c.route('/ip6-allow-v6', { ip_restriction: { ip_policy_ids: [await policy([['::1/128', 'allow']])] } });
    await c.route('/ip6-deny-v4', { ip_restriction: { ip_policy_ids: [await policy([['127.0.0.0/8', 'deny']])] } });
    await c.route('/ip6-allow-v4', { ip_restriction: { ip_policy_ids: [await policy([['127.0.0.1/32', 'allow']])] } });
    await c.route('/ip6-deny-all-v6', { ip_restriction: { ip_policy_ids: [await policy([['::/0', 'deny']])] } });
    await c.route('/ip6-mixed', { ip_restriction: { ip_policy_ids: [await policy([['::/0', 'allow']]), await policy([['127.0.0.1/32', 'allow'], ['::1/128', 'deny']])] } });

    const table: Record<string, [v6: number, mapped: number]> = {
      '/ip6-deny-v6': [403, 200],
      '/ip6-allow-v6': [200, 403],
      '/ip6-deny-v4': [200, 403],
      '/ip6-allow-v4': [403, 200],
      // An IPv6 catch-all never catches an IPv4(-mapped) client.
      '/ip6-deny-all-v6': [403, 200],
      // Rules of several policies together: a deny wins over an allow.
      '/ip6-mixed': [403, 200],
    };
    const got: Record<string, number[]> = {};
    for (const p of Object.keys(table)) {
      // 127.0.0.1 reaches the `::` listener as ::ffff:127.0.0.1, as does an explicit mapped address.
      const mappedImplicit = await status(`${p}/x`, '127.0.0.1');
      const mappedExplicit = await fromMapped(`${p}/y`);
      expect(mappedExplicit, p).toBe(mappedImplicit);
      got[p] = [await status(`${p}/z`, '::1'), mappedImplicit];
    }
    expect(got).toEqual(table);
  });
});

describe('edge mutual_tls with an intermediate CA', () => {
  let root: SelfSigned;
  let intermediate: SelfSigned;
  let leaf: SelfSigned;
  let foreignLeaf: SelfSigned;
  let impostorIntermediate: SelfSigned;
  let impostorLeaf: SelfSigned;

  const get = (p: string, cert?: string, key?: string) => httpsRequest({ port: c.a.https, host: MTLS_HOST, path: p, ca: c.tls.caPem!, cert, key, headers: { accept: 'application/json' } });

  beforeAll(async () => {
    root = await createCertificate({ commonName: 'rm e2e root CA', days: 2, ca: true, keyType: 'ec' });
    intermediate = await createCertificate({ commonName: 'rm e2e issuing CA', days: 2, ca: true, issuer: root, keyType: 'ec' });
    leaf = await createCertificate({ commonName: 'client', days: 1, issuer: intermediate, keyType: 'ec', dnsNames: ['client.test'] });
    const otherRoot = await createCertificate({ commonName: 'rm e2e unrelated CA', days: 2, ca: true, keyType: 'ec' });
    foreignLeaf = await createCertificate({ commonName: 'client', days: 1, issuer: otherRoot, keyType: 'ec', dnsNames: ['client.test'] });
    // Same subject name as the real intermediate, another key, issued by the unrelated root.
    impostorIntermediate = await createCertificate({ commonName: 'rm e2e issuing CA', days: 2, ca: true, issuer: otherRoot, keyType: 'ec' });
    impostorLeaf = await createCertificate({ commonName: 'client', days: 1, issuer: impostorIntermediate, keyType: 'ec', dnsNames: ['client.test'] });

    const edgeId: string = (await c.apiExpecting(201, 'POST', '/edges/https', { hostports: [`${MTLS_HOST}:443`] })).id;
    await c.apiExpecting(201, 'POST', `/edges/https/${edgeId}/routes`, { match_type: 'path_prefix', match: '/', backend: { enabled: true, backend_id: c.backendId } });
    await waitFor(`${MTLS_HOST} is routed`, async () => (await get('/probe')).status === 200, 20_000);
    const caId: string = (await c.apiExpecting(201, 'POST', '/certificate_authorities', { ca_pem: root.certificatePem })).id;
    const put = await c.apiExpecting(200, 'PUT', `/edges/https/${edgeId}/mutual_tls`, { certificate_authority_ids: [caId] });
    expect(put.enabled).toBe(true);
    await waitFor(`${c.a.nodeId} enforces mutual TLS`, async () => code(await get('/probe')) === 'ERR_WARREN_7104', 20_000);
  }, 60_000);

  it('accepts a client certificate issued by an intermediate chained to the uploaded root, the intermediate presented', async () => {
    for (let i = 0; i < 2; i++) {
      const r = await get(`/ok-${i}`, leaf.certificatePem + intermediate.certificatePem, leaf.privateKeyPem);
      expect(r.status, r.body).toBe(200);
      expect(r.headers['x-upstream']).toBe('yes');
      expect(r.json().url).toBe(`/ok-${i}`);
    }
  });

  for (const maxVersion of ['TLSv1.3', 'TLSv1.2'] as const) {
    it(`${maxVersion}: accepts the client again when it resumes its session (no certificates are sent; the leaf is verified over the intermediate seen in full)`, async () => {
      const cert = leaf.certificatePem + intermediate.certificatePem;
      const get2 = (p: string, session?: Buffer) => httpsRequest({ port: c.a.https, host: MTLS_HOST, path: p, ca: c.tls.caPem!, cert, key: leaf.privateKeyPem, session, maxVersion, wantSession: true, headers: { accept: 'application/json' } });
      const first = await get2('/full');
      expect([first.status, first.reused, first.protocol], first.body).toEqual([200, false, maxVersion]);
      expect(first.session).toBeDefined();
      const again = await get2('/resumed', first.session);
      expect(again.reused, 'the session was resumed').toBe(true);
      expect([again.status, code(again)], again.body).toEqual([200, undefined]);
    });
  }

  it('a resumed session of a leaf no verified chain vouches for is still refused', async () => {
    // An intermediate of the trusted root never seen in a full handshake: its leaf, presented alone,
    // was refused, and resuming that session does not make it pass.
    const unseen = await createCertificate({ commonName: 'rm e2e other issuing CA', days: 2, ca: true, issuer: root, keyType: 'ec' });
    const lone = await createCertificate({ commonName: 'client', days: 1, issuer: unseen, keyType: 'ec', dnsNames: ['client.test'] });
    const get2 = (p: string, session?: Buffer) => httpsRequest({ port: c.a.https, host: MTLS_HOST, path: p, ca: c.tls.caPem!, cert: lone.certificatePem, key: lone.privateKeyPem, session, wantSession: true, headers: { accept: 'application/json' } });
    const first = await get2('/lone');
    expect([first.status, code(first)], first.body).toEqual([403, 'ERR_WARREN_7104']);
    const again = await get2('/lone-resumed', first.session);
    expect(again.reused).toBe(true);
    expect([again.status, code(again)], again.body).toEqual([403, 'ERR_WARREN_7104']);
  });

  it('refuses the same leaf without its intermediate (the chain cannot be built to the root)', async () => {
    const r = await get('/no-chain', leaf.certificatePem, leaf.privateKeyPem);
    expect([r.status, code(r)], r.body).toEqual([403, 'ERR_WARREN_7104']);
    expect(r.json().msg).toMatch(/not signed by a trusted certificate authority/);
  });

  it('refuses a certificate from an unrelated CA', async () => {
    const r = await get('/foreign', foreignLeaf.certificatePem, foreignLeaf.privateKeyPem);
    expect([r.status, code(r)], r.body).toEqual([403, 'ERR_WARREN_7104']);
    expect(r.headers['x-upstream']).toBeUndefined();
  });

  it('refuses an impostor intermediate with the real one\'s name, and a leaf it issued presented with the real intermediate', async () => {
    const impostor = await get('/impostor', impostorLeaf.certificatePem + impostorIntermediate.certificatePem, impostorLeaf.privateKeyPem);
    expect([impostor.status, code(impostor)], impostor.body).toEqual([403, 'ERR_WARREN_7104']);
    // The leaf names the real intermediate as its issuer, but the real intermediate did not sign it.
    const forged = await get('/forged', impostorLeaf.certificatePem + intermediate.certificatePem, impostorLeaf.privateKeyPem);
    expect([forged.status, code(forged)], forged.body).toEqual([403, 'ERR_WARREN_7104']);
    expect(forged.json().msg).toMatch(/chain is broken|not signed by a trusted/);
  });

  it('refuses a client without a certificate', async () => {
    const r = await get('/none');
    expect([r.status, code(r)], r.body).toEqual([403, 'ERR_WARREN_7104']);
  });
});

describe('the rate-limit action while its Redis is down', () => {
  let destId: string;
  const fallbacks = async () => metricValue(await (await fetch(`${c.a.internalUrl}/metrics`)).text(), 'warren_ingress_ratelimit_fallback_total');
  const events = async (pathPrefix: string) =>
    (await shared.lrange(bufferKey(prefix, destId), 0, -1))
      .map((s) => JSON.parse(s))
      .filter((e) => e.event_type === 'http_request_complete.v0' && String(e.object.http.request.url.path).startsWith(pathPrefix));
  const limited = (user: string, p = `/rl/${user}`) => request(p, { headers: { 'x-user': user } });

  beforeAll(async () => {
    destId = (await c.apiExpecting(201, 'POST', '/event_destinations', { target: { datadog: { api_key: 'dummy-datadog-key' } } })).id;
    await c.apiExpecting(201, 'POST', '/event_subscriptions', { sources: [{ type: 'http_request_complete.v0' }], destination_ids: [destId] });
    await c.policyRoute('/rl', {
      inbound: [
        { name: 'limit', actions: [{ type: 'rate-limit', config: { name: 'per-user', algorithm: 'sliding_window', capacity: 3, rate: '60s', bucket_key: ["getReqHeader('X-User')"] } }] },
        // An expression reading the error, for the upstream to see.
        { name: 'degraded', expressions: ["actions.ngrok.rate_limit.error.code != ''"], actions: [{ type: 'add-headers', config: { headers: { 'x-rl-degraded': 'yes' } } }] },
      ],
      // An interpolation of it, in a response header.
      outbound: [{ actions: [{ type: 'add-headers', config: { headers: { 'x-rl-error': 'code=${actions.ngrok.rate_limit.error.code}' } } }] }],
    });
    // The subscription has reached the node once a request's event is in the buffer.
    await waitFor('traffic events flow', async () => {
      await request(`/plain/marker-${hex()}`);
      return (await events('/plain/marker-')).length > 0;
    }, 30_000);
  }, 60_000);

  it('fails open to the local limiter with the error readable by later rules, in the event and the metric; recovers when Redis is back', { timeout: 120_000 }, async () => {
    // Redis up: Redis decides, no error.
    await waitFor('the limiter is connected to Redis', async () => (await limited(`ready-${hex()}`)).headers['x-rl-error'] === 'code=', 30_000);
    const up = `up-${hex()}`;
    for (let i = 0; i < 3; i++) {
      const r = await limited(up);
      expect([r.status, r.headers['x-rl-error'], r.json().headers['x-rl-degraded']], r.body).toEqual([200, 'code=', undefined]);
    }
    expect((await limited(up)).status).toBe(429);
    const admin = new Redis(rlRedis.url, { lazyConnect: true, maxRetriesPerRequest: 1 });
    try {
      expect((await admin.keys(redisKeyPattern(rlServerId))).length).toBeGreaterThan(0);
    } finally {
      admin.disconnect();
    }
    const before = await fallbacks();

    // Redis down (the server is killed): every decision is the local limiter's, and says so.
    await rlRedis.dispose();
    await waitFor('the limiter notices Redis is gone', async () => (await limited(`notice-${hex()}`)).headers['x-rl-error'] === `code=${STORE_ERROR}`, 30_000);
    const down = `down-${hex()}`;
    for (let i = 0; i < 3; i++) {
      const r = await limited(down, `/rl/${down}/${i}`);
      expect(r.status, r.body).toBe(200); // served: fail-open
      expect(r.headers['x-rl-error']).toBe(`code=${STORE_ERROR}`);
      expect(r.json().headers['x-rl-degraded']).toBe('yes');
    }
    // The local limiter still counts (per process): the bucket's fourth request is refused.
    const over = await limited(down, `/rl/${down}/3`);
    expect([over.status, Number(over.headers['retry-after']) >= 1]).toEqual([429, true]);
    expect(await fallbacks()).toBeGreaterThanOrEqual(before + 4);

    // The traffic events of those requests carry the error.
    const evs = await waitFor('4 events of the Redis-down requests', async () => {
      const e = await events(`/rl/${down}/`);
      return e.length >= 4 ? e : null;
    }, 30_000);
    evs.sort((x, y) => String(x.object.http.request.url.path).localeCompare(String(y.object.http.request.url.path)));
    expect(evs.map((e) => e.object.http.response.status_code)).toEqual([200, 200, 200, 429]);
    for (const e of evs) {
      expect(e.object.warren.rate_limit.bucket_key).toBe(JSON.stringify([down]));
      expect(e.object.warren.rate_limit.error.code).toBe(STORE_ERROR);
      expect(e.object.warren.rate_limit.error.message).toMatch(/rate-limit store unavailable .*local limiter/);
    }
    expect(evs.map((e) => e.object.warren.rate_limit.limited)).toEqual([false, false, false, true]);

    // Redis back (a new, empty server at the same address): the limiter reconnects by itself and Redis decides again.
    rlRedis = await startRedisServer();
    rlFront.retarget({ host: '127.0.0.1', port: rlRedis.port });
    await waitFor('Redis decides again', async () => (await limited(`back-${hex()}`)).headers['x-rl-error'] === 'code=', 30_000);
    const steady = await fallbacks();
    const again = `again-${hex()}`;
    for (let i = 0; i < 3; i++) {
      const r = await limited(again);
      expect([r.status, r.headers['x-rl-error'], r.json().headers['x-rl-degraded']], r.body).toEqual([200, 'code=', undefined]);
    }
    expect((await limited(again)).status).toBe(429);
    expect(await fallbacks()).toBe(steady);
    const admin2 = new Redis(rlRedis.url, { lazyConnect: true, maxRetriesPerRequest: 1 });
    try {
      expect((await admin2.keys(redisKeyPattern(rlServerId))).length).toBeGreaterThan(0);
    } finally {
      admin2.disconnect();
    }
  });
});
