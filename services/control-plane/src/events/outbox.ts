import { newId } from '@warren/shared';
import type { Queryable } from '../db/pool.js';
import { principalOf, type Principal, type RequestContext } from '../http/context.js';

export type ChangeKind = 'created' | 'updated' | 'deleted';

export interface OutboxChange {
  accountId: string;
  /** Event name stem, e.g. `ip_policy` → `ip_policy_created.v0`. */
  eventStem: string;
  kind: ChangeKind;
  resourceId: string;
  /** The resource as the API returns it (secrets already ""); for deletes, its last state. */
  object: unknown;
  principal: Principal | null;
}

/** NOTIFY channel of committed config versions (payload: the version, a hint only). */
export const CONFIG_CHANNEL = 'warren_config';

/**
 * Writes one outbox row: the config change and its audit event. Must be called with the
 * client of the transaction that makes the change, so the two commit or vanish together, and as
 * the transaction's last statement(s).
 *
 * Config versions: the insert stamps the row with the next config version (trigger
 * `outbox_stamp_version`, migration 0002), which takes the row lock of the one-row counter
 * `config_state` and holds it until the transaction ends, then notifies `warren_config` at commit.
 * So versions are dense and in commit order across connections and replicas, and writers of
 * config changes commit one at a time from this statement on: keep it last, so the lock is held
 * only for the insert and the COMMIT. Returns the version.
 */
export async function writeOutbox(q: Queryable, c: OutboxChange): Promise<number> {
  const { rows } = await q.query<{ version: number }>(
    `INSERT INTO outbox (event_id, account_id, event_type, resource_type, resource_id, object, principal)
     VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING version`,
    [newId('ev'), c.accountId, `${c.eventStem}_${c.kind}.v0`, c.eventStem, c.resourceId, JSON.stringify(c.object), c.principal ? JSON.stringify(c.principal) : null],
  );
  return rows[0]!.version;
}

/**
 * The outbox row of an API change made by the caller of `ctx`: its audit event names the API key
 * as principal, and `object` (the resource as returned, with its `id`) is the event's object.
 */
export async function audit(q: Queryable, ctx: RequestContext, eventStem: string, kind: ChangeKind, object: { id: string }): Promise<void> {
  await writeOutbox(q, { accountId: ctx.auth.accountId, eventStem, kind, resourceId: object.id, object, principal: principalOf(ctx) });
}
