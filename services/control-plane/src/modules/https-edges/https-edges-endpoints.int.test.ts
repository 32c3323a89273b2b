import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId, type Logger } from '@warren/shared';
import { startTestApi, type Account, type TestApi } from '../../../../../test/support/api.js';
import { NodePresence } from '../../config-push/node-presence.js';
import { presenceRepo, type ReportedTunnel } from '../../config-push/presence.repo.js';
import { lockHosts } from './https-edges.repo.js';

/**
 * A host belongs to one account: an HTTPS edge may not take a host that an agent endpoint (a
 * public Bind tunnel) of another account serves, or resolve() (edges first) would hand that
 * endpoint's traffic to the edge's account.
 */
let api: TestApi;
let owner: Account;
let other: Account;
let presence: NodePresence;
let credentialId: string;
const node = { id: `edges-endpoints-${Math.random().toString(36).slice(2, 8)}`, address: '127.0.0.1:1', leaseMs: 60_000 };
const log = { debug() {}, info() {}, warn() {}, error() {}, child: () => log } as unknown as Logger;
let n = 0;
const host = () => `ep${++n}-${Math.random().toString(36).slice(2, 8)}.example.com`;

beforeAll(async () => {
  api = await startTestApi();
  owner = await api.account('endpoint-owner');
  other = await api.account('edge-claimer');
  credentialId = (await owner.call('POST', '/credentials', {})).body.id;
  presence = new NodePresence(api.db, node, log, api.baseUrl);
  const sessionId = newId('ts');
  await presence.sessionUp({ id: sessionId, accountId: owner.accountId, credentialId, agentVersion: 'test', os: 'linux', ip: '127.0.0.1', metadata: '', startedAt: new Date().toISOString() });
  sid = sessionId;
});
afterAll(() => api.close());
let sid = '';

const endpoint = (h: string, extra: Partial<ReportedTunnel> = {}): ReportedTunnel => ({
  id: newId('tn'), accountId: owner.accountId, sessionId: sid, proto: 'https', labels: {}, publicUrl: `https://${h}`, bindings: ['public'],
  poolingEnabled: false, forwardsTo: 'localhost:8080', metadata: '', startedAt: new Date().toISOString(), ...extra,
});

describe("HTTPS edges on another account's agent endpoint host", () => {
  it('refuses to create or extend an edge onto the host (409 ERR_WARREN_4101), on any port', async () => {
    const h = host();
    const t = endpoint(h);
    await presence.tunnelUp(t);
    for (const hp of [`${h}:443`, `${h}:8443`]) {
      const r = await other.call('POST', '/edges/https', { hostports: [hp] });
      expect(r.status, hp).toBe(409);
      expect(r.body).toMatchObject({ error_code: 'ERR_WARREN_4101', details: { field: 'hostports' } });
      expect(r.body.msg).toContain("another account's agent endpoint");
    }
    const mine = await other.call('POST', '/edges/https', { hostports: [`${host()}:443`] });
    expect(mine.status).toBe(201);
    const patched = await other.call('PATCH', `/edges/https/${mine.body.id}`, { hostports: [...mine.body.hostports, `${h}:443`] });
    expect(patched.status).toBe(409);
    expect(patched.body).toMatchObject({ error_code: 'ERR_WARREN_4101', details: { field: 'hostports' } });
    // The endpoint's own account may put an edge there; once the endpoint is gone, anyone may.
    expect((await owner.call('POST', '/edges/https', { hostports: [`${h}:8443`] })).status).toBe(201);
    await presence.tunnelDown(t.id);
    const h2 = host();
    await presence.tunnelUp(endpoint(h2, { proto: 'http', publicUrl: `http://${h2}:8080` }));
    expect((await other.call('POST', '/edges/https', { hostports: [`${h2}:443`] })).status).toBe(409);
  });

  it('is not held by internal endpoints, labeled tunnels or TCP addresses', async () => {
    const h = host();
    await presence.tunnelUp(endpoint(h, { bindings: ['internal'] }));
    await presence.tunnelUp(endpoint('', { proto: 'labeled', labels: { app: 'x' }, publicUrl: '' }));
    const tcpHost = host();
    await presence.tunnelUp(endpoint(tcpHost, { proto: 'tcp', publicUrl: `tcp://${tcpHost}:10001` }));
    expect((await other.call('POST', '/edges/https', { hostports: [`${h}:443`] })).status).toBe(201);
    expect((await other.call('POST', '/edges/https', { hostports: [`${tcpHost}:443`] })).status).toBe(201);
  });

  it("waits for a Bind report being recorded under the host's lock, then refuses", async () => {
    const h = host();
    const client = await api.db.pool.connect();
    try {
      await client.query('BEGIN');
      await lockHosts(client, [h]);
      await presenceRepo.writeTunnels(client, node, [endpoint(h)]);
      let settled = false;
      const create = other.call('POST', '/edges/https', { hostports: [`${h}:443`] }).finally(() => (settled = true));
      await new Promise((r) => setTimeout(r, 300));
      expect(settled).toBe(false);
      await client.query('COMMIT');
      const r = await create;
      expect(r.status).toBe(409);
      expect(r.body.error_code).toBe('ERR_WARREN_4101');
    } finally {
      client.release();
    }
  });
});
