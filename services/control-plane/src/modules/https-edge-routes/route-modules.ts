import { AppError, mergeTrafficPolicySecrets, parseTrafficPolicy, redactTrafficPolicySecrets, TrafficPolicyError } from '@warren/shared';
import type { z } from 'zod';
import { ref } from '../common.js';
import { joinPath } from '../https-edges/module-body.js';
import {
  BackendRequest,
  BackendResponse,
  CircuitBreakerRequest,
  CircuitBreakerResponse,
  DEFAULT_COOKIE_PREFIX,
  EnabledOnlyRequest,
  EnabledOnlyResponse,
  HeadersResponse,
  IpRestrictionRequest,
  IpRestrictionResponse,
  NAMEID_FORMATS,
  OAUTH_PROVIDERS,
  OAuthRequest,
  OAuthResponse,
  OidcRequest,
  OidcResponse,
  RequestHeadersRequest,
  ResponseHeadersRequest,
  SamlRequest,
  SamlResponse,
  TrafficPolicyRequest,
  TrafficPolicyResponse,
  UserAgentFilterRequest,
  UserAgentFilterResponse,
  WebhookVerificationRequest,
  WebhookVerificationResponse,
  type OAuthProviderKind,
} from './route-modules.schema.js';
import { newSamlSigningKey, samlServiceUrls, type SamlSigningKey } from './saml.js';
import { base64SecretProblem, isBase64EcdsaPublicKey, SECRETLESS_PROVIDER } from './webhook-providers.js';

/**
 * The 13 route modules: how a request shape becomes the stored form (jsonb in
 * `https_edge_routes.modules`, secrets and the SAML signing key included) and how the stored
 * form is returned (secrets "", those inside the traffic policy document included). Fields
 * missing from a given module take their defaults; only secrets (and the SAML signing key) carry
 * over from the stored module (wire-conventions.md §8, §9), and a secret only while it still
 * goes where it was given for: `webhook_verification` the same provider, `oauth` the same
 * provider and `client_id`, `oidc` the same `issuer` and `client_id`; else a 400 naming it.
 */

export const MODULE_NAMES = [
  'backend',
  'ip_restriction',
  'circuit_breaker',
  'compression',
  'request_headers',
  'response_headers',
  'webhook_verification',
  'oauth',
  'saml',
  'oidc',
  'websocket_tcp_converter',
  'user_agent_filter',
  'traffic_policy',
] as const;
export type ModuleName = (typeof MODULE_NAMES)[number];

/** The modules of which at most one may be configured on a route (6402). */
export const AUTH_MODULES = ['oauth', 'saml', 'oidc'] as const satisfies readonly ModuleName[];

// ---------------------------------------------------------------- stored forms

export interface StoredOAuthProvider {
  client_id: string;
  client_secret: string;
  scopes: string[];
  email_addresses: string[];
  email_domains: string[];
  teams?: string[];
  organizations?: string[];
}

export interface StoredModules {
  backend?: { enabled: boolean; backend_id: string };
  ip_restriction?: { enabled: boolean; ip_policy_ids: string[] };
  circuit_breaker?: { enabled: boolean; tripped_duration: number; rolling_window: number; num_buckets: number; volume_threshold: number; error_threshold_percentage: number };
  compression?: { enabled: boolean };
  request_headers?: { enabled: boolean; add: Record<string, string>; remove: string[] };
  response_headers?: { enabled: boolean; add: Record<string, string>; remove: string[] };
  webhook_verification?: { enabled: boolean; provider: string; secret: string };
  oauth?: {
    enabled: boolean;
    provider: Partial<Record<OAuthProviderKind, StoredOAuthProvider>>;
    options_passthrough: boolean;
    cookie_prefix: string;
    inactivity_timeout: number;
    maximum_duration: number;
    auth_check_interval: number;
  };
  saml?: {
    enabled: boolean;
    options_passthrough: boolean;
    cookie_prefix: string;
    inactivity_timeout: number;
    maximum_duration: number;
    idp_metadata: string;
    force_authn: boolean;
    allow_idp_initiated: boolean;
    authorized_groups: string[];
    nameid_format: string;
    signing: SamlSigningKey;
  };
  oidc?: {
    enabled: boolean;
    options_passthrough: boolean;
    cookie_prefix: string;
    inactivity_timeout: number;
    maximum_duration: number;
    issuer: string;
    client_id: string;
    client_secret: string;
    scopes: string[];
  };
  websocket_tcp_converter?: { enabled: boolean };
  user_agent_filter?: { enabled: boolean; allow: string[]; deny: string[] };
  traffic_policy?: { enabled: boolean; value: string };
}

// ---------------------------------------------------------------- module table

export interface BuildContext {
  /** JSON path of the module in the request body: `oauth` in a route body, `""` or `module` in a module PUT. */
  prefix: string;
  routeId: string;
}

export interface RenderContext {
  baseUrl: string;
  routeId: string;
}

interface ModuleDef<N extends ModuleName, Req extends z.ZodType, Res extends z.ZodType> {
  request: Req;
  response: Res;
  /** A summary fragment for the OpenAPI docs. */
  title: string;
  build(input: z.output<Req>, prev: StoredModules[N] | undefined, c: BuildContext): StoredModules[N] | Promise<StoredModules[N]>;
  render(stored: NonNullable<StoredModules[N]>, c: RenderContext): z.output<Res>;
}

function def<N extends ModuleName, Req extends z.ZodType, Res extends z.ZodType>(_name: N, d: ModuleDef<N, Req, Res>): ModuleDef<N, Req, Res> {
  return d;
}

const on = (v: boolean | null | undefined) => v ?? true;
const cookie = (v: string | null | undefined) => (v ? v : DEFAULT_COOKIE_PREFIX);

function webhookBuild(input: z.output<typeof WebhookVerificationRequest>, prev: StoredModules['webhook_verification'], c: BuildContext): NonNullable<StoredModules['webhook_verification']> {
  const kind = input.provider.toLowerCase();
  const field = joinPath(c.prefix, 'secret');
  let secret = input.secret ?? '';
  if (kind === SECRETLESS_PROVIDER) {
    if (secret) throw new AppError(6401, `${field}: provider sns verifies with AWS certificates and takes no secret`, { field });
  } else {
    if (!secret && prev && prev.provider.toLowerCase() === kind) secret = prev.secret;
    if (!secret) throw new AppError(6401, `${field}: a secret is required for provider ${input.provider}`, { field });
    if (kind === 'sendgrid' && input.secret && !isBase64EcdsaPublicKey(secret))
      throw new AppError(6401, `${field}: the sendgrid secret must be the base64 ECDSA public verification key`, { field });
    const problem = input.secret ? base64SecretProblem(kind, secret) : null;
    if (problem) throw new AppError(6401, `${field}: ${problem}`, { field });
  }
  return { enabled: on(input.enabled), provider: input.provider, secret };
}

function oauthBuild(input: z.output<typeof OAuthRequest>, prev: StoredModules['oauth'], c: BuildContext): NonNullable<StoredModules['oauth']> {
  const kind = OAUTH_PROVIDERS.find((k) => input.provider[k] != null)!;
  const p = input.provider[kind]!;
  const path = joinPath(c.prefix, `provider.${kind}`);
  const clientId = p.client_id ?? '';
  let secret = p.client_secret ?? '';
  // A secret omitted in a replacing update of the same provider kind is kept only for the same
  // client_id (clearing client_id drops it; another client_id must bring its own secret).
  const prevProvider = prev?.provider[kind];
  const prevSecret = prevProvider?.client_secret;
  if (!secret && clientId && prevSecret) {
    if (prevProvider.client_id !== clientId)
      throw new AppError(2105, `${path}.client_secret: the stored client_secret is kept only while provider and client_id are unchanged; send the client_secret of client_id ${JSON.stringify(clientId.slice(0, 64))}`, { field: `${path}.client_secret` });
    secret = prevSecret;
  }
  if (clientId && !secret) throw new AppError(2105, `${path}.client_secret: client_id and client_secret must be given together`, { field: `${path}.client_secret` });
  if (!clientId && secret) throw new AppError(2105, `${path}.client_id: client_id and client_secret must be given together`, { field: `${path}.client_id` });
  const scopes = p.scopes ?? [];
  if (scopes.length > 0 && !clientId) throw new AppError(2105, `${path}.scopes: scopes may be set only with your own client_id and client_secret`, { field: `${path}.scopes` });
  const stored: StoredOAuthProvider = {
    client_id: clientId,
    client_secret: secret,
    scopes,
    email_addresses: p.email_addresses ?? [],
    email_domains: p.email_domains ?? [],
  };
  if (kind === 'github') {
    const gh = p as z.output<typeof OAuthRequest>['provider']['github'] & object;
    stored.teams = gh.teams ?? [];
    stored.organizations = gh.organizations ?? [];
  }
  return {
    enabled: on(input.enabled),
    provider: { [kind]: stored },
    options_passthrough: input.options_passthrough ?? false,
    cookie_prefix: cookie(input.cookie_prefix),
    inactivity_timeout: input.inactivity_timeout ?? 0,
    maximum_duration: input.maximum_duration ?? 0,
    auth_check_interval: input.auth_check_interval ?? 0,
  };
}

/**
 * The document's secrets left `""` (basic-auth `user:`) keep the stored ones at the same place
 * (`mergeTrafficPolicySecrets`, wire-conventions.md §9); the request schema skipped validating
 * such a document, so the filled-in one is validated here, as a saved policy is.
 */
function trafficPolicyBuild(input: z.output<typeof TrafficPolicyRequest>, prev: StoredModules['traffic_policy'], c: BuildContext): NonNullable<StoredModules['traffic_policy']> {
  const field = joinPath(c.prefix, 'value');
  try {
    const value = mergeTrafficPolicySecrets(input.value, prev?.value);
    if (value !== input.value) parseTrafficPolicy(value);
    return { enabled: on(input.enabled), value };
  } catch (err) {
    if (err instanceof TrafficPolicyError) throw new AppError(6900, `${field}: ${err.message}`, { field });
    throw err;
  }
}

function renderOAuthProvider(kind: OAuthProviderKind, p: StoredOAuthProvider | undefined) {
  if (!p) return null;
  const base = { client_id: p.client_id, client_secret: '', scopes: p.scopes, email_addresses: p.email_addresses, email_domains: p.email_domains };
  return kind === 'github' ? { ...base, teams: p.teams ?? [], organizations: p.organizations ?? [] } : base;
}

export const MODULES = {
  backend: def('backend', {
    title: 'backend',
    request: BackendRequest,
    response: BackendResponse,
    build: (i) => ({ enabled: on(i.enabled), backend_id: i.backend_id }),
    render: (s, c) => ({ enabled: s.enabled, backend: ref(c.baseUrl, 'backends/tunnel_group', s.backend_id) }),
  }),
  ip_restriction: def('ip_restriction', {
    title: 'IP restriction',
    request: IpRestrictionRequest,
    response: IpRestrictionResponse,
    build: (i) => ({ enabled: on(i.enabled), ip_policy_ids: i.ip_policy_ids }),
    render: (s, c) => ({ enabled: s.enabled, ip_policies: s.ip_policy_ids.map((id) => ref(c.baseUrl, 'ip_policies', id)) }),
  }),
  circuit_breaker: def('circuit_breaker', {
    title: 'circuit breaker',
    request: CircuitBreakerRequest,
    response: CircuitBreakerResponse,
    build: (i) => ({
      enabled: on(i.enabled),
      tripped_duration: i.tripped_duration,
      rolling_window: i.rolling_window,
      num_buckets: i.num_buckets,
      volume_threshold: i.volume_threshold ?? 0,
      error_threshold_percentage: i.error_threshold_percentage ?? 0,
    }),
    render: (s) => ({ ...s }),
  }),
  compression: def('compression', {
    title: 'compression',
    request: EnabledOnlyRequest,
    response: EnabledOnlyResponse,
    build: (i) => ({ enabled: on(i.enabled) }),
    render: (s) => ({ enabled: s.enabled }),
  }),
  request_headers: def('request_headers', {
    title: 'request headers',
    request: RequestHeadersRequest,
    response: HeadersResponse,
    build: (i) => ({ enabled: on(i.enabled), add: i.add ?? {}, remove: i.remove ?? [] }),
    render: (s) => ({ enabled: s.enabled, add: s.add, remove: s.remove }),
  }),
  response_headers: def('response_headers', {
    title: 'response headers',
    request: ResponseHeadersRequest,
    response: HeadersResponse,
    build: (i) => ({ enabled: on(i.enabled), add: i.add ?? {}, remove: i.remove ?? [] }),
    render: (s) => ({ enabled: s.enabled, add: s.add, remove: s.remove }),
  }),
  webhook_verification: def('webhook_verification', {
    title: 'webhook verification',
    request: WebhookVerificationRequest,
    response: WebhookVerificationResponse,
    build: webhookBuild,
    render: (s) => ({ enabled: s.enabled, provider: s.provider, secret: '' }),
  }),
  oauth: def('oauth', {
    title: 'OAuth',
    request: OAuthRequest,
    response: OAuthResponse,
    build: oauthBuild,
    render: (s) => ({
      enabled: s.enabled,
      provider: {
        github: renderOAuthProvider('github', s.provider.github),
        facebook: renderOAuthProvider('facebook', s.provider.facebook),
        microsoft: renderOAuthProvider('microsoft', s.provider.microsoft),
        google: renderOAuthProvider('google', s.provider.google),
        linkedin: renderOAuthProvider('linkedin', s.provider.linkedin),
        gitlab: renderOAuthProvider('gitlab', s.provider.gitlab),
        twitch: renderOAuthProvider('twitch', s.provider.twitch),
        amazon: renderOAuthProvider('amazon', s.provider.amazon),
      } as z.output<typeof OAuthResponse>['provider'],
      options_passthrough: s.options_passthrough,
      cookie_prefix: s.cookie_prefix,
      inactivity_timeout: s.inactivity_timeout,
      maximum_duration: s.maximum_duration,
      auth_check_interval: s.auth_check_interval,
    }),
  }),
  saml: def('saml', {
    title: 'SAML',
    request: SamlRequest,
    response: SamlResponse,
    // The signing key pair lives as long as the module: replacing the module keeps it (the IdP
    // may have its certificate), deleting the module drops it.
    build: async (i, prev, c) => ({
      enabled: on(i.enabled),
      options_passthrough: i.options_passthrough ?? false,
      cookie_prefix: cookie(i.cookie_prefix),
      inactivity_timeout: i.inactivity_timeout ?? 0,
      maximum_duration: i.maximum_duration ?? 0,
      idp_metadata: i.idp_metadata,
      force_authn: i.force_authn ?? false,
      allow_idp_initiated: i.allow_idp_initiated ?? false,
      authorized_groups: i.authorized_groups ?? [],
      nameid_format: i.nameid_format || NAMEID_FORMATS[0],
      signing: prev?.signing ?? (await newSamlSigningKey(c.routeId)),
    }),
    render: (s, c) => {
      const urls = samlServiceUrls(c.baseUrl, c.routeId);
      return {
        enabled: s.enabled,
        options_passthrough: s.options_passthrough,
        cookie_prefix: s.cookie_prefix,
        inactivity_timeout: s.inactivity_timeout,
        maximum_duration: s.maximum_duration,
        idp_metadata: s.idp_metadata,
        force_authn: s.force_authn,
        allow_idp_initiated: s.allow_idp_initiated,
        authorized_groups: s.authorized_groups,
        entity_id: urls.entity_id,
        assertion_consumer_service_url: urls.assertion_consumer_service_url,
        single_logout_url: urls.single_logout_url,
        request_signing_certificate_pem: s.signing.certificate_pem,
        metadata_url: urls.metadata_url,
        nameid_format: s.nameid_format,
      };
    },
  }),
  oidc: def('oidc', {
    title: 'OIDC',
    request: OidcRequest,
    response: OidcResponse,
    build: (i, prev, c) => {
      const field = joinPath(c.prefix, 'client_secret');
      let secret = i.client_secret ?? '';
      // A secret omitted or "" keeps the stored one only while issuer and client_id are unchanged:
      // otherwise whoever may edit the route could point the issuer at a server of their own, whose
      // token endpoint would receive the secret at the next sign-in.
      if (!secret && prev?.client_secret) {
        if (prev.issuer !== i.issuer || prev.client_id !== i.client_id)
          throw new AppError(2103, `${field}: the stored client_secret is kept only while issuer and client_id are unchanged; ${prev.issuer !== i.issuer ? 'issuer' : 'client_id'} changed, so send the client_secret`, { field });
        secret = prev.client_secret;
      }
      if (!secret) throw new AppError(2103, `${field} is required`, { field });
      return {
        enabled: on(i.enabled),
        options_passthrough: i.options_passthrough ?? false,
        cookie_prefix: cookie(i.cookie_prefix),
        inactivity_timeout: i.inactivity_timeout ?? 0,
        maximum_duration: i.maximum_duration ?? 0,
        issuer: i.issuer,
        client_id: i.client_id,
        client_secret: secret,
        scopes: i.scopes ?? [],
      };
    },
    render: (s) => ({ ...s, client_secret: '' }),
  }),
  websocket_tcp_converter: def('websocket_tcp_converter', {
    title: 'websocket TCP converter',
    request: EnabledOnlyRequest,
    response: EnabledOnlyResponse,
    build: (i) => ({ enabled: on(i.enabled) }),
    render: (s) => ({ enabled: s.enabled }),
  }),
  user_agent_filter: def('user_agent_filter', {
    title: 'user agent filter',
    request: UserAgentFilterRequest,
    response: UserAgentFilterResponse,
    build: (i) => ({ enabled: on(i.enabled), allow: i.allow ?? [], deny: i.deny ?? [] }),
    render: (s) => ({ enabled: s.enabled, allow: s.allow, deny: s.deny }),
  }),
  traffic_policy: def('traffic_policy', {
    title: 'traffic policy',
    request: TrafficPolicyRequest,
    response: TrafficPolicyResponse,
    build: trafficPolicyBuild,
    render: (s) => ({ enabled: s.enabled, value: redactTrafficPolicySecrets(s.value) }),
  }),
} as const;

type AnyDef = ModuleDef<ModuleName, z.ZodType, z.ZodType>;
const anyDef = (name: ModuleName) => MODULES[name] as unknown as AnyDef;

/** Stored form of one module from its parsed request shape. */
export async function buildModule(name: ModuleName, input: unknown, prev: StoredModules, c: BuildContext): Promise<NonNullable<StoredModules[ModuleName]>> {
  return (await anyDef(name).build(input, prev[name], c)) as NonNullable<StoredModules[ModuleName]>;
}

/** Response shape of one stored module. */
export function renderModule(name: ModuleName, stored: NonNullable<StoredModules[ModuleName]>, c: RenderContext): unknown {
  return anyDef(name).render(stored, c);
}

/** All 13 module keys in response shape, `null` when not configured. */
export function renderModules(stored: StoredModules, c: RenderContext): Record<ModuleName, unknown> {
  const out = {} as Record<ModuleName, unknown>;
  for (const name of MODULE_NAMES) {
    const s = stored[name];
    out[name] = s ? renderModule(name, s, c) : null;
  }
  return out;
}

/** 6402 unless at most one of oauth, saml and oidc is configured. `field` names the module being set. */
export function checkAuthModules(stored: StoredModules, field: string): void {
  const set = AUTH_MODULES.filter((m) => stored[m]);
  if (set.length > 1)
    throw new AppError(6402, `${field ? `${field}: ` : ''}at most one of oauth, saml and oidc may be configured on a route; this would configure ${set.join(' and ')}`, field ? { field } : {});
}
