import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApi, walkPages, type Account, type TestApi } from '../../../../../test/support/api.js';
import { createCa, deleteReferenced } from './testing.js';

let api: TestApi;
let a: Account;
let b: Account;

beforeAll(async () => {
  api = await startTestApi();
  a = await api.account('a');
  b = await api.account('b');
});
afterAll(() => api.close());

let hp = 0;
/** A hostport no other test uses. */
const hostport = () => `edge${++hp}-${Math.random().toString(36).slice(2, 8)}.example.com:443`;

async function outbox(resourceId: string): Promise<{ event_type: string; object: any }[]> {
  const { rows } = await api.db.query('SELECT event_type, object FROM outbox WHERE resource_id = $1 ORDER BY seq', [resourceId]);
  return rows;
}

describe('HTTPS edges', () => {
  it('creates, gets, updates, lists and deletes', async () => {
    const h1 = hostport();
    const created = await a.call('POST', '/edges/https', { description: 'web', metadata: '{"x":1}', hostports: [h1] });
    expect(created.status).toBe(201);
    const id = created.body.id;
    expect(id).toMatch(/^edghts_[0-9A-Za-z]{27}$/);
    expect(created.body).toEqual({
      id,
      uri: `${api.baseUrl}/edges/https/${id}`,
      created_at: expect.stringMatching(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/),
      description: 'web',
      metadata: '{"x":1}',
      hostports: [h1],
      mutual_tls: null,
      tls_termination: null,
      routes: [],
    });
    expect((await a.call('GET', `/edges/https/${id}`)).body).toEqual(created.body);

    const h2 = hostport();
    const patched = await a.call('PATCH', `/edges/https/${id}`, { id, hostports: [h2, h1], tls_termination: {} });
    expect(patched.status).toBe(200);
    expect(patched.body).toMatchObject({ description: 'web', hostports: [h2, h1], tls_termination: { enabled: true, terminate_at: 'edge', min_version: '1.2' } });

    const cleared = await a.call('PATCH', `/edges/https/${id}`, { description: '', hostports: [] });
    expect(cleared.body.description).toBeUndefined();
    expect(cleared.body.hostports).toEqual([]);
    expect(cleared.body.metadata).toBe('{"x":1}');

    const list = await a.call('GET', '/edges/https');
    expect(list.status).toBe(200);
    expect(list.body.uri).toBe(`${api.baseUrl}/edges/https`);
    expect(list.body.next_page_uri).toBeNull();
    expect(list.body.https_edges.map((e: { id: string }) => e.id)).toContain(id);

    const del = await a.call('DELETE', `/edges/https/${id}`);
    expect(del.status).toBe(204);
    expect(del.headers.get('content-type')).toBeNull();
    expect((await a.call('GET', `/edges/https/${id}`)).body.error_code).toBe('ERR_WARREN_4001');
    // the hostports are free again
    expect((await a.call('POST', '/edges/https', { hostports: [h1, h2] })).status).toBe(201);
  });

  it('defaults an empty body and answers a malformed or wrong-prefix path id with 404', async () => {
    const r = await a.call('POST', '/edges/https', {});
    expect(r.status).toBe(201);
    expect(r.body).toMatchObject({ hostports: [], mutual_tls: null, tls_termination: null, routes: [] });
    expect(r.body.description).toBeUndefined();
    for (const bad of ['nope', 'ra_2qT9aaaaaaaaaaaaaaaaaaaaaaa', r.body.id.replace('edghts_', 'edghtsrt_')]) {
      const g = await a.call('GET', `/edges/https/${bad}`);
      expect(g.status).toBe(404);
      expect(g.body.error_code).toBe('ERR_WARREN_4001');
    }
  });

  it('writes created/updated/deleted events in the same transaction, and none for a no-op PATCH', async () => {
    const e = (await a.call('POST', '/edges/https', { description: 'ev' })).body;
    const noop = await a.call('PATCH', `/edges/https/${e.id}`, { id: e.id, description: 'ev', hostports: [] });
    expect(noop.status).toBe(200);
    expect(noop.body).toEqual(e);
    const upd = (await a.call('PATCH', `/edges/https/${e.id}`, { metadata: 'm' })).body;
    await a.call('DELETE', `/edges/https/${e.id}`);
    expect(await outbox(e.id)).toEqual([
      { event_type: 'https_edge_created.v0', object: e },
      { event_type: 'https_edge_updated.v0', object: upd },
      { event_type: 'https_edge_deleted.v0', object: upd },
    ]);
  });

  it('refuses a hostport used by any edge, of any account, with 409', async () => {
    const h = hostport();
    expect((await a.call('POST', '/edges/https', { hostports: [h] })).status).toBe(201);
    for (const acct of [a, b]) {
      const r = await acct.call('POST', '/edges/https', { hostports: [hostport(), h] });
      expect(r.status).toBe(409);
      expect(r.body).toMatchObject({ error_code: 'ERR_WARREN_4101', details: { field: 'hostports' } });
      expect(r.body.msg).toContain(h);
    }
    const other = (await b.call('POST', '/edges/https', {})).body.id;
    const p = await b.call('PATCH', `/edges/https/${other}`, { hostports: [h] });
    expect(p.status).toBe(409);
    const before = await api.db.query('SELECT count(*)::int AS n FROM https_edges');
    await b.call('POST', '/edges/https', { hostports: [h] });
    expect((await api.db.query('SELECT count(*)::int AS n FROM https_edges')).rows[0].n).toBe(before.rows[0].n);
  });

  it('keeps a host with one account: another account cannot claim it on another port (409); the owner can', async () => {
    const h = hostport();
    const host = h.replace(/:[0-9]+$/, '');
    expect((await a.call('POST', '/edges/https', { hostports: [h] })).status).toBe(201);
    for (const port of [80, 8443]) {
      const r = await b.call('POST', '/edges/https', { hostports: [`${host}:${port}`] });
      expect(r.status).toBe(409);
      expect(r.body).toMatchObject({ error_code: 'ERR_WARREN_4101', details: { field: 'hostports' } });
      expect(r.body.msg).toContain(`${host}:${port}`);
    }
    const other = (await b.call('POST', '/edges/https', {})).body.id;
    expect((await b.call('PATCH', `/edges/https/${other}`, { hostports: [`${host}:8443`] })).status).toBe(409);
    // The owner may serve its host on other ports, on the same or another of its edges.
    expect((await a.call('POST', '/edges/https', { hostports: [`${host}:8443`] })).status).toBe(201);
    // Two accounts racing for one host on different ports: exactly one wins.
    const race = hostport().replace(/:[0-9]+$/, '');
    const [ra, rb] = await Promise.all([a.call('POST', '/edges/https', { hostports: [`${race}:443`] }), b.call('POST', '/edges/https', { hostports: [`${race}:8443`] })]);
    expect([ra.status, rb.status].sort()).toEqual([201, 409]);
  });

  it('lets an edge keep a host another account already shared with it (stored before hosts belonged to one account)', async () => {
    const host = hostport().replace(/:[0-9]+$/, '');
    expect((await a.call('POST', '/edges/https', { hostports: [`${host}:443`] })).status).toBe(201);
    const legacy = (await b.call('POST', '/edges/https', {})).body.id;
    await api.db.query('UPDATE https_edges SET hostports = $2 WHERE id = $1', [legacy, [`${host}:8443`]]);
    await api.db.query('INSERT INTO https_edge_hostports (hostport, edge_id) VALUES ($1, $2)', [`${host}:8443`, legacy]);
    expect((await b.call('PATCH', `/edges/https/${legacy}`, { description: 'still mine' })).status).toBe(200);
    const again = await b.call('PATCH', `/edges/https/${legacy}`, { hostports: [`${host}:8443`, `${host}:9443`] });
    expect([again.status, again.body.msg]).toEqual([409, expect.stringContaining(`${host}:9443`)]);
  });

  it('validates hostports', async () => {
    const cases: [unknown, string, string][] = [
      [['nohost'], 'ERR_WARREN_2104', 'hostports[0]'],
      [['a.example.com:0'], 'ERR_WARREN_2104', 'hostports[0]'],
      [['a.example.com:70000'], 'ERR_WARREN_2104', 'hostports[0]'],
      [['A.example.com:443'], 'ERR_WARREN_2104', 'hostports[0]'],
      [['a b.com:443'], 'ERR_WARREN_2104', 'hostports[0]'],
      [['a.example.com:443', 'a.example.com:443'], 'ERR_WARREN_2104', 'hostports[1]'],
      [Array.from({ length: 11 }, (_, i) => `h${i}.example.com:443`), 'ERR_WARREN_6301', 'hostports'],
      ['a.example.com:443', 'ERR_WARREN_2102', 'hostports'],
      [[5], 'ERR_WARREN_2102', 'hostports[0]'],
    ];
    for (const [hostports, code, field] of cases) {
      const r = await a.call('POST', '/edges/https', { hostports });
      expect({ hostports, status: r.status, code: r.body.error_code, field: r.body.details.field }).toEqual({ hostports, status: 400, code, field });
    }
    const ten = Array.from({ length: 10 }, () => hostport());
    expect((await a.call('POST', '/edges/https', { hostports: ten })).status).toBe(201);
  });

  it('validates fields and refuses unknown ones at any depth', async () => {
    const check = async (body: unknown, code: string, field: string) => {
      const r = await a.call('POST', '/edges/https', body);
      expect({ status: r.status, code: r.body.error_code, field: r.body.details.field }).toEqual({ status: 400, code, field });
      return r;
    };
    const u = await check({ colour: 'red' }, 'ERR_WARREN_2101', 'colour');
    expect(u.body.msg).toBe('unknown field "colour"; supported: description, metadata, hostports, mutual_tls, tls_termination');
    await check({ tls_termination: { terminate_at: 'edge' } }, 'ERR_WARREN_2101', 'tls_termination.terminate_at');
    await check({ mutual_tls: { certificate_authorities: [] } }, 'ERR_WARREN_2101', 'mutual_tls.certificate_authorities');
    for (const v of ['1.0', '1.1', '2', 'tls1.3']) await check({ tls_termination: { min_version: v } }, 'ERR_WARREN_2104', 'tls_termination.min_version');
    await check({ tls_termination: { min_version: 1.3 } }, 'ERR_WARREN_2102', 'tls_termination.min_version');
    await check({ tls_termination: { enabled: 'yes' } }, 'ERR_WARREN_2102', 'tls_termination.enabled');
    await check({ description: 'x'.repeat(256) }, 'ERR_WARREN_5000', 'description');
    await check({ metadata: 'x'.repeat(4097) }, 'ERR_WARREN_5001', 'metadata');
    await check({ mutual_tls: { certificate_authority_ids: ['nope'] } }, 'ERR_WARREN_3000', 'mutual_tls.certificate_authority_ids[0]');
    await check({ mutual_tls: { certificate_authority_ids: ['ipp_2qT9aaaaaaaaaaaaaaaaaaaaaaa'] } }, 'ERR_WARREN_3001', 'mutual_tls.certificate_authority_ids[0]');
    await check({ mutual_tls: { certificate_authority_ids: ['ca_2qT9aaaaaaaaaaaaaaaaaaaaaaa'] } }, 'ERR_WARREN_3002', 'mutual_tls.certificate_authority_ids');
    const id = (await a.call('POST', '/edges/https', {})).body.id;
    const r = await a.call('PATCH', `/edges/https/${id}`, { routes: [] });
    expect(r.body).toMatchObject({ error_code: 'ERR_WARREN_2101', details: { field: 'routes' } });
  });

  it('configures mutual TLS with certificate authorities of the account only', async () => {
    const ca1 = await createCa(api, a);
    const ca2 = await createCa(api, a);
    const caB = await createCa(api, b);
    const r = await a.call('POST', '/edges/https', { mutual_tls: { certificate_authority_ids: [ca2, ca1] } });
    expect(r.status).toBe(201);
    expect(r.body.mutual_tls).toEqual({
      enabled: true,
      certificate_authorities: [
        { id: ca2, uri: `${api.baseUrl}/certificate_authorities/${ca2}` },
        { id: ca1, uri: `${api.baseUrl}/certificate_authorities/${ca1}` },
      ],
    });
    const other = await a.call('POST', '/edges/https', { mutual_tls: { certificate_authority_ids: [caB] } });
    expect(other.body).toMatchObject({ error_code: 'ERR_WARREN_3002', details: { field: 'mutual_tls.certificate_authority_ids' } });
    const dup = await a.call('POST', '/edges/https', { mutual_tls: { certificate_authority_ids: [ca1, ca1] } });
    expect(dup.body).toMatchObject({ error_code: 'ERR_WARREN_2104', details: { field: 'mutual_tls.certificate_authority_ids[1]' } });

    // a CA listed by an edge cannot be deleted (409) until the edge lets it go
    const blocked = await deleteReferenced(api, a, `/certificate_authorities/${ca1}`, 'certificate_authorities', ca1);
    expect(blocked).toEqual({ status: 409, error_code: 'ERR_WARREN_4100' });
    const p = await a.call('PATCH', `/edges/https/${r.body.id}`, { mutual_tls: { enabled: false, certificate_authority_ids: [ca2] } });
    expect(p.body.mutual_tls).toEqual({ enabled: false, certificate_authorities: [{ id: ca2, uri: `${api.baseUrl}/certificate_authorities/${ca2}` }] });
    expect((await deleteReferenced(api, a, `/certificate_authorities/${ca1}`, 'certificate_authorities', ca1)).status).toBe(204);
  });

  it('serves the edge modules: PUT (bare or TS-client wrapped), GET, DELETE', async () => {
    const ca = await createCa(api, a);
    const id = (await a.call('POST', '/edges/https', {})).body.id;

    expect(await a.call('GET', `/edges/https/${id}/mutual_tls`)).toMatchObject({ status: 404, body: { error_code: 'ERR_WARREN_4002' } });
    expect(await a.call('GET', `/edges/https/${id}/tls_termination`)).toMatchObject({ status: 404, body: { error_code: 'ERR_WARREN_4002' } });
    expect((await a.call('DELETE', `/edges/https/${id}/mutual_tls`)).status).toBe(204);
    expect(await outbox(id)).toHaveLength(1); // nothing was configured: no event

    const put = await a.call('PUT', `/edges/https/${id}/mutual_tls`, { certificate_authority_ids: [ca] });
    expect(put.status).toBe(200);
    expect(put.body).toEqual({ enabled: true, certificate_authorities: [{ id: ca, uri: `${api.baseUrl}/certificate_authorities/${ca}` }] });
    expect((await a.call('GET', `/edges/https/${id}/mutual_tls`)).body).toEqual(put.body);

    const wrapped = await a.call('PUT', `/edges/https/${id}/tls_termination`, { id, module: { enabled: false, min_version: '1.3' } });
    expect(wrapped.status).toBe(200);
    expect(wrapped.body).toEqual({ enabled: false, terminate_at: 'edge', min_version: '1.3' });
    const bad = await a.call('PUT', `/edges/https/${id}/tls_termination`, { id, module: { min_version: '1.1' } });
    expect(bad.body).toMatchObject({ error_code: 'ERR_WARREN_2104', details: { field: 'module.min_version' } });
    const badBare = await a.call('PUT', `/edges/https/${id}/mutual_tls`, { certificate_authority_ids: ['ca_2qT9aaaaaaaaaaaaaaaaaaaaaaa'] });
    expect(badBare.body).toMatchObject({ error_code: 'ERR_WARREN_3002', details: { field: 'certificate_authority_ids' } });
    const unknown = await a.call('PUT', `/edges/https/${id}/mutual_tls`, { id, enabled: true });
    expect(unknown.body).toMatchObject({ error_code: 'ERR_WARREN_2101', details: { field: 'id' } });

    const edge = (await a.call('GET', `/edges/https/${id}`)).body;
    expect(edge.mutual_tls).toEqual(put.body);
    expect(edge.tls_termination).toEqual(wrapped.body);

    expect((await a.call('DELETE', `/edges/https/${id}/mutual_tls`)).status).toBe(204);
    expect((await a.call('DELETE', `/edges/https/${id}/tls_termination`)).status).toBe(204);
    expect((await a.call('GET', `/edges/https/${id}`)).body).toMatchObject({ mutual_tls: null, tls_termination: null });
    const { rows } = await api.db.query('SELECT count(*)::int AS n FROM https_edge_certificate_authorities WHERE edge_id = $1', [id]);
    expect(rows[0].n).toBe(0);
    expect((await outbox(id)).map((e) => e.event_type)).toEqual(['https_edge_created.v0', ...Array(4).fill('https_edge_updated.v0')]);
    // same module again: no change, no event
    await a.call('PUT', `/edges/https/${id}/tls_termination`, {});
    await a.call('PUT', `/edges/https/${id}/tls_termination`, { enabled: true, min_version: '1.2' });
    expect(await outbox(id)).toHaveLength(6);

    expect((await a.call('GET', `/edges/https/edghts_2qT9aaaaaaaaaaaaaaaaaaaaaaa/mutual_tls`)).body.error_code).toBe('ERR_WARREN_4001');
    expect((await a.call('PATCH', `/edges/https/${id}/mutual_tls`, {})).status).toBe(405);
  });

  it('isolates accounts: another account id answers 404', async () => {
    const id = (await a.call('POST', '/edges/https', {})).body.id;
    for (const [m, path, body] of [
      ['GET', `/edges/https/${id}`],
      ['PATCH', `/edges/https/${id}`, { description: 'x' }],
      ['DELETE', `/edges/https/${id}`],
      ['PUT', `/edges/https/${id}/tls_termination`, {}],
      ['GET', `/edges/https/${id}/tls_termination`],
      ['DELETE', `/edges/https/${id}/mutual_tls`],
      ['POST', `/edges/https/${id}/routes`, { match_type: 'path_prefix', match: '/' }],
    ] as const) {
      const r = await b.call(m, path, body);
      expect({ m, path, status: r.status, code: r.body.error_code }).toEqual({ m, path, status: 404, code: 'ERR_WARREN_4001' });
    }
    expect((await b.call('GET', '/edges/https')).body.https_edges.map((e: { id: string }) => e.id)).not.toContain(id);
    expect((await a.call('GET', `/edges/https/${id}`)).status).toBe(200);
  });

  it('paginates with keyset cursors across several pages, routes included', async () => {
    const c = await api.account('pager');
    const ids: string[] = [];
    for (let i = 0; i < 7; i++) ids.push((await c.call('POST', '/edges/https', { description: `n${i}` })).body.id);
    await c.call('POST', `/edges/https/${ids[0]}/routes`, { match_type: 'path_prefix', match: '/a' });
    await c.call('POST', `/edges/https/${ids[0]}/routes`, { match_type: 'path_prefix', match: '/b' });
    const { items: seen, pages, nextUris } = await walkPages<any>(c, api.baseUrl, '/edges/https?limit=3', 'https_edges');
    for (const next of nextUris) expect(next).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/edges\/https\?limit=3&before_id=edghts_/);
    expect(pages).toBe(3);
    expect(seen.map((e) => e.id)).toEqual([...ids].sort().reverse());
    expect(seen.find((e) => e.id === ids[0]).routes.map((r: any) => r.match)).toEqual(['/a', '/b']);
    const alias = await c.call('GET', `/edges/https?limit=2&beforeId=${seen[1].id}`);
    expect(alias.body.https_edges.map((x: { id: string }) => x.id)).toEqual(seen.slice(2, 4).map((e) => e.id));
    expect((await c.call('GET', '/edges/https?before_id=ra_2qT9aaaaaaaaaaaaaaaaaaaaaaa')).body.error_code).toBe('ERR_WARREN_2203');
    expect((await c.call('GET', '/edges/https?filter=x')).body.error_code).toBe('ERR_WARREN_2200');
  });

  it('deletes the routes of a deleted edge, with their events', async () => {
    const id = (await a.call('POST', '/edges/https', {})).body.id;
    const r1 = (await a.call('POST', `/edges/https/${id}/routes`, { match_type: 'path_prefix', match: '/', compression: {} })).body;
    const r2 = (await a.call('POST', `/edges/https/${id}/routes`, { match_type: 'exact_path', match: '/x' })).body;
    const edge = (await a.call('GET', `/edges/https/${id}`)).body;
    expect(edge.routes).toEqual([r1, r2]);
    expect((await a.call('DELETE', `/edges/https/${id}`)).status).toBe(204);
    expect((await a.call('GET', `/edges/https/${id}/routes/${r1.id}`)).status).toBe(404);
    const { rows } = await api.db.query('SELECT count(*)::int AS n FROM https_edge_routes WHERE edge_id = $1', [id]);
    expect(rows[0].n).toBe(0);
    expect((await outbox(r1.id)).map((e) => e.event_type)).toEqual(['https_edge_route_created.v0', 'https_edge_route_deleted.v0']);
    expect((await outbox(id)).at(-1)).toEqual({ event_type: 'https_edge_deleted.v0', object: edge });
  });
});
