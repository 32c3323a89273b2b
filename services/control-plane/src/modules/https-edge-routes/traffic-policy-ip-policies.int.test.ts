import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApi, type Account, type TestApi } from '../../../../../test/support/api.js';
import { createIpPolicy, errorOf } from '../https-edges/testing.js';

/**
 * The traffic policy's `restrict-ips` `ip_policies` through the real API on Postgres: references
 * are checked when the policy is saved (another account's id exactly like a missing one), and a
 * referenced IP policy cannot be deleted (409), as for the ip_restriction module.
 */

let api: TestApi;
let a: Account;
let b: Account;
let edge: string;
let edgeB: string;

beforeAll(async () => {
  api = await startTestApi();
  a = await api.account('a');
  b = await api.account('b');
  edge = (await a.call('POST', '/edges/https', { description: 'tp refs' })).body.id;
  edgeB = (await b.call('POST', '/edges/https', { description: 'tp refs b' })).body.id;
});
afterAll(() => api.close());

let n = 0;
const uniq = () => `/tp${++n}`;
/** A policy whose second rule's restrict-ips names `ids`. */
const policy = (ids: string[], extra = '') => `inbound:
  - actions:
      - type: add-headers
        config: {headers: {x-a: b}}
  - actions:
      - type: restrict-ips
        config: {deny: [10.0.0.0/8]${extra}}
      - type: restrict-ips
        config: {ip_policies: [${ids.join(', ')}]}
`;
const PATH = 'inbound[1].actions[1].config.ip_policies';
const createRoute = (acct: Account, value: string) => acct.call('POST', `/edges/https/${acct === b ? edgeB : edge}/routes`, { match_type: 'path_prefix', match: uniq(), traffic_policy: { value } });
/** A policy naming no IP policy. */
const NO_REFS = 'inbound:\n  - actions:\n      - type: restrict-ips\n        config: {deny: [10.0.0.0/8]}\n';
const refsOf = async (routeId: string) =>
  (await api.db.query('SELECT ip_policy_id FROM https_edge_route_traffic_policy_ip_policies WHERE route_id = $1 ORDER BY ip_policy_id', [routeId])).rows.map((r) => r.ip_policy_id);

describe('restrict-ips ip_policies references', () => {
  it("accepts the account's IP policies and refuses a missing or another account's one alike (400, naming the place)", async () => {
    const ipp = await createIpPolicy(api, a);
    const ipp2 = await createIpPolicy(api, a);
    const ippB = await createIpPolicy(api, b);
    const ok = await createRoute(a, policy([ipp, ipp2]));
    expect(ok.status, JSON.stringify(ok.body)).toBe(201);
    expect(ok.body.traffic_policy).toEqual({ enabled: true, value: policy([ipp, ipp2]) });
    expect(await refsOf(ok.body.id)).toEqual([ipp, ipp2].sort());

    const missing = 'ipp_2qT9aaaaaaaaaaaaaaaaaaaaaaa';
    const other = errorOf(await createRoute(a, policy([ipp, ippB])));
    const absent = errorOf(await createRoute(a, policy([ipp, missing])));
    expect(other).toEqual({ status: 400, code: 'ERR_WARREN_3002', field: 'traffic_policy.value', msg: `traffic_policy.value: ${PATH}[1]: no IP policy with id "${ippB}" in this account` });
    expect(absent).toEqual({ ...other, msg: other.msg.replace(ippB, missing) });
    // b cannot name a's policy either, and learns no more than about a missing one.
    const fromB = errorOf(await createRoute(b, policy([ipp])));
    expect(fromB).toEqual({ ...other, msg: other.msg.replace(ippB, ipp).replace(`${PATH}[1]`, `${PATH}[0]`) });
    expect(errorOf(await createRoute(b, policy([ippB])))).toMatchObject({ status: 201 });
    // a malformed id is refused by the document check (6900)
    expect(errorOf(await createRoute(a, policy(['ipp_123'])))).toMatchObject({ status: 400, code: 'ERR_WARREN_6900', msg: expect.stringContaining(`${PATH}[0]: "ipp_123" is not an IP policy id`) });
  });

  it('checks references on PATCH and module PUT (bare and wrapped), and mirrors the references on every change', async () => {
    const ipp = await createIpPolicy(api, a);
    const ipp2 = await createIpPolicy(api, a);
    const ippB = await createIpPolicy(api, b);
    const r = (await createRoute(a, policy([ipp]))).body;
    const patch = (value: string) => a.call('PATCH', `/edges/https/${edge}/routes/${r.id}`, { traffic_policy: { value } });
    expect(errorOf(await patch(policy([ippB])))).toMatchObject({ status: 400, code: 'ERR_WARREN_3002', field: 'traffic_policy.value' });
    const put = await a.call('PUT', `/edges/https/${edge}/routes/${r.id}/traffic_policy`, { value: policy([ippB]) });
    expect(errorOf(put)).toMatchObject({ status: 400, code: 'ERR_WARREN_3002', field: 'value', msg: `value: ${PATH}[0]: no IP policy with id "${ippB}" in this account` });
    const wrapped = await a.call('PUT', `/edges/https/${edge}/routes/${r.id}/traffic_policy`, { id: r.id, edge_id: edge, module: { value: policy([ippB]) } });
    expect(errorOf(wrapped)).toMatchObject({ status: 400, code: 'ERR_WARREN_3002', field: 'module.value' });
    expect(await refsOf(r.id)).toEqual([ipp]);

    expect((await patch(policy([ipp2]))).status).toBe(200);
    expect(await refsOf(r.id)).toEqual([ipp2]);
    // Other module changes keep the references.
    expect((await a.call('PATCH', `/edges/https/${edge}/routes/${r.id}`, { description: 'x', compression: {} })).status).toBe(200);
    expect(await refsOf(r.id)).toEqual([ipp2]);
    // enabled: false keeps them too (the policy is still stored).
    expect((await a.call('PUT', `/edges/https/${edge}/routes/${r.id}/traffic_policy`, { enabled: false, value: policy([ipp2]) })).status).toBe(200);
    expect(await refsOf(r.id)).toEqual([ipp2]);
    expect((await a.call('DELETE', `/edges/https/${edge}/routes/${r.id}/traffic_policy`)).status).toBe(204);
    expect(await refsOf(r.id)).toEqual([]);
  });

  it('blocks deleting a referenced IP policy (409, naming the route) until the route lets go; rules cascade as before', async () => {
    const ipp = await createIpPolicy(api, a);
    const rule = await a.call('POST', '/ip_policy_rules', { ip_policy_id: ipp, cidr: '127.0.0.0/8', action: 'allow' });
    expect(rule.status).toBe(201);
    const r = (await createRoute(a, policy([ipp]))).body;
    const refused = await a.call('DELETE', `/ip_policies/${ipp}`);
    expect(errorOf(refused)).toMatchObject({ status: 409, code: 'ERR_WARREN_4100' });
    expect(refused.body.msg).toBe(`the IP policy is listed by a restrict-ips action's ip_policies in the traffic policy of route ${r.id} (edge ${edge}); remove it there first`);
    // Listed by both the module and the policy of another route: both named.
    const both = await a.call('POST', `/edges/https/${edge}/routes`, { match_type: 'path_prefix', match: uniq(), ip_restriction: { ip_policy_ids: [ipp] }, traffic_policy: { value: policy([ipp]) } });
    expect(both.status).toBe(201);
    const msg = (await a.call('DELETE', `/ip_policies/${ipp}`)).body.msg as string;
    expect(msg).toContain(`the ip_restriction module of route ${both.body.id}`);
    expect(msg).toContain(`traffic policy of route ${both.body.id}`);
    // Rule edits are not blocked.
    expect((await a.call('PATCH', `/ip_policy_rules/${rule.body.id}`, { cidr: '127.0.0.0/16' })).status).toBe(200);

    // Another account's delete of it is a 404, as always.
    expect((await b.call('DELETE', `/ip_policies/${ipp}`)).status).toBe(404);
    expect((await a.call('DELETE', `/edges/https/${edge}/routes/${both.body.id}`)).status).toBe(204);
    expect((await a.call('PATCH', `/edges/https/${edge}/routes/${r.id}`, { traffic_policy: { value: NO_REFS } })).status).toBe(200);
    expect(await refsOf(r.id)).toEqual([]);
    expect((await a.call('DELETE', `/ip_policies/${ipp}`)).status).toBe(204);
    expect((await a.call('GET', `/ip_policy_rules/${rule.body.id}`)).status).toBe(404);
  });

  it('deleting the route (or its edge) lets go of its references', async () => {
    const ipp = await createIpPolicy(api, a);
    const e2 = (await a.call('POST', '/edges/https', { description: 'doomed' })).body.id;
    const r = await a.call('POST', `/edges/https/${e2}/routes`, { match_type: 'path_prefix', match: '/', traffic_policy: { value: policy([ipp]) } });
    expect(r.status).toBe(201);
    expect((await a.call('DELETE', `/ip_policies/${ipp}`)).status).toBe(409);
    expect((await a.call('DELETE', `/edges/https/${e2}`)).status).toBe(204);
    expect((await a.call('DELETE', `/ip_policies/${ipp}`)).status).toBe(204);
  });
});
