import { describe, expect, it } from 'vitest';
import { CEL_TIME, CelActions, CelConn, CelRequest, normalizeAuthority } from './cel-vars.js';
import { compileExpression } from './cel.js';

/**
 * `req.url` is ngrok's "normalized full URL": the authority as the client spelled it in `Host`
 * (upper-case letters, the scheme's default port, a trailing dot) must not change it, or a rule
 * such as `req.url.startsWith('https://admin.example.com/')` → deny is passed by writing
 * `Host: ADMIN.example.com` or `Host: admin.example.com:443`, which route to the same edge.
 */

function request(scheme: 'http' | 'https', hostHeader: string, host = 'admin.example.com', path = '/panel', rawQuery = '') {
  return new CelRequest({ method: 'GET', scheme, host, authority: hostHeader, path, rawQuery, headers: () => ['Host', hostHeader] });
}
const run = (expr: string, req: CelRequest): unknown => compileExpression('inbound', expr, false)({ req, conn: new CelConn('203.0.113.7', 443), actions: new CelActions(), time: CEL_TIME });

describe('normalizeAuthority', () => {
  it('lower-cases the host and drops the scheme default port', () => {
    expect(normalizeAuthority('https', 'ADMIN.Example.COM')).toBe('admin.example.com');
    expect(normalizeAuthority('https', 'admin.example.com:443')).toBe('admin.example.com');
    expect(normalizeAuthority('https', 'Admin.example.com:443')).toBe('admin.example.com');
    expect(normalizeAuthority('http', 'admin.example.com:80')).toBe('admin.example.com');
    expect(normalizeAuthority('https', 'admin.example.com:0443')).toBe('admin.example.com');
  });

  it('keeps a port that is not the default, without leading zeros', () => {
    expect(normalizeAuthority('https', 'admin.example.com:8443')).toBe('admin.example.com:8443');
    expect(normalizeAuthority('http', 'admin.example.com:443')).toBe('admin.example.com:443');
    expect(normalizeAuthority('https', 'admin.example.com:80')).toBe('admin.example.com:80');
    expect(normalizeAuthority('https', 'ADMIN.example.com:08443')).toBe('admin.example.com:8443');
  });

  it('drops a trailing dot (the ingress routes `admin.example.com.` to the same edge)', () => {
    expect(normalizeAuthority('https', 'admin.example.com.')).toBe('admin.example.com');
    expect(normalizeAuthority('https', 'Admin.Example.com.:443')).toBe('admin.example.com');
  });

  it('keeps IPv6 brackets, lower-cases the address, drops the default port', () => {
    expect(normalizeAuthority('https', '[2001:DB8::1]')).toBe('[2001:db8::1]');
    expect(normalizeAuthority('https', '[2001:db8::1]:443')).toBe('[2001:db8::1]');
    expect(normalizeAuthority('http', '[::1]:8080')).toBe('[::1]:8080');
    expect(normalizeAuthority('http', '[::FFFF:127.0.0.1]:80')).toBe('[::ffff:127.0.0.1]');
  });

  it('returns the usual Host as is (no work, the same string)', () => {
    const h = 'app.example.com';
    expect(normalizeAuthority('https', h)).toBe(h);
    expect(normalizeAuthority('http', '203.0.113.7')).toBe('203.0.113.7');
  });
});

describe('req.url is the normalized URL', () => {
  it('the Host spellings that reach the edge give one URL, authority and host', () => {
    for (const hostHeader of ['admin.example.com', 'ADMIN.example.com', 'admin.example.com:443', 'Admin.Example.Com:443', 'admin.example.com.', 'admin.example.com:0443']) {
      const req = request('https', hostHeader);
      expect(req.url.toString(), hostHeader).toBe('https://admin.example.com/panel');
      expect(run("req.url == 'https://admin.example.com/panel'", req), hostHeader).toBe(true);
      expect(run("req.url.startsWith('https://admin.example.com/')", req), hostHeader).toBe(true);
      expect(run("req.url.authority == 'admin.example.com' && req.url.host == 'admin.example.com' && req.host == 'admin.example.com'", req), hostHeader).toBe(true);
    }
    for (const hostHeader of ['admin.example.com', 'ADMIN.EXAMPLE.COM:80']) {
      expect(request('http', hostHeader).url.toString()).toBe('http://admin.example.com/panel');
    }
  });

  it('keeps a non-default port in the URL and the authority, not in the host', () => {
    const req = request('https', 'Admin.example.com:8443', 'admin.example.com', '/api', 'x=1');
    expect(req.url.toString()).toBe('https://admin.example.com:8443/api?x=1');
    expect(run("req.url.authority == 'admin.example.com:8443' && req.url.host == 'admin.example.com'", req)).toBe(true);
  });

  it('IPv6: brackets in the URL, the authority and req.url.host', () => {
    const req = request('https', '[2001:DB8::7]:443', '2001:db8::7', '/');
    expect(req.url.toString()).toBe('https://[2001:db8::7]/');
    expect(run("req.url.host == '[2001:db8::7]' && req.url.authority == '[2001:db8::7]'", req)).toBe(true);
  });

  it('leaves the path and query as they are', () => {
    const req = request('https', 'ADMIN.example.com', 'admin.example.com', '/Panel/X', 'Q=A');
    expect(req.url.toString()).toBe('https://admin.example.com/Panel/X?Q=A');
  });
});
