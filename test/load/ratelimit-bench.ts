import { mkdirSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { RedisSlidingWindowLimiter } from '../../services/ingress/src/ratelimit/redis.js';
import { deleteServerKeys } from '../../services/ingress/src/ratelimit/testing.js';
import { cpuMicros, fmt, log, machine, percentile } from './support.js';

/**
 * The rate limiter alone against local Redis (performance.md §2, limiter part): decisions/s and
 * p50/p99 latency of `hit()` at concurrency 1/16/64, one hot key vs 10k keys, for each transport
 * (the lean pipe, ioredis, ioredis with auto-pipelining; BENCH_TRANSPORTS and BENCH_CONCURRENCY
 * pick some); CPU µs per decision of this process and of redis-server; Redis
 * `INFO commandstats` evalsha calls per decision (should be ≈ 1). Capacity 2e9: nothing is
 * rejected, the check runs in full. Results: test/load/results/ratelimit.json.
 *
 *   REDIS_URL=redis://127.0.0.1:6379 npx tsx test/load/ratelimit-bench.ts [seconds per run, default 3] [rounds, default 2]
 */
const REDIS_URL = process.env.REDIS_URL ?? process.env.TEST_REDIS_URL ?? 'redis://127.0.0.1:6379';
const SECONDS = Number(process.argv[2] ?? 3);
const ROUNDS = Number(process.argv[3] ?? 2);
const serverId = `bench-${randomBytes(4).toString('hex')}`;
const admin = new Redis(REDIS_URL);

async function scriptCalls(): Promise<number> {
  const info = await admin.info('commandstats');
  let n = 0;
  for (const m of info.matchAll(/cmdstat_(evalsha|eval):calls=(\d+)/g)) n += Number(m[2]);
  return n;
}

type Transport = 'pipe' | 'ioredis' | 'ioredis+autopipelining';

interface Run {
  transport: Transport;
  keys: number;
  concurrency: number;
  decisions: number;
  per_s: number;
  p50_us: number;
  p99_us: number;
  max_us: number;
  node_cpu_us: number | undefined;
  redis_cpu_us: number | undefined;
  evalsha_per_decision: number;
  fallbacks: number;
}

async function run(redisPid: number, transport: Transport, keys: number, concurrency: number, seconds: number): Promise<Run> {
  const l = new RedisSlidingWindowLimiter({ redis: REDIS_URL, serverId, transport: transport === 'pipe' ? 'pipe' : 'ioredis', autoPipelining: transport === 'ioredis+autopipelining' });
  await l.ready();
  const keyNames = Array.from({ length: keys }, (_, i) => `bench-key-${i}`);
  const lat: number[] = [];
  let fallbacks = 0;
  let stop = false;
  const calls0 = await scriptCalls();
  const cpu0 = cpuMicros(process.pid);
  const rcpu0 = cpuMicros(redisPid);
  const t0 = performance.now();
  setTimeout(() => (stop = true), seconds * 1000);
  await Promise.all(
    Array.from({ length: concurrency }, async (_, w) => {
      let i = w;
      while (!stop) {
        const s = performance.now();
        const r = await l.hit(keyNames[i++ % keys]!, 2_000_000_000, 60);
        lat.push(performance.now() - s);
        if (r.error) fallbacks++;
      }
    }),
  );
  const elapsed = (performance.now() - t0) / 1000;
  const cpu1 = cpuMicros(process.pid);
  const rcpu1 = cpuMicros(redisPid);
  const calls = (await scriptCalls()) - calls0;
  await l.close();
  lat.sort((a, b) => a - b);
  const n = lat.length;
  return {
    transport,
    keys,
    concurrency,
    decisions: n,
    per_s: Math.round(n / elapsed),
    p50_us: Math.round(percentile(lat, 50) * 1000),
    p99_us: Math.round(percentile(lat, 99) * 1000),
    max_us: Math.round(lat[n - 1]! * 1000),
    node_cpu_us: cpu0 !== undefined && cpu1 !== undefined ? Math.round(((cpu1 - cpu0) / n) * 10) / 10 : undefined,
    redis_cpu_us: rcpu0 !== undefined && rcpu1 !== undefined ? Math.round(((rcpu1 - rcpu0) / n) * 10) / 10 : undefined,
    evalsha_per_decision: Math.round((calls / n) * 1000) / 1000,
    fallbacks,
  };
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function main() {
  const info = await admin.info('server');
  const redisPid = Number(/process_id:(\d+)/.exec(info)?.[1]);
  const redisVersion = /redis_version:(\S+)/.exec(info)?.[1];
  log(`redis ${redisVersion} pid ${redisPid}; ${SECONDS} s per run, ${ROUNDS} rounds, serverId ${serverId}`);
  const cases: Array<[Transport, number, number]> = [];
  const transports = (process.env.BENCH_TRANSPORTS ?? 'pipe,ioredis,ioredis+autopipelining').split(',') as Transport[];
  const concurrencies = (process.env.BENCH_CONCURRENCY ?? '1,16,64').split(',').map(Number);
  for (const keys of [1, 10_000]) for (const c of concurrencies) for (const t of transports) cases.push([t, keys, c]);
  for (const t of transports) await run(redisPid, t, 10_000, 16, 1); // warm-up, discarded
  const all: Run[][] = cases.map(() => []);
  // Interleaved rounds, so drift of the shared box spreads over every case.
  for (let round = 0; round < ROUNDS; round++) {
    for (let i = 0; i < cases.length; i++) {
      const [ap, keys, c] = cases[i]!;
      all[i]!.push(await run(redisPid, ap, keys, c, SECONDS));
    }
  }
  const results = all.map((runs) => {
    const pick = (f: (r: Run) => number | undefined) => median(runs.map((r) => f(r) ?? NaN));
    const r0 = runs[0]!;
    return {
      transport: r0.transport,
      keys: r0.keys,
      concurrency: r0.concurrency,
      decisions_per_s: pick((r) => r.per_s),
      decisions_per_s_min_max: [Math.min(...runs.map((r) => r.per_s)), Math.max(...runs.map((r) => r.per_s))],
      p50_us: pick((r) => r.p50_us),
      p99_us: pick((r) => r.p99_us),
      max_us: Math.max(...runs.map((r) => r.max_us)),
      node_cpu_us_per_decision: pick((r) => r.node_cpu_us),
      redis_cpu_us_per_decision: pick((r) => r.redis_cpu_us),
      evalsha_per_decision: pick((r) => r.evalsha_per_decision),
      fallbacks: runs.reduce((a, r) => a + r.fallbacks, 0),
    };
  });
  await deleteServerKeys(admin, serverId);
  await admin.quit();

  console.log('\nkeys    conc  transport  decisions/s (min–max)       p50 µs   p99 µs   node µs/dec  redis µs/dec  evalsha/dec  fallbacks');
  for (const r of results) {
    console.log(
      `${String(r.keys).padEnd(7)} ${String(r.concurrency).padStart(4)}  ${String(r.transport).padEnd(8)} ${fmt(r.decisions_per_s).padStart(9)} (${fmt(r.decisions_per_s_min_max[0])}–${fmt(r.decisions_per_s_min_max[1])})`.padEnd(58) +
        `${fmt(r.p50_us).padStart(6)} ${fmt(r.p99_us).padStart(8)} ${fmt(r.node_cpu_us_per_decision, 1).padStart(12)} ${fmt(r.redis_cpu_us_per_decision, 1).padStart(13)} ${fmt(r.evalsha_per_decision, 3).padStart(12)} ${String(r.fallbacks).padStart(10)}`,
    );
  }
  const out = { bench: 'ratelimit', redis_version: redisVersion, seconds_per_run: SECONDS, rounds: ROUNDS, capacity: 2e9, window_s: 60, machine: machine(), results, measured_at: new Date().toISOString() };
  mkdirSync(new URL('./results/', import.meta.url), { recursive: true });
  writeFileSync(new URL('./results/ratelimit.json', import.meta.url), JSON.stringify(out, null, 2) + '\n');
  log('wrote test/load/results/ratelimit.json');
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
