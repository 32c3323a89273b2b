import { Worker } from 'node:worker_threads';
import type { FindReplaceConfig, PolicyDirection, UrlActionErrorCode } from '@warren/shared';
import type { RegexJob, RegexMessage } from './regex-worker.thread.js';

/**
 * The regex worker thread: find-replace actions with a regex replacement rewrite bodies over
 * their event-loop bound (4 KiB) here, up to `FIND_REPLACE_LIMITS.workerBodyBytes` (128 KiB).
 * re2js costs up to ~300 ns per character and pattern instruction on adversarial text, too much
 * for the event loop past a few KiB, so those bodies go to one thread (`REGEX_WORKER_LIMITS`),
 * each under a deadline: a job that runs out of time has its thread terminated (re2js is plain
 * JavaScript: termination stops it) and replaced, and its body passes unchanged (`timeout`). At
 * most `jobs` bodies are queued or running in the process and `perAction` of one action (one
 * route's policy cannot take every place); past that a body passes unchanged (`busy`), as with
 * the thread pool's zlib jobs.
 */

/** Mutable for tests only. */
export const REGEX_WORKER_LIMITS = {
  /** Bodies queued or running at once, process-wide (a typical body takes 5–25 ms: a wait of up to ~1 s). */
  jobs: 32,
  /** Of them, bodies of one action (one action of one route's policy cannot take every place). */
  perAction: 8,
  /** Wall time a body may take on the thread (a 128 KiB body of ordinary text takes ~5–20 ms). */
  timeoutMs: 1000,
  /** Wall time the thread may take to start (it compiles the policy modules it loads). */
  startupMs: 10_000,
};

export type RegexJobResult =
  | { kind: 'done'; body: Buffer | null }
  | { kind: 'failed'; code: UrlActionErrorCode | undefined; message: string }
  | { kind: 'timeout' };

const WORKER_URL = new URL('./regex-worker.thread.mjs', import.meta.url);

interface Queued {
  id: number;
  job: RegexJob;
  key: object;
  resolve: (r: RegexJobResult) => void;
}

let worker: Worker | null = null;
let ready = false;
let startup: NodeJS.Timeout | undefined;
let running: (Queued & { timer?: NodeJS.Timeout }) | null = null;
const queue: Queued[] = [];
const perKey = new Map<object, number>();
let nextId = 1;
/** Times the thread was replaced (`warren_traffic_policy_regex_worker_restarts_total`); busy and timed-out bodies are counted as find-replace skips. */
export const regexWorkerCounts = { restarts: 0 };

function settle(q: Queued, r: RegexJobResult): void {
  const n = (perKey.get(q.key) ?? 1) - 1;
  if (n > 0) perKey.set(q.key, n);
  else perKey.delete(q.key);
  q.resolve(r);
}

/** Drops the thread, if any: it is terminated, and later messages and errors of it are ignored. */
function dropWorker(): Promise<number> | undefined {
  const w = worker;
  worker = null;
  ready = false;
  clearTimeout(startup);
  if (!w) return undefined;
  w.removeAllListeners();
  w.on('error', () => {});
  return w.terminate();
}

/** Ends the thread (a job out of time, or a thread that failed); the queue goes on with a new one. */
function retire(reason: RegexJobResult): void {
  if (dropWorker()) regexWorkerCounts.restarts++;
  const r = running;
  running = null;
  if (r) {
    clearTimeout(r.timer);
    settle(r, reason);
  }
  // A thread that cannot start fails every job waiting for it rather than keep them forever.
  if (reason.kind === 'failed' && !r) for (const q of queue.splice(0)) settle(q, reason);
  pump();
}

function spawn(): Worker {
  const w = new Worker(WORKER_URL);
  startup = setTimeout(() => retire({ kind: 'failed', code: undefined, message: `the regex worker thread did not start within ${REGEX_WORKER_LIMITS.startupMs} ms` }), REGEX_WORKER_LIMITS.startupMs);
  startup.unref();
  w.on('message', (m: RegexMessage) => {
    if (w !== worker) return;
    if (m.type === 'ready') {
      ready = true;
      clearTimeout(startup);
      pump();
      return;
    }
    const r = running;
    if (!r || r.id !== m.id) return;
    clearTimeout(r.timer);
    running = null;
    if (m.type === 'done') settle(r, { kind: 'done', body: m.body ? Buffer.from(m.body.buffer, m.body.byteOffset, m.body.byteLength) : null });
    else settle(r, { kind: 'failed', code: m.code as UrlActionErrorCode | undefined, message: m.message });
    pump();
  });
  w.on('error', (err) => {
    if (w === worker) retire({ kind: 'failed', code: undefined, message: `the regex worker thread failed: ${err.message}` });
  });
  w.on('exit', (code) => {
    if (w === worker) retire({ kind: 'failed', code: undefined, message: `the regex worker thread exited (code ${code})` });
  });
  return w;
}

function pump(): void {
  if (running || queue.length === 0) {
    // Idle: the thread does not keep the process alive.
    if (!running) worker?.unref();
    return;
  }
  if (!worker) {
    try {
      worker = spawn();
    } catch (err) {
      for (const q of queue.splice(0)) settle(q, { kind: 'failed', code: undefined, message: `the regex worker thread could not start: ${(err as Error).message}` });
      return;
    }
  }
  worker.ref();
  if (!ready) return;
  const q = queue.shift()!;
  running = q;
  const body = q.job.body;
  worker.postMessage(q.job, [body.buffer as ArrayBuffer]);
  running.timer = setTimeout(() => {
    if (running?.id !== q.id) return;
    retire({ kind: 'timeout' });
  }, REGEX_WORKER_LIMITS.timeoutMs);
}

/**
 * Rewrites `body` (valid UTF-8, at most `workerBodyBytes`) with one action (`config`, compiled
 * for `direction`, its `${…}` texts `values` in the order of its programs) on the regex worker
 * thread; `key` is the action, for `perAction`. null when the limits are reached (`busy`).
 */
export function rewriteOnRegexWorker(key: object, direction: PolicyDirection, config: FindReplaceConfig, values: string[], body: Buffer): Promise<RegexJobResult> | null {
  const mine = perKey.get(key) ?? 0;
  if (regexWorkerJobs() >= REGEX_WORKER_LIMITS.jobs || mine >= REGEX_WORKER_LIMITS.perAction) return null;
  perKey.set(key, mine + 1);
  // A copy of its own, moved to the thread (the body may share a pooled ArrayBuffer).
  const copy = new Uint8Array(body);
  return new Promise((resolve) => {
    queue.push({ id: nextId, job: { id: nextId, direction, config, values, body: copy }, key, resolve });
    nextId++;
    pump();
  });
}

/**
 * Starts the thread if it is not running: called when a policy with such an action is compiled,
 * so that the first large body does not wait for the thread to load its modules (seconds on a
 * loaded node). Idle, it does not keep the process alive.
 */
export function warmRegexWorker(): void {
  if (worker) return;
  try {
    worker = spawn();
    worker.unref();
  } catch {
    // The first body tries again, and fails its job with the reason.
  }
}

/** Bodies queued or running now. */
export function regexWorkerJobs(): number {
  return queue.length + (running ? 1 : 0);
}

/** Stops the thread (tests; the process's exit does not wait for an idle one anyway). */
export async function stopRegexWorker(): Promise<void> {
  await dropWorker();
}
