import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import type { DpRoute } from '@warren/shared';
import type { RequestState } from '../pipeline/types.js';
import { deriveSessionKeys, newSession, seal } from '../modules/oidc-session.js';
import { trafficPolicyStage } from './index.js';
import { actionsOf } from './activation.js';
import { CONFIG, EDGE, deps, request, route } from './testing.js';

const SECRET = 'unit-client-secret';
const CLIENT = 'unit-client';
const github = (extra: Record<string, unknown> = {}) => ({ type: 'oauth', config: { provider: 'github', client_id: CLIENT, client_secret: SECRET, ...extra } });
const policy = (extra: Record<string, unknown> = {}) => ({
  inbound: [{ actions: [github(extra)] }, { expressions: ["actions.ngrok.oauth.identity.email != 'alice@corp.test'"], actions: [{ type: 'deny' }] }],
});

function stage(value: unknown, r: Partial<DpRoute> = {}) {
  const rt = { ...route(value), ...r } as DpRoute;
  return { rt, st: trafficPolicyStage(rt, EDGE, CONFIG, deps())! };
}

/** A request with the Node-parsed headers the sign-in reads (cookie, accept). */
function req(url: string, o: { cookie?: string; accept?: string; method?: string; headers?: Record<string, string> } = {}): RequestState {
  const extra: string[] = [];
  if (o.cookie) extra.push('Cookie', o.cookie);
  const s = request({ url, method: o.method, headers: ['Host', 'app.example.com', ...extra] });
  Object.assign(s.req.headers, { ...(o.cookie ? { cookie: o.cookie } : {}), ...(o.accept ? { accept: o.accept } : {}), ...o.headers });
  return s;
}

const cookieName = (authId: string, routeId: string) => `__Host-warren.tp.${authId}.${createHash('sha256').update(routeId).digest('hex').slice(0, 8)}`;

function sessionCookie(routeId: string, email: string, now = Math.floor(Date.now() / 1000)): string {
  const keys = deriveSessionKeys('policy/oauth', SECRET, routeId, 'github\0github', CLIENT);
  return `${cookieName('github', routeId)}=${seal(keys.session, 'session', newSession({ sub: '101', email, name: 'Alice' }, now, { maximumDuration: 86400, inactivityTimeout: 0 }))}`;
}

describe('oauth action in the engine', () => {
  it('terminates without a session: 302 to the provider for a browser, 401 otherwise', async () => {
    const { st } = stage(policy({ authz_url_params: { allow_signup: 'false' }, scopes: ['read:org'] }));
    const nav = (await st.onRequest!(req('/page?x=1', { accept: 'text/html' })))!;
    expect(nav.status).toBe(302);
    const loc = new URL(String(nav.headers?.location));
    expect(loc.origin + loc.pathname).toBe('https://github.com/login/oauth/authorize');
    expect(loc.searchParams.get('allow_signup')).toBe('false');
    expect(loc.searchParams.get('scope')).toBe('read:user user:email read:org');
    expect(loc.searchParams.get('redirect_uri')).toBe('https://app.example.com/ngrok/callback');
    const api = (await st.onRequest!(req('/api')))!;
    expect(api.status).toBe(401);
    expect(api.headers?.['www-authenticate']).toContain('login="https://app.example.com/ngrok/login?auth_id=github&redirect_path=%2Fapi"');
  });

  it('goes on with a valid session: later rules read the identity, the cookie is removed from what goes upstream', async () => {
    const { rt, st } = stage(policy());
    const ok = req('/page', { cookie: `${sessionCookie(rt.id, 'alice@corp.test')}; app=1` });
    expect(await st.onRequest!(ok)).toBeNull();
    expect(actionsOf(ok).ngrok.oauth.identity).toMatchObject({ email: 'alice@corp.test', name: 'Alice', provider_user_id: '101' });
    expect(actionsOf(ok).ngrok.oauth.identity.id).toMatch(/^idn_/);
    expect(actionsOf(ok).ngrok.oauth.expires_at).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    expect(ok.headers).toEqual(['Host', 'app.example.com', 'Cookie', 'app=1']);

    const denied = await st.onRequest!(req('/page', { cookie: sessionCookie(rt.id, 'eve@evil.test') }));
    expect(denied?.status).toBe(403);
  });

  it("refuses another route's session, and lets a CORS preflight through only when allowed", async () => {
    const { rt } = stage(policy());
    const { st: other } = stage(policy(), { id: 'rt_2' });
    const foreign = sessionCookie(rt.id, 'alice@corp.test').split('=').slice(1).join('=');
    expect((await other.onRequest!(req('/x', { cookie: `${cookieName('github', 'rt_2')}=${foreign}` })))?.status).toBe(401);

    const preflight = () => req('/x', { method: 'OPTIONS', headers: { origin: 'https://web.example', 'access-control-request-method': 'POST' } });
    expect((await stage(policy()).st.onRequest!(preflight()))?.status).toBe(401);
    const { st: cors } = stage({ inbound: [{ actions: [github({ allow_cors_preflight: true })] }] });
    expect(await cors.onRequest!(preflight())).toBeNull();
    expect((await cors.onRequest!(req('/x', { method: 'OPTIONS' })))?.status).toBe(401);
  });

  it('counts as a CORS preflight only an OPTIONS with Origin and Access-Control-Request-Method and no body (review)', async () => {
    const { st: cors } = stage({ inbound: [{ actions: [github({ allow_cors_preflight: true })] }] });
    const options = (headers: Record<string, string>) => req('/x', { method: 'OPTIONS', headers });
    const acrm = { 'access-control-request-method': 'POST' };
    const origin = { origin: 'https://web.example' };
    expect(await cors.onRequest!(options({ ...origin, ...acrm, 'content-length': '0' }))).toBeNull();
    for (const h of [acrm, { ...origin, ...acrm, 'content-length': '12' }, { ...origin, ...acrm, 'transfer-encoding': 'chunked' }, { ...origin, ...acrm, 'content-length': '' }])
      expect((await cors.onRequest!(options(h)))?.status, JSON.stringify(h)).toBe(401);
  });

  it("removes client-sent ngrok-auth-* headers and the actions' cookies from every request, as the modules do (review)", async () => {
    const { rt, st } = stage({ inbound: [{ expressions: ["!req.path.startsWith('/public')"], actions: [github()] }] });
    const forged = (path: string, cookie?: string) => {
      const s = request({ url: path, headers: ['Host', 'app.example.com', 'Ngrok-Auth-User-Email', 'ceo@corp.test', 'ngrok_auth_user_id', '1', 'X-App', 'a', ...(cookie ? ['Cookie', cookie] : [])] });
      if (cookie) s.req.headers.cookie = cookie;
      return s;
    };
    const signedIn = forged('/page', sessionCookie(rt.id, 'alice@corp.test'));
    expect(await st.onRequest!(signedIn)).toBeNull();
    expect(signedIn.headers).toEqual(['Host', 'app.example.com', 'X-App', 'a']);
    // The action does not run here: still stripped, and a pre-login cookie does not go upstream.
    const pub = forged('/public', `__Host-warren.tp.github.${createHash('sha256').update(rt.id).digest('hex').slice(0, 8)}.login.abcdefghijklmnop=x; app=1`);
    expect(await st.onRequest!(pub)).toBeNull();
    expect(pub.headers).toEqual(['Host', 'app.example.com', 'X-App', 'a', 'Cookie', 'app=1']);
  });

  it('names the pre-login cookie __Host-… with Path=/ on HTTPS, and ignores one without the prefix there (login CSRF; review)', async () => {
    const { rt, st } = stage(policy());
    const tag = createHash('sha256').update(rt.id).digest('hex').slice(0, 8);
    const login = (await st.onRequest!(req('/ngrok/login?redirect_path=/x')))!;
    const set = String(login.headers?.['set-cookie']);
    expect(set).toMatch(new RegExp(`^__Host-warren\\.tp\\.github\\.${tag}\\.login\\.[\\w-]{16}=`));
    expect(set).toContain('; Path=/;');
    expect(set).toContain('; Secure');
    expect(set).not.toMatch(/Domain=/i);
    // Plain HTTP: no prefix (browsers refuse it there), Path=the route's prefix (so that a new sign-in sees, and caps, the others).
    const http: RequestState = { ...req('/ngrok/login?redirect_path=/x'), scheme: 'http' };
    const plain = String((await st.onRequest!(http))!.headers?.['set-cookie']);
    expect(plain).toMatch(new RegExp(`^warren\\.tp\\.github\\.${tag}\\.login\\.`));
    expect(plain).toContain('; Path=/;');
    expect(plain).not.toContain('Secure');

    // A sealed pre-login state of the planter's, under the name without the prefix (what a
    // sibling subdomain could set) is not read on HTTPS; under the __Host- name it is.
    const keys = deriveSessionKeys('policy/oauth', SECRET, rt.id, 'github\0github', CLIENT);
    const state = 'planted-state-0123456789abcdef';
    const sealed = seal(keys.login, 'login', { state, nonce: 'n', verifier: 'v', returnTo: '/x', exp: Math.floor(Date.now() / 1000) + 300 });
    const name = `warren.tp.github.${tag}.login.${state.slice(0, 16)}`;
    const callback = (cookie: string) => req(`/ngrok/callback?state=${state}&error=access_denied`, { cookie: `${cookie}=${sealed}` });
    const planted = (await st.onRequest!(callback(name)))!;
    expect(planted.status).toBe(400);
    expect(String(planted.body)).toContain('started in another browser');
    const own = (await st.onRequest!(callback(`__Host-${name}`)))!;
    expect(own.status).toBe(400);
    expect(String(own.body)).toContain('the provider answered access_denied');
    expect(String(own.headers?.['set-cookie'])).toMatch(new RegExp(`^__Host-${name.replace(/\./g, '\\.')}=; Path=/; Max-Age=0`));
  });

  it('answers the special paths before any rule, and refuses what it cannot run with a throw (503)', async () => {
    const { st } = stage({ inbound: [{ expressions: ["req.path.startsWith('/admin')"], actions: [github()] }] });
    const login = (await st.onRequest!(req('/ngrok/login?redirect_path=//evil.test/x')))!;
    expect(login.status).toBe(302);
    const cb = (await st.onRequest!(req('/ngrok/callback?code=x&state=abc')))!;
    expect(cb.status).toBe(400);
    expect((await st.onRequest!(req('/ngrok/login?auth_id=other')))!.status).toBe(400);
    expect((await st.onRequest!(req('/ngrok/other')))).toBeNull();
    expect((await st.onRequest!(req('/public')))).toBeNull();

    expect(() => stage(policy(), { matchType: 'exact_path', match: '/x' })).toThrow(/exact_path/);
    expect(() => stage({ inbound: [{ actions: [{ type: 'oauth', config: { provider: 'github' } }] }] })).toThrow(/client_id and client_secret are required/);
  });
});
