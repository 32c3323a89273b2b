import type { DpTunnel } from '@warren/shared';
import type { LocalTunnel } from '../agents/server.js';

/** Where a request for a backend or an endpoint goes: a tunnel on this node, or one on another. */
export type TunnelTarget = { kind: 'local'; tunnel: LocalTunnel } | { kind: 'remote'; tunnel: DpTunnel };

interface Candidates {
  local: LocalTunnel[];
  remote: DpTunnel[];
  /** Round-robin cursor, shared by both lists. */
  next: number;
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
  private byBackend = new Map<string, Candidates>();
  /** hostname → public Bind tunnels; rebuilt in one pass after a change, so a miss costs nothing. */
  private byHost: Map<string, Candidates> | null = null;

  constructor(private readonly nodeId: string) {}

  addLocal(t: LocalTunnel): void {
    this.local.set(t.id, t);
    this.changed();
  }

  removeLocal(id: string): void {
    if (this.local.delete(id)) this.changed();
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

  /** A public Bind tunnel serving `hostname`, or null. */
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

  private indexHosts(): Map<string, Candidates> {
    const index = new Map<string, Candidates>();
    const entry = (t: LocalTunnel | DpTunnel): Candidates | null => {
      if (t.proto === 'labeled' || t.bindings.includes('internal')) return null;
      const host = hostnameOfUrl(t.publicUrl);
      if (!host) return null;
      let c = index.get(host);
      if (!c) index.set(host, (c = { local: [], remote: [], next: 0 }));
      return c;
    };
    for (const t of this.local.values()) entry(t)?.local.push(t);
    for (const t of this.remote.values()) entry(t)?.remote.push(t);
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
  }
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
