import { EventEmitter } from 'node:events';
import pg from 'pg';
import type { Logger } from '@warren/shared';
import { Backoff } from '@warren/shared';

export interface ListenerEvents {
  /** LISTEN is in place (first time and after every reconnect): catch up on what may have been missed. */
  connected: [];
  notification: [channel: string, payload: string];
  disconnected: [err: Error];
}

export interface PgListenerOptions {
  connectionString: string;
  channels: string[];
  log: Logger;
  /** A health query on the connection this often; a failure or a reply slower than the timeout reconnects. */
  healthIntervalMs?: number;
  healthTimeoutMs?: number;
  backoff?: { initialMs?: number; maxMs?: number };
}

/**
 * A dedicated Postgres connection (outside the pool: a pooled client would be handed to others)
 * that LISTENs on `channels` and reconnects with backoff whenever it drops. Notifications carry
 * hints only; consumers re-read the database on `connected`, so nothing sent while the
 * connection was down is lost. TCP keep-alives plus a periodic health query catch a connection
 * that died silently.
 */
export class PgListener extends EventEmitter<ListenerEvents> {
  private client: pg.Client | null = null;
  private stopped = false;
  private connectedOnce: Promise<void>;
  private resolveConnected!: () => void;
  private retryTimer: NodeJS.Timeout | null = null;
  private healthTimer: NodeJS.Timeout | null = null;
  private readonly backoff: Backoff;
  private everConnected = false;
  /** Number of reconnects after the first connection (metrics). */
  reconnects = 0;

  constructor(private readonly opts: PgListenerOptions) {
    super();
    this.backoff = new Backoff(opts.backoff?.initialMs ?? 100, opts.backoff?.maxMs ?? 5_000);
    this.connectedOnce = new Promise((r) => (this.resolveConnected = r));
  }

  get isConnected(): boolean {
    return this.client !== null;
  }

  /** Connects (retrying) and resolves once LISTEN is in place for the first time. */
  async start(): Promise<void> {
    void this.connect();
    await this.connectedOnce;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.retryTimer) clearTimeout(this.retryTimer);
    if (this.healthTimer) clearInterval(this.healthTimer);
    const c = this.client;
    this.client = null;
    this.resolveConnected(); // a start() still waiting returns
    if (c) await c.end().catch(() => {});
  }

  private async connect(): Promise<void> {
    if (this.stopped) return;
    const client = new pg.Client({
      connectionString: this.opts.connectionString,
      application_name: 'warren-control-plane-listener',
      keepAlive: true,
      keepAliveInitialDelayMillis: 10_000,
      connectionTimeoutMillis: 5_000,
    });
    let failed = false;
    const fail = (err: Error) => {
      if (failed) return;
      failed = true;
      if (this.client === client) this.client = null;
      if (this.healthTimer) clearInterval(this.healthTimer);
      this.healthTimer = null;
      client.removeAllListeners('notification');
      void client.end().catch(() => {});
      if (this.stopped) return;
      this.opts.log.warn({ err: err.message }, 'config listener: connection lost; reconnecting');
      this.emit('disconnected', err);
      this.scheduleRetry();
    };
    client.on('error', fail);
    client.on('end', () => fail(new Error('connection ended')));
    client.on('notification', (n) => this.emit('notification', n.channel, n.payload ?? ''));
    try {
      await client.connect();
      for (const ch of this.opts.channels) await client.query(`LISTEN ${pg.escapeIdentifier(ch)}`);
    } catch (err) {
      fail(err as Error);
      return;
    }
    if (this.stopped || failed) {
      await client.end().catch(() => {});
      return;
    }
    if (this.everConnected) this.reconnects++;
    this.everConnected = true;
    this.client = client;
    this.backoff.reset();
    this.startHealth(client, fail);
    this.resolveConnected();
    this.emit('connected');
  }

  private scheduleRetry(): void {
    if (this.stopped || this.retryTimer) return;
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      void this.connect();
    }, this.backoff.next());
    this.retryTimer.unref();
  }

  private startHealth(client: pg.Client, fail: (err: Error) => void): void {
    const every = this.opts.healthIntervalMs ?? 10_000;
    const timeout = this.opts.healthTimeoutMs ?? 5_000;
    this.healthTimer = setInterval(() => {
      const timer = setTimeout(() => fail(new Error(`health query took over ${timeout} ms`)), timeout);
      client.query('SELECT 1').then(
        () => clearTimeout(timer),
        (err: Error) => {
          clearTimeout(timer);
          fail(err);
        },
      );
    }, every);
    this.healthTimer.unref();
  }
}
