import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { newId, type DpAgentSession } from '@warren/shared';
import { startTestApi, type Account, type TestApi } from '../../../../test/support/api.js';
import type { ReportedTunnel } from '../../../ingress/src/config/index.js';
import { cleanupNodes, newNode, startTestPush, type TestNode } from './testing.js';
import { presenceRepo } from './presence.repo.js';
import type { ConfigPush } from './index.js';

/**
 * `agent_session_start.v0` / `agent_session_stop.v0`: outbox rows written with the session
 * changes that ingress nodes report (over the real gRPC stream), the lease sweeper and credential
 * deletion; only for accounts subscribed to them.
 */

let api: TestApi;
let push: ConfigPush;
let target: string;
/** Subscribed to both session event types. */
let acct: Account;
let credentialId: string;

/**
 * The sessions' lease (renewed every FAST.keepaliveIntervalMs, 300 ms): longer than FAST's 1.5 s,
 * so that keep-alives a loaded machine delays do not get a live session swept (and a stop written
 * that no test expects); short enough for the tests that wait for a lease to run out.
 */
const LEASE_MS = 3_000;

const START = 'agent_session_start.v0';
const STOP = 'agent_session_stop.v0';

beforeAll(async () => {
  api = await startTestApi();
  push = await startTestPush(api.db, { baseUrl: api.baseUrl, leaseMs: LEASE_MS });
  target = `127.0.0.1:${push.port}`;
  acct = await api.account('session-events');
  credentialId = (await acct.call('POST', '/credentials', { description: 'laptop agent' })).body.id;
  const dest = (await acct.call('POST', '/event_destinations', { target: { datadog: { api_key: 'k' } } })).body;
  const sub = await acct.call('POST', '/event_subscriptions', { sources: [{ type: START }, { type: STOP }], destination_ids: [dest.id] });
  expect(sub.status).toBe(201);
});
afterEach(async () => {
  await cleanupNodes();
});
afterAll(async () => {
  await push?.stop(1_000);
  await api?.close();
});

function session(over: Partial<DpAgentSession> = {}): DpAgentSession {
  return {
    id: newId('ts'),
    accountId: acct.accountId,
    credentialId,
    agentVersion: '3.19.0',
    os: 'linux',
    ip: '203.0.113.7',
    metadata: 'm',
    startedAt: new Date().toISOString(),
    ...over,
  };
}
function labeled(s: DpAgentSession): ReportedTunnel {
  return { id: newId('tn'), accountId: s.accountId, sessionId: s.id, proto: 'labeled', labels: { app: 'web' }, publicUrl: '', bindings: [], poolingEnabled: false, forwardsTo: 'http://localhost:3000', metadata: '', startedAt: new Date().toISOString() };
}

async function connectedNode({ targets = [target], ...over }: Parameters<typeof newNode>[1] & { targets?: string[] } = {}): Promise<TestNode> {
  const n = await newNode(targets, over);
  const connected = new Promise<void>((r) => n.client.once('connected', () => r()));
  await n.client.start();
  await connected;
  await expect.poll(() => n.client.config !== null, { timeout: 10_000 }).toBe(true);
  return n;
}

interface EventRow {
  event_type: string;
  account_id: string;
  resource_type: string;
  object: any;
  principal: any;
  version: number;
}
async function events(resourceId: string): Promise<EventRow[]> {
  const { rows } = await api.db.query<EventRow>(
    'SELECT event_type, account_id, resource_type, object, principal, version FROM outbox WHERE resource_id = $1 ORDER BY version',
    [resourceId],
  );
  return rows;
}
const types = async (resourceId: string) => (await events(resourceId)).map((e) => e.event_type);
const nodeOf = async (sessionId: string) => (await api.db.query<{ ingress_node: string }>('SELECT ingress_node FROM tunnel_sessions WHERE id = $1', [sessionId])).rows[0]?.ingress_node ?? null;
const headVersion = async () => (await api.db.query<{ version: number }>('SELECT version FROM config_state')).rows[0]!.version;

/** Messages of one node are handled in order: once a later session of it is written, the earlier reports are. */
async function barrier(n: TestNode, accountId = acct.accountId, credential = credentialId): Promise<void> {
  const s = session({ accountId, credentialId: credential });
  n.client.sessionUp(s);
  await expect.poll(() => nodeOf(s.id), { timeout: 10_000, interval: 5 }).toBe(n.nodeId);
}

const principal = () => ({ id: credentialId, subject: 'laptop agent', source: 'Agent', credential: { id: credentialId, uri: `${api.baseUrl}/credentials/${credentialId}` } });

describe('agent session events', () => {
  it('writes one start when a session comes up, none for a takeover, one stop when it ends', async () => {
    const a = await connectedNode();
    const b = await connectedNode();
    const s = session();
    a.client.sessionUp(s);
    await expect.poll(() => nodeOf(s.id), { timeout: 10_000, interval: 5 }).toBe(a.nodeId);

    const [start, ...more] = await events(s.id);
    expect(more).toEqual([]);
    const shown = (await acct.call('GET', `/tunnel_sessions/${s.id}`)).body;
    expect(shown).toMatchObject({ id: s.id, uri: `${api.baseUrl}/tunnel_sessions/${s.id}`, credential: { id: credentialId }, transport: 'ngrok/v2' });
    expect(start).toMatchObject({ event_type: START, account_id: acct.accountId, resource_type: 'agent_session' });
    expect(start!.object).toEqual(shown);
    expect(start!.principal).toEqual(principal());

    // The agent reconnects through node b with the same session id: a takeover, not a new session.
    b.client.sessionUp({ ...s, ip: '198.51.100.9' });
    await expect.poll(() => nodeOf(s.id), { timeout: 10_000, interval: 5 }).toBe(b.nodeId);
    // Node a sees its old connection end: the row is b's now, so nothing ends.
    a.client.sessionDown(s.id);
    await barrier(a);
    expect(await types(s.id)).toEqual([START]);

    const last = (await acct.call('GET', `/tunnel_sessions/${s.id}`)).body;
    expect(last.ip).toBe('198.51.100.9');
    b.client.sessionDown(s.id);
    await expect.poll(() => nodeOf(s.id), { timeout: 10_000, interval: 5 }).toBe(null);
    const all = await events(s.id);
    expect(all.map((e) => e.event_type)).toEqual([START, STOP]);
    expect(all[1]!.object).toEqual(last);
    expect(all[1]!.principal).toEqual(principal());
    // The config feed ignores the rows (they only move the version): the nodes stay in sync.
    await expect.poll(() => b.client.config?.version, { timeout: 10_000, interval: 5 }).toBe(await headVersion());
  });

  it('writes a stop when the lease of a silent node runs out', async () => {
    const a = await connectedNode();
    const s = session();
    a.client.sessionUp(s);
    await expect.poll(() => nodeOf(s.id), { timeout: 10_000, interval: 5 }).toBe(a.nodeId);
    const shown = (await acct.call('GET', `/tunnel_sessions/${s.id}`)).body;
    await a.client.stop();
    await expect.poll(() => nodeOf(s.id), { timeout: LEASE_MS + 10_000, interval: 10 }).toBe(null);
    const all = await events(s.id);
    expect(all.map((e) => e.event_type)).toEqual([START, STOP]);
    expect(all[1]!.object).toEqual(shown);
    expect(all[1]!.principal).toEqual(principal());
  });

  it('writes starts and stops from a full sync: new sessions start, sessions gone while the stream was down stop, kept ones neither', async () => {
    // The node must come back before its lease runs out, or the sweeper stops (and the full sync
    // starts again) every session of it, `kept` too. With a lease of seconds that window is too
    // short to rely on: stopping the client alone takes most of a second (its state store flushes
    // and ends a worker thread), and a loaded machine stretches that and the reconnection past the
    // lease (two full runs at once did, both). So this test has a control plane of its own, whose
    // lease cannot run out while it lasts.
    const longLease = await startTestPush(api.db, { baseUrl: api.baseUrl, leaseMs: 120_000 });
    const nodeId = `node-evsync-${newId('tn').slice(-6)}`;
    let a1: TestNode | undefined;
    let a2: TestNode | undefined;
    try {
      const at = `127.0.0.1:${longLease.port}`;
      a1 = await connectedNode({ targets: [at], nodeId, nodeAddress: '127.0.0.1:7101' });
      const lost = session();
      const kept = session();
      for (const s of [lost, kept]) a1.client.sessionUp(s);
      await expect.poll(async () => [await nodeOf(lost.id), await nodeOf(kept.id)], { timeout: 10_000, interval: 5 }).toEqual([nodeId, nodeId]);
      await a1.client.stop();

      // The node comes back (before its lease ran out) with `kept` and a new session; `lost` ended meanwhile.
      a2 = await newNode([at], { nodeId, nodeAddress: '127.0.0.1:7101' });
      const fresh = session();
      for (const s of [kept, fresh]) a2.client.sessionUp(s);
      await a2.client.start();
      await expect.poll(async () => [await nodeOf(lost.id), await nodeOf(fresh.id)], { timeout: 10_000, interval: 5 }).toEqual([null, nodeId]);
      expect(await types(lost.id)).toEqual([START, STOP]);
      expect(await types(kept.id)).toEqual([START]);
      expect(await types(fresh.id)).toEqual([START]);
      // `lost`'s stop is the full sync's (written in the transaction that started `fresh`), not the sweeper's.
      const createdAt = async (id: string, type: string) =>
        (await api.db.query<{ created_at: Date }>('SELECT created_at FROM outbox WHERE resource_id = $1 AND event_type = $2', [id, type])).rows[0]!.created_at.getTime();
      expect(await createdAt(lost.id, STOP)).toBe(await createdAt(fresh.id, START));
    } finally {
      // Nothing may renew or repair the rows once they are removed: the clients, then their control plane.
      await a1?.client.stop();
      await a2?.client.stop();
      await longLease.stop(1_000);
      // The sessions left hold a lease the file's sweeper would only end in minutes (the last test waits for none).
      await api.db.query('DELETE FROM tunnel_sessions WHERE ingress_node = $1', [nodeId]);
    }
  });

  it('writes nothing for a keep-alive repair, and no second stop after the sweeper removed the row', async () => {
    const a = await connectedNode();
    const s = session();
    a.client.sessionUp(s);
    await expect.poll(() => nodeOf(s.id), { timeout: 10_000, interval: 5 }).toBe(a.nodeId);
    // The lease ran out while the node was still there (its keep-alives did not reach the database): swept, stop written.
    await expect
      .poll(
        async () => {
          await api.db.query("UPDATE tunnel_sessions SET lease_expires_at = now() - interval '1 second' WHERE id = $1", [s.id]);
          await presenceRepo.sweep(api.db.pool, api.baseUrl);
          return types(s.id);
        },
        { timeout: 10_000, interval: 20 },
      )
      .toEqual([START, STOP]);
    // The next keep-alive finds the row missing and writes it back, without a start.
    await expect.poll(() => nodeOf(s.id), { timeout: 10_000, interval: 10 }).toBe(a.nodeId);
    expect(await types(s.id)).toEqual([START, STOP]);
    // Its end is not told twice.
    a.client.sessionDown(s.id);
    await expect.poll(() => nodeOf(s.id), { timeout: 10_000, interval: 5 }).toBe(null);
    await barrier(a);
    expect(await types(s.id)).toEqual([START, STOP]);
  });

  it('writes the stops of a deleted credential\'s sessions before its deleted event, and announces their tunnels gone', async () => {
    const cred = (await acct.call('POST', '/credentials', { description: 'doomed' })).body.id as string;
    const a = await connectedNode();
    const b = await connectedNode();
    const s = session({ credentialId: cred });
    const t = labeled(s);
    a.client.sessionUp(s);
    a.client.tunnelUp(t);
    await expect.poll(() => b.client.remoteTunnels.has(t.id), { timeout: 10_000, interval: 5 }).toBe(true);
    const shown = (await acct.call('GET', `/tunnel_sessions/${s.id}`)).body;

    expect((await acct.call('DELETE', `/credentials/${cred}`)).status).toBe(204);
    expect(await nodeOf(s.id)).toBe(null);
    await expect.poll(() => b.client.remoteTunnels.has(t.id), { timeout: 10_000, interval: 5 }).toBe(false);
    const all = await events(s.id);
    expect(all.map((e) => e.event_type)).toEqual([START, STOP]);
    expect(all[1]!.object).toEqual(shown);
    expect(all[1]!.principal).toEqual({ id: cred, subject: 'doomed', source: 'Agent', credential: { id: cred, uri: `${api.baseUrl}/credentials/${cred}` } });
    const deleted = (await events(cred)).find((e) => e.event_type === 'tunnel_credential_deleted.v0')!;
    expect(deleted.version).toBeGreaterThan(all[1]!.version);

    // The ingress ends the agent's connection: nothing left to stop.
    a.client.sessionDown(s.id);
    await barrier(a);
    expect(await types(s.id)).toEqual([START, STOP]);
  });

  it('writes no outbox row, and moves no config version, for an account that does not subscribe', async () => {
    const other = await api.account('unsubscribed');
    const cred = (await other.call('POST', '/credentials', {})).body.id as string;
    // Subscribed, but to other event types.
    await other.call('POST', '/event_subscriptions', { sources: [{ type: 'ip_policy_created.v0' }] });
    // Sessions left by the tests above (the subscribed account's) are swept first: their stops move the version.
    await expect.poll(async () => (await api.db.query('SELECT 1 FROM tunnel_sessions')).rowCount, { timeout: LEASE_MS + 10_000, interval: 20 }).toBe(0);
    const a = await connectedNode();
    await expect.poll(() => a.client.config?.version, { timeout: 10_000, interval: 5 }).toBe(await headVersion());
    const before = await headVersion();

    const s = session({ accountId: other.accountId, credentialId: cred });
    a.client.sessionUp(s);
    await expect.poll(() => nodeOf(s.id), { timeout: 10_000, interval: 5 }).toBe(a.nodeId);
    a.client.sessionDown(s.id);
    await expect.poll(() => nodeOf(s.id), { timeout: 10_000, interval: 5 }).toBe(null);
    // Nor for a swept one.
    const swept = session({ accountId: other.accountId, credentialId: cred });
    a.client.sessionUp(swept);
    await expect.poll(() => nodeOf(swept.id), { timeout: 10_000, interval: 5 }).toBe(a.nodeId);
    await a.client.stop();
    await expect.poll(() => nodeOf(swept.id), { timeout: LEASE_MS + 10_000, interval: 10 }).toBe(null);

    expect(await headVersion()).toBe(before);
    const { rows } = await api.db.query('SELECT event_type FROM outbox WHERE account_id = $1 AND version > $2', [other.accountId, before]);
    expect(rows).toEqual([]);
    expect(await events(s.id)).toEqual([]);
    expect(await events(swept.id)).toEqual([]);
  });
});
