import { createHash } from 'node:crypto';
import * as client from 'openid-client';
import { OIDC_ALLOW_PRIVATE_ENV, oidcPrivateAllowed } from '@warren/shared';
import { guardedFetch } from '../policy/guarded-fetch.js';
import { ProviderUnavailable, describeError } from './oidc-session.js';

export { ProviderUnavailable, describeError };

/**
 * OpenID Provider discovery for the `oidc` module, cached per issuer and shared by every route
 * and config version of the ingress process:
 *
 * - `issuer` + `/.well-known/openid-configuration` via openid-client's `discovery()` (which also
 *   checks that the document's `issuer` is the configured one), with a timeout (DISCOVERY_TIMEOUT_S).
 * - A document is used for REFRESH_MS, then re-fetched in the background on the next sign-in
 *   while the old one keeps serving; a failed refresh keeps the old one.
 * - Failures back off exponentially (1 s doubling to 60 s). While an issuer without a cached
 *   document is backing off, callers get the last error at once (a 502 page), never a hang.
 * - Per route client (issuer, client_id, secret, client authentication) one `Configuration` is
 *   kept per document, so config pushes do not rebuild them.
 * - A multi-tenant Microsoft Entra issuer (`https://login.microsoftonline.com/common/v2.0` and the
 *   like) publishes `issuer: https://login.microsoftonline.com/{tenantid}/v2.0`; openid-client's
 *   own `discovery()` accepts that and then expects each ID token's `iss` to be that template with
 *   the token's `tid` (Microsoft: "validate … the issuer … with the tid claim",
 *   https://learn.microsoft.com/entra/identity-platform/access-tokens#validate-the-issuer). That
 *   allowance lives only in the Configuration `discovery()` returns, so for such a document every
 *   route client gets its Configuration from its own `discovery()` call (still cached per client).
 * - SSRF: a tenant names the issuer (the `oidc` module's `issuer`, the `openid-connect` action's
 *   `issuer_url`), and the discovery document names the token, userinfo and JWKS endpoints. Every
 *   request openid-client makes for such an issuer — discovery and each request of its
 *   Configurations — goes through `idpFetch()` (`policy/guarded-fetch.ts`): unless the ingress
 *   has WARREN_OIDC_ALLOW_PRIVATE=1, a connection to `localhost`, a literal non-public address, or
 *   a name resolving to one is refused (checked as the socket connects); redirects are not
 *   followed and a response body is read up to IDP_FETCH.maxBytes. The `oauth` providers'
 *   issuers (`{ trusted: true }`) are Warren's fixed public ones or the operator's
 *   WARREN_OAUTH_PROVIDER_ENDPOINTS, never a tenant's: they are fetched unguarded, in entries of
 *   their own, so a tenant naming the same issuer never shares them.
 */

export const DISCOVERY_TIMEOUT_S = 5;
/** Timeout of the token and userinfo requests at sign-in. */
export const REQUEST_TIMEOUT_S = 10;
export const REFRESH_MS = 3600_000;
const BACKOFF_MIN_MS = 1000;
const BACKOFF_MAX_MS = 60_000;

/** How the client authenticates at the token endpoint (RFC 6749 2.3.1: HTTP Basic, or the body). */
export type ClientAuth = 'basic' | 'post';

/** `fetch`: what discovery must fetch through (a tenant's issuer: the guarded `idpFetch()`); undefined: the global fetch. */
export type Discover = (issuer: URL, clientId: string, secret: string, timeoutS: number, auth?: ClientAuth, fetch?: client.CustomFetch) => Promise<client.Configuration>;

const clientAuth = (auth: ClientAuth, secret: string) => (auth === 'post' ? client.ClientSecretPost(secret) : client.ClientSecretBasic(secret));

const defaultDiscover: Discover = (issuer, clientId, secret, timeout, auth = 'basic', fetch) =>
  client.discovery(issuer, clientId, secret, clientAuth(auth, secret), { timeout, ...(fetch ? { [client.customFetch]: fetch } : {}) });

/** Bounds of the guarded requests to a tenant's OpenID provider (the timeouts are DISCOVERY_TIMEOUT_S and REQUEST_TIMEOUT_S). */
export const IDP_FETCH = {
  /** Largest response body read (a discovery document, a token or userinfo answer, a JWK set). */
  maxBytes: 512 * 1024,
} as const;

let processIdpFetch: client.CustomFetch | undefined;

/** The process's guarded fetch for tenants' OpenID providers (WARREN_OIDC_ALLOW_PRIVATE read at each connection). */
export function idpFetch(): client.CustomFetch {
  return (processIdpFetch ??= guardedFetch({ allowPrivate: () => oidcPrivateAllowed(), envName: OIDC_ALLOW_PRIVATE_ENV, maxBytes: IDP_FETCH.maxBytes }) as unknown as client.CustomFetch);
}

/** `trusted`: the issuer is Warren's or the operator's (the `oauth` providers), not a tenant's: fetched without the guard. */
export interface IssuerOptions {
  trusted?: boolean;
}

interface Entry {
  metadata: client.ServerMetadata | null;
  fetchedAt: number;
  failures: number;
  retryAt: number;
  lastError: string;
  inflight: Promise<void> | null;
  /** Configurations of this document, by client key. */
  configs: Map<string, client.Configuration>;
}

export class DiscoveryCache {
  private readonly entries = new Map<string, Entry>();

  /**
   * `guarded`: the fetch for tenants' issuers (default: `idpFetch()`, the process's guarded one;
   * tests pass their own).
   */
  constructor(
    private readonly discover: Discover = defaultDiscover,
    private readonly now: () => number = Date.now,
    private readonly timeoutS: number = DISCOVERY_TIMEOUT_S,
    private readonly guarded?: client.CustomFetch,
  ) {}

  /** The client configuration for a route, discovering the issuer when needed. Rejects with ProviderUnavailable. */
  async config(issuer: string, clientId: string, secret: string, auth: ClientAuth = 'basic', o: IssuerOptions = {}): Promise<client.Configuration> {
    const fetch = o.trusted ? undefined : (this.guarded ?? idpFetch());
    const entryKey = `${o.trusted ? 'trusted' : 'tenant'}\n${issuer}`;
    let e = this.entries.get(entryKey);
    if (!e) {
      e = { metadata: null, fetchedAt: 0, failures: 0, retryAt: 0, lastError: '', inflight: null, configs: new Map() };
      this.entries.set(entryKey, e);
    }
    const now = this.now();
    const stale = !e.metadata || now - e.fetchedAt >= REFRESH_MS;
    if (stale && !e.inflight && now >= e.retryAt) e.inflight = this.fetch(e, issuer, clientId, secret, fetch);
    if (!e.metadata) {
      if (e.inflight) await e.inflight;
      if (!e.metadata) throw new ProviderUnavailable(`${e.lastError} (next attempt in ${Math.max(1, Math.ceil((e.retryAt - this.now()) / 1000))} s)`);
    }
    const key = `${auth}\n${clientId}\n${createHash('sha256').update(secret).digest('base64')}`;
    let c = e.configs.get(key);
    if (!c) {
      if (e.metadata.issuer.includes('{tenantid}')) {
        try {
          c = await this.discover(new URL(issuer), clientId, secret, this.timeoutS, auth, fetch);
        } catch (err) {
          throw new ProviderUnavailable(`discovery of ${issuer} failed: ${describeError(err)}`);
        }
      } else {
        c = new client.Configuration(e.metadata, clientId, secret, clientAuth(auth, secret));
      }
      c.timeout = REQUEST_TIMEOUT_S;
      // Token, userinfo, JWKS: whatever hosts the document names, through the same guard.
      if (fetch) c[client.customFetch] = fetch;
      e.configs.set(key, c);
    }
    return c;
  }

  private async fetch(e: Entry, issuer: string, clientId: string, secret: string, fetch: client.CustomFetch | undefined): Promise<void> {
    try {
      const c = await this.discover(new URL(issuer), clientId, secret, this.timeoutS, 'basic', fetch);
      const metadata = c.serverMetadata();
      if (!metadata.authorization_endpoint || !metadata.token_endpoint) throw new Error('the discovery document names no authorization_endpoint or token_endpoint');
      e.metadata = { ...metadata };
      e.fetchedAt = this.now();
      e.failures = 0;
      e.retryAt = 0;
      e.configs = new Map();
    } catch (err) {
      e.failures++;
      e.retryAt = this.now() + Math.min(BACKOFF_MAX_MS, BACKOFF_MIN_MS * 2 ** (e.failures - 1));
      e.lastError = `discovery of ${issuer} failed: ${describeError(err)}`;
    } finally {
      e.inflight = null;
    }
  }
}
