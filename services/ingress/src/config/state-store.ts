import { randomBytes } from 'node:crypto';
import { mkdir, open, readFile, rename, unlink } from 'node:fs/promises';
import path from 'node:path';
import type { DataPlaneConfig, DpTunnel } from '@warren/shared';
import type { DpEntityLists } from '../../../shared/src/proto/index.js';
import { toLists } from './config-state.js';

/**
 * Format of the config file. 2 added `entities.eventSubscriptions`; a format-1 file still loads
 * (without subscriptions), and the client then asks the control plane for a snapshot rather
 * than a delta, which would not carry the subscriptions that existed before.
 */
export const CONFIG_FORMAT = 2;
const CONFIG_FORMATS_READ: ReadonlySet<number> = new Set([1, 2]);
const TUNNELS_FORMAT = 1;
export const CONFIG_FILE = 'config.json';
export const TUNNELS_FILE = 'remote-tunnels.json';

export interface StoredConfig {
  format: number;
  epoch: string;
  version: number;
  savedAt: string;
  entities: DpEntityLists;
}

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
  const d = await open(dir, 'r');
  try {
    await d.sync();
  } catch {
    // Some file systems refuse fsync on a directory; the rename is still atomic.
  } finally {
    await d.close();
  }
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

/** The node's persisted state in `dir`: the last good config and the remote tunnels. */
export class StateStore {
  private readonly configWriter: LatestWriter<{ cfg: DataPlaneConfig; epoch: string }>;
  private readonly tunnelsWriter: LatestWriter<DpTunnel[]>;

  constructor(readonly dir: string) {
    this.configWriter = new LatestWriter(({ cfg, epoch }) => {
      const stored: StoredConfig = { format: CONFIG_FORMAT, epoch, version: cfg.version, savedAt: new Date().toISOString(), entities: toLists(cfg) };
      return writeFileAtomic(path.join(this.dir, CONFIG_FILE), JSON.stringify(stored));
    });
    this.tunnelsWriter = new LatestWriter((tunnels) => {
      const stored: StoredTunnels = { format: TUNNELS_FORMAT, savedAt: new Date().toISOString(), tunnels };
      return writeFileAtomic(path.join(this.dir, TUNNELS_FILE), JSON.stringify(stored));
    });
  }

  saveConfig(cfg: DataPlaneConfig, epoch: string): Promise<void> {
    return this.configWriter.save({ cfg, epoch });
  }

  saveTunnels(tunnels: DpTunnel[]): Promise<void> {
    return this.tunnelsWriter.save(tunnels);
  }

  async flush(): Promise<void> {
    await Promise.all([this.configWriter.flush(), this.tunnelsWriter.flush()]);
  }

  /** The persisted config, or null when there is none. Throws when the file is unreadable or malformed. */
  async loadConfig(): Promise<StoredConfig | null> {
    const raw = await readOptional(path.join(this.dir, CONFIG_FILE));
    if (raw === null) return null;
    const v = JSON.parse(raw) as StoredConfig;
    if (!CONFIG_FORMATS_READ.has(v?.format) || typeof v.version !== 'number' || typeof v.epoch !== 'string' || typeof v.entities !== 'object' || v.entities === null)
      throw new Error(`${CONFIG_FILE}: not a config file of format ${[...CONFIG_FORMATS_READ].join(' or ')}`);
    // Format 1 predates event subscriptions.
    if (!Array.isArray(v.entities.eventSubscriptions)) v.entities.eventSubscriptions = [];
    return v;
  }

  async loadTunnels(): Promise<DpTunnel[]> {
    const raw = await readOptional(path.join(this.dir, TUNNELS_FILE));
    if (raw === null) return [];
    const v = JSON.parse(raw) as StoredTunnels;
    if (v?.format !== TUNNELS_FORMAT || !Array.isArray(v.tunnels)) throw new Error(`${TUNNELS_FILE}: not a tunnels file of format ${TUNNELS_FORMAT}`);
    return v.tunnels;
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
