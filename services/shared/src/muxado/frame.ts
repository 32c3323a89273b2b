/**
 * muxado frame layout and an incremental decoder (agent-protocol.md §2). Written from that
 * description; all integers are big-endian.
 *
 *   bytes 0–2  body length (uint24, header excluded)
 *   byte  3    high nibble: frame type, low nibble: flags
 *   bytes 4–7  stream id (31 bits, top bit masked off)
 */

export const FRAME_HEADER_SIZE = 8;
/** Largest body a uint24 length can describe. */
export const MAX_FRAME_LENGTH = 0xffffff;
/** Largest window increment a WNDINC may carry. */
export const MAX_WINDOW_INCREMENT = 0x7fffffff;
/** Largest stream id (31 bits). */
export const MAX_STREAM_ID = 0x7fffffff;

export const FrameType = { Rst: 0, Data: 1, WndInc: 2, GoAway: 3 } as const;
export type FrameType = (typeof FrameType)[keyof typeof FrameType];

/** FIN = 0x1, SYN = 0x2 as muxado-go and the Rust crate implement them (§2: not 0x10). */
export const FLAG_FIN = 0x1;
export const FLAG_SYN = 0x2;

/** Error codes carried by RST and GOAWAY (§2). */
export const MuxErrorCode = {
  None: 0,
  Protocol: 1,
  Internal: 2,
  FlowControl: 3,
  StreamClosed: 4,
  StreamRefused: 5,
  StreamCancelled: 6,
  StreamReset: 7,
  FrameSize: 8,
  AcceptQueueFull: 9,
  EnhanceYourCalm: 10,
  RemoteGoneAway: 11,
  StreamsExhausted: 12,
  WriteTimeout: 13,
  SessionClosed: 14,
  PeerEOF: 15,
} as const;
export type MuxErrorCode = (typeof MuxErrorCode)[keyof typeof MuxErrorCode];

const CODE_NAMES = new Map<number, string>(Object.entries(MuxErrorCode).map(([k, v]) => [v, k]));

/** `FlowControl`, `StreamClosed`, … or `code N` for a code outside the table. */
export function muxErrorCodeName(code: number): string {
  return CODE_NAMES.get(code) ?? `code ${code}`;
}

export interface FrameHeader {
  length: number;
  type: number;
  flags: number;
  streamId: number;
}

/** Writes an 8-byte frame header into `buf` at `offset`. */
export function writeFrameHeader(buf: Buffer, offset: number, length: number, type: number, flags: number, streamId: number): void {
  buf[offset] = (length >>> 16) & 0xff;
  buf[offset + 1] = (length >>> 8) & 0xff;
  buf[offset + 2] = length & 0xff;
  buf[offset + 3] = ((type & 0x0f) << 4) | (flags & 0x0f);
  buf.writeUInt32BE(streamId & MAX_STREAM_ID, offset + 4);
}

/** Reads an 8-byte frame header from `buf` at `offset` (the caller checks the length). */
export function readFrameHeader(buf: Buffer, offset = 0): FrameHeader {
  return {
    length: (buf[offset]! << 16) | (buf[offset + 1]! << 8) | buf[offset + 2]!,
    type: buf[offset + 3]! >>> 4,
    flags: buf[offset + 3]! & 0x0f,
    streamId: buf.readUInt32BE(offset + 4) & MAX_STREAM_ID,
  };
}

/** Encodes one whole frame (header + body) into a new buffer. Tests and cold paths only. */
export function encodeFrame(type: number, flags: number, streamId: number, body: Uint8Array = Buffer.alloc(0)): Buffer {
  const out = Buffer.allocUnsafe(FRAME_HEADER_SIZE + body.length);
  writeFrameHeader(out, 0, body.length, type, flags, streamId);
  out.set(body, FRAME_HEADER_SIZE);
  return out;
}

/** Callbacks of a {@link FrameDecoder}. DATA payloads are delivered in pieces as they arrive. */
export interface FrameSink {
  /** A DATA frame header; `length` payload bytes follow through `onDataChunk`, then `onDataEnd`. */
  onDataStart(streamId: number, flags: number, length: number): void;
  onDataChunk(chunk: Buffer): void;
  onDataEnd(): void;
  onRst(streamId: number, code: number): void;
  onWndInc(streamId: number, increment: number): void;
  /** Final: the decoder reads nothing after a GOAWAY. */
  onGoAway(lastStreamId: number, code: number, message: Buffer): void;
  /** Final: a malformed frame; the session should GOAWAY with `code` and close. */
  onProtocolError(code: MuxErrorCode, message: string): void;
}

const enum State {
  Header,
  DataBody,
  SmallBody,
  GoAwayBody,
  Done,
}

/**
 * Incremental frame decoder. Payloads are handed on as sub-views of the input chunks (no copy);
 * only the 8-byte header and the 4/8-byte control bodies are staged when they straddle chunks.
 *
 * GOAWAY is final: the Rust encoder writes its length as the message length only (the 8 fixed
 * bytes left out, §2), so after a GOAWAY header we read the 8 fixed bytes, take whatever message
 * bytes are already at hand for the log, and stop decoding.
 */
export class FrameDecoder {
  private state = State.Header;
  private readonly staged = Buffer.alloc(8);
  private stagedLen = 0;
  private header: FrameHeader = { length: 0, type: 0, flags: 0, streamId: 0 };
  private remaining = 0;

  constructor(private readonly sink: FrameSink) {}

  /** True once a GOAWAY or a protocol error ended decoding. */
  get done(): boolean {
    return this.state === State.Done;
  }

  push(chunk: Buffer): void {
    let pos = 0;
    const len = chunk.length;
    while (pos < len && this.state !== State.Done) {
      switch (this.state) {
        case State.Header: {
          let hdrBuf: Buffer;
          let hdrOff: number;
          if (this.stagedLen === 0 && len - pos >= FRAME_HEADER_SIZE) {
            hdrBuf = chunk;
            hdrOff = pos;
            pos += FRAME_HEADER_SIZE;
          } else {
            const take = Math.min(FRAME_HEADER_SIZE - this.stagedLen, len - pos);
            chunk.copy(this.staged, this.stagedLen, pos, pos + take);
            this.stagedLen += take;
            pos += take;
            if (this.stagedLen < FRAME_HEADER_SIZE) return;
            this.stagedLen = 0;
            hdrBuf = this.staged;
            hdrOff = 0;
          }
          this.onHeader(readFrameHeader(hdrBuf, hdrOff));
          break;
        }
        case State.DataBody: {
          const take = Math.min(this.remaining, len - pos);
          const piece = take === len && pos === 0 ? chunk : chunk.subarray(pos, pos + take);
          pos += take;
          this.remaining -= take;
          this.sink.onDataChunk(piece);
          if (this.remaining === 0) {
            this.state = State.Header;
            this.sink.onDataEnd();
          }
          break;
        }
        case State.SmallBody:
        case State.GoAwayBody: {
          const want = this.state === State.SmallBody ? 4 : 8;
          const take = Math.min(want - this.stagedLen, len - pos);
          chunk.copy(this.staged, this.stagedLen, pos, pos + take);
          this.stagedLen += take;
          pos += take;
          if (this.stagedLen < want) return;
          this.stagedLen = 0;
          if (this.state === State.SmallBody) {
            this.state = State.Header;
            this.onSmallBody(this.staged.readUInt32BE(0));
          } else {
            this.state = State.Done;
            const msgLen = Math.min(Math.max(0, this.header.length - 8), len - pos, 1024);
            this.sink.onGoAway(this.staged.readUInt32BE(0) & MAX_STREAM_ID, this.staged.readUInt32BE(4), Buffer.from(chunk.subarray(pos, pos + msgLen)));
          }
          break;
        }
      }
    }
  }

  /** Stops decoding for good (the session is closing). */
  abort(): void {
    this.state = State.Done;
  }

  /** The transport ended: a GOAWAY still waiting for its fixed fields counts as received. */
  end(): void {
    if (this.state === State.GoAwayBody) {
      this.state = State.Done;
      this.sink.onGoAway(0, MuxErrorCode.None, Buffer.alloc(0));
    }
  }

  private fail(code: MuxErrorCode, message: string): void {
    this.state = State.Done;
    this.sink.onProtocolError(code, message);
  }

  private onHeader(h: FrameHeader): void {
    this.header = h;
    switch (h.type) {
      case FrameType.Data:
        if (h.streamId === 0) return this.fail(MuxErrorCode.Protocol, 'DATA frame on stream 0');
        this.sink.onDataStart(h.streamId, h.flags, h.length);
        if (this.state === State.Done) return; // the sink may have ended the session
        if (h.length === 0) {
          this.sink.onDataEnd();
        } else {
          this.remaining = h.length;
          this.state = State.DataBody;
        }
        return;
      case FrameType.Rst:
      case FrameType.WndInc:
        if (h.streamId === 0) return this.fail(MuxErrorCode.Protocol, `${h.type === FrameType.Rst ? 'RST' : 'WNDINC'} frame on stream 0`);
        if (h.length !== 4) return this.fail(MuxErrorCode.FrameSize, `${h.type === FrameType.Rst ? 'RST' : 'WNDINC'} frame of length ${h.length}`);
        this.state = State.SmallBody;
        return;
      case FrameType.GoAway:
        this.state = State.GoAwayBody;
        return;
      default:
        return this.fail(MuxErrorCode.Protocol, `unknown frame type ${h.type}`);
    }
  }

  private onSmallBody(value: number): void {
    const h = this.header;
    if (h.type === FrameType.Rst) this.sink.onRst(h.streamId, value);
    else this.sink.onWndInc(h.streamId, value & MAX_WINDOW_INCREMENT);
  }
}
