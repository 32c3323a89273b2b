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

describe('a hop waiting for a free connection to its node', () => {
  it('gets 503 7006 past the wait (every connection busy, each account within its share), and is never sent once given up', async () => {
    const seen: string[] = [];
    const held: http.ServerResponse[] = [];
    const node = http.createServer((req, res) => {
      seen.push(req.headers[HOP.tunnel] as string);
      if (req.headers[HOP.tunnel] !== 'tn_late') {
        res.writeHead(200);
        res.write('x');
        held.push(res);
        return;
      }
      res.end('late ok');
    });
    const nodeAddr = `127.0.0.1:${await listen(node)}`;
    // 8 connections to the node, 2 per account: four accounts fill them within their shares.
    const fwd = new Forwarder({ registry: new TunnelRegistry('n1'), hopToken: 'secret', log, upstreamTimeoutMs: 5000, maxStreamsPerTunnel: 4, maxQueuedPerTunnel: 100, hopConnections: 8, hopQueueWaitMs: 300 });
    const srv = http.createServer((req, res) => {
      const id = req.url!.slice(1);
      fwd.forward(req, res, { kind: 'remote', tunnel: tunnel(id, `ac_${id}`, nodeAddr) }, { scheme: 'http', clientAddr: '127.0.0.1:1', edgeType: '3' }, ['host', 'x.test'], () => null).catch((err: { code?: number; message?: string }) => {
        sendError(req, res, (err.code ?? 7004) as 7004, err.message);
      });
    });
    const port = await listen(srv);
    const call = (path: string) =>
      new Promise<{ status: number; code: string | undefined; body: string; req: http.ClientRequest }>((resolve, reject) => {
        const req = http.get({ port, host: '127.0.0.1', path, agent: false }, (res) => {
          let body = '';
          res.setEncoding('utf8');
          res.once('data', (c: string) => {
            body += c;
            if (res.statusCode === 200) resolve({ status: 200, code: undefined, body, req });
          });
          res.on('end', () => resolve({ status: res.statusCode ?? 0, code: res.headers['warren-error-code'] as string | undefined, body, req }));
        });
        req.on('error', reject);
      });
    try {
      const busy = await Promise.all(['a1', 'a1', 'a2', 'a2', 'a3', 'a3', 'a4', 'a4'].map((id) => call(`/${id}`)));
      expect(busy.map((r) => r.status)).toEqual(Array(8).fill(200));
      const t0 = performance.now();
      const late = await call('/tn_late');
      const waited = performance.now() - t0;
      expect([late.status, late.code]).toEqual([503, 'ERR_WARREN_7006']);
      expect(late.body).toContain('no connection to the ingress node holding the tunnel was free within 0.3 s');
      expect(waited).toBeGreaterThanOrEqual(250);
      expect(waited).toBeLessThan(3000);
      // A connection comes free: the request given up is not sent on it; the next one is.
      busy[0]!.req.destroy();
      held[0]!.destroy();
      await expect.poll(async () => (await call('/tn_late')).body, { timeout: 5000 }).toBe('late ok');
      expect(seen.filter((t) => t === 'tn_late')).toEqual(['tn_late']);
    } finally {
      for (const r of held) r.destroy();
      fwd.close();
      srv.closeAllConnections();
      srv.close();
      node.closeAllConnections();
      node.close();
    }
  }, 30_000);
});
