import type pg from 'pg';
import type { DestinationRef, EventEnvelope } from '@warren/shared';

type Queryable = Pick<pg.Pool | pg.PoolClient, 'query'>;

// bigint columns arrive as strings unless a process-wide parser says otherwise: convert here.
const num = (v: unknown): number => Number(v);

/** One outbox row of a batch, with the destinations subscribed to it (empty: nobody). */
export interface RelayRow {
  version: number;
  event_id: string;
  event_type: string;
  account_id: string;
  resource_type: string;
  resource_id: string;
  /** Only loaded when `dests` is not empty. */
  object: unknown;
  principal: EventEnvelope['principal'];
  committed_at: Date;
  created_at: Date;
  dests: DestinationRef[];
}

export interface DestinationChange {
  version: number;
  destId: string;
  deleted: boolean;
}

export const relayRepo = {
  /**
   * Takes the relay lock (the row lock of `event_relay_state`, held until the transaction ends)
   * and returns the cursor and the committed head version; null when another relay holds it
   * (SKIP LOCKED: nobody queues up behind it). Run inside a transaction.
   */
  async claim(q: Queryable): Promise<{ cursor: number; head: number } | null> {
    const { rows } = await q.query(
      `SELECT r.version AS cursor, (SELECT c.version FROM config_state c) AS head
         FROM event_relay_state r WHERE r.id = 1 FOR UPDATE OF r SKIP LOCKED`,
    );
    if (rows.length === 0) return null;
    return { cursor: num(rows[0].cursor), head: num(rows[0].head ?? 0) };
  },

  /** Cursor and head without any lock (lag metric of a replica that is not relaying). */
  async peek(q: Queryable): Promise<{ cursor: number; head: number }> {
    const { rows } = await q.query(`SELECT r.version AS cursor, (SELECT c.version FROM config_state c) AS head FROM event_relay_state r WHERE r.id = 1`);
    if (rows.length === 0) throw new Error('event_relay_state has no row: run the control-plane migrations (0004_event_relay.sql)');
    return { cursor: num(rows[0].cursor), head: num(rows[0].head ?? 0) };
  },

  /**
   * The next `limit` outbox rows after `cursor` in version order, each with the distinct
   * destinations (id, kind) of its account's subscriptions whose sources list its event type:
   * one statement for the batch. Rows nobody subscribes to come without object or principal.
   */
  async batch(q: Queryable, cursor: number, limit: number): Promise<RelayRow[]> {
    const { rows } = await q.query(
      `WITH b AS (
         SELECT version, event_id, account_id, event_type, resource_type, resource_id, object, principal, committed_at, created_at
           FROM outbox WHERE version > $1 ORDER BY version LIMIT $2
       )
       SELECT b.version, b.event_id, b.account_id, b.event_type, b.resource_type, b.resource_id, b.committed_at, b.created_at,
              s.dests,
              CASE WHEN s.dests IS NULL THEN NULL ELSE b.object END AS object,
              CASE WHEN s.dests IS NULL THEN NULL ELSE b.principal END AS principal
         FROM b
         LEFT JOIN LATERAL (
           SELECT jsonb_agg(jsonb_build_object('id', x.id, 'kind', x.target_kind) ORDER BY x.id) AS dests
             FROM (SELECT DISTINCT d.id, d.target_kind
                     FROM event_subscriptions es
                     JOIN event_subscription_sources src ON src.subscription_id = es.id AND src.type = b.event_type
                     JOIN event_subscription_destinations sd ON sd.subscription_id = es.id
                     JOIN event_destinations d ON d.id = sd.destination_id AND d.account_id = es.account_id
                    WHERE es.account_id = b.account_id) x
         ) s ON true
        ORDER BY b.version`,
      [cursor, limit],
    );
    return rows.map((r) => ({
      version: num(r.version),
      event_id: r.event_id,
      event_type: r.event_type,
      account_id: r.account_id,
      resource_type: r.resource_type,
      resource_id: r.resource_id,
      object: r.object,
      principal: r.principal ?? null,
      committed_at: r.committed_at,
      created_at: r.created_at,
      dests: (r.dests ?? []) as DestinationRef[],
    }));
  },

  async advance(q: Queryable, version: number): Promise<void> {
    await q.query('UPDATE event_relay_state SET version = $1, updated_at = now() WHERE id = 1', [version]);
  },

  /** The committed head config version (0 on a database without one). */
  async head(q: Queryable): Promise<number> {
    const { rows } = await q.query('SELECT version FROM config_state');
    return num(rows[0]?.version ?? 0);
  },

  /**
   * Updates and deletes of event destinations committed after version `since`, up to the head
   * (one snapshot), in version order, and the head itself. At most `limit` changes: when that
   * many come back, `head` is the last one's version and the caller asks again.
   */
  async destinationChanges(q: Queryable, since: number, limit: number): Promise<{ head: number; changes: DestinationChange[] }> {
    const { rows } = await q.query(
      `SELECT c.version AS head, o.version, o.resource_id, o.event_type
         FROM config_state c
         LEFT JOIN LATERAL (
           SELECT version, resource_id, event_type FROM outbox
            WHERE version > $1 AND version <= c.version AND resource_type = 'event_destination'
              AND event_type IN ('event_destination_updated.v0', 'event_destination_deleted.v0')
            ORDER BY version LIMIT $2
         ) o ON true
        ORDER BY o.version`,
      [since, limit],
    );
    if (rows.length === 0) return { head: 0, changes: [] };
    const changes: DestinationChange[] = rows
      .filter((r) => r.version !== null)
      .map((r) => ({ version: num(r.version), destId: r.resource_id, deleted: r.event_type === 'event_destination_deleted.v0' }));
    const head = changes.length === limit ? changes[changes.length - 1]!.version : num(rows[0].head);
    return { head, changes };
  },
};
