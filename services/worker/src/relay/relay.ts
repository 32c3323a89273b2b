import type pg from 'pg';
import type { Registry } from 'prom-client';
import { Backoff, type Logger, type PublishItem } from '@warren/shared';
import { auditEnvelope, serializeEnvelope } from '../../../shared/src/events/envelope.js';
import { PgListener } from '../../../control-plane/src/config-push/listener.js';
import { createRelayMetrics, type RelayMetrics } from './metrics.js';
import { relayRepo as repo } from './relay.repo.js';

/** NOTIFY channel of committed config versions (control-plane events/outbox.ts CONFIG_CHANNEL). */
export const CONFIG_CHANNEL = 'warren_config';
/** NOTIFY channel of unchanged destination PATCHes (control-plane event-destinations.service.ts). */
export const DESTINATION_RESUME_CHANNEL = 'warren_event_destination_resume';

/** What the relay needs of the producer (services/shared/src/events/producer.ts EventProducer). */
export interface RelayProducer {
  publish(items: PublishItem[]): Promise<{ accepted: number; overflowed: number }>;
}

export interface OutboxRelayOptions {
  pool: pg.Pool;
  /** For the dedicated LISTEN connection (PgListener). */
  databaseUrl: string;
  producer: RelayProducer;
  log: Logger;
  /**
   * An event destination was updated (PATCH) or deleted: drop cached copies, resume it if paused.
   * Called on every relay instance (every worker replica), once per change, in version order,
   * after the change committed; errors are logged and ignored.
   */
  onDestinationChanged?: (destId: string, deleted: boolean) => void | Promise<void>;
  /** Where the relay's metrics are registered (none: unregistered, still readable via `metrics`). */
  registry?: Registry;
  /** Fallback poll when no notification comes (ms, default 1000). */
  pollIntervalMs?: number;
  /** Outbox rows per transaction (default 1000). */
  batchSize?: number;
  /** Envelopes per producer call (default 5000); a batch above it takes several calls. */
  maxEventsPerPublish?: number;
  /** A publish slower than this counts as failed: the batch rolls back (default 10 s). */
  publishTimeoutMs?: number;
  /** Retry delays after a failure (default 250 ms doubling to 30 s, jittered). */
  backoff?: { initialMs?: number; maxMs?: number };
}

type BatchOutcome = 'more' | 'done' | 'busy';

/**
 * The outbox relay (event-delivery.md §2.1 "Produce", audit events): moves the audit events of
 * committed outbox rows into the destination buffers in Redis through the EventProducer.
 *
 * One transaction per batch: lock `event_relay_state` (SKIP LOCKED, so of several worker replicas
 * exactly one relays at a time and the others return at once), read up to `batchSize` rows with
 * `version > cursor` in version order together with their subscribed destinations (one query),
 * publish, advance the cursor, COMMIT. A failed publish rolls back: the cursor stays and the batch
 * is retried with backoff, so nothing is lost. A crash (or a lost COMMIT) after a publish sends
 * that batch again: duplicates with the same event_id, which at-least-once allows.
 *
 * Why `version > cursor` never skips a row: the outbox insert takes the row lock of the one-row
 * counter `config_state` (trigger of migration 0002) and holds it until its transaction ends, so
 * version N+1 can only be stamped after the transaction of N committed (or rolled back, taking its
 * number back). When a reader sees version N+1 it therefore sees every version up to N too.
 *
 * Outbox rows are never deleted (they feed config push as well); the relay only moves its cursor.
 * Subscriptions are resolved at relay time, normally milliseconds after the commit.
 *
 * Woken by NOTIFY `warren_config` (a dedicated PgListener connection with reconnects) and by a
 * fallback poll.
 */
export class OutboxRelay {
  readonly metrics: RelayMetrics;
  /** The cursor and head as last seen by this instance. */
  cursor = 0;
  head = 0;

  private readonly o: Required<Omit<OutboxRelayOptions, 'onDestinationChanged' | 'registry' | 'backoff'>> & Pick<OutboxRelayOptions, 'onDestinationChanged'>;
  private readonly backoff: Backoff;
  private listener: PgListener | null = null;
  private pollTimer: NodeJS.Timeout | null = null;
  private retryTimer: NodeJS.Timeout | null = null;
  private running: Promise<void> | null = null;
  private dirty = false;
  private started = false;
  private stopped = false;
  /** Destination changes up to this version were announced by this instance. */
  private watchVersion = 0;

  constructor(opts: OutboxRelayOptions) {
    const batchSize = opts.batchSize ?? 1000;
    if (!Number.isInteger(batchSize) || batchSize < 1) throw new Error(`OutboxRelay: batchSize must be a positive integer, got ${batchSize}`);
    const pollIntervalMs = opts.pollIntervalMs ?? 1000;
    if (!(pollIntervalMs > 0)) throw new Error(`OutboxRelay: pollIntervalMs must be > 0, got ${pollIntervalMs}`);
    this.o = {
      pool: opts.pool,
      databaseUrl: opts.databaseUrl,
      producer: opts.producer,
      log: opts.log,
      onDestinationChanged: opts.onDestinationChanged,
      pollIntervalMs,
      batchSize,
      maxEventsPerPublish: Math.max(1, opts.maxEventsPerPublish ?? 5000),
      publishTimeoutMs: opts.publishTimeoutMs ?? 10_000,
    };
    this.backoff = new Backoff(opts.backoff?.initialMs ?? 250, opts.backoff?.maxMs ?? 30_000);
    this.metrics = createRelayMetrics(opts.registry);
  }

  /**
   * LISTENs (waiting until the connection is up), notes the current head for destination
   * changes, then relays whatever is pending and keeps going until stop().
   */
  async start(): Promise<void> {
    if (this.started) throw new Error('OutboxRelay: already started');
    this.started = true;
    const listener = new PgListener({ connectionString: this.o.databaseUrl, channels: [CONFIG_CHANNEL, DESTINATION_RESUME_CHANNEL], log: this.o.log });
    this.listener = listener;
    // A reconnect may have missed notifications: catch up.
    listener.on('connected', () => this.wake());
    listener.on('notification', (channel, payload) => {
      if (channel === CONFIG_CHANNEL) this.wake();
      // An unchanged PATCH writes no outbox row but still resumes a paused destination.
      else if (channel === DESTINATION_RESUME_CHANNEL && /^ed_[0-9A-Za-z]{1,64}$/.test(payload)) void this.announce(payload, false);
    });
    await listener.start();
    if (this.stopped) return;
    try {
      // Destination changes are announced from here on (nothing is cached before start).
      this.watchVersion = await repo.head(this.o.pool);
    } catch (err) {
      await listener.stop();
      this.listener = null;
      this.started = false;
      throw err;
    }
    this.pollTimer = setInterval(() => this.wake(), this.o.pollIntervalMs);
    this.pollTimer.unref();
    this.wake();
  }

  /** Finishes the batch in flight (no new one starts), then closes the LISTEN connection. */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.pollTimer) clearInterval(this.pollTimer);
    if (this.retryTimer) clearTimeout(this.retryTimer);
    this.pollTimer = this.retryTimer = null;
    await this.running;
    await this.listener?.stop();
  }

  /**
   * Relays until caught up (or another instance holds the relay lock) and resolves when done;
   * throws what a failed attempt threw. For tests and tools; start() needs none of it.
   */
  async drain(): Promise<'done' | 'busy'> {
    await this.running;
    for (;;) {
      const r = await this.relayBatch();
      if (r !== 'more') return r;
    }
  }

  /** Runs the pump now or once the current run ends (notification, poll, reconnect). */
  private wake(): void {
    if (this.stopped) return;
    this.dirty = true;
    if (this.running || this.retryTimer) return;
    this.running = this.pump().finally(() => {
      this.running = null;
      if (this.dirty && !this.retryTimer) this.wake();
    });
  }

  private async pump(): Promise<void> {
    try {
      while (this.dirty && !this.stopped) {
        this.dirty = false;
        await this.announceDestinationChanges();
        while (!this.stopped && (await this.relayBatch()) === 'more') {
          /* next batch */
        }
      }
      this.backoff.reset();
    } catch (err) {
      this.metrics.errors.inc();
      const delay = this.backoff.next();
      this.o.log.warn({ err: (err as Error).message, retryInMs: Math.round(delay) }, 'event relay: attempt failed and was rolled back; retrying');
      if (this.stopped) return;
      this.retryTimer = setTimeout(() => {
        this.retryTimer = null;
        this.wake();
      }, delay);
      this.retryTimer.unref();
    }
  }

  /** One transaction: lock, read a batch with its subscribers, publish, advance, commit. */
  private async relayBatch(): Promise<BatchOutcome> {
    const client = await this.o.pool.connect();
    let broken: Error | undefined;
    let outcome: BatchOutcome = 'done';
    let relayed = 0;
    let overflowed = 0;
    let rows = 0;
    try {
      await client.query('BEGIN');
      // A relay stuck between statements (frozen process, hung publish) must not keep the lock
      // from the other replicas forever: the server ends such a session and the batch rolls back.
      await client.query(`SET LOCAL idle_in_transaction_session_timeout = ${Math.ceil(this.o.publishTimeoutMs * 3 + 10_000)}`);
      const claim = await repo.claim(client);
      if (!claim) {
        await client.query('ROLLBACK');
        const { cursor, head } = await repo.peek(client);
        this.observe(cursor, head);
        return 'busy';
      }
      const batch = await repo.batch(client, claim.cursor, this.o.batchSize);
      if (batch.length === 0) {
        await client.query('COMMIT');
        this.observe(claim.cursor, claim.head);
        return 'done';
      }
      if (batch[0]!.version !== claim.cursor + 1)
        this.o.log.warn({ cursor: claim.cursor, next: batch[0]!.version }, 'event relay: outbox rows after the cursor are missing (pruned?); their events are lost');

      const byDest = new Map<string, PublishItem>();
      for (const row of batch) {
        if (row.dests.length === 0) continue;
        const text = serializeEnvelope(auditEnvelope(row));
        for (const d of row.dests) {
          let item = byDest.get(d.id);
          if (!item) byDest.set(d.id, (item = { dest: d, events: [] }));
          item.events.push(text);
          relayed++;
        }
      }
      for (const chunk of chunks([...byDest.values()], this.o.maxEventsPerPublish)) {
        const res = await withTimeout(this.o.producer.publish(chunk), this.o.publishTimeoutMs, 'publish');
        overflowed += res.overflowed;
      }
      const last = batch[batch.length - 1]!.version;
      await repo.advance(client, last);
      await client.query('COMMIT');
      rows = batch.length;
      this.observe(last, Math.max(claim.head, last));
      outcome = batch.length >= this.o.batchSize ? 'more' : 'done';
    } catch (err) {
      await client.query('ROLLBACK').catch((e: Error) => (broken = e));
      throw err;
    } finally {
      client.release(broken);
    }
    this.metrics.rows.inc(rows);
    this.metrics.batches.inc();
    if (relayed > 0) this.metrics.events.inc(relayed);
    if (overflowed > 0) {
      this.metrics.overflowed.inc(overflowed);
      this.o.log.warn({ overflowed }, 'event relay: destination buffers full; events went to the overflow (dead letters)');
    }
    return outcome;
  }

  /** Calls onDestinationChanged for one destination (an unchanged PATCH); a throw is logged. */
  private async announce(destId: string, deleted: boolean): Promise<void> {
    try {
      await this.o.onDestinationChanged?.(destId, deleted);
    } catch (err) {
      this.o.log.warn({ err: (err as Error).message, destination: destId }, 'event relay: onDestinationChanged failed');
    }
  }

  /** Calls onDestinationChanged for updates and deletes committed since the last call. */
  private async announceDestinationChanges(): Promise<void> {
    const cb = this.o.onDestinationChanged;
    if (!cb) return;
    for (;;) {
      const limit = 1000;
      const { head, changes } = await repo.destinationChanges(this.o.pool, this.watchVersion, limit);
      // A re-created database restarts its versions: start over from its head.
      if (head < this.watchVersion) {
        this.watchVersion = head;
        return;
      }
      for (const c of changes) {
        try {
          await cb(c.destId, c.deleted);
        } catch (err) {
          this.o.log.warn({ err: (err as Error).message, destination: c.destId }, 'event relay: onDestinationChanged failed');
        }
      }
      this.watchVersion = head;
      if (changes.length < limit) return;
    }
  }

  private observe(cursor: number, head: number): void {
    this.cursor = cursor;
    this.head = Math.max(head, cursor);
    this.metrics.cursor.set(cursor);
    this.metrics.lag.set(this.head - cursor);
  }
}

/** Items split so no call carries more than `max` events (one destination may span calls, in order). */
function chunks(items: PublishItem[], max: number): PublishItem[][] {
  const out: PublishItem[][] = [];
  let cur: PublishItem[] = [];
  let n = 0;
  for (const item of items) {
    for (let i = 0; i < item.events.length; ) {
      const take = Math.min(max - n, item.events.length - i);
      cur.push({ dest: item.dest, events: item.events.slice(i, i + take) });
      n += take;
      i += take;
      if (n >= max) {
        out.push(cur);
        cur = [];
        n = 0;
      }
    }
  }
  if (cur.length > 0) out.push(cur);
  return out;
}

function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout;
  return Promise.race([
    p,
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what} took over ${ms} ms`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}
