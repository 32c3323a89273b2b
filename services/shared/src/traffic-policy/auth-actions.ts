/**
 * Validation of the sign-in actions `oauth` and `openid-connect` (the ingress runs them, on the
 * route modules' sign-in machinery: `services/ingress/src/policy/auth-actions.ts`). Fields and
 * semantics follow ngrok's:
 * - https://ngrok.com/docs/traffic-policy/actions/oauth/ — `provider` (required), `auth_id`,
 *   `client_id`, `client_secret`, `scopes` ("additional scopes"), `authz_url_params`,
 *   `max_session_duration`, `idle_session_timeout`, `userinfo_refresh_interval`,
 *   `allow_cors_preflight`, `auth_cookie_domain`;
 * - https://ngrok.com/docs/traffic-policy/actions/oidc/ — the same with `issuer_url` (required)
 *   instead of `provider`, and `idle_session_duration` for the idle limit (ngrok's two pages name
 *   it differently: each action accepts both names, one at a time).
 * Authorization is not part of the actions (ngrok's model): later rules read
 * `actions.ngrok.oauth.identity.*` / `actions.ngrok.oidc.identity.*` (`auth-action-vars.ts`).
 *
 * Where Warren differs, the policy is refused with a 400 rather than run differently:
 * - both actions run on `inbound` rules only (ngrok: `on_http_request`);
 * - `client_id` and `client_secret` take no CEL interpolation (ngrok reads secrets from its vaults
 *   with it; Warren has none) and must be given together;
 * - `auth_cookie_domain` is refused: a session is sealed for one route (its keys are derived from
 *   the route id), so a cookie shared with other hosts could not be read by them anyway;
 * - durations are bounded (`AUTH_ACTION_LIMITS`); ngrok documents none;
 * - `issuer_url` on `localhost` or a literal private, loopback, link-local or otherwise
 *   non-public address is refused when the policy is saved, unless the operator sets
 *   `WARREN_OIDC_ALLOW_PRIVATE=1` (the shared ingress fetches it; it also refuses names that
 *   resolve to such addresses when it connects).
 * Left without `client_id`/`client_secret` (ngrok's managed app, which Warren does not have) a
 * policy is accepted, as the `oauth` route module is, and the route answers 503.
 *
 * Error messages never quote `client_secret`.
 */
import { parseDurationNs } from './duration.js';
import { privateHostRefusal, privateHostsAllowed } from './jwt-action.js';
import { at, expectList, expectObj, noUnknownKeys, onlyInbound, phaseKey, TrafficPolicyError, typeName } from './parse.js';
import type { PolicyDirection, TrafficPolicy } from './types.js';

/** ngrok's OAuth providers (the `oauth` route module supports the same eight). */
export const OAUTH_PROVIDERS = ['github', 'facebook', 'microsoft', 'google', 'linkedin', 'gitlab', 'twitch', 'amazon'] as const;
export type OAuthProviderKind = (typeof OAUTH_PROVIDERS)[number];

export const AUTH_ACTION_LIMITS = {
  /** `max_session_duration` when left out: one day (as the route modules' `maximum_duration: 0`). */
  defaultMaxSessionSeconds: 24 * 3600,
  /** Every duration is at least this… */
  minDurationSeconds: 60,
  /** …and at most this (90 days). */
  maxDurationSeconds: 90 * 24 * 3600,
  /** `client_id`, `client_secret`, and each `authz_url_params` value, in characters. */
  valueChars: 1024,
  /** `scopes` elements. */
  maxScopes: 64,
  /** `authz_url_params` entries. */
  maxAuthzParams: 32,
  /** `issuer_url`, UTF-8 bytes (as the `oidc` route module's `issuer`). */
  issuerBytes: 255,
} as const;

/**
 * What one run costs (≈ ns), charged to the policy's total (`parse.ts` `checkCost`): reading the
 * session cookie and opening it (AES-256-GCM over at most 4 KiB, a few µs), rounded up.
 */
export const AUTH_ACTION_COST = 20_000;

/**
 * Authorization request parameters the flow sets itself (RFC 6749 §4.1.1, OIDC Core §3.1.2.1,
 * RFC 7636): `authz_url_params` may not name them.
 */
const FLOW_PARAMS = new Set(['response_type', 'client_id', 'redirect_uri', 'scope', 'state', 'nonce', 'code_challenge', 'code_challenge_method']);

/** The validated form of what both actions share. Durations in whole seconds. */
export interface AuthActionConfig {
  /** As written, or the default (`oauth`: the provider; `openid-connect`: `oidc`). */
  auth_id: string;
  /** `''` when left out (no own app: the route answers 503). */
  client_id: string;
  client_secret: string;
  scopes: string[];
  authz_url_params: Record<string, string>;
  maxSessionSeconds: number;
  /** 0: no idle limit. */
  idleTimeoutSeconds: number;
  /** 0: never. */
  userinfoRefreshSeconds: number;
  allow_cors_preflight: boolean;
}

/** `oauth` (inbound only): sign-in through `provider`; non-terminating once the session is valid. */
export interface OAuthAction {
  type: 'oauth';
  config: AuthActionConfig & { provider: OAuthProviderKind };
}

/** `openid-connect` (inbound only): sign-in at the OpenID provider `issuer_url`; non-terminating once the session is valid. */
export interface OpenIdConnectAction {
  type: 'openid-connect';
  config: AuthActionConfig & { issuer_url: string };
}

const COMMON_FIELDS = ['auth_id', 'client_id', 'client_secret', 'scopes', 'authz_url_params', 'max_session_duration', 'idle_session_timeout', 'idle_session_duration', 'userinfo_refresh_interval', 'allow_cors_preflight', 'auth_cookie_domain'];

const AUTH_ID_RE = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;
const PARAM_NAME_RE = /^[A-Za-z0-9_.~-]{1,64}$/;
/** An OAuth scope-token (RFC 6749 §3.3): printable ASCII without space, `"` or `\`. */
const SCOPE_RE = /^[\x21\x23-\x5b\x5d-\x7e]{1,256}$/;
// eslint-disable-next-line no-control-regex
const CONTROL_RE = /[\u0000-\u001f\u007f]/;

/**
 * The operator's switch that lets an OpenID issuer (the `openid-connect` action's `issuer_url`,
 * the `oidc` route module's `issuer`) name a private, loopback or link-local host: `1` in the
 * environment of the control plane (checked when a route or policy is saved) and of the ingress
 * (checked when an agent binds a policy, and when the ingress connects to the provider).
 */
export const OIDC_ALLOW_PRIVATE_ENV = 'WARREN_OIDC_ALLOW_PRIVATE';

export function oidcPrivateAllowed(env: NodeJS.ProcessEnv = process.env): boolean {
  return privateHostsAllowed(OIDC_ALLOW_PRIVATE_ENV, env);
}

/**
 * Why `s` is not an acceptable OpenID issuer, or null (shared with the `oidc` route module's API
 * check). `checkHost` (when saving, unless `WARREN_OIDC_ALLOW_PRIVATE=1`): a host that is
 * `localhost` or a literal non-public address is refused too, as JWK set URLs are: the shared
 * ingress fetches the issuer's discovery document, and would otherwise probe its own network for
 * any tenant (the ingress also refuses names resolving to such addresses when it connects).
 */
export function issuerProblem(s: string, checkHost = false): string | null {
  if (Buffer.byteLength(s, 'utf8') > AUTH_ACTION_LIMITS.issuerBytes) return `must be at most ${AUTH_ACTION_LIMITS.issuerBytes} bytes`;
  let u: URL | undefined;
  try {
    u = new URL(s);
  } catch {
    /* reported below */
  }
  if (!u || u.protocol !== 'https:' || !u.hostname || /\s/.test(s)) return 'must be an https URL';
  // OpenID Connect Discovery 1.0 §2: an issuer has no query or fragment; credentials in it would leak into logs.
  if (u.search || u.hash || s.includes('#') || s.includes('?')) return 'must not have a query or fragment';
  if (u.username || u.password) return 'must not contain credentials';
  if (checkHost) {
    const why = privateHostRefusal(u);
    if (why) return `${why}; the OpenID provider is reached by the shared ingress, so private and loopback hosts are refused unless the operator sets ${OIDC_ALLOW_PRIVATE_ENV}=1`;
  }
  return null;
}

function optionalString(v: unknown, path: string, secret: boolean): string {
  if (v === undefined || v === null) return '';
  if (typeof v !== 'string') throw new TrafficPolicyError(path, `must be a string, got ${typeName(v)}`);
  const shown = secret ? 'the value' : JSON.stringify(v.slice(0, 64));
  if (v.length > AUTH_ACTION_LIMITS.valueChars) throw new TrafficPolicyError(path, `must be at most ${AUTH_ACTION_LIMITS.valueChars} characters`);
  if (CONTROL_RE.test(v)) throw new TrafficPolicyError(path, `${shown} has a control character`);
  if (v.includes('${')) throw new TrafficPolicyError(path, 'CEL interpolation (${…}) is not supported here: Warren has no secret vault to read from; write the value itself');
  return v;
}

/** A duration field in whole seconds, `fallback` when left out. */
function durationSeconds(v: unknown, path: string, fallback: number): number {
  if (v === undefined || v === null) return fallback;
  const L = AUTH_ACTION_LIMITS;
  if (typeof v !== 'string') throw new TrafficPolicyError(path, `must be a duration string such as "30m" or "8h", got ${typeName(v)}`);
  const ns = parseDurationNs(v);
  if (ns === undefined) throw new TrafficPolicyError(path, `${JSON.stringify(v.slice(0, 64))} is not a duration; write it like "30m", "8h" or "1h30m"`);
  const seconds = Number(ns / 1_000_000_000n);
  if (seconds < L.minDurationSeconds || seconds > L.maxDurationSeconds) throw new TrafficPolicyError(path, `must be from 1m to 2160h (90 days), got ${JSON.stringify(v)}`);
  return seconds;
}

function parseCommon(c: Record<string, unknown>, path: string, defaultAuthId: string): AuthActionConfig {
  const L = AUTH_ACTION_LIMITS;
  let auth_id = defaultAuthId;
  if (c.auth_id !== undefined && c.auth_id !== null) {
    if (typeof c.auth_id !== 'string') throw new TrafficPolicyError(at(path, 'auth_id'), `must be a string, got ${typeName(c.auth_id)}`);
    if (!AUTH_ID_RE.test(c.auth_id)) throw new TrafficPolicyError(at(path, 'auth_id'), `${JSON.stringify(c.auth_id.slice(0, 64))} is not an auth id: 1 to 64 letters, digits, '-', '_' or '.', starting with a letter or digit`);
    auth_id = c.auth_id;
  }
  const client_id = optionalString(c.client_id, at(path, 'client_id'), false);
  const client_secret = optionalString(c.client_secret, at(path, 'client_secret'), true);
  if (client_id && !client_secret) throw new TrafficPolicyError(at(path, 'client_secret'), 'is required with client_id (client_id and client_secret are given together)');
  if (client_secret && !client_id) throw new TrafficPolicyError(at(path, 'client_id'), 'is required with client_secret (client_id and client_secret are given together)');

  const rawScopes = expectList(c.scopes, at(path, 'scopes'), true);
  if (rawScopes.length > L.maxScopes) throw new TrafficPolicyError(at(path, 'scopes'), `must have at most ${L.maxScopes} scopes, got ${rawScopes.length}`);
  const scopes = rawScopes.map((s, i) => {
    const p = at(at(path, 'scopes'), i);
    if (typeof s !== 'string') throw new TrafficPolicyError(p, `must be a string, got ${typeName(s)}`);
    if (!SCOPE_RE.test(s)) throw new TrafficPolicyError(p, `${JSON.stringify(s.slice(0, 64))} is not a scope (1 to 256 printable ASCII characters without spaces, '"' or '\\')`);
    return s;
  });

  const authz_url_params: Record<string, string> = {};
  if (c.authz_url_params !== undefined && c.authz_url_params !== null) {
    const m = expectObj(c.authz_url_params, at(path, 'authz_url_params'), 'authz_url_params');
    const names = Object.keys(m);
    if (names.length > L.maxAuthzParams) throw new TrafficPolicyError(at(path, 'authz_url_params'), `must have at most ${L.maxAuthzParams} parameters, got ${names.length}`);
    for (const name of names) {
      const p = at(at(path, 'authz_url_params'), name);
      if (!PARAM_NAME_RE.test(name)) throw new TrafficPolicyError(p, `${JSON.stringify(name.slice(0, 64))} is not a parameter name (1 to 64 letters, digits, '-', '_', '.' or '~')`);
      if (FLOW_PARAMS.has(name.toLowerCase())) throw new TrafficPolicyError(p, `${name} is set by the sign-in flow itself and cannot be given`);
      const v = m[name];
      if (typeof v !== 'string') throw new TrafficPolicyError(p, `must be a string, got ${typeName(v)}`);
      if (v.length > L.valueChars || CONTROL_RE.test(v)) throw new TrafficPolicyError(p, `must be at most ${L.valueChars} characters without control characters`);
      authz_url_params[name] = v;
    }
  }

  if (c.idle_session_timeout !== undefined && c.idle_session_timeout !== null && c.idle_session_duration !== undefined && c.idle_session_duration !== null)
    throw new TrafficPolicyError(at(path, 'idle_session_duration'), 'give idle_session_timeout or idle_session_duration (the same setting), not both');
  const idleField = c.idle_session_duration !== undefined && c.idle_session_duration !== null ? 'idle_session_duration' : 'idle_session_timeout';
  const maxSessionSeconds = durationSeconds(c.max_session_duration, at(path, 'max_session_duration'), L.defaultMaxSessionSeconds);
  const idleTimeoutSeconds = durationSeconds(c[idleField], at(path, idleField), 0);
  const userinfoRefreshSeconds = durationSeconds(c.userinfo_refresh_interval, at(path, 'userinfo_refresh_interval'), 0);

  let allow_cors_preflight = false;
  if (c.allow_cors_preflight !== undefined && c.allow_cors_preflight !== null) {
    if (typeof c.allow_cors_preflight !== 'boolean') throw new TrafficPolicyError(at(path, 'allow_cors_preflight'), `must be true or false, got ${typeName(c.allow_cors_preflight)}`);
    allow_cors_preflight = c.allow_cors_preflight;
  }
  if (c.auth_cookie_domain !== undefined && c.auth_cookie_domain !== null)
    throw new TrafficPolicyError(at(path, 'auth_cookie_domain'), "is not supported: a session is sealed for this route alone (the cookie is kept by this host only, as __Host- cookies are), so other hosts could not use it");

  return { auth_id, client_id, client_secret, scopes, authz_url_params, maxSessionSeconds, idleTimeoutSeconds, userinfoRefreshSeconds, allow_cors_preflight };
}

export function parseOAuthConfig(raw: unknown, path: string, direction: PolicyDirection): OAuthAction['config'] {
  onlyInbound('oauth', path, direction, 'it signs in the request');
  const c = expectObj(raw, path, 'config');
  noUnknownKeys(c, path, ['provider', ...COMMON_FIELDS]);
  if (c.provider === undefined || c.provider === null) throw new TrafficPolicyError(at(path, 'provider'), 'is required');
  if (typeof c.provider !== 'string') throw new TrafficPolicyError(at(path, 'provider'), `must be a string, got ${typeName(c.provider)}`);
  const provider = c.provider.toLowerCase() as OAuthProviderKind;
  if (!(OAUTH_PROVIDERS as readonly string[]).includes(provider))
    throw new TrafficPolicyError(at(path, 'provider'), `OAuth provider ${JSON.stringify(c.provider.slice(0, 64))} is not supported; supported: ${OAUTH_PROVIDERS.join(', ')}`);
  return { provider, ...parseCommon(c, path, provider) };
}

/**
 * `saving`: the policy is being saved (the control plane, or the ingress binding an agent's
 * policy): an issuer on a literal private / loopback host is refused unless
 * `WARREN_OIDC_ALLOW_PRIVATE=1` in this process; a stored policy re-validated at the ingress
 * leaves that to the ingress's guarded connections.
 */
export function parseOpenIdConnectConfig(raw: unknown, path: string, direction: PolicyDirection, saving = false): OpenIdConnectAction['config'] {
  onlyInbound('openid-connect', path, direction, 'it signs in the request');
  const c = expectObj(raw, path, 'config');
  noUnknownKeys(c, path, ['issuer_url', ...COMMON_FIELDS]);
  if (c.issuer_url === undefined || c.issuer_url === null || c.issuer_url === '') throw new TrafficPolicyError(at(path, 'issuer_url'), 'is required');
  if (typeof c.issuer_url !== 'string') throw new TrafficPolicyError(at(path, 'issuer_url'), `must be a string, got ${typeName(c.issuer_url)}`);
  const problem = issuerProblem(c.issuer_url, saving && !oidcPrivateAllowed());
  if (problem) throw new TrafficPolicyError(at(path, 'issuer_url'), problem);
  return { issuer_url: c.issuer_url, ...parseCommon(c, path, 'oidc') };
}

/**
 * Refuses two different sign-in actions with one `auth_id` (their cookies and
 * `/ngrok/login?auth_id=…` would be ambiguous): a 400 naming the second one's `auth_id`. The same
 * action written twice (identical type and config) is allowed and is one sign-in.
 */
export function checkAuthIds(policy: TrafficPolicy): void {
  const seen = new Map<string, { where: string; same: string }>();
  policy.inbound.forEach((rule, i) =>
    rule.actions.forEach((a, j) => {
      if (a.type !== 'oauth' && a.type !== 'openid-connect') return;
      const where = `${phaseKey(policy, 'inbound')}[${i}].actions[${j}]`;
      const same = JSON.stringify([a.type, a.config]);
      const first = seen.get(a.config.auth_id);
      // The same action repeated (e.g. in rules for different paths) is one sign-in with one session.
      if (first && first.same !== same)
        throw new TrafficPolicyError(`${where}.config.auth_id`, `auth_id ${JSON.stringify(a.config.auth_id)} is already used by ${first.where} with another configuration; give each different oauth / openid-connect action its own auth_id`);
      if (!first) seen.set(a.config.auth_id, { where, same });
    }),
  );
}
