import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pg from 'pg';
import { REPO_ROOT, type ExitInfo } from './processes.js';
import { AGENT_ONLINE_MS, INGRESS_START_MS } from './timeouts.js';

/**
 * Real ingress and agent processes for end-to-end tests: each is `node --import tsx <main>` with
 * every port 0, so runs never collide; the ports come back in the child's 'listening' message.
 */

const OUTPUT_LIMIT = 64 * 1024;
const live = new Set<ChildProcess>();
process.once('exit', () => {
  for (const c of live) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
});

export interface ServiceProcess {
  pid: number;
  child: ChildProcess;
  exited: Promise<ExitInfo>;
  output(): string;
  /** SIGTERM (or `signal`), then SIGKILL after `timeoutMs` (default 20 s). */
  stop(opts?: { signal?: NodeJS.Signals; timeoutMs?: number }): Promise<ExitInfo>;
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

function spawnService(name: string, script: string, args: string[], env: Record<string, string | undefined>): ServiceProcess & { message: Promise<Record<string, unknown>> } {
  const full: Record<string, string | undefined> = { ...process.env, TLS_CERT_FILE: undefined, TLS_KEY_FILE: undefined, LOG_LEVEL: 'warn', ...env };
  for (const k of Object.keys(full)) if (full[k] === undefined) delete full[k];
  // WARREN_PROFILE_DIR=<dir>: write a V8 CPU profile of every service process there on exit.
  const profile = process.env.WARREN_PROFILE_DIR ? ['--cpu-prof', `--cpu-prof-dir=${process.env.WARREN_PROFILE_DIR}`] : [];
  const child = spawn(process.execPath, [...profile, '--import', 'tsx', script, ...args], { cwd: REPO_ROOT, env: full as NodeJS.ProcessEnv, stdio: ['ignore', 'pipe', 'pipe', 'ipc'] });
  live.add(child);
  let out = '';
  const append = (chunk: Buffer) => {
    out += chunk.toString('utf8');
    if (out.length > OUTPUT_LIMIT) out = out.slice(-OUTPUT_LIMIT);
  };
  child.stdout!.on('data', append);
  child.stderr!.on('data', append);
  const exited = new Promise<ExitInfo>((resolve) => {
    child.once('exit', (code, signal) => {
      live.delete(child);
      resolve({ code, signal });
    });
  });
  const message = new Promise<Record<string, unknown>>((resolve, reject) => {
    child.on('message', (m: { type?: string }) => {
      if (m?.type === 'listening') resolve(m as Record<string, unknown>);
    });
    void exited.then(({ code, signal }) => setTimeout(() => reject(new Error(`${name} exited before listening (code ${code}, signal ${signal})\n--- output ---\n${out}`)), 50));
  });
  message.catch(() => {});
  let stopping: Promise<ExitInfo> | undefined;
  return {
    pid: child.pid!,
    child,
    exited,
    message,
    output: () => out,
    stop({ signal = 'SIGTERM', timeoutMs = 20_000 } = {}) {
      stopping ??= (async () => {
        if (child.exitCode !== null || child.signalCode !== null) return exited;
        child.kill(signal);
        const info = await Promise.race([exited, sleep(timeoutMs).then(() => undefined)]);
        if (info) return info;
        child.kill('SIGKILL');
        await exited;
        throw new Error(`${name} did not exit within ${timeoutMs} ms of ${signal}\n${out}`);
      })();
      return stopping;
    },
  };
}

export interface IngressProcess extends ServiceProcess {
  nodeId: string;
  stateDir: string;
  http: number;
  https: number;
  agent: number;
  internal: number;
  /** PEM of the CA that signed the node's generated certificate. */
  caPem: string;
  /** `http://127.0.0.1:<internal>` for /metrics, /readyz, /status. */
  internalUrl: string;
}

export interface IngressOptions {
  nodeId: string;
  /** Control-plane gRPC `host:port`s. */
  controlPlane: string[];
  nodeToken: string;
  /** Reuse a state dir (restart); default a new temp dir, removed by `cleanup()`. */
  stateDir?: string;
  /** Fixed ports (a restart keeps its internal port so that other nodes' hops still reach it). */
  ports?: Partial<Record<'http' | 'https' | 'agent' | 'internal', number>>;
  env?: Record<string, string | undefined>;
  /** Limit for the 'listening' message (default `INGRESS_START_MS`, a hang detector: see timeouts.ts). */
  timeoutMs?: number;
}

const tempDirs: string[] = [];
export function tempDir(prefix: string): string {
  const d = mkdtempSync(path.join(tmpdir(), prefix));
  tempDirs.push(d);
  return d;
}
export function cleanupTempDirs(): void {
  for (const d of tempDirs.splice(0)) rmSync(d, { recursive: true, force: true });
}

export async function startIngress(o: IngressOptions): Promise<IngressProcess> {
  const stateDir = o.stateDir ?? tempDir(`warren-${o.nodeId}-`);
  const p = spawnService(`ingress ${o.nodeId}`, 'services/ingress/src/main.ts', [], {
    NODE_ID: o.nodeId,
    HOST: '127.0.0.1',
    HTTP_PORT: String(o.ports?.http ?? 0),
    HTTPS_PORT: String(o.ports?.https ?? 0),
    AGENT_PORT: String(o.ports?.agent ?? 0),
    INTERNAL_PORT: String(o.ports?.internal ?? 0),
    CONTROL_PLANE_GRPC: o.controlPlane.join(','),
    WARREN_NODE_TOKEN: o.nodeToken,
    STATE_DIR: stateDir,
    // Tests reach edges over plain HTTP as well; `env: { HTTPS_EDGES_ON_HTTP: undefined }` gets the default (redirect).
    HTTPS_EDGES_ON_HTTP: 'serve',
    ...o.env,
  });
  const timeout = o.timeoutMs ?? INGRESS_START_MS;
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      // Not left running behind the failed start (nobody would stop it).
      p.child.kill('SIGKILL');
      reject(new Error(`ingress ${o.nodeId} (pid ${p.pid}) sent no 'listening' message within ${timeout} ms\n${p.output()}`));
    }, timeout);
  });
  const m = await Promise.race([p.message, late]).finally(() => clearTimeout(timer));
  return {
    ...p,
    nodeId: o.nodeId,
    stateDir,
    http: m.http as number,
    https: m.https as number,
    agent: m.agent as number,
    internal: m.internal as number,
    caPem: String(m.caPem ?? ''),
    internalUrl: `http://127.0.0.1:${m.internal as number}`,
  };
}

/** The database's config head version: what every node has once it has caught up. */
export async function configHead(databaseUrl: string): Promise<number> {
  const client = new pg.Client({ connectionString: databaseUrl });
  await client.connect();
  try {
    return Number((await client.query<{ version: string }>('SELECT version FROM config_state')).rows[0]!.version);
  } finally {
    await client.end();
  }
}

/** The config version a node has applied (its internal /status), 0 before the first. */
export async function appliedVersion(n: IngressProcess): Promise<number> {
  return (((await (await fetch(`${n.internalUrl}/status`)).json()) as { config_version: number | null }).config_version ?? 0);
}

/** Waits until every one of `nodes` has applied the database's head version (read now, after a change). */
export async function nodesAtHead(databaseUrl: string, nodes: readonly IngressProcess[], timeoutMs = 20_000): Promise<void> {
  const head = await configHead(databaseUrl);
  for (const n of nodes) await waitFor(`${n.nodeId} applies version ${head}`, async () => (await appliedVersion(n)) >= head, timeoutMs);
}

/** Polls `fn` every 25 ms until it returns a truthy value; throws with `what` after `timeoutMs`. */
export async function waitFor<T>(what: string, fn: () => Promise<T> | T, timeoutMs = 10_000): Promise<NonNullable<Awaited<T>>> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v as NonNullable<Awaited<T>>;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}${last ? `: ${(last as Error).message}` : ''}`);
    await sleep(25);
  }
}

export interface AgentProcess extends ServiceProcess {
  /**
   * Resolves when the agent has printed `text` (e.g. 'online'), with the output so far. Rejects,
   * with the output, when the agent exits without having printed it, or after `timeoutMs`
   * (default `AGENT_ONLINE_MS`, a hang detector: see timeouts.ts).
   */
  waitForOutput(text: string | RegExp, timeoutMs?: number): Promise<string>;
}

/** Our CLI agent (`services/agent/src/main.ts <args>`). */
export function startAgentProcess(args: string[], env: Record<string, string | undefined> = {}): AgentProcess {
  const p = spawnService('agent', 'services/agent/src/main.ts', args, env);
  return {
    ...p,
    async waitForOutput(text, timeoutMs = AGENT_ONLINE_MS) {
      const found = () => {
        const out = p.output();
        return (typeof text === 'string' ? out.includes(text) : text.test(out)) ? out : undefined;
      };
      const t0 = Date.now();
      for (;;) {
        const out = found();
        if (out !== undefined) return out;
        const { exitCode, signalCode } = p.child;
        if (exitCode !== null || signalCode !== null) {
          // 'exit' may come before the last output: read on until both pipes have closed.
          await Promise.race([Promise.all([p.child.stdout!, p.child.stderr!].map((s) => (s.readableEnded || s.destroyed ? undefined : new Promise((r) => s.once('close', r))))), sleep(1_000)]);
          const last = found();
          if (last !== undefined) return last;
          throw new Error(`agent (pid ${p.pid}) exited (code ${exitCode}, signal ${signalCode}) without printing ${String(text)}\n--- agent output ---\n${p.output()}`);
        }
        if (Date.now() - t0 > timeoutMs) throw new Error(`timed out after ${timeoutMs} ms waiting for agent (pid ${p.pid}) output ${String(text)}\n--- agent output ---\n${p.output()}`);
        await sleep(25);
      }
    },
  };
}

/** One management API call with an API key: the status and the parsed JSON body (undefined when empty). */
export async function callApi(baseUrl: string, apiKey: string, method: string, path: string, body?: unknown): Promise<{ status: number; body: any }> {
  const res = await fetch(baseUrl + path, {
    method,
    headers: { Authorization: `Bearer ${apiKey}`, 'Ngrok-Version': '2', ...(body === undefined ? {} : { 'Content-Type': 'application/json' }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : undefined };
}

/** {@link callApi} that must answer `status`: returns the body, or throws naming the call and the answer. */
export async function callApiExpecting(baseUrl: string, apiKey: string, status: number, method: string, path: string, body?: unknown): Promise<any> {
  const r = await callApi(baseUrl, apiKey, method, path, body);
  if (r.status !== status) throw new Error(`${method} ${path}: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body;
}
