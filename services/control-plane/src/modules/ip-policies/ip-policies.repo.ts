import type { Queryable } from '../../db/pool.js';
import type { Page } from '../../http/paginate.js';
import { pageRows } from '../common.js';

export interface IpPolicyRow {
  id: string;
  account_id: string;
  description: string;
  metadata: string;
  created_at: Date;
}

export interface IpPolicyRuleRow {
  id: string;
  account_id: string;
  ip_policy_id: string;
  /** Postgres' canonical text of the `cidr` column. */
  cidr: string;
  action: 'allow' | 'deny';
  description: string;
  metadata: string;
  created_at: Date;
}

const COLS = 'id, account_id, description, metadata, created_at';
const RULE_COLS = 'id, account_id, ip_policy_id, cidr::text AS cidr, action, description, metadata, created_at';

export const ipPoliciesRepo = {
  async insert(q: Queryable, r: Omit<IpPolicyRow, 'created_at'>): Promise<IpPolicyRow> {
    const { rows } = await q.query<IpPolicyRow>(`INSERT INTO ip_policies (id, account_id, description, metadata) VALUES ($1, $2, $3, $4) RETURNING ${COLS}`, [
      r.id,
      r.account_id,
      r.description,
      r.metadata,
    ]);
    return rows[0]!;
  },
  async get(q: Queryable, accountId: string, id: string, forUpdate = false): Promise<IpPolicyRow | undefined> {
    const { rows } = await q.query<IpPolicyRow>(`SELECT ${COLS} FROM ip_policies WHERE account_id = $1 AND id = $2${forUpdate ? ' FOR UPDATE' : ''}`, [accountId, id]);
    return rows[0];
  },
  list(q: Queryable, accountId: string, page: Page): Promise<IpPolicyRow[]> {
    return pageRows<IpPolicyRow>(q, 'ip_policies', COLS, accountId, page);
  },
  async update(q: Queryable, accountId: string, id: string, next: { description: string; metadata: string }): Promise<IpPolicyRow | undefined> {
    const { rows } = await q.query<IpPolicyRow>(`UPDATE ip_policies SET description = $3, metadata = $4 WHERE account_id = $1 AND id = $2 RETURNING ${COLS}`, [
      accountId,
      id,
      next.description,
      next.metadata,
    ]);
    return rows[0];
  },
  /** Routes whose ip_restriction module (`via` 'module') or traffic policy's restrict-ips actions ('policy') list this policy: the first 5. */
  async referencingRoutes(q: Queryable, id: string): Promise<{ route_id: string; edge_id: string; via: 'module' | 'policy' }[]> {
    const { rows } = await q.query<{ route_id: string; edge_id: string; via: 'module' | 'policy' }>(
      `SELECT p.route_id, r.edge_id, p.via FROM (
          SELECT route_id, 'module' AS via FROM https_edge_route_ip_policies WHERE ip_policy_id = $1
          UNION ALL
          SELECT route_id, 'policy' AS via FROM https_edge_route_traffic_policy_ip_policies WHERE ip_policy_id = $1
        ) p JOIN https_edge_routes r ON r.id = p.route_id
        ORDER BY p.route_id, p.via LIMIT 5`,
      [id],
    );
    return rows;
  },
  async delete(q: Queryable, accountId: string, id: string): Promise<IpPolicyRow | undefined> {
    const { rows } = await q.query<IpPolicyRow>(`DELETE FROM ip_policies WHERE account_id = $1 AND id = $2 RETURNING ${COLS}`, [accountId, id]);
    return rows[0];
  },
};

export const ipPolicyRulesRepo = {
  async insert(q: Queryable, r: Omit<IpPolicyRuleRow, 'created_at'>): Promise<IpPolicyRuleRow> {
    const { rows } = await q.query<IpPolicyRuleRow>(
      `INSERT INTO ip_policy_rules (id, account_id, ip_policy_id, cidr, action, description, metadata) VALUES ($1, $2, $3, $4::cidr, $5, $6, $7) RETURNING ${RULE_COLS}`,
      [r.id, r.account_id, r.ip_policy_id, r.cidr, r.action, r.description, r.metadata],
    );
    return rows[0]!;
  },
  async get(q: Queryable, accountId: string, id: string, forUpdate = false): Promise<IpPolicyRuleRow | undefined> {
    const { rows } = await q.query<IpPolicyRuleRow>(`SELECT ${RULE_COLS} FROM ip_policy_rules WHERE account_id = $1 AND id = $2${forUpdate ? ' FOR UPDATE' : ''}`, [
      accountId,
      id,
    ]);
    return rows[0];
  },
  list(q: Queryable, accountId: string, page: Page): Promise<IpPolicyRuleRow[]> {
    return pageRows<IpPolicyRuleRow>(q, 'ip_policy_rules', RULE_COLS, accountId, page);
  },
  async listByPolicy(q: Queryable, policyId: string): Promise<IpPolicyRuleRow[]> {
    const { rows } = await q.query<IpPolicyRuleRow>(`SELECT ${RULE_COLS} FROM ip_policy_rules WHERE ip_policy_id = $1 ORDER BY created_at, id`, [policyId]);
    return rows;
  },
  async countByPolicy(q: Queryable, policyId: string): Promise<number> {
    const { rows } = await q.query<{ n: number }>('SELECT count(*)::int AS n FROM ip_policy_rules WHERE ip_policy_id = $1', [policyId]);
    return rows[0]!.n;
  },
  /** Postgres' canonical text for a CIDR already validated by `parseCidr`. */
  async canonicalCidr(q: Queryable, cidr: string): Promise<string> {
    const { rows } = await q.query<{ c: string }>('SELECT $1::cidr::text AS c', [cidr]);
    return rows[0]!.c;
  },
  async update(q: Queryable, accountId: string, id: string, next: { cidr: string; description: string; metadata: string }): Promise<IpPolicyRuleRow | undefined> {
    const { rows } = await q.query<IpPolicyRuleRow>(
      `UPDATE ip_policy_rules SET cidr = $3::cidr, description = $4, metadata = $5 WHERE account_id = $1 AND id = $2 RETURNING ${RULE_COLS}`,
      [accountId, id, next.cidr, next.description, next.metadata],
    );
    return rows[0];
  },
  async delete(q: Queryable, accountId: string, id: string): Promise<IpPolicyRuleRow | undefined> {
    const { rows } = await q.query<IpPolicyRuleRow>(`DELETE FROM ip_policy_rules WHERE account_id = $1 AND id = $2 RETURNING ${RULE_COLS}`, [accountId, id]);
    return rows[0];
  },
};
