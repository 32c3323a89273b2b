import { EventEmitter } from 'node:events';
import type pg from 'pg';
import type { DpTunnel, Logger } from '@warren/shared';
import { presenceRepo, TUNNELS_CHANNEL, type PresenceNotice } from './presence.repo.js';
import type { PgListener } from './listener.js';
import { Backoff } from '@warren/shared';

export interface PresenceChange {
  up: DpTunnel[];
  /** Tunnels gone, with the node they were on ('' when unknown). */
  down: { id: string; nodeId: string }[];
}

export interface DirectoryEvents {
  change: [PresenceChange];
}

/**
 * Every tunnel of the cluster, as this replica knows it, kept current from `warren_tunnels`
 * notifications (any replica's writes) and reloaded whole after every (re)connect of the
 * listener, when notifications may have been missed. An `up` notice is a hint: the tunnel is read
 * from the database, so notices arriving out of order cannot resurrect a tunnel that is gone.
 *
 * It mirrors the `tunnels` rows, whose every insert, change and delete is announced, and not
 * their sessions' leases, whose expiry and renewal are not: a tunnel whose lease ran out stays
 * until the sweeper deletes its rows (announced), unless its node renews it first.
 */
export class TunnelDirectory extends EventEmitter<DirectoryEvents> {
  private readonly tunnels = new Map<string, DpTunnel>();
  /** Pending work: per tunnel id, the last notice seen; `reload` asks for a full reload. */
  private pending = new Map<string, 'up' | 'down'>();
  private pendingNodes = new Map<string, string>();
  private reloadWanted = false;
  private draining = false;
  private retryTimer: NodeJS.Timeout | null = null;
  private readonly backoff = new Backoff(100, 5_000);
  private idle: Promise<void> = Promise.resolve();
  private stopped = false;

  constructor(
    private readonly pool: pg.Pool,
    private readonly listener: PgListener,
    private readonly log: Logger,
  ) {
    super();
    listener.on('connected', () => this.requestReload());
    listener.on('notification', (channel, payload) => {
      if (channel === TUNNELS_CHANNEL) this.onNotice(payload);
    });
  }

  get size(): number {
    return this.tunnels.size;
  }

  /** Loads every tunnel (call once the listener is connected). */
  async init(): Promise<void> {
    this.requestReload();
    await this.idle;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.retryTimer) clearTimeout(this.retryTimer);
    await this.idle;
  }

  /** Tunnels on nodes other than `nodeId`. */
  remoteFor(nodeId: string): DpTunnel[] {
    const out: DpTunnel[] = [];
    for (const t of this.tunnels.values()) if (t.nodeId !== nodeId) out.push(t);
    return out;
  }

  private onNotice(payload: string): void {
    let notice: PresenceNotice;
    try {
      notice = JSON.parse(payload) as PresenceNotice;
    } catch {
      this.log.warn({ payload: payload.slice(0, 200) }, 'tunnel directory: malformed notice; reloading');
      this.requestReload();
      return;
    }
    for (const id of notice.u ?? []) this.pending.set(id, 'up');
    for (const id of notice.d ?? []) {
      this.pending.set(id, 'down');
      if (typeof notice.n === 'string') this.pendingNodes.set(id, notice.n);
    }
    this.kick();
  }

  private requestReload(): void {
    this.reloadWanted = true;
    this.kick();
  }

  private kick(): void {
    if (this.draining || this.retryTimer || this.stopped) return;
    this.draining = true;
    this.idle = this.drain().finally(() => {
      this.draining = false;
    });
  }

  private async drain(): Promise<void> {
    while (!this.stopped && (this.reloadWanted || this.pending.size > 0)) {
      try {
        if (this.reloadWanted) {
          this.reloadWanted = false;
          this.pending.clear(); // the reload reads the current state of everything
          this.pendingNodes.clear();
          await this.reload();
        } else {
          const batch = this.pending;
          const nodes = this.pendingNodes;
          this.pending = new Map();
          this.pendingNodes = new Map();
          await this.applyBatch(batch, nodes).catch((err: unknown) => {
            // Put the batch back (newer notices win) and retry after a pause.
            for (const [id, op] of batch) if (!this.pending.has(id)) this.pending.set(id, op);
            for (const [id, n] of nodes) if (!this.pendingNodes.has(id)) this.pendingNodes.set(id, n);
            throw err;
          });
        }
        this.backoff.reset();
      } catch (err) {
        if (this.stopped) return;
        this.log.warn({ err: (err as Error).message }, 'tunnel directory: database read failed; retrying');
        this.retryTimer = setTimeout(() => {
          this.retryTimer = null;
          this.kick();
        }, this.backoff.next());
        this.retryTimer.unref();
        return;
      }
    }
  }

  private async reload(): Promise<void> {
    const all = await presenceRepo.tunnels(this.pool);
    const next = new Map(all.map((t) => [t.id, t]));
    const change: PresenceChange = { up: [], down: [] };
    for (const [id, t] of this.tunnels) if (!next.has(id)) change.down.push({ id, nodeId: t.nodeId });
    for (const [id, t] of next) if (!sameTunnel(this.tunnels.get(id), t)) change.up.push(t);
    this.tunnels.clear();
    for (const [id, t] of next) this.tunnels.set(id, t);
    this.publish(change);
  }

  private async applyBatch(batch: Map<string, 'up' | 'down'>, nodes: Map<string, string>): Promise<void> {
    const upIds = [...batch].filter(([, op]) => op === 'up').map(([id]) => id);
    const found = new Map((await presenceRepo.tunnels(this.pool, upIds)).map((t) => [t.id, t]));
    const change: PresenceChange = { up: [], down: [] };
    for (const [id, op] of batch) {
      const t = op === 'up' ? found.get(id) : undefined;
      if (t) {
        if (!sameTunnel(this.tunnels.get(id), t)) change.up.push(t);
        this.tunnels.set(id, t);
      } else {
        const had = this.tunnels.get(id);
        this.tunnels.delete(id);
        // An `up` whose row is gone is a down that raced it; an unknown down is passed on anyway (cheap, idempotent).
        if (had || op === 'down') change.down.push({ id, nodeId: had?.nodeId ?? nodes.get(id) ?? '' });
      }
    }
    this.publish(change);
  }

  private publish(change: PresenceChange): void {
    if (change.up.length > 0 || change.down.length > 0) this.emit('change', change);
  }
}

function sameTunnel(a: DpTunnel | undefined, b: DpTunnel): boolean {
  return a !== undefined && JSON.stringify(a) === JSON.stringify(b);
}
