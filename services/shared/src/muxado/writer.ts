import type { Duplex } from 'node:stream';
import { FLAG_FIN, FRAME_HEADER_SIZE, FrameType, MAX_STREAM_ID, writeFrameHeader } from './frame.js';

/** Payloads up to this size are copied next to their header; larger ones are written as is. */
const COPY_THRESHOLD = 16 * 1024;
/** Frames are encoded into slabs of this size; a written region of a slab is never reused. */
const SLAB_SIZE = 64 * 1024;
/** Bytes queued for the next flush beyond which streams hold further DATA (one full window). */
const QUEUE_LIMIT = 256 * 1024;

/**
 * Batches outgoing frames into as few socket writes as possible: every frame queued during one
 * synchronous run (a stream write, a WNDINC after a read, …) goes out in one `write` at the next
 * microtask, header and payload side by side. Headers and small payloads are encoded into a slab
 * (one allocation per 64 KiB of frames, not per frame); large payloads are passed by reference
 * and written with `cork()`/`uncork()` so the socket gathers them into one writev.
 *
 * Backpressure: once the socket reports a full buffer, streams stop producing DATA frames and
 * {@link whenDrained} holds their write callbacks until `'drain'`, so what waits for the socket
 * stays near its high-water mark instead of growing with the number of streams.
 */
export class FrameWriter {
  private slab = Buffer.allocUnsafe(SLAB_SIZE);
  private used = 0;
  private segStart = 0;
  private parts: Buffer[] = [];
  /** Bytes queued since the last flush. */
  private queued = 0;
  private scheduled = false;
  private closed = false;
  private isCongested = false;
  private waiters: Array<() => void> = [];

  constructor(private readonly socket: Duplex) {
    socket.on('drain', this.onDrain);
  }

  /** DATA frame; an empty payload is allowed (e.g. a bare FIN). */
  data(streamId: number, flags: number, payload?: Buffer): void {
    const len = payload?.length ?? 0;
    if (payload && len > COPY_THRESHOLD) {
      this.header(len, FrameType.Data, flags, streamId, 0);
      this.cutSegment();
      this.parts.push(payload);
      this.queued += len;
    } else {
      const at = this.header(len, FrameType.Data, flags, streamId, len);
      if (payload && len > 0) payload.copy(this.slab, at);
    }
    this.schedule();
  }

  /** Empty DATA with FIN (plus SYN when the stream never sent anything). */
  fin(streamId: number, syn: number): void {
    this.data(streamId, FLAG_FIN | syn);
  }

  rst(streamId: number, code: number): void {
    const at = this.header(4, FrameType.Rst, 0, streamId, 4);
    this.slab.writeUInt32BE(code >>> 0, at);
    this.schedule();
  }

  wndInc(streamId: number, increment: number): void {
    const at = this.header(4, FrameType.WndInc, 0, streamId, 4);
    this.slab.writeUInt32BE(increment >>> 0, at);
    this.schedule();
  }

  /** GOAWAY with its real length (8 + message); the peer's decoder requires at least 8. */
  goAway(lastStreamId: number, code: number, message: string): void {
    const msg = Buffer.from(message.slice(0, 256), 'utf8');
    const at = this.header(8 + msg.length, FrameType.GoAway, 0, 0, 8 + msg.length);
    this.slab.writeUInt32BE(lastStreamId & MAX_STREAM_ID, at);
    this.slab.writeUInt32BE(code >>> 0, at + 4);
    msg.copy(this.slab, at + 8);
    this.schedule();
  }

  /** True while the socket's buffer is full (until its `'drain'`). */
  get congested(): boolean {
    return (this.isCongested || this.queued >= QUEUE_LIMIT) && !this.closed;
  }

  /** Calls `cb` now, or once the socket has drained if its buffer is full. */
  whenDrained(cb: () => void): void {
    if (!this.congested) cb();
    else this.waiters.push(cb);
  }

  /** Writes everything queued so far, synchronously. */
  flush(): void {
    this.scheduled = false;
    this.cutSegment();
    const parts = this.parts;
    this.parts = [];
    this.queued = 0;
    if (parts.length === 0 || this.closed) return;
    const sock = this.socket;
    if (sock.destroyed || sock.writableEnded) return;
    let ok: boolean;
    if (parts.length === 1) {
      ok = sock.write(parts[0]!);
    } else {
      sock.cork();
      ok = true;
      for (const p of parts) ok = sock.write(p) && ok;
      sock.uncork();
    }
    if (!ok) this.isCongested = true;
    // Streams held back by the queue limit resume now unless the socket itself is full.
    else this.releaseWaiters();
  }

  /** Drops queued frames and releases waiting callbacks (the session is gone). */
  close(): void {
    this.closed = true;
    this.parts = [];
    this.socket.off('drain', this.onDrain);
    this.releaseWaiters();
  }

  private readonly onDrain = (): void => {
    this.isCongested = false;
    this.releaseWaiters();
  };

  private releaseWaiters(): void {
    const waiters = this.waiters;
    if (waiters.length === 0) return;
    this.waiters = [];
    for (const w of waiters) w();
  }

  /** Reserves header + `inline` bytes in the slab, writes the header, returns the body offset. */
  private header(length: number, type: number, flags: number, streamId: number, inline: number): number {
    const need = FRAME_HEADER_SIZE + inline;
    if (this.used + need > this.slab.length) {
      this.cutSegment();
      this.slab = Buffer.allocUnsafe(Math.max(SLAB_SIZE, need));
      this.used = 0;
      this.segStart = 0;
    }
    writeFrameHeader(this.slab, this.used, length, type, flags, streamId);
    const at = this.used + FRAME_HEADER_SIZE;
    this.used += need;
    this.queued += need;
    return at;
  }

  /** Moves the slab bytes encoded since the last cut into the list of parts to write. */
  private cutSegment(): void {
    if (this.used > this.segStart) {
      this.parts.push(this.slab.subarray(this.segStart, this.used));
      this.segStart = this.used;
    }
  }

  private schedule(): void {
    if (this.scheduled) return;
    this.scheduled = true;
    queueMicrotask(() => this.flush());
  }
}
