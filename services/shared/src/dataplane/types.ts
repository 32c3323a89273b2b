import type { DestinationRef } from '../events/types.js';

/**
 * The data-plane view of the configuration: what the control plane pushes to every ingress node
 * over gRPC (proto/warren/config/v1/config.proto) and what the ingress routes by. Plain JSON-safe
 * objects, camelCase, ids as the API shows them. Secrets the data plane needs (webhook secrets,
 * OAuth client secrets) are included in `modules`; agent credentials only as token hashes.
 */

export interface DpEdge {
  id: string;
  accountId: string;
  /** `host:port`, lower-case host, as stored (e.g. `app.example.com:443`). */
  hostports: string[];
  mutualTls: { enabled: boolean; certificateAuthorityIds: string[] } | null;
  tlsTermination: { enabled: boolean; minVersion: string | null } | null;
  /**
   * hostport → when the edge gained it (Unix ms, the control plane's clock). A hostport not
   * listed (stored before claims were recorded, or a config saved by an older node) counts from
   * the edge's creation, the time its id carries. The data plane settles a race for a host
   * between this edge and an agent endpoint of another account by it.
   */
  hostportClaimedMs?: Record<string, number>;
}

export interface DpRoute {
  id: string;
  accountId: string;
  edgeId: string;
  matchType: 'exact_path' | 'path_prefix';
  /** `/path`, `host` or `host/path` (wire-conventions.md). */
  match: string;
  /**
   * Route modules as stored, keyed by module name (`backend`, `ip_restriction`,
   * `circuit_breaker`, `compression`, `request_headers`, `response_headers`,
   * `webhook_verification`, `oauth`, `saml`, `oidc`, `websocket_tcp_converter`,
   * `user_agent_filter`), secrets included. `backend` is `{ enabled, backend_id }`. `saml` is
   * the stored module without its SP signing key pair, plus `handoff_secret` (derived from that
   * key; sealed.ts `samlHandoffKey`), `login_url` and `logout_url` (the control plane's
   * `/saml/<route id>/login` and `/logout`) and `single_logout` (the IdP has a single logout endpoint).
   */
  modules: Record<string, unknown>;
  /** The backend module's tunnel group backend id when the module is set and enabled. */
  backendId: string | null;
  /** ip_restriction's IP policy ids, in order. */
  ipPolicyIds: string[];
  /**
   * The traffic_policy module: `{ enabled, value }` with `value` the decoded document as plain
   * JSON (validated by the control plane; the ingress validates and compiles it again), or null
   * when the stored document no longer validates.
   */
  trafficPolicy: { enabled: boolean; value: unknown } | null;
}

export interface DpBackend {
  id: string;
  accountId: string;
  labels: Record<string, string>;
}

export interface DpIpPolicyRule {
  id: string;
  cidr: string;
  action: 'allow' | 'deny';
}

export interface DpIpPolicy {
  id: string;
  accountId: string;
  rules: DpIpPolicyRule[];
}

export interface DpCertificateAuthority {
  id: string;
  accountId: string;
  caPem: string;
}

/** An agent credential: only the SHA-256 hex of its token; absent when its account is disabled. */
export interface DpCredential {
  id: string;
  accountId: string;
  tokenHash: string;
  acl: string[];
}

/** Traffic event types: produced by the ingress nodes (wire-conventions.md §11). */
export const TRAFFIC_EVENT_TYPES = ['http_request_complete.v0', 'tcp_connection_closed.v0'] as const;
export type TrafficEventType = (typeof TRAFFIC_EVENT_TYPES)[number];

export function isTrafficEventType(s: string): s is TrafficEventType {
  return s === 'http_request_complete.v0' || s === 'tcp_connection_closed.v0';
}

/**
 * An event subscription as the data plane sees it: only its traffic event types (audit events
 * are produced by the control plane) and its destinations (id and target kind; never target
 * settings or secrets). Subscriptions without a traffic type or without a destination are not
 * part of the data plane.
 */
export interface DpEventSubscription {
  id: string; // esb_...
  accountId: string;
  /** Traffic event types, in the subscription's order, at least one. */
  types: TrafficEventType[];
  /** Destinations in the subscription's order, at least one. */
  destinations: DestinationRef[];
}

/** One applied configuration. Immutable once applied: a change builds a new one. */
export interface DataPlaneConfig {
  /** The control plane's config version this state corresponds to (monotonic, commit order). */
  version: number;
  edges: ReadonlyMap<string, DpEdge>;
  routes: ReadonlyMap<string, DpRoute>;
  backends: ReadonlyMap<string, DpBackend>;
  ipPolicies: ReadonlyMap<string, DpIpPolicy>;
  certificateAuthorities: ReadonlyMap<string, DpCertificateAuthority>;
  credentials: ReadonlyMap<string, DpCredential>;
  /** Same credentials keyed by `tokenHash`. */
  credentialsByTokenHash: ReadonlyMap<string, DpCredential>;
  /** Event subscriptions with traffic event types, by id. */
  eventSubscriptions: ReadonlyMap<string, DpEventSubscription>;
}

/** An agent session as an ingress node reports it (becomes a `tunnel_sessions` row). */
export interface DpAgentSession {
  id: string; // ts_...
  accountId: string;
  credentialId: string;
  agentVersion: string;
  os: string;
  ip: string;
  metadata: string;
  startedAt: string; // RFC 3339
}

/**
 * A tunnel as an ingress node reports it (becomes a `tunnels` row), and as the control plane
 * fans it out to every other node so that any ingress reaches any tunnel.
 */
export interface DpTunnel {
  id: string; // tn_...
  accountId: string;
  sessionId: string;
  /** `labeled` for StartTunnelWithLabel, else the Bind proto: `http`, `https`, `tcp`, `tls`. */
  proto: string;
  labels: Record<string, string>;
  /** Bind tunnels: the public URL, e.g. `https://app.example.test`; labeled: ''. */
  publicUrl: string;
  /** Bind tunnels: `[]`/`['public']` or `['internal']`. */
  bindings: string[];
  poolingEnabled: boolean;
  forwardsTo: string;
  metadata: string;
  startedAt: string; // RFC 3339
  /** The ingress node the agent is connected to, and how other nodes reach it. */
  nodeId: string;
  /** `host:port` of that node's internal forwarding listener. */
  nodeAddress: string;
}
