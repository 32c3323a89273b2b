import { hkdfSync, randomBytes } from 'node:crypto';
import type { Logger } from 'pino';
import { headerWire, readSamlLogoutRef, seal, unseal, type DpRoute, type SamlLogoutRef } from '@warren/shared';
import type { Outcome, RequestState, RouteStage } from '../pipeline/types.js';
import { splitMatch } from '../http/routing.js';
import { moduleError } from './common.js';

/**
 * The sign-in machinery shared by the `oidc` (oidc.ts), `oauth` (oauth.ts) and `saml` (saml.ts) route modules: key
 * derivation, the sealed cookies, session expiry, return-to sanitizing, the identity headers (all
 * pure: no network, no clock of its own), and the sign-in gate (`signInGate`, at the end), which
 * answers the reserved paths and decides 302/401/forward; the module supplies only how to reach
 * its provider.
 */

export interface OidcKeys {
  /** Seals the session cookie. */
  session: Buffer;
  /** Seals the short-lived pre-login cookie. */
  login: Buffer;
}

/**
 * The route's cookie keys, the same on every ingress node with no shared state and no extra
 * config: HKDF-SHA256 with the route's `client_secret` as input key material, the route id as
 * salt and `warren/oidc/<purpose>/v1 ‖ issuer ‖ client_id` as info. Changing the secret, the
 * issuer or the client id (or recreating the route) therefore ends every session of the route.
 */
export function deriveOidcKeys(clientSecret: string, routeId: string, issuer: string, clientId: string): OidcKeys {
  return deriveSessionKeys('oidc', clientSecret, routeId, issuer, clientId);
}

/**
 * The same derivation for any sign-in module: `module` (`oidc`, `oauth`) is part of the info, so
 * two modules never share keys; `provider` is the issuer (oidc) or the provider kind (oauth).
 */
export function deriveSessionKeys(module: string, clientSecret: string, routeId: string, provider: string, clientId: string): OidcKeys {
  const derive = (purpose: string) => Buffer.from(hkdfSync('sha256', Buffer.from(clientSecret, 'utf8'), Buffer.from(routeId, 'utf8'), Buffer.from(`warren/${module}/${purpose}/v1\0${provider}\0${clientId}`, 'utf8'), 32));
  return { session: derive('session'), login: derive('login') };
}

/** Sealing lives in @warren/shared (the control plane seals SAML hand-offs with it too). */
export { seal, unseal };

// ---------------------------------------------------------------- session

/** What the session cookie holds. Times are Unix seconds. */
export interface Session {
  /** Subject (`sub`) of the ID token. */
  sub: string;
  email: string;
  name: string;
  /** When the user signed in. */
  iat: number;
  /** When the session was last seen (refreshed at most once a minute, see SESSION_REFRESH_SECONDS). */
  seen: number;
  /** Hard end of the session: `iat + maximum_duration`. */
  exp: number;
  /** saml: what a LogoutRequest for this session needs besides the NameID (`sub`); see SamlLogoutRef. */
  slo?: SamlLogoutRef;
}

/** `maximum_duration: 0` (never set) means this: one day. */
export const DEFAULT_MAXIMUM_DURATION = 24 * 3600;
/** A sliding session's last-seen time (and its cookie) is rewritten at most this often. */
export const SESSION_REFRESH_SECONDS = 60;

export interface SessionPolicy {
  /** Seconds; 0 → DEFAULT_MAXIMUM_DURATION. */
  maximumDuration: number;
  /** Seconds of inactivity after which the session ends; 0 → no inactivity limit. */
  inactivityTimeout: number;
}

export function newSession(identity: Identity, now: number, p: SessionPolicy): Session {
  return { sub: identity.sub, email: identity.email, name: identity.name, ...(identity.slo ? { slo: identity.slo } : {}), iat: now, seen: now, exp: now + (p.maximumDuration || DEFAULT_MAXIMUM_DURATION) };
}

/** The session in a cookie value when it is well-formed and current, else null. */
export function readSession(key: Buffer, value: string | undefined, now: number, p: SessionPolicy): Session | null {
  const s = unseal(key, 'session', value) as Partial<Session> | null;
  if (!s || typeof s !== 'object') return null;
  if (typeof s.sub !== 'string' || !s.sub || typeof s.email !== 'string' || typeof s.name !== 'string') return null;
  if (!Number.isFinite(s.iat) || !Number.isFinite(s.seen) || !Number.isFinite(s.exp)) return null;
  if (s.slo !== undefined && !readSamlLogoutRef(s.slo)) return null;
  return sessionCurrent(s as Session, now, p) ? (s as Session) : null;
}

/**
 * True while a session may be used: before its hard end, within `maximum_duration` of sign-in
 * (so lowering `maximum_duration` also shortens sessions already issued), not idle for
 * `inactivity_timeout` or longer, and not from the future (60 s of clock skew between nodes allowed).
 */
export function sessionCurrent(s: Session, now: number, p: SessionPolicy): boolean {
  if (s.iat > now + 60 || s.seen > now + 60) return false;
  if (now >= s.exp) return false;
  if (now >= s.iat + (p.maximumDuration || DEFAULT_MAXIMUM_DURATION)) return false;
  if (p.inactivityTimeout > 0 && now >= s.seen + p.inactivityTimeout) return false;
  return true;
}

/** Whether this request should rewrite the cookie with a new last-seen time: only sliding sessions, at most once a minute. */
export function needsRefresh(s: Session, now: number, p: SessionPolicy): boolean {
  return p.inactivityTimeout > 0 && now - s.seen >= SESSION_REFRESH_SECONDS;
}

// ---------------------------------------------------------------- pre-login state

/** The pre-login cookie: what the callback checks the IdP's answer against. */
export interface LoginState {
  state: string;
  nonce: string;
  /** PKCE code verifier. */
  verifier: string;
  /** Same-host relative URL to return to (already sanitized). */
  returnTo: string;
  /** Unix seconds after which the login attempt is void. */
  exp: number;
}

/** How long a sign-in at the IdP may take. */
export const LOGIN_STATE_SECONDS = 600;

/**
 * Longest return-to kept in a pre-login cookie, in characters. A request's own path and query
 * (up to 2048 characters, `sanitizeReturnTo`) would make a ~3 KB cookie per navigation; a longer
 * one is kept without its query, or, still too long, replaced by the route's root
 * (`boundReturnTo`).
 */
export const MAX_RETURN_TO_CHARS = 512;

/**
 * Pre-login cookies of one sign-in a browser keeps at most (sign-ins started in parallel tabs):
 * starting one more expires the oldest, so however many navigations a page forces, the cookies
 * stay at a few KB (a ~1 KB cookie each) instead of filling the browser's Cookie header until the
 * host answers 431 to every request.
 */
export const MAX_LOGIN_COOKIES = 3;

/** `returnTo` (already sanitized) bounded to MAX_RETURN_TO_CHARS: without its query, else `fallback`. */
export function boundReturnTo(returnTo: string, fallback: string): string {
  if (returnTo.length <= MAX_RETURN_TO_CHARS) return returnTo;
  const q = returnTo.indexOf('?');
  const path = q < 0 ? returnTo : returnTo.slice(0, q);
  return path.length <= MAX_RETURN_TO_CHARS ? path : fallback;
}

export function readLoginState(key: Buffer, value: string | undefined, now: number): LoginState | null {
  const l = unseal(key, 'login', value) as Partial<LoginState> | null;
  if (!l || typeof l !== 'object') return null;
  if (typeof l.state !== 'string' || typeof l.nonce !== 'string' || typeof l.verifier !== 'string' || typeof l.returnTo !== 'string' || !Number.isFinite(l.exp)) return null;
  if (now >= l.exp!) return null;
  return l as LoginState;
}

// ---------------------------------------------------------------- cookies

/** The value of cookie `name` in a `Cookie` header (the first one), or undefined. */
export function getCookie(header: string | undefined, name: string): string | undefined {
  if (!header) return undefined;
  let i = 0;
  while (i < header.length) {
    let end = header.indexOf(';', i);
    if (end < 0) end = header.length;
    const eq = header.indexOf('=', i);
    if (eq > i && eq < end && header.slice(i, eq).trim() === name) return header.slice(eq + 1, end).trim();
    i = end + 1;
  }
  return undefined;
}

/** A `Cookie` header without the cookies `drop` says to drop; null when nothing is left. */
export function withoutCookies(header: string, drop: (name: string) => boolean): string | null {
  const kept: string[] = [];
  for (const part of header.split(';')) {
    const p = part.trim();
    if (!p) continue;
    const eq = p.indexOf('=');
    const name = eq < 0 ? p : p.slice(0, eq).trim();
    if (!drop(name)) kept.push(p);
  }
  return kept.length ? kept.join('; ') : null;
}

export interface CookieAttributes {
  path: string;
  maxAge: number;
  secure: boolean;
}

/** A `Set-Cookie` value: HttpOnly, SameSite=Lax, Secure on HTTPS. */
export function setCookie(name: string, value: string, a: CookieAttributes): string {
  return `${name}=${value}; Path=${a.path}; Max-Age=${Math.max(0, Math.floor(a.maxAge))}; HttpOnly; SameSite=Lax${a.secure ? '; Secure' : ''}`;
}

/**
 * The session cookie's name for a request's scheme: on HTTPS `__Host-<prefix><module>` (RFC 6265bis
 * §4.1.3.2: the browser keeps it only when set Secure, with Path=/ and no Domain, so neither a
 * sibling subdomain nor a plain-HTTP response can plant or overwrite it); on plain HTTP, where
 * browsers refuse a `__Host-` cookie, `<prefix><module>`.
 */
export function sessionCookieName(cookiePrefix: string, module: string, scheme: 'http' | 'https'): string {
  return `${scheme === 'https' ? '__Host-' : ''}${cookiePrefix}${module}`;
}

/**
 * A pre-login cookie's name: `<prefix><first 16 characters of the state>`, with `__Host-` in front
 * on HTTPS for the reason the session cookie has it (`sessionCookieName`): a pre-login cookie
 * planted by a sibling subdomain or a plain-HTTP response, with the planter's own state, would let
 * the planter complete a sign-in of their own in the victim's browser (login CSRF: the victim
 * then works signed in as the planter). Such a cookie must be set with Path=/ (so it is sent on
 * every request of the host for its 10 minutes, and removed before the upstream). On plain HTTP,
 * where browsers refuse the prefix, the name has none and the cookie's Path is the callback:
 * plain HTTP gives no such protection.
 */
export function loginCookieName(loginCookiePrefix: string, state: string, scheme: 'http' | 'https'): string {
  return `${scheme === 'https' ? '__Host-' : ''}${loginCookiePrefix}${state.slice(0, 16)}`;
}

/** `out` with one more `Set-Cookie` (an array when it then has several: each is sent as its own header). */
export function addSetCookie(out: NonNullable<Outcome>, cookie: string): NonNullable<Outcome> {
  const headers = { ...out.headers };
  const key = Object.keys(headers).find((h) => h.toLowerCase() === 'set-cookie') ?? 'set-cookie';
  const had = headers[key];
  headers[key] = had === undefined ? cookie : [...(Array.isArray(had) ? had : [had]), cookie];
  return { ...out, headers };
}

// ---------------------------------------------------------------- return-to

const CONTROL = /[\u0000-\u001f\u007f]/;

/**
 * A same-host relative URL (path and query) to return to after sign-in, or `fallback`. Refuses
 * anything that a browser could resolve to another origin: absolute URLs, scheme-relative
 * `//host`, backslashes (browsers read `/\host` as `//host`), control characters, and overlong
 * values; also refuses the module's own reserved paths (no redirect loop).
 */
export function sanitizeReturnTo(raw: string | null | undefined, fallback: string, reserved: (path: string) => boolean = () => false): string {
  if (!raw || raw.length > 2048 || raw[0] !== '/' || raw[1] === '/' || raw.includes('\\') || CONTROL.test(raw)) return fallback;
  let u: URL;
  try {
    u = new URL(raw, 'https://warren.invalid');
  } catch {
    return fallback;
  }
  if (u.origin !== 'https://warren.invalid') return fallback;
  // Dot segments are resolved above: `/.//evil.com` and `/a/..//evil.com` become `//evil.com`.
  if (u.pathname.startsWith('//')) return fallback;
  if (reserved(u.pathname)) return fallback;
  return u.pathname + u.search;
}

// ---------------------------------------------------------------- identity headers

/** Upstream identity headers (ngrok's names; see oidc.ts). */
export const IDENTITY_HEADERS = { email: 'ngrok-auth-user-email', id: 'ngrok-auth-user-id', name: 'ngrok-auth-user-name' } as const;
/** Every client header with this prefix is dropped, so that only the ingress sets identity headers. */
export const IDENTITY_HEADER_PREFIX = 'ngrok-auth-';

/**
 * Drops every `ngrok-auth-*` header (any case, and with `_` for `-`: CGI-style servers such as
 * WSGI, Rack and PHP map `ngrok_auth_user_email` and `ngrok-auth-user-email` to one variable) from
 * raw pairs. Edits in place.
 */
export function stripIdentityHeaders(pairs: string[]): void {
  let w = 0;
  for (let i = 0; i + 1 < pairs.length; i += 2) {
    if (pairs[i]!.toLowerCase().replace(/_/g, '-').startsWith(IDENTITY_HEADER_PREFIX)) continue;
    pairs[w++] = pairs[i]!;
    pairs[w++] = pairs[i + 1]!;
  }
  pairs.length = w;
}

/**
 * A claim as a header value: control characters dropped, and non-ASCII text sent as its UTF-8
 * bytes (`headerWire`, as every header value Warren sets).
 */
export function headerValue(v: string): string {
  // eslint-disable-next-line no-control-regex
  const clean = v.replace(/[\u0000-\u001f\u007f]/g, '').slice(0, 1024);
  return headerWire(clean);
}

// ---------------------------------------------------------------- the sign-in gate

/** The session fields every sign-in module (oidc, oauth, saml) has in the API. */
export interface SignInModuleFields {
  options_passthrough?: boolean;
  cookie_prefix?: string;
  inactivity_timeout?: number;
  maximum_duration?: number;
}

/** Who signed in, as the session keeps it and the identity headers carry it. */
export interface Identity {
  sub: string;
  email: string;
  name: string;
  /** saml: kept in the session for single logout (not sent upstream). */
  slo?: SamlLogoutRef;
}

/** A provider's refusal of a signed-in user (the oauth module's allow lists): 403. */
export interface Refusal {
  refused: string;
}

/** The provider is (or was found) unreachable: 502 at once, with this secret-free reason. */
export class ProviderUnavailable extends Error {}

/** What a sign-in module supplies to the gate: how to reach its provider. */
export interface SignInProvider {
  /** Where to send the browser; may reject (e.g. ProviderUnavailable while discovery backs off → 502). */
  authorizationUrl(login: LoginState, redirectUri: string): Promise<URL>;
  /**
   * Exchanges the callback (`callbackUrl` carries `code` and `state`) for the user. Rejections:
   * ProviderUnavailable, timeouts and network errors → 502; anything else (a refused code, a bad
   * ID token) → 400 with a way to sign in again.
   */
  exchange(callbackUrl: URL, login: LoginState, redirectUri: string): Promise<Identity | Refusal>;
  /**
   * Called at the logout path once the gate has decided to clear this browser's session cookie
   * (it always does): where the browser goes next (a URL: a 302 there, e.g. to the provider's
   * single logout), an answer of its own (an error page), or null for the gate's "signed out"
   * page. `session` is the session being cleared when its cookie is authentic and before its hard
   * end (an idle session counts: the user still wants it ended at the provider), else null;
   * `url` is the logout request's URL and `origin` its scheme://host[:port]. A rejection counts
   * as null (logged).
   */
  logout?(s: RequestState, url: URL, session: Session | null, origin: string): Promise<URL | NonNullable<Outcome> | null>;
}

export interface SignInGateOptions {
  /** `oidc`, `oauth` or `saml`: the reserved paths `<base>/.warren/<module>/…`, the cookie `<prefix><module>`, log fields. */
  module: string;
  route: DpRoute;
  keys: OidcKeys;
  policy: SessionPolicy;
  cookiePrefix: string;
  optionsPassthrough: boolean;
  /** `WWW-Authenticate` scheme of the 401 (`OIDC`, `OAuth`). */
  challenge: string;
  /** The provider in messages: `the OpenID provider`, `the GitHub OAuth provider`. */
  providerName: string;
  /** Named in a 502's detail for an unclassified network error (the issuer, the provider kind). */
  providerLabel: string;
  provider: SignInProvider;
  nowMs: () => number;
  log: Logger;
}

/** The route's path prefix without a trailing slash (`""` for `/`). */
export function routeBase(route: DpRoute): string {
  const { path } = splitMatch(route.match);
  return path.endsWith('/') ? path.slice(0, -1) : path;
}

/** Browser navigations are sent to the provider; everything else gets 401. */
export function isBrowserNavigation(s: RequestState): boolean {
  const m = s.req.method;
  return (m === 'GET' || m === 'HEAD') && (s.req.headers.accept ?? '').includes('text/html');
}

export const htmlEscape = (v: string) => v.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

/** A short, secret-free reason for a failed request to the provider. */
export function describeError(err: unknown): string {
  const e = err as { name?: string; message?: string; code?: string; cause?: { code?: string; message?: string } };
  if (e?.name === 'TimeoutError' || e?.name === 'AbortError') return 'timed out';
  const cause = e?.cause?.code ?? e?.cause?.message;
  const msg = (e?.message ?? String(err)).slice(0, 200);
  return cause ? `${msg} (${cause})` : msg;
}

/**
 * What a client is told of a callback the provider's answer failed (the detail is logged): an
 * OAuth error code the token endpoint answered (RFC 6749 §5.2, e.g. `invalid_grant`), nothing
 * more: messages and network details of the provider's side stay in the ingress's log.
 */
function rejectionReason(err: unknown): string {
  const code = (err as { error?: unknown })?.error;
  return typeof code === 'string' && /^[\w.-]{1,64}$/.test(code) ? `the provider's answer was not accepted (${code})` : "the provider's answer was not accepted";
}

/** True for errors that mean the provider was not reached (502), not that it said no (400). */
function isTransportError(err: unknown): boolean {
  const e = err as { name?: string; cause?: unknown };
  return err instanceof ProviderUnavailable || e?.name === 'TimeoutError' || e?.name === 'AbortError' || (e?.name === 'TypeError' && !!e.cause);
}

/** Where a sign-in flow answers and what it names its cookies (see `signInFlow`). */
export interface SignInFlowOptions extends Omit<SignInGateOptions, 'route' | 'cookiePrefix' | 'optionsPassthrough'> {
  /** The route's path prefix without a trailing slash (`""` for `/`): the fallback return-to. */
  base: string;
  /** The redirect URI's path. */
  callbackPath: string;
  /** Paths a return-to may not name (no redirect loop through the flow's own paths). */
  isReserved(path: string): boolean;
  /** The session cookie's name for a request's scheme. */
  sessionCookie(scheme: 'http' | 'https'): string;
  /** Pre-login cookies are `<prefix><first 16 characters of the state>`, `__Host-` in front on HTTPS (`loginCookieName`). */
  loginCookiePrefix: string;
  /** Path and query that start a sign-in returning to `returnTo` (the 401's `login=` and the "sign in again" links). */
  loginUrl(returnTo: string): string;
}

/**
 * The parts of a sign-in that do not depend on where they are mounted, shared by the route
 * modules' gate (`signInGate`) and the traffic policy's `oauth` / `openid-connect` actions
 * (`policy/auth-actions.ts`): the sealed pre-login and session cookies, the callback, logout,
 * starting a sign-in, the 302/401 challenge, the sliding refresh, and removing the flow's cookies
 * from what goes upstream.
 */
export interface SignInFlow {
  /** The redirect URI's answer: the session cookie and a 302 back, or an error page. */
  callback(s: RequestState): Promise<NonNullable<Outcome>>;
  /** Clears the session cookie, then the provider's next step or a "signed out" page. */
  logout(s: RequestState): Promise<NonNullable<Outcome>>;
  /** 302 to the provider (`returnTo` already sanitized), with the pre-login cookie. */
  startLogin(s: RequestState, returnTo: string): Promise<NonNullable<Outcome>>;
  /** The request's current session, or null; schedules the sliding refresh for `onResponse`. */
  session(s: RequestState): Session | null;
  /** A request without a session: 302 to the provider for browser navigations, else 401 naming the login URL. */
  challenge(s: RequestState): Promise<NonNullable<Outcome>> | NonNullable<Outcome>;
  /** Adds the sliding refresh's Set-Cookie, if `session()` scheduled one, to the upstream's response. */
  onResponse(s: RequestState, r: { headers: string[] }): void;
  /** Removes the flow's cookies (session, whichever scheme, and pre-login) from the request's Cookie headers. Edits `s.headers`. */
  dropCookies(s: RequestState): void;
  /** The request's own path and query (`/` when it has none). */
  ownTarget(s: RequestState): string;
  /** `scheme://host[:port]` of the request. */
  origin(s: RequestState): string;
}

export function signInFlow(o: SignInFlowOptions): SignInFlow {
  const { module, keys, policy, provider, log, base, callbackPath, isReserved, loginCookiePrefix } = o;
  const sessionCookie = (s: RequestState) => o.sessionCookie(s.scheme);
  const sessionCookieNames = new Set([o.sessionCookie('http'), o.sessionCookie('https')]);
  /** Set-Cookie to add to the upstream's response (a sliding session's refresh). */
  const refreshes = new WeakMap<RequestState, string>();

  const nowS = () => Math.floor(o.nowMs() / 1000);
  const origin = (s: RequestState) => `${s.scheme}://${(s.req.headers.host ?? s.host).toLowerCase()}`;
  const cookieAttrs = (s: RequestState, maxAge: number, path = '/') => ({ path, maxAge, secure: s.scheme === 'https' });
  /**
   * A pre-login cookie's name and attributes: `__Host-…` with Path=/ on HTTPS; on plain HTTP no
   * prefix and the route's path (so that starting a sign-in sees them, to expire the oldest).
   */
  const loginCookie = (s: RequestState, state: string) => loginCookieName(loginCookiePrefix, state, s.scheme);
  const loginCookieAttrs = (s: RequestState, maxAge: number) => cookieAttrs(s, maxAge, s.scheme === 'https' ? '/' : base || '/');
  /** Both session names (whichever scheme) and every pre-login cookie stay away from the upstream. */
  const dropOurCookies = (name: string) => sessionCookieNames.has(name) || name.startsWith(loginCookiePrefix) || name.startsWith(`__Host-${loginCookiePrefix}`);
  /** The request's own path and query, as the place to return to after sign-in. */
  const ownTarget = (s: RequestState) => {
    const url = s.req.url ?? '/';
    return url.startsWith('/') ? url : '/';
  };

  const dropCookies = (s: RequestState): void => {
    const cookieIdx = [] as number[];
    for (let i = 0; i + 1 < s.headers.length; i += 2) if (s.headers[i]!.toLowerCase() === 'cookie') cookieIdx.push(i);
    for (let j = cookieIdx.length - 1; j >= 0; j--) {
      const i = cookieIdx[j]!;
      const rest = withoutCookies(s.headers[i + 1]!, dropOurCookies);
      if (rest === null) s.headers.splice(i, 2);
      else s.headers[i + 1] = rest;
    }
  };

  /**
   * 502 for a provider that could not be reached, or whose discovery failed: one text whatever
   * the cause (a client must not learn which addresses and ports of the ingress's network answer,
   * and how: the provider may be a tenant's URL); the cause is logged.
   */
  const unavailable = (s: RequestState, err: unknown): NonNullable<Outcome> => {
    const detail = err instanceof ProviderUnavailable ? err.message : `${o.providerLabel}: ${describeError(err)}`;
    log.warn({ provider: o.providerLabel, reason: detail }, `${module}: provider unavailable`);
    return moduleError(s, 7107, `${o.providerName} of this route could not be reached; try again later`, { 'retry-after': '5' });
  };

  const loginAgain = (s: RequestState, returnTo: string) => `${origin(s)}${o.loginUrl(returnTo)}`;

  /** A page (HTML for browsers, else the JSON error) with a link to sign in again. */
  const page = (s: RequestState, code: 7108 | 7109, title: string, reason: string, returnTo: string): NonNullable<Outcome> => {
    const again = loginAgain(s, returnTo);
    const html = (s.req.headers.accept ?? '').includes('text/html');
    if (!html) return moduleError(s, code, `${title}: ${reason}; sign in again at ${again}`);
    const status = code === 7108 ? 400 : 403;
    const logoutHint = code === 7109 ? ` (signed in as another account at the provider? sign out there first)` : '';
    const body = `<!doctype html><html><head><meta charset="utf-8"><title>${status} ${htmlEscape(title)}</title></head><body><h1>${htmlEscape(title[0]!.toUpperCase() + title.slice(1))}</h1><p>${htmlEscape(reason)}</p><p><a href="${htmlEscape(again)}">Sign in again</a>${htmlEscape(logoutHint)}</p><p><code>ERR_WARREN_${code}</code></p></body></html>\n`;
    return { status, headers: { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store', 'warren-error-code': `ERR_WARREN_${code}` }, body };
  };

  const callbackFailed = (s: RequestState, reason: string, returnTo = base || '/'): NonNullable<Outcome> => {
    log.info({ reason }, `${module}: sign-in failed`);
    return page(s, 7108, 'sign-in failed', reason, returnTo);
  };

  /**
   * The pre-login cookies of this flow the request carries that must go for one more to be set
   * (MAX_LOGIN_COOKIES): the oldest of those this flow sealed (either name form: a plain-HTTP one
   * is sent over HTTPS too), as `Set-Cookie` values expiring them. Cookies it cannot open (another
   * route's, an older key's) are not its to expire, and not counted.
   */
  const expireOldLogins = (s: RequestState): string[] => {
    const header = s.req.headers.cookie;
    if (!header) return [];
    const now = nowS();
    const found = new Map<string, number>();
    for (const part of header.split(';')) {
      const eq = part.indexOf('=');
      if (eq < 0) continue;
      const name = part.slice(0, eq).trim();
      if (found.has(name) || !(name.startsWith(loginCookiePrefix) || name.startsWith(`__Host-${loginCookiePrefix}`))) continue;
      const l = readLoginState(keys.login, part.slice(eq + 1).trim(), now);
      if (l) found.set(name, l.exp);
    }
    if (found.size < MAX_LOGIN_COOKIES) return [];
    return [...found]
      .sort((x, y) => x[1] - y[1])
      .slice(0, found.size - MAX_LOGIN_COOKIES + 1)
      .map(([name]) => setCookie(name, '', name.startsWith('__Host-') ? cookieAttrs(s, 0, '/') : { path: base || '/', maxAge: 0, secure: false }));
  };

  /** 302 to the provider, with the pre-login state in its own cookie (and the oldest ones past MAX_LOGIN_COOKIES expired). */
  const startLogin = async (s: RequestState, returnTo: string): Promise<NonNullable<Outcome>> => {
    const login: LoginState = {
      state: randomBytes(32).toString('base64url'),
      nonce: randomBytes(32).toString('base64url'),
      verifier: randomBytes(32).toString('base64url'),
      returnTo: boundReturnTo(returnTo, base || '/'),
      exp: nowS() + LOGIN_STATE_SECONDS,
    };
    let url: URL;
    try {
      url = await provider.authorizationUrl(login, origin(s) + callbackPath);
    } catch (err) {
      return unavailable(s, err);
    }
    const expired = expireOldLogins(s);
    const cookie = setCookie(loginCookie(s, login.state), seal(keys.login, 'login', login), loginCookieAttrs(s, LOGIN_STATE_SECONDS));
    return {
      status: 302,
      headers: {
        location: url.href,
        'cache-control': 'no-store',
        'set-cookie': expired.length > 0 ? [...expired, cookie] : cookie,
        'content-type': 'text/plain; charset=utf-8',
      },
      body: `Sign-in required: ${url.href}\n`,
    };
  };

  /**
   * The callback's answer, with the pre-login cookie it consumed cleared (Max-Age=0, its own
   * Path): every answer, success or failure, ends that sign-in attempt.
   */
  const callback = async (s: RequestState): Promise<NonNullable<Outcome>> => {
    const state = new URL(origin(s) + ownTarget(s)).searchParams.get('state') ?? '';
    const name = state ? loginCookie(s, state) : null;
    const out = await callbackAnswer(s, name);
    if (!name || getCookie(s.req.headers.cookie, name) === undefined) return out;
    return addSetCookie(out, setCookie(name, '', loginCookieAttrs(s, 0)));
  };

  const callbackAnswer = async (s: RequestState, loginCookie: string | null): Promise<NonNullable<Outcome>> => {
    const url = new URL(origin(s) + ownTarget(s));
    const params = url.searchParams;
    const state = params.get('state') ?? '';
    const login = loginCookie ? readLoginState(keys.login, getCookie(s.req.headers.cookie, loginCookie), nowS()) : null;
    if (!login || login.state !== state) return callbackFailed(s, 'the sign-in expired, or was started in another browser');
    const idpError = params.get('error');
    if (idpError) return callbackFailed(s, `the provider answered ${idpError}${params.get('error_description') ? `: ${params.get('error_description')}` : ''}`.slice(0, 300), login.returnTo);
    let result: Identity | Refusal;
    try {
      result = await provider.exchange(url, login, origin(s) + callbackPath);
    } catch (err) {
      if (isTransportError(err)) return unavailable(s, err);
      log.info({ provider: o.providerLabel, reason: describeError(err) }, `${module}: the provider's answer was not accepted`);
      return callbackFailed(s, rejectionReason(err), login.returnTo);
    }
    if ('refused' in result) {
      log.info({ reason: result.refused }, `${module}: user not allowed`);
      return page(s, 7109, 'access denied', result.refused, login.returnTo);
    }
    const session = newSession(result, nowS(), policy);
    return {
      status: 302,
      headers: {
        location: login.returnTo,
        'cache-control': 'no-store',
        'set-cookie': setCookie(sessionCookie(s), seal(keys.session, 'session', session), cookieAttrs(s, session.exp - nowS())),
      },
      body: '',
    };
  };

  /** Clears this browser's session cookie; then the provider's next step (single logout) or the "signed out" page. */
  const logout = async (s: RequestState): Promise<NonNullable<Outcome>> => {
    const clear = setCookie(sessionCookie(s), '', cookieAttrs(s, 0));
    let next: URL | NonNullable<Outcome> | null = null;
    if (provider.logout) {
      const session = readSession(keys.session, getCookie(s.req.headers.cookie, sessionCookie(s)), nowS(), { ...policy, inactivityTimeout: 0 });
      try {
        next = await provider.logout(s, new URL(origin(s) + ownTarget(s)), session, origin(s));
      } catch (err) {
        log.warn({ reason: describeError(err) }, `${module}: single logout could not be started`);
      }
    }
    if (next instanceof URL) {
      return { status: 302, headers: { location: next.href, 'cache-control': 'no-store', 'set-cookie': clear, 'content-type': 'text/plain; charset=utf-8' }, body: `Signed out here; logout continues at ${next.href}\n` };
    }
    if (next) return addSetCookie(next, clear);
    return {
      status: 200,
      headers: { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store', 'set-cookie': clear },
      body: `<!doctype html><html><head><meta charset="utf-8"><title>Signed out</title></head><body><h1>Signed out</h1><p><a href="${htmlEscape(base || '/')}">Sign in again</a></p></body></html>\n`,
    };
  };

  const session = (s: RequestState): Session | null => {
    const now = nowS();
    const found = readSession(keys.session, getCookie(s.req.headers.cookie, sessionCookie(s)), now, policy);
    if (found && needsRefresh(found, now, policy)) {
      refreshes.set(s, setCookie(sessionCookie(s), seal(keys.session, 'session', { ...found, seen: now }), cookieAttrs(s, found.exp - now)));
    }
    return found;
  };

  const challenge = (s: RequestState): Promise<NonNullable<Outcome>> | NonNullable<Outcome> => {
    const returnTo = sanitizeReturnTo(ownTarget(s), base || '/', isReserved);
    if (isBrowserNavigation(s)) return startLogin(s, returnTo);
    const login = loginAgain(s, returnTo);
    return moduleError(s, 7106, `sign-in through ${o.providerName} of this route is required: open ${login} in a browser`, {
      'www-authenticate': `${o.challenge} realm="${s.host}", login="${login}"`,
    });
  };

  return {
    callback,
    logout,
    startLogin,
    session,
    challenge,
    onResponse(s, r) {
      const c = refreshes.get(s);
      if (c) r.headers.push('set-cookie', c);
    },
    dropCookies,
    ownTarget,
    origin,
  };
}

/**
 * The request side of a sign-in module (see oidc.ts for the behaviour, which oauth shares):
 * the reserved paths `<base>/.warren/<module>/{callback,login,logout}`, the sealed pre-login and
 * session cookies, 302 for browser navigations and 401 otherwise, OPTIONS passthrough, the sliding
 * session refresh, and the identity headers on what goes upstream.
 */
export function signInGate(o: SignInGateOptions): RouteStage {
  const base = routeBase(o.route);
  const reservedPrefix = `${base}/.warren/${o.module}/`;
  const loginPath = `${reservedPrefix}login`;
  const logoutPath = `${reservedPrefix}logout`;
  const isReserved = (p: string) => p.startsWith(reservedPrefix);
  const flow = signInFlow({
    ...o,
    base,
    callbackPath: `${reservedPrefix}callback`,
    isReserved,
    sessionCookie: (scheme) => sessionCookieName(o.cookiePrefix, o.module, scheme),
    loginCookiePrefix: `${o.cookiePrefix}${o.module}.login.`,
    loginUrl: (returnTo) => `${loginPath}?return_to=${encodeURIComponent(returnTo)}`,
  });

  const forward = (s: RequestState, session: Session | null): null => {
    stripIdentityHeaders(s.headers);
    flow.dropCookies(s);
    if (session) {
      if (session.email) s.headers.push(IDENTITY_HEADERS.email, headerValue(session.email));
      s.headers.push(IDENTITY_HEADERS.id, headerValue(session.sub));
      if (session.name) s.headers.push(IDENTITY_HEADERS.name, headerValue(session.name));
    }
    return null;
  };

  return {
    name: o.module,
    onRequest(s) {
      if (s.path.startsWith(reservedPrefix)) {
        if (s.path === `${reservedPrefix}callback`) return flow.callback(s);
        if (s.path === logoutPath) return flow.logout(s);
        if (s.path === loginPath) {
          const target = flow.ownTarget(s);
          const q = target.indexOf('?');
          const rt = q < 0 ? null : new URLSearchParams(target.slice(q + 1)).get('return_to');
          return flow.startLogin(s, sanitizeReturnTo(rt, base || '/', isReserved));
        }
        return moduleError(s, 7108, 'no such sign-in path');
      }
      const session = flow.session(s);
      if (session) return forward(s, session);
      if (o.optionsPassthrough && s.req.method === 'OPTIONS') return forward(s, null);
      return flow.challenge(s);
    },
    onResponse(s, r) {
      flow.onResponse(s, r);
    },
  };
}
