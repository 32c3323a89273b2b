import type { EventTargetKind } from '@warren/shared';

/**
 * Target clients of the event delivery worker: one `send` = one call to one destination
 * (event-delivery.md §1), its outcome classified for the flush job (§2 table).
 */

export interface EventRecord {
  eventId: string; // ev_… (the envelope's event_id) — Kinesis PartitionKey, dedup key
  body: string; // the serialized envelope (JSON text)
  timestamp: number; // ms since epoch (from the envelope's event_timestamp) — CloudWatch event timestamp
}

export interface TargetLimits {
  maxRecords: number; // per call
  maxBatchBytes: number; // per call, counted as the target counts it (see overheadBytes)
  maxRecordBytes: number; // one record
  /**
   * Added per record when counting (CloudWatch: 26; Kinesis: partition key length is added by
   * recordBytes). Informational: `Target.recordBytes` already includes it, so a caller summing
   * recordBytes() must not add it again (adding it again only makes batches a little smaller).
   */
  overheadBytes: number;
}

export type SendOutcome =
  | { kind: 'done'; retry: number[]; dead: Array<{ index: number; reason: string }> } // HTTP success; `retry` = indices reported failed-but-retryable (partial failure), `dead` = indices failed for good (KMS errors, CloudWatch too old/new, Datadog 400 of a single-record batch…). All other indices were accepted.
  | { kind: 'throttled'; retryAfterMs?: number; reason: string } // whole call throttled (429, ThrottlingException, ProvisionedThroughputExceeded whole-call, ServiceUnavailable, LimitExceeded)
  | { kind: 'too_large'; reason: string } // 413 or the target's "too large" error: caller splits
  | { kind: 'rejected'; reason: string } // 400 for the whole batch (bad request): caller dead-letters (or bisects)
  | { kind: 'auth'; reason: string } // 401/403, AccessDenied, InvalidSignature, UnrecognizedClient, STS AssumeRole denied, ResourceNotFound for the delivery stream / Kinesis stream / log GROUP / DCR: caller pauses the destination
  | { kind: 'retry'; reason: string; unknownOutcome: boolean }; // 5xx, timeout, connection reset; unknownOutcome=true when the request may have been processed (sent fully, then no answer)

export interface Target {
  readonly kind: EventTargetKind;
  readonly limits: TargetLimits;
  /** bytes one record counts toward maxBatchBytes / maxRecordBytes for this target */
  recordBytes(r: EventRecord): number;
  /** One call (no internal retries of partial failures: the caller owns them). Must never throw: every failure maps to an outcome. Respects `signal` (abort → retry/unknownOutcome). */
  send(records: EventRecord[], signal?: AbortSignal): Promise<SendOutcome>;
  close(): void;
}

export interface TargetEnv {
  /** Override endpoints for tests/self-hosting; in production all undefined. */
  awsEndpoint?: string; // e.g. http://127.0.0.1:1234 used for firehose, kinesis, logs AND sts
  datadogBaseUrl?: string; // replaces https://http-intake.logs.<site>
  azureAuthorityHost?: string; // replaces https://login.microsoftonline.com
  /** extra CA certificates (PEM) trusted for HTTPS calls (Azure fake in tests) */
  caPem?: string;
  /** Warren's own AWS identity used to call STS AssumeRole for `role` auth (production: undefined = the default provider chain from the environment) */
  awsBaseCredentials?: { accessKeyId: string; secretAccessKey: string; sessionToken?: string };
  /** per-request timeout, ms (default 30_000) */
  requestTimeoutMs?: number;
  /** hostname reported to Datadog (default os.hostname()) */
  hostname?: string;
}

export interface LoadedDestination {
  id: string; // ed_…
  accountId: string; // ac_… — the ExternalId for AssumeRole
  kind: EventTargetKind;
  target: unknown; // the stored target JSON (StoredFirehose | StoredKinesis | … from event-destinations.target.ts)
}

export type TargetFactory = (dest: LoadedDestination, env: TargetEnv) => Target;
