import { EventEmitter } from 'node:events';
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import type { Logger } from 'pino';
import { createLogger, type DpAgentSession, type DpTunnel } from '@warren/shared';
import { MAX_FULL_SYNC_BYTES, sessionReportBytes, tunnelReportBytes } from '../config/control-plane-client.js';
import { AgentConnection, DEFAULT_MAX_STREAMS_PER_CLIENT, MAX_SAFE_STREAMS, POLICY_BYTES_BURST, POLICY_BYTES_PER_SECOND, TokenBucket, type ConnectionHost, type LocalTunnelImpl } from './agent-connection.js';
import { ResumeTokens } from './resume-tokens.js';
import type { EndpointPolicy, EndpointPolicyRequest, EndpointPolicyResult } from '../policy/endpoint.js';
import { remoteIp } from '../http/client-address.js';

/**
 * The ingress side of the agent link (agent-protocol.md): a TLS listener where agents (the
 * official SDK or warren-agent) open one muxado session per connection, authenticate, and start
 * tunnels; ingress then reaches the agent's local service through server-opened proxy streams.
 */

export interface AgentIdentity {
  credentialId: string;
  accountId: string;
  acl: string[];
}

export interface ProxyHeaderInit {
  clientAddr: string;
  proto: 'http' | 'https' | 'tcp' | 'tls';
  edgeType: '0' | '1' | '2' | '3';
  passthroughTls?: boolean;
}

export type TunnelStream = Duplex & {
  setNoDelay(v?: boolean): unknown;
  setKeepAlive(e?: boolean, d?: number): unknown;
  setTimeout(ms: number, cb?: () => void): unknown;
  ref(): unknown;
  unref(): unknown;
};

export interface LocalTunnel extends Omit<DpTunnel, 'nodeId' | 'nodeAddress'> {
  /**
   * Opens a server-initiated proxy stream (type 3 + int64 LE length + ProxyHeader JSON with
   * Id/ClientAddr/Proto/EdgeType/PassthroughTLS). Rejects with a {@link TunnelStreamError} whose
   * `code` is 'STREAM_CAP' when the session is at its cap, 'CLIENT_STREAM_CAP' when the client
   * address of `h.clientAddr` holds its share of the session's slots (maxStreamsPerClient),
   * 'SESSION_CLOSED' when the session or the tunnel is gone.
   *
   * The stream behaves like a `net.Socket`: for `http`/`https` it ends its write side once the
   * agent's FIN has been read (what an HTTP client expects of keep-alive sockets); for
   * `tcp`/`tls` it stays half-open so each direction closes on its own.
   */
  openStream(h: ProxyHeaderInit): Promise<TunnelStream>;
  /**
   * Same as {@link openStream}, synchronously; throws the {@link TunnelStreamError}. For the
   * forwarder's connection pool, whose connector opens the stream while the request that needs
   * it is being dispatched, so the stream carries that request's client address. (Optional in
   * the type so that test doubles need not implement it; AgentServer's tunnels always do.)
   */
  openStreamSync?(h: ProxyHeaderInit): TunnelStream;
  /** Proxy streams currently open on this tunnel's session (on the wire: one abandoned by its client stays open until the agent's FIN). */
  readonly openStreams: number;
  /** True once the tunnel went away (Unbind, StopTunnel, its session ended). Optional for test doubles. */
  readonly closed?: boolean;
  /**
   * A Bind endpoint's traffic policy (`Opts.TrafficPolicy`), compiled; null or absent when none.
   * Runs on this node only (`PublicHandler`): other nodes hop the request here.
   */
  readonly trafficPolicy?: EndpointPolicy | null;
}

export interface BindRequest {
  accountId: string;
  sessionId: string;
  proto: string;
  hostname: string;
  bindings: string[];
  poolingEnabled: boolean;
  /** The tunnel id the Bind will get: a resumed one (already proven to be this credential's) or a new one. */
  tunnelId: string;
}

export interface AgentServerOptions {
  nodeId: string;
  /** PEM. */
  tls: { cert: string; key: string };
  /** Sync lookup against the applied config (sha256 of token). */
  authenticate(token: string): AgentIdentity | null;
  /** Return an error text to refuse a Bind (e.g. hostname belongs to another account, or is live without pooling); null to accept. */
  checkBind?(req: BindRequest): string | null;
  /**
   * Compiles a Bind endpoint's traffic policy against the applied config (`compileEndpointPolicy`),
   * or refuses the Bind. Without it, a Bind with a traffic policy is refused.
   */
  endpointPolicy?(req: EndpointPolicyRequest): EndpointPolicyResult;
  /** Domain for Bind requests without a hostname/domain: `<random>.<defaultDomain>`; default 'warren.localhost'. */
  defaultDomain?: string;
  /** Builds the public URL of a Bind tunnel, e.g. (proto 'https', 'app.test') → 'https://app.test:8443'. Default `${proto}://${hostname}`. */
  publicUrl?(proto: string, hostname: string): string;
  /** Default 500; at most 505 (the SDK's session dies past 512 streams, its own included). */
  maxStreamsPerSession?: number;
  /**
   * How long the streams of a tunnel stopped from the server's side (StopTunnel: a narrowed ACL,
   * a lost hostname race, a deleted IP policy) may still run before they are reset (ms; default
   * 10,000; the ingress passes DRAIN_TIMEOUT_MS). An Unbind leaves them to the agent.
   */
  stoppedTunnelDrainMs?: number;
  /**
   * Slots of a session's stream cap one public client address (IPv4, or IPv6 /64) may hold at
   * once. Default: `maxStreamsPerSession` (no share of its own); the ingress sets
   * MAX_STREAMS_PER_CLIENT, default {@link DEFAULT_MAX_STREAMS_PER_CLIENT} (80). Past it, `openStream` fails with 'CLIENT_STREAM_CAP' (429 ERR_WARREN_7014)
   * while other addresses still get streams. A slot counts until it is free again (finished and
   * lingering, drained after an abort, held after a reset), as for the session's cap. Per
   * session: a client of two sessions holds up to this on each.
   */
  maxStreamsPerClient?: number;
  /** Tunnels one agent session may have at once (default 256); StartTunnelWithLabel and Bind beyond it are refused (ERR_WARREN_1110). */
  maxTunnelsPerSession?: number;
  /** Tunnels of all sessions on this node at once (default 10,000); beyond it, refused (ERR_WARREN_1110). */
  maxTunnelsPerNode?: number;
  /**
   * Tunnels of one account's sessions on this node at once (default 1,000): without it one
   * account could take the whole node's cap, and no other account could add a tunnel there.
   */
  maxTunnelsPerAccount?: number;
  /**
   * Authenticated sessions of one credential (authtoken) on this node at once (default 100): an
   * Auth beyond it is refused (ERR_WARREN_1110) and the connection closed. One leaked or looping
   * authtoken then cannot fill the node, nor its account's share of it, with sessions. A session
   * resuming its own id (a reconnect) does not count twice.
   */
  maxSessionsPerCredential?: number;
  /**
   * Tunnels of one credential's sessions on this node at once (default 500, half the account's
   * default, so one authtoken cannot take its account's whole allowance); StartTunnelWithLabel
   * and Bind beyond it are refused (ERR_WARREN_1110). Binds only when below `maxTunnelsPerAccount`.
   */
  maxTunnelsPerCredential?: number;
  /**
   * Tunnel starts (StartTunnelWithLabel and Bind) one session may make per second on average
   * (default 20), with bursts of `tunnelStartBurst` (default: `maxTunnelsPerSession`, so a
   * reconnecting agent can restart every tunnel it may have at once; at least a second's worth). A start beyond it is refused
   * with ERR_WARREN_8001 (retry later); the session carries on. A token bucket per session: two
   * numbers, whatever the session does.
   */
  tunnelStartsPerSecond?: number;
  tunnelStartBurst?: number;
  /**
   * What the sessions and tunnels of this node may take up in the full sync to the control plane
   * ({@link sessionReportBytes}, {@link tunnelReportBytes}), default 32 MiB and at most
   * MAX_FULL_SYNC_BYTES (60 MiB, under the control plane's 64 MiB message limit). A tunnel or
   * session beyond it is refused (ERR_WARREN_1110). At most 8.6 KB per tunnel (4 KiB of metadata,
   * 10 labels, 1 KiB forwards_to), so 10,000 tunnels of typical size fit, ~3,900 of the largest.
   */
  maxReportBytes?: number;
  /** Defaults from the agent's Auth, else 10 s / 15 s. */
  heartbeatIntervalMs?: number;
  heartbeatToleranceMs?: number;
  /**
   * Key (≥ 16 bytes) for the session cookies and tunnel tokens that let agents resume their
   * session and tunnel ids after a reconnect. Default: derived from `tls.key`, so resumption
   * survives restarts and works across nodes that share the certificate's key.
   */
  resumeKey?: string | Buffer;
  log?: Logger;
}

/** Why `openStream` failed. */
export class TunnelStreamError extends Error {
  constructor(
    readonly code: 'STREAM_CAP' | 'CLIENT_STREAM_CAP' | 'SESSION_CLOSED',
    message: string,
  ) {
    super(message);
    this.name = 'TunnelStreamError';
  }
}

export interface AgentServerEvents {
  session: [session: DpAgentSession];
  sessionClosed: [sessionId: string, reason: string];
  tunnel: [tunnel: LocalTunnel];
  tunnelClosed: [tunnelId: string, reason: string];
}

export const DEFAULT_MAX_TUNNELS_PER_SESSION = 256;
export const DEFAULT_MAX_TUNNELS_PER_NODE = 10_000;
export const DEFAULT_MAX_TUNNELS_PER_ACCOUNT = 1_000;
export const DEFAULT_MAX_REPORT_BYTES = 32 * 1024 * 1024;
export const DEFAULT_MAX_SESSIONS_PER_CREDENTIAL = 100;
export const DEFAULT_MAX_TUNNELS_PER_CREDENTIAL = 500;
export const DEFAULT_TUNNEL_STARTS_PER_SECOND = 20;
export { DEFAULT_MAX_STREAMS_PER_CLIENT };

/**
 * Connections that have not authenticated yet (each may take 15 s to), in all and from one
 * address: beyond either, a new one is closed at once, before it costs a session. Agents retry
 * with backoff; a fleet behind one NAT reconnecting at once gets in over a few rounds.
 */
export const MAX_UNAUTHENTICATED = 1024;
export const MAX_UNAUTHENTICATED_PER_IP = 128;

/** Counts per key, with no entry for zero. */
function countUp(counts: Map<string, number>, key: string): void {
  counts.set(key, (counts.get(key) ?? 0) + 1);
}

function countDown(counts: Map<string, number>, key: string): void {
  const n = (counts.get(key) ?? 1) - 1;
  if (n > 0) counts.set(key, n);
  else counts.delete(key);
}

function sameStrings(a: readonly string[], b: readonly string[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/** The credential whose session carries `t` (set before any of its tunnels start). */
function credentialOf(t: LocalTunnelImpl): string {
  return t.connection.identity!.credentialId;
}

/** How long `close()` waits for agents to hang up after GOAWAY before cutting them off. */
const CLOSE_GRACE_MS = 2_000;
/** How often, at most, credentials' tunnel-start buckets without sessions that have refilled are dropped. */
const START_BUCKET_SWEEP_MS = 10_000;

export class AgentServer extends EventEmitter<AgentServerEvents> {
  private readonly log: Logger;
  private readonly server: tls.Server;
  private readonly host: ConnectionHost;
  private readonly connections = new Set<AgentConnection>();
  private readonly sockets = new Set<net.Socket>();
  private readonly sessionsById = new Map<string, AgentConnection>();
  private readonly tunnelsById = new Map<string, LocalTunnelImpl>();
  /** What the live sessions and tunnels take up in a full sync (upper bound), see `maxReportBytes`. */
  private reportBytes = 0;
  /** Live tunnels per account, and per credential. */
  private readonly tunnelsByAccount = new Map<string, number>();
  private readonly tunnelsByCredential = new Map<string, number>();
  /**
   * Tunnel-start buckets shared by each credential's sessions. A bucket outlives the credential's
   * last session until it has refilled (a new one would be full too), so reconnecting does not
   * reset it; swept at most once per START_BUCKET_SWEEP_MS.
   */
  private readonly startsByCredential = new Map<string, TokenBucket>();
  private readonly policyBytesByCredential = new Map<string, TokenBucket>();
  private lastStartSweep = 0;
  /** Authenticated sessions per credential (each connection from sessionUp to sessionDown). */
  private readonly sessionsByCredential = new Map<string, number>();
  /** When a node cap last logged a warning, and how many refusals since (one warning a minute at most). */
  private capWarnedAt = 0;
  private capRefusals = 0;
  /** Connections that have not authenticated yet, and how many of them each address has. */
  private readonly unauthenticated = new Map<AgentConnection, string>();
  private readonly unauthenticatedByIp = new Map<string, number>();
  private closing: Promise<void> | null = null;

  constructor(opts: AgentServerOptions) {
    super();
    if (!opts.nodeId) throw new Error('AgentServer: nodeId is required');
    if (!opts.tls?.cert || !opts.tls?.key) throw new Error('AgentServer: tls.cert and tls.key (PEM) are required');
    if (typeof opts.authenticate !== 'function') throw new Error('AgentServer: authenticate() is required');
    const maxStreams = opts.maxStreamsPerSession ?? 500;
    if (!Number.isInteger(maxStreams) || maxStreams < 1 || maxStreams > MAX_SAFE_STREAMS) {
      throw new Error(`AgentServer: maxStreamsPerSession must be an integer from 1 to ${MAX_SAFE_STREAMS}`);
    }
    const maxStreamsPerClient = opts.maxStreamsPerClient ?? maxStreams;
    if (!Number.isInteger(maxStreamsPerClient) || maxStreamsPerClient < 1 || maxStreamsPerClient > MAX_SAFE_STREAMS) {
      throw new Error(`AgentServer: maxStreamsPerClient must be an integer from 1 to ${MAX_SAFE_STREAMS}`);
    }
    const maxTunnelsPerSession = opts.maxTunnelsPerSession ?? DEFAULT_MAX_TUNNELS_PER_SESSION;
    const maxTunnelsPerNode = opts.maxTunnelsPerNode ?? DEFAULT_MAX_TUNNELS_PER_NODE;
    const maxReportBytes = opts.maxReportBytes ?? DEFAULT_MAX_REPORT_BYTES;
    const maxTunnelsPerAccount = opts.maxTunnelsPerAccount ?? DEFAULT_MAX_TUNNELS_PER_ACCOUNT;
    const maxSessionsPerCredential = opts.maxSessionsPerCredential ?? DEFAULT_MAX_SESSIONS_PER_CREDENTIAL;
    const maxTunnelsPerCredential = opts.maxTunnelsPerCredential ?? DEFAULT_MAX_TUNNELS_PER_CREDENTIAL;
    const tunnelStartsPerSecond = opts.tunnelStartsPerSecond ?? DEFAULT_TUNNEL_STARTS_PER_SECOND;
    const tunnelStartBurst = opts.tunnelStartBurst ?? Math.max(maxTunnelsPerSession, tunnelStartsPerSecond);
    // All of a credential's sessions together: every tunnel it may hold at once, at the same rate.
    const credentialStartBurst = Math.max(maxTunnelsPerCredential, tunnelStartBurst);
    for (const [name, v, max] of [
      ['maxTunnelsPerSession', maxTunnelsPerSession, 1_000_000],
      ['maxTunnelsPerNode', maxTunnelsPerNode, 1_000_000],
      ['maxTunnelsPerAccount', maxTunnelsPerAccount, 1_000_000],
      ['maxSessionsPerCredential', maxSessionsPerCredential, 1_000_000],
      ['maxTunnelsPerCredential', maxTunnelsPerCredential, 1_000_000],
      ['tunnelStartsPerSecond', tunnelStartsPerSecond, 1_000_000],
      ['tunnelStartBurst', tunnelStartBurst, 1_000_000],
      ['maxReportBytes', maxReportBytes, MAX_FULL_SYNC_BYTES],
    ] as const) {
      if (!Number.isInteger(v) || v < 1 || v > max) throw new Error(`AgentServer: ${name} must be an integer from 1 to ${max}`);
    }
    for (const [name, v] of [['heartbeatIntervalMs', opts.heartbeatIntervalMs], ['heartbeatToleranceMs', opts.heartbeatToleranceMs]] as const) {
      if (v !== undefined && (!Number.isFinite(v) || v < 10)) throw new Error(`AgentServer: ${name} must be at least 10 ms`);
    }
    this.log = opts.log ?? createLogger('ingress').child({ component: 'agents' });
    const tokens = new ResumeTokens(opts.resumeKey ?? ResumeTokens.deriveKey(opts.tls.key));
    const defaultDomain = (opts.defaultDomain ?? 'warren.localhost').toLowerCase();
    const publicUrl = opts.publicUrl ?? ((proto: string, hostname: string) => `${proto}://${hostname}`);
    const checkBind = opts.checkBind ?? ((req: BindRequest) => this.defaultCheckBind(req));

    this.host = {
      nodeId: opts.nodeId,
      log: this.log,
      tokens,
      settings: { defaultDomain, maxStreams, maxStreamsPerClient, maxTunnelsPerSession, tunnelStartsPerSecond, tunnelStartBurst, heartbeatIntervalMs: opts.heartbeatIntervalMs, heartbeatToleranceMs: opts.heartbeatToleranceMs, stoppedTunnelDrainMs: opts.stoppedTunnelDrainMs ?? 10_000 },
      authenticate: (token) => opts.authenticate(token),
      checkBind: (req) => checkBind(req),
      endpointPolicy: (req) => (opts.endpointPolicy ? opts.endpointPolicy(req) : { ok: false, error: 'traffic policies on endpoints are not available on this server (ERR_WARREN_2104)' }),
      publicUrl: (proto, hostname) => publicUrl(proto, hostname),
      admitSession: (s, replacing) => {
        // The live session this one resumes (same id, so the same credential) gives its place back.
        const live = replacing?.info && this.sessionsById.get(replacing.info.id) === replacing ? replacing : undefined;
        const ofCredential = (this.sessionsByCredential.get(s.credentialId) ?? 0) - (live?.info!.credentialId === s.credentialId ? 1 : 0);
        if (ofCredential >= maxSessionsPerCredential) {
          this.warnCapped({ credential: s.credentialId, sessions: ofCredential, max: maxSessionsPerCredential }, 'agent session refused: the credential is at MAX_SESSIONS_PER_CREDENTIAL on this node');
          return `this authtoken already has ${maxSessionsPerCredential} agent sessions on this ingress node, the most one authtoken may have there (MAX_SESSIONS_PER_CREDENTIAL); close some or use another authtoken (ERR_WARREN_1110)`;
        }
        const freed = replacing?.info ? sessionReportBytes(replacing.info) : 0;
        if (this.reportBytes - freed + sessionReportBytes(s) <= maxReportBytes) return null;
        this.warnCapped({ reportBytes: this.reportBytes, max: maxReportBytes }, 'agent session refused: the report budget of this node is spent');
        return `this ingress node has as many agent sessions and tunnels as it may report to the control plane (${maxReportBytes} bytes); connect to another node or retry later (ERR_WARREN_1110)`;
      },
      admitTunnel: (t, credentialId, replacing) => {
        // A live tunnel the new one replaces (same id, resumed) gives its place back.
        const live = replacing && this.tunnelsById.get(replacing.id) === replacing ? replacing : undefined;
        const nodeCount = this.tunnelsById.size - (live ? 1 : 0);
        if (nodeCount >= maxTunnelsPerNode) {
          this.warnCapped({ tunnels: this.tunnelsById.size, max: maxTunnelsPerNode }, 'tunnel refused: this node is at MAX_TUNNELS_PER_NODE');
          return `this ingress node already has ${maxTunnelsPerNode} tunnels, the most it may have (MAX_TUNNELS_PER_NODE); connect to another node or retry later (ERR_WARREN_1110)`;
        }
        const accountCount = (this.tunnelsByAccount.get(t.accountId) ?? 0) - (live?.accountId === t.accountId ? 1 : 0);
        if (accountCount >= maxTunnelsPerAccount) {
          this.warnCapped({ account: t.accountId, tunnels: accountCount, max: maxTunnelsPerAccount }, 'tunnel refused: the account is at MAX_TUNNELS_PER_ACCOUNT on this node');
          return `this account already has ${maxTunnelsPerAccount} tunnels on this ingress node, the most one account may have there (MAX_TUNNELS_PER_ACCOUNT); stop some or connect to another node (ERR_WARREN_1110)`;
        }
        const credentialCount = (this.tunnelsByCredential.get(credentialId) ?? 0) - (live && live.connection.identity?.credentialId === credentialId ? 1 : 0);
        if (credentialCount >= maxTunnelsPerCredential) {
          this.warnCapped({ credential: credentialId, tunnels: credentialCount, max: maxTunnelsPerCredential }, 'tunnel refused: the credential is at MAX_TUNNELS_PER_CREDENTIAL on this node');
          return `this authtoken already has ${maxTunnelsPerCredential} tunnels on this ingress node, the most one authtoken may have there (MAX_TUNNELS_PER_CREDENTIAL); stop some, use another authtoken or connect to another node (ERR_WARREN_1110)`;
        }
        const bytes = this.reportBytes - (live ? tunnelReportBytes(live) : 0) + tunnelReportBytes(t);
        if (bytes > maxReportBytes) {
          this.warnCapped({ reportBytes: this.reportBytes, max: maxReportBytes }, 'tunnel refused: the report budget of this node is spent');
          return `this ingress node has as many tunnels as it may report to the control plane (${maxReportBytes} bytes); stop some, use less metadata, or connect to another node (ERR_WARREN_1110)`;
        }
        return null;
      },
      credentialStarts: (credentialId) => {
        let b = this.startsByCredential.get(credentialId);
        if (b === undefined) this.startsByCredential.set(credentialId, (b = new TokenBucket(tunnelStartsPerSecond, credentialStartBurst)));
        this.sweepStartBuckets();
        return { bucket: b, burst: credentialStartBurst };
      },
      credentialPolicyBytes: (credentialId) => {
        let b = this.policyBytesByCredential.get(credentialId);
        if (b === undefined) this.policyBytesByCredential.set(credentialId, (b = new TokenBucket(POLICY_BYTES_PER_SECOND, POLICY_BYTES_BURST)));
        this.sweepStartBuckets();
        return b;
      },
      sessionById: (id) => this.sessionsById.get(id),
      tunnelById: (id) => this.tunnelsById.get(id),
      sessionUp: (conn) => {
        this.authenticated(conn);
        this.reportBytes += sessionReportBytes(conn.info!);
        countUp(this.sessionsByCredential, conn.info!.credentialId);
        this.sessionsById.set(conn.info!.id, conn);
        this.safeEmit('session', { ...conn.info! });
      },
      sessionDown: (conn, reason) => {
        const id = conn.info!.id;
        this.reportBytes -= sessionReportBytes(conn.info!);
        countDown(this.sessionsByCredential, conn.info!.credentialId);
        if (this.sessionsById.get(id) === conn) this.sessionsById.delete(id);
        this.safeEmit('sessionClosed', id, reason);
      },
      tunnelUp: (t) => {
        this.reportBytes += tunnelReportBytes(t);
        countUp(this.tunnelsByAccount, t.accountId);
        countUp(this.tunnelsByCredential, credentialOf(t));
        this.tunnelsById.set(t.id, t);
        this.safeEmit('tunnel', t);
      },
      tunnelDown: (t, reason) => {
        this.reportBytes -= tunnelReportBytes(t);
        countDown(this.tunnelsByAccount, t.accountId);
        countDown(this.tunnelsByCredential, credentialOf(t));
        if (this.tunnelsById.get(t.id) === t) this.tunnelsById.delete(t.id);
        this.safeEmit('tunnelClosed', t.id, reason);
      },
      connectionGone: (conn) => {
        this.authenticated(conn);
        this.connections.delete(conn);
      },
    };

    this.server = tls.createServer({ cert: opts.tls.cert, key: opts.tls.key, minVersion: 'TLSv1.2', handshakeTimeout: 10_000 });
    this.server.on('connection', (sock: net.Socket) => {
      this.sockets.add(sock);
      sock.once('close', () => this.sockets.delete(sock));
    });
    this.server.on('secureConnection', (sock: tls.TLSSocket) => {
      if (this.closing) {
        sock.destroy();
        return;
      }
      const ip = remoteIp(sock);
      const fromIp = this.unauthenticatedByIp.get(ip) ?? 0;
      if (this.unauthenticated.size >= MAX_UNAUTHENTICATED || fromIp >= MAX_UNAUTHENTICATED_PER_IP) {
        this.warnCapped({ ip, unauthenticated: this.unauthenticated.size, fromIp }, 'agent connection closed: too many connections have not authenticated yet');
        sock.destroy();
        return;
      }
      sock.setNoDelay(true);
      sock.setKeepAlive(true, 30_000);
      const conn = new AgentConnection(this.host, sock);
      this.connections.add(conn);
      // A connection whose session ended while it was being set up has already been let go.
      if (!this.connections.has(conn)) return;
      this.unauthenticated.set(conn, ip);
      countUp(this.unauthenticatedByIp, ip);
    });
    this.server.on('tlsClientError', (err: Error, sock: tls.TLSSocket) => {
      this.log.debug({ err: err.message, ip: sock.remoteAddress }, 'agent TLS handshake failed');
    });
    this.server.on('error', (err) => this.log.error({ err }, 'agent listener error'));
  }

  /** Starts accepting agents; resolves with the bound port (pass 0 for any free port). */
  listen(port: number, host?: string): Promise<number> {
    return new Promise((resolve, reject) => {
      const onError = (err: Error) => reject(err);
      this.server.once('error', onError);
      this.server.listen(port, host, () => {
        this.server.off('error', onError);
        resolve((this.server.address() as net.AddressInfo).port);
      });
    });
  }

  /**
   * Stops listening, sends GOAWAY on every session (emitting tunnelClosed/sessionClosed), then
   * waits for the agents to hang up (cutting off any that do not within 2 s).
   */
  close(): Promise<void> {
    if (this.closing) return this.closing;
    this.closing = (async () => {
      const stopped = new Promise<void>((resolve) => this.server.close(() => resolve()));
      for (const conn of [...this.connections]) conn.close('the ingress is shutting down');
      const deadline = Date.now() + CLOSE_GRACE_MS;
      while (this.sockets.size > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
      for (const s of this.sockets) s.destroy();
      await stopped;
    })();
    return this.closing;
  }

  /** Closes (GOAWAY) every session of a credential, e.g. when it is revoked; returns how many. */
  closeSessionsOfCredential(credentialId: string, reason: string): number {
    let n = 0;
    for (const conn of [...this.sessionsById.values()]) {
      if (conn.identity?.credentialId !== credentialId) continue;
      conn.close(reason);
      n++;
    }
    return n;
  }

  /**
   * Stops local tunnel `id` from the server's side: StopTunnel (type 9) with `message` and
   * `errorCode` (e.g. `ERR_WARREN_1100`) goes to its agent, which is not waited for, and the
   * tunnel is closed here at once (`tunnelClosed`), as an Unbind would close it. Its session
   * stays up. False when no such tunnel is live on this node.
   */
  stopTunnel(id: string, message: string, errorCode: string): boolean {
    const t = this.tunnelsById.get(id);
    return t ? t.connection.stopTunnel(t, message, errorCode) : false;
  }

  /**
   * After a config change: every authenticated session whose credential's ACL (`aclOf`; undefined
   * for a credential that is gone, which {@link closeSessionsOfCredential} deals with) differs from
   * the one it holds takes the new one, so that its later Binds are checked against it, and its
   * tunnels the new ACL no longer allows are stopped (StopTunnel, ERR_WARREN_1100). Sessions stay
   * up. Returns how many tunnels were stopped.
   */
  applyCredentialAcls(aclOf: (credentialId: string) => readonly string[] | undefined): number {
    let stopped = 0;
    for (const conn of [...this.connections]) {
      const identity = conn.identity;
      if (!identity) continue;
      const acl = aclOf(identity.credentialId);
      if (acl === undefined || sameStrings(acl, identity.acl)) continue;
      stopped += conn.updateAcl(acl);
    }
    return stopped;
  }

  sessions(): DpAgentSession[] {
    return [...this.sessionsById.values()].map((c) => ({ ...c.info! }));
  }

  /** Upper bound of what the live sessions and tunnels take up in a full sync to the control plane. */
  get reportedBytes(): number {
    return this.reportBytes;
  }

  tunnels(): LocalTunnel[] {
    return [...this.tunnelsById.values()];
  }

  getTunnel(id: string): LocalTunnel | undefined {
    return this.tunnelsById.get(id);
  }

  /** Without a `checkBind`: a hostname is shared only between pooled tunnels of one account on this node. */
  private defaultCheckBind(req: BindRequest): string | null {
    for (const t of this.tunnelsById.values()) {
      if (t.hostname !== req.hostname) continue;
      if (t.accountId !== req.accountId) return `the hostname ${req.hostname} is in use by another account (ERR_WARREN_4101)`;
      if (!t.poolingEnabled || !req.poolingEnabled) return `the endpoint ${req.hostname} is already online; start both with pooling enabled to share it (ERR_WARREN_4101)`;
    }
    return null;
  }

  /** `conn` no longer waits to authenticate (it did, or it is gone). */
  private authenticated(conn: AgentConnection): void {
    const ip = this.unauthenticated.get(conn);
    if (ip === undefined) return;
    this.unauthenticated.delete(conn);
    countDown(this.unauthenticatedByIp, ip);
  }

  /** Node-level refusals come in floods: a warning a minute, with the count since the last one. */
  /** Drops the start buckets of credentials without sessions that have refilled (bounded by the credentials active lately). */
  private sweepStartBuckets(): void {
    const now = performance.now();
    if (now - this.lastStartSweep < START_BUCKET_SWEEP_MS) return;
    this.lastStartSweep = now;
    for (const buckets of [this.startsByCredential, this.policyBytesByCredential]) {
      for (const [credentialId, b] of buckets) if (!this.sessionsByCredential.has(credentialId) && b.full()) buckets.delete(credentialId);
    }
  }

  private warnCapped(fields: Record<string, unknown>, msg: string): void {
    this.capRefusals++;
    const now = Date.now();
    if (now - this.capWarnedAt < 60_000) return;
    this.capWarnedAt = now;
    this.log.warn({ ...fields, refused: this.capRefusals }, msg);
    this.capRefusals = 0;
  }

  /** A throwing listener must not break the agent session that triggered the event. */
  private safeEmit<K extends keyof AgentServerEvents>(event: K, ...args: AgentServerEvents[K]): void {
    try {
      (this.emit as (e: K, ...a: AgentServerEvents[K]) => boolean)(event, ...args);
    } catch (err) {
      this.log.error({ err, event }, 'AgentServer event listener threw');
    }
  }
}
