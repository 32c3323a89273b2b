import type { X509Certificate } from 'node:crypto';
import http from 'node:http';
import type { Duplex } from 'node:stream';
import type { ErrorCode, Logger } from '@warren/shared';
import { hostnameOfUrl, type TunnelRegistry, type TunnelTarget } from '../tunnels/registry.js';
import type { IngressMetrics } from '../metrics.js';
import { sendError, sendUpgradeError } from './error-page.js';
import { HOP, HOP_CLOSE_HEAD, deliverAnswer, hopRequestHeaders, ipOf, publicRequestHeaders, splice, type Forwarder, type RequestInfo } from './proxy.js';
import { answerBody, answerHeaders } from './answer.js';
import { normalizeTarget } from './target.js';
import { DispatchTurn, dispatchPending, earlierResponsesSent } from './pipelining.js';
import { remoteIp } from './client-address.js';
import { WebSocketHandshakeError, acceptWebSocketAsTcp, isWebSocketTcpConverter } from '../modules/index.js';
import { decodeHopConn, encodeHopConn, type HopConn } from './hop-conn.js';
import { RoutingTable, httpsEdgesOn, servedPort, httpsLocation, tlsRank, tlsRefusal, type CompiledRoute, type HttpsEdgesOnHttp } from './routing.js';
import { BODY_READ_TIMEOUT_MS, BodyBudget, MAX_BUFFERED_BODY, readBody, type RoutePipeline } from '../pipeline/runner.js';
import type { Outcome, RequestState } from '../pipeline/types.js';
import { CLOSE_CONNECTION, closeConnection } from '../policy/flow-actions.js';
import { isForward, type ForwardOutcome } from '../policy/forward-internal.js';
import { tunnelFacts } from '../config/control-plane-client.js';
import { collectPolicyLogs } from '../policy/var-actions.js';
import { encodePolicyResult } from '../events/tracking.js';
import { HTTP_REQUEST_COMPLETE, HttpRequestTracker, TCP_CONNECTION_CLOSED, trackTcpConnection, type TrafficEvents } from '../events/index.js';
import type { DestinationRef } from '@warren/shared';

const HOSTNAME = /^[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_]([a-z0-9_-]{0,62}))*\.?$/;


/** `ip:port` of the client, for the agent's proxy header. */
function remoteAddr(socket: { remoteAddress?: string; remotePort?: number }): string {
  return `${remoteIp(socket) || '0.0.0.0'}:${socket.remotePort ?? 0}`;
}

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

/**
 * Path of a request target without its query; absolute-form targets are reduced to their path.
 * The asterisk form (`OPTIONS *`, RFC 9112 §3.2.4) addresses the server in general, not a
 * resource: it is routed, and shown to the route's stages, as `/` (it goes upstream as `*`).
 */
export function pathOf(url: string | undefined): string {
  if (!url) return '/';
  if (url.charCodeAt(0) === 47 /* / */) {
    const q = url.indexOf('?');
    return q === -1 ? url : url.slice(0, q);
  }
  if (url === '*') return '/';
  try {
    return new URL(url).pathname;
  } catch {
    return '/';
  }
}

interface Resolved {
  target: TunnelTarget | null;
  /** The matched route (edges only), whose pipeline runs before the tunnel is picked. */
  cr?: CompiledRoute;
  host?: string;
  path?: string;
  error: ErrorCode | null;
  detail?: string;
  /** A redirect to HTTPS instead (an edge on the plain-HTTP listener under HTTPS_EDGES_ON_HTTP=redirect). */
  location?: string;
  edge: string;
  route: string;
  /** The account the request is for (the edge's, or the Bind endpoint tunnel's); '' when none. */
  account: string;
  /** Picks another target, for a retry; null when there is none. */
  next: (exclude: ReadonlySet<string>) => TunnelTarget | null;
  edgeType: '0' | '3';
  /** The request target as sent, when `resolve` changed `req.url` (a route with a pipeline only). */
  rawTarget?: string;
  /**
   * A request another node carried here over a hop for an endpoint of this node with a traffic
   * policy (`serveHop`): the public client as that node saw it (the socket is the hop's).
   */
  hop?: { clientAddr: string; clientIp: string; conn: HopConn | null; wantResult: boolean };
}

const NONE = () => null;

/** How long a connection closing after an answer may still read (and drop) the request's body. */
const LINGER_MS = 5_000;

/**
 * Before an answer sent without taking the whole request body (413, 503 busy): the connection
 * closes after the answer, but not at once. A client still sending its body would meet a reset
 * (EPIPE, ECONNRESET) and might never read the answer; so, as nginx's lingering close does, the
 * rest of the body is read and dropped for at most {@link LINGER_MS} after the answer, then the
 * socket is destroyed (at once if the client hangs up first). Nothing is kept, so it costs no
 * memory; a client sending for longer is cut as before.
 */
function lingerAfterAnswer(req: http.IncomingMessage): void {
  const socket = req.socket as (Duplex & { destroySoon?: () => void; destroyed: boolean }) | null;
  if (!socket || req.complete || socket.destroyed || typeof socket.destroySoon !== 'function') return;
  req.resume(); // read, and drop
  // Node's HTTP server calls destroySoon() once the last answer of a closing connection is written.
  socket.destroySoon = function lingeringClose(this: Duplex) {
    if (this.writable) this.end();
    const kill = setTimeout(() => this.destroy(), LINGER_MS);
    kill.unref();
    this.once('close', () => clearTimeout(kill));
  };
}

type Forward = ForwardOutcome['forward'];

export interface PublicHandlerOptions {
  registry: TunnelRegistry;
  forwarder: Forwarder;
  metrics: IngressMetrics;
  log: Logger;
  /** Traffic events; absent when the node has no event Redis. */
  events?: TrafficEvents;
  /** HTTPS_EDGES_ON_HTTP of the plain-HTTP listener; absent: `serve`. */
  httpsEdgesOnHttp?: HttpsEdgesOnHttp;
  /** The public HTTPS port, for the redirect's Location (443: left out); absent: 443. */
  httpsPort?: () => number;
  /** Bytes of request bodies the route pipelines may hold at once; absent: no sum is kept. */
  bodyBudget?: BodyBudget;
  /** This node's TLS certificate, for `conn.tls.server` over a hop (`hop-conn.ts`); absent: none shown. */
  serverCertificate?: () => X509Certificate | null;
  /** This node's internal address (`host:port`), for forward-internal to an endpoint of its own with a policy; absent: those are not reached. */
  nodeAddress?: () => string | undefined;
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
    // Before it serves: its edges yield to older agent endpoints of other accounts (registry.ts).
    this.opts.registry.followEdges(table);
    this.table = table;
  }

  get ready(): boolean {
    return this.table !== null;
  }

  /** The request handler of one public listener. */
  handler(scheme: 'http' | 'https'): (req: http.IncomingMessage, res: http.ServerResponse) => void {
    const defaultPort = scheme === 'https' ? 443 : 80;
    const onHttp = httpsEdgesOn(scheme, this.opts.httpsEdgesOnHttp ?? 'serve', false);
    return (req, res) => {
      const started = performance.now();
      const r = this.resolve(req, defaultPort, onHttp);
      const record = recorder(this.opts.metrics, r.edge, r.route, started);
      // Traffic events: one lookup, and nothing more unless the account subscribes.
      let track: HttpRequestTracker | null = null;
      const events = this.opts.events;
      if (events !== undefined && r.account !== '') {
        const dests = events.destinations(r.account, HTTP_REQUEST_COMPLETE);
        if (dests.length > 0) track = this.trackHttp(events, dests, req, res, r, scheme, started);
      }
      if (r.cr) {
        this.runPipeline(req, res, r, r.cr, scheme, started, track, record);
        return;
      }
      if (!r.target) {
        if (r.location !== undefined) {
          record(sendRedirect(req, res, r.location));
          return;
        }
        // 421: the client is to retry on a new connection, so this one is not kept.
        if (r.error === 7113 || r.error === 7114) res.shouldKeepAlive = false;
        sendError(req, res, r.error ?? 7003, r.detail);
        record(res.statusCode);
        return;
      }
      const clientAddr = remoteAddr(req.socket);
      const info: RequestInfo = { scheme, clientAddr, edgeType: r.edgeType };
      // A Bind endpoint's policy runs on the node holding it: over a hop, it needs the client's
      // connection, and this node's traffic event needs the policy's results back.
      if (r.edgeType === '0') {
        info.conn = () => encodeHopConn(req, r.rawTarget);
        if (track) {
          const t = track;
          info.onHopPolicy = (v) => t.hopPolicyResult(v);
        }
      }
      if (r.target.kind === 'remote') this.opts.metrics.hops.inc();
      const headers = publicRequestHeaders(req.rawHeaders, remoteIp(req.socket), scheme, false);
      let next = r.next;
      if (track) {
        track.tunnelId = r.target.tunnel.id;
        next = track.picking(next);
      }
      // The usual case: nothing earlier on the connection waits to be sent (one property read).
      if (!dispatchPending(req.socket)) {
        this.forwardPlain(req, res, r.target, info, headers, next, record, null);
        return;
      }
      // Pipelined behind a request still in its route's stages: sent after it (DispatchTurn), and
      // the next one after its head is written.
      const turn = new DispatchTurn(req.socket);
      const target = r.target;
      info.written = turn.done;
      turn.whenEarlierSent(() => {
        if (res.destroyed) {
          turn.done();
          record(499); // the client went away while it waited
          return;
        }
        this.forwardPlain(req, res, target, info, headers, next, record, turn);
      });
    };
  }

  /** A request without route stages, to its tunnel; `turn`: its place in its connection's order, if it took one. */
  private forwardPlain(req: http.IncomingMessage, res: http.ServerResponse, target: TunnelTarget, info: RequestInfo, headers: string[], next: (exclude: ReadonlySet<string>) => TunnelTarget | null, record: (status: number) => void, turn: DispatchTurn | null): void {
    const done = this.opts.forwarder.forward(req, res, target, info, headers, next);
    done.then(record, (err: unknown) => {
      this.opts.log.error({ err }, 'forward crashed');
      sendError(req, res, 7004);
      record(res.statusCode);
    });
    // Told when its head is written (info.written); this, in case no exchange ever started (a full queue).
    if (turn !== null) done.then(turn.done, turn.done);
  }

  /** {@link withPipeline}, with its failures answered (502) and the status recorded. */
  private runPipeline(req: http.IncomingMessage, res: http.ServerResponse, r: Resolved, cr: CompiledRoute, scheme: 'http' | 'https', started: number, track: HttpRequestTracker | null, record: (status: number) => void): void {
    let done: Promise<number>;
    try {
      done = this.withPipeline(req, res, r, cr, scheme, started, track);
    } catch (err) {
      done = Promise.reject(err as Error); // a stage that threw: the same 502 as one that rejected
    }
    done.then(record, (err: unknown) => {
      // (Not `req.destroyed`: a request read to its end is destroyed too.)
      if (res.destroyed || req.socket.destroyed) {
        // The client went away (its body cut short while a stage read it): not our failure,
        // and not worth an error line any client could produce at will.
        this.opts.log.debug({ err: (err as Error)?.message, route: r.route || r.edge }, 'the client went away during the route stages');
        record(499);
        return;
      }
      this.opts.log.error({ err, route: r.route || r.edge }, 'route pipeline failed');
      sendError(req, res, 7004, 'the route failed to process the request');
      record(res.statusCode);
    });
  }

  /**
   * A request another node carried here (internal listener, hop token checked) for a tunnel of
   * this node: when that tunnel is an endpoint with a traffic policy, the policy runs here, with
   * the public client's address and scheme as the sending node saw them (the sending node runs
   * no endpoint policy for a tunnel it does not hold, so it runs once), then the request goes to
   * the tunnel. False when the tunnel has no policy (or is not here): the plain hop path serves it.
   */
  serveHop(req: http.IncomingMessage, res: http.ServerResponse): boolean {
    let r: ReturnType<PublicHandler['resolveHop']>;
    try {
      r = this.resolveHop(req);
    } catch (err) {
      // Never the plain hop path instead: it would skip the policy.
      this.opts.log.error({ err }, 'hop request for an endpoint could not be resolved');
      sendError(req, res, 7004);
      return true;
    }
    if (!r) return false;
    this.runPipeline(req, res, r, r.cr!, r.hopScheme, performance.now(), null, NO_RECORD);
    return true;
  }

  /** {@link serveHop} for an upgrade. */
  upgradeHop(req: http.IncomingMessage, socket: Duplex, head: Buffer): boolean {
    let r: ReturnType<PublicHandler['resolveHop']>;
    try {
      r = this.resolveHop(req);
    } catch (err) {
      this.opts.log.error({ err }, 'hop upgrade for an endpoint could not be resolved');
      sendUpgradeError(socket, 7004);
      return true;
    }
    if (!r) return false;
    void this.upgradeWithPipeline(req, socket, head, r, r.cr!, r.hopScheme).catch((err: unknown) => {
      this.opts.log.error({ err, route: r.edge }, 'endpoint traffic policy failed on an upgrade');
      sendUpgradeError(socket, 7004, 'the route failed to process the request');
    });
    return true;
  }

  private resolveHop(req: http.IncomingMessage): (Resolved & { hopScheme: 'http' | 'https' }) | null {
    // A raw hop stream is a route's websocket_tcp_converter, never an endpoint's.
    if (req.headers[HOP.raw] !== undefined) return null;
    const tunnel = this.opts.registry.getLocal(String(req.headers[HOP.tunnel] ?? ''));
    const ep = tunnel?.trafficPolicy;
    if (!tunnel || !ep) return null;
    const scheme = req.headers[HOP.scheme] === 'https' ? 'https' : 'http';
    const clientAddr = String(req.headers[HOP.clientAddr] ?? '0.0.0.0:0');
    const colon = clientAddr.lastIndexOf(':');
    const clientIp = ipOf(colon > 0 ? clientAddr.slice(0, colon) : clientAddr);
    const host = parseHost(req.headers.host, scheme === 'https' ? 443 : 80)?.host ?? hostnameOfUrl(tunnel.publicUrl);
    const target: TunnelTarget = { kind: 'local', tunnel };
    const conn = decodeHopConn(req.headers[HOP.conn], clientAddr, this.opts.serverCertificate?.() ?? null);
    // The target as the client sent it (the sending node normalised req.url), for req.url.raw.
    return { target: null, error: null, cr: ep.cr, host, path: pathOf(req.url), edge: 'endpoint', route: '', account: tunnel.accountId, next: only(target), edgeType: '0', hop: { clientAddr, clientIp, conn, wantResult: req.headers[HOP.policyWanted] === '1' }, hopScheme: scheme, rawTarget: conn?.rawTarget };
  }

  /** The `upgrade` handler of one public listener (WebSocket and other HTTP/1.1 upgrades). */
  upgradeHandler(scheme: 'http' | 'https'): (req: http.IncomingMessage, socket: Duplex, head: Buffer) => void {
    const defaultPort = scheme === 'https' ? 443 : 80;
    const onHttp = httpsEdgesOn(scheme, this.opts.httpsEdgesOnHttp ?? 'serve', true);
    const handle = (req: http.IncomingMessage, socket: Duplex, head: Buffer): void => {
      const r = this.resolve(req, defaultPort, onHttp);
      if (r.cr?.pipeline) {
        void this.upgradeWithPipeline(req, socket, head, r, r.cr, scheme).catch((err: unknown) => {
          this.opts.log.error({ err, route: r.route }, 'route pipeline failed on an upgrade');
          sendUpgradeError(socket, 7004, 'the route failed to process the request');
        });
        return;
      }
      if (!r.target) {
        this.opts.metrics.upgrades.inc({ result: 'refused' });
        sendUpgradeError(socket, r.error ?? 7003, r.detail);
        return;
      }
      const info: RequestInfo = { scheme, clientAddr: remoteAddr(req.socket), edgeType: r.edgeType };
      if (r.edgeType === '0') info.conn = () => encodeHopConn(req, r.rawTarget);
      this.opts.metrics.upgrades.inc({ result: 'forwarded' });
      void this.opts.forwarder.upgrade(req, socket, head, r.target, info, publicRequestHeaders(req.rawHeaders, remoteIp(req.socket), scheme, true));
    };
    return (req, socket, head) => {
      socket.on('error', () => socket.destroy());
      // Pipelined behind a request still being answered: its response goes first (its bytes
      // after this upgrade's answer, or inside the upgraded stream, would be misread).
      const earlier = earlierResponsesSent(socket);
      if (earlier) void earlier.then(() => (socket.destroyed ? undefined : handle(req, socket, head)));
      else handle(req, socket, head);
    };
  }

  /** Starts observing a request for its `http_request_complete.v0` event (the account subscribes). */
  private trackHttp(events: TrafficEvents, dests: readonly DestinationRef[], req: http.IncomingMessage, res: http.ServerResponse, r: Resolved, scheme: 'http' | 'https', started: number): HttpRequestTracker {
    const defaultPort = scheme === 'https' ? 443 : 80;
    const hp = parseHost(req.headers.host, defaultPort);
    // The port served, as the policy's conn.server_port shows it: never one made up in Host.
    const hostports = hp && r.edgeType === '3' && r.edge !== '' ? this.table?.edgeFor(hp.host, hp.port, defaultPort)?.edge.hostports : undefined;
    return new HttpRequestTracker(events, req, res, started, {
      accountId: r.account,
      dests,
      edgeId: r.edgeType === '3' && r.edge ? r.edge : null,
      routeId: r.route || null,
      clientIp: remoteIp(req.socket),
      serverName: hp?.host ?? '',
      serverPort: hp ? servedPort(req.headers.host, hp.host, scheme, hostports) : defaultPort,
      path: r.path ?? pathOf(req.url),
    });
  }

  /**
   * A request on a route with modules or a traffic policy: its stages, then the tunnel. Stays
   * synchronous up to the forward unless the body must be buffered or a stage is asynchronous.
   */
  private withPipeline(req: http.IncomingMessage, res: http.ServerResponse, r: Resolved, cr: CompiledRoute, scheme: 'http' | 'https', started: number, track: HttpRequestTracker | null): Promise<number> {
    const pipeline = cr.pipeline!;
    const clientIp = r.hop ? r.hop.clientIp : remoteIp(req.socket);
    const state: RequestState = {
      req,
      scheme,
      clientIp,
      host: r.host!,
      path: r.path!,
      edge: cr.edge,
      route: cr.route,
      conn: r.hop?.conn ?? undefined,
      // Over a hop, the sending node prepared them (X-Forwarded-For …) already.
      headers: r.hop ? hopRequestHeaders(req.rawHeaders) : publicRequestHeaders(req.rawHeaders, clientIp, scheme, false),
      body: null,
      vars: {},
      startedAt: started,
      rawTarget: r.rawTarget,
    };
    if (track) track.state = state;
    // Over a hop, for the sending node's traffic event: the policy's results go back on the head.
    else if (r.hop?.wantResult) sendPolicyResultOnHead(res, state);
    if (pipeline.needsBody) {
      const budget = this.opts.bodyBudget;
      // Its body is read first: a request pipelined behind it waits for it to be sent upstream.
      const turn = new DispatchTurn(req.socket);
      return readBody(req, MAX_BUFFERED_BODY, BODY_READ_TIMEOUT_MS, budget).then(
        (body) => {
          if (body === 'busy') {
            turn.done();
            // The rest of the body is not kept: the connection closes after the answer.
            res.shouldKeepAlive = false;
            lingerAfterAnswer(req);
            sendError(req, res, 7013, undefined, { 'retry-after': '1' });
            return 503;
          }
          if (budget && Buffer.isBuffer(body)) {
            const held = body.length;
            res.once('close', () => budget.release(held));
          }
          if (body === 'timeout') {
            turn.done();
            // The rest of the body is not awaited: the connection closes after the answer.
            res.shouldKeepAlive = false;
            sendError(req, res, 7012);
            return 408;
          }
          state.body = body;
          if (!body) {
            turn.done();
            // Over the bound: the rest of the body is not kept (it may be a gigabyte): the
            // connection closes after the answer, as for 408 and 503 above.
            res.shouldKeepAlive = false;
            lingerAfterAnswer(req);
            sendError(req, res, 7009);
            return 413;
          }
          return this.afterRequestStages(req, res, r, cr, state, this.requestStages(pipeline, state, turn), track, turn);
        },
        (err: unknown) => {
          turn.done();
          throw err;
        },
      );
    }
    return this.afterRequestStages(req, res, r, cr, state, pipeline.onRequest(state), track, null);
  }

  /** `pipeline.onRequest`, ending `turn` when it throws (the request is not sent: later ones may go). */
  private requestStages(pipeline: RoutePipeline, state: RequestState, turn: DispatchTurn): Outcome | Promise<Outcome> {
    try {
      return pipeline.onRequest(state);
    } catch (err) {
      turn.done();
      throw err;
    }
  }

  /**
   * After the request stages: their answer, or the request goes upstream, in its connection's
   * order (`turn`: its place, taken when it could not be sent at once; see {@link DispatchTurn}).
   */
  private afterRequestStages(req: http.IncomingMessage, res: http.ServerResponse, r: Resolved, cr: CompiledRoute, state: RequestState, out: Outcome | Promise<Outcome>, track: HttpRequestTracker | null, turn: DispatchTurn | null): Promise<number> {
    if (out instanceof Promise) {
      // Taken now, in the request's own event: a request pipelined behind it must see it.
      const t = turn ?? new DispatchTurn(req.socket);
      return out.then(
        (o) => this.afterRequestStages(req, res, r, cr, state, o, track, t),
        (err: unknown) => {
          t.done();
          throw err;
        },
      );
    }
    // forward-internal: the request goes on, to an internal endpoint instead of the route's upstream.
    let fwd: Forward | undefined;
    if (out) {
      if (isForward(out)) fwd = out.forward;
      else {
        turn?.done(); // answered here: never sent upstream
        return this.answerOutcome(req, res, r, cr, state, out);
      }
    }
    if (turn === null) {
      // The usual case: nothing earlier on the connection waits to be sent (one property read).
      if (!dispatchPending(req.socket)) return this.toUpstream(req, res, r, cr, state, track, undefined, fwd);
      turn = new DispatchTurn(req.socket);
    }
    const t = turn;
    if (t.earlierSent) return this.toUpstreamInTurn(req, res, r, cr, state, track, t, fwd);
    return new Promise<number>((resolve, reject) => {
      t.whenEarlierSent(() => {
        if (res.destroyed) {
          // The client went away while it waited: nothing is sent (a circuit breaker's probe frees its place).
          t.done();
          cr.pipeline!.onResult(state, 'none');
          resolve(499);
          return;
        }
        this.toUpstreamInTurn(req, res, r, cr, state, track, t, fwd).then(resolve, reject);
      });
    });
  }

  /** {@link toUpstream} for a request holding a turn: the next request of the connection goes once its head is written, or once it is over. */
  private toUpstreamInTurn(req: http.IncomingMessage, res: http.ServerResponse, r: Resolved, cr: CompiledRoute, state: RequestState, track: HttpRequestTracker | null, turn: DispatchTurn, fwd?: Forward): Promise<number> {
    let done: Promise<number>;
    try {
      done = this.toUpstream(req, res, r, cr, state, track, turn.done, fwd);
    } catch (err) {
      turn.done();
      throw err;
    }
    done.then(turn.done, turn.done);
    return done;
  }

  /** A request stage's own answer (deny, custom-response, 429, close-connection, …). */
  private answerOutcome(req: http.IncomingMessage, res: http.ServerResponse, r: Resolved, cr: CompiledRoute, state: RequestState, out: Exclude<Outcome, null>): Promise<number> {
    const pipeline = cr.pipeline!;
    // A stage answered: through the response stages when the route has any (the traffic
    // policy's outbound rules run on a deny or a 429 as on the upstream's response), else as it is.
    if (out === CLOSE_CONNECTION && r.hop) {
      // A Bind endpoint's close-connection on the node holding it: the node the client reached
      // closes the client's connection (destroying this one, the hop's, read there as a 502).
      res.writeHead(204, { [HOP.close]: '1' }).end();
      return Promise.resolve(CLOSE_CONNECTION.status);
    }
    if (out === CLOSE_CONNECTION || !pipeline.editsResponses) return Promise.resolve(sendOutcome(req, res, out));
    return deliverAnswer(req, res, out, { pipeline, state }, this.opts.log);
  }

  /** The request after its stages let it through: to the route's tunnel (or the error that there is none). */
  private toUpstream(req: http.IncomingMessage, res: http.ServerResponse, r: Resolved, cr: CompiledRoute, state: RequestState, track: HttpRequestTracker | null, written?: () => void, fwd?: Forward): Promise<number> {
    const pipeline = cr.pipeline!;
    if (fwd) return this.toInternal(req, res, r, cr, state, fwd, written);
    // (A Bind endpoint's policy, edgeType '0', has its tunnel in `r.next` rather than a backend.)
    if (!cr.backend && r.edgeType === '3') {
      sendError(req, res, 7002);
      pipeline.onResult(state, 'none');
      return Promise.resolve(502);
    }
    const next = track ? track.picking(r.next) : r.next;
    const target = next(EMPTY_SET);
    if (!target) {
      sendError(req, res, 7003, cr.backend ? `no tunnel is online for backend ${cr.backend.id}` : `the endpoint ${r.host ?? ''} went offline`);
      pipeline.onResult(state, 'error');
      return Promise.resolve(503);
    }
    if (target.kind === 'remote') this.opts.metrics.hops.inc();
    const info: RequestInfo = { scheme: state.scheme, clientAddr: r.hop?.clientAddr ?? remoteAddr(req.socket), edgeType: r.edgeType };
    if (written !== undefined) info.written = written;
    return this.forwardWithStages(req, res, target, info, next, pipeline, state);
  }

  /** To the tunnel, through the route's response stages. */
  private forwardWithStages(req: http.IncomingMessage, res: http.ServerResponse, target: TunnelTarget, info: RequestInfo, next: (exclude: ReadonlySet<string>) => TunnelTarget | null, pipeline: RoutePipeline, state: RequestState): Promise<number> {
    const done = this.opts.forwarder.forward(req, res, target, info, state.headers, next, { pipeline, state });
    if (pipeline.hasResultStages) {
      // Ended without an upstream result (the client went away first): a circuit breaker's probe frees its place.
      const none = () => pipeline.onResult(state, 'none');
      done.then(none, none);
    }
    return done;
  }

  /**
   * A request a traffic policy's forward-internal sends to an internal endpoint of the route's
   * account: to its tunnel, with the public client's connection facts, as a Bind endpoint's
   * request goes. The endpoint's own policy runs on the node holding it: over a hop, to this node
   * itself when the tunnel is here and has one (`internalTarget`). The answer comes back through
   * this route's response stages.
   */
  private toInternal(req: http.IncomingMessage, res: http.ServerResponse, r: Resolved, cr: CompiledRoute, state: RequestState, fwd: Forward, written?: () => void): Promise<number> {
    const pipeline = cr.pipeline!;
    const next = (exclude: ReadonlySet<string>) => this.internalTarget(fwd, exclude);
    const target = next(EMPTY_SET);
    if (!target) {
      sendError(req, res, 7003, `forward-internal: the internal endpoint ${fwd.host} went offline`);
      pipeline.onResult(state, 'error');
      return Promise.resolve(503);
    }
    if (target.kind === 'remote') this.opts.metrics.hops.inc();
    const info: RequestInfo = { scheme: state.scheme, clientAddr: r.hop?.clientAddr ?? remoteAddr(req.socket), edgeType: '0', forwardDepth: fwd.depth };
    // The public connection's facts: as this node saw them, or as the hop that brought the request here carried them.
    const hopConn = r.hop ? req.headers[HOP.conn] : undefined;
    info.conn = r.hop ? () => (typeof hopConn === 'string' ? hopConn : '') : () => encodeHopConn(req, r.rawTarget);
    if (written !== undefined) info.written = written;
    return this.forwardWithStages(req, res, target, info, next, pipeline, state);
  }

  /**
   * A tunnel of the internal endpoint `fwd` names, or null. One of this node whose endpoint has a
   * traffic policy is reached over a hop to this node itself (its internal listener runs the policy,
   * as for a request another node sent: `serveHop`); without this node's address, not at all.
   */
  private internalTarget(fwd: Forward, exclude: ReadonlySet<string>): TunnelTarget | null {
    const t = this.opts.registry.pickInternal(fwd.host, fwd.accountId, exclude);
    if (t === null || t.kind === 'remote' || !t.tunnel.trafficPolicy) return t;
    const self = this.opts.nodeAddress?.();
    if (!self) return null;
    return { kind: 'remote', tunnel: { ...tunnelFacts(t.tunnel), nodeId: '', nodeAddress: self } };
  }

  /** An upgrade on a route with a pipeline: the request stages (no body), then the tunnel. */
  private async upgradeWithPipeline(req: http.IncomingMessage, socket: Duplex, head: Buffer, r: Resolved, cr: CompiledRoute, scheme: 'http' | 'https'): Promise<void> {
    const clientIp = r.hop ? r.hop.clientIp : remoteIp(req.socket);
    const state: RequestState = {
      req, scheme, clientIp, host: r.host!, path: r.path!, edge: cr.edge, route: cr.route, conn: r.hop?.conn ?? undefined,
      headers: r.hop ? hopRequestHeaders(req.rawHeaders) : publicRequestHeaders(req.rawHeaders, clientIp, scheme, true), body: null, vars: {}, startedAt: performance.now(), rawTarget: r.rawTarget,
    };
    // Counted once, by the node the client reached: over a hop (a Bind endpoint's policy on the
    // node holding it), the sending node counted it as forwarded.
    const count = (result: 'refused' | 'forwarded') => {
      if (!r.hop) this.opts.metrics.upgrades.inc({ result });
    };
    const out = await cr.pipeline!.onRequest(state);
    // An Upgrade has no result a circuit breaker counts: one that let it through as its probe frees the place.
    if (!out || isForward(out)) cr.pipeline!.onResult(state, 'none');
    if (out && isForward(out)) {
      // forward-internal: the upgrade goes to the internal endpoint's tunnel (its policy runs where it is held).
      const fwd = out.forward;
      const target = this.internalTarget(fwd, EMPTY_SET);
      if (!target) {
        count('refused');
        sendUpgradeError(socket, 7003, `forward-internal: the internal endpoint ${fwd.host} went offline`);
        return;
      }
      count('forwarded');
      const hopConn = r.hop ? req.headers[HOP.conn] : undefined;
      const info: RequestInfo = {
        scheme,
        clientAddr: r.hop?.clientAddr ?? remoteAddr(req.socket),
        edgeType: '0',
        forwardDepth: fwd.depth,
        conn: r.hop ? () => (typeof hopConn === 'string' ? hopConn : '') : () => encodeHopConn(req, r.rawTarget),
      };
      await this.opts.forwarder.upgrade(req, socket, head, target, info, state.headers, state.target);
      return;
    }
    if (out) {
      count('refused');
      if (out === CLOSE_CONNECTION) {
        // Over a hop, the sending node closes its client's connection on this answer.
        if (r.hop) socket.end(HOP_CLOSE_HEAD);
        else socket.destroy();
        return;
      }
      // Written raw (no response stages run on it: the socket is not an HTTP response).
      const h = answerHeaders(out);
      let head = `HTTP/1.1 ${out.status} ${http.STATUS_CODES[out.status] ?? ''}\r\n`;
      for (let i = 0; i < h.length; i += 2) head += `${h[i]}: ${h[i + 1]}\r\n`;
      // One character per byte: header values are bytes as Node holds them (a policy's UTF-8 text included).
      socket.write(`${head}connection: close\r\n\r\n`, 'latin1');
      socket.end(answerBody(out, req.method));
      return;
    }
    const target = r.next(EMPTY_SET);
    if (!target) {
      count('refused');
      sendUpgradeError(socket, cr.backend || r.edgeType === '0' ? 7003 : 7002);
      return;
    }
    count('forwarded');
    const info: RequestInfo = { scheme, clientAddr: r.hop?.clientAddr ?? remoteAddr(req.socket), edgeType: r.edgeType };
    if (cr.pipeline!.stages.some(isWebSocketTcpConverter)) {
      // websocket_tcp_converter: the ingress accepts the WebSocket itself; the agent gets the
      // frames' payloads as a plain TCP stream.
      const upstream = await this.opts.forwarder.rawStream(target, { ...info, proto: 'tcp' });
      if (socket.destroyed) {
        // The client went away while the stream was opened.
        upstream.destroy();
        return;
      }
      let ws: Duplex;
      try {
        ws = acceptWebSocketAsTcp(req, socket, head);
      } catch (err) {
        upstream.destroy();
        if (!(err instanceof WebSocketHandshakeError)) throw err;
        return;
      }
      splice(ws, upstream);
      // After splice: the byte counters' 'data' listeners must not start the flow before the pipes exist.
      const events = this.opts.events;
      if (events !== undefined) {
        const dests = events.destinations(cr.route.accountId, TCP_CONNECTION_CLOSED);
        if (dests.length > 0) {
          trackTcpConnection(events, ws, upstream, {
            accountId: cr.route.accountId,
            dests,
            edgeId: cr.edge.id,
            routeId: cr.route.id,
            tunnelId: target.tunnel.id,
            clientIp,
            serverAddr: ipOf(req.socket.localAddress ?? ''),
            serverPort: servedPort(req.headers.host, r.host!, scheme, cr.edge.hostports),
            started: state.startedAt,
          });
        }
      }
      return;
    }
    await this.opts.forwarder.upgrade(req, socket, head, target, info, state.headers, state.target);
  }

  /** `onHttp`: the listener's constant from `httpsEdgesOn` (always `serve` on the HTTPS listener). */
  private resolve(req: http.IncomingMessage, defaultPort: number, onHttp: HttpsEdgesOnHttp): Resolved {
    const table = this.table;
    if (!table) return { target: null, error: 7008, edge: '', route: '', account: '', next: NONE, edgeType: '3' };
    const hp = parseHost(req.headers.host, defaultPort);
    if (!hp) return { target: null, error: 7007, edge: '', route: '', account: '', next: NONE, edgeType: '3' };
    // An absolute-form target (`GET https://other.example/x`, Host: this.example): an upstream
    // routes by the target's authority (RFC 9112 §3.2.2), so one naming another host could reach
    // that host's upstream past this edge's checks. It must name the Host's host and port, and
    // goes on in origin form.
    const url = req.url;
    if (url !== undefined && url.charCodeAt(0) !== 47 /* / */) {
      if (url === '*') {
        // The asterisk form is for OPTIONS only (RFC 9112 §3.2.4): the server in general, routed as
        // `/` (pathOf) and sent upstream as it is, for the application to answer.
        if (req.method !== 'OPTIONS') return { target: null, error: 7011, detail: `the request target * (asterisk form) is only for OPTIONS, not ${req.method ?? ''}`, edge: '', route: '', account: '', next: NONE, edgeType: '3' };
      } else {
        const problem = toOriginForm(req, url, hp);
        if (problem) return { target: null, error: 7011, detail: problem, edge: '', route: '', account: '', next: NONE, edgeType: '3' };
      }
    }
    if (req.url !== undefined && req.url.charCodeAt(0) === 47 /* / */) {
      const normal = normalizeTarget(req.url);
      if (normal === null) return { target: null, error: 7011, detail: 'the request path holds a backslash (raw or %5C), which upstreams read differently', edge: '', route: '', account: '', next: NONE, edgeType: '3' };
      if (normal !== req.url) req.url = normal;
    }
    const registry = this.opts.registry;
    const ce = table.edgeFor(hp.host, hp.port, defaultPort);
    if (ce) {
      const edge = ce.edge.id;
      const account = ce.edge.accountId;
      // The edge's tls_termination minimum, per request: routing goes by Host, while the
      // handshake checked the SNI's edge (or none, on plain HTTP). One null check for other edges.
      // An HTTPS edge on the plain-HTTP listener: redirected (before the TLS minimum below, which
      // the redirect satisfies) or refused, unless HTTPS_EDGES_ON_HTTP=serve.
      if (onHttp === 'redirect') return { target: null, error: null, location: httpsLocation(hp.host, req.url, this.opts.httpsPort?.() ?? 443), edge, route: '', account, next: NONE, edgeType: '3' };
      const tlsMin = ce.tlsMin;
      if (tlsMin !== null && tlsRank(req.socket) < tlsMin.rank) return { target: null, error: 7113, detail: tlsRefusal(tlsMin, req.socket), edge, route: '', account, next: NONE, edgeType: '3' };
      if (onHttp === 'refuse') {
        const location = httpsLocation(hp.host, req.url, this.opts.httpsPort?.() ?? 443);
        return { target: null, error: 7114, detail: `this edge is served over HTTPS only, not over plain HTTP; retry on a new connection at ${location}`, edge, route: '', account, next: NONE, edgeType: '3' };
      }
      const path = pathOf(req.url);
      const cr = RoutingTable.routeFor(ce, hp.host, path);
      if (!cr) return { target: null, error: 7001, edge, route: '', account, next: NONE, edgeType: '3' };
      const route = cr.route.id;
      const backend = cr.backend;
      if (cr.pipeline) return { target: null, error: null, cr, host: hp.host, path, edge, route, account, next: backend ? (x) => registry.pickForBackend(backend.id, backend.accountId, backend.labels, x) : NONE, edgeType: '3', rawTarget: req.url !== url ? url : undefined };
      if (!backend) return { target: null, error: 7002, edge, route, account, path, next: NONE, edgeType: '3' };
      const next = (exclude: ReadonlySet<string>) => registry.pickForBackend(backend.id, backend.accountId, backend.labels, exclude);
      const target = next(EMPTY_SET);
      return target
        ? { target, error: null, edge, route, account, path, next, edgeType: '3' }
        : { target: null, error: 7003, detail: `no tunnel is online for backend ${backend.id}`, edge, route, account, path, next, edgeType: '3' };
    }
    const target = registry.pickForHost(hp.host, EMPTY_SET);
    if (!target) return { target: null, error: 7000, detail: `no endpoint is configured for ${hp.host}`, edge: '', route: '', account: '', next: NONE, edgeType: '0' };
    // An endpoint with a traffic policy, held here: its policy runs (as a route's pipeline), then
    // that tunnel, and no other, gets the request (another's policy would not have run). One held
    // by another node runs its policy there, on the hop (`serveHop`).
    const ep = target.kind === 'local' ? target.tunnel.trafficPolicy : null;
    if (ep) return { target: null, error: null, cr: ep.cr, host: hp.host, path: pathOf(req.url), edge: 'endpoint', route: '', account: target.tunnel.accountId, next: only(target), edgeType: '0', rawTarget: req.url !== url ? url : undefined };
    // A retry never goes to a tunnel of this node with a policy: that policy would be skipped.
    const next = (exclude: ReadonlySet<string>) => withoutPolicy(registry.pickForHost(hp.host, exclude));
    return { target, error: null, edge: 'endpoint', route: '', account: target.tunnel.accountId, next, edgeType: '0', rawTarget: req.url !== url ? url : undefined };
  }
}

const EMPTY_SET: ReadonlySet<string> = new Set();

/**
 * Adds `x-warren-tp` (the endpoint policy's results, `encodePolicyResult`) to the head of `res`,
 * whichever way it is written (the upstream's response, a stage's answer, an error page), and
 * collects the policy's `log` entries for it.
 */
function sendPolicyResultOnHead(res: http.ServerResponse, state: RequestState): void {
  collectPolicyLogs(state);
  const writeHead = res.writeHead as (...a: unknown[]) => http.ServerResponse;
  const add = (h: unknown): unknown => {
    const v = encodePolicyResult(state);
    if (Array.isArray(h)) return [...(h as string[]), HOP.policyResult, v];
    if (h && typeof h === 'object') return { ...(h as Record<string, unknown>), [HOP.policyResult]: v };
    return [HOP.policyResult, v];
  };
  res.writeHead = function (this: http.ServerResponse, status: number, a?: unknown, b?: unknown) {
    res.writeHead = writeHead as typeof res.writeHead; // once
    return typeof a === 'string' || (a === undefined && b !== undefined) ? writeHead.call(this, status, a, add(b)) : writeHead.call(this, status, add(a));
  } as typeof res.writeHead;
}

const NO_RECORD = (_status: number) => {};

/** A picker that offers `target` once (no retry elsewhere). */
function only(target: TunnelTarget): (exclude: ReadonlySet<string>) => TunnelTarget | null {
  return (exclude) => (exclude.has(target.tunnel.id) ? null : target);
}

/** `t`, unless it is a tunnel of this node whose endpoint has a traffic policy. */
function withoutPolicy(t: TunnelTarget | null): TunnelTarget | null {
  return t !== null && t.kind === 'local' && t.tunnel.trafficPolicy ? null : t;
}

/**
 * Rewrites an absolute-form request target to origin form (path and query, bytes as sent) when
 * its authority is the Host's host and port; else says why it cannot be served.
 */
export function toOriginForm(req: http.IncomingMessage, url: string, hp: { host: string; port: number }): string | null {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return 'the request target is neither a path nor an absolute URL';
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') return `the request target's scheme ${JSON.stringify(u.protocol)} is not http or https`;
  // The host must be the Host's; a port only when the target states one (a scheme's default
  // port need not be the listener's: `https://x/` over the plain listener is still x).
  const target = parseHost(u.host, hp.port);
  if (!target || target.host !== hp.host || (u.port !== '' && target.port !== hp.port)) return 'the request target names another host or port than the Host header';
  // The raw path and query after `scheme://authority` (not u.pathname: that resolves dot segments).
  const afterAuthority = url.indexOf('/', url.indexOf('//') + 2);
  const query = url.indexOf('?', url.indexOf('//') + 2);
  req.url = afterAuthority !== -1 && (query === -1 || afterAuthority < query) ? url.slice(afterAuthority) : `/${query === -1 ? '' : url.slice(query)}`;
  return null;
}

/** The 308 to an HTTPS edge's https URL (same method and body), with a one-line body. */
function sendRedirect(req: http.IncomingMessage, res: http.ServerResponse, location: string): number {
  const body = `Permanent Redirect: this edge is served over HTTPS only: ${location}\n`;
  res.writeHead(308, { location, 'content-type': 'text/plain; charset=utf-8', 'content-length': Buffer.byteLength(body) });
  res.end(req.method === 'HEAD' ? undefined : body);
  return 308;
}

/**
 * Sends a stage's own answer (deny, 429, custom response, …) as it is, or closes the connection
 * without one (close-connection). With its body's Content-Length (for HEAD too, without the body);
 * 204 and 304 get neither (RFC 9110 §8.6, §6.4.1).
 */
export function sendOutcome(req: http.IncomingMessage, res: http.ServerResponse, out: Exclude<Outcome, null>): number {
  if (out === CLOSE_CONNECTION) return closeConnection(req, res);
  res.writeHead(out.status, answerHeaders(out));
  res.end(answerBody(out, req.method));
  return out.status;
}

/**
 * The callback that records a request's status and duration. Made by a call, not written inline
 * as `const record = (…) => …`: tsx's keepNames wraps a named closure in a `__name` defineProperty,
 * once per request on this path; a returned arrow has no name to keep.
 */
function recorder(metrics: IngressMetrics, edge: string, route: string, started: number): (status: number) => void {
  return (status) => metrics.observe(edge, route, status, (performance.now() - started) / 1000);
}
