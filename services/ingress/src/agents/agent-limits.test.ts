import { once } from 'node:events';
import ngrok from '@ngrok/ngrok';
import { describe, expect, it } from 'vitest';
import { MuxSession, rpcCall, StreamType, type MuxStream } from '@warren/shared';
import type { AgentClient, ClientTunnel } from '../../../agent/src/client.js';
import { TokenBucket, type LocalTunnelImpl } from './agent-connection.js';
import { FIELD_LIMITS } from './requests.js';
import { AgentServer, DEFAULT_MAX_SESSIONS_PER_CREDENTIAL, DEFAULT_MAX_TUNNELS_PER_ACCOUNT, DEFAULT_MAX_TUNNELS_PER_CREDENTIAL, DEFAULT_MAX_TUNNELS_PER_SESSION, DEFAULT_TUNNEL_STARTS_PER_SECOND } from './server.js';
import { agentServerHarness, startUpstream } from './testing.js';
import { until } from '../../../../test/support/until.js';

/**
 * Limits on what one authtoken and one agent session may do on a node, besides the tunnel caps
 * of tunnel-caps.test.ts:
 * - sessions and tunnels per credential (MAX_SESSIONS_PER_CREDENTIAL, MAX_TUNNELS_PER_CREDENTIAL):
 *   one authtoken could hold its account's whole allowance on the node;
 * - oversized metadata, forwards_to, OS and version are refused, no longer silently cut;
 * - tunnel starts per session are rate limited (TUNNEL_STARTS_PER_SECOND_PER_SESSION).
 */

const TOKEN = 'wrn_agt_limits_token_1';
/** Another credential of the same account. */
const SIBLING_TOKEN = 'wrn_agt_limits_token_3';
/** Another account's credential. */
const OTHER_TOKEN = 'wrn_agt_limits_token_2';
const h = agentServerHarness({
  nodeId: 'node-limits',
  tokens: [
    { token: TOKEN, identity: { credentialId: 'cr_1', accountId: 'ac_1', acl: [] } },
    { token: SIBLING_TOKEN, identity: { credentialId: 'cr_3', accountId: 'ac_1', acl: [] } },
    { token: OTHER_TOKEN, identity: { credentialId: 'cr_2', accountId: 'ac_2', acl: [] } },
  ],
});
const { cleanups, startServer, startClient } = h;

/** A bare muxado client (to send Auth as we please and watch the connection). */
async function rawSession(port: number): Promise<MuxSession> {
  const mux = new MuxSession(await h.tlsTo(port), { client: true });
  mux.on('stream', (st: MuxStream) => st.resume());
  return mux;
}

const LOCAL = 'http://127.0.0.1:9';

describe('per-credential caps', () => {
  it('refuses an Auth past MAX_SESSIONS_PER_CREDENTIAL and closes that connection; other credentials and a freed slot still work', async () => {
    const { server, port } = await startServer({ maxSessionsPerCredential: 2 });
    const a1 = startClient(port);
    await a1.connect();
    const a2 = startClient(port);
    await a2.connect();
    const over = startClient(port, TOKEN, { reconnect: false });
    await expect(over.connect()).rejects.toThrow(/this authtoken already has 2 agent sessions on this ingress node.*\(MAX_SESSIONS_PER_CREDENTIAL\).*ERR_WARREN_1110/);
    // A bare client sees the refusal and then the server closing the connection (cleanly: GOAWAY).
    const mux = await rawSession(port);
    const closed = once(mux, 'close');
    const reply = (await rpcCall(mux, StreamType.Auth, { Version: ['2'], ClientId: '', Extra: { AuthToken: TOKEN } })) as { Error: string; ClientId: string };
    expect(reply.Error).toMatch(/MAX_SESSIONS_PER_CREDENTIAL.*ERR_WARREN_1110/);
    expect(reply.ClientId).toBe('');
    const [info] = (await closed) as [{ by: string; code: number }];
    expect(info).toMatchObject({ by: 'remote', code: 0 });
    expect(server.sessions()).toHaveLength(2);
    // Another credential of the same account, and another account, have their own caps.
    await startClient(port, SIBLING_TOKEN).connect();
    await startClient(port, OTHER_TOKEN).connect();
    // A session that ends gives its place back.
    await a1.close();
    await until(() => server.sessions().filter((s) => s.credentialId === 'cr_1').length === 1);
    await startClient(port).connect();
    expect(server.sessions().filter((s) => s.credentialId === 'cr_1')).toHaveLength(2);
  });

  it('a session resuming its own live id is not refused by the credential cap it fills', async () => {
    const { server, port } = await startServer({ maxSessionsPerCredential: 2 });
    await startClient(port).connect();
    // A bare session whose cookie we keep, so that we can resume it while it is still live.
    const first = await rawSession(port);
    const auth = (await rpcCall(first, StreamType.Auth, { Version: ['2'], ClientId: '', Extra: { AuthToken: TOKEN } })) as { ClientId: string; Extra: { Cookie: string } };
    expect(auth.ClientId).toMatch(/^ts_/);
    expect(server.sessions()).toHaveLength(2);
    const firstClosed = once(first, 'close');
    const again = await rawSession(port);
    const resumed = (await rpcCall(again, StreamType.Auth, { Version: ['2'], ClientId: auth.ClientId, Extra: { AuthToken: TOKEN, Cookie: auth.Extra.Cookie } })) as { Error?: string; ClientId: string };
    expect(resumed.Error ?? '').toBe('');
    expect(resumed.ClientId).toBe(auth.ClientId);
    // The superseded connection is let go, and the count is right again: still no third session.
    await firstClosed;
    await until(() => server.sessions().length === 2);
    await expect(startClient(port, TOKEN, { reconnect: false }).connect()).rejects.toThrow(/MAX_SESSIONS_PER_CREDENTIAL/);
  });

  it('refuses StartTunnelWithLabel and Bind past MAX_TUNNELS_PER_CREDENTIAL across its sessions; the session carries on, the account\'s other credential is not held back', async () => {
    const { server, port } = await startServer({ maxTunnelsPerSession: 2, maxTunnelsPerCredential: 3, maxTunnelsPerAccount: 10 });
    const a1 = startClient(port);
    await a1.connect();
    const opened: ClientTunnel[] = [];
    for (let i = 0; i < 2; i++) opened.push(await a1.startLabeledTunnel({ app: `a${i}` }, LOCAL));
    const a2 = startClient(port);
    await a2.connect();
    await a2.startLabeledTunnel({ app: 'a2' }, LOCAL);
    await expect(a2.startLabeledTunnel({ app: 'a3' }, LOCAL)).rejects.toThrow(/this authtoken already has 3 tunnels on this ingress node.*\(MAX_TUNNELS_PER_CREDENTIAL\).*ERR_WARREN_1110/);
    await expect(a2.bind({ domain: 'over.test', forwardsTo: LOCAL })).rejects.toThrow(/MAX_TUNNELS_PER_CREDENTIAL.*ERR_WARREN_1110/);
    // The same account through another authtoken is not held back by this one.
    const sibling = startClient(port, SIBLING_TOKEN);
    await sibling.connect();
    await sibling.startLabeledTunnel({ app: 's0' }, LOCAL);
    await sibling.bind({ domain: 'sibling.test', forwardsTo: LOCAL });
    expect(server.tunnels()).toHaveLength(5);
    // The refused session carries on: a slot the credential frees is taken again.
    await a1.unbind(opened[0]!.id);
    await until(() => server.tunnels().length === 4);
    await a2.bind({ domain: 'again.test', forwardsTo: LOCAL });
    expect(server.tunnels().filter((t) => t.accountId === 'ac_1')).toHaveLength(5);
  });

  it('a tunnel resumed while its old one is still live (on another connection) is not refused by the credential cap it fills', async () => {
    const { server, port } = await startServer({ maxTunnelsPerCredential: 1 });
    const first = await rawSession(port);
    await rpcCall(first, StreamType.Auth, { Version: ['2'], ClientId: '', Extra: { AuthToken: TOKEN } });
    const started = (await rpcCall(first, StreamType.StartTunnelWithLabel, { Labels: { app: 'r' }, ForwardsTo: LOCAL, Metadata: '' })) as { Id: string; Token: string };
    expect(started.Id).toMatch(/^tn_/);
    const second = await rawSession(port);
    await rpcCall(second, StreamType.Auth, { Version: ['2'], ClientId: '', Extra: { AuthToken: TOKEN } });
    // A new tunnel is over the cap; the live one resumed under its id replaces it.
    const fresh = (await rpcCall(second, StreamType.StartTunnelWithLabel, { Labels: { app: 'n' }, ForwardsTo: LOCAL, Metadata: '' })) as { Error: string };
    expect(fresh.Error).toMatch(/MAX_TUNNELS_PER_CREDENTIAL/);
    const resumed = (await rpcCall(second, StreamType.StartTunnelWithLabel, { Labels: { app: 'r' }, ForwardsTo: LOCAL, Metadata: '', Id: started.Id, Token: started.Token })) as { Error?: string; Id: string };
    expect(resumed.Error ?? '').toBe('');
    expect(resumed.Id).toBe(started.Id);
    expect(server.tunnels().map((t) => t.id)).toEqual([started.Id]);
    // Counted once: after it goes, a new one fits.
    const gone = (await rpcCall(second, StreamType.Unbind, { Id: started.Id })) as Record<string, unknown>;
    expect(gone).toEqual({});
    const again = (await rpcCall(first, StreamType.StartTunnelWithLabel, { Labels: { app: 'n' }, ForwardsTo: LOCAL, Metadata: '' })) as { Error?: string };
    expect(again.Error ?? '').toBe('');
  });

  it('the account cap speaks first when the account is full (another authtoken would not help)', async () => {
    const { port } = await startServer({ maxTunnelsPerCredential: 2, maxTunnelsPerAccount: 2 });
    const a = startClient(port);
    await a.connect();
    for (let i = 0; i < 2; i++) await a.startLabeledTunnel({ app: `a${i}` }, LOCAL);
    await expect(a.startLabeledTunnel({ app: 'a2' }, LOCAL)).rejects.toThrow(/MAX_TUNNELS_PER_ACCOUNT/);
  });

  it('a reconnect that resumes its session and tunnels is not refused by the credential caps it fills', async () => {
    const { server, port } = await startServer({ maxSessionsPerCredential: 1, maxTunnelsPerCredential: 2 });
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
    expect(server.sessions()).toHaveLength(1);
  });

  it('defaults: 100 sessions and 500 tunnels per credential, under the account cap', () => {
    expect(DEFAULT_MAX_SESSIONS_PER_CREDENTIAL).toBe(100);
    expect(DEFAULT_MAX_TUNNELS_PER_CREDENTIAL).toBe(500);
    expect(DEFAULT_MAX_TUNNELS_PER_CREDENTIAL).toBeLessThan(DEFAULT_MAX_TUNNELS_PER_ACCOUNT);
  });
});

describe('oversized agent fields are refused, not cut', () => {
  const over = (n: number) => 'é'.repeat(Math.ceil((n + 1) / 2)); // n + 1 or n + 2 bytes

  it('session metadata over 4096 bytes: Auth is refused naming the field and the limit', async () => {
    const { server, port } = await startServer();
    const a = startClient(port, TOKEN, { metadata: over(FIELD_LIMITS.sessionMetadata), reconnect: false });
    await expect(a.connect()).rejects.toThrow(/session metadata \(Auth Extra\.Metadata\) is 4098 bytes, over the limit of 4096 bytes.*ERR_WARREN_5001/);
    expect(server.sessions()).toEqual([]);
    // At the limit it is kept whole.
    const exact = 'é'.repeat(FIELD_LIMITS.sessionMetadata / 2);
    const b = startClient(port, TOKEN, { metadata: exact });
    await b.connect();
    expect(server.sessions()[0]!.metadata).toBe(exact);
  });

  it('tunnel metadata and forwards_to over their limits: the tunnel is refused, the session carries on', async () => {
    const { server, port } = await startServer();
    const a = startClient(port);
    await a.connect();
    await expect(a.startLabeledTunnel({ app: 'm' }, LOCAL, { metadata: over(FIELD_LIMITS.tunnelMetadata) })).rejects.toThrow(/tunnel metadata \(StartTunnelWithLabel Metadata\) is 4098 bytes, over the limit of 4096 bytes.*ERR_WARREN_5001/);
    await expect(a.bind({ domain: 'm.test', forwardsTo: LOCAL, metadata: 'x'.repeat(5000) })).rejects.toThrow(/tunnel metadata \(Bind Extra\.Metadata\) is 5000 bytes, over the limit of 4096 bytes.*ERR_WARREN_5001/);
    // warren-agent sends its target's origin only, so ForwardsTo goes over a bare session.
    const raw = await rawSession(port);
    await rpcCall(raw, StreamType.Auth, { Version: ['2'], ClientId: '', Extra: { AuthToken: TOKEN } });
    const longUrl = `http://127.0.0.1:9/${'p'.repeat(FIELD_LIMITS.forwardsTo)}`;
    const label = (await rpcCall(raw, StreamType.StartTunnelWithLabel, { Labels: { app: 'f' }, ForwardsTo: longUrl, Metadata: '' })) as { Error: string; Id: string };
    expect(label).toMatchObject({ Id: '', Error: expect.stringMatching(/forwards_to \(StartTunnelWithLabel ForwardsTo\) is 1043 bytes, over the limit of 1024 bytes.*ERR_WARREN_5003/) });
    const bind = (await rpcCall(raw, StreamType.Bind, { Id: '', Proto: 'https', ForwardsTo: longUrl, Opts: { Domain: 'f.test' }, Extra: {} })) as { Error: string; Id: string };
    expect(bind).toMatchObject({ Id: '', Error: expect.stringMatching(/forwards_to \(Bind ForwardsTo\) is 1043 bytes, over the limit of 1024 bytes.*ERR_WARREN_5003/) });
    const exactUrl = `http://127.0.0.1:9/${'p'.repeat(FIELD_LIMITS.forwardsTo - 19)}`;
    const fits = (await rpcCall(raw, StreamType.StartTunnelWithLabel, { Labels: { app: 'f' }, ForwardsTo: exactUrl, Metadata: '' })) as { Error?: string; Id: string };
    expect(fits.Error ?? '').toBe('');
    expect(server.getTunnel(fits.Id)?.forwardsTo).toBe(exactUrl);
    raw.destroy('done');
    await until(() => server.tunnels().length === 0);
    expect(server.tunnels()).toEqual([]);
    // Metadata at the limit is kept whole; the refused session carries on.
    const metadata = 'm'.repeat(FIELD_LIMITS.tunnelMetadata);
    const t = await a.startLabeledTunnel({ app: 'ok' }, LOCAL, { metadata });
    expect(server.getTunnel(t.id)?.metadata).toBe(metadata);
  });

  it('the official SDK gets the refusal as an error, for session and tunnel metadata', async () => {
    const { server, port } = await startServer();
    const sdk = () => new ngrok.SessionBuilder().serverAddr(`localhost:${port}`).caCert(Buffer.from(h.pki.caPem)).authtoken(TOKEN);
    const err = await sdk()
      .metadata('s'.repeat(4097))
      .connect()
      .then(
        () => null,
        (e: Error) => e,
      );
    expect(err?.message).toMatch(/session metadata \(Auth Extra\.Metadata\) is 4097 bytes, over the limit of 4096 bytes.*ERR_WARREN_5001/);
    const session = await sdk().connect();
    cleanups.push(() => session.close().catch(() => {}));
    const terr = await session
      .labeledListener()
      .label('app', 'big')
      .metadata('t'.repeat(4097))
      .listen()
      .then(
        () => null,
        (e: Error) => e,
      );
    expect(terr?.message).toMatch(/tunnel metadata .* is 4097 bytes, over the limit of 4096 bytes.*ERR_WARREN_5001/);
    const l = await session.labeledListener().label('app', 'fine').metadata('t'.repeat(4096)).listen();
    cleanups.push(() => l.close().catch(() => {}));
    expect(server.getTunnel(l.id())?.metadata).toHaveLength(4096);
  });
});

describe('tunnel start rate per session', () => {
  it('TokenBucket: a burst at first, then the rate; never more than the burst', () => {
    let now = 0;
    const b = new TokenBucket(10, 3, () => now);
    for (let i = 0; i < 3; i++) {
      expect(b.available()).toBe(true);
      b.take();
    }
    expect(b.available()).toBe(false);
    expect(b.waitMs()).toBeCloseTo(100);
    now += 100;
    expect(b.available()).toBe(true);
    b.take();
    expect(b.available()).toBe(false);
    now += 3_600_000; // a long quiet spell refills to the burst, not beyond
    for (let i = 0; i < 3; i++) b.take();
    expect(b.available()).toBe(false);
  });

  it('refuses starts past the rate with ERR_WARREN_8001 (retry later); the session carries on and starts again once the bucket refills', async () => {
    const { server, port } = await startServer({ tunnelStartsPerSecond: 4, tunnelStartBurst: 3 });
    const a = startClient(port);
    await a.connect();
    // Start and stop in a loop: only the burst goes through at once.
    for (let i = 0; i < 3; i++) {
      const t = i % 2 ? await a.bind({ domain: `churn${i}.test`, forwardsTo: LOCAL }) : await a.startLabeledTunnel({ app: `c${i}` }, LOCAL);
      await a.unbind(t.id);
    }
    await expect(a.startLabeledTunnel({ app: 'c3' }, LOCAL)).rejects.toThrow(/this agent session starts tunnels faster than this server allows \(TUNNEL_STARTS_PER_SECOND_PER_SESSION: 4 a second, 3 at once\); retry in \d+ ms \(ERR_WARREN_8001\)/);
    await expect(a.bind({ domain: 'churn3.test', forwardsTo: LOCAL })).rejects.toThrow(/TUNNEL_STARTS_PER_SECOND_PER_SESSION.*ERR_WARREN_8001/);
    // Another session has its own bucket.
    const b = startClient(port);
    await b.connect();
    await b.startLabeledTunnel({ app: 'b0' }, LOCAL);
    // After a quarter of a second one more start goes through, on the same session.
    await new Promise((r) => setTimeout(r, 300));
    await a.startLabeledTunnel({ app: 'c4' }, LOCAL);
    expect(server.sessions()).toHaveLength(2);
    expect(server.tunnels()).toHaveLength(2);
  });

  it('a Bind carrying a traffic policy takes a start even when refused: an agent cannot make the node parse policies faster than it may start tunnels', async () => {
    // Parsing, costing and compiling a policy of up to 64 KiB blocks the event loop for tens of
    // milliseconds; refused Binds used to cost nothing, so failing ones could be sent in a loop.
    // Bad-policy Binds are sent until one is refused for the rate: at most the burst plus what
    // the bucket refilled meanwhile (1 a second) get parsed, whatever the timing; without the
    // start taken, none would ever be refused.
    const { port } = await startServer({ tunnelStartsPerSecond: 1, tunnelStartBurst: 3 });
    const a = startClient(port);
    await a.connect();
    const t0 = performance.now();
    let parsed = 0;
    for (; parsed < 20; parsed++) {
      const err = await a.bind({ domain: `tp${parsed}.test`, forwardsTo: LOCAL, trafficPolicy: 'on_http_request: [' }).then(() => '', (e: Error) => e.message);
      if (/ERR_WARREN_8001/.test(err)) {
        expect(err).toMatch(/TUNNEL_STARTS_PER_SECOND_PER_SESSION.*ERR_WARREN_8001/);
        break;
      }
      expect(err).toMatch(/invalid traffic policy .*ERR_WARREN_6900/);
    }
    expect(parsed).toBeGreaterThanOrEqual(3);
    expect(parsed).toBeLessThanOrEqual(3 + Math.floor((performance.now() - t0) / 1000));
    // A Bind without a policy refused for another reason still costs no start.
    const b = startClient(port);
    await b.connect();
    for (let i = 0; i < 5; i++) await expect(b.bind({ domain: 'bad_name!', forwardsTo: LOCAL })).rejects.toThrow(/invalid domain/);
    await b.bind({ domain: 'fine.test', forwardsTo: LOCAL });
  });

  it("and by size: a credential's sessions share a budget of policy bytes (32 KiB a second, 256 KiB at once)", async () => {
    // A valid 64 KB policy took 0.2-0.4 s to parse and compile on a loaded node (a crash audit):
    // starts alone would let one credential keep a node busy with large policies.
    const { port } = await startServer({ tunnelStartsPerSecond: 100, tunnelStartBurst: 100 });
    const big = `# ${'x'.repeat(60_000)}\non_http_request: [\n`;
    const a = startClient(port);
    await a.connect();
    for (let i = 0; i < 4; i++) await expect(a.bind({ domain: `big${i}.test`, forwardsTo: LOCAL, trafficPolicy: big })).rejects.toThrow(/invalid traffic policy .*ERR_WARREN_6900/);
    // Another session of the same credential brings no fresh budget: the next one or two are
    // refused (two if a slow machine refilled one in the meantime), never compiled.
    const b = startClient(port);
    await b.connect();
    const refusals: string[] = [];
    for (let i = 4; i < 8 && refusals.length === 0; i++) {
      const err = await b.bind({ domain: `big${i}.test`, forwardsTo: LOCAL, trafficPolicy: big }).then(() => '', (e: Error) => e.message);
      if (/ERR_WARREN_8001/.test(err)) refusals.push(err);
    }
    expect(refusals[0]).toMatch(/this authtoken's sessions send traffic policies faster than this server compiles them \(32 KiB a second, 256 KiB at once, across its sessions\); retry in \d+ ms \(ERR_WARREN_8001\)/);
    // Binds without a policy are not held back.
    await b.bind({ domain: 'plain.test', forwardsTo: LOCAL });
    // Another credential has its own budget.
    const c = startClient(port, OTHER_TOKEN);
    await c.connect();
    await expect(c.bind({ domain: 'other.test', forwardsTo: LOCAL, trafficPolicy: big })).rejects.toThrow(/ERR_WARREN_6900/);
  });

  it("a credential's sessions share one bucket: new sessions or reconnects bring no fresh burst; other credentials are not held back", async () => {
    // Per-session buckets alone let a credential churn without bound: each new session (up to
    // MAX_SESSIONS_PER_CREDENTIAL at once, and any number by reconnecting) started full. The
    // checks hold whatever the timing (the bucket refills while a loaded box connects a session):
    // the credential's starts never exceed its burst plus the rate times the time since it was
    // full, which a fresh burst of 3 per session breaks unless ~0.5 s passed.
    const RATE = 2;
    const { server, port } = await startServer({ tunnelStartsPerSecond: RATE, tunnelStartBurst: 3, maxTunnelsPerCredential: 5 });
    const refusal = /this authtoken's sessions start tunnels faster than this server allows \(2 a second, 5 at once, across its sessions and reconnects\); retry in \d+ ms \(ERR_WARREN_8001\)$/;
    /** Starts (and unbinds) tunnels one at a time until one is refused (or `max`); how many started. */
    const startWhileAdmitted = async (c: AgentClient, tag: string, max: number): Promise<number> => {
      for (let k = 0; k < max; k++) {
        try {
          await c.unbind((await c.startLabeledTunnel({ app: `${tag}${k}` }, LOCAL)).id);
        } catch (err) {
          expect((err as Error).message).toMatch(refusal);
          return k;
        }
      }
      return max;
    };
    const allowed = (since: number) => 5 + Math.floor((RATE * (performance.now() - since)) / 1000);
    const t0 = performance.now(); // the credential's bucket is full (5)
    const a = startClient(port);
    await a.connect();
    expect(await startWhileAdmitted(a, 'a', 3)).toBe(3); // a's own burst, 3 of the credential's 5
    await a.close();
    const b = startClient(port); // a new session of the same authtoken: its own bucket is full
    await b.connect();
    const kb = await startWhileAdmitted(b, 'b', 6);
    expect(kb).toBeGreaterThanOrEqual(2); // the credential's last 2, at least
    expect(3 + kb).toBeLessThanOrEqual(allowed(t0));
    const c = startClient(port);
    await c.connect();
    const kc = await startWhileAdmitted(c, 'c', 6);
    expect(3 + kb + kc).toBeLessThanOrEqual(allowed(t0));
    console.log(`credential bucket: a 3, b ${kb}, c ${kc} started in ${Math.round(performance.now() - t0)} ms (burst 5, ${RATE}/s)`);
    // Another credential of the same account has its own.
    const d = startClient(port, SIBLING_TOKEN);
    await d.connect();
    await d.startLabeledTunnel({ app: 'd0' }, LOCAL);
    // The shared bucket refills at the rate.
    await new Promise((r) => setTimeout(r, 1000 / RATE + 100));
    await c.startLabeledTunnel({ app: 'c9' }, LOCAL);
    expect(server.tunnels()).toHaveLength(2);
  });

  it('starts refused by a cap take no token from the bucket', async () => {
    const { port } = await startServer({ maxTunnelsPerSession: 1, tunnelStartsPerSecond: 1, tunnelStartBurst: 2 });
    const a = startClient(port);
    await a.connect();
    const t = await a.startLabeledTunnel({ app: 'x0' }, LOCAL);
    for (let i = 0; i < 5; i++) await expect(a.startLabeledTunnel({ app: `x${i + 1}` }, LOCAL)).rejects.toThrow(/MAX_TUNNELS_PER_SESSION/);
    await a.unbind(t.id);
    await a.startLabeledTunnel({ app: 'x9' }, LOCAL);
  });

  it('at the defaults, warren-agent reconnecting resumes 200 tunnels at once (the burst is the session cap, not a second of the rate)', async () => {
    const { server, port } = await startServer();
    const a = startClient(port);
    await a.connect();
    const n = 200;
    // 16 at a time: a session has at most 32 RPC streams open at once.
    for (let i = 0; i < n; i += 16) await Promise.all(Array.from({ length: Math.min(16, n - i) }, (_, k) => a.startLabeledTunnel({ app: `r${i + k}` }, LOCAL)));
    const online: string[] = [];
    const lost: string[] = [];
    a.on('tunnel', (t) => online.push(t.id));
    a.on('tunnelLost', (id, why) => lost.push(`${id}: ${why}`));
    server.closeSessionsOfCredential('cr_1', 'test: drop the session');
    await until(() => online.length + lost.length === n, 15_000);
    expect(lost).toEqual([]);
    expect(server.tunnels()).toHaveLength(n);
  }, 30_000);

  it('at the defaults, the official SDK reconnecting with many tunnels resumes them all', async () => {
    expect(DEFAULT_TUNNEL_STARTS_PER_SECOND).toBe(20);
    const { server, port } = await startServer();
    const up = await startUpstream();
    cleanups.push(() => up.close());
    const session = await new ngrok.SessionBuilder().serverAddr(`localhost:${port}`).caCert(Buffer.from(h.pki.caPem)).authtoken(TOKEN).connect();
    cleanups.push(() => session.close().catch(() => {}));
    // More than a second's worth at the default rate, opened as fast as the SDK can.
    const n = 3 * DEFAULT_TUNNEL_STARTS_PER_SECOND;
    const listeners = await Promise.all(Array.from({ length: n }, (_, i) => session.labeledListener().label('app', `sdk${i}`).listenAndForward(up.url)));
    expect(server.tunnels()).toHaveLength(n);
    const sessionId = server.sessions()[0]!.id;
    const conns = () => new Set((server.tunnels() as LocalTunnelImpl[]).map((t) => t.connection));
    const [before] = [...conns()];
    // The session drops; the SDK reconnects at once and starts all of them again on the new connection.
    server.closeSessionsOfCredential('cr_1', 'test: drop the session');
    await until(() => server.sessions()[0]?.id === sessionId && server.tunnels().length === n && !conns().has(before!), 15_000);
    await new Promise((r) => setTimeout(r, 300));
    expect(server.tunnels()).toHaveLength(n);
    expect(conns().size).toBe(1);
    expect(listeners).toHaveLength(n);
    expect(DEFAULT_MAX_TUNNELS_PER_SESSION).toBeGreaterThanOrEqual(n);
  }, 30_000);
});
