import { z } from 'zod';
import { AppError } from '@warren/shared';
import type { Queryable } from '../db/pool.js';

/** Tables whose rows count toward an account quota (the resource types an account creates). */
export const QUOTA_TABLES = [
  'reserved_addrs', 'tunnel_group_backends', 'certificate_authorities', 'https_edges', 'https_edge_routes', 'ip_policies',
  'ip_policy_rules', 'event_destinations', 'event_subscriptions', 'api_keys', 'credentials',
] as const;
export type QuotaTable = (typeof QUOTA_TABLES)[number];

/** Throws 403 (1110) when the account already has its quota of this resource type. */
export type QuotaCheck = (accountId: string, table: QuotaTable) => Promise<void>;

/**
 * `ACCOUNT_QUOTAS=recommended`: a quota on every resource type, for multi-tenant deployments.
 * Everything an account creates is pushed to every ingress node in one config: without quotas
 * one API key can grow it past what a node accepts (an audit: 1,200 credentials of 100 ACL
 * entries added 29 MiB; at the API's rate limit a node's 256 MiB limit was minutes away), or make
 * every config change cost every node a recompile of thousands of its routes. Quotas stay off by
 * default, as wire-conventions.md decides.
 */
export const RECOMMENDED_ACCOUNT_QUOTAS: Readonly<Record<QuotaTable, number>> = {
  reserved_addrs: 100,
  tunnel_group_backends: 1_000,
  certificate_authorities: 100,
  https_edges: 100,
  https_edge_routes: 200,
  ip_policies: 100,
  ip_policy_rules: 5_000,
  event_destinations: 50,
  event_subscriptions: 50,
  api_keys: 100,
  credentials: 1_000,
};

/**
 * `ACCOUNT_QUOTAS`: a count per resource type per account, e.g. `reserved_addrs=100,https_edges=20`;
 * `recommended` stands for {@link RECOMMENDED_ACCOUNT_QUOTAS} (later entries override it, and
 * `<type>=unlimited` lifts one). Types not named are unlimited; the empty default (or `off`)
 * turns quotas off (wire-conventions.md: "configurable, off by default").
 */
export const AccountQuotas = z
  .string()
  .default('')
  .transform((s, ctx) => {
    const out: Partial<Record<QuotaTable, number>> = {};
    if (s.trim().toLowerCase() === 'off') return out;
    for (const part of s.split(',').map((p) => p.trim()).filter(Boolean)) {
      if (part.toLowerCase() === 'recommended') {
        Object.assign(out, RECOMMENDED_ACCOUNT_QUOTAS);
        continue;
      }
      const m = /^([a-z_]+)=(\d{1,9}|unlimited)$/.exec(part);
      if (!m || !(QUOTA_TABLES as readonly string[]).includes(m[1]!)) {
        ctx.addIssue({ code: 'custom', message: `"${part}" is not <type>=<count|unlimited> with a type among ${QUOTA_TABLES.join(', ')}, nor "recommended" (or the whole value "off")` });
        return z.NEVER;
      }
      if (m[2] === 'unlimited') delete out[m[1] as QuotaTable];
      else out[m[1] as QuotaTable] = Number(m[2]);
    }
    return out;
  });

/**
 * A quota check that costs nothing for types without a quota. With one, it counts the account's
 * rows (an index-only count on (account_id, id)); two concurrent creates may both pass at the
 * limit, so a quota can be exceeded by the number of simultaneous creates.
 */
export function createQuotaCheck(db: Queryable, quotas: Partial<Record<QuotaTable, number>>): QuotaCheck {
  return async (accountId, table) => {
    const limit = quotas[table];
    if (limit === undefined) return;
    const { rows } = await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${table} WHERE account_id = $1`, [accountId]);
    if (rows[0]!.n >= limit) throw new AppError(1110, `the account quota of ${limit} ${table.replace(/_/g, ' ')} is reached`);
  };
}
