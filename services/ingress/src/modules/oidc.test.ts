import net from 'node:net';
import { afterAll, describe, expect, it } from 'vitest';
import * as client from 'openid-client';
import { createOidcStage, requestedScopes, routeBase, verifiedEmail } from './oidc.js';
import { DiscoveryCache } from './oidc-discovery.js';
import { MAX_LOGIN_COOKIES, deriveOidcKeys, newSession, readLoginState, seal } from './oidc-session.js';
import { makeConfig, makeEdge, makeResponse, makeRoute, makeState, testDeps } from './testing.js';
import type { Outcome, RouteStage } from '../pipeline/types.js';
import { guardedFetch } from '../policy/guarded-fetch.js';

const ISSUER = 'https://id.example.test';
const META: client.ServerMetadata = { issuer: ISSUER, authorization_endpoint: `${ISSUER}/auth`, token_endpoint: `${ISSUER}/token` };
const MOD = { enabled: true, issuer: ISSUER, client_id: 'cid', client_secret: 'csecret', scopes: [] as string[], cookie_prefix: 'warren.', maximum_duration: 3600, inactivity_timeout: 600, options_passthrough: false };
const T = 1_800_000_000_000;
let clock = T;
let discoveries = 0;
const fakeDiscovery = () =>
  new DiscoveryCache(async (_u, id, secret) => {
    discoveries++;
    return new client.Configuration(META, id, secret);
  }, () => clock);

function stage(mod: Record<string, unknown> = {}, over: Parameters<typeof makeRoute>[1] = {}, discovery = fakeDiscovery()): RouteStage {
  return createOidcStage({ now: () => clock, discovery })(makeRoute({ oidc: { ...MOD, ...mod } }, over), makeEdge(), makeConfig(), testDeps())!;
}

/** The guarded fetch as with WARREN_OIDC_ALLOW_PRIVATE=1 (tests whose provider is on loopback). */
const allowPrivateFetch = guardedFetch({ allowPrivate: () => true, envName: 'WARREN_OIDC_ALLOW_PRIVATE', maxBytes: 512 * 1024 }) as unknown as client.CustomFetch;

const keys = deriveOidcKeys('csecret', 'edghtsrt_test', ISSUER, 'cid');
const cookieFor = (over: object = {}) => seal(keys.session, 'session', { ...newSession({ sub: 'u1', email: 'a@example.test', name: 'Ann' }, T / 1000, { maximumDuration: 3600, inactivityTimeout: 600 }), ...over });
const html = ['Accept', 'text/html,application/xhtml+xml'];

async function run(st: RouteStage, o: Parameters<typeof makeState>[0] = {}) {
  const s = makeState({ ...o, headers: ['Host', 'app.example.test', ...(o.headers ?? [])] });
  const out: Outcome = await st.onRequest!(s);
  return { s, out };
}

afterAll(() => {
  clock = T;
});

describe('verifiedEmail (the openid-connect action: an email only when the provider vouches for it)', () => {
  it('takes the email only for email_verified true or "true" (any case); "false" (Cognito), false or a missing claim drop it (review)', () => {
    for (const v of [true, 'true', 'TRUE', 'True']) expect(verifiedEmail({ email: 'a@b.test', email_verified: v }), String(v)).toBe('a@b.test');
    for (const v of [false, 'false', 'False', undefined, null, 1, 'yes', ''] as unknown[]) expect(verifiedEmail({ email: 'a@b.test', email_verified: v }), String(v)).toBe('');
    expect(verifiedEmail({ email: 5, email_verified: true })).toBe('');
  });
});

describe('oidc stage', () => {
  it('is absent unless enabled; refuses exact_path routes and non-https issuers', () => {
    const f = createOidcStage({ discovery: fakeDiscovery() });
    expect(f(makeRoute({}), makeEdge(), makeConfig(), testDeps())).toBeNull();
    expect(f(makeRoute({ oidc: { ...MOD, enabled: false } }), makeEdge(), makeConfig(), testDeps())).toBeNull();
    expect(() => f(makeRoute({ oidc: MOD }, { matchType: 'exact_path', match: '/x' }), makeEdge(), makeConfig(), testDeps())).toThrow(/exact_path/);
    expect(() => f(makeRoute({ oidc: { ...MOD, issuer: 'http://id.example.test' } }), makeEdge(), makeConfig(), testDeps())).toThrow(/https/);
  });

  it('sends a browser to the provider with PKCE, state, nonce and a sealed pre-login cookie', async () => {
    const { out } = await run(stage(), { url: '/docs/page?x=1', headers: html });
    expect(out!.status).toBe(302);
    const loc = new URL(out!.headers!.location!);
    expect(loc.origin + loc.pathname).toBe(`${ISSUER}/auth`);
    expect(Object.fromEntries(loc.searchParams)).toMatchObject({
      client_id: 'cid',
      response_type: 'code',
      redirect_uri: 'https://app.example.test/.warren/oidc/callback',
      scope: 'openid profile email',
      code_challenge_method: 'S256',
    });
    expect(loc.searchParams.get('state')).toBeTruthy();
    expect(loc.searchParams.get('nonce')).toBeTruthy();
    expect(loc.searchParams.get('code_challenge')).toMatch(/^[A-Za-z0-9_-]{43}$/);
    const sc = String(out!.headers!['set-cookie']);
    expect(sc).toMatch(new RegExp(`^__Host-warren\\.oidc\\.login\\.${loc.searchParams.get('state')!.slice(0, 16)}=v1\\.`));
    expect(sc).toContain('Path=/; Max-Age=600; HttpOnly; SameSite=Lax; Secure');
  });

  it('puts reserved paths and the redirect URI under a path_prefix route', async () => {
    expect(routeBase(makeRoute({}, { match: '/app/' }))).toBe('/app');
    expect(routeBase(makeRoute({}, { match: 'h.test' }))).toBe('');
    const { out } = await run(stage({}, { match: '/app' }), { url: '/app/x', headers: html, scheme: 'http' });
    expect(new URL(out!.headers!.location!).searchParams.get('redirect_uri')).toBe('http://app.example.test/app/.warren/oidc/callback');
    expect(out!.headers!['set-cookie']).not.toContain('Secure');
    // plain HTTP: the pre-login cookie's path is the route's (the callback is under it)
    expect(out!.headers!['set-cookie']).toContain('; Path=/app; Max-Age=600;');
  });

  it('answers 401 to API requests without a session, naming the login URL', async () => {
    const { out } = await run(stage(), { url: '/api/x', method: 'POST', headers: ['Accept', 'application/json'] });
    expect(out!.status).toBe(401);
    expect(out!.headers!['warren-error-code']).toBe('ERR_WARREN_7106');
    expect(out!.headers!['www-authenticate']).toBe('OIDC realm="app.example.test", login="https://app.example.test/.warren/oidc/login?return_to=%2Fapi%2Fx"');
    expect(JSON.parse(String(out!.body))).toMatchObject({ error_code: 'ERR_WARREN_7106', status_code: 401 });
  });

  it('passes CORS preflights only with options_passthrough', async () => {
    expect((await run(stage(), { method: 'OPTIONS' })).out!.status).toBe(401);
    const { out, s } = await run(stage({ options_passthrough: true }), { method: 'OPTIONS', headers: ['ngrok-auth-user-email', 'forged@x'] });
    expect(out).toBeNull();
    expect(s.headers.map((h) => h.toLowerCase())).not.toContain('ngrok-auth-user-email');
  });

  it('forwards a request with a valid session: identity headers set, forged ones and its own cookies removed', async () => {
    clock = T + 10_000;
    const { out, s } = await run(stage(), {
      headers: ['Cookie', `a=1; __Host-warren.oidc=${cookieFor()}; warren.oidc=planted; warren.oidc.login.abc=x; __Host-warren.oidc.login.def=y`, 'Ngrok-Auth-User-Email', 'evil@x', 'ngrok-auth-user-id', 'root', 'Cookie', `__Host-warren.oidc=${cookieFor()}`],
    });
    expect(out).toBeNull();
    const pairs: Array<[string, string]> = [];
    for (let i = 0; i < s.headers.length; i += 2) pairs.push([s.headers[i]!.toLowerCase(), s.headers[i + 1]!]);
    expect(pairs.filter(([k]) => k.startsWith('ngrok-auth-'))).toEqual([
      ['ngrok-auth-user-email', 'a@example.test'],
      ['ngrok-auth-user-id', 'u1'],
      ['ngrok-auth-user-name', 'Ann'],
    ]);
    expect(pairs.filter(([k]) => k === 'cookie')).toEqual([['cookie', 'a=1']]);
  });

  it('treats forged, tampered, foreign and expired cookies as no session', async () => {
    clock = T + 10_000;
    const good = cookieFor();
    // A character well inside the sealed value: the last one of base64url may carry bits no
    // decoder reads (changing only those would change nothing, a rare false failure).
    const at = good.length - 10;
    const tampered = good.slice(0, at) + (good[at] === 'A' ? 'B' : 'A') + good.slice(at + 1);
    const foreign = seal(deriveOidcKeys('other', 'edghtsrt_test', ISSUER, 'cid').session, 'session', newSession({ sub: 'u1', email: '', name: '' }, T / 1000, { maximumDuration: 3600, inactivityTimeout: 0 }));
    for (const c of [tampered, foreign, 'v1.forged', '{"sub":"admin"}']) {
      expect((await run(stage(), { headers: ['Cookie', `__Host-warren.oidc=${c}`] })).out!.status).toBe(401);
    }
    clock = T + 3600_000;
    expect((await run(stage(), { headers: ['Cookie', `__Host-warren.oidc=${good}`] })).out!.status).toBe(401); // maximum_duration
    clock = T + 601_000;
    expect((await run(stage(), { headers: ['Cookie', `__Host-warren.oidc=${good}`] })).out!.status).toBe(401); // inactivity
  });

  it('slides a session by rewriting the cookie on the response, at most once a minute', async () => {
    const st = stage();
    clock = T + 30_000;
    const early = await run(st, { headers: ['Cookie', `__Host-warren.oidc=${cookieFor()}`] });
    const r1 = makeResponse(200, ['Set-Cookie', 'app=1']);
    await st.onResponse!(early.s, r1);
    expect(r1.headers).toEqual(['Set-Cookie', 'app=1']);
    clock = T + 90_000;
    const later = await run(st, { headers: ['Cookie', `__Host-warren.oidc=${cookieFor()}`] });
    const r2 = makeResponse(200, ['Set-Cookie', 'app=1']);
    await st.onResponse!(later.s, r2);
    expect(r2.headers[2]).toBe('set-cookie');
    expect(r2.headers[3]).toMatch(/^__Host-warren\.oidc=v1\..*; Path=\/; Max-Age=3510; HttpOnly; SameSite=Lax; Secure$/);
  });

  it('names the session cookie __Host-… on https only, and reads only the name of the request scheme', async () => {
    clock = T + 10_000;
    // https: a plain-named cookie (planted by a sibling subdomain or over http) is no session
    expect((await run(stage(), { headers: ['Cookie', `warren.oidc=${cookieFor()}`] })).out!.status).toBe(401);
    expect((await run(stage(), { headers: ['Cookie', `__Host-warren.oidc=${cookieFor()}`] })).out).toBeNull();
    // plain http: browsers refuse __Host- without Secure, so the plain name is used
    expect((await run(stage(), { scheme: 'http', headers: ['Cookie', `warren.oidc=${cookieFor()}`] })).out).toBeNull();
    expect((await run(stage(), { scheme: 'http', headers: ['Cookie', `__Host-warren.oidc=${cookieFor()}`] })).out!.status).toBe(401);
    const { out } = await run(stage(), { scheme: 'http', url: '/.warren/oidc/logout' });
    expect(out!.headers!['set-cookie']).toBe('warren.oidc=; Path=/; Max-Age=0; HttpOnly; SameSite=Lax');
    const custom = await run(stage({ cookie_prefix: 'app1.' }), { headers: ['Cookie', `__Host-app1.oidc=${cookieFor()}`] });
    expect(custom.out).toBeNull();
  });

  it('logout clears the session cookie', async () => {
    const { out } = await run(stage(), { url: '/.warren/oidc/logout', headers: ['Cookie', `__Host-warren.oidc=${cookieFor()}`] });
    expect(out!.status).toBe(200);
    expect(out!.headers!['set-cookie']).toBe('__Host-warren.oidc=; Path=/; Max-Age=0; HttpOnly; SameSite=Lax; Secure');
  });

  it('the login path starts a sign-in returning to a sanitized return_to', async () => {
    const st = stage();
    for (const [rt, expected] of [['/deep?x=1', '/deep?x=1'], ['https://evil.test/', '/'], ['//evil.test', '/']] as const) {
      const { out } = await run(st, { url: `/.warren/oidc/login?return_to=${encodeURIComponent(rt)}` });
      expect(out!.status).toBe(302);
      const cookie = String(out!.headers!['set-cookie']);
      const value = cookie.slice(cookie.indexOf('=') + 1, cookie.indexOf(';'));
      const { readLoginState } = await import('./oidc-session.js');
      expect(readLoginState(keys.login, value, clock / 1000)!.returnTo).toBe(expected);
    }
  });

  it('a callback without its pre-login cookie or with a wrong state fails with 400 and a way back', async () => {
    const { out } = await run(stage(), { url: '/.warren/oidc/callback?code=abc&state=xyz', headers: html });
    expect(out!.status).toBe(400);
    expect(out!.headers!['warren-error-code']).toBe('ERR_WARREN_7108');
    expect(String(out!.body)).toContain('/.warren/oidc/login?return_to=');
    expect(out!.headers!['set-cookie']).toBeUndefined();
  });

  it('reads the pre-login cookie on HTTPS only under its __Host- name: a planted one without the prefix is ignored (login CSRF; review)', async () => {
    clock = T;
    const st = stage();
    const state = 'planted-state-0123456789abcdef';
    const sealed = seal(keys.login, 'login', { state, nonce: 'n', verifier: 'v', returnTo: '/x', exp: T / 1000 + 300 });
    const cb = (cookie: string, scheme: 'http' | 'https' = 'https') => run(st, { scheme, url: `/.warren/oidc/callback?error=access_denied&state=${state}`, headers: [...html, 'Cookie', `${cookie}=${sealed}`] });
    const planted = await cb(`warren.oidc.login.${state.slice(0, 16)}`);
    expect(planted.out!.status).toBe(400);
    expect(String(planted.out!.body)).toContain('started in another browser');
    const own = await cb(`__Host-warren.oidc.login.${state.slice(0, 16)}`);
    expect(String(own.out!.body)).toContain('the provider answered access_denied');
    // Plain HTTP: browsers refuse __Host- there; the cookie has no prefix and the route's path.
    const { out } = await run(st, { scheme: 'http', url: '/page', headers: html });
    const sc = String(out!.headers!['set-cookie']);
    expect(sc).toMatch(/^warren\.oidc\.login\.[\w-]{16}=v1\./);
    expect(sc).toContain('Path=/; Max-Age=600; HttpOnly; SameSite=Lax');
    expect(sc).not.toContain('Secure');
    expect(String((await cb(`warren.oidc.login.${state.slice(0, 16)}`, 'http')).out!.body)).toContain('the provider answered access_denied');
  });

  it('clears the pre-login cookie on a failed callback (the provider refused, or a bad cookie)', async () => {
    const st = stage();
    const { out: start } = await run(st, { url: '/page', headers: html });
    const login = String(start!.headers!['set-cookie']).split(';')[0]!;
    const name = login.slice(0, login.indexOf('='));
    const state = new URL(String(start!.headers!.location)).searchParams.get('state')!;
    const clear = `${name}=; Path=/; Max-Age=0; HttpOnly; SameSite=Lax; Secure`;
    const refused = await run(st, { url: `/.warren/oidc/callback?error=access_denied&state=${state}`, headers: [...html, 'Cookie', login] });
    expect(refused.out!.status).toBe(400);
    expect(refused.out!.headers!['set-cookie']).toBe(clear);
    const bad = await run(st, { url: `/.warren/oidc/callback?code=x&state=${state}`, headers: [...html, 'Cookie', `${name}=v1.garbage`] });
    expect(bad.out!.status).toBe(400);
    expect(bad.out!.headers!['set-cookie']).toBe(clear);
  });

  it('requests openid always, and the defaults when no scopes are set', () => {
    expect(requestedScopes([])).toBe('openid profile email');
    expect(requestedScopes(undefined)).toBe('openid profile email');
    expect(requestedScopes(['email', 'groups'])).toBe('openid email groups');
    expect(requestedScopes(['groups', 'openid'])).toBe('openid groups');
  });

  it('discovers once per issuer across routes and config versions', async () => {
    const d = fakeDiscovery();
    const before = discoveries;
    for (let i = 0; i < 3; i++) await run(stage({}, { id: `edghtsrt_${i}` }, d), { headers: html });
    expect(discoveries - before).toBe(1);
  });
});

describe('oidc pre-login cookies stay bounded however many navigations (cookie bomb; audit)', () => {
  /** A browser's cookies for the host: applies each answer's Set-Cookie (Max-Age=0 deletes), sends them all back. */
  function jar() {
    const cookies = new Map<string, string>();
    return {
      cookies,
      header: () => [...cookies].map(([k, v]) => `${k}=${v}`).join('; '),
      store(out: Outcome) {
        const sc = out?.headers?.['set-cookie'];
        for (const line of sc === undefined ? [] : Array.isArray(sc) ? sc : [sc]) {
          const pair = line.split(';')[0]!;
          const eq = pair.indexOf('=');
          if (/Max-Age=0(;|$)/.test(line)) cookies.delete(pair.slice(0, eq));
          else cookies.set(pair.slice(0, eq), pair.slice(eq + 1));
        }
      },
    };
  }

  for (const scheme of ['https', 'http'] as const) {
    it(`${scheme}: keeps at most MAX_LOGIN_COOKIES, expiring the oldest, and a return-to of at most 512 characters`, async () => {
      clock = T;
      const st = stage();
      const j = jar();
      const states: string[] = [];
      for (let i = 0; i < 12; i++) {
        clock = T + i * 1000;
        const headers = [...html, ...(j.cookies.size ? ['Cookie', j.header()] : [])];
        const { out } = await run(st, { scheme, url: `/page${i}?q=${'x'.repeat(2000)}`, headers });
        expect(out!.status).toBe(302);
        states.push(new URL(String(out!.headers!.location)).searchParams.get('state')!);
        j.store(out);
        expect(j.cookies.size).toBeLessThanOrEqual(MAX_LOGIN_COOKIES);
        expect(j.header().length).toBeLessThan(3 * 1100);
      }
      expect(MAX_LOGIN_COOKIES).toBe(3);
      // the three newest sign-ins are the ones kept, each returning to its path (the 2 KB query dropped)
      const prefix = scheme === 'https' ? '__Host-warren.oidc.login.' : 'warren.oidc.login.';
      expect([...j.cookies.keys()]).toEqual(states.slice(-3).map((st) => `${prefix}${st.slice(0, 16)}`));
      expect([...j.cookies.values()].map((v) => readLoginState(keys.login, v, T / 1000 + 20)?.returnTo)).toEqual(['/page9', '/page10', '/page11']);
      clock = T;
    });
  }

  it('leaves pre-login cookies it did not seal (another route with the same prefix) alone, and does not count them', async () => {
    clock = T;
    const st = stage();
    const other = deriveOidcKeys('other-secret', 'edghtsrt_other', ISSUER, 'cid');
    const foreign = Array.from({ length: 5 }, (_, i) => `__Host-warren.oidc.login.foreign${i}aaaaaaaaa=${seal(other.login, 'login', { state: `s${i}`, nonce: 'n', verifier: 'v', returnTo: '/', exp: T / 1000 + 300 })}`);
    const { out } = await run(st, { url: '/page', headers: [...html, 'Cookie', foreign.join('; ')] });
    expect(typeof out!.headers!['set-cookie']).toBe('string');
    expect(String(out!.headers!['set-cookie'])).not.toContain('foreign');
  });
});

describe('oidc with an unreachable provider', () => {
  it('answers 502 at once (refused) and backs off instead of retrying per request', async () => {
    let calls = 0;
    const d = new DiscoveryCache(async (...args) => {
      calls++;
      return client.discovery(args[0], args[1], args[2], undefined, { timeout: args[3] });
    });
    const st = stage({ issuer: 'https://127.0.0.1:1' }, {}, d);
    const t0 = Date.now();
    const { out } = await run(st, { headers: html });
    expect(out!.status).toBe(502);
    expect(out!.headers!['warren-error-code']).toBe('ERR_WARREN_7107');
    // one text whatever the cause: nothing of the address, the port or the network error
    expect(String(out!.body)).toContain('<p>the OpenID provider of this route could not be reached; try again later</p>');
    expect(String(out!.body)).not.toMatch(/127\.0\.0\.1|ECONN|discovery/);
    expect((await run(st, { headers: html })).out!.status).toBe(502);
    expect(calls).toBe(1);
    expect(Date.now() - t0).toBeLessThan(5000);
  });

  it('times out on a provider that never answers', async () => {
    const sockets: net.Socket[] = [];
    const server = net.createServer((s) => sockets.push(s));
    const port = await new Promise<number>((r) => server.listen(0, '127.0.0.1', () => r((server.address() as net.AddressInfo).port)));
    try {
      // a loopback provider: allowed here (WARREN_OIDC_ALLOW_PRIVATE=1), or the guard would refuse it at once
      const d = new DiscoveryCache(undefined, Date.now, 1, allowPrivateFetch);
      const st = stage({ issuer: `https://127.0.0.1:${port}` }, {}, d);
      const t0 = Date.now();
      const { out } = await run(st, { headers: html });
      expect(out!.status).toBe(502);
      expect(Date.now() - t0).toBeLessThan(3000);
    } finally {
      for (const s of sockets) s.destroy();
      server.close();
    }
  });
});
