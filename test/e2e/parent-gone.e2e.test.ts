import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { Redis } from 'ioredis';
import { freshDatabase } from '../support/databases.js';
import { REPO_ROOT } from '../support/processes.js';
import { startAgentProcess, waitFor } from '../support/cluster.js';
import { CONTROL_PLANE_START_MS, INGRESS_START_MS, WORKER_START_MS } from '../support/timeouts.js';

/**
 * A service started with an IPC channel (by `npm start`, or a test harness) stops by itself when
 * the process that started it is gone, even killed with SIGKILL, which gives that process no
 * chance to stop its children: nothing is left holding ports, connections and a CPU behind a
 * test worker that vitest ended, or behind a supervisor that was killed.
 *
 * And our agent, waiting to retry a server it cannot reach, stops at once on SIGTERM rather than
 * after the wait (up to 10 s).
 */

/** True while `pid` runs: not gone, nor a zombie that no one has reaped yet. */
function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    return false;
  }
}

const prefix = `warren_test_${inject('runId')}_${randomBytes(3).toString('hex')}`;
let db: Awaited<ReturnType<typeof freshDatabase>>;
let parent: ChildProcess | undefined;
let pids: Record<string, number> = {};
const stateDir = mkdtempSync(path.join(tmpdir(), 'warren-parent-gone-'));

beforeAll(async () => {
  db = await freshDatabase();
});

afterAll(async () => {
  parent?.kill('SIGKILL');
  // Whatever a failed test left running.
  for (const pid of Object.values(pids)) if (alive(pid)) process.kill(pid, 'SIGKILL');
  const redis = new Redis(inject('redisUrl'));
  const keys = await redis.keys(`${prefix}*`);
  if (keys.length) await redis.del(...keys);
  redis.disconnect();
  await db?.drop();
  rmSync(stateDir, { recursive: true, force: true });
}, 30_000);

describe('services whose parent is gone', () => {
  it('the control plane, ingresses, a worker and an agent stop when the process that started them is killed with SIGKILL', async () => {
    const p = spawn(process.execPath, ['--import', 'tsx', 'test/support/parent-gone.fixture.ts'], {
      cwd: REPO_ROOT,
      env: { ...process.env, FIXTURE_DATABASE_URL: db.url, FIXTURE_REDIS_URL: inject('redisUrl'), FIXTURE_EVENTS_PREFIX: prefix, FIXTURE_STATE_DIR: stateDir },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    parent = p;
    let out = '';
    p.stdout!.on('data', (d: Buffer) => (out += d.toString('utf8')));
    p.stderr!.on('data', (d: Buffer) => (out += d.toString('utf8')));
    const line = await waitFor("the fixture's pids", () => {
      if (p.exitCode !== null) throw new Error(`the fixture exited (${p.exitCode}):\n${out}`);
      return out.split('\n').find((l) => l.startsWith('{"controlPlane"'));
    }, CONTROL_PLANE_START_MS + INGRESS_START_MS + WORKER_START_MS).catch((err: Error) => {
      throw new Error(`${err.message}\n--- fixture output ---\n${out.slice(-4000)}`);
    });
    pids = JSON.parse(line) as Record<string, number>;
    expect(Object.keys(pids).sort()).toEqual(['agent', 'controlPlane', 'ingress', 'loneIngress', 'worker']);
    for (const [name, pid] of Object.entries(pids)) expect(alive(pid), `${name} runs`).toBe(true);

    p.kill('SIGKILL');
    // Each stops as on SIGTERM (the ingress and the worker drain first): seconds, not never.
    await waitFor(
      'every service gone',
      () => Object.values(pids).every((pid) => !alive(pid)) || undefined,
      30_000,
    ).catch((err: Error) => {
      const left = Object.entries(pids).filter(([, pid]) => alive(pid)).map(([name, pid]) => `${name} (pid ${pid})`);
      throw new Error(`${err.message}: still running: ${left.join(', ')}`);
    });
  }, CONTROL_PLANE_START_MS + INGRESS_START_MS + WORKER_START_MS + 60_000);

  it('warren-agent: SIGTERM while it waits to retry a server it cannot reach ends it at once', async () => {
    const agent = startAgentProcess(['http', '1', '--server', '127.0.0.1:1', '--authtoken', 'parent-gone']);
    // The fourth wait: 2 to 4 s (the first three are shorter).
    await agent.waitForOutput(/(retrying in [^\n]*\n[^]*){3}retrying in /);
    const t0 = performance.now();
    agent.child.kill('SIGTERM');
    const exit = await new Promise<number | null>((resolve) => agent.child.once('exit', (code) => resolve(code)));
    const ms = performance.now() - t0;
    expect(exit).toBe(0);
    // The wait it was in is ≥ 2 s; a loaded machine may take a while to run the handler, not that long.
    expect(ms, `exited ${ms.toFixed(0)} ms after SIGTERM`).toBeLessThan(1_500);
  }, 60_000);
});
