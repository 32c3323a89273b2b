import { randomBytes, randomUUID } from 'node:crypto';
import type http from 'node:http';
import { FakeListener, FaultQueue, mediaType, playFault, readBody, resetConnection } from './http.js';
import { verifySigV4, type SigV4FailureKind, type SigV4Identity } from './sigv4.js';

/**
 * AWS fake: a local `node:http` receiver on 127.0.0.1 (port 0) that speaks the real wire
 * protocols of the event targets (docs/event-delivery.md §1 and §4), so the delivery workers can
 * be tested end to end with the real AWS SDK v3 clients and no cloud.
 *
 * - AWS JSON 1.1 (`POST /`, `Content-Type: application/x-amz-json-1.1`, `X-Amz-Target`):
 *   `Firehose_20150804.PutRecordBatch`, `Kinesis_20131202.PutRecords`,
 *   `Logs_20140328.PutLogEvents | CreateLogStream | DescribeLogStreams`.
 * - STS AssumeRole over the AWS **query** protocol (what `@aws-sdk/client-sts` 3.1169.0 and the
 *   STS client inside `@aws-sdk/credential-providers` `fromTemporaryCredentials` send):
 *   `POST /`, `Content-Type: application/x-www-form-urlencoded`,
 *   `Action=AssumeRole&Version=2011-06-15&RoleArn=…&RoleSessionName=…[&DurationSeconds=…][&ExternalId=…]`,
 *   answered with the XML `AssumeRoleResponse` (namespace https://sts.amazonaws.com/doc/2011-06-15/).
 *   Issued credentials (`ASIA…`) are accepted by the other operations only together with their
 *   signed `X-Amz-Security-Token`, and only until they expire.
 * - Every request is SigV4-verified with the independent signer `aws4` (sigv4.ts): known key,
 *   re-computed signature over exactly the signed headers, `X-Amz-Date` within 5 minutes, scope
 *   service matching the operation, scope region matching a Kinesis `StreamARN` and the optional
 *   `expectedRegion` map.
 * - Limits of §1 are enforced exactly; an oversize call gets a 400 with the real error type.
 * - Answers have the real shapes; records reported failed are never stored as accepted.
 * - A per-operation FIFO fault script (`fail`) drives 5xx, throttles, partial failures,
 *   CloudWatch rejections, slow replies and connection resets.
 *
 * Status codes are AWS's, not HTTP folklore: the JSON services answer authentication failures
 * (`InvalidSignatureException`, `UnrecognizedClientException`, `ExpiredTokenException`,
 * `IncompleteSignatureException`, `MissingAuthenticationTokenException`) with **HTTP 400**, as
 * real Kinesis/Firehose/Logs do; classify them by error name. `authErrorStatus: 403` switches that.
 * STS answers them with 403 (`SignatureDoesNotMatch`, `InvalidClientTokenId`, `AccessDenied`).
 */

export interface AwsFakeOptions {
  /** accessKeyId -> secretAccessKey of the identities that may call. */
  credentials: Record<string, string>;
  /** roles that AssumeRole may assume: roleArn -> required ExternalId (undefined = none required). */
  roles?: Record<string, { externalId?: string }>;
  /** lifetime of credentials returned by AssumeRole, seconds (default: the call's DurationSeconds, else 3600). */
  sessionSeconds?: number;
  /** Firehose delivery stream / Kinesis stream / log group name -> the region its requests must be signed for. */
  expectedRegion?: Record<string, string>;
  /** HTTP status of authentication errors from the JSON services (default 400, what AWS sends). */
  authErrorStatus?: 400 | 403;
  /** Account id used in the ARNs the fake makes up (default 123456789012). */
  accountId?: string;
}

export type AwsOp = 'PutRecordBatch' | 'PutRecords' | 'PutLogEvents' | 'CreateLogStream' | 'DescribeLogStreams' | 'AssumeRole';

export type Fault =
  | { kind: 'status'; status: number; code?: string; message?: string; retryAfterSeconds?: number }
  | { kind: 'throttle' }
  | { kind: 'partial'; indices: number[]; code?: string; message?: string }
  | { kind: 'rejected'; tooOldEndIndex?: number; tooNewStartIndex?: number; expiredEndIndex?: number }
  | { kind: 'slow'; ms: number }
  | { kind: 'reset' }
  | { kind: 'accept-then-reset' };

export interface AwsRequestRecord {
  /** operation name (`PutRecords`, …), or the unknown X-Amz-Target / Action, or `unknown`. */
  op: string;
  /** HTTP status answered; 0 when the connection was reset instead (fault `reset` / `accept-then-reset`). */
  status: number;
  service?: string;
  region?: string;
  accessKeyId?: string;
  /** records / events in the call (when the body could be parsed). */
  records?: number;
  /** the bytes the op's limit counts: Firehose decoded Data, Kinesis Data + PartitionKey, Logs message bytes + 26 per event. */
  bytes?: number;
  /** raw HTTP body length. */
  bodyBytes: number;
  /** error code answered, or `reset` / `accept-then-reset`. */
  error?: string;
  /** the scripted fault applied to this call, if any. */
  fault?: Fault['kind'];
}

export interface AssumeRoleCall {
  roleArn: string;
  externalId?: string;
  sessionName: string;
  durationSeconds?: number;
  callerAccessKeyId: string;
  /** whether credentials were issued (false: AccessDenied or a validation error). */
  ok: boolean;
}

export interface AwsFake {
  url: string;
  /** accepted records: Firehose by DeliveryStreamName (Data decoded from base64 to a utf8 string). */
  firehose: Map<string, string[]>;
  /** accepted records: Kinesis by StreamName (Data decoded). */
  kinesis: Map<string, Array<{ partitionKey: string; data: string }>>;
  /** accepted events: CloudWatch Logs by `${group}/${stream}`. */
  logs: Map<string, Array<{ timestamp: number; message: string }>>;
  /** `${group}/${stream}` that exist; a group exists when first referenced. */
  logStreams: Set<string>;
  /** every AssumeRole call that passed authentication, granted or not. */
  assumeRoleCalls: AssumeRoleCall[];
  /** every request seen, in arrival order, including refused ones. */
  requests: AwsRequestRecord[];
  /** queue a fault for the next `times` calls of op (FIFO); default times 1. */
  fail(op: AwsOp, fault: Fault, times?: number): void;
  /** make every temporary credential issued so far expire now. */
  expireTemporaryCredentials(): void;
  /** refuse connections (listener closed, open connections destroyed) / listen again on the same port. */
  stop(): Promise<void>;
  start(): Promise<void>;
  /** clear records, log streams, faults, calls and requests (issued credentials stay valid; a slow reply in flight still lands). */
  reset(): void;
  close(): Promise<void>;
}

/** The limits of docs/event-delivery.md §1, as the fake enforces them. */
export const AWS_LIMITS = {
  firehose: { maxRecords: 500, maxRecordBytes: 1000 * 1024, maxCallBytes: 4 * 1024 * 1024 },
  kinesis: { maxRecords: 500, maxRecordBytes: 1024 * 1024, maxCallBytes: 5 * 1024 * 1024, maxPartitionKeyChars: 256 },
  logs: {
    maxEvents: 10_000,
    maxBatchBytes: 1_048_576,
    perEventOverhead: 26,
    maxSpanMs: 24 * 3_600_000,
    maxAgeMs: 14 * 24 * 3_600_000,
    maxFutureMs: 2 * 3_600_000,
  },
  sts: { minDurationSeconds: 900, maxDurationSeconds: 43_200 },
} as const;

const TARGETS: Record<string, AwsOp> = {
  'Firehose_20150804.PutRecordBatch': 'PutRecordBatch',
  'Kinesis_20131202.PutRecords': 'PutRecords',
  'Logs_20140328.PutLogEvents': 'PutLogEvents',
  'Logs_20140328.CreateLogStream': 'CreateLogStream',
  'Logs_20140328.DescribeLogStreams': 'DescribeLogStreams',
};

const SERVICE: Record<AwsOp, string> = {
  PutRecordBatch: 'firehose',
  PutRecords: 'kinesis',
  PutLogEvents: 'logs',
  CreateLogStream: 'logs',
  DescribeLogStreams: 'logs',
  AssumeRole: 'sts',
};

const STS_NS = 'https://sts.amazonaws.com/doc/2011-06-15/';
const JSON_CT = 'application/x-amz-json-1.1';

interface Reply {
  status: number;
  body: string;
  contentType: string;
  headers?: Record<string, string>;
  error?: string;
}

interface OpResult {
  reply: Reply;
  records?: number;
  bytes?: number;
}

/** Thrown by op handlers to answer an error. */
class AwsError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly headers?: Record<string, string>,
  ) {
    super(message);
  }
}

function xmlEscape(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;').replace(/'/g, '&apos;');
}

function jsonReply(status: number, value: unknown): Reply {
  return { status, body: JSON.stringify(value), contentType: JSON_CT };
}

function jsonError(status: number, code: string, message: string, headers?: Record<string, string>): Reply {
  return { status, body: JSON.stringify({ __type: code, message }), contentType: JSON_CT, headers: { 'x-amzn-errortype': code, ...headers }, error: code };
}

function stsError(status: number, code: string, message: string, headers?: Record<string, string>): Reply {
  const type = status >= 500 ? 'Receiver' : 'Sender';
  const body = `<ErrorResponse xmlns="${STS_NS}">\n  <Error>\n    <Type>${type}</Type>\n    <Code>${xmlEscape(code)}</Code>\n    <Message>${xmlEscape(message)}</Message>\n  </Error>\n  <RequestId>${randomUUID()}</RequestId>\n</ErrorResponse>\n`;
  return { status, body, contentType: 'text/xml', headers: headers ?? {}, error: code };
}

/** The real error names for each authentication failure, per protocol. */
function authError(kind: SigV4FailureKind, message: string, sts: boolean, jsonStatus: number): Reply {
  if (sts) {
    const code = { missing: 'MissingAuthenticationToken', incomplete: 'IncompleteSignature', signature: 'SignatureDoesNotMatch', skew: 'SignatureDoesNotMatch', scope: 'SignatureDoesNotMatch', 'unknown-key': 'InvalidClientTokenId', token: 'InvalidClientTokenId', expired: 'ExpiredToken' }[kind];
    return stsError(kind === 'incomplete' ? 400 : 403, code, message);
  }
  const code = { missing: 'MissingAuthenticationTokenException', incomplete: 'IncompleteSignatureException', signature: 'InvalidSignatureException', skew: 'InvalidSignatureException', scope: 'InvalidSignatureException', 'unknown-key': 'UnrecognizedClientException', token: 'UnrecognizedClientException', expired: 'ExpiredTokenException' }[kind];
  return jsonError(jsonStatus, code, message);
}

function defaultFaultCode(op: AwsOp, status: number): string {
  if (op === 'AssumeRole') return ({ 400: 'ValidationError', 403: 'AccessDenied', 404: 'NoSuchEntity', 429: 'Throttling', 503: 'ServiceUnavailable' } as Record<number, string>)[status] ?? 'InternalFailure';
  const logs = SERVICE[op] === 'logs';
  return (
    ({ 400: logs ? 'InvalidParameterException' : 'InvalidArgumentException', 403: 'AccessDeniedException', 404: 'ResourceNotFoundException', 429: 'ThrottlingException', 503: 'ServiceUnavailableException' } as Record<number, string>)[status] ??
    'InternalFailure'
  );
}

function throttleReply(op: AwsOp): Reply {
  switch (op) {
    case 'PutRecordBatch':
      return jsonError(503, 'ServiceUnavailableException', 'Slow down.');
    case 'PutRecords':
      return jsonError(400, 'ProvisionedThroughputExceededException', 'Rate exceeded for stream under account.');
    case 'AssumeRole':
      return stsError(400, 'Throttling', 'Rate exceeded');
    default:
      return jsonError(400, 'ThrottlingException', 'Rate exceeded');
  }
}

const BASE64_RE = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

function decodeBase64(value: unknown, where: string, badCode: string): Buffer {
  if (typeof value !== 'string' || !BASE64_RE.test(value)) throw new AwsError(400, badCode, `${where}: Data must be a base64-encoded blob`);
  return Buffer.from(value, 'base64');
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function amzIso(ms: number): string {
  return new Date(ms).toISOString().replace(/\.\d{3}Z$/, 'Z');
}

function randomUpper(n: number): string {
  const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567';
  return [...randomBytes(n)].map((b) => alphabet[b % 32]).join('');
}

export async function startAwsFake(o: AwsFakeOptions): Promise<AwsFake> {
  const accountId = o.accountId ?? '123456789012';
  const authStatus = o.authErrorStatus ?? 400;
  const firehose = new Map<string, string[]>();
  const kinesis = new Map<string, Array<{ partitionKey: string; data: string }>>();
  const logs = new Map<string, Array<{ timestamp: number; message: string }>>();
  const logStreams = new Set<string>();
  const streamCreated = new Map<string, number>();
  const assumeRoleCalls: AssumeRoleCall[] = [];
  const requests: AwsRequestRecord[] = [];
  const faults = new FaultQueue<AwsOp, Fault>();
  const temporary = new Map<string, Required<SigV4Identity>>();
  let sequence = 0n;
  let logToken = 0n;

  const lookup = (accessKeyId: string): SigV4Identity | undefined => {
    const secret = o.credentials[accessKeyId];
    if (secret !== undefined) return { secretAccessKey: secret };
    return temporary.get(accessKeyId);
  };

  /** The scope region must be the one the resource lives in. */
  const checkRegion = (name: string, region: string, arnRegion?: string) => {
    const want = arnRegion ?? o.expectedRegion?.[name];
    if (want !== undefined && want !== region) {
      throw new AwsError(authStatus, 'InvalidSignatureException', `Credential should be scoped to a valid region, not '${region}'. (${name} is in ${want})`);
    }
  };

  // ---------------------------------------------------------------- Firehose
  const putRecordBatch = (input: Record<string, unknown>, region: string, fault?: Fault): OpResult => {
    const bad = 'InvalidArgumentException';
    const name = input.DeliveryStreamName;
    if (typeof name !== 'string' || !/^[a-zA-Z0-9_.-]{1,64}$/.test(name)) throw new AwsError(400, bad, `1 validation error detected: Value '${String(name)}' at 'deliveryStreamName' failed to satisfy constraint: Member must satisfy regular expression pattern: [a-zA-Z0-9_.-]+`);
    checkRegion(name, region);
    const records = input.Records;
    if (!Array.isArray(records)) throw new AwsError(400, bad, `Records is required`);
    const datas = records.map((r, i) => decodeBase64(isObject(r) ? r.Data : undefined, `Records[${i}]`, bad));
    const bytes = datas.reduce((n, d) => n + d.length, 0);
    const result = { records: records.length, bytes };
    const L = AWS_LIMITS.firehose;
    if (records.length < 1 || records.length > L.maxRecords) throw Object.assign(new AwsError(400, bad, `1 validation error detected: Value at 'records' failed to satisfy constraint: Member must have length less than or equal to ${L.maxRecords} and greater than or equal to 1 (got ${records.length})`), { result });
    datas.forEach((d, i) => {
      if (d.length > L.maxRecordBytes) throw Object.assign(new AwsError(400, bad, `Record ${i} has size ${d.length} bytes, which exceeds the limit of ${L.maxRecordBytes} bytes (1,000 KiB) before base64 encoding.`), { result });
    });
    if (bytes > L.maxCallBytes) throw Object.assign(new AwsError(400, bad, `Records size ${bytes} bytes exceeds the limit of ${L.maxCallBytes} bytes (4 MiB) per PutRecordBatch call.`), { result });
    const failed = new Set(fault?.kind === 'partial' ? fault.indices : []);
    const stored = firehose.get(name) ?? [];
    const responses = datas.map((d, i) => {
      if (failed.has(i)) return { ErrorCode: (fault?.kind === 'partial' && fault.code) || 'ServiceUnavailableException', ErrorMessage: (fault?.kind === 'partial' && fault.message) || 'Slow down.' };
      stored.push(d.toString('utf8'));
      return { RecordId: randomBytes(56).toString('base64url') };
    });
    firehose.set(name, stored);
    const failedCount = responses.filter((r) => 'ErrorCode' in r).length;
    return { ...result, reply: jsonReply(200, { FailedPutCount: failedCount, Encrypted: false, RequestResponses: responses }) };
  };

  // ---------------------------------------------------------------- Kinesis
  const putRecords = (input: Record<string, unknown>, region: string, fault?: Fault): OpResult => {
    const bad = 'InvalidArgumentException';
    let name = input.StreamName;
    const arn = input.StreamARN;
    let arnRegion: string | undefined;
    if (name !== undefined && (typeof name !== 'string' || !/^[a-zA-Z0-9_.-]{1,128}$/.test(name))) throw new AwsError(400, bad, `1 validation error detected: Value '${String(name)}' at 'streamName' failed to satisfy constraint: Member must satisfy regular expression pattern: [a-zA-Z0-9_.-]+`);
    if (arn !== undefined) {
      const m = typeof arn === 'string' ? /^arn:aws[a-z-]*:kinesis:([a-z0-9-]+):(\d{12}):stream\/([a-zA-Z0-9_.-]{1,128})$/.exec(arn) : null;
      if (!m) throw new AwsError(400, bad, `1 validation error detected: Value '${String(arn)}' at 'streamARN' failed to satisfy constraint: Member must satisfy regular expression pattern: arn:aws.*:kinesis:.*:\\d{12}:stream/\\S+`);
      arnRegion = m[1]!;
      if (name !== undefined && name !== m[3]) throw new AwsError(400, bad, `StreamARN ${arn} and StreamName ${String(name)} name different streams.`);
      name = m[3]!;
    }
    if (typeof name !== 'string') throw new AwsError(400, bad, 'Either StreamName or StreamARN should be provided.');
    checkRegion(name, region, arnRegion);
    const records = input.Records;
    if (!Array.isArray(records)) throw new AwsError(400, bad, `Records is required`);
    const L = AWS_LIMITS.kinesis;
    const parsed = records.map((r, i) => {
      const pk = isObject(r) ? r.PartitionKey : undefined;
      if (typeof pk !== 'string' || [...pk].length < 1 || [...pk].length > L.maxPartitionKeyChars) {
        throw new AwsError(400, bad, `1 validation error detected: Value '${String(pk)}' at 'records.${i + 1}.member.partitionKey' failed to satisfy constraint: Member must have length between 1 and ${L.maxPartitionKeyChars}`);
      }
      const data = decodeBase64(isObject(r) ? r.Data : undefined, `Records[${i}]`, bad);
      return { pk, data, size: data.length + Buffer.byteLength(pk, 'utf8') };
    });
    const bytes = parsed.reduce((n, r) => n + r.size, 0);
    const result = { records: records.length, bytes };
    if (records.length < 1 || records.length > L.maxRecords) throw Object.assign(new AwsError(400, bad, `1 validation error detected: Value at 'records' failed to satisfy constraint: Member must have length less than or equal to ${L.maxRecords} and greater than or equal to 1 (got ${records.length})`), { result });
    parsed.forEach((r, i) => {
      if (r.size > L.maxRecordBytes) throw Object.assign(new AwsError(400, bad, `Record ${i} has size ${r.size} bytes (data + partition key), which exceeds the limit of ${L.maxRecordBytes} bytes (1 MiB).`), { result });
    });
    if (bytes > L.maxCallBytes) throw Object.assign(new AwsError(400, bad, `Records size ${bytes} bytes exceeds the limit of ${L.maxCallBytes} bytes (5 MiB) per PutRecords call.`), { result });
    const failed = new Set(fault?.kind === 'partial' ? fault.indices : []);
    const stored = kinesis.get(name) ?? [];
    const out = parsed.map((r, i) => {
      if (failed.has(i)) {
        return {
          ErrorCode: (fault?.kind === 'partial' && fault.code) || 'ProvisionedThroughputExceededException',
          ErrorMessage: (fault?.kind === 'partial' && fault.message) || `Rate exceeded for shard shardId-000000000000 in stream ${name} under account ${accountId}.`,
        };
      }
      stored.push({ partitionKey: r.pk, data: r.data.toString('utf8') });
      sequence += 1n;
      return { SequenceNumber: `4960${sequence.toString().padStart(52, '0')}`, ShardId: 'shardId-000000000000' };
    });
    kinesis.set(name, stored);
    const failedCount = out.filter((r) => 'ErrorCode' in r).length;
    return { ...result, reply: jsonReply(200, { FailedRecordCount: failedCount, Records: out }) };
  };

  // ---------------------------------------------------------------- CloudWatch Logs
  const bad = 'InvalidParameterException';
  const groupName = (input: Record<string, unknown>): string => {
    let g = input.logGroupName ?? input.logGroupIdentifier;
    if (typeof g === 'string' && g.startsWith('arn:')) {
      const m = /^arn:aws[a-z-]*:logs:[a-z0-9-]+:\d{12}:log-group:([^:]+)(:\*)?$/.exec(g);
      g = m?.[1];
    }
    if (typeof g !== 'string' || !/^[.\-_/#A-Za-z0-9]{1,512}$/.test(g)) throw new AwsError(400, bad, `1 validation error detected: Value '${String(input.logGroupName ?? input.logGroupIdentifier)}' at 'logGroupName' failed to satisfy constraint: Member must satisfy regular expression pattern: [\\.\\-_/#A-Za-z0-9]+`);
    return g;
  };
  const streamName = (input: Record<string, unknown>): string => {
    const s = input.logStreamName;
    if (typeof s !== 'string' || !/^[^:*]{1,512}$/.test(s)) throw new AwsError(400, bad, `1 validation error detected: Value '${String(s)}' at 'logStreamName' failed to satisfy constraint: Member must satisfy regular expression pattern: [^:*]*`);
    return s;
  };

  const putLogEvents = (input: Record<string, unknown>, region: string, fault?: Fault): OpResult => {
    const group = groupName(input);
    const stream = streamName(input);
    checkRegion(group, region);
    const events = input.logEvents;
    if (!Array.isArray(events)) throw new AwsError(400, bad, 'logEvents is required');
    const L = AWS_LIMITS.logs;
    const parsed = events.map((e, i) => {
      const ts = isObject(e) ? e.timestamp : undefined;
      const msg = isObject(e) ? e.message : undefined;
      if (typeof ts !== 'number' || !Number.isInteger(ts) || ts < 0) throw new AwsError(400, bad, `1 validation error detected: Value at 'logEvents.${i + 1}.member.timestamp' failed to satisfy constraint: Member must be a non-negative integer`);
      if (typeof msg !== 'string' || msg.length < 1) throw new AwsError(400, bad, `1 validation error detected: Value at 'logEvents.${i + 1}.member.message' failed to satisfy constraint: Member must have length greater than or equal to 1`);
      return { timestamp: ts, message: msg };
    });
    const bytes = parsed.reduce((n, e) => n + Buffer.byteLength(e.message, 'utf8') + L.perEventOverhead, 0);
    const result = { records: events.length, bytes };
    const refuse = (message: string) => Object.assign(new AwsError(400, bad, message), { result });
    if (parsed.length < 1 || parsed.length > L.maxEvents) throw refuse(`1 validation error detected: Value at 'logEvents' failed to satisfy constraint: Member must have length less than or equal to ${L.maxEvents} and greater than or equal to 1 (got ${parsed.length})`);
    if (bytes > L.maxBatchBytes) throw refuse(`Upload too large: ${bytes} bytes exceeds limit of ${L.maxBatchBytes}`);
    for (let i = 1; i < parsed.length; i++) {
      if (parsed[i]!.timestamp < parsed[i - 1]!.timestamp) throw refuse('Log events in a single PutLogEvents request must be in chronological order.');
    }
    if (parsed[parsed.length - 1]!.timestamp - parsed[0]!.timestamp > L.maxSpanMs) throw refuse('The batch of log events in a single PutLogEvents request cannot span more than 24 hours.');
    const key = `${group}/${stream}`;
    if (!logStreams.has(key)) throw Object.assign(new AwsError(400, 'ResourceNotFoundException', 'The specified log stream does not exist.'), { result });

    // Too old / too new events are rejected while the rest land. Events are in order, so the
    // too-old ones are a prefix and the too-new ones a suffix.
    const now = Date.now();
    let tooOldEnd = 0;
    while (tooOldEnd < parsed.length && parsed[tooOldEnd]!.timestamp < now - L.maxAgeMs) tooOldEnd++;
    let tooNewStart = parsed.length;
    while (tooNewStart > tooOldEnd && parsed[tooNewStart - 1]!.timestamp > now + L.maxFutureMs) tooNewStart--;
    let expiredEnd = 0;
    if (fault?.kind === 'rejected') {
      if (fault.tooOldEndIndex !== undefined) tooOldEnd = Math.max(tooOldEnd, Math.min(fault.tooOldEndIndex, parsed.length));
      if (fault.tooNewStartIndex !== undefined) tooNewStart = Math.min(tooNewStart, Math.max(fault.tooNewStartIndex, 0));
      if (fault.expiredEndIndex !== undefined) expiredEnd = Math.min(fault.expiredEndIndex, parsed.length);
    }
    const info: Record<string, number> = {};
    if (tooOldEnd > 0) info.tooOldLogEventEndIndex = tooOldEnd; // exclusive
    if (tooNewStart < parsed.length) info.tooNewLogEventStartIndex = tooNewStart; // inclusive
    if (expiredEnd > 0) info.expiredLogEventEndIndex = expiredEnd; // exclusive
    const stored = logs.get(key) ?? [];
    for (let i = Math.max(tooOldEnd, expiredEnd); i < tooNewStart; i++) stored.push(parsed[i]!);
    logs.set(key, stored);
    logToken += 1n;
    const body: Record<string, unknown> = { nextSequenceToken: `4963${logToken.toString().padStart(52, '0')}` };
    if (Object.keys(info).length > 0) body.rejectedLogEventsInfo = info;
    return { ...result, reply: jsonReply(200, body) };
  };

  const createLogStream = (input: Record<string, unknown>, region: string): OpResult => {
    const group = groupName(input);
    const stream = streamName(input);
    checkRegion(group, region);
    const key = `${group}/${stream}`;
    if (logStreams.has(key)) throw new AwsError(400, 'ResourceAlreadyExistsException', 'The specified log stream already exists');
    logStreams.add(key);
    streamCreated.set(key, Date.now());
    return { reply: { status: 200, body: '', contentType: JSON_CT } };
  };

  const describeLogStreams = (input: Record<string, unknown>, region: string): OpResult => {
    const group = groupName(input);
    checkRegion(group, region);
    const prefix = input.logStreamNamePrefix;
    if (prefix !== undefined && typeof prefix !== 'string') throw new AwsError(400, bad, 'logStreamNamePrefix must be a string');
    const limit = input.limit ?? 50;
    if (typeof limit !== 'number' || !Number.isInteger(limit) || limit < 1 || limit > 50) throw new AwsError(400, bad, "1 validation error detected: Value at 'limit' failed to satisfy constraint: Member must have value between 1 and 50");
    const start = typeof input.nextToken === 'string' ? Number.parseInt(input.nextToken, 10) || 0 : 0;
    const names = [...logStreams]
      .filter((k) => k.startsWith(`${group}/`))
      .map((k) => k.slice(group.length + 1))
      .filter((s) => prefix === undefined || s.startsWith(prefix))
      .sort();
    if (input.descending === true) names.reverse();
    const page = names.slice(start, start + limit);
    const body: Record<string, unknown> = {
      logStreams: page.map((s) => {
        const key = `${group}/${s}`;
        const events = logs.get(key) ?? [];
        return {
          logStreamName: s,
          creationTime: streamCreated.get(key) ?? 0,
          ...(events.length > 0 ? { firstEventTimestamp: events[0]!.timestamp, lastEventTimestamp: events[events.length - 1]!.timestamp } : {}),
          arn: `arn:aws:logs:${region}:${accountId}:log-group:${group}:log-stream:${s}`,
          storedBytes: 0,
        };
      }),
    };
    if (start + limit < names.length) body.nextToken = String(start + limit);
    return { reply: jsonReply(200, body) };
  };

  // ---------------------------------------------------------------- STS
  const assumeRole = (params: URLSearchParams, caller: string): OpResult => {
    const roleArn = params.get('RoleArn') ?? '';
    const sessionName = params.get('RoleSessionName') ?? '';
    const externalId = params.get('ExternalId') ?? undefined;
    const durationRaw = params.get('DurationSeconds');
    const durationSeconds = durationRaw === null ? undefined : Number(durationRaw);
    const call: AssumeRoleCall = { roleArn, sessionName, callerAccessKeyId: caller, ok: false, ...(externalId !== undefined ? { externalId } : {}), ...(durationSeconds !== undefined ? { durationSeconds } : {}) };
    assumeRoleCalls.push(call);
    const invalid = (message: string) => new AwsError(400, 'ValidationError', message);
    if (params.get('Version') !== '2011-06-15') throw new AwsError(400, 'InvalidAction', `Could not find operation AssumeRole for version ${params.get('Version')}`);
    if (!/^arn:aws[a-z-]*:iam::\d{12}:role\/[\w+=,.@/-]{1,512}$/.test(roleArn)) throw invalid(`${roleArn} is invalid`);
    if (!/^[\w+=,.@-]{2,64}$/.test(sessionName)) throw invalid(`1 validation error detected: Value '${sessionName}' at 'roleSessionName' failed to satisfy constraint: Member must have length between 2 and 64 and satisfy regular expression pattern: [\\w+=,.@-]*`);
    if (externalId !== undefined && !/^[\w+=,.@:/-]{2,1224}$/.test(externalId)) throw invalid(`1 validation error detected: Value '${externalId}' at 'externalId' failed to satisfy constraint: Member must have length between 2 and 1224 and satisfy regular expression pattern: [\\w+=,.@:/-]*`);
    const S = AWS_LIMITS.sts;
    if (durationSeconds !== undefined && (!Number.isInteger(durationSeconds) || durationSeconds < S.minDurationSeconds || durationSeconds > S.maxDurationSeconds)) {
      throw invalid(`1 validation error detected: Value '${durationRaw}' at 'durationSeconds' failed to satisfy constraint: Member must have value between ${S.minDurationSeconds} and ${S.maxDurationSeconds}`);
    }
    const role = o.roles?.[roleArn];
    const denied = () => new AwsError(403, 'AccessDenied', `User: arn:aws:iam::${accountId}:user/${caller} is not authorized to perform: sts:AssumeRole on resource: ${roleArn}`);
    if (!role) throw denied();
    if (role.externalId !== undefined && role.externalId !== externalId) throw denied();
    const lifetimeMs = (o.sessionSeconds ?? durationSeconds ?? 3600) * 1000;
    const accessKeyId = `ASIA${randomUpper(16)}`;
    const secretAccessKey = randomBytes(30).toString('base64');
    const sessionToken = `FwoGZXIvYXdzE${randomBytes(180).toString('base64')}`;
    const expiresAt = Date.now() + lifetimeMs;
    temporary.set(accessKeyId, { secretAccessKey, sessionToken, expiresAt });
    call.ok = true;
    const roleName = roleArn.slice(roleArn.lastIndexOf('/') + 1);
    const roleAccount = roleArn.split(':')[4]!;
    const body = `<AssumeRoleResponse xmlns="${STS_NS}">
  <AssumeRoleResult>
    <AssumedRoleUser>
      <AssumedRoleId>AROA${randomUpper(17)}:${xmlEscape(sessionName)}</AssumedRoleId>
      <Arn>arn:aws:sts::${roleAccount}:assumed-role/${xmlEscape(roleName)}/${xmlEscape(sessionName)}</Arn>
    </AssumedRoleUser>
    <Credentials>
      <AccessKeyId>${accessKeyId}</AccessKeyId>
      <SecretAccessKey>${xmlEscape(secretAccessKey)}</SecretAccessKey>
      <SessionToken>${xmlEscape(sessionToken)}</SessionToken>
      <Expiration>${amzIso(expiresAt)}</Expiration>
    </Credentials>
  </AssumeRoleResult>
  <ResponseMetadata>
    <RequestId>${randomUUID()}</RequestId>
  </ResponseMetadata>
</AssumeRoleResponse>
`;
    return { reply: { status: 200, body, contentType: 'text/xml' } };
  };

  // ---------------------------------------------------------------- dispatch
  const send = (res: http.ServerResponse, r: Reply) => {
    const body = Buffer.from(r.body, 'utf8');
    res.writeHead(r.status, { 'content-type': r.contentType, 'content-length': body.length, 'x-amzn-requestid': randomUUID(), ...r.headers });
    res.end(body);
  };

  const handle = async (req: http.IncomingMessage, res: http.ServerResponse): Promise<void> => {
    const body = await readBody(req);
    const entry: AwsRequestRecord = { op: 'unknown', status: 0, bodyBytes: body.length };
    requests.push(entry);
    const answer = (r: Reply) => {
      entry.status = r.status;
      if (r.error !== undefined) entry.error = r.error;
      send(res, r);
    };

    // Which operation?
    const target = req.headers['x-amz-target'];
    const ct = mediaType(req.headers['content-type']);
    let op: AwsOp | undefined;
    let form: URLSearchParams | undefined;
    if (typeof target === 'string') {
      op = TARGETS[target];
      entry.op = op ?? target;
      if (!op) return answer(jsonError(400, 'UnknownOperationException', `Unknown operation ${target}`));
    } else if (ct === 'application/x-www-form-urlencoded') {
      form = new URLSearchParams(body.toString('utf8'));
      const action = form.get('Action');
      entry.op = action ?? 'unknown';
      if (action !== 'AssumeRole') return answer(stsError(400, 'InvalidAction', `Could not find operation ${action} for version ${form.get('Version')}`));
      op = 'AssumeRole';
    } else {
      return answer(jsonError(400, 'UnknownOperationException', 'Missing X-Amz-Target'));
    }
    const sts = op === 'AssumeRole';
    if (req.method !== 'POST' || (req.url ?? '/').split('?')[0] !== '/') {
      return answer(sts ? stsError(400, 'InvalidAction', 'Only POST / is supported') : jsonError(400, 'UnknownOperationException', 'Only POST / is supported'));
    }

    // Who is calling?
    const service = SERVICE[op];
    const auth = verifySigV4(req, body, { expectedService: service, lookup });
    const scope = auth.ok ? auth : auth.scope;
    if (scope) Object.assign(entry, { service: scope.service, region: scope.region, accessKeyId: scope.accessKeyId });
    if (!auth.ok) return answer(authError(auth.kind, auth.message, sts, authStatus));

    // Scripted fault.
    const fault = await playFault(faults, op, entry, listener, req);
    if (fault === 'reset') return;
    if (fault?.kind === 'throttle') return answer(throttleReply(op));
    if (fault?.kind === 'status') {
      const code = fault.code ?? defaultFaultCode(op, fault.status);
      const message = fault.message ?? `Injected ${fault.status} ${code}`;
      const headers = fault.retryAfterSeconds !== undefined ? { 'retry-after': String(fault.retryAfterSeconds) } : undefined;
      return answer(sts ? stsError(fault.status, code, message, headers) : jsonError(fault.status, code, message, headers));
    }

    // The operation.
    let result: OpResult;
    try {
      if (sts) {
        result = assumeRole(form!, auth.accessKeyId);
      } else {
        if (ct !== JSON_CT) throw new AwsError(400, 'SerializationException', `Content-Type must be ${JSON_CT}, got '${ct}'`);
        let input: unknown;
        try {
          input = JSON.parse(body.toString('utf8'));
        } catch {
          throw new AwsError(400, 'SerializationException', 'Start of structure or map found where not expected.');
        }
        if (!isObject(input)) throw new AwsError(400, 'SerializationException', 'The request body must be a JSON object.');
        switch (op) {
          case 'PutRecordBatch':
            result = putRecordBatch(input, auth.region, fault);
            break;
          case 'PutRecords':
            result = putRecords(input, auth.region, fault);
            break;
          case 'PutLogEvents':
            result = putLogEvents(input, auth.region, fault);
            break;
          case 'CreateLogStream':
            result = createLogStream(input, auth.region);
            break;
          case 'DescribeLogStreams':
            result = describeLogStreams(input, auth.region);
            break;
          default:
            throw new Error(`unreachable: ${op}`);
        }
      }
    } catch (err) {
      if (!(err instanceof AwsError)) throw err;
      const partial = (err as AwsError & { result?: { records: number; bytes: number } }).result;
      if (partial) Object.assign(entry, partial);
      result = { reply: sts ? stsError(err.status, err.code, err.message, err.headers) : jsonError(err.status, err.code, err.message, err.headers) };
    }
    if (result.records !== undefined) entry.records = result.records;
    if (result.bytes !== undefined) entry.bytes = result.bytes;
    if (fault?.kind === 'accept-then-reset') {
      entry.error = 'accept-then-reset';
      resetConnection(req);
      return;
    }
    answer(result.reply);
  };

  const listener = new FakeListener(handle);
  await listener.listen();

  return {
    url: `http://127.0.0.1:${listener.port}`,
    firehose,
    kinesis,
    logs,
    logStreams,
    assumeRoleCalls,
    requests,
    fail(op, fault, times = 1) {
      if (!(op in SERVICE)) throw new Error(`unknown op ${op}`);
      if (fault.kind === 'partial' && op !== 'PutRecordBatch' && op !== 'PutRecords') throw new Error(`'partial' applies to PutRecordBatch and PutRecords; use 'rejected' for PutLogEvents`);
      if (fault.kind === 'rejected' && op !== 'PutLogEvents') throw new Error(`'rejected' applies to PutLogEvents only`);
      faults.push(op, fault, times);
    },
    expireTemporaryCredentials() {
      const now = Date.now();
      for (const c of temporary.values()) c.expiresAt = Math.min(c.expiresAt, now);
    },
    stop: () => listener.stop(),
    start: () => listener.start(),
    reset() {
      firehose.clear();
      kinesis.clear();
      logs.clear();
      logStreams.clear();
      streamCreated.clear();
      assumeRoleCalls.length = 0;
      requests.length = 0;
      faults.clear();
    },
    close: () => listener.close(),
  };
}
