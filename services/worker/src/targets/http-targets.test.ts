import tls from 'node:tls';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { startAzureFake, type AzureFake } from '../../../../test/support/fakes/azure.js';
import { startDatadogFake, type DatadogFake } from '../../../../test/support/fakes/datadog.js';
import { datadogIntakeUrl } from './datadog.js';
import { createAgents, httpRequest } from './http.js';
import { createTarget } from './index.js';
import { dest, record, records } from './test-helpers.js';
import type { Target, TargetEnv } from './types.js';

const API_KEY = 'dd0123456789abcdef0123456789abcd';
const TENANT = '72f988bf-86f1-41af-91ab-2d7cd011db47';
const CLIENT = '0b1c2d3e-aaaa-bbbb-cccc-1234567890ab';
const CLIENT_SECRET = 'azSecret~0123456789.abcdefghijklmnopqrstu';
const DCR = 'dcr-0123456789abcdef0123456789abcdef';
const STREAM = 'Custom-WarrenEvents';

const open: Target[] = [];
function target(...args: Parameters<typeof createTarget>): Target {
  const t = createTarget(...args);
  open.push(t);
  return t;
}
afterEach(() => {
  for (const t of open.splice(0)) t.close();
});

/**
 * Sends until one send is done: for a target with a short timeout, the connection (and Azure's
 * token) made beforehand, so that the timeout a test then provokes is the answer's. A loaded
 * machine may not give a first send (a connection, a TLS handshake) those few hundred ms; each
 * try that timed out is a retry, and the next one gets further.
 */
async function warmUp(t: Target): Promise<void> {
  for (const until = Date.now() + 20_000; ; ) {
    const o = await t.send(records(1));
    if (o.kind === 'done') return;
    expect(o).toMatchObject({ kind: 'retry' });
    if (Date.now() > until) throw new Error(`no send done within 20 s: ${JSON.stringify(o)}`);
  }
}

describe('datadog', () => {
  let fake: DatadogFake;
  let env: TargetEnv;
  const dd = (over: Record<string, unknown> = {}) => dest('datadog', { api_key: API_KEY, ddtags: 'env:test,team:edge', service: '', ddsite: 'datadoghq.eu', ...over });
  beforeAll(async () => {
    fake = await startDatadogFake({ apiKeys: [API_KEY] });
    // Long enough that no send times out unless the test means it to (those set their own):
    // a loaded machine can take seconds for a first connection.
    env = { datadogBaseUrl: fake.url, requestTimeoutMs: 20_000, hostname: 'warren-worker-1' };
  });
  afterEach(() => fake.reset());
  afterAll(async () => {
    await fake?.close();
  });

  it('posts a gzip JSON array of entries; service defaults to warren', async () => {
    const t = target(dd(), env);
    const rs = records(3);
    expect(await t.send(rs)).toEqual({ kind: 'done', retry: [], dead: [] });
    expect(fake.entries).toEqual(rs.map((r) => ({ message: r.body, ddsource: 'warren', ddtags: 'env:test,team:edge', service: 'warren', hostname: 'warren-worker-1' })));
    expect(fake.requests).toMatchObject([{ status: 202, gzip: true, entries: 3 }]);
    // recordBytes is the serialized entry plus a comma: the payload is their sum + 1 ("[" "]" minus one comma)
    expect(fake.requests[0]!.bytes).toBe(rs.reduce((n, r) => n + t.recordBytes(r), 0) + 1);
  });

  it('400: a batch is rejected, a single record is dead', async () => {
    const t = target(dd({ service: 'edge' }), env);
    fake.fail({ kind: 'status', status: 400 }, 2);
    expect(await t.send(records(2))).toMatchObject({ kind: 'rejected', reason: expect.stringContaining('400') });
    expect(await t.send(records(1))).toMatchObject({ kind: 'done', retry: [], dead: [{ index: 0 }] });
  });

  it('a wrong API key (403) or 401 pauses, without the key in the reason', async () => {
    const t = target(dd({ api_key: 'wrong-key-0000000000000000' }), env);
    const o = await t.send(records(1));
    expect(o).toMatchObject({ kind: 'auth', reason: expect.stringContaining('403') });
    expect(JSON.stringify(o)).not.toContain('wrong-key-0000000000000000');
    fake.fail({ kind: 'status', status: 401 });
    expect(await target(dd(), env).send(records(1))).toMatchObject({ kind: 'auth' });
    expect(fake.entries).toHaveLength(0);
  });

  it('413 → too_large; 429 → throttled with x-ratelimit-reset; 408 and 5xx → retry', async () => {
    const t = target(dd(), env);
    fake.fail({ kind: 'status', status: 413 });
    expect(await t.send(records(2))).toMatchObject({ kind: 'too_large' });
    fake.fail({ kind: 'status', status: 429, rateLimitResetSeconds: 12 });
    expect(await t.send(records(2))).toMatchObject({ kind: 'throttled', retryAfterMs: 12_000 });
    fake.fail({ kind: 'status', status: 408 });
    expect(await t.send(records(2))).toMatchObject({ kind: 'retry', unknownOutcome: false });
    fake.fail({ kind: 'status', status: 503 });
    expect(await t.send(records(2))).toMatchObject({ kind: 'retry', unknownOutcome: false });
    expect(await t.send(records(2))).toMatchObject({ kind: 'done' });
  });

  it('no answer: slow beyond the timeout or reset after accepting → unknown outcome; refused → known', async () => {
    const t = target(dd(), { ...env, requestTimeoutMs: 300 });
    // On a kept-alive connection the request is written at once: the 300 ms are all the answer's
    // (a connection still being made when they ran out would rightly be a known outcome).
    await warmUp(t);
    fake.fail({ kind: 'slow', ms: 1500 });
    expect(await t.send(records(1))).toMatchObject({ kind: 'retry', unknownOutcome: true, reason: expect.stringContaining('300 ms') });
    fake.fail({ kind: 'accept-then-reset' });
    // The timed-out connection is gone: this send makes a new one, so with the file's long timeout.
    expect(await target(dd(), env).send(records(1))).toMatchObject({ kind: 'retry', unknownOutcome: true });
    const refused = target(dd(), { ...env, datadogBaseUrl: 'http://127.0.0.1:1' });
    expect(await refused.send(records(1))).toMatchObject({ kind: 'retry', unknownOutcome: false, reason: expect.stringContaining('ECONNREFUSED') });
  });

  it('limits: > 1,000 entries or > 4.25 MB is too_large without a call; an entry over 1 MB is dead, the rest sent', async () => {
    const t = target(dd(), env);
    expect(await t.send(records(1001))).toMatchObject({ kind: 'too_large' });
    expect(await t.send(Array.from({ length: 5 }, () => record(Date.now(), 900_000)))).toMatchObject({ kind: 'too_large' });
    expect(fake.requests).toHaveLength(0);
    const rs = [record(), record(Date.now(), 1_000_000), record()];
    expect(await t.send(rs)).toMatchObject({ kind: 'done', retry: [], dead: [{ index: 1, reason: expect.stringContaining('too large') }] });
    expect(fake.entries.map((e) => e.message)).toEqual([rs[0]!.body, rs[2]!.body]);
  });

  it('the intake URL follows ddsite unless overridden', () => {
    expect(datadogIntakeUrl('datadoghq.eu').href).toBe('https://http-intake.logs.datadoghq.eu/api/v2/logs');
    expect(datadogIntakeUrl('').href).toBe('https://http-intake.logs.datadoghq.com/api/v2/logs');
    expect(datadogIntakeUrl('US5.datadoghq.com').href).toBe('https://http-intake.logs.us5.datadoghq.com/api/v2/logs');
    expect(datadogIntakeUrl('datadoghq.eu', 'http://127.0.0.1:9/').href).toBe('http://127.0.0.1:9/api/v2/logs');
  });

  it('an aborted signal is a retry', async () => {
    const t = target(dd(), env);
    // Never answered within the test: only the abort ends the send.
    fake.fail({ kind: 'slow', ms: 60_000 });
    const ac = new AbortController();
    const before = fake.requests.length;
    const sending = t.send(records(1), ac.signal);
    // Aborted once the request has reached the intake (a fixed delay could fire before it is sent
    // on a loaded box, and an abort before sending is rightly a known outcome).
    for (const until = Date.now() + 20_000; fake.requests.length === before && Date.now() < until; ) await new Promise((r) => setTimeout(r, 10));
    expect(fake.requests.length).toBeGreaterThan(before);
    ac.abort();
    expect(await sending).toMatchObject({ kind: 'retry', unknownOutcome: true, reason: expect.stringContaining('aborted') });
  });
});

describe('azure logs ingestion', () => {
  let fake: AzureFake;
  let env: TargetEnv;
  const az = (over: Record<string, unknown> = {}) =>
    dest('azure_logs_ingestion', {
      tenant_id: TENANT,
      client_id: CLIENT,
      client_secret: CLIENT_SECRET,
      logs_ingestion_uri: fake.url,
      data_collection_rule_id: DCR,
      data_collection_stream_name: STREAM,
      ...over,
    });
  beforeAll(async () => {
    fake = await startAzureFake({ tenantId: TENANT, clientId: CLIENT, clientSecret: CLIENT_SECRET });
    // As for datadog: only the tests of timeouts set a short one.
    env = { azureAuthorityHost: fake.url, caPem: fake.caPem, requestTimeoutMs: 20_000 };
  });
  afterEach(() => fake.reset());
  afterAll(async () => {
    await fake?.close();
  });

  it('gets a token once, then uploads rows TimeGenerated/EventId/EventType/AccountId/Event/Truncated', async () => {
    const t = target(az(), env);
    const rs = records(3, Date.UTC(2026, 0, 2, 3, 4, 5));
    expect(await t.send(rs)).toEqual({ kind: 'done', retry: [], dead: [] });
    expect(await t.send(records(2))).toEqual({ kind: 'done', retry: [], dead: [] });
    expect(fake.tokenCalls).toEqual([{ tenant: TENANT, clientId: CLIENT, scope: 'https://monitor.azure.com/.default', ok: true }]);
    const rows = fake.rows.get(`${DCR}/${STREAM}`)!;
    expect(rows).toHaveLength(5);
    expect(rows[0]).toEqual({
      TimeGenerated: '2026-01-02T03:04:05.000Z',
      EventId: rs[0]!.eventId,
      EventType: 'ip_policy_created.v0',
      AccountId: 'ac_2abcTEST',
      Event: JSON.parse(rs[0]!.body),
      Truncated: false,
    });
    expect(fake.requests.filter((r) => r.kind === 'ingest')).toMatchObject([{ status: 204, rows: 3 }, { status: 204, rows: 2 }]);
  });

  it('a token refused at upload (401) is dropped and the destination pauses; the next send gets a new one', async () => {
    const t = target(az(), env);
    expect(await t.send(records(1))).toMatchObject({ kind: 'done' });
    fake.expireTokens();
    expect(await t.send(records(1))).toMatchObject({ kind: 'auth', reason: expect.stringContaining('401') });
    expect(await t.send(records(1))).toMatchObject({ kind: 'done' });
    expect(fake.tokenCalls).toHaveLength(2);
  });

  it('refreshes a token within 5 minutes of its expiry', async () => {
    const f2 = await startAzureFake({ tenantId: TENANT, clientId: CLIENT, clientSecret: CLIENT_SECRET, tokenSeconds: 200 });
    try {
      const t = target(az({ logs_ingestion_uri: f2.url }), { ...env, azureAuthorityHost: f2.url, caPem: f2.caPem });
      expect(await t.send(records(1))).toMatchObject({ kind: 'done' });
      expect(await t.send(records(1))).toMatchObject({ kind: 'done' });
      expect(f2.tokenCalls).toHaveLength(2);
    } finally {
      await f2.close();
    }
  });

  it('a wrong client secret pauses (invalid_client) without uploading or leaking the secret', async () => {
    const t = target(az({ client_secret: 'not-the-right-secret-000' }), env);
    const o = await t.send(records(1));
    expect(o).toMatchObject({ kind: 'auth', reason: expect.stringContaining('invalid_client') });
    expect(JSON.stringify(o)).not.toContain('not-the-right-secret-000');
    expect(fake.requests.filter((r) => r.kind === 'ingest')).toHaveLength(0);
    const u = target(az({ tenant_id: 'other-tenant' }), env);
    expect(await u.send(records(1))).toMatchObject({ kind: 'auth', reason: expect.stringContaining('invalid_tenant') });
  });

  it('token endpoint 5xx or unreachable → retry with nothing sent', async () => {
    const t = target(az(), env);
    fake.fail('token', { kind: 'status', status: 503 });
    expect(await t.send(records(1))).toMatchObject({ kind: 'retry', unknownOutcome: false });
    const u = target(az(), { ...env, azureAuthorityHost: 'https://127.0.0.1:1' });
    expect(await u.send(records(1))).toMatchObject({ kind: 'retry', unknownOutcome: false });
  });

  it('upload answers: 403 → auth, 413 → too_large, 429 → throttled with Retry-After, 400 → rejected, 500 → retry', async () => {
    const t = target(az(), env);
    fake.fail('ingest', { kind: 'status', status: 403 });
    expect(await t.send(records(2))).toMatchObject({ kind: 'auth', reason: expect.stringContaining('Forbidden') });
    fake.fail('ingest', { kind: 'status', status: 413 });
    expect(await t.send(records(2))).toMatchObject({ kind: 'too_large' });
    fake.fail('ingest', { kind: 'status', status: 429, retryAfterSeconds: 9 });
    expect(await t.send(records(2))).toMatchObject({ kind: 'throttled', retryAfterMs: 9000 });
    fake.fail('ingest', { kind: 'status', status: 400 });
    expect(await t.send(records(2))).toMatchObject({ kind: 'rejected' });
    fake.fail('ingest', { kind: 'status', status: 500 });
    expect(await t.send(records(2))).toMatchObject({ kind: 'retry', unknownOutcome: false });
    expect(fake.tokenCalls).toHaveLength(1);
    expect(fake.rows.size).toBe(0);
  });

  it('slow beyond the timeout → retry with unknown outcome (the rows may have landed)', async () => {
    const t = target(az(), { ...env, requestTimeoutMs: 400 });
    // The token first, and a kept-alive connection: the timeout below is the upload's answer's.
    await warmUp(t);
    fake.fail('ingest', { kind: 'slow', ms: 1500 });
    expect(await t.send(records(1))).toMatchObject({ kind: 'retry', unknownOutcome: true });
  });

  it('an envelope over 64 KB goes as a truncated string with Truncated: true; the batch stays ≤ 1 MB', async () => {
    const t = target(az(), env);
    const big = record(Date.now(), 100_000);
    expect(t.recordBytes(big)).toBeLessThan(66_000);
    expect(await t.send([big, record()])).toMatchObject({ kind: 'done', dead: [] });
    const rows = fake.rows.get(`${DCR}/${STREAM}`) as Array<Record<string, unknown>>;
    expect(rows[0]).toMatchObject({ EventId: big.eventId, Truncated: true, EventType: 'ip_policy_created.v0' });
    expect(typeof rows[0]!.Event).toBe('string');
    expect(Buffer.byteLength(rows[0]!.Event as string)).toBeLessThanOrEqual(64_000);
    expect(big.body.startsWith(rows[0]!.Event as string)).toBe(true);
    expect(rows[1]).toMatchObject({ Truncated: false });
    const many = Array.from({ length: 20 }, () => record(Date.now(), 60_000));
    expect(await t.send(many)).toMatchObject({ kind: 'too_large' });
  });

  it('trusts the extra CA through one TLS context, not one made per connection', async () => {
    // Given `ca`, tls.connect made a SecureContext for every connection, parsing the ~145 public
    // root certificates each time: tens of ms of CPU blocking the event loop per connection (and
    // on a loaded machine, past this file's request timeouts).
    const connects = vi.spyOn(tls, 'connect');
    const contexts = vi.spyOn(tls, 'createSecureContext');
    const agents = createAgents(fake.caPem);
    try {
      // At once, so that each request has a connection of its own (a 404: the fake has no such route).
      const answers = await Promise.all(Array.from({ length: 4 }, () => httpRequest({ url: new URL('/nothing', fake.url), method: 'GET', headers: {}, agents, timeoutMs: 20_000 })));
      expect(answers.map((a) => a.status)).toEqual([404, 404, 404, 404]);
      expect(connects).toHaveBeenCalledTimes(4);
      // The one context (made by createAgents, or before by another target trusting the same CA).
      expect(contexts.mock.calls.length).toBeLessThanOrEqual(1);
    } finally {
      agents.destroy();
      connects.mockRestore();
      contexts.mockRestore();
    }
  });

  it('without the CA the TLS handshake fails: retry, nothing sent', async () => {
    const t = target(az(), { ...env, caPem: undefined });
    expect(await t.send(records(1))).toMatchObject({ kind: 'retry', unknownOutcome: false });
    expect(fake.tokenCalls).toHaveLength(0);
  });
});
