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

  it('allow-lists only SNS certificate URLs, in regions shaped as AWS shapes them', () => {
    const regions = [
      'us-east-1', 'us-east-2', 'us-west-1', 'us-west-2', 'af-south-1', 'ap-east-1', 'ap-east-2', 'ap-south-1', 'ap-south-2',
      'ap-northeast-1', 'ap-northeast-2', 'ap-northeast-3', 'ap-southeast-1', 'ap-southeast-2', 'ap-southeast-3', 'ap-southeast-4',
      'ap-southeast-5', 'ap-southeast-6', 'ap-southeast-7', 'ca-central-1', 'ca-west-1', 'eu-central-1', 'eu-central-2', 'eu-north-1',
      'eu-south-1', 'eu-south-2', 'eu-west-1', 'eu-west-2', 'eu-west-3', 'il-central-1', 'me-central-1', 'me-south-1', 'mx-central-1',
      'sa-east-1', 'us-gov-east-1', 'us-gov-west-1',
    ];
    for (const r of regions) expect(isSnsCertificateUrl(`https://sns.${r}.amazonaws.com/SimpleNotificationService-0123.pem`), r).toBe(true);
    for (const r of ['cn-north-1', 'cn-northwest-1']) expect(isSnsCertificateUrl(`https://sns.${r}.amazonaws.com.cn/a.pem`), r).toBe(true);
    expect(isSnsCertificateUrl('https://sns.eusc-de-east-1.amazonaws.eu/a.pem')).toBe(true);
    // Made-up regions, and real ones on another partition's domain.
    for (const host of [
      'sns.zz-abc-1.amazonaws.com', 'sns.zz-aaa-1.amazonaws.com', 'sns.us-foo-1.amazonaws.com', 'sns.us-east-01.amazonaws.com',
      'sns.us-east-100.amazonaws.com', 'sns.us-east-0.amazonaws.com', 'sns.us-gov-foo-1.amazonaws.com', 'sns.abcd-east-1.amazonaws.com',
      'sns.us-east-east-1.amazonaws.com', 'sns.cn-north-1.amazonaws.com', 'sns.us-east-1.amazonaws.com.cn', 'sns.us-east-1.amazonaws.eu',
      'sns.eusc-de-east-1.amazonaws.com', 'sns.US-EAST-1.amazonaws.com.evil.test',
    ]) {
      expect(isSnsCertificateUrl(`https://${host}/a.pem`), host).toBe(false);
    }

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

  it('bounds the certificate cache', async () => {
    let calls = 0;
    const cache = new SnsCertificateCache(async () => {
      calls++;
      return signer.certificatePem;
    }, Date.now, { maxFetched: 2, maxVerified: 2 });
    const url = (n: number) => `https://sns.us-east-1.amazonaws.com/${n}.pem`;
    // Fetched only: the oldest goes first.
    await cache.get(url(1));
    await cache.get(url(2));
    await cache.get(url(3));
    await cache.get(url(3));
    expect(calls).toBe(3);
    await cache.get(url(1));
    expect(calls).toBe(4);
    // Verified: the least recently used goes first, and only for another verified one.
    cache.confirm(url(1), await cache.get(url(1)));
    cache.confirm(url(3), await cache.get(url(3)));
    await cache.get(url(1));
    for (let n = 10; n < 20; n++) await cache.get(url(n));
    calls = 0;
    await cache.get(url(3));
    await cache.get(url(1));
    expect(calls).toBe(0);
    cache.confirm(url(4), await cache.get(url(4)));
    calls = 0;
    await cache.get(url(1));
    await cache.get(url(4));
    expect(calls).toBe(0);
    await cache.get(url(3));
    expect(calls).toBe(1);
    expect(snsCanonicalString({ Type: 'Other' })).toBeNull();
  });

  it('fetches a certificate again after an hour, one that verified even while others are in flight', async () => {
    let now = 1_700_000_000_000;
    let calls = 0;
    const cache = new SnsCertificateCache((url) => {
      calls++;
      return /slow/.test(url) ? new Promise(() => {}) : Promise.resolve(signer.certificatePem);
    }, () => now);
    const first = await cache.get(CERT_URL);
    cache.confirm(CERT_URL, first);
    now += 3_599_000;
    expect(await cache.get(CERT_URL)).toBe(first);
    expect(calls).toBe(1);
    for (let i = 0; i < 4; i++) void cache.get(`https://sns.us-east-1.amazonaws.com/slow-${i}.pem`);
    await expect(cache.get('https://sns.us-east-1.amazonaws.com/other.pem')).rejects.toThrow(/too many/);
    now += 1_000;
    const again = await cache.get(CERT_URL);
    expect(again).not.toBe(first);
    expect(calls).toBe(6);
    // Still among the verified, fresh again.
    calls = 0;
    expect(await cache.get(CERT_URL)).toBe(again);
    expect(calls).toBe(0);
  });

  it('remembers a failed fetch for a minute', async () => {
    let now = 1_700_000_000_000;
    let calls = 0;
    const cache = new SnsCertificateCache(async () => {
      calls++;
      if (calls === 1) throw new Error('transient');
      return signer.certificatePem;
    }, () => now);
    await expect(cache.get(CERT_URL)).rejects.toThrow('transient');
    await expect(cache.get(CERT_URL)).rejects.toThrow(/a moment ago/);
    now += 59_000;
    await expect(cache.get(CERT_URL)).rejects.toThrow(/a moment ago/);
    expect(calls).toBe(1);
    now += 1_000;
    await cache.get(CERT_URL);
    expect(calls).toBe(2);
    // What is not a certificate is a failure too.
    const junk = new SnsCertificateCache(async () => {
      calls++;
      return 'not a certificate';
    }, () => now);
    calls = 0;
    await expect(junk.get(CERT_URL)).rejects.toThrow();
    await expect(junk.get(CERT_URL)).rejects.toThrow(/a moment ago/);
    expect(calls).toBe(1);
  });

  it('unsigned messages naming the same failing URL make one fetch a minute', async () => {
    let now = Date.parse('2023-11-14T22:13:20.000Z');
    const urls: string[] = [];
    const f = createWebhookVerificationStage({
      now: () => now,
      snsCertificateFetcher: async (url) => {
        urls.push(url);
        throw new Error('404');
      },
    });
    const bogus = JSON.stringify({ ...message(), Signature: 'AAAA' });
    for (let i = 0; i < 20; i++) expect(String((await run(f, bogus))!.body)).toMatch(/could not be fetched/);
    expect(urls).toEqual([CERT_URL]);
    now += 60_000;
    await run(f, bogus);
    expect(urls).toEqual([CERT_URL, CERT_URL]);
  });

  it('runs at most four fetches at once; a fetch of the same URL is shared', async () => {
    const pending: Array<(pem: string) => void> = [];
    const calls: string[] = [];
    let hold = true;
    const cache = new SnsCertificateCache((url) => {
      calls.push(url);
      return hold ? new Promise((resolve) => pending.push(resolve)) : Promise.resolve(signer.certificatePem);
    });
    const url = (n: number) => `https://sns.us-east-1.amazonaws.com/${n}.pem`;
    const first = [1, 2, 3, 4, 1, 2].map((n) => cache.get(url(n)));
    expect(calls).toEqual([url(1), url(2), url(3), url(4)]);
    await expect(cache.get(url(5))).rejects.toThrow(/too many/);
    expect(calls.length).toBe(4);
    hold = false;
    for (const resolve of pending) resolve(signer.certificatePem);
    await Promise.all(first);
    await cache.get(url(5));
    expect(calls.length).toBe(5);
  });

  it('a certificate that verified a signature stays cached whatever unsigned messages name', async () => {
    const calls: string[] = [];
    const pending: Array<() => void> = [];
    const f = createWebhookVerificationStage({
      snsCertificateFetcher: (url) => {
        calls.push(url);
        if (url === CERT_URL || /good-/.test(url)) return Promise.resolve(signer.certificatePem);
        if (/slow-/.test(url)) return new Promise((_, reject) => pending.push(() => reject(new Error('timeout'))));
        return Promise.reject(new Error('404'));
      },
    });
    expect(await run(f, JSON.stringify(message()))).toBeNull();
    const unsigned = (certUrl: string) => run(f, JSON.stringify({ ...message({ SigningCertURL: certUrl }), Signature: 'AAAA' }));
    // Slow hosts in flight, certificates that fetch but verify nothing, URLs that fail: many more than the cache holds.
    const slow = Array.from({ length: 10 }, (_, i) => unsigned(`https://sns.us-east-1.amazonaws.com/slow-${i}.pem`));
    for (let i = 0; i < 100; i++) await unsigned(`https://sns.us-east-1.amazonaws.com/good-${i}.pem`);
    for (let i = 0; i < 300; i++) await unsigned(`https://sns.us-east-1.amazonaws.com/bad-${i}.pem`);
    expect(await run(f, JSON.stringify(message({ Message: 'again' })))).toBeNull();
    expect(calls.filter((u) => u === CERT_URL)).toHaveLength(1);
    // Only four ran at once: the slow ones beyond them were refused without a fetch.
    expect(calls.filter((u) => /slow-/.test(u))).toHaveLength(4);
    pending.forEach((reject) => reject());
    for (const out of await Promise.all(slow)) expect(out!.status).toBe(403);
  });
});
