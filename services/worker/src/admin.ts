import { realpathSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { Redis } from 'ioredis';
import { z } from 'zod';
import { DEFAULT_EVENT_PREFIX, EVENT_TARGET_KINDS, EnvError, parseEnv, type EventTargetKind } from '@warren/shared';
import { EventProducer } from '../../shared/src/events/producer.js';
import { DeadLetters, envelopeText } from './dead-letters.js';

/**
 * Dead-letter administration (event-delivery.md §2.5):
 *
 *   events-admin list [--destination ed_…] [--limit N]
 *   events-admin replay <id>
 *   events-admin replay --destination ed_…
 *
 * `replay` pushes the stored envelopes back into the destination's buffer (through the
 * EventProducer, so a flush job follows) and deletes the rows in the same transaction: a failed
 * push keeps them. Env: DATABASE_URL, REDIS_URL, EVENTS_PREFIX (default warren).
 */

export const USAGE = `usage:
  events-admin list [--destination ed_…] [--limit N]
  events-admin replay <dead-letter id>
  events-admin replay --destination ed_…`;

export class UsageError extends Error {}

export interface AdminDeps {
  pool: pg.Pool;
  producer: Pick<EventProducer, 'publish'>;
  out: (line: string) => void;
}

function flag(args: string[], name: string): string | undefined {
  const i = args.indexOf(name);
  if (i < 0) return undefined;
  const v = args[i + 1];
  if (!v || v.startsWith('--')) throw new UsageError(`${name} needs a value`);
  args.splice(i, 2);
  return v;
}

/** Runs one admin command; returns the process exit code. */
export async function runAdmin(argv: string[], deps: AdminDeps): Promise<number> {
  const args = [...argv];
  const cmd = args.shift();
  const dl = new DeadLetters(deps.pool);
  if (cmd === 'list') {
    const destinationId = flag(args, '--destination');
    const limitText = flag(args, '--limit');
    if (args.length) throw new UsageError(`unexpected ${args.join(' ')}`);
    const limit = limitText === undefined ? 100 : Number(limitText);
    if (!Number.isInteger(limit) || limit < 1) throw new UsageError('--limit must be a positive integer');
    const rows = await dl.list({ destinationId, limit });
    for (const r of rows) {
      deps.out(
        JSON.stringify({
          id: r.id,
          destination_id: r.destination_id,
          account_id: r.account_id,
          reason: r.reason,
          events: r.events,
          event_ids: r.event_ids.length > 5 ? [...r.event_ids.slice(0, 5), `…${r.event_ids.length - 5} more`] : r.event_ids,
          first_attempt_at: r.first_attempt_at,
          last_attempt_at: r.last_attempt_at,
          created_at: r.created_at,
        }),
      );
    }
    if (!rows.length) deps.out('no dead letters');
    return 0;
  }
  if (cmd === 'replay') {
    const destinationId = flag(args, '--destination');
    let which: { id: number } | { destinationId: string };
    if (destinationId) {
      if (args.length) throw new UsageError(`unexpected ${args.join(' ')}`);
      which = { destinationId };
    } else {
      if (args.length !== 1 || !/^\d+$/.test(args[0]!)) throw new UsageError('replay needs a dead-letter id or --destination ed_…');
      which = { id: Number(args[0]) };
    }
    const result = await dl.take(which, async (rows) => {
      if (!rows.length) return { rows: 0, events: 0 };
      const destIds = [...new Set(rows.map((r) => r.destination_id))];
      const { rows: dests } = await deps.pool.query<{ id: string; target_kind: string }>('SELECT id, target_kind FROM event_destinations WHERE id = ANY($1::text[])', [destIds]);
      const kinds = new Map(dests.map((d) => [d.id, d.target_kind]));
      for (const id of destIds) {
        const k = kinds.get(id);
        if (!k) throw new Error(`destination ${id} no longer exists; nothing replayed`);
        if (!(EVENT_TARGET_KINDS as readonly string[]).includes(k)) throw new Error(`destination ${id} has an unknown target kind ${k}`);
      }
      let events = 0;
      for (const r of rows) {
        const envelopes = (Array.isArray(r.payload) ? r.payload : []).map(envelopeText);
        events += envelopes.length;
        const res = await deps.producer.publish([{ dest: { id: r.destination_id, kind: kinds.get(r.destination_id) as EventTargetKind }, events: envelopes }]);
        if (res.overflowed) throw new Error(`the buffer of ${r.destination_id} is full (${res.overflowed} events refused); nothing deleted, try again later`);
      }
      return { rows: rows.length, events };
    });
    if (!result.rows) {
      deps.out('no matching dead letters');
      return 1;
    }
    deps.out(`replayed ${result.events} events from ${result.rows} dead letters`);
    return 0;
  }
  throw new UsageError(cmd ? `unknown command ${cmd}` : 'missing command');
}

async function main(): Promise<number> {
  const env = parseEnv({
    DATABASE_URL: z.string().min(1),
    REDIS_URL: z.string().min(1),
    EVENTS_PREFIX: z.string().default(DEFAULT_EVENT_PREFIX),
  });
  pg.types.setTypeParser(20, (v) => Number(v));
  const pool = new pg.Pool({ connectionString: env.DATABASE_URL, max: 2, application_name: 'warren-events-admin' });
  const redis = new Redis(env.REDIS_URL, { enableOfflineQueue: false, maxRetriesPerRequest: 1, lazyConnect: true, retryStrategy: () => null });
  redis.on('error', () => {});
  const producer = new EventProducer({ connection: redis, prefix: env.EVENTS_PREFIX });
  try {
    if (process.argv[2] === 'replay') await redis.connect();
    return await runAdmin(process.argv.slice(2), { pool, producer, out: (l) => console.log(l) });
  } finally {
    await producer.close();
    redis.disconnect();
    await pool.end();
  }
}

const isMain = (() => {
  try {
    return process.argv[1] !== undefined && realpathSync(process.argv[1]) === realpathSync(fileURLToPath(import.meta.url));
  } catch {
    return false;
  }
})();

if (isMain) {
  main().then(
    (code) => process.exit(code),
    (err: unknown) => {
      if (err instanceof UsageError) console.error(`events-admin: ${err.message}\n${USAGE}`);
      else if (err instanceof EnvError) console.error(`events-admin: ${err.message}`);
      else console.error(`events-admin: ${(err as Error).message ?? String(err)}`);
      process.exit(2);
    },
  );
}
