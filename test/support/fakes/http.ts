import http from 'node:http';
import https from 'node:https';
import type { Socket } from 'node:net';

/**
 * Plumbing shared by the local test receivers ("fakes") in this directory: a listener on
 * 127.0.0.1 that can be stopped (connections refused, open sockets destroyed) and started again
 * on the same port, timers that die with the fake, a capped body reader and a FIFO fault script.
 * Nothing here knows a wire protocol; see aws.ts, datadog.ts and azure.ts.
 */

export type Handler = (req: http.IncomingMessage, res: http.ServerResponse) => Promise<void>;

/** Hard cap on a request body the fakes buffer (well above every limit they enforce). */
export const MAX_BODY_BYTES = 64 * 1024 * 1024;

export class FakeListener {
  readonly server: http.Server;
  port = 0;
  private readonly sockets = new Set<Socket>();
  private readonly timers = new Set<NodeJS.Timeout>();
  private closed = false;

  constructor(handler: Handler, tls?: { key: string; cert: string }) {
    const wrapped = (req: http.IncomingMessage, res: http.ServerResponse) => {
      handler(req, res).catch((err: unknown) => {
        if (!res.headersSent && !res.destroyed) {
          res.writeHead(500, { 'content-type': 'text/plain' });
          res.end(`fake crashed: ${String(err)}`);
        }
      });
    };
    this.server = tls ? https.createServer({ key: tls.key, cert: tls.cert }, wrapped) : http.createServer(wrapped);
    // Keep-alive connections of SDK clients must not outlive stop(); track them all.
    this.server.on('connection', (socket: Socket) => {
      this.sockets.add(socket);
      socket.on('close', () => this.sockets.delete(socket));
    });
    if (tls) this.server.on('tlsClientError', () => {});
  }

  async listen(): Promise<void> {
    await new Promise<void>((resolve, reject) => {
      const onError = (err: Error) => reject(err);
      this.server.once('error', onError);
      this.server.listen(this.port, '127.0.0.1', () => {
        this.server.off('error', onError);
        resolve();
      });
    });
    this.port = (this.server.address() as { port: number }).port;
  }

  /** Stops accepting (connections are refused) and destroys every open connection. */
  async stop(): Promise<void> {
    if (!this.server.listening) return;
    const done = new Promise<void>((resolve) => this.server.close(() => resolve()));
    for (const s of this.sockets) s.destroy();
    this.server.closeAllConnections();
    await done;
  }

  /** Listens again on the same port. */
  async start(): Promise<void> {
    if (this.closed) throw new Error('fake is closed');
    if (this.server.listening) return;
    await this.listen();
  }

  /** Cancels every pending slow reply. */
  clearTimers(): void {
    for (const t of this.timers) clearTimeout(t);
    this.timers.clear();
  }

  async close(): Promise<void> {
    this.closed = true;
    this.clearTimers();
    await this.stop();
  }

  /** A delay that never resolves if the fake is reset or closed in the meantime. */
  sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const t = setTimeout(() => {
        this.timers.delete(t);
        resolve();
      }, ms);
      this.timers.add(t);
    });
  }
}

/** Reads the whole body; rejects above MAX_BODY_BYTES. */
export function readBody(req: http.IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (c: Buffer) => {
      size += c.length;
      if (size > MAX_BODY_BYTES) {
        reject(new Error('body too large for the fake'));
        req.destroy();
        return;
      }
      chunks.push(c);
    });
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

/** Destroys the connection without an answer (client sees ECONNRESET / socket hang up). */
export function resetConnection(req: http.IncomingMessage): void {
  const socket = req.socket;
  try {
    socket.resetAndDestroy(); // TCP RST
  } catch {
    socket.destroy(); // a TLS socket cannot send a bare RST
  }
}

/** Per-key FIFO of scripted faults. */
export class FaultQueue<K, F> {
  private readonly queues = new Map<K, F[]>();
  /** Bumped by clear() (the fake's reset()): a `slow` call that outlives it is dropped, see playFault. */
  generation = 0;
  push(key: K, fault: F, times = 1): void {
    if (!Number.isInteger(times) || times < 1) throw new Error(`times must be a positive integer, got ${times}`);
    const q = this.queues.get(key) ?? [];
    for (let i = 0; i < times; i++) q.push(fault);
    this.queues.set(key, q);
  }
  take(key: K): F | undefined {
    const q = this.queues.get(key);
    const f = q?.shift();
    if (q && q.length === 0) this.queues.delete(key);
    return f;
  }
  clear(): void {
    this.queues.clear();
    this.generation++;
  }
}

/**
 * Takes the next scripted fault for `key` and plays the kinds every fake shares: `slow` waits, then
 * the call proceeds normally (undefined), unless the fake was reset meanwhile: then the call
 * belongs to an earlier test (its client gave up long ago) and is dropped unrecorded like
 * `reset`, rather than landing in the next test's entries on a loaded machine; `reset` drops the
 * connection unanswered ('reset').
 * Anything else is returned for the fake to answer. The fault's kind is noted on `entry`.
 */
export async function playFault<K, F extends { kind: string; ms?: number }>(
  faults: FaultQueue<K, F>,
  key: K,
  entry: { fault?: string; error?: string },
  listener: FakeListener,
  req: http.IncomingMessage,
): Promise<F | 'reset' | undefined> {
  const fault = faults.take(key);
  if (!fault) return undefined;
  entry.fault = fault.kind;
  if (fault.kind === 'slow') {
    const generation = faults.generation;
    await listener.sleep(fault.ms ?? 0);
    if (faults.generation === generation) return undefined;
    resetConnection(req);
    return 'reset';
  }
  if (fault.kind === 'reset') {
    entry.error = 'reset';
    resetConnection(req);
    return 'reset';
  }
  return fault;
}

/** `application/json; charset=utf-8` → `application/json`. */
export function mediaType(header: string | undefined): string {
  return (header ?? '').split(';')[0]!.trim().toLowerCase();
}
