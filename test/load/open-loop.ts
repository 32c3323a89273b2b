import { Pool } from 'undici';

/**
 * An open-loop load generator: requests are scheduled at a fixed rate, spread evenly (not in
 * bursts per connection as autocannon's overallRate does), and latency is measured from each
 * request's *scheduled* time, so a stall is not hidden by the generator waiting on it
 * (no coordinated omission). The client is an undici Pool driven through `dispatch` (no
 * per-request streams or promises): the generator shares a core with the upstream and the agent,
 * and its own allocation and GC pauses would otherwise show up in the tails it reports.
 */
export interface OpenLoopResult {
  rate: number;
  sent: number;
  ok: number;
  non2xx: number;
  errors: number;
  p50: number;
  p90: number;
  p99: number;
  max: number;
}

export async function openLoop(opts: { url: string; headers?: Record<string, string>; rate: number; durationS: number; connections?: number; path?: () => string }): Promise<OpenLoopResult> {
  return (await openLoopPaired({ ...opts, classes: [opts.headers ?? {}] }))[0]!;
}

/**
 * {@link openLoop} with several request classes in one run: request i carries the headers of
 * class i mod n, at `rate` in all, and each class gets its own result. The classes share every
 * stall of the box and of the server, so differences between them (the latency one feature adds)
 * are not buried under the round-to-round noise that separate runs have.
 */
export async function openLoopPaired(opts: { url: string; classes: Array<Record<string, string>>; rate: number; durationS: number; connections?: number; path?: () => string }): Promise<OpenLoopResult[]> {
  const u = new URL(opts.url);
  const pool = new Pool(u.origin, { connections: opts.connections ?? 64, pipelining: 1 });
  const n = opts.classes.length;
  const per = opts.classes.map(() => ({ latencies: [] as number[], ok: 0, non2xx: 0, errors: 0, sent: 0 }));
  const start = performance.now();
  const total = Math.round(opts.rate * opts.durationS);
  const interval = 1000 / opts.rate;
  let inflight = 0;
  let drained: (() => void) | null = null;
  const settle = () => {
    if (--inflight === 0 && drained) drained();
  };
  const fire = (i: number, scheduled: number) => {
    const c = per[i % n]!;
    c.sent++;
    inflight++;
    let status = 0;
    pool.dispatch(
      { path: opts.path ? opts.path() : u.pathname + u.search, method: 'GET', headers: opts.classes[i % n] },
      {
        onConnect() {},
        onHeaders(s: number) {
          status = s;
          return true;
        },
        onData() {
          return true;
        },
        onComplete() {
          c.latencies.push(performance.now() - scheduled);
          if (status >= 200 && status < 300) c.ok++;
          else c.non2xx++;
          settle();
        },
        onError() {
          c.errors++;
          settle();
        },
      },
    );
  };
  let next = 0;
  await new Promise<void>((resolve) => {
    const tick = () => {
      const now = performance.now() - start;
      while (next < total && next * interval <= now) {
        fire(next, start + next * interval);
        next++;
      }
      if (next >= total) return resolve();
      setTimeout(tick, 1); // ~1 ms ticks: a busy loop would steal the CPU the server and Postgres need
    };
    tick();
  });
  if (inflight > 0) await new Promise<void>((resolve) => (drained = resolve));
  await pool.close();
  return per.map(({ latencies, ok, non2xx, errors, sent }) => {
    latencies.sort((a, b) => a - b);
    const q = (x: number) => Number((latencies[Math.min(latencies.length - 1, Math.floor(x * latencies.length))] ?? NaN).toFixed(2));
    return { rate: opts.rate / n, sent, ok, non2xx, errors, p50: q(0.5), p90: q(0.9), p99: q(0.99), max: q(1) };
  });
}
