import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { waitFor } from '../support/cluster.js';
import { startPolicyCluster, type PolicyCluster } from '../support/policy-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * An Upgrade whose client goes away (a reset) while the upstream has not answered yet: the
 * upstream's connection is closed too. It used to stay open for good, holding its agent stream
 * and the client address's share of the session's slots (MAX_STREAMS_PER_CLIENT), so that the
 * same address was refused 429 ERR_WARREN_7014 once it had done that a few times. Through real
 * processes: a control plane, an ingress, our agent and an upstream that switches protocols
 * 500 ms after the request.
 */

const HOST = 'upgrade-gone.e2e.test';
let c: PolicyCluster;
const upstreamSockets: Array<{ path: string; closed: boolean }> = [];

beforeAll(async () => {
  c = await startPolicyCluster({
    name: 'upgone',
    host: HOST,
    ingressEnv: () => ({ MAX_STREAMS_PER_CLIENT: '10' }),
    upgrade: (req, socket) => {
      const rec = { path: req.url ?? '', closed: false };
      upstreamSockets.push(rec);
      socket.on('close', () => (rec.closed = true));
      socket.on('error', () => {});
      setTimeout(() => {
        if (socket.destroyed) return;
        socket.write('HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n');
        socket.pipe(socket as net.Socket);
      }, 500);
    },
  });
  await c.route('/plain', {});
  await c.policyRoute('/pipe', { inbound: [{ actions: [{ type: 'add-headers', config: { headers: { 'x-a': '1' } } }] }] });
}, CLUSTER_HOOK_MS);

afterAll(() => c?.stop(), 60_000);

const upgradeRequest = (path: string) => `GET ${path} HTTP/1.1\r\nHost: ${HOST}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n`;

/** Sends an Upgrade and resets the connection after `ms`; resolves with what came back before. */
function resetAfter(path: string, ms: number, from = '127.0.0.1'): Promise<string> {
  return new Promise((resolve) => {
    let got = '';
    const s = net.connect({ port: c.a.http, host: '127.0.0.1', localAddress: from }, () => s.write(upgradeRequest(path)));
    s.on('data', (d: Buffer) => (got += d.toString('latin1')));
    s.on('error', () => {});
    s.on('close', () => resolve(got));
    setTimeout(() => s.resetAndDestroy(), ms);
  });
}

describe('an Upgrade whose client resets before the upstream switched protocols', () => {
  it('closes the upstream connection too, on a plain route and on one with a pipeline; the address is not refused later', async () => {
    // Each route's clients from an address of their own (each address has 10 slots).
    for (const [route, from] of [['/plain', '127.0.0.2'], ['/pipe', '127.0.0.3']] as const) {
      const gone = await Promise.all(Array.from({ length: 8 }, (_, i) => resetAfter(`${route}/gone-${i}`, 100, from)));
      expect(gone.filter((g) => g !== ''), route).toEqual([]);
      await waitFor(`the upstream connections of the clients gone on ${route} closed`, () => {
        const mine = upstreamSockets.filter((s) => s.path.startsWith(`${route}/gone-`));
        return mine.length === 8 && mine.every((s) => s.closed);
      }, 5_000);
    }
    // Their slots are given back (once the agent has let go of the streams): 8 more Upgrades from
    // the same address get their 101 (with the 8 leaked, 2 would, and 6 get 429 ERR_WARREN_7014).
    await waitFor('the slots of the clients gone given back', async () => {
      const again = await Promise.all(Array.from({ length: 8 }, (_, i) => resetAfter(`/plain/again-${i}`, 1000, '127.0.0.2')));
      return again.every((a) => a.startsWith('HTTP/1.1 101 '));
    }, 30_000);
  });
});
