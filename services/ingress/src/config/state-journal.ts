import { open, readdir, readFile } from 'node:fs/promises';
import path from 'node:path';
import { crc32 } from 'node:zlib';
import type { DataPlaneConfig } from '@warren/shared';
import type { DpDeletedIds, DpEntityLists } from '../../../shared/src/proto/index.js';
import { applyDelta, buildConfig, toLists } from './config-state.js';

/**
 * The on-disk form of a node's last good config: a base file (config.json, rewritten whole and
 * atomically) and a journal of the deltas applied since, in segments (config.journal.<n>), one
 * line per delta. Shared by the store (main thread: loading) and its worker (writing).
 *
 * A base file written with a journal names the first segment that follows it (`journal`);
 * segments before it are leftovers of an earlier base and are ignored, and so is every segment
 * when a base has no `journal` (one written before journals existed, or by an older node).
 *
 * A journal line is `<crc32 of the JSON, 8 hex digits> <JSON>\n`, the JSON being
 * `{v: version, p: version it applies to, e: epoch, t: when, u: upserts, d: deletes}` (kinds
 * without entries left out). Replay applies lines in order from the base's version: a line of
 * another epoch, one that does not apply to the version reached, or a torn or damaged one (a
 * crash during an append) ends the replay; lines of versions already reached are skipped.
 */

/**
 * Format of the config file. 2 added `entities.eventSubscriptions`; a format-1 file still loads
 * (without subscriptions), and the client then asks the control plane for a snapshot rather
 * than a delta, which would not carry the subscriptions that existed before.
 */
export const CONFIG_FORMAT = 2;
export const CONFIG_FORMATS_READ: ReadonlySet<number> = new Set([1, 2]);
export const CONFIG_FILE = 'config.json';
export const JOURNAL_PREFIX = 'config.journal.';

export interface StoredConfig {
  format: number;
  epoch: string;
  version: number;
  savedAt: string;
  /** The first journal segment that follows this base (absent: no journal applies). */
  journal?: number;
  entities: DpEntityLists;
}

export const ENTITY_KINDS = ['edges', 'routes', 'backends', 'ipPolicies', 'certificateAuthorities', 'credentials', 'eventSubscriptions'] as const;

export interface JournalEntry {
  v: number;
  p: number;
  e: string;
  t: string;
  u: Partial<DpEntityLists>;
  d: Partial<DpDeletedIds>;
}

export function segmentFile(dir: string, n: number): string {
  return path.join(dir, `${JOURNAL_PREFIX}${n}`);
}

/** Journal segment numbers in `dir`, ascending. */
export async function listSegments(dir: string): Promise<number[]> {
  let names: string[];
  try {
    names = await readdir(dir);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw err;
  }
  const out: number[] = [];
  for (const name of names) {
    if (!name.startsWith(JOURNAL_PREFIX)) continue;
    const rest = name.slice(JOURNAL_PREFIX.length);
    if (/^\d{1,15}$/.test(rest)) out.push(Number(rest));
  }
  return out.sort((a, b) => a - b);
}

function compact<T extends object>(lists: T): Partial<T> {
  const out: Partial<T> = {};
  for (const [k, v] of Object.entries(lists)) if (Array.isArray(v) && v.length > 0) (out as Record<string, unknown>)[k] = v;
  return out;
}

/** One journal line (with its newline) for a delta. */
export function encodeEntry(version: number, prev: number, epoch: string, upserts: DpEntityLists, deletes: DpDeletedIds): string {
  const entry: JournalEntry = { v: version, p: prev, e: epoch, t: new Date().toISOString(), u: compact(upserts), d: compact(deletes) };
  const json = JSON.stringify(entry);
  return `${crc32(json).toString(16).padStart(8, '0')} ${json}\n`;
}

/** The entry of one line (without its newline), or null when it is damaged. */
export function decodeEntry(line: string): JournalEntry | null {
  if (line.length < 10 || line[8] !== ' ') return null;
  const json = line.slice(9);
  if (crc32(json).toString(16).padStart(8, '0') !== line.slice(0, 8)) return null;
  try {
    const e = JSON.parse(json) as JournalEntry;
    if (typeof e?.v !== 'number' || typeof e.p !== 'number' || typeof e.e !== 'string' || typeof e.u !== 'object' || typeof e.d !== 'object' || !e.u || !e.d) return null;
    return e;
  } catch {
    return null;
  }
}

export function entryLists(e: JournalEntry): { upserts: DpEntityLists; deletes: DpDeletedIds } {
  const upserts = {} as DpEntityLists;
  const deletes = {} as DpDeletedIds;
  for (const k of ENTITY_KINDS) {
    (upserts as unknown as Record<string, unknown[]>)[k] = Array.isArray(e.u[k]) ? (e.u[k] as unknown[]) : [];
    deletes[k] = Array.isArray(e.d[k]) ? (e.d[k] as string[]) : [];
  }
  return { upserts, deletes };
}

export interface LoadedState {
  /** The base file as read (entities as they are in it). */
  base: StoredConfig;
  /** The config after the journal's replay; null when no line applied (the base's entities are it). */
  cfg: DataPlaneConfig | null;
  version: number;
  savedAt: string;
  applied: number;
  /** Where the usable journal ends: the segment and byte offset of the first line not used (null: all of it). */
  end: { segment: number; offset: number } | null;
  /** Segments in the directory. */
  segments: number[];
  baseBytes: number;
  journalBytes: number;
}

/** Reads the base file and replays the journal after it. Null when there is no base file. Throws when the base is unreadable or malformed. */
export async function loadState(dir: string): Promise<LoadedState | null> {
  let raw: string;
  try {
    raw = await readFile(path.join(dir, CONFIG_FILE), 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw err;
  }
  const base = JSON.parse(raw) as StoredConfig;
  if (!CONFIG_FORMATS_READ.has(base?.format) || typeof base.version !== 'number' || typeof base.epoch !== 'string' || typeof base.entities !== 'object' || base.entities === null)
    throw new Error(`${CONFIG_FILE}: not a config file of format ${[...CONFIG_FORMATS_READ].join(' or ')}`);
  // Format 1 predates event subscriptions.
  if (!Array.isArray(base.entities.eventSubscriptions)) base.entities.eventSubscriptions = [];
  const baseBytes = Buffer.byteLength(raw);
  raw = '';
  const segments = await listSegments(dir);
  const out: LoadedState = { base, cfg: null, version: base.version, savedAt: base.savedAt, applied: 0, end: null, segments, baseBytes, journalBytes: 0 };
  if (typeof base.journal !== 'number' || base.format !== CONFIG_FORMAT) return out;
  let cfg: DataPlaneConfig | null = null;
  for (const seg of segments) {
    if (seg < base.journal) continue;
    const text = await readFile(segmentFile(dir, seg), 'utf8').catch((err: NodeJS.ErrnoException) => {
      if (err.code === 'ENOENT') return '';
      throw err;
    });
    let offset = 0;
    while (offset < text.length) {
      const nl = text.indexOf('\n', offset);
      const entry = nl < 0 ? null : decodeEntry(text.slice(offset, nl));
      if (!entry || entry.e !== base.epoch || (entry.v > out.version && entry.p !== out.version)) {
        out.end = { segment: seg, offset: Buffer.byteLength(text.slice(0, offset)) };
        return finish(out, cfg);
      }
      const lineEnd = nl + 1;
      if (entry.v > out.version) {
        cfg ??= buildConfig(base.version, base.entities);
        const { upserts, deletes } = entryLists(entry);
        cfg = applyDelta(cfg, entry.v, upserts, deletes);
        out.version = entry.v;
        out.savedAt = entry.t;
        out.applied++;
      }
      out.journalBytes += lineEnd - offset;
      offset = lineEnd;
    }
  }
  return finish(out, cfg);
}

function finish(out: LoadedState, cfg: DataPlaneConfig | null): LoadedState {
  out.cfg = cfg;
  return out;
}

/** The config a loaded state stands for, as the store's `loadConfig` returns it. */
export function storedOf(s: LoadedState): StoredConfig {
  if (!s.cfg) return s.base;
  return { format: s.base.format, epoch: s.base.epoch, version: s.version, savedAt: s.savedAt, journal: s.base.journal, entities: toLists(s.cfg) };
}

/**
 * Writes `file` (whose content is `{...head, "entities": {kind: [entity, ...], ...}}`) entity by
 * entity in chunks of about `chunkBytes`, awaiting each write: the thread stays free for other
 * work between chunks and no string of the whole file is ever built. fsyncs before closing.
 * Returns the bytes written.
 */
export async function writeEntitiesFile(file: string, head: Omit<StoredConfig, 'entities'>, entities: { [K in keyof DpEntityLists]: Iterable<DpEntityLists[K][number]> }, chunkBytes = 1 << 20): Promise<number> {
  const fh = await open(file, 'w', 0o600);
  let bytes = 0;
  try {
    let chunk = JSON.stringify(head).slice(0, -1) + ',"entities":{';
    const put = async (s: string) => {
      chunk += s;
      if (chunk.length >= chunkBytes) {
        const buf = Buffer.from(chunk, 'utf8');
        chunk = '';
        bytes += buf.length;
        await fh.write(buf);
      }
    };
    let firstKind = true;
    for (const k of ENTITY_KINDS) {
      await put(`${firstKind ? '' : ','}${JSON.stringify(k)}:[`);
      firstKind = false;
      let first = true;
      for (const e of entities[k] as Iterable<unknown>) {
        await put(first ? JSON.stringify(e) : `,${JSON.stringify(e)}`);
        first = false;
      }
      await put(']');
    }
    chunk += '}}';
    const buf = Buffer.from(chunk, 'utf8');
    bytes += buf.length;
    await fh.write(buf);
    await fh.sync();
  } finally {
    await fh.close();
  }
  return bytes;
}

/** fsyncs a directory (a file created or renamed in it is then on disk). */
export async function syncDir(dir: string): Promise<void> {
  const d = await open(dir, 'r');
  try {
    await d.sync();
  } catch {
    // Some file systems refuse fsync on a directory; the rename is still atomic.
  } finally {
    await d.close();
  }
}
