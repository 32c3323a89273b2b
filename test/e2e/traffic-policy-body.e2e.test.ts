import type http from 'node:http';
import net from 'node:net';
import { createHmac } from 'node:crypto';
import zlib from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPolicyCluster, type PolicyCluster, type PolicyRequestOptions } from '../support/policy-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * The traffic-policy body actions `verify-webhook` and `compress-response` on live traffic,
 * through real processes: a control plane, an ingress, our agent and an upstream that echoes the
 * request it got (body included) or serves a large JSON document. Requests are signed the way
 * GitHub, Stripe and Slack sign; compressed bodies are decoded. Every policy is saved through the
 * REST API.
 */

const HOST = 'body.e2e.test';
const GITHUB_SECRET = 'e2e-github-secret-never-logged';
const STRIPE_SECRET = 'whsec_e2e_stripe_secret';
const SLACK_SECRET = 'e2e-slack-signing-secret';
let c: PolicyCluster;
let upstreamHits = 0;

/** What the upstream serves on `/gz…` and `/both…`: compressible JSON of a known length. */
const DOC = Buffer.from(JSON.stringify({ items: Array.from({ length: 300 }, (_, i) => ({ id: i, name: `item ${i}`, tags: ['a', 'b'] })) }));

const request = (p: string, opts?: PolicyRequestOptions) => c.request(p, opts);

const hex = (key: string, ...parts: string[]) => {
  const h = createHmac('sha256', key);
  for (const p of parts) h.update(p);
  return h.digest('hex');
};
const nowS = () => Math.floor(Date.now() / 1000);
/** GitHub: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256(secret, body)>`. */
const githubSigned = (body: string, secret = GITHUB_SECRET) => ({ 'content-type': 'application/json', 'x-github-event': 'push', 'x-hub-signature-256': `sha256=${hex(secret, body)}` });
/** Stripe: `Stripe-Signature: t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`. */
const stripeSigned = (body: string, t = nowS()) => ({ 'content-type': 'application/json', 'stripe-signature': `t=${t},v1=${hex(STRIPE_SECRET, `${t}.`, body)}` });
/** Slack: `X-Slack-Signature: v0=<hex HMAC-SHA256(secret, "v0:<ts>:<body>")>` with `X-Slack-Request-Timestamp`. */
const slackSigned = (body: string, ts = nowS()) => ({ 'content-type': 'application/x-www-form-urlencoded', 'x-slack-request-timestamp': String(ts), 'x-slack-signature': `v0=${hex(SLACK_SECRET, `v0:${ts}:`, body)}` });

/** Adds a route; `match` must not be a prefix of another route's (the probe would hit that one). */
const route = (match: string, policy: unknown, modules: Record<string, unknown> = {}): Promise<string> => c.policyRoute(match, policy, modules);

/** A route create that must be refused: its 400 message. */
async function refused(policy: unknown): Promise<string> {
  const r = await c.tryPolicy(policy);
  expect(r.status, JSON.stringify(r.body)).toBe(400);
  expect(r.body.error_code).toBe('ERR_WARREN_6900');
  return r.body.msg as string;
}

/** Counts the requests that reach it; serves DOC on `/gz…` and `/both…`, DOC gzipped on `/pregz…`, else echoes the request. */
const upstream: http.RequestListener = (req, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (ch: Buffer) => chunks.push(ch));
  req.on('end', () => {
    upstreamHits++;
    const path = req.url ?? '/';
    if (path.startsWith('/gz') || path.startsWith('/both')) {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': DOC.length, etag: '"doc-1"' });
      res.end(DOC);
    } else if (path.startsWith('/pregz')) {
      const gz = zlib.gzipSync(DOC);
      res.writeHead(200, { 'content-type': 'application/json', 'content-encoding': 'gzip', 'content-length': gz.length });
      res.end(gz);
    } else {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ url: path, method: req.method, headers: req.headers, body: Buffer.concat(chunks).toString('utf8') }));
    }
  });
};

beforeAll(async () => {
  c = await startPolicyCluster({ name: 'body', host: HOST, upstream });
}, CLUSTER_HOOK_MS);

afterAll(() => c?.stop(), 60_000);

describe('verify-webhook on live traffic', () => {
  it('github: a signed push reaches the upstream byte for byte; a bad or missing signature is a 403', async () => {
    await route('/github', { inbound: [{ actions: [{ type: 'verify-webhook', config: { provider: 'github', secret: GITHUB_SECRET } }] }] });
    const body = JSON.stringify({ ref: 'refs/heads/main', commits: [{ id: 'abc', message: 'ünïcødé ✓' }] });
    const ok = await request('/github/hook', { body, headers: githubSigned(body) });
    expect(ok.status, ok.raw.toString()).toBe(200);
    expect(ok.json()).toMatchObject({ url: '/github/hook', method: 'POST', body });
    expect(ok.json().headers['x-hub-signature-256']).toBe(githubSigned(body)['x-hub-signature-256']);

    const before = upstreamHits;
    for (const headers of [githubSigned(body, 'wrong-secret'), githubSigned(`${body} `), { 'content-type': 'application/json' }]) {
      const bad = await request('/github/hook', { body, headers });
      expect(bad.status).toBe(403);
      expect(bad.headers['warren-error-code']).toBe('ERR_WARREN_7125');
      expect(bad.json()).toMatchObject({ error_code: 'ERR_WARREN_7125', status_code: 403 });
      expect(bad.json().msg).toMatch(/^webhook verification failed \(github\): /);
      expect(bad.raw.toString()).not.toContain(GITHUB_SECRET);
    }
    expect(upstreamHits).toBe(before);
  });

  it('stripe: checks the signed timestamp (5 minutes) and shows its results to later rules', async () => {
    await route('/stripe', `inbound:
  - actions:
      - type: verify-webhook
        config: {provider: stripe, secret: ${STRIPE_SECRET}}
      - type: add-headers
        config:
          headers: {x-verified: "\${actions.ngrok.verify_webhook.verified}"}
`);
    const body = JSON.stringify({ id: 'evt_1', type: 'payment_intent.succeeded' });
    const ok = await request('/stripe/events', { body, headers: stripeSigned(body) });
    expect([ok.status, ok.json().headers['x-verified']]).toEqual([200, 'true']);
    const stale = await request('/stripe/events', { body, headers: stripeSigned(body, nowS() - 600) });
    expect(stale.status).toBe(403);
    expect(stale.json().msg).toContain('the timestamp is more than 5 minutes off');
  });

  it('slack with enforce: false: unverified requests go on with the result, for later rules to act on', async () => {
    await route('/slack', `inbound:
  - actions:
      - type: verify-webhook
        config: {provider: slack, secret: ${SLACK_SECRET}, enforce: false}
      - type: add-headers
        config:
          headers: {x-why: "\${actions.ngrok.verify_webhook.verified} \${actions.ngrok.verify_webhook.error.code}: \${actions.ngrok.verify_webhook.error.message}"}
  - expressions: ["!actions.ngrok.verify_webhook.verified && req.url.path == '/slack/strict'"]
    actions:
      - type: custom-response
        config: {status_code: 401, headers: {content-type: text/plain}, body: unverified}
`);
    const body = 'token=abc&team_id=T1&command=%2Fdeploy&text=prod';
    const ok = await request('/slack/commands', { body, headers: slackSigned(body) });
    expect([ok.status, ok.json().body, ok.json().headers['x-why']]).toEqual([200, body, 'true :']);
    const { 'x-slack-signature': _, ...unsigned } = slackSigned(body);
    const dry = await request('/slack/commands', { body, headers: unsigned });
    expect([dry.status, dry.json().headers['x-why']]).toEqual([200, 'false verification_failed: missing x-slack-signature header']);
    const stale = await request('/slack/commands', { body, headers: slackSigned(body, nowS() - 301) });
    expect(stale.json().headers['x-why']).toBe('false verification_failed: x-slack-request-timestamp: the timestamp is more than 5 minutes off');
    const strict = await request('/slack/strict', { body, headers: unsigned });
    expect([strict.status, strict.raw.toString()]).toEqual([401, 'unverified']);
    expect((await request('/slack/strict', { body, headers: slackSigned(body) })).status).toBe(200);
  });

  it("answers dropbox's challenge itself; a body over 1 MiB is a 413 before any rule", async () => {
    await route('/dropbox', {
      inbound: [
        { expressions: ["req.url.path.startsWith('/dropbox/hook')"], actions: [{ type: 'verify-webhook', config: { provider: 'dropbox', secret: 'dbx-app-secret' } }] },
      ],
    });
    const before = upstreamHits;
    const challenge = await request('/dropbox/hook?challenge=e2e-challenge-42');
    expect([challenge.status, challenge.raw.toString(), challenge.headers['content-type']]).toEqual([200, 'e2e-challenge-42', 'text/plain; charset=utf-8']);
    expect(upstreamHits).toBe(before);
    // A policy with verify-webhook buffers the bodies of its route, up to 1 MiB.
    const huge = await request('/dropbox/other', { body: Buffer.alloc(1024 * 1024 + 1, 0x61) });
    expect([huge.status, huge.headers['warren-error-code']]).toEqual([413, 'ERR_WARREN_7009']);
    const small = await request('/dropbox/other', { body: 'not a webhook' });
    expect([small.status, small.json().body]).toEqual([200, 'not a webhook']);
  });

  it('a body far over 1 MiB still gets its 413 read by the client: the rest of the body is read and dropped before the connection closes, never a reset', async () => {
    await route('/linger', { inbound: [{ actions: [{ type: 'verify-webhook', config: { provider: 'dropbox', secret: 'dbx-app-secret' } }] }] });
    const before = upstreamHits;
    const body = Buffer.alloc(8 * 1024 * 1024, 0x61);
    // Declared (content-length), so the answer comes before any of it is read: without lingering,
    // the client meets EPIPE or ECONNRESET while it still sends.
    for (let i = 0; i < 10; i++) {
      const r = await request('/linger/upload', { body });
      expect([r.status, r.headers['warren-error-code'], r.headers.connection]).toEqual([413, 'ERR_WARREN_7009', 'close']);
    }
    expect(upstreamHits).toBe(before);
  });

  it('the lingering is bounded: a client still sending 5 s (LINGER_MS) after its 413 is cut', async () => {
    await route('/lingerslow', { inbound: [{ actions: [{ type: 'verify-webhook', config: { provider: 'dropbox', secret: 'dbx-app-secret' } }] }] });
    // allowHalfOpen: the client keeps sending after the ingress's FIN, as an uploader that does not read would.
    const sock = net.connect({ port: c.a.http, host: '127.0.0.1', allowHalfOpen: true });
    sock.on('error', () => {});
    let answer = '';
    let answeredAt = 0;
    sock.on('data', (d: Buffer) => {
      answer += d.toString('latin1');
      if (!answeredAt && answer.includes('\r\n\r\n')) answeredAt = performance.now();
    });
    const closed = new Promise<number>((r) => sock.once('close', () => r(performance.now())));
    sock.write(`POST /lingerslow/up HTTP/1.1\r\nhost: ${c.host}\r\ncontent-length: ${100 * 1024 * 1024}\r\n\r\n`);
    const drip = setInterval(() => sock.writable && sock.write(Buffer.alloc(1024, 0x61)), 100);
    try {
      const closedAt = await closed;
      expect(answer).toMatch(/^HTTP\/1\.1 413 /);
      expect(answeredAt).toBeGreaterThan(0);
      expect(closedAt - answeredAt).toBeGreaterThan(4_500);
      expect(closedAt - answeredAt).toBeLessThan(8_000);
    } finally {
      clearInterval(drip);
      sock.destroy();
    }
  }, 20_000);

  it('refuses what the ingress could not verify when the policy is saved', async () => {
    expect(await refused({ inbound: [{ actions: [{ type: 'verify-webhook', config: { provider: 'orbit', secret: 'x' } }] }] })).toContain('inbound[0].actions[0].config.provider: orbit signs webhooks in a way that is not published');
    expect(await refused({ inbound: [{ actions: [{ type: 'verify-webhook', config: { provider: 'nope', secret: 'x' } }] }] })).toContain('is not a supported webhook provider');
    expect(await refused({ inbound: [{ actions: [{ type: 'verify-webhook', config: { provider: 'sns', secret: 'x' } }] }] })).toContain('takes no secret');
    const msg = await refused({ inbound: [{ actions: [{ type: 'verify-webhook', config: { provider: 'sendgrid', secret: GITHUB_SECRET } }] }] });
    expect(msg).toContain('the sendgrid secret must be the base64 ECDSA public verification key');
    expect(msg).not.toContain(GITHUB_SECRET);
    expect(await refused({ outbound: [{ actions: [{ type: 'verify-webhook', config: { provider: 'github', secret: 'x' } }] }] })).toContain('verify-webhook can only be used in inbound rules');
  });
});

describe('compress-response on live traffic', () => {
  const show = { actions: [{ type: 'add-headers', config: { headers: { 'x-alg': '${actions.ngrok.compress.negotiated_algorithm}', 'x-already': '${actions.ngrok.compress.already_compressed}' } } }] };

  it('gzip and br by Accept-Encoding; the bodies decode to what the upstream sent', async () => {
    await route('/gz', { outbound: [{ actions: [{ type: 'compress-response', config: { algorithms: ['br', 'gzip'] } }] }, show] });
    const gz = await request('/gz/doc', { headers: { 'accept-encoding': 'gzip' } });
    expect([gz.status, gz.headers['content-encoding'], gz.headers['content-length'], gz.headers.vary, gz.headers.etag, gz.headers['x-alg']]).toEqual([200, 'gzip', undefined, 'Accept-Encoding', 'W/"doc-1"', 'gzip']);
    expect(gz.raw.length).toBeLessThan(DOC.length / 3);
    expect(zlib.gunzipSync(gz.raw).equals(DOC)).toBe(true);

    const br = await request('/gz/doc', { headers: { 'accept-encoding': 'gzip;q=0.5, br' } });
    expect([br.headers['content-encoding'], br.headers['x-alg']]).toEqual(['br', 'br']);
    expect(zlib.brotliDecompressSync(br.raw).equals(DOC)).toBe(true);

    // deflate is not in this action's list; without Accept-Encoding nothing is compressed.
    for (const ae of ['deflate', undefined]) {
      const plain = await request('/gz/doc', { headers: ae ? { 'accept-encoding': ae } : {} });
      expect([plain.headers['content-encoding'], plain.headers['content-length'], plain.headers['x-alg']]).toEqual([undefined, String(DOC.length), '']);
      expect(plain.raw.equals(DOC)).toBe(true);
    }
  });

  it('leaves an upstream-encoded body alone, and never compresses twice beside the compression module', async () => {
    await route('/pregz', { outbound: [{ actions: [{ type: 'compress-response' }] }, show] });
    const pre = await request('/pregz/doc', { headers: { 'accept-encoding': 'br, gzip' } });
    expect([pre.headers['content-encoding'], pre.headers['x-already'], pre.headers['x-alg']]).toEqual(['gzip', 'true', '']);
    expect(zlib.gunzipSync(pre.raw).equals(DOC)).toBe(true);

    await route('/both', { outbound: [{ actions: [{ type: 'compress-response', config: { algorithms: ['gzip'] } }] }] }, { compression: { enabled: true } });
    const both = await request('/both/doc', { headers: { 'accept-encoding': 'br, gzip' } });
    expect([both.headers['content-encoding'], both.headers.vary]).toEqual(['gzip', 'Accept-Encoding']);
    expect(zlib.gunzipSync(both.raw).equals(DOC)).toBe(true);
    // The action declines (gzip only; the client takes br only): the module compresses, once.
    const br = await request('/both/doc', { headers: { 'accept-encoding': 'br' } });
    expect(br.headers['content-encoding']).toBe('br');
    expect(zlib.brotliDecompressSync(br.raw).equals(DOC)).toBe(true);
  });

  it("refuses ngrok's `compress` algorithm, naming the element", async () => {
    expect(await refused({ outbound: [{ actions: [{ type: 'compress-response', config: { algorithms: ['gzip', 'br', 'deflate', 'compress'] } }] }] })).toContain(
      'outbound[0].actions[0].config.algorithms[3]: "compress" (LZW) is not supported by Warren',
    );
  });
});
