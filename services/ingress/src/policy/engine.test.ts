import { once } from 'node:events';
import pino from 'pino';
import type { AddressInfo } from 'node:net';
import tls, { type TLSSocket } from 'node:tls';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { createCertificate, validateTrafficPolicy, type DpEdge } from '@warren/shared';
import type { Outcome, RequestState, RouteStage } from '../pipeline/types.js';
import { compilePolicy, trafficPolicyStage } from './index.js';
import { CONFIG, deps, EDGE, FakeLimiter, request, route } from './testing.js';
import { inferContentType, valueFreeMessage } from './engine.js';

const rl = (over: Record<string, unknown> = {}) => ({ type: 'rate-limit', config: { name: 'rl', algorithm: 'sliding_window', capacity: 2, rate: '60s', bucket_key: ['conn.client_ip'], ...over } });
function stage(policy: unknown, limiter = new FakeLimiter()): RouteStage {
  const s = trafficPolicyStage(route(policy), EDGE, CONFIG, deps(limiter));
  if (!s) throw new Error('no stage');
  return s;
}
const header = (pairs: string[], name: string) => pairs.filter((_, i) => i % 2 === 1 && pairs[i - 1]!.toLowerCase() === name.toLowerCase());

describe('trafficPolicyStage', () => {
  it('is null when absent, disabled or empty; throws when enabled but unparsed', () => {
    expect(trafficPolicyStage({ ...route(null), trafficPolicy: null }, EDGE, CONFIG, deps())).toBeNull();
    expect(trafficPolicyStage(route({ inbound: [{ actions: [{ type: 'deny' }] }] }, false), EDGE, CONFIG, deps())).toBeNull();
    expect(trafficPolicyStage(route({ inbound: [] }), EDGE, CONFIG, deps())).toBeNull();
    expect(() => trafficPolicyStage(route(null), EDGE, CONFIG, deps())).toThrow('could not be parsed');
    const s = stage({ inbound: [{ actions: [{ type: 'deny' }] }] });
    expect(s.name).toBe('traffic_policy');
    expect(s.onResponse).toBeUndefined();
  });

  it('selects rules by their expressions and runs actions in order', async () => {
    const s = stage({
      inbound: [
        { expressions: ["req.method == 'POST'"], actions: [{ type: 'deny', config: { status_code: 405 } }] },
        { expressions: ["req.url.path.startsWith('/api')", "req.query == 'x=1'"], actions: [{ type: 'add-headers', config: { headers: { 'X-A': '1' } } }, { type: 'custom-response', config: { status_code: 200, body: 'hi', headers: { 'X-B': '2' } } }, { type: 'deny' }] },
        { actions: [{ type: 'deny', config: { status_code: 418 } }] },
      ],
    });
    expect(await s.onRequest!(request({ method: 'POST' }))).toMatchObject({ status: 405 });
    const r = request();
    expect(await s.onRequest!(r)).toEqual({ status: 200, body: 'hi', headers: { 'X-B': '2', 'Content-Type': 'text/plain; charset=utf-8' } });
    expect(header(r.headers, 'x-a')).toEqual(['1']);
    expect(await s.onRequest!(request({ url: '/other' }))).toMatchObject({ status: 418, body: '' });
  });

  it('rate-limits with 429 + retry-after, and later rules see the result', async () => {
    const limiter = new FakeLimiter();
    const s = stage({
      inbound: [
        { actions: [rl(), { type: 'add-headers', config: { headers: { 'X-Limited': '${actions.ngrok.rate_limit.limited}' } } }] },
        { expressions: ['!actions.service.rate_limit.limited', "actions.ngrok.rate_limit.bucket_key == '[\"203.0.113.7\"]'"], actions: [{ type: 'add-headers', config: { headers: { 'X-Seen': 'yes' } } }] },
      ],
    }, limiter);
    for (let i = 0; i < 2; i++) {
      const r = request();
      expect(await s.onRequest!(r)).toBeNull();
      expect(header(r.headers, 'x-limited')).toEqual(['false']);
      expect(header(r.headers, 'x-seen')).toEqual(['yes']);
    }
    const r = request();
    const out = (await s.onRequest!(r)) as Exclude<Outcome, null>;
    expect(out.status).toBe(429);
    expect(out.headers!['retry-after']).toBe('13');
    expect(out.body).toContain('Too Many Requests');
    expect((r.vars.actions as { ngrok: { rate_limit: { limited: boolean } } }).ngrok.rate_limit.limited).toBe(true);
    expect(limiter.calls[0]).toEqual({ key: 'tp:["rt_1","inbound","rl"]["203.0.113.7"]', capacity: 2, windowSeconds: 60 });
    // another IP has its own bucket
    expect(await s.onRequest!(request({ ip: '198.51.100.1' }))).toBeNull();
  });

  it('enforce: false marks a request over capacity as limited and lets it through, for a later rule to answer', async () => {
    const limiter = new FakeLimiter();
    const s = stage({
      inbound: [
        { actions: [rl({ capacity: 1, enforce: false })] },
        { expressions: ['actions.ngrok.rate_limit.limited'], actions: [{ type: 'add-headers', config: { headers: { 'X-Would-Limit': 'yes' } } }] },
      ],
    }, limiter);
    const first = request();
    expect(await s.onRequest!(first)).toBeNull();
    expect(header(first.headers, 'x-would-limit')).toEqual([]);
    for (let i = 0; i < 2; i++) {
      const r = request();
      expect(await s.onRequest!(r)).toBeNull();
      expect(header(r.headers, 'x-would-limit')).toEqual(['yes']);
      expect((r.vars.actions as { ngrok: { rate_limit: { limited: boolean } } }).ngrok.rate_limit.limited).toBe(true);
    }
    // the default still refuses
    const enforced = stage({ inbound: [{ actions: [rl({ capacity: 1, enforce: true })] }] });
    expect(await enforced.onRequest!(request())).toBeNull();
    expect(await enforced.onRequest!(request())).toMatchObject({ status: 429 });
  });

  it('fails open on limiter errors and exposes the error variables', async () => {
    const limiter = new FakeLimiter();
    limiter.failWith = { code: 'redis_unavailable', message: 'connection refused' };
    const s = stage({ inbound: [{ actions: [rl({ capacity: 1 })] }, { expressions: ["actions.ngrok.rate_limit.error.code == 'redis_unavailable'", "actions.service.rate_limit.error.message != ''"], actions: [{ type: 'add-headers', config: { headers: { 'X-Err': '${actions.service.rate_limit.error.code}' } } }] }] }, limiter);
    for (let i = 0; i < 3; i++) {
      const r = request();
      expect(await s.onRequest!(r)).toBeNull();
      expect(header(r.headers, 'x-err')).toEqual(['redis_unavailable']);
    }
  });

  it('composes bucket keys from host, ip and headers (case-insensitive, missing = empty)', async () => {
    const limiter = new FakeLimiter();
    const s = stage({ inbound: [{ actions: [rl({ name: 'a', bucket_key: ['req.host', 'conn.client_ip', "req.headers['X-Api-Key']", "getReqHeader('x-TENANT')"] }), rl({ name: 'b', bucket_key: ['req.host'] })] }] }, limiter);
    await s.onRequest!(request({ headers: ['Host', 'app.example.com', 'x-api-key', 'k1', 'X-Tenant', 't1'] }));
    await s.onRequest!(request({ headers: ['Host', 'app.example.com', 'X-API-KEY', 'k1'] }));
    expect(limiter.calls.map((c) => c.key)).toEqual([
      'tp:["rt_1","inbound","a"]["app.example.com","203.0.113.7","k1","t1"]',
      'tp:["rt_1","inbound","b"]["app.example.com"]',
      'tp:["rt_1","inbound","a"]["app.example.com","203.0.113.7","k1",""]',
      'tp:["rt_1","inbound","b"]["app.example.com"]',
    ]);
    // long values are hashed
    await s.onRequest!(request({ headers: ['x-api-key', 'k'.repeat(1000)] }));
    expect(limiter.calls.at(-2)!.key).toMatch(/^tp:\["rt_1","inbound","a"\]#[\w-]{43}$/);
  });

  it('adds and removes request headers case-insensitively; later expressions see the edit', async () => {
    const s = stage({
      inbound: [
        { actions: [{ type: 'remove-headers', config: { headers: ['cookie', 'X-Drop'] } }, { type: 'add-headers', config: { headers: { 'user-agent': 'policy/1', 'X-Ip': 'ip=${conn.client_ip} ua=${getReqHeader("USER-AGENT")}' } } }] },
        { expressions: ["req.headers['user-agent'] == ['curl/8', 'policy/1']", "!('cookie' in req.headers)"], actions: [{ type: 'add-headers', config: { headers: { 'X-After': 'ok' } } }] },
      ],
    });
    // values of one add-headers action see the headers as they were before it; an added header
    // goes after any of its name (ngrok: "it will append another header with the same key")
    const r = request({ headers: ['Host', 'app.example.com', 'User-Agent', 'curl/8', 'Cookie', 'a=1', 'COOKIE', 'b=2', 'x-drop', '1'] });
    expect(await s.onRequest!(r)).toBeNull();
    expect(r.headers).toEqual(['Host', 'app.example.com', 'User-Agent', 'curl/8', 'user-agent', 'policy/1', 'X-Ip', 'ip=203.0.113.7 ua=curl/8', 'X-After', 'ok']);
  });

  it('add-headers appends on requests and responses, replaces a request Host, and replaces after remove-headers', async () => {
    const s = stage({
      inbound: [{ actions: [{ type: 'add-headers', config: { headers: { 'X-Multi': 'three', Host: 'backend.internal:8080', 'Cookie': 'c=3' } } }] }],
      outbound: [
        { actions: [{ type: 'add-headers', config: { headers: { 'x-multi': 'three', 'set-cookie': 'c=3', Host: 'h' } } }] },
        { expressions: ["getResHeader('set-cookie').size() == 3"], actions: [{ type: 'remove-headers', config: { headers: ['X-Multi'] } }, { type: 'add-headers', config: { headers: { 'X-Multi': 'only' } } }] },
      ],
    });
    const r = request({ headers: ['Host', 'app.example.com', 'X-Multi', 'one', 'x-multi', 'two', 'Cookie', 'a=1'] });
    expect(await s.onRequest!(r)).toBeNull();
    expect(r.headers).toEqual(['X-Multi', 'one', 'x-multi', 'two', 'Cookie', 'a=1', 'X-Multi', 'three', 'Host', 'backend.internal:8080', 'Cookie', 'c=3']);
    const res = { status: 200, headers: ['Set-Cookie', 'a=1', 'set-cookie', 'b=2', 'X-Multi', 'one', 'X-Multi', 'two', 'Host', 'up'] };
    expect(await s.onResponse!(request(), res)).toBeNull();
    // On a response Host is an ordinary header (appended); remove-headers then add-headers replaces.
    expect(res.headers).toEqual(['Set-Cookie', 'a=1', 'set-cookie', 'b=2', 'Host', 'up', 'set-cookie', 'c=3', 'Host', 'h', 'X-Multi', 'only']);
  });

  it("sets actions.ngrok.add_headers.headers_added: the last add-headers' headers as sent, lower-case names, a failed one left out", async () => {
    const s = stage({
      inbound: [
        { actions: [{ type: 'add-headers', config: { headers: { 'X-First': 'one' } } }] },
        { actions: [{ type: 'add-headers', config: { headers: { 'X-Who': '${req.method}', 'X-Cafe': 'caf\u00e9', 'X-Missing': '${req.headers["x-none"][0]}' } } }] },
        {
          expressions: ["actions.ngrok.add_headers.headers_added['x-who'] == 'GET'", "!('x-first' in actions.service.add_headers.headers_added)", "!('x-missing' in actions.ngrok.add_headers.headers_added)"],
          actions: [{ type: 'add-headers', config: { headers: { 'X-Seen': '${json.encode(actions.ngrok.add_headers.headers_added)}' } } }],
        },
      ],
      outbound: [{ actions: [{ type: 'add-headers', config: { headers: { 'X-Out': '${size(actions.ngrok.add_headers.headers_added)}' } } }] }],
    });
    const r = request();
    expect(await s.onRequest!(r)).toBeNull();
    // The values as UTF-8 text: 'café' went out as its UTF-8 bytes.
    expect(header(r.headers, 'x-seen')).toEqual(['{"x-cafe":"café","x-who":"GET"}'.replace(/é/g, '\xc3\xa9')]);
    // The response phase sees the last add-headers that ran (the inbound one that added x-seen).
    const res = { status: 200, headers: [] as string[] };
    expect(await s.onResponse!(r, res)).toBeNull();
    expect(header(res.headers, 'x-out')).toEqual(['1']);
  });

  it('records nothing for a policy that never names add_headers (no per-request cost)', async () => {
    const s = stage({ inbound: [{ actions: [{ type: 'add-headers', config: { headers: { 'X-A': '1' } } }] }] });
    const r = request();
    expect(await s.onRequest!(r)).toBeNull();
    expect(r.vars.actions).toBeUndefined();
  });

  it('keeps the client Host when an interpolated Host fails', async () => {
    const s = stage({ inbound: [{ actions: [{ type: 'add-headers', config: { headers: { Host: '${req.headers["x-backend"][0]}' } } }] }] });
    const r = request();
    expect(await s.onRequest!(r)).toBeNull();
    expect(header(r.headers, 'host')).toEqual(['app.example.com']);
    const t = request({ headers: ['Host', 'app.example.com', 'X-Backend', 'b.internal'] });
    expect(await s.onRequest!(t)).toBeNull();
    expect(header(t.headers, 'host')).toEqual(['b.internal']);
  });

  it('keeps the client Host, counted and logged once, when the Host to set is not host[:port] (undici would assert on it)', async () => {
    const reg = deps();
    const warn = vi.spyOn(reg.log, 'warn');
    const s = trafficPolicyStage(route({ inbound: [
      { expressions: ["req.path == '/static'"], actions: [{ type: 'add-headers', config: { headers: { Host: "${'[oops'}", 'X-After': 'a' } } }] },
      { expressions: ["req.path != '/static'"], actions: [{ type: 'add-headers', config: { headers: { Host: '${req.headers["x-a"][0]}' } } }] },
    ] }), EDGE, CONFIG, reg)!;
    const bad = ['[', '[::1', '[oops', 'a b', '', 'user@h', 'h:99999'];
    for (const v of bad) {
      const r = request({ url: '/x', headers: ['Host', 'app.example.com', 'X-A', v] });
      expect(await s.onRequest!(r)).toBeNull();
      expect(header(r.headers, 'host'), v).toEqual(['app.example.com']);
    }
    const st = request({ url: '/static' });
    expect(await s.onRequest!(st)).toBeNull();
    expect(header(st.headers, 'host')).toEqual(['app.example.com']);
    expect(header(st.headers, 'x-after')).toEqual(['a']);
    expect(await reg.registry.getSingleMetricAsString('warren_traffic_policy_expression_errors_total')).toContain(`direction="inbound"} ${bad.length + 1}`);
    // logged once (per policy and header), however often it fails
    expect(warn.mock.calls.filter((c) => JSON.stringify(c).includes('add-headers Host'))).toHaveLength(1);
    for (const v of ['[::1]:8080', 'b.internal', '10.0.0.1:80', '[v1.x]']) {
      const ok = request({ url: '/x', headers: ['Host', 'app.example.com', 'X-A', v] });
      await s.onRequest!(ok);
      expect(header(ok.headers, 'host')).toEqual([v]);
    }
  });

  it('custom-response: ngrok defaults (status 200, content as body), interpolates body and headers', async () => {
    const reg = deps();
    const s = trafficPolicyStage(route({ inbound: [
      { expressions: ["req.path == '/plain'"], actions: [{ type: 'custom-response', config: { content: 'hi' } }] },
      { expressions: ["req.path == '/bad'"], actions: [{ type: 'custom-response', config: { status_code: 418, body: 'a${req.headers["nope"][0]}b ${req.method}', headers: { 'X-Bad': '${req.headers["nope"][0]}', 'X-Ok': 'ok' } } }] },
      { actions: [{ type: 'custom-response', config: { status_code: 201, body: '{"host":"${req.host}","ua":${req.headers["User-Agent"]},"n":${size(req.headers)}}', headers: { 'Content-Type': 'application/json', 'X-Path': '${req.path}' } } }] },
    ] }), EDGE, CONFIG, reg)!;
    expect(await s.onRequest!(request({ url: '/plain' }))).toEqual({ status: 200, headers: { 'Content-Type': 'text/plain; charset=utf-8' }, body: 'hi' });
    expect(await s.onRequest!(request({ url: '/x' }))).toEqual({ status: 201, headers: { 'Content-Type': 'application/json', 'X-Path': '/x' }, body: '{"host":"app.example.com","ua":curl/8,"n":2}' });
    // a failing part is left empty in the body, a failing header left out; both counted
    expect(await s.onRequest!(request({ url: '/bad' }))).toEqual({ status: 418, headers: { 'X-Ok': 'ok', 'Content-Type': 'text/plain; charset=utf-8' }, body: 'ab GET' });
    expect(await reg.registry.getSingleMetricAsString('warren_traffic_policy_expression_errors_total')).toContain('direction="inbound"} 2');
  });

  it('custom-response without a Content-Type gets one inferred (JSON, HTML and XML by their start, else plain text); a given one, in any case, is kept', async () => {
    expect(inferContentType(' {"a": [1, 2]}')).toBe('application/json');
    expect(inferContentType('[1, 2]')).toBe('application/json');
    expect(inferContentType('{not json')).toBe('text/plain; charset=utf-8');
    expect(inferContentType('<!DOCTYPE html><p>x')).toBe('text/html; charset=utf-8');
    expect(inferContentType('\n<HTML>')).toBe('text/html; charset=utf-8');
    expect(inferContentType('<?xml version="1.0"?><a/>')).toBe('text/xml; charset=utf-8');
    expect(inferContentType('<b>bold')).toBe('text/html; charset=utf-8');
    expect(inferContentType('<bogus>')).toBe('text/plain; charset=utf-8');
    expect(inferContentType('hello ${x}')).toBe('text/plain; charset=utf-8');
    const s = stage({ inbound: [
      { expressions: ["req.path == '/given'"], actions: [{ type: 'custom-response', config: { status_code: 200, body: '{}', headers: { 'content-TYPE': 'text/x-custom' } } }] },
      { expressions: ["req.path == '/empty'"], actions: [{ type: 'custom-response', config: { status_code: 200 } }] },
      { expressions: ["req.path == '/json'"], actions: [{ type: 'custom-response', config: { status_code: 429, body: '{"error": "${req.method}"}' } }] },
      { actions: [{ type: 'deny' }] },
    ] });
    expect(await s.onRequest!(request({ url: '/given' }))).toEqual({ status: 200, headers: { 'content-TYPE': 'text/x-custom' }, body: '{}' });
    expect(await s.onRequest!(request({ url: '/empty' }))).toEqual({ status: 200, headers: {}, body: '' });
    expect(await s.onRequest!(request({ url: '/json' }))).toEqual({ status: 429, headers: { 'Content-Type': 'application/json' }, body: '{"error": "GET"}' });
    expect(await s.onRequest!(request({ url: '/deny' }))).toEqual({ status: 403, headers: {}, body: '' });
  });

  it('custom-response: a stored document whose ${…} does not compile keeps it as literal text', async () => {
    const s = stage({ inbound: [{ actions: [{ type: 'custom-response', config: { status_code: 200, body: '<script>const a = `${name}`;</script>', headers: { 'X-T': '${nope(}' } } }] }] });
    expect(await s.onRequest!(request())).toEqual({ status: 200, headers: { 'X-T': '${nope(}', 'Content-Type': 'text/html; charset=utf-8' }, body: '<script>const a = `${name}`;</script>' });
  });

  it('rate-limit actions of one name (stored before that was refused) count in buckets of their own', async () => {
    const limiter = new FakeLimiter();
    const s = stage({
      inbound: [
        { expressions: ["req.path.startsWith('/a')"], actions: [rl({ name: 'shared', capacity: 1 })] },
        { expressions: ["req.path.startsWith('/b')"], actions: [rl({ name: 'shared', capacity: 100 })] },
      ],
    }, limiter);
    for (let i = 0; i < 3; i++) expect(await s.onRequest!(request({ url: '/b' }))).toBeNull();
    expect(await s.onRequest!(request({ url: '/a' }))).toBeNull();
    expect(await s.onRequest!(request({ url: '/a' }))).toMatchObject({ status: 429 });
    // The first of the name keeps the key it always had; the later one adds its place.
    expect([...new Set(limiter.calls.map((c) => c.key))]).toEqual(['tp:["rt_1","inbound","shared","inbound[1].actions[0]"]["203.0.113.7"]', 'tp:["rt_1","inbound","shared"]["203.0.113.7"]']);
  });

  it('reads req.headers and res.headers in any case', async () => {
    const s = stage({
      inbound: [{ expressions: ["req.headers['X-User'][0] == 'alice'", "'X-USER' in req.headers", "req.headers['x-user'] == ['alice']"], actions: [{ type: 'deny', config: { status_code: 418 } }] }],
      outbound: [{ expressions: ["res.headers['Content-Type'][0] == 'text/plain'", "!('X-None' in res.headers)"], actions: [{ type: 'deny', config: { status_code: 502 } }] }],
    });
    expect(await s.onRequest!(request({ headers: ['Host', 'app.example.com', 'X-User', 'alice'] }))).toMatchObject({ status: 418 });
    expect(await s.onRequest!(request({ headers: ['Host', 'app.example.com', 'x-user', 'bob'] }))).toBeNull();
    expect(await s.onResponse!(request(), { status: 200, headers: ['content-type', 'text/plain'] })).toMatchObject({ status: 502 });
  });

  it('runs outbound rules on the response', async () => {
    const s = stage({
      outbound: [
        { expressions: ['res.status_code == 200', "getResHeader('Server').exists(v, v.startsWith('nginx'))"], actions: [{ type: 'remove-headers', config: { headers: ['server'] } }, { type: 'add-headers', config: { headers: { 'X-Status': '${res.status_code}' } } }] },
        { expressions: ['res.status_code >= 500'], actions: [{ type: 'custom-response', config: { status_code: 503, body: 'down' } }] },
        { expressions: ["req.path == '/secret'"], actions: [{ type: 'deny', config: { status_code: 404 } }] },
      ],
    });
    expect(s.onRequest).toBeUndefined();
    const res = { status: 200, headers: ['Server', 'nginx/1.2', 'Content-Type', 'text/plain'] };
    expect(await s.onResponse!(request(), res)).toBeNull();
    expect(res.headers).toEqual(['Content-Type', 'text/plain', 'X-Status', '200']);
    expect(await s.onResponse!(request(), { status: 502, headers: [] })).toMatchObject({ status: 503, body: 'down' });
    expect(await s.onResponse!(request({ url: '/secret' }), { status: 200, headers: [] })).toMatchObject({ status: 404 });
  });

  it('outbound rate-limit counts responses', async () => {
    const limiter = new FakeLimiter();
    const s = stage({ outbound: [{ expressions: ['res.status_code == 404'], actions: [rl({ capacity: 1 })] }] }, limiter);
    expect(await s.onResponse!(request(), { status: 404, headers: [] })).toBeNull();
    expect(await s.onResponse!(request(), { status: 200, headers: [] })).toBeNull();
    expect(await s.onResponse!(request(), { status: 404, headers: [] })).toMatchObject({ status: 429 });
    expect(limiter.calls.map((c) => c.key)).toEqual(['tp:["rt_1","outbound","rl"]["203.0.113.7"]', 'tp:["rt_1","outbound","rl"]["203.0.113.7"]']);
  });

  it('treats an evaluation error as a rule that does not apply (no deny action), never a throw', async () => {
    const reg = deps();
    const s = trafficPolicyStage(route({ inbound: [
      { expressions: ["req.headers['x-missing'][0] == 'a'"], actions: [{ type: 'add-headers', config: { headers: { 'X-Applied': '1' } } }] },
      // Not a deny action: a custom-response (even a 403) is skipped on an error, as before.
      { expressions: ["int(req.query) > 1"], actions: [{ type: 'custom-response', config: { status_code: 403, body: 'applied' } }] },
      { actions: [{ type: 'add-headers', config: { headers: { 'X-Bad': '${req.headers["nope"][0]}', 'X-Good': 'g' } } }] },
    ] }), EDGE, CONFIG, reg)!;
    const r = request();
    expect(await s.onRequest!(r)).toBeNull();
    expect(header(r.headers, 'x-applied')).toEqual([]);
    expect(header(r.headers, 'x-bad')).toEqual([]);
    expect(header(r.headers, 'x-good')).toEqual(['g']);
    await s.onRequest!(request());
    const m = await reg.registry.getSingleMetricAsString('warren_traffic_policy_expression_errors_total');
    expect(m).toContain('direction="inbound"} 6');
  });

  it('fails closed for deny: a rule with a deny action whose expression fails to evaluate applies (counted, logged once)', async () => {
    for (const expr of ["req.headers['x-api-key'][0] != 'secret'", "getReqHeader('x-api-key')[0] != 'secret'"]) {
      const reg = deps();
      const warn = vi.spyOn(reg.log, 'warn');
      // The audit's policy (H1), in ngrok's phase names.
      const s = trafficPolicyStage(route({ on_http_request: [{ expressions: [expr], actions: [{ type: 'deny' }] }] }), EDGE, CONFIG, reg)!;
      // Without the header: indexing the missing key is an error; the deny denies anyway.
      expect(await s.onRequest!(request()), expr).toMatchObject({ status: 403 });
      expect(await s.onRequest!(request({ headers: ['Host', 'app.example.com', 'X-Api-Key', 'wrong'] })), expr).toMatchObject({ status: 403 });
      expect(await s.onRequest!(request({ headers: ['Host', 'app.example.com', 'X-Api-Key', 'secret'] })), expr).toBeNull();
      expect(await s.onRequest!(request()), expr).toMatchObject({ status: 403 });
      // Each failure counted; logged once for the expression, saying the rule applied.
      expect(await reg.registry.getSingleMetricAsString('warren_traffic_policy_expression_errors_total'), expr).toContain('direction="inbound"} 2');
      const logged = warn.mock.calls.filter((c) => JSON.stringify(c).includes('inbound[0].expressions[0]'));
      expect(logged, expr).toHaveLength(1);
      expect(JSON.stringify(logged[0]), expr).toContain('fails closed');
    }
  });

  it('fails closed for deny whatever the order of the expressions: a failed one counts as true, a false one elsewhere still decides', async () => {
    const key = "req.headers['x-api-key'][0] != 'secret'";
    const admin = "req.url.path.startsWith('/admin')";
    for (const expressions of [[key, admin], [admin, key]]) {
      const s = trafficPolicyStage(route({ on_http_request: [{ expressions, actions: [{ type: 'deny' }] }] }), EDGE, CONFIG, deps())!;
      expect(await s.onRequest!(request({ url: '/public' })), expressions.join(' && ')).toBeNull();
      expect(await s.onRequest!(request({ url: '/admin/x' })), expressions.join(' && ')).toMatchObject({ status: 403 });
      expect(await s.onRequest!(request({ url: '/admin/x', headers: ['Host', 'app.example.com', 'X-Api-Key', 'secret'] })), expressions.join(' && ')).toBeNull();
    }
  });

  it('fails closed for deny on a non-bool result and on responses; other rules are skipped', async () => {
    const reg = deps();
    const setFlag = { type: 'set-vars', config: { vars: [{ flag: 'yes' }] } };
    const s = trafficPolicyStage(route({
      inbound: [
        { actions: [setFlag] },
        // `vars.flag` is a string here, not a bool: an add-headers rule is skipped, a deny rule denies.
        { expressions: ['vars.flag'], actions: [{ type: 'add-headers', config: { headers: { 'X-Flag': 'set' } } }] },
        { expressions: ["req.path == '/deny'", 'vars.flag'], actions: [{ type: 'add-headers', config: { headers: { 'X-Before': 'b' } } }, { type: 'deny', config: { status_code: 451 } }] },
      ],
      outbound: [{ expressions: ["res.headers['x-internal'][0] != 'ok'"], actions: [{ type: 'deny', config: { status_code: 502 } }] }],
    }), EDGE, CONFIG, reg)!;
    const pass = request({ url: '/pass' });
    expect(await s.onRequest!(pass)).toBeNull();
    expect(header(pass.headers, 'x-flag')).toEqual([]);
    const denied = request({ url: '/deny' });
    expect(await s.onRequest!(denied)).toMatchObject({ status: 451 });
    // The rule applied: its actions ran in order.
    expect(header(denied.headers, 'x-before')).toEqual(['b']);
    expect(await s.onResponse!(request(), { status: 200, headers: [] })).toMatchObject({ status: 502 });
    expect(await s.onResponse!(request(), { status: 200, headers: ['X-Internal', 'ok'] })).toBeNull();
    const m = await reg.registry.getSingleMetricAsString('warren_traffic_policy_expression_errors_total');
    expect(m).toContain('direction="inbound"} 3');
    expect(m).toContain('direction="outbound"} 1');
  });

  it('decides fail-closed once, at compile time: only rules with a deny action', () => {
    const p = compilePolicy(validateTrafficPolicy({
      inbound: [
        { actions: [{ type: 'deny' }] },
        { expressions: ['true'], actions: [{ type: 'add-headers', config: { headers: { a: 'b' } } }, { type: 'deny', config: { status_code: 401 } }] },
        { actions: [{ type: 'custom-response', config: { status_code: 403 } }] },
        { actions: [{ type: 'add-headers', config: { headers: { a: 'b' } } }] },
      ],
      outbound: [{ actions: [{ type: 'deny' }] }],
    }), 'rt_1');
    expect(p.inbound.map((r) => r.failClosed)).toEqual([true, true, false, false]);
    expect(p.outbound.map((r) => r.failClosed)).toEqual([true]);
  });

  it('exposes request variables', async () => {
    const exprs = [
      "req.method == 'GET'", "req.host == 'app.example.com'", "req.path == '/api/items'", "req.query == 'x=1'",
      "req.url == 'https://app.example.com:8443/api/items?x=1'", "req.url.host == 'app.example.com'", "req.url.query_params['x'] == ['1']",
      "getQueryParam('x') == ['1']", "conn.client_ip == '203.0.113.7'", 'conn.server_port == 8443', "req.headers['user-agent'] == ['curl/8']",
      "req.user_agent == 'curl/8'", "time.now > timestamp('2024-01-01T00:00:00Z')", '!actions.ngrok.rate_limit.limited',
    ];
    const s = stage({ inbound: exprs.map((e, i) => ({ expressions: [`!(${e})`], actions: [{ type: 'custom-response', config: { status_code: 500, body: `failed ${i}: ${e}` } }] })) });
    expect(await s.onRequest!(request({ host: 'app.example.com', headers: ['Host', 'App.example.com:8443', 'User-Agent', 'curl/8'] }))).toBeNull();
  });
});

describe('conn.tls on a real TLS connection', () => {
  // A server-side TLSSocket as the HTTPS listener hands it over (client certificates requested,
  // not rejected), with a client that presents one signed by a CA.
  let server: tls.Server;
  let client: TLSSocket;
  let socket: TLSSocket;

  beforeAll(async () => {
    const ca = await createCertificate({ commonName: 'unit CA', days: 1, ca: true, keyType: 'ec' });
    const cert = await createCertificate({ commonName: 'ingress.test', days: 1, issuer: ca, keyType: 'ec', dnsNames: ['app.example.com'] });
    const clientCert = await createCertificate({ commonName: 'allowed', days: 1, issuer: ca, keyType: 'ec', dnsNames: ['client.test'] });
    server = tls.createServer({ cert: cert.certificatePem, key: cert.privateKeyPem, requestCert: true, rejectUnauthorized: false });
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    const accepted = once(server, 'secureConnection');
    client = tls.connect({ port: (server.address() as AddressInfo).port, host: '127.0.0.1', servername: 'app.example.com', ca: ca.certificatePem, cert: clientCert.certificatePem, key: clientCert.privateKeyPem });
    await once(client, 'secureConnect');
    socket = (await accepted)[0] as TLSSocket;
  });
  afterAll(async () => {
    client?.destroy();
    socket?.destroy();
    await new Promise((r) => server?.close(r));
  });

  const MTLS_EDGE = { ...EDGE, mutualTls: { enabled: true, certificateAuthorityIds: ['ca_1'] } } as DpEdge;
  /** A request on the TLS connection; `edge`: with mutual_tls (the certificate was verified) or without. */
  function overTls(edge: DpEdge): RequestState {
    const r = request();
    (r.req as { socket: unknown }).socket = socket;
    return { ...r, edge };
  }
  const overHttp = (): RequestState => {
    const r = request();
    (r.req as { socket: unknown }).socket = { remoteAddress: '203.0.113.7' };
    return { ...r, scheme: 'http' };
  };
  const policy = {
    inbound: [
      { expressions: ["conn.tls.client.subject.common_name != 'allowed'"], actions: [{ type: 'deny', config: { status_code: 401 } }] },
      {
        actions: [
          {
            type: 'add-headers',
            config: { headers: { 'X-Tls': '${conn.tls.version} ${conn.tls.sni} ${conn.tls.cipher_suite}', 'X-Client': '${conn.tls.client.subject} / ${conn.tls.client.issuer.common_name} / ${conn.tls.client.san.dns_names}', 'X-Server': '${conn.tls.server.subject.common_name}' } },
          },
        ],
      },
    ],
  };

  it('reads the connection and the client certificate on an edge whose mutual_tls verified it', async () => {
    const r = overTls(MTLS_EDGE);
    expect(await stage(policy).onRequest!(r)).toBeNull();
    expect(header(r.headers, 'x-tls')).toEqual([`1.3 app.example.com ${socket.getCipher().standardName}`]);
    expect(header(r.headers, 'x-tls')[0]).toMatch(/^1\.3 app\.example\.com TLS_(AES|CHACHA20)_\w+$/);
    expect(header(r.headers, 'x-client')).toEqual(['CN=allowed / unit CA / client.test']);
    expect(header(r.headers, 'x-server')).toEqual(['ingress.test']);
  });

  it('shows no client certificate without mutual_tls (it was not checked), nor over plain HTTP', async () => {
    // Same connection, same certificate: nothing vouches for it, so the deny applies.
    expect(await stage(policy).onRequest!(overTls(EDGE))).toMatchObject({ status: 401 });
    expect(await stage(policy).onRequest!(overHttp())).toMatchObject({ status: 401 });
    const plain = stage({ inbound: [{ expressions: ["conn.tls.version == '' && conn.tls.sni == '' && conn.tls.client.pem == ''"], actions: [{ type: 'deny', config: { status_code: 426 } }] }] });
    expect(await plain.onRequest!(overHttp())).toMatchObject({ status: 426 });
    expect(await plain.onRequest!(overTls(MTLS_EDGE))).toBeNull();
  });

  it('touches the socket only when a policy reads conn.tls', async () => {
    const peer = vi.spyOn(socket, 'getPeerX509Certificate');
    const protocol = vi.spyOn(socket, 'getProtocol');
    try {
      const s = stage({ inbound: [{ expressions: ["conn.client_ip == '198.51.100.1'", "req.path.startsWith('/x')"], actions: [{ type: 'deny' }] }] });
      for (let i = 0; i < 3; i++) expect(await s.onRequest!(overTls(MTLS_EDGE))).toBeNull();
      expect([peer.mock.calls.length, protocol.mock.calls.length]).toEqual([0, 0]);
      // Several reads of the certificate, over several requests: the earlier tests of this block
      // already parsed it on this connection (cached per socket), so it is not fetched again.
      const t = stage({ inbound: [{ expressions: ["conn.tls.client.subject.common_name == 'allowed'", "conn.tls.client.serial_number != ''", "conn.tls.client.validity.not_after > time.now"], actions: [{ type: 'deny', config: { status_code: 418 } }] }] });
      for (let i = 0; i < 3; i++) expect(await t.onRequest!(overTls(MTLS_EDGE))).toMatchObject({ status: 418 });
      expect([peer.mock.calls.length, protocol.mock.calls.length]).toEqual([0, 0]);
    } finally {
      peer.mockRestore();
      protocol.mockRestore();
    }
  });
});

describe('evaluation errors in the log', () => {
  it('carry no request data: the CEL library writes the operand (a header, a query value) into its messages (audit finding)', async () => {
    const lines: string[] = [];
    const log = pino({ level: 'warn' }, { write: (l: string) => void lines.push(l) });
    const s = trafficPolicyStage(
      route({
        inbound: [
          { expressions: ["'debug' in req.url.query_params && bool(req.url.query_params['debug'][0])"], actions: [{ type: 'add-headers', config: { headers: { 'x-a': '1' } } }] },
          { expressions: ["'authorization' in req.headers && {'Bearer acme': true}[req.headers['authorization'][0]]"], actions: [{ type: 'add-headers', config: { headers: { 'x-b': '1' } } }] },
          { expressions: ["'x-ttl' in req.headers && duration(req.headers['x-ttl'][0]) < duration('1h')"], actions: [{ type: 'deny' }] },
          { actions: [{ type: 'add-headers', config: { headers: { 'x-c': "${duration(req.headers['x-ttl'][0])}" } } }] },
        ],
      }),
      EDGE,
      CONFIG,
      { ...deps(), log },
    )!;
    const r = request({ url: '/p/x?debug=SEKRETQUERYTOKEN', headers: ['Host', 'app.example.com', 'Authorization', 'Bearer SEKRETBEARER', 'x-ttl', 'SEKRETTTL'] });
    expect(await s.onRequest!(r)).toMatchObject({ status: 403 }); // the deny fails closed
    expect(lines.length).toBeGreaterThanOrEqual(3);
    const text = lines.join('\n');
    expect(text).not.toMatch(/SEKRET/);
    expect(text).toContain('conversion error');
    expect(text).toMatch(/No such key/i);
  });

  it('valueFreeMessage keeps the kind of error, up to its first ": " or quote', () => {
    expect(valueFreeMessage('bool() conversion error: invalid string value "x"')).toBe('bool() conversion error');
    expect(valueFreeMessage('No such key: Bearer x')).toBe('No such key');
    expect(valueFreeMessage("no such overload: string + int")).toBe('no such overload');
    expect(valueFreeMessage('the interpolated body is over 262144 characters')).toBe('the interpolated body is over 262144 characters');
  });
});
