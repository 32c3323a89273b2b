import type { Readable, Writable } from 'node:stream';
import type { MuxSession } from './session.js';
import type { MuxStream } from './stream.js';

/**
 * Typed streams and JSON RPC on top of muxado (agent-protocol.md §3): the first 4 bytes of
 * every stream are a uint32 type; an RPC request is one JSON object (the Rust SDK sends no
 * newline and no FIN), the reply one JSON object followed by FIN.
 */

/** Stream types of the agent protocol (§3 table). */
export const StreamType = {
  Auth: 0,
  Bind: 1,
  Unbind: 2,
  Proxy: 3,
  Restart: 4,
  Stop: 5,
  Update: 6,
  StartTunnelWithLabel: 7,
  SrvInfo: 8,
  StopTunnel: 9,
  PatchTunnelState: 10,
  Heartbeat: 0xffffffff,
} as const;

/** RPC bodies larger than this are refused (a request is a few KiB at most). */
export const MAX_RPC_BYTES = 1024 * 1024;

export class StreamReadError extends Error {
  constructor(
    readonly code: 'EOF' | 'TIMEOUT' | 'TOO_LARGE' | 'MALFORMED' | 'CLOSED',
    message: string,
  ) {
    super(message);
    this.name = 'StreamReadError';
  }
}

/** The 4-byte big-endian type that starts a typed stream. */
export function encodeStreamType(type: number): Buffer {
  const b = Buffer.allocUnsafe(4);
  b.writeUInt32BE(type >>> 0, 0);
  return b;
}

/**
 * Runs `take` on each chunk that becomes readable until it returns a result; the bytes it does
 * not use are put back (`unshift`) for the next reader. Rejects on end, error, close or timeout.
 */
function readWith<T>(stream: Readable, take: (chunk: Buffer) => { value: T; used: number } | null, timeoutMs: number, what: string): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let settled = false;
    const timer = timeoutMs > 0 ? setTimeout(() => done(new StreamReadError('TIMEOUT', `timed out reading ${what}`)), timeoutMs) : null;
    timer?.unref();
    function cleanup(): void {
      if (timer) clearTimeout(timer);
      stream.off('readable', onReadable);
      stream.off('end', onEnd);
      stream.off('error', onError);
      stream.off('close', onClose);
    }
    function done(err: Error | null, value?: T): void {
      if (settled) return;
      settled = true;
      cleanup();
      if (err) reject(err);
      else resolve(value as T);
    }
    function onReadable(): void {
      let chunk: Buffer | null;
      while (!settled && (chunk = stream.read() as Buffer | null) !== null) {
        let r: { value: T; used: number } | null;
        try {
          r = take(chunk);
        } catch (err) {
          done(err as Error);
          return;
        }
        if (r) {
          if (r.used < chunk.length) stream.unshift(chunk.subarray(r.used));
          done(null, r.value);
          return;
        }
      }
    }
    const onEnd = (): void => done(new StreamReadError('EOF', `stream ended before ${what}`));
    const onError = (err: Error): void => done(err);
    const onClose = (): void => done(new StreamReadError('CLOSED', `stream closed before ${what}`));
    stream.on('readable', onReadable);
    stream.on('end', onEnd);
    stream.on('error', onError);
    stream.on('close', onClose);
    if (stream.readableEnded) onEnd();
    else if (stream.destroyed) onClose();
    else onReadable();
  });
}

/** Reads exactly `n` bytes. */
export function readExactly(stream: Readable, n: number, timeoutMs = 0): Promise<Buffer> {
  if (n === 0) return Promise.resolve(Buffer.alloc(0));
  const parts: Buffer[] = [];
  let have = 0;
  return readWith(
    stream,
    (chunk) => {
      const used = Math.min(n - have, chunk.length);
      parts.push(used === chunk.length ? chunk : chunk.subarray(0, used));
      have += used;
      return have === n ? { value: parts.length === 1 ? parts[0]! : Buffer.concat(parts, n), used } : null;
    },
    timeoutMs,
    `${n} bytes`,
  );
}

/** Reads the 4-byte type that starts a typed stream. */
export async function readStreamType(stream: Readable, timeoutMs = 0): Promise<number> {
  return (await readExactly(stream, 4, timeoutMs)).readUInt32BE(0);
}

/**
 * Finds the end of one JSON object or array in a byte stream without parsing it: tracks nesting
 * depth outside strings (structural characters are ASCII, so split UTF-8 sequences are no
 * concern). Needed because the Rust SDK neither ends its request with a newline nor sends FIN.
 */
export class JsonValueScanner {
  private depth = 0;
  private started = false;
  private inString = false;
  private escaped = false;
  private total = 0;

  constructor(private readonly maxBytes: number = MAX_RPC_BYTES) {}

  /** Offset just past the value's last byte in `chunk`, or -1 if more bytes are needed. */
  push(chunk: Uint8Array): number {
    for (let i = 0; i < chunk.length; i++) {
      const c = chunk[i]!;
      if (!this.started) {
        if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) continue;
        if (c !== 0x7b /* { */ && c !== 0x5b /* [ */) throw new StreamReadError('MALFORMED', 'expected a JSON object');
        this.started = true;
        this.depth = 1;
        continue;
      }
      if (this.inString) {
        if (this.escaped) this.escaped = false;
        else if (c === 0x5c /* \ */) this.escaped = true;
        else if (c === 0x22 /* " */) this.inString = false;
        continue;
      }
      if (c === 0x22) this.inString = true;
      else if (c === 0x7b || c === 0x5b) this.depth++;
      else if (c === 0x7d /* } */ || c === 0x5d /* ] */) {
        if (--this.depth === 0) {
          if (this.total + i + 1 > this.maxBytes) throw new StreamReadError('TOO_LARGE', `JSON value over ${this.maxBytes} bytes`);
          return i + 1;
        }
      }
    }
    this.total += chunk.length;
    if (this.total > this.maxBytes) throw new StreamReadError('TOO_LARGE', `JSON value over ${this.maxBytes} bytes`);
    return -1;
  }
}

/**
 * Reads one complete JSON value as soon as its last byte arrives (§3: never wait for FIN);
 * bytes after it stay readable on the stream.
 */
export function readJsonValue(stream: Readable, opts: { maxBytes?: number; timeoutMs?: number } = {}): Promise<unknown> {
  const scanner = new JsonValueScanner(opts.maxBytes ?? MAX_RPC_BYTES);
  const parts: Buffer[] = [];
  return readWith(
    stream,
    (chunk) => {
      const end = scanner.push(chunk);
      if (end < 0) {
        parts.push(chunk);
        return null;
      }
      parts.push(chunk.subarray(0, end));
      const text = Buffer.concat(parts).toString('utf8');
      try {
        return { value: JSON.parse(text) as unknown, used: end };
      } catch {
        throw new StreamReadError('MALFORMED', 'malformed JSON');
      }
    },
    opts.timeoutMs ?? 0,
    'a JSON value',
  );
}

/** Reads everything up to FIN (at most `maxBytes`). */
export function readToEnd(stream: Readable, opts: { maxBytes?: number; timeoutMs?: number } = {}): Promise<Buffer> {
  const max = opts.maxBytes ?? MAX_RPC_BYTES;
  return new Promise<Buffer>((resolve, reject) => {
    const parts: Buffer[] = [];
    let total = 0;
    let settled = false;
    const timer = opts.timeoutMs ? setTimeout(() => done(new StreamReadError('TIMEOUT', 'timed out reading to end of stream')), opts.timeoutMs) : null;
    timer?.unref();
    function done(err: Error | null): void {
      if (settled) return;
      settled = true;
      if (timer) clearTimeout(timer);
      stream.off('data', onData);
      stream.off('end', onEnd);
      stream.off('error', onError);
      stream.off('close', onClose);
      if (err) {
        reject(err);
        stream.destroy();
      } else resolve(Buffer.concat(parts, total));
    }
    const onData = (c: Buffer): void => {
      total += c.length;
      if (total > max) done(new StreamReadError('TOO_LARGE', `reply over ${max} bytes`));
      else parts.push(c);
    };
    const onEnd = (): void => done(null);
    const onError = (err: Error): void => done(err);
    const onClose = (): void => done(new StreamReadError('CLOSED', 'stream closed before its end'));
    stream.on('data', onData);
    stream.on('end', onEnd);
    stream.on('error', onError);
    stream.on('close', onClose);
  });
}

/** Writes an RPC reply: one JSON value, then FIN (the SDK reads to end of stream, §3). */
export function writeRpcReply(stream: Writable, reply: unknown): void {
  stream.end(JSON.stringify(reply));
}

/**
 * Client side of one RPC: opens a typed stream, writes the type and the JSON request, ends our
 * side, and parses the whole reply. Rejects with the transport error or a `StreamReadError`.
 */
export async function rpcCall(session: MuxSession, type: number, request: unknown, opts: { timeoutMs?: number } = {}): Promise<unknown> {
  const stream: MuxStream = session.open();
  const body = Buffer.from(JSON.stringify(request), 'utf8');
  const replyP = readToEnd(stream, { timeoutMs: opts.timeoutMs ?? 30_000 });
  stream.end(Buffer.concat([encodeStreamType(type), body]));
  const raw = await replyP;
  try {
    return JSON.parse(raw.toString('utf8')) as unknown;
  } catch {
    throw new StreamReadError('MALFORMED', 'malformed RPC reply');
  }
}
