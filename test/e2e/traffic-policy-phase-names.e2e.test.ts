import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { waitFor } from '../support/cluster.js';
import { startPolicyCluster, type PolicyCluster } from '../support/policy-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * A traffic policy written with ngrok's current phase names, `on_http_request` and
 * `on_http_response` (synonyms of `inbound` / `outbound`), saved through the REST API and
 * enforced on live traffic: a control plane, an ingress, our agent and an upstream. The API
 * returns it as written with its secrets blanked, and a GET→PATCH round trip that renames the
 * phase keeps the stored secret.
 */

const HOST = 'phases.e2e.test';
const PASSWORD = 'phase-names-password-1';
const HOOK_SECRET = 'phase-names-hook-secret-2';
let c: PolicyCluster;

const basic = (userPass: string) => ({ authorization: `Basic ${Buffer.from(userPass).toString('base64')}` });

const POLICY = (teapot: string) => `# written as in ngrok's docs
on_http_request:
  - expressions: ["req.url.path.startsWith('/ph/deny')"]
    actions:
      - type: deny
        config:
          status_code: 451
  - expressions: ["req.url.path.startsWith('/ph/teapot')"]
    actions:
      - type: custom-response
        config:
          status_code: 418
          body: ${teapot}
  - expressions: ["req.url.path.startsWith('/ph/rl')"]
    actions:
      - type: rate-limit
        config:
          name: phase-names
          algorithm: sliding_window
          capacity: 2
          rate: 60s
          bucket_key: [req.host]
  - expressions: ["req.url.path.startsWith('/ph/private')"]
    actions:
      - type: basic-auth
        config:
          realm: phases
          credentials:
            - alice:${PASSWORD}
  - expressions: ["req.url.path.startsWith('/ph/hook')"]
    actions:
      - type: verify-webhook
        config:
          provider: github
          secret: ${HOOK_SECRET}
on_http_response:
  - actions:
      - type: add-headers
        config:
          headers:
            x-phase: "response \${res.status_code}"
`;

const redacted = (text: string) => text.replace(`alice:${PASSWORD}`, '"alice:"').replace(`secret: ${HOOK_SECRET}`, 'secret: ""');

let routeId = '';

beforeAll(async () => {
  c = await startPolicyCluster({ name: 'phases', host: HOST });
  routeId = await c.policyRoute('/ph', POLICY('short and stout'));
}, CLUSTER_HOOK_MS);

afterAll(() => c?.stop(), 60_000);

describe('on_http_request / on_http_response', () => {
  it('are enforced on live traffic, returned with secrets blanked, and keep the secret through a GET→PATCH under the other name', async () => {
    // on_http_request: deny, custom-response, basic-auth, rate-limit; on_http_response runs on every answer.
    const open = await c.request('/ph/open');
    expect([open.status, open.headers['x-phase'], open.json().url]).toEqual([200, 'response 200', '/ph/open']);
    const denied = await c.request('/ph/deny');
    expect([denied.status, denied.headers['x-phase']]).toEqual([451, 'response 451']);
    const teapot = await c.request('/ph/teapot');
    expect([teapot.status, teapot.body, teapot.headers['x-phase']]).toEqual([418, 'short and stout', 'response 418']);
    const anonymous = await c.request('/ph/private');
    expect([anonymous.status, anonymous.headers['www-authenticate']]).toEqual([401, 'Basic realm="phases"']);
    expect((await c.request('/ph/private', { headers: basic('alice:wrong-password') })).status).toBe(401);
    expect((await c.request('/ph/private', { headers: basic(`alice:${PASSWORD}`) })).status).toBe(200);
    const limited = [];
    for (let i = 0; i < 3; i++) limited.push(await c.request('/ph/rl'));
    expect(limited.map((r) => r.status)).toEqual([200, 200, 429]);
    expect(limited[2]!.headers['x-phase']).toBe('response 429');

    // The API returns the document as written, the secrets blanked.
    const got = await c.apiExpecting(200, 'GET', `/edges/https/${c.edgeId}/routes/${routeId}`);
    expect(got.traffic_policy.value).toBe(redacted(POLICY('short and stout')));
    expect(JSON.stringify(got)).not.toContain(PASSWORD);
    expect(JSON.stringify(got)).not.toContain(HOOK_SECRET);

    // Sent back with Warren's names (and a change to see it applied), the blanks keep the stored secrets.
    const edited = (got.traffic_policy.value as string).replace('short and stout', 'tall and proud').replace(/^on_http_request:/m, 'inbound:').replace(/^on_http_response:/m, 'outbound:');
    await c.apiExpecting(200, 'PATCH', `/edges/https/${c.edgeId}/routes/${routeId}`, { traffic_policy: { value: edited } });
    await waitFor('the node applies the edited policy', async () => (await c.request('/ph/teapot')).body === 'tall and proud');
    expect((await c.request('/ph/private', { headers: basic(`alice:${PASSWORD}`) })).status).toBe(200);
    expect((await c.request('/ph/private', { headers: basic('alice:') })).status).toBe(401);
    const again = await c.apiExpecting(200, 'GET', `/edges/https/${c.edgeId}/routes/${routeId}`);
    expect(again.traffic_policy.value).toBe(edited);
  });

  it('refuses both names of one phase, other ngrok phases, and names the key as written in errors', async () => {
    const refused = async (policy: string) => {
      const r = await c.tryPolicy(policy);
      expect(r.status, policy).toBe(400);
      return r.body.msg as string;
    };
    expect(await refused('inbound: []\non_http_request: []\n')).toMatch(/^traffic_policy\.value: on_http_request: on_http_request and inbound are two names of the same phase/);
    expect(await refused('on_tcp_connect: []\n')).toBe(
      'traffic_policy.value: on_tcp_connect: unknown field "on_tcp_connect": this phase is not supported (only HTTP request and response phases are); supported: inbound, outbound, on_http_request, on_http_response',
    );
    expect(await refused('on_http_request:\n  - actions:\n      - type: deny\n      - type: rate-limit\n        config: {algorithm: sliding_window, capacity: 1, rate: 60s, bucket_key: [req.host]}\n')).toBe(
      'traffic_policy.value: on_http_request[0].actions[1].config.name: is required',
    );
    expect(await refused(`on_http_response:\n  - actions:\n      - type: verify-webhook\n        config: {provider: github, secret: ${HOOK_SECRET}}\n`)).toBe(
      'traffic_policy.value: on_http_response[0].actions[0].type: verify-webhook can only be used in on_http_request rules (it checks the request)',
    );
  });
});
