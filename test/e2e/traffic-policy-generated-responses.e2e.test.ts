import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPolicyCluster, type PolicyCluster } from '../support/policy-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * Answers the ingress makes itself on the way in (an inbound deny, custom-response, the
 * rate-limit 429, a route module's refusal) go through the route's response stages as the
 * upstream's responses do: the traffic policy's outbound rules run on them (ngrok: "When this
 * policy is executed in the on_http_request phase, actions defined in the on_http_response phase
 * will still be executed") and see `res.status_code`, `res.headers` and
 * `actions.ngrok.rate_limit.limited`; response_headers applies; an outbound deny or
 * custom-response replaces them. 204 and 304 answers carry no Content-Length and no body. Through
 * real processes: a control plane, an ingress, our agent and an upstream; policies saved through
 * the REST API.
 */

const HOST = 'generated.e2e.test';
let c: PolicyCluster;
let genRoute = '';
let plainRoute = '';

const POLICY = `
inbound:
  - expressions: ["req.url.path.startsWith('/gen/deny')"]
    actions:
      - type: deny
  - expressions: ["req.url.path.startsWith('/gen/teapot')"]
    actions:
      - type: custom-response
        config:
          status_code: 418
          body: short and stout
          headers:
            x-own: mine
  - expressions: ["req.url.path.startsWith('/gen/empty')"]
    actions:
      - type: custom-response
        config:
          status_code: 204
          body: hello
  - expressions: ["req.url.path.startsWith('/gen/unmodified')"]
    actions:
      - type: custom-response
        config:
          status_code: 304
          body: hello
  - expressions: ["req.url.path.startsWith('/gen/rl')"]
    actions:
      - type: rate-limit
        config:
          name: one
          algorithm: sliding_window
          capacity: 1
          rate: 60s
          bucket_key: [req.host]
outbound:
  - actions:
      - type: add-headers
        config:
          headers:
            x-out: "ran \${res.status_code}"
            x-own-seen: "\${size(getResHeader('x-own')) > 0 ? getResHeader('x-own')[0] : 'none'}"
  - expressions: ["actions.ngrok.rate_limit.limited"]
    actions:
      - type: add-headers
        config:
          headers:
            x-limited: ngrok
  - expressions: ["actions.service.rate_limit.limited == true"]
    actions:
      - type: add-headers
        config:
          headers:
            x-service-limited: "yes"
  - expressions: ["res.status_code == 418 && req.url.path.endsWith('/strip')"]
    actions:
      - type: remove-headers
        config:
          headers: [x-own]
  - expressions: ["res.status_code == 418 && req.url.path.endsWith('/replace')"]
    actions:
      - type: custom-response
        config:
          status_code: 200
          body: replaced
  - expressions: ["res.status_code == 403 && req.url.path.endsWith('/legal')"]
    actions:
      - type: deny
        config:
          status_code: 451
`;

/** The ingress's request counter for `route` and `status` (0 when absent). */
async function counted(route: string, status: number): Promise<number> {
  const text = await (await fetch(`${c.a.internalUrl}/metrics`)).text();
  const m = new RegExp(`warren_ingress_requests_total\\{[^}]*route="${route}",status="${status}"[^}]*\\} (\\d+)`).exec(text);
  return m ? Number(m[1]) : 0;
}

/** Sends one raw request on a new connection; everything the ingress sent before closing it. */
function rawExchange(path: string, method = 'GET'): Promise<string> {
  return new Promise((resolve, reject) => {
    const sock = net.connect(c.a.http, '127.0.0.1', () => sock.write(`${method} ${path} HTTP/1.1\r\nHost: ${HOST}\r\nConnection: close\r\n\r\n`));
    const chunks: Buffer[] = [];
    sock.on('data', (ch: Buffer) => chunks.push(ch));
    sock.on('end', () => resolve(Buffer.concat(chunks).toString('latin1')));
    sock.on('error', reject);
    sock.setTimeout(10_000, () => sock.destroy(new Error('timed out')));
  });
}

beforeAll(async () => {
  c = await startPolicyCluster({ name: 'generated', host: HOST });
  genRoute = await c.policyRoute('/gen', POLICY, { response_headers: { add: { 'x-rh': 'yes' } } });
  // Inbound rules only, no response stage: answers go out as they are.
  plainRoute = await c.policyRoute('/plain', {
    inbound: [
      { expressions: ["req.url.path.startsWith('/plain/deny')"], actions: [{ type: 'deny' }] },
      { expressions: ["req.url.path.startsWith('/plain/empty')"], actions: [{ type: 'custom-response', config: { status_code: 204, body: 'hello' } }] },
    ],
  });
}, CLUSTER_HOOK_MS);

afterAll(() => c?.stop(), 60_000);

describe('outbound rules on answers made on the way in', () => {
  it("run on the upstream's response as before", async () => {
    const r = await c.request('/gen/up');
    expect([r.status, r.headers['x-out'], r.headers['x-own-seen'], r.headers['x-rh'], r.headers['x-limited']]).toEqual([200, 'ran 200', 'none', 'yes', undefined]);
    expect(r.json().url).toBe('/gen/up');
  });

  it('run on an inbound deny (403), with response_headers; counted as 403', async () => {
    const before = await counted(genRoute, 403);
    const r = await c.request('/gen/deny');
    expect([r.status, r.headers['x-out'], r.headers['x-own-seen'], r.headers['x-rh']]).toEqual([403, 'ran 403', 'none', 'yes']);
    expect(Number(r.headers['content-length'])).toBe(r.raw.length);
    expect(await counted(genRoute, 403)).toBe(before + 1);
  });

  it("run on a custom-response (418) and see its headers; an outbound remove-headers edits it", async () => {
    const r = await c.request('/gen/teapot');
    expect([r.status, r.body, r.headers['x-own'], r.headers['x-out'], r.headers['x-own-seen']]).toEqual([418, 'short and stout', 'mine', 'ran 418', 'mine']);
    const stripped = await c.request('/gen/teapot/strip');
    expect([stripped.status, stripped.headers['x-own'], stripped.headers['x-out'], stripped.body]).toEqual([418, undefined, 'ran 418', 'short and stout']);
  });

  it('may replace the answer (outbound custom-response, outbound deny): sent once, as it is, and counted with its status', async () => {
    const r = await c.request('/gen/teapot/replace');
    expect([r.status, r.body, r.headers['x-own'], r.headers['x-out']]).toEqual([200, 'replaced', undefined, undefined]);
    const before = await counted(genRoute, 451);
    const legal = await c.request('/gen/deny/legal');
    expect(legal.status).toBe(451);
    expect(await counted(genRoute, 451)).toBe(before + 1);
  });

  it('run on the rate-limit 429 and see actions.ngrok.rate_limit.limited / actions.service.rate_limit.limited', async () => {
    const first = await c.request('/gen/rl');
    expect([first.status, first.headers['x-out'], first.headers['x-limited'], first.headers['x-service-limited']]).toEqual([200, 'ran 200', undefined, undefined]);
    const before = await counted(genRoute, 429);
    const limited = await c.request('/gen/rl');
    expect([limited.status, limited.headers['x-out'], limited.headers['x-limited'], limited.headers['x-service-limited'], limited.headers['x-rh']]).toEqual([429, 'ran 429', 'ngrok', 'yes', 'yes']);
    expect(Number(limited.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    expect(await counted(genRoute, 429)).toBe(before + 1);
  });

  it('HEAD gets the Content-Length a GET would get, without a body', async () => {
    const get = await c.request('/gen/teapot');
    const head = await c.request('/gen/teapot', { method: 'HEAD' });
    expect([head.status, head.headers['content-length'], head.raw.length, head.headers['x-out']]).toEqual([418, String(get.raw.length), 0, 'ran 418']);
  });
});

describe('204 and 304 answers', () => {
  it('a 204 custom-response has no Content-Length and no body, with or without response stages', async () => {
    for (const p of ['/gen/empty', '/plain/empty']) {
      const text = await rawExchange(p);
      expect(text.startsWith('HTTP/1.1 204 No Content\r\n')).toBe(true);
      expect(text.toLowerCase()).not.toContain('content-length');
      expect(text.toLowerCase()).not.toContain('transfer-encoding');
      expect(text.endsWith('\r\n\r\n')).toBe(true);
    }
    expect((await c.request('/gen/empty')).headers['x-out']).toBe('ran 204');
  });

  it('a 304 custom-response likewise', async () => {
    const text = await rawExchange('/gen/unmodified');
    expect(text.startsWith('HTTP/1.1 304 Not Modified\r\n')).toBe(true);
    expect(text.toLowerCase()).not.toContain('content-length');
    expect(text.endsWith('\r\n\r\n')).toBe(true);
    expect(text).toContain('x-out: ran 304\r\n');
  });

  it('a route without response stages sends its deny as it is', async () => {
    const before = await counted(plainRoute, 403);
    const r = await c.request('/plain/deny');
    expect([r.status, r.headers['x-out'], Number(r.headers['content-length'])]).toEqual([403, undefined, r.raw.length]);
    expect(await counted(plainRoute, 403)).toBe(before + 1);
  });
});
