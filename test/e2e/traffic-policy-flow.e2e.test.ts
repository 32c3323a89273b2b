import http from 'node:http';
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { echoUrlAndHeaders, startPolicyCluster, type PolicyCluster } from '../support/policy-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * The traffic-policy flow actions `circuit-breaker` and `close-connection` on live traffic,
 * through real processes: a control plane, an ingress, our agent and an upstream that answers
 * `/…/status/<code>` with that status (counting what reaches it) and echoes anything else. Every
 * policy is saved through the REST API.
 */

const HOST = 'flow.e2e.test';
let c: PolicyCluster;
/** Requests that reached the upstream, by path. */
const hits = new Map<string, number>();
const hitsOf = (p: string) => hits.get(p) ?? 0;

const upstream: http.RequestListener = (req, res) => {
  if (req.url?.endsWith('/slow')) {
    // Answers after 3 s (its clients go away before that).
    req.resume();
    const timer = setTimeout(() => res.end('slow\n'), 3_000);
    res.on('close', () => clearTimeout(timer));
    return;
  }
  const m = /\/status\/(\d{3})$/.exec(req.url ?? '');
  if (!m) return echoUrlAndHeaders(req, res);
  req.resume();
  hits.set(req.url!, hitsOf(req.url!) + 1);
  res.writeHead(Number(m[1]), { 'content-type': 'text/plain' });
  res.end('from upstream\n');
};

const status = async (p: string) => (await c.request(p)).status;

/** Sends `raw` on a new connection to the node's HTTP port: everything it got back before the ingress closed it. */
function rawExchange(raw: string, timeoutMs = 5_000): Promise<{ received: string; error: string | null }> {
  return new Promise((resolve, reject) => {
    const sock = net.connect(c.a.http, '127.0.0.1', () => sock.write(raw));
    const chunks: Buffer[] = [];
    let error: string | null = null;
    sock.on('data', (ch: Buffer) => chunks.push(ch));
    sock.on('error', (err: NodeJS.ErrnoException) => (error = err.code ?? err.message));
    sock.on('close', () => {
      clearTimeout(timer);
      resolve({ received: Buffer.concat(chunks).toString('latin1'), error });
    });
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new Error(`the ingress kept the connection open; got ${JSON.stringify(Buffer.concat(chunks).toString('latin1').slice(0, 200))}`));
    }, timeoutMs);
  });
}

beforeAll(async () => {
  c = await startPolicyCluster({ name: 'flow', host: HOST, upstream });
}, CLUSTER_HOOK_MS);

afterAll(() => c?.stop(), 60_000);

describe('circuit-breaker on live traffic', () => {
  it('trips after upstream 5xx over the threshold (503 without reaching the upstream), then half-opens and recovers', async () => {
    // Only /cb/api counts: the route's own probes (GET /cb/probe-…) stay out of the window.
    await c.policyRoute('/cb', `
inbound:
  - expressions: ["req.url.path.startsWith('/cb/api')"]
    actions:
      - type: circuit-breaker
        config:
          error_threshold: 0.5
          volume_threshold: 4
          window_duration: 30s
          tripped_duration: 2s
`);
    expect(await status('/cb/api/status/200')).toBe(200);
    expect(await status('/cb/api/status/500')).toBe(500);
    expect(await status('/cb/api/status/404')).toBe(404); // not an error
    expect(await status('/cb/api/status/503')).toBe(503); // 4 results, 2 errors: trips
    const before = hitsOf('/cb/api/status/200');
    const open = await c.request('/cb/api/status/200');
    expect(open.status).toBe(503);
    expect(open.headers['warren-error-code']).toBe('ERR_WARREN_7103');
    expect(open.headers['retry-after']).toBe('2');
    expect(open.json()).toMatchObject({ error_code: 'ERR_WARREN_7103', status_code: 503 });
    expect(await status('/cb/api/status/200')).toBe(503);
    expect(hitsOf('/cb/api/status/200')).toBe(before); // the upstream saw none of them
    // Requests the rule does not match still go through.
    expect(await status('/cb/other')).toBe(200);

    // After tripped_duration one probe goes through; it fails: tripped again.
    await new Promise((r) => setTimeout(r, 2_100));
    expect(await status('/cb/api/status/502')).toBe(502);
    expect(await status('/cb/api/status/200')).toBe(503);
    expect(hitsOf('/cb/api/status/200')).toBe(before);

    // The next probe succeeds: closed again, with a fresh window.
    await new Promise((r) => setTimeout(r, 2_100));
    expect(await status('/cb/api/status/200')).toBe(200);
    for (let i = 0; i < 3; i++) expect(await status('/cb/api/status/500')).toBe(500); // below the volume threshold
    expect(await status('/cb/api/status/200')).toBe(200);
    expect(hitsOf('/cb/api/status/200')).toBe(before + 2);
  });

  it('a half-open probe whose client goes away, or that is an Upgrade, frees its place: the next request probes', async () => {
    // Not under /cb: the route's readiness probe (/pcb/probe-…) must not be answered by another route.
    await c.policyRoute('/pcb', {
      inbound: [{ expressions: ["req.url.path.startsWith('/pcb/api')"], actions: [{ type: 'circuit-breaker', config: { volume_threshold: 2, window_duration: '30s', tripped_duration: '1s' } }] }],
    });
    const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
    const trip = async () => {
      // Upstream errors until it trips (two results at least, half of them errors).
      for (let i = 0; i < 3 && (await status('/pcb/api/status/500')) === 500; i++);
      expect(await status('/pcb/api/status/200')).toBe(503);
      await sleep(1_100); // half-open
    };
    /** Sends `head` on a new connection and goes away after `ms`, whatever came back. */
    const goneAfter = (head: string, ms: number) =>
      new Promise<void>((resolve) => {
        const sock = net.connect(c.a.http, '127.0.0.1', () => sock.write(head));
        sock.on('error', () => {});
        setTimeout(() => {
          sock.destroy();
          resolve();
        }, ms);
      });

    // The probe's client goes away before the (slow) upstream answers: no result, the place is free.
    await trip();
    await goneAfter(`GET /pcb/api/slow HTTP/1.1\r\nHost: ${HOST}\r\n\r\n`, 300);
    await sleep(100);
    // Within tripped_duration of that probe: it used to be refused (503) until the probe was given up.
    expect(await status('/pcb/api/status/200')).toBe(200);
    expect(await status('/pcb/api/status/200')).toBe(200); // closed

    // An Upgrade taking the probe: it has no result the breaker counts.
    await trip();
    await goneAfter(`GET /pcb/api/ws HTTP/1.1\r\nHost: ${HOST}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n`, 300);
    expect(await status('/pcb/api/status/200')).toBe(200);
  });

  it('with enforce: false never refuses', async () => {
    await c.policyRoute('/cbdry', { inbound: [{ actions: [{ type: 'circuit-breaker', config: { enforce: false, volume_threshold: 1, error_threshold: 0 } }] }] });
    for (let i = 0; i < 5; i++) expect(await status('/cbdry/status/500')).toBe(500);
    expect(hitsOf('/cbdry/status/500')).toBe(5);
  });

  it('refuses bad configurations with a 400 naming the field', async () => {
    const cases: [string, string][] = [
      ['{error_threshold: 50}', 'inbound[0].actions[0].config.error_threshold: must be from 0.0 to 1.0 (a fraction, not a percentage), got 50'],
      ['{volume_threshold: 0}', 'inbound[0].actions[0].config.volume_threshold: must be from 1 to 2,000,000,000, got 0'],
      ['{window_duration: 5m}', 'inbound[0].actions[0].config.window_duration: must be from 1s to 2m, got "5m"'],
      ['{tripped_duration: 10}', 'inbound[0].actions[0].config.tripped_duration: must be a duration string'],
      ['{num_buckets: 20}', 'inbound[0].actions[0].config.num_buckets: is fixed at 10'],
    ];
    for (const [config, msg] of cases) {
      const r = await c.tryPolicy(`inbound:\n  - actions:\n      - type: circuit-breaker\n        config: ${config}\n`);
      expect([r.status, r.body.error_code]).toEqual([400, 'ERR_WARREN_6900']);
      expect(r.body.msg).toContain(`traffic_policy.value: ${msg}`);
    }
    const out = await c.tryPolicy({ outbound: [{ actions: [{ type: 'close-connection' }] }] });
    expect([out.status, out.body.msg]).toEqual([400, 'traffic_policy.value: outbound[0].actions[0].type: close-connection can only be used in inbound rules (it closes the connection before any response)']);
  });
});

describe('close-connection on live traffic', () => {
  beforeAll(async () => {
    await c.policyRoute('/dc', {
      inbound: [
        { expressions: ["req.url.path.startsWith('/dc/close')"], actions: [{ type: 'close-connection' }, { type: 'deny' }] },
        { actions: [{ type: 'add-headers', config: { headers: { 'x-kept': 'yes' } } }] },
      ],
    });
  }, 30_000);

  it('closes the connection with no response on matching requests only; the upstream never sees them', async () => {
    await expect(c.request('/dc/close/status/200')).rejects.toMatchObject({ code: 'ECONNRESET', message: 'socket hang up' });
    await expect(c.request('/dc/close/x', { body: 'some body' })).rejects.toMatchObject({ code: 'ECONNRESET' });
    expect(hitsOf('/dc/close/status/200')).toBe(0);
    const kept = await c.request('/dc/open');
    expect(kept.status).toBe(200);
    expect(kept.json().headers['x-kept']).toBe('yes');
  });

  it('on a kept-alive connection, closes it at the matching request after answering the earlier one', async () => {
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    const get = (p: string) =>
      new Promise<{ status: number; reused: boolean }>((resolve, reject) => {
        const req = http.get({ host: '127.0.0.1', port: c.a.http, path: p, agent, headers: { host: HOST } }, (res) => {
          res.resume();
          res.on('end', () => resolve({ status: res.statusCode!, reused: req.reusedSocket }));
        });
        req.on('error', (err) => reject(Object.assign(err, { reused: req.reusedSocket })));
      });
    try {
      expect(await get('/dc/open')).toEqual({ status: 200, reused: false });
      await expect(get('/dc/close')).rejects.toMatchObject({ code: 'ECONNRESET', reused: true });
      expect(await get('/dc/open')).toEqual({ status: 200, reused: false });
    } finally {
      agent.destroy();
    }
  });

  it('closes an Upgrade request without an answer too', async () => {
    const { received } = await rawExchange(`GET /dc/close/ws HTTP/1.1\r\nHost: ${HOST}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n`);
    expect(received).toBe('');
  });
});
