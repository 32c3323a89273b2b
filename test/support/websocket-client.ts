import { createHash, randomBytes } from 'node:crypto';
import net from 'node:net';
import tls from 'node:tls';

/**
 * A minimal hand-written RFC 6455 client for end-to-end tests: it speaks the handshake and the
 * framing itself (no library), so that what the ingress sends is checked byte for byte. Client
 * frames are always masked; server frames must not be.
 */

const GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11';

export const OPCODE = { continuation: 0, text: 1, binary: 2, close: 8, ping: 9, pong: 10 } as const;

export interface WsFrame {
  fin: boolean;
  opcode: number;
  masked: boolean;
  payload: Buffer;
}

export interface WsOpenOptions {
  port: number;
  /** Host header (the edge's hostname). */
  host: string;
  path?: string;
  /** Connect with TLS: the CA to trust and the SNI name (default `host`). */
  tls?: { ca: string; servername?: string };
  /** Extra or overriding request headers (e.g. a wrong Sec-WebSocket-Version). */
  headers?: Record<string, string>;
  timeoutMs?: number;
}

export interface WsHandshake {
  /** Status of the server's answer (101 on success). */
  status: number;
  statusLine: string;
  /** Response headers, lower-cased names. */
  headers: Record<string, string>;
  /** The key sent and the accept value expected for it. */
  key: string;
  expectedAccept: string;
  /** For a refusal: the body that followed the head (read until the server closed). */
  body: string;
}

export function acceptFor(key: string): string {
  return createHash('sha1').update(key + GUID).digest('base64');
}

/** Encodes one client frame, masked with a random key. */
export function maskedFrame(opcode: number, payload: Buffer, fin = true): Buffer {
  const len = payload.length;
  const ext = len < 126 ? 0 : len < 65536 ? 2 : 8;
  const head = Buffer.alloc(2 + ext + 4);
  head[0] = (fin ? 0x80 : 0) | opcode;
  head[1] = 0x80 | (ext === 0 ? len : ext === 2 ? 126 : 127);
  if (ext === 2) head.writeUInt16BE(len, 2);
  else if (ext === 8) head.writeBigUInt64BE(BigInt(len), 2);
  const mask = randomBytes(4);
  mask.copy(head, 2 + ext);
  const body = Buffer.allocUnsafe(len);
  for (let i = 0; i < len; i++) body[i] = payload[i]! ^ mask[i & 3]!;
  return Buffer.concat([head, body]);
}

export class WsClient {
  private buf = Buffer.alloc(0);
  private frames: WsFrame[] = [];
  private waiters: Array<() => void> = [];
  private ended = false;
  private error: Error | null = null;

  constructor(readonly socket: net.Socket, readonly handshake: WsHandshake, rest: Buffer) {
    socket.on('data', (c: Buffer) => this.receive(c));
    const done = (err?: Error) => {
      this.ended = true;
      if (err) this.error = err;
      this.wake();
    };
    socket.on('end', () => done());
    socket.on('close', () => done());
    socket.on('error', (err) => done(err));
    if (rest.length > 0) this.receive(rest);
  }

  /** True once the server has closed its side of the connection. */
  get closed(): boolean {
    return this.ended;
  }

  private wake(): void {
    for (const w of this.waiters.splice(0)) w();
  }

  private receive(chunk: Buffer): void {
    this.buf = Buffer.concat([this.buf, chunk]);
    for (;;) {
      const b = this.buf;
      if (b.length < 2) break;
      const fin = (b[0]! & 0x80) !== 0;
      const opcode = b[0]! & 0x0f;
      const masked = (b[1]! & 0x80) !== 0;
      let len = b[1]! & 0x7f;
      let off = 2;
      if (len === 126) {
        if (b.length < 4) break;
        len = b.readUInt16BE(2);
        off = 4;
      } else if (len === 127) {
        if (b.length < 10) break;
        len = Number(b.readBigUInt64BE(2));
        off = 10;
      }
      const maskLen = masked ? 4 : 0;
      if (b.length < off + maskLen + len) break;
      let payload = Buffer.from(b.subarray(off + maskLen, off + maskLen + len));
      if (masked) {
        const mask = b.subarray(off, off + 4);
        payload = Buffer.from(payload.map((x, i) => x ^ mask[i & 3]!));
      }
      this.frames.push({ fin, opcode, masked, payload });
      this.buf = b.subarray(off + maskLen + len);
    }
    this.wake();
  }

  send(opcode: number, payload: Buffer | string, fin = true): void {
    this.socket.write(maskedFrame(opcode, Buffer.isBuffer(payload) ? payload : Buffer.from(payload), fin));
  }

  /** The next frame from the server. */
  async nextFrame(timeoutMs = 5_000): Promise<WsFrame> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const f = this.frames.shift();
      if (f) return f;
      if (this.ended) throw this.error ?? new Error('the server closed the connection before sending a frame');
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no WebSocket frame within ${timeoutMs} ms`);
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, left);
        this.waiters.push(() => {
          clearTimeout(t);
          resolve();
        });
      });
    }
  }

  /**
   * Collects data frames until `n` payload bytes have arrived (the server may split a stream
   * into several frames). Returns the bytes and the frames they came in.
   */
  async readData(n: number, timeoutMs = 5_000): Promise<{ data: Buffer; frames: WsFrame[] }> {
    const deadline = Date.now() + timeoutMs;
    const frames: WsFrame[] = [];
    let got = 0;
    while (got < n) {
      const f = await this.nextFrame(Math.max(1, deadline - Date.now()));
      if (f.opcode === OPCODE.close) throw new Error(`the server closed the WebSocket (${f.payload.length >= 2 ? f.payload.readUInt16BE(0) : 'no code'}) after ${got} of ${n} bytes`);
      frames.push(f);
      got += f.payload.length;
    }
    return { data: Buffer.concat(frames.map((f) => f.payload)), frames };
  }

  destroy(): void {
    this.socket.destroy();
  }
}

/**
 * Sends a WebSocket handshake (GET, Upgrade: websocket, a random Sec-WebSocket-Key, version 13)
 * and reads the answer's head. On 101 the returned client carries frames; on anything else the
 * body is read until the server closes (or a short while) and `client` is null.
 */
export async function openWebSocket(o: WsOpenOptions): Promise<{ handshake: WsHandshake; client: WsClient | null }> {
  const timeoutMs = o.timeoutMs ?? 5_000;
  const socket = await new Promise<net.Socket>((resolve, reject) => {
    const s = o.tls
      ? tls.connect({ host: '127.0.0.1', port: o.port, servername: o.tls.servername ?? o.host, ca: o.tls.ca }, () => resolve(s))
      : net.connect({ host: '127.0.0.1', port: o.port }, () => resolve(s));
    s.once('error', reject);
    s.setTimeout(timeoutMs, () => s.destroy(new Error(`connect timed out after ${timeoutMs} ms`)));
  });
  socket.setTimeout(0);
  const key = randomBytes(16).toString('base64');
  const headers: Record<string, string> = {
    Host: o.host,
    Upgrade: 'websocket',
    Connection: 'Upgrade',
    'Sec-WebSocket-Key': key,
    'Sec-WebSocket-Version': '13',
    ...o.headers,
  };
  socket.write(`GET ${o.path ?? '/'} HTTP/1.1\r\n${Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join('')}\r\n`);

  const { head, rest } = await new Promise<{ head: string; rest: Buffer }>((resolve, reject) => {
    let buf = Buffer.alloc(0);
    const timer = setTimeout(() => fail(new Error(`no handshake answer within ${timeoutMs} ms (got ${JSON.stringify(buf.toString('latin1'))})`)), timeoutMs);
    const cleanup = () => {
      clearTimeout(timer);
      socket.off('data', onData);
      socket.off('error', fail);
      socket.off('end', onEnd);
    };
    const fail = (err: Error) => {
      cleanup();
      socket.destroy();
      reject(err);
    };
    const onEnd = () => fail(new Error(`the server closed before a full handshake answer (got ${JSON.stringify(buf.toString('latin1'))})`));
    const onData = (c: Buffer) => {
      buf = Buffer.concat([buf, c]);
      const end = buf.indexOf('\r\n\r\n');
      if (end === -1) return;
      cleanup();
      socket.pause();
      resolve({ head: buf.subarray(0, end).toString('latin1'), rest: buf.subarray(end + 4) });
    };
    socket.on('data', onData);
    socket.once('error', fail);
    socket.once('end', onEnd);
  });
  const [statusLine = '', ...lines] = head.split('\r\n');
  const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(statusLine)?.[1] ?? 0);
  const resHeaders: Record<string, string> = {};
  for (const l of lines) {
    const i = l.indexOf(':');
    if (i > 0) resHeaders[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim();
  }
  const handshake: WsHandshake = { status, statusLine, headers: resHeaders, key, expectedAccept: acceptFor(key), body: '' };
  if (status === 101) {
    const client = new WsClient(socket, handshake, rest);
    socket.resume();
    return { handshake, client };
  }
  // A refusal: read what follows the head (content-length, or until close).
  const want = Number(resHeaders['content-length'] ?? NaN);
  let body = rest;
  await new Promise<void>((resolve) => {
    const finish = () => {
      clearTimeout(t);
      resolve();
    };
    const t = setTimeout(finish, 1_000);
    if (Number.isFinite(want) && body.length >= want) return finish();
    socket.on('data', (c: Buffer) => {
      body = Buffer.concat([body, c]);
      if (Number.isFinite(want) && body.length >= want) finish();
    });
    socket.once('close', finish);
    socket.once('error', finish);
    socket.resume();
  });
  socket.destroy();
  handshake.body = body.toString('utf8');
  return { handshake, client: null };
}
