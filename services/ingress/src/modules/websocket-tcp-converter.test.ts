import { createHash, randomBytes } from 'node:crypto';
import { once } from 'node:events';
import http from 'node:http';
import net, { type AddressInfo } from 'node:net';
import { PassThrough, type Duplex } from 'node:stream';
import { afterEach, describe, expect, it } from 'vitest';
import { websocketTcpConverterStage, isWebSocketTcpConverter } from './websocket-tcp-converter.js';
import { acceptWebSocketAsTcp, encodeFrame, MAX_FRAME_BYTES, WebSocketHandshakeError } from './websocket-tcp.js';
import { makeState, stageFor } from './testing.js';

const closers: Array<() => void> = [];
afterEach(() => {
  while (closers.length) closers.pop()!();
});

/** A TCP backend that records what it receives and echoes it, as the agent's side would see it. */
async function tcpEcho(): Promise<{ port: number; received: () => Buffer; ended: Promise<void> }> {
  const chunks: Buffer[] = [];
  let onEnd!: () => void;
  const ended = new Promise<void>((r) => (onEnd = r));
  const srv = net.createServer((sock) => {
    sock.on('data', (d) => {
      chunks.push(d);
      sock.write(d);
    });
    sock.on('end', () => {
      onEnd();
      sock.end();
    });
  });
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  closers.push(() => srv.close());
  return { port: (srv.address() as AddressInfo).port, received: () => Buffer.concat(chunks), ended };
}

/** An HTTP server whose upgrades become TCP connections to `backendPort` (what the ingress will do). */
async function converter(backendPort: number | null, onStream?: (d: Duplex) => void): Promise<{ port: number; errors: Error[] }> {
  const errors: Error[] = [];
  const srv = http.createServer((_req, res) => res.end('no'));
  srv.on('upgrade', (req, socket, head) => {
    let ws: Duplex;
    try {
      ws = acceptWebSocketAsTcp(req, socket, head, { closeTimeoutMs: 1000 });
    } catch (err) {
      errors.push(err as Error);
      return;
    }
    ws.on('error', (e) => errors.push(e));
    onStream?.(ws);
    if (backendPort !== null) {
      const tcp = net.connect(backendPort, '127.0.0.1');
      ws.pipe(tcp);
      tcp.pipe(ws);
      tcp.on('error', () => ws.destroy());
    }
  });
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  closers.push(() => {
    srv.closeAllConnections();
    srv.close();
  });
  return { port: (srv.address() as AddressInfo).port, errors };
}

interface Frame {
  fin: boolean;
  opcode: number;
  masked: boolean;
  payload: Buffer;
}

/** A minimal hand-written WebSocket client (RFC 6455). */
class Client {
  private buf = Buffer.alloc(0);
  private frames: Frame[] = [];
  private waiters: Array<() => void> = [];
  closed = false;

  private constructor(readonly sock: net.Socket) {
    sock.on('data', (d) => {
      this.buf = Buffer.concat([this.buf, d]);
      this.parse();
    });
    sock.on('close', () => {
      this.closed = true;
      this.wake();
    });
  }

  static async connect(port: number, extraHeaders = '', key = randomBytes(16).toString('base64')): Promise<{ client: Client; head: string }> {
    const sock = net.connect(port, '127.0.0.1');
    await once(sock, 'connect');
    sock.write(`GET /ws HTTP/1.1\r\nHost: ws.test\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\nSec-WebSocket-Key: ${key}\r\nSec-WebSocket-Version: 13\r\n${extraHeaders}\r\n`);
    let raw = Buffer.alloc(0);
    while (!raw.includes('\r\n\r\n')) {
      const [d] = (await once(sock, 'data')) as [Buffer];
      raw = Buffer.concat([raw, d]);
    }
    const end = raw.indexOf('\r\n\r\n') + 4;
    const head = raw.subarray(0, end).toString();
    const client = new Client(sock);
    if (raw.length > end) {
      client.buf = raw.subarray(end);
      client.parse();
    }
    return { client, head };
  }

  private wake() {
    for (const w of this.waiters.splice(0)) w();
  }

  private parse() {
    for (;;) {
      const b = this.buf;
      if (b.length < 2) return;
      let len = b[1]! & 0x7f;
      let off = 2;
      if (len === 126) {
        if (b.length < 4) return;
        len = b.readUInt16BE(2);
        off = 4;
      } else if (len === 127) {
        if (b.length < 10) return;
        len = Number(b.readBigUInt64BE(2));
        off = 10;
      }
      const masked = (b[1]! & 0x80) !== 0;
      if (masked) off += 4;
      if (b.length < off + len) return;
      this.frames.push({ fin: (b[0]! & 0x80) !== 0, opcode: b[0]! & 0x0f, masked, payload: Buffer.from(b.subarray(off, off + len)) });
      this.buf = b.subarray(off + len);
      this.wake();
    }
  }

  send(opcode: number, payload: Buffer | string, opts: { fin?: boolean; mask?: boolean } = {}) {
    const p = Buffer.from(payload);
    const mask = opts.mask === false ? null : randomBytes(4);
    const len = p.length;
    const ext = len < 126 ? Buffer.alloc(0) : len < 65536 ? Buffer.alloc(2) : Buffer.alloc(8);
    if (ext.length === 2) ext.writeUInt16BE(len);
    if (ext.length === 8) ext.writeBigUInt64BE(BigInt(len));
    const b0 = ((opts.fin ?? true) ? 0x80 : 0) | opcode;
    const b1 = (mask ? 0x80 : 0) | (ext.length === 0 ? len : ext.length === 2 ? 126 : 127);
    const body = mask ? Buffer.from(p.map((x, i) => x ^ mask[i % 4]!)) : p;
    this.sock.write(Buffer.concat([Buffer.from([b0, b1]), ext, mask ?? Buffer.alloc(0), body]));
  }

  async next(): Promise<Frame | null> {
    while (this.frames.length === 0) {
      if (this.closed) return null;
      await new Promise<void>((r) => this.waiters.push(r));
    }
    return this.frames.shift()!;
  }

  /** Reads binary frames until `n` payload bytes arrived. */
  async readBytes(n: number): Promise<Buffer> {
    const parts: Buffer[] = [];
    let got = 0;
    while (got < n) {
      const f = await this.next();
      if (!f) throw new Error('closed early');
      expect(f.opcode).toBe(2);
      expect(f.masked).toBe(false);
      parts.push(f.payload);
      got += f.payload.length;
    }
    return Buffer.concat(parts);
  }
}

describe('websocket_tcp_converter stage', () => {
  it('is absent when missing or disabled, and marks the route', () => {
    expect(stageFor(websocketTcpConverterStage, {})).toBeNull();
    expect(stageFor(websocketTcpConverterStage, { websocket_tcp_converter: { enabled: false } })).toBeNull();
    const stage = stageFor(websocketTcpConverterStage, { websocket_tcp_converter: { enabled: true } })!;
    expect(isWebSocketTcpConverter(stage)).toBe(true);
  });

  it('answers 426 to requests that are not WebSocket upgrades, passes upgrades', async () => {
    const stage = stageFor(websocketTcpConverterStage, { websocket_tcp_converter: { enabled: true } })!;
    const out = (await stage.onRequest!(makeState()))!;
    expect(out.status).toBe(426);
    expect(out.headers!.upgrade).toBe('websocket');
    const ws = makeState({ headers: ['Host', 'a.test', 'Upgrade', 'websocket', 'Connection', 'Upgrade', 'Sec-WebSocket-Key', randomBytes(16).toString('base64'), 'Sec-WebSocket-Version', '13'] });
    expect(await stage.onRequest!(ws)).toBeNull();
  });
});

describe('acceptWebSocketAsTcp', () => {
  it('performs the handshake and carries binary payloads both ways as a TCP stream', async () => {
    const backend = await tcpEcho();
    const { port } = await converter(backend.port);
    const key = randomBytes(16).toString('base64');
    const { client, head } = await Client.connect(port, 'Sec-WebSocket-Protocol: chat, binary\r\n', key);
    expect(head).toMatch(/^HTTP\/1\.1 101 /);
    const accept = createHash('sha1').update(`${key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11`).digest('base64');
    expect(head.toLowerCase()).toContain(`sec-websocket-accept: ${accept.toLowerCase()}`);
    expect(head.toLowerCase()).toContain('sec-websocket-protocol: binary');

    client.send(2, 'hello ');
    client.send(0x2, 'wor', { fin: false });
    client.send(0x0, 'ld');
    client.send(1, '!');
    expect((await client.readBytes(12)).toString()).toBe('hello world!');
    const big = randomBytes(70_000);
    client.send(2, big);
    expect((await client.readBytes(big.length)).equals(big)).toBe(true);
    expect(backend.received().subarray(0, 12).toString()).toBe('hello world!');
  });

  it('answers pings with pongs', async () => {
    const backend = await tcpEcho();
    const { port } = await converter(backend.port);
    const { client } = await Client.connect(port);
    client.send(9, 'are you there');
    const f = (await client.next())!;
    expect(f.opcode).toBe(10);
    expect(f.payload.toString()).toBe('are you there');
  });

  it('a client close is echoed and ends the TCP stream', async () => {
    const backend = await tcpEcho();
    const { port } = await converter(backend.port);
    const { client } = await Client.connect(port);
    client.send(2, 'x');
    await client.readBytes(1);
    client.send(8, Buffer.from([0x03, 0xe8]));
    const f = (await client.next())!;
    expect(f.opcode).toBe(8);
    expect(f.payload.readUInt16BE(0)).toBe(1000);
    await backend.ended;
    expect(await client.next()).toBeNull();
  });

  it('the backend closing sends a close frame', async () => {
    let stream!: Duplex;
    const { port } = await converter(null, (d) => (stream = d));
    const { client } = await Client.connect(port);
    while (!stream) await new Promise((r) => setTimeout(r, 5));
    stream.end('bye');
    expect((await client.readBytes(3)).toString()).toBe('bye');
    const f = (await client.next())!;
    expect(f.opcode).toBe(8);
    expect(f.payload.readUInt16BE(0)).toBe(1000);
    client.send(8, Buffer.from([0x03, 0xe8]));
    expect(await client.next()).toBeNull();
  });

  it('closes with 1002 on unmasked client frames', async () => {
    const { port, errors } = await converter(null);
    const { client } = await Client.connect(port);
    client.send(2, 'nope', { mask: false });
    const f = (await client.next())!;
    expect(f.opcode).toBe(8);
    expect(f.payload.readUInt16BE(0)).toBe(1002);
    expect(await client.next()).toBeNull();
    expect(errors[0]?.message).toMatch(/masked/);
  });

  it('refuses a bad handshake with 400', async () => {
    const { port, errors } = await converter(null);
    const sock = net.connect(port, '127.0.0.1');
    await once(sock, 'connect');
    sock.write('GET / HTTP/1.1\r\nHost: ws.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 8\r\nSec-WebSocket-Key: abc\r\n\r\n');
    let raw = '';
    for await (const d of sock) raw += String(d);
    expect(raw).toMatch(/^HTTP\/1\.1 400 /);
    expect(errors[0]).toBeInstanceOf(WebSocketHandshakeError);
  });
});

/**
 * A WebSocket stream over a fake socket fed by `feed`: `output()` is the payload bytes passed on,
 * `sent` what went to the client, `closeCodes()` the codes of the close frames sent (null for none).
 */
function wsStream() {
  const socket = new PassThrough();
  const sent: Buffer[] = [];
  socket.write = ((d: Buffer | string) => (sent.push(Buffer.from(d)), true)) as typeof socket.write;
  const req = { method: 'GET', headers: { upgrade: 'websocket', connection: 'Upgrade', 'sec-websocket-version': '13', 'sec-websocket-key': 'dGhlIHNhbXBsZSBub25jZQ==' } } as unknown as http.IncomingMessage;
  const ws = acceptWebSocketAsTcp(req, socket, Buffer.alloc(0));
  const out: Buffer[] = [];
  ws.on('data', (d: Buffer) => out.push(d));
  ws.on('error', () => {});
  /** What came out, once the stream has delivered what it holds. */
  const output = async () => {
    await new Promise((r) => setImmediate(r));
    return Buffer.concat(out);
  };
  const closeCodes = () => sent.filter((b) => b[0] === 0x88).map((b) => (b[1]! >= 2 ? b.readUInt16BE(2) : null));
  return { feed: (b: Buffer) => socket.emit('data', b), output, sent, closeCodes };
}

describe('WebSocket frames arriving in pieces', () => {
  it('gives the same bytes however the frames are cut, heads and masks included; a ping split in pieces is answered', async () => {
    const mask = Buffer.from([0x12, 0x34, 0x56, 0x78]);
    const payloads = [randomBytes(5), randomBytes(300), Buffer.alloc(0), randomBytes(70_000)];
    const wire = Buffer.concat([
      // The second and third make one message (a binary frame without FIN, an empty continuation).
      ...payloads.map((p, i) => encodeFrame(i === 2 ? 0 : 2, p, i !== 1, mask)),
      encodeFrame(9, Buffer.from('ping!'), true, mask),
      encodeFrame(2, Buffer.from('after'), true, mask),
    ]);
    const want = Buffer.concat([...payloads, Buffer.from('after')]);
    for (const piece of [1, 2, 3, 7, 13, 14, 1000, wire.length]) {
      const s = wsStream();
      for (let i = 0; i < wire.length; i += piece) s.feed(wire.subarray(i, i + piece));
      expect((await s.output()).equals(want), `pieces of ${piece}`).toBe(true);
      expect(s.sent.some((b) => b.equals(encodeFrame(10, Buffer.from('ping!')))), `pieces of ${piece}`).toBe(true);
    }
  }, 60_000); // ~0.6 s of CPU (pieces of 1 byte): 25 times that in wall time on a box running two test runs and more at once

  it('a 16 MiB frame sent in 1 KiB pieces costs its length once, not its length per piece (it took 15-25 s of CPU)', async () => {
    const s = wsStream();
    const n = MAX_FRAME_BYTES;
    const head = Buffer.alloc(14);
    head[0] = 0x82;
    head[1] = 0x80 | 127;
    head.writeBigUInt64BE(BigInt(n), 2);
    const c0 = process.cpuUsage();
    s.feed(head);
    const piece = Buffer.alloc(1024, 0x41);
    for (let sent = 0; sent < n; sent += piece.length) s.feed(piece);
    const cpu = process.cpuUsage(c0);
    expect((await s.output()).length).toBe(n);
    expect((cpu.user + cpu.system) / 1000).toBeLessThan(3000);
  });
});

describe('WebSocket protocol checks (RFC 6455 §5.4, §5.5.1, §7.4)', () => {
  const mask = Buffer.from([1, 2, 3, 4]);
  const close = (code: number, reason: Buffer = Buffer.alloc(0)) => {
    const p = Buffer.alloc(2);
    p.writeUInt16BE(code);
    return encodeFrame(8, Buffer.concat([p, reason]), true, mask);
  };

  it('a close frame with a 1-byte payload fails the connection with 1002', async () => {
    const s = wsStream();
    s.feed(encodeFrame(8, Buffer.from([0x03]), true, mask));
    await s.output();
    expect(s.closeCodes()).toEqual([1002]);
  });

  it('close codes no endpoint may send are answered with 1002, not echoed; valid ones are echoed', async () => {
    for (const code of [0, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000, 65535]) {
      const s = wsStream();
      s.feed(close(code));
      await s.output();
      expect(s.closeCodes(), String(code)).toEqual([1002]);
    }
    for (const code of [1000, 1001, 1003, 1007, 1011, 1014, 3000, 4999]) {
      const s = wsStream();
      s.feed(close(code, Buffer.from('bye')));
      await s.output();
      expect(s.closeCodes(), String(code)).toEqual([code]);
    }
    const empty = wsStream();
    empty.feed(encodeFrame(8, Buffer.alloc(0), true, mask));
    await empty.output();
    expect(empty.closeCodes()).toEqual([1000]);
  });

  it('a close reason that is not UTF-8 fails with 1007', async () => {
    const s = wsStream();
    s.feed(close(1000, Buffer.from([0xc3, 0x28])));
    await s.output();
    expect(s.closeCodes()).toEqual([1007]);
  });

  it('a continuation frame with no message started fails with 1002 and passes nothing on', async () => {
    const s = wsStream();
    s.feed(encodeFrame(0, Buffer.from('orphan'), true, mask));
    await s.output();
    expect([(await s.output()).toString(), s.closeCodes()]).toEqual(['', [1002]]);
  });

  it('a new message inside a fragmented one fails with 1002; fragments with pings between them pass', async () => {
    const bad = wsStream();
    bad.feed(encodeFrame(2, Buffer.from('a'), false, mask));
    bad.feed(encodeFrame(2, Buffer.from('b'), true, mask));
    await bad.output();
    expect([(await bad.output()).toString(), bad.closeCodes()]).toEqual(['a', [1002]]);
    const good = wsStream();
    good.feed(encodeFrame(1, Buffer.from('a'), false, mask));
    good.feed(encodeFrame(9, Buffer.from('p'), true, mask));
    good.feed(encodeFrame(0, Buffer.from('b'), false, mask));
    good.feed(encodeFrame(0, Buffer.from('c'), true, mask));
    good.feed(encodeFrame(2, Buffer.from('d'), true, mask));
    await good.output();
    expect([(await good.output()).toString(), good.closeCodes()]).toEqual(['abcd', []]);
  });
});
