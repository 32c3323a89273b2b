import type { TLSSocket } from 'node:tls';
import { CEL_TIME, CelActions, CelConn, CelEndpoint, CelRequest, CelResponse, type CelTime, type CelTlsSocket } from '@warren/shared';
import type { RequestState, ResponseState } from '../pipeline/types.js';
import { geoLookupOf } from './geo.js';
import { servedPort as routingServedPort } from '../http/routing.js';
import { connectionStartedAt, serverRegion, wireSocket } from '../http/conn-facts.js';
import { ja4Of } from '../http/client-hello.js';

/**
 * The CEL activation of one request (or response): every variable is built on first read, so
 * an expression that reads only `conn.client_ip` costs one small object. cel-js reads variables
 * as properties of this object.
 */
export class Activation {
  private reqView?: CelRequest;
  private connView?: CelConn;
  private endpointView?: CelEndpoint;
  private resView?: CelResponse;
  private varMap?: Map<string, unknown>;

  constructor(
    readonly s: RequestState,
    readonly r: ResponseState | null,
  ) {}

  get req(): CelRequest {
    return (this.reqView ??= requestView(this.s));
  }

  get conn(): CelConn {
    // `conn.tls` reads the socket only when an expression reads it (see `CelTls`). The client
    // certificate is shown only on an edge whose `mutual_tls` verified it (that stage runs
    // before the policy and refuses a request without a valid one); elsewhere the ingress asks
    // for a certificate without checking it, so it is not trusted. `conn.geo` is looked up only
    // when read, once per request (`geo.ts`). `conn.client_port` and `conn.server_ip` read the
    // socket when read.
    const s = this.s;
    // Over a hop (a Bind endpoint's policy on the node holding the tunnel), the client's
    // connection as the sending node saw it (`hop-conn.ts`), not the one between the nodes.
    // `conn.bytes_*` count the TCP socket's bytes (TLS records included), `conn.ts.start` is when
    // it was accepted (`conn-facts.ts`); the ClientHello's JA4 was read before the handshake
    // (`client-hello.ts`).
    const hop = s.conn;
    if (this.connView) return this.connView;
    const wire = s.req.socket ? wireSocket(s.req.socket) : null;
    const socket = hop ? hop.socket : wire;
    const facts = hop ? hop.facts : { startedAt: connectionStartedAt(s.req.socket), region: serverRegion(), ja4: ja4Of(wire) };
    return (this.connView = new CelConn(s.clientIp, servedPort(s), hop ? hop.tls : tlsSocket(s), s.edge.mutualTls?.enabled === true, geoLookupOf(s), socket, facts));
  }

  /** `endpoint`: the edge (a Bind endpoint's synthetic edge has its tunnel's id) at the hostport that served the request. */
  get endpoint(): CelEndpoint {
    const s = this.s;
    return (this.endpointView ??= new CelEndpoint({ id: s.edge.id, host: s.host, port: () => servedPort(s), protocol: s.scheme }));
  }

  get res(): CelResponse | undefined {
    const r = this.r;
    if (!r) return undefined;
    return (this.resView ??= new CelResponse({ status: () => r.status, headers: () => r.headers }));
  }

  get actions(): CelActions {
    return actionsOf(this.s);
  }

  get time(): CelTime {
    return CEL_TIME;
  }

  /**
   * `vars`: what this run's `set-vars` actions set (`var-actions.ts`). One activation per
   * direction, so inbound and outbound rules each have their own, as ngrok scopes variables to
   * a phase. Created on first use: a policy that never reads or sets one pays nothing.
   */
  get vars(): Map<string, unknown> {
    return (this.varMap ??= new Map());
  }

  /** After the headers this run edits changed: later expressions read them again. */
  headersChanged(): void {
    if (this.r) this.resView?.headersChanged();
    else this.reqView?.headersChanged();
  }

  /** After a url-rewrite changed `s.target`: `req` is built again (from the new target) when next read. */
  urlChanged(): void {
    this.reqView = undefined;
  }
}

/** The request's `actions` results, kept in `s.vars.actions` (read by outbound rules and the traffic event). */
export function actionsOf(s: RequestState): CelActions {
  const v = s.vars.actions;
  if (v instanceof CelActions) return v;
  const a = new CelActions();
  s.vars.actions = a;
  return a;
}

function requestView(s: RequestState): CelRequest {
  // After a url-rewrite, the rewritten target (origin-form): `req.url`, `req.path`, … show it.
  const target = s.target;
  const url = target ?? s.req.url ?? '/';
  const q = url.indexOf('?');
  // `Host` as sent, for `req.url.raw`. `req.url` shows the host as routed and the port as served
  // (`servedAuthority`, computed only if read), so neither the spelling of Host nor a port the
  // client made up can pass a rule on `req.url`.
  const authority = s.req.headers.host ?? s.host;
  return new CelRequest({
    method: s.req.method ?? 'GET',
    scheme: s.scheme,
    host: s.host,
    authority,
    servedAuthority: () => servedAuthority(s),
    path: target === undefined ? s.path : q >= 0 ? target.slice(0, q) : target,
    rawQuery: q >= 0 ? url.slice(q + 1) : '',
    headers: () => s.headers,
    // Read only by `req.version`, `req.content_length`, `req.url.raw` / `.raw_path` and
    // `req.ts.header_received`: the target as the client sent it is `req.url` unless the ingress
    // normalised it (then kept in `s.rawTarget`).
    // Over a hop, the client's request as the sending node received it (`hop-conn.ts`).
    message: s.conn?.message ?? s.req,
    rawTarget: s.rawTarget ?? s.req.url,
    receivedAt: s.startedAt,
  });
}

/** The request's TLS socket, or null over plain HTTP. */
function tlsSocket(s: RequestState): CelTlsSocket | null {
  if (s.scheme !== 'https') return null;
  const socket = s.req.socket as Partial<TLSSocket> | null;
  return socket && typeof socket.getProtocol === 'function' && typeof socket.getPeerX509Certificate === 'function' ? (socket as TLSSocket) : null;
}

/** {@link routingServedPort} of a request on a route (the edge's hostports). */
function servedPort(s: RequestState): number {
  return routingServedPort(s.req.headers.host, s.host, s.scheme, s.edge.hostports);
}

/** `host[:port]` as served ({@link servedPort}), for `req.url`; an IPv6 literal in brackets. */
function servedAuthority(s: RequestState): string {
  const host = s.host.includes(':') && !s.host.startsWith('[') ? `[${s.host}]` : s.host;
  const port = servedPort(s);
  return port === (s.scheme === 'https' ? 443 : 80) ? host : `${host}:${port}`;
}
