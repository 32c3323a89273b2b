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

const ROLE = 'arn:aws:iam::123456789012:role/warren-events';
const FIREHOSE = 'arn:aws:firehose:us-east-1:123456789012:deliverystream/warren';
const KINESIS = 'arn:aws:kinesis:eu-west-1:123456789012:stream/warren';
const LOGS = 'arn:aws:logs:ap-southeast-2:123456789012:log-group:/warren/events:*';
const nulls = { firehose: null, kinesis: null, cloudwatch_logs: null, datadog: null, azure_logs_ingestion: null };
const creds = (secret?: string) => ({ aws_access_key_id: 'AKIAEXAMPLE', ...(secret === undefined ? {} : { aws_secret_access_key: secret }) });
const azure = (over: Record<string, unknown> = {}) => ({
  tenant_id: '00000000-0000-0000-0000-000000000001',
  client_id: '00000000-0000-0000-0000-000000000002',
  client_secret: 'azure-secret',
  logs_ingestion_uri: 'https://warren-abcd.eastus-1.ingest.monitor.azure.com',
  data_collection_rule_id: 'dcr-00000000000000000000000000000000',
  data_collection_stream_name: 'Custom-Warren_CL',
  ...over,
});

const create = (acct: Account, body: Record<string, unknown>) => acct.call('POST', '/event_destinations', body);
const storedTarget = async (id: string) => (await api.db.query('SELECT target_kind, target FROM event_destinations WHERE id = $1', [id])).rows[0];

describe('event destinations', () => {
  it('creates, gets, updates, lists and deletes', async () => {
    const created = await create(a, { description: 'audit', metadata: 'm', format: 'JSON', target: { firehose: { auth: { role: { role_arn: ROLE } }, delivery_stream_arn: FIREHOSE } } });
    expect(created.status).toBe(201);
    const d = created.body;
    expect(d.id).toMatch(/^ed_[0-9A-Za-z]{27}$/);
    expect(d).toEqual({
      id: d.id,
      uri: `${api.baseUrl}/event_destinations/${d.id}`,
      created_at: d.created_at,
      description: 'audit',
      metadata: 'm',
      format: 'json',
      target: { ...nulls, firehose: { auth: { role: { role_arn: ROLE }, creds: null }, delivery_stream_arn: FIREHOSE } },
    });
    expect(d.created_at).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    expect((await a.call('GET', `/event_destinations/${d.id}`)).body).toEqual(d);

    const patched = await a.call('PATCH', `/event_destinations/${d.id}`, { id: d.id, description: '', format: 'Json' });
    expect(patched.status).toBe(200);
    const { description: _d, ...rest } = d;
    expect(patched.body).toEqual(rest);

    const list = await a.call('GET', '/event_destinations');
    expect(list.body).toMatchObject({ uri: `${api.baseUrl}/event_destinations`, next_page_uri: null });
    expect(list.body.event_destinations.map((x: { id: string }) => x.id)).toContain(d.id);

    expect((await a.call('DELETE', `/event_destinations/${d.id}`)).status).toBe(204);
    expect((await a.call('GET', `/event_destinations/${d.id}`)).status).toBe(404);
  });

  it('supports every target kind, with format optional and secrets hidden', async () => {
    const k = await create(a, { target: { kinesis: { auth: { creds: creds('s3cr3t') }, stream_arn: KINESIS } } });
    expect(k.status).toBe(201);
    expect(k.body.format).toBe('json');
    expect(k.body.target).toEqual({ ...nulls, kinesis: { auth: { role: null, creds: { aws_access_key_id: 'AKIAEXAMPLE', aws_secret_access_key: '' } }, stream_arn: KINESIS } });
    expect((await storedTarget(k.body.id)).target.auth.creds.aws_secret_access_key).toBe('s3cr3t');

    const c = await create(a, { target: { cloudwatch_logs: { auth: { role: { role_arn: 'arn:aws-us-gov:iam::123456789012:role/path/to/role' }, creds: null }, log_group_arn: LOGS } } });
    expect(c.status).toBe(201);
    expect(c.body.target.cloudwatch_logs.log_group_arn).toBe(LOGS);

    const dd = await create(a, { target: { datadog: { api_key: 'dd-key', ddtags: 'env:prod', service: 'warren' }, firehose: null } });
    expect(dd.status).toBe(201);
    expect(dd.body.target).toEqual({ ...nulls, datadog: { api_key: '', ddtags: 'env:prod', service: 'warren', ddsite: 'datadoghq.com' } });
    expect((await storedTarget(dd.body.id)).target.api_key).toBe('dd-key');
    const eu = await create(a, { target: { datadog: { api_key: 'k', ddsite: 'DatadogHQ.eu' } } });
    expect(eu.body.target.datadog).toEqual({ api_key: '', ddtags: '', service: '', ddsite: 'datadoghq.eu' });
    for (const site of ['us3.datadoghq.com', 'us5.datadoghq.com', 'ap1.datadoghq.com', 'ap2.datadoghq.com', 'ddog-gov.com', ''])
      expect((await create(a, { target: { datadog: { api_key: 'k', ddsite: site } } })).status, site).toBe(201);

    const az = await create(a, { target: { azure_logs_ingestion: azure() } });
    expect(az.status).toBe(201);
    expect(az.body.target).toEqual({ ...nulls, azure_logs_ingestion: { ...azure(), client_secret: '' } });
    expect((await storedTarget(az.body.id)).target.client_secret).toBe('azure-secret');

    // Secrets never appear in the outbox either.
    const { rows } = await api.db.query('SELECT object::text AS o FROM outbox WHERE resource_id = ANY($1)', [[k.body.id, dd.body.id, az.body.id]]);
    expect(rows).toHaveLength(3);
    for (const r of rows) expect(r.o).not.toMatch(/s3cr3t|dd-key|azure-secret/);
  });

  it('keeps secrets across a PATCH of the same kind when omitted or "", replaces them when given', async () => {
    const d = (await create(a, { target: { firehose: { auth: { creds: creds('first') }, delivery_stream_arn: FIREHOSE } } })).body;
    const other = 'arn:aws:firehose:us-west-2:123456789012:deliverystream/other';
    const p1 = await a.call('PATCH', `/event_destinations/${d.id}`, { target: { firehose: { auth: { creds: creds() }, delivery_stream_arn: other } } });
    expect(p1.status).toBe(200);
    expect(p1.body.target.firehose).toEqual({ auth: { role: null, creds: { aws_access_key_id: 'AKIAEXAMPLE', aws_secret_access_key: '' } }, delivery_stream_arn: other });
    expect((await storedTarget(d.id)).target.auth.creds.aws_secret_access_key).toBe('first');

    // GET → PATCH round trip (secrets "") keeps the secret and is no change.
    const got = (await a.call('GET', `/event_destinations/${d.id}`)).body;
    const before = (await api.db.query('SELECT count(*)::int AS n FROM outbox WHERE resource_id = $1', [d.id])).rows[0].n;
    expect((await a.call('PATCH', `/event_destinations/${d.id}`, { id: d.id, target: got.target, format: got.format })).body).toEqual(got);
    expect((await api.db.query('SELECT count(*)::int AS n FROM outbox WHERE resource_id = $1', [d.id])).rows[0].n).toBe(before);
    expect((await storedTarget(d.id)).target.auth.creds.aws_secret_access_key).toBe('first');

    await a.call('PATCH', `/event_destinations/${d.id}`, { target: { firehose: { auth: { creds: creds('second') }, delivery_stream_arn: other } } });
    expect((await storedTarget(d.id)).target.auth.creds.aws_secret_access_key).toBe('second');

    // Switching the auth to a role drops the credentials; switching back needs a secret again.
    await a.call('PATCH', `/event_destinations/${d.id}`, { target: { firehose: { auth: { role: { role_arn: ROLE } }, delivery_stream_arn: other } } });
    expect((await storedTarget(d.id)).target.auth).toEqual({ role: { role_arn: ROLE }, creds: null });
    const noSecret = await a.call('PATCH', `/event_destinations/${d.id}`, { target: { firehose: { auth: { creds: creds('') }, delivery_stream_arn: other } } });
    expect(noSecret.body).toMatchObject({ error_code: 'ERR_WARREN_2103', details: { field: 'target.firehose.auth.creds.aws_secret_access_key' } });

    const dd = (await create(a, { target: { datadog: { api_key: 'dd-1', service: 's' } } })).body;
    const ddp = await a.call('PATCH', `/event_destinations/${dd.id}`, { target: { datadog: { api_key: '', ddtags: 't' } } });
    expect(ddp.body.target.datadog).toEqual({ api_key: '', ddtags: 't', service: '', ddsite: 'datadoghq.com' });
    expect((await storedTarget(dd.id)).target.api_key).toBe('dd-1');

    const az = (await create(a, { target: { azure_logs_ingestion: azure() } })).body;
    const { client_secret: _s, ...noAzureSecret } = azure();
    expect((await a.call('PATCH', `/event_destinations/${az.id}`, { target: { azure_logs_ingestion: { ...noAzureSecret, data_collection_stream_name: 'Custom-Other_CL' } } })).status).toBe(200);
    expect((await storedTarget(az.id)).target).toMatchObject({ client_secret: 'azure-secret', data_collection_stream_name: 'Custom-Other_CL' });
  });

  it('refuses to change the target kind (4200)', async () => {
    const d = (await create(a, { target: { datadog: { api_key: 'k' } } })).body;
    const r = await a.call('PATCH', `/event_destinations/${d.id}`, { target: { kinesis: { auth: { role: { role_arn: ROLE } }, stream_arn: KINESIS } } });
    expect(r.status).toBe(400);
    expect(r.body).toMatchObject({ error_code: 'ERR_WARREN_4200', details: { field: 'target' } });
    expect((await a.call('GET', `/event_destinations/${d.id}`)).body).toEqual(d);
  });

  it('requires exactly one target and exactly one AWS auth', async () => {
    const role = { auth: { role: { role_arn: ROLE } }, stream_arn: KINESIS };
    const cases: [Record<string, unknown>, string, string][] = [
      [{}, 'ERR_WARREN_2103', 'target'],
      [{ target: null }, 'ERR_WARREN_2102', 'target'],
      [{ target: {} }, 'ERR_WARREN_2105', 'target'],
      [{ target: { firehose: null, kinesis: null } }, 'ERR_WARREN_2105', 'target'],
      [{ target: { kinesis: role, datadog: { api_key: 'k' } } }, 'ERR_WARREN_2105', 'target'],
      [{ target: { s3: {} } }, 'ERR_WARREN_2101', 'target.s3'],
      [{ target: { kinesis: { stream_arn: KINESIS } } }, 'ERR_WARREN_2103', 'target.kinesis.auth'],
      [{ target: { kinesis: { auth: {}, stream_arn: KINESIS } } }, 'ERR_WARREN_2105', 'target.kinesis.auth'],
      [{ target: { kinesis: { auth: { role: { role_arn: ROLE }, creds: creds('x') }, stream_arn: KINESIS } } }, 'ERR_WARREN_2105', 'target.kinesis.auth'],
      [{ target: { kinesis: { auth: { creds: creds() }, stream_arn: KINESIS } } }, 'ERR_WARREN_2103', 'target.kinesis.auth.creds.aws_secret_access_key'],
      [{ target: { kinesis: { auth: { creds: { aws_access_key_id: '', aws_secret_access_key: 'x' } }, stream_arn: KINESIS } } }, 'ERR_WARREN_2103', 'target.kinesis.auth.creds.aws_access_key_id'],
      [{ target: { kinesis: { auth: { role: {} }, stream_arn: KINESIS } } }, 'ERR_WARREN_2103', 'target.kinesis.auth.role.role_arn'],
      [{ target: { kinesis: { auth: { role: { role_arn: ROLE, x: 1 } }, stream_arn: KINESIS } } }, 'ERR_WARREN_2101', 'target.kinesis.auth.role.x'],
      [{ target: { kinesis: { auth: { role: { role_arn: ROLE } } } } }, 'ERR_WARREN_2103', 'target.kinesis.stream_arn'],
      [{ target: { datadog: { ddtags: 'x' } } }, 'ERR_WARREN_2103', 'target.datadog.api_key'],
      [{ target: { datadog: { api_key: 'k', ddsite: 'example.com' } } }, 'ERR_WARREN_2104', 'target.datadog.ddsite'],
      [{ format: 'xml', target: { datadog: { api_key: 'k' } } }, 'ERR_WARREN_2104', 'format'],
      [{ description: 'x'.repeat(256), target: { datadog: { api_key: 'k' } } }, 'ERR_WARREN_5000', 'description'],
      [{ metadata: 'x'.repeat(4097), target: { datadog: { api_key: 'k' } } }, 'ERR_WARREN_5001', 'metadata'],
    ];
    for (const [body, code, field] of cases) {
      const r = await create(a, body);
      expect(r.status, JSON.stringify(body)).toBe(400);
      expect(r.body, JSON.stringify(body)).toMatchObject({ error_code: code, details: { field } });
    }
    expect((await create(a, { verify_with_test_event: true, target: { datadog: { api_key: 'k' } } })).body.error_code).toBe('ERR_WARREN_2101');
  });

  it('validates ARNs with the target service and a region', async () => {
    const bad: [Record<string, unknown>, string][] = [
      [{ firehose: { auth: { role: { role_arn: ROLE } }, delivery_stream_arn: KINESIS } }, 'target.firehose.delivery_stream_arn'],
      [{ firehose: { auth: { role: { role_arn: ROLE } }, delivery_stream_arn: 'arn:aws:firehose::123456789012:deliverystream/x' } }, 'target.firehose.delivery_stream_arn'],
      [{ firehose: { auth: { role: { role_arn: ROLE } }, delivery_stream_arn: 'arn:aws:firehose:us-east-1:123456789012:stream/x' } }, 'target.firehose.delivery_stream_arn'],
      [{ firehose: { auth: { role: { role_arn: ROLE } }, delivery_stream_arn: 'not-an-arn' } }, 'target.firehose.delivery_stream_arn'],
      [{ kinesis: { auth: { role: { role_arn: ROLE } }, stream_arn: FIREHOSE } }, 'target.kinesis.stream_arn'],
      [{ kinesis: { auth: { role: { role_arn: ROLE } }, stream_arn: 'arn:aws:kinesis:us-east-1:1234:stream/x' } }, 'target.kinesis.stream_arn'],
      [{ kinesis: { auth: { role: { role_arn: ROLE } }, stream_arn: 'arn:azure:kinesis:us-east-1:123456789012:stream/x' } }, 'target.kinesis.stream_arn'],
      [{ cloudwatch_logs: { auth: { role: { role_arn: ROLE } }, log_group_arn: 'arn:aws:logs:us-east-1:123456789012:stream/x' } }, 'target.cloudwatch_logs.log_group_arn'],
      [{ cloudwatch_logs: { auth: { role: { role_arn: ROLE } }, log_group_arn: 'arn:aws:logs:nowhere:123456789012:log-group:x' } }, 'target.cloudwatch_logs.log_group_arn'],
      [{ kinesis: { auth: { role: { role_arn: 'arn:aws:iam:us-east-1:123456789012:role/x' } }, stream_arn: KINESIS } }, 'target.kinesis.auth.role.role_arn'],
      [{ kinesis: { auth: { role: { role_arn: 'arn:aws:iam::123456789012:user/x' } }, stream_arn: KINESIS } }, 'target.kinesis.auth.role.role_arn'],
      [{ kinesis: { auth: { role: { role_arn: 'arn:aws:sts::123456789012:role/x' } }, stream_arn: KINESIS } }, 'target.kinesis.auth.role.role_arn'],
    ];
    for (const [target, field] of bad) {
      const r = await create(a, { target });
      expect(r.status, JSON.stringify(target)).toBe(400);
      expect(r.body, JSON.stringify(target)).toMatchObject({ error_code: 'ERR_WARREN_6501', details: { field } });
    }
    const cn = await create(a, { target: { kinesis: { auth: { role: { role_arn: 'arn:aws-cn:iam::123456789012:role/r' } }, stream_arn: 'arn:aws-cn:kinesis:cn-north-1:123456789012:stream/s' } } });
    expect(cn.status).toBe(201);
  });

  it('requires every Azure field and an https ingestion URI', async () => {
    for (const f of ['tenant_id', 'client_id', 'client_secret', 'logs_ingestion_uri', 'data_collection_rule_id', 'data_collection_stream_name']) {
      const { [f]: _omit, ...rest } = azure() as Record<string, unknown>;
      const r = await create(a, { target: { azure_logs_ingestion: rest } });
      expect(r.body, f).toMatchObject({ error_code: 'ERR_WARREN_2103', details: { field: `target.azure_logs_ingestion.${f}` } });
      const empty = await create(a, { target: { azure_logs_ingestion: azure({ [f]: '' }) } });
      expect(empty.body, f).toMatchObject({ error_code: 'ERR_WARREN_2103', details: { field: `target.azure_logs_ingestion.${f}` } });
    }
    for (const uri of ['http://x.ingest.monitor.azure.com', 'not a url', 'ftp://x'])
      expect((await create(a, { target: { azure_logs_ingestion: azure({ logs_ingestion_uri: uri }) } })).body, uri).toMatchObject({
        error_code: 'ERR_WARREN_6500',
        details: { field: 'target.azure_logs_ingestion.logs_ingestion_uri' },
      });
  });

  it('answers 409 when deleting a destination an event subscription uses', async () => {
    const d = (await create(a, { target: { datadog: { api_key: 'k' } } })).body;
    const sub = await a.call('POST', '/event_subscriptions', { sources: [{ type: 'ip_policy_created.v0' }], destination_ids: [d.id] });
    expect(sub.status).toBe(201);
    const r = await a.call('DELETE', `/event_destinations/${d.id}`);
    expect(r.status).toBe(409);
    expect(r.body.error_code).toBe('ERR_WARREN_4100');
    expect(r.body.msg).toContain(sub.body.id);
    expect((await a.call('PATCH', `/event_subscriptions/${sub.body.id}`, { destination_ids: [] })).status).toBe(200);
    expect((await a.call('DELETE', `/event_destinations/${d.id}`)).status).toBe(204);
  });

  it('never lets a subscription keep a deleted destination: DELETE racing a subscription POST/PATCH is 204+400 or 409+2xx', async () => {
    const s = (await a.call('POST', '/event_subscriptions', {})).body;
    for (let i = 0; i < 8; i++) {
      const d = (await create(a, { target: { datadog: { api_key: 'k' } } })).body;
      const use =
        i % 2 === 0
          ? a.call('POST', '/event_subscriptions', { sources: [{ type: 'ip_policy_created.v0' }], destination_ids: [d.id] })
          : a.call('PATCH', `/event_subscriptions/${s.id}`, { destination_ids: [d.id] });
      const [del, sub] = await Promise.all([a.call('DELETE', `/event_destinations/${d.id}`), use]);
      if (del.status === 204) {
        expect(sub.status).toBe(400);
        expect(sub.body).toMatchObject({ error_code: 'ERR_WARREN_3002', status_code: 400, details: { field: 'destination_ids[0]', resource_id: d.id } });
      } else {
        expect(del.status).toBe(409);
        expect(del.body).toMatchObject({ error_code: 'ERR_WARREN_4100', status_code: 409, details: { resource_id: d.id } });
        expect(del.body.details.operation_id).toMatch(/^op_/);
        expect([200, 201]).toContain(sub.status);
        // Free it again for the next round.
        if (sub.status === 201) expect((await a.call('DELETE', `/event_subscriptions/${sub.body.id}`)).status).toBe(204);
        else expect((await a.call('PATCH', `/event_subscriptions/${s.id}`, { destination_ids: [] })).status).toBe(200);
        expect((await a.call('DELETE', `/event_destinations/${d.id}`)).status).toBe(204);
      }
    }
    const { rows } = await api.db.query('SELECT count(*)::int AS n FROM event_subscription_destinations sd LEFT JOIN event_destinations d ON d.id = sd.destination_id WHERE d.id IS NULL');
    expect(rows[0].n).toBe(0);
  });

  it('writes outbox rows, and none for a PATCH that changes nothing', async () => {
    const d = (await create(a, { description: 'x', target: { datadog: { api_key: 'k' } } })).body;
    await a.call('PATCH', `/event_destinations/${d.id}`, { id: d.id });
    await a.call('PATCH', `/event_destinations/${d.id}`, { description: 'x', format: 'json', target: { datadog: { api_key: '', ddsite: 'datadoghq.com' } } });
    const u = (await a.call('PATCH', `/event_destinations/${d.id}`, { metadata: 'm' })).body;
    await a.call('DELETE', `/event_destinations/${d.id}`);
    const { rows } = await api.db.query('SELECT event_type, resource_type, object FROM outbox WHERE resource_id = $1 ORDER BY seq', [d.id]);
    expect(rows).toEqual([
      { event_type: 'event_destination_created.v0', resource_type: 'event_destination', object: d },
      { event_type: 'event_destination_updated.v0', resource_type: 'event_destination', object: u },
      { event_type: 'event_destination_deleted.v0', resource_type: 'event_destination', object: u },
    ]);
  });

  it('isolates accounts', async () => {
    const d = (await create(a, { target: { datadog: { api_key: 'k' } } })).body;
    await expectHiddenFrom(b, `/event_destinations/${d.id}`);
    expect((await b.call('GET', '/event_destinations')).body.event_destinations).toEqual([]);
  });

  it('paginates across pages', async () => {
    const c = await api.account('pager');
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) ids.push((await create(c, { target: { datadog: { api_key: 'k' } } })).body.id);
    const { ids: seen, pages } = await walkPages(c, api.baseUrl, '/event_destinations?limit=2', 'event_destinations');
    expect(pages).toBe(3);
    expect(seen).toEqual([...ids].sort().reverse());
  });
});
