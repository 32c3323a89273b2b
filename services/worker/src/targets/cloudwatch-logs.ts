import {
  CloudWatchLogsClient,
  CreateLogStreamCommand,
  PutLogEventsCommand,
  type PutLogEventsCommandOutput,
} from '@aws-sdk/client-cloudwatch-logs';
import { AwsClientHolder, awsCall, classifyWithHolder, errName, parseArn } from './aws.js';
import { cloudwatchLogsSchema, parseStored } from './config.js';
import type { EventRecord, LoadedDestination, SendOutcome, Target, TargetEnv, TargetLimits } from './types.js';
import { precheck, timeoutOf, utf8Length, type Dead } from './util.js';

/**
 * CloudWatch Logs: PutLogEvents into log stream `warren-<destId>` of the group named by the ARN
 * (`arn:aws:logs:<region>:<acct>:log-group:<name>[:*]`). Events `{timestamp, message}` are sent
 * sorted by timestamp (stable); every index in the outcome is the caller's index.
 *
 * - Before sending, events outside [now − 14 d + 5 min, now + 2 h] (or without a finite
 *   timestamp) are dead ("too old" / "too new"), the rest is sent.
 * - The caller splits batches at 24 h spans (event-delivery.md §2.8). If a batch still spans more
 *   than 24 h, send() answers `too_large` without a call, so that the caller's split-in-half
 *   resolves it and no valid event is dead-lettered for it.
 * - `rejectedLogEventsInfo` ranges (indices into the sorted events; tooOld and expired end
 *   indices exclusive, tooNew start index inclusive, as documented) → dead.
 * - ResourceNotFoundException → CreateLogStream (ResourceAlreadyExistsException counts as
 *   success), then the same events are sent once more within this send(). If CreateLogStream says
 *   ResourceNotFoundException, the log group is missing → auth (pause).
 * - ThrottlingException → throttled; DataAlreadyAcceptedException → done (already stored).
 * - Sequence tokens are not used (no longer required by the service).
 */
export const CLOUDWATCH_EVENT_OVERHEAD = 26;
export const CLOUDWATCH_LIMITS: TargetLimits = { maxRecords: 10_000, maxBatchBytes: 1_048_576, maxRecordBytes: 1_048_576, overheadBytes: CLOUDWATCH_EVENT_OVERHEAD };

const DAY = 24 * 60 * 60 * 1000;
export const CLOUDWATCH_MAX_AGE_MS = 14 * DAY - 5 * 60 * 1000;
export const CLOUDWATCH_MAX_FUTURE_MS = 2 * 60 * 60 * 1000;
export const CLOUDWATCH_MAX_SPAN_MS = DAY;

export function logGroupNameOf(arn: string): string {
  const parsed = parseArn(arn, 'logs');
  const m = /^log-group:(.+?)(?::\*)?$/.exec(parsed.resource);
  if (!m) throw new Error(`not a log group ARN: ${arn}`);
  return m[1]!;
}

export function logStreamNameOf(destId: string): string {
  return `warren-${destId}`;
}

export function createCloudwatchLogsTarget(dest: LoadedDestination, env: TargetEnv): Target {
  const cfg = parseStored(cloudwatchLogsSchema, dest.target);
  const region = parseArn(cfg.log_group_arn, 'logs').region;
  const logGroupName = logGroupNameOf(cfg.log_group_arn);
  const logStreamName = logStreamNameOf(dest.id);
  const holder = new AwsClientHolder((config) => new CloudWatchLogsClient(config), dest, env, { role: cfg.auth.role ?? null, creds: cfg.auth.creds ?? null }, region);
  const timeoutMs = timeoutOf(env);
  const where = `${logGroupName}/${logStreamName}`;
  const recordBytes = (r: EventRecord) => utf8Length(r.body) + CLOUDWATCH_EVENT_OVERHEAD;

  const put = (order: number[], records: EventRecord[], signal?: AbortSignal) =>
    awsCall<PutLogEventsCommandOutput>(
      holder.get(),
      new PutLogEventsCommand({ logGroupName, logStreamName, logEvents: order.map((i) => ({ timestamp: records[i]!.timestamp, message: records[i]!.body })) }),
      timeoutMs,
      signal,
    );

  return {
    kind: 'cloudwatch_logs',
    limits: CLOUDWATCH_LIMITS,
    recordBytes,
    async send(records, signal): Promise<SendOutcome> {
      const pre = precheck(records, CLOUDWATCH_LIMITS, recordBytes);
      if ('outcome' in pre) return pre.outcome;
      const dead: Dead = pre.dead;
      const now = Date.now();
      const order: number[] = [];
      for (const i of pre.keep) {
        const ts = records[i]!.timestamp;
        if (!Number.isFinite(ts)) dead.push({ index: i, reason: 'CloudWatch Logs: event without a valid timestamp' });
        else if (ts < now - CLOUDWATCH_MAX_AGE_MS) dead.push({ index: i, reason: `CloudWatch Logs: event too old (${new Date(ts).toISOString()}, more than 14 days ago)` });
        else if (ts > now + CLOUDWATCH_MAX_FUTURE_MS) dead.push({ index: i, reason: `CloudWatch Logs: event too new (${new Date(ts).toISOString()}, more than 2 h ahead)` });
        else order.push(i);
      }
      if (order.length === 0) return { kind: 'done', retry: [], dead };
      order.sort((a, b) => records[a]!.timestamp - records[b]!.timestamp || a - b);
      const span = records[order[order.length - 1]!]!.timestamp - records[order[0]!]!.timestamp;
      if (span > CLOUDWATCH_MAX_SPAN_MS) return { kind: 'too_large', reason: `CloudWatch Logs: batch spans ${Math.round(span / 60_000)} min > 24 h (the caller splits at 24 h)` };

      let res = await put(order, records, signal);
      if (!res.ok && errName(res.error) === 'ResourceNotFoundException') {
        const created = await awsCall(holder.get(), new CreateLogStreamCommand({ logGroupName, logStreamName }), timeoutMs, signal);
        if (!created.ok) {
          const name = errName(created.error);
          if (name === 'ResourceNotFoundException') return { kind: 'auth', reason: `CloudWatch Logs: log group ${logGroupName} not found` };
          if (name !== 'ResourceAlreadyExistsException') {
            const o = classifyWithHolder(`CloudWatch Logs CreateLogStream ${where}`, created, timeoutMs, holder);
            // nothing was stored by the failed PutLogEvents: whatever happened to CreateLogStream
            return o.kind === 'retry' ? { ...o, unknownOutcome: false } : o;
          }
        }
        res = await put(order, records, signal);
      }
      if (!res.ok) {
        if (errName(res.error) === 'DataAlreadyAcceptedException') return { kind: 'done', retry: [], dead };
        if (errName(res.error) === 'ResourceNotFoundException') return { kind: 'auth', reason: `CloudWatch Logs: ${where} not found after CreateLogStream` };
        return classifyWithHolder(`CloudWatch Logs PutLogEvents ${where}`, res, timeoutMs, holder);
      }
      const info = res.value.rejectedLogEventsInfo;
      if (info) {
        const seen = new Set<number>();
        const mark = (from: number, to: number, reason: string) => {
          for (let j = Math.max(0, from); j < Math.min(order.length, to); j++) {
            if (seen.has(j)) continue;
            seen.add(j);
            dead.push({ index: order[j]!, reason });
          }
        };
        if (info.tooOldLogEventEndIndex != null) mark(0, info.tooOldLogEventEndIndex, 'CloudWatch Logs rejected the event: too old');
        if (info.expiredLogEventEndIndex != null) mark(0, info.expiredLogEventEndIndex, 'CloudWatch Logs rejected the event: older than the log group retention');
        if (info.tooNewLogEventStartIndex != null) mark(info.tooNewLogEventStartIndex, order.length, 'CloudWatch Logs rejected the event: too new');
      }
      dead.sort((a, b) => a.index - b.index);
      return { kind: 'done', retry: [], dead };
    },
    close() {
      holder.close();
    },
  };
}
