import { EventEmitter } from 'node:events';
import type pg from 'pg';
import type { Logger } from '@warren/shared';
import { deletesToProto, resourcesToProto, type ControlMessage } from '../../../shared/src/proto/index.js';
import { CONFIG_CHANNEL, EPOCH_NOTICE } from '../events/outbox.js';
import { readDelta, readHead, type DeltaData } from './config-reader.js';
import type { PgListener } from './listener.js';
import { Backoff } from '@warren/shared';

/** A delta built once and encoded once, for every node stream of this replica. */
export interface FeedDelta {
  data: DeltaData;
  /** `ControlMessage{delta, head_version}`, serialized. */
  encoded: Buffer;
}

export interface FeedEvents {
  delta: [FeedDelta];
  /** The outbox no longer covers the range since the last delta: every node needs a resync. */
  reset: [version: number];
}

export interface ConfigFeedOptions {
  pool: pg.Pool;
  listener: PgListener;
  log: Logger;
  encode: (msg: ControlMessage) => Buffer;
  onBadPolicy?: (routeId: string, err: Error) => void;
  /** See ReaderOptions.baseUrl. */
  baseUrl?: string;
  /** Called with the wall time from the notification to the delta being ready (seconds). */
  observeBuild?: (seconds: number, changes: number) => void;
}

/**
 * Turns committed config versions into deltas. Each `warren_config` notification (or a
 * reconnect of the listener) schedules a pump that
 * reads the outbox rows after the last version handled, up to the head, and loads the entities
 * they name (config-reader.ts). While a pump runs, further notifications only mark it dirty:
 * a burst of changes coalesces into few deltas. Versions are dense and in commit order, so
 * reading "everything after N up to the head" never skips a version that commits late.
 */
export class ConfigFeed extends EventEmitter<FeedEvents> {
  /** The version every delta so far brings a node to. */
  lastVersion = 0;
  /** The newest version known (notifications may run ahead of the deltas). */
  headVersion = 0;
  epoch = '';
  private pumping = false;
  private dirty = false;
  private firstNoticeAt = 0;
  private retryTimer: NodeJS.Timeout | null = null;
  private readonly backoff = new Backoff(100, 5_000);
  private stopped = false;
  private idle: Promise<void> = Promise.resolve();

  constructor(private readonly opts: ConfigFeedOptions) {
    super();
    opts.listener.on('connected', () => this.schedule());
    opts.listener.on('notification', (channel, payload) => {
      if (channel !== CONFIG_CHANNEL) return;
      // A new epoch (newConfigEpoch) comes at a version already handled: always read it.
      if (payload.startsWith(EPOCH_NOTICE)) return this.schedule();
      const v = Number(payload);
      if (Number.isFinite(v) && v > this.headVersion) this.headVersion = v;
      if (!(v <= this.lastVersion)) this.schedule();
    });
  }

  /** Starts at the current head: nodes that connect get a snapshot or resume from the database. */
  async init(): Promise<void> {
    const head = await readHead(this.opts.pool);
    this.lastVersion = head.version;
    this.headVersion = Math.max(this.headVersion, head.version);
    this.epoch = head.epoch;
    // Anything committed between LISTEN and this read is already covered by `lastVersion`.
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.retryTimer) clearTimeout(this.retryTimer);
    await this.idle;
  }

  /** Asks for a pump (coalesced with one in progress). */
  schedule(): void {
    if (this.stopped) return;
    if (!this.firstNoticeAt) this.firstNoticeAt = performance.now();
    if (this.pumping) {
      this.dirty = true;
      return;
    }
    if (this.retryTimer) return;
    this.pumping = true;
    this.idle = this.pump().finally(() => {
      this.pumping = false;
    });
  }

  private async pump(): Promise<void> {
    do {
      this.dirty = false;
      const started = this.firstNoticeAt || performance.now();
      this.firstNoticeAt = 0;
      try {
        const delta = await readDelta(this.opts.pool, this.lastVersion, { onBadPolicy: this.opts.onBadPolicy, baseUrl: this.opts.baseUrl });
        this.backoff.reset();
        if (!delta) {
          const head = await readHead(this.opts.pool);
          if (head.version < this.lastVersion || head.epoch !== this.epoch) this.opts.log.warn({ head: head.version, last: this.lastVersion }, 'config feed: the version sequence went back (database restored?)');
          else this.opts.log.warn({ head: head.version, last: this.lastVersion }, 'config feed: outbox rows are gone; every node resyncs');
          this.lastVersion = head.version;
          this.headVersion = head.version;
          this.epoch = head.epoch;
          this.emit('reset', head.version);
          continue;
        }
        if (delta.epoch !== this.epoch && this.epoch !== '') {
          // A new epoch (npm run admin -- new-config-epoch, after a restore in place): versions of
          // the old one mean nothing now; every node takes a snapshot.
          this.opts.log.warn({ epoch: delta.epoch, head: delta.version }, 'config feed: a new epoch of the version sequence; every node resyncs');
          this.lastVersion = delta.version;
          this.headVersion = delta.version;
          this.epoch = delta.epoch;
          this.emit('reset', delta.version);
          continue;
        }
        if (delta.version <= this.lastVersion) continue;
        this.lastVersion = delta.version;
        if (delta.version > this.headVersion) this.headVersion = delta.version;
        const encoded = this.opts.encode({
          delta: {
            fromVersion: delta.fromVersion,
            version: delta.version,
            epoch: delta.epoch,
            upserts: resourcesToProto(delta.upserts),
            deletes: deletesToProto(delta.deletes),
            committedAtUnixMs: delta.committedAtMs,
          },
          headVersion: delta.version,
        });
        this.opts.observeBuild?.((performance.now() - started) / 1000, delta.changes);
        this.emit('delta', { data: delta, encoded });
      } catch (err) {
        if (this.stopped) return;
        this.opts.log.warn({ err: (err as Error).message }, 'config feed: reading the outbox failed; retrying');
        this.retryTimer = setTimeout(() => {
          this.retryTimer = null;
          this.schedule();
        }, this.backoff.next());
        this.retryTimer.unref();
        return;
      }
    } while (this.dirty && !this.stopped);
  }
}
