import { FirehoseClient, PutRecordBatchCommand, type PutRecordBatchCommandOutput } from '@aws-sdk/client-firehose';
import { AwsClientHolder, awsCall, classifyWithHolder, parseArn } from './aws.js';
import { firehoseSchema, parseStored } from './config.js';
import type { EventRecord, LoadedDestination, SendOutcome, Target, TargetEnv, TargetLimits } from './types.js';
import { precheck, timeoutOf, utf8Length } from './util.js';

/**
 * Amazon Data Firehose: PutRecordBatch with DeliveryStreamName (the input has no ARN field).
 * Each record is the envelope plus "\n" (Firehose adds no delimiter). HTTP 200 with
 * FailedPutCount > 0: RequestResponses[i] lines up with Records[i]; an entry with ErrorCode
 * (ServiceUnavailableException / InternalFailure) is retryable — Firehose has no final per-record
 * codes. Whole call: ServiceUnavailableException → throttled, ResourceNotFoundException → auth
 * (the stream is gone: pause), InvalidArgumentException → too_large when its message is about
 * sizes, else rejected; InvalidKMSResourceException → auth.
 */
export const FIREHOSE_LIMITS: TargetLimits = { maxRecords: 500, maxBatchBytes: 4 * 1024 * 1024, maxRecordBytes: 1000 * 1024, overheadBytes: 0 };

export function createFirehoseTarget(dest: LoadedDestination, env: TargetEnv): Target {
  const cfg = parseStored(firehoseSchema, dest.target);
  const arn = parseArn(cfg.delivery_stream_arn, 'firehose');
  const m = /^deliverystream\/(.+)$/.exec(arn.resource);
  if (!m) throw new Error(`not a delivery stream ARN: ${cfg.delivery_stream_arn}`);
  const streamName = m[1]!;
  const holder = new AwsClientHolder((config) => new FirehoseClient(config), dest, env, { role: cfg.auth.role ?? null, creds: cfg.auth.creds ?? null }, arn.region);
  const timeoutMs = timeoutOf(env);
  const what = `Firehose PutRecordBatch ${streamName}`;
  const recordBytes = (r: EventRecord) => utf8Length(r.body) + 1;

  return {
    kind: 'firehose',
    limits: FIREHOSE_LIMITS,
    recordBytes,
    async send(records, signal): Promise<SendOutcome> {
      const pre = precheck(records, FIREHOSE_LIMITS, recordBytes);
      if ('outcome' in pre) return pre.outcome;
      const { keep, dead } = pre;
      if (keep.length === 0) return { kind: 'done', retry: [], dead };
      const command = new PutRecordBatchCommand({
        DeliveryStreamName: streamName,
        Records: keep.map((i) => ({ Data: Buffer.from(`${records[i]!.body}\n`, 'utf8') })),
      });
      const res = await awsCall<PutRecordBatchCommandOutput>(holder.get(), command, timeoutMs, signal);
      if (!res.ok) return classifyWithHolder(what, res, timeoutMs, holder);
      const out = res.value;
      const retry: number[] = [];
      if ((out.FailedPutCount ?? 0) > 0) {
        const responses = out.RequestResponses ?? [];
        if (responses.length !== keep.length) return { kind: 'retry', reason: `${what}: ${out.FailedPutCount} failed but ${responses.length} responses for ${keep.length} records`, unknownOutcome: true };
        responses.forEach((r, j) => {
          if (r.ErrorCode) retry.push(keep[j]!);
        });
      }
      return { kind: 'done', retry, dead };
    },
    close() {
      holder.close();
    },
  };
}
