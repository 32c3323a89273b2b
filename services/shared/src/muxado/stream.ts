import { Duplex } from 'node:stream';
import { FLAG_SYN, MAX_WINDOW_INCREMENT, MuxErrorCode } from './frame.js';
import { MuxError } from './errors.js';
import type { FrameWriter } from './writer.js';

/** What a stream needs from its session. */
export interface StreamHost {
  readonly writer: FrameWriter;
  /** The transport socket, for the `remoteAddress`-style properties. */
  readonly socket: { remoteAddress?: string | undefined; remotePort?: number | undefined; localAddress?: string | undefined; localPort?: number | undefined };
  /** The stream is finished on the wire (both FINs, or a RST either way): forget it. */
  releaseStream(stream: MuxStream): void;
}

export interface MuxStreamOptions {
  /** Per-stream window each way (§2 Flow control: fixed 256 KiB). */
  windowSize: number;
  /** Largest DATA payload we send in one frame. */
  maxFramePayload: number;
  /**
   * Keep our write side open after the peer's FIN (true: raw TCP-style half-close). With false
   * the stream ends its write side once the peer's data is read to the end, like a `net.Socket`
   * by default, which is what `http.Agent` expects of a keep-alive socket.
   */
  allowHalfOpen: boolean;
  /** We opened it: our first frame carries SYN. */
  local: boolean;
  /** See {@link DrainOnDestroy}; only for streams we open. */
  drainOnDestroy?: DrainOnDestroy | undefined;
}

/**
 * How a stream destroyed locally before the peer's FIN leaves the wire: instead of RST at once,
 * FIN, then discard (and acknowledge) what the peer still sends until its FIN, which releases the
 * stream as a normal finish; RST only once the peer has sent `maxBytes` more, or after `maxMs`.
 * Until then the session still counts the stream. For peers (the ngrok SDK) that hold a reset
 * stream until their own side of it is done, with nothing on the wire saying when: the peer's FIN
 * says it.
 */
export interface DrainOnDestroy {
  maxBytes: number;
  maxMs: number;
}

const noop = (): void => {};

/**
 * One muxado stream as a Node `Duplex`, usable wherever a `net.Socket` is (e.g. returned by an
 * `http.Agent`'s `createConnection`).
 *
 * Flow control (§2): we may send at most `sendWindow` bytes before the peer's WNDINC; the peer
 * may send at most `windowSize` bytes we have not acknowledged. We acknowledge (WNDINC) only
 * bytes the consumer has taken out of the readable side, so a consumer that stops reading stops
 * the sender; what we hold per stream is bounded by the window plus the readable high-water mark.
 *
 * An `'error'` without a listener never crashes the process: every stream carries a no-op
 * `'error'` listener (pipe, pipeline and http add their own).
 */
export class MuxStream extends Duplex {
  readonly id: number;
  /** Idle timeout in ms (net.Socket compatibility; 0 = off). */
  timeout = 0;
  readonly connecting = false;

  private readonly host: StreamHost;
  private readonly maxFramePayload: number;
  private readonly ackThreshold: number;
  private synFlag: number;
  private sendWindow: number;
  private pendingWrite: { chunk: Buffer; offset: number; cb: (err?: Error | null) => void } | null = null;
  private awaitingDrain = false;

  /** Received bytes not yet handed to the readable side. */
  private queue: Buffer[] = [];
  private wantRead = false;
  private pushedBytes = 0;
  private ackedBytes = 0;
  /** Bytes the peer may still send before our next WNDINC. */
  private recvWindow: number;

  private remoteFin = false;
  private eofPushed = false;
  private localFin = false;
  /** No longer known to the session (finished or reset on the wire). */
  private released = false;
  /** We sent RST before the peer's FIN: the peer may hold the stream for as long as it likes. */
  private resetEarly = false;
  private readonly drainOpts: DrainOnDestroy | undefined;
  /** Destroyed here, FIN sent, waiting for the peer's FIN (see DrainOnDestroy). */
  private draining: { discarded: number; timer: NodeJS.Timeout } | null = null;
  private idleTimer: NodeJS.Timeout | null = null;

  constructor(host: StreamHost, id: number, opts: MuxStreamOptions) {
    // At most `hwm` received bytes sit in the readable buffer; the rest of the window waits in
    // `queue` until the consumer asks for more (see _read).
    const hwm = Math.max(1, Math.min(64 * 1024, Math.floor(opts.windowSize / 4)));
    super({ allowHalfOpen: opts.allowHalfOpen, readableHighWaterMark: hwm, writableHighWaterMark: 64 * 1024, decodeStrings: true, emitClose: true, autoDestroy: true });
    this.host = host;
    this.id = id;
    this.maxFramePayload = opts.maxFramePayload;
    this.ackThreshold = Math.max(1, Math.min(16 * 1024, Math.floor(opts.windowSize / 8)));
    this.synFlag = opts.local ? FLAG_SYN : 0;
    this.sendWindow = opts.windowSize;
    this.recvWindow = opts.windowSize;
    this.drainOpts = opts.drainOnDestroy;
    this.on('error', noop);
  }

  // ---- net.Socket compatibility -------------------------------------------------------------

  get remoteAddress(): string | undefined {
    return this.host.socket.remoteAddress;
  }
  get remotePort(): number | undefined {
    return this.host.socket.remotePort;
  }
  get localAddress(): string | undefined {
    return this.host.socket.localAddress;
  }
  get localPort(): number | undefined {
    return this.host.socket.localPort;
  }

  setNoDelay(_noDelay?: boolean): this {
    return this;
  }
  setKeepAlive(_enable?: boolean, _initialDelay?: number): this {
    return this;
  }
  ref(): this {
    return this;
  }
  unref(): this {
    return this;
  }

  /** Emits `'timeout'` after `ms` without reads or writes, like `net.Socket#setTimeout`. */
  setTimeout(ms: number, cb?: () => void): this {
    this.timeout = ms;
    if (cb) {
      if (ms === 0) this.off('timeout', cb);
      else this.once('timeout', cb);
    }
    if (this.idleTimer) {
      clearTimeout(this.idleTimer);
      this.idleTimer = null;
    }
    if (ms > 0 && !this.destroyed) {
      this.idleTimer = setTimeout(() => this.emit('timeout'), ms);
      this.idleTimer.unref();
    }
    return this;
  }

  /** Ends the write side, then destroys once it is flushed (net.Socket#destroySoon). */
  destroySoon(): void {
    if (this.writable) this.end();
    if (this.writableFinished) this.destroy();
    else this.once('finish', () => this.destroy());
  }

  // ---- session → stream ---------------------------------------------------------------------

  /** @internal Bytes the peer may still send; the session RSTs a DATA frame larger than this. */
  get receiveWindow(): number {
    return this.recvWindow;
  }

  /** @internal True once the peer sent FIN. */
  get remoteEnded(): boolean {
    return this.remoteFin;
  }

  /**
   * True once the stream left the wire by our RST before the peer's FIN: the peer may still hold
   * it (the SDK does, until its upstream is done). False for streams finished or reset by the peer.
   */
  get resetBeforeRemoteFin(): boolean {
    return this.resetEarly;
  }

  /** True while destroyed here and waiting for the peer's FIN (see DrainOnDestroy). */
  get drainingOnWire(): boolean {
    return this.draining !== null;
  }

  /** @internal Payload of a DATA frame (already checked against the window). */
  onData(chunk: Buffer): void {
    this.recvWindow -= chunk.length;
    this.touch();
    if (this.draining) {
      this.discard(chunk.length);
      return;
    }
    if (this.eofPushed || this.destroyed) return;
    if (this.wantRead && this.queue.length === 0) {
      this.pushedBytes += chunk.length;
      this.wantRead = this.push(chunk);
      // A flowing consumer may have taken the chunk right inside push().
      this.acknowledge();
    } else {
      this.queue.push(chunk);
    }
  }

  /** @internal The peer's FIN. */
  onRemoteFin(): void {
    if (this.remoteFin) return;
    this.remoteFin = true;
    if (this.wantRead && this.queue.length === 0 && !this.eofPushed && !this.destroyed) {
      this.eofPushed = true;
      this.push(null);
    }
    this.maybeRelease();
  }

  /** @internal The peer's WNDINC. */
  onWindowIncrement(increment: number): void {
    this.sendWindow = Math.min(this.sendWindow + increment, MAX_WINDOW_INCREMENT);
    this.pump();
  }

  /** @internal The peer's RST. */
  onReset(code: number): void {
    this.released = true;
    this.stopDraining();
    this.destroy(MuxError.reset(code));
  }

  /** @internal We reset the stream (flow-control or protocol violation): RST, then fail it. */
  abort(code: number, err: MuxError): void {
    if (!this.released) {
      this.released = true;
      this.stopDraining();
      if (!this.remoteFin) this.resetEarly = true;
      this.host.writer.rst(this.id, code);
      this.host.releaseStream(this);
    }
    this.destroy(err);
  }

  /** @internal The session is gone: fail the stream without any frame. */
  onSessionClosed(err: MuxError): void {
    this.released = true;
    this.stopDraining();
    this.destroy(err);
  }

  // ---- Duplex implementation ----------------------------------------------------------------

  /**
   * Every way of consuming a Readable (read(), 'data' in flowing mode, async iteration, pipe)
   * goes through read(), so this is where consumed bytes are acknowledged.
   */
  override read(size?: number): any {
    const out: unknown = super.read(size);
    this.acknowledge();
    return out;
  }

  override _read(): void {
    this.wantRead = true;
    const q = this.queue;
    while (this.wantRead && q.length > 0) {
      const chunk = q.shift()!;
      this.pushedBytes += chunk.length;
      this.wantRead = this.push(chunk);
    }
    if (q.length === 0 && this.remoteFin && !this.eofPushed) {
      this.eofPushed = true;
      this.push(null);
      return;
    }
    this.acknowledge();
  }

  override _write(chunk: Buffer, _enc: BufferEncoding, cb: (err?: Error | null) => void): void {
    if (this.released) {
      cb(new MuxError('SESSION_CLOSED', 'stream is closed'));
      return;
    }
    this.touch();
    this.pendingWrite = { chunk, offset: 0, cb };
    this.pump();
  }

  override _writev(chunks: Array<{ chunk: Buffer }>, cb: (err?: Error | null) => void): void {
    this._write(chunks.length === 1 ? chunks[0]!.chunk : Buffer.concat(chunks.map((c) => c.chunk)), 'latin1', cb);
  }

  override _final(cb: (err?: Error | null) => void): void {
    if (!this.released && !this.localFin) {
      this.localFin = true;
      this.host.writer.fin(this.id, this.takeSyn());
      this.maybeRelease();
    }
    cb();
  }

  override _destroy(err: Error | null, cb: (err?: Error | null) => void): void {
    if (this.idleTimer) {
      clearTimeout(this.idleTimer);
      this.idleTimer = null;
    }
    if (!this.released && this.drainOpts && this.synFlag === 0 && !this.remoteFin && !this.draining) {
      // FIN, and keep the stream on the wire until the peer's FIN (see DrainOnDestroy).
      if (!this.localFin) {
        this.localFin = true;
        this.host.writer.fin(this.id, 0);
      }
      const timer = setTimeout(() => this.resetDraining(), this.drainOpts.maxMs);
      timer.unref();
      this.draining = { discarded: 0, timer };
      // Unread bytes were never acknowledged: the peer's window counts them, so free it too.
      let unread = this.pushedBytes - this.ackedBytes;
      for (const c of this.queue) unread += c.length;
      this.queue = [];
      this.discard(unread, true);
    } else if (!this.released) {
      this.released = true;
      // A stream we opened but never announced needs nothing: the peer never heard of it.
      if (this.synFlag === 0) {
        // FIN before the RST: the SDK's muxado does not wake a stream blocked in read on RST
        // (it only closes the stream's sending side), so an idle stream — e.g. a keep-alive
        // connection the agent forwards — would keep its slot until its upstream hangs up.
        // The FIN makes that read return end-of-stream at once, and the agent lets go.
        if (!this.localFin) this.host.writer.fin(this.id, 0);
        this.host.writer.rst(this.id, err ? MuxErrorCode.Internal : MuxErrorCode.StreamCancelled);
        if (!this.remoteFin) this.resetEarly = true;
      }
      this.host.releaseStream(this);
    }
    this.queue = [];
    const pending = this.pendingWrite;
    if (pending) {
      this.pendingWrite = null;
      pending.cb(err ?? new MuxError('SESSION_CLOSED', 'stream destroyed'));
    }
    cb(err);
  }

  // ---- internals ----------------------------------------------------------------------------

  private takeSyn(): number {
    const f = this.synFlag;
    this.synFlag = 0;
    return f;
  }

  /**
   * Sends as much of the pending write as the window allows, and nothing while the socket is
   * congested (the rest waits here, in the caller's own buffer); completes it when all is sent.
   */
  private pump(): void {
    const p = this.pendingWrite;
    if (!p || this.released) return;
    const writer = this.host.writer;
    if (writer.congested) {
      if (!this.awaitingDrain) {
        this.awaitingDrain = true;
        writer.whenDrained(() => {
          this.awaitingDrain = false;
          this.pump();
        });
      }
      return;
    }
    const { chunk } = p;
    while (p.offset < chunk.length && this.sendWindow > 0 && !writer.congested) {
      const n = Math.min(chunk.length - p.offset, this.sendWindow, this.maxFramePayload);
      const piece = p.offset === 0 && n === chunk.length ? chunk : chunk.subarray(p.offset, p.offset + n);
      writer.data(this.id, this.takeSyn(), piece);
      p.offset += n;
      this.sendWindow -= n;
    }
    if (p.offset >= chunk.length) {
      this.pendingWrite = null;
      writer.whenDrained(p.cb);
    } else if (this.sendWindow > 0) {
      this.pump(); // stopped by congestion: wait for the drain
    }
  }

  /**
   * WNDINC for what the consumer has taken out of the readable side since the last one. Sent in
   * batches of `ackThreshold`, or at once when everything received has been consumed.
   */
  private acknowledge(): void {
    if (this.remoteFin || this.released) return;
    const consumed = this.pushedBytes - this.readableLength;
    const delta = consumed - this.ackedBytes;
    if (delta <= 0) return;
    if (delta >= this.ackThreshold || (this.readableLength === 0 && this.queue.length === 0)) {
      this.ackedBytes += delta;
      this.recvWindow += delta;
      this.host.writer.wndInc(this.id, delta);
    }
  }

  /** Draining: drop `n` bytes the peer sent (acknowledging them) or, past the budget, RST. */
  private discard(n: number, unacked = false): void {
    const d = this.draining!;
    d.discarded += n;
    if (d.discarded > this.drainOpts!.maxBytes) {
      this.resetDraining();
      return;
    }
    if (n > 0 && !this.remoteFin) {
      if (unacked) this.ackedBytes += n;
      this.recvWindow += n;
      this.host.writer.wndInc(this.id, n);
    }
  }

  /** Draining took too long or too many bytes: RST. */
  private resetDraining(): void {
    if (this.released || !this.draining) return;
    this.stopDraining();
    this.released = true;
    this.resetEarly = true;
    this.host.writer.rst(this.id, MuxErrorCode.StreamCancelled);
    this.host.releaseStream(this);
  }

  private stopDraining(): void {
    if (!this.draining) return;
    clearTimeout(this.draining.timer);
    this.draining = null;
  }

  private maybeRelease(): void {
    if (this.localFin && this.remoteFin && !this.released) {
      this.stopDraining();
      this.released = true;
      this.host.releaseStream(this);
    }
  }

  private touch(): void {
    this.idleTimer?.refresh();
  }
}
