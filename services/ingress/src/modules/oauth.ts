import * as client from 'openid-client';
import type { RouteStage, StageFactory } from '../pipeline/types.js';
import { enabledModule } from './common.js';
import { DiscoveryCache, REQUEST_TIMEOUT_S } from './oidc-discovery.js';
import { oidcAuthorizationUrl, oidcExchange } from './oidc.js';
import { DEFAULT_MAXIMUM_DURATION, ProviderUnavailable, deriveSessionKeys, signInGate, type Identity, type LoginState, type Refusal, type SessionPolicy, type SignInModuleFields, type SignInProvider } from './oidc-session.js';
import { MICROSOFT_CONSUMER_TENANT, OAUTH_PROVIDER_KINDS, PROVIDERS, parseEndpointOverrides, type OAuthProviderKind, type ProviderEndpoints, type ProviderSpec } from './oauth-providers.js';
import { isAllowed, rulesFrom, verifiedOidcEmail, type AllowRules, type UserFacts } from './oauth-rules.js';

/**
 * `oauth`: sign-in through one of eight identity providers (github, facebook, microsoft, google,
 * linkedin, gitlab, twitch, amazon; see oauth-providers.ts for each one's endpoints and sources),
 * on the `oidc` module's machinery (oidc-session.ts `signInGate`): the same reserved paths under
 * the route's prefix, `<base>/.warren/oauth/{callback,login,logout}` (register
 * `https://<hostname><base>/.warren/oauth/callback` as the app's redirect URI), the same 302 for
 * browser navigations and 401 (7106, `WWW-Authenticate: OAuth realm=…, login=…`) otherwise,
 * `options_passthrough`, the sealed session cookie `__Host-<cookie_prefix>oauth` on HTTPS and
 * `<cookie_prefix>oauth` on plain HTTP (as oidc.ts explains; keys from HKDF over the
 * route's `client_secret`), `inactivity_timeout` and `maximum_duration`, and the identity headers
 * `ngrok-auth-user-email` (only an address the provider vouches for), `ngrok-auth-user-id` (the
 * provider's user id: GitHub's numeric id, the OpenID `sub`, Facebook's id, Amazon's `user_id`)
 * and `ngrok-auth-user-name` (GitHub: name, else login; Twitch: `preferred_username`), with
 * client-sent `ngrok-auth-*` headers removed.
 *
 * Authorization (oauth-rules.ts) runs at sign-in with the user's token: no lists → any user of
 * the provider; otherwise a matching verified email, email domain, GitHub organization or GitHub
 * team. A signed-in user who matches none gets 403 (7109) with a page saying so. GitHub's part
 * after the token (user, emails, organization and team pages, each request bounded at 10 s) has
 * one overall deadline, GITHUB_AUTHORIZATION_DEADLINE_MS; past it the callback answers 502 (7107)
 * like any unreachable provider.
 *
 * Scopes: the route's `scopes` when given (OpenID providers always get `openid` too), else the
 * provider's defaults; for github `read:user user:email`, plus `read:org` when `organizations` or
 * `teams` are set (without it GitHub hides private memberships).
 *
 * `auth_check_interval`: the session is re-established through the provider after that many
 * seconds (the session's lifetime is the smaller of it and `maximum_duration`): a browser is sent
 * through the provider again (usually without a prompt, the provider remembering the user), which
 * re-runs every rule with fresh data; an API client gets 401 until then. The provider's token is
 * not kept in the cookie.
 *
 * Without `client_id` and `client_secret` ngrok signs in through its own managed app; Warren has
 * none, so such a route answers 503 (7010) saying they are required. The control plane still
 * accepts it, as the API allows.
 *
 * Endpoints can be overridden per ingress process with WARREN_OAUTH_PROVIDER_ENDPOINTS (see
 * oauth-providers.ts `parseEndpointOverrides`): GitHub Enterprise Server, a self-managed GitLab,
 * and tests. A multi-tenant Microsoft issuer at another host than login.microsoftonline.com (a
 * national cloud) is not supported: openid-client applies its {tenantid} issuer check only to that
 * host, so discovery elsewhere fails (502). A provider with a private CA needs it in the ingress's
 * NODE_EXTRA_CA_CERTS.
 *
 * Every URL this module requests is Warren's (oauth-providers.ts) or the operator's
 * (WARREN_OAUTH_PROVIDER_ENDPOINTS), or named by that provider (its discovery document; GitHub's
 * `Link: rel="next"`, followed on the API's own origin only): no tenant-supplied URL is fetched
 * (`authz_url_params` only go into the browser's redirect), so these requests do not go through
 * the private-address guard the tenant-named OpenID issuers go through (oidc-discovery.ts), and
 * an operator may point a provider at a private GitHub Enterprise or GitLab.
 */

interface OAuthProviderConfig {
  client_id?: string;
  client_secret?: string;
  scopes?: string[];
  email_addresses?: string[];
  email_domains?: string[];
  teams?: string[];
  organizations?: string[];
}

interface OAuthModule extends SignInModuleFields {
  provider?: Partial<Record<OAuthProviderKind, OAuthProviderConfig | null>>;
  auth_check_interval?: number;
}

export interface OAuthOptions {
  now?: () => number;
  discovery?: DiscoveryCache;
  /** Endpoint overrides; default: WARREN_OAUTH_PROVIDER_ENDPOINTS of the process. */
  endpoints?: string;
  /** fetch for the providers' token, userinfo and API requests (tests; OpenID discovery goes through `discovery`). */
  fetch?: client.CustomFetch;
  /** The deadline of GitHub's post-token checks (default GITHUB_AUTHORIZATION_DEADLINE_MS; tests). */
  githubDeadlineMs?: number;
}

/** The whole of GitHub's post-token phase (user, emails, every organization and team page) ends within this. */
export const GITHUB_AUTHORIZATION_DEADLINE_MS = 20_000;

/**
 * `run` (given an AbortSignal that fires at the deadline, to stop issuing requests) raced against
 * `ms`: past it, ProviderUnavailable (502) saying what did not finish.
 */
async function withDeadline<T>(ms: number, what: string, run: (signal: AbortSignal) => Promise<T>): Promise<T> {
  const ac = new AbortController();
  let timer: NodeJS.Timeout | undefined;
  const expired = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      const err = new ProviderUnavailable(`${what} did not finish within ${ms / 1000} s`);
      ac.abort(err);
      reject(err);
    }, ms);
  });
  try {
    return await Promise.race([run(ac.signal), expired]);
  } finally {
    clearTimeout(timer);
  }
}

/** How many pages of /user/orgs or /user/teams (100 each) are read at most. */
const MAX_PAGES = 10;

/** The session policy: `auth_check_interval` (when set) bounds the session like `maximum_duration`. */
export function oauthSessionPolicy(m: Pick<OAuthModule, 'maximum_duration' | 'inactivity_timeout' | 'auth_check_interval'>): SessionPolicy {
  const max = m.maximum_duration || DEFAULT_MAXIMUM_DURATION;
  const check = m.auth_check_interval ?? 0;
  return { maximumDuration: check > 0 ? Math.min(max, check) : max, inactivityTimeout: m.inactivity_timeout ?? 0 };
}

/** The scope string asked for. */
export function oauthScopes(spec: ProviderSpec, configured: readonly string[] | undefined, orgRules: boolean): string {
  const list = configured && configured.length > 0 ? [...configured] : spec.defaultScopes(orgRules);
  return [...new Set(spec.family === 'oidc' ? ['openid', ...list] : list)].join(' ');
}

const str = (v: unknown) => (typeof v === 'string' ? v : typeof v === 'number' ? String(v) : '');

/** A JSON GET with the user's token; throws on a non-2xx answer (naming the path, never the token). */
async function getJson(config: client.Configuration, token: string, url: URL, headers: Record<string, string> = {}, signal?: AbortSignal): Promise<{ body: unknown; next: URL | null }> {
  signal?.throwIfAborted();
  const res = await client.fetchProtectedResource(config, token, url, 'GET', undefined, new Headers({ accept: 'application/json', ...headers }));
  if (!res.ok) {
    await res.body?.cancel();
    throw new Error(`${url.pathname} answered ${res.status}`);
  }
  const body = (await res.json()) as unknown;
  const m = /<([^>]+)>;\s*rel="next"/.exec(res.headers.get('link') ?? '');
  let next: URL | null = null;
  if (m) {
    const n = new URL(m[1]!, url);
    if (n.origin === url.origin) next = n;
  }
  return { body, next };
}

/** The GitHub REST API with the user's token (https://docs.github.com/en/rest). */
function githubUser(config: client.Configuration, token: string, api: string, signal: AbortSignal) {
  const headers = { accept: 'application/vnd.github+json', 'x-github-api-version': '2022-11-28', 'user-agent': 'warren-ingress' };
  const get = (path: string) => getJson(config, token, new URL(api + path), headers, signal);
  const pages = async <T>(path: string, pick: (item: T) => string): Promise<string[]> => {
    const out: string[] = [];
    let url: URL | null = new URL(`${api}${path}?per_page=100`);
    for (let i = 0; url && i < MAX_PAGES; i++) {
      const r: { body: unknown; next: URL | null } = await getJson(config, token, url, headers, signal);
      if (!Array.isArray(r.body)) throw new Error(`${path} did not answer a list`);
      for (const item of r.body as T[]) out.push(pick(item));
      url = r.next;
    }
    return out.filter(Boolean);
  };
  return {
    async identity(needEmails: boolean): Promise<{ id: Identity; facts: UserFacts }> {
      const u = (await get('/user')).body as { id?: number | string; login?: string; name?: string | null; email?: string | null };
      if (u?.id === undefined || !u.login) throw new Error('/user answered no id');
      let verified: string[] = [];
      let primary = '';
      try {
        const emails = (await get('/user/emails')).body as Array<{ email?: string; verified?: boolean; primary?: boolean }>;
        if (!Array.isArray(emails)) throw new Error('/user/emails did not answer a list');
        verified = emails.filter((e) => e.verified === true && typeof e.email === 'string').map((e) => e.email!);
        primary = emails.find((e) => e.primary && e.verified === true)?.email ?? verified[0] ?? '';
      } catch (err) {
        // without the user:email scope (a route's own `scopes`): no verified address is known
        if (needEmails) throw err;
      }
      return {
        id: { sub: String(u.id), email: primary, name: u.name || u.login },
        facts: {
          verifiedEmails: verified,
          organizations: () => pages<{ login?: string }>('/user/orgs', (o) => o.login ?? ''),
          teams: () => pages<{ slug?: string; organization?: { login?: string } }>('/user/teams', (t) => (t.slug && t.organization?.login ? `${t.organization.login}/${t.slug}` : '')),
        },
      };
    },
  };
}

/** What `oauthProvider` needs: the provider, the app, what to ask for, and how to reach it. */
export interface OAuthProviderParams {
  kind: OAuthProviderKind;
  eps: ProviderEndpoints;
  clientId: string;
  secret: string;
  scope: string;
  rules: AllowRules;
  /** Extra authorization request parameters (the policy action's `authz_url_params`); never replace the flow's own. */
  extra?: Record<string, string>;
  discovery: DiscoveryCache;
  log: { info(o: object, m: string): void };
  fetch?: client.CustomFetch;
  githubDeadlineMs?: number;
}

/**
 * The provider-specific half of a sign-in, shared by the `oauth` route module and the traffic
 * policy's `oauth` action (`policy/auth-actions.ts`, with no allow lists: its rules authorize).
 */
export function oauthProvider(p: OAuthProviderParams): SignInProvider {
  const { kind, eps, clientId, secret, scope, rules, discovery, log, extra = {} } = p;
  const spec = PROVIDERS[kind];
  const fetchImpl = p.fetch;
  const githubDeadlineMs = p.githubDeadlineMs ?? GITHUB_AUTHORIZATION_DEADLINE_MS;
  const refusal = (who: string): Refusal => ({
    refused: `the ${spec.label} account ${who} is not allowed to use this route: it matches none of the route's allowed email addresses, email domains${kind === 'github' ? ', organizations or teams' : ''}`,
  });
  const checked = async (id: Identity, facts: UserFacts, who: string): Promise<Identity | Refusal> => ((await isAllowed(rules, facts)) ? id : refusal(who));

  if (spec.family === 'oidc') {
    const issuer = eps.issuer!;
    const config = async () => {
      // Warren's fixed issuer or the operator's override (WARREN_OAUTH_PROVIDER_ENDPOINTS), never a tenant's: not guarded.
      const c = await discovery.config(issuer, clientId, secret, spec.auth, { trusted: true });
      if (fetchImpl) c[client.customFetch] = fetchImpl;
      return c;
    };
    const opts = { pkce: spec.pkce, nonce: spec.nonce };
    return {
      authorizationUrl: async (login: LoginState, redirectUri: string) => oidcAuthorizationUrl(await config(), login, redirectUri, scope, { ...extra, ...spec.extra }, opts),
      exchange: async (url: URL, login: LoginState): Promise<Identity | Refusal> => {
        const claims = await oidcExchange(await config(), url, login, (c) => typeof c.email !== 'string' || (kind !== 'microsoft' && c.email_verified === undefined) || typeof (c.name ?? c.preferred_username) !== 'string', log, opts);
        const email = verifiedOidcEmail(kind, claims, MICROSOFT_CONSUMER_TENANT) ?? '';
        const id: Identity = { sub: claims.sub, email, name: str(claims.name) || str(claims.preferred_username) };
        return checked(id, { verifiedEmails: email ? [email] : [] }, email || str(claims.preferred_username) || claims.sub);
      },
    };
  }

  const metadata: client.ServerMetadata = { issuer: new URL(eps.authorization!).origin, authorization_endpoint: eps.authorization!, token_endpoint: eps.token! };
  const config = new client.Configuration(metadata, clientId, secret, client.ClientSecretPost(secret));
  config.timeout = REQUEST_TIMEOUT_S;
  if (fetchImpl) config[client.customFetch] = fetchImpl;
  return {
    authorizationUrl: async (login: LoginState, redirectUri: string) => {
      const params: Record<string, string> = { ...extra, redirect_uri: redirectUri, scope, state: login.state };
      if (spec.pkce) {
        params.code_challenge = await client.calculatePKCECodeChallenge(login.verifier);
        params.code_challenge_method = 'S256';
      }
      return client.buildAuthorizationUrl(config, params);
    },
    exchange: async (url: URL, login: LoginState): Promise<Identity | Refusal> => {
      const tokens = await client.authorizationCodeGrant(config, url, { pkceCodeVerifier: spec.pkce ? login.verifier : undefined, expectedState: login.state, idTokenExpected: false });
      const token = tokens.access_token;
      if (kind === 'github') {
        return withDeadline(githubDeadlineMs, "GitHub's user, email, organization and team checks", async (signal) => {
          const gh = githubUser(config, token, eps.api!, signal);
          const { id, facts } = await gh.identity(rules.emailAddresses.length + rules.emailDomains.length > 0);
          return checked(id, facts, id.email || id.name);
        });
      }
      // facebook: {id, name, email}; amazon: {user_id, name, email}
      const u = (await getJson(config, token, new URL(eps.userinfo!))).body as Record<string, unknown>;
      const sub = str(u.id) || str(u.user_id);
      if (!sub) throw new Error('the user endpoint answered no id');
      const email = str(u.email);
      const id: Identity = { sub, email, name: str(u.name) };
      return checked(id, { verifiedEmails: email ? [email] : [] }, email || sub);
    },
  };
}

/** Parsed WARREN_OAUTH_PROVIDER_ENDPOINTS values (or why one is bad), by the text. */
const parsedOverrides = new Map<string, ReturnType<typeof parseEndpointOverrides> | Error>();

/**
 * A provider's endpoints: its public ones with the overrides of `raw` (default: the process's
 * WARREN_OAUTH_PROVIDER_ENDPOINTS). Throws when the overrides are bad (the route then answers 503).
 */
export function oauthEndpoints(kind: OAuthProviderKind, raw: string | undefined = process.env.WARREN_OAUTH_PROVIDER_ENDPOINTS): ProviderEndpoints {
  const key = raw ?? '';
  let overrides = parsedOverrides.get(key);
  if (overrides === undefined) {
    try {
      overrides = parseEndpointOverrides(raw);
    } catch (err) {
      overrides = err as Error;
    }
    parsedOverrides.set(key, overrides);
  }
  if (overrides instanceof Error) throw new Error(`oauth: ${overrides.message}`);
  return { ...PROVIDERS[kind].endpoints, ...overrides[kind] };
}

export function createOAuthStage(opts: OAuthOptions = {}): StageFactory {
  const nowMs = opts.now ?? Date.now;
  const discovery = opts.discovery ?? new DiscoveryCache();
  const endpointsFor = (kind: OAuthProviderKind) => oauthEndpoints(kind, opts.endpoints);
  return (route, _edge, _config, deps): RouteStage | null => {
    const m = enabledModule<OAuthModule>(route, 'oauth');
    if (!m) return null;
    if (route.matchType === 'exact_path') throw new Error('oauth: an exact_path route cannot carry the sign-in callback; use a path_prefix route');
    const kinds = OAUTH_PROVIDER_KINDS.filter((k) => m.provider?.[k]);
    if (kinds.length !== 1) throw new Error('oauth: exactly one provider must be configured');
    const kind = kinds[0]!;
    const p = m.provider![kind]!;
    const clientId = p.client_id ?? '';
    const secret = p.client_secret ?? '';
    if (!clientId || !secret) {
      throw new Error(`oauth: client_id and client_secret are required: Warren has no managed ${PROVIDERS[kind].label} OAuth app, so register your own app at ${PROVIDERS[kind].label} and set both`);
    }
    const spec = PROVIDERS[kind];
    const eps = endpointsFor(kind);
    const rules = rulesFrom(kind === 'github' ? p : { ...p, organizations: [], teams: [] });
    const scope = oauthScopes(spec, p.scopes, rules.organizations.length + rules.teams.length > 0);
    const log = deps.log.child({ module: 'oauth', provider: kind, routeId: route.id });
    return signInGate({
      module: 'oauth',
      route,
      keys: deriveSessionKeys('oauth', secret, route.id, kind, clientId),
      policy: oauthSessionPolicy(m),
      cookiePrefix: m.cookie_prefix || 'warren.',
      optionsPassthrough: m.options_passthrough === true,
      challenge: 'OAuth',
      providerName: `the ${spec.label} sign-in`,
      providerLabel: spec.family === 'oidc' ? eps.issuer! : new URL(eps.token!).origin,
      nowMs,
      log,
      provider: oauthProvider({ kind, eps, clientId, secret, scope, rules, discovery, log, fetch: opts.fetch, githubDeadlineMs: opts.githubDeadlineMs }),
    });
  };
}

export const oauthStage: StageFactory = createOAuthStage();
