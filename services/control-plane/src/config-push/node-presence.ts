import type { DpAgentSession, Logger } from '@warren/shared';
import type { Db } from '../db/pool.js';
import { endpointHost, notifyPresence, presenceRepo as repo, writeSessionEvents, type NodeRef, type ReportedTunnel } from './presence.repo.js';
import { lockHosts } from '../modules/https-edges/https-edges.repo.js';

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
 *
 * Audit events (`agent_session_start.v0` / `_stop.v0`), written in the transaction of the
 * change: a start when a session's row is inserted by `sessionUp` or `fullSync` (not when a
 * node takes over a session that reconnected through it, nor for a repair), a stop when this
 * node's report removes the row (`sessionDown`, or `fullSync` for sessions gone while the
 * stream was down). The sweeper and credential deletion write the stops of the rows they
 * remove; a row the repair brings back after that gets no second stop from this node.
 */
export class NodePresence {
  private readonly sessions = new Map<string, DpAgentSession>();
  private readonly tunnels = new Map<string, ReportedTunnel>();
  /** Sessions whose rows this node holds, as far as we know. */
  private held = new Set<string>();
  /** Sessions the repair wrote back after their row was removed (and their stop event written). */
  private stopped = new Set<string>();

  constructor(
    private readonly db: Db,
    private readonly node: NodeRef,
    private readonly log: Logger,
    /** `PUBLIC_BASE_URL`, for the uris in session events. */
    private readonly baseUrl: string,
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
    const { written, inserted } = await this.retryOnFk(() =>
      this.db.tx(async (q) => {
        const w = await repo.writeSessions(q, this.node, [...this.sessions.values()]);
        const removed = await repo.deleteOthers(q, this.node.id, w.written, [...this.tunnels.keys()]);
        const changed = await repo.writeTunnels(q, this.node, [...this.tunnels.values()]);
        await notifyPresence(q, this.node.id, changed, removed.tunnels);
        await writeSessionEvents(q, this.baseUrl, { start: w.inserted, stop: removed.sessions.filter((r) => !this.stopped.has(r.id)) });
        return w;
      }),
    );
    this.held = new Set(written);
    const started = new Set(inserted.map((r) => r.id));
    this.stopped = new Set([...this.stopped].filter((id) => this.held.has(id) && !started.has(id)));
  }

  async sessionUp(s: DpAgentSession): Promise<void> {
    if (!this.sessions.has(s.id) && this.sessions.size >= MAX_PRESENCE_PER_NODE) return;
    this.sessions.set(s.id, s);
    const { written, inserted } = await this.retryOnFk(() =>
      this.db.tx(async (q) => {
        const w = await repo.writeSessions(q, this.node, [s]);
        if (w.inserted.length > 0) await writeSessionEvents(q, this.baseUrl, { start: w.inserted });
        return w;
      }),
    );
    if (inserted.length > 0) this.stopped.delete(s.id);
    if (written.length > 0) this.held.add(s.id);
    else this.log.debug({ session: s.id }, 'session not recorded: unknown credential or account');
  }

  async sessionDown(id: string): Promise<void> {
    this.sessions.delete(id);
    this.held.delete(id);
    const stopped = this.stopped.delete(id);
    for (const [tid, t] of this.tunnels) if (t.sessionId === id) this.tunnels.delete(tid);
    await this.db.tx(async (q) => {
      const removed = await repo.deleteSession(q, this.node.id, id);
      await notifyPresence(q, this.node.id, [], removed.tunnels);
      if (!stopped && removed.sessions.length > 0) await writeSessionEvents(q, this.baseUrl, { stop: removed.sessions });
    });
  }

  async tunnelUp(t: ReportedTunnel): Promise<void> {
    if (!this.tunnels.has(t.id) && this.tunnels.size >= MAX_PRESENCE_PER_NODE) return;
    this.tunnels.set(t.id, t);
    const host = endpointHost(t);
    await this.retryOnFk(() =>
      this.db.tx(async (q) => {
        // A new public Bind: recorded under its host's lock, the one an edge creation checks
        // under (https-edges.repo.ts), so that of the two the later one sees the earlier.
        if (host) await lockHosts(q, [host]);
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
    const rewritten = await this.retryOnFk(() =>
      this.db.tx(async (q) => {
        // No start events: these sessions never ended for their agents.
        const { written } = await repo.writeSessions(q, this.node, [...this.sessions.values()], 'insertMissing');
        const inserted = await repo.writeTunnels(q, this.node, [...this.tunnels.values()], 'insertMissing');
        await notifyPresence(q, this.node.id, inserted, []);
        this.held = new Set(await repo.sessionIdsOf(q, this.node.id));
        return written;
      }),
    );
    for (const id of rewritten) this.stopped.add(id);
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
