import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { newId, type DpAgentSession } from '@warren/shared';
import { startTestApi, type Account, type TestApi } from '../../../../test/support/api.js';
import type { ReportedTunnel } from '../../../ingress/src/config/index.js';
import { cleanupNodes, connectedNode as startNode, FAST, startTestPush } from './testing.js';
import type { ConfigPush } from './index.js';

/**
 * Tunnel presence across a control-plane outage longer than the agent-session lease (the
 * live-traffic e2e's "catches up when the control plane returns" on a loaded machine): the
 * returning control plane finds the sessions' leases run out but their rows not yet swept.
 */

let api: TestApi;
let acct: Account;
let credentialId: string;
const pushes: ConfigPush[] = [];

beforeAll(async () => {
  api = await startTestApi();
  acct = await api.account('presence-restart');
  credentialId = (await acct.call('POST', '/credentials', {})).body.id;
});
afterEach(async () => {
  await cleanupNodes();
  await Promise.all(pushes.splice(0).map((p) => p.stop(500)));
});
afterAll(async () => {
  await api?.close();
});

async function push(over: Parameters<typeof startTestPush>[1] = {}): Promise<ConfigPush> {
  const p = await startTestPush(api.db, over);
  pushes.push(p);
  return p;
}

function session(): DpAgentSession {
  return { id: newId('ts'), accountId: acct.accountId, credentialId, agentVersion: '3.19.0', os: 'linux', ip: '203.0.113.7', metadata: '', startedAt: new Date().toISOString() };
}
function labeled(sessionId: string): ReportedTunnel {
  return { id: newId('tn'), accountId: acct.accountId, sessionId, proto: 'labeled', labels: { app: 'web' }, publicUrl: '', bindings: [], poolingEnabled: false, forwardsTo: 'http://localhost:3000', metadata: '', startedAt: new Date().toISOString() };
}

const connectedNode = (target: string) => startNode([target]);
const leaseExpired = async (sessionId: string): Promise<boolean | undefined> =>
  (await api.db.query<{ expired: boolean }>('SELECT lease_expires_at <= now() AS expired FROM tunnel_sessions WHERE id = $1', [sessionId])).rows[0]?.expired;

/** Node A holds a session and a tunnel, node B sees it; then the control plane stops for longer than a lease. */
async function outageLongerThanLease() {
  const p1 = await push();
  const target = `127.0.0.1:${p1.port}`;
  const a = await connectedNode(target);
  const b = await connectedNode(target);
  const s = session();
  const t = labeled(s.id);
  a.client.sessionUp(s);
  a.client.tunnelUp(t);
  await expect.poll(() => b.client.remoteTunnels.has(t.id), { timeout: 2_000, interval: 5 }).toBe(true);
  await p1.stop(500);
  pushes.splice(pushes.indexOf(p1), 1);
  // No control plane renews or sweeps: the lease runs out, the rows stay.
  await new Promise((r) => setTimeout(r, FAST.leaseMs + 300));
  expect(await leaseExpired(s.id)).toBe(true);
  return { port: p1.port, target, a, b, s, t };
}

describe('tunnel presence after a control-plane outage longer than the lease', () => {
  it('announces a tunnel whose node renews its lapsed lease before the first sweep', async () => {
    const { port, target, b, s, t } = await outageLongerThanLease();
    // The new control plane's first sweep comes only after the nodes are back (forced here with
    // a long sweep interval; in the e2e node A happened to reconnect within the first second).
    await push({ grpc: { host: '127.0.0.1', port }, sweepIntervalMs: 60_000 });
    // Node A's full sync on its new stream renews the session's lease: the tunnel is live again.
    await expect.poll(() => leaseExpired(s.id), { timeout: 5_000, interval: 10 }).toBe(false);
    expect(((await acct.call('GET', '/tunnels')).body.tunnels as { id: string }[]).map((x) => x.id)).toEqual([t.id]);

    // Every node hears of it: B (reconnected, restored it from before) and C (new).
    const c = await connectedNode(target);
    await expect.poll(() => c.client.remoteTunnels.has(t.id), { timeout: 2_000, interval: 10 }).toBe(true);
    await expect.poll(() => b.client.connected && b.client.remoteTunnels.has(t.id), { timeout: 2_000, interval: 10 }).toBe(true);
  });

  it('removes the tunnel of a node that does not come back', async () => {
    const { port, target, a, b, t } = await outageLongerThanLease();
    await a.client.stop();
    await push({ grpc: { host: '127.0.0.1', port } });
    await expect.poll(() => b.client.connected && !b.client.remoteTunnels.has(t.id), { timeout: 3_000, interval: 10 }).toBe(true);
    const c = await connectedNode(target);
    expect(c.client.remoteTunnels.has(t.id)).toBe(false);
    expect(((await acct.call('GET', '/tunnels')).body.tunnels as unknown[]).length).toBe(0);
  });
});
