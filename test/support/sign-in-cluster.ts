import http from 'node:http';
import path from 'node:path';
import type { Duplex } from 'node:stream';
import { randomBytes } from 'node:crypto';
import { freshDatabase } from './databases.js';
import { startControlPlane, type ControlPlaneProcess } from './processes.js';
import { callApi, cleanupTempDirs, startAgentProcess, startIngress, tempDir, waitFor, type AgentProcess, type IngressProcess } from './cluster.js';
import { Browser } from './browser.js';
import { createDb, createPool } from '../../services/control-plane/src/db/pool.js';
import { migrate } from '../../services/control-plane/src/db/migrate.js';
import { createAccountWithKey } from '../../services/control-plane/src/modules/accounts/accounts.service.js';
import { ensureLocalTls } from '../../services/ingress/src/tls.js';

/**
 * The cluster the sign-in route modules (oidc, oauth, saml) are tested on with live traffic: a
 * fresh database with an account and its API key, local TLS for the edge's host, the identity
 * provider(s) of the test, a control plane, two ingress nodes, an upstream that echoes what it
 * got, and our agent serving it as a tunnel-group backend behind an HTTPS edge on `host:443`.
 */

/** The local TLS material (`ensureLocalTls`) with the files it was written to. */
export type LocalTls = Awaited<ReturnType<typeof ensureLocalTls>> & { dir: string; certFile: string; keyFile: string };

export interface SignInClusterOptions<P> {
  /** Names the account (`<name>-e2e`), the nodes (`<name>-a`, `<name>-b`) and the agent's label (`app=<name>`). */
  name: string;
  /** The edge's hostname; the local certificate covers it. */
  host: string;
  /** Other hostnames the local certificate covers and the browsers reach the nodes at (e.g. a Bind endpoint's). */
  moreHosts?: string[];
  /** Starts the identity provider(s), once the TLS material exists; `stop()` calls their `close()` if they have one. */
  providers: (tls: LocalTls) => Promise<P>;
  /** Ingress env besides TLS_CERT_FILE and TLS_KEY_FILE (e.g. NODE_EXTRA_CA_CERTS, provider endpoints), per node (`a`, `b`). */
  ingressEnv?: (tls: LocalTls, providers: P, node: 'a' | 'b') => Record<string, string>;
  /** Control plane env besides WARREN_NODE_TOKEN (e.g. WARREN_OIDC_ALLOW_PRIVATE). */
  controlPlaneEnv?: Record<string, string>;
  /** A Set-Cookie the upstream adds to every answer. */
  upstreamSetCookie?: string;
}

export interface SignInCluster<P> {
  host: string;
  /** `https://<host>`. */
  origin: string;
  tls: LocalTls;
  /** PEM of the CA the browsers trust. */
  ca: string;
  providers: P;
  cp: ControlPlaneProcess;
  a: IngressProcess;
  b: IngressProcess;
  /**
   * The upstream: answers `{ url, method, headers }` as JSON (with `upstreamSetCookie`); an
   * upgrade gets `101` followed by the request headers as JSON, then the connection closes.
   */
  upstream: http.Server;
  agent: AgentProcess;
  edgeId: string;
  backendId: string;
  /** The API as the account. */
  api(method: string, path: string, body?: unknown): Promise<{ status: number; body: any }>;
  /** A browser trusting the local CA whose requests to `host` reach `on()`'s HTTPS port, chosen per request (default node a). */
  browser(on?: () => IngressProcess): Browser;
  /**
   * Creates a path_prefix route to the backend with `fields` (the module's config, e.g. `{ oidc }`)
   * and waits until both nodes answer `GET <probe>` (default `match`) with ERR_WARREN_7106 (sign-in
   * required). Returns the created route.
   */
  route(match: string, fields: Record<string, unknown>, probe?: string): Promise<any>;
  /** Stops the agent, nodes and control plane, closes the upstream and provider(s), drops the database. */
  stop(): Promise<void>;
}

/** A fresh database (its own, as every test file's) with an account `<name>-e2e`: the database and the account's API key. */
export async function freshAccount(name: string): Promise<{ db: FreshDatabase; apiKey: string }> {
  const db = await freshDatabase();
  try {
    const pool = createPool(db.url, 2);
    try {
      await migrate(pool);
      return { db, apiKey: (await createAccountWithKey(createDb(pool), `${name}-e2e`)).token };
    } finally {
      await pool.end();
    }
  } catch (e) {
    await db.drop();
    throw e;
  }
}
export type FreshDatabase = Awaited<ReturnType<typeof freshDatabase>>;

/** Local TLS material in a new temp dir `warren-<name>-tls-…` (gone with `cleanupTempDirs()`); the leaf also covers `names`. */
export async function localTls(name: string, names: string[] = []): Promise<LocalTls> {
  const dir = tempDir(`warren-${name}-tls-`);
  return { ...(await ensureLocalTls(dir, names)), dir, certFile: path.join(dir, 'cert.pem'), keyFile: path.join(dir, 'key.pem') };
}

/** `start()`, or, when it fails, `stop()` (which must cope with what was started so far) and the failure. */
export async function startOrStop<T>(start: () => Promise<T>, stop: () => Promise<void>): Promise<T> {
  try {
    return await start();
  } catch (e) {
    await stop();
    throw e;
  }
}

export async function startSignInCluster<P>(o: SignInClusterOptions<P>): Promise<SignInCluster<P>> {
  const c: Partial<SignInCluster<P>> & { db?: FreshDatabase } = {};
  const stop = async (): Promise<void> => {
    await Promise.allSettled([c.agent?.stop({ timeoutMs: 10_000 }), c.a?.stop({ timeoutMs: 10_000 }), c.b?.stop({ timeoutMs: 10_000 }), c.cp?.stop({ timeoutMs: 10_000 })]);
    c.upstream?.close();
    const providers = c.providers as { close?: () => Promise<void> } | undefined;
    if (typeof providers?.close === 'function') await providers.close();
    await c.db?.drop();
    cleanupTempDirs();
  };
  return startOrStop(() => start(o, c, stop), stop);
}

async function start<P>(o: SignInClusterOptions<P>, c: Partial<SignInCluster<P>> & { db?: FreshDatabase }, stop: () => Promise<void>): Promise<SignInCluster<P>> {
  const origin = `https://${o.host}`;
  const { db, apiKey } = await freshAccount(o.name);
  c.db = db;
  const tls = await localTls(o.name, [o.host, ...(o.moreHosts ?? [])]);
  const ca = tls.caPem!;
  const providers = (c.providers = await o.providers(tls));
  const nodeToken = randomBytes(16).toString('hex');
  const cp = (c.cp = await startControlPlane({ databaseUrl: db.url, env: { ...o.controlPlaneEnv, WARREN_NODE_TOKEN: nodeToken } }));
  const env = (n: 'a' | 'b') => ({ TLS_CERT_FILE: tls.certFile, TLS_KEY_FILE: tls.keyFile, ...o.ingressEnv?.(tls, providers, n) });
  const nodes = await Promise.allSettled((['a', 'b'] as const).map((n) => startIngress({ nodeId: `${o.name}-${n}`, controlPlane: [`127.0.0.1:${cp.grpcPort}`], nodeToken, env: env(n) })));
  [c.a, c.b] = nodes.map((n) => (n.status === 'fulfilled' ? n.value : undefined));
  for (const n of nodes) if (n.status === 'rejected') throw n.reason;
  const [a, b] = [c.a!, c.b!];

  const upstream = (c.upstream = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json', ...(o.upstreamSetCookie ? { 'set-cookie': o.upstreamSetCookie } : {}) });
      res.end(JSON.stringify({ url: req.url, method: req.method, headers: req.headers }));
    });
  }));
  upstream.on('upgrade', (req: http.IncomingMessage, socket: Duplex) => {
    socket.end(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n${JSON.stringify(req.headers)}`);
  });
  const upPort = await new Promise<number>((r) => upstream.listen(0, '127.0.0.1', () => r((upstream.address() as { port: number }).port)));

  const api = (method: string, p: string, body?: unknown) => callApi(cp.baseUrl, apiKey, method, p, body);
  const hosts = new Set([o.host, ...(o.moreHosts ?? [])]);
  const browser = (on: () => IngressProcess = () => a) => new Browser({ ca, resolve: (u) => (hosts.has(u.hostname) ? { host: '127.0.0.1', port: on().https } : null) });
  const cred = await api('POST', '/credentials', {});
  const backendId = (await api('POST', '/backends/tunnel_group', { labels: { app: o.name } })).body.id;
  const edgeId = (await api('POST', '/edges/https', { hostports: [`${o.host}:443`] })).body.id;
  const agent = (c.agent = startAgentProcess(['http', String(upPort), '--label', `app=${o.name}`, '--authtoken', cred.body.token, '--server', `localhost:${a.agent}`, '--ca', tls.caFile]));
  await agent.waitForOutput('online');

  const route = async (match: string, fields: Record<string, unknown>, probe = match) => {
    const r = await api('POST', `/edges/https/${edgeId}/routes`, { match_type: 'path_prefix', match, backend: { enabled: true, backend_id: backendId }, ...fields });
    if (r.status !== 201) throw new Error(`route ${match}: ${r.status} ${JSON.stringify(r.body)}`);
    for (const n of [a, b]) {
      await waitFor(`${n.nodeId} applies ${match}`, async () => (await browser(() => n).request(`${origin}${probe}`, { headers: { accept: 'application/json' } })).headers['warren-error-code'] === 'ERR_WARREN_7106');
    }
    return r.body;
  };
  return { host: o.host, origin, tls, ca, providers, cp, a, b, upstream, agent, edgeId, backendId, api, browser, route, stop };
}
