/**
 * Conversions between the data-plane types (dataplane/types.ts) and the `warren.config.v1`
 * messages. `toProto` functions serve the control plane, `fromProto` functions the ingress.
 * `fromProto` functions never trust the wire: a field of the wrong type or JSON that does not
 * parse throws `CodecError`, which the ingress turns into a NACK.
 */
import { isTrafficEventType, type DpAgentSession, type DpBackend, type DpCertificateAuthority, type DpCredential, type DpEdge, type DpEventSubscription, type DpIpPolicy, type DpRoute, type DpTunnel, type TrafficEventType } from '../dataplane/types.js';
import { EVENT_TARGET_KINDS, type DestinationRef, type EventTargetKind } from '../events/types.js';
import type { AgentSession, AgentSession__Output } from './generated/warren/config/v1/AgentSession.js';
import type { Backend, Backend__Output } from './generated/warren/config/v1/Backend.js';
import type { CertificateAuthority, CertificateAuthority__Output } from './generated/warren/config/v1/CertificateAuthority.js';
import type { Credential, Credential__Output } from './generated/warren/config/v1/Credential.js';
import type { Edge, Edge__Output } from './generated/warren/config/v1/Edge.js';
import type { IpPolicy, IpPolicy__Output } from './generated/warren/config/v1/IpPolicy.js';
import type { Route, Route__Output } from './generated/warren/config/v1/Route.js';
import type { Tunnel, Tunnel__Output } from './generated/warren/config/v1/Tunnel.js';
import type { Resources, Resources__Output } from './generated/warren/config/v1/Resources.js';
import type { Deletes, Deletes__Output } from './generated/warren/config/v1/Deletes.js';
import type { EventSubscription, EventSubscription__Output } from './generated/warren/config/v1/EventSubscription.js';

export class CodecError extends Error {
  override name = 'CodecError';
}

function str(v: unknown, what: string): string {
  if (typeof v !== 'string') throw new CodecError(`${what}: not a string`);
  return v;
}
function strs(v: unknown, what: string): string[] {
  if (!Array.isArray(v) || !v.every((s) => typeof s === 'string')) throw new CodecError(`${what}: not a list of strings`);
  return v as string[];
}
function labels(v: unknown, what: string): Record<string, string> {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new CodecError(`${what}: not a map`);
  const out: Record<string, string> = {};
  for (const [k, x] of Object.entries(v)) out[k] = str(x, `${what}.${k}`);
  return out;
}
/** A map of Unix ms (int64 as a number), e.g. `edge.hostport_claimed_ms`; absent reads as empty. */
function millisMap(v: unknown, what: string): Record<string, number> {
  if (v === undefined || v === null) return {};
  if (typeof v !== 'object' || Array.isArray(v)) throw new CodecError(`${what}: not a map`);
  const out: Record<string, number> = {};
  for (const [k, x] of Object.entries(v)) {
    if (typeof x !== 'number' || !Number.isSafeInteger(x) || x < 0) throw new CodecError(`${what}.${k}: not a time in Unix ms`);
    out[k] = x;
  }
  return out;
}
function json(v: unknown, what: string): unknown {
  try {
    return JSON.parse(str(v, what));
  } catch (err) {
    throw err instanceof CodecError ? err : new CodecError(`${what}: invalid JSON (${(err as Error).message})`);
  }
}

// ------------------------------------------------------------------ config entities

export function edgeToProto(e: DpEdge): Edge {
  return {
    id: e.id,
    accountId: e.accountId,
    hostports: e.hostports,
    mutualTls: e.mutualTls ? { enabled: e.mutualTls.enabled, certificateAuthorityIds: e.mutualTls.certificateAuthorityIds } : null,
    tlsTermination: e.tlsTermination ? { enabled: e.tlsTermination.enabled, minVersion: e.tlsTermination.minVersion ?? '' } : null,
    hostportClaimedMs: e.hostportClaimedMs ?? {},
  };
}

export function edgeFromProto(m: Edge__Output): DpEdge {
  return {
    id: str(m.id, 'edge.id'),
    accountId: str(m.accountId, 'edge.account_id'),
    hostports: strs(m.hostports, 'edge.hostports'),
    mutualTls: m.mutualTls ? { enabled: !!m.mutualTls.enabled, certificateAuthorityIds: strs(m.mutualTls.certificateAuthorityIds, 'edge.mutual_tls.certificate_authority_ids') } : null,
    tlsTermination: m.tlsTermination ? { enabled: !!m.tlsTermination.enabled, minVersion: str(m.tlsTermination.minVersion, 'edge.tls_termination.min_version') || null } : null,
    hostportClaimedMs: millisMap(m.hostportClaimedMs, 'edge.hostport_claimed_ms'),
  };
}

export function routeToProto(r: DpRoute): Route {
  return {
    id: r.id,
    accountId: r.accountId,
    edgeId: r.edgeId,
    matchType: r.matchType,
    match: r.match,
    modulesJson: JSON.stringify(r.modules),
    backendId: r.backendId ?? '',
    ipPolicyIds: r.ipPolicyIds,
    trafficPolicy: r.trafficPolicy ? { enabled: r.trafficPolicy.enabled, valueJson: JSON.stringify(r.trafficPolicy.value ?? null) } : null,
  };
}

export function routeFromProto(m: Route__Output): DpRoute {
  const matchType = str(m.matchType, 'route.match_type');
  if (matchType !== 'exact_path' && matchType !== 'path_prefix') throw new CodecError(`route ${m.id}: match_type ${JSON.stringify(matchType)} is not exact_path or path_prefix`);
  const modules = json(m.modulesJson, `route ${m.id}: modules_json`);
  if (modules === null || typeof modules !== 'object' || Array.isArray(modules)) throw new CodecError(`route ${m.id}: modules_json is not an object`);
  return {
    id: str(m.id, 'route.id'),
    accountId: str(m.accountId, 'route.account_id'),
    edgeId: str(m.edgeId, 'route.edge_id'),
    matchType,
    match: str(m.match, 'route.match'),
    modules: modules as Record<string, unknown>,
    backendId: str(m.backendId, 'route.backend_id') || null,
    ipPolicyIds: strs(m.ipPolicyIds, 'route.ip_policy_ids'),
    trafficPolicy: m.trafficPolicy ? { enabled: !!m.trafficPolicy.enabled, value: json(m.trafficPolicy.valueJson, `route ${m.id}: traffic_policy.value_json`) } : null,
  };
}

export function backendToProto(b: DpBackend): Backend {
  return { id: b.id, accountId: b.accountId, labels: b.labels };
}

export function backendFromProto(m: Backend__Output): DpBackend {
  return { id: str(m.id, 'backend.id'), accountId: str(m.accountId, 'backend.account_id'), labels: labels(m.labels, `backend ${m.id}: labels`) };
}

export function ipPolicyToProto(p: DpIpPolicy): IpPolicy {
  return { id: p.id, accountId: p.accountId, rules: p.rules.map((r) => ({ id: r.id, cidr: r.cidr, action: r.action })) };
}

export function ipPolicyFromProto(m: IpPolicy__Output): DpIpPolicy {
  if (!Array.isArray(m.rules)) throw new CodecError(`ip policy ${m.id}: rules is not a list`);
  return {
    id: str(m.id, 'ip_policy.id'),
    accountId: str(m.accountId, 'ip_policy.account_id'),
    rules: m.rules.map((r) => {
      const action = str(r.action, 'ip_policy_rule.action');
      if (action !== 'allow' && action !== 'deny') throw new CodecError(`ip policy rule ${r.id}: action ${JSON.stringify(action)} is not allow or deny`);
      return { id: str(r.id, 'ip_policy_rule.id'), cidr: str(r.cidr, 'ip_policy_rule.cidr'), action };
    }),
  };
}

export function certificateAuthorityToProto(c: DpCertificateAuthority): CertificateAuthority {
  return { id: c.id, accountId: c.accountId, caPem: c.caPem };
}

export function certificateAuthorityFromProto(m: CertificateAuthority__Output): DpCertificateAuthority {
  return { id: str(m.id, 'certificate_authority.id'), accountId: str(m.accountId, 'certificate_authority.account_id'), caPem: str(m.caPem, 'certificate_authority.ca_pem') };
}

export function credentialToProto(c: DpCredential): Credential {
  return { id: c.id, accountId: c.accountId, tokenHash: c.tokenHash, acl: c.acl };
}

export function credentialFromProto(m: Credential__Output): DpCredential {
  return { id: str(m.id, 'credential.id'), accountId: str(m.accountId, 'credential.account_id'), tokenHash: str(m.tokenHash, 'credential.token_hash'), acl: strs(m.acl, 'credential.acl') };
}

export function eventSubscriptionToProto(e: DpEventSubscription): EventSubscription {
  return { id: e.id, accountId: e.accountId, types: e.types, destinations: e.destinations.map((d) => ({ id: d.id, kind: d.kind })) };
}

const TARGET_KINDS: ReadonlySet<string> = new Set(EVENT_TARGET_KINDS);

/**
 * Event types and destination kinds this version does not know (a newer control plane) are left
 * out rather than refused: the node emits what it can, and the rest of the config still applies.
 */
export function eventSubscriptionFromProto(m: EventSubscription__Output): DpEventSubscription {
  const id = str(m.id, 'event_subscription.id');
  if (!Array.isArray(m.destinations)) throw new CodecError(`event subscription ${id}: destinations is not a list`);
  const types = strs(m.types, `event subscription ${id}: types`).filter(isTrafficEventType) as TrafficEventType[];
  const destinations: DestinationRef[] = [];
  for (const d of m.destinations) {
    const destId = str(d?.id, `event subscription ${id}: destination id`);
    const kind = str(d?.kind, `event subscription ${id}: destination kind`);
    if (TARGET_KINDS.has(kind)) destinations.push({ id: destId, kind: kind as EventTargetKind });
  }
  return { id, accountId: str(m.accountId, 'event_subscription.account_id'), types, destinations };
}

/** Config entities by kind, as lists (a snapshot, or a delta's upserts). */
export interface DpEntityLists {
  edges: DpEdge[];
  routes: DpRoute[];
  backends: DpBackend[];
  ipPolicies: DpIpPolicy[];
  certificateAuthorities: DpCertificateAuthority[];
  credentials: DpCredential[];
  eventSubscriptions: DpEventSubscription[];
}

/** Ids by kind (a delta's deletes). */
export interface DpDeletedIds {
  edges: string[];
  routes: string[];
  backends: string[];
  ipPolicies: string[];
  certificateAuthorities: string[];
  credentials: string[];
  eventSubscriptions: string[];
}

export function resourcesToProto(e: DpEntityLists): Resources {
  return {
    edges: e.edges.map(edgeToProto),
    routes: e.routes.map(routeToProto),
    backends: e.backends.map(backendToProto),
    ipPolicies: e.ipPolicies.map(ipPolicyToProto),
    certificateAuthorities: e.certificateAuthorities.map(certificateAuthorityToProto),
    credentials: e.credentials.map(credentialToProto),
    eventSubscriptions: e.eventSubscriptions.map(eventSubscriptionToProto),
  };
}

function list<T>(v: T[] | undefined | null, what: string): T[] {
  if (v == null) return [];
  if (!Array.isArray(v)) throw new CodecError(`${what}: not a list`);
  return v;
}

export function resourcesFromProto(m: Resources__Output | null | undefined): DpEntityLists {
  return {
    edges: list(m?.edges, 'edges').map(edgeFromProto),
    routes: list(m?.routes, 'routes').map(routeFromProto),
    backends: list(m?.backends, 'backends').map(backendFromProto),
    ipPolicies: list(m?.ipPolicies, 'ip_policies').map(ipPolicyFromProto),
    certificateAuthorities: list(m?.certificateAuthorities, 'certificate_authorities').map(certificateAuthorityFromProto),
    credentials: list(m?.credentials, 'credentials').map(credentialFromProto),
    eventSubscriptions: list(m?.eventSubscriptions, 'event_subscriptions').map(eventSubscriptionFromProto),
  };
}

export function deletesToProto(d: DpDeletedIds): Deletes {
  return {
    edgeIds: d.edges,
    routeIds: d.routes,
    backendIds: d.backends,
    ipPolicyIds: d.ipPolicies,
    certificateAuthorityIds: d.certificateAuthorities,
    credentialIds: d.credentials,
    eventSubscriptionIds: d.eventSubscriptions,
  };
}

export function deletesFromProto(m: Deletes__Output | null | undefined): DpDeletedIds {
  return {
    edges: strs(m?.edgeIds ?? [], 'deletes.edge_ids'),
    routes: strs(m?.routeIds ?? [], 'deletes.route_ids'),
    backends: strs(m?.backendIds ?? [], 'deletes.backend_ids'),
    ipPolicies: strs(m?.ipPolicyIds ?? [], 'deletes.ip_policy_ids'),
    certificateAuthorities: strs(m?.certificateAuthorityIds ?? [], 'deletes.certificate_authority_ids'),
    credentials: strs(m?.credentialIds ?? [], 'deletes.credential_ids'),
    eventSubscriptions: strs(m?.eventSubscriptionIds ?? [], 'deletes.event_subscription_ids'),
  };
}

// ------------------------------------------------------------------ presence

export function sessionToProto(s: DpAgentSession): AgentSession {
  return { id: s.id, accountId: s.accountId, credentialId: s.credentialId, agentVersion: s.agentVersion, os: s.os, ip: s.ip, metadata: s.metadata, startedAt: s.startedAt };
}

export function sessionFromProto(m: AgentSession__Output): DpAgentSession {
  return {
    id: str(m.id, 'session.id'),
    accountId: str(m.accountId, 'session.account_id'),
    credentialId: str(m.credentialId, 'session.credential_id'),
    agentVersion: str(m.agentVersion, 'session.agent_version'),
    os: str(m.os, 'session.os'),
    ip: str(m.ip, 'session.ip'),
    metadata: str(m.metadata, 'session.metadata'),
    startedAt: str(m.startedAt, 'session.started_at'),
  };
}

/** A tunnel as a node reports it: node id and address are left empty (the control plane fills them). */
export type ReportedTunnel = Omit<DpTunnel, 'nodeId' | 'nodeAddress'>;

export function tunnelToProto(t: ReportedTunnel | DpTunnel): Tunnel {
  return {
    id: t.id,
    accountId: t.accountId,
    sessionId: t.sessionId,
    proto: t.proto,
    labels: t.labels,
    publicUrl: t.publicUrl,
    bindings: t.bindings,
    poolingEnabled: t.poolingEnabled,
    forwardsTo: t.forwardsTo,
    metadata: t.metadata,
    startedAt: t.startedAt,
    nodeId: 'nodeId' in t ? t.nodeId : '',
    nodeAddress: 'nodeAddress' in t ? t.nodeAddress : '',
  };
}

export function tunnelFromProto(m: Tunnel__Output): DpTunnel {
  return {
    id: str(m.id, 'tunnel.id'),
    accountId: str(m.accountId, 'tunnel.account_id'),
    sessionId: str(m.sessionId, 'tunnel.session_id'),
    proto: str(m.proto, 'tunnel.proto'),
    labels: labels(m.labels, `tunnel ${m.id}: labels`),
    publicUrl: str(m.publicUrl, 'tunnel.public_url'),
    bindings: strs(m.bindings, 'tunnel.bindings'),
    poolingEnabled: !!m.poolingEnabled,
    forwardsTo: str(m.forwardsTo, 'tunnel.forwards_to'),
    metadata: str(m.metadata, 'tunnel.metadata'),
    startedAt: str(m.startedAt, 'tunnel.started_at'),
    nodeId: str(m.nodeId, 'tunnel.node_id'),
    nodeAddress: str(m.nodeAddress, 'tunnel.node_address'),
  };
}
