import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import * as grpc from '@grpc/grpc-js';
import { newId, type DpAgentSession } from '@warren/shared';
import { startTestApi, type Account, type TestApi } from '../../../../test/support/api.js';
import { configStreamCodec, loadConfigProto, sessionToProto, tunnelToProto, type ControlMessage__Output, type NodeMessage } from '../../../shared/src/proto/index.js';
import type { ReportedTunnel } from '../../../ingress/src/config/index.js';
import { hashToken } from '../auth/tokens.js';
import { cleanupNodes, connectedNode, metricValue, newNode, startTestPush } from './testing.js';
import { messageBytesBound, splitSnapshot } from './snapshot-parts.js';
import type { ConfigPush } from './index.js';

/**
 * Snapshots and full syncs in parts, against a real control plane (Postgres, gRPC): the part
 * size and the receive limits are set small, so a config of a few hundred KB stands for one
 * past the 256 MiB a node accepts per message.
 */

const PART_BYTES = 32 * 1024;
const NODE_RECEIVE_LIMIT = 64 * 1024;

let api: TestApi;
let push: ConfigPush & { registry: import('prom-client').Registry };
let acct: Account;
let target: string;
const creds: { id: string; token: string }[] = [];

beforeAll(async () => {
  api = await startTestApi();
  push = await startTestPush(api.db, { snapshotPartBytes: PART_BYTES });
  target = `127.0.0.1:${push.port}`;
  acct = await api.account('parts');
  // 40 credentials of 100 ACL entries (~6.5 KB each): ~260 KB of config, four times the node's
  // receive limit in these tests.
  const acl = Array.from({ length: 100 }, (_, i) => `bind:${String(i).padStart(3, '0')}-${'h'.repeat(50)}.example.com`);
  for (let i = 0; i < 40; i++) {
    const r = await acct.call('POST', '/credentials', { acl });
    expect(r.status).toBe(201);
    creds.push({ id: r.body.id, token: r.body.token });
  }
}, 60_000);
afterEach(async () => {
  await cleanupNodes();
  for (const c of raw.splice(0)) c.close();
});
afterAll(async () => {
  await push?.stop(1_000);
  await api?.close();
});

const raw: grpc.Client[] = [];

/** A bare gRPC client of ConfigService: hello as given, and every message it receives. */
function rawNode(hello: NodeMessage['hello'], maxReceive?: number) {
  const Service = loadConfigProto().ConfigService;
  const c = new Service(target, grpc.credentials.createInsecure(), maxReceive ? { 'grpc.max_receive_message_length': maxReceive } : {});
  raw.push(c);
  const call = c.Connect(new grpc.Metadata());
  const received: ControlMessage__Output[] = [];
  let error: grpc.ServiceError | null = null;
  call.on('data', (m: ControlMessage__Output) => received.push(m));
  call.on('error', (e: grpc.ServiceError) => (error = e));
  call.write({ hello: { nodeAddress: '127.0.0.1:9', ...hello } });
  /** Snapshot messages up to and including the one without `more`. */
  const snapshot = async () => {
    await expect.poll(() => error?.message ?? received.some((m) => m.msg === 'snapshot' && !m.snapshot!.more), { timeout: 5_000, interval: 10 }).toBe(true);
    return received.filter((m) => m.msg === 'snapshot').map((m) => m.snapshot!);
  };
  return { call, received, snapshot, error: () => error };
}

describe('snapshot in parts', () => {
  it('a config larger than a node takes in one message reaches a new node in parts, and it serves it', async () => {
    // What one message would be: the whole config, past the node's limit.
    const whole = rawNode({ nodeId: `whole-${randomBytes(4).toString('hex')}` });
    const single = await whole.snapshot();
    expect(single).toHaveLength(1);
    expect(messageBytesBound(single[0]!)).toBeGreaterThan(4 * NODE_RECEIVE_LIMIT);

    // A node that takes parts, with a receive limit the whole would break: every part fits.
    const n = rawNode({ nodeId: `parts-${randomBytes(4).toString('hex')}`, parts: true }, NODE_RECEIVE_LIMIT);
    const parts = await n.snapshot();
    expect(n.error()).toBeNull();
    expect(parts.length).toBeGreaterThanOrEqual(8);
    expect(parts.map((p) => p.part)).toEqual(parts.map((_, i) => i));
    expect(parts.map((p) => p.more)).toEqual(parts.map((_, i) => i < parts.length - 1));
    expect(new Set(parts.map((p) => `${p.version}/${p.epoch}`)).size).toBe(1);
    expect(parts.flatMap((p) => p.resources?.credentials ?? []).map((c) => c.id).sort()).toEqual(creds.map((c) => c.id).sort());

    // The ingress client: applies it once the last part is in, and authenticates every credential.
    const before = (await metricValue(push.registry, 'warren_control_plane_config_snapshot_parts_total')) ?? 0;
    const node = await connectedNode([target], { maxReceiveBytes: NODE_RECEIVE_LIMIT });
    const cfg = node.client.config!;
    expect(cfg.version).toBe(parts[0]!.version);
    for (const c of creds) expect(cfg.credentialsByTokenHash.get(hashToken(c.token))?.id).toBe(c.id);
    expect(cfg.credentials.get(creds[0]!.id)!.acl).toHaveLength(100);
    expect((await metricValue(push.registry, 'warren_control_plane_config_snapshot_parts_total'))! - before).toBeGreaterThanOrEqual(8);
    expect(await metricValue(node.registry, 'warren_ingress_config_applies_total', { kind: 'snapshot', result: 'ok' })).toBe(1);
  });

  it('rolling upgrade: a node without parts gets one Snapshot, one with parts gets parts, and both apply the same config', async () => {
    const old = rawNode({ nodeId: `old-${randomBytes(4).toString('hex')}` });
    const neu = rawNode({ nodeId: `new-${randomBytes(4).toString('hex')}`, parts: true });
    const [o, p] = [await old.snapshot(), await neu.snapshot()];
    expect(o).toHaveLength(1);
    expect(o[0]).toMatchObject({ part: 0, more: false });
    expect(p.length).toBeGreaterThan(1);
    const ids = (l: typeof o) => l.flatMap((s) => s.resources?.credentials ?? []).map((c) => c.id).sort();
    expect(ids(p)).toEqual(ids(o));
    // The welcome says the control plane takes a full sync in parts.
    expect(neu.received.find((m) => m.msg === 'welcome')!.welcome!.parts).toBe(true);

    // The ingress client acting as a node from before parts gets the whole snapshot and applies it.
    const a = await connectedNode([target], { parts: false });
    const b = await connectedNode([target]);
    expect(a.client.config!.credentials.size).toBe(b.client.config!.credentials.size);
    expect(a.client.config!.version).toBe(b.client.config!.version);
  });

  it('splits by size: an entity past the target goes alone, and the bound covers the encoding', () => {
    const big = { id: 'cr_big', accountId: 'ac_1', tokenHash: 'f'.repeat(64), acl: Array.from({ length: 100 }, () => 'x'.repeat(256)) };
    const small = (i: number) => ({ id: `cr_${i}`, accountId: 'ac_1', tokenHash: 'a'.repeat(64), acl: ['*'] });
    const { parts } = splitSnapshot({ version: 3, epoch: 'e', committedAtUnixMs: 1, resources: { credentials: [small(1), big, small(2)] }, remoteTunnels: [] }, 1_000);
    expect(parts.map((p) => p.resources!.credentials!.map((c) => c.id))).toEqual([['cr_1'], ['cr_big'], ['cr_2']]);
    const { encodeControl } = configStreamCodec();
    for (const p of parts) expect(encodeControl({ snapshot: p, headVersion: 3 }).length).toBeLessThanOrEqual(64 + messageBytesBound(p));
  });
});

describe('full sync in parts', () => {
  const session = (): DpAgentSession => ({ id: newId('ts'), accountId: acct.accountId, credentialId: creds[0]!.id, agentVersion: '3', os: 'linux', ip: '203.0.113.9', metadata: '', startedAt: new Date().toISOString() });
  const tunnel = (sessionId: string, i: number): ReportedTunnel => ({
    id: newId('tn'),
    accountId: acct.accountId,
    sessionId,
    proto: 'labeled',
    labels: { app: 'web', n: String(i) },
    publicUrl: '',
    bindings: [],
    poolingEnabled: false,
    forwardsTo: 'http://localhost:3000',
    metadata: 'm'.repeat(400),
    startedAt: new Date().toISOString(),
  });
  const rowsOf = async (nodeId: string) => Number((await api.db.query<{ n: string }>('SELECT count(*) AS n FROM tunnels WHERE ingress_node = $1', [nodeId])).rows[0]!.n);

  it('every part\'s tunnels reach the directory, not only the last part\'s', async () => {
    const nodeId = `fs-${randomBytes(4).toString('hex')}`;
    const n = rawNode({ nodeId, parts: true });
    const s = session();
    const tunnels = Array.from({ length: 100 }, (_, i) => tunnel(s.id, i));
    // Five parts of 20 tunnels; the session in the first.
    for (let i = 0; i < 5; i++) {
      n.call.write({ fullSync: { sessions: i === 0 ? [sessionToProto(s)] : [], tunnels: tunnels.slice(i * 20, i * 20 + 20).map(tunnelToProto), part: i, more: i < 4 } });
    }
    const watcher = await connectedNode([target]);
    await expect.poll(() => rowsOf(nodeId), { timeout: 5_000, interval: 20 }).toBe(100);
    await expect.poll(() => [...watcher.client.remoteTunnels.values()].filter((t) => t.nodeId === nodeId).length, { timeout: 5_000 }).toBe(100);
  });

  it('a part out of sequence ends the stream, and nothing of it is written', async () => {
    const nodeId = `fs-bad-${randomBytes(4).toString('hex')}`;
    const n = rawNode({ nodeId, parts: true });
    const s = session();
    n.call.write({ fullSync: { sessions: [sessionToProto(s)], tunnels: [tunnelToProto(tunnel(s.id, 0))], part: 0, more: true } });
    n.call.write({ fullSync: { tunnels: [tunnelToProto(tunnel(s.id, 1))], part: 2, more: false } });
    await expect.poll(() => n.error()?.code, { timeout: 5_000 }).toBe(grpc.status.FAILED_PRECONDITION);
    expect(await rowsOf(nodeId)).toBe(0);
    expect(await metricValue(push.registry, 'warren_control_plane_config_stream_errors_total', { reason: 'bad_full_sync' })).toBeGreaterThanOrEqual(1);
  });

  it('the ingress client sends a full sync larger than one part in parts, all of it arriving', async () => {
    // Known before it connects: the hello's full sync carries them (≈ 300 × 500 B: ~10 parts).
    const node = await newNode([target], { fullSyncPartBytes: 16 * 1024 });
    const s = session();
    node.client.sessionUp(s);
    for (let i = 0; i < 300; i++) node.client.tunnelUp(tunnel(s.id, i));
    await node.client.start();
    await expect.poll(() => rowsOf(node.nodeId), { timeout: 5_000, interval: 20 }).toBe(300);
  });
});
