import { describe, expect, it } from 'vitest';
import type { DpTunnel } from '@warren/shared';
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
});
