import os from 'node:os';
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { createDb, createPool } from '../../services/control-plane/src/db/pool.js';
import { migrate } from '../../services/control-plane/src/db/migrate.js';
import { createAccountWithKey } from '../../services/control-plane/src/modules/accounts/accounts.service.js';

/** Helpers shared by the benchmarks under test/load (not part of `npm test`). */

export const ADMIN_URL = process.env.TEST_DATABASE_URL || 'postgres://postgres@127.0.0.1:5432/postgres';
export const log = (...a: unknown[]) => console.error('[bench]', ...a);

export function withDatabase(url: string, db: string): string {
  const u = new URL(url);
  u.pathname = `/${db}`;
  return u.toString();
}

const CLK_TCK = (() => {
  try {
    return Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
  } catch {
    return 100;
  }
})();

/** utime + stime of a process, in microseconds (Linux /proc). */
export function cpuMicros(pid: number): number | undefined {
  const s = cpuSplit(pid);
  return s && s.user + s.sys;
}

/** CPU time of a process split into user and kernel (system) µs, from /proc/<pid>/stat. */
export function cpuSplit(pid: number): { user: number; sys: number } | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return { user: (Number(fields[11]) * 1e6) / CLK_TCK, sys: (Number(fields[12]) * 1e6) / CLK_TCK };
  } catch {
    return undefined;
  }
}

/** The machine a result was measured on, written into every result file. */
export function machine(): Record<string, unknown> {
  const read = (p: string) => (existsSync(p) ? readFileSync(p, 'utf8').trim() : undefined);
  return {
    nproc: os.availableParallelism?.() ?? os.cpus().length,
    cpu_model: os.cpus()[0]?.model,
    governor: read('/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor') ?? 'n/a',
    kernel: `${os.type()} ${os.release()}`,
    node: process.version,
    loadavg_at_start: os.loadavg().map((x) => Math.round(x * 100) / 100),
  };
}

/** A new migrated database with one account; `drop()` removes it. */
export async function benchDatabase(tag: string): Promise<{ url: string; pool: pg.Pool; apiKey: string; accountId: string; pgVersion: string; drop: () => Promise<void> }> {
  const dbName = `warren_${tag}_${Date.now().toString(36)}_${randomBytes(3).toString('hex')}`;
  const admin = new pg.Client({ connectionString: ADMIN_URL });
  await admin.connect();
  const pgVersion = (await admin.query<{ server_version: string }>('SHOW server_version')).rows[0]!.server_version;
  await admin.query(`CREATE DATABASE ${dbName}`);
  const url = withDatabase(ADMIN_URL, dbName);
  const pool = createPool(url, 4);
  await migrate(pool);
  const acct = await createAccountWithKey(createDb(pool), tag);
  let dropped = false;
  return {
    url,
    pool,
    apiKey: acct.token,
    accountId: acct.accountId,
    pgVersion,
    drop: async () => {
      if (dropped) return;
      dropped = true;
      await pool.end().catch(() => {});
      await admin.query(`DROP DATABASE IF EXISTS ${dbName} WITH (FORCE)`).catch((e: unknown) => log('drop failed:', (e as Error).message));
      await admin.end().catch(() => {});
      log(`dropped ${dbName}`);
    },
  };
}

export function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;
}

export function fmt(n: number | undefined, d = 0): string {
  return n === undefined ? '-' : n.toLocaleString('en-US', { maximumFractionDigits: d, minimumFractionDigits: d });
}
