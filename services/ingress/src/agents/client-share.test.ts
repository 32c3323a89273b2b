import { describe, expect, it } from 'vitest';
import { MuxSession, readStreamType, rpcCall, StreamType, type MuxStream } from '@warren/shared';
import { clientShareKey, STREAM_LINGER_MS, type LocalTunnelImpl } from './agent-connection.js';
import { AgentServer, DEFAULT_MAX_STREAMS_PER_CLIENT, TunnelStreamError, type TunnelStream } from './server.js';
import { loadIngressEnv } from '../env.js';
import { agentServerHarness, httpRequest, startUpstream } from './testing.js';
import { until } from '../../../../test/support/until.js';

/**
 * A client address's share of an agent session's stream slots (MAX_STREAMS_PER_CLIENT): without
 * it one public client, holding or aborting slow requests, takes all of a session's slots and
 * every other visitor of the tunnel gets 503. A slot counts against the address whose request
 * opened its stream until the session lets go of the slot (finished and lingering, drained after
 * an abort, held after a reset), not earlier.
 */

const TOKEN = 'wrn_agt_share_token_1';
const h = agentServerHarness({ nodeId: 'node-share', tokens: [{ token: TOKEN, identity: { credentialId: 'cr_1', accountId: 'ac_1', acl: [] } }] });
const { cleanups, startServer, startClient } = h;

/** A session of our AgentClient with one labeled tunnel to a local upstream. */
async function agentTunnel(server: AgentServer, port: number): Promise<LocalTunnelImpl> {
  const up = await startUpstream();
  cleanups.push(() => up.close());
  const client = startClient(port);
  await client.connect();
  return server.getTunnel((await client.startLabeledTunnel({ app: 'share' }, up.url)).id)! as LocalTunnelImpl;
}

/**
 * A hand-made agent (bare muxado session, one Bind): echoes our heartbeats unless `holdEchoes`,
 * reads proxy streams and FINs one only when told (`proxies[i].st.end()`).
 */
async function rawAgent(server: AgentServer, port: number, domain: string) {
  const mux = new MuxSession(await h.tlsTo(port), { client: true });
  const state = {
    holdEchoes: false,
    held: [] as Buffer[],
    heartbeat: undefined as MuxStream | undefined,
    proxies: [] as Array<{ st: MuxStream; ended: boolean; reset: boolean }>,
    releaseEchoes() {
      state.holdEchoes = false;
      for (const b of state.held.splice(0)) state.heartbeat!.write(b);
    },
  };
  mux.on('stream', (st: MuxStream) => {
    readStreamType(st, 5_000).then(
      (type) => {
        if (type !== StreamType.Heartbeat) {
          const p = { st, ended: false, reset: false };
          state.proxies.push(p);
          st.resume();
          st.on('end', () => (p.ended = true));
          st.on('error', (e: { code?: string }) => (p.reset = e.code === 'STREAM_RESET'));
          return;
        }
        state.heartbeat = st;
        st.on('data', (b: Buffer) => (state.holdEchoes ? state.held.push(b) : st.write(b)));
      },
      () => st.destroy(),
    );
  });
  await rpcCall(mux, StreamType.Auth, { Version: ['2'], ClientId: '', Extra: { AuthToken: TOKEN } });
  const bind = (await rpcCall(mux, StreamType.Bind, { Id: '', Proto: 'https', Opts: { Domain: domain }, Extra: {} })) as { Id: string };
  return { tunnel: server.getTunnel(bind.Id)! as LocalTunnelImpl, agent: state };
}

const from = (clientAddr: string) => ({ clientAddr, proto: 'https', edgeType: '0' }) as const;

function tryOpen(t: LocalTunnelImpl, clientAddr: string): TunnelStream | TunnelStreamError {
  try {
    return t.openStreamSync(from(clientAddr));
  } catch (err) {
    return err as TunnelStreamError;
  }
}

function codeOf(x: TunnelStream | TunnelStreamError): string {
  return x instanceof TunnelStreamError ? x.code : 'opened';
}

describe('clientShareKey', () => {
  it('is the IPv4 address, the /64 of an IPv6 address, and the IPv4 address of an IPv4-mapped one', () => {
    expect(clientShareKey('203.0.113.7:51234')).toBe('203.0.113.7');
    expect(clientShareKey('203.0.113.7')).toBe('203.0.113.7');
    // Bracketed (Go's JoinHostPort) or as the public listener writes it (`${ip}:${port}`).
    expect(clientShareKey('[2001:db8:0:1::5]:443')).toBe('2001:db8:0:1::/64');
    expect(clientShareKey('2001:db8:0:1:ffff:ffff:ffff:ffff:51234')).toBe('2001:db8:0:1::/64');
    expect(clientShareKey('[2001:0DB8:0000:0001:0:0:0:9%eth0]:1')).toBe('2001:db8:0:1::/64');
    expect(clientShareKey('[2001:db8:0:2::5]:443')).toBe('2001:db8:0:2::/64');
    expect(clientShareKey('[2001:db8::]:443')).toBe('2001:db8:0:0::/64');
    expect(clientShareKey('[::1]:80')).toBe('0:0:0:0::/64');
    expect(clientShareKey('[::ffff:198.51.100.9]:80')).toBe('198.51.100.9');
    expect(clientShareKey('::ffff:198.51.100.9:80')).toBe('198.51.100.9');
    expect(clientShareKey('[::FFFF:c633:6409]:80')).toBe('198.51.100.9');
    // No client in particular (a pool reconnecting for a queued request), or nothing usable: no share.
    expect(clientShareKey('0.0.0.0:0')).toBe('');
    expect(clientShareKey('[::ffff:0.0.0.0]:0')).toBe('');
    expect(clientShareKey('')).toBe('');
    expect(clientShareKey('[1:2:3]:4')).toBe('');
    expect(clientShareKey('[1::2::3]:4')).toBe('');
    expect(clientShareKey('[::ffff:1.2.3.999]:4')).toBe('');
  });
});

describe('a client address\'s share of a session\'s stream slots', () => {
  it('is 80 by default in the ingress (MAX_STREAMS_PER_CLIENT); an AgentServer without it has no share below the session cap', () => {
    expect(DEFAULT_MAX_STREAMS_PER_CLIENT).toBe(80);
    expect(loadIngressEnv({}).MAX_STREAMS_PER_CLIENT).toBe(80);
    expect(loadIngressEnv({ MAX_STREAMS_PER_CLIENT: '5' }).MAX_STREAMS_PER_CLIENT).toBe(5);
    expect(() => loadIngressEnv({ MAX_STREAMS_PER_CLIENT: '0' })).toThrow(/MAX_STREAMS_PER_CLIENT/);
    expect(() => loadIngressEnv({ MAX_STREAMS_PER_CLIENT: '501' })).toThrow(/MAX_STREAMS_PER_CLIENT/);
    expect(() => new AgentServer({ nodeId: 'n', tls: { cert: h.pki.certPem, key: h.pki.keyPem }, authenticate: () => null, maxStreamsPerClient: 0 })).toThrow(/maxStreamsPerClient/);
  });

  it('refuses one address past its share (CLIENT_STREAM_CAP) while another still gets streams; freed slots come back after finish and linger', async () => {
    const { server, port } = await startServer({ maxStreamsPerSession: 11, maxStreamsPerClient: 3 });
    const t = await agentTunnel(server, port);
    const a = [0, 1, 2].map((i) => t.openStreamSync(from(`203.0.113.7:${4000 + i}`)));
    const err = tryOpen(t, '203.0.113.7:5000');
    expect(err).toBeInstanceOf(TunnelStreamError);
    expect((err as TunnelStreamError).code).toBe('CLIENT_STREAM_CAP');
    expect((err as TunnelStreamError).message).toMatch(/too many requests open to this tunnel.*3 at most.*MAX_STREAMS_PER_CLIENT/);
    // Another address, and the session's other slots, are not held back.
    const b = [0, 1, 2].map(() => t.openStreamSync(from('198.51.100.1:1')));
    expect(t.connection.streamSlotsByClient).toEqual(new Map([['203.0.113.7', 3], ['198.51.100.1', 3]]));
    // The session's own cap still applies to everyone below their share.
    const c = [0, 1, 2, 3, 4].map((i) => t.openStreamSync(from(`192.0.2.${i + 1}:1`)));
    expect(codeOf(tryOpen(t, '192.0.2.99:1'))).toBe('STREAM_CAP');
    // A full session refuses everyone alike, an address at its share too.
    expect(codeOf(tryOpen(t, '203.0.113.7:1'))).toBe('STREAM_CAP');
    c.pop()!.destroy();
    await until(() => t.streamSlotsInUse === 10, 5_000);
    expect(codeOf(tryOpen(t, '203.0.113.7:1'))).toBe('CLIENT_STREAM_CAP');

    // A request that finishes normally: the slot is the address's until the session lets go of it.
    const res = await httpRequest({ stream: a[0]! }, { path: '/done', headers: { connection: 'close' } });
    expect(res.body.toString()).toBe('hello /done');
    await until(() => t.openStreams === 9);
    expect(t.connection.streamSlotsByClient.get('203.0.113.7')).toBe(3);
    expect(codeOf(tryOpen(t, '203.0.113.7:1'))).toBe('CLIENT_STREAM_CAP');
    await new Promise((r) => setTimeout(r, STREAM_LINGER_MS + 20));
    const again = await until(() => {
      const s = tryOpen(t, '203.0.113.7:6000');
      return s instanceof TunnelStreamError ? null : s;
    });
    expect(t.connection.streamSlotsByClient.get('203.0.113.7')).toBe(3);
    for (const s of [...a, ...b, ...c, again]) s.destroy();
    // All given back, never below zero: the map is empty again, and every address can open anew.
    await until(() => t.streamSlotsInUse === 0, 5_000);
    expect(t.connection.streamSlotsByClient.size).toBe(0);
    const fresh = [0, 1, 2].map(() => t.openStreamSync(from('203.0.113.7:1')));
    expect(t.connection.streamSlotsByClient).toEqual(new Map([['203.0.113.7', 3]]));
    for (const s of fresh) s.destroy();
    await until(() => t.streamSlotsInUse === 0, 5_000);
    expect(t.connection.streamSlotsByClient.size).toBe(0);
  });

  it("a finished stream counts for its address until the agent has echoed the heartbeats that free its slot", async () => {
    const { server, port } = await startServer({ maxStreamsPerSession: 5, maxStreamsPerClient: 1, heartbeatIntervalMs: 60_000, heartbeatToleranceMs: 60_000 });
    const { tunnel: t, agent } = await rawAgent(server, port, 'echo.share.test');
    agent.holdEchoes = true;
    const s = t.openStreamSync(from('203.0.113.7:1'));
    s.resume();
    s.write('GET / HTTP/1.1\r\n\r\n');
    await until(() => agent.proxies.length === 1);
    agent.proxies[0]!.st.end();
    s.end();
    await until(() => t.openStreams === 0);
    await until(() => agent.held.length > 0);
    await new Promise((r) => setTimeout(r, STREAM_LINGER_MS + 100));
    // Well past STREAM_LINGER_MS, no echo yet: the session's slot is taken, and so is the address's share.
    expect(t.streamSlotsInUse).toBe(1);
    expect(codeOf(tryOpen(t, '203.0.113.7:2'))).toBe('CLIENT_STREAM_CAP');
    expect(t.connection.streamSlotsByClient.get('203.0.113.7')).toBe(1);
    expect(codeOf(tryOpen(t, '198.51.100.1:1'))).toBe('opened');
    agent.releaseEchoes();
    const again = await until(() => {
      const x = tryOpen(t, '203.0.113.7:3');
      return x instanceof TunnelStreamError ? null : x;
    });
    again.destroy();
  });

  it('an aborted stream draining until the agent\'s FIN, and one reset after the liveness window, keep counting for their address until their slots are free', async () => {
    const { server, port } = await startServer({ maxStreamsPerSession: 5, maxStreamsPerClient: 1, heartbeatIntervalMs: 100, heartbeatToleranceMs: 400 });
    const { tunnel: t, agent } = await rawAgent(server, port, 'abort.share.test');
    const ip = '203.0.113.7';

    // 1. Abandoned by its client: we FIN and drain; the address's slot waits for the agent's FIN.
    const a = t.openStreamSync(from(`${ip}:1`));
    a.write('GET /slow HTTP/1.1\r\n\r\n');
    await until(() => agent.proxies.length === 1);
    a.destroy();
    await until(() => agent.proxies[0]!.ended);
    await new Promise((r) => setTimeout(r, 300));
    expect(t.openStreams).toBe(1);
    expect(codeOf(tryOpen(t, `${ip}:2`))).toBe('CLIENT_STREAM_CAP');
    expect(t.connection.streamSlotsByClient.get(ip)).toBe(1);
    // Others are served meanwhile.
    const other = tryOpen(t, '198.51.100.1:1');
    expect(codeOf(other)).toBe('opened');
    await until(() => agent.proxies.length === 2);
    agent.proxies[0]!.st.end('HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n');
    const b = await until(() => {
      const x = tryOpen(t, `${ip}:3`);
      return x instanceof TunnelStreamError ? null : x;
    });

    // 2. The agent never FINs: RST after the liveness window, and the slot (the address's too)
    // stays taken for another window.
    b.write('GET /slow HTTP/1.1\r\n\r\n');
    await until(() => agent.proxies.length === 3);
    const destroyedAt = performance.now();
    b.destroy();
    await until(() => agent.proxies[2]!.reset, 3_000);
    expect(performance.now() - destroyedAt).toBeGreaterThanOrEqual(450);
    expect(t.openStreams).toBe(1); // the other address's
    expect(codeOf(tryOpen(t, `${ip}:4`))).toBe('CLIENT_STREAM_CAP');
    expect(t.connection.streamSlotsByClient.get(ip)).toBe(1);
    const c = await until(() => {
      const x = tryOpen(t, `${ip}:5`);
      return x instanceof TunnelStreamError ? null : x;
    }, 3_000);
    // Free no sooner than the drain (the liveness window, armed by destroy()) plus the hold after
    // the RST (another window). Timed from before destroy(), so the clock starts before any timer
    // is armed (taken when this side noticed the RST, it started late by a poll or a stall of this
    // process, which made the hold look short). 2 ms: a timer may fire up to 1 ms early on this clock.
    const WINDOW_MS = 100 + 400;
    expect(performance.now() - destroyedAt).toBeGreaterThanOrEqual(WINDOW_MS + WINDOW_MS - 2);
    c.destroy();
    (other as TunnelStream).destroy();
    for (const p of agent.proxies) if (!p.ended) p.st.end();
    await until(() => t.streamSlotsInUse === 0, 3_000);
    expect(t.connection.streamSlotsByClient.size).toBe(0);
    expect(server.sessions()).toHaveLength(1);
  });

  it('groups IPv6 clients by /64 and counts IPv4-mapped IPv6 as IPv4; each session has its own shares', async () => {
    const { server, port } = await startServer({ maxStreamsPerSession: 20, maxStreamsPerClient: 2 });
    const t = await agentTunnel(server, port);
    const open: TunnelStream[] = [];
    open.push(t.openStreamSync(from('[2001:db8:0:1::1]:1')), t.openStreamSync(from('2001:db8:0:1:aaaa::2:2')));
    expect(codeOf(tryOpen(t, '[2001:db8:0:1:ffff:ffff:ffff:ffff]:3'))).toBe('CLIENT_STREAM_CAP');
    // The next /64 is another client.
    open.push(t.openStreamSync(from('[2001:db8:0:2::1]:1')));
    // One IPv4 client, however it is written.
    open.push(t.openStreamSync(from('[::ffff:198.51.100.9]:1')), t.openStreamSync(from('198.51.100.9:2')));
    expect(codeOf(tryOpen(t, '::ffff:198.51.100.9:3'))).toBe('CLIENT_STREAM_CAP');
    expect(codeOf(tryOpen(t, '[::ffff:c633:6409]:3'))).toBe('CLIENT_STREAM_CAP');
    expect(t.connection.streamSlotsByClient).toEqual(new Map([['2001:db8:0:1::/64', 2], ['2001:db8:0:2::/64', 1], ['198.51.100.9', 2]]));
    // The same client on another session (another tunnel's agent) has a share there too.
    const t2 = await agentTunnel(server, port);
    expect(t2.connection).not.toBe(t.connection);
    open.push(t2.openStreamSync(from('198.51.100.9:4')), t2.openStreamSync(from('198.51.100.9:5')));
    expect(codeOf(tryOpen(t2, '198.51.100.9:6'))).toBe('CLIENT_STREAM_CAP');
    // Streams for no client in particular (0.0.0.0, a pool reconnecting for a queued request) count against the session only.
    for (let i = 0; i < 3; i++) open.push(t.openStreamSync(from('0.0.0.0:0')));
    expect(t.streamSlotsInUse).toBe(8);
    for (const s of open) s.destroy();
    await until(() => t.streamSlotsInUse === 0 && t2.streamSlotsInUse === 0, 5_000);
    expect(t.connection.streamSlotsByClient.size).toBe(0);
    expect(t2.connection.streamSlotsByClient.size).toBe(0);
  });
});
