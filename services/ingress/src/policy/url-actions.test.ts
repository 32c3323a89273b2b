import { describe, expect, it } from 'vitest';
import { URL_ACTION_LIMITS } from '@warren/shared';
import type { Outcome, RequestState, ResponseState, RouteStage, StageDeps } from '../pipeline/types.js';
import { trafficPolicyStage } from './index.js';
import { CONFIG, deps, EDGE, request, route } from './testing.js';
import { redirectLocation, rewrittenTarget } from './url-actions.js';
import { GENERATED_HEAD_BYTES } from './headers.js';
import { normalizeTarget } from '../http/target.js';

function stage(policy: unknown, d: StageDeps = deps()): RouteStage {
  const s = trafficPolicyStage(route(policy), EDGE, CONFIG, d);
  if (!s) throw new Error('no stage');
  return s;
}

const header = (pairs: string[], name: string) => pairs.filter((_, i) => i % 2 === 1 && pairs[i - 1]!.toLowerCase() === name.toLowerCase());
const vars = (s: RequestState) => (s.vars.actions as { ngrok: Record<'url_rewrite' | 'redirect', { matches: string[]; url: string; error: { code: string; message: string } }> }).ngrok;

async function errorCount(d: StageDeps): Promise<number> {
  const m = d.registry.getSingleMetric('warren_traffic_policy_expression_errors_total');
  return m ? (await m.get()).values.reduce((t, v) => t + v.value, 0) : 0;
}

/** Adds `x-seen` = the request URL as later rules see it. */
const SEEN = { actions: [{ type: 'add-headers', config: { headers: { 'x-seen': '${req.url} ${req.path} ${req.query}' } } }] };

describe('url-rewrite', () => {
  it('sends the rewritten path and query upstream; later rules see it; the Host is unchanged', async () => {
    const s = stage({
      inbound: [
        { expressions: ["req.path.startsWith('/api/v1/')"], actions: [{ type: 'url-rewrite', config: { from: '/api/v1/(\\w+)', to: '/v2/$1' } }] },
        { expressions: ["req.path.startsWith('/v2/')"], ...SEEN },
        { actions: [{ type: 'add-headers', config: { headers: { 'x-rw': '${actions.ngrok.url_rewrite.url} ${actions.ngrok.url_rewrite.matches}' } } }] },
      ],
      outbound: [{ expressions: ["req.path == '/v2/items'"], actions: [{ type: 'add-headers', config: { headers: { 'x-out': '${req.url.path}' } } }] }],
    });
    const r = request({ url: '/api/v1/items?x=1' });
    expect(await s.onRequest!(r)).toBeNull();
    expect(r.target).toBe('/v2/items?x=1');
    expect(r.path).toBe('/api/v1/items'); // the client's, for routing and events
    expect(header(r.headers, 'x-seen')).toEqual(['https://app.example.com/v2/items?x=1 /v2/items x=1']);
    expect(header(r.headers, 'x-rw')).toEqual(['https://app.example.com/v2/items?x=1 /api/v1/items, items']);
    expect(header(r.headers, 'host')).toEqual(['app.example.com']);
    const res: ResponseState = { status: 200, headers: [] };
    expect(await s.onResponse!(r, res)).toBeNull();
    expect(header(res.headers, 'x-out')).toEqual(['/v2/items']);
  });

  it('does nothing when from does not match (no target, url = the request URL)', async () => {
    const s = stage({ inbound: [{ actions: [{ type: 'url-rewrite', config: { from: '/nope', to: '/x' } }] }] });
    const r = request({ url: '/a?b=1' });
    expect(await s.onRequest!(r)).toBeNull();
    expect(r.target).toBeUndefined();
    expect(vars(r).url_rewrite).toMatchObject({ url: 'https://app.example.com/a?b=1', matches: [], error: { code: '' } });
  });

  it('chains: each rewrite works on the previous one', async () => {
    const s = stage({
      inbound: [
        { actions: [{ type: 'url-rewrite', config: { from: '/a/', to: '/b/' } }, { type: 'url-rewrite', config: { from: '/b/', to: '/c/' } }] },
        { expressions: ["req.path == '/c/x'"], ...SEEN },
      ],
    });
    const r = request({ url: '/a/x' });
    await s.onRequest!(r);
    expect(r.target).toBe('/c/x');
    expect(header(r.headers, 'x-seen')).toEqual(['https://app.example.com/c/x /c/x ']);
  });

  it('takes only the path and query of a result with another scheme or host; without from, replaces the whole URL', async () => {
    const s = stage({ inbound: [{ actions: [{ type: 'url-rewrite', config: { from: '^https://[^/]+/old/(.*)$', to: 'http://internal:8080/new/$1' } }] }] });
    const r = request({ url: '/old/x?y=1' });
    await s.onRequest!(r);
    expect(r.target).toBe('/new/x?y=1');
    expect(vars(r).url_rewrite.url).toBe('https://app.example.com/new/x?y=1');
    const whole = stage({ inbound: [{ actions: [{ type: 'url-rewrite', config: { to: '/maintenance?from=${req.path}' } }] }] });
    const m = request({ url: '/any/thing?q' });
    await whole.onRequest!(m);
    expect(m.target).toBe('/maintenance?from=/any/thing');
  });

  it('refuses a result that is no valid request target: not applied, counted, error set', async () => {
    const d = deps();
    const s = stage(
      {
        inbound: [
          { expressions: ["req.path == '/sp'"], actions: [{ type: 'url-rewrite', config: { from: '/sp', to: '/a b' } }] },
          { expressions: ["req.path == '/rel'"], actions: [{ type: 'url-rewrite', config: { from: '^https://[^/]+/rel', to: 'rel' } }] },
          // CR/LF from a header value: never reaches the request line
          { expressions: ["req.path == '/crlf'"], actions: [{ type: 'url-rewrite', config: { from: '/crlf', to: "/x${getReqHeader('x-v')[0]}" } }] },
          { expressions: ["req.path == '/frag'"], actions: [{ type: 'url-rewrite', config: { from: '/frag', to: '/x#y' } }] },
          { expressions: ["req.path == '/err'"], actions: [{ type: 'url-rewrite', config: { from: '/err', to: "/${getReqHeader('x-none')[3]}" } }] },
        ],
      },
      d,
    );
    let n = 0;
    for (const [url, code, headers] of [
      ['/sp', 'invalid_url'],
      ['/rel', 'invalid_url'],
      ['/crlf', 'invalid_url', ['x-v', 'a\r\nX-Injected: 1']],
      ['/frag', 'invalid_url'],
      ['/err', 'evaluation_failed'],
    ] as [string, string, string[]?][]) {
      const r = request({ url, headers: ['Host', 'app.example.com', ...(headers ?? [])] });
      expect(await s.onRequest!(r)).toBeNull();
      expect(r.target, url).toBeUndefined();
      expect(vars(r).url_rewrite.error.code, url).toBe(code);
      expect(vars(r).url_rewrite.error.message.length).toBeGreaterThan(0);
      expect(await errorCount(d)).toBe(++n);
    }
  });

  /** Query text moved into the path (the audit's case), then a deny on the path it gives. */
  const SHOP = {
    inbound: [
      { actions: [{ type: 'url-rewrite', config: { from: '/shop/search\\?q=([^&]*)', to: '/shop/items/$1' } }] },
      { expressions: ["req.path.startsWith('/shop/admin')"], actions: [{ type: 'deny', config: { status_code: 403 } }] },
      { expressions: ["req.url.path.startsWith('/shop/admin')"], actions: [{ type: 'deny', config: { status_code: 404 } }] },
      SEEN,
    ],
  };

  it('normalises the result as a client target: dot segments (also %2e), repeated slashes; later rules and the upstream see it', async () => {
    const s = stage(SHOP);
    for (const q of ['../admin', '%2e%2e/admin', '%2E./admin', '.%2e/admin', './../admin', '..//admin', 'x/../../admin/./users']) {
      const r = request({ url: `/shop/search?q=${q}` });
      expect(await s.onRequest!(r), q).toMatchObject({ status: 403 });
      expect(r.target, q).toMatch(/^\/shop\/admin(\/users)?$/);
      expect(vars(r).url_rewrite.url, q).toBe(`https://app.example.com${r.target}`);
      expect(vars(r).url_rewrite.error.code, q).toBe('');
    }
    // Not a path to deny: the normalised path goes on (and upstream, as `target`).
    for (const [q, target] of [
      ['a/../b', '/shop/items/b'],
      ['a//b/.', '/shop/items/a/b/'],
      ['%61b%7e', '/shop/items/ab~'], // unreserved escapes decoded, as for a client
      ['a%2Fb', '/shop/items/a%2Fb'], // an escaped slash stays one
      ['..%2Fadmin', '/shop/items/..%2Fadmin'], // not a dot segment
    ]) {
      const r = request({ url: `/shop/search?q=${q}` });
      expect(await s.onRequest!(r), q).toBeNull();
      expect(r.target, q).toBe(target);
      expect(header(r.headers, 'x-seen'), q).toEqual([`https://app.example.com${target} ${target} `]);
    }
  });

  it('keeps the query as sent when normalising the path', async () => {
    const s = stage({ inbound: [{ actions: [{ type: 'url-rewrite', config: { from: '/a/(\\w+)', to: '/b/../c//$1' } }] }, SEEN] });
    const r = request({ url: '/a/v?x=../1&y=%2e%2e%2F&z=a\\b' });
    await s.onRequest!(r);
    expect(r.target).toBe('/c/v?x=../1&y=%2e%2e%2F&z=a\\b');
    expect(header(r.headers, 'x-seen')).toEqual(['https://app.example.com/c/v?x=../1&y=%2e%2e%2F&z=a\\b /c/v x=../1&y=%2e%2e%2F&z=a\\b']);
  });

  it('leaves a result that needs no normalising as it is; a result that normalises to the URL changes nothing', async () => {
    const s = stage({
      inbound: [
        { expressions: ["req.path == '/same'"], actions: [{ type: 'url-rewrite', config: { from: '/same', to: '/x/../same' } }] },
        { expressions: ["req.path != '/same'"], actions: [{ type: 'url-rewrite', config: { from: '/api/v1/', to: '/v2/' } }] },
      ],
    });
    const same = request({ url: '/same?q' });
    await s.onRequest!(same);
    expect([same.target, vars(same).url_rewrite.error.code]).toEqual([undefined, '']);
    const r = request({ url: '/api/v1/items.json?a=%2e' });
    await s.onRequest!(r);
    expect(r.target).toBe('/v2/items.json?a=%2e');
  });

  it('refuses a result whose path has a backslash (raw or %5C): not applied, counted, error set; later rules see the URL as it was', async () => {
    const d = deps();
    const s = stage(SHOP, d);
    let n = 0;
    for (const q of ['..\\admin', '..%5Cadmin', '..%5cadmin', 'a\\b']) {
      const r = request({ url: `/shop/search?q=${q}` });
      expect(await s.onRequest!(r), q).toBeNull();
      expect(r.target, q).toBeUndefined();
      expect(vars(r).url_rewrite.error.code, q).toBe('invalid_url');
      expect(vars(r).url_rewrite.error.message, q).toMatch(/backslash/);
      expect(vars(r).url_rewrite.url, q).toBe(`https://app.example.com/shop/search?q=${q}`);
      expect(header(r.headers, 'x-seen'), q).toEqual([`https://app.example.com/shop/search?q=${q} /shop/search q=${q}`]);
      expect(await errorCount(d), q).toBe(++n);
    }
  });

  it('does nothing for a URL over the limit (an evaluation error)', async () => {
    const d = deps();
    const s = stage({ inbound: [{ actions: [{ type: 'url-rewrite', config: { from: '/a', to: '/b' } }] }] }, d);
    const r = request({ url: `/a${'x'.repeat(URL_ACTION_LIMITS.urlChars)}` });
    await s.onRequest!(r);
    expect([r.target, vars(r).url_rewrite.error.code, await errorCount(d)]).toEqual([undefined, 'url_too_long', 1]);
  });
});

describe('redirect', () => {
  it('answers 302 with an absolute Location and the headers; later actions and rules do not run', async () => {
    const s = stage({
      inbound: [
        {
          expressions: ["req.path.startsWith('/old/')"],
          actions: [
            { type: 'redirect', config: { from: '/old/', to: '/new/', headers: { 'X-Redirected': 'by ${conn.client_ip}' } } },
            { type: 'deny', config: { status_code: 418 } },
          ],
        },
        { actions: [{ type: 'deny', config: { status_code: 410 } }] },
      ],
    });
    const r = request({ url: '/old/page?q=1' });
    expect(await s.onRequest!(r)).toEqual({ status: 302, headers: { location: 'https://app.example.com/new/page?q=1', 'X-Redirected': 'by 203.0.113.7' }, body: '' });
    expect(vars(r).redirect).toMatchObject({ url: 'https://app.example.com/new/page?q=1', matches: ['/old/'] });
  });

  it('resolves a relative result and normalises it (spaces percent-encoded, as ngrok does)', async () => {
    const s = stage({ inbound: [{ actions: [{ type: 'redirect', config: { to: "/geo?city=${getReqHeader('x-city')[0]}", status_code: 308 } }] }] });
    const out = (await s.onRequest!(request({ url: '/geo', headers: ['Host', 'app.example.com', 'x-city', 'San Francisco'] }))) as Exclude<Outcome, null>;
    expect([out.status, out.headers!.location]).toEqual([308, 'https://app.example.com/geo?city=San%20Francisco']);
  });

  it('redirects to another host with capture groups', async () => {
    const s = stage({ inbound: [{ actions: [{ type: 'redirect', config: { from: '^https?://[^/]+/old/(.*)$', to: 'https://new.example.com/new/$1', status_code: 301 } }] }] });
    const out = (await s.onRequest!(request({ url: '/old/foo?x' }))) as Exclude<Outcome, null>;
    expect([out.status, out.headers!.location]).toEqual([301, 'https://new.example.com/new/foo?x']);
  });

  it('does nothing when from does not match or the URL is unchanged: the rules go on', async () => {
    const s = stage({
      inbound: [
        { actions: [{ type: 'redirect', config: { from: '/nope', to: '/x' } }] },
        { actions: [{ type: 'redirect', config: { from: 'items', to: 'items' } }] },
        // Relative, resolving to the same URL: no redirect loop.
        { expressions: ["req.path == '/same'"], actions: [{ type: 'redirect', config: { to: '/same' } }] },
        { actions: [{ type: 'custom-response', config: { status_code: 200, body: 'went on' } }] },
      ],
    });
    for (const url of ['/api/items?x=1', '/same']) {
      const r = request({ url });
      expect(await s.onRequest!(r)).toMatchObject({ status: 200, body: 'went on' });
      expect(vars(r).redirect).toMatchObject({ url: '', matches: [], error: { code: '' } });
    }
  });

  it('never sends a Location with a control character: no redirect, counted', async () => {
    const d = deps();
    const s = stage({ inbound: [{ actions: [{ type: 'redirect', config: { to: "/x?v=${getReqHeader('x-v')[0]}" } }] }] }, d);
    const r = request({ url: '/a', headers: ['Host', 'app.example.com', 'x-v', 'a\r\nSet-Cookie: x=1'] });
    expect(await s.onRequest!(r)).toBeNull();
    expect([vars(r).redirect.error.code, await errorCount(d)]).toEqual(['invalid_url', 1]);
    // A header value that interpolates to CR/LF is dropped (the redirect itself goes out).
    const h = stage({ inbound: [{ actions: [{ type: 'redirect', config: { to: '/b', headers: { 'x-v': "${getReqHeader('x-v')[0]}" } } }] }] }, d);
    const out = (await h.onRequest!(request({ url: '/a', headers: ['Host', 'app.example.com', 'x-v', 'a\r\nb'] }))) as Exclude<Outcome, null>;
    expect(out.headers).toEqual({ location: 'https://app.example.com/b' });
    expect(await errorCount(d)).toBe(2);
  });

  it('outbound: replaces the upstream response; sees a rewritten URL', async () => {
    const s = stage({
      inbound: [{ actions: [{ type: 'url-rewrite', config: { from: '/shop/', to: '/store/' } }] }],
      outbound: [{ expressions: ['res.status_code == 404'], actions: [{ type: 'redirect', config: { from: '/store/(.*)$', to: '/catalog?missing=$1' } }] }],
    });
    const r = request({ url: '/shop/shoes' });
    await s.onRequest!(r);
    expect(await s.onResponse!(r, { status: 200, headers: [] })).toBeNull();
    const out = (await s.onResponse!(r, { status: 404, headers: ['content-type', 'text/html'] })) as Exclude<Outcome, null>;
    expect([out.status, out.headers]).toEqual([302, { location: 'https://app.example.com/catalog?missing=shoes' }]);
  });
});

describe('rewrittenTarget / redirectLocation', () => {
  it('derives the request target of a rewritten URL', () => {
    expect(rewrittenTarget('https://h.example:8443/a/b?c=d')).toBe('/a/b?c=d');
    expect(rewrittenTarget('https://h.example')).toBe('/');
    expect(rewrittenTarget('https://h.example?x=1')).toBe('/?x=1');
    expect(rewrittenTarget('/p?q')).toBe('/p?q');
    expect(rewrittenTarget('//other/p')).toBe('/p');
    expect(rewrittenTarget('//other')).toBe('/');
    for (const bad of ['p/q', '', '/a b', '/a\tb', '/a\r\nb', '/é', '/a#b', 'https://h/a b', 'mailto:x']) expect(rewrittenTarget(bad), bad).toBeNull();
  });

  it("normalizes with the ingress's own normalizeTarget (http/target.ts, as a client target): dot segments, %2e, slashes; the query as sent; a backslash refused", () => {
    expect(normalizeTarget('/x/../a?q=../b')).toBe('/a?q=../b');
    expect(normalizeTarget('/x/%2E%2e/a?q=%2e')).toBe('/a?q=%2e');
    expect(normalizeTarget('/a//b')).toBe('/a/b');
    expect(normalizeTarget('/a\\b')).toBeNull();
    expect(normalizeTarget('/a%5cb')).toBeNull();
  });

  it('resolves a Location, refusing control characters', () => {
    const base = 'https://app.example.com/a/b?c';
    expect(redirectLocation('/x', base)).toBe('https://app.example.com/x');
    expect(redirectLocation('x', base)).toBe('https://app.example.com/a/x');
    expect(redirectLocation('//other.example/y', base)).toBe('https://other.example/y');
    expect(redirectLocation('https://ÉXAMPLE.com/é ü', base)).toBe('https://xn--xample-9ua.com/%C3%A9%20%C3%BC');
    for (const bad of ['/x\r\nSet-Cookie: a=1', '/x\n', '/x\u0000', 'http://[bad']) expect(redirectLocation(bad, base), bad).toBeNull();
    expect(redirectLocation(`/${'a'.repeat(URL_ACTION_LIMITS.urlChars)}`, base)).toBeNull();
  });

  it('refuses a backslash before the query: the URL parser reads it as a slash, so /\\evil.example was another host (audit finding)', () => {
    const base = 'https://app.example.com/a/b?c';
    for (const bad of ['/\\evil.example/x', '/\\/evil.example', '\\\\evil.example', 'https://app.example.com\\@evil.example/', '/a\\b']) expect(redirectLocation(bad, base), bad).toBeNull();
    // In the query or fragment it is data, kept as the URL Standard keeps it.
    expect(redirectLocation('/x?p=C:\\dir', base)).toBe('https://app.example.com/x?p=C:\\dir');
  });
});

describe('redirect guarded to local paths', () => {
  it('is not applied when the guarded value carries a backslash (it resolved to http://evil.example/x before)', async () => {
    const d = deps();
    const s = stage({
      inbound: [{ expressions: ["getQueryParam('next')[0].startsWith('/') && !getQueryParam('next')[0].startsWith('//')"], actions: [{ type: 'redirect', config: { to: "${getQueryParam('next')[0]}" } }] }],
    }, d);
    const r = request({ url: '/next?next=%2F%5Cevil.example%2Fx', headers: ['Host', 'app.example.com'] });
    expect(await s.onRequest!(r)).toBeNull();
    expect([vars(r).redirect.error.code, await errorCount(d)]).toEqual(['invalid_url', 1]);
    const ok = (await s.onRequest!(request({ url: '/next?next=%2Fhome', headers: ['Host', 'app.example.com'] }))) as Exclude<Outcome, null>;
    expect(ok.headers).toEqual({ location: 'https://app.example.com/home' });
  });
});

describe('answers the policy makes keep their head within what outbound rules are charged for', () => {
  const headBytes = (h: Record<string, string | string[]> | undefined) => Object.entries(h ?? {}).reduce((t, [k, v]) => t + k.length + String(v).length + 4, 0);

  it('custom-response: headers past GENERATED_HEAD_BYTES are left out and counted (32 values of 8 KiB made a 256 KiB head; audit finding)', async () => {
    const d = deps();
    const headers = Object.fromEntries(Array.from({ length: 32 }, (_, i) => [`x-echo-${i}`, "${getReqHeader('x-a')[0]}"]));
    const s = stage({ inbound: [{ actions: [{ type: 'custom-response', config: { status_code: 200, body: 'b', headers } }] }], outbound: [{ expressions: ["json.encode(res.headers).contains('zzzz')"], actions: [{ type: 'deny' }] }] }, d);
    const r = request({ headers: ['Host', 'app.example.com', 'x-a', 'v'.repeat(8000)] });
    const out = (await s.onRequest!(r)) as Exclude<Outcome, null>;
    expect(out.status).toBe(200);
    expect(headBytes(out.headers)).toBeLessThanOrEqual(GENERATED_HEAD_BYTES);
    expect(Object.keys(out.headers!).filter((k) => k.startsWith('x-echo-'))).toEqual(['x-echo-0']);
    expect(await errorCount(d)).toBe(31);
    // Small values all fit.
    const small = (await s.onRequest!(request({ headers: ['Host', 'app.example.com', 'x-a', 'v'.repeat(100)] }))) as Exclude<Outcome, null>;
    expect(Object.keys(small.headers!).filter((k) => k.startsWith('x-echo-'))).toHaveLength(32);
  });

  it('redirect: the same bound, the Location counted', async () => {
    const d = deps();
    const headers = Object.fromEntries(Array.from({ length: 10 }, (_, i) => [`x-echo-${i}`, "${getReqHeader('x-a')[0]}"]));
    const s = stage({ inbound: [{ actions: [{ type: 'redirect', config: { to: '/elsewhere', headers } }] }] }, d);
    const out = (await s.onRequest!(request({ url: '/a', headers: ['Host', 'app.example.com', 'x-a', 'v'.repeat(7000)] }))) as Exclude<Outcome, null>;
    expect(out.status).toBe(302);
    expect(out.headers!.location).toBe('https://app.example.com/elsewhere');
    expect(headBytes(out.headers)).toBeLessThanOrEqual(GENERATED_HEAD_BYTES);
    expect(Object.keys(out.headers!).filter((k) => k.startsWith('x-echo-'))).toEqual(['x-echo-0', 'x-echo-1']);
    expect(await errorCount(d)).toBe(8);
  });
});
