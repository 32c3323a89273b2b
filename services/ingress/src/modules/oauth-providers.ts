import type { ClientAuth } from './oidc-discovery.js';

/**
 * The `oauth` module's providers: where each one signs users in and how Warren learns who they
 * are. Two families:
 *
 * - OpenID providers (google, microsoft, gitlab, linkedin, twitch): discovery from `issuer`, then
 *   the authorization-code flow through openid-client exactly as the `oidc` module does (ID token
 *   checked by openid-client, userinfo when the token lacks a claim).
 * - OAuth 2.0 providers (github, facebook, amazon): fixed authorization and token endpoints,
 *   openid-client's generic `authorizationCodeGrant` without an ID token, then the provider's user
 *   API with the access token (`fetchProtectedResource`).
 *
 * Sources (the providers' own documentation):
 * - github: https://docs.github.com/en/apps/oauth-apps/building-oauth-apps/authorizing-oauth-apps
 *   (`https://github.com/login/oauth/authorize`, `https://github.com/login/oauth/access_token`,
 *   then the REST API with the token); REST: `GET /user`
 *   (https://docs.github.com/en/rest/users/users#get-the-authenticated-user), `GET /user/emails`
 *   (`user:email` scope; each email has `verified` and `primary`,
 *   https://docs.github.com/en/rest/users/emails), `GET /user/orgs` (`read:org` to see private
 *   memberships, https://docs.github.com/en/rest/orgs/orgs#list-organizations-for-the-authenticated-user),
 *   `GET /user/teams` (`read:org`, https://docs.github.com/en/rest/teams/teams#list-teams-for-the-authenticated-user).
 *   Scopes: https://docs.github.com/en/apps/oauth-apps/building-oauth-apps/scopes-for-oauth-apps.
 * - facebook: https://developers.facebook.com/docs/facebook-login/guides/advanced/manual-flow
 *   (`https://www.facebook.com/dialog/oauth`, `https://graph.facebook.com/oauth/access_token`,
 *   then `GET https://graph.facebook.com/me?fields=id,name,email`; unversioned calls use the app's
 *   default Graph API version). `email` is only returned when the account has a valid one.
 * - amazon (Login with Amazon): https://developer.amazon.com/docs/login-with-amazon/authorization-code-grant.html
 *   (`https://www.amazon.com/ap/oa`, `https://api.amazon.com/auth/o2/token`) and
 *   https://developer.amazon.com/docs/login-with-amazon/obtain-customer-profile.html
 *   (`GET https://api.amazon.com/user/profile` → `user_id`, `name`, `email`; scope `profile`).
 * - google: https://developers.google.com/identity/openid-connect/openid-connect (issuer
 *   `https://accounts.google.com`; `email_verified`).
 * - microsoft: https://learn.microsoft.com/entra/identity-platform/v2-protocols-oidc (issuer
 *   `https://login.microsoftonline.com/common/v2.0`, whose discovery names the issuer
 *   `…/{tenantid}/v2.0`: each ID token's `iss` is checked against it with the token's `tid`, see
 *   oidc-discovery.ts). Microsoft says the `email` claim is not verified and must not be used for
 *   authorization (https://learn.microsoft.com/entra/identity-platform/migrate-off-email-claim-authorization);
 *   the optional claim `xms_edov` ("email domain owner verified",
 *   https://learn.microsoft.com/entra/identity-platform/optional-claims-reference) says when it is.
 *   So a Microsoft email counts only with `xms_edov: true` (add that optional claim to the app
 *   registration) or from a personal Microsoft account (tenant
 *   9188040d-6c67-4c5b-b112-36a304b66dad, https://learn.microsoft.com/entra/identity-platform/id-token-claims-reference).
 * - gitlab: https://docs.gitlab.com/integration/openid_connect_provider/ (GitLab is an OpenID
 *   provider at `https://gitlab.com`; scopes `openid profile email`; `email_verified`).
 * - linkedin: "Sign In with LinkedIn using OpenID Connect",
 *   https://learn.microsoft.com/linkedin/consumer/integrations/self-serve/sign-in-with-linkedin-v2
 *   (issuer `https://www.linkedin.com/oauth`, scopes `openid profile email`, `email_verified`;
 *   the token endpoint takes the client credentials in the body; PKCE is documented for native
 *   clients only, so none is sent, and no nonce).
 * - twitch: https://dev.twitch.tv/docs/authentication/getting-tokens-oidc (issuer
 *   `https://id.twitch.tv/oauth2`; credentials in the body; `email`, `email_verified` and
 *   `preferred_username` only when asked for with the OIDC `claims` parameter and scope
 *   `user:read:email`).
 */

/** The eight providers (one list with the traffic policy's `oauth` action, in @warren/shared). */
export { OAUTH_PROVIDERS as OAUTH_PROVIDER_KINDS, type OAuthProviderKind } from '@warren/shared';
import { OAUTH_PROVIDERS as OAUTH_PROVIDER_KINDS, type OAuthProviderKind } from '@warren/shared';

/** The endpoints an install may override (WARREN_OAUTH_PROVIDER_ENDPOINTS). */
export interface ProviderEndpoints {
  /** OpenID providers: the issuer (discovery base). */
  issuer?: string;
  /** OAuth 2.0 providers: authorization endpoint. */
  authorization?: string;
  /** OAuth 2.0 providers: token endpoint. */
  token?: string;
  /** OAuth 2.0 providers: the user endpoint (facebook `…/me?fields=…`, amazon `…/user/profile`). */
  userinfo?: string;
  /** github: REST API base (`https://api.github.com`; GitHub Enterprise Server: `https://<host>/api/v3`). */
  api?: string;
}

export interface ProviderSpec {
  /** Name in messages. */
  label: string;
  family: 'oidc' | 'oauth2';
  endpoints: ProviderEndpoints;
  auth: ClientAuth;
  pkce: boolean;
  nonce: boolean;
  /** Scopes asked for when the route sets none (`orgRules`: the route has organizations or teams). */
  defaultScopes(orgRules: boolean): string[];
  /** Extra authorization request parameters. */
  extra?: Record<string, string>;
}

const oidcScopes = () => ['openid', 'email', 'profile'];

export const PROVIDERS: Record<OAuthProviderKind, ProviderSpec> = {
  github: {
    label: 'GitHub',
    family: 'oauth2',
    endpoints: { authorization: 'https://github.com/login/oauth/authorize', token: 'https://github.com/login/oauth/access_token', api: 'https://api.github.com' },
    auth: 'post',
    pkce: true,
    nonce: false,
    // user:email for /user/emails (verified addresses); read:org for private org and team memberships
    defaultScopes: (orgRules) => (orgRules ? ['read:user', 'user:email', 'read:org'] : ['read:user', 'user:email']),
  },
  facebook: {
    label: 'Facebook',
    family: 'oauth2',
    endpoints: { authorization: 'https://www.facebook.com/dialog/oauth', token: 'https://graph.facebook.com/oauth/access_token', userinfo: 'https://graph.facebook.com/me?fields=id,name,email' },
    auth: 'post',
    pkce: true,
    nonce: false,
    defaultScopes: () => ['public_profile', 'email'],
  },
  amazon: {
    label: 'Amazon',
    family: 'oauth2',
    endpoints: { authorization: 'https://www.amazon.com/ap/oa', token: 'https://api.amazon.com/auth/o2/token', userinfo: 'https://api.amazon.com/user/profile' },
    auth: 'post',
    pkce: true,
    nonce: false,
    defaultScopes: () => ['profile'],
  },
  google: { label: 'Google', family: 'oidc', endpoints: { issuer: 'https://accounts.google.com' }, auth: 'basic', pkce: true, nonce: true, defaultScopes: oidcScopes },
  microsoft: { label: 'Microsoft', family: 'oidc', endpoints: { issuer: 'https://login.microsoftonline.com/common/v2.0' }, auth: 'basic', pkce: true, nonce: true, defaultScopes: oidcScopes },
  gitlab: { label: 'GitLab', family: 'oidc', endpoints: { issuer: 'https://gitlab.com' }, auth: 'basic', pkce: true, nonce: true, defaultScopes: oidcScopes },
  linkedin: { label: 'LinkedIn', family: 'oidc', endpoints: { issuer: 'https://www.linkedin.com/oauth' }, auth: 'post', pkce: false, nonce: false, defaultScopes: oidcScopes },
  twitch: {
    label: 'Twitch',
    family: 'oidc',
    endpoints: { issuer: 'https://id.twitch.tv/oauth2' },
    auth: 'post',
    pkce: false,
    nonce: true,
    defaultScopes: () => ['openid', 'user:read:email'],
    extra: { claims: JSON.stringify({ id_token: { email: null, email_verified: null, preferred_username: null }, userinfo: { email: null, email_verified: null, preferred_username: null } }) },
  },
};

/** The personal Microsoft accounts tenant (`tid`), whose addresses Microsoft has verified. */
export const MICROSOFT_CONSUMER_TENANT = '9188040d-6c67-4c5b-b112-36a304b66dad';

/**
 * WARREN_OAUTH_PROVIDER_ENDPOINTS: JSON `{ "<provider>": { issuer | authorization, token,
 * userinfo, api } }`, for GitHub Enterprise Server, a regional or sovereign Microsoft cloud, a
 * self-managed GitLab, and for tests. Only https URLs; unknown providers or fields are refused.
 * Throws with a message naming the problem (the routes of that provider then answer 503).
 */
export function parseEndpointOverrides(raw: string | undefined): Partial<Record<OAuthProviderKind, ProviderEndpoints>> {
  if (!raw || !raw.trim()) return {};
  let v: unknown;
  try {
    v = JSON.parse(raw);
  } catch {
    throw new Error('WARREN_OAUTH_PROVIDER_ENDPOINTS is not JSON');
  }
  if (!v || typeof v !== 'object' || Array.isArray(v)) throw new Error('WARREN_OAUTH_PROVIDER_ENDPOINTS must be a JSON object');
  const out: Partial<Record<OAuthProviderKind, ProviderEndpoints>> = {};
  for (const [kind, eps] of Object.entries(v)) {
    if (!(OAUTH_PROVIDER_KINDS as readonly string[]).includes(kind)) throw new Error(`WARREN_OAUTH_PROVIDER_ENDPOINTS: unknown provider ${kind}`);
    if (!eps || typeof eps !== 'object' || Array.isArray(eps)) throw new Error(`WARREN_OAUTH_PROVIDER_ENDPOINTS.${kind} must be an object`);
    const allowed = PROVIDERS[kind as OAuthProviderKind].family === 'oidc' ? ['issuer'] : ['authorization', 'token', 'userinfo', 'api'];
    const e: ProviderEndpoints = {};
    for (const [field, url] of Object.entries(eps)) {
      if (!allowed.includes(field)) throw new Error(`WARREN_OAUTH_PROVIDER_ENDPOINTS.${kind}.${field}: not a field of this provider (${allowed.join(', ')})`);
      let u: URL;
      try {
        u = new URL(String(url));
      } catch {
        throw new Error(`WARREN_OAUTH_PROVIDER_ENDPOINTS.${kind}.${field} is not a URL`);
      }
      if (u.protocol !== 'https:') throw new Error(`WARREN_OAUTH_PROVIDER_ENDPOINTS.${kind}.${field} must be https`);
      // the API base without its trailing slash (paths are appended); the rest exactly as given
      // (an issuer is compared with the discovered one as written)
      e[field as keyof ProviderEndpoints] = field === 'api' ? u.href.replace(/\/$/, '') : String(url);
    }
    out[kind as OAuthProviderKind] = e;
  }
  return out;
}
