import http from 'node:http';
import pg from 'pg';
import { createLogger, EnvError, stopWithParent } from '@warren/shared';
import { migrate } from '../../control-plane/src/db/migrate.js';
import { loadConfig } from './config.js';
import { createWorkerMetrics } from './metrics.js';
import { OutboxRelay } from './relay/index.js';
import { DeliveryService } from './service.js';
import { createTarget } from './targets/index.js';

const log = createLogger('worker');

// bigint (int8) columns come back as numbers (dead-letter ids stay far below 2^53).
pg.types.setTypeParser(20, (v) => Number(v));

/** A one-line reason for start-up failures (env, Postgres or Redis unreachable): no stack trace. */
function oneLine(err: unknown): string | undefined {
  if (err instanceof EnvError) return err.message;
  const e = err as { code?: string; message?: string; errors?: unknown[] };
  if (Array.isArray(e.errors) && e.errors.length) return oneLine(e.errors[0]);
  if (e?.code && /^(ECONNREFUSED|ENOTFOUND|EAI_AGAIN|ETIMEDOUT|ECONNRESET|EHOSTUNREACH|28P01|28000|3D000|57P03)$/.test(e.code)) return `${e.code}: ${e.message ?? ''}`.trim();
  if (e?.message && /connect|Connection is closed|getaddrinfo|timeout expired|password authentication|does not exist/i.test(e.message)) return e.message;
  return undefined;
}

/** Composition root: env → Postgres (migrations) → Redis → workers, relay, metrics; SIGTERM drains. */
async function main(): Promise<void> {
  const config = loadConfig();
  const pool = new pg.Pool({ connectionString: config.DATABASE_URL, max: config.PG_POOL_MAX, idleTimeoutMillis: 30_000, connectionTimeoutMillis: 5_000, application_name: 'warren-worker' });
  pool.on('error', () => {});
  const applied = await migrate(pool);
  if (applied.length) log.info({ applied }, 'migrations applied');
  const metrics = createWorkerMetrics();
  const service = await DeliveryService.start({
    pool,
    redisUrl: config.REDIS_URL,
    prefix: config.EVENTS_PREFIX,
    lingerMs: config.EVENTS_LINGER_MS,
    concurrency: config.WORKER_CONCURRENCY,
    retryScheduleMs: config.retryScheduleMs,
    pauseProbeMs: config.PAUSE_PROBE_MS,
    autoPauseAfterMs: config.AUTO_PAUSE_AFTER_MS,
    destCacheMs: config.DEST_CACHE_MS,
    sweepIntervalMs: config.SWEEP_INTERVAL_MS,
    maxBatchesPerJob: config.MAX_BATCHES_PER_JOB,
    lockDurationMs: config.LOCK_DURATION_MS,
    stalledIntervalMs: config.STALLED_INTERVAL_MS,
    targetEnv: {
      awsEndpoint: config.AWS_ENDPOINT_URL,
      datadogBaseUrl: config.DATADOG_BASE_URL,
      azureAuthorityHost: config.AZURE_AUTHORITY_HOST,
      caPem: config.caPem,
      awsBaseCredentials: config.WARREN_AWS_ACCESS_KEY_ID
        ? { accessKeyId: config.WARREN_AWS_ACCESS_KEY_ID, secretAccessKey: config.WARREN_AWS_SECRET_ACCESS_KEY!, sessionToken: config.WARREN_AWS_SESSION_TOKEN }
        : undefined,
      requestTimeoutMs: config.REQUEST_TIMEOUT_MS,
    },
    createTarget,
    log,
    metrics,
  });
  const relay = new OutboxRelay({
    pool,
    databaseUrl: config.DATABASE_URL,
    producer: service.producer,
    log,
    registry: metrics.registry,
    onDestinationChanged: (destId, deleted) => service.onDestinationChanged(destId, deleted),
  });
  await relay.start();

  let ready = true;
  const server = http.createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    if (req.method === 'GET' && path === '/metrics') {
      metrics.registry
        .metrics()
        .then((text) => {
          res.writeHead(200, { 'content-type': metrics.registry.contentType });
          res.end(text);
        })
        .catch((err: unknown) => {
          res.writeHead(500, { 'content-type': 'text/plain' });
          res.end(String((err as Error).message));
        });
      return;
    }
    if (req.method === 'GET' && path === '/healthz') {
      res.writeHead(ready ? 200 : 503, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ status: ready ? 'ok' : 'stopping' }));
      return;
    }
    res.writeHead(404, { 'content-type': 'text/plain' });
    res.end('not found');
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(config.METRICS_PORT, config.METRICS_HOST, resolve);
  });
  const addr = server.address();
  const metricsPort = typeof addr === 'object' && addr ? addr.port : config.METRICS_PORT;
  log.info({ metrics_port: metricsPort, prefix: config.EVENTS_PREFIX, concurrency: config.WORKER_CONCURRENCY }, 'event worker running');
  if (process.send) process.send({ type: 'listening', metricsPort });

  let stopping = false;
  const stop = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    ready = false;
    log.info({ signal }, 'draining');
    // Last resort: never hang past the drain limit (plus a little for the connections).
    const force = setTimeout(() => {
      log.warn('forced exit after the shutdown timeout');
      process.exit(1);
    }, config.SHUTDOWN_TIMEOUT_MS + 5_000);
    force.unref();
    await relay.stop().catch((err: unknown) => log.warn({ err: (err as Error).message }, 'relay stop failed'));
    await service.stop(config.SHUTDOWN_TIMEOUT_MS);
    server.close();
    await pool.end().catch(() => {});
    log.info('stopped');
    process.exit(0);
  };
  process.on('SIGTERM', () => void stop('SIGTERM'));
  process.on('SIGINT', () => void stop('SIGINT'));
  stopWithParent(() => void stop('parent gone'));
}

main().catch((err: unknown) => {
  const line = oneLine(err);
  if (line) console.error(`warren worker: ${line}`);
  else log.fatal({ err }, 'failed to start');
  process.exit(1);
});
