import ngrok from '@ngrok/ngrok';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../../services/agent/src/client.js';
import { waitFor } from '../support/cluster.js';
import { startPolicyCluster, type PolicyCluster } from '../support/policy-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * What one authtoken and one agent session may do on an ingress node, through real processes (a
 * control plane, two ingress nodes, our agent client and the official SDK):
 * - node A caps sessions and tunnels per credential (MAX_SESSIONS_PER_CREDENTIAL,
 *   MAX_TUNNELS_PER_CREDENTIAL): one authtoken could hold its account's whole share of the node;
 * - oversized metadata is refused with an error naming the field and the limit, where it used to
 *   be cut silently and reported cut;
 * - node B rate-limits tunnel starts per session (TUNNEL_STARTS_PER_SECOND_PER_SESSION): a session
 *   starting and stopping tunnels in a loop made every node and the control plane do work.
 */

const HOST = 'limits.e2e.test';
const SESSIONS_PER_CREDENTIAL = 2;
const TUNNELS_PER_CREDENTIAL = 3;
const STARTS_PER_SECOND = 2;
const START_BURST = 3;
let c: PolicyCluster;
const clients: AgentClient[] = [];
const sdkSessions: ngrok.Session[] = [];

beforeAll(async () => {
  c = await startPolicyCluster({
    name: 'agentlimits',
    host: HOST,
    nodes: 2,
    ingressEnv: (nodeId): Record<string, string> =>
      nodeId.endsWith('-a')
        ? { MAX_SESSIONS_PER_CREDENTIAL: String(SESSIONS_PER_CREDENTIAL), MAX_TUNNELS_PER_CREDENTIAL: String(TUNNELS_PER_CREDENTIAL) }
        : { TUNNEL_STARTS_PER_SECOND_PER_SESSION: String(STARTS_PER_SECOND), TUNNEL_START_BURST_PER_SESSION: String(START_BURST) },
  });
  await c.route('/ok', {});
}, CLUSTER_HOOK_MS);

afterAll(async () => {
  await Promise.allSettled([...clients.map((cl) => cl.close()), ...sdkSessions.map((s) => s.close())]);
  await c?.stop();
}, 60_000);

const LOCAL = 'http://127.0.0.1:9';

function client(token: string, node: 'a' | 'b' = 'a', opts: { metadata?: string } = {}): AgentClient {
  const port = node === 'a' ? c.a.agent : c.nodes[1]!.agent;
  const cl = new AgentClient({ serverAddr: `localhost:${port}`, authtoken: token, ca: c.tls.caPem!, reconnect: false, ...opts });
  clients.push(cl);
  return cl;
}

/** A session of `token` once the node knows the credential (the config reaches it shortly after the API call). */
async function connected(token: string, node: 'a' | 'b' = 'a'): Promise<AgentClient> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const cl = client(token, node);
    try {
      await cl.connect();
      return cl;
    } catch (err) {
      if (!/ERR_WARREN_1004/.test((err as Error).message) || Date.now() > deadline) throw err;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

function sdk(token: string, node: 'a' | 'b' = 'a'): ngrok.SessionBuilder {
  const port = node === 'a' ? c.a.agent : c.nodes[1]!.agent;
  return new ngrok.SessionBuilder().serverAddr(`localhost:${port}`).caCert(Buffer.from(c.tls.caPem!)).authtoken(token);
}

async function sdkConnect(b: ngrok.SessionBuilder): Promise<ngrok.Session> {
  const s = await b.connect();
  sdkSessions.push(s);
  return s;
}

const failure = (p: Promise<unknown>) =>
  p.then(
    () => null,
    (e: Error) => e,
  );

async function status(url: string): Promise<Record<string, unknown>> {
  return (await (await fetch(`${url}/status`)).json()) as Record<string, unknown>;
}

/** The account's live tunnels as the control plane lists them. */
async function listedTunnels(): Promise<Array<{ id: string; metadata?: string }>> {
  return (await c.api('GET', '/tunnels')).body?.tunnels ?? [];
}

describe('agent limits through real processes', () => {
  it('per credential: a third session and a fourth tunnel of one authtoken are refused; its account\'s other authtoken is not held back', async () => {
    const cred = await c.credential();
    const one = await connected(cred.token);
    const two = client(cred.token);
    await two.connect();
    await expect(client(cred.token).connect()).rejects.toThrow(/this authtoken already has 2 agent sessions on this ingress node.*\(MAX_SESSIONS_PER_CREDENTIAL\).*ERR_WARREN_1110/);
    // The official SDK gets the same refusal from connect().
    expect((await failure(sdk(cred.token).connect()))?.message).toMatch(/MAX_SESSIONS_PER_CREDENTIAL.*ERR_WARREN_1110/);

    await one.startLabeledTunnel({ app: 'cred1' }, LOCAL);
    await one.bind({ domain: 'cred2.limits.e2e.test', forwardsTo: LOCAL });
    await two.startLabeledTunnel({ app: 'cred3' }, LOCAL);
    await expect(two.startLabeledTunnel({ app: 'cred4' }, LOCAL)).rejects.toThrow(/this authtoken already has 3 tunnels on this ingress node.*\(MAX_TUNNELS_PER_CREDENTIAL\).*ERR_WARREN_1110/);
    await expect(one.bind({ domain: 'cred4.limits.e2e.test', forwardsTo: LOCAL })).rejects.toThrow(/MAX_TUNNELS_PER_CREDENTIAL.*ERR_WARREN_1110/);

    // Another authtoken of the same account starts tunnels, through the SDK.
    const other = await c.credential();
    await (await connected(other.token)).close();
    const session = await sdkConnect(sdk(other.token));
    const upstream = `http://127.0.0.1:${(c.upstream.address() as { port: number }).port}`;
    await session.labeledListener().label('app', 'agentlimits').label('via', 'sibling').listenAndForward(upstream);

    // The control plane lists exactly what was accepted (the cluster's agent's tunnel + 3 + 1); A stays connected.
    await waitFor('5 tunnels listed', async () => (await listedTunnels()).length === 5, 10_000);
    expect(await status(c.a.internalUrl)).toMatchObject({ control_plane_connected: true, agent_sessions: 4, local_tunnels: 5 });
    // The refused sessions carry on: one that leaves frees the credential's places.
    await one.close();
    await waitFor('one session gone', async () => (await status(c.a.internalUrl)).agent_sessions === 3, 10_000);
    const three = client(cred.token);
    await three.connect();
    await three.startLabeledTunnel({ app: 'cred5' }, LOCAL);
    await two.startLabeledTunnel({ app: 'cred6' }, LOCAL);
    await expect(three.startLabeledTunnel({ app: 'cred7' }, LOCAL)).rejects.toThrow(/MAX_TUNNELS_PER_CREDENTIAL/);
    for (let i = 0; i < 3; i++) {
      const r = await c.request(`/ok/cred${i}`, { port: c.nodes[1]!.http });
      expect(r.status, r.body).toBe(200);
    }
  }, 60_000);

  it('oversized metadata is refused naming the field and the limit; metadata at the limit reaches the control plane whole', async () => {
    const cred = await c.credential();
    await expect(client(cred.token, 'a', { metadata: 's'.repeat(4097) }).connect()).rejects.toThrow(/session metadata \(Auth Extra\.Metadata\) is 4097 bytes, over the limit of 4096 bytes.*ERR_WARREN_5001/);
    expect((await failure(sdk(cred.token).metadata('é'.repeat(2049)).connect()))?.message).toMatch(/session metadata \(Auth Extra\.Metadata\) is 4098 bytes, over the limit of 4096 bytes.*ERR_WARREN_5001/);

    await (await connected(cred.token)).close();
    const session = await sdkConnect(sdk(cred.token).metadata('s'.repeat(4096)));
    const err = await failure(session.labeledListener().label('app', 'big').metadata('t'.repeat(5000)).listen());
    expect(err?.message).toMatch(/tunnel metadata \(StartTunnelWithLabel Metadata\) is 5000 bytes, over the limit of 4096 bytes.*ERR_WARREN_5001/);
    const endpointErr = await failure(session.httpEndpoint().domain('big.limits.e2e.test').metadata('t'.repeat(4097)).listen());
    expect(endpointErr?.message).toMatch(/tunnel metadata \(Bind Extra\.Metadata\) is 4097 bytes, over the limit of 4096 bytes.*ERR_WARREN_5001/);
    // The session carries on; at the limit nothing is cut, up to the control plane.
    const metadata = 'é'.repeat(2048);
    const l = await session.labeledListener().label('app', 'fits').metadata(metadata).listen();
    await waitFor('the tunnel listed', async () => (await listedTunnels()).some((t) => t.id === l.id()), 10_000);
    expect((await listedTunnels()).find((t) => t.id === l.id())?.metadata).toBe(metadata);
    const sessions = (await c.api('GET', '/tunnel_sessions')).body?.tunnel_sessions as Array<{ metadata?: string }>;
    expect(sessions.some((s) => s.metadata === 's'.repeat(4096))).toBe(true);
    await l.close();
  }, 60_000);

  it('tunnel starts per session are rate limited (ERR_WARREN_8001, retry later); the session and the node carry on', async () => {
    const cred = await c.credential();
    const churn = await connected(cred.token, 'b');
    // Start and stop in a tight loop: the burst goes through (a session's bucket starts full, so
    // whatever the timing), then the rate holds.
    const t0 = performance.now();
    for (let i = 0; i < START_BURST; i++) {
      const t = i % 2 ? await churn.bind({ domain: `churn${i}.limits.e2e.test`, forwardsTo: LOCAL }) : await churn.startLabeledTunnel({ app: `churn${i}` }, LOCAL);
      await churn.unbind(t.id);
    }
    // Then more starts than the bucket holds, StartTunnelWithLabel and Bind in turn, all at once:
    // one after another, a loaded box may take long enough per round trip for a token to come back
    // in between (one every 500 ms), and a start that should be refused would go through.
    const over = await Promise.allSettled(
      Array.from({ length: 4 * START_BURST }, (_, i) => (i % 2 ? churn.bind({ domain: `churn-over${i}.limits.e2e.test`, forwardsTo: LOCAL }) : churn.startLabeledTunnel({ app: `churn-over${i}` }, LOCAL))),
    );
    const elapsed = performance.now() - t0;
    const overStarted = over.flatMap((o) => (o.status === 'fulfilled' ? [o.value] : []));
    for (const t of overStarted) await churn.unbind(t.id);
    // Whatever the timing, the session started no more than its burst and what refilled since its
    // first start; and the starts that arrived with the bucket empty were refused, of each kind.
    expect(START_BURST + overStarted.length, `started in ${Math.round(elapsed)} ms`).toBeLessThanOrEqual(Math.floor(START_BURST + (STARTS_PER_SECOND * elapsed) / 1000));
    const refusals = (kind: 0 | 1) => over.flatMap((o, i) => (i % 2 === kind && o.status === 'rejected' ? [(o.reason as Error).message] : []));
    const [labeled, bound] = [refusals(0), refusals(1)];
    expect(labeled.length, `StartTunnelWithLabel refusals of ${over.length / 2} in ${Math.round(elapsed)} ms`).toBeGreaterThan(0);
    expect(bound.length, `Bind refusals of ${over.length / 2} in ${Math.round(elapsed)} ms`).toBeGreaterThan(0);
    for (const message of [...labeled, ...bound]) {
      expect(message).toMatch(/this agent session starts tunnels faster than this server allows \(TUNNEL_STARTS_PER_SECOND_PER_SESSION: 2 a second, 3 at once\); retry in \d+ ms \(ERR_WARREN_8001\)/);
    }

    // The official SDK gets the refusal as an error, and its session carries on.
    // Four times the burst at once (one after another, a loaded box may take long enough per start
    // for the bucket to refill in between): the burst goes through, no more than the bucket and
    // its refill allow over the time taken, the rest are refused.
    const session = await sdkConnect(sdk(cred.token, 'b'));
    const s0 = performance.now();
    const starts = await Promise.allSettled(Array.from({ length: 4 * START_BURST }, (_, i) => session.labeledListener().label('app', `sdk${i}`).listen()));
    const sdkElapsed = performance.now() - s0;
    const refused = starts.flatMap((s) => (s.status === 'rejected' ? [s.reason as Error] : []));
    expect(starts.length - refused.length).toBeGreaterThanOrEqual(START_BURST);
    expect(starts.length - refused.length, `started in ${Math.round(sdkElapsed)} ms`).toBeLessThanOrEqual(Math.floor(START_BURST + (STARTS_PER_SECOND * sdkElapsed) / 1000));
    expect(refused.length).toBeGreaterThan(0);
    for (const err of refused) expect(err.message).toMatch(/TUNNEL_STARTS_PER_SECOND_PER_SESSION.*retry in \d+ ms.*ERR_WARREN_8001/);
    for (const s of starts) if (s.status === 'fulfilled') await s.value.close();

    // Once the bucket refills (a token every 500 ms), both sessions start tunnels again.
    await new Promise((r) => setTimeout(r, 1_100));
    const kept = await churn.startLabeledTunnel({ app: 'churn-later' }, LOCAL);
    const l = await session.labeledListener().label('app', 'sdk-later').listen();
    await waitFor('both listed', async () => {
      const ids = (await listedTunnels()).map((t) => t.id);
      return ids.includes(kept.id) && ids.includes(l.id());
    }, 10_000);
    expect(await status(c.nodes[1]!.internalUrl)).toMatchObject({ control_plane_connected: true, agent_sessions: 2, local_tunnels: 2 });
  }, 60_000);
});
