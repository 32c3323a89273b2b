import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApi, type Account, type TestApi } from '../../../../test/support/api.js';

let api: TestApi;
let a: Account;
beforeAll(async () => {
  api = await startTestApi();
  a = await api.account();
});
afterAll(() => api.close());

const expectError = (r: { status: number; body: any; headers: Headers }, status: number, code: string) => {
  expect(r.status).toBe(status);
  expect(r.body).toMatchObject({ error_code: code, status_code: status });
  expect(typeof r.body.msg).toBe('string');
  expect(r.body.details.operation_id).toMatch(/^op_/);
  expect(r.headers.get('warren-operation-id')).toBe(r.body.details.operation_id);
  expect(r.headers.get('ngrok-operation-id')).toBe(r.body.details.operation_id);
  expect(r.headers.get('content-type')).toBe('application/json; charset=utf-8');
};

describe('protocol', () => {
  it('requires the version header', async () => {
    expectError(await api.raw('GET', '/reserved_addrs', { headers: { Authorization: `Bearer ${a.token}` } }), 400, 'ERR_WARREN_2000');
    expectError(await a.call('GET', '/reserved_addrs', undefined, { 'Service-Version': '3' }), 400, 'ERR_WARREN_2001');
    const alias = await api.raw('GET', '/reserved_addrs', { headers: { Authorization: `Bearer ${a.token}`, 'Ngrok-Version': ' 2 ' } });
    expect(alias.status).toBe(200);
    expectError(await a.call('GET', '/reserved_addrs', undefined, { 'Ngrok-Version': '1' }), 400, 'ERR_WARREN_2001');
  });

  it('authenticates bearer API keys', async () => {
    const noAuth = await api.raw('GET', '/reserved_addrs', { headers: { 'Service-Version': '2' } });
    expectError(noAuth, 401, 'ERR_WARREN_1000');
    expect(noAuth.headers.get('www-authenticate')).toBe('Bearer');
    expectError(await api.raw('GET', '/reserved_addrs', { headers: { 'Service-Version': '2', Authorization: `Basic abc` } }), 401, 'ERR_WARREN_1001');
    expectError(await api.raw('GET', '/reserved_addrs', { headers: { 'Service-Version': '2', Authorization: `Bearer wrn_api_nope` } }), 401, 'ERR_WARREN_1002');
    expectError(await api.raw('GET', '/reserved_addrs', { headers: { 'Service-Version': '2', Authorization: `Bearer wrn_agt_abc` } }), 401, 'ERR_WARREN_1003');
    const lower = await api.raw('GET', '/reserved_addrs', { headers: { 'Service-Version': '2', Authorization: `bearer ${a.token}` } });
    expect(lower.status).toBe(200);
    // auth is checked before the path
    expectError(await api.raw('GET', '/nowhere', { headers: { 'Service-Version': '2' } }), 401, 'ERR_WARREN_1000');
  });

  it('answers a disabled account with 403', async () => {
    const d = await api.account('disabled');
    await api.db.query('UPDATE accounts SET disabled = true WHERE id = $1', [d.accountId]);
    await new Promise((r) => setTimeout(r, 2100)); // auth cache ttl
    expectError(await d.call('GET', '/reserved_addrs'), 403, 'ERR_WARREN_1101');
  });

  it('answers unknown paths 404 and wrong methods 405 with Allow', async () => {
    expectError(await a.call('GET', '/nowhere'), 404, 'ERR_WARREN_4000');
    const r = await a.call('PUT', '/reserved_addrs', {});
    expectError(r, 405, 'ERR_WARREN_2010');
    expect(r.headers.get('allow')).toBe('POST, GET');
  });

  it('checks content type, size and JSON shape', async () => {
    expectError(await a.call('POST', '/reserved_addrs', '{}', { 'Content-Type': 'text/plain' }), 415, 'ERR_WARREN_2020');
    expectError(await a.call('POST', '/reserved_addrs', 'x'.repeat(1024 * 1024 + 10)), 413, 'ERR_WARREN_2021');
    expectError(await a.call('POST', '/reserved_addrs', '{"a":'), 400, 'ERR_WARREN_2100');
    expectError(await a.call('POST', '/reserved_addrs', '[1]'), 400, 'ERR_WARREN_2100');
    const empty = await api.raw('POST', '/reserved_addrs', { headers: { Authorization: `Bearer ${a.token}`, 'Service-Version': '2' } });
    expect(empty.status).toBe(201);
    const charset = await a.call('POST', '/reserved_addrs', '{}', { 'Content-Type': 'application/json; charset=utf-8' });
    expect(charset.status).toBe(201);
  });

  it('answers odd input with 4xx, never 500', async () => {
    expectError(await a.call('GET', '/reserved_addrs/%E0%A4%A'), 404, 'ERR_WARREN_4000');
    const nul = await a.call('POST', '/reserved_addrs', '{"description":"a\\u0000b"}');
    expectError(nul, 400, 'ERR_WARREN_2104');
    expect(nul.body.details.field).toBe('description');
    expectError(await a.call('POST', '/reserved_addrs', '{"description":"\\ud800"}'), 400, 'ERR_WARREN_2104');
    expectError(await a.call('POST', '/backends/tunnel_group', '{"labels":{"a\\u0000":"b"}}'), 400, 'ERR_WARREN_2104');
    // Named by the full path, not the innermost key (a policy's NUL used to be reported as `value`).
    const nested = await a.call('POST', '/reserved_addrs', '{"description":"ok","x":{"traffic_policy":{"value":"in\\u0000bound"}},"list":["a","\\udc00"]}');
    expectError(nested, 400, 'ERR_WARREN_2104');
    expect(nested.body.details.field).toMatch(/^(x\.traffic_policy\.value|list\[1\])$/);
    expect(nested.body.msg).toMatch(/^(x\.traffic_policy\.value|list\[1\]): strings must not contain NUL characters or unpaired surrogates$/);
    expect((await a.call('POST', '/reserved_addrs', { description: 'emoji 🦫 ok' })).status).toBe(201);
    expectError(await a.call('POST', '/reserved_addrs', '{"__proto__":{"x":1}}'), 400, 'ERR_WARREN_2101');
    expectError(await a.call('POST', '/reserved_addrs', 'null'), 400, 'ERR_WARREN_2100');
    // Bytes that are not UTF-8 are refused, not stored as U+FFFD.
    const latin1 = await a.call('POST', '/reserved_addrs', Buffer.concat([Buffer.from('{"description":"caf'), Buffer.from([0xe9, 0xff]), Buffer.from('"}')]));
    expectError(latin1, 400, 'ERR_WARREN_2100');
    expect(latin1.body.msg).toBe('the request body is not valid UTF-8');
    expect((await a.call('POST', '/reserved_addrs', Buffer.from('\ufeff{"description":"bom ok"}'))).status).toBe(201);
    expectError(await a.call('POST', '/reserved_addrs', '['.repeat(50000) + ']'.repeat(50000)), 400, 'ERR_WARREN_2100');
    const long = await a.call('GET', `/reserved_addrs/${'x'.repeat(5000)}`);
    expectError(long, 404, 'ERR_WARREN_4001');
    expect(long.body.msg.length).toBeLessThan(200);
  });

  it('applies the per-account rate limit with Retry-After', async () => {
    const limited = await startTestApi({ rateLimitPerMinute: 5 });
    try {
      const acct = await limited.account();
      for (let i = 0; i < 5; i++) expect((await acct.call('GET', '/reserved_addrs')).status).toBe(200);
      const r = await acct.call('GET', '/reserved_addrs');
      expectError(r, 429, 'ERR_WARREN_8000');
      expect(Number(r.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
      // another account is not affected
      expect((await (await limited.account()).call('GET', '/reserved_addrs')).status).toBe(200);
    } finally {
      await limited.close();
    }
  });

  it('enforces account quotas per resource type with 403 (1110) before body errors', async () => {
    const limited = await startTestApi({ quotas: { reserved_addrs: 2, api_keys: 2 } });
    try {
      const acct = await limited.account();
      expect((await acct.call('POST', '/reserved_addrs', {})).status).toBe(201);
      expect((await acct.call('POST', '/reserved_addrs', {})).status).toBe(201);
      expectError(await acct.call('POST', '/reserved_addrs', {}), 403, 'ERR_WARREN_1110');
      expectError(await acct.call('POST', '/reserved_addrs', { bad: 1 }), 403, 'ERR_WARREN_1110');
      expect((await acct.call('POST', '/backends/tunnel_group', { labels: { a: 'b' } })).status).toBe(201); // no quota on this type
      expect((await acct.call('POST', '/api_keys', {})).status).toBe(201); // the bootstrap key counts: 2 of 2
      expectError(await acct.call('POST', '/api_keys', {}), 403, 'ERR_WARREN_1110');
      // another account has its own count
      expect((await (await limited.account()).call('POST', '/reserved_addrs', {})).status).toBe(201);
    } finally {
      await limited.close();
    }
  });

  it('counts routes across an account\'s edges (https_edge_routes), before body errors', async () => {
    const limited = await startTestApi({ quotas: { https_edge_routes: 2 } });
    try {
      const acct = await limited.account();
      const e1 = (await acct.call('POST', '/edges/https', {})).body.id as string;
      const e2 = (await acct.call('POST', '/edges/https', {})).body.id as string;
      expect((await acct.call('POST', `/edges/https/${e1}/routes`, { match_type: 'path_prefix', match: '/a' })).status).toBe(201);
      expect((await acct.call('POST', `/edges/https/${e2}/routes`, { match_type: 'path_prefix', match: '/a' })).status).toBe(201);
      expectError(await acct.call('POST', `/edges/https/${e2}/routes`, { match_type: 'path_prefix', match: '/b' }), 403, 'ERR_WARREN_1110');
      expectError(await acct.call('POST', `/edges/https/${e2}/routes`, { bad: 1 }), 403, 'ERR_WARREN_1110');
    } finally {
      await limited.close();
    }
  });

  it('serves health, readiness and metrics without auth', async () => {
    expect((await api.raw('GET', '/healthz')).status).toBe(200);
    expect((await api.raw('GET', '/readyz')).status).toBe(200);
    const m = await api.raw('GET', '/metrics');
    expect(m.status).toBe(200);
    expect(m.body).toContain('warren_control_plane_http_requests_total{route="/reserved_addrs",method="GET",status="200"}');
    expect(m.body).toContain('warren_control_plane_http_request_duration_seconds_bucket');
    expect(m.body).toContain('warren_control_plane_pg_pool_total_connections');
  });
});
