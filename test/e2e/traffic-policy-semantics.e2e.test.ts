import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { Redis } from 'ioredis';
import { digestKey, redisKeyPattern } from '../../services/ingress/src/ratelimit/index.js';
import { waitFor } from '../support/cluster.js';
import { startPolicyCluster, type PolicyCluster } from '../support/policy-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * Where the traffic policy follows ngrok's documented semantics, on live traffic (a control plane,
 * one ingress node with Redis, our agent, an upstream): custom-response status codes, defaults,
 * `content` and interpolation; add-headers appending (Host replaced); rate-limit buckets of
 * same-named actions; `req.headers` read in any case; a deny whose expression fails to evaluate
 * denies.
 */

const HOST = 'semantics.e2e.test';
let c: PolicyCluster;
const prefix = `e2e-sem-${randomBytes(4).toString('hex')}`;
const redisUrl = inject('redisUrl');

const rl = (name: string, capacity: number) => ({ type: 'rate-limit', config: { name, algorithm: 'sliding_window', capacity, rate: '60s', bucket_key: ['req.host'] } });

/** The upstream's view of a request: the raw header pairs it received. */
const rawHeaders = (r: { json: () => any }): [string, string][] => {
  const raw = r.json().raw as string[];
  return raw.flatMap((n, i) => (i % 2 === 0 ? [[n.toLowerCase(), raw[i + 1]!] as [string, string]] : []));
};
const values = (pairs: [string, string][], name: string) => pairs.filter(([n]) => n === name).map(([, v]) => v);

beforeAll(async () => {
  c = await startPolicyCluster({
    name: 'semantics',
    host: HOST,
    ingressEnv: (nodeId) => ({ REDIS_URL: redisUrl, RATE_LIMIT_SERVER_ID: `${prefix}-${nodeId}` }),
    upstream: (req, res) => {
      req.resume();
      req.on('end', () => {
        // Two values of x-multi and set-cookie, as an upstream may send them.
        res.writeHead(200, ['content-type', 'application/json', 'x-multi', 'one', 'x-multi', 'two', 'set-cookie', 'a=1', 'set-cookie', 'b=2']);
        res.end(JSON.stringify({ url: req.url, raw: req.rawHeaders }));
      });
    },
  });
}, CLUSTER_HOOK_MS);

afterAll(async () => {
  await c?.stop();
  const redis = new Redis(redisUrl);
  const keys = await redis.keys(redisKeyPattern(`${prefix}-semantics-a`));
  if (keys.length) await redis.del(...keys);
  redis.disconnect();
}, 60_000);

describe('custom-response', () => {
  it('refuses a 1xx status (an interim response: the client would wait for another), naming config.status_code', async () => {
    for (const status_code of [100, 101, 199]) {
      const r = await c.tryPolicy({ inbound: [{ actions: [{ type: 'custom-response', config: { status_code, body: 'hello' } }] }] });
      expect(r.status).toBe(400);
      expect(r.body.msg).toContain(`inbound[0].actions[0].config.status_code: must be from 200 to 599, got ${status_code}`);
    }
    const both = await c.tryPolicy({ inbound: [{ actions: [{ type: 'custom-response', config: { body: 'a', content: 'b' } }] }] });
    expect([both.status, both.body.msg]).toEqual([400, expect.stringContaining('inbound[0].actions[0].config.content')]);
    const bad = await c.tryPolicy({ inbound: [{ actions: [{ type: 'custom-response', config: { body: 'hi ${req.nope}' } }] }] });
    expect([bad.status, bad.body.msg]).toEqual([400, expect.stringContaining('inbound[0].actions[0].config.body: ${…} does not compile')]);
  });

  it("follows ngrok: status 200 by default, content as the body, ${…} in the body and header values, a content-type inferred when none is given", async () => {
    await c.policyRoute('/cr', {
      inbound: [
        { expressions: ["req.url.path == '/cr/content'"], actions: [{ type: 'custom-response', config: { content: 'legacy ${req.method}' } }] },
        { actions: [{ type: 'custom-response', config: { status_code: 202, body: '{"host":"${req.host}","ua":"${req.user_agent}","path":"${req.url.path}"}', headers: { 'content-type': 'application/json', 'x-seen': '${req.headers["x-probe"][0]}' } } }] },
      ],
    });
    const legacy = await c.request('/cr/content');
    expect([legacy.status, legacy.body, legacy.headers['content-type']]).toEqual([200, 'legacy GET', 'text/plain; charset=utf-8']);
    const r = await c.request('/cr/x', { headers: { 'user-agent': 'probe-ua', 'x-probe': 'p1' } });
    expect([r.status, r.headers['content-type'], r.headers['x-seen']]).toEqual([202, 'application/json', 'p1']);
    expect(r.json()).toEqual({ host: HOST, ua: 'probe-ua', path: '/cr/x' });
    // a failing ${…} in a header leaves the header out; the response still goes
    const noProbe = await c.request('/cr/y');
    expect([noProbe.status, noProbe.headers['x-seen'], noProbe.json().path]).toEqual([202, undefined, '/cr/y']);
  });
});

describe('add-headers (ngrok: appends, "unless it is the host header")', () => {
  it('appends to a response header the upstream sent twice, and to a request header the client sent', async () => {
    await c.policyRoute('/hdr', {
      inbound: [{ actions: [{ type: 'add-headers', config: { headers: { 'x-in': 'added', host: 'backend.internal' } } }] }],
      outbound: [{ actions: [{ type: 'add-headers', config: { headers: { 'x-multi': 'three', 'set-cookie': 'c=3' } } }] }],
    });
    const r = await c.request('/hdr/x', { headers: { 'x-in': 'client' } });
    expect(r.status).toBe(200);
    expect(r.headers['x-multi']).toBe('one, two, three');
    expect(r.headers['set-cookie']).toEqual(['a=1', 'b=2', 'c=3']);
    const up = rawHeaders(r);
    expect(values(up, 'x-in')).toEqual(['client', 'added']);
    // Host is replaced, never doubled
    expect(values(up, 'host')).toEqual(['backend.internal']);
  });

  it('replaces after remove-headers, on the request and the response', async () => {
    await c.policyRoute('/rep', {
      inbound: [{ actions: [{ type: 'remove-headers', config: { headers: ['X-In'] } }, { type: 'add-headers', config: { headers: { 'x-in': 'policy' } } }] }],
      outbound: [{ actions: [{ type: 'remove-headers', config: { headers: ['X-Multi', 'set-cookie'] } }, { type: 'add-headers', config: { headers: { 'x-multi': 'only', 'set-cookie': 'c=3' } } }] }],
    });
    const r = await c.request('/rep/x', { headers: { 'x-in': 'client' } });
    expect([r.status, r.headers['x-multi'], r.headers['set-cookie']]).toEqual([200, 'only', ['c=3']]);
    expect(values(rawHeaders(r), 'x-in')).toEqual(['policy']);
  });
});

describe('req.headers in any case', () => {
  it("req.headers['X-User'] finds x-user (the map's keys are lower-case)", async () => {
    await c.policyRoute('/case', {
      inbound: [
        { expressions: ["req.headers['X-User'][0] == 'alice'", "'X-USER' in req.headers"], actions: [{ type: 'custom-response', config: { status_code: 299, body: 'upper' } }] },
        { expressions: ["has(req.headers.x_none) || !('X-None' in req.headers)"], actions: [{ type: 'custom-response', config: { status_code: 298, body: 'absent' } }] },
      ],
    });
    const r = await c.request('/case/x', { headers: { 'X-User': 'alice' } });
    expect([r.status, r.body]).toEqual([299, 'upper']);
    const other = await c.request('/case/x', { headers: { 'X-User': 'bob' } });
    expect([other.status, other.body]).toEqual([298, 'absent']);
  });
});

describe('an expression that fails to evaluate', () => {
  it('in a rule with a deny action denies (fails closed); in any other rule, the rule is skipped', async () => {
    // The audit's policy (H1): a request without the header used to reach the upstream.
    for (const [match, expr] of [
      ['/key-index', "req.headers['x-api-key'][0] != 'secret'"],
      ['/key-fn', "getReqHeader('x-api-key')[0] != 'secret'"],
    ] as const) {
      await c.policyRoute(match, {
        on_http_request: [
          { expressions: ["req.headers['x-tag'][0] == 'a'"], actions: [{ type: 'add-headers', config: { headers: { 'x-tagged': 'yes' } } }] },
          { expressions: [expr], actions: [{ type: 'deny' }] },
        ],
      });
      const none = await c.request(`${match}/x`);
      expect([none.status, none.body], expr).toEqual([403, '']);
      expect((await c.request(`${match}/x`, { headers: { 'x-api-key': 'wrong' } })).status, expr).toBe(403);
      const ok = await c.request(`${match}/x`, { headers: { 'x-api-key': 'secret' } });
      expect([ok.status, ok.json().url], expr).toEqual([200, `${match}/x`]);
      // The add-headers rule whose expression failed (no x-tag) was skipped, not applied.
      expect(values(rawHeaders(ok), 'x-tagged'), expr).toEqual([]);
    }
  });
});

describe('rate-limit names', () => {
  it('refuses a second rate-limit of the same name in a direction, naming it', async () => {
    const r = await c.tryPolicy({ inbound: [{ actions: [rl('shared', 2)] }, { actions: [rl('shared', 100)] }] });
    expect(r.status).toBe(400);
    expect(r.body.msg).toContain('inbound[1].actions[0].config.name: "shared" is already the name of the rate-limit at inbound[0].actions[0]');
  });

  it('a stored policy with two of one name gives each its own bucket', async () => {
    const good = { inbound: [{ expressions: ["req.url.path.startsWith('/same/a')"], actions: [rl('shared', 2)] }, { expressions: ["req.url.path.startsWith('/same/b')"], actions: [rl('other', 100)] }] };
    const id = await c.policyRoute('/same', good);
    // As a control plane that did not refuse them stored it: straight into the database, then any
    // change of the route pushes it to the node.
    const stored = { inbound: [good.inbound[0], { ...good.inbound[1], actions: [rl('shared', 100)] }] };
    const db = new pg.Client({ connectionString: c.databaseUrl });
    await db.connect();
    try {
      const { rowCount } = await db.query(`UPDATE https_edge_routes SET modules = jsonb_set(modules, '{traffic_policy,value}', to_jsonb($2::text)) WHERE id = $1`, [id, JSON.stringify(stored)]);
      expect(rowCount).toBe(1);
    } finally {
      await db.end();
    }
    await c.apiExpecting(200, 'PATCH', `/edges/https/${c.edgeId}/routes/${id}`, { description: 'pushes the stored policy' });
    // Until the node has the stored policy, /same/b counts in "other"; then in "shared" at
    // capacity 100, keyed by its place (`compile.ts`): wait for that bucket to appear in Redis.
    const digest = digestKey(`tp:${JSON.stringify([id, 'inbound', 'shared', 'inbound[1].actions[0]'])}${JSON.stringify([HOST])}`);
    const redis = new Redis(redisUrl);
    try {
      await waitFor('the node applies the stored policy', async () => {
        expect((await c.request('/same/b/probe')).status).toBe(200);
        const keys = await redis.keys(redisKeyPattern(`${prefix}-semantics-a`));
        return keys.some((k) => k.endsWith(`:${digest}`)) ? true : null;
      });
    } finally {
      redis.disconnect();
    }
    // Before: both counted in one bucket, so three on /same/b left /same/a (capacity 2) limited.
    for (let i = 0; i < 2; i++) expect((await c.request('/same/b')).status).toBe(200);
    expect([(await c.request('/same/a')).status, (await c.request('/same/a')).status, (await c.request('/same/a')).status]).toEqual([200, 200, 429]);
  });
});
