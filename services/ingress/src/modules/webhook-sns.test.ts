import { createPrivateKey, sign } from 'node:crypto';
import { beforeAll, describe, expect, it } from 'vitest';
import { createCertificate, type SelfSigned } from '@warren/shared';
import { isSnsCertificateUrl, SnsCertificateCache, snsCanonicalString } from './webhook-sns.js';
import { createWebhookVerificationStage } from './webhook-verification.js';
import { makeState, stageFor } from './testing.js';

const CERT_URL = 'https://sns.us-east-1.amazonaws.com/SimpleNotificationService-0123456789abcdef.pem';
let signer: SelfSigned;
let fetched: string[];

beforeAll(async () => {
  signer = await createCertificate({ commonName: 'sns.amazonaws.com', days: 1 });
});

function message(over: Record<string, string> = {}, version: '1' | '2' = '2'): Record<string, string> {
  const m: Record<string, string> = {
    Type: 'Notification',
    MessageId: '22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324',
    TopicArn: 'arn:aws:sns:us-east-1:123456789012:MyTopic',
    Subject: 'My First Message',
    Message: 'Hello world!',
    Timestamp: '2023-11-14T22:13:20.000Z',
    SignatureVersion: version,
    SigningCertURL: CERT_URL,
    ...over,
  };
  // The canonical string, written out independently of the implementation.
  const keys = m.Type === 'Notification' ? ['Message', 'MessageId', 'Subject', 'Timestamp', 'TopicArn', 'Type'] : ['Message', 'MessageId', 'SubscribeURL', 'Timestamp', 'Token', 'TopicArn', 'Type'];
  const text = keys.filter((k) => m[k] !== undefined).map((k) => `${k}\n${m[k]}\n`).join('');
  m.Signature = sign(version === '1' ? 'sha1' : 'sha256', Buffer.from(text), createPrivateKey(signer.privateKeyPem)).toString('base64');
  return m;
}

function factory() {
  fetched = [];
  return createWebhookVerificationStage({
    snsCertificateFetcher: async (url) => {
      fetched.push(url);
      return signer.certificatePem;
    },
  });
}

/** SNS's request: its headers name the message's type, topic and id, as SNS sends them, unless `headers` replaces them. */
async function run(f: ReturnType<typeof factory>, body: string, headers?: string[]) {
  const stage = stageFor(f, { webhook_verification: { enabled: true, provider: 'sns', secret: '' } })!;
  let sent = headers;
  if (!sent) {
    let m: Record<string, unknown> = {};
    try {
      m = JSON.parse(body) as Record<string, unknown>;
    } catch {
      /* not JSON: no SNS headers */
    }
    sent = typeof m.Type === 'string' ? ['x-amz-sns-message-type', m.Type, 'x-amz-sns-topic-arn', String(m.TopicArn), 'x-amz-sns-message-id', String(m.MessageId)] : [];
  }
  return stage.onRequest!(makeState({ method: 'POST', headers: ['Host', 'a.test', 'Content-Type', 'text/plain; charset=UTF-8', ...sent], body }));
}

describe('webhook_verification sns', () => {
  it('accepts SignatureVersion 1 and 2 notifications and caches the certificate', async () => {
    const f = factory();
    expect(await run(f, JSON.stringify(message({}, '2')))).toBeNull();
    expect(await run(f, JSON.stringify(message({}, '1')))).toBeNull();
    const { Subject: _s, ...noSubject } = message();
    expect(await run(f, JSON.stringify(message(noSubject as Record<string, string>)))).toBeNull();
    expect(fetched).toEqual([CERT_URL]);
  });

  it('accepts a SubscriptionConfirmation', async () => {
    const { Subject: _s, ...m } = message({ Type: 'SubscriptionConfirmation', Token: 'tok', SubscribeURL: 'https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription' });
    const signed = message(m as Record<string, string>);
    expect(await run(factory(), JSON.stringify(signed))).toBeNull();
  });

  it('refuses tampered messages, bad versions, foreign certificate URLs and non-JSON', async () => {
    const f = factory();
    const m = message();
    expect((await run(f, JSON.stringify({ ...m, Message: 'Hello World!' })))!.status).toBe(403);
    expect((await run(f, JSON.stringify({ ...m, SignatureVersion: '3' })))!.status).toBe(403);
    for (const url of ['https://sns.us-east-1.amazonaws.com.evil.test/x.pem', 'http://sns.us-east-1.amazonaws.com/x.pem', 'https://evil.test/sns.us-east-1.amazonaws.com/x.pem', 'https://sns.us-east-1.amazonaws.com/x.txt']) {
      const out = await run(f, JSON.stringify(message({ SigningCertURL: url })));
      expect(out!.status).toBe(403);
      expect(String(out!.body)).toMatch(/SigningCertURL/);
    }
    expect((await run(f, 'not json'))!.status).toBe(403);
    expect(fetched.every((u) => u === CERT_URL)).toBe(true);
  });

  it('refuses what an upstream could read instead of the signed fields', async () => {
    const f = factory();
    const m = message();
    const text = JSON.stringify(m);
    // A repeated key: JSON.parse keeps the last value (the signed one), a first-value parser the forged one.
    for (const prefix of ['{"Message":"evil","TopicArn":"arn:aws:sns:us-east-1:666666666666:Other",', '{"\\u004dessage":"evil",']) {
      const out = await run(f, prefix + text.slice(1));
      expect(out!.status).toBe(403);
      expect(String(out!.body)).toMatch(/names \\?"(Message|TopicArn)\\?" twice/);
    }
    // A repeated key inside a nested value is not the message's own.
    expect(await run(f, JSON.stringify({ ...m, MessageAttributes: { a: { Type: 'String', Value: '1' }, b: { Type: 'String', Value: '2' } } }))).toBeNull();
    // SNS's headers must agree with the signed fields.
    const base = ['x-amz-sns-message-type', 'Notification', 'x-amz-sns-topic-arn', m.TopicArn!, 'x-amz-sns-message-id', m.MessageId!];
    expect(await run(f, text, base)).toBeNull();
    expect(await run(f, text, [])).toBeNull();
    expect(String((await run(f, text, ['x-amz-sns-message-type', 'SubscriptionConfirmation']))!.body)).toMatch(/x-amz-sns-message-type/);
    expect(String((await run(f, text, ['x-amz-sns-topic-arn', 'arn:aws:sns:us-east-1:666666666666:Other']))!.body)).toMatch(/x-amz-sns-topic-arn/);
    expect(String((await run(f, text, ['x-amz-sns-message-id', 'other']))!.body)).toMatch(/x-amz-sns-message-id/);
    // A Notification carries no confirmation fields; the unsubscribe link must be SNS's.
    expect(String((await run(f, JSON.stringify({ ...m, SubscribeURL: 'https://evil.example/' })))!.body)).toMatch(/no SubscribeURL/);
    expect(String((await run(f, JSON.stringify({ ...m, Token: 't' })))!.body)).toMatch(/no SubscribeURL or Token/);
    const unsub = 'https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe&SubscriptionArn=arn:aws:sns:us-east-1:123456789012:MyTopic:c9135db0';
    expect(await run(f, JSON.stringify({ ...m, UnsubscribeURL: unsub }))).toBeNull();
    for (const bad of ['https://evil.example/?Action=Unsubscribe', 'http://sns.us-east-1.amazonaws.com/?Action=Unsubscribe', 'https://sns.s3.amazonaws.com/x']) {
      expect(String((await run(f, JSON.stringify({ ...m, UnsubscribeURL: bad })))!.body)).toMatch(/UnsubscribeURL is not an Amazon SNS URL/);
    }
  });

  it('refuses when the certificate cannot be fetched', async () => {
    const f = createWebhookVerificationStage({ snsCertificateFetcher: async () => { throw new Error('down'); } });
    const out = await run(f, JSON.stringify(message()));
    expect(String(out!.body)).toMatch(/could not be fetched/);
  });

  it('allow-lists only SNS certificate URLs', () => {
    expect(isSnsCertificateUrl(CERT_URL)).toBe(true);
    expect(isSnsCertificateUrl('https://sns.cn-north-1.amazonaws.com.cn/a.pem')).toBe(true);
    expect(isSnsCertificateUrl('https://sns.us-east-1.amazonaws.com:8443/a.pem')).toBe(false);
    expect(isSnsCertificateUrl('https://user@sns.us-east-1.amazonaws.com/a.pem')).toBe(false);
    expect(isSnsCertificateUrl('https://sns.us-gov-west-1.amazonaws.com/a.pem')).toBe(true);
    expect(isSnsCertificateUrl('https://sns.ap-southeast-5.amazonaws.com/a.pem')).toBe(true);
    // Hosts named sns that are not SNS: an S3 bucket, S3 acceleration, an API Gateway API.
    for (const host of ['sns.s3.amazonaws.com', 'sns.s3-accelerate.amazonaws.com', 'sns.execute-api.amazonaws.com', 'sns.amazonaws.com']) {
      expect(isSnsCertificateUrl(`https://${host}/a.pem`)).toBe(false);
    }
  });

  it('bounds the certificate cache and does not keep failures', async () => {
    let calls = 0;
    const cache = new SnsCertificateCache(async () => {
      calls++;
      if (calls === 1) throw new Error('transient');
      return signer.certificatePem;
    }, Date.now, 2);
    await expect(cache.get('https://sns.a-1.amazonaws.com/1.pem')).rejects.toThrow();
    await cache.get('https://sns.a-1.amazonaws.com/1.pem');
    await cache.get('https://sns.a-1.amazonaws.com/2.pem');
    await cache.get('https://sns.a-1.amazonaws.com/3.pem');
    await cache.get('https://sns.a-1.amazonaws.com/3.pem');
    expect(calls).toBe(4);
    await cache.get('https://sns.a-1.amazonaws.com/1.pem');
    expect(calls).toBe(5);
    expect(snsCanonicalString({ Type: 'Other' })).toBeNull();
  });
});
