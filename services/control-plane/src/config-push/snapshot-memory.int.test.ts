import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { fork, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { randomBytes } from 'node:crypto';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { startTestApi, type Account, type TestApi } from '../../../../test/support/api.js';
import { configStreamCodec, resourcesToProto } from '../../../shared/src/proto/index.js';
import { readSnapshot } from './config-reader.js';
import { metricValue, startTestPush } from './testing.js';
import type { ConfigPush } from './index.js';

/**
 * Memory of the control plane while many nodes take a large snapshot at once (after a restart
 * or a network blip every node reconnects): the simulated nodes (testing-slow-nodes.mjs, a child
 * process, so that what they buffer does not count here) read the first message of the snapshot
 * and then nothing, as a slow or stuck node would, and the test process (the control plane)
 * measures what it holds. SNAPSHOT_MEM_CREDENTIALS (default 4,000 of ~7.6 KB: ~30 MB) and
 * SNAPSHOT_MEM_NODES (default 8) scale it up for a measurement; SNAPSHOT_MEM_PART_BYTES sets
 * the part size (default 1 MiB, so that a config of a few tens of MB is many parts).
 */

const CREDENTIALS = Number(process.env.SNAPSHOT_MEM_CREDENTIALS ?? 4_000);
const NODES = Number(process.env.SNAPSHOT_MEM_NODES ?? 8);
const PART_BYTES = Number(process.env.SNAPSHOT_MEM_PART_BYTES ?? 1024 * 1024);
const ACL_ENTRIES = 100;

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

let api: TestApi;
let push: ConfigPush & { registry: import('prom-client').Registry };
let acct: Account;
let target: string;
/** The whole snapshot as one message, encoded. */
let snapshotBytes = 0;
let snapshotVersion = 0;

beforeAll(async () => {
  api = await startTestApi();
  acct = await api.account('snapshot-memory');
  // Inserted directly (the API would take minutes): credentials of 100 ACL entries of ~70 bytes.
  await api.db.query(
    `INSERT INTO credentials (id, account_id, token_hash, acl)
     SELECT 'cr_mem' || lpad(g::text, 8, '0'), $1, encode(sha256(('mem' || g)::bytea), 'hex'),
            ARRAY(SELECT 'bind:' || g || '-' || i || '-' || repeat('h', 50) || '.example.com' FROM generate_series(1, $3::int) i)
     FROM generate_series(1, $2::int) g`,
    [acct.accountId, CREDENTIALS, ACL_ENTRIES],
  );
  const snap = await readSnapshot(api.db.pool);
  snapshotVersion = snap.version;
  snapshotBytes = configStreamCodec().encodeControl({ snapshot: { version: snap.version, epoch: snap.epoch, resources: resourcesToProto(snap.entities), remoteTunnels: [] } }).length;
  // Nodes here stay paused for a while on purpose: no stall timeout in the way (it has its own test).
  // A lease of 10 s, not the tests' usual 1.5 s: the simulated nodes' keep-alives come from another
  // process, which a loaded CI box can stall for longer than that (the stream then ended as silent).
  push = await startTestPush(api.db, { snapshotPartBytes: PART_BYTES, maxConcurrentSyncs: 4, snapshotStallMs: 300_000, snapshotLingerMs: 300, leaseMs: 10_000 });
  target = `127.0.0.1:${push.port}`;
}, 300_000);
afterEach(() => {
  for (const c of children.splice(0)) c.kill();
});
afterAll(async () => {
  await push?.stop(1_000);
  await api?.close();
});

interface NodeResult {
  nodeId: string;
  /** What arrived in order: s(napshot part), d(elta), t(unnels), h(eartbeat), w(elcome). */
  seq: string;
  parts: { part: number; more: boolean; version: number }[];
  credentials: number;
  version: number;
  error: string | null;
  after: { msg: string; from?: number; version: number }[];
}

const children: ChildProcess[] = [];

/** A child process of simulated nodes (see testing-slow-nodes.mjs). */
async function slowNodes() {
  const child = fork(fileURLToPath(new URL('./testing-slow-nodes.mjs', import.meta.url)), [], { execArgv: [], stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  children.push(child);
  const messages: any[] = [];
  child.on('message', (m) => messages.push(m));
  const next = async (key: string, pred: (v: any) => boolean = () => true, timeout = 120_000): Promise<any> => {
    const until = Date.now() + timeout;
    for (;;) {
      const m = messages.find((x) => key in x && pred(x[key]));
      if (m) return m[key];
      if (Date.now() > until) throw new Error(`simulated nodes: no ${key} within ${timeout} ms`);
      await sleep(20);
    }
  };
  await next('ready');
  let total = 0;
  return {
    /** Connects nodes and waits until every node so far holds the first message of its snapshot. */
    async connect(specs: { nodeId: string; parts: boolean }[]): Promise<void> {
      total += specs.length;
      child.send({ connect: { target, nodes: specs } });
      await next('paused', (n) => n === total);
    },
    /** Lets every node read on, and waits until each has its whole snapshot. */
    async resume(): Promise<NodeResult[]> {
      child.send({ resume: true });
      return next('done');
    },
    /** What every node received so far. */
    async report(): Promise<NodeResult[]> {
      messages.length = 0;
      child.send({ report: true });
      return next('report');
    },
  };
}

/** Live memory of this process (heap and Buffers) after full collections. */
async function live(): Promise<{ heapExt: number; rss: number }> {
  for (let i = 0; i < 3; i++) {
    gc();
    await sleep(100);
  }
  const m = process.memoryUsage();
  return { heapExt: m.heapUsed + m.external, rss: m.rss };
}

const mb = (n: number) => `${(n / 1024 / 1024).toFixed(1)} MiB`;
const id = (p: string) => `${p}-${randomBytes(4).toString('hex')}`;

describe('snapshot memory with many nodes connecting at once', () => {
  it('the memory per additional node stays a few parts, not the snapshot, and every node gets all of it', async () => {
    expect(snapshotBytes).toBeGreaterThan(20 * PART_BYTES);
    const nodes = await slowNodes();
    const base = await live();
    await nodes.connect([{ nodeId: id('mem'), parts: true }]);
    await sleep(500);
    const one = await live();
    await nodes.connect(Array.from({ length: NODES - 1 }, () => ({ nodeId: id('mem'), parts: true })));
    await sleep(1_000);
    const all = await live();
    const perExtra = (all.heapExt - one.heapExt) / (NODES - 1);
    const perExtraRss = (all.rss - one.rss) / (NODES - 1);
    console.log(
      `snapshot ${mb(snapshotBytes)} in parts of ${mb(PART_BYTES)}; heap+external: base ${mb(base.heapExt)}, 1 node +${mb(one.heapExt - base.heapExt)}, ` +
        `${NODES} nodes +${mb(all.heapExt - base.heapExt)}: ${mb(perExtra)} per additional node (rss ${mb(perExtraRss)})`,
    );
    // Generous: a handful of parts per node (in flight on its stream), never a copy of the snapshot.
    expect(perExtra).toBeLessThan(Math.max(8 * PART_BYTES, snapshotBytes / 4));

    const results = await nodes.resume();
    expect(results).toHaveLength(NODES);
    for (const r of results) {
      expect(r.error).toBeNull();
      expect(r.version).toBe(snapshotVersion);
      expect(r.credentials).toBe(CREDENTIALS);
      expect(r.parts.map((p) => p.part)).toEqual(r.parts.map((_, i) => i));
      expect(r.parts.map((p) => p.more)).toEqual(r.parts.map((_, i) => i < r.parts.length - 1));
    }
    // Encoded once for all of them.
    expect(await metricValue(push.registry, 'warren_control_plane_config_snapshot_encodes_total')).toBe(1);
  }, 300_000);
});

async function headVersion(): Promise<number> {
  return (await api.db.query<{ version: number }>('SELECT version FROM config_state')).rows[0]!.version;
}

describe('a snapshot in parts to a slow node', () => {
  it('a delta committed while the node is in the middle of its snapshot comes after the last part, in order, and the node ends at the head', async () => {
    const nodes = await slowNodes();
    await nodes.connect([{ nodeId: id('slow'), parts: true }]);
    // The node holds part 0 and reads no more; the control plane has the rest to send.
    const deltasBefore = (await metricValue(push.registry, 'warren_control_plane_config_deltas_total')) ?? 0;
    const r1 = await acct.call('POST', '/credentials', { acl: ['bind:one.example.com'] });
    expect(r1.status).toBe(201);
    const r2 = await acct.call('POST', '/credentials', { acl: ['bind:two.example.com'] });
    expect(r2.status).toBe(201);
    const head = await headVersion();
    await expect.poll(async () => (await metricValue(push.registry, 'warren_control_plane_config_delta_version')) ?? 0, { timeout: 10_000 }).toBe(head);
    expect((await metricValue(push.registry, 'warren_control_plane_config_deltas_total'))! - deltasBefore).toBeGreaterThanOrEqual(1);
    await sleep(300);

    const [done] = await nodes.resume();
    expect(done!.error).toBeNull();
    expect(done!.version).toBeLessThan(head);
    expect(done!.credentials).toBe(CREDENTIALS);
    let r: NodeResult;
    await expect
      .poll(async () => {
        [r] = (await nodes.report()) as [NodeResult];
        return r.after.at(-1)?.version;
      }, { timeout: 10_000 })
      .toBe(head);
    r = r!;
    // Welcome, the parts back to back (heartbeats may come between them: the node takes those),
    // and only then the deltas, each following on from the one before, to the head.
    const seq = r.seq.replace(/h/g, '');
    expect(seq).toMatch(/^ws+d+$/);
    expect(seq.replace(/[^s]/g, '')).toHaveLength(r.parts.length);
    const deltas = r.after.filter((a) => a.msg === 'delta');
    expect(deltas[0]!.from).toBeLessThanOrEqual(r.version);
    for (let i = 1; i < deltas.length; i++) expect(deltas[i]!.from).toBeLessThanOrEqual(deltas[i - 1]!.version);
    expect(deltas.at(-1)!.version).toBe(head);
  }, 120_000);

  it('a node that takes no part for snapshotStallMs is ended as a slow reader', async () => {
    const short = await startTestPush(api.db, { snapshotPartBytes: PART_BYTES, snapshotStallMs: 1_000 });
    try {
      const nodes = await slowNodes();
      target = `127.0.0.1:${short.port}`;
      await nodes.connect([{ nodeId: id('stuck'), parts: true }]);
      // It sends keep-alives (it is not silent) but reads nothing more (so it does not see the
      // stream's end either, behind what it has not read): the control plane ends the stream.
      await expect.poll(async () => metricValue(short.registry, 'warren_control_plane_config_stream_errors_total', { reason: 'slow_reader' }), { timeout: 10_000 }).toBe(1);
      expect(await metricValue(short.registry, 'warren_control_plane_config_nodes_connected')).toBe(0);
      // What it was sent of the snapshot was let go: nothing is held once the linger is over.
      await expect.poll(async () => metricValue(short.registry, 'warren_control_plane_config_snapshot_cache_bytes'), { timeout: 10_000 }).toBe(0);
    } finally {
      target = `127.0.0.1:${push.port}`;
      await short.stop(1_000);
    }
  }, 60_000);

  it('a node without parts (from before them) gets the snapshot whole, in one message', async () => {
    const nodes = await slowNodes();
    await nodes.connect([{ nodeId: id('legacy'), parts: false }]);
    const [r] = await nodes.resume();
    expect(r!.error).toBeNull();
    expect(r!.parts).toEqual([{ part: 0, more: false, version: await headVersion() }]);
    expect(r!.credentials).toBe(Number((await api.db.query<{ n: string }>('SELECT count(*) AS n FROM credentials')).rows[0]!.n));
  }, 60_000);

  it('an encoded snapshot is dropped once no stream needs it (after a short linger)', async () => {
    const encodes = (await metricValue(push.registry, 'warren_control_plane_config_snapshot_encodes_total'))!;
    const nodes = await slowNodes();
    await nodes.connect([{ nodeId: id('evict'), parts: true }]);
    const held = (await metricValue(push.registry, 'warren_control_plane_config_snapshot_cache_bytes'))!;
    expect(held).toBeGreaterThan(snapshotBytes / 2);
    await nodes.resume();
    // Once sent and past the linger, the memory goes.
    await expect.poll(async () => metricValue(push.registry, 'warren_control_plane_config_snapshot_cache_bytes'), { timeout: 10_000 }).toBe(0);
    expect(await metricValue(push.registry, 'warren_control_plane_config_snapshot_encodes_total')).toBe(encodes + 1);
  }, 60_000);
});
