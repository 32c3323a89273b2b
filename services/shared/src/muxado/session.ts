import { EventEmitter } from 'node:events';
import type { Duplex } from 'node:stream';
import { FLAG_FIN, FLAG_SYN, FrameDecoder, MAX_STREAM_ID, MuxErrorCode, muxErrorCodeName, type FrameSink } from './frame.js';
import { MuxError } from './errors.js';
import { MuxStream, type DrainOnDestroy } from './stream.js';
import { FrameWriter } from './writer.js';

/** Fixed per-stream window (§2 Flow control). */
export const DEFAULT_WINDOW_SIZE = 0x40000;

/**
 * Bytes written to the socket and not yet taken by the peer beyond which the session is ended.
 * Streams stop producing DATA once the socket is full (FrameWriter.congested), so a peer that
 * reads stays far below it (a window's worth plus the socket's high-water mark); only one that
 * keeps sending while never reading (so that RST and WNDINC answers pile up) reaches it.
 */
export const MAX_UNREAD_BYTES = 4 * 1024 * 1024;

export interface MuxSessionOptions {
  /** Client sessions open odd stream ids (1, 3, …), servers even ones (2, 4, …). */
  client: boolean;
  /** Per-stream window each way. Default 256 KiB; must match the peer's (it is not negotiated). */
  windowSize?: number;
  /** Cap on concurrently open streams we opened; `open()` throws `STREAM_CAP` beyond it. */
  maxOutboundStreams?: number;
  /** Cap on concurrently open streams the peer opened; beyond it a SYN is refused with RST. */
  maxInboundStreams?: number;
  /** Largest DATA payload per frame we send. Default 64 KiB. */
  maxFramePayload?: number;
  /** After `goAway()`, how long to wait for the peer to close before destroying the socket. */
  closeTimeoutMs?: number;
}

/** Why a session ended. */
export interface MuxCloseInfo {
  /** `local` we closed it, `remote` the peer sent GOAWAY, `transport` the socket ended or failed, `protocol` the peer broke the protocol. */
  by: 'local' | 'remote' | 'transport' | 'protocol';
  /** muxado error code (from the GOAWAY, or the one we sent). */
  code: number;
  message: string;
}

export interface MuxSessionEvents {
  stream: [stream: MuxStream];
  /** A stream is finished on the wire (both FINs, or a RST either way). */
  release: [stream: MuxStream];
  close: [info: MuxCloseInfo];
}

/**
 * A muxado session over a connected socket (TLS or plain TCP), either role. Streams are
 * {@link MuxStream} Duplexes; incoming ones are announced with `'stream'`. The session never
 * emits `'error'`: every way it can end is reported once through `'close'`, and all its streams
 * are failed with `SESSION_CLOSED`. A malformed peer gets a GOAWAY (Protocol) and the socket is
 * closed; nothing it sends can throw out of the session.
 */
export class MuxSession extends EventEmitter<MuxSessionEvents> implements FrameSink {
  readonly socket: Duplex & { remoteAddress?: string; remotePort?: number; localAddress?: string; localPort?: number };
  readonly writer: FrameWriter;
  private readonly decoder: FrameDecoder;
  private readonly client: boolean;
  private readonly windowSize: number;
  private readonly maxOutbound: number;
  private readonly maxInbound: number;
  private readonly maxFramePayload: number;
  private readonly closeTimeoutMs: number;

  private readonly streams = new Map<number, MuxStream>();
  private outbound = 0;
  private inbound = 0;
  private nextId: number;
  private lastPeerId = 0;
  private closeInfo: MuxCloseInfo | null = null;
  private goingAway = false;

  // The DATA frame being received (set by onDataStart until onDataEnd).
  private rxStream: MuxStream | null = null;
  private rxFlags = 0;

  constructor(socket: Duplex, opts: MuxSessionOptions) {
    super();
    this.socket = socket;
    this.client = opts.client;
    this.windowSize = opts.windowSize ?? DEFAULT_WINDOW_SIZE;
    this.maxOutbound = opts.maxOutboundStreams ?? 1024;
    this.maxInbound = opts.maxInboundStreams ?? 1024;
    this.maxFramePayload = Math.min(opts.maxFramePayload ?? 64 * 1024, this.windowSize);
    this.closeTimeoutMs = opts.closeTimeoutMs ?? 2_000;
    this.nextId = this.client ? 1 : 2;
    this.writer = new FrameWriter(socket);
    this.decoder = new FrameDecoder(this);
    socket.on('data', this.onSocketData);
    socket.on('end', this.onSocketEnd);
    socket.on('error', this.onSocketError);
    socket.on('close', this.onSocketClose);
  }

  /** True once the session has ended (see `'close'`). */
  get closed(): boolean {
    return this.closeInfo !== null;
  }

  /** How it ended, once it has. */
  get closeReason(): MuxCloseInfo | null {
    return this.closeInfo;
  }

  /** Streams we opened that are still open on the wire. */
  get outboundStreams(): number {
    return this.outbound;
  }

  /** Streams the peer opened that are still open on the wire. */
  get inboundStreams(): number {
    return this.inbound;
  }

  /**
   * Opens a stream. Nothing is sent until its first write (which carries SYN) or its end.
   * Throws a {@link MuxError} `STREAM_CAP`, `STREAMS_EXHAUSTED` or `SESSION_CLOSED`.
   */
  open(opts: { allowHalfOpen?: boolean; drainOnDestroy?: DrainOnDestroy } = {}): MuxStream {
    if (this.closeInfo || this.goingAway) throw new MuxError('SESSION_CLOSED', 'session is closed');
    if (this.outbound >= this.maxOutbound) throw new MuxError('STREAM_CAP', `session is at its cap of ${this.maxOutbound} open streams`);
    const id = this.nextId;
    if (id > MAX_STREAM_ID) throw new MuxError('STREAMS_EXHAUSTED', 'no stream ids left in this session');
    this.nextId += 2;
    const stream = new MuxStream(this, id, { windowSize: this.windowSize, maxFramePayload: this.maxFramePayload, allowHalfOpen: opts.allowHalfOpen ?? true, local: true, drainOnDestroy: opts.drainOnDestroy });
    this.streams.set(id, stream);
    this.outbound++;
    return stream;
  }

  /**
   * Ends the session: GOAWAY (with the last peer stream id we processed), then closes the
   * socket once written; if the peer does not close within `closeTimeoutMs`, destroys it.
   */
  goAway(code: number = MuxErrorCode.None, message = ''): void {
    if (this.closeInfo || this.goingAway) return;
    this.goingAway = true;
    this.writer.goAway(this.lastPeerId, code, message);
    this.writer.flush();
    this.finish({ by: 'local', code, message });
    this.socket.end();
    const timer = setTimeout(() => this.socket.destroy(), this.closeTimeoutMs);
    timer.unref();
    this.socket.once('close', () => clearTimeout(timer));
  }

  /** Closes at once without GOAWAY (the transport is unusable or we give up on the peer). */
  destroy(message = 'session destroyed'): void {
    this.finish({ by: 'local', code: MuxErrorCode.SessionClosed, message });
    this.socket.destroy();
  }

  // ---- StreamHost ---------------------------------------------------------------------------

  /** @internal */
  releaseStream(stream: MuxStream): void {
    if (this.streams.get(stream.id) !== stream) return;
    this.streams.delete(stream.id);
    if (this.isLocalId(stream.id)) this.outbound--;
    else this.inbound--;
    this.emit('release', stream);
  }

  // ---- FrameSink ----------------------------------------------------------------------------

  /** @internal */
  onDataStart(streamId: number, flags: number, length: number): void {
    this.rxFlags = flags;
    this.rxStream = null;
    let stream = this.streams.get(streamId);
    if (flags & FLAG_SYN) {
      // Ids are not checked for order: a peer allocates them at open time but sends SYN with
      // the first write, so SYNs of concurrently opened streams may arrive out of order.
      if (stream || this.isLocalId(streamId)) {
        this.protocolError(MuxErrorCode.Protocol, `SYN for stream ${streamId}, which is ${stream ? 'already open' : 'in our id space'}`);
        return;
      }
      if (streamId > this.lastPeerId) this.lastPeerId = streamId;
      if (this.goingAway || this.closeInfo) return;
      if (this.inbound >= this.maxInbound) {
        this.rstUnlessCongested(streamId, MuxErrorCode.StreamRefused);
        return;
      }
      stream = new MuxStream(this, streamId, { windowSize: this.windowSize, maxFramePayload: this.maxFramePayload, allowHalfOpen: true, local: false });
      this.streams.set(streamId, stream);
      this.inbound++;
      this.emit('stream', stream);
      if (stream.destroyed) return;
    } else if (!stream) {
      // Data for a stream we do not know (never opened, or already finished/reset). An empty
      // FIN is harmless; anything else is answered with RST StreamClosed (§2).
      if (length > 0 || !(flags & FLAG_FIN)) this.rstUnlessCongested(streamId, MuxErrorCode.StreamClosed);
      return;
    }
    if (stream.remoteEnded) {
      stream.abort(MuxErrorCode.StreamClosed, new MuxError('WRITE_AFTER_FIN', 'peer sent data after FIN', MuxErrorCode.StreamClosed));
      return;
    }
    if (length > stream.receiveWindow) {
      stream.abort(MuxErrorCode.FlowControl, new MuxError('STREAM_ABORTED', `peer overran the flow-control window (${length} > ${stream.receiveWindow})`, MuxErrorCode.FlowControl));
      return;
    }
    this.rxStream = stream;
  }

  /** @internal */
  onDataChunk(chunk: Buffer): void {
    this.rxStream?.onData(chunk);
  }

  /** @internal */
  onDataEnd(): void {
    const stream = this.rxStream;
    this.rxStream = null;
    if (stream && this.rxFlags & FLAG_FIN) stream.onRemoteFin();
  }

  /** @internal */
  onRst(streamId: number, code: number): void {
    const stream = this.streams.get(streamId);
    if (!stream) return;
    this.releaseStream(stream);
    stream.onReset(code);
  }

  /** @internal */
  onWndInc(streamId: number, increment: number): void {
    this.streams.get(streamId)?.onWindowIncrement(increment);
  }

  /** @internal The peer's GOAWAY is final (§2): everything open fails. */
  onGoAway(_lastStreamId: number, code: number, message: Buffer): void {
    const text = message.toString('utf8').replace(/[^\x20-\x7e]/g, '?');
    this.finish({ by: 'remote', code, message: text || `peer went away (${muxErrorCodeName(code)})` });
    this.socket.end();
    const timer = setTimeout(() => this.socket.destroy(), this.closeTimeoutMs);
    timer.unref();
    this.socket.once('close', () => clearTimeout(timer));
  }

  /** @internal */
  onProtocolError(code: MuxErrorCode, message: string): void {
    this.protocolError(code, message);
  }

  // ---- internals ----------------------------------------------------------------------------

  /**
   * RST for a stream that is not open here (refused, unknown or finished). Not written while the
   * socket is full: a peer that does not read its answers would have us queue 12 bytes for
   * every 8 it sends, without bound (nothing of a stream is lost: it is not open here).
   */
  private rstUnlessCongested(streamId: number, code: number): void {
    if (!this.writer.congested) this.writer.rst(streamId, code);
  }

  private isLocalId(id: number): boolean {
    return (id % 2 === 1) === this.client;
  }

  private protocolError(code: MuxErrorCode, message: string): void {
    this.decoder.abort();
    this.rxStream = null;
    if (this.closeInfo) return;
    this.writer.goAway(this.lastPeerId, code, message);
    this.writer.flush();
    this.finish({ by: 'protocol', code, message });
    this.socket.end();
    const timer = setTimeout(() => this.socket.destroy(), this.closeTimeoutMs);
    timer.unref();
    this.socket.once('close', () => clearTimeout(timer));
  }

  /** Records how the session ended, fails every stream, emits `'close'` once. */
  private finish(info: MuxCloseInfo): void {
    if (this.closeInfo) return;
    this.closeInfo = info;
    this.decoder.abort();
    this.writer.close();
    const err = new MuxError('SESSION_CLOSED', `session closed: ${info.message || muxErrorCodeName(info.code)}`, info.code);
    const streams = [...this.streams.values()];
    this.streams.clear();
    this.outbound = 0;
    this.inbound = 0;
    for (const s of streams) s.onSessionClosed(err);
    this.emit('close', info);
  }

  private readonly onSocketData = (chunk: Buffer): void => {
    if (this.decoder.done) return;
    try {
      this.decoder.push(chunk);
    } catch (err) {
      // A bug in a stream consumer must not take the whole process down.
      this.protocolError(MuxErrorCode.Internal, `internal error: ${(err as Error).message}`);
      return;
    }
    if (this.socket.writableLength > MAX_UNREAD_BYTES) this.destroy(`the peer has not read ${this.socket.writableLength} bytes sent to it`);
  };

  private readonly onSocketEnd = (): void => {
    this.decoder.end();
    this.finish({ by: 'transport', code: MuxErrorCode.PeerEOF, message: 'peer closed the connection' });
    // Half-open transports are useless to us: close our side too.
    this.socket.end();
  };

  private readonly onSocketError = (err: Error): void => {
    this.finish({ by: 'transport', code: MuxErrorCode.SessionClosed, message: `transport error: ${err.message}` });
  };

  private readonly onSocketClose = (): void => {
    this.finish({ by: 'transport', code: MuxErrorCode.SessionClosed, message: 'connection closed' });
  };
}
