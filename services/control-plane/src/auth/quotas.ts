import { z } from 'zod';
import { AppError } from '@warren/shared';
import type { Queryable } from '../db/pool.js';

/** Tables whose rows count toward an account quota (the resource types an account creates). */
export const QUOTA_TABLES = [
  'reserved_addrs', 'tunnel_group_backends', 'certificate_authorities', 'https_edges', 'ip_policies',
  'ip_policy_rules', 'event_destinations', 'event_subscriptions', 'api_keys', 'credentials',
] as const;
export type QuotaTable = (typeof QUOTA_TABLES)[number];

/** Throws 403 (1110) when the account already has its quota of this resource type. */
export type QuotaCheck = (accountId: string, table: QuotaTable) => Promise<void>;

/**
 * `ACCOUNT_QUOTAS`, e.g. `reserved_addrs=100,https_edges=20`: a count per resource type per
 * account; types not named are unlimited, and the empty default turns quotas off.
 */
export const AccountQuotas = z
  .string()
  .default('')
  .transform((s, ctx) => {
    const out: Partial<Record<QuotaTable, number>> = {};
    for (const part of s.split(',').map((p) => p.trim()).filter(Boolean)) {
      const m = /^([a-z_]+)=(\d{1,9})$/.exec(part);
      if (!m || !(QUOTA_TABLES as readonly string[]).includes(m[1]!)) {
        ctx.addIssue({ code: 'custom', message: `"${part}" is not <type>=<count> with a type among ${QUOTA_TABLES.join(', ')}` });
        return z.NEVER;
      }
      out[m[1] as QuotaTable] = Number(m[2]);
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
