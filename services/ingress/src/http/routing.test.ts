import { describe, expect, it } from 'vitest';
import type { DataPlaneConfig, DpBackend, DpEdge, DpRoute } from '@warren/shared';
import { RoutingTable, edgeTlsMinimum, httpsEdgesOn, httpsLocation, splitMatch, tlsRank, tlsRefusal } from './routing.js';
import { loadIngressEnv } from '../env.js';
import type { Socket } from 'node:net';
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
    // OPTIONS *: the server in general, routed as / (it goes upstream as *).
    expect(pathOf('*')).toBe('/');
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

describe('edge tls_termination minimum, per request', () => {
  const tlsEdge = (id: string, hostport: string, tlsTermination: DpEdge['tlsTermination']): DpEdge => ({ ...edge(id, [hostport]), tlsTermination });
  /** A socket as the public listeners see it: plain TCP, or TLS with a negotiated version. */
  const sock = (protocol?: string | null): Socket => (protocol === undefined ? ({ encrypted: undefined } as unknown as Socket) : ({ encrypted: true, getProtocol: () => protocol } as unknown as Socket));

  it('sets a minimum only for an enabled tls_termination (1.3 when asked, else the default 1.2)', () => {
    expect(edgeTlsMinimum(edge('e', ['a.test:443']))).toBeNull();
    expect(edgeTlsMinimum(tlsEdge('e', 'a.test:443', { enabled: false, minVersion: '1.3' }))).toBeNull();
    expect(edgeTlsMinimum(tlsEdge('e', 'a.test:443', { enabled: true, minVersion: '1.3' }))).toEqual({ rank: 13, version: '1.3' });
    expect(edgeTlsMinimum(tlsEdge('e', 'a.test:443', { enabled: true, minVersion: '1.2' }))).toEqual({ rank: 12, version: '1.2' });
    expect(edgeTlsMinimum(tlsEdge('e', 'a.test:443', { enabled: true, minVersion: null }))).toEqual({ rank: 12, version: '1.2' });
  });

  it('precomputes the minimum per compiled edge (null for edges without one)', () => {
    const t = new RoutingTable(
      config([edge('edghts_1', ['plain.test:443']), tlsEdge('edghts_2', 'v13.test:443', { enabled: true, minVersion: '1.3' }), tlsEdge('edghts_3', 'off.test:443', { enabled: false, minVersion: '1.3' })], []),
    );
    expect(t.edgeFor('plain.test', 443, 443)?.tlsMin).toBeNull();
    expect(t.edgeFor('off.test', 443, 443)?.tlsMin).toBeNull();
    expect(t.edgeFor('v13.test', 443, 443)?.tlsMin?.rank).toBe(13);
    // The same compiled edge on the plain-HTTP port: the minimum goes with it.
    expect(t.edgeFor('v13.test', 80, 80)?.tlsMin?.rank).toBe(13);
  });

  it('ranks the negotiated TLS version of a connection, plain TCP and unknown versions as 0', () => {
    expect(tlsRank(sock())).toBe(0);
    expect(tlsRank(sock(null))).toBe(0);
    expect(tlsRank(sock('unknown'))).toBe(0);
    expect(tlsRank(sock('TLSv1'))).toBe(10);
    expect(tlsRank(sock('TLSv1.1'))).toBe(11);
    expect(tlsRank(sock('TLSv1.2'))).toBe(12);
    expect(tlsRank(sock('TLSv1.3'))).toBe(13);
    // Something that only claims `encrypted` without a TLS API is not TLS.
    expect(tlsRank({ encrypted: true } as unknown as Socket)).toBe(0);
    const min13 = edgeTlsMinimum(tlsEdge('e', 'a.test:443', { enabled: true, minVersion: '1.3' }))!;
    const min12 = edgeTlsMinimum(tlsEdge('e', 'a.test:443', { enabled: true, minVersion: '1.2' }))!;
    expect([sock(), sock('TLSv1.1'), sock('TLSv1.2'), sock('TLSv1.3')].map((s) => tlsRank(s) >= min13.rank)).toEqual([false, false, false, true]);
    expect([sock(), sock('TLSv1.1'), sock('TLSv1.2'), sock('TLSv1.3')].map((s) => tlsRank(s) >= min12.rank)).toEqual([false, false, true, true]);
  });

  it("names the edge's minimum and what the connection used in the refusal", () => {
    const min13 = edgeTlsMinimum(tlsEdge('e', 'a.test:443', { enabled: true, minVersion: '1.3' }))!;
    expect(tlsRefusal(min13, sock('TLSv1.2'))).toMatch(/requires TLS 1\.3 or newer \(tls_termination min_version 1\.3\) but the request came over TLSv1\.2; retry on a new connection/);
    expect(tlsRefusal(min13, sock())).toMatch(/came over plain HTTP/);
  });
});

describe('HTTPS edges on the plain-HTTP listener (HTTPS_EDGES_ON_HTTP)', () => {
  it('is a constant per listener: HTTPS serves; plain HTTP follows the setting; Upgrades are refused, never redirected', () => {
    const rows = (['redirect', 'serve', 'refuse'] as const).map((setting) => [
      setting,
      httpsEdgesOn('https', setting, false),
      httpsEdgesOn('https', setting, true),
      httpsEdgesOn('http', setting, false),
      httpsEdgesOn('http', setting, true),
    ]);
    expect(rows).toEqual([
      ['redirect', 'serve', 'serve', 'redirect', 'refuse'],
      ['serve', 'serve', 'serve', 'serve', 'serve'],
      ['refuse', 'serve', 'serve', 'refuse', 'refuse'],
    ]);
  });

  it('finds an HTTPS edge by Host on the plain-HTTP listener (the caller then applies the setting), and nothing for other hosts', () => {
    const t = new RoutingTable(config([edge('edghts_1', ['app.test:443']), edge('edghts_2', ['alt.test:8080'])], []));
    expect(t.edgeFor('app.test', 80, 80)?.edge.id).toBe('edghts_1');
    expect(t.edgeFor('app.test', 8000, 80)?.edge.id).toBe('edghts_1');
    expect(t.edgeFor('alt.test', 8080, 80)?.edge.id).toBe('edghts_2');
    expect(t.edgeFor('nope.test', 80, 80)).toBeUndefined();
    // The HTTPS listener: exact hostport, then :443 (looked up once).
    expect(t.edgeFor('app.test', 443, 443)?.edge.id).toBe('edghts_1');
    expect(t.edgeFor('app.test', 8443, 443)?.edge.id).toBe('edghts_1');
    expect(t.edgeFor('alt.test', 8080, 443)?.edge.id).toBe('edghts_2');
    expect(t.edgeFor('alt.test', 443, 443)).toBeUndefined();
  });

  it('redirects to the same host and path on the public HTTPS port (443 left out)', () => {
    expect(httpsLocation('app.test', '/a/b?x=1&y=%20', 443)).toBe('https://app.test/a/b?x=1&y=%20');
    expect(httpsLocation('app.test', '/a?x', 8443)).toBe('https://app.test:8443/a?x');
    expect(httpsLocation('app.test', '/', 8443)).toBe('https://app.test:8443/');
    // Absolute-form targets keep their path and query, never their authority.
    expect(httpsLocation('app.test', 'http://evil.test:81/p?q=1', 443)).toBe('https://app.test/p?q=1');
    // A path that starts with `//` stays a path of the same host.
    expect(httpsLocation('app.test', '//evil.test/x', 443)).toBe('https://app.test//evil.test/x');
    expect(httpsLocation('app.test', '*', 443)).toBe('https://app.test/');
    expect(httpsLocation('app.test', undefined, 443)).toBe('https://app.test/');
    expect(httpsLocation('app.test', 'not a url', 443)).toBe('https://app.test/');
  });

  it('defaults to redirect and accepts only redirect, serve and refuse', () => {
    expect(loadIngressEnv({}).HTTPS_EDGES_ON_HTTP).toBe('redirect');
    expect(loadIngressEnv({ HTTPS_EDGES_ON_HTTP: '' }).HTTPS_EDGES_ON_HTTP).toBe('redirect');
    for (const v of ['redirect', 'serve', 'refuse'] as const) expect(loadIngressEnv({ HTTPS_EDGES_ON_HTTP: v }).HTTPS_EDGES_ON_HTTP).toBe(v);
    expect(() => loadIngressEnv({ HTTPS_EDGES_ON_HTTP: 'allow' })).toThrow(/HTTPS_EDGES_ON_HTTP/);
  });
});
