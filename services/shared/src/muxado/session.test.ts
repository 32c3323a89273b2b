import { createHash, randomBytes } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import { once } from 'node:events';
import { afterEach, describe, expect, it } from 'vitest';
import { encodeFrame, FLAG_FIN, FLAG_SYN, FrameDecoder, FrameType, MuxErrorCode, type FrameSink } from './frame.js';
import { MuxError } from './errors.js';
import { MuxSession, type MuxCloseInfo } from './session.js';
import type { MuxStream } from './stream.js';

const cleanups: Array<() => unknown> = [];
afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!();
});

/** A connected TCP socket pair on 127.0.0.1. */
async function socketPair(): Promise<{ a: net.Socket; b: net.Socket }> {
  const server = net.createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const port = (server.address() as net.AddressInfo).port;
  const accepted = once(server, 'connection') as Promise<[net.Socket]>;
  const a = net.connect(port, '127.0.0.1');
  await once(a, 'connect');
  const [b] = await accepted;
  server.close();
  cleanups.push(() => {
    a.destroy();
    b.destroy();
  });
  return { a, b };
}

async function sessionPair(opts: { maxOutbound?: number; maxInbound?: number } = {}) {
  const { a, b } = await socketPair();
  const client = new MuxSession(a, { client: true, maxOutboundStreams: opts.maxOutbound });
  const server = new MuxSession(b, { client: false, maxInboundStreams: opts.maxInbound });
  cleanups.push(() => {
    client.destroy();
    server.destroy();
  });
  return { client, server };
}

async function until(fn: () => boolean, ms = 5_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!fn()) {
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 10));
  }
}

function nextStream(session: MuxSession): Promise<MuxStream> {
  return new Promise((resolve) => session.once('stream', resolve));
}

function collect(stream: MuxStream): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const parts: Buffer[] = [];
    stream.on('data', (c: Buffer) => parts.push(c));
    stream.on('end', () => resolve(Buffer.concat(parts)));
    stream.on('error', reject);
  });
}

/** Writes `total` random bytes in 64 KiB chunks honouring backpressure; resolves with their sha256. */
async function writeRandom(stream: MuxStream, total: number): Promise<string> {
  const hash = createHash('sha256');
  let left = total;
  while (left > 0) {
    const chunk = randomBytes(Math.min(64 * 1024, left));
    left -= chunk.length;
    hash.update(chunk);
    if (!stream.write(chunk)) await once(stream, 'drain');
  }
  stream.end();
  return hash.digest('hex');
}

async function hashOf(stream: MuxStream): Promise<{ hash: string; bytes: number }> {
  const hash = createHash('sha256');
  let bytes = 0;
  for await (const c of stream) {
    hash.update(c as Buffer);
    bytes += (c as Buffer).length;
  }
  return { hash: hash.digest('hex'), bytes };
}

describe('MuxSession', () => {
  it('opens streams with odd ids from the client and even ids from the server; both directions carry data', async () => {
    const { client, server } = await sessionPair();
    const incoming = nextStream(server);
    const s1 = client.open();
    s1.end('ping');
    const r1 = await incoming;
    expect(s1.id % 2).toBe(1);
    expect(r1.id).toBe(s1.id);
    expect((await collect(r1)).toString()).toBe('ping');

    const back = nextStream(client);
    const s2 = server.open();
    s2.end('pong');
    const r2 = await back;
    expect(s2.id).toBe(2);
    expect((await collect(r2)).toString()).toBe('pong');
  });

  it('half-closes with FIN: the other direction keeps flowing until both ends are done', async () => {
    const { client, server } = await sessionPair();
    const incoming = nextStream(server);
    const s = client.open();
    s.end('request');
    const r = await incoming;
    expect((await collect(r)).toString()).toBe('request');
    expect(server.inboundStreams).toBe(1); // only the client's side is closed
    const reply = collect(s);
    r.write('reply ');
    r.end('done');
    expect((await reply).toString()).toBe('reply done');
    await new Promise((res) => setImmediate(res));
    expect(server.inboundStreams).toBe(0);
    expect(client.outboundStreams).toBe(0);
  });

  it('RST: destroying one end fails the other with STREAM_RESET', async () => {
    const { client, server } = await sessionPair();
    const incoming = nextStream(server);
    const s = client.open();
    s.write('x');
    const r = await incoming;
    const err = once(r, 'error');
    s.destroy();
    const [e] = (await err) as [MuxError];
    expect(e).toBeInstanceOf(MuxError);
    expect(e.code).toBe('STREAM_RESET');
    expect(e.muxCode).toBe(MuxErrorCode.StreamCancelled);
    expect(server.inboundStreams).toBe(0);
  });

  it('flow control: a reader that stops reading stops the sender at the 256 KiB window, then it resumes', async () => {
    const { client, server } = await sessionPair();
    const incoming = nextStream(server);
    const s = client.open();
    const total = 2 * 1024 * 1024;
    let written = 0;
    let done = false;
    const sent = (async () => {
      const hash = createHash('sha256');
      while (written < total) {
        const chunk = randomBytes(16 * 1024);
        hash.update(chunk);
        written += chunk.length;
        if (!s.write(chunk)) await once(s, 'drain');
      }
      s.end();
      done = true;
      return hash.digest('hex');
    })();
    const r = await incoming;
    r.pause();
    await new Promise((res) => setTimeout(res, 300));
    // The window is used up and nothing was acknowledged; the sender is parked with at most
    // its own writable buffer (64 KiB) on top of the window.
    expect(r.receiveWindow).toBe(0);
    expect(done).toBe(false);
    expect(written).toBeLessThanOrEqual(256 * 1024 + 128 * 1024);
    const got = hashOf(r);
    expect((await got).hash).toBe(await sent);
  });

  it('carries 50 MB each way at once with matching checksums', async () => {
    const { client, server } = await sessionPair();
    const incoming = nextStream(server);
    const s = client.open();
    const up = writeRandom(s, 50 * 1024 * 1024);
    const r = await incoming;
    const down = writeRandom(r, 50 * 1024 * 1024);
    const [gotUp, gotDown] = await Promise.all([hashOf(r), hashOf(s)]);
    expect(gotUp).toEqual({ hash: await up, bytes: 50 * 1024 * 1024 });
    expect(gotDown).toEqual({ hash: await down, bytes: 50 * 1024 * 1024 });
  }, 20_000);

  it('socket backpressure: with a peer that stops reading, queued bytes do not grow with the number of streams', async () => {
    const { a, b } = await socketPair();
    const client = new MuxSession(a, { client: true });
    const server = new MuxSession(b, { client: false });
    cleanups.push(() => {
      client.destroy();
      server.destroy();
    });
    const received: Promise<number>[] = [];
    server.on('stream', (r) => received.push(collect(r).then((buf) => buf.length)));
    b.pause(); // the peer's transport stops reading: nothing is acknowledged at any level
    const streams = Array.from({ length: 64 }, () => client.open());
    for (const s of streams) s.end(Buffer.alloc(512 * 1024));
    await new Promise((r) => setTimeout(r, 300));
    // 64 streams × a 256 KiB window would be 16 MiB; we stop near the 256 KiB queue limit.
    expect(a.writableLength).toBeLessThan(1024 * 1024);
    b.resume();
    await until(() => received.length === 64);
    expect(await Promise.all(received)).toEqual(Array(64).fill(512 * 1024));
  });

  it('many concurrent streams interleave without mixing data', async () => {
    const { client, server } = await sessionPair();
    server.on('stream', (st) => st.pipe(st)); // echo
    const results = await Promise.all(
      Array.from({ length: 100 }, async (_, i) => {
        const s = client.open();
        const body = Buffer.alloc(20_000 + i * 97, i);
        const got = collect(s);
        s.end(body);
        return (await got).equals(body);
      }),
    );
    expect(results.every(Boolean)).toBe(true);
  });

  it('caps outbound streams (STREAM_CAP) and refuses inbound SYNs past the cap with RST', async () => {
    const { client, server } = await sessionPair({ maxOutbound: 3, maxInbound: 2 });
    const streams = [client.open(), client.open(), client.open()];
    expect(() => client.open()).toThrowError(expect.objectContaining({ code: 'STREAM_CAP' }) as Error);
    const accepted: MuxStream[] = [];
    server.on('stream', (st) => accepted.push(st));
    const refused = once(streams[2]!, 'error');
    for (const s of streams) s.write('hi');
    const [err] = (await refused) as [MuxError];
    expect(err.code).toBe('STREAM_RESET');
    expect(err.muxCode).toBe(MuxErrorCode.StreamRefused);
    expect(accepted).toHaveLength(2);
    expect(client.outboundStreams).toBe(2);
    client.open().destroy(); // a slot is free again; a never-announced stream needs no RST
  });

  it('closing the session fails every open stream with SESSION_CLOSED and reports why', async () => {
    const { client, server } = await sessionPair();
    const incoming = nextStream(server);
    const s = client.open();
    s.write('x');
    const r = await incoming;
    const errs = Promise.all([once(s, 'error'), once(r, 'error')]);
    const closed = once(server, 'close') as Promise<[MuxCloseInfo]>;
    client.goAway(MuxErrorCode.None, 'bye');
    const [[e1], [e2]] = (await errs) as [[MuxError], [MuxError]];
    expect(e1.code).toBe('SESSION_CLOSED');
    expect(e2.code).toBe('SESSION_CLOSED');
    const [info] = await closed;
    expect(info).toMatchObject({ by: 'remote', code: 0, message: 'bye' });
    expect(() => client.open()).toThrowError(expect.objectContaining({ code: 'SESSION_CLOSED' }) as Error);
  });

  it('works as a keep-alive socket for http.Agent (createConnection callback form, idle timeout)', async () => {
    const { client, server } = await sessionPair();
    const web = http.createServer((req, res) => {
      res.setHeader('x-path', req.url ?? '');
      res.end('ok ' + req.url);
    });
    server.on('stream', (st) => web.emit('connection', st));
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1, timeout: 5_000 });
    let created = 0;
    (agent as unknown as { createConnection: unknown }).createConnection = (_o: unknown, cb: (e: Error | null, s?: MuxStream) => void) => {
      created++;
      setImmediate(() => cb(null, client.open({ allowHalfOpen: false })));
      return undefined;
    };
    cleanups.push(() => agent.destroy());
    for (const path of ['/a', '/b', '/c']) {
      const body = await new Promise<string>((resolve, reject) => {
        http
          .get({ agent, host: 'x.test', path }, (res) => {
            let b = '';
            res.on('data', (c: Buffer) => (b += c.toString()));
            res.on('end', () => resolve(b));
          })
          .on('error', reject);
      });
      expect(body).toBe(`ok ${path}`);
    }
    expect(created).toBe(1);
    // A socket-style idle timeout fires on a quiet stream.
    const s = client.open();
    const fired = once(s, 'timeout');
    s.setTimeout(50);
    await fired;
    s.destroy();
  });
});

describe('MuxSession against a raw peer', () => {
  /** A server session and a raw socket speaking frames at it by hand. */
  async function rawPeer() {
    const { a, b } = await socketPair();
    const server = new MuxSession(b, { client: false });
    cleanups.push(() => server.destroy());
    const frames: Array<{ type: string; id: number; value?: number; flags?: number; data?: Buffer }> = [];
    const sink: FrameSink = {
      onDataStart: (id, flags) => frames.push({ type: 'data', id, flags, data: Buffer.alloc(0) }),
      onDataChunk: (c) => {
        const f = frames[frames.length - 1]!;
        f.data = Buffer.concat([f.data!, c]);
      },
      onDataEnd: () => {},
      onRst: (id, code) => frames.push({ type: 'rst', id, value: code }),
      onWndInc: (id, inc) => frames.push({ type: 'wndinc', id, value: inc }),
      onGoAway: (_l, code) => frames.push({ type: 'goaway', id: 0, value: code }),
      onProtocolError: () => frames.push({ type: 'bad', id: 0 }),
    };
    const dec = new FrameDecoder(sink);
    a.on('data', (c: Buffer) => dec.push(c));
    const waitFor = async (pred: (f: (typeof frames)[number]) => boolean) => {
      for (let i = 0; i < 200; i++) {
        const f = frames.find(pred);
        if (f) return f;
        await new Promise((r) => setTimeout(r, 10));
      }
      throw new Error('frame not seen');
    };
    return { server, a, frames, waitFor };
  }

  it('answers DATA without SYN on an unknown stream with RST StreamClosed', async () => {
    const { a, waitFor } = await rawPeer();
    a.write(encodeFrame(FrameType.Data, 0, 7, Buffer.from('stray')));
    expect(await waitFor((f) => f.type === 'rst')).toMatchObject({ id: 7, value: MuxErrorCode.StreamClosed });
  });

  it('resets a stream whose peer overruns the window (RST FlowControl), the session lives on', async () => {
    const { server, a, waitFor } = await rawPeer();
    const errs: MuxError[] = [];
    server.on('stream', (st) => st.on('error', (e: MuxError) => errs.push(e)));
    a.write(encodeFrame(FrameType.Data, FLAG_SYN, 3, Buffer.alloc(200 * 1024)));
    a.write(encodeFrame(FrameType.Data, 0, 3, Buffer.alloc(100 * 1024)));
    expect(await waitFor((f) => f.type === 'rst')).toMatchObject({ id: 3, value: MuxErrorCode.FlowControl });
    expect(errs[0]?.code).toBe('STREAM_ABORTED');
    const next = nextStream(server);
    a.write(encodeFrame(FrameType.Data, FLAG_SYN | FLAG_FIN, 5, Buffer.from('still here')));
    expect((await collect(await next)).toString()).toBe('still here');
  });

  it('sends WNDINC only once the consumer has read the bytes', async () => {
    const { server, a, frames, waitFor } = await rawPeer();
    const next = nextStream(server);
    a.write(encodeFrame(FrameType.Data, FLAG_SYN, 3, Buffer.alloc(100 * 1024, 1)));
    const st = await next;
    st.pause();
    await new Promise((r) => setTimeout(r, 100));
    expect(frames.filter((f) => f.type === 'wndinc')).toHaveLength(0);
    st.resume();
    await waitFor((f) => f.type === 'wndinc');
    await new Promise((r) => setTimeout(r, 50));
    const acked = frames.filter((f) => f.type === 'wndinc').reduce((n, f) => n + f.value!, 0);
    expect(acked).toBe(100 * 1024);
  });

  describe('drainOnDestroy: a stream destroyed here before the peer FIN', () => {
    const drain = { maxBytes: 64 * 1024, maxMs: 5_000 };

    it('without it: FIN and RST at once, released, resetBeforeRemoteFin', async () => {
      const { server, frames, waitFor } = await rawPeer();
      const st = server.open();
      st.write('req');
      await waitFor((f) => f.type === 'data' && f.id === 2);
      st.destroy();
      expect(await waitFor((f) => f.type === 'rst' && f.id === 2)).toMatchObject({ value: MuxErrorCode.StreamCancelled });
      expect(frames.some((f) => f.type === 'data' && f.id === 2 && (f.flags! & FLAG_FIN) !== 0)).toBe(true);
      expect(server.outboundStreams).toBe(0);
      expect(st.resetBeforeRemoteFin).toBe(true);
    });

    it('FINs, keeps the stream counted, acknowledges and discards what the peer sends, releases at its FIN (no RST)', async () => {
      const { server, a, frames, waitFor } = await rawPeer();
      const released: MuxStream[] = [];
      server.on('release', (s) => released.push(s));
      const st = server.open({ drainOnDestroy: drain });
      const got: Buffer[] = [];
      st.on('data', (c: Buffer) => got.push(c));
      st.write('req');
      await waitFor((f) => f.type === 'data' && f.id === 2);
      a.write(encodeFrame(FrameType.Data, 0, 2, Buffer.from('early')));
      await until(() => got.length === 1);
      st.destroy();
      expect(st.destroyed).toBe(true);
      await waitFor((f) => f.type === 'data' && f.id === 2 && (f.flags! & FLAG_FIN) !== 0);
      expect(server.outboundStreams).toBe(1);
      expect(st.drainingOnWire).toBe(true);
      // 40 KiB more (under the 64 KiB budget): acknowledged, not delivered.
      a.write(encodeFrame(FrameType.Data, 0, 2, Buffer.alloc(40 * 1024)));
      await until(() => frames.filter((f) => f.type === 'wndinc' && f.id === 2).reduce((n, f) => n + f.value!, 0) >= 40 * 1024 + 5);
      expect(got).toHaveLength(1);
      expect(released).toEqual([]);
      a.write(encodeFrame(FrameType.Data, FLAG_FIN, 2));
      await until(() => released.length === 1);
      expect(server.outboundStreams).toBe(0);
      expect(st.resetBeforeRemoteFin).toBe(false);
      expect(st.drainingOnWire).toBe(false);
      await new Promise((r) => setTimeout(r, 30));
      expect(frames.filter((f) => f.type === 'rst')).toEqual([]);
    });

    it('unread bytes are acknowledged when it is destroyed', async () => {
      const { server, a, frames, waitFor } = await rawPeer();
      const st = server.open({ drainOnDestroy: drain });
      st.pause();
      st.write('req');
      await waitFor((f) => f.type === 'data' && f.id === 2);
      a.write(encodeFrame(FrameType.Data, 0, 2, Buffer.alloc(10_000)));
      await until(() => st.receiveWindow < 256 * 1024);
      st.destroy();
      await until(() => frames.filter((f) => f.type === 'wndinc' && f.id === 2).reduce((n, f) => n + f.value!, 0) === 10_000);
      expect(st.receiveWindow).toBe(256 * 1024);
    });

    it('RSTs once the peer sent more than maxBytes: released, resetBeforeRemoteFin', async () => {
      const { server, a, waitFor } = await rawPeer();
      const st = server.open({ drainOnDestroy: drain });
      st.write('req');
      await waitFor((f) => f.type === 'data' && f.id === 2);
      st.destroy();
      a.write(encodeFrame(FrameType.Data, 0, 2, Buffer.alloc(60 * 1024)));
      a.write(encodeFrame(FrameType.Data, 0, 2, Buffer.alloc(10 * 1024)));
      expect(await waitFor((f) => f.type === 'rst' && f.id === 2)).toMatchObject({ value: MuxErrorCode.StreamCancelled });
      expect(server.outboundStreams).toBe(0);
      expect(st.resetBeforeRemoteFin).toBe(true);
    });

    it('RSTs after maxMs without the peer FIN', async () => {
      const { server, waitFor } = await rawPeer();
      const st = server.open({ drainOnDestroy: { maxBytes: 1024, maxMs: 100 } });
      st.write('req');
      await waitFor((f) => f.type === 'data' && f.id === 2);
      const t0 = performance.now();
      st.destroy();
      await waitFor((f) => f.type === 'rst' && f.id === 2);
      expect(performance.now() - t0).toBeGreaterThanOrEqual(90);
      expect(server.outboundStreams).toBe(0);
      expect(st.resetBeforeRemoteFin).toBe(true);
    });

    it('a peer RST or the session closing ends the wait; a stream the peer already finished is reset as before', async () => {
      const { server, a, waitFor } = await rawPeer();
      const st = server.open({ drainOnDestroy: drain });
      st.write('req');
      await waitFor((f) => f.type === 'data' && f.id === 2);
      st.destroy();
      a.write(encodeFrame(FrameType.Rst, 0, 2, Buffer.from([0, 0, 0, MuxErrorCode.StreamCancelled])));
      await until(() => server.outboundStreams === 0);
      expect(st.drainingOnWire).toBe(false);
      expect(st.resetBeforeRemoteFin).toBe(false);

      const done = server.open({ drainOnDestroy: drain });
      done.write('req');
      await waitFor((f) => f.type === 'data' && f.id === 4);
      a.write(encodeFrame(FrameType.Data, FLAG_FIN, 4, Buffer.from('answer')));
      await until(() => done.remoteEnded);
      done.destroy();
      await waitFor((f) => f.type === 'rst' && f.id === 4);
      expect(done.resetBeforeRemoteFin).toBe(false);

      const last = server.open({ drainOnDestroy: drain });
      last.write('req');
      await waitFor((f) => f.type === 'data' && f.id === 6);
      last.destroy();
      expect(last.drainingOnWire).toBe(true);
      server.destroy();
      expect(last.drainingOnWire).toBe(false);
    });
  });

  it('answers a SYN in its own id space with GOAWAY Protocol and closes', async () => {
    const { server, a, waitFor } = await rawPeer();
    const closed = once(server, 'close') as Promise<[MuxCloseInfo]>;
    a.write(encodeFrame(FrameType.Data, FLAG_SYN, 4, Buffer.from('x')));
    expect(await waitFor((f) => f.type === 'goaway')).toMatchObject({ value: MuxErrorCode.Protocol });
    expect((await closed)[0].by).toBe('protocol');
  });

  it('survives a storm of random but well-framed frames (seeded), consumers attached or not', async () => {
    let seed = 42;
    const rnd = (n: number) => {
      seed = (seed * 1103515245 + 12345) & 0x7fffffff;
      return seed % n;
    };
    for (let round = 0; round < 20; round++) {
      const { server, a } = await rawPeer();
      server.on('stream', (st) => {
        if (rnd(2)) st.resume();
        if (rnd(4) === 0) st.destroy();
        if (rnd(4) === 0) st.end('x');
      });
      const frames: Buffer[] = [];
      for (let i = 0; i < 200; i++) {
        const type = [FrameType.Data, FrameType.Data, FrameType.Data, FrameType.Rst, FrameType.WndInc][rnd(5)]!;
        const id = 1 + rnd(12);
        const body = type === FrameType.Data ? randomBytes(rnd(3) === 0 ? 70_000 : rnd(64)) : Buffer.alloc(4, rnd(256));
        frames.push(encodeFrame(type, rnd(4), id, body));
      }
      const closed = new Promise((r) => server.once('close', r));
      a.write(Buffer.concat(frames));
      a.end();
      await closed; // the peer hung up (or broke the protocol): either way we got here without a throw
    }
  });

  it('survives garbage: an unknown frame type gets GOAWAY, nothing throws', async () => {
    const { server, a, waitFor } = await rawPeer();
    const closed = once(server, 'close');
    a.write(randomBytes(3)); // partial header first
    a.write(Buffer.from('f0000000000000', 'hex'));
    await waitFor((f) => f.type === 'goaway');
    await closed;
  });
});

describe('a peer that sends and never reads', () => {
  it('does not make the session queue answers without bound', async () => {
    const { a, b } = await socketPair();
    const server = new MuxSession(b, { client: false, maxInboundStreams: 4 });
    cleanups.push(() => server.destroy());
    // The peer never reads (its receive buffer fills, then ours to it). It sends empty DATA frames
    // for streams the session does not know (each one answered with a 12-byte RST) and SYNs past
    // the inbound cap (each refused with a RST): 8 bytes in, 12 out, an audit's 1.5x amplifier.
    a.pause();
    const block = (n: number) => Buffer.concat(Array.from({ length: 8192 }, (_, i) => encodeFrame(FrameType.Data, i % 2 ? 0 : FLAG_SYN, 1001 + 2 * (n * 8192 + i))));
    let maxQueued = 0;
    for (let i = 0; i < 400 && !server.closed; i++) {
      if (!a.write(block(i))) await Promise.race([once(a, 'drain'), new Promise((r) => setTimeout(r, 50))]);
      maxQueued = Math.max(maxQueued, b.writableLength);
    }
    // 400 blocks of 64 KiB sent: 26 MB in, which used to queue about 39 MB of RSTs.
    expect(maxQueued).toBeLessThan(1024 * 1024);
  }, 30_000);

  it('ends the session once what the peer has not read passes the limit', async () => {
    const { a, b } = await socketPair();
    const server = new MuxSession(b, { client: false });
    const closed = once(server, 'close') as Promise<[MuxCloseInfo]>;
    cleanups.push(() => server.destroy());
    a.pause();
    // Streams the peer opens, then big answers on them that it never reads.
    server.on('stream', (s: MuxStream) => {
      s.resume();
      const chunk = Buffer.alloc(64 * 1024, 0x61);
      for (let i = 0; i < 8; i++) s.write(chunk);
    });
    for (let i = 0; i < 200 && !server.closed; i++) {
      a.write(encodeFrame(FrameType.Data, FLAG_SYN, 1 + 2 * i, Buffer.from('x')));
      await new Promise((r) => setTimeout(r, 5));
    }
    // Each stream's answer is held back by flow control and the full socket: the session stays up.
    expect(server.closed).toBe(false);
    expect(b.writableLength).toBeLessThan(1024 * 1024);
    // What the socket already holds is past the limit: the next read ends the session.
    b.cork();
    b.write(Buffer.alloc(5 * 1024 * 1024));
    a.write(encodeFrame(FrameType.Data, 0, 999_999));
    const [info] = await closed;
    expect(info.message).toMatch(/has not read/);
  }, 30_000);
});
