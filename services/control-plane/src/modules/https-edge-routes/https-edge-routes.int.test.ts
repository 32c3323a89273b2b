import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { X509Certificate } from 'node:crypto';
import { startTestApi, type Account, type TestApi } from '../../../../../test/support/api.js';
import { createBackend, createIpPolicy, deleteReferenced } from '../https-edges/testing.js';
import { IDP_METADATA, PLAIN_MODULES, RATE_LIMIT_POLICY } from './fixtures.js';
import { MODULE_NAMES } from './route-modules.js';

let api: TestApi;
let a: Account;
let b: Account;
let edge: string;

beforeAll(async () => {
  api = await startTestApi();
  a = await api.account('a');
  b = await api.account('b');
  edge = (await a.call('POST', '/edges/https', { description: 'routes' })).body.id;
});
afterAll(() => api.close());

let n = 0;
const uniq = () => `/r${++n}`;
const nulls = Object.fromEntries(MODULE_NAMES.map((m) => [m, null]));

async function outbox(resourceId: string): Promise<{ event_type: string; object: any }[]> {
  const { rows } = await api.db.query('SELECT event_type, object FROM outbox WHERE resource_id = $1 ORDER BY seq', [resourceId]);
  return rows;
}

async function newRoute(body: Record<string, unknown> = {}, acct = a, edgeId = edge) {
  const r = await acct.call('POST', `/edges/https/${edgeId}/routes`, { match_type: 'path_prefix', match: uniq(), ...body });
  if (r.status !== 201) throw new Error(`route create failed: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body;
}

describe('HTTPS edge routes', () => {
  it('creates, gets, updates and deletes a route with every module key present', async () => {
    const created = await a.call('POST', `/edges/https/${edge}/routes`, { edge_id: edge, match_type: 'exact_path', match: 'app.example.com/login', description: 'login' });
    expect(created.status).toBe(201);
    const id = created.body.id;
    expect(id).toMatch(/^edghtsrt_[0-9A-Za-z]{27}$/);
    expect(created.body).toEqual({
      edge_id: edge,
      id,
      uri: `${api.baseUrl}/edges/https/${edge}/routes/${id}`,
      created_at: expect.stringMatching(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/),
      match_type: 'exact_path',
      match: 'app.example.com/login',
      description: 'login',
      ...nulls,
      policy: null,
    });
    expect((await a.call('GET', `/edges/https/${edge}/routes/${id}`)).body).toEqual(created.body);

    const patched = await a.call('PATCH', `/edges/https/${edge}/routes/${id}`, { id, edge_id: edge, match_type: 'path_prefix', match: 'app.example.com', metadata: 'm', compression: {} });
    expect(patched.status).toBe(200);
    expect(patched.body).toMatchObject({ match_type: 'path_prefix', match: 'app.example.com', description: 'login', metadata: 'm', compression: { enabled: true }, backend: null });

    // omitted or null modules are unchanged; a PATCH never removes a module
    const kept = await a.call('PATCH', `/edges/https/${edge}/routes/${id}`, { compression: null, description: '' });
    expect(kept.body.compression).toEqual({ enabled: true });
    expect(kept.body.description).toBeUndefined();

    const edgeBody = (await a.call('GET', `/edges/https/${edge}`)).body;
    expect(edgeBody.routes.find((r: { id: string }) => r.id === id)).toEqual(kept.body);

    const del = await a.call('DELETE', `/edges/https/${edge}/routes/${id}`);
    expect(del.status).toBe(204);
    expect(del.headers.get('content-type')).toBeNull();
    expect((await a.call('GET', `/edges/https/${edge}/routes/${id}`)).body.error_code).toBe('ERR_WARREN_4001');
    expect((await a.call('DELETE', `/edges/https/${edge}/routes/${id}`)).status).toBe(404);
  });

  it('answers GET on the route collection with 405 and unknown edges or ids with 404', async () => {
    const r = await a.call('GET', `/edges/https/${edge}/routes`);
    expect(r.status).toBe(405);
    expect(r.body.error_code).toBe('ERR_WARREN_2010');
    expect(r.headers.get('allow')).toBe('POST');
    const missingEdge = await a.call('POST', '/edges/https/edghts_2qT9aaaaaaaaaaaaaaaaaaaaaaa/routes', { match_type: 'path_prefix', match: '/' });
    expect(missingEdge).toMatchObject({ status: 404, body: { error_code: 'ERR_WARREN_4001' } });
    const route = await newRoute();
    const otherEdge = (await a.call('POST', '/edges/https', {})).body.id;
    for (const path of [`/edges/https/${otherEdge}/routes/${route.id}`, `/edges/https/${edge}/routes/nope`, `/edges/https/${edge}/routes/${edge}`, `/edges/https/${edge}/routes/${route.id}/nope`]) {
      const g = await a.call('GET', path);
      expect({ path, status: g.status }).toEqual({ path, status: 404 });
    }
  });

  it('returns every module in response shape and keeps the edge routes oldest first', async () => {
    const backend = await createBackend(api, a);
    const ipp = await createIpPolicy(api, a);
    const e = (await a.call('POST', '/edges/https', {})).body.id;
    const r1 = await newRoute({ ...PLAIN_MODULES, backend: { backend_id: backend }, ip_restriction: { ip_policy_ids: [ipp] }, oauth: { provider: { google: {} } } }, a, e);
    expect(r1.backend).toEqual({ enabled: true, backend: { id: backend, uri: `${api.baseUrl}/backends/tunnel_group/${backend}` } });
    expect(r1.ip_restriction).toEqual({ enabled: true, ip_policies: [{ id: ipp, uri: `${api.baseUrl}/ip_policies/${ipp}` }] });
    expect(r1.circuit_breaker).toEqual({ enabled: true, ...PLAIN_MODULES.circuit_breaker });
    expect(r1.compression).toEqual({ enabled: true });
    expect(r1.request_headers).toEqual({ enabled: true, add: { 'X-Req': 'a' }, remove: ['X-Drop'] });
    expect(r1.response_headers).toEqual({ enabled: false, add: {}, remove: [] });
    expect(r1.webhook_verification).toEqual({ enabled: true, provider: 'GitHub', secret: '' });
    expect(r1.websocket_tcp_converter).toEqual({ enabled: true });
    expect(r1.user_agent_filter).toEqual({ enabled: true, allow: ['(?i)curl/.*'], deny: ['bot'] });
    expect(r1.traffic_policy).toEqual({ enabled: true, value: RATE_LIMIT_POLICY });
    expect(r1.oauth).toEqual({
      enabled: true,
      provider: {
        github: null,
        facebook: null,
        microsoft: null,
        google: { client_id: '', client_secret: '', scopes: [], email_addresses: [], email_domains: [] },
        linkedin: null,
        gitlab: null,
        twitch: null,
        amazon: null,
      },
      options_passthrough: false,
      cookie_prefix: 'warren.',
      inactivity_timeout: 0,
      maximum_duration: 0,
      auth_check_interval: 0,
    });
    expect(r1.saml).toBeNull();
    expect(r1.oidc).toBeNull();
    expect(r1.policy).toBeNull();

    const r2 = await newRoute({ saml: { idp_metadata: IDP_METADATA } }, a, e);
    const base = `${api.baseUrl}/saml/${r2.id}`;
    expect(r2.saml).toEqual({
      enabled: true,
      options_passthrough: false,
      cookie_prefix: 'warren.',
      inactivity_timeout: 0,
      maximum_duration: 0,
      idp_metadata: IDP_METADATA,
      force_authn: false,
      allow_idp_initiated: false,
      authorized_groups: [],
      entity_id: `${base}/metadata`,
      assertion_consumer_service_url: `${base}/acs`,
      single_logout_url: `${base}/slo`,
      request_signing_certificate_pem: expect.stringMatching(/^-----BEGIN CERTIFICATE-----\n[\s\S]+\n-----END CERTIFICATE-----\n$/),
      metadata_url: `${base}/metadata`,
      nameid_format: 'urn:oasis:names:tc:SAML:2.0:nameid-format:persistent',
    });
    const cert = new X509Certificate(r2.saml.request_signing_certificate_pem);
    expect(cert.subject).toContain(r2.id);
    expect(cert.verify(cert.publicKey)).toBe(true);
    const r3 = await newRoute({ oidc: { issuer: 'https://accounts.example.com', client_id: 'cid', client_secret: 'cs', scopes: ['openid'] } }, a, e);
    expect(r3.oidc).toEqual({
      enabled: true,
      options_passthrough: false,
      cookie_prefix: 'warren.',
      inactivity_timeout: 0,
      maximum_duration: 0,
      issuer: 'https://accounts.example.com',
      client_id: 'cid',
      client_secret: '',
      scopes: ['openid'],
    });
    expect((await a.call('GET', `/edges/https/${e}`)).body.routes.map((r: { id: string }) => r.id)).toEqual([r1.id, r2.id, r3.id]);
    // the mirrors of the references
    expect((await api.db.query('SELECT backend_id FROM https_edge_routes WHERE id = $1', [r1.id])).rows[0].backend_id).toBe(backend);
    expect((await api.db.query('SELECT ip_policy_id FROM https_edge_route_ip_policies WHERE route_id = $1', [r1.id])).rows).toEqual([{ ip_policy_id: ipp }]);
  });

  it('keeps the SAML signing certificate across replacements and renews it after a delete', async () => {
    const r = await newRoute({ saml: { idp_metadata: IDP_METADATA } });
    const pem = r.saml.request_signing_certificate_pem;
    const p = await a.call('PATCH', `/edges/https/${edge}/routes/${r.id}`, { saml: { idp_metadata: IDP_METADATA, force_authn: true } });
    expect(p.body.saml).toMatchObject({ force_authn: true, request_signing_certificate_pem: pem });
    const put = await a.call('PUT', `/edges/https/${edge}/routes/${r.id}/saml`, { idp_metadata: IDP_METADATA });
    expect(put.body.request_signing_certificate_pem).toBe(pem);
    await a.call('DELETE', `/edges/https/${edge}/routes/${r.id}/saml`);
    const again = await a.call('PUT', `/edges/https/${edge}/routes/${r.id}/saml`, { idp_metadata: IDP_METADATA });
    expect(again.body.request_signing_certificate_pem).not.toBe(pem);
    // the private key is stored, never returned
    const { rows } = await api.db.query("SELECT modules->'saml'->'signing'->>'private_key_pem' AS k FROM https_edge_routes WHERE id = $1", [r.id]);
    expect(rows[0].k).toMatch(/^-----BEGIN PRIVATE KEY-----/);
    expect(JSON.stringify(again.body)).not.toContain('PRIVATE KEY');
  });

  it('writes route events with secrets blanked, and none for changes that change nothing', async () => {
    const r = await newRoute({ webhook_verification: { provider: 'stripe', secret: 'whsec_top' } });
    const noop = await a.call('PATCH', `/edges/https/${edge}/routes/${r.id}`, { id: r.id, match: r.match, webhook_verification: { provider: 'stripe' } });
    expect(noop.body).toEqual(r);
    const put = await a.call('PUT', `/edges/https/${edge}/routes/${r.id}/compression`, {});
    expect(put.status).toBe(200);
    await a.call('PUT', `/edges/https/${edge}/routes/${r.id}/compression`, { enabled: true }); // same again: no event
    await a.call('DELETE', `/edges/https/${edge}/routes/${r.id}/backend`); // not set: no event
    const afterPut = (await a.call('GET', `/edges/https/${edge}/routes/${r.id}`)).body;
    await a.call('DELETE', `/edges/https/${edge}/routes/${r.id}/compression`);
    const afterDel = (await a.call('GET', `/edges/https/${edge}/routes/${r.id}`)).body;
    await a.call('DELETE', `/edges/https/${edge}/routes/${r.id}`);
    const events = await outbox(r.id);
    expect(events).toEqual([
      { event_type: 'https_edge_route_created.v0', object: r },
      { event_type: 'https_edge_route_updated.v0', object: afterPut },
      { event_type: 'https_edge_route_updated.v0', object: afterDel },
      { event_type: 'https_edge_route_deleted.v0', object: afterDel },
    ]);
    expect(JSON.stringify(events)).not.toContain('whsec_top');
  });

  it('refuses a duplicate (match_type, match) on the same edge with 409, not across edges or types', async () => {
    const r = await newRoute({ match_type: 'exact_path', match: '/dup' });
    const clash = await a.call('POST', `/edges/https/${edge}/routes`, { match_type: 'exact_path', match: '/dup' });
    expect(clash).toMatchObject({ status: 409, body: { error_code: 'ERR_WARREN_4101', details: { field: 'match' } } });
    expect((await a.call('POST', `/edges/https/${edge}/routes`, { match_type: 'path_prefix', match: '/dup' })).status).toBe(201);
    const other = (await a.call('POST', '/edges/https', {})).body.id;
    expect((await a.call('POST', `/edges/https/${other}/routes`, { match_type: 'exact_path', match: '/dup' })).status).toBe(201);
    const moved = await newRoute({ match_type: 'exact_path' });
    const p = await a.call('PATCH', `/edges/https/${edge}/routes/${moved.id}`, { match: '/dup' });
    expect(p).toMatchObject({ status: 409, body: { error_code: 'ERR_WARREN_4101' } });
    expect((await a.call('PATCH', `/edges/https/${edge}/routes/${r.id}`, { match_type: 'exact_path', match: '/dup', description: 'same match' })).status).toBe(200);
  });

  it('allows at most 100 routes per edge', async () => {
    const e = (await a.call('POST', '/edges/https', {})).body.id;
    await api.db.query(
      `INSERT INTO https_edge_routes (id, account_id, edge_id, match_type, match)
       SELECT 'edghtsrt_' || lpad(i::text, 27, '0'), $1, $2, 'exact_path', '/bulk' || i FROM generate_series(1, 99) i`,
      [a.accountId, e],
    );
    expect((await a.call('POST', `/edges/https/${e}/routes`, { match_type: 'exact_path', match: '/100th' })).status).toBe(201);
    const r = await a.call('POST', `/edges/https/${e}/routes`, { match_type: 'exact_path', match: '/101st' });
    expect(r).toMatchObject({ status: 400, body: { error_code: 'ERR_WARREN_6403' } });
  });

  it('checks backend and IP policy references and blocks deleting them while referenced', async () => {
    const backend = await createBackend(api, a);
    const backendB = await createBackend(api, b);
    const ipp = await createIpPolicy(api, a);
    const ippB = await createIpPolicy(api, b);
    const check = async (body: Record<string, unknown>, code: string, field: string) => {
      const r = await a.call('POST', `/edges/https/${edge}/routes`, { match_type: 'path_prefix', match: uniq(), ...body });
      expect({ status: r.status, code: r.body.error_code, field: r.body.details.field }).toEqual({ status: 400, code, field });
    };
    await check({ backend: { backend_id: backendB } }, 'ERR_WARREN_3002', 'backend.backend_id');
    await check({ backend: { backend_id: 'bkdtg_2qT9aaaaaaaaaaaaaaaaaaaaaaa' } }, 'ERR_WARREN_3002', 'backend.backend_id');
    await check({ backend: { backend_id: ipp } }, 'ERR_WARREN_3001', 'backend.backend_id');
    await check({ backend: { backend_id: 'nope' } }, 'ERR_WARREN_3000', 'backend.backend_id');
    await check({ backend: {} }, 'ERR_WARREN_2103', 'backend.backend_id');
    await check({ ip_restriction: { ip_policy_ids: [ipp, ippB] } }, 'ERR_WARREN_3002', 'ip_restriction.ip_policy_ids');
    await check({ ip_restriction: { ip_policy_ids: [backend] } }, 'ERR_WARREN_3001', 'ip_restriction.ip_policy_ids[0]');
    await check({ ip_restriction: { ip_policy_ids: [] } }, 'ERR_WARREN_2104', 'ip_restriction.ip_policy_ids');
    await check({ ip_restriction: { ip_policy_ids: Array(17).fill(ipp) } }, 'ERR_WARREN_5002', 'ip_restriction.ip_policy_ids');
    await check({ ip_restriction: { ip_policy_ids: [ipp, ipp] } }, 'ERR_WARREN_2104', 'ip_restriction.ip_policy_ids[1]');
    const r = await newRoute({ backend: { backend_id: backend }, ip_restriction: { ip_policy_ids: [ipp] } });

    expect(await deleteReferenced(api, a, `/backends/tunnel_group/${backend}`, 'tunnel_group_backends', backend)).toEqual({ status: 409, error_code: 'ERR_WARREN_4100' });
    expect(await deleteReferenced(api, a, `/ip_policies/${ipp}`, 'ip_policies', ipp)).toEqual({ status: 409, error_code: 'ERR_WARREN_4100' });

    // module PUT checks references too, and names the field of the bare body
    const put = await a.call('PUT', `/edges/https/${edge}/routes/${r.id}/backend`, { backend_id: backendB });
    expect(put.body).toMatchObject({ error_code: 'ERR_WARREN_3002', details: { field: 'backend_id' } });
    const wrapped = await a.call('PUT', `/edges/https/${edge}/routes/${r.id}/ip_restriction`, { id: r.id, edge_id: edge, module: { ip_policy_ids: [ippB] } });
    expect(wrapped.body).toMatchObject({ error_code: 'ERR_WARREN_3002', details: { field: 'module.ip_policy_ids' } });

    // once the route lets go, the deletes go through
    expect((await a.call('DELETE', `/edges/https/${edge}/routes/${r.id}/backend`)).status).toBe(204);
    expect((await api.db.query('SELECT backend_id FROM https_edge_routes WHERE id = $1', [r.id])).rows[0].backend_id).toBeNull();
    expect((await deleteReferenced(api, a, `/backends/tunnel_group/${backend}`, 'tunnel_group_backends', backend)).status).toBe(204);
    const ipp2 = await createIpPolicy(api, a);
    expect((await a.call('PATCH', `/edges/https/${edge}/routes/${r.id}`, { ip_restriction: { ip_policy_ids: [ipp2] } })).status).toBe(200);
    expect((await deleteReferenced(api, a, `/ip_policies/${ipp}`, 'ip_policies', ipp)).status).toBe(204);
    expect(await deleteReferenced(api, a, `/ip_policies/${ipp2}`, 'ip_policies', ipp2)).toEqual({ status: 409, error_code: 'ERR_WARREN_4100' });
    await a.call('DELETE', `/edges/https/${edge}/routes/${r.id}`);
    expect((await deleteReferenced(api, a, `/ip_policies/${ipp2}`, 'ip_policies', ipp2)).status).toBe(204);
  });

  it('serves every route module: PUT (bare or wrapped) → 200, GET → 200 or 404 4002, DELETE → 204', async () => {
    const backend = await createBackend(api, a);
    const ipp = await createIpPolicy(api, a);
    const bodies: Record<string, Record<string, unknown>> = {
      ...PLAIN_MODULES,
      backend: { backend_id: backend },
      ip_restriction: { ip_policy_ids: [ipp] },
      oauth: { provider: { github: { teams: ['acme/devs'] } } },
      saml: { idp_metadata: IDP_METADATA },
      oidc: { issuer: 'https://id.example.com', client_id: 'c', client_secret: 's' },
    };
    for (const name of MODULE_NAMES) {
      const r = await newRoute();
      const path = `/edges/https/${edge}/routes/${r.id}/${name}`;
      const missing = await a.call('GET', path);
      expect({ name, status: missing.status, code: missing.body.error_code }).toEqual({ name, status: 404, code: 'ERR_WARREN_4002' });
      expect((await a.call('DELETE', path)).status).toBe(204);
      const put = await a.call('PUT', path, bodies[name]);
      expect({ name, status: put.status }).toEqual({ name, status: 200 });
      const route = (await a.call('GET', `/edges/https/${edge}/routes/${r.id}`)).body;
      expect(route[name]).toEqual(put.body);
      expect((await a.call('GET', path)).body).toEqual(put.body);
      const wrapped = await a.call('PUT', path, { id: r.id, edge_id: edge, module: { ...bodies[name], enabled: false } });
      expect({ name, status: wrapped.status, enabled: wrapped.body.enabled }).toEqual({ name, status: 200, enabled: false });
      expect((await a.call('DELETE', path)).status).toBe(204);
      expect((await a.call('GET', path)).status).toBe(404);
      expect((await a.call('GET', `/edges/https/${edge}/routes/${r.id}`)).body[name]).toBeNull();
      expect((await a.call('POST', path, {})).status).toBe(405);
    }
  });

  it('allows at most one of oauth, saml and oidc', async () => {
    const both = await a.call('POST', `/edges/https/${edge}/routes`, {
      match_type: 'path_prefix',
      match: uniq(),
      oauth: { provider: { google: {} } },
      oidc: { issuer: 'https://id.example.com', client_id: 'c', client_secret: 's' },
    });
    expect(both).toMatchObject({ status: 400, body: { error_code: 'ERR_WARREN_6402' } });
    const r = await newRoute({ oauth: { provider: { google: {} } } });
    const put = await a.call('PUT', `/edges/https/${edge}/routes/${r.id}/saml`, { idp_metadata: IDP_METADATA });
    expect(put).toMatchObject({ status: 400, body: { error_code: 'ERR_WARREN_6402' } });
    const patch = await a.call('PATCH', `/edges/https/${edge}/routes/${r.id}`, { oidc: { issuer: 'https://id.example.com', client_id: 'c', client_secret: 's' } });
    expect(patch).toMatchObject({ status: 400, body: { error_code: 'ERR_WARREN_6402', details: { field: 'oidc' } } });
    await a.call('DELETE', `/edges/https/${edge}/routes/${r.id}/oauth`);
    expect((await a.call('PUT', `/edges/https/${edge}/routes/${r.id}/saml`, { idp_metadata: IDP_METADATA })).status).toBe(200);
  });

  it('returns secrets as "" and keeps them across replacing updates of the same kind', async () => {
    const secretOf = async (id: string) => (await api.db.query('SELECT modules FROM https_edge_routes WHERE id = $1', [id])).rows[0].modules;
    const r = await newRoute({
      webhook_verification: { provider: 'stripe', secret: 'wh1' },
      oauth: { provider: { github: { client_id: 'gh-id', client_secret: 'gh-secret', scopes: ['read:org'] } } },
    });
    expect(r.webhook_verification.secret).toBe('');
    expect(r.oauth.provider.github).toMatchObject({ client_id: 'gh-id', client_secret: '', scopes: ['read:org'] });
    const path = `/edges/https/${edge}/routes/${r.id}`;

    // GET → PATCH round trip of the response shapes keeps the secrets
    await a.call('PATCH', path, { webhook_verification: { provider: 'STRIPE', secret: '' }, oauth: { ...r.oauth, provider: { ...r.oauth.provider } } });
    let m = await secretOf(r.id);
    expect(m.webhook_verification).toMatchObject({ provider: 'STRIPE', secret: 'wh1' });
    expect(m.oauth.provider.github.client_secret).toBe('gh-secret');

    // a new secret replaces; another provider kind does not inherit it
    await a.call('PUT', `${path}/webhook_verification`, { provider: 'stripe', secret: 'wh2' });
    expect((await secretOf(r.id)).webhook_verification.secret).toBe('wh2');
    const switched = await a.call('PUT', `${path}/webhook_verification`, { provider: 'slack' });
    expect(switched.body).toMatchObject({ error_code: 'ERR_WARREN_6401', details: { field: 'secret' } });
    const sns = await a.call('PUT', `${path}/webhook_verification`, { provider: 'sns' });
    expect(sns.body).toEqual({ enabled: true, provider: 'sns', secret: '' });
    expect((await secretOf(r.id)).webhook_verification.secret).toBe('');

    // clearing client_id drops the secret; a new provider kind starts without one
    const cleared = await a.call('PUT', `${path}/oauth`, { provider: { github: { client_id: '' } } });
    expect(cleared.status).toBe(200);
    expect((await secretOf(r.id)).oauth.provider.github.client_secret).toBe('');
    const noSecret = await a.call('PUT', `${path}/oauth`, { provider: { github: { client_id: 'again' } } });
    expect(noSecret.body).toMatchObject({ error_code: 'ERR_WARREN_2105', details: { field: 'provider.github.client_secret' } });
    await a.call('PUT', `${path}/oauth`, { provider: { github: { client_id: 'gh', client_secret: 'gs' } } });
    const google = await a.call('PUT', `${path}/oauth`, { provider: { google: { client_id: 'gh' } } });
    expect(google.body).toMatchObject({ error_code: 'ERR_WARREN_2105', details: { field: 'provider.google.client_secret' } });

    // oauth: a blank secret is kept only for the same client_id (review)
    const otherApp = await a.call('PUT', `${path}/oauth`, { provider: { github: { client_id: 'another-app', client_secret: '' } } });
    expect(otherApp.status).toBe(400);
    expect(otherApp.body).toMatchObject({ error_code: 'ERR_WARREN_2105', details: { field: 'provider.github.client_secret' } });
    expect((await a.call('PUT', `${path}/oauth`, { provider: { github: { client_id: 'gh', client_secret: '' } } })).status).toBe(200);
    expect((await secretOf(r.id)).oauth.provider.github).toMatchObject({ client_id: 'gh', client_secret: 'gs' });

    // OIDC: the secret is required when first set, kept afterwards while issuer and client_id
    // are unchanged (review: not for an issuer the editor chose), never returned
    const o = await newRoute({ oidc: { issuer: 'https://id.example.com', client_id: 'c', client_secret: 'oidc-secret' } });
    const op = await a.call('PATCH', `/edges/https/${edge}/routes/${o.id}`, { oidc: { ...o.oidc, scopes: ['openid', 'email'] } });
    expect(op.body.oidc).toMatchObject({ client_id: 'c', client_secret: '', scopes: ['openid', 'email'] });
    expect((await secretOf(o.id)).oidc.client_secret).toBe('oidc-secret');
    for (const change of [{ issuer: 'https://idp.attacker.example' }, { client_id: 'c2' }]) {
      const moved = await a.call('PATCH', `/edges/https/${edge}/routes/${o.id}`, { oidc: { ...o.oidc, ...change } });
      expect(moved.status).toBe(400);
      expect(moved.body).toMatchObject({ error_code: 'ERR_WARREN_2103', details: { field: 'oidc.client_secret' } });
      expect(JSON.stringify(moved.body)).not.toContain('oidc-secret');
    }
    expect((await secretOf(o.id)).oidc).toMatchObject({ issuer: 'https://id.example.com', client_id: 'c', client_secret: 'oidc-secret' });
    const movedWithSecret = await a.call('PATCH', `/edges/https/${edge}/routes/${o.id}`, { oidc: { ...o.oidc, client_id: 'c2', client_secret: 'new-secret' } });
    expect(movedWithSecret.status).toBe(200);
    expect((await secretOf(o.id)).oidc).toMatchObject({ client_id: 'c2', client_secret: 'new-secret' });
    const fresh = await a.call('PUT', `/edges/https/${edge}/routes/${(await newRoute()).id}/oidc`, { issuer: 'https://id.example.com', client_id: 'c' });
    expect(fresh.body).toMatchObject({ error_code: 'ERR_WARREN_2103', details: { field: 'client_secret' } });
  });

  it('isolates accounts: routes of another account answer 404', async () => {
    const r = await newRoute({ compression: {} });
    for (const [m, path, body] of [
      ['GET', `/edges/https/${edge}/routes/${r.id}`],
      ['PATCH', `/edges/https/${edge}/routes/${r.id}`, { description: 'x' }],
      ['DELETE', `/edges/https/${edge}/routes/${r.id}`],
      ['GET', `/edges/https/${edge}/routes/${r.id}/compression`],
      ['PUT', `/edges/https/${edge}/routes/${r.id}/compression`, {}],
      ['DELETE', `/edges/https/${edge}/routes/${r.id}/compression`],
    ] as const) {
      const res = await b.call(m, path, body);
      expect({ m, path, status: res.status, code: res.body.error_code }).toEqual({ m, path, status: 404, code: 'ERR_WARREN_4001' });
    }
    expect((await a.call('GET', `/edges/https/${edge}/routes/${r.id}/compression`)).status).toBe(200);
  });

  it('validates the route fields', async () => {
    const check = async (body: Record<string, unknown>, code: string, field: string) => {
      const r = await a.call('POST', `/edges/https/${edge}/routes`, body);
      expect({ body, status: r.status, code: r.body.error_code, field: r.body.details.field }).toEqual({ body, status: 400, code, field });
    };
    await check({ match: '/x' }, 'ERR_WARREN_2103', 'match_type');
    await check({ match_type: 'exact_path' }, 'ERR_WARREN_2103', 'match');
    await check({ match_type: 'regex', match: '/x' }, 'ERR_WARREN_2104', 'match_type');
    for (const match of ['', 'x y', '/a b', '/a?b', '/a#b', 'Example.com', 'exa_mple.com/x', '/%zz', '-bad.com']) await check({ match_type: 'exact_path', match }, 'ERR_WARREN_2104', 'match');
    await check({ match_type: 'exact_path', match: '/' + 'a'.repeat(2048) }, 'ERR_WARREN_5003', 'match');
    await check({ match_type: 'exact_path', match: '/x', description: 'é'.repeat(128) }, 'ERR_WARREN_5000', 'description');
    await check({ match_type: 'exact_path', match: '/x', metadata: 'x'.repeat(4097) }, 'ERR_WARREN_5001', 'metadata');
    await check({ match_type: 'exact_path', match: '/x', colour: 1 }, 'ERR_WARREN_2101', 'colour');
    await check({ match_type: 'exact_path', match: '/x', policy: { inbound: [] } }, 'ERR_WARREN_2104', 'policy');
    await check({ match_type: 'exact_path', match: '/x', compression: true }, 'ERR_WARREN_2102', 'compression');
    for (const match of ['/', '/api/v1', 'example.com', 'a.example.com/x/y', '/%20ok', '/a:b@c']) expect((await newRoute({ match_type: 'exact_path', match })).match).toBe(match);
    expect((await newRoute({ policy: null })).policy).toBeNull();
    const r = await newRoute();
    const p = await a.call('PATCH', `/edges/https/${edge}/routes/${r.id}`, { match_type: 'nope' });
    expect(p.body).toMatchObject({ error_code: 'ERR_WARREN_2104', details: { field: 'match_type' } });
    const nothing = await a.call('POST', `/edges/https/${edge}/routes`, { match_type: 'exact_path', match: '/nothing', circuit_breaker: { num_buckets: 0 } });
    expect(nothing.status).toBe(400);
    const { rows } = await api.db.query("SELECT count(*)::int AS n FROM https_edge_routes WHERE match = '/nothing'");
    expect(rows[0].n).toBe(0);
  });
});
