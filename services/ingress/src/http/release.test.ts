import http from 'node:http';
import net from 'node:net';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { LocalTunnel, TunnelStream } from '../agents/server.js';
import { TunnelRegistry } from '../tunnels/registry.js';
import { tcpTunnel } from '../tunnels/testing.js';
import { Forwarder } from './proxy.js';
import { listen } from './testing.js';

/**
 * Forwarder.release(): a tunnel that went away lets the requests it carries finish (bounded by
 * releaseDrainMs), and a request routed to it just before it went away goes to another tunnel
 * without a pool being made again for the dead one.
 */

const log = pino({ level: 'silent' });
const RELEASE_DRAIN_MS = 800;
let upstream: http.Server;
let upPort: number;
let front: http.Server;
let frontPort: number;
let forwarder: Forwarder;
/** Streams opened per tunnel id. */
const opened = new Map<string, number>();
const tunnels = new Map<string, LocalTunnel>();

function countingTunnel(id: string, extra: Partial<LocalTunnel> = {}): LocalTunnel {
  const t = tcpTunnel(id, {}, () => upPort, {
    openStreamSync: () => {
      opened.set(id, (opened.get(id) ?? 0) + 1);
      return net.connect(upPort, '127.0.0.1') as unknown as TunnelStream;
    },
    ...extra,
  });
  tunnels.set(id, t);
  return t;
}

beforeAll(async () => {
  // `/slow/<ms>`: the head and `first ` at once, `last` after <ms>; else `ok`.
  upstream = http.createServer((req, res) => {
    const m = /^\/slow\/(\d+)$/.exec(req.url ?? '');
    if (!m) return void res.end('ok');
    res.writeHead(200);
    res.write('first ');
    const t = setTimeout(() => res.end('last'), Number(m[1]));
    res.on('close', () => clearTimeout(t));
  });
  upPort = await listen(upstream);
  forwarder = new Forwarder({ registry: new TunnelRegistry('n1'), hopToken: 'secret', log, upstreamTimeoutMs: 5000, maxStreamsPerTunnel: 4, maxQueuedPerTunnel: 100, releaseDrainMs: RELEASE_DRAIN_MS });
  // The tunnel is named by the `x-tunnel` header; `x-next` names the one to try next.
  front = http.createServer((req, res) => {
    const first = tunnels.get(String(req.headers['x-tunnel']))!;
    const next = tunnels.get(String(req.headers['x-next'] ?? ''));
    forwarder
      .forward(req, res, { kind: 'local', tunnel: first }, { scheme: 'http', clientAddr: '127.0.0.1:1', edgeType: '3' }, ['host', 'x.test'], (tried) => (next && !tried.has(next.id) ? { kind: 'local', tunnel: next } : null))
      .catch(() => res.destroy());
  });
  frontPort = await listen(front);
});

afterAll(() => {
  forwarder?.close();
  front?.closeAllConnections();
  front?.close();
  upstream?.closeAllConnections();
  upstream?.close();
});

function get(path: string, headers: Record<string, string>): Promise<{ status: number; body: string; complete: boolean; code: string }> {
  return new Promise((resolve, reject) => {
    const req = http.get({ port: frontPort, host: '127.0.0.1', path, agent: false, headers }, (res) => {
      let body = '';
      const done = (complete: boolean) => resolve({ status: res.statusCode ?? 0, body, complete, code: String(res.headers['warren-error-code'] ?? '') });
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => done(true));
      res.on('aborted', () => done(false));
    });
    req.on('error', reject);
  });
}

describe('Forwarder.release', () => {
  it('lets a request in progress finish', async () => {
    countingTunnel('tn_drain');
    const r = get('/slow/300', { 'x-tunnel': 'tn_drain' });
    await new Promise((res) => setTimeout(res, 100));
    forwarder.release('tn_drain');
    expect(await r).toEqual({ status: 200, body: 'first last', complete: true, code: '' });
  });

  it('cuts what still runs releaseDrainMs after', async () => {
    countingTunnel('tn_cut');
    const r = get('/slow/10000', { 'x-tunnel': 'tn_cut' });
    await new Promise((res) => setTimeout(res, 100));
    const t0 = performance.now();
    forwarder.release('tn_cut');
    expect(await r).toMatchObject({ status: 200, body: 'first ', complete: false });
    expect(performance.now() - t0).toBeGreaterThan(RELEASE_DRAIN_MS - 100);
    expect(performance.now() - t0).toBeLessThan(RELEASE_DRAIN_MS + 2_000);
  });

  it('a request routed to a tunnel that has gone away goes to the next one; no stream or pool for the dead one', async () => {
    countingTunnel('tn_gone', { closed: true });
    countingTunnel('tn_live');
    expect(await get('/', { 'x-tunnel': 'tn_gone', 'x-next': 'tn_live' })).toEqual({ status: 200, body: 'ok', complete: true, code: '' });
    expect(opened.get('tn_gone')).toBeUndefined();
    expect((forwarder as unknown as { pools: Map<string, unknown> }).pools.has('tn_gone')).toBe(false);
    // With no other tunnel: 502 ERR_WARREN_7004, nothing opened.
    expect(await get('/', { 'x-tunnel': 'tn_gone' })).toMatchObject({ status: 502, code: 'ERR_WARREN_7004' });
    expect(opened.get('tn_gone')).toBeUndefined();
  });
});
