import { EventEmitter } from 'node:events';
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import type { Logger } from 'pino';
import { createLogger, type DpAgentSession, type DpTunnel } from '@warren/shared';
import { AgentConnection, MAX_SAFE_STREAMS, type ConnectionHost, type LocalTunnelImpl } from './agent-connection.js';
import { ResumeTokens } from './resume-tokens.js';

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
   * `code` is 'STREAM_CAP' when the session is at its cap, 'SESSION_CLOSED' when the session or
   * the tunnel is gone.
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
  /** Domain for Bind requests without a hostname/domain: `<random>.<defaultDomain>`; default 'warren.localhost'. */
  defaultDomain?: string;
  /** Builds the public URL of a Bind tunnel, e.g. (proto 'https', 'app.test') → 'https://app.test:8443'. Default `${proto}://${hostname}`. */
  publicUrl?(proto: string, hostname: string): string;
  /** Default 500; at most 505 (the SDK's session dies past 512 streams, its own included). */
  maxStreamsPerSession?: number;
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
    readonly code: 'STREAM_CAP' | 'SESSION_CLOSED',
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

/** How long `close()` waits for agents to hang up after GOAWAY before cutting them off. */
const CLOSE_GRACE_MS = 2_000;

export class AgentServer extends EventEmitter<AgentServerEvents> {
  private readonly log: Logger;
  private readonly server: tls.Server;
  private readonly host: ConnectionHost;
  private readonly connections = new Set<AgentConnection>();
  private readonly sockets = new Set<net.Socket>();
  private readonly sessionsById = new Map<string, AgentConnection>();
  private readonly tunnelsById = new Map<string, LocalTunnelImpl>();
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
      settings: { defaultDomain, maxStreams, heartbeatIntervalMs: opts.heartbeatIntervalMs, heartbeatToleranceMs: opts.heartbeatToleranceMs },
      authenticate: (token) => opts.authenticate(token),
      checkBind: (req) => checkBind(req),
      publicUrl: (proto, hostname) => publicUrl(proto, hostname),
      sessionById: (id) => this.sessionsById.get(id),
      tunnelById: (id) => this.tunnelsById.get(id),
      sessionUp: (conn) => {
        this.sessionsById.set(conn.info!.id, conn);
        this.safeEmit('session', { ...conn.info! });
      },
      sessionDown: (conn, reason) => {
        const id = conn.info!.id;
        if (this.sessionsById.get(id) === conn) this.sessionsById.delete(id);
        this.safeEmit('sessionClosed', id, reason);
      },
      tunnelUp: (t) => {
        this.tunnelsById.set(t.id, t);
        this.safeEmit('tunnel', t);
      },
      tunnelDown: (t, reason) => {
        if (this.tunnelsById.get(t.id) === t) this.tunnelsById.delete(t.id);
        this.safeEmit('tunnelClosed', t.id, reason);
      },
      connectionGone: (conn) => this.connections.delete(conn),
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
      sock.setNoDelay(true);
      sock.setKeepAlive(true, 30_000);
      this.connections.add(new AgentConnection(this.host, sock));
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

  sessions(): DpAgentSession[] {
    return [...this.sessionsById.values()].map((c) => ({ ...c.info! }));
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

  /** A throwing listener must not break the agent session that triggered the event. */
  private safeEmit<K extends keyof AgentServerEvents>(event: K, ...args: AgentServerEvents[K]): void {
    try {
      (this.emit as (e: K, ...a: AgentServerEvents[K]) => boolean)(event, ...args);
    } catch (err) {
      this.log.error({ err, event }, 'AgentServer event listener threw');
    }
  }
}
