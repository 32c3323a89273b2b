import { randomUUID } from 'node:crypto';
import * as grpc from '@grpc/grpc-js';
import type { Logger } from '@warren/shared';
import {
  deletesToProto,
  resourcesToProto,
  sessionFromProto,
  tunnelFromProto,
  tunnelToProto,
  type ControlMessage,
  type NodeMessage__Output,
  type Tunnel,
} from '../../../shared/src/proto/index.js';
import type { DpAgentSession, DpTunnel } from '@warren/shared';
import type { Db } from '../db/pool.js';
import { readDelta, readSnapshot } from './config-reader.js';
import type { ConfigFeed, FeedDelta } from './config-feed.js';
import type { PresenceChange, TunnelDirectory } from './tunnel-directory.js';
import { NodePresence } from './node-presence.js';
import { ingressNodesRepo } from './presence.repo.js';
import type { ConfigPushMetrics } from './metrics.js';
import { messageBytesBound, splitSnapshot } from './snapshot-parts.js';
import type { SnapshotCache, SnapshotLease } from './snapshot-cache.js';

export interface NodeStreamDeps {
  db: Db;
  feed: ConfigFeed;
  directory: TunnelDirectory;
  log: Logger;
  metrics: ConfigPushMetrics;
  replicaId: string;
  /** `PUBLIC_BASE_URL`, for the uris in agent session events. */
  baseUrl: string;
  leaseMs: number;
  keepaliveIntervalMs: number;
  /** A node must say hello within this time. */
  helloTimeoutMs: number;
  /** Messages written but not yet sent before the stream counts as stuck and is ended. */
  maxPendingWrites: number;
  /** Resume with a delta only when it spans at most this many versions; else a snapshot. */
  resumeMaxChanges: number;
  /** Bounds the syncs read at once (many nodes reconnecting must not take every pooled connection). */
  syncSlots: Semaphore;
  /** Target size of one part of a snapshot sent in parts (to nodes whose hello had `parts`). */
  snapshotPartBytes: number;
  /** Snapshots in parts, encoded once per version for every stream (snapshot-cache.ts). */
  snapshots: SnapshotCache;
  /**
   * While a snapshot goes out in parts, the node's stream may take no part for this long before
   * it counts as a slow reader and is ended (as one past `maxPendingWrites` is).
   */
  snapshotStallMs: number;
  /** What the parts of one full sync from a node may add up to (estimated) before its stream is ended. */
  maxFullSyncBytes: number;
  onBadPolicy?: (routeId: string, err: Error) => void;
}

export type NodeCall = grpc.ServerDuplexStream<NodeMessage__Output, ControlMessage>;

// Queued node messages before reading pauses (HTTP/2 flow control then holds the node back).
const PAUSE_AT = 64;
const RESUME_AT = 16;
// Deltas buffered while a sync is read from the database; past this, another sync follows.
const MAX_BUFFERED_DELTAS = 1_000;
// Presence changes held while a snapshot goes out in parts; past this, one `replace_all` follows instead.
const MAX_HELD_PRESENCE = 1_000;
// Messages a snapshot in parts may have written but not yet sent on the stream (each part ~4 MiB):
// the next part waits for room, so a slow node costs a part or two here, not the whole snapshot.
const PARTS_IN_FLIGHT = 2;
const MAX_ID = 200;

type Job = () => Promise<void>;

/**
 * One ingress node's `Connect` stream: hello, then the initial sync (snapshot, or a delta from
 * the node's applied version), then live deltas and tunnel presence; node reports are written
 * through `NodePresence`. Node messages are handled one at a time, in order.
 */
export class NodeStream {
  readonly streamId = randomUUID();
  nodeId = '';
  private nodeAddress = '';
  private presence: NodePresence | null = null;
  private readonly jobs: Job[] = [];
  private running = false;
  private closed = false;
  /**
   * Deltas held back while a sync is read and sent (null: live), and presence changes while a
   * snapshot goes out in parts (nothing may come between its parts); sent in order after.
   */
  private buffer: ({ delta: FeedDelta } | { presence: PresenceChange })[] | null = [];
  private bufferedDeltas = 0;
  private bufferedPresence = 0;
  private bufferOverflowed = false;
  private presenceOverflowed = false;
  /** A snapshot in parts going out (the sync that started it has returned; see sendParts). */
  private sending: Promise<void> | null = null;
  /** A resync asked for while `sending`: done after it. */
  private resyncAfterSend: { applied: number; epoch: string; requested: boolean } | null = null;
  /** Wakes `roomForPart` when a write has gone out. */
  private drainWaiter: (() => void) | null = null;
  /** The version the node reaches by applying everything sent so far. */
  private sentVersion = 0;
  private tunnelsSent = false;
  /** Commit times of recently sent live deltas, for the push latency on ACK (not syncs: their commit may be old). */
  private readonly committedAt = new Map<number, number>();
  private helloTimer: NodeJS.Timeout | null;
  private readonly silenceTimer: NodeJS.Timeout;
  private lastHeard = Date.now();
  private ackWriter: LatestWins<number>;
  private log: Logger;
  /** The node's hello had `parts`: it applies a snapshot sent in parts. */
  private nodeTakesParts = false;
  /** A full sync arriving in parts, until its last part. */
  private partialFullSync: { next: number; sessions: DpAgentSession[]; tunnels: DpTunnel[]; bytes: number } | null = null;

  constructor(
    private readonly call: NodeCall,
    private readonly deps: NodeStreamDeps,
    private readonly onAttach: (s: NodeStream) => void,
    private readonly onClose: (s: NodeStream) => void,
  ) {
    this.log = deps.log.child({ stream: this.streamId, peer: call.getPeer() });
    this.ackWriter = new LatestWins((v) => ingressNodesRepo.applied(deps.db.pool, this.nodeId, v, deps.feed.epoch));
    this.helloTimer = setTimeout(() => this.fail(grpc.status.DEADLINE_EXCEEDED, `no hello within ${deps.helloTimeoutMs} ms`, 'hello_timeout'), deps.helloTimeoutMs);
    // A node that says nothing for a whole lease (keep-alives come every few seconds) is gone:
    // end the stream rather than wait for TCP to notice.
    this.silenceTimer = setInterval(() => {
      if (Date.now() - this.lastHeard > deps.leaseMs) this.fail(grpc.status.DEADLINE_EXCEEDED, `no message for ${deps.leaseMs} ms`, 'silent');
    }, Math.max(250, Math.floor(deps.leaseMs / 4)));
    this.silenceTimer.unref();
    call.on('data', (m: NodeMessage__Output) => {
      this.lastHeard = Date.now();
      // Answered at once, not behind a sync or a slow write: the node judges our liveness by it.
      if (m.msg === 'keepAlive' && this.presence) this.write({ heartbeat: {}, headVersion: this.deps.feed.headVersion });
      this.enqueue(() => this.handle(m));
    });
    call.on('end', () => {
      // The node half-closed: finish our side too, so the call completes.
      this.close('node ended the stream');
      try {
        call.end();
      } catch {
        // already finished
      }
    });
    call.on('cancelled', () => this.close('cancelled'));
    call.on('error', (err) => this.close(`stream error: ${err.message}`));
    call.on('close', () => this.close('closed'));
  }

  /** Ends the stream (e.g. on shutdown); the node reconnects, to another replica if it can. */
  end(code: grpc.status, details: string): void {
    this.fail(code, details, 'shutdown');
  }

  // ---------------------------------------------------------------- fan-out (called by the hub)

  offerDelta(d: FeedDelta): void {
    if (this.closed || !this.presence) return;
    if (this.buffer) {
      if (this.bufferedDeltas < MAX_BUFFERED_DELTAS && !this.bufferOverflowed) {
        this.buffer.push({ delta: d });
        this.bufferedDeltas++;
      } else this.bufferOverflowed = true;
      return;
    }
    if (d.data.version <= this.sentVersion) return;
    if (d.data.fromVersion > this.sentVersion) {
      // Cannot happen while deltas are contiguous; should it, a resync from what was sent repairs it.
      this.log.warn({ from: d.data.fromVersion, sent: this.sentVersion }, 'delta does not follow what was sent; resyncing');
      this.requestResync(this.sentVersion);
      return;
    }
    this.remember(d.data.version, d.data.committedAtMs);
    this.sentVersion = d.data.version;
    this.writeRaw(d.encoded);
  }

  offerPresence(c: PresenceChange): void {
    if (this.closed || !this.tunnelsSent) return;
    if (this.buffer && this.sending) {
      if (this.bufferedPresence < MAX_HELD_PRESENCE && !this.presenceOverflowed) {
        this.buffer.push({ presence: c });
        this.bufferedPresence++;
      } else this.presenceOverflowed = true;
      return;
    }
    const up = c.up.filter((t) => t.nodeId !== this.nodeId);
    const down = c.down.filter((d) => d.nodeId !== this.nodeId).map((d) => d.id);
    if (up.length === 0 && down.length === 0) return;
    this.write({ tunnels: { up: up.map(tunnelToProto), down, replaceAll: false }, headVersion: this.deps.feed.headVersion });
  }

  /** Syncs the node again from `fromVersion` (a delta when possible). */
  requestResync(fromVersion = this.sentVersion): void {
    if (this.closed || !this.presence) return;
    if (!this.buffer) this.buffer = [];
    this.enqueue(() => this.sync(fromVersion, this.deps.feed.epoch));
  }

  // ---------------------------------------------------------------- node messages

  private enqueue(job: Job): void {
    if (this.closed) return;
    this.jobs.push(job);
    if (this.jobs.length >= PAUSE_AT) this.call.pause();
    if (!this.running) void this.runJobs();
  }

  private async runJobs(): Promise<void> {
    this.running = true;
    while (this.jobs.length > 0 && !this.closed) {
      const job = this.jobs.shift()!;
      try {
        await job();
      } catch (err) {
        this.log.error({ err }, 'node stream: handling a message failed');
        this.fail(grpc.status.UNAVAILABLE, 'control plane error; reconnect', 'internal');
      }
      if (this.jobs.length <= RESUME_AT && !this.closed) this.call.resume();
    }
    this.running = false;
  }

  private async handle(m: NodeMessage__Output): Promise<void> {
    if (!this.presence) {
      if (m.msg !== 'hello' || !m.hello) return this.fail(grpc.status.FAILED_PRECONDITION, 'the first message must be hello', 'no_hello');
      return this.hello(m.hello);
    }
    const p = this.presence;
    if (this.partialFullSync && m.msg !== 'fullSync' && m.msg !== 'keepAlive' && m.msg !== 'ack' && m.msg !== 'nack') {
      // The node writes a full sync's parts back to back; a report between them would be lost
      // when the last part replaces its rows.
      return this.fail(grpc.status.FAILED_PRECONDITION, `${m.msg} in the middle of a full sync in parts`, 'bad_full_sync');
    }
    switch (m.msg) {
      case 'ack':
        if (m.ack) this.ack(Number(m.ack.version));
        return;
      case 'nack':
        if (m.nack) return this.nack(Number(m.nack.version), String(m.nack.error ?? ''));
        return;
      case 'sessionUp': {
        const s = m.sessionUp?.session;
        if (!s) return;
        const session = this.parse(() => sessionFromProto(s), 'session_up');
        if (session && validId(session.id)) await p.sessionUp(session);
        return;
      }
      case 'sessionDown':
        if (m.sessionDown && validId(m.sessionDown.id)) await p.sessionDown(m.sessionDown.id);
        return;
      case 'tunnelUp': {
        const t = m.tunnelUp?.tunnel;
        if (!t) return;
        const tunnel = this.parse(() => tunnelFromProto(t), 'tunnel_up');
        if (tunnel && validId(tunnel.id)) await p.tunnelUp(tunnel);
        return;
      }
      case 'tunnelDown':
        if (m.tunnelDown && validId(m.tunnelDown.id)) await p.tunnelDown(m.tunnelDown.id);
        return;
      case 'fullSync': {
        const f = m.fullSync;
        if (!f) return;
        const rawSessions = Array.isArray(f.sessions) ? f.sessions : [];
        const rawTunnels = Array.isArray(f.tunnels) ? f.tunnels : [];
        const sessions = rawSessions.flatMap((s) => this.parse(() => sessionFromProto(s), 'full_sync session') ?? []).filter((s) => validId(s.id));
        const tunnels = rawTunnels.flatMap((t) => this.parse(() => tunnelFromProto(t), 'full_sync tunnel') ?? []).filter((t) => validId(t.id));
        const part = Number(f.part) || 0;
        const more = f.more === true;
        if (part === 0 && !more && !this.partialFullSync) return p.fullSync(sessions, tunnels); // whole, in one message
        // In parts: 0, 1, … with `more` on all but the last; the rows are replaced at the last.
        let partial = this.partialFullSync;
        if (part === 0 ? partial !== null : partial === null || part !== partial.next) {
          return this.fail(grpc.status.FAILED_PRECONDITION, `full sync part ${part} out of sequence (expected ${partial?.next ?? 0})`, 'bad_full_sync');
        }
        partial ??= this.partialFullSync = { next: 0, sessions: [], tunnels: [], bytes: 0 };
        partial.next++;
        for (const x of rawSessions) partial.bytes += messageBytesBound(x);
        for (const x of rawTunnels) partial.bytes += messageBytesBound(x);
        if (partial.bytes > this.deps.maxFullSyncBytes) {
          this.partialFullSync = null;
          return this.fail(grpc.status.RESOURCE_EXHAUSTED, `full sync over ${this.deps.maxFullSyncBytes} bytes`, 'full_sync_too_large');
        }
        for (const s of sessions) partial.sessions.push(s);
        for (const t of tunnels) partial.tunnels.push(t);
        if (more) return;
        this.partialFullSync = null;
        this.log.debug({ parts: partial.next, sessions: partial.sessions.length, tunnels: partial.tunnels.length }, 'full sync received in parts');
        await p.fullSync(partial.sessions, partial.tunnels);
        return;
      }
      case 'keepAlive':
        await p.keepAlive();
        void ingressNodesRepo.seen(this.deps.db.pool, this.nodeId).catch(() => {});
        return;
      case 'resync':
        if (m.resync) return this.sync(Number(m.resync.appliedVersion), String(m.resync.epoch ?? ''), true);
        return;
      case 'hello':
        return this.fail(grpc.status.FAILED_PRECONDITION, 'hello was already sent', 'second_hello');
      default:
        return; // a message type this version does not know: ignored
    }
  }

  private async hello(h: NonNullable<NodeMessage__Output['hello']>): Promise<void> {
    if (this.helloTimer) clearTimeout(this.helloTimer);
    this.helloTimer = null;
    const nodeId = typeof h.nodeId === 'string' ? h.nodeId : '';
    const address = typeof h.nodeAddress === 'string' ? h.nodeAddress : '';
    if (!validId(nodeId)) return this.fail(grpc.status.INVALID_ARGUMENT, 'hello.node_id must be 1 to 200 printable characters', 'bad_hello');
    if (!address || address.length > 300) return this.fail(grpc.status.INVALID_ARGUMENT, 'hello.node_address must be host:port', 'bad_hello');
    this.nodeId = nodeId;
    this.nodeAddress = address;
    this.nodeTakesParts = h.parts === true;
    this.log = this.log.child({ node: nodeId });
    this.presence = new NodePresence(this.deps.db, { id: nodeId, address, leaseMs: this.deps.leaseMs }, this.log, this.deps.baseUrl);
    this.onAttach(this);
    this.log.info({ address, applied_version: Number(h.appliedVersion), agent: h.agent, parts: this.nodeTakesParts }, 'ingress node connected');
    await ingressNodesRepo.connected(this.deps.db.pool, {
      id: nodeId,
      address,
      epoch: String(h.epoch ?? ''),
      appliedVersion: Number(h.appliedVersion) || 0,
      replicaId: this.deps.replicaId,
      streamId: this.streamId,
    });
    this.write({
      // `parts`: this control plane takes full syncs in parts (and sends snapshots in parts to a node whose hello had it).
      welcome: { replicaId: this.deps.replicaId, leaseMs: this.deps.leaseMs, keepaliveIntervalMs: this.deps.keepaliveIntervalMs, epoch: this.deps.feed.epoch, parts: true },
      headVersion: this.deps.feed.headVersion,
    });
    await this.sync(Number(h.appliedVersion) || 0, String(h.epoch ?? ''));
  }

  /**
   * Brings the node from `applied` (of `epoch`) to the head: a delta when the node's version is
   * of this database's epoch and the outbox still covers the range, else a snapshot. Deltas the
   * feed produces meanwhile are buffered and sent after, those already covered skipped.
   */
  private async sync(applied: number, epoch: string, requested = false): Promise<void> {
    if (!this.buffer) this.buffer = [];
    if (this.sending) {
      // After the snapshot going out (nothing may come between its parts), from the oldest version asked.
      const prev = this.resyncAfterSend;
      this.resyncAfterSend = { applied: Math.min(applied, prev?.applied ?? applied), epoch, requested: requested || !!prev?.requested };
      return;
    }
    const release = await this.deps.syncSlots.acquire();
    try {
      await this.syncLocked(applied, epoch, requested);
    } finally {
      release();
    }
  }

  private async syncLocked(applied: number, epoch: string, requested: boolean): Promise<void> {
    if (this.closed) return;
    const { db, feed, directory, metrics } = this.deps;
    const delta = applied > 0 && epoch === feed.epoch ? await readDelta(db.pool, applied, { maxChanges: this.deps.resumeMaxChanges, onBadPolicy: this.deps.onBadPolicy, baseUrl: this.deps.baseUrl }) : null;
    if (this.closed) return;
    const head = () => Math.max(feed.headVersion, this.sentVersion);
    if (delta) {
      metrics.syncs.inc({ kind: 'resume' });
      this.sentVersion = delta.version;
      if (delta.version > applied || requested) {
        this.write({
          delta: {
            fromVersion: applied,
            version: delta.version,
            epoch: delta.epoch,
            upserts: resourcesToProto(delta.upserts),
            deletes: deletesToProto(delta.deletes),
            committedAtUnixMs: delta.committedAtMs,
          },
          headVersion: head(),
        });
      }
      if (!this.tunnelsSent) this.write({ tunnels: { up: directory.remoteFor(this.nodeId).map(tunnelToProto), down: [], replaceAll: true }, headVersion: head() });
    } else {
      metrics.syncs.inc({ kind: 'snapshot' });
      if (this.nodeTakesParts) {
        // Shared with every stream that syncs meanwhile, encoded once; at the version of the last
        // delta fanned out or newer (deltas since are in this stream's buffer).
        const lease = await this.deps.snapshots.acquire(feed.lastVersion, feed.epoch);
        if (this.closed) return lease.release();
        this.sentVersion = lease.snapshot.version;
        // This node's remote tunnels as of now; changes from here on are held with the deltas.
        const tunnels = directory.remoteFor(this.nodeId).map(tunnelToProto);
        this.tunnelsSent = true;
        const sending = this.sendParts(lease, tunnels).finally(() => lease.release());
        this.sending = sending;
        // Not awaited: the node's keep-alives, ACKs and reports are handled while the parts go out.
        void sending
          .then(
            () => {
              this.sending = null;
              this.flushBuffer();
            },
            (err: Error) => {
              this.log.error({ err }, 'node stream: sending a snapshot failed');
              this.fail(grpc.status.UNAVAILABLE, 'control plane error; reconnect', 'internal');
            },
          );
        return;
      }
      const snap = await readSnapshot(db.pool, { onBadPolicy: this.deps.onBadPolicy, baseUrl: this.deps.baseUrl });
      if (this.closed) return;
      this.sentVersion = snap.version;
      const snapshot = {
        version: snap.version,
        epoch: snap.epoch,
        resources: resourcesToProto(snap.entities),
        remoteTunnels: directory.remoteFor(this.nodeId).map(tunnelToProto),
        committedAtUnixMs: snap.committedAtMs,
      };
      // A node that does not know parts gets the snapshot whole, as before (it accepts up to 256 MiB).
      this.write({ snapshot, headVersion: head() });
    }
    this.tunnelsSent = true;
    this.flushBuffer();
  }

  /**
   * Writes a snapshot in parts one at a time, each once the stream has room (PARTS_IN_FLIGHT):
   * the shared parts of the entities, then this node's own last part(s) with its remote tunnels.
   * Nothing else but heartbeats goes out meanwhile (deltas and presence are held in `buffer`); a
   * stream that takes no part for `snapshotStallMs` is ended.
   */
  private async sendParts(lease: SnapshotLease, tunnels: Tunnel[]): Promise<void> {
    const s = lease.snapshot;
    const head = () => Math.max(this.deps.feed.headVersion, this.sentVersion);
    const own = splitSnapshot({ version: s.version, epoch: s.epoch, committedAtUnixMs: s.committedAtMs, resources: {}, remoteTunnels: tunnels }, this.deps.snapshotPartBytes).parts;
    const total = s.parts.length + own.length;
    for (let i = 0; i < total; i++) {
      if (!(await this.roomForPart())) return;
      if (i < s.parts.length) this.call.write(s.parts[i] as unknown as ControlMessage, this.onWritten);
      else {
        const part = own[i - s.parts.length]!;
        this.call.write({ snapshot: { ...part, part: i, more: i < total - 1 }, headVersion: head() }, this.onWritten);
      }
      this.deps.metrics.snapshotParts.inc();
    }
    this.log.debug({ version: s.version, parts: total, bytes: s.bytes }, 'snapshot sent in parts');
  }

  /** Waits until the stream has room for the next part; false when it is closed, or ended for taking none for too long. */
  private async roomForPart(): Promise<boolean> {
    if (this.closed) return false;
    if (this.call.writableLength < PARTS_IN_FLIGHT) return true;
    const stallMs = this.deps.snapshotStallMs;
    const drained = await new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => {
        this.drainWaiter = null;
        resolve(false);
      }, stallMs);
      this.drainWaiter = () => {
        clearTimeout(timer);
        this.drainWaiter = null;
        resolve(true);
      };
    });
    if (this.closed) return false;
    if (!drained) {
      this.fail(grpc.status.RESOURCE_EXHAUSTED, `the node took no part of its snapshot for ${stallMs} ms; reconnect`, 'slow_reader');
      return false;
    }
    return true;
  }

  private readonly onWritten = (): void => {
    if (this.drainWaiter && (this.closed || this.call.writableLength < PARTS_IN_FLIGHT)) this.drainWaiter();
  };

  /** Sends what was held during a sync, in order; then a resync asked for meanwhile, if any. */
  private flushBuffer(): void {
    if (this.closed) return;
    const buffered = this.buffer ?? [];
    const overflowed = this.bufferOverflowed;
    const presenceOverflowed = this.presenceOverflowed;
    this.buffer = null;
    this.bufferedDeltas = this.bufferedPresence = 0;
    this.bufferOverflowed = this.presenceOverflowed = false;
    if (presenceOverflowed) {
      // Too many to hold: the node's whole view of remote tunnels instead, as of now.
      this.write({ tunnels: { up: this.deps.directory.remoteFor(this.nodeId).map(tunnelToProto), down: [], replaceAll: true }, headVersion: Math.max(this.deps.feed.headVersion, this.sentVersion) });
    }
    for (const b of buffered) {
      if ('delta' in b) this.offerDelta(b.delta);
      else if (!presenceOverflowed) this.offerPresence(b.presence);
    }
    const resync = this.resyncAfterSend;
    this.resyncAfterSend = null;
    if (resync) {
      this.buffer = [];
      this.enqueue(() => this.sync(resync.applied, resync.epoch, resync.requested));
    } else if (overflowed) this.requestResync(this.sentVersion);
  }

  private ack(version: number): void {
    if (!Number.isFinite(version)) return;
    const at = this.committedAt.get(version);
    if (at !== undefined) {
      this.deps.metrics.pushLatency.observe(Math.max(0, Date.now() - at) / 1000);
      this.committedAt.delete(version);
    }
    this.ackWriter.set(version);
  }

  private async nack(version: number, error: string): Promise<void> {
    this.deps.metrics.nacks.inc();
    this.log.warn({ version, error }, 'ingress node refused a config version');
    await ingressNodesRepo.rejected(this.deps.db.pool, this.nodeId, version, error);
  }

  // ---------------------------------------------------------------- writing and closing

  private remember(version: number, committedAtMs: number): void {
    this.committedAt.set(version, committedAtMs);
    if (this.committedAt.size > 256) this.committedAt.delete(this.committedAt.keys().next().value!);
  }

  private write(msg: ControlMessage): void {
    if (this.closed || !this.roomToWrite()) return;
    this.call.write(msg, this.onWritten);
  }

  /** A message encoded once for every stream (the server's serializer passes Buffers through). */
  private writeRaw(buf: Buffer): void {
    if (this.closed || !this.roomToWrite()) return;
    this.call.write(buf as unknown as ControlMessage, this.onWritten);
  }

  private roomToWrite(): boolean {
    if (this.call.writableLength < this.deps.maxPendingWrites) return true;
    this.fail(grpc.status.RESOURCE_EXHAUSTED, 'the node does not read its stream fast enough; reconnect', 'slow_reader');
    return false;
  }

  private parse<T>(fn: () => T, what: string): T | undefined {
    try {
      return fn();
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, `node stream: malformed ${what} ignored`);
      return undefined;
    }
  }

  private fail(code: grpc.status, details: string, reason: string): void {
    if (this.closed) return;
    this.deps.metrics.streamErrors.inc({ reason });
    if (reason !== 'shutdown') this.log.warn({ code, details }, 'ending node stream');
    this.call.emit('error', Object.assign(new Error(details), { code, details }));
    this.close(details);
  }

  private close(why: string): void {
    if (this.closed) return;
    this.closed = true;
    if (this.helloTimer) clearTimeout(this.helloTimer);
    clearInterval(this.silenceTimer);
    this.jobs.length = 0;
    this.buffer = null;
    this.resyncAfterSend = null;
    this.drainWaiter?.();
    this.onClose(this);
    if (this.nodeId) {
      this.log.info({ why }, 'ingress node disconnected');
      void ingressNodesRepo.disconnected(this.deps.db.pool, this.nodeId, this.streamId).catch(() => {});
    }
  }
}

/** Ids and names from nodes: 1..200 characters, no control characters. */
function validId(s: unknown): s is string {
  // eslint-disable-next-line no-control-regex
  return typeof s === 'string' && s.length > 0 && s.length <= MAX_ID && !/[\u0000-\u001f\u007f]/.test(s);
}

/** At most `n` holders at once; the others wait in order. */
export class Semaphore {
  private readonly waiting: (() => void)[] = [];
  constructor(private free: number) {}
  async acquire(): Promise<() => void> {
    if (this.free > 0) this.free--;
    else await new Promise<void>((r) => this.waiting.push(r));
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = this.waiting.shift();
      if (next) next();
      else this.free++;
    };
  }
}

/** Runs `fn` with the latest value given; at most one call in flight (e.g. a status row per node). */
class LatestWins<T> {
  private pending: { v: T } | null = null;
  private busy = false;
  constructor(private readonly fn: (v: T) => Promise<void>) {}
  set(v: T): void {
    this.pending = { v };
    if (!this.busy) void this.run();
  }
  private async run(): Promise<void> {
    this.busy = true;
    while (this.pending) {
      const { v } = this.pending;
      this.pending = null;
      await this.fn(v).catch(() => {});
    }
    this.busy = false;
  }
}
