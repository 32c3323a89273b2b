import { gunzipSync } from 'node:zlib';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { waitFor } from '../support/cluster.js';
import { startPolicyCluster, type PolicyCluster, type PolicyResponse } from '../support/policy-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * The request_headers, response_headers and compression modules on live traffic, through real
 * processes (a control plane, an ingress node, our agent and an upstream that echoes what reached
 * it): header values are UTF-8 text: control characters and lone surrogates are refused by the
 * API, and one stored anyway (written straight into the database, as an older control plane could
 * have) makes its route answer 503 rather than end the ingress process; a response head Node
 * refuses to write answers 502; any other text (U+0080-U+00FF, beyond U+00FF, beyond the BMP)
 * travels as its UTF-8 bytes; every upstream Vary field survives compression;
 * request_headers.add rewrites the Host the upstream sees (one Host; X-Forwarded-Host keeps the
 * public one) and response_headers edits a response's Host like any header.
 */

const HOST = 'hdrs.e2e.test';
let c: PolicyCluster;

const api = (method: string, p: string, body?: unknown) => c.api(method, p, body);
const request = (p: string, headers?: Record<string, string>) => c.request(p, { headers });
const route = async (match: string, modules: Record<string, unknown>): Promise<string> => (await c.route(match, modules)).id;
const alive = () => c.a.child.exitCode === null && c.a.child.signalCode === null;
const big = 'x'.repeat(4096);

beforeAll(async () => {
  c = await startPolicyCluster({
    name: 'hdrs',
    host: HOST,
    upstream: (req, res) => {
      req.resume();
      req.on('end', () => {
        if (req.url?.includes('/bad-reason')) {
          // A reason phrase with a control character: undici passes it on, Node will not write it.
          res.socket!.end('HTTP/1.1 200 OK\x01\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok');
          return;
        }
        if (req.url?.includes('/two-vary')) {
          res.setHeader('Vary', ['Origin', 'Cookie']);
          res.writeHead(200, { 'content-type': 'application/json' });
          res.end(JSON.stringify({ url: req.url, pad: big }));
          return;
        }
        res.writeHead(200, { 'content-type': 'application/json', 'x-upstream': 'yes', host: 'upstream.internal' });
        res.end(JSON.stringify({ url: req.url, headers: req.headers, rawHeaders: req.rawHeaders }));
      });
    },
  });
}, CLUSTER_HOOK_MS);

afterAll(async () => {
  await c?.stop();
}, 60_000);

const expectError = (r: PolicyResponse, status: number, code: string) => expect([r.status, r.headers['warren-error-code']], r.body).toEqual([status, code]);
const NOT_ALLOWED = 'header value has a character not allowed in a header (a control character or a lone surrogate)';
const utf8Hex = (text: string) => Buffer.from(text, 'utf8').toString('hex');
/** The bytes (hex) of a header value as node:http holds it (one character per byte). */
const bytesHex = (v: unknown) => (typeof v === 'string' ? Buffer.from(v, 'latin1').toString('hex') : v);

describe('header module values', () => {
  it('the API refuses a control character and reserved names, naming the field', async () => {
    for (const module of ['request_headers', 'response_headers']) {
      for (const value of ['5 €\u0001', 'a\r\nX-Evil: 1', 'del\u007f']) {
        const r = await api('POST', `/edges/https/${c.edgeId}/routes`, c.routeBody('/refused', { [module]: { add: { 'X-Price': value } } }));
        expect([value, r.status, r.body.error_code, r.body.details?.field]).toEqual([value, 400, 'ERR_WARREN_2104', `${module}.add.X-Price`]);
        expect(r.body.msg).toContain(NOT_ALLOWED);
      }
      for (const name of ['Content-Length', 'Transfer-Encoding', 'Connection', 'Upgrade', 'TE', 'Trailer', 'Keep-Alive', 'X-Warren-Tunnel']) {
        const add = await api('POST', `/edges/https/${c.edgeId}/routes`, c.routeBody('/refused', { [module]: { add: { [name]: 'v' } } }));
        expect([add.status, add.body.error_code, add.body.details?.field, add.body.msg]).toEqual([400, 'ERR_WARREN_2104', `${module}.add.${name}`, `${module}.add.${name}: header "${name}" cannot be changed by a route module`]);
        const remove = await api('POST', `/edges/https/${c.edgeId}/routes`, c.routeBody('/refused', { [module]: { remove: [name] } }));
        expect([remove.status, remove.body.error_code, remove.body.details?.field]).toEqual([400, 'ERR_WARREN_2104', `${module}.remove[0]`]);
      }
    }
  });

  it('values beyond ASCII (U+0080-U+00FF, beyond U+00FF, beyond the BMP) reach the upstream and the client as their UTF-8 bytes', async () => {
    await route('/utf8', {
      request_headers: { add: { 'X-Req-Name': 'café Zoë', 'X-Req-Price': '5 €', 'X-Req-Greet': 'こんにちは 😀' } },
      response_headers: { add: { 'X-Resp-Name': 'naïve ÿ', 'X-Resp-Price': '5 €' } },
    });
    const r = await request('/utf8/x');
    expect(r.status, r.body).toBe(200);
    // Node holds header bytes one character per byte on both ends: compare the bytes.
    const seen = r.json().headers;
    expect(['x-req-name', 'x-req-price', 'x-req-greet'].map((n) => bytesHex(seen[n]))).toEqual([utf8Hex('café Zoë'), '3520e282ac', utf8Hex('こんにちは 😀')]);
    expect(bytesHex(seen['x-req-name'])).toBe('636166c3a9205a6fc3ab');
    expect(['x-resp-name', 'x-resp-price'].map((n) => bytesHex(r.headers[n]))).toEqual([utf8Hex('naïve ÿ'), '3520e282ac']);
    expect(Buffer.from(r.headers['x-resp-name'] as string, 'latin1').toString('utf8')).toBe('naïve ÿ');
  });

  it('a value stored with a control character makes its route answer 503 (7010); the ingress keeps serving other routes', async () => {
    const ok = await route('/still-ok', { response_headers: { add: { 'X-Ok': '1' } } });
    expect(ok).toBeTruthy();
    const id = await route('/stored-bad', { request_headers: { add: { 'X-Price': '5 €' } }, response_headers: { add: { 'X-Price': '5 €' } } });
    expect(bytesHex((await request('/stored-bad/x')).headers['x-price'])).toBe('3520e282ac');

    // As an older control plane could have stored it: straight into the database, then any change
    // of the route pushes it to the node.
    const db = new pg.Client({ connectionString: c.databaseUrl });
    await db.connect();
    try {
      const { rowCount } = await db.query(
        `UPDATE https_edge_routes SET modules = jsonb_set(jsonb_set(modules, '{response_headers,add,X-Price}', to_jsonb($2::text)), '{request_headers,add,X-Price}', to_jsonb($2::text)) WHERE id = $1`,
        [id, '5 €\u0001'],
      );
      expect(rowCount).toBe(1);
    } finally {
      await db.end();
    }
    await c.apiExpecting(200, 'PATCH', `/edges/https/${c.edgeId}/routes/${id}`, { description: 'pushes the stored modules' });

    const refused = await waitFor('the node applies the stored bad value', async () => {
      const r = await request('/stored-bad/x');
      return r.headers['warren-error-code'] === 'ERR_WARREN_7010' ? r : null;
    });
    expectError(refused, 503, 'ERR_WARREN_7010');
    expect(refused.json().msg).toMatch(/request_headers: add: the value of "X-Price"\W.*a character not allowed in a header/);
    for (let i = 0; i < 3; i++) expectError(await request('/stored-bad/again'), 503, 'ERR_WARREN_7010');
    expect(alive()).toBe(true);
    const other = await request('/still-ok/x');
    expect([other.status, other.headers['x-ok']]).toEqual([200, '1']);
    expect(c.a.output()).toContain('route configuration not applicable');
  });

  it('a response head Node refuses to write answers 502 (7004), with or without response stages; the process survives', async () => {
    await route('/plain', {});
    await route('/edited', { response_headers: { add: { 'X-Edited': '1' } } });
    for (const p of ['/plain/bad-reason', '/edited/bad-reason']) {
      const r = await request(p);
      expectError(r, 502, 'ERR_WARREN_7004');
      expect(r.json().msg).toMatch(/cannot be sent/);
    }
    expect(alive()).toBe(true);
    const next = await request('/edited/fine');
    expect([next.status, next.headers['x-edited'], next.json().url]).toEqual([200, '1', '/edited/fine']);
  });
});

describe('Host (ngrok: "Rewrite Host header")', () => {
  it('request_headers.add Host: the upstream sees exactly one Host, the configured one; X-Forwarded-Host keeps the public host', async () => {
    await route('/host-rewrite', { request_headers: { add: { Host: 'internal.example:8080', 'X-A': 'a' } } });
    const r = await request('/host-rewrite/x');
    expect(r.status, r.body).toBe(200);
    const seen = r.json();
    const raw: string[] = seen.rawHeaders;
    const hosts = raw.flatMap((name, i) => (i % 2 === 0 && name.toLowerCase() === 'host' ? [raw[i + 1]] : []));
    expect(hosts).toEqual(['internal.example:8080']);
    expect([seen.headers.host, seen.headers['x-forwarded-host'], seen.headers['x-a']]).toEqual(['internal.example:8080', HOST, 'a']);
    // Routing happened on the public host: a route of the same edge without the module is untouched.
    await route('/host-kept', {});
    const kept = (await request('/host-kept/x')).json();
    expect([kept.headers.host, kept.headers['x-forwarded-host']]).toEqual([HOST, HOST]);
  });

  it('the API refuses request_headers.add Host that is not host[:port], and request_headers.remove Host', async () => {
    const bad = await api('POST', `/edges/https/${c.edgeId}/routes`, c.routeBody('/refused', { request_headers: { add: { Host: 'user@internal.example' } } }));
    expect([bad.status, bad.body.error_code, bad.body.details?.field]).toEqual([400, 'ERR_WARREN_2104', 'request_headers.add.Host']);
    expect(bad.body.msg).toMatch(/^request_headers\.add\.Host: the Host header must be host\[:port\]/);
    const remove = await api('POST', `/edges/https/${c.edgeId}/routes`, c.routeBody('/refused', { request_headers: { remove: ['Host'] } }));
    expect([remove.status, remove.body.error_code, remove.body.details?.field]).toEqual([400, 'ERR_WARREN_2104', 'request_headers.remove[0]']);
    expect(remove.body.msg).toBe('request_headers.remove[0]: header "Host" cannot be removed: HTTP/1.1 requires a Host header; to rewrite it, set it in add (e.g. "Host": "localhost")');
  });

  it('response_headers adds and removes Host on the response', async () => {
    await route('/resp-host-add', { response_headers: { add: { Host: 'edge.example' } } });
    const added = await request('/resp-host-add/x');
    expect([added.status, added.headers.host, added.json().headers.host]).toEqual([200, 'edge.example', HOST]);
    await route('/resp-host-remove', { response_headers: { remove: ['host'] } });
    const removed = await request('/resp-host-remove/x');
    expect([removed.status, removed.headers.host, removed.headers['x-upstream']]).toEqual([200, undefined, 'yes']);
    // Without the module the upstream's Host response header goes through.
    expect((await request('/host-kept/y')).headers.host).toBe('upstream.internal');
  });
});

describe('compression', () => {
  it('keeps every Vary field of the upstream and adds Accept-Encoding once', async () => {
    await route('/vary', { compression: {} });
    const r = await request('/vary/two-vary', { 'accept-encoding': 'gzip' });
    expect([r.status, r.headers['content-encoding'], r.headers.vary]).toEqual([200, 'gzip', 'Origin, Cookie, Accept-Encoding']);
    expect(JSON.parse(gunzipSync(r.raw).toString()).url).toBe('/vary/two-vary');
    const plain = await request('/vary/two-vary', { 'accept-encoding': 'identity' });
    expect([plain.status, plain.headers['content-encoding'], plain.headers.vary]).toEqual([200, undefined, 'Origin, Cookie, Accept-Encoding']);
  });
});
