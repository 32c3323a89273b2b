import type { Queryable } from '../db/pool.js';

/**
 * SQL for the data-plane view of the configuration: the head version, the outbox rows since a
 * version, and each entity kind in the shape the data plane needs, all of them or by id. Callers
 * run these in one REPEATABLE READ transaction so that everything they read is the state at one
 * version (see config-reader.ts).
 */

export interface HeadRow {
  version: number;
  epoch: string;
  committed_at: Date;
}

export interface OutboxRefRow {
  resource_type: string;
  resource_id: string;
  /** `object.ip_policy.id` (IP policy rules name their policy there, deletes included). */
  ip_policy_id: string | null;
}

export interface EdgeDpRow {
  id: string;
  account_id: string;
  hostports: string[];
  mutual_tls: { enabled: boolean } | null;
  tls_termination: { enabled: boolean; min_version?: string | null } | null;
  ca_ids: string[];
  /** hostport → when the edge gained it (Unix ms); hostports from before claims were recorded are absent. */
  hostport_claimed_ms: Record<string, number>;
}

export interface RouteDpRow {
  id: string;
  account_id: string;
  edge_id: string;
  match_type: 'exact_path' | 'path_prefix';
  match: string;
  modules: Record<string, unknown>;
}

export interface BackendDpRow {
  id: string;
  account_id: string;
  labels: Record<string, string>;
}

export interface IpPolicyDpRow {
  id: string;
  account_id: string;
  rules: { id: string; cidr: string; action: 'allow' | 'deny' }[];
}

export interface CaDpRow {
  id: string;
  account_id: string;
  ca_pem: string;
}

export interface CredentialDpRow {
  id: string;
  account_id: string;
  token_hash: string;
  acl: string[];
}

export interface EventSubscriptionDpRow {
  id: string;
  account_id: string;
  /** Its traffic event types, in position order. */
  types: string[];
  /** Its destinations in position order, with their target kind. */
  destinations: { id: string; kind: string }[];
}

const EDGES = `SELECT e.id, e.account_id, e.hostports, e.mutual_tls, e.tls_termination,
  COALESCE((SELECT array_agg(c.ca_id ORDER BY c.position) FROM https_edge_certificate_authorities c WHERE c.edge_id = e.id), '{}') AS ca_ids,
  COALESCE((SELECT jsonb_object_agg(h.hostport, h.claimed_ms) FROM https_edge_hostports h WHERE h.edge_id = e.id AND h.claimed_ms IS NOT NULL), '{}'::jsonb) AS hostport_claimed_ms
  FROM https_edges e`;
const ROUTES = 'SELECT r.id, r.account_id, r.edge_id, r.match_type, r.match, r.modules FROM https_edge_routes r';
const BACKENDS = 'SELECT b.id, b.account_id, b.labels FROM tunnel_group_backends b';
const IP_POLICIES = `SELECT p.id, p.account_id,
  COALESCE((SELECT jsonb_agg(jsonb_build_object('id', r.id, 'cidr', r.cidr::text, 'action', r.action) ORDER BY r.created_at, r.id)
              FROM ip_policy_rules r WHERE r.ip_policy_id = p.id), '[]'::jsonb) AS rules
  FROM ip_policies p`;
const CAS = 'SELECT c.id, c.account_id, c.ca_pem FROM certificate_authorities c';
// Credentials of disabled accounts are not part of the data plane: agents cannot use them.
const CREDENTIALS = 'SELECT c.id, c.account_id, c.token_hash, c.acl FROM credentials c JOIN accounts a ON a.id = c.account_id AND NOT a.disabled';

// Event subscriptions as the data plane needs them: traffic event types and destinations (id and
// target kind, never the target settings). Only those with a traffic type and a destination: a
// subscription that has neither is absent, so a delta sends it as a delete.
const TRAFFIC_TYPES = `'http_request_complete.v0', 'tcp_connection_closed.v0'`;
const EVENT_SUBSCRIPTIONS = `SELECT s.id, s.account_id,
  ARRAY(SELECT src.type FROM event_subscription_sources src WHERE src.subscription_id = s.id AND src.type IN (${TRAFFIC_TYPES}) ORDER BY src.position) AS types,
  COALESCE((SELECT jsonb_agg(jsonb_build_object('id', d.destination_id, 'kind', ed.target_kind) ORDER BY d.position)
              FROM event_subscription_destinations d JOIN event_destinations ed ON ed.id = d.destination_id WHERE d.subscription_id = s.id), '[]'::jsonb) AS destinations
  FROM event_subscriptions s
  WHERE EXISTS (SELECT 1 FROM event_subscription_sources src WHERE src.subscription_id = s.id AND src.type IN (${TRAFFIC_TYPES}))
    AND EXISTS (SELECT 1 FROM event_subscription_destinations d WHERE d.subscription_id = s.id)`;

async function all<T>(q: Queryable, sql: string, order: string): Promise<T[]> {
  return (await q.query(`${sql} ORDER BY ${order}`)).rows as T[];
}
async function byIds<T>(q: Queryable, sql: string, alias: string, ids: string[]): Promise<T[]> {
  if (ids.length === 0) return [];
  return (await q.query(`${sql} WHERE ${alias}.id = ANY($1::text[])`, [ids])).rows as T[];
}

export const dataplaneRepo = {
  async head(q: Queryable): Promise<HeadRow> {
    const { rows } = await q.query<HeadRow>('SELECT version, epoch, committed_at FROM config_state');
    return rows[0]!;
  },

  /**
   * What the outbox rows in (after, upTo] name. Versions are dense, so fewer than upTo - after
   * rows means some were pruned.
   */
  async outboxSince(q: Queryable, after: number, upTo: number): Promise<OutboxRefRow[]> {
    const { rows } = await q.query<OutboxRefRow>(
      `SELECT resource_type, resource_id, object->'ip_policy'->>'id' AS ip_policy_id FROM outbox WHERE version > $1 AND version <= $2`,
      [after, upTo],
    );
    return rows;
  },

  async credentialIdsOfAccounts(q: Queryable, accountIds: string[]): Promise<string[]> {
    if (accountIds.length === 0) return [];
    const { rows } = await q.query<{ id: string }>('SELECT id FROM credentials WHERE account_id = ANY($1::text[])', [accountIds]);
    return rows.map((r) => r.id);
  },

  edges: (q: Queryable, ids?: string[]) => (ids ? byIds<EdgeDpRow>(q, EDGES, 'e', ids) : all<EdgeDpRow>(q, EDGES, 'e.id')),
  // Oldest first, as the API lists an edge's routes.
  routes: (q: Queryable, ids?: string[]) => (ids ? byIds<RouteDpRow>(q, ROUTES, 'r', ids) : all<RouteDpRow>(q, ROUTES, 'r.created_at, r.id')),
  backends: (q: Queryable, ids?: string[]) => (ids ? byIds<BackendDpRow>(q, BACKENDS, 'b', ids) : all<BackendDpRow>(q, BACKENDS, 'b.id')),
  ipPolicies: (q: Queryable, ids?: string[]) => (ids ? byIds<IpPolicyDpRow>(q, IP_POLICIES, 'p', ids) : all<IpPolicyDpRow>(q, IP_POLICIES, 'p.id')),
  certificateAuthorities: (q: Queryable, ids?: string[]) => (ids ? byIds<CaDpRow>(q, CAS, 'c', ids) : all<CaDpRow>(q, CAS, 'c.id')),
  credentials: (q: Queryable, ids?: string[]) => (ids ? byIds<CredentialDpRow>(q, CREDENTIALS, 'c', ids) : all<CredentialDpRow>(q, CREDENTIALS, 'c.id')),
  async eventSubscriptions(q: Queryable, ids?: string[]): Promise<EventSubscriptionDpRow[]> {
    if (!ids) return all<EventSubscriptionDpRow>(q, EVENT_SUBSCRIPTIONS, 's.id');
    if (ids.length === 0) return [];
    return (await q.query(`${EVENT_SUBSCRIPTIONS} AND s.id = ANY($1::text[])`, [ids])).rows as EventSubscriptionDpRow[];
  },
};
