import { createHmac } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import { Readable, type Transform } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import zlib from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { UNVERIFIABLE_WEBHOOK_PROVIDERS, WEBHOOK_PROVIDERS, type CelActions } from '@warren/shared';
import { compressionStage } from '../modules/compression.js';
import { makeEdge, makeConfig, makeRoute, makeState, testDeps } from '../modules/testing.js';
import { createWebhookVerificationStage, SUPPORTED_WEBHOOK_PROVIDERS } from '../modules/webhook-verification.js';
import { isOutcome, readBody, RoutePipeline } from '../pipeline/runner.js';
import type { Outcome, RequestState, RouteStage } from '../pipeline/types.js';
import { compileVerifyWebhook, runVerifyWebhook, webhookChecks } from './body-actions.js';
import { trafficPolicyStage } from './index.js';

const route = (policy: unknown, modules: Record<string, unknown> = {}) => makeRoute(modules, { trafficPolicy: { enabled: true, value: policy } });
function stage(policy: unknown): RouteStage {
  const s = trafficPolicyStage(route(policy), makeEdge(), makeConfig(), testDeps());
  if (!s) throw new Error('no stage');
  return s;
}
const header = (pairs: string[], name: string) => pairs.filter((_, i) => i % 2 === 1 && pairs[i - 1]!.toLowerCase() === name.toLowerCase());
const vars = (s: RequestState) => (s.vars.actions as CelActions).ngrok;
const hmac = (key: string, ...parts: string[]) => {
  const h = createHmac('sha256', key);
  for (const p of parts) h.update(p);
  return h.digest('hex');
};

const BODY = '{"action":"opened","number":7}';
const GH = 'gh-webhook-secret';
const github = (body = BODY, secret = GH) => ['X-Hub-Signature-256', `sha256=${hmac(secret, body)}`];
function post(headers: string[], body = BODY, url = '/hooks/github'): RequestState {
  return makeState({ method: 'POST', url, headers: ['Host', 'hooks.example.test', 'Content-Type', 'application/json', ...headers], body });
}
async function run(s: RouteStage, r: RequestState): Promise<Exclude<Outcome, null> | null> {
  return (await s.onRequest!(r)) as Exclude<Outcome, null> | null;
}
/** A rule copying the verify-webhook results into request headers. */
const show = {
  actions: [
    {
      type: 'add-headers',
      config: { headers: { 'x-verified': '${actions.ngrok.verify_webhook.verified}', 'x-error-code': '${actions.service.verify_webhook.error.code}', 'x-error': '${actions.ngrok.verify_webhook.error.message}' } },
    },
  ],
};
const seen = (r: RequestState) => [header(r.headers, 'x-verified')[0], header(r.headers, 'x-error-code')[0], header(r.headers, 'x-error')[0]];

describe('the stage declares body hooks only when its policy has a body action', () => {
  it('needsBody with verify-webhook, transformBody with compress-response, neither otherwise', () => {
    const plain = stage({ inbound: [{ actions: [{ type: 'deny' }] }], outbound: [{ actions: [{ type: 'add-headers', config: { headers: { 'x-a': 'b' } } }] }] });
    expect(plain.needsBody).toBeFalsy();
    expect(plain.transformBody).toBeUndefined();
    const verify = stage({ inbound: [{ expressions: ["req.url.path.startsWith('/hooks')"], actions: [{ type: 'verify-webhook', config: { provider: 'github', secret: GH } }] }] });
    expect(verify.needsBody).toBe(true);
    expect(verify.transformBody).toBeUndefined();
    const compress = stage({ outbound: [{ actions: [{ type: 'compress-response' }] }] });
    expect(compress.needsBody).toBeFalsy();
    expect(compress.transformBody).toBeTypeOf('function');
    expect(new RoutePipeline([plain]).needsBody).toBe(false);
    expect(new RoutePipeline([plain, verify]).needsBody).toBe(true);
  });
});

describe('verify-webhook', () => {
  it('verifies every provider the policy validation accepts (the shared list minus the unverifiable)', () => {
    expect(SUPPORTED_WEBHOOK_PROVIDERS).toEqual(WEBHOOK_PROVIDERS.filter((p) => !UNVERIFIABLE_WEBHOOK_PROVIDERS.includes(p)));
  });

  const enforced = stage({ inbound: [{ actions: [{ type: 'verify-webhook', config: { provider: 'github', secret: GH } }] }, show] });

  it('passes a request signed by the provider and shows the result to later rules', async () => {
    const r = post(github());
    expect(await run(enforced, r)).toBeNull();
    expect(seen(r)).toEqual(['true', '', '']);
  });

  it.each([
    ['no signature', [], /missing x-hub-signature-256 header/],
    ['a wrong secret', github(BODY, 'other-secret'), /x-hub-signature-256 does not match/],
    ['a tampered body', github('{"action":"closed"}'), /does not match/],
  ])('refuses %s with 403 ERR_WARREN_7125 naming the reason; no later rule runs', async (_, headers, reason) => {
    const r = post(headers);
    const out = await run(enforced, r);
    expect(out).toMatchObject({ status: 403, headers: { 'warren-error-code': 'ERR_WARREN_7125' } });
    const msg = JSON.parse(String(out!.body));
    expect(msg).toMatchObject({ error_code: 'ERR_WARREN_7125', status_code: 403 });
    expect(msg.msg).toMatch(/^webhook verification failed \(github\): /);
    expect(msg.msg).toMatch(reason);
    expect(msg.msg).not.toContain(GH);
    expect(header(r.headers, 'x-verified')).toEqual([]);
    expect(vars(r).verify_webhook.verified).toBe(false);
    expect(vars(r).verify_webhook.error.code).toBe('verification_failed');
  });

  it('refuses an Upgrade even with a valid signature (the bytes after it are covered by none)', async () => {
    const r = makeState({ method: 'GET', url: '/hooks/github', headers: ['Host', 'hooks.example.test', 'Connection', 'Upgrade', 'Upgrade', 'websocket', ...github('')], body: '' });
    const out = await run(enforced, r);
    expect(out).toMatchObject({ status: 403, headers: { 'warren-error-code': 'ERR_WARREN_7125' } });
    expect(JSON.parse(String(out!.body)).msg).toMatch(/Upgrade request carries bytes no signature covers/);
  });

  it('with enforce: false only records the result, for later rules to act on', async () => {
    const s = stage({
      inbound: [
        { actions: [{ type: 'verify-webhook', config: { provider: 'github', secret: GH, enforce: false } }] },
        show,
        { expressions: ['!actions.ngrok.verify_webhook.verified'], actions: [{ type: 'custom-response', config: { status_code: 401, body: 'unsigned' } }] },
      ],
    });
    const bad = post([]);
    expect(await run(s, bad)).toMatchObject({ status: 401, body: 'unsigned' });
    expect(seen(bad)).toEqual(['false', 'verification_failed', 'missing x-hub-signature-256 header']);
    const good = post(github());
    expect(await run(s, good)).toBeNull();
    expect(seen(good)).toEqual(['true', '', '']);
  });

  it('runs the same provider check as the webhook_verification module (stripe, slack: same verdicts, same reasons)', async () => {
    const module = createWebhookVerificationStage()(makeRoute({ webhook_verification: { enabled: true, provider: 'stripe', secret: 'whsec_s' } }), makeEdge(), makeConfig(), testDeps())!;
    const action = stage({ inbound: [{ actions: [{ type: 'verify-webhook', config: { provider: 'stripe', secret: 'whsec_s' } }] }] });
    const now = Math.floor(Date.now() / 1000);
    const sig = (t: number, body = BODY) => `t=${t},v1=${hmac('whsec_s', `${t}.`, body)}`;
    for (const h of [sig(now), sig(now - 301), sig(now, '{}'), 't=1'] as const) {
      const [m, a] = [await run(module, post(['Stripe-Signature', h])), await run(action, post(['Stripe-Signature', h]))];
      expect(a === null).toBe(m === null);
      if (m) expect(JSON.parse(String(a!.body)).msg).toBe(JSON.parse(String(m.body)).msg);
    }
    const slack = stage({ inbound: [{ actions: [{ type: 'verify-webhook', config: { provider: 'Slack', secret: 'slack-secret' } }] }] });
    const ts = String(now);
    expect(await run(slack, post(['X-Slack-Signature', `v0=${hmac('slack-secret', `v0:${ts}:`, BODY)}`, 'X-Slack-Request-Timestamp', ts]))).toBeNull();
    expect((await run(slack, post(['X-Slack-Signature', `v0=${hmac('slack-secret', `v0:${ts}:`, BODY)}`])))?.status).toBe(403);
  });

  it('verifies the request as the provider sent it, whatever earlier actions changed', async () => {
    const s = stage({
      inbound: [
        { actions: [{ type: 'url-rewrite', config: { to: '/elsewhere' } }, { type: 'remove-headers', config: { headers: ['x-hub-signature-256'] } }] },
        { actions: [{ type: 'verify-webhook', config: { provider: 'github', secret: GH } }] },
      ],
    });
    const r = post(github());
    expect(await run(s, r)).toBeNull();
    expect(header(r.headers, 'x-hub-signature-256')).toEqual([]);
  });

  it("answers a provider's unsigned handshake itself, even with enforce: false (dropbox challenge, X CRC)", async () => {
    const dbx = stage({ inbound: [{ actions: [{ type: 'verify-webhook', config: { provider: 'dropbox', secret: 'app-secret', enforce: false } }] }, show] });
    const r = makeState({ method: 'GET', url: '/hooks?challenge=abc123', headers: ['Host', 'hooks.example.test'] });
    const out = await run(dbx, r);
    expect(out).toMatchObject({ status: 200, body: 'abc123', headers: { 'content-type': 'text/plain; charset=utf-8', 'x-content-type-options': 'nosniff' } });
    expect(vars(r).verify_webhook.verified).toBe(false);
    expect(vars(r).verify_webhook.error.code).toBe('');
    const x = stage({ inbound: [{ actions: [{ type: 'verify-webhook', config: { provider: 'twitter', secret: 'consumer' } }] }] });
    const crc = await run(x, makeState({ method: 'GET', url: '/x?crc_token=tok', headers: ['Host', 'hooks.example.test'] }));
    expect(JSON.parse(String(crc!.body))).toEqual({ response_token: `sha256=${createHmac('sha256', 'consumer').update('tok').digest('base64')}` });
  });

  it('waits for an asynchronous check (sns) and then goes on with the same rule', async () => {
    const s = stage({
      inbound: [
        { actions: [{ type: 'verify-webhook', config: { provider: 'sns', enforce: false } }, { type: 'add-headers', config: { headers: { 'x-same-rule': 'yes' } } }] },
        show,
      ],
    });
    const r = post([], '{"Type":"Notification"}');
    const out = s.onRequest!(r);
    expect(out).toBeInstanceOf(Promise);
    expect(await out).toBeNull();
    expect(header(r.headers, 'x-same-rule')).toEqual(['yes']);
    expect(seen(r)).toEqual(['false', 'verification_failed', 'unsupported SNS SignatureVersion']);
    const enforcedSns = stage({ inbound: [{ actions: [{ type: 'verify-webhook', config: { provider: 'sns' } }] }] });
    expect(await run(enforcedSns, post([], 'not json'))).toMatchObject({ status: 403, headers: { 'warren-error-code': 'ERR_WARREN_7125' } });
  });

  it('a check that throws is a failure, not an open door (a failing certificate fetch)', async () => {
    const checks = webhookChecks({ snsCertificateFetcher: async () => { throw new Error('offline'); } });
    const a = compileVerifyWebhook({ provider: 'sns', secret: '', enforce: true }, checks);
    const msg = JSON.stringify({ Type: 'Notification', MessageId: 'm', TopicArn: 'arn:aws:sns:us-east-1:1:t', Message: 'hi', Timestamp: new Date().toISOString(), SignatureVersion: '2', Signature: 'c2ln', SigningCertURL: 'https://sns.us-east-1.amazonaws.com/SimpleNotificationService-x.pem' });
    const r = post([], msg);
    const out = await runVerifyWebhook(a, r);
    expect(out?.status).toBe(403);
    expect(vars(r).verify_webhook.verified).toBe(false);
    expect(() => compileVerifyWebhook({ provider: 'vmware', secret: 'x', enforce: true }, checks)).toThrow(/^verify-webhook: provider "vmware" is not supported/);
  });

  it('does not parse and sort a huge form body before checking a signature (twilio, mailchimp, plivo)', async () => {
    // 120,000 fields in 1 MiB: parsed and sorted (twice for twilio, once per URL variant) took
    // 230-320 ms per unauthenticated request, against verify-webhook's 1 ms price.
    const form = Array.from({ length: 120_000 }, (_, i) => `k${(i * 7919) % 120_000}=v`).join('&').slice(0, 1024 * 1024 - 16);
    for (const [provider, headers] of [
      ['twilio', ['X-Twilio-Signature', 'AAAA']],
      ['mailchimp', ['X-Mandrill-Signature', 'AAAA']],
      ['plivo', ['X-Plivo-Signature-V3', 'AAAA', 'X-Plivo-Signature-V3-Nonce', '1']],
    ] as const) {
      const s = stage({ inbound: [{ actions: [{ type: 'verify-webhook', config: { provider, secret: 'dG9rZW4tc2VjcmV0LXRva2Vu', enforce: false } }] }, show] });
      const r = makeState({ method: 'POST', url: '/hook', headers: ['Host', 'hooks.example.test', 'Content-Type', 'application/x-www-form-urlencoded', ...headers], body: form });
      expect(await run(s, r)).toBeNull();
      expect(seen(r), provider).toEqual(['false', 'verification_failed', 'the form body has more than 1000 fields, more than this provider sends']);
    }
  });

  it('gives up on a body that does not arrive in time (it would hold its buffer as long as the client likes)', async () => {
    // The public servers have no request timeout: a client announcing a body and sending it
    // slowly, or never, kept the request's buffer (up to 1 MiB) and the promise pending.
    const results: unknown[] = [];
    const server = http.createServer({ requestTimeout: 0 }, (req, res) => {
      void readBody(req, 1024 * 1024, 300).then((b) => {
        results.push(b);
        res.end();
      });
    });
    const port = await new Promise<number>((r) => server.listen(0, '127.0.0.1', () => r((server.address() as net.AddressInfo).port)));
    const sock = net.connect(port, '127.0.0.1');
    sock.on('error', () => {});
    sock.write('POST /hooks/github HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n' + 'x'.repeat(1000));
    const t = performance.now();
    await new Promise((r) => setTimeout(r, 1_500));
    sock.destroy();
    server.close();
    expect(results).toEqual(['timeout']);
    expect(performance.now() - t).toBeGreaterThan(300);
    // A body that arrives in time is read as before.
    const ok = http.createServer((req, res) => void readBody(req, 1024, 300).then((b) => res.end(Buffer.isBuffer(b) ? `got ${b.length}` : String(b))));
    const okPort = await new Promise<number>((r) => ok.listen(0, '127.0.0.1', () => r((ok.address() as net.AddressInfo).port)));
    const answer = await fetch(`http://127.0.0.1:${okPort}/`, { method: 'POST', body: 'hello' }).then((r) => r.text());
    ok.close();
    expect(answer).toBe('got 5');
  });

  it('a request without a body (an upgrade) is checked against an empty body', async () => {
    const r = makeState({ method: 'GET', url: '/ws', headers: ['Host', 'hooks.example.test', ...github('')] });
    expect(await run(enforced, r)).toBeNull();
  });
});

// ------------------------------------------------------------------------------- compress-response

const big = Buffer.from('{"items":[' + Array.from({ length: 400 }, (_, i) => `{"id":${i},"name":"item ${i}"}`).join(',') + ']}');
const JSON_HEAD = ['Content-Type', 'application/json', 'Content-Length', String(big.length), 'ETag', '"v1"'];
function get(ae: string | null, method = 'GET'): RequestState {
  return makeState({ method, url: '/api', headers: ae === null ? ['Host', 'app.example.test'] : ['Host', 'app.example.test', 'Accept-Encoding', ae] });
}
/** Runs a pipeline's response side like the proxy: the head, then the body through the transforms. */
async function respond(p: RoutePipeline, s: RequestState, head: string[] = JSON_HEAD, body: Buffer = big, status = 200) {
  const d = await p.onResponse(s, status, [...head]);
  if (isOutcome(d)) throw new Error('unexpected outcome');
  const decision = d!;
  let out: Readable = Readable.from([body.subarray(0, 700), body.subarray(700)]);
  for (const t of decision.transforms) out = out.pipe(t as Transform);
  return { headers: decision.headers, transforms: decision.transforms.length, body: await buffer(out) };
}
const policyPipeline = (policy: unknown) => new RoutePipeline([stage(policy)]);
const showCompress = {
  actions: [{ type: 'add-headers', config: { headers: { 'x-alg': '${actions.ngrok.compress.negotiated_algorithm}', 'x-already': '${actions.ngrok.compress.already_compressed}', 'x-ce': "${res.headers['content-encoding']}" } } }],
};

describe('compress-response', () => {
  it('gzip: head edited when the action runs (later rules see it), body compressed as it streams', async () => {
    const p = policyPipeline({ outbound: [{ actions: [{ type: 'compress-response' }] }, showCompress] });
    const s = get('gzip');
    const res = await respond(p, s);
    expect(res.transforms).toBe(1);
    expect(res.headers).toEqual(['Content-Type', 'application/json', 'ETag', 'W/"v1"', 'Vary', 'Accept-Encoding', 'Content-Encoding', 'gzip', 'x-alg', 'gzip', 'x-already', 'false', 'x-ce', 'gzip']);
    expect(res.body.length).toBeLessThan(big.length / 3);
    expect(zlib.gunzipSync(res.body).equals(big)).toBe(true);
  });

  it.each([
    ['br, gzip', ['gzip', 'deflate', 'br'], 'br'],
    ['gzip;q=1.0, br;q=0.5', ['gzip', 'deflate', 'br'], 'gzip'],
    ['br, gzip;q=0.5', ['gzip'], 'gzip'],
    ['deflate', ['gzip', 'deflate', 'br'], 'deflate'],
    ['*', ['deflate'], 'deflate'],
    ['gzip, deflate', ['br'], ''],
    ['identity', ['gzip', 'deflate', 'br'], ''],
    ['br;q=0, gzip;q=0, *;q=0', ['gzip', 'deflate', 'br'], ''],
  ])('Accept-Encoding %j with algorithms %j → %j, and the body decodes', async (ae, algorithms, expected) => {
    const p = policyPipeline({ outbound: [{ actions: [{ type: 'compress-response', config: { algorithms } }] }, showCompress] });
    const res = await respond(p, get(ae));
    expect(header(res.headers, 'x-alg')).toEqual([expected]);
    expect(header(res.headers, 'content-encoding')).toEqual(expected ? [expected] : []);
    const decode = { br: zlib.brotliDecompressSync, gzip: zlib.gunzipSync, deflate: zlib.inflateSync, '': (b: Buffer) => b }[expected]!;
    expect(decode(res.body).equals(big)).toBe(true);
    // Compressible: the representation varies by Accept-Encoding, compressed or not.
    expect(header(res.headers, 'vary')).toEqual(['Accept-Encoding']);
  });

  it('leaves a body the upstream already encoded alone, and says so', async () => {
    const p = policyPipeline({ outbound: [{ actions: [{ type: 'compress-response' }] }, showCompress] });
    const gz = zlib.gzipSync(big);
    const res = await respond(p, get('br, gzip'), ['Content-Type', 'application/json', 'Content-Encoding', 'gzip', 'Content-Length', String(gz.length)], gz);
    expect(res.transforms).toBe(0);
    expect(header(res.headers, 'x-already')).toEqual(['true']);
    expect(header(res.headers, 'x-alg')).toEqual(['']);
    expect(header(res.headers, 'content-length')).toEqual([String(gz.length)]);
    expect(res.body.equals(gz)).toBe(true);
  });

  it('reads every Content-Encoding field: identity then gzip is already encoded (no second gzip), for the action and the module', async () => {
    const gz = zlib.gzipSync(big);
    for (const first of ['identity', '']) {
      const head = ['Content-Type', 'application/json', 'Content-Encoding', first, 'Content-Encoding', 'gzip'];
      const p = policyPipeline({ outbound: [{ actions: [{ type: 'compress-response' }] }, showCompress] });
      const res = await respond(p, get('gzip'), head, gz);
      expect([res.transforms, header(res.headers, 'x-already')]).toEqual([0, ['true']]);
      expect(res.body.equals(gz)).toBe(true);
      const mod = new RoutePipeline([compressionStage(makeRoute({ compression: { enabled: true } }), makeEdge(), makeConfig(), testDeps())!]);
      expect((await respond(mod, get('gzip'), head, gz)).transforms).toBe(0);
    }
  });

  it("follows the compression module's rules: small, HEAD, 204/304, images, no-transform are left alone", async () => {
    const p = policyPipeline({ outbound: [{ actions: [{ type: 'compress-response' }] }] });
    const tiny = Buffer.from('{"ok":true}');
    expect((await respond(p, get('gzip'), ['Content-Type', 'application/json', 'Content-Length', String(tiny.length)], tiny)).transforms).toBe(0);
    expect((await respond(p, get('gzip', 'HEAD'))).transforms).toBe(0);
    expect((await respond(p, get('gzip'), [], Buffer.alloc(0), 204)).transforms).toBe(0);
    expect((await respond(p, get('gzip'), ['Content-Type', 'image/png'])).transforms).toBe(0);
    expect((await respond(p, get('gzip'), ['Content-Type', 'text/html', 'Cache-Control', 'public, no-transform'])).transforms).toBe(0);
    // Unknown length: compressed.
    const chunked = await respond(p, get('gzip'), ['Content-Type', 'text/plain']);
    expect(chunked.transforms).toBe(1);
    expect(zlib.gunzipSync(chunked.body).equals(big)).toBe(true);
  });

  it('gives HEAD the head the same GET gets, with no compressor and the same variables', async () => {
    const p = policyPipeline({ outbound: [{ actions: [{ type: 'compress-response' }] }, showCompress] });
    const viaGet = await respond(p, get('br, gzip'));
    const head = await respond(p, get('br, gzip', 'HEAD'), JSON_HEAD, Buffer.alloc(0));
    expect(head.headers).toEqual(viaGet.headers);
    expect(header(head.headers, 'content-encoding')).toEqual(['br']);
    expect(header(head.headers, 'content-length')).toEqual([]);
    expect(head.transforms).toBe(0);
  });

  it('never compresses twice: a second action sees the first one, the route module sees the action', async () => {
    const twice = policyPipeline({ outbound: [{ actions: [{ type: 'compress-response' }, { type: 'compress-response' }] }, showCompress] });
    const a = await respond(twice, get('gzip'));
    expect([a.transforms, header(a.headers, 'content-encoding'), header(a.headers, 'x-already')]).toEqual([1, ['gzip'], ['true']]);
    expect(zlib.gunzipSync(a.body).equals(big)).toBe(true);

    // The policy and the route's compression module together (the module transforms first).
    const policy = { outbound: [{ actions: [{ type: 'compress-response', config: { algorithms: ['gzip'] } }] }] };
    const r = route(policy, { compression: { enabled: true } });
    const both = new RoutePipeline([trafficPolicyStage(r, makeEdge(), makeConfig(), testDeps())!, compressionStage(r, makeEdge(), makeConfig(), testDeps())!]);
    const b = await respond(both, get('br, gzip'));
    expect([b.transforms, header(b.headers, 'content-encoding'), header(b.headers, 'vary')]).toEqual([1, ['gzip'], ['Accept-Encoding']]);
    expect(zlib.gunzipSync(b.body).equals(big)).toBe(true);
    // When the action declines (only gzip allowed, client takes br only), the module compresses.
    const c = await respond(both, get('br'));
    expect([c.transforms, header(c.headers, 'content-encoding')]).toEqual([1, ['br']]);
    expect(zlib.brotliDecompressSync(c.body).equals(big)).toBe(true);
  });

  it('does not compress when a later rule removed or replaced the Content-Encoding it set', async () => {
    for (const later of [{ type: 'remove-headers', config: { headers: ['content-encoding'] } }, { type: 'add-headers', config: { headers: { 'content-encoding': 'br' } } }]) {
      const p = policyPipeline({ outbound: [{ actions: [{ type: 'compress-response' }] }, { actions: [later] }] });
      const res = await respond(p, get('gzip'));
      expect(res.transforms).toBe(0);
      expect(res.body.equals(big)).toBe(true);
    }
    // The module then compresses a response whose Content-Encoding a later rule removed, once.
    const r = route({ outbound: [{ actions: [{ type: 'compress-response' }] }, { actions: [{ type: 'remove-headers', config: { headers: ['content-encoding'] } }] }] }, { compression: { enabled: true } });
    const both = new RoutePipeline([trafficPolicyStage(r, makeEdge(), makeConfig(), testDeps())!, compressionStage(r, makeEdge(), makeConfig(), testDeps())!]);
    const res = await respond(both, get('gzip'));
    expect([res.transforms, header(res.headers, 'content-encoding')]).toEqual([1, ['gzip']]);
    expect(zlib.gunzipSync(res.body).equals(big)).toBe(true);
  });

  it('an outbound rule after it may still answer instead (nothing to compress)', async () => {
    const p = policyPipeline({ outbound: [{ actions: [{ type: 'compress-response' }] }, { expressions: ["actions.ngrok.compress.negotiated_algorithm == 'gzip'"], actions: [{ type: 'custom-response', config: { status_code: 299, body: 'gz' } }] }] });
    const d = await p.onResponse(get('gzip'), 200, [...JSON_HEAD]);
    expect(isOutcome(d) && d.status).toBe(299);
  });
});
