import https from 'node:https';
import net from 'node:net';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import * as client from 'openid-client';
import { ensureLocalTls } from '../tls.js';
import { guardedFetch } from '../policy/guarded-fetch.js';
import { createOidcStage } from './oidc.js';
import { DiscoveryCache, idpFetch } from './oidc-discovery.js';
import { makeConfig, makeEdge, makeRoute, makeState, testDeps } from './testing.js';
import type { Outcome, RouteStage } from '../pipeline/types.js';
import { resolveToLoopback } from '../policy/dns-testing.js';

/**
 * The SSRF guard on a tenant's OpenID provider (audit): discovery, and every request of the
 * resulting Configuration (token, userinfo, JWKS, wherever the discovery document points), go
 * through the guarded fetch; a refused connection is the generic 502 and reaches nothing. Real
 * openid-client requests to local HTTPS servers; the resolver is stubbed so that
 * `idp.example.test` resolves to 127.0.0.1 (offline), as a tenant's DNS name could.
 */

const REBOUND = 'idp.example.test';
const HTML = ['Accept', 'text/html'];
const GENERIC = 'the OpenID provider of this route could not be reached; try again later';

let dir: string;
let ca: string;
/** An "IdP" serving a discovery document for `https://idp.example.test:<port>`. */
let idp: https.Server;
let idpPort: number;
/** An "internal" service on loopback that must never be reached. */
let internal: https.Server;
let internalPort: number;
const idpSeen: string[] = [];
const internalSeen: string[] = [];
const sockets = new Set<{ destroy(): void; on(e: 'close', f: () => void): unknown }>();

async function listen(s: https.Server): Promise<number> {
  s.on('connection', (c) => {
    sockets.add(c);
    c.on('close', () => sockets.delete(c));
  });
  return new Promise<number>((r) => s.listen(0, '127.0.0.1', () => r((s.address() as net.AddressInfo).port)));
}

beforeAll(async () => {
  dir = mkdtempSync(path.join(tmpdir(), 'warren-oidc-ssrf-'));
  const tls = await ensureLocalTls(dir, [REBOUND]);
  ca = tls.caPem!;
  idp = https.createServer({ cert: tls.cert, key: tls.key }, (req, res) => {
    idpSeen.push(`${req.method} ${req.url}`);
    const issuer = `https://${REBOUND}:${idpPort}`;
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ issuer, authorization_endpoint: `${issuer}/auth`, token_endpoint: `${issuer}/token`, jwks_uri: `${issuer}/jwks`, response_types_supported: ['code'] }));
  });
  internal = https.createServer({ cert: tls.cert, key: tls.key }, (req, res) => {
    internalSeen.push(`${req.method} ${req.url}`);
    res.writeHead(500, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ error: 'internal_admin_api', error_description: 'INTERNAL-SECRET-BANNER v1.2.3' }));
  });
  [idpPort, internalPort] = await Promise.all([listen(idp), listen(internal)]);
});

afterAll(() => {
  for (const s of sockets) s.destroy();
  idp.close();
  internal.close();
  rmSync(dir, { recursive: true, force: true });
});

afterEach(() => {
  vi.restoreAllMocks();
  idpSeen.length = 0;
  internalSeen.length = 0;
});

const stubResolver = (): void => resolveToLoopback(REBOUND);

/** The guarded fetch as the ingress builds it, without (false) or with (true) WARREN_OIDC_ALLOW_PRIVATE=1, trusting the test CA. */
const guarded = (allow: boolean) => guardedFetch({ allowPrivate: () => allow, envName: 'WARREN_OIDC_ALLOW_PRIVATE', maxBytes: 512 * 1024, ca }) as unknown as client.CustomFetch;

function stage(issuer: string, discovery: DiscoveryCache): RouteStage {
  return createOidcStage({ discovery })(makeRoute({ oidc: { enabled: true, issuer, client_id: 'cid', client_secret: 'csecret' } }), makeEdge(), makeConfig(), testDeps())!;
}

async function run(st: RouteStage, url: string, headers: string[] = []): Promise<NonNullable<Outcome>> {
  return (await st.onRequest!(makeState({ url, headers: ['Host', 'app.example.test', ...HTML, ...headers] })))!;
}

describe('a tenant issuer on a name resolving to 127.0.0.1', () => {
  it('is refused when the ingress connects for discovery: the generic 502, and the provider is never reached', async () => {
    stubResolver();
    const out = await run(stage(`https://${REBOUND}:${idpPort}`, new DiscoveryCache(undefined, Date.now, 5, guarded(false))), '/page');
    expect(out.status).toBe(502);
    expect(out.headers!['warren-error-code']).toBe('ERR_WARREN_7107');
    expect(String(out.body)).toContain(GENERIC);
    expect(String(out.body)).not.toMatch(/127\.0\.0\.1|idp\.example|ECONN|resolves/);
    expect(idpSeen).toEqual([]);
  });

  it('is discovered when the operator allows private hosts (WARREN_OIDC_ALLOW_PRIVATE=1)', async () => {
    stubResolver();
    const out = await run(stage(`https://${REBOUND}:${idpPort}`, new DiscoveryCache(undefined, Date.now, 5, guarded(true))), '/page');
    expect(out.status).toBe(302);
    expect(String(out.headers!.location)).toMatch(new RegExp(`^https://${REBOUND.replace(/\./g, '\\.')}:${idpPort}/auth\\?`));
    expect(idpSeen).toEqual(['GET /.well-known/openid-configuration']);
  });
});

describe('endpoints a discovery document names', () => {
  /** A cache whose "discovery" (of a public issuer) names a token endpoint on the internal service. */
  const cache = (allow: boolean) =>
    new DiscoveryCache(
      async (_issuer, id, secret) =>
        new client.Configuration({ issuer: 'https://id.example.test', authorization_endpoint: 'https://id.example.test/auth', token_endpoint: `https://127.0.0.1:${internalPort}/internal-admin/token` }, id, secret),
      Date.now,
      5,
      guarded(allow),
    );

  /** Starts a sign-in, then comes back to the callback with a code: the token request follows. */
  async function callback(st: RouteStage): Promise<NonNullable<Outcome>> {
    const start = await run(st, '/page');
    expect(start.status).toBe(302);
    const state = new URL(String(start.headers!.location)).searchParams.get('state')!;
    const cookie = String(start.headers!['set-cookie']).split(';')[0]!;
    return run(st, `/.warren/oidc/callback?code=abc&state=${state}`, ['Cookie', cookie]);
  }

  it('are reached through the same guard: a token endpoint on 127.0.0.1 is refused (generic 502), the internal service sees nothing', async () => {
    const out = await callback(stage('https://id.example.test', cache(false)));
    expect(out.status).toBe(502);
    expect(String(out.body)).toContain(GENERIC);
    expect(String(out.body)).not.toMatch(/127\.0\.0\.1|internal|ECONN/i);
    expect(internalSeen).toEqual([]);
  });

  it('(allowed: the request is made, and the client is not shown what the endpoint answered)', async () => {
    const out = await callback(stage('https://id.example.test', cache(true)));
    expect(internalSeen).toEqual(['POST /internal-admin/token']);
    expect(out.status).toBe(400);
    expect(String(out.body)).toContain('<p>the provider&#39;s answer was not accepted</p>');
    expect(String(out.body)).not.toMatch(/INTERNAL-SECRET-BANNER|internal_admin_api|500/);
  });
});

describe('DiscoveryCache', () => {
  it('fetches a tenant issuer through the guarded fetch (the process one by default), a trusted (oauth provider) issuer without it, in separate entries', async () => {
    const fetches: (client.CustomFetch | undefined)[] = [];
    const meta = { issuer: 'https://accounts.example.test', authorization_endpoint: 'https://accounts.example.test/auth', token_endpoint: 'https://accounts.example.test/token' };
    const d = new DiscoveryCache(async (_i, id, secret, _t, _a, fetch) => {
      fetches.push(fetch);
      return new client.Configuration(meta, id, secret);
    });
    const tenant = await d.config(meta.issuer, 'cid', 's');
    const trusted = await d.config(meta.issuer, 'cid', 's', 'basic', { trusted: true });
    expect(fetches).toEqual([idpFetch(), undefined]);
    expect(tenant[client.customFetch]).toBe(idpFetch());
    expect(trusted[client.customFetch]).toBeUndefined();
  });
});
