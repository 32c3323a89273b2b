import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { Redis } from 'ioredis';
import { bufferKey } from '@warren/shared';
import { waitFor } from '../support/cluster.js';
import { startPolicyCluster, type PolicyCluster } from '../support/policy-cluster.js';

/**
 * The traffic-policy `set-vars` and `log` actions through real processes: a control plane that
 * validates the policies (bad ones are 400s naming the field), an ingress, our agent and an
 * upstream that echoes the request headers it got. The account subscribes a destination to
 * `http_request_complete.v0`; the events' `traffic_policy.logs` are read from the destination's
 * Redis buffer (no worker runs).
 */

const HOST = 'vars.e2e.test';
const redisUrl = inject('redisUrl');
const prefix = `warren_test_${inject('runId')}_${randomBytes(3).toString('hex')}`;
let c: PolicyCluster;
let redis: Redis;
let edgeId: string;
let destId: string;

const api = (method: string, p: string, body?: unknown) => c.api(method, p, body);
const request = (p: string, headers: Record<string, string> = {}) => c.request(p, { headers });
const routeBody = (match: string, policy: string) => c.routeBody(match, { traffic_policy: { value: policy } });

beforeAll(async () => {
  redis = new Redis(redisUrl);
  c = await startPolicyCluster({ name: 'vars', host: HOST, ingressEnv: () => ({ REDIS_URL: redisUrl, RATE_LIMIT_SERVER_ID: `${prefix}-rl`, EVENTS_PREFIX: prefix }) });
  ({ edgeId } = c);
  destId = (await c.apiExpecting(201, 'POST', '/event_destinations', { target: { datadog: { api_key: 'dummy-datadog-key' } } })).id;
  await c.apiExpecting(201, 'POST', '/event_subscriptions', { sources: [{ type: 'http_request_complete.v0' }], destination_ids: [destId] });
}, 90_000);

afterAll(async () => {
  await c?.stop();
  if (redis) {
    const keys = await redis.keys(`${prefix}*`);
    if (keys.length) await redis.del(...keys);
    redis.disconnect();
  }
}, 60_000);

const POLICY = `
inbound:
  - actions:
      - type: set-vars
        config:
          vars:
            - user: "\${size(getReqHeader('x-user')) > 0 ? getReqHeader('x-user')[0] : 'anonymous'}"
            - tier: "\${vars.user == 'alice' ? 'gold' : 'basic'}"
            - greeting: Hello, \${vars.user}!
            - limits: {rpm: 60, paths: [/vars]}
  - expressions: ["vars.tier == 'gold'", "vars.limits.rpm == 60"]
    actions:
      - type: add-headers
        config: {headers: {x-tier: "\${vars.tier}", x-greeting: "\${vars.greeting}"}}
      - type: log
        config:
          metadata:
            message: gold request
            user: \${vars.user}
            path: \${req.path}
            n: \${size(vars.user)}
            limits: \${vars.limits}
  - expressions: ["vars.never_set == 'x'"]
    actions: [{type: deny}]
outbound:
  - expressions: ["!has(vars.user)"]
    actions:
      - type: set-vars
        config: {vars: [{status: "\${res.status_code}"}]}
      - type: add-headers
        config: {headers: {x-out-status: "\${vars.status}"}}
      - type: log
        config: {metadata: {phase: outbound, status: "\${vars.status}"}}
`;

describe('set-vars and log on live traffic', () => {
  it('refuses bad set-vars and log configs with a 400 naming the field', async () => {
    const bad: [string, RegExp][] = [
      ['inbound:\n  - actions:\n      - type: set-vars\n        config: {vars: [{my-var: 1}]}\n', /inbound\[0\]\.actions\[0\]\.config\.vars\[0\]: "my-var" is not a valid variable name/],
      ['inbound:\n  - actions:\n      - type: set-vars\n        config: {vars: [{a: 1, b: 2}]}\n', /inbound\[0\]\.actions\[0\]\.config\.vars\[0\]: must set exactly one variable/],
      ['inbound:\n  - actions:\n      - type: set-vars\n        config: {vars: [{a: "${req.nope}"}]}\n', /inbound\[0\]\.actions\[0\]\.config\.vars\[0\]\.a: \$\{…\} does not compile/],
      [JSON.stringify({ inbound: [{ actions: [{ type: 'set-vars', config: { vars: Array.from({ length: 65 }, (_, i) => ({ [`v${i}`]: i })) } }] }] }), /config\.vars: must have at most 64 entries/],
      ['outbound:\n  - actions:\n      - type: log\n        config: {metadata: {msg: "${req.path"}}\n', /outbound\[0\]\.actions\[0\]\.config\.metadata\.msg: \$\{…\} unterminated/],
      [JSON.stringify({ inbound: [{ actions: [{ type: 'log', config: { metadata: { msg: 'x'.repeat(5000) } } }] }] }), /config\.metadata\.msg: value is over 4096 characters/],
    ];
    for (const [policy, message] of bad) {
      const r = await api('POST', `/edges/https/${edgeId}/routes`, routeBody('/bad', policy));
      expect(r.status, policy).toBe(400);
      expect(r.body.msg).toMatch(message);
    }
  });

  it('sets variables for later rules of the same direction, and logs to http_request_complete.v0', async () => {
    const created = await api('POST', `/edges/https/${edgeId}/routes`, routeBody('/vars', POLICY));
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    await waitFor('the route serves', async () => (await request('/vars/ready')).status === 200, 20_000);

    const alice = await request('/vars/a', { 'x-user': 'alice' });
    expect(alice.status).toBe(200);
    const seen = JSON.parse(alice.body).headers;
    expect([seen['x-tier'], seen['x-greeting']]).toEqual(['gold', 'Hello, alice!']);
    // Outbound rules have their own vars (ngrok scopes them to a phase): `vars.user` is unset there.
    expect(alice.headers['x-out-status']).toBe('200');

    const bob = await request('/vars/b', { 'x-user': 'bob' });
    expect(bob.status).toBe(200); // the rule reading an unset variable is skipped, not a deny
    expect(JSON.parse(bob.body).headers['x-tier']).toBeUndefined();

    const events = await waitFor('both events', async () => {
      const all = (await redis.lrange(bufferKey(prefix, destId), 0, -1)).map((s) => JSON.parse(s) as { event_type: string; object: any });
      const mine = all.filter((e) => e.event_type === 'http_request_complete.v0' && ['/vars/a', '/vars/b'].includes(e.object.http.request.url.path));
      return mine.length >= 2 ? mine : null;
    });
    const byPath = Object.fromEntries(events.map((e) => [e.object.http.request.url.path, e.object]));
    expect(byPath['/vars/a'].traffic_policy).toEqual({
      logs: [
        { metadata: { message: 'gold request', user: 'alice', path: '/vars/a', n: 5, limits: { rpm: 60, paths: ['/vars'] } } },
        { metadata: { phase: 'outbound', status: 200 } },
      ],
    });
    expect(byPath['/vars/b'].traffic_policy).toEqual({ logs: [{ metadata: { phase: 'outbound', status: 200 } }] });
    expect(byPath['/vars/a'].warren).toMatchObject({ edge_id: edgeId, rate_limit: null });
  });
});
