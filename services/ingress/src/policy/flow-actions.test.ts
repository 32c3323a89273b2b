import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, afterEach, beforeEach, describe, expect, it } from 'vitest';
import { BreakerRegistry } from '../modules/circuit-breaker.js';
import { RoutePipeline } from '../pipeline/runner.js';
import { sendOutcome } from '../http/public.js';
import type { Outcome, RequestState, RouteStage } from '../pipeline/types.js';
import { CLOSE_CONNECTION, useBreakerRegistry } from './flow-actions.js';
import { trafficPolicyStage } from './index.js';
import { CONFIG, deps, EDGE, request, route } from './testing.js';

function stage(policy: unknown, routeId = 'rt_1'): RouteStage {
  const s = trafficPolicyStage({ ...route(policy), id: routeId }, EDGE, CONFIG, deps());
  if (!s) throw new Error('no stage');
  return s;
}
const header = (pairs: string[], name: string) => pairs.filter((_, i) => i % 2 === 1 && pairs[i - 1]!.toLowerCase() === name.toLowerCase());
async function run(s: RouteStage, r: RequestState): Promise<Exclude<Outcome, null> | null> {
  return (await s.onRequest!(r)) as Exclude<Outcome, null> | null;
}

let t = 1_000_000;
let previous: BreakerRegistry;
beforeEach(() => {
  t = 1_000_000;
  previous = useBreakerRegistry(new BreakerRegistry(() => t));
});
afterEach(() => {
  useBreakerRegistry(previous);
});

/** One request through the stage with `result` from the upstream when it goes there: the status the client gets. */
async function send(s: RouteStage, result: number | 'error', url = '/api/x'): Promise<number> {
  const r = request({ url });
  const out = await run(s, r);
  if (out) return out.status;
  s.onResult?.(r, result);
  return result === 'error' ? 502 : result;
}

const breakerPolicy = (config: Record<string, unknown> = {}, expressions: string[] = []) => ({
  inbound: [
    { expressions, actions: [{ type: 'circuit-breaker', config: { volume_threshold: 4, error_threshold: 0.5, window_duration: '10s', tripped_duration: '5s', ...config } }] },
    { actions: [{ type: 'add-headers', config: { headers: { 'x-after': 'yes' } } }] },
  ],
});

describe('circuit-breaker', () => {
  it('trips at the volume and error ratio, answers 503 without the later rules, then lets one probe through and closes', async () => {
    const s = stage(breakerPolicy());
    expect(await send(s, 200)).toBe(200);
    expect(await send(s, 500)).toBe(500);
    expect(await send(s, 200)).toBe(200);
    expect(await send(s, 'error')).toBe(502); // 4 results, 2 errors: 50% ≥ 0.5, trips
    const r = request();
    const out = (await run(s, r))!;
    expect(out).toMatchObject({ status: 503, headers: { 'warren-error-code': 'ERR_WARREN_7103', 'retry-after': '5' } });
    expect(JSON.parse(String(out.body))).toMatchObject({ error_code: 'ERR_WARREN_7103', status_code: 503 });
    expect(header(r.headers, 'x-after')).toEqual([]);
    t += 4_999;
    expect(await send(s, 200)).toBe(503);
    t += 1;
    // Half-open: one probe; the others are refused while it is out.
    const probe = request();
    expect(await run(s, probe)).toBeNull();
    expect(header(probe.headers, 'x-after')).toEqual(['yes']);
    expect(await send(s, 200)).toBe(503);
    s.onResult!(probe, 204);
    // Closed, with a fresh window: three errors are below the volume threshold.
    for (let i = 0; i < 3; i++) expect(await send(s, 503)).toBe(503);
    expect(await send(s, 200)).toBe(200);
  });

  it('a failed probe trips it again', async () => {
    const s = stage(breakerPolicy());
    for (let i = 0; i < 4; i++) await send(s, 502);
    t += 5_000;
    expect(await send(s, 500)).toBe(500); // the probe
    expect(await send(s, 200)).toBe(503);
    t += 5_000;
    expect(await send(s, 200)).toBe(200);
    expect(await send(s, 200)).toBe(200);
  });

  it('counts only 5xx and unreachable upstreams as errors', async () => {
    const s = stage(breakerPolicy({ error_threshold: 0.1, volume_threshold: 2 }));
    for (const status of [404, 429, 400, 499, 301, 200]) expect(await send(s, status)).toBe(status);
    expect(await send(s, 'error')).toBe(502);
    expect(await send(s, 200)).toBe(503);
  });

  it('forgets results older than the window', async () => {
    const s = stage(breakerPolicy());
    for (let i = 0; i < 3; i++) await send(s, 500);
    t += 10_000;
    expect(await send(s, 500)).toBe(500); // the three earlier errors left the window
    expect(await send(s, 200)).toBe(200);
  });

  it('error_threshold 1 trips only when every result in the window is an error', async () => {
    const s = stage(breakerPolicy({ error_threshold: 1, volume_threshold: 2 }));
    expect(await send(s, 200)).toBe(200);
    for (let i = 0; i < 5; i++) expect(await send(s, 500)).toBe(500);
    t += 10_000;
    expect(await send(s, 500)).toBe(500);
    expect(await send(s, 500)).toBe(500);
    expect(await send(s, 200)).toBe(503);
  });

  it('counts and refuses only requests its rule matches', async () => {
    const s = stage(breakerPolicy({}, ["req.url.path.startsWith('/api')"]));
    // Errors on other paths are not counted.
    for (let i = 0; i < 10; i++) expect(await send(s, 500, '/other')).toBe(500);
    expect(await send(s, 200)).toBe(200);
    for (let i = 0; i < 4; i++) await send(s, 500);
    expect(await send(s, 200)).toBe(503);
    // While open, other paths still go upstream.
    expect(await send(s, 200, '/other')).toBe(200);
  });

  it('does not count a request a later rule answered (it has no upstream result)', async () => {
    const s = stage({
      inbound: [
        { actions: [{ type: 'circuit-breaker', config: { volume_threshold: 2, error_threshold: 0.5 } }] },
        { expressions: ["req.url.path == '/deny'"], actions: [{ type: 'deny' }] },
      ],
    });
    for (let i = 0; i < 5; i++) expect(await send(s, 500, '/deny')).toBe(403);
    expect(await send(s, 500)).toBe(500);
    expect(await send(s, 200)).toBe(200);
  });

  it('keeps its state across config versions while its settings and place are unchanged', async () => {
    const policy = breakerPolicy();
    const s1 = stage(policy);
    for (let i = 0; i < 4; i++) await send(s1, 500);
    expect(await send(stage(policy), 200)).toBe(503);
    // Another route, or the same action with other settings, has its own breaker.
    expect(await send(stage(policy, 'rt_2'), 200)).toBe(200);
    expect(await send(stage(breakerPolicy({ volume_threshold: 5 })), 200)).toBe(200);
  });

  it("keeps exactly the breakers of the config last compiled: another account's many breakers cannot reset one", async () => {
    const victimPolicy = breakerPolicy({ tripped_duration: '2m' });
    const compile = (policy: unknown, routeId: string, config: object) => trafficPolicyStage({ ...route(policy), id: routeId, accountId: routeId === 'rt_victim' ? 'ac_victim' : 'ac_other' }, EDGE, config as typeof CONFIG, deps())!;
    const v1 = { ...CONFIG };
    const victim = compile(victimPolicy, 'rt_victim', v1);
    for (let i = 0; i < 4; i++) await send(victim, 500);
    expect(await send(victim, 200)).toBe(503);
    // The next version: another account's 1,100 routes of 10 breakers each (more than the old LRU's 10,000), and the victim's route.
    const v2 = { ...CONFIG };
    const ten = { inbound: [{ actions: Array.from({ length: 10 }, () => ({ type: 'circuit-breaker' })) }] };
    for (let i = 0; i < 1_100; i++) compile(ten, `rt_other${i}`, v2);
    expect(await send(compile(victimPolicy, 'rt_victim', v2), 200)).toBe(503);
    // A version without the victim's breaker drops it (and the other account's): back, it starts afresh.
    compile(ten, 'rt_other0', { ...CONFIG });
    expect(await send(compile(victimPolicy, 'rt_victim', { ...CONFIG }), 200)).toBe(200);
  });

  it.each([
    ['deny', { type: 'deny' }],
    ['jwt-validation', { type: 'jwt-validation', config: { issuer: { allow_list: [{ value: 'https://issuer.example/' }] }, audience: { allow_list: [{ value: 'api' }] }, http: { tokens: [{ type: 'jwt', method: 'header', name: 'Authorization', prefix: 'Bearer ' }] }, jws: { allowed_algorithms: ['RS256'], keys: { sources: { additional_jkus: ['https://issuer.example/jwks'] } } } } }],
    ['basic-auth', { type: 'basic-auth', config: { credentials: ['user:password1'] } }],
  ])('a half-open probe a later rule refuses (%s) frees its place: the next request probes', async (_, refusing) => {
    const pipeline = new RoutePipeline([
      stage({
        inbound: [
          { actions: [{ type: 'circuit-breaker', config: { volume_threshold: 2, tripped_duration: '10s' } }] },
          { expressions: ["req.url.path.startsWith('/refused')"], actions: [refusing] },
        ],
      }),
    ]);
    const through = async (url: string, result: number): Promise<number> => {
      const r = request({ url });
      const out = (await pipeline.onRequest(r)) as Exclude<Outcome, null> | null;
      if (out) return out.status;
      pipeline.onResult(r, result);
      return result;
    };
    await through('/x', 500);
    await through('/x', 500); // tripped
    t += 10_000;
    expect(await through('/refused', 200)).toBeGreaterThanOrEqual(400); // takes the probe, refused by the later rule
    // It used to hold the place for tripped_duration: one such request per period kept the circuit open.
    const probe = request({ url: '/x' });
    expect(await pipeline.onRequest(probe)).toBeNull();
    expect(await through('/x', 200)).toBe(503); // one probe at a time
    pipeline.onResult(probe, 200); // the upstream has recovered: closed
    expect(await through('/x', 200)).toBe(200);
  });

  it('two breakers in one policy count the same request each', async () => {
    const s = stage({
      inbound: [
        { actions: [{ type: 'circuit-breaker', config: { volume_threshold: 2, error_threshold: 0.5 } }] },
        { expressions: ["req.url.path == '/b'"], actions: [{ type: 'circuit-breaker', config: { volume_threshold: 4, error_threshold: 0.5 } }] },
      ],
    });
    expect(await send(s, 500, '/b')).toBe(500);
    expect(await send(s, 500, '/b')).toBe(500); // trips the first (2 of 2); the second has 2 of 4
    expect(await send(s, 200, '/a')).toBe(503);
  });

  it('with enforce: false never refuses and does not listen for results', async () => {
    const s = stage(breakerPolicy({ enforce: false }));
    expect(s.onResult).toBeUndefined();
    for (let i = 0; i < 20; i++) expect(await send(s, 500)).toBe(500);
  });

  it('a policy without one adds nothing per request: no result hook', () => {
    expect(stage({ inbound: [{ actions: [{ type: 'deny' }] }] }).onResult).toBeUndefined();
    expect(stage({ inbound: [{ actions: [{ type: 'close-connection' }] }] }).onResult).toBeUndefined();
    expect(stage(breakerPolicy()).onResult).toBeTypeOf('function');
  });
});

describe('close-connection', () => {
  const s = stage({
    inbound: [
      { actions: [{ type: 'add-headers', config: { headers: { 'x-before': 'yes' } } }] },
      { expressions: ["req.url.path.startsWith('/dc')"], actions: [{ type: 'close-connection' }, { type: 'deny' }] },
      { actions: [{ type: 'deny', config: { status_code: 418 } }] },
    ],
  });

  it('ends the rules with the close marker on matching requests only', async () => {
    const r = request({ url: '/dc/x' });
    expect(await run(s, r)).toBe(CLOSE_CONNECTION);
    expect(header(r.headers, 'x-before')).toEqual(['yes']);
    expect((await run(s, request({ url: '/other' })))!.status).toBe(418);
  });

  describe('on a socket', () => {
    const statuses: number[] = [];
    const server = http.createServer((req, res) => {
      statuses.push(sendOutcome(req, res, req.url === '/dc' ? CLOSE_CONNECTION : { status: 204 }));
    });
    let port = 0;
    const ready = new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => ((port = (server.address() as AddressInfo).port), resolve())));
    afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

    const get = (path: string, agent: http.Agent | false = false) =>
      new Promise<number>((resolve, reject) => {
        const req = http.get({ host: '127.0.0.1', port, path, agent }, (res) => {
          res.resume();
          resolve(res.statusCode!);
        });
        req.on('error', reject);
      });

    it('destroys the connection without a response; others on the server are untouched', async () => {
      await ready;
      await expect(get('/dc')).rejects.toMatchObject({ code: 'ECONNRESET', message: 'socket hang up' });
      const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
      expect(await get('/ok', agent)).toBe(204);
      await expect(get('/dc', agent)).rejects.toMatchObject({ code: 'ECONNRESET' });
      expect(await get('/ok', agent)).toBe(204);
      agent.destroy();
      expect(statuses).toEqual([444, 204, 444, 204]);
    });
  });
});
