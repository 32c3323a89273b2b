import type http from 'node:http';
import pino from 'pino';
import { Registry } from 'prom-client';
import type { DataPlaneConfig, DpEdge, DpRoute } from '@warren/shared';
import type { RateLimiter, RateLimitResult, RequestState, StageDeps } from '../pipeline/types.js';

/** Test helpers: an in-memory limiter and request states without sockets. */

export class FakeLimiter implements RateLimiter {
  readonly calls: { key: string; capacity: number; windowSeconds: number }[] = [];
  readonly counts = new Map<string, number>();
  failWith: RateLimitResult['error'] | null = null;
  async hit(key: string, capacity: number, windowSeconds: number): Promise<RateLimitResult> {
    this.calls.push({ key, capacity, windowSeconds });
    if (this.failWith) return { limited: false, retryAfterSeconds: 0, error: this.failWith };
    const n = this.counts.get(key) ?? 0;
    if (n >= capacity) return { limited: true, retryAfterSeconds: 12.2 };
    this.counts.set(key, n + 1);
    return { limited: false, retryAfterSeconds: 0 };
  }
}

export function deps(limiter: RateLimiter = new FakeLimiter()): StageDeps {
  return { limiter, log: pino({ level: 'silent' }), registry: new Registry() };
}

export function route(value: unknown, enabled = true): DpRoute {
  return { id: 'rt_1', accountId: 'ac_1', edgeId: 'edghts_1', matchType: 'path_prefix', match: '/', modules: {}, backendId: null, ipPolicyIds: [], trafficPolicy: { enabled, value } } as DpRoute;
}

/** app.example.com is also served on 8443; admin.example.com on 443 only. */
export const EDGE = { id: 'edghts_1', hostports: ['app.example.com:443', 'app.example.com:8443', 'admin.example.com:443'] } as DpEdge;
export const CONFIG = {} as DataPlaneConfig;

export function request(o: { method?: string; url?: string; host?: string; ip?: string; headers?: string[] } = {}): RequestState {
  const headers = o.headers ?? ['Host', o.host ?? 'app.example.com', 'User-Agent', 'curl/8'];
  const rawHost = headers.find((_, i) => i % 2 === 0 && headers[i]!.toLowerCase() === 'host') ? headers[headers.findIndex((h, i) => i % 2 === 0 && h.toLowerCase() === 'host') + 1] : undefined;
  const url = o.url ?? '/api/items?x=1';
  const req = { method: o.method ?? 'GET', url, headers: rawHost ? { host: rawHost } : {} } as unknown as http.IncomingMessage;
  return {
    req,
    scheme: 'https',
    clientIp: o.ip ?? '203.0.113.7',
    host: (o.host ?? 'app.example.com').toLowerCase(),
    path: url.split('?')[0]!,
    edge: EDGE,
    route: route(null),
    headers: headers.slice(),
    body: null,
    vars: {},
    startedAt: 0,
  };
}
