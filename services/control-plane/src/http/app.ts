import express, { type Request, type Response, type NextFunction } from 'express';
import { AppError, newId, type Logger } from '@warren/shared';
import type { Db } from '../db/pool.js';
import type { Authenticator } from '../auth/authenticate.js';
import { createAccountRateLimiter } from '../auth/rate-limit.js';
import { createQuotaCheck, type QuotaTable } from '../auth/quotas.js';
import type { Metrics } from '../metrics.js';
import { errorHandler } from './error-handler.js';
import { createApiRouter } from './router.js';
import { OpenApiRegistry } from './openapi.js';
import { registerAllModules } from '../modules/index.js';
import { createSamlRouter } from '../modules/https-edge-routes/saml.http.js';
import { createUserAgentChecks, type UserAgentChecks } from '../modules/https-edge-routes/user-agent-check.js';

export interface AppOptions {
  db: Db;
  log: Logger;
  metrics: Metrics;
  authenticator: Authenticator;
  baseUrl: string;
  rateLimitPerMinute: number;
  /**
   * Share the rate-limit counts with the other replicas through this database every `intervalMs`
   * (auth/rate-limit.ts); unset or `intervalMs` 0: this replica counts on its own.
   */
  rateLimitSync?: { databaseUrl: string; intervalMs: number };
  tcpAddrHost: string;
  /** Account quotas per resource type; empty means none. */
  quotas?: Partial<Record<QuotaTable, number>>;
  /** False while starting or draining: /readyz and API calls answer 503. */
  isReady: () => boolean;
  /**
   * The user_agent_filter cost check (worker threads, started on first use); the caller closes
   * it on shutdown. Default: one with the default limits, whose idle workers do not keep the
   * process alive.
   */
  userAgentChecks?: UserAgentChecks;
}

function checkVersion(req: Request): void {
  const a = req.headers['service-version'];
  const b = req.headers['ngrok-version'];
  if (a === undefined && b === undefined) throw new AppError(2000);
  for (const v of [a, b]) {
    if (v === undefined) continue;
    if (Array.isArray(v) || v.trim() !== '2') throw new AppError(2001, `unsupported API version ${JSON.stringify(String(v).slice(0, 16))}; send Service-Version: 2`);
  }
}

/** The express application (no listen): middleware order follows wire-conventions.md §1. */
export function createApp(opts: AppOptions): { app: express.Express; openapi: OpenApiRegistry; close: () => Promise<void> } {
  const { db, log, metrics, authenticator, baseUrl } = opts;
  const app = express();
  app.disable('x-powered-by');
  app.disable('etag');
  app.set('query parser', 'simple');

  // Operation id and metrics on every response.
  app.use((req: Request, res: Response, next: NextFunction) => {
    const opId = newId('op');
    res.locals.operationId = opId;
    res.setHeader('Warren-Operation-Id', opId);
    res.setHeader('Ngrok-Operation-Id', opId);
    const start = process.hrtime.bigint();
    res.on('finish', () => {
      const route = (req.route?.path as string | undefined) ?? 'unmatched';
      const labels = { route: req.baseUrl + route, method: req.method, status: String(res.statusCode) };
      metrics.requests.inc(labels);
      metrics.duration.observe(labels, Number(process.hrtime.bigint() - start) / 1e9);
    });
    next();
  });

  app.get('/healthz', (_req, res) => {
    res.json({ status: 'ok' });
  });
  app.get('/readyz', async (_req, res, next) => {
    try {
      if (!opts.isReady()) throw new AppError(9002);
      await db.query('SELECT 1');
      res.json({ status: 'ready' });
    } catch (err) {
      next(err instanceof AppError ? err : new AppError(9001));
    }
  });
  app.get('/metrics', async (_req, res) => {
    res.setHeader('Content-Type', metrics.registry.contentType);
    res.end(await metrics.registry.metrics());
  });

  const openapi = new OpenApiRegistry();
  let openapiDoc: string | undefined;
  app.get('/openapi.json', (_req, res) => {
    openapiDoc ??= JSON.stringify(openapi.document(baseUrl));
    res.setHeader('Content-Type', 'application/json; charset=utf-8');
    res.end(openapiDoc);
  });

  // The SAML SP endpoints of saml routes: browser-facing, outside the API (no key, no version header).
  app.use(createSamlRouter({ db, log, baseUrl }));

  // Version header, then authentication, then path and method (wire-conventions.md §1).
  app.use(async (req: Request, res: Response, next: NextFunction) => {
    try {
      if (!opts.isReady()) throw new AppError(9002);
      checkVersion(req);
      res.locals.auth = await authenticator.authenticate(req.headers.authorization);
      if (log.isLevelEnabled('debug')) log.debug({ op: res.locals.operationId, method: req.method, path: req.path, ua: req.headers['user-agent'], account: res.locals.auth.accountId }, 'request');
      next();
    } catch (err) {
      next(err);
    }
  });

  const sync = opts.rateLimitSync && opts.rateLimitSync.intervalMs > 0 ? opts.rateLimitSync : undefined;
  const rateLimiter = createAccountRateLimiter(opts.rateLimitPerMinute, {
    sync: sync && { databaseUrl: sync.databaseUrl, intervalMs: sync.intervalMs, log, registry: metrics.registry },
  });
  const { router, routes } = createApiRouter(baseUrl, rateLimiter.check, openapi);
  registerAllModules(routes, {
    db,
    authenticator,
    tcpAddrHost: opts.tcpAddrHost,
    checkQuota: createQuotaCheck(db, opts.quotas ?? {}),
    userAgentChecks: opts.userAgentChecks ?? createUserAgentChecks({ log }),
  });
  app.use(router);

  app.use((req: Request, _res: Response, next: NextFunction) => {
    next(new AppError(4000, `no such path: ${req.method} ${req.path.slice(0, 200)}`));
  });
  app.use(errorHandler(log));
  // After the requests drained: the rate-limit counts' last sync.
  return { app, openapi, close: () => rateLimiter.close() };
}
