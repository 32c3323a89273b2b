import http from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPolicyCluster, type PolicyCluster } from '../support/policy-cluster.js';

/**
 * ngrok's request, connection and response variables that Warren fills
 * (https://ngrok.com/docs/traffic-policy/variables/req/, …/conn/, …/res/) on live traffic
 * through real processes: a control plane that validates the policy (an ngrok name Warren does
 * not have is a 400 saying so), an ingress, our agent and an upstream that echoes the request
 * headers it got.
 */

const HOST = 'ngrok-vars.e2e.test';
let c: PolicyCluster;

beforeAll(async () => {
  c = await startPolicyCluster({ name: 'ngrokvars', host: HOST });
}, 90_000);

afterAll(async () => {
  await c?.stop();
}, 60_000);

const POLICY = `
on_http_request:
  - expressions: ["req.content_length > 10"]
    actions:
      - type: deny
        config: {status_code: 413}
  - actions:
      - type: add-headers
        config:
          headers:
            x-client-port: "\${conn.client_port}"
            x-server-ip: "\${conn.server_ip}"
            x-version: "\${req.version}"
            x-received: "\${req.ts.header_received}"
            x-length: "\${req.content_length}"
            x-type: "\${req.content_type}"
            x-raw: "\${req.url.raw_path}"
            x-port: "\${req.url.port}"
            x-endpoint: "\${endpoint.id} \${endpoint.protocol} \${endpoint.host} \${endpoint.port} \${endpoint.addr}"
  - expressions: ["req.content_type.parameters['charset'] == 'UTF-8'"]
    actions:
      - type: add-headers
        config: {headers: {x-second-a: "yes"}}
on_http_response:
  - actions:
      - type: add-headers
        config:
          headers:
            x-res-type: "\${res.content_type}"
            x-res-length: "\${res.content_length}"
`;

/** A request over a socket whose local port is known (conn.client_port), optionally chunked. */
function send(path: string, o: { body?: string; chunked?: boolean; headers?: Record<string, string> } = {}): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: string; localPort: number }> {
  return new Promise((resolve, reject) => {
    const headers: Record<string, string> = { host: HOST, ...o.headers };
    if (o.chunked) headers['transfer-encoding'] = 'chunked';
    const req = http.request({ host: '127.0.0.1', port: c.a.http, path, method: o.body === undefined ? 'GET' : 'POST', agent: false, headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (d: Buffer) => chunks.push(d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString(), localPort }));
    });
    let localPort = 0;
    req.on('socket', (s) => s.on('connect', () => (localPort = s.localPort ?? 0)));
    req.setTimeout(10_000, () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    if (o.chunked && o.body !== undefined) {
      // Two writes: sent chunked, with no Content-Length.
      req.write(o.body.slice(0, 5));
      req.end(o.body.slice(5));
    } else req.end(o.body);
  });
}

describe("ngrok's variables on live traffic", () => {
  it("refuses a policy naming an ngrok variable or macro Warren does not have, saying so", async () => {
    const cases: [unknown, RegExp][] = [
      [{ on_http_request: [{ expressions: ['conn.bytes_in > 1000'], actions: [{ type: 'deny' }] }] }, /expressions\[0\]: does not compile: ngrok's conn\.bytes_in is not supported by Warren/],
      [{ on_http_request: [{ actions: [{ type: 'add-headers', config: { headers: { 'x-start': '${conn.ts.start}' } } }] }] }, /x-start: \$\{…\} does not compile: ngrok's conn\.ts\.start is not supported by Warren/],
      [{ on_http_request: [{ expressions: ["hash.xxhash64(getReqHeader('x')[0]) == 'a'"], actions: [{ type: 'deny' }] }] }, /ngrok's hash\.xxhash64\(\) is not supported by Warren/],
    ];
    for (const [policy, msg] of cases) {
      const r = await c.tryPolicy(policy);
      expect(r.status, JSON.stringify(r.body)).toBe(400);
      expect(String(r.body.msg)).toMatch(msg);
    }
  });

  it('denies on req.content_length, and interpolates the request, connection and response variables', async () => {
    await c.policyRoute('/ngrok', POLICY);

    const big = await send('/ngrok/upload', { body: 'x'.repeat(11) });
    expect(big.status).toBe(413);

    const before = Date.now();
    const ok = await send('/ngrok/a/../upload?q=1', { body: 'x'.repeat(10), headers: { 'content-type': 'Text/Plain; charset=UTF-8', cookie: 'a=1; b=2; a=3' } });
    expect(ok.status, ok.body).toBe(200);
    const seen = JSON.parse(ok.body) as { url: string; headers: Record<string, string> };
    // The ingress normalised the path it sent on; req.url.raw_path is the one the client sent.
    expect(seen.url).toBe('/ngrok/upload?q=1');
    expect(seen.headers['x-raw']).toBe('/ngrok/a/../upload');
    expect(seen.headers['x-client-port']).toBe(String(ok.localPort));
    expect(seen.headers['x-server-ip']).toBe('127.0.0.1');
    expect(seen.headers['x-version']).toBe('HTTP/1.1');
    expect(seen.headers['x-length']).toBe('10');
    expect(seen.headers['x-type']).toBe('text/plain');
    expect(seen.headers['x-port']).toBe('80');
    // endpoint.*: the edge, at the hostport that served the request.
    expect(seen.headers['x-endpoint']).toBe(`${c.edgeId} http ${HOST} 80 ${HOST}:80`);
    expect(seen.headers['x-second-a']).toBe('yes');
    const received = Date.parse(seen.headers['x-received']!);
    expect(seen.headers['x-received']).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    expect(Math.abs(received - before)).toBeLessThan(5_000);
    // The upstream's answer: JSON, of a length its Content-Length states or -1 when it has none.
    expect(ok.headers['x-res-type']).toBe('application/json');
    expect(ok.headers['x-res-length']).toBe(ok.headers['content-length'] ?? '-1');

    // A chunked body has no length before it has arrived: -1, which the deny does not catch.
    const chunked = await send('/ngrok/stream', { body: 'y'.repeat(20), chunked: true });
    expect(chunked.status, chunked.body).toBe(200);
    expect(JSON.parse(chunked.body).headers['x-length']).toBe('-1');

    // No body: 0.
    const get = await send('/ngrok/get');
    expect(get.status).toBe(200);
    expect(JSON.parse(get.body).headers).toMatchObject({ 'x-length': '0', 'x-raw': '/ngrok/get' });
  });

  it('req.cookies: every cookie of a name, in the order sent', async () => {
    await c.policyRoute('/cookies', {
      on_http_request: [{ expressions: ["size(req.cookies['a']) == 2"], actions: [{ type: 'custom-response', config: { status_code: 200, body: "${req.cookies['a'][0].value} then ${req.cookies['a'][1].value}" } }] }],
    });
    const r = await send('/cookies/x', { headers: { cookie: 'a=1; b=2; a=3' } });
    expect([r.status, r.body]).toEqual([200, '1 then 3']);
    // One cookie of the name: the rule does not apply.
    expect(JSON.parse((await send('/cookies/x', { headers: { cookie: 'a=1' } })).body).url).toBe('/cookies/x');
  });
});
