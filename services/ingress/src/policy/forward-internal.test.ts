import { describe, expect, it } from 'vitest';
import type { Outcome, RouteStage, StageDeps } from '../pipeline/types.js';
import { trafficPolicyStage } from './index.js';
import { CONFIG, deps, EDGE, request, route } from './testing.js';
import { FORWARD_DEPTH_HEADER, isForward } from './forward-internal.js';

const online = new Set(['ac_1 svc.internal', 'ac_2 other.internal']);
const withLookup = (): StageDeps => ({ ...deps(), internalEndpoint: (host, accountId) => online.has(`${accountId} ${host}`) });

function stage(policy: unknown, d: StageDeps = withLookup()): RouteStage {
  const s = trafficPolicyStage(route(policy), EDGE, CONFIG, d);
  if (!s) throw new Error('no stage');
  return s;
}
const fi = (url: string, onError?: string) => ({ type: 'forward-internal', config: { url, ...(onError ? { on_error: onError } : {}) } });
const forwardOf = (o: Outcome) => (o && isForward(o) ? o.forward : null);

describe('forward-internal in the engine', () => {
  it("forwards to the route's account's internal endpoint; no later inbound action runs", async () => {
    const s = stage({ inbound: [{ actions: [fi('https://SVC.internal:443'), { type: 'deny' }] }] });
    const out = await s.onRequest!(request());
    expect(forwardOf(out)).toEqual({ host: 'svc.internal', accountId: 'ac_1', depth: 1 });
  });

  it("halts with 503 7003 when no such endpoint is online in the account (another account's does not count)", async () => {
    for (const url of ['https://nope.internal', 'https://other.internal']) {
      const out = (await stage({ inbound: [{ actions: [fi(url)] }] }).onRequest!(request())) as Exclude<Outcome, null>;
      expect([out.status, (out.headers as Record<string, string>)['warren-error-code']]).toEqual([503, 'ERR_WARREN_7003']);
    }
  });

  it('goes on with on_error: continue; an interpolated url that is no endpoint URL is such an error', async () => {
    const s = stage({ inbound: [{ actions: [fi("https://${req.url.path.substring(1)}", 'continue'), { type: 'custom-response', config: { status_code: 200, body: 'fallback' } }] }] });
    expect(await s.onRequest!(request({ url: '/a/b' }))).toMatchObject({ status: 200, body: 'fallback' });
    expect(forwardOf(await s.onRequest!(request({ url: '/svc.internal' })))).toEqual({ host: 'svc.internal', accountId: 'ac_1', depth: 1 });
  });

  it('counts forwards on hops and stops at the bound; a public request cannot claim a depth', async () => {
    const s = stage({ inbound: [{ actions: [fi('https://svc.internal')] }] });
    const hop = (depth: string) => {
      const r = request({ headers: ['Host', 'app.example.com'] });
      r.req.headers[FORWARD_DEPTH_HEADER] = depth;
      return r;
    };
    // Public (no hop facts): the header is the client's, ignored.
    expect(forwardOf(await s.onRequest!(hop('7')))).toMatchObject({ depth: 1 });
    const onHop = (depth: string) => Object.assign(hop(depth), { conn: {} as never });
    expect(forwardOf(await s.onRequest!(onHop('7')))).toMatchObject({ depth: 8 });
    const out = (await s.onRequest!(onHop('8'))) as Exclude<Outcome, null>;
    expect(out.status).toBe(503);
    expect(String(out.body)).toContain('forwarded 8 times');
  });

  it('without the lookup (no registry), nothing is online', async () => {
    const out = (await stage({ inbound: [{ actions: [fi('https://svc.internal')] }] }, deps()).onRequest!(request())) as Exclude<Outcome, null>;
    expect(out.status).toBe(503);
  });
});
