import * as client from 'openid-client';
import type { RouteStage, StageFactory } from '../pipeline/types.js';
import { enabledModule } from './common.js';
import { DiscoveryCache } from './oidc-discovery.js';
import { deriveOidcKeys, signInGate, type Identity, type SessionPolicy, type SignInModuleFields, type SignInProvider } from './oidc-session.js';

export { routeBase, isBrowserNavigation } from './oidc-session.js';

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
 * - `__Host-<prefix>oidc` on HTTPS (`<prefix>oidc` on plain HTTP, where browsers refuse the
 *   `__Host-` prefix), Path=/, no Domain: the session. The prefix (RFC 6265bis) makes the browser
 *   keep the cookie only when it was set Secure by this very host, so a sibling subdomain or a
 *   plain-HTTP response cannot plant a session; the name read follows the request's scheme. It is
 *   sealed with AES-256-GCM (see oidc-session.ts): subject,
 *   email, name, sign-in time, last-seen time and hard end. The session ends at
 *   `maximum_duration` after sign-in (0 = one day) or after `inactivity_timeout` seconds without a
 *   request (0 = no inactivity limit). A sliding session's cookie is rewritten (on the response)
 *   at most once a minute, not per request. Two `oidc` routes on one hostname need different
 *   `cookie_prefix` values, or their sessions replace each other.
 * - `__Host-<prefix>oidc.login.<state tag>` on HTTPS (Path=/, for the prefix; removed from
 *   every request that goes upstream) and `<prefix>oidc.login.<state tag>` with Path=the route's
 *   path prefix on plain HTTP, 10 minutes: the pre-login state (state, nonce, PKCE verifier,
 *   return-to), sealed likewise; one per sign-in attempt, so parallel tabs do not spoil each
 *   other, but at most MAX_LOGIN_COOKIES (3) at once: starting another expires the oldest, and
 *   the return-to kept is at most MAX_RETURN_TO_CHARS (512; a longer one loses its query, or
 *   becomes the route's root), so forced navigations cannot grow the browser's Cookie header past
 *   a few KB (a cookie bomb: 431 for every request to the host). Every
 *   callback answer (signed in or failed) clears the one it read. The `__Host-` prefix keeps a
 *   sibling subdomain or a plain-HTTP response from planting one with its own state (login CSRF:
 *   the victim would be signed in as the planter); plain HTTP has no such protection.
 * The keys come from HKDF-SHA256 over the route's `client_secret` (salt: route id), so every node
 * accepts every other node's cookies, and a changed secret ends all sessions.
 *
 * The return-to URL is the request's own path and query (or `return_to` on the login path),
 * always reduced to a same-host relative URL.
 *
 * Upstream: ngrok's identity headers `ngrok-auth-user-email` (the `email` claim as the provider
 * gives it: `email_verified` is not checked here, unlike the `oauth` module and the
 * `openid-connect` action), `ngrok-auth-user-id` (the `sub` claim) and `ngrok-auth-user-name`, the names ngrok's edge auth modules set (ngrok's cloud-edge
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
 * 3.1.3.7). An unreachable provider answers 502 (7107) at once while discovery backs off, with
 * one text whatever the cause (the cause is logged): a client learns nothing of the ingress's
 * network from it.
 * Callback failures (bad or expired state, the provider's error, a rejected code or ID token)
 * answer 400 (7108) with a link to sign in again.
 *
 * The issuer must be https, localhost included (the control plane refuses http:, a query, a
 * fragment or credentials): a local provider needs TLS, with a private CA given to the ingress
 * through NODE_EXTRA_CA_CERTS.
 *
 * SSRF: the issuer is a tenant's URL, fetched by the shared ingress. The control plane refuses
 * an issuer on `localhost` or a literal private, loopback, link-local or otherwise non-public
 * address, and the ingress refuses to connect to such an address (a name resolving to one
 * included, and any endpoint the discovery document names: token, userinfo, JWKS), both unless
 * the operator sets WARREN_OIDC_ALLOW_PRIVATE=1 in that process's environment (see
 * oidc-discovery.ts and policy/guarded-fetch.ts).
 */

const DEFAULT_SCOPES = ['openid', 'profile', 'email'];

interface OidcModule extends SignInModuleFields {
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

/** The scopes requested: the configured ones (or the defaults), with `openid` first and no repeats. */
export function requestedScopes(configured: readonly string[] | undefined): string {
  const list = configured && configured.length > 0 ? configured : DEFAULT_SCOPES;
  return [...new Set(['openid', ...list])].join(' ');
}

/**
 * An OpenID provider's sign-in through openid-client (authorization code with PKCE, state and
 * nonce; the ID token's iss, aud, exp and nonce checked by openid-client; userinfo asked when the
 * ID token lacks email or name). Shared with the oauth module's OpenID providers (oauth.ts), which
 * pass extra authorization parameters and read more claims.
 */
export async function oidcAuthorizationUrl(config: client.Configuration, login: { state: string; nonce: string; verifier: string }, redirectUri: string, scope: string, extra: Record<string, string> = {}, opts: { pkce?: boolean; nonce?: boolean } = {}): Promise<URL> {
  const params: Record<string, string> = { ...extra, redirect_uri: redirectUri, scope, state: login.state };
  if (opts.nonce !== false) params.nonce = login.nonce;
  if (opts.pkce !== false) {
    params.code_challenge = await client.calculatePKCECodeChallenge(login.verifier);
    params.code_challenge_method = 'S256';
  }
  return client.buildAuthorizationUrl(config, params);
}

/** The ID token's claims merged with userinfo's (asked when `wantUserinfo` says so), and the access token. */
export async function oidcExchange(
  config: client.Configuration,
  callbackUrl: URL,
  login: { state: string; nonce: string; verifier: string },
  wantUserinfo: (claims: client.IDToken) => boolean,
  log: { info(o: object, msg: string): void },
  opts: { pkce?: boolean; nonce?: boolean } = {},
): Promise<Record<string, unknown> & { sub: string }> {
  const tokens = await client.authorizationCodeGrant(config, callbackUrl, {
    pkceCodeVerifier: opts.pkce === false ? undefined : login.verifier,
    expectedState: login.state,
    expectedNonce: opts.nonce === false ? undefined : login.nonce,
    idTokenExpected: true,
  });
  const claims = tokens.claims();
  if (!claims) throw new Error('the provider sent no ID token');
  const merged: Record<string, unknown> & { sub: string } = { ...claims };
  if (wantUserinfo(claims) && config.serverMetadata().userinfo_endpoint && tokens.access_token) {
    try {
      const info = await client.fetchUserInfo(config, tokens.access_token, claims.sub);
      for (const [k, v] of Object.entries(info)) if (merged[k] === undefined || merged[k] === '') merged[k] = v;
    } catch (err) {
      log.info({ reason: (err as Error)?.message }, 'userinfo failed; continuing with the ID token claims');
    }
  }
  return merged;
}

const str = (v: unknown) => (typeof v === 'string' ? v : '');

/**
 * An OpenID provider found by discovery at `issuer`, as the `oidc` route module and the traffic
 * policy's `openid-connect` action (`policy/auth-actions.ts`) sign in through it: the identity is
 * the `sub`, `email` and `name` claims (userinfo asked when the ID token lacks email or name).
 * `extra`: further authorization request parameters (the action's `authz_url_params`);
 * `verifiedEmailOnly` (the action, whose rules authorize by the email): the email is the
 * identity's only when the provider vouches for it, `email_verified` being `true` or the string
 * `"true"` (any case: Amazon Cognito sends a string); `false`, `"false"`, or no such claim leaves
 * the email out. Without it (the `oidc` module) the `email` claim is taken as the provider gives it.
 */
export function verifiedEmail(claims: Record<string, unknown>): string {
  const v = claims.email_verified;
  return v === true || (typeof v === 'string' && v.toLowerCase() === 'true') ? str(claims.email) : '';
}

export function oidcProvider(p: { issuer: string; clientId: string; secret: string; scope: string; extra?: Record<string, string>; discovery: DiscoveryCache; log: { info(o: object, msg: string): void }; verifiedEmailOnly?: boolean }): SignInProvider {
  const config = () => p.discovery.config(p.issuer, p.clientId, p.secret);
  return {
    authorizationUrl: async (login, redirectUri) => oidcAuthorizationUrl(await config(), login, redirectUri, p.scope, p.extra),
    exchange: async (url, login): Promise<Identity> => {
      const claims = await oidcExchange(await config(), url, login, (c) => typeof c.email !== 'string' || typeof c.name !== 'string', p.log);
      return { sub: claims.sub, email: p.verifiedEmailOnly ? verifiedEmail(claims) : str(claims.email), name: str(claims.name) };
    },
  };
}

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
    const policy: SessionPolicy = { maximumDuration: m.maximum_duration ?? 0, inactivityTimeout: m.inactivity_timeout ?? 0 };
    const scope = requestedScopes(m.scopes);
    const log = deps.log.child({ module: 'oidc', routeId: route.id });
    return signInGate({
      module: 'oidc',
      route,
      keys: deriveOidcKeys(secret, route.id, issuer, clientId),
      policy,
      cookiePrefix: m.cookie_prefix || 'warren.',
      optionsPassthrough: m.options_passthrough === true,
      challenge: 'OIDC',
      providerName: 'the OpenID provider',
      providerLabel: issuer,
      nowMs,
      log,
      provider: oidcProvider({ issuer, clientId, secret, scope, discovery, log }),
    });
  };
}

export const oidcStage: StageFactory = createOidcStage();
