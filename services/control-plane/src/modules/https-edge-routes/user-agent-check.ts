import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import os from 'node:os';
import { Worker } from 'node:worker_threads';
import { z } from 'zod';
import { AppError, userAgentListCheapWithin, type Logger, type UserAgentExploreBudget, type UserAgentPatternProblem } from '@warren/shared';
import { issueToError } from '../../http/validate.js';
import { joinPath } from '../https-edges/module-body.js';
import { UserAgentFilterRequest } from './route-modules.schema.js';
import type { CheckMessage, CheckRequest } from './user-agent-check.worker.js';

/**
 * The save-time cost check of `user_agent_filter` lists (shared `userAgentListCostProblem`),
 * off the event loop. A filter built to be costly (32 + 32 patterns) takes 0.4-0.65 s of CPU to
 * explore on a quiet 2-core box (1.3-2.3 s measured on a busy one); run in a request handler,
 * that stalls every account's API calls meanwhile. So:
 *
 * - a small list explored completely within `QUICK_BUDGET` (a handful of bot names) is accepted
 *   at once, on the event loop (a few ms at most; the verdict is the full check's, see
 *   `userAgentListCheapWithin`), without taking a worker or the account's turn;
 * - other lists go to a pool of worker threads (1 or 2, leaving a core to the event loop; started
 *   on first use, terminated by `close()`), at most one check per account at a time and at most
 *   `maxQueued` checks waiting for a worker, all accounts together; beyond either, 429
 *   `ERR_WARREN_8000` with `Retry-After`, as the API's rate limit answers;
 * - a check that takes more than `timeoutMs` of CPU time has its worker terminated and
 *   replaced, and the list it was on is refused as too costly to check (400 `ERR_WARREN_2104`
 *   naming the list). CPU time, the worker thread's (read from /proc on Linux; elsewhere wall
 *   time stands in), so that a busy box does not change an answer: there, checks measured
 *   2-5 times their CPU time in wall time. The exploration budget already bounds a check (see
 *   above; 2.3 s of CPU at most measured, cold, on a busy box), so the default, 5 s, is for what
 *   the budget misses. A check also ends after `wallLimit(timeoutMs)` of wall time (a starved
 *   worker);
 * - verdicts are kept in an LRU keyed by the account and a hash of both lists (`cacheSize`), so
 *   saving the same filter again costs nothing; identical checks of one account in flight at once
 *   share one run. Not shared across accounts: a fast answer would tell another account that
 *   someone had just saved the same lists.
 */

export interface UserAgentCheckOptions {
  /** Worker threads; default 1 or 2: `os.availableParallelism() - 1`, at least 1. */
  workers?: number;
  /** Checks waiting for a free worker, all accounts together (default 16); beyond it 429. */
  maxQueued?: number;
  /** CPU time one check may take in a worker (default 5,000 ms); beyond it, too costly to check. */
  timeoutMs?: number;
  /** Verdicts kept (default 512). */
  cacheSize?: number;
  log?: Logger;
}

export interface UserAgentChecks {
  /**
   * The cost problems of a filter's lists, allow first, as `userAgentFilterCostProblems` finds
   * them, or a list's "too costly to check" when the check ran out of time. Throws AppError 8000
   * (429) when the account already has a check running or too many checks are waiting.
   */
  problems(accountId: string, allow: readonly string[], deny: readonly string[]): Promise<UserAgentPatternProblem[]>;
  /** Counters, for tests and diagnosis. */
  stats(): { runs: number; cacheHits: number; quick: number; timeouts: number; workers: number; queued: number };
  /** Terminates the workers; checks waiting or running fail with 503. */
  close(): Promise<void>;
}

/**
 * A list is first explored on the event loop when it is this small (bytes of its patterns
 * together) and has no Unicode class (`\p{…}`, whose DFA has ~1,400 character classes to set
 * up), within `QUICK_BUDGET`: enough for a handful of bot names (`(?i)googlebot`, `(?i)bingbot`,
 * `curl/`, `^$`, `[Bb]ing`: ~1,250 transitions). That costs up to ~4 ms (~10 ms measured on a
 * loaded box), no more than the request schema's per-pattern checks of a filter of 32 + 32 long
 * patterns (~10-16 ms); anything else goes to a worker.
 */
export const QUICK_MAX_BYTES = 256;
export const QUICK_BUDGET: Readonly<UserAgentExploreBudget> = { steps: 1_500, work: 15_000 };

const DEFAULT_TIMEOUT_MS = 5_000;
const DEFAULT_MAX_QUEUED = 16;
const DEFAULT_CACHE_SIZE = 512;
/** How long a new worker may take to load its modules and warm up (~0.5 s; tsx compiles them on a first start). */
const STARTUP_TIMEOUT_MS = 30_000;

export function defaultUserAgentCheckWorkers(): number {
  return Math.max(1, Math.min(2, os.availableParallelism() - 1));
}

/** A bounded map that forgets the least recently used key first. */
export class LruCache<V> {
  private readonly map = new Map<string, V>();

  constructor(readonly capacity: number) {
    if (!(capacity >= 1)) throw new Error('LruCache: capacity must be at least 1');
  }

  get size(): number {
    return this.map.size;
  }

  get(key: string): V | undefined {
    const value = this.map.get(key);
    if (value === undefined) return undefined;
    this.map.delete(key);
    this.map.set(key, value);
    return value;
  }

  set(key: string, value: V): void {
    this.map.delete(key);
    this.map.set(key, value);
    if (this.map.size > this.capacity) this.map.delete(this.map.keys().next().value as string);
  }
}

/** The cache key of a filter: a hash of both lists (JSON keeps each pattern and list apart). */
export function userAgentFilterKey(allow: readonly string[], deny: readonly string[]): string {
  return createHash('sha256').update(JSON.stringify([allow, deny])).digest('base64url');
}

/** Wall time a check may take at most, whatever its CPU time. */
const wallLimit = (timeoutMs: number) => Math.max(30_000, 10 * timeoutMs);

/** Linux's USER_HZ: the unit of the times in /proc/<pid>/task/<tid>/stat. */
const CLOCK_TICKS_PER_S = 100;

/** CPU time (user + system) thread `tid` of this process has used, in ms (10 ms steps), or undefined. */
export function threadCpuMs(tid: number): number | undefined {
  try {
    const stat = readFileSync(`/proc/self/task/${tid}/stat`, 'utf8');
    // After "tid (comm) ": state is field 3, utime and stime are fields 14 and 15.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const ticks = Number(fields[11]) + Number(fields[12]);
    return Number.isFinite(ticks) ? (ticks * 1000) / CLOCK_TICKS_PER_S : undefined;
  } catch {
    return undefined;
  }
}

/** A JavaScript entry that loads user-agent-check.worker.ts through tsx (see there). */
const WORKER_URL = new URL('./user-agent-check.worker.mjs', import.meta.url);

interface Job {
  allow: string[];
  deny: string[];
  resolve(r: { problems: UserAgentPatternProblem[]; timedOut: boolean }): void;
  reject(err: Error): void;
}

interface Running extends Job {
  id: number;
  /** The list the worker is on. */
  current: 'allow' | 'deny';
  problems: UserAgentPatternProblem[];
  timer?: NodeJS.Timeout;
}

interface Slot {
  worker: Worker;
  ready: boolean;
  /** The worker's thread id in the kernel (Linux), to read its CPU time. */
  tid?: number;
  /** Terminated (timed out, failed or closed): its events are ignored. */
  gone: boolean;
  job?: Running;
  startup?: NodeJS.Timeout;
}

/** 429 `ERR_WARREN_8000` with `Retry-After`, as the account rate limit answers. */
function busy(what: string, retryAfter: number): AppError {
  return new AppError(8000, `${what}; retry in ${retryAfter} s`, { headers: { 'Retry-After': String(retryAfter) } });
}

export function createUserAgentChecks(opts: UserAgentCheckOptions = {}): UserAgentChecks {
  const size = Math.max(1, opts.workers ?? defaultUserAgentCheckWorkers());
  const maxQueued = Math.max(0, opts.maxQueued ?? DEFAULT_MAX_QUEUED);
  const timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  const cache = new LruCache<UserAgentPatternProblem[]>(opts.cacheSize ?? DEFAULT_CACHE_SIZE);
  const inflight = new Map<string, Promise<UserAgentPatternProblem[]>>();
  const busyAccounts = new Set<string>();
  const queue: Job[] = [];
  const slots: Slot[] = [];
  const counts = { runs: 0, cacheHits: 0, quick: 0, timeouts: 0 };
  let nextId = 1;
  let closed = false;

  const quick = (patterns: readonly string[]) =>
    patterns.length === 0 ||
    (patterns.reduce((n, p) => n + Buffer.byteLength(p, 'utf8'), 0) <= QUICK_MAX_BYTES && !patterns.some((p) => /\\[pP]/.test(p)) && userAgentListCheapWithin(patterns, { ...QUICK_BUDGET }));

  function retire(slot: Slot): void {
    slot.gone = true;
    clearTimeout(slot.startup);
    clearTimeout(slot.job?.timer);
    const i = slots.indexOf(slot);
    if (i >= 0) slots.splice(i, 1);
    void slot.worker.terminate().catch(() => {});
  }

  function fail(slot: Slot, err: Error): void {
    if (slot.gone) return;
    const job = slot.job;
    retire(slot);
    opts.log?.error({ err }, 'user_agent_filter check worker failed');
    job?.reject(err);
    pump();
  }

  function post(slot: Slot, job: Running): void {
    const req: CheckRequest = { id: job.id, allow: job.allow, deny: job.deny };
    slot.worker.postMessage(req);
    const started = performance.now();
    const cpuAtStart = slot.tid === undefined ? undefined : threadCpuMs(slot.tid);
    const expire = () => {
      if (slot.gone || slot.job !== job) return;
      const elapsed = performance.now() - started;
      const cpu = cpuAtStart === undefined ? undefined : threadCpuMs(slot.tid!);
      const used = cpu === undefined ? elapsed : cpu - cpuAtStart!;
      if (used < timeoutMs && elapsed < wallLimit(timeoutMs)) {
        // Preempted part of the time: wait for the rest of its CPU time.
        job.timer = setTimeout(expire, Math.max(10, timeoutMs - used));
        return;
      }
      counts.timeouts++;
      retire(slot);
      const patterns = job.current === 'allow' ? job.allow : job.deny;
      opts.log?.warn({ list: job.current, patterns: patterns.length, timeout_ms: timeoutMs, cpu_ms: used, wall_ms: Math.round(elapsed) }, 'user_agent_filter check ran out of time; worker replaced');
      job.problems.push({
        list: job.current,
        message: `too costly to check: checking the ${patterns.length} ${job.current} patterns took more than ${timeoutMs} ms${cpu === undefined ? '' : ' of CPU time'} (each list is matched in one pass, as one RE2 program, whose automaton (DFA) must be small); remove some patterns, merge similar ones or make them simpler`,
      });
      job.resolve({ problems: job.problems, timedOut: true });
      pump();
    };
    job.timer = setTimeout(expire, timeoutMs);
  }

  function onMessage(slot: Slot, m: CheckMessage): void {
    if (slot.gone) return;
    if (m.type === 'ready') {
      slot.ready = true;
      slot.tid = m.tid;
      clearTimeout(slot.startup);
      if (slot.job) post(slot, slot.job);
      return;
    }
    const job = slot.job;
    if (!job || m.id !== job.id) return;
    if (m.type === 'failed') {
      clearTimeout(job.timer);
      slot.job = undefined;
      slot.worker.unref();
      job.reject(new Error(`user_agent_filter check failed in its worker: ${m.message}`));
      pump();
      return;
    }
    if (m.problem) job.problems.push(m.problem);
    if (m.list === 'allow') {
      job.current = 'deny';
      return;
    }
    clearTimeout(job.timer);
    slot.job = undefined;
    slot.worker.unref();
    job.resolve({ problems: job.problems, timedOut: false });
    pump();
  }

  function spawn(): Slot {
    const worker = new Worker(WORKER_URL);
    const slot: Slot = { worker, ready: false, gone: false };
    slot.startup = setTimeout(() => fail(slot, new Error(`the user_agent_filter check worker did not start within ${STARTUP_TIMEOUT_MS} ms`)), STARTUP_TIMEOUT_MS);
    slot.startup.unref();
    worker.on('message', (m: CheckMessage) => onMessage(slot, m));
    worker.on('error', (err) => fail(slot, err));
    worker.on('exit', (code) => fail(slot, new Error(`the user_agent_filter check worker exited (code ${code})`)));
    slots.push(slot);
    return slot;
  }

  function pump(): void {
    while (queue.length > 0 && !closed) {
      let slot = slots.find((s) => !s.job);
      if (!slot) {
        if (slots.length >= size) return;
        try {
          slot = spawn();
        } catch (err) {
          queue.shift()!.reject(err as Error);
          continue;
        }
      }
      const job: Running = { ...queue.shift()!, id: nextId++, current: 'allow', problems: [] };
      counts.runs++;
      slot.job = job;
      slot.worker.ref();
      if (slot.ready) post(slot, job);
    }
  }

  const hasFreeWorker = () => slots.length < size || slots.some((s) => !s.job);

  async function run(key: string, accountId: string, allow: string[], deny: string[]): Promise<UserAgentPatternProblem[]> {
    try {
      const r = await new Promise<{ problems: UserAgentPatternProblem[]; timedOut: boolean }>((resolve, reject) => {
        queue.push({ allow, deny, resolve, reject });
        pump();
      });
      // A time-out depends on the load of the moment: not a verdict to keep.
      if (!r.timedOut) cache.set(key, r.problems);
      return r.problems;
    } finally {
      busyAccounts.delete(accountId);
      inflight.delete(key);
    }
  }

  return {
    async problems(accountId, allow, deny) {
      if (closed) throw new AppError(9002);
      const key = `${accountId}:${userAgentFilterKey(allow, deny)}`;
      const cached = cache.get(key);
      if (cached) {
        counts.cacheHits++;
        return cached;
      }
      const same = inflight.get(key);
      if (same) return same;
      if (quick(allow) && quick(deny)) {
        counts.quick++;
        cache.set(key, []);
        return [];
      }
      // Retry-After: a costly check takes about a second; the account's own is running, or
      // those waiting are ahead.
      if (busyAccounts.has(accountId)) throw busy('another user_agent_filter check of this account is running (one at a time)', 1);
      if (!hasFreeWorker() && queue.length >= maxQueued) throw busy('too many user_agent_filter checks are waiting on this server', Math.ceil((queue.length + 1) / size));
      busyAccounts.add(accountId);
      const p = run(key, accountId, [...allow], [...deny]);
      inflight.set(key, p);
      return p;
    },

    stats() {
      return { ...counts, workers: slots.length, queued: queue.length };
    },

    async close() {
      if (closed) return;
      closed = true;
      const draining = new AppError(9002, 'the server is draining; retry the user_agent_filter save on another replica or later');
      for (const job of queue.splice(0)) job.reject(draining);
      const all = slots.splice(0);
      for (const slot of all) {
        slot.gone = true;
        clearTimeout(slot.startup);
        clearTimeout(slot.job?.timer);
        slot.job?.reject(draining);
      }
      await Promise.all(all.map((s) => s.worker.terminate().catch(() => 0)));
    },
  };
}

/**
 * Refuses the filter when a list is too costly to match (or to check), as the request schema
 * did: 400 `ERR_WARREN_2104` naming `<prefix>.allow`/`deny`, or one pattern `…[i]`, with the
 * message `<field>: <problem>`. The first problem is reported (allow before deny).
 */
export async function checkUserAgentFilter(
  checks: UserAgentChecks,
  accountId: string,
  filter: { allow?: string[] | null; deny?: string[] | null },
  prefix: string,
): Promise<void> {
  const [p] = await checks.problems(accountId, filter.allow ?? [], filter.deny ?? []);
  if (!p) return;
  const field = joinPath(prefix, p.list) + (p.index === undefined ? '' : `[${p.index}]`);
  throw new AppError(2104, `${field}: ${p.message}`, { field });
}

const USER_AGENT_KEY = 'user_agent_filter';

/**
 * `parseBody` of a route body (POST and PATCH), with the `user_agent_filter` cost check
 * (`checkUserAgentFilter`) the schema no longer runs itself, reported as the schema reported it:
 * its issue came after every issue of the fields before `user_agent_filter` and of the filter
 * itself, and before those of the fields after it (`traffic_policy`, `policy`) and unknown
 * fields. So when the first issue is one of these, the filter, if valid, is checked first.
 */
export async function parseRouteBody<T extends z.ZodObject<z.core.$ZodShape, z.core.$ZodObjectConfig>>(
  schema: T,
  body: Record<string, unknown>,
  checks: UserAgentChecks,
  accountId: string,
): Promise<z.output<T>> {
  const r = schema.safeParse(body);
  if (r.success) {
    const filter = (r.data as Record<string, unknown>)[USER_AGENT_KEY] as z.output<typeof UserAgentFilterRequest> | null | undefined;
    if (filter) await checkUserAgentFilter(checks, accountId, filter, USER_AGENT_KEY);
    return r.data;
  }
  const first = r.error.issues[0]!;
  const keys = Object.keys(schema.shape);
  const key = first.path[0];
  const after = first.path.length === 0 || (typeof key === 'string' && keys.indexOf(key) > keys.indexOf(USER_AGENT_KEY));
  if (after && body[USER_AGENT_KEY] != null) {
    const filter = UserAgentFilterRequest.safeParse(body[USER_AGENT_KEY]);
    if (filter.success) await checkUserAgentFilter(checks, accountId, filter.data, USER_AGENT_KEY);
  }
  throw issueToError(first, body);
}
