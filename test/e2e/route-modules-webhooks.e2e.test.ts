import http from 'node:http';
import { createHash, createHmac, generateKeyPairSync, randomBytes, sign } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPolicyCluster, type PolicyCluster, type PolicyResponse } from '../support/policy-cluster.js';
import { httpsRequest } from '../support/route-modules-https.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * The route module `webhook_verification` on live traffic for the providers other than GitHub,
 * through real processes: a control plane on its own database, an ingress node, our agent and an
 * upstream that answers with the exact bytes it received (base64). Each provider's request is
 * signed here the way that provider signs (written out independently of the ingress's code); a
 * verified request reaches the upstream byte for byte, a tampered body, a wrong signature or a
 * stale timestamp is refused by the ingress with 403 ERR_WARREN_7102 naming the reason, and never
 * reaches the upstream.
 */

const HOST = 'hooks.e2e.test';
let c: PolicyCluster;
/** Requests the upstream received, by path. */
const seen: string[] = [];

/** A body with multi-byte characters, CR LF and a trailing newline: any re-encoding would show. */
const BODY = `{"id":"evt_${randomBytes(4).toString('hex')}","text":"caf\u00e9 \u2603 \u{1F600}","crlf":"a\\r\\nb"}\r\n`;
const nowS = () => String(Math.floor(Date.now() / 1000));
/** Ten minutes ago: outside the 5-minute tolerance. */
const staleS = () => String(Math.floor(Date.now() / 1000) - 600);
const hmac = (alg: string, key: string | Buffer, data: string | Buffer) => createHmac(alg, key).update(data).digest();

beforeAll(async () => {
  c = await startPolicyCluster({
    name: 'rmhooks',
    host: HOST,
    upstream: (req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (ch: Buffer) => chunks.push(ch));
      req.on('end', () => {
        seen.push(req.url ?? '');
        const body = Buffer.concat(chunks);
        res.writeHead(200, { 'content-type': 'application/json', 'x-upstream': 'yes' });
        res.end(JSON.stringify({ url: req.url, method: req.method, headers: req.headers, body_b64: body.toString('base64') }));
      });
    },
  });
}, CLUSTER_HOOK_MS);

afterAll(async () => {
  await c?.stop();
}, 60_000);

const post = (path: string, body: string | Buffer, headers: Record<string, string>) => c.request(path, { method: 'POST', body, headers: { 'content-type': 'application/json', ...headers } });

/** The upstream got the request, with exactly `body`. */
function expectDelivered(r: PolicyResponse, body: string | Buffer): void {
  expect(r.status, r.body).toBe(200);
  expect(r.headers['x-upstream']).toBe('yes');
  expect(Buffer.from(r.json().body_b64, 'base64').equals(Buffer.isBuffer(body) ? body : Buffer.from(body, 'utf8'))).toBe(true);
}

/**
 * The ingress refused it: 403 ERR_WARREN_7102 with `reason` in the message; the upstream saw
 * `path` only `delivered` times before (default never).
 */
function expectRefused(r: { status: number; headers: http.IncomingHttpHeaders; body: string; json: () => any }, provider: string, reason: RegExp, path: string, delivered = 0): void {
  expect([r.status, r.headers['warren-error-code']], r.body).toEqual([403, 'ERR_WARREN_7102']);
  expect(r.headers['x-upstream']).toBeUndefined();
  const j = r.json();
  expect(j.error_code).toBe('ERR_WARREN_7102');
  expect(j.msg).toContain(`webhook verification failed (${provider})`);
  expect(j.msg).toMatch(reason);
  expect(seen.filter((u) => u === path)).toHaveLength(delivered);
}

const route = (match: string, provider: string, secret?: string) => c.route(match, { webhook_verification: { provider, ...(secret === undefined ? {} : { secret }) } });
/** A unique path under `match`, so that what reached the upstream can be told apart. */
const unique = (match: string, name: string) => `${match}/${name}-${randomBytes(3).toString('hex')}`;

describe('webhook_verification through the ingress', () => {
  it('stripe: Stripe-Signature t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<body>">', async () => {
    const secret = `whsec_${randomBytes(12).toString('hex')}`;
    await route('/stripe', 'stripe', secret);
    const header = (t: string, body = BODY, key = secret) => `t=${t},v1=${hmac('sha256', key, `${t}.${body}`).toString('hex')}`;

    expectDelivered(await post(unique('/stripe', 'ok'), BODY, { 'stripe-signature': header(nowS()) }), BODY);
    // Stripe sends a v1 per active secret (during a roll) and a v0 test signature: any v1 may match.
    const t = nowS();
    expectDelivered(await post(unique('/stripe', 'roll'), BODY, { 'stripe-signature': `t=${t},v1=${'0'.repeat(64)},${header(t).split(',')[1]},v0=${'1'.repeat(64)}` }), BODY);

    let p = unique('/stripe', 'tampered');
    expectRefused(await post(p, BODY.replace('caf', 'cafe'), { 'stripe-signature': header(nowS()) }), 'stripe', /stripe-signature does not match/, p);
    p = unique('/stripe', 'wrong-secret');
    expectRefused(await post(p, BODY, { 'stripe-signature': header(nowS(), BODY, 'whsec_other') }), 'stripe', /does not match/, p);
    p = unique('/stripe', 'stale');
    expectRefused(await post(p, BODY, { 'stripe-signature': header(staleS()) }), 'stripe', /more than 5 minutes off/, p);
    p = unique('/stripe', 'unsigned');
    expectRefused(await post(p, BODY, {}), 'stripe', /missing stripe-signature header/, p);
  });

  it('stripe: a signed body uploaded in chunks (no Content-Length) is verified whole and delivered byte for byte', async () => {
    const secret = `whsec_${randomBytes(12).toString('hex')}`;
    await route('/chunked-stripe', 'stripe', secret);
    const body = Buffer.from(BODY.repeat(50), 'utf8');
    const t = nowS();
    const sig = `t=${t},v1=${hmac('sha256', secret, Buffer.concat([Buffer.from(`${t}.`), body])).toString('hex')}`;
    /** POSTs `parts` one write at a time, chunked. */
    const chunked = (path: string, parts: Buffer[]) =>
      new Promise<PolicyResponse>((resolve, reject) => {
        const req = http.request({ host: '127.0.0.1', port: c.a.http, path, method: 'POST', agent: false, headers: { host: HOST, 'content-type': 'application/json', 'transfer-encoding': 'chunked', 'stripe-signature': sig } }, (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (ch: Buffer) => chunks.push(ch));
          res.on('end', () => {
            const raw = Buffer.concat(chunks);
            resolve({ status: res.statusCode ?? 0, headers: res.headers, raw, body: raw.toString('utf8'), json: () => JSON.parse(raw.toString('utf8')) });
          });
        });
        req.setTimeout(10_000, () => req.destroy(new Error('timed out')));
        req.on('error', reject);
        // Split inside multi-byte characters too.
        void (async () => {
          for (const part of parts) {
            req.write(part);
            await new Promise((r) => setTimeout(r, 20));
          }
          req.end();
        })();
      });
    const cut = [0, 7, 333, 334, 1001, body.length];
    const parts = cut.slice(1).map((end, i) => body.subarray(cut[i], end));
    expectDelivered(await chunked(unique('/chunked-stripe', 'ok'), parts), body);
    const tampered = Buffer.from(body);
    tampered[500] = tampered[500]! ^ 1;
    const p = unique('/chunked-stripe', 'tampered');
    expectRefused(await chunked(p, [tampered.subarray(0, 600), tampered.subarray(600)]), 'stripe', /stripe-signature does not match/, p);
  });

  it('slack: X-Slack-Signature v0=<hex HMAC-SHA256 of "v0:<ts>:<body>"> with X-Slack-Request-Timestamp', async () => {
    const secret = randomBytes(16).toString('hex');
    await route('/slack', 'slack', secret);
    const headers = (ts: string, body = BODY, key = secret) => ({ 'x-slack-request-timestamp': ts, 'x-slack-signature': `v0=${hmac('sha256', key, `v0:${ts}:${body}`).toString('hex')}` });

    expectDelivered(await post(unique('/slack', 'ok'), BODY, headers(nowS())), BODY);
    let p = unique('/slack', 'tampered');
    expectRefused(await post(p, `${BODY} `, headers(nowS())), 'slack', /x-slack-signature does not match/, p);
    p = unique('/slack', 'wrong');
    expectRefused(await post(p, BODY, headers(nowS(), BODY, 'not-the-secret')), 'slack', /does not match/, p);
    // Signed correctly, but ten minutes ago: a replay.
    p = unique('/slack', 'stale');
    expectRefused(await post(p, BODY, headers(staleS())), 'slack', /x-slack-request-timestamp: the timestamp is more than 5 minutes off/, p);
    p = unique('/slack', 'no-ts');
    expectRefused(await post(p, BODY, { 'x-slack-signature': headers(nowS())['x-slack-signature'] }), 'slack', /missing or malformed timestamp/, p);
  });

  it('twilio: X-Twilio-Signature, base64 HMAC-SHA1 of the https URL followed by the sorted form fields (and bodySHA256 for JSON)', async () => {
    const token = randomBytes(16).toString('hex');
    await route('/twilio', 'twilio', token);
    const https = (path: string, body: string, headers: Record<string, string>) =>
      httpsRequest({ port: c.a.https, host: HOST, path, ca: c.tls.caPem!, method: 'POST', body, headers });

    // Twilio calls the webhook's public https URL and signs it with the POST fields appended,
    // sorted by name, each name followed by its value(s): written out by hand here.
    const path = `${unique('/twilio', 'sms')}?tenant=t1`;
    const form = 'To=%2B15551234567&From=%2B15557654321&Body=Caf%C3%A9+%E2%98%83&MediaUrl0=https%3A%2F%2Fm.test%2Fb&AccountSid=AC123';
    const data = `https://${HOST}${path}AccountSidAC123BodyCaf\u00e9 \u2603From+15557654321MediaUrl0https://m.test/bTo+15551234567`;
    const sig = hmac('sha1', token, data).toString('base64');
    const formHeaders = { 'content-type': 'application/x-www-form-urlencoded', 'x-twilio-signature': sig };
    const ok = await https(path, form, formHeaders);
    expect(ok.status, ok.body).toBe(200);
    expect(ok.headers['x-upstream']).toBe('yes');
    expect(Buffer.from(ok.json().body_b64, 'base64').toString('utf8')).toBe(form);
    expect(ok.json().url).toBe(path);

    const tampered = await https(path, form.replace('AC123', 'AC124'), formHeaders);
    expectRefused(tampered, 'twilio', /X-Twilio-Signature does not match/, path, 1);
    // The same signature for another URL (the query is signed too).
    const other = `${unique('/twilio', 'sms')}?tenant=t2`;
    expectRefused(await https(other, form, formHeaders), 'twilio', /X-Twilio-Signature does not match/, other);
    const wrong = `${unique('/twilio', 'wrong')}?tenant=t1`;
    expectRefused(await https(wrong, form, { ...formHeaders, 'x-twilio-signature': hmac('sha1', 'other-token', `https://${HOST}${wrong}`).toString('base64') }), 'twilio', /does not match/, wrong);
    const unsigned = unique('/twilio', 'unsigned');
    expectRefused(await https(unsigned, form, { 'content-type': 'application/x-www-form-urlencoded' }), 'twilio', /missing X-Twilio-Signature/, unsigned);

    // JSON bodies: the URL carries bodySHA256 (hex SHA-256 of the body) and only the URL is signed.
    const jsonPath = `${unique('/twilio', 'json')}?bodySHA256=${createHash('sha256').update(BODY).digest('hex')}`;
    const jsonHeaders = { 'content-type': 'application/json', 'x-twilio-signature': hmac('sha1', token, `https://${HOST}${jsonPath}`).toString('base64') };
    const jsonOk = await https(jsonPath, BODY, jsonHeaders);
    expect(jsonOk.status, jsonOk.body).toBe(200);
    expect(Buffer.from(jsonOk.json().body_b64, 'base64').equals(Buffer.from(BODY))).toBe(true);
    expectRefused(await https(jsonPath, BODY.replace('evt_', 'evx_'), jsonHeaders), 'twilio', /bodySHA256 does not match the body/, jsonPath, 1);
  });

  it('shopify: X-Shopify-Hmac-Sha256, base64 HMAC-SHA256 of the body', async () => {
    const secret = `shpss_${randomBytes(12).toString('hex')}`;
    await route('/shopify', 'shopify', secret);
    const sig = (body: string, key = secret) => hmac('sha256', key, body).toString('base64');
    expectDelivered(await post(unique('/shopify', 'ok'), BODY, { 'x-shopify-hmac-sha256': sig(BODY), 'x-shopify-topic': 'orders/create' }), BODY);
    let p = unique('/shopify', 'tampered');
    expectRefused(await post(p, BODY.replace('\r\n', '\n'), { 'x-shopify-hmac-sha256': sig(BODY) }), 'shopify', /x-shopify-hmac-sha256 does not match/, p);
    p = unique('/shopify', 'wrong');
    expectRefused(await post(p, BODY, { 'x-shopify-hmac-sha256': sig(BODY, 'shpss_other') }), 'shopify', /does not match/, p);
    p = unique('/shopify', 'hex');
    // The right MAC, but hex: Shopify sends base64.
    expectRefused(await post(p, BODY, { 'x-shopify-hmac-sha256': hmac('sha256', secret, BODY).toString('hex') }), 'shopify', /does not match/, p);
  });

  it('gitlab: X-Gitlab-Token carries the secret token (GitLab signs nothing; the body is not covered)', async () => {
    const token = `glwt-${randomBytes(12).toString('hex')}`;
    await route('/gitlab', 'gitlab', token);
    expectDelivered(await post(unique('/gitlab', 'ok'), BODY, { 'x-gitlab-token': token, 'x-gitlab-event': 'Push Hook' }), BODY);
    let p = unique('/gitlab', 'wrong');
    expectRefused(await post(p, BODY, { 'x-gitlab-token': `${token}x` }), 'gitlab', /x-gitlab-token does not match/, p);
    p = unique('/gitlab', 'prefix');
    expectRefused(await post(p, BODY, { 'x-gitlab-token': token.slice(0, -1) }), 'gitlab', /does not match/, p);
    p = unique('/gitlab', 'missing');
    expectRefused(await post(p, BODY, {}), 'gitlab', /missing x-gitlab-token header/, p);
  });

  it('sendgrid: ECDSA P-256/SHA-256 signature (base64 DER) of "<timestamp><body>", the secret being the base64 public key', async () => {
    const { publicKey, privateKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
    const other = generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey;
    await route('/sendgrid', 'sendgrid', publicKey.export({ type: 'spki', format: 'der' }).toString('base64'));
    const headers = (ts: string, body = BODY, key = privateKey) => ({
      'x-twilio-email-event-webhook-timestamp': ts,
      'x-twilio-email-event-webhook-signature': sign('sha256', Buffer.from(ts + body, 'utf8'), { key, dsaEncoding: 'der' }).toString('base64'),
    });
    expectDelivered(await post(unique('/sendgrid', 'ok'), BODY, headers(nowS())), BODY);
    let p = unique('/sendgrid', 'tampered');
    expectRefused(await post(p, BODY.replace('evt_', 'evt_x'), headers(nowS())), 'sendgrid', /X-Twilio-Email-Event-Webhook-Signature does not match/, p);
    p = unique('/sendgrid', 'wrong-key');
    expectRefused(await post(p, BODY, headers(nowS(), BODY, other)), 'sendgrid', /does not match/, p);
    p = unique('/sendgrid', 'stale');
    expectRefused(await post(p, BODY, headers(staleS())), 'sendgrid', /Timestamp: the timestamp is more than 5 minutes off/, p);
    p = unique('/sendgrid', 'unsigned');
    expectRefused(await post(p, BODY, {}), 'sendgrid', /missing X-Twilio-Email-Event-Webhook-Signature/, p);
  });

  it('sendgrid: the API refuses a secret that is not an ECDSA public key', async () => {
    const r = await c.api('POST', `/edges/https/${c.edgeId}/routes`, c.routeBody('/sendgrid-bad', { webhook_verification: { provider: 'sendgrid', secret: 'bm90IGEga2V5' } }));
    expect(r.status).toBe(400);
    expect(JSON.stringify(r.body)).toMatch(/the sendgrid secret must be the base64 ECDSA public verification key/);
  });

  it('svix: svix-signature v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>"> keyed with the base64 key after whsec_', async () => {
    const key = randomBytes(24);
    await route('/svix', 'svix', `whsec_${key.toString('base64')}`);
    const headers = (id: string, ts: string, body = BODY, k: Buffer = key) => ({ 'svix-id': id, 'svix-timestamp': ts, 'svix-signature': `v1,${hmac('sha256', k, `${id}.${ts}.${body}`).toString('base64')}` });
    expectDelivered(await post(unique('/svix', 'ok'), BODY, headers('msg_1', nowS())), BODY);
    // Several space-separated signatures (a key rotation): any v1 may match.
    const h = headers('msg_2', nowS());
    expectDelivered(await post(unique('/svix', 'rotation'), BODY, { ...h, 'svix-signature': `v1,${randomBytes(32).toString('base64')} ${h['svix-signature']}` }), BODY);
    // Standard Webhooks spell the headers webhook-*.
    const std = headers('msg_3', nowS());
    expectDelivered(await post(unique('/svix', 'standard'), BODY, { 'webhook-id': std['svix-id'], 'webhook-timestamp': std['svix-timestamp'], 'webhook-signature': std['svix-signature'] }), BODY);

    let p = unique('/svix', 'tampered');
    expectRefused(await post(p, `${BODY}x`, headers('msg_4', nowS())), 'svix', /svix-signature does not match/, p);
    p = unique('/svix', 'other-id');
    expectRefused(await post(p, BODY, { ...headers('msg_5', nowS()), 'svix-id': 'msg_6' }), 'svix', /svix-signature does not match/, p);
    p = unique('/svix', 'wrong-key');
    expectRefused(await post(p, BODY, headers('msg_7', nowS(), BODY, randomBytes(24))), 'svix', /does not match/, p);
    p = unique('/svix', 'stale');
    expectRefused(await post(p, BODY, headers('msg_8', staleS())), 'svix', /svix-timestamp: the timestamp is more than 5 minutes off/, p);
  });

  describe('sns', () => {
    let certServer: http.Server;
    let certPort: number;
    const certRequests: string[] = [];

    beforeAll(async () => {
      certServer = http.createServer((req, res) => {
        certRequests.push(req.url ?? '');
        res.writeHead(200, { 'content-type': 'application/x-pem-file' });
        res.end('-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n');
      });
      certPort = await new Promise<number>((r) => certServer.listen(0, '127.0.0.1', () => r((certServer.address() as { port: number }).port)));
      await route('/sns', 'sns');
    }, 30_000);

    afterAll(async () => {
      certServer?.closeAllConnections();
      await new Promise<void>((r) => (certServer ? certServer.close(() => r()) : r()));
    });

    const notification = (over: Record<string, string>) =>
      JSON.stringify({
        Type: 'Notification',
        MessageId: '22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324',
        TopicArn: 'arn:aws:sns:us-east-1:123456789012:e2e',
        Message: 'hello',
        Timestamp: new Date().toISOString(),
        SignatureVersion: '2',
        Signature: randomBytes(256).toString('base64'),
        SigningCertURL: 'https://sns.us-east-1.amazonaws.com/SimpleNotificationService-e2e.pem',
        ...over,
      });
    const postSns = (path: string, body: string) => post(path, body, { 'content-type': 'text/plain; charset=UTF-8', 'x-amz-sns-message-type': 'Notification' });

    it('the API takes sns without a secret and refuses one', async () => {
      const r = await c.api('POST', `/edges/https/${c.edgeId}/routes`, c.routeBody('/sns-secret', { webhook_verification: { provider: 'sns', secret: 'x' } }));
      expect(r.status).toBe(400);
      expect(JSON.stringify(r.body)).toMatch(/provider sns verifies with AWS certificates and takes no secret/);
    });

    it('never fetches a signing certificate from outside the SNS allow-list (a local URL is refused, not fetched)', async () => {
      for (const url of [`http://127.0.0.1:${certPort}/cert.pem`, `https://127.0.0.1:${certPort}/cert.pem`, `https://sns.us-east-1.amazonaws.com.127.0.0.1.nip.io:${certPort}/cert.pem`]) {
        const p = unique('/sns', 'local-cert');
        expectRefused(await postSns(p, notification({ SigningCertURL: url })), 'sns', /SigningCertURL is not an Amazon SNS certificate URL/, p);
      }
      expect(certRequests).toEqual([]);
    });

    it('refuses a message that is not SNS JSON, an unknown SignatureVersion, and one without a Signature', async () => {
      let p = unique('/sns', 'not-json');
      expectRefused(await postSns(p, 'Message=hello'), 'sns', /the body is not an SNS JSON message/, p);
      p = unique('/sns', 'version');
      expectRefused(await postSns(p, notification({ SignatureVersion: '3' })), 'sns', /unsupported SNS SignatureVersion/, p);
      p = unique('/sns', 'unsigned');
      expectRefused(await postSns(p, notification({ Signature: '' })), 'sns', /the SNS message has no Signature/, p);
    });
  });
});
