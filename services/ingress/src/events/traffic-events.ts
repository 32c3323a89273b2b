import { newId, type DataPlaneConfig, type DestinationRef, type EventEnvelope, type Logger, type PublishItem, type TrafficEventType } from '@warren/shared';
import { TrafficSubscriptionIndex } from './subscriptions.js';

/**
 * Traffic events of an ingress node (wire-conventions.md §11, event-delivery.md §2.1):
 * `http_request_complete.v0` after every proxied request and `tcp_connection_closed.v0` after
 * every raw TCP connection (today: the websocket_tcp_converter), for accounts that subscribe to
 * them. Fan-out happens here, at produce time, from the config's subscriptions; the envelopes
 * are queued in memory (bounded) and written to the destinations' Redis buffers in batches by
 * the shared EventProducer. Nothing is retried: an event that cannot be queued or published is
 * dropped and counted (`warren_ingress_events_dropped_total{reason}`), so a slow or dead Redis
 * never holds memory or requests.
 */

export const HTTP_REQUEST_COMPLETE: TrafficEventType = 'http_request_complete.v0';
export const TCP_CONNECTION_CLOSED: TrafficEventType = 'tcp_connection_closed.v0';

export type DropReason = 'queue_full' | 'redis_error' | 'buffer_full' | 'shutdown';

/** The counters the queue reports to (prom-client Counters in production). */
export interface TrafficEventMetrics {
  emitted: { inc(value?: number): void };
  dropped: { inc(labels: { reason: DropReason }, value?: number): void };
}

/** What the queue needs of an EventProducer (shared/src/events/producer.ts). */
export interface EventPublisher {
  publish(items: PublishItem[]): Promise<{ accepted: number; overflowed: number }>;
}

// ------------------------------------------------------------------ envelopes

// `YYYY-MM-DDTHH:MM:SS` of the last two whole seconds formatted: an event's timestamps fall in
// one or two seconds, and Date#toISOString costs more than the rest of the formatting.
let secA = NaN;
let textA = '';
let secB = NaN;
let textB = '';
function secondText(sec: number): string {
  if (sec === secA) return textA;
  if (sec === secB) return textB;
  const text = new Date(sec * 1000).toISOString().slice(0, 19);
  secB = secA;
  textB = textA;
  secA = sec;
  textA = text;
  return text;
}

/** Traffic byte and connection timestamps: RFC 3339 UTC with milliseconds (wire-conventions §6, §11), e.g. `2026-03-01T09:30:12.345Z`. */
export function trafficTs(unixMs: number): string {
  const ms = Math.floor(unixMs);
  const sec = Math.floor(ms / 1000);
  const frac = ms - sec * 1000;
  return `${secondText(sec)}.${frac < 10 ? '00' : frac < 100 ? '0' : ''}${frac}Z`;
}

/** The envelope's `event_timestamp`: RFC 3339 UTC, whole seconds. */
export function eventTimestamp(unixMs: number): string {
  return `${secondText(Math.floor(unixMs / 1000))}Z`;
}

/** The result variables of the request's last rate-limit action (spec: `actions.service.rate_limit.*`). */
export interface RateLimitVars {
  bucket_key: string;
  limited: boolean;
  error: { code: string; message: string };
}

export interface HttpRequestCompleteObject {
  conn: { client_ip: string; server_name: string; server_port: number };
  http: {
    request: { method: string; url: { path: string }; version: string; first_byte_ts: string; last_byte_ts: string };
    /** `first_byte_ts` is null when no response head was sent (the client went away first). */
    response: { status_code: number; body_length: number; first_byte_ts: string | null; last_byte_ts: string };
  };
  warren: {
    /** null for a Bind endpoint (no edge). */
    edge_id: string | null;
    /** null for a Bind endpoint, or when no route of the edge matched. */
    route_id: string | null;
    /** The tunnel the request was sent to; null when it reached none. */
    tunnel_id: string | null;
    rate_limited: boolean;
    /** null when no rate-limit action ran for the request. */
    rate_limit: RateLimitVars | null;
  };
  /**
   * Present when traffic-policy `log` actions ran for the request: their evaluated metadata, in
   * order, where ngrok puts them (https://ngrok.com/docs/traffic-policy/actions/log).
   */
  traffic_policy?: { logs: { metadata: Record<string, unknown> }[] };
}

export interface TcpConnectionClosedObject {
  conn: { client_ip: string; server_addr: string; server_port: number; start_ts: string; end_ts: string; bytes_in: number; bytes_out: number };
  warren: { edge_id: string | null; route_id: string | null; tunnel_id: string | null };
}

/** A traffic event's envelope: a fresh `ev_` id, the time in whole seconds, no principal. */
export function trafficEnvelope(type: TrafficEventType, accountId: string, object: HttpRequestCompleteObject | TcpConnectionClosedObject, atUnixMs: number): EventEnvelope {
  return { event_id: newId('ev'), event_type: type, event_timestamp: eventTimestamp(atUnixMs), account_id: accountId, object, principal: null };
}

// ------------------------------------------------------------------ queue

export interface TrafficEventQueueOptions {
  publisher: EventPublisher;
  metrics: TrafficEventMetrics;
  log: Logger;
  /** Events held in memory at most, queued or being published (EVENTS_MAX_QUEUED). */
  maxQueued: number;
  /** Longest time an event waits before a publish (EVENTS_FLUSH_MS). */
  flushMs: number;
  /** Events that trigger a publish before flushMs (default 500). */
  batchSize?: number;
  /** Events in one publish at most (default 5,000): bounds one Redis script's run time. */
  maxPerPublish?: number;
}

interface Queued {
  dests: readonly DestinationRef[];
  env: EventEnvelope;
}

const REDIS_ERROR_LOG_EVERY_MS = 10_000;

/**
 * The per-process event queue: at most `maxQueued` events in memory, published every `flushMs`
 * or once `batchSize` are waiting, with at most one publish in flight; each publish groups the
 * batch per destination (one PublishItem each, events in order) into one producer call.
 */
export class TrafficEventQueue {
  private queue: Queued[] = [];
  private inFlight = 0;
  private publishing: Promise<void> | null = null;
  private timer: NodeJS.Timeout | null = null;
  /** The flush timer fired while a publish was running: publish again as soon as it ends. */
  private due = false;
  private closed = false;
  private readonly batchSize: number;
  private readonly maxPerPublish: number;
  private lastErrorLog = 0;
  private errorsSinceLog = 0;

  constructor(private readonly o: TrafficEventQueueOptions) {
    this.batchSize = Math.max(1, o.batchSize ?? 500);
    this.maxPerPublish = Math.max(this.batchSize, o.maxPerPublish ?? 5_000);
  }

  /** Events in memory: waiting plus being published. */
  get held(): number {
    return this.queue.length + this.inFlight;
  }

  /** Queues one envelope for `dests`; false (and counted) when it was dropped. */
  push(dests: readonly DestinationRef[], env: EventEnvelope): boolean {
    if (this.closed) {
      this.o.metrics.dropped.inc({ reason: 'shutdown' }, dests.length);
      return false;
    }
    if (this.queue.length + this.inFlight >= this.o.maxQueued) {
      this.o.metrics.dropped.inc({ reason: 'queue_full' }, dests.length);
      return false;
    }
    this.queue.push({ dests, env });
    if (this.publishing) return true;
    if (this.queue.length >= this.batchSize) this.flush();
    else if (!this.timer) {
      this.timer = setTimeout(this.onTimer, this.o.flushMs);
      this.timer.unref();
    }
    return true;
  }

  private readonly onTimer = () => {
    this.timer = null;
    if (this.publishing) this.due = true;
    else this.flush();
  };

  /** Publishes what is queued now (one batch), unless a publish is running. */
  private flush(): void {
    if (this.publishing || this.queue.length === 0) return;
    if (this.timer) {
      clearTimeout(this.timer);
      this.timer = null;
    }
    this.due = false;
    let batch: Queued[];
    if (this.queue.length <= this.maxPerPublish) {
      batch = this.queue;
      this.queue = [];
    } else {
      batch = this.queue.slice(0, this.maxPerPublish);
      this.queue = this.queue.slice(this.maxPerPublish);
    }
    this.inFlight = batch.length;
    // Grouped per destination, in queue order; each envelope is serialized once for all its destinations.
    const items = new Map<string, PublishItem>();
    let records = 0;
    for (const q of batch) {
      const json = JSON.stringify(q.env);
      for (const d of q.dests) {
        let item = items.get(d.id);
        if (!item) items.set(d.id, (item = { dest: d, events: [] }));
        item.events.push(json);
        records++;
      }
    }
    let published: Promise<{ accepted: number; overflowed: number }>;
    try {
      published = this.o.publisher.publish([...items.values()]);
    } catch (err) {
      published = Promise.reject(err);
    }
    this.publishing = published.then(
      (res) => {
        if (res.accepted > 0) this.o.metrics.emitted.inc(res.accepted);
        if (res.overflowed > 0) this.o.metrics.dropped.inc({ reason: 'buffer_full' }, res.overflowed);
      },
      (err: unknown) => {
        this.o.metrics.dropped.inc({ reason: 'redis_error' }, records);
        this.logRedisError(err, records);
      },
    ).finally(() => {
      this.inFlight = 0;
      this.publishing = null;
      if (this.closed || this.queue.length === 0) return;
      if (this.due || this.queue.length >= this.batchSize) this.flush();
      else if (!this.timer) {
        this.timer = setTimeout(this.onTimer, this.o.flushMs);
        this.timer.unref();
      }
    });
  }

  private logRedisError(err: unknown, records: number): void {
    this.errorsSinceLog += records;
    const now = Date.now();
    if (now - this.lastErrorLog < REDIS_ERROR_LOG_EVERY_MS) return;
    this.o.log.warn({ err: err instanceof Error ? err.message : String(err), dropped: this.errorsSinceLog }, 'traffic events could not be published to Redis; dropped');
    this.lastErrorLog = now;
    this.errorsSinceLog = 0;
  }

  /**
   * Stops taking events and publishes what is queued, for at most `timeoutMs`; what is still
   * queued then is dropped (`shutdown`). Resolves with the number of events left behind.
   */
  async close(timeoutMs: number): Promise<number> {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    const deadline = Date.now() + timeoutMs;
    let expired: NodeJS.Timeout | undefined;
    const timeout = new Promise<void>((resolve) => {
      expired = setTimeout(resolve, Math.max(0, timeoutMs));
      expired.unref();
    });
    try {
      while ((this.queue.length > 0 || this.publishing) && Date.now() < deadline) {
        if (!this.publishing) this.flush();
        await Promise.race([this.publishing, timeout]);
      }
    } finally {
      clearTimeout(expired);
    }
    const left = this.queue;
    this.queue = [];
    let records = 0;
    for (const q of left) records += q.dests.length;
    if (records > 0) this.o.metrics.dropped.inc({ reason: 'shutdown' }, records);
    return left.length + this.inFlight;
  }
}

// ------------------------------------------------------------------ the node's emitter

export interface TrafficEventsOptions extends Omit<TrafficEventQueueOptions, 'publisher'> {
  publisher: EventPublisher & { close?(): Promise<void> };
  /** Called once the queue is drained on close (e.g. to close the Redis connection). */
  onClosed?: () => Promise<void> | void;
}

/**
 * What the request path talks to: the compiled subscriptions of the applied config (swapped on
 * every config change) and the queue. `destinations()` is the only call on a request of an
 * account without traffic subscriptions: one Map lookup.
 */
export class TrafficEvents {
  private index: TrafficSubscriptionIndex = TrafficSubscriptionIndex.EMPTY;
  readonly queue: TrafficEventQueue;

  constructor(private readonly o: TrafficEventsOptions) {
    this.queue = new TrafficEventQueue({ ...o, publisher: o.publisher });
  }

  /** Compiles the subscriptions of a newly applied config (kept when they did not change). */
  setConfig(cfg: DataPlaneConfig): void {
    this.index = TrafficSubscriptionIndex.forConfig(cfg, this.index);
  }

  get subscriptions(): TrafficSubscriptionIndex {
    return this.index;
  }

  /** The destinations of `accountId` for `type` (the shared empty array when none). */
  destinations(accountId: string, type: TrafficEventType): readonly DestinationRef[] {
    return this.index.trafficDestinations(accountId, type);
  }

  /** Builds the envelope and queues it for `dests` (from {@link destinations}). */
  emit(type: TrafficEventType, accountId: string, dests: readonly DestinationRef[], object: HttpRequestCompleteObject | TcpConnectionClosedObject, atUnixMs = Date.now()): void {
    if (dests.length === 0) return;
    this.queue.push(dests, trafficEnvelope(type, accountId, object, atUnixMs));
  }

  /**
   * Drains the queue (bounded by `timeoutMs`), then closes the producer (bounded too: a dead
   * Redis must not hold the process) and whatever `onClosed` closes.
   */
  async close(timeoutMs: number): Promise<void> {
    const left = await this.queue.close(timeoutMs);
    if (left > 0) this.o.log.warn({ left }, 'traffic events still queued at shutdown were dropped');
    if (this.o.publisher.close) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        this.o.publisher.close().catch(() => {}),
        new Promise<void>((resolve) => {
          timer = setTimeout(resolve, 1_000);
          timer.unref();
        }),
      ]);
      clearTimeout(timer);
    }
    await this.o.onClosed?.();
  }
}
