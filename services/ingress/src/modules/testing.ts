import http from 'node:http';
import net from 'node:net';
import { pino } from 'pino';
import { Registry } from 'prom-client';
import type { DataPlaneConfig, DpCertificateAuthority, DpEdge, DpIpPolicy, DpRoute } from '@warren/shared';
import type { RequestState, ResponseState, RouteStage, StageDeps, StageFactory } from '../pipeline/types.js';

/** Fixtures for the route-module unit tests: routes, edges, configs and request states built directly. */

export const ACCOUNT = 'acc_test';

export function makeEdge(over: Partial<DpEdge> = {}): DpEdge {
  return { id: 'edghts_test', accountId: ACCOUNT, hostports: ['app.example.test:443'], mutualTls: null, tlsTermination: null, ...over };
}

export function makeRoute(modules: Record<string, unknown>, over: Partial<DpRoute> = {}): DpRoute {
  const ipr = modules.ip_restriction as { ip_policy_ids?: string[] } | undefined;
  return {
    id: 'edghtsrt_test',
    accountId: ACCOUNT,
    edgeId: 'edghts_test',
    matchType: 'path_prefix',
    match: '/',
    modules,
    backendId: null,
    ipPolicyIds: ipr?.ip_policy_ids ?? [],
    trafficPolicy: null,
    ...over,
  };
}

export function makeConfig(opts: { ipPolicies?: DpIpPolicy[]; certificateAuthorities?: DpCertificateAuthority[] } = {}): DataPlaneConfig {
  return {
    version: 1,
    edges: new Map(),
    routes: new Map(),
    backends: new Map(),
    ipPolicies: new Map((opts.ipPolicies ?? []).map((p) => [p.id, p])),
    certificateAuthorities: new Map((opts.certificateAuthorities ?? []).map((c) => [c.id, c])),
    credentials: new Map(),
    credentialsByTokenHash: new Map(),
    eventSubscriptions: new Map(),
  };
}

export function testDeps(): StageDeps {
  return {
    limiter: { hit: async () => ({ limited: false, retryAfterSeconds: 0 }) },
    log: pino({ level: 'silent' }),
    registry: new Registry(),
  };
}

export interface StateOptions {
  method?: string;
  url?: string;
  /** Client headers, raw pairs. */
  headers?: string[];
  body?: Buffer | string | null;
  clientIp?: string;
  scheme?: 'http' | 'https';
  route?: DpRoute;
  edge?: DpEdge;
  /** The request's socket (a TLS socket for mutual TLS tests); a fresh unconnected one by default. */
  socket?: net.Socket;
}

/** A RequestState over a synthetic IncomingMessage (no network). */
export function makeState(o: StateOptions = {}): RequestState {
  const req = new http.IncomingMessage(o.socket ?? new net.Socket());
  req.method = o.method ?? 'GET';
  req.url = o.url ?? '/';
  const raw = o.headers ?? ['Host', 'app.example.test'];
  req.rawHeaders = [...raw];
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const k = raw[i]!.toLowerCase();
    const prev = req.headers[k];
    req.headers[k] = prev === undefined ? raw[i + 1]! : `${Array.isArray(prev) ? prev.join(', ') : prev}, ${raw[i + 1]!}`;
  }
  const q = req.url.indexOf('?');
  const hostHeader = (req.headers.host ?? 'app.example.test').toLowerCase();
  return {
    req,
    scheme: o.scheme ?? 'https',
    clientIp: o.clientIp ?? '203.0.113.7',
    host: hostHeader.replace(/:\d+$/, ''),
    path: q < 0 ? req.url : req.url.slice(0, q),
    edge: o.edge ?? makeEdge(),
    route: o.route ?? makeRoute({}),
    headers: [...raw],
    body: o.body == null ? null : Buffer.isBuffer(o.body) ? o.body : Buffer.from(o.body),
    vars: {},
    startedAt: performance.now(),
  };
}

export function makeResponse(status: number, headers: string[] = []): ResponseState {
  return { status, headers: [...headers] };
}

/** Builds one stage from a factory for a route with `modules`. */
export function stageFor(factory: StageFactory, modules: Record<string, unknown>, config: DataPlaneConfig = makeConfig()): RouteStage | null {
  return factory(makeRoute(modules), makeEdge(), config, testDeps());
}

/** A small deterministic generator (xorshift32) for fuzzed tests, so that a failure can be replayed from its seed. */
export function seededRandom(seed: number) {
  let x = seed >>> 0 || 1;
  const next = () => {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    return x / 0x1_0000_0000;
  };
  return { next, int: (n: number) => Math.floor(next() * n), pick: <T>(a: readonly T[]) => a[Math.floor(next() * a.length)]! };
}
