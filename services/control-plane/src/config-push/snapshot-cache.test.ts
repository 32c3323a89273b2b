import { describe, expect, it } from 'vitest';
import { SnapshotCache, type SharedSnapshot } from './snapshot-cache.js';

/** A cache whose builds read `db.version` (a stand-in for the config at the head). */
function cache(db: { version: number; epoch: string }) {
  let builds = 0;
  const c = new SnapshotCache({
    lingerMs: 60_000,
    build: async (): Promise<SharedSnapshot> => {
      builds++;
      return { version: db.version, epoch: db.epoch, committedAtMs: 0, parts: [Buffer.from(`content@${db.version}`)], bytes: 10 };
    },
  });
  return { c, builds: () => builds };
}

describe('SnapshotCache', () => {
  it('shares one build between nodes syncing the same version', async () => {
    const db = { version: 100, epoch: 'E' };
    const { c, builds } = cache(db);
    const [a, b] = await Promise.all([c.acquire(100, 'E'), c.acquire(100, 'E')]);
    expect([a.snapshot.version, b.snapshot.version, builds()]).toEqual([100, 100, 1]);
    a.release();
    b.release();
    c.clear();
  });

  it('after invalidate (the version sequence went back in the same epoch) no older entry of a higher version is handed out', async () => {
    // A database restored from a backup keeps its epoch and goes back in version; an entry of the
    // old, higher version would pass for newer than the head, and the node would then skip the
    // writes that reuse its version numbers.
    const db = { version: 100, epoch: 'E' };
    const { c, builds } = cache(db);
    const held = await c.acquire(100, 'E'); // a slow node still sending from it
    db.version = 97;
    c.invalidate();
    const fresh = await c.acquire(97, 'E');
    expect([fresh.snapshot.version, fresh.snapshot.parts[0]!.toString(), builds()]).toEqual([97, 'content@97', 2]);
    // The stream that held the old entry still has it until it lets go.
    expect(held.snapshot.version).toBe(100);
    held.release();
    fresh.release();
    c.clear();
  });
});
