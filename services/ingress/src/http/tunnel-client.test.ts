import net from 'node:net';
import { Readable } from 'node:stream';
import { afterEach, describe, expect, it } from 'vitest';
import { DISCARD_MAX_BYTES, DISCARD_MAX_MS, TunnelClient, type TunnelClientOptions, type TunnelHandler, type TunnelRequest } from './tunnel-client.js';

/*
 * TunnelClient against real TCP servers on 127.0.0.1: each server reads the raw request bytes
 * and writes scripted raw response bytes. The client's connections are plain net.Sockets.
 */

const CRLF2 = Buffer.from('\r\n\r\n');
const tick = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

type CodedError = Error & { code?: string };

/** A request as the server received it. */
interface RawRequest {
  /** The head, up to and without the blank line. */
  head: string;
  requestLine: string;
  /** Header lines as received. */
  headerLines: string[];
  headers: [string, string][];
  /** The body as sent on the wire (chunked framing included). */
  rawBody: Buffer;
  /** The body decoded (chunked framing removed). */
  body: Buffer;
  /** Every byte of the request. */
  raw: Buffer;
}

function headerOf(headers: [string, string][], name: string): string | undefined {
  return headers.find(([n]) => n.toLowerCase() === name)?.[1];
}

/** Where a complete chunked body ends in `buf` from `start` (and its decoded bytes), or null if incomplete. */
function chunkedEnd(buf: Buffer, start: number): { end: number; body: Buffer } | null {
  let at = start;
  const parts: Buffer[] = [];
  for (;;) {
    const nl = buf.indexOf('\r\n', at);
    if (nl < 0) return null;
    const size = parseInt(buf.toString('latin1', at, nl).split(';')[0]!, 16);
    at = nl + 2;
    if (size === 0) {
      // Trailers until an empty line.
      for (;;) {
        const tl = buf.indexOf('\r\n', at);
        if (tl < 0) return null;
        const empty = tl === at;
        at = tl + 2;
        if (empty) return { end: at, body: Buffer.concat(parts) };
      }
    }
    if (buf.length < at + size + 2) return null;
    parts.push(buf.subarray(at, at + size));
    at += size + 2;
  }
}

/** One connection as the server sees it. */
class Peer {
  /** Bytes not consumed by readRequest yet. */
  buf = Buffer.alloc(0);
  /** Every byte received. */
  all = Buffer.alloc(0);
  ended = false;
  isClosed = false;
  readonly closed: Promise<void>;
  private waiters: (() => void)[] = [];

  constructor(
    readonly socket: net.Socket,
    readonly index: number,
  ) {
    socket.setNoDelay(true);
    socket.on('data', (d: Buffer) => {
      this.buf = Buffer.concat([this.buf, d]);
      this.all = Buffer.concat([this.all, d]);
      this.wake();
    });
    socket.on('end', () => {
      this.ended = true;
      this.wake();
    });
    socket.on('error', () => {});
    this.closed = new Promise<void>((resolve) =>
      socket.on('close', () => {
        this.ended = true;
        this.isClosed = true;
        this.wake();
        resolve();
      }),
    );
  }

  private wake(): void {
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }

  /** Resolves true once `pred` holds, false if the connection ends first. */
  async waitFor(pred: () => boolean): Promise<boolean> {
    for (;;) {
      if (pred()) return true;
      if (this.ended) return false;
      await new Promise<void>((r) => this.waiters.push(r));
    }
  }

  /** The next request (its body too unless `headOnly`), or null when the client closed first. */
  async readRequest(headOnly = false): Promise<RawRequest | null> {
    if (!(await this.waitFor(() => this.buf.indexOf(CRLF2) >= 0))) return null;
    const endHead = this.buf.indexOf(CRLF2);
    const head = this.buf.toString('latin1', 0, endHead);
    const [requestLine, ...headerLines] = head.split('\r\n');
    const headers = headerLines.map((l): [string, string] => {
      const c = l.indexOf(':');
      return [l.slice(0, c), l.slice(c + 1).trim()];
    });
    const bodyStart = endHead + 4;
    let end = bodyStart;
    let body: Buffer = Buffer.alloc(0);
    if (!headOnly) {
      const cl = headerOf(headers, 'content-length');
      const te = headerOf(headers, 'transfer-encoding');
      if (te !== undefined) {
        let r: { end: number; body: Buffer } | null = null;
        if (!(await this.waitFor(() => (r = chunkedEnd(this.buf, bodyStart)) !== null))) return null;
        const done = r as unknown as { end: number; body: Buffer };
        end = done.end;
        body = done.body;
      } else if (cl !== undefined) {
        const n = Number(cl);
        if (!(await this.waitFor(() => this.buf.length >= bodyStart + n))) return null;
        end = bodyStart + n;
        body = this.buf.subarray(bodyStart, end);
      }
    }
    const raw = this.buf.subarray(0, end);
    this.buf = this.buf.subarray(end);
    return { head, requestLine: requestLine!, headerLines, headers, rawBody: raw.subarray(bodyStart), body: Buffer.from(body), raw: Buffer.from(raw) };
  }

  write(data: string | Buffer): Promise<void> {
    return new Promise<void>((resolve) => {
      if (this.socket.destroyed) return resolve();
      this.socket.write(typeof data === 'string' ? Buffer.from(data, 'latin1') : data, () => resolve());
    });
  }

  /** Writes `data` `step` bytes at a time, each in its own TCP segment (a pause between). */
  async writeSlowly(data: string, step = 1): Promise<void> {
    const b = Buffer.from(data, 'latin1');
    for (let i = 0; i < b.length; i += step) {
      await this.write(b.subarray(i, i + step));
      await tick(1);
    }
  }

  end(data?: string): void {
    if (data !== undefined) this.socket.end(Buffer.from(data, 'latin1'));
    else this.socket.end();
  }
}

interface Server {
  port: number;
  peers: Peer[];
  /** Script errors (a test asserts there are none where it matters). */
  errors: unknown[];
  /** The n-th connection (0-based), once accepted. */
  peer(n: number): Promise<Peer>;
  close(): Promise<void>;
}

const servers: Server[] = [];
const pools: TunnelClient<string>[] = [];
const recs: Rec[] = [];

/** A TCP server running `script` on each connection it accepts. */
async function serve(script: (peer: Peer) => Promise<void> | void): Promise<Server> {
  const peers: Peer[] = [];
  const errors: unknown[] = [];
  let waiters: (() => void)[] = [];
  const server = net.createServer((socket) => {
    const peer = new Peer(socket, peers.length);
    peers.push(peer);
    const w = waiters;
    waiters = [];
    for (const f of w) f();
    Promise.resolve()
      .then(() => script(peer))
      .catch((err: unknown) => errors.push(err));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as net.AddressInfo).port;
  const s: Server = {
    port,
    peers,
    errors,
    async peer(n) {
      while (peers.length <= n) await new Promise<void>((r) => waiters.push(r));
      return peers[n]!;
    },
    async close() {
      for (const p of peers) p.socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
  servers.push(s);
  return s;
}

/** A script answering every request on the connection with `answer` (a string, or made per request). */
function answering(answer: string | ((req: RawRequest, peer: Peer, n: number) => string | Promise<string> | null)): (peer: Peer) => Promise<void> {
  return async (peer) => {
    for (let n = 0; ; n++) {
      const req = await peer.readRequest();
      if (req === null) return;
      const a = typeof answer === 'string' ? answer : await answer(req, peer, n);
      if (a === null) return;
      await peer.write(a);
    }
  };
}

/** A pool on `port`; `sockets`: the client's end of each connection it opened, in order. */
function client(port: number, o: Partial<TunnelClientOptions<string>> = {}): TunnelClient<string> & { connects: number; sockets: net.Socket[] } {
  const state = { connects: 0 };
  const sockets: net.Socket[] = [];
  const pool = new TunnelClient<string>({
    connections: 4,
    headersTimeout: 5000,
    keepAliveTimeout: 4000,
    keepAliveMaxTimeout: 600_000,
    connect: () => {
      state.connects++;
      const socket = net.connect(port, '127.0.0.1');
      sockets.push(socket);
      return socket;
    },
    ...o,
  });
  pools.push(pool);
  Object.defineProperty(pool, 'sockets', { value: sockets });
  return Object.defineProperty(pool, 'connects', { get: () => state.connects }) as TunnelClient<string> & { connects: number; sockets: net.Socket[] };
}

/**
 * Resolves once the client's `socket` has received `n` more bytes and the client has read them:
 * its own 'data' listener, added when the connection was opened, runs before this one.
 */
function received(socket: net.Socket, n: number): Promise<void> {
  return new Promise<void>((resolve) => {
    let got = 0;
    const onData = (d: Buffer): void => {
      got += d.length;
      if (got < n) return;
      socket.off('data', onData);
      resolve();
    };
    socket.on('data', onData);
  });
}

/** A promise and the function settling it. */
function signal(): { promise: Promise<void>; fire: () => void } {
  let fire!: () => void;
  const promise = new Promise<void>((r) => (fire = r));
  return { promise, fire };
}

/** A script answering every request with its own path (`answer to /path`), so an answer tells which request it is for. */
const echoing = () => answering((req) => OK(`answer to ${req.requestLine.split(' ')[1]}`));

/** Sends `path`, pauses on its first piece of body, aborts it there; resolves once it failed so. */
async function abortedWhilePaused(pool: TunnelClient<string>, path: string): Promise<Rec> {
  const paused = signal();
  const rec = new Rec('paused', {
    data: () => {
      paused.fire();
      return false;
    },
  });
  pool.dispatch(get(path), rec, 'info');
  await paused.promise;
  rec.abortFn!();
  await rec.done;
  expectError(rec, 'UND_ERR_ABORTED');
  return rec;
}

/**
 * A pool of one connection whose request `/held` the server answers only once `release` fires
 * (other paths at once, `answer to <path>`): what waits behind it is queued.
 */
/**
 * A server's first answer: the head and one byte of a `size`-byte body, then the rest once the
 * client has aborted (`then` serves that connection on); and a recorder that aborts on that byte.
 */
function abortedAfterFirstByte(name: string, size: number, then?: (peer: Peer) => Promise<void>) {
  const aborted = signal();
  const first = async (peer: Peer) => {
    await peer.readRequest();
    await peer.write(`HTTP/1.1 200 OK\r\nContent-Length: ${size}\r\n\r\na`);
    await aborted.promise;
    await peer.write(Buffer.alloc(size - 1, 'b'));
    if (then) await then(peer);
  };
  const rec = new Rec(name, {
    data: (_c, r) => {
      r.abortFn!();
      aborted.fire();
    },
  });
  return { first, rec };
}

async function holdingTheOnlyConnection() {
  const release = signal();
  const srv = await serve(
    answering(async (req) => {
      const path = req.requestLine.split(' ')[1]!;
      if (path === '/held') await release.promise;
      return OK(`answer to ${path}`);
    }),
  );
  const pool = client(srv.port, { connections: 1 });
  const held = new Rec('held');
  const cancelHeld = pool.dispatch(get('/held'), held, 'info');
  const peer = await srv.peer(0);
  await peer.waitFor(() => peer.all.includes('/held '));
  return { srv, pool, held, cancelHeld, peer, release };
}

interface Hooks {
  connect?: (abort: (err?: Error) => void, rec: Rec) => void;
  head?: (rec: Rec) => void;
  /** false pauses. */
  data?: (chunk: Buffer, rec: Rec) => boolean | void;
  complete?: (rec: Rec) => void;
  error?: (err: Error, rec: Rec) => void;
}

/** A handler that records what it is told and checks it is told in a valid order. */
class Rec implements TunnelHandler {
  state: 'new' | 'connected' | 'head' | 'complete' | 'error' = 'new';
  readonly events: string[] = [];
  readonly violations: string[] = [];
  abortFn: ((err?: Error) => void) | null = null;
  status = 0;
  headers: string[] = [];
  statusText = '';
  resumeFn: (() => void) | null = null;
  readonly chunks: Buffer[] = [];
  error: CodedError | null = null;
  /** onData returned false and resume() was not called since. */
  paused = false;
  readonly done: Promise<void>;
  private settle!: () => void;

  constructor(
    readonly name = '',
    readonly hooks: Hooks = {},
  ) {
    this.done = new Promise<void>((r) => (this.settle = r));
    recs.push(this);
  }

  private violation(what: string): void {
    this.violations.push(`${this.name}: ${what} (state ${this.state})`);
  }

  onConnect(abort: (err?: Error) => void): void {
    this.events.push('connect');
    if (this.state !== 'new') this.violation('onConnect');
    else this.state = 'connected';
    this.abortFn = abort;
    this.hooks.connect?.(abort, this);
  }

  onHead(status: number, headers: string[], resume: () => void, statusText: string): void {
    this.events.push(`head ${status}`);
    if (this.state !== 'connected') this.violation('onHead');
    else this.state = 'head';
    this.status = status;
    this.headers = headers;
    this.statusText = statusText;
    this.resumeFn = resume;
    this.hooks.head?.(this);
  }

  onData(chunk: Buffer): boolean {
    this.events.push('data');
    if (this.state !== 'head') this.violation('onData');
    if (this.paused) this.violation('onData while paused');
    this.chunks.push(Buffer.from(chunk));
    const r = this.hooks.data?.(chunk, this);
    if (r === false) this.paused = true;
    return r !== false;
  }

  onComplete(): void {
    this.events.push('complete');
    if (this.state !== 'head') this.violation('onComplete');
    this.state = 'complete';
    this.settle();
    this.hooks.complete?.(this);
  }

  onError(err: Error): void {
    this.events.push(`error ${(err as CodedError).code ?? err.message}`);
    if (this.state === 'complete' || this.state === 'error') this.violation('onError');
    this.state = 'error';
    this.error = err;
    this.settle();
    this.hooks.error?.(err, this);
  }

  resume(): void {
    this.paused = false;
    this.resumeFn!();
  }

  get body(): string {
    return Buffer.concat(this.chunks).toString('latin1');
  }
}

function get(path = '/', headers: string[] = []): TunnelRequest {
  return { method: 'GET', path, headers, body: null };
}

/** Dispatches `req` and waits for its end. */
async function run(pool: TunnelClient<string>, req: TunnelRequest, rec = new Rec()): Promise<Rec> {
  pool.dispatch(req, rec, 'info');
  await rec.done;
  return rec;
}

function expectOk(rec: Rec, status = 200, body?: string): void {
  expect(rec.violations).toEqual([]);
  expect(rec.error).toBeNull();
  expect(rec.state).toBe('complete');
  expect(rec.status).toBe(status);
  if (body !== undefined) expect(rec.body).toBe(body);
}

function expectError(rec: Rec, code: string): void {
  expect(rec.violations).toEqual([]);
  expect(rec.state).toBe('error');
  expect(rec.error).toBeInstanceOf(Error);
  expect(rec.error!.code).toBe(code);
  expect(rec.events.filter((e) => e === 'complete')).toEqual([]);
}

afterEach(async () => {
  for (const p of pools.splice(0)) await p.destroy();
  for (const s of servers.splice(0)) await s.close();
  const violations = recs.splice(0).flatMap((r) => r.violations);
  expect(violations).toEqual([]);
});

const OK = (body: string, extra = '') => `HTTP/1.1 200 OK\r\n${extra}Content-Length: ${Buffer.byteLength(body, 'latin1')}\r\n\r\n${body}`;

describe('TunnelClient', { timeout: 3000 }, () => {
  describe('a GET with a Content-Length response', () => {
    it('calls onConnect, onHead (flat headers as received), onData, onComplete; writes the head as given with connection: keep-alive', async () => {
      const seen: RawRequest[] = [];
      const srv = await serve(async (peer) => {
        seen.push((await peer.readRequest())!);
        await peer.write('HTTP/1.1 200 Fine Thanks\r\nX-Foo: bar\r\nset-cookie: a=1\r\nSet-Cookie: b=2\r\nX-Padded:   spaced out  \r\nX-Latin: caf\xe9\r\nContent-Length: 11\r\n\r\nhello');
        // The body's rest comes in a later segment.
        await tick(20);
        await peer.write(' world');
      });
      const pool = client(srv.port);
      const rec = new Rec('get');
      pool.dispatch(get('/path?q=1&r=%20', ['host', 'example.test', 'x-a', '1', 'X-B', 'two']), rec, 'info');
      await rec.done;
      expectOk(rec, 200, 'hello world');
      expect(rec.events[0]).toBe('connect');
      expect(rec.events[1]).toBe('head 200');
      expect(rec.events.at(-1)).toBe('complete');
      expect(rec.events.filter((e) => e === 'data').length).toBeGreaterThanOrEqual(2);
      expect(rec.statusText).toBe('Fine Thanks');
      expect(rec.headers).toEqual(['X-Foo', 'bar', 'set-cookie', 'a=1', 'Set-Cookie', 'b=2', 'X-Padded', 'spaced out', 'X-Latin', 'caf\xe9', 'Content-Length', '11']);
      expect(typeof rec.resumeFn).toBe('function');
      expect(seen[0]!.raw.toString('latin1')).toBe('GET /path?q=1&r=%20 HTTP/1.1\r\nhost: example.test\r\nx-a: 1\r\nX-B: two\r\nconnection: keep-alive\r\n\r\n');
      expect(headerOf(seen[0]!.headers, 'content-length')).toBeUndefined();
      expect(pool.size).toBe(0);
    });

    it('a status line without a reason phrase: statusText empty', async () => {
      const srv = await serve(answering('HTTP/1.1 404\r\nContent-Length: 2\r\n\r\nno'));
      const rec = await run(client(srv.port), get());
      expectOk(rec, 404, 'no');
      expect(rec.statusText).toBe('');
    });

    it('a Content-Length: 0 response completes without onData', async () => {
      const srv = await serve(answering('HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n'));
      const rec = await run(client(srv.port), get());
      expectOk(rec, 200, '');
      expect(rec.events).toEqual(['connect', 'head 200', 'complete']);
    });
  });

  describe('keep-alive', () => {
    it('two sequential requests go over one connection', async () => {
      const paths: string[] = [];
      const srv = await serve(
        answering((req) => {
          paths.push(req.requestLine);
          return OK(`you asked ${req.requestLine.split(' ')[1]}`);
        }),
      );
      const pool = client(srv.port);
      expectOk(await run(pool, get('/one')), 200, 'you asked /one');
      expectOk(await run(pool, get('/two')), 200, 'you asked /two');
      // And a third dispatched from the second's onComplete.
      const third = new Rec('third');
      const second = new Rec('second', { complete: () => pool.dispatch(get('/four'), third, 'info') });
      pool.dispatch(get('/three'), second, 'info');
      await third.done;
      expectOk(second, 200, 'you asked /three');
      expectOk(third, 200, 'you asked /four');
      expect(paths).toEqual(['GET /one HTTP/1.1', 'GET /two HTTP/1.1', 'GET /three HTTP/1.1', 'GET /four HTTP/1.1']);
      expect(srv.peers.length).toBe(1);
      expect(pool.connects).toBe(1);
    });

    it('Connection: close in the response: the next request opens a new connection', async () => {
      const srv = await serve(answering(OK('bye', 'Connection: close\r\n')));
      const pool = client(srv.port);
      expectOk(await run(pool, get()), 200, 'bye');
      expectOk(await run(pool, get()), 200, 'bye');
      expect(srv.peers.length).toBe(2);
      // The first is closed by the client.
      await srv.peers[0]!.closed;
    });

    it('Connection: close in the request is written and the connection is not reused', async () => {
      const seen: string[] = [];
      const srv = await serve(
        answering((req) => {
          seen.push(req.raw.toString('latin1'));
          return OK('x');
        }),
      );
      const pool = client(srv.port);
      expectOk(await run(pool, get('/', ['Connection', 'close'])), 200, 'x');
      expectOk(await run(pool, get('/', ['Connection', 'keep-alive'])), 200, 'x');
      expectOk(await run(pool, get('/')), 200, 'x');
      expect(seen).toEqual(['GET / HTTP/1.1\r\nconnection: close\r\n\r\n', 'GET / HTTP/1.1\r\nconnection: keep-alive\r\n\r\n', 'GET / HTTP/1.1\r\nconnection: keep-alive\r\n\r\n']);
      expect(srv.peers.length).toBe(2);
    });

    it('an HTTP/1.0 response without keep-alive: a new connection; with Connection: keep-alive: reused', async () => {
      const srv = await serve(answering((_req, _peer, n) => (n === 0 ? 'HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nka' : 'HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok')));
      const pool = client(srv.port);
      expectOk(await run(pool, get()), 200, 'ka');
      expectOk(await run(pool, get()), 200, 'ok'); // same connection, its 2nd answer: HTTP/1.0 without keep-alive
      expect(srv.peers.length).toBe(1);
      expectOk(await run(pool, get()), 200, 'ka');
      expect(srv.peers.length).toBe(2);
      await srv.peers[0]!.closed;
    });

    it('Keep-Alive: timeout=1 (less than the 1 s margin): not reused', async () => {
      const srv = await serve(answering(OK('x', 'Keep-Alive: timeout=1\r\n')));
      const pool = client(srv.port);
      expectOk(await run(pool, get()), 200, 'x');
      expectOk(await run(pool, get()), 200, 'x');
      expect(srv.peers.length).toBe(2);
    });

    it('Keep-Alive: timeout=5 capped by keepAliveMaxTimeout: the idle connection is closed after it', async () => {
      const srv = await serve(answering(OK('x', 'Keep-Alive: timeout=5\r\n')));
      const pool = client(srv.port, { keepAliveMaxTimeout: 150, keepAliveTimeout: 60_000 });
      expectOk(await run(pool, get()), 200, 'x');
      const t0 = performance.now();
      await srv.peers[0]!.closed;
      const idle = performance.now() - t0;
      expect(idle).toBeGreaterThanOrEqual(100);
      expect(idle).toBeLessThan(1500);
      expectOk(await run(pool, get()), 200, 'x');
      expect(srv.peers.length).toBe(2);
    });

    it('no hint: the idle connection is closed after keepAliveTimeout', async () => {
      const srv = await serve(answering(OK('x')));
      const pool = client(srv.port, { keepAliveTimeout: 150 });
      expectOk(await run(pool, get()), 200, 'x');
      const t0 = performance.now();
      await srv.peers[0]!.closed;
      expect(performance.now() - t0).toBeGreaterThanOrEqual(100);
      expectOk(await run(pool, get()), 200, 'x');
      expect(srv.peers.length).toBe(2);
    });

    it('the server closing an idle connection: the next request opens a new one, without error', async () => {
      const srv = await serve(async (peer) => {
        await peer.readRequest();
        await peer.write(OK('x'));
        if (peer.index === 0) peer.end();
        else await answering(OK('y'))(peer);
      });
      const pool = client(srv.port);
      expectOk(await run(pool, get()), 200, 'x');
      await srv.peers[0]!.closed;
      expectOk(await run(pool, get()), 200, 'x');
      expect(srv.peers.length).toBe(2);
    });
  });

  describe('response framing', () => {
    const chunkedBody = 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n' + '5;name=value\r\nhello\r\n' + '1;a;b="c d"\r\n \r\n' + 'A\r\n0123456789\r\n' + 'a\r\nabcdefghij\r\n' + '0;last\r\nX-Trailer: t\r\nX-Other: o\r\n\r\n';
    const decoded = 'hello 0123456789abcdefghij';

    it('a chunked response (extensions, trailers) in one write; the connection is reused', async () => {
      const srv = await serve(answering(chunkedBody));
      const pool = client(srv.port);
      const rec = await run(pool, get());
      expectOk(rec, 200, decoded);
      expect(rec.headers).toEqual(['Transfer-Encoding', 'chunked']);
      expectOk(await run(pool, get()), 200, decoded);
      expect(srv.peers.length).toBe(1);
    });

    it('a chunked response written byte by byte (head included), then the next request on the same connection', async () => {
      const srv = await serve(async (peer) => {
        await peer.readRequest();
        await peer.writeSlowly(chunkedBody);
        await answering(OK('next'))(peer);
      });
      const pool = client(srv.port);
      const rec = await run(pool, get());
      expectOk(rec, 200, decoded);
      // Split into many pieces (how many depends on how TCP delivered the bytes).
      expect(rec.events.filter((e) => e === 'data').length).toBeGreaterThan(5);
      expectOk(await run(pool, get()), 200, 'next');
      expect(srv.peers.length).toBe(1);
    });

    it('a chunked response in tiny writes of 3 bytes, and a large chunked body', async () => {
      const big = Buffer.alloc(300_000, 'z').toString('latin1');
      const srv = await serve(async (peer) => {
        await peer.readRequest();
        await peer.writeSlowly(chunkedBody, 3);
        await peer.readRequest();
        await peer.write(`HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n${(100_000).toString(16)}\r\n${big.slice(0, 100_000)}\r\n${(200_000).toString(16)}\r\n${big.slice(100_000)}\r\n0\r\n\r\n`);
      });
      const pool = client(srv.port);
      expectOk(await run(pool, get()), 200, decoded);
      expectOk(await run(pool, get()), 200, big);
      expect(srv.peers.length).toBe(1);
    });

    it('a response without length is read until the stream ends; the connection is not reused', async () => {
      const srv = await serve(async (peer) => {
        await peer.readRequest();
        await peer.write('HTTP/1.1 200 OK\r\nX-A: 1\r\n\r\nfirst ');
        await tick(10);
        await peer.write('second ');
        await tick(10);
        peer.end('third');
      });
      const pool = client(srv.port);
      expectOk(await run(pool, get()), 200, 'first second third');
      expectOk(await run(pool, get()), 200, 'first second third');
      expect(srv.peers.length).toBe(2);
    });

    it('Transfer-Encoding other than chunked last: read until the stream ends', async () => {
      const srv = await serve(async (peer) => {
        await peer.readRequest();
        peer.end('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n5\r\nnot decoded');
      });
      const pool = client(srv.port);
      expectOk(await run(pool, get()), 200, '5\r\nnot decoded');
    });

    it('HEAD: no body even with a Content-Length; the connection is not reused (an upstream that sends a body anyway cannot answer the next request with it)', async () => {
      const seen: string[] = [];
      const srv = await serve(
        answering((req) => {
          seen.push(req.requestLine);
          return req.requestLine.startsWith('HEAD') ? 'HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n' : OK('after head');
        }),
      );
      const pool = client(srv.port);
      const head = await run(pool, { method: 'HEAD', path: '/', headers: [], body: null });
      expectOk(head, 200, '');
      expect(head.headers).toEqual(['Content-Length', '1234']);
      expect(head.events).toEqual(['connect', 'head 200', 'complete']);
      expectOk(await run(pool, get()), 200, 'after head');
      expect(seen).toEqual(['HEAD / HTTP/1.1', 'GET / HTTP/1.1']);
      expect(srv.peers.length).toBe(2);
    });

    it('HEAD answered with a body it should not have (a crafted response in it): the next request gets its own answer', async () => {
      const srv = await serve(async (peer) => {
        const req = await peer.readRequest();
        if (req!.requestLine.startsWith('HEAD')) {
          // The body holds a whole response: read as the next request's answer on a reused connection.
          await peer.write('HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\n');
          await tick(20);
          await peer.write('HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled');
          return;
        }
        await peer.write(OK('own answer'));
      });
      const pool = client(srv.port);
      expectOk(await run(pool, { method: 'HEAD', path: '/', headers: [], body: null }), 200, '');
      expectOk(await run(pool, get()), 200, 'own answer');
    });

    it('204 and 304 with a Content-Length: no body; the next request on the same connection works', async () => {
      const srv = await serve(
        answering((_req, _peer, n) => {
          if (n === 0) return 'HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n';
          if (n === 1) return 'HTTP/1.1 304 Not Modified\r\nContent-Length: 100\r\nETag: "x"\r\n\r\n';
          return OK('third');
        }),
      );
      const pool = client(srv.port);
      const a = await run(pool, get());
      expectOk(a, 204, '');
      expect(a.events).toEqual(['connect', 'head 204', 'complete']);
      const b = await run(pool, get());
      expectOk(b, 304, '');
      expect(b.headers).toEqual(['Content-Length', '100', 'ETag', '"x"']);
      expectOk(await run(pool, get()), 200, 'third');
      expect(srv.peers.length).toBe(1);
    });

    it('100 Continue and 103 Early Hints are skipped before the final head', async () => {
      const srv = await serve(
        answering(async (_req, peer, n) => {
          if (n === 0) {
            await peer.write('HTTP/1.1 100 Continue\r\n\r\n');
            await tick(10);
            await peer.write('HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n');
            await tick(10);
            return OK('final', 'X-Final: 1\r\n');
          }
          if (n === 1) return 'HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n' + OK('together');
          await peer.writeSlowly('HTTP/1.1 100 Continue\r\n\r\n' + OK('slowly'));
          return '';
        }),
      );
      const pool = client(srv.port);
      const a = await run(pool, get());
      expectOk(a, 200, 'final');
      expect(a.headers).toEqual(['X-Final', '1', 'Content-Length', '5']);
      expect(a.events.filter((e) => e.startsWith('head'))).toEqual(['head 200']);
      expectOk(await run(pool, get()), 200, 'together');
      expectOk(await run(pool, get()), 200, 'slowly');
      expect(srv.peers.length).toBe(1);
    });

    it('stray bytes after a response in the same write (two responses for one request): the connection is not reused', async () => {
      const srv = await serve(answering(OK('one') + OK('two')));
      const pool = client(srv.port);
      expectOk(await run(pool, get()), 200, 'one');
      expectOk(await run(pool, get()), 200, 'one');
      expect(srv.peers.length).toBe(2);
      await srv.peers[0]!.closed;
    });

    it('stray bytes after a bodiless response in the same write (204, and a chunked one): not reused', async () => {
      const srv = await serve(
        answering((_req, peer) => (peer.index === 0 ? 'HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\n\r\n' : 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\nXYZ')),
      );
      const pool = client(srv.port);
      expectOk(await run(pool, get()), 204, '');
      expectOk(await run(pool, get()), 200, 'a');
      expectOk(await run(pool, get()), 200, 'a');
      expect(srv.peers.length).toBe(3);
    });

    it('stray bytes arriving on an idle connection: it is closed, the next request uses a new one', async () => {
      const srv = await serve(async (peer) => {
        await peer.readRequest();
        await peer.write(OK('one'));
        if (peer.index === 0) {
          await tick(20);
          await peer.write(OK('unasked'));
          return;
        }
        await answering(OK('fresh'))(peer);
      });
      const pool = client(srv.port);
      expectOk(await run(pool, get()), 200, 'one');
      await srv.peers[0]!.closed;
      expectOk(await run(pool, get()), 200, 'one');
      expect(srv.peers.length).toBe(2);
    });
  });

  describe('errors', () => {
    async function failing(response: string | ((peer: Peer) => Promise<void>), opts: Partial<TunnelClientOptions<string>> = {}): Promise<{ rec: Rec; srv: Server; pool: TunnelClient<string> & { connects: number } }> {
      const srv = await serve(async (peer) => {
        if (peer.index > 0) return answering(OK('recovered'))(peer);
        await peer.readRequest();
        if (typeof response === 'string') await peer.write(response);
        else await response(peer);
      });
      const pool = client(srv.port, opts);
      const rec = await run(pool, get(), new Rec('failing'));
      return { rec, srv, pool };
    }

    /** The failed request's connection is closed and the pool works on a new one. */
    async function recovers(srv: Server, pool: TunnelClient<string>): Promise<void> {
      await srv.peers[0]!.closed;
      expectOk(await run(pool, get()), 200, 'recovered');
      expect(srv.peers.length).toBe(2);
    }

    it('a malformed status line', async () => {
      for (const bad of ['HTTP/1.1 OK\r\n\r\n', 'FOO 200 OK\r\n\r\n', 'HTTP/1.1 2000 OK\r\n\r\n', 'HTTP/2.0 200 OK\r\n\r\n', 'HTTP/1.1 099 Low\r\n\r\n']) {
        const { rec, srv, pool } = await failing(bad);
        expect(rec.state).toBe('error');
        expect(rec.error!.code).toMatch(/^HPE_/);
        expect(rec.events).toEqual(['connect', `error ${rec.error!.code}`]);
        await recovers(srv, pool);
      }
    });

    it('a status code that is not exactly three digits (2e2, 20) or below 100 (099): HPE_ errors, not read as a status', async () => {
      const a = await failing('HTTP/1.1 2e2 OK\r\nContent-Length: 2\r\n\r\nok');
      expectError(a.rec, 'HPE_INVALID_STATUS');
      expect(a.rec.events).toEqual(['connect', 'error HPE_INVALID_STATUS']);
      await recovers(a.srv, a.pool);
      for (const bad of ['HTTP/1.1 099 X\r\nContent-Length: 2\r\n\r\nok', 'HTTP/1.1 20 OK\r\nContent-Length: 2\r\n\r\nok']) {
        const { rec, srv, pool } = await failing(bad);
        expect(rec.violations).toEqual([]);
        expect(rec.state).toBe('error');
        expect(rec.error!.code).toMatch(/^HPE_/);
        expect(rec.events).toEqual(['connect', `error ${rec.error!.code}`]);
        await recovers(srv, pool);
      }
    });

    it('a header line without a colon', async () => {
      const { rec, srv, pool } = await failing('HTTP/1.1 200 OK\r\nno colon here\r\nContent-Length: 0\r\n\r\n');
      expectError(rec, 'HPE_INVALID_HEADER_TOKEN');
      await recovers(srv, pool);
    });

    it('Transfer-Encoding together with Content-Length', async () => {
      const { rec, srv, pool } = await failing('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n5\r\nhello\r\n0\r\n\r\n');
      expectError(rec, 'HPE_UNEXPECTED_CONTENT_LENGTH');
      expect(rec.events).not.toContain('head 200');
      await recovers(srv, pool);
    });

    it('two differing Content-Lengths (and an invalid one)', async () => {
      for (const bad of ['HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!', 'HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello', 'HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n']) {
        const { rec, srv, pool } = await failing(bad);
        expectError(rec, 'HPE_UNEXPECTED_CONTENT_LENGTH');
        await recovers(srv, pool);
      }
    });

    it('a head larger than maxHeaderSize: UND_ERR_HEADERS_OVERFLOW (complete, or still incomplete)', async () => {
      const big = 'x'.repeat(2000);
      const a = await failing(`HTTP/1.1 200 OK\r\nX-Big: ${big}\r\nContent-Length: 0\r\n\r\n`, { maxHeaderSize: 1024 });
      expectError(a.rec, 'UND_ERR_HEADERS_OVERFLOW');
      await recovers(a.srv, a.pool);
      // Never terminated: failed as soon as it is too large, not at a timeout.
      const b = await failing(`HTTP/1.1 200 OK\r\nX-Big: ${big}`, { maxHeaderSize: 1024 });
      expectError(b.rec, 'UND_ERR_HEADERS_OVERFLOW');
      await recovers(b.srv, b.pool);
      // Under the limit it is fine.
      const srv = await serve(answering(OK('fits', `X-Big: ${'y'.repeat(900)}\r\n`)));
      expectOk(await run(client(srv.port, { maxHeaderSize: 1024 }), get()), 200, 'fits');
    });

    it('an invalid chunk size, and chunk data not followed by CRLF: after onHead, onError', async () => {
      const a = await failing('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n');
      expectError(a.rec, 'HPE_INVALID_CHUNK_SIZE');
      expect(a.rec.events).toEqual(['connect', 'head 200', 'error HPE_INVALID_CHUNK_SIZE']);
      await recovers(a.srv, a.pool);
      const b = await failing('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\r\n');
      expectError(b.rec, 'HPE_INVALID_CHUNK_SIZE');
      await recovers(b.srv, b.pool);
      const c = await failing('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokXX\r\n0\r\n\r\n');
      expect(c.rec.state).toBe('error');
      expect(c.rec.error!.code).toMatch(/^HPE_/);
      expect(c.rec.body).toBe('ok');
      await recovers(c.srv, c.pool);
    });

    it('101 Switching Protocols to a request that asked for no upgrade', async () => {
      const { rec, srv, pool } = await failing('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n');
      expectError(rec, 'UND_ERR_SOCKET');
      await recovers(srv, pool);
    });

    it('the server closing before the head (nothing, or part of it): UND_ERR_SOCKET', async () => {
      const a = await failing(async (peer) => peer.end());
      expectError(a.rec, 'UND_ERR_SOCKET');
      expect(a.rec.events).toEqual(['connect', 'error UND_ERR_SOCKET']);
      await recovers(a.srv, a.pool);
      const b = await failing(async (peer) => peer.end('HTTP/1.1 200 OK\r\nContent-Le'));
      expectError(b.rec, 'UND_ERR_SOCKET');
      await recovers(b.srv, b.pool);
    });

    it('the server closing mid-body (Content-Length, and chunked): onError after onHead', async () => {
      const a = await failing(async (peer) => peer.end('HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf'));
      expectError(a.rec, 'UND_ERR_SOCKET');
      expect(a.rec.events[1]).toBe('head 200');
      expect(a.rec.body).toBe('half');
      await recovers(a.srv, a.pool);
      const b = await failing(async (peer) => peer.end('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nhalf\r\n'));
      expectError(b.rec, 'UND_ERR_SOCKET');
      expect(b.rec.body).toBe('half');
      await recovers(b.srv, b.pool);
    });

    it('nothing listening: onError with the socket error, and the pool keeps working', async () => {
      const srv = await serve(answering(OK('up')));
      const closed = net.createServer();
      await new Promise<void>((r) => closed.listen(0, '127.0.0.1', r));
      const port = (closed.address() as net.AddressInfo).port;
      await new Promise<void>((r) => closed.close(() => r()));
      let target = port;
      const pool = new TunnelClient<string>({ connections: 2, headersTimeout: 5000, keepAliveTimeout: 4000, keepAliveMaxTimeout: 600_000, connect: () => net.connect(target, '127.0.0.1') });
      pools.push(pool);
      const rec = await run(pool, get());
      expectError(rec, 'ECONNREFUSED');
      target = srv.port;
      expectOk(await run(pool, get()), 200, 'up');
    });

    it('headersTimeout: no head in time → UND_ERR_HEADERS_TIMEOUT and the stream closed', async () => {
      const t0 = performance.now();
      const a = await failing(async () => {}, { headersTimeout: 200 });
      const took = performance.now() - t0;
      expectError(a.rec, 'UND_ERR_HEADERS_TIMEOUT');
      expect(a.rec.events).toEqual(['connect', 'error UND_ERR_HEADERS_TIMEOUT']);
      expect(took).toBeGreaterThanOrEqual(180);
      expect(took).toBeLessThan(1500);
      await recovers(a.srv, a.pool);
      // Part of the head is not enough.
      const b = await failing(async (peer) => peer.write('HTTP/1.1 200 OK\r\nX-A: 1\r\n'), { headersTimeout: 200 });
      expectError(b.rec, 'UND_ERR_HEADERS_TIMEOUT');
      await recovers(b.srv, b.pool);
    });

    it('headersTimeout does not limit a slow body, and is counted per request on a reused connection', async () => {
      const srv = await serve(
        answering(async (_req, peer, n) => {
          if (n === 0) return OK('quick');
          if (n === 1) {
            // 150 ms: past 200 ms after the first request was written, not after this one.
            await tick(150);
            return OK('late but in time');
          }
          await peer.write('HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsl');
          await tick(150);
          await peer.write('ow');
          await tick(150);
          return 'ly';
        }),
      );
      const pool = client(srv.port, { headersTimeout: 200 });
      expectOk(await run(pool, get()), 200, 'quick');
      await tick(100);
      expectOk(await run(pool, get()), 200, 'late but in time');
      expectOk(await run(pool, get()), 200, 'slowly');
      expect(srv.peers.length).toBe(1);
    });

    describe('a request the client refuses: UND_ERR_INVALID_ARG, onError only, no connection, nothing written', () => {
      const bad: [string, TunnelRequest][] = [
        ['a header value with CRLF', get('/', ['x-a', 'ok\r\nx-injected: 1'])],
        ['a header value with a NUL', get('/', ['x-a', 'a\x00b'])],
        ['a path with a space', get('/a b')],
        ['an empty path', get('')],
        ['a path with CRLF', get('/\r\nx: y')],
        ['a header name with a space', get('/', ['x a', '1'])],
        ['an empty header name', get('/', ['', '1'])],
        ['a method with a space', { method: 'GE T', path: '/', headers: [], body: null }],
        ['transfer-encoding', get('/', ['Transfer-Encoding', 'chunked'])],
        ['upgrade', get('/', ['upgrade', 'websocket'])],
        ['expect', get('/', ['Expect', '100-continue'])],
        ['keep-alive', get('/', ['keep-alive', 'timeout=5'])],
        ['connection: upgrade', get('/', ['connection', 'upgrade'])],
        ['a non-numeric content-length', { method: 'POST', path: '/', headers: ['content-length', 'abc'], body: Buffer.from('x') }],
      ];
      for (const [name, req] of bad) {
        it(name, async () => {
          const srv = await serve(answering(OK('fine')));
          const pool = client(srv.port);
          const rec = new Rec(name);
          pool.dispatch(req, rec, 'info');
          // Synchronously.
          expect(rec.state).toBe('error');
          expectError(rec, 'UND_ERR_INVALID_ARG');
          expect(rec.events).toEqual(['error UND_ERR_INVALID_ARG']);
          expect(pool.connects).toBe(0);
          expect(pool.size).toBe(0);
          // The pool works, and the server saw only the good request.
          expectOk(await run(pool, get('/good')), 200, 'fine');
          expect(srv.peers.length).toBe(1);
          expect(srv.peers[0]!.all.toString('latin1')).toBe('GET /good HTTP/1.1\r\nconnection: keep-alive\r\n\r\n');
        });
      }
    });

    it('a Buffer body whose length differs from the content-length header: UND_ERR_REQ_CONTENT_LENGTH_MISMATCH, nothing written', async () => {
      const srv = await serve(answering(OK('fine')));
      const pool = client(srv.port);
      for (const req of [
        { method: 'POST', path: '/', headers: ['content-length', '3'], body: Buffer.from('hello') },
        { method: 'POST', path: '/', headers: ['Content-Length', '10'], body: Buffer.from('hello') },
        { method: 'POST', path: '/', headers: ['Content-Length', '5'], body: null },
      ]) {
        const rec = new Rec('mismatch');
        pool.dispatch(req, rec, 'info');
        expectError(rec, 'UND_ERR_REQ_CONTENT_LENGTH_MISMATCH');
        expect(rec.events).toEqual(['error UND_ERR_REQ_CONTENT_LENGTH_MISMATCH']);
      }
      expect(pool.connects).toBe(0);
      expectOk(await run(pool, get('/good')), 200, 'fine');
      expect(srv.peers[0]!.all.toString('latin1')).toBe('GET /good HTTP/1.1\r\nconnection: keep-alive\r\n\r\n');
    });

    it('a streamed body shorter or longer than its declared content-length: UND_ERR_REQ_CONTENT_LENGTH_MISMATCH, the connection closed', async () => {
      const srv = await serve(async (peer) => {
        if (peer.index === 2) return answering(OK('fine'))(peer);
        await peer.readRequest(true);
      });
      const pool = client(srv.port);
      // The body comes a little later, once the stream is connected.
      async function* late() {
        await tick(30);
        yield Buffer.from('abc');
      }
      const short = await run(pool, { method: 'POST', path: '/', headers: ['content-length', '10'], body: Readable.from(late()) });
      expectError(short, 'UND_ERR_REQ_CONTENT_LENGTH_MISMATCH');
      expect(short.events).toEqual(['connect', 'error UND_ERR_REQ_CONTENT_LENGTH_MISMATCH']);
      await srv.peers[0]!.closed;
      const long = await run(pool, { method: 'POST', path: '/', headers: ['content-length', '2'], body: Readable.from(late()) });
      expectError(long, 'UND_ERR_REQ_CONTENT_LENGTH_MISMATCH');
      await srv.peers[1]!.closed;
      // Never more than the declared length on the wire.
      expect(srv.peers[1]!.all.toString('latin1')).toBe('POST / HTTP/1.1\r\ncontent-length: 2\r\nconnection: keep-alive\r\n\r\n');
      expectOk(await run(pool, get()), 200, 'fine');
    });

    it('a streamed body that errors: onError with its error, the connection closed', async () => {
      const srv = await serve(async (peer) => {
        if (peer.index === 1) return answering(OK('fine'))(peer);
        await peer.readRequest(true);
      });
      const pool = client(srv.port);
      const boom = new Error('body failed');
      const body = new Readable({ read() {} });
      body.push('start');
      const rec = new Rec('body error');
      pool.dispatch({ method: 'POST', path: '/', headers: [], body }, rec, 'info');
      const peer = await srv.peer(0);
      await peer.waitFor(() => peer.all.includes('start'));
      body.destroy(boom);
      await rec.done;
      expect(rec.error).toBe(boom);
      expect(rec.violations).toEqual([]);
      await peer.closed;
      expectOk(await run(pool, get()), 200, 'fine');
    });

    it('a malformed head is an error as llhttp makes it: bare LF ending a header line, a NUL in a value, bare LF after a chunk size', async () => {
      // undici (llhttp) rejects each of these: "Missing expected CR after header value",
      // "Invalid header value char", "Missing expected CR after chunk size".
      const cases = [
        'HTTP/1.1 200 OK\r\nX-A: 1\nX-Injected: 2\r\nContent-Length: 2\r\n\r\nok',
        'HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 2\r\n\r\nok',
        'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\nok\r\n0\r\n\r\n',
      ];
      const outcomes: string[] = [];
      for (const bad of cases) {
        const { rec } = await failing(bad);
        expect(rec.violations).toEqual([]);
        outcomes.push(rec.state === 'error' && /^HPE_/.test(rec.error!.code ?? '') ? 'error' : `${rec.state} ${JSON.stringify(rec.headers)} ${JSON.stringify(rec.body)}`);
      }
      expect(outcomes).toEqual(['error', 'error', 'error']);
    });
  });

  describe('request bodies', () => {
    async function recording(answer = OK('got it')): Promise<{ srv: Server; seen: RawRequest[]; pool: TunnelClient<string> & { connects: number } }> {
      const seen: RawRequest[] = [];
      const srv = await serve(
        answering((req) => {
          seen.push(req);
          return answer;
        }),
      );
      return { srv, seen, pool: client(srv.port) };
    }

    it('a Buffer body: content-length: N written by the client (a given one in its place dropped)', async () => {
      const { seen, pool } = await recording();
      expectOk(await run(pool, { method: 'POST', path: '/up', headers: ['x-a', '1', 'Content-Length', '5', 'x-b', '2'], body: Buffer.from('hello') }), 200, 'got it');
      expectOk(await run(pool, { method: 'PUT', path: '/up', headers: ['x-a', '1'], body: Buffer.from('héllo', 'latin1') }), 200, 'got it');
      expectOk(await run(pool, { method: 'DELETE', path: '/up', headers: [], body: Buffer.from('x') }), 200, 'got it');
      expect(seen.map((r) => r.raw.toString('latin1'))).toEqual([
        'POST /up HTTP/1.1\r\nx-a: 1\r\nx-b: 2\r\ncontent-length: 5\r\nconnection: keep-alive\r\n\r\nhello',
        'PUT /up HTTP/1.1\r\nx-a: 1\r\ncontent-length: 5\r\nconnection: keep-alive\r\n\r\nh\xe9llo',
        'DELETE /up HTTP/1.1\r\ncontent-length: 1\r\nconnection: keep-alive\r\n\r\nx',
      ]);
    });

    it('a large Buffer body arrives whole', async () => {
      const { seen, pool } = await recording();
      const big = Buffer.alloc(1_000_000);
      for (let i = 0; i < big.length; i++) big[i] = i % 251;
      expectOk(await run(pool, { method: 'POST', path: '/', headers: [], body: big }), 200, 'got it');
      expect(headerOf(seen[0]!.headers, 'content-length')).toBe('1000000');
      expect(seen[0]!.body.equals(big)).toBe(true);
      expectOk(await run(pool, get()), 200, 'got it');
      expect(seen.length).toBe(2);
    });

    it('an empty POST/PUT/PATCH: content-length: 0; an empty GET body: none', async () => {
      const { seen, pool } = await recording();
      expectOk(await run(pool, { method: 'POST', path: '/', headers: [], body: null }));
      expectOk(await run(pool, { method: 'PATCH', path: '/', headers: [], body: Buffer.alloc(0) }));
      expectOk(await run(pool, { method: 'GET', path: '/', headers: [], body: Buffer.alloc(0) }));
      expectOk(await run(pool, { method: 'OPTIONS', path: '*', headers: [], body: null }));
      expect(seen.map((r) => r.raw.toString('latin1'))).toEqual([
        'POST / HTTP/1.1\r\ncontent-length: 0\r\nconnection: keep-alive\r\n\r\n',
        'PATCH / HTTP/1.1\r\ncontent-length: 0\r\nconnection: keep-alive\r\n\r\n',
        'GET / HTTP/1.1\r\nconnection: keep-alive\r\n\r\n',
        'OPTIONS * HTTP/1.1\r\nconnection: keep-alive\r\n\r\n',
      ]);
    });

    it('a Readable body with a content-length header: streamed as it is', async () => {
      const { seen, pool } = await recording();
      async function* parts() {
        yield Buffer.from('hello ');
        await tick(5);
        yield 'there ';
        await tick(5);
        yield Buffer.from('world');
      }
      expectOk(await run(pool, { method: 'POST', path: '/s', headers: ['Content-Length', '17', 'x-z', 'z'], body: Readable.from(parts()) }), 200, 'got it');
      expect(seen[0]!.raw.toString('latin1')).toBe('POST /s HTTP/1.1\r\nx-z: z\r\ncontent-length: 17\r\nconnection: keep-alive\r\n\r\nhello there world');
      // The connection is reused after it.
      expectOk(await run(pool, get()), 200, 'got it');
      expect(pool.connects).toBe(1);
    });

    it('a Readable body without content-length: transfer-encoding: chunked, encoded and terminated', async () => {
      const { srv, seen, pool } = await recording();
      async function* parts() {
        yield Buffer.from('ab');
        await tick(5);
        yield Buffer.alloc(0); // nothing to send: no (terminating) empty chunk
        yield Buffer.from('cde');
        await tick(5);
        yield Buffer.alloc(20, 'x');
      }
      expectOk(await run(pool, { method: 'PUT', path: '/c', headers: ['x-a', '1'], body: Readable.from(parts()) }), 200, 'got it');
      expect(seen[0]!.raw.toString('latin1')).toBe(`PUT /c HTTP/1.1\r\nx-a: 1\r\ntransfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n2\r\nab\r\n3\r\ncde\r\n14\r\n${'x'.repeat(20)}\r\n0\r\n\r\n`);
      // An empty stream: only the last chunk.
      expectOk(await run(pool, { method: 'POST', path: '/e', headers: [], body: Readable.from([]) }), 200, 'got it');
      expect(seen[1]!.raw.toString('latin1')).toBe('POST /e HTTP/1.1\r\ntransfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n0\r\n\r\n');
      // A big one, through backpressure.
      const big = Buffer.alloc(3_000_000, 'q');
      const pieces: Buffer[] = [];
      for (let i = 0; i < big.length; i += 65_536) pieces.push(big.subarray(i, i + 65_536));
      expectOk(await run(pool, { method: 'POST', path: '/b', headers: [], body: Readable.from(pieces) }), 200, 'got it');
      expect(seen[2]!.body.equals(big)).toBe(true);
      expect(srv.peers.length).toBe(1);
    });

    it('an early answer while a large streamed body is still being sent: onComplete, the body no longer read, the connection not reused', async () => {
      const seen: string[] = [];
      const srv = await serve(async (peer) => {
        const req = await peer.readRequest(peer.index === 0);
        seen.push(req!.requestLine);
        await peer.write('HTTP/1.1 413 Payload Too Large\r\nContent-Length: 8\r\n\r\ntoo much');
        if (peer.index > 0) await answering(OK('next'))(peer);
      });
      const pool = client(srv.port);
      let produced = 0;
      const body = new Readable({
        read() {
          produced += 65_536;
          this.push(Buffer.alloc(65_536, 'u'));
        },
      });
      const rec = await run(pool, { method: 'POST', path: '/upload', headers: [], body }, new Rec('early'));
      expectOk(rec, 413, 'too much');
      await srv.peers[0]!.closed;
      const after = produced;
      await tick(50);
      expect(produced - after).toBeLessThanOrEqual(65_536 * 2);
      expect(body.listenerCount('data')).toBe(0);
      body.destroy();
      expectOk(await run(pool, get('/next')), 413, 'too much');
      expect(srv.peers.length).toBe(2);
      expect(seen).toEqual(['POST /upload HTTP/1.1', 'GET /next HTTP/1.1']);
    });
  });

  describe('queueing', () => {
    it('connections: 2, five requests at once against a slow server: at most 2 connections, all complete, FIFO', async () => {
      let open = 0;
      let maxOpen = 0;
      const srv = await serve(async (peer) => {
        open++;
        maxOpen = Math.max(maxOpen, open);
        await answering(async (req) => {
          await tick(30);
          return OK(`answer to ${req.requestLine.split(' ')[1]}`);
        })(peer);
        open--;
      });
      const pool = client(srv.port, { connections: 2 });
      const starts: number[] = [];
      const completes: number[] = [];
      const all = [0, 1, 2, 3, 4].map((i) => new Rec(`q${i}`, { connect: () => starts.push(i), complete: () => completes.push(i) }));
      all.forEach((rec, i) => pool.dispatch(get(`/${i}`), rec, 'info'));
      expect(pool.size).toBe(5);
      expect(starts).toEqual([0, 1]);
      await Promise.all(all.map((r) => r.done));
      all.forEach((rec, i) => expectOk(rec, 200, `answer to /${i}`));
      expect(starts).toEqual([0, 1, 2, 3, 4]);
      expect(srv.peers.length).toBe(2);
      expect(maxOpen).toBeLessThanOrEqual(2);
      expect(pool.connects).toBe(2);
      expect(pool.size).toBe(0);
    });

    it('a request dispatched from an onComplete does not start before those already queued', async () => {
      const srv = await serve(answering((req) => OK(req.requestLine.split(' ')[1]!)));
      const pool = client(srv.port, { connections: 1 });
      const starts: string[] = [];
      const c = new Rec('C', { connect: () => starts.push('C') });
      const a = new Rec('A', { connect: () => starts.push('A'), complete: () => pool.dispatch(get('/c'), c, 'info') });
      const b = new Rec('B', { connect: () => starts.push('B') });
      pool.dispatch(get('/a'), a, 'info');
      pool.dispatch(get('/b'), b, 'info');
      await Promise.all([a.done, b.done, c.done]);
      expectOk(a, 200, '/a');
      expectOk(b, 200, '/b');
      expectOk(c, 200, '/c');
      expect(starts).toEqual(['A', 'B', 'C']);
    });

    it('a queued request that is refused (invalid) lets the next queued one start', async () => {
      const srv = await serve(answering(async (req) => {
        await tick(10);
        return OK(req.requestLine.split(' ')[1]!);
      }));
      const pool = client(srv.port, { connections: 1 });
      const a = new Rec('a');
      const bad = new Rec('bad');
      const c = new Rec('c');
      pool.dispatch(get('/a'), a, 'info');
      pool.dispatch(get('/b', ['x', 'a\r\nb']), bad, 'info');
      pool.dispatch(get('/c'), c, 'info');
      await Promise.all([a.done, bad.done, c.done]);
      expectOk(a, 200, '/a');
      expectError(bad, 'UND_ERR_INVALID_ARG');
      expectOk(c, 200, '/c');
      expect(srv.peers.length).toBe(1);
    });

    it('dispatch returns a cancel function: a cancelled queued request hears nothing and never runs; size counts live requests; cancelling a started one does nothing', async () => {
      const { srv, pool, held, cancelHeld, peer, release } = await holdingTheOnlyConnection();
      expect(typeof cancelHeld).toBe('function');
      const b = new Rec('B');
      let cancelC!: () => void;
      const c = new Rec('C', {
        // Started: cancelling it now does nothing.
        head: () => cancelC(),
      });
      const cancelB = pool.dispatch(get('/b'), b, 'info');
      cancelC = pool.dispatch(get('/c'), c, 'info');
      expect(pool.size).toBe(3); // 1 running + 2 queued
      cancelB();
      expect(pool.size).toBe(2);
      cancelB(); // twice: still once
      expect(pool.size).toBe(2);
      cancelHeld(); // running: nothing
      expect(pool.size).toBe(2);
      expect(b.events).toEqual([]);
      release.fire();
      await Promise.all([held.done, c.done]);
      expectOk(held, 200, 'answer to /held');
      expectOk(c, 200, 'answer to /c');
      expect(pool.size).toBe(0);
      cancelC(); // after it completed: nothing either
      expect(pool.size).toBe(0);
      await tick(20);
      expect(b.events).toEqual([]);
      expect(b.state).toBe('new');
      // Only /held and /c reached the server, on the one connection.
      expect(peer.all.toString('latin1')).toBe('GET /held HTTP/1.1\r\nconnection: keep-alive\r\n\r\nGET /c HTTP/1.1\r\nconnection: keep-alive\r\n\r\n');
      expect(srv.peers.length).toBe(1);
    });

    it('cancelling a queued request from inside its own onConnect (it has a connection then): does nothing, the request is served and size stays right', async () => {
      const { pool, held, release } = await holdingTheOnlyConnection();
      let cancelB!: () => void;
      let sizeInOnConnect = -1;
      const b = new Rec('B', {
        connect: () => {
          cancelB();
          sizeInOnConnect = pool.size;
        },
      });
      cancelB = pool.dispatch(get('/b'), b, 'info');
      expect(pool.size).toBe(2);
      release.fire();
      await held.done;
      // Bounded: a request neither completed nor failed would wait for ever.
      await Promise.race([b.done, tick(1000)]);
      expect({ events: b.events, sizeInOnConnect, sizeAfter: pool.size }).toEqual({ events: ['connect', 'head 200', 'data', 'complete'], sizeInOnConnect: 1, sizeAfter: 0 });
      expectOk(b, 200, 'answer to /b');
    });

    it('200 queued requests all cancelled: size back to the running one, then 0; the pool keeps serving in order past cancelled entries', async () => {
      let release = signal();
      const seen: string[] = [];
      const srv = await serve(
        answering(async (req) => {
          const path = req.requestLine.split(' ')[1]!;
          seen.push(path);
          if (path.startsWith('/held')) await release.promise;
          return OK(`answer to ${path}`);
        }),
      );
      const pool = client(srv.port, { connections: 1 });
      const held = new Rec('held');
      pool.dispatch(get('/held1'), held, 'info');
      const queued = Array.from({ length: 200 }, (_, i) => new Rec(`q${i}`));
      const cancels = queued.map((rec, i) => pool.dispatch(get(`/q${i}`), rec, 'info'));
      expect(pool.size).toBe(201);
      for (const cancel of cancels) cancel();
      expect(pool.size).toBe(1);
      release.fire();
      await held.done;
      expectOk(held, 200, 'answer to /held1');
      expect(pool.size).toBe(0);
      await tick(20);
      expect(queued.filter((r) => r.events.length > 0).map((r) => r.name)).toEqual([]);
      // Cancelled entries among live ones (every 10th kept): those kept run, in order.
      release = signal();
      const held2 = new Rec('held2');
      pool.dispatch(get('/held2'), held2, 'info');
      const mixed = Array.from({ length: 200 }, (_, i) => new Rec(`m${i}`));
      const cancels2 = mixed.map((rec, i) => pool.dispatch(get(`/m${i}`), rec, 'info'));
      cancels2.forEach((cancel, i) => {
        if (i % 10 !== 0) cancel();
      });
      expect(pool.size).toBe(1 + 20);
      release.fire();
      const kept = mixed.filter((_, i) => i % 10 === 0);
      await Promise.all([held2.done, ...kept.map((r) => r.done)]);
      kept.forEach((rec) => expectOk(rec, 200, `answer to /${rec.name}`));
      expect(mixed.filter((r, i) => i % 10 !== 0 && r.events.length > 0).map((r) => r.name)).toEqual([]);
      expect(seen).toEqual(['/held1', '/held2', ...kept.map((r) => `/${r.name}`)]);
      expect(pool.size).toBe(0);
      expect(srv.peers.length).toBe(1);
    });

    it('close() resolves once only cancelled entries remain: the last queued request cancelled while the only connection drops an aborted response', async () => {
      // A running request and a cancelled one queued: close() resolves when the running one ends.
      const release = signal();
      const srv0 = await serve(
        answering(async (req) => {
          await release.promise;
          return OK(`answer to ${req.requestLine.split(' ')[1]}`);
        }),
      );
      const pool0 = client(srv0.port, { connections: 1 });
      const running = new Rec('running');
      pool0.dispatch(get('/r'), running, 'info');
      const gone = new Rec('gone');
      const cancelGone = pool0.dispatch(get('/gone'), gone, 'info');
      const closing0 = pool0.close();
      cancelGone();
      expect(pool0.size).toBe(1);
      release.fire();
      await closing0;
      expectOk(running, 200, 'answer to /r');
      expect(gone.events).toEqual([]);
      expect(pool0.size).toBe(0);
      await srv0.peers[0]!.closed;
      expect(srv0.peers[0]!.all.toString('latin1')).toBe('GET /r HTTP/1.1\r\nconnection: keep-alive\r\n\r\n');
      // Nothing running, the only connection still dropping an aborted response, one queued request:
      const srv = await serve(async (peer) => {
        await peer.readRequest();
        await peer.write('HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart');
        // The rest never comes: the connection stays busy dropping it (up to DISCARD_MAX_MS).
      });
      const pool = client(srv.port, { connections: 1 });
      const aborted = await run(pool, get('/a'), new Rec('aborted', { data: (_c, r) => r.abortFn!() }));
      expectError(aborted, 'UND_ERR_ABORTED');
      const queued = new Rec('queued');
      const cancel = pool.dispatch(get('/b'), queued, 'info');
      expect(pool.size).toBe(1);
      let closed = false;
      const t0 = performance.now();
      const closing = pool.close().then(() => (closed = true));
      await tick(50);
      expect(closed).toBe(false); // the queued request is still to run
      cancel();
      expect(pool.size).toBe(0);
      await closing;
      expect(performance.now() - t0).toBeLessThan(DISCARD_MAX_MS / 2);
      await srv.peers[0]!.closed;
      expect(queued.events).toEqual([]);
      expect(srv.peers.length).toBe(1);
    });
  });

  describe('close() and destroy()', () => {
    it('close(): resolves after the running and queued requests finish; a dispatch after it fails with UND_ERR_CLOSED', async () => {
      let release!: () => void;
      const released = new Promise<void>((r) => (release = r));
      const srv = await serve(
        answering(async (req) => {
          if (req.requestLine.includes('/slow')) await released;
          return OK(req.requestLine.split(' ')[1]!);
        }),
      );
      const pool = client(srv.port, { connections: 1 });
      const order: string[] = [];
      const slow = new Rec('slow', { complete: () => order.push('slow') });
      const queued = new Rec('queued', { complete: () => order.push('queued') });
      pool.dispatch(get('/slow'), slow, 'info');
      pool.dispatch(get('/queued'), queued, 'info');
      await (await srv.peer(0)).waitFor(() => srv.peers[0]!.all.length > 0);
      const closing = pool.close().then(() => order.push('closed'));
      expect(pool.close()).toBe(pool.close());
      const late = new Rec('late');
      pool.dispatch(get('/late'), late, 'info');
      expectError(late, 'UND_ERR_CLOSED');
      expect(late.events).toEqual(['error UND_ERR_CLOSED']);
      await tick(20);
      expect(order).toEqual([]);
      release();
      await closing;
      expect(order).toEqual(['slow', 'queued', 'closed']);
      expectOk(slow, 200, '/slow');
      expectOk(queued, 200, '/queued');
      // Every stream is closed.
      await Promise.all(srv.peers.map((p) => p.closed));
    });

    it('close() with only idle connections: they are closed and it resolves at once', async () => {
      const srv = await serve(answering(OK('x')));
      const pool = client(srv.port);
      expectOk(await run(pool, get()), 200, 'x');
      await pool.close();
      await srv.peers[0]!.closed;
    });

    it('destroy(err): the running and queued handlers get onError(err), the connections are closed', async () => {
      const srv = await serve(async (peer) => {
        await peer.readRequest();
      });
      const pool = client(srv.port, { connections: 1 });
      const running = new Rec('running');
      const queued = new Rec('queued');
      pool.dispatch(get('/r'), running, 'info');
      pool.dispatch(get('/q'), queued, 'info');
      const peer = await srv.peer(0);
      await peer.waitFor(() => peer.all.length > 0);
      const err = new Error('going away');
      await pool.destroy(err);
      await Promise.all([running.done, queued.done]);
      expect(running.error).toBe(err);
      expect(queued.error).toBe(err);
      expect(running.events).toEqual(['connect', 'error going away']);
      expect(queued.events).toEqual(['error going away']);
      await peer.closed;
      expect(srv.peers.length).toBe(1);
      const late = new Rec('late');
      pool.dispatch(get(), late, 'info');
      expectError(late, 'UND_ERR_DESTROYED');
    });

    it('destroy() mid-body: onError after onHead, no onComplete', async () => {
      const srv = await serve(async (peer) => {
        await peer.readRequest();
        await peer.write('HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart');
      });
      const pool = client(srv.port);
      const rec = new Rec('mid', { data: () => void pool.destroy() });
      await run(pool, get(), rec);
      expectError(rec, 'UND_ERR_DESTROYED');
      expect(rec.events).toEqual(['connect', 'head 200', 'data', 'error UND_ERR_DESTROYED']);
      await srv.peers[0]!.closed;
    });
  });

  describe('abort', () => {
    it('synchronously inside onConnect: onError once, nothing written; the connection serves the next request', async () => {
      const srv = await serve(answering((req) => OK(req.requestLine.split(' ')[1]!)));
      const pool = client(srv.port);
      const reason = new Error('client went away');
      const a = await run(pool, get('/aborted'), new Rec('sync', { connect: (abort) => abort(reason) }));
      expect(a.violations).toEqual([]);
      expect(a.error).toBe(reason);
      expect(a.events).toEqual(['connect', 'error client went away']);
      // Without a reason: UND_ERR_ABORTED.
      const b = await run(pool, get('/aborted'), new Rec('sync2', { connect: (abort) => abort() }));
      expectError(b, 'UND_ERR_ABORTED');
      expectOk(await run(pool, get('/next')), 200, '/next');
      expect(srv.peers.length).toBe(1);
      expect(srv.peers[0]!.all.toString('latin1')).toBe('GET /next HTTP/1.1\r\nconnection: keep-alive\r\n\r\n');
    });

    it('while waiting for the head (the answer comes 50 ms later): onError once; the late answer is dropped and the connection serves the next request', async () => {
      const late = OK('answer to /a');
      const srv = await serve(async (peer) => {
        await peer.readRequest();
        await tick(50);
        await peer.write(late);
        await echoing()(peer);
      });
      const pool = client(srv.port);
      const rec = new Rec('waiting');
      pool.dispatch(get('/a'), rec, 'info');
      const dropped = received(pool.sockets[0]!, late.length);
      const peer = await srv.peer(0);
      await peer.waitFor(() => peer.all.length > 0);
      rec.abortFn!();
      rec.abortFn!(); // twice: still once
      await rec.done;
      expectError(rec, 'UND_ERR_ABORTED');
      expect(rec.events).toEqual(['connect', 'error UND_ERR_ABORTED']);
      expect(pool.size).toBe(0);
      await dropped;
      expect(rec.events).toEqual(['connect', 'error UND_ERR_ABORTED']);
      expectOk(await run(pool, get('/b')), 200, 'answer to /b');
      expect(srv.peers.length).toBe(1);
      expect(peer.isClosed).toBe(false);
    });

    it('from onHead: onError once, no onData; the rest of the response (a large body) is dropped and the connection serves the next request', async () => {
      const big = OK('z'.repeat(100_000));
      const srv = await serve(answering((req) => (req.requestLine === 'GET /a HTTP/1.1' ? big : OK(`answer to ${req.requestLine.split(' ')[1]}`))));
      const pool = client(srv.port);
      const rec = new Rec('head', { head: (r) => r.abortFn!() });
      pool.dispatch(get('/a'), rec, 'info');
      const dropped = received(pool.sockets[0]!, big.length);
      await rec.done;
      expectError(rec, 'UND_ERR_ABORTED');
      expect(rec.events).toEqual(['connect', 'head 200', 'error UND_ERR_ABORTED']);
      await dropped;
      expect(rec.events).toEqual(['connect', 'head 200', 'error UND_ERR_ABORTED']);
      expectOk(await run(pool, get('/b')), 200, 'answer to /b');
      expect(srv.peers.length).toBe(1);
      expect(pool.connects).toBe(1);
    });

    it('mid-body (a later piece follows): onError once, never onComplete; the rest is dropped and the connection serves the next request', async () => {
      const head = 'HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n';
      const srv = await serve(async (peer) => {
        await peer.readRequest();
        await peer.write(`${head}hello`);
        await tick(30);
        await peer.write('world');
        await echoing()(peer);
      });
      const pool = client(srv.port);
      const rec = new Rec('mid', { data: (_c, r) => r.abortFn!(new Error('stop')) });
      pool.dispatch(get('/a'), rec, 'info');
      const dropped = received(pool.sockets[0]!, `${head}helloworld`.length);
      await rec.done;
      expect(rec.violations).toEqual([]);
      expect(rec.error!.message).toBe('stop');
      expect(rec.events).toEqual(['connect', 'head 200', 'data', 'error stop']);
      expect(rec.body).toBe('hello');
      await dropped; // the rest of the body arrives nowhere
      expect(rec.events).toEqual(['connect', 'head 200', 'data', 'error stop']);
      expectOk(await run(pool, get('/b')), 200, 'answer to /b');
      expect(srv.peers.length).toBe(1);
    });

    it('mid-body in a chunked response (its rest and trailers in a later piece): onError once, never onComplete; the connection serves the next request', async () => {
      const first = 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n';
      const rest = '2\r\ncd\r\n0\r\nX-Trailer: t\r\n\r\n';
      const srv = await serve(async (peer) => {
        await peer.readRequest();
        await peer.write(first);
        await tick(10);
        await peer.write(rest);
        await echoing()(peer);
      });
      const pool = client(srv.port);
      const rec = new Rec('chunked', { data: (_c, r) => r.abortFn!() });
      pool.dispatch(get('/a'), rec, 'info');
      const dropped = received(pool.sockets[0]!, first.length + rest.length);
      await rec.done;
      expectError(rec, 'UND_ERR_ABORTED');
      expect(rec.events).toEqual(['connect', 'head 200', 'data', 'error UND_ERR_ABORTED']);
      await dropped;
      expect(rec.events).toEqual(['connect', 'head 200', 'data', 'error UND_ERR_ABORTED']);
      expectOk(await run(pool, get('/b')), 200, 'answer to /b');
      expect(srv.peers.length).toBe(1);
    });

    it('on the last piece of a Content-Length body: onError once, never onComplete, no exception; the connection serves the next request', async () => {
      const uncaught: unknown[] = [];
      const onUncaught = (err: unknown) => uncaught.push(err);
      process.on('uncaughtException', onUncaught);
      try {
        const srv = await serve(echoing());
        const pool = client(srv.port);
        const rec = new Rec('last piece', { data: (_c, r) => r.abortFn!() });
        pool.dispatch(get('/a'), rec, 'info');
        const dropped = received(pool.sockets[0]!, OK('answer to /a').length);
        await rec.done;
        expectError(rec, 'UND_ERR_ABORTED');
        expect(rec.events).toEqual(['connect', 'head 200', 'data', 'error UND_ERR_ABORTED']);
        await dropped;
        await tick(20); // time for a deferred exception to surface
        expect(rec.events).toEqual(['connect', 'head 200', 'data', 'error UND_ERR_ABORTED']);
        expectOk(await run(pool, get('/b')), 200, 'answer to /b');
        expect(srv.peers.length).toBe(1);
        expect(uncaught.map((e) => String(e))).toEqual([]);
      } finally {
        process.off('uncaughtException', onUncaught);
      }
    });

    it('while paused (onData returned false): the rest is read and dropped; a request queued meanwhile (connections: 1) runs on the same connection', async () => {
      const go = signal();
      const srv = await serve(async (peer) => {
        await peer.readRequest();
        await peer.write('HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello');
        await go.promise;
        await peer.write('world');
        await echoing()(peer);
      });
      const pool = client(srv.port, { connections: 1 });
      const rec = await abortedWhilePaused(pool, '/a');
      const next = new Rec('next');
      pool.dispatch(get('/b'), next, 'info');
      expect(next.events).toEqual([]); // queued behind the connection the response is dropped from
      go.fire();
      await next.done;
      expectOk(next, 200, 'answer to /b');
      expect(rec.events).toEqual(['connect', 'head 200', 'data', 'error UND_ERR_ABORTED']);
      expect(srv.peers.length).toBe(1);
    });

    it('while paused with more of a chunked response already read (several chunks in one segment): dropped too; the connection serves the next request at once', async () => {
      const chunked = 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\naaa\r\n3\r\nbbb\r\n3\r\nccc\r\n0\r\n\r\n';
      const srv = await serve(answering((req) => (req.requestLine === 'GET /a HTTP/1.1' ? chunked : OK(`answer to ${req.requestLine.split(' ')[1]}`))));
      const pool = client(srv.port, { connections: 1 });
      const rec = await abortedWhilePaused(pool, '/a');
      const t0 = performance.now();
      const next = await run(pool, get('/b'));
      const took = performance.now() - t0;
      expectOk(next, 200, 'answer to /b');
      expect(rec.events).toEqual(['connect', 'head 200', 'data', 'error UND_ERR_ABORTED']);
      // Not closed at DISCARD_MAX_MS (for want of the bytes it already had) with the next one waiting for it.
      expect({ connections: srv.peers.length, waitedForDeadline: took >= DISCARD_MAX_MS / 2 }).toEqual({ connections: 1, waitedForDeadline: false });
    });

    it('the rest of the response past DISCARD_MAX_BYTES: the connection closed at once; the next request on a new one', async () => {
      // One byte delivered, then one more than may be dropped.
      const { first, rec } = abortedAfterFirstByte('too much', 1 + DISCARD_MAX_BYTES + 1);
      const srv = await serve((peer) => (peer.index > 0 ? echoing()(peer) : first(peer)));
      const pool = client(srv.port);
      const t0 = performance.now();
      pool.dispatch(get('/a'), rec, 'info');
      await rec.done;
      expectError(rec, 'UND_ERR_ABORTED');
      await srv.peers[0]!.closed;
      expect(performance.now() - t0).toBeLessThan(DISCARD_MAX_MS / 2); // by the budget, not the deadline
      expect(rec.events).toEqual(['connect', 'head 200', 'data', 'error UND_ERR_ABORTED']);
      expectOk(await run(pool, get('/b')), 200, 'answer to /b');
      expect(srv.peers.length).toBe(2);
      expect(pool.connects).toBe(2);
    });

    it('exactly DISCARD_MAX_BYTES left to drop: read to the end, the connection kept for the request queued meanwhile (connections: 1)', async () => {
      // One byte delivered, then as much as may be dropped.
      const { first, rec } = abortedAfterFirstByte('just enough', 1 + DISCARD_MAX_BYTES, echoing());
      const srv = await serve(first);
      const pool = client(srv.port, { connections: 1 });
      const t0 = performance.now();
      pool.dispatch(get('/a'), rec, 'info');
      await rec.done;
      expectError(rec, 'UND_ERR_ABORTED');
      const next = await run(pool, get('/b'));
      expectOk(next, 200, 'answer to /b');
      expect(performance.now() - t0).toBeLessThan(DISCARD_MAX_MS / 2);
      expect(rec.events).toEqual(['connect', 'head 200', 'data', 'error UND_ERR_ABORTED']);
      expect(srv.peers.length).toBe(1);
      expect(srv.peers[0]!.isClosed).toBe(false);
    });

    it('the rest of the response not coming: the connection closed at DISCARD_MAX_MS; a request queued meanwhile (connections: 1) then runs on a new one', { timeout: 5000 }, async () => {
      const srv = await serve(async (peer) => {
        if (peer.index > 0) return echoing()(peer);
        await peer.readRequest();
        await peer.write('HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart');
        // The rest never comes.
      });
      const pool = client(srv.port, { connections: 1 });
      let abortedAt = 0;
      const rec = new Rec('stalled', {
        data: (_c, r) => {
          abortedAt = performance.now();
          r.abortFn!();
        },
      });
      pool.dispatch(get('/a'), rec, 'info');
      await rec.done;
      expectError(rec, 'UND_ERR_ABORTED');
      const peer = srv.peers[0]!;
      let closedAt = 0;
      const closed = peer.closed.then(() => (closedAt = performance.now()));
      let connectedAt = 0;
      const queued = new Rec('queued', { connect: () => (connectedAt = performance.now()) });
      pool.dispatch(get('/b'), queued, 'info');
      expect(queued.events).toEqual([]);
      expect(pool.size).toBe(1);
      await queued.done;
      await closed;
      expectOk(queued, 200, 'answer to /b');
      expect(connectedAt - abortedAt).toBeGreaterThanOrEqual(DISCARD_MAX_MS - 20);
      expect(connectedAt - abortedAt).toBeLessThan(DISCARD_MAX_MS + 1000);
      expect(closedAt - abortedAt).toBeGreaterThanOrEqual(DISCARD_MAX_MS - 20);
      expect(rec.events).toEqual(['connect', 'head 200', 'data', 'error UND_ERR_ABORTED']);
      expect(srv.peers.length).toBe(2);
      expect(pool.connects).toBe(2);
    });

    it('while a streamed request body is still being sent: onError once, the connection closed (not reused), the body no longer read', async () => {
      const srv = await serve(async (peer) => {
        if (peer.index > 0) return echoing()(peer);
        await peer.readRequest(true);
      });
      const pool = client(srv.port);
      const body = new Readable({ read() {} });
      body.push('start');
      const rec = new Rec('uploading');
      pool.dispatch({ method: 'POST', path: '/up', headers: [], body }, rec, 'info');
      const peer = await srv.peer(0);
      await peer.waitFor(() => peer.all.includes('start'));
      rec.abortFn!();
      await rec.done;
      expectError(rec, 'UND_ERR_ABORTED');
      expect(rec.events).toEqual(['connect', 'error UND_ERR_ABORTED']);
      await peer.closed;
      expect(body.listenerCount('data')).toBe(0);
      body.destroy();
      expectOk(await run(pool, get('/b')), 200, 'answer to /b');
      expect(srv.peers.length).toBe(2);
    });

    it('after a streamed request body was all sent: the response is dropped and the connection kept', async () => {
      const aborted = signal();
      const got = signal();
      const seen: Buffer[] = [];
      const srv = await serve(async (peer) => {
        const req = await peer.readRequest();
        seen.push(req!.body);
        got.fire();
        await aborted.promise;
        await peer.write(OK('answer to /up'));
        await echoing()(peer);
      });
      const pool = client(srv.port, { connections: 1 });
      const rec = new Rec('uploaded');
      pool.dispatch({ method: 'POST', path: '/up', headers: [], body: Readable.from([Buffer.from('ab'), Buffer.from('cd')]) }, rec, 'info');
      await got.promise;
      rec.abortFn!();
      aborted.fire();
      await rec.done;
      expectError(rec, 'UND_ERR_ABORTED');
      expect(rec.events).toEqual(['connect', 'error UND_ERR_ABORTED']);
      expectOk(await run(pool, get('/b')), 200, 'answer to /b');
      expect(seen.map((b) => b.toString())).toEqual(['abcd']);
      expect(srv.peers.length).toBe(1);
    });

    it('connections: 1, a request aborted and another dispatched at once, several times: never a second connection; each waits for the aborted response to be dropped', async () => {
      let open = 0;
      let maxOpen = 0;
      const log: string[] = [];
      const srv = await serve(async (peer) => {
        open++;
        maxOpen = Math.max(maxOpen, open);
        await answering(async (req) => {
          const path = req.requestLine.split(' ')[1]!;
          await tick(20);
          log.push(`answer ${path}`);
          return OK(`answer to ${path}`);
        })(peer);
        open--;
      });
      const pool = client(srv.port, { connections: 1 });
      for (let i = 0; i < 3; i++) {
        // Aborted while waiting for the head, from onHead, mid-body.
        const hooks: Hooks = i === 0 ? {} : i === 1 ? { head: (r) => r.abortFn!() } : { data: (_c, r) => r.abortFn!() };
        const a = new Rec(`a${i}`, hooks);
        const b = new Rec(`b${i}`, { connect: () => log.push(`start /b${i}`) });
        pool.dispatch(get(`/a${i}`), a, 'info');
        if (i === 0) {
          const peer = await srv.peer(0);
          await peer.waitFor(() => peer.all.includes('/a0 '));
          a.abortFn!();
        }
        await a.done;
        pool.dispatch(get(`/b${i}`), b, 'info');
        // Still waiting for the head: queued (from onHead and mid-body, the whole response may already be dropped).
        if (i === 0) expect(b.events).toEqual([]);
        await b.done;
        expectError(a, 'UND_ERR_ABORTED');
        expect(a.events.filter((e) => e === 'data' || e.startsWith('error'))).toEqual(i === 2 ? ['data', 'error UND_ERR_ABORTED'] : ['error UND_ERR_ABORTED']);
        expectOk(b, 200, `answer to /b${i}`);
      }
      expect(log).toEqual(['answer /a0', 'start /b0', 'answer /b0', 'answer /a1', 'start /b1', 'answer /b1', 'answer /a2', 'start /b2', 'answer /b2']);
      expect(srv.peers.length).toBe(1);
      expect(maxOpen).toBe(1);
      expect(pool.connects).toBe(1);
    });

    it('close() while an aborted request\'s response is being dropped: resolves at once and closes the connection', async () => {
      const srv = await serve(async (peer) => {
        await peer.readRequest();
        await peer.write('HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart');
      });
      const pool = client(srv.port);
      const rec = await run(pool, get('/a'), new Rec('dropped', { data: (_c, r) => r.abortFn!() }));
      expectError(rec, 'UND_ERR_ABORTED');
      await pool.close();
      await srv.peers[0]!.closed;
      expect(rec.events).toEqual(['connect', 'head 200', 'data', 'error UND_ERR_ABORTED']);
    });

    it('the abort function after onComplete does nothing', async () => {
      const srv = await serve(answering(OK('done')));
      const pool = client(srv.port);
      const rec = await run(pool, get());
      expectOk(rec, 200, 'done');
      rec.abortFn!();
      expect(rec.events).toEqual(['connect', 'head 200', 'data', 'complete']);
      expectOk(await run(pool, get()), 200, 'done');
      expect(srv.peers.length).toBe(1);
    });

    it('synchronously inside onConnect on a reused idle connection: its idle deadline (the upstream\'s Keep-Alive hint) is not extended', { timeout: 5000 }, async () => {
      const srv = await serve(answering((req) => OK(`answer to ${req.requestLine.split(' ')[1]}`, 'Keep-Alive: timeout=2\r\n')));
      const pool = client(srv.port, { keepAliveTimeout: 4000, keepAliveMaxTimeout: 600_000 });
      // Idle for the hint less the 1 s margin: dropped ~1 s after this response.
      expectOk(await run(pool, get('/first')), 200, 'answer to /first');
      const t0 = performance.now();
      let closedAt = 0;
      const closed = srv.peers[0]!.closed.then(() => (closedAt = performance.now()));
      await tick(200);
      const aborted = new Rec('aborted', { connect: (abort) => abort() });
      pool.dispatch(get('/aborted'), aborted, 'info');
      expectError(aborted, 'UND_ERR_ABORTED');
      expect(aborted.events).toEqual(['connect', 'error UND_ERR_ABORTED']);
      expect(pool.connects).toBe(1); // it took the idle connection
      await tick(1300);
      expectOk(await run(pool, get('/later')), 200, 'answer to /later');
      // Past the hint's deadline: a new connection, the first one closed at that deadline.
      expect(srv.peers.length).toBe(2);
      expect(pool.connects).toBe(2);
      await closed;
      expect(closedAt - t0).toBeGreaterThanOrEqual(900);
      expect(closedAt - t0).toBeLessThan(1500);
      expect(srv.peers[0]!.all.toString('latin1')).toBe('GET /first HTTP/1.1\r\nconnection: keep-alive\r\n\r\n');
    });

    it('synchronously inside onConnect on the only idle connection (connections: 1), its onError dispatching another request at once: that one is served on the same connection', async () => {
      const srv = await serve(echoing());
      const pool = client(srv.port, { connections: 1 });
      expectOk(await run(pool, get('/first')), 200, 'answer to /first');
      const b = new Rec('B');
      const a = new Rec('A', {
        connect: (abort) => abort(),
        error: () => void pool.dispatch(get('/b'), b, 'info'),
      });
      pool.dispatch(get('/a'), a, 'info');
      expectError(a, 'UND_ERR_ABORTED');
      expect(a.events).toEqual(['connect', 'error UND_ERR_ABORTED']);
      // Bounded: a B left in the queue would wait for ever.
      await Promise.race([b.done, tick(1000)]);
      expectOk(b, 200, 'answer to /b');
      expect(srv.peers.length).toBe(1);
      expect(pool.connects).toBe(1);
      expect(srv.peers[0]!.all.toString('latin1')).toBe('GET /first HTTP/1.1\r\nconnection: keep-alive\r\n\r\nGET /b HTTP/1.1\r\nconnection: keep-alive\r\n\r\n');
      expect(pool.size).toBe(0);
    });

    it('inside onData, the handler also returning false (connections: 1, the next request dispatched right after the abort): the rest is dropped and the next request runs on the same connection at once, not at DISCARD_MAX_MS', { timeout: 5000 }, async () => {
      const srv = await serve(async (peer) => {
        await peer.readRequest();
        await peer.write('HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello');
        await tick(100);
        await peer.write('world');
        await echoing()(peer);
      });
      const pool = client(srv.port, { connections: 1 });
      const next = new Rec('next');
      let abortedAt = 0;
      const rec = new Rec('abort and pause', {
        data: (_c, r) => {
          abortedAt = performance.now();
          r.abortFn!();
          pool.dispatch(get('/b'), next, 'info');
          return false;
        },
      });
      pool.dispatch(get('/a'), rec, 'info');
      await rec.done;
      expectError(rec, 'UND_ERR_ABORTED');
      expect(next.events).toEqual([]); // queued behind the connection the response is dropped from
      await next.done;
      const took = performance.now() - abortedAt;
      expectOk(next, 200, 'answer to /b');
      expect(rec.events).toEqual(['connect', 'head 200', 'data', 'error UND_ERR_ABORTED']);
      expect(rec.body).toBe('hello');
      expect({ connections: srv.peers.length, within1s: took < 1000 }).toEqual({ connections: 1, within1s: true });
      expect(took).toBeLessThan(DISCARD_MAX_MS / 2);
      expect(srv.peers[0]!.isClosed).toBe(false);
    });
  });

  describe('backpressure', () => {
    it('onData returning false pauses until resume(); then the rest arrives', async () => {
      let writeRest!: () => void;
      const restWanted = new Promise<void>((r) => (writeRest = r));
      const srv = await serve(async (peer) => {
        await peer.readRequest();
        await peer.write('HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nfirst');
        await restWanted;
        await peer.write('-second');
        await answering(OK('next'))(peer);
      });
      const pool = client(srv.port);
      const rec = new Rec('paused', {
        data: (_c, r) => {
          if (r.chunks.length === 1) {
            writeRest();
            return false;
          }
          return true;
        },
      });
      pool.dispatch(get(), rec, 'info');
      await restWanted;
      // The rest is written; give it time to arrive, were it read.
      await tick(100);
      expect(rec.events).toEqual(['connect', 'head 200', 'data']);
      expect(rec.body).toBe('first');
      rec.resume();
      await rec.done;
      expectOk(rec, 200, 'first-second');
      expectOk(await run(pool, get()), 200, 'next');
      expect(srv.peers.length).toBe(1);
    });

    it('a large body, paused on every piece and resumed later each time, arrives whole', async () => {
      const big = Buffer.alloc(2_000_000);
      for (let i = 0; i < big.length; i++) big[i] = (i * 7) % 256;
      const srv = await serve(async (peer) => {
        await peer.readRequest();
        await peer.write(Buffer.concat([Buffer.from(`HTTP/1.1 200 OK\r\nContent-Length: ${big.length}\r\n\r\n`), big]));
      });
      const pool = client(srv.port);
      const rec = new Rec('slow reader', {
        data: (_c, r) => {
          setImmediate(() => r.resume());
          return false;
        },
      });
      await run(pool, get(), rec);
      expect(rec.violations).toEqual([]);
      expect(rec.state).toBe('complete');
      expect(Buffer.concat(rec.chunks).equals(big)).toBe(true);
    });

    it('chunked: several chunks in one segment, onData returning false on the first: no more onData until resume()', async () => {
      const srv = await serve(answering('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\naaa\r\n3\r\nbbb\r\n3\r\nccc\r\n0\r\n\r\n'));
      const pool = client(srv.port);
      const rec = new Rec('chunked pause', { data: (_c, r) => (r.chunks.length === 1 ? false : true) });
      pool.dispatch(get(), rec, 'info');
      const peer = await srv.peer(0);
      await peer.waitFor(() => peer.all.length > 0);
      await tick(100);
      const beforeResume = [...rec.events];
      if (rec.state === 'head') rec.resume();
      await rec.done;
      // Taken here so that afterEach does not report this test's failure a second time.
      const violations = rec.violations.splice(0);
      expect(beforeResume).toEqual(['connect', 'head 200', 'data']);
      expect(violations).toEqual([]);
      expect(rec.state).toBe('complete');
      expect(rec.body).toBe('aaabbbccc');
    });

    it('the stream ending while paused (a whole chunked response and the FIN in one write): resume() delivers the rest, then onComplete (not an error)', async () => {
      const srv = await serve(async (peer) => {
        await peer.readRequest();
        peer.end('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n');
      });
      const pool = client(srv.port);
      let ended = false;
      let endedBeforeResume: boolean | null = null;
      const rec = new Rec('paused at the end', {
        data: (_c, r) => {
          if (r.chunks.length > 1) return true;
          setTimeout(() => {
            endedBeforeResume = ended;
            r.resume();
          }, 100);
          return false;
        },
      });
      pool.dispatch(get(), rec, 'info');
      pool.sockets[0]!.on('end', () => (ended = true));
      await rec.done;
      expect(rec.events).toEqual(['connect', 'head 200', 'data', 'data', 'complete']);
      expectOk(rec, 200, 'helloworld');
      expect(rec.chunks.map((c) => c.toString('latin1'))).toEqual(['hello', 'world']);
      // The case under test: the FIN was read while the handler had paused.
      expect(endedBeforeResume).toBe(true);
      expect(pool.size).toBe(0);
      await srv.peers[0]!.closed;
    });
  });

  describe('connect', () => {
    it('connect throwing: onError with that same error, and the pool keeps working', async () => {
      const srv = await serve(answering(OK('works')));
      const boom = Object.assign(new Error('no stream'), { code: 'STREAM_CAP' });
      let fail = true;
      const infos: string[] = [];
      const pool = new TunnelClient<string>({
        connections: 1,
        headersTimeout: 5000,
        keepAliveTimeout: 4000,
        keepAliveMaxTimeout: 600_000,
        connect: (info) => {
          infos.push(info);
          if (fail) throw boom;
          return net.connect(srv.port, '127.0.0.1');
        },
      });
      pools.push(pool);
      const rec = new Rec('throws');
      pool.dispatch(get(), rec, 'first');
      expect(rec.error).toBe(boom);
      expect(rec.events).toEqual(['error STREAM_CAP']);
      expect(pool.size).toBe(0);
      // With connections: 1, a queued request behind a failing connect still runs.
      fail = false;
      const ok1 = new Rec('ok1');
      const ok2 = new Rec('ok2');
      pool.dispatch(get(), ok1, 'second');
      pool.dispatch(get(), ok2, 'third');
      await Promise.all([ok1.done, ok2.done]);
      expectOk(ok1, 200, 'works');
      expectOk(ok2, 200, 'works');
      // The info of the request that needed the connection.
      expect(infos).toEqual(['first', 'second']);
    });

    it('connect starting to throw under a long queue (connections: 1, 5000 queued behind a request answered with Connection: close): each queued one fails once with that error, no stack overflow, and the pool recovers', { timeout: 10_000 }, async () => {
      const uncaught: unknown[] = [];
      const onUncaught = (err: unknown) => uncaught.push(err);
      process.on('uncaughtException', onUncaught);
      try {
        const release = signal();
        const srv = await serve(
          answering(async (req) => {
            const path = req.requestLine.split(' ')[1]!;
            if (path === '/held') {
              await release.promise;
              return OK('held', 'Connection: close\r\n');
            }
            return OK(`answer to ${path}`);
          }),
        );
        const closedSession = Object.assign(new Error('session closed'), { code: 'SESSION_CLOSED' });
        let refusing = false;
        let attempts = 0;
        const pool = new TunnelClient<string>({
          connections: 1,
          headersTimeout: 5000,
          keepAliveTimeout: 4000,
          keepAliveMaxTimeout: 600_000,
          connect: () => {
            attempts++;
            if (refusing) throw closedSession;
            return net.connect(srv.port, '127.0.0.1');
          },
        });
        pools.push(pool);
        const held = new Rec('held');
        pool.dispatch(get('/held'), held, 'info');
        const peer = await srv.peer(0);
        await peer.waitFor(() => peer.all.includes('/held '));
        const N = 5000;
        const queued: Rec[] = [];
        for (let i = 0; i < N; i++) {
          const rec = new Rec(`q${i}`);
          queued.push(rec);
          pool.dispatch(get(`/q${i}`), rec, 'info');
        }
        expect(pool.size).toBe(N + 1);
        expect(queued.every((r) => r.events.length === 0)).toBe(true);
        // The session closes: no new stream; the held request's stream closes after its answer.
        refusing = true;
        release.fire();
        // Bounded: were the queue's failures cut short (a stack overflow), this would wait for ever.
        await Promise.race([Promise.all([held.done, ...queued.map((r) => r.done)]), tick(3000)]);
        expect({ uncaught: uncaught.map((e) => String(e)), held: held.state }).toEqual({ uncaught: [], held: 'complete' });
        expectOk(held, 200, 'held');
        const outcome = { failedWithIt: 0, other: [] as string[] };
        queued.forEach((r, i) => {
          if (r.events.length === 1 && r.error === closedSession && r.violations.length === 0) outcome.failedWithIt++;
          else if (outcome.other.length < 5) outcome.other.push(`q${i}: ${JSON.stringify(r.events)}`);
        });
        expect(outcome).toEqual({ failedWithIt: N, other: [] });
        expect(attempts).toBe(1 + N);
        expect(pool.size).toBe(0);
        await peer.closed;
        // The session back: a new request is served, on a new stream.
        refusing = false;
        expectOk(await run(pool, get('/after')), 200, 'answer to /after');
        expect(srv.peers.length).toBe(2);
        expect(pool.size).toBe(0);
        await tick(20); // time for a deferred exception to surface
        expect(uncaught.map((e) => String(e))).toEqual([]);
      } finally {
        process.off('uncaughtException', onUncaught);
      }
    });
  });
});
