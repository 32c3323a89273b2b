import { z } from 'zod';
import { AppError, rfc3339 } from '@warren/shared';
import type { Queryable } from '../db/pool.js';
import type { Page } from '../http/paginate.js';

/** `{id, uri}` reference as every response uses it. */
export const RefSchema = z.object({ id: z.string(), uri: z.string() });
export type Ref = z.infer<typeof RefSchema>;

export function ref(baseUrl: string, collection: string, id: string): Ref {
  return { id, uri: `${baseUrl}/${collection}/${id}` };
}

/** Optional top-level strings are omitted when empty (wire-conventions.md §7). */
export function optionalStrings<T extends Record<string, string | null | undefined>>(o: T): Partial<Record<keyof T, string>> {
  const out: Partial<Record<keyof T, string>> = {};
  for (const k of Object.keys(o) as (keyof T)[]) {
    const v = o[k];
    if (v) out[k] = v;
  }
  return out;
}

export { rfc3339 };

/**
 * Keyset page of `table` for one account: newest first, `limit + 1` rows so the caller knows
 * whether a next page exists. Served by the `(account_id, id)` index whatever the table size.
 */
export async function pageRows<R>(q: Queryable, table: string, columns: string, accountId: string, page: Page, extraWhere = '', extraParams: unknown[] = []): Promise<R[]> {
  const params: unknown[] = [accountId, page.limit + 1, ...extraParams];
  let where = `account_id = $1${extraWhere}`;
  if (page.beforeId) {
    params.push(page.beforeId);
    where += ` AND id < $${params.length}`;
  }
  const { rows } = await q.query(`SELECT ${columns} FROM ${table} WHERE ${where} ORDER BY id DESC LIMIT $2`, params);
  return rows as R[];
}

/** Throws 400 (3002) unless every id exists in `table` for this account. */
export async function requireOwned(q: Queryable, table: string, accountId: string, ids: string[], field: string): Promise<void> {
  if (ids.length === 0) return;
  const { rows } = await q.query<{ id: string }>(`SELECT id FROM ${table} WHERE account_id = $1 AND id = ANY($2::text[])`, [accountId, ids]);
  const found = new Set(rows.map((r) => r.id));
  const missing = ids.find((id) => !found.has(id));
  if (missing) throw new AppError(3002, `${field}: no resource with id ${JSON.stringify(missing)} in this account`, { field, resourceId: missing });
}
