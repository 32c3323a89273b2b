import type http from 'node:http';
import type { Transform } from 'node:stream';
import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import type { DataPlaneConfig, DpEdge, DpRoute } from '@warren/shared';
import type { HopConn } from '../http/hop-conn.js';

/**
 * The per-route request pipeline of the ingress: route modules and the traffic policy compile
 * (once per config version) into stages that run on every request of their route, in order,
 * before it goes to the tunnel, and on its response on the way back.
 */

/** One request as the stages see it. */
export interface RequestState {
  readonly req: http.IncomingMessage;
  readonly scheme: 'http' | 'https';
  /** Public client address (no port). */
  readonly clientIp: string;
  /** Lower-case host without port, as matched. */
  readonly host: string;
  /** Path without the query. */
  readonly path: string;
  /**
   * The request target (origin-form path and query) sent upstream instead of `req.url`, set by a
   * traffic-policy url-rewrite; absent (the usual case) when nothing rewrote it. `path` stays the
   * path the client asked for (routing, events); policy expressions (`req.url`, `req.path`) see
   * this one.
   */
  target?: string;
  /**
   * The request target exactly as the client sent it, when the ingress changed `req.url` (an
   * absolute-form target made origin-form, a path normalised; see `resolve` in `public.ts`);
   * absent when `req.url` is it. Only `req.url.raw` / `.raw_path` read it.
   */
  readonly rawTarget?: string;
  readonly edge: DpEdge;
  readonly route: DpRoute;
  /**
   * The public connection's facts when the request came over a hop (a Bind endpoint's policy runs
   * on the node holding the tunnel: `PublicHandler.serveHop`); absent when `req.socket` is the client's.
   */
  readonly conn?: HopConn;
  /** Request headers that will be sent on to the agent, raw `[name, value, …]` pairs; stages may edit them. */
  headers: string[];
  /** The whole request body when some stage declared `needsBody` (bounded; see PipelineLimits), else null. */
  body: Buffer | null;
  /**
   * Variables for later traffic-policy expressions and for the traffic event, e.g.
   * `vars.actions.ngrok.rate_limit.limited` / `vars.actions.service.rate_limit.limited`.
   */
  vars: Record<string, unknown>;
  /** Milliseconds since the request head arrived (performance.now()). */
  readonly startedAt: number;
}

/** The upstream's response head as the stages see it; stages may edit status and headers. */
export interface ResponseState {
  status: number;
  /** Raw `[name, value, …]` pairs; stages may edit them. */
  headers: string[];
}

/**
 * A stage's answer to a request: null to go on, or the response to send instead (the request never reaches the tunnel).
 * A header given as an array is sent once per value (several `set-cookie`), as Node's writeHead does.
 */
export type Outcome = null | { status: number; headers?: Record<string, string | string[]>; body?: string | Buffer };

export interface RouteStage {
  /** Module or policy name, for logs and metrics (`ip_restriction`, `traffic_policy`, …). */
  readonly name: string;
  /** True when `onRequest` needs `state.body` (webhook verification); the runner buffers it first. */
  readonly needsBody?: boolean;
  onRequest?(s: RequestState): Outcome | Promise<Outcome>;
  /**
   * Runs on the response head before it is sent to the client: the upstream's, or the answer a
   * request stage made itself (deny, custom-response, the rate-limit 429, a module's refusal; not
   * close-connection, nor an Upgrade's refusal). May answer instead (outbound deny/custom-response),
   * which is final.
   */
  onResponse?(s: RequestState, r: ResponseState): Outcome | void | Promise<Outcome | void>;
  /**
   * May wrap the response body (compression); called after every onResponse, with the final head.
   * On a request stage's own answer the body is a stream of that answer's bytes.
   */
  transformBody?(s: RequestState, r: ResponseState): Transform | null;
  /** The request's outcome at the upstream (circuit breaker); see `UpstreamResult`. */
  onResult?(s: RequestState, result: UpstreamResult): void;
}

/**
 * A request's outcome at the upstream: its status, 'error' when the tunnel/agent failed, or
 * 'none' when it ended without one (a stage refused it, the stages failed, the client went away
 * before the answer, an Upgrade). 'none' may follow another result of the same request (then it
 * means nothing), and is told only to pipelines with result stages.
 */
export type UpstreamResult = number | 'error' | 'none';

/** Sliding-window counting per ingress server (the spec's rate-limit action). */
export interface RateLimiter {
  /**
   * Counts one request in `key`'s bucket unless that would exceed `capacity` within the last
   * `windowSeconds`; denied requests are not counted.
   */
  hit(key: string, capacity: number, windowSeconds: number): Promise<RateLimitResult>;
}

export interface RateLimitResult {
  limited: boolean;
  /** When limited: whole seconds after which a retry will be admitted (never early), ≥ 1. */
  retryAfterSeconds: number;
  /** Set when the shared store failed and the local fallback decided (fail-open, bounded). */
  error?: { code: string; message: string };
}

export interface StageDeps {
  limiter: RateLimiter;
  log: Logger;
  registry: Registry;
  /** Whether an account has an internal endpoint of that hostname online (forward-internal); absent: none. */
  internalEndpoint?: (host: string, accountId: string) => boolean;
}

/** Compiles one route module or the traffic policy of a route; null when not configured or disabled. Throws on a config it cannot use. */
export type StageFactory = (route: DpRoute, edge: DpEdge, config: DataPlaneConfig, deps: StageDeps) => RouteStage | null;

/**
 * A body transform that holds its whole output until it knows it (response-body-find-replace):
 * `finalLength` settles before its first byte comes out, with the output's length when the body
 * was taken whole (the head can then carry the new Content-Length), or null when it passes the
 * body on as it comes (over its bound, or it failed): then the response goes out chunked.
 */
export interface LengthDecidingTransform extends Transform {
  readonly finalLength: Promise<number | null>;
}

export function decidesLength(t: Transform): t is LengthDecidingTransform {
  return (t as Partial<LengthDecidingTransform>).finalLength instanceof Promise;
}
