import type { Queryable } from '../../db/pool.js';
import type { Page } from '../../http/paginate.js';
import { pageRows } from '../common.js';
import type { TargetKind } from './event-destinations.schema.js';
import type { StoredTarget } from './event-destinations.target.js';

export interface EventDestinationRow {
  id: string;
  account_id: string;
  description: string;
  metadata: string;
  format: string;
  target_kind: TargetKind;
  /** Secrets included: never return this as is. */
  target: StoredTarget;
  created_at: Date;
}

const COLS = 'id, account_id, description, metadata, format, target_kind, target, created_at';

export const eventDestinationsRepo = {
  async insert(q: Queryable, r: Omit<EventDestinationRow, 'created_at'>): Promise<EventDestinationRow> {
    const { rows } = await q.query<EventDestinationRow>(
      `INSERT INTO event_destinations (id, account_id, description, metadata, format, target_kind, target) VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING ${COLS}`,
      [r.id, r.account_id, r.description, r.metadata, r.format, r.target_kind, JSON.stringify(r.target)],
    );
    return rows[0]!;
  },
  async get(q: Queryable, accountId: string, id: string, forUpdate = false): Promise<EventDestinationRow | undefined> {
    const { rows } = await q.query<EventDestinationRow>(`SELECT ${COLS} FROM event_destinations WHERE account_id = $1 AND id = $2${forUpdate ? ' FOR UPDATE' : ''}`, [
      accountId,
      id,
    ]);
    return rows[0];
  },
  list(q: Queryable, accountId: string, page: Page): Promise<EventDestinationRow[]> {
    return pageRows<EventDestinationRow>(q, 'event_destinations', COLS, accountId, page);
  },
  async update(q: Queryable, accountId: string, id: string, next: { description: string; metadata: string; target: StoredTarget }): Promise<EventDestinationRow | undefined> {
    const { rows } = await q.query<EventDestinationRow>(
      `UPDATE event_destinations SET description = $3, metadata = $4, target = $5 WHERE account_id = $1 AND id = $2 RETURNING ${COLS}`,
      [accountId, id, next.description, next.metadata, JSON.stringify(next.target)],
    );
    return rows[0];
  },
  /** Subscriptions that list this destination. */
  async referencingSubscriptions(q: Queryable, id: string): Promise<string[]> {
    const { rows } = await q.query<{ subscription_id: string }>(
      'SELECT subscription_id FROM event_subscription_destinations WHERE destination_id = $1 ORDER BY subscription_id LIMIT 5',
      [id],
    );
    return rows.map((r) => r.subscription_id);
  },
  async delete(q: Queryable, accountId: string, id: string): Promise<EventDestinationRow | undefined> {
    const { rows } = await q.query<EventDestinationRow>(`DELETE FROM event_destinations WHERE account_id = $1 AND id = $2 RETURNING ${COLS}`, [accountId, id]);
    return rows[0];
  },
};
