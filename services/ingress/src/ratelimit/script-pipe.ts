import { createHash } from 'node:crypto';
import { EventEmitter } from 'node:events';
import net from 'node:net';
import tls from 'node:tls';

/**
 * A lean Redis connection for the rate limiter's one hot command: `EVALSHA` of one script with one
 * key, whose reply is an integer or an array of integers.
 *
 * Why not ioredis here: the rate-limit check runs on every request of a limited route, and a CPU
 * profile of the ingress put 28.6 % of its busy time in ioredis's per-command path (Command
 * objects, argument flattening, a promise and a socket write per command) — more than the whole
 * policy engine and limiter together. Auto-pipelining and ioredis pipelines moved the cost into
 * Redis's favour but not the ingress's. This pipe does the least a pipelined RESP2 client must:
 *
 * - commands are preformatted strings appended to one output string and written once per
 *   event-loop turn (`setImmediate`), so the requests of one turn share a syscall and Redis reads
 *   them in one go;
 * - replies come back in order, so a FIFO of callbacks matches them; a small RESP2 parser handles
 *   the five reply kinds, with a fast path for integers;
 * - a timed-out call is answered early (the caller falls back) and keeps its FIFO slot, so the
 *   late reply is matched and dropped; one timer checks the oldest call instead of one timer per call;
 * - a timeout means Redis is slow, not that this process was busy: the deadline starts when the
 *   call is written, not when it is queued, and a call found late is given up only after the next
 *   poll for I/O (see {@link ScriptPipe.checkTimeouts});
 * - the connection (AUTH, SELECT, SCRIPT LOAD) and reconnects with backoff are handled here;
 *   `NOSCRIPT` (a flushed script cache) reloads the script and sends the call again, once; a
 *   connection silent for `staleMs` while its calls time out is dropped and made again.
 *
 * Everything else that talks to Redis (tests, the event pipeline, BullMQ) uses ioredis.
 */

export type ScriptReply = number[] | number;
export type ReplyCallback = (err: Error | null, reply: ScriptReply | null) => void;

export interface ScriptPipeOptions {
  /**
   * redis://[user:password@]host[:port][/db], rediss:// for TLS, or
   * unix:///path/to/redis.sock[?db=N&password=P] for a Redis on the same host (see {@link redisEndpoint}).
   */
  url: string;
  /** The Lua source; it is loaded with SCRIPT LOAD on every (re)connect. */
  script: string;
  /** A call not answered within this many ms of being written to Redis is answered with a {@link PipeTimeout}. */
  timeoutMs: number;
  /** Calls waiting for Redis beyond this number are refused at once (default 20,000). */
  maxInFlight?: number;
  /**
   * A connection that has sent nothing for this long while calls time out on it is dropped and
   * made again (default 5,000 ms): a peer gone without a reset (a node lost behind a stable
   * address) otherwise keeps the pipe `ready` on a dead socket until TCP gives up, ~15 minutes,
   * every call falling back meanwhile. Stalls shorter than this (a busy Redis) are waited out.
   */
  staleMs?: number;
  connectTimeoutMs?: number;
  /** Reconnect delays: min(initial·2^n, max) ms. */
  reconnect?: { initialMs?: number; maxMs?: number };
}

export class PipeTimeout extends Error {
  constructor(ms: number) {
    super(`Redis did not answer within ${ms} ms`);
  }
}
export class PipeUnavailable extends Error {}

/** Where a Redis URL points: a TCP host and port (TLS or not) or a Unix socket path, with credentials and database. */
export interface RedisEndpoint {
  host: string;
  port: number;
  tls: boolean;
  /** Unix socket path (unix:// URLs); host and port are then unused. */
  path: string | undefined;
  user: string;
  password: string;
  /** Database number as text; '' or '0' for the default. */
  db: string;
}

/**
 * Parses `redis://[user:password@]host[:port][/db]`, `rediss://…` (TLS) and
 * `unix:///path/to/redis.sock[?db=N&username=U&password=P]` (redis-py's form). A Unix
 * socket suits a Redis beside the ingress server, the natural home of the limiter's counts
 * (capacity is per server): it skips the TCP stack on both sides. Throws on anything else.
 */
export function redisEndpoint(url: string): RedisEndpoint {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw new Error(`not a Redis URL: expected redis://host:port, rediss://host:port or unix:///path/to/redis.sock`);
  }
  const user = decodeURIComponent(u.username);
  const password = decodeURIComponent(u.password);
  if (u.protocol === 'unix:') {
    const path = decodeURIComponent(u.pathname);
    if (!path || path === '/') throw new Error('a unix:// Redis URL needs a socket path, e.g. unix:///run/redis/redis.sock');
    const q = u.searchParams;
    return { host: '', port: 0, tls: false, path, user: q.get('username') ?? user, password: q.get('password') ?? password, db: q.get('db') ?? '' };
  }
  if (u.protocol !== 'redis:' && u.protocol !== 'rediss:') throw new Error(`unsupported Redis URL scheme ${u.protocol} (redis:, rediss: or unix:)`);
  return {
    host: u.hostname.replace(/^\[|\]$/g, '') || '127.0.0.1',
    port: Number(u.port || 6379),
    tls: u.protocol === 'rediss:',
    path: undefined,
    user,
    password,
    db: u.pathname.replace(/^\//, '') || (u.searchParams.get('db') ?? ''),
  };
}

interface Pending {
  cb: ReplyCallback | null; // null once answered early (timeout) or for internal commands
  /** The command, to send again after a NOSCRIPT (not for internal commands, nor a second time). */
  cmd?: string;
  /** performance.now() by which the reply is due; Infinity until written (and for internal commands). */
  deadline: number;
  internal?: (err: Error | null, value: unknown) => void;
}

type Status = 'connecting' | 'ready' | 'closed';

const CRLF = '\r\n';

/** `$<len>\r\n<s>\r\n`: a RESP bulk string (the length in bytes). */
function bulk(s: string): string {
  return `$${Buffer.byteLength(s)}${CRLF}${s}${CRLF}`;
}

export function command(...args: string[]): string {
  let out = `*${args.length}${CRLF}`;
  for (const a of args) out += bulk(a);
  return out;
}

export class ScriptPipe extends EventEmitter<{ ready: []; error: [Error]; close: [] }> {
  status: Status = 'connecting';
  readonly sha: string;
  private socket: net.Socket | tls.TLSSocket | null = null;
  private readonly endpoint: RedisEndpoint;
  private readonly timeoutMs: number;
  private readonly maxInFlight: number;
  private readonly connectTimeoutMs: number;
  private readonly backoff: { initialMs: number; maxMs: number };
  private attempts = 0;
  /** FIFO of calls sent (or queued to be sent) on the current connection. */
  private fifo: Pending[] = [];
  private head = 0;
  /** Calls at the end of the FIFO that are still in `out`, not yet written. */
  private unsent = 0;
  private out = '';
  private flushScheduled = false;
  private input: Buffer | null = null;
  /** Scratch space of the integer-array fast path. */
  private readonly ints: number[] = [];
  private ticker: NodeJS.Timeout | null = null;
  /** Reply chunks received so far (any connection): what {@link verdict} compares to see progress. */
  private received = 0;
  /** A {@link verdict} is scheduled, for the calls late at `checkedAt`, when `received` was `seenAt`. */
  private verdictDue = false;
  private checkedAt = 0;
  private seenAt = 0;
  private readonly staleMs: number;
  /** performance.now() of the last bytes from Redis (or of the connection becoming ready). */
  private lastDataAt = 0;
  private reconnectTimer: NodeJS.Timeout | null = null;
  /** Bounds connect + handshake of the current connection to `connectTimeoutMs`. */
  private handshakeTimer: NodeJS.Timeout | null = null;
  /** Prefix of every EVALSHA command: `*<n>\r\n$7\r\nEVALSHA\r\n$40\r\n<sha>\r\n$1\r\n1\r\n`. */
  private readonly evalPrefix: string;
  private readonly argCount: number;

  constructor(private readonly opts: ScriptPipeOptions & { argCount: number }) {
    super();
    this.endpoint = redisEndpoint(opts.url);
    this.timeoutMs = opts.timeoutMs;
    this.maxInFlight = opts.maxInFlight ?? 20_000;
    this.connectTimeoutMs = opts.connectTimeoutMs ?? 1000;
    this.staleMs = opts.staleMs ?? 5000;
    this.backoff = { initialMs: opts.reconnect?.initialMs ?? 50, maxMs: opts.reconnect?.maxMs ?? 1000 };
    this.sha = createHash('sha1').update(opts.script).digest('hex');
    this.argCount = opts.argCount;
    this.evalPrefix = `*${4 + opts.argCount}${CRLF}${bulk('EVALSHA')}${bulk(this.sha)}${bulk('1')}`;
    this.connect();
  }

  /** Calls waiting for a reply (including timed-out ones whose reply is still due). */
  get inFlight(): number {
    return this.fifo.length - this.head;
  }

  /**
   * EVALSHA with one key and `argCount` arguments. The callback runs once: with the reply, a
   * Redis error, {@link PipeTimeout} or {@link PipeUnavailable}.
   */
  call(key: string, args: readonly string[], cb: ReplyCallback): void {
    this.callEncoded(this.encode(key, args), cb);
  }

  /** The EVALSHA command for `key` and `args`, for callers that send the same one repeatedly. */
  encode(key: string, args: readonly string[]): string {
    let cmd = this.evalPrefix + bulk(key);
    for (let i = 0; i < this.argCount; i++) cmd += bulk(args[i] ?? '');
    return cmd;
  }

  /** {@link call} with a command made by {@link encode}. */
  callEncoded(cmd: string, cb: ReplyCallback): void {
    if (this.status !== 'ready') return cb(new PipeUnavailable('Redis is not connected'), null);
    if (this.inFlight >= this.maxInFlight) return cb(new PipeUnavailable(`more than ${this.maxInFlight} calls waiting for Redis`), null);
    this.fifo.push({ cb, deadline: Infinity, cmd });
    this.unsent++;
    this.send(cmd);
  }

  close(): void {
    this.status = 'closed';
    if (this.reconnectTimer) clearTimeout(this.reconnectTimer);
    this.clearHandshakeTimer();
    this.stopTicker();
    this.failAll(new PipeUnavailable('closed'));
    this.socket?.destroy();
    this.socket = null;
    this.emit('close');
  }

  private send(cmd: string): void {
    this.out += cmd;
    if (!this.flushScheduled) {
      this.flushScheduled = true;
      setImmediate(this.flush);
    }
    if (!this.ticker) this.ticker = setInterval(this.checkTimeouts, Math.max(1, Math.floor(this.timeoutMs / 5)));
  }

  private readonly flush = (): void => {
    this.flushScheduled = false;
    if (!this.out || !this.socket) return;
    const out = this.out;
    this.out = '';
    // The calls' time starts now: time spent queued behind a busy event loop is not Redis' delay.
    const deadline = performance.now() + this.timeoutMs;
    const fifo = this.fifo;
    for (let i = fifo.length - this.unsent; i < fifo.length; i++) if (!fifo[i]!.internal) fifo[i]!.deadline = deadline;
    this.unsent = 0;
    this.socket.write(out);
  };

  private connect(): void {
    if (this.status === 'closed') return;
    this.status = 'connecting';
    const ep = this.endpoint;
    const sock = ep.path
      ? net.connect({ path: ep.path })
      : ep.tls
        ? tls.connect({ host: ep.host, port: ep.port, servername: net.isIP(ep.host) ? undefined : ep.host })
        : net.connect({ host: ep.host, port: ep.port });
    this.socket = sock;
    if (!ep.path) {
      sock.setNoDelay(true);
      sock.setKeepAlive(true, 10_000);
    }
    // connectTimeoutMs bounds the whole way to ready (connect, TLS, AUTH, SELECT, SCRIPT LOAD): a
    // Redis that accepts but stalls (a blackholed peer, a server stopped mid-handshake) is left
    // and tried again, rather than holding the pipe in `connecting` until TCP keepalive gives up.
    this.clearHandshakeTimer();
    this.handshakeTimer = setTimeout(() => sock.destroy(new Error(`Redis not ready within ${this.connectTimeoutMs} ms of connecting`)), this.connectTimeoutMs);
    sock.once(ep.tls ? 'secureConnect' : 'connect', () => this.handshake());
    sock.on('data', (chunk: Buffer) => this.onData(chunk));
    sock.on('error', (err) => {
      if (this.listenerCount('error') > 0) this.emit('error', err);
    });
    sock.on('close', () => this.onClose(sock));
  }

  /** AUTH, SELECT and SCRIPT LOAD; ready once the script is loaded. */
  private handshake(): void {
    const { user, password: pass, db } = this.endpoint;
    const fail = (what: string) => (err: Error | null) => {
      if (err) this.socket?.destroy(new Error(`${what}: ${err.message}`));
    };
    if (pass) this.internal(user ? command('AUTH', user, pass) : command('AUTH', pass), fail('AUTH'));
    if (db && db !== '0') this.internal(command('SELECT', db), fail('SELECT'));
    this.internal(command('SCRIPT', 'LOAD', this.opts.script), (err) => {
      if (err) return fail('SCRIPT LOAD')(err);
      this.clearHandshakeTimer();
      this.attempts = 0;
      this.lastDataAt = performance.now();
      this.status = 'ready';
      this.emit('ready');
    });
  }

  private internal(cmd: string, done: (err: Error | null, value: unknown) => void): void {
    this.fifo.push({ cb: null, deadline: Infinity, internal: done });
    this.unsent++;
    this.send(cmd);
  }

  private clearHandshakeTimer(): void {
    if (this.handshakeTimer) clearTimeout(this.handshakeTimer);
    this.handshakeTimer = null;
  }

  private onClose(sock: net.Socket): void {
    if (this.socket !== sock) return;
    this.clearHandshakeTimer();
    this.socket = null;
    this.out = '';
    this.input = null;
    this.failAll(new PipeUnavailable('connection to Redis lost'));
    if (this.status === 'closed') return;
    this.status = 'connecting';
    const delay = Math.min(this.backoff.initialMs * 2 ** Math.min(this.attempts++, 10), this.backoff.maxMs);
    this.reconnectTimer = setTimeout(() => this.connect(), delay);
  }

  private failAll(err: Error): void {
    const pending = this.fifo;
    const head = this.head;
    this.fifo = [];
    this.head = 0;
    this.unsent = 0;
    for (let i = head; i < pending.length; i++) {
      const p = pending[i]!;
      if (p.cb) p.cb(err, null);
      else p.internal?.(err, null);
    }
  }

  /**
   * The ticker: finds calls past their deadline, but does not give them up yet. Node runs timers
   * before it polls for I/O, so after a stall of this process's event loop (GC, a CPU burst) the
   * ticker runs while Redis' replies wait unread in the socket. The verdict comes after the next
   * poll (`setImmediate` runs after it), when those replies have been read and delivered.
   */
  private readonly checkTimeouts = (): void => {
    if (this.inFlight === 0) return this.stopTicker();
    if (this.verdictDue) return;
    const now = performance.now();
    if (this.lateCall(now) < 0) return;
    this.verdictDue = true;
    this.checkedAt = now;
    this.seenAt = this.received;
    setImmediate(this.verdict);
  };

  /**
   * Answers with {@link PipeTimeout} the calls that were late at the check and are still
   * unanswered after the poll. If replies arrived meanwhile, Redis is answering and the calls left
   * wait behind those answered (replies come in order): only calls late by another `timeoutMs`
   * are given up, the others are checked again on the next tick. So a stalled Redis costs a call
   * `timeoutMs` plus a tick, one that answers slowly at most twice that.
   */
  private readonly verdict = (): void => {
    this.verdictDue = false;
    // Nothing at all from Redis since a call written staleMs ago: the connection is taken for dead.
    if (this.received === this.seenAt && this.socket && this.status === 'ready') {
      const written = this.oldestWrittenAt();
      if (written >= this.lastDataAt && performance.now() - written >= this.staleMs) {
        this.socket.destroy(new Error(`Redis sent nothing for ${this.staleMs} ms while calls waited: connecting again`));
        return;
      }
    }
    const cutoff = this.received === this.seenAt ? this.checkedAt : this.checkedAt - this.timeoutMs;
    for (let i = this.lateCall(cutoff); i >= 0 && i < this.fifo.length; i++) {
      const p = this.fifo[i]!;
      if (p.internal) continue;
      if (p.deadline > cutoff) break;
      if (p.cb) {
        const cb = p.cb;
        p.cb = null;
        cb(new PipeTimeout(this.timeoutMs), null);
      }
    }
  };

  /**
   * Index of the first call still waiting for its reply whose deadline is at or before `t`, or -1.
   * Calls are written in FIFO order, so deadlines are in order too: the search stops at the first
   * call still in time. Internal commands have no deadline and are skipped.
   */
  private lateCall(t: number): number {
    for (let i = this.head; i < this.fifo.length; i++) {
      const p = this.fifo[i]!;
      if (p.internal) continue;
      if (p.deadline > t) return -1;
      if (p.cb) return i;
    }
    return -1;
  }

  /** When the oldest call still waiting for its reply was written (Infinity: none). */
  private oldestWrittenAt(): number {
    for (let i = this.head; i < this.fifo.length; i++) {
      const d = this.fifo[i]!.deadline;
      if (d !== Infinity) return d - this.timeoutMs;
    }
    return Infinity;
  }

  private stopTicker(): void {
    if (this.ticker) clearInterval(this.ticker);
    this.ticker = null;
  }

  private onData(chunk: Buffer): void {
    this.received++;
    this.lastDataAt = performance.now();
    const buf = this.input ? Buffer.concat([this.input, chunk]) : chunk;
    let pos = 0;
    try {
      for (;;) {
        // Fast path: the script's reply, an array of integers, parsed without intermediate objects.
        const end = buf[pos] === 42 ? intArrayEnd(buf, pos, this.ints) : -1;
        if (end > 0) {
          pos = end;
          this.deliver(this.ints.slice());
          continue;
        }
        const r = parseReply(buf, pos);
        if (r === INCOMPLETE) break;
        pos = r.end;
        this.deliver(r.value);
      }
    } catch (err) {
      this.socket?.destroy(err as Error);
      return;
    }
    this.input = pos < buf.length ? buf.subarray(pos) : null;
    if (this.input && this.input.length > 64 * 1024 * 1024) this.socket?.destroy(new Error('reply too large'));
  }

  private deliver(value: unknown): void {
    if (this.head >= this.fifo.length) {
      this.socket?.destroy(new Error('reply without a pending call'));
      return;
    }
    const p = this.fifo[this.head++]!;
    // Compact the FIFO once its consumed head dominates it.
    if (this.head > 1024 && this.head * 2 > this.fifo.length) {
      this.fifo = this.fifo.slice(this.head);
      this.head = 0;
    }
    const err = value instanceof RedisError ? value : null;
    if (p.internal) return p.internal(err, err ? null : value);
    if (err && err.message.startsWith('NOSCRIPT')) {
      this.reloadScript();
      // Sent again once, behind the SCRIPT LOAD (replies come in order): a flushed script cache
      // costs the calls of that moment one more round trip, not a fallback each.
      if (p.cb && p.cmd !== undefined) {
        this.fifo.push({ cb: p.cb, deadline: Infinity });
        p.cb = null;
        this.unsent++;
        this.send(p.cmd);
        return;
      }
    }
    if (!p.cb) return;
    const cb = p.cb;
    p.cb = null;
    if (err) return cb(err, null);
    if (typeof value !== 'number' && !Array.isArray(value)) return cb(new RedisError(`unexpected script reply: ${JSON.stringify(value)}`), null);
    cb(null, value as ScriptReply);
  }

  private reloading = false;
  private reloadScript(): void {
    if (this.reloading) return;
    this.reloading = true;
    this.internal(command('SCRIPT', 'LOAD', this.opts.script), () => (this.reloading = false));
  }
}

export class RedisError extends Error {}

const INCOMPLETE = Symbol('incomplete');
type Parsed = { value: unknown; end: number } | typeof INCOMPLETE;

/** Index of the next CRLF from `pos`, or -1. */
function lineEnd(buf: Buffer, pos: number): number {
  const i = buf.indexOf(13, pos);
  return i >= 0 && i + 1 < buf.length ? i : -1;
}

/** An integer written in ASCII between `from` and `to` (exclusive). */
function int(buf: Buffer, from: number, to: number): number {
  let n = 0;
  let neg = false;
  let i = from;
  if (buf[i] === 45) {
    neg = true;
    i++;
  }
  for (; i < to; i++) n = n * 10 + (buf[i]! - 48);
  return neg ? -n : n;
}

/**
 * If `buf` holds, from `pos`, a complete array whose elements are all integers (`*n` then `:i`
 * lines), fills `out` with them and returns the position after it; otherwise -1 (not that shape,
 * or incomplete: the general parser decides).
 */
function intArrayEnd(buf: Buffer, pos: number, out: number[]): number {
  let p = pos + 1;
  let n = 0;
  let c: number;
  while (p < buf.length && (c = buf[p]!) !== 13) {
    if (c < 48 || c > 57) return -1; // '-1' (nil array) and anything odd: general parser
    n = n * 10 + (c - 48);
    p++;
  }
  p += 2;
  out.length = n;
  for (let i = 0; i < n; i++) {
    if (p >= buf.length || buf[p] !== 58) return -1;
    p++;
    let neg = false;
    if (buf[p] === 45) {
      neg = true;
      p++;
    }
    let v = 0;
    while (p < buf.length && (c = buf[p]!) !== 13) {
      v = v * 10 + (c - 48);
      p++;
    }
    if (p + 1 >= buf.length) return -1;
    out[i] = neg ? -v : v;
    p += 2;
  }
  return p <= buf.length ? p : -1;
}

/** One RESP2 reply starting at `pos`. */
export function parseReply(buf: Buffer, pos: number): Parsed {
  if (pos >= buf.length) return INCOMPLETE;
  const type = buf[pos]!;
  const le = lineEnd(buf, pos + 1);
  if (le < 0) return INCOMPLETE;
  switch (type) {
    case 58: // ':'
      return { value: int(buf, pos + 1, le), end: le + 2 };
    case 43: // '+'
      return { value: buf.toString('utf8', pos + 1, le), end: le + 2 };
    case 45: // '-'
      return { value: new RedisError(buf.toString('utf8', pos + 1, le)), end: le + 2 };
    case 36: {
      // '$'
      const len = int(buf, pos + 1, le);
      if (len < 0) return { value: null, end: le + 2 };
      const start = le + 2;
      if (start + len + 2 > buf.length) return INCOMPLETE;
      return { value: buf.toString('utf8', start, start + len), end: start + len + 2 };
    }
    case 42: {
      // '*'
      const n = int(buf, pos + 1, le);
      if (n < 0) return { value: null, end: le + 2 };
      const out: unknown[] = new Array(n);
      let p = le + 2;
      for (let i = 0; i < n; i++) {
        const r = parseReply(buf, p);
        if (r === INCOMPLETE) return INCOMPLETE;
        out[i] = r.value;
        p = r.end;
      }
      return { value: out, end: p };
    }
    default:
      throw new RedisError(`unexpected RESP type byte ${type}`);
  }
}
