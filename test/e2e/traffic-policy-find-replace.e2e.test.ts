import http from 'node:http';
import net from 'node:net';
import zlib from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPolicyCluster, type PolicyCluster, type PolicyRequestOptions } from '../support/policy-cluster.js';
import { waitFor } from '../support/cluster.js';
import { metricValue } from '../support/events.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * The traffic-policy actions `request-body-find-replace` and `response-body-find-replace` on live
 * traffic, through real processes: a control plane, an ingress, our agent and an upstream that
 * echoes the request body it got (with its Content-Length) or serves text in several framings.
 * Every policy is saved through the REST API.
 */

const HOST = 'find-replace.e2e.test';
let c: PolicyCluster;

/** What the upstream serves: a JSON document with secrets in it (a little over 1 KiB, so compress-response applies). */
const DOC = JSON.stringify({ users: Array.from({ length: 24 }, (_, i) => ({ id: i, name: `user ${i}`, note: `api_key=SECRET${i} ssn 123-45-67${10 + i}` })) });
const REDACTED = DOC.replace(/api_key=[A-Za-z0-9]+/g, 'api_key=REDACTED').replace(/\d{3}-\d{2}-\d{4}/g, 'XXX-XX-XXXX');
const PNG = Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), Buffer.from('api_key=SECRET0 \xff\x00', 'latin1')]);
/** Over the 4 KiB an action with a regex replacement rewrites on the event loop: on the regex worker thread. */
const BIG = `api_key=SECRET ${'x'.repeat(5000)}`;
/** Over the 128 KiB any action rewrites. */
const HUGE = `api_key=SECRET ${'x'.repeat(140 * 1024)}`;
/** A 100 KiB page: within the 128 KiB an action of literal replacements rewrites. */
const PAGE = `<html><body>${'<p class="row">Lorem ipsum dolor sit amet</p>\n'.repeat(2250)}<p>api_key=SECRET</p></body></html>`;
const PAGE_REDACTED = PAGE.replace('api_key=SECRET', 'api_key=REDACTED');
const LITERAL = [{ from: 'api_key=SECRET', to: 'api_key=REDACTED' }];

const request = (p: string, opts?: PolicyRequestOptions) => c.request(p, opts);
/** A GET whose response may break off: 'cut' when it does (after its head or before), 'complete' when it ends, 'hung' after 5 s of neither. */
const cutShort = (p: string) =>
  new Promise<'cut' | 'complete' | 'hung'>((resolve) => {
    const req = http.get({ host: '127.0.0.1', port: c.a.http, path: p, agent: false, headers: { host: HOST, 'accept-encoding': 'gzip' } }, (res) => {
      res.on('data', () => {});
      res.on('end', () => resolve(res.complete ? 'complete' : 'cut'));
      res.on('error', () => resolve('cut'));
      res.on('aborted', () => resolve('cut'));
    });
    req.on('error', () => resolve('cut'));
    req.setTimeout(5_000, () => {
      resolve('hung');
      req.destroy();
    });
  });
const route = (match: string, policy: unknown, modules: Record<string, unknown> = {}): Promise<string> => c.policyRoute(match, policy, modules);
const REPLACEMENTS = [
  { from: 'api_key=([A-Za-z0-9]+)', to: 'api_key=REDACTED' },
  { from: '\\d{3}-\\d{2}-\\d{4}', to: 'XXX-XX-XXXX' },
];

const upstream: http.RequestListener = (req, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (ch: Buffer) => chunks.push(ch));
  req.on('end', () => {
    const path = req.url ?? '/';
    const body = Buffer.concat(chunks);
    const json = { 'content-type': 'application/json', etag: '"doc-1"' };
    if (path.endsWith('/length')) {
      res.writeHead(200, { ...json, 'content-length': Buffer.byteLength(DOC) });
      res.end(DOC);
    } else if (path.endsWith('/chunked')) {
      // Several writes, no Content-Length: Transfer-Encoding: chunked.
      res.writeHead(200, json);
      for (let i = 0; i < DOC.length; i += 100) res.write(DOC.slice(i, i + 100));
      res.end();
    } else if (path.endsWith('/pregz')) {
      const gz = zlib.gzipSync(DOC);
      res.writeHead(200, { ...json, 'content-encoding': 'gzip', 'content-length': gz.length });
      res.end(gz);
    } else if (path.endsWith('/png')) {
      res.writeHead(200, { 'content-type': 'image/png', 'content-length': PNG.length });
      res.end(PNG);
    } else if (path.endsWith('/page')) {
      res.writeHead(200, { 'content-type': 'text/html; charset=utf-8', 'content-length': Buffer.byteLength(PAGE) });
      res.end(PAGE);
    } else if (path.endsWith('/badreason')) {
      // A reason phrase with a control character: undici takes it, Node's writeHead refuses it.
      // Written past Node's response, so this connection can serve nothing more (its `res` never
      // ends): it says so and closes. Left open, the tunnel stream over it went back to the pool,
      // and a later test's request on it waited for an answer that never came.
      req.socket.end(`HTTP/1.1 200 OK\x01\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(DOC)}\r\nConnection: close\r\n\r\n${DOC}`);
    } else if (path.endsWith('/garbage')) {
      // A head, then broken chunk framing in the same segment: the body fails before the response stages answer.
      req.socket.write('HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n0123456789abcdef\r\nZZZ\r\n');
      setTimeout(() => req.socket.destroy(), 50);
    } else if (path.endsWith('/abort')) {
      // A head and part of the body, then the connection breaks.
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.write('api_key=SECRET '.repeat(100));
      setTimeout(() => res.socket?.destroy(), 100);
    } else if (path.endsWith('/big')) {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end(BIG);
    } else if (path.endsWith('/slow')) {
      // A stream: a first part, then the rest well after the ingress's FIND_REPLACE_HOLD_MS.
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.write('first api_key=SECRET ');
      setTimeout(() => res.end('last api_key=SECRET'), 2_500);
    } else if (path.endsWith('/huge')) {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end(HUGE);
    } else if (path.endsWith('/links')) {
      // A page of links to rewrite, sent chunked.
      res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
      for (let i = 0; i < 1000; i++) res.write(`<li><a href="http://localhost:3000/item/${i}">item ${i}</a></li>\n`);
      res.end();
    } else {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ body: body.toString('latin1'), length: req.headers['content-length'] ?? null, te: req.headers['transfer-encoding'] ?? null, received: body.length }));
    }
  });
};

beforeAll(async () => {
  c = await startPolicyCluster({ name: 'findreplace', host: HOST, upstream, ingressEnv: () => ({ FIND_REPLACE_HOLD_MS: '1000' }) });
}, CLUSTER_HOOK_MS);

afterAll(() => c?.stop(), 60_000);

describe('request-body-find-replace on live traffic', () => {
  it('a client that resets while its body is read is not logged as an error (any client could write such lines at will)', async () => {
    await route('/reqcut', { inbound: [{ actions: [{ type: 'request-body-find-replace', config: { replacements: LITERAL } }] }] });
    const before = c.a.output().split('\n').filter((l) => l.includes('"level":50')).length;
    for (let i = 0; i < 3; i++) {
      await new Promise<void>((resolve) => {
        const s = net.connect(c.a.http, '127.0.0.1', () => s.write(`POST /reqcut/echo HTTP/1.1\r\nHost: ${HOST}\r\nContent-Type: text/plain\r\nContent-Length: 1000\r\n\r\napi_key=SECRET`));
        s.on('error', () => {});
        s.on('close', () => resolve());
        setTimeout(() => s.resetAndDestroy(), 100);
      });
    }
    expect((await request('/reqcut/echo', { body: 'api_key=SECRET', headers: { 'content-type': 'text/plain' } })).json().body).toBe('api_key=REDACTED');
    expect(c.a.output().split('\n').filter((l) => l.includes('"level":50')).slice(before)).toEqual([]);
  });

  it('the upstream gets the rewritten body with a matching Content-Length (also for a gzipped request)', async () => {
    await route('/req', { inbound: [{ actions: [{ type: 'request-body-find-replace', config: { replacements: REPLACEMENTS } }] }] });
    const body = '{"prompt":"my api_key=abc123, my ssn 123-45-6789"}';
    const want = '{"prompt":"my api_key=REDACTED, my ssn XXX-XX-XXXX"}';
    const r = await request('/req/echo', { body, headers: { 'content-type': 'application/json' } });
    expect(r.status).toBe(200);
    expect(r.json()).toEqual({ body: want, length: String(want.length), te: null, received: want.length });

    const gz = zlib.gzipSync(body);
    const g = await request('/req/echo', { body: gz, headers: { 'content-type': 'application/json', 'content-encoding': 'gzip' } });
    const got = g.json();
    expect(zlib.gunzipSync(Buffer.from(got.body, 'latin1')).toString()).toBe(want);
    expect(got.length).toBe(String(got.received));
  });

  it('a literal replacement rewrites a 100 KiB body; the upstream gets the right Content-Length', async () => {
    await route('/lit', { inbound: [{ actions: [{ type: 'request-body-find-replace', config: { replacements: LITERAL } }] }] });
    expect(PAGE.length).toBeGreaterThan(100 * 1024);
    expect(PAGE.length).toBeLessThan(128 * 1024);
    const r = await request('/lit/echo', { body: PAGE, headers: { 'content-type': 'text/html' } });
    expect(r.json()).toEqual({ body: PAGE_REDACTED, length: String(PAGE_REDACTED.length), te: null, received: PAGE_REDACTED.length });
  });

  it('leaves a binary body and one over 128 KiB byte for byte, rewrites one over 4 KiB with a regex on the worker thread; over 1 MiB is a 413', async () => {
    const bin = await request('/req/echo', { body: PNG, headers: { 'content-type': 'application/octet-stream' } });
    expect(Buffer.from(bin.json().body, 'latin1').equals(PNG)).toBe(true);
    const big = await request('/req/echo', { body: BIG, headers: { 'content-type': 'text/plain' } });
    const bigOut = BIG.replace('SECRET', 'REDACTED');
    expect(big.json()).toMatchObject({ body: bigOut, length: String(bigOut.length) });
    const huge = await request('/req/echo', { body: HUGE, headers: { 'content-type': 'text/plain' } });
    expect(huge.json()).toMatchObject({ body: HUGE, length: String(HUGE.length) });
    const tooBig = await request('/req/echo', { body: Buffer.alloc(1024 * 1024 + 1, 0x61), headers: { 'content-type': 'text/plain' } });
    expect([tooBig.status, tooBig.headers['warren-error-code']]).toEqual([413, 'ERR_WARREN_7009']);
  });
});

describe('response-body-find-replace on live traffic', () => {
  it('rewrites a response with a Content-Length and a chunked one; sent with the new Content-Length (as ngrok), ETag weakened', async () => {
    await route('/res', { outbound: [{ actions: [{ type: 'response-body-find-replace', config: { replacements: REPLACEMENTS } }] }] });
    for (const p of ['/res/length', '/res/chunked']) {
      const r = await request(p);
      expect([r.status, r.body, r.headers['content-length'], r.headers['transfer-encoding'], r.headers.etag]).toEqual([200, REDACTED, String(Buffer.byteLength(REDACTED)), undefined, 'W/"doc-1"']);
    }
    // Over 4 KiB: rewritten on the regex worker thread, sent with its new length too.
    const big = await request('/res/big');
    const bigOut = BIG.replace('SECRET', 'REDACTED');
    expect([big.body === bigOut, big.headers['content-length']]).toEqual([true, String(bigOut.length)]);
    // One it could not rewrite (over the 128 KiB bound) goes out as it comes: chunked.
    const huge = await request('/res/huge');
    expect([huge.body === HUGE, huge.headers['content-length'], huge.headers['transfer-encoding']]).toEqual([true, undefined, 'chunked']);
  });

  it('an upstream breaking off mid-body cuts that response only, on any route with response stages (it used to end the ingress process)', async () => {
    await route('/ab-hdr', { outbound: [{ actions: [{ type: 'add-headers', config: { headers: { 'x-seen': '1' } } }] }] });
    await route('/ab-gz', {}, { compression: { enabled: true } });
    await route('/ab-cb', {}, { circuit_breaker: { tripped_duration: 10, rolling_window: 10, num_buckets: 10, volume_threshold: 100, error_threshold_percentage: 0.5 } });
    for (const p of ['/ab-hdr', '/ab-gz', '/ab-cb']) {
      for (let i = 0; i < 2; i++) expect(await cutShort(`${p}/abort`), p).toBe('cut');
      // The node is still up and serving.
      expect((await request(`${p}/length`)).status, p).toBe(200);
    }
  });

  it("a response stage's own answer is sent whole though the upstream's body it replaced breaks off", async () => {
    await route('/ab-deny', { outbound: [{ expressions: ['res.status_code == 200'], actions: [{ type: 'custom-response', config: { status_code: 451, content: 'replaced' } }] }] });
    for (let i = 0; i < 2; i++) {
      const r = await request('/ab-deny/abort');
      expect([r.status, r.body]).toEqual([451, 'replaced']);
    }
  });

  it('with compress-response after it (a composed transform): a head Node refuses or a body broken at once answers 502 on that response only (either used to end the process)', async () => {
    await route('/crz', { outbound: [{ actions: [{ type: 'response-body-find-replace', config: { replacements: REPLACEMENTS } }, { type: 'compress-response' }] }] });
    const bad = await request('/crz/badreason', { headers: { 'accept-encoding': 'gzip' } });
    expect([bad.status, bad.headers['warren-error-code']]).toEqual([502, 'ERR_WARREN_7004']);
    // The body breaks while find-replace holds it, so before any head went out: a 502, not a cut connection.
    for (let i = 0; i < 2; i++) {
      const broken = await request('/crz/garbage', { headers: { 'accept-encoding': 'gzip' } });
      expect([broken.status, broken.headers['warren-error-code'], broken.headers['content-encoding']]).toEqual([502, 'ERR_WARREN_7004', undefined]);
    }
    const ok = await request('/crz/length', { headers: { 'accept-encoding': 'gzip' } });
    expect(zlib.gunzipSync(ok.raw).toString()).toBe(REDACTED);
  });

  it('gives back what it held when the upstream breaks off mid-body (the process-wide hold returns to 0)', async () => {
    const held = async () => metricValue(await (await fetch(`${c.a.internalUrl}/metrics`)).text(), 'warren_traffic_policy_find_replace_held_bytes');
    await route('/brk', { outbound: [{ actions: [{ type: 'response-body-find-replace', config: { replacements: LITERAL } }] }] });
    for (let i = 0; i < 3; i++) {
      // Held whole (the head waits for it), so the break comes before the head: a 502.
      const r = await request('/brk/abort');
      expect([r.status, r.headers['warren-error-code']]).toEqual([502, 'ERR_WARREN_7004']);
    }
    expect((await request('/brk/page')).body).toBe(PAGE_REDACTED); // and the next one is served
    await waitFor('the held bytes given back', async () => (await held()) === 0, 5_000);
  });

  it('replaces before compress-response compresses, and rewrites an upstream-gzipped body keeping its coding', async () => {
    await route('/cmp', { outbound: [{ actions: [{ type: 'response-body-find-replace', config: { replacements: REPLACEMENTS } }, { type: 'compress-response' }] }] });
    const gz = await request('/cmp/length', { headers: { 'accept-encoding': 'gzip' } });
    expect(gz.headers['content-encoding']).toBe('gzip');
    expect(zlib.gunzipSync(gz.raw).toString()).toBe(REDACTED);
    const br = await request('/cmp/chunked', { headers: { 'accept-encoding': 'br' } });
    expect(br.headers['content-encoding']).toBe('br');
    expect(zlib.brotliDecompressSync(br.raw).toString()).toBe(REDACTED);
    const pre = await request('/cmp/pregz', { headers: { 'accept-encoding': 'br, gzip' } });
    expect(pre.headers['content-encoding']).toBe('gzip');
    expect(zlib.gunzipSync(pre.raw).toString()).toBe(REDACTED);
  });

  it('a literal replacement rewrites a 200 KiB HTML page, also gzipped by compress-response', async () => {
    await route('/page', { outbound: [{ actions: [{ type: 'response-body-find-replace', config: { replacements: LITERAL } }, { type: 'compress-response' }] }] });
    const r = await request('/page/page');
    expect([r.status, r.headers['content-length'], r.body.length]).toEqual([200, String(PAGE_REDACTED.length), PAGE_REDACTED.length]);
    expect(r.body === PAGE_REDACTED).toBe(true);
    const gz = await request('/page/page', { headers: { 'accept-encoding': 'gzip' } });
    expect(zlib.gunzipSync(gz.raw).toString() === PAGE_REDACTED).toBe(true);
  });

  it('passes a binary body and one over 128 KiB unchanged; rewrites one over 4 KiB with a regex on the worker thread', async () => {
    const png = await request('/res/png');
    expect([png.headers['content-type'], png.headers['content-length']]).toEqual(['image/png', String(PNG.length)]);
    expect(png.raw.equals(PNG)).toBe(true);
    const big = await request('/res/big');
    expect(big.body).toBe(BIG.replace('SECRET', 'REDACTED'));
    const huge = await request('/res/huge');
    expect(huge.body === HUGE).toBe(true);
  });

  it('a body that does not arrive whole within FIND_REPLACE_HOLD_MS goes out unchanged as it streams, its head and first part at the deadline', async () => {
    await route('/stream', { outbound: [{ actions: [{ type: 'response-body-find-replace', config: { replacements: LITERAL } }] }] });
    const started = Date.now();
    const firstAt = await new Promise<{ head: number; first: string; all: string; end: number }>((resolve, reject) => {
      http.get({ host: '127.0.0.1', port: c.a.http, path: '/stream/slow', agent: false, headers: { host: HOST } }, (res) => {
        const head = Date.now() - started;
        let first = '';
        let all = '';
        res.setEncoding('utf8');
        res.on('data', (d: string) => {
          if (!first) first = d;
          all += d;
        });
        res.on('end', () => resolve({ head, first, all, end: Date.now() - started }));
      }).on('error', reject);
    });
    // The head at the 1 s deadline, with the first part; the rest when the upstream sent it (2.5 s).
    expect(firstAt.head).toBeGreaterThanOrEqual(900);
    expect(firstAt.head).toBeLessThan(2_400);
    expect(firstAt.first).toBe('first api_key=SECRET ');
    expect(firstAt.all).toBe('first api_key=SECRET last api_key=SECRET');
    expect(firstAt.end).toBeGreaterThanOrEqual(2_400);
  });

  it('rewrites the links of a 60 KB page with a regex (on the worker thread), chunked and gzipped by compress-response, while other requests go on', async () => {
    await route('/site', { outbound: [{ actions: [{ type: 'response-body-find-replace', config: { replacements: [{ from: 'https?://localhost:3000/', to: 'https://app.example.com/' }] } }, { type: 'compress-response' }] }] });
    const want = Array.from({ length: 1000 }, (_, i) => `<li><a href="https://app.example.com/item/${i}">item ${i}</a></li>\n`).join('');
    expect(want.length).toBeGreaterThan(60_000);
    // A loaded CI machine: give the worker thread room beyond the default 10 s request timeout.
    const slow = { timeoutMs: 30_000 };
    const pages = await Promise.all([request('/site/links', slow), request('/site/links', { ...slow, headers: { 'accept-encoding': 'gzip' } }), request('/res/length', slow)]);
    expect(pages[0].body === want).toBe(true);
    expect(pages[1].headers['content-encoding']).toBe('gzip');
    expect(zlib.gunzipSync(pages[1].raw).toString() === want).toBe(true);
    expect(pages[2].body).toBe(REDACTED);
  });

  it("the README's recipe for a redaction that must not leak: what the action could not rewrite is refused instead", async () => {
    await route('/sure', `
on_http_request:
  - actions:
      - type: remove-headers
        config: {headers: [accept-encoding]}
on_http_response:
  - expressions: ["res.content_length < 0 || res.content_length > 4096 || hasResHeader('Content-Encoding')"]
    actions:
      - type: deny
        config: {status_code: 502}
  - actions:
      - type: response-body-find-replace
        config:
          replacements:
            - {from: "api_key=([A-Za-z0-9]+)", to: "api_key=REDACTED"}
            - {from: '\\d{3}-\\d{2}-\\d{4}', to: XXX-XX-XXXX}
`);
    const ok = await request('/sure/length', { headers: { 'accept-encoding': 'gzip' } });
    expect([ok.status, ok.body]).toEqual([200, REDACTED]);
    // Over the bound, of unknown length (chunked) or encoded anyway: refused, never passed on unredacted.
    for (const p of ['/sure/big', '/sure/chunked', '/sure/pregz']) {
      const r = await request(p);
      expect(r.status, p).toBe(502);
      expect(r.body, p).not.toContain('SECRET');
    }
  });

  it('refuses a bad pattern or a policy over the cost bound when saved, naming the field', async () => {
    const r1 = await c.tryPolicy({ outbound: [{ actions: [{ type: 'response-body-find-replace', config: { replacements: [{ from: 'a', to: 'b' }, { from: '(?<=x)y' }] } }] }] });
    expect([r1.status, r1.body.error_code]).toEqual([400, 'ERR_WARREN_6900']);
    expect(r1.body.msg).toContain('outbound[0].actions[0].config.replacements[1].from: invalid RE2 pattern');
    const r2 = await c.tryPolicy({ inbound: [{ actions: [{ type: 'request-body-find-replace', config: { replacements: [{ from: '(\\w+\\s*){10}x' }] } }] }] });
    expect(r2.status).toBe(400);
    expect(r2.body.msg).toContain('inbound[0].actions[0].config.replacements[0].from: request-body-find-replace: replacing from (RE2, up to 32 matches) in a request body of up to 4 KiB');
    const r3 = await c.tryPolicy({ outbound: [{ actions: [{ type: 'request-body-find-replace', config: { replacements: [{ from: 'a' }] } }] }] });
    expect(r3.body.msg).toContain('outbound[0].actions[0].type: request-body-find-replace can only be used in inbound rules');
  });
});
