import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { createLogger } from '@warren/shared';
import { freshDatabase } from './databases.js';
import { createDb, createPool, type Db } from '../../services/control-plane/src/db/pool.js';
import { createAuthenticator } from '../../services/control-plane/src/auth/authenticate.js';
import { createMetrics } from '../../services/control-plane/src/metrics.js';
import { createApp } from '../../services/control-plane/src/http/app.js';
import type { QuotaTable } from '../../services/control-plane/src/auth/quotas.js';
import { createAccountWithKey } from '../../services/control-plane/src/modules/accounts/accounts.service.js';

export interface ApiResult<T = any> {
  status: number;
  body: T;
  headers: Headers;
}

export interface Account {
  accountId: string;
  apiKeyId: string;
  token: string;
  /** Calls the API as this account with the version header and JSON body. */
  call<T = any>(method: string, path: string, body?: unknown, headers?: Record<string, string>): Promise<ApiResult<T>>;
}

export interface TestApi {
  baseUrl: string;
  db: Db;
  /** A new account with its first API key. */
  account(name?: string): Promise<Account>;
  /** A raw request with no default headers. */
  raw(method: string, path: string, init?: { headers?: Record<string, string>; body?: string }): Promise<ApiResult>;
  close(): Promise<void>;
}

/**
 * The control plane's real express app on a real Postgres (a database cloned for this file),
 * listening on 127.0.0.1:0. `rateLimitPerMinute` defaults to off so tests are not throttled.
 */
export async function startTestApi(opts: { rateLimitPerMinute?: number; quotas?: Partial<Record<QuotaTable, number>> } = {}): Promise<TestApi> {
  const database = await freshDatabase();
  const pool = createPool(database.url, 10);
  const db = createDb(pool);
  const server = http.createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const { app } = createApp({
    db,
    log: createLogger('control-plane-test', 'silent'),
    metrics: createMetrics(pool),
    authenticator: createAuthenticator(db),
    baseUrl,
    rateLimitPerMinute: opts.rateLimitPerMinute ?? 0,
    tcpAddrHost: 'tcp.test.localhost',
    quotas: opts.quotas,
    isReady: () => true,
  });
  server.on('request', app);

  const raw = async (method: string, path: string, init: { headers?: Record<string, string>; body?: string | Uint8Array } = {}): Promise<ApiResult> => {
    const res = await fetch(baseUrl + path, { method, headers: init.headers, body: init.body });
    const text = await res.text();
    let body: unknown = text;
    try {
      body = text ? JSON.parse(text) : undefined;
    } catch {
      /* not JSON */
    }
    return { status: res.status, body, headers: res.headers };
  };

  return {
    baseUrl,
    db,
    raw,
    async account(name = 'test') {
      const acct = await createAccountWithKey(db, name);
      return {
        ...acct,
        call: (method, path, body, headers = {}) =>
          raw(method, path, {
            headers: { Authorization: `Bearer ${acct.token}`, 'Service-Version': '2', ...(body !== undefined ? { 'Content-Type': 'application/json' } : {}), ...headers },
            body: body === undefined ? undefined : typeof body === 'string' || body instanceof Uint8Array ? body : JSON.stringify(body),
          }),
      };
    },
    async close() {
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
      await pool.end();
      await database.drop();
    },
  };
}

/**
 * Follows `next_page_uri` from `first` until it is null, as the Go client does, checking that
 * every page answers 200 with items. Returns the items in order, their ids, the page count and
 * each next_page_uri seen.
 */
export async function walkPages<T extends { id: string } = { id: string }>(
  acct: Account,
  baseUrl: string,
  first: string,
  key: string,
): Promise<{ items: T[]; ids: string[]; pages: number; nextUris: string[] }> {
  const items: T[] = [];
  const nextUris: string[] = [];
  let next: string | null = first;
  let pages = 0;
  while (next) {
    const r: ApiResult = await acct.call('GET', next.replace(baseUrl, ''));
    if (r.status !== 200) throw new Error(`GET ${next}: ${r.status} ${JSON.stringify(r.body)}`);
    const page = r.body[key] as T[];
    if (page.length === 0) throw new Error(`GET ${next}: an empty page`);
    items.push(...page);
    next = r.body.next_page_uri;
    if (next) nextUris.push(next);
    pages++;
  }
  return { items, ids: items.map((i) => i.id), pages, nextUris };
}

/** Another account's GET, PATCH and DELETE of `path` all answer 404 ERR_WARREN_4001. */
export async function expectHiddenFrom(other: Account, path: string): Promise<void> {
  for (const [method, body] of [['GET'], ['PATCH', { description: 'x' }], ['DELETE']] as const) {
    const r = await other.call(method, path, body);
    if (r.status !== 404 || r.body?.error_code !== 'ERR_WARREN_4001') throw new Error(`${method} ${path} as another account: ${r.status} ${JSON.stringify(r.body)}`);
  }
}
