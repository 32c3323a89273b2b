import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { newId, type DpAgentSession } from '@warren/shared';
import { startTestApi, type Account, type TestApi } from '../../../../test/support/api.js';
import type { ReportedTunnel } from '../../../ingress/src/config/index.js';
import { cleanupNodes, connectedNode as startNode, FAST, newNode, startTestPush } from './testing.js';
import type { ConfigPush } from './index.js';

let api: TestApi;
let push: ConfigPush;
let acct: Account;
let credentialId: string;
let target: string;

beforeAll(async () => {
  api = await startTestApi();
  push = await startTestPush(api.db);
  target = `127.0.0.1:${push.port}`;
  acct = await api.account('presence');
  credentialId = (await acct.call('POST', '/credentials', {})).body.id;
});
afterEach(async () => {
  await cleanupNodes();
});
afterAll(async () => {
  await push?.stop(1_000);
  await api?.close();
});

function session(): DpAgentSession {
  return { id: newId('ts'), accountId: acct.accountId, credentialId, agentVersion: '3.19.0', os: 'linux', ip: '203.0.113.7', metadata: 'm', startedAt: new Date().toISOString() };
}
function labeled(sessionId: string, labels: Record<string, string> = { app: 'web' }): ReportedTunnel {
  return { id: newId('tn'), accountId: acct.accountId, sessionId, proto: 'labeled', labels, publicUrl: '', bindings: [], poolingEnabled: false, forwardsTo: 'http://localhost:3000', metadata: '', startedAt: new Date().toISOString() };
}
function bound(sessionId: string, host: string): ReportedTunnel {
  return { id: newId('tn'), accountId: acct.accountId, sessionId, proto: 'https', labels: {}, publicUrl: `https://${host}`, bindings: ['public'], poolingEnabled: true, forwardsTo: 'localhost:8080', metadata: 'tm', startedAt: new Date().toISOString() };
}

const connectedNode = (over: Parameters<typeof startNode>[1] = {}) => startNode([target], over);
/**
 * Announcements (ups and downs) are pushed: milliseconds when idle. The bound only has to tell
 * "pushed" from "never" on a loaded CI machine; nothing else delivers them meanwhile (no periodic
 * resync, and the sessions' leases are renewed by the node's keep-alives, so they do not expire).
 */
const ANNOUNCE_MS = 5_000;
const ids = async (path: string, key: string): Promise<string[]> => ((await acct.call('GET', path)).body[key] as { id: string }[]).map((x) => x.id).sort();

describe('tunnel presence', () => {
  it('announces a node\'s tunnels to the other nodes and shows them in the API', async () => {
    const backend = (await acct.call('POST', '/backends/tunnel_group', { labels: { app: 'web' } })).body;
    const a = await connectedNode();
    const b = await connectedNode();
    const s = session();
    const tl = labeled(s.id);
    const tb = bound(s.id, 'presence.example.com');
    const t0 = performance.now();
    a.client.sessionUp(s);
    a.client.tunnelUp(tl);
    a.client.tunnelUp(tb);

    await expect.poll(() => b.client.remoteTunnels.size, { timeout: ANNOUNCE_MS, interval: 5 }).toBe(2);
    const seenMs = performance.now() - t0;
    console.log(`tunnels reported by one node → known on another: ${seenMs.toFixed(1)} ms`);
    expect(seenMs).toBeLessThan(ANNOUNCE_MS);
    const addr = (a.client as unknown as { opts: { nodeAddress: string } }).opts.nodeAddress;
    expect(b.client.remoteTunnels.get(tl.id)).toEqual({ ...tl, startedAt: new Date(tl.startedAt).toISOString(), nodeId: a.nodeId, nodeAddress: addr });
    expect(b.client.remoteTunnels.get(tb.id)).toMatchObject({ proto: 'https', publicUrl: 'https://presence.example.com', bindings: ['public'], poolingEnabled: true, nodeId: a.nodeId });
    expect(b.ups.map((t) => t.id).sort()).toEqual([tl.id, tb.id].sort());
    // The reporting node never hears of its own tunnels.
    expect(a.client.remoteTunnels.size).toBe(0);

    // REST: sessions, tunnels (labeled ones with their backends), and the backend's tunnels.
    expect(await ids('/tunnel_sessions', 'tunnel_sessions')).toEqual([s.id]);
    const sess = (await acct.call('GET', `/tunnel_sessions/${s.id}`)).body;
    expect(sess).toMatchObject({ id: s.id, agent_version: '3.19.0', os: 'linux', ip: '203.0.113.7', metadata: 'm', credential: { id: credentialId } });
    expect(await ids('/tunnels', 'tunnels')).toEqual([tl.id, tb.id].sort());
    const apiLabeled = (await acct.call('GET', `/tunnels/${tl.id}`)).body;
    expect(apiLabeled).toMatchObject({ id: tl.id, labels: { app: 'web' }, backends: [{ id: backend.id }], forwards_to: 'http://localhost:3000', tunnel_session: { id: s.id } });
    expect(apiLabeled).not.toHaveProperty('proto');
    expect((await acct.call('GET', `/tunnels/${tb.id}`)).body).toMatchObject({ proto: 'https', public_url: 'https://presence.example.com', metadata: 'tm' });
    expect((await acct.call('GET', `/backends/tunnel_group/${backend.id}`)).body.tunnels.map((t: { id: string }) => t.id)).toEqual([tl.id]);

    // A node that connects later gets them in its snapshot.
    const c = await connectedNode();
    expect([...c.client.remoteTunnels.keys()].sort()).toEqual([tl.id, tb.id].sort());

    // Down: a tunnel, then the session (its other tunnel goes with it).
    a.client.tunnelDown(tb.id);
    await expect.poll(() => b.downs, { timeout: ANNOUNCE_MS, interval: 5 }).toEqual([tb.id]);
    expect(await ids('/tunnels', 'tunnels')).toEqual([tl.id]);
    a.client.sessionDown(s.id);
    await expect.poll(() => b.client.remoteTunnels.size, { timeout: ANNOUNCE_MS, interval: 5 }).toBe(0);
    await expect.poll(() => c.client.remoteTunnels.size, { timeout: ANNOUNCE_MS, interval: 5 }).toBe(0);
    expect(await ids('/tunnels', 'tunnels')).toEqual([]);
    expect(await ids('/tunnel_sessions', 'tunnel_sessions')).toEqual([]);
  });

  it('removes a node\'s tunnels when it stops renewing its lease', async () => {
    const a = await connectedNode();
    const b = await connectedNode();
    const s = session();
    const t = labeled(s.id);
    a.client.sessionUp(s);
    a.client.tunnelUp(t);
    await expect.poll(() => b.client.remoteTunnels.has(t.id), { timeout: ANNOUNCE_MS, interval: 5 }).toBe(true);
    // Keep-alives renew the lease well past its length.
    await new Promise((r) => setTimeout(r, FAST.leaseMs + 500));
    expect(b.client.remoteTunnels.has(t.id)).toBe(true);
    expect(await ids('/tunnels', 'tunnels')).toEqual([t.id]);

    // The node dies without a word: the lease runs out, the sweeper removes the rows.
    const t0 = performance.now();
    await a.client.stop();
    await expect.poll(() => b.client.remoteTunnels.has(t.id), { timeout: FAST.leaseMs + 2_000, interval: 10 }).toBe(false);
    expect(performance.now() - t0).toBeLessThan(FAST.leaseMs + 1_000);
    expect(b.downs).toEqual([t.id]);
    expect(await ids('/tunnels', 'tunnels')).toEqual([]);
    expect(await ids('/tunnel_sessions', 'tunnel_sessions')).toEqual([]);
  });

  it('replaces a node\'s rows with its full sync after a reconnect', async () => {
    // A lease far longer than the restart below: on a loaded machine the restart took longer
    // than FAST's 1.5 s once, and the kept tunnel's lease then rightly ran out in between.
    const own = await startTestPush(api.db, { leaseMs: 10_000 });
    try {
      await fullSyncAfterReconnect(`127.0.0.1:${own.port}`);
    } finally {
      await own.stop(1_000);
    }
  });

  async function fullSyncAfterReconnect(target: string): Promise<void> {
    const connectedNode = (over: Parameters<typeof startNode>[1] = {}) => startNode([target], over);
    const nodeId = `node-sync-${newId('tn').slice(-6)}`;
    const a1 = await connectedNode({ nodeId, nodeAddress: '127.0.0.1:7001' });
    const b = await connectedNode();
    const s0 = session();
    const t0 = labeled(s0.id);
    const kept = session();
    const tk = bound(kept.id, 'kept.example.com');
    for (const s of [s0, kept]) a1.client.sessionUp(s);
    for (const t of [t0, tk]) a1.client.tunnelUp(t);
    await expect.poll(() => b.client.remoteTunnels.size, { timeout: ANNOUNCE_MS, interval: 5 }).toBe(2);
    await a1.client.stop();

    // The node restarts with the same id: it still has `kept`, lost s0, and gained s1.
    const a2 = await newNode([target], { nodeId, nodeAddress: '127.0.0.1:7001' });
    const s1 = session();
    const t1 = labeled(s1.id, { app: 'api' });
    for (const s of [kept, s1]) a2.client.sessionUp(s);
    for (const t of [tk, t1]) a2.client.tunnelUp(t);
    await a2.client.start();

    await expect.poll(() => [...b.client.remoteTunnels.keys()].sort(), { timeout: ANNOUNCE_MS, interval: 5 }).toEqual([tk.id, t1.id].sort());
    expect(b.downs).toEqual([t0.id]);
    expect(b.ups.filter((t) => t.id === tk.id)).toHaveLength(1); // unchanged: not announced again
    const rows = await api.db.query('SELECT id FROM tunnel_sessions WHERE ingress_node = $1 ORDER BY id', [nodeId]);
    expect(rows.rows.map((r) => r.id)).toEqual([kept.id, s1.id].sort());
    const trows = await api.db.query('SELECT id FROM tunnels WHERE ingress_node = $1 ORDER BY id', [nodeId]);
    expect(trows.rows.map((r) => r.id)).toEqual([tk.id, t1.id].sort());
  }

  it('ignores reports it cannot record and survives malformed ones', async () => {
    const a = await connectedNode();
    const b = await connectedNode();
    // Unknown credential: the session is not recorded, nor its tunnel.
    const ghost = { ...session(), credentialId: newId('cr') };
    a.client.sessionUp(ghost);
    a.client.tunnelUp(labeled(ghost.id));
    // Bad timestamp: recorded with the current time.
    const s = { ...session(), startedAt: 'yesterday' };
    a.client.sessionUp(s);
    const t = labeled(s.id);
    a.client.tunnelUp(t);
    await expect.poll(() => b.client.remoteTunnels.has(t.id), { timeout: ANNOUNCE_MS, interval: 5 }).toBe(true);
    const sessions = await ids('/tunnel_sessions', 'tunnel_sessions');
    expect(sessions).toContain(s.id);
    expect(sessions).not.toContain(ghost.id);
    expect(a.client.connected).toBe(true);
  });
});
