import { spawn, type ChildProcess } from 'node:child_process';
import net from 'node:net';
import { freePort } from './database-url.js';

function ping(port: number, host = '127.0.0.1'): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect({ port, host });
    const done = (ok: boolean) => {
      s.destroy();
      resolve(ok);
    };
    s.setTimeout(1000, () => done(false));
    s.on('error', () => done(false));
    s.on('connect', () => s.write('PING\r\n'));
    s.on('data', (d) => done(d.toString().startsWith('+PONG')));
  });
}

export interface ResolvedRedis {
  url: string;
  source: 'env' | 'local' | 'spawned';
  child?: ChildProcess;
}

/** REDIS_URL when set; else the local Redis on 6379; else `redis-server` from PATH on a free port. */
export async function resolveRedis(): Promise<ResolvedRedis | { error: string }> {
  if (process.env.REDIS_URL) return { url: process.env.REDIS_URL, source: 'env' };
  if (await ping(6379)) return { url: 'redis://127.0.0.1:6379', source: 'local' };
  const port = await freePort();
  const child = spawn('redis-server', ['--bind', '127.0.0.1', '--port', String(port), '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
  const failed = await new Promise<boolean>((resolve) => {
    child.once('error', () => resolve(true));
    child.once('spawn', () => resolve(false));
  });
  if (failed) return { error: 'Redis is not reachable and redis-server is not on PATH: install it (Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis) or set REDIS_URL' };
  for (let i = 0; i < 50; i++) {
    if (await ping(port)) return { url: `redis://127.0.0.1:${port}`, source: 'spawned', child };
    await new Promise((r) => setTimeout(r, 100));
  }
  child.kill();
  return { error: `redis-server did not answer on port ${port}` };
}
