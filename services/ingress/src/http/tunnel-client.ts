import type { Duplex, Readable } from 'node:stream';

/**
 * The HTTP/1.1 client of a tunnel's proxy streams: keep-alive connections (one proxy stream each,
 * one request at a time), a queue past `connections`, the request head written as one string and
 * the response parsed in place. It replaces undici's Pool on the agent link, where undici cost
 * ~16 µs of CPU per request more than this (its dispatcher layers, a WebAssembly llhttp fed
 * through copies, a timer wheel), a quarter of the ingress's whole cost per proxied request.
 *
 * What it does is what undici did there, and its errors carry undici's codes (`UND_ERR_*`), so
 * `forwardErrorOf` maps them as before:
 * - the request: method, target and headers checked as undici checks them (`UND_ERR_INVALID_ARG`);
 *   `Content-Length` written by the client itself (a Buffer body's length, a streamed body's
 *   declared length, else `Transfer-Encoding: chunked`; `Content-Length: 0` on an empty
 *   POST/PUT/PATCH); `Connection: keep-alive`;
 * - the response (RFC 9112 §6.3): no body for HEAD, 1xx, 204 and 304; chunked (trailers read
 *   and dropped); a `Content-Length`; else until the stream ends, the connection then not reused.
 *   1xx informational heads are skipped; `Transfer-Encoding` with `Content-Length`, differing
 *   `Content-Length`s, a malformed head or chunk, and a head past `maxHeaderSize` are errors
 *   (request smuggling and resource defences, as llhttp's);
 * - reuse: HTTP/1.1 without `Connection: close` (HTTP/1.0 with `keep-alive`), not after a HEAD,
 *   the request's body all sent and no stray bytes after the response; idle for the upstream's `Keep-Alive: timeout`
 *   less a second (else `keepAliveTimeout`, at most `keepAliveMaxTimeout`);
 * - `headersTimeout`: the response head must start (be complete) within it, else
 *   `UND_ERR_HEADERS_TIMEOUT` and the stream is closed; a body may take as long as it likes;
 * - an aborted request (its client went away) whose body was all sent keeps its stream: the
 *   rest of the response is read and dropped (up to {@link DISCARD_MAX_BYTES}, for up to
 *   {@link DISCARD_MAX_MS}), then the stream serves the next request. A proxy stream closed
 *   holds its slot of the agent session (and of its client's share) for a while after, so
 *   closing one per abandoned request made a client that drops and reopens its connections
 *   (a browser navigating away, a load generator between runs) meet its share's 429s;
 * - `close()` finishes what runs and is queued, then closes; `destroy(err)` fails it all at once.
 */
export interface TunnelRequest {
  method: string;
  /** The request target (origin form). */
  path: string;
  /** Flat [name, value, …] as the client sent them (hop-by-hop headers already dropped). */
  headers: string[];
  body: Buffer | Readable | null;
}

export interface TunnelHandler {
  /** The request has a connection and its head is about to be written; `abort` stops it (onError follows). */
  onConnect(abort: (err?: Error) => void): void;
  /** The final response head (1xx skipped). `headers` flat, as received (latin1). */
  onHead(status: number, headers: string[], resume: () => void, statusText: string): void;
  /** A piece of the (decoded) body; false asks the stream to pause until `resume`. */
  onData(chunk: Buffer): boolean;
  onComplete(): void;
  /** Once, instead of onComplete; before or after onHead. */
  onError(err: Error): void;
}

export interface TunnelClientOptions<I> {
  /** Opens a connection (a proxy stream) for a request whose info is `info`; throws when it cannot. */
  connect: (info: I) => Duplex;
  connections: number;
  headersTimeout: number;
  keepAliveTimeout: number;
  keepAliveMaxTimeout: number;
  /** Largest response head, bytes (Node's default `--max-http-header-size`). */
  maxHeaderSize?: number;
}

type CodedError = Error & { code: string };
function coded(code: string, message: string): CodedError {
  return Object.assign(new Error(message), { code });
}

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
/** What a header value may hold (undici's check): HTAB, visible ASCII, SP, obs-text. */
const BAD_VALUE = /[^\t\x20-\x7e\x80-\xff]/;
/** What a request target may not hold (undici's check). */
const BAD_PATH = /[^\u0021-\u00ff]/;
const CRLF2 = Buffer.from('\r\n\r\n');
const NOOP = (): void => {};
const DEFAULT_MAX_HEADER_SIZE = 16 * 1024;
/** Less than the upstream's Keep-Alive timeout hint, so a connection is not reused as it closes it. */
const KEEP_ALIVE_THRESHOLD_MS = 1000;
/** Longest chunk-size line (hex digits and extensions) accepted. */
const MAX_CHUNK_LINE = 4096;
/** Most of an aborted request's response read and dropped to keep its stream (bytes). */
export const DISCARD_MAX_BYTES = 256 * 1024;
/** Longest wait for the rest of an aborted request's response before its stream is closed (ms). */
export const DISCARD_MAX_MS = 2_000;

const enum Phase {
  /** No request on it. */
  Idle,
  /** Waiting for (more of) the response head. */
  Head,
  /** Content-Length body: `remaining` bytes left. */
  Length,
  /** Chunked body: reading a chunk-size line. */
  ChunkSize,
  /** Chunked body: `remaining` bytes of chunk data left. */
  ChunkData,
  /** Chunked body: the CRLF after a chunk's data. */
  ChunkEnd,
  /** Chunked body: trailer lines until an empty one. */
  Trailers,
  /** Until the stream ends. */
  UntilClose,
}

interface Exchange<I> {
  req: TunnelRequest;
  handler: TunnelHandler;
  info: I;
  /**
   * Over for its handler: completed, failed or aborted. An aborted one may still be on its
   * connection (`conn.x`), whose response is being read and dropped.
   */
  done: boolean;
  conn: Conn<I> | null;
  /** The request body is all written (or there is none). */
  bodySent: boolean;
  /** Ends the streaming of a Readable body (listeners off). */
  stopBody: (() => void) | null;
  /** The request asked for `Connection: close`. */
  close: boolean;
  /** Out of the queue ({@link TunnelClient.start} took it): cancelling does nothing any more. */
  started: boolean;
}

/** Parsed `Content-Length` of a request's headers, or -1; `headers` without it. */
function splitLength(headers: string[]): { headers: string[]; length: number; close: boolean } | CodedError {
  let length = -1;
  let close = false;
  let out: string[] | null = null;
  for (let i = 0; i < headers.length; i += 2) {
    const name = headers[i]!;
    const value = headers[i + 1]!;
    if (typeof name !== 'string' || typeof value !== 'string' || !TOKEN.test(name)) return coded('UND_ERR_INVALID_ARG', `invalid header name ${JSON.stringify(String(name))}`);
    if (BAD_VALUE.test(value)) return coded('UND_ERR_INVALID_ARG', `invalid ${name} header`);
    const n = name.length;
    // content-length, transfer-encoding, connection and keep-alive, upgrade, expect
    if (n === 14 || n === 17 || n === 10 || n === 7 || n === 6) {
      const lower = name.toLowerCase();
      if (lower === 'content-length') {
        if (!/^\d+$/.test(value)) return coded('UND_ERR_INVALID_ARG', 'invalid content-length header');
        length = Number(value);
        out ??= headers.slice(0, i);
        continue;
      }
      if (lower === 'transfer-encoding' || lower === 'keep-alive' || lower === 'upgrade' || lower === 'expect') return coded('UND_ERR_INVALID_ARG', `invalid ${lower} header`);
      if (lower === 'connection') {
        const v = value.toLowerCase();
        if (v !== 'close' && v !== 'keep-alive') return coded('UND_ERR_INVALID_ARG', 'invalid connection header');
        if (v === 'close') close = true;
        out ??= headers.slice(0, i);
        continue;
      }
    }
    if (out !== null) out.push(name, value);
  }
  return { headers: out ?? headers, length, close };
}

/** A keep-alive connection: one proxy stream. */
class Conn<I> {
  x: Exchange<I> | null = null;
  phase = Phase.Idle;
  /** Bytes of a head or chunk line not complete yet. */
  pending: Buffer | null = null;
  remaining = 0;
  reusable = true;
  /** The response is a HEAD's (no body whatever it says). */
  noBody = false;
  closed = false;
  paused = false;
  /** Bytes of the current chunk not delivered yet: the handler asked to pause. */
  private held: Buffer | null = null;
  /** The stream ended (or closed) while `held` waited: that end is read after them. */
  private endHeld: Error | null = null;
  /** Reading an aborted request's response to drop it: bytes it may still take, and its deadline. */
  private discardLeft = 0;
  private discardTimer: NodeJS.Timeout | null = null;
  /** How long it may stay idle after the current response: its Keep-Alive hint, else keepAliveTimeout. */
  idleMs = 0;
  private headTimer: NodeJS.Timeout | null = null;
  private idleTimer: NodeJS.Timeout | null = null;
  /** The duration `idleTimer` was made with (a timer's `refresh` keeps it). */
  private idleTimerMs = 0;
  readonly resume = (): void => {
    if (!this.paused) return;
    this.paused = false;
    const held = this.held;
    this.held = null;
    if (held !== null) this.onData(held);
    if (this.paused) return;
    if (this.endHeld !== null) {
      const end = this.endHeld;
      this.endHeld = null;
      this.fail(end);
    } else if (!this.closed) this.stream.resume();
  };

  constructor(
    readonly stream: Duplex,
    private readonly client: TunnelClient<I>,
  ) {
    stream.on('data', (chunk: Buffer) => this.onData(chunk));
    stream.on('end', () => this.ended(coded('UND_ERR_SOCKET', 'other side closed')));
    stream.on('error', (err: Error) => this.fail(err));
    stream.on('close', () => this.ended(coded('UND_ERR_SOCKET', 'other side closed')));
  }

  /** Starts `x` on this connection. */
  run(x: Exchange<I>, head: string, body: Buffer | null): void {
    this.x = x;
    x.conn = this;
    this.phase = Phase.Head;
    this.pending = null;
    this.noBody = x.req.method === 'HEAD';
    const ms = this.client.opts.headersTimeout;
    if (ms > 0) {
      // One timer per connection, re-armed per request: it fires at least `ms` after this
      // request was written, and only counts if the head is still awaited then.
      if (this.headTimer === null) this.headTimer = setTimeout(() => this.headTimedOut(), ms).unref();
      else this.headTimer.refresh();
    }
    if (body === null) this.stream.write(head, 'latin1');
    else if (body.length <= 16 * 1024) this.stream.write(Buffer.concat([Buffer.from(head, 'latin1'), body]));
    else {
      this.stream.write(head, 'latin1');
      this.stream.write(body);
    }
  }

  private headTimedOut(): void {
    if (this.phase === Phase.Head && this.x !== null) this.fail(coded('UND_ERR_HEADERS_TIMEOUT', 'Headers Timeout Error'));
  }

  /** Idle, for up to `ms`. */
  idle(ms: number): void {
    this.phase = Phase.Idle;
    this.x = null;
    if (this.idleTimer === null || this.idleTimerMs !== ms) {
      if (this.idleTimer !== null) clearTimeout(this.idleTimer);
      this.idleTimer = setTimeout(() => this.idleTimedOut(), ms).unref();
      this.idleTimerMs = ms;
    } else this.idleTimer.refresh();
  }

  private idleTimedOut(): void {
    if (this.phase === Phase.Idle && this.x === null) this.destroy();
  }

  /**
   * The request on it was aborted with its body all sent: the rest of its response is read and
   * dropped, then the connection is reused; too much of it, or too late, closes it.
   */
  discard(): void {
    this.discardLeft = DISCARD_MAX_BYTES;
    this.discardTimer = setTimeout(() => {
      this.discardTimer = null;
      if (this.x !== null && this.x.done) this.fail(coded('UND_ERR_ABORTED', 'Request aborted'));
    }, DISCARD_MAX_MS).unref();
    // What the handler had paused on is read (to be dropped) first: it may end the response.
    if (this.paused) this.resume();
  }

  destroy(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.headTimer !== null) clearTimeout(this.headTimer);
    if (this.idleTimer !== null) clearTimeout(this.idleTimer);
    if (this.discardTimer !== null) clearTimeout(this.discardTimer);
    this.client.dropped(this);
    this.stream.destroy();
  }

  /** The connection failed or ended under its request (or while idle). */
  fail(err: Error): void {
    const x = this.x;
    if (x !== null && this.phase === Phase.UntilClose && (err as CodedError).code === 'UND_ERR_SOCKET') {
      // The response's body ran until the stream ended: it is complete.
      this.complete();
      return;
    }
    this.x = null;
    this.destroy();
    if (x !== null) this.client.failed(x, err);
  }

  /**
   * The stream ended or closed. Bytes the handler paused on come first (a net.Socket emits 'end'
   * while paused when its own buffer is empty): the end is read after them, on resume.
   */
  private ended(err: Error): void {
    if (this.held !== null && this.x !== null) {
      this.endHeld ??= err;
      return;
    }
    this.fail(err);
  }

  private onData(chunk: Buffer): void {
    const x = this.x;
    if (x === null) {
      // Bytes with no request waiting for them: the connection cannot be trusted any more.
      if (!this.closed) this.destroy();
      return;
    }
    let buf = chunk;
    let at = 0;
    while (at < buf.length && this.x === x) {
      if (this.paused) {
        // The handler asked to pause: the rest waits for `resume`.
        this.held = buf.subarray(at);
        return;
      }
      switch (this.phase) {
        case Phase.Head: {
          if (this.pending !== null) {
            buf = Buffer.concat([this.pending, buf.subarray(at)]);
            at = 0;
            this.pending = null;
          }
          const end = buf.indexOf(CRLF2, at);
          if (end < 0) {
            if (buf.length - at > (this.client.opts.maxHeaderSize ?? DEFAULT_MAX_HEADER_SIZE)) return void this.protocolError('UND_ERR_HEADERS_OVERFLOW', 'Headers Overflow Error');
            this.pending = buf.subarray(at);
            return;
          }
          if (end - at > (this.client.opts.maxHeaderSize ?? DEFAULT_MAX_HEADER_SIZE)) return void this.protocolError('UND_ERR_HEADERS_OVERFLOW', 'Headers Overflow Error');
          const head = buf.toString('latin1', at, end);
          at = end + 4;
          if (!this.onHeadBytes(head, x, at < buf.length)) return;
          break;
        }
        case Phase.Length: {
          const n = Math.min(this.remaining, buf.length - at);
          const piece = at === 0 && n === buf.length ? buf : buf.subarray(at, at + n);
          at += n;
          this.remaining -= n;
          this.data(x, piece);
          if (this.x !== x) return; // aborted (and closed) meanwhile
          if (this.remaining === 0) {
            if (at < buf.length) this.reusable = false; // stray bytes after the response
            this.complete();
            return;
          }
          break;
        }
        case Phase.UntilClose: {
          this.data(x, at === 0 ? buf : buf.subarray(at));
          return;
        }
        case Phase.ChunkData: {
          const n = Math.min(this.remaining, buf.length - at);
          const piece = buf.subarray(at, at + n);
          at += n;
          this.remaining -= n;
          if (this.remaining === 0) this.phase = Phase.ChunkEnd;
          this.data(x, piece);
          break;
        }
        default: {
          // A line: chunk size, the CRLF after a chunk, or a trailer.
          if (this.pending !== null) {
            buf = Buffer.concat([this.pending, buf.subarray(at)]);
            at = 0;
            this.pending = null;
          }
          const nl = buf.indexOf(10, at);
          if (nl < 0) {
            if (buf.length - at > MAX_CHUNK_LINE) return void this.protocolError('HPE_INVALID_CHUNK_SIZE', 'Invalid character in chunk size');
            this.pending = buf.subarray(at);
            return;
          }
          // CRLF, as llhttp wants it: a bare LF is an error.
          if (nl === at || buf[nl - 1] !== 13) return void this.protocolError('HPE_STRICT', 'Missing expected CR before LF');
          const line = buf.toString('latin1', at, nl - 1);
          at = nl + 1;
          if (!this.onLine(line, at < buf.length)) return;
        }
      }
    }
  }

  /** A line of a chunked body; false when the exchange ended on it. */
  private onLine(line: string, more: boolean): boolean {
    if (this.phase === Phase.ChunkEnd) {
      if (line !== '') return this.protocolError('HPE_STRICT', 'Expected CRLF after chunk');
      this.phase = Phase.ChunkSize;
      return true;
    }
    if (this.phase === Phase.Trailers) {
      if (line === '') {
        if (more) this.reusable = false; // stray bytes after the response
        this.complete();
        return false;
      }
      return true;
    }
    const semi = line.indexOf(';');
    const hex = (semi < 0 ? line : line.slice(0, semi)).trimEnd();
    if (!/^[0-9a-fA-F]{1,12}$/.test(hex)) return this.protocolError('HPE_INVALID_CHUNK_SIZE', 'Invalid character in chunk size');
    const size = parseInt(hex, 16);
    if (size === 0) this.phase = Phase.Trailers;
    else {
      this.remaining = size;
      this.phase = Phase.ChunkData;
    }
    return true;
  }

  private protocolError(code: string, message: string): false {
    this.fail(coded(code, message));
    return false;
  }

  /** A complete head (`more`: bytes follow it in the chunk); false when the exchange ended on it (or failed). */
  private onHeadBytes(head: string, x: Exchange<I>, more: boolean): boolean {
    const lines = head.split('\r\n');
    const status = lines[0]!;
    // HTTP/1.x SP 3DIGIT [SP reason]
    if (status.length < 12 || !status.startsWith('HTTP/1.') || status[8] !== ' ' || (status.length > 12 && status[12] !== ' ')) return this.protocolError('HPE_INVALID_CONSTANT', 'Invalid response status line');
    const d0 = status.charCodeAt(9) - 48;
    const d1 = status.charCodeAt(10) - 48;
    const d2 = status.charCodeAt(11) - 48;
    const minor = status[7];
    // Three digits, nothing else (`Number` would also take `2e2`), the first 1-9.
    if (!(d0 >= 1 && d0 <= 9 && d1 >= 0 && d1 <= 9 && d2 >= 0 && d2 <= 9) || (minor !== '0' && minor !== '1')) return this.protocolError('HPE_INVALID_STATUS', 'Invalid response status');
    const code = d0 * 100 + d1 * 10 + d2;
    const reason = status.length > 13 ? status.slice(13) : '';
    // A bare CR or LF in it (another line hidden in the status line) is an error, as llhttp makes
    // it; other control characters pass, as llhttp lets them (Node then refuses to write them: 502).
    if (/[\r\n]/.test(reason)) return this.protocolError('HPE_INVALID_STATUS', 'Invalid response status');
    const headers: string[] = [];
    let length = -1;
    let chunked = false;
    let teSeen = false;
    let close = minor === '0';
    let keepAliveHint = -1;
    for (let i = 1; i < lines.length; i++) {
      const l = lines[i]!;
      const c = l.indexOf(':');
      if (c <= 0) return this.protocolError('HPE_INVALID_HEADER_TOKEN', 'Invalid header token');
      const name = l.slice(0, c);
      if (!TOKEN.test(name)) return this.protocolError('HPE_INVALID_HEADER_TOKEN', 'Invalid header token');
      let s = c + 1;
      let e = l.length;
      while (s < e && (l.charCodeAt(s) === 32 || l.charCodeAt(s) === 9)) s++;
      while (e > s && (l.charCodeAt(e - 1) === 32 || l.charCodeAt(e - 1) === 9)) e--;
      const value = s === c + 1 && e === l.length ? l.slice(s) : l.slice(s, e);
      // A bare CR or LF (an injected header line), NUL or another control character: refused, as llhttp does.
      if (BAD_VALUE.test(value)) return this.protocolError('HPE_INVALID_HEADER_TOKEN', 'Invalid header value char');
      const n = name.length;
      if (n === 14 || n === 17 || n === 10) {
        const lower = name.toLowerCase();
        if (lower === 'content-length') {
          if (!/^\d{1,15}$/.test(value) || (length >= 0 && Number(value) !== length)) return this.protocolError('HPE_UNEXPECTED_CONTENT_LENGTH', 'Invalid Content-Length');
          length = Number(value);
        } else if (lower === 'transfer-encoding') {
          teSeen = true;
          const codings = value.toLowerCase().split(',');
          chunked = codings[codings.length - 1]!.trim() === 'chunked';
        } else if (lower === 'connection') {
          const v = value.toLowerCase();
          if (minor === '0') close = !/(^|,)\s*keep-alive\s*(,|$)/.test(v);
          else if (/(^|,)\s*close\s*(,|$)/.test(v)) close = true;
        } else if (lower === 'keep-alive') {
          const m = /timeout\s*=\s*(\d+)/i.exec(value);
          if (m) keepAliveHint = Number(m[1]) * 1000;
        }
      }
      headers.push(name, value);
    }
    if (code < 200) {
      // 101 to a request that asked for no upgrade: nothing can follow it on this connection.
      if (code === 101) return this.protocolError('UND_ERR_SOCKET', 'unexpected 101 Switching Protocols');
      return true; // informational: the final head follows
    }
    if (teSeen && length >= 0) return this.protocolError('HPE_UNEXPECTED_CONTENT_LENGTH', 'Content-Length can\'t be present with Transfer-Encoding');
    // After a HEAD the stream is not reused (as undici does): an upstream that sends a body anyway
    // would otherwise have it read as the next request's answer, which it could craft.
    if (close || x.close || this.noBody) this.reusable = false;
    if (keepAliveHint >= 0) {
      const ms = Math.min(keepAliveHint - KEEP_ALIVE_THRESHOLD_MS, this.client.opts.keepAliveMaxTimeout);
      if (ms <= 0) this.reusable = false;
      else this.idleMs = ms;
    } else this.idleMs = this.client.opts.keepAliveTimeout;
    let next: Phase;
    if (this.noBody || code === 204 || code === 304) next = Phase.Idle;
    else if (teSeen) {
      if (chunked) next = Phase.ChunkSize;
      else {
        next = Phase.UntilClose;
        this.reusable = false;
      }
    } else if (length >= 0) {
      next = length === 0 ? Phase.Idle : Phase.Length;
      this.remaining = length;
    } else {
      next = Phase.UntilClose;
      this.reusable = false;
    }
    this.phase = next;
    // (An aborted request's response is read only to be dropped.)
    if (!x.done) x.handler.onHead(code, headers, this.resume, reason);
    if (this.x !== x) return false; // aborted from onHead, and the connection closed
    if (next === Phase.Idle) {
      if (more) this.reusable = false; // stray bytes after the response
      this.complete();
      return false;
    }
    return true;
  }

  private data(x: Exchange<I>, chunk: Buffer): void {
    if (x.done) {
      // An aborted request's response, dropped: within limits, else the stream is closed.
      this.discardLeft -= chunk.length;
      if (this.discardLeft < 0) this.fail(coded('UND_ERR_ABORTED', 'Request aborted'));
      return;
    }
    if (!x.handler.onData(chunk) && !this.paused && this.x === x && !x.done) {
      this.paused = true;
      this.stream.pause();
    }
  }

  /** The response is over. */
  private complete(): void {
    const x = this.x!;
    this.x = null;
    this.pending = null;
    this.held = null;
    if (this.discardTimer !== null) {
      clearTimeout(this.discardTimer);
      this.discardTimer = null;
    }
    if (this.paused) {
      this.paused = false;
      this.stream.resume();
    }
    // The stream ended behind the bytes just read: not for another request.
    if (this.endHeld !== null) this.reusable = false;
    if (!x.bodySent) {
      // Answered before the request's body was all sent (an app refusing an upload early): the
      // rest is not sent, and the stream, in the middle of a request, is not reused.
      x.stopBody?.();
      this.reusable = false;
    }
    this.client.completed(x, this);
  }
}

/** A tunnel's pool of proxy streams. `I`: what a new stream is opened for (the request's client). */
export class TunnelClient<I> {
  private readonly idleConns: Conn<I>[] = [];
  private readonly conns = new Set<Conn<I>>();
  private readonly queue: Exchange<I>[] = [];
  private queueHead = 0;
  /** Entries of `queue` past `queueHead` still waiting (not cancelled). */
  private queued = 0;
  /** Requests running on a connection. */
  private running = 0;
  /** {@link next} is running: a call from within it only asks for another pass (no recursion). */
  private pumping = false;
  private pumpAgain = false;
  private closing = false;
  private destroyed = false;
  private closedResolve: (() => void) | null = null;
  private closedPromise: Promise<void> | null = null;

  constructor(readonly opts: TunnelClientOptions<I>) {}

  /** Requests running or queued. */
  get size(): number {
    return this.running + this.queued;
  }

  /**
   * Sends `req`; `handler` hears how it goes. Returns a cancel function for a request still
   * waiting in the queue (its client went away): it leaves the queue at once, hearing nothing
   * more; once the request has a connection, cancelling does nothing (use onConnect's abort).
   */
  dispatch(req: TunnelRequest, handler: TunnelHandler, info: I): () => void {
    const x: Exchange<I> = { req, handler, info, done: false, conn: null, bodySent: true, stopBody: null, close: false, started: false };
    if (this.destroyed || this.closing) {
      x.done = true;
      handler.onError(coded(this.destroyed ? 'UND_ERR_DESTROYED' : 'UND_ERR_CLOSED', this.destroyed ? 'The client is destroyed' : 'The client is closed'));
      return NOOP;
    }
    // Behind those already waiting; else on an idle connection, or a new one while there is room.
    if (this.queued > 0 || (this.idleConns.length === 0 && this.conns.size >= this.opts.connections)) {
      this.queue.push(x);
      this.queued++;
      // A pass in case there is room after all (a connection freed by a handler's own call).
      this.next();
      return () => this.cancel(x);
    }
    this.start(x);
    return NOOP;
  }

  /** Takes a request that is still queued out of the queue (see {@link dispatch}). */
  private cancel(x: Exchange<I>): void {
    if (x.done || x.started) return;
    x.done = true;
    this.queued--;
    // Many cancelled entries ahead of a stuck head: drop them rather than keep them until it moves.
    const waiting = this.queue.length - this.queueHead;
    if (waiting > 64 && this.queued * 2 < waiting) {
      const live = this.queue.slice(this.queueHead).filter((q) => !q.done);
      this.queue.length = 0;
      this.queue.push(...live);
      this.queueHead = 0;
    }
    if (this.closing && this.size === 0) this.finishClose();
  }

  /** Runs `x` on an idle connection, else a new one. */
  private start(x: Exchange<I>): void {
    x.started = true;
    const req = x.req;
    // The request's head, checked as undici checks it.
    if (!TOKEN.test(req.method)) return this.refuse(x, coded('UND_ERR_INVALID_ARG', 'invalid request method'));
    if (req.path.length === 0 || BAD_PATH.test(req.path)) return this.refuse(x, coded('UND_ERR_INVALID_ARG', 'invalid request path'));
    const split = splitLength(req.headers);
    if (split instanceof Error) return this.refuse(x, split);
    x.close = split.close;
    const m = req.method;
    const expectsPayload = m === 'POST' || m === 'PUT' || m === 'PATCH';
    let head = `${m} ${req.path} HTTP/1.1\r\n`;
    const h = split.headers;
    for (let i = 0; i < h.length; i += 2) head += `${h[i]}: ${h[i + 1]}\r\n`;
    const body = req.body;
    let buffered: Buffer | null = null;
    let streamed: Readable | null = null;
    if (body === null) {
      if (split.length > 0) return this.refuse(x, coded('UND_ERR_REQ_CONTENT_LENGTH_MISMATCH', 'Request body length does not match content-length header'));
      if (expectsPayload) head += 'content-length: 0\r\n';
    } else if (Buffer.isBuffer(body)) {
      if (split.length >= 0 && split.length !== body.length) return this.refuse(x, coded('UND_ERR_REQ_CONTENT_LENGTH_MISMATCH', 'Request body length does not match content-length header'));
      if (body.length > 0 || expectsPayload) head += `content-length: ${body.length}\r\n`;
      if (body.length > 0) buffered = body;
    } else {
      streamed = body;
      head += split.length >= 0 ? `content-length: ${split.length}\r\n` : 'transfer-encoding: chunked\r\n';
    }
    head += x.close ? 'connection: close\r\n\r\n' : 'connection: keep-alive\r\n\r\n';
    let conn = this.idleConns.pop();
    let fresh = false;
    if (conn === undefined) {
      let stream: Duplex;
      try {
        stream = this.opts.connect(x.info);
      } catch (err) {
        return this.refuse(x, err as Error);
      }
      conn = new Conn(stream, this);
      this.conns.add(conn);
      fresh = true;
    }
    this.running++;
    x.handler.onConnect((err) => this.abort(x, err));
    if (x.done) {
      // Aborted at once (the client went away): the connection, unused, stays for the next, its
      // idle deadline (the upstream's Keep-Alive hint) as it was; a new one gets the default.
      if (this.closing) conn.destroy();
      else {
        if (fresh) conn.idle(this.opts.keepAliveTimeout);
        this.idleConns.push(conn);
        this.next();
      }
      return;
    }
    if (streamed !== null) x.bodySent = false;
    conn.run(x, head, buffered);
    if (streamed !== null && !x.done) this.sendBody(x, conn, streamed, split.length);
  }

  /** Streams a request body: as it is with a declared length, else chunked. */
  private sendBody(x: Exchange<I>, conn: Conn<I>, body: Readable, declared: number): void {
    const stream = conn.stream;
    let sent = 0;
    const onData = (chunk: Buffer | string): void => {
      const b = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
      if (b.length === 0) return;
      sent += b.length;
      if (declared >= 0) {
        if (sent > declared) return this.abort(x, coded('UND_ERR_REQ_CONTENT_LENGTH_MISMATCH', 'Request body length does not match content-length header'));
        if (!stream.write(b)) body.pause();
      } else {
        stream.write(`${b.length.toString(16)}\r\n`, 'latin1');
        stream.write(b);
        if (!stream.write('\r\n', 'latin1')) body.pause();
      }
    };
    const onDrain = (): void => {
      body.resume();
    };
    const onEnd = (): void => {
      stop();
      if (declared >= 0 && sent !== declared) return this.abort(x, coded('UND_ERR_REQ_CONTENT_LENGTH_MISMATCH', 'Request body length does not match content-length header'));
      if (declared < 0) stream.write('0\r\n\r\n', 'latin1');
      x.bodySent = true;
    };
    const onError = (err: Error): void => {
      stop();
      this.abort(x, err);
    };
    const onClose = (): void => {
      // Closed before it ended: the client went away mid-upload.
      if (!x.bodySent) onError(coded('UND_ERR_ABORTED', 'the request body was aborted'));
    };
    const stop = (): void => {
      x.stopBody = null;
      // Not sent to the end (answered early, or failed): the rest is not read either.
      if (!x.bodySent && !body.readableEnded) body.pause();
      body.off('data', onData);
      body.off('end', onEnd);
      body.off('error', onError);
      body.off('close', onClose);
      stream.off('drain', onDrain);
    };
    x.stopBody = stop;
    body.on('data', onData);
    body.on('end', onEnd);
    body.on('error', onError);
    body.on('close', onClose);
    stream.on('drain', onDrain);
    if (body.readableEnded) onEnd();
    else body.resume();
  }

  /** `x` fails before it ran on a connection (which frees no room: no {@link next} pass). */
  private refuse(x: Exchange<I>, err: Error): void {
    x.done = true;
    x.handler.onError(err);
  }

  private abort(x: Exchange<I>, err?: Error): void {
    if (x.done) return;
    const conn = x.conn;
    // Its body all sent: the response is read and dropped, and the stream kept (see the header).
    const keep = conn !== null && conn.x === x && x.bodySent && !this.closing;
    if (conn !== null && conn.x === x && !keep) {
      conn.x = null;
      conn.destroy();
    }
    this.failed(x, err ?? coded('UND_ERR_ABORTED', 'Request aborted'));
    // After the handler heard its error: what the connection still holds of the response is
    // parsed now, and nothing of it may reach the handler.
    if (keep && conn.x === x && !conn.closed) conn.discard();
  }

  /** @internal `x` failed (its connection closed, or reading the rest of its response to drop it). */
  failed(x: Exchange<I>, err: Error): void {
    if (x.done) {
      // Its response was being dropped and its connection closed: room for one waiting.
      this.next();
      return;
    }
    x.done = true;
    x.stopBody?.();
    this.running--;
    x.handler.onError(err);
    this.next();
  }

  /** @internal `x` got its whole response on `conn`. */
  completed(x: Exchange<I>, conn: Conn<I>): void {
    // An aborted request's response, read to the end: its handler heard onError already.
    const aborted = x.done;
    x.done = true;
    if (!aborted) this.running--;
    if (conn.reusable && !this.closing && !this.destroyed) {
      // (Set from this response's head: its Keep-Alive hint, else keepAliveTimeout.)
      conn.idle(conn.idleMs);
      this.idleConns.push(conn);
    } else conn.destroy();
    if (!aborted) x.handler.onComplete();
    this.next();
  }

  /** @internal A connection closed: it is no longer idle, and there is room for one waiting. */
  dropped(conn: Conn<I>): void {
    this.conns.delete(conn);
    const i = this.idleConns.indexOf(conn);
    if (i >= 0) this.idleConns.splice(i, 1);
    if (this.queued > 0) this.next();
  }

  /**
   * Starts queued requests while there is room; settles `close()` once nothing is left. Never
   * recursive: handlers' calls made while it runs (a refused start's onError, a connection closed
   * on the way) only ask for another pass, so a long queue meeting a refusing `connect` (a session
   * that closed) fails entry by entry in one loop, not one stack frame per entry.
   */
  private next(): void {
    if (this.pumping) {
      this.pumpAgain = true;
      return;
    }
    this.pumping = true;
    try {
      do {
        this.pumpAgain = false;
        while (this.queued > 0 && (this.idleConns.length > 0 || this.conns.size < this.opts.connections)) {
          const x = this.queue[this.queueHead]!;
          this.queue[this.queueHead++] = undefined as unknown as Exchange<I>;
          if (this.queueHead > 64 && this.queueHead * 2 > this.queue.length) {
            this.queue.splice(0, this.queueHead);
            this.queueHead = 0;
          }
          if (x.done) continue; // cancelled
          this.queued--;
          this.start(x);
        }
      } while (this.pumpAgain);
    } finally {
      this.pumping = false;
    }
    if (this.closing && this.size === 0) this.finishClose();
  }

  private finishClose(): void {
    for (const c of [...this.conns]) c.destroy();
    this.closedResolve?.();
    this.closedResolve = null;
  }

  /** No new request; resolves once those running and queued are over, then closes every stream. */
  close(): Promise<void> {
    if (this.closedPromise === null) {
      this.closing = true;
      this.closedPromise = new Promise<void>((resolve) => {
        this.closedResolve = resolve;
      });
      for (const c of [...this.idleConns]) c.destroy();
      if (this.size === 0) this.finishClose();
    }
    return this.closedPromise;
  }

  /** Fails whatever runs or waits with `err` (default `UND_ERR_DESTROYED`) and closes every stream. */
  destroy(err?: Error): Promise<void> {
    const e = err ?? coded('UND_ERR_DESTROYED', 'The client is destroyed');
    this.destroyed = true;
    this.closing = true;
    const queued = this.queue.slice(this.queueHead);
    this.queue.length = 0;
    this.queueHead = 0;
    this.queued = 0;
    for (const x of queued) {
      if (x.done) continue;
      x.done = true;
      x.handler.onError(e);
    }
    for (const c of [...this.conns]) {
      const x = c.x;
      c.x = null;
      c.destroy();
      if (x !== null && !x.done) this.failed(x, e);
    }
    this.closedResolve?.();
    this.closedResolve = null;
    return Promise.resolve();
  }
}
