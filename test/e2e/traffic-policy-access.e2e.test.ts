import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ControlPlaneProcess } from '../support/processes.js';
import { callApiExpecting, waitFor, type IngressProcess } from '../support/cluster.js';
import { createDb, createPool } from '../../services/control-plane/src/db/pool.js';
import { createAccountWithKey } from '../../services/control-plane/src/modules/accounts/accounts.service.js';
import { startPolicyCluster, type PolicyCluster, type PolicyRequestOptions } from '../support/policy-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * The traffic-policy access actions `restrict-ips` and `basic-auth` on live traffic, through real
 * processes: a control plane, an ingress listening on `::` (so clients reach it over IPv4 as
 * 127.0.0.1 and over IPv6 as ::1), our agent and an upstream that echoes what reached it. Every
 * policy is saved through the REST API.
 */

const HOST = 'access.e2e.test';
const SECRET = 'e2e-Pa55word-never-logged';
let c: PolicyCluster;
/** The control plane and the one ingress node (from the cluster). */
let cp: ControlPlaneProcess, ing: IngressProcess;
let edgeId: string;

const api = (method: string, p: string, body?: unknown) => c.api(method, p, body);
const request = (p: string, opts?: PolicyRequestOptions) => c.request(p, opts);
const basic = (userPass: string) => ({ authorization: `Basic ${Buffer.from(userPass).toString('base64')}` });

/** Adds a route; `match` must not be a prefix of another route's (the probe would hit that one). */
const route = (match: string, policy: unknown): Promise<string> => c.policyRoute(match, policy);

/** A route create that must be refused: its 400 message. */
async function refused(policy: string): Promise<string> {
  const r = await c.tryPolicy(policy);
  expect(r.status, JSON.stringify(r.body)).toBe(400);
  expect(r.body.error_code).toBe('ERR_WARREN_6900');
  return r.body.msg as string;
}

beforeAll(async () => {
  // Listening on `::`, a node takes IPv4 (127.0.0.1) and IPv6 (::1) clients.
  c = await startPolicyCluster({ name: 'access', host: HOST, ingressEnv: () => ({ HOST: '::' }) });
  ({ cp, a: ing, edgeId } = c);
}, CLUSTER_HOOK_MS);

afterAll(() => c?.stop(), 60_000);

describe('restrict-ips on live traffic', () => {
  it('allows by CIDR over IPv4 and IPv6, denies with 403, and shows its results to later rules', async () => {
    await route('/ips', {
      inbound: [
        { actions: [{ type: 'restrict-ips', config: { allow: ['127.0.0.0/8', '2001:db8::/32'] } }] },
        { actions: [{ type: 'add-headers', config: { headers: { 'x-ips': '${actions.ngrok.restrict_ips.action} ${actions.ngrok.restrict_ips.matched_cidr}' } } }] },
      ],
    });
    const v4 = await request('/ips/x');
    expect(v4.status, v4.raw.toString()).toBe(200);
    expect(v4.json().headers['x-ips']).toBe('allow 127.0.0.0/8');
    const v6 = await request('/ips/x', { from: '::1' });
    expect(v6.status).toBe(403);
    expect(v6.headers['warren-error-code']).toBe('ERR_WARREN_7120');
    expect(v6.json()).toMatchObject({ error_code: 'ERR_WARREN_7120', status_code: 403 });
  });

  it('denies an IPv6 CIDR without touching IPv4 (::/0 is IPv6 only)', async () => {
    await route('/v6deny', { inbound: [{ actions: [{ type: 'restrict-ips', config: { deny: ['::/0'] } }] }] });
    expect((await request('/v6deny/x')).status).toBe(200);
    expect((await request('/v6deny/x', { from: '::1' })).status).toBe(403);
    await route('/v6only', { inbound: [{ actions: [{ type: 'restrict-ips', config: { allow: ['::1/128'] } }] }] });
    expect((await request('/v6only/x')).status).toBe(403);
    expect((await request('/v6only/x', { from: '::1' })).status).toBe(200);
  });

  it('with enforce: false only records the decision', async () => {
    await route('/dryrun', `inbound:
  - actions:
      - type: restrict-ips
        config: {enforce: false, deny: ["127.0.0.1/32"]}
  - expressions: ["actions.ngrok.restrict_ips.action == 'deny'"]
    actions:
      - type: add-headers
        config: {headers: {x-would-deny: "\${actions.ngrok.restrict_ips.matched_cidr}"}}
`);
    const v4 = await request('/dryrun/x');
    expect([v4.status, v4.json().headers['x-would-deny']]).toEqual([200, '127.0.0.1/32']);
    const v6 = await request('/dryrun/x', { from: '::1' });
    expect([v6.status, v6.json().headers['x-would-deny']]).toEqual([200, undefined]);
  });

  it('refuses bad configurations with a 400 naming the field', async () => {
    const head = (config: string) => `inbound:\n  - actions:\n      - type: restrict-ips\n        config: ${config}\n`;
    expect(await refused(head('{allow: ["127.0.0.1/8"]}'))).toBe('traffic_policy.value: inbound[0].actions[0].config.allow[0]: "127.0.0.1/8" has host bits set; did you mean 127.0.0.0/8?');
    expect(await refused(head('{deny: ["10.0.0.0/8", "::1"]}'))).toMatch(/^traffic_policy\.value: inbound\[0\]\.actions\[0\]\.config\.deny\[1\]: "::1" has no prefix length/);
    expect(await refused(head('{allow: []}'))).toContain('inbound[0].actions[0].config.allow: must have at least one CIDR');
    expect(await refused(head('{ip_policies: [ipp_123]}'))).toContain('inbound[0].actions[0].config.ip_policies[0]: "ipp_123" is not an IP policy id');
    expect(await refused(`outbound:\n  - actions:\n      - type: basic-auth\n        config: {credentials: ["user:password1"]}\n`)).toContain('outbound[0].actions[0].type: basic-auth can only be used in inbound rules');
  });

  it('in the response phase (ngrok: on_http_response) replaces the upstream response with the 403, and records its result', async () => {
    await route('/outips', `on_http_response:
  - expressions: ["res.status_code == 200"]
    actions:
      - type: restrict-ips
        config: {deny: ["::1/128"]}
      - type: add-headers
        config: {headers: {x-ips: "\${actions.ngrok.restrict_ips.action}"}}
`);
    const v4 = await request('/outips/x');
    expect(v4.status, v4.raw.toString()).toBe(200);
    expect(v4.headers['x-ips']).toBe('allow');
    const v6 = await request('/outips/x', { from: '::1' });
    expect(v6.status).toBe(403);
    expect(v6.headers['warren-error-code']).toBe('ERR_WARREN_7120');
    expect(v6.headers['x-ips']).toBeUndefined();
    // The error page, not the upstream's body (its echo of the request).
    expect(v6.json()).toMatchObject({ error_code: 'ERR_WARREN_7120', status_code: 403 });
    expect(v6.json().headers).toBeUndefined();
  });
});

describe('basic-auth on live traffic', () => {
  it('answers 401 with the challenge until valid credentials come; the upstream gets them and the username', async () => {
    const id = await route('/auth', {
      inbound: [
        { actions: [{ type: 'basic-auth', config: { realm: 'Staff area', credentials: [`alice:${SECRET}`, 'bob:another-pass'] } }] },
        { actions: [{ type: 'add-headers', config: { headers: { 'x-user': '${actions.ngrok.basic_auth.credentials.username}' } } }] },
      ],
    });
    for (const headers of [{}, basic('alice:wrong-password'), basic(`mallory:${SECRET}`), { authorization: `Bearer ${SECRET}` }]) {
      const r = await request('/auth/x', { headers });
      expect(r.status).toBe(401);
      expect(r.headers['www-authenticate']).toBe('Basic realm="Staff area"');
      expect(r.headers['warren-error-code']).toBe('ERR_WARREN_7121');
      expect(r.raw.toString()).not.toContain(SECRET);
    }
    for (const from of ['127.0.0.1', '::1'] as const) {
      const ok = await request('/auth/x', { from, headers: basic(`alice:${SECRET}`) });
      expect(ok.status, ok.raw.toString()).toBe(200);
      expect(ok.json().headers['x-user']).toBe('alice');
      // As with ngrok, the Authorization header reaches the upstream.
      expect(ok.json().headers.authorization).toBe(basic(`alice:${SECRET}`).authorization);
    }
    expect((await request('/auth/x', { headers: basic('bob:another-pass') })).json().headers['x-user']).toBe('bob');

    // The API shows the usernames, never the passwords (wire-conventions.md §9).
    const got = await api('GET', `/edges/https/${edgeId}/routes/${id}`);
    expect(JSON.parse(got.body.traffic_policy.value).inbound[0].actions[0].config.credentials).toEqual(['alice:', 'bob:']);
    expect(JSON.stringify(got.body)).not.toContain(SECRET);
  });

  it('IP or password: enforce: false on both, then one rule decides', async () => {
    await route('/either', {
      inbound: [
        { actions: [{ type: 'restrict-ips', config: { enforce: false, allow: ['::1/128'] } }, { type: 'basic-auth', config: { enforce: false, credentials: [`alice:${SECRET}`] } }] },
        { expressions: ["actions.ngrok.restrict_ips.action != 'allow' && !actions.ngrok.basic_auth.credentials.authorized"], actions: [{ type: 'custom-response', config: { status_code: 401, body: 'sign in', headers: { 'www-authenticate': 'Basic realm="either"' } } }] },
      ],
    });
    expect((await request('/either/x', { from: '::1' })).status).toBe(200);
    expect((await request('/either/x', { headers: basic(`alice:${SECRET}`) })).status).toBe(200);
    const no = await request('/either/x', { headers: basic('alice:not-it-at-all') });
    expect([no.status, no.raw.toString(), no.headers['www-authenticate']]).toEqual([401, 'sign in', 'Basic realm="either"']);
  });

  it('refuses bad credentials with a 400 naming the entry, never quoting it', async () => {
    const head = (creds: string) => `inbound:\n  - actions:\n      - type: basic-auth\n        config: {credentials: ${creds}}\n`;
    const noColon = await refused(head(`["ok:12345678", "${SECRET}"]`));
    expect(noColon).toBe('traffic_policy.value: inbound[0].actions[0].config.credentials[1]: must be "username:password": it has no colon');
    const short = await refused(head(`["alice:short"]`));
    expect(short).toBe('traffic_policy.value: inbound[0].actions[0].config.credentials[0]: the password (after the first colon) must have 8 to 128 characters, got 5');
    expect(await refused(head(`[":${SECRET}"]`))).toContain('credentials[0]: the username (before the first colon) must not be empty');
    expect(await refused(head('[]'))).toContain('credentials: must have at least one');
    for (const m of [noColon, short]) expect(m).not.toContain(SECRET);
    // Neither process logged the password.
    expect(cp.output()).not.toContain(SECRET);
    expect(ing.output()).not.toContain(SECRET);
  });
});

describe('restrict-ips ip_policies on live traffic', () => {
  const newIpPolicy = async (): Promise<string> => (await c.apiExpecting(201, 'POST', '/ip_policies', { description: 'e2e' })).id;
  const addRule = async (ipp: string, cidr: string, action: 'allow' | 'deny'): Promise<string> => (await c.apiExpecting(201, 'POST', '/ip_policy_rules', { ip_policy_id: ipp, cidr, action })).id;
  const policyOf = (ids: string[], config: Record<string, unknown> = {}) => ({
    inbound: [
      { actions: [{ type: 'restrict-ips', config: { ...config, ip_policies: ids } }] },
      { actions: [{ type: 'add-headers', config: { headers: { 'x-ips': '${actions.ngrok.restrict_ips.action} ${actions.ngrok.restrict_ips.matched_cidr}' } } }] },
    ],
  });
  const statusOf = async (p: string, from: '127.0.0.1' | '::1') => (await request(p, { from })).status;
  /** Waits until the node answers `p` from `from` with `status` (a config push away). */
  const until = (p: string, from: '127.0.0.1' | '::1', status: number) => waitFor(`${p} from ${from} answers ${status}`, async () => (await statusOf(p, from)) === status);

  it("allows and denies by the IP policy's rules; adding, changing and removing a rule applies to live traffic without saving the route", async () => {
    const ipp = await newIpPolicy();
    await addRule(ipp, '127.0.0.0/8', 'allow');
    const routeId = await route('/pol-live', policyOf([ipp]));
    const v4 = await request('/pol-live/x');
    expect(v4.status, v4.body).toBe(200);
    expect(v4.json().headers['x-ips']).toBe('allow 127.0.0.0/8');
    const v6 = await request('/pol-live/x', { from: '::1' });
    expect([v6.status, v6.headers['warren-error-code']]).toEqual([403, 'ERR_WARREN_7120']);

    const v6Rule = await addRule(ipp, '::1/128', 'allow');
    await until('/pol-live/x', '::1', 200);
    const deny = await addRule(ipp, '127.0.0.1/32', 'deny');
    await until('/pol-live/x', '127.0.0.1', 403);
    expect((await request('/pol-live/x')).headers['warren-error-code']).toBe('ERR_WARREN_7120');
    await c.apiExpecting(204, 'DELETE', `/ip_policy_rules/${deny}`);
    await until('/pol-live/x', '127.0.0.1', 200);
    await c.apiExpecting(200, 'PATCH', `/ip_policy_rules/${v6Rule}`, { cidr: '2001:db8::/32' });
    await until('/pol-live/x', '::1', 403);
    // The route itself never changed.
    expect((await c.apiExpecting(200, 'GET', `/edges/https/${edgeId}/routes/${routeId}`)).traffic_policy.value).toBe(JSON.stringify(policyOf([ipp])));
  });

  it('adds the policies to inline CIDRs: inline deny wins over a policy allow', async () => {
    const ipp = await newIpPolicy();
    await addRule(ipp, '127.0.0.0/8', 'allow');
    await addRule(ipp, '::1/128', 'allow');
    await route('/pol-mixed', policyOf([ipp], { deny: ['::1/128'] }));
    expect((await request('/pol-mixed/x')).json().headers['x-ips']).toBe('allow 127.0.0.0/8');
    expect(await statusOf('/pol-mixed/x', '::1')).toBe(403);
  });

  it("refuses a missing IP policy and another account's alike, with a 400 naming the place in the policy", async () => {
    const pool = createPool(c.databaseUrl, 1);
    let otherKey: string;
    try {
      otherKey = (await createAccountWithKey(createDb(pool), 'access-other-e2e')).token;
    } finally {
      await pool.end();
    }
    const theirs: string = (await callApiExpecting(cp.baseUrl, otherKey, 201, 'POST', '/ip_policies', { description: 'not yours' })).id;
    const mine = await newIpPolicy();
    const missing = 'ipp_2qT9aaaaaaaaaaaaaaaaaaaaaaa';
    const answers = [];
    for (const id of [theirs, missing]) {
      const r = await c.tryPolicy(policyOf([mine, id]));
      answers.push({ status: r.status, code: r.body.error_code, field: r.body.details?.field, msg: String(r.body.msg).replace(id, '<id>') });
    }
    expect(answers[0]).toEqual({ status: 400, code: 'ERR_WARREN_3002', field: 'traffic_policy.value', msg: 'traffic_policy.value: inbound[0].actions[0].config.ip_policies[1]: no IP policy with id "<id>" in this account' });
    expect(answers[1]).toEqual(answers[0]);
  });

  it('keeps a referenced IP policy from being deleted (409) until the route lets go of it', async () => {
    const ipp = await newIpPolicy();
    await addRule(ipp, '127.0.0.0/8', 'allow');
    const routeId = await route('/pol-del', policyOf([ipp]));
    const r = await api('DELETE', `/ip_policies/${ipp}`);
    expect([r.status, r.body.error_code]).toEqual([409, 'ERR_WARREN_4100']);
    expect(r.body.msg).toContain(`traffic policy of route ${routeId}`);
    // Nothing changed for traffic.
    expect([await statusOf('/pol-del/x', '127.0.0.1'), await statusOf('/pol-del/x', '::1')]).toEqual([200, 403]);

    await c.apiExpecting(200, 'PATCH', `/edges/https/${edgeId}/routes/${routeId}`, { traffic_policy: { value: JSON.stringify({ inbound: [{ actions: [{ type: 'restrict-ips', config: { allow: ['::1/128'] } }] }] }) } });
    await until('/pol-del/x', '127.0.0.1', 403);
    await c.apiExpecting(204, 'DELETE', `/ip_policies/${ipp}`);
    expect(await statusOf('/pol-del/x', '::1')).toBe(200);
  });
});
