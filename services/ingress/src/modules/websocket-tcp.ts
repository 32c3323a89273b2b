import { isUtf8 } from 'node:buffer';
import { createHash } from 'node:crypto';
import type http from 'node:http';
import { Duplex } from 'node:stream';

/**
 * A WebSocket (RFC 6455) accepted as a plain byte stream: `acceptWebSocketAsTcp` answers the
 * handshake on the client's upgraded socket and returns a Duplex whose readable side carries the
 * payloads of the client's data frames (binary and text alike, reassembled across fragments
 * only in the sense that bytes are passed on in order) and whose writes are sent to the client
 * as binary frames. Pings are answered with pongs; a close frame from the client is echoed and
 * ends the readable side; ending the writable side sends a close frame (1000) and ends the
 * socket. Protocol errors close with 1002 (RFC 6455: unmasked or reserved-bit frames, bad control
 * frames, a continuation without a message or a new message inside one, a close payload of 1 byte
 * or a code no endpoint may send), a close reason that is not UTF-8 with 1007, oversize frames
 * with 1009.
 */

const GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11';

/** Largest frame payload accepted from a client. */
export const MAX_FRAME_BYTES = 16 * 1024 * 1024;

export class WebSocketHandshakeError extends Error {}

/** null when `req` is a WebSocket upgrade this helper can accept, else the reason. */
export function checkWebSocketUpgrade(req: http.IncomingMessage): string | null {
  if (req.method !== 'GET') return 'a WebSocket handshake must be a GET';
  if ((req.headers.upgrade ?? '').toLowerCase() !== 'websocket') return 'Upgrade: websocket is required';
  if (!(req.headers.connection ?? '').toLowerCase().split(',').some((t) => t.trim() === 'upgrade')) return 'Connection: Upgrade is required';
  if (req.headers['sec-websocket-version'] !== '13') return 'Sec-WebSocket-Version must be 13';
  const key = req.headers['sec-websocket-key'];
  if (!key || !/^[A-Za-z0-9+/]{22}==$/.test(key.trim())) return 'Sec-WebSocket-Key is missing or malformed';
  return null;
}

export function acceptKey(key: string): string {
  return createHash('sha1').update(key.trim() + GUID).digest('base64');
}

/** Encodes one frame (server → client: never masked; client tests pass a mask). */
export function encodeFrame(opcode: number, payload: Buffer, fin = true, mask?: Buffer): Buffer {
  const len = payload.length;
  const ext = len < 126 ? 0 : len < 65536 ? 2 : 8;
  const head = Buffer.alloc(2 + ext + (mask ? 4 : 0));
  head[0] = (fin ? 0x80 : 0) | opcode;
  head[1] = (mask ? 0x80 : 0) | (ext === 0 ? len : ext === 2 ? 126 : 127);
  if (ext === 2) head.writeUInt16BE(len, 2);
  else if (ext === 8) head.writeBigUInt64BE(BigInt(len), 2);
  if (!mask) return Buffer.concat([head, payload]);
  mask.copy(head, 2 + ext);
  const body = Buffer.allocUnsafe(len);
  for (let i = 0; i < len; i++) body[i] = payload[i]! ^ mask[i & 3]!;
  return Buffer.concat([head, body]);
}

function closePayload(code: number, reason = ''): Buffer {
  const b = Buffer.alloc(2 + Buffer.byteLength(reason));
  b.writeUInt16BE(code, 0);
  b.write(reason, 2);
  return b;
}

export interface AcceptOptions {
  /** Close the socket this long after sending a close frame when the client does not answer. */
  closeTimeoutMs?: number;
}

/**
 * Completes the WebSocket handshake on an upgraded socket and returns the byte stream. Throws a
 * WebSocketHandshakeError (after answering 400 and closing the socket) when the request is not a
 * valid WebSocket upgrade.
 */
export function acceptWebSocketAsTcp(req: http.IncomingMessage, socket: Duplex, head: Buffer, opts: AcceptOptions = {}): Duplex {
  const problem = checkWebSocketUpgrade(req);
  if (problem) {
    const body = `${problem}\n`;
    socket.end(`HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: ${Buffer.byteLength(body)}\r\nsec-websocket-version: 13\r\nconnection: close\r\n\r\n${body}`);
    throw new WebSocketHandshakeError(problem);
  }
  const offered = (req.headers['sec-websocket-protocol'] ?? '').split(',').map((p) => p.trim());
  const protocol = offered.includes('binary') ? 'sec-websocket-protocol: binary\r\n' : '';
  socket.write(`HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: ${acceptKey(req.headers['sec-websocket-key']!)}\r\n${protocol}\r\n`);
  return new WebSocketStream(socket, head, opts.closeTimeoutMs ?? 5000);
}

const EMPTY = Buffer.alloc(0);
/** The longest frame head: 2 bytes, 8 of extended length, 4 of mask. */
/** Close codes an endpoint may send (RFC 6455 §7.4.1–2): 1000–1003, 1007–1014, and 3000–4999 (registered and private). */
function validCloseCode(code: number): boolean {
  return (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1014) || (code >= 3000 && code <= 4999);
}

const MAX_HEAD_BYTES = 14;

class WebSocketStream extends Duplex {
  /** Part of a frame head that came without the rest. */
  private head: Buffer = EMPTY;
  /** Payload bytes of the current frame still to come; -1 between frames (a head is next). */
  private left = -1;
  private opcode = 0;
  /** A fragmented data message has started and its last (FIN) frame has not come yet. */
  private inMessage = false;
  private mask: Buffer = EMPTY;
  /** Where in the mask the next payload byte is. */
  private maskAt = 0;
  /** A control frame's payload so far. */
  private control: Buffer[] = [];
  private closeSent = false;
  private closeReceived = false;
  private closeTimer: NodeJS.Timeout | null = null;
  private readonly onData = (chunk: Buffer) => this.receive(chunk);

  constructor(
    private readonly socket: Duplex,
    head: Buffer,
    private readonly closeTimeoutMs: number,
  ) {
    super({ allowHalfOpen: true });
    socket.on('data', this.onData);
    socket.on('end', () => {
      if (!this.closeReceived) this.push(null);
      this.closeReceived = true;
    });
    socket.on('error', (err) => this.destroy(err));
    socket.on('close', () => {
      if (this.closeTimer) clearTimeout(this.closeTimer);
      if (!this.closeReceived) this.push(null);
      this.closeReceived = true;
      if (!this.destroyed && !this.writableFinished) this.destroy();
    });
    if (head.length > 0) this.receive(head);
  }

  /**
   * Parses frames as their bytes come: a data frame's payload is unmasked and passed on piece by
   * piece (the stream is bytes, not messages), so a large frame sent slowly costs its length once,
   * not its length for every piece (it used to be gathered whole by copying all that had come with
   * each piece: 15-25 s of CPU for one 16 MiB frame in 1-4 KiB pieces). Only a frame head (at
   * most 14 bytes) and a control frame's payload (at most 125) are gathered.
   */
  private receive(chunk: Buffer): void {
    let data = chunk;
    while (data.length > 0 && !this.closeReceived) {
      if (this.left < 0) {
        // A frame head: up to 14 bytes, which may come in several pieces.
        const b = this.head.length > 0 ? Buffer.concat([this.head, data.subarray(0, MAX_HEAD_BYTES)]) : data;
        const size = this.frameHead(b);
        if (size === undefined) return; // failed (closed)
        if (size === 0) {
          // Not all of it yet: b holds the rest of `data`, which is shorter than a head.
          this.head = Buffer.from(b);
          return;
        }
        data = data.subarray(size - this.head.length);
        this.head = EMPTY;
        if (this.left === 0 && this.frameDone()) return;
        continue;
      }
      const n = Math.min(this.left, data.length);
      const out = Buffer.allocUnsafe(n);
      const mask = this.mask;
      let m = this.maskAt;
      for (let i = 0; i < n; i++) {
        out[i] = data[i]! ^ mask[m]!;
        m = (m + 1) & 3;
      }
      this.maskAt = m;
      this.left -= n;
      data = data.subarray(n);
      if (this.opcode >= 8) this.control.push(out);
      else if (!this.push(out)) this.socket.pause();
      if (this.left === 0 && this.frameDone()) return;
    }
  }

  /**
   * Reads a frame head at the start of `b`: its size in bytes (the frame's fields are set), 0
   * when `b` holds only part of it, undefined when it is refused (the WebSocket is failed).
   */
  private frameHead(b: Buffer): number | undefined {
    if (b.length < 2) return 0;
    const fin = (b[0]! & 0x80) !== 0;
    const rsv = b[0]! & 0x70;
    const opcode = b[0]! & 0x0f;
    const masked = (b[1]! & 0x80) !== 0;
    let len = b[1]! & 0x7f;
    let off = 2;
    if (len === 126) {
      if (b.length < 4) return 0;
      len = b.readUInt16BE(2);
      off = 4;
    } else if (len === 127) {
      if (b.length < 10) return 0;
      const big = b.readBigUInt64BE(2);
      if (big > BigInt(MAX_FRAME_BYTES)) return void this.fail(1009, 'frame too large');
      len = Number(big);
      off = 10;
    }
    if (rsv !== 0 || !masked) return void this.fail(1002, rsv !== 0 ? 'reserved bits set' : 'client frames must be masked');
    if (len > MAX_FRAME_BYTES) return void this.fail(1009, 'frame too large');
    const control = opcode >= 8;
    if (control && (!fin || len > 125)) return void this.fail(1002, 'bad control frame');
    if (![0, 1, 2, 8, 9, 10].includes(opcode)) return void this.fail(1002, 'unknown opcode');
    // RFC 6455 §5.4: a continuation needs a message started; a new message may not start inside one.
    if (opcode === 0 && !this.inMessage) return void this.fail(1002, 'continuation frame without a message');
    if ((opcode === 1 || opcode === 2) && this.inMessage) return void this.fail(1002, 'new message inside a fragmented one');
    if (b.length < off + 4) return 0;
    if (!control) this.inMessage = !fin;
    this.mask = Buffer.from(b.subarray(off, off + 4));
    this.maskAt = 0;
    this.opcode = opcode;
    this.left = len;
    this.control = [];
    return off + 4;
  }

  /** The current frame's payload has all come: acts on a control frame. True when reading ends (a close). */
  private frameDone(): boolean {
    this.left = -1;
    const opcode = this.opcode;
    if (opcode < 8) return false;
    const payload = this.control.length === 1 ? this.control[0]! : Buffer.concat(this.control);
    this.control = [];
    if (opcode === 8) {
      // RFC 6455 §5.5.1 and §7.4: a close payload is empty or a code of 2 bytes (then UTF-8); a
      // code no endpoint may send (under 1000, 1004–1006, 1015, 1016–2999, 5000 and up) fails it.
      const code = payload.length >= 2 ? payload.readUInt16BE(0) : 0;
      if (payload.length === 1) return this.failed(1002, 'close frame with a 1-byte payload');
      if (payload.length >= 2 && !validCloseCode(code)) return this.failed(1002, `close code ${code} may not be sent`);
      if (payload.length > 2 && !isUtf8(payload.subarray(2))) return this.failed(1007, 'close reason is not UTF-8');
      this.closeReceived = true;
      if (!this.closeSent) {
        this.closeSent = true;
        this.socket.write(encodeFrame(8, closePayload(payload.length >= 2 ? code : 1000)));
      }
      this.socket.end();
      this.push(null);
      return true;
    }
    if (opcode === 9) this.socket.write(encodeFrame(10, payload));
    return false;
  }

  /** {@link fail} for {@link frameDone}: reading ends. */
  private failed(code: number, reason: string): true {
    this.fail(code, reason);
    return true;
  }

  private fail(code: number, reason: string): void {
    this.head = EMPTY;
    this.closeReceived = true;
    if (!this.closeSent) {
      this.closeSent = true;
      this.socket.write(encodeFrame(8, closePayload(code, reason)));
    }
    this.socket.end();
    this.destroy(new Error(`WebSocket protocol error: ${reason}`));
  }

  override _read(): void {
    this.socket.resume();
  }

  override _write(chunk: Buffer, _enc: BufferEncoding, cb: (err?: Error | null) => void): void {
    if (this.closeSent) return cb(new Error('the WebSocket is closing'));
    this.socket.write(encodeFrame(2, chunk), (err) => cb(err ?? null));
  }

  override _final(cb: (err?: Error | null) => void): void {
    if (!this.closeSent) {
      this.closeSent = true;
      this.socket.write(encodeFrame(8, closePayload(1000)));
    }
    if (this.closeReceived) this.socket.end();
    else {
      this.closeTimer = setTimeout(() => this.socket.destroy(), this.closeTimeoutMs);
      this.closeTimer.unref();
    }
    cb();
  }

  override _destroy(err: Error | null, cb: (err?: Error | null) => void): void {
    if (this.closeTimer) clearTimeout(this.closeTimer);
    this.socket.off('data', this.onData);
    this.socket.destroy();
    cb(err);
  }
}
