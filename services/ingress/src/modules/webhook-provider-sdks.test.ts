import { generateKeyPairSync, randomBytes, sign as ecSign, type KeyObject } from 'node:crypto';
import { EventWebhook } from '@sendgrid/eventwebhook';
import { sign as githubSign, verify as githubVerify } from '@octokit/webhooks-methods';
import { Webhook as SvixWebhook } from 'svix';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import type { Outcome } from '../pipeline/types.js';
import { createWebhookVerificationStage } from './webhook-verification.js';
import { makeState, stageFor } from './testing.js';

/**
 * Requests signed by each provider's OWN library (not by a re-implementation of its scheme),
 * run through `webhook_verification` as webhook-verification.test.ts runs them: accepted as
 * signed, refused after a one-byte body change, with the wrong secret and (where the scheme is
 * timestamped) when stale. Where the library also verifies, its verdict on the same request is
 * asserted to be ours.
 *
 * Libraries: @octokit/webhooks-methods (GitHub's `sign`/`verify`), svix (`Webhook#sign`/`verify`,
 * Svix, Clerk and Standard Webhooks `webhook-*` headers), @sendgrid/eventwebhook
 * (`EventWebhook#verifySignature`; SendGrid signs with its private key, so a P-256 pair is made
 * here and both verifiers judge the same signed request).
 */

// A clock with a fraction of a second, as real clocks have: the libraries floor it to whole
// seconds when they sign, which is what the tolerance case below is about.
const NOW = 1_700_000_000_750;
const factory = createWebhookVerificationStage({ now: () => NOW });

beforeAll(() => {
  // svix's verify reads Date.now(): the libraries and the ingress share one clock.
  vi.useFakeTimers({ toFake: ['Date'] });
  vi.setSystemTime(NOW);
});
afterAll(() => {
  vi.useRealTimers();
});

interface Req {
  method?: string;
  url: string;
  headers: string[];
  body: Buffer;
}

async function run(provider: string, secret: string, r: Req): Promise<Outcome> {
  const stage = stageFor(factory, { webhook_verification: { enabled: true, provider, secret } })!;
  expect(stage.needsBody).toBe(true);
  const state = makeState({ method: r.method ?? 'POST', url: r.url, scheme: 'https', headers: ['Host', 'hooks.example.test', ...r.headers], body: r.body });
  return stage.onRequest!(state);
}

async function expectAccepted(provider: string, secret: string, r: Req) {
  const out = await run(provider, secret, r);
  expect(out === null ? null : String(out.body)).toBeNull();
}

async function expectRefused(provider: string, secret: string, r: Req, reason?: RegExp) {
  const out = await run(provider, secret, r);
  expect(out).not.toBeNull();
  expect(out!.status).toBe(403);
  expect(out!.headers!['warren-error-code']).toBe('ERR_WARREN_7102');
  if (reason) expect(String(out!.body)).toMatch(reason);
}

/** The body with one ASCII byte (past the middle) changed: still the same length, still text. */
function oneByteChanged(body: Buffer): Buffer {
  const out = Buffer.from(body);
  let i = Math.floor(out.length / 2);
  while (!/[A-Za-z0-9]/.test(String.fromCharCode(out[i]!))) i++;
  out[i] = out[i]! ^ 0x01;
  expect(out.equals(body)).toBe(false);
  return out;
}

const utf8 = (s: string) => Buffer.from(s, 'utf8');

describe('GitHub, signed by @octokit/webhooks-methods', () => {
  const secret = 'It’s a Secret to Everybody';
  // A push event (trimmed), with the non-ASCII text commit messages carry.
  const payload = JSON.stringify({
    ref: 'refs/heads/main',
    before: '6113728f27ae82c7b1a177c8d03f9e96e0adf246',
    after: '0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c',
    repository: { id: 186853002, full_name: 'octo-org/hello-world', private: false },
    pusher: { name: 'octocat', email: 'octocat@github.com' },
    head_commit: { id: '0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c', message: 'Fix the naïve café parser ✓', timestamp: '2023-11-14T22:13:20Z' },
  });
  const request = (sig: string, body: Buffer = utf8(payload)): Req => ({
    url: '/github/webhook',
    body,
    headers: [
      'User-Agent', 'GitHub-Hookshot/044aadd',
      'Content-Type', 'application/json',
      'X-GitHub-Event', 'push',
      'X-GitHub-Delivery', '72d3162e-cc78-11e3-81ab-4c9367dc0958',
      'X-GitHub-Hook-ID', '292430182',
      'X-Hub-Signature-256', sig,
    ],
  });

  it('accepts what sign() produced; refuses a one-byte change and the wrong secret, as verify() does', async () => {
    const sig = await githubSign(secret, payload);
    expect(sig).toMatch(/^sha256=[0-9a-f]{64}$/);
    expect(await githubVerify(secret, payload, sig)).toBe(true);
    await expectAccepted('github', secret, request(sig));

    const tampered = oneByteChanged(utf8(payload));
    expect(await githubVerify(secret, tampered.toString('utf8'), sig)).toBe(false);
    await expectRefused('github', secret, request(sig, tampered), /X-Hub-Signature-256 does not match/i);

    const otherSig = await githubSign('another secret', payload);
    expect(await githubVerify(secret, payload, otherSig)).toBe(false);
    await expectRefused('github', secret, request(otherSig), /does not match/);
  });

  it('the same route module under the Meta providers (also sha256=<hex> of the body): same verdicts', async () => {
    const sig = await githubSign(secret, payload);
    await expectAccepted('facebook_graph_api', secret, request(sig));
    await expectRefused('facebook_graph_api', secret, request(sig, oneByteChanged(utf8(payload))));
  });
});

describe('Svix, Clerk and Standard Webhooks, signed by svix Webhook#sign', () => {
  const key = randomBytes(24);
  const secret = `whsec_${key.toString('base64')}`;
  const msgId = 'msg_2KWPBgLlAfxdpx2AI54pPJ85f4W';
  const payload = JSON.stringify({ type: 'invoice.paid', data: { id: 'inv_1', amount: 4200, currency: 'eur', customer: 'Zoë Müller' }, timestamp: '2023-11-14T22:13:20.750Z' });
  const svixHeaders = (id: string, at: Date, sig: string) => ['Content-Type', 'application/json', 'User-Agent', 'Svix-Webhooks/1.24.0', 'svix-id', id, 'svix-timestamp', String(Math.floor(at.getTime() / 1000)), 'svix-signature', sig];
  const asRecord = (h: string[]) => Object.fromEntries(h.flatMap((v, i, a) => (i % 2 === 0 ? [[v, a[i + 1]!]] : [])));

  it('accepts what sign() produced (svix-* headers) for svix and clerk; svix verify() agrees', async () => {
    const at = new Date(NOW);
    const sig = new SvixWebhook(secret).sign(msgId, at, payload);
    expect(sig).toMatch(/^v1,[A-Za-z0-9+/]+=*$/);
    const headers = svixHeaders(msgId, at, sig);
    expect(new SvixWebhook(secret).verify(payload, asRecord(headers))).toEqual(JSON.parse(payload));
    await expectAccepted('svix', secret, { url: '/svix', body: utf8(payload), headers });
    await expectAccepted('clerk', secret, { url: '/clerk', body: utf8(payload), headers });
  });

  it('accepts a rotation header with two signatures (old key first), as verify() does', async () => {
    const at = new Date(NOW);
    const old = new SvixWebhook(`whsec_${randomBytes(24).toString('base64')}`).sign(msgId, at, payload);
    const cur = new SvixWebhook(secret).sign(msgId, at, payload);
    const headers = svixHeaders(msgId, at, `${old} ${cur}`);
    expect(() => new SvixWebhook(secret).verify(payload, asRecord(headers))).not.toThrow();
    await expectAccepted('svix', secret, { url: '/svix', body: utf8(payload), headers });
  });

  it('refuses a one-byte body change, the wrong secret and another message id, as verify() does', async () => {
    const at = new Date(NOW);
    const sig = new SvixWebhook(secret).sign(msgId, at, payload);
    const tampered = oneByteChanged(utf8(payload));
    expect(() => new SvixWebhook(secret).verify(tampered, asRecord(svixHeaders(msgId, at, sig)))).toThrow(/No matching signature/);
    await expectRefused('svix', secret, { url: '/svix', body: tampered, headers: svixHeaders(msgId, at, sig) }, /svix-signature does not match/);

    const otherSecret = `whsec_${randomBytes(24).toString('base64')}`;
    const wrong = new SvixWebhook(otherSecret).sign(msgId, at, payload);
    expect(() => new SvixWebhook(secret).verify(payload, asRecord(svixHeaders(msgId, at, wrong)))).toThrow(/No matching signature/);
    await expectRefused('svix', secret, { url: '/svix', body: utf8(payload), headers: svixHeaders(msgId, at, wrong) }, /does not match/);

    await expectRefused('svix', secret, { url: '/svix', body: utf8(payload), headers: svixHeaders('msg_other', at, sig) }, /does not match/);
  });

  it('refuses a timestamp more than 5 minutes old or ahead, as verify() does', async () => {
    for (const offsetMs of [-301_000, -3_600_000, 301_000]) {
      const at = new Date(NOW + offsetMs);
      const sig = new SvixWebhook(secret).sign(msgId, at, payload);
      const headers = svixHeaders(msgId, at, sig);
      expect(() => new SvixWebhook(secret).verify(payload, asRecord(headers))).toThrow(/too (old|new)/);
      await expectRefused('svix', secret, { url: '/svix', body: utf8(payload), headers }, /5 minutes/);
    }
  });

  it('accepts a message signed 299.5 s ago, as verify() does (the signer floors its clock to whole seconds)', async () => {
    // Disagreement found here: the ingress compared the whole-second timestamp with its own clock
    // in milliseconds, so a message signed at …700.250 s (sent as …700) and received 299.5 s later
    // at …000.750 s looked 300.75 s old and was refused; svix (and Stripe's and Slack's SDKs)
    // compare whole seconds (floor(now) - t) and accept it.
    for (const ageMs of [299_500, 300_000]) {
      const at = new Date(NOW - ageMs);
      const sig = new SvixWebhook(secret).sign(msgId, at, payload);
      const headers = svixHeaders(msgId, at, sig);
      expect(() => new SvixWebhook(secret).verify(payload, asRecord(headers))).not.toThrow();
      await expectAccepted('svix', secret, { url: '/svix', body: utf8(payload), headers });
    }
    // One whole second further is past the tolerance for both.
    const at = new Date(NOW - 301_000);
    const headers = svixHeaders(msgId, at, new SvixWebhook(secret).sign(msgId, at, payload));
    expect(() => new SvixWebhook(secret).verify(payload, asRecord(headers))).toThrow(/too old/);
    await expectRefused('svix', secret, { url: '/svix', body: utf8(payload), headers }, /5 minutes/);
  });

  it('Standard Webhooks webhook-* headers (brex: the base64 key without whsec_), as verify() reads them', async () => {
    const bare = key.toString('base64');
    const at = new Date(NOW);
    const sig = new SvixWebhook(bare).sign(msgId, at, payload);
    expect(sig).toBe(new SvixWebhook(secret).sign(msgId, at, payload));
    const headers = ['Content-Type', 'application/json', 'webhook-id', msgId, 'webhook-timestamp', String(Math.floor(NOW / 1000)), 'webhook-signature', sig];
    expect(() => new SvixWebhook(bare).verify(payload, asRecord(headers))).not.toThrow();
    await expectAccepted('brex', bare, { url: '/brex', body: utf8(payload), headers });
    await expectAccepted('svix', secret, { url: '/brex', body: utf8(payload), headers });
    await expectRefused('brex', bare, { url: '/brex', body: oneByteChanged(utf8(payload)), headers }, /webhook-signature does not match/);
    await expectRefused('brex', randomBytes(24).toString('base64'), { url: '/brex', body: utf8(payload), headers }, /does not match/);
  });
});

describe('SendGrid Event Webhook: ours and @sendgrid/eventwebhook verifySignature judge the same requests alike', () => {
  const ew = new EventWebhook();
  const keys = () => {
    const { publicKey, privateKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
    // The dashboard's "Verification Key": base64 of the DER SubjectPublicKeyInfo, no PEM armour.
    return { privateKey, dashboardKey: publicKey.export({ type: 'spki', format: 'der' }).toString('base64'), pem: publicKey.export({ type: 'spki', format: 'pem' }).toString() };
  };
  // SendGrid posts a JSON array of events, CRLF-terminated.
  const payload =
    JSON.stringify([
      { email: 'zoë@example.com', timestamp: 1699999999, 'smtp-id': '<14c5d75ce93.dfd.64b469@ismtpd-555>', event: 'processed', category: ['cat facts'], sg_event_id: 'rbtnWrG1DVDGGGFHFyun0A==', sg_message_id: '14c583da911.10f0.1bc68a.filter0001.16648.5515E0B88.0' },
      { email: 'example@test.com', timestamp: 1700000000, event: 'delivered', response: '250 OK', sg_event_id: 'sZROwMGMagFgnOEmSdvhig==', sg_message_id: '14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.0' },
    ]) + '\r\n';
  const ecdsaSign = (privateKey: KeyObject, ts: string, body: Buffer) => ecSign('sha256', Buffer.concat([utf8(ts), body]), { key: privateKey, dsaEncoding: 'der' }).toString('base64');
  const request = (sig: string, ts: string, body: Buffer = utf8(payload)): Req => ({
    url: '/sendgrid/events',
    body,
    headers: ['Content-Type', 'application/json', 'User-Agent', 'SendGrid Event API', 'X-Twilio-Email-Event-Webhook-Signature', sig, 'X-Twilio-Email-Event-Webhook-Timestamp', ts],
  });
  const theirs = (key: string, body: Buffer, sig: string, ts: string) => ew.verifySignature(ew.convertPublicKeyToECDSA(key), body, sig, ts);

  it('a signed request: both accept (the dashboard key and its PEM form)', async () => {
    const { privateKey, dashboardKey, pem } = keys();
    const ts = String(Math.floor(NOW / 1000));
    for (let n = 0; n < 5; n++) {
      // ECDSA signatures are randomized: a few, so that short (r, s) DER encodings come up too.
      const sig = ecdsaSign(privateKey, ts, utf8(payload));
      expect(theirs(dashboardKey, utf8(payload), sig, ts)).toBe(true);
      expect(theirs(pem, utf8(payload), sig, ts)).toBe(true);
      await expectAccepted('sendgrid', dashboardKey, request(sig, ts));
      await expectAccepted('sendgrid', pem, request(sig, ts));
    }
  });

  it('a one-byte body change, another key, another timestamp: both refuse', async () => {
    const { privateKey, dashboardKey } = keys();
    const ts = String(Math.floor(NOW / 1000));
    const sig = ecdsaSign(privateKey, ts, utf8(payload));

    const tampered = oneByteChanged(utf8(payload));
    expect(theirs(dashboardKey, tampered, sig, ts)).toBe(false);
    await expectRefused('sendgrid', dashboardKey, request(sig, ts, tampered), /does not match/);

    const other = keys().dashboardKey;
    expect(theirs(other, utf8(payload), sig, ts)).toBe(false);
    await expectRefused('sendgrid', other, request(sig, ts), /does not match/);

    // The timestamp is signed: moving it by a second breaks the signature for both.
    const ts2 = String(Number(ts) - 1);
    expect(theirs(dashboardKey, utf8(payload), sig, ts2)).toBe(false);
    await expectRefused('sendgrid', dashboardKey, request(sig, ts2), /does not match/);
  });

  it('a validly signed but stale timestamp: the library has no clock and accepts; the ingress refuses it (replay)', async () => {
    const { privateKey, dashboardKey } = keys();
    const stale = String(Math.floor(NOW / 1000) - 3600);
    const sig = ecdsaSign(privateKey, stale, utf8(payload));
    expect(theirs(dashboardKey, utf8(payload), sig, stale)).toBe(true);
    await expectRefused('sendgrid', dashboardKey, request(sig, stale), /5 minutes/);
  });

  it('the high-S twin of a signature (both verifiers accept ECDSA malleability alike)', async () => {
    const { privateKey, dashboardKey } = keys();
    const ts = String(Math.floor(NOW / 1000));
    const der = Buffer.from(ecdsaSign(privateKey, ts, utf8(payload)), 'base64');
    const twin = highSTwin(der).toString('base64');
    expect(theirs(dashboardKey, utf8(payload), twin, ts)).toBe(true);
    await expectAccepted('sendgrid', dashboardKey, request(twin, ts));
  });
});

/** P-256's group order. */
const P256_N = BigInt('0xffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551');

/** The DER ECDSA signature (r, n - s): the same signature's other valid form. */
function highSTwin(der: Buffer): Buffer {
  // SEQUENCE { INTEGER r, INTEGER s }, every length short-form for P-256.
  const rLen = der[3]!;
  const r = der.subarray(4, 4 + rLen);
  const sLen = der[5 + rLen]!;
  const s = BigInt(`0x${der.subarray(6 + rLen, 6 + rLen + sLen).toString('hex')}`);
  const int = (v: bigint) => {
    let hex = v.toString(16);
    if (hex.length % 2) hex = `0${hex}`;
    let b = Buffer.from(hex, 'hex');
    if (b[0]! & 0x80) b = Buffer.concat([Buffer.from([0]), b]);
    return Buffer.concat([Buffer.from([0x02, b.length]), b]);
  };
  const body = Buffer.concat([Buffer.from([0x02, rLen]), r, int(P256_N - s)]);
  return Buffer.concat([Buffer.from([0x30, body.length]), body]);
}
