import http from 'node:http';
import type { Duplex } from 'node:stream';
import { randomBytes } from 'node:crypto';
import { startControlPlane, type ControlPlaneProcess } from './processes.js';
import { appliedVersion, callApi, callApiExpecting, cleanupTempDirs, configHead, startAgentProcess, startIngress, waitFor, type AgentProcess, type IngressProcess } from './cluster.js';
import { freshAccount, localTls, startOrStop, type FreshDatabase, type LocalTls } from './sign-in-cluster.js';

/**
 * The cluster the traffic-policy actions and route modules are tested on with live traffic: a
 * fresh database with an account and its API key, local TLS, a control plane, one or more ingress
 * nodes, an upstream, and our agent (connected to the first node) serving it as a tunnel-group
 * backend behind an HTTPS edge on `host:443`. Requests go over plain HTTP to a node's HTTP port
 * with `Host: host`. Each cluster has its own database and node ids; Redis keys, when a test uses
 * Redis, are the test's to keep apart (`ingressEnv`) and to delete.
 */

export interface PolicyClusterOptions {
  /**
   * Names the account (`<name>-e2e`), the TLS directory, the nodes (`<name>-a`, `<name>-b`, …)
   * and the agent's label (`app=<name>`).
   */
  name: string;
  /** The edge's hostname, sent as `Host` by `request()`. */
  host: string;
  /** How many ingress nodes (default 1); the agent connects to the first. */
  nodes?: number;
  /** Control-plane env besides WARREN_NODE_TOKEN. */
  controlPlaneEnv?: Record<string, string>;
  /** A node's env besides TLS_CERT_FILE and TLS_KEY_FILE, e.g. `{ HOST: '::' }` (IPv4 and IPv6), REDIS_URL. */
  ingressEnv?: (nodeId: string, tls: LocalTls) => Record<string, string>;
  /** The upstream's request handler; by default it answers `{ url, headers }` as JSON. */
  upstream?: http.RequestListener;
  /** The upstream's `upgrade` handler; by default an upgrade is not answered. */
  upgrade?: (req: http.IncomingMessage, socket: Duplex, head: Buffer) => void;
}

/** An answer to {@link PolicyCluster.request}. */
export interface PolicyResponse {
  status: number;
  headers: http.IncomingHttpHeaders;
  raw: Buffer;
  /** `raw` as UTF-8. */
  body: string;
  json: () => any;
}

export interface PolicyRequestOptions {
  /** The node's HTTP port (default the first node's). */
  port?: number;
  /** The address to connect to (default 127.0.0.1; `::1` needs `ingressEnv` HOST `::`). */
  from?: '127.0.0.1' | '::1';
  method?: string;
  headers?: Record<string, string>;
  /** Sent as the request body; the method defaults to POST with one, GET without. */
  body?: string | Buffer;
  /** Default 10 s. */
  timeoutMs?: number;
}

export interface PolicyCluster {
  host: string;
  tls: LocalTls;
  cp: ControlPlaneProcess;
  /** The ingress nodes, in order (`<name>-a`, `<name>-b`, …). */
  nodes: IngressProcess[];
  /** The first node, the agent's. */
  a: IngressProcess;
  upstream: http.Server;
  agent: AgentProcess;
  edgeId: string;
  backendId: string;
  /** The cluster's database (e.g. to add a second account). */
  databaseUrl: string;
  /** The API as the account. */
  api(method: string, path: string, body?: unknown): Promise<{ status: number; body: any }>;
  /** {@link api} that must answer `status`: the body, or throws naming the call and the answer. */
  apiExpecting(status: number, method: string, path: string, body?: unknown): Promise<any>;
  /** A request to a node over plain HTTP with `Host: host`. */
  request(path: string, opts?: PolicyRequestOptions): Promise<PolicyResponse>;
  /** The body of a path_prefix route create to the backend with `fields` (modules, traffic_policy). */
  routeBody(match: string, fields?: Record<string, unknown>): Record<string, unknown>;
  /**
   * Creates a path_prefix route to the backend with `fields` and waits until every node has applied
   * it (`GET <match>/probe-<random>` no longer answers ERR_WARREN_7001, "no route"). `match` must not
   * be a prefix of another route's (the probe would hit that one). Returns the created route.
   */
  route(match: string, fields: Record<string, unknown>): Promise<any>;
  /** {@link route} with `traffic_policy` (a string as is, anything else as JSON) and any modules; returns the route's id. */
  policyRoute(match: string, policy: unknown, modules?: Record<string, unknown>): Promise<string>;
  /**
   * Creates an agent credential (`body` as the API takes it) and waits until every node has applied
   * the change, so that an agent may authenticate with its token on any node at once. Returns it.
   */
  credential(body?: Record<string, unknown>): Promise<any>;
  /** Tries to create a route (`/bad-<random>`) with `policy`, for a test that expects a refusal: the API's answer. */
  tryPolicy(policy: unknown): Promise<{ status: number; body: any }>;
  /** Stops the agent, nodes and control plane, closes the upstream, drops the database. */
  stop(): Promise<void>;
}

const policyValue = (policy: unknown) => ({ value: typeof policy === 'string' ? policy : JSON.stringify(policy) });
const hex = (n: number) => randomBytes(n).toString('hex');

/** The default upstream: answers `{ url, headers }` as JSON once the request body is read. */
export const echoUrlAndHeaders: http.RequestListener = (req, res) => {
  req.resume();
  req.on('end', () => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ url: req.url, headers: req.headers }));
  });
};

export async function startPolicyCluster(o: PolicyClusterOptions): Promise<PolicyCluster> {
  const c: Partial<PolicyCluster> & { db?: FreshDatabase; started?: (IngressProcess | undefined)[] } = {};
  const stop = async (): Promise<void> => {
    await Promise.allSettled([c.agent, ...(c.started ?? []), c.cp].map((p) => p?.stop({ timeoutMs: 10_000 })));
    c.upstream?.close();
    await c.db?.drop();
    cleanupTempDirs();
  };
  return startOrStop(() => start(o, c, stop), stop);
}

async function start(o: PolicyClusterOptions, c: Partial<PolicyCluster> & { db?: FreshDatabase; started?: (IngressProcess | undefined)[] }, stop: () => Promise<void>): Promise<PolicyCluster> {
  const { db, apiKey } = await freshAccount(o.name);
  c.db = db;
  const tls = await localTls(o.name);
  const nodeToken = hex(16);
  const cp = (c.cp = await startControlPlane({ databaseUrl: db.url, env: { ...o.controlPlaneEnv, WARREN_NODE_TOKEN: nodeToken } }));
  const ids = Array.from({ length: o.nodes ?? 1 }, (_, i) => `${o.name}-${String.fromCharCode(97 + i)}`);
  const started = await Promise.allSettled(
    ids.map((nodeId) => startIngress({ nodeId, controlPlane: [`127.0.0.1:${cp.grpcPort}`], nodeToken, env: { TLS_CERT_FILE: tls.certFile, TLS_KEY_FILE: tls.keyFile, ...o.ingressEnv?.(nodeId, tls) } })),
  );
  c.started = started.map((n) => (n.status === 'fulfilled' ? n.value : undefined));
  for (const n of started) if (n.status === 'rejected') throw n.reason;
  const nodes = c.started as IngressProcess[];
  const a = nodes[0]!;

  const upstream = (c.upstream = http.createServer(o.upstream ?? echoUrlAndHeaders));
  if (o.upgrade) upstream.on('upgrade', o.upgrade);
  const upPort = await new Promise<number>((r) => upstream.listen(0, '127.0.0.1', () => r((upstream.address() as { port: number }).port)));

  const api = (method: string, p: string, body?: unknown) => callApi(cp.baseUrl, apiKey, method, p, body);
  const apiExpecting = (status: number, method: string, p: string, body?: unknown) => callApiExpecting(cp.baseUrl, apiKey, status, method, p, body);
  const cred = await apiExpecting(201, 'POST', '/credentials', {});
  const backendId: string = (await apiExpecting(201, 'POST', '/backends/tunnel_group', { labels: { app: o.name } })).id;
  const edgeId: string = (await apiExpecting(201, 'POST', '/edges/https', { hostports: [`${o.host}:443`] })).id;
  const agent = (c.agent = startAgentProcess(['http', String(upPort), '--label', `app=${o.name}`, '--authtoken', cred.token, '--server', `localhost:${a.agent}`, '--ca', tls.caFile]));
  await agent.waitForOutput('online');

  const request = (p: string, opts: PolicyRequestOptions = {}): Promise<PolicyResponse> =>
    new Promise((resolve, reject) => {
      const method = opts.method ?? (opts.body === undefined ? 'GET' : 'POST');
      const req = http.request({ host: opts.from ?? '127.0.0.1', port: opts.port ?? a.http, path: p, method, agent: false, headers: { host: o.host, ...opts.headers } }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (ch: Buffer) => chunks.push(ch));
        res.on('end', () => {
          const raw = Buffer.concat(chunks);
          resolve({ status: res.statusCode ?? 0, headers: res.headers, raw, body: raw.toString('utf8'), json: () => JSON.parse(raw.toString()) });
        });
      });
      req.setTimeout(opts.timeoutMs ?? 10_000, () => req.destroy(new Error('timed out')));
      req.on('error', reject);
      req.end(opts.body);
    });
  const routeBody = (match: string, fields: Record<string, unknown> = {}) => ({ match_type: 'path_prefix', match, backend: { enabled: true, backend_id: backendId }, ...fields });
  /** The config version a node has applied (its internal /status). */
  const route = async (match: string, fields: Record<string, unknown>) => {
    const r = await api('POST', `/edges/https/${edgeId}/routes`, routeBody(match, fields));
    if (r.status !== 201) throw new Error(`route ${match}: ${r.status} ${JSON.stringify(r.body)}`);
    // The version first: a probe alone cannot tell the new route from an older route whose prefix
    // its match extends (`/no-ua` answers `/no-ua-ok/…` until `/no-ua-ok` applies).
    await applied(`the version with ${match}`);
    for (const n of nodes) {
      await waitFor(`${n.nodeId} applies ${match}`, async () => (await request(`${match}/probe-${hex(2)}`, { port: n.http, headers: { 'user-agent': 'probe' } })).headers['warren-error-code'] !== 'ERR_WARREN_7001');
    }
    return r.body;
  };
  /** Waits until every node has applied the database's head version (read now, after the change). */
  const applied = async (what: string) => {
    const head = await configHead(db.url);
    for (const n of nodes) await waitFor(`${n.nodeId} applies ${what} (version ${head})`, async () => (await appliedVersion(n)) >= head);
  };
  const credential = async (body: Record<string, unknown> = {}) => {
    const r = await apiExpecting(201, 'POST', '/credentials', body);
    await applied(`credential ${r.id as string}`);
    return r;
  };
  const policyRoute = async (match: string, policy: unknown, modules: Record<string, unknown> = {}) => (await route(match, { traffic_policy: policyValue(policy), ...modules })).id as string;
  const tryPolicy = (policy: unknown) => api('POST', `/edges/https/${edgeId}/routes`, routeBody(`/bad-${hex(3)}`, { traffic_policy: policyValue(policy) }));
  return { host: o.host, tls, cp, nodes, a, upstream, agent, edgeId, backendId, databaseUrl: db.url, api, apiExpecting, request, routeBody, route, credential, policyRoute, tryPolicy, stop };
}
