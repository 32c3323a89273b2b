import http from 'node:http';
import ngrok from '@ngrok/ngrok';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { DpAgentSession } from '@warren/shared';
import type { LocalTunnelImpl } from '../../services/ingress/src/agents/agent-connection.js';
import { AgentServer, type LocalTunnel, type ProxyHeaderInit, type TunnelStream } from '../../services/ingress/src/agents/server.js';
import { createTestPki, httpRequest, sha256Hex, startUpstream, tokenAuthenticator, type TestPki, type Upstream } from '../../services/ingress/src/agents/testing.js';
import { until } from '../support/until.js';

/**
 * The official agent SDK (`@ngrok/ngrok` 1.7.0, unmodified) against Warren's AgentServer,
 * following agent-protocol.md §6: a CA + leaf for localhost, the SDK pointed at our listener
 * with `serverAddr` + `caCert`, a labeled and an endpoint tunnel forwarded to a local upstream,
 * traffic through server-opened proxy streams.
 */

const TOKEN = 'wrn_agt_sdk_compat_token';
const HTTPS: ProxyHeaderInit = { clientAddr: '203.0.113.10:40000', proto: 'https', edgeType: '3' };
const ENDPOINT: ProxyHeaderInit = { clientAddr: '203.0.113.10:40001', proto: 'https', edgeType: '0' };

let pki: TestPki;
let server: AgentServer;
let port: number;
let up: Upstream;
let session: ngrok.Session;
const events: Array<[string, ...unknown[]]> = [];

/**
 * The endpoint tunnel `id` once its session is up: exactly one session, the tunnel registered.
 * Tests that share the session start from here, so one that broke it (the SDK reconnects and
 * resumes both ids) does not fail the ones after it.
 */
function liveTunnel(id: string): Promise<LocalTunnel> {
  return until(() => server.sessions().length === 1 && server.getTunnel(id), 15_000);
}

function sdkSession(token = TOKEN): ngrok.SessionBuilder {
  return new ngrok.SessionBuilder().serverAddr(`localhost:${port}`).caCert(Buffer.from(pki.caPem)).authtoken(token);
}

beforeAll(async () => {
  pki = await createTestPki();
  server = new AgentServer({
    nodeId: 'node-compat',
    tls: { cert: pki.certPem, key: pki.keyPem },
    authenticate: tokenAuthenticator([{ token: TOKEN, identity: { credentialId: 'cr_sdk', accountId: 'ac_sdk', acl: [] } }]),
    publicUrl: (proto, host) => `${proto}://${host}:8443`,
    maxStreamsPerSession: 500,
    // Our own heartbeats every 500 ms (the SDK echoes them), so a silent SDK is noticed fast.
    heartbeatIntervalMs: 500,
    heartbeatToleranceMs: 2_000,
  });
  server.on('session', (s) => events.push(['session', s]));
  server.on('sessionClosed', (id, reason) => events.push(['sessionClosed', id, reason]));
  server.on('tunnel', (t) => events.push(['tunnel', t.id]));
  server.on('tunnelClosed', (id, reason) => events.push(['tunnelClosed', id, reason]));
  port = await server.listen(0, '127.0.0.1');
  up = await startUpstream();
  session = await sdkSession().metadata('compat-run').connect();
});

afterAll(async () => {
  await session?.close().catch(() => {});
  await server?.close();
  await up?.close();
});

describe('@ngrok/ngrok 1.7.0 against AgentServer', () => {
  it('connects: Auth is accepted and the session is reported', async () => {
    const s = (await until(() => events.find((e) => e[0] === 'session')))[1] as DpAgentSession;
    expect(s).toMatchObject({ accountId: 'ac_sdk', credentialId: 'cr_sdk', agentVersion: '1.7.0', os: 'linux', ip: '127.0.0.1', metadata: 'compat-run' });
    expect(s.id).toMatch(/^ts_/);
  });

  it('labeled tunnel: StartTunnelWithLabel, then HTTP through a proxy stream (EdgeType 3)', async () => {
    const listener = await session.labeledListener().label('edge', 'edghts_test').listenAndForward(up.url);
    const t = server.getTunnel(listener.id())!;
    expect(t).toMatchObject({ proto: 'labeled', labels: { edge: 'edghts_test' }, publicUrl: '' });
    const res = await httpRequest({ stream: await t.openStream(HTTPS) }, { path: '/labeled', host: 'app.test' });
    expect(res.status).toBe(200);
    expect(res.body.toString()).toBe('hello /labeled');
    await listener.close();
    await until(() => events.find((e) => e[0] === 'tunnelClosed' && e[1] === t.id));
  });

  describe('endpoint tunnel', () => {
    let listener: ngrok.Listener;
    let t: LocalTunnel;

    beforeAll(async () => {
      listener = await session.httpEndpoint().domain('app.test').listenAndForward(up.url);
      t = server.getTunnel(listener.id())!;
    });

    it('Bind: url() is our public URL and the tunnel is registered', () => {
      expect(listener.url()).toBe('https://app.test:8443');
      expect(t).toMatchObject({ proto: 'https', publicUrl: 'https://app.test:8443', bindings: [], poolingEnabled: false });
    });

    it('carries requests and responses, 1 MB each way, and a streamed response', async () => {
      const small = await httpRequest({ stream: await t.openStream(ENDPOINT) }, { path: '/x', host: 'app.test' });
      expect(small.body.toString()).toBe('hello /x');
      const body = Buffer.alloc(1024 * 1024);
      for (let i = 0; i < body.length; i++) body[i] = i & 0xff;
      const upload = await httpRequest({ stream: await t.openStream(ENDPOINT) }, { method: 'POST', path: '/sha', body });
      expect(JSON.parse(upload.body.toString())).toEqual({ sha256: sha256Hex(body), bytes: body.length });
      const download = await httpRequest({ stream: await t.openStream(ENDPOINT) }, { path: '/bytes?n=1048576' });
      expect(download.body.length).toBe(1024 * 1024);
      expect(sha256Hex(download.body)).toBe(download.headers['x-sha256']);
      const streamed = await httpRequest({ stream: await t.openStream(ENDPOINT) }, { path: '/stream?chunks=5' });
      expect(streamed.body.toString()).toBe('chunk 0\nchunk 1\nchunk 2\nchunk 3\nchunk 4\n');
    });

    it('600 parallel requests with a cap of 500 streams: excess refused with STREAM_CAP, the session lives on', async () => {
      t = await liveTunnel(listener.id());
      const results = await Promise.all(
        Array.from({ length: 600 }, async (_, i) => {
          let stream: TunnelStream;
          try {
            stream = await t.openStream(ENDPOINT);
          } catch (err) {
            return (err as { code?: string }).code ?? 'error';
          }
          const res = await httpRequest({ stream }, { path: `/p${i}` });
          return res.body.toString() === `hello /p${i}` ? 'ok' : 'bad';
        }),
      );
      const ok = results.filter((r) => r === 'ok').length;
      const capped = results.filter((r) => r === 'STREAM_CAP').length;
      expect(ok + capped).toBe(600);
      expect(capped).toBeGreaterThanOrEqual(100);
      expect(ok).toBeGreaterThan(450); // streams of the previous test may still hold a slot briefly

      // Queued by an http.Agent (maxSockets under the cap): every request gets through. The
      // stream is returned synchronously: Node enforces maxSockets only for sockets that exist.
      // Once the finished streams' slots are free again (STREAM_LINGER_MS at least, and until
      // the SDK has echoed our heartbeats sent after they finished).
      await until(() => (t as LocalTunnelImpl).streamSlotsInUse === 0, 10_000);
      const agent = new http.Agent({ keepAlive: true, maxSockets: 200 });
      (agent as unknown as { createConnection: unknown }).createConnection = () => t.openStreamSync!(ENDPOINT);
      const viaAgent = await Promise.all(Array.from({ length: 600 }, (_, i) => httpRequest({ agent }, { path: `/q${i}` }).then((r) => r.body.toString() === `hello /q${i}`)));
      agent.destroy();
      expect(viaAgent.every(Boolean)).toBe(true);

      // Still alive and serving.
      const after = await httpRequest({ stream: await t.openStream(ENDPOINT) }, { path: '/after' });
      expect(after.body.toString()).toBe('hello /after');
      expect(server.sessions()).toHaveLength(1);
      await until(() => t.openStreams === 0);
    });

    it('churn at the cap: 3,000 short-lived streams from 600 concurrent clients never push the SDK past 512 streams', async () => {
      t = await liveTunnel(listener.id());
      const sessionId = server.sessions()[0]!.id;
      const closedBefore = events.filter((e) => e[0] === 'sessionClosed').length;
      let ok = 0;
      let capped = 0;
      const errors: string[] = [];
      // A safety net, not a speed target: 5 s on an idle box, 25-40 s with two test runs, two
      // busy loops and a tsc loop sharing its two cores.
      const deadline = Date.now() + 100_000;
      const client = async (n: number) => {
        for (let i = 0; i < n && Date.now() < deadline; ) {
          let stream: TunnelStream;
          try {
            stream = t.openStreamSync!(ENDPOINT);
          } catch (err) {
            // Refusals are the point here (hundreds of thousands of them): no expect() per refusal.
            if ((err as { code?: string }).code !== 'STREAM_CAP') {
              errors.push(`open: ${(err as Error).message}`);
              return;
            }
            capped++;
            await new Promise((r) => setTimeout(r, 5));
            continue;
          }
          i++;
          try {
            const res = await httpRequest({ stream }, { path: '/churn' });
            if (res.body.toString() === 'hello /churn') ok++;
          } catch (err) {
            errors.push(`request: ${(err as Error).message}`);
            return;
          }
        }
      };
      await Promise.all(Array.from({ length: 600 }, () => client(5)));
      // The session first: if the SDK dropped it, its reason is the useful part of the failure.
      expect(events.filter((e) => e[0] === 'sessionClosed').slice(closedBefore)).toEqual([]);
      expect({ errors: errors.length, first: errors.slice(0, 3) }).toEqual({ errors: 0, first: [] });
      expect(server.sessions().map((s) => s.id)).toEqual([sessionId]);
      expect(ok).toBe(3_000);
      expect(capped).toBeGreaterThan(0);
    }, 120_000);

    it('after the server drops the session, the SDK reconnects and resumes the endpoint under the same id', async () => {
      t = await liveTunnel(listener.id());
      const sessionId = server.sessions()[0]!.id;
      expect(server.closeSessionsOfCredential('cr_sdk', 'test: drop the session')).toBe(1);
      await until(() => server.getTunnel(t.id) && server.sessions()[0]?.id === sessionId, 10_000);
      const resumed = server.getTunnel(t.id)!;
      const res = await httpRequest({ stream: await resumed.openStream(ENDPOINT) }, { path: '/resumed' });
      expect(res.body.toString()).toBe('hello /resumed');
      t = resumed;
    });

    it('listener.close() sends Unbind: tunnelClosed', async () => {
      t = await liveTunnel(listener.id());
      await listener.close();
      const closed = await until(() => events.find((e) => e[0] === 'tunnelClosed' && e[1] === t.id && e[2] === 'unbound by the agent'));
      expect(closed).toBeTruthy();
      expect(server.getTunnel(t.id)).toBeUndefined();
    });
  });

  it('an unknown authtoken is rejected with our message', async () => {
    const err = await sdkSession('wrn_agt_unknown').connect().then(
      () => null,
      (e: unknown) => e as Error,
    );
    expect(err).toBeInstanceOf(Error);
    expect(err!.message).toContain('authentication failed: the agent authtoken is unknown or revoked (ERR_WARREN_1004)');
  });

  // The SDK's session.close() sends no GOAWAY that arrives (its encoder refuses its own GOAWAY,
  // whose length leaves out the 8 fixed bytes, §2) and keeps the TCP connection open, but it
  // stops answering heartbeats: the server closes the session after interval + tolerance.
  it('session.close() ends the session (sessionClosed after missed heartbeats)', async () => {
    const id = (await until(() => server.sessions().length === 1 && server.sessions()[0])).id;
    const before = events.filter((e) => e[0] === 'sessionClosed' && e[1] === id).length;
    await session.close();
    const closed = await until(() => events.filter((e) => e[0] === 'sessionClosed' && e[1] === id)[before]);
    expect(closed[2]).toBe('heartbeat timeout');
    expect(server.sessions()).toEqual([]);
  });
});
