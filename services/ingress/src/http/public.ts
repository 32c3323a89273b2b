import type http from 'node:http';
import type { Duplex } from 'node:stream';
import type { ErrorCode, Logger } from '@warren/shared';
import type { TunnelRegistry, TunnelTarget } from '../tunnels/registry.js';
import type { IngressMetrics } from '../metrics.js';
import { sendError, sendUpgradeError } from './error-page.js';
import { ipOf, publicRequestHeaders, type Forwarder, type RequestInfo } from './proxy.js';
import { RoutingTable } from './routing.js';

const HOSTNAME = /^[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_]([a-z0-9_-]{0,62}))*\.?$/;

/** `Host` → lower-case host and port (the scheme's default when absent), or null when malformed. */
export function parseHost(value: string | undefined, defaultPort: number): { host: string; port: number } | null {
  if (!value || value.length > 260) return null;
  let host: string;
  let port = defaultPort;
  if (value.startsWith('[')) {
    const end = value.indexOf(']');
    if (end < 0) return null;
    host = value.slice(1, end).toLowerCase();
    const rest = value.slice(end + 1);
    if (rest) {
      if (!rest.startsWith(':')) return null;
      port = Number(rest.slice(1));
    }
    if (!/^[0-9a-f:.]+$/.test(host)) return null;
  } else {
    const colon = value.lastIndexOf(':');
    host = (colon >= 0 ? value.slice(0, colon) : value).toLowerCase();
    if (colon >= 0) port = Number(value.slice(colon + 1));
    if (!HOSTNAME.test(host)) return null;
    if (host.endsWith('.')) host = host.slice(0, -1);
  }
  if (!Number.isInteger(port) || port < 1 || port > 65535) return null;
  return { host, port };
}

/** Path of a request target without its query; absolute-form targets are reduced to their path. */
export function pathOf(url: string | undefined): string {
  if (!url) return '/';
  if (url.charCodeAt(0) === 47 /* / */) {
    const q = url.indexOf('?');
    return q === -1 ? url : url.slice(0, q);
  }
  try {
    return new URL(url).pathname;
  } catch {
    return url === '*' ? '*' : '/';
  }
}

interface Resolved {
  target: TunnelTarget | null;
  error: ErrorCode | null;
  detail?: string;
  edge: string;
  route: string;
  /** Picks another target, for a retry; null when there is none. */
  next: (exclude: ReadonlySet<string>) => TunnelTarget | null;
  edgeType: '0' | '3';
}

const NONE = () => null;

export interface PublicHandlerOptions {
  registry: TunnelRegistry;
  forwarder: Forwarder;
  metrics: IngressMetrics;
  log: Logger;
}

/**
 * The public side of an ingress node: matches each request to an edge (Host and port) and a route
 * (exact before prefix, longest prefix first), or to a Bind endpoint by hostname, picks an online
 * tunnel and hands the request to the forwarder. Every failure is an error page with its status.
 */
export class PublicHandler {
  private table: RoutingTable | null = null;

  constructor(private readonly opts: PublicHandlerOptions) {}

  setTable(table: RoutingTable): void {
    this.table = table;
  }

  get ready(): boolean {
    return this.table !== null;
  }

  /** The request handler of one public listener. */
  handler(scheme: 'http' | 'https'): (req: http.IncomingMessage, res: http.ServerResponse) => void {
    const defaultPort = scheme === 'https' ? 443 : 80;
    return (req, res) => {
      const started = performance.now();
      const r = this.resolve(req, defaultPort);
      const record = (status: number) => this.opts.metrics.observe(r.edge, r.route, status, (performance.now() - started) / 1000);
      if (!r.target) {
        sendError(req, res, r.error ?? 7003, r.detail);
        record(res.statusCode);
        return;
      }
      const clientAddr = `${req.socket.remoteAddress ?? '0.0.0.0'}:${req.socket.remotePort ?? 0}`;
      const info: RequestInfo = { scheme, clientAddr, edgeType: r.edgeType };
      if (r.target.kind === 'remote') this.opts.metrics.hops.inc();
      const headers = publicRequestHeaders(req.rawHeaders, ipOf(req.socket.remoteAddress ?? ''), scheme, false);
      this.opts.forwarder.forward(req, res, r.target, info, headers, r.next).then(record, (err: unknown) => {
        this.opts.log.error({ err }, 'forward crashed');
        sendError(req, res, 7004);
        record(res.statusCode);
      });
    };
  }

  /** The `upgrade` handler of one public listener (WebSocket and other HTTP/1.1 upgrades). */
  upgradeHandler(scheme: 'http' | 'https'): (req: http.IncomingMessage, socket: Duplex, head: Buffer) => void {
    const defaultPort = scheme === 'https' ? 443 : 80;
    return (req, socket, head) => {
      socket.on('error', () => socket.destroy());
      const r = this.resolve(req, defaultPort);
      if (!r.target) {
        this.opts.metrics.upgrades.inc({ result: 'refused' });
        sendUpgradeError(socket, r.error ?? 7003, r.detail);
        return;
      }
      const remote = req.socket.remoteAddress ?? '0.0.0.0';
      const info: RequestInfo = { scheme, clientAddr: `${remote}:${req.socket.remotePort ?? 0}`, edgeType: r.edgeType };
      this.opts.metrics.upgrades.inc({ result: 'forwarded' });
      void this.opts.forwarder.upgrade(req, socket, head, r.target, info, publicRequestHeaders(req.rawHeaders, ipOf(remote), scheme, true));
    };
  }

  private resolve(req: http.IncomingMessage, defaultPort: number): Resolved {
    const table = this.table;
    if (!table) return { target: null, error: 7008, edge: '', route: '', next: NONE, edgeType: '3' };
    const hp = parseHost(req.headers.host, defaultPort);
    if (!hp) return { target: null, error: 7007, edge: '', route: '', next: NONE, edgeType: '3' };
    const registry = this.opts.registry;
    const ce = table.edgeFor(hp.host, hp.port, defaultPort);
    if (ce) {
      const cr = RoutingTable.routeFor(ce, hp.host, pathOf(req.url));
      const edge = ce.edge.id;
      if (!cr) return { target: null, error: 7001, edge, route: '', next: NONE, edgeType: '3' };
      const route = cr.route.id;
      const backend = cr.backend;
      if (!backend) return { target: null, error: 7002, edge, route, next: NONE, edgeType: '3' };
      const next = (exclude: ReadonlySet<string>) => registry.pickForBackend(backend.id, backend.accountId, backend.labels, exclude);
      const target = next(EMPTY_SET);
      return target
        ? { target, error: null, edge, route, next, edgeType: '3' }
        : { target: null, error: 7003, detail: `no tunnel is online for backend ${backend.id}`, edge, route, next, edgeType: '3' };
    }
    const next = (exclude: ReadonlySet<string>) => registry.pickForHost(hp.host, exclude);
    const target = next(EMPTY_SET);
    if (!target) return { target: null, error: 7000, detail: `no endpoint is configured for ${hp.host}`, edge: '', route: '', next: NONE, edgeType: '0' };
    return { target, error: null, edge: 'endpoint', route: '', next, edgeType: '0' };
  }
}

const EMPTY_SET: ReadonlySet<string> = new Set();
