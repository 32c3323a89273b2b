import type { ControlMessage, Resources } from '../../../shared/src/proto/index.js';
import { splitSnapshot } from './snapshot-parts.js';

/**
 * Snapshots for nodes that take parts, read and encoded once per version and shared by every node
 * stream that syncs while they are current: after a restart or a network blip many nodes connect
 * at once, and each holding its own copy of the whole config (hundreds of MB) took the control
 * plane down. An entry holds the encoded parts (`ControlMessage` Buffers, which the server's
 * serializer passes through) while a stream still sends from it, and a little longer while it is
 * the newest (`lingerMs`, for nodes still waiting for a sync slot); a superseded one goes as soon
 * as no stream needs it.
 */

export interface SharedSnapshot {
  version: number;
  epoch: string;
  committedAtMs: number;
  /**
   * `ControlMessage{snapshot: part i, head_version}` encoded, parts 0 … n-1, every one with
   * `more`: each stream closes the snapshot with its own last part(s) holding the remote tunnels
   * of that node, numbered from n.
   */
  parts: Buffer[];
  /** What `parts` add up to. */
  bytes: number;
}

export interface SnapshotLease {
  snapshot: SharedSnapshot;
  /** The stream no longer needs it (idempotent). */
  release(): void;
}

interface Entry {
  epoch: string;
  /** The snapshot is of this version or newer (the feed's version when the read began). */
  floor: number;
  ready: Promise<SharedSnapshot>;
  snapshot: SharedSnapshot | null;
  refs: number;
  linger: NodeJS.Timeout | null;
}

export interface SnapshotCacheOptions {
  /** Reads the config at the head and encodes its parts. */
  build: () => Promise<SharedSnapshot>;
  /** How long the newest entry is kept once no stream needs it. */
  lingerMs: number;
  /** Called with the bytes the cache holds whenever that changes. */
  onSize?: (bytes: number) => void;
}

export class SnapshotCache {
  /** Oldest first; the last is the newest. */
  private entries: Entry[] = [];

  constructor(private readonly opts: SnapshotCacheOptions) {}

  /**
   * A snapshot of `epoch` at `minVersion` or newer: one already encoded or being encoded when
   * there is one, else a new one. `minVersion` is the version of the last delta the caller's
   * stream did not buffer (the feed's `lastVersion` once the stream buffers deltas): the caller
   * sends the snapshot and then the deltas after it.
   */
  async acquire(minVersion: number, epoch: string): Promise<SnapshotLease> {
    let entry = [...this.entries].reverse().find((e) => e.epoch === epoch && (e.snapshot ? e.snapshot.version : e.floor) >= minVersion);
    if (!entry) {
      const e: Entry = { epoch, floor: minVersion, ready: this.opts.build(), snapshot: null, refs: 0, linger: null };
      entry = e;
      this.entries.push(e);
      // Entries no stream needs are superseded by this one.
      for (const old of this.entries) if (old !== e && old.refs === 0) this.drop(old);
      e.ready.then(
        (s) => {
          e.snapshot = s;
          if (s.epoch !== e.epoch) e.epoch = s.epoch;
          this.size();
        },
        () => this.drop(e),
      );
    }
    const e = entry;
    e.refs++;
    if (e.linger) clearTimeout(e.linger);
    e.linger = null;
    let snapshot: SharedSnapshot;
    try {
      snapshot = await e.ready;
    } catch (err) {
      e.refs--;
      throw err;
    }
    let released = false;
    return {
      snapshot,
      release: () => {
        if (released) return;
        released = true;
        if (--e.refs > 0) return;
        if (this.entries[this.entries.length - 1] !== e) return this.drop(e);
        e.linger = setTimeout(() => this.drop(e), this.opts.lingerMs);
        e.linger.unref();
      },
    };
  }

  /** Entries held (for tests and metrics). */
  get held(): { version: number | null; refs: number }[] {
    return this.entries.map((e) => ({ version: e.snapshot?.version ?? null, refs: e.refs }));
  }

  /**
   * No entry is handed out again (the version sequence went back: a restored database keeps its
   * epoch, so an entry of a higher version would pass for newer than the head and hide the writes
   * that reuse its version numbers). Streams still sending from one keep it until they release it.
   */
  invalidate(): void {
    for (const e of [...this.entries]) this.drop(e);
  }

  /** Drops every entry no stream needs (e.g. on shutdown). */
  clear(): void {
    for (const e of [...this.entries]) if (e.refs === 0) this.drop(e);
  }

  private drop(e: Entry): void {
    if (e.linger) clearTimeout(e.linger);
    e.linger = null;
    const i = this.entries.indexOf(e);
    if (i >= 0) this.entries.splice(i, 1);
    this.size();
  }

  private size(): void {
    this.opts.onSize?.(this.entries.reduce((n, e) => n + (e.snapshot?.bytes ?? 0), 0));
  }
}

/**
 * Encodes a snapshot's entities as shared parts (see SharedSnapshot): split as splitSnapshot
 * does, each part encoded and let go before the next, yielding to the event loop in between
 * (a large config takes a while; heartbeats and other streams carry on meanwhile).
 */
export async function encodeSharedSnapshot(
  snap: { version: number; epoch: string; committedAtMs: number; resources: Resources },
  opts: { partBytes: number; headVersion: () => number; encode: (m: ControlMessage) => Buffer },
): Promise<SharedSnapshot> {
  const split = splitSnapshot({ version: snap.version, epoch: snap.epoch, committedAtUnixMs: snap.committedAtMs, resources: snap.resources, remoteTunnels: [] }, opts.partBytes).parts;
  const parts: Buffer[] = [];
  let bytes = 0;
  for (let i = 0; i < split.length; i++) {
    const buf = opts.encode({ snapshot: { ...split[i]!, more: true }, headVersion: Math.max(opts.headVersion(), snap.version) });
    (split as unknown[])[i] = null;
    parts.push(buf);
    bytes += buf.length;
    await new Promise<void>((r) => setImmediate(r));
  }
  return { version: snap.version, epoch: snap.epoch, committedAtMs: snap.committedAtMs, parts, bytes };
}
