import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { DATADOG_LIMITS, startDatadogFake, type DatadogFake } from './datadog.js';

/** Self-test of the Datadog intake fake with plain `fetch` + `zlib.gzipSync`, as the worker sends. */

const KEY = 'dd0123456789abcdef0123456789abcd';
let fake: DatadogFake;

const entry = (i: number, message = `{"event_id":"evt_${i}"}`) => ({ message, ddsource: 'warren', ddtags: 'env:test', service: 'warren', hostname: 'edge-1' });

function post(body: unknown, opts: { key?: string; gzip?: boolean; contentType?: string; path?: string; raw?: Buffer } = {}) {
  const json = Buffer.from(JSON.stringify(body));
  const headers: Record<string, string> = { 'content-type': opts.contentType ?? 'application/json' };
  if (opts.key !== '') headers['dd-api-key'] = opts.key ?? KEY;
  if (opts.gzip !== false) headers['content-encoding'] = 'gzip';
  return fetch(`${fake.url}${opts.path ?? '/api/v2/logs'}`, { method: 'POST', headers, body: opts.raw ?? (opts.gzip === false ? json : gzipSync(json)) });
}

beforeAll(async () => {
  fake = await startDatadogFake({ apiKeys: [KEY] });
});
afterAll(async () => {
  await fake.close();
});
beforeEach(() => fake.reset());

describe('Datadog fake', () => {
  it('accepts a gzip JSON array: 202 {}', async () => {
    const r = await post([entry(1), entry(2)]);
    expect(r.status).toBe(202);
    expect(await r.json()).toEqual({});
    expect(fake.entries).toEqual([entry(1), entry(2)]);
    expect(fake.requests).toEqual([expect.objectContaining({ status: 202, entries: 2, gzip: true })]);
  });

  it('refuses a bad key (403), the wrong path (404), no gzip or wrong type (400), a non-array (400)', async () => {
    expect((await post([entry(1)], { key: 'nope' })).status).toBe(403);
    expect((await post([entry(1)], { key: '' })).status).toBe(403);
    expect((await post([entry(1)], { path: '/v1/input' })).status).toBe(404);
    expect((await post([entry(1)], { gzip: false })).status).toBe(400);
    expect((await post([entry(1)], { contentType: 'text/plain' })).status).toBe(400);
    expect((await post(entry(1))).status).toBe(400);
    expect((await post(null, { raw: Buffer.from('not gzip') })).status).toBe(400);
    expect(fake.entries).toHaveLength(0);
    expect(fake.requests.map((r) => r.status)).toEqual([403, 403, 404, 400, 400, 400, 400]);
  });

  it('413 above 1,000 entries or 5 MB uncompressed; truncates a single entry over 1 MB but answers 202', async () => {
    expect((await post(Array.from({ length: 1000 }, (_, i) => entry(i)))).status).toBe(202);
    expect((await post(Array.from({ length: 1001 }, (_, i) => entry(i)))).status).toBe(413);
    const big = Array.from({ length: 6 }, (_, i) => entry(i, 'x'.repeat(900_000)));
    const r = await post(big);
    expect(r.status).toBe(413);
    expect(fake.requests.at(-1)).toMatchObject({ status: 413, entries: 6 });
    expect(fake.requests.at(-1)!.bytes).toBeGreaterThan(DATADOG_LIMITS.maxPayloadBytes);
    const huge = await post([entry(1, 'y'.repeat(1_200_000)), entry(2)]);
    expect(huge.status).toBe(202);
    const stored = fake.entries.slice(-2);
    expect(stored[0]!.truncated).toBe(true);
    expect(Buffer.byteLength(JSON.stringify({ ...entry(1, stored[0]!.message) }))).toBeLessThanOrEqual(DATADOG_LIMITS.maxEntryBytes);
    expect(stored[1]).toEqual(entry(2));
  });

  it('faults: statuses (429 with x-ratelimit-reset), slow, reset, accept-then-reset, stop/start', async () => {
    fake.fail({ kind: 'status', status: 429, rateLimitResetSeconds: 7 });
    const r429 = await post([entry(1)]);
    expect(r429.status).toBe(429);
    expect(r429.headers.get('x-ratelimit-reset')).toBe('7');
    for (const status of [400, 401, 403, 408, 413, 500, 503] as const) fake.fail({ kind: 'status', status });
    const statuses = [];
    for (let i = 0; i < 7; i++) statuses.push((await post([entry(1)])).status);
    expect(statuses).toEqual([400, 401, 403, 408, 413, 500, 503]);
    expect(fake.entries).toHaveLength(0);

    fake.fail({ kind: 'slow', ms: 80 });
    const t0 = Date.now();
    expect((await post([entry(1)])).status).toBe(202);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(75);

    fake.fail({ kind: 'reset' });
    await expect(post([entry(2)])).rejects.toThrow();
    fake.fail({ kind: 'accept-then-reset' });
    await expect(post([entry(3)])).rejects.toThrow();
    expect(fake.entries.map((e) => e.message)).toEqual([entry(1).message, entry(3).message]);

    await fake.stop();
    await expect(post([entry(4)])).rejects.toThrow();
    await fake.start();
    expect((await post([entry(4)])).status).toBe(202);
    expect(fake.requests.filter((r) => r.fault).map((r) => r.fault)).toEqual(['status', 'status', 'status', 'status', 'status', 'status', 'status', 'status', 'slow', 'reset', 'accept-then-reset']);
  });
});
