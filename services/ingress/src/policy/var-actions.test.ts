import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { describe, expect, it } from 'vitest';
import { decodeTrafficPolicy, LOG_LIMITS, VARS_LIMITS } from '@warren/shared';
import { HttpRequestTracker } from '../events/tracking.js';
import type { HttpRequestCompleteObject, TrafficEvents } from '../events/traffic-events.js';
import type { Outcome, RouteStage } from '../pipeline/types.js';
import { trafficPolicyStage } from './index.js';
import { CONFIG, deps, EDGE, FakeLimiter, request, route } from './testing.js';
import { collectPolicyLogs, policyLogsOf } from './var-actions.js';

function stage(policy: unknown, d = deps()): RouteStage {
  const s = trafficPolicyStage(route(policy), EDGE, CONFIG, d);
  if (!s) throw new Error('no stage');
  return s;
}
const header = (pairs: string[], name: string) => pairs.filter((_, i) => i % 2 === 1 && pairs[i - 1]!.toLowerCase() === name.toLowerCase());
async function errorCount(d: ReturnType<typeof deps>, direction = 'inbound'): Promise<number> {
  const m = await d.registry.getSingleMetricAsString('warren_traffic_policy_expression_errors_total');
  const line = m.split('\n').find((l) => l.includes(`direction="${direction}"`));
  return line ? Number(line.split(' ').pop()) : 0;
}
const setVars = (...vars: Record<string, unknown>[]) => ({ type: 'set-vars', config: { vars } });
const addHeaders = (headers: Record<string, string>) => ({ type: 'add-headers', config: { headers } });
const log = (metadata: Record<string, unknown>) => ({ type: 'log', config: { metadata } });

describe('set-vars', () => {
  it('sets typed variables in order, read by later entries, expressions and interpolations', async () => {
    const d = deps();
    const s = stage({
      inbound: [
        {
          actions: [
            setVars(
              { greeting: 'Hello,' },
              { who: 'World!' },
              { n: '${int(50.5)}' },
              { l: [1, 2, 3] },
              { m: { key: 'value', list: ['${req.path}', 2] } },
              { msg: 'Your IP is ${conn.client_ip}!' },
              { count: 1 },
              { count: '${vars.count + 1}' },
              { doubled: '${vars.l.map(x, x * 2)}' },
              { url: '${req.url}' },
              { u: '${uint(1.5) + 10u}' },
              { f: 1.5 },
              { nul: null },
              { b: true },
              { mt: 'm=${vars.m}' },
            ),
          ],
        },
        {
          expressions: [
            'vars.n == 50',
            'vars.count == 2',
            'vars.doubled == [2, 4, 6]',
            "vars.m.key == 'value'",
            "vars.m.list[0] == '/api/items'",
            "vars.url.startsWith('https://app.example.com/')",
            'vars.u == 11u',
            'vars.f == 1.5',
            'vars.nul == null',
            'vars.b',
            'has(vars.greeting)',
            '!has(vars.nope)',
          ],
          actions: [addHeaders({ 'X-Greeting': '${vars.greeting} ${vars.who}', 'X-Msg': '${vars.msg}', 'X-List': 'l=${vars.l}', 'X-Text-Map': '${vars.mt}' })],
        },
      ],
    }, d);
    const r = request();
    expect(await s.onRequest!(r)).toBeNull();
    expect(header(r.headers, 'x-greeting')).toEqual(['Hello, World!']);
    expect(header(r.headers, 'x-msg')).toEqual(['Your IP is 203.0.113.7!']);
    expect(header(r.headers, 'x-list')).toEqual(['l=1, 2, 3']);
    expect(header(r.headers, 'x-text-map')).toEqual(['m={"key":"value","list":["/api/items",2]}']);
    expect(await errorCount(d)).toBe(0);
  });

  it('keeps a whole number written as a float a double (1.0, 2e0), as Go reads YAML; 1 stays an int', async () => {
    const d = deps();
    const yaml = [
      'inbound:',
      '  - actions:',
      '      - type: set-vars',
      '        config: {vars: [{ratio: 1.0}, {e: 2e0}, {n: 1}, {l: [1.0, 2]}, {m: {x: 3.0}}]}',
      '  - expressions:',
      "      - type(vars.ratio) == double && vars.ratio * 1.5 == 1.5",
      "      - type(vars.e) == double && type(vars.n) == int",
      "      - type(vars.l[0]) == double && type(vars.l[1]) == int && type(vars.m.x) == double",
      '    actions:',
      "      - type: add-headers",
      "        config: {headers: {x-typed: 'yes'}}",
      '',
    ].join('\n');
    // As the control plane sends it: the decoded document (decodeTrafficPolicy), plain JSON.
    const s = stage(JSON.parse(JSON.stringify(decodeTrafficPolicy(yaml))), d);
    const r = request();
    expect(await s.onRequest!(r)).toBeNull();
    expect(header(r.headers, 'x-typed')).toEqual(['yes']);
    expect(await errorCount(d)).toBe(0);
  });

  it('an unset variable is an evaluation error: the rule is skipped, the header not set, both counted', async () => {
    const d = deps();
    const s = stage({
      inbound: [
        // Not a deny action: skipped (a deny would fail closed and apply, `engine.ts`).
        { expressions: ["vars.role == 'admin'"], actions: [{ type: 'custom-response', config: { status_code: 401 } }] },
        { actions: [addHeaders({ 'X-Role': '${vars.role}', 'X-Ok': 'yes' })] },
        { expressions: ['!has(vars.role)'], actions: [setVars({ role: 'guest' })] },
        { expressions: ["vars.role == 'guest'"], actions: [{ type: 'custom-response', config: { status_code: 200, body: 'guest' } }] },
      ],
    }, d);
    const r = request();
    expect(await s.onRequest!(r)).toMatchObject({ status: 200, body: 'guest' });
    expect(header(r.headers, 'x-role')).toEqual([]);
    expect(header(r.headers, 'x-ok')).toEqual(['yes']);
    expect(await errorCount(d)).toBe(2);
  });

  it('is scoped to a direction: outbound rules have their own vars', async () => {
    const s = stage({
      inbound: [{ actions: [setVars({ a: 'in' })] }],
      outbound: [
        { expressions: ['has(vars.a)'], actions: [{ type: 'custom-response', config: { status_code: 500, body: 'inbound vars leaked' } }] },
        { actions: [setVars({ status: '${res.status_code}' }, { kind: "${vars.status >= 500 ? 'error' : 'ok'}" }), addHeaders({ 'X-Kind': '${vars.kind}', 'X-Status': '${vars.status}' })] },
      ],
    });
    const state = request();
    expect(await s.onRequest!(state)).toBeNull();
    const res = { status: 503, headers: ['Content-Type', 'text/plain'] };
    expect(await s.onResponse!(state, res)).toBeNull();
    expect(header(res.headers, 'x-kind')).toEqual(['error']);
    expect(header(res.headers, 'x-status')).toEqual(['503']);
  });

  it('keeps vars across a rate-limit decision (the rules resume asynchronously)', async () => {
    const s = stage({
      inbound: [{ actions: [setVars({ x: 'before' }), { type: 'rate-limit', config: { name: 'rl', algorithm: 'sliding_window', capacity: 5, rate: '60s', bucket_key: ['conn.client_ip'] } }, setVars({ y: '${vars.x}-after' })] }, { actions: [addHeaders({ 'X-Y': '${vars.y}' })] }],
    }, deps(new FakeLimiter()));
    const r = request();
    expect(await s.onRequest!(r)).toBeNull();
    expect(header(r.headers, 'x-y')).toEqual(['before-after']);
  });

  it(`does not store a value over ${VARS_LIMITS.valueWeight} characters and elements, nor an object; the variable keeps its value`, async () => {
    const d = deps();
    const doubling = Array.from({ length: 12 }, () => ({ s: '${vars.s + vars.s}' }));
    const s = stage({
      inbound: [
        { actions: [setVars({ s: 'ab' }, ...doubling, { t: 'x' }, { t: 'more ${vars.s}' }, { r: '${req}' }, { h: '${req.headers}' }, { tls: '${conn.tls}' })] },
        { actions: [addHeaders({ 'X-Len': '${size(vars.s)}', 'X-T': '${vars.t}', 'X-R': '${has(vars.r)}', 'X-H': "${vars.h['user-agent'][0]}", 'X-Tls': '${has(vars.tls)}' })] },
      ],
    }, d);
    const r = request();
    expect(await s.onRequest!(r)).toBeNull();
    // 2 · 2^11 = 4096 fits; the 12th doubling does not.
    expect(header(r.headers, 'x-len')).toEqual([String(VARS_LIMITS.valueWeight)]);
    expect(header(r.headers, 'x-t')).toEqual(['x']);
    expect(header(r.headers, 'x-r')).toEqual(['false']);
    expect(header(r.headers, 'x-h')).toEqual(['curl/8']);
    expect(header(r.headers, 'x-tls')).toEqual(['false']);
    expect(await errorCount(d)).toBe(4);
  });
});

describe('log', () => {
  const full = {
    message: 'Log action executed.',
    client: '${conn.client_ip}',
    n: '${1 + 2}',
    big: '${18446744073709551615u}',
    dur: "${duration('1.5s')}",
    ts: "${timestamp('2024-01-01T00:00:00Z')}",
    bytes: "${b'hi'}",
    list: ['${req.method}', 2, 2.5, null, true],
    hdrs: '${req.headers}',
    url: '${req.url}',
    text: '${req.method} ${req.path} ${[1, 2]}',
    missing: '${vars.nope}',
    ['__proto__']: 'plain key',
  };

  it("evaluates the metadata into the request's logs, both directions, in order", async () => {
    const d = deps();
    const s = stage({ inbound: [{ actions: [log(full)] }], outbound: [{ actions: [setVars({ st: '${res.status_code}' }), log({ status: '${vars.st}' })] }] }, d);
    const state = request();
    collectPolicyLogs(state);
    expect(await s.onRequest!(state)).toBeNull();
    expect(await s.onResponse!(state, { status: 201, headers: [] })).toBeNull();
    const logs = policyLogsOf(state)!;
    expect(logs).toHaveLength(2);
    expect(JSON.parse(JSON.stringify(logs))).toEqual([
      {
        metadata: {
          message: 'Log action executed.',
          client: '203.0.113.7',
          n: 3,
          big: '18446744073709551615',
          dur: '1.5s',
          ts: '2024-01-01T00:00:00.000Z',
          bytes: 'aGk=',
          list: ['GET', 2, 2.5, null, true],
          hdrs: { host: ['app.example.com'], 'user-agent': ['curl/8'] },
          url: 'https://app.example.com/api/items?x=1',
          text: 'GET /api/items 1, 2',
          ['__proto__']: 'plain key',
        },
      },
      { metadata: { status: 201 } },
    ]);
    expect(Object.keys(logs[0]!.metadata)).toContain('__proto__');
    expect(await errorCount(d)).toBe(1); // `missing`: left out
  });

  it('evaluates nothing unless the request has a traffic event to carry it', async () => {
    const d = deps();
    const s = stage({ inbound: [{ actions: [log({ a: '${vars.nope}' })] }] }, d);
    const state = request();
    expect(await s.onRequest!(state)).toBeNull();
    expect(policyLogsOf(state)).toBeNull();
    expect(state.vars.policy_logs).toBeUndefined();
    expect(await errorCount(d)).toBe(0);
  });

  it('bounds what a request holds: a huge value is cut off while converting and left out', async () => {
    const d = deps();
    const big = 'y'.repeat(15_000);
    const s = stage({
      inbound: [
        { actions: [log({ hdrs: '${req.headers}', text: 'v=${getReqHeader("x-big")[0]}', list: '${[getReqHeader("x-big")[0], 1]}', small: 'ok', ok: '${size(getReqHeader("x-big")[0])}' })] },
      ],
    }, d);
    const state = request({ headers: ['Host', 'app.example.com', 'X-Big', big] });
    collectPolicyLogs(state);
    await s.onRequest!(state);
    expect(policyLogsOf(state)).toEqual([{ metadata: { small: 'ok', ok: 15_000 } }]);
    expect(await errorCount(d)).toBe(3);
  });

  it(`keeps at most ${LOG_LIMITS.requestEntries} entries and ${LOG_LIMITS.requestChars} characters per request`, async () => {
    const d = deps();
    const many = stage({ inbound: Array.from({ length: LOG_LIMITS.requestEntries + 3 }, (_, i) => ({ actions: [log({ i })] })) }, d);
    const state = request();
    collectPolicyLogs(state);
    await many.onRequest!(state);
    expect(policyLogsOf(state)!.map((e) => e.metadata.i)).toEqual(Array.from({ length: LOG_LIMITS.requestEntries }, (_, i) => i));
    expect(await errorCount(d)).toBe(3);

    const filler = Object.fromEntries(['a', 'b', 'c', 'd'].map((k) => [k, 'x'.repeat(4000)]));
    const heavy = stage({ inbound: Array.from({ length: 6 }, () => ({ actions: [log(filler)] })) });
    const s2 = request();
    collectPolicyLogs(s2);
    await heavy.onRequest!(s2);
    const logs = policyLogsOf(s2)!;
    expect(logs).toHaveLength(4);
    expect(JSON.stringify(logs).length).toBeLessThanOrEqual(LOG_LIMITS.requestChars + 100);
  });

  it('reaches the http_request_complete.v0 object as traffic_policy.logs, and only when a log ran', async () => {
    const emitted: HttpRequestCompleteObject[] = [];
    const events = { emit: (_t: unknown, _a: unknown, _d: unknown, object: HttpRequestCompleteObject) => emitted.push(object) } as unknown as TrafficEvents;
    const withLog = stage({ inbound: [{ expressions: ["req.path != '/quiet'"], actions: [setVars({ who: '${conn.client_ip}' }), log({ message: 'seen', who: '${vars.who}' })] }] });
    const server = http.createServer((req, res) => {
      const track = new HttpRequestTracker(events, req, res, performance.now(), { accountId: 'ac_1', dests: [], edgeId: 'edghts_1', routeId: 'rt_1', clientIp: '203.0.113.7', serverName: 'app.example.com', serverPort: 80, path: req.url ?? '/' });
      const state = request({ url: req.url });
      track.state = state;
      void Promise.resolve(withLog.onRequest!(state)).then((out: Outcome) => res.end(out ? 'refused' : 'ok'));
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const port = (server.address() as AddressInfo).port;
    try {
      for (const p of ['/loud', '/quiet']) {
        await new Promise<void>((resolve, reject) => http.get({ port, host: '127.0.0.1', path: p, agent: false }, (res) => res.resume().on('end', resolve)).on('error', reject));
      }
      await new Promise((r) => setTimeout(r, 50));
    } finally {
      server.close();
    }
    expect(emitted).toHaveLength(2);
    expect(JSON.parse(JSON.stringify(emitted[0]!.traffic_policy))).toEqual({ logs: [{ metadata: { message: 'seen', who: '203.0.113.7' } }] });
    expect('traffic_policy' in emitted[1]!).toBe(false);
  });
});
