import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { createLogger, type DpAgentSession } from '@warren/shared';
import { configStreamCodec, sessionToProto, tunnelToProto } from '../../../shared/src/proto/index.js';
import type { ClientTunnel } from '../../../agent/src/client.js';
import { ControlPlaneClient, MAX_FULL_SYNC_BYTES, sessionReportBytes, tunnelReportBytes, type ReportedTunnel } from '../config/control-plane-client.js';
import { AgentServer, DEFAULT_MAX_REPORT_BYTES, DEFAULT_MAX_TUNNELS_PER_NODE } from './server.js';
import { agentServerHarness } from './testing.js';
import { until } from '../../../../test/support/until.js';

/**
 * Tunnels per agent session and per node are capped, and what they take up in the node's full
 * sync to the control plane is held to a budget: an audit opened 20,000 labeled tunnels on one
 * session, and the node's full sync (130 MB) went past the control plane's 64 MiB message limit,
 * cutting the node off from its config on every reconnect.
 */

const TOKEN = 'wrn_agt_caps_token_1';
const OTHER_TOKEN = 'wrn_agt_caps_token_2';
const h = agentServerHarness({
  nodeId: 'node-caps',
  tokens: [
    { token: TOKEN, identity: { credentialId: 'cr_1', accountId: 'ac_1', acl: [] } },
    { token: OTHER_TOKEN, identity: { credentialId: 'cr_2', accountId: 'ac_2', acl: [] } },
  ],
});
const { cleanups, startServer, startClient } = h;

const LOCAL = 'http://127.0.0.1:9';

describe('tunnel caps', () => {
  it('refuses StartTunnelWithLabel and Bind past MAX_TUNNELS_PER_SESSION; another session and a freed slot still work', async () => {
    const { server, port } = await startServer({ maxTunnelsPerSession: 3 });
    const a = startClient(port);
    await a.connect();
    const opened: ClientTunnel[] = [];
    for (let i = 0; i < 3; i++) opened.push(await a.startLabeledTunnel({ app: `t${i}` }, LOCAL));
    await expect(a.startLabeledTunnel({ app: 'over' }, LOCAL)).rejects.toThrow(/already has 3 tunnels.*MAX_TUNNELS_PER_SESSION.*ERR_WARREN_1110/);
    await expect(a.bind({ domain: 'over.test', forwardsTo: LOCAL })).rejects.toThrow(/MAX_TUNNELS_PER_SESSION.*ERR_WARREN_1110/);
    expect(server.tunnels()).toHaveLength(3);
    // The session itself is fine, and another session has its own cap.
    const b = startClient(port, OTHER_TOKEN);
    await b.connect();
    await b.startLabeledTunnel({ app: 'other' }, LOCAL);
    // A freed slot can be used again.
    await a.unbind(opened[0]!.id);
    await until(() => server.tunnels().length === 3);
    await a.bind({ domain: 'again.test', forwardsTo: LOCAL });
    expect(server.tunnels()).toHaveLength(4);
  });

  it('refuses past MAX_TUNNELS_PER_NODE across sessions', async () => {
    const { server, port } = await startServer({ maxTunnelsPerSession: 3, maxTunnelsPerNode: 4 });
    const a = startClient(port);
    await a.connect();
    for (let i = 0; i < 3; i++) await a.startLabeledTunnel({ app: `a${i}` }, LOCAL);
    const b = startClient(port, OTHER_TOKEN);
    await b.connect();
    await b.startLabeledTunnel({ app: 'b0' }, LOCAL);
    await expect(b.startLabeledTunnel({ app: 'b1' }, LOCAL)).rejects.toThrow(/already has 4 tunnels.*MAX_TUNNELS_PER_NODE.*ERR_WARREN_1110/);
    await expect(b.bind({ domain: 'b.test', forwardsTo: LOCAL })).rejects.toThrow(/MAX_TUNNELS_PER_NODE/);
    expect(server.tunnels()).toHaveLength(4);
    // When a session leaves, its tunnels free the node's slots.
    await a.close();
    await until(() => server.tunnels().length === 1);
    await b.startLabeledTunnel({ app: 'b1' }, LOCAL);
  });

  it('refuses past MAX_TUNNELS_PER_ACCOUNT across the sessions of one account, and not another account', async () => {
    const { server, port } = await startServer({ maxTunnelsPerSession: 2, maxTunnelsPerAccount: 3 });
    const a1 = startClient(port);
    await a1.connect();
    for (let i = 0; i < 2; i++) await a1.startLabeledTunnel({ app: `a${i}` }, LOCAL);
    const a2 = startClient(port);
    await a2.connect();
    await a2.startLabeledTunnel({ app: 'a2' }, LOCAL);
    await expect(a2.startLabeledTunnel({ app: 'a3' }, LOCAL)).rejects.toThrow(/this account already has 3 tunnels on this ingress node.*MAX_TUNNELS_PER_ACCOUNT.*ERR_WARREN_1110/);
    // Another account is not held back by this one's tunnels.
    const b = startClient(port, OTHER_TOKEN);
    await b.connect();
    await b.startLabeledTunnel({ app: 'b0' }, LOCAL);
    expect(server.tunnels()).toHaveLength(4);
    // A slot the account frees is its own again.
    await a1.close();
    await until(() => server.tunnels().length === 2);
    await a2.startLabeledTunnel({ app: 'a3' }, LOCAL);
  });

  it('a reconnect that resumes its tunnels is not refused by the caps it already fills', async () => {
    const { server, port } = await startServer({ maxTunnelsPerSession: 2, maxTunnelsPerNode: 2 });
    const a = startClient(port);
    const sessionId = await a.connect();
    const t1 = await a.startLabeledTunnel({ app: 'r1' }, LOCAL);
    const t2 = await a.bind({ domain: 'resume.test', forwardsTo: LOCAL });
    const online: ClientTunnel[] = [];
    const lost: string[] = [];
    a.on('tunnel', (t) => online.push(t));
    a.on('tunnelLost', (id) => lost.push(id));
    const disconnected = once(a, 'disconnected');
    server.closeSessionsOfCredential('cr_1', 'rotated');
    await disconnected;
    await until(() => online.length === 2);
    expect(lost).toEqual([]);
    expect(a.session).toBe(sessionId);
    expect(server.tunnels().map((t) => t.id).sort()).toEqual([t1.id, t2.id].sort());
  });

  it('holds sessions and tunnels to the report budget, and gives the bytes back when they go', async () => {
    const metadata = 'm'.repeat(4096);
    // Room for one session and about three such tunnels.
    const { server, port } = await startServer({ maxReportBytes: 14_000 });
    const a = startClient(port, TOKEN, { metadata: 'x' });
    await a.connect();
    const base = server.reportedBytes;
    expect(base).toBeGreaterThan(0);
    let ok = 0;
    let refusal = '';
    for (let i = 0; i < 10 && !refusal; i++) {
      try {
        await a.startLabeledTunnel({ app: `big${i}` }, LOCAL, { metadata });
        ok++;
      } catch (err) {
        refusal = (err as Error).message;
      }
    }
    expect(ok).toBe(3);
    expect(refusal).toMatch(/as many tunnels as it may report to the control plane \(14000 bytes\).*ERR_WARREN_1110/);
    expect(server.reportedBytes).toBeLessThanOrEqual(14_000);
    // A small tunnel still fits.
    await a.startLabeledTunnel({ app: 'small' }, LOCAL);
    // A second session with large metadata does not.
    const b = startClient(port, OTHER_TOKEN, { metadata, reconnect: false });
    await expect(b.connect()).rejects.toThrow(/as many agent sessions and tunnels as it may report.*ERR_WARREN_1110/);
    await a.close();
    await until(() => server.reportedBytes === 0);
  });

  it('rejects caps it cannot honour', () => {
    const base = { nodeId: 'n', tls: { cert: h.pki.certPem, key: h.pki.keyPem }, authenticate: () => null };
    expect(() => new AgentServer({ ...base, maxTunnelsPerSession: 0 })).toThrow(/maxTunnelsPerSession/);
    expect(() => new AgentServer({ ...base, maxReportBytes: MAX_FULL_SYNC_BYTES + 1 })).toThrow(/maxReportBytes/);
  });
});

/** A tunnel with every field at the most the agent server keeps (requests.ts): 4 KiB metadata, 10 labels of 64 + 256 bytes, 1 KiB forwards_to. */
function largestTunnel(i: number): ReportedTunnel {
  const labels: Record<string, string> = {};
  for (let k = 0; k < 10; k++) labels[`${String(k).padStart(2, '0')}${'k'.repeat(62)}`] = 'v'.repeat(256);
  return {
    id: `tn_${String(i).padStart(27, '0')}`,
    accountId: 'ac_2aBcDeFgHiJkLmNoPqRsTuVwXy',
    sessionId: 'ts_2aBcDeFgHiJkLmNoPqRsTuVwXy',
    proto: 'labeled',
    labels,
    publicUrl: '',
    bindings: [],
    poolingEnabled: false,
    forwardsTo: `http://${'f'.repeat(1024 - 7)}`,
    metadata: 'é'.repeat(2048),
    startedAt: '2026-11-26T06:22:16.123Z',
  };
}

const largestSession = (i: number): DpAgentSession => ({
  id: `ts_${String(i).padStart(27, '0')}`,
  accountId: 'ac_2aBcDeFgHiJkLmNoPqRsTuVwXy',
  credentialId: 'cr_2aBcDeFgHiJkLmNoPqRsTuVwXy',
  agentVersion: 'v'.repeat(64),
  os: 'o'.repeat(64),
  ip: 'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff',
  metadata: 'm'.repeat(4096),
  startedAt: '2026-11-26T06:22:16.123Z',
});

describe('report sizes', () => {
  const { encodeNode } = configStreamCodec();

  it('the estimates bound the encoded full sync from above, closely', () => {
    const bind: ReportedTunnel = { ...largestTunnel(1), proto: 'https', labels: {}, publicUrl: `https://${'h'.repeat(253)}:65535`, bindings: ['internal'], poolingEnabled: true };
    const tiny: ReportedTunnel = { id: 'tn_1', accountId: '', sessionId: '', proto: '', labels: {}, publicUrl: '', bindings: [], poolingEnabled: false, forwardsTo: '', metadata: '', startedAt: '' };
    const tunnels = [largestTunnel(0), bind, tiny];
    const sessions = [largestSession(0)];
    const encoded = encodeNode({ fullSync: { sessions: sessions.map(sessionToProto), tunnels: tunnels.map(tunnelToProto) } }).length;
    const estimate = 16 + sessions.reduce((n, s) => n + sessionReportBytes(s), 0) + tunnels.reduce((n, t) => n + tunnelReportBytes(t), 0);
    expect(estimate).toBeGreaterThanOrEqual(encoded);
    expect(estimate - encoded).toBeLessThan(64);
    for (const t of tunnels) expect(tunnelReportBytes(t)).toBeGreaterThanOrEqual(encodeNode({ fullSync: { tunnels: [tunnelToProto(t)] } }).length - 8);
  });

  it('the worst case at the default caps stays well under the control plane\'s 64 MiB', () => {
    const perTunnel = tunnelReportBytes(largestTunnel(0));
    const perSession = sessionReportBytes(largestSession(0));
    // ~8.6 KB: 10,000 of them would be ~86 MB, over 64 MiB; the byte budget (32 MiB) binds first.
    expect(perTunnel).toBeLessThan(9_000);
    expect(perSession).toBeLessThan(4_500);
    expect(DEFAULT_MAX_TUNNELS_PER_NODE * perTunnel).toBeGreaterThan(64 * 1024 * 1024);
    expect(DEFAULT_MAX_REPORT_BYTES).toBeLessThanOrEqual(MAX_FULL_SYNC_BYTES / 1.5);
    expect(MAX_FULL_SYNC_BYTES).toBeLessThan(64 * 1024 * 1024);
    // Typical tunnels (a label or two, short metadata) all fit at the node cap.
    const typical = tunnelReportBytes({ ...largestTunnel(0), labels: { app: 'web', env: 'prod' }, metadata: '{"team":"blue"}', forwardsTo: 'http://localhost:8080' });
    expect(DEFAULT_MAX_TUNNELS_PER_NODE * typical).toBeLessThan(DEFAULT_MAX_REPORT_BYTES / 4);
  });

  it('a full sync over MAX_FULL_SYNC_BYTES is cut to fit, not sent whole', async () => {
    const dir = await mkdtemp(path.join(tmpdir(), 'warren-caps-'));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const client = new ControlPlaneClient({ targets: ['127.0.0.1:1'], nodeId: 'n1', nodeAddress: '127.0.0.1:2', stateDir: dir, log: createLogger('test', 'silent') });
    // Not started: reports only fill its table (the next full sync).
    client.sessionUp(largestSession(0));
    const n = Math.ceil(MAX_FULL_SYNC_BYTES / tunnelReportBytes(largestTunnel(0))) + 50;
    for (let i = 0; i < n; i++) client.tunnelUp(largestTunnel(i));
    const msg = (client as unknown as { fullSyncMessage(): Parameters<typeof encodeNode>[0] }).fullSyncMessage();
    const size = encodeNode(msg).length;
    expect(size).toBeLessThanOrEqual(MAX_FULL_SYNC_BYTES);
    expect(msg.fullSync!.sessions).toHaveLength(1);
    expect(msg.fullSync!.tunnels!.length).toBeGreaterThan(n - 60);
    expect(msg.fullSync!.tunnels!.length).toBeLessThan(n);
  }, 60_000);
});
