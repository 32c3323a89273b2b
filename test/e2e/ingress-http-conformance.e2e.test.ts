import http from 'node:http';
import { gunzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPolicyCluster, type PolicyCluster } from '../support/policy-cluster.js';
import { rawExchange, statuses } from '../support/raw-exchange.js';
import { CLUSTER_HOOK_MS, WORK_MS } from '../support/timeouts.js';

/**
 * HTTP conformance of the public listeners, through real processes (a control plane, two ingress
 * nodes, our agent on the first, an upstream that records every request it gets, in order), with
 * raw sockets:
 *
 * - `OPTIONS *` (RFC 9112 §3.2.4, RFC 9110 §9.3.7) is routed as `/` (that route's policy runs,
 *   and sees the path `/`) and reaches the upstream as `OPTIONS *`, which answers it, also over a
 *   hop (the second node); `*` with any other method is a 400, and the upstream never sees it;
 * - HEAD on a compressed route (the `compression` module, the `compress-response` action) gets
 *   the head the same GET gets (RFC 9110 §9.3.2): Content-Encoding, Vary, weakened ETag, no
 *   Content-Length of the identity body; no body, and the connection goes on;
 * - requests pipelined on one connection reach the upstream in their order, when an earlier one's
 *   body is buffered by its route (request-body-find-replace) or its stages wait (rate-limit).
 */

const HOST = 'conformance.e2e.test';
let c: PolicyCluster;
/** `METHOD target` of every request the upstream got, in order. */
const seen: string[] = [];
const FIXED = JSON.stringify({ fixed: 'the same representation every time '.repeat(100) });

const upstream: http.RequestListener = (req, res) => {
  seen.push(`${req.method} ${req.url}`);
  const chunks: Buffer[] = [];
  req.on('data', (d: Buffer) => chunks.push(d));
  req.on('end', () => {
    const url = req.url ?? '';
    if (url === '*') {
      const body = Buffer.concat(chunks).toString();
      res.writeHead(200, { allow: 'GET, HEAD, OPTIONS', 'x-upstream-saw': `${req.method} ${url}`, 'x-path-seen': String(req.headers['x-path-seen'] ?? ''), 'x-body-seen': body, 'content-length': '0' });
      res.end();
      return;
    }
    if (url.includes('/fixed')) {
      // HEAD gets the GET's head, with the identity body's length (Node sends no body for HEAD).
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(FIXED)), etag: '"fixed"' });
      res.end(FIXED);
      return;
    }
    const out = JSON.stringify({ method: req.method, url, body: Buffer.concat(chunks).toString() });
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(out) });
    res.end(out);
  });
};

/** Writes `parts` (a number is a pause in ms) on a new connection to `port`; collects the answer until idle or close. */
const exchange = (parts: Array<string | Buffer | number>, port = c.a.http, idle = 2000, max = 20_000) => rawExchange(port, parts, idle, max);
const req = (method: string, target: string, extra = '', body = '') => `${method} ${target} HTTP/1.1\r\nHost: ${HOST}\r\n${body ? `Content-Length: ${Buffer.byteLength(body)}\r\n` : ''}${extra}\r\n${body}`;

/** The header block of each response in `out` (lower-cased names), in order. */
function heads(out: string): Array<Record<string, string>> {
  return [...out.matchAll(/HTTP\/1\.1 \d{3}[^\r]*\r\n([\s\S]*?)\r\n\r\n/g)].map((m) => {
    const h: Record<string, string> = {};
    for (const line of m[1]!.split('\r\n')) {
      const colon = line.indexOf(':');
      h[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
    }
    return h;
  });
}

/** The requests the upstream gets while `run` runs. */
async function upstreamSaw(run: () => Promise<unknown>): Promise<string[]> {
  const from = seen.length;
  await run();
  return seen.slice(from);
}

beforeAll(async () => {
  c = await startPolicyCluster({ name: 'conformance', host: HOST, nodes: 2, upstream });
  // The agent's connections to the upstream stay open between tests (see `warm`).
  c.upstream.keepAliveTimeout = 120_000;
  await c.route('/plain', {});
  await c.route('/cz', { compression: {} });
  await c.policyRoute('/cr', { on_http_response: [{ actions: [{ type: 'compress-response', config: { algorithms: ['gzip'] } }] }] });
  await c.policyRoute('/fr', { on_http_request: [{ actions: [{ type: 'request-body-find-replace', config: { replacements: [{ from: 'foo', to: 'barbaz' }] } }] }] });
  await c.policyRoute('/deny', { on_http_request: [{ actions: [{ type: 'deny', config: { status_code: 403 } }] }] });
  await c.policyRoute('/rl', { on_http_request: [{ actions: [{ type: 'rate-limit', config: { name: 'rl', algorithm: 'sliding_window', capacity: 1000, rate: '60s', bucket_key: ['conn.client_ip'] } }] }] });
  // Last: `/` is a prefix of every other route (the helper's probe would otherwise hit it).
  await c.policyRoute('/', {
    on_http_request: [{ actions: [{ type: 'add-headers', config: { headers: { 'x-path-seen': '${req.url.path}' } } }] }],
    on_http_response: [{ actions: [{ type: 'add-headers', config: { headers: { 'x-root-route': 'yes' } } }] }],
  });
}, CLUSTER_HOOK_MS + WORK_MS); // and nine routes to apply on two nodes

afterAll(async () => {
  await c?.stop();
}, 60_000);

describe('OPTIONS * (asterisk form)', () => {
  for (const node of ['a', 'b (over a hop)'] as const) {
    it(`node ${node}: is routed as / (its policy runs, seeing the path /) and the upstream answers OPTIONS * itself`, async () => {
      const port = node === 'a' ? c.a.http : c.nodes[1]!.http;
      let r: { out: string } = { out: '' };
      const saw = await upstreamSaw(async () => {
        r = await exchange([req('OPTIONS', '*') + req('GET', '/plain/after-options', 'Connection: close\r\n')], port);
      });
      // (In either order: `OPTIONS *` goes on a proxy stream of its own, which the agent connects anew.)
      expect(saw.sort()).toEqual(['GET /plain/after-options', 'OPTIONS *']);
      expect(statuses(r.out), r.out.slice(0, 300)).toEqual([200, 200]);
      const h = heads(r.out)[0]!;
      expect(h['allow']).toBe('GET, HEAD, OPTIONS');
      expect(h['x-upstream-saw']).toBe('OPTIONS *');
      expect(h['x-path-seen']).toBe('/');
      expect(h['x-root-route']).toBe('yes');
      expect(r.out).toContain('"url":"/plain/after-options"');
    });
  }

  it('carries a body along', async () => {
    const r = await exchange([req('OPTIONS', '*', 'Content-Type: text/plain\r\nConnection: close\r\n', 'hello')]);
    expect(statuses(r.out)).toEqual([200]);
    expect(heads(r.out)[0]!['x-body-seen']).toBe('hello');
  });

  for (const method of ['GET', 'POST', 'HEAD', 'DELETE']) {
    it(`${method} * is a 400 (ERR_WARREN_7011) that never reaches the upstream, and the connection goes on`, async () => {
      let r: { out: string } = { out: '' };
      const saw = await upstreamSaw(async () => {
        r = await exchange([req(method, '*', '', method === 'POST' ? 'x' : '') + req('GET', '/plain/after-star', 'Connection: close\r\n')]);
      });
      expect(statuses(r.out), r.out.slice(0, 300)).toEqual([400, 200]);
      expect(heads(r.out)[0]!['warren-error-code']).toBe('ERR_WARREN_7011');
      expect(saw).toEqual(['GET /plain/after-star']);
    });
  }
});

describe('HEAD on a compressed route', () => {
  for (const [what, path] of [
    ['the compression module', '/cz/fixed'],
    ['the compress-response action', '/cr/fixed'],
  ] as const) {
    it(`${what}: the GET's Content-Encoding, Vary and ETag, no Content-Length, no body; the connection goes on`, async () => {
      const ae = 'Accept-Encoding: gzip\r\n';
      const get = await c.request(path, { headers: { 'accept-encoding': 'gzip' } });
      expect([get.status, get.headers['content-encoding'], get.headers.vary, get.headers.etag, get.headers['content-length']]).toEqual([200, 'gzip', 'Accept-Encoding', 'W/"fixed"', undefined]);
      expect(gunzipSync(get.raw).toString()).toBe(FIXED);

      // HEAD, then a GET on the same connection: the HEAD's answer has no body (the GET's status line follows its head at once).
      const r = await exchange([req('HEAD', path, ae) + req('GET', '/plain/after-head', 'Connection: close\r\n')]);
      expect(statuses(r.out), r.out.slice(0, 400)).toEqual([200, 200]);
      const h = heads(r.out)[0]!;
      expect(h['content-encoding']).toBe('gzip');
      expect(h['vary']).toBe('Accept-Encoding');
      expect(h['etag']).toBe('W/"fixed"');
      expect(h['content-length']).toBeUndefined();
      expect(h['transfer-encoding']).toBeUndefined();
      const afterHead = r.out.indexOf('\r\n\r\n') + 4;
      expect(r.out.slice(afterHead).startsWith('HTTP/1.1 200'), JSON.stringify(r.out.slice(afterHead, afterHead + 40))).toBe(true);
      expect(r.out).toContain('"url":"/plain/after-head"');
    });
  }

  it('a client that accepts no coding: HEAD and GET both uncompressed, with Vary and the identity length', async () => {
    const r = await exchange([req('HEAD', '/cz/fixed', 'Accept-Encoding: identity\r\n') + req('GET', '/cz/fixed', 'Accept-Encoding: identity\r\nConnection: close\r\n')]);
    expect(statuses(r.out)).toEqual([200, 200]);
    const [h, g] = heads(r.out);
    for (const x of [h!, g!]) {
      expect([x['content-encoding'], x['vary'], x['etag'], x['content-length']]).toEqual([undefined, 'Accept-Encoding', '"fixed"', String(Buffer.byteLength(FIXED))]);
    }
  });
});

/**
 * Leaves a few idle proxy streams in the node's pool, each already connected by the agent to the
 * upstream: requests written on them in an order reach the upstream in that order (a new stream
 * would wait for the agent's connect, a race between streams that the ingress does not decide).
 */
async function warm(): Promise<void> {
  await Promise.all(Array.from({ length: 4 }, (_, i) => c.request(`/plain/warm-${i}`)));
}

describe('pipelined requests reach the upstream in order', () => {
  it('behind a request whose body the route buffers (request-body-find-replace)', async () => {
    await warm();
    let r: { out: string } = { out: '' };
    const saw = await upstreamSaw(async () => {
      r = await exchange([req('POST', '/fr/first', 'Content-Type: text/plain\r\n', 'foo') + req('GET', '/plain/second') + req('GET', '/plain/third', 'Connection: close\r\n')]);
    });
    expect(saw).toEqual(['POST /fr/first', 'GET /plain/second', 'GET /plain/third']);
    expect(statuses(r.out)).toEqual([200, 200, 200]);
    expect(r.out).toContain('"body":"barbaz"');
    expect(r.out.indexOf('/fr/first')).toBeLessThan(r.out.indexOf('/plain/second'));
  });

  it('behind a request whose stages wait (rate-limit), with one answered by its route in between', async () => {
    await warm();
    let r: { out: string } = { out: '' };
    const saw = await upstreamSaw(async () => {
      r = await exchange([req('GET', '/rl/first') + req('GET', '/deny/second') + req('POST', '/fr/third', 'Content-Type: text/plain\r\n', 'foo') + req('GET', '/plain/fourth', 'Connection: close\r\n')]);
    });
    expect(saw).toEqual(['GET /rl/first', 'POST /fr/third', 'GET /plain/fourth']);
    expect(statuses(r.out)).toEqual([200, 403, 200, 200]);
  });

});
