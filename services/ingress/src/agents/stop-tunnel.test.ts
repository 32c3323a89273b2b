import ngrok from '@ngrok/ngrok';
import { describe, expect, it } from 'vitest';
import { encodeStopTunnel, MuxSession, readStreamType, rpcCall, StreamType, type MuxStream } from '@warren/shared';
import { AgentRpcError } from '../../../agent/src/client.js';
import { MAX_STOP_TUNNEL_STREAMS, STOP_TUNNEL_TIMEOUT_MS, type LocalTunnelImpl } from './agent-connection.js';
import { TunnelStreamError, type AgentServer, type ProxyHeaderInit } from './server.js';
import { agentServerHarness, httpRequest, startUpstream } from './testing.js';
import { until } from '../../../../test/support/until.js';

/**
 * StopTunnel (server → agent, stream type 9; agent-protocol.md §3): the node stops one tunnel of
 * a live session, e.g. when the credential's ACL no longer allows it. The request goes out whole
 * (type + one JSON object, then FIN), no answer is waited for (the official SDK sends none), the
 * stream never keeps a slot of the session's cap past its end, and the tunnel is closed on the
 * node at once; the session and its other tunnels carry on.
 */

const TOKEN = 'wrn_agt_stop_token_1';
const ACL_TOKEN = 'wrn_agt_stop_token_acl';
const OTHER_TOKEN = 'wrn_agt_stop_token_other';
const ACL = ['bind:a.acl.test', 'bind:b.acl.test', 'bind:team=blue', 'bind:team=red'];
const h = agentServerHarness({
  nodeId: 'node-stop',
  tokens: [
    { token: TOKEN, identity: { credentialId: 'cr_1', accountId: 'ac_1', acl: [] } },
    { token: ACL_TOKEN, identity: { credentialId: 'cr_acl', accountId: 'ac_1', acl: ACL } },
    { token: OTHER_TOKEN, identity: { credentialId: 'cr_other', accountId: 'ac_1', acl: ACL } },
  ],
});
const { cleanups, startServer, startClient } = h;
const LOCAL = 'http://127.0.0.1:9';
const ENDPOINT: ProxyHeaderInit = { clientAddr: '203.0.113.5:4000', proto: 'https', edgeType: '0' };

function events(server: AgentServer) {
  const closed: Array<[string, string]> = [];
  server.on('tunnelClosed', (id, reason) => closed.push([id, reason]));
  return closed;
}

interface SeenStop {
  st: MuxStream;
  bytes: Buffer;
  ended: boolean;
  reset: boolean;
}

/**
 * A hand-made agent: echoes heartbeats, holds proxy streams open, and records StopTunnel streams
 * (whose type it has read) without answering or closing them; the test decides.
 */
async function rawAgent(port: number) {
  const mux = new MuxSession(await h.tlsTo(port), { client: true });
  const stops: SeenStop[] = [];
  const proxies: MuxStream[] = [];
  mux.on('stream', (st: MuxStream) => {
    readStreamType(st, 5_000).then(
      (type) => {
        if (type === StreamType.Heartbeat) {
          st.on('data', (b: Buffer) => st.write(b));
          return;
        }
        if (type === StreamType.StopTunnel) {
          const s: SeenStop = { st, bytes: Buffer.alloc(0), ended: false, reset: false };
          stops.push(s);
          st.on('data', (b: Buffer) => (s.bytes = Buffer.concat([s.bytes, b])));
          st.on('end', () => (s.ended = true));
          st.on('error', () => (s.reset = true));
          return;
        }
        proxies.push(st);
        st.resume();
      },
      () => st.destroy(),
    );
  });
  await rpcCall(mux, StreamType.Auth, { Version: ['2'], ClientId: '', Extra: { AuthToken: TOKEN } });
  const bind = async (domain: string) => ((await rpcCall(mux, StreamType.Bind, { Id: '', Proto: 'https', Opts: { Domain: domain }, Extra: {} })) as { Id: string }).Id;
  return { mux, stops, proxies, bind };
}

const connOf = (server: AgentServer, id: string) => (server.getTunnel(id) as LocalTunnelImpl).connection;

describe('StopTunnel on the wire', () => {
  it('encodes type 9 and one complete JSON object with the three fields as strings', () => {
    const b = encodeStopTunnel({ Id: 'tn_1', Message: 'no "longer" allowed ü (ERR_WARREN_1100)', ErrorCode: 'ERR_WARREN_1100' });
    expect(b.readUInt32BE(0)).toBe(9);
    expect(JSON.parse(b.subarray(4).toString('utf8'))).toEqual({ Id: 'tn_1', Message: 'no "longer" allowed ü (ERR_WARREN_1100)', ErrorCode: 'ERR_WARREN_1100' });
  });

  it('opens an even stream, writes the request whole and FINs; closes the tunnel at once without waiting for an answer', async () => {
    const { server, port } = await startServer();
    const closed = events(server);
    const agent = await rawAgent(port);
    const a = await agent.bind('a.stop.test');
    const b = await agent.bind('b.stop.test');
    const conn = connOf(server, a);
    expect(server.stopTunnel(a, 'the authtoken ACL no longer allows binding a.stop.test (ERR_WARREN_1100)', 'ERR_WARREN_1100')).toBe(true);
    // Closed here at once: out of the node's tunnels (and so out of routing and the caps), reported down.
    expect(server.getTunnel(a)).toBeUndefined();
    expect(closed).toEqual([[a, 'stopped by the server: the authtoken ACL no longer allows binding a.stop.test (ERR_WARREN_1100)']]);
    expect(server.stopTunnel(a, 'again', 'ERR_WARREN_1100')).toBe(false);
    expect(server.stopTunnel('tn_unknown', 'x', 'ERR_WARREN_1100')).toBe(false);

    const [stop] = await until(() => (agent.stops[0]?.ended ? agent.stops : null));
    expect(stop!.st.id % 2).toBe(0);
    expect(JSON.parse(stop!.bytes.toString('utf8'))).toEqual({ Id: a, Message: 'the authtoken ACL no longer allows binding a.stop.test (ERR_WARREN_1100)', ErrorCode: 'ERR_WARREN_1100' });
    // Until the agent lets go of it, the stream holds a slot of the session's cap...
    expect(conn.streamSlotsInUse).toBe(1);
    // ...and once it FINs (as the SDK does when it drops the stream), the slot is free at once.
    stop!.st.end();
    await until(() => conn.mux.outboundStreams === 1); // our heartbeat stream only
    expect(conn.streamSlotsInUse).toBe(0);

    // The session and its other tunnel carry on.
    expect(server.sessions()).toHaveLength(1);
    expect(server.getTunnel(b)).toBeDefined();
    const st = await server.getTunnel(b)!.openStream(ENDPOINT);
    await until(() => agent.proxies.length === 1);
    st.destroy();
  });

  it('resets a StopTunnel stream the agent neither FINs nor resets, and lets its slot go after the liveness window', async () => {
    const { server, port } = await startServer({ heartbeatIntervalMs: 100, heartbeatToleranceMs: 200 });
    const agent = await rawAgent(port);
    const a = await agent.bind('silent.stop.test');
    const conn = connOf(server, a);
    server.stopTunnel(a, 'stop', 'ERR_WARREN_1100');
    await until(() => agent.stops.length === 1);
    expect(conn.streamSlotsInUse).toBe(1);
    await new Promise((r) => setTimeout(r, STOP_TUNNEL_TIMEOUT_MS - 1_000));
    expect(agent.stops[0]!.reset).toBe(false);
    await until(() => agent.stops[0]!.reset, 3_000);
    // Reset before the agent's FIN: held for the liveness window (300 ms here), then free.
    expect(conn.streamSlotsInUse).toBe(1);
    await until(() => conn.streamSlotsInUse === 0, 2_000);
    expect(server.sessions()).toHaveLength(1);
  }, 20_000);

  it('takes one slot past the stream cap when proxy streams fill the session; further ones wait for it', async () => {
    const { server, port } = await startServer({ maxStreamsPerSession: 2 });
    const agent = await rawAgent(port);
    const [t1, t2, t3] = [await agent.bind('p1.stop.test'), await agent.bind('p2.stop.test'), await agent.bind('p3.stop.test')];
    const tunnel = server.getTunnel(t1)!;
    const conn = connOf(server, t1);
    await Promise.all([tunnel.openStream(ENDPOINT), tunnel.openStream(ENDPOINT)]);
    await until(() => agent.proxies.length === 2);
    expect(conn.streamSlotsInUse).toBe(2);

    server.stopTunnel(t2, 'stop 2', 'ERR_WARREN_1100');
    server.stopTunnel(t3, 'stop 3', 'ERR_WARREN_1100');
    expect(server.getTunnel(t2)).toBeUndefined();
    expect(server.getTunnel(t3)).toBeUndefined();
    await until(() => agent.stops[0]?.ended);
    expect(conn.streamSlotsInUse).toBe(3);
    // Proxy streams never get the reserve; the second StopTunnel waits for it.
    const refused = await tunnel.openStream(ENDPOINT).catch((e: unknown) => e);
    expect((refused as TunnelStreamError).code).toBe('STREAM_CAP');
    await new Promise((r) => setTimeout(r, 300));
    expect(agent.stops).toHaveLength(1);
    agent.stops[0]!.st.end();
    await until(() => agent.stops[1]?.ended);
    expect(JSON.parse(agent.stops[1]!.bytes.toString()).Id).toBe(t3);
    agent.stops[1]!.st.end();
    await until(() => conn.streamSlotsInUse === 2);
  });

  it(`opens at most ${MAX_STOP_TUNNEL_STREAMS} StopTunnel streams of a session at once`, async () => {
    const { server, port } = await startServer();
    const agent = await rawAgent(port);
    const ids: string[] = [];
    for (let i = 0; i < MAX_STOP_TUNNEL_STREAMS + 2; i++) ids.push(await agent.bind(`m${i}.stop.test`));
    for (const id of ids) server.stopTunnel(id, 'stop', 'ERR_WARREN_1100');
    expect(server.tunnels()).toEqual([]);
    await until(() => agent.stops.length === MAX_STOP_TUNNEL_STREAMS);
    await new Promise((r) => setTimeout(r, 200));
    expect(agent.stops).toHaveLength(MAX_STOP_TUNNEL_STREAMS);
    agent.stops[0]!.st.end();
    await until(() => agent.stops.length === MAX_STOP_TUNNEL_STREAMS + 1);
    for (const s of agent.stops) s.st.end();
    await until(() => agent.stops.length === ids.length);
    for (const s of agent.stops) s.st.end();
    expect(agent.stops.map((s) => JSON.parse(s.bytes.toString()).Id)).toEqual(ids);
    const conn = [...(server as unknown as { connections: Set<{ streamSlotsInUse: number }> }).connections][0]!;
    await until(() => conn.streamSlotsInUse === 0);
  });

  it('keeps at most MAX_TUNNELS_PER_SESSION requests waiting for a stream, dropping the oldest', async () => {
    const { server, port } = await startServer({ maxTunnelsPerSession: 2 });
    const agent = await rawAgent(port);
    const ids: string[] = [];
    for (let round = 0; round < 5; round++) {
      const pair = [await agent.bind(`q${round}a.stop.test`), await agent.bind(`q${round}b.stop.test`)];
      ids.push(...pair);
      for (const id of pair) expect(server.stopTunnel(id, 'stop', 'ERR_WARREN_1100')).toBe(true);
    }
    await until(() => agent.stops.length === MAX_STOP_TUNNEL_STREAMS);
    for (const s of agent.stops) s.st.end();
    await until(() => agent.stops.length === MAX_STOP_TUNNEL_STREAMS + 2);
    await new Promise((r) => setTimeout(r, 200));
    for (const s of agent.stops) s.st.end();
    expect(agent.stops).toHaveLength(MAX_STOP_TUNNEL_STREAMS + 2);
    expect(agent.stops.map((s) => JSON.parse(s.bytes.toString()).Id)).toEqual([...ids.slice(0, MAX_STOP_TUNNEL_STREAMS), ...ids.slice(-2)]);
    expect(server.tunnels()).toEqual([]);
  });

  it("resets what the stopped tunnel still carries after stoppedTunnelDrainMs, not before; other tunnels' streams and an unbound tunnel's stay", async () => {
    const { server, port } = await startServer({ stoppedTunnelDrainMs: 400 });
    const agent = await rawAgent(port);
    const stopped = await agent.bind('drained.stop.test');
    const other = await agent.bind('other.stop.test');
    const unbound = await agent.bind('unbound.stop.test');
    const open = async (id: string) => {
      const st = await server.getTunnel(id)!.openStream(ENDPOINT);
      st.on('error', () => {});
      return st;
    };
    const mine = [await open(stopped), await open(stopped)];
    const others = [await open(other), await open(unbound)];
    await until(() => agent.proxies.length === 4);
    const farEnds = [...agent.proxies];
    // The agent's side of a stream the node ends: FIN (then RST if the agent keeps it), so it sees the end first.
    const ended = new Set<MuxStream>();
    for (const p of farEnds) {
      p.on('error', () => {});
      p.once('end', () => ended.add(p));
      p.once('close', () => ended.add(p));
    }
    await rpcCall(agent.mux, StreamType.Unbind, { Id: unbound });
    await until(() => !server.getTunnel(unbound));

    const t0 = performance.now();
    server.stopTunnel(stopped, 'stop', 'ERR_WARREN_1100');
    await new Promise((r) => setTimeout(r, 200));
    // Within the drain: everything still open.
    expect([...mine, ...others].map((s) => s.destroyed)).toEqual([false, false, false, false]);
    await until(() => mine.every((s) => s.destroyed));
    expect(performance.now() - t0).toBeGreaterThanOrEqual(390);
    // The agent sees its two streams end; the other tunnel's and the unbound tunnel's stay open.
    await until(() => ended.size === 2);
    await new Promise((r) => setTimeout(r, 300));
    expect(others.map((s) => s.destroyed)).toEqual([false, false]);
    expect(ended.size).toBe(2);
    for (const s of others) s.destroy();
  });

  it('forgets the reset of a stopped tunnel when its session ends first', async () => {
    const { server, port } = await startServer({ stoppedTunnelDrainMs: 3_600_000 });
    const agent = await rawAgent(port);
    const id = await agent.bind('gone.stop.test');
    const conn = connOf(server, id);
    server.stopTunnel(id, 'stop', 'ERR_WARREN_1100');
    expect(conn.pendingStopCuts).toBe(1);
    agent.mux.destroy();
    await until(() => conn.pendingStopCuts === 0);
  });

  it('a stopped tunnel no longer counts against the caps', async () => {
    const { server, port } = await startServer({ maxTunnelsPerSession: 2 });
    const client = startClient(port);
    await client.connect();
    const a = await client.startLabeledTunnel({ app: 'a' }, LOCAL);
    await client.startLabeledTunnel({ app: 'b' }, LOCAL);
    await expect(client.startLabeledTunnel({ app: 'c' }, LOCAL)).rejects.toThrow(/MAX_TUNNELS_PER_SESSION/);
    server.stopTunnel(a.id, 'stop', 'ERR_WARREN_1100');
    await client.startLabeledTunnel({ app: 'c' }, LOCAL);
    expect(server.tunnels()).toHaveLength(2);
  });
});

describe('StopTunnel to warren-agent', () => {
  it('emits tunnelLost with the message; the session and the other tunnels carry on, and the stream leaves no slot taken', async () => {
    const { server, port } = await startServer();
    const up = await startUpstream();
    cleanups.push(() => up.close());
    const client = startClient(port);
    const sessionId = await client.connect();
    const a = await client.bind({ domain: 'a.agent.test', forwardsTo: up.url });
    const b = await client.bind({ domain: 'b.agent.test', forwardsTo: up.url });
    const lost: Array<[string, string]> = [];
    client.on('tunnelLost', (id, why) => lost.push([id, why]));
    const conn = connOf(server, a.id);
    server.stopTunnel(a.id, 'the hostname a.agent.test is in use by another account (ERR_WARREN_4101)', 'ERR_WARREN_4101');
    await until(() => lost.length === 1);
    expect(lost).toEqual([[a.id, 'the hostname a.agent.test is in use by another account (ERR_WARREN_4101)']]);
    expect(client.list().map((t) => t.id)).toEqual([b.id]);
    // The agent answered `{}` and FINed: no slot is kept.
    await until(() => conn.mux.outboundStreams === 1);
    expect(conn.streamSlotsInUse).toBe(0);
    const res = await httpRequest({ stream: await server.getTunnel(b.id)!.openStream(ENDPOINT) }, { path: '/after' });
    expect(res.body.toString()).toBe('hello /after');
    expect(server.sessions().map((s) => s.id)).toEqual([sessionId]);
    expect(client.session).toBe(sessionId);
  });
});

describe('StopTunnel to the official SDK (@ngrok/ngrok 1.7.0)', () => {
  it('closes the listener with the message and code; the session keeps serving its other listeners and does not bind the stopped one again', async () => {
    const { server, port } = await startServer();
    const up = await startUpstream();
    cleanups.push(() => up.close());
    const session = await new ngrok.SessionBuilder().serverAddr(`localhost:${port}`).caCert(Buffer.from(h.pki.caPem)).authtoken(TOKEN).connect();
    cleanups.push(() => session.close().catch(() => {}));
    const la = await session.httpEndpoint().domain('a.sdk.test').listenAndForward(up.url);
    const lb = await session.httpEndpoint().domain('b.sdk.test').listenAndForward(up.url);
    const ll = await session.labeledListener().label('app', 'sdk').listenAndForward(up.url);
    const joined = (l: ngrok.Listener) => l.join().then(() => null, (e: Error) => e);
    const aDone = joined(la);
    const lDone = joined(ll);
    const conn = connOf(server, la.id());

    expect(server.stopTunnel(la.id(), 'the authtoken\'s ACL no longer allows binding a.sdk.test (ERR_WARREN_1100)', 'ERR_WARREN_1100')).toBe(true);
    const err = await aDone;
    expect(err?.message).toMatch(/ListenerClosed/);
    expect(err?.message).toContain("the authtoken's ACL no longer allows binding a.sdk.test (ERR_WARREN_1100)");
    expect(err?.message).toContain('ERR_WARREN_1100');
    // The SDK dropped the stream (a FIN, no answer): no slot is kept.
    await until(() => conn.mux.outboundStreams === 1);
    expect(conn.streamSlotsInUse).toBe(0);

    // Its accept loop lives on: new proxy streams to the other listeners are served.
    for (const id of [lb.id(), ll.id()]) {
      const res = await httpRequest({ stream: await server.getTunnel(id)!.openStream(id === ll.id() ? { ...ENDPOINT, edgeType: '3' } : ENDPOINT) }, { path: `/after/${id}` });
      expect(res.body.toString()).toBe(`hello /after/${id}`);
    }
    // A labeled listener too.
    server.stopTunnel(ll.id(), "the authtoken's ACL no longer allows these labels (ERR_WARREN_1100)", 'ERR_WARREN_1100');
    expect((await lDone)?.message).toContain("the authtoken's ACL no longer allows these labels (ERR_WARREN_1100)");
    const again = await httpRequest({ stream: await server.getTunnel(lb.id())!.openStream(ENDPOINT) }, { path: '/again' });
    expect(again.body.toString()).toBe('hello /again');

    // Reconnecting, the SDK resumes only the listener still open.
    const sessionId = server.sessions()[0]!.id;
    server.closeSessionsOfCredential('cr_1', 'test: drop the session');
    await until(() => server.sessions()[0]?.id === sessionId && server.tunnels().length === 1, 15_000);
    await new Promise((r) => setTimeout(r, 300));
    expect(server.tunnels().map((t) => t.id)).toEqual([lb.id()]);
    const resumed = await httpRequest({ stream: await server.getTunnel(lb.id())!.openStream(ENDPOINT) }, { path: '/resumed' });
    expect(resumed.body.toString()).toBe('hello /resumed');
  }, 30_000);
});

describe('many StopTunnels at once to the official SDK', () => {
  it('closes every listener stopped and keeps serving the rest', async () => {
    const { server, port } = await startServer();
    const up = await startUpstream();
    cleanups.push(() => up.close());
    const session = await new ngrok.SessionBuilder().serverAddr(`localhost:${port}`).caCert(Buffer.from(h.pki.caPem)).authtoken(TOKEN).connect();
    cleanups.push(() => session.close().catch(() => {}));
    const n = 3 * MAX_STOP_TUNNEL_STREAMS;
    const stopped = await Promise.all(Array.from({ length: n }, (_, i) => session.labeledListener().label('app', `many${i}`).listenAndForward(up.url)));
    const kept = await session.httpEndpoint().domain('kept.sdk.test').listenAndForward(up.url);
    const conn = connOf(server, kept.id());
    const closed = stopped.map((l) => l.join().then(() => null, (e: Error) => e));
    for (const l of stopped) server.stopTunnel(l.id(), `stopped ${l.id()} (ERR_WARREN_1100)`, 'ERR_WARREN_1100');
    const errs = await Promise.all(closed);
    errs.forEach((e, i) => expect(e?.message).toContain(`stopped ${stopped[i]!.id()} (ERR_WARREN_1100)`));
    await until(() => conn.mux.outboundStreams === 1);
    expect(server.tunnels().map((t) => t.id)).toEqual([kept.id()]);
    for (let i = 0; i < 3; i++) {
      const res = await httpRequest({ stream: await server.getTunnel(kept.id())!.openStream(ENDPOINT) }, { path: `/kept/${i}` });
      expect(res.body.toString()).toBe(`hello /kept/${i}`);
    }
  }, 30_000);
});

describe("a credential's ACL narrowed on a live session", () => {
  it("stops the tunnels the new ACL no longer allows (Binds by hostname, labeled by labels); the session, the others and later Binds follow the new ACL", async () => {
    const { server, port } = await startServer();
    const closed = events(server);
    const client = startClient(port, ACL_TOKEN);
    const sessionId = await client.connect();
    const lost: Array<[string, string]> = [];
    client.on('tunnelLost', (id, why) => lost.push([id, why]));
    const a = await client.bind({ domain: 'a.acl.test', forwardsTo: LOCAL });
    const b = await client.bind({ domain: 'b.acl.test', forwardsTo: LOCAL });
    const blue = await client.startLabeledTunnel({ team: 'blue' }, LOCAL);
    const red = await client.startLabeledTunnel({ team: 'red' }, LOCAL);
    // Another credential's session (the same ACL) is not touched.
    const other = startClient(port, OTHER_TOKEN);
    await other.connect();
    const otherBlue = await other.startLabeledTunnel({ team: 'blue' }, LOCAL);

    const narrowed = ['bind:b.acl.test', 'bind:team=red'];
    expect(server.applyCredentialAcls((id) => (id === 'cr_acl' ? narrowed : id === 'cr_other' ? ACL : undefined))).toBe(2);
    expect(server.getTunnel(a.id)).toBeUndefined();
    expect(server.getTunnel(blue.id)).toBeUndefined();
    expect(closed.map(([id]) => id).sort()).toEqual([a.id, blue.id].sort());
    await until(() => lost.length === 2);
    expect(new Map(lost)).toEqual(
      new Map([
        [a.id, "the authtoken's ACL no longer allows binding a.acl.test (ERR_WARREN_1100)"],
        [blue.id, "the authtoken's ACL no longer allows these labels (ERR_WARREN_1100)"],
      ]),
    );
    expect(server.tunnels().map((t) => t.id).sort()).toEqual([b.id, red.id, otherBlue.id].sort());
    expect(server.sessions().map((s) => s.id)).toContain(sessionId);

    // The session holds the new ACL: a later Bind or labeled tunnel is checked against it.
    await expect(client.bind({ domain: 'a.acl.test', forwardsTo: LOCAL })).rejects.toThrow(AgentRpcError);
    await expect(client.bind({ domain: 'a.acl.test', forwardsTo: LOCAL })).rejects.toThrow(/ACL does not allow binding a\.acl\.test.*ERR_WARREN_1100/);
    await expect(client.startLabeledTunnel({ team: 'blue' }, LOCAL)).rejects.toThrow(/ACL does not allow these labels/);
    await client.startLabeledTunnel({ team: 'red' }, LOCAL);

    // The same ACL again, or a credential the config no longer has: nothing to do.
    expect(server.applyCredentialAcls((id) => (id === 'cr_acl' ? narrowed : id === 'cr_other' ? ACL : undefined))).toBe(0);
    expect(server.applyCredentialAcls(() => undefined)).toBe(0);
    expect(server.tunnels()).toHaveLength(4);
    // Widened again: allowed anew.
    expect(server.applyCredentialAcls((id) => (id === 'cr_acl' ? [] : undefined))).toBe(0);
    await client.startLabeledTunnel({ team: 'blue' }, LOCAL);
  });
});
