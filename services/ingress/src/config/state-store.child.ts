/**
 * A child process for state-store.test.ts: saves a snapshot and then a burst of deltas (the
 * chain of `chainOf`) into the directory given, printing `acked <version>` as each save resolves.
 * `node --import tsx state-store.child.ts <dir> <deltas> [exit]`: with `exit`, it neither flushes
 * nor closes the store at the end (the worker must not keep the process alive).
 */
import { StateStore } from './state-store.js';
import { chainOf } from './state-store.fixtures.js';

const [dir, n, mode] = process.argv.slice(2);
const { base, deltas } = chainOf(Number(n));
const store = new StateStore(dir!, { compactEntries: 7, compactMinBytes: 64 * 1024 });
await store.saveConfig(base, 'ep');
process.stdout.write(`acked ${base.version}\n`);
const saves: Promise<void>[] = [];
// (A store from before `saveDelta` saves the whole config instead.)
const s = store as unknown as { saveDelta?: StateStore['saveDelta']; close?: () => Promise<void> };
for (const d of deltas) {
  const p = (s.saveDelta ? s.saveDelta.call(store, d.next, 'ep', d.prev, d.upserts, d.deletes) : store.saveConfig(d.next, 'ep')).then(() => void process.stdout.write(`acked ${d.next.version}\n`));
  saves.push(p);
  // A burst: a few at once, then a breath (so that batches, appends and compactions interleave).
  if (d.next.version % 3 === 0) await new Promise((r) => setTimeout(r, 15));
}
await Promise.all(saves);
if (mode !== 'exit') await (s.close ? s.close.call(store) : store.flush());
process.stdout.write('done\n');
