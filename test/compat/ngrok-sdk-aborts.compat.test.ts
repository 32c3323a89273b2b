import net from 'node:net';
import { once } from 'node:events';
import ngrok from '@ngrok/ngrok';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { LocalTunnelImpl } from '../../services/ingress/src/agents/agent-connection.js';
import { AgentServer, type LocalTunnel, type ProxyHeaderInit, type TunnelStream } from '../../services/ingress/src/agents/server.js';
import { createTestPki, httpRequest, tokenAuthenticator, type TestPki } from '../../services/ingress/src/agents/testing.js';
import { until } from '../support/until.js';

/**
 * Public clients that give up on a slow upstream while the SDK's session (`@ngrok/ngrok` 1.7.0)
 * is at its stream cap. The SDK holds a stream until its upstream has answered, whatever we sent;
 * if we reset an abandoned stream and reuse its slot before that, one SYN past the SDK's 512
 * streams ends its session (it reconnects; we log "superseded by a reconnect"). Our side now
 * FINs an abandoned stream and waits for the agent's FIN (agent-connection.ts
 * ABORT_DRAIN_MAX_BYTES).
 */

const TOKEN = 'wrn_agt_sdk_aborts_token';
const ENDPOINT: ProxyHeaderInit = { clientAddr: '203.0.113.10:40001', proto: 'https', edgeType: '0' };
/** The upstream answers /slow this late (well inside the liveness window below, 1 s + 4 s). */
const SLOW_MS = 1_500;

let pki: TestPki;
let server: AgentServer;
let upstream: net.Server;
let session: ngrok.Session;
const closed: string[] = [];

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

beforeAll(async () => {
  // Raw upstream (keeps its side open after the agent's half-close, like a server still busy
  // with the request): /slow after SLOW_MS, anything else at once; one request per connection.
  upstream = net.createServer({ allowHalfOpen: true }, (s) => {
    let head = '';
    s.on('error', () => {});
    s.on('data', (c: Buffer) => {
      head += c.toString('latin1');
      if (!head.includes('\r\n\r\n')) return;
      const path = /^[A-Z]+ (\S+)/.exec(head)?.[1] ?? '/';
      head = '';
      const body = `hello ${path}`;
      const answer = () => {
        if (!s.destroyed) s.end(`HTTP/1.1 200 OK\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`);
      };
      if (path === '/slow') setTimeout(answer, SLOW_MS);
      else answer();
    });
  });
  upstream.listen(0, '127.0.0.1');
  await once(upstream, 'listening');
  pki = await createTestPki();
  server = new AgentServer({
    nodeId: 'node-compat-aborts',
    tls: { cert: pki.certPem, key: pki.keyPem },
    authenticate: tokenAuthenticator([{ token: TOKEN, identity: { credentialId: 'cr_sdk', accountId: 'ac_sdk', acl: [] } }]),
    publicUrl: (proto, host) => `${proto}://${host}:8443`,
    maxStreamsPerSession: 500,
    heartbeatIntervalMs: 1_000,
    heartbeatToleranceMs: 4_000,
  });
  server.on('sessionClosed', (_id, reason) => closed.push(reason));
  const port = await server.listen(0, '127.0.0.1');
  session = await new ngrok.SessionBuilder().serverAddr(`localhost:${port}`).caCert(Buffer.from(pki.caPem)).authtoken(TOKEN).connect();
});

afterAll(async () => {
  await session?.close().catch(() => {});
  await server?.close();
  upstream?.close();
});

describe('@ngrok/ngrok 1.7.0: clients abandoning requests at the stream cap', () => {
  it('600 clients each giving up on a slow upstream after 100 ms: the session survives, later requests succeed', async () => {
    const listener = await session.httpEndpoint().domain('aborts.test').listenAndForward(`http://127.0.0.1:${(upstream.address() as net.AddressInfo).port}`);
    const t: LocalTunnel = await until(() => server.getTunnel(listener.id()));
    const sessionId = server.sessions()[0]!.id;
    let abandoned = 0;
    let capped = 0;
    const errors: string[] = [];
    // Before the fix this lost the session within 2-4 s on an idle box.
    const end = Date.now() + 6_000;
    await Promise.all(
      Array.from({ length: 600 }, async () => {
        while (Date.now() < end && server.sessions()[0]?.id === sessionId) {
          let st: TunnelStream;
          try {
            st = t.openStreamSync!(ENDPOINT);
          } catch (err) {
            if ((err as { code?: string }).code !== 'STREAM_CAP') {
              errors.push((err as Error).message);
              return;
            }
            capped++;
            await sleep(5);
            continue;
          }
          st.on('error', () => {});
          st.write('GET /slow HTTP/1.1\r\nHost: aborts.test\r\nConnection: close\r\n\r\n');
          await sleep(100);
          st.destroy(); // the public client gave up (undici destroys its connection)
          abandoned++;
        }
      }),
    );
    // The session first: if the SDK dropped it, its reason is the useful part of the failure.
    expect(closed).toEqual([]);
    expect(errors.slice(0, 3)).toEqual([]);
    expect(server.sessions().map((s) => s.id)).toEqual([sessionId]);
    expect(abandoned).toBeGreaterThan(500);
    expect(capped).toBeGreaterThan(0);

    // Every abandoned stream is released once the agent finished it (its upstream answered).
    await until(() => (t as LocalTunnelImpl).streamSlotsInUse === 0, 15_000);
    const after = await Promise.all(
      Array.from({ length: 100 }, async (_, i) => {
        const res = await httpRequest({ stream: t.openStreamSync!(ENDPOINT) }, { path: `/after${i}`, host: 'aborts.test' });
        return res.body.toString() === `hello /after${i}`;
      }),
    );
    expect(after.every(Boolean)).toBe(true);
    expect(closed).toEqual([]);
    expect(server.sessions().map((s) => s.id)).toEqual([sessionId]);
    await listener.close();
  }, 40_000);
});
