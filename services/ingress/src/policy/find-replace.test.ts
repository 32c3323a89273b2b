import { createHmac } from 'node:crypto';
import { Readable, type Transform } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import zlib from 'node:zlib';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FIND_REPLACE_LIMITS } from '@warren/shared';
import { FIND_REPLACE_PROCESS_LIMITS, findReplaceInFlight } from './find-replace.js';
import { REGEX_WORKER_LIMITS, regexWorkerCounts, stopRegexWorker } from './regex-worker.js';
import { compressionStage } from '../modules/compression.js';
import { makeConfig, makeEdge, makeRoute, makeState, testDeps } from '../modules/testing.js';
import { isOutcome, RoutePipeline } from '../pipeline/runner.js';
import type { RequestState, RouteStage } from '../pipeline/types.js';
import { trafficPolicyStage } from './index.js';

// The regex worker thread's deadlines are wall time (a job 1 s, the thread's start 10 s): on a box
// running two test runs at once, each process waiting its turn for a core, jobs of 5-25 ms of CPU
// ran past them and their bodies passed unchanged. These tests check what is rewritten, so they
// allow more; the deadline itself has its own test (timeoutMs 1).
const workerLimits = { ...REGEX_WORKER_LIMITS };
beforeAll(() => Object.assign(REGEX_WORKER_LIMITS, { timeoutMs: 30_000, startupMs: 60_000 }));
afterAll(() => Object.assign(REGEX_WORKER_LIMITS, workerLimits));

const route = (policy: unknown, modules: Record<string, unknown> = {}) => makeRoute(modules, { trafficPolicy: { enabled: true, value: policy } });
function stage(policy: unknown, registry?: Registry): RouteStage {
  const deps = testDeps();
  const s = trafficPolicyStage(route(policy), makeEdge(), makeConfig(), registry ? { ...deps, registry } : deps);
  if (!s) throw new Error('no stage');
  return s;
}
const header = (pairs: string[], name: string) => pairs.filter((_, i) => i % 2 === 1 && pairs[i - 1]!.toLowerCase() === name.toLowerCase());
const REDACT = [{ from: 'api_key=([a-zA-Z0-9]+)', to: 'api_key=REDACTED' }, { from: '"ssn":\\s*"[0-9-]+"', to: '"ssn":"***"' }];
const requestPolicy = (replacements: unknown = REDACT, extra: unknown[] = []) => ({ inbound: [{ actions: [...extra, { type: 'request-body-find-replace', config: { replacements } }] }] });
const responsePolicy = (replacements: unknown = REDACT, extra: unknown[] = []) => ({ outbound: [{ actions: [{ type: 'response-body-find-replace', config: { replacements } }, ...extra] }] });

function post(body: string | Buffer, headers: string[] = ['Content-Type', 'application/json']): RequestState {
  const b = Buffer.isBuffer(body) ? body : Buffer.from(body);
  return makeState({ method: 'POST', url: '/api', headers: ['Host', 'app.example.test', ...headers, 'Content-Length', String(b.length)], body: b });
}

async function skips(registry: Registry): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const v of (await registry.getSingleMetric('warren_traffic_policy_find_replace_skipped_total')?.get())?.values ?? []) out[`${v.labels.direction}/${v.labels.reason}`] = v.value;
  return out;
}

describe('the stage declares body hooks only for these actions', () => {
  it('needsBody with request-body-find-replace, transformBody with response-body-find-replace, neither otherwise', () => {
    const plain = stage({ inbound: [{ actions: [{ type: 'deny' }] }], outbound: [{ actions: [{ type: 'add-headers', config: { headers: { 'x-a': 'b' } } }] }] });
    expect(plain.needsBody).toBeFalsy();
    expect(plain.transformBody).toBeUndefined();
    const r = stage(requestPolicy());
    expect(r.needsBody).toBe(true);
    expect(r.transformBody).toBeUndefined();
    const w = stage(responsePolicy());
    expect(w.needsBody).toBeFalsy();
    expect(w.transformBody).toBeTypeOf('function');
  });
});

describe('request-body-find-replace', () => {
  it('rewrites a JSON body and sets Content-Length to its new length (Transfer-Encoding and digests dropped)', async () => {
    const s = post('{"q":"api_key=abc123 and api_key=XYZ","ssn": "123-45-6789"}', ['Content-Type', 'application/json; charset=utf-8', 'Transfer-Encoding', 'chunked', 'Content-MD5', 'x']);
    expect(await stage(requestPolicy()).onRequest!(s)).toBeNull();
    expect(s.body!.toString()).toBe('{"q":"api_key=REDACTED and api_key=REDACTED","ssn":"***"}');
    expect(header(s.headers, 'content-length')).toEqual([String(s.body!.length)]);
    expect(header(s.headers, 'transfer-encoding')).toEqual([]);
    expect(header(s.headers, 'content-md5')).toEqual([]);
  });

  it('interpolates ${…} as literal text; later rules see the new Content-Length', async () => {
    const policy = {
      inbound: [
        { actions: [{ type: 'request-body-find-replace', config: { replacements: [{ from: "${req.headers['x-find'][0]}", to: "<${req.headers['x-to'][0]}>" }] } }] },
        { actions: [{ type: 'add-headers', config: { headers: { 'x-len': "${req.headers['content-length'][0]}" } } }] },
      ],
    };
    const s = post('a+b ab a+b', ['Content-Type', 'text/plain', 'X-Find', 'a+b', 'X-To', '$1']);
    await stage(policy).onRequest!(s);
    expect(s.body!.toString()).toBe('<$1> ab <$1>');
    expect(header(s.headers, 'x-len')).toEqual(['12']);
  });

  it('decodes a gzip/deflate/br request body, rewrites it and encodes it again', async () => {
    for (const [coding, enc, dec] of [
      ['gzip', zlib.gzipSync, zlib.gunzipSync],
      ['deflate', zlib.deflateSync, zlib.inflateSync],
    ] as const) {
      const s = post(enc(Buffer.from('token api_key=s3cr3t end')), ['Content-Type', 'text/plain', 'Content-Encoding', coding]);
      await stage(requestPolicy()).onRequest!(s);
      expect(dec(s.body!).toString()).toBe('token api_key=REDACTED end');
      expect(header(s.headers, 'content-length')).toEqual([String(s.body!.length)]);
    }
  });

  it('leaves binary, undeclared, non-UTF-8, foreign-charset, unknown-coding and over-bound bodies byte for byte, and counts them', async () => {
    const registry = new Registry();
    // A regex replacement: over 4 KiB on the regex worker thread, up to 128 KiB (literal ones: `literal replacements` below).
    const st = stage(requestPolicy([{ from: '[a]', to: 'b' }]), registry);
    const bomb = zlib.gzipSync(Buffer.alloc(10 * 1024 * 1024, 'a'));
    const cases: [Buffer, string[]][] = [
      [Buffer.from([0x61, 0x00, 0xff, 0x61]), ['Content-Type', 'application/octet-stream']],
      [Buffer.from('aaa'), []],
      [Buffer.from([0x61, 0xff, 0x61]), ['Content-Type', 'text/plain']],
      [Buffer.from('aaa'), ['Content-Type', 'text/plain; charset=iso-8859-1']],
      [Buffer.from('aaa'), ['Content-Type', 'text/plain', 'Content-Encoding', 'zstd']],
      [Buffer.from('a'.repeat(FIND_REPLACE_LIMITS.workerBodyBytes + 1)), ['Content-Type', 'text/plain']],
      [bomb, ['Content-Type', 'text/plain', 'Content-Encoding', 'gzip']],
      [Buffer.from('a '.repeat(FIND_REPLACE_LIMITS.maxMatches + 1)), ['Content-Type', 'text/plain']],
    ];
    for (const [body, headers] of cases) {
      const s = post(body, headers);
      await st.onRequest!(s);
      expect(s.body!.equals(body)).toBe(true);
      expect(header(s.headers, 'content-length')).toEqual([String(body.length)]);
    }
    expect(await skips(registry)).toEqual({ 'request/type': 2, 'request/not_utf8': 1, 'request/charset': 1, 'request/encoding': 1, 'request/too_large': 2, 'request/too_many_matches': 1 });
  });

  it('verify-webhook still checks the body as the client sent it', async () => {
    const body = '{"api_key=abc":1}';
    const sig = `sha256=${createHmac('sha256', 'gh-secret').update(body).digest('hex')}`;
    const policy = requestPolicy(REDACT, []);
    (policy.inbound[0]!.actions as unknown[]).push({ type: 'verify-webhook', config: { provider: 'github', secret: 'gh-secret' } });
    const s = post(body, ['Content-Type', 'application/json', 'X-Hub-Signature-256', sig]);
    expect(await stage(policy).onRequest!(s)).toBeNull();
    expect(s.body!.toString()).toBe('{"api_key=REDACTED":1}');
  });
});

// ------------------------------------------------------------------------------ response side

const TEXT = '{"user":"bob","api_key=K1":"x","ssn": "123-45-6789"}';
const REWRITTEN = '{"user":"bob","api_key=REDACTED":"x","ssn":"***"}';
function get(ae?: string, method = 'GET'): RequestState {
  return makeState({ method, url: '/api', headers: ae ? ['Host', 'app.example.test', 'Accept-Encoding', ae] : ['Host', 'app.example.test'] });
}
/** The response side as the proxy runs it: the head, then the body (in chunks) through the transforms. */
async function respond(p: RoutePipeline, s: RequestState, head: string[], body: Buffer, status = 200) {
  const d = await p.onResponse(s, status, [...head]);
  if (isOutcome(d)) throw new Error('unexpected outcome');
  let out: Readable = Readable.from([body.subarray(0, 5), body.subarray(5, 20), body.subarray(20)]);
  for (const t of d!.transforms) out = out.pipe(t as Transform);
  return { headers: d!.headers, body: await buffer(out) };
}
const jsonHead = (body: Buffer, more: string[] = []) => ['Content-Type', 'application/json', 'Content-Length', String(body.length), 'ETag', '"v1"', 'Accept-Ranges', 'bytes', ...more];
const pipeline = (policy: unknown, registry?: Registry) => new RoutePipeline([stage(policy, registry)]);

describe('response-body-find-replace', () => {
  it('rewrites a body that arrives in chunks; Content-Length and Accept-Ranges dropped, ETag weakened', async () => {
    const body = Buffer.from(TEXT);
    const res = await respond(pipeline(responsePolicy()), get(), jsonHead(body), body);
    expect(res.body.toString()).toBe(REWRITTEN);
    expect(res.headers).toEqual(['Content-Type', 'application/json', 'ETag', 'W/"v1"']);
  });

  it('replaces, then compresses, with compress-response (also when it comes first) and with the compression module', async () => {
    const body = Buffer.from(TEXT.repeat(30));
    for (const policy of [responsePolicy(REDACT, [{ type: 'compress-response' }]), { outbound: [{ actions: [{ type: 'compress-response' }, { type: 'response-body-find-replace', config: { replacements: REDACT } }] }] }]) {
      const res = await respond(pipeline(policy), get('gzip'), jsonHead(body), body);
      expect(header(res.headers, 'content-encoding')).toEqual(['gzip']);
      expect(zlib.gunzipSync(res.body).toString()).toBe(REWRITTEN.repeat(30));
    }
    const r = route(responsePolicy(), { compression: { enabled: true } });
    const both = new RoutePipeline([trafficPolicyStage(r, makeEdge(), makeConfig(), testDeps())!, compressionStage(r, makeEdge(), makeConfig(), testDeps())!]);
    const res = await respond(both, get('br'), jsonHead(body), body);
    expect(zlib.brotliDecompressSync(res.body).toString()).toBe(REWRITTEN.repeat(30));
  });

  it('rewrites a body the upstream compressed and keeps its coding (compress-response sees it already compressed)', async () => {
    for (const [coding, enc, dec] of [
      ['gzip', zlib.gzipSync, zlib.gunzipSync],
      ['br', zlib.brotliCompressSync, zlib.brotliDecompressSync],
    ] as const) {
      const body = enc(Buffer.from(TEXT));
      const res = await respond(pipeline(responsePolicy(REDACT, [{ type: 'compress-response' }])), get('gzip, br'), jsonHead(body, ['Content-Encoding', coding]), body);
      expect(header(res.headers, 'content-encoding')).toEqual([coding]);
      expect(dec(res.body).toString()).toBe(REWRITTEN);
    }
  });

  it("answers HEAD with the head GET gets (no length, a weak ETag; RFC 9110 §9.3.2), rewriting nothing", async () => {
    const p = pipeline(responsePolicy([{ from: '[a]', to: 'b' }]));
    const head = ['Content-Type', 'text/plain', 'Content-Length', '3', 'ETag', '"v1"', 'Accept-Ranges', 'bytes'];
    const got = await respond(p, get(), [...head], Buffer.from('aaa'));
    expect([got.body.toString(), got.headers]).toEqual(['bbb', ['Content-Type', 'text/plain', 'ETag', 'W/"v1"']]);
    const headOnly = await respond(p, get(undefined, 'HEAD'), [...head], Buffer.alloc(0));
    expect([headOnly.body.length, headOnly.headers]).toEqual([0, got.headers]);
  });

  it('passes binary, partial, HEAD and over-bound bodies unchanged, and counts them', async () => {
    const registry = new Registry();
    const p = pipeline(responsePolicy([{ from: '[a]', to: 'b' }]), registry);
    const png = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x61, 0x61, 0xff, 0x00]);
    const same = async (head: string[], body: Buffer, status = 200, s = get()) => {
      const res = await respond(p, s, head, body, status);
      expect(res.body.equals(body)).toBe(true);
      return res.headers;
    };
    expect(await same(['Content-Type', 'image/png', 'Content-Length', '8'], png)).toEqual(['Content-Type', 'image/png', 'Content-Length', '8']);
    await same(['Content-Type', 'text/event-stream'], Buffer.from('data: aaa\n\n'));
    await same(['Content-Type', 'text/plain', 'Content-Range', 'bytes 0-2/10'], Buffer.from('aaa'), 206);
    await same(['Content-Type', 'text/plain'], Buffer.from('aaa'), 200, get(undefined, 'HEAD'));
    const big = Buffer.from('a'.repeat(FIND_REPLACE_LIMITS.workerBodyBytes + 100));
    // Declared too large: decided on the head, the head is left alone.
    expect(await same(['Content-Type', 'text/plain', 'Content-Length', String(big.length)], big)).toEqual(['Content-Type', 'text/plain', 'Content-Length', String(big.length)]);
    // Chunked and too large: found out while buffering; what was held and the rest pass unchanged.
    await same(['Content-Type', 'text/plain'], big);
    await same(['Content-Type', 'text/plain'], Buffer.from([0x61, 0xfe, 0x61]));
    expect(await skips(registry)).toEqual({ 'response/type': 2, 'response/partial': 1, 'response/too_large': 2, 'response/not_utf8': 1 });
  });

  it('applies several actions in order, each with the ${…} values of when it ran', async () => {
    const policy = {
      outbound: [
        { actions: [{ type: 'response-body-find-replace', config: { replacements: [{ from: 'bob', to: "${res.headers['x-who'][0]}" }] } }] },
        { actions: [{ type: 'response-body-find-replace', config: { replacements: [{ from: 'alice', to: 'carol' }] } }] },
      ],
    };
    const body = Buffer.from(TEXT);
    const res = await respond(pipeline(policy), get(), jsonHead(body, ['X-Who', 'alice']), body);
    expect(res.body.toString()).toBe(TEXT.replace('bob', 'carol'));
  });
});

describe('literal replacements on large bodies', () => {
  const LIT = [{ from: 'api_key=SECRET', to: 'api_key=REDACTED' }];
  it('rewrites a 100 KiB request body (also gzipped) and a 100 KiB response, chunked or gzipped; over 128 KiB passes', async () => {
    const text = `${'<p>filler text</p>\n'.repeat(5_000)}api_key=SECRET<p>end</p>`;
    const want = text.replace('SECRET', 'REDACTED');
    const s = post(text, ['Content-Type', 'text/html']);
    await stage(requestPolicy(LIT)).onRequest!(s);
    expect(s.body!.toString()).toBe(want);
    expect(header(s.headers, 'content-length')).toEqual([String(s.body!.length)]);
    const g = post(zlib.gzipSync(text), ['Content-Type', 'text/html', 'Content-Encoding', 'gzip']);
    await stage(requestPolicy(LIT)).onRequest!(g);
    expect(zlib.gunzipSync(g.body!).toString()).toBe(want);
    const body = Buffer.from(text);
    const res = await respond(pipeline(responsePolicy(LIT)), get(), ['Content-Type', 'text/html'], body);
    expect(res.body.toString()).toBe(want);
    const gz = zlib.gzipSync(body);
    const r2 = await respond(pipeline(responsePolicy(LIT)), get('gzip'), ['Content-Type', 'text/html', 'Content-Encoding', 'gzip'], gz);
    expect(zlib.gunzipSync(r2.body).toString()).toBe(want);
    const registry = new Registry();
    const big = Buffer.from(`api_key=SECRET ${'x'.repeat(FIND_REPLACE_LIMITS.literalBodyBytes)}`);
    const r3 = await respond(pipeline(responsePolicy(LIT), registry), get(), ['Content-Type', 'text/plain'], big);
    expect(r3.body.equals(big)).toBe(true);
    expect(await skips(registry)).toEqual({ 'response/too_large': 1 });
  });

  it('an action with a regex rewrites a body over 4 KiB on the regex worker thread, up to its bound; a larger one passes unchanged and is counted', async () => {
    const registry = new Registry();
    const st = stage(requestPolicy([...LIT, { from: '\\d{3}-\\d{2}-\\d{4}', to: 'X' }]), registry);
    const text = `api_key=SECRET 123-45-6789 ${'x'.repeat(100_000)} 987-65-4321`;
    const s = post(text, ['Content-Type', 'text/plain']);
    await st.onRequest!(s);
    expect(s.body!.toString()).toBe(`api_key=REDACTED X ${'x'.repeat(100_000)} X`);
    expect(header(s.headers, 'content-length')).toEqual([String(s.body!.length)]);
    const big = `api_key=SECRET ${'x'.repeat(FIND_REPLACE_LIMITS.workerBodyBytes)}`;
    const b = post(big, ['Content-Type', 'text/plain']);
    await st.onRequest!(b);
    expect(b.body!.toString()).toBe(big);
    expect(await skips(registry)).toEqual({ 'request/too_large': 1 });
  }, 60_000); // ~1 s of CPU with the thread's start: 10-25 times that in wall time on a box running two test runs and more at once (the same below)
});

describe('a response body that takes long to arrive', () => {
  it('after holdMs what was held goes out unchanged, and the rest streams (slow); the head is not held longer', async () => {
    const registry = new Registry();
    const p = pipeline(responsePolicy([{ from: 'api_key=SECRET', to: 'api_key=REDACTED' }]), registry);
    const saved = FIND_REPLACE_PROCESS_LIMITS.holdMs;
    FIND_REPLACE_PROCESS_LIMITS.holdMs = 50;
    try {
      const s = get();
      const d = await p.onResponse(s, 200, ['Content-Type', 'text/plain']);
      if (isOutcome(d)) throw new Error('unexpected outcome');
      const t = d!.transforms[0] as Transform & { finalLength: Promise<number | null> };
      const src = new Readable({ read() {} });
      const out = buffer(src.pipe(t));
      src.push('first api_key=SECRET ');
      const started = Date.now();
      // The head's decision comes at the deadline, not when the body ends.
      expect(await t.finalLength).toBeNull();
      expect(Date.now() - started).toBeLessThan(2_000);
      src.push('then api_key=SECRET');
      src.push(null);
      expect((await out).toString()).toBe('first api_key=SECRET then api_key=SECRET');
      expect(await skips(registry)).toEqual({ 'response/slow': 1 });
      // A body that ends in time is rewritten as before.
      FIND_REPLACE_PROCESS_LIMITS.holdMs = 10_000;
      const body = Buffer.from('x api_key=SECRET');
      expect((await respond(p, get(), ['Content-Type', 'text/plain'], body)).body.toString()).toBe('x api_key=REDACTED');
    } finally {
      FIND_REPLACE_PROCESS_LIMITS.holdMs = saved;
    }
  });
});

describe('regex replacements on bodies over 4 KiB: the regex worker thread', () => {
  afterAll(() => stopRegexWorker());
  const html = (n: number) => `<a href="http://localhost:3000/a">a</a>\n${'<p>filler text, nothing to see</p>\n'.repeat(Math.ceil(n / 35))}`.slice(0, n) + '<a href="https://localhost:3000/z">z</a>';
  const LINKS = [{ from: 'https?://localhost:3000', to: 'https://app.example.com' }];

  it('rewrites a 100 KiB response, plain or gzipped, off the event loop', async () => {
    const text = html(100_000);
    const want = text.replaceAll(/https?:\/\/localhost:3000/g, 'https://app.example.com');
    const body = Buffer.from(text);
    const res = await respond(pipeline(responsePolicy(LINKS)), get(), ['Content-Type', 'text/html; charset=utf-8'], body);
    expect(res.body.toString()).toBe(want);
    const gz = zlib.gzipSync(body);
    const r2 = await respond(pipeline(responsePolicy(LINKS)), get('gzip'), ['Content-Type', 'text/html', 'Content-Encoding', 'gzip'], gz);
    expect(zlib.gunzipSync(r2.body).toString()).toBe(want);
  }, 60_000);

  it('the worker keeps the match and result bounds of its own: past them the body passes unchanged, counted', async () => {
    const registry = new Registry();
    const st = stage(requestPolicy([{ from: 'a+', to: 'b' }]), registry);
    // Over 4 KiB (8 bytes a match), so on the thread.
    const many = Buffer.from('aaaaaaa '.repeat(FIND_REPLACE_LIMITS.workerMaxMatches + 1));
    const s = post(many, ['Content-Type', 'text/plain']);
    await st.onRequest!(s);
    expect(s.body!.equals(many)).toBe(true);
    const ok = Buffer.from('aaaaaaa '.repeat(FIND_REPLACE_LIMITS.workerMaxMatches));
    const s2 = post(ok, ['Content-Type', 'text/plain']);
    await st.onRequest!(s2);
    expect(s2.body!.toString()).toBe('b '.repeat(FIND_REPLACE_LIMITS.workerMaxMatches));
    expect(await skips(registry)).toEqual({ 'request/too_many_matches': 1 });
  }, 60_000);

  it('a body out of time passes unchanged (timeout) and the thread is replaced; at most perAction bodies of one action at once (busy)', async () => {
    const registry = new Registry();
    // ~25 ms a 100 KB body here: every `c` ends a match found by the NFA.
    const st = stage(requestPolicy([{ from: '(a|b)*c', to: 'y' }]), registry);
    const unit = 'ab'.repeat(60) + 'c';
    const body = Buffer.from(unit.repeat(800));
    const saved = { ...REGEX_WORKER_LIMITS };
    try {
      REGEX_WORKER_LIMITS.timeoutMs = 1;
      const restarts = regexWorkerCounts.restarts;
      const s = post(body, ['Content-Type', 'text/plain']);
      await st.onRequest!(s);
      expect(s.body!.equals(body)).toBe(true);
      expect(regexWorkerCounts.restarts).toBeGreaterThan(restarts);
      const metric = await registry.getSingleMetric('warren_traffic_policy_regex_worker_restarts_total')!.get();
      expect(metric.values[0]!.value).toBe(regexWorkerCounts.restarts);
      expect((await registry.getSingleMetric('warren_traffic_policy_regex_worker_jobs')!.get()).values[0]!.value).toBe(0);
      REGEX_WORKER_LIMITS.timeoutMs = saved.timeoutMs;
      REGEX_WORKER_LIMITS.perAction = 2;
      // Three bodies of one action at once: two run (one after the other), the third is busy.
      const small = unit.repeat(40);
      const states = [0, 1, 2].map(() => post(Buffer.from(small), ['Content-Type', 'text/plain']));
      await Promise.all(states.map((x) => st.onRequest!(x)));
      expect(states.map((x) => x.body!.toString())).toEqual(['y'.repeat(40), 'y'.repeat(40), small]);
      expect(await skips(registry)).toEqual({ 'request/timeout': 1, 'request/busy': 1 });
      // And the next one goes through again.
      const again = post(Buffer.from(small), ['Content-Type', 'text/plain']);
      await st.onRequest!(again);
      expect(again.body!.toString()).toBe('y'.repeat(40));
    } finally {
      Object.assign(REGEX_WORKER_LIMITS, saved);
    }
  }, 60_000); // ~1.3 s of CPU

  it('a large pattern gets a smaller bound, from its estimated worst case (a 2481-byte literal searched with indexOf)', async () => {
    const from = 'a'.repeat(1240) + 'b' + 'a'.repeat(1240);
    const registry = new Registry();
    const st = stage(requestPolicy([{ from, to: 'x' }]), registry);
    const fits = post(Buffer.from(`${'a'.repeat(40_000)}${from}`), ['Content-Type', 'text/plain']);
    await st.onRequest!(fits);
    expect(fits.body!.toString()).toBe(`${'a'.repeat(40_000)}x`);
    const over = post(Buffer.from('a'.repeat(FIND_REPLACE_LIMITS.workerBodyBytes - 1)), ['Content-Type', 'text/plain']);
    await st.onRequest!(over);
    expect(await skips(registry)).toEqual({ 'request/too_large': 1 });
  }, 60_000);
});

describe('denial-of-service bounds (review of 44afbc3)', () => {
  const cpuMs = (c: NodeJS.CpuUsage) => (c.user + c.system) / 1000;

  it('a client-sent ${…} needle over 128 characters is an evaluation error, before any search (was 8001 bytes: ~510 ms on a 128+ KiB body)', async () => {
    const registry = new Registry();
    const st = stage(requestPolicy([{ from: "${req.headers['x-find'][0]}", to: 'x' }]), registry);
    const body = Buffer.from('a'.repeat(FIND_REPLACE_LIMITS.literalBodyBytes - 1));
    const needle = 'a'.repeat(4000) + 'b' + 'a'.repeat(4000);
    const s = post(body, ['Content-Type', 'text/plain', 'X-Find', needle]);
    // CPU time, not wall time (a loaded box stretches the latter), and far below the ~510 ms of
    // the search this prevents.
    const c0 = process.cpuUsage();
    await st.onRequest!(s);
    expect(cpuMs(process.cpuUsage(c0))).toBeLessThan(100);
    expect(s.body!.equals(body)).toBe(true);
    // 128 characters is allowed, and searched for.
    const ok = post(Buffer.from(`${'a'.repeat(1000)}${'a'.repeat(127)}b`), ['Content-Type', 'text/plain', 'X-Find', `${'a'.repeat(127)}b`]);
    await st.onRequest!(ok);
    expect(ok.body!.toString()).toBe(`${'a'.repeat(1000)}x`);
  });

  it('a literal from over 128 bytes is a regex (4 KiB bound): four 2481-byte ones on a 128 KiB body pass it at once (was ~540 ms)', async () => {
    const from = 'a'.repeat(1240) + 'b' + 'a'.repeat(1240);
    const registry = new Registry();
    const st = stage(requestPolicy(Array.from({ length: 4 }, () => ({ from, to: 'x' }))), registry);
    const body = Buffer.from('a'.repeat(FIND_REPLACE_LIMITS.literalBodyBytes - 1));
    const s = post(body, ['Content-Type', 'text/plain']);
    const c0 = process.cpuUsage();
    await st.onRequest!(s);
    expect(cpuMs(process.cpuUsage(c0))).toBeLessThan(100); // CPU time, as above (was ~540 ms)
    expect(s.body!.equals(body)).toBe(true);
    expect(await skips(registry)).toEqual({ 'request/too_large': 1 });
  });

  it('a br request body is not decoded (encoding): 40 bodies of 14 bytes that decode to 16 MiB each cost next to no CPU (was seconds)', async () => {
    const registry = new Registry();
    const st = stage(requestPolicy([{ from: 'x', to: 'y' }]), registry);
    const bomb = zlib.brotliCompressSync(Buffer.alloc(1 << 24), { params: { [zlib.constants.BROTLI_PARAM_LGWIN]: 24 } });
    expect(bomb.length).toBeLessThan(32);
    const c0 = process.cpuUsage();
    const states = Array.from({ length: 40 }, () => post(bomb, ['Content-Type', 'application/json', 'Content-Encoding', 'br']));
    await Promise.all(states.map((s) => st.onRequest!(s)));
    expect(cpuMs(process.cpuUsage(c0))).toBeLessThan(100);
    for (const s of states) expect(s.body!.equals(bomb)).toBe(true);
    expect(await skips(registry)).toEqual({ 'request/encoding': 40 });
  }, 120_000); // ~2.5 s of CPU, most of it compressing the bomb: 10-25 times that in wall time on a box running two test runs and more at once

  it('gzip bombs stop decoding at the bound; at most two encoded bodies are worked on at once, the others pass unchanged (busy)', async () => {
    const registry = new Registry();
    const st = stage(requestPolicy([{ from: 'x', to: 'y' }]), registry);
    // 5 MiB of text in 5 KiB: the whole bomb would be ~5 MiB of thread-pool output each.
    const bomb = zlib.gzipSync(Buffer.alloc(5 << 20, 'a'));
    expect(bomb.length).toBeLessThan(FIND_REPLACE_LIMITS.literalBodyBytes);
    const c0 = process.cpuUsage();
    const states = Array.from({ length: 40 }, () => post(bomb, ['Content-Type', 'text/plain', 'Content-Encoding', 'gzip']));
    await Promise.all(states.map((s) => st.onRequest!(s)));
    expect(cpuMs(process.cpuUsage(c0))).toBeLessThan(200);
    expect(await skips(registry)).toEqual({ 'request/too_large': 2, 'request/busy': 38 });
    expect(findReplaceInFlight()).toEqual({ heldBytes: 0, poolJobs: 0 });
    // Three good ones at once: two rewritten, one passed as it came.
    const good = zlib.gzipSync(Buffer.from('x marks the spot'));
    const three = Array.from({ length: 3 }, () => post(good, ['Content-Type', 'text/plain', 'Content-Encoding', 'gzip']));
    await Promise.all(three.map((s) => st.onRequest!(s)));
    expect(three.map((s) => zlib.gunzipSync(s.body!).toString())).toEqual(['y marks the spot', 'y marks the spot', 'x marks the spot']);
    expect((await skips(registry))['request/busy']).toBe(39);
    expect(findReplaceInFlight().poolJobs).toBe(0);
  });

  it('response rewrites hold at most FIND_REPLACE_PROCESS_LIMITS.heldBytes process-wide: past it the body passes unchanged (busy); all is given back', async () => {
    const saved = FIND_REPLACE_PROCESS_LIMITS.heldBytes;
    try {
      const registry = new Registry();
      const p = pipeline(responsePolicy([{ from: 'secret', to: 'XXXXXX' }]), registry);
      const body = Buffer.from(`${'secret '.repeat(200)}`);
      FIND_REPLACE_PROCESS_LIMITS.heldBytes = 1000;
      const held = await respond(p, get(), ['Content-Type', 'text/plain'], body);
      expect(held.body.equals(body)).toBe(true);
      // Encoded: the raw body fits, what decoding gives does not.
      const gz = zlib.gzipSync(body);
      expect(gz.length).toBeLessThan(1000);
      const enc = await respond(p, get('gzip'), ['Content-Type', 'text/plain', 'Content-Encoding', 'gzip'], gz);
      expect(enc.body.equals(gz)).toBe(true);
      expect(await skips(registry)).toEqual({ 'response/busy': 2 });
      expect(findReplaceInFlight()).toEqual({ heldBytes: 0, poolJobs: 0 });
      FIND_REPLACE_PROCESS_LIMITS.heldBytes = saved;
      const ok = await respond(p, get('gzip'), ['Content-Type', 'text/plain', 'Content-Encoding', 'gzip'], gz);
      expect(zlib.gunzipSync(ok.body).toString()).toBe(body.toString().replaceAll('secret', 'XXXXXX'));
      expect(findReplaceInFlight()).toEqual({ heldBytes: 0, poolJobs: 0 });
      // A response aborted while it is held gives its bytes back.
      const s = get();
      const d = await p.onResponse(s, 200, ['Content-Type', 'text/plain']);
      if (isOutcome(d)) throw new Error('unexpected outcome');
      const t = d!.transforms[0] as Transform;
      t.write(body);
      expect(findReplaceInFlight().heldBytes).toBe(body.length);
      t.destroy();
      expect(findReplaceInFlight().heldBytes).toBe(0);
    } finally {
      FIND_REPLACE_PROCESS_LIMITS.heldBytes = saved;
    }
  });
});
