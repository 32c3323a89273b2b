import http from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { echoUrlAndHeaders, startPolicyCluster, type PolicyCluster } from '../support/policy-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * ngrok's request, connection and response variables that Warren fills
 * (https://ngrok.com/docs/traffic-policy/variables/req/, …/conn/, …/res/) on live traffic
 * through real processes: a control plane that validates the policy (an ngrok name Warren does
 * not have is a 400 saying so), an ingress, our agent and an upstream that echoes the request
 * headers it got.
 */

const HOST = 'ngrok-vars.e2e.test';

/** The echo upstream; under /resvars it also sets cookies, a Location and a Content-Encoding for res.* to read. */
const upstreamSettingCookies: http.RequestListener = (req, res) => {
  if (req.url?.startsWith('/resvars')) {
    res.setHeader('set-cookie', ['sid=abc; Path=/; Secure; HttpOnly', 'sid=deeper; Path=/resvars/app', 'theme=dark; Max-Age=60']);
    res.setHeader('location', '/next');
    res.setHeader('content-encoding', 'identity');
  }
  echoUrlAndHeaders(req, res);
};
let c: PolicyCluster;

beforeAll(async () => {
  c = await startPolicyCluster({ name: 'ngrokvars', host: HOST, upstream: upstreamSettingCookies });
}, CLUSTER_HOOK_MS);

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
      [{ on_http_request: [{ expressions: ["req.url.user_password == 'x'"], actions: [{ type: 'deny' }] }] }, /expressions\[0\]: does not compile: ngrok's req\.url\.user_password is not supported by Warren/],
      [{ on_http_request: [{ actions: [{ type: 'add-headers', config: { headers: { 'x-trailers': '${req.trailers}' } } }] }] }, /x-trailers: \$\{…\} does not compile: ngrok's req\.trailers is not supported by Warren/],
      [{ on_http_request: [{ expressions: ["secrets.get('vault', 'key') == 'x'"], actions: [{ type: 'deny' }] }] }, /ngrok's secrets\.get\(\) is not supported by Warren/],
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
    // RFC 3339 as Go writes a time: the fraction without trailing zeros (none at all on a whole second).
    expect(seen.headers['x-received']).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d*[1-9])?Z$/);
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

  it('conn.ts.start, conn.bytes_in/out, conn.server_region, req.content_encoding, req.location', async () => {
    await c.policyRoute('/connvars', {
      on_http_request: [
        {
          actions: [
            {
              type: 'add-headers',
              config: {
                headers: {
                  'x-start': '${conn.ts.start}',
                  'x-bytes': '${conn.bytes_in} ${conn.bytes_out}',
                  'x-region': '${conn.server_region}',
                  'x-encodings': "${req.content_encoding.join(',')}",
                  'x-location': '${req.location}',
                },
              },
            },
          ],
        },
      ],
    });
    // Two requests on one keep-alive connection: the same start, bytes that grow.
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    const get = (headers: Record<string, string> = {}) =>
      new Promise<{ status: number; seen: Record<string, string> }>((resolve, reject) => {
        const req = http.request({ host: '127.0.0.1', port: c.a.http, path: '/connvars/x', agent, headers: { host: HOST, ...headers } }, (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (d: Buffer) => chunks.push(d));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, seen: (JSON.parse(Buffer.concat(chunks).toString()) as { headers: Record<string, string> }).headers }));
        });
        req.setTimeout(10_000, () => req.destroy(new Error('timed out')));
        req.on('error', reject);
        req.end();
      });
    const before = Date.now();
    try {
      const first = await get({ 'content-encoding': 'GZIP, br', location: '/from-client' });
      await new Promise((r) => setTimeout(r, 50));
      const second = await get();
      expect([first.status, second.status]).toEqual([200, 200]);
      const start = Date.parse(first.seen['x-start']!);
      expect(first.seen['x-start']).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d*[1-9])?Z$/);
      expect(start).toBeGreaterThanOrEqual(before - 1000);
      expect(start).toBeLessThanOrEqual(Date.now());
      expect(second.seen['x-start']).toBe(first.seen['x-start']);
      const [in1, out1] = first.seen['x-bytes']!.split(' ').map(Number);
      const [in2, out2] = second.seen['x-bytes']!.split(' ').map(Number);
      // The first request's head was read and nothing sent yet; the second sees the first's answer.
      expect(in1).toBeGreaterThan(50);
      expect(out1).toBe(0);
      expect(in2).toBeGreaterThan(in1!);
      expect(out2).toBeGreaterThan(100);
      expect(first.seen['x-region']).toBe(c.a.nodeId);
      expect(first.seen['x-encodings']).toBe('gzip,br');
      expect(first.seen['x-location']).toBe('/from-client');
      expect(second.seen['x-encodings']).toBe('');
      expect(second.seen['x-location']).toBe('');
    } finally {
      agent.destroy();
    }
  });

  it('res.cookies, res.location, res.content_encoding on the response', async () => {
    await c.policyRoute('/resvars', {
      on_http_response: [
        {
          expressions: ["res.cookies['sid'][0].path == '/resvars/app' && res.cookies['sid'][1].secure && res.cookies['theme'][0].max_age == duration('60s') && size(res.cookies) == 2"],
          actions: [{ type: 'add-headers', config: { headers: { 'x-cookies-checked': 'yes' } } }],
        },
        // The longest path first.
        { expressions: ["res.cookies['sid'][0].value == 'deeper' && res.cookies['sid'][1].value == 'abc'"], actions: [{ type: 'add-headers', config: { headers: { 'x-sid-order': 'ok' } } }] },
        { expressions: ["res.location == '/next' && res.content_encoding == ['identity']"], actions: [{ type: 'add-headers', config: { headers: { 'x-location-encoding': 'ok' } } }] },
      ],
    });
    const r = await send('/resvars/app/page');
    expect(r.status, r.body).toBe(200);
    expect([r.headers['x-cookies-checked'], r.headers['x-sid-order'], r.headers['x-location-encoding']]).toEqual(['yes', 'ok', 'ok']);
  });

  it("req.user_agent's fields: ngrok's user agent filtering examples (Edge users, bots denied)", async () => {
    await c.policyRoute('/ua', {
      on_http_request: [
        { expressions: ["req.user_agent.name == 'Edge'"], actions: [{ type: 'custom-response', config: { status_code: 200, body: 'Hello Edge User!' } }] },
        { expressions: ['req.user_agent.is_bot'], actions: [{ type: 'deny', config: { status_code: 403 } }] },
        { actions: [{ type: 'add-headers', config: { headers: { 'x-ua': "${req.user_agent.name}|${req.user_agent.os}|${req.user_agent.device}|${string(req.user_agent.is_mobile)}|${req.user_agent}" } } }] },
      ],
    });
    const edge = 'Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36 Edg/120.0.2210.91';
    const iphone = 'Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.1 Mobile/15E148 Safari/604.1';
    const e = await send('/ua/x', { headers: { 'user-agent': edge } });
    expect([e.status, e.body]).toEqual([200, 'Hello Edge User!']);
    expect((await send('/ua/x', { headers: { 'user-agent': 'Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)' } })).status).toBe(403);
    expect((await send('/ua/x', { headers: { 'user-agent': 'curl/8.5.0' } })).status).toBe(403);
    const phone = await send('/ua/x', { headers: { 'user-agent': iphone } });
    expect(phone.status).toBe(200);
    expect(JSON.parse(phone.body).headers['x-ua']).toBe(`Safari|iOS|iPhone|true|${iphone}`);
  });
});
