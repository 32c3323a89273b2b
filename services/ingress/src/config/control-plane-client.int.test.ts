import { afterEach, describe, expect, it } from 'vitest';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import client from 'prom-client';
import { createLogger, type DataPlaneConfig, type DpTunnel } from '@warren/shared';
import { loadConfigProto, resourcesToProto, tunnelToProto, type ControlMessage, type NodeMessage__Output, type Resources } from '../../../shared/src/proto/index.js';
import { ControlPlaneClient, type ControlPlaneClientOptions } from './index.js';

/**
 * The ingress client against a scripted control plane: a real gRPC server on localhost:0 whose
 * messages each test chooses, to reach the paths a healthy control plane never takes.
 */

interface FakeCall {
  received: NodeMessage__Output[];
  send(m: ControlMessage): void;
  end(): void;
  next(kind: NonNullable<NodeMessage__Output['msg']>): Promise<NodeMessage__Output>;
}

async function fakeControlPlane(serverOptions: grpc.ServerOptions = {}) {
  const calls: FakeCall[] = [];
  const waiters: ((c: FakeCall) => void)[] = [];
  const server = new grpc.Server(serverOptions);
  server.addService(loadConfigProto().ConfigService.service, {
    Connect: (call: grpc.ServerDuplexStream<NodeMessage__Output, ControlMessage>) => {
      const received: NodeMessage__Output[] = [];
      const listeners: (() => void)[] = [];
      let seen = 0;
      call.on('data', (m: NodeMessage__Output) => {
        received.push(m);
        for (const l of [...listeners]) l();
      });
      call.on('error', () => {});
      const fc: FakeCall = {
        received,
        send: (m) => call.write(m),
        end: () => call.end(),
        next: (kind) =>
          new Promise((resolve) => {
            const check = () => {
              while (seen < received.length) {
                const m = received[seen++]!;
                if (m.msg === kind) {
                  listeners.splice(listeners.indexOf(check), 1);
                  return resolve(m);
                }
              }
            };
            listeners.push(check);
            check();
          }),
      };
      calls.push(fc);
      waiters.splice(0).forEach((w) => w(fc));
    },
  });
  const port = await new Promise<number>((resolve, reject) => server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))));
  return {
    target: `127.0.0.1:${port}`,
    calls,
    nextCall: () => new Promise<FakeCall>((r) => waiters.push(r)),
    stop: () => server.forceShutdown(),
  };
}

const cleanup: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c();
});

async function setup(over: Partial<ControlPlaneClientOptions> = {}, serverOptions: grpc.ServerOptions = {}) {
  const cp = await fakeControlPlane(serverOptions);
  cleanup.push(() => cp.stop());
  const stateDir = over.stateDir ?? (await mkdtemp(path.join(tmpdir(), 'warren-cpc-')));
  if (!over.stateDir) cleanup.push(() => rm(stateDir, { recursive: true, force: true }));
  const registry = new client.Registry();
  const c = new ControlPlaneClient({
    targets: [cp.target],
    nodeId: 'node-a',
    nodeAddress: '127.0.0.1:9100',
    stateDir,
    registry,
    log: createLogger('cpc-test', 'silent'),
    backoff: { initialMs: 10, maxMs: 50 },
    ...over,
  });
  cleanup.push(() => c.stop());
  return { cp, c, stateDir, registry };
}

const welcome = (keepaliveIntervalMs = 1_000, parts = false): ControlMessage => ({ welcome: { replicaId: 'fake', leaseMs: 10_000, keepaliveIntervalMs, epoch: 'e1', parts } });
const none = () => ({ edges: [], routes: [], backends: [], ipPolicies: [], certificateAuthorities: [], credentials: [], eventSubscriptions: [] });
const edge = (id: string) => ({ id, accountId: 'ac_1', hostports: [`${id}.example.com:443`], mutualTls: null, tlsTermination: null });
const route = (id: string, edgeId: string, match = '/') => ({ id, accountId: 'ac_1', edgeId, matchType: 'path_prefix' as const, match, modules: {}, backendId: null, ipPolicyIds: [], trafficPolicy: null });
const snapshot = (version: number, resources: Resources, remoteTunnels: DpTunnel[] = []): ControlMessage => ({ snapshot: { version, epoch: 'e1', resources, remoteTunnels: remoteTunnels.map(tunnelToProto), committedAtUnixMs: Date.now() }, headVersion: version });
const delta = (from: number, version: number, upserts: Resources): ControlMessage => ({ delta: { fromVersion: from, version, epoch: 'e1', upserts, deletes: {}, committedAtUnixMs: Date.now() }, headVersion: version });
const remote = (id: string): DpTunnel => ({ id, accountId: 'ac_1', sessionId: 'ts_1', proto: 'labeled', labels: { a: 'b' }, publicUrl: '', bindings: [], poolingEnabled: false, forwardsTo: '', metadata: '', startedAt: '2026-01-01T00:00:00.000Z', nodeId: 'node-b', nodeAddress: '127.0.0.2:9100' });

describe('ControlPlaneClient', () => {
  it('says hello with a full sync, and re-syncs its sessions and tunnels after every reconnect', async () => {
    const { cp, c } = await setup();
    c.sessionUp({ id: 'ts_1', accountId: 'ac_1', credentialId: 'cr_1', agentVersion: '1', os: 'linux', ip: '1.2.3.4', metadata: '', startedAt: '2026-01-01T00:00:00Z' });
    const first = cp.nextCall();
    await c.start();
    const call = await first;
    const hello = await call.next('hello');
    expect(hello.hello).toMatchObject({ nodeId: 'node-a', nodeAddress: '127.0.0.1:9100', appliedVersion: 0, epoch: '' });
    expect((await call.next('fullSync')).fullSync!.sessions.map((s) => s.id)).toEqual(['ts_1']);
    call.send(welcome());
    await expect.poll(() => c.connected).toBe(true);

    // Live reports go out at once.
    c.tunnelUp({ id: 'tn_1', accountId: 'ac_1', sessionId: 'ts_1', proto: 'https', labels: {}, publicUrl: 'https://x', bindings: [], poolingEnabled: false, forwardsTo: '', metadata: '', startedAt: '2026-01-01T00:00:00Z' });
    expect((await call.next('tunnelUp')).tunnelUp!.tunnel!.id).toBe('tn_1');

    // Disconnected: nothing queues; the next hello's full sync has the current state.
    const second = cp.nextCall();
    const disconnected = new Promise((r) => c.once('disconnected', r));
    call.end();
    await disconnected;
    c.tunnelDown('tn_1');
    c.sessionUp({ id: 'ts_2', accountId: 'ac_1', credentialId: 'cr_1', agentVersion: '1', os: 'linux', ip: '1.2.3.4', metadata: '', startedAt: '2026-01-01T00:00:00Z' });
    const again = await second;
    await again.next('hello');
    const sync = (await again.next('fullSync')).fullSync!;
    expect(sync.sessions.map((s) => s.id).sort()).toEqual(['ts_1', 'ts_2']);
    expect(sync.tunnels).toEqual([]);
    expect(again.received.filter((m) => m.msg === 'tunnelDown' || m.msg === 'sessionUp')).toEqual([]);
  });

  it('NACKs a config that does not hold together, ACKs a good one only once it is on disk', async () => {
    const { cp, c, stateDir } = await setup();
    const first = cp.nextCall();
    await c.start();
    const call = await first;
    call.send(welcome());
    call.send(snapshot(3, resourcesToProto({ ...none(), routes: [route('r1', 'e_missing')] })));
    const nack = (await call.next('nack')).nack!;
    expect(nack.version).toBe(3);
    expect(nack.error).toMatch(/route r1: unknown edge e_missing/);
    expect(c.config).toBeNull();

    call.send(snapshot(4, resourcesToProto({ ...none(), edges: [edge('e1')], routes: [route('r1', 'e1')] })));
    expect((await call.next('ack')).ack!.version).toBe(4);
    const onDisk = JSON.parse(await readFile(path.join(stateDir, 'config.json'), 'utf8'));
    expect(onDisk).toMatchObject({ format: 2, epoch: 'e1', version: 4 });
    expect(onDisk.entities.routes[0].id).toBe('r1');
    expect(c.config!.version).toBe(4);
  });

  it('keeps the old config on a malformed or refused delta, and asks for a resync on a gap', async () => {
    const { cp, c, registry } = await setup();
    const swaps: [number, number | null][] = [];
    c.on('config', (cfg, prev) => swaps.push([cfg.version, prev?.version ?? null]));
    c.addValidator((cand) => {
      if ([...cand.routes.values()].some((r) => r.match === '/refused')) throw new Error('refused by the router');
    });
    const first = cp.nextCall();
    await c.start();
    const call = await first;
    call.send(welcome());
    call.send(snapshot(10, resourcesToProto({ ...none(), edges: [edge('e1')] })));
    await call.next('ack');
    const good = c.config;

    const malformed = delta(10, 11, resourcesToProto({ ...none(), routes: [route('r1', 'e1')] }));
    malformed.delta!.upserts!.routes![0]!.modulesJson = '{oops';
    call.send(malformed);
    expect((await call.next('nack')).nack).toMatchObject({ version: 11, error: expect.stringMatching(/modules_json: invalid JSON/) });
    call.send(delta(10, 11, resourcesToProto({ ...none(), routes: [route('r1', 'e1', '/refused')] })));
    expect((await call.next('nack')).nack).toEqual({ version: 11, error: 'refused by the router' });
    expect(c.config).toBe(good);

    // 12 follows 11, which this node refused: it asks for a delta from 10 (once).
    call.send(delta(11, 12, resourcesToProto(none())));
    call.send(delta(12, 13, resourcesToProto(none())));
    expect((await call.next('resync')).resync).toEqual({ appliedVersion: 10, epoch: 'e1' });
    call.send(delta(10, 13, resourcesToProto({ ...none(), routes: [route('r1', 'e1', '/ok')] })));
    expect((await call.next('ack')).ack!.version).toBe(13);
    expect(c.config!.routes.get('r1')!.match).toBe('/ok');
    // Old news is ignored.
    call.send(delta(9, 12, resourcesToProto({ ...none(), edges: [edge('stale')] })));
    await new Promise((r) => setTimeout(r, 50));
    expect(c.config!.edges.has('stale')).toBe(false);
    expect(call.received.filter((m) => m.msg === 'resync')).toHaveLength(1);
    expect(swaps).toEqual([
      [10, null],
      [13, 10],
    ]);
    const rejected = (await registry.getSingleMetric('warren_ingress_config_applies_total')!.get()).values.find((v) => v.labels.result === 'rejected');
    expect(rejected?.value).toBe(2);
    expect(c.connected).toBe(true);
  });

  it('reconnects when the control plane falls silent', async () => {
    const { cp, c } = await setup();
    const first = cp.nextCall();
    await c.start();
    const call = await first;
    call.send(welcome(100)); // expects an answer to each keep-alive; this fake never answers
    await call.next('keepAlive');
    const second = await cp.nextCall();
    expect((await second.next('hello')).hello!.nodeId).toBe('node-a');
  });

  it('reconnects to sync afresh when it stays behind the announced head, but not for a version it refused', async () => {
    const { cp, c } = await setup({ maxConfigLagMs: 300 });
    const first = cp.nextCall();
    await c.start();
    const call = await first;
    call.send(welcome(100));
    call.send(snapshot(5, resourcesToProto({ ...none(), edges: [edge('edghts_1')] })));
    await expect.poll(() => c.config?.version).toBe(5);
    // A heartbeat answers each keep-alive and announces head 7; the delta to 7 never comes
    // (a control plane whose sync of this node stalled).
    const answer = async () => {
      for (;;) {
        await call.next('keepAlive');
        call.send({ heartbeat: {}, headVersion: 7 });
      }
    };
    void answer();
    const second = await cp.nextCall();
    const hello = (await second.next('hello')).hello!;
    expect([Number(hello.appliedVersion), hello.epoch]).toEqual([5, 'e1']);
    second.send(welcome(100));
    second.send(delta(5, 7, resourcesToProto({ ...none(), edges: [edge('edghts_1'), edge('edghts_2')] })));
    await expect.poll(() => c.config?.version).toBe(7);

    // A version it refused is no stall: it stays on this stream.
    second.send(delta(7, 8, resourcesToProto({ ...none(), routes: [route('edghtsrt_1', 'edghts_missing')] })));
    await second.next('nack');
    let reconnected = false;
    void cp.nextCall().then(() => (reconnected = true));
    for (let i = 0; i < 8; i++) {
      await second.next('keepAlive');
      second.send({ heartbeat: {}, headVersion: 8 });
    }
    expect(reconnected).toBe(false);
    expect(c.config?.version).toBe(7);
  });

  it('persists remote tunnels and serves them (and the config) from disk when no control plane answers', async () => {
    const { cp, c, stateDir } = await setup();
    const first = cp.nextCall();
    await c.start();
    const call = await first;
    call.send(welcome());
    call.send(snapshot(5, resourcesToProto({ ...none(), edges: [edge('e1')] }), [remote('tn_r1')]));
    await call.next('ack');
    call.send({ tunnels: { up: [tunnelToProto(remote('tn_r2'))], down: ['tn_r1'], replaceAll: false } });
    await expect.poll(() => [...c.remoteTunnels.keys()]).toEqual(['tn_r2']);
    // Announcements about this node's own tunnels are ignored.
    call.send({ tunnels: { up: [tunnelToProto({ ...remote('tn_own'), nodeId: 'node-a' })], down: [], replaceAll: false } });
    await c.stop();
    const stored = JSON.parse(await readFile(path.join(stateDir, 'remote-tunnels.json'), 'utf8'));
    expect(stored.tunnels.map((t: DpTunnel) => t.id)).toEqual(['tn_r2']);

    const restarted = new ControlPlaneClient({ targets: ['127.0.0.1:1'], nodeId: 'node-a', nodeAddress: '127.0.0.1:9100', stateDir, log: createLogger('cpc-test', 'silent') });
    cleanup.push(() => restarted.stop());
    const ups: string[] = [];
    const configs: DataPlaneConfig[] = [];
    restarted.on('remoteTunnelUp', (t) => ups.push(t.id));
    restarted.on('config', (cfg) => configs.push(cfg));
    await restarted.start();
    expect(ups).toEqual(['tn_r2']);
    expect(configs.map((x) => x.version)).toEqual([5]);
    expect(restarted.remoteTunnels.get('tn_r2')).toEqual(remote('tn_r2'));
    expect(restarted.connected).toBe(false);
  });
});

/** Part `part` of snapshot `version` (`more` on all but the last). */
const snapPart = (version: number, part: number, more: boolean, resources: Resources, remoteTunnels: DpTunnel[] = [], epoch = 'e1'): ControlMessage => ({
  snapshot: { version, epoch, resources, remoteTunnels: remoteTunnels.map(tunnelToProto), committedAtUnixMs: Date.now(), part, more },
  headVersion: version,
});
const metric = async (registry: client.Registry, name: string, labels: Record<string, string>) =>
  (await registry.getSingleMetric(name)?.get())?.values.find((v) => Object.entries(labels).every(([k, x]) => v.labels[k] === x))?.value ?? 0;
const settle = () => new Promise((r) => setTimeout(r, 100));

describe('ControlPlaneClient: snapshots and full syncs in parts', () => {
  it('says it takes parts, and swaps a snapshot in parts in only at its last part', async () => {
    const { cp, c } = await setup();
    const swaps: [number, number | null][] = [];
    c.on('config', (cfg, prev) => swaps.push([cfg.version, prev?.version ?? null]));
    const first = cp.nextCall();
    await c.start();
    const call = await first;
    expect((await call.next('hello')).hello!.parts).toBe(true);
    call.send(welcome(1_000, true));
    call.send(snapshot(5, resourcesToProto({ ...none(), edges: [edge('e1')] })));
    expect((await call.next('ack')).ack!.version).toBe(5);
    const served = c.config;

    call.send(snapPart(6, 0, true, resourcesToProto({ ...none(), edges: [edge('e1'), edge('e2')] })));
    call.send(snapPart(6, 1, true, resourcesToProto({ ...none(), routes: [route('r1', 'e2')] }), [remote('tn_r1')]));
    await settle();
    // Nothing of version 6 yet: the config served, the remote tunnels and the ACKs are as before.
    expect(c.config).toBe(served);
    expect(c.remoteTunnels.size).toBe(0);
    expect(call.received.filter((m) => m.msg === 'ack' || m.msg === 'nack')).toHaveLength(1);

    call.send(snapPart(6, 2, false, resourcesToProto({ ...none(), edges: [edge('e3')] })));
    expect((await call.next('ack')).ack!.version).toBe(6);
    expect([...c.config!.edges.keys()].sort()).toEqual(['e1', 'e2', 'e3']);
    expect(c.config!.routes.get('r1')!.edgeId).toBe('e2');
    expect([...c.remoteTunnels.keys()]).toEqual(['tn_r1']);
    expect(swaps).toEqual([
      [5, null],
      [6, 5],
    ]);
  });

  it('a stream broken in the middle of a snapshot leaves the config served, and the next connection completes', async () => {
    const { cp, c } = await setup();
    const first = cp.nextCall();
    await c.start();
    const call = await first;
    call.send(welcome(1_000, true));
    call.send(snapshot(5, resourcesToProto({ ...none(), edges: [edge('e1')] })));
    await call.next('ack');

    const second = cp.nextCall();
    call.send(snapPart(6, 0, true, resourcesToProto({ ...none(), edges: [edge('e2')] })));
    call.send(snapPart(6, 1, true, resourcesToProto({ ...none(), edges: [edge('e3')] })));
    await settle();
    call.end();
    const again = await second;
    const hello = (await again.next('hello')).hello!;
    expect([Number(hello.appliedVersion), hello.epoch]).toEqual([5, 'e1']);
    expect(c.config!.version).toBe(5);
    expect([...c.config!.edges.keys()]).toEqual(['e1']);

    again.send(welcome(1_000, true));
    again.send(snapPart(6, 0, true, resourcesToProto({ ...none(), edges: [edge('e2')] })));
    again.send(snapPart(6, 1, false, resourcesToProto({ ...none(), edges: [edge('e3')] })));
    expect((await again.next('ack')).ack!.version).toBe(6);
    expect([...c.config!.edges.keys()].sort()).toEqual(['e2', 'e3']);
  });

  it('drops the partial snapshot and reconnects on a part out of sequence, a version change, or a delta before the last part', async () => {
    const { cp, c, registry } = await setup();
    let call = cp.nextCall();
    await c.start();
    let cur = await call;
    cur.send(welcome(1_000, true));
    cur.send(snapshot(5, resourcesToProto({ ...none(), edges: [edge('e1')] })));
    await cur.next('ack');
    const breaks: [string, ControlMessage][] = [
      ['part_sequence', snapPart(6, 2, false, resourcesToProto({ ...none(), edges: [edge('e3')] }))],
      ['version_change', snapPart(7, 1, false, resourcesToProto({ ...none(), edges: [edge('e3')] }))],
      ['delta_mid_snapshot', delta(5, 7, resourcesToProto({ ...none(), edges: [edge('e3')] }))],
    ];
    for (const [reason, bad] of breaks) {
      call = cp.nextCall();
      cur.send(snapPart(6, 0, true, resourcesToProto({ ...none(), edges: [edge('e2')] })));
      cur.send(bad);
      cur = await call; // it reconnects
      expect(Number((await cur.next('hello')).hello!.appliedVersion)).toBe(5);
      expect(await metric(registry, 'warren_ingress_config_protocol_errors_total', { reason })).toBe(1);
      expect([c.config!.version, [...c.config!.edges.keys()]]).toEqual([5, ['e1']]);
      cur.send(welcome(1_000, true));
    }
    expect(cur.received.filter((m) => m.msg === 'ack' || m.msg === 'nack')).toEqual([]);
  });

  it('holds at most maxSnapshotBytes of an incomplete snapshot', async () => {
    const { cp, c, registry } = await setup({ maxSnapshotBytes: 4_000 });
    const first = cp.nextCall();
    await c.start();
    const call = await first;
    call.send(welcome(1_000, true));
    call.send(snapshot(5, resourcesToProto({ ...none(), edges: [edge('e1')] })));
    await call.next('ack');
    const big = (i: number) => ({ ...edge(`big${i}`), hostports: Array.from({ length: 40 }, (_, k) => `h${k}-${'x'.repeat(40)}.example.com:443`) });
    const second = cp.nextCall();
    for (let i = 0; i < 3; i++) call.send(snapPart(6, i, true, resourcesToProto({ ...none(), edges: [big(i)] })));
    await second;
    expect(await metric(registry, 'warren_ingress_config_protocol_errors_total', { reason: 'snapshot_too_large' })).toBe(1);
    expect([c.config!.version, [...c.config!.edges.keys()]]).toEqual([5, ['e1']]);
  });

  const many = (n: number) =>
    Array.from({ length: n }, (_, i) => ({ id: `tn_${i}`, accountId: 'ac_1', sessionId: 'ts_1', proto: 'labeled', labels: { n: String(i) }, publicUrl: '', bindings: [], poolingEnabled: false, forwardsTo: '', metadata: 'm'.repeat(500), startedAt: '2026-01-01T00:00:00Z' }));
  const session1 = { id: 'ts_1', accountId: 'ac_1', credentialId: 'cr_1', agentVersion: '1', os: 'linux', ip: '1.2.3.4', metadata: '', startedAt: '2026-01-01T00:00:00Z' };

  it('sends a full sync larger than a message the control plane takes in parts, after a welcome that says it takes them', async () => {
    // This control plane takes messages of 32 KiB at most; the full sync is ~120 KB.
    const { cp, c } = await setup({ fullSyncPartBytes: 16 * 1024 }, { 'grpc.max_receive_message_length': 32 * 1024 });
    c.sessionUp(session1);
    for (const t of many(200)) c.tunnelUp(t);
    const first = cp.nextCall();
    await c.start();
    const call = await first;
    await call.next('hello');
    await settle();
    expect(call.received.filter((m) => m.msg === 'fullSync')).toEqual([]); // waits for the welcome
    call.send(welcome(1_000, true));
    await expect.poll(() => call.received.some((m) => m.msg === 'fullSync' && !m.fullSync!.more)).toBe(true);
    const parts = call.received.filter((m) => m.msg === 'fullSync').map((m) => m.fullSync!);
    expect(parts.length).toBeGreaterThan(4);
    expect(parts.map((p) => p.part)).toEqual(parts.map((_, i) => i));
    expect(parts.map((p) => p.more)).toEqual(parts.map((_, i) => i < parts.length - 1));
    expect(parts.flatMap((p) => p.tunnels.map((t) => t.id)).sort()).toEqual(many(200).map((t) => t.id).sort());
    expect(parts.flatMap((p) => p.sessions.map((s) => s.id))).toEqual(['ts_1']);
    // Reports held while the full sync waited go on afterwards.
    c.tunnelDown('tn_0');
    expect((await call.next('tunnelDown')).tunnelDown!.id).toBe('tn_0');
    expect(c.connected).toBe(true);
  });

  it('rolling upgrade: to a control plane without parts, one full sync message and snapshots taken whole', async () => {
    const { cp, c } = await setup({ fullSyncPartBytes: 16 * 1024 });
    c.sessionUp(session1);
    for (const t of many(200)) c.tunnelUp(t);
    const first = cp.nextCall();
    await c.start();
    const call = await first;
    await call.next('hello');
    call.send(welcome()); // no `parts`: a control plane from before them
    const sync = (await call.next('fullSync')).fullSync!;
    expect(sync).toMatchObject({ part: 0, more: false });
    expect(sync.tunnels).toHaveLength(200);
    call.send(snapshot(5, resourcesToProto({ ...none(), edges: [edge('e1')] })));
    expect((await call.next('ack')).ack!.version).toBe(5);
    await settle();
    expect(call.received.filter((m) => m.msg === 'fullSync')).toHaveLength(1);

    // A node configured as one from before parts says nothing of them and sends its full sync at once.
    const old = await setup({ parts: false, nodeId: 'node-old' });
    const oldFirst = old.cp.nextCall();
    await old.c.start();
    const oldCall = await oldFirst;
    expect((await oldCall.next('hello')).hello!.parts).toBe(false);
    await oldCall.next('fullSync');
  });
});
