import { describe, expect, it } from 'vitest';
import type { DataPlaneConfig, DpBackend, DpEdge, DpRoute } from '@warren/shared';
import { RoutingTable, splitMatch } from './routing.js';
import { parseHost, pathOf } from './public.js';
import { publicRequestHeaders } from './proxy.js';

function config(edges: DpEdge[], routes: DpRoute[], backends: DpBackend[] = []): DataPlaneConfig {
  return {
    version: 1,
    edges: new Map(edges.map((e) => [e.id, e])),
    routes: new Map(routes.map((r) => [r.id, r])),
    backends: new Map(backends.map((b) => [b.id, b])),
    ipPolicies: new Map(),
    certificateAuthorities: new Map(),
    credentials: new Map(),
    credentialsByTokenHash: new Map(),
    eventSubscriptions: new Map(),
  };
}
const edge = (id: string, hostports: string[]): DpEdge => ({ id, accountId: 'ac_1', hostports, mutualTls: null, tlsTermination: null });
const route = (id: string, matchType: DpRoute['matchType'], match: string, backendId: string | null = null): DpRoute => ({
  id, accountId: 'ac_1', edgeId: 'edghts_1', matchType, match, modules: {}, backendId, ipPolicyIds: [], trafficPolicy: null,
});

describe('routing table', () => {
  const table = new RoutingTable(
    config(
      [edge('edghts_1', ['app.test:443', 'other.test:443'])],
      [
        route('r_root', 'path_prefix', '/'),
        route('r_api', 'path_prefix', '/api'),
        route('r_api_v2', 'path_prefix', '/api/v2'),
        route('r_exact', 'exact_path', '/api/v2/health'),
        route('r_host', 'path_prefix', 'other.test'),
        route('r_host_api', 'path_prefix', 'other.test/api'),
        route('r_host_exact', 'exact_path', 'other.test/x'),
      ],
    ),
  );
  const match = (host: string, path: string) => {
    const ce = table.edgeFor(host, 443, 443)!;
    return RoutingTable.routeFor(ce, host, path)?.route.id;
  };

  it('splits matches into host and path', () => {
    expect(splitMatch('/a')).toEqual({ host: null, path: '/a' });
    expect(splitMatch('Example.COM')).toEqual({ host: 'example.com', path: '/' });
    expect(splitMatch('example.com/a/b')).toEqual({ host: 'example.com', path: '/a/b' });
  });

  it('prefers exact over prefix, and the longest prefix', () => {
    expect(match('app.test', '/api/v2/health')).toBe('r_exact');
    expect(match('app.test', '/api/v2/healthz')).toBe('r_api_v2');
    expect(match('app.test', '/api/v1')).toBe('r_api');
    expect(match('app.test', '/')).toBe('r_root');
    expect(match('app.test', '/x')).toBe('r_root');
  });

  it('applies host routes only to their host, before host-less ones of the same length', () => {
    expect(match('other.test', '/api/z')).toBe('r_host_api');
    expect(match('other.test', '/x')).toBe('r_host_exact');
    expect(match('other.test', '/y')).toBe('r_host');
    expect(match('app.test', '/x')).toBe('r_root');
  });

  it('finds the edge by exact hostport, then by the public port of the scheme', () => {
    expect(table.edgeFor('app.test', 443, 443)?.edge.id).toBe('edghts_1');
    expect(table.edgeFor('app.test', 8443, 443)?.edge.id).toBe('edghts_1');
    expect(table.edgeFor('app.test', 8000, 80)?.edge.id).toBe('edghts_1');
    expect(table.edgeFor('nope.test', 443, 443)).toBeUndefined();
  });

  it('refuses a config whose route names a missing backend', () => {
    expect(() => new RoutingTable(config([edge('edghts_1', ['a.test:443'])], [route('r', 'path_prefix', '/', 'bkdtg_missing')]))).toThrow(/bkdtg_missing/);
  });
});

describe('request parsing', () => {
  it('parses Host headers', () => {
    expect(parseHost('App.Test', 443)).toEqual({ host: 'app.test', port: 443 });
    expect(parseHost('app.test:8443', 443)).toEqual({ host: 'app.test', port: 8443 });
    expect(parseHost('[::1]:80', 443)).toEqual({ host: '::1', port: 80 });
    expect(parseHost('app.test.', 80)).toEqual({ host: 'app.test', port: 80 });
    for (const bad of [undefined, '', 'a b', 'app.test:0', 'app.test:99999', 'app.test:x', '[::1', 'a/b', 'x'.repeat(300)]) expect(parseHost(bad, 80)).toBeNull();
  });

  it('takes the path of origin-form and absolute-form targets', () => {
    expect(pathOf('/a/b?c=d')).toBe('/a/b');
    expect(pathOf('http://x.test/p?q')).toBe('/p');
    expect(pathOf(undefined)).toBe('/');
  });

  it('drops hop-by-hop and internal headers and sets the forwarding headers', () => {
    const out = publicRequestHeaders(
      ['Host', 'app.test', 'Connection', 'keep-alive, X-Drop', 'X-Drop', '1', 'X-Forwarded-For', '10.0.0.1', 'x-warren-tunnel', 'tn_spoof', 'Transfer-Encoding', 'chunked', 'Accept', '*/*'],
      '192.0.2.7',
      'https',
      false,
    );
    expect(out).toEqual(['Host', 'app.test', 'Accept', '*/*', 'X-Forwarded-For', '10.0.0.1, 192.0.2.7', 'X-Forwarded-Proto', 'https', 'X-Forwarded-Host', 'app.test']);
  });
});
