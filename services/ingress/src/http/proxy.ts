import http from 'node:http';
import net from 'node:net';
import { Readable, type Duplex } from 'node:stream';
import { Pool, type Dispatcher } from 'undici';
import type { DpTunnel, Logger } from '@warren/shared';
import { ERRORS, type ErrorCode } from '@warren/shared';
import type { LocalTunnel, ProxyHeaderInit, TunnelStream } from '../agents/server.js';
import type { TunnelRegistry, TunnelTarget } from '../tunnels/registry.js';
import { sendError, sendUpgradeError } from './error-page.js';
import { isOutcome, type RoutePipeline } from '../pipeline/runner.js';
import { decidesLength, type RequestState } from '../pipeline/types.js';
import { answerBody, answerHeaders, type Answer } from './answer.js';
import { CLOSE_CONNECTION } from '../policy/flow-actions.js';
import { DispatchTurn } from './pipelining.js';
import { FORWARD_DEPTH_HEADER } from '../policy/forward-internal.js';
import { TunnelClient, type TunnelHandler } from './tunnel-client.js';

/** A route's pipeline and the request's state, for the response stages and the result. */
export interface ForwardHooks {
  pipeline: RoutePipeline;
  state: RequestState;
}

/** What the public side of a request looked like, carried to the agent and across a hop. */
export interface RequestInfo {
  scheme: 'http' | 'https';
  /** `ip:port` of the public client. */
  clientAddr: string;
  /** `'3'` for an HTTPS edge's labeled tunnel, `'0'` for a Bind endpoint (agent-protocol.md §3). */
  edgeType: '0' | '3';
  /**
   * Bind endpoints: the public connection's facts (`hop-conn.ts` `encodeHopConn`), sent along when
   * the request hops (the endpoint's policy runs on the holding node); computed only then.
   */
  conn?: () => string;
  /**
   * Bind endpoints whose request's traffic event is wanted: over a hop, the holding node runs the
   * endpoint's policy and sends its results (rate limit, `log` entries) back in `x-warren-tp`,
   * handed to this (see `events/tracking.ts` `hopPolicyResult`).
   */
  onHopPolicy?: (value: string) => void;
  /**
   * A request pipelined behind one still in its route's stages (`pipelining.ts` DispatchTurn):
   * told once its head went to the upstream connection (or never will), so that the next request
   * of the client's connection goes after it. Absent (the usual case): nothing is told.
   */
  written?: () => void;
  /** forward-internal: the forwards the request has had, this one included (sent on a hop, so a loop ends). */
  forwardDepth?: number;
}

/** Headers a proxy must not pass on (RFC 9110 §7.6.1), plus `expect` (Node has answered it). */
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authenticate', 'proxy-authorization', 'te', 'trailer', 'transfer-encoding', 'upgrade', 'expect']);
/** Headers nodes use among themselves; never accepted from the public side. */
const HOP_PREFIX = 'x-warren-';
export const HOP = {
  tunnel: 'x-warren-tunnel',
  token: 'x-warren-node-token',
  clientAddr: 'x-warren-client-addr',
  scheme: 'x-warren-scheme',
  edgeType: 'x-warren-edge-type',
  miss: 'x-warren-hop-miss',
  /**
   * On a hop's answer: the holding node's own error, not the upstream's response: `<code>` or
   * `<code>; retryable` (the request never reached the tunnel) or `<code>; idempotent` (it may have:
   * see {@link ForwardError}.retry), with the message, URI-encoded, in
   * `error-message`. The sending node answers it as its own error (see TunnelExchange.onHeaders).
   */
  error: 'x-warren-hop-error',
  errorMessage: 'x-warren-hop-error-message',
  /** On a hop upgrade: open a raw stream to the tunnel (no HTTP request head is sent on). */
  raw: 'x-warren-raw',
  /** The public connection's facts, for a Bind endpoint's policy on the holding node (`hop-conn.ts`). */
  conn: 'x-warren-conn',
  /** On a hop request: the sending node records the request's traffic event and wants the endpoint policy's results. */
  policyWanted: 'x-warren-tp-want',
  /** On a hop's answer: those results (`tracking.ts` `encodePolicyResult`). */
  policyResult: 'x-warren-tp',
  /**
   * On a hop's answer: the endpoint's policy closed the connection (close-connection) on the
   * holding node; the sending node closes its client's connection without an answer. (Destroying
   * the hop's own connection instead read there as an unreachable node: a 502.)
   */
  close: 'x-warren-hop-close',
  proto: 'x-warren-proto',
} as const;

/** The holding node's answer to a hop request or upgrade whose endpoint policy closed the connection ({@link HOP}.close). */
export const HOP_CLOSE_HEAD = `HTTP/1.1 204 No Content\r\n${HOP.close}: 1\r\nconnection: close\r\n\r\n`;

export function ipOf(addr: string): string {
  if (addr.startsWith('[')) return addr.slice(1, addr.indexOf(']'));
  const colon = addr.lastIndexOf(':');
  return colon > 0 && addr.indexOf(':') === colon ? addr.slice(0, colon) : addr;
}

function connectionTokens(raw: string[]): Set<string> | null {
  let out: Set<string> | null = null;
  for (let i = 0; i < raw.length; i += 2) {
    if (raw[i]!.length === 10 && raw[i]!.toLowerCase() === 'connection') {
      for (const t of raw[i + 1]!.split(',')) {
        const v = t.trim().toLowerCase();
        if (v) (out ??= new Set()).add(v);
      }
    }
  }
  return out;
}

/**
 * The request headers sent on to the agent, in the client's order and case: hop-by-hop headers
 * and any `x-warren-*` dropped; X-Forwarded-For appended to, X-Forwarded-Proto and -Host set. An
 * upgrade keeps its `Connection: upgrade` and `Upgrade`.
 */
export function publicRequestHeaders(raw: string[], clientIp: string, scheme: string, upgrade: boolean): string[] {
  const listed = connectionTokens(raw);
  const out: string[] = [];
  let xff: string | null = null;
  let host = '';
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    const lower = name.toLowerCase();
    if (lower === 'x-forwarded-for') {
      xff = xff === null ? raw[i + 1]! : `${xff}, ${raw[i + 1]!}`;
      continue;
    }
    if (lower === 'x-forwarded-proto' || lower === 'x-forwarded-host' || lower.startsWith(HOP_PREFIX)) continue;
    if (lower === 'host') host = raw[i + 1]!;
    // A client may name its own extra hop-by-hop headers in Connection, but not Host or
    // Content-Length: stripping Host would show the upstream another host than the one routed
    // (`Connection: close, Host`), stripping Content-Length would unframe the body.
    if (HOP_BY_HOP.has(lower) || (listed?.has(lower) && lower !== 'host' && lower !== 'content-length')) continue;
    out.push(name, raw[i + 1]!);
  }
  out.push('X-Forwarded-For', xff === null ? clientIp : `${xff}, ${clientIp}`, 'X-Forwarded-Proto', scheme, 'X-Forwarded-Host', host);
  if (upgrade) out.push('Connection', 'Upgrade', 'Upgrade', upgradeOf(raw));
  return out;
}

function upgradeOf(raw: string[]): string {
  for (let i = 0; i < raw.length; i += 2) if (raw[i]!.toLowerCase() === 'upgrade') return raw[i + 1]!;
  return 'websocket';
}

/** Headers of a request that came over a hop: already prepared by the sending node. */
export function hopRequestHeaders(raw: string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < raw.length; i += 2) {
    if (raw[i]!.toLowerCase().startsWith(HOP_PREFIX)) continue;
    out.push(raw[i]!, raw[i + 1]!);
  }
  return out;
}

function responseHeaders(raw: string[]): string[] {
  const listed = connectionTokens(raw);
  const out: string[] = [];
  for (let i = 0; i < raw.length; i += 2) {
    const lower = raw[i]!.toLowerCase();
    if (HOP_BY_HOP.has(lower) || listed?.has(lower) || lower.startsWith(HOP_PREFIX)) continue;
    out.push(raw[i]!, raw[i + 1]!);
  }
  return out;
}

/** {@link responseHeaders} of undici's raw header buffers (latin1, as Node's own parser decodes them). */
function responseHeadersFrom(raw: Buffer[]): string[] {
  const strs = new Array<string>(raw.length);
  for (let i = 0; i < raw.length; i++) strs[i] = raw[i]!.toString('latin1');
  return responseHeaders(strs);
}

function requestHead(method: string, url: string, headers: string[]): string {
  let head = `${method} ${url} HTTP/1.1\r\n`;
  for (let i = 0; i < headers.length; i += 2) head += `${headers[i]}: ${headers[i + 1]}\r\n`;
  return `${head}\r\n`;
}

/** May a failed attempt be retried on another tunnel? Only when no body byte can have been used. */
function replayable(req: http.IncomingMessage): boolean {
  if (req.method !== 'GET' && req.method !== 'HEAD' && req.method !== 'OPTIONS' && req.method !== 'DELETE') return false;
  const cl = req.headers['content-length'];
  return (cl === undefined || cl === '0') && req.headers['transfer-encoding'] === undefined;
}

/**
 * May a failed attempt go to another tunnel? `untouched`: nothing of the request was read or sent
 * (its tunnel went away before it was dispatched), so any request may, a streamed body too.
 * `any`: the request never reached the target (no stream, a full queue, a node that refused the
 * connection), so any request whose body can be sent again may. `idempotent`: it may have reached
 * the upstream (a kept-alive connection closed under it before an answer), so only a request safe
 * to repeat (RFC 9110 §9.2.2: GET, HEAD, OPTIONS, DELETE, without a body) may; a POST the pipeline
 * buffered is not sent twice.
 */
type Retry = 'untouched' | 'any' | 'idempotent' | 'no';

function mayRetry(retry: Retry, req: http.IncomingMessage, hooks: ForwardHooks | undefined): boolean {
  switch (retry) {
    case 'untouched':
      return true;
    case 'any':
      return replayable(req) || hooks?.state.body !== undefined;
    case 'idempotent':
      return replayable(req);
    default:
      return false;
  }
}

/** The error a released tunnel's pool is destroyed with at its drain deadline (see {@link Forwarder.release}). */
const RELEASED = 'WARREN_TUNNEL_RELEASED';

class ForwardError extends Error {
  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly retry: Retry = 'no',
  ) {
    super(message);
  }

}

export interface ForwarderOptions {
  registry: TunnelRegistry;
  /** Shared secret nodes put on hop requests; '' = none (loopback-only clusters). */
  hopToken: string;
  log: Logger;
  /** How long to wait for the response head from the agent (ms). */
  upstreamTimeoutMs: number;
  /** Concurrent proxy streams per tunnel kept by its HTTP connection pool (below the session cap). */
  maxStreamsPerTunnel: number;
  /** Requests allowed to wait for a free stream per tunnel before 503. */
  maxQueuedPerTunnel: number;
  /** Keep-alive connections kept to each other node (hops); default {@link HOP_CONNECTIONS}. */
  hopConnections?: number;
  /** How long a hop may wait for a free connection to its node before 503 (ms); default {@link HOP_QUEUE_WAIT_MS}. */
  hopQueueWaitMs?: number;
  /**
   * How long the requests a tunnel was carrying when it went away (Unbind, StopTunnel) may take to
   * finish before their streams are cut (ms); default {@link RELEASE_DRAIN_MS}.
   */
  releaseDrainMs?: number;
}

/** Default of {@link ForwarderOptions.releaseDrainMs}: as long as the node's own drain on SIGTERM. */
export const RELEASE_DRAIN_MS = 10_000;

/** Header of a stream opened for a request that names no client (none on the local path today). */
const DEFAULT_STREAM_HEADER: ProxyHeaderInit = { clientAddr: '0.0.0.0:0', proto: 'http', edgeType: '3' };

interface TunnelPool {
  /**
   * A tunnel's: the lean client of its proxy streams (a new stream carries the client address
   * of the request it is opened for, which counts against that client's share of the session's
   * slots, MAX_STREAMS_PER_CLIENT). A hop's: undici's Pool of TCP connections to the node.
   */
  pool: Pool | TunnelClient<RequestInfo | null>;
  /** Requests dispatched and not yet answered (running or queued in the pool). */
  inFlight: number;
  /** A hop pool's requests in flight per account of the tunnel they go to ({@link HOP_PER_ACCOUNT}). */
  byAccount?: Map<string, number>;
  /** A hop pool's connections: requests in flight past these wait in its queue. */
  connections?: number;
}

/**
 * Carries HTTP requests and upgrades to tunnels: on this node through a pooled, keep-alive HTTP/1.1
 * client ({@link TunnelClient}) whose connections are the agent's proxy streams (one stream per
 * upstream connection, reused across requests like any keep-alive connection), or to the node that
 * holds the tunnel over a keep-alive hop connection (undici).
 */
export class Forwarder {
  private readonly pools = new Map<string, TunnelPool>();
  /** Keep-alive pools to the other nodes' internal listeners, by `host:port`. */
  private readonly hopPools = new Map<string, TunnelPool>();

  private readonly hopConnections: number;
  private readonly hopPerAccount: number;
  private readonly hopQueueWaitMs: number;
  /** Pools of tunnels that went away, finishing the requests they carry: pool → its deadline. */
  private readonly draining = new Map<TunnelPool['pool'], NodeJS.Timeout>();

  constructor(private readonly opts: ForwarderOptions) {
    this.hopConnections = opts.hopConnections ?? HOP_CONNECTIONS;
    this.hopPerAccount = hopShare(this.hopConnections);
    this.hopQueueWaitMs = opts.hopQueueWaitMs ?? HOP_QUEUE_WAIT_MS;
  }

  /**
   * Drops the connection pool of a tunnel that went away (its agent unbound it, or the server
   * stopped it). The tunnel is already out of routing, so no new request comes here; the requests
   * it was carrying finish (an agent that unbinds before it hangs up lets them: a graceful agent
   * shutdown loses nothing), its idle streams are closed, and whatever still runs after
   * `releaseDrainMs` is cut. A session that ended took its streams with it: those requests have
   * failed already.
   */
  release(tunnelId: string): void {
    const p = this.pools.get(tunnelId);
    if (!p) return;
    this.pools.delete(tunnelId);
    const pool = p.pool;
    const drainMs = this.opts.releaseDrainMs ?? RELEASE_DRAIN_MS;
    const deadline = setTimeout(() => {
      this.draining.delete(pool);
      if (p.inFlight > 0) this.opts.log.warn({ tunnel: tunnelId, requests: p.inFlight, drainMs }, 'requests still running after their tunnel went away: cut (DRAIN_TIMEOUT_MS)');
      // Its own error: a request cut here may have reached the upstream (not undici's "destroyed",
      // which a queued request also meets).
      pool.destroy(Object.assign(new Error(`the tunnel went away and the request was still running ${drainMs} ms later (DRAIN_TIMEOUT_MS)`), { code: RELEASED })).catch(() => {});
    }, drainMs);
    deadline.unref();
    this.draining.set(pool, deadline);
    pool.close().then(
      () => {
        clearTimeout(deadline);
        this.draining.delete(pool);
      },
      () => {},
    );
  }

  /** The node is stopping (its own drain is over): every pool is destroyed at once, draining ones too. */
  close(): void {
    for (const p of this.pools.values()) p.pool.destroy().catch(() => {});
    this.pools.clear();
    for (const [pool, deadline] of this.draining) {
      clearTimeout(deadline);
      pool.destroy().catch(() => {});
    }
    this.draining.clear();
    for (const p of this.hopPools.values()) p.pool.destroy().catch(() => {});
    this.hopPools.clear();
  }

  /** What a tunnel's pool and a hop's pool share. */
  private poolOptions(): Pool.Options {
    return {
      pipelining: 1,
      // The upstream's answer must start within the timeout; a body may stream for as long as it likes.
      headersTimeout: this.opts.upstreamTimeoutMs,
      bodyTimeout: 0,
      keepAliveTimeout: 60_000,
      keepAliveMaxTimeout: 600_000,
    };
  }

  /** The keep-alive pool to another node's internal listener (`host:port`, IPv6 in brackets). */
  private hopPoolFor(nodeAddress: string): TunnelPool {
    let p = this.hopPools.get(nodeAddress);
    if (!p) {
      const pool = new Pool(`http://${nodeAddress}`, { ...this.poolOptions(), connections: this.hopConnections, maxHeaderSize: HOP_MAX_HEADER_BYTES });
      p = { pool, inFlight: 0, byAccount: new Map(), connections: this.hopConnections };
      this.hopPools.set(nodeAddress, p);
    }
    return p;
  }

  private poolFor(tunnel: LocalTunnel): TunnelPool {
    let p = this.pools.get(tunnel.id);
    if (!p) {
      const o = this.poolOptions();
      const pool = new TunnelClient<RequestInfo | null>({
        connections: this.opts.maxStreamsPerTunnel,
        headersTimeout: o.headersTimeout!,
        keepAliveTimeout: o.keepAliveTimeout!,
        keepAliveMaxTimeout: o.keepAliveMaxTimeout!,
        // Each connection is a proxy stream opened on the agent's session for the request that
        // needs it, so that it carries that request's client address.
        connect: (info): TunnelStream => {
          try {
            if (!tunnel.openStreamSync) throw new Error('the tunnel cannot open streams synchronously');
            return tunnel.openStreamSync(info ? { clientAddr: info.clientAddr, proto: info.scheme, edgeType: info.edgeType } : DEFAULT_STREAM_HEADER);
          } catch (err) {
            // No stream: nothing of the request was sent, so it may go to another tunnel whatever it is.
            const fe = forwardErrorOf(err as Error, false, this.opts.log);
            throw new ForwardError(fe.code, fe.message, 'any');
          }
        },
      });
      p = { pool, inFlight: 0 };
      this.pools.set(tunnel.id, p);
    }
    return p;
  }

  /**
   * Forwards `req` to `first` (and, for a replayable request whose target could not be reached at
   * all, to other tunnels from `next`). Resolves with the status sent to the client.
   */
  async forward(
    req: http.IncomingMessage,
    res: http.ServerResponse,
    first: TunnelTarget,
    info: RequestInfo,
    headers: string[],
    next: (exclude: ReadonlySet<string>) => TunnelTarget | null,
    hooks?: ForwardHooks,
  ): Promise<number> {
    let target: TunnelTarget | null = first;
    let tried: Set<string> | null = null;
    for (let attempt = 0; target; attempt++) {
      try {
        return await (target.kind === 'local' ? this.viaLocal(req, res, target.tunnel, info, headers, hooks) : this.viaHop(req, res, target.tunnel, info, headers, hooks));
      } catch (err) {
        if (res.destroyed) return 499; // the client went away
        const fe = err instanceof ForwardError ? err : new ForwardError(7004, (err as Error).message);
        const failed = target.tunnel.id;
        // A body the pipeline buffered can be sent again; a streamed one cannot.
        if (attempt < 3 && mayRetry(fe.retry, req, hooks)) {
          (tried ??= new Set()).add(failed);
          target = next(tried);
          if (target) continue;
        }
        this.opts.log.debug({ err: fe.message, tunnel: failed }, 'forward failed');
        hooks?.pipeline.onResult(hooks.state, 'error');
        sendError(req, res, fe.code, fe.message);
        return res.statusCode;
      }
    }
    sendError(req, res, 7003);
    return 503;
  }

  /** Serves a request that arrived over a hop for a tunnel of this node. */
  async forwardHop(req: http.IncomingMessage, res: http.ServerResponse): Promise<number> {
    const id = String(req.headers[HOP.tunnel] ?? '');
    const tunnel = this.opts.registry.getLocal(id);
    if (!tunnel) {
      sendError(req, res, 7003, `tunnel ${id} is not on this node`, { [HOP.miss]: '1' });
      return 503;
    }
    const info: RequestInfo = {
      scheme: req.headers[HOP.scheme] === 'https' ? 'https' : 'http',
      clientAddr: String(req.headers[HOP.clientAddr] ?? '0.0.0.0:0'),
      edgeType: req.headers[HOP.edgeType] === '0' ? '0' : '3',
    };
    try {
      return await this.viaLocal(req, res, tunnel, info, hopRequestHeaders(req.rawHeaders));
    } catch (err) {
      const fe = err instanceof ForwardError ? err : new ForwardError(7004, (err as Error).message);
      // Marked as this node's own error, with its code, so the sender answers it as a local error
      // would be (no response stages; a retryable one may go to another tunnel) rather than as
      // the upstream's response, or as a miss ("the tunnel has moved or gone").
      sendError(req, res, fe.code, fe.message, { [HOP.error]: fe.retry === 'any' || fe.retry === 'untouched' ? `${fe.code}; retryable` : fe.retry === 'idempotent' ? `${fe.code}; idempotent` : String(fe.code), [HOP.errorMessage]: encodeURIComponent(fe.message.slice(0, 256)) });
      return res.statusCode;
    }
  }

  private viaLocal(req: http.IncomingMessage, res: http.ServerResponse, tunnel: LocalTunnel, info: RequestInfo, headers: string[], hooks?: ForwardHooks): Promise<number> {
    if (tunnel.closed) {
      // Routed before its tunnel went away (while the pipeline ran). Checked here so that no pool
      // is made again for a tunnel already released. Resumed by its agent's reconnect (the same
      // id, a new session): it goes there; else nothing was read or sent, so anywhere.
      const resumed = this.opts.registry.getLocal(tunnel.id);
      if (!resumed || resumed === tunnel || resumed.closed) return Promise.reject(new ForwardError(7003, `tunnel ${tunnel.id} went away`, 'untouched'));
      tunnel = resumed;
    }
    const p = this.poolFor(tunnel);
    if (p.inFlight >= this.opts.maxStreamsPerTunnel + this.opts.maxQueuedPerTunnel) {
      return Promise.reject(new ForwardError(7006, `more than ${this.opts.maxQueuedPerTunnel} requests are waiting for tunnel ${tunnel.id}`, 'any'));
    }
    if (req.url === '*' && hooks?.state.target === undefined) return this.asterisk(p, req, res, headers, hooks, info, { tunnel });
    return this.dispatch(p, req, res, headers, hooks, info, false, undefined, info.written);
  }

  private viaHop(req: http.IncomingMessage, res: http.ServerResponse, tunnel: DpTunnel, info: RequestInfo, headers: string[], hooks?: ForwardHooks): Promise<number> {
    const { id: tunnelId, nodeAddress, accountId } = tunnel;
    const hopHeaders = headers.concat(HOP.tunnel, tunnelId, HOP.clientAddr, info.clientAddr, HOP.scheme, info.scheme, HOP.edgeType, info.edgeType);
    if (info.conn) hopHeaders.push(HOP.conn, info.conn());
    if (info.forwardDepth !== undefined) hopHeaders.push(FORWARD_DEPTH_HEADER, String(info.forwardDepth));
    if (info.onHopPolicy) hopHeaders.push(HOP.policyWanted, '1');
    if (this.opts.hopToken) hopHeaders.push(HOP.token, this.opts.hopToken);
    let p: TunnelPool;
    try {
      p = this.hopPoolFor(nodeAddress);
    } catch (err) {
      return Promise.reject(new ForwardError(7004, `the ingress node holding the tunnel has an unusable address ${nodeAddress}: ${(err as Error).message}`, 'any'));
    }
    // One account's requests may hold only a share of the connections to a node: the rest stay
    // free for the others (an account's long-lived answers, or requests queued at the holding
    // node, held them all and every other account's hops to that node waited without end).
    const byAccount = p.byAccount!;
    const held = byAccount.get(accountId) ?? 0;
    if (held >= this.hopPerAccount) return Promise.reject(new ForwardError(7006, `more than ${this.hopPerAccount} requests of this account are on their way to the ingress node holding tunnel ${tunnelId}`, 'any'));
    byAccount.set(accountId, held + 1);
    const done = req.url === '*' && hooks?.state.target === undefined ? this.asterisk(p, req, res, hopHeaders, hooks, info, { node: nodeAddress }) : this.dispatch(p, req, res, hopHeaders, hooks, null, true, info.onHopPolicy, info.written);
    const release = () => {
      const n = (byAccount.get(accountId) ?? 1) - 1;
      if (n > 0) byAccount.set(accountId, n);
      else byAccount.delete(accountId);
    };
    done.then(release, release);
    return done;
  }

  /**
   * `OPTIONS *` (the asterisk form, RFC 9112 §3.2.4), which undici will not send (its request
   * target must start with `/`): written by Node's HTTP client on a connection of its own, a new
   * proxy stream of `to.tunnel` or a new connection to the node holding the tunnel (`to.node`),
   * closed after the answer. The answer goes to a TunnelExchange as any other does (hop markers,
   * response stages, an error while nothing was sent). Rare: neither pooled nor kept alive.
   */
  private asterisk(p: TunnelPool, req: http.IncomingMessage, res: http.ServerResponse, headers: string[], hooks: ForwardHooks | undefined, info: RequestInfo, to: { tunnel: LocalTunnel } | { node: string }): Promise<number> {
    return new Promise<number>((resolve, reject) => {
      const hop = 'node' in to;
      // Its head is written a tick later (Node's client): a request pipelined behind it waits for that.
      const turn = new DispatchTurn(req.socket);
      const written = info.written;
      const x = new TunnelExchange(req, res, p, hooks, this.opts.log, resolve, reject, hop, hop ? info.onHopPolicy : undefined, () => {
        turn.done();
        written?.();
      });
      p.inFlight++;
      const body = hooks?.state.body ?? (hasBody(req) ? req : null);
      const options: http.RequestOptions = { method: 'OPTIONS', path: '*', headers: asteriskHeaders(headers, body), setHost: false };
      let stream: Duplex | null = null;
      if ('node' in to) {
        const colon = to.node.lastIndexOf(':');
        options.host = to.node.slice(0, colon).replace(/^\[|\]$/g, '');
        options.port = Number(to.node.slice(colon + 1));
        options.agent = false;
        options.maxHeaderSize = HOP_MAX_HEADER_BYTES;
      } else {
        try {
          if (!to.tunnel.openStreamSync) throw new Error('the tunnel cannot open streams synchronously');
          stream = to.tunnel.openStreamSync({ clientAddr: info.clientAddr, proto: info.scheme, edgeType: info.edgeType });
        } catch (err) {
          // No stream: nothing was sent, so it may go to another tunnel (as from the pool's connector).
          const fe = forwardErrorOf(err as Error, false, this.opts.log);
          x.onError(new ForwardError(fe.code, fe.message, 'any'));
          return;
        }
        const s = stream;
        options.createConnection = () => s as net.Socket;
      }
      let out: http.ClientRequest;
      try {
        out = http.request(options);
      } catch (err) {
        // A header Node's client will not write (as undici's refusal of one: 400).
        stream?.destroy();
        x.onError(new ForwardError(7011, (err as Error).message));
        return;
      }
      const timer = setTimeout(() => out.destroy(Object.assign(new Error('no response head within the upstream timeout'), { code: 'UND_ERR_HEADERS_TIMEOUT' })), this.opts.upstreamTimeoutMs);
      out.on('error', (err) => {
        clearTimeout(timer);
        x.onError(err);
      });
      out.on('response', (up: http.IncomingMessage) => {
        clearTimeout(timer);
        const raw = new Array<Buffer>(up.rawHeaders.length);
        for (let i = 0; i < raw.length; i++) raw[i] = Buffer.from(up.rawHeaders[i]!, 'latin1');
        x.onHeaders(up.statusCode ?? 502, raw, () => up.resume(), up.statusMessage ?? '');
        up.on('data', (c: Buffer) => {
          if (!x.onData(c)) up.pause();
        });
        up.on('end', () => x.onComplete());
        up.on('error', (err) => x.onError(err));
        up.on('close', () => {
          if (!up.complete) x.onError(Object.assign(new Error('the upstream response broke off'), { code: 'UND_ERR_SOCKET' }));
        });
      });
      // Told once the socket is there: the head is written right after 'socket' (see TunnelExchange.onConnect).
      out.once('socket', () =>
        x.onConnect((err) => {
          clearTimeout(timer);
          out.destroy(err ?? new Error('aborted'));
        }),
      );
      if (body === null) out.end();
      else if (Buffer.isBuffer(body)) out.end(body);
      else {
        out.flushHeaders(); // the head goes with the socket, not with the body's first chunk
        body.pipe(out);
      }
    });
  }

  /**
   * One request through `p` (a tunnel's pool, or a hop's): resolves with the status sent, rejects
   * with a ForwardError while nothing was sent (see TunnelExchange). `info` names the client for a
   * proxy stream the pool may open meanwhile.
   */
  private dispatch(p: TunnelPool, req: http.IncomingMessage, res: http.ServerResponse, headers: string[], hooks: ForwardHooks | undefined, info: RequestInfo | null, hop: boolean, onHopPolicy?: (value: string) => void, written?: () => void): Promise<number> {
    return new Promise<number>((resolve, reject) => {
      const x = new TunnelExchange(req, res, p, hooks, this.opts.log, resolve, reject, hop, onHopPolicy, written);
      const body = hooks?.state.body ?? (hasBody(req) ? req : null);
      p.inFlight++;
      // A traffic-policy url-rewrite's target, else the client's.
      const path = hooks?.state.target ?? req.url ?? '/';
      const pool = p.pool;
      if (pool instanceof TunnelClient) {
        x.cancelQueued = pool.dispatch({ path, method: req.method ?? 'GET', headers, body }, x, info);
        return;
      }
      try {
        pool.dispatch({ path, method: req.method ?? 'GET', headers, body }, x);
        // Every connection to the node is busy: it waits in the pool's queue, but not for ever.
        if (p.connections !== undefined && p.inFlight > p.connections) x.expireQueued(this.hopQueueWaitMs);
      } catch (err) {
        // undici refused the request itself (a request target it cannot send, …).
        x.onError(err as Error);
      }
    });
  }

  /**
   * Carries an upgrade request (WebSocket) to the target as raw bytes, then pipes both ways.
   * `path`: the request target to send (a traffic-policy url-rewrite's), else the client's.
   */
  async upgrade(req: http.IncomingMessage, socket: Duplex, head: Buffer, target: TunnelTarget, info: RequestInfo, headers: string[], path?: string): Promise<void> {
    let upstream: Duplex;
    const requestTarget = path ?? req.url ?? '/';
    try {
      if (target.kind === 'local') {
        upstream = await target.tunnel.openStream({ clientAddr: info.clientAddr, proto: info.scheme, edgeType: info.edgeType });
        // latin1: header values are bytes as Node's parser decoded them (obs-text 0x80-0xff included).
        upstream.write(requestHead(req.method ?? 'GET', requestTarget, headers), 'latin1');
      } else {
        const addr = target.tunnel.nodeAddress;
        const colon = addr.lastIndexOf(':');
        const hopHeaders = headers.concat(HOP.tunnel, target.tunnel.id, HOP.clientAddr, info.clientAddr, HOP.scheme, info.scheme, HOP.edgeType, info.edgeType);
        if (info.conn) hopHeaders.push(HOP.conn, info.conn());
        if (info.forwardDepth !== undefined) hopHeaders.push(FORWARD_DEPTH_HEADER, String(info.forwardDepth));
        if (this.opts.hopToken) hopHeaders.push(HOP.token, this.opts.hopToken);
        upstream = await new Promise<net.Socket>((resolve, reject) => {
          const s = net.connect({ host: addr.slice(0, colon).replace(/^\[|\]$/g, ''), port: Number(addr.slice(colon + 1)) }, () => resolve(s));
          s.once('error', reject);
        });
        upstream.write(requestHead(req.method ?? 'GET', requestTarget, hopHeaders), 'latin1');
      }
    } catch (err) {
      const code = (err as { code?: string }).code;
      sendUpgradeError(socket, code === 'STREAM_CAP' ? 7006 : code === 'CLIENT_STREAM_CAP' ? 7014 : 7004, (err as Error).message);
      return;
    }
    // The two sides are joined only once the upstream has switched protocols. An upstream that
    // answers the Upgrade as an ordinary request (any app without a WebSocket handler) keeps its
    // connection open for more requests: splicing then would let the client send requests
    // straight to it, past every route's checks. Until then the client's bytes stay unread.
    // A client that goes away meanwhile takes the upstream down with it (splice is not there yet).
    const clientGone = () => upstream.destroy();
    socket.once('close', clientGone);
    if (socket.destroyed) upstream.destroy();
    const answer = await readUpgradeAnswer(upstream, this.opts.upstreamTimeoutMs);
    socket.off('close', clientGone);
    if (socket.destroyed) {
      upstream.destroy();
      return;
    }
    if (answer === null) {
      upstream.destroy();
      sendUpgradeError(socket, 7004, 'the upstream did not answer the upgrade');
      return;
    }
    if (answer.status !== 101 && target.kind !== 'local' && HOP_CLOSE_RE.test(answer.head.toString('latin1'))) {
      // The endpoint's close-connection on the holding node: the client's connection closes too.
      upstream.destroy();
      socket.destroy();
      return;
    }
    if (answer.status !== 101) {
      upstream.destroy();
      // Its answer goes to the client (a refused WebSocket handshake: 401, 403, 404, …), closed.
      socket.end(Buffer.concat([refusalHead(answer.head, answer.body.length), answer.body]));
      return;
    }
    socket.write(answer.head);
    if (answer.body.length > 0) socket.write(answer.body);
    splice(socket, upstream, head);
  }

  /**
   * A raw byte stream to a tunnel (TCP semantics; the websocket_tcp_converter): a proxy stream on
   * this node, or a hop upgrade that the holding node answers with 101 and then splices raw.
   */
  async rawStream(target: TunnelTarget, info: RequestInfo & { proto: 'tcp' | 'http' | 'https' }): Promise<Duplex> {
    if (target.kind === 'local') return target.tunnel.openStream({ clientAddr: info.clientAddr, proto: info.proto, edgeType: info.edgeType });
    const addr = target.tunnel.nodeAddress;
    const colon = addr.lastIndexOf(':');
    const headers = ['Host', addr, 'Connection', 'Upgrade', 'Upgrade', 'warren-raw', HOP.tunnel, target.tunnel.id, HOP.raw, '1', HOP.proto, info.proto, HOP.clientAddr, info.clientAddr, HOP.scheme, info.scheme, HOP.edgeType, info.edgeType];
    if (this.opts.hopToken) headers.push(HOP.token, this.opts.hopToken);
    const sock = await new Promise<net.Socket>((resolve, reject) => {
      const s = net.connect({ host: addr.slice(0, colon).replace(/^\[|\]$/g, ''), port: Number(addr.slice(colon + 1)) }, () => resolve(s));
      s.once('error', reject);
    });
    sock.write(requestHead('GET', '/', headers), 'latin1');
    // The hop's answer head; anything after it is already tunnel bytes, put back for the splice's pipe.
    const answer = await readUpgradeAnswer(sock, this.opts.upstreamTimeoutMs);
    if (answer === null || answer.status !== 101) {
      sock.destroy();
      const line = answer ? answer.head.subarray(0, answer.head.indexOf('\r\n')).toString('latin1') : 'no answer';
      throw Object.assign(new Error(`the node holding the tunnel refused: ${line}`), { code: 'SESSION_CLOSED' });
    }
    if (answer.body.length > 0) sock.unshift(answer.body);
    return sock;
  }

  /** Serves an upgrade that arrived over a hop. */
  async upgradeHop(req: http.IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    const tunnel = this.opts.registry.getLocal(String(req.headers[HOP.tunnel] ?? ''));
    if (!tunnel) {
      sendUpgradeError(socket, 7003, 'the tunnel is not on this node');
      return;
    }
    const info: RequestInfo = {
      scheme: req.headers[HOP.scheme] === 'https' ? 'https' : 'http',
      clientAddr: String(req.headers[HOP.clientAddr] ?? '0.0.0.0:0'),
      edgeType: req.headers[HOP.edgeType] === '0' ? '0' : '3',
    };
    if (req.headers[HOP.raw] === '1') {
      const proto = req.headers[HOP.proto] === 'tcp' ? 'tcp' : info.scheme;
      let upstream: Duplex;
      try {
        upstream = await tunnel.openStream({ clientAddr: info.clientAddr, proto, edgeType: info.edgeType });
      } catch (err) {
        sendUpgradeError(socket, 7004, (err as Error).message);
        return;
      }
      socket.write('HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: warren-raw\r\n\r\n');
      splice(socket, upstream, head);
      return;
    }
    await this.upgrade(req, socket, head, { kind: 'local', tunnel }, info, hopRequestHeaders(req.rawHeaders));
  }
}

/** {@link HOP}.close in an answer head. */
const HOP_CLOSE_RE = new RegExp(`\r\n${HOP.close}:`, 'i');

/** Keep-alive connections kept to each other node (hops). */
const HOP_CONNECTIONS = 1024;

/**
 * Longest wait of a hop for a free connection to its node, once all {@link HOP_CONNECTIONS} are
 * busy (several accounts each at {@link HOP_PER_ACCOUNT}): past it, 503 `ERR_WARREN_7006` (another
 * tunnel tried first), not a request held until its client gives up.
 */
export const HOP_QUEUE_WAIT_MS = 10_000;

/**
 * Requests of one account (the account of the tunnel they go to) in flight to one other node at
 * once: a quarter of the connections, so one tenant's long-lived answers cannot hold every hop
 * connection (an audit held all 512 with 525 never-ending responses; every other account's
 * requests through that node then hung). Past it: 503 `ERR_WARREN_7006`, another tunnel tried.
 */
export const HOP_PER_ACCOUNT = hopShare(HOP_CONNECTIONS);

/** The hop requests one account may have in flight to a node with `connections` hop connections: a quarter. */
function hopShare(connections: number): number {
  return Math.max(1, Math.floor(connections / 4));
}

/**
 * Longest head read from another node (hops, both ways: this pool's answers and the internal
 * listener's requests). The holding node's answer is the upstream's
 * head (up to the 16 KiB a tunnel's pool reads) plus what it adds: policy headers and `x-warren-tp`
 * (up to 8 KiB). With the default 16 KiB, an answer the holding node served whole failed here
 * (502, UND_ERR_HEADERS_OVERFLOW) after the upstream had run the request.
 */
export const HOP_MAX_HEADER_BYTES = 64 * 1024;

/**
 * What a hop's answer says of itself: a miss (the tunnel is not on that node), the holding node's
 * own error (see {@link HOP}.error) as the ForwardError a local attempt would have met, or
 * neither (the upstream's response). Only hop answers are read, and the holding node drops any
 * `x-warren-*` header of the upstream's, so an upstream cannot fake either.
 */
function hopMarker(raw: Buffer[]): 'miss' | 'close' | ForwardError | null {
  let error: string | null = null;
  let message = '';
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    if (name.length < HOP.miss.length || (name[0] !== 0x78 && name[0] !== 0x58)) continue; // not x-… / X-…
    const lower = name.toString('latin1').toLowerCase();
    if (lower === HOP.miss) return 'miss';
    if (lower === HOP.close) return 'close';
    if (lower === HOP.error) error = raw[i + 1]!.toString('latin1');
    else if (lower === HOP.errorMessage) message = raw[i + 1]!.toString('latin1');
  }
  if (error === null) return null;
  const m = /^(\d{4})(?:; (retryable|idempotent))?$/.exec(error.trim());
  const code = m && Object.hasOwn(ERRORS, Number(m[1])) ? (Number(m[1]) as ErrorCode) : 7004;
  try {
    message = decodeURIComponent(message);
  } catch {
    // not as the holding node writes it: its own words are lost, not the error
  }
  return new ForwardError(code, message || 'the ingress node holding the tunnel failed', m?.[2] === 'retryable' ? 'any' : m?.[2] === 'idempotent' ? 'idempotent' : 'no');
}

/**
 * The headers of an `OPTIONS *` for Node's HTTP client, which frames the body by the headers it
 * is given: the hop-by-hop ones and the client's framing dropped, then the body's own
 * (Content-Length of a buffered body, the client's Content-Length, else chunked). Without
 * `Connection`, the client sends `Connection: close`.
 */
function asteriskHeaders(headers: string[], body: Buffer | http.IncomingMessage | null): string[] {
  const out: string[] = [];
  for (let i = 0; i < headers.length; i += 2) {
    const lower = headers[i]!.toLowerCase();
    if (lower === 'content-length' || HOP_BY_HOP.has(lower)) continue;
    out.push(headers[i]!, headers[i + 1]!);
  }
  if (Buffer.isBuffer(body)) out.push('Content-Length', String(body.length));
  else if (body !== null) {
    const cl = body.headers['content-length'];
    if (cl !== undefined && body.headers['transfer-encoding'] === undefined) out.push('Content-Length', cl);
    else out.push('Transfer-Encoding', 'chunked');
  }
  return out;
}

/** Does the public request carry a body (RFC 9112 §6.3)? */
function hasBody(req: http.IncomingMessage): boolean {
  const cl = req.headers['content-length'];
  return req.headers['transfer-encoding'] !== undefined || (cl !== undefined && cl !== '0');
}

/**
 * An error code (undici's `UND_ERR_*`, which the tunnel client's errors carry too) → the ForwardError for a request whose response has not started. An
 * error of no known kind answers with its code only (`the tunnel failed (<code>)`, else
 * `(internal error)`): its message may be an internal one (undici's assertion text, a stack
 * detail) and is logged (warn) instead of shown to the client.
 */
export function forwardErrorOf(err: Error & { code?: string }, hop: boolean, log?: Pick<Logger, 'warn'>): ForwardError {
  if (err instanceof ForwardError) return err;
  if (hop) {
    // The node that holds the tunnel cannot be reached: nothing reached the tunnel, so the
    // request may go elsewhere. A kept-alive connection it dropped before answering may have
    // carried the request on: only a request safe to repeat goes again.
    switch (err.code) {
      case 'ECONNREFUSED':
      case 'EHOSTUNREACH':
      case 'ENETUNREACH':
      case 'UND_ERR_CONNECT_TIMEOUT':
        return new ForwardError(7004, `the ingress node holding the tunnel is unreachable (${err.code})`, 'any');
      case 'ECONNRESET':
      case 'UND_ERR_SOCKET':
        return new ForwardError(7004, `the ingress node holding the tunnel is unreachable (${err.code})`, 'idempotent');
    }
  }
  switch (err.code) {
    // Met opening a stream (the pool's connector: nothing was sent) or, SESSION_CLOSED, by a
    // stream the request was written on (it may have reached the upstream).
    case 'STREAM_CAP':
      return new ForwardError(7006, 'the agent session has no free stream', 'any');
    // The client's address holds its share of the session's slots (MAX_STREAMS_PER_CLIENT): 429,
    // Retry-After. Nothing was sent, so another tunnel (another session, another share) may take it.
    case 'CLIENT_STREAM_CAP':
      return new ForwardError(7014, err.message, 'any');
    case 'SESSION_CLOSED':
      return new ForwardError(7004, 'the agent session closed', 'idempotent');
    // Dispatched to a pool already closed (its tunnel went away): nothing was sent.
    case 'UND_ERR_CLOSED':
      return new ForwardError(7004, 'the tunnel went away', 'any');
    // The pool was destroyed under the request (the node is stopping, or the tunnel went away past
    // its drain): it may have been running, so only a request safe to repeat goes again.
    case 'UND_ERR_DESTROYED':
      return new ForwardError(7004, 'the tunnel went away', 'idempotent');
    case RELEASED:
      return new ForwardError(7004, err.message, 'idempotent');
    // A request target or header the HTTP/1.1 client will not send (e.g. `OPTIONS *`).
    case 'UND_ERR_INVALID_ARG':
      return new ForwardError(7011, err.message);
    case 'UND_ERR_HEADERS_TIMEOUT':
      return new ForwardError(7005, 'no response from the upstream within the upstream timeout');
    // A kept-alive stream closed under the request (the upstream dropped its idle connection, or
    // read the request and hung up): nothing was answered, but the upstream may have acted on it,
    // so only a request safe to repeat goes again.
    case 'UND_ERR_SOCKET':
    case 'ECONNRESET':
      return new ForwardError(7004, `the tunnel failed: ${err.message}`, 'idempotent');
    default: {
      const code = typeof err.code === 'string' && /^[A-Za-z0-9_]{1,64}$/.test(err.code) ? err.code : undefined;
      log?.warn({ err: err.message, code, hop }, 'the tunnel failed with an unexpected error; the client is answered 502 (7004)');
      return new ForwardError(7004, `the tunnel failed (${code ?? 'internal error'})`);
    }
  }
}

/**
 * One request/response exchange: a handler of a tunnel's TunnelClient, or of a hop's undici pool
 * (the lean path: no ClientRequest or IncomingMessage, the response bytes go straight to the
 * client). Rejects
 * with a ForwardError while nothing was sent to the client; resolves with the status sent once the
 * response is over (499 when the client went away).
 */
class TunnelExchange implements Dispatcher.DispatchHandler, TunnelHandler {
  private abortFn: ((err?: Error) => void) | null = null;
  /** The upstream's response has ended (completed or failed): nothing left to stop. */
  private upstreamDone = false;
  private resumeFn: (() => void) | null = null;
  /** The response has started towards the client (or to the response stages). */
  private sent = false;
  private settled = false;
  /** Fed by onData when the response goes through the response stages. */
  private body: Readable | null = null;
  private status = 502;
  /**
   * A hop answered that the tunnel is not on that node (any more), or with the holding node's own
   * error (`hopError`): its body is dropped, then a retryable 7003 (or that error) is met.
   */
  private miss = false;
  private hopError: ForwardError | null = null;
  /** Set while it waits in a hop pool's queue with a deadline ({@link expireQueued}). */
  private queueTimer: NodeJS.Timeout | null = null;
  /** Given up in the queue: aborted as soon as undici hands it a connection. */
  private expired = false;
  /** A tunnel client's: takes the request out of its queue while it waits there (its client went away). */
  cancelQueued: (() => void) | null = null;

  constructor(
    private readonly req: http.IncomingMessage,
    private readonly res: http.ServerResponse,
    private readonly pool: TunnelPool,
    private readonly hooks: ForwardHooks | undefined,
    private readonly log: Logger,
    private readonly resolve: (status: number) => void,
    private readonly reject: (err: ForwardError) => void,
    /** To another node's internal listener (which may answer with the hop-miss header). */
    private readonly hop = false,
    /** Over a hop: gets the holding node's endpoint-policy results (`x-warren-tp`), if it sent any. */
    private readonly onHopPolicy?: (value: string) => void,
    /** {@link RequestInfo.written}: once the request's head is written (or never will be). */
    private written?: () => void,
  ) {
    // Inline, not a named arrow field: tsx's keepNames wraps those in a defineProperty per instance.
    res.on('close', () => this.clientClosed());
  }

  private clientClosed(): void {
    if (!this.res.writableFinished) {
      // The client went away: stop the upstream request (or the rest of its body) too; one still
      // queued for a stream leaves the queue (it would hold a place there, past the queue's limit).
      if (this.abortFn === null) this.cancelQueued?.();
      this.abortFn?.(new Error('the client went away'));
      this.body?.destroy();
      this.finish(499, null);
      return;
    }
    this.finish(this.res.statusCode ?? this.status, null);
  }

  /**
   * The request's head went to the upstream connection, or never will: {@link written} runs, once,
   * on a microtask (`onConnect` comes just before undici writes the head, in the same tick).
   */
  private wrote(): void {
    const w = this.written;
    if (w === undefined) return;
    this.written = undefined;
    queueMicrotask(w);
  }

  /**
   * Waiting in a hop pool's queue (every connection to the node busy): answered with 503
   * `ERR_WARREN_7006` unless a connection takes it within `ms`; undici then gets it aborted at once.
   */
  expireQueued(ms: number): void {
    this.queueTimer = setTimeout(() => {
      this.queueTimer = null;
      if (this.abortFn !== null || this.settled) return;
      this.expired = true;
      this.finish(0, new ForwardError(7006, `no connection to the ingress node holding the tunnel was free within ${ms / 1000} s`, 'any'));
    }, ms);
  }

  private finish(status: number, err: ForwardError | null): void {
    this.wrote();
    if (this.queueTimer) {
      clearTimeout(this.queueTimer);
      this.queueTimer = null;
    }
    if (this.settled) return;
    this.settled = true;
    this.pool.inFlight--;
    if (err) this.reject(err);
    else this.resolve(status);
  }

  onConnect(abort: (err?: Error) => void): void {
    this.abortFn = abort;
    if (this.queueTimer) {
      clearTimeout(this.queueTimer);
      this.queueTimer = null;
    }
    if (this.written !== undefined) this.wrote();
    if (this.res.destroyed) abort(new Error('the client went away'));
    else if (this.expired) abort(new Error('given up waiting for a connection'));
  }

  onHeaders(status: number, rawHeaders: Buffer[], resume: () => void, statusText: string): boolean {
    if (status < 200) return true; // 1xx: informational, the final answer follows
    if (this.hop) {
      const marker = hopMarker(rawHeaders);
      if (marker === 'close') {
        // The endpoint's close-connection on the holding node: this node's client connection
        // closes, nothing is written; whatever else comes on the hop is dropped.
        this.miss = true;
        this.finish(CLOSE_CONNECTION.status, null);
        // (The response's socket: for a request whose body was sent on, req.socket was seen null here.)
        (this.res.socket ?? this.req.socket)?.destroy();
        return true;
      }
      if (marker) {
        this.miss = true;
        if (marker !== 'miss') this.hopError = marker;
        return true;
      }
    }
    if (this.onHopPolicy) {
      for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
        const name = rawHeaders[i]!;
        if (name.length === HOP.policyResult.length && name.toString('latin1').toLowerCase() === HOP.policyResult) this.onHopPolicy(rawHeaders[i + 1]!.toString('latin1'));
      }
    }
    this.head(status, responseHeadersFrom(rawHeaders), resume, statusText);
    return true;
  }

  /** The final response head from a tunnel's {@link TunnelClient} (no hop markers on that path). */
  onHead(status: number, rawHeaders: string[], resume: () => void, statusText: string): void {
    this.head(status, responseHeaders(rawHeaders), resume, statusText);
  }

  /** The final response head, its headers those to send on: to the client, or to the response stages. */
  private head(status: number, headers: string[], resume: () => void, statusText: string): void {
    this.sent = true;
    this.status = status;
    this.resumeFn = resume;
    const res = this.res;
    // The upstream answered before the client's body was all read (an app refusing an upload
    // early): the tunnel's client (undici on a hop) stops sending the body, so its rest is never
    // read and the connection's next request would wait forever. This response is the connection's
    // last (Connection: close), as RFC 9112 §9.3 allows.
    if (!this.req.complete) res.shouldKeepAlive = false;
    const hooks = this.hooks;
    if (hooks) hooks.pipeline.onResult(hooks.state, status);
    if (!hooks?.pipeline.hasResponseStages) {
      const err = writeHeadSafely(res, status, statusText || undefined, headers);
      if (err) {
        // Nothing went to the client: it gets a 502 (forward() answers the ForwardError), and
        // the upstream's body is dropped with its request.
        this.log.warn({ err: err.message, status }, 'the upstream response head cannot be sent on');
        this.sent = false;
        this.miss = true; // onData/onComplete: drop whatever still comes
        this.finish(0, new ForwardError(7004, `the upstream's response head cannot be sent on: ${err.message}`));
        this.abortFn?.(err);
      }
      return;
    }
    this.body = new Readable({
      read: () => this.resumeFn?.(),
      // Destroyed before the upstream's body ended (a response stage's own answer replaced it, or
      // the head could not be sent): the upstream request is stopped, not drained for as long as
      // it streams (an SSE upstream held its tunnel stream and sent on into nothing).
      destroy: (err, cb) => {
        if (!this.upstreamDone) this.abortFn?.(err ?? new Error('the response was replaced'));
        cb(err);
      },
    });
    deliver(this.req, res, status, statusText, headers, this.body, hooks, this.log);
  }

  onData(chunk: Buffer): boolean {
    if (this.miss) return true;
    if (this.body) return this.body.push(chunk);
    if (this.res.write(chunk)) return true;
    this.res.once('drain', () => this.resumeFn?.());
    return false;
  }

  onComplete(): void {
    this.upstreamDone = true;
    if (this.miss) {
      this.finish(0, this.hopError ?? new ForwardError(7003, 'the tunnel has moved or gone', 'any'));
      return;
    }
    if (this.body) this.body.push(null);
    else this.res.end();
  }

  onError(err: Error): void {
    this.upstreamDone = true;
    if (this.settled) return;
    if (this.sent) {
      if (this.body) {
        // Through the response stages: `deliver` decides (a 502 while their head still waits,
        // the connection cut once it went out, nothing when a stage's own answer replaced the
        // response); the exchange ends when the client's response does (clientClosed).
        this.body.destroy(err);
        return;
      }
      // The response broke off after it started: the client sees the connection cut.
      this.res.destroy();
      this.finish(499, null);
      return;
    }
    if (this.res.destroyed) {
      this.finish(499, null);
      return;
    }
    this.finish(0, forwardErrorOf(err, this.hop, this.log));
  }
}

/**
 * `res.writeHead` that returns the error instead of throwing it (a header name or value Node
 * refuses: ERR_INVALID_CHAR, ERR_INVALID_HTTP_TOKEN, …); then no byte went out, and any header
 * or reason phrase it may have set on `res` before the throw is dropped, so an error answer can
 * still follow.
 */
function writeHeadSafely(res: http.ServerResponse, status: number, reason: string | undefined, headers: string[] | http.OutgoingHttpHeaders): Error | null {
  try {
    res.writeHead(status, reason, headers as http.OutgoingHttpHeaders);
    return null;
  } catch (err) {
    if (!res.headersSent) {
      for (const name of res.getHeaderNames()) res.removeHeader(name);
      // writeHead kept the refused reason phrase: the next answer's status gets its own.
      res.statusMessage = undefined as unknown as string;
    }
    return err instanceof Error ? err : new Error(String(err));
  }
}

/**
 * Passes a response that goes through the route's response stages (headers edited, body
 * transformed, or replaced by a stage's own answer) on to the client. A head Node refuses to
 * write (a header value a stage set that is not a valid field value) answers 502 (7004) while
 * nothing was sent, else cuts the response; it never throws out of the promise (an unhandled
 * rejection would end the process).
 */
function deliver(req: http.IncomingMessage, res: http.ServerResponse, status: number, statusMessage: string | undefined, headers: string[], body: Readable, hooks: ForwardHooks, log: Logger): void {
  // False once the upstream's body is no longer what the client gets (a stage's own answer, a 502).
  let bodyMatters = true;
  const unsendable = (err: Error): void => {
    log.error({ err: err.message, status }, 'the response head cannot be sent; answering 502');
    bodyMatters = false;
    body.destroy();
    if (res.headersSent || res.destroyed) res.destroy();
    else sendError(req, res, 7004, `the response head cannot be sent: ${err.message}`);
  };
  // A body that breaks off (the upstream went away mid-response: TunnelExchange.onError destroys
  // it with the error) cuts the response once its head went out; before that (the stages still
  // deciding, or a find-replace holding the body, whose head waits for it) the client is answered
  // 502 instead. `pipe` does not listen for a source's errors, and without a listener the 'error'
  // would end the whole process.
  body.on('error', (err) => {
    if (!bodyMatters || res.destroyed) return;
    if (res.headersSent) return void res.destroy();
    bodyMatters = false;
    log.warn({ err: err.message, status }, 'the upstream response broke off before its head was sent on; answering 502');
    sendError(req, res, 7004, 'the upstream response broke off before it could be sent on');
  });
  hooks.pipeline
    .onResponse(hooks.state, status, headers)
    .then(
      (d) => {
        // Every transform gets an error listener before anything can destroy it: destroying a
        // `stream.compose`d one (find-replace then compress-response) before it ended emits an
        // AbortError, and any transform's error, unheard, would end the process. Each cuts the response.
        if (d && !isOutcome(d)) for (const t of d.transforms) t.on('error', () => res.destroy());
        if (res.destroyed || res.headersSent) {
          // Gone meanwhile (the client), or answered 502 (the upstream's body broke off): nothing to send.
          if (d && !isOutcome(d)) for (const t of d.transforms) t.destroy();
          body.destroy();
          return;
        }
        if (isOutcome(d)) {
          // A response stage's own answer (outbound deny / custom-response / redirect): final, sent
          // as it is; the upstream's body is not wanted, and its request is stopped.
          bodyMatters = false;
          body.destroy();
          const err = writeHeadSafely(res, d.status, undefined, answerHeaders(d));
          if (err) return unsendable(err);
          res.end(answerBody(d, req.method));
          return;
        }
        const decision = d!;
        const reason = decision.status === status ? statusMessage || undefined : undefined;
        const piped = (): Readable => {
          let out: Readable = body;
          for (const t of decision.transforms) out = out.pipe(t);
          // `pipe` passes neither a broken upstream body nor a client gone on to the transforms:
          // once the response is over, each is destroyed, so what one holds (a find-replace's
          // bytes, counted process-wide) is given back however it ended.
          res.once('close', () => {
            for (const t of decision.transforms) if (!t.destroyed) t.destroy();
          });
          return out;
        };
        const last = decision.transforms.at(-1);
        if (last && decidesLength(last)) {
          // It holds the body anyway (response-body-find-replace): the head waits for it, and
          // carries the new Content-Length when the body was taken whole (chunked otherwise).
          const out = piped();
          void last.finalLength.then((length) => {
            if (res.destroyed || res.headersSent) return void out.destroy();
            const headers = length === null ? decision.headers : [...decision.headers, 'content-length', String(length)];
            const err = writeHeadSafely(res, decision.status, reason, headers);
            if (err) {
              out.destroy();
              return unsendable(err);
            }
            out.pipe(res);
          });
          return;
        }
        const err = writeHeadSafely(res, decision.status, reason, decision.headers);
        if (err) {
          for (const t of decision.transforms) t.destroy();
          return unsendable(err);
        }
        piped().pipe(res);
      },
      (err: unknown) => {
        log.error({ err }, 'response stages failed');
        bodyMatters = false;
        body.resume();
        res.destroy();
      },
    )
    .catch((err: unknown) => {
      // Last resort: whatever threw above ends this response, never the process.
      log.error({ err }, 'delivering the response failed');
      bodyMatters = false;
      body.resume();
      res.destroy();
    });
}

/**
 * Sends a request stage's own answer (deny, custom-response, the rate-limit 429, a module's
 * refusal, a sign-in redirect, …) through the route's response stages, as the upstream's response
 * would go: `res.status_code` and `res.headers` are the answer's, and the stages may edit its head,
 * replace it (an outbound deny or custom-response, sent as it is: no second pass), or transform
 * its body (compression, response-body-find-replace), which is fed to them as a stream of the
 * answer's bytes. Only for a pipeline that `editsResponses`. Resolves with the status sent once
 * the response is over, 499 when the client went away first (as `forward` does).
 */
export function deliverAnswer(req: http.IncomingMessage, res: http.ServerResponse, out: Answer, hooks: ForwardHooks, log: Logger): Promise<number> {
  if (res.destroyed) return Promise.resolve(499); // the client went away during the request stages
  const done = new Promise<number>((resolve) => res.once('close', () => resolve(res.writableFinished ? res.statusCode : 499)));
  const bytes = answerBody(out, req.method);
  const body = new Readable({ read() {} });
  if (bytes !== undefined && bytes.length > 0) body.push(bytes);
  body.push(null);
  deliver(req, res, out.status, undefined, answerHeaders(out), body, hooks, log);
  return done;
}

/** Largest answer head (and refusal body relayed) read from an upstream that was asked to upgrade. */
const UPGRADE_ANSWER_LIMIT = 64 * 1024;

/**
 * Reads an upstream's answer to an Upgrade request: its final head (1xx other than 101 are
 * skipped) and, for a refusal with a Content-Length up to UPGRADE_ANSWER_LIMIT, its body; for a
 * 101, `body` holds the bytes that came after the head (the new protocol's). null when the
 * upstream closes, fails, sends something that is not an HTTP/1.x answer or an oversized head, or
 * does not answer within `timeoutMs`. Leaves the stream paused with no listeners of its own.
 */
function readUpgradeAnswer(upstream: Duplex, timeoutMs: number): Promise<{ status: number; head: Buffer; body: Buffer } | null> {
  return new Promise((resolve) => {
    let buf: Buffer = Buffer.alloc(0);
    let status = 0;
    let headEnd = -1;
    let bodyLength = 0;
    const done = (v: { status: number; head: Buffer; body: Buffer } | null) => {
      clearTimeout(timer);
      upstream.off('data', onData);
      upstream.off('end', fail);
      upstream.off('close', fail);
      upstream.off('error', fail);
      upstream.pause();
      resolve(v);
    };
    const fail = () => done(null);
    const timer = setTimeout(fail, timeoutMs);
    const onData = (c: Buffer) => {
      buf = buf.length === 0 ? c : Buffer.concat([buf, c]);
      while (headEnd < 0) {
        const end = buf.indexOf('\r\n\r\n');
        if (end < 0) {
          if (buf.length > UPGRADE_ANSWER_LIMIT) fail();
          return;
        }
        const m = /^HTTP\/1\.[01] (\d{3})/.exec(buf.subarray(0, Math.min(end, 16)).toString('latin1'));
        if (!m) return fail();
        const code = Number(m[1]);
        if (code >= 100 && code < 200 && code !== 101) {
          buf = buf.subarray(end + 4); // an interim answer (100, 103): the final one follows
          continue;
        }
        status = code;
        headEnd = end + 4;
        if (status !== 101) {
          const cl = /\r\ncontent-length:[ \t]*(\d{1,6})[ \t]*\r\n/i.exec(buf.subarray(0, headEnd).toString('latin1'));
          bodyLength = cl && Number(cl[1]) <= UPGRADE_ANSWER_LIMIT ? Number(cl[1]) : 0;
        }
      }
      if (status === 101 || buf.length - headEnd >= bodyLength) {
        const body = status === 101 ? buf.subarray(headEnd) : buf.subarray(headEnd, headEnd + bodyLength);
        done({ status, head: buf.subarray(0, headEnd), body });
      }
    };
    upstream.on('data', onData);
    upstream.once('end', fail);
    upstream.once('close', fail);
    upstream.once('error', fail);
  });
}

/**
 * The head of an upstream's refusal of an upgrade as the client gets it: its status line and
 * headers, without the framing and connection ones, with `Content-Length` (the body relayed) and
 * `Connection: close`.
 */
function refusalHead(head: Buffer, bodyLength: number): Buffer {
  const lines = head.toString('latin1').split('\r\n').slice(0, -2);
  const fields = lines.slice(1).map((line) => [line.slice(0, Math.max(0, line.indexOf(':'))).trim().toLowerCase(), line] as const);
  // Headers the Connection header lists belong to that hop too.
  const listed = new Set(fields.filter(([n]) => n === 'connection').flatMap(([, l]) => l.slice(l.indexOf(':') + 1).split(',').map((t) => t.trim().toLowerCase())));
  let out = `${lines[0]}\r\n`;
  for (const [name, line] of fields) {
    if (!name || HOP_BY_HOP.has(name) || listed.has(name) || name === 'content-length' || name.startsWith(HOP_PREFIX)) continue;
    out += `${line}\r\n`;
  }
  return Buffer.from(`${out}content-length: ${bodyLength}\r\nconnection: close\r\n\r\n`, 'latin1');
}

/** How long a spliced side that was ended may take to close once the other side has closed. */
const SPLICE_CLOSE_GRACE_MS = 10_000;

/** Pipes two byte streams into each other until either side ends or fails. */
export function splice(client: Duplex, upstream: Duplex, head?: Buffer): void {
  const destroyBoth = () => {
    client.destroy();
    upstream.destroy();
  };
  // A side already gone (a client that reset while the upstream answered) emits no more 'close'
  // for the listeners below: the other would stay open, holding its agent stream, for good.
  if (client.destroyed || upstream.destroyed) return destroyBoth();
  if (head && head.length > 0) upstream.write(head);
  client.on('error', destroyBoth);
  upstream.on('error', destroyBoth);
  // A side that ended cleanly has had its end passed on by pipe (the other side flushes what it
  // was given, then closes); one that closed without ending (a reset) takes the other down at once.
  // A peer that never closes its half after that is closed 10 s later.
  const later = (side: Duplex) => setTimeout(() => side.destroy(), SPLICE_CLOSE_GRACE_MS).unref();
  client.on('close', () => (upstream.writableEnded ? later(upstream) : upstream.destroy()));
  upstream.on('close', () => (client.writableEnded ? later(client) : client.destroy()));
  client.pipe(upstream);
  upstream.pipe(client);
}
