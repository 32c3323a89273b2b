import http from 'node:http';
import net from 'node:net';
import { describe, expect, it } from 'vitest';
import { createLogger } from '@warren/shared';
import { Forwarder } from '../http/proxy.js';
import { listen } from '../http/testing.js';
import { TunnelRegistry } from '../tunnels/registry.js';
import { agentServerHarness } from './testing.js';

/**
 * warren-agent's close() after serving traffic through the node's forwarder (in one process, real
 * TLS and muxado): the node closes the tunnel's idle kept-alive streams after the Unbind, so close()
 * says it is draining ('draining') only when something is really in progress.
 */

const TOKEN = 'wrn_agt_drain_token';
const h = agentServerHarness({ nodeId: 'node-drain', tokens: [{ token: TOKEN, identity: { credentialId: 'cr_1', accountId: 'ac_1', acl: [] } }] });
const log = createLogger('test', 'silent');

/** The node: an AgentServer whose tunnels a Forwarder serves from a front listener (Host names the tunnel's domain). */
async function node() {
  const { server, port } = await h.startServer();
  const registry = new TunnelRegistry('node-drain');
  const forwarder = new Forwarder({ registry, hopToken: '', log, upstreamTimeoutMs: 5_000, maxStreamsPerTunnel: 8, maxQueuedPerTunnel: 100 });
  server.on('tunnel', (t) => registry.addLocal(t));
  server.on('tunnelClosed', (id) => {
    registry.removeLocal(id);
    forwarder.release(id);
  });
  const front = http.createServer((req, res) => {
    const t = [...registry.localTunnels()].find((x) => x.publicUrl.endsWith(String(req.headers.host)));
    if (!t) return void res.writeHead(404).end();
    forwarder.forward(req, res, { kind: 'local', tunnel: t }, { scheme: 'https', clientAddr: '127.0.0.1:1', edgeType: '0' }, ['host', String(req.headers.host)], () => null).catch(() => res.destroy());
  });
  const frontPort = await listen(front);
  h.cleanups.push(() => {
    forwarder.close();
    front.closeAllConnections();
    front.close();
  });
  return { port, frontPort };
}

async function upstream() {
  const s = http.createServer((req, res) => {
    if (req.url === '/slow') setTimeout(() => res.end('slow done'), 600);
    else res.end('ok');
  });
  const port = await listen(s);
  h.cleanups.push(() => {
    s.closeAllConnections();
    s.close();
  });
  return `http://127.0.0.1:${port}`;
}

function get(port: number, host: string, path: string): Promise<string> {
  return new Promise((resolve, reject) => {
    http
      .get({ port, host: '127.0.0.1', path, headers: { host }, agent: false }, (res) => {
        let body = '';
        res.on('data', (c: Buffer) => (body += c.toString()));
        res.on('end', () => resolve(body));
      })
      .on('error', reject);
  });
}

describe('AgentClient.close() after traffic through the forwarder', () => {
  it('with only idle kept-alive streams left: closes without draining', async () => {
    const { port, frontPort } = await node();
    const up = await upstream();
    const client = h.startClient(port);
    await client.connect();
    await client.bind({ domain: 'idle.drain.test', forwardsTo: up });
    // Three at once: the pool keeps three idle streams afterwards.
    expect(await Promise.all([1, 2, 3].map(() => get(frontPort, 'idle.drain.test', '/')))).toEqual(['ok', 'ok', 'ok']);
    const draining: Array<[number, number]> = [];
    client.on('draining', (n, ms) => draining.push([n, ms]));
    const t0 = performance.now();
    await client.close();
    expect(draining).toEqual([]);
    expect(performance.now() - t0).toBeLessThan(2_000);
  });

  it('with a request in progress: drains, and the request finishes', async () => {
    const { port, frontPort } = await node();
    const up = await upstream();
    const client = h.startClient(port);
    await client.connect();
    await client.bind({ domain: 'busy.drain.test', forwardsTo: up });
    expect(await get(frontPort, 'busy.drain.test', '/')).toBe('ok');
    const draining: Array<[number, number]> = [];
    client.on('draining', (n, ms) => draining.push([n, ms]));
    const slow = get(frontPort, 'busy.drain.test', '/slow');
    await new Promise((r) => setTimeout(r, 100));
    await client.close();
    expect(await slow).toBe('slow done');
    // One request in progress, and what is left of the 10 s after the Unbinds and the quiet 250 ms.
    expect(draining).toHaveLength(1);
    expect(draining[0]![0]).toBe(1);
    expect(draining[0]![1]).toBeGreaterThan(5_000);
    expect(draining[0]![1]).toBeLessThanOrEqual(9_750);
  });

  it('keeps to drainMs in all when the server stalls: the Unbinds and the wait for its hang-up share the budget', async () => {
    const { port } = await node();
    // A relay in front of the node that can stop passing bytes: a stalled server (a frozen node,
    // a dead network path) answers no Unbind and never hangs up after GOAWAY (half-open: the
    // relay does not end its side when the agent ends its own).
    let frozen = false;
    const relay = net.createServer({ allowHalfOpen: true }, (a) => {
      const b = net.connect(port, '127.0.0.1');
      a.on('data', (d) => void (frozen || b.write(d)));
      b.on('data', (d) => void (frozen || a.write(d)));
      a.on('error', () => b.destroy());
      b.on('error', () => a.destroy());
      a.on('close', () => b.destroy());
      b.on('close', () => a.destroy());
      h.cleanups.push(() => (a.destroy(), b.destroy()));
    });
    const relayPort = await listen(relay);
    h.cleanups.push(() => relay.close());
    const up = await upstream();
    const client = h.startClient(relayPort, TOKEN, { drainMs: 1_000 });
    await client.connect();
    await client.bind({ domain: 'a.stall.test', forwardsTo: up });
    await client.bind({ domain: 'b.stall.test', forwardsTo: up });
    frozen = true;
    const t0 = performance.now();
    await client.close();
    const ms = performance.now() - t0;
    // Without the shared budget: 2 s for the Unbinds and 2 s for the hang-up (4 s). With it:
    // 1 s for the Unbinds, then 250 ms for the hang-up.
    expect(ms).toBeGreaterThanOrEqual(1_200);
    expect(ms).toBeLessThan(3_000);
  });
});
