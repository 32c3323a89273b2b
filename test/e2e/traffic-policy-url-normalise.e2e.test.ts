import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { IngressProcess } from '../support/cluster.js';
import { startPolicyCluster, type PolicyCluster } from '../support/policy-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * A url-rewrite's result is normalised as a client's request target is (dot segments removed,
 * `%2e` ones too, repeated slashes merged, the query kept as sent; a backslash refused), so that
 * later rules and the upstream see one path: query text moved into the path cannot pass a later
 * deny on `req.path` while an upstream that resolves dot segments serves the denied resource.
 * Through real processes: a control plane, two ingress nodes (the agent is on `a`, so requests to
 * `b` cross a hop), our agent and an upstream that echoes the request target it got.
 */

const HOST = 'urlnorm.e2e.test';
let c: PolicyCluster;
let a: IngressProcess;
let b: IngressProcess;

const get = (port: number, p: string) => c.request(p, { port });

beforeAll(async () => {
  c = await startPolicyCluster({
    name: 'urlnorm',
    host: HOST,
    nodes: 2,
    upstream: (req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ url: req.url, seen: req.headers['x-seen'] }));
      });
    },
  });
  [a, b] = c.nodes as [IngressProcess, IngressProcess];
  await c.policyRoute('/shop', {
    inbound: [
      // /shop/search?q=shoes → /shop/items/shoes (query text, kept as sent, moved into the path)
      { expressions: ["req.path == '/shop/search'"], actions: [{ type: 'url-rewrite', config: { from: '/shop/search\\?q=([^&]*)', to: '/shop/items/$1' } }] },
      { expressions: ["req.path.startsWith('/shop/admin')"], actions: [{ type: 'deny', config: { status_code: 403 } }] },
      { expressions: ["req.url.path.startsWith('/shop/secret')"], actions: [{ type: 'deny', config: { status_code: 403 } }] },
      { actions: [{ type: 'add-headers', config: { headers: { 'x-seen': '${req.url.path}|${actions.ngrok.url_rewrite.error.code}' } } }] },
    ],
  });
  await c.policyRoute('/keep', { inbound: [{ actions: [{ type: 'url-rewrite', config: { from: '/keep/old/', to: '/keep/x/../new/./' } }] }] });
  await c.policyRoute('/go', {
    inbound: [{ actions: [{ type: 'redirect', config: { from: '/go/search\\?q=([^&]*)', to: '/go/items/$1' } }] }],
  });
}, CLUSTER_HOOK_MS);

afterAll(() => c?.stop(), 60_000);

describe('url-rewrite result and path normalisation on live traffic', () => {
  it('control: a client path with dot segments is normalised and denied; one with a backslash is refused', async () => {
    for (const n of [a, b]) {
      expect((await get(n.http, '/shop/items/../admin')).status).toBe(403);
      expect((await get(n.http, '/shop/items/%2e%2e/secret')).status).toBe(403);
      expect((await get(n.http, '/shop/items/..\\admin')).status).toBe(400);
    }
  });

  it('a rewritten path with dot segments is normalised before later rules see it: the deny fires', async () => {
    for (const n of [a, b]) {
      for (const q of ['../admin', '%2e%2e/admin', '.%2E/secret', './../secret/x', '..//admin']) {
        const r = await get(n.http, `/shop/search?q=${q}`);
        expect(r.status, `${n.nodeId} ${q}: ${r.body}`).toBe(403);
      }
    }
  });

  it('the upstream and later rules get the normalised path; the query of the result is kept as sent', async () => {
    for (const n of [a, b]) {
      for (const [q, url] of [
        ['a/../b', '/shop/items/b'],
        ['x//y/.', '/shop/items/x/y/'],
        ['%7euser', '/shop/items/~user'],
        ['shoes', '/shop/items/shoes'],
        ['a%2F..%2Fb', '/shop/items/a%2F..%2Fb'],
      ]) {
        const r = await get(n.http, `/shop/search?q=${q}`);
        expect([r.status, r.json()], `${n.nodeId} ${q}`).toEqual([200, { url, seen: `${url}|` }]);
      }
      const kept = await get(n.http, '/keep/old/a?x=../y&z=%2e%2e%2F');
      expect([kept.status, kept.json().url]).toEqual([200, '/keep/new/a?x=../y&z=%2e%2e%2F']);
    }
  });

  it('a rewritten path with a backslash (raw or %5C) is not applied: an evaluation error, the request goes on unrewritten', async () => {
    for (const n of [a, b]) {
      for (const q of ['..\\admin', '..%5Cadmin', '..%5csecret']) {
        const r = await get(n.http, `/shop/search?q=${q}`);
        expect([r.status, r.json()], `${n.nodeId} ${q}`).toEqual([200, { url: `/shop/search?q=${q}`, seen: '/shop/search|invalid_url' }]);
      }
    }
  });

  it('redirect: the Location is resolved as a WHATWG URL (dot segments removed) and the client resolves it itself', async () => {
    const r = await get(a.http, '/go/search?q=../admin');
    expect([r.status, r.headers.location]).toEqual([302, `http://${HOST}/go/admin`]);
  });
});
