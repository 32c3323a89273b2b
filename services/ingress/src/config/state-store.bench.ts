/**
 * Measures the main thread's cost of persisting config changes (`StateStore`) with a large config:
 * `node --import tsx services/ingress/src/config/state-store.bench.ts [routes] [credentials] [deltas]`.
 * Prints the synchronous time of each save call, the event loop's longest stall meanwhile
 * (monitorEventLoopDelay), and a full JSON.stringify of the config for comparison.
 */
import { mkdtemp, rm, stat } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { toLists } from './config-state.js';
import { largeConfig, smallDelta } from './state-store.fixtures.js';
import { CONFIG_FILE, StateStore } from './state-store.js';

const routes = Number(process.argv[2] ?? 2000);
const credentials = Number(process.argv[3] ?? 20000);
const deltas = Number(process.argv[4] ?? 20);

const dir = await mkdtemp(path.join(os.tmpdir(), 'warren-store-bench-'));
try {
  let cfg = largeConfig({ routes, credentials });
  let t = performance.now();
  const full = JSON.stringify({ entities: toLists(cfg) });
  const stringifyMs = performance.now() - t;
  console.log(`config: ${routes} routes, ${credentials} credentials, ${(full.length / 1048576).toFixed(1)} MiB JSON; full toLists+stringify ${stringifyMs.toFixed(1)} ms`);
  const store = new StateStore(dir);
  t = performance.now();
  const first = store.saveConfig(cfg, 'ep');
  const firstSync = performance.now() - t;
  await first;
  console.log(`snapshot save: sync call ${firstSync.toFixed(1)} ms, ${(performance.now() - t).toFixed(1)} ms until durable (worker start included)`);
  // The deltas are built first: the loop measured does nothing but save them.
  const chain: { prev: number; d: ReturnType<typeof smallDelta> }[] = [];
  for (let n = 0; n < deltas; n++) {
    const d = smallDelta(cfg, n);
    chain.push({ prev: cfg.version, d });
    cfg = d.next;
  }
  await new Promise((r) => setTimeout(r, 200));
  const h = monitorEventLoopDelay({ resolution: 1 });
  const sync: number[] = [];
  const durable: number[] = [];
  const save = (store as unknown as { saveDelta?: Function }).saveDelta;
  h.enable();
  for (const { prev, d } of chain) {
    const t0 = performance.now();
    const p = save ? (save as Function).call(store, d.next, 'ep', prev, d.upserts, d.deletes) : store.saveConfig(d.next, 'ep');
    sync.push(performance.now() - t0);
    await p;
    durable.push(performance.now() - t0);
  }
  h.disable();
  await store.flush();
  const med = (a: number[]) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)]!;
  console.log(`per delta (${deltas}): sync call median ${med(sync).toFixed(2)} ms max ${Math.max(...sync).toFixed(2)} ms; until durable median ${med(durable).toFixed(1)} ms; event loop stall max ${(h.max / 1e6).toFixed(1)} ms, p50 ${(h.percentile(50) / 1e6).toFixed(1)} ms`);
  console.log(`config.json ${((await stat(path.join(dir, CONFIG_FILE))).size / 1048576).toFixed(1)} MiB`);
  await (store as unknown as { close?: () => Promise<void> }).close?.();
} finally {
  await rm(dir, { recursive: true, force: true });
}
