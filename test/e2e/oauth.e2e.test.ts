import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { waitFor, type IngressProcess } from '../support/cluster.js';
import { formPost, type Browser, type BrowserResponse } from '../support/browser.js';
import type { TestIdp } from '../support/oidc-idp.js';
import type { FakeGithub } from '../support/github-fake.js';
import { startOAuthTestProviders, type OAuthTestProviders } from '../support/oauth-providers.js';
import { startSignInCluster, type SignInCluster } from '../support/sign-in-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * The `oauth` route module on live traffic, two ingress nodes pointed at local providers through
 * WARREN_OAUTH_PROVIDER_ENDPOINTS: a fake of GitHub's OAuth and REST endpoints (github) and a real
 * OpenID Provider (oidc-provider) standing in for Google, both over HTTPS trusted through
 * NODE_EXTRA_CA_CERTS. A scripted browser signs in; the upstream echoes the headers it got.
 */

const HOST = 'oauth.e2e.test';
const ORIGIN = `https://${HOST}`;
const GH_ID = 'gh-e2e';
const GH_SECRET = `gh-${randomBytes(12).toString('hex')}`;
const G_ID = 'google-e2e';
const G_SECRET = `g-${randomBytes(12).toString('hex')}`;

type Providers = OAuthTestProviders;

let c: SignInCluster<Providers>;
let gh: FakeGithub, idp: TestIdp;
/** The two ingress nodes, and which one the browser's requests to HOST reach. */
let a: IngressProcess, b: IngressProcess, node: () => IngressProcess;
let edgeId: string, backendId: string;

const api = (method: string, p: string, body?: unknown) => c.api(method, p, body);
const browser = (): Browser => c.browser(() => node());

async function route(match: string, oauth: Record<string, unknown>): Promise<void> {
  await c.route(match, { oauth }, `${match}/x`);
}

const github = (rules: Record<string, unknown>, extra: Record<string, unknown> = {}) => ({ provider: { github: { client_id: GH_ID, client_secret: GH_SECRET, ...rules } }, ...extra });

/** A GitHub sign-in as `login` (the fake authorizes at once); the steps of the browser. */
async function githubSignIn(url: string, login: string): Promise<BrowserResponse[]> {
  gh.signInAs = login;
  return browser().navigate(url, () => null);
}

beforeAll(async () => {
  c = await startSignInCluster<Providers>({
    name: 'oauth',
    host: HOST,
    providers: async (tls) => {
      const p = await startOAuthTestProviders(tls, { github: { clientId: GH_ID, clientSecret: GH_SECRET }, idp: { clientId: G_ID, clientSecret: G_SECRET, redirectUris: [`${ORIGIN}/g/.warren/oauth/callback`] } });
      const gh = p.gh;
      gh.users.set('alice', { id: 101, login: 'alice', name: 'Alice Liddell', emails: [{ email: 'alice@corp.test', verified: true, primary: true }], orgs: ['acme'], teams: ['acme/ops'] });
      gh.users.set('bob', { id: 102, login: 'bob', name: null, emails: [{ email: 'bob@corp.test', verified: true, primary: true }], orgs: [], teams: [] });
      gh.users.set('carol', { id: 103, login: 'carol', name: 'Carol', emails: [{ email: 'carol@corp.test', verified: true, primary: true }], orgs: ['other'], teams: ['other/ops'] });
      gh.users.set('eve', { id: 104, login: 'eve', name: 'Eve', emails: [{ email: 'eve@evil.test', verified: true, primary: true }, { email: 'carol@corp.test', verified: false, primary: false }], orgs: [], teams: [] });
      return p;
    },
    ingressEnv: (tls, p) => ({ NODE_EXTRA_CA_CERTS: tls.caFile, WARREN_OAUTH_PROVIDER_ENDPOINTS: JSON.stringify({ github: p.gh.endpoints, google: { issuer: p.idp.issuer } }) }),
  });
  ({ a, b, edgeId, backendId } = c);
  ({ gh, idp } = c.providers);
  node = () => a;
  await route('/org', github({ organizations: ['acme'] }, { cookie_prefix: 'org.' }));
  await route('/team', github({ teams: ['acme/ops'] }, { cookie_prefix: 'team.' }));
  await route('/mail', github({ email_addresses: ['carol@corp.test'] }, { cookie_prefix: 'mail.' }));
  await route('/g', { provider: { google: { client_id: G_ID, client_secret: G_SECRET, email_domains: ['example.test'] } }, cookie_prefix: 'g.' });
}, CLUSTER_HOOK_MS);

afterAll(() => c?.stop(), 60_000);

describe('oauth on live traffic', () => {
  it('github: an org member signs in, the identity reaches the upstream, the cookie works on the other node; logout ends it', async () => {
    node = () => a;
    gh.signInAs = 'alice';
    const br = browser();
    const steps = await br.navigate(`${ORIGIN}/org/page?x=1`, () => null);
    const last = steps.at(-1)!;
    expect(last.status, steps.map((s) => `${s.status} ${s.url.href}`).join('\n')).toBe(200);
    const authz = new URL(steps[0]!.headers.location!);
    expect(authz.origin).toBe(gh.origin);
    expect(authz.searchParams.get('redirect_uri')).toBe(`${ORIGIN}/org/.warren/oauth/callback`);
    expect(authz.searchParams.get('scope')).toBe('read:user user:email read:org');
    const seen = JSON.parse(last.body);
    expect(seen.url).toBe('/org/page?x=1');
    expect(seen.headers).toMatchObject({ 'ngrok-auth-user-email': 'alice@corp.test', 'ngrok-auth-user-id': '101', 'ngrok-auth-user-name': 'Alice Liddell' });
    expect(gh.requests.some((r) => r.startsWith('GET /api/v3/user/orgs'))).toBe(true);

    const forged = await br.request(`${ORIGIN}/org/who`, { headers: { accept: 'application/json', 'ngrok-auth-user-email': 'root@evil.test' } });
    expect(JSON.parse(forged.body).headers['ngrok-auth-user-email']).toBe('alice@corp.test');
    expect(JSON.parse(forged.body).headers.cookie).toBeUndefined();
    node = () => b;
    expect((await br.request(`${ORIGIN}/org/on-b`, { headers: { accept: 'application/json' } })).status).toBe(200);

    const out = await br.request(`${ORIGIN}/org/.warren/oauth/logout`);
    expect(out.status).toBe(200);
    expect(out.headers['set-cookie']?.[0]).toMatch(/^__Host-org\.oauth=; Path=\/; Max-Age=0/);
    expect((await br.request(`${ORIGIN}/org/after`, { headers: { accept: 'application/json' } })).status).toBe(401);
  });

  it('github: organizations, teams and email_addresses each admit a match and refuse others with 403', async () => {
    node = () => a;
    const cases: Array<[string, string, number]> = [
      ['/org', 'bob', 403], // no org
      ['/team', 'alice', 200], // acme/ops
      ['/team', 'carol', 403], // other/ops is not acme/ops
      ['/mail', 'carol', 200], // verified carol@corp.test
      ['/mail', 'bob', 403],
      ['/mail', 'eve', 403], // carol@corp.test, but unverified
    ];
    for (const [prefix, login, status] of cases) {
      const steps = await githubSignIn(`${ORIGIN}${prefix}/p`, login);
      const last = steps.at(-1)!;
      expect(last.status, `${login} on ${prefix}`).toBe(status);
      if (status === 403) {
        expect(last.headers['warren-error-code']).toBe('ERR_WARREN_7109');
        expect(last.body).toContain('is not allowed to use this route');
        // no session is set; only the spent pre-login cookie is cleared
        const set = ([] as string[]).concat(last.headers['set-cookie'] ?? []);
        expect(set.some((c) => /^__Host-[^=]*oauth=v1\./.test(c))).toBe(false);
        expect(set.every((c) => /\.oauth\.login\.[^=]+=; Path=[^;]+; Max-Age=0/.test(c))).toBe(true);
      } else {
        expect(JSON.parse(last.body).headers['ngrok-auth-user-id']).toBe(String(gh.users.get(login)!.id));
      }
    }
  });

  it('an API client without a session gets 401 naming the login URL', async () => {
    node = () => b;
    const r = await browser().request(`${ORIGIN}/team/api/items`, { method: 'POST', headers: { accept: 'application/json' } });
    expect(r.status).toBe(401);
    expect(JSON.parse(r.body)).toMatchObject({ error_code: 'ERR_WARREN_7106', status_code: 401 });
    expect(r.headers['www-authenticate']).toBe(`OAuth realm="${HOST}", login="${ORIGIN}/team/.warren/oauth/login?return_to=%2Fteam%2Fapi%2Fitems"`);
  });

  it('google (an OpenID provider): signs in through discovery, admits by verified email domain', async () => {
    node = () => a;
    const br = browser();
    const steps = await br.navigate(`${ORIGIN}/g/page`, (r) => {
      if (r.url.host !== new URL(idp.issuer).host || r.status !== 200) return null;
      if (r.body.includes('name="prompt" value="login"')) return formPost(r, { login: 'alice', password: 'any' });
      if (r.body.includes('name="prompt" value="consent"')) return formPost(r);
      return null;
    });
    const last = steps.at(-1)!;
    expect(last.status, steps.map((s) => `${s.status} ${s.url.href}`).join('\n')).toBe(200);
    const authz = new URL(steps[0]!.headers.location!);
    expect(authz.origin).toBe(idp.issuer);
    expect(authz.searchParams.get('scope')).toBe('openid email profile');
    expect(authz.searchParams.get('redirect_uri')).toBe(`${ORIGIN}/g/.warren/oauth/callback`);
    expect(JSON.parse(last.body).headers).toMatchObject({ 'ngrok-auth-user-email': 'alice@example.test', 'ngrok-auth-user-id': 'alice', 'ngrok-auth-user-name': 'Alice Example' });
    expect(br.jar.get(HOST, '__Host-g.oauth')).toMatch(/^v1\./);
  });

  it('a route without client_id and client_secret answers 503 (Warren has no managed app)', async () => {
    const r = await api('POST', `/edges/https/${edgeId}/routes`, { match_type: 'path_prefix', match: '/managed', backend: { enabled: true, backend_id: backendId }, oauth: { provider: { github: {} } } });
    expect(r.status).toBe(201);
    const res = await waitFor('the /managed route applies', async () => {
      const x = await browser().request(`${ORIGIN}/managed/x`, { headers: { accept: 'application/json' } });
      return x.headers['warren-error-code'] === 'ERR_WARREN_7010' ? x : null;
    });
    expect(res.status).toBe(503);
    expect(JSON.parse(res.body).msg).toContain('client_id and client_secret are required');
  });
});
