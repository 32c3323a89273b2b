import type { Queryable } from '../../db/pool.js';
import type { StoredModules } from './route-modules.js';

/** What the SAML endpoints read of a route: its saml module, match and the edge's hostports. */
export interface SamlRouteRow {
  id: string;
  match_type: 'exact_path' | 'path_prefix';
  match: string;
  modules: StoredModules;
  hostports: string[];
}

export const samlRepo = {
  async route(q: Queryable, routeId: string): Promise<SamlRouteRow | undefined> {
    const { rows } = await q.query<SamlRouteRow>(
      `SELECT r.id, r.match_type, r.match, r.modules, e.hostports FROM https_edge_routes r JOIN https_edges e ON e.id = r.edge_id WHERE r.id = $1`,
      [routeId],
    );
    return rows[0];
  },

  /**
   * Records an accepted assertion id until `expiresAt`; false when the route already has it (a
   * replay). Expired rows of every route are deleted on the way, so the table holds only the
   * current window.
   */
  async remember(q: Queryable, routeId: string, assertionId: string, expiresAt: Date): Promise<boolean> {
    await q.query('DELETE FROM saml_assertion_ids WHERE expires_at < now()');
    const { rowCount } = await q.query(
      'INSERT INTO saml_assertion_ids (route_id, assertion_id, expires_at) VALUES ($1, $2, $3) ON CONFLICT (route_id, assertion_id) DO NOTHING',
      [routeId, assertionId.slice(0, 512), expiresAt],
    );
    return rowCount === 1;
  },
};
