/**
 * `npm start`: finds or starts Postgres (and Redis), bootstraps a first account when the
 * database has none, then runs the Warren services as child processes until SIGINT/SIGTERM.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { DATA_DIR, resolveDatabase } from '../services/control-plane/src/dev/database-url.js';
import { resolveRedis } from '../services/control-plane/src/dev/redis-url.js';
import { createDb, createPool } from '../services/control-plane/src/db/pool.js';
import { migrate } from '../services/control-plane/src/db/migrate.js';
import { createAccountWithKey, createApiKeyFor } from '../services/control-plane/src/modules/accounts/accounts.service.js';
import { ensureLocalTls } from '../services/ingress/src/tls.js';
import { ensureDemo, startDemoUpstream } from './demo.js';

const say = (msg: string) => console.log(`[warren] ${msg}`);

async function main(): Promise<void> {
  const db = await resolveDatabase({ startEmbedded: true });
  say(`postgres: ${db.source === 'embedded' ? `embedded (data in ${DATA_DIR}/postgres)` : db.source === 'local' ? 'local server on 127.0.0.1:5432, database warren' : 'DATABASE_URL'}`);
  const redis = await resolveRedis();
  if ('error' in redis) say(`redis: ${redis.error}. Without Redis, rate limits are counted in memory per process and no events are delivered (no worker).`);
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
  const grpcPort = process.env.GRPC_PORT ?? '9090';
  const nodeToken = process.env.WARREN_NODE_TOKEN ?? randomBytes(24).toString('base64url');
  const tls = await ensureLocalTls(path.join(DATA_DIR, 'tls'));
  const env = { ...process.env, DATABASE_URL: db.url, WARREN_NODE_TOKEN: nodeToken, ...('error' in redis ? {} : { REDIS_URL: redis.url }) };
  const children: ChildProcess[] = [];
  /** The agents among them: stopped first, so they unbind and drain while the ingress still serves them. */
  const agents = new Set<ChildProcess>();
  let stopping = false;
  const terminate = (list: ChildProcess[]) =>
    Promise.all(list.map((c) => new Promise<void>((resolve) => {
      if (c.exitCode !== null || c.signalCode !== null) return resolve();
      c.once('exit', () => resolve());
      c.kill('SIGTERM');
    })));
  const stop = async (code = 0) => {
    if (stopping) return;
    stopping = true;
    await terminate(children.filter((c) => agents.has(c)));
    await terminate(children.filter((c) => !agents.has(c)));
    if (!('error' in redis) && redis.child) redis.child.kill('SIGTERM');
    if (db.stop) await db.stop().catch(() => {});
    process.exit(code);
  };
  /** Starts a service and resolves with its 'listening' message. */
  const run = (name: string, script: string, extraEnv: Record<string, string>, args: string[] = [], critical = true): Promise<Record<string, unknown>> => {
    const child = spawn(process.execPath, ['--import', 'tsx', script, ...args], { env: { ...env, ...extraEnv }, stdio: ['inherit', 'inherit', 'inherit', 'ipc'] });
    children.push(child);
    if (script.startsWith('services/agent/')) agents.add(child);
    return new Promise((resolve, reject) => {
      child.on('message', (m: { type?: string }) => {
        if (m?.type === 'listening') resolve(m as Record<string, unknown>);
      });
      child.on('exit', (code, signal) => {
        reject(new Error(`${name} exited (${signal ?? code})`));
        if (!stopping && !critical) say(`${name} exited (${signal ?? code})`);
        else if (!stopping) {
          say(`${name} exited (${signal ?? code}); stopping`);
          void stop(1);
        }
      });
    });
  };
  await run('control plane', 'services/control-plane/src/main.ts', { PORT: port, GRPC_PORT: grpcPort });
  const apiBase = `http://127.0.0.1:${port}`;
  say(`control plane: ${apiBase} (gRPC config push on 127.0.0.1:${grpcPort})`);

  // Two ingress nodes: public HTTP, HTTPS and agent listeners, and the internal hop listener.
  // Locally, edges answer on the plain-HTTP ports too (the default, redirect, sends them to https).
  const httpsEdgesOnHttp = process.env.HTTPS_EDGES_ON_HTTP || 'serve';
  const ingressPorts = [
    { id: 'ingress-1', http: 8000, https: 8443, agent: 4443, internal: 9100 },
    { id: 'ingress-2', http: 8001, https: 8444, agent: 4444, internal: 9101 },
  ];
  await Promise.all(
    ingressPorts.map((n) =>
      run(n.id, 'services/ingress/src/main.ts', {
        NODE_ID: n.id,
        HTTP_PORT: String(n.http),
        HTTPS_PORT: String(n.https),
        AGENT_PORT: String(n.agent),
        INTERNAL_PORT: String(n.internal),
        PUBLIC_HTTPS_PORT: '8443',
        HTTPS_EDGES_ON_HTTP: httpsEdgesOnHttp,
        CONTROL_PLANE_GRPC: `127.0.0.1:${grpcPort}`,
        STATE_DIR: path.join(DATA_DIR, 'ingress', n.id),
        TLS_CERT_FILE: path.join(DATA_DIR, 'tls', 'cert.pem'),
        TLS_KEY_FILE: path.join(DATA_DIR, 'tls', 'key.pem'),
      }),
    ),
  );
  for (const n of ingressPorts) say(`${n.id}: http://127.0.0.1:${n.http}  https://127.0.0.1:${n.https}  agents on localhost:${n.agent}  metrics http://127.0.0.1:${n.internal}/metrics`);
  if (httpsEdgesOnHttp === 'serve') say('HTTPS_EDGES_ON_HTTP=serve: edges are served over plain HTTP too, for local use (production default: redirect to https)');

  // The event delivery worker (outbox relay + BullMQ deliveries) needs Redis.
  if (!('error' in redis)) {
    const workerPort = process.env.WORKER_METRICS_PORT ?? '9200';
    await run('worker', 'services/worker/src/main.ts', { METRICS_PORT: workerPort });
    say(`worker: delivering events (metrics http://127.0.0.1:${workerPort}/metrics)`);
  }

  if (process.env.WARREN_DEMO !== '0') {
    const demo = await ensureDemo(DATA_DIR, apiBase, async () => {
      const p2 = createPool(db.url, 1);
      try {
        const d = createDb(p2);
        const { rows: first } = await p2.query<{ id: string }>('SELECT id FROM accounts WHERE NOT disabled ORDER BY id LIMIT 1');
        const key = await createApiKeyFor(d, first[0]!.id, 'npm start demo');
        if (!key) throw new Error('no account for the demo');
        return { accountId: first[0]!.id, token: key.token };
      } finally {
        await p2.end();
      }
    });
    const upstream = await startDemoUpstream();
    run('demo agent', 'services/agent/src/main.ts', {}, [
      'http', String(upstream.port), '--label', 'demo=hello', '--authtoken', demo.authtoken, '--server', `localhost:${ingressPorts[0]!.agent}`, '--ca', tls.caFile,
    ], false).catch(() => {});
    say(`demo: an agent on ingress-1 serves ${demo.hostname} (edge ${demo.edgeId}). Try, through either ingress:
      curl http://${demo.hostname}:8000/
      curl http://${demo.hostname}:8001/
      curl --cacert ${tls.caFile} https://${demo.hostname}:8443/
    (curl resolves *.localhost to 127.0.0.1; otherwise add -H 'Host: ${demo.hostname}' to http://127.0.0.1:8000/)
    The demo's API key and authtoken are in ${path.join(DATA_DIR, 'demo.json')}; WARREN_DEMO=0 turns the demo off.`);
  }

  process.on('SIGINT', () => void stop(0));
  process.on('SIGTERM', () => void stop(0));
}

main().catch((err: unknown) => {
  console.error(`[warren] could not start: ${(err as Error).message}`);
  process.exit(1);
});
