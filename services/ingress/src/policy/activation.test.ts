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
    // A port that is not the scheme's default stays (as ngrok shows an explicit port); conn.server_port is unchanged.
    const act = new Activation(admin('Admin.example.com:8443'), null);
    expect(act.req.url.toString()).toBe('https://admin.example.com:8443/panel?x=1');
    expect(act.conn.server_port).toBe(8443n);
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
