import {
  EVENT_TARGET_KINDS,
  decodeTrafficPolicy,
  isTrafficEventType,
  validateTrafficPolicy,
  type DpBackend,
  type DpCertificateAuthority,
  type DpCredential,
  type DpEdge,
  type DpEventSubscription,
  type DpIpPolicy,
  type DpRoute,
  type EventTargetKind,
  type TrafficEventType,
} from '@warren/shared';
import { samlForDataplane, type StoredSaml } from '../modules/https-edge-routes/saml.js';
import type { BackendDpRow, CaDpRow, CredentialDpRow, EdgeDpRow, EventSubscriptionDpRow, IpPolicyDpRow, OutboxRefRow, RouteDpRow } from './dataplane.repo.js';

/** Pure mapping from stored rows to the data-plane types, and from outbox rows to what changed. */

export function toDpEdge(r: EdgeDpRow): DpEdge {
  return {
    id: r.id,
    accountId: r.account_id,
    hostports: r.hostports,
    mutualTls: r.mutual_tls ? { enabled: r.mutual_tls.enabled !== false, certificateAuthorityIds: r.ca_ids } : null,
    tlsTermination: r.tls_termination ? { enabled: r.tls_termination.enabled !== false, minVersion: r.tls_termination.min_version ?? null } : null,
    hostportClaimedMs: r.hostport_claimed_ms ?? {},
  };
}

interface StoredRouteModules {
  backend?: { enabled?: boolean; backend_id?: string };
  ip_restriction?: { enabled?: boolean; ip_policy_ids?: string[] };
  traffic_policy?: { enabled?: boolean; value?: string };
  [name: string]: unknown;
}

/**
 * A route in data-plane form. The traffic policy was validated when it was written; should a
 * stored one no longer parse (a stricter parser), the module travels with `value: null` and
 * `onBadPolicy` is told, rather than holding back every other change.
 */
export function toDpRoute(r: RouteDpRow, onBadPolicy?: (routeId: string, err: Error) => void, baseUrl?: string): DpRoute {
  const { traffic_policy: tp, ...modules } = r.modules as StoredRouteModules;
  if (modules.saml) modules.saml = samlForDataplane(modules.saml as StoredSaml, r.id, baseUrl);
  let trafficPolicy: DpRoute['trafficPolicy'] = null;
  if (tp) {
    let value: unknown = null;
    try {
      // The decoded document travels (plain JSON), once validated here; the ingress validates and
      // compiles it again with its own parser version.
      const doc = decodeTrafficPolicy(tp.value ?? '');
      validateTrafficPolicy(doc);
      value = doc;
    } catch (err) {
      onBadPolicy?.(r.id, err as Error);
    }
    trafficPolicy = { enabled: tp.enabled !== false, value };
  }
  const backend = modules.backend;
  return {
    id: r.id,
    accountId: r.account_id,
    edgeId: r.edge_id,
    matchType: r.match_type,
    match: r.match,
    modules,
    backendId: backend && backend.enabled !== false && backend.backend_id ? backend.backend_id : null,
    ipPolicyIds: modules.ip_restriction?.ip_policy_ids ?? [],
    trafficPolicy,
  };
}

export function toDpBackend(r: BackendDpRow): DpBackend {
  return { id: r.id, accountId: r.account_id, labels: r.labels };
}

export function toDpIpPolicy(r: IpPolicyDpRow): DpIpPolicy {
  return { id: r.id, accountId: r.account_id, rules: r.rules.map((x) => ({ id: x.id, cidr: x.cidr, action: x.action })) };
}

export function toDpCertificateAuthority(r: CaDpRow): DpCertificateAuthority {
  return { id: r.id, accountId: r.account_id, caPem: r.ca_pem };
}

export function toDpCredential(r: CredentialDpRow): DpCredential {
  return { id: r.id, accountId: r.account_id, tokenHash: r.token_hash, acl: r.acl };
}

const TARGET_KINDS: ReadonlySet<string> = new Set(EVENT_TARGET_KINDS);

/** A subscription's traffic side: its traffic event types and its destinations (id and kind only). */
export function toDpEventSubscription(r: EventSubscriptionDpRow): DpEventSubscription {
  return {
    id: r.id,
    accountId: r.account_id,
    types: r.types.filter(isTrafficEventType) as TrafficEventType[],
    destinations: r.destinations.filter((d) => TARGET_KINDS.has(d.kind)).map((d) => ({ id: d.id, kind: d.kind as EventTargetKind })),
  };
}

/** Ids of the entities an outbox range touched, by kind (accounts: their credentials change). */
export interface ChangedIds {
  edges: Set<string>;
  routes: Set<string>;
  backends: Set<string>;
  ipPolicies: Set<string>;
  certificateAuthorities: Set<string>;
  credentials: Set<string>;
  accounts: Set<string>;
  eventSubscriptions: Set<string>;
}

/**
 * Maps outbox rows to the data-plane entities they touch. Event stems are those the services
 * write (`<stem>_<created|updated|deleted>.v0`); stems with no data-plane form (reserved
 * addresses, API keys, event destinations) touch nothing, but their versions still advance the
 * nodes' applied version. Event subscriptions are reloaded on any of their rows: the source
 * endpoints (`/event_subscriptions/{id}/sources`) write `event_subscription_updated` too. An
 * event destination's change needs no reload: its kind, the only part the data plane holds,
 * never changes, and it cannot be deleted while a subscription names it.
 */
export function changedIds(rows: OutboxRefRow[]): ChangedIds {
  const c: ChangedIds = { edges: new Set(), routes: new Set(), backends: new Set(), ipPolicies: new Set(), certificateAuthorities: new Set(), credentials: new Set(), accounts: new Set(), eventSubscriptions: new Set() };
  for (const r of rows) {
    switch (r.resource_type) {
      case 'https_edge':
        c.edges.add(r.resource_id);
        break;
      case 'https_edge_route':
        c.routes.add(r.resource_id);
        break;
      case 'tunnel_group_backend':
        c.backends.add(r.resource_id);
        break;
      case 'ip_policy':
        c.ipPolicies.add(r.resource_id);
        break;
      case 'ip_policy_rule':
        if (r.ip_policy_id) c.ipPolicies.add(r.ip_policy_id);
        break;
      case 'certificate_authority':
        c.certificateAuthorities.add(r.resource_id);
        break;
      case 'tunnel_credential':
        c.credentials.add(r.resource_id);
        break;
      case 'account':
        c.accounts.add(r.resource_id);
        break;
      case 'event_subscription':
        c.eventSubscriptions.add(r.resource_id);
        break;
      default:
        break;
    }
  }
  return c;
}
