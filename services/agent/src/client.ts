import { EventEmitter } from 'node:events';
import tls from 'node:tls';
import type { Logger } from 'pino';
import {
  answerHeartbeats,
  createLogger,
  HeartbeatSender,
  LivenessTimer,
  MuxSession,
  Backoff,
  readJsonValue,
  readProxyHeader,
  readStreamType,
  rpcCall,
  StreamType,
  writeRpcReply,
  type AuthMessage,
  type AuthResponse,
  type BindMessage,
  type BindResponse,
  type LabelTunnelMessage,
  type LabelTunnelResponse,
  type MuxCloseInfo,
  type MuxStream,
} from '@warren/shared';
import { forwardStream, parseForwardTarget, speaksHttp, type ForwardTarget, type UpstreamTls } from './forward.js';

export const AGENT_VERSION = '0.1.0';

/**
 * warren-agent's client side of the agent protocol (agent-protocol.md), built on our muxado:
 * TLS + one muxado session, a heartbeat stream opened before Auth (as the SDK does), Auth,
 * tunnels (StartTunnelWithLabel or Bind), proxy streams forwarded to local services, and
 * automatic reconnects that resume the session id and every tunnel id.
 */

export interface AgentClientOptions {
  /** `host:port` of the ingress agent listener. */
  serverAddr: string;
  authtoken: string;
  /** PEM of the CA that signed the server certificate; default: the system CAs. */
  ca?: string | Buffer;
  metadata?: string;
  heartbeatIntervalMs?: number;
  heartbeatToleranceMs?: number;
  /** Reconnect after the session is lost (default true). */
  reconnect?: boolean;
  /** Jittered exponential backoff between reconnect attempts. Defaults 250 ms → 10 s. */
  backoff?: { initialMs?: number; maxMs?: number };
  /** TLS connect + Auth deadline per attempt (default 15 s). */
  connectTimeoutMs?: number;
  /**
   * On `close()`, how long the connections being forwarded may take to finish after the tunnels
   * are unbound (no new ones arrive), before the session is closed under them (ms; default
   * {@link DRAIN_MS}; 0: close at once). The whole of `close()` keeps to it: the Unbinds (at most
   * 2 s), the drain and the wait for the server to hang up after GOAWAY (at most 2 s) share it,
   * each given at least 250 ms, so `close()` takes at most `drainMs` + 250 ms, or 500 ms when
   * `drainMs` is below that.
   */
  drainMs?: number;
  /**
   * PEM of the CA that signed the certificate of an https:// or tls:// local service (instead of
   * the system CAs); one TLS context is built from it and shared by every connection.
   */
  upstreamCa?: string | Buffer;
  /** false: do not check the certificate of an https:// or tls:// local service (default true). */
  upstreamTlsVerify?: boolean;
  log?: Logger;
}

/** Default of {@link AgentClientOptions.drainMs}. */
export const DRAIN_MS = 10_000;
/** `close()`'s Unbinds and its wait for the server's hang-up: each gets what is left of `drainMs`, within these bounds. */
const CLOSE_STEP_MIN_MS = 250;
const CLOSE_STEP_MAX_MS = 2_000;
/**
 * The server closes a tunnel's idle kept-alive streams right after its Unbind: streams still open
 * this long after the Unbinds carry something in progress ('draining' is emitted then, not before).
 */
const DRAIN_QUIET_MS = 250;

export interface LabeledTunnelSpec {
  kind: 'labeled';
  labels: Record<string, string>;
  /** Port, host:port or URL of the local service. */
  forwardsTo: string;
  metadata?: string;
}

export interface BindTunnelSpec {
  kind: 'bind';
  /** Public scheme (default https). */
  proto?: 'http' | 'https';
  /** Hostname to serve; the server picks one when absent. */
  domain?: string;
  forwardsTo: string;
  /** Share the URL with other tunnels (endpoint pooling). */
  pooling?: boolean;
  /** `['internal']` to serve inside ingress only; default public. */
  bindings?: string[];
  metadata?: string;
  /** The endpoint's traffic policy document (YAML or JSON), run by the ingress; none when absent. */
  trafficPolicy?: string;
}

export type TunnelSpec = LabeledTunnelSpec | BindTunnelSpec;

export interface ClientTunnel {
  id: string;
  /** Bind tunnels: the public URL; labeled: ''. */
  url: string;
  /** `labeled`, `http` or `https`. */
  proto: string;
  labels: Record<string, string>;
  /** Normalised local target, e.g. `http://localhost:8080`. */
  forwardsTo: string;
  spec: TunnelSpec;
}

export interface AgentClientEvents {
  /** Authenticated (first connect and every reconnect). */
  connected: [sessionId: string];
  /** A tunnel is online (after start, and again after each reconnect). */
  tunnel: [tunnel: ClientTunnel];
  /** A tunnel could not be resumed after a reconnect, or the server stopped it. */
  tunnelLost: [tunnelId: string, reason: string];
  /** The session was lost; a reconnect follows unless disabled. */
  disconnected: [reason: string];
  reconnecting: [info: { attempt: number; delayMs: number; error?: string }];
  /** Final: closed by us, or the server refused us on reconnect (reason says which). */
  closed: [reason: string, fatal: boolean];
  /** A proxied connection could not reach the local service. */
  forwardError: [tunnelId: string, error: Error];
  /** `close()` waits for `open` connections in progress to finish, at most `ms` more (what is left of `drainMs`). */
  draining: [open: number, drainMs: number];
}

/** The server answered an RPC with `{"Error": …}` (e.g. unknown authtoken, refused Bind). */
export class AgentRpcError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'AgentRpcError';
  }
}

interface TunnelState {
  tunnel: ClientTunnel;
  target: ForwardTarget;
  /** Proof of ownership for resuming the id (Bind Extra.Token / our labeled extension). */
  token: string;
}

/** Resolves after `ms`, or at once when `signal` aborts (a wait before retrying, cut short by a close or a signal). */
export const sleep = (ms: number, signal: AbortSignal) =>
  new Promise<void>((resolve) => {
    if (signal.aborted) return resolve();
    const t = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
    function done() {
      clearTimeout(t);
      signal.removeEventListener('abort', done);
      resolve();
    }
  });

/**
 * A refusal that says to try again: after the ms it names (a start rate limit, ERR_WARREN_8001),
 * or after half a second (a node without its configuration yet, ERR_WARREN_7008); else null.
 */
export function retryHintMs(message: string): number | null {
  const m = /retry in (\d+) ms \(ERR_WARREN_8001\)/.exec(message);
  if (m) return Number(m[1]);
  return /retry shortly \(ERR_WARREN_7008\)/.test(message) ? 500 : null;
}

/** Tries a tunnel's resume refused for a while (see {@link retryHintMs}) this often at most before giving it up. */
const RESUME_RETRIES = 10;

export class AgentClient extends EventEmitter<AgentClientEvents> {
  private readonly opts: AgentClientOptions;
  private readonly log: Logger;
  private readonly host: string;
  private readonly port: number;
  private readonly intervalMs: number;
  private readonly toleranceMs: number;
  private mux: MuxSession | null = null;
  private heartbeat: HeartbeatSender | null = null;
  private liveness: LivenessTimer | null = null;
  private sessionId = '';
  private cookie = '';
  private readonly tunnels = new Map<string, TunnelState>();
  /** Proxy streams open now (every tunnel): what `close()` lets finish before it hangs up. */
  private readonly proxyStreams = new Set<MuxStream>();
  /** Set while `close()` waits for {@link proxyStreams} to empty. */
  private drained: (() => void) | null = null;

  /** Tunnels this client holds now (started, not closed, lost or stopped by the server). */
  get tunnelCount(): number {
    return this.tunnels.size;
  }
  private closing = false;
  private readonly stop = new AbortController();
  private readonly upstreamTls: UpstreamTls;

  constructor(opts: AgentClientOptions) {
    super();
    const m = /^(\[[^\]]+\]|[^:]+):(\d+)$/.exec(opts.serverAddr);
    if (!m) throw new Error(`invalid server address ${JSON.stringify(opts.serverAddr)}: use host:port`);
    if (!opts.authtoken) throw new Error('an authtoken is required');
    this.host = m[1]!.replace(/^\[|\]$/g, '');
    this.port = Number(m[2]);
    this.opts = opts;
    this.upstreamTls = { verify: opts.upstreamTlsVerify ?? true, secureContext: opts.upstreamCa ? tls.createSecureContext({ ca: opts.upstreamCa }) : undefined };
    this.intervalMs = opts.heartbeatIntervalMs ?? 10_000;
    this.toleranceMs = opts.heartbeatToleranceMs ?? 15_000;
    this.log = opts.log ?? createLogger('agent');
  }

  /** The current session id (`ts_…`), '' before the first Auth. */
  get session(): string {
    return this.sessionId;
  }

  get connected(): boolean {
    return this.mux !== null && !this.mux.closed;
  }

  /** Tunnels currently held (online or waiting for a reconnect). */
  list(): ClientTunnel[] {
    return [...this.tunnels.values()].map((s) => s.tunnel);
  }

  /**
   * Connects and authenticates once. Rejects with {@link AgentRpcError} when the server refuses
   * the authtoken, or with the network error; no retry here (see the CLI for that).
   */
  async connect(): Promise<string> {
    if (this.closing) throw new Error('the client is closed');
    await this.establish();
    this.emit('connected', this.sessionId);
    return this.sessionId;
  }

  startLabeledTunnel(labels: Record<string, string>, forwardsTo: string, opts: { metadata?: string } = {}): Promise<ClientTunnel> {
    return this.start({ kind: 'labeled', labels, forwardsTo, metadata: opts.metadata });
  }

  bind(spec: Omit<BindTunnelSpec, 'kind'>): Promise<ClientTunnel> {
    return this.start({ kind: 'bind', ...spec });
  }

  /** Starts a tunnel on the current session; rejects with {@link AgentRpcError} when refused. */
  async start(spec: TunnelSpec): Promise<ClientTunnel> {
    const mux = this.requireSession();
    const target = parseForwardTarget(spec.forwardsTo);
    const state = await this.open(mux, spec, target, null);
    this.tunnels.set(state.tunnel.id, state);
    this.emit('tunnel', state.tunnel);
    return state.tunnel;
  }

  /** Stops one tunnel (Unbind). */
  async unbind(id: string): Promise<void> {
    if (!this.tunnels.delete(id)) return;
    if (this.mux && !this.mux.closed) await this.call(this.mux, StreamType.Unbind, { Id: id }).catch(() => {});
  }

  /** Unbinds every tunnel, sends GOAWAY and closes; no reconnect afterwards. */
  async close(): Promise<void> {
    if (this.closing) return;
    this.closing = true;
    this.stop.abort();
    const mux = this.mux;
    if (mux && !mux.closed) {
      // One deadline for the whole close: the Unbinds, the drain and the server's hang-up after
      // GOAWAY share `drainMs`, so a stalled server cannot stretch a SIGTERM past what the
      // operator allowed (beyond CLOSE_STEP_MIN_MS per step when the budget is spent).
      const deadline = performance.now() + (this.opts.drainMs ?? DRAIN_MS);
      const step = () => Math.min(CLOSE_STEP_MAX_MS, Math.max(CLOSE_STEP_MIN_MS, deadline - performance.now()));
      const unbindMs = step();
      await Promise.all([...this.tunnels.keys()].map((id) => this.call(mux, StreamType.Unbind, { Id: id }, unbindMs).catch(() => {})));
      await this.drain(mux, deadline);
      const gone = new Promise<void>((resolve) => (mux.socket.destroyed ? resolve() : mux.socket.once('close', () => resolve())));
      mux.goAway(0, 'agent closed');
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([gone, new Promise((r) => (timer = setTimeout(r, step())))]);
      clearTimeout(timer);
    }
    this.teardown();
    this.tunnels.clear();
    this.emit('closed', 'closed by the agent', false);
  }

  /**
   * After the Unbinds: the server routes nothing more here and closes the idle streams, so what is
   * left are requests (or TCP connections) in progress. Waits for them until `deadline` (what is
   * left of `drainMs` after the Unbinds), since GOAWAY ends every stream of the session at once.
   */
  private drain(mux: MuxSession, deadline: number): Promise<void> {
    const ms = Math.round(deadline - performance.now());
    if (this.proxyStreams.size === 0 || ms <= 0 || mux.closed) return Promise.resolve();
    return new Promise<void>((resolve) => {
      const done = () => {
        clearTimeout(timer);
        clearTimeout(quiet);
        mux.off('close', done);
        this.drained = null;
        resolve();
      };
      const timer = setTimeout(() => {
        this.log.warn({ open: this.proxyStreams.size, drainMs: ms }, 'connections still open after the drain timeout; closing them');
        done();
      }, ms);
      const quiet = setTimeout(() => this.emit('draining', this.proxyStreams.size, Math.max(0, Math.round(deadline - performance.now()))), Math.min(DRAIN_QUIET_MS, ms));
      this.drained = done;
      mux.once('close', done);
    });
  }

  // ---- session ------------------------------------------------------------------------------

  private requireSession(): MuxSession {
    if (!this.mux || this.mux.closed) throw new Error('not connected');
    return this.mux;
  }

  private async establish(): Promise<void> {
    const timeoutMs = this.opts.connectTimeoutMs ?? 15_000;
    const socket = await new Promise<tls.TLSSocket>((resolve, reject) => {
      const s = tls.connect({
        host: this.host,
        port: this.port,
        ca: this.opts.ca,
        // SNI only for DNS names, like the SDK (agent-protocol.md §1).
        servername: /^[\d.]+$|:/.test(this.host) ? undefined : this.host,
        minVersion: 'TLSv1.2',
      } as tls.ConnectionOptions);
      const timer = setTimeout(() => s.destroy(new Error(`timed out connecting to ${this.opts.serverAddr}`)), timeoutMs);
      const onError = (err: Error) => {
        clearTimeout(timer);
        reject(err);
      };
      s.once('error', onError);
      s.once('secureConnect', () => {
        clearTimeout(timer);
        s.off('error', onError);
        resolve(s);
      });
    });
    socket.setNoDelay(true);
    socket.setKeepAlive(true, 30_000);
    const mux = new MuxSession(socket, { client: true });
    // Heartbeats first, before Auth, as the SDK does; an echo or a server beat proves liveness.
    const liveness = new LivenessTimer(this.intervalMs + this.toleranceMs, () => mux.destroy('heartbeat timeout'));
    const alive = () => liveness.beat();
    mux.on('stream', (st) => void this.onStream(st, alive));
    const heartbeat = new HeartbeatSender(mux, { intervalMs: this.intervalMs, immediate: true, onBeat: alive });
    mux.once('close', (info) => {
      liveness.stop();
      heartbeat.stop();
      this.onSessionClosed(mux, info);
    });

    const auth: AuthMessage = {
      Version: ['2'],
      ClientId: this.sessionId,
      Extra: {
        OS: process.platform,
        Arch: process.arch,
        AuthToken: this.opts.authtoken,
        Version: AGENT_VERSION,
        Hostname: '',
        UserAgent: `warren-agent/${AGENT_VERSION}`,
        Metadata: this.opts.metadata ?? '',
        Cookie: this.cookie,
        HeartbeatInterval: this.intervalMs * 1e6,
        HeartbeatTolerance: this.toleranceMs * 1e6,
        UpdateUnsupportedError: 'warren-agent does not update itself',
        StopUnsupportedError: 'warren-agent does not stop on request',
        RestartUnsupportedError: 'warren-agent does not restart on request',
        ClientType: 'warren-agent',
      },
    };
    let reply: AuthResponse;
    try {
      reply = (await this.call(mux, StreamType.Auth, auth, timeoutMs)) as AuthResponse;
    } catch (err) {
      if (err instanceof AgentRpcError) mux.goAway(0, 'authentication failed');
      else mux.destroy('auth failed');
      throw err;
    }
    this.sessionId = reply.ClientId;
    this.cookie = reply.Extra?.Cookie ?? '';
    this.mux = mux;
    this.heartbeat = heartbeat;
    this.liveness = liveness;
  }

  private onSessionClosed(mux: MuxSession, info: MuxCloseInfo): void {
    if (mux !== this.mux) return; // an attempt that never became the session
    this.mux = null;
    this.heartbeat = null;
    this.liveness = null;
    if (this.closing) return;
    const reason = info.by === 'remote' ? `the server closed the session${info.message ? `: ${info.message}` : ''}` : info.message;
    this.log.warn({ reason }, 'agent session lost');
    this.emit('disconnected', reason);
    if (this.opts.reconnect === false) {
      this.closing = true;
      this.emit('closed', reason, true);
      return;
    }
    void this.reconnectLoop();
  }

  private async reconnectLoop(): Promise<void> {
    const backoff = new Backoff(this.opts.backoff?.initialMs ?? 250, this.opts.backoff?.maxMs ?? 10_000);
    let lastError: string | undefined;
    for (let attempt = 0; !this.closing; attempt++) {
      const delayMs = Math.round(backoff.next());
      this.emit('reconnecting', { attempt: attempt + 1, delayMs, error: lastError });
      await sleep(delayMs, this.stop.signal);
      if (this.closing) return;
      try {
        await this.establish();
      } catch (err) {
        if (err instanceof AgentRpcError) {
          // The server no longer accepts our authtoken: retrying will not help.
          this.closing = true;
          this.teardown();
          this.emit('closed', err.message, true);
          return;
        }
        lastError = (err as Error).message;
        continue;
      }
      if (this.closing) {
        this.teardown();
        return;
      }
      this.emit('connected', this.sessionId);
      await this.resumeTunnels();
      return;
    }
  }

  /** Re-opens every tunnel on the new session under its old id (proved by its token). */
  private async resumeTunnels(): Promise<void> {
    const mux = this.mux;
    if (!mux) return;
    for (const [id, state] of [...this.tunnels]) {
      try {
        let next: TunnelState | null = null;
        for (let attempt = 0; next === null; attempt++) {
          try {
            next = await this.open(mux, state.tunnel.spec, state.target, state);
          } catch (err) {
            // Refused for its rate (many agents of one authtoken reconnecting to a node at once)
            // or by a node still without its configuration: tried again when the server says.
            const hint = err instanceof AgentRpcError ? retryHintMs(err.message) : null;
            if (hint !== null && attempt < RESUME_RETRIES) {
              this.log.info({ tunnel: id, retryInMs: hint }, 'tunnel resume refused for now; trying again');
              await sleep(Math.min(Math.max(hint, 10), 10_000), this.stop.signal);
              if (this.closing || this.mux !== mux || mux.closed) return;
              continue;
            }
            // The server does not know the old id any more (e.g. another ingress with another
            // key): start the tunnel afresh under a new id rather than lose it.
            if (!(err instanceof AgentRpcError) || !/cannot resume tunnel/.test(err.message)) throw err;
            this.log.warn({ tunnel: id, err: err.message }, 'could not resume the tunnel id; starting it anew');
            next = await this.open(mux, state.tunnel.spec, state.target, null);
          }
        }
        if (next.tunnel.id !== id) this.tunnels.delete(id);
        this.tunnels.set(next.tunnel.id, next);
        this.emit('tunnel', next.tunnel);
      } catch (err) {
        if (!(err instanceof AgentRpcError)) return; // the session died again; the next reconnect retries
        this.tunnels.delete(id);
        this.emit('tunnelLost', id, err.message);
      }
    }
  }

  private teardown(): void {
    this.liveness?.stop();
    this.heartbeat?.stop();
    if (this.mux && !this.mux.closed) this.mux.destroy('client closed');
    this.mux = null;
  }

  // ---- RPCs ---------------------------------------------------------------------------------

  private async call(mux: MuxSession, type: number, req: unknown, timeoutMs = 15_000): Promise<unknown> {
    const reply = (await rpcCall(mux, type, req, { timeoutMs })) as { Error?: unknown } | null;
    if (reply && typeof reply === 'object' && typeof reply.Error === 'string' && reply.Error !== '') throw new AgentRpcError(reply.Error);
    return reply;
  }

  /** One StartTunnelWithLabel or Bind; `prev` resumes an existing tunnel's id. */
  private async open(mux: MuxSession, spec: TunnelSpec, target: ForwardTarget, prev: TunnelState | null): Promise<TunnelState> {
    if (spec.kind === 'labeled') {
      const req: LabelTunnelMessage = { Labels: spec.labels, ForwardsTo: target.url, ForwardsProto: '', Metadata: spec.metadata ?? '' };
      if (prev) {
        req.Id = prev.tunnel.id;
        req.Token = prev.token;
      }
      const r = (await this.call(mux, StreamType.StartTunnelWithLabel, req)) as LabelTunnelResponse;
      return { tunnel: { id: r.Id, url: '', proto: 'labeled', labels: { ...spec.labels }, forwardsTo: target.url, spec }, target, token: r.Token ?? '' };
    }
    const proto = spec.proto ?? 'https';
    const req: BindMessage = {
      Id: prev?.tunnel.id ?? '',
      Proto: proto,
      ForwardsTo: target.url,
      ForwardsProto: '',
      // TrafficPolicy as the SDK sends it: the document as a string, null when none.
      Opts: { Domain: spec.domain ?? '', Hostname: '', Auth: '', Subdomain: '', HostHeaderRewrite: false, LocalUrlScheme: null, ProxyProto: 0, TrafficPolicy: spec.trafficPolicy || null },
      Extra: { Token: prev?.token ?? '', IPPolicyRef: '', Metadata: spec.metadata ?? '', Bindings: spec.bindings ?? [], PoolingEnabled: spec.pooling === true },
    };
    const r = (await this.call(mux, StreamType.Bind, req)) as BindResponse;
    return { tunnel: { id: r.Id, url: r.URL, proto: r.Proto || proto, labels: {}, forwardsTo: target.url, spec }, target, token: r.Extra?.Token ?? '' };
  }

  // ---- server-opened streams ----------------------------------------------------------------

  private async onStream(st: MuxStream, alive: () => void): Promise<void> {
    let type: number;
    try {
      type = await readStreamType(st, 10_000);
    } catch {
      st.destroy();
      return;
    }
    switch (type) {
      case StreamType.Heartbeat:
        answerHeartbeats(st, alive);
        return;
      case StreamType.Proxy:
        return this.onProxyStream(st);
      case StreamType.StopTunnel:
        return this.onStopTunnel(st);
      case StreamType.Restart:
      case StreamType.Stop:
      case StreamType.Update:
        try {
          await readJsonValue(st, { timeoutMs: 10_000 });
          writeRpcReply(st, { Error: 'not supported by warren-agent' });
        } catch {
          st.destroy();
        }
        return;
      default:
        st.destroy();
    }
  }

  private async onProxyStream(st: MuxStream): Promise<void> {
    this.proxyStreams.add(st);
    st.once('close', () => {
      this.proxyStreams.delete(st);
      if (this.proxyStreams.size === 0) this.drained?.();
    });
    let header;
    try {
      header = await readProxyHeader(st);
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, 'bad proxy stream header');
      st.destroy();
      return;
    }
    const state = this.tunnels.get(header.Id);
    if (!state) {
      st.destroy();
      return;
    }
    forwardStream(st, state.target, speaksHttp(header, state.tunnel.proto), (err) => {
      this.log.warn({ tunnel: header.Id, target: state.target.url, err: err.message }, 'could not reach the local service');
      this.emit('forwardError', header.Id, err);
    }, this.upstreamTls);
  }

  private async onStopTunnel(st: MuxStream): Promise<void> {
    try {
      const req = (await readJsonValue(st, { timeoutMs: 10_000 })) as { Id?: unknown; Message?: unknown } | null;
      const id = typeof req?.Id === 'string' ? req.Id : '';
      writeRpcReply(st, {});
      if (this.tunnels.delete(id)) this.emit('tunnelLost', id, typeof req?.Message === 'string' && req.Message ? req.Message : 'stopped by the server');
    } catch {
      st.destroy();
    }
  }
}
