import type { Queryable } from '../../db/pool.js';
import type { Page } from '../../http/paginate.js';
import { pageRows } from '../common.js';

export interface CertificateAuthorityRow {
  id: string;
  account_id: string;
  description: string;
  metadata: string;
  ca_pem: string;
  subject_common_name: string;
  not_before: Date;
  not_after: Date;
  key_usages: string[];
  extended_key_usages: string[];
  created_at: Date;
}

const COLS = 'id, account_id, description, metadata, ca_pem, subject_common_name, not_before, not_after, key_usages, extended_key_usages, created_at';

export const certificateAuthoritiesRepo = {
  async insert(q: Queryable, r: Omit<CertificateAuthorityRow, 'created_at'>): Promise<CertificateAuthorityRow> {
    const { rows } = await q.query<CertificateAuthorityRow>(
      `INSERT INTO certificate_authorities (id, account_id, description, metadata, ca_pem, subject_common_name, not_before, not_after, key_usages, extended_key_usages)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING ${COLS}`,
      [r.id, r.account_id, r.description, r.metadata, r.ca_pem, r.subject_common_name, r.not_before, r.not_after, r.key_usages, r.extended_key_usages],
    );
    return rows[0]!;
  },
  async get(q: Queryable, accountId: string, id: string, forUpdate = false): Promise<CertificateAuthorityRow | undefined> {
    const { rows } = await q.query<CertificateAuthorityRow>(
      `SELECT ${COLS} FROM certificate_authorities WHERE account_id = $1 AND id = $2${forUpdate ? ' FOR UPDATE' : ''}`,
      [accountId, id],
    );
    return rows[0];
  },
  list(q: Queryable, accountId: string, page: Page): Promise<CertificateAuthorityRow[]> {
    return pageRows<CertificateAuthorityRow>(q, 'certificate_authorities', COLS, accountId, page);
  },
  async update(q: Queryable, accountId: string, id: string, patch: { description: string; metadata: string }): Promise<CertificateAuthorityRow | undefined> {
    const { rows } = await q.query<CertificateAuthorityRow>(
      `UPDATE certificate_authorities SET description = $3, metadata = $4 WHERE account_id = $1 AND id = $2 RETURNING ${COLS}`,
      [accountId, id, patch.description, patch.metadata],
    );
    return rows[0];
  },
  /** Ids of the HTTPS edges whose mutual_tls lists this CA. */
  async referencingEdges(q: Queryable, id: string): Promise<string[]> {
    const { rows } = await q.query<{ edge_id: string }>('SELECT edge_id FROM https_edge_certificate_authorities WHERE ca_id = $1 ORDER BY edge_id LIMIT 5', [id]);
    return rows.map((r) => r.edge_id);
  },
  async delete(q: Queryable, accountId: string, id: string): Promise<CertificateAuthorityRow | undefined> {
    const { rows } = await q.query<CertificateAuthorityRow>(`DELETE FROM certificate_authorities WHERE account_id = $1 AND id = $2 RETURNING ${COLS}`, [accountId, id]);
    return rows[0];
  },
};
