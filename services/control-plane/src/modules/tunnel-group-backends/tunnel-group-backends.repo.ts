import type { Queryable } from '../../db/pool.js';
import type { Page } from '../../http/paginate.js';
import { pageRows } from '../common.js';

export interface TunnelGroupBackendRow {
  id: string;
  account_id: string;
  description: string;
  metadata: string;
  labels: Record<string, string>;
  created_at: Date;
  /** Ids of online tunnels of the account whose labels include all of the backend's labels. */
  tunnel_ids: string[];
}

const BASE = 'id, account_id, description, metadata, labels, created_at';
// Tunnels are matched at read time: a GIN index on tunnels.labels serves the @> containment.
const COLS = `${BASE}, ARRAY(SELECT t.id FROM tunnels t WHERE t.account_id = b.account_id AND t.labels @> b.labels AND EXISTS (SELECT 1 FROM tunnel_sessions s WHERE s.id = t.tunnel_session_id AND s.lease_expires_at > now()) ORDER BY t.id) AS tunnel_ids`;

export const tunnelGroupBackendsRepo = {
  async insert(q: Queryable, r: Omit<TunnelGroupBackendRow, 'created_at' | 'tunnel_ids'>): Promise<TunnelGroupBackendRow> {
    const { rows } = await q.query<TunnelGroupBackendRow>(
      `WITH b AS (INSERT INTO tunnel_group_backends (id, account_id, description, metadata, labels) VALUES ($1, $2, $3, $4, $5) RETURNING ${BASE})
       SELECT ${COLS} FROM b`,
      [r.id, r.account_id, r.description, r.metadata, JSON.stringify(r.labels)],
    );
    return rows[0]!;
  },
  async get(q: Queryable, accountId: string, id: string, forUpdate = false): Promise<TunnelGroupBackendRow | undefined> {
    const { rows } = await q.query<TunnelGroupBackendRow>(`SELECT ${COLS} FROM tunnel_group_backends b WHERE account_id = $1 AND id = $2${forUpdate ? ' FOR UPDATE' : ''}`, [accountId, id]);
    return rows[0];
  },
  list(q: Queryable, accountId: string, page: Page): Promise<TunnelGroupBackendRow[]> {
    return pageRows<TunnelGroupBackendRow>(q, 'tunnel_group_backends b', COLS, accountId, page);
  },
  async update(q: Queryable, accountId: string, id: string, patch: { description?: string; metadata?: string; labels?: Record<string, string> }): Promise<TunnelGroupBackendRow | undefined> {
    const { rows } = await q.query<TunnelGroupBackendRow>(
      `WITH b AS (UPDATE tunnel_group_backends SET description = COALESCE($3, description), metadata = COALESCE($4, metadata), labels = COALESCE($5::jsonb, labels)
        WHERE account_id = $1 AND id = $2 RETURNING ${BASE})
       SELECT ${COLS} FROM b`,
      [accountId, id, patch.description ?? null, patch.metadata ?? null, patch.labels ? JSON.stringify(patch.labels) : null],
    );
    return rows[0];
  },
  async delete(q: Queryable, accountId: string, id: string): Promise<boolean> {
    const { rowCount } = await q.query(`DELETE FROM tunnel_group_backends WHERE account_id = $1 AND id = $2`, [accountId, id]);
    return (rowCount ?? 0) > 0;
  },
};
