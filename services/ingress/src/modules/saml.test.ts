import http from 'node:http';
import type net from 'node:net';
import { describe, expect, it } from 'vitest';
import { openSamlLogoutHandoff, samlHandoffKey, seal, sealSamlHandoff, sealSamlLogoutBounce, unseal, type SamlHandoff } from '@warren/shared';
import { createSamlStage } from './saml.js';
import { deriveSessionKeys, getCookie } from './oidc-session.js';
import { makeConfig, makeEdge, makeRoute, makeState, testDeps } from './testing.js';
import type { Outcome, RouteStage } from '../pipeline/types.js';
import { sendOutcome } from '../http/public.js';

const ROUTE = 'edghtsrt_test';
const SECRET = 'handoff-secret-0123456789';
const LOGIN = 'https://cp.example.test/saml/edghtsrt_test/login';
const MOD = { enabled: true, handoff_secret: SECRET, login_url: LOGIN, cookie_prefix: 'warren.', maximum_duration: 3600, inactivity_timeout: 0, options_passthrough: false, idp_metadata: '<x/>' };
const T = 1_800_000_000_000;
const CALLBACK = 'https://app.example.test/.warren/saml/callback';
const html = ['Accept', 'text/html,application/xhtml+xml'];

function stage(mod: Record<string, unknown> = {}): RouteStage {
  return createSamlStage({ now: () => T })(makeRoute({ saml: { ...MOD, ...mod } }), makeEdge(), makeConfig(), testDeps())!;
}

async function run(st: RouteStage, o: Parameters<typeof makeState>[0] = {}) {
  const s = makeState({ ...o, headers: ['Host', 'app.example.test', ...(o.headers ?? [])] });
  const out: Outcome = await st.onRequest!(s);
  return { s, out };
}

const handoff = (over: Partial<SamlHandoff> = {}) =>
  sealSamlHandoff(samlHandoffKey(SECRET, ROUTE), { sub: 'u-1', email: 'alice@example.test', name: 'Alice', st: '', cb: CALLBACK, exp: T / 1000 + 60, ...over });

/** Starts a sign-in: the pre-login cookie (name=value) and the state sent to the control plane. */
async function start(st: RouteStage): Promise<{ cookie: string; state: string }> {
  const { out } = await run(st, { url: '/app?x=1', headers: html });
  expect(out!.status).toBe(302);
  const loc = new URL(out!.headers!.location!);
  expect(loc.origin + loc.pathname).toBe(LOGIN);
  expect(loc.searchParams.get('redirect_uri')).toBe(CALLBACK);
  return { cookie: String(out!.headers!['set-cookie']).split(';')[0]!, state: loc.searchParams.get('state')! };
}

describe('saml stage', () => {
  it('is absent unless enabled; refuses exact_path routes and a module without hand-off secret', () => {
    const f = createSamlStage();
    expect(f(makeRoute({}), makeEdge(), makeConfig(), testDeps())).toBeNull();
    expect(f(makeRoute({ saml: { ...MOD, enabled: false } }), makeEdge(), makeConfig(), testDeps())).toBeNull();
    expect(() => f(makeRoute({ saml: MOD }, { matchType: 'exact_path', match: '/x' }), makeEdge(), makeConfig(), testDeps())).toThrow(/exact_path/);
    expect(() => f(makeRoute({ saml: { ...MOD, handoff_secret: '' } }), makeEdge(), makeConfig(), testDeps())).toThrow(/hand-off secret/);
  });

  it('sends browsers to the control plane login, and gives other clients 401', async () => {
    const st = stage();
    await start(st);
    const { out } = await run(st, { url: '/api', headers: ['Accept', 'application/json'] });
    expect(out!.status).toBe(401);
    expect(out!.headers!['www-authenticate']).toMatch(/^SAML realm="app.example.test", login="https:\/\/app.example.test\/.warren\/saml\/login\?return_to=%2Fapi"$/);
  });

  it('turns a valid hand-off into a session and forwards the identity', async () => {
    const st = stage();
    const { cookie, state } = await start(st);
    const { out } = await run(st, { url: `/.warren/saml/callback?state=${state}&handoff=${handoff({ st: state })}`, headers: [...html, 'Cookie', cookie] });
    expect(out!.status).toBe(302);
    expect(out!.headers!.location).toBe('/app?x=1');
    // two Set-Cookie: the session (__Host- on https), and the consumed pre-login cookie cleared
    const [sessionCookie, cleared] = out!.headers!['set-cookie'] as string[];
    const session = getCookie(sessionCookie!.split(';')[0], '__Host-warren.saml');
    expect(session).toMatch(/^v1\./);
    expect(sessionCookie).toMatch(/; Path=\/; Max-Age=3600; HttpOnly; SameSite=Lax; Secure$/);
    expect(cleared).toBe(`${cookie.slice(0, cookie.indexOf('='))}=; Path=/; Max-Age=0; HttpOnly; SameSite=Lax; Secure`);
    const { s, out: fwd } = await run(st, { url: '/app', headers: ['Cookie', `__Host-warren.saml=${session}`, 'ngrok-auth-user-id', 'root'] });
    expect(fwd).toBeNull();
    const h = Object.fromEntries(Array.from({ length: s.headers.length / 2 }, (_, i) => [s.headers[2 * i]!.toLowerCase(), s.headers[2 * i + 1]!]));
    expect(h).toMatchObject({ 'ngrok-auth-user-id': 'u-1', 'ngrok-auth-user-email': 'alice@example.test', 'ngrok-auth-user-name': 'Alice' });
  });

  it('refuses a hand-off for another sign-in, another callback, an expired or a forged one', async () => {
    const st = stage();
    const { cookie, state } = await start(st);
    const bad = [
      handoff({ st: 'someone-elses-state' }),
      handoff({ st: state, cb: 'https://evil.test/.warren/saml/callback' }),
      handoff({ st: state, exp: T / 1000 - 1 }),
      sealSamlHandoff(samlHandoffKey('another-secret', ROUTE), { sub: 'u-1', email: '', name: '', st: state, cb: CALLBACK, exp: T / 1000 + 60 }),
    ];
    for (const h of bad) {
      const { out } = await run(st, { url: `/.warren/saml/callback?state=${state}&handoff=${h}`, headers: [...html, 'Cookie', cookie] });
      expect(out!.status).toBe(400);
      expect(out!.headers!['warren-error-code']).toBe('ERR_WARREN_7108');
    }
    // without the browser's pre-login cookie
    const { out } = await run(st, { url: `/.warren/saml/callback?state=${state}&handoff=${handoff({ st: state })}`, headers: html });
    expect(out!.status).toBe(400);
    expect(out!.headers!['set-cookie']).toBeUndefined();
  });

  it('every refused callback clears the pre-login cookie it read', async () => {
    const st = stage();
    const { cookie, state } = await start(st);
    const { out } = await run(st, { url: `/.warren/saml/callback?state=${state}&handoff=${handoff({ st: 'other' })}`, headers: [...html, 'Cookie', cookie] });
    expect(out!.status).toBe(400);
    expect(out!.headers!['set-cookie']).toBe(`${cookie.slice(0, cookie.indexOf('='))}=; Path=/; Max-Age=0; HttpOnly; SameSite=Lax; Secure`);
  });

  it('both Set-Cookie headers of a signed-in callback reach the client as separate headers (sendOutcome)', async () => {
    const st = stage();
    const { cookie, state } = await start(st);
    const { out } = await run(st, { url: `/.warren/saml/callback?state=${state}&handoff=${handoff({ st: state })}`, headers: [...html, 'Cookie', cookie] });
    const server = http.createServer((req, res) => sendOutcome(req, res, out!));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    try {
      const port = (server.address() as net.AddressInfo).port;
      const res = await new Promise<http.IncomingMessage>((resolve, reject) => http.get({ host: '127.0.0.1', port, path: '/' }, resolve).on('error', reject));
      res.resume();
      expect(res.statusCode).toBe(302);
      expect(res.headers['set-cookie']).toHaveLength(2);
      expect(res.headers['set-cookie']![0]).toMatch(/^__Host-warren\.saml=v1\./);
      expect(res.headers['set-cookie']![1]).toMatch(/^__Host-warren\.saml\.login\.[^=]+=; Path=\/; Max-Age=0;/);
    } finally {
      await new Promise((r) => server.close(r));
    }
  });
});

describe('saml single logout at the edge', () => {
  const LOGOUT = 'https://cp.example.test/saml/edghtsrt_test/logout';
  const SLO_MOD = { logout_url: LOGOUT, single_logout: true };
  const sessionKey = deriveSessionKeys('saml', SECRET, ROUTE, 'saml', '').session;
  const cleared = '__Host-warren.saml=; Path=/; Max-Age=0; HttpOnly; SameSite=Lax; Secure';
  const now = T / 1000;
  const session = (over: object = {}) => seal(sessionKey, 'session', { sub: 'u-1', email: 'a@example.test', name: 'A', slo: { f: 'urn:f', si: '_s1' }, iat: now - 10, seen: now - 10, exp: now + 3600, ...over });
  const logout = (st: RouteStage, cookie?: string, query = '') => run(st, { url: `/.warren/saml/logout${query}`, headers: [...html, ...(cookie ? ['Cookie', `__Host-warren.saml=${cookie}`] : [])] });

  it('keeps the NameID details and SessionIndex of the hand-off in the session', async () => {
    const st = stage(SLO_MOD);
    const { cookie, state } = await start(st);
    const { out } = await run(st, { url: `/.warren/saml/callback?state=${state}&handoff=${handoff({ st: state, slo: { f: 'urn:f', si: '_s1', q: 'idp-q' } })}`, headers: [...html, 'Cookie', cookie] });
    expect(out!.status).toBe(302);
    const value = getCookie(String((out!.headers!['set-cookie'] as string[])[0]).split(';')[0], '__Host-warren.saml');
    expect(unseal(sessionKey, 'session', value)).toMatchObject({ sub: 'u-1', slo: { f: 'urn:f', si: '_s1', q: 'idp-q' } });
    // a hand-off with a malformed slo is refused
    const again = await start(st);
    const bad = await run(st, { url: `/.warren/saml/callback?state=${again.state}&handoff=${handoff({ st: again.state, slo: { f: 'x'.repeat(300) } })}`, headers: [...html, 'Cookie', again.cookie] });
    expect(bad.out!.status).toBe(400);
  });

  it('SP-initiated: clears the cookie and sends the browser to the control plane with the session sealed', async () => {
    const st = stage(SLO_MOD);
    const { out } = await logout(st, session());
    expect(out!.status).toBe(302);
    expect(out!.headers!['set-cookie']).toBe(cleared);
    const loc = new URL(String(out!.headers!.location));
    expect(loc.origin + loc.pathname).toBe(LOGOUT);
    expect(openSamlLogoutHandoff(samlHandoffKey(SECRET, ROUTE), loc.searchParams.get('token'), now)).toEqual({ sub: 'u-1', slo: { f: 'urn:f', si: '_s1' }, ret: 'https://app.example.test/', exp: now + 60 });
    // an idle session (past inactivity_timeout) is still ended at the IdP; one past its hard end is not
    const idle = stage({ ...SLO_MOD, inactivity_timeout: 60 });
    expect((await logout(idle, session({ seen: now - 600 }))).out!.status).toBe(302);
    expect((await logout(idle, session({ exp: now - 1 }))).out!.status).toBe(200);
  });

  it('a logout navigated to from another site (Sec-Fetch-Site cross-site or same-site) clears the cookie here but does not start single logout at the IdP', async () => {
    const st = stage(SLO_MOD);
    for (const site of ['cross-site', 'same-site']) {
      const { out } = await run(st, { url: '/.warren/saml/logout', headers: [...html, 'Sec-Fetch-Site', site, 'Cookie', `__Host-warren.saml=${session()}`] });
      expect(out!.status).toBe(200);
      expect(out!.headers!['set-cookie']).toBe(cleared);
      expect(String(out!.body)).toContain('<h1>Signed out</h1>');
    }
    for (const site of ['same-origin', 'none']) {
      const { out } = await run(st, { url: '/.warren/saml/logout', headers: [...html, 'Sec-Fetch-Site', site, 'Cookie', `__Host-warren.saml=${session()}`] });
      expect(out!.status).toBe(302);
    }
  });

  it('no session, an IdP without single logout, or a control plane that sends no logout_url: the signed-out page', async () => {
    for (const [mod, cookie] of [
      [SLO_MOD, undefined],
      [SLO_MOD, 'v1.garbage'],
      [{ logout_url: LOGOUT, single_logout: false }, session()],
      [{}, session()],
    ] as const) {
      const { out } = await logout(stage(mod), cookie);
      expect(out!.status).toBe(200);
      expect(out!.headers!['set-cookie']).toBe(cleared);
      expect(String(out!.body)).toContain('<h1>Signed out</h1>');
    }
  });

  it('IdP-initiated: clears the cookie and returns to the control plane with the same token; a bad token gets 400, the cookie cleared all the same', async () => {
    const st = stage(SLO_MOD);
    const token = sealSamlLogoutBounce(samlHandoffKey(SECRET, ROUTE), { id: '_r1', rs: '', h: 0, exp: now + 60 });
    const { out } = await logout(st, session(), `?slo=${encodeURIComponent(token)}`);
    expect(out!.status).toBe(302);
    expect(out!.headers!['set-cookie']).toBe(cleared);
    expect(out!.headers!.location).toBe(`${LOGOUT}?bounce=${encodeURIComponent(token).replace(/%2E/g, '.')}`);
    expect(new URL(String(out!.headers!.location)).searchParams.get('bounce')).toBe(token);
    // even with no session and single_logout off: the control plane is waiting to answer the IdP
    expect((await logout(stage({ logout_url: LOGOUT }), undefined, `?slo=${encodeURIComponent(token)}`)).out!.status).toBe(302);
    for (const bad of [
      'garbage',
      sealSamlLogoutBounce(samlHandoffKey(SECRET, ROUTE), { id: '_r1', rs: '', h: 0, exp: now - 1 }),
      sealSamlLogoutBounce(samlHandoffKey('another-secret', ROUTE), { id: '_r1', rs: '', h: 0, exp: now + 60 }),
      sealSamlHandoff(samlHandoffKey(SECRET, ROUTE), { sub: 'u', email: '', name: '', st: '', cb: '', exp: now + 60 }),
    ]) {
      const r = await logout(st, session(), `?slo=${encodeURIComponent(bad)}`);
      expect(r.out!.status).toBe(400);
      expect(r.out!.headers!['warren-error-code']).toBe('ERR_WARREN_7112');
      expect(r.out!.headers!['set-cookie']).toBe(cleared);
      expect(r.out!.headers!.location).toBeUndefined();
    }
  });
});
