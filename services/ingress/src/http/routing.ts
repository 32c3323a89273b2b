import type { Socket } from 'node:net';
import type { TLSSocket } from 'node:tls';
import type { DataPlaneConfig, DpBackend, DpEdge, DpRoute } from '@warren/shared';
import { RoutePipeline, type PipelineCompiler } from '../pipeline/runner.js';
import { errorAnswer } from './error-page.js';

/** A route ready for the request path: its match split into host and path, its backend resolved. */
export interface CompiledRoute {
  route: DpRoute;
  edge: DpEdge;
  /** Lower-case host the route is limited to, or null for any host of the edge. */
  host: string | null;
  path: string;
  exact: boolean;
  backend: DpBackend | null;
  /** The route's modules and traffic policy, compiled; null when it has none. */
  pipeline: RoutePipeline | null;
}

export interface CompiledEdge {
  edge: DpEdge;
  /**
   * The TLS version every request to the edge must have arrived with (its `tls_termination`), or
   * null when the edge sets none: then nothing is checked per request.
   */
  tlsMin: TlsMinimum | null;
  /** `host\npath` → route, and `\npath` for host-less routes. */
  exact: Map<string, CompiledRoute>;
  /** Prefix routes, longest path first; at equal length a host-specific one first. */
  prefixes: CompiledRoute[];
}

/** A minimum TLS version: its rank (see `tlsRank`) and its name as the API writes it (`1.3`). */
export interface TlsMinimum {
  rank: number;
  version: string;
}

/** `getProtocol()` names by rank; anything else (null: not TLS, or an unknown name) ranks 0. */
const TLS_RANK: Readonly<Record<string, number>> = { TLSv1: 10, 'TLSv1.1': 11, 'TLSv1.2': 12, 'TLSv1.3': 13 };
const TLS_12: TlsMinimum = { rank: 12, version: '1.2' };
const TLS_13: TlsMinimum = { rank: 13, version: '1.3' };

/**
 * The minimum TLS version an edge's enabled `tls_termination` sets (`min_version` `1.3`, else the
 * default `1.2`), or null when the module is absent or disabled. Warren terminates an edge's TLS
 * at the edge only (`terminate_at` is always `edge`): requests routed to an edge are ones the
 * ingress decrypted itself, or ones that came over plain HTTP.
 */
export function edgeTlsMinimum(edge: DpEdge): TlsMinimum | null {
  const t = edge.tlsTermination;
  if (!t || !t.enabled) return null;
  return t.minVersion === '1.3' ? TLS_13 : TLS_12;
}

/** Rank of the TLS version the connection negotiated: 0 for plain TCP. */
export function tlsRank(socket: Socket): number {
  const s = socket as Partial<TLSSocket>;
  if (s.encrypted !== true || typeof s.getProtocol !== 'function') return 0;
  const v = s.getProtocol();
  return v ? (TLS_RANK[v] ?? 0) : 0;
}

/**
 * The refusal of a request to an edge whose minimum TLS version its connection does not meet
 * (421 Misdirected Request: the handshake happened under another hostname's SNI, or not at all;
 * a new connection with the edge's hostname as SNI gets the edge's own TLS settings).
 */
export function tlsRefusal(min: TlsMinimum, socket: Socket): string {
  const s = socket as Partial<TLSSocket>;
  const used = s.encrypted === true && typeof s.getProtocol === 'function' ? (s.getProtocol() ?? 'TLS of an unknown version') : 'plain HTTP';
  return `this edge requires TLS ${min.version} or newer (tls_termination min_version ${min.version}) but the request came over ${used}; retry on a new connection over TLS ${min.version} or newer with this hostname as SNI`;
}

/**
 * `HTTPS_EDGES_ON_HTTP`: what the plain-HTTP listener does with a request whose Host names an
 * edge (the API has HTTPS edges only): `redirect` it (308) to `https://`, `refuse` it (421
 * ERR_WARREN_7114), or `serve` it in cleartext (local development and tests).
 */
export type HttpsEdgesOnHttp = 'redirect' | 'serve' | 'refuse';

/**
 * The constant one public listener applies to requests routed to an edge: the HTTPS listener
 * serves them; the plain-HTTP listener follows the setting, except that an Upgrade (WebSocket) is
 * refused rather than redirected, as no WebSocket client follows a redirect (browsers fail the
 * connection on any 3xx): a 421 with the https URL says what to do instead.
 */
export function httpsEdgesOn(scheme: 'http' | 'https', setting: HttpsEdgesOnHttp, upgrade: boolean): HttpsEdgesOnHttp {
  if (scheme === 'https' || setting === 'serve') return 'serve';
  return upgrade ? 'refuse' : setting;
}

/**
 * `https://<host>[:<httpsPort> unless 443]<path and query>` for a request target: origin-form as
 * it is, absolute-form reduced to its path and query, anything else (`*`) to `/`. Never another
 * host: the target's own authority is dropped.
 */
export function httpsLocation(host: string, target: string | undefined, httpsPort: number): string {
  let pathQuery = '/';
  if (target && target.charCodeAt(0) === 47 /* / */) pathQuery = target;
  else if (target && target !== '*') {
    try {
      const u = new URL(target);
      pathQuery = u.pathname + u.search;
    } catch {
      // not a URL: `/`
    }
  }
  return `https://${host}${httpsPort === 443 ? '' : `:${httpsPort}`}${pathQuery}`;
}

/**
 * The port a request was served on (`conn.server_port`, the port `req.url` shows, and the one its
 * traffic event records): the Host header's port when the edge has that very hostport
 * (`host:port` in `hostports`), else the scheme's default. Routing falls back from
 * `host:<any port>` to the edge's `host:443`, so a port the client made up
 * (`Host: admin.example.com:8443`) must not appear as one the edge served: a deny on
 * `req.url.startsWith('https://admin.example.com/')` or on `conn.server_port` would be passed by
 * it. A Bind endpoint (no hostports: it is found by hostname alone) always shows the default.
 */
export function servedPort(hostHeader: string | undefined, host: string, scheme: 'http' | 'https', hostports: readonly string[] | undefined): number {
  const def = scheme === 'https' ? 443 : 80;
  const value = hostHeader ?? '';
  const colon = value.lastIndexOf(':');
  if (colon <= 0 || colon < value.lastIndexOf(']')) return def;
  const p = Number(value.slice(colon + 1));
  if (!Number.isInteger(p) || p <= 0 || p >= 65536 || p === def) return def;
  return hostports?.includes(`${host}:${p}`) ? p : def;
}

/** Splits a route `match` (`/path`, `host` or `host/path`) into host and path. */
export function splitMatch(match: string): { host: string | null; path: string } {
  if (match.startsWith('/')) return { host: null, path: match };
  const slash = match.indexOf('/');
  if (slash === -1) return { host: match.toLowerCase(), path: '/' };
  return { host: match.slice(0, slash).toLowerCase(), path: match.slice(slash) };
}

/**
 * The routing table of one applied config: edges by `host:port`, and per edge its routes in match
 * order. Built once per config version (and run as a validator before the config is swapped in,
 * so a config that cannot be compiled is rejected and the old one kept).
 */
export class RoutingTable {
  /** Every edge by `host:port`, as the config has them (the Bind checks read this one). */
  readonly edgesByHostport = new Map<string, CompiledEdge>();
  /**
   * What requests are routed by: `edgesByHostport` itself, or (while an older agent endpoint of
   * another account holds one of its hosts, see {@link shadowHostports}) a copy without those
   * hostports. Swapped or edited when the config or the tunnels change, never per request.
   */
  private routable: Map<string, CompiledEdge> = this.edgesByHostport;
  /** Hostports taken out of `routable` now. */
  private shadowed: ReadonlySet<string> = new Set();
  /** host → its hostports (any port) and their edges; built on first use. */
  private byHost: Map<string, Array<{ hostport: string; ce: CompiledEdge }>> | null = null;
  private readonly createdMs = new Map<string, number>();
  readonly version: number;
  /** Routes whose modules or policy this ingress cannot apply: they answer 503 (fail closed), the rest of the config applies. */
  readonly routeErrors: Array<{ routeId: string; message: string }> = [];

  constructor(config: DataPlaneConfig, compilePipeline?: PipelineCompiler) {
    this.version = config.version;
    const byEdge = new Map<string, CompiledEdge>();
    for (const edge of config.edges.values()) {
      const ce: CompiledEdge = { edge, tlsMin: edgeTlsMinimum(edge), exact: new Map(), prefixes: [] };
      byEdge.set(edge.id, ce);
      for (const hp of edge.hostports) this.edgesByHostport.set(hp.toLowerCase(), ce);
    }
    for (const route of config.routes.values()) {
      const ce = byEdge.get(route.edgeId);
      if (!ce) throw new Error(`route ${route.id} names edge ${route.edgeId}, which is not in the config`);
      const { host, path } = splitMatch(route.match);
      let backend: DpBackend | null = null;
      if (route.backendId) {
        backend = config.backends.get(route.backendId) ?? null;
        if (!backend) throw new Error(`route ${route.id} names backend ${route.backendId}, which is not in the config`);
      }
      let pipeline: RoutePipeline | null = null;
      try {
        pipeline = compilePipeline ? compilePipeline(route, ce.edge, config) : null;
      } catch (err) {
        // One route's unusable module (e.g. a webhook provider this ingress cannot verify) must
        // not stop the whole config; that route refuses traffic rather than skip a security check.
        const message = (err as Error).message;
        this.routeErrors.push({ routeId: route.id, message });
        pipeline = new RoutePipeline([{ name: 'unavailable', onRequest: () => errorAnswer(undefined, 7010, `this route cannot be served: ${message}`) }]);
      }
      const cr: CompiledRoute = { route, edge: ce.edge, host, path, exact: route.matchType === 'exact_path', backend, pipeline };
      if (cr.exact) ce.exact.set(`${host ?? ''}\n${path}`, cr);
      else ce.prefixes.push(cr);
    }
    for (const ce of byEdge.values()) {
      ce.prefixes.sort((a, b) => b.path.length - a.path.length || (a.host === null ? 1 : 0) - (b.host === null ? 1 : 0));
    }
  }

  /**
   * The edge serving `host` (lower-case, no port) on `port`: the exact hostport first, then the
   * hostport with the scheme's public port (so an edge on `app.test:443` answers on a local
   * ingress's 8443), then `host:443`. Every edge is an HTTPS edge, so an edge found for a request
   * on the plain-HTTP listener (by any of these) is one that request must not simply be served
   * by: the caller applies HTTPS_EDGES_ON_HTTP (see `httpsEdgesOn`) before anything else.
   */
  edgeFor(host: string, port: number, publicPort: number): CompiledEdge | undefined {
    const m = this.routable;
    return m.get(`${host}:${port}`) ?? (port !== publicPort ? m.get(`${host}:${publicPort}`) : undefined) ?? (publicPort !== 443 ? m.get(`${host}:443`) : undefined);
  }

  /** The hostports (any port) of `host` and their edges, or undefined when no edge has that host. */
  edgesOnHost(host: string): ReadonlyArray<{ hostport: string; ce: CompiledEdge }> | undefined {
    if (!this.byHost) {
      this.byHost = new Map();
      for (const [hostport, ce] of this.edgesByHostport) {
        const h = hostOfHostport(hostport);
        let list = this.byHost.get(h);
        if (!list) this.byHost.set(h, (list = []));
        list.push({ hostport, ce });
      }
    }
    return this.byHost.get(host);
  }

  /** When the edge was created (Unix ms), from the time its KSUID id carries; 0 when the id is not one (the edge counts as oldest). */
  edgeCreatedMs(ce: CompiledEdge): number {
    let ms = this.createdMs.get(ce.edge.id);
    if (ms === undefined) this.createdMs.set(ce.edge.id, (ms = ksuidTimeMs(ce.edge.id)));
    return ms;
  }

  /**
   * Since when the edge holds `hostport` (Unix ms): when it gained it, as the control plane
   * recorded; else (stored before claims were recorded) since the edge's creation. An edge made
   * long ago and updated to add a host counts from the update.
   */
  hostportClaimedMs(ce: CompiledEdge, hostport: string): number {
    return ce.edge.hostportClaimedMs?.[hostport] ?? this.edgeCreatedMs(ce);
  }

  /**
   * Takes these hostports out of request routing (and puts back the ones taken out before and not
   * listed now): hosts whose edge belongs to one account while an older public agent endpoint of
   * another account serves the host (TunnelRegistry decides which, when the tunnels or the config
   * change). Such a request then goes to the endpoint. The Bind checks still see every edge.
   */
  shadowHostports(hostports: ReadonlySet<string>): void {
    const before = this.shadowed;
    if (hostports.size === 0 && before.size === 0) return;
    if (this.routable === this.edgesByHostport) this.routable = new Map(this.edgesByHostport);
    for (const hp of before) if (!hostports.has(hp)) this.routable.set(hp, this.edgesByHostport.get(hp)!);
    for (const hp of hostports) if (!before.has(hp)) this.routable.delete(hp);
    this.shadowed = new Set(hostports);
    if (hostports.size === 0) this.routable = this.edgesByHostport;
  }

  /** Hostports {@link shadowHostports} took out, for logs and tests. */
  get shadowedHostports(): ReadonlySet<string> {
    return this.shadowed;
  }

  /** Exact before prefix, longest prefix first; host-specific before host-less at a tie. */
  static routeFor(ce: CompiledEdge, host: string, path: string): CompiledRoute | undefined {
    const exact = ce.exact.get(`${host}\n${path}`) ?? ce.exact.get(`\n${path}`);
    if (exact) return exact;
    for (const cr of ce.prefixes) {
      if ((cr.host === null || cr.host === host) && path.startsWith(cr.path)) return cr;
    }
    return undefined;
  }
}

/** The host of a `host:port` (an IPv6 host keeps its brackets). */
export function hostOfHostport(hostport: string): string {
  const colon = hostport.lastIndexOf(':');
  return colon > 0 && colon > hostport.lastIndexOf(']') ? hostport.slice(0, colon) : hostport;
}

const BASE62 = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';
/** KSUID epoch: 2014-05-13T16:53:20Z, in seconds. */
const KSUID_EPOCH = 1_400_000_000;

/**
 * The creation time (Unix ms) an id `<prefix>_<KSUID>` carries: its seconds, plus the
 * millisecond Warren's ids put at the start of the payload (shared/src/ids.ts); 0 when `id` is no
 * such id. Used when the config or the tunnels change, not per request.
 */
export function ksuidTimeMs(id: string): number {
  const k = id.slice(id.lastIndexOf('_') + 1);
  if (k.length !== 27) return 0;
  let n = 0n;
  for (let i = 0; i < 27; i++) {
    const d = BASE62.indexOf(k[i]!);
    if (d < 0) return 0;
    n = n * 62n + BigInt(d);
  }
  const seconds = Number(n >> 128n);
  const ms = Number((n >> 112n) & 0xffffn);
  return (seconds + KSUID_EPOCH) * 1000 + (ms < 1000 ? ms : 0);
}
