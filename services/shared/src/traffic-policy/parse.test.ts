import { describe, expect, it } from 'vitest';
import { refusal } from './testing.js';
import { parseDurationNs, parseTrafficPolicy, SUPPORTED_ACTION_TYPES, validateTrafficPolicy, type RateLimitAction } from './index.js';

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
      },
    });
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
    expect(fails({ on_http_request: [] }).path).toBe('on_http_request');
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
    const e = fails({ inbound: [{ actions: [{ type: 'rate-limit', config: good }, { type: 'forward-internal', config: {} }] }] });
    expect(e.path).toBe('inbound[0].actions[1].type');
    expect(e.message).toBe(`inbound[0].actions[1].type: action type "forward-internal" is not supported; supported: ${SUPPORTED_ACTION_TYPES.join(', ')}`);
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
});
