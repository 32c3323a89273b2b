import type { DpTunnel } from '@warren/shared';
import type { LocalTunnel } from '../agents/server.js';
import type { RoutingTable } from '../http/routing.js';

/** Where a request for a backend or an endpoint goes: a tunnel on this node, or one on another. */
export type TunnelTarget = { kind: 'local'; tunnel: LocalTunnel } | { kind: 'remote'; tunnel: DpTunnel };

interface Candidates {
  local: LocalTunnel[];
  remote: DpTunnel[];
  /** Round-robin cursor, shared by both lists. */
  next: number;
}

/** The tunnels serving one hostname: all of one account's, the one that holds the name. */
interface HostCandidates extends Candidates {
  accountId: string;
  /** Start (Unix ms) of that account's oldest tunnel for the name: since when it holds it. */
  since: number;
}

/** A tunnel's start, Unix ms (its node's clock, as every node sees it); unparsable: last. */
function startedMs(t: { startedAt: string }): number {
  const ms = Date.parse(t.startedAt);
  return Number.isNaN(ms) ? Number.MAX_SAFE_INTEGER : ms;
}

/** True when `a` started before `b`: by start time, then by id (the same answer on every node). */
function older(a: { startedAt: string; id: string }, aMs: number, b: { id: string }, bMs: number): boolean {
  return aMs < bMs || (aMs === bMs && a.id < b.id);
}

function labelsInclude(have: Record<string, string>, want: Record<string, string>): boolean {
  for (const k in want) if (have[k] !== want[k]) return false;
  return true;
}

/** Host part of a Bind tunnel's public URL, lower-case (`https://App.test:8443` → `app.test`). */
export function hostnameOfUrl(url: string): string {
  try {
    return new URL(url).hostname.toLowerCase();
  } catch {
    return '';
  }
}

/**
 * Every tunnel this node can reach: its own agents' tunnels and, from the control plane, the
 * tunnels of agents connected to other nodes. Lookups are cached per backend and per hostname and
 * the caches are dropped on any change (tunnels come and go far less often than requests arrive),
 * so the request path does a map hit and a modulo.
 */
export class TunnelRegistry {
  private readonly local = new Map<string, LocalTunnel>();
  private readonly remote = new Map<string, DpTunnel>();
  /** hostname → this node's public Bind tunnels of it, kept as they come and go ({@link outheldLocalBinds}). */
  private readonly localBinds = new Map<string, Map<string, LocalTunnel>>();
  private byBackend = new Map<string, Candidates>();
  /** hostname → public Bind tunnels; rebuilt in one pass after a change, so a miss costs nothing. */
  private byHost: Map<string, HostCandidates> | null = null;
  /** `<account> <hostname>` → internal Bind tunnels (forward-internal); rebuilt after a change. */
  private byInternal: Map<string, Candidates> | null = null;
  /** The routing table whose edges yield to older agent endpoints of other accounts ({@link followEdges}). */
  private table: RoutingTable | null = null;
  private shadowPending = false;

  constructor(private readonly nodeId: string) {}

  addLocal(t: LocalTunnel): void {
    const old = this.local.get(t.id);
    if (old) this.forgetLocalBind(old);
    this.local.set(t.id, t);
    const host = publicBindHost(t);
    if (host) {
      let m = this.localBinds.get(host);
      if (!m) this.localBinds.set(host, (m = new Map()));
      m.set(t.id, t);
    }
    this.changed();
  }

  removeLocal(id: string): void {
    const t = this.local.get(id);
    if (!t) return;
    this.local.delete(id);
    this.forgetLocalBind(t);
    this.changed();
  }

  private forgetLocalBind(t: LocalTunnel): void {
    const host = publicBindHost(t);
    const m = host ? this.localBinds.get(host) : undefined;
    if (m?.get(t.id) !== t) return;
    m.delete(t.id);
    if (m.size === 0) this.localBinds.delete(host);
  }

  /** A tunnel on another node; our own node's tunnels are ignored (we know them first-hand). */
  addRemote(t: DpTunnel): void {
    if (t.nodeId === this.nodeId || this.local.has(t.id)) return;
    this.remote.set(t.id, t);
    this.changed();
  }

  removeRemote(id: string): void {
    if (this.remote.delete(id)) this.changed();
  }

  /** Replaces the whole remote set (after a snapshot or a restart from disk). */
  setRemote(all: Iterable<DpTunnel>): void {
    this.remote.clear();
    for (const t of all) if (t.nodeId !== this.nodeId && !this.local.has(t.id)) this.remote.set(t.id, t);
    this.changed();
  }

  getLocal(id: string): LocalTunnel | undefined {
    return this.local.get(id);
  }

  get localCount(): number {
    return this.local.size;
  }

  get remoteCount(): number {
    return this.remote.size;
  }

  localTunnels(): IterableIterator<LocalTunnel> {
    return this.local.values();
  }

  /**
   * A tunnel of `accountId` whose labels include all of `labels` (a tunnel group backend), or
   * null. Local tunnels are preferred (no internal hop); several are used in turn.
   */
  pickForBackend(backendId: string, accountId: string, labels: Record<string, string>, exclude?: ReadonlySet<string>): TunnelTarget | null {
    let c = this.byBackend.get(backendId);
    if (!c) {
      c = this.collect((t) => t.accountId === accountId && t.proto === 'labeled' && labelsInclude(t.labels, labels));
      this.byBackend.set(backendId, c);
    }
    return pick(c, exclude);
  }

  /**
   * A public Bind tunnel serving `hostname`, or null. A hostname is one account's: when tunnels of
   * several accounts claim it (two Binds raced on two nodes, each seeing only its own), only the
   * tunnels of the account whose tunnel for it started first are picked (start time as its node
   * reported it, then tunnel id: every node orders them alike, local and remote, so all nodes
   * converge on one account); the later claimer's tunnels get no traffic.
   */
  pickForHost(hostname: string, exclude?: ReadonlySet<string>): TunnelTarget | null {
    this.byHost ??= this.indexHosts();
    const c = this.byHost.get(hostname);
    return c ? pick(c, exclude) : null;
  }

  /** Bind tunnels (any node) serving `hostname`, for the uniqueness check of a new Bind. */
  bindsOf(hostname: string): Array<Pick<DpTunnel, 'id' | 'accountId' | 'sessionId' | 'poolingEnabled'>> {
    const out: Array<Pick<DpTunnel, 'id' | 'accountId' | 'sessionId' | 'poolingEnabled'>> = [];
    for (const t of this.local.values()) if (t.proto !== 'labeled' && hostnameOfUrl(t.publicUrl) === hostname) out.push(t);
    for (const t of this.remote.values()) if (t.proto !== 'labeled' && hostnameOfUrl(t.publicUrl) === hostname) out.push(t);
    return out;
  }

  /**
   * A tunnel of `accountId`'s internal endpoint `hostname` (a Bind with the `internal` binding,
   * which public routing never picks), for forward-internal; null when none is online. Local
   * tunnels first, several in turn.
   */
  pickInternal(hostname: string, accountId: string, exclude?: ReadonlySet<string>): TunnelTarget | null {
    this.byInternal ??= this.indexInternal();
    const c = this.byInternal.get(`${accountId} ${hostname}`);
    return c ? pick(c, exclude) : null;
  }

  /** Whether `accountId` has an internal endpoint `hostname` online (on any node). */
  hasInternal(hostname: string, accountId: string): boolean {
    this.byInternal ??= this.indexInternal();
    return this.byInternal.has(`${accountId} ${hostname}`);
  }

  private indexInternal(): Map<string, Candidates> {
    const index = new Map<string, Candidates>();
    const entry = (t: LocalTunnel | DpTunnel): Candidates | null => {
      if (t.proto === 'labeled' || !t.bindings.includes('internal')) return null;
      const host = hostnameOfUrl(t.publicUrl);
      if (!host) return null;
      const key = `${t.accountId} ${host}`;
      let c = index.get(key);
      if (!c) index.set(key, (c = { local: [], remote: [], next: 0 }));
      return c;
    };
    for (const t of this.local.values()) entry(t)?.local.push(t);
    for (const t of this.remote.values()) entry(t)?.remote.push(t);
    return index;
  }

  /** The account holding `hostname` through its public Bind tunnels, and since when (Unix ms); undefined when none. */
  hostOwner(hostname: string): { accountId: string; since: number } | undefined {
    this.byHost ??= this.indexHosts();
    const c = this.byHost.get(hostname);
    return c && { accountId: c.accountId, since: c.since };
  }

  /**
   * This node's public Bind tunnels whose hostname another account holds: that account's tunnel
   * for it started first (two Binds of one hostname raced on two nodes, each node's check passing
   * before it knew of the other's). {@link pickForHost} gives them no traffic, on every node; the
   * caller stops them. Pooled tunnels of the holder's account are not conflicts.
   * - `by`: a remote tunnel just added or changed: only its hostname is looked at, and only when
   *   this node has a Bind of it of another account (a map hit otherwise: never per request, and
   *   cheap while a snapshot's tunnels arrive one by one).
   * - none: every hostname this node has Binds of (after the remote set or the config was
   *   replaced). This also names the Binds of a host that an HTTPS edge of another account claimed
   *   before the host's holder started (`by: 'edge'`): routing tries edges first, so they get no
   *   traffic, and a Bind made now would be refused as well. (An edge that claimed it after the
   *   holder started is the one taken out of routing, see {@link followEdges}.)
   */
  outheldLocalBinds(by?: DpTunnel): Array<{ tunnel: LocalTunnel; hostname: string; by: 'endpoint' | 'edge' }> {
    let hosts: Iterable<string>;
    if (by) {
      const host = publicBindHost(by);
      const mine = host ? this.localBinds.get(host) : undefined;
      if (!mine || !this.remote.has(by.id)) return [];
      // A tunnel can only make its own account the holder: only other accounts' Binds may lose.
      let other = false;
      for (const t of mine.values()) if (t.accountId !== by.accountId) other = true;
      if (!other) return [];
      hosts = [host];
    } else {
      if (this.localBinds.size === 0) return [];
      hosts = [...this.localBinds.keys()];
    }
    const out: Array<{ tunnel: LocalTunnel; hostname: string; by: 'endpoint' | 'edge' }> = [];
    const table = by ? null : this.table;
    for (const hostname of hosts) {
      const owner = this.hostOwner(hostname);
      const mine = this.localBinds.get(hostname);
      if (!owner || !mine) continue;
      const edges = table?.edgesOnHost(hostname);
      const edgeFirst = edges !== undefined && edges.some(({ hostport, ce }) => ce.edge.accountId !== owner.accountId && table!.hostportClaimedMs(ce, hostport) <= owner.since);
      for (const tunnel of mine.values()) {
        if (tunnel.accountId !== owner.accountId) out.push({ tunnel, hostname, by: 'endpoint' });
        else if (edgeFirst) out.push({ tunnel, hostname, by: 'edge' });
      }
    }
    return out;
  }

  /**
   * Makes `table`'s edges yield to agent endpoints, now and whenever the tunnels change (after the
   * change, in one pass, never per request): an edge's hostport is taken out of routing while its
   * host is held by public Bind tunnels of another account that started before the edge claimed
   * that hostport ({@link RoutingTable.hostportClaimedMs}: when the edge gained it, or else its
   * creation). The account that held the host first keeps it; an edge that claimed it before the
   * endpoint started keeps it (resolve() tries edges first).
   */
  followEdges(table: RoutingTable): void {
    this.table = table;
    this.shadowEdges();
  }

  /** Applies the rule of {@link followEdges} to the table now. */
  shadowEdges(): void {
    this.shadowPending = false;
    const table = this.table;
    if (!table) return;
    this.byHost ??= this.indexHosts();
    const out = new Set<string>();
    for (const [host, c] of this.byHost) {
      const edges = table.edgesOnHost(host);
      if (!edges) continue;
      for (const { hostport, ce } of edges) if (ce.edge.accountId !== c.accountId && c.since < table.hostportClaimedMs(ce, hostport)) out.add(hostport);
    }
    table.shadowHostports(out);
  }

  private indexHosts(): Map<string, HostCandidates> {
    const all = new Map<string, { local: LocalTunnel[]; remote: DpTunnel[] }>();
    const entry = (t: LocalTunnel | DpTunnel) => {
      const host = publicBindHost(t);
      if (!host) return null;
      let c = all.get(host);
      if (!c) all.set(host, (c = { local: [], remote: [] }));
      return c;
    };
    for (const t of this.local.values()) entry(t)?.local.push(t);
    for (const t of this.remote.values()) entry(t)?.remote.push(t);
    const index = new Map<string, HostCandidates>();
    for (const [host, { local, remote }] of all) {
      // The oldest tunnel's account holds the name; others' tunnels are left out.
      let first: LocalTunnel | DpTunnel = (local[0] ?? remote[0])!;
      let firstMs = startedMs(first);
      let mixed = false;
      for (const list of [local, remote] as Array<Array<LocalTunnel | DpTunnel>>) {
        for (const t of list) {
          if (t.accountId !== first.accountId) mixed = true;
          const ms = startedMs(t);
          if (older(t, ms, first, firstMs)) {
            first = t;
            firstMs = ms;
          }
        }
      }
      const accountId = first.accountId;
      const since = firstMs;
      index.set(host, {
        local: mixed ? local.filter((t) => t.accountId === accountId) : local,
        remote: mixed ? remote.filter((t) => t.accountId === accountId) : remote,
        next: 0,
        accountId,
        since,
      });
    }
    return index;
  }

  private collect(pred: (t: LocalTunnel | DpTunnel) => boolean): Candidates {
    const local: LocalTunnel[] = [];
    const remote: DpTunnel[] = [];
    for (const t of this.local.values()) if (pred(t)) local.push(t);
    for (const t of this.remote.values()) if (pred(t)) remote.push(t);
    return { local, remote, next: 0 };
  }

  private changed(): void {
    this.byBackend = new Map();
    this.byHost = null;
    this.byInternal = null;
    // Edges yield to older endpoints once per burst of changes (a snapshot's tunnels arrive one
    // by one), on the next turn of the event loop.
    if (this.table && !this.shadowPending) {
      this.shadowPending = true;
      setImmediate(() => {
        if (this.shadowPending) this.shadowEdges();
      });
    }
  }
}

/** The hostname of a public Bind tunnel (what {@link TunnelRegistry.pickForHost} serves); '' for others. */
function publicBindHost(t: LocalTunnel | DpTunnel): string {
  if (t.proto === 'labeled' || t.bindings.includes('internal')) return '';
  return hostnameOfUrl(t.publicUrl);
}

function pick(c: Candidates, exclude?: ReadonlySet<string>): TunnelTarget | null {
  const { local, remote } = c;
  if (local.length > 0) {
    for (let i = 0; i < local.length; i++) {
      const t = local[c.next++ % local.length]!;
      if (!exclude?.has(t.id)) return { kind: 'local', tunnel: t };
    }
  }
  if (remote.length > 0) {
    for (let i = 0; i < remote.length; i++) {
      const t = remote[c.next++ % remote.length]!;
      if (!exclude?.has(t.id)) return { kind: 'remote', tunnel: t };
    }
  }
  if (c.next > 1e9) c.next = 0;
  return null;
}
