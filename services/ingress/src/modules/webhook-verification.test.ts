import { createHash, createHmac, generateKeyPairSync, sign } from 'node:crypto';
import { gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import type { Outcome } from '../pipeline/types.js';
import { createWebhookVerificationStage, SUPPORTED_WEBHOOK_PROVIDERS } from './webhook-verification.js';
import { makeState, stageFor } from './testing.js';

const NOW = 1_700_000_000_000;
const nowS = String(NOW / 1000);
const factory = createWebhookVerificationStage({ now: () => NOW, snsCertificateFetcher: async () => { throw new Error('offline'); } });

const hmac = (alg: string, key: string | Buffer, data: string | Buffer) => createHmac(alg, key).update(data);

interface Req {
  method?: string;
  headers?: string[];
  body?: string;
  url?: string;
  host?: string;
  scheme?: 'http' | 'https';
}

async function run(provider: string, secret: string, r: Req): Promise<Outcome> {
  const stage = stageFor(factory, { webhook_verification: { enabled: true, provider, secret } })!;
  expect(stage.needsBody).toBe(true);
  const state = makeState({ method: r.method ?? 'POST', url: r.url ?? '/hook', scheme: r.scheme ?? 'https', headers: ['Host', r.host ?? 'hooks.example.test', ...(r.headers ?? [])], body: r.body ?? '' });
  return stage.onRequest!(state);
}

async function expectOk(provider: string, secret: string, r: Req) {
  expect(await run(provider, secret, r)).toBeNull();
}

async function expectDenied(provider: string, secret: string, r: Req, reason?: RegExp) {
  const out = await run(provider, secret, r);
  expect(out).not.toBeNull();
  expect(out!.status).toBe(403);
  expect(out!.headers!['warren-error-code']).toBe('ERR_WARREN_7102');
  if (reason) expect(String(out!.body)).toMatch(reason);
}

const body = '{"event":"ping","n":1}';

describe('webhook_verification', () => {
  it('is absent when missing or disabled; refuses unsupported providers and missing secrets', () => {
    expect(stageFor(factory, {})).toBeNull();
    expect(stageFor(factory, { webhook_verification: { enabled: false, provider: 'github', secret: 's' } })).toBeNull();
    expect(() => stageFor(factory, { webhook_verification: { enabled: true, provider: 'vmware', secret: 's' } })).toThrow(/not supported/);
    expect(() => stageFor(factory, { webhook_verification: { enabled: true, provider: 'github', secret: '' } })).toThrow(/secret/);
    expect(stageFor(factory, { webhook_verification: { enabled: true, provider: 'GitHub', secret: 's' } })).not.toBeNull();
    expect(SUPPORTED_WEBHOOK_PROVIDERS).toContain('sns');
  });

  it('github: X-Hub-Signature-256', async () => {
    const sig = `sha256=${hmac('sha256', 'gh-secret', body).digest('hex')}`;
    await expectOk('github', 'gh-secret', { body, headers: ['X-Hub-Signature-256', sig] });
    await expectDenied('github', 'gh-secret', { body: body + ' ', headers: ['X-Hub-Signature-256', sig] }, /does not match/);
    await expectDenied('github', 'other', { body, headers: ['X-Hub-Signature-256', sig] });
    await expectDenied('github', 'gh-secret', { body }, /missing x-hub-signature-256/i);
    await expectDenied('github', 'gh-secret', { body, headers: ['X-Hub-Signature-256', sig.slice(7)] });
  });

  it('stripe: t=,v1= over t.body with 5 minute tolerance', async () => {
    const sigAt = (t: string) => `t=${t},v1=${hmac('sha256', 'whsec_stripe', `${t}.${body}`).digest('hex')},v0=abc`;
    await expectOk('stripe', 'whsec_stripe', { body, headers: ['Stripe-Signature', sigAt(nowS)] });
    await expectOk('stripe', 'whsec_stripe', { body, headers: ['Stripe-Signature', `t=${nowS},v1=${'0'.repeat(64)},${sigAt(nowS).split(',')[1]}`] });
    await expectDenied('stripe', 'whsec_stripe', { body, headers: ['Stripe-Signature', sigAt(String(NOW / 1000 - 301))] }, /5 minutes/);
    await expectDenied('stripe', 'whsec_stripe', { body: '{}', headers: ['Stripe-Signature', sigAt(nowS)] });
    await expectDenied('stripe', 'whsec_stripe', { body, headers: ['Stripe-Signature', `t=${nowS}`] });
    await expectDenied('stripe', 'whsec_stripe', { body });
  });

  it('slack: v0=HMAC over v0:ts:body with X-Slack-Request-Timestamp', async () => {
    const sig = (ts: string, b = body) => `v0=${hmac('sha256', 'slack-secret', `v0:${ts}:${b}`).digest('hex')}`;
    await expectOk('slack', 'slack-secret', { body, headers: ['X-Slack-Signature', sig(nowS), 'X-Slack-Request-Timestamp', nowS] });
    const old = String(NOW / 1000 - 600);
    await expectDenied('slack', 'slack-secret', { body, headers: ['X-Slack-Signature', sig(old), 'X-Slack-Request-Timestamp', old] }, /5 minutes/);
    await expectDenied('slack', 'slack-secret', { body, headers: ['X-Slack-Signature', sig(nowS)] });
    await expectDenied('slack', 'slack-secret', { body: 'x', headers: ['X-Slack-Signature', sig(nowS), 'X-Slack-Request-Timestamp', nowS] });
  });

  it('twilio: form params sorted after the full URL', async () => {
    const form = 'To=%2B15551234567&From=%2B15557654321&Body=Hello+world&MediaUrl=b&MediaUrl=a';
    const url = 'https://hooks.example.test/sms?x=1';
    // Computed independently: URL + each key (sorted) + its values (sorted).
    const data = `${url}BodyHello worldFrom+15557654321MediaUrlaMediaUrlbTo+15551234567`;
    const sig = hmac('sha1', 'twilio-token', data).digest('base64');
    const h = ['Content-Type', 'application/x-www-form-urlencoded', 'X-Twilio-Signature', sig];
    await expectOk('twilio', 'twilio-token', { url: '/sms?x=1', body: form, headers: h });
    // Twilio may sign with the default port spelled out.
    const withPort = hmac('sha1', 'twilio-token', data.replace('hooks.example.test', 'hooks.example.test:443')).digest('base64');
    await expectOk('twilio', 'twilio-token', { url: '/sms?x=1', body: form, headers: ['Content-Type', 'application/x-www-form-urlencoded', 'X-Twilio-Signature', withPort] });
    await expectDenied('twilio', 'twilio-token', { url: '/sms?x=2', body: form, headers: h });
    await expectDenied('twilio', 'twilio-token', { url: '/sms?x=1', body: form.replace('Hello', 'Hullo'), headers: h });
    await expectDenied('twilio', 'twilio-token', { url: '/sms?x=1', body: form }, /missing/i);
  });

  it('twilio and mailchimp: a URL-only signature does not carry a body that is not form-encoded, nor an Upgrade', async () => {
    // Twilio signs a GET callback's URL alone, with no timestamp: a captured one must not let a
    // JSON (or any other unsigned) body through to the upstream.
    const url = '/sms?From=%2B15551234567&Body=hi';
    const sig = hmac('sha1', 'twilio-token', `https://hooks.example.test${url}`).digest('base64');
    await expectOk('twilio', 'twilio-token', { method: 'GET', url, headers: ['X-Twilio-Signature', sig] });
    await expectOk('twilio', 'twilio-token', { url, headers: ['Content-Type', 'application/x-www-form-urlencoded', 'X-Twilio-Signature', sig] });
    for (const ct of [['Content-Type', 'application/json'], ['Content-Type', 'text/plain'], []]) {
      await expectDenied('twilio', 'twilio-token', { url, body: '{"admin":true}', headers: [...ct, 'X-Twilio-Signature', sig] }, /not form-encoded/);
    }
    await expectDenied('twilio', 'twilio-token', { method: 'GET', url, headers: ['X-Twilio-Signature', sig, 'Connection', 'Upgrade', 'Upgrade', 'websocket'] }, /Upgrade/);
    const md = hmac('sha1', 'md-key', 'https://hooks.example.test/mandrill').digest('base64');
    await expectDenied('mailchimp', 'md-key', { url: '/mandrill', body: '{"mandrill_events":"[]"}', headers: ['Content-Type', 'application/json', 'X-Mandrill-Signature', md] }, /not form-encoded/);
  });

  it('twilio: JSON bodies with bodySHA256', async () => {
    const sha = createHash('sha256').update(body).digest('hex');
    const path = `/voice?bodySHA256=${sha}`;
    const sig = hmac('sha1', 'twilio-token', `https://hooks.example.test${path}`).digest('base64');
    const h = ['Content-Type', 'application/json', 'X-Twilio-Signature', sig];
    await expectOk('twilio', 'twilio-token', { url: path, body, headers: h });
    await expectDenied('twilio', 'twilio-token', { url: path, body: '{"event":"other"}', headers: h }, /bodySHA256/);
  });

  it('shopify: base64 HMAC-SHA256 of the body', async () => {
    const sig = hmac('sha256', 'shpss_x', body).digest('base64');
    await expectOk('shopify', 'shpss_x', { body, headers: ['X-Shopify-Hmac-Sha256', sig] });
    await expectDenied('shopify', 'shpss_y', { body, headers: ['X-Shopify-Hmac-Sha256', sig] });
    await expectDenied('shopify', 'shpss_x', { body, headers: ['X-Shopify-Hmac-Sha256', 'not base64!'] });
  });

  it('gitlab: X-Gitlab-Token equals the secret', async () => {
    await expectOk('gitlab', 'gl-token', { body, headers: ['X-Gitlab-Token', 'gl-token'] });
    await expectDenied('gitlab', 'gl-token', { body, headers: ['X-Gitlab-Token', 'gl-token2'] });
    await expectDenied('gitlab', 'gl-token', { body });
  });

  it('sendgrid: ECDSA P-256 over timestamp + body', async () => {
    const { publicKey, privateKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
    const secret = publicKey.export({ type: 'spki', format: 'der' }).toString('base64');
    const sig = (ts: string, b = body) => sign('sha256', Buffer.from(ts + b), { key: privateKey, dsaEncoding: 'der' }).toString('base64');
    const h = (ts: string, s = sig(ts)) => ['X-Twilio-Email-Event-Webhook-Signature', s, 'X-Twilio-Email-Event-Webhook-Timestamp', ts];
    await expectOk('sendgrid', secret, { body, headers: h(nowS) });
    await expectDenied('sendgrid', secret, { body: '[]', headers: h(nowS) });
    const old = String(NOW / 1000 - 3600);
    await expectDenied('sendgrid', secret, { body, headers: h(old) }, /5 minutes/);
    await expectDenied('sendgrid', secret, { body });
    expect(() => stageFor(factory, { webhook_verification: { enabled: true, provider: 'sendgrid', secret: 'bm90IGEga2V5' } })).toThrow(/public/);
  });

  it('svix and clerk: svix-id/timestamp/signature with the whsec_ key', async () => {
    const key = Buffer.from('a-32-byte-secret-for-svix-tests!');
    const secret = `whsec_${key.toString('base64')}`;
    const sig = (id: string, ts: string, b = body) => `v1,${hmac('sha256', key, `${id}.${ts}.${b}`).digest('base64')}`;
    const h = (ts: string, s = sig('msg_1', ts)) => ['svix-id', 'msg_1', 'svix-timestamp', ts, 'svix-signature', `v1,bm9wZQ== ${s}`];
    await expectOk('svix', secret, { body, headers: h(nowS) });
    await expectOk('clerk', secret, { body, headers: h(nowS) });
    await expectOk('svix', secret, { body, headers: ['webhook-id', 'msg_1', 'webhook-timestamp', nowS, 'webhook-signature', sig('msg_1', nowS)] });
    await expectDenied('svix', secret, { body, headers: ['svix-id', 'msg_2', 'svix-timestamp', nowS, 'svix-signature', sig('msg_1', nowS)] });
    const old = String(NOW / 1000 - 400);
    await expectDenied('svix', secret, { body, headers: h(old) }, /5 minutes/);
    await expectDenied('svix', secret, { body, headers: ['svix-id', 'msg_1', 'svix-timestamp', nowS] });
  });

  describe('simple HMAC providers', () => {
    const cases: Array<{ provider: string; header: string; sign: (secret: string, b: string) => string }> = [
      { provider: 'bitbucket', header: 'X-Hub-Signature', sign: (s, b) => `sha256=${hmac('sha256', s, b).digest('hex')}` },
      { provider: 'intercom', header: 'X-Hub-Signature', sign: (s, b) => `sha1=${hmac('sha1', s, b).digest('hex')}` },
      { provider: 'heroku', header: 'Heroku-Webhook-Hmac-SHA256', sign: (s, b) => hmac('sha256', s, b).digest('base64') },
      { provider: 'xero', header: 'x-xero-signature', sign: (s, b) => hmac('sha256', s, b).digest('base64') },
      { provider: 'typeform', header: 'Typeform-Signature', sign: (s, b) => `sha256=${hmac('sha256', s, b).digest('base64')}` },
      { provider: 'linear', header: 'Linear-Signature', sign: (s, b) => hmac('sha256', s, b).digest('hex') },
      { provider: 'sentry', header: 'Sentry-Hook-Signature', sign: (s, b) => hmac('sha256', s, b).digest('hex') },
      { provider: 'launch_darkly', header: 'X-LD-Signature', sign: (s, b) => hmac('sha256', s, b).digest('hex') },
      { provider: 'terraform', header: 'X-TFE-Notification-Signature', sign: (s, b) => hmac('sha512', s, b).digest('hex') },
      { provider: 'pagerduty', header: 'X-PagerDuty-Signature', sign: (s, b) => `v1=${'ab'.repeat(32)},v1=${hmac('sha256', s, b).digest('hex')}` },
      { provider: 'mux', header: 'Mux-Signature', sign: (s, b) => `t=${nowS},v1=${hmac('sha256', s, `${nowS}.${b}`).digest('hex')}` },
      { provider: 'calendly', header: 'Calendly-Webhook-Signature', sign: (s, b) => `t=${nowS},v1=${hmac('sha256', s, `${nowS}.${b}`).digest('hex')}` },
    ];
    for (const c of cases) {
      it(c.provider, async () => {
        await expectOk(c.provider, 'sekret', { body, headers: [c.header, c.sign('sekret', body)] });
        await expectDenied(c.provider, 'sekret', { body, headers: [c.header, c.sign('wrong', body)] });
        await expectDenied(c.provider, 'sekret', { body: `${body}x`, headers: [c.header, c.sign('sekret', body)] });
        await expectDenied(c.provider, 'sekret', { body }, /missing/);
      });
    }

    it('zoom', async () => {
      const sig = `v0=${hmac('sha256', 'zm', `v0:${nowS}:${body}`).digest('hex')}`;
      await expectOk('zoom', 'zm', { body, headers: ['x-zm-signature', sig, 'x-zm-request-timestamp', nowS] });
      await expectDenied('zoom', 'zm', { body, headers: ['x-zm-signature', sig, 'x-zm-request-timestamp', String(NOW / 1000 + 1)] });
    });

    it('square (URL + body)', async () => {
      const sig = hmac('sha256', 'sq', `https://hooks.example.test/square${body}`).digest('base64');
      await expectOk('square', 'sq', { url: '/square', body, headers: ['x-square-hmacsha256-signature', sig] });
      await expectDenied('square', 'sq', { url: '/other', body, headers: ['x-square-hmacsha256-signature', sig] });
    });

    it('zendesk (ISO timestamp + body)', async () => {
      const ts = new Date(NOW).toISOString();
      const sig = hmac('sha256', 'zd', ts + body).digest('base64');
      await expectOk('zendesk', 'zd', { body, headers: ['X-Zendesk-Webhook-Signature', sig, 'X-Zendesk-Webhook-Signature-Timestamp', ts] });
      const old = new Date(NOW - 3_600_000).toISOString();
      await expectDenied('zendesk', 'zd', { body, headers: ['X-Zendesk-Webhook-Signature', hmac('sha256', 'zd', old + body).digest('base64'), 'X-Zendesk-Webhook-Signature-Timestamp', old] }, /5 minutes/);
    });
  });

  describe('body-HMAC providers (each signed as its documentation shows; sources beside PROVIDERS)', () => {
    const cases: Array<{ provider: string; header: string; sign: (secret: string, b: string) => string }> = [
      // aftership.com/docs/tracking/webhook/webhook-signature
      { provider: 'aftership', header: 'aftership-hmac-sha256', sign: (s, b) => hmac('sha256', s, b).digest('base64') },
      // docs.alchemy.com Notify API FAQ, "How do I validate the webhook event?"
      { provider: 'alchemy', header: 'X-Alchemy-Signature', sign: (s, b) => hmac('sha256', s, b).digest('hex') },
      // aps.autodesk.com/en/docs/webhooks/v1/tutorials/how-to-verify-payload-signature
      { provider: 'autodesk', header: 'x-adsk-signature', sign: (s, b) => `sha1hash=${hmac('sha1', s, b).digest('hex')}` },
      // help.bolt.com/developers/webhooks/hook-verification
      { provider: 'bolt', header: 'X-Bolt-Hmac-Sha256', sign: (s, b) => hmac('sha256', s, b).digest('base64') },
      // castle/castle-ruby lib/castle/webhooks/verify.rb
      { provider: 'castle', header: 'X-Castle-Signature', sign: (s, b) => hmac('sha256', s, b).digest('base64') },
      // Maxio/Chargify webhook signature (hex HMAC-SHA256 of the body with the shared key)
      { provider: 'chargify', header: 'X-Chargify-Webhook-Signature-Hmac-Sha-256', sign: (s, b) => hmac('sha256', s, b).digest('hex') },
      // circleci.com/docs/webhooks: circleci-signature: v1=<hex>
      { provider: 'circleci', header: 'circleci-signature', sign: (s, b) => `v1=${hmac('sha256', s, b).digest('hex')}` },
      // clearbit/clearbit-ruby lib/clearbit/webhook_signature.rb
      { provider: 'clearbit', header: 'X-Request-Signature', sign: (s, b) => `sha1=${hmac('sha1', s, b).digest('hex')}` },
      // coinbase/coinbase-commerce-node lib/Webhook.js
      { provider: 'coinbase', header: 'X-CC-Webhook-Signature', sign: (s, b) => hmac('sha256', s, b).digest('hex') },
      // developer.atlassian.com, Jira webhooks with a secret: X-Hub-Signature: sha256=<hex>
      { provider: 'jira', header: 'X-Hub-Signature', sign: (s, b) => `sha256=${hmac('sha256', s, b).digest('hex')}` },
      // docs.moderntreasury.com, verifying webhook signatures
      { provider: 'modern_treasury', header: 'X-Signature', sign: (s, b) => hmac('sha256', s, b).digest('hex') },
      // mongodb.com/docs/atlas/tutorial/webhook-integration: base64 HMAC-SHA-1 of the body
      { provider: 'mongodb', header: 'X-MMS-Signature', sign: (s, b) => hmac('sha1', s, b).digest('base64') },
      // pusher/pusher-http-go Webhook (X-Pusher-Signature, hex HMAC-SHA256 with the app secret)
      { provider: 'pusher', header: 'X-Pusher-Signature', sign: (s, b) => hmac('sha256', s, b).digest('hex') },
      // help.sonatype.com/repomanager3/integrations/webhooks/working-with-hmac-payloads
      { provider: 'sonatype', header: 'X-Nexus-Webhook-Signature', sign: (s, b) => hmac('sha1', s, b).digest('hex') },
      // developer.webex.com/docs/webhooks, X-Spark-Signature (HMAC-SHA1)
      { provider: 'webex', header: 'X-Spark-Signature', sign: (s, b) => hmac('sha1', s, b).digest('hex') },
      // docs.connect.worldline-solutions.com/documentation/webhooks: X-GCS-Signature
      { provider: 'worldline', header: 'X-GCS-Signature', sign: (s, b) => hmac('sha256', s, b).digest('base64') },
      // docs.fastly.com/signalsciences/integrations/generic-webhooks: X-SigSci-Signature, hex HMAC-SHA256 of the payload
      { provider: 'signal_sciences', header: 'X-SigSci-Signature', sign: (s, b) => hmac('sha256', s, b).digest('hex') },
      // cloudone.trendmicro.com/docs/conformity/webhook-communication: X-Conformity-Signature, HMAC hexdigest (sha-256)
      { provider: 'trendmicro_conformity', header: 'X-Conformity-Signature', sign: (s, b) => hmac('sha256', s, b).digest('hex') },
      // developers.facebook.com/docs/graph-api/webhooks/getting-started, "Validate payloads"
      ...['facebook_graph_api', 'facebook_messenger', 'instagram', 'whatsapp'].map((provider) => ({
        provider,
        header: 'X-Hub-Signature-256',
        sign: (s: string, b: string) => `sha256=${hmac('sha256', s, b).digest('hex')}`,
      })),
      // www.dropbox.com/developers/reference/webhooks
      { provider: 'dropbox', header: 'X-Dropbox-Signature', sign: (s, b) => hmac('sha256', s, b).digest('hex') },
      // developer.x.com Account Activity API, "Securing webhooks"
      { provider: 'twitter', header: 'x-twitter-webhooks-signature', sign: (s, b) => `sha256=${hmac('sha256', s, b).digest('base64')}` },
    ];
    for (const c of cases) {
      it(c.provider, async () => {
        await expectOk(c.provider, 'sekret', { body, headers: [c.header, c.sign('sekret', body)] });
        await expectDenied(c.provider, 'sekret', { body, headers: [c.header, c.sign('wrong', body)] }, /does not match|must start/);
        await expectDenied(c.provider, 'sekret', { body: `${body}x`, headers: [c.header, c.sign('sekret', body)] }, /does not match/);
        await expectDenied(c.provider, 'sekret', { body }, /missing/);
        expect(SUPPORTED_WEBHOOK_PROVIDERS).toContain(c.provider);
      });
    }
  });

  describe('timestamped providers', () => {
    const old = String(NOW / 1000 - 301);

    it('tiktok: TikTok-Signature t=,s= over t.body (developers.tiktok.com/doc/webhooks-verification)', async () => {
      const sig = (t: string, b = body) => `t=${t},s=${hmac('sha256', 'tt-secret', `${t}.${b}`).digest('hex')}`;
      await expectOk('tiktok', 'tt-secret', { body, headers: ['TikTok-Signature', sig(nowS)] });
      await expectDenied('tiktok', 'tt-secret', { body: '{}', headers: ['TikTok-Signature', sig(nowS)] }, /does not match/);
      await expectDenied('tiktok', 'tt-secret', { body, headers: ['TikTok-Signature', sig(old)] }, /5 minutes/);
      await expectDenied('tiktok', 'tt-secret', { body }, /missing/);
    });

    it('buildkite: X-Buildkite-Signature timestamp=,signature= over ts.body, or X-Buildkite-Token (buildkite.com/docs/apis/webhooks)', async () => {
      const sig = (t: string, b = body) => `timestamp=${t},signature=${hmac('sha256', 'bk-token', `${t}.${b}`).digest('hex')}`;
      await expectOk('buildkite', 'bk-token', { body, headers: ['X-Buildkite-Signature', sig(nowS)] });
      await expectDenied('buildkite', 'bk-token', { body: '{}', headers: ['X-Buildkite-Signature', sig(nowS)] }, /does not match/);
      await expectDenied('buildkite', 'bk-token', { body, headers: ['X-Buildkite-Signature', sig(old)] }, /5 minutes/);
      await expectDenied('buildkite', 'bk-token', { body }, /missing x-buildkite-signature/i);
      await expectOk('buildkite', 'bk-token', { body, headers: ['X-Buildkite-Token', 'bk-token'] });
      await expectDenied('buildkite', 'bk-token', { body, headers: ['X-Buildkite-Token', 'bk-other'] }, /does not match/);
    });

    it('frameio: X-Frameio-Signature v0= over v0:ts:body (developer.frame.io, verifying webhook signatures)', async () => {
      const sig = (t: string, b = body) => `v0=${hmac('sha256', 'fio', `v0:${t}:${b}`).digest('hex')}`;
      const h = (t: string, s = sig(t)) => ['X-Frameio-Signature', s, 'X-Frameio-Request-Timestamp', t];
      await expectOk('frameio', 'fio', { body, headers: h(nowS) });
      await expectDenied('frameio', 'fio', { body: '{}', headers: h(nowS) }, /does not match/);
      await expectDenied('frameio', 'fio', { body, headers: h(old) }, /5 minutes/);
      await expectDenied('frameio', 'fio', { body, headers: ['X-Frameio-Request-Timestamp', nowS] }, /missing/);
    });

    it('airship: X-UA-Signature hex over ts:body, gzip bodies signed as JSON (support.airship.com, Open Channel Signature Hash)', async () => {
      const sig = (t: string, b = body) => hmac('sha256', 'ua-secret', `${t}:${b}`).digest('hex');
      const h = (t: string, s = sig(t)) => ['X-UA-Signature', s, 'X-UA-Timestamp', t];
      await expectOk('airship', 'ua-secret', { body, headers: h(nowS) });
      await expectDenied('airship', 'ua-secret', { body: '{}', headers: h(nowS) }, /does not match/);
      await expectDenied('airship', 'ua-secret', { body, headers: h(old) }, /5 minutes/);
      await expectDenied('airship', 'ua-secret', { body, headers: ['X-UA-Timestamp', nowS] }, /missing/);
      const stage = stageFor(factory, { webhook_verification: { enabled: true, provider: 'airship', secret: 'ua-secret' } })!;
      const gz = makeState({ method: 'POST', url: '/push', headers: ['Host', 'hooks.example.test', 'Content-Encoding', 'gzip', ...h(nowS)], body: gzipSync(body) });
      expect(await stage.onRequest!(gz)).toBeNull();
    });

    it('box: BOX-SIGNATURE-PRIMARY/SECONDARY base64 over body + BOX-DELIVERY-TIMESTAMP, 10 minutes (developer.box.com/guides/webhooks/v2/signatures-v2)', async () => {
      const ts = (ms: number) => new Date(ms).toISOString().replace(/\.\d{3}Z$/, '-00:00');
      const sig = (key: string, t: string, b = body) => createHmac('sha256', key).update(b).update(t).digest('base64');
      const h = (t: string, primary = sig('primary-key', t), secondary = sig('secondary-key', t)) => [
        'BOX-SIGNATURE-PRIMARY', primary, 'BOX-SIGNATURE-SECONDARY', secondary, 'BOX-SIGNATURE-VERSION', '1', 'BOX-SIGNATURE-ALGORITHM', 'HmacSHA256', 'BOX-DELIVERY-TIMESTAMP', t,
      ];
      const t = ts(NOW - 60_000);
      await expectOk('box', 'primary-key', { body, headers: h(t) });
      await expectOk('box', 'secondary-key', { body, headers: h(t) });
      await expectOk('box', 'primary-key', { body, headers: h(ts(NOW - 9 * 60_000)) });
      await expectDenied('box', 'primary-key', { body: '{}', headers: h(t) }, /does not match/);
      await expectDenied('box', 'primary-key', { body, headers: h(ts(NOW - 11 * 60_000)) }, /10 minutes/);
      await expectDenied('box', 'primary-key', { body, headers: ['BOX-DELIVERY-TIMESTAMP', t] }, /missing/);
    });

    it('hubspot: X-HubSpot-Signature-v3 over method+uri+body+timestamp (developers.hubspot.com/docs/api/webhooks/validating-requests)', async () => {
      const url = '/hubspot?portal=1&redirect=https%3A%2F%2Fx.test';
      const signedUri = 'https://hooks.example.test/hubspot?portal=1&redirect=https://x.test';
      const sig = (t: string, b = body) => hmac('sha256', 'hs-client-secret', `POST${signedUri}${b}${t}`).digest('base64');
      const nowMs = String(NOW);
      const h = (t: string, s = sig(t)) => ['X-HubSpot-Signature-v3', s, 'X-HubSpot-Request-Timestamp', t];
      await expectOk('hubspot', 'hs-client-secret', { url, body, headers: h(nowMs) });
      await expectDenied('hubspot', 'hs-client-secret', { url, body: '[]', headers: h(nowMs) }, /does not match/);
      await expectDenied('hubspot', 'hs-client-secret', { url: '/other', body, headers: h(nowMs) }, /does not match/);
      await expectDenied('hubspot', 'hs-client-secret', { url, body, headers: h(String(NOW - 301_000)) }, /5 minutes/);
      await expectDenied('hubspot', 'hs-client-secret', { url, body, headers: ['X-HubSpot-Signature', 'abc', 'X-HubSpot-Request-Timestamp', nowMs] }, /missing X-HubSpot-Signature-v3/);
    });

    it('contentful: canonical method/path/signed headers/body, hex (@contentful/node-apps-toolkit verifyRequest)', async () => {
      const ts = String(NOW - 1000);
      // Built independently: the signed headers sorted, name:value joined by ';', signed-headers re-listed.
      const signedList = 'content-type,x-contentful-signed-headers,x-contentful-timestamp,x-contentful-topic';
      const canonical = (path: string, b: string, t = ts) =>
        `POST\n${path}\ncontent-type:application/json;x-contentful-signed-headers:${signedList};x-contentful-timestamp:${t};x-contentful-topic:ContentManagement.Entry.publish\n${b}`;
      const sig = (path: string, b = body, t = ts) => hmac('sha256', 'cf-secret', canonical(path, b, t)).digest('hex');
      const h = (s: string, t = ts) => [
        'Content-Type', 'application/json', 'X-Contentful-Topic', 'ContentManagement.Entry.publish', 'x-contentful-signed-headers', 'x-contentful-topic,content-type,x-contentful-signed-headers,x-contentful-timestamp', 'x-contentful-timestamp', t, 'x-contentful-signature', s, 'X-Unsigned', 'anything',
      ];
      await expectOk('contentful', 'cf-secret', { url: '/cf', body, headers: h(sig('/cf')) });
      // The query is escaped (querystring.escape) and the whole path URI-encoded.
      await expectOk('contentful', 'cf-secret', { url: '/cf?a=1&b=2', body, headers: h(sig('/cf?a%253D1%2526b%253D2')) });
      await expectDenied('contentful', 'cf-secret', { url: '/cf', body: '{}', headers: h(sig('/cf')) }, /does not match/);
      await expectDenied('contentful', 'cf-secret', { url: '/other', body, headers: h(sig('/cf')) }, /does not match/);
      const old = String(NOW - 301_000);
      await expectDenied('contentful', 'cf-secret', { url: '/cf', body, headers: h(sig('/cf', body, old), old) }, /5 minutes/);
      await expectDenied('contentful', 'cf-secret', { url: '/cf', body, headers: ['x-contentful-timestamp', ts] }, /missing/);
    });

    it('mailgun: signature over timestamp+token in the JSON or form body (documentation.mailgun.com, Securing Webhooks)', async () => {
      const sig = (t: string, token: string, key = 'mg-key') => hmac('sha256', key, t + token).digest('hex');
      const json = (t: string, s = sig(t, 'tok123'), extra = {}) => JSON.stringify({ signature: { timestamp: t, token: 'tok123', signature: s, ...extra }, 'event-data': { event: 'delivered' } });
      const jh = ['Content-Type', 'application/json'];
      await expectOk('mailgun', 'mg-key', { body: json(nowS), headers: jh });
      await expectOk('mailgun', 'mg-parent', { body: json(nowS, sig(nowS, 'tok123', 'mg-sub'), { 'parent-signature': sig(nowS, 'tok123', 'mg-parent') }), headers: jh });
      await expectDenied('mailgun', 'mg-key', { body: json(nowS).replace('tok123', 'tok124'), headers: jh }, /does not match/);
      await expectDenied('mailgun', 'mg-key', { body: json(old), headers: jh }, /5 minutes/);
      await expectDenied('mailgun', 'mg-key', { body: JSON.stringify({ 'event-data': {} }), headers: jh }, /missing signature/);
      const form = `timestamp=${nowS}&token=tok9&signature=${sig(nowS, 'tok9')}&recipient=a%40b.test`;
      const fh = ['Content-Type', 'application/x-www-form-urlencoded'];
      await expectOk('mailgun', 'mg-key', { body: form, headers: fh });
      await expectDenied('mailgun', 'mg-key', { body: form.replace('tok9', 'tok8'), headers: fh }, /does not match/);
    });
  });

  describe('request-shaped providers', () => {
    it('mailchimp (Mandrill): X-Mandrill-Signature over URL + sorted fields; HEAD check answered (mailchimp.com/developer/transactional, Authenticating webhook requests)', async () => {
      const events = '[{"event":"send","_id":"abc"}]';
      const form = `mandrill_events=${encodeURIComponent(events)}`;
      const sig = hmac('sha1', 'md-key', `https://hooks.example.test/mandrill?x=1mandrill_events${events}`).digest('base64');
      const h = ['Content-Type', 'application/x-www-form-urlencoded', 'X-Mandrill-Signature', sig];
      await expectOk('mailchimp', 'md-key', { url: '/mandrill?x=1', body: form, headers: h });
      await expectDenied('mailchimp', 'md-key', { url: '/mandrill?x=1', body: form.replace('send', 'open'), headers: h }, /does not match/);
      await expectDenied('mailchimp', 'md-key', { url: '/mandrill?x=2', body: form, headers: h }, /does not match/);
      await expectDenied('mailchimp', 'md-key', { url: '/mandrill?x=1', body: form, headers: ['Content-Type', 'application/x-www-form-urlencoded'] }, /missing/);
      const head = await run('mailchimp', 'md-key', { method: 'HEAD', url: '/mandrill' });
      expect(head?.status).toBe(200);
    });

    it('docusign: X-DocuSign-Signature-<n>, one per HMAC key (docusign.com/blog/developers, manually authenticating HMAC signatures)', async () => {
      const sig = (key: string, b = body) => hmac('sha256', key, b).digest('base64');
      const h = ['X-DocuSign-Signature-1', sig('key-one'), 'X-DocuSign-Signature-2', sig('key-two')];
      await expectOk('docusign', 'key-one', { body, headers: h });
      await expectOk('docusign', 'key-two', { body, headers: h });
      await expectDenied('docusign', 'key-three', { body, headers: h }, /does not match/);
      await expectDenied('docusign', 'key-one', { body: '<xml/>', headers: h }, /does not match/);
      await expectDenied('docusign', 'key-one', { body }, /missing/);
    });

    it('microsoft_teams: Authorization: HMAC <base64> keyed with the base64 security token (learn.microsoft.com, add outgoing webhook)', async () => {
      const key = Buffer.from('teams-security-token-32-bytes!!!');
      const secret = key.toString('base64');
      const h = (b = body) => ['Authorization', `HMAC ${hmac('sha256', key, b).digest('base64')}`];
      await expectOk('microsoft_teams', secret, { body, headers: h() });
      await expectDenied('microsoft_teams', secret, { body: '{}', headers: h() }, /does not match/);
      await expectDenied('microsoft_teams', secret, { body, headers: ['Authorization', 'Bearer x'] }, /HMAC/);
      await expectDenied('microsoft_teams', secret, { body }, /missing Authorization/);
      expect(() => stageFor(factory, { webhook_verification: { enabled: true, provider: 'microsoft_teams', secret: '!!!' } })).toThrow(/base64/);
    });

    it('brex: Standard Webhooks webhook-* headers, base64 secret without whsec_ (developer.brex.com/docs/webhooks)', async () => {
      const key = Buffer.from('brex-signing-secret-bytes');
      const sig = (ts: string, b = body) => `v1,${hmac('sha256', key, `msg_9.${ts}.${b}`).digest('base64')}`;
      const h = (ts: string) => ['Webhook-Id', 'msg_9', 'Webhook-Timestamp', ts, 'Webhook-Signature', sig(ts)];
      await expectOk('brex', key.toString('base64'), { body, headers: h(nowS) });
      await expectDenied('brex', key.toString('base64'), { body: '{}', headers: h(nowS) }, /does not match/);
      await expectDenied('brex', key.toString('base64'), { body, headers: h(String(NOW / 1000 - 600)) }, /5 minutes/);
      await expectDenied('brex', key.toString('base64'), { body }, /missing/);
    });
  });

  describe('providers signed as their SDKs or documentation sign (sources beside each verifier)', () => {
    const old = String(NOW / 1000 - 301);
    const hex = (key: string, data: string | Buffer) => hmac('sha256', key, data).digest('hex');

    it('go1: Go1-Signature t=,v1= over t.body (go1com/webhook-verifier-js createSignature)', async () => {
      const sig = (t: string, b = body, version = 'v1') => `t=${t},${version}=${hex('go1-shared-secret', `${t}.${b}`)}`;
      await expectOk('go1', 'go1-shared-secret', { body, headers: ['Go1-Signature', sig(nowS)] });
      await expectDenied('go1', 'go1-shared-secret', { body: '{"type":"user.create"}', headers: ['Go1-Signature', sig(nowS)] }, /does not match/);
      await expectDenied('go1', 'go1-shared-secret', { body, headers: ['Go1-Signature', sig(old)] }, /5 minutes/);
      await expectDenied('go1', 'go1-shared-secret', { body, headers: ['Go1-Signature', sig(nowS, body, 'v2')] }, /lacks/);
      await expectDenied('go1', 'go1-shared-secret', { body }, /missing go1-signature/i);
    });

    it('hostedhooks: t=,s= over t.body, the HTTP_HOSTEDHOOKS_SIGNATURE header (docs.hostedhooks.com, webhook signatures)', async () => {
      const sig = (t: string, b = body) => `t=${t},s=${hex('hh-endpoint-secret', `${t}.${b}`)}`;
      await expectOk('hostedhooks', 'hh-endpoint-secret', { body, headers: ['HostedHooks-Signature', sig(nowS)] });
      await expectOk('hostedhooks', 'hh-endpoint-secret', { body, headers: ['Hostedhooks_Signature', sig(nowS)] });
      await expectDenied('hostedhooks', 'hh-endpoint-secret', { body: '{}', headers: ['HostedHooks-Signature', sig(nowS)] }, /does not match/);
      await expectDenied('hostedhooks', 'hh-other-secret', { body, headers: ['HostedHooks-Signature', sig(nowS)] }, /does not match/);
      await expectDenied('hostedhooks', 'hh-endpoint-secret', { body, headers: ['HostedHooks-Signature', sig(old)] }, /5 minutes/);
      await expectDenied('hostedhooks', 'hh-endpoint-secret', { body }, /missing/);
    });

    it('orb: X-Orb-Signature v1= over v1:<ISO timestamp>:body (orbcorp/orb-node webhooks.verifySignature)', async () => {
      // Orb's timestamp is ISO 8601 and may omit the offset (UTC).
      const iso = (ms: number, offset = '') => new Date(ms).toISOString().replace('Z', '') + offset;
      const sig = (ts: string, b = body, key = 'orb-webhook-secret') => `v1=${hex(key, `v1:${ts}:${b}`)}`;
      const h = (ts: string, s = sig(ts)) => ['X-Orb-Timestamp', ts, 'X-Orb-Signature', s];
      const ts = iso(NOW - 1000);
      await expectOk('orb', 'orb-webhook-secret', { body, headers: h(ts) });
      await expectOk('orb', 'orb-webhook-secret', { body, headers: h(iso(NOW, '+00:00')) });
      // Several signatures, space-separated (secret rotation); only v1= entries count.
      await expectOk('orb', 'orb-webhook-secret', { body, headers: h(ts, `v0=${'ab'.repeat(32)} ${sig(ts, body, 'old-secret')} ${sig(ts)}`) });
      await expectDenied('orb', 'orb-webhook-secret', { body, headers: h(ts, sig(ts, body, 'old-secret')) }, /does not match/);
      await expectDenied('orb', 'orb-webhook-secret', { body: '{"type":"invoice.issued"}', headers: h(ts) }, /does not match/);
      await expectDenied('orb', 'orb-webhook-secret', { body, headers: h(iso(NOW - 6 * 60_000)) }, /5 minutes/);
      await expectDenied('orb', 'orb-webhook-secret', { body, headers: h(iso(NOW + 6 * 60_000)) }, /5 minutes/);
      await expectDenied('orb', 'orb-webhook-secret', { body, headers: h('yesterday') }, /malformed/);
      await expectDenied('orb', 'orb-webhook-secret', { body, headers: ['X-Orb-Timestamp', ts] }, /missing X-Orb-Signature/);
    });

    it('pinwheel: x-pinwheel-signature v2= over v2:<x-timestamp>:body (docs.pinwheelapi.com, webhook signature verification)', async () => {
      const sig = (t: string, b = body) => `v2=${hex('pinwheel-api-secret', `v2:${t}:${b}`)}`;
      const h = (t: string, s = sig(t)) => ['x-pinwheel-signature', s, 'x-timestamp', t];
      await expectOk('pinwheel', 'pinwheel-api-secret', { body, headers: h(nowS) });
      await expectOk('pinwheel', 'pinwheel-api-secret', { body, headers: h(String(NOW - 2000)) });
      await expectDenied('pinwheel', 'pinwheel-api-secret', { body: '{"event":"paystubs.added"}', headers: h(nowS) }, /does not match/);
      await expectDenied('pinwheel', 'pinwheel-api-secret', { body, headers: h(old) }, /5 minutes/);
      await expectDenied('pinwheel', 'pinwheel-api-secret', { body, headers: h('not-a-time') }, /malformed/);
      await expectDenied('pinwheel', 'pinwheel-api-secret', { body, headers: h(nowS, sig(nowS).replace('v2=', 'v1=')) }, /v2=/);
      await expectDenied('pinwheel', 'pinwheel-api-secret', { body, headers: ['x-timestamp', nowS] }, /missing X-Pinwheel-Signature/);
    });

    it('graphcms (Hygraph): gcms-signature sign=,env=,t= over the JSON envelope (hygraph/hygraph-utils generateWebhookSignature)', async () => {
      // Built as Hygraph's own generator builds it: JSON.stringify({Body, EnvironmentName, TimeStamp}), then &, <, > as \\u00XX.
      const envelope = (raw: string, env: string, t: number) =>
        JSON.stringify({ Body: raw, EnvironmentName: env, TimeStamp: t }).split('&').join('\\\\u0026').split('<').join('\\\\u003c').split('>').join('\\\\u003e');
      const sig = (raw: string, env = 'master', t = NOW - 1500, key = 'hygraph-secret') =>
        `sign=${hmac('sha256', key, envelope(raw, env, t)).digest('base64')}, env=${env}, t=${t}`;
      const html = '{"operation":"publish","data":{"title":"<b>Tom & Jerry</b>"}}';
      await expectOk('graphcms', 'hygraph-secret', { body, headers: ['gcms-signature', sig(body)] });
      await expectOk('graphcms', 'hygraph-secret', { body: html, headers: ['gcms-signature', sig(html, 'staging')] });
      await expectDenied('graphcms', 'hygraph-secret', { body: html.replace('Tom', 'Tim'), headers: ['gcms-signature', sig(html)] }, /does not match/);
      await expectDenied('graphcms', 'hygraph-secret', { body, headers: ['gcms-signature', sig(body).replace('env=master', 'env=staging')] }, /does not match/);
      await expectDenied('graphcms', 'hygraph-secret', { body, headers: ['gcms-signature', sig(body, 'master', NOW - 301_000)] }, /5 minutes/);
      await expectDenied('graphcms', 'hygraph-secret', { body, headers: ['gcms-signature', sig(body, 'master', NOW, 'other')] }, /does not match/);
      await expectDenied('graphcms', 'hygraph-secret', { body, headers: ['gcms-signature', 'sign=abc'] }, /lacks/);
      await expectDenied('graphcms', 'hygraph-secret', { body }, /missing gcms-signature/);
    });

    describe('plivo: X-Plivo-Signature-V3 over the URL, sorted query and form fields, and nonce (plivo/plivo-python signature_v3.validate_v3_signature)', () => {
      const token = 'plivo-auth-token';
      const nonce = '05429567804466091622';
      const sign = (data: string, key = token) => hmac('sha256', key, Buffer.from(data, 'utf8')).digest('base64');
      const form = ['Content-Type', 'application/x-www-form-urlencoded'];
      const call = 'To=%2B15557654321&From=%2B15551234567&CallUUID=a1b2&Digits=';

      it('POST with a query: <url>?<sorted query>.<name><value>… .<nonce>', async () => {
        // Written out by hand from the SDK's rules: query decoded and sorted, then ".", then the form fields sorted, no separators.
        const sig = sign(`https://hooks.example.test/answer?a=1&b=x y.CallUUIDa1b2DigitsFrom+15551234567To+15557654321.${nonce}`);
        const h = [...form, 'X-Plivo-Signature-V3', sig, 'X-Plivo-Signature-V3-Nonce', nonce];
        await expectOk('plivo', token, { url: '/answer?b=x%20y&a=1', body: call, headers: h });
        await expectDenied('plivo', token, { url: '/answer?b=x%20y&a=1', body: call.replace('a1b2', 'a1b3'), headers: h }, /does not match/);
        await expectDenied('plivo', token, { url: '/answer?b=x%20y&a=2', body: call, headers: h }, /does not match/);
        await expectDenied('plivo', token, { url: '/answer?b=x%20y&a=1', body: call, headers: [...form, 'X-Plivo-Signature-V3', sig, 'X-Plivo-Signature-V3-Nonce', '1'] }, /does not match/);
        await expectDenied('plivo', 'other-token', { url: '/answer?b=x%20y&a=1', body: call, headers: h }, /does not match/);
      });

      it('POST without a query, several signatures, the main-account header', async () => {
        const sig = sign(`https://hooks.example.test/answer?CallUUIDa1b2DigitsFrom+15551234567To+15557654321.${nonce}`);
        await expectOk('plivo', token, { url: '/answer', body: call, headers: [...form, 'X-Plivo-Signature-V3', `bm9wZQ==,${sig}`, 'X-Plivo-Signature-V3-Nonce', nonce] });
        const ma = sign(`https://hooks.example.test/answer?CallUUIDa1b2DigitsFrom+15551234567To+15557654321.${nonce}`, 'main-account-token');
        const h = [...form, 'X-Plivo-Signature-V3', sign('unrelated'), 'X-Plivo-Signature-Ma-V3', ma, 'X-Plivo-Signature-V3-Nonce', nonce];
        await expectOk('plivo', 'main-account-token', { url: '/answer', body: call, headers: h });
        await expectDenied('plivo', token, { url: '/answer', body: call, headers: h }, /does not match/);
      });

      it('GET: the query alone; no query: the bare URL', async () => {
        await expectOk('plivo', token, { method: 'GET', url: '/hangup?z=9&a=1&a=0', headers: ['X-Plivo-Signature-V3', sign(`https://hooks.example.test/hangup?a=0&a=1&z=9.${nonce}`), 'X-Plivo-Signature-V3-Nonce', nonce] });
        await expectOk('plivo', token, { method: 'GET', url: '/hangup', headers: ['X-Plivo-Signature-V3', sign(`https://hooks.example.test/hangup.${nonce}`), 'X-Plivo-Signature-V3-Nonce', nonce] });
        await expectDenied('plivo', token, { method: 'GET', url: '/hangup?z=8', headers: ['X-Plivo-Signature-V3', sign(`https://hooks.example.test/hangup?z=9.${nonce}`), 'X-Plivo-Signature-V3-Nonce', nonce] }, /does not match/);
      });

      it('non-ASCII fields: the UTF-8 text (plivo-node) or its re-encoding (plivo-python)', async () => {
        const url = '/sms?name=Jose%20M&a=1';
        const text = 'From=%2B15551234567&Text=' + encodeURIComponent('olé ✓');
        // Computed with the Python SDK's byte handling (bytes URL, each byte read as a character, re-encoded to UTF-8).
        const python = 'XDj038HCP6LJ6WLgKiPbPz2nS4MheaMmb0MTnSku9V0=';
        const node = sign(`https://hooks.example.test/sms?a=1&name=Jose M.From+15551234567Textolé ✓.${nonce}`);
        expect(node).toBe('cvsloDotfasF0OjY9bZcEJZY2+DH2PHMIB7sgkjNYS4=');
        for (const sig of [python, node]) await expectOk('plivo', token, { url, body: text, headers: [...form, 'X-Plivo-Signature-V3', sig, 'X-Plivo-Signature-V3-Nonce', nonce] });
        await expectDenied('plivo', token, { url, body: text.replace('ol', 'al'), headers: [...form, 'X-Plivo-Signature-V3', python, 'X-Plivo-Signature-V3-Nonce', nonce] }, /does not match/);
      });

      it('refuses bodies outside the signature, other methods and missing headers', async () => {
        const sig = sign(`https://hooks.example.test/answer.${nonce}`);
        await expectDenied('plivo', token, { url: '/answer', body, headers: ['Content-Type', 'application/json', 'X-Plivo-Signature-V3', sig, 'X-Plivo-Signature-V3-Nonce', nonce] }, /not form-encoded/);
        await expectDenied('plivo', token, { method: 'PUT', url: '/answer', headers: ['X-Plivo-Signature-V3', sig, 'X-Plivo-Signature-V3-Nonce', nonce] }, /GET or POST/);
        await expectDenied('plivo', token, { url: '/answer', headers: ['X-Plivo-Signature-V3', sig] }, /missing X-Plivo-Signature-V3-Nonce/);
        await expectDenied('plivo', token, { url: '/answer', body: call, headers: [...form, 'X-Plivo-Signature-V2', sig, 'X-Plivo-Signature-V2-Nonce', nonce] }, /missing X-Plivo-Signature-V3/);
      });
    });
  });

  describe('handshakes answered by the ingress', () => {
    it('dropbox: GET ?challenge= is echoed as text/plain, nosniff', async () => {
      const out = await run('dropbox', 'app-secret', { method: 'GET', url: '/dbx?challenge=abc123' });
      expect(out).toMatchObject({ status: 200, body: 'abc123' });
      expect(out!.headers!['x-content-type-options']).toBe('nosniff');
      await expectDenied('dropbox', 'app-secret', { method: 'GET', url: '/dbx' }, /missing/);
    });

    it('meta: GET hub.mode=subscribe echoes hub.challenge; other GETs still need a signature', async () => {
      for (const provider of ['facebook_graph_api', 'facebook_messenger', 'instagram', 'whatsapp']) {
        const out = await run(provider, 'app-secret', { method: 'GET', url: '/fb?hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token=mytoken' });
        expect(out).toMatchObject({ status: 200, body: '1158201444' });
        await expectDenied(provider, 'app-secret', { method: 'GET', url: '/fb?hub.mode=unsubscribe&hub.challenge=1' }, /missing/);
      }
    });

    it('twitter: GET ?crc_token= gets the HMAC response_token', async () => {
      const out = await run('twitter', 'consumer-secret', { method: 'GET', url: '/x?crc_token=crc-abc' });
      expect(out?.status).toBe(200);
      const expected = `sha256=${hmac('sha256', 'consumer-secret', 'crc-abc').digest('base64')}`;
      expect(JSON.parse(String(out!.body))).toEqual({ response_token: expected });
      await expectDenied('twitter', 'consumer-secret', { method: 'POST', url: '/x?crc_token=crc-abc', body }, /missing/);
      // The CRC answer must not be usable as an event signature: a body equal to a token is refused.
      const oracle = await run('twitter', 'consumer-secret', { method: 'GET', url: '/x?crc_token=forged' });
      const token = JSON.parse(String(oracle!.body)).response_token as string;
      await expectDenied('twitter', 'consumer-secret', { body: 'forged', headers: ['x-twitter-webhooks-signature', token] }, /not an X event/);
      // Tokens outside the alphabet (a JSON body, say) are not answered.
      await expectDenied('twitter', 'consumer-secret', { method: 'GET', url: `/x?crc_token=${encodeURIComponent(body)}` }, /missing/);
    });
  });
});
