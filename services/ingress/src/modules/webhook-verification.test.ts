import { createHash, createHmac, generateKeyPairSync, sign } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import type { Outcome } from '../pipeline/types.js';
import { createWebhookVerificationStage, SUPPORTED_WEBHOOK_PROVIDERS } from './webhook-verification.js';
import { makeState, stageFor } from './testing.js';

const NOW = 1_700_000_000_000;
const nowS = String(NOW / 1000);
const factory = createWebhookVerificationStage({ now: () => NOW, snsCertificateFetcher: async () => { throw new Error('offline'); } });

const hmac = (alg: string, key: string | Buffer, data: string | Buffer) => createHmac(alg, key).update(data);

interface Req {
  headers?: string[];
  body?: string;
  url?: string;
  host?: string;
  scheme?: 'http' | 'https';
}

async function run(provider: string, secret: string, r: Req): Promise<Outcome> {
  const stage = stageFor(factory, { webhook_verification: { enabled: true, provider, secret } })!;
  expect(stage.needsBody).toBe(true);
  const state = makeState({ method: 'POST', url: r.url ?? '/hook', scheme: r.scheme ?? 'https', headers: ['Host', r.host ?? 'hooks.example.test', ...(r.headers ?? [])], body: r.body ?? '' });
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
    expect(() => stageFor(factory, { webhook_verification: { enabled: true, provider: 'mailchimp', secret: 's' } })).toThrow(/not supported/);
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
});
