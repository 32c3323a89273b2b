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
  /** `host\npath` → route, and `\npath` for host-less routes. */
  exact: Map<string, CompiledRoute>;
  /** Prefix routes, longest path first; at equal length a host-specific one first. */
  prefixes: CompiledRoute[];
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
  readonly edgesByHostport = new Map<string, CompiledEdge>();
  readonly version: number;
  /** Routes whose modules or policy this ingress cannot apply: they answer 503 (fail closed), the rest of the config applies. */
  readonly routeErrors: Array<{ routeId: string; message: string }> = [];

  constructor(config: DataPlaneConfig, compilePipeline?: PipelineCompiler) {
    this.version = config.version;
    const byEdge = new Map<string, CompiledEdge>();
    for (const edge of config.edges.values()) {
      const ce: CompiledEdge = { edge, exact: new Map(), prefixes: [] };
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
   * ingress's 8443, and on its plain-HTTP port for local use).
   */
  edgeFor(host: string, port: number, publicPort: number): CompiledEdge | undefined {
    return this.edgesByHostport.get(`${host}:${port}`) ?? (port !== publicPort ? this.edgesByHostport.get(`${host}:${publicPort}`) : undefined) ?? this.edgesByHostport.get(`${host}:443`);
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
