import { describe, expect, it } from 'vitest';
import { refusal } from './testing.js';
import { MAX_POLICY_COST } from './cost.js';
import { RATE_LIMIT_COST } from './index.js';
import { decodeTrafficPolicy, parseDurationNs, parseTrafficPolicy, SUPPORTED_ACTION_TYPES, validateTrafficPolicy, type RateLimitAction } from './index.js';

const rl = (config: Record<string, unknown>) => ({ inbound: [{ actions: [{ type: 'rate-limit', config }] }] });
const good = { name: 'per-ip', algorithm: 'sliding_window', capacity: 10, rate: '60s', bucket_key: ['conn.client_ip'] };

const fails = (doc: unknown) => refusal(doc, false);

describe('parseDurationNs', () => {
  it('reads Go-style durations', () => {
    const s = (v: string) => Number(parseDurationNs(v)! / 1_000_000_000n);
    expect(s('90s')).toBe(90);
    expect(s('10m')).toBe(600);
    expect(s('1h30m')).toBe(5400);
    expect(s('1.5m')).toBe(90);
    expect(s('24h')).toBe(86400);
    expect(parseDurationNs('500ms')).toBe(500_000_000n);
    expect(parseDurationNs('0')).toBe(0n);
  });
  it('refuses anything else', () => {
    for (const v of ['', '60', 's', '-60s', '60 s', '60sec', '1d', '1h 30m', ' 60s']) expect(parseDurationNs(v)).toBeUndefined();
  });
});

describe('parseTrafficPolicy', () => {
  it('parses YAML and returns a typed policy', () => {
    const p = parseTrafficPolicy(`
inbound:
  - name: limit
    expressions: ["req.url.path.startsWith('/api')"]
    actions:
      - type: rate-limit
        config:
          name: api
          algorithm: sliding_window
          capacity: 100
          rate: 1h30m
          bucket_key:
            - req.host
            - conn.client_ip
            - req.headers['X-Api-Key']
            - getReqHeader('X-Tenant')
`);
    expect(p.outbound).toEqual([]);
    expect(p.inbound).toHaveLength(1);
    const rule = p.inbound[0]!;
    expect(rule.name).toBe('limit');
    expect(rule.expressions).toEqual(["req.url.path.startsWith('/api')"]);
    expect(rule.actions[0]).toEqual({
      type: 'rate-limit',
      config: {
        name: 'api',
        algorithm: 'sliding_window',
        capacity: 100,
        rate: '1h30m',
        rateSeconds: 5400,
        bucket_key: ['req.host', 'conn.client_ip', "req.headers['X-Api-Key']", "getReqHeader('X-Tenant')"],
        bucketKey: [
          { kind: 'host', source: 'req.host' },
          { kind: 'client_ip', source: 'conn.client_ip' },
          { kind: 'header', name: 'x-api-key', source: "req.headers['X-Api-Key']" },
          { kind: 'header', name: 'x-tenant', source: "getReqHeader('X-Tenant')" },
        ],
        enforce: true,
      },
    });
  });

  it('reads rate-limit enforce (default true), refusing anything but a boolean', () => {
    const cfg = (p: ReturnType<typeof parseTrafficPolicy>) => (p.inbound[0]!.actions[0] as RateLimitAction).config;
    expect(cfg(parseTrafficPolicy(JSON.stringify(rl({ ...good, enforce: false })))).enforce).toBe(false);
    expect(cfg(parseTrafficPolicy(JSON.stringify(rl({ ...good, enforce: true })))).enforce).toBe(true);
    expect(cfg(parseTrafficPolicy(JSON.stringify(rl(good)))).enforce).toBe(true);
    const e = fails(rl({ ...good, enforce: 'no' }));
    expect([e.path, e.message]).toEqual(['inbound[0].actions[0].config.enforce', 'inbound[0].actions[0].config.enforce: must be true or false, got string']);
  });

  it('parses JSON, both directions, and an empty mapping', () => {
    const p = parseTrafficPolicy(JSON.stringify({ inbound: [{ actions: [{ type: 'rate-limit', config: good }] }], outbound: [{ name: 'o', actions: [{ type: 'rate-limit', config: { ...good, rate: '24h' } }] }] }));
    expect(p.inbound[0]!.name).toBe('');
    expect(p.inbound[0]!.expressions).toEqual([]);
    expect((p.outbound[0]!.actions[0] as RateLimitAction).config.rateSeconds).toBe(86400);
    expect(parseTrafficPolicy('{}')).toEqual({ inbound: [], outbound: [] });
    expect(parseTrafficPolicy('inbound:\n')).toEqual({ inbound: [], outbound: [] });
  });

  it('refuses documents that are not YAML/JSON mappings', () => {
    expect(fails('').message).toContain('empty');
    expect(fails('inbound: [').message).toContain('not valid YAML or JSON');
    expect(fails('{"inbound": [], "inbound": []}').message).toContain('not valid YAML or JSON');
    expect(fails('- a\n- b').message).toContain('must be a mapping');
    expect(fails('a: 1\n---\nb: 2').message).toContain('not valid YAML or JSON');
    expect(fails('x'.repeat(64 * 1024 + 1)).message).toContain('over 65536 bytes');
  });

  it('refuses unknown keys at every level, naming their path', () => {
    expect(fails({ on_tcp_connect: [] }).path).toBe('on_tcp_connect');
    expect(fails({ colour: [] }).message).toBe('colour: unknown field "colour"; supported: inbound, outbound, on_http_request, on_http_response');
    expect(fails({ inbound: [{ actions: [], colour: 1 }] }).path).toBe('inbound[0].colour');
    expect(fails({ inbound: [{ actions: [{ type: 'rate-limit', config: good, x: 1 }] }] }).path).toBe('inbound[0].actions[0].x');
    expect(fails(rl({ ...good, burst: 5 })).path).toBe('inbound[0].actions[0].config.burst');
  });

  it("refuses keys of the policy's own maps written as an alias, not a scalar, or <<, naming the map (review: a secret under an alias key escaped redaction)", () => {
    const wh = (config: string, extra = '') => `inbound:\n  - name: &k secret\n${extra}    actions:\n      - type: verify-webhook\n        config:\n          provider: github\n${config}`;
    const cases: [string, string, RegExp][] = [
      [wh('          *k : hook-secret-1\n'), 'inbound[0].actions[0].config', /alias \(\*k\)/],
      ['inbound:\n  - name: &t type\n    actions:\n      - *t : deny\n', 'inbound[0].actions[0]', /alias \(\*t\)/],
      ['x: &a actions\ninbound:\n  - *a : [{type: deny}]\n', 'inbound[0]', /alias/],
      ['x: &i inbound\n*i : []\n', '', /alias \(\*i\)/],
      // followed through an aliased config
      ['inbound:\n  - name: &k secret\n    actions:\n      - type: add-headers\n        config: &c {*k : x}\n', 'inbound[0].actions[0].config', /alias/],
      ['inbound:\n  - actions:\n      - type: deny\n        config: {? [a] : 1}\n', 'inbound[0].actions[0].config', /must be a string, got a list/],
      ['inbound:\n  - actions:\n      - type: deny\n        config: {<<: {status_code: 404}}\n', 'inbound[0].actions[0].config', /merge key/],
      ['<<: {inbound: []}\n', '', /merge key/],
    ];
    for (const [doc, path, msg] of cases) {
      const e = fails(doc);
      expect(e.path, doc).toBe(path);
      expect(e.message).toMatch(msg);
    }
    // Alias values stay accepted, and so do alias keys below a config (header names).
    parseTrafficPolicy('inbound:\n  - name: &t deny\n    actions:\n      - type: *t\n');
    const headers = parseTrafficPolicy('inbound:\n  - name: &h x-name\n    actions:\n      - type: add-headers\n        config: {headers: {*h : v}}\n');
    expect(headers.inbound[0]!.actions[0]).toMatchObject({ config: { headers: { 'x-name': 'v' } } });
  });

  it('refuses unknown action types', () => {
    const e = fails({ inbound: [{ actions: [{ type: 'rate-limit', config: good }, { type: 'http-request', config: {} }] }] });
    expect(e.path).toBe('inbound[0].actions[1].type');
    expect(e.message).toBe(`inbound[0].actions[1].type: action type "http-request" is not supported; supported: ${SUPPORTED_ACTION_TYPES.join(', ')}`);
    expect(fails({ outbound: [{ actions: [{ config: good }] }] }).path).toBe('outbound[0].actions[0].type');
    expect(fails({ inbound: [{ actions: [{ type: 'rate-limit' }] }] }).path).toBe('inbound[0].actions[0].config');
  });

  it('checks the rule shape', () => {
    expect(fails({ inbound: {} }).path).toBe('inbound');
    expect(fails({ inbound: [{}] }).path).toBe('inbound[0].actions');
    expect(fails({ inbound: [{ actions: [] }] }).path).toBe('inbound[0].actions');
    expect(fails({ inbound: [{ name: 5, actions: [{ type: 'rate-limit', config: good }] }] }).path).toBe('inbound[0].name');
    expect(fails({ inbound: [{ expressions: [1], actions: [{ type: 'rate-limit', config: good }] }] }).path).toBe('inbound[0].expressions[0]');
    expect(fails({ inbound: ['x'] }).path).toBe('inbound[0]');
  });

  it('checks every rate-limit config field', () => {
    const path = (config: Record<string, unknown>) => fails(rl(config)).path.replace('inbound[0].actions[0].config.', '');
    for (const k of Object.keys(good)) {
      const { [k]: _, ...rest } = good as Record<string, unknown>;
      expect(path(rest)).toBe(k);
    }
    expect(path({ ...good, name: '' })).toBe('name');
    expect(path({ ...good, name: 'n'.repeat(1024) })).toBe('name');
    expect(() => validateTrafficPolicy(rl({ ...good, name: 'é'.repeat(1023) }))).not.toThrow();
    expect(path({ ...good, algorithm: 'fixed_window' })).toBe('algorithm');
    for (const capacity of [0, 2_000_000_001, 1.5, '10', -1]) expect(path({ ...good, capacity })).toBe('capacity');
    expect(() => validateTrafficPolicy(rl({ ...good, capacity: 2_000_000_000 }))).not.toThrow();
    for (const rate of ['50s', '65s', '24h10s', '25h', '60', 60, 'soon', '0s']) expect(path({ ...good, rate })).toBe('rate');
    for (const rate of ['60s', '90s', '10m', '1h30m', '24h', '1.5m']) expect(() => validateTrafficPolicy(rl({ ...good, rate }))).not.toThrow();
    expect(path({ ...good, bucket_key: [] })).toBe('bucket_key');
    expect(path({ ...good, bucket_key: 'req.host' })).toBe('bucket_key');
    expect(path({ ...good, bucket_key: Array(11).fill('req.host') })).toBe('bucket_key');
    expect(() => validateTrafficPolicy(rl({ ...good, bucket_key: Array(10).fill('req.host') }))).not.toThrow();
    for (const el of ['req.path', "req.headers['bad header']", 'req.headers[x]', "getReqHeader('')", "getReqHeader('a'", 5])
      expect(path({ ...good, bucket_key: ['req.host', el] })).toBe('bucket_key[1]');
    expect(() => validateTrafficPolicy(rl({ ...good, bucket_key: ['req.headers["x-a"]', 'getReqHeader("X-B")'] }))).not.toThrow();
  });

  it('names the number a non-finite capacity is (YAML .inf, .nan)', () => {
    expect(fails('inbound:\n  - actions:\n      - type: rate-limit\n        config: {name: a, algorithm: sliding_window, capacity: .inf, rate: 60s, bucket_key: [req.host]}\n').message).toContain('must be an integer, got number Infinity');
    expect(fails('inbound:\n  - actions:\n      - type: rate-limit\n        config: {name: a, algorithm: sliding_window, capacity: .nan, rate: 60s, bucket_key: [req.host]}\n').message).toContain('got number NaN');
  });

  it("charges each rate-limit to the policy's cost: the limiter call and the bucket key, header values counted at 16 KiB", () => {
    const many = (n: number, bucket_key: string[]) => ({ inbound: [{ actions: Array.from({ length: n }, (_, i) => ({ type: 'rate-limit', config: { ...good, name: `rl-${i}`, bucket_key } })) }] });
    const tenHeaders = Array(10).fill("getReqHeader('a')") as string[];
    const perTen = RATE_LIMIT_COST.call + 10 * RATE_LIMIT_COST.headerElement;
    const fit = Math.floor(MAX_POLICY_COST / perTen);
    expect(fit).toBe(3);
    expect(() => validateTrafficPolicy(many(fit, tenHeaders), { checkCost: true })).not.toThrow();
    const e = refusal(many(fit + 1, tenHeaders), true);
    expect(e.path).toBe(`inbound[0].actions[${fit}].config`);
    expect(e.reason).toMatch(/^rate-limit: asking the limiter with a bucket key of 10 values \(10 from request headers, counted at 16 KiB each\) is estimated at 1\.52 ms per request at worst, which takes the policy to .* more than the 5\.00 ms allowed for a policy$/);
    // Keyed on the host: a few hundred (the 64 KiB document of 536 an audit sent is refused).
    const perHost = RATE_LIMIT_COST.call + RATE_LIMIT_COST.shortElement;
    const hosts = Math.floor(MAX_POLICY_COST / perHost);
    expect(() => validateTrafficPolicy(many(hosts, ['req.host']), { checkCost: true })).not.toThrow();
    expect(refusal(many(hosts + 1, ['req.host']), true).reason).toMatch(/^rate-limit: asking the limiter with a bucket key of 1 value is estimated/);
    // Stored policies (no cost check) still load.
    expect(() => validateTrafficPolicy(many(fit + 1, tenHeaders))).not.toThrow();
  });
});

describe('add-headers Host values', () => {
  const host = (value: string, dir: 'inbound' | 'outbound' = 'inbound') => ({ [dir]: [{ actions: [{ type: 'add-headers', config: { headers: { Host: value } } }] }] });
  it('refuses a static request Host that is not host[:port], naming it; interpolated and response ones are checked later or not at all', () => {
    for (const bad of ['[oops', '[oops]', '[]', '[::1]x', 'a b', 'host:', 'host:99999']) {
      const e = refusal(host(bad), true);
      expect([e.path, e.reason], bad).toEqual(['inbound[0].actions[0].config.headers.Host', `${JSON.stringify(bad)} is not a Host value (host[:port], an IPv6 address in brackets)`]);
    }
    for (const good of ['example.com', 'example.com:8080', '[::1]', '[2001:db8::1]:443', '10.0.0.1:80', "${req.headers['x-host'][0]}"]) expect(() => validateTrafficPolicy(host(good)), good).not.toThrow();
    expect(() => validateTrafficPolicy(host('[oops', 'outbound'))).not.toThrow();
  });
});

describe('header values written as YAML scalars', () => {
  it("takes booleans and numbers as their text (ngrok's redirect example writes `x-redirected: true`); refuses other types", () => {
    const p = parseTrafficPolicy('on_http_request:\n  - actions:\n      - type: add-headers\n        config: {headers: {x-redirected: true, x-version: 2, x-ratio: 0.5}}\n      - type: custom-response\n        config: {status_code: 200, headers: {x-n: 7}}\n');
    expect((p.inbound[0]!.actions[0] as { config: { headers: Record<string, string> } }).config.headers).toEqual({ 'x-redirected': 'true', 'x-version': '2', 'x-ratio': '0.5' });
    expect((p.inbound[0]!.actions[1] as { config: { headers: Record<string, string> } }).config.headers).toEqual({ 'x-n': '7' });
    for (const bad of [[], {}]) {
      const e = refusal({ inbound: [{ actions: [{ type: 'add-headers', config: { headers: { 'x-a': bad } } }] }] }, true);
      expect([e.path, e.reason]).toEqual(['inbound[0].actions[0].config.headers.x-a', `must be a string, got ${Array.isArray(bad) ? 'list' : 'mapping'}`]);
    }
    // As written, as Go's YAML decoder reads a scalar into a string field (`1.10` stays `1.10`).
    const written = parseTrafficPolicy('inbound:\n  - actions:\n      - type: add-headers\n        config: {headers: {x-v1: 1.10, x-v2: 0x10, x-v3: 1e3, x-v4: 007, x-v5: True}}\n');
    expect((written.inbound[0]!.actions[0] as { config: { headers: Record<string, string> } }).config.headers).toEqual({ 'x-v1': '1.10', 'x-v2': '0x10', 'x-v3': '1e3', 'x-v4': '007', 'x-v5': 'True' });
    // A missing value (`x-a:`) is a YAML null, not a text.
    expect(refusal({ inbound: [{ actions: [{ type: 'add-headers', config: { headers: { 'x-a': null } } }] }] }, true).path).toBe('inbound[0].actions[0].config.headers.x-a');
  });
});

describe("ngrok's phase names: on_http_request / on_http_response", () => {
  /** One document of each style: several actions, both phases, expressions and interpolation. */
  const doc = (req: string, res: string) => `
${req}:
  - name: limit
    expressions: ["req.url.path.startsWith('/api')"]
    actions:
      - type: rate-limit
        config: {name: api, algorithm: sliding_window, capacity: 10, rate: 60s, bucket_key: [conn.client_ip]}
      - type: add-headers
        config: {headers: {x-path: "\${req.url.path}"}}
  - actions:
      - type: basic-auth
        config: {credentials: ["alice:password-1"]}
      - type: deny
${res}:
  - expressions: ["res.status_code >= 500"]
    actions:
      - type: custom-response
        config: {status_code: 503, body: "down"}
`;

  it('parse to the same TrafficPolicy as inbound / outbound, YAML and JSON', () => {
    const old = parseTrafficPolicy(doc('inbound', 'outbound'));
    expect(old.inbound).toHaveLength(2);
    expect(old.outbound).toHaveLength(1);
    const ngrok = parseTrafficPolicy(doc('on_http_request', 'on_http_response'));
    expect(ngrok).toEqual(old);
    expect(Object.keys(ngrok)).toEqual(['inbound', 'outbound']);
    const json = JSON.stringify(decodeTrafficPolicy(doc('on_http_request', 'on_http_response')));
    expect(json).toContain('"on_http_request"');
    expect(parseTrafficPolicy(json)).toEqual(old);
    expect(validateTrafficPolicy(JSON.parse(json))).toEqual(old);
    expect(parseTrafficPolicy('on_http_request:\n')).toEqual({ inbound: [], outbound: [] });
    expect(parseTrafficPolicy('{"on_http_response": []}')).toEqual({ inbound: [], outbound: [] });
  });

  it('may mix the styles across phases (each phase is named once, either way)', () => {
    const old = parseTrafficPolicy(doc('inbound', 'outbound'));
    expect(parseTrafficPolicy(doc('inbound', 'on_http_response'))).toEqual(old);
    expect(parseTrafficPolicy(doc('on_http_request', 'outbound'))).toEqual(old);
    // The direction comes from the key, not the style: res is only known in the response phase.
    expect(fails({ on_http_request: [{ expressions: ['res.status_code == 500'], actions: [{ type: 'deny' }] }] }).path).toBe('on_http_request[0].expressions[0]');
  });

  it('refuses both names of one phase, naming the second key', () => {
    const cases: [unknown, string, RegExp][] = [
      [{ inbound: [], on_http_request: [] }, 'on_http_request', /^on_http_request: on_http_request and inbound are two names of the same phase \(inbound, ngrok's on_http_request\): write its rules under one of them only$/],
      [{ on_http_request: [], inbound: [] }, 'inbound', /^inbound: inbound and on_http_request are two names/],
      [{ outbound: [], on_http_request: [], on_http_response: null }, 'on_http_response', /on_http_response and outbound are two names of the same phase \(outbound, ngrok's on_http_response\)/],
      ['on_http_response: []\ninbound: []\noutbound:\n', 'outbound', /outbound and on_http_response/],
    ];
    for (const [d, path, msg] of cases) {
      const e = fails(d);
      expect(e.path, JSON.stringify(d)).toBe(path);
      expect(e.message).toMatch(msg);
    }
  });

  it('refuses the phases ngrok has for other endpoints, naming the field and listing the supported ones', () => {
    for (const phase of ['on_tcp_connect', 'on_event_stream_message']) {
      const e = fails({ on_http_request: [], [phase]: [{ actions: [{ type: 'deny' }] }] });
      expect(e.path).toBe(phase);
      expect(e.message).toBe(`${phase}: unknown field "${phase}": this phase is not supported (only HTTP request and response phases are); supported: inbound, outbound, on_http_request, on_http_response`);
    }
  });

  it('name the key as written in error paths, the policy-wide checks included', () => {
    const rule = (...actions: unknown[]) => ({ actions });
    const cases: [unknown, string, RegExp?][] = [
      [{ on_http_request: [rule({ type: 'deny' }, { type: 'rate-limit', config: { ...good, name: undefined } })] }, 'on_http_request[0].actions[1].config.name', /is required/],
      [{ on_http_request: [rule({ type: 'deny' }, { type: 'rate-limit', config: { ...good, name: 5 } })] }, 'on_http_request[0].actions[1].config.name', /must be a string/],
      [{ on_http_response: [{ expressions: ['nope('], actions: [{ type: 'deny' }] }] }, 'on_http_response[0].expressions[0]'],
      [{ on_http_request: [{ colour: 1, actions: [] }] }, 'on_http_request[0].colour'],
      [{ on_http_request: {} }, 'on_http_request', /must be a list/],
      // rate-limit names (save-time check): the earlier one is named as written too
      [{ on_http_request: [rule({ type: 'rate-limit', config: good }), rule({ type: 'rate-limit', config: good })] }, 'on_http_request[1].actions[0].config.name', /already the name of the rate-limit at on_http_request\[0\]\.actions\[0\];/],
      // auth ids (a check over the parsed policy)
      [
        { on_http_request: [rule({ type: 'oauth', config: { provider: 'github' } }), rule({ type: 'oauth', config: { provider: 'github', scopes: ['read:org'] } })] },
        'on_http_request[1].actions[0].config.auth_id',
        /is already used by on_http_request\[0\]\.actions\[0\] with another configuration/,
      ],
      // circuit breakers per policy
      [{ on_http_request: [rule(...Array.from({ length: 6 }, () => ({ type: 'circuit-breaker' }))), rule(...Array.from({ length: 5 }, () => ({ type: 'circuit-breaker' })))] }, 'on_http_request[1].actions[4].type', /too many circuit-breaker actions/],
      // the cost bound
      [{ on_http_request: [{ expressions: ['true', `${JSON.stringify(Array.from({ length: 100 }, (_, i) => i))}.exists(x, ${JSON.stringify(Array.from({ length: 100 }, (_, i) => i))}.exists(y, ${JSON.stringify(Array.from({ length: 100 }, (_, i) => i))}.exists(z, x + y + z == 1000)))`], actions: [{ type: 'deny' }] }] }, 'on_http_request[0].expressions[1]', /too expensive to evaluate/],
    ];
    for (const [d, path, msg] of cases) {
      const e = refusal(d, true);
      expect(e.path, JSON.stringify(d)).toBe(path);
      expect(e.message.startsWith(`${path}: `)).toBe(true);
      if (msg) expect(e.message).toMatch(msg);
      expect(e.message).not.toMatch(/\b(inbound|outbound)\[/);
    }
    // The document's own keys are checked under the new names too (decodeTrafficPolicy).
    const alias = fails('on_http_request:\n  - name: &k secret\n    actions:\n      - type: verify-webhook\n        config:\n          provider: github\n          *k : s\n');
    expect([alias.path, alias.message]).toEqual(['on_http_request[0].actions[0].config', expect.stringMatching(/alias \(\*k\)/)]);
  });

  it("says which phase an action belongs to in the document's words", () => {
    const inResponse = (type: string, dir: string) => fails({ [dir]: [{ actions: [{ type: 'deny' }, { type, config: { provider: 'github', secret: 's' } }] }] });
    expect(inResponse('verify-webhook', 'on_http_response').message).toBe('on_http_response[0].actions[1].type: verify-webhook can only be used in on_http_request rules (it checks the request)');
    expect(inResponse('verify-webhook', 'outbound').message).toBe('outbound[0].actions[1].type: verify-webhook can only be used in inbound rules (it checks the request)');
    expect(fails({ on_http_request: [{ actions: [{ type: 'compress-response' }] }] }).message).toBe('on_http_request[0].actions[0].type: compress-response can only be used in on_http_response rules (it compresses the response)');
    expect(fails({ on_http_response: [{ actions: [{ type: 'basic-auth', config: { credentials: ['a:b'] } }] }] }).message).toMatch(/^on_http_response\[0\]\.actions\[0\]\.type: basic-auth can only be used in on_http_request rules/);
  });
});
