/**
 * `npm start`: finds or starts Postgres (and Redis), bootstraps a first account when the
 * database has none, then runs the Warren services as child processes until SIGINT/SIGTERM.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { DATA_DIR, resolveDatabase } from '../services/control-plane/src/dev/database-url.js';
import { resolveRedis } from '../services/control-plane/src/dev/redis-url.js';
import { createDb, createPool } from '../services/control-plane/src/db/pool.js';
import { migrate } from '../services/control-plane/src/db/migrate.js';
import { createAccountWithKey } from '../services/control-plane/src/modules/accounts/accounts.service.js';

const say = (msg: string) => console.log(`[warren] ${msg}`);

async function main(): Promise<void> {
  const db = await resolveDatabase({ startEmbedded: true });
  say(`postgres: ${db.source === 'embedded' ? `embedded (data in ${DATA_DIR}/postgres)` : db.source === 'local' ? 'local server on 127.0.0.1:5432, database warren' : 'DATABASE_URL'}`);
  const redis = await resolveRedis();
  if ('error' in redis) say(`redis: ${redis.error}. (Nothing needs Redis yet; the ingress and worker will.)`);
  else say(`redis: ${redis.source === 'spawned' ? `redis-server started on ${redis.url}` : redis.url}`);

  const pool = createPool(db.url, 2);
  await migrate(pool);
  const { rows } = await pool.query<{ n: number }>('SELECT count(*)::int AS n FROM accounts');
  if (rows[0]!.n === 0) {
    const acct = await createAccountWithKey(createDb(pool), 'default', 'first key, created by npm start');
    say(`created account ${acct.accountId}; its API key (shown once, keep it):\n\n    ${acct.token}\n`);
  }
  await pool.end();

  const port = process.env.PORT ?? '8080';
  const env = { ...process.env, DATABASE_URL: db.url, PORT: port, ...('error' in redis ? {} : { REDIS_URL: redis.url }) };
  const children: ChildProcess[] = [];
  const run = (name: string, script: string) => {
    const child = spawn(process.execPath, ['--import', 'tsx', script], { env, stdio: 'inherit' });
    child.on('exit', (code, signal) => {
      if (!stopping) {
        say(`${name} exited (${signal ?? code}); stopping`);
        void stop(1);
      }
    });
    children.push(child);
  };
  run('control plane', 'services/control-plane/src/main.ts');
  say(`control plane: http://127.0.0.1:${port} (try: curl -H "Authorization: Bearer <key>" -H "Service-Version: 2" http://127.0.0.1:${port}/reserved_addrs)`);

  let stopping = false;
  const stop = async (code = 0) => {
    if (stopping) return;
    stopping = true;
    await Promise.all(children.map((c) => new Promise<void>((resolve) => {
      if (c.exitCode !== null || c.signalCode !== null) return resolve();
      c.once('exit', () => resolve());
      c.kill('SIGTERM');
    })));
    if (!('error' in redis) && redis.child) redis.child.kill('SIGTERM');
    if (db.stop) await db.stop().catch(() => {});
    process.exit(code);
  };
  process.on('SIGINT', () => void stop(0));
  process.on('SIGTERM', () => void stop(0));
}

main().catch((err: unknown) => {
  console.error(`[warren] could not start: ${(err as Error).message}`);
  process.exit(1);
});
