import { afterEach, describe, expect, it } from 'vitest';
import { oneAction, refusal } from './testing.js';
import { compileExpression, parseTrafficPolicy, validateTrafficPolicy } from './index.js';
import { AUTH_ACTION_LIMITS, OIDC_ALLOW_PRIVATE_ENV, issuerProblem, oidcPrivateAllowed } from './auth-actions.js';
import { JWKS_ALLOW_PRIVATE_ENV, checkJwksUrl, jwksHostRefusal, privateHostRefusal } from './jwt-action.js';
import { CelActions } from './cel-vars.js';
import { recordAuthRun } from './auth-action-vars.js';

const fails = (doc: unknown) => refusal(doc, true);
const oauth = (config: unknown) => oneAction({ type: 'oauth', config });
const oidc = (config: unknown) => oneAction({ type: 'openid-connect', config });
const P = 'inbound[0].actions[0].config';
const SECRET = 'top-secret-client-secret';

describe('oauth action config', () => {
  it('parses ngrok fields with defaults: auth_id = provider, one day, no idle limit', () => {
    const p = parseTrafficPolicy(`
inbound:
  - actions:
      - type: oauth
        config: {provider: GitHub}
      - type: oauth
        config:
          provider: google
          auth_id: staff
          client_id: cid
          client_secret: ${SECRET}
          scopes: [https://www.googleapis.com/auth/calendar.readonly]
          authz_url_params: {hd: example.com, prompt: select_account}
          max_session_duration: 8h
          idle_session_timeout: 30m
          userinfo_refresh_interval: 1h
          allow_cors_preflight: true
`);
    expect(p.inbound[0]!.actions[0]).toEqual({
      type: 'oauth',
      config: { provider: 'github', auth_id: 'github', client_id: '', client_secret: '', scopes: [], authz_url_params: {}, maxSessionSeconds: 86400, idleTimeoutSeconds: 0, userinfoRefreshSeconds: 0, allow_cors_preflight: false },
    });
    expect(p.inbound[0]!.actions[1]).toEqual({
      type: 'oauth',
      config: {
        provider: 'google',
        auth_id: 'staff',
        client_id: 'cid',
        client_secret: SECRET,
        scopes: ['https://www.googleapis.com/auth/calendar.readonly'],
        authz_url_params: { hd: 'example.com', prompt: 'select_account' },
        maxSessionSeconds: 8 * 3600,
        idleTimeoutSeconds: 1800,
        userinfoRefreshSeconds: 3600,
        allow_cors_preflight: true,
      },
    });
  });

  it.each<[unknown, string, RegExp]>([
    [{}, `${P}.provider`, /is required/],
    [{ provider: 'okta' }, `${P}.provider`, /not supported; supported: github, facebook/],
    [{ provider: 'github', client_id: 'x' }, `${P}.client_secret`, /given together/],
    [{ provider: 'github', client_secret: SECRET }, `${P}.client_id`, /given together/],
    [{ provider: 'github', client_id: 7 }, `${P}.client_id`, /must be a string/],
    [{ provider: 'github', client_id: 'x', client_secret: '${secrets.get("v","k")}' }, `${P}.client_secret`, /CEL interpolation/],
    [{ provider: 'github', auth_id: 'a b' }, `${P}.auth_id`, /not an auth id/],
    [{ provider: 'github', scopes: ['a b'] }, `${P}.scopes[0]`, /not a scope/],
    [{ provider: 'github', scopes: 'read:user' }, `${P}.scopes`, /must be a list/],
    [{ provider: 'github', authz_url_params: { state: 'x' } }, `${P}.authz_url_params.state`, /set by the sign-in flow/],
    [{ provider: 'github', authz_url_params: { redirect_uri: 'https://evil.test/' } }, `${P}.authz_url_params.redirect_uri`, /set by the sign-in flow/],
    [{ provider: 'github', authz_url_params: { hd: 1 } }, `${P}.authz_url_params.hd`, /must be a string/],
    [{ provider: 'github', max_session_duration: '10s' }, `${P}.max_session_duration`, /from 1m to 2160h/],
    [{ provider: 'github', max_session_duration: 'forever' }, `${P}.max_session_duration`, /not a duration/],
    [{ provider: 'github', idle_session_timeout: 30 }, `${P}.idle_session_timeout`, /duration string/],
    [{ provider: 'github', idle_session_timeout: '5m', idle_session_duration: '5m' }, `${P}.idle_session_duration`, /not both/],
    [{ provider: 'github', userinfo_refresh_interval: '2161h' }, `${P}.userinfo_refresh_interval`, /from 1m/],
    [{ provider: 'github', allow_cors_preflight: 'yes' }, `${P}.allow_cors_preflight`, /true or false/],
    [{ provider: 'github', auth_cookie_domain: 'example.com' }, `${P}.auth_cookie_domain`, /not supported/],
    [{ provider: 'github', allow_emails: ['a@b.c'] }, `${P}.allow_emails`, /unknown field/],
  ])('refuses %j naming %s', (config, path, message) => {
    const e = fails(oauth(config));
    expect(e.path).toBe(path);
    expect(e.message).toMatch(message);
    expect(e.message).not.toContain(SECRET);
  });

  it('runs on inbound rules only, and needs a config', () => {
    expect(fails(oneAction({ type: 'oauth', config: { provider: 'github' } }, 'outbound')).path).toBe('outbound[0].actions[0].type');
    expect(fails(oneAction({ type: 'oauth' })).path).toBe('inbound[0].actions[0].config');
  });

  it('refuses two different actions with one auth_id, and accepts the same action twice', () => {
    const doc = (b: Record<string, unknown>) => ({ inbound: [{ actions: [{ type: 'oauth', config: { provider: 'github' } }] }, { actions: [{ type: 'oauth', config: b }] }] });
    expect(fails(doc({ provider: 'github', scopes: ['read:org'] })).path).toBe('inbound[1].actions[0].config.auth_id');
    expect(validateTrafficPolicy(doc({ provider: 'github' }), { checkCost: true }).inbound).toHaveLength(2);
    expect(validateTrafficPolicy(doc({ provider: 'github', auth_id: 'other', scopes: ['read:org'] }), { checkCost: true }).inbound).toHaveLength(2);
  });
});

describe('openid-connect action config', () => {
  it('parses issuer_url and the common fields; idle_session_duration is the idle limit', () => {
    const p = validateTrafficPolicy(oidc({ issuer_url: 'https://idp.example.com/realms/x', client_id: 'c', client_secret: SECRET, scopes: ['groups'], idle_session_duration: '15m' }), { checkCost: true });
    expect(p.inbound[0]!.actions[0]).toMatchObject({ type: 'openid-connect', config: { issuer_url: 'https://idp.example.com/realms/x', auth_id: 'oidc', scopes: ['groups'], idleTimeoutSeconds: 900 } });
  });

  it.each<[unknown, string, RegExp]>([
    [{}, `${P}.issuer_url`, /is required/],
    [{ issuer_url: 'http://idp.example.com' }, `${P}.issuer_url`, /https URL/],
    [{ issuer_url: 'https://idp.example.com/?a=1' }, `${P}.issuer_url`, /query or fragment/],
    [{ issuer_url: 'https://u:p@idp.example.com' }, `${P}.issuer_url`, /credentials/],
    [{ issuer_url: 'https://idp.example.com', client_id: 'c' }, `${P}.client_secret`, /given together/],
    [{ issuer_url: 'https://idp.example.com', provider: 'google' }, `${P}.provider`, /unknown field/],
  ])('refuses %j naming %s', (config, path, message) => {
    const e = fails(oidc(config));
    expect(e.path).toBe(path);
    expect(e.message).toMatch(message);
  });

  it('issuerProblem bounds the length', () => {
    expect(issuerProblem(`https://a.example/${'x'.repeat(AUTH_ACTION_LIMITS.issuerBytes)}`)).toMatch(/at most/);
    expect(issuerProblem('https://a.example')).toBeNull();
  });
});

describe('openid-connect / oidc issuer hosts (SSRF: the shared ingress fetches the issuer; audit)', () => {
  const PRIVATE = [
    'https://127.0.0.1:5432/x',
    'https://127.1/',
    'https://0x7f000001/',
    'https://localhost/',
    'https://LOCALHOST.:8443/',
    'https://idp.localhost/',
    'https://[::1]:8443/',
    'https://[::ffff:127.0.0.1]/',
    'https://10.0.0.5/realms/x',
    'https://172.16.3.4/',
    'https://192.168.1.1/',
    'https://169.254.169.254/latest',
    'https://100.64.0.1/',
    'https://0.0.0.0/',
    'https://[fd00::1]/',
    'https://[fe80::1]/',
  ];
  afterEach(() => {
    delete process.env[OIDC_ALLOW_PRIVATE_ENV];
    delete process.env[JWKS_ALLOW_PRIVATE_ENV];
  });

  it('issuerProblem refuses localhost and literal non-public addresses when asked to check the host', () => {
    for (const u of PRIVATE) {
      expect(issuerProblem(u), u).toBeNull();
      expect(issuerProblem(u, true), u).toMatch(/(is not a public address|is a loopback host name); the OpenID provider is reached by the shared ingress, so private and loopback hosts are refused unless the operator sets WARREN_OIDC_ALLOW_PRIVATE=1$/);
    }
    for (const u of ['https://idp.example.com/realms/x', 'https://8.8.8.8/', 'https://[2606:4700:4700::1111]/', 'https://accounts.google.com']) expect(issuerProblem(u, true), u).toBeNull();
  });

  it('refuses such an issuer_url with a 400 naming the field when saving, unless WARREN_OIDC_ALLOW_PRIVATE=1', () => {
    for (const u of PRIVATE) {
      const e = fails(oidc({ issuer_url: u, client_id: 'c', client_secret: SECRET }));
      expect(e.path, u).toBe(`${P}.issuer_url`);
      expect(e.message, u).toContain('WARREN_OIDC_ALLOW_PRIVATE=1');
    }
    // The ingress re-validating a stored policy leaves it to its guarded connections.
    expect(() => validateTrafficPolicy(oidc({ issuer_url: 'https://127.0.0.1:5432/x' }))).not.toThrow();
    // The JWKS switch is not this one.
    process.env[JWKS_ALLOW_PRIVATE_ENV] = '1';
    expect(fails(oidc({ issuer_url: 'https://127.0.0.1:5432/x' })).path).toBe(`${P}.issuer_url`);
    process.env[OIDC_ALLOW_PRIVATE_ENV] = '1';
    expect(oidcPrivateAllowed()).toBe(true);
    expect(validateTrafficPolicy(oidc({ issuer_url: 'https://127.0.0.1:5432/x' }), { checkCost: true }).inbound[0]!.actions[0]).toMatchObject({ config: { issuer_url: 'https://127.0.0.1:5432/x' } });
    process.env[OIDC_ALLOW_PRIVATE_ENV] = 'yes';
    expect(oidcPrivateAllowed()).toBe(false);
  });

  it('shares the host check with the JWK set URLs, whose switch still works', () => {
    expect(jwksHostRefusal).toBe(privateHostRefusal);
    expect(checkJwksUrl('https://127.0.0.1/jwks', true)).toMatchObject({ ok: false, reason: expect.stringContaining('WARREN_JWKS_ALLOW_PRIVATE=1') });
  });
});

describe('result variables', () => {
  it('type-check under actions.ngrok and actions.service, and evaluate to the last run', () => {
    const exprs = [
      "actions.ngrok.oauth.identity.email.endsWith('@example.com')",
      "actions.ngrok.oauth.identity.name == 'A' && actions.ngrok.oauth.identity.provider_user_id != '' && actions.ngrok.oauth.identity.id != ''",
      "actions.ngrok.oauth.identity.current_provider_session_id != '' && actions.ngrok.oauth.expires_at != '' && !actions.ngrok.oauth.session_timed_out",
      "actions.ngrok.oauth.error.code == '' && actions.ngrok.oauth.access_token == '' && !actions.ngrok.oauth.userinfo_refreshed && !actions.ngrok.oauth.session_max_duration_reached",
      "actions.service.oidc.identity.current_session_id != '' && actions.ngrok.oidc.identity_token == '' && !actions.ngrok.oidc.user_info_refreshed",
    ];
    const actions = new CelActions();
    recordAuthRun(actions.ngrok.oauth, { id: 'idn_1', email: 'a@example.com', name: 'A', providerUserId: '42', sessionId: 'ses_1', expiresAt: '2030-01-01T00:00:00Z' });
    recordAuthRun(actions.ngrok.oidc, { id: 'idn_2', email: 'b@example.com', name: 'B', providerUserId: 'b', sessionId: 'ses_2', expiresAt: '2030-01-01T00:00:00Z' });
    for (const e of exprs) expect(compileExpression('inbound', e)({ actions }), e).toBe(true);
    // and they are cheap enough for a saved policy
    expect(validateTrafficPolicy({ inbound: [{ actions: [{ type: 'oauth', config: { provider: 'github' } }] }, { expressions: exprs, actions: [{ type: 'deny' }] }] }, { checkCost: true }).inbound).toHaveLength(2);
    recordAuthRun(actions.ngrok.oauth, null, { code: 'x', message: 'y' });
    expect(compileExpression('inbound', "actions.ngrok.oauth.identity.email == '' && actions.ngrok.oauth.error.code == 'x'")({ actions })).toBe(true);
  });
});
