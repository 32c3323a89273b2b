import { createHmac, randomBytes } from 'node:crypto';
import { gunzipSync, brotliDecompressSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { Redis } from 'ioredis';
import { redisKeyPattern } from '../../services/ingress/src/ratelimit/index.js';
import { waitFor, type IngressProcess } from '../support/cluster.js';
import { startPolicyCluster, type PolicyCluster, type PolicyRequestOptions } from '../support/policy-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * Route modules and the traffic policy on live traffic, through real processes: a control plane,
 * two ingress nodes (each its own rate-limit server, sharing one Redis), our agent and an upstream
 * that echoes what reached it. Every module is configured through the REST API.
 */

const HOST = 'mods.e2e.test';
let c: PolicyCluster;
let a: IngressProcess;
let b: IngressProcess;
let edgeId: string;
let backendId: string;
const prefix = `e2e-${randomBytes(4).toString('hex')}`;
const redisUrl = inject('redisUrl');

const api = (method: string, p: string, body?: unknown) => c.api(method, p, body);
const request = (port: number, p: string, opts?: PolicyRequestOptions) => c.request(p, { ...opts, port });

/** Adds a route with `modules`; resolves once both nodes have applied it (the path no longer answers "no route"). */
const route = async (match: string, modules: Record<string, unknown>): Promise<string> => (await c.route(match, modules)).id;

beforeAll(async () => {
  c = await startPolicyCluster({
    name: 'mods',
    host: HOST,
    nodes: 2,
    // Each node is its own rate-limit server; the run's own ids keep its Redis keys apart.
    ingressEnv: (nodeId) => ({ REDIS_URL: redisUrl, RATE_LIMIT_SERVER_ID: `${prefix}-${nodeId}` }),
    upstream: (req, res) => {
      let n = 0;
      req.on('data', (ch: Buffer) => (n += ch.length));
      req.on('end', () => {
        const m = /\/status\/(\d{3})/.exec(req.url ?? '');
        const text = JSON.stringify({ url: req.url, method: req.method, headers: req.headers, bytes: n, pad: 'x'.repeat(4096) });
        res.writeHead(m ? Number(m[1]) : 200, { 'content-type': 'application/json', 'x-upstream': 'yes' });
        res.end(text);
      });
    },
  });
  [a, b] = c.nodes as [IngressProcess, IngressProcess];
  ({ edgeId, backendId } = c);
}, CLUSTER_HOOK_MS);

afterAll(async () => {
  await c?.stop();
  const redis = new Redis(redisUrl);
  for (const node of ['mods-a', 'mods-b']) {
    const keys = await redis.keys(redisKeyPattern(`${prefix}-${node}`));
    if (keys.length) await redis.del(...keys);
  }
  redis.disconnect();
}, 60_000);

describe('traffic policy on live traffic', () => {
  it('rate-limits per ingress server with 429 + retry-after; results reach later expressions', async () => {
    await route('/rl', {
      traffic_policy: {
        value: JSON.stringify({
          inbound: [
            { name: 'limit', actions: [{ type: 'rate-limit', config: { name: 'per-user', algorithm: 'sliding_window', capacity: 3, rate: '60s', bucket_key: ['req.host', "getReqHeader('X-User')"] } }] },
            { name: 'mark', expressions: ['actions.ngrok.rate_limit.limited == false'], actions: [{ type: 'add-headers', config: { headers: { 'x-rl': 'admitted' } } }] },
          ],
        }),
      },
    });
    for (const n of [a, b]) {
      // Each server admits the capacity on its own (the probe above used another bucket).
      for (let i = 0; i < 3; i++) {
        const r = await request(n.http, '/rl/x', { headers: { 'x-user': 'alice' } });
        expect(r.status, r.raw.toString()).toBe(200);
        expect(r.json().headers['x-rl']).toBe('admitted');
      }
      const limited = await request(n.http, '/rl/x', { headers: { 'X-USER': 'alice' } });
      expect(limited.status).toBe(429);
      expect(Number(limited.headers['retry-after'])).toBeGreaterThanOrEqual(1);
      expect(String(limited.headers['retry-after'])).toMatch(/^\d+$/);
      expect((await request(n.http, '/rl/x', { headers: { 'x-user': 'bob' } })).status).toBe(200);
    }
  });

  it('rate-limit enforce: false only marks requests over capacity, for a custom answer (ngrok\'s dry run)', async () => {
    await route('/rl-dry', {
      traffic_policy: {
        value: `on_http_request:
  - actions:
      - type: rate-limit
        config: { name: dry, algorithm: sliding_window, capacity: 2, rate: 60s, bucket_key: ["getReqHeader('X-User')"], enforce: false }
  - expressions: [actions.ngrok.rate_limit.limited]
    actions:
      - type: custom-response
        config: { status_code: 503, body: "slow down", headers: { x-limited: "\${actions.ngrok.rate_limit.limited}" } }
`,
      },
    });
    const statuses: number[] = [];
    for (let i = 0; i < 4; i++) {
      // A bucket of its own: the route's readiness probe used another.
      const r = await request(a.http, '/rl-dry/x', { headers: { 'x-user': 'carol' } });
      statuses.push(r.status);
      if (r.status === 503) expect([r.raw.toString(), r.headers['x-limited'], r.headers['retry-after']]).toEqual(['slow down', 'true', undefined]);
    }
    expect(statuses).toEqual([200, 200, 503, 503]);
  });

  it('denies and answers custom responses by expression', async () => {
    await route('/deny', {
      traffic_policy: {
        value: `inbound:
  - expressions: ["req.method == 'DELETE'"]
    actions:
      - type: deny
        config: { status_code: 405 }
  - expressions: ["req.path.endsWith('/teapot')"]
    actions:
      - type: custom-response
        config: { status_code: 418, body: "short and stout", headers: { x-kind: teapot } }
outbound:
  - actions:
      - type: remove-headers
        config: { headers: [x-upstream] }
`,
      },
    });
    expect((await request(a.http, '/deny/x', { method: 'DELETE' })).status).toBe(405);
    const tea = await request(b.http, '/deny/teapot');
    expect([tea.status, tea.raw.toString(), tea.headers['x-kind']]).toEqual([418, 'short and stout', 'teapot']);
    const ok = await request(a.http, '/deny/ok');
    expect([ok.status, ok.headers['x-upstream']]).toEqual([200, undefined]);
  });

  it('matches() runs RE2: denies by pattern, never backtracks, and refuses a non-RE2 pattern with a 400', async () => {
    const bad = await api('POST', `/edges/https/${edgeId}/routes`, {
      match_type: 'path_prefix',
      match: '/rx-bad',
      backend: { enabled: true, backend_id: backendId },
      traffic_policy: { value: `inbound:\n  - expressions: ["req.path.matches('^/(?=admin)')"]\n    actions: [{type: deny}]\n` },
    });
    expect(bad.status).toBe(400);
    expect(JSON.stringify(bad.body)).toMatch(/inbound\[0\]\.expressions\[0\].*matches\(\): invalid RE2 pattern/);

    await route('/rx', {
      traffic_policy: {
        value: `inbound:
  - expressions: ["req.path.matches('^/rx/admin(/|$)')"]
    actions:
      - type: deny
        config: { status_code: 403 }
  - expressions: ["matches(req.path, '^/rx/(a+)+$')"]
    actions:
      - type: custom-response
        config: { status_code: 200, body: "all a" }
`,
      },
    });
    for (const n of [a, b]) {
      expect((await request(n.http, '/rx/admin')).status).toBe(403);
      expect((await request(n.http, '/rx/admin/users')).status).toBe(403);
      const other = await request(n.http, '/rx/administrator');
      expect([other.status, other.json().url]).toEqual([200, '/rx/administrator']);
      // With a backtracking engine this path would hang the ingress.
      const evil = `/rx/${'a'.repeat(4000)}!`;
      const t = Date.now();
      const redos = await request(n.http, evil);
      expect([redos.status, redos.json().url]).toEqual([200, evil]);
      expect(Date.now() - t).toBeLessThan(2000);
      const allA = await request(n.http, `/rx/${'a'.repeat(4000)}`);
      expect([allA.status, allA.raw.toString()]).toEqual([200, 'all a']);
    }
  });
});

describe('route modules on live traffic', () => {
  it('request_headers and response_headers add and remove; a disabled module does nothing', async () => {
    await route('/hdr', { request_headers: { add: { 'X-Added': 'yes' }, remove: ['X-Drop'] }, response_headers: { add: { 'X-Resp': 'r' }, remove: ['X-Upstream'] } });
    await route('/off', { request_headers: { enabled: false, add: { 'X-Off': 'on' }, remove: [] } });
    for (const n of [a, b]) {
      const r = await request(n.http, '/hdr/x', { headers: { 'x-drop': 'gone', 'x-keep': 'kept' } });
      const seen = r.json().headers;
      expect([seen['x-added'], seen['x-drop'], seen['x-keep']]).toEqual(['yes', undefined, 'kept']);
      expect([r.headers['x-resp'], r.headers['x-upstream']]).toEqual(['r', undefined]);
      expect((await request(n.http, '/off/x')).json().headers['x-off']).toBeUndefined();
    }
  });

  it('ip_restriction denies a client in a denied CIDR and lets others through', async () => {
    const policy = await api('POST', '/ip_policies', { description: 'no loopback' });
    await api('POST', '/ip_policy_rules', { ip_policy_id: policy.body.id, cidr: '127.0.0.0/8', action: 'deny' });
    const allowOnly = await api('POST', '/ip_policies', { description: 'loopback only' });
    await api('POST', '/ip_policy_rules', { ip_policy_id: allowOnly.body.id, cidr: '127.0.0.0/8', action: 'allow' });
    await route('/ipdeny', { ip_restriction: { ip_policy_ids: [policy.body.id] } });
    await route('/ipallow', { ip_restriction: { ip_policy_ids: [allowOnly.body.id] } });
    for (const n of [a, b]) {
      expect((await request(n.http, '/ipdeny/x')).status).toBe(403);
      expect((await request(n.http, '/ipallow/x')).status).toBe(200);
    }
  });

  it('user_agent_filter denies by regular expression', async () => {
    await route('/ua', { user_agent_filter: { allow: [], deny: ['(?i)badbot'] } });
    expect((await request(a.http, '/ua/x', { headers: { 'user-agent': 'BadBot/1.0' } })).status).toBe(403);
    expect((await request(b.http, '/ua/x', { headers: { 'user-agent': 'curl/8' } })).status).toBe(200);
  });

  it('compression: gzip and brotli by Accept-Encoding', async () => {
    await route('/gz', { compression: {} });
    const gz = await request(a.http, '/gz/x', { headers: { 'accept-encoding': 'gzip' } });
    expect(gz.headers['content-encoding']).toBe('gzip');
    expect(JSON.parse(gunzipSync(gz.raw).toString()).url).toBe('/gz/x');
    const br = await request(b.http, '/gz/y', { headers: { 'accept-encoding': 'br' } });
    expect(br.headers['content-encoding']).toBe('br');
    expect(JSON.parse(brotliDecompressSync(br.raw).toString()).url).toBe('/gz/y');
    const plain = await request(a.http, '/gz/z');
    expect(plain.headers['content-encoding']).toBeUndefined();
  });

  it('circuit_breaker trips on upstream errors and answers 503 itself', async () => {
    await route('/cb', { circuit_breaker: { tripped_duration: 30, rolling_window: 10, num_buckets: 10, volume_threshold: 5, error_threshold_percentage: 0.5 } });
    const statuses: number[] = [];
    for (let i = 0; i < 10; i++) statuses.push((await request(a.http, '/cb/status/500')).status);
    // The route's probe (one success) counts toward the volume: 1 + 4 errors trip it at 80 %.
    expect(statuses.slice(0, 4)).toEqual([500, 500, 500, 500]);
    expect(statuses.at(-1)).toBe(503);
    expect((await request(a.http, '/cb/fine')).status).toBe(503); // tripped: nothing reaches the upstream
  });

  it('webhook_verification checks a GitHub signature', async () => {
    await route('/wh', { webhook_verification: { provider: 'GITHUB', secret: 's3cret' } });
    const body = JSON.stringify({ zen: 'Keep it logically awesome.' });
    const sig = `sha256=${createHmac('sha256', 's3cret').update(body).digest('hex')}`;
    const ok = await request(a.http, '/wh/hook', { method: 'POST', body, headers: { 'content-type': 'application/json', 'x-hub-signature-256': sig, 'x-github-event': 'ping' } });
    expect(ok.status).toBe(200);
    expect(ok.json().bytes).toBe(Buffer.byteLength(body));
    const bad = await request(b.http, '/wh/hook', { method: 'POST', body, headers: { 'content-type': 'application/json', 'x-hub-signature-256': 'sha256=00', 'x-github-event': 'ping' } });
    expect(bad.status).toBe(403);
  });

  it('refuses traffic on a route with an authentication module it does not enforce, never serving it open', async () => {
    const r = await api('POST', `/edges/https/${edgeId}/routes`, { match_type: 'path_prefix', match: '/auth', backend: { enabled: true, backend_id: backendId }, oauth: { provider: { google: {} } } });
    expect(r.status).toBe(201);
    for (const n of [a, b]) {
      const res = await waitFor(`${n.nodeId} refuses /auth`, async () => {
        const x = await request(n.http, '/auth/x');
        return x.headers['warren-error-code'] === 'ERR_WARREN_7010' ? x : null;
      });
      expect(res.status).toBe(503);
      expect(res.json().msg).toMatch(/oauth: client_id and client_secret are required/); // no managed app: 503, never open
    }
  });
});
