import type { Queryable } from '../../db/pool.js';
import type { Page } from '../../http/paginate.js';
import { pageRows } from '../common.js';

export interface EventSubscriptionRow {
  id: string;
  account_id: string;
  description: string;
  metadata: string;
  created_at: Date;
  /** Source types in position order. */
  source_types: string[];
  /** Destination ids in position order. */
  destination_ids: string[];
}

const T = 'event_subscriptions';
const COLS = `${T}.id, ${T}.account_id, ${T}.description, ${T}.metadata, ${T}.created_at,
  ARRAY(SELECT s.type FROM event_subscription_sources s WHERE s.subscription_id = ${T}.id ORDER BY s.position) AS source_types,
  ARRAY(SELECT d.destination_id FROM event_subscription_destinations d WHERE d.subscription_id = ${T}.id ORDER BY d.position) AS destination_ids`;

export const eventSubscriptionsRepo = {
  async insert(q: Queryable, r: { id: string; account_id: string; description: string; metadata: string }): Promise<void> {
    await q.query(`INSERT INTO ${T} (id, account_id, description, metadata) VALUES ($1, $2, $3, $4)`, [r.id, r.account_id, r.description, r.metadata]);
  },
  async get(q: Queryable, accountId: string, id: string, forUpdate = false): Promise<EventSubscriptionRow | undefined> {
    const { rows } = await q.query<EventSubscriptionRow>(`SELECT ${COLS} FROM ${T} WHERE account_id = $1 AND id = $2${forUpdate ? ` FOR UPDATE OF ${T}` : ''}`, [accountId, id]);
    return rows[0];
  },
  list(q: Queryable, accountId: string, page: Page): Promise<EventSubscriptionRow[]> {
    return pageRows<EventSubscriptionRow>(q, T, COLS, accountId, page);
  },
  async update(q: Queryable, accountId: string, id: string, next: { description: string; metadata: string }): Promise<void> {
    await q.query(`UPDATE ${T} SET description = $3, metadata = $4 WHERE account_id = $1 AND id = $2`, [accountId, id, next.description, next.metadata]);
  },
  async replaceSources(q: Queryable, id: string, types: string[]): Promise<void> {
    await q.query('DELETE FROM event_subscription_sources WHERE subscription_id = $1', [id]);
    if (types.length > 0)
      await q.query(
        'INSERT INTO event_subscription_sources (subscription_id, type, position) SELECT $1, t, o::int - 1 FROM unnest($2::text[]) WITH ORDINALITY AS u(t, o)',
        [id, types],
      );
  },
  async replaceDestinations(q: Queryable, id: string, destinationIds: string[]): Promise<void> {
    await q.query('DELETE FROM event_subscription_destinations WHERE subscription_id = $1', [id]);
    if (destinationIds.length > 0)
      await q.query(
        'INSERT INTO event_subscription_destinations (subscription_id, destination_id, position) SELECT $1, d, o::int - 1 FROM unnest($2::text[]) WITH ORDINALITY AS u(d, o)',
        [id, destinationIds],
      );
  },
  /** Appends one source type after the existing ones. */
  async addSource(q: Queryable, id: string, type: string): Promise<void> {
    await q.query(
      `INSERT INTO event_subscription_sources (subscription_id, type, position)
       SELECT $1, $2, COALESCE(MAX(position) + 1, 0) FROM event_subscription_sources WHERE subscription_id = $1`,
      [id, type],
    );
  },
  async removeSource(q: Queryable, id: string, type: string): Promise<boolean> {
    const r = await q.query('DELETE FROM event_subscription_sources WHERE subscription_id = $1 AND type = $2', [id, type]);
    return (r.rowCount ?? 0) > 0;
  },
  async delete(q: Queryable, accountId: string, id: string): Promise<boolean> {
    const r = await q.query(`DELETE FROM ${T} WHERE account_id = $1 AND id = $2`, [accountId, id]);
    return (r.rowCount ?? 0) > 0;
  },
};
