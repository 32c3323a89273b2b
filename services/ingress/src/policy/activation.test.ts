import { describe, expect, it } from 'vitest';
import type { RouteStage } from '../pipeline/types.js';
import { Activation } from './activation.js';
import { trafficPolicyStage } from './index.js';
import { CONFIG, deps, EDGE, request, route } from './testing.js';

function stage(policy: unknown): RouteStage {
  const s = trafficPolicyStage(route(policy), EDGE, CONFIG, deps());
  if (!s) throw new Error('no stage');
  return s;
}

/** A request for `admin.example.com` (as routed) whose `Host` header is spelled `hostHeader`. */
const admin = (hostHeader: string, o: { ip?: string; headers?: string[] } = {}) =>
  request({ host: 'admin.example.com', ip: o.ip, url: '/panel?x=1', headers: ['Host', hostHeader, ...(o.headers ?? [])] });

/** The Host spellings the ingress routes to the `admin.example.com` edge. */
const SPELLINGS = ['admin.example.com', 'ADMIN.example.com', 'Admin.Example.Com', 'admin.example.com:443', 'ADMIN.EXAMPLE.COM:443', 'admin.example.com.', 'admin.example.com:0443'];

describe('the activation of a request', () => {
  it('req.url is the normalized URL whatever the spelling of Host', () => {
    for (const h of SPELLINGS) {
      const act = new Activation(admin(h), null);
      expect(act.req.url.toString(), h).toBe('https://admin.example.com/panel?x=1');
      expect([act.req.url.authority, act.req.url.host, act.req.host], h).toEqual(['admin.example.com', 'admin.example.com', 'admin.example.com']);
    }
    // A port the edge serves stays (as ngrok shows an explicit port), and is conn.server_port.
    const app = new Activation(request({ host: 'app.example.com', url: '/x', headers: ['Host', 'App.example.com:8443'] }), null);
    expect([app.req.url.toString(), app.req.url.port, app.conn.server_port]).toEqual(['https://app.example.com:8443/x', 8443n, 8443n]);
    // endpoint.*: the edge at the hostport that served the request.
    const e = app.endpoint;
    expect([e.id, e.host, e.port, e.protocol, e.addr]).toEqual(['edghts_1', 'app.example.com', 8443n, 'https', 'app.example.com:8443']);
    expect(new Activation(admin('Admin.example.com:9999'), null).endpoint.addr).toBe('admin.example.com:443');
    // One the client made up (routing falls back to the edge's :443) does not: req.url and
    // conn.server_port show the port served; req.url.raw keeps what was sent.
    const act = new Activation(admin('Admin.example.com:8443'), null);
    expect(act.req.url.toString()).toBe('https://admin.example.com/panel?x=1');
    expect(act.conn.server_port).toBe(443n);
    expect(act.req.url.raw).toBe('https://Admin.example.com:8443/panel?x=1');
  });

  it('a port the client made up in Host passes no deny on req.url or conn.server_port', async () => {
    const s = stage({
      inbound: [
        { expressions: ["req.url.startsWith('https://admin.example.com/')"], actions: [{ type: 'deny', config: { status_code: 403 } }] },
        { expressions: ['conn.server_port == 443'], actions: [{ type: 'deny', config: { status_code: 401 } }] },
      ],
    });
    for (const port of ['8443', '9999', '1']) expect(await s.onRequest!(admin(`admin.example.com:${port}`)), port).toMatchObject({ status: 403 });
    expect(await s.onRequest!(request({ host: 'app.example.com', headers: ['Host', 'app.example.com:9999'] }))).toMatchObject({ status: 401 });
    expect(await s.onRequest!(request({ host: 'app.example.com', headers: ['Host', 'app.example.com:8443'] }))).toBeNull();
  });

  it('a deny on req.url.startsWith(…) cannot be passed by the spelling of Host', async () => {
    const s = stage({ inbound: [{ expressions: ["req.url.startsWith('https://admin.example.com/')"], actions: [{ type: 'deny', config: { status_code: 403 } }] }] });
    for (const h of SPELLINGS) expect(await s.onRequest!(admin(h)), h).toMatchObject({ status: 403 });
    expect(await s.onRequest!(request({ host: 'app.example.com' }))).toBeNull();
  });

  it('runs the new macros on a live request state', async () => {
    const s = stage({
      inbound: [
        { expressions: ["!hasReqHeader('X-Api-Key')"], actions: [{ type: 'deny', config: { status_code: 401 } }] },
        { expressions: ["!inCidrRanges(conn.client_ip, ['10.0.0.0/8', '2001:db8::/32'])"], actions: [{ type: 'deny', config: { status_code: 403 } }] },
        { expressions: ["getReqCookie('role').value != 'admin'"], actions: [{ type: 'deny', config: { status_code: 402 } }] },
        { expressions: ["hasQueryParam('x')"], actions: [{ type: 'custom-response', config: { status_code: 200, body: 'ok' } }] },
      ],
    });
    expect(await s.onRequest!(admin('admin.example.com', { ip: '10.1.2.3' }))).toMatchObject({ status: 401 });
    expect(await s.onRequest!(admin('admin.example.com', { ip: '203.0.113.7', headers: ['x-api-key', 'k'] }))).toMatchObject({ status: 403 });
    expect(await s.onRequest!(admin('admin.example.com', { ip: '::ffff:10.1.2.3', headers: ['x-api-key', 'k', 'Cookie', 'role=user'] }))).toMatchObject({ status: 402 });
    expect(await s.onRequest!(admin('admin.example.com', { ip: '2001:db8::5', headers: ['x-api-key', 'k', 'Cookie', 'a=1; role=admin'] }))).toMatchObject({ status: 200, body: 'ok' });
  });

  it('reads the response cookies in outbound rules', async () => {
    const s = stage({ outbound: [{ expressions: ["hasResCookie('sid') && !getResCookie('sid').secure"], actions: [{ type: 'custom-response', config: { status_code: 500, body: 'insecure cookie' } }] }] });
    expect(await s.onResponse!(admin('admin.example.com'), { status: 200, headers: ['Set-Cookie', 'sid=1; Path=/; HttpOnly'] })).toMatchObject({ status: 500 });
    expect(await s.onResponse!(admin('admin.example.com'), { status: 200, headers: ['Set-Cookie', 'sid=1; Path=/; Secure'] })).toBeFalsy();
    expect(await s.onResponse!(admin('admin.example.com'), { status: 200, headers: [] })).toBeFalsy();
  });
});

describe('the ngrok variables of a live request state', () => {
  /** A request state as the public server builds it: Node's message, its socket, when its head arrived. */
  const live = (o: { rawTarget?: string; url?: string; headers?: Record<string, string>; raw?: string[] } = {}) => {
    const base = request({ host: 'app.example.com', url: o.url ?? '/upload?x=1', headers: ['Host', 'App.Example.com', ...(o.raw ?? [])] });
    const req = Object.assign(base.req, {
      httpVersion: '1.1',
      headers: { host: 'App.Example.com', ...o.headers },
      socket: { remotePort: 40123, localAddress: '::ffff:192.0.2.10' },
    });
    return { ...base, req, rawTarget: o.rawTarget, startedAt: performance.now() - 250 };
  };

  it('fills req.version, req.content_length, req.url.raw, req.ts.header_received, conn.client_port and conn.server_ip', () => {
    const act = new Activation(live({ headers: { 'content-length': '42' }, rawTarget: '/x/../upload?x=1' }), null);
    expect(act.req.version).toBe('HTTP/1.1');
    expect(act.req.content_length).toBe(42n);
    expect(act.req.url.toString()).toBe('https://app.example.com/upload?x=1');
    expect(act.req.url.raw).toBe('https://App.Example.com/x/../upload?x=1');
    expect(act.req.url.raw_path).toBe('/x/../upload');
    expect(act.req.url.port).toBe(443n);
    expect(Math.abs(act.req.ts.header_received.getTime() - (Date.now() - 250))).toBeLessThan(1000);
    expect(act.conn.client_port).toBe(40123n);
    expect(act.conn.server_ip).toBe('192.0.2.10');
    // A target the ingress did not change is its own raw form; a chunked body has no length.
    const plain = new Activation(live({ headers: { 'transfer-encoding': 'chunked' } }), null);
    expect(plain.req.url.raw).toBe('https://App.Example.com/upload?x=1');
    expect(plain.req.content_length).toBe(-1n);
  });

  it('a deny on req.content_length, headers interpolating the new variables', async () => {
    const s = stage({
      inbound: [
        { expressions: ['req.content_length > 10'], actions: [{ type: 'deny', config: { status_code: 413 } }] },
        {
          actions: [
            {
              type: 'add-headers',
              config: { headers: { 'x-client-port': '${conn.client_port}', 'x-version': '${req.version}', 'x-type': '${req.content_type}', 'x-cookie': "${req.cookies['a'][0].value}" } },
            },
          ],
        },
      ],
    });
    expect(await s.onRequest!(live({ headers: { 'content-length': '11' } }))).toMatchObject({ status: 413 });
    const ok = live({ headers: { 'content-length': '10' }, raw: ['Content-Type', 'Text/Plain; charset=utf-8', 'Cookie', 'a=1; a=2'] });
    expect(await s.onRequest!(ok)).toBeNull();
    const added = Object.fromEntries(ok.headers.flatMap((v, i) => (i % 2 === 0 && v.startsWith('x-') ? [[v, ok.headers[i + 1]]] : [])));
    expect(added).toMatchObject({ 'x-client-port': '40123', 'x-version': 'HTTP/1.1', 'x-type': 'text/plain', 'x-cookie': '1' });
  });

  it('outbound: res.content_length and res.content_type', async () => {
    const s = stage({ outbound: [{ expressions: ["res.content_type == 'application/json' && res.content_length > 100"], actions: [{ type: 'custom-response', config: { status_code: 502, body: 'too big' } }] }] });
    expect(await s.onResponse!(live(), { status: 200, headers: ['Content-Type', 'application/json', 'Content-Length', '101'] })).toMatchObject({ status: 502 });
    expect(await s.onResponse!(live(), { status: 200, headers: ['Content-Type', 'application/json', 'Content-Length', '100'] })).toBeFalsy();
  });
});
