import { spawn, type ChildProcess } from 'node:child_process';
import { Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import { EVENT_TARGET_KINDS, TARGET_QUEUES } from '@warren/shared';
import { REPO_ROOT, type ExitInfo } from './processes.js';
import { CLI_RUN_MS, WORKER_START_MS } from './timeouts.js';

/**
 * Helpers for end-to-end tests of the event pipeline (test/e2e/events.e2e.test.ts): the delivery
 * worker as a real process (`node --import tsx services/worker/src/main.ts`) whose whole output
 * is kept (for log-based waits and the secrets check), the events-admin CLI, and Redis
 * inspection under one key prefix.
 */

const OUTPUT_LIMIT = 16 * 1024 * 1024;
const live = new Set<ChildProcess>();
let hook = false;

export interface EventWorkerProcess {
  pid: number;
  child: ChildProcess;
  metricsPort: number;
  exited: Promise<ExitInfo>;
  /** Everything the process wrote to stdout and stderr (up to 16 MiB). */
  output(): string;
  /** The JSON log lines (pino) written so far. */
  logs(): Array<Record<string, unknown>>;
  /** Sends `signal` (default SIGTERM) and waits for the exit; SIGKILL after `timeoutMs`. */
  stop(signal?: NodeJS.Signals, timeoutMs?: number): Promise<ExitInfo>;
  /** GET /metrics (text), with a timeout (a scrape waits for Redis). */
  metrics(timeoutMs?: number): Promise<string>;
}

/** Starts the worker with `env` (on top of the test process's) and waits for its 'listening' IPC message. */
export async function startEventWorker(env: Record<string, string>, timeoutMs = WORKER_START_MS): Promise<EventWorkerProcess> {
  if (!hook) {
    hook = true;
    process.once('exit', () => {
      for (const c of live) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    });
  }
  const full: Record<string, string | undefined> = { ...process.env, VITEST: undefined, TLS_CERT_FILE: undefined, TLS_KEY_FILE: undefined, LOG_LEVEL: 'info', METRICS_PORT: '0', ...env };
  for (const k of Object.keys(full)) if (full[k] === undefined) delete full[k];
  const child = spawn(process.execPath, ['--import', 'tsx', 'services/worker/src/main.ts'], { cwd: REPO_ROOT, env: full as NodeJS.ProcessEnv, stdio: ['ignore', 'pipe', 'pipe', 'ipc'] });
  live.add(child);
  let out = '';
  const add = (d: Buffer) => {
    out += d.toString('utf8');
    if (out.length > OUTPUT_LIMIT) out = out.slice(-OUTPUT_LIMIT);
  };
  child.stdout!.on('data', add);
  child.stderr!.on('data', add);
  const exited = new Promise<ExitInfo>((resolve) =>
    child.once('exit', (code, signal) => {
      live.delete(child);
      resolve({ code, signal });
    }),
  );
  const metricsPort = await new Promise<number>((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`worker did not start within ${timeoutMs} ms:\n${out}`));
    }, timeoutMs);
    child.on('message', (m: { type?: string; metricsPort?: number }) => {
      if (m?.type === 'listening') {
        clearTimeout(timer);
        resolve(m.metricsPort!);
      }
    });
    void exited.then(({ code, signal }) => {
      clearTimeout(timer);
      setTimeout(() => reject(new Error(`worker exited (${code ?? signal}) before listening:\n${out}`)), 50);
    });
  });
  return {
    pid: child.pid!,
    child,
    metricsPort,
    exited,
    output: () => out,
    logs: () =>
      out.split('\n').flatMap((line) => {
        if (!line.startsWith('{')) return [];
        try {
          return [JSON.parse(line) as Record<string, unknown>];
        } catch {
          return [];
        }
      }),
    async stop(signal = 'SIGTERM', ms = 30_000) {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      const timer = setTimeout(() => child.kill('SIGKILL'), ms);
      const r = await exited;
      clearTimeout(timer);
      return r;
    },
    async metrics(ms = 5_000) {
      const res = await fetch(`http://127.0.0.1:${metricsPort}/metrics`, { signal: AbortSignal.timeout(ms) });
      return res.text();
    },
  };
}

/** The value of one Prometheus sample (`name{labels}`), 0 when absent. */
export function metricValue(text: string, name: string, labels: Record<string, string> = {}): number {
  let total = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith(name)) continue;
    const m = /^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    const set = m[2] ?? '';
    if (Object.entries(labels).every(([k, v]) => set.includes(`${k}="${v}"`))) total += Number(m[3]);
  }
  return total;
}

/** Runs the events-admin CLI (services/worker/src/admin.ts) to completion. */
export function runEventsAdmin(args: string[], env: Record<string, string>, timeoutMs = CLI_RUN_MS): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const full: Record<string, string | undefined> = { ...process.env, VITEST: undefined, ...env };
    for (const k of Object.keys(full)) if (full[k] === undefined) delete full[k];
    const child = spawn(process.execPath, ['--import', 'tsx', 'services/worker/src/admin.ts', ...args], { cwd: REPO_ROOT, env: full as NodeJS.ProcessEnv, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`events-admin ${args.join(' ')} did not finish within ${timeoutMs} ms\n${stdout}\n${stderr}`));
    }, timeoutMs);
    child.once('error', reject);
    child.once('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

/** Every key under `${prefix}:` with its whole value as text (strings, lists, hashes, sets, sorted sets, streams). */
export async function redisContents(redis: Redis, prefix: string): Promise<{ keys: string[]; text: string }> {
  const keys: string[] = [];
  const out: string[] = [];
  let cursor = '0';
  do {
    const [next, batch] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
    cursor = next;
    for (const k of batch) {
      keys.push(k);
      out.push(k);
      const type = await redis.type(k);
      if (type === 'string') out.push(String(await redis.get(k)));
      else if (type === 'list') out.push(...(await redis.lrange(k, 0, -1)));
      else if (type === 'hash') out.push(JSON.stringify(await redis.hgetall(k)));
      else if (type === 'set') out.push(...(await redis.smembers(k)));
      else if (type === 'zset') out.push(...(await redis.zrange(k, '0', '-1')));
      else if (type === 'stream') out.push(JSON.stringify(await redis.xrange(k, '-', '+')));
      // The serialized form too, whatever the type (catches anything the readers above miss).
      const dump = await redis.dumpBuffer(k);
      if (dump) out.push(dump.toString('latin1'));
    }
  } while (cursor !== '0');
  return { keys, text: out.join('\n') };
}

export { deleteKeys } from './redis-keys.js';

/** Flush jobs of every target queue not finished yet (active, waiting, delayed, prioritized). */
export async function unfinishedFlushJobs(redis: Redis, prefix: string): Promise<number> {
  let total = 0;
  for (const kind of EVENT_TARGET_KINDS) {
    const q = new Queue(TARGET_QUEUES[kind], { connection: redis, prefix });
    try {
      const c = await q.getJobCounts('active', 'waiting', 'delayed', 'prioritized', 'waiting-children');
      total += Object.values(c).reduce((a, b) => a + b, 0);
    } finally {
      await q.close();
    }
  }
  return total;
}

/** Values that occur more than once, each once, in order of first repetition. */
export function repeated<T>(values: T[]): T[] {
  const seen = new Set<T>();
  const out = new Set<T>();
  for (const v of values) (seen.has(v) ? out : seen).add(v);
  return [...out];
}
