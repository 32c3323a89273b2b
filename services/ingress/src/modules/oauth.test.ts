import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Agent, fetch as undiciFetch } from 'undici';
import * as client from 'openid-client';
import { DiscoveryCache } from './oidc-discovery.js';
import { createOAuthStage, oauthScopes, oauthSessionPolicy } from './oauth.js';
import { PROVIDERS, parseEndpointOverrides } from './oauth-providers.js';
import { emailAllowed, hasRules, isAllowed, rulesFrom, verifiedOidcEmail } from './oauth-rules.js';
import { DEFAULT_MAXIMUM_DURATION, getCookie } from './oidc-session.js';
import { makeConfig, makeEdge, makeRoute, makeState, testDeps } from './testing.js';
import type { RouteStage } from '../pipeline/types.js';
import { ensureLocalTls } from '../tls.js';
import { startFakeGithub, type FakeGithub } from '../../../../test/support/github-fake.js';

describe('oauth authorization rules', () => {
  const r = rulesFrom({ email_addresses: ['Ann@Example.test'], email_domains: ['corp.test'], organizations: ['Acme'], teams: ['acme/Ops'] });

  it('admits any user when no list is set', async () => {
    expect(hasRules(rulesFrom({}))).toBe(false);
    expect(await isAllowed(rulesFrom({}), { verifiedEmails: [] })).toBe(true);
  });

  it('matches emails and domains in lower case, only among verified addresses', () => {
    expect(emailAllowed(r, ['ann@example.TEST'])).toBe(true);
    expect(emailAllowed(r, ['bob@CORP.test'])).toBe(true);
    expect(emailAllowed(r, ['bob@sub.corp.test', 'bob@corp.test.evil'])).toBe(false);
    expect(emailAllowed(r, [])).toBe(false);
  });

  it('checks organizations and teams lazily, only when the email rules do not admit', async () => {
    let fetched = 0;
    const orgs = async () => (fetched++, ['acme']);
    expect(await isAllowed(r, { verifiedEmails: ['ann@example.test'], organizations: orgs })).toBe(true);
    expect(fetched).toBe(0);
    expect(await isAllowed(r, { verifiedEmails: ['x@y.test'], organizations: orgs })).toBe(true);
    expect(await isAllowed(r, { verifiedEmails: [], organizations: async () => ['other'], teams: async () => ['ACME/ops'] })).toBe(true);
    expect(await isAllowed(r, { verifiedEmails: [], organizations: async () => ['other'], teams: async () => ['other/ops', 'acme/dev'] })).toBe(false);
  });

  it('counts an OpenID email only when the provider vouches for it', () => {
    expect(verifiedOidcEmail('google', { email: 'a@b.test', email_verified: true }, 'T')).toBe('a@b.test');
    expect(verifiedOidcEmail('google', { email: 'a@b.test', email_verified: false }, 'T')).toBeNull();
    expect(verifiedOidcEmail('google', { email: 'a@b.test' }, 'T')).toBeNull();
    // Microsoft: the email claim is unverified unless xms_edov says so, or a personal account
    expect(verifiedOidcEmail('microsoft', { email: 'a@b.test', email_verified: true }, 'T')).toBeNull();
    expect(verifiedOidcEmail('microsoft', { email: 'a@b.test', xms_edov: true }, 'T')).toBe('a@b.test');
    expect(verifiedOidcEmail('microsoft', { email: 'a@b.test', tid: 'T' }, 'T')).toBe('a@b.test');
  });
});

describe('oauth configuration', () => {
  it('derives scopes: defaults per provider, read:org for org rules, openid always for OpenID providers', () => {
    expect(oauthScopes(PROVIDERS.github, [], false)).toBe('read:user user:email');
    expect(oauthScopes(PROVIDERS.github, undefined, true)).toBe('read:user user:email read:org');
    expect(oauthScopes(PROVIDERS.github, ['repo'], true)).toBe('repo');
    expect(oauthScopes(PROVIDERS.google, ['email'], false)).toBe('openid email');
    expect(oauthScopes(PROVIDERS.twitch, [], false)).toBe('openid user:read:email');
  });

  it('bounds the session by auth_check_interval', () => {
    expect(oauthSessionPolicy({})).toEqual({ maximumDuration: DEFAULT_MAXIMUM_DURATION, inactivityTimeout: 0 });
    expect(oauthSessionPolicy({ maximum_duration: 7200, auth_check_interval: 600, inactivity_timeout: 60 })).toEqual({ maximumDuration: 600, inactivityTimeout: 60 });
    expect(oauthSessionPolicy({ maximum_duration: 300, auth_check_interval: 600 }).maximumDuration).toBe(300);
  });

  it('parses endpoint overrides: https only, known providers and fields', () => {
    expect(parseEndpointOverrides(undefined)).toEqual({});
    expect(parseEndpointOverrides('{"github":{"api":"https://ghe.test/api/v3/","token":"https://ghe.test/login/oauth/access_token"},"google":{"issuer":"https://idp.test/realms/x"}}')).toEqual({
      github: { api: 'https://ghe.test/api/v3', token: 'https://ghe.test/login/oauth/access_token' },
      google: { issuer: 'https://idp.test/realms/x' },
    });
    expect(() => parseEndpointOverrides('{"github":{"api":"http://ghe.test"}}')).toThrow(/https/);
    expect(() => parseEndpointOverrides('{"myspace":{}}')).toThrow(/unknown provider/);
    expect(() => parseEndpointOverrides('{"google":{"token":"https://x.test"}}')).toThrow(/not a field/);
    expect(() => parseEndpointOverrides('nope')).toThrow(/not JSON/);
  });

  it('refuses a route without client_id and client_secret (no managed app), and exact_path routes', () => {
    const f = createOAuthStage({ endpoints: '' });
    expect(f(makeRoute({}), makeEdge(), makeConfig(), testDeps())).toBeNull();
    expect(f(makeRoute({ oauth: { enabled: false, provider: { google: {} } } }), makeEdge(), makeConfig(), testDeps())).toBeNull();
    expect(() => f(makeRoute({ oauth: { provider: { google: { client_id: '', client_secret: '' } } } }), makeEdge(), makeConfig(), testDeps())).toThrow(/client_id and client_secret are required/);
    expect(() => f(makeRoute({ oauth: { provider: { github: { client_id: 'a', client_secret: 'b' } } } }, { matchType: 'exact_path', match: '/x' }), makeEdge(), makeConfig(), testDeps())).toThrow(/exact_path/);
    expect(() => createOAuthStage({ endpoints: '{' })(makeRoute({ oauth: { provider: { github: { client_id: 'a', client_secret: 'b' } } } }), makeEdge(), makeConfig(), testDeps())).toThrow(/WARREN_OAUTH_PROVIDER_ENDPOINTS/);
  });
});

describe('discovery of a multi-tenant Microsoft issuer', () => {
  it("keeps each client's own discovered Configuration (it carries the {tenantid} issuer check)", async () => {
    const calls: string[] = [];
    const meta: client.ServerMetadata = { issuer: 'https://login.microsoftonline.com/{tenantid}/v2.0', authorization_endpoint: 'https://login.microsoftonline.com/common/oauth2/v2.0/authorize', token_endpoint: 'https://login.microsoftonline.com/common/oauth2/v2.0/token' };
    const d = new DiscoveryCache(async (_u, id, secret, _t, auth) => {
      calls.push(`${id}:${auth ?? 'basic'}`);
      return new client.Configuration(meta, id, secret);
    });
    const issuer = 'https://login.microsoftonline.com/common/v2.0';
    const c1 = await d.config(issuer, 'app1', 's1');
    expect(await d.config(issuer, 'app1', 's1')).toBe(c1);
    await d.config(issuer, 'app2', 's2', 'post');
    // the first fetch (the document), then one per client
    expect(calls).toEqual(['app1:basic', 'app1:basic', 'app2:post']);
  });
});

describe('oauth with github (a local fake of GitHub over HTTPS)', () => {
  let gh: FakeGithub;
  let dir: string;
  let agent: Agent;
  const fetchVia: client.CustomFetch = (url, options) => undiciFetch(url, { ...options, dispatcher: agent } as never) as never;

  beforeAll(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'warren-oauth-unit-'));
    const tls = await ensureLocalTls(dir);
    agent = new Agent({ connect: { ca: tls.caPem! } });
    gh = await startFakeGithub({ cert: tls.cert, key: tls.key, clientId: 'ghid', clientSecret: 'ghsecret', host: 'localhost' });
    gh.users.set('ann', { id: 7, login: 'ann', name: 'Ann A', emails: [{ email: 'ann@old.test', verified: false, primary: false }, { email: 'Ann@Corp.test', verified: true, primary: true }], orgs: ['acme'], teams: ['acme/ops'] });
    gh.users.set('bob', { id: 8, login: 'bob', name: null, emails: [{ email: 'bob@corp.test', verified: false, primary: true }], orgs: [], teams: [] });
  });
  afterAll(async () => {
    await gh?.close();
    await agent?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const stage = (provider: Record<string, unknown>, githubDeadlineMs?: number): RouteStage =>
    createOAuthStage({ endpoints: JSON.stringify({ github: gh.endpoints }), fetch: fetchVia, githubDeadlineMs })(
      makeRoute({ oauth: { provider: { github: { client_id: 'ghid', client_secret: 'ghsecret', ...provider } }, cookie_prefix: 'warren.' } }),
      makeEdge(),
      makeConfig(),
      testDeps(),
    )!;

  /** Runs a browser's sign-in as `login` through the stage and the fake; the callback's outcome. */
  async function signIn(st: RouteStage, login: string | null) {
    gh.signInAs = login;
    const start = await st.onRequest!(makeState({ url: '/page', headers: ['Host', 'app.example.test', 'Accept', 'text/html'] }));
    expect(start!.status).toBe(302);
    const loginCookie = String(start!.headers!['set-cookie']).split(';')[0]!;
    const authz = await undiciFetch(String(start!.headers!.location), { redirect: 'manual', dispatcher: agent });
    const cb = new URL(authz.headers.get('location')!);
    expect(cb.origin + cb.pathname).toBe('https://app.example.test/.warren/oauth/callback');
    return { start, loginCookie, out: await st.onRequest!(makeState({ url: cb.pathname + cb.search, headers: ['Host', 'app.example.test', 'Accept', 'text/html', 'Cookie', loginCookie] })) };
  }

  it('signs in, asks read:org for org rules, and sets the identity from the verified primary email', async () => {
    const st = stage({ organizations: ['ACME'] });
    const { start, loginCookie, out } = await signIn(st, 'ann');
    const authz = new URL(String(start!.headers!.location));
    expect(authz.searchParams.get('scope')).toBe('read:user user:email read:org');
    expect(authz.searchParams.get('code_challenge_method')).toBe('S256');
    expect(out!.status).toBe(302);
    expect(out!.headers!.location).toBe('/page');
    // the session (__Host- on https) and the consumed pre-login cookie cleared: two Set-Cookie
    const [sessionCookie, cleared] = out!.headers!['set-cookie'] as string[];
    const session = getCookie(sessionCookie, '__Host-warren.oauth');
    expect(session).toMatch(/^v1\./);
    expect(cleared).toBe(`${loginCookie.slice(0, loginCookie.indexOf('='))}=; Path=/.warren/oauth/callback; Max-Age=0; HttpOnly; SameSite=Lax; Secure`);
    const s = makeState({ url: '/x', headers: ['Host', 'app.example.test', 'Cookie', `__Host-warren.oauth=${session}`, 'ngrok-auth-user-id', 'forged'] });
    expect(await st.onRequest!(s)).toBeNull();
    const h = Object.fromEntries(Array.from({ length: s.headers.length / 2 }, (_, i) => [s.headers[2 * i]!.toLowerCase(), s.headers[2 * i + 1]!]));
    expect(h).toMatchObject({ 'ngrok-auth-user-email': 'Ann@Corp.test', 'ngrok-auth-user-id': '7', 'ngrok-auth-user-name': 'Ann A' });
  });

  it('admits by team or email domain; refuses with 403 when nothing matches', async () => {
    expect((await signIn(stage({ teams: ['acme/ops'] }), 'ann')).out!.status).toBe(302);
    expect((await signIn(stage({ email_domains: ['corp.test'] }), 'ann')).out!.status).toBe(302);
    const refused = (await signIn(stage({ teams: ['acme/dev'], organizations: ['other'] }), 'ann')).out!;
    expect(refused.status).toBe(403);
    expect(refused.headers!['warren-error-code']).toBe('ERR_WARREN_7109');
    expect(String(refused.body)).toContain('not allowed');
    // bob's only address is unverified: an email rule does not admit him
    expect((await signIn(stage({ email_addresses: ['bob@corp.test'] }), 'bob')).out!.status).toBe(403);
  });

  it('any GitHub user is allowed when no list is set; the user refusing at GitHub is a 400', async () => {
    expect((await signIn(stage({}), 'bob')).out!.status).toBe(302);
    const denied = (await signIn(stage({}), null)).out!;
    expect(denied.status).toBe(400);
    expect(String(denied.body)).toContain('access_denied');
    expect(String(denied.headers!['set-cookie'])).toMatch(/^warren\.oauth\.login\.[^=]+=; Path=\/\.warren\/oauth\/callback; Max-Age=0;/);
  });

  it('bounds the whole post-token phase (user, emails, org and team pages) by one deadline: 502 past it', async () => {
    gh.delays.set('/user/orgs', 600);
    try {
      const t0 = Date.now();
      // each request would finish well within its own 10 s; the overall deadline (200 ms here) ends it
      const { out, loginCookie } = await signIn(stage({ organizations: ['other'], teams: ['acme/ops'] }, 200), 'ann');
      expect(Date.now() - t0).toBeLessThan(550);
      expect(out!.status).toBe(502);
      expect(out!.headers!['warren-error-code']).toBe('ERR_WARREN_7107');
      expect(out!.headers!['retry-after']).toBe('5');
      expect(String(out!.body)).toContain('did not finish within 0.2 s');
      // the consumed pre-login cookie is cleared on this answer too
      expect(String(out!.headers!['set-cookie'])).toBe(`${loginCookie.slice(0, loginCookie.indexOf('='))}=; Path=/.warren/oauth/callback; Max-Age=0; HttpOnly; SameSite=Lax; Secure`);
      // past the deadline no further request is made (the teams check would come after the orgs page)
      const seen = gh.requests.length;
      await new Promise((r) => setTimeout(r, 700));
      expect(gh.requests.slice(seen).filter((r) => r.includes('/user/teams'))).toEqual([]);
      // within the deadline the same slow GitHub signs in
      expect((await signIn(stage({ organizations: ['other'], teams: ['acme/ops'] }, 5_000), 'ann')).out!.status).toBe(302);
    } finally {
      gh.delays.clear();
    }
  });
});
