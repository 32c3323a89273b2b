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
 * socket. Protocol errors close with 1002, oversize frames with 1009.
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

class WebSocketStream extends Duplex {
  private buf: Buffer = Buffer.alloc(0);
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

  private receive(chunk: Buffer): void {
    this.buf = this.buf.length === 0 ? chunk : Buffer.concat([this.buf, chunk]);
    while (!this.closeReceived) {
      const b = this.buf;
      if (b.length < 2) return;
      const fin = (b[0]! & 0x80) !== 0;
      const rsv = b[0]! & 0x70;
      const opcode = b[0]! & 0x0f;
      const masked = (b[1]! & 0x80) !== 0;
      let len = b[1]! & 0x7f;
      let off = 2;
      if (len === 126) {
        if (b.length < 4) return;
        len = b.readUInt16BE(2);
        off = 4;
      } else if (len === 127) {
        if (b.length < 10) return;
        const big = b.readBigUInt64BE(2);
        if (big > BigInt(MAX_FRAME_BYTES)) return this.fail(1009, 'frame too large');
        len = Number(big);
        off = 10;
      }
      if (rsv !== 0 || !masked) return this.fail(1002, rsv !== 0 ? 'reserved bits set' : 'client frames must be masked');
      if (len > MAX_FRAME_BYTES) return this.fail(1009, 'frame too large');
      const control = opcode >= 8;
      if (control && (!fin || len > 125)) return this.fail(1002, 'bad control frame');
      if (![0, 1, 2, 8, 9, 10].includes(opcode)) return this.fail(1002, 'unknown opcode');
      if (b.length < off + 4 + len) return;
      const mask = b.subarray(off, off + 4);
      const payload = Buffer.allocUnsafe(len);
      const data = off + 4;
      for (let i = 0; i < len; i++) payload[i] = b[data + i]! ^ mask[i & 3]!;
      this.buf = b.subarray(data + len);
      if (opcode === 8) {
        this.closeReceived = true;
        if (!this.closeSent) {
          this.closeSent = true;
          const code = len >= 2 ? payload.readUInt16BE(0) : 1000;
          this.socket.write(encodeFrame(8, closePayload(code === 1005 || code === 1006 || code === 1015 ? 1000 : code)));
        }
        this.socket.end();
        this.push(null);
        return;
      }
      if (opcode === 9) this.socket.write(encodeFrame(10, payload));
      else if (opcode === 10) continue;
      else if (len > 0 && !this.push(payload)) this.socket.pause();
    }
  }

  private fail(code: number, reason: string): void {
    this.buf = Buffer.alloc(0);
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
