import { createHash, randomBytes } from 'node:crypto';
import zlib from 'node:zlib';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { Redis } from 'ioredis';
import { bufferKey } from '@warren/shared';
import { waitFor } from '../support/cluster.js';
import { startPolicyCluster, type PolicyCluster } from '../support/policy-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * The traffic-policy `set-vars` and `log` actions through real processes: a control plane that
 * validates the policies (bad ones are 400s naming the field), an ingress, our agent and an
 * upstream that echoes the request headers it got. The account subscribes a destination to
 * `http_request_complete.v0`; the events' `traffic_policy.logs` are read from the destination's
 * Redis buffer (no worker runs).
 */

const HOST = 'vars.e2e.test';
const redisUrl = inject('redisUrl');
const prefix = `warren_test_${inject('runId')}_${randomBytes(3).toString('hex')}`;
let c: PolicyCluster;
let redis: Redis;
let edgeId: string;
let destId: string;

const api = (method: string, p: string, body?: unknown) => c.api(method, p, body);
const request = (p: string, headers: Record<string, string> = {}) => c.request(p, { headers });
const routeBody = (match: string, policy: string) => c.routeBody(match, { traffic_policy: { value: policy } });
/** The echo upstream's view of the request headers, each read as the UTF-8 text its bytes are (node:http gives them one character per byte). */
const echoedHeaders = (echo: { headers: Record<string, string> }) => Object.fromEntries(Object.entries(echo.headers).map(([k, v]) => [k, Buffer.from(v, 'latin1').toString('utf8')]));

beforeAll(async () => {
  redis = new Redis(redisUrl);
  c = await startPolicyCluster({ name: 'vars', host: HOST, ingressEnv: () => ({ REDIS_URL: redisUrl, RATE_LIMIT_SERVER_ID: `${prefix}-rl`, EVENTS_PREFIX: prefix }) });
  ({ edgeId } = c);
  destId = (await c.apiExpecting(201, 'POST', '/event_destinations', { target: { datadog: { api_key: 'dummy-datadog-key' } } })).id;
  await c.apiExpecting(201, 'POST', '/event_subscriptions', { sources: [{ type: 'http_request_complete.v0' }], destination_ids: [destId] });
}, CLUSTER_HOOK_MS);

afterAll(async () => {
  await c?.stop();
  if (redis) {
    const keys = await redis.keys(`${prefix}*`);
    if (keys.length) await redis.del(...keys);
    redis.disconnect();
  }
}, 60_000);

const POLICY = `
inbound:
  - actions:
      - type: set-vars
        config:
          vars:
            - user: "\${size(getReqHeader('x-user')) > 0 ? getReqHeader('x-user')[0] : 'anonymous'}"
            - tier: "\${vars.user == 'alice' ? 'gold' : 'basic'}"
            - greeting: Hello, \${vars.user}!
            - limits: {rpm: 60, paths: [/vars]}
  - expressions: ["vars.tier == 'gold'", "vars.limits.rpm == 60"]
    actions:
      - type: add-headers
        config: {headers: {x-tier: "\${vars.tier}", x-greeting: "\${vars.greeting}"}}
      - type: log
        config:
          metadata:
            message: gold request
            user: \${vars.user}
            path: \${req.path}
            n: \${size(vars.user)}
            limits: \${vars.limits}
  - expressions: ["vars.never_set == 'x'"]
    actions: [{type: custom-response, config: {status_code: 403}}]
outbound:
  - expressions: ["!has(vars.user)"]
    actions:
      - type: set-vars
        config: {vars: [{status: "\${res.status_code}"}]}
      - type: add-headers
        config: {headers: {x-out-status: "\${vars.status}"}}
      - type: log
        config: {metadata: {phase: outbound, status: "\${vars.status}"}}
`;

describe('set-vars and log on live traffic', () => {
  it('refuses bad set-vars and log configs with a 400 naming the field', async () => {
    const bad: [string, RegExp][] = [
      ['inbound:\n  - actions:\n      - type: set-vars\n        config: {vars: [{my-var: 1}]}\n', /inbound\[0\]\.actions\[0\]\.config\.vars\[0\]: "my-var" is not a valid variable name/],
      ['inbound:\n  - actions:\n      - type: set-vars\n        config: {vars: [{a: 1, b: 2}]}\n', /inbound\[0\]\.actions\[0\]\.config\.vars\[0\]: must set exactly one variable/],
      ['inbound:\n  - actions:\n      - type: set-vars\n        config: {vars: [{a: "${req.nope}"}]}\n', /inbound\[0\]\.actions\[0\]\.config\.vars\[0\]\.a: \$\{…\} does not compile/],
      [JSON.stringify({ inbound: [{ actions: [{ type: 'set-vars', config: { vars: Array.from({ length: 65 }, (_, i) => ({ [`v${i}`]: i })) } }] }] }), /config\.vars: must have at most 64 entries/],
      ['outbound:\n  - actions:\n      - type: log\n        config: {metadata: {msg: "${req.path"}}\n', /outbound\[0\]\.actions\[0\]\.config\.metadata\.msg: \$\{…\} unterminated/],
      [JSON.stringify({ inbound: [{ actions: [{ type: 'log', config: { metadata: { msg: 'x'.repeat(5000) } } }] }] }), /config\.metadata\.msg: value is over 4096 characters/],
    ];
    for (const [policy, message] of bad) {
      const r = await api('POST', `/edges/https/${edgeId}/routes`, routeBody('/bad', policy));
      expect(r.status, policy).toBe(400);
      expect(r.body.msg).toMatch(message);
    }
  });

  it('sets variables for later rules of the same direction, and logs to http_request_complete.v0', async () => {
    const created = await api('POST', `/edges/https/${edgeId}/routes`, routeBody('/vars', POLICY));
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    await waitFor('the route serves', async () => (await request('/vars/ready')).status === 200, 20_000);

    const alice = await request('/vars/a', { 'x-user': 'alice' });
    expect(alice.status).toBe(200);
    const seen = JSON.parse(alice.body).headers;
    expect([seen['x-tier'], seen['x-greeting']]).toEqual(['gold', 'Hello, alice!']);
    // Outbound rules have their own vars (ngrok scopes them to a phase): `vars.user` is unset there.
    expect(alice.headers['x-out-status']).toBe('200');

    const bob = await request('/vars/b', { 'x-user': 'bob' });
    expect(bob.status).toBe(200); // the rule reading an unset variable is skipped (it has no deny action, which would fail closed)
    expect(JSON.parse(bob.body).headers['x-tier']).toBeUndefined();

    const events = await waitFor('both events', async () => {
      const all = (await redis.lrange(bufferKey(prefix, destId), 0, -1)).map((s) => JSON.parse(s) as { event_type: string; object: any });
      const mine = all.filter((e) => e.event_type === 'http_request_complete.v0' && ['/vars/a', '/vars/b'].includes(e.object.http.request.url.path));
      return mine.length >= 2 ? mine : null;
    });
    const byPath = Object.fromEntries(events.map((e) => [e.object.http.request.url.path, e.object]));
    expect(byPath['/vars/a'].traffic_policy).toEqual({
      logs: [
        { metadata: { message: 'gold request', user: 'alice', path: '/vars/a', n: 5, limits: { rpm: 60, paths: ['/vars'] } } },
        { metadata: { phase: 'outbound', status: 200 } },
      ],
    });
    expect(byPath['/vars/b'].traffic_policy).toEqual({ logs: [{ metadata: { phase: 'outbound', status: 200 } }] });
    expect(byPath['/vars/a'].warren).toMatchObject({ edge_id: edgeId, rate_limit: null });
  });
});

describe("ngrok's macros and the normalized req.url on live traffic", () => {
  it('req.url is the normalized URL: the spelling of Host cannot pass a deny on req.url', async () => {
    await c.policyRoute(
      '/norm',
      `
inbound:
  - expressions: ["req.url.startsWith('http://${HOST}/norm/admin')"]
    actions: [{type: deny, config: {status_code: 403}}]
  - actions:
      - type: add-headers
        config: {headers: {x-url: "\${req.url}", x-authority: "\${req.url.authority}", x-url-host: "\${req.url.host}"}}
`,
    );
    // Every spelling routes to the edge (the ingress lower-cases Host, drops a trailing dot and
    // falls back from an unknown port); each must see the same URL.
    // A port the edge does not serve (8080, 9999: routing falls back to its hostport) is not shown
    // as if it were, so it cannot pass the deny either.
    for (const host of [HOST, HOST.toUpperCase(), `${HOST}:80`, `${HOST.toUpperCase()}:80`, `${HOST}.`, `Vars.E2E.test:0080`, `${HOST.toUpperCase()}:8080`, `${HOST}:9999`]) {
      const denied = await c.request('/norm/admin/panel', { headers: { host } });
      expect(denied.status, host).toBe(403);
      const seen = (await c.request('/norm/public?a=1', { headers: { host } })).json().headers;
      expect([seen['x-url'], seen['x-authority'], seen['x-url-host']], host).toEqual([`http://${HOST}/norm/public?a=1`, HOST, HOST]);
    }
  });

  it('hasReqHeader, hasQueryParam, getReqCookie, hasReqCookie, inCidrRange(s), hasResHeader, getResCookie and hasResCookie', async () => {
    await c.policyRoute(
      '/mac-in',
      `
inbound:
  - expressions: ["!hasReqHeader('X-Api-Key')"]
    actions: [{type: deny, config: {status_code: 401}}]
  - expressions: ["!inCidrRanges(conn.client_ip, ['10.0.0.0/8', '127.0.0.0/8', '::1/128'])"]
    actions: [{type: deny, config: {status_code: 403}}]
  - expressions: ["inCidrRange(conn.client_ip, '127.0.0.1/32')", "hasReqCookie('session')", "hasQueryParam('debug')"]
    actions:
      - type: custom-response
        config: {status_code: 200, body: "session=\${getReqCookie('session').value} theme=[\${getReqCookie('theme').value}]"}
`,
    );
    expect((await c.request('/mac-in/x')).status).toBe(401);
    const r = await c.request('/mac-in/x?debug', { headers: { 'x-api-key': 'k', cookie: 'theme=dark; session="s-1"; session=s-2' } });
    expect([r.status, r.body]).toEqual([200, 'session=s-1 theme=[dark]']);
    // Without the query parameter (or the cookie) the rule does not apply: the upstream answers.
    const plain = await c.request('/mac-in/x?other=1', { headers: { 'x-api-key': 'k', cookie: 'session=s-1' } });
    expect(plain.status).toBe(200);
    expect(plain.json().url).toBe('/mac-in/x?other=1');
    const noCookie = await c.request('/mac-in/x?debug', { headers: { 'x-api-key': 'k', cookie: 'sessions=1; theme=dark' } });
    expect(noCookie.json().url).toBe('/mac-in/x?debug');

    // The response's cookies: one set by the policy itself (later outbound rules see it).
    await c.policyRoute(
      '/mac-out',
      `
outbound:
  - actions:
      - type: add-headers
        config: {headers: {set-cookie: "sid=abc123; Path=/app; Secure; HttpOnly; SameSite=Strict"}}
  - expressions: ["hasResHeader('Content-Type')", "hasResCookie('sid') && getResCookie('sid').secure", "!hasResCookie('nope')"]
    actions:
      - type: add-headers
        config: {headers: {x-res-cookie: "\${getResCookie('sid').value + ' ' + getResCookie('sid').path + ' ' + getResCookie('sid').same_site + ' ' + string(getResCookie('sid').http_only)}"}}
`,
    );
    const out = await c.request('/mac-out/x');
    expect(out.status).toBe(200);
    expect(out.headers['x-res-cookie']).toBe('abc123 /app Strict true');
    expect(out.headers['set-cookie']).toEqual(['sid=abc123; Path=/app; Secure; HttpOnly; SameSite=Strict']);

    // A literal invalid CIDR is a 400 naming the expression; so is a response macro in an inbound rule.
    const bad = await c.tryPolicy(`inbound:\n  - expressions: ["inCidrRanges(conn.client_ip, ['10.0.0.0/8', '10.0.0.0/33'])"]\n    actions: [{type: deny}]\n`);
    expect(bad.status).toBe(400);
    expect(bad.body.msg).toMatch(/inbound\[0\]\.expressions\[0\]: does not compile: inCidrRanges\(\): the prefix length of "10\.0\.0\.0\/33" is over 32/);
    const outOnly = await c.tryPolicy(`inbound:\n  - expressions: ["hasResCookie('sid')"]\n    actions: [{type: deny}]\n`);
    expect(outOnly.status).toBe(400);
    expect(outOnly.body.msg).toMatch(/inbound\[0\]\.expressions\[0\]: does not compile: found no matching overload for 'hasResCookie\(string\)'/);
  });

  it("ngrok's string, base64, URL and hash macros in rules, set-vars and header interpolations", async () => {
    const keyHash = createHash('sha256').update('open-sesame').digest('hex');
    await c.policyRoute(
      '/str',
      `
inbound:
  - expressions: ["hash.sha256(hasReqHeader('x-key') ? getReqHeader('x-key')[0] : '') != '${keyHash}'"]
    actions: [{type: deny, config: {status_code: 401}}]
  - expressions: ["hasReqHeader('x-b64') && base64.decode(getReqHeader('x-b64')[0]) == b'blocked'"]
    actions: [{type: deny, config: {status_code: 403}}]
  - actions:
      - type: set-vars
        config: {vars: [{who: "\${req.headers['x-name'][0]}"}, {path: "\${req.path}"}]}
      - type: add-headers
        config:
          headers:
            x-lower: "\${req.headers['x-name'][0].lower()}"
            x-more: "\${vars.who.upper() + ' ' + vars.who.lower().encodeBase64() + ' ' + vars.who.lower().crc32('base64') + ' ' + url.escape(vars.path) + ' ' + vars.path.replace('/', '-', 2)}"
`,
    );
    expect((await c.request('/str/a', { headers: { 'x-name': 'Alice' } })).status).toBe(401);
    expect((await c.request('/str/a', { headers: { 'x-key': 'wrong', 'x-name': 'Alice' } })).status).toBe(401);
    const key = { 'x-key': 'open-sesame' };
    // Header values are UTF-8 text, as in ngrok: the client sends the UTF-8 bytes of 'ÄLICE'
    // (node:http writes a header string one byte per character), and the upstream's echo is
    // read back the same way.
    const utf8 = (text: string) => Buffer.from(text, 'utf8').toString('latin1');
    const ok = await c.request('/str/a;b/c', { headers: { ...key, 'x-name': utf8('ÄLICE') } });
    expect(ok.status).toBe(200);
    const seen = echoedHeaders(ok.json());
    expect(seen['x-lower']).toBe('älice');
    const crc = Buffer.alloc(4);
    crc.writeUInt32BE(zlib.crc32('älice'));
    expect(seen['x-more']?.split(' ')).toEqual(['ÄLICE', Buffer.from('älice').toString('base64'), crc.toString('base64'), '%2Fstr%2Fa%3Bb%2Fc', '-str-a;b/c']);
    // base64.decode: a match denies; invalid base64 is an evaluation error, and the rule (a deny)
    // fails closed; other values pass.
    expect((await c.request('/str/x', { headers: { ...key, 'x-name': 'a', 'x-b64': Buffer.from('blocked').toString('base64') } })).status).toBe(403);
    expect((await c.request('/str/x', { headers: { ...key, 'x-name': 'a', 'x-b64': 'not base64!' } })).status).toBe(403);
    expect((await c.request('/str/x', { headers: { ...key, 'x-name': 'a', 'x-b64': Buffer.from('fine').toString('base64') } })).status).toBe(200);
    // A name Warren still lacks is a 400 naming it.
    const bad = await c.tryPolicy(`inbound:\n  - expressions: ["secrets.get('vault', 'key') == 'x'"]\n    actions: [{type: deny}]\n`);
    expect(bad.status).toBe(400);
    expect(bad.body.msg).toMatch(/ngrok's secrets\.get\(\) is not supported by Warren/);
  });

  it("ngrok's JSON, query string, URL, basic auth, list and 64-bit hash macros on live traffic", async () => {
    await c.policyRoute(
      '/more',
      `
inbound:
  - expressions: ["hasReqHeader('x-next') && !getReqHeader('x-next')[0].isURL()"]
    actions: [{type: deny, config: {status_code: 400}}]
  - expressions: ["hasReqHeader('x-next') && url.parse(getReqHeader('x-next')[0])['hostname'] != 'app.example.com'"]
    actions: [{type: deny, config: {status_code: 403}}]
  - actions:
      - type: add-headers
        config:
          headers:
            x-q: "\${queryString.decode(req.url.query)['who']}"
            x-qs: "\${queryString.encode({'b': 'x y', 'a': '&'})}"
            x-json: "\${json.encode({'path': req.path, 'n': size(lists.range(3)), 'ok': true})}"
            x-auth: "\${basic_auth.encode('user', 'pa:ss')}"
            x-hash: "\${hash.xxhash64('hello')} \${'hello'.crc64()}"
`,
    );
    const ok = await c.request('/more/p?who=J%C3%B6rg&x=1', { headers: { 'x-next': 'https://app.example.com:8443/a?b=c' } });
    expect(ok.status).toBe(200);
    const seen = echoedHeaders(ok.json());
    expect(seen['x-q']).toBe('Jörg');
    expect(seen['x-qs']).toBe('a=%26&b=x+y');
    expect(JSON.parse(seen['x-json']!)).toEqual({ n: 3, ok: true, path: '/more/p' });
    expect(seen['x-json']).toBe('{"n":3,"ok":true,"path":"/more/p"}');
    expect(seen['x-auth']).toBe(`Basic ${Buffer.from('user:pa:ss').toString('base64')}`);
    // ngrok's documented values for 'hello'.
    expect(seen['x-hash']).toBe('26c7827d889f6da3 3c3eeee2d8100000');
    // Not a URL: 400; another host: 403.
    expect((await c.request('/more/p', { headers: { 'x-next': 'not a url' } })).status).toBe(400);
    expect((await c.request('/more/p', { headers: { 'x-next': 'https://evil.example.net/' } })).status).toBe(403);
  });

  it("ngrok's format, list, rand.int, isQueryString and isPrivateIp macros, and add-headers' headers_added, on live traffic", async () => {
    await c.policyRoute(
      '/fmt',
      `
inbound:
  - expressions: ["req.url.query != '' && !req.url.query.isQueryString()"]
    actions: [{type: deny, config: {status_code: 400}}]
  - actions:
      - type: add-headers
        config:
          headers:
            x-fmt: "\${'%s has %d items costing %.2f'.format([req.path, size(getReqHeader('x-list')[0].split(',')), 2.5])}"
            x-sorted: "\${['pear', getReqHeader('x-fruit')[0], 'apple', 'fig'].sort().join(',')}"
            x-distinct: "\${['pear', getReqHeader('x-fruit')[0], 'apple', 'fig'].distinct().join(',')}"
            x-by-length: "\${['pear', getReqHeader('x-fruit')[0], 'apple', 'fig'].sortBy(s, size(s)).join(',')}"
            x-slice: "\${['pear', getReqHeader('x-fruit')[0], 'apple', 'fig'].slice(1, 3).join(',')}"
            x-flat: "\${json.encode([[1, [2]], [3]].flatten())}"
            x-private: "\${conn.client_ip.isPrivateIp()} \${'10.1.2.3'.isPrivateIp()}"
            x-dice: "\${rand.int(1, 6)}"
  - actions:
      - type: add-headers
        config:
          headers:
            x-added: "\${size(actions.ngrok.add_headers.headers_added)} \${actions.ngrok.add_headers.headers_added['x-slice']}"
`,
    );
    const ok = await c.request('/fmt/p?a=1&b=2', { headers: { 'x-list': 'pear,fig,apple,fig', 'x-fruit': 'fig' } });
    expect(ok.status).toBe(200);
    const seen = echoedHeaders(ok.json());
    expect(seen['x-fmt']).toBe('/fmt/p has 4 items costing 2.50');
    expect(seen['x-sorted']).toBe('apple,fig,fig,pear');
    expect(seen['x-distinct']).toBe('pear,fig,apple');
    expect(seen['x-by-length']).toBe('fig,fig,pear,apple');
    expect(seen['x-slice']).toBe('fig,apple');
    expect(seen['x-flat']).toBe('[1,[2],3]');
    // The client is 127.0.0.1: loopback is not private (Go's net.IP.IsPrivate).
    expect(seen['x-private']).toBe('false true');
    expect(Number(seen['x-dice'])).toBeGreaterThanOrEqual(1);
    expect(Number(seen['x-dice'])).toBeLessThanOrEqual(6);
    // The previous add-headers' result: its 8 headers, each as sent.
    expect(seen['x-added']).toBe('8 fig,apple');
    // A pair without a key is not a query string.
    expect((await c.request('/fmt/p?a=1&=b', { headers: { 'x-list': 'a', 'x-fruit': 'b' } })).status).toBe(400);
  });
});
