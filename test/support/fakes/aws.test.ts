import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { FirehoseClient, PutRecordBatchCommand } from '@aws-sdk/client-firehose';
import { KinesisClient, PutRecordsCommand } from '@aws-sdk/client-kinesis';
import { CloudWatchLogsClient, CreateLogStreamCommand, DescribeLogStreamsCommand, PutLogEventsCommand } from '@aws-sdk/client-cloudwatch-logs';
import { AssumeRoleCommand, STSClient } from '@aws-sdk/client-sts';
import { fromTemporaryCredentials } from '@aws-sdk/credential-providers';
import { NodeHttpHandler } from '@smithy/node-http-handler';
import aws4 from 'aws4';
import { AWS_LIMITS, startAwsFake, type AwsFake } from './aws.js';

/**
 * Self-test of the AWS fake with the real AWS SDK v3 clients (Firehose, Kinesis, CloudWatch
 * Logs, STS and `fromTemporaryCredentials`) and, for the signature check itself, with requests
 * signed by aws4 and then tampered with.
 */

const AKID = 'AKIAWARRENTEST00001';
const SECRET = 'warren/test/secret+key0000000000000000000';
const ROLE = 'arn:aws:iam::111122223333:role/warren-delivery';
const OPEN_ROLE = 'arn:aws:iam::111122223333:role/no-external-id';
const REGION = 'eu-west-1';
const STREAM_ARN = `arn:aws:kinesis:${REGION}:111122223333:stream/events`;

let fake: AwsFake;

type Creds = { accessKeyId: string; secretAccessKey: string; sessionToken?: string };
function cfg(extra: { credentials?: Creds | (() => Promise<Creds>); region?: string; maxAttempts?: number; requestHandler?: NodeHttpHandler; systemClockOffset?: number } = {}) {
  return { endpoint: fake.url, region: REGION, credentials: { accessKeyId: AKID, secretAccessKey: SECRET }, maxAttempts: 1, requestHandler: new NodeHttpHandler(), ...extra };
}

async function failure(p: Promise<unknown>): Promise<{ name: string; status?: number; message: string; code?: string }> {
  try {
    await p;
  } catch (e) {
    const err = e as Error & { $metadata?: { httpStatusCode?: number }; code?: string };
    return { name: err.name, status: err.$metadata?.httpStatusCode, message: err.message, code: err.code };
  }
  throw new Error('expected the call to fail');
}

const fh = (records: Array<string | Buffer>, name = 'audit', c = cfg()) =>
  new FirehoseClient(c).send(new PutRecordBatchCommand({ DeliveryStreamName: name, Records: records.map((r) => ({ Data: Buffer.from(r) })) }));
const ks = (records: Array<{ k: string; d: string | Buffer }>, c = cfg(), arn: string | undefined = STREAM_ARN) =>
  new KinesisClient(c).send(new PutRecordsCommand({ StreamName: 'events', ...(arn ? { StreamARN: arn } : {}), Records: records.map((r) => ({ PartitionKey: r.k, Data: Buffer.from(r.d) })) }));
const cw = (c = cfg()) => new CloudWatchLogsClient(c);

beforeAll(async () => {
  fake = await startAwsFake({
    credentials: { [AKID]: SECRET },
    roles: { [ROLE]: { externalId: 'ac_123' }, [OPEN_ROLE]: {} },
    expectedRegion: { 'audit-us': 'us-east-1' },
  });
});
afterAll(async () => {
  await fake.close();
});
beforeEach(() => fake.reset());

describe('signature', () => {
  it('accepts a correctly signed Firehose call and records scope and records', async () => {
    const out = await fh(['{"a":1}\n', '{"a":2}\n']);
    expect(out.FailedPutCount).toBe(0);
    expect(out.Encrypted).toBe(false);
    expect(out.RequestResponses).toHaveLength(2);
    expect(out.RequestResponses!.every((r) => typeof r.RecordId === 'string' && !r.ErrorCode)).toBe(true);
    expect(fake.firehose.get('audit')).toEqual(['{"a":1}\n', '{"a":2}\n']);
    expect(fake.requests).toEqual([expect.objectContaining({ op: 'PutRecordBatch', status: 200, service: 'firehose', region: REGION, accessKeyId: AKID, records: 2, bytes: 16 })]);
  });

  it('refuses a wrong secret (InvalidSignatureException, HTTP 400 like AWS) and an unknown key', async () => {
    const wrong = await failure(fh(['x'], 'audit', cfg({ credentials: { accessKeyId: AKID, secretAccessKey: 'nope' } })));
    expect(wrong).toMatchObject({ name: 'InvalidSignatureException', status: 400 });
    const unknown = await failure(ks([{ k: 'k', d: 'x' }], cfg({ credentials: { accessKeyId: 'AKIAUNKNOWN', secretAccessKey: SECRET } })));
    expect(unknown).toMatchObject({ name: 'UnrecognizedClientException', status: 400 });
    expect(fake.firehose.size + fake.kinesis.size).toBe(0);
    expect(fake.requests.map((r) => r.error)).toEqual(['InvalidSignatureException', 'UnrecognizedClientException']);
  });

  it('refuses a region that does not match the ARN or expectedRegion, and a clock 10 minutes off', async () => {
    const kin = await failure(ks([{ k: 'k', d: 'x' }], cfg({ region: 'us-east-1' })));
    expect(kin).toMatchObject({ name: 'InvalidSignatureException' });
    expect(kin.message).toMatch(/valid region/);
    const fire = await failure(fh(['x'], 'audit-us'));
    expect(fire.name).toBe('InvalidSignatureException');
    await fh(['x'], 'audit-us', cfg({ region: 'us-east-1' }));
    expect(fake.requests.at(-1)).toMatchObject({ status: 200, region: 'us-east-1' });
    const skew = await failure(fh(['x'], 'audit', cfg({ systemClockOffset: -10 * 60_000 })));
    expect(skew).toMatchObject({ name: 'InvalidSignatureException' });
    expect(skew.message).toMatch(/Signature expired/);
  });

  it('verifies with aws4 independently: an aws4-signed request passes, a tampered body or header fails', async () => {
    const host = new URL(fake.url).host;
    const body = JSON.stringify({ DeliveryStreamName: 'raw', Records: [{ Data: Buffer.from('hello').toString('base64') }] });
    const signed = aws4.sign(
      { host, path: '/', method: 'POST', service: 'firehose', region: REGION, body, headers: { 'Content-Type': 'application/x-amz-json-1.1', 'X-Amz-Target': 'Firehose_20150804.PutRecordBatch' } },
      { accessKeyId: AKID, secretAccessKey: SECRET },
    );
    const headers = signed.headers as Record<string, string>;
    const ok = await fetch(fake.url, { method: 'POST', headers, body });
    expect(ok.status).toBe(200);
    const tampered = await fetch(fake.url, { method: 'POST', headers, body: body.replace('raw', 'rax') });
    expect(tampered.status).toBe(400);
    expect(await tampered.json()).toMatchObject({ __type: 'InvalidSignatureException' });
    const otherTarget = await fetch(fake.url, { method: 'POST', headers: { ...headers, 'X-Amz-Target': 'Kinesis_20131202.PutRecords' }, body });
    expect(await otherTarget.json()).toMatchObject({ __type: 'InvalidSignatureException' }); // service scope is firehose
    expect(fake.firehose.get('raw')).toEqual(['hello']);
  });

  it('can answer authentication errors with 403 when asked', async () => {
    const strict = await startAwsFake({ credentials: { [AKID]: SECRET }, authErrorStatus: 403 });
    try {
      const e = await failure(new FirehoseClient({ ...cfg(), endpoint: strict.url, credentials: { accessKeyId: AKID, secretAccessKey: 'bad' } }).send(new PutRecordBatchCommand({ DeliveryStreamName: 'a', Records: [{ Data: Buffer.from('x') }] })));
      expect(e).toMatchObject({ name: 'InvalidSignatureException', status: 403 });
    } finally {
      await strict.close();
    }
  });
});

describe('STS AssumeRole', () => {
  it('issues temporary credentials that work with their token and fail without it', async () => {
    const sts = new STSClient(cfg());
    const out = await sts.send(new AssumeRoleCommand({ RoleArn: ROLE, RoleSessionName: 'warren-dst_1', ExternalId: 'ac_123', DurationSeconds: 900 }));
    const c = out.Credentials!;
    expect(c.AccessKeyId).toMatch(/^ASIA[A-Z2-7]{16}$/);
    expect(c.Expiration!.getTime()).toBeGreaterThan(Date.now() + 880_000);
    expect(out.AssumedRoleUser?.Arn).toBe('arn:aws:sts::111122223333:assumed-role/warren-delivery/warren-dst_1');
    expect(fake.assumeRoleCalls).toEqual([{ roleArn: ROLE, externalId: 'ac_123', sessionName: 'warren-dst_1', durationSeconds: 900, callerAccessKeyId: AKID, ok: true }]);
    expect(fake.requests[0]).toMatchObject({ op: 'AssumeRole', status: 200, service: 'sts', region: REGION });

    const temp = { accessKeyId: c.AccessKeyId!, secretAccessKey: c.SecretAccessKey!, sessionToken: c.SessionToken! };
    await fh(['with token'], 'audit', cfg({ credentials: temp }));
    expect(fake.firehose.get('audit')).toEqual(['with token']);
    const noToken = await failure(fh(['no token'], 'audit', cfg({ credentials: { accessKeyId: temp.accessKeyId, secretAccessKey: temp.secretAccessKey } })));
    expect(noToken).toMatchObject({ name: 'UnrecognizedClientException' });
    const wrongToken = await failure(fh(['wrong token'], 'audit', cfg({ credentials: { ...temp, sessionToken: `${temp.sessionToken}x` } })));
    expect(wrongToken.name).toBe('UnrecognizedClientException');
    const tokenOnStatic = await failure(fh(['static + token'], 'audit', cfg({ credentials: { accessKeyId: AKID, secretAccessKey: SECRET, sessionToken: temp.sessionToken } })));
    expect(tokenOnStatic.name).toBe('UnrecognizedClientException');

    fake.expireTemporaryCredentials();
    const expired = await failure(fh(['late'], 'audit', cfg({ credentials: temp })));
    expect(expired).toMatchObject({ name: 'ExpiredTokenException', status: 400 });
    expect(fake.firehose.get('audit')).toEqual(['with token']);
  });

  it('denies a wrong or missing ExternalId and an unknown role; validates the input', async () => {
    const sts = new STSClient(cfg());
    const wrong = await failure(sts.send(new AssumeRoleCommand({ RoleArn: ROLE, RoleSessionName: 'warren-d', ExternalId: 'ac_999' })));
    expect(wrong).toMatchObject({ name: 'AccessDenied', status: 403 });
    const missing = await failure(sts.send(new AssumeRoleCommand({ RoleArn: ROLE, RoleSessionName: 'warren-d' })));
    expect(missing.name).toBe('AccessDenied');
    const unknown = await failure(sts.send(new AssumeRoleCommand({ RoleArn: 'arn:aws:iam::111122223333:role/other', RoleSessionName: 'warren-d' })));
    expect(unknown.name).toBe('AccessDenied');
    await sts.send(new AssumeRoleCommand({ RoleArn: OPEN_ROLE, RoleSessionName: 'warren-d', ExternalId: 'ac_anything' }));
    const shortDuration = await failure(sts.send(new AssumeRoleCommand({ RoleArn: OPEN_ROLE, RoleSessionName: 'warren-d', DurationSeconds: 899 })));
    expect(shortDuration).toMatchObject({ name: 'ValidationError', status: 400 });
    const badName = await failure(sts.send(new AssumeRoleCommand({ RoleArn: OPEN_ROLE, RoleSessionName: 'a' })));
    expect(badName.name).toBe('ValidationError');
    expect(fake.assumeRoleCalls.map((c) => c.ok)).toEqual([false, false, false, true, false, false]);
    const badSecret = await failure(new STSClient(cfg({ credentials: { accessKeyId: AKID, secretAccessKey: 'bad' } })).send(new AssumeRoleCommand({ RoleArn: OPEN_ROLE, RoleSessionName: 'warren-d' })));
    expect(badSecret).toMatchObject({ name: 'SignatureDoesNotMatch', status: 403 });
  });

  it('works through fromTemporaryCredentials (the provider the worker uses)', async () => {
    const credentials = fromTemporaryCredentials({
      masterCredentials: { accessKeyId: AKID, secretAccessKey: SECRET },
      params: { RoleArn: ROLE, RoleSessionName: 'warren-dst_2', ExternalId: 'ac_123' },
      clientConfig: { endpoint: fake.url, region: REGION, maxAttempts: 1 },
    });
    // The provider itself does not cache: the *client* memoizes its identity. Keep one client per
    // destination, or every new client calls AssumeRole again.
    const client = new KinesisClient(cfg({ credentials }));
    const send = (k: string, d: string) => client.send(new PutRecordsCommand({ StreamName: 'events', StreamARN: STREAM_ARN, Records: [{ PartitionKey: k, Data: Buffer.from(d) }] }));
    expect((await send('evt_1', 'one')).FailedRecordCount).toBe(0);
    await send('evt_2', 'two');
    expect(fake.assumeRoleCalls).toHaveLength(1);
    await ks([{ k: 'evt_3', d: 'three' }], cfg({ credentials }));
    expect(fake.assumeRoleCalls).toHaveLength(2);
    expect(fake.assumeRoleCalls[0]).toMatchObject({ sessionName: 'warren-dst_2', externalId: 'ac_123', callerAccessKeyId: AKID });
    expect(fake.requests.filter((r) => r.op === 'PutRecords').map((r) => r.accessKeyId?.slice(0, 4))).toEqual(['ASIA', 'ASIA', 'ASIA']);
  });
});

describe('Kinesis', () => {
  it('stores records with StreamARN and StreamName and answers sequence numbers', async () => {
    const out = await ks([
      { k: 'evt_1', d: 'one' },
      { k: 'evt_2', d: 'two' },
    ]);
    expect(out.FailedRecordCount).toBe(0);
    expect(out.Records!.map((r) => r.ShardId)).toEqual(['shardId-000000000000', 'shardId-000000000000']);
    expect(BigInt(out.Records![1]!.SequenceNumber!)).toBeGreaterThan(BigInt(out.Records![0]!.SequenceNumber!));
    expect(fake.kinesis.get('events')).toEqual([
      { partitionKey: 'evt_1', data: 'one' },
      { partitionKey: 'evt_2', data: 'two' },
    ]);
  });

  it('partial failure: only the records reported accepted are stored', async () => {
    fake.fail('PutRecords', { kind: 'partial', indices: [1, 3] });
    const out = await ks(['a', 'b', 'c', 'd'].map((d, i) => ({ k: `k${i}`, d })));
    expect(out.FailedRecordCount).toBe(2);
    expect(out.Records![1]).toMatchObject({ ErrorCode: 'ProvisionedThroughputExceededException' });
    expect(out.Records![3]!.ErrorCode).toBeDefined();
    expect(out.Records![0]!.SequenceNumber).toBeDefined();
    expect(fake.kinesis.get('events')!.map((r) => r.data)).toEqual(['a', 'c']);
    fake.fail('PutRecords', { kind: 'partial', indices: [0], code: 'KMSAccessDeniedException', message: 'no key' });
    const kms = await ks([{ k: 'k', d: 'x' }]);
    expect(kms.Records![0]).toEqual({ ErrorCode: 'KMSAccessDeniedException', ErrorMessage: 'no key' });
  });

  it('enforces count, record size (incl. key), call size and partition key length', async () => {
    const MiB = 1024 * 1024;
    const tooMany = await failure(ks(Array.from({ length: 501 }, (_, i) => ({ k: `k${i}`, d: 'x' }))));
    expect(tooMany).toMatchObject({ name: 'InvalidArgumentException', status: 400 });
    await ks([{ k: 'k', d: Buffer.alloc(MiB - 1, 97) }]); // exactly 1 MiB with the key
    const big = await failure(ks([{ k: 'kk', d: Buffer.alloc(MiB - 1, 97) }]));
    expect(big.name).toBe('InvalidArgumentException');
    const call = await failure(ks(Array.from({ length: 6 }, (_, i) => ({ k: `k${i}`, d: Buffer.alloc(900 * 1024, 97) }))));
    expect(call.message).toMatch(/5 MiB/);
    const longKey = await failure(ks([{ k: 'x'.repeat(257), d: 'x' }]));
    expect(longKey.name).toBe('InvalidArgumentException');
    await ks([{ k: 'é'.repeat(256), d: 'x' }]); // 256 characters (512 bytes) is fine
    const noName = await failure(new KinesisClient(cfg()).send(new PutRecordsCommand({ Records: [{ PartitionKey: 'k', Data: Buffer.from('x') }] })));
    expect(noName.status).toBe(400);
    expect(fake.kinesis.get('events')).toHaveLength(2);
    expect(fake.requests.filter((r) => r.status === 400).map((r) => r.error)).toEqual(['InvalidArgumentException', 'InvalidArgumentException', 'InvalidArgumentException', 'InvalidArgumentException', 'InvalidArgumentException']);
    expect(fake.requests.find((r) => r.records === 6)).toMatchObject({ bytes: 6 * 900 * 1024 + 12 });
    expect(AWS_LIMITS.kinesis.maxCallBytes).toBe(5 * MiB);
  });
});

describe('Firehose', () => {
  it('partial failure: RequestResponses line up, failed records are not stored', async () => {
    fake.fail('PutRecordBatch', { kind: 'partial', indices: [0] });
    const out = await fh(['a', 'b']);
    expect(out.FailedPutCount).toBe(1);
    expect(out.RequestResponses![0]).toEqual({ ErrorCode: 'ServiceUnavailableException', ErrorMessage: 'Slow down.' });
    expect(fake.firehose.get('audit')).toEqual(['b']);
  });

  it('enforces 500 records, 1,000 KiB per record before base64, 4 MiB per call', async () => {
    const tooMany = await failure(fh(Array.from({ length: 501 }, () => 'x')));
    expect(tooMany).toMatchObject({ name: 'InvalidArgumentException', status: 400 });
    await fh(Array.from({ length: 500 }, () => 'x'));
    await fh([Buffer.alloc(1000 * 1024, 97)]);
    const big = await failure(fh([Buffer.alloc(1000 * 1024 + 1, 97)]));
    expect(big.name).toBe('InvalidArgumentException');
    const call = await failure(fh(Array.from({ length: 5 }, () => Buffer.alloc(900 * 1024, 97))));
    expect(call.message).toMatch(/4 MiB/);
    expect(fake.firehose.get('audit')).toHaveLength(501);
  });
});

describe('CloudWatch Logs', () => {
  const group = '/warren/audit';
  const stream = 'warren-dst_1';

  it('missing stream → ResourceNotFound; CreateLogStream; AlreadyExists; Describe; events land', async () => {
    const logs = cw();
    const now = Date.now();
    const put = () => logs.send(new PutLogEventsCommand({ logGroupName: group, logStreamName: stream, logEvents: [{ timestamp: now, message: 'one' }, { timestamp: now + 1, message: 'two' }] }));
    expect(await failure(put())).toMatchObject({ name: 'ResourceNotFoundException', status: 400 });
    await logs.send(new CreateLogStreamCommand({ logGroupName: group, logStreamName: stream }));
    expect(await failure(logs.send(new CreateLogStreamCommand({ logGroupName: group, logStreamName: stream })))).toMatchObject({ name: 'ResourceAlreadyExistsException', status: 400 });
    const out = await put();
    expect(out.rejectedLogEventsInfo).toBeUndefined();
    expect(out.nextSequenceToken).toBeDefined();
    expect(fake.logs.get(`${group}/${stream}`)).toEqual([{ timestamp: now, message: 'one' }, { timestamp: now + 1, message: 'two' }]);
    const d = await logs.send(new DescribeLogStreamsCommand({ logGroupName: group, logStreamNamePrefix: 'warren-' }));
    expect(d.logStreams!.map((s) => s.logStreamName)).toEqual([stream]);
    expect(d.logStreams![0]!.arn).toBe(`arn:aws:logs:${REGION}:123456789012:log-group:${group}:log-stream:${stream}`);
  });

  it('rejects too old and too new events while the rest land; scripted rejections too', async () => {
    fake.logStreams.add(`${group}/${stream}`);
    const logs = cw();
    const now = Date.now();
    const day = 86_400_000;
    const events = [
      { timestamp: now - 15 * day, message: 'old' }, // span > 24 h is refused, so old and new go in two calls
      { timestamp: now - 14 * day - 60_000, message: 'old2' },
      { timestamp: now - 14 * day + 3_600_000, message: 'ok' },
    ];
    const old = await logs.send(new PutLogEventsCommand({ logGroupName: group, logStreamName: stream, logEvents: events.slice(1) }));
    expect(old.rejectedLogEventsInfo).toEqual({ tooOldLogEventEndIndex: 1 });
    const future = await logs.send(new PutLogEventsCommand({ logGroupName: group, logStreamName: stream, logEvents: [{ timestamp: now, message: 'now' }, { timestamp: now + 3 * 3_600_000, message: 'future' }] }));
    expect(future.rejectedLogEventsInfo).toEqual({ tooNewLogEventStartIndex: 1 });
    fake.fail('PutLogEvents', { kind: 'rejected', tooOldEndIndex: 1, tooNewStartIndex: 3 });
    const scripted = await logs.send(new PutLogEventsCommand({ logGroupName: group, logStreamName: stream, logEvents: ['a', 'b', 'c', 'd'].map((message, i) => ({ timestamp: now + i, message })) }));
    expect(scripted.rejectedLogEventsInfo).toEqual({ tooOldLogEventEndIndex: 1, tooNewLogEventStartIndex: 3 });
    expect(fake.logs.get(`${group}/${stream}`)!.map((e) => e.message)).toEqual(['ok', 'now', 'b', 'c']);
  });

  it('enforces 10,000 events, 1,048,576 bytes (+26 per event), order and the 24 h span', async () => {
    fake.logStreams.add(`${group}/${stream}`);
    const logs = cw();
    const now = Date.now();
    const put = (logEvents: Array<{ timestamp: number; message: string }>) => logs.send(new PutLogEventsCommand({ logGroupName: group, logStreamName: stream, logEvents }));
    expect(await failure(put(Array.from({ length: 10_001 }, (_, i) => ({ timestamp: now, message: `m${i}` }))))).toMatchObject({ name: 'InvalidParameterException', status: 400 });
    await put(Array.from({ length: 10_000 }, () => ({ timestamp: now, message: 'm' })));
    const fit = 1_048_576 - 2 * 26;
    await put([{ timestamp: now, message: 'x'.repeat(fit - 1) }, { timestamp: now, message: 'y' }]); // exactly the limit
    const over = await failure(put([{ timestamp: now, message: 'x'.repeat(fit) }, { timestamp: now, message: 'y' }]));
    expect(over.name).toBe('InvalidParameterException');
    expect(fake.requests.at(-1)).toMatchObject({ bytes: 1_048_577, records: 2, error: 'InvalidParameterException' });
    const order = await failure(put([{ timestamp: now, message: 'b' }, { timestamp: now - 1, message: 'a' }]));
    expect(order.message).toMatch(/chronological/);
    const span = await failure(put([{ timestamp: now - 25 * 3_600_000, message: 'a' }, { timestamp: now, message: 'b' }]));
    expect(span.message).toMatch(/24 hours/);
    const badGroup = await failure(logs.send(new PutLogEventsCommand({ logGroupName: `${group}:*`, logStreamName: stream, logEvents: [{ timestamp: now, message: 'x' }] })));
    expect(badGroup.name).toBe('InvalidParameterException');
    expect(fake.logs.get(`${group}/${stream}`)).toHaveLength(10_002);
  });
});

describe('faults', () => {
  it('status, throttle (per service) and Retry-After', async () => {
    fake.fail('PutRecordBatch', { kind: 'status', status: 500 });
    expect(await failure(fh(['x']))).toMatchObject({ name: 'InternalFailure', status: 500 });
    fake.fail('PutRecordBatch', { kind: 'throttle' });
    expect(await failure(fh(['x']))).toMatchObject({ name: 'ServiceUnavailableException', status: 503 });
    fake.fail('PutRecords', { kind: 'throttle' });
    expect(await failure(ks([{ k: 'k', d: 'x' }]))).toMatchObject({ name: 'ProvisionedThroughputExceededException', status: 400 });
    fake.fail('PutLogEvents', { kind: 'throttle' });
    expect(await failure(cw().send(new PutLogEventsCommand({ logGroupName: 'g', logStreamName: 's', logEvents: [{ timestamp: Date.now(), message: 'x' }] })))).toMatchObject({ name: 'ThrottlingException', status: 400 });
    fake.fail('AssumeRole', { kind: 'throttle' });
    expect(await failure(new STSClient(cfg()).send(new AssumeRoleCommand({ RoleArn: OPEN_ROLE, RoleSessionName: 'warren-d' })))).toMatchObject({ name: 'Throttling', status: 400 });
    fake.fail('PutRecords', { kind: 'status', status: 400, code: 'ResourceNotFoundException', message: 'Stream events not found' });
    expect(await failure(ks([{ k: 'k', d: 'x' }]))).toMatchObject({ name: 'ResourceNotFoundException', message: 'Stream events not found' });
    fake.fail('PutRecordBatch', { kind: 'status', status: 503, retryAfterSeconds: 7 });
    const e = (await fh(['x']).catch((err: unknown) => err)) as { name: string; $response?: { headers: Record<string, string> } };
    expect(e.name).toBe('ServiceUnavailableException');
    expect(e.$response?.headers['retry-after']).toBe('7');
    expect(fake.firehose.size).toBe(0);
    expect(fake.requests.map((r) => r.fault)).toEqual(['status', 'throttle', 'throttle', 'throttle', 'throttle', 'status', 'status']);
  });

  it('the SDK retries whole-call throttles on its own (standard mode), never partial failures', async () => {
    fake.fail('PutRecordBatch', { kind: 'throttle' });
    fake.fail('PutRecordBatch', { kind: 'partial', indices: [0] });
    const out = await fh(['a'], 'audit', cfg({ maxAttempts: 3 }));
    expect(out.FailedPutCount).toBe(1);
    expect(fake.requests.map((r) => r.status)).toEqual([503, 200]);
  });

  it('slow: answers after the delay (and still stores when the client gave up)', async () => {
    // NB: @smithy/node-http-handler 4.14 only *warns* on requestTimeout unless throwOnRequestTimeout is set.
    fake.fail('PutRecords', { kind: 'slow', ms: 300 });
    const e = await failure(ks([{ k: 'k', d: 'late' }], cfg({ requestHandler: new NodeHttpHandler({ requestTimeout: 100, throwOnRequestTimeout: true }) })));
    expect(e.name).toBe('TimeoutError');
    await new Promise((r) => setTimeout(r, 350));
    expect(fake.kinesis.get('events')).toEqual([{ partitionKey: 'k', data: 'late' }]);
    fake.fail('PutRecords', { kind: 'slow', ms: 50 });
    const t0 = Date.now();
    await ks([{ k: 'k', d: 'on time' }]);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(45);
  });

  it('reset drops the call; accept-then-reset stores it but the client sees a reset', async () => {
    fake.fail('PutRecordBatch', { kind: 'reset' });
    const e1 = await failure(fh(['lost']));
    expect(e1.code ?? e1.name).toMatch(/ECONNRESET|socket hang up/i);
    fake.fail('PutRecordBatch', { kind: 'accept-then-reset' });
    const e2 = await failure(fh(['kept']));
    expect(e2.code ?? e2.name).toMatch(/ECONNRESET|socket hang up/i);
    expect(fake.firehose.get('audit')).toEqual(['kept']);
    expect(fake.requests.map((r) => [r.status, r.error])).toEqual([
      [0, 'reset'],
      [0, 'accept-then-reset'],
    ]);
  });

  it('stop refuses connections; start listens again on the same port', async () => {
    const url = fake.url;
    const client = new FirehoseClient(cfg());
    await client.send(new PutRecordBatchCommand({ DeliveryStreamName: 'audit', Records: [{ Data: Buffer.from('1') }] })); // keep-alive connection open
    await fake.stop();
    const e = await failure(client.send(new PutRecordBatchCommand({ DeliveryStreamName: 'audit', Records: [{ Data: Buffer.from('2') }] })));
    expect(e.code ?? e.name).toMatch(/ECONNREFUSED|ECONNRESET/);
    await fake.start();
    expect(fake.url).toBe(url);
    await client.send(new PutRecordBatchCommand({ DeliveryStreamName: 'audit', Records: [{ Data: Buffer.from('3') }] }));
    expect(fake.firehose.get('audit')).toEqual(['1', '3']);
  });

  it('refuses nonsense fault scripts', () => {
    expect(() => fake.fail('PutLogEvents', { kind: 'partial', indices: [0] })).toThrow(/rejected/);
    expect(() => fake.fail('PutRecords', { kind: 'rejected', tooOldEndIndex: 1 })).toThrow();
  });
});
