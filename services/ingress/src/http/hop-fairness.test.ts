import http from 'node:http';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { DpTunnel } from '@warren/shared';
import { TunnelRegistry } from '../tunnels/registry.js';
import { Forwarder, HOP, HOP_PER_ACCOUNT } from './proxy.js';
import { sendError } from './error-page.js';
import { listen } from './testing.js';

/**
 * Hops are fair between accounts: one account's requests to another node hold at most
 * HOP_PER_ACCOUNT of the connections to it, so its never-ending answers cannot leave the other
 * accounts' hops waiting (audit finding: 525 endless responses held all 512 connections).
 */

const log = pino({ level: 'silent' });
let holding: http.Server;
let front: http.Server;
let frontPort: number;
let forwarder: Forwarder;
const hung: http.ServerResponse[] = [];

const tunnel = (id: string, accountId: string, nodeAddress: string): DpTunnel => ({ id, accountId, sessionId: 's', proto: 'http', labels: {}, publicUrl: 'https://x.test', bindings: [], poolingEnabled: false, forwardsTo: '', metadata: '', startedAt: '2026-01-01T00:00:00Z', nodeId: 'n2', nodeAddress });

beforeAll(async () => {
  // The "holding node": account a's tunnel answers a head and never ends the body; b's answers at once.
  holding = http.createServer((req, res) => {
    if (req.headers[HOP.tunnel] === 'tn_a') {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.write('x');
      hung.push(res);
      return;
    }
    res.end('b ok');
  });
  const holdingAddr = `127.0.0.1:${await listen(holding)}`;
  forwarder = new Forwarder({ registry: new TunnelRegistry('n1'), hopToken: 'secret', log, upstreamTimeoutMs: 5000, maxStreamsPerTunnel: 4, maxQueuedPerTunnel: 100 });
  front = http.createServer((req, res) => {
    const t = tunnel(req.url === '/a' ? 'tn_a' : 'tn_b', req.url === '/a' ? 'ac_a' : 'ac_b', holdingAddr);
    forwarder.forward(req, res, { kind: 'remote', tunnel: t }, { scheme: 'http', clientAddr: '127.0.0.1:1', edgeType: '3' }, ['host', 'x.test'], () => null).catch((err: { code?: number; message?: string }) => {
      sendError(req, res, (err.code ?? 7004) as 7004, err.message);
    });
  });
  frontPort = await listen(front);
}, 30_000);

afterAll(() => {
  for (const r of hung) r.destroy();
  forwarder?.close();
  front?.closeAllConnections();
  front?.close();
  holding?.closeAllConnections();
  holding?.close();
});

function get(path: string): Promise<{ status: number; code: string | undefined; req: http.ClientRequest }> {
  return new Promise((resolve, reject) => {
    const req = http.get({ port: frontPort, host: '127.0.0.1', path, agent: false }, (res) => {
      resolve({ status: res.statusCode ?? 0, code: res.headers['warren-error-code'] as string | undefined, req });
      res.resume();
    });
    req.on('error', reject);
  });
}

describe('hops between nodes', () => {
  it("refuse an account's request past its share of the connections (503 7006), and other accounts' still go", async () => {
    const first = await Promise.all(Array.from({ length: HOP_PER_ACCOUNT }, () => get('/a')));
    expect(first.every((r) => r.status === 200)).toBe(true);
    const over = await get('/a');
    expect([over.status, over.code]).toEqual([503, 'ERR_WARREN_7006']);
    const other = await get('/b');
    expect(other.status).toBe(200);
    // A share is given back when a request ends.
    first[0]!.req.destroy();
    hung[0]!.destroy();
    await expect.poll(async () => (await get('/a')).status, { timeout: 5000 }).toBe(200);
  }, 60_000);
});
