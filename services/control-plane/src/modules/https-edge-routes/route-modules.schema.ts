import { z } from 'zod';
import {
  checkUserAgentPattern,
  HEADER_TOKEN_RE,
  HEADER_TEXT_PROBLEM,
  HEADER_TEXT_RE,
  hasBlankTrafficPolicySecrets,
  hostHeaderProblem,
  issuerProblem,
  MAX_TRAFFIC_POLICY_BYTES,
  MAX_USER_AGENT_PATTERN_BYTES,
  MAX_USER_AGENT_PATTERNS,
  oidcPrivateAllowed,
  parseTrafficPolicy,
  SUPPORTED_ACTION_TYPES,
  TrafficPolicyError,
} from '@warren/shared';
import { boundedString, obj, refId, uint32 } from '../../http/validate.js';
import { RefSchema } from '../common.js';
import { WEBHOOK_PROVIDERS, isWebhookProvider } from './webhook-providers.js';
import { checkIdpMetadata, MAX_IDP_METADATA_BYTES } from './saml.js';

/**
 * Request and response shapes of the 13 route modules (spec "Module shapes"; wire-conventions.md
 * §7, §8, §12, §13). Request schemas check structure and single-value rules; rules that need the
 * stored module (kept secrets) or the database live in route-modules.ts and the service.
 *
 * Error codes: 2104 single value out of range / not allowed / malformed, 2105 fields that go
 * together or exclude each other, 5002 list too long, 5003 string too long, 6401 module rules
 * (duplicates, provider-specific secret rules, IdP metadata content).
 */

const bytes = (s: string) => Buffer.byteLength(s, 'utf8');

type Ctx = z.core.$RefinementCtx;
function fail(ctx: Ctx, code: number, message: string, path: (string | number)[] = []): void {
  ctx.addIssue({ code: 'custom', message, path, params: { code } });
}

const enabled = () => z.boolean().nullish().describe('true applies the module to traffic; default true');
const flag = () => z.boolean().nullish().describe('default false');

export const MAX_SESSION_SECONDS = 31_536_000;
const sessionSeconds = () =>
  uint32()
    .max(MAX_SESSION_SECONDS, { message: `must be at most ${MAX_SESSION_SECONDS} seconds` })
    .nullish()
    .describe(`seconds, at most ${MAX_SESSION_SECONDS}; 0 when unset`);

export const DEFAULT_COOKIE_PREFIX = 'warren.';
const cookiePrefix = () =>
  z
    .string()
    .superRefine((s, ctx) => {
      if (bytes(s) > 64) fail(ctx, 5003, 'must be at most 64 bytes');
      else if (!/^[A-Za-z0-9.]*$/.test(s)) fail(ctx, 2104, 'may contain only letters, digits and "."');
    })
    .nullish()
    .describe(`session cookie prefix, at most 64 bytes of letters, digits and "."; default "${DEFAULT_COOKIE_PREFIX}"`);

/** A list of at most `max` items (5002), each checked by `item`. */
function list<T extends z.ZodType>(item: T, max?: number) {
  const a = z.array(item);
  return (max === undefined ? a : a.max(max, { message: `at most ${max} items are allowed` })).nullish();
}

// ---------------------------------------------------------------- backend, ip_restriction

export const BackendRequest = obj({
  enabled: enabled(),
  backend_id: refId('bkdtg').describe('id of a tunnel group backend (bkdtg_) of this account'),
});
export const BackendResponse = z.object({ enabled: z.boolean(), backend: RefSchema });

export const IpRestrictionRequest = obj({
  enabled: enabled(),
  ip_policy_ids: z
    .array(refId('ipp'))
    .min(1, { message: 'at least one IP policy id is required' })
    .max(16, { message: 'at most 16 IP policy ids are allowed' })
    .superRefine((ids, ctx) => {
      const seen = new Set<string>();
      ids.forEach((id, i) => {
        if (seen.has(id)) fail(ctx, 2104, `duplicate IP policy id ${JSON.stringify(id)}`, [i]);
        seen.add(id);
      });
    })
    .describe('1 to 16 IP policy ids (ipp_) of this account'),
});
export const IpRestrictionResponse = z.object({ enabled: z.boolean(), ip_policies: z.array(RefSchema) });

// ---------------------------------------------------------------- circuit_breaker

export const CircuitBreakerRequest = obj({
  enabled: enabled(),
  tripped_duration: uint32().min(1, { message: 'must be greater than 0' }).describe('seconds, > 0'),
  rolling_window: uint32().min(1, { message: 'must be greater than 0' }).describe('seconds, > 0'),
  num_buckets: uint32().min(1, { message: 'must be from 1 to 128' }).max(128, { message: 'must be from 1 to 128' }).describe('1 to 128'),
  volume_threshold: uint32().nullish().describe('default 0'),
  error_threshold_percentage: z.number().min(0, { message: 'must be from 0 to 1.0' }).max(1, { message: 'must be from 0 to 1.0' }).nullish().describe('0 to 1.0, default 0'),
});
export const CircuitBreakerResponse = z.object({
  enabled: z.boolean(),
  tripped_duration: z.number().int(),
  rolling_window: z.number().int(),
  num_buckets: z.number().int(),
  volume_threshold: z.number().int(),
  error_threshold_percentage: z.number(),
});

// ---------------------------------------------------------------- compression, websocket_tcp_converter

export const EnabledOnlyRequest = obj({ enabled: enabled() });
export const EnabledOnlyResponse = z.object({ enabled: z.boolean() });

// ---------------------------------------------------------------- request_headers, response_headers

const MAX_HEADERS = 32;

/**
 * Headers neither module may add or remove: framing and hop-by-hop headers (editing them would
 * desynchronise the message from its body or the connection; the ingress never touches them,
 * services/ingress header-edits.ts) and the nodes' own `X-Warren-*` headers, as the traffic
 * policy's header actions (shared parse.ts).
 *
 * `Host` (ngrok's "Rewrite Host header"): `request_headers.add` sets the Host the upstream sees,
 * replacing the client's (the route was already matched by the client's; X-Forwarded-Host keeps
 * it), and its value must be an authority (`hostHeaderProblem`). `request_headers.remove` may not
 * remove it: HTTP/1.1 requires it. On responses Host is an ordinary header.
 */
const RESERVED_HEADERS = new Set(['content-length', 'transfer-encoding', 'connection', 'keep-alive', 'upgrade', 'te', 'trailer', 'proxy-connection']);

type HeadersDirection = 'request' | 'response';

function checkHeaderName(name: string, ctx: Ctx, path: (string | number)[], direction: HeadersDirection, op: 'add' | 'remove'): void {
  const lower = name.toLowerCase();
  if (bytes(name) > 128) fail(ctx, 5003, 'header name is over 128 bytes', path);
  else if (!HEADER_TOKEN_RE.test(name)) fail(ctx, 2104, `${JSON.stringify(name)} is not a valid header name`, path);
  else if (RESERVED_HEADERS.has(lower) || lower.startsWith('x-warren-')) fail(ctx, 2104, `header ${JSON.stringify(name)} cannot be changed by a route module`, path);
  else if (lower === 'expect' && direction === 'request' && op === 'add')
    // The ingress answers a client's 100-continue itself and sends none on: one added made every request fail (502).
    fail(ctx, 2104, `header ${JSON.stringify(name)} cannot be added to requests (the ingress handles 100-continue itself)`, path);
  else if (lower === 'host' && direction === 'request' && op === 'remove')
    fail(ctx, 2104, `header ${JSON.stringify(name)} cannot be removed: HTTP/1.1 requires a Host header; to rewrite it, set it in add (e.g. "Host": "localhost")`, path);
}

/** The JSON body's own `__proto__` key, which z.record drops silently (a header asked for and never sent). */
const noProtoKey = (v: unknown, ctx: Ctx): unknown => {
  if (v !== null && typeof v === 'object' && Object.hasOwn(v, '__proto__')) fail(ctx, 2104, 'a header named "__proto__" is not supported', ['__proto__']);
  return v;
};

const headerAdd = (direction: HeadersDirection) =>
  z.preprocess(noProtoKey, z.record(z.string(), z.string()).superRefine((m, ctx) => {
    const names = Object.keys(m);
    if (names.length > MAX_HEADERS) return fail(ctx, 5002, `at most ${MAX_HEADERS} headers may be added`);
    const seen = new Set<string>();
    for (const name of names) {
      checkHeaderName(name, ctx, [name], direction, 'add');
      if (seen.has(name.toLowerCase())) fail(ctx, 6401, `duplicate header name ${JSON.stringify(name)} (names are case-insensitive)`, [name]);
      seen.add(name.toLowerCase());
      const value = m[name]!;
      if (bytes(value) > 1024) fail(ctx, 5003, 'header value is over 1024 bytes', [name]);
      else if (!HEADER_TEXT_RE.test(value)) fail(ctx, 2104, HEADER_TEXT_PROBLEM, [name]);
      else if (direction === 'request' && name.toLowerCase() === 'host') {
        const problem = hostHeaderProblem(value);
        if (problem) fail(ctx, 2104, `the Host header ${problem}`, [name]);
      }
    }
  }));

const headerRemove = (direction: HeadersDirection) =>
  z.array(z.string()).superRefine((names, ctx) => {
    if (names.length > MAX_HEADERS) return fail(ctx, 5002, `at most ${MAX_HEADERS} headers may be removed`);
    const seen = new Set<string>();
    names.forEach((name, i) => {
      checkHeaderName(name, ctx, [i], direction, 'remove');
      if (name.toLowerCase() === '__proto__') fail(ctx, 2104, 'a header named "__proto__" is not supported', [i]);
      if (seen.has(name.toLowerCase())) fail(ctx, 6401, `duplicate header name ${JSON.stringify(name)} (names are case-insensitive)`, [i]);
      seen.add(name.toLowerCase());
    });
  });

const ADD_DOC = 'header name → value, at most 32; `add` replaces the values a header of that name has; names are tokens ≤ 128 bytes, values ≤ 1024 bytes of HTAB, space, visible ASCII and U+0080-U+00FF (sent as Latin-1); not framing, hop-by-hop or X-Warren-* headers';

/** `request_headers`: `add.Host` rewrites the Host the upstream sees (host[:port]); `remove` may not name Host. */
export const RequestHeadersRequest = obj({
  enabled: enabled(),
  add: headerAdd('request')
    .nullish()
    .describe(`${ADD_DOC}. Host (as ngrok's --request-header-add 'host: localhost') replaces the Host header sent upstream, never adding a second one; its value must be host[:port]; X-Forwarded-Host keeps the client's`),
  remove: headerRemove('request').nullish().describe('header names, at most 32; not Host (HTTP/1.1 requires it; add rewrites it), framing, hop-by-hop or X-Warren-* headers'),
});
/** `response_headers`: Host is an ordinary response header here. */
export const ResponseHeadersRequest = obj({
  enabled: enabled(),
  add: headerAdd('response').nullish().describe(ADD_DOC),
  remove: headerRemove('response').nullish().describe('header names, at most 32; not framing, hop-by-hop or X-Warren-* headers'),
});
export const HeadersResponse = z.object({ enabled: z.boolean(), add: z.record(z.string(), z.string()), remove: z.array(z.string()) });

// ---------------------------------------------------------------- webhook_verification

export const WebhookVerificationRequest = obj({
  enabled: enabled(),
  provider: z
    .string()
    .refine(isWebhookProvider, { message: `unsupported webhook provider; supported: ${WEBHOOK_PROVIDERS.join(', ')}`, params: { code: 2104 } })
    .describe('webhook provider, matched case-insensitively and returned as sent'),
  secret: z.string().nullish().describe('required for every provider except sns; returned as ""; omitted or "" keeps the stored secret of the same provider'),
});
export const WebhookVerificationResponse = z.object({ enabled: z.boolean(), provider: z.string(), secret: z.string() });

// ---------------------------------------------------------------- oauth

const MAX_OAUTH_LIST = 64;
const nonEmpty = (what: string) => z.string().min(1, { message: `${what} must not be empty` });
const email = z.string().superRefine((s, ctx) => {
  if (!/^[^@\s]+@[^@\s]+$/.test(s)) fail(ctx, 2104, `${JSON.stringify(s.slice(0, 64))} is not an email address`);
  else if (s !== s.toLowerCase()) fail(ctx, 2104, `${JSON.stringify(s.slice(0, 64))} must be lowercase`);
});
const domain = z.string().superRefine((s, ctx) => {
  if (!/^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$/.test(s) || s.length > 253) fail(ctx, 2104, `${JSON.stringify(s.slice(0, 64))} is not a domain name`);
  else if (s !== s.toLowerCase()) fail(ctx, 2104, `${JSON.stringify(s.slice(0, 64))} must be lowercase`);
});
const team = z.string().superRefine((s, ctx) => {
  if (!/^[A-Za-z0-9][A-Za-z0-9-]*\/[A-Za-z0-9][A-Za-z0-9_.-]*$/.test(s)) fail(ctx, 2104, `${JSON.stringify(s.slice(0, 64))} is not an org-name/team-name slug`);
});
const org = z.string().superRefine((s, ctx) => {
  if (!/^[A-Za-z0-9][A-Za-z0-9-]*$/.test(s)) fail(ctx, 2104, `${JSON.stringify(s.slice(0, 64))} is not an organization slug`);
});

const providerFields = {
  client_id: z.string().nullish().describe('client id of your own OAuth app; needs client_secret'),
  client_secret: z.string().nullish().describe('returned as ""; omitted or "" keeps the stored secret while client_id is set'),
  scopes: list(nonEmpty('a scope'), MAX_OAUTH_LIST).describe('only with client_id and client_secret; at most 64'),
  email_addresses: list(email, MAX_OAUTH_LIST).describe('lowercase, at most 64'),
  email_domains: list(domain, MAX_OAUTH_LIST).describe('lowercase, at most 64'),
};
const OAuthGitHubRequest = obj({
  ...providerFields,
  teams: list(team, MAX_OAUTH_LIST).describe('org-name/team-name slugs, at most 64'),
  organizations: list(org, MAX_OAUTH_LIST).describe('organization slugs, at most 64'),
});
const OAuthOtherRequest = obj(providerFields);

export const OAUTH_PROVIDERS = ['github', 'facebook', 'microsoft', 'google', 'linkedin', 'gitlab', 'twitch', 'amazon'] as const;
export type OAuthProviderKind = (typeof OAUTH_PROVIDERS)[number];

const OAuthProviderRequest = obj({
  github: OAuthGitHubRequest.nullish(),
  facebook: OAuthOtherRequest.nullish(),
  microsoft: OAuthOtherRequest.nullish(),
  google: OAuthOtherRequest.nullish(),
  linkedin: OAuthOtherRequest.nullish(),
  gitlab: OAuthOtherRequest.nullish(),
  twitch: OAuthOtherRequest.nullish(),
  amazon: OAuthOtherRequest.nullish(),
}).superRefine((p, ctx) => {
  const set = OAUTH_PROVIDERS.filter((k) => p[k] != null);
  if (set.length !== 1) fail(ctx, 2105, `exactly one provider must be configured, got ${set.length === 0 ? 'none' : set.join(', ')}`);
});

const authCheckInterval = uint32()
  .refine((v) => v === 0 || v >= 60, { message: 'must be 0 or at least 60 seconds', params: { code: 2104 } })
  .nullish()
  .describe('seconds, 0 (default) or at least 60');

export const OAuthRequest = obj({
  enabled: enabled(),
  provider: OAuthProviderRequest.describe('exactly one identity provider'),
  options_passthrough: flag(),
  cookie_prefix: cookiePrefix(),
  inactivity_timeout: sessionSeconds(),
  maximum_duration: sessionSeconds(),
  auth_check_interval: authCheckInterval,
});

const providerResponseFields = {
  client_id: z.string(),
  client_secret: z.string().describe('always ""'),
  scopes: z.array(z.string()),
  email_addresses: z.array(z.string()),
  email_domains: z.array(z.string()),
};
const OAuthGitHubResponse = z.object({ ...providerResponseFields, teams: z.array(z.string()), organizations: z.array(z.string()) });
const OAuthOtherResponse = z.object(providerResponseFields);
export const OAuthResponse = z.object({
  enabled: z.boolean(),
  provider: z.object({
    github: OAuthGitHubResponse.nullable(),
    facebook: OAuthOtherResponse.nullable(),
    microsoft: OAuthOtherResponse.nullable(),
    google: OAuthOtherResponse.nullable(),
    linkedin: OAuthOtherResponse.nullable(),
    gitlab: OAuthOtherResponse.nullable(),
    twitch: OAuthOtherResponse.nullable(),
    amazon: OAuthOtherResponse.nullable(),
  }),
  options_passthrough: z.boolean(),
  cookie_prefix: z.string(),
  inactivity_timeout: z.number().int(),
  maximum_duration: z.number().int(),
  auth_check_interval: z.number().int(),
});

// ---------------------------------------------------------------- saml

export const NAMEID_FORMATS = [
  'urn:oasis:names:tc:SAML:2.0:nameid-format:persistent',
  'urn:oasis:names:tc:SAML:2.0:nameid-format:transient',
  'urn:oasis:names:tc:SAML:1.1:nameid-format:emailAddress',
  'urn:oasis:names:tc:SAML:1.1:nameid-format:unspecified',
] as const;

export const SamlRequest = obj({
  enabled: enabled(),
  options_passthrough: flag(),
  cookie_prefix: cookiePrefix(),
  inactivity_timeout: sessionSeconds(),
  maximum_duration: sessionSeconds(),
  idp_metadata: boundedString(MAX_IDP_METADATA_BYTES, 5003, 'idp_metadata')
    .superRefine((xml, ctx) => {
      const problem = checkIdpMetadata(xml);
      if (problem) fail(ctx, 6401, problem);
    })
    .describe('the full XML IdP EntityDescriptor, at most 256 KiB'),
  force_authn: flag(),
  allow_idp_initiated: flag(),
  authorized_groups: list(nonEmpty('a group')),
  nameid_format: z
    .string()
    .refine((v) => v === '' || (NAMEID_FORMATS as readonly string[]).includes(v), { message: `must be one of ${NAMEID_FORMATS.join(', ')}`, params: { code: 2104 } })
    .nullish()
    .describe(`one of ${NAMEID_FORMATS.join(', ')}; default ${NAMEID_FORMATS[0]}`),
});
export const SamlResponse = z.object({
  enabled: z.boolean(),
  options_passthrough: z.boolean(),
  cookie_prefix: z.string(),
  inactivity_timeout: z.number().int(),
  maximum_duration: z.number().int(),
  idp_metadata: z.string(),
  force_authn: z.boolean(),
  allow_idp_initiated: z.boolean(),
  authorized_groups: z.array(z.string()),
  entity_id: z.string(),
  assertion_consumer_service_url: z.string(),
  single_logout_url: z.string(),
  request_signing_certificate_pem: z.string(),
  metadata_url: z.string(),
  nameid_format: z.string(),
});

// ---------------------------------------------------------------- oidc

/**
 * The same check as the traffic policy's `openid-connect` `issuer_url` (`issuerProblem` in
 * @warren/shared), host included: `localhost` or a literal private / loopback / link-local
 * address is refused unless this process has WARREN_OIDC_ALLOW_PRIVATE=1.
 */
const issuer = z.string().superRefine((s, ctx) => {
  if (bytes(s) > 255) return fail(ctx, 5003, 'must be at most 255 bytes');
  const problem = issuerProblem(s, !oidcPrivateAllowed());
  if (problem) fail(ctx, 2104, problem);
});

/** An OAuth scope-token (RFC 6749 §3.3): printable ASCII without space, `"` or `\`. */
const scopeToken = z.string().superRefine((s, ctx) => {
  if (!s) return fail(ctx, 2104, 'a scope must not be empty');
  if (bytes(s) > 256) return fail(ctx, 5003, 'must be at most 256 bytes');
  if (!/^[\x21\x23-\x5b\x5d-\x7e]+$/.test(s)) fail(ctx, 2104, `${JSON.stringify(s.slice(0, 64))} is not a scope (printable ASCII without spaces, '"' or '\\')`);
});

export const OidcRequest = obj({
  enabled: enabled(),
  options_passthrough: flag(),
  cookie_prefix: cookiePrefix(),
  inactivity_timeout: sessionSeconds(),
  maximum_duration: sessionSeconds(),
  issuer: issuer.describe('https URL of the OpenID provider, at most 255 bytes'),
  client_id: nonEmpty('client_id'),
  client_secret: z.string().nullish().describe('required when first configured; returned as ""; omitted or "" keeps the stored secret'),
  scopes: list(scopeToken, MAX_OAUTH_LIST).describe('scope tokens requested from the provider, at most 64; "openid" is always added; default openid, profile and email'),
});
export const OidcResponse = z.object({
  enabled: z.boolean(),
  options_passthrough: z.boolean(),
  cookie_prefix: z.string(),
  inactivity_timeout: z.number().int(),
  maximum_duration: z.number().int(),
  issuer: z.string(),
  client_id: z.string(),
  client_secret: z.string().describe('always ""'),
  scopes: z.array(z.string()),
});

// ---------------------------------------------------------------- user_agent_filter
// Patterns are RE2 (re2js), as the ingress runs them: shared user-agent.ts.

const uaPattern = z.string().superRefine((s, ctx) => {
  if (bytes(s) > MAX_USER_AGENT_PATTERN_BYTES) return fail(ctx, 5003, `must be at most ${MAX_USER_AGENT_PATTERN_BYTES} bytes`);
  const problem = checkUserAgentPattern(s);
  if (problem) fail(ctx, 2104, problem);
});
const uaPatterns = (what: string) =>
  list(uaPattern, MAX_USER_AGENT_PATTERNS).describe(
    `${what}: RE2 regular expressions (Go syntax, e.g. (?i)bot), each matched anywhere in the first User-Agent header; at most ${MAX_USER_AGENT_PATTERNS}, each at most ${MAX_USER_AGENT_PATTERN_BYTES} bytes, compiling under RE2; the list is matched in one pass, as one RE2 program, which must be cheap to match (a small DFA)`,
  );
/**
 * Each pattern's own limits are checked here. The matching cost is a property of each list as a
 * whole (one combined RE2 program per list), and checking it may take a large fraction of a
 * second: it runs after this schema, in a worker thread (`checkUserAgentFilter`,
 * user-agent-check.ts), and its problem names the list, or one pattern, as an issue here would.
 */
export const UserAgentFilterRequest = obj({
  enabled: enabled(),
  allow: uaPatterns('a User-Agent matching any passes, even one matching a deny rule; ^$ lets requests without one through'),
  deny: uaPatterns('a User-Agent matching any (and no allow rule) is refused with 403; with only allow rules, every other User-Agent is'),
});
export const UserAgentFilterResponse = z.object({ enabled: z.boolean(), allow: z.array(z.string()), deny: z.array(z.string()) });

// ---------------------------------------------------------------- traffic_policy

const TP_SECRETS = 'verify-webhook secret, oauth and openid-connect client_secret are returned as "", basic-auth credentials as "user:"';

export const TrafficPolicyRequest = obj({
  enabled: enabled(),
  value: boundedString(MAX_TRAFFIC_POLICY_BYTES, 5003, 'value')
    .superRefine((text, ctx) => {
      // A secret left "" keeps the stored one: validated once filled in (route-modules.ts).
      if (hasBlankTrafficPolicySecrets(text)) return;
      try {
        parseTrafficPolicy(text);
      } catch (err) {
        if (!(err instanceof TrafficPolicyError)) throw err;
        fail(ctx, 6900, err.message);
      }
    })
    .describe(
      `the traffic policy document, YAML or JSON, at most 64 KiB: inbound and outbound rules (or ngrok's names for them, on_http_request and on_http_response) of CEL expressions and actions (${SUPPORTED_ACTION_TYPES.join(', ')}); ${TP_SECRETS}, and such a value left "" (a credential "user:") keeps the stored one at the same place`,
    ),
});
export const TrafficPolicyResponse = z.object({
  enabled: z.boolean(),
  value: z.string().describe(`the document as saved, but for its secrets: ${TP_SECRETS}`),
});
