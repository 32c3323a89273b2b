import type pg from 'pg';
import { EVENT_TARGET_KINDS, type EventTargetKind } from '@warren/shared';
import type { LoadedDestination } from './targets/types.js';

/** A destination as the flush job sees it: the stored target (secrets included) and its health. */
export interface DestinationState extends LoadedDestination {
  paused: boolean;
  reason: string;
  pausedAt: Date | null;
  failingSince: Date | null;
}

interface Row {
  id: string;
  account_id: string;
  target_kind: string;
  target: unknown;
  paused: boolean | null;
  reason: string | null;
  paused_at: Date | null;
  failing_since: Date | null;
}

// A success is written at most this often while nothing fails (last_success_at is informational).
const SUCCESS_WRITE_INTERVAL_MS = 60_000;

/**
 * Event destinations and their health (table event_destination_health, migration 0003), read
 * with a short cache: credentials live only here and in Postgres, never in Redis. `invalidate`
 * (an update passed through the outbox) drops a cached entry at once.
 */
export class DestinationStore {
  private readonly cache = new Map<string, { at: number; value: DestinationState | null }>();
  private readonly lastSuccessWrite = new Map<string, number>();

  constructor(
    private readonly pool: pg.Pool,
    private readonly cacheMs: number,
  ) {}

  async get(id: string): Promise<DestinationState | null> {
    const hit = this.cache.get(id);
    if (hit && Date.now() - hit.at < this.cacheMs) return hit.value;
    const { rows } = await this.pool.query<Row>(
      `SELECT d.id, d.account_id, d.target_kind, d.target, h.paused, h.reason, h.paused_at, h.failing_since
         FROM event_destinations d LEFT JOIN event_destination_health h ON h.destination_id = d.id
        WHERE d.id = $1`,
      [id],
    );
    const r = rows[0];
    const value: DestinationState | null =
      r && (EVENT_TARGET_KINDS as readonly string[]).includes(r.target_kind)
        ? {
            id: r.id,
            accountId: r.account_id,
            kind: r.target_kind as EventTargetKind,
            target: r.target,
            paused: r.paused === true,
            reason: r.reason ?? '',
            pausedAt: r.paused_at,
            failingSince: r.failing_since,
          }
        : null;
    if (this.cache.size > 10_000) this.cache.clear();
    this.cache.set(id, { at: Date.now(), value });
    return value;
  }

  invalidate(id: string): void {
    this.cache.delete(id);
  }

  private patchCache(id: string, patch: Partial<DestinationState>): void {
    const hit = this.cache.get(id);
    if (hit?.value) hit.value = { ...hit.value, ...patch };
  }

  /** Marks the destination paused (kept buffering, nothing sent until a probe or an update). */
  async pause(id: string, reason: string): Promise<void> {
    await this.upsert(
      id,
      `INSERT INTO event_destination_health (destination_id, paused, reason, paused_at) VALUES ($1, true, $2, now())
       ON CONFLICT (destination_id) DO UPDATE SET paused = true, reason = $2, paused_at = now(), updated_at = now()`,
      [id, reason],
    );
    this.patchCache(id, { paused: true, reason, pausedAt: new Date() });
  }

  /** Clears the pause (and the failure clock). Returns whether it was paused. */
  async unpause(id: string): Promise<boolean> {
    const { rowCount } = await this.pool.query(
      `UPDATE event_destination_health SET paused = false, reason = '', paused_at = NULL, failing_since = NULL, updated_at = now()
        WHERE destination_id = $1 AND paused`,
      [id],
    );
    this.patchCache(id, { paused: false, reason: '', pausedAt: null, failingSince: null });
    return (rowCount ?? 0) > 0;
  }

  /** A failed attempt: starts the failure clock if it is not running. Returns when it started. */
  async recordFailure(id: string): Promise<Date> {
    const { rows } = await this.pool
      .query<{ failing_since: Date }>(
        `INSERT INTO event_destination_health (destination_id, failing_since) VALUES ($1, now())
         ON CONFLICT (destination_id) DO UPDATE SET failing_since = COALESCE(event_destination_health.failing_since, now()), updated_at = now()
         RETURNING failing_since`,
        [id],
      )
      .catch((err: unknown) => (isFkViolation(err) ? { rows: [] as { failing_since: Date }[] } : Promise.reject(err)));
    const since = rows[0]?.failing_since ?? new Date();
    this.patchCache(id, { failingSince: since });
    this.lastSuccessWrite.delete(id);
    return since;
  }

  /** Records are accepted: stops the failure clock (written when it was running, else at most once a minute). */
  async recordSuccess(dest: DestinationState): Promise<void> {
    const last = this.lastSuccessWrite.get(dest.id);
    if (dest.failingSince === null && last !== undefined && Date.now() - last < SUCCESS_WRITE_INTERVAL_MS) return;
    if (this.lastSuccessWrite.size > 10_000) this.lastSuccessWrite.clear();
    this.lastSuccessWrite.set(dest.id, Date.now());
    await this.upsert(
      dest.id,
      `INSERT INTO event_destination_health (destination_id, last_success_at) VALUES ($1, now())
       ON CONFLICT (destination_id) DO UPDATE SET last_success_at = now(), failing_since = NULL, updated_at = now()`,
      [dest.id],
    );
    this.patchCache(dest.id, { failingSince: null });
  }

  /** Paused destinations due for a probe (paused at least `afterMs` ago). */
  async pausedDue(afterMs: number, limit = 1000): Promise<Array<{ id: string; kind: EventTargetKind; reason: string }>> {
    const { rows } = await this.pool.query<{ id: string; kind: EventTargetKind; reason: string }>(
      `SELECT d.id, d.target_kind AS kind, h.reason FROM event_destination_health h JOIN event_destinations d ON d.id = h.destination_id
        WHERE h.paused AND h.paused_at <= now() - make_interval(secs => $1::double precision / 1000)
        ORDER BY h.paused_at LIMIT $2`,
      [afterMs, limit],
    );
    return rows;
  }

  async pausedCount(): Promise<number> {
    const { rows } = await this.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM event_destination_health WHERE paused');
    return rows[0]?.n ?? 0;
  }

  private async upsert(id: string, sql: string, params: unknown[]): Promise<void> {
    try {
      await this.pool.query(sql, params);
    } catch (err) {
      // The destination was deleted meanwhile: nothing to record.
      if (!isFkViolation(err)) throw err;
      this.invalidate(id);
    }
  }
}

function isFkViolation(err: unknown): boolean {
  return (err as { code?: string }).code === '23503';
}
