import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '@warren/shared';
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

const policy = async (acct: Account, body: Record<string, unknown> = {}) => (await acct.call('POST', '/ip_policies', body)).body as { id: string; uri: string };
const rule = (acct: Account, body: Record<string, unknown>) => acct.call('POST', '/ip_policy_rules', body);

describe('IP policies', () => {
  it('creates, gets, updates, lists and deletes', async () => {
    const created = await a.call('POST', '/ip_policies', { description: 'office', metadata: 'm' });
    expect(created.status).toBe(201);
    const p = created.body;
    expect(p.id).toMatch(/^ipp_[0-9A-Za-z]{27}$/);
    expect(p).toEqual({ id: p.id, uri: `${api.baseUrl}/ip_policies/${p.id}`, created_at: p.created_at, description: 'office', metadata: 'm' });
    expect(p.created_at).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    expect((await a.call('GET', `/ip_policies/${p.id}`)).body).toEqual(p);

    const patched = await a.call('PATCH', `/ip_policies/${p.id}`, { id: p.id, description: 'home' });
    expect(patched.status).toBe(200);
    expect(patched.body).toEqual({ ...p, description: 'home' });
    expect((await a.call('PATCH', `/ip_policies/${p.id}`, { metadata: '' })).body.metadata).toBeUndefined();

    const list = await a.call('GET', '/ip_policies');
    expect(list.body).toMatchObject({ uri: `${api.baseUrl}/ip_policies`, next_page_uri: null });
    expect(list.body.ip_policies.map((x: { id: string }) => x.id)).toContain(p.id);

    expect((await a.call('DELETE', `/ip_policies/${p.id}`)).status).toBe(204);
    expect((await a.call('GET', `/ip_policies/${p.id}`)).body.error_code).toBe('ERR_WARREN_4001');
  });

  it('validates fields', async () => {
    expect((await a.call('POST', '/ip_policies', { description: 'é'.repeat(128) })).body).toMatchObject({ error_code: 'ERR_WARREN_5000', details: { field: 'description' } });
    expect((await a.call('POST', '/ip_policies', { metadata: 'x'.repeat(4097) })).body).toMatchObject({ error_code: 'ERR_WARREN_5001', details: { field: 'metadata' } });
    const action = await a.call('POST', '/ip_policies', { action: 'allow' });
    expect(action.body).toMatchObject({ error_code: 'ERR_WARREN_2101', details: { field: 'action' } });
    expect(action.body.msg).toBe('unknown field "action"; supported: description, metadata');
    expect((await a.call('POST', '/ip_policies', { description: 1 })).body).toMatchObject({ error_code: 'ERR_WARREN_2102', details: { field: 'description' } });
  });

  it('deletes its rules with the policy, with an event for each', async () => {
    const p = await policy(a);
    const r1 = (await rule(a, { ip_policy_id: p.id, cidr: '10.0.0.0/8', action: 'allow' })).body;
    const r2 = (await rule(a, { ip_policy_id: p.id, cidr: '2001:db8::/32', action: 'deny' })).body;
    expect((await a.call('DELETE', `/ip_policies/${p.id}`)).status).toBe(204);
    expect((await a.call('GET', `/ip_policy_rules/${r1.id}`)).status).toBe(404);
    expect((await a.call('GET', `/ip_policy_rules/${r2.id}`)).status).toBe(404);
    const { rows } = await api.db.query('SELECT event_type, resource_id, object FROM outbox WHERE resource_id = ANY($1) ORDER BY seq', [[p.id, r1.id, r2.id]]);
    expect(rows.map((r) => `${r.event_type} ${r.resource_id}`)).toEqual([
      `ip_policy_created.v0 ${p.id}`,
      `ip_policy_rule_created.v0 ${r1.id}`,
      `ip_policy_rule_created.v0 ${r2.id}`,
      `ip_policy_rule_deleted.v0 ${r1.id}`,
      `ip_policy_rule_deleted.v0 ${r2.id}`,
      `ip_policy_deleted.v0 ${p.id}`,
    ]);
    expect(rows[3].object).toEqual(r1);
  });

  it('answers 409 when deleting a policy that a route ip_restriction lists', async () => {
    const p = await policy(a);
    const r = (await rule(a, { ip_policy_id: p.id, cidr: '10.0.0.0/8', action: 'allow' })).body;
    const edgeId = newId('edghts');
    const routeId = newId('edghtsrt');
    await api.db.query('INSERT INTO https_edges (id, account_id) VALUES ($1, $2)', [edgeId, a.accountId]);
    await api.db.query(`INSERT INTO https_edge_routes (id, account_id, edge_id, match_type, match) VALUES ($1, $2, $3, 'path_prefix', '/')`, [routeId, a.accountId, edgeId]);
    await api.db.query('INSERT INTO https_edge_route_ip_policies (route_id, ip_policy_id, position) VALUES ($1, $2, 0)', [routeId, p.id]);
    const del = await a.call('DELETE', `/ip_policies/${p.id}`);
    expect(del.status).toBe(409);
    expect(del.body.error_code).toBe('ERR_WARREN_4100');
    expect(del.body.msg).toContain(routeId);
    expect((await a.call('GET', `/ip_policy_rules/${r.id}`)).status).toBe(200);
    await api.db.query('DELETE FROM https_edges WHERE id = $1', [edgeId]);
    expect((await a.call('DELETE', `/ip_policies/${p.id}`)).status).toBe(204);
  });

  it('writes outbox rows, and none for a PATCH that changes nothing', async () => {
    const p = (await a.call('POST', '/ip_policies', { description: 'd' })).body;
    expect((await a.call('PATCH', `/ip_policies/${p.id}`, { id: p.id, description: 'd' })).body).toEqual(p);
    const u = (await a.call('PATCH', `/ip_policies/${p.id}`, { description: 'e' })).body;
    const { rows } = await api.db.query('SELECT event_type, object FROM outbox WHERE resource_id = $1 ORDER BY seq', [p.id]);
    expect(rows).toEqual([
      { event_type: 'ip_policy_created.v0', object: p },
      { event_type: 'ip_policy_updated.v0', object: u },
    ]);
  });

  it('isolates accounts', async () => {
    const p = await policy(a);
    await expectHiddenFrom(b, `/ip_policies/${p.id}`);
    expect((await b.call('GET', '/ip_policies')).body.ip_policies).toEqual([]);
  });

  it('paginates across pages', async () => {
    const c = await api.account('pager');
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) ids.push((await policy(c)).id);
    const { ids: seen } = await walkPages(c, api.baseUrl, '/ip_policies?limit=2', 'ip_policies');
    expect(seen).toEqual([...ids].sort().reverse());
  });
});

describe('IP policy rules', () => {
  it('creates, gets, updates, lists and deletes', async () => {
    const p = await policy(a);
    const created = await rule(a, { ip_policy_id: p.id, cidr: '203.0.113.0/24', action: 'allow', description: 'office', metadata: 'm' });
    expect(created.status).toBe(201);
    const r = created.body;
    expect(r.id).toMatch(/^ipr_[0-9A-Za-z]{27}$/);
    expect(r).toEqual({
      id: r.id,
      uri: `${api.baseUrl}/ip_policy_rules/${r.id}`,
      created_at: r.created_at,
      description: 'office',
      metadata: 'm',
      cidr: '203.0.113.0/24',
      ip_policy: { id: p.id, uri: p.uri },
      action: 'allow',
    });
    expect((await a.call('GET', `/ip_policy_rules/${r.id}`)).body).toEqual(r);

    const patched = await a.call('PATCH', `/ip_policy_rules/${r.id}`, { id: r.id, cidr: '198.51.100.0/24', description: '' });
    expect(patched.status).toBe(200);
    const { description: _d, ...rest } = r;
    expect(patched.body).toEqual({ ...rest, cidr: '198.51.100.0/24' });

    const list = await a.call('GET', '/ip_policy_rules');
    expect(list.body).toMatchObject({ uri: `${api.baseUrl}/ip_policy_rules`, next_page_uri: null });
    expect(list.body.ip_policy_rules.map((x: { id: string }) => x.id)).toContain(r.id);

    expect((await a.call('DELETE', `/ip_policy_rules/${r.id}`)).status).toBe(204);
    expect((await a.call('GET', `/ip_policy_rules/${r.id}`)).status).toBe(404);
    expect((await a.call('GET', `/ip_policies/${p.id}`)).status).toBe(200);
  });

  it('accepts IPv4 and IPv6 CIDRs and normalizes them', async () => {
    const p = await policy(a);
    const cases: [string, string][] = [
      ['0.0.0.0/0', '0.0.0.0/0'],
      ['192.0.2.7/32', '192.0.2.7/32'],
      [' 10.1.0.0/16 ', '10.1.0.0/16'],
      ['2001:DB8:0:0::/64', '2001:db8::/64'],
      ['::/0', '::/0'],
      ['::1/128', '::1/128'],
      ['2001:0db8:0000:0000:0001:0000:0000:0000/96', '2001:db8:0:0:1::/96'],
    ];
    for (const [cidr, want] of cases) {
      const r = await rule(a, { ip_policy_id: p.id, cidr, action: 'deny' });
      expect(r.status, cidr).toBe(201);
      expect(r.body.cidr, cidr).toBe(want);
      expect(r.body.action).toBe('deny');
    }
  });

  it('validates CIDRs, actions and policy references', async () => {
    const p = await policy(a);
    for (const cidr of ['10.0.0.1', '10.0.0.1/8', '10/8', '10.0.0.0/33', '256.0.0.0/8', '2001:db8::1/32', '2001:db8::/129', 'fe80::%eth0/64', 'nonsense', '', '10.0.0.0/08']) {
      const r = await rule(a, { ip_policy_id: p.id, cidr, action: 'allow' });
      expect(r.status, cidr).toBe(400);
      expect(r.body, cidr).toMatchObject({ error_code: 'ERR_WARREN_6700', details: { field: 'cidr' } });
    }
    expect((await rule(a, { ip_policy_id: p.id, cidr: '10.0.0.1/8', action: 'allow' })).body.msg).toContain('10.0.0.0/8');
    expect((await rule(a, { ip_policy_id: p.id, action: 'allow' })).body).toMatchObject({ error_code: 'ERR_WARREN_2103', details: { field: 'cidr' } });
    expect((await rule(a, { ip_policy_id: p.id, cidr: 10, action: 'allow' })).body).toMatchObject({ error_code: 'ERR_WARREN_2102', details: { field: 'cidr' } });

    expect((await rule(a, { ip_policy_id: p.id, cidr: '10.0.0.0/8', action: 'block' })).body).toMatchObject({ error_code: 'ERR_WARREN_2104', details: { field: 'action' } });
    expect((await rule(a, { ip_policy_id: p.id, cidr: '10.0.0.0/8', action: 'ALLOW' })).body).toMatchObject({ error_code: 'ERR_WARREN_2104', details: { field: 'action' } });
    expect((await rule(a, { ip_policy_id: p.id, cidr: '10.0.0.0/8' })).body).toMatchObject({ error_code: 'ERR_WARREN_2103', details: { field: 'action' } });

    expect((await rule(a, { cidr: '10.0.0.0/8', action: 'allow' })).body).toMatchObject({ error_code: 'ERR_WARREN_2103', details: { field: 'ip_policy_id' } });
    expect((await rule(a, { ip_policy_id: 'ipp_x', cidr: '10.0.0.0/8', action: 'allow' })).body).toMatchObject({ error_code: 'ERR_WARREN_3000', details: { field: 'ip_policy_id' } });
    expect((await rule(a, { ip_policy_id: newId('ed'), cidr: '10.0.0.0/8', action: 'allow' })).body).toMatchObject({ error_code: 'ERR_WARREN_3001', details: { field: 'ip_policy_id' } });
    const missing = newId('ipp');
    expect((await rule(a, { ip_policy_id: missing, cidr: '10.0.0.0/8', action: 'allow' })).body).toMatchObject({
      error_code: 'ERR_WARREN_3002',
      details: { field: 'ip_policy_id', resource_id: missing },
    });
    const other = await policy(b);
    expect((await rule(a, { ip_policy_id: other.id, cidr: '10.0.0.0/8', action: 'allow' })).body.error_code).toBe('ERR_WARREN_3002');
    expect((await rule(a, { ip_policy_id: p.id, cidr: '10.0.0.0/8', action: 'allow', description: 'x'.repeat(256) })).body.error_code).toBe('ERR_WARREN_5000');
  });

  it('refuses action and ip_policy_id in PATCH, and validates the CIDR', async () => {
    const p = await policy(a);
    const r = (await rule(a, { ip_policy_id: p.id, cidr: '10.0.0.0/8', action: 'allow' })).body;
    const action = await a.call('PATCH', `/ip_policy_rules/${r.id}`, { action: 'deny' });
    expect(action.body).toMatchObject({ error_code: 'ERR_WARREN_2101', details: { field: 'action' } });
    expect(action.body.msg).toBe('unknown field "action"; supported: id, description, metadata, cidr');
    expect((await a.call('PATCH', `/ip_policy_rules/${r.id}`, { ip_policy_id: p.id })).body).toMatchObject({ error_code: 'ERR_WARREN_2101', details: { field: 'ip_policy_id' } });
    expect((await a.call('PATCH', `/ip_policy_rules/${r.id}`, { cidr: '10.0.0.1/8' })).body).toMatchObject({ error_code: 'ERR_WARREN_6700', details: { field: 'cidr' } });
    expect((await a.call('PATCH', `/ip_policy_rules/${r.id}`, { cidr: null })).body).toEqual(r);
  });

  it('keeps CIDRs unique per policy (409), but not across policies', async () => {
    const p = await policy(a);
    const q = await policy(a);
    const r1 = (await rule(a, { ip_policy_id: p.id, cidr: '10.0.0.0/8', action: 'allow' })).body;
    const dup = await rule(a, { ip_policy_id: p.id, cidr: '10.0.0.0/8', action: 'deny' });
    expect(dup.status).toBe(409);
    expect(dup.body).toMatchObject({ error_code: 'ERR_WARREN_4101', details: { field: 'cidr', resource_id: r1.id } });
    const v6 = (await rule(a, { ip_policy_id: p.id, cidr: '2001:db8::/32', action: 'allow' })).body;
    expect((await rule(a, { ip_policy_id: p.id, cidr: '2001:0DB8::/32', action: 'allow' })).status).toBe(409);
    expect((await rule(a, { ip_policy_id: q.id, cidr: '10.0.0.0/8', action: 'allow' })).status).toBe(201);

    const patchDup = await a.call('PATCH', `/ip_policy_rules/${v6.id}`, { cidr: '10.0.0.0/8' });
    expect(patchDup.status).toBe(409);
    expect(patchDup.body.error_code).toBe('ERR_WARREN_4101');
    // Re-sending its own CIDR is no change.
    expect((await a.call('PATCH', `/ip_policy_rules/${r1.id}`, { cidr: '10.0.0.0/8' })).status).toBe(200);
  });

  it('allows at most 1000 rules per policy', async () => {
    const p = await policy(a);
    await api.db.query(
      `INSERT INTO ip_policy_rules (id, account_id, ip_policy_id, cidr, action)
       SELECT 'ipr_' || lpad(i::text, 27, '0'), $1, $2, ('10.' || (i / 256) || '.' || (i % 256) || '.0/24')::cidr, 'allow' FROM generate_series(1, 999) AS i`,
      [a.accountId, p.id],
    );
    expect((await rule(a, { ip_policy_id: p.id, cidr: '192.0.2.0/24', action: 'allow' })).status).toBe(201);
    const over = await rule(a, { ip_policy_id: p.id, cidr: '192.0.3.0/24', action: 'allow' });
    expect(over.status).toBe(400);
    expect(over.body).toMatchObject({ error_code: 'ERR_WARREN_6701', details: { field: 'ip_policy_id' } });
  });

  it('writes outbox rows, and none for a PATCH that changes nothing', async () => {
    const p = await policy(a);
    const r = (await rule(a, { ip_policy_id: p.id, cidr: '10.0.0.0/8', action: 'allow', description: 'd' })).body;
    expect((await a.call('PATCH', `/ip_policy_rules/${r.id}`, { id: r.id, cidr: '10.0.0.0/8', description: 'd' })).body).toEqual(r);
    const u = (await a.call('PATCH', `/ip_policy_rules/${r.id}`, { cidr: '10.0.0.0/9' })).body;
    await a.call('DELETE', `/ip_policy_rules/${r.id}`);
    const { rows } = await api.db.query('SELECT event_type, resource_type, object FROM outbox WHERE resource_id = $1 ORDER BY seq', [r.id]);
    expect(rows).toEqual([
      { event_type: 'ip_policy_rule_created.v0', resource_type: 'ip_policy_rule', object: r },
      { event_type: 'ip_policy_rule_updated.v0', resource_type: 'ip_policy_rule', object: u },
      { event_type: 'ip_policy_rule_deleted.v0', resource_type: 'ip_policy_rule', object: u },
    ]);
  });

  it('isolates accounts', async () => {
    const p = await policy(a);
    const r = (await rule(a, { ip_policy_id: p.id, cidr: '10.0.0.0/8', action: 'allow' })).body;
    await expectHiddenFrom(b, `/ip_policy_rules/${r.id}`);
    expect((await b.call('GET', '/ip_policy_rules')).body.ip_policy_rules).toEqual([]);
  });

  it('paginates across pages', async () => {
    const c = await api.account('rule-pager');
    const p = await policy(c);
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) ids.push((await rule(c, { ip_policy_id: p.id, cidr: `10.${i}.0.0/16`, action: 'allow' })).body.id);
    const { ids: seen, pages } = await walkPages(c, api.baseUrl, '/ip_policy_rules?limit=2', 'ip_policy_rules');
    expect(pages).toBe(3);
    expect(seen).toEqual([...ids].sort().reverse());
  });
});
