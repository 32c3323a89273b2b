import { createHash, randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { startAgentProcess, tempDir, waitFor, type IngressProcess } from '../support/cluster.js';
import { formPost, type Browser, type BrowserResponse } from '../support/browser.js';
import type { TestIdp } from '../support/oidc-idp.js';
import type { FakeGithub } from '../support/github-fake.js';
import { startOAuthTestProviders, type OAuthTestProviders } from '../support/oauth-providers.js';
import { startSignInCluster, type SignInCluster } from '../support/sign-in-cluster.js';
import { AGENT_ONLINE_MS, CLUSTER_HOOK_MS, WORK_MS } from '../support/timeouts.js';

/**
 * The traffic policy's `oauth` and `openid-connect` actions on live traffic, on the same local
 * providers as the route modules' tests: a fake of GitHub's OAuth and REST endpoints (through
 * WARREN_OAUTH_PROVIDER_ENDPOINTS) and a real OpenID Provider (oidc-provider), both over HTTPS
 * trusted through NODE_EXTRA_CA_CERTS; two ingress nodes, a control plane, our agent and an
 * upstream that echoes the headers it got. Later rules authorize with the identity variables.
 * The OpenID Provider is on 127.0.0.1, so the control plane and the nodes run with
 * WARREN_OIDC_ALLOW_PRIVATE=1 (an `issuer_url` on a private or loopback host is refused otherwise).
 */

const HOST = 'tp-oauth.e2e.test';
/** A Bind endpoint of our agent with the policy (`--traffic-policy-file`), no edge. */
const EP_HOST = 'tp-oauth-endpoint.e2e.test';
const ORIGIN = `https://${HOST}`;
const GH_ID = 'gh-tp-e2e';
const GH_SECRET = `gh-${randomBytes(12).toString('hex')}`;
const OIDC_ID = 'oidc-tp-e2e';
const OIDC_SECRET = `oidc-${randomBytes(12).toString('hex')}`;

type Providers = OAuthTestProviders;

let c: SignInCluster<Providers>;
let gh: FakeGithub, idp: TestIdp;
let a: IngressProcess, b: IngressProcess, node: () => IngressProcess;
let edgeId: string, backendId: string;
/** Route ids by prefix. */
const routes = new Map<string, string>();

const browser = (): Browser => c.browser(() => node());
const JSON_ACCEPT = { headers: { accept: 'application/json' } };

const github = (extra: Record<string, unknown> = {}) => ({ type: 'oauth', config: { provider: 'github', client_id: GH_ID, client_secret: GH_SECRET, ...extra } });
/** The policy of the GitHub routes: sign in, deny anyone outside corp.test, pass the identity on. */
const githubPolicy = (extra: Record<string, unknown> = {}) => ({
  inbound: [
    { actions: [github(extra)] },
    { expressions: ["!actions.ngrok.oauth.identity.email.endsWith('@corp.test')"], actions: [{ type: 'custom-response', config: { status_code: 403, body: 'not for you', headers: { 'x-denied': 'yes' } } }] },
    // add-headers appends (as ngrok's): remove what the client sent first
    { actions: [{ type: 'remove-headers', config: { headers: ['x-user-email', 'x-user-id', 'x-user-name'] } }, { type: 'add-headers', config: { headers: { 'x-user-email': '${actions.ngrok.oauth.identity.email}', 'x-user-id': '${actions.ngrok.oauth.identity.provider_user_id}', 'x-user-name': '${actions.ngrok.oauth.identity.name}' } } }] },
  ],
});

async function route(match: string, policy: unknown): Promise<string> {
  const r = await c.route(match, { traffic_policy: { value: JSON.stringify(policy) } }, `${match}/probe`);
  routes.set(match, r.id);
  return r.id;
}

/** The session cookie's name on a route (`auth-actions.ts`: `__Host-warren.tp.<auth_id>.<route tag>`). */
const cookieName = (authId: string, routeId: string) => `__Host-warren.tp.${authId}.${createHash('sha256').update(routeId).digest('hex').slice(0, 8)}`;

const trail = (steps: BrowserResponse[]) => steps.map((s) => `${s.status} ${s.url.href}`).join('\n');

beforeAll(async () => {
  c = await startSignInCluster<Providers>({
    name: 'tp-oauth',
    host: HOST,
    moreHosts: [EP_HOST],
    providers: async (tls) => {
      const p = await startOAuthTestProviders(tls, { github: { clientId: GH_ID, clientSecret: GH_SECRET }, idp: { clientId: OIDC_ID, clientSecret: OIDC_SECRET, redirectUris: [`${ORIGIN}/oidc/ngrok/callback`] } });
      const gh = p.gh;
      gh.users.set('alice', { id: 101, login: 'alice', name: 'Alice Liddell', emails: [{ email: 'alice@corp.test', verified: true, primary: true }], orgs: [], teams: [] });
      gh.users.set('eve', { id: 104, login: 'eve', name: 'Eve', emails: [{ email: 'eve@evil.test', verified: true, primary: true }, { email: 'carol@corp.test', verified: false, primary: false }], orgs: [], teams: [] });
      return p;
    },
    controlPlaneEnv: { WARREN_OIDC_ALLOW_PRIVATE: '1' },
    ingressEnv: (tls, p) => ({ NODE_EXTRA_CA_CERTS: tls.caFile, WARREN_OIDC_ALLOW_PRIVATE: '1', WARREN_OAUTH_PROVIDER_ENDPOINTS: JSON.stringify({ github: p.gh.endpoints }) }),
  });
  ({ a, b, edgeId, backendId } = c);
  ({ gh, idp } = c.providers);
  node = () => a;
  await route('/gh', githubPolicy());
  await route('/gh2', githubPolicy());
  await route('/oidc', {
    inbound: [
      { actions: [{ type: 'openid-connect', config: { issuer_url: idp.issuer, client_id: OIDC_ID, client_secret: OIDC_SECRET, max_session_duration: '1h' } }] },
      { actions: [{ type: 'remove-headers', config: { headers: ['x-oidc-email', 'x-oidc-sub', 'x-oidc-expires'] } }, { type: 'add-headers', config: { headers: { 'x-oidc-email': '${actions.ngrok.oidc.identity.email}', 'x-oidc-sub': '${actions.ngrok.oidc.identity.provider_user_id}', 'x-oidc-expires': '${actions.ngrok.oidc.expires_at}' } } }] },
    ],
  });
}, CLUSTER_HOOK_MS);

afterAll(() => c?.stop(), 60_000);

describe('traffic policy oauth / openid-connect on live traffic', () => {
  it('oauth: an unauthenticated browser is sent to the provider (terminating); an API client gets 401 naming /ngrok/login', async () => {
    node = () => a;
    const br = browser();
    const r = await br.request(`${ORIGIN}/gh/page?x=1`);
    expect(r.status).toBe(302);
    const authz = new URL(r.headers.location!);
    expect(authz.origin).toBe(gh.origin);
    expect(authz.searchParams.get('redirect_uri')).toBe(`${ORIGIN}/gh/ngrok/callback`);
    expect(authz.searchParams.get('scope')).toBe('read:user user:email');
    expect(authz.searchParams.get('code_challenge_method')).toBe('S256');
    expect(authz.searchParams.get('state')).toMatch(/^[\w-]{43}$/);
    expect(r.headers['set-cookie']?.[0]).toMatch(/^__Host-warren\.tp\.github\.[0-9a-f]{8}\.login\.[^=]+=v1\..*; Path=\/; Max-Age=600; HttpOnly; SameSite=Lax; Secure$/);

    const api = await br.request(`${ORIGIN}/gh/api/items`, { ...JSON_ACCEPT, cookies: false });
    expect(api.status).toBe(401);
    expect(JSON.parse(api.body)).toMatchObject({ error_code: 'ERR_WARREN_7106' });
    expect(api.headers['www-authenticate']).toBe(`OAuth realm="${HOST}", login="${ORIGIN}/gh/ngrok/login?auth_id=github&redirect_path=%2Fgh%2Fapi%2Fitems"`);
  });

  it('oauth: a full sign-in reaches the upstream with the identity from later rules; the cookie works on the other node and stays away from the upstream', async () => {
    node = () => a;
    gh.signInAs = 'alice';
    const br = browser();
    const steps = await br.navigate(`${ORIGIN}/gh/page?x=1`);
    const last = steps.at(-1)!;
    expect(last.status, trail(steps)).toBe(200);
    expect(steps.some((s) => s.url.pathname === '/gh/ngrok/callback' && s.status === 302 && s.headers.location === '/gh/page?x=1')).toBe(true);
    const seen = JSON.parse(last.body);
    expect(seen.url).toBe('/gh/page?x=1');
    expect(seen.headers).toMatchObject({ 'x-user-email': 'alice@corp.test', 'x-user-id': '101', 'x-user-name': 'Alice Liddell' });
    expect(seen.headers.cookie).toBeUndefined();
    const name = cookieName('github', routes.get('/gh')!);
    expect(br.jar.get(HOST, name)).toMatch(/^v1\./);

    // a client cannot forge the identity: remove-headers drops what it sent, add-headers adds the real one
    const forged = await br.request(`${ORIGIN}/gh/who`, { headers: { accept: 'application/json', 'x-user-email': 'root@corp.test', 'ngrok-auth-user-email': 'root@corp.test', ngrok_auth_user_id: '1' } });
    expect(JSON.parse(forged.body).headers['x-user-email']).toBe('alice@corp.test');
    // nor send the modules' identity headers to an upstream moved from a module (review)
    expect(Object.keys(JSON.parse(forged.body).headers).filter((h) => h.replace(/_/g, '-').startsWith('ngrok-auth-'))).toEqual([]);

    node = () => b;
    expect((await br.request(`${ORIGIN}/gh/on-b`, JSON_ACCEPT)).status).toBe(200);

    // logout with ngrok's redirect_path, sanitized to this host
    node = () => a;
    const out = await br.request(`${ORIGIN}/gh/ngrok/logout?auth_id=github&redirect_path=/gh/bye`);
    expect(out.status).toBe(302);
    expect(out.headers.location).toBe(`${ORIGIN}/gh/bye`);
    expect(out.headers['set-cookie']?.[0]).toMatch(new RegExp(`^${name.replace(/\./g, '\\.')}=; Path=/; Max-Age=0`));
    expect((await br.request(`${ORIGIN}/gh/after`, JSON_ACCEPT)).status).toBe(401);
  });

  it('oauth: a later rule denies by actions.ngrok.oauth.identity.email (an unverified address does not count)', async () => {
    node = () => a;
    gh.signInAs = 'eve';
    const steps = await browser().navigate(`${ORIGIN}/gh/secret`);
    const last = steps.at(-1)!;
    expect(last.status, trail(steps)).toBe(403);
    expect(last.body).toBe('not for you');
    expect(last.headers['x-denied']).toBe('yes');
  });

  it("oauth: one route's session cookie is refused on another route with the same provider and app", async () => {
    node = () => a;
    gh.signInAs = 'alice';
    const br = browser();
    expect((await br.navigate(`${ORIGIN}/gh/x`)).at(-1)!.status).toBe(200);
    const session = br.jar.get(HOST, cookieName('github', routes.get('/gh')!))!;
    expect(session).toMatch(/^v1\./);
    // the same sealed value under /gh2's own cookie name, and under /gh's: neither opens /gh2
    const other = await br.request(`${ORIGIN}/gh2/x`, { headers: { accept: 'application/json', cookie: `${cookieName('github', routes.get('/gh2')!)}=${session}; ${cookieName('github', routes.get('/gh')!)}=${session}` }, cookies: false });
    expect(other.status).toBe(401);
    expect(other.headers['warren-error-code']).toBe('ERR_WARREN_7106');
  });

  it('the callback is CSRF-safe and the login path is no open redirect', async () => {
    node = () => a;
    // a callback without the browser's own pre-login cookie (a forged or replayed link)
    const forged = await browser().request(`${ORIGIN}/gh/ngrok/callback?code=abc&state=${'A'.repeat(43)}`, JSON_ACCEPT);
    expect(forged.status).toBe(400);
    expect(forged.headers['warren-error-code']).toBe('ERR_WARREN_7108');
    // redirect_path naming another site ends on the route instead
    gh.signInAs = 'alice';
    for (const evil of ['https://evil.test/x', '//evil.test/x', '/\\evil.test/x']) {
      const steps = await browser().navigate(`${ORIGIN}/gh/ngrok/login?auth_id=github&redirect_path=${encodeURIComponent(evil)}`);
      const cb = steps.find((s) => s.url.pathname === '/gh/ngrok/callback')!;
      expect(cb.headers.location, evil).toBe('/gh');
      expect(steps.every((s) => s.url.host !== 'evil.test')).toBe(true);
    }
    // an unknown auth_id is refused
    expect((await browser().request(`${ORIGIN}/gh/ngrok/login?auth_id=nope`, JSON_ACCEPT)).status).toBe(400);
  });

  it('openid-connect: signs in at the OpenID provider and later rules read actions.ngrok.oidc.*', async () => {
    node = () => b;
    const br = browser();
    const steps = await br.navigate(`${ORIGIN}/oidc/home`, (r) => {
      if (r.url.host !== new URL(idp.issuer).host || r.status !== 200) return null;
      if (r.body.includes('name="prompt" value="login"')) return formPost(r, { login: 'alice', password: 'any' });
      if (r.body.includes('name="prompt" value="consent"')) return formPost(r);
      return null;
    });
    const last = steps.at(-1)!;
    expect(last.status, trail(steps)).toBe(200);
    const authz = new URL(steps[0]!.headers.location!);
    expect(authz.searchParams.get('redirect_uri')).toBe(`${ORIGIN}/oidc/ngrok/callback`);
    expect(authz.searchParams.get('scope')).toBe('openid profile email');
    const seen = JSON.parse(last.body);
    expect(seen.headers).toMatchObject({ 'x-oidc-email': 'alice@example.test', 'x-oidc-sub': 'alice' });
    const expires = Date.parse(seen.headers['x-oidc-expires']);
    expect(expires - Date.now()).toBeGreaterThan(3500_000);
    expect(expires - Date.now()).toBeLessThanOrEqual(3600_000);
  });

  it('openid-connect: forced navigations keep at most three pre-login cookies of ~1 KB, so the host never answers 431 (audit: cookie bomb)', async () => {
    node = () => a;
    const br = browser();
    const prefix = `${cookieName('oidc', routes.get('/oidc')!)}.login.`;
    for (let i = 0; i < 12; i++) {
      const r = await br.request(`${ORIGIN}/oidc/p${i}?q=${'x'.repeat(1900)}`);
      expect(r.status, `navigation ${i}`).toBe(302);
      const logins = br.jar.names(HOST).filter((n) => n.startsWith(prefix));
      expect(logins.length).toBeLessThanOrEqual(3);
      expect(logins.every((n) => br.jar.get(HOST, n)!.length < 1200)).toBe(true);
      expect((br.jar.header(new URL(`${ORIGIN}/`)) ?? '').length).toBeLessThan(4 * 1024);
    }
    // the login path too (redirect_path bounded), and the browser can still sign in
    const login = await br.request(`${ORIGIN}/oidc/ngrok/login?redirect_path=${encodeURIComponent(`/oidc/back?q=${'z'.repeat(1900)}`)}`);
    expect(login.status).toBe(302);
    expect(br.jar.names(HOST).filter((n) => n.startsWith(prefix)).length).toBe(3);
    const steps = await br.navigate(login.headers.location!, (r) => {
      if (r.url.host !== new URL(idp.issuer).host || r.status !== 200) return null;
      if (r.body.includes('name="prompt" value="login"')) return formPost(r, { login: 'alice', password: 'any' });
      if (r.body.includes('name="prompt" value="consent"')) return formPost(r);
      return null;
    });
    expect(steps.at(-1)!.status, trail(steps)).toBe(200);
    expect(steps.find((s) => s.url.pathname === '/oidc/ngrok/callback')!.headers.location).toBe('/oidc/back');
  });

  it("oauth on a Bind endpoint's traffic policy (the SDK's traffic_policy, our agent's --traffic-policy-file): signs in, on either node", async () => {
    const dir = tempDir('warren-tp-oauth-ep-');
    const file = path.join(dir, 'policy.json');
    writeFileSync(file, JSON.stringify(githubPolicy()));
    const token = (await c.api('POST', '/credentials', {})).body.token as string;
    const upPort = (c.upstream.address() as { port: number }).port;
    const agent = startAgentProcess(['http', String(upPort), '--domain', EP_HOST, '--traffic-policy-file', file, '--authtoken', token, '--server', `localhost:${a.agent}`, '--ca', c.tls.caFile]);
    try {
      await agent.waitForOutput('online');
      gh.signInAs = 'alice';
      node = () => a;
      const br = browser();
      const origin = `https://${EP_HOST}`;
      const first = await br.request(`${origin}/page?x=1`);
      expect(first.status).toBe(302);
      expect(new URL(first.headers.location!).searchParams.get('redirect_uri')).toBe(`${origin}/ngrok/callback`);
      const steps = await br.navigate(`${origin}/page?x=1`);
      const last = steps.at(-1)!;
      expect(last.status, trail(steps)).toBe(200);
      const seen = JSON.parse(last.body);
      expect([seen.url, seen.headers['x-user-email'], seen.headers.cookie]).toEqual(['/page?x=1', 'alice@corp.test', undefined]);
      // Node b holds no tunnel of it: the request hops to a, where the policy runs and knows the cookie.
      node = () => b;
      const onB = await br.request(`${origin}/on-b`, JSON_ACCEPT);
      expect([onB.status, JSON.parse(onB.body).headers['x-user-email']]).toEqual([200, 'alice@corp.test']);
      // Without the cookie: the sign-in is required there too.
      expect((await br.request(`${origin}/api`, { ...JSON_ACCEPT, cookies: false })).status).toBe(401);
    } finally {
      node = () => a;
      await agent.stop({ timeoutMs: 10_000 });
    }
  }, AGENT_ONLINE_MS + WORK_MS);

  it('refuses a bad configuration with a 400 naming the field, without echoing the secret', async () => {
    const tryPolicy = (policy: unknown) =>
      c.api('POST', `/edges/https/${edgeId}/routes`, { match_type: 'path_prefix', match: `/bad-${randomBytes(3).toString('hex')}`, backend: { enabled: true, backend_id: backendId }, traffic_policy: { value: JSON.stringify(policy) } });
    const cases: Array<[unknown, string]> = [
      [{ inbound: [{ actions: [{ type: 'oauth', config: { provider: 'github', client_secret: GH_SECRET } }] }] }, 'inbound[0].actions[0].config.client_id'],
      [{ inbound: [{ actions: [{ type: 'oauth', config: { provider: 'myspace' } }] }] }, 'inbound[0].actions[0].config.provider'],
      [{ inbound: [{ actions: [{ type: 'openid-connect', config: { issuer_url: 'http://idp.test' } }] }] }, 'inbound[0].actions[0].config.issuer_url'],
      [{ inbound: [{ actions: [{ type: 'oauth', config: { provider: 'github', max_session_duration: '5s' } }] }] }, 'inbound[0].actions[0].config.max_session_duration'],
    ];
    for (const [policy, field] of cases) {
      const r = await tryPolicy(policy);
      expect(r.status, JSON.stringify(r.body)).toBe(400);
      expect(r.body.error_code).toBe('ERR_WARREN_6900');
      expect(r.body.msg).toContain(`traffic_policy.value: ${field}:`);
      expect(JSON.stringify(r.body)).not.toContain(GH_SECRET);
    }
  });

  it('a route whose oauth action has no client_id and client_secret answers 503 (Warren has no managed app)', async () => {
    const r = await c.api('POST', `/edges/https/${edgeId}/routes`, {
      match_type: 'path_prefix',
      match: '/managed',
      backend: { enabled: true, backend_id: backendId },
      traffic_policy: { value: JSON.stringify({ inbound: [{ actions: [{ type: 'oauth', config: { provider: 'google' } }] }] }) },
    });
    expect(r.status).toBe(201);
    const res = await waitFor('the /managed route applies', async () => {
      const x = await browser().request(`${ORIGIN}/managed/x`, JSON_ACCEPT);
      return x.headers['warren-error-code'] === 'ERR_WARREN_7010' ? x : null;
    });
    expect(res.status).toBe(503);
    expect(JSON.parse(res.body).msg).toContain('client_id and client_secret are required');
  });
});
