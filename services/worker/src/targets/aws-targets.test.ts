import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { startAwsFake, type AwsFake } from '../../../../test/support/fakes/aws.js';
import { createTarget } from './index.js';
import { dest, record, records } from './test-helpers.js';
import type { Target, TargetEnv } from './types.js';

const KEY = 'AKIAWARRENTEST000001';
const SECRET = 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYTESTSECRET';
const BASE_KEY = 'AKIAWARRENBASE000001';
const BASE_SECRET = 'warrenBaseSecretKeyForAssumeRole0000000';
const ROLE = 'arn:aws:iam::210987654321:role/warren-delivery';
const REGION = 'eu-west-2';
const FIREHOSE_ARN = `arn:aws:firehose:${REGION}:210987654321:deliverystream/audit-stream`;
const KINESIS_ARN = `arn:aws:kinesis:${REGION}:210987654321:stream/audit-kinesis`;
const LOGS_ARN = `arn:aws:logs:${REGION}:210987654321:log-group:/warren/audit:*`;

const creds = { role: null, creds: { aws_access_key_id: KEY, aws_secret_access_key: SECRET } };
const role = { role: { role_arn: ROLE }, creds: null };

let fake: AwsFake;
let env: TargetEnv;
const open: Target[] = [];
function target(...args: Parameters<typeof createTarget>): Target {
  const t = createTarget(...args);
  open.push(t);
  return t;
}

beforeAll(async () => {
  fake = await startAwsFake({
    credentials: { [KEY]: SECRET, [BASE_KEY]: BASE_SECRET },
    roles: { [ROLE]: { externalId: 'ac_2abcTEST' } },
    expectedRegion: { 'audit-stream': REGION, 'audit-kinesis': REGION, '/warren/audit': REGION },
  });
  env = { awsEndpoint: fake.url, requestTimeoutMs: 3000, awsBaseCredentials: { accessKeyId: BASE_KEY, secretAccessKey: BASE_SECRET } };
});
afterEach(() => {
  for (const t of open.splice(0)) t.close();
  fake.reset();
});
afterAll(async () => {
  await fake?.close();
});

describe('firehose', () => {
  it('delivers each record with a trailing newline to the stream named by the ARN, signed for its region', async () => {
    const t = target(dest('firehose', { auth: creds, delivery_stream_arn: FIREHOSE_ARN }), env);
    const rs = records(3);
    expect(await t.send(rs)).toEqual({ kind: 'done', retry: [], dead: [] });
    expect(fake.firehose.get('audit-stream')).toEqual(rs.map((r) => `${r.body}\n`));
    expect(fake.requests[0]).toMatchObject({ op: 'PutRecordBatch', status: 200, region: REGION, service: 'firehose' });
    expect(t.recordBytes(rs[0]!)).toBe(Buffer.byteLength(rs[0]!.body) + 1);
  });

  it('partial failure: exactly the failed indices come back as retry, only the others are stored', async () => {
    const t = target(dest('firehose', { auth: creds, delivery_stream_arn: FIREHOSE_ARN }), env);
    const rs = records(5);
    fake.fail('PutRecordBatch', { kind: 'partial', indices: [1, 3] });
    expect(await t.send(rs)).toEqual({ kind: 'done', retry: [1, 3], dead: [] });
    expect(fake.firehose.get('audit-stream')).toEqual([rs[0], rs[2], rs[4]].map((r) => `${r!.body}\n`));
  });

  it('whole-call ServiceUnavailable is a throttle; 404 ResourceNotFound pauses; wrong secret pauses', async () => {
    const t = target(dest('firehose', { auth: creds, delivery_stream_arn: FIREHOSE_ARN }), env);
    fake.fail('PutRecordBatch', { kind: 'throttle' });
    expect(await t.send(records(1))).toMatchObject({ kind: 'throttled' });
    fake.fail('PutRecordBatch', { kind: 'status', status: 404 });
    expect(await t.send(records(1))).toMatchObject({ kind: 'auth', reason: expect.stringContaining('ResourceNotFoundException') });
    const bad = target(dest('firehose', { auth: { role: null, creds: { aws_access_key_id: KEY, aws_secret_access_key: 'not-the-secret-at-all' } }, delivery_stream_arn: FIREHOSE_ARN }), env);
    const o = await bad.send(records(1));
    expect(o).toMatchObject({ kind: 'auth', reason: expect.stringContaining('InvalidSignatureException') });
    expect(JSON.stringify(o)).not.toContain('not-the-secret-at-all');
    expect(fake.firehose.get('audit-stream')).toBeUndefined();
  });

  it('throttle honours Retry-After when the answer carries one', async () => {
    const t = target(dest('firehose', { auth: creds, delivery_stream_arn: FIREHOSE_ARN }), env);
    fake.fail('PutRecordBatch', { kind: 'status', status: 429, code: 'ThrottlingException', retryAfterSeconds: 7 });
    expect(await t.send(records(1))).toMatchObject({ kind: 'throttled', retryAfterMs: 7000 });
  });

  it('limits: an oversize record is dead and the rest delivered; an oversize batch is too_large without a call', async () => {
    const t = target(dest('firehose', { auth: creds, delivery_stream_arn: FIREHOSE_ARN }), env);
    const rs = [record(), record(Date.now(), 1000 * 1024), record()];
    const o = await t.send(rs);
    expect(o).toMatchObject({ kind: 'done', retry: [], dead: [{ index: 1, reason: expect.stringContaining('too large') }] });
    expect(fake.firehose.get('audit-stream')).toHaveLength(2);
    const big = Array.from({ length: 5 }, () => record(Date.now(), 900 * 1024));
    expect(await t.send(big)).toMatchObject({ kind: 'too_large' });
    expect(await t.send(records(501))).toMatchObject({ kind: 'too_large' });
    expect(fake.requests).toHaveLength(1);
  });

  it("the service's own size refusal maps to too_large, another 400 to rejected, 500 to retry", async () => {
    const t = target(dest('firehose', { auth: creds, delivery_stream_arn: FIREHOSE_ARN }), env);
    fake.fail('PutRecordBatch', { kind: 'status', status: 400, code: 'InvalidArgumentException', message: 'Records size 5000000 bytes exceeds the limit of 4194304 bytes' });
    expect(await t.send(records(1))).toMatchObject({ kind: 'too_large' });
    fake.fail('PutRecordBatch', { kind: 'status', status: 400, code: 'InvalidArgumentException', message: 'bad record' });
    expect(await t.send(records(1))).toMatchObject({ kind: 'rejected' });
    fake.fail('PutRecordBatch', { kind: 'status', status: 500 });
    expect(await t.send(records(1))).toMatchObject({ kind: 'retry', unknownOutcome: false });
    expect(fake.requests).toHaveLength(3); // maxAttempts 1: the SDK never retries on its own
  });
});

describe('kinesis', () => {
  it('delivers with StreamARN + StreamName, PartitionKey = event id, counting data + key', async () => {
    const t = target(dest('kinesis', { auth: creds, stream_arn: KINESIS_ARN }), env);
    const rs = records(3);
    expect(await t.send(rs)).toEqual({ kind: 'done', retry: [], dead: [] });
    expect(fake.kinesis.get('audit-kinesis')).toEqual(rs.map((r) => ({ partitionKey: r.eventId, data: r.body })));
    expect(t.recordBytes(rs[0]!)).toBe(Buffer.byteLength(rs[0]!.body) + rs[0]!.eventId.length);
  });

  it('partial failure: throughput errors retry, KMS errors are dead; only accepted records stored', async () => {
    const t = target(dest('kinesis', { auth: creds, stream_arn: KINESIS_ARN }), env);
    const rs = records(6);
    fake.fail('PutRecords', { kind: 'partial', indices: [0, 4] });
    expect(await t.send(rs)).toEqual({ kind: 'done', retry: [0, 4], dead: [] });
    expect(fake.kinesis.get('audit-kinesis')!.map((r) => r.partitionKey)).toEqual([1, 2, 3, 5].map((i) => rs[i]!.eventId));
    fake.reset();
    fake.fail('PutRecords', { kind: 'partial', indices: [2], code: 'KMSAccessDeniedException', message: 'no access to the key' });
    const o = await t.send(rs);
    expect(o).toEqual({ kind: 'done', retry: [], dead: [{ index: 2, reason: expect.stringContaining('KMSAccessDeniedException') }] });
    expect(fake.kinesis.get('audit-kinesis')).toHaveLength(5);
  });

  it('whole-call ProvisionedThroughputExceeded / LimitExceeded are throttles', async () => {
    const t = target(dest('kinesis', { auth: creds, stream_arn: KINESIS_ARN }), env);
    fake.fail('PutRecords', { kind: 'throttle' });
    expect(await t.send(records(2))).toMatchObject({ kind: 'throttled' });
    fake.fail('PutRecords', { kind: 'status', status: 400, code: 'LimitExceededException' });
    expect(await t.send(records(2))).toMatchObject({ kind: 'throttled' });
  });

  it('a slow answer beyond requestTimeoutMs is a retry with unknown outcome; a reset too', async () => {
    const t = target(dest('kinesis', { auth: creds, stream_arn: KINESIS_ARN }), { ...env, requestTimeoutMs: 300 });
    fake.fail('PutRecords', { kind: 'slow', ms: 1500 });
    const started = Date.now();
    expect(await t.send(records(1))).toMatchObject({ kind: 'retry', unknownOutcome: true });
    expect(Date.now() - started).toBeLessThan(1200);
    fake.fail('PutRecords', { kind: 'accept-then-reset' });
    expect(await t.send(records(1))).toMatchObject({ kind: 'retry', unknownOutcome: true });
  });

  it('connection refused is a retry with a known outcome (nothing sent); an aborted signal too', async () => {
    const t = target(dest('kinesis', { auth: creds, stream_arn: KINESIS_ARN }), { ...env, awsEndpoint: 'http://127.0.0.1:1' });
    expect(await t.send(records(1))).toMatchObject({ kind: 'retry', unknownOutcome: false, reason: expect.stringContaining('ECONNREFUSED') });
    const u = target(dest('kinesis', { auth: creds, stream_arn: KINESIS_ARN }), env);
    const ac = new AbortController();
    ac.abort();
    expect(await u.send(records(1), ac.signal)).toMatchObject({ kind: 'retry', unknownOutcome: false });
  });

  it('an abort during the call is a retry with unknown outcome', async () => {
    const t = target(dest('kinesis', { auth: creds, stream_arn: KINESIS_ARN }), env);
    fake.fail('PutRecords', { kind: 'slow', ms: 1500 });
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 150);
    expect(await t.send(records(1), ac.signal)).toMatchObject({ kind: 'retry', unknownOutcome: true, reason: expect.stringContaining('aborted') });
  });
});

describe('cloudwatch logs', () => {
  const target0 = (e = env) => target(dest('cloudwatch_logs', { auth: creds, log_group_arn: LOGS_ARN }, 'ed_cw1'), e);

  it('creates the missing stream warren-<destId>, then delivers sorted by time; the next send needs no create', async () => {
    const t = target0();
    const now = Date.now();
    const rs = [record(now - 3000), record(now - 1000), record(now - 2000)];
    expect(await t.send(rs)).toEqual({ kind: 'done', retry: [], dead: [] });
    expect(fake.logStreams.has('/warren/audit/warren-ed_cw1')).toBe(true);
    expect(fake.logs.get('/warren/audit/warren-ed_cw1')!.map((e) => e.message)).toEqual([rs[0], rs[2], rs[1]].map((r) => r!.body));
    expect(fake.requests.map((r) => r.op)).toEqual(['PutLogEvents', 'CreateLogStream', 'PutLogEvents']);
    await t.send(records(2));
    expect(fake.requests.map((r) => r.op)).toEqual(['PutLogEvents', 'CreateLogStream', 'PutLogEvents', 'PutLogEvents']);
    expect(t.recordBytes(rs[0]!)).toBe(Buffer.byteLength(rs[0]!.body) + 26);
  });

  it('events outside [now − 14 d, now + 2 h] are dead before sending, the rest land', async () => {
    const t = target0();
    const now = Date.now();
    const rs = [record(now - 15 * 86_400_000), record(now), record(now + 3 * 3_600_000), record(now - 1000)];
    const o = await t.send(rs);
    expect(o).toEqual({
      kind: 'done',
      retry: [],
      dead: [
        { index: 0, reason: expect.stringContaining('too old') },
        { index: 2, reason: expect.stringContaining('too new') },
      ],
    });
    expect(fake.logs.get('/warren/audit/warren-ed_cw1')!.map((e) => e.message)).toEqual([rs[3]!.body, rs[1]!.body]);
  });

  it("the service's rejectedLogEventsInfo ranges are dead, mapped back to the caller's indices", async () => {
    const t = target0();
    fake.logStreams.add('/warren/audit/warren-ed_cw1');
    const now = Date.now();
    // caller order: times 5,1,4,2,3 → sorted positions: idx1(1) idx3(2) idx4(3) idx2(4) idx0(5)
    const rs = [record(now - 5), record(now - 50), record(now - 20), record(now - 40), record(now - 30)];
    fake.fail('PutLogEvents', { kind: 'rejected', tooOldEndIndex: 1, expiredEndIndex: 2, tooNewStartIndex: 4 });
    const o = await t.send(rs);
    expect(o).toEqual({
      kind: 'done',
      retry: [],
      dead: [
        { index: 0, reason: expect.stringContaining('too new') },
        { index: 1, reason: expect.stringContaining('too old') },
        { index: 3, reason: expect.stringContaining('retention') },
      ],
    });
    expect(fake.logs.get('/warren/audit/warren-ed_cw1')!.map((e) => e.message)).toEqual([rs[4]!.body, rs[2]!.body]);
  });

  it('a missing log group (CreateLogStream → ResourceNotFound) pauses; ThrottlingException throttles; > 24 h span is too_large', async () => {
    const t = target0();
    fake.fail('CreateLogStream', { kind: 'status', status: 400, code: 'ResourceNotFoundException', message: 'The specified log group does not exist.' });
    expect(await t.send(records(1))).toMatchObject({ kind: 'auth', reason: expect.stringContaining('/warren/audit') });
    fake.logStreams.add('/warren/audit/warren-ed_cw1');
    fake.fail('PutLogEvents', { kind: 'throttle' });
    expect(await t.send(records(1))).toMatchObject({ kind: 'throttled' });
    const now = Date.now();
    expect(await t.send([record(now), record(now - 25 * 3_600_000)])).toMatchObject({ kind: 'too_large', reason: expect.stringContaining('24 h') });
  });

  it('a stream created concurrently (ResourceAlreadyExists) counts as created', async () => {
    const t = target0();
    fake.fail('PutLogEvents', { kind: 'status', status: 400, code: 'ResourceNotFoundException', message: 'The specified log stream does not exist.' });
    fake.logStreams.add('/warren/audit/warren-ed_cw1');
    expect(await t.send(records(2))).toEqual({ kind: 'done', retry: [], dead: [] });
    expect(fake.requests.map((r) => [r.op, r.error])).toEqual([['PutLogEvents', 'ResourceNotFoundException'], ['CreateLogStream', 'ResourceAlreadyExistsException'], ['PutLogEvents', undefined]]);
  });
});

describe('role auth (STS AssumeRole)', () => {
  it('assumes the role with ExternalId = account id and session warren-<destId>, then signs with the temporary credentials (cached)', async () => {
    const t = target(dest('kinesis', { auth: role, stream_arn: KINESIS_ARN }, 'ed_role1'), env);
    expect(await t.send(records(2))).toEqual({ kind: 'done', retry: [], dead: [] });
    expect(await t.send(records(2))).toEqual({ kind: 'done', retry: [], dead: [] });
    expect(fake.assumeRoleCalls).toEqual([
      { roleArn: ROLE, externalId: 'ac_2abcTEST', sessionName: 'warren-ed_role1', durationSeconds: 3600, callerAccessKeyId: BASE_KEY, ok: true },
    ]);
    const sts = fake.requests.find((r) => r.op === 'AssumeRole')!;
    expect(sts).toMatchObject({ service: 'sts', region: REGION });
    const puts = fake.requests.filter((r) => r.op === 'PutRecords');
    expect(puts).toHaveLength(2);
    for (const p of puts) expect(p.accessKeyId).toMatch(/^ASIA/);
    expect(fake.kinesis.get('audit-kinesis')).toHaveLength(4);
  });

  it('a role whose trust policy wants another ExternalId is an auth failure (AccessDenied)', async () => {
    const other = 'arn:aws:iam::210987654321:role/other';
    const f2 = await startAwsFake({ credentials: { [BASE_KEY]: BASE_SECRET }, roles: { [other]: { externalId: 'ac_someoneelse' } } });
    try {
      const t = target(dest('firehose', { auth: { role: { role_arn: other }, creds: null }, delivery_stream_arn: FIREHOSE_ARN }), { ...env, awsEndpoint: f2.url });
      const o = await t.send(records(1));
      expect(o).toMatchObject({ kind: 'auth', reason: expect.stringContaining('AccessDenied') });
      expect(JSON.stringify(o)).not.toContain(BASE_SECRET);
      expect(f2.assumeRoleCalls).toMatchObject([{ externalId: 'ac_2abcTEST', ok: false }]);
      expect(f2.requests.filter((r) => r.op === 'PutRecordBatch')).toHaveLength(0);
    } finally {
      await f2.close();
    }
  });

  it('wrong base credentials for STS are an auth failure; STS throttling a throttle; STS down a retry with nothing sent', async () => {
    const t = target(dest('firehose', { auth: role, delivery_stream_arn: FIREHOSE_ARN }), { ...env, awsBaseCredentials: { accessKeyId: BASE_KEY, secretAccessKey: 'wrong-base-secret' } });
    expect(await t.send(records(1))).toMatchObject({ kind: 'auth', reason: expect.stringContaining('SignatureDoesNotMatch') });
    const u = target(dest('firehose', { auth: role, delivery_stream_arn: FIREHOSE_ARN }), env);
    fake.fail('AssumeRole', { kind: 'throttle' });
    expect(await u.send(records(1))).toMatchObject({ kind: 'throttled' });
    fake.fail('AssumeRole', { kind: 'status', status: 500 });
    expect(await u.send(records(1))).toMatchObject({ kind: 'retry', unknownOutcome: false });
    expect(fake.requests.filter((r) => r.op === 'AssumeRole')).toHaveLength(3);
    expect(fake.requests.filter((r) => r.op === 'PutRecordBatch')).toHaveLength(0);
    expect(await u.send(records(1))).toEqual({ kind: 'done', retry: [], dead: [] });
  });

  it('refreshes the assumed-role credentials once less than 5 minutes remain before Expiration', async () => {
    // Real clock (mocking Date breaks the SDK's clock-skew correction, which reads the server's
    // Date header). Sessions of 302 s: valid for about 2 s more than the SDK's 5-minute margin.
    const f2 = await startAwsFake({ credentials: { [BASE_KEY]: BASE_SECRET }, roles: { [ROLE]: { externalId: 'ac_2abcTEST' } }, sessionSeconds: 302 });
    try {
      const t = target(dest('kinesis', { auth: role, stream_arn: KINESIS_ARN }), { ...env, awsEndpoint: f2.url });
      expect(await t.send(records(1))).toMatchObject({ kind: 'done' });
      expect(await t.send(records(1))).toMatchObject({ kind: 'done' });
      expect(f2.assumeRoleCalls).toHaveLength(1);
      await new Promise((r) => setTimeout(r, 2100)); // now < 5 min left
      expect(await t.send(records(1))).toMatchObject({ kind: 'done' });
      expect(await t.send(records(1))).toMatchObject({ kind: 'done' });
      expect(f2.assumeRoleCalls).toHaveLength(2);
      const keys = f2.requests.filter((r) => r.op === 'PutRecords').map((r) => r.accessKeyId);
      expect(keys[0]).toBe(keys[1]);
      expect(keys[2]).not.toBe(keys[1]);
      expect(keys[3]).toBe(keys[2]);
    } finally {
      await f2.close();
    }
  });

  it('temporary credentials refused early (expired token) are dropped: retry now, a fresh AssumeRole next time', async () => {
    const t = target(dest('kinesis', { auth: role, stream_arn: KINESIS_ARN }), env);
    expect(await t.send(records(1))).toMatchObject({ kind: 'done' });
    fake.expireTemporaryCredentials();
    expect(await t.send(records(1))).toMatchObject({ kind: 'retry', unknownOutcome: false, reason: expect.stringContaining('ExpiredToken') });
    expect(await t.send(records(1))).toMatchObject({ kind: 'done' });
    expect(fake.assumeRoleCalls).toHaveLength(2);
  });
});

describe('configuration', () => {
  it('an unusable stored target gives a target that pauses (auth) instead of throwing', async () => {
    const t = target(dest('firehose', { auth: creds, delivery_stream_arn: 'arn:aws:kinesis:eu-west-1:210987654321:stream/x' }), env);
    expect(await t.send(records(1))).toMatchObject({ kind: 'auth', reason: expect.stringContaining('firehose') });
    const u = target(dest('kinesis', { auth: { role: null, creds: null }, stream_arn: KINESIS_ARN }), env);
    expect(await u.send(records(1))).toMatchObject({ kind: 'auth' });
  });

  it('a clock skew refusal is a retry (the SDK corrects its offset from the answer), not a pause', async () => {
    const t = target(dest('firehose', { auth: creds, delivery_stream_arn: FIREHOSE_ARN }), env);
    fake.fail('PutRecordBatch', { kind: 'status', status: 400, code: 'InvalidSignatureException', message: 'Signature expired: 20260101T000000Z is now earlier than 20260101T001000Z (20260101T001500Z - 5 min.)' });
    expect(await t.send(records(1))).toMatchObject({ kind: 'retry', unknownOutcome: false });
  });

  it('an empty batch is done without a call', async () => {
    const t = target(dest('firehose', { auth: creds, delivery_stream_arn: FIREHOSE_ARN }), env);
    expect(await t.send([])).toEqual({ kind: 'done', retry: [], dead: [] });
    expect(fake.requests).toHaveLength(0);
  });
});
