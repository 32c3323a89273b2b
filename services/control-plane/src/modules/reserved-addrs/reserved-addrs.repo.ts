import type { Queryable } from '../../db/pool.js';
import type { Page } from '../../http/paginate.js';
import { pageRows } from '../common.js';

export interface ReservedAddrRow {
  id: string;
  account_id: string;
  description: string;
  metadata: string;
  region: string;
  addr: string;
  created_at: Date;
}

const COLS = 'id, account_id, description, metadata, region, addr, created_at';

export const reservedAddrsRepo = {
  async insert(q: Queryable, r: Omit<ReservedAddrRow, 'created_at'>): Promise<ReservedAddrRow> {
    const { rows } = await q.query<ReservedAddrRow>(
      `INSERT INTO reserved_addrs (id, account_id, description, metadata, region, addr) VALUES ($1, $2, $3, $4, $5, $6) RETURNING ${COLS}`,
      [r.id, r.account_id, r.description, r.metadata, r.region, r.addr],
    );
    return rows[0]!;
  },
  async get(q: Queryable, accountId: string, id: string, forUpdate = false): Promise<ReservedAddrRow | undefined> {
    const { rows } = await q.query<ReservedAddrRow>(`SELECT ${COLS} FROM reserved_addrs WHERE account_id = $1 AND id = $2${forUpdate ? ' FOR UPDATE' : ''}`, [accountId, id]);
    return rows[0];
  },
  list(q: Queryable, accountId: string, page: Page): Promise<ReservedAddrRow[]> {
    return pageRows<ReservedAddrRow>(q, 'reserved_addrs', COLS, accountId, page);
  },
  async update(q: Queryable, accountId: string, id: string, patch: { description?: string; metadata?: string }): Promise<ReservedAddrRow | undefined> {
    const { rows } = await q.query<ReservedAddrRow>(
      `UPDATE reserved_addrs SET description = COALESCE($3, description), metadata = COALESCE($4, metadata)
        WHERE account_id = $1 AND id = $2 RETURNING ${COLS}`,
      [accountId, id, patch.description ?? null, patch.metadata ?? null],
    );
    return rows[0];
  },
  async delete(q: Queryable, accountId: string, id: string): Promise<ReservedAddrRow | undefined> {
    const { rows } = await q.query<ReservedAddrRow>(`DELETE FROM reserved_addrs WHERE account_id = $1 AND id = $2 RETURNING ${COLS}`, [accountId, id]);
    return rows[0];
  },
};
