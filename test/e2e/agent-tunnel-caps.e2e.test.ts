import ngrok from '@ngrok/ngrok';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../../services/agent/src/client.js';
import { waitFor } from '../support/cluster.js';
import { startPolicyCluster, type PolicyCluster } from '../support/policy-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * Tunnels per agent session (MAX_TUNNELS_PER_SESSION) and per ingress node
 * (MAX_TUNNELS_PER_NODE), through real processes: a control plane, two ingress nodes and our
 * agent serving a tunnel-group backend on node A. An audit opened 20,000 labeled tunnels with
 * 4,000 characters of metadata on one session: node A's full sync went over the control plane's
 * 64 MiB message limit, A lost its config stream for good, node B's remote tunnels grew to
 * 11,214, another account's tunnel became unreachable through B and credential revocations no
 * longer reached A. Now the tunnel past a cap gets the protocol's error answer, and the node stays
 * connected and serving.
 */

const HOST = 'caps.e2e.test';
const PER_SESSION = 3;
const PER_NODE = 6;
let c: PolicyCluster;
const clients: AgentClient[] = [];
const sdkSessions: ngrok.Session[] = [];

beforeAll(async () => {
  c = await startPolicyCluster({ name: 'tunnelcaps', host: HOST, nodes: 2, ingressEnv: () => ({ MAX_TUNNELS_PER_SESSION: String(PER_SESSION), MAX_TUNNELS_PER_NODE: String(PER_NODE) }) });
  await c.route('/ok', {});
}, CLUSTER_HOOK_MS);

afterAll(async () => {
  await Promise.allSettled([...clients.map((cl) => cl.close()), ...sdkSessions.map((s) => s.close())]);
  await c?.stop();
}, 60_000);

const metadata = 'm'.repeat(4000);
const labels = (i: number) => Object.fromEntries(Array.from({ length: 10 }, (_, k) => [`flood${k}`, `v${i}-${k}`]));

async function flooder(token: string): Promise<AgentClient> {
  const client = new AgentClient({ serverAddr: `localhost:${c.a.agent}`, authtoken: token, ca: c.tls.caPem!, reconnect: false });
  clients.push(client);
  await client.connect();
  return client;
}

/** A node's /status: control_plane_connected, local_tunnels, remote_tunnels, … */
async function status(url: string): Promise<Record<string, unknown>> {
  return (await (await fetch(`${url}/status`)).json()) as Record<string, unknown>;
}

describe('tunnel caps through real processes', () => {
  it('refuses tunnels past the per-session and per-node caps; the node stays connected and serving', async () => {
    const cred = await c.credential();
    const one = await flooder(cred.token);
    for (let i = 0; i < PER_SESSION; i++) await one.startLabeledTunnel(labels(i), 'http://127.0.0.1:9', { metadata });
    // Past the session's cap: the protocol's error answer, for labeled tunnels and Bind alike.
    await expect(one.startLabeledTunnel(labels(99), 'http://127.0.0.1:9', { metadata })).rejects.toThrow(/already has 3 tunnels, the most one session may have \(MAX_TUNNELS_PER_SESSION\).*ERR_WARREN_1110/);
    await expect(one.bind({ domain: 'flood.caps.e2e.test', forwardsTo: 'http://127.0.0.1:9' })).rejects.toThrow(/MAX_TUNNELS_PER_SESSION.*ERR_WARREN_1110/);

    // Another session fills the node: 1 (the cluster's agent) + 3 + 2 = 6.
    const two = await flooder(cred.token);
    for (let i = 0; i < PER_NODE - 1 - PER_SESSION; i++) await two.startLabeledTunnel(labels(10 + i), 'http://127.0.0.1:9', { metadata });
    await expect(two.startLabeledTunnel(labels(98), 'http://127.0.0.1:9', { metadata })).rejects.toThrow(/already has 6 tunnels, the most it may have \(MAX_TUNNELS_PER_NODE\).*ERR_WARREN_1110/);

    // The control plane knows exactly the tunnels that were accepted; node A is still connected.
    await waitFor('6 tunnels listed', async () => (await c.api('GET', '/tunnels')).body?.tunnels?.length === PER_NODE, 10_000);
    expect(await status(c.a.internalUrl)).toMatchObject({ control_plane_connected: true, agent_sessions: 3, local_tunnels: PER_NODE });
    // Node B knows A's tunnels as remote ones, no more than A's cap.
    await waitFor('B knows the 6 tunnels of A', async () => (await status(c.nodes[1]!.internalUrl)).remote_tunnels === PER_NODE, 10_000);
    expect(await status(c.nodes[1]!.internalUrl)).toMatchObject({ control_plane_connected: true, local_tunnels: 0 });

    // The cluster's agent's tunnel is served through A, and through B (which knows it as a remote tunnel).
    for (const port of [c.a.http, c.nodes[1]!.http]) {
      const r = await c.request('/ok/x', { port });
      expect(r.status, r.body).toBe(200);
      expect(r.json().url).toBe('/ok/x');
    }
    // Config changes still reach A: a new route is applied by both nodes.
    await c.route('/later', {});

    // Revoking the flooding credential reaches A and ends both sessions, freeing the node's slots.
    const closed = Promise.all([one, two].map((cl) => new Promise<void>((resolve) => cl.once('closed', () => resolve()))));
    await c.apiExpecting(204, 'DELETE', `/credentials/${cred.id}`);
    await closed;
    await waitFor('only the agent tunnel listed', async () => (await c.api('GET', '/tunnels')).body?.tunnels?.length === 1, 10_000);
    const r = await c.request('/ok/y');
    expect(r.status, r.body).toBe(200);
    expect(await status(c.a.internalUrl)).toMatchObject({ control_plane_connected: true, agent_sessions: 1, local_tunnels: 1 });
  }, 90_000);

  it('the official SDK gets the refusal as an error and its session carries on', async () => {
    const cred = await c.credential();
    const session = await new ngrok.SessionBuilder().serverAddr(`localhost:${c.a.agent}`).caCert(Buffer.from(c.tls.caPem!)).authtoken(cred.token).metadata(metadata).connect();
    sdkSessions.push(session);
    const upstream = `http://127.0.0.1:${(c.upstream.address() as { port: number }).port}`;
    const listeners: ngrok.Listener[] = [];
    for (let i = 0; i < PER_SESSION; i++) listeners.push(await session.labeledListener().label('app', 'tunnelcaps').label('sdk', `s${i}`).metadata(metadata).listenAndForward(upstream));
    const err = await session.labeledListener().label('app', 'tunnelcaps').label('sdk', 'over').listenAndForward(upstream).then(
      () => null,
      (e: Error) => e,
    );
    expect(err?.message).toMatch(/MAX_TUNNELS_PER_SESSION.*ERR_WARREN_1110/);
    // The session is alive: a slot freed is taken again, and the edge is served (by the agent or the SDK's tunnels).
    await listeners[0]!.close();
    await waitFor('the SDK tunnel closed', async () => (await status(c.a.internalUrl)).local_tunnels === PER_SESSION, 10_000);
    await session.labeledListener().label('app', 'tunnelcaps').label('sdk', 'again').listenAndForward(upstream);
    for (let i = 0; i < 5; i++) {
      const r = await c.request(`/ok/sdk${i}`, { port: c.nodes[1]!.http });
      expect(r.status, r.body).toBe(200);
    }
    expect(await status(c.a.internalUrl)).toMatchObject({ control_plane_connected: true, local_tunnels: PER_SESSION + 1 });
  }, 60_000);
});
