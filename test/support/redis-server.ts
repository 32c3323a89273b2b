import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { freePort } from './processes.js';

/**
 * A private `redis-server` (the Debian package) on a free port, for tests that stop, kill or
 * restart Redis (event-delivery.md §4). Default: no persistence (`--save '' --appendonly no`),
 * so a restart starts empty; `persist: true` keeps an append-only file (fsync always) in a
 * temporary directory, so a restart keeps the data, as production's `appendonly yes` would.
 */
export interface RedisServer {
  url: string;
  port: number;
  /** `unix://<socket>` when started with `unixSocket: true`, else undefined. */
  unixUrl: string | undefined;
  pid(): number | undefined;
  /** SIGTERM and wait (Redis writes its AOF on the way out). */
  stop(): Promise<void>;
  /** Sends `signal` (default SIGKILL) and waits for the exit. */
  kill(signal?: NodeJS.Signals): Promise<void>;
  /** Stops (if running) and starts again on the same port (and data directory). */
  restart(): Promise<void>;
  /** Starts again after stop()/kill(). */
  start(): Promise<void>;
  /** Kills the server for good and removes its data directory. */
  dispose(): Promise<void>;
}

const live = new Set<ChildProcess>();
let hook = false;

function reachable(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port });
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

export async function startRedisServer(o: { persist?: boolean; bin?: string; unixSocket?: boolean } = {}): Promise<RedisServer> {
  if (!hook) {
    hook = true;
    process.once('exit', () => {
      for (const c of live) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    });
  }
  const port = await freePort();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'warren-redis-'));
  const args = ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--dir', dir, '--daemonize', 'no', '--maxmemory-policy', 'noeviction'];
  args.push(...(o.persist ? ['--appendonly', 'yes', '--appendfsync', 'always'] : ['--appendonly', 'no']));
  const socket = o.unixSocket ? path.join(dir, 'redis.sock') : undefined;
  if (socket) args.push('--unixsocket', socket, '--unixsocketperm', '700');
  let child: ChildProcess | undefined;
  let output = '';

  const launch = async () => {
    const c = spawn(o.bin ?? 'redis-server', args, { stdio: ['ignore', 'pipe', 'pipe'] });
    child = c;
    live.add(c);
    c.once('exit', () => live.delete(c));
    c.stdout!.on('data', (d: Buffer) => (output = (output + d.toString()).slice(-8192)));
    c.stderr!.on('data', (d: Buffer) => (output = (output + d.toString()).slice(-8192)));
    const spawnError = new Promise<never>((_, reject) => c.once('error', (err) => reject(new Error(`cannot start redis-server: ${err.message}`))));
    const deadline = Date.now() + 10_000;
    const ready = (async () => {
      while (!(await reachable(port))) {
        if (c.exitCode !== null) throw new Error(`redis-server exited (${c.exitCode}): ${output.trim().split('\n').slice(-3).join(' | ')}`);
        if (Date.now() > deadline) throw new Error(`redis-server did not listen on ${port} within 10 s`);
        await new Promise((r) => setTimeout(r, 25));
      }
    })();
    await Promise.race([ready, spawnError]);
  };

  const waitExit = (c: ChildProcess) => (c.exitCode !== null || c.signalCode !== null ? Promise.resolve() : new Promise<void>((r) => c.once('exit', () => r())));

  const server: RedisServer = {
    url: `redis://127.0.0.1:${port}`,
    port,
    unixUrl: socket ? `unix://${socket}` : undefined,
    pid: () => child?.pid,
    async stop() {
      if (!child) return;
      const c = child;
      child = undefined;
      c.kill('SIGTERM');
      await waitExit(c);
    },
    async kill(signal = 'SIGKILL') {
      if (!child) return;
      const c = child;
      child = undefined;
      c.kill(signal);
      await waitExit(c);
    },
    async start() {
      if (child) return;
      await launch();
    },
    async restart() {
      await server.stop();
      await launch();
    },
    async dispose() {
      await server.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    },
  };
  await launch();
  // Callers dispose(); as a fallback the data directory goes when the process exits (vitest's
  // forked workers may not run this hook, hence dispose()).
  process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
  return server;
}
