import { randomBytes } from 'node:crypto';
import { mkdir, open, rename, truncate, unlink, type FileHandle } from 'node:fs/promises';
import path from 'node:path';
import { parentPort, workerData } from 'node:worker_threads';
import type { DataPlaneConfig } from '@warren/shared';
import type { DpDeletedIds, DpEntityLists } from '../../../shared/src/proto/index.js';
import { applyDelta, buildConfig } from './config-state.js';
import { CONFIG_FILE, CONFIG_FORMAT, ENTITY_KINDS, encodeEntry, listSegments, loadState, segmentFile, syncDir, writeEntitiesFile } from './state-journal.js';

/**
 * Worker thread of `StateStore` (state-store.ts): it keeps its own copy of the node's config,
 * applying the same deltas the main thread applies, and does all the config's disk writes, so
 * that the main thread only posts small messages and never serializes the whole config.
 *
 * - A delta becomes one journal line (state-journal.ts), appended with the lines that came
 *   meanwhile and fsynced once for all of them; then it is answered.
 * - A snapshot (or a delta when the worker cannot chain it onto what is on disk) becomes a new
 *   base: the journal is rotated (later lines go to a new segment), the whole config is written
 *   entity by entity in chunks to a temporary file, fsynced and renamed over config.json, and the
 *   older segments are deleted. Deltas that come meanwhile are appended to the new segment; they
 *   are answered once the base they follow is durable too. Snapshots waiting to start replace
 *   each other (so do the deltas after them: the base written includes them).
 * - Compaction is the same base write, started when the journal exceeds `compactFraction` of the
 *   base's size (at least `compactMinBytes`) or `compactEntries` lines. It does not hold up
 *   deltas: their lines still go to the journal meanwhile and are answered once fsynced.
 */

export interface StoreWorkerData {
  dir: string;
  compactMinBytes: number;
  compactFraction: number;
  compactEntries: number;
}

export type StoreRequest =
  /** A whole config, in slices: `fullBegin`, `fullPart`s, `fullEnd`. */
  | { type: 'fullBegin'; id: number; epoch: string; version: number }
  | { type: 'fullPart'; id: number; kind: keyof DpEntityLists; items: unknown[] }
  | { type: 'fullEnd'; id: number }
  | { type: 'delta'; id: number; epoch: string; prev: number; version: number; upserts: DpEntityLists; deletes: DpDeletedIds }
  | { type: 'flush'; id: number };

export type StoreReply =
  | { type: 'done'; ids: number[] }
  /** `resync`: the worker could not chain the delta onto its copy; the main thread sends the config whole. */
  | { type: 'failed'; ids: number[]; error: string; resync?: boolean }
  | { type: 'compacted'; version: number; bytes: number };

interface Pending {
  line: string;
  id: number;
  /** A base write (snapshot) this line follows; it is durable once both are. */
  after: Promise<void> | null;
}

class StoreWorker {
  private state: { cfg: DataPlaneConfig; epoch: string } | null = null;
  private loaded = false;
  private seg = 0;
  private segFh: { seg: number; fh: FileHandle } | null = null;
  private journalBytes = 0;
  private journalEntries = 0;
  private baseBytes = 0;
  private pending: Pending[] = [];
  private appending: Promise<void> | null = null;
  private batch: Promise<void> | null = null;
  /** A base write waiting to start: `needed` when deltas depend on it (not a mere compaction). */
  private fullQueued: { ids: number[]; needed: boolean } | null = null;
  private fullRunning: Promise<void> | null = null;
  /** The running base write, when lines appended meanwhile follow it. */
  private barrier: Promise<void> | null = null;
  /** An append failed: the journal may hold a damaged line, so the next change writes a base. */
  private needsBase = false;
  private inbox: Promise<void> = Promise.resolve();

  constructor(
    private readonly o: StoreWorkerData,
    private readonly reply: (r: StoreReply) => void,
  ) {}

  private gathering: { id: number; epoch: string; version: number; entities: DpEntityLists } | null = null;

  receive(m: StoreRequest): void {
    if (m.type === 'fullBegin') {
      const entities = Object.fromEntries(ENTITY_KINDS.map((k) => [k, []])) as unknown as DpEntityLists;
      this.gathering = { id: m.id, epoch: m.epoch, version: m.version, entities };
      return;
    }
    if (m.type === 'fullPart') {
      const g = this.gathering;
      if (g?.id === m.id) for (const x of m.items) (g.entities[m.kind] as unknown[]).push(x);
      return;
    }
    let whole: typeof this.gathering = null;
    if (m.type === 'fullEnd') {
      whole = this.gathering?.id === m.id ? this.gathering : null;
      this.gathering = null;
    }
    // In order; only the first message after a start waits (a delta loads the state from disk).
    this.inbox = this.inbox.then(() => this.handle(m, whole)).catch((err: unknown) => this.reply({ type: 'failed', ids: [m.id], error: String((err as Error)?.message ?? err) }));
  }

  private async handle(m: StoreRequest, whole: { epoch: string; version: number; entities: DpEntityLists } | null): Promise<void> {
    if (m.type === 'flush') {
      await this.idle();
      this.reply({ type: 'done', ids: [m.id] });
      return;
    }
    if (!this.loaded) await this.load(m.type === 'fullEnd');
    if (m.type === 'fullEnd') {
      const g = whole;
      if (!g) throw new Error(`config ${m.id} arrived incomplete`);
      this.state = { cfg: buildConfig(g.version, g.entities), epoch: g.epoch };
      // Lines not yet appended are superseded by the base, which includes their changes.
      const ids = this.pending.map((p) => p.id);
      this.pending = [];
      this.queueBase(true, [...ids, m.id]);
      return;
    }
    if (m.type !== 'delta') return;
    const s = this.state;
    if (!s || s.epoch !== m.epoch || s.cfg.version !== m.prev) {
      this.reply({ type: 'failed', ids: [m.id], error: `cannot chain delta ${m.prev}→${m.version} (${m.epoch}) onto ${s ? `${s.cfg.version} (${s.epoch})` : 'nothing'}`, resync: true });
      return;
    }
    s.cfg = applyDelta(s.cfg, m.version, m.upserts, m.deletes);
    if (this.fullQueued) this.fullQueued.ids.push(m.id);
    else if (this.needsBase) this.queueBase(true, [m.id]);
    else {
      this.pending.push({ line: encodeEntry(m.version, m.prev, m.epoch, m.upserts, m.deletes), id: m.id, after: this.barrier });
      this.appending ??= this.appendLoop();
    }
  }

  /**
   * The state on disk, to chain the first deltas onto; the journal is cut where replay stopped.
   * Segment numbers from now on are past every segment in the directory.
   */
  private async load(whole: boolean): Promise<void> {
    this.loaded = true;
    // STATE_DIR may not exist yet (a new node whose TLS files come from elsewhere creates nothing
    // in it before its first config); owner-only, as it holds credential hashes.
    await mkdir(this.o.dir, { recursive: true, mode: 0o700 });
    const segments = await listSegments(this.o.dir);
    this.seg = (segments.at(-1) ?? 0) + 1;
    if (whole) return; // a whole config replaces what is on disk: no need to read it
    let s: Awaited<ReturnType<typeof loadState>> = null;
    try {
      s = await loadState(this.o.dir);
    } catch {
      s = null; // unusable: the main thread got the same error, and sends a snapshot first
    }
    if (!s) return;
    this.state = { cfg: s.cfg ?? buildConfig(s.base.version, s.base.entities), epoch: s.base.epoch };
    this.baseBytes = s.baseBytes;
    this.journalBytes = s.journalBytes;
    this.journalEntries = s.applied;
    if (typeof s.base.journal !== 'number' || s.base.format !== CONFIG_FORMAT) {
      // A base of before journals (or of format 1): no journal may follow it; write one first.
      this.needsBase = true;
      return;
    }
    const first = s.base.journal;
    this.seg = Math.max(this.seg, first);
    for (const n of s.segments) if (n < first) await unlink(segmentFile(this.o.dir, n)).catch(() => {});
    if (s.end) {
      // Lines past the end of the replay (a torn last line) must not hide the ones appended now.
      await truncate(segmentFile(this.o.dir, s.end.segment), s.end.offset);
      for (const n of s.segments) if (n > s.end.segment) await unlink(segmentFile(this.o.dir, n)).catch(() => {});
    }
  }

  private queueBase(needed: boolean, ids: number[]): void {
    if (this.fullQueued) {
      this.fullQueued.ids.push(...ids);
      this.fullQueued.needed ||= needed;
    } else this.fullQueued = { ids, needed };
    this.startBase();
  }

  private startBase(): void {
    if (this.fullRunning || !this.fullQueued || !this.state) return;
    const { ids, needed } = this.fullQueued;
    this.fullQueued = null;
    this.needsBase = false;
    // Rotate: lines from now on go to a new segment, which the new base names as its journal.
    const { cfg, epoch } = this.state;
    const seg = ++this.seg;
    this.journalBytes = 0;
    this.journalEntries = 0;
    const inflight = this.batch;
    const run = (async () => {
      const dir = this.o.dir;
      const file = path.join(dir, CONFIG_FILE);
      const tmp = path.join(dir, `.${CONFIG_FILE}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`);
      try {
        const bytes = await writeEntitiesFile(
          tmp,
          { format: CONFIG_FORMAT, epoch, version: cfg.version, savedAt: new Date().toISOString(), journal: seg },
          {
            edges: cfg.edges.values(),
            routes: cfg.routes.values(),
            backends: cfg.backends.values(),
            ipPolicies: cfg.ipPolicies.values(),
            certificateAuthorities: cfg.certificateAuthorities.values(),
            credentials: cfg.credentials.values(),
            eventSubscriptions: cfg.eventSubscriptions.values(),
          },
        );
        await rename(tmp, file);
        await syncDir(dir);
        this.baseBytes = bytes;
        this.reply({ type: 'compacted', version: cfg.version, bytes });
      } catch (err) {
        await unlink(tmp).catch(() => {});
        throw err;
      }
      // Older segments hold only lines the base includes (an append in flight at the rotation too).
      await inflight?.catch(() => {});
      for (const n of await listSegments(dir)) if (n < seg) await unlink(segmentFile(dir, n)).catch(() => {});
    })();
    this.fullRunning = run;
    if (needed) this.barrier = run;
    run.then(
      () => this.reply({ type: 'done', ids }),
      (err: unknown) => {
        // The deltas after it fail with it (their lines follow a base that is not on disk).
        this.needsBase = true;
        this.reply({ type: 'failed', ids, error: String((err as Error)?.message ?? err) });
      },
    ).finally(() => {
      this.fullRunning = null;
      if (this.barrier === run) this.barrier = null;
      this.startBase();
      this.maybeCompact(); // lines appended meanwhile may be due already
    });
  }

  private async appendLoop(): Promise<void> {
    try {
      while (this.pending.length > 0) {
        const items = this.pending;
        this.pending = [];
        const b = this.appendBatch(items);
        this.batch = b;
        await b;
      }
    } finally {
      this.appending = null;
      this.batch = null;
    }
  }

  private async appendBatch(items: Pending[]): Promise<void> {
    const data = Buffer.from(items.map((p) => p.line).join(''), 'utf8');
    try {
      if (this.segFh?.seg !== this.seg) {
        const old = this.segFh;
        this.segFh = null;
        await old?.fh.close().catch(() => {});
        const seg = this.seg;
        const fh = await open(segmentFile(this.o.dir, seg), 'a', 0o600);
        this.segFh = { seg, fh };
        if (seg === this.seg) await syncDir(this.o.dir); // the new file's entry
      }
      await this.segFh.fh.write(data);
      await this.segFh.fh.sync();
    } catch (err) {
      this.needsBase = true;
      const old = this.segFh;
      this.segFh = null;
      await old?.fh.close().catch(() => {});
      this.reply({ type: 'failed', ids: items.map((p) => p.id), error: String((err as Error)?.message ?? err) });
      // What came meanwhile goes into the base written to recover.
      const rest = this.pending.map((p) => p.id);
      this.pending = [];
      this.queueBase(true, rest);
      return;
    }
    this.journalBytes += data.length;
    this.journalEntries += items.length;
    const now: number[] = [];
    for (const p of items) {
      if (!p.after) now.push(p.id);
      else
        p.after.then(
          () => this.reply({ type: 'done', ids: [p.id] }),
          (err: unknown) => this.reply({ type: 'failed', ids: [p.id], error: `the base it follows was not written: ${String((err as Error)?.message ?? err)}` }),
        );
    }
    if (now.length > 0) this.reply({ type: 'done', ids: now });
    this.maybeCompact();
  }

  private maybeCompact(): void {
    if (!this.fullRunning && !this.fullQueued && (this.journalEntries >= this.o.compactEntries || this.journalBytes >= Math.max(this.o.compactMinBytes, this.baseBytes * this.o.compactFraction))) {
      this.queueBase(false, []);
    }
  }

  private async idle(): Promise<void> {
    for (;;) {
      const busy = [this.appending, this.fullRunning].filter((p): p is Promise<void> => p !== null);
      if (busy.length === 0 && !this.fullQueued && this.pending.length === 0) return;
      if (busy.length === 0) {
        this.startBase();
        if (!this.fullRunning) return; // nothing to write it from
        continue;
      }
      await Promise.allSettled(busy);
    }
  }
}


if (parentPort) {
  const port = parentPort;
  const w = new StoreWorker(workerData as StoreWorkerData, (r) => port.postMessage(r));
  port.on('message', (m: StoreRequest) => w.receive(m));
}
