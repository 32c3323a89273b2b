import net from 'node:net';
import type { Redis } from 'ioredis';
import { redisKeyPattern } from './keys.js';

/** Test helpers for the rate limiter (not used in production code). */

/** A settable clock in ms since the epoch, for the `clock` options. */
export function fakeClock(startMs: number): { now: () => number; set(ms: number): void; advance(ms: number): void } {
  let t = Math.floor(startMs);
  return { now: () => t, set: (ms) => void (t = Math.floor(ms)), advance: (ms) => void (t += Math.floor(ms)) };
}

/** A seeded PRNG in [0, 1) (mulberry32), so accuracy runs are reproducible. */
export function seededRandom(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Deletes every key of one server id (SCAN, not KEYS). */
export async function deleteServerKeys(client: Redis, serverId: string): Promise<number> {
  let cursor = '0';
  let n = 0;
  do {
    const [next, keys] = await client.scan(cursor, 'MATCH', redisKeyPattern(serverId), 'COUNT', 1000);
    cursor = next;
    if (keys.length) n += await client.unlink(...keys);
  } while (cursor !== '0');
  return n;
}

/**
 * The exact sliding log, the oracle of performance.md §3: for sorted admission times, the most
 * admitted within any (t − W, t] ending at an admission.
 */
export function maxRollingCount(admitted: number[], windowMs: number, from = -Infinity): number {
  let max = 0;
  let lo = 0;
  for (let i = 0; i < admitted.length; i++) {
    while (admitted[lo]! <= admitted[i]! - windowMs) lo++;
    if (admitted[i]! >= from) max = Math.max(max, i - lo + 1);
  }
  return max;
}

/** A free TCP port on 127.0.0.1 with nothing listening on it (closed again). */
export async function closedPort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

/**
 * A TCP proxy in front of Redis that can simulate failures: `stall()` keeps connections open but
 * withholds Redis' replies (a hung server, `kill -STOP`), `resume()` delivers them; `down()`
 * drops every connection and refuses new ones, `up()` accepts again. Its own port never changes,
 * so `retarget()` can put a Redis restarted elsewhere behind the same address (a restart on the
 * old port could race another process for it).
 */
export class FaultyProxy {
  private readonly server: net.Server;
  private readonly pairs = new Set<{ client: net.Socket; upstream: net.Socket; held: Buffer[]; dead?: boolean }>();
  private stalled = false;
  private isDown = false;
  port = 0;

  constructor(private target: { host: string; port: number }) {
    this.server = net.createServer((client) => this.accept(client));
  }

  async start(): Promise<this> {
    await new Promise<void>((r) => this.server.listen(0, '127.0.0.1', r));
    this.port = (this.server.address() as net.AddressInfo).port;
    return this;
  }

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  stall(): void {
    this.stalled = true;
  }

  resume(): void {
    this.stalled = false;
    for (const p of this.pairs) for (const b of p.held.splice(0)) p.client.write(b);
  }

  /**
   * The connections made so far go silent both ways and are never closed (a peer gone without a
   * reset, e.g. a node lost behind a stable address); new connections work.
   */
  blackhole(): void {
    for (const p of this.pairs) p.dead = true;
  }

  down(): void {
    this.isDown = true;
    for (const p of this.pairs) (p.client.destroy(), p.upstream.destroy());
    this.pairs.clear();
  }

  up(): void {
    this.isDown = false;
  }

  /** New connections go to `target`; current ones are dropped (they belong to the old Redis). */
  retarget(target: { host: string; port: number }): void {
    this.target = target;
    for (const p of this.pairs) (p.client.destroy(), p.upstream.destroy());
    this.pairs.clear();
  }

  async close(): Promise<void> {
    this.down();
    await new Promise<void>((r) => this.server.close(() => r()));
  }

  private accept(client: net.Socket): void {
    if (this.isDown) return void client.destroy();
    const upstream = net.connect(this.target);
    const pair: { client: net.Socket; upstream: net.Socket; held: Buffer[]; dead?: boolean } = { client, upstream, held: [] };
    this.pairs.add(pair);
    const end = () => (client.destroy(), upstream.destroy(), this.pairs.delete(pair));
    client.on('error', end).on('close', end);
    upstream.on('error', end).on('close', end);
    client.on('data', (b: Buffer) => pair.dead || upstream.write(b));
    upstream.on('data', (b: Buffer) => pair.dead || (this.stalled ? pair.held.push(b) : client.write(b)));
  }
}

/**
 * A Redis that accepts its first connection and never answers it (a blackholed peer, a server
 * stopped mid-handshake); later connections are spliced to `redisUrl`. `url` is `redisUrl`
 * (credentials, database) with this server's address.
 */
export async function handshakeStaller(redisUrl: string): Promise<{ url: string; connections(): number; close(): Promise<void> }> {
  const target = new URL(redisUrl);
  let connections = 0;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((sock) => {
    sockets.add(sock);
    sock.on('error', () => {});
    if (++connections === 1) return void sock.on('data', () => {});
    const up = net.connect({ host: target.hostname, port: Number(target.port || 6379) });
    sockets.add(up);
    up.on('error', () => sock.destroy());
    sock.pipe(up).pipe(sock);
    sock.on('close', () => up.destroy());
    up.on('close', () => sock.destroy());
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = new URL(target.href);
  url.hostname = '127.0.0.1';
  url.port = String((server.address() as net.AddressInfo).port);
  return {
    url: url.href,
    connections: () => connections,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}
