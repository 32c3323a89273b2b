import https from 'node:https';
import { gzipSync } from 'node:zlib';
import { Agent, fetch as undiciFetch } from 'undici';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { AZURE_LIMITS, startAzureFake, type AzureFake } from './azure.js';

/**
 * Self-test of the Azure fake over HTTPS, trusting only its CA: undici `fetch` with an `Agent`
 * whose `connect.ca` is `caPem` (what the worker does), and once with `node:https` + `ca`.
 */

const TENANT = '72f988bf-86f1-41af-91ab-2d7cd011db47';
const CLIENT = '0b6c8a3e-1d2f-4e5a-9b7c-112233445566';
const SECRET = 'azure~test~secret';
const DCR = 'dcr-00112233445566778899aabbccddeeff';
const STREAM = 'Custom-WarrenEvents_CL';

let fake: AzureFake;
let agent: Agent;

async function token(form: Record<string, string> = {}): Promise<{ status: number; body: Record<string, unknown> }> {
  const body = new URLSearchParams({ grant_type: 'client_credentials', client_id: CLIENT, client_secret: SECRET, scope: 'https://monitor.azure.com/.default', ...form });
  const r = await undiciFetch(`${fake.url}/${TENANT}/oauth2/v2.0/token`, { method: 'POST', body, dispatcher: agent });
  return { status: r.status, body: (await r.json()) as Record<string, unknown> };
}

async function ingest(rows: unknown, opts: { bearer?: string; gzip?: boolean; apiVersion?: string; raw?: Buffer } = {}) {
  const json = Buffer.from(JSON.stringify(rows));
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (opts.bearer !== '') headers.authorization = `Bearer ${opts.bearer ?? ((await token()).body.access_token as string)}`;
  if (opts.gzip !== false) headers['content-encoding'] = 'gzip';
  return undiciFetch(`${fake.url}/dataCollectionRules/${DCR}/streams/${STREAM}?api-version=${opts.apiVersion ?? '2023-01-01'}`, {
    method: 'POST',
    headers,
    body: opts.raw ?? (opts.gzip === false ? json : gzipSync(json)),
    dispatcher: agent,
  });
}

const row = (i: number, extra: Record<string, unknown> = {}) => ({ TimeGenerated: new Date().toISOString(), EventId: `evt_${i}`, ...extra });

beforeAll(async () => {
  fake = await startAzureFake({ tenantId: TENANT, clientId: CLIENT, clientSecret: SECRET });
  agent = new Agent({ connect: { ca: fake.caPem } });
});
afterAll(async () => {
  await agent?.close();
  await fake?.close();
});
beforeEach(() => fake.reset());

describe('Azure fake: identity', () => {
  it('serves OpenID discovery and issues client-credentials tokens', async () => {
    expect(fake.url).toMatch(/^https:\/\/localhost:\d+$/);
    const d = await undiciFetch(`${fake.url}/${TENANT}/v2.0/.well-known/openid-configuration`, { dispatcher: agent });
    expect(d.status).toBe(200);
    expect(await d.json()).toMatchObject({ token_endpoint: `${fake.url}/${TENANT}/oauth2/v2.0/token`, issuer: `${fake.url}/${TENANT}/v2.0` });
    const t = await token();
    expect(t.status).toBe(200);
    expect(t.body).toMatchObject({ token_type: 'Bearer', expires_in: 3600 });
    expect(typeof t.body.access_token).toBe('string');
    expect((await token({ scope: 'https://monitor.azure.com//.default' })).status).toBe(200);
    expect(fake.tokenCalls).toEqual([
      { tenant: TENANT, clientId: CLIENT, scope: 'https://monitor.azure.com/.default', ok: true },
      { tenant: TENANT, clientId: CLIENT, scope: 'https://monitor.azure.com//.default', ok: true },
    ]);
  });

  it('refuses a wrong secret (401 invalid_client), scope (400 invalid_scope), client, grant type', async () => {
    expect(await token({ client_secret: 'nope' })).toMatchObject({ status: 401, body: { error: 'invalid_client' } });
    expect(await token({ scope: 'https://management.azure.com/.default' })).toMatchObject({ status: 400, body: { error: 'invalid_scope' } });
    expect(await token({ client_id: 'someone-else' })).toMatchObject({ status: 400, body: { error: 'unauthorized_client' } });
    expect(await token({ grant_type: 'password' })).toMatchObject({ status: 400, body: { error: 'unsupported_grant_type' } });
    expect(fake.tokenCalls.every((c) => !c.ok)).toBe(true);
  });

  it('is refused by a client that does not trust its CA', async () => {
    await expect(undiciFetch(`${fake.url}/${TENANT}/v2.0/.well-known/openid-configuration`)).rejects.toThrow();
  });
});

describe('Azure fake: ingestion', () => {
  it('accepts gzip rows with a valid token: 204; works with node:https + ca too', async () => {
    const r = await ingest([row(1), row(2)]);
    expect(r.status).toBe(204);
    expect(fake.rows.get(`${DCR}/${STREAM}`)).toEqual([expect.objectContaining({ EventId: 'evt_1' }), expect.objectContaining({ EventId: 'evt_2' })]);
    expect(fake.requests.filter((q) => q.kind === 'ingest')).toEqual([expect.objectContaining({ status: 204, rows: 2, target: `${DCR}/${STREAM}` })]);

    const access = (await token()).body.access_token as string;
    const body = gzipSync(JSON.stringify([row(3)]));
    const status = await new Promise<number>((resolve, reject) => {
      const req = https.request(`${fake.url}/dataCollectionRules/${DCR}/streams/${STREAM}?api-version=2023-01-01`, { method: 'POST', ca: fake.caPem, headers: { authorization: `Bearer ${access}`, 'content-type': 'application/json', 'content-encoding': 'gzip' } }, (res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
      });
      req.on('error', reject);
      req.end(body);
    });
    expect(status).toBe(204);
    expect(fake.rows.get(`${DCR}/${STREAM}`)).toHaveLength(3);
  });

  it('401 without, with an unknown or with an expired token; 400 on api-version, gzip, shape', async () => {
    expect((await ingest([row(1)], { bearer: '' })).status).toBe(401);
    const unknown = await ingest([row(1)], { bearer: 'forged' });
    expect(unknown.status).toBe(401);
    expect(await unknown.json()).toMatchObject({ error: { code: 'InvalidToken' } });
    const access = (await token()).body.access_token as string;
    fake.expireTokens();
    expect((await ingest([row(1)], { bearer: access })).status).toBe(401);
    expect((await ingest([row(1)], { apiVersion: '2021-11-01-preview' })).status).toBe(400);
    expect((await ingest([row(1)], { gzip: false })).status).toBe(400);
    expect((await ingest(row(1))).status).toBe(400);
    expect((await ingest([{ EventId: 'no time' }])).status).toBe(400);
    expect((await ingest(null, { raw: Buffer.from('plain') })).status).toBe(400);
    expect(fake.rows.size).toBe(0);
  });

  it('413 above 1 MiB uncompressed or compressed; truncates string fields over 64 KiB', async () => {
    const fits = Array.from({ length: 10 }, (_, i) => row(i, { Payload: 'a'.repeat(100_000) }));
    expect(Buffer.byteLength(JSON.stringify(fits))).toBeLessThan(AZURE_LIMITS.maxUncompressedBytes);
    expect((await ingest(fits)).status).toBe(204);
    const tooBig = Array.from({ length: 11 }, (_, i) => row(i, { Payload: 'a'.repeat(100_000) }));
    expect((await ingest(tooBig)).status).toBe(413);
    // Incompressible: ~1.1 MB of random base64 compresses to more than 1 MiB.
    const random = Buffer.alloc(1_100_000);
    for (let i = 0; i < random.length; i++) random[i] = (Math.random() * 256) | 0;
    const incompressible = gzipSync(random);
    expect(incompressible.length).toBeGreaterThan(AZURE_LIMITS.maxCompressedBytes);
    const r = await ingest(null, { raw: incompressible });
    expect(r.status).toBe(413);
    expect(await r.json()).toMatchObject({ error: { code: 'ContentLengthLimitExceeded' } });
    fake.reset();
    expect((await ingest([row(1, { Big: 'b'.repeat(70_000) })])).status).toBe(204);
    expect((fake.rows.get(`${DCR}/${STREAM}`)![0] as { Big: string }).Big).toHaveLength(AZURE_LIMITS.maxFieldBytes);
  });

  it('faults: 429 with Retry-After, 403, 500, slow, reset, accept-then-reset, token faults, stop/start', async () => {
    const access = (await token()).body.access_token as string;
    fake.fail('ingest', { kind: 'status', status: 429, retryAfterSeconds: 12 });
    const r429 = await ingest([row(1)], { bearer: access });
    expect(r429.status).toBe(429);
    expect(r429.headers.get('retry-after')).toBe('12');
    fake.fail('ingest', { kind: 'status', status: 403 });
    fake.fail('ingest', { kind: 'status', status: 500 });
    expect((await ingest([row(1)], { bearer: access })).status).toBe(403);
    expect((await ingest([row(1)], { bearer: access })).status).toBe(500);
    fake.fail('ingest', { kind: 'slow', ms: 80 });
    const t0 = Date.now();
    expect((await ingest([row(1)], { bearer: access })).status).toBe(204);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(75);
    fake.fail('ingest', { kind: 'reset' });
    await expect(ingest([row(2)], { bearer: access })).rejects.toThrow();
    fake.fail('ingest', { kind: 'accept-then-reset' });
    await expect(ingest([row(3)], { bearer: access })).rejects.toThrow();
    expect(fake.rows.get(`${DCR}/${STREAM}`)!.map((x) => (x as { EventId: string }).EventId)).toEqual(['evt_1', 'evt_3']);

    fake.fail('token', { kind: 'status', status: 503, retryAfterSeconds: 3 });
    expect(await token()).toMatchObject({ status: 503, body: { error: 'temporarily_unavailable' } });
    fake.fail('token', { kind: 'status', status: 401 });
    expect(await token()).toMatchObject({ status: 401, body: { error: 'invalid_client' } });

    await fake.stop();
    await expect(token()).rejects.toThrow();
    await fake.start();
    expect((await ingest([row(4)], { bearer: access })).status).toBe(204);
  });
});
