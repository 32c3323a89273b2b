/**
 * Typed form of a traffic policy document (spec: "Rate-limit traffic policy action";
 * wire-conventions.md §12, §13). Produced by `parseTrafficPolicy`; the ingress evaluates it.
 */

import type { OAuthAction, OpenIdConnectAction } from './auth-actions.js';

export type PolicyDirection = 'inbound' | 'outbound';

/** One element of a rate-limit `bucket_key`, as written (`source`) and as resolved. */
export type BucketKeyElement =
  | { kind: 'host'; source: string }
  | { kind: 'client_ip'; source: string }
  /** `req.headers['x-name']` or `getReqHeader('X-Name')`; `name` is lowercased (headers are case-insensitive). */
  | { kind: 'header'; name: string; source: string };

export interface RateLimitConfig {
  /** Name of this rate limit configuration, fewer than 1024 characters. */
  name: string;
  algorithm: 'sliding_window';
  /** Requests allowed per bucket within `rate`, 1..2,000,000,000. */
  capacity: number;
  /** The duration as written, e.g. `90s` or `1h30m`. */
  rate: string;
  /** `rate` in whole seconds: a multiple of 10 within 60..86,400. */
  rateSeconds: number;
  /** The bucket key elements as written. */
  bucket_key: string[];
  /** The bucket key elements, resolved. */
  bucketKey: BucketKeyElement[];
  /**
   * `enforce` (default true). false: a request over capacity is not refused, only marked
   * (`actions.ngrok.rate_limit.limited`), and, as a refused one, not counted: a dry run.
   */
  enforce: boolean;
}

export interface RateLimitAction {
  type: 'rate-limit';
  config: RateLimitConfig;
}

/** `deny`: answers with `status_code` (400–599, default 403) instead of the upstream. */
export interface DenyAction {
  type: 'deny';
  config: { status_code: number };
}

/**
 * `custom-response`: answers with this status (200–599, default 200), body (ngrok's `body`, or
 * its older name `content`) and headers. The body and header values may interpolate CEL:
 * `${expr}` (see `parseTemplate`); a stored document whose `${…}` does not compile keeps it as
 * literal text.
 */
export interface CustomResponseAction {
  type: 'custom-response';
  config: { status_code: number; body: string; headers: Record<string, string> };
}

/**
 * `add-headers`: adds these headers to the request (inbound) or response (outbound), after any
 * of the same name already there (as ngrok: remove-headers first to replace one); a request's
 * `Host` is replaced, never doubled. Values may interpolate CEL: `${expr}` (see `parseTemplate`).
 */
export interface AddHeadersAction {
  type: 'add-headers';
  config: { headers: Record<string, string> };
}

/** `remove-headers`: removes every header of these names (case-insensitive). */
export interface RemoveHeadersAction {
  type: 'remove-headers';
  config: { headers: string[] };
}

/**
 * `restrict-ips` (either phase, as in ngrok): admits the client address (`conn.client_ip`) when it is in no
 * `deny` CIDR and, if there is any `allow` CIDR, in one of them; otherwise 403 unless `enforce` is
 * false. CIDRs are canonical (`parseCidr`). `ip_policies` are IP policy ids (`ipp_…`) of the
 * route's account whose rules add to `allow` and `deny` (resolved by the ingress from its config).
 * See `access-actions.ts`.
 */
export interface RestrictIpsAction {
  type: 'restrict-ips';
  config: { enforce: boolean; allow: string[]; deny: string[]; ip_policies: string[] };
}

/**
 * `basic-auth` (inbound only): requires `Authorization: Basic` with one of `credentials`
 * (`username:password`, split at the first colon); otherwise 401 with
 * `WWW-Authenticate: Basic realm="<realm>"` unless `enforce` is false. See `access-actions.ts`.
 */
export interface BasicAuthAction {
  type: 'basic-auth';
  config: { enforce: boolean; realm: string; credentials: string[] };
}

/**
 * A value written in an action's config (`set-vars`, `log`): YAML/JSON scalars, lists and
 * mappings. Strings may interpolate CEL (`${expr}`); a string that is exactly one `${expr}`
 * takes the expression's value and type. See `var-actions.ts`.
 */
export type PolicyValue = string | number | boolean | null | PolicyValue[] | { [key: string]: PolicyValue };

/**
 * `set-vars`: sets `vars.<name>` for later expressions and interpolations of the same direction,
 * in list order. Each element of `vars` is a mapping of exactly one `name: value`, as written.
 */
export interface SetVarsAction {
  type: 'set-vars';
  config: { vars: Record<string, PolicyValue>[] };
}

/** `log`: adds the evaluated `metadata` to the request's `http_request_complete.v0` event (`traffic_policy.logs`). */
export interface LogAction {
  type: 'log';
  config: { metadata: Record<string, PolicyValue> };
}

/**
 * `url-rewrite` (inbound only): replaces every match of `from` (RE2; omitted: the whole URL) in
 * the request URL (`scheme://host[:port]/path?query`) with `to`; the upstream gets the new path
 * and query. Non-terminating. `from` and `to` may interpolate CEL (`${expr}`); `to` refers to
 * capture groups as `$1`, `${1}`, `$name`. See `url-actions.ts`.
 */
export interface UrlRewriteAction {
  type: 'url-rewrite';
  config: { from?: string; to: string };
}

/**
 * `redirect`: answers `status_code` (a 3xx) with `Location` = the request URL with `from`
 * replaced by `to` (as url-rewrite), plus `headers` (values may interpolate CEL); does nothing
 * when that leaves the URL unchanged. See `url-actions.ts`.
 */
export interface RedirectAction {
  type: 'redirect';
  config: { from?: string; to: string; status_code: number; headers: Record<string, string> };
}

/**
 * `jwt-validation` (inbound only): the request must carry every token of `tokens`, each a JWS
 * signed with one of `algorithms` by a key of `jkus` / `inlineKeys`, issued by one of `issuers`
 * for one of `audiences` (any audience when null), and not expired; otherwise 401. See
 * `jwt-action.ts` (https://ngrok.com/docs/traffic-policy/actions/jwt-validation).
 */
export interface JwtValidationAction {
  type: 'jwt-validation';
  config: JwtValidationConfig;
}

/** The validated, normalised form of a `jwt-validation` config (the document's shape is ngrok's). */
export interface JwtValidationConfig {
  /** `issuer.allow_list[].value`: the `iss` claim must equal one exactly. */
  issuers: string[];
  /** `audience.allow_list[].value`; null when `audience` is left out (no `aud` check). */
  audiences: string[] | null;
  /** `http.tokens`: every one must be present, in a header or (`body`) a form / JSON body field. */
  tokens: { type: 'id_token' | 'access_token' | 'at+jwt' | 'it+jwt' | 'plain' | 'jwt'; method: 'header' | 'body'; name: string; prefix: string }[];
  /** `jws.allowed_algorithms`: asymmetric JWS algorithms only. */
  algorithms: string[];
  /** `jws.keys.identification[].token_claims` lists `kid`: a token without a `kid` header is refused. */
  requireKid: boolean;
  /** `jws.keys.sources.additional_jkus`: https URLs of JWK sets, fetched by the ingress. */
  jkus: string[];
  /** `jws.keys.sources.inline_keys` (a Warren extension): public JWKs given in the policy. */
  inlineKeys: Record<string, unknown>[];
}

/**
 * `verify-webhook` (inbound only): the request (its whole body, buffered) must carry a valid
 * signature of `provider` made with `secret` (none for `sns`); otherwise 403 unless `enforce` is
 * false. `provider` is lower-cased. See `body-actions.ts`.
 */
export interface VerifyWebhookAction {
  type: 'verify-webhook';
  config: { provider: string; secret: string; enforce: boolean };
}

/**
 * `compress-response` (outbound only): compresses the response body with the coding of
 * `algorithms` the request's Accept-Encoding prefers, unless it is already encoded. See
 * `body-actions.ts`.
 */
export interface CompressResponseAction {
  type: 'compress-response';
  config: { algorithms: ('br' | 'gzip' | 'deflate')[] };
}

/**
 * `request-body-find-replace` (inbound only) / `response-body-find-replace` (outbound only):
 * every match of each `from` (RE2, `${expr}` interpolated) in the body replaced by its `to`
 * (`$1`/`$name` capture references; empty: deleted), in order. See `find-replace.ts`.
 */
export interface FindReplaceConfig {
  replacements: { from: string; to: string }[];
}

export interface RequestBodyFindReplaceAction {
  type: 'request-body-find-replace';
  config: FindReplaceConfig;
}

export interface ResponseBodyFindReplaceAction {
  type: 'response-body-find-replace';
  config: FindReplaceConfig;
}

/**
 * `circuit-breaker` (inbound only): counts the upstream results of the requests it lets through
 * over a rolling `window_duration`; once at least `volume_threshold` of them hold an
 * `error_threshold` fraction of errors (5xx, or the upstream unreachable), requests reaching it
 * get 503 for `tripped_duration`, then one probe is let through. Non-terminating. See
 * `flow-actions.ts`.
 */
export interface CircuitBreakerAction {
  type: 'circuit-breaker';
  config: CircuitBreakerConfig;
}

export interface CircuitBreakerConfig {
  /** 0.0..1.0. */
  error_threshold: number;
  /** 1..2,000,000,000. */
  volume_threshold: number;
  /** The durations as written (1s..2m). */
  window_duration: string;
  tripped_duration: string;
  /** Always 10 (ngrok: fixed). */
  num_buckets: number;
  /** False: never trips, never refuses. */
  enforce: boolean;
  /** `window_duration` and `tripped_duration` in milliseconds. */
  windowMs: number;
  trippedMs: number;
}

/** `close-connection` (inbound only): closes the client connection without a response. Terminating; no config. */
export interface CloseConnectionAction {
  type: 'close-connection';
  config: Record<string, never>;
}

/**
 * `forward-internal` (inbound only): the request goes to the account's internal endpoint named
 * by `url` (an agent endpoint bound with the `internal` binding), whose own traffic policy runs
 * on it, instead of this route's upstream. Terminating when it forwards; `on_error` decides what
 * happens when it cannot (`halt`: an error answer; `continue`: the next action runs).
 */
export interface ForwardInternalAction {
  type: 'forward-internal';
  config: {
    /** As written; may interpolate `${…}`. */
    url: string;
    on_error: 'halt' | 'continue';
  };
}

export type PolicyAction = RateLimitAction | DenyAction | CustomResponseAction | AddHeadersAction | RemoveHeadersAction | RestrictIpsAction | BasicAuthAction | SetVarsAction | LogAction | UrlRewriteAction | RedirectAction | JwtValidationAction | VerifyWebhookAction | CompressResponseAction | CircuitBreakerAction | CloseConnectionAction | RequestBodyFindReplaceAction | ResponseBodyFindReplaceAction | OAuthAction | OpenIdConnectAction | ForwardInternalAction;
export type PolicyActionType = PolicyAction['type'];

export interface PolicyRule {
  /** `""` when the document gives none. */
  name: string;
  /**
   * CEL expressions as written; each compiles (type-checks to bool) against the variables of
   * the rule's direction (see `cel.ts`). The rule applies when all are true.
   */
  expressions: string[];
  actions: PolicyAction[];
}

export interface TrafficPolicy {
  inbound: PolicyRule[];
  outbound: PolicyRule[];
}
