import { spawn, type ChildProcess } from 'node:child_process';
import net from 'node:net';
import { fileURLToPath } from 'node:url';
import { CONTROL_PLANE_START_MS } from './timeouts.js';

/** Repository root (this file lives in test/support). */
export const REPO_ROOT = fileURLToPath(new URL('../..', import.meta.url));

const MAIN = 'services/control-plane/src/main.ts';
const OUTPUT_LIMIT = 64 * 1024;

export interface ExitInfo {
  code: number | null;
  signal: NodeJS.Signals | null;
}

export interface ControlPlaneProcess {
  /** `http://127.0.0.1:<port>`, also the PUBLIC_BASE_URL the process builds its uris from. */
  baseUrl: string;
  port: number;
  /** The control plane's gRPC (config push) port, from its 'listening' message. */
  grpcPort: number;
  pid: number;
  child: ChildProcess;
  /** Resolves when the process has exited (never rejects). */
  exited: Promise<ExitInfo>;
  /** The last 64 KiB of the child's stdout and stderr, interleaved. */
  output(): string;
  /**
   * Sends `signal` (default SIGTERM) and waits for the exit. After `timeoutMs` (default 20 s: the
   * server's own drain limit is 10 s) the process is killed with SIGKILL and the promise rejects.
   */
  stop(opts?: { signal?: NodeJS.Signals; timeoutMs?: number }): Promise<ExitInfo>;
}

export interface StartOptions {
  databaseUrl: string;
  /** Extra or overriding environment for the child. */
  env?: Record<string, string | undefined>;
  /**
   * Port to listen on. Default: a port the OS reports free right now, passed as PORT together with
   * PUBLIC_BASE_URL, so that every `uri` in responses is right (a clash is retried). `0` lets the
   * server pick (PORT=0): the port is then learned from its 'listening' message, and unless
   * `env.PUBLIC_BASE_URL` is given the server builds its uris from `http://127.0.0.1:0`.
   */
  port?: number;
  /** Limit for listening + ready (default `CONTROL_PLANE_START_MS`, a hang detector: see timeouts.ts). */
  timeoutMs?: number;
}

const live = new Set<ChildProcess>();
let exitHookInstalled = false;
function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  // Never leave a server behind when the test worker exits abruptly.
  process.once('exit', () => {
    for (const c of live) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  });
}

/** A TCP port that was free a moment ago on 127.0.0.1. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const port = (srv.address() as net.AddressInfo).port;
      srv.close(() => resolve(port));
    });
  });
}

class StartError extends Error {
  constructor(
    msg: string,
    readonly addrInUse: boolean,
  ) {
    super(msg);
  }
}

/**
 * Spawns the real control-plane process (`node --import tsx services/control-plane/src/main.ts`)
 * with an IPC channel, waits for its `{type:'listening', port}` message and for `/readyz` to
 * answer 200. Never hangs: a timeout or an early exit rejects with the child's output.
 */
export async function startControlPlane(opts: StartOptions): Promise<ControlPlaneProcess> {
  for (let attempt = 0; ; attempt++) {
    try {
      return await startOnce(opts, opts.port ?? (await freePort()));
    } catch (err) {
      if (!(err instanceof StartError) || !err.addrInUse || opts.port !== undefined || attempt >= 4) throw err;
    }
  }
}

async function startOnce(opts: StartOptions, port: number): Promise<ControlPlaneProcess> {
  installExitHook();
  const timeoutMs = opts.timeoutMs ?? CONTROL_PLANE_START_MS;
  const host = '127.0.0.1';
  let baseUrl = `http://${host}:${port}`;
  const env: Record<string, string | undefined> = {
    ...process.env,
    // Config the test process may carry must not leak into the server under test.
    TLS_CERT_FILE: undefined,
    TLS_KEY_FILE: undefined,
    DATABASE_URL: opts.databaseUrl,
    HOST: host,
    PORT: String(port),
    PUBLIC_BASE_URL: port === 0 ? undefined : baseUrl,
    API_RATE_LIMIT_PER_MINUTE: '0',
    LOG_LEVEL: 'warn',
    // The config-push gRPC port: the kernel's pick unless the test fixes one.
    GRPC_PORT: '0',
    ...opts.env,
  };
  for (const k of Object.keys(env)) if (env[k] === undefined) delete env[k];

  // WARREN_PROFILE_DIR=<dir>: write a V8 CPU profile of the process there on exit.
  const profile = process.env.WARREN_PROFILE_DIR ? ['--cpu-prof', `--cpu-prof-dir=${process.env.WARREN_PROFILE_DIR}`] : [];
  const child = spawn(process.execPath, [...profile, '--import', 'tsx', MAIN], {
    cwd: REPO_ROOT,
    env: env as NodeJS.ProcessEnv,
    stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
  });
  live.add(child);

  let out = '';
  const append = (chunk: Buffer) => {
    out += chunk.toString('utf8');
    if (out.length > OUTPUT_LIMIT) out = out.slice(-OUTPUT_LIMIT);
  };
  child.stdout!.on('data', append);
  child.stderr!.on('data', append);
  const output = () => out;

  const exited = new Promise<ExitInfo>((resolve) => {
    child.once('exit', (code, signal) => {
      live.delete(child);
      resolve({ code, signal });
    });
  });
  // A spawn failure (ENOENT, …) also ends in 'exit' or 'error'; record it in the output.
  child.once('error', (err) => append(Buffer.from(`\n[spawn error] ${err.message}\n`)));

  const describe = (what: string) => `control plane (pid ${child.pid ?? '?'}, port ${port}) ${what}\n--- child output ---\n${out.trim() || '(none)'}\n---`;

  const kill = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await Promise.race([exited, sleep(5_000)]);
  };

  const deadline = Date.now() + timeoutMs;
  let grpcPort = 0;
  try {
    // 1. the listening message
    const listenedPort = await new Promise<number>((resolve, reject) => {
      const timer = setTimeout(() => reject(new StartError(describe(`sent no 'listening' message within ${timeoutMs} ms`), false)), timeoutMs);
      child.on('message', (m: unknown) => {
        const msg = m as { type?: string; port?: number; grpcPort?: number };
        if (msg?.type === 'listening' && typeof msg.port === 'number') {
          clearTimeout(timer);
          grpcPort = msg.grpcPort ?? 0;
          resolve(msg.port);
        }
      });
      void exited.then(({ code, signal }) => {
        clearTimeout(timer);
        // give the pipes a moment to flush the last lines
        setTimeout(() => reject(new StartError(describe(`exited before listening (code ${code}, signal ${signal})`), /EADDRINUSE/.test(out))), 50);
      });
    });
    if (port === 0) {
      port = listenedPort;
      baseUrl = `http://${host}:${port}`;
    } else if (listenedPort !== port) throw new StartError(describe(`listened on ${listenedPort}, expected ${port}`), false);

    // 2. /readyz
    let last = '';
    for (;;) {
      if (child.exitCode !== null || child.signalCode !== null) throw new StartError(describe('exited while waiting for /readyz'), false);
      try {
        const res = await fetch(`${baseUrl}/readyz`, { signal: AbortSignal.timeout(2_000) });
        last = `${res.status} ${await res.text()}`;
        if (res.status === 200) break;
      } catch (err) {
        last = (err as Error).message;
      }
      if (Date.now() > deadline) throw new StartError(describe(`/readyz not 200 within ${timeoutMs} ms (last: ${last})`), false);
      await sleep(50);
    }
  } catch (err) {
    await kill();
    throw err;
  }

  let stopping: Promise<ExitInfo> | undefined;
  return {
    baseUrl,
    port,
    grpcPort,
    pid: child.pid!,
    child,
    exited,
    output,
    stop({ signal = 'SIGTERM', timeoutMs: stopTimeout = 20_000 } = {}) {
      stopping ??= (async () => {
        if (child.exitCode !== null || child.signalCode !== null) return exited;
        child.kill(signal);
        const info = await Promise.race([exited, sleep(stopTimeout).then(() => undefined)]);
        if (info) return info;
        await kill();
        throw new Error(describe(`did not exit within ${stopTimeout} ms of ${signal}; killed`));
      })();
      return stopping;
    },
  };
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms).unref?.());
}
