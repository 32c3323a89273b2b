import { EventEmitter } from 'node:events';
import * as grpc from '@grpc/grpc-js';
import client from 'prom-client';
import { createLogger, type DataPlaneConfig, type DpAgentSession, type DpTunnel, type Logger } from '@warren/shared';
import {
  deletesFromProto,
  loadConfigProto,
  resourcesFromProto,
  sessionToProto,
  tunnelFromProto,
  tunnelToProto,
  type ConfigServiceClient,
  type ControlMessage__Output,
  type Delta__Output,
  type NodeMessage,
  type Resources__Output,
  type Snapshot__Output,
  type Tunnel__Output,
  type TunnelPresence__Output,
  lenField,
} from '../../../shared/src/proto/index.js';
import { Backoff } from '@warren/shared';
import { applyDelta, buildConfig, checkConfig } from './config-state.js';
import { createConfigClientMetrics, type ConfigClientMetrics } from './metrics.js';
import { CONFIG_FORMAT, StateStore } from './state-store.js';

export type ReportedTunnel = Omit<DpTunnel, 'nodeId' | 'nodeAddress'>;

/** A tunnel's own facts, as reported and as other nodes know it (a local tunnel's streams and policy left out). */
export function tunnelFacts(t: ReportedTunnel): ReportedTunnel {
  const { id, accountId, sessionId, proto, labels, publicUrl, bindings, poolingEnabled, forwardsTo, metadata, startedAt } = t;
  return { id, accountId, sessionId, proto, labels, publicUrl, bindings, poolingEnabled, forwardsTo, metadata, startedAt };
}

export interface ControlPlaneClientOptions {
  /** Control-plane gRPC `host:port`s; the client moves to the next one after a failure. */
  targets: string[];
  nodeId: string;
  /** This node's internal forwarding `host:port`, sent in hello (other nodes reach its tunnels there). */
  nodeAddress: string;
  /** Last good config and remote tunnels are persisted here (atomic writes). */
  stateDir: string;
  /** WARREN_NODE_TOKEN: sent as `authorization: Bearer <token>`. */
  token?: string;
  /** Metrics are registered here (default: a private registry). */
  registry?: client.Registry;
  log?: Logger;
  /** Reconnect backoff, jittered exponential (default 100 ms → 5 s). */
  backoff?: { initialMs?: number; maxMs?: number };
  /** TLS to the control plane (default: plaintext). `ca` verifies the server; `cert`+`key` for mutual TLS. */
  tls?: { ca?: Buffer; cert?: Buffer; key?: Buffer; serverNameOverride?: string };
  /** A stream that gets no welcome within this time is abandoned (default 10 s). */
  connectTimeoutMs?: number;
  /** Keep-alive interval until the control plane says otherwise in its welcome (default 3 s). */
  keepaliveIntervalMs?: number;
  /** Reports written but not yet sent before reports are dropped for a full re-sync (default 1,000). */
  maxQueuedReports?: number;
  /**
   * Connected, but the applied config stays behind the head version the control plane announces
   * (in every message, heartbeats included) for longer than this: the stream is abandoned and a
   * new one syncs afresh (default 15 s). A version this node refused (NACK) does not count.
   */
  maxConfigLagMs?: number;
  /**
   * Say in hello that this node applies snapshots sent in parts, and send its full sync in parts
   * to a control plane whose welcome says it takes them (default true; false behaves as a node
   * from before parts, for tests of rolling upgrades).
   */
  parts?: boolean;
  /** Largest single message accepted from the control plane (default 256 MiB). */
  maxReceiveBytes?: number;
  /**
   * What the parts of one snapshot may add up to (bytes as received) while it is incomplete; past
   * it the partial snapshot is dropped and the node reconnects, serving its config meanwhile
   * (default: MAX_CONFIG_SNAPSHOT_BYTES from the environment, else 1 GiB).
   */
  maxSnapshotBytes?: number;
  /** Target size of one part of a full sync sent in parts (default 4 MiB). */
  fullSyncPartBytes?: number;
}

export interface ControlPlaneClientEvents {
  /** After each atomic swap (also after loading from disk at start). */
  config: [cfg: DataPlaneConfig, previous: DataPlaneConfig | null];
  remoteTunnelUp: [t: DpTunnel];
  remoteTunnelDown: [id: string];
  connected: [];
  disconnected: [err?: Error];
}

// Largest message accepted from the control plane: a snapshot of a large configuration from a
// control plane that does not send parts (with parts, each is about 4 MiB).
const MAX_RECEIVE_BYTES = 256 * 1024 * 1024;

/** Default of what an incomplete snapshot's parts may add up to (MAX_CONFIG_SNAPSHOT_BYTES). */
export const DEFAULT_MAX_SNAPSHOT_BYTES = 1024 * 1024 * 1024;

/** Default target size of one part of a full sync sent in parts. */
export const DEFAULT_FULL_SYNC_PART_BYTES = 4 * 1024 * 1024;

function snapshotBytesFromEnv(log: Logger): number {
  const raw = process.env.MAX_CONFIG_SNAPSHOT_BYTES;
  if (raw === undefined || raw === '') return DEFAULT_MAX_SNAPSHOT_BYTES;
  const n = Number(raw);
  if (Number.isSafeInteger(n) && n >= 1024 * 1024) return n;
  log.warn({ MAX_CONFIG_SNAPSHOT_BYTES: raw }, `MAX_CONFIG_SNAPSHOT_BYTES must be a whole number of bytes, at least 1 MiB; using ${DEFAULT_MAX_SNAPSHOT_BYTES}`);
  return DEFAULT_MAX_SNAPSHOT_BYTES;
}

/** The wire size of each message the control plane sent (recorded by the deserializer). */
const wireBytes = new WeakMap<object, number>();
let SizedConfigService: grpc.ServiceClientConstructor | undefined;

/** `ConfigService`'s client, its deserializer noting each message's size on the wire. */
function configServiceClient(): grpc.ServiceClientConstructor {
  if (SizedConfigService) return SizedConfigService;
  const service = loadConfigProto().ConfigService.service;
  const decode = service.Connect.responseDeserialize;
  const Connect = {
    ...service.Connect,
    responseDeserialize: (buf: Buffer) => {
      const m = decode(buf);
      if (m && typeof m === 'object') wireBytes.set(m, buf.length);
      return m;
    },
  };
  SizedConfigService = grpc.makeGenericClientConstructor({ ...service, Connect } as grpc.ServiceDefinition, 'ConfigService');
  return SizedConfigService;
}

const RESOURCE_KINDS = ['edges', 'routes', 'backends', 'ipPolicies', 'certificateAuthorities', 'credentials', 'eventSubscriptions'] as const;

/** A delta as applied, for the store to persist it as such (not the whole config). */
interface DeltaToSave {
  prevVersion: number;
  upserts: ReturnType<typeof resourcesFromProto>;
  deletes: ReturnType<typeof deletesFromProto>;
}

/** A snapshot arriving in parts, until its last part. */
interface PartialSnapshot {
  version: number;
  epoch: string;
  next: number;
  bytes: number;
  lastPartAt: number;
  resources: { [K in (typeof RESOURCE_KINDS)[number]]: NonNullable<Resources__Output[K]> };
  remoteTunnels: Tunnel__Output[];
}

/**
 * The control plane accepts node messages of at most 64 MiB (config-push.grpc.ts); one over it
 * ends the stream (RESOURCE_EXHAUSTED), and as every reconnect sends the full sync again the node
 * would never get a config change (credential revocations included). A full sync sent as ONE
 * message (to a control plane from before parts) is kept under this, leaving room below the limit
 * for framing and for a control plane configured lower; a full sync in parts is not cut (each
 * part is about DEFAULT_FULL_SYNC_PART_BYTES). It also caps the agent server's report budget.
 */
export const MAX_FULL_SYNC_BYTES = 60 * 1024 * 1024;

const strField = (s: string) => lenField(Buffer.byteLength(s));

/**
 * Upper bound of what a session takes up in a full sync (its `AgentSession` in the repeated
 * field, tag and length included); an agent server holds its sessions and tunnels to a budget of
 * these (see AgentServer `maxReportBytes`).
 */
export function sessionReportBytes(s: DpAgentSession): number {
  return lenField(strField(s.id) + strField(s.accountId) + strField(s.credentialId) + strField(s.agentVersion) + strField(s.os) + strField(s.ip) + strField(s.metadata) + strField(s.startedAt));
}

/** Upper bound of what a tunnel takes up in a full sync (see {@link sessionReportBytes}). */
export function tunnelReportBytes(t: ReportedTunnel): number {
  let n = strField(t.id) + strField(t.accountId) + strField(t.sessionId) + strField(t.proto) + strField(t.publicUrl) + strField(t.forwardsTo) + strField(t.metadata) + strField(t.startedAt);
  for (const [k, v] of Object.entries(t.labels)) n += lenField(strField(k) + strField(v));
  for (const b of t.bindings) n += strField(b);
  n += 2; // pooling_enabled
  n += 2 * 2; // node_id, node_address: empty in reports
  return lenField(n);
}

/**
 * An ingress node's side of `warren.config.v1.ConfigService.Connect`.
 *
 * Config: snapshots and deltas are applied atomically — a new immutable `DataPlaneConfig` is
 * built, checked (structure, then every validator), swapped in ('config'), persisted to
 * `stateDir`, then ACKed; a failure NACKs with the version and the error and keeps the config
 * served. Static stability: `start()` first serves the config persisted on disk, and the node
 * keeps serving whatever it has through any outage, reconnecting with jittered backoff and
 * catching up (a delta from its version when the control plane can, else a snapshot).
 *
 * Presence: sessions and tunnels reported here are kept in a local table; every (re)connect
 * sends all of it (full sync), and changes while connected go out at once. Nothing queues while
 * disconnected, and when the stream backs up, reports are dropped in favour of a full sync: the
 * memory used is bounded by what is live.
 */
export class ControlPlaneClient extends EventEmitter<ControlPlaneClientEvents> {
  private readonly opts: Required<Pick<ControlPlaneClientOptions, 'connectTimeoutMs' | 'keepaliveIntervalMs' | 'maxQueuedReports' | 'maxConfigLagMs' | 'parts' | 'maxReceiveBytes' | 'maxSnapshotBytes' | 'fullSyncPartBytes'>> & ControlPlaneClientOptions;
  private readonly log: Logger;
  private readonly metrics: ConfigClientMetrics;
  private readonly store: StateStore;
  private readonly backoff: Backoff;
  private readonly validators: ((candidate: DataPlaneConfig) => void)[] = [];

  private current: DataPlaneConfig | null = null;
  private epoch = '';
  private headVersion = 0;
  private readonly remote = new Map<string, DpTunnel>();
  private readonly sessions = new Map<string, DpAgentSession>();
  private readonly tunnels = new Map<string, ReportedTunnel>();

  private started = false;
  private stopped = false;
  private targetIndex = 0;
  private attempts = 0;
  private failures = 0;
  private grpcClient: ConfigServiceClient | null = null;
  private call: grpc.ClientDuplexStream<NodeMessage, ControlMessage__Output> | null = null;
  private isConnected = false;
  private fullSyncWanted = false;
  private resyncPending = false;
  private reconnectTimer: NodeJS.Timeout | null = null;
  private connectTimer: NodeJS.Timeout | null = null;
  private keepaliveTimer: NodeJS.Timeout | null = null;
  private lastHeard = 0;
  private silenceLimitMs = 0;
  /** Since when the applied version has been behind the announced head (0: it is not). */
  private behindSince = 0;
  /** The newest version this node refused: being behind it is not a stalled stream. */
  private refusedVersion = 0;
  private tunnelsSaveTimer: NodeJS.Timeout | null = null;
  /** The control plane of this stream said (welcome) it takes a full sync in parts. */
  private peerTakesParts = false;
  /** The full sync did not fit in one part: it goes out on the welcome, in parts if the control plane takes them. */
  private fullSyncOnWelcome = false;
  /** The version last saved to disk, and the last save's error (see `persisted`). */
  private persistedVersion = 0;
  private persistError: string | null = null;
  /** A snapshot arriving in parts (the config served stays the previous one until its last part). */
  private partial: PartialSnapshot | null = null;

  constructor(opts: ControlPlaneClientOptions) {
    super();
    if (!Array.isArray(opts.targets) || opts.targets.length === 0 || opts.targets.some((t) => typeof t !== 'string' || !t)) throw new TypeError('ControlPlaneClient: targets must be a non-empty list of host:port');
    if (!opts.nodeId) throw new TypeError('ControlPlaneClient: nodeId is required');
    if (!opts.nodeAddress) throw new TypeError('ControlPlaneClient: nodeAddress is required');
    if (!opts.stateDir) throw new TypeError('ControlPlaneClient: stateDir is required');
    this.log = opts.log ?? createLogger('ingress-config');
    this.opts = {
      connectTimeoutMs: 10_000,
      keepaliveIntervalMs: 3_000,
      maxQueuedReports: 1_000,
      maxConfigLagMs: 15_000,
      parts: true,
      maxReceiveBytes: MAX_RECEIVE_BYTES,
      maxSnapshotBytes: opts.maxSnapshotBytes ?? snapshotBytesFromEnv(this.log),
      fullSyncPartBytes: DEFAULT_FULL_SYNC_PART_BYTES,
      ...opts,
    };
    this.metrics = createConfigClientMetrics(opts.registry ?? new client.Registry());
    this.store = new StateStore(opts.stateDir);
    this.backoff = new Backoff(opts.backoff?.initialMs ?? 100, opts.backoff?.maxMs ?? 5_000);
  }

  /** The applied config, or null before any (from disk or the control plane). */
  get config(): DataPlaneConfig | null {
    return this.current;
  }

  get connected(): boolean {
    return this.isConnected;
  }

  /**
   * What the node's last save of its config came to: the version written to disk (0 before any)
   * and the error of the last save when it failed (null once one succeeds again). A node whose
   * saves fail still serves and ACKs what it applied; this says it would not survive a restart
   * during a control-plane outage with that config (internal /status).
   */
  get persisted(): { version: number; error: string | null } {
    return { version: this.persistedVersion, error: this.persistError };
  }

  /** Remote tunnels (other nodes), by id. */
  get remoteTunnels(): ReadonlyMap<string, DpTunnel> {
    return this.remote;
  }

  /** Runs on every candidate config before it is swapped in; a throw → NACK {version, error}, old config kept. */
  addValidator(fn: (candidate: DataPlaneConfig) => void): void {
    this.validators.push(fn);
  }

  /**
   * Loads the persisted last good config (emitting 'config') and remote tunnels (emitting
   * 'remoteTunnelUp'), then connects and keeps reconnecting. Resolves once started, without
   * waiting for the control plane.
   */
  async start(): Promise<void> {
    if (this.started) return;
    this.started = true;
    await this.loadFromDisk();
    this.connect();
  }

  /** Closes the stream, stops reconnecting and finishes pending disk writes. */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    for (const t of [this.reconnectTimer, this.connectTimer, this.tunnelsSaveTimer]) if (t) clearTimeout(t);
    if (this.keepaliveTimer) clearInterval(this.keepaliveTimer);
    if (this.tunnelsSaveTimer) void this.persistTunnels();
    this.teardown();
    await this.store.close().catch(() => {});
  }

  // ---------------------------------------------------------------- reports

  sessionUp(s: DpAgentSession): void {
    // A copy of the reported fields only: the caller's object may hold much more (sockets, streams).
    const { id, accountId, credentialId, agentVersion, os, ip, metadata, startedAt } = s;
    const own: DpAgentSession = { id, accountId, credentialId, agentVersion, os, ip, metadata, startedAt };
    this.sessions.set(id, own);
    this.report({ sessionUp: { session: sessionToProto(own) } });
  }

  sessionDown(id: string): void {
    this.sessions.delete(id);
    for (const [tid, t] of this.tunnels) if (t.sessionId === id) this.tunnels.delete(tid);
    this.report({ sessionDown: { id } });
  }

  tunnelUp(t: ReportedTunnel): void {
    const own = tunnelFacts(t);
    this.tunnels.set(own.id, own);
    this.report({ tunnelUp: { tunnel: tunnelToProto(own) } });
  }

  tunnelDown(id: string): void {
    this.tunnels.delete(id);
    this.report({ tunnelDown: { id } });
  }

  /** Sends a report on the open stream; with none, the next connection's full sync carries it. */
  private report(msg: NodeMessage): void {
    const call = this.call;
    if (!call) return;
    if (this.fullSyncWanted) return; // the full sync about to go out includes this change
    if (call.writableLength >= this.opts.maxQueuedReports) {
      this.fullSyncWanted = true;
      this.log.warn({ queued: call.writableLength }, 'control plane stream backed up; reports replaced by a full sync once it drains');
      call.once('drain', () => {
        if (this.call !== call) return;
        this.fullSyncWanted = false;
        this.sendFullSync(this.peerTakesParts);
      });
      return;
    }
    this.write(msg);
  }

  /**
   * All sessions and tunnels in one message. The agent server holds them to a budget well under
   * MAX_FULL_SYNC_BYTES; should they still not fit (a budget configured past it), sessions and
   * then tunnels are sent as far as they fit, the rest left out with an error logged: a node that
   * stays connected gets its config changes, one whose full sync is refused gets none.
   */
  private fullSyncMessage(): NodeMessage {
    const sessions: DpAgentSession[] = [];
    const tunnels: ReportedTunnel[] = [];
    let bytes = 16; // NodeMessage and FullSync tags and lengths
    let left = 0;
    for (const s of this.sessions.values()) {
      const n = sessionReportBytes(s);
      if (bytes + n > MAX_FULL_SYNC_BYTES) left++;
      else {
        bytes += n;
        sessions.push(s);
      }
    }
    for (const t of this.tunnels.values()) {
      const n = tunnelReportBytes(t);
      if (bytes + n > MAX_FULL_SYNC_BYTES) left++;
      else {
        bytes += n;
        tunnels.push(t);
      }
    }
    if (left > 0) this.log.error({ left_out: left, bytes, max: MAX_FULL_SYNC_BYTES }, 'full sync over the size the control plane accepts; sessions and tunnels left out of it');
    return { fullSync: { sessions: sessions.map(sessionToProto), tunnels: tunnels.map(tunnelToProto) } };
  }

  /**
   * All sessions and tunnels in parts of about `fullSyncPartBytes` each (part 0, 1, …, `more`
   * on all but the last), nothing left out. One part when everything fits in one: that message
   * is also a whole full sync to a control plane that does not know parts.
   */
  private fullSyncParts(): NodeMessage[] {
    const target = this.opts.fullSyncPartBytes;
    const parts: { sessions: DpAgentSession[]; tunnels: ReportedTunnel[] }[] = [];
    let cur: (typeof parts)[number] = { sessions: [], tunnels: [] };
    let bytes = 0;
    const room = (n: number) => {
      if (bytes > 0 && 32 + bytes + n > target) {
        parts.push(cur);
        cur = { sessions: [], tunnels: [] };
        bytes = 0;
      }
      bytes += n;
    };
    for (const s of this.sessions.values()) {
      room(sessionReportBytes(s));
      cur.sessions.push(s);
    }
    for (const t of this.tunnels.values()) {
      room(tunnelReportBytes(t));
      cur.tunnels.push(t);
    }
    parts.push(cur);
    return parts.map((p, i) => ({ fullSync: { sessions: p.sessions.map(sessionToProto), tunnels: p.tunnels.map(tunnelToProto), part: i, more: i < parts.length - 1 } }));
  }

  /** Writes the full sync: in parts when the control plane takes them, else as one message (cut to MAX_FULL_SYNC_BYTES). */
  private sendFullSync(inParts: boolean): void {
    if (!inParts) return this.write(this.fullSyncMessage());
    const parts = this.fullSyncParts();
    for (const p of parts) this.write(p);
    if (parts.length > 1) this.log.debug({ parts: parts.length, sessions: this.sessions.size, tunnels: this.tunnels.size }, 'full sync sent in parts');
  }

  // ---------------------------------------------------------------- connection

  private connect(): void {
    if (this.stopped) return;
    const target = this.opts.targets[this.targetIndex % this.opts.targets.length]!;
    if (this.attempts++ > 0) this.metrics.reconnects.inc();
    const Service = configServiceClient();
    const tls = this.opts.tls;
    const creds = tls ? grpc.credentials.createSsl(tls.ca ?? null, tls.key ?? null, tls.cert ?? null) : grpc.credentials.createInsecure();
    const channelOptions: grpc.ChannelOptions = { 'grpc.max_receive_message_length': this.opts.maxReceiveBytes };
    if (tls?.serverNameOverride) channelOptions['grpc.ssl_target_name_override'] = tls.serverNameOverride;
    const grpcClient = new Service(target, creds, channelOptions) as unknown as ConfigServiceClient;
    const md = new grpc.Metadata();
    if (this.opts.token) md.set('authorization', `Bearer ${this.opts.token}`);
    const call = grpcClient.Connect(md);
    this.grpcClient = grpcClient;
    this.call = call;
    this.fullSyncWanted = false;
    this.resyncPending = false;
    this.peerTakesParts = false;
    this.fullSyncOnWelcome = false;
    this.partial = null;
    this.lastHeard = Date.now();
    // The head is what this stream's control plane announces (another one may be of another epoch).
    this.headVersion = 0;
    this.behindSince = 0;

    let ended = false;
    const end = (err?: Error) => {
      if (ended) return;
      ended = true;
      this.onStreamEnd(call, err);
    };
    call.on('data', (m: ControlMessage__Output) => {
      if (this.call !== call) return;
      this.lastHeard = Date.now();
      try {
        this.onMessage(m);
      } catch (err) {
        // Never let a malformed message take the node down: drop the stream and resync.
        this.log.error({ err }, 'control plane message could not be handled; reconnecting');
        call.cancel();
      }
    });
    call.on('error', (err: grpc.ServiceError) => end(err));
    call.on('end', () => end());
    call.on('close', () => end());

    this.write({
      hello: { nodeId: this.opts.nodeId, nodeAddress: this.opts.nodeAddress, appliedVersion: this.current?.version ?? 0, epoch: this.current ? this.epoch : '', agent: `warren-ingress node/${process.version}`, parts: this.opts.parts },
    });
    // A full sync that fits in one part goes out at once, as one message every control plane
    // understands. A larger one waits for the welcome, which says whether the control plane takes
    // parts (an older one would take each part for the whole); reports wait with it.
    const parts = this.opts.parts ? this.fullSyncParts() : null;
    if (!parts) this.write(this.fullSyncMessage());
    else if (parts.length === 1) this.write(parts[0]!);
    else {
      this.fullSyncOnWelcome = true;
      this.fullSyncWanted = true;
    }
    this.connectTimer = setTimeout(() => {
      this.connectTimer = null;
      if (this.call === call && !this.isConnected) {
        this.log.warn({ target }, `no welcome from the control plane within ${this.opts.connectTimeoutMs} ms`);
        call.cancel();
      }
    }, this.opts.connectTimeoutMs);
    this.connectTimer.unref();
  }

  private onStreamEnd(call: grpc.ClientDuplexStream<NodeMessage, ControlMessage__Output>, err?: Error): void {
    if (this.call !== call) return;
    const wasConnected = this.isConnected;
    this.teardown();
    if (this.stopped) return;
    const target = this.opts.targets[this.targetIndex % this.opts.targets.length];
    if (wasConnected) {
      this.failures = 0;
      this.log.warn({ target, err: err?.message }, 'control plane stream ended; reconnecting');
      this.emit('disconnected', err);
    } else {
      // The first failure after a success (or at start), a refused token, then every tenth: visible, not noisy.
      const code = (err as grpc.ServiceError | undefined)?.code;
      const refused = code === grpc.status.UNAUTHENTICATED || code === grpc.status.PERMISSION_DENIED;
      const level = this.failures++ % 10 === 0 || refused ? 'warn' : 'debug';
      this.log[level]({ target, err: err?.message, attempts: this.failures }, refused ? 'control plane refused this node (check WARREN_NODE_TOKEN)' : 'cannot reach the control plane; retrying');
    }
    // Try the next control plane; after a good connection, start again from a short delay.
    this.targetIndex++;
    if (wasConnected) this.backoff.reset();
    this.reconnectTimer = setTimeout(() => {
      this.reconnectTimer = null;
      this.connect();
    }, this.backoff.next());
    this.reconnectTimer.unref();
  }

  private teardown(): void {
    const call = this.call;
    const grpcClient = this.grpcClient;
    this.call = null;
    this.grpcClient = null;
    if (this.connectTimer) clearTimeout(this.connectTimer);
    this.connectTimer = null;
    if (this.keepaliveTimer) clearInterval(this.keepaliveTimer);
    this.keepaliveTimer = null;
    // A snapshot not complete when its stream ended is dropped: the config served stays.
    if (this.partial) this.log.warn({ version: this.partial.version, parts: this.partial.next }, 'stream ended in the middle of a snapshot in parts; dropped it, the config served stays');
    this.partial = null;
    if (this.isConnected) {
      this.isConnected = false;
      this.metrics.connected.set(0);
    }
    if (call) {
      call.removeAllListeners('data');
      call.on('error', () => {}); // a late error of a stream we left must not crash the process
      call.cancel();
    }
    grpcClient?.close();
  }

  private write(msg: NodeMessage): void {
    const call = this.call;
    if (!call) return;
    try {
      call.write(msg);
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, 'write to the control plane failed');
    }
  }

  // ---------------------------------------------------------------- control-plane messages

  private onMessage(m: ControlMessage__Output): void {
    const head = Number(m.headVersion) || 0;
    if (head > this.headVersion) this.headVersion = head;
    if (this.partial && m.msg !== 'snapshot' && m.msg !== 'heartbeat') {
      // The control plane writes a snapshot's parts back to back.
      return this.protocolError(m.msg === 'delta' ? 'delta_mid_snapshot' : 'unexpected_message', `${m.msg ?? 'a message'} before the last part of snapshot ${this.partial.version}`);
    }
    switch (m.msg) {
      case 'welcome':
        if (m.welcome) this.onWelcome(Number(m.welcome.keepaliveIntervalMs) || this.opts.keepaliveIntervalMs, m.welcome.parts === true);
        break;
      case 'snapshot':
        if (m.snapshot) this.onSnapshot(m.snapshot, wireBytes.get(m) ?? 0);
        break;
      case 'delta':
        if (m.delta) this.onDelta(m.delta);
        break;
      case 'tunnels':
        if (m.tunnels) this.onPresence(m.tunnels);
        break;
      default:
        break; // heartbeat, or a message this version does not know
    }
    this.updateVersionMetrics();
  }

  private onWelcome(keepaliveMs: number, peerTakesParts: boolean): void {
    if (this.connectTimer) clearTimeout(this.connectTimer);
    this.connectTimer = null;
    this.peerTakesParts = this.opts.parts && peerTakesParts;
    if (this.fullSyncOnWelcome) {
      this.fullSyncOnWelcome = false;
      this.fullSyncWanted = false;
      this.sendFullSync(this.peerTakesParts);
    }
    this.isConnected = true;
    this.failures = 0;
    this.metrics.connected.set(1);
    this.backoff.reset();
    // The control plane answers every keep-alive: silence for three intervals means it is gone.
    this.silenceLimitMs = keepaliveMs * 3 + 1_000;
    if (this.keepaliveTimer) clearInterval(this.keepaliveTimer);
    this.keepaliveTimer = setInterval(() => {
      const call = this.call;
      if (!call) return;
      if (Date.now() - this.lastHeard > this.silenceLimitMs) {
        this.log.warn({ silent_ms: Date.now() - this.lastHeard }, 'control plane silent; reconnecting');
        call.cancel();
        return;
      }
      if (this.stalled()) {
        this.log.warn({ applied: this.current?.version ?? 0, head: this.headVersion, behind_ms: Date.now() - this.behindSince }, 'config stays behind the control plane head; reconnecting to sync afresh');
        this.behindSince = 0;
        call.cancel();
        return;
      }
      this.write({ keepAlive: {} });
    }, keepaliveMs);
    this.keepaliveTimer.unref();
    this.log.info({ target: this.opts.targets[this.targetIndex % this.opts.targets.length] }, 'connected to the control plane');
    this.emit('connected');
  }

  /**
   * Connected but behind the announced head for longer than `maxConfigLagMs` (a version this
   * node refused aside): the stream delivers nothing more, whatever the reason on the other side.
   */
  private stalled(): boolean {
    const applied = this.current?.version ?? 0;
    if (this.partial && Date.now() - this.partial.lastPartAt < this.opts.maxConfigLagMs) {
      // A snapshot in parts is still arriving.
      this.behindSince = 0;
      return false;
    }
    if (this.headVersion <= applied || this.headVersion <= this.refusedVersion) {
      this.behindSince = 0;
      return false;
    }
    const now = Date.now();
    if (this.behindSince === 0) this.behindSince = now;
    return now - this.behindSince > this.opts.maxConfigLagMs;
  }

  /**
   * A whole snapshot, or one part of one. Parts are gathered (the config served does not change)
   * until the last, then applied as one snapshot. A part out of sequence or of another version or
   * epoch, or gathered parts past `maxSnapshotBytes`, drop what was gathered and the stream.
   */
  private onSnapshot(s: Snapshot__Output, bytes: number): void {
    const version = Number(s.version) || 0;
    const epoch = String(s.epoch ?? '');
    const part = Number(s.part) || 0;
    const more = s.more === true;
    if (part === 0 && !more && !this.partial) return this.applySnapshot(version, epoch, s.resources, s.remoteTunnels ?? []);
    let p = this.partial;
    if (part === 0 ? p !== null : p === null || part !== p.next) {
      return this.protocolError('part_sequence', `snapshot part ${part} of version ${version} out of sequence (expected ${p ? `part ${p.next} of version ${p.version}` : 'part 0'})`);
    }
    if (p && (version !== p.version || epoch !== p.epoch)) {
      return this.protocolError('version_change', `snapshot part ${part} is of version ${version} (${epoch}), the parts before of ${p.version} (${p.epoch})`);
    }
    if (!p) {
      const resources = Object.fromEntries(RESOURCE_KINDS.map((k) => [k, []])) as unknown as PartialSnapshot['resources'];
      p = this.partial = { version, epoch, next: 0, bytes: 0, lastPartAt: 0, resources, remoteTunnels: [] };
    }
    p.next++;
    p.lastPartAt = Date.now();
    p.bytes += bytes;
    if (p.bytes > this.opts.maxSnapshotBytes) {
      this.log.error(
        { version, parts: p.next, bytes: p.bytes, max: this.opts.maxSnapshotBytes },
        'snapshot in parts larger than this node will hold (MAX_CONFIG_SNAPSHOT_BYTES); dropped it and reconnecting, the config served stays',
      );
      return this.protocolError('snapshot_too_large', null);
    }
    for (const k of RESOURCE_KINDS) {
      const list = s.resources?.[k];
      if (Array.isArray(list)) for (const e of list) (p.resources[k] as unknown[]).push(e);
    }
    if (Array.isArray(s.remoteTunnels)) for (const t of s.remoteTunnels) p.remoteTunnels.push(t);
    if (more) return;
    this.partial = null;
    this.log.info({ version, parts: p.next, bytes: p.bytes }, 'snapshot received in parts');
    this.applySnapshot(version, epoch, p.resources as Resources__Output, p.remoteTunnels);
  }

  private applySnapshot(version: number, epoch: string, resources: Resources__Output | null, remoteTunnels: Tunnel__Output[]): void {
    this.resyncPending = false;
    // Remote tunnels first: they are valid whatever becomes of the config.
    this.replaceRemote(remoteTunnels);
    this.apply('snapshot', version, epoch, 0, () => buildConfig(version, resourcesFromProto(resources)));
  }

  /**
   * The control plane broke the snapshot-in-parts protocol (or sent more than this node holds):
   * the partial snapshot is dropped and the stream with it; the next connection syncs afresh.
   */
  private protocolError(reason: string, detail: string | null): void {
    this.metrics.protocolErrors.inc({ reason });
    if (detail) this.log.warn({ reason, detail }, 'config stream protocol error; dropping the partial snapshot and reconnecting');
    this.partial = null;
    const call = this.call;
    if (!call) return;
    call.removeAllListeners('data'); // what is still buffered of this stream is not looked at
    call.cancel();
  }

  private onDelta(d: Delta__Output): void {
    const version = Number(d.version) || 0;
    const from = Number(d.fromVersion) || 0;
    const epoch = String(d.epoch ?? '');
    const cur = this.current;
    const sameEpoch = cur !== null && epoch === this.epoch;
    if (sameEpoch && version <= cur.version) {
      this.resyncPending = false;
      return; // already applied (an answer to a resync that found nothing new)
    }
    if (!sameEpoch || from > cur.version) {
      // A gap (e.g. after a NACK) or another epoch: ask for a delta from what is served, once.
      if (!this.resyncPending) {
        this.resyncPending = true;
        this.log.info({ applied: cur?.version ?? 0, from, version }, 'config delta does not follow the applied version; asking for a resync');
        this.write({ resync: { appliedVersion: sameEpoch ? cur.version : 0, epoch: sameEpoch ? this.epoch : '' } });
      }
      return;
    }
    this.resyncPending = false;
    const committedAt = Number(d.committedAtUnixMs) || 0;
    let delta: DeltaToSave | undefined;
    this.apply('delta', version, epoch, committedAt, () => {
      delta = { prevVersion: cur.version, upserts: resourcesFromProto(d.upserts), deletes: deletesFromProto(d.deletes) };
      return applyDelta(cur, version, delta.upserts, delta.deletes);
    }, () => delta);
  }

  /** Build → check → validators → swap → persist → ACK; any throw before the swap → NACK. */
  private apply(kind: 'snapshot' | 'delta', version: number, epoch: string, committedAtMs: number, build: () => DataPlaneConfig, delta?: () => DeltaToSave | undefined): void {
    let next: DataPlaneConfig;
    try {
      next = build();
      checkConfig(next);
      for (const v of this.validators) v(next);
    } catch (err) {
      const error = (err as Error)?.message || String(err);
      this.metrics.applies.inc({ kind, result: 'rejected' });
      this.log.error({ version, kind, error }, 'config refused; keeping the config served');
      if (version > this.refusedVersion) this.refusedVersion = version;
      this.write({ nack: { version, error: error.slice(0, 4000) } });
      return;
    }
    const previous = this.current;
    this.current = next;
    this.epoch = epoch;
    if (kind === 'delta' && committedAtMs > 0) this.metrics.applyLatency.observe(Math.max(0, Date.now() - committedAtMs) / 1000);
    this.metrics.applies.inc({ kind, result: 'ok' });
    this.updateVersionMetrics();
    this.emitSafely('config', next, previous);
    const call = this.call;
    // A delta is persisted as the delta (the store journals it), a snapshot whole.
    const d = delta?.();
    const saved = d ? this.store.saveDelta(next, epoch, d.prevVersion, d.upserts, d.deletes) : this.store.saveConfig(next, epoch);
    saved.then(
      () => {
        this.persistedVersion = version; // saves settle in the order they were made
        this.persistError = null;
        if (this.call === call) this.write({ ack: { version } });
      },
      (err: unknown) => {
        // Served, but not persisted: still ACK (it is what this node enforces), and say so.
        this.persistError = (err as Error)?.message || String(err);
        this.metrics.persistErrors.inc();
        this.log.error({ err, version }, 'could not persist the config');
        if (this.call === call) this.write({ ack: { version } });
      },
    );
  }

  private onPresence(p: TunnelPresence__Output): void {
    if (p.replaceAll) {
      this.replaceRemote(p.up ?? []);
      return;
    }
    let changed = false;
    for (const m of p.up ?? []) changed = this.upsertRemote(m) || changed;
    for (const id of p.down ?? []) {
      if (typeof id === 'string' && this.remote.delete(id)) {
        changed = true;
        this.emitSafely('remoteTunnelDown', id);
      }
    }
    if (changed) this.remoteChanged();
  }

  private replaceRemote(list: Parameters<typeof tunnelFromProto>[0][]): void {
    const seen = new Set<string>();
    let changed = false;
    for (const m of list) {
      if (typeof m?.id === 'string') seen.add(m.id);
      changed = this.upsertRemote(m) || changed;
    }
    for (const id of [...this.remote.keys()]) {
      if (!seen.has(id)) {
        this.remote.delete(id);
        changed = true;
        this.emitSafely('remoteTunnelDown', id);
      }
    }
    if (changed) this.remoteChanged();
  }

  private upsertRemote(m: Parameters<typeof tunnelFromProto>[0]): boolean {
    let t: DpTunnel;
    try {
      t = tunnelFromProto(m);
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, 'malformed remote tunnel ignored');
      return false;
    }
    if (!t.id || t.nodeId === this.opts.nodeId) return false;
    const old = this.remote.get(t.id);
    if (old && JSON.stringify(old) === JSON.stringify(t)) return false;
    this.remote.set(t.id, Object.freeze(t));
    this.emitSafely('remoteTunnelUp', t);
    return true;
  }

  private remoteChanged(): void {
    this.metrics.remoteTunnels.set(this.remote.size);
    // Coalesce bursts into one write.
    if (this.tunnelsSaveTimer || this.stopped) return;
    this.tunnelsSaveTimer = setTimeout(() => {
      this.tunnelsSaveTimer = null;
      void this.persistTunnels();
    }, 100);
    this.tunnelsSaveTimer.unref();
  }

  private async persistTunnels(): Promise<void> {
    await this.store.saveTunnels([...this.remote.values()]).catch((err: unknown) => {
      this.metrics.persistErrors.inc();
      this.log.error({ err }, 'could not persist remote tunnels');
    });
  }

  private updateVersionMetrics(): void {
    const applied = this.current?.version ?? 0;
    this.metrics.appliedVersion.set(applied);
    this.metrics.headVersion.set(this.headVersion);
    this.metrics.lag.set(Math.max(0, this.headVersion - applied));
  }

  /** A listener that throws must not break the stream handling (the swap already happened). */
  private emitSafely<K extends keyof ControlPlaneClientEvents>(event: K, ...args: ControlPlaneClientEvents[K]): void {
    try {
      (this.emit as (e: K, ...a: ControlPlaneClientEvents[K]) => boolean)(event, ...args);
    } catch (err) {
      this.log.error({ err, event }, 'a config event listener threw');
    }
  }

  // ---------------------------------------------------------------- disk

  private async loadFromDisk(): Promise<void> {
    try {
      const stored = await this.store.loadConfig();
      if (stored) {
        const cfg = buildConfig(stored.version, stored.entities);
        checkConfig(cfg);
        for (const v of this.validators) v(cfg);
        this.current = cfg;
        // A file older than CONFIG_FORMAT lacks entities added since (event subscriptions) that a
        // delta from its version would not bring: no epoch in hello makes the control plane send
        // a snapshot. The config from disk is served meanwhile.
        this.epoch = stored.format < CONFIG_FORMAT ? '' : stored.epoch;
        this.updateVersionMetrics();
        this.log.info({ version: cfg.version, saved_at: stored.savedAt, format: stored.format }, 'serving the last good config from disk');
        this.emitSafely('config', cfg, null);
      }
    } catch (err) {
      this.log.error({ err: (err as Error).message, dir: this.opts.stateDir }, 'persisted config unusable; waiting for the control plane');
    }
    try {
      for (const t of await this.store.loadTunnels()) {
        if (t && typeof t.id === 'string' && t.nodeId !== this.opts.nodeId && typeof t.nodeAddress === 'string') {
          this.remote.set(t.id, Object.freeze(t));
          this.emitSafely('remoteTunnelUp', t);
        }
      }
      this.metrics.remoteTunnels.set(this.remote.size);
    } catch (err) {
      this.log.error({ err: (err as Error).message, dir: this.opts.stateDir }, 'persisted remote tunnels unusable');
    }
  }
}
