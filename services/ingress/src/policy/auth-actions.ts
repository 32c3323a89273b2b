import { createHash } from 'node:crypto';
import type { Logger } from 'pino';
import { recordAuthRun, type DpRoute, type OAuthAction, type OpenIdConnectAction } from '@warren/shared';
import type { Outcome, RequestState, ResponseState } from '../pipeline/types.js';
import { moduleError } from '../modules/common.js';
import { DiscoveryCache } from '../modules/oidc-discovery.js';
import { oidcProvider, requestedScopes } from '../modules/oidc.js';
import { oauthEndpoints, oauthProvider, oauthScopes } from '../modules/oauth.js';
import { PROVIDERS } from '../modules/oauth-providers.js';
import { rulesFrom } from '../modules/oauth-rules.js';
import { deriveSessionKeys, getCookie, loginCookieName, routeBase, sanitizeReturnTo, sessionCookieName, signInFlow, stripIdentityHeaders, type Session, type SessionPolicy, type SignInFlow, type SignInProvider } from '../modules/oidc-session.js';
import { actionsOf, type Activation } from './activation.js';

/**
 * The traffic policy's `oauth` and `openid-connect` actions (validated in
 * `@warren/shared` `traffic-policy/auth-actions.ts`), run on the route modules' sign-in machinery
 * (`modules/oidc-session.ts` `signInFlow`, the providers of `modules/oauth.ts` and
 * `modules/oidc.ts`, the shared discovery cache): the same sealed pre-login state (state, nonce,
 * PKCE), sealed session cookie, return-to sanitizing, 302 for browser navigations and 401
 * (`ERR_WARREN_7106`) otherwise, 502 for an unreachable provider, 400/403 pages at the callback.
 *
 * What differs from the modules, following ngrok's actions:
 * - No allow lists: any user the provider signs in passes the action, and later rules authorize
 *   with `actions.ngrok.oauth.identity.*` / `actions.ngrok.oidc.identity.*`. No identity headers
 *   are added (add them with `add-headers` and `${…}`), but client-sent ones are removed as the
 *   modules remove them: every `ngrok-auth-*` header (`_` for `-` too), from every request of a
 *   route whose policy has such an action, before any rule runs, so an upstream moved from a
 *   module to the actions cannot be fed forged ones.
 * - Special paths, under the route's prefix `<base>` (as the modules'): `<base>/ngrok/login`
 *   (`?auth_id=…&redirect_path=/…`) starts a sign-in, `<base>/ngrok/logout`
 *   (`?auth_id=…&redirect_path=/…`) clears the session, and `<base>/ngrok/callback` is the redirect
 *   URI to register at the provider (ngrok's own is on its idp.ngrok.com, which Warren has no
 *   equivalent of). They are answered before any rule runs, whatever the rules' expressions, so a
 *   rule that applies the action to some paths only still completes its sign-ins.
 * - `scopes` are added to the defaults (ngrok: "additional scopes"), `authz_url_params` are added
 *   to the authorization request, `allow_cors_preflight` lets a CORS preflight through without a
 *   session: an OPTIONS request with `Origin` and `Access-Control-Request-Method` and no body
 *   (no `Transfer-Encoding`, no `Content-Length` above 0); any other OPTIONS is an ordinary
 *   request.
 * - `userinfo_refresh_interval`: the provider's token is not kept, so user information is
 *   refreshed by signing in again: the session lasts at most that long (browsers go through the
 *   provider again, usually without a prompt), as the `oauth` module's `auth_check_interval`.
 *
 * Sessions: the cookie `__Host-warren.tp.<auth_id>.<route tag>` on HTTPS (`warren.tp.…` on plain
 * HTTP), sealed with keys derived (HKDF-SHA256, salt the route id) from the action's
 * `client_secret`, type, auth_id, provider or issuer and `client_id`: one route's session is not
 * valid on another route (or another account's), nor for another action of the same policy. The
 * route tag (from the route id) keeps two routes on one hostname from overwriting each other's
 * cookie. Pre-login cookies are `__Host-warren.tp.<auth_id>.<route tag>.login.<state tag>`
 * (Path=/) on HTTPS, so that neither a sibling subdomain nor a plain-HTTP response can plant one
 * (login CSRF), and `warren.tp.….login.…` with Path=the route's prefix on plain HTTP, where
 * nothing prevents that; at most three at once, with a return-to of at most 512 characters
 * (`oidc-session.ts` MAX_LOGIN_COOKIES, MAX_RETURN_TO_CHARS: no cookie bomb). The actions'
 * cookies (session and pre-login) are removed from every request of the route before it goes
 * upstream.
 *
 * `openid-connect`'s `issuer_url` is a tenant's URL: saving one on `localhost` or a literal
 * non-public address is refused (`@warren/shared` `issuerProblem`), and the ingress connects to
 * the provider (discovery, and the token, userinfo and JWKS endpoints its document names) only
 * at public addresses, both unless WARREN_OIDC_ALLOW_PRIVATE=1 (`modules/oidc-discovery.ts`).
 * The `oauth` action's providers are Warren's or the operator's endpoints.
 */

/** The compiled form: the validated action; its sign-in is bound to the route by `bindAuthActions`. */
export interface CompiledAuthAction {
  kind: 'oauth' | 'openid-connect';
  action: OAuthAction | OpenIdConnectAction;
  gate?: AuthGate;
}

export function compileAuthAction(a: OAuthAction | OpenIdConnectAction): CompiledAuthAction {
  return { kind: a.type, action: a };
}

/** One action's sign-in on one route (shared by identical copies of the action). */
interface AuthGate {
  authId: string;
  kind: 'oauth' | 'openid-connect';
  flow: SignInFlow;
  policy: SessionPolicy;
  allowCorsPreflight: boolean;
  /** Pre-login cookie prefix: which gate a callback belongs to. */
  loginCookiePrefix: string;
  /** Stable ids of the variables (see `identityOf`). */
  accountId: string;
  routeId: string;
  provider: string;
}

/** The special paths of a route's sign-in actions, and their sliding refreshes. */
export interface AuthRouter {
  /** The answer to `<base>/ngrok/{login,logout,callback}`, or null for any other request. */
  specialPath(s: RequestState): Promise<Outcome> | Outcome;
  onResponse(s: RequestState, r: ResponseState): void;
}

export interface AuthActionOptions {
  discovery?: DiscoveryCache;
  /** WARREN_OAUTH_PROVIDER_ENDPOINTS text (default: the process's). */
  endpoints?: string;
  now?: () => number;
}

/** One discovery cache for every route's actions in this process (the modules' stages keep their own). */
let sharedDiscovery: DiscoveryCache | undefined;

const sha = (...parts: string[]) => createHash('sha256').update(parts.join('\0')).digest('hex');

/**
 * Binds every `oauth` / `openid-connect` action of the compiled inbound rules to the route:
 * their sign-in flows and the router of their special paths (null without such an action).
 * Throws (the route then answers 503 `ERR_WARREN_7010`) for an `exact_path` route, an action
 * without `client_id`/`client_secret` (Warren has no managed app), or bad endpoint overrides.
 */
export function bindAuthActions(rules: readonly { actions: readonly { kind: string }[] }[], route: DpRoute, log: Logger, opts: AuthActionOptions = {}): AuthRouter | null {
  const gates = new Map<string, AuthGate>();
  for (const rule of rules) {
    for (const a of rule.actions) {
      if (a.kind !== 'oauth' && a.kind !== 'openid-connect') continue;
      const c = a as CompiledAuthAction;
      const id = c.action.config.auth_id;
      c.gate = gates.get(id) ?? makeGate(c.action, route, log, opts);
      gates.set(id, c.gate);
    }
  }
  if (gates.size === 0) return null;
  return authRouter([...gates.values()], routeBase(route));
}

function makeGate(a: OAuthAction | OpenIdConnectAction, route: DpRoute, log: Logger, opts: AuthActionOptions): AuthGate {
  const c = a.config;
  const what = `${a.type} (auth_id ${c.auth_id})`;
  if (route.matchType === 'exact_path') throw new Error(`${what}: an exact_path route cannot carry the sign-in paths (<prefix>/ngrok/callback, …); use a path_prefix route`);
  const discovery = opts.discovery ?? (sharedDiscovery ??= new DiscoveryCache());
  const actionLog = log.child({ action: a.type, authId: c.auth_id, routeId: route.id });
  let provider: SignInProvider;
  let providerKey: string;
  let providerName: string;
  let providerLabel: string;
  if (a.type === 'oauth') {
    const spec = PROVIDERS[a.config.provider];
    if (!c.client_id || !c.client_secret)
      throw new Error(`${what}: client_id and client_secret are required: Warren has no managed ${spec.label} OAuth app, so register your own app at ${spec.label} and set both`);
    const eps = oauthEndpoints(a.config.provider, opts.endpoints);
    const scope = oauthScopes(spec, [...spec.defaultScopes(false), ...c.scopes], false);
    provider = oauthProvider({ kind: a.config.provider, eps, clientId: c.client_id, secret: c.client_secret, scope, rules: rulesFrom({}), extra: c.authz_url_params, discovery, log: actionLog });
    providerKey = a.config.provider;
    providerName = `the ${spec.label} sign-in`;
    providerLabel = spec.family === 'oidc' ? eps.issuer! : new URL(eps.token!).origin;
  } else {
    if (!c.client_id || !c.client_secret) throw new Error(`${what}: client_id and client_secret are required: register a client at the OpenID provider and set both`);
    const scope = requestedScopes(['openid', 'profile', 'email', ...c.scopes]);
    provider = oidcProvider({ issuer: a.config.issuer_url, clientId: c.client_id, secret: c.client_secret, scope, extra: c.authz_url_params, discovery, log: actionLog, verifiedEmailOnly: true });
    providerKey = a.config.issuer_url;
    providerName = 'the OpenID provider';
    providerLabel = a.config.issuer_url;
  }
  const base = routeBase(route);
  const special = `${base}/ngrok/`;
  const isReserved = (p: string) => p.startsWith(special);
  const cookieModule = `${c.auth_id}.${sha(route.id).slice(0, 8)}`;
  const loginCookiePrefix = `warren.tp.${cookieModule}.login.`;
  const policy: SessionPolicy = {
    maximumDuration: c.userinfoRefreshSeconds > 0 ? Math.min(c.maxSessionSeconds, c.userinfoRefreshSeconds) : c.maxSessionSeconds,
    inactivityTimeout: c.idleTimeoutSeconds,
  };
  const flow = signInFlow({
    module: a.type,
    keys: deriveSessionKeys(`policy/${a.type}`, c.client_secret, route.id, `${c.auth_id}\0${providerKey}`, c.client_id),
    policy,
    challenge: a.type === 'oauth' ? 'OAuth' : 'OIDC',
    providerName,
    providerLabel,
    nowMs: opts.now ?? Date.now,
    log: actionLog,
    base,
    callbackPath: `${special}callback`,
    isReserved,
    sessionCookie: (scheme) => sessionCookieName('warren.tp.', cookieModule, scheme),
    loginCookiePrefix,
    loginUrl: (returnTo) => `${special}login?auth_id=${encodeURIComponent(c.auth_id)}&redirect_path=${encodeURIComponent(returnTo)}`,
    provider: {
      ...provider,
      // ngrok: `/ngrok/logout?redirect_path=/` sends the browser there once signed out.
      logout: async (_s, url, _session, origin) => {
        const to = sanitizeReturnTo(url.searchParams.get('redirect_path'), '', isReserved);
        return to ? new URL(origin + to) : null;
      },
    },
  });
  return { authId: c.auth_id, kind: a.type, flow, policy, allowCorsPreflight: c.allow_cors_preflight, loginCookiePrefix, accountId: route.accountId, routeId: route.id, provider: providerKey };
}

function authRouter(gates: AuthGate[], base: string): AuthRouter {
  const special = `${base}/ngrok/`;
  const ids = gates.map((g) => g.authId).join(', ');
  const query = (s: RequestState) => {
    const url = s.req.url ?? '/';
    const q = url.indexOf('?');
    return new URLSearchParams(q < 0 ? '' : url.slice(q + 1));
  };
  /** The gate `auth_id` names; without one, the only gate. */
  const pick = (s: RequestState): AuthGate | NonNullable<Outcome> => {
    const id = query(s).get('auth_id');
    if (id === null) return gates.length === 1 ? gates[0]! : moduleError(s, 7108, `this route signs in through several providers: add auth_id (one of ${ids})`);
    return gates.find((g) => g.authId === id) ?? moduleError(s, 7108, `no sign-in action has auth_id ${JSON.stringify(id.slice(0, 64))} on this route (auth_id: ${ids})`);
  };
  return {
    specialPath(s) {
      // As the modules: the client's identity headers and the flows' cookies never reach the upstream (nor the rules).
      stripIdentityHeaders(s.headers);
      for (const g of gates) g.flow.dropCookies(s);
      if (!s.path.startsWith(special)) return null;
      const rest = s.path.slice(special.length);
      if (rest === 'callback') {
        // The gate whose pre-login cookie matches the state: a callback can only complete the sign-in its own browser started.
        const state = query(s).get('state') ?? '';
        const gate = gates.find((g) => state && getCookie(s.req.headers.cookie, loginCookieName(g.loginCookiePrefix, state, s.scheme)) !== undefined) ?? gates[0]!;
        return gate.flow.callback(s);
      }
      if (rest !== 'login' && rest !== 'logout') return null;
      const gate = pick(s);
      if (!('flow' in gate)) return gate;
      if (rest === 'logout') return gate.flow.logout(s);
      return gate.flow.startLogin(s, sanitizeReturnTo(query(s).get('redirect_path'), base || '/', (p) => p.startsWith(special)));
    },
    onResponse(s, r) {
      for (const g of gates) g.flow.onResponse(s, r);
    },
  };
}

/** The end of a session as the variables show it (RFC 3339): the earliest of its limits. */
function sessionEnd(session: Session, p: SessionPolicy): string {
  let end = Math.min(session.exp, session.iat + p.maximumDuration);
  if (p.inactivityTimeout > 0) end = Math.min(end, session.seen + p.inactivityTimeout);
  return new Date(end * 1000).toISOString().replace('.000Z', 'Z');
}

/**
 * Runs the action on a request: with a valid session it records the identity for later rules,
 * removes the session cookie from what goes upstream and lets the rules go on (null); a CORS
 * preflight passes when allowed; otherwise the sign-in challenge (302 or 401) ends the rules.
 */
export function runAuthAction(a: CompiledAuthAction, act: Activation): Outcome | Promise<Outcome> {
  const g = a.gate;
  const s = act.s;
  const results = actionsOf(s).ngrok;
  const vars = a.kind === 'oauth' ? results.oauth : results.oidc;
  if (!g) {
    // Not bound (cannot happen through trafficPolicyStage): refuse rather than let the request through.
    recordAuthRun(vars, null, { code: 'not_configured', message: 'the sign-in action is not bound to the route' });
    return moduleError(s, 7107, 'the sign-in action of this route is not configured');
  }
  const session = g.flow.session(s);
  if (session) {
    recordAuthRun(vars, {
      id: `idn_${sha('identity', g.accountId, g.kind, g.provider, session.sub).slice(0, 26)}`,
      email: session.email,
      name: session.name,
      providerUserId: session.sub,
      sessionId: `ses_${sha('session', g.routeId, g.authId, session.sub, String(session.iat)).slice(0, 26)}`,
      expiresAt: sessionEnd(session, g.policy),
    });
    g.flow.dropCookies(s);
    act.headersChanged();
    return null;
  }
  recordAuthRun(vars, null);
  if (g.allowCorsPreflight && isCorsPreflight(s)) return null;
  return g.flow.challenge(s);
}

/**
 * A CORS preflight (Fetch standard): OPTIONS with `Origin` and `Access-Control-Request-Method`,
 * and without a body (a browser's preflight has none; one with a body is someone's request
 * dressed as a preflight to pass `allow_cors_preflight`).
 */
export function isCorsPreflight(s: RequestState): boolean {
  const h = s.req.headers;
  if (s.req.method !== 'OPTIONS' || h.origin === undefined || h['access-control-request-method'] === undefined) return false;
  if (h['transfer-encoding'] !== undefined) return false;
  const len = h['content-length'];
  return len === undefined || /^0+$/.test(String(len).trim());
}
