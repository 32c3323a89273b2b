import { createHash } from 'node:crypto';
import { KinesisClient, PutRecordsCommand, type PutRecordsCommandOutput } from '@aws-sdk/client-kinesis';
import { AwsClientHolder, awsCall, classifyWithHolder, parseArn } from './aws.js';
import { kinesisSchema, parseStored } from './config.js';
import type { EventRecord, LoadedDestination, SendOutcome, Target, TargetEnv, TargetLimits } from './types.js';
import { precheck, timeoutOf, utf8Length } from './util.js';

/**
 * Kinesis Data Streams: PutRecords with StreamARN and StreamName, PartitionKey = event_id. A
 * record counts data + partition key. HTTP 200 with FailedRecordCount: Records[i] lines up;
 * ProvisionedThroughputExceededException / InternalFailure (and KMSThrottlingException) are
 * retryable, other KMS* codes are final (dead), an unknown code is retried. Whole call:
 * ProvisionedThroughputExceeded / LimitExceeded → throttled, ResourceNotFound / AccessDenied /
 * KMS access errors → auth.
 */
export const KINESIS_LIMITS: TargetLimits = { maxRecords: 500, maxBatchBytes: 5 * 1024 * 1024, maxRecordBytes: 1024 * 1024, overheadBytes: 0 };

/** 1–256 characters; the event id, or a hash of the body if an event ever lacks one. */
export function partitionKey(r: EventRecord): string {
  if (r.eventId) return r.eventId.slice(0, 256);
  return createHash('sha256').update(r.body).digest('hex');
}

const RETRYABLE = new Set(['ProvisionedThroughputExceededException', 'InternalFailure', 'InternalFailureException', 'KMSThrottlingException', 'ServiceUnavailableException']);

export function createKinesisTarget(dest: LoadedDestination, env: TargetEnv): Target {
  const cfg = parseStored(kinesisSchema, dest.target);
  const arn = parseArn(cfg.stream_arn, 'kinesis');
  const m = /^stream\/(.+)$/.exec(arn.resource);
  if (!m) throw new Error(`not a stream ARN: ${cfg.stream_arn}`);
  const streamName = m[1]!;
  const holder = new AwsClientHolder((config) => new KinesisClient(config), dest, env, { role: cfg.auth.role ?? null, creds: cfg.auth.creds ?? null }, arn.region);
  // requestHandler is an HTTP/1.1 NodeHttpHandler: the Kinesis client defaults to HTTP/2
  const timeoutMs = timeoutOf(env);
  const what = `Kinesis PutRecords ${streamName}`;
  const recordBytes = (r: EventRecord) => utf8Length(r.body) + utf8Length(partitionKey(r));

  return {
    kind: 'kinesis',
    limits: KINESIS_LIMITS,
    recordBytes,
    async send(records, signal): Promise<SendOutcome> {
      const pre = precheck(records, KINESIS_LIMITS, recordBytes);
      if ('outcome' in pre) return pre.outcome;
      const { keep, dead } = pre;
      if (keep.length === 0) return { kind: 'done', retry: [], dead };
      const command = new PutRecordsCommand({
        StreamARN: cfg.stream_arn,
        StreamName: streamName,
        Records: keep.map((i) => ({ Data: Buffer.from(records[i]!.body, 'utf8'), PartitionKey: partitionKey(records[i]!) })),
      });
      const res = await awsCall<PutRecordsCommandOutput>(holder.get(), command, timeoutMs, signal);
      if (!res.ok) return classifyWithHolder(what, res, timeoutMs, holder);
      const out = res.value;
      const retry: number[] = [];
      if ((out.FailedRecordCount ?? 0) > 0) {
        const results = out.Records ?? [];
        if (results.length !== keep.length) return { kind: 'retry', reason: `${what}: ${out.FailedRecordCount} failed but ${results.length} results for ${keep.length} records`, unknownOutcome: true };
        results.forEach((r, j) => {
          const code = r.ErrorCode;
          if (!code) return;
          if (code.startsWith('KMS') && !RETRYABLE.has(code)) dead.push({ index: keep[j]!, reason: holder.secrets.scrub(`Kinesis ${code}: ${r.ErrorMessage ?? ''}`.trim()) });
          else retry.push(keep[j]!);
        });
      }
      dead.sort((a, b) => a.index - b.index);
      return { kind: 'done', retry, dead };
    },
    close() {
      holder.close();
    },
  };
}
