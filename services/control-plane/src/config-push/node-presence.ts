import type { DpAgentSession, Logger } from '@warren/shared';
import type { Db } from '../db/pool.js';
import { notifyPresence, presenceRepo as repo, type NodeRef, type ReportedTunnel } from './presence.repo.js';

/** Most sessions and tunnels one node may report (a bound on the mirror below). */
export const MAX_PRESENCE_PER_NODE = 100_000;

const isFk = (err: unknown) => (err as { code?: string }).code === '23503';

/**
 * The agent sessions and tunnels of one connected ingress node: a mirror of what the node
 * reported, written to `tunnel_sessions`/`tunnels` (with leases) and announced on
 * `warren_tunnels`. Calls must not overlap (the node's stream handles its messages in order).
 *
 * The mirror lets the control plane repair the rows by itself: when a keep-alive renews fewer
 * rows than were written (the sweeper removed them while the database was unreachable, or
 * anything else deleted them), the missing ones are inserted again.
 */
export class NodePresence {
  private readonly sessions = new Map<string, DpAgentSession>();
  private readonly tunnels = new Map<string, ReportedTunnel>();
  /** Sessions whose rows this node holds, as far as we know. */
  private held = new Set<string>();

  constructor(
    private readonly db: Db,
    private readonly node: NodeRef,
    private readonly log: Logger,
  ) {}

  get sessionCount(): number {
    return this.sessions.size;
  }
  get tunnelCount(): number {
    return this.tunnels.size;
  }

  /** Replaces everything this node had with what it reports now. */
  async fullSync(sessions: DpAgentSession[], tunnels: ReportedTunnel[]): Promise<void> {
    this.sessions.clear();
    this.tunnels.clear();
    for (const s of sessions.slice(0, MAX_PRESENCE_PER_NODE)) this.sessions.set(s.id, s);
    for (const t of tunnels.slice(0, MAX_PRESENCE_PER_NODE)) this.tunnels.set(t.id, t);
    await this.retryOnFk(() =>
      this.db.tx(async (q) => {
        const written = await repo.writeSessions(q, this.node, [...this.sessions.values()]);
        const removed = await repo.deleteOthers(q, this.node.id, written, [...this.tunnels.keys()]);
        const changed = await repo.writeTunnels(q, this.node, [...this.tunnels.values()]);
        await notifyPresence(q, this.node.id, changed, removed);
        this.held = new Set(written);
      }),
    );
  }

  async sessionUp(s: DpAgentSession): Promise<void> {
    if (!this.sessions.has(s.id) && this.sessions.size >= MAX_PRESENCE_PER_NODE) return;
    this.sessions.set(s.id, s);
    const written = await this.retryOnFk(() => repo.writeSessions(this.db.pool, this.node, [s]));
    if (written.length > 0) this.held.add(s.id);
    else this.log.debug({ session: s.id }, 'session not recorded: unknown credential or account');
  }

  async sessionDown(id: string): Promise<void> {
    this.sessions.delete(id);
    this.held.delete(id);
    for (const [tid, t] of this.tunnels) if (t.sessionId === id) this.tunnels.delete(tid);
    await this.db.tx(async (q) => {
      const removed = await repo.deleteSession(q, this.node.id, id);
      await notifyPresence(q, this.node.id, [], removed);
    });
  }

  async tunnelUp(t: ReportedTunnel): Promise<void> {
    if (!this.tunnels.has(t.id) && this.tunnels.size >= MAX_PRESENCE_PER_NODE) return;
    this.tunnels.set(t.id, t);
    await this.retryOnFk(() =>
      this.db.tx(async (q) => {
        const changed = await repo.writeTunnels(q, this.node, [t]);
        if (changed.length === 0) this.log.debug({ tunnel: t.id }, 'tunnel not recorded (unchanged, or its session is not this node\'s)');
        await notifyPresence(q, this.node.id, changed, []);
      }),
    );
  }

  async tunnelDown(id: string): Promise<void> {
    this.tunnels.delete(id);
    await this.db.tx(async (q) => {
      const removed = await repo.deleteTunnel(q, this.node.id, id);
      await notifyPresence(q, this.node.id, [], removed);
    });
  }

  /** Renews the leases of all of the node's sessions; repairs rows that went missing. */
  async keepAlive(): Promise<void> {
    const renewed = await repo.renew(this.db.pool, this.node.id, this.node.leaseMs);
    if (renewed >= this.held.size) return;
    this.log.warn({ node: this.node.id, renewed, expected: this.held.size }, 'presence rows missing; writing them again');
    await this.retryOnFk(() =>
      this.db.tx(async (q) => {
        await repo.writeSessions(q, this.node, [...this.sessions.values()], 'insertMissing');
        const inserted = await repo.writeTunnels(q, this.node, [...this.tunnels.values()], 'insertMissing');
        await notifyPresence(q, this.node.id, inserted, []);
        this.held = new Set(await repo.sessionIdsOf(q, this.node.id));
      }),
    );
  }

  /** A credential or account deleted between the existence check and the insert: try again (then it is skipped). */
  private async retryOnFk<T>(fn: () => Promise<T>): Promise<T> {
    for (let attempt = 0; ; attempt++) {
      try {
        return await fn();
      } catch (err) {
        if (!isFk(err) || attempt >= 2) throw err;
      }
    }
  }
}
