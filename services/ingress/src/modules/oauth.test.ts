import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Agent, fetch as undiciFetch } from 'undici';
import * as client from 'openid-client';
import { DiscoveryCache } from './oidc-discovery.js';
import { createOAuthStage, oauthScopes, oauthSessionPolicy } from './oauth.js';
import { MICROSOFT_CONSUMER_TENANT, PROVIDERS, parseEndpointOverrides, type OAuthProviderKind } from './oauth-providers.js';
import { emailAllowed, hasRules, isAllowed, rulesFrom, verifiedOidcEmail } from './oauth-rules.js';
import { DEFAULT_MAXIMUM_DURATION, getCookie } from './oidc-session.js';
import { makeConfig, makeEdge, makeRoute, makeState, testDeps } from './testing.js';
import type { RouteStage } from '../pipeline/types.js';
import { ensureLocalTls } from '../tls.js';
import { startFakeGithub, type FakeGithub } from '../../../../test/support/github-fake.js';
import { startFakeOAuth, type FakeOAuth, type FakeOAuthOptions } from '../../../../test/support/oauth2-fake.js';

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
    const callback = makeState({ url: cb.pathname + cb.search, headers: ['Host', 'app.example.test', 'Accept', 'text/html', 'Cookie', loginCookie] });
    const t0 = performance.now();
    const out = await st.onRequest!(callback);
    /** The callback alone (token exchange and the post-token phase), not the exchanges before it. */
    const callbackMs = performance.now() - t0;
    return { start, loginCookie, out, callbackMs };
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
    expect(cleared).toBe(`${loginCookie.slice(0, loginCookie.indexOf('='))}=; Path=/; Max-Age=0; HttpOnly; SameSite=Lax; Secure`);
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
    expect(String(denied.headers!['set-cookie'])).toMatch(/^__Host-warren\.oauth\.login\.[^=]+=; Path=\/; Max-Age=0;/);
  });

  it('bounds the whole post-token phase (user, emails, org and team pages) by one deadline: 502 past it', async () => {
    gh.delays.set('/user/orgs', 600);
    try {
      // each request would finish well within its own 10 s; the overall deadline (200 ms here) ends
      // it. Timed: the callback only (the sign-in's earlier exchanges are no part of the deadline);
      // without the deadline, it waits out the 600 ms orgs page.
      const { out, loginCookie, callbackMs } = await signIn(stage({ organizations: ['other'], teams: ['acme/ops'] }, 200), 'ann');
      expect(callbackMs).toBeLessThan(550);
      expect(out!.status).toBe(502);
      expect(out!.headers!['warren-error-code']).toBe('ERR_WARREN_7107');
      expect(out!.headers!['retry-after']).toBe('5');
      // one text for any unreachable provider (the cause, "did not finish within 0.2 s", is logged)
      expect(String(out!.body)).toContain('could not be reached; try again later');
      expect(String(out!.body)).not.toContain('did not finish');
      // the consumed pre-login cookie is cleared on this answer too
      expect(String(out!.headers!['set-cookie'])).toBe(`${loginCookie.slice(0, loginCookie.indexOf('='))}=; Path=/; Max-Age=0; HttpOnly; SameSite=Lax; Secure`);
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

describe('oauth with facebook, amazon, gitlab, linkedin, twitch and microsoft (local stand-ins over HTTPS)', () => {
  const MS = 'https://login.microsoftonline.com';
  let dir: string;
  let tls: Awaited<ReturnType<typeof ensureLocalTls>>;
  let agent: Agent;
  /** Microsoft's stand-in, reached as https://login.microsoftonline.com (openid-client's Entra issuer handling keys on that origin). */
  let msFake: FakeOAuth | undefined;
  const fakes: FakeOAuth[] = [];
  const mapped = (url: string) => (msFake && url.startsWith(`${MS}/`) ? msFake.origin + url.slice(MS.length) : url);
  const fetchVia: client.CustomFetch = (url, options) => undiciFetch(mapped(url), { ...options, dispatcher: agent } as never) as never;
  const discovery = () =>
    new DiscoveryCache((issuer, id, secret, timeout, auth = 'basic') =>
      client.discovery(issuer, id, secret, auth === 'post' ? client.ClientSecretPost(secret) : client.ClientSecretBasic(secret), { timeout, [client.customFetch]: fetchVia }),
    );

  beforeAll(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'warren-oauth-providers-'));
    tls = await ensureLocalTls(dir);
    agent = new Agent({ connect: { ca: tls.caPem! } });
  });
  afterAll(async () => {
    for (const f of fakes) await f.close();
    await agent?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  async function fake(o: Omit<FakeOAuthOptions, 'cert' | 'key' | 'clientId' | 'clientSecret' | 'host'>): Promise<FakeOAuth> {
    const f = await startFakeOAuth({ cert: tls.cert, key: tls.key, clientId: 'cid', clientSecret: 'c secret+/', host: 'localhost', ...o });
    fakes.push(f);
    return f;
  }

  const stage = (kind: OAuthProviderKind, f: FakeOAuth, provider: Record<string, unknown> = {}): RouteStage => {
    const eps = PROVIDERS[kind].family === 'oidc' ? { issuer: f.base } : f.endpoints;
    return createOAuthStage({ endpoints: kind === 'microsoft' ? '' : JSON.stringify({ [kind]: eps }), fetch: fetchVia, discovery: discovery() })(
      makeRoute({ oauth: { provider: { [kind]: { client_id: 'cid', client_secret: 'c secret+/', ...provider } }, cookie_prefix: 'warren.' } }),
      makeEdge(),
      makeConfig(),
      testDeps(),
    )!;
  };

  /** A browser's sign-in as `login` through the stage and the stand-in: the authorization URL, the callback's outcome and the session's identity headers. */
  async function signIn(st: RouteStage, f: FakeOAuth, login: string) {
    f.signInAs = login;
    const start = await st.onRequest!(makeState({ url: '/page', headers: ['Host', 'app.example.test', 'Accept', 'text/html'] }));
    expect(start!.status).toBe(302);
    const loginCookie = String(start!.headers!['set-cookie']).split(';')[0]!;
    const authzUrl = new URL(String(start!.headers!.location));
    const authz = await undiciFetch(mapped(authzUrl.href), { redirect: 'manual', dispatcher: agent });
    expect(authz.status).toBe(302);
    const cb = new URL(authz.headers.get('location')!);
    const out = await st.onRequest!(makeState({ url: cb.pathname + cb.search, headers: ['Host', 'app.example.test', 'Accept', 'text/html', 'Cookie', loginCookie] }));
    let identity: Record<string, string> | null = null;
    if (out!.status === 302) {
      const session = getCookie((out!.headers!['set-cookie'] as string[])[0]!, '__Host-warren.oauth');
      const s = makeState({ url: '/x', headers: ['Host', 'app.example.test', 'Cookie', `__Host-warren.oauth=${session}`, 'ngrok-auth-user-email', 'forged@corp.test'] });
      expect(await st.onRequest!(s)).toBeNull();
      identity = Object.fromEntries(
        Array.from({ length: s.headers.length / 2 }, (_, i) => [s.headers[2 * i]!.toLowerCase(), s.headers[2 * i + 1]!]).filter(([k]) => k!.startsWith('ngrok-auth-')),
      );
    }
    return { authz: authzUrl.searchParams, out: out!, identity };
  }

  // RFC 6749 2.3.1: id and secret form-urlencoded before Base64 (the space as `+`)
  const basic = `Basic ${Buffer.from('cid:c+secret%2B%2F').toString('base64')}`;

  it('gitlab: HTTP Basic client auth, PKCE and nonce; identity from the ID token; email only when verified', async () => {
    const f = await fake({ mode: 'oidc', auth: 'basic', pkce: 'required' });
    f.users.set('ann', { idToken: { sub: '101', email: 'ann@corp.test', email_verified: true, name: 'Ann Lab' }, userinfo: { sub: '101' } });
    f.users.set('bob', { idToken: { sub: '102', email: 'bob@corp.test', email_verified: false, name: 'Bob Lab' }, userinfo: { sub: '102' } });
    const { authz, out, identity } = await signIn(stage('gitlab', f), f, 'ann');
    expect(out.status).toBe(302);
    expect(authz.get('scope')).toBe('openid email profile');
    expect(authz.get('code_challenge_method')).toBe('S256');
    expect(authz.get('nonce')).toBeTruthy();
    expect(f.tokenRequests.at(-1)!.authorization).toBe(basic);
    expect(f.tokenRequests.at(-1)!.body.has('client_secret')).toBe(false);
    expect(identity).toEqual({ 'ngrok-auth-user-email': 'ann@corp.test', 'ngrok-auth-user-id': '101', 'ngrok-auth-user-name': 'Ann Lab' });
    // bob's address is unverified: no email header, and an email_domains rule refuses him
    expect((await signIn(stage('gitlab', f), f, 'bob')).identity).toEqual({ 'ngrok-auth-user-id': '102', 'ngrok-auth-user-name': 'Bob Lab' });
    expect((await signIn(stage('gitlab', f, { email_domains: ['corp.test'] }), f, 'ann')).out.status).toBe(302);
    expect((await signIn(stage('gitlab', f, { email_domains: ['corp.test'] }), f, 'bob')).out.status).toBe(403);
    expect(f.userRequests).toEqual([]);
  });

  it('linkedin: credentials in the body, no PKCE and no nonce', async () => {
    const f = await fake({ mode: 'oidc', auth: 'post', pkce: 'refused' });
    f.users.set('ann', { idToken: { sub: 'li-ann', email: 'Ann@Corp.test', email_verified: true, name: 'Ann In' }, userinfo: { sub: 'li-ann' } });
    f.users.set('eve', { idToken: { sub: 'li-eve', email: 'eve@evil.test', email_verified: true, name: 'Eve In' }, userinfo: { sub: 'li-eve' } });
    const { authz, out, identity } = await signIn(stage('linkedin', f, { email_domains: ['corp.test'] }), f, 'ann');
    expect(out.status).toBe(302);
    expect(authz.get('scope')).toBe('openid email profile');
    expect(authz.has('code_challenge')).toBe(false);
    expect(authz.has('nonce')).toBe(false);
    const tr = f.tokenRequests.at(-1)!;
    expect(tr.authorization).toBeNull();
    expect([tr.body.get('client_id'), tr.body.get('client_secret'), tr.body.has('code_verifier')]).toEqual(['cid', 'c secret+/', false]);
    expect(identity).toEqual({ 'ngrok-auth-user-email': 'Ann@Corp.test', 'ngrok-auth-user-id': 'li-ann', 'ngrok-auth-user-name': 'Ann In' });
    expect((await signIn(stage('linkedin', f, { email_domains: ['corp.test'] }), f, 'eve')).out.status).toBe(403);
  });

  it("twitch: credentials in the body, no PKCE, nonce, the claims parameter; preferred_username as the name; userinfo when the ID token lacks the email", async () => {
    const f = await fake({ mode: 'oidc', auth: 'post', pkce: 'refused' });
    f.users.set('ann', { idToken: { sub: '555', preferred_username: 'annstreams', email: 'ann@corp.test', email_verified: true }, userinfo: { sub: '555' } });
    f.users.set('eve', { idToken: { sub: '666', preferred_username: 'evestreams' }, userinfo: { sub: '666', email: 'eve@evil.test', email_verified: true, preferred_username: 'evestreams' } });
    const { authz, out, identity } = await signIn(stage('twitch', f, { email_domains: ['corp.test'] }), f, 'ann');
    expect(out.status).toBe(302);
    expect(authz.get('scope')).toBe('openid user:read:email');
    expect(authz.has('code_challenge')).toBe(false);
    expect(authz.get('nonce')).toBeTruthy();
    expect(JSON.parse(authz.get('claims')!)).toEqual({
      id_token: { email: null, email_verified: null, preferred_username: null },
      userinfo: { email: null, email_verified: null, preferred_username: null },
    });
    const tr = f.tokenRequests.at(-1)!;
    expect([tr.authorization, tr.body.get('client_id'), tr.body.get('client_secret')]).toEqual([null, 'cid', 'c secret+/']);
    expect(identity).toEqual({ 'ngrok-auth-user-email': 'ann@corp.test', 'ngrok-auth-user-id': '555', 'ngrok-auth-user-name': 'annstreams' });
    expect(f.userRequests).toEqual([]);
    // eve's ID token has no email: userinfo supplies it (verified, but outside the allowed domain)
    expect((await signIn(stage('twitch', f, { email_domains: ['corp.test'] }), f, 'eve')).out.status).toBe(403);
    expect(f.userRequests).toHaveLength(1);
    expect(f.userRequests[0]!.authorization).toMatch(/^Bearer [0-9a-f]{32}$/);
    expect((await signIn(stage('twitch', f), f, 'eve')).identity).toEqual({ 'ngrok-auth-user-email': 'eve@evil.test', 'ngrok-auth-user-id': '666', 'ngrok-auth-user-name': 'evestreams' });
  });

  it("microsoft: the {tenantid} issuer is checked against each token's tid; the email counts only with xms_edov or a personal account", async () => {
    msFake = await fake({ mode: 'oidc', auth: 'basic', pkce: 'required', publicOrigin: MS, base: '/common/v2.0', docIssuer: `${MS}/{tenantid}/v2.0` });
    const f = msFake;
    const T = '11111111-2222-3333-4444-555555555555';
    const user = (sub: string, tid: string, iss: string, more: Record<string, unknown> = {}) => ({ idToken: { sub, tid, iss, name: `User ${sub}`, email: `${sub}@corp.test`, ...more }, userinfo: { sub } });
    f.users.set('edov', user('edov', T, `${MS}/${T}/v2.0`, { xms_edov: true, email_verified: true }));
    f.users.set('plain', user('plain', T, `${MS}/${T}/v2.0`, { email_verified: true }));
    f.users.set('personal', user('personal', MICROSOFT_CONSUMER_TENANT, `${MS}/${MICROSOFT_CONSUMER_TENANT}/v2.0`));
    f.users.set('forged', user('forged', T, `${MS}/99999999-2222-3333-4444-555555555555/v2.0`, { xms_edov: true }));
    const rules = { email_domains: ['corp.test'] };

    const ok = await signIn(stage('microsoft', f, rules), f, 'edov');
    expect(ok.out.status).toBe(302);
    expect(ok.authz.get('scope')).toBe('openid email profile');
    expect(ok.authz.get('code_challenge_method')).toBe('S256');
    expect(ok.authz.get('nonce')).toBeTruthy();
    expect(f.tokenRequests.at(-1)!.authorization).toBe(basic);
    expect(ok.identity).toEqual({ 'ngrok-auth-user-email': 'edov@corp.test', 'ngrok-auth-user-id': 'edov', 'ngrok-auth-user-name': 'User edov' });
    expect((await signIn(stage('microsoft', f, rules), f, 'personal')).identity).toMatchObject({ 'ngrok-auth-user-email': 'personal@corp.test' });
    // email_verified does not vouch for a Microsoft address: no header, and the domain rule refuses
    expect((await signIn(stage('microsoft', f), f, 'plain')).identity).toEqual({ 'ngrok-auth-user-id': 'plain', 'ngrok-auth-user-name': 'User plain' });
    expect((await signIn(stage('microsoft', f, rules), f, 'plain')).out.status).toBe(403);
    // an ID token whose iss is another tenant's than its tid is refused
    const forged = await signIn(stage('microsoft', f), f, 'forged');
    expect(forged.out.status).toBe(400);
    expect(forged.identity).toBeNull();
  });

  it('facebook: PKCE, credentials in the body, then GET /me?fields=id,name,email with the bearer token', async () => {
    const f = await fake({ mode: 'oauth2', auth: 'post', pkce: 'required', base: '/dialog', userPath: '/me?fields=id,name,email' });
    f.users.set('ann', { userinfo: { id: '10001', name: 'Ann Book', email: 'ann@corp.test' } });
    f.users.set('nomail', { userinfo: { id: '10002', name: 'No Mail' } });
    const { authz, out, identity } = await signIn(stage('facebook', f, { email_domains: ['corp.test'] }), f, 'ann');
    expect(out.status).toBe(302);
    expect(authz.get('scope')).toBe('public_profile email');
    expect(authz.get('code_challenge_method')).toBe('S256');
    const tr = f.tokenRequests.at(-1)!;
    expect([tr.authorization, tr.body.get('client_id'), tr.body.get('client_secret')]).toEqual([null, 'cid', 'c secret+/']);
    expect(f.userRequests).toHaveLength(1);
    expect(f.userRequests[0]!.url).toBe('/me?fields=id,name,email');
    expect(f.userRequests[0]!.authorization).toMatch(/^Bearer [0-9a-f]{32}$/);
    expect(identity).toEqual({ 'ngrok-auth-user-email': 'ann@corp.test', 'ngrok-auth-user-id': '10001', 'ngrok-auth-user-name': 'Ann Book' });
    expect((await signIn(stage('facebook', f, { email_domains: ['corp.test'] }), f, 'nomail')).out.status).toBe(403);
    expect((await signIn(stage('facebook', f), f, 'nomail')).identity).toEqual({ 'ngrok-auth-user-id': '10002', 'ngrok-auth-user-name': 'No Mail' });
  });

  it('amazon: PKCE, credentials in the body, then GET /user/profile (user_id, name, email)', async () => {
    const f = await fake({ mode: 'oauth2', auth: 'post', pkce: 'required', base: '/auth/o2', userPath: '/user/profile' });
    f.users.set('ann', { userinfo: { user_id: 'amzn1.account.ANN', name: 'Ann Zon', email: 'ann@corp.test' } });
    f.users.set('eve', { userinfo: { user_id: 'amzn1.account.EVE', name: 'Eve Zon', email: 'eve@evil.test' } });
    const { authz, out, identity } = await signIn(stage('amazon', f, { email_addresses: ['ann@corp.test'] }), f, 'ann');
    expect(out.status).toBe(302);
    expect(authz.get('scope')).toBe('profile');
    expect(authz.get('code_challenge_method')).toBe('S256');
    expect(f.tokenRequests.at(-1)!.body.get('client_secret')).toBe('c secret+/');
    expect(f.userRequests.map((r) => r.url)).toEqual(['/user/profile']);
    expect(f.userRequests[0]!.authorization).toMatch(/^Bearer [0-9a-f]{32}$/);
    expect(identity).toEqual({ 'ngrok-auth-user-email': 'ann@corp.test', 'ngrok-auth-user-id': 'amzn1.account.ANN', 'ngrok-auth-user-name': 'Ann Zon' });
    expect((await signIn(stage('amazon', f, { email_addresses: ['ann@corp.test'] }), f, 'eve')).out.status).toBe(403);
  });
});
