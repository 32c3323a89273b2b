import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '@warren/shared';
import { startTestApi, walkPages, type Account, type TestApi } from '../../../../../test/support/api.js';
import { EVENT_SOURCE_TYPES } from './source-types.js';

let api: TestApi;
let a: Account;
let b: Account;

beforeAll(async () => {
  api = await startTestApi();
  a = await api.account('a');
  b = await api.account('b');
});
afterAll(() => api.close());

const destination = async (acct: Account) => (await acct.call('POST', '/event_destinations', { target: { datadog: { api_key: 'k' } } })).body as { id: string; uri: string };
const create = (acct: Account, body: Record<string, unknown>) => acct.call('POST', '/event_subscriptions', body);
const outbox = async (id: string) =>
  (await api.db.query('SELECT event_type, resource_type, object FROM outbox WHERE resource_id = $1 ORDER BY seq', [id])).rows as {
    event_type: string;
    resource_type: string;
    object: Record<string, unknown>;
  }[];

describe('event subscriptions', () => {
  it('creates, gets, updates, lists and deletes', async () => {
    const d1 = await destination(a);
    const d2 = await destination(a);
    const created = await create(a, {
      description: 'audit',
      metadata: 'm',
      sources: [{ type: 'ip_policy_created.v0' }, { type: 'http_request_complete.v0' }],
      destination_ids: [d2.id, d1.id],
    });
    expect(created.status).toBe(201);
    const s = created.body;
    expect(s.id).toMatch(/^esb_[0-9A-Za-z]{27}$/);
    const uri = `${api.baseUrl}/event_subscriptions/${s.id}`;
    expect(s).toEqual({
      id: s.id,
      uri,
      created_at: s.created_at,
      description: 'audit',
      metadata: 'm',
      sources: [
        { type: 'ip_policy_created.v0', uri: `${uri}/sources/ip_policy_created.v0` },
        { type: 'http_request_complete.v0', uri: `${uri}/sources/http_request_complete.v0` },
      ],
      destinations: [
        { id: d2.id, uri: d2.uri },
        { id: d1.id, uri: d1.uri },
      ],
    });
    expect(s.created_at).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    expect((await a.call('GET', `/event_subscriptions/${s.id}`)).body).toEqual(s);

    const patched = await a.call('PATCH', `/event_subscriptions/${s.id}`, { id: s.id, description: '', sources: [{ type: 'tcp_connection_closed.v0' }], destination_ids: [d1.id] });
    expect(patched.status).toBe(200);
    expect(patched.body).toEqual({
      id: s.id,
      uri,
      created_at: s.created_at,
      metadata: 'm',
      sources: [{ type: 'tcp_connection_closed.v0', uri: `${uri}/sources/tcp_connection_closed.v0` }],
      destinations: [{ id: d1.id, uri: d1.uri }],
    });
    // Omitted lists are unchanged; [] clears them.
    expect((await a.call('PATCH', `/event_subscriptions/${s.id}`, { metadata: 'n' })).body).toEqual({ ...patched.body, metadata: 'n' });
    const cleared = await a.call('PATCH', `/event_subscriptions/${s.id}`, { sources: [], destination_ids: [] });
    expect(cleared.body).toMatchObject({ sources: [], destinations: [] });

    const list = await a.call('GET', '/event_subscriptions');
    expect(list.body).toMatchObject({ uri: `${api.baseUrl}/event_subscriptions`, next_page_uri: null });
    expect(list.body.event_subscriptions.map((x: { id: string }) => x.id)).toContain(s.id);

    expect((await a.call('DELETE', `/event_subscriptions/${s.id}`)).status).toBe(204);
    expect((await a.call('GET', `/event_subscriptions/${s.id}`)).status).toBe(404);
    const left = await api.db.query('SELECT 1 FROM event_subscription_sources WHERE subscription_id = $1 UNION ALL SELECT 1 FROM event_subscription_destinations WHERE subscription_id = $1', [s.id]);
    expect(left.rows).toHaveLength(0);
  });

  it('creates with empty lists by default and accepts every documented source type', async () => {
    const empty = await create(a, {});
    expect(empty.status).toBe(201);
    expect(empty.body).toMatchObject({ sources: [], destinations: [] });
    expect(empty.body.description).toBeUndefined();
    expect(EVENT_SOURCE_TYPES).toHaveLength(37);
    const all = await create(a, { sources: EVENT_SOURCE_TYPES.map((type) => ({ type })) });
    expect(all.status).toBe(201);
    expect(all.body.sources.map((x: { type: string }) => x.type)).toEqual(EVENT_SOURCE_TYPES);
    for (const t of ['tcp_address_updated.v0', 'tunnel_credential_deleted.v0', 'https_edge_route_created.v0', 'agent_session_start.v0', 'agent_session_stop.v0'])
      expect(EVENT_SOURCE_TYPES).toContain(t);
  });

  it('validates sources and destinations', async () => {
    const unknown = await create(a, { sources: [{ type: 'ip_policy_created.v0' }, { type: 'ip_policy_created' }] });
    expect(unknown.status).toBe(400);
    expect(unknown.body).toMatchObject({ error_code: 'ERR_WARREN_6601', details: { field: 'sources[1].type' } });
    expect(unknown.body.msg).toContain('ip_policy_rule_deleted.v0');
    expect(unknown.body.msg).toContain('tcp_connection_closed.v0');

    const twice = await create(a, { sources: [{ type: 'api_key_created.v0' }, { type: 'api_key_created.v0' }] });
    expect(twice.body).toMatchObject({ error_code: 'ERR_WARREN_6600', details: { field: 'sources[1].type' } });
    expect((await create(a, { sources: [{}] })).body).toMatchObject({ error_code: 'ERR_WARREN_2103', details: { field: 'sources[0].type' } });
    expect((await create(a, { sources: [{ type: 'api_key_created.v0', uri: 'x' }] })).body).toMatchObject({ error_code: 'ERR_WARREN_2101', details: { field: 'sources[0].uri' } });
    expect((await create(a, { sources: 'api_key_created.v0' })).body).toMatchObject({ error_code: 'ERR_WARREN_2102', details: { field: 'sources' } });

    const ds = await Promise.all(Array.from({ length: 11 }, () => destination(a)));
    expect((await create(a, { destination_ids: ds.slice(0, 10).map((d) => d.id) })).status).toBe(201);
    expect((await create(a, { destination_ids: ds.map((d) => d.id) })).body).toMatchObject({ error_code: 'ERR_WARREN_5002', details: { field: 'destination_ids' } });
    expect((await create(a, { destination_ids: [ds[0]!.id, ds[0]!.id] })).body).toMatchObject({ error_code: 'ERR_WARREN_6600', details: { field: 'destination_ids[1]' } });
    expect((await create(a, { destination_ids: ['ed_bad'] })).body).toMatchObject({ error_code: 'ERR_WARREN_3000', details: { field: 'destination_ids[0]' } });
    expect((await create(a, { destination_ids: [newId('ipp')] })).body).toMatchObject({ error_code: 'ERR_WARREN_3001', details: { field: 'destination_ids[0]' } });
    const missing = newId('ed');
    expect((await create(a, { destination_ids: [ds[0]!.id, missing] })).body).toMatchObject({
      error_code: 'ERR_WARREN_3002',
      details: { field: 'destination_ids[1]', resource_id: missing },
    });
    const foreign = await destination(b);
    expect((await create(a, { destination_ids: [foreign.id] })).body.error_code).toBe('ERR_WARREN_3002');
    expect((await create(a, { description: 'x'.repeat(256) })).body.error_code).toBe('ERR_WARREN_5000');
    expect((await create(a, { metadata: 'x'.repeat(4097) })).body.error_code).toBe('ERR_WARREN_5001');

    const s = (await create(a, {})).body;
    expect((await a.call('PATCH', `/event_subscriptions/${s.id}`, { destination_ids: [foreign.id] })).body.error_code).toBe('ERR_WARREN_3002');
    expect((await a.call('PATCH', `/event_subscriptions/${s.id}`, { sources: [{ type: 'nope' }] })).body.error_code).toBe('ERR_WARREN_6601');
    expect((await a.call('PATCH', `/event_subscriptions/${s.id}`, { colour: 1 })).body.error_code).toBe('ERR_WARREN_2101');
  });

  it('writes outbox rows, and none for a PATCH that changes nothing', async () => {
    const d = await destination(a);
    const s = (await create(a, { description: 'x', sources: [{ type: 'ip_policy_created.v0' }], destination_ids: [d.id] })).body;
    await a.call('PATCH', `/event_subscriptions/${s.id}`, { id: s.id });
    await a.call('PATCH', `/event_subscriptions/${s.id}`, { description: 'x', sources: [{ type: 'ip_policy_created.v0' }], destination_ids: [d.id] });
    const u = (await a.call('PATCH', `/event_subscriptions/${s.id}`, { destination_ids: [] })).body;
    await a.call('DELETE', `/event_subscriptions/${s.id}`);
    expect(await outbox(s.id)).toEqual([
      { event_type: 'event_subscription_created.v0', resource_type: 'event_subscription', object: s },
      { event_type: 'event_subscription_updated.v0', resource_type: 'event_subscription', object: u },
      { event_type: 'event_subscription_deleted.v0', resource_type: 'event_subscription', object: u },
    ]);
  });

  it('isolates accounts', async () => {
    const s = (await create(a, { sources: [{ type: 'ip_policy_created.v0' }] })).body;
    const paths: [string, string, unknown?][] = [
      ['GET', `/event_subscriptions/${s.id}`],
      ['PATCH', `/event_subscriptions/${s.id}`, { description: 'x' }],
      ['DELETE', `/event_subscriptions/${s.id}`],
      ['GET', `/event_subscriptions/${s.id}/sources`],
      ['POST', `/event_subscriptions/${s.id}/sources`, { type: 'api_key_created.v0' }],
      ['GET', `/event_subscriptions/${s.id}/sources/ip_policy_created.v0`],
      ['PATCH', `/event_subscriptions/${s.id}/sources/ip_policy_created.v0`, {}],
      ['DELETE', `/event_subscriptions/${s.id}/sources/ip_policy_created.v0`],
    ];
    for (const [m, p, body] of paths) {
      const r = await b.call(m, p, body);
      expect(r.status, `${m} ${p}`).toBe(404);
      expect(r.body.error_code).toBe('ERR_WARREN_4001');
    }
    expect((await b.call('GET', '/event_subscriptions')).body.event_subscriptions).toEqual([]);
    expect((await a.call('GET', `/event_subscriptions/${s.id}`)).body).toEqual(s);
  });

  it('paginates across pages', async () => {
    const c = await api.account('pager');
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) ids.push((await create(c, {})).body.id);
    const { ids: seen, pages } = await walkPages(c, api.baseUrl, '/event_subscriptions?limit=2', 'event_subscriptions');
    expect(pages).toBe(3);
    expect(seen).toEqual([...ids].sort().reverse());
    expect((await c.call('GET', '/event_subscriptions?limit=2&beforeId=' + seen[1])).body.event_subscriptions.map((x: { id: string }) => x.id)).toEqual(seen.slice(2, 4));
  });
});

describe('event sources', () => {
  it('adds, lists, gets, patches and removes sources, each change an event_subscription_updated event', async () => {
    const s = (await create(a, { sources: [{ type: 'ip_policy_created.v0' }] })).body;
    const base = `${api.baseUrl}/event_subscriptions/${s.id}/sources`;

    const added = await a.call('POST', `/event_subscriptions/${s.id}/sources`, { subscription_id: s.id, type: 'ip_policy_deleted.v0' });
    expect(added.status).toBe(201);
    expect(added.body).toEqual({ type: 'ip_policy_deleted.v0', uri: `${base}/ip_policy_deleted.v0` });

    const list = await a.call('GET', `/event_subscriptions/${s.id}/sources`);
    expect(list.status).toBe(200);
    expect(list.body).toEqual({
      sources: [
        { type: 'ip_policy_created.v0', uri: `${base}/ip_policy_created.v0` },
        { type: 'ip_policy_deleted.v0', uri: `${base}/ip_policy_deleted.v0` },
      ],
      uri: base,
    });

    const got = await a.call('GET', `/event_subscriptions/${s.id}/sources/ip_policy_deleted.v0`);
    expect(got.status).toBe(200);
    expect(got.body).toEqual(added.body);

    for (const body of [{}, { subscription_id: s.id, type: 'ip_policy_deleted.v0' }, { type: 'something_else' }, undefined]) {
      const p = await a.call('PATCH', `/event_subscriptions/${s.id}/sources/ip_policy_deleted.v0`, body);
      expect(p.status, JSON.stringify(body)).toBe(200);
      expect(p.body).toEqual(added.body);
    }
    expect((await a.call('PATCH', `/event_subscriptions/${s.id}/sources/ip_policy_deleted.v0`, { colour: 1 })).body.error_code).toBe('ERR_WARREN_2101');

    const del = await a.call('DELETE', `/event_subscriptions/${s.id}/sources/ip_policy_created.v0`);
    expect(del.status).toBe(204);
    expect(del.body).toBeUndefined();
    const after = (await a.call('GET', `/event_subscriptions/${s.id}`)).body;
    expect(after.sources).toEqual([{ type: 'ip_policy_deleted.v0', uri: `${base}/ip_policy_deleted.v0` }]);

    // Appended after the existing ones.
    await a.call('POST', `/event_subscriptions/${s.id}/sources`, { type: 'ip_policy_created.v0' });
    const final = (await a.call('GET', `/event_subscriptions/${s.id}`)).body;
    expect(final.sources.map((x: { type: string }) => x.type)).toEqual(['ip_policy_deleted.v0', 'ip_policy_created.v0']);

    const events = await outbox(s.id);
    expect(events.map((e) => e.event_type)).toEqual([
      'event_subscription_created.v0',
      'event_subscription_updated.v0',
      'event_subscription_updated.v0',
      'event_subscription_updated.v0',
    ]);
    expect(events[2]!.object).toEqual(after);
    expect(events[3]!.object).toEqual(final);
  });

  it('answers 409 for a source POSTed twice, 400 for unknown types and 404 for missing ones', async () => {
    const s = (await create(a, { sources: [{ type: 'ip_policy_created.v0' }] })).body;
    const dup = await a.call('POST', `/event_subscriptions/${s.id}/sources`, { type: 'ip_policy_created.v0' });
    expect(dup.status).toBe(409);
    expect(dup.body).toMatchObject({ error_code: 'ERR_WARREN_4101', details: { field: 'type' } });

    const bad = await a.call('POST', `/event_subscriptions/${s.id}/sources`, { type: 'bogus.v0' });
    expect(bad.body).toMatchObject({ error_code: 'ERR_WARREN_6601', details: { field: 'type' } });
    expect((await a.call('POST', `/event_subscriptions/${s.id}/sources`, {})).body).toMatchObject({ error_code: 'ERR_WARREN_2103', details: { field: 'type' } });
    expect((await a.call('POST', `/event_subscriptions/${s.id}/sources`, { type: 'api_key_created.v0', uri: 'x' })).body.error_code).toBe('ERR_WARREN_2101');
    // Field rules come before the existence of the path resource.
    const gone = newId('esb');
    expect((await a.call('POST', `/event_subscriptions/${gone}/sources`, { type: 'bogus' })).body.error_code).toBe('ERR_WARREN_6601');
    expect((await a.call('POST', `/event_subscriptions/${gone}/sources`, { type: 'api_key_created.v0' })).status).toBe(404);
    expect((await a.call('GET', `/event_subscriptions/${gone}/sources`)).status).toBe(404);

    for (const m of ['GET', 'PATCH', 'DELETE']) {
      const r = await a.call(m, `/event_subscriptions/${s.id}/sources/api_key_created.v0`, m === 'PATCH' ? {} : undefined);
      expect(r.status, m).toBe(404);
      expect(r.body.error_code).toBe('ERR_WARREN_4001');
    }
    expect((await a.call('GET', `/event_subscriptions/${s.id}/sources/bogus`)).status).toBe(404);
    expect((await a.call('PUT', `/event_subscriptions/${s.id}/sources/ip_policy_created.v0`, {})).status).toBe(405);
    expect((await outbox(s.id)).map((e) => e.event_type)).toEqual(['event_subscription_created.v0']);
  });
});
