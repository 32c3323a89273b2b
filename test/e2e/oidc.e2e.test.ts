import http from 'node:http';
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { waitFor, type IngressProcess } from '../support/cluster.js';
import { formPost, type Browser, type BrowserResponse } from '../support/browser.js';
import { startTestIdp, type TestIdp } from '../support/oidc-idp.js';
import { startSignInCluster, type SignInCluster } from '../support/sign-in-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * The `oidc` route module on live traffic: a real OpenID Provider (oidc-provider over HTTPS, in
 * this process, trusted by the ingress nodes through NODE_EXTRA_CA_CERTS), a control plane, two
 * ingress nodes, our agent and an upstream that echoes the headers it got. A scripted browser
 * (cookie jar, redirects, the provider's dev login and consent forms) signs in.
 *
 * The provider is on 127.0.0.1: the control plane and node a run with WARREN_OIDC_ALLOW_PRIVATE=1
 * (an issuer on a private or loopback host is refused otherwise). Node b runs without it, as an
 * ingress does by default: it must refuse to connect to that issuer (SSRF guard).
 */

const HOST = 'oidc.e2e.test';
const CLIENT_ID = 'warren-e2e';
const CLIENT_SECRET = `e2e-${randomBytes(16).toString('hex')}`;
const ORIGIN = `https://${HOST}`;

let c: SignInCluster<TestIdp>;
let idp: TestIdp;
/** The two ingress nodes, and which one the browser's requests to HOST reach. */
let a: IngressProcess, b: IngressProcess, node: () => IngressProcess;
/** The edge and the backend the routes are made of (from the cluster). */
let edgeId: string, backendId: string;

const api = (method: string, p: string, body?: unknown) => c.api(method, p, body);
const browser = (): Browser => c.browser(() => node());

/** Follows a sign-in through the provider's dev login (as `user`) and consent pages. */
async function signIn(br: Browser, url: string, user = 'alice'): Promise<BrowserResponse[]> {
  return br.navigate(url, (r) => {
    if (r.url.host !== new URL(idp.issuer).host || r.status !== 200) return null;
    if (r.body.includes('name="prompt" value="login"')) return formPost(r, { login: user, password: 'any' });
    if (r.body.includes('name="prompt" value="consent"')) return formPost(r);
    return null;
  });
}

async function route(match: string, oidc: Record<string, unknown>): Promise<string> {
  return (await c.route(match, { oidc: { issuer: idp.issuer, client_id: CLIENT_ID, client_secret: CLIENT_SECRET, ...oidc } })).id;
}

beforeAll(async () => {
  c = await startSignInCluster({
    name: 'oidc',
    host: HOST,
    providers: (tls) =>
      startTestIdp({
        cert: tls.cert,
        key: tls.key,
        clientId: CLIENT_ID,
        clientSecret: CLIENT_SECRET,
        redirectUris: [`${ORIGIN}/.warren/oidc/callback`, `${ORIGIN}/short/.warren/oidc/callback`, `${ORIGIN}/idle/.warren/oidc/callback`],
      }),
    controlPlaneEnv: { WARREN_OIDC_ALLOW_PRIVATE: '1' },
    ingressEnv: (tls, _idp, n) => ({ NODE_EXTRA_CA_CERTS: tls.caFile, ...(n === 'a' ? { WARREN_OIDC_ALLOW_PRIVATE: '1' } : {}) }),
    upstreamSetCookie: 'app=1; Path=/',
  });
  ({ a, b, providers: idp, edgeId, backendId } = c);
  node = () => a;
  await route('/', {});
  await route('/short', { cookie_prefix: 'short.', maximum_duration: 2 });
  await route('/idle', { cookie_prefix: 'idle.', maximum_duration: 3600, inactivity_timeout: 2 });
}, CLUSTER_HOOK_MS);

afterAll(() => c?.stop(), 60_000);

describe('oidc on live traffic', () => {
  it('sends an unauthenticated browser to the provider, and an API client gets 401', async () => {
    node = () => a;
    const br = browser();
    const r = await br.request(`${ORIGIN}/app/page?x=1`);
    expect(r.status).toBe(302);
    const loc = new URL(r.headers.location!);
    expect(loc.origin).toBe(idp.issuer);
    expect(loc.searchParams.get('redirect_uri')).toBe(`${ORIGIN}/.warren/oidc/callback`);
    expect(loc.searchParams.get('scope')).toBe('openid profile email');
    expect(loc.searchParams.get('code_challenge_method')).toBe('S256');
    expect(r.headers['set-cookie']?.[0]).toMatch(/^__Host-warren\.oidc\.login\.[^=]+=v1\..*; Path=\/; Max-Age=600; HttpOnly; SameSite=Lax; Secure$/);

    const apiRes = await br.request(`${ORIGIN}/api/items`, { headers: { accept: 'application/json' }, cookies: false });
    expect(apiRes.status).toBe(401);
    expect(JSON.parse(apiRes.body)).toMatchObject({ error_code: 'ERR_WARREN_7106', status_code: 401 });
    expect(apiRes.headers['www-authenticate']).toContain(`login="${ORIGIN}/.warren/oidc/login?return_to=%2Fapi%2Fitems"`);
  });

  it('signs in through the provider and forwards the identity; the cookie works on the other node', async () => {
    node = () => a;
    const br = browser();
    const steps = await signIn(br, `${ORIGIN}/app/page?x=1`);
    const last = steps.at(-1)!;
    expect(steps.some((s) => s.url.pathname === '/.warren/oidc/callback' && s.status === 302 && s.headers.location === '/app/page?x=1')).toBe(true);
    expect(last.status, steps.map((s) => `${s.status} ${s.url.href}`).join('\n')).toBe(200);
    const seen = JSON.parse(last.body);
    expect(seen.url).toBe('/app/page?x=1');
    expect(seen.headers).toMatchObject({ 'ngrok-auth-user-email': 'alice@example.test', 'ngrok-auth-user-id': 'alice', 'ngrok-auth-user-name': 'Alice Example' });
    expect(seen.headers.cookie ?? '').not.toContain('warren.oidc');
    const session = br.jar.get(HOST, '__Host-warren.oidc');
    expect(session).toMatch(/^v1\./);
    const setCookie = steps.find((s) => s.url.pathname === '/.warren/oidc/callback')!.headers['set-cookie']![0]!;
    expect(setCookie).toMatch(/^__Host-warren\.oidc=v1\.[^;]+; Path=\/; Max-Age=\d+; HttpOnly; SameSite=Lax; Secure$/);
    // the provider was asked for the code exchange and userinfo (the ID token lacks email and name)
    expect(idp.requests.some((r) => r.startsWith('POST /token'))).toBe(true);
    expect(idp.requests.some((r) => r.startsWith('GET /me'))).toBe(true);

    // forged identity headers are replaced; the app's own cookies still reach it
    br.jar.set(HOST, 'mine', 'yes');
    const forged = await br.request(`${ORIGIN}/who`, { headers: { 'ngrok-auth-user-email': 'root@evil.test', 'Ngrok-Auth-User-Id': 'root' } });
    expect(JSON.parse(forged.body).headers).toMatchObject({ 'ngrok-auth-user-email': 'alice@example.test', 'ngrok-auth-user-id': 'alice' });
    expect(JSON.parse(forged.body).headers.cookie).toBe('app=1; mine=yes');

    // the same cookie on the other ingress node
    node = () => b;
    const onB = await br.request(`${ORIGIN}/on-b`, { headers: { accept: 'application/json' } });
    expect(onB.status).toBe(200);
    expect(JSON.parse(onB.body).headers['ngrok-auth-user-email']).toBe('alice@example.test');

    // a tampered cookie is no session (node a: b may not reach the loopback provider to start a sign-in)
    node = () => a;
    const bad = session!.slice(0, 20) + (session![20] === 'A' ? 'B' : 'A') + session!.slice(21);
    const tampered = await br.request(`${ORIGIN}/x`, { headers: { accept: 'application/json', cookie: `__Host-warren.oidc=${bad}` } });
    expect(tampered.status).toBe(401);
    const forgedCookie = await br.request(`${ORIGIN}/x`, { headers: { cookie: '__Host-warren.oidc=v1.eyJzdWIiOiJyb290In0' } });
    expect(forgedCookie.status).toBe(302);

    // logout clears it
    node = () => a;
    const out = await br.request(`${ORIGIN}/.warren/oidc/logout`);
    expect(out.status).toBe(200);
    expect(out.headers['set-cookie']?.[0]).toMatch(/^__Host-warren\.oidc=; Path=\/; Max-Age=0/);
    expect(br.jar.get(HOST, '__Host-warren.oidc')).toBeUndefined();
    expect((await br.request(`${ORIGIN}/after-logout`, { headers: { accept: 'application/json' } })).status).toBe(401);
  });

  it('a callback without its sign-in state fails with 400, never an open redirect', async () => {
    node = () => a;
    const br = browser();
    const r = await br.request(`${ORIGIN}/.warren/oidc/callback?code=x&state=y`);
    expect(r.status).toBe(400);
    expect(r.headers['warren-error-code']).toBe('ERR_WARREN_7108');
    const login = await br.request(`${ORIGIN}/.warren/oidc/login?return_to=${encodeURIComponent('https://evil.test/')}`);
    expect(login.status).toBe(302);
    const steps = await signIn(br, login.headers.location!);
    expect(steps.find((s) => s.url.pathname === '/.warren/oidc/callback')!.headers.location).toBe('/');
  });

  it('ends a session after maximum_duration, and after inactivity_timeout', async () => {
    node = () => a;
    const idle = browser();
    const idleSteps = await signIn(idle, `${ORIGIN}/idle/page`, 'carol');
    expect(idleSteps.at(-1)!.status).toBe(200);
    const br = browser();
    const steps = await signIn(br, `${ORIGIN}/short/page`, 'bob');
    expect(steps.at(-1)!.status).toBe(200);
    expect(JSON.parse(steps.at(-1)!.body).headers['ngrok-auth-user-email']).toBe('bob@example.test');
    expect(br.jar.get(HOST, '__Host-short.oidc')).toMatch(/^v1\./);
    // keep the cookie past its Max-Age, as a client that ignores it would
    const cookie = br.jar.get(HOST, '__Host-short.oidc')!;
    await new Promise((r) => setTimeout(r, 3100));
    const late = await br.request(`${ORIGIN}/short/page`, { headers: { cookie: `__Host-short.oidc=${cookie}` } });
    expect(late.status).toBe(302);
    expect(new URL(late.headers.location!).searchParams.get('redirect_uri')).toBe(`${ORIGIN}/short/.warren/oidc/callback`);
    // idle for more than inactivity_timeout (its cookie is still within its Max-Age)
    const idleLate = await idle.request(`${ORIGIN}/idle/page`, { headers: { accept: 'application/json' } });
    expect(idleLate.status).toBe(401);
  });

  it('answers 502 at once when the provider is unreachable', async () => {
    node = () => a;
    // a port nothing listens on
    const probe = http.createServer();
    const downPort = await new Promise<number>((r) => probe.listen(0, '127.0.0.1', () => r((probe.address() as { port: number }).port)));
    await new Promise((r) => probe.close(r));
    const r = await api('POST', `/edges/https/${edgeId}/routes`, {
      match_type: 'path_prefix',
      match: '/down',
      backend: { enabled: true, backend_id: backendId },
      oidc: { issuer: `https://127.0.0.1:${downPort}`, client_id: CLIENT_ID, client_secret: CLIENT_SECRET, cookie_prefix: 'down.' },
    });
    expect(r.status).toBe(201);
    const br = browser();
    const res = await waitFor('the /down route applies', async () => {
      const x = await br.request(`${ORIGIN}/down/x`);
      return x.headers['warren-error-code'] === 'ERR_WARREN_7107' ? x : null;
    });
    expect(res.status).toBe(502);
    // one text whatever the cause: a client learns nothing of which ports answer (audit: SSRF port scan)
    expect(res.body).toContain('the OpenID provider of this route could not be reached; try again later');
    expect(res.body).not.toMatch(/ECONN|127\.0\.0\.1|discovery/);
  });

  it('an ingress without WARREN_OIDC_ALLOW_PRIVATE refuses to connect to an issuer on a private address (audit: SSRF)', async () => {
    // node b: the route's issuer is the provider on 127.0.0.1 (saved through a control plane that allows it)
    node = () => b;
    const br = browser();
    const before = idp.requests.length;
    for (const url of [`${ORIGIN}/ssrf/page`, `${ORIGIN}/.warren/oidc/login?return_to=/x`]) {
      const r = await br.request(url);
      expect(r.status, url).toBe(502);
      expect(r.headers['warren-error-code']).toBe('ERR_WARREN_7107');
      expect(r.body).toContain('the OpenID provider of this route could not be reached; try again later');
      expect(r.body).not.toMatch(/ECONN|127\.0\.0\.1|not a public address/);
    }
    expect(idp.requests.length).toBe(before);
    expect(br.jar.names(HOST).filter((n) => n.includes('.login.'))).toEqual([]);
    // node a (allowed) still signs in through the same route
    node = () => a;
    expect((await signIn(browser(), `${ORIGIN}/ssrf/page`)).at(-1)!.status).toBe(200);
  });

  it('keeps the pre-login cookies a few KB however many navigations a page forces, so the host never answers 431 (audit: cookie bomb)', async () => {
    node = () => a;
    const br = browser();
    for (let i = 0; i < 12; i++) {
      const r = await br.request(`${ORIGIN}/bomb/p${i}?q=${'x'.repeat(1900)}`);
      expect(r.status, `navigation ${i}`).toBe(302);
      expect(br.jar.names(HOST).filter((n) => n.startsWith('__Host-warren.oidc.login.')).length).toBeLessThanOrEqual(3);
      expect((br.jar.header(new URL(`${ORIGIN}/`)) ?? '').length).toBeLessThan(4 * 1024);
    }
    // the browser still reaches the host and signs in, returning to its page (the over-long query dropped)
    const steps = await signIn(br, `${ORIGIN}/after-bomb?q=${'y'.repeat(1900)}`);
    expect(steps.at(-1)!.status, steps.map((s) => `${s.status} ${s.url.href}`).join('\n')).toBe(200);
    expect(steps.find((s) => s.url.pathname === '/.warren/oidc/callback')!.headers.location).toBe('/after-bomb');
  });
});
