/**
 * The result variables of the `oauth` and `openid-connect` actions (`auth-actions.ts`), with
 * ngrok's names and types (https://ngrok.com/docs/traffic-policy/variables/action, "OAuth" and
 * "OpenID Connect (OIDC)"):
 * - `actions.ngrok.oauth.identity.{id, email, name, provider_user_id, current_provider_session_id}`,
 *   `actions.ngrok.oauth.{access_token, refresh_token, expires_at, session_timed_out,
 *   session_max_duration_reached, userinfo_refreshed}` and `.error.{code, message}`;
 * - `actions.ngrok.oidc.identity.{id, email, name, provider_user_id, current_session_id}`,
 *   `actions.ngrok.oidc.{identity_token, access_token, refresh_token, expires_at,
 *   session_timed_out, session_max_duration_reached, user_info_refreshed}` and `.error.{code, message}`.
 * Registered as CEL types in `cel.ts`, bounded in `cost.ts`; one instance per request
 * (`CelActionResults`), overwritten by each run of the action.
 *
 * Kept apart from `auth-actions.ts` (which imports `parse.ts`): `cel-vars.ts` needs these
 * classes and `parse.ts` imports `cel.ts`.
 */

/** Longest identity value kept (the values come from the sealed session cookie, itself at most 4 KiB). */
export const AUTH_IDENTITY_MAX_CHARS = 1024;

/** `actions.ngrok.{oauth,oidc}.error`: empty unless the last run failed. */
export class CelAuthError {
  code = '';
  message = '';
}

/** The identity fields both actions have. */
abstract class CelAuthIdentityBase {
  /** A stable id of the user at this action's provider (Warren keeps no identity records: see `auth-actions.ts`). */
  id = '';
  /** The address the provider vouches for, `''` when none (see the README). */
  email = '';
  name = '';
  /** The provider's user id (the OpenID `sub`, GitHub's numeric id, …). */
  provider_user_id = '';
}

/** `actions.ngrok.oauth.identity`. */
export class CelOAuthIdentity extends CelAuthIdentityBase {
  current_provider_session_id = '';
}

/** `actions.ngrok.oidc.identity`. */
export class CelOidcIdentity extends CelAuthIdentityBase {
  current_session_id = '';
}

/** The result fields both actions have. */
abstract class CelAuthResultBase {
  readonly error = new CelAuthError();
  /** The provider's tokens are not kept (the session cookie holds the identity only): always `''`. */
  access_token = '';
  refresh_token = '';
  /** When the session ends at the latest (RFC 3339), `''` before a session is found. */
  expires_at = '';
  session_timed_out = false;
  session_max_duration_reached = false;
}

/** `actions.ngrok.oauth`. */
export class CelOAuth extends CelAuthResultBase {
  readonly identity = new CelOAuthIdentity();
  userinfo_refreshed = false;
}

/** `actions.ngrok.oidc`. */
export class CelOidc extends CelAuthResultBase {
  readonly identity = new CelOidcIdentity();
  identity_token = '';
  user_info_refreshed = false;
  /** The same: ngrok's docs spell it both ways (its oauth result has `userinfo_refreshed`). */
  get userinfo_refreshed(): boolean {
    return this.user_info_refreshed;
  }
}

/** What a run of either action found: the session's identity, or nothing (`null`). */
export interface AuthRunResult {
  id: string;
  email: string;
  name: string;
  providerUserId: string;
  sessionId: string;
  expiresAt: string;
}

const cap = (v: string) => (v.length > AUTH_IDENTITY_MAX_CHARS ? v.slice(0, AUTH_IDENTITY_MAX_CHARS) : v);

/** Records one run of the action in its variables (a run that found no session clears them). */
export function recordAuthRun(v: CelOAuth | CelOidc, r: AuthRunResult | null, error?: { code: string; message: string }): void {
  v.identity.id = cap(r?.id ?? '');
  v.identity.email = cap(r?.email ?? '');
  v.identity.name = cap(r?.name ?? '');
  v.identity.provider_user_id = cap(r?.providerUserId ?? '');
  if (v instanceof CelOAuth) v.identity.current_provider_session_id = r?.sessionId ?? '';
  else v.identity.current_session_id = r?.sessionId ?? '';
  v.expires_at = r?.expiresAt ?? '';
  v.error.code = error?.code ?? '';
  v.error.message = error?.message ?? '';
}
