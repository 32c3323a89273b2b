import { once } from 'node:events';
import http from 'node:http';
import net from 'node:net';
import tls from 'node:tls';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { MuxSession, readStreamType, rpcCall, StreamType, type DpAgentSession, type MuxStream } from '@warren/shared';
import { AgentClient, AgentRpcError, type ClientTunnel } from '../../../agent/src/client.js';
import { STREAM_LINGER_MS, type LocalTunnelImpl } from './agent-connection.js';
import { AgentServer, MAX_UNAUTHENTICATED_PER_IP, TunnelStreamError, type AgentServerOptions, type LocalTunnel, type TunnelStream } from './server.js';
import { createTestPki, httpRequest, sha256Hex, startUpstream, tokenAuthenticator, type TestPki, type Upstream } from './testing.js';
import { until } from '../../../../test/support/until.js';

const TOKEN = 'wrn_agt_test_token_1';
const OTHER_TOKEN = 'wrn_agt_test_token_2';
const identity = { credentialId: 'cr_1', accountId: 'ac_1', acl: [] as string[] };

let pki: TestPki;
const cleanups: Array<() => unknown> = [];

beforeAll(async () => {
  pki = await createTestPki();
});

afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!();
});

async function startServer(overrides: Partial<AgentServerOptions> = {}) {
  const server = new AgentServer({
    nodeId: 'node-test',
    tls: { cert: pki.certPem, key: pki.keyPem },
    authenticate: tokenAuthenticator([
      { token: TOKEN, identity },
      { token: OTHER_TOKEN, identity: { credentialId: 'cr_2', accountId: 'ac_2', acl: ['bind:*.allowed.test', 'bind:team=blue'] } },
    ]),
    ...overrides,
  });
  const port = await server.listen(0, '127.0.0.1');
  cleanups.push(() => server.close());
  const events: Array<[string, ...unknown[]]> = [];
  server.on('session', (s) => events.push(['session', s]));
  server.on('sessionClosed', (id, reason) => events.push(['sessionClosed', id, reason]));
  server.on('tunnel', (t) => events.push(['tunnel', t.id]));
  server.on('tunnelClosed', (id, reason) => events.push(['tunnelClosed', id, reason]));
  return { server, port, events };
}

async function startClient(port: number, overrides: Partial<ConstructorParameters<typeof AgentClient>[0]> = {}) {
  const client = new AgentClient({ serverAddr: `localhost:${port}`, authtoken: TOKEN, ca: pki.caPem, backoff: { initialMs: 20, maxMs: 200 }, ...overrides });
  cleanups.push(() => client.close());
  return client;
}

async function upstream(): Promise<Upstream> {
  const u = await startUpstream();
  cleanups.push(() => u.close());
  return u;
}

/** An http.Agent whose sockets are proxy streams of `tunnel` (callback form of createConnection). */
function tunnelAgent(tunnel: LocalTunnel, opened: { n: number }): http.Agent {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  (agent as unknown as { createConnection: unknown }).createConnection = (_o: unknown, cb: (err: Error | null, s?: TunnelStream) => void) => {
    opened.n++;
    tunnel.openStream({ clientAddr: '198.51.100.7:4321', proto: 'https', edgeType: '3' }).then(
      (s) => cb(null, s),
      (err: Error) => cb(err),
    );
    return undefined;
  };
  cleanups.push(() => agent.destroy());
  return agent;
}

describe('AgentServer with warren-agent', () => {
  it('authenticates, reports the session, serves a labeled tunnel through openStream', async () => {
    const { server, port, events } = await startServer();
    const up = await upstream();
    const client = await startClient(port, { metadata: '{"team":"blue"}' });
    const sessionId = await client.connect();
    expect(sessionId).toMatch(/^ts_[0-9A-Za-z]{27}$/);
    const session = (await until(() => events.find((e) => e[0] === 'session')))[1] as DpAgentSession;
    expect(session).toMatchObject({ id: sessionId, accountId: 'ac_1', credentialId: 'cr_1', agentVersion: '0.1.0', os: process.platform, ip: '127.0.0.1', metadata: '{"team":"blue"}' });
    expect(server.sessions()).toEqual([session]);

    const t = await client.startLabeledTunnel({ edge: 'edghts_test', k: 'v' }, up.url);
    expect(t.id).toMatch(/^tn_/);
    const local = server.getTunnel(t.id)!;
    expect(local).toMatchObject({ id: t.id, accountId: 'ac_1', sessionId, proto: 'labeled', labels: { edge: 'edghts_test', k: 'v' }, publicUrl: '', bindings: [], poolingEnabled: false, forwardsTo: up.url });
    expect(Object.keys({ ...local }).sort()).toEqual(['accountId', 'bindings', 'forwardsTo', 'id', 'labels', 'metadata', 'poolingEnabled', 'proto', 'publicUrl', 'sessionId', 'startedAt']);

    const stream = await local.openStream({ clientAddr: '203.0.113.9:5555', proto: 'https', edgeType: '3' });
    const res = await httpRequest({ stream }, { path: '/hello/world', host: 'app.test' });
    expect(res.status).toBe(200);
    expect(res.body.toString()).toBe('hello /hello/world');
    expect(res.headers['x-host']).toBe('app.test');
  });

  it('binds an endpoint (public URL, pooling, bindings) and carries 1 MB each way', async () => {
    const { server, port } = await startServer({ publicUrl: (proto, host) => `${proto}://${host}:8443` });
    const up = await upstream();
    const client = await startClient(port);
    await client.connect();
    const t = await client.bind({ domain: 'App.Test', forwardsTo: String(up.port), pooling: true });
    expect(t.url).toBe('https://app.test:8443');
    const local = server.getTunnel(t.id)!;
    expect(local).toMatchObject({ proto: 'https', publicUrl: 'https://app.test:8443', bindings: [], poolingEnabled: true, forwardsTo: `http://localhost:${up.port}` });

    const internal = await client.bind({ domain: 'svc.internal', forwardsTo: String(up.port), bindings: ['internal'], proto: 'http' });
    expect(server.getTunnel(internal.id)).toMatchObject({ proto: 'http', bindings: ['internal'], publicUrl: 'http://svc.internal:8443' });

    const random = await client.bind({ forwardsTo: String(up.port) });
    expect(random.url).toMatch(/^https:\/\/[0-9a-f]{12}\.warren\.localhost:8443$/);

    const body = Buffer.alloc(1024 * 1024, 7);
    const up1 = await httpRequest({ stream: await local.openStream({ clientAddr: '1.1.1.1:1', proto: 'https', edgeType: '0' }) }, { method: 'POST', path: '/sha', body });
    expect(JSON.parse(up1.body.toString())).toEqual({ sha256: sha256Hex(body), bytes: body.length });
    const down = await httpRequest({ stream: await local.openStream({ clientAddr: '1.1.1.1:1', proto: 'https', edgeType: '0' }) }, { path: '/bytes?n=1048576' });
    expect(down.body.length).toBe(1024 * 1024);
    expect(sha256Hex(down.body)).toBe(down.headers['x-sha256']);
  });

  it('reuses one stream for keep-alive requests through an http.Agent', async () => {
    const { server, port } = await startServer();
    const up = await upstream();
    const client = await startClient(port);
    await client.connect();
    const t = await client.startLabeledTunnel({ edge: 'edghts_ka' }, up.url);
    const opened = { n: 0 };
    const agent = tunnelAgent(server.getTunnel(t.id)!, opened);
    for (const path of ['/a', '/b', '/c', '/d']) {
      const res = await httpRequest({ agent }, { path });
      expect(res.body.toString()).toBe(`hello ${path}`);
    }
    expect(opened.n).toBe(1);
    expect(up.connections()).toBe(1);
    expect(server.getTunnel(t.id)!.openStreams).toBe(1);
  });

  it('refuses an unknown authtoken with our message and closes the connection', async () => {
    const { port, events } = await startServer();
    const client = await startClient(port, { authtoken: 'wrn_agt_nope' });
    const err = await client.connect().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AgentRpcError);
    expect((err as Error).message).toBe('authentication failed: the agent authtoken is unknown or revoked (ERR_WARREN_1004)');
    expect(events.filter((e) => e[0] === 'session')).toHaveLength(0);
  });

  it('answers HTTP 502 itself when the local service is down', async () => {
    const { server, port } = await startServer();
    const closed = await upstream();
    await closed.close();
    const client = await startClient(port);
    await client.connect();
    const forwardErrors: Error[] = [];
    client.on('forwardError', (_id, e) => forwardErrors.push(e));
    const t = await client.startLabeledTunnel({ edge: 'edghts_down' }, closed.url);
    const res = await httpRequest({ stream: await server.getTunnel(t.id)!.openStream({ clientAddr: '1.1.1.1:1', proto: 'https', edgeType: '3' }) });
    expect(res.status).toBe(502);
    expect(res.body.toString()).toMatch(/could not reach http:\/\/127\.0\.0\.1:\d+ \(ECONNREFUSED\)/);
    expect(forwardErrors).toHaveLength(1);
  });

  it('Unbind and close emit tunnelClosed then sessionClosed', async () => {
    const { server, port, events } = await startServer();
    const up = await upstream();
    const client = await startClient(port);
    const sessionId = await client.connect();
    const a = await client.startLabeledTunnel({ edge: 'edghts_a' }, up.url);
    const b = await client.bind({ domain: 'b.test', forwardsTo: up.url });
    await client.unbind(a.id);
    await until(() => events.find((e) => e[0] === 'tunnelClosed' && e[1] === a.id));
    expect(events.find((e) => e[0] === 'tunnelClosed' && e[1] === a.id)![2]).toBe('unbound by the agent');
    expect(server.getTunnel(a.id)).toBeUndefined();
    await client.close();
    await until(() => events.find((e) => e[0] === 'sessionClosed'));
    const tail = events.filter((e) => e[0] === 'tunnelClosed' || e[0] === 'sessionClosed').map((e) => [e[0], e[1]]);
    expect(tail).toEqual([
      ['tunnelClosed', a.id],
      ['tunnelClosed', b.id],
      ['sessionClosed', sessionId],
    ]);
    expect(server.tunnels()).toEqual([]);
    expect(server.sessions()).toEqual([]);
  });

  it('reconnects after the server drops the session; session and tunnel ids come back', async () => {
    const { server, port, events } = await startServer();
    const up = await upstream();
    const client = await startClient(port);
    const sessionId = await client.connect();
    const lab = await client.startLabeledTunnel({ edge: 'edghts_rc' }, up.url);
    const bnd = await client.bind({ domain: 'rc.test', forwardsTo: up.url });
    const online: ClientTunnel[] = [];
    client.on('tunnel', (t) => online.push(t));
    const disconnected = once(client, 'disconnected');

    expect(server.closeSessionsOfCredential('cr_1', 'credential rotated')).toBe(1);
    await disconnected;
    await until(() => online.length === 2);
    expect(online.map((t) => t.id).sort()).toEqual([lab.id, bnd.id].sort());
    expect(client.session).toBe(sessionId);
    expect(events.filter((e) => e[0] === 'sessionClosed')).toEqual([['sessionClosed', sessionId, 'credential rotated']]);
    expect(server.sessions().map((s) => s.id)).toEqual([sessionId]);
    const res = await httpRequest({ stream: await server.getTunnel(bnd.id)!.openStream({ clientAddr: '1.1.1.1:1', proto: 'https', edgeType: '0' }) }, { path: '/again' });
    expect(res.body.toString()).toBe('hello /again');
  });

  it('a resume refused for its rate (ERR_WARREN_8001) is tried again when the server says, not given up', async () => {
    // The credential's start bucket (2 tunnels) is empty after the first starts, and a reconnect brings no fresh one.
    const { server, port } = await startServer({ tunnelStartsPerSecond: 4, tunnelStartBurst: 2, maxTunnelsPerCredential: 2 });
    const up = await upstream();
    const client = await startClient(port);
    await client.connect();
    const one = await client.bind({ domain: 'rate-one.test', forwardsTo: up.url });
    const two = await client.bind({ domain: 'rate-two.test', forwardsTo: up.url });
    const online: string[] = [];
    const lost: string[] = [];
    client.on('tunnel', (t) => online.push(t.id));
    client.on('tunnelLost', (id, reason) => lost.push(`${id}: ${reason}`));
    const disconnected = once(client, 'disconnected');
    expect(server.closeSessionsOfCredential('cr_1', 'credential rotated')).toBe(1);
    await disconnected;
    await until(() => online.length === 2, 5_000);
    expect(online.sort()).toEqual([one.id, two.id].sort());
    expect(lost).toEqual([]);
    expect(client.tunnelCount).toBe(2);
    expect(server.getTunnel(two.id)).toBeDefined();
  });

  it('reconnects when the TCP connection is cut without GOAWAY', async () => {
    const { server, port } = await startServer();
    const up = await upstream();
    // A proxy in front of the server that we can cut.
    const sockets = new Set<net.Socket>();
    const proxy = net.createServer((inbound) => {
      const out = net.connect(port, '127.0.0.1');
      sockets.add(inbound).add(out);
      inbound.pipe(out).pipe(inbound);
      inbound.on('error', () => out.destroy());
      out.on('error', () => inbound.destroy());
    });
    proxy.listen(0, '127.0.0.1');
    await once(proxy, 'listening');
    cleanups.push(() => new Promise((r) => proxy.close(r)));
    const client = await startClient((proxy.address() as net.AddressInfo).port);
    await client.connect();
    const t = await client.startLabeledTunnel({ edge: 'edghts_cut' }, up.url);
    const back = new Promise<ClientTunnel>((resolve) => client.on('tunnel', resolve));
    for (const s of sockets) s.destroy();
    sockets.clear();
    expect((await back).id).toBe(t.id);
    await until(() => server.getTunnel(t.id)?.sessionId === client.session);
  });

  it('resumes ids on another server with the same TLS key; with another key, starts tunnels anew', async () => {
    const a = await startServer();
    const b = await startServer();
    const c = await startServer({ resumeKey: 'a completely different resume key' });
    const up = await upstream();
    // A switchable TCP proxy stands in for a load balancer in front of the nodes.
    let target = a.port;
    const sockets = new Set<net.Socket>();
    const proxy = net.createServer((inbound) => {
      const out = net.connect(target, '127.0.0.1');
      sockets.add(inbound).add(out);
      inbound.pipe(out).pipe(inbound);
      inbound.on('error', () => out.destroy());
      out.on('error', () => inbound.destroy());
    });
    proxy.listen(0, '127.0.0.1');
    await once(proxy, 'listening');
    cleanups.push(() => new Promise((r) => proxy.close(r)));
    const cut = () => {
      for (const s of sockets) s.destroy();
      sockets.clear();
    };
    const client = await startClient((proxy.address() as net.AddressInfo).port);
    const sessionId = await client.connect();
    const lab = await client.startLabeledTunnel({ edge: 'edghts_move' }, up.url);
    const bnd = await client.bind({ domain: 'move.test', forwardsTo: up.url });

    const online: ClientTunnel[] = [];
    client.on('tunnel', (t) => online.push(t));
    target = b.port;
    cut();
    await until(() => online.length === 2);
    expect(online.map((t) => t.id).sort()).toEqual([lab.id, bnd.id].sort());
    expect(b.server.sessions().map((s) => s.id)).toEqual([sessionId]);

    online.length = 0;
    target = c.port;
    cut();
    await until(() => online.length === 2);
    const fresh = online.map((t) => t.id);
    expect(fresh).not.toContain(lab.id);
    expect(fresh).not.toContain(bnd.id);
    expect(c.server.sessions()[0]!.id).not.toBe(sessionId);
    expect(client.list().map((t) => t.id).sort()).toEqual([...fresh].sort());
    const t = c.server.tunnels().find((x) => x.proto === 'https')!;
    expect(t.publicUrl).toBe('https://move.test');
  });

  it('closes a session whose agent stops answering heartbeats; a live agent stays', async () => {
    const { server, port, events } = await startServer({ heartbeatIntervalMs: 100, heartbeatToleranceMs: 150 });
    // A live agent echoes our heartbeats.
    const good = await startClient(port);
    const goodId = await good.connect();

    // A silent agent: authenticates, then never echoes nor beats.
    const sock = tls.connect({ host: '127.0.0.1', port, ca: pki.caPem });
    await once(sock, 'secureConnect');
    cleanups.push(() => sock.destroy());
    const mux = new MuxSession(sock, { client: true });
    mux.on('stream', (st: MuxStream) => st.resume());
    const reply = (await rpcCall(mux, StreamType.Auth, { Version: ['2'], ClientId: '', Extra: { AuthToken: TOKEN } })) as { ClientId: string };
    const closed = await until(() => events.find((e) => e[0] === 'sessionClosed' && e[1] === reply.ClientId), 3_000);
    expect(closed[2]).toBe('heartbeat timeout');
    await new Promise((r) => setTimeout(r, 400));
    expect(server.sessions().map((s) => s.id)).toEqual([goodId]);
  });

  it('caps proxy streams per session (STREAM_CAP) and frees slots as streams close', async () => {
    const { server, port } = await startServer({ maxStreamsPerSession: 5 });
    const up = await upstream();
    const client = await startClient(port);
    await client.connect();
    const t = server.getTunnel((await client.startLabeledTunnel({ edge: 'edghts_cap' }, up.url)).id)!;
    const h = { clientAddr: '1.1.1.1:1', proto: 'https', edgeType: '3' } as const;
    const streams = await Promise.all(Array.from({ length: 5 }, () => t.openStream(h)));
    expect(t.openStreams).toBe(5);
    const err = await t.openStream(h).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(TunnelStreamError);
    expect((err as TunnelStreamError).code).toBe('STREAM_CAP');
    streams[0]!.destroy();
    // Destroyed before the agent's FIN: we FIN and the stream stays open on the wire until the
    // agent's FIN (it gets one at once here: the idle upstream hangs up).
    await until(() => t.openStreams === 4);
    // The agent may still hold the finished stream for a moment: its slot lingers briefly
    // (STREAM_LINGER_MS at least, and until the agent has echoed our heartbeats, next test).
    await expect(t.openStream(h)).rejects.toMatchObject({ code: 'STREAM_CAP' });
    await new Promise((r) => setTimeout(r, STREAM_LINGER_MS + 20));
    const again = await until(() => {
      try {
        return t.openStreamSync!(h);
      } catch {
        return null;
      }
    });
    const res = await httpRequest({ stream: again }, { path: '/after-cap' });
    expect(res.body.toString()).toBe('hello /after-cap');
    for (const s of streams) s.destroy();
  });

  it("a finished stream's slot also waits for the agent to echo heartbeats sent after it finished", async () => {
    // The SDK lets go of a finished stream only when its own tasks get to it; on a busy host that
    // takes longer than any fixed linger, so the slot is reused only once the agent has answered.
    const { server, port } = await startServer({ maxStreamsPerSession: 1, heartbeatIntervalMs: 60_000, heartbeatToleranceMs: 60_000 });
    const sock = tls.connect({ host: '127.0.0.1', port, ca: pki.caPem });
    await once(sock, 'secureConnect');
    cleanups.push(() => sock.destroy());
    const mux = new MuxSession(sock, { client: true });
    // A hand-made agent whose echoes of our heartbeats wait while `hold` is set.
    let hold = true;
    const held: Buffer[] = [];
    const agent: { heartbeat?: MuxStream } = {};
    mux.on('stream', (st: MuxStream) => {
      readStreamType(st, 5_000).then(
        (type) => {
          if (type !== StreamType.Heartbeat) {
            st.resume();
            st.on('end', () => st.end());
            return;
          }
          agent.heartbeat = st;
          st.on('data', (b: Buffer) => (hold ? held.push(b) : st.write(b)));
        },
        () => st.destroy(),
      );
    });
    await rpcCall(mux, StreamType.Auth, { Version: ['2'], ClientId: '', Extra: { AuthToken: TOKEN } });
    const bind = (await rpcCall(mux, StreamType.Bind, { Id: '', Proto: 'https', Opts: { Domain: 'slot.test' }, Extra: {} })) as { Id: string };
    const t = server.getTunnel(bind.Id)!;
    const h = { clientAddr: '1.1.1.1:1', proto: 'https', edgeType: '0' } as const;
    (await t.openStream(h)).destroy();
    await until(() => agent.heartbeat && held.length > 0);
    // Well past STREAM_LINGER_MS, but the agent has not answered: the slot is still taken.
    await new Promise((r) => setTimeout(r, STREAM_LINGER_MS + 100));
    await expect(t.openStream(h)).rejects.toMatchObject({ code: 'STREAM_CAP' });
    hold = false;
    for (const b of held.splice(0)) agent.heartbeat!.write(b);
    const again = await until(() => {
      try {
        return t.openStreamSync!(h);
      } catch {
        return null;
      }
    });
    again.destroy();
  });

  it("a stream abandoned before the agent's FIN keeps its slot until that FIN; reset after the liveness window, it keeps it one more window", async () => {
    // The SDK holds a stream until its upstream has answered, even once we reset it, and nothing
    // on the wire says when: reusing the slot earlier can push it past 512 streams (session lost).
    const { server, port } = await startServer({ maxStreamsPerSession: 1, heartbeatIntervalMs: 100, heartbeatToleranceMs: 400 });
    const sock = tls.connect({ host: '127.0.0.1', port, ca: pki.caPem });
    await once(sock, 'secureConnect');
    cleanups.push(() => sock.destroy());
    const mux = new MuxSession(sock, { client: true });
    // A hand-made agent: echoes heartbeats at once, FINs a proxy stream only when told.
    const proxies: Array<{ st: MuxStream; ended: boolean; reset: boolean }> = [];
    mux.on('stream', (st: MuxStream) => {
      readStreamType(st, 5_000).then(
        (type) => {
          if (type !== StreamType.Heartbeat) {
            const p = { st, ended: false, reset: false };
            proxies.push(p);
            st.resume();
            st.on('end', () => (p.ended = true));
            st.on('error', (e: { code?: string }) => (p.reset = e.code === 'STREAM_RESET'));
            return;
          }
          st.on('data', (b: Buffer) => st.write(b));
        },
        () => st.destroy(),
      );
    });
    await rpcCall(mux, StreamType.Auth, { Version: ['2'], ClientId: '', Extra: { AuthToken: TOKEN } });
    const bind = (await rpcCall(mux, StreamType.Bind, { Id: '', Proto: 'https', Opts: { Domain: 'abandon.test' }, Extra: {} })) as { Id: string };
    const t = server.getTunnel(bind.Id)! as LocalTunnelImpl;
    const h = { clientAddr: '1.1.1.1:1', proto: 'https', edgeType: '0' } as const;
    const tryOpen = () => {
      try {
        return t.openStreamSync!(h);
      } catch {
        return null;
      }
    };

    // 1. Abandoned: our FIN reaches the agent, no RST; the slot waits for the agent's FIN, not
    // for heartbeat echoes (several go by meanwhile).
    const a = await t.openStream(h);
    a.write('GET / HTTP/1.1\r\n\r\n');
    await until(() => proxies.length === 1);
    a.destroy();
    await until(() => proxies[0]!.ended);
    await new Promise((r) => setTimeout(r, 300));
    expect(t.openStreams).toBe(1);
    expect(tryOpen()).toBeNull();
    expect(proxies[0]!.reset).toBe(false);
    proxies[0]!.st.end('HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n');
    const b = await until(tryOpen);
    expect(proxies[0]!.reset).toBe(false);

    // 2. The agent never FINs: RST after the liveness window (500 ms), and the slot stays taken
    // for another window after it.
    b.write('GET / HTTP/1.1\r\n\r\n');
    await until(() => proxies.length === 2);
    const destroyedAt = performance.now();
    b.destroy();
    await until(() => proxies[1]!.reset, 3_000);
    const resetAt = performance.now();
    expect(resetAt - destroyedAt).toBeGreaterThanOrEqual(450);
    expect(t.openStreams).toBe(0);
    expect(tryOpen()).toBeNull();
    (await until(tryOpen, 3_000)).destroy();
    // Free no sooner than the drain (the liveness window, armed by destroy()) plus the hold after
    // the RST (another window). Timed from before destroy(): the clock starts before any timer is
    // armed (resetAt is when this side noticed the RST, late by a poll or a stall of this process,
    // which made the hold look short). 2 ms: a timer may fire up to 1 ms early on this clock.
    const WINDOW_MS = 100 + 400;
    expect(performance.now() - destroyedAt).toBeGreaterThanOrEqual(WINDOW_MS + WINDOW_MS - 2);
    expect(server.sessions()).toHaveLength(1);
  });

  it('rejects openStream with SESSION_CLOSED once the tunnel or session is gone', async () => {
    const { server, port } = await startServer();
    const up = await upstream();
    const client = await startClient(port);
    await client.connect();
    const t = server.getTunnel((await client.startLabeledTunnel({ edge: 'edghts_gone' }, up.url)).id)!;
    await client.close();
    await until(() => server.sessions().length === 0);
    await expect(t.openStream({ clientAddr: '1.1.1.1:1', proto: 'http', edgeType: '3' })).rejects.toMatchObject({ code: 'SESSION_CLOSED' });
  });

  it('refuses Binds the server or checkBind does not allow, and enforces the ACL', async () => {
    const { port } = await startServer({
      checkBind: (req) => (req.hostname === 'taken.test' ? 'the hostname taken.test belongs to another account (ERR_WARREN_4101)' : null),
    });
    const up = await upstream();
    const client = await startClient(port);
    await client.connect();
    await expect(client.bind({ domain: 'taken.test', forwardsTo: up.url })).rejects.toThrow('the hostname taken.test belongs to another account (ERR_WARREN_4101)');
    await expect(client.bind({ domain: 'bad_host!', forwardsTo: up.url })).rejects.toThrow(/invalid domain/);
    await expect(client.bind({ domain: 'x.test', forwardsTo: up.url, bindings: ['kubernetes'] })).rejects.toThrow(/binding "kubernetes" is not supported/);

    const limited = await startClient(port, { authtoken: OTHER_TOKEN });
    await limited.connect();
    await expect(limited.bind({ domain: 'app.other.test', forwardsTo: up.url })).rejects.toThrow(/ACL does not allow binding app\.other\.test/);
    expect((await limited.bind({ domain: 'app.allowed.test', forwardsTo: up.url })).url).toBe('https://app.allowed.test');
    await expect(limited.startLabeledTunnel({ team: 'red' }, up.url)).rejects.toThrow(/ACL does not allow these labels/);
    expect((await limited.startLabeledTunnel({ team: 'blue' }, up.url)).id).toMatch(/^tn_/);
  });

  it('without checkBind, a live hostname is shared only by pooled tunnels of the same account', async () => {
    const { port } = await startServer();
    const up = await upstream();
    const a = await startClient(port);
    await a.connect();
    await a.bind({ domain: 'solo.test', forwardsTo: up.url });
    await expect(a.bind({ domain: 'solo.test', forwardsTo: up.url })).rejects.toThrow(/already online/);
    await a.bind({ domain: 'pool.test', forwardsTo: up.url, pooling: true });
    await a.bind({ domain: 'pool.test', forwardsTo: up.url, pooling: true });
  });

  it('garbage after the TLS handshake closes that connection only; odd Auth bodies are refused', async () => {
    const { server, port } = await startServer();
    const sock = tls.connect({ host: '127.0.0.1', port, ca: pki.caPem });
    await once(sock, 'secureConnect');
    const gone = once(sock, 'close');
    sock.write(Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n'));
    sock.on('error', () => {});
    sock.resume();
    await gone;
    const raw = tls.connect({ host: '127.0.0.1', port, ca: pki.caPem });
    await once(raw, 'secureConnect');
    cleanups.push(() => raw.destroy());
    const mux = new MuxSession(raw, { client: true });
    // Not a JSON object or array: the stream is reset without a reply.
    await expect(rpcCall(mux, StreamType.Auth, null)).rejects.toThrow();
    for (const body of [[], { Extra: 5 }, { Extra: { AuthToken: 42 } }]) {
      const r = (await rpcCall(mux, StreamType.Auth, body)) as { Error: string; Version: string; ClientId: string };
      expect(r.Error).toMatch(/malformed Auth|authentication failed/);
      expect(r).toMatchObject({ Version: '2', ClientId: '' });
      if (/authentication failed/.test(r.Error)) break; // the server hangs up after a failed Auth
    }
    expect(server.sessions()).toEqual([]);
    const ok = await startClient(port);
    expect(await ok.connect()).toMatch(/^ts_/);
  });

  it('answers only Auth and heartbeats before Auth, and survives malformed requests', async () => {
    const { port, events } = await startServer();
    const sock = tls.connect({ host: '127.0.0.1', port, ca: pki.caPem });
    await once(sock, 'secureConnect');
    cleanups.push(() => sock.destroy());
    const mux = new MuxSession(sock, { client: true });
    const bind = (await rpcCall(mux, StreamType.Bind, { Id: '', Proto: 'https', Opts: {}, Extra: {} })) as { Error: string; Id: string; Extra: unknown };
    expect(bind.Error).toMatch(/not authenticated/);
    expect(bind).toHaveProperty('Extra');
    // Garbage on a typed stream: the stream is reset, the session lives.
    const junk = mux.open();
    junk.write(Buffer.concat([Buffer.from([0, 0, 0, 0]), Buffer.from('not json at all')]));
    const reset = await new Promise<Error | undefined>((resolve) => {
      let e: Error | undefined;
      junk.on('error', (err: Error) => (e = err));
      junk.on('close', () => resolve(e));
    });
    expect(reset).toMatchObject({ code: 'STREAM_RESET' });
    const auth = (await rpcCall(mux, StreamType.Auth, { Version: ['2'], ClientId: '', Extra: { AuthToken: TOKEN } })) as { ClientId: string; Version: string; Extra: Record<string, unknown> };
    expect(auth.Version).toBe('2');
    expect(Object.keys(auth.Extra).sort()).toEqual(['AccountName', 'Banner', 'Cookie', 'PlanName', 'Region', 'SessionDuration', 'Version']);
    const unknown = (await rpcCall(mux, 42, {})) as { Error: string };
    expect(unknown.Error).toMatch(/request type 42 is not supported/);
    const modules = (await rpcCall(mux, StreamType.Bind, { Id: '', Proto: 'https', Opts: { Domain: 'm.test', OAuth: { Provider: 'google' }, BasicAuth: null, Compression: {} }, Extra: {} })) as { Error: string };
    expect(modules.Error).toBe('endpoint options Compression, OAuth are not supported by this server; remove them (ERR_WARREN_2104)');
    const tcp = (await rpcCall(mux, StreamType.Bind, { Id: '', Proto: 'tcp', Opts: {}, Extra: {} })) as { Error: string };
    expect(tcp.Error).toMatch(/tcp endpoints are not supported/);
    const forged = (await rpcCall(mux, StreamType.Bind, { Id: 'tn_2zXVu9fQh1Ko8ieS8rXodQexaaa', Proto: 'https', Opts: { Domain: 'f.test' }, Extra: { Token: 'nope' } })) as { Error: string };
    expect(forged.Error).toMatch(/cannot resume tunnel/);
    expect(events.filter((e) => e[0] === 'tunnel')).toHaveLength(0);
  });
});

describe('connections that have not authenticated yet', () => {
  it(`are capped per address (${MAX_UNAUTHENTICATED_PER_IP}): one more is closed at once, and a slot comes back when one leaves`, async () => {
    const { port } = await startServer();
    const open = async () => {
      const s = tls.connect({ host: '127.0.0.1', port, ca: pki.caPem, servername: 'localhost' });
      s.on('error', () => {});
      await once(s, 'secureConnect');
      cleanups.push(() => s.destroy());
      return s;
    };
    const idle: tls.TLSSocket[] = [];
    for (let i = 0; i < MAX_UNAUTHENTICATED_PER_IP; i++) idle.push(await open());
    const extra = await open();
    // Closed at once, not by the 15 s Auth deadline.
    const closed = await Promise.race([once(extra, 'close').then(() => true), new Promise((r) => setTimeout(() => r(false), 3_000))]);
    expect(closed).toBe(true);
    // The ones waiting to authenticate are still open.
    expect(idle.every((s) => !s.destroyed)).toBe(true);
    idle.pop()!.destroy();
    // Once the server has seen it go, a new agent gets in and authenticates.
    await new Promise((r) => setTimeout(r, 200));
    const client = await startClient(port);
    expect(await client.connect()).toMatch(/^ts_/);
  }, 30_000);
});
