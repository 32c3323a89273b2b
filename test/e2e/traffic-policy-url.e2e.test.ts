import http from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { IngressProcess } from '../support/cluster.js';
import { startPolicyCluster, type PolicyCluster, type PolicyRequestOptions } from '../support/policy-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * The traffic-policy url-rewrite and redirect actions on live traffic, through real processes: a
 * control plane, two ingress nodes (the agent is on `a`, so requests to `b` cross a hop), our
 * agent and an upstream that echoes the request target it got. Configured through the REST API.
 */

const HOST = 'urls.e2e.test';
let c: PolicyCluster;
let a: IngressProcess;
let b: IngressProcess;

const request = (port: number, p: string, opts?: PolicyRequestOptions) => c.request(p, { ...opts, port });

/** An HTTP/1.1 upgrade: the 101's headers (the upstream echoes the target it got in `x-url`). */
function upgrade(port: number, p: string): Promise<http.IncomingHttpHeaders> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path: p, agent: false, headers: { host: HOST, connection: 'Upgrade', upgrade: 'echo-url' } });
    req.on('upgrade', (res, socket) => {
      socket.destroy();
      resolve(res.headers);
    });
    req.on('response', (res) => reject(new Error(`no upgrade: ${res.statusCode}`)));
    req.setTimeout(10_000, () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end();
  });
}

const route = (match: string, policy: unknown): Promise<string> => c.policyRoute(match, policy);

/** A route's policy refused with a 400: the message. */
async function refused(policy: unknown): Promise<string> {
  const r = await c.tryPolicy(policy);
  expect(r.status, JSON.stringify(r.body)).toBe(400);
  return String(r.body.msg);
}

beforeAll(async () => {
  c = await startPolicyCluster({
    name: 'urls',
    host: HOST,
    nodes: 2,
    upstream: (req, res) => {
      req.resume();
      req.on('end', () => {
        const m = /\/status\/(\d{3})/.exec(req.url ?? '');
        res.writeHead(m ? Number(m[1]) : 200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ url: req.url, host: req.headers.host, seen: req.headers['x-seen'] }));
      });
    },
    upgrade: (req, socket) => {
      socket.end(`HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo-url\r\nX-Url: ${req.url}\r\n\r\n`);
    },
  });
  [a, b] = c.nodes as [IngressProcess, IngressProcess];
}, CLUSTER_HOOK_MS);

afterAll(() => c?.stop(), 60_000);

describe('url-rewrite and redirect on live traffic', () => {
  it('url-rewrite: the upstream gets the rewritten path and query (also over a hop and on an upgrade); later rules see it', async () => {
    await route('/rw', {
      inbound: [
        { expressions: ["req.path.startsWith('/rw/old/')"], actions: [{ type: 'url-rewrite', config: { from: '/rw/old/([^/?]+)', to: '/rw/new/$1/${req.method}' } }] },
        { expressions: ["req.path.startsWith('/rw/new/')"], actions: [{ type: 'custom-response', config: { status_code: 200, body: 'seen as new' } }] },
      ],
    });
    await route('/rx', {
      inbound: [
        { actions: [{ type: 'url-rewrite', config: { from: '^${req.url.scheme}://${req.url.authority}/rx/(\\w+)', to: '/rx-v2/$1' } }] },
        { actions: [{ type: 'add-headers', config: { headers: { 'x-seen': '${req.url.path}|${actions.ngrok.url_rewrite.url}' } } }] },
      ],
    });
    for (const n of [a, b]) {
      const seen = await request(n.http, '/rw/old/items?x=1');
      expect([seen.status, seen.raw.toString()]).toEqual([200, 'seen as new']);
      const r = await request(n.http, '/rx/items?x=1');
      expect(r.status, r.raw.toString()).toBe(200);
      expect(r.json()).toEqual({ url: '/rx-v2/items?x=1', host: HOST, seen: `/rx-v2/items|http://${HOST}/rx-v2/items?x=1` });
      expect(await upgrade(n.http, '/rx/ws?t=2')).toMatchObject({ 'x-url': '/rx-v2/ws?t=2' });
      // Not matching: the client's target, unchanged.
      expect((await request(n.http, '/rx/-?z')).json().url).toBe('/rx/-?z');
    }
  });

  it('url-rewrite: a result that is no valid request target is not applied, and never a 5xx', async () => {
    await route('/rv', { inbound: [{ actions: [{ type: 'url-rewrite', config: { from: '/rv/space', to: '/rv/a b' } }] }] });
    for (const n of [a, b]) {
      const r = await request(n.http, '/rv/space?q');
      expect([r.status, r.json().url]).toEqual([200, '/rv/space?q']);
    }
  });

  it('redirect: 3xx with an absolute Location and headers; no match goes upstream; outbound on a 404', async () => {
    await route('/rd', {
      inbound: [
        { actions: [{ type: 'redirect', config: { from: '^(https?://[^/]+)/rd/old/(.*)$', to: '$1/rd/new/$2', status_code: 301, headers: { 'x-redirected': '${req.method}' } } }] },
        { expressions: ["req.path == '/rd/rel'"], actions: [{ type: 'redirect', config: { to: '/rd/target?from=${req.path}' } }] },
      ],
      outbound: [{ expressions: ['res.status_code == 404'], actions: [{ type: 'redirect', config: { from: '/rd/status/404', to: '/rd/missing', status_code: 307 } }] }],
    });
    for (const n of [a, b]) {
      const moved = await request(n.http, '/rd/old/a/b?c=d');
      expect([moved.status, moved.headers.location, moved.headers['x-redirected'], moved.raw.length]).toEqual([301, `http://${HOST}/rd/new/a/b?c=d`, 'GET', 0]);
      const rel = await request(n.http, '/rd/rel');
      expect([rel.status, rel.headers.location]).toEqual([302, `http://${HOST}/rd/target?from=/rd/rel`]);
      const through = await request(n.http, '/rd/other');
      expect([through.status, through.json().url]).toEqual([200, '/rd/other']);
      const missing = await request(n.http, '/rd/status/404');
      expect([missing.status, missing.headers.location]).toEqual([307, `http://${HOST}/rd/missing`]);
    }
  });

  it('refuses bad configs with a 400 naming the field', async () => {
    expect(await refused({ outbound: [{ actions: [{ type: 'url-rewrite', config: { to: '/x' } }] }] })).toMatch(/outbound\[0\]\.actions\[0\]\.type: url-rewrite can only be used in inbound rules/);
    expect(await refused({ inbound: [{ actions: [{ type: 'url-rewrite', config: { from: '(?<=a)b', to: '/x' } }] }] })).toMatch(/inbound\[0\]\.actions\[0\]\.config\.from: invalid RE2 pattern/);
    expect(await refused({ inbound: [{ actions: [{ type: 'url-rewrite', config: { from: '/a' } }] }] })).toMatch(/inbound\[0\]\.actions\[0\]\.config\.to: is required/);
    expect(await refused({ inbound: [{ actions: [{ type: 'url-rewrite', config: { from: '/(a)', to: '/$2' } }] }] })).toMatch(/config\.to: \$2 refers to capture group 2, but from has 1 capture group/);
    expect(await refused({ inbound: [{ actions: [{ type: 'redirect', config: { to: '/x', status_code: 200 } }] }] })).toMatch(/config\.status_code: must be a redirect status/);
    expect(await refused({ inbound: [{ actions: [{ type: 'redirect', config: { to: '/x', headers: { location: '/y' } } }] }] })).toMatch(/config\.headers\.location: the redirect sets Location itself/);
    expect(await refused({ inbound: [{ actions: [{ type: 'redirect', config: { to: '/x', extra: 1 } }] }] })).toMatch(/config\.extra: unknown field "extra"/);
  });
});
