/**
 * Event pipeline vocabulary shared by producers (the outbox relay, every ingress) and the
 * delivery workers. See ../shared/docs/event-delivery.md §2 and wire-conventions.md §11.
 *
 * Redis layout (all under one configurable prefix, `warren` by default; tests use their own):
 * - `<prefix>:evbuf:<destId>`       list of serialized envelopes waiting for delivery
 * - `<prefix>:evoverflow:<destId>`  envelopes refused because the buffer was full (the worker
 *                                   moves them to the dead letters with reason `buffer_full`)
 * - BullMQ queues `<prefix>:<queue name>:…`, one queue per target kind ({@link TARGET_QUEUES}),
 *   jobs named `flush` with data {@link FlushJobData}, deduplicated by destination id.
 */

export const EVENT_TARGET_KINDS = ['firehose', 'kinesis', 'cloudwatch_logs', 'datadog', 'azure_logs_ingestion'] as const;
export type EventTargetKind = (typeof EVENT_TARGET_KINDS)[number];

/** BullMQ queue name per target kind. */
export const TARGET_QUEUES: Readonly<Record<EventTargetKind, string>> = {
  firehose: 'events-firehose',
  kinesis: 'events-kinesis',
  cloudwatch_logs: 'events-cloudwatch-logs',
  datadog: 'events-datadog',
  azure_logs_ingestion: 'events-azure-logs',
};

export const DEFAULT_EVENT_PREFIX = 'warren';
/**
 * How long a producer lets events gather before the flush job runs (the first event of a quiet
 * destination waits this long). 10 ms, not event-delivery.md's 50: the delivery p99 floor of
 * performance.md (enqueue → sink ≤ 50 ms at half load) leaves no room for a 50 ms linger.
 */
export const DEFAULT_LINGER_MS = 10;
/** Events one destination's buffer holds before new ones go to the overflow (dead letters). */
export const DEFAULT_BUFFER_CAP = 100_000;

/** The event envelope (wire-conventions.md §11). */
export interface EventEnvelope {
  event_id: string; // ev_…
  event_type: string; // e.g. ip_policy_created.v0
  event_timestamp: string; // RFC 3339 UTC, whole seconds
  account_id: string; // ac_…
  object: unknown;
  principal: { id: string; subject: string; source: 'API' | 'Agent'; credential: { id: string; uri: string } } | null;
}

/** Where an event goes: the destination and the kind of its target (which picks the queue). */
export interface DestinationRef {
  id: string; // ed_…
  kind: EventTargetKind;
}

/** One producer call: serialized envelopes (JSON text) for one destination, in order. */
export interface PublishItem {
  dest: DestinationRef;
  events: string[];
}

/**
 * What BullMQ stores for a flush job. Never credentials: the worker loads the destination and
 * its secrets from Postgres. `pending` holds the records claimed from the buffer and not yet
 * known delivered (written with job.updateData before the buffer is trimmed).
 */
export interface FlushJobData {
  destId: string;
  pending?: string[];
}

export function bufferKey(prefix: string, destId: string): string {
  return `${prefix}:evbuf:${destId}`;
}

export function overflowKey(prefix: string, destId: string): string {
  return `${prefix}:evoverflow:${destId}`;
}
