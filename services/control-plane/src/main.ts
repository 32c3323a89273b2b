import http from 'node:http';
import https from 'node:https';
import { readFileSync } from 'node:fs';
import { createLogger, EnvError, stopWithParent } from '@warren/shared';
import { loadConfig } from './config.js';
import { createDb, createPool } from './db/pool.js';
import { migrate } from './db/migrate.js';
import { createAuthenticator } from './auth/authenticate.js';
import { createMetrics } from './metrics.js';
import { createApp } from './http/app.js';
import { startConfigPush } from './config-push/index.js';
import { createUserAgentChecks } from './modules/https-edge-routes/user-agent-check.js';

const log = createLogger('control-plane');
const DEFAULT_GRPC_PORT = 9090;

/** Composition root: env → pool → migrations → app → listen; graceful stop on SIGTERM/SIGINT. */
async function main(): Promise<void> {
  const config = loadConfig();
  const pool = createPool(config.DATABASE_URL, config.PG_POOL_MAX);
  const applied = await migrate(pool);
  if (applied.length) log.info({ applied }, 'migrations applied');
  const db = createDb(pool);
  let ready = true;
  const server =
    config.TLS_CERT_FILE && config.TLS_KEY_FILE
      ? https.createServer({ cert: readFileSync(config.TLS_CERT_FILE), key: readFileSync(config.TLS_KEY_FILE) })
      : http.createServer();
  server.keepAliveTimeout = 65_000;
  server.headersTimeout = 66_000;
  server.requestTimeout = 30_000;
  // Listen first: with PORT=0 the default base URL needs the port the kernel picked.
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(config.PORT, config.HOST, resolve);
  });
  const addr = server.address();
  const port = typeof addr === 'object' && addr ? addr.port : config.PORT;
  const baseUrl = config.PUBLIC_BASE_URL ?? `${config.TLS_CERT_FILE ? 'https' : 'http'}://${config.HOST}:${port}`;
  const metrics = createMetrics(pool);
  const userAgentChecks = createUserAgentChecks({
    timeoutMs: config.USER_AGENT_CHECK_TIMEOUT_MS,
    workers: config.USER_AGENT_CHECK_WORKERS,
    maxQueued: config.USER_AGENT_CHECK_QUEUE,
    log,
  });
  const { app, close: closeApp } = createApp({
    db,
    log,
    metrics,
    authenticator: createAuthenticator(db),
    baseUrl,
    rateLimitPerMinute: config.API_RATE_LIMIT_PER_MINUTE,
    rateLimitSync: { databaseUrl: config.DATABASE_URL, intervalMs: config.API_RATE_LIMIT_SYNC_MS },
    tcpAddrHost: config.TCP_ADDR_HOST,
    quotas: config.ACCOUNT_QUOTAS,
    isReady: () => ready,
    userAgentChecks,
  });
  server.on('request', app);
  // Config push to ingress nodes (gRPC) and tunnel presence; LISTENs on its own connection.
  const configPush = await startConfigPush({
    db,
    databaseUrl: config.DATABASE_URL,
    log,
    registry: metrics.registry,
    baseUrl,
    grpc: {
      host: config.GRPC_HOST ?? config.HOST,
      port: config.GRPC_PORT ?? DEFAULT_GRPC_PORT,
      // Only the default may move (several local processes with default settings, e.g. tests).
      fallbackToFreePort: config.GRPC_PORT === undefined,
      token: config.WARREN_NODE_TOKEN,
      tls: config.GRPC_TLS_CERT_FILE && config.GRPC_TLS_KEY_FILE ? { certFile: config.GRPC_TLS_CERT_FILE, keyFile: config.GRPC_TLS_KEY_FILE, clientCaFile: config.GRPC_TLS_CLIENT_CA_FILE } : undefined,
    },
    leaseMs: config.TUNNEL_LEASE_MS,
    keepaliveIntervalMs: config.NODE_KEEPALIVE_INTERVAL_MS,
    sweepIntervalMs: config.TUNNEL_SWEEP_INTERVAL_MS,
  });
  const grpcPort = configPush.port;
  log.info({ port, grpc_port: grpcPort, base_url: baseUrl }, 'control plane listening');
  // Tests and the launcher read this line to find the ports when PORT=0 / GRPC_PORT=0.
  if (process.send) process.send({ type: 'listening', port, grpcPort });

  let stopping = false;
  const stop = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    ready = false;
    log.info({ signal }, 'draining');
    const force = setTimeout(() => {
      log.warn('drain timed out; closing remaining connections');
      server.closeAllConnections();
    }, 10_000);
    force.unref();
    server.close();
    server.closeIdleConnections();
    // Node streams end at once (nodes reconnect to another replica), while HTTP requests drain.
    await Promise.all([new Promise<void>((resolve) => server.once('close', () => resolve())), configPush.stop(5_000)]);
    // After the requests drained (a save waiting on a check finishes first): the check workers.
    await userAgentChecks.close();
    await closeApp();
    await pool.end();
    log.info('stopped');
    process.exit(0);
  };
  process.on('SIGTERM', () => void stop('SIGTERM'));
  process.on('SIGINT', () => void stop('SIGINT'));
  stopWithParent(() => void stop('parent gone'));
}

main().catch((err: unknown) => {
  if (err instanceof EnvError) console.error(`warren control plane: ${err.message}`);
  else log.fatal({ err }, 'failed to start');
  process.exit(1);
});
