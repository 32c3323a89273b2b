import type http from 'node:http';
import type { Duplex } from 'node:stream';
import { CelActions, type DestinationRef } from '@warren/shared';
import type { RequestState } from '../pipeline/types.js';
import { collectPolicyLogs, policyLogsOf, type PolicyLogEntry } from '../policy/var-actions.js';
import { asciiJson } from '../http/hop-conn.js';
import { HTTP_REQUEST_COMPLETE, TCP_CONNECTION_CLOSED, trafficTs, type HttpRequestCompleteObject, type RateLimitVars, type TrafficEvents } from './traffic-events.js';

/**
 * Observing one request or connection for its traffic event. Created only when the account has
 * destinations for the event type, so an account without traffic subscriptions costs nothing
 * beyond the destinations lookup.
 */

export interface HttpTrackContext {
  accountId: string;
  dests: readonly DestinationRef[];
  edgeId: string | null;
  routeId: string | null;
  clientIp: string;
  serverName: string;
  serverPort: number;
  path: string;
}

function byteLength(chunk: unknown, encoding: unknown): number {
  if (typeof chunk === 'string') return Buffer.byteLength(chunk, typeof encoding === 'string' ? (encoding as BufferEncoding) : 'utf8');
  if (chunk instanceof Uint8Array) return chunk.byteLength;
  return 0;
}

/** The request's last rate-limit result, or null when no rate-limit action ran. */
export function rateLimitVarsOf(state: RequestState | null): RateLimitVars | null {
  const a = state?.vars.actions;
  if (!(a instanceof CelActions)) return null;
  const rl = a.ngrok.rate_limit;
  // The bucket key is the JSON of the key's values once the action ran, never empty.
  if (rl.bucket_key === '') return null;
  return { bucket_key: rl.bucket_key, limited: rl.limited, error: { code: rl.error.code, message: rl.error.message } };
}

/**
 * One HTTP request on its way: wraps the response's `writeHead`/`write`/`end` of this one
 * response (first byte time, body bytes as sent to the client, after any transform) and emits
 * `http_request_complete.v0` when the response closes: finished, or aborted by the client.
 * The caller fills in `tunnelId` and `state` when it has them.
 */
/** Longest `x-warren-tp` a holding node sends: within the 16 KiB an HTTP client reads of a head, with room to spare. */
const MAX_POLICY_RESULT_CHARS = 8 * 1024;

/**
 * Characters of a rate-limit bucket key kept in `x-warren-tp` when the whole key does not fit: at
 * most 6 escaped characters each (`\uXXXX`), so the key stays within {@link MAX_POLICY_RESULT_CHARS}.
 */
const CUT_BUCKET_KEY_CHARS = 1024;

/**
 * A Bind endpoint policy's results for the node that records the request's traffic event when the
 * policy ran on the holding node (a hop): `{rl, logs}`, as ASCII JSON. The `log` entries are left
 * out (with `lt`) when they would make it longer than {@link MAX_POLICY_RESULT_CHARS}; a bucket key
 * that still does not fit (keyed on large header values: ten of 8 KiB are allowed) is cut to its
 * first {@link CUT_BUCKET_KEY_CHARS} characters (with `kt`), so the header never grows with it.
 */
export function encodePolicyResult(state: RequestState): string {
  const rl = rateLimitVarsOf(state);
  const logs = policyLogsOf(state);
  const full = asciiJson({ rl, logs });
  if (full.length <= MAX_POLICY_RESULT_CHARS) return full;
  const slim = asciiJson({ rl, logs: null, lt: true });
  if (slim.length <= MAX_POLICY_RESULT_CHARS || !rl) return slim;
  return asciiJson({ rl: { ...rl, bucket_key: rl.bucket_key.slice(0, CUT_BUCKET_KEY_CHARS) }, logs: null, lt: true, kt: true });
}

/** {@link encodePolicyResult} read back; what does not have the expected shape is dropped. */
function decodePolicyResult(value: string): { rl: RateLimitVars | null; logs: PolicyLogEntry[] | null } | null {
  if (value.length > MAX_POLICY_RESULT_CHARS) return null;
  let v: unknown;
  try {
    v = JSON.parse(value);
  } catch {
    return null;
  }
  if (typeof v !== 'object' || v === null) return null;
  const { rl, logs } = v as { rl?: unknown; logs?: unknown };
  const r = rl as RateLimitVars | null | undefined;
  const okRl = r && typeof r === 'object' && typeof r.bucket_key === 'string' && typeof r.limited === 'boolean' && typeof r.error === 'object' && r.error !== null && typeof r.error.code === 'string' && typeof r.error.message === 'string';
  const okLogs = Array.isArray(logs) && logs.length > 0 && logs.every((e) => typeof e === 'object' && e !== null && typeof (e as PolicyLogEntry).metadata === 'object');
  return { rl: okRl ? { bucket_key: r.bucket_key, limited: r.limited, error: { code: r.error.code, message: r.error.message } } : null, logs: okLogs ? (logs as PolicyLogEntry[]) : null };
}

export class HttpRequestTracker {
  tunnelId: string | null = null;
  private st: RequestState | null = null;
  /** Over a hop to a Bind endpoint with a policy: its results, from the holding node. */
  private remote: { rl: RateLimitVars | null; logs: PolicyLogEntry[] | null } | null = null;
  /** The pipeline state (routes with modules or a policy): the rate-limit results and policy logs. */
  get state(): RequestState | null {
    return this.st;
  }
  set state(s: RequestState | null) {
    this.st = s;
    // This request's event will be emitted: its traffic-policy `log` actions record.
    if (s) collectPolicyLogs(s);
  }
  /** The holding node's `x-warren-tp` (a Bind endpoint's policy ran there, on the hop). */
  hopPolicyResult(value: string): void {
    this.remote = decodePolicyResult(value);
  }
  private reqLast = 0;
  private resFirst = 0;
  private bytes = 0;

  constructor(
    private readonly events: TrafficEvents,
    private readonly req: http.IncomingMessage,
    private readonly res: http.ServerResponse,
    /** performance.now() when the request head arrived. */
    private readonly started: number,
    private readonly ctx: HttpTrackContext,
  ) {
    const h = req.headers;
    // A request without a body has been read whole with its head.
    if (h['transfer-encoding'] === undefined && (h['content-length'] === undefined || h['content-length'] === '0')) this.reqLast = started;
    else req.once('end', () => (this.reqLast = performance.now()));
    const t = this;
    const writeHead = res.writeHead as (...a: unknown[]) => http.ServerResponse;
    res.writeHead = function (this: http.ServerResponse, ...args: unknown[]) {
      if (t.resFirst === 0) t.resFirst = performance.now();
      return writeHead.apply(this, args);
    } as typeof res.writeHead;
    const write = res.write as (...a: unknown[]) => boolean;
    res.write = function (this: http.ServerResponse, chunk: unknown, ...rest: unknown[]) {
      t.bytes += byteLength(chunk, rest[0]);
      return write.call(this, chunk, ...rest);
    } as typeof res.write;
    const end = res.end as (...a: unknown[]) => http.ServerResponse;
    res.end = function (this: http.ServerResponse, chunk?: unknown, ...rest: unknown[]) {
      if (chunk != null && typeof chunk !== 'function') t.bytes += byteLength(chunk, rest[0]);
      return end.call(this, chunk, ...rest);
    } as typeof res.end;
    res.once('close', () => this.finish());
  }

  /** Wraps a tunnel picker so that the tunnel finally used (retries included) is recorded. */
  picking<T extends { tunnel: { id: string } } | null>(next: (exclude: ReadonlySet<string>) => T): (exclude: ReadonlySet<string>) => T {
    return (exclude) => {
      const t = next(exclude);
      if (t) this.tunnelId = t.tunnel.id;
      return t;
    };
  }

  private finish(): void {
    const perfNow = performance.now();
    const wallNow = Date.now();
    const at = (p: number) => trafficTs(wallNow - (perfNow - p));
    const { req, res, ctx } = this;
    const rl = rateLimitVarsOf(this.st) ?? this.remote?.rl ?? null;
    const logs = policyLogsOf(this.st) ?? this.remote?.logs ?? null;
    const object: HttpRequestCompleteObject = {
      conn: { client_ip: ctx.clientIp, server_name: ctx.serverName, server_port: ctx.serverPort },
      http: {
        request: {
          method: req.method ?? '',
          url: { path: ctx.path },
          version: `HTTP/${req.httpVersion}`,
          first_byte_ts: at(this.started),
          last_byte_ts: at(this.reqLast || perfNow),
        },
        response: {
          // 499: the client went away before a response head was sent.
          status_code: res.headersSent ? res.statusCode : 499,
          body_length: req.method === 'HEAD' ? 0 : this.bytes,
          first_byte_ts: this.resFirst ? at(this.resFirst) : null,
          last_byte_ts: at(perfNow),
        },
      },
      warren: { edge_id: ctx.edgeId, route_id: ctx.routeId, tunnel_id: this.tunnelId, rate_limited: rl?.limited ?? false, rate_limit: rl },
    };
    if (logs) object.traffic_policy = { logs };
    this.events.emit(HTTP_REQUEST_COMPLETE, ctx.accountId, ctx.dests, object, wallNow);
  }
}

export interface TcpTrackContext {
  accountId: string;
  dests: readonly DestinationRef[];
  edgeId: string | null;
  routeId: string | null;
  tunnelId: string | null;
  clientIp: string;
  serverAddr: string;
  serverPort: number;
  /** performance.now() when the connection started. */
  started: number;
}

/**
 * A raw TCP connection carried to a tunnel (the websocket_tcp_converter: the WebSocket's
 * payload bytes are the TCP stream the agent sees): counts the bytes each way and emits
 * `tcp_connection_closed.v0` when the client side closes. `bytes_in` is client → upstream,
 * `bytes_out` upstream → client, payload bytes (WebSocket framing not counted).
 */
export function trackTcpConnection(events: TrafficEvents, client: Duplex, upstream: Duplex, ctx: TcpTrackContext): void {
  let bytesIn = 0;
  let bytesOut = 0;
  client.on('data', (c: Buffer) => (bytesIn += c.length));
  upstream.on('data', (c: Buffer) => (bytesOut += c.length));
  let done = false;
  const finish = () => {
    if (done) return;
    done = true;
    const perfNow = performance.now();
    const wallNow = Date.now();
    events.emit(
      TCP_CONNECTION_CLOSED,
      ctx.accountId,
      ctx.dests,
      {
        conn: {
          client_ip: ctx.clientIp,
          server_addr: ctx.serverAddr,
          server_port: ctx.serverPort,
          start_ts: trafficTs(wallNow - (perfNow - ctx.started)),
          end_ts: trafficTs(wallNow),
          bytes_in: bytesIn,
          bytes_out: bytesOut,
        },
        warren: { edge_id: ctx.edgeId, route_id: ctx.routeId, tunnel_id: ctx.tunnelId },
      },
      wallNow,
    );
  };
  client.once('close', finish);
  upstream.once('close', finish);
}
