import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApi, walkPages, expectHiddenFrom, type Account, type TestApi } from '../../../../../test/support/api.js';

let api: TestApi;
let a: Account;
let b: Account;

beforeAll(async () => {
  api = await startTestApi();
  a = await api.account('a');
  b = await api.account('b');
});
afterAll(() => api.close());

describe('reserved addresses', () => {
  it('creates, gets, updates, lists and deletes', async () => {
    const created = await a.call('POST', '/reserved_addrs', { description: 'ssh', metadata: '{"x":1}', region: 'eu' });
    expect(created.status).toBe(201);
    expect(created.body).toMatchObject({ description: 'ssh', metadata: '{"x":1}', region: 'eu', endpoint_configuration: null });
    expect(created.body.id).toMatch(/^ra_[0-9A-Za-z]{27}$/);
    expect(created.body.uri).toBe(`${api.baseUrl}/reserved_addrs/${created.body.id}`);
    expect(created.body.addr).toMatch(/^tcp\.test\.localhost:\d+$/);
    expect(created.body.created_at).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    const id = created.body.id;

    expect((await a.call('GET', `/reserved_addrs/${id}`)).body).toEqual(created.body);

    const patched = await a.call('PATCH', `/reserved_addrs/${id}`, { id, metadata: 'm2' });
    expect(patched.status).toBe(200);
    expect(patched.body).toMatchObject({ description: 'ssh', metadata: 'm2', region: 'eu' });

    const cleared = await a.call('PATCH', `/reserved_addrs/${id}`, { description: '' });
    expect(cleared.body.description).toBeUndefined();

    const list = await a.call('GET', '/reserved_addrs');
    expect(list.status).toBe(200);
    expect(list.body.uri).toBe(`${api.baseUrl}/reserved_addrs`);
    expect(list.body.next_page_uri).toBeNull();
    expect(list.body.reserved_addrs.map((r: { id: string }) => r.id)).toContain(id);

    const del = await a.call('DELETE', `/reserved_addrs/${id}`);
    expect(del.status).toBe(204);
    expect(del.headers.get('content-type')).toBeNull();
    expect((await a.call('GET', `/reserved_addrs/${id}`)).status).toBe(404);
  });

  it('defaults region to us and writes the outbox in the same transaction', async () => {
    const r = await a.call('POST', '/reserved_addrs', {});
    expect(r.body.region).toBe('us');
    const { rows } = await api.db.query('SELECT event_type, object FROM outbox WHERE resource_id = $1', [r.body.id]);
    expect(rows).toEqual([{ event_type: 'tcp_address_created.v0', object: r.body }]);
  });

  it('validates fields with a message naming the field', async () => {
    const bad = await a.call('POST', '/reserved_addrs', { region: 'mars' });
    expect(bad.status).toBe(400);
    expect(bad.body).toMatchObject({ error_code: 'ERR_WARREN_2104', status_code: 400, details: { field: 'region' } });
    expect(bad.body.msg).toContain('region');

    const unknown = await a.call('POST', '/reserved_addrs', { colour: 'red' });
    expect(unknown.body.error_code).toBe('ERR_WARREN_2101');
    expect(unknown.body.msg).toBe('unknown field "colour"; supported: description, metadata, region');

    const long = await a.call('POST', '/reserved_addrs', { metadata: 'é'.repeat(2049) });
    expect(long.body.error_code).toBe('ERR_WARREN_5001');

    const type = await a.call('POST', '/reserved_addrs', { description: 5 });
    expect(type.body).toMatchObject({ error_code: 'ERR_WARREN_2102', details: { field: 'description' } });

    const region = await a.call('PATCH', `/reserved_addrs/${(await a.call('POST', '/reserved_addrs', {})).body.id}`, { region: 'eu' });
    expect(region.body.error_code).toBe('ERR_WARREN_2101');

    const before = await api.db.query('SELECT count(*)::int AS n FROM reserved_addrs');
    await a.call('POST', '/reserved_addrs', { region: 'nope' });
    expect((await api.db.query('SELECT count(*)::int AS n FROM reserved_addrs')).rows[0].n).toBe(before.rows[0].n);
  });

  it('refuses endpoint configuration attachment but accepts detaching', async () => {
    const id = (await a.call('POST', '/reserved_addrs', {})).body.id;
    expect((await a.call('PATCH', `/reserved_addrs/${id}`, { endpoint_configuration_id: 'ec_2qT9aaaaaaaaaaaaaaaaaaaaaaa' })).body.error_code).toBe('ERR_WARREN_3002');
    expect((await a.call('PATCH', `/reserved_addrs/${id}`, { endpoint_configuration_id: '' })).status).toBe(200);
    expect((await a.call('DELETE', `/reserved_addrs/${id}/endpoint_configuration`)).status).toBe(204);
  });

  it('isolates accounts: another account id answers 404', async () => {
    const id = (await a.call('POST', '/reserved_addrs', {})).body.id;
    await expectHiddenFrom(b, `/reserved_addrs/${id}`);
    const list = await b.call('GET', '/reserved_addrs');
    expect(list.body.reserved_addrs.map((r: { id: string }) => r.id)).not.toContain(id);
  });

  it('paginates with keyset cursors across several pages', async () => {
    const c = await api.account('pager');
    const ids: string[] = [];
    for (let i = 0; i < 7; i++) ids.push((await c.call('POST', '/reserved_addrs', { description: `n${i}` })).body.id);
    const { ids: seen, pages, nextUris } = await walkPages(c, api.baseUrl, `/reserved_addrs?limit=3`, 'reserved_addrs');
    for (const next of nextUris) expect(next).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/reserved_addrs\?limit=3&before_id=ra_/);
    expect(pages).toBe(3);
    expect(seen).toEqual([...ids].sort().reverse());
    // camelCase alias, as the TS client sends it
    const alias = await c.call('GET', `/reserved_addrs?limit=2&beforeId=${seen[1]}`);
    expect(alias.body.reserved_addrs.map((x: { id: string }) => x.id)).toEqual(seen.slice(2, 4));
  });

  it('rejects bad pagination parameters', async () => {
    expect((await a.call('GET', '/reserved_addrs?limit=0')).body.error_code).toBe('ERR_WARREN_2202');
    expect((await a.call('GET', '/reserved_addrs?limit=101')).body.error_code).toBe('ERR_WARREN_2202');
    expect((await a.call('GET', '/reserved_addrs?filter=x')).body).toMatchObject({ error_code: 'ERR_WARREN_2200', details: { param: 'filter' } });
    expect((await a.call('GET', '/reserved_addrs?limit=1&limit=2')).body.error_code).toBe('ERR_WARREN_2201');
    expect((await a.call('GET', '/reserved_addrs?before_id=nope')).body.error_code).toBe('ERR_WARREN_2203');
    expect((await a.call('GET', '/reserved_addrs?before_id=ra_1&beforeId=ra_2')).body.error_code).toBe('ERR_WARREN_2204');
    expect((await a.call('GET', '/reserved_addrs?before_id=&limit=')).status).toBe(200);
  });
});
