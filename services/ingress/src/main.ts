import http from 'node:http';
import https from 'node:https';
import type net from 'node:net';
import { createHash, X509Certificate } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { EnvError, createLogger, stopWithParent, type DataPlaneConfig, type DpTunnel } from '@warren/shared';
import { AgentServer, type AgentIdentity, type BindRequest } from './agents/server.js';
import { ControlPlaneClient } from './config/index.js';
import { loadIngressEnv } from './env.js';
import { createIngressMetrics } from './metrics.js';
import { createInternalServer } from './http/internal.js';
import { Forwarder } from './http/proxy.js';
import { PublicHandler } from './http/public.js';
import { answerClientError, sendUpgradeError } from './http/error-page.js';
import { RoutingTable } from './http/routing.js';
import { loadTls } from './tls.js';
import { TunnelRegistry } from './tunnels/registry.js';
import { BodyBudget, createPipelineCompiler } from './pipeline/runner.js';
import type { RateLimiter } from './pipeline/types.js';
import { edgeSecureContextOptions, mutualTlsCaPems, mutualTlsStage, pipelineStageFactories } from './modules/index.js';
import { createSecureContext, type SecureContext, type TLSSocket } from 'node:tls';
import { LocalSlidingWindowLimiter, RedisSlidingWindowLimiter } from './ratelimit/index.js';
import { createTrafficEvents } from './events/index.js';
import { startGeo } from './policy/geo.js';
import { setServerRegion, stampConnection } from './http/conn-facts.js';
import { captureClientHello } from './http/client-hello.js';
import { clearChainVerifyErrors } from './http/tls-error-queue.js';
import { compileEndpointPolicy, recompileEndpointPolicies, type EndpointPolicy } from './policy/endpoint.js';
import { FIND_REPLACE_PROCESS_LIMITS } from './policy/find-replace.js';

const log = createLogger('ingress');

function listen(server: net.Server, port: number, host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve((server.address() as net.AddressInfo).port);
    });
  });
}

/** `app.test:443` → `app.test` (hostports are stored lower-case). */
function hostOfHostport(hp: string): string {
  return hp.slice(0, hp.lastIndexOf(':')).toLowerCase();
}

function isLoopback(host: string): boolean {
  return host === 'localhost' || host === '::1' || host.startsWith('127.');
}

/**
 * Composition root of an ingress node: config from the control plane (or from disk), the agent
 * listener, the public HTTP and HTTPS listeners and the internal listener; graceful stop on SIGTERM.
 */
async function main(): Promise<void> {
  const env = loadIngressEnv();
  if (!env.WARREN_NODE_TOKEN && !isLoopback(env.INTERNAL_HOST)) {
    throw new EnvError(`INTERNAL_HOST=${env.INTERNAL_HOST} is not a loopback address: set WARREN_NODE_TOKEN, or other hosts could send requests into this node's tunnels`);
  }
  const nodeId = env.NODE_ID;
  setServerRegion(nodeId);
  // `conn.geo.*` for traffic policies: the GeoIP database, read before anything listens.
  const geo = startGeo(env.WARREN_GEOIP_DB || undefined, log.child({ component: 'geoip' }));
  const metrics = createIngressMetrics(nodeId);
  const registry = new TunnelRegistry(nodeId);
  const forwarder = new Forwarder({
    registry,
    hopToken: env.WARREN_NODE_TOKEN ?? '',
    log,
    upstreamTimeoutMs: env.UPSTREAM_TIMEOUT_MS,
    maxStreamsPerTunnel: env.MAX_STREAMS_PER_TUNNEL,
    maxQueuedPerTunnel: env.MAX_QUEUED_PER_TUNNEL,
    releaseDrainMs: env.DRAIN_TIMEOUT_MS,
  });
  // Traffic events for subscribed accounts, on a Redis connection of their own.
  const events = env.EVENTS_REDIS_URL
    ? createTrafficEvents({
        url: env.EVENTS_REDIS_URL,
        prefix: env.EVENTS_PREFIX,
        maxQueued: env.EVENTS_MAX_QUEUED,
        flushMs: env.EVENTS_FLUSH_MS,
        metrics: metrics.events,
        log: log.child({ component: 'events' }),
      })
    : undefined;
  if (events) metrics.events.setQueueProbe(() => events.queue.held);
  else log.info('neither EVENTS_REDIS_URL nor REDIS_URL is set: traffic events are off');
  // HTTPS_EDGES_ON_HTTP: edges on the plain-HTTP listener are redirected to (or refused in favour
  // of) https:// on the public HTTPS port; httpsPublicPort is known once the listeners are up.
  FIND_REPLACE_PROCESS_LIMITS.holdMs = env.FIND_REPLACE_HOLD_MS;
  // This node's certificate (set once TLS is loaded below), for conn.tls.server over a hop.
  let serverCertificate: X509Certificate | null = null;
  // This node's internal address (set once the internal listener is up), for forward-internal to its own endpoints.
  let ownAddress: string | undefined;
  const handler = new PublicHandler({ registry, forwarder, metrics, log, events, httpsEdgesOnHttp: env.HTTPS_EDGES_ON_HTTP, httpsPort: () => httpsPublicPort(), bodyBudget: new BodyBudget(env.MAX_BUFFERED_BODY_BYTES), serverCertificate: () => serverCertificate, nodeAddress: () => ownAddress });
  if (env.HTTPS_EDGES_ON_HTTP === 'serve') log.warn('HTTPS_EDGES_ON_HTTP=serve: HTTPS edges are served over plain HTTP too (for local development and tests only)');

  // The rate-limit action counts in Redis per ingress server (RATE_LIMIT_SERVER_ID); without Redis,
  // in memory per process. Either way a slow or failed store never blocks a request (fail open).
  const limiter: RateLimiter & { close?: () => Promise<void> } = env.RATE_LIMIT_REDIS_URL
    ? new RedisSlidingWindowLimiter({ redis: env.RATE_LIMIT_REDIS_URL, serverId: env.RATE_LIMIT_SERVER_ID, timeoutMs: env.RATE_LIMIT_TIMEOUT_MS, exactMax: env.RATE_LIMIT_EXACT_MAX, transport: env.RATE_LIMIT_TRANSPORT, autoPipelining: env.RATE_LIMIT_AUTO_PIPELINING, registry: metrics.registry, log: log.child({ component: 'ratelimit' }) })
    : new LocalSlidingWindowLimiter({});
  if (!env.RATE_LIMIT_REDIS_URL) log.warn('neither RATE_LIMIT_REDIS_URL nor REDIS_URL is set: rate limits are counted in memory by each process');
  // The edge's mutual TLS first, then the route's modules and policy in their one order.
  const stageDeps = { limiter, log: log.child({ component: 'pipeline' }), registry: metrics.registry, internalEndpoint: (host: string, accountId: string) => registry.hasInternal(host, accountId) };
  const compilePipeline = createPipelineCompiler([(_route, edge, config) => mutualTlsStage(edge, config), ...pipelineStageFactories], stageDeps);

  const tls = await loadTls(env.TLS_CERT_FILE, env.TLS_KEY_FILE, env.STATE_DIR);
  try {
    serverCertificate = new X509Certificate(tls.cert);
  } catch (err) {
    log.warn({ err: (err as Error).message }, 'the TLS certificate could not be read: conn.tls.server reads empty over a hop');
  }

  // Internal listener first: its address is this node's identity for hops.
  let cp: ControlPlaneClient | null = null;
  let stopping = false;
  const internal = createInternalServer({
    forwarder,
    registry: metrics.registry,
    hopToken: env.WARREN_NODE_TOKEN ?? '',
    // Endpoint traffic policies run on the node holding the tunnel, hop requests included.
    hopPolicy: { request: (req, res) => handler.serveHop(req, res), upgrade: (req, socket, head) => handler.upgradeHop(req, socket, head) },
    isReady: () => !stopping && handler.ready,
    status: () => ({
      node_id: nodeId,
      config_version: cp?.config?.version ?? null,
      config_persisted_version: cp?.persisted.version ?? null,
      config_persist_error: cp?.persisted.error ?? null,
      control_plane_connected: cp?.connected ?? false,
      agent_sessions: agentServer.sessions().length,
      local_tunnels: registry.localCount,
      remote_tunnels: registry.remoteCount,
    }),
    log,
  });
  const internalPort = await listen(internal, env.INTERNAL_PORT, env.INTERNAL_HOST);
  const nodeAddress = env.NODE_ADDRESS ?? `${env.INTERNAL_HOST.includes(':') ? `[${env.INTERNAL_HOST}]` : env.INTERNAL_HOST}:${internalPort}`;
  ownAddress = nodeAddress;

  cp = new ControlPlaneClient({
    targets: env.CONTROL_PLANE_TARGETS,
    nodeId,
    nodeAddress,
    stateDir: env.STATE_DIR,
    token: env.WARREN_NODE_TOKEN,
    tls: env.CONTROL_PLANE_TLS_CA_FILE
      ? {
          ca: readFileSync(env.CONTROL_PLANE_TLS_CA_FILE),
          cert: env.CONTROL_PLANE_TLS_CERT_FILE ? readFileSync(env.CONTROL_PLANE_TLS_CERT_FILE) : undefined,
          key: env.CONTROL_PLANE_TLS_KEY_FILE ? readFileSync(env.CONTROL_PLANE_TLS_KEY_FILE) : undefined,
          serverNameOverride: env.CONTROL_PLANE_TLS_SERVER_NAME,
        }
      : undefined,
    registry: metrics.registry,
    log: log.child({ component: 'config' }),
  });
  const client = cp;
  // Compile every candidate before it is swapped in: a config the router cannot use is NACKed.
  const compiled = new WeakMap<DataPlaneConfig, RoutingTable>();
  client.addValidator((candidate) => {
    compiled.set(candidate, new RoutingTable(candidate, compilePipeline));
  });

  const authenticate = (token: string): AgentIdentity | null => {
    const cfg = client.config;
    if (!cfg) return null;
    const cred = cfg.credentialsByTokenHash.get(createHash('sha256').update(token).digest('hex'));
    return cred ? { credentialId: cred.id, accountId: cred.accountId, acl: cred.acl } : null;
  };
  let httpPort = 0;
  let httpsPort = 0;
  /**
   * Per hostname whose edge sets tls_termination or mutual_tls: its TLS context (minimum version,
   * CA names) and the minimum version checked after the handshake; other hostnames use the default.
   */
  let edgeTls = new Map<string, { context: SecureContext; minVersion: string }>();
  const buildEdgeTls = (cfg: DataPlaneConfig) => {
    const out = new Map<string, { context: SecureContext; minVersion: string }>();
    for (const edge of cfg.edges.values()) {
      const mtls = edge.mutualTls?.enabled ? mutualTlsCaPems(edge, cfg) : [];
      if (!edge.tlsTermination?.enabled && mtls.length === 0) continue;
      const { minVersion } = edgeSecureContextOptions(edge);
      try {
        const context = createSecureContext({ cert: tls.cert, key: tls.key, minVersion, ...(mtls.length > 0 ? { ca: mtls } : {}) });
        for (const hp of edge.hostports) out.set(hostOfHostport(hp), { context, minVersion });
      } catch (err) {
        log.error({ edge: edge.id, err }, 'edge TLS settings not applicable; the default TLS context serves it');
      }
    }
    return out;
  };
  const httpsPublicPort = () => env.PUBLIC_HTTPS_PORT || httpsPort;
  /** A Bind of a hostname another account's endpoint holds: its refusal, and why its later twin is stopped. */
  const hostnameInUse = (hostname: string) => `the hostname ${hostname} is in use by another account (ERR_WARREN_4101)`;
  /** A Bind of a hostname an HTTPS edge of another account serves: its refusal, and why a Bind that edge predates is stopped. */
  const hostnameOfEdge = (hostname: string) => `the hostname ${hostname} belongs to another account (ERR_WARREN_4101)`;
  const checkBind = (b: BindRequest): string | null => {
    const cfg = client.config;
    const table = cfg ? compiled.get(cfg) : undefined;
    if (table) {
      for (const [hp, ce] of table.edgesByHostport) {
        if (hostOfHostport(hp) === b.hostname && ce.edge.accountId !== b.accountId) return hostnameOfEdge(b.hostname);
      }
    }
    for (const t of registry.bindsOf(b.hostname)) {
      // The agent's own tunnel, resumed after a reconnect (perhaps to another node, while the
      // old node's report of it has not expired yet), is no conflict.
      if (t.id === b.tunnelId) continue;
      if (t.accountId !== b.accountId) return hostnameInUse(b.hostname);
      if (!t.poolingEnabled || !b.poolingEnabled) return `the endpoint ${b.hostname} is already online; start both with pooling enabled to share it (ERR_WARREN_4101)`;
    }
    return null;
  };
  const agentServer = new AgentServer({
    nodeId,
    tls: { cert: tls.cert, key: tls.key },
    authenticate,
    // The server enforces the credential's ACL itself; this adds the cluster-wide checks.
    checkBind,
    // Bind endpoints' traffic policies, compiled against the applied config (policy/endpoint.ts).
    endpointPolicy: (req) => compileEndpointPolicy(req, client.config, stageDeps),
    defaultDomain: env.DEFAULT_DOMAIN,
    publicUrl: (proto, host) => {
      const port = proto === 'http' ? httpPort : httpsPublicPort();
      const std = proto === 'http' ? 80 : 443;
      return `${proto}://${host}${port === std ? '' : `:${port}`}`;
    },
    maxStreamsPerSession: env.MAX_STREAMS_PER_SESSION,
    stoppedTunnelDrainMs: env.DRAIN_TIMEOUT_MS,
    maxStreamsPerClient: env.MAX_STREAMS_PER_CLIENT,
    maxTunnelsPerSession: env.MAX_TUNNELS_PER_SESSION,
    maxTunnelsPerNode: env.MAX_TUNNELS_PER_NODE,
    maxTunnelsPerAccount: env.MAX_TUNNELS_PER_ACCOUNT,
    maxSessionsPerCredential: env.MAX_SESSIONS_PER_CREDENTIAL,
    maxTunnelsPerCredential: env.MAX_TUNNELS_PER_CREDENTIAL,
    tunnelStartsPerSecond: env.TUNNEL_STARTS_PER_SECOND_PER_SESSION,
    tunnelStartBurst: env.TUNNEL_START_BURST_PER_SESSION || undefined,
    log: log.child({ component: 'agents' }),
  });
  agentServer.on('session', (s) => {
    metrics.sessions.set(agentServer.sessions().length);
    client.sessionUp(s);
  });
  agentServer.on('sessionClosed', (id: string) => {
    metrics.sessions.set(agentServer.sessions().length);
    client.sessionDown(id);
  });
  agentServer.on('tunnel', (t) => {
    registry.addLocal(t);
    metrics.tunnels.set({ location: 'local' }, registry.localCount);
    const { openStream: _o, openStreams: _n, ...report } = t;
    client.tunnelUp(report);
  });
  agentServer.on('tunnelClosed', (id: string) => {
    registry.removeLocal(id);
    forwarder.release(id);
    metrics.tunnels.set({ location: 'local' }, registry.localCount);
    client.tunnelDown(id);
  });

  function* endpointPolicies(): Generator<EndpointPolicy> {
    for (const t of registry.localTunnels()) if (t.trafficPolicy) yield t.trafficPolicy;
  }

  const remoteChanged = () => metrics.tunnels.set({ location: 'remote' }, registry.remoteCount);
  /**
   * Two accounts' Binds of one hostname on two nodes at once can both pass their node's check,
   * and so can a Bind made before its node learned of another account's new HTTPS edge on the
   * host. Once this node learns of the other account's older tunnel or edge, its own later Bind
   * (which routing already gives no traffic) is stopped, with the Bind refusal's words: it would
   * otherwise take over whenever the holder's tunnel went down for a moment. Outheld by a tunnel:
   * only once that has lasted OUTHELD_BIND_GRACE_MS (the holder may be a dead node's report, swept
   * within seconds); by an edge (the config says so): at once.
   */
  /** Tunnel id → when it was first found outheld by another account's tunnel. */
  const outheldSince = new Map<string, number>();
  let outheldTimer: NodeJS.Timeout | null = null;
  const stopOutheldBinds = (by?: DpTunnel) => {
    const found = registry.outheldLocalBinds(by);
    const now = performance.now();
    if (!by) {
      const still = new Set<string>();
      for (const f of found) if (f.by === 'endpoint') still.add(f.tunnel.id);
      for (const id of outheldSince.keys()) if (!still.has(id)) outheldSince.delete(id);
    }
    for (const { tunnel, hostname, by: holder } of found) {
      if (holder === 'endpoint') {
        const since = outheldSince.get(tunnel.id) ?? now;
        if (now - since < env.OUTHELD_BIND_GRACE_MS) {
          outheldSince.set(tunnel.id, since);
          continue;
        }
        outheldSince.delete(tunnel.id);
      }
      if (agentServer.stopTunnel(tunnel.id, holder === 'edge' ? hostnameOfEdge(hostname) : hostnameInUse(hostname), 'ERR_WARREN_4101')) {
        log.info({ tunnel: tunnel.id, account: tunnel.accountId, hostname, holder }, `stopped a tunnel whose hostname another account's older ${holder === 'edge' ? 'HTTPS edge' : 'tunnel'} holds`);
      }
    }
    // Looked at again (all of them) until none is waiting.
    if (outheldSince.size > 0 && !outheldTimer) {
      outheldTimer = setTimeout(() => {
        outheldTimer = null;
        stopOutheldBinds();
      }, Math.min(5_000, Math.max(100, env.OUTHELD_BIND_GRACE_MS / 3)));
      outheldTimer.unref();
    }
  };
  client.on('remoteTunnelUp', (t) => {
    registry.addRemote(t);
    remoteChanged();
    stopOutheldBinds(t);
  });
  client.on('remoteTunnelDown', (id: string) => {
    registry.removeRemote(id);
    remoteChanged();
  });
  client.on('config', (cfg: DataPlaneConfig, previous: DataPlaneConfig | null) => {
    const table = compiled.get(cfg) ?? new RoutingTable(cfg, compilePipeline);
    edgeTls = buildEdgeTls(cfg);
    for (const e of table.routeErrors) log.error({ route: e.routeId, err: e.message }, 'route configuration not applicable; the route answers 503 until it is fixed');
    handler.setTable(table);
    // Endpoint policies naming IP policies follow the config's. One that names an IP policy gone
    // from its account fails closed (503) and its tunnel is stopped: the agent is told why.
    for (const { tunnelId, message } of recompileEndpointPolicies(endpointPolicies(), cfg, stageDeps, log.child({ component: 'pipeline' }))) {
      agentServer.stopTunnel(tunnelId, `this endpoint's traffic policy (Bind Opts.TrafficPolicy) cannot be applied any more: ${message} (ERR_WARREN_7010)`, 'ERR_WARREN_7010');
    }
    events?.setConfig(cfg);
    metrics.retain(cfg);
    registry.setRemote(client.remoteTunnels.values());
    remoteChanged();
    stopOutheldBinds();
    // A deleted or disabled credential ends its agents' sessions at once.
    if (previous) {
      for (const id of previous.credentials.keys()) {
        if (!cfg.credentials.has(id)) {
          const n = agentServer.closeSessionsOfCredential(id, 'the authtoken was revoked');
          if (n > 0) log.info({ credential: id, sessions: n }, 'closed sessions of a revoked credential');
        }
      }
    }
    // A credential's changed ACL applies to its live sessions: later Binds are checked against
    // it, and tunnels it no longer allows are stopped (StopTunnel, ERR_WARREN_1100); the sessions
    // and the tunnels still allowed carry on. (The map is the same object when no credential changed.)
    if (cfg.credentials !== previous?.credentials) {
      const n = agentServer.applyCredentialAcls((id) => cfg.credentials.get(id)?.acl);
      if (n > 0) log.info({ tunnels: n }, "stopped tunnels their credential's new ACL no longer allows");
    }
    log.debug({ version: cfg.version }, 'config applied');
  });
  await client.start();

  // requireHostHeader off: a request without Host gets the ingress's own 400 page (7007, with
  // Warren-Error-Code), not Node's bare one; the router refuses it either way.
  const publicHttp = http.createServer({ keepAliveTimeout: 65_000, requestTimeout: 0, headersTimeout: 30_000, requireHostHeader: false }, handler.handler('http'));
  publicHttp.on('upgrade', handler.upgradeHandler('http'));
  // Client certificates are requested on every HTTPS connection (a client without one still
  // connects) so that edges with mutual_tls can verify them per request; an edge's
  // tls_termination minimum version and its CA names come from a per-hostname context.
  const publicHttps = https.createServer(
    {
      cert: tls.cert,
      key: tls.key,
      requestCert: true,
      rejectUnauthorized: false,
      SNICallback: (servername: string, cb: (err: Error | null, ctx?: SecureContext) => void) => cb(null, edgeTls.get(servername.toLowerCase())?.context),
      keepAliveTimeout: 65_000,
      requestTimeout: 0,
      headersTimeout: 30_000,
      requireHostHeader: false,
    } as https.ServerOptions,
    handler.handler('https'),
  );
  publicHttps.on('upgrade', handler.upgradeHandler('https'));
  // CONNECT (a forward-proxy tunnel) is not served: answered, rather than the silent close Node
  // gives a server without a 'connect' listener.
  for (const server of [publicHttp, publicHttps]) server.on('connect', (_req: http.IncomingMessage, socket: net.Socket) => sendUpgradeError(socket, 7011, 'CONNECT is not supported: this is a reverse proxy'));
  // `conn.tls.ja4_fingerprint`: each client's ClientHello is read before node:tls takes the socket.
  captureClientHello(publicHttps);
  // A client chain that failed OpenSSL's own check leaves its error queued; cleared at once (`tls-error-queue.ts`).
  clearChainVerifyErrors(publicHttps);
  // OpenSSL has chosen the protocol version before the SNI callback swaps contexts, so an edge's
  // tls_termination minimum is enforced here: a connection below it is closed before any request.
  // This covers only connections whose SNI names the edge; routing goes by Host, so the public
  // handler checks every request to such an edge as well (421 ERR_WARREN_7113 when its connection
  // is plain HTTP or below the minimum, e.g. TLS 1.2 under another hostname's SNI).
  publicHttps.prependListener('secureConnection', (socket: TLSSocket) => {
    const servername = typeof socket.servername === 'string' ? socket.servername.toLowerCase() : '';
    if (servername && edgeTls.get(servername)?.minVersion === 'TLSv1.3' && socket.getProtocol() !== 'TLSv1.3') socket.destroy();
  });
  // A request Node's parser refuses is answered as Node's default handler would (400, 431 or 408,
  // Connection: close; the ingress's JSON error shape), then the socket is closed.
  for (const s of [publicHttp, publicHttps]) s.on('clientError', (err: Error & { code?: string }, socket) => answerClientError(err, socket));
  // `conn.ts.start` for traffic policies: when each client connection was accepted.
  for (const s of [publicHttp, publicHttps]) s.prependListener('connection', stampConnection);

  httpPort = await listen(publicHttp, env.HTTP_PORT, env.HOST);
  httpsPort = await listen(publicHttps, env.HTTPS_PORT, env.HOST);
  const agentPort = await agentServer.listen(env.AGENT_PORT, env.HOST);
  const ports = { http: httpPort, https: httpsPort, agent: agentPort, internal: internalPort };
  log.info({ node_id: nodeId, node_address: nodeAddress, ...ports, config_version: client.config?.version ?? null }, 'ingress listening');
  if (process.send) process.send({ type: 'listening', nodeId, ...ports, caPem: tls.caPem });

  const stop = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    log.info({ signal }, 'draining');
    const force = setTimeout(() => {
      log.warn('drain timed out; closing remaining connections');
      publicHttp.closeAllConnections();
      publicHttps.closeAllConnections();
    }, env.DRAIN_TIMEOUT_MS);
    force.unref();
    const closed = (s: net.Server) => new Promise<void>((resolve) => s.close(() => resolve()));
    const publicClosed = Promise.all([closed(publicHttp), closed(publicHttps)]);
    publicHttp.closeIdleConnections();
    publicHttps.closeIdleConnections();
    await publicClosed;
    await agentServer.close();
    forwarder.close();
    // Every request and connection has ended: publish the events they left, within a bound.
    await events?.close(Math.min(5_000, Math.max(500, env.DRAIN_TIMEOUT_MS)));
    await client.stop();
    await limiter.close?.();
    geo?.close();
    internal.closeAllConnections();
    await closed(internal);
    log.info('stopped');
    process.exit(0);
  };
  process.on('SIGTERM', () => void stop('SIGTERM'));
  process.on('SIGINT', () => void stop('SIGINT'));
  stopWithParent(() => void stop('parent gone'));
}

main().catch((err: unknown) => {
  if (err instanceof EnvError) console.error(`warren ingress: ${err.message}`);
  else log.fatal({ err }, 'failed to start');
  process.exit(1);
});
