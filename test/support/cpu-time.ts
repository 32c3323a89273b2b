import { createHash } from 'node:crypto';

/**
 * CPU time, for tests that check what some code costs.
 *
 * Wall time (`performance.now()`) counts the time this process waited for a core: with two full
 * test runs at once on a 2-core box (8+ busy processes), the fastest of several wall-clock runs
 * still came out 3-15 times the work itself. The CPU time the process used (`process.cpuUsage()`,
 * user + system) only grows while it runs: on the same loaded box the fastest of a few runs stayed
 * within 1.3-1.6 times what it is alone, up to 3 times for work that walks megabytes (the caches
 * and memory are shared with the other processes): bounds on it still need room.
 *
 * It counts every thread of the process: V8's concurrent GC and compiler threads as well as the
 * one running the test (Node 20 has no per-thread CPU time). So compare like with like: work
 * measured this way against work (or a reference) measured this way, taking the least of several
 * runs (another process, or the collection of an earlier run's garbage, only ever adds to one).
 * On Linux the sum has microsecond resolution (measured here: it steps by the 3-4 µs a call of
 * `process.cpuUsage()` in a loop takes), so a measurement held to a bound of B µs needs B well
 * above that: batch calls (`reps`, `repsFor`) that take less. Vitest runs each file in its own
 * fork, so another file's work is never counted.
 */

/** CPU time (user + system, µs) this process has used so far. */
export function cpuMicros(): number {
  const c = process.cpuUsage();
  return c.user + c.system;
}

export interface FastestOptions {
  /** Measurements to take (each `reps` calls). Default 9. */
  runs?: number;
  /** Calls per measurement, the time divided by it (for work under ~1 ms a call). Default 1. */
  reps?: number;
  /** Calls before measuring (JIT, caches, lazily built state). Default 1. */
  warmup?: number;
}

/**
 * Calls per measurement for work estimated at `estimateNs` a call: enough for `batchNs` (0.2 ms:
 * ~1% of it is the resolution of CPU time), at least 1.
 */
export function repsFor(estimateNs: number, batchNs = 200_000): number {
  return Math.max(1, Math.ceil(batchNs / estimateNs));
}

/** The least CPU time, in ms a call, of `runs` measurements of `reps` calls of `fn`, after `warmup` calls. */
export function fastestCpuMs(fn: () => unknown, opts: FastestOptions = {}): number {
  const { runs = 9, reps = 1, warmup = 1 } = opts;
  for (let i = 0; i < warmup; i++) fn();
  let best = Infinity;
  for (let r = 0; r < runs; r++) {
    const c0 = cpuMicros();
    for (let i = 0; i < reps; i++) fn();
    best = Math.min(best, (cpuMicros() - c0) / 1000 / reps);
  }
  return best;
}

/**
 * As `fastestCpuMs`, for work that is awaited. Only work that does not wait on I/O or timers is
 * worth timing this way (waiting uses no CPU, and whatever else the process does meanwhile counts).
 */
export async function fastestCpuMsAsync(fn: () => unknown, opts: FastestOptions = {}): Promise<number> {
  const { runs = 9, reps = 1, warmup = 1 } = opts;
  for (let i = 0; i < warmup; i++) await fn();
  let best = Infinity;
  for (let r = 0; r < runs; r++) {
    const c0 = cpuMicros();
    for (let i = 0; i < reps; i++) await fn();
    best = Math.min(best, (cpuMicros() - c0) / 1000 / reps);
  }
  return best;
}

/** CPU times (ms a call) of `runs` measurements of `reps` calls each, sorted, after `warmup` calls. */
export function cpuTimings(fn: () => unknown, opts: FastestOptions = {}): number[] {
  const { runs = 9, reps = 1, warmup = 1 } = opts;
  for (let i = 0; i < warmup; i++) fn();
  const ms: number[] = [];
  for (let r = 0; r < runs; r++) {
    const c0 = cpuMicros();
    for (let i = 0; i < reps; i++) fn();
    ms.push((cpuMicros() - c0) / 1000 / reps);
  }
  return ms.sort((a, b) => a - b);
}

const REFERENCE_TEXT = Array.from({ length: 1500 }, (_, i) => `item-${i} key=${(i * 7919) % 10007} name=Ärger-${i % 97};`).join(' ');
const REFERENCE_BYTES = Buffer.from(REFERENCE_TEXT);

/**
 * A fixed mix of what the timed tests do (a JS loop over a string, split, RegExp, Map, JSON,
 * sorting, UTF-8 decoding, SHA-256): the yardstick of `machineSlowdown`.
 */
export function referenceWork(): number {
  let h = 0;
  for (let i = 0; i < REFERENCE_TEXT.length; i++) h = (Math.imul(h, 31) + REFERENCE_TEXT.charCodeAt(i)) | 0;
  const counts = new Map<string, number>();
  for (const part of REFERENCE_TEXT.split(';')) {
    const key = /key=(\d+) name=(\S+)/.exec(part)?.[2];
    if (key) counts.set(key, (counts.get(key) ?? 0) + 1);
  }
  const entries = JSON.parse(JSON.stringify([...counts.entries()])) as Array<[string, number]>;
  entries.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  const text = REFERENCE_BYTES.toString('utf8');
  const digest = createHash('sha256').update(REFERENCE_BYTES).digest();
  return (h ^ text.length ^ digest[0]!) + entries.length;
}

/**
 * CPU ms of `referenceWork` on the box the cost estimates were calibrated on (the 2-core test
 * box: the least of 15 runs was 0.34-0.44 ms, alone or beside two test runs and four busy loops;
 * its small working set keeps other processes' use of the caches mostly out of it).
 */
export const REFERENCE_CPU_MS = 0.4;

/**
 * How much slower than the calibration box this one runs now, by CPU time (at least 1): the
 * least of several runs of `referenceWork` over `REFERENCE_CPU_MS`. A bound on measured CPU time
 * that an estimate calibrated there sets is multiplied by it, so a slower box (or Node) passes,
 * while code slower than before still fails: the reference does not get slower with it. It stays
 * about 1 on a busy box: bounds leave room for what sharing the caches adds (see above).
 */
export function machineSlowdown(): number {
  const ms = fastestCpuMs(referenceWork, { runs: 9, reps: 5, warmup: 10 });
  return Math.max(1, ms / REFERENCE_CPU_MS);
}
