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

/**
 * Writes one outbox row: the config change and its audit event. Must be called with the
 * client of the transaction that makes the change, so the two commit or vanish together.
 */
export async function writeOutbox(q: Queryable, c: OutboxChange): Promise<void> {
  await q.query(
    `INSERT INTO outbox (event_id, account_id, event_type, resource_type, resource_id, object, principal)
     VALUES ($1, $2, $3, $4, $5, $6, $7)`,
    [newId('ev'), c.accountId, `${c.eventStem}_${c.kind}.v0`, c.eventStem, c.resourceId, JSON.stringify(c.object), c.principal ? JSON.stringify(c.principal) : null],
  );
}

/**
 * The outbox row of an API change made by the caller of `ctx`: its audit event names the API key
 * as principal, and `object` (the resource as returned, with its `id`) is the event's object.
 */
export function audit(q: Queryable, ctx: RequestContext, eventStem: string, kind: ChangeKind, object: { id: string }): Promise<void> {
  return writeOutbox(q, { accountId: ctx.auth.accountId, eventStem, kind, resourceId: object.id, object, principal: principalOf(ctx) });
}
