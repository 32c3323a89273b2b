import type pg from 'pg';

/** One dead-letter row as listed (payload left out). */
export interface DeadLetterSummary {
  id: number;
  destination_id: string;
  account_id: string;
  reason: string;
  events: number;
  event_ids: string[];
  first_attempt_at: Date | null;
  last_attempt_at: Date | null;
  created_at: Date;
}

export interface DeadLetterInput {
  destinationId: string;
  /** '' when unknown (destination deleted): then taken from the first envelope. */
  accountId: string;
  /** Serialized envelopes, in order. */
  envelopes: string[];
  reason: string;
  firstAttemptAt?: Date | null;
  lastAttemptAt?: Date | null;
}

// Rows are split so that one insert stays well below Postgres' 1 GB value limit and the payload readable.
const MAX_EVENTS_PER_ROW = 1000;

/** What a stored envelope is: its JSON value, or the raw text when it is not JSON. */
function parseEnvelope(text: string): { value: unknown; eventId: string; accountId: string } {
  try {
    const value = JSON.parse(text) as { event_id?: unknown; account_id?: unknown } | null;
    const o = value && typeof value === 'object' ? value : {};
    return { value, eventId: typeof o.event_id === 'string' ? o.event_id : '', accountId: typeof o.account_id === 'string' ? o.account_id : '' };
  } catch {
    return { value: text, eventId: '', accountId: '' };
  }
}

/** The text to put back into a buffer for one stored payload element. */
export function envelopeText(value: unknown): string {
  if (typeof value === 'string') return value;
  const e = value as Record<string, unknown>;
  // Documented key order (wire-conventions §11); jsonb does not keep it.
  const ordered: Record<string, unknown> = {};
  for (const k of ['event_id', 'event_type', 'event_timestamp', 'account_id', 'object', 'principal']) if (k in e) ordered[k] = e[k];
  for (const k of Object.keys(e)) if (!(k in ordered)) ordered[k] = e[k];
  return JSON.stringify(ordered);
}

/** The dead letters table (migration 0003). */
export class DeadLetters {
  constructor(private readonly pool: pg.Pool) {}

  /** Stores the envelopes (split into rows of at most 1000). Returns the number of events stored. */
  async add(input: DeadLetterInput): Promise<number> {
    if (input.envelopes.length === 0) return 0;
    for (let i = 0; i < input.envelopes.length; i += MAX_EVENTS_PER_ROW) {
      const parsed = input.envelopes.slice(i, i + MAX_EVENTS_PER_ROW).map(parseEnvelope);
      const accountId = input.accountId || parsed.find((p) => p.accountId)?.accountId || '';
      await this.pool.query(
        `INSERT INTO event_dead_letters (destination_id, account_id, event_ids, reason, payload, first_attempt_at, last_attempt_at)
         VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7)`,
        [input.destinationId, accountId, parsed.map((p) => p.eventId), input.reason, JSON.stringify(parsed.map((p) => p.value)), input.firstAttemptAt ?? null, input.lastAttemptAt ?? new Date()],
      );
    }
    return input.envelopes.length;
  }

  async list(opts: { destinationId?: string; limit?: number } = {}): Promise<DeadLetterSummary[]> {
    const { rows } = await this.pool.query<DeadLetterSummary>(
      `SELECT id, destination_id, account_id, reason, cardinality(event_ids) AS events, event_ids, first_attempt_at, last_attempt_at, created_at
         FROM event_dead_letters WHERE ($1::text IS NULL OR destination_id = $1) ORDER BY id LIMIT $2`,
      [opts.destinationId ?? null, opts.limit ?? 100],
    );
    return rows;
  }

  /**
   * Runs `fn` with the rows picked (one id, or every row of a destination) inside a transaction
   * and deletes them when `fn` succeeds: a failed replay keeps its rows.
   */
  async take<T>(which: { id: number } | { destinationId: string }, fn: (rows: Array<{ id: number; destination_id: string; payload: unknown[] }>) => Promise<T>): Promise<T> {
    const client = await this.pool.connect();
    try {
      await client.query('BEGIN');
      const { rows } =
        'id' in which
          ? await client.query<{ id: number; destination_id: string; payload: unknown[] }>('SELECT id, destination_id, payload FROM event_dead_letters WHERE id = $1 FOR UPDATE', [which.id])
          : await client.query<{ id: number; destination_id: string; payload: unknown[] }>('SELECT id, destination_id, payload FROM event_dead_letters WHERE destination_id = $1 ORDER BY id FOR UPDATE', [which.destinationId]);
      const result = await fn(rows);
      if (rows.length) await client.query('DELETE FROM event_dead_letters WHERE id = ANY($1::bigint[])', [rows.map((r) => r.id)]);
      await client.query('COMMIT');
      return result;
    } catch (err) {
      await client.query('ROLLBACK').catch(() => {});
      throw err;
    } finally {
      client.release();
    }
  }
}
