import { describe, expect, it } from 'vitest';
import { newId, type DataPlaneConfig, type DpEdge, type DpTunnel } from '@warren/shared';
import { RoutingTable } from '../http/routing.js';
import type { LocalTunnel } from '../agents/server.js';
import { TunnelRegistry } from './registry.js';

const base = { sessionId: 'ts_1', publicUrl: '', bindings: [], poolingEnabled: false, forwardsTo: '', metadata: '', startedAt: '2026-01-01T00:00:00Z' };
const local = (id: string, accountId: string, labels: Record<string, string>, extra: Partial<LocalTunnel> = {}): LocalTunnel =>
  ({ ...base, id, accountId, proto: 'labeled', labels, openStreams: 0, openStream: async () => { throw new Error('unused'); }, ...extra }) as LocalTunnel;
const remote = (id: string, accountId: string, labels: Record<string, string>, extra: Partial<DpTunnel> = {}): DpTunnel => ({
  ...base, id, accountId, proto: 'labeled', labels, nodeId: 'node-b', nodeAddress: '127.0.0.1:1', ...extra,
});

describe('tunnel registry', () => {
  it("picks tunnels of the backend's account whose labels include all of the backend's", () => {
    const r = new TunnelRegistry('node-a');
    r.addLocal(local('tn_1', 'ac_1', { app: 'web', env: 'prod', extra: 'x' }));
    r.addLocal(local('tn_2', 'ac_1', { app: 'web' }));
    r.addLocal(local('tn_3', 'ac_2', { app: 'web', env: 'prod' }));
    const picks = new Set(Array.from({ length: 6 }, () => r.pickForBackend('bkdtg_1', 'ac_1', { app: 'web', env: 'prod' })?.tunnel.id));
    expect(picks).toEqual(new Set(['tn_1']));
    expect(r.pickForBackend('bkdtg_2', 'ac_3', { app: 'web' })).toBeNull();
  });

  it('spreads requests across several tunnels, preferring this node, and honours exclusions', () => {
    const r = new TunnelRegistry('node-a');
    r.addLocal(local('tn_1', 'ac_1', { app: 'web' }));
    r.addLocal(local('tn_2', 'ac_1', { app: 'web' }));
    r.addRemote(remote('tn_r', 'ac_1', { app: 'web' }));
    const picks = Array.from({ length: 4 }, () => r.pickForBackend('bkdtg_1', 'ac_1', { app: 'web' })!);
    expect(picks.map((p) => p.tunnel.id).sort()).toEqual(['tn_1', 'tn_1', 'tn_2', 'tn_2']);
    expect(picks.every((p) => p.kind === 'local')).toBe(true);
    const remoteOnly = r.pickForBackend('bkdtg_1', 'ac_1', { app: 'web' }, new Set(['tn_1', 'tn_2']));
    expect(remoteOnly).toMatchObject({ kind: 'remote', tunnel: { id: 'tn_r' } });
    r.removeLocal('tn_1');
    r.removeLocal('tn_2');
    expect(r.pickForBackend('bkdtg_1', 'ac_1', { app: 'web' })?.kind).toBe('remote');
  });

  it('ignores reports of its own tunnels coming back from the control plane', () => {
    const r = new TunnelRegistry('node-a');
    r.addRemote(remote('tn_self', 'ac_1', { app: 'web' }, { nodeId: 'node-a' }));
    expect(r.remoteCount).toBe(0);
  });

  it('finds public Bind endpoints by hostname, never internal ones', () => {
    const r = new TunnelRegistry('node-a');
    r.addLocal(local('tn_pub', 'ac_1', {}, { proto: 'https', publicUrl: 'https://App.test:8443' }));
    r.addRemote(remote('tn_int', 'ac_1', {}, { proto: 'https', publicUrl: 'https://int.test', bindings: ['internal'] }));
    expect(r.pickForHost('app.test')?.tunnel.id).toBe('tn_pub');
    expect(r.pickForHost('int.test')).toBeNull();
    expect(r.pickForHost('nope.test')).toBeNull();
    expect(r.bindsOf('int.test').map((t) => t.id)).toEqual(['tn_int']);
  });

  describe('one account per hostname', () => {
    const bind = (startedAt: string, extra: Partial<DpTunnel> = {}) => ({ proto: 'https', publicUrl: 'https://shared.test', startedAt, ...extra });

    it('picks only the tunnels of the account whose tunnel started first, local or remote, on every node alike', () => {
      // Node A holds X's tunnel (later); node B holds V's (earlier). Each also knows the other's.
      const a = new TunnelRegistry('node-a');
      a.addLocal(local('tn_x', 'ac_x', {}, bind('2026-01-01T00:00:01.000Z')));
      a.addRemote(remote('tn_v', 'ac_v', {}, bind('2026-01-01T00:00:00.500Z')));
      const b = new TunnelRegistry('node-b');
      b.addLocal(local('tn_v', 'ac_v', {}, bind('2026-01-01T00:00:00.500Z')));
      b.addRemote(remote('tn_x', 'ac_x', {}, { ...bind('2026-01-01T00:00:01.000Z'), nodeId: 'node-a' }));
      for (const r of [a, b]) {
        const picks = new Set(Array.from({ length: 6 }, () => r.pickForHost('shared.test')?.tunnel.id));
        expect(picks).toEqual(new Set(['tn_v']));
        expect(r.hostOwner('shared.test')).toEqual({ accountId: 'ac_v', since: Date.parse('2026-01-01T00:00:00.500Z') });
        // Retries never fall back to the other account's tunnel either.
        expect(r.pickForHost('shared.test', new Set(['tn_v']))).toBeNull();
      }
      expect(a.pickForHost('shared.test')?.kind).toBe('remote');
    });

    it('breaks a tie of start times by tunnel id, and hands the name on when the holder leaves', () => {
      const r = new TunnelRegistry('node-a');
      r.addLocal(local('tn_b', 'ac_2', {}, bind('2026-01-01T00:00:00.000Z')));
      r.addRemote(remote('tn_a', 'ac_1', {}, bind('2026-01-01T00:00:00.000Z')));
      expect(r.pickForHost('shared.test')?.tunnel.id).toBe('tn_a');
      r.removeRemote('tn_a');
      expect(r.pickForHost('shared.test')?.tunnel.id).toBe('tn_b');
    });

    it("names this node's later Bind of a host another account holds, once it learns of the older tunnel (never the holder's, nor pooled twins)", () => {
      // Node A holds X's tunnel (later); V's (earlier) is on node B.
      const a = new TunnelRegistry('node-a');
      a.addLocal(local('tn_x', 'ac_x', {}, bind('2026-01-01T00:00:01.000Z')));
      a.addLocal(local('tn_other', 'ac_x', {}, bind('2026-01-01T00:00:01.000Z', { publicUrl: 'https://other.test' })));
      expect(a.outheldLocalBinds()).toEqual([]);
      const v = remote('tn_v', 'ac_v', {}, bind('2026-01-01T00:00:00.500Z'));
      a.addRemote(v);
      expect(a.outheldLocalBinds(v)).toEqual([{ tunnel: expect.objectContaining({ id: 'tn_x' }), hostname: 'shared.test', by: 'endpoint' }]);
      expect(a.outheldLocalBinds()).toEqual([{ tunnel: expect.objectContaining({ id: 'tn_x' }), hostname: 'shared.test', by: 'endpoint' }]);
      // Node B, holding V's tunnel, learns of X's later one: nothing of its own to stop.
      const b = new TunnelRegistry('node-b');
      b.addLocal(local('tn_v', 'ac_v', {}, bind('2026-01-01T00:00:00.500Z')));
      const x = remote('tn_x', 'ac_x', {}, { ...bind('2026-01-01T00:00:01.000Z'), nodeId: 'node-a' });
      b.addRemote(x);
      expect(b.outheldLocalBinds(x)).toEqual([]);
      expect(b.outheldLocalBinds()).toEqual([]);
      // Once stopped (removed), nothing is named any more.
      a.removeLocal('tn_x');
      expect(a.outheldLocalBinds()).toEqual([]);
      expect(a.outheldLocalBinds(v)).toEqual([]);
    });

    it('leaves same-account pooled tunnels, internal endpoints, labeled tunnels and other hosts alone', () => {
      const r = new TunnelRegistry('node-a');
      r.addLocal(local('tn_1', 'ac_1', {}, bind('2026-01-01T00:00:05Z', { poolingEnabled: true })));
      r.addLocal(local('tn_int', 'ac_2', {}, bind('2026-01-01T00:00:05Z', { bindings: ['internal'] })));
      r.addLocal(local('tn_lab', 'ac_2', { app: 'x' }, { startedAt: '2026-01-01T00:00:05Z' }));
      const pooled = remote('tn_0', 'ac_1', {}, bind('2026-01-01T00:00:01Z', { poolingEnabled: true }));
      r.addRemote(pooled);
      expect(r.outheldLocalBinds(pooled)).toEqual([]);
      const elsewhere = remote('tn_e', 'ac_2', {}, bind('2026-01-01T00:00:00Z', { publicUrl: 'https://elsewhere.test' }));
      r.addRemote(elsewhere);
      expect(r.outheldLocalBinds(elsewhere)).toEqual([]);
      const internal = remote('tn_ri', 'ac_9', {}, bind('2026-01-01T00:00:00Z', { bindings: ['internal'] }));
      r.addRemote(internal);
      expect(r.outheldLocalBinds(internal)).toEqual([]);
      // Another account's tunnel started between the holder's (tn_0) and ours: ac_1 still holds the name.
      const between = remote('tn_between', 'ac_2', {}, bind('2026-01-01T00:00:03Z'));
      r.addRemote(between);
      expect(r.outheldLocalBinds(between)).toEqual([]);
      expect(r.outheldLocalBinds()).toEqual([]);
      // The holder's tunnel goes: ac_2's (tn_between, 00:03) is now the oldest, and our pooled one (00:05) loses.
      r.removeRemote('tn_0');
      expect(r.outheldLocalBinds().map((o) => o.tunnel.id)).toEqual(['tn_1']);
      // A report of this node's own tunnel coming back is ignored.
      const self = remote('tn_self', 'ac_9', {}, { ...bind('2026-01-01T00:00:00Z'), nodeId: 'node-a' });
      r.addRemote(self);
      expect(r.outheldLocalBinds(self)).toEqual([]);
    });

    it('looks at the whole remote set once it is replaced', () => {
      const r = new TunnelRegistry('node-a');
      r.addLocal(local('tn_late', 'ac_2', {}, bind('2026-01-01T00:00:03Z')));
      r.setRemote([remote('tn_first', 'ac_1', {}, bind('2026-01-01T00:00:01Z'))]);
      expect(r.outheldLocalBinds()).toEqual([{ tunnel: expect.objectContaining({ id: 'tn_late' }), hostname: 'shared.test', by: 'endpoint' }]);
      r.setRemote([]);
      expect(r.outheldLocalBinds()).toEqual([]);
    });

    it("keeps spreading over all of the holder's tunnels (pooling), local ones first", () => {
      const r = new TunnelRegistry('node-a');
      r.addLocal(local('tn_1', 'ac_1', {}, bind('2026-01-01T00:00:05Z', { poolingEnabled: true })));
      r.addLocal(local('tn_2', 'ac_1', {}, bind('2026-01-01T00:00:06Z', { poolingEnabled: true })));
      r.addRemote(remote('tn_0', 'ac_1', {}, bind('2026-01-01T00:00:01Z', { poolingEnabled: true })));
      r.addLocal(local('tn_late', 'ac_2', {}, bind('2026-01-01T00:00:03Z')));
      const picks = Array.from({ length: 4 }, () => r.pickForHost('shared.test')!.tunnel.id);
      expect(picks.sort()).toEqual(['tn_1', 'tn_1', 'tn_2', 'tn_2']);
      expect(r.pickForHost('shared.test', new Set(['tn_1', 'tn_2']))?.tunnel.id).toBe('tn_0');
    });
  });

  describe('edges and agent endpoints of different accounts on one host', () => {
    const config = (edges: DpEdge[]): DataPlaneConfig => ({
      version: 1, edges: new Map(edges.map((e) => [e.id, e])), routes: new Map(), backends: new Map(), ipPolicies: new Map(),
      certificateAuthorities: new Map(), credentials: new Map(), credentialsByTokenHash: new Map(), eventSubscriptions: new Map(),
    });
    const edge = (accountId: string, hostports: string[]): DpEdge => ({ id: newId('edghts'), accountId, hostports, mutualTls: null, tlsTermination: null });
    const endpoint = (id: string, accountId: string, startedAt: string) => local(id, accountId, {}, { proto: 'https', publicUrl: 'https://victim.test', startedAt });
    const tick = () => new Promise((r) => setImmediate(r));

    it("takes an edge created after another account's endpoint out of routing, for every port of the host", async () => {
      const r = new TunnelRegistry('node-a');
      r.addLocal(endpoint('tn_v', 'ac_v', new Date(Date.now() - 60_000).toISOString()));
      const table = new RoutingTable(config([edge('ac_x', ['victim.test:443', 'victim.test:8443']), edge('ac_x', ['other.test:443'])]));
      r.followEdges(table);
      expect(table.edgeFor('victim.test', 443, 443)).toBeUndefined();
      expect(table.edgeFor('victim.test', 8443, 443)).toBeUndefined();
      expect(table.edgeFor('other.test', 443, 443)?.edge.accountId).toBe('ac_x');
      // The Bind checks still see the edge.
      expect(table.edgesByHostport.has('victim.test:443')).toBe(true);
      // The endpoint leaves: the edge routes again (after the change, not per request).
      r.removeLocal('tn_v');
      await tick();
      expect(table.edgeFor('victim.test', 443, 443)?.edge.accountId).toBe('ac_x');
      // A later endpoint of another account does not take the edge's host.
      r.addRemote({ ...remote('tn_late', 'ac_v', {}), proto: 'https', publicUrl: 'https://victim.test', startedAt: new Date(Date.now() + 1000).toISOString() });
      await tick();
      expect(table.edgeFor('victim.test', 443, 443)?.edge.accountId).toBe('ac_x');
    });

    it("names this node's Binds of a host where another account's edge is older than the holder's tunnel (never the same account's edge, nor a newer edge)", () => {
      const r = new TunnelRegistry('node-a');
      // Created now (its id carries the time), before the endpoint started: the edge holds the host.
      const table = new RoutingTable(config([edge('ac_x', ['victim.test:8443']), edge('ac_v', ['victim.test:443'])]));
      r.followEdges(table);
      r.addLocal(endpoint('tn_v', 'ac_v', new Date(Date.now() + 60_000).toISOString()));
      expect(r.outheldLocalBinds()).toEqual([{ tunnel: expect.objectContaining({ id: 'tn_v' }), hostname: 'victim.test', by: 'edge' }]);
      // A remote tunnel's arrival looks at endpoints only.
      expect(r.outheldLocalBinds({ ...remote('tn_o', 'ac_o', {}), proto: 'https', publicUrl: 'https://victim.test', startedAt: new Date().toISOString() })).toEqual([]);
      // The same account's edge is no conflict, and an edge created after the endpoint started is
      // the one taken out of routing instead.
      const r2 = new TunnelRegistry('node-a');
      r2.followEdges(new RoutingTable(config([edge('ac_v', ['victim.test:443'])])));
      r2.addLocal(endpoint('tn_v', 'ac_v', new Date(Date.now() + 60_000).toISOString()));
      expect(r2.outheldLocalBinds()).toEqual([]);
      const r3 = new TunnelRegistry('node-a');
      r3.followEdges(new RoutingTable(config([edge('ac_x', ['victim.test:443'])])));
      r3.addLocal(endpoint('tn_v', 'ac_v', new Date(Date.now() - 60_000).toISOString()));
      expect(r3.outheldLocalBinds()).toEqual([]);
    });

    it("shadows an edge once another account's older endpoint shows up, and never the same account's", async () => {
      const r = new TunnelRegistry('node-a');
      const table = new RoutingTable(config([edge('ac_x', ['victim.test:443'])]));
      r.followEdges(table);
      expect(table.edgeFor('victim.test', 443, 443)).toBeDefined();
      r.addLocal(endpoint('tn_own', 'ac_x', new Date(Date.now() - 60_000).toISOString()));
      await tick();
      expect(table.edgeFor('victim.test', 443, 443)).toBeDefined();
      r.removeLocal('tn_own');
      r.addRemote({ ...remote('tn_v', 'ac_v', {}), proto: 'https', publicUrl: 'https://victim.test', startedAt: new Date(Date.now() - 60_000).toISOString() });
      await tick();
      expect(table.edgeFor('victim.test', 443, 443)).toBeUndefined();
      expect(table.shadowedHostports).toEqual(new Set(['victim.test:443']));
    });

    it('counts a hostport from when its edge gained it, not from when the edge was created', () => {
      const t0 = Date.now();
      // Created long ago (an id that is no KSUID counts as the oldest) with another host; updated to
      // add victim.test a second after the endpoint started (the update's check ran before the
      // control plane knew of the Bind): the endpoint holds the host, the edge's new hostport yields.
      const old = { ...edge('ac_x', ['other.test:443', 'victim.test:443']), id: 'edghts_made_before_the_endpoint' };
      const started = new Date(t0 - 1000).toISOString();
      const updated = (claimedMs: number): DpEdge => ({ ...old, hostportClaimedMs: { 'other.test:443': t0 - 3_600_000, 'victim.test:443': claimedMs } });

      const r = new TunnelRegistry('node-a');
      const table = new RoutingTable(config([updated(t0)]));
      r.followEdges(table);
      r.addLocal(endpoint('tn_v', 'ac_v', started));
      r.shadowEdges();
      expect(r.outheldLocalBinds()).toEqual([]);
      expect(table.shadowedHostports).toEqual(new Set(['victim.test:443']));
      expect(table.edgeFor('other.test', 443, 443)?.edge.id).toBe(old.id);

      // Gained before the endpoint started: the edge holds it, the Bind is the one named.
      const r2 = new TunnelRegistry('node-a');
      const table2 = new RoutingTable(config([updated(t0 - 2000)]));
      r2.followEdges(table2);
      r2.addLocal(endpoint('tn_v', 'ac_v', started));
      r2.shadowEdges();
      expect(r2.outheldLocalBinds()).toEqual([{ tunnel: expect.objectContaining({ id: 'tn_v' }), hostname: 'victim.test', by: 'edge' }]);
      expect(table2.shadowedHostports).toEqual(new Set());

      // No claim recorded (stored before claims were, or saved by an older node): the edge's creation.
      const r3 = new TunnelRegistry('node-a');
      const table3 = new RoutingTable(config([old]));
      r3.followEdges(table3);
      r3.addLocal(endpoint('tn_v', 'ac_v', started));
      r3.shadowEdges();
      expect(r3.outheldLocalBinds()).toEqual([{ tunnel: expect.objectContaining({ id: 'tn_v' }), hostname: 'victim.test', by: 'edge' }]);
    });
  });
});
