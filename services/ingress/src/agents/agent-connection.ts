import type tls from 'node:tls';
import type { Logger } from 'pino';
import {
  parseIPv6,
  answerHeartbeats,
  encodeProxyPrelude,
  encodeStopTunnel,
  HeartbeatSender,
  isId,
  LivenessTimer,
  MuxError,
  MuxErrorCode,
  MuxSession,
  muxErrorCodeName,
  newId,
  MAX_TRAFFIC_POLICY_BYTES,
  readJsonValue,
  readStreamType,
  StreamReadError,
  StreamType,
  writeRpcReply,
  type AuthResponse,
  type BindResponse,
  type DpAgentSession,
  type LabelTunnelResponse,
  type MuxCloseInfo,
  type MuxStream,
  type DrainOnDestroy,
  type StopTunnelMessage,
} from '@warren/shared';
import { aclAllowsHostname, aclAllowsLabels } from './acl.js';
import { bindTrafficPolicyBytes, parseAuth, parseBind, parseLabelTunnel } from './requests.js';
import type { ResumeTokens } from './resume-tokens.js';
import type { EndpointPolicy, EndpointPolicyRequest, EndpointPolicyResult } from '../policy/endpoint.js';
import { remoteIp } from '../http/client-address.js';
import { TunnelStreamError, type AgentIdentity, type BindRequest, type LocalTunnel, type ProxyHeaderInit, type TunnelStream } from './server.js';

/**
 * Most proxy streams one session may have open. The SDK's muxado accepts 512 streams in all and
 * its session dies on the 513th SYN (agent-protocol.md §2, the 512-stream hazard); it holds its
 * own heartbeat stream and one or two RPC streams, we hold a heartbeat stream too, and a
 * StopTunnel stream may take one slot past the cap ({@link STOP_TUNNEL_RESERVED_SLOTS}):
 * 505 + 1 + 1 + 3 = 510.
 */
export const MAX_SAFE_STREAMS = 505;
/**
 * StopTunnel streams (server → agent, type 9) may take this many slots past the session's stream
 * cap, so that a tunnel can be stopped while proxy streams fill the session; beyond it they wait.
 * Proxy streams never use it (they stop at the cap, StopTunnel streams counted).
 */
export const STOP_TUNNEL_RESERVED_SLOTS = 1;
/** StopTunnel streams one session has open at once (the SDK reads them one at a time in its accept loop); more wait their turn. */
export const MAX_STOP_TUNNEL_STREAMS = 4;
/**
 * How long a StopTunnel stream may stay open. The SDK answers nothing: it reads the request, closes
 * the listener and drops the stream, which FINs it; warren-agent answers `{}` and FINs. A peer that
 * does neither by then gets RST, and the stream's slot is held as a reset proxy stream's is.
 */
export const STOP_TUNNEL_TIMEOUT_MS = 5_000;
/** While StopTunnel streams wait for a free slot, they try again this often. */
const STOP_TUNNEL_RETRY_MS = 100;

/**
 * How long a finished proxy stream counts against the cap at least (see `lingering()`). Measured
 * with @ngrok/ngrok 1.7.0 under churn (700 workers, cap 500, Connection: close) on an idle host:
 * 0 ms kills the SDK's session, 20 ms already holds. A busy agent host needs longer than any
 * fixed time: there the slot is also held until the agent has echoed STREAM_RELEASE_BEATS of our
 * heartbeats sent after the stream finished.
 */
export const STREAM_LINGER_MS = 100;
/**
 * Heartbeats (sent after a proxy stream finished on our side) the agent must have echoed before
 * the stream's slot is reused. The SDK's reader handles our frames in order, so an echo means it
 * has passed our FIN to the stream's forwarding task, and the SDK's tasks have been running since;
 * a second round trip gives that task, which drops the stream, its turn too.
 */
export const STREAM_RELEASE_BEATS = 2;
/**
 * A proxy stream destroyed on our side before the agent's FIN (the public client gave up) is not
 * reset at once: the SDK would hold a reset stream until its upstream answers, and nothing on the
 * wire would say when, so its slot would be reused too early (one SYN past the SDK's 512 kills the
 * session). We FIN instead and discard what the agent still sends until its FIN, which then frees
 * the slot like any finished stream; RST once it sent this many more bytes, or after the liveness
 * window. A stream we reset before the agent's FIN keeps its slot for the liveness window.
 * Measured with @ngrok/ngrok 1.7.0 (cap 500, 600 clients each abandoning a request to a 2 s
 * upstream after 100 ms, 10 s): RST at once lost the session 1-2 times, and so did keeping a
 * reset stream's slot for the liveness window (2.5 s there) even with the RST sent only 0.5 s
 * after the abort (the SDK kept streams past its upstream's answer); FIN and waiting for the
 * agent's FIN: no loss, also with a 4 s upstream as long as the wait outlasts it.
 */
export const ABORT_DRAIN_MAX_BYTES = 256 * 1024;
/**
 * Slots of one session's stream cap one public client address may hold at once, as the ingress
 * sets it by default (MAX_STREAMS_PER_CLIENT). A slot counts against the address whose request
 * opened its stream until the slot is free again, the same moment the session's own count lets go
 * of it (open, finished and lingering, drained after an abort, held after a reset): without a
 * share, one client holding or aborting slow requests takes all `maxStreams` slots and every other
 * visitor of the tunnel gets 503 for as long as it keeps at it. 80 is some 13 times what a browser
 * opens to one host and leaves room for a NAT (and for the proxy bench's 64 connections from one
 * address); 6 addresses hold 480 of a 500-slot session, so 7 are needed to fill it.
 */
export const DEFAULT_MAX_STREAMS_PER_CLIENT = 80;
/** An agent must authenticate this soon after the TLS handshake. */
const AUTH_TIMEOUT_MS = 15_000;
/** A request must arrive this soon after its stream opens. */
const REQUEST_TIMEOUT_MS = 10_000;
/** RPC streams the agent leaves half-open after our reply are reset after this long. */
const RPC_LINGER_MS = 30_000;
/** The SDK opens one heartbeat stream; more than this is abuse. */
const MAX_HEARTBEAT_STREAMS = 2;
/** Concurrent agent-opened streams (heartbeat + sequential RPCs). */
const MAX_INBOUND_STREAMS = 32;
/** Largest RPC request read, in bytes of JSON. */
const MAX_RPC_REQUEST_BYTES = 64 * 1024;
/**
 * Largest Bind request of an authenticated session: room for a traffic policy at the API's limit
 * (`MAX_TRAFFIC_POLICY_BYTES`, 64 KiB), JSON-escaped (up to 6 bytes a byte), and the other fields.
 */
const MAX_BIND_REQUEST_BYTES = 64 * 1024 + 6 * MAX_TRAFFIC_POLICY_BYTES;
/** Bind requests of one session read at {@link MAX_BIND_REQUEST_BYTES} at once; others get the usual limit. */
const MAX_LARGE_RPC_READS = 2;
const SERVER_VERSION = 'warren/0.1.0';

const AUTH_FAILED = 'authentication failed: the agent authtoken is unknown or revoked (ERR_WARREN_1004)';
const NOT_AUTHENTICATED = 'the session is not authenticated: send Auth first (ERR_WARREN_1100)';
const INTERNAL = 'internal error (ERR_WARREN_9000)';

/** What a connection needs from the server that owns it. */
export interface ConnectionHost {
  readonly nodeId: string;
  readonly log: Logger;
  readonly tokens: ResumeTokens;
  readonly settings: {
    defaultDomain: string;
    maxStreams: number;
    /** Slots of `maxStreams` one client address may hold (MAX_STREAMS_PER_CLIENT; see {@link clientShareKey}). */
    maxStreamsPerClient: number;
    /** Tunnels one session may have at once (MAX_TUNNELS_PER_SESSION). */
    maxTunnelsPerSession: number;
    /** Tunnel starts (StartTunnelWithLabel, Bind) one session may make per second, on average (TUNNEL_STARTS_PER_SECOND_PER_SESSION). */
    tunnelStartsPerSecond: number;
    /** ... and at once, after a quiet spell (TUNNEL_START_BURST_PER_SESSION). */
    tunnelStartBurst: number;
    heartbeatIntervalMs: number | undefined;
    heartbeatToleranceMs: number | undefined;
    /** How long the streams of a tunnel the server stopped may still run before they are reset (ms). */
    stoppedTunnelDrainMs: number;
  };
  authenticate(token: string): AgentIdentity | null;
  checkBind(req: BindRequest): string | null;
  /** Compiles a Bind endpoint's traffic policy (`policy/endpoint.ts`), or the refusal. */
  endpointPolicy(req: EndpointPolicyRequest): EndpointPolicyResult;
  /**
   * Null when the node can take this session (`replacing`: the live one of the same id it
   * supersedes), else the refusal: its credential's session cap, or the node's report budget.
   */
  admitSession(s: DpAgentSession, replacing: AgentConnection | undefined): string | null;
  /**
   * Null when the node can take this tunnel of a session of `credentialId` (`replacing`: the live
   * tunnel of the same id it supersedes), else the refusal: a tunnel cap (node, account,
   * credential) or the report budget.
   */
  admitTunnel(t: TunnelFields, credentialId: string, replacing: LocalTunnelImpl | undefined): string | null;
  /**
   * The tunnel-start bucket all sessions of `credentialId` on this node share (at
   * `tunnelStartsPerSecond`, with the burst returned), so that reconnecting, or opening more
   * sessions, does not bring a fresh burst: it bounds a credential's churn on the node.
   */
  credentialStarts(credentialId: string): { bucket: TokenBucket; burst: number };
  /**
   * The credential's budget of traffic-policy bytes this node parses and compiles on Bind
   * (`POLICY_BYTES_PER_SECOND`, burst `POLICY_BYTES_BURST`), across its sessions.
   */
  credentialPolicyBytes(credentialId: string): TokenBucket;
  publicUrl(proto: string, hostname: string): string;
  sessionById(id: string): AgentConnection | undefined;
  tunnelById(id: string): LocalTunnelImpl | undefined;
  sessionUp(conn: AgentConnection): void;
  sessionDown(conn: AgentConnection, reason: string): void;
  tunnelUp(t: LocalTunnelImpl): void;
  tunnelDown(t: LocalTunnelImpl, reason: string): void;
  connectionGone(conn: AgentConnection): void;
}

type TunnelFields = Omit<LocalTunnel, 'openStream' | 'openStreams'>;

/**
 * A tunnel of a connected agent. Only the DpTunnel fields are own enumerable properties (the
 * session link is a private field), so `{ ...tunnel }` is a plain report.
 */
export class LocalTunnelImpl implements LocalTunnel {
  readonly id: string;
  readonly accountId: string;
  readonly sessionId: string;
  readonly proto: string;
  readonly labels: Record<string, string>;
  readonly publicUrl: string;
  readonly bindings: string[];
  readonly poolingEnabled: boolean;
  readonly forwardsTo: string;
  readonly metadata: string;
  readonly startedAt: string;
  readonly #conn: AgentConnection;
  readonly #hostname: string;
  readonly #trafficPolicy: EndpointPolicy | null;
  #closed = false;
  /** Its proxy streams open now: what a stop from the server's side ends after the drain. */
  readonly #streams = new Set<MuxStream>();

  constructor(conn: AgentConnection, fields: TunnelFields, hostname: string, trafficPolicy: EndpointPolicy | null = null) {
    this.id = fields.id;
    this.accountId = fields.accountId;
    this.sessionId = fields.sessionId;
    this.proto = fields.proto;
    this.labels = fields.labels;
    this.publicUrl = fields.publicUrl;
    this.bindings = fields.bindings;
    this.poolingEnabled = fields.poolingEnabled;
    this.forwardsTo = fields.forwardsTo;
    this.metadata = fields.metadata;
    this.startedAt = fields.startedAt;
    this.#conn = conn;
    this.#hostname = hostname;
    this.#trafficPolicy = trafficPolicy;
  }

  /** Bind endpoints: the compiled traffic policy (`Opts.TrafficPolicy`), or null. Not part of the report. */
  get trafficPolicy(): EndpointPolicy | null {
    return this.#trafficPolicy;
  }

  /** Bind tunnels: the bound hostname; labeled: ''. */
  get hostname(): string {
    return this.#hostname;
  }

  get closed(): boolean {
    return this.#closed;
  }

  get openStreams(): number {
    return this.#conn.proxyStreams;
  }

  /** Slots of its session's stream cap in use: open proxy streams and finished ones the agent may still hold. */
  get streamSlotsInUse(): number {
    return this.#conn.streamSlotsInUse;
  }

  /** The connection that carries this tunnel. */
  get connection(): AgentConnection {
    return this.#conn;
  }

  openStream(h: ProxyHeaderInit): Promise<TunnelStream> {
    try {
      return Promise.resolve(this.#conn.openProxyStream(this, h));
    } catch (err) {
      return Promise.reject(err as Error);
    }
  }

  openStreamSync(h: ProxyHeaderInit): TunnelStream {
    return this.#conn.openProxyStream(this, h);
  }

  /** @internal */
  markClosed(): void {
    this.#closed = true;
  }

  /** @internal A proxy stream of this tunnel was opened: tracked until it closes. */
  track(stream: MuxStream): void {
    this.#streams.add(stream);
    stream.once('close', () => this.#streams.delete(stream));
  }

  /** @internal Resets this tunnel's proxy streams still open; returns how many. */
  resetStreams(): number {
    const n = this.#streams.size;
    for (const s of this.#streams) s.destroy();
    this.#streams.clear();
    return n;
  }
}

/**
 * A token bucket: `burst` tokens at first and at most, refilled at `perSecond`. Two numbers per
 * session, whatever it does.
 */
export class TokenBucket {
  private tokens: number;
  private at: number;

  constructor(
    private readonly perSecond: number,
    private readonly burst: number,
    private readonly now: () => number = () => performance.now(),
  ) {
    this.tokens = burst;
    this.at = now();
  }

  private refill(): void {
    const t = this.now();
    this.tokens = Math.min(this.burst, this.tokens + ((t - this.at) * this.perSecond) / 1000);
    this.at = t;
  }

  /** Whether `n` tokens can be taken now. */
  available(n = 1): boolean {
    this.refill();
    return this.tokens >= n;
  }

  /** Takes `n` tokens (the bucket may go below zero only if called without {@link available}). */
  take(n = 1): void {
    this.refill();
    this.tokens -= n;
  }

  /** Whether it is back to its burst (as a new bucket would be). */
  full(): boolean {
    this.refill();
    return this.tokens >= this.burst;
  }

  /** Milliseconds until `n` tokens are there (0 when they are). */
  waitMs(n = 1): number {
    this.refill();
    return this.tokens >= n ? 0 : ((n - this.tokens) * 1000) / this.perSecond;
  }
}

function clampMs(v: number, min: number, max: number): number {
  return Math.min(max, Math.max(min, Math.round(v)));
}

/**
 * One agent connection: one TLS socket, one muxado session, one agent session `ts_…` once
 * authenticated (agent-protocol.md §1). Serves the agent's RPC streams, answers and sends
 * heartbeats, and opens proxy streams for its tunnels.
 */
export class AgentConnection {
  readonly mux: MuxSession;
  identity: AgentIdentity | null = null;
  /** Set once authenticated. */
  info: DpAgentSession | null = null;

  private readonly host: ConnectionHost;
  private log: Logger;
  private readonly ip: string;
  private readonly tunnels = new Map<string, LocalTunnelImpl>();
  private closeReason: string | null = null;
  private readonly liveness: LivenessTimer;
  private heartbeat: HeartbeatSender | null = null;
  private heartbeatStreams = 0;
  /** Bind requests being read at the larger limit (MAX_LARGE_RPC_READS). */
  private largeReads = 0;
  /**
   * Proxy streams finished on our side whose slots are not free yet, oldest first from
   * `releasedHead` on: when they finished (performance.now()), and how many heartbeats we had
   * sent by then.
   */
  private releasedAt: number[] = [];
  private releasedBeats: number[] = [];
  private releasedHead = 0;
  /** At most this long (the liveness window) a finished stream waits for heartbeat echoes. */
  private maxLingerMs = AUTH_TIMEOUT_MS;
  /** Proxy streams reset by us before the agent's FIN: until when their slots stay taken, oldest first from `heldHead` on. */
  private heldUntil: number[] = [];
  private heldHead = 0;
  /**
   * Slots held per client address ({@link clientShareKey}): only addresses holding at least one
   * (an entry is deleted when it drops to 0), so at most `maxStreams` entries. Taken when a proxy
   * stream opens, given back where its slot is freed for `streamSlotsInUse` (`lingering()`,
   * `held()`), with `releasedClients` and `heldClients` beside those queues.
   */
  private readonly clientSlots = new Map<string, number>();
  private releasedClients: Array<string | undefined> = [];
  private heldClients: Array<string | undefined> = [];
  /** How proxy streams destroyed before the agent's FIN leave the wire (ABORT_DRAIN_MAX_BYTES). */
  private drainOnDestroy: DrainOnDestroy = { maxBytes: ABORT_DRAIN_MAX_BYTES, maxMs: AUTH_TIMEOUT_MS };
  /** Tunnel starts of this session (see {@link TokenBucket}); full at first, so a reconnect can resume every tunnel at once. */
  private readonly starts: TokenBucket;
  /** StopTunnel requests waiting for a stream (at most one per tunnel the session had), oldest first. */
  private stopQueue: StopTunnelMessage[] = [];
  /** StopTunnel streams open on the wire (MAX_STOP_TUNNEL_STREAMS). */
  private stopStreams = 0;
  private stopRetry: NodeJS.Timeout | null = null;
  /** The timers that reset what stopped tunnels still carry (stopTunnel); cleared when the session ends first. */
  private readonly stopCuts = new Set<NodeJS.Timeout>();

  constructor(host: ConnectionHost, socket: tls.TLSSocket) {
    this.host = host;
    this.starts = new TokenBucket(host.settings.tunnelStartsPerSecond, host.settings.tunnelStartBurst);
    this.ip = remoteIp(socket);
    this.log = host.log.child({ agentIp: this.ip });
    // The cap, our heartbeat stream, and the StopTunnel streams' reserve past the cap.
    this.mux = new MuxSession(socket, { client: false, maxOutboundStreams: host.settings.maxStreams + 1 + STOP_TUNNEL_RESERVED_SLOTS, maxInboundStreams: MAX_INBOUND_STREAMS });
    this.mux.on('stream', (st) => void this.onStream(st));
    this.mux.on('release', (st) => {
      if (st.id % 2 !== 0 || st === this.heartbeat?.streamRef) return;
      // The slot stays taken (for the stream's client address too) until the queue lets go of it.
      const client = (st as ClientTagged)[CLIENT_KEY];
      if (st.resetBeforeRemoteFin) {
        // The agent may hold it until its upstream is done: no echo says when (see ABORT_DRAIN_MAX_BYTES).
        this.heldUntil.push(performance.now() + this.maxLingerMs);
        this.heldClients.push(client);
        return;
      }
      // A StopTunnel stream the agent FINed (or reset) is gone on its side: the SDK FINs it only
      // as it drops it, warren-agent with its answer after our FIN. Its slot is free at once.
      if ((st as StopTagged)[STOP_KEY] === true) return;
      this.releasedAt.push(performance.now());
      this.releasedBeats.push(this.heartbeat?.sent ?? 0);
      this.releasedClients.push(client);
      // Start the beats that will free this slot (at most one in flight; see onHeartbeatEcho).
      this.heartbeat?.probe();
    });
    this.mux.on('close', (info) => this.onClosed(info));
    // Until Auth this is the auth deadline; afterwards the heartbeat deadline (interval + tolerance).
    this.liveness = new LivenessTimer(AUTH_TIMEOUT_MS, () => this.close(this.info ? 'heartbeat timeout' : 'no Auth within 15 s'));
  }

  /** Proxy streams open on the wire (our heartbeat stream is not one). */
  get proxyStreams(): number {
    return Math.max(0, this.mux.outboundStreams - (this.heartbeat?.active ? 1 : 0));
  }

  /** Slots of the stream cap in use: open proxy streams and finished ones the agent may still hold. */
  get streamSlotsInUse(): number {
    return this.proxyStreams + this.lingering() + (this.heldHead < this.heldUntil.length ? this.held() : 0);
  }

  /** Proxy streams we reset before the agent's FIN whose slots are still taken. */
  private held(): number {
    const q = this.heldUntil;
    const now = performance.now();
    let head = this.heldHead;
    while (head < q.length && q[head]! <= now) this.releaseClient(this.heldClients[head++]);
    if (head === q.length) {
      this.heldUntil = [];
      this.heldClients = [];
      head = 0;
    } else if (head > 1024 && head * 2 > q.length) {
      this.heldUntil = q.slice(head);
      this.heldClients = this.heldClients.slice(head);
      head = 0;
    }
    this.heldHead = head;
    return this.heldUntil.length - head;
  }

  /**
   * Proxy streams finished on our side that the agent may still hold. The SDK forgets a stream
   * only when its forwarding task drops it, some time after the FIN or RST it processed, and
   * nothing on the wire says when; a slot freed here is not free there yet, and reusing it at once
   * under churn pushes the SDK past 512 streams, which kills its session. How long the SDK takes
   * depends on how much CPU its threads get, so a finished stream keeps its slot until the agent
   * has echoed STREAM_RELEASE_BEATS heartbeats sent after it finished, and for at least
   * STREAM_LINGER_MS; or, should the agent not echo at all, for the liveness window.
   */
  private lingering(): number {
    const at = this.releasedAt;
    const beats = this.releasedBeats;
    const now = performance.now();
    const hb = this.heartbeat;
    // Without our heartbeat stream (not yet authenticated, or the agent reset it) time alone decides.
    const echoed = hb?.active ? hb.echoed : Infinity;
    let head = this.releasedHead;
    while (head < at.length) {
      const age = now - at[head]!;
      if (age < this.maxLingerMs && (age < STREAM_LINGER_MS || echoed < beats[head]! + STREAM_RELEASE_BEATS)) break;
      this.releaseClient(this.releasedClients[head++]);
    }
    if (head > 1024 && head * 2 > at.length) {
      this.releasedAt = at.slice(head);
      this.releasedBeats = beats.slice(head);
      this.releasedClients = this.releasedClients.slice(head);
      head = 0;
    }
    this.releasedHead = head;
    return this.releasedAt.length - head;
  }

  /** A slot of `client`'s is free again (never below 0: the entry goes at 0). */
  private releaseClient(client: string | undefined): void {
    if (client === undefined) return;
    const n = this.clientSlots.get(client);
    if (n === undefined) return;
    if (n > 1) this.clientSlots.set(client, n - 1);
    else this.clientSlots.delete(client);
  }

  /**
   * Slots each client address holds (keys as {@link clientShareKey} makes them), freed slots let
   * go of first. For tests and diagnostics: a copy.
   */
  get streamSlotsByClient(): Map<string, number> {
    void this.streamSlotsInUse;
    return new Map(this.clientSlots);
  }

  /** An echo of our heartbeat: more beats while finished streams still wait for theirs. */
  private onHeartbeatEcho(): void {
    this.alive();
    const hb = this.heartbeat;
    const n = this.releasedBeats.length;
    if (hb && n > this.releasedHead && hb.echoed < this.releasedBeats[n - 1]! + STREAM_RELEASE_BEATS) hb.probe();
  }

  /** @internal Timers waiting to reset what stopped tunnels still carry (for tests). */
  get pendingStopCuts(): number {
    return this.stopCuts.size;
  }

  /** GOAWAY and close; tunnelClosed/sessionClosed are emitted with `reason`. */
  close(reason: string, code: number = MuxErrorCode.None): void {
    if (this.closeReason !== null) return;
    this.closeReason = reason;
    this.log.info({ reason }, 'closing agent session');
    this.mux.goAway(code, reason);
  }

  /** Opens a proxy stream for `t` and writes its header; throws a {@link TunnelStreamError}. */
  openProxyStream(t: LocalTunnelImpl, h: ProxyHeaderInit): TunnelStream {
    if (t.closed || this.closeReason !== null || this.mux.closed) {
      throw new TunnelStreamError('SESSION_CLOSED', t.closed ? `tunnel ${t.id} is closed` : `the agent session of tunnel ${t.id} is closed`);
    }
    // First: it frees the slots (and the client addresses' shares) whose time has come.
    const inUse = this.streamSlotsInUse;
    const client = clientShareKey(h.clientAddr);
    if (inUse >= this.host.settings.maxStreams) {
      throw new TunnelStreamError('STREAM_CAP', `the agent session is at its cap of ${this.host.settings.maxStreams} open streams`);
    }
    // The session has room, but maybe not for this client (a full session refuses everyone alike, as before).
    const held = client === '' ? 0 : (this.clientSlots.get(client) ?? 0);
    const share = this.host.settings.maxStreamsPerClient;
    if (held >= share) {
      throw new TunnelStreamError(
        'CLIENT_STREAM_CAP',
        `this client has too many requests open to this tunnel: ${share} at most from one address (MAX_STREAMS_PER_CLIENT), counting those that just finished or were abandoned until the agent lets go of them; retry when some have finished`,
      );
    }
    let stream: MuxStream;
    try {
      stream = this.mux.open({ allowHalfOpen: h.proto === 'tcp' || h.proto === 'tls', drainOnDestroy: this.drainOnDestroy });
    } catch (err) {
      const e = err as MuxError;
      if (e.code === 'STREAM_CAP') throw new TunnelStreamError('STREAM_CAP', e.message);
      if (e.code === 'STREAMS_EXHAUSTED') this.close('stream ids exhausted', MuxErrorCode.StreamsExhausted);
      throw new TunnelStreamError('SESSION_CLOSED', e.message);
    }
    if (client !== '') {
      this.clientSlots.set(client, held + 1);
      (stream as ClientTagged)[CLIENT_KEY] = client;
    }
    // Type, length and header go out in one DATA frame (with SYN), coalesced with the first
    // request bytes when the caller writes them in the same tick.
    stream.write(encodeProxyPrelude({ Id: t.id, ClientAddr: h.clientAddr, Proto: h.proto, EdgeType: h.edgeType, PassthroughTLS: h.passthroughTls === true }));
    t.track(stream);
    return stream;
  }

  // ---- streams ------------------------------------------------------------------------------

  private async onStream(st: MuxStream): Promise<void> {
    let type: number;
    try {
      type = await readStreamType(st, REQUEST_TIMEOUT_MS);
    } catch {
      st.destroy();
      return;
    }
    if (type === StreamType.Heartbeat) {
      if (++this.heartbeatStreams > MAX_HEARTBEAT_STREAMS) {
        st.destroy();
        return;
      }
      st.once('close', () => this.heartbeatStreams--);
      answerHeartbeats(st, () => this.alive());
      return;
    }
    if (type === StreamType.Proxy) {
      // Only the server opens proxy streams.
      st.destroy();
      return;
    }
    await this.serveRpc(st, type);
  }

  private async serveRpc(st: MuxStream, type: number): Promise<void> {
    // Reclaim RPC streams the agent never closes (it FINs when it drops them, §3).
    st.setTimeout(RPC_LINGER_MS, () => st.destroy());
    let body: unknown;
    // A Bind may carry a traffic policy: read at a larger limit, once authenticated and a few at a time.
    const large = type === StreamType.Bind && this.identity !== null && this.largeReads < MAX_LARGE_RPC_READS;
    const maxBytes = large ? MAX_BIND_REQUEST_BYTES : MAX_RPC_REQUEST_BYTES;
    if (large) this.largeReads++;
    try {
      body = await readJsonValue(st, { timeoutMs: REQUEST_TIMEOUT_MS, maxBytes });
    } catch (err) {
      this.log.debug({ err: (err as Error).message, type }, 'unreadable agent request');
      if (type === StreamType.Bind && err instanceof StreamReadError && err.code === 'TOO_LARGE' && !st.destroyed) {
        // Said, not just dropped: the SDK would show "failed to deserialize rpc response".
        st.resume();
        writeRpcReply(st, bindError(`the Bind request is over ${maxBytes} bytes; a traffic policy may have at most ${MAX_TRAFFIC_POLICY_BYTES} bytes (ERR_WARREN_5003)`));
        return;
      }
      st.destroy();
      return;
    } finally {
      if (large) this.largeReads--;
    }
    st.resume(); // whatever follows the request (a Go client's newline) is discarded
    let reply: unknown;
    try {
      reply = this.handle(type, body);
    } catch (err) {
      this.log.error({ err, type }, 'agent request failed');
      reply = { Error: INTERNAL };
    }
    if (!st.destroyed) writeRpcReply(st, reply);
  }

  private handle(type: number, body: unknown): unknown {
    if (type === StreamType.Auth) return this.onAuth(body);
    if (!this.info || !this.identity) {
      return type === StreamType.Bind ? bindError(NOT_AUTHENTICATED) : type === StreamType.StartTunnelWithLabel ? labelError(NOT_AUTHENTICATED) : { Error: NOT_AUTHENTICATED };
    }
    switch (type) {
      case StreamType.Bind:
        return this.onBind(body, this.info, this.identity);
      case StreamType.StartTunnelWithLabel:
        return this.onLabelTunnel(body, this.info, this.identity);
      case StreamType.Unbind:
        return this.onUnbind(body);
      case StreamType.SrvInfo:
        return { Region: this.host.nodeId };
      default:
        return { Error: `request type ${type} is not supported by this server (ERR_WARREN_2104)` };
    }
  }

  // ---- RPCs ---------------------------------------------------------------------------------

  private onAuth(body: unknown): AuthResponse {
    if (this.info) return authError('the session is already authenticated (ERR_WARREN_1100)');
    const req = parseAuth(body);
    if (!req.ok) {
      // Let the agent read the reply; a refused Auth is not retried on the same connection.
      setTimeout(() => this.close('Auth refused'), 1_000).unref();
      return authError(req.error);
    }
    const identity = this.host.authenticate(req.value.token);
    if (!identity) {
      this.log.info('agent authentication failed');
      // Let the agent read the reply before we hang up; the SDK gives up on its own anyway.
      setTimeout(() => this.close('authentication failed'), 1_000).unref();
      return authError(AUTH_FAILED);
    }
    const r = req.value;
    const { tokens, settings } = this.host;

    // Resume the old session id when the agent proves it is the same credential's session.
    let sessionId = newId('ts');
    if (r.clientId && isId('ts', r.clientId) && tokens.verifySessionCookie(r.cookie, r.clientId, identity.credentialId)) sessionId = r.clientId;

    const info: DpAgentSession = {
      id: sessionId,
      accountId: identity.accountId,
      credentialId: identity.credentialId,
      agentVersion: r.agentVersion,
      os: r.os,
      ip: this.ip,
      metadata: r.metadata,
      startedAt: new Date().toISOString(),
    };
    const found = sessionId === r.clientId ? this.host.sessionById(sessionId) : undefined;
    const old = found !== this ? found : undefined;
    const full = this.host.admitSession(info, old);
    if (full) {
      setTimeout(() => this.close('session refused by a cap of this node'), 1_000).unref();
      return authError(full);
    }
    old?.close('superseded by a reconnect of the same agent');
    this.identity = identity;
    this.info = info;
    this.log = this.log.child({ session: sessionId, account: identity.accountId });

    const interval = clampMs(settings.heartbeatIntervalMs ?? (r.heartbeatIntervalMs || 10_000), 10, 600_000);
    const tolerance = clampMs(settings.heartbeatToleranceMs ?? (r.heartbeatToleranceMs || 15_000), 10, 600_000);
    this.liveness.reset(interval + tolerance);
    this.maxLingerMs = interval + tolerance;
    this.drainOnDestroy = { maxBytes: ABORT_DRAIN_MAX_BYTES, maxMs: interval + tolerance };
    this.heartbeat = new HeartbeatSender(this.mux, { intervalMs: interval, onBeat: () => this.onHeartbeatEcho() });

    this.host.sessionUp(this);
    this.log.info({ agentVersion: r.agentVersion, os: r.os }, 'agent session started');
    return {
      Version: '2',
      ClientId: sessionId,
      Extra: {
        Version: SERVER_VERSION,
        Region: this.host.nodeId,
        Cookie: tokens.sessionCookie(sessionId, identity.credentialId),
        AccountName: identity.accountId,
        SessionDuration: 0,
        PlanName: '',
        Banner: '',
      },
    };
  }

  /**
   * A Bind. One that carries a traffic policy costs the node a parse, a costing and a compile of
   * up to 64 KiB of policy (tens of milliseconds of event loop): it is refused outright when the
   * session (or its credential) has no tunnel start left, and one refused for any reason takes a
   * start all the same, so an agent cannot make the node compile policies faster than it may start
   * tunnels (TUNNEL_STARTS_PER_SECOND_PER_SESSION) by sending ones that fail.
   */
  private onBind(body: unknown, session: DpAgentSession, identity: AgentIdentity): BindResponse {
    const policyBytes = bindTrafficPolicyBytes(body);
    if (policyBytes === 0) return this.bind(body, session, identity);
    const limited = this.startRateRefusal();
    if (limited) return bindError(limited);
    // And by size: a valid 64 KB policy took 0.2-0.4 s to parse and compile on a loaded node, so
    // starts alone (20 a second) would let one credential keep a node busy.
    const cost = Math.max(POLICY_BYTES_MIN_CHARGE, policyBytes);
    const budget = this.host.credentialPolicyBytes(identity.credentialId);
    if (!budget.available(cost)) {
      return bindError(`this authtoken's sessions send traffic policies faster than this server compiles them (${POLICY_BYTES_PER_SECOND / 1024} KiB a second, ${POLICY_BYTES_BURST / 1024} KiB at once, across its sessions); retry in ${Math.ceil(budget.waitMs(cost))} ms (ERR_WARREN_8001)`);
    }
    budget.take(cost);
    const reply = this.bind(body, session, identity);
    if (reply.Error) this.takeStart();
    return reply;
  }

  private bind(body: unknown, session: DpAgentSession, identity: AgentIdentity): BindResponse {
    const parsed = parseBind(body, this.host.settings.defaultDomain);
    if (!parsed.ok) return bindError(parsed.error);
    const req = parsed.value;
    if (!aclAllowsHostname(identity.acl, req.hostname)) return bindError(`the authtoken's ACL does not allow binding ${req.hostname} (ERR_WARREN_1100)`);
    const id = this.resumeOrNewTunnelId(req.id, req.token, identity);
    if (!id.ok) return bindError(id.error);
    const url = this.host.publicUrl(req.proto, req.hostname);
    const fields: TunnelFields = {
      id: id.value,
      accountId: identity.accountId,
      sessionId: session.id,
      proto: req.proto,
      labels: {},
      publicUrl: url,
      bindings: req.bindings,
      poolingEnabled: req.poolingEnabled,
      forwardsTo: req.forwardsTo,
      metadata: req.metadata,
      startedAt: new Date().toISOString(),
    };
    const full = this.admit(fields);
    if (full) return bindError(full);
    // Once the caps admit the tunnel, before a live one of the same id is superseded: a policy
    // that cannot run here refuses the Bind, never an endpoint served without its policy.
    let trafficPolicy: EndpointPolicy | null = null;
    if (req.trafficPolicy) {
      const compiled = this.host.endpointPolicy({ tunnelId: id.value, accountId: identity.accountId, hostname: req.hostname, policy: req.trafficPolicy });
      if (!compiled.ok) return bindError(compiled.error);
      trafficPolicy = compiled.value;
    }
    this.supersede(id.value);
    const refusal = this.host.checkBind({ accountId: identity.accountId, sessionId: session.id, tunnelId: id.value, proto: req.proto, hostname: req.hostname, bindings: req.bindings, poolingEnabled: req.poolingEnabled });
    if (refusal) return bindError(refusal);
    this.addTunnel(fields, req.hostname, trafficPolicy);
    // Opts are echoed as received: the SDK deserialises them into its own options type (§3).
    return { Id: id.value, URL: url, Proto: req.proto, Opts: req.opts, Extra: { Token: this.host.tokens.tunnelToken(id.value, identity.credentialId) } };
  }

  private onLabelTunnel(body: unknown, session: DpAgentSession, identity: AgentIdentity): LabelTunnelResponse {
    const parsed = parseLabelTunnel(body);
    if (!parsed.ok) return labelError(parsed.error);
    const req = parsed.value;
    if (!aclAllowsLabels(identity.acl, req.labels)) return labelError("the authtoken's ACL does not allow these labels (ERR_WARREN_1100)");
    // The SDK re-sends StartTunnelWithLabel without an id on reconnect and takes the new one;
    // warren-agent sends its old Id and Token (our extension) to keep it.
    const id = req.id && req.token ? this.resumeOrNewTunnelId(req.id, req.token, identity) : ({ ok: true, value: newId('tn') } as const);
    if (!id.ok) return labelError(id.error);
    const fields: TunnelFields = {
      id: id.value,
      accountId: identity.accountId,
      sessionId: session.id,
      proto: 'labeled',
      labels: req.labels,
      publicUrl: '',
      bindings: [],
      poolingEnabled: false,
      forwardsTo: req.forwardsTo,
      metadata: req.metadata,
      startedAt: new Date().toISOString(),
    };
    const full = this.admit(fields);
    if (full) return labelError(full);
    this.supersede(id.value);
    this.addTunnel(fields, '');
    return { Id: id.value, Token: this.host.tokens.tunnelToken(id.value, identity.credentialId) };
  }

  /** Idempotent: the SDK sends Unbind more than once per listener. */
  private onUnbind(body: unknown): Record<string, never> {
    const id = typeof (body as { Id?: unknown } | null)?.Id === 'string' ? (body as { Id: string }).Id : '';
    const t = this.tunnels.get(id);
    if (t) this.closeTunnel(t, 'unbound by the agent');
    return {};
  }

  /**
   * A non-empty Id from the agent is honoured (the SDK keeps its old id whatever we reply, §3)
   * once its token proves we issued it to this credential; a live tunnel with that id (the
   * agent's previous, dead connection) is closed by {@link supersede} once the new one is admitted.
   */
  private resumeOrNewTunnelId(id: string, token: string, identity: AgentIdentity): { ok: true; value: string } | { ok: false; error: string } {
    if (!id) return { ok: true, value: newId('tn') };
    if (!isId('tn', id) || !this.host.tokens.verifyTunnelToken(token, id, identity.credentialId)) {
      return { ok: false, error: `cannot resume tunnel ${JSON.stringify(id.slice(0, 40))}: it was not issued to this authtoken by this ingress (ERR_WARREN_1100)` };
    }
    return { ok: true, value: id };
  }

  /** Closes the live tunnel `id` (of a previous connection, or this one's) that a resumed tunnel replaces. */
  private supersede(id: string): void {
    const live = this.host.tunnelById(id);
    if (live) live.connection.closeTunnel(live, 'superseded by a reconnect of the same agent');
  }

  /**
   * Null when this session and the node can take the tunnel, else the refusal: the session's cap
   * (MAX_TUNNELS_PER_SESSION), the node's (MAX_TUNNELS_PER_NODE), the account's or the
   * credential's on this node, its report budget, or the session's start rate
   * (TUNNEL_STARTS_PER_SECOND_PER_SESSION, ERR_WARREN_8001: every start is reported to the control
   * plane and every node, so a session starting and stopping tunnels in a loop would keep them all
   * busy).
   * A live tunnel the new one replaces (same id, resumed) does not count. Each tunnel is reported to the
   * control plane and sent in every full sync: without caps one session could grow that past the
   * control plane's message limit and cut the node off from its config.
   */
  private admit(fields: TunnelFields): string | null {
    const replacing = this.host.tunnelById(fields.id);
    const max = this.host.settings.maxTunnelsPerSession;
    const own = this.tunnels.size - (replacing && this.tunnels.get(replacing.id) === replacing ? 1 : 0);
    if (own >= max) {
      this.log.debug({ tunnels: this.tunnels.size, max }, 'tunnel refused: the session is at MAX_TUNNELS_PER_SESSION');
      return `this agent session already has ${max} tunnels, the most one session may have (MAX_TUNNELS_PER_SESSION); stop one or start another session (ERR_WARREN_1110)`;
    }
    const capped = this.host.admitTunnel(fields, this.identity!.credentialId, replacing);
    if (capped) return capped;
    // Last, so that a session at a cap hears about the cap (retrying would not help).
    return this.startRateRefusal();
  }

  /** Null when the session and its credential may start a tunnel now, else the refusal (8001). */
  private startRateRefusal(): string | null {
    if (!this.starts.available()) {
      const { tunnelStartsPerSecond: rate, tunnelStartBurst: burst } = this.host.settings;
      this.log.debug({ rate, burst }, 'tunnel refused: the session starts tunnels faster than TUNNEL_STARTS_PER_SECOND_PER_SESSION');
      return `this agent session starts tunnels faster than this server allows (TUNNEL_STARTS_PER_SECOND_PER_SESSION: ${rate} a second, ${burst} at once); retry in ${Math.ceil(this.starts.waitMs())} ms (ERR_WARREN_8001)`;
    }
    const shared = this.host.credentialStarts(this.identity!.credentialId);
    if (!shared.bucket.available()) {
      const rate = this.host.settings.tunnelStartsPerSecond;
      this.log.debug({ rate, burst: shared.burst }, 'tunnel refused: the credential\'s sessions start tunnels faster than the node allows');
      return `this authtoken's sessions start tunnels faster than this server allows (${rate} a second, ${shared.burst} at once, across its sessions and reconnects); retry in ${Math.ceil(shared.bucket.waitMs())} ms (ERR_WARREN_8001)`;
    }
    return null;
  }

  /** Takes a tunnel start from the session's and the credential's buckets. */
  private takeStart(): void {
    this.starts.take();
    this.host.credentialStarts(this.identity!.credentialId).bucket.take();
  }

  private addTunnel(fields: TunnelFields, hostname: string, trafficPolicy: EndpointPolicy | null = null): void {
    // Only a tunnel that starts takes a token (refusals cost the node no reports), and a refused
    // Bind that carried a traffic policy (`onBind`).
    this.takeStart();
    const t = new LocalTunnelImpl(this, fields, hostname, trafficPolicy);
    this.tunnels.set(t.id, t);
    this.log.info({ tunnel: t.id, proto: t.proto, url: t.publicUrl || undefined, labels: t.proto === 'labeled' ? t.labels : undefined }, 'tunnel started');
    this.host.tunnelUp(t);
  }

  /**
   * Stops tunnel `t` of this session from the server's side: StopTunnel (type 9) tells the agent
   * (`message`, `errorCode`; no answer is waited for, the SDK sends none) and the tunnel is closed
   * here at once, as an Unbind would close it: out of routing, reported down, no longer counted
   * against the caps. False when `t` is not a live tunnel of this session.
   *
   * Unlike after an Unbind (the agent's own choice: what it carries is its business), what the
   * tunnel still carries `stoppedTunnelDrainMs` later is reset: a WebSocket or TCP connection
   * must not outlive, for as long as it likes, a tunnel its credential may no longer have.
   */
  stopTunnel(t: LocalTunnelImpl, message: string, errorCode: string): boolean {
    if (this.tunnels.get(t.id) !== t) return false;
    if (this.closeReason === null && !this.mux.closed) {
      // Bounded, should an agent that never lets go of StopTunnel streams keep starting tunnels
      // that get stopped: the oldest request is dropped (its tunnel is closed here all the same).
      if (this.stopQueue.length >= this.host.settings.maxTunnelsPerSession) this.stopQueue.shift();
      this.stopQueue.push({ Id: t.id, Message: message, ErrorCode: errorCode });
      this.sendStops();
    }
    this.log.info({ tunnel: t.id, errorCode, message }, 'stopping tunnel');
    this.closeTunnel(t, `stopped by the server: ${message}`);
    const cut = setTimeout(() => {
      this.stopCuts.delete(cut);
      const n = t.resetStreams();
      if (n > 0) this.log.info({ tunnel: t.id, streams: n }, 'reset the streams a stopped tunnel still carried');
    }, this.host.settings.stoppedTunnelDrainMs);
    cut.unref();
    this.stopCuts.add(cut);
    return true;
  }

  /**
   * The session's credential has a new ACL (a config changed it): later Binds and
   * StartTunnelWithLabels of this session are checked against `acl`, and the tunnels it no longer
   * allows are stopped (StopTunnel, ERR_WARREN_1100): Bind tunnels by hostname, labeled tunnels by
   * labels. Returns how many were stopped.
   */
  updateAcl(acl: readonly string[]): number {
    const identity = this.identity;
    if (!identity) return 0;
    this.identity = { ...identity, acl: [...acl] };
    let stopped = 0;
    for (const t of [...this.tunnels.values()]) {
      if (t.proto === 'labeled') {
        if (!aclAllowsLabels(acl, t.labels) && this.stopTunnel(t, "the authtoken's ACL no longer allows these labels (ERR_WARREN_1100)", 'ERR_WARREN_1100')) stopped++;
      } else if (!aclAllowsHostname(acl, t.hostname) && this.stopTunnel(t, `the authtoken's ACL no longer allows binding ${t.hostname} (ERR_WARREN_1100)`, 'ERR_WARREN_1100')) {
        stopped++;
      }
    }
    return stopped;
  }

  /**
   * Opens StopTunnel streams for the queued requests: type and request in one write, then FIN.
   * They count against the session's stream cap like proxy streams, with
   * STOP_TUNNEL_RESERVED_SLOTS past it (proxy streams may hold every slot of the cap), and at most
   * MAX_STOP_TUNNEL_STREAMS at once; the rest wait for a slot. A stream the agent has not FINed
   * or reset within STOP_TUNNEL_TIMEOUT_MS is reset.
   */
  private sendStops(): void {
    while (this.stopQueue.length > 0 && this.stopStreams < MAX_STOP_TUNNEL_STREAMS) {
      if (this.closeReason !== null || this.mux.closed) {
        this.stopQueue = [];
        return;
      }
      if (this.streamSlotsInUse >= this.host.settings.maxStreams + STOP_TUNNEL_RESERVED_SLOTS) {
        this.retryStops();
        return;
      }
      let st: MuxStream;
      try {
        st = this.mux.open({ allowHalfOpen: true });
      } catch (err) {
        const e = err as MuxError;
        if (e.code === 'STREAM_CAP') {
          this.retryStops();
          return;
        }
        if (e.code === 'STREAMS_EXHAUSTED') this.close('stream ids exhausted', MuxErrorCode.StreamsExhausted);
        this.stopQueue = [];
        return;
      }
      const m = this.stopQueue.shift()!;
      this.stopStreams++;
      (st as StopTagged)[STOP_KEY] = true;
      const timer = setTimeout(() => st.destroy(), STOP_TUNNEL_TIMEOUT_MS);
      timer.unref();
      st.once('close', () => {
        clearTimeout(timer);
        this.stopStreams--;
        this.sendStops();
      });
      st.resume(); // an answer (warren-agent's `{}`) is read and dropped; none is waited for
      st.end(encodeStopTunnel(m));
    }
  }

  private retryStops(): void {
    if (this.stopRetry) return;
    this.stopRetry = setTimeout(() => {
      this.stopRetry = null;
      this.sendStops();
    }, STOP_TUNNEL_RETRY_MS);
    this.stopRetry.unref();
  }

  /** @internal */
  closeTunnel(t: LocalTunnelImpl, reason: string): void {
    if (this.tunnels.get(t.id) !== t) return;
    this.tunnels.delete(t.id);
    t.markClosed();
    this.log.info({ tunnel: t.id, reason }, 'tunnel closed');
    this.host.tunnelDown(t, reason);
  }

  // ---- liveness -----------------------------------------------------------------------------

  /** A heartbeat arrived (theirs, or the echo of ours): push the deadline back. */
  private alive(): void {
    if (this.info) this.liveness.beat();
  }

  private onClosed(info: MuxCloseInfo): void {
    const reason = this.closeReason ?? describeClose(info);
    this.closeReason = reason;
    this.liveness.stop();
    this.heartbeat?.stop();
    this.stopQueue = [];
    if (this.stopRetry) clearTimeout(this.stopRetry);
    this.stopRetry = null;
    // The session's streams are gone with it: nothing is left for these timers to reset.
    for (const cut of this.stopCuts) clearTimeout(cut);
    this.stopCuts.clear();
    // The session's streams are gone with it (no 'release' follows): nothing is held any more.
    this.clientSlots.clear();
    for (const t of [...this.tunnels.values()]) this.closeTunnel(t, reason);
    if (this.info) {
      this.log.info({ reason }, 'agent session ended');
      this.host.sessionDown(this, reason);
    }
    this.host.connectionGone(this);
  }
}

/** The client address a proxy stream counts against, on the stream itself (set once, at open). */
const CLIENT_KEY = Symbol('warren.streamClient');
type ClientTagged = MuxStream & { [CLIENT_KEY]?: string };
/** Marks a StopTunnel stream (set once, at open). */
const STOP_KEY = Symbol('warren.stopTunnel');
type StopTagged = MuxStream & { [STOP_KEY]?: true };

/**
 * The address whose share of a session's slots a stream with this `ClientAddr` takes:
 * - IPv4 (`a.b.c.d:port`): the address;
 * - IPv6 (`[v6]:port`, or `v6:port` as the public listener writes it): its /64, `2001:db8:0:1::/64`
 *   (whoever has one address of a /64 usually has all of it);
 * - IPv4-mapped IPv6 (`::ffff:a.b.c.d`, also in hex): the IPv4 address;
 * - '' for none: the unspecified `0.0.0.0` (what a stream opened for no request in particular
 *   carries, e.g. a connection pool reconnecting for a queued request; no public client has it)
 *   and an IPv6 address it cannot parse; such streams count against the session's cap only.
 * IPv4, the common case, costs one slice.
 */
export function clientShareKey(clientAddr: string): string {
  let host: string;
  if (clientAddr.charCodeAt(0) === 91 /* [ */) {
    const end = clientAddr.indexOf(']');
    host = end > 0 ? clientAddr.slice(1, end) : '';
  } else {
    const colon = clientAddr.lastIndexOf(':');
    host = colon >= 0 ? clientAddr.slice(0, colon) : clientAddr;
  }
  if (host.indexOf(':') < 0) return host === '0.0.0.0' ? '' : host;
  return ipv6ShareKey(host);
}

/** An IPv6 client's key: its /64 (`2001:db8:0:1::/64`), or the IPv4 address it maps; '' when none. */
function ipv6ShareKey(addr: string): string {
  const pct = addr.indexOf('%');
  const b = parseIPv6(pct >= 0 ? addr.slice(0, pct) : addr);
  if (!b || b.every((x) => x === 0)) return '';
  if (b.slice(0, 10).every((x) => x === 0) && b[10] === 0xff && b[11] === 0xff) {
    const v4 = b.slice(12).join('.');
    return v4 === '0.0.0.0' ? '' : v4;
  }
  const hextet = (i: number) => ((b[i]! << 8) | b[i + 1]!).toString(16);
  return `${hextet(0)}:${hextet(2)}:${hextet(4)}:${hextet(6)}::/64`;
}

function describeClose(info: MuxCloseInfo): string {
  switch (info.by) {
    case 'remote':
      return info.code === MuxErrorCode.None ? 'the agent closed the session' : `the agent went away (${muxErrorCodeName(info.code)})`;
    case 'protocol':
      return `protocol error: ${info.message}`;
    default:
      return 'the agent disconnected';
  }
}

function authError(text: string): AuthResponse {
  return { Version: '2', ClientId: '', Extra: { Version: SERVER_VERSION, Region: '', Cookie: '', AccountName: '', SessionDuration: 0, PlanName: '', Banner: '' }, Error: text };
}

/** Traffic-policy bytes a credential's sessions may have parsed and compiled per second on a node, and at once. */
export const POLICY_BYTES_PER_SECOND = 32 * 1024;
export const POLICY_BYTES_BURST = 256 * 1024;
/** What any Bind with a policy is charged at least (the work besides its bytes). */
const POLICY_BYTES_MIN_CHARGE = 1024;

function bindError(text: string): BindResponse {
  return { Id: '', URL: '', Proto: '', Opts: {}, Extra: { Token: '' }, Error: text };
}

function labelError(text: string): LabelTunnelResponse {
  return { Id: '', Token: '', Error: text };
}
