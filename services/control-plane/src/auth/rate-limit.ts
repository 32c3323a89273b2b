import { hostname } from 'node:os';
import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import pg from 'pg';
import client from 'prom-client';
import { AppError, type Logger } from '@warren/shared';
import type { AuthContext } from '../http/context.js';

/**
 * Per-account management API limit over a rolling 60 s (wire-conventions.md §13), as a
 * two-bucket sliding-window counter: estimate = previous window's count × the part of it still
 * inside the last 60 s + this window's count; a request is admitted while the estimate is below
 * the limit. `limit` 0 turns it off.
 *
 * The decision is always made in memory (no database round trip per request). With `sync`, the
 * replicas of a deployment share their counts through Postgres in the background
 * (table api_rate_counts): every `intervalMs` each replica upserts, in one statement, its own
 * counts for the current and previous window of the accounts that sent requests since its last
 * sync, reads the summed counts of the other replicas for the accounts whose rows changed since
 * its last read, and deletes its own rows whose window ended more than a window ago (all of them)
 * plus a bounded batch of such rows of any replica (those of replicas that are gone).
 * The estimate then uses this replica's counts plus the other replicas' last known counts.
 *
 * Over-admission bound: a request admitted by one replica reaches the others after its sync
 * (≤ 1 interval) and their next read (≤ 1 more interval), plus the queries' time. So across the
 * deployment an account can exceed the limit by at most what the other replicas admitted for it
 * in that lag: with r requests/s reaching each replica and interval I, about
 * (replicas − 1) × r × I on average and 2 × (replicas − 1) × r × I at worst (1,200/min spread
 * over 3 replicas, I = 1 s: ~13, at worst ~27 requests over the 1,200). Without sync each replica
 * counts on its own and an account may reach replicas × limit; while Postgres is unreachable a
 * replica adds to its own counts the other replicas' counts it read last.
 *
 * If Postgres is slow or down, syncs fail or time out (`timeoutMs`; the connection is then
 * dropped), the limiter goes on deciding with what it knows, logs once per outage, counts the
 * failures in `warren_control_plane_api_rate_limit_sync_failures_total`, and recovers on a later
 * sync (the first read after an outage reads all recent rows again). All replicas must use the
 * same window length; window slots follow each replica's clock (NTP-level skew is harmless).
 */
export interface RateLimitSyncOptions {
  /** Postgres for the shared counts; the limiter opens one connection of its own (not the API pool). */
  databaseUrl: string;
  /** Sync period (default 1,000 ms). */
  intervalMs?: number;
  /** Longest a sync (connect + queries) may take before it counts as failed (default 5,000 ms). */
  timeoutMs?: number;
  /** This process's id in the table (default: host, pid and random bytes). */
  replicaId?: string;
  log?: Logger;
  /** Registry for the sync metrics (the control plane's). */
  registry?: client.Registry;
  /** Expired rows of other replicas (gone ones) deleted per sync at most (default 1,000); a replica's own are all deleted. */
  deleteBatch?: number;
}

export interface RateLimiterOptions {
  windowMs?: number;
  /**
   * Accounts tracked at most (default 100,000); beyond, one entry is evicted per new account: the
   * lightest among those of the oldest windows, so an active account's count is kept.
   */
  maxAccounts?: number;
  sync?: RateLimitSyncOptions;
  /** Clock (tests). */
  now?: () => number;
}

export interface AccountRateLimiter {
  /** Throws AppError 8000 (429 with an integer Retry-After) when the account is over the limit; else counts the request. */
  check(auth: AuthContext): void;
  /** One background sync now (tests, shutdown); resolves when done or failed, never rejects. */
  sync(): Promise<void>;
  /** Stops the timer, flushes the counts once more and closes the connection. */
  close(): Promise<void>;
  readonly replicaId: string | undefined;
  /** Accounts tracked (tests). */
  readonly size: number;
}

interface Entry {
  /** Local counts: `cur` for window `window`, `prev` for window − 1. */
  window: number;
  prev: number;
  cur: number;
  /** Requests admitted here since the last sync wrote this entry. */
  dirty: boolean;
  /** The other replicas' summed counts as of the last read: `oCur` for slot `oSlot` (and later), `oPrev` for oSlot − 1. */
  oSlot: number;
  oPrev: number;
  oCur: number;
  /** Newest window this entry holds anything for; the map is kept in ascending `touched` order. */
  touched: number;
}

/** Entries looked at (oldest windows first) to pick one to evict when the map is full. */
const EVICTION_SAMPLE = 32;

interface Row {
  account: string;
  slot: number;
  count: number;
}

export function createAccountRateLimiter(limit: number, opts: RateLimiterOptions = {}): AccountRateLimiter {
  const windowMs = opts.windowMs ?? 60_000;
  const maxAccounts = Math.max(1, opts.maxAccounts ?? 100_000);
  const now = opts.now ?? Date.now;
  // Insertion order = ascending `touched`: an entry is re-inserted whenever `touched` grows, so
  // the first entries are those of the oldest windows.
  const state = new Map<string, Entry>();
  // Counts of evicted entries not yet written.
  let pending: Row[] = [];

  const touch = (key: string, e: Entry, window: number) => {
    if (e.touched === window) return;
    e.touched = window;
    state.delete(key);
    state.set(key, e);
  };

  /**
   * Makes room for one entry without resetting everybody (the old `state.clear()` did): among the
   * EVICTION_SAMPLE entries of the oldest windows (the front of the map), drops the one with the
   * lowest count at `window` — an entry with nothing for the last two windows first, and never an
   * account near its limit while lighter ones are tracked.
   */
  const evictOne = (window: number) => {
    let victim: [string, Entry] | undefined;
    let least = Infinity;
    let n = 0;
    for (const kv of state) {
      const [p, c] = counts(kv[1], window);
      const total = p + c;
      if (total < least) {
        least = total;
        victim = kv;
        if (total === 0) break;
      }
      if (++n >= EVICTION_SAMPLE) break;
    }
    if (!victim) return;
    const [key, e] = victim;
    state.delete(key);
    if (e.dirty) {
      if (e.cur > 0) pending.push({ account: key, slot: e.window, count: e.cur });
      if (e.prev > 0) pending.push({ account: key, slot: e.window - 1, count: e.prev });
      if (pending.length > maxAccounts * 2) pending = pending.slice(-maxAccounts * 2);
    }
  };

  /** Rolls the local counts to `window`. */
  const roll = (e: Entry, window: number) => {
    if (e.window === window) return;
    e.prev = e.window === window - 1 ? e.cur : 0;
    e.cur = 0;
    e.window = window;
  };

  /** Combined previous and current window counts at `window` (local + other replicas). */
  const counts = (e: Entry, window: number): [number, number] => {
    const lPrev = e.window === window ? e.prev : e.window === window - 1 ? e.cur : 0;
    const lCur = e.window === window ? e.cur : 0;
    const oPrev = e.oSlot === window ? e.oPrev : e.oSlot === window - 1 ? e.oCur : 0;
    const oCur = e.oSlot === window ? e.oCur : 0;
    return [lPrev + oPrev, lCur + oCur];
  };

  /** The sliding-window estimate at time `t` given counts `prev`/`cur` of window `window`, with no further requests. */
  const estimateAt = (t: number, window: number, prev: number, cur: number): number => {
    const w = Math.floor(t / windowMs);
    const elapsed = (t % windowMs) / windowMs;
    if (w === window) return prev * (1 - elapsed) + cur;
    if (w === window + 1) return cur * (1 - elapsed);
    return 0;
  };

  /** Whole seconds until the estimate falls below the limit, assuming no further requests; never early. */
  const retryAfter = (t: number, window: number, prev: number, cur: number): number => {
    const offset = t % windowMs;
    // This window: prev × (1 − e) + cur < limit; else the next: cur × (1 − e') < limit.
    const waitMs = cur < limit ? windowMs * (1 - (limit - cur) / prev) - offset : windowMs - offset + windowMs * (1 - limit / cur);
    let secs = Math.max(1, Math.ceil(waitMs / 1000));
    // Check with the same arithmetic as the decision (rounding), so that the answer is never early.
    while (secs < 3 * Math.ceil(windowMs / 1000) && estimateAt(t + secs * 1000, window, prev, cur) >= limit) secs++;
    return secs;
  };

  function check(auth: AuthContext): void {
    if (limit <= 0) return;
    const t = now();
    const window = Math.floor(t / windowMs);
    const key = auth.accountId;
    let e = state.get(key);
    if (!e) {
      if (state.size >= maxAccounts) evictOne(window);
      e = { window, prev: 0, cur: 0, dirty: false, oSlot: -1, oPrev: 0, oCur: 0, touched: window };
      state.set(key, e);
    } else {
      roll(e, window);
      touch(key, e, window);
    }
    const [prev, cur] = counts(e, window);
    const elapsed = (t % windowMs) / windowMs;
    const estimate = prev * (1 - elapsed) + cur;
    if (estimate >= limit) {
      const retry = retryAfter(t, window, prev, cur);
      throw new AppError(8000, `management API rate limit of ${limit} requests per minute exceeded; retry in ${retry} s`, { headers: { 'Retry-After': String(retry) } });
    }
    e.cur++;
    e.dirty = true;
  }

  const sync = opts.sync && limit > 0 ? createSync(opts.sync) : undefined;

  function createSync(o: RateLimitSyncOptions) {
    const intervalMs = Math.max(10, o.intervalMs ?? 1_000);
    const timeoutMs = Math.max(100, o.timeoutMs ?? 5_000);
    const deleteBatch = o.deleteBatch ?? 1_000;
    const replicaId = o.replicaId ?? `${hostname().slice(0, 40)}/${process.pid}/${randomBytes(6).toString('hex')}`;
    const log = o.log;
    const registers = o.registry ? [o.registry] : [];
    const failures = new client.Counter({
      name: 'warren_control_plane_api_rate_limit_sync_failures_total',
      help: 'Syncs of the management API rate-limit counts with Postgres that failed or timed out (the replica then decides on its own counts and what it last read)',
      registers,
    });
    const degraded = new client.Gauge({
      name: 'warren_control_plane_api_rate_limit_sync_degraded',
      help: '1 while the rate-limit counts cannot be synced with Postgres, else 0',
      registers,
    });
    let conn: pg.Client | undefined;
    let running: Promise<void> | undefined;
    let closed = false;
    let outage = false;
    /** performance.now() at the start of the last successful read; undefined: read everything recent. */
    let lastReadAt: number | undefined;

    const drop = () => {
      const c = conn;
      conn = undefined;
      if (!c) return;
      c.removeAllListeners('error');
      c.on('error', () => {});
      // Ends a connection whose server does not answer as well: the socket goes at once.
      (c as unknown as { connection?: { stream?: { destroy(): void } } }).connection?.stream?.destroy();
      c.end().catch(() => {});
    };

    const connect = async (): Promise<pg.Client> => {
      if (conn) return conn;
      const c = new pg.Client({
        connectionString: o.databaseUrl,
        connectionTimeoutMillis: timeoutMs,
        statement_timeout: timeoutMs,
        application_name: 'warren-control-plane-rate-limit',
      });
      c.on('error', () => {
        if (conn === c) conn = undefined;
      });
      conn = c;
      try {
        await c.connect();
      } catch (err) {
        if (conn === c) conn = undefined;
        throw err;
      }
      return c;
    };

    const run = async (writeOnly: boolean): Promise<void> => {
      const t = now();
      const window = Math.floor(t / windowMs);
      // Forget entries that hold nothing for this or the previous window (front of the map).
      for (const [key, e] of state) {
        if (e.touched >= window - 1) break;
        if (!e.dirty) state.delete(key);
      }
      // This sync's rows: counts of evicted entries, then of the entries with new requests,
      // summed per (account, slot) (one statement may not upsert a row twice).
      const evicted = pending;
      pending = [];
      const written: Array<[string, Entry]> = [];
      const batch = new Map<string, Row>();
      const add = (account: string, slot: number, count: number) => {
        if (count <= 0) return;
        const k = `${slot}:${account}`;
        const r = batch.get(k);
        if (r) r.count += count;
        else batch.set(k, { account, slot, count });
      };
      for (const r of evicted) add(r.account, r.slot, r.count);
      for (const [key, e] of state) {
        if (!e.dirty) continue;
        e.dirty = false;
        written.push([key, e]);
        add(key, e.window, e.cur);
        add(key, e.window - 1, e.prev);
      }
      const rows = [...batch.values()];
      const readStart = performance.now();
      let timer: NodeJS.Timeout | undefined;
      try {
        const work = (async () => {
          const c = await connect();
          if (rows.length > 0) {
            await c.query(
              `INSERT INTO api_rate_counts (account_id, slot, replica_id, count)
               SELECT a, s, $1, n FROM unnest($2::text[], $3::bigint[], $4::int[]) AS u(a, s, n)
               ON CONFLICT (account_id, slot, replica_id) DO UPDATE SET count = EXCLUDED.count, updated_at = now()
               WHERE api_rate_counts.count < EXCLUDED.count`,
              [replicaId, rows.map((r) => r.account), rows.map((r) => r.slot), rows.map((r) => r.count)],
            );
          }
          if (writeOnly) return undefined;
          // Rows another replica wrote commit at most timeoutMs (its statement_timeout) after their
          // now(); reading back that much further than the last read misses none.
          const since = lastReadAt === undefined ? null : (readStart - lastReadAt + timeoutMs + 1_000) / 1000;
          const changed = since === null
            ? `SELECT account_id FROM api_rate_counts WHERE slot >= $2 AND replica_id <> $1 LIMIT $3`
            : `SELECT account_id FROM api_rate_counts WHERE updated_at > now() - make_interval(secs => $4) AND slot >= $2 AND replica_id <> $1 LIMIT $3`;
          const read = await c.query<{ account_id: string; slot: string | number; n: number }>(
            `SELECT account_id, slot, sum(count)::int AS n FROM api_rate_counts
             WHERE slot >= $2 AND replica_id <> $1 AND account_id IN (${changed})
             GROUP BY account_id, slot`,
            since === null ? [replicaId, window - 1, maxAccounts * 4] : [replicaId, window - 1, maxAccounts * 4, since],
          );
          // This replica's own expired rows, all of them (one per account it counted: a bounded
          // batch fell behind past deleteBatch × syncs per window active accounts, and the table
          // grew for good); no other replica deletes them, so no lock waits. Then a bounded batch
          // of anyone's, for the rows of replicas that are gone (they no longer grow).
          await c.query(`DELETE FROM api_rate_counts WHERE slot < $1 AND replica_id = $2`, [window - 1, replicaId]);
          await c.query(`DELETE FROM api_rate_counts WHERE ctid = ANY (ARRAY(SELECT ctid FROM api_rate_counts WHERE slot < $1 LIMIT $2))`, [window - 1, deleteBatch]);
          return read.rows;
        })();
        const timeout = new Promise<never>((_, reject) => {
          timer = setTimeout(() => reject(new Error(`rate-limit sync took over ${timeoutMs} ms`)), timeoutMs);
        });
        work.catch(() => {});
        const read = await Promise.race([work, timeout]);
        if (read) {
          lastReadAt = readStart;
          apply(read, window);
        }
        if (outage) {
          outage = false;
          degraded.set(0);
          log?.info('management API rate-limit sync with Postgres recovered');
        }
      } catch (err) {
        drop();
        failures.inc();
        // The counts go out with the next sync that works: entries are marked again, evicted
        // entries' rows (and those of entries evicted meanwhile) wait in `pending`.
        const retry = evicted;
        for (const [key, e] of written) {
          if (state.get(key) === e) e.dirty = true;
          else {
            if (e.cur > 0) retry.push({ account: key, slot: e.window, count: e.cur });
            if (e.prev > 0) retry.push({ account: key, slot: e.window - 1, count: e.prev });
          }
        }
        pending = retry.concat(pending);
        if (pending.length > maxAccounts * 2) pending = pending.slice(-maxAccounts * 2);
        lastReadAt = undefined;
        if (!outage) {
          outage = true;
          degraded.set(1);
          log?.warn({ err }, 'management API rate-limit sync with Postgres failed; replicas count on their own until it works again');
        }
      } finally {
        clearTimeout(timer);
      }
    };

    /** Takes in the other replicas' sums of the changed accounts, read at `window`. */
    const apply = (read: Array<{ account_id: string; slot: string | number; n: number }>, window: number) => {
      const sums = new Map<string, { prev: number; cur: number }>();
      for (const r of read) {
        let s = sums.get(r.account_id);
        if (!s) sums.set(r.account_id, (s = { prev: 0, cur: 0 }));
        const slot = Number(r.slot);
        if (slot >= window) s.cur += r.n;
        else if (slot === window - 1) s.prev += r.n;
      }
      for (const [key, s] of sums) {
        let e = state.get(key);
        if (!e) {
          // Accounts only other replicas have seen are kept while there is room (never evicting for them).
          if (state.size >= maxAccounts) continue;
          e = { window, prev: 0, cur: 0, dirty: false, oSlot: window, oPrev: 0, oCur: 0, touched: window };
          state.set(key, e);
        }
        e.oSlot = window;
        e.oPrev = s.prev;
        e.oCur = s.cur;
        touch(key, e, window);
      }
    };

    const once = (writeOnly = false): Promise<void> => {
      running ??= run(writeOnly).finally(() => {
        running = undefined;
      });
      return running;
    };

    const timer = setInterval(() => {
      if (!closed && !running) void once();
    }, intervalMs);
    timer.unref();
    // The first read at once: a replica that starts knows the others' counts within a moment.
    void once();

    return {
      replicaId,
      async sync() {
        // After one in flight (it may have started before the latest requests), a sync of its own.
        await running;
        if (!closed) await once();
      },
      async close() {
        if (closed) return;
        closed = true;
        clearInterval(timer);
        await running;
        await once(true);
        const c = conn;
        if (c) await Promise.race([c.end().catch(() => {}), new Promise((r) => setTimeout(r, 1_000).unref())]);
        drop();
      },
    };
  }

  return {
    check,
    sync: () => sync?.sync() ?? Promise.resolve(),
    close: () => sync?.close() ?? Promise.resolve(),
    replicaId: sync?.replicaId,
    get size() {
      return state.size;
    },
  };
}
