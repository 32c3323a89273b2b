import * as client from 'openid-client';
import type { DpRoute } from '@warren/shared';
import type { Outcome, RequestState, RouteStage, StageFactory } from '../pipeline/types.js';
import { enabledModule, moduleError } from './common.js';
import { splitMatch } from '../http/routing.js';
import { DiscoveryCache, ProviderUnavailable, describeError } from './oidc-discovery.js';
import {
  IDENTITY_HEADERS,
  LOGIN_STATE_SECONDS,
  deriveOidcKeys,
  getCookie,
  headerValue,
  needsRefresh,
  newSession,
  readLoginState,
  readSession,
  sanitizeReturnTo,
  seal,
  setCookie,
  stripIdentityHeaders,
  withoutCookies,
  type LoginState,
  type OidcKeys,
  type Session,
  type SessionPolicy,
} from './oidc-session.js';

/**
 * `oidc`: OpenID Connect sign-in in front of a route (authorization-code flow with PKCE, state and
 * nonce, through openid-client; the provider is found by discovery, see oidc-discovery.ts).
 *
 * Reserved paths, under the route's path prefix `<base>` (`""` for a `/` or host-only route,
 * `/app` for a `path_prefix` route `/app` or `/app/`); the ingress answers them itself and the
 * upstream never sees them:
 * - `<base>/.warren/oidc/callback`: the redirect URI. Register
 *   `https://<each hostname of the edge><base>/.warren/oidc/callback` at the provider (with
 *   `:port` when clients use a non-default port).
 * - `<base>/.warren/oidc/login[?return_to=/path]`: starts a sign-in explicitly (like ngrok's
 *   `/ngrok/login`).
 * - `<base>/.warren/oidc/logout`: clears the session cookie and answers a small "signed out" page
 *   (like ngrok's `/ngrok/logout`; the provider's own session is not ended).
 * `exact_path` routes cannot carry these paths, so `oidc` on one refuses the config (503, 7010).
 *
 * A request without a valid session: a browser navigation (GET/HEAD accepting text/html) gets a
 * 302 to the provider; anything else gets 401 (7106, JSON or HTML by Accept) with
 * `WWW-Authenticate: OIDC realm="<host>", login="<login URL>"` naming where to sign in. With
 * `options_passthrough`, OPTIONS requests (CORS preflights) pass without a session (and without
 * identity headers).
 *
 * Scopes: `scopes`, or `openid profile email` when empty; `openid` is always added.
 *
 * Cookies (SameSite=Lax, HttpOnly, Secure on HTTPS; `cookie_prefix` defaults to `warren.`):
 * - `<prefix>oidc`, Path=/: the session, sealed with AES-256-GCM (see oidc-session.ts): subject,
 *   email, name, sign-in time, last-seen time and hard end. The session ends at
 *   `maximum_duration` after sign-in (0 = one day) or after `inactivity_timeout` seconds without a
 *   request (0 = no inactivity limit). A sliding session's cookie is rewritten (on the response)
 *   at most once a minute, not per request. Two `oidc` routes on one hostname need different
 *   `cookie_prefix` values, or their sessions replace each other.
 * - `<prefix>oidc.login.<state tag>`, Path=the callback, 10 minutes: the pre-login state (state,
 *   nonce, PKCE verifier, return-to), sealed likewise; one per sign-in attempt, so parallel tabs
 *   do not spoil each other.
 * The keys come from HKDF-SHA256 over the route's `client_secret` (salt: route id), so every node
 * accepts every other node's cookies, and a changed secret ends all sessions.
 *
 * The return-to URL is the request's own path and query (or `return_to` on the login path),
 * always reduced to a same-host relative URL.
 *
 * Upstream: ngrok's identity headers `ngrok-auth-user-email`, `ngrok-auth-user-id` (the `sub`
 * claim) and `ngrok-auth-user-name`, the names ngrok's edge auth modules set (ngrok's cloud-edge
 * OAuth module docs list user id and name headers under `ngrok-auth-`; applications written for
 * ngrok read exactly these three). Every client-sent `ngrok-auth-*` header is dropped first, and
 * the module's cookies are removed from `Cookie`.
 *
 * Sources: ngrok's API reference for the route OIDC module (fields and defaults), its traffic
 * policy `openid-connect`/`oauth` action docs (the special `/ngrok/login` and `/ngrok/logout`
 * paths, OPTIONS passthrough for CORS), OpenID Connect Core 1.0 and Discovery 1.0, RFC 7636 (PKCE).
 *
 * The hot path (valid cookie) is a decrypt and a few comparisons; the provider is contacted only
 * to start a sign-in (discovery, cached) and at the callback (token endpoint, and userinfo when
 * the ID token lacks email or name, as with providers that put scope claims only in userinfo),
 * each with a timeout. The ID token's iss, aud, exp, nonce are checked by openid-client; it comes
 * straight from the token endpoint over TLS, so its signature is not re-verified (OIDC Core
 * 3.1.3.7). An unreachable provider answers 502 (7107) at once while discovery backs off.
 * Callback failures (bad or expired state, the provider's error, a rejected code or ID token)
 * answer 400 (7108) with a link to sign in again.
 *
 * The issuer must be https, localhost included (the control plane refuses http:, a query, a
 * fragment or credentials): a local provider needs TLS, with a private CA given to the ingress
 * through NODE_EXTRA_CA_CERTS.
 */

const RESERVED = '/.warren/oidc/';
const DEFAULT_SCOPES = ['openid', 'profile', 'email'];

interface OidcModule {
  options_passthrough?: boolean;
  cookie_prefix?: string;
  inactivity_timeout?: number;
  maximum_duration?: number;
  issuer?: string;
  client_id?: string;
  client_secret?: string;
  scopes?: string[];
}

export interface OidcOptions {
  /** Clock in ms (session times are kept in seconds). */
  now?: () => number;
  discovery?: DiscoveryCache;
}

/** The route's path prefix without a trailing slash (`""` for `/`). */
export function routeBase(route: DpRoute): string {
  const { path } = splitMatch(route.match);
  return path.endsWith('/') ? path.slice(0, -1) : path;
}

/** The scopes requested: the configured ones (or the defaults), with `openid` first and no repeats. */
export function requestedScopes(configured: readonly string[] | undefined): string {
  const list = configured && configured.length > 0 ? configured : DEFAULT_SCOPES;
  return [...new Set(['openid', ...list])].join(' ');
}

/** Browser navigations are sent to the provider; everything else gets 401. */
export function isBrowserNavigation(s: RequestState): boolean {
  const m = s.req.method;
  return (m === 'GET' || m === 'HEAD') && (s.req.headers.accept ?? '').includes('text/html');
}

const htmlEscape = (v: string) => v.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

export function createOidcStage(opts: OidcOptions = {}): StageFactory {
  const nowMs = opts.now ?? Date.now;
  const discovery = opts.discovery ?? new DiscoveryCache();
  return (route, _edge, _config, deps): RouteStage | null => {
    const m = enabledModule<OidcModule>(route, 'oidc');
    if (!m) return null;
    if (route.matchType === 'exact_path') throw new Error('oidc: an exact_path route cannot carry the sign-in callback; use a path_prefix route');
    const issuer = m.issuer ?? '';
    const clientId = m.client_id ?? '';
    const secret = m.client_secret ?? '';
    if (!issuer || !clientId || !secret) throw new Error('oidc: issuer, client_id and client_secret are required');
    let issuerUrl: URL;
    try {
      issuerUrl = new URL(issuer);
    } catch {
      throw new Error('oidc: the issuer is not a URL');
    }
    if (issuerUrl.protocol !== 'https:') throw new Error('oidc: the issuer must be an https URL');

    const keys: OidcKeys = deriveOidcKeys(secret, route.id, issuer, clientId);
    const policy: SessionPolicy = { maximumDuration: m.maximum_duration ?? 0, inactivityTimeout: m.inactivity_timeout ?? 0 };
    const prefix = m.cookie_prefix || 'warren.';
    const sessionCookie = `${prefix}oidc`;
    const loginCookiePrefix = `${prefix}oidc.login.`;
    const base = routeBase(route);
    const callbackPath = `${base}${RESERVED}callback`;
    const loginPath = `${base}${RESERVED}login`;
    const logoutPath = `${base}${RESERVED}logout`;
    const reservedPrefix = `${base}${RESERVED}`;
    const isReserved = (p: string) => p.startsWith(reservedPrefix);
    const scope = requestedScopes(m.scopes);
    const passOptions = m.options_passthrough === true;
    /** Set-Cookie to add to the upstream's response (a sliding session's refresh). */
    const refreshes = new WeakMap<RequestState, string>();

    const nowS = () => Math.floor(nowMs() / 1000);
    const origin = (s: RequestState) => `${s.scheme}://${(s.req.headers.host ?? s.host).toLowerCase()}`;
    const cookieAttrs = (s: RequestState, maxAge: number, path = '/') => ({ path, maxAge, secure: s.scheme === 'https' });
    const dropOurCookies = (name: string) => name === sessionCookie || name.startsWith(loginCookiePrefix);
    const log = deps.log.child({ module: 'oidc', routeId: route.id });

    /** The request's own path and query, as the place to return to after sign-in. */
    const ownTarget = (s: RequestState) => {
      const url = s.req.url ?? '/';
      return url.startsWith('/') ? url : '/';
    };

    const forward = (s: RequestState, session: Session | null): null => {
      stripIdentityHeaders(s.headers);
      const cookieIdx = [] as number[];
      for (let i = 0; i + 1 < s.headers.length; i += 2) if (s.headers[i]!.toLowerCase() === 'cookie') cookieIdx.push(i);
      for (let j = cookieIdx.length - 1; j >= 0; j--) {
        const i = cookieIdx[j]!;
        const rest = withoutCookies(s.headers[i + 1]!, dropOurCookies);
        if (rest === null) s.headers.splice(i, 2);
        else s.headers[i + 1] = rest;
      }
      if (session) {
        if (session.email) s.headers.push(IDENTITY_HEADERS.email, headerValue(session.email));
        s.headers.push(IDENTITY_HEADERS.id, headerValue(session.sub));
        if (session.name) s.headers.push(IDENTITY_HEADERS.name, headerValue(session.name));
      }
      return null;
    };

    const unavailable = (s: RequestState, err: unknown): NonNullable<Outcome> => {
      const detail = `the OpenID provider of this route could not be reached: ${err instanceof ProviderUnavailable ? err.message : `${issuer}: ${describeError(err)}`}`;
      log.warn({ issuer, reason: detail }, 'oidc: provider unavailable');
      return moduleError(s, 7107, detail, { 'retry-after': '5' });
    };

    /** 302 to the provider, with the pre-login state in its own cookie. */
    const startLogin = async (s: RequestState, returnTo: string): Promise<Outcome> => {
      let config: client.Configuration;
      try {
        config = await discovery.config(issuer, clientId, secret);
      } catch (err) {
        return unavailable(s, err);
      }
      const login: LoginState = {
        state: client.randomState(),
        nonce: client.randomNonce(),
        verifier: client.randomPKCECodeVerifier(),
        returnTo,
        exp: nowS() + LOGIN_STATE_SECONDS,
      };
      const url = client.buildAuthorizationUrl(config, {
        redirect_uri: origin(s) + callbackPath,
        scope,
        state: login.state,
        nonce: login.nonce,
        code_challenge: await client.calculatePKCECodeChallenge(login.verifier),
        code_challenge_method: 'S256',
      });
      return {
        status: 302,
        headers: {
          location: url.href,
          'cache-control': 'no-store',
          'set-cookie': setCookie(loginCookiePrefix + login.state.slice(0, 16), seal(keys.login, 'login', login), cookieAttrs(s, LOGIN_STATE_SECONDS, callbackPath)),
          'content-type': 'text/plain; charset=utf-8',
        },
        body: `Sign-in required: ${url.href}\n`,
      };
    };

    const loginAgain = (s: RequestState, returnTo: string) => `${origin(s)}${loginPath}?return_to=${encodeURIComponent(returnTo)}`;

    const callbackFailed = (s: RequestState, reason: string, returnTo = base || '/'): NonNullable<Outcome> => {
      log.info({ reason }, 'oidc: sign-in failed');
      const again = loginAgain(s, returnTo);
      const html = (s.req.headers.accept ?? '').includes('text/html');
      if (!html) return moduleError(s, 7108, `sign-in failed: ${reason}; sign in again at ${again}`);
      const body = `<!doctype html><html><head><meta charset="utf-8"><title>400 sign-in failed</title></head><body><h1>Sign-in failed</h1><p>${htmlEscape(reason)}</p><p><a href="${htmlEscape(again)}">Sign in again</a></p><p><code>ERR_WARREN_7108</code></p></body></html>\n`;
      return { status: 400, headers: { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store', 'warren-error-code': 'ERR_WARREN_7108' }, body };
    };

    const callback = async (s: RequestState): Promise<Outcome> => {
      const url = new URL(origin(s) + ownTarget(s));
      const params = url.searchParams;
      const state = params.get('state') ?? '';
      const login = state ? readLoginState(keys.login, getCookie(s.req.headers.cookie, loginCookiePrefix + state.slice(0, 16)), nowS()) : null;
      if (!login || login.state !== state) return callbackFailed(s, 'the sign-in expired, or was started in another browser');
      const idpError = params.get('error');
      if (idpError) return callbackFailed(s, `the provider answered ${idpError}${params.get('error_description') ? `: ${params.get('error_description')}` : ''}`.slice(0, 300), login.returnTo);
      let config: client.Configuration;
      try {
        config = await discovery.config(issuer, clientId, secret);
      } catch (err) {
        return unavailable(s, err);
      }
      let identity: { sub: string; email: string; name: string };
      try {
        const tokens = await client.authorizationCodeGrant(config, url, { pkceCodeVerifier: login.verifier, expectedState: login.state, expectedNonce: login.nonce, idTokenExpected: true });
        const claims = tokens.claims();
        if (!claims) return callbackFailed(s, 'the provider sent no ID token', login.returnTo);
        let email = typeof claims.email === 'string' ? claims.email : '';
        let name = typeof claims.name === 'string' ? claims.name : '';
        if ((!email || !name) && config.serverMetadata().userinfo_endpoint && tokens.access_token) {
          try {
            const info = await client.fetchUserInfo(config, tokens.access_token, claims.sub);
            email ||= typeof info.email === 'string' ? info.email : '';
            name ||= typeof info.name === 'string' ? info.name : '';
          } catch (err) {
            log.info({ reason: describeError(err) }, 'oidc: userinfo failed; continuing with the ID token claims');
          }
        }
        identity = { sub: claims.sub, email, name };
      } catch (err) {
        const e = err as { name?: string; cause?: unknown };
        if (e?.name === 'TimeoutError' || e?.name === 'AbortError' || (e?.name === 'TypeError' && e.cause)) return unavailable(s, err);
        return callbackFailed(s, `the provider's answer was not accepted: ${describeError(err)}`, login.returnTo);
      }
      const session = newSession(identity, nowS(), policy);
      return {
        status: 302,
        headers: {
          location: login.returnTo,
          'cache-control': 'no-store',
          'set-cookie': setCookie(sessionCookie, seal(keys.session, 'session', session), cookieAttrs(s, session.exp - nowS())),
        },
        body: '',
      };
    };

    const logout = (s: RequestState): NonNullable<Outcome> => ({
      status: 200,
      headers: { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store', 'set-cookie': setCookie(sessionCookie, '', cookieAttrs(s, 0)) },
      body: `<!doctype html><html><head><meta charset="utf-8"><title>Signed out</title></head><body><h1>Signed out</h1><p><a href="${htmlEscape(base || '/')}">Sign in again</a></p></body></html>\n`,
    });

    return {
      name: 'oidc',
      onRequest(s) {
        if (s.path.startsWith(reservedPrefix)) {
          if (s.path === callbackPath) return callback(s);
          if (s.path === logoutPath) return logout(s);
          if (s.path === loginPath) {
            const q = ownTarget(s).indexOf('?');
            const rt = q < 0 ? null : new URLSearchParams(ownTarget(s).slice(q + 1)).get('return_to');
            return startLogin(s, sanitizeReturnTo(rt, base || '/', isReserved));
          }
          return moduleError(s, 7108, 'no such sign-in path');
        }
        const now = nowS();
        const session = readSession(keys.session, getCookie(s.req.headers.cookie, sessionCookie), now, policy);
        if (session) {
          if (needsRefresh(session, now, policy)) {
            refreshes.set(s, setCookie(sessionCookie, seal(keys.session, 'session', { ...session, seen: now }), cookieAttrs(s, session.exp - now)));
          }
          return forward(s, session);
        }
        if (passOptions && s.req.method === 'OPTIONS') return forward(s, null);
        const returnTo = sanitizeReturnTo(ownTarget(s), base || '/', isReserved);
        if (isBrowserNavigation(s)) return startLogin(s, returnTo);
        const login = loginAgain(s, returnTo);
        return moduleError(s, 7106, `sign-in through the OpenID provider of this route is required: open ${login} in a browser`, {
          'www-authenticate': `OIDC realm="${s.host}", login="${login}"`,
        });
      },
      onResponse(s, r) {
        const c = refreshes.get(s);
        if (c) r.headers.push('set-cookie', c);
      },
    };
  };
}

export const oidcStage: StageFactory = createOidcStage();
