import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '@warren/shared';
import { startTestApi, type Account, type TestApi } from '../../../../../test/support/api.js';

let api: TestApi;
let a: Account;
let b: Account;
beforeAll(async () => {
  api = await startTestApi();
  a = await api.account('a');
  b = await api.account('b');
});
afterAll(() => api.close());

describe('tunnel group backends', () => {
  it('creates with empty tunnels, gets, patches, lists and deletes', async () => {
    const c = await a.call('POST', '/backends/tunnel_group', { description: 'web', labels: { app: 'web', env: 'prod' } });
    expect(c.status).toBe(201);
    expect(c.body).toMatchObject({ description: 'web', labels: { app: 'web', env: 'prod' }, tunnels: [] });
    expect(c.body.id).toMatch(/^bkdtg_/);
    expect(c.body.uri).toBe(`${api.baseUrl}/backends/tunnel_group/${c.body.id}`);
    expect(c.body.metadata).toBeUndefined();
    const id = c.body.id;
    expect((await a.call('GET', `/backends/tunnel_group/${id}`)).body).toEqual(c.body);
    const p = await a.call('PATCH', `/backends/tunnel_group/${id}`, { id, labels: { app: 'api' } });
    expect(p.body).toMatchObject({ description: 'web', labels: { app: 'api' } });
    const l = await a.call('GET', '/backends/tunnel_group');
    expect(l.body.backends.map((x: { id: string }) => x.id)).toEqual([id]);
    expect(l.body.uri).toBe(`${api.baseUrl}/backends/tunnel_group`);
    expect((await a.call('DELETE', `/backends/tunnel_group/${id}`)).status).toBe(204);
    expect((await a.call('GET', `/backends/tunnel_group/${id}`)).status).toBe(404);
    const events = await api.db.query('SELECT event_type FROM outbox WHERE resource_id = $1 ORDER BY seq', [id]);
    expect(events.rows.map((r) => r.event_type)).toEqual(['tunnel_group_backend_created.v0', 'tunnel_group_backend_updated.v0', 'tunnel_group_backend_deleted.v0']);
  });

  it('validates labels', async () => {
    const cases: [unknown, string, string][] = [
      [{}, 'ERR_WARREN_2103', 'labels'],
      [{ labels: {} }, 'ERR_WARREN_6100', 'labels'],
      [{ labels: { 'a:b': 'x' } }, 'ERR_WARREN_6100', 'labels.a:b'],
      [{ labels: { a: 'x=y' } }, 'ERR_WARREN_6100', 'labels.a'],
      [{ labels: { a: '' } }, 'ERR_WARREN_6100', 'labels.a'],
      [{ labels: { ['k'.repeat(65)]: 'v' } }, 'ERR_WARREN_6100', `labels.${'k'.repeat(65)}`],
      [{ labels: Object.fromEntries(Array.from({ length: 11 }, (_, i) => [`k${i}`, 'v'])) }, 'ERR_WARREN_6100', 'labels'],
      [{ labels: { a: 1 } }, 'ERR_WARREN_2102', 'labels.a'],
      [{ labels: { a: 'b' }, description: 'd'.repeat(256) }, 'ERR_WARREN_5000', 'description'],
      [{ labels: { a: 'b' }, extra: 1 }, 'ERR_WARREN_2101', 'extra'],
    ];
    for (const [body, code, field] of cases) {
      const r = await a.call('POST', '/backends/tunnel_group', body);
      expect(r.status, JSON.stringify(body).slice(0, 80)).toBe(400);
      expect(r.body.error_code).toBe(code);
      expect(r.body.details.field).toBe(field);
    }
  });

  it('lists online tunnels whose labels include the backend labels', async () => {
    const be = (await a.call('POST', '/backends/tunnel_group', { labels: { app: 'web' } })).body;
    const cr = (await a.call('POST', '/credentials', {})).body;
    const ts = newId('ts');
    await api.db.query(`INSERT INTO tunnel_sessions (id, account_id, credential_id, lease_expires_at) VALUES ($1, $2, $3, now() + interval '1 minute')`, [ts, a.accountId, cr.id]);
    const tn = newId('tn');
    await api.db.query(`INSERT INTO tunnels (id, account_id, tunnel_session_id, labels, forwards_to) VALUES ($1, $2, $3, $4, 'localhost:80')`, [tn, a.accountId, ts, JSON.stringify({ app: 'web', v: '2' })]);
    const got = await a.call('GET', `/backends/tunnel_group/${be.id}`);
    expect(got.body.tunnels).toEqual([{ id: tn, uri: `${api.baseUrl}/tunnels/${tn}` }]);
    const t = await a.call('GET', `/tunnels/${tn}`);
    expect(t.body).toMatchObject({ id: tn, labels: { app: 'web', v: '2' }, backends: [{ id: be.id }], forwards_to: 'localhost:80', tunnel_session: { id: ts } });
    expect((await a.call('GET', '/tunnel_sessions')).body.tunnel_sessions.map((s: { id: string }) => s.id)).toEqual([ts]);
    expect((await a.call('GET', `/tunnel_sessions/${ts}`)).body).toMatchObject({ id: ts, transport: 'ngrok/v2', credential: { id: cr.id } });
    // another account sees none of it
    expect((await b.call('GET', `/tunnels/${tn}`)).status).toBe(404);
    expect((await b.call('GET', '/tunnels')).body.tunnels).toEqual([]);
    // an expired lease hides the tunnel
    await api.db.query(`UPDATE tunnel_sessions SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, [ts]);
    expect((await a.call('GET', `/backends/tunnel_group/${be.id}`)).body.tunnels).toEqual([]);
    expect((await a.call('GET', `/tunnels/${tn}`)).status).toBe(404);
  });

  it('refuses to delete a backend a route uses (409)', async () => {
    const be = (await a.call('POST', '/backends/tunnel_group', { labels: { app: 'x' } })).body;
    const edge = newId('edghts');
    await api.db.query('INSERT INTO https_edges (id, account_id) VALUES ($1, $2)', [edge, a.accountId]);
    await api.db.query(`INSERT INTO https_edge_routes (id, account_id, edge_id, match_type, match, backend_id) VALUES ($1, $2, $3, 'path_prefix', '/', $4)`, [newId('edghtsrt'), a.accountId, edge, be.id]);
    const r = await a.call('DELETE', `/backends/tunnel_group/${be.id}`);
    expect(r.status).toBe(409);
    expect(r.body.error_code).toBe('ERR_WARREN_4100');
  });

  it('isolates accounts', async () => {
    const be = (await a.call('POST', '/backends/tunnel_group', { labels: { app: 'y' } })).body;
    expect((await b.call('GET', `/backends/tunnel_group/${be.id}`)).status).toBe(404);
    expect((await b.call('PATCH', `/backends/tunnel_group/${be.id}`, { description: 'x' })).status).toBe(404);
    expect((await b.call('DELETE', `/backends/tunnel_group/${be.id}`)).status).toBe(404);
  });
});
