import http from 'node:http';

/**
 * An open-loop load generator: requests are scheduled at a fixed rate, spread evenly (not in
 * bursts per connection as autocannon's overallRate does), and latency is measured from each
 * request's *scheduled* time, so a stall is not hidden by the generator waiting on it
 * (no coordinated omission).
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
  const u = new URL(opts.url);
  const agent = new http.Agent({ keepAlive: true, maxSockets: opts.connections ?? 64 });
  const latencies: number[] = [];
  let ok = 0, non2xx = 0, errors = 0, sent = 0;
  const start = performance.now();
  const total = Math.round(opts.rate * opts.durationS);
  const interval = 1000 / opts.rate;
  const inflight = new Set<Promise<void>>();
  const fire = (scheduled: number) => {
    sent++;
    const p = new Promise<void>((resolve) => {
      const req = http.request({ agent, host: u.hostname, port: u.port, path: opts.path ? opts.path() : u.pathname + u.search, method: 'GET', headers: opts.headers }, (res) => {
        res.resume();
        res.on('end', () => {
          latencies.push(performance.now() - scheduled);
          if (res.statusCode! >= 200 && res.statusCode! < 300) ok++;
          else non2xx++;
          resolve();
        });
      });
      req.on('error', () => {
        errors++;
        resolve();
      });
      req.end();
    });
    inflight.add(p);
    void p.then(() => inflight.delete(p));
  };
  let next = 0;
  await new Promise<void>((resolve) => {
    const tick = () => {
      const now = performance.now() - start;
      while (next < total && next * interval <= now) fire(start + next++ * interval);
      if (next >= total) return resolve();
      setTimeout(tick, 1); // ~1 ms ticks: a busy loop would steal the CPU the server and Postgres need
    };
    tick();
  });
  await Promise.all(inflight);
  agent.destroy();
  latencies.sort((a, b) => a - b);
  const q = (x: number) => Number((latencies[Math.min(latencies.length - 1, Math.floor(x * latencies.length))] ?? NaN).toFixed(2));
  return { rate: opts.rate, sent, ok, non2xx, errors, p50: q(0.5), p90: q(0.9), p99: q(0.99), max: q(1) };
}
