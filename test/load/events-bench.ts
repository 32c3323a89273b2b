/**
 * Event pipeline bench (performance.md §5, goals §6; not part of `npm test`):
 *
 *   npm run bench:events            (or: npx tsx test/load/events-bench.ts; about 2 minutes)
 *
 * Phases (BENCH_PHASES, default all: enqueue,noop,delivery,e2e):
 * 1. enqueue: `EventProducer.publish` of BENCH_EVENTS (100k) 1 KB envelopes in batches of
 *    BENCH_BATCH (1,000) across BENCH_ENQUEUE_DESTS (1,20) destinations, with
 *    BENCH_ENQUEUE_INFLIGHT (1,4) calls in flight (1 = awaiting each call, as the relay does) →
 *    events/s, CPU µs per event of this process and of redis-server. No worker runs.
 * 2. noop: bullmq alone: `addBulk` of BENCH_NOOP_JOBS (50k) no-op jobs in batches of 1,000
 *    (jobs/s), then one Worker process (this file with `--noop-worker`, core 1) at
 *    BENCH_NOOP_CONCURRENCY (50) drains them → jobs/s. BENCH_NOOP_REMOVE=all removes completed
 *    jobs at once instead of keeping 1,000.
 * 3. delivery: one real worker process (`node --import tsx services/worker/src/main.ts`, core 1)
 *    per WORKER_CONCURRENCY in BENCH_CONCURRENCY (1,10,50); for each destination count in
 *    BENCH_DESTS (1,10,50): the Datadog queue is paused, BENCH_DELIVERY_EVENTS (= BENCH_EVENTS)
 *    envelopes are published (the backlog), the queue is resumed and the time until the sink
 *    (events-sink.ts, core 0) has them all is taken: events/s = N ÷ drain time; worker, redis
 *    and sink CPU µs per event (utime+stime from /proc) and the worker's share of a core;
 *    requests and events per request; top Redis commands per event; what completed flush jobs
 *    keep in Redis. BENCH_RUN_TIMEOUT (120 s) bounds a drain.
 * 4. e2e: a real control plane (core 0) + worker (concurrency 50, core 1) + sink in parse mode;
 *    a Datadog destination subscribed to `ip_policy_updated.v0`; BENCH_E2E_RATE PATCH/s (50,
 *    open loop) for BENCH_E2E_SECONDS (20) spread over 10 ip policies, each with a new metadata
 *    counter; latency = sink receipt − PATCH response (and − PATCH sent), matched by object id +
 *    metadata. Then the producer alone → sink at each rate of BENCH_LAT_RATE (default 1,000/s
 *    and half of the measured 1-destination delivery rate) for BENCH_LAT_SECONDS (10): latency =
 *    sink receipt − publish() resolved, matched by event id. Both include the producer linger
 *    (DEFAULT_LINGER_MS, 10 ms; BENCH_LAT_LINGER_MS sets the bench producer's for the second part).
 *
 * This process (the producer, the PATCH client) pins itself to core 0 and the sink runs there;
 * the worker runs alone on core 1 (BENCH_PIN=0 turns pinning off). Redis (REDIS_URL) and Postgres
 * (TEST_DATABASE_URL) are the shared local servers, not pinned; BENCH_REDIS=private starts a
 * redis-server of our own instead (BENCH_REDIS_CORE=n pins it). Everything lives under a unique
 * Redis prefix and a bench database; both, and every child process, are removed at the end,
 * also on failure or Ctrl-C. BENCH_ROUNDS (1) repeats the delivery cases (interleaved) and
 * reports medians with min–max. BENCH_CPU_PROF=<dir> writes V8 CPU profiles of each worker
 * (one directory per worker; the main thread's is the larger file).
 * Prints tables and the §6 verdicts; writes test/load/results/events.json.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import http from 'node:http';
import { mkdirSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import os from 'node:os';
import { Queue, Worker } from 'bullmq';
import { Redis } from 'ioredis';
import type pg from 'pg';
import { DEFAULT_LINGER_MS, TARGET_QUEUES, bufferKey, type DestinationRef } from '@warren/shared';
import { EventProducer } from '../../services/shared/src/events/producer.js';
import { REPO_ROOT, startControlPlane, type ControlPlaneProcess } from '../support/processes.js';
import { startRedisServer, type RedisServer } from '../support/redis-server.js';
import { deleteKeys as deleteMatching } from '../support/redis-keys.js';
import { benchDatabase, cpuMicros, fmt, log, machine, percentile } from './support.js';
import type { SinkRecord, SinkStats } from './events-sink.js';

const env = process.env;
const list = (v: string | undefined, d: string) => (v ?? d).split(',').map((s) => s.trim()).filter(Boolean);
// BENCH_REDIS=private: a redis-server of our own (no persistence) instead of the shared one, so
// its CPU counts only this bench; BENCH_REDIS_CORE pins it (e.g. 1, next to the worker, as §2 does
// for the rate limiter).
let REDIS_URL = env.REDIS_URL ?? env.TEST_REDIS_URL ?? 'redis://127.0.0.1:6379';
const PHASES = new Set(list(env.BENCH_PHASES, 'enqueue,noop,delivery,e2e'));
const EVENTS = Number(env.BENCH_EVENTS ?? 100_000);
const DELIVERY_EVENTS = Number(env.BENCH_DELIVERY_EVENTS ?? EVENTS);
const BATCH = Number(env.BENCH_BATCH ?? 1000);
const ENQUEUE_DESTS = list(env.BENCH_ENQUEUE_DESTS, '1,20').map(Number);
const ENQUEUE_INFLIGHT = list(env.BENCH_ENQUEUE_INFLIGHT, '1,4').map(Number);
const CONCURRENCY = list(env.BENCH_CONCURRENCY, '1,10,50').map(Number);
const DESTS = list(env.BENCH_DESTS, '1,10,50').map(Number);
const ROUNDS = Number(env.BENCH_ROUNDS ?? 1);
const RUN_TIMEOUT_S = Number(env.BENCH_RUN_TIMEOUT ?? 120);
const NOOP_JOBS = Number(env.BENCH_NOOP_JOBS ?? 50_000);
const NOOP_CONCURRENCY = list(env.BENCH_NOOP_CONCURRENCY, '50').map(Number);
// removeOnComplete of the no-op jobs: `count` (keep the last 1,000, as the flush jobs do) or `all` (remove at once).
const NOOP_REMOVE = env.BENCH_NOOP_REMOVE === 'all' ? 'all' : 'count';
const noopRemoveOnComplete = { count: NOOP_REMOVE === 'all' ? 0 : 1000 };
const E2E_RATE = Number(env.BENCH_E2E_RATE ?? 50);
const E2E_SECONDS = Number(env.BENCH_E2E_SECONDS ?? 20);
const E2E_POLICIES = 10;
const LAT_SECONDS = Number(env.BENCH_LAT_SECONDS ?? 10);
/** Linger of the bench's own producer in the producer → sink runs (default: the production default). */
const LAT_LINGER_MS = env.BENCH_LAT_LINGER_MS === undefined ? DEFAULT_LINGER_MS : Number(env.BENCH_LAT_LINGER_MS);
const PIN = env.BENCH_PIN !== '0' && os.cpus().length >= 2;
const CPU_PROF = env.BENCH_CPU_PROF;
const EVENT_BYTES = 1024;
const RESULTS = fileURLToPath(new URL('./results/events.json', import.meta.url));
const DD_KEY = 'bench-dd-api-key';
const PREFIX = `warren_evbench_${Date.now().toString(36)}_${randomBytes(3).toString('hex')}`;

const now = () => performance.timeOrigin + performance.now();
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const median = (xs: number[]) => {
  const s = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  return s.length ? s[Math.floor(s.length / 2)]! : NaN;
};
const round1 = (x: number) => Math.round(x * 10) / 10;
function stats(xs: number[]) {
  const s = [...xs].sort((a, b) => a - b);
  return { n: s.length, p50: round1(percentile(s, 50)), p90: round1(percentile(s, 90)), p99: round1(percentile(s, 99)), max: round1(s[s.length - 1] ?? NaN), mean: round1(s.reduce((a, b) => a + b, 0) / (s.length || 1)) };
}
const perEvent = (a0: number | undefined, a1: number | undefined, n: number) => (a0 !== undefined && a1 !== undefined && n > 0 ? round1((a1 - a0) / n) : undefined);

// ---------------------------------------------------------------------------------------------
// Child processes (pinned with taskset), cleaned up on every exit path.

interface Child {
  child: ChildProcess;
  pid: number;
  output(): string;
  exited: Promise<void>;
  /** The next IPC message of this type. */
  next<T = Record<string, unknown>>(type: string, timeoutMs?: number): Promise<T>;
  stop(signal?: NodeJS.Signals, timeoutMs?: number): Promise<void>;
}

const live = new Set<ChildProcess>();
process.once('exit', () => {
  for (const c of live) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
});

function spawnNode(core: number | null, args: string[], childEnv: Record<string, string | undefined>, name: string): Child {
  const nodeArgs = [process.execPath, ...args];
  const [cmd, argv] = PIN && core !== null ? ['taskset', ['-c', String(core), ...nodeArgs]] : [nodeArgs[0]!, nodeArgs.slice(1)];
  const e: Record<string, string> = {};
  for (const [k, v] of Object.entries({ ...process.env, ...childEnv })) if (v !== undefined) e[k] = v;
  // taskset execs node in place: the pid, the IPC channel and signals are the node process's.
  const child = spawn(cmd, argv as string[], { cwd: REPO_ROOT, env: e, stdio: ['ignore', 'pipe', 'pipe', 'ipc'] });
  live.add(child);
  let out = '';
  const add = (d: Buffer) => (out = (out + d.toString()).slice(-32_768));
  child.stdout!.on('data', add);
  child.stderr!.on('data', add);
  const exited = new Promise<void>((resolve) =>
    child.once('exit', () => {
      live.delete(child);
      resolve();
    }),
  );
  child.once('error', (err) => add(Buffer.from(`[spawn error] ${err.message}\n`)));
  return {
    child,
    pid: child.pid!,
    output: () => out,
    exited,
    next<T>(type: string, timeoutMs = 30_000): Promise<T> {
      return new Promise<T>((resolve, reject) => {
        const onMsg = (m: { type?: string }) => {
          if (m?.type !== type) return;
          done();
          resolve(m as T);
        };
        const timer = setTimeout(() => {
          done();
          reject(new Error(`${name} (pid ${child.pid}): no '${type}' message within ${timeoutMs} ms\n--- output ---\n${out.trim()}\n---`));
        }, timeoutMs);
        const onExit = () => {
          done();
          reject(new Error(`${name} (pid ${child.pid}) exited (code ${child.exitCode}, signal ${child.signalCode}) while waiting for '${type}'\n--- output ---\n${out.trim()}\n---`));
        };
        const done = () => {
          clearTimeout(timer);
          child.off('message', onMsg);
          child.off('exit', onExit);
        };
        child.on('message', onMsg);
        child.once('exit', onExit);
      });
    },
    async stop(signal = 'SIGTERM', timeoutMs = 15_000) {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill(signal);
      const t = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
      await exited;
      clearTimeout(t);
    },
  };
}

/** Pins a running process (all its threads; later threads inherit it) to one core. */
function pin(pid: number, core: number): void {
  if (!PIN) return;
  try {
    execFileSync('taskset', ['-a', '-pc', String(core), String(pid)], { stdio: 'ignore' });
  } catch (err) {
    log(`taskset on ${pid} failed: ${(err as Error).message}`);
  }
}

async function startSink(): Promise<Child & { url: string; ask<T>(msg: Record<string, unknown>, reply: string): Promise<T> }> {
  const c = spawnNode(0, ['--import', 'tsx', fileURLToPath(new URL('./events-sink.ts', import.meta.url))], {}, 'sink');
  const { port } = await c.next<{ port: number }>('listening');
  // One request at a time (the bench never overlaps them), so replies match by type.
  const ask = async <T>(msg: Record<string, unknown>, reply: string): Promise<T> => {
    const p = c.next<T>(reply, 10_000);
    c.child.send(msg);
    return p;
  };
  return { ...c, url: `http://127.0.0.1:${port}`, ask };
}

async function startWorker(o: { prefix: string; concurrency: number; databaseUrl: string; sinkUrl: string; tag: string }): Promise<Child> {
  // One directory per worker: node writes a profile per thread (the tsx loader has its own).
  const prof = CPU_PROF ? ['--cpu-prof', `--cpu-prof-dir=${CPU_PROF}/worker-${o.tag}`] : [];
  const c = spawnNode(
    1,
    [...prof, '--import', 'tsx', 'services/worker/src/main.ts'],
    {
      DATABASE_URL: o.databaseUrl,
      REDIS_URL,
      EVENTS_PREFIX: o.prefix,
      WORKER_CONCURRENCY: String(o.concurrency),
      DATADOG_BASE_URL: o.sinkUrl,
      METRICS_PORT: '0',
      LOG_LEVEL: 'warn',
      SHUTDOWN_TIMEOUT_MS: '5000',
      VITEST: undefined,
    },
    `worker c=${o.concurrency}`,
  );
  await c.next('listening', 60_000);
  return c;
}

// ---------------------------------------------------------------------------------------------
// Redis helpers

// Created in main() (the --noop-worker child needs none).
let admin: Redis;

const deleteKeys = (match: string): Promise<number> => deleteMatching(admin, match);

async function producerConnection(): Promise<Redis> {
  const c = new Redis(REDIS_URL, { enableOfflineQueue: false, maxRetriesPerRequest: 1, lazyConnect: true });
  await c.connect();
  return c;
}

async function unfinished(q: Queue): Promise<number> {
  const c = await q.getJobCounts('active', 'waiting', 'delayed', 'prioritized', 'waiting-children');
  return Object.values(c).reduce((a, b) => a + b, 0);
}

type CmdStats = Map<string, { calls: number; usec: number }>;

/** Redis `INFO commandstats` (calls and µs per command; script-internal commands count too). */
async function commandStats(): Promise<CmdStats> {
  const m: CmdStats = new Map();
  for (const x of (await admin.info('commandstats')).matchAll(/cmdstat_([\w|]+):calls=(\d+),usec=(\d+)/g)) m.set(x[1]!, { calls: Number(x[2]), usec: Number(x[3]) });
  return m;
}

/** The top commands between two snapshots, per unit (event or job): `evalsha 2.1 calls 35 µs`. Other clients of a shared Redis count too. */
function topCommands(a: CmdStats, b: CmdStats, per: number, k = 6): Record<string, { calls: number; us: number }> {
  const d = [...b].map(([name, v]) => ({ name, calls: v.calls - (a.get(name)?.calls ?? 0), usec: v.usec - (a.get(name)?.usec ?? 0) })).filter((x) => x.calls > 0);
  d.sort((x, y) => y.usec - x.usec);
  return Object.fromEntries(d.slice(0, k).map((x) => [x.name, { calls: Math.round((x.calls / per) * 1000) / 1000, us: Math.round((x.usec / per) * 100) / 100 }]));
}

// ---------------------------------------------------------------------------------------------
// Envelopes: wire-conventions §11 shape, padded to exactly EVENT_BYTES of JSON.

function envelopes(n: number, tag: string, accountId = 'ac_bench'): string[] {
  const ts = new Date(Math.floor(Date.now() / 1000) * 1000).toISOString().replace('.000Z', 'Z');
  const make = (i: number, pad: string) =>
    JSON.stringify({
      event_id: `ev_${tag}_${String(i).padStart(8, '0')}`,
      event_type: 'ip_policy_updated.v0',
      event_timestamp: ts,
      account_id: accountId,
      object: { id: 'ipp_2bench0000000000000000000', uri: 'https://api.example.test/ip_policies/ipp_2bench0000000000000000000', created_at: ts, description: pad, metadata: '' },
      principal: null,
    });
  const padLen = Math.max(0, EVENT_BYTES - make(0, '').length);
  const pad = 'x'.repeat(padLen);
  return Array.from({ length: n }, (_, i) => make(i, pad));
}

/** Splits events[i, i+batch) over the destinations round-robin in contiguous slices. */
function batchItems(events: string[], from: number, to: number, dests: DestinationRef[]) {
  const n = to - from;
  const per = Math.floor(n / dests.length);
  let extra = n % dests.length;
  let at = from;
  return dests.map((dest) => {
    const take = per + (extra-- > 0 ? 1 : 0);
    const slice = events.slice(at, at + take);
    at += take;
    return { dest, events: slice };
  });
}

interface EnqueueResult {
  destinations: number;
  inflight: number;
  events: number;
  seconds: number;
  events_per_s: number;
  bench_cpu_us_per_event?: number;
  redis_cpu_us_per_event?: number;
  accepted: number;
  overflowed: number;
}

async function enqueue(producer: EventProducer, events: string[], dests: DestinationRef[], inflight: number, redisPid: number): Promise<EnqueueResult> {
  let next = 0;
  let accepted = 0;
  let overflowed = 0;
  const c0 = cpuMicros(process.pid);
  const r0 = cpuMicros(redisPid);
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: inflight }, async () => {
      for (;;) {
        const from = next;
        if (from >= events.length) return;
        next = Math.min(events.length, from + BATCH);
        const r = await producer.publish(batchItems(events, from, next, dests));
        accepted += r.accepted;
        overflowed += r.overflowed;
      }
    }),
  );
  const seconds = (performance.now() - t0) / 1000;
  return {
    destinations: dests.length,
    inflight,
    events: events.length,
    seconds: Math.round(seconds * 1000) / 1000,
    events_per_s: Math.round(events.length / seconds),
    bench_cpu_us_per_event: perEvent(c0, cpuMicros(process.pid), events.length),
    redis_cpu_us_per_event: perEvent(r0, cpuMicros(redisPid), events.length),
    accepted,
    overflowed,
  };
}

// ---------------------------------------------------------------------------------------------
// Phase 1: enqueue rate

async function phaseEnqueue(events: string[], redisPid: number): Promise<EnqueueResult[]> {
  const out: EnqueueResult[] = [];
  for (const d of ENQUEUE_DESTS) {
    for (const inflight of ENQUEUE_INFLIGHT) {
      const prefix = `${PREFIX}_enq`;
      const conn = await producerConnection();
      const producer = new EventProducer({ connection: conn, prefix, bufferCap: Math.max(100_000, events.length) });
      const dests: DestinationRef[] = Array.from({ length: d }, (_, i) => ({ id: `ed_enq${i}_${randomBytes(4).toString('hex')}`, kind: 'datadog' }));
      await producer.publish(batchItems(events, 0, Math.min(events.length, BATCH), [{ id: 'ed_warmup', kind: 'datadog' }])); // script load, Queue object
      await deleteKeys(`${prefix}:*`);
      const r = await enqueue(producer, events, dests, inflight, redisPid);
      out.push(r);
      log(`enqueue: ${d} dest(s), ${inflight} in flight: ${fmt(r.events_per_s)} events/s (${fmt(r.bench_cpu_us_per_event, 1)} µs/event here, ${fmt(r.redis_cpu_us_per_event, 1)} in redis)`);
      await producer.close();
      conn.disconnect();
      await deleteKeys(`${prefix}:*`);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Phase 2: bullmq no-op jobs

async function noopWorkerRole(): Promise<void> {
  const w = new Worker(env.NOOP_QUEUE!, async () => {}, {
    connection: { url: REDIS_URL, maxRetriesPerRequest: null },
    prefix: env.NOOP_PREFIX!,
    concurrency: Number(env.NOOP_CONCURRENCY),
    autorun: false,
    removeOnComplete: noopRemoveOnComplete,
  });
  w.on('error', (err) => console.error('noop worker error', err.message));
  await w.waitUntilReady();
  process.on('message', (m: { type?: string }) => {
    if (m?.type === 'go') void w.run();
  });
  const stop = () => void w.close().finally(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('disconnect', stop);
  process.send!({ type: 'ready' });
}

interface NoopResult {
  concurrency: number;
  remove_on_complete: string;
  jobs: number;
  add_bulk_jobs_per_s: number;
  jobs_per_s: number;
  seconds: number;
  worker_cpu_us_per_job?: number;
  redis_cpu_us_per_job?: number;
  redis_commands_per_job: Record<string, { calls: number; us: number }>;
}

async function phaseNoop(redisPid: number): Promise<NoopResult[]> {
  const out: NoopResult[] = [];
  for (const c of NOOP_CONCURRENCY) {
    const prefix = `${PREFIX}_noop`;
    const name = `noop-c${c}`;
    const q = new Queue(name, { connection: admin, prefix });
    await q.addBulk([{ name: 'noop', data: {} }]); // warm-up
    await q.drain();
    const jobs = Array.from({ length: NOOP_JOBS }, (_, i) => ({ name: 'noop', data: { i }, opts: { removeOnComplete: noopRemoveOnComplete } }));
    const t0 = performance.now();
    for (let i = 0; i < jobs.length; i += 1000) await q.addBulk(jobs.slice(i, i + 1000));
    const addRate = Math.round(NOOP_JOBS / ((performance.now() - t0) / 1000));
    const w = spawnNode(1, ['--import', 'tsx', fileURLToPath(import.meta.url), '--noop-worker'], { REDIS_URL, NOOP_QUEUE: name, NOOP_PREFIX: prefix, NOOP_CONCURRENCY: String(c) }, `noop worker c=${c}`);
    try {
      await w.next('ready', 60_000);
      const cs0 = await commandStats();
      const c0 = cpuMicros(w.pid);
      const r0 = cpuMicros(redisPid);
      const s0 = now();
      w.child.send({ type: 'go' });
      const deadline = s0 + RUN_TIMEOUT_S * 1000;
      while ((await unfinished(q)) > 0) {
        if (now() > deadline) throw new Error(`no-op jobs not drained within ${RUN_TIMEOUT_S} s`);
        await sleep(10);
      }
      const seconds = (now() - s0) / 1000;
      const r: NoopResult = {
        concurrency: c,
        remove_on_complete: NOOP_REMOVE,
        jobs: NOOP_JOBS,
        add_bulk_jobs_per_s: addRate,
        jobs_per_s: Math.round(NOOP_JOBS / seconds),
        seconds: Math.round(seconds * 1000) / 1000,
        worker_cpu_us_per_job: perEvent(c0, cpuMicros(w.pid), NOOP_JOBS),
        redis_cpu_us_per_job: perEvent(r0, cpuMicros(redisPid), NOOP_JOBS),
        redis_commands_per_job: topCommands(cs0, await commandStats(), NOOP_JOBS),
      };
      out.push(r);
      log(`noop: addBulk ${fmt(addRate)} jobs/s; 1 worker at concurrency ${c}: ${fmt(r.jobs_per_s)} jobs/s (${fmt(r.worker_cpu_us_per_job, 1)} µs/job worker, ${fmt(r.redis_cpu_us_per_job, 1)} redis)`);
    } finally {
      await w.stop();
      await q.close();
      await deleteKeys(`${prefix}:*`);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Phase 3: delivery throughput of one worker

interface DeliveryRun {
  concurrency: number;
  destinations: number;
  events: number;
  delivered: number;
  seconds: number;
  events_per_s: number;
  enqueue_events_per_s: number;
  requests: number;
  events_per_request: number;
  worker_cpu_us_per_event?: number;
  /** Worker CPU time ÷ drain time (1.0 = core 1 saturated). */
  worker_cpu_share?: number;
  redis_cpu_us_per_event?: number;
  sink_cpu_us_per_event?: number;
  /** Top Redis commands by time while draining, per event. */
  redis_commands_per_event: Record<string, { calls: number; us: number }>;
  timed_out: boolean;
  leftover_buffered: number;
  leftover_jobs: number;
  /** Completed flush jobs in Redis after the run (cumulative per worker) and the bytes of their job data. */
  completed_jobs_retained: { jobs: number; data_bytes: number; with_pending: number };
}

async function deliveryRun(o: {
  worker: Child;
  sink: Awaited<ReturnType<typeof startSink>>;
  pool: pg.Pool;
  accountId: string;
  prefix: string;
  concurrency: number;
  destinations: number;
  events: string[];
  redisPid: number;
}): Promise<DeliveryRun> {
  const n = o.events.length;
  const ids = Array.from({ length: o.destinations }, () => `ed_${randomBytes(8).toString('hex')}`);
  for (const id of ids)
    await o.pool.query(`INSERT INTO event_destinations (id, account_id, target_kind, target) VALUES ($1, $2, 'datadog', $3)`, [id, o.accountId, JSON.stringify({ api_key: DD_KEY, ddtags: '', service: 'warren', ddsite: 'datadoghq.com' })]);
  const dests: DestinationRef[] = ids.map((id) => ({ id, kind: 'datadog' }));
  const q = new Queue(TARGET_QUEUES.datadog, { connection: admin, prefix: o.prefix });
  const conn = await producerConnection();
  const producer = new EventProducer({ connection: conn, prefix: o.prefix, bufferCap: Math.max(100_000, n) });
  try {
    await q.pause();
    const enq = await enqueue(producer, o.events, dests, 1, o.redisPid);
    await sleep(150); // the flush jobs' linger (50 ms) is over: they are due when the queue resumes
    await o.sink.ask({ type: 'reset' }, 'reset');
    const cs0 = await commandStats();
    const w0 = cpuMicros(o.worker.pid);
    const r0 = cpuMicros(o.redisPid);
    const k0 = cpuMicros(o.sink.pid);
    const t0 = now();
    await q.resume();
    const deadline = t0 + RUN_TIMEOUT_S * 1000;
    let s: SinkStats;
    let timedOut = false;
    for (;;) {
      s = (await o.sink.ask<{ stats: SinkStats }>({ type: 'stats' }, 'stats')).stats;
      if (s.events >= n) break;
      if (now() > deadline) {
        timedOut = true;
        break;
      }
      await sleep(10);
    }
    const w1 = cpuMicros(o.worker.pid);
    const r1 = cpuMicros(o.redisPid);
    const k1 = cpuMicros(o.sink.pid);
    const cs1 = await commandStats();
    const end = timedOut ? now() : s.lastAt;
    const seconds = (end - t0) / 1000;
    // Sanity: every buffer empty and no job left once the last event arrived.
    let leftoverJobs = 0;
    const settle = now() + 10_000;
    while ((leftoverJobs = await unfinished(q)) > 0 && now() < settle) await sleep(20);
    let leftover = 0;
    for (const id of ids) leftover += await admin.llen(bufferKey(o.prefix, id));
    // What completed flush jobs keep in Redis (removeOnComplete: 1 h / 1,000 jobs), this worker's runs so far.
    const qkey = `${o.prefix}:${TARGET_QUEUES.datadog}`;
    const done = await admin.zrange(`${qkey}:completed`, '0', '-1');
    const pipe = admin.pipeline();
    for (const id of done) pipe.hstrlen(`${qkey}:${id}`, 'data');
    const sizes = ((await pipe.exec()) ?? []).map(([, v]) => Number(v) || 0);
    if (s.rejected) log(`  sink rejected ${s.rejected} requests`);
    return {
      concurrency: o.concurrency,
      destinations: o.destinations,
      events: n,
      delivered: s.events,
      seconds: Math.round(seconds * 1000) / 1000,
      events_per_s: Math.round(s.events / seconds),
      enqueue_events_per_s: enq.events_per_s,
      requests: s.requests,
      events_per_request: round1(s.events / Math.max(1, s.requests)),
      worker_cpu_us_per_event: perEvent(w0, w1, s.events),
      worker_cpu_share: w0 !== undefined && w1 !== undefined ? Math.round(((w1 - w0) / (seconds * 1e6)) * 100) / 100 : undefined,
      redis_cpu_us_per_event: perEvent(r0, r1, s.events),
      sink_cpu_us_per_event: perEvent(k0, k1, s.events),
      redis_commands_per_event: topCommands(cs0, cs1, Math.max(1, s.events)),
      timed_out: timedOut,
      leftover_buffered: leftover,
      leftover_jobs: leftoverJobs,
      completed_jobs_retained: { jobs: done.length, data_bytes: sizes.reduce((a, b) => a + b, 0), with_pending: sizes.filter((n) => n > 200).length },
    };
  } finally {
    await q.resume().catch(() => {});
    await producer.close();
    conn.disconnect();
    await q.close();
  }
}

interface DeliveryCase {
  concurrency: number;
  destinations: number;
  events: number;
  events_per_s: number;
  events_per_s_min_max: [number, number];
  worker_cpu_us_per_event: number;
  worker_cpu_share: number;
  redis_cpu_us_per_event: number;
  sink_cpu_us_per_event: number;
  events_per_request: number;
  enqueue_events_per_s: number;
  runs: DeliveryRun[];
}

async function phaseDelivery(db: { url: string; pool: pg.Pool; accountId: string }, redisPid: number): Promise<DeliveryCase[]> {
  const events = envelopes(DELIVERY_EVENTS, 'dlv', db.accountId);
  const sink = await startSink();
  const runs = new Map<string, DeliveryRun[]>();
  try {
    // Rounds outermost: drift of the shared box spreads over every case.
    for (let round = 0; round < ROUNDS; round++) {
      for (const c of CONCURRENCY) {
        const prefix = `${PREFIX}_c${c}`;
        const worker = await startWorker({ prefix, concurrency: c, databaseUrl: db.url, sinkUrl: sink.url, tag: `c${c}-r${round}` });
        try {
          for (const d of DESTS) {
            const r = await deliveryRun({ worker, sink, pool: db.pool, accountId: db.accountId, prefix, concurrency: c, destinations: d, events, redisPid });
            const key = `${c}|${d}`;
            runs.set(key, [...(runs.get(key) ?? []), r]);
            log(
              `delivery: concurrency ${c}, ${d} dest(s): ${fmt(r.events_per_s)} events/s over ${fmt(r.seconds, 2)} s; worker ${fmt(r.worker_cpu_us_per_event, 1)} µs/event (${fmt((r.worker_cpu_share ?? NaN) * 100)} % of a core), redis ${fmt(r.redis_cpu_us_per_event, 1)}, sink ${fmt(r.sink_cpu_us_per_event, 1)}; ${fmt(r.events_per_request, 0)} events/request` +
                (r.timed_out ? ` TIMED OUT (${r.delivered}/${r.events})` : '') +
                (r.leftover_buffered || r.leftover_jobs ? ` leftover: ${r.leftover_buffered} buffered, ${r.leftover_jobs} jobs` : ''),
            );
            if (r.delivered > r.events) log(`  ${r.delivered - r.events} duplicate deliveries`);
          }
        } finally {
          await worker.stop();
          if (worker.child.exitCode !== 0 && worker.child.exitCode !== null) log(`worker c=${c} exited ${worker.child.exitCode}:\n${worker.output()}`);
          await deleteKeys(`${prefix}:*`);
        }
      }
    }
  } finally {
    await sink.stop();
  }
  return [...runs.values()].map((rs) => {
    const pick = (f: (r: DeliveryRun) => number | undefined) => median(rs.map((r) => f(r) ?? NaN));
    const rates = rs.map((r) => r.events_per_s);
    return {
      concurrency: rs[0]!.concurrency,
      destinations: rs[0]!.destinations,
      events: rs[0]!.events,
      events_per_s: pick((r) => r.events_per_s),
      events_per_s_min_max: [Math.min(...rates), Math.max(...rates)],
      worker_cpu_us_per_event: pick((r) => r.worker_cpu_us_per_event),
      worker_cpu_share: pick((r) => r.worker_cpu_share),
      redis_cpu_us_per_event: pick((r) => r.redis_cpu_us_per_event),
      sink_cpu_us_per_event: pick((r) => r.sink_cpu_us_per_event),
      events_per_request: pick((r) => r.events_per_request),
      enqueue_events_per_s: pick((r) => r.enqueue_events_per_s),
      runs: rs,
    };
  });
}

// ---------------------------------------------------------------------------------------------
// Phase 4: end-to-end latency (API change → sink) and producer → sink latency

const agent = new http.Agent({ keepAlive: true, maxSockets: 32 });

function apiCall(cp: ControlPlaneProcess, apiKey: string, method: string, path: string, body?: unknown): Promise<{ status: number; body: any }> {
  const u = new URL(cp.baseUrl);
  const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        host: u.hostname,
        port: u.port,
        path,
        method,
        agent,
        headers: { authorization: `Bearer ${apiKey}`, 'ngrok-version': '2', ...(payload ? { 'content-type': 'application/json', 'content-length': String(payload.length) } : {}) },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          let json: unknown = text;
          try {
            json = text ? JSON.parse(text) : undefined;
          } catch {
            /* keep the text */
          }
          resolve({ status: res.statusCode ?? 0, body: json });
        });
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end(payload);
  });
}

async function ok(cp: ControlPlaneProcess, apiKey: string, method: string, path: string, body?: unknown): Promise<any> {
  const r = await apiCall(cp, apiKey, method, path, body);
  if (r.status >= 300) throw new Error(`${method} ${path}: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body;
}

interface E2EResult {
  rate_per_s: number;
  seconds: number;
  patches: number;
  patch_errors: number;
  delivered: number;
  missing: number;
  duplicates: number;
  patch_response_to_sink_ms: ReturnType<typeof stats>;
  patch_sent_to_sink_ms: ReturnType<typeof stats>;
  patch_request_ms: ReturnType<typeof stats>;
  sink_requests: number;
}

interface ProducerLatencyResult {
  rate_per_s: number;
  linger_ms: number;
  seconds: number;
  events: number;
  delivered: number;
  missing: number;
  publish_resolved_to_sink_ms: ReturnType<typeof stats>;
  publish_called_to_sink_ms: ReturnType<typeof stats>;
  publish_call_ms: ReturnType<typeof stats>;
  sink_requests: number;
  events_per_request: number;
  /** Buffer length sampled every 100 ms while publishing and draining. */
  buffer_backlog: { max: number; mean: number; samples: number };
  worker_cpu_us_per_event?: number;
  worker_cpu_share?: number;
  redis_cpu_us_per_event?: number;
  /** Top Redis commands by time, per sink request (≈ per flush batch). */
  redis_commands_per_request: Record<string, { calls: number; us: number }>;
  /** Flush jobs completed during the run (finished ≥ its start), and those created with the linger delay. */
  flush_jobs: { total: number; created_with_linger_delay: number };
  /** p99 of the events published in each second of the run: shows whether the tail is steady or bursts. */
  p99_ms_by_second: number[];
}

async function collect(sink: Awaited<ReturnType<typeof startSink>>, into: Map<string, number[]>, keyOf: (r: SinkRecord) => string | undefined): Promise<void> {
  const { records } = await sink.ask<{ records: SinkRecord[] }>({ type: 'records' }, 'records');
  for (const r of records) {
    const k = keyOf(r);
    if (k === undefined) continue;
    const l = into.get(k);
    if (l) l.push(r.at);
    else into.set(k, [r.at]);
  }
}

/** The producer alone → sink: `rate` events/s (1 KB) to one destination for LAT_SECONDS; latency per event_id. */
async function producerLatency(o: { sink: Awaited<ReturnType<typeof startSink>>; worker: Child; prefix: string; destId: string; accountId: string; rate: number; redisPid: number }): Promise<ProducerLatencyResult> {
  await o.sink.ask({ type: 'reset' }, 'reset');
  const conn = await producerConnection();
  const producer = new EventProducer({ connection: conn, prefix: o.prefix, lingerMs: LAT_LINGER_MS });
  const latTotal = Math.round(o.rate * LAT_SECONDS);
  const tag = `lat${o.rate}`;
  const latEvents = envelopes(latTotal, tag, o.accountId);
  const called = new Map<string, number>();
  const resolved = new Map<string, number>();
  const calls: number[] = [];
  const tick = 10; // ms: publish rate × 10 ms events every 10 ms
  const perTick = Math.max(1, Math.round((o.rate * tick) / 1000));
  const got2 = new Map<string, number[]>();
  const keyOf2 = (r: SinkRecord) => (r.id.startsWith(`ev_${tag}_`) ? r.id : undefined);
  const pending: Promise<void>[] = [];
  const s2 = now() + 20;
  log(`producer latency: ${latTotal} events at ${fmt(o.rate)}/s (${perTick} per ${tick} ms) to 1 destination …`);
  const cs0 = await commandStats();
  const r0 = cpuMicros(o.redisPid);
  const w0 = cpuMicros(o.worker.pid);
  const tw0 = now();
  // The destination's buffer length every 100 ms: a growing backlog means the worker falls behind.
  const backlog: number[] = [];
  const sampler = setInterval(() => void admin.llen(bufferKey(o.prefix, o.destId)).then((n) => backlog.push(n)), 100);
  for (let i = 0, k = 0; i < latTotal; i += perTick, k++) {
    const wait = s2 + k * tick - now();
    if (wait > 1) await sleep(wait);
    const batch = latEvents.slice(i, i + perTick);
    const ids = batch.map((_, j) => `ev_${tag}_${String(i + j).padStart(8, '0')}`);
    const t = now();
    for (const id of ids) called.set(id, t);
    pending.push(
      producer.publish([{ dest: { id: o.destId, kind: 'datadog' }, events: batch }]).then(() => {
        const t2 = now();
        calls.push(t2 - t);
        for (const id of ids) resolved.set(id, t2);
      }),
    );
    if (k % 100 === 99) await collect(o.sink, got2, keyOf2);
  }
  await Promise.all(pending);
  const until2 = now() + 15_000;
  for (;;) {
    await collect(o.sink, got2, keyOf2);
    if (got2.size >= latTotal || now() > until2) break;
    await sleep(50);
  }
  clearInterval(sampler);
  const w1 = cpuMicros(o.worker.pid);
  const r1 = cpuMicros(o.redisPid);
  const tw1 = now();
  const cs1 = await commandStats();
  const fromResolved: number[] = [];
  const fromCalled: number[] = [];
  const bySecond: number[][] = [];
  for (const [id, t] of resolved) {
    const at = got2.get(id);
    if (!at) continue;
    const l = Math.min(...at) - t;
    fromResolved.push(l);
    fromCalled.push(Math.min(...at) - called.get(id)!);
    (bySecond[Math.max(0, Math.floor((t - s2) / 1000))] ??= []).push(l);
  }
  const st2 = (await o.sink.ask<{ stats: SinkStats }>({ type: 'stats' }, 'stats')).stats;
  // The flush jobs of this run and how many were created with the linger delay: in steady load a
  // delayed one means a producer's add found no job (the previous one had just dropped its
  // deduplication key) and the destination then waited a full linger.
  const qkey = `${o.prefix}:${TARGET_QUEUES.datadog}`;
  const jobIds = await admin.zrangebyscore(`${qkey}:completed`, String(Math.floor(tw0)), '+inf');
  const jp = admin.pipeline();
  for (const id of jobIds) jp.hget(`${qkey}:${id}`, 'opts');
  const delays = ((await jp.exec()) ?? []).map(([, v]) => {
    try {
      return Number((JSON.parse(String(v)) as { delay?: number }).delay ?? 0);
    } catch {
      return 0;
    }
  });
  const flushJobs = { total: delays.length, created_with_linger_delay: delays.filter((d) => d > 0).length };
  await producer.close();
  conn.disconnect();
  const prod: ProducerLatencyResult = {
    rate_per_s: o.rate,
    linger_ms: LAT_LINGER_MS,
    seconds: LAT_SECONDS,
    events: latTotal,
    delivered: got2.size,
    missing: latTotal - got2.size,
    publish_resolved_to_sink_ms: stats(fromResolved),
    publish_called_to_sink_ms: stats(fromCalled),
    publish_call_ms: stats(calls),
    sink_requests: st2.requests,
    events_per_request: round1(st2.events / Math.max(1, st2.requests)),
    buffer_backlog: { max: Math.max(0, ...backlog), mean: Math.round(backlog.reduce((a, b) => a + b, 0) / (backlog.length || 1)), samples: backlog.length },
    worker_cpu_us_per_event: perEvent(w0, w1, latTotal),
    worker_cpu_share: w0 !== undefined && w1 !== undefined ? Math.round(((w1 - w0) / ((tw1 - tw0) * 1000)) * 100) / 100 : undefined,
    redis_cpu_us_per_event: perEvent(r0, r1, latTotal),
    redis_commands_per_request: topCommands(cs0, cs1, Math.max(1, st2.requests)),
    flush_jobs: flushJobs,
    p99_ms_by_second: Array.from(bySecond, (xs) => (xs?.length ? round1(percentile([...xs].sort((a, b) => a - b), 99)) : NaN)),
  };
  log(
    `producer latency ${fmt(o.rate)}/s: publish → sink p50 ${fmt(prod.publish_resolved_to_sink_ms.p50, 1)} ms, p99 ${fmt(prod.publish_resolved_to_sink_ms.p99, 1)} ms; worker ${fmt(prod.worker_cpu_us_per_event, 1)} µs/event (${fmt((prod.worker_cpu_share ?? NaN) * 100)} % of a core), redis ${fmt(prod.redis_cpu_us_per_event, 1)}; buffer max ${fmt(prod.buffer_backlog.max)}; ${fmt(prod.events_per_request, 0)} events/request; ${prod.flush_jobs.total} flush jobs, ${prod.flush_jobs.created_with_linger_delay} with the linger delay`,
  );
  return prod;
}

async function phaseE2E(db: { url: string; apiKey: string; accountId: string }, latRates: number[], redisPid: number): Promise<{ e2e: E2EResult; producer: ProducerLatencyResult[] }> {
  const prefix = `${PREFIX}_e2e`;
  const sink = await startSink();
  let cp: ControlPlaneProcess | undefined;
  let worker: Child | undefined;
  try {
    cp = await startControlPlane({ databaseUrl: db.url, env: { LOG_LEVEL: 'warn' } });
    pin(cp.pid, 0);
    worker = await startWorker({ prefix, concurrency: 50, databaseUrl: db.url, sinkUrl: sink.url, tag: 'e2e' });
    await sink.ask({ type: 'mode', parse: true }, 'mode');
    const dest = await ok(cp, db.apiKey, 'POST', '/event_destinations', { description: 'events bench', target: { datadog: { api_key: DD_KEY } } });
    await ok(cp, db.apiKey, 'POST', '/event_subscriptions', { description: 'events bench', sources: [{ type: 'ip_policy_updated.v0' }], destination_ids: [dest.id] });
    const policies: string[] = [];
    for (let i = 0; i < E2E_POLICIES; i++) policies.push((await ok(cp, db.apiKey, 'POST', '/ip_policies', { description: `bench ${i}` })).id);

    const got = new Map<string, number[]>();
    const keyOf = (r: SinkRecord) => (r.type === 'ip_policy_updated.v0' ? `${r.objectId}|${r.metadata}` : undefined);
    // Warm-up: the relay, the subscription lookup, the target and its keep-alive socket.
    for (let i = 0; i < 20; i++) {
      await ok(cp, db.apiKey, 'PATCH', `/ip_policies/${policies[i % E2E_POLICIES]}`, { metadata: `warm-${i}` });
      await sleep(20);
    }
    const warmDeadline = now() + 20_000;
    for (;;) {
      await collect(sink, got, keyOf);
      if ([...got.keys()].filter((k) => k.includes('|warm-')).length >= 20) break;
      if (now() > warmDeadline) throw new Error(`warm-up events did not reach the sink (got ${got.size})\n--- worker ---\n${worker.output()}\n--- control plane ---\n${cp.output()}`);
      await sleep(50);
    }
    got.clear();
    await sink.ask({ type: 'reset' }, 'reset');

    // Open loop: PATCH i is sent at start + i / rate whatever the earlier ones are doing.
    const total = Math.round(E2E_RATE * E2E_SECONDS);
    const sent: number[] = new Array(total);
    const answered: number[] = new Array(total);
    let patchErrors = 0;
    const inflight: Promise<void>[] = [];
    const start = now() + 50;
    log(`e2e: ${total} PATCHes at ${E2E_RATE}/s over ${E2E_POLICIES} ip policies …`);
    for (let i = 0; i < total; i++) {
      const wait = start + (i * 1000) / E2E_RATE - now();
      if (wait > 1) await sleep(wait);
      sent[i] = now();
      inflight.push(
        apiCall(cp, db.apiKey, 'PATCH', `/ip_policies/${policies[i % E2E_POLICIES]}`, { metadata: `b${i}` }).then(
          (r) => {
            answered[i] = now();
            if (r.status !== 200) patchErrors++;
          },
          () => {
            patchErrors++;
          },
        ),
      );
      if (i % 100 === 99) await collect(sink, got, keyOf);
    }
    await Promise.all(inflight);
    const waitUntil = now() + 15_000;
    const keys = Array.from({ length: total }, (_, i) => `${policies[i % E2E_POLICIES]}|b${i}`);
    for (;;) {
      await collect(sink, got, keyOf);
      if (keys.every((k) => got.has(k)) || now() > waitUntil) break;
      await sleep(50);
    }
    const fromResp: number[] = [];
    const fromSent: number[] = [];
    const patchMs: number[] = [];
    let missing = 0;
    let dups = 0;
    keys.forEach((k, i) => {
      const at = got.get(k);
      if (answered[i] !== undefined) patchMs.push(answered[i]! - sent[i]!);
      if (!at || answered[i] === undefined) {
        missing++;
        return;
      }
      dups += at.length - 1;
      fromResp.push(Math.min(...at) - answered[i]!);
      fromSent.push(Math.min(...at) - sent[i]!);
    });
    const e2eStats = (await sink.ask<{ stats: SinkStats }>({ type: 'stats' }, 'stats')).stats;
    const e2e: E2EResult = {
      rate_per_s: E2E_RATE,
      seconds: E2E_SECONDS,
      patches: total,
      patch_errors: patchErrors,
      delivered: total - missing,
      missing,
      duplicates: dups,
      patch_response_to_sink_ms: stats(fromResp),
      patch_sent_to_sink_ms: stats(fromSent),
      patch_request_ms: stats(patchMs),
      sink_requests: e2eStats.requests,
    };
    log(`e2e: PATCH response → sink p50 ${fmt(e2e.patch_response_to_sink_ms.p50, 1)} ms, p99 ${fmt(e2e.patch_response_to_sink_ms.p99, 1)} ms, max ${fmt(e2e.patch_response_to_sink_ms.max, 1)} ms; ${missing} missing`);

    // Producer → sink at steady rates (same worker, destination and sink).
    const producer: ProducerLatencyResult[] = [];
    for (const rate of latRates) producer.push(await producerLatency({ sink, worker, prefix, destId: dest.id, accountId: db.accountId, rate, redisPid }));
    return { e2e, producer };
  } finally {
    await worker?.stop();
    await cp?.stop().catch(() => {});
    await sink.stop();
    agent.destroy();
    await deleteKeys(`${prefix}:*`);
  }
}

// ---------------------------------------------------------------------------------------------

async function main(): Promise<void> {
  if (process.argv.includes('--noop-worker')) return noopWorkerRole();
  const mach = machine(); // before pinning: availableParallelism() follows this process's affinity
  let privateRedis: RedisServer | undefined;
  if (env.BENCH_REDIS === 'private') {
    privateRedis = await startRedisServer();
    REDIS_URL = privateRedis.url;
    if (env.BENCH_REDIS_CORE) pin(privateRedis.pid()!, Number(env.BENCH_REDIS_CORE));
  }
  admin = new Redis(REDIS_URL, { maxRetriesPerRequest: null });
  pin(process.pid, 0);
  const info = await admin.info('server');
  const redisPid = Number(/process_id:(\d+)/.exec(info)?.[1]);
  const redisVersion = /redis_version:(\S+)/.exec(info)?.[1];
  log(`prefix ${PREFIX}; redis ${redisVersion} (pid ${redisPid}, ${privateRedis ? 'private' : 'shared'}); phases ${[...PHASES].join(',')}; pinning ${PIN ? 'on (bench + sink core 0, worker core 1)' : 'off'}`);

  let db: Awaited<ReturnType<typeof benchDatabase>> | undefined;
  let interrupted = false;
  const cleanup = async () => {
    for (const c of live) if (c.exitCode === null && c.signalCode === null) c.kill('SIGTERM');
    await db?.drop();
    const n = await deleteKeys(`${PREFIX}*`).catch(() => 0);
    if (n) log(`removed ${n} redis keys under ${PREFIX}`);
    admin.disconnect();
    await privateRedis?.stop();
  };
  const onSignal = () => {
    if (interrupted) return;
    interrupted = true;
    log('interrupted; cleaning up');
    void cleanup().finally(() => process.exit(130));
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);

  const result: Record<string, unknown> = {
    bench: 'events',
    at: new Date().toISOString(),
    prefix: PREFIX,
    redis_version: redisVersion,
    redis: privateRedis ? `private${env.BENCH_REDIS_CORE ? `, core ${env.BENCH_REDIS_CORE}` : ', unpinned'}` : 'shared, unpinned',
    pinning: PIN,
  };
  try {
    if (PHASES.has('enqueue')) {
      const events = envelopes(EVENTS, 'enq');
      result.enqueue = { batch: BATCH, event_bytes: events[0]!.length, runs: await phaseEnqueue(events, redisPid) };
    }
    if (PHASES.has('noop')) result.noop = await phaseNoop(redisPid);
    // Producer → sink rates: BENCH_LAT_RATE (a list), else 1,000/s and half the measured 1-destination delivery rate.
    let latRates = env.BENCH_LAT_RATE ? list(env.BENCH_LAT_RATE, '').map(Number) : [1000];
    if (PHASES.has('delivery') || PHASES.has('e2e')) {
      db = await benchDatabase('evbench');
      result.postgres = db.pgVersion;
      if (PHASES.has('delivery')) {
        const cases = await phaseDelivery(db, redisPid);
        result.delivery = { event_bytes: EVENT_BYTES, rounds: ROUNDS, cases };
        const oneDest = cases.filter((c) => c.destinations === 1).sort((a, b) => b.concurrency - a.concurrency)[0];
        const half = oneDest ? Math.round(oneDest.events_per_s / 2 / 100) * 100 : 0;
        if (!env.BENCH_LAT_RATE && half > 1000) latRates = [1000, half];
      }
      if (PHASES.has('e2e')) {
        const { e2e, producer } = await phaseE2E(db, latRates, redisPid);
        result.e2e_api_to_sink = e2e;
        result.producer_to_sink = producer;
      }
    }
  } finally {
    result.machine = mach;
    if (!interrupted) await cleanup();
  }

  // Report
  const enq = result.enqueue as { runs: EnqueueResult[] } | undefined;
  if (enq) {
    console.log(`\nenqueue (EventProducer.publish, ${fmt(EVENTS)} × ${EVENT_BYTES} B, batches of ${BATCH})   goal ≥ 20k/s, target 50k/s`);
    console.log('dests  in flight   events/s   bench µs/ev  redis µs/ev');
    for (const r of enq.runs) console.log(`${String(r.destinations).padStart(5)} ${String(r.inflight).padStart(10)} ${fmt(r.events_per_s).padStart(10)} ${fmt(r.bench_cpu_us_per_event, 1).padStart(13)} ${fmt(r.redis_cpu_us_per_event, 1).padStart(12)}`);
  }
  const noop = result.noop as NoopResult[] | undefined;
  if (noop) {
    console.log(`\nbullmq no-op jobs, 1 worker (core 1)   goal ≥ 10k/s, target 20k/s; addBulk goal ≥ 20k/s`);
    console.log('conc    jobs   addBulk/s     jobs/s   worker µs/job  redis µs/job');
    for (const r of noop) console.log(`${String(r.concurrency).padStart(4)} ${fmt(r.jobs).padStart(7)} ${fmt(r.add_bulk_jobs_per_s).padStart(11)} ${fmt(r.jobs_per_s).padStart(10)} ${fmt(r.worker_cpu_us_per_job, 1).padStart(15)} ${fmt(r.redis_cpu_us_per_job, 1).padStart(13)}`);
  }
  const dl = result.delivery as { cases: DeliveryCase[] } | undefined;
  if (dl) {
    console.log(`\ndelivery, 1 worker (core 1) → lean Datadog sink (core 0), backlog of ${fmt(DELIVERY_EVENTS)} × ${EVENT_BYTES} B, ${ROUNDS} round(s)   goal ≥ 2,000/s, target 5,000/s`);
    console.log('conc  dests   events/s (min–max)        worker µs/ev  core share  redis µs/ev  sink µs/ev  ev/request  enqueue/s');
    for (const c of dl.cases)
      console.log(
        `${String(c.concurrency).padStart(4)} ${String(c.destinations).padStart(6)} ${`${fmt(c.events_per_s).padStart(10)} (${fmt(c.events_per_s_min_max[0])}–${fmt(c.events_per_s_min_max[1])})`.padEnd(26)} ${fmt(c.worker_cpu_us_per_event, 1).padStart(12)} ${fmt(c.worker_cpu_share, 2).padStart(11)} ${fmt(c.redis_cpu_us_per_event, 1).padStart(12)} ${fmt(c.sink_cpu_us_per_event, 1).padStart(11)} ${fmt(c.events_per_request, 0).padStart(11)} ${fmt(c.enqueue_events_per_s).padStart(10)}`,
      );
  }
  const e2e = result.e2e_api_to_sink as E2EResult | undefined;
  if (e2e) {
    const r = e2e.patch_response_to_sink_ms;
    const s = e2e.patch_sent_to_sink_ms;
    console.log(`\nend to end, PATCH /ip_policies → ip_policy_updated.v0 at the sink, ${e2e.rate_per_s}/s for ${e2e.seconds} s (worker linger ${DEFAULT_LINGER_MS} ms included)`);
    console.log(`  PATCH response → sink: p50 ${fmt(r.p50, 1)} ms  p90 ${fmt(r.p90, 1)}  p99 ${fmt(r.p99, 1)}  max ${fmt(r.max, 1)}`);
    console.log(`  PATCH sent     → sink: p50 ${fmt(s.p50, 1)} ms  p90 ${fmt(s.p90, 1)}  p99 ${fmt(s.p99, 1)}  max ${fmt(s.max, 1)}`);
    console.log(`  PATCH itself: p50 ${fmt(e2e.patch_request_ms.p50, 1)} ms  p99 ${fmt(e2e.patch_request_ms.p99, 1)}; ${e2e.delivered}/${e2e.patches} delivered, ${e2e.missing} missing, ${e2e.duplicates} duplicates, ${e2e.patch_errors} PATCH errors; ${e2e.sink_requests} sink requests`);
  }
  const pls = result.producer_to_sink as ProducerLatencyResult[] | undefined;
  if (pls?.length) {
    console.log(`\nproducer → sink (publish resolved → sink receipt), 1 destination, ${LAT_SECONDS} s per rate, linger ${LAT_LINGER_MS} ms included   goal p99 ≤ 50 ms at 50 % load, target ≤ 20 ms`);
    console.log('events/s      p50 ms    p90 ms    p99 ms    max ms  delivered   ev/request  buffer max  worker µs/ev  core share');
    for (const pl of pls) {
      const r = pl.publish_resolved_to_sink_ms;
      console.log(
        `${fmt(pl.rate_per_s).padStart(8)} ${fmt(r.p50, 1).padStart(11)} ${fmt(r.p90, 1).padStart(9)} ${fmt(r.p99, 1).padStart(9)} ${fmt(r.max, 1).padStart(9)} ${`${pl.delivered}/${pl.events}`.padStart(12)} ${fmt(pl.events_per_request, 0).padStart(11)} ${fmt(pl.buffer_backlog.max).padStart(11)} ${fmt(pl.worker_cpu_us_per_event, 1).padStart(13)} ${fmt(pl.worker_cpu_share, 2).padStart(11)}`,
      );
    }
  }
  // §6 goals: 'target', 'floor' (met the floor only) or 'below floor'.
  const goals: Record<string, { value: number; floor: number; target: number; higher_is_better: boolean; verdict: string }> = {};
  const goal = (name: string, value: number | undefined, floor: number, target: number, higher = true) => {
    if (value === undefined || !Number.isFinite(value)) return;
    const meets = (x: number) => (higher ? value >= x : value <= x);
    goals[name] = { value, floor, target, higher_is_better: higher, verdict: meets(target) ? 'target' : meets(floor) ? 'floor' : 'below floor' };
  };
  if (enq) goal('enqueue_events_per_s (publish, 1 call in flight, worst of the destination counts)', Math.min(...enq.runs.filter((r) => r.inflight === 1).map((r) => r.events_per_s)), 20_000, 50_000);
  const noop50 = noop?.find((r) => r.concurrency === 50);
  if (noop50) {
    goal('noop_jobs_per_s (1 worker, concurrency 50)', noop50.jobs_per_s, 10_000, 20_000);
    goal('add_bulk_jobs_per_s', noop50.add_bulk_jobs_per_s, 20_000, 50_000);
  }
  const c50 = dl?.cases.filter((c) => c.concurrency === 50) ?? [];
  if (c50.length) goal('delivered_events_per_s (1 worker, concurrency 50, worst of the destination counts)', Math.min(...c50.map((c) => c.events_per_s)), 2_000, 5_000);
  const halfLoad = pls && pls.length > 1 ? pls[pls.length - 1] : undefined;
  if (halfLoad) goal(`producer_to_sink_p99_ms (at ${halfLoad.rate_per_s}/s, ~50 % of 1-destination capacity)`, halfLoad.publish_resolved_to_sink_ms.p99, 50, 20, false);
  if (pls?.[0]) goal(`producer_to_sink_p99_ms (at ${pls[0].rate_per_s}/s)`, pls[0].publish_resolved_to_sink_ms.p99, 50, 20, false);
  if (e2e) goal(`api_to_sink_p99_ms (PATCH response → sink at ${e2e.rate_per_s}/s; §6 has no own goal, the delivery p99 one is used)`, e2e.patch_response_to_sink_ms.p99, 50, 20, false);
  result.goals = goals;
  if (Object.keys(goals).length) {
    console.log('\ngoals (performance.md §6)');
    for (const [k, g] of Object.entries(goals)) console.log(`  ${g.verdict.padEnd(11)} ${fmt(g.value, g.higher_is_better ? 0 : 1).padStart(8)}  (floor ${fmt(g.floor)}, target ${fmt(g.target)})  ${k}`);
  }
  mkdirSync(fileURLToPath(new URL('./results/', import.meta.url)), { recursive: true });
  writeFileSync(RESULTS, `${JSON.stringify(result, null, 2)}\n`);
  console.log(`\n(written to ${RESULTS})`);
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
