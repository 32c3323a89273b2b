import type { Queryable } from '../../db/pool.js';
import type { StoredModules } from './route-modules.js';

export interface RouteRow {
  id: string;
  account_id: string;
  edge_id: string;
  match_type: 'exact_path' | 'path_prefix';
  match: string;
  description: string;
  metadata: string;
  modules: StoredModules;
  backend_id: string | null;
  created_at: Date;
}

const COLS = 'id, account_id, edge_id, match_type, match, description, metadata, modules, backend_id, created_at';

/** Routes of an edge come oldest first (wire-conventions.md §5). */
const ORDER = 'created_at ASC, id ASC';

export const routesRepo = {
  async insert(q: Queryable, r: Omit<RouteRow, 'created_at'>): Promise<RouteRow> {
    const { rows } = await q.query<RouteRow>(
      `INSERT INTO https_edge_routes (id, account_id, edge_id, match_type, match, description, metadata, modules, backend_id)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING ${COLS}`,
      [r.id, r.account_id, r.edge_id, r.match_type, r.match, r.description, r.metadata, JSON.stringify(r.modules), r.backend_id],
    );
    return rows[0]!;
  },

  async get(q: Queryable, accountId: string, edgeId: string, id: string, forUpdate = false): Promise<RouteRow | undefined> {
    const { rows } = await q.query<RouteRow>(
      `SELECT ${COLS} FROM https_edge_routes WHERE account_id = $1 AND edge_id = $2 AND id = $3${forUpdate ? ' FOR UPDATE' : ''}`,
      [accountId, edgeId, id],
    );
    return rows[0];
  },

  /** Every route of the given edges, oldest first. */
  async listByEdges(q: Queryable, edgeIds: string[]): Promise<RouteRow[]> {
    if (edgeIds.length === 0) return [];
    const { rows } = await q.query<RouteRow>(`SELECT ${COLS} FROM https_edge_routes WHERE edge_id = ANY($1::text[]) ORDER BY ${ORDER}`, [edgeIds]);
    return rows;
  },

  async countByEdge(q: Queryable, edgeId: string): Promise<number> {
    const { rows } = await q.query<{ n: number }>('SELECT count(*)::int AS n FROM https_edge_routes WHERE edge_id = $1', [edgeId]);
    return rows[0]!.n;
  },

  /** The route of this edge with this (match_type, match), other than `exceptId`. */
  async findByMatch(q: Queryable, edgeId: string, matchType: string, match: string, exceptId = ''): Promise<string | undefined> {
    const { rows } = await q.query<{ id: string }>('SELECT id FROM https_edge_routes WHERE edge_id = $1 AND match_type = $2 AND match = $3 AND id <> $4', [
      edgeId,
      matchType,
      match,
      exceptId,
    ]);
    return rows[0]?.id;
  },

  async update(q: Queryable, id: string, r: Pick<RouteRow, 'match_type' | 'match' | 'description' | 'metadata' | 'modules' | 'backend_id'>): Promise<RouteRow> {
    const { rows } = await q.query<RouteRow>(
      `UPDATE https_edge_routes SET match_type = $2, match = $3, description = $4, metadata = $5, modules = $6, backend_id = $7 WHERE id = $1 RETURNING ${COLS}`,
      [id, r.match_type, r.match, r.description, r.metadata, JSON.stringify(r.modules), r.backend_id],
    );
    return rows[0]!;
  },

  async delete(q: Queryable, accountId: string, edgeId: string, id: string): Promise<RouteRow | undefined> {
    const { rows } = await q.query<RouteRow>(`DELETE FROM https_edge_routes WHERE account_id = $1 AND edge_id = $2 AND id = $3 RETURNING ${COLS}`, [accountId, edgeId, id]);
    return rows[0];
  },

  /** Mirrors `modules.ip_restriction.ip_policy_ids` into https_edge_route_ip_policies (FK RESTRICT → 409 on policy delete). */
  async setIpPolicies(q: Queryable, routeId: string, ids: string[]): Promise<void> {
    await q.query('DELETE FROM https_edge_route_ip_policies WHERE route_id = $1', [routeId]);
    if (ids.length === 0) return;
    await q.query(
      `INSERT INTO https_edge_route_ip_policies (route_id, ip_policy_id, position)
       SELECT $1, id, ord::int - 1 FROM unnest($2::text[]) WITH ORDINALITY AS t(id, ord)`,
      [routeId, ids],
    );
  },

  /**
   * Mirrors the IP policies named by the traffic policy's restrict-ips actions into
   * https_edge_route_traffic_policy_ip_policies (FK RESTRICT → 409 on policy delete).
   */
  async setTrafficPolicyIpPolicies(q: Queryable, routeId: string, ids: string[]): Promise<void> {
    await q.query('DELETE FROM https_edge_route_traffic_policy_ip_policies WHERE route_id = $1', [routeId]);
    if (ids.length === 0) return;
    await q.query('INSERT INTO https_edge_route_traffic_policy_ip_policies (route_id, ip_policy_id) SELECT $1, unnest($2::text[])', [routeId, ids]);
  },

  /** Locks the edge row (serializes route creation per edge, for the 100-route limit). */
  async lockEdge(q: Queryable, accountId: string, edgeId: string): Promise<boolean> {
    const { rows } = await q.query('SELECT id FROM https_edges WHERE account_id = $1 AND id = $2 FOR UPDATE', [accountId, edgeId]);
    return rows.length > 0;
  },
};
