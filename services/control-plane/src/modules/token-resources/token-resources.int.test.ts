import { afterAll, beforeAll, describe, expect, it } from 'vitest';
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

describe('API keys', () => {
  it('shows the token once, stores only its hash, and the new key works', async () => {
    const c = await a.call('POST', '/api_keys', { description: 'ci', metadata: 'm' });
    expect(c.status).toBe(201);
    expect(c.body.token).toMatch(/^wrn_api_[0-9A-Za-z]{43}$/);
    expect(c.body).toMatchObject({ description: 'ci', metadata: 'm' });
    const stored = await api.db.query('SELECT token_hash FROM api_keys WHERE id = $1', [c.body.id]);
    expect(stored.rows[0].token_hash).toMatch(/^[0-9a-f]{64}$/);
    expect(JSON.stringify(stored.rows)).not.toContain(c.body.token);
    const outbox = await api.db.query('SELECT object FROM outbox WHERE resource_id = $1', [c.body.id]);
    expect(JSON.stringify(outbox.rows)).not.toContain(c.body.token);
    expect((await a.call('GET', `/api_keys/${c.body.id}`)).body.token).toBeNull();
    const list = await a.call('GET', '/api_keys');
    expect(list.body.keys.length).toBe(2);
    expect(list.body.keys.every((k: { token: unknown }) => k.token === null)).toBe(true);
    const res = await api.raw('GET', '/reserved_addrs', { headers: { Authorization: `Bearer ${c.body.token}`, 'Service-Version': '2' } });
    expect(res.status).toBe(200);
    const p = await a.call('PATCH', `/api_keys/${c.body.id}`, { id: c.body.id, description: 'ci2' });
    expect(p.body).toMatchObject({ description: 'ci2', token: null });
    expect((await a.call('DELETE', `/api_keys/${c.body.id}`)).status).toBe(204);
    const after = await api.raw('GET', '/reserved_addrs', { headers: { Authorization: `Bearer ${c.body.token}`, 'Service-Version': '2' } });
    expect(after.status).toBe(401);
  });

  it('refuses to delete the last key (409) and isolates accounts', async () => {
    const keys = (await b.call('GET', '/api_keys')).body.keys;
    expect(keys.length).toBe(1);
    const r = await b.call('DELETE', `/api_keys/${keys[0].id}`);
    expect(r.status).toBe(409);
    expect(r.body.error_code).toBe('ERR_WARREN_4102');
    expect((await a.call('GET', `/api_keys/${keys[0].id}`)).status).toBe(404);
    expect((await a.call('DELETE', `/api_keys/${keys[0].id}`)).status).toBe(404);
  });

  it('refuses owner_id and unknown fields', async () => {
    const r = await a.call('POST', '/api_keys', { owner_id: 'usr_x' });
    expect(r.body).toMatchObject({ error_code: 'ERR_WARREN_2101', details: { field: 'owner_id' } });
  });
});

describe('credentials', () => {
  it('creates an authtoken shown once, with an ACL', async () => {
    const c = await a.call('POST', '/credentials', { description: 'laptop', acl: ['bind:*.example.com', 'bind:app=web'] });
    expect(c.status).toBe(201);
    expect(c.body.token).toMatch(/^wrn_agt_/);
    expect(c.body.acl).toEqual(['bind:*.example.com', 'bind:app=web']);
    const g = await a.call('GET', `/credentials/${c.body.id}`);
    expect(g.body).toMatchObject({ token: null, acl: ['bind:*.example.com', 'bind:app=web'] });
    expect((await a.call('PATCH', `/credentials/${c.body.id}`, { acl: [] })).body.acl).toEqual([]);
    // an authtoken is not an API key
    const asKey = await api.raw('GET', '/credentials', { headers: { Authorization: `Bearer ${c.body.token}`, 'Service-Version': '2' } });
    expect(asKey.body.error_code).toBe('ERR_WARREN_1003');
    expect((await b.call('GET', `/credentials/${c.body.id}`)).status).toBe(404);
    expect((await a.call('DELETE', `/credentials/${c.body.id}`)).status).toBe(204);
    const events = await api.db.query('SELECT event_type FROM outbox WHERE resource_id = $1 ORDER BY seq', [c.body.id]);
    expect(events.rows.map((r) => r.event_type)).toEqual(['tunnel_credential_created.v0', 'tunnel_credential_updated.v0', 'tunnel_credential_deleted.v0']);
  });

  it('validates ACL entries', async () => {
    const bad = await a.call('POST', '/credentials', { acl: ['bind:', 'nope'] });
    expect(bad.body).toMatchObject({ error_code: 'ERR_WARREN_6800', details: { field: 'acl[0]' } });
    const many = await a.call('POST', '/credentials', { acl: Array.from({ length: 101 }, () => '*') });
    expect(many.body.error_code).toBe('ERR_WARREN_5002');
    expect((await a.call('POST', '/credentials', { acl: ['*', 'bind:host.example.com:443', 'bind:*=*'] })).status).toBe(201);
  });
});
