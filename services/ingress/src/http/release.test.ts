import http from 'node:http';
import net from 'node:net';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { LocalTunnel, TunnelStream } from '../agents/server.js';
import { TunnelRegistry } from '../tunnels/registry.js';
import { tcpTunnel } from '../tunnels/testing.js';
import { Forwarder, forwardErrorOf } from './proxy.js';
import { listen } from './testing.js';

/**
 * Forwarder.release(): a tunnel that went away lets the requests it carries finish (bounded by
 * releaseDrainMs), and a request routed to it just before it went away goes to another tunnel
 * without a pool being made again for the dead one.
 */

/** What the forwarder logged (warn and above), one parsed line each. */
const logged: Array<Record<string, unknown>> = [];
const log = pino({ level: 'warn' }, { write: (line: string) => void logged.push(JSON.parse(line) as Record<string, unknown>) });
const RELEASE_DRAIN_MS = 800;
let upstream: http.Server;
let upPort: number;
let front: http.Server;
let frontPort: number;
let forwarder: Forwarder;
const registry = new TunnelRegistry('n1');
/** Bodies the upstream received, by path. */
const bodies = new Map<string, string[]>();
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
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString()));
    req.on('end', () => bodies.set(req.url ?? '', [...(bodies.get(req.url ?? '') ?? []), body]));
    if (req.url === '/hang') return; // never answers
    const m = /^\/slow\/(\d+)$/.exec(req.url ?? '');
    if (!m) return void req.on('end', () => res.end(`ok ${req.headers['x-via'] ?? ''}`));
    res.writeHead(200);
    res.write('first ');
    const t = setTimeout(() => res.end('last'), Number(m[1]));
    res.on('close', () => clearTimeout(t));
  });
  upPort = await listen(upstream);
  forwarder = new Forwarder({ registry, hopToken: 'secret', log, upstreamTimeoutMs: 5000, maxStreamsPerTunnel: 4, maxQueuedPerTunnel: 100, releaseDrainMs: RELEASE_DRAIN_MS });
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

function get(path: string, headers: Record<string, string>, post?: string): Promise<{ status: number; body: string; complete: boolean; code: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ port: frontPort, host: '127.0.0.1', path, agent: false, headers, method: post === undefined ? 'GET' : 'POST' }, (res) => {
      let body = '';
      const done = (complete: boolean) => resolve({ status: res.statusCode ?? 0, body, complete, code: String(res.headers['warren-error-code'] ?? '') });
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => done(true));
      res.on('aborted', () => done(false));
    });
    req.on('error', reject);
    // A POST's body is streamed (chunked, sent after a pause): nothing buffers it before the forwarder.
    if (post === undefined) req.end();
    else {
      req.flushHeaders();
      setTimeout(() => req.end(post), 50);
    }
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
    // Said in the log: which tunnel, how many requests were cut.
    expect(logged).toContainEqual(expect.objectContaining({ tunnel: 'tn_cut', requests: 1, drainMs: RELEASE_DRAIN_MS, msg: expect.stringMatching(/cut \(DRAIN_TIMEOUT_MS\)/) }));
  });

  it('a request routed to a tunnel that has gone away goes to the next one; no stream or pool for the dead one', async () => {
    countingTunnel('tn_gone', { closed: true });
    countingTunnel('tn_live');
    expect(await get('/', { 'x-tunnel': 'tn_gone', 'x-next': 'tn_live' })).toEqual({ status: 200, body: 'ok ', complete: true, code: '' });
    // A POST with a streamed body too: nothing of it was read.
    expect(await get('/post-gone', { 'x-tunnel': 'tn_gone', 'x-next': 'tn_live' }, 'streamed body')).toEqual({ status: 200, body: 'ok ', complete: true, code: '' });
    expect(bodies.get('/post-gone')).toEqual(['streamed body']);
    expect(opened.get('tn_gone')).toBeUndefined();
    expect((forwarder as unknown as { pools: Map<string, unknown> }).pools.has('tn_gone')).toBe(false);
    // With no other tunnel: 503 ERR_WARREN_7003 (as a request a moment later meets), nothing opened.
    expect(await get('/', { 'x-tunnel': 'tn_gone' })).toMatchObject({ status: 503, code: 'ERR_WARREN_7003' });
    expect(opened.get('tn_gone')).toBeUndefined();
  });

  it('a request routed to a tunnel its agent resumed meanwhile (same id, new session) goes to the resumed one', async () => {
    countingTunnel('tn_resumed', { closed: true });
    const resumed = tcpTunnel('tn_resumed', {}, () => upPort);
    registry.addLocal(resumed);
    try {
      expect(await get('/', { 'x-tunnel': 'tn_resumed' })).toEqual({ status: 200, body: 'ok ', complete: true, code: '' });
    } finally {
      registry.removeLocal('tn_resumed');
    }
  });

  it('a request still unanswered at the deadline is cut with its own error and not sent again unless safe to repeat', async () => {
    countingTunnel('tn_hang');
    countingTunnel('tn_after');
    const post = get('/hang', { 'x-tunnel': 'tn_hang', 'x-next': 'tn_after', 'content-length': '4' }, 'once');
    await new Promise((res) => setTimeout(res, 100));
    forwarder.release('tn_hang');
    const r = await post;
    expect(r).toMatchObject({ status: 502, code: 'ERR_WARREN_7004', complete: true });
    expect(r.body).toMatch(/still running 800 ms later \(DRAIN_TIMEOUT_MS\)/);
    // It reached the upstream once, and was not sent to the next tunnel.
    expect(bodies.get('/hang')).toEqual(['once']);
    expect(opened.get('tn_after')).toBeUndefined();
  });

  it('a pool destroyed under a request (drain deadline, node stopping) allows a retry only of a request safe to repeat; one closed before dispatch, of any', () => {
    const retryOf = (code: string) => forwardErrorOf(Object.assign(new Error('x'), { code }), false).retry;
    expect(retryOf('WARREN_TUNNEL_RELEASED')).toBe('idempotent');
    expect(retryOf('UND_ERR_DESTROYED')).toBe('idempotent');
    expect(retryOf('UND_ERR_CLOSED')).toBe('any');
  });
});
