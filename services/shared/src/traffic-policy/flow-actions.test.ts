import { describe, expect, it } from 'vitest';
import { oneAction, refusal } from './testing.js';
import { CIRCUIT_BREAKER_COST, CIRCUIT_BREAKER_LIMITS, CLOSE_CONNECTION_COST } from './flow-actions.js';
import { MAX_POLICY_COST } from './cost.js';
import { parseTrafficPolicy, SUPPORTED_ACTION_TYPES, validateTrafficPolicy } from './index.js';

const fails = (doc: unknown) => refusal(doc, true);
const cb = (config: unknown) => oneAction({ type: 'circuit-breaker', config });
const P = 'inbound[0].actions[0].config';
/** Saving `doc` fails at `path` with a reason containing `msg`. */
function refusedAt(doc: unknown, path: string, msg: string): void {
  const err = fails(doc);
  expect(err.path).toBe(path);
  expect(err.reason).toContain(msg);
}

const DEFAULTS = { error_threshold: 0.5, volume_threshold: 10, window_duration: '10s', tripped_duration: '10s', num_buckets: 10, enforce: true, windowMs: 10_000, trippedMs: 10_000 };

describe('circuit-breaker config', () => {
  it('is a supported type', () => {
    expect(SUPPORTED_ACTION_TYPES).toContain('circuit-breaker');
    expect(SUPPORTED_ACTION_TYPES).toContain('close-connection');
  });

  it("takes ngrok's defaults for every field, with or without a config", () => {
    for (const doc of [oneAction({ type: 'circuit-breaker' }), cb(null), cb({})]) {
      expect(validateTrafficPolicy(doc, { checkCost: true }).inbound[0]!.actions[0]).toEqual({ type: 'circuit-breaker', config: DEFAULTS });
    }
  });

  it('parses YAML with every field, durations as Go durations', () => {
    const p = parseTrafficPolicy(`
inbound:
  - expressions: ["req.url.path.startsWith('/api')"]
    actions:
      - type: circuit-breaker
        config:
          error_threshold: 0.25
          volume_threshold: 20
          window_duration: 1m30s
          tripped_duration: 1.5s
          num_buckets: 10
          enforce: false
`);
    expect(p.inbound[0]!.actions[0]).toEqual({
      type: 'circuit-breaker',
      config: { error_threshold: 0.25, volume_threshold: 20, window_duration: '1m30s', tripped_duration: '1.5s', num_buckets: 10, enforce: false, windowMs: 90_000, trippedMs: 1_500 },
    });
  });

  it.each([
    [{ error_threshold: 0 }, 0],
    [{ error_threshold: 1 }, 1],
    [{ volume_threshold: 1 }, 1],
    [{ volume_threshold: 2_000_000_000 }, 2_000_000_000],
    [{ window_duration: '1s' }, 1_000],
    [{ window_duration: '2m' }, 120_000],
    [{ tripped_duration: '1000ms' }, 1_000],
    [{ tripped_duration: '120s' }, 120_000],
  ])('accepts the bounds: %j', (config, v) => {
    const c = (validateTrafficPolicy(cb(config), { checkCost: true }).inbound[0]!.actions[0]!.config as typeof DEFAULTS);
    const k = Object.keys(config)[0]!;
    expect(k === 'window_duration' ? c.windowMs : k === 'tripped_duration' ? c.trippedMs : c[k as keyof typeof c]).toBe(v);
  });

  it.each([
    [cb({ error_threshold: 1.01 }), `${P}.error_threshold`, 'must be from 0.0 to 1.0 (a fraction, not a percentage), got 1.01'],
    [cb({ error_threshold: 50 }), `${P}.error_threshold`, 'must be from 0.0 to 1.0'],
    [cb({ error_threshold: -0.1 }), `${P}.error_threshold`, 'must be from 0.0 to 1.0'],
    [cb({ error_threshold: '0.5' }), `${P}.error_threshold`, 'must be a number from 0.0 to 1.0 (a fraction, not a percentage), got string "0.5"'],
    [cb({ error_threshold: true }), `${P}.error_threshold`, 'must be a number'],
    [cb({ volume_threshold: 0 }), `${P}.volume_threshold`, 'must be from 1 to 2,000,000,000, got 0'],
    [cb({ volume_threshold: 2_000_000_001 }), `${P}.volume_threshold`, 'must be from 1 to 2,000,000,000, got 2000000001'],
    [cb({ volume_threshold: 1.5 }), `${P}.volume_threshold`, 'must be an integer, got number 1.5'],
    [cb({ volume_threshold: '10' }), `${P}.volume_threshold`, 'must be an integer, got string "10"'],
    [cb({ window_duration: '999ms' }), `${P}.window_duration`, 'must be from 1s to 2m, got "999ms"'],
    [cb({ window_duration: '2m1s' }), `${P}.window_duration`, 'must be from 1s to 2m, got "2m1s"'],
    [cb({ window_duration: '0' }), `${P}.window_duration`, 'must be from 1s to 2m, got "0"'],
    [cb({ window_duration: 10 }), `${P}.window_duration`, 'must be a duration string such as "10s" or "1m30s", got number 10'],
    [cb({ window_duration: 'ten seconds' }), `${P}.window_duration`, '"ten seconds" is not a duration'],
    [cb({ window_duration: '-10s' }), `${P}.window_duration`, 'is not a duration'],
    [cb({ tripped_duration: '500ms' }), `${P}.tripped_duration`, 'must be from 1s to 2m, got "500ms"'],
    [cb({ tripped_duration: '1h' }), `${P}.tripped_duration`, 'must be from 1s to 2m, got "1h"'],
    [cb({ tripped_duration: [] }), `${P}.tripped_duration`, 'must be a duration string'],
    [cb({ num_buckets: 20 }), `${P}.num_buckets`, 'is fixed at 10 (as in ngrok); leave it out or write 10, got 20'],
    [cb({ num_buckets: '10' }), `${P}.num_buckets`, 'is fixed at 10'],
    [cb({ enforce: 'no' }), `${P}.enforce`, 'must be true or false, got string'],
    [cb({ error_threshold_percentage: 0.5 }), `${P}.error_threshold_percentage`, 'unknown field "error_threshold_percentage"; supported: error_threshold, volume_threshold, window_duration, tripped_duration, num_buckets, enforce'],
    [cb({ rolling_window: '10s' }), `${P}.rolling_window`, 'unknown field'],
    [cb('fast'), P, 'config must be a mapping, got string'],
    [cb([]), P, 'config must be a mapping, got list'],
    [oneAction({ type: 'circuit-breaker' }, 'outbound'), 'outbound[0].actions[0].type', 'circuit-breaker can only be used in inbound rules (it decides whether the request goes upstream)'],
  ])('refuses %j at %s', refusedAt);

  it('is refused in YAML at its field, through parseTrafficPolicy', () => {
    const err = refusal('inbound:\n  - actions:\n      - type: circuit-breaker\n        config: {error_threshold: .nan}\n', true);
    expect(err.message).toBe(`${P}.error_threshold: must be a number from 0.0 to 1.0 (a fraction, not a percentage), got number NaN`);
  });

  it('exposes no result variables (as ngrok)', () => {
    const doc = { inbound: [{ actions: [{ type: 'circuit-breaker' }] }, { expressions: ['actions.ngrok.circuit_breaker.tripped'], actions: [{ type: 'deny' }] }] };
    expect(fails(doc).path).toBe('inbound[1].expressions[0]');
  });

  it('counts against the policy cost bound', () => {
    // At most 10 breakers (see below): the rest of the budget taken by close-connection actions.
    const n = Math.floor((MAX_POLICY_COST - CIRCUIT_BREAKER_COST) / CLOSE_CONNECTION_COST);
    const many = (k: number) => ({ inbound: [{ actions: Array.from({ length: k }, () => ({ type: 'close-connection' })) }, { actions: [{ type: 'circuit-breaker' }] }] });
    expect(() => validateTrafficPolicy(many(n), { checkCost: true })).not.toThrow();
    const err = fails(many(n + 1));
    expect(err.path).toBe('inbound[1].actions[0].config');
    expect(err.reason).toMatch(/^circuit-breaker: admitting the request and counting its result is estimated at .* per request at worst, which takes the policy to .*, more than the .* allowed for a policy$/);
  });
});

describe('close-connection config', () => {
  it('has no fields: config absent, null or empty', () => {
    for (const action of [{ type: 'close-connection' }, { type: 'close-connection', config: null }, { type: 'close-connection', config: {} }]) {
      expect(validateTrafficPolicy(oneAction(action), { checkCost: true }).inbound[0]!.actions[0]).toEqual({ type: 'close-connection', config: {} });
    }
    const p = parseTrafficPolicy(`
inbound:
  - expressions: ["req.url.path.startsWith('/dc')"]
    actions:
      - type: close-connection
`);
    expect(p.inbound[0]).toEqual({ name: '', expressions: ["req.url.path.startsWith('/dc')"], actions: [{ type: 'close-connection', config: {} }] });
  });

  it.each([
    [oneAction({ type: 'close-connection', config: { status_code: 444 } }), `${P}.status_code`, 'unknown field "status_code"; close-connection has no configuration fields'],
    [oneAction({ type: 'close-connection', config: 'now' }), P, 'config must be a mapping, got string'],
    [oneAction({ type: 'close-connection', config: [] }), P, 'config must be a mapping, got list'],
    [oneAction({ type: 'close-connection' }, 'outbound'), 'outbound[0].actions[0].type', 'close-connection can only be used in inbound rules (it closes the connection before any response)'],
  ])('refuses %j at %s', refusedAt);

  it('counts against the policy cost bound', () => {
    const n = Math.floor(MAX_POLICY_COST / CLOSE_CONNECTION_COST);
    const err = fails({ inbound: Array.from({ length: n + 1 }, () => ({ actions: [{ type: 'close-connection' }] })) });
    expect(err.path).toBe(`inbound[${n}].actions[0].config`);
    expect(err.reason).toMatch(/^close-connection: closing the connection is estimated at/);
  });
});

describe('circuit-breaker actions per policy', () => {
  it(`are at most ${CIRCUIT_BREAKER_LIMITS.perPolicy} (each is a breaker the ingress keeps per route): a 400 naming the first one over`, () => {
    expect(CIRCUIT_BREAKER_LIMITS.perPolicy).toBe(10);
    const rules = (n: number) => ({ inbound: [{ actions: Array.from({ length: 6 }, () => ({ type: 'circuit-breaker' })) }, { actions: Array.from({ length: n - 6 }, () => ({ type: 'circuit-breaker' })) }] });
    expect(validateTrafficPolicy(rules(10), { checkCost: true }).inbound[1]!.actions).toHaveLength(4);
    refusedAt(rules(11), 'inbound[1].actions[4].type', 'too many circuit-breaker actions: a policy has at most 10');
    // Also where the ingress validates the stored policy again (the review's 2,400 breakers in 64 KiB).
    const many = `inbound: [{actions: [${Array(2400).fill('{type: circuit-breaker}').join(',')}]}]`;
    expect(refusal(many, true).path).toBe('inbound[0].actions[10].type');
    expect(refusal(JSON.parse(JSON.stringify(rules(11))), false).path).toBe('inbound[1].actions[4].type');
  });
});

describe('forward-internal config', () => {
  const fi = (config: unknown, direction: 'inbound' | 'outbound' = 'inbound') => oneAction({ type: 'forward-internal', config }, direction);

  it('is a supported type: url (literal or interpolated) and on_error (halt by default)', () => {
    expect(SUPPORTED_ACTION_TYPES).toContain('forward-internal');
    const got = (config: unknown) => validateTrafficPolicy(fi(config), { checkCost: true }).inbound[0]!.actions[0];
    expect(got({ url: 'https://api.internal' })).toEqual({ type: 'forward-internal', config: { url: 'https://api.internal', on_error: 'halt' } });
    expect(got({ url: 'http://api.internal:8080/', on_error: 'continue' })).toEqual({ type: 'forward-internal', config: { url: 'http://api.internal:8080/', on_error: 'continue' } });
    expect(got({ url: "https://${req.url.path.split('/')[1]}.internal" })).toMatchObject({ config: { on_error: 'halt' } });
    expect(parseTrafficPolicy('on_http_request:\n  - actions:\n      - type: forward-internal\n        config:\n          url: https://svc.internal\n').inbound[0]!.actions[0]!.type).toBe('forward-internal');
  });

  it.each([
    [fi({}), `${P}.url`, 'is required'],
    [fi({ url: 5 }), `${P}.url`, 'must be a string, got number'],
    [fi({ url: 'api.internal' }), `${P}.url`, 'is not a URL'],
    [fi({ url: 'ftp://api.internal' }), `${P}.url`, 'must be an http or https URL'],
    [fi({ url: 'https://u:p@api.internal' }), `${P}.url`, 'must not carry credentials'],
    [fi({ url: 'https://api.internal/path' }), `${P}.url`, 'no path, query or fragment'],
    [fi({ url: 'https://10.0.0.1' }), `${P}.url`, 'by its hostname'],
    [fi({ url: 'https://${nope.x}.internal' }), `${P}.url`, 'does not compile'],
    [fi({ url: 'https://a.internal', on_error: 'ignore' }), `${P}.on_error`, 'must be "halt" or "continue", got "ignore"'],
    [fi({ url: 'https://a.internal', binding: 'internal' }), `${P}.binding`, 'unknown field "binding"'],
    [fi({ url: 'https://a.internal' }, 'outbound'), 'outbound[0].actions[0].type', 'forward-internal can only be used in inbound rules'],
  ])('refuses %j at %s', refusedAt);
});
