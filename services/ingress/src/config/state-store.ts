import { randomBytes } from 'node:crypto';
import { mkdir, open, readFile, rename, unlink } from 'node:fs/promises';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { Worker } from 'node:worker_threads';
import type { DataPlaneConfig, DpTunnel } from '@warren/shared';
import type { DpDeletedIds, DpEntityLists } from '../../../shared/src/proto/index.js';
import { toLists } from './config-state.js';
import { ENTITY_KINDS, loadState, storedOf, syncDir, type StoredConfig } from './state-journal.js';
import type { StoreReply, StoreRequest, StoreWorkerData } from './state-store.worker.js';

export { CONFIG_FILE, CONFIG_FORMAT, JOURNAL_PREFIX, type StoredConfig } from './state-journal.js';
const TUNNELS_FORMAT = 1;
export const TUNNELS_FILE = 'remote-tunnels.json';

export interface StoredTunnels {
  format: number;
  savedAt: string;
  tunnels: DpTunnel[];
}

/**
 * Writes `data` to `file` so that a crash leaves either the old or the new content, never a mix:
 * a temporary file in the same directory, fsync, rename over the target, fsync the directory.
 */
export async function writeFileAtomic(file: string, data: string): Promise<void> {
  const dir = path.dirname(file);
  await mkdir(dir, { recursive: true });
  const tmp = path.join(dir, `.${path.basename(file)}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`);
  const fh = await open(tmp, 'w', 0o600);
  try {
    await fh.writeFile(data, 'utf8');
    await fh.sync();
  } finally {
    await fh.close();
  }
  try {
    await rename(tmp, file);
  } catch (err) {
    await unlink(tmp).catch(() => {});
    throw err;
  }
  await syncDir(dir);
}

/**
 * Writes the latest value given, one write at a time: values given while a write runs replace
 * each other, so a burst of changes costs at most two writes. `save` resolves once a write that
 * includes (or supersedes) its value is on disk.
 */
class LatestWriter<T> {
  private pending: { value: T; waiters: { resolve: () => void; reject: (e: unknown) => void }[] } | null = null;
  private running: Promise<void> | null = null;

  constructor(private readonly write: (value: T) => Promise<void>) {}

  save(value: T): Promise<void> {
    return new Promise((resolve, reject) => {
      if (this.pending) {
        this.pending.value = value;
        this.pending.waiters.push({ resolve, reject });
      } else this.pending = { value, waiters: [{ resolve, reject }] };
      this.running ??= this.run();
    });
  }

  /** Resolves when nothing is left to write. */
  async flush(): Promise<void> {
    while (this.running) await this.running;
  }

  private async run(): Promise<void> {
    while (this.pending) {
      const { value, waiters } = this.pending;
      this.pending = null;
      try {
        await this.write(value);
        for (const w of waiters) w.resolve();
      } catch (err) {
        for (const w of waiters) w.reject(err);
      }
    }
    this.running = null;
  }
}

export interface StateStoreOptions {
  /** Compaction: the journal is folded into a new config.json once it exceeds this fraction of config.json's size (default 0.25)… */
  compactFraction?: number;
  /** …and at least these bytes (default 1 MiB)… */
  compactMinBytes?: number;
  /** …or once it holds this many deltas (default 10,000). */
  compactEntries?: number;
}

/** A whole config is posted to the worker in slices of at most about this much of the main thread's time. */
const SLICE_MS = 4;

type EntityKind = (typeof ENTITY_KINDS)[number];

/** The worker's entry (JavaScript, loading state-store.worker.ts through tsx; see there). */
const WORKER_URL = new URL('./state-store.worker.mjs', import.meta.url);

interface Waiter {
  resolve: () => void;
  reject: (e: unknown) => void;
}

/**
 * The node's persisted state in `dir`: the last good config and the remote tunnels.
 *
 * The config is written by a worker thread (state-store.worker.ts) that keeps its own copy of it:
 * a delta (`saveDelta`) is posted as it came (a small message) and journaled there, one line,
 * fsynced; a whole config (`saveConfig`: a snapshot, or a delta that does not follow the last
 * config given) is posted whole and written as a new base file. The main thread never
 * serializes the whole config for a change. The promise of a save resolves once that config (or
 * a later one) is durable: a crash at any moment leaves a base file and journal that load
 * (`loadConfig`) to a config this node was given, at least as recent as every save resolved.
 */
export class StateStore {
  private readonly tunnelsWriter: LatestWriter<DpTunnel[]>;
  private worker: Worker | null = null;
  private nextId = 1;
  private readonly waiting = new Map<number, { waiters: Waiter[]; full: boolean }>();
  /** What the worker's copy is (or will be, once it has read what was posted): the version a delta must follow. */
  private chain: { epoch: string; version: number } | null = null;
  private saved = false;
  /** The last config given, which a delta the worker could not chain is sent as. */
  private latest: { cfg: DataPlaneConfig; epoch: string } | null = null;
  /** A whole config posted and not yet durable: a later one waits (and replaces the ones waiting). */
  private fullInFlight = false;
  private fullWaiting: { cfg: DataPlaneConfig; epoch: string; waiters: Waiter[] } | null = null;
  /** Messages posted while a whole config is being posted, to follow it. */
  private outbox: StoreRequest[] | null = null;
  /** Whole configs posted (measurement, tests). */
  fullPosts = 0;
  /** Deltas posted (measurement, tests). */
  deltaPosts = 0;

  constructor(
    readonly dir: string,
    private readonly opts: StateStoreOptions = {},
  ) {
    this.tunnelsWriter = new LatestWriter((tunnels) => {
      const stored: StoredTunnels = { format: TUNNELS_FORMAT, savedAt: new Date().toISOString(), tunnels };
      return writeFileAtomic(path.join(this.dir, TUNNELS_FILE), JSON.stringify(stored));
    });
  }

  /** Persists a whole config (a snapshot). Resolves once it, or a later config, is durable. */
  saveConfig(cfg: DataPlaneConfig, epoch: string): Promise<void> {
    return new Promise((resolve, reject) => this.full(cfg, epoch, [{ resolve, reject }]));
  }

  /**
   * Persists `cfg`, the config after applying `upserts` and `deletes` (as `applyDelta` got them)
   * to the config of version `prevVersion` last given to this store: only the delta is sent to
   * the worker. When `prevVersion`/`epoch` is not the last config given (or none was), the
   * config is saved whole. Resolves once it, or a later config, is durable.
   */
  saveDelta(cfg: DataPlaneConfig, epoch: string, prevVersion: number, upserts: DpEntityLists, deletes: DpDeletedIds): Promise<void> {
    return new Promise((resolve, reject) => {
      const waiter = { resolve, reject };
      const c = this.chain;
      if (this.fullWaiting) {
        // A whole config waits to be posted: it becomes this one (which includes the delta).
        this.fullWaiting.cfg = cfg;
        this.fullWaiting.epoch = epoch;
        this.fullWaiting.waiters.push(waiter);
        this.latest = { cfg, epoch };
        this.chain = { epoch, version: cfg.version };
        return;
      }
      if (!c || c.epoch !== epoch || c.version !== prevVersion) return this.full(cfg, epoch, [waiter]);
      this.latest = { cfg, epoch };
      this.chain = { epoch, version: cfg.version };
      this.saved = true;
      this.deltaPosts++;
      this.post({ type: 'delta', id: this.track([waiter], false), epoch, prev: prevVersion, version: cfg.version, upserts, deletes });
    });
  }

  saveTunnels(tunnels: DpTunnel[]): Promise<void> {
    return this.tunnelsWriter.save(tunnels);
  }

  /** Resolves when every save so far is durable and the worker has nothing left to write (compaction included). */
  async flush(): Promise<void> {
    await this.tunnelsWriter.flush();
    while (this.waiting.size > 0 || this.fullWaiting) {
      await Promise.allSettled([...this.waiting.values()].map((w) => new Promise<void>((resolve) => w.waiters.push({ resolve, reject: () => resolve() }))));
      // A whole config that waited is posted once the one before is durable; go round again.
    }
    if (this.worker) await new Promise<void>((resolve) => this.post({ type: 'flush', id: this.track([{ resolve, reject: () => resolve() }], false) }));
  }

  /** Flushes, then ends the worker thread. The store may be used again (a new worker starts). */
  async close(): Promise<void> {
    await this.flush();
    const w = this.worker;
    this.worker = null;
    this.chain = null; // a new worker reads the disk; the next save is sent whole to be sure
    if (w) await w.terminate();
  }

  /** The persisted config (base file and journal), or null when there is none. Throws when the base file is unreadable or malformed. */
  async loadConfig(): Promise<StoredConfig | null> {
    const s = await loadState(this.dir);
    if (!s) return null;
    const stored = storedOf(s);
    // The worker, started later, reads the same files: deltas that follow this config can be
    // journaled after them.
    if (!this.saved && !this.chain) this.chain = { epoch: stored.epoch, version: stored.version };
    return stored;
  }

  async loadTunnels(): Promise<DpTunnel[]> {
    const raw = await readOptional(path.join(this.dir, TUNNELS_FILE));
    if (raw === null) return [];
    const v = JSON.parse(raw) as StoredTunnels;
    if (v?.format !== TUNNELS_FORMAT || !Array.isArray(v.tunnels)) throw new Error(`${TUNNELS_FILE}: not a tunnels file of format ${TUNNELS_FORMAT}`);
    return v.tunnels;
  }

  private full(cfg: DataPlaneConfig, epoch: string, waiters: Waiter[]): void {
    this.latest = { cfg, epoch };
    this.chain = { epoch, version: cfg.version };
    this.saved = true;
    if (this.fullWaiting) {
      this.fullWaiting.cfg = cfg;
      this.fullWaiting.epoch = epoch;
      this.fullWaiting.waiters.push(...waiters);
      return;
    }
    this.fullWaiting = { cfg, epoch, waiters };
    this.postFull();
  }

  private postFull(): void {
    const f = this.fullWaiting;
    if (!f || this.fullInFlight) return;
    this.fullWaiting = null;
    this.fullInFlight = true;
    this.fullPosts++;
    const id = this.track(f.waiters, true);
    void this.postWhole(id, f.cfg, f.epoch).catch((err: unknown) => this.settle(id, err));
  }

  /**
   * Posts a whole config in slices of entities, a few milliseconds of the main thread's time at a
   * time (copying a large config to the worker in one message would stall it for as long as a
   * JSON.stringify of it). What is posted meanwhile waits and follows it.
   */
  private async postWhole(id: number, cfg: DataPlaneConfig, epoch: string): Promise<void> {
    const w = this.ensureWorker();
    const held: StoreRequest[] = [];
    this.outbox = held;
    try {
      w.postMessage({ type: 'fullBegin', id, epoch, version: cfg.version } satisfies StoreRequest);
      const lists = toLists(cfg) as unknown as Record<EntityKind, unknown[]>;
      let batch = 8;
      let tickStart = performance.now();
      for (const kind of ENTITY_KINDS) {
        const list = lists[kind];
        for (let i = 0; i < list.length; ) {
          if (this.worker !== w) throw new Error('the config store worker exited');
          const t0 = performance.now();
          const items = list.slice(i, i + batch);
          w.postMessage({ type: 'fullPart', id, kind, items } satisfies StoreRequest);
          i += items.length;
          const t1 = performance.now();
          if (t1 - t0 < 0.5) batch = Math.min(batch * 2, 4096);
          else if (t1 - t0 > 2) batch = Math.max(1, batch >> 1);
          if (t1 - tickStart > SLICE_MS) {
            await new Promise((r) => setImmediate(r));
            tickStart = performance.now();
          }
        }
      }
      if (this.worker !== w) throw new Error('the config store worker exited');
      w.postMessage({ type: 'fullEnd', id } satisfies StoreRequest);
    } finally {
      this.outbox = null;
      for (const m of held) this.post(m);
    }
  }

  private track(waiters: Waiter[], full: boolean): number {
    const id = this.nextId++;
    this.waiting.set(id, { waiters, full });
    this.worker?.ref();
    return id;
  }

  private post(m: StoreRequest): void {
    if (this.outbox) {
      this.outbox.push(m);
      return;
    }
    const w = this.ensureWorker();
    w.ref();
    w.postMessage(m);
  }

  private ensureWorker(): Worker {
    if (this.worker) return this.worker;
    const data: StoreWorkerData = {
      dir: this.dir,
      compactFraction: this.opts.compactFraction ?? 0.25,
      compactMinBytes: this.opts.compactMinBytes ?? 1 << 20,
      compactEntries: this.opts.compactEntries ?? 10_000,
    };
    const w = new Worker(WORKER_URL, { workerData: data });
    this.worker = w;
    w.on('message', (r: StoreReply) => this.onReply(r));
    const gone = (err: unknown) => {
      if (this.worker !== w) return;
      this.worker = null;
      this.chain = null; // the next save goes whole to a new worker
      for (const id of [...this.waiting.keys()]) this.settle(id, err);
    };
    w.on('error', gone);
    w.on('exit', (code) => gone(new Error(`the config store worker exited (code ${code})`)));
    return w;
  }

  private onReply(r: StoreReply): void {
    if (r.type === 'compacted') return;
    if (r.type === 'failed' && r.resync && this.latest) {
      // The worker's copy did not match: send the latest config whole, for these saves too.
      const waiters = r.ids.flatMap((id) => this.take(id));
      this.chain = null;
      this.full(this.latest.cfg, this.latest.epoch, waiters);
      return;
    }
    for (const id of r.ids) this.settle(id, r.type === 'failed' ? new Error(`could not persist the config: ${r.error}`) : null);
  }

  private take(id: number): Waiter[] {
    const t = this.waiting.get(id);
    if (!t) return [];
    this.waiting.delete(id);
    if (t.full) {
      this.fullInFlight = false;
      queueMicrotask(() => this.postFull());
    }
    if (this.waiting.size === 0) this.worker?.unref();
    return t.waiters;
  }

  private settle(id: number, err: unknown): void {
    for (const w of this.take(id)) {
      if (err) w.reject(err);
      else w.resolve();
    }
  }
}

async function readOptional(file: string): Promise<string | null> {
  try {
    return await readFile(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw err;
  }
}
