import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { redactTrafficPolicySecrets } from '@warren/shared';
import { startTestApi, type Account, type TestApi } from '../../../../../test/support/api.js';
import { readSnapshot } from '../../config-push/config-reader.js';
import { errorOf } from '../https-edges/testing.js';

/**
 * Secrets inside the traffic policy document through the real API on Postgres
 * (wire-conventions.md §9): answers and events show them blank, a document sending the blank
 * back keeps the stored value (Postgres and the config push hold it), and a blank with nothing
 * stored is a 400 naming the field.
 */

let api: TestApi;
let a: Account;
let edge: string;

beforeAll(async () => {
  api = await startTestApi();
  a = await api.account('a');
  edge = (await a.call('POST', '/edges/https', { description: 'tp secrets' })).body.id;
});
afterAll(() => api.close());

const HOOK = 'whsec-hook-secret-1';
const PW = 'alice-password-1';
const PW2 = 'bob-password-22';
const CS = 'oauth-client-secret-3';
const OS = 'oidc-client-secret-4';
const SECRETS = [HOOK, PW, PW2, CS, OS];

const POLICY = `# every secret-bearing action
inbound:
  - actions:
      - type: verify-webhook
        config:
          provider: github
          secret: ${HOOK} # the GitHub hook secret
  - actions:
      - type: basic-auth
        config:
          realm: staff
          credentials: [alice:${PW}, "bob:${PW2}"]
  - actions:
      - type: oauth
        config: {provider: google, client_id: cid, client_secret: ${CS}}
      - type: openid-connect
        config: {issuer_url: "https://id.example.com", client_id: oid, client_secret: '${OS}'}
`;
const REDACTED = POLICY.replace(`secret: ${HOOK} #`, 'secret: "" #')
  .replace(`[alice:${PW}, "bob:${PW2}"]`, '["alice:", "bob:"]')
  .replace(`client_secret: ${CS}}`, 'client_secret: ""}')
  .replace(`client_secret: '${OS}'}`, 'client_secret: ""}');

let n = 0;
const uniq = () => `/tps${++n}`;
const routePath = (id: string) => `/edges/https/${edge}/routes/${id}`;
const noSecret = (v: unknown) => {
  const s = JSON.stringify(v);
  for (const x of SECRETS) expect(s).not.toContain(x);
};
const storedValue = async (id: string): Promise<string> => (await api.db.query("SELECT modules->'traffic_policy'->>'value' AS v FROM https_edge_routes WHERE id = $1", [id])).rows[0].v;
const events = async (id: string): Promise<{ event_type: string; object: any }[]> =>
  (await api.db.query('SELECT event_type, object FROM outbox WHERE resource_id = $1 ORDER BY seq', [id])).rows;
/** The traffic policy the ingress receives for the route (the config push's snapshot). */
const pushed = async (id: string): Promise<any> => (await readSnapshot(api.db.pool)).entities.routes.find((r) => r.id === id)?.trafficPolicy?.value;

async function create(value: string) {
  return a.call('POST', `/edges/https/${edge}/routes`, { match_type: 'path_prefix', match: uniq(), traffic_policy: { value } });
}

describe('traffic policy secrets', () => {
  it('answers and events show every secret blank; Postgres and the config push hold the real ones', async () => {
    expect(redactTrafficPolicySecrets(POLICY)).toBe(REDACTED);
    const r = await create(POLICY);
    expect(r.status, JSON.stringify(r.body)).toBe(201);
    expect(r.body.traffic_policy).toEqual({ enabled: true, value: REDACTED });
    noSecret(r.body);

    const got = await a.call('GET', routePath(r.body.id));
    expect(got.body.traffic_policy.value).toBe(REDACTED);
    noSecret(got.body);
    const mod = await a.call('GET', `${routePath(r.body.id)}/traffic_policy`);
    expect(mod.body).toEqual({ enabled: true, value: REDACTED });
    const edgeBody = (await a.call('GET', `/edges/https/${edge}`)).body;
    expect(edgeBody.routes.find((x: { id: string }) => x.id === r.body.id).traffic_policy.value).toBe(REDACTED);
    noSecret(edgeBody);

    expect(await storedValue(r.body.id)).toBe(POLICY);
    const doc = await pushed(r.body.id);
    expect(doc.inbound[0].actions[0].config.secret).toBe(HOOK);
    expect(doc.inbound[1].actions[0].config.credentials).toEqual([`alice:${PW}`, `bob:${PW2}`]);
    expect(doc.inbound[2].actions.map((x: any) => x.config.client_secret)).toEqual([CS, OS]);

    const ev = await events(r.body.id);
    expect(ev.map((e) => e.event_type)).toEqual(['https_edge_route_created.v0']);
    expect(ev[0]!.object.traffic_policy.value).toBe(REDACTED);
    noSecret(ev);
  });

  it('a GET→PUT and GET→PATCH round trip keeps the secrets (no change, no event); an edit keeps them too', async () => {
    const id = (await create(POLICY)).body.id;
    const shown = (await a.call('GET', `${routePath(id)}/traffic_policy`)).body;
    const put = await a.call('PUT', `${routePath(id)}/traffic_policy`, shown);
    expect(put.status, JSON.stringify(put.body)).toBe(200);
    expect(put.body).toEqual({ enabled: true, value: REDACTED });
    const wrapped = await a.call('PUT', `${routePath(id)}/traffic_policy`, { id, edge_id: edge, module: shown });
    expect(wrapped.status, JSON.stringify(wrapped.body)).toBe(200);
    const route = (await a.call('GET', routePath(id))).body;
    const patch = await a.call('PATCH', routePath(id), { traffic_policy: route.traffic_policy });
    expect(patch.status, JSON.stringify(patch.body)).toBe(200);
    expect(await storedValue(id)).toBe(POLICY);
    expect((await events(id)).length).toBe(1);

    // An edit with the blanks: applied, secrets kept; the event shows them blank.
    const edited = REDACTED.replace('realm: staff', 'realm: team').replace('["alice:", "bob:"]', '["bob:", "carol:carol-password"]');
    const p2 = await a.call('PATCH', routePath(id), { traffic_policy: { value: edited } });
    expect(p2.status, JSON.stringify(p2.body)).toBe(200);
    expect(p2.body.traffic_policy.value).toBe(edited.replace('carol:carol-password', 'carol:'));
    const doc = await pushed(id);
    expect(doc.inbound[1].actions[0].config).toEqual({ realm: 'team', credentials: [`bob:${PW2}`, 'carol:carol-password'] });
    expect(doc.inbound[0].actions[0].config.secret).toBe(HOOK);
    const ev = await events(id);
    expect(ev.map((e) => e.event_type)).toEqual(['https_edge_route_created.v0', 'https_edge_route_updated.v0']);
    noSecret(ev);
    expect(JSON.stringify(ev)).not.toContain('carol-password');

    // A new value replaces the stored one.
    const p3 = await a.call('PUT', `${routePath(id)}/traffic_policy`, { value: edited.replace('secret: ""', 'secret: new-hook-secret') });
    expect(p3.status, JSON.stringify(p3.body)).toBe(200);
    expect((await pushed(id)).inbound[0].actions[0].config.secret).toBe('new-hook-secret');
    expect(JSON.stringify(p3.body)).not.toContain('new-hook-secret');

    // Deleting the route: its deleted event shows no secret either.
    await a.call('DELETE', `/edges/https/${edge}/routes/${id}`);
    const last = (await events(id)).at(-1)!;
    expect(last.event_type).toBe('https_edge_route_deleted.v0');
    expect(JSON.stringify(last)).not.toContain('new-hook-secret');
    noSecret(last);
  });

  it('refuses a blank secret with nothing stored at its place (400 naming the field), and validates the filled-in document', async () => {
    const created = errorOf(await create(REDACTED));
    expect(created).toMatchObject({ status: 400, code: 'ERR_WARREN_6900', field: 'traffic_policy.value' });
    expect(created.msg).toMatch(/^traffic_policy\.value: inbound\[0\]\.actions\[0\]\.config\.secret: is "", which keeps a stored secret/);

    const id = (await create(POLICY)).body.id;
    // Rules reordered: the blanks are no longer where the secrets are stored.
    const lines = REDACTED.split('\n  - actions:\n');
    const moved = [lines[0], lines[2], lines[1], lines[3]].join('\n  - actions:\n');
    const put = errorOf(await a.call('PUT', `${routePath(id)}/traffic_policy`, { value: moved }));
    expect(put).toMatchObject({ status: 400, code: 'ERR_WARREN_6900', field: 'value' });
    expect(put.msg).toMatch(/^value: inbound\[0\]\.actions\[0\]\.config\.credentials\[0\]: /);
    const wrapped = errorOf(await a.call('PUT', `${routePath(id)}/traffic_policy`, { id, edge_id: edge, module: { value: REDACTED.replace('"alice:"', '"mallory:"') } }));
    expect(wrapped).toMatchObject({ status: 400, code: 'ERR_WARREN_6900', field: 'module.value' });
    expect(wrapped.msg).toMatch(/^module\.value: inbound\[1\]\.actions\[0\]\.config\.credentials\[0\]: /);
    // Filled in, the document is validated as any saved one.
    const bad = errorOf(await a.call('PATCH', routePath(id), { traffic_policy: { value: REDACTED.replace('realm: staff', 'realm: ""') } }));
    expect(bad).toMatchObject({ status: 400, code: 'ERR_WARREN_6900', field: 'traffic_policy.value', msg: expect.stringContaining('traffic_policy.value: inbound[1].actions[0].config.realm: must not be empty') });
    for (const e of [created, put, wrapped, bad]) noSecret(e);
    expect(await storedValue(id)).toBe(POLICY);
    expect((await events(id)).length).toBe(1);
  });

  it('keeps a blank client_secret only for the same issuer_url / provider and client_id (review: the secret followed an issuer the editor chose)', async () => {
    const id = (await create(POLICY)).body.id;
    for (const [value, re] of [
      [REDACTED.replace('https://id.example.com', 'https://idp.attacker.example'), /^traffic_policy\.value: inbound\[2\]\.actions\[1\]\.config\.client_secret: .*issuer_url differs/],
      [REDACTED.replace('client_id: oid', 'client_id: other'), /^traffic_policy\.value: inbound\[2\]\.actions\[1\]\.config\.client_secret: .*client_id differs/],
      [REDACTED.replace('client_id: cid', 'client_id: other'), /^traffic_policy\.value: inbound\[2\]\.actions\[0\]\.config\.client_secret: .*client_id differs/],
    ] as const) {
      const e = errorOf(await a.call('PATCH', routePath(id), { traffic_policy: { value } }));
      expect(e).toMatchObject({ status: 400, code: 'ERR_WARREN_6900', field: 'traffic_policy.value' });
      expect(e.msg).toMatch(re);
      noSecret(e);
    }
    expect(await storedValue(id)).toBe(POLICY);
    // With the secret written out, the issuer may change.
    const moved = REDACTED.replace('https://id.example.com', 'https://id2.example.com').replace(/client_id: oid, client_secret: ""/, 'client_id: oid, client_secret: new-oidc-secret');
    expect((await a.call('PATCH', routePath(id), { traffic_policy: { value: moved } })).status).toBe(200);
    expect((await pushed(id)).inbound[2].actions[1].config).toMatchObject({ issuer_url: 'https://id2.example.com', client_secret: 'new-oidc-secret' });
  });

  it('refuses a key written as an alias in the policy (400 naming the place); one stored before is shown as "" (review)', async () => {
    const aliased = `inbound:\n  - name: &k secret\n    actions:\n      - type: verify-webhook\n        config:\n          provider: github\n          *k : ${HOOK}\n`;
    const e = errorOf(await create(aliased));
    expect(e).toMatchObject({ status: 400, code: 'ERR_WARREN_6900', field: 'traffic_policy.value' });
    expect(e.msg).toMatch(/^traffic_policy\.value: inbound\[0\]\.actions\[0\]\.config: a key written as an alias/);
    noSecret(e);
    // Stored before the parser refused it: the API shows "" rather than the secret.
    const id = (await create(POLICY)).body.id;
    await api.db.query("UPDATE https_edge_routes SET modules = jsonb_set(modules, '{traffic_policy,value}', to_jsonb($2::text)) WHERE id = $1", [id, aliased]);
    const got = await a.call('GET', `${routePath(id)}/traffic_policy`);
    expect(got.body).toEqual({ enabled: true, value: '' });
    noSecret((await a.call('GET', routePath(id))).body);
  });
});
