import { describe, expect, it } from 'vitest';
import { celCompileError } from './testing.js';
import { CEL_TIME, CelActions, CelConn, CelRequest, CelResponse, MAX_CONTENT_CODINGS, MAX_CONTENT_TYPE_PARSED, MAX_REQUEST_COOKIES, normalizeAuthority } from './cel-vars.js';
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

/**
 * The ngrok variables read off the request, the connection and the response
 * (https://ngrok.com/docs/traffic-policy/variables/req/, …/conn/, …/res/): their CEL types (a
 * wrong use does not compile), values, and what they read when the thing is absent.
 */
interface ReqOpts {
  headers?: string[];
  message?: { httpVersion: string; headers: Record<string, string | string[] | undefined> };
  rawTarget?: string;
  receivedAt?: number;
  scheme?: 'http' | 'https';
  authority?: string;
  path?: string;
  rawQuery?: string;
}
function req(o: ReqOpts = {}) {
  const headers = o.headers ?? [];
  return new CelRequest({
    method: 'POST',
    scheme: o.scheme ?? 'https',
    host: 'app.example.com',
    authority: o.authority ?? 'app.example.com',
    path: o.path ?? '/api',
    rawQuery: o.rawQuery ?? '',
    headers: () => headers,
    message: o.message,
    rawTarget: o.rawTarget,
    receivedAt: o.receivedAt,
  });
}
const act = (r: CelRequest, conn = new CelConn('203.0.113.7', 443), res?: CelResponse) => ({ req: r, conn, res, actions: new CelActions(), time: CEL_TIME });
const on = (expr: string, r: CelRequest, conn?: CelConn): unknown => compileExpression('inbound', expr, false)(act(r, conn));
const out = (expr: string, res: CelResponse): unknown => compileExpression('outbound', expr, false)(act(req(), undefined, res));
const response = (status: number, headers: string[]) => new CelResponse({ status: () => status, headers: () => headers });
const notCompiling = celCompileError;

describe('req.version', () => {
  it('is the HTTP version as Go writes it (HTTP/1.1), a string', () => {
    expect(on('req.version', req({ message: { httpVersion: '1.1', headers: {} } }))).toBe('HTTP/1.1');
    expect(on("req.version == 'HTTP/1.0'", req({ message: { httpVersion: '1.0', headers: {} } }))).toBe(true);
    expect(on('req.version.startsWith("HTTP/")', req({ message: { httpVersion: '2.0', headers: {} } }))).toBe(true);
    expect(on('req.version', req())).toBe('');
    expect(notCompiling('req.version > 1')).toMatch(/does not compile/);
  });
});

describe('req.content_length', () => {
  const msg = (headers: Record<string, string>) => ({ httpVersion: '1.1', headers });
  it('is Content-Length as received, an int', () => {
    expect(on('req.content_length', req({ message: msg({ 'content-length': '5001' }) }))).toBe(5001n);
    expect(on('req.content_length > 5000', req({ message: msg({ 'content-length': '5001' }) }))).toBe(true);
    expect(on('req.content_length + 1', req({ message: msg({ 'content-length': '0' }) }))).toBe(1n);
    expect(notCompiling("req.content_length == '5'")).toMatch(/does not compile/);
  });

  it('is -1 for a body of unknown length (chunked) and 0 without a body, so `> n` holds for neither', () => {
    const chunked = req({ message: msg({ 'transfer-encoding': 'chunked' }) });
    expect(on('req.content_length', chunked)).toBe(-1n);
    expect(on('req.content_length > 10', chunked)).toBe(false);
    expect(on('req.content_length', req({ message: msg({}) }))).toBe(0n);
    expect(on('has(req.content_length)', req({ message: msg({}) }))).toBe(true);
  });

  it('reads the headers of the message, not the headers a policy edited', () => {
    expect(on('req.content_length', req({ headers: ['Content-Length', '99'], message: msg({ 'content-length': '12' }) }))).toBe(12n);
    // Without the message (a view built from headers alone), the headers.
    expect(on('req.content_length', req({ headers: ['Content-Length', '99'] }))).toBe(99n);
    expect(on('req.content_length', req({ headers: ['Transfer-Encoding', 'chunked'] }))).toBe(-1n);
    expect(on('req.content_length', req())).toBe(0n);
  });

  it('a length past CEL ints reads as the largest int', () => {
    expect(on('req.content_length', req({ message: msg({ 'content-length': '99999999999999999999' }) }))).toBe((1n << 63n) - 1n);
  });
});

describe('req.content_type / res.content_type', () => {
  it('is the media type, lower-case, and compares, concatenates and matches as a string', () => {
    const r = req({ headers: ['Content-Type', 'Application/JSON; charset=UTF-8'] });
    expect(on("req.content_type == 'application/json'", r)).toBe(true);
    expect(on("'application/json' == req.content_type && req.content_type != 'text/html'", r)).toBe(true);
    expect(on("req.content_type in ['text/plain', 'application/json']", r)).toBe(true);
    expect(on("req.content_type.startsWith('application/') && req.content_type.matches('json$')", r)).toBe(true);
    expect(on("'type: ' + req.content_type", r)).toBe('type: application/json');
    expect(on('string(req.content_type)', r)).toBe('application/json');
    expect(on('size(req.content_type) == 16 && req.content_type.size() == 16', r)).toBe(true);
  });

  it('has ngrok raw (the header as sent) and parameters (lower-case names, quotes removed)', () => {
    const r = req({ headers: ['content-type', 'multipart/form-data; Boundary="a \\"b\\""; charset=utf-8'] });
    expect(on('req.content_type.raw', r)).toBe('multipart/form-data; Boundary="a \\"b\\""; charset=utf-8');
    expect(on("req.content_type.parameters['boundary']", r)).toBe('a "b"');
    expect(on("req.content_type.parameters['charset'] == 'utf-8' && size(req.content_type.parameters) == 2", r)).toBe(true);
    expect(on('req.content_type.parameters.size()', req({ headers: ['content-type', 'text/plain;;  '] }))).toBe(0n);
  });

  it("reads as Go's mime.ParseMediaType: a bad media type is '', bad or repeated parameters leave none", () => {
    expect(String(on('req.content_type', req({ headers: ['content-type', 'text'] })))).toBe('text');
    expect(on('req.content_type == ""', req({ headers: ['content-type', 'text/html/x'] }))).toBe(true);
    expect(on('req.content_type == "" && req.content_type.raw == "a b"', req({ headers: ['content-type', 'a b'] }))).toBe(true);
    expect(on('req.content_type == "text/html" && size(req.content_type.parameters) == 0', req({ headers: ['content-type', 'text/html; charset'] }))).toBe(true);
    expect(on('size(req.content_type.parameters)', req({ headers: ['content-type', 'text/html; a=1; A=2'] }))).toBe(0n);
  });

  it(`does not read the parameters of a Content-Type over ${MAX_CONTENT_TYPE_PARSED} characters (an evaluation error); its media type it does`, () => {
    const long = req({ headers: ['content-type', `text/html; x=${'y'.repeat(MAX_CONTENT_TYPE_PARSED)}`] });
    expect(() => on("req.content_type.parameters['x'] == ''", long)).toThrow(/too long to read/);
    expect(on("req.content_type == 'text/html'", long)).toBe(true);
    const most = `text/html; x=${'y'.repeat(MAX_CONTENT_TYPE_PARSED - 13)}`;
    expect(on("size(req.content_type.parameters['x'])", req({ headers: ['content-type', most] }))).toBe(BigInt(MAX_CONTENT_TYPE_PARSED - 13));
  });

  it("without the header: '' and no parameters; the first header when several; sees header edits", () => {
    expect(on("req.content_type == '' && req.content_type.raw == '' && size(req.content_type.parameters) == 0", req())).toBe(true);
    expect(String(on('req.content_type', req({ headers: ['content-type', 'text/html', 'content-type', 'text/plain'] })))).toBe('text/html');
    const headers = ['content-type', 'text/html'];
    const r = new CelRequest({ method: 'GET', scheme: 'https', host: 'h', authority: 'h', path: '/', rawQuery: '', headers: () => headers });
    expect(String(r.content_type)).toBe('text/html');
    headers[1] = 'image/png';
    r.headersChanged();
    expect(String(r.content_type)).toBe('image/png');
  });

  it('res.content_type reads the response (outbound only)', () => {
    expect(out("res.content_type == 'text/html' && res.content_type.parameters['charset'] == 'utf-8'", response(200, ['Content-Type', 'text/html; charset=utf-8']))).toBe(true);
    expect(notCompiling("res.content_type == 'text/html'")).toMatch(/Unknown variable: res/);
  });
});

describe('res.content_length', () => {
  it('is Content-Length; 0 for a status without a body; else -1 (not known)', () => {
    expect(out('res.content_length', response(200, ['Content-Length', '1234']))).toBe(1234n);
    expect(out('res.content_length != 0', response(200, ['Content-Length', '1234']))).toBe(true);
    expect(out('res.content_length', response(204, []))).toBe(0n);
    expect(out('res.content_length', response(304, []))).toBe(0n);
    expect(out('res.content_length', response(200, []))).toBe(-1n);
    expect(notCompiling("res.content_length == 'x'", 'outbound')).toMatch(/does not compile/);
  });
});

describe('req.url.port, req.url.raw, req.url.raw_path', () => {
  it("port: the URL's, else the scheme's default, whatever the spelling of Host (an int)", () => {
    expect(on('req.url.port', req({ authority: 'app.example.com' }))).toBe(443n);
    expect(on('req.url.port', req({ authority: 'App.example.com:443' }))).toBe(443n);
    expect(on('req.url.port', req({ authority: 'app.example.com:8443' }))).toBe(8443n);
    expect(on('req.url.port', req({ scheme: 'http', authority: 'app.example.com' }))).toBe(80n);
    expect(on('req.url.port == 8080', req({ scheme: 'http', authority: '[2001:db8::1]:8080' }))).toBe(true);
    expect(on('req.url.port', req({ authority: '[2001:db8::1]' }))).toBe(443n);
    expect(notCompiling("req.url.port == '443'")).toMatch(/does not compile/);
  });

  it('raw and raw_path: the URL and path as the client sent them, un-normalized', () => {
    const r = req({ authority: 'APP.example.com:443', path: '/admin', rawQuery: 'a=1', rawTarget: '/x/../%61dmin?a=1' });
    expect(on('req.url.raw', r)).toBe('https://APP.example.com:443/x/../%61dmin?a=1');
    expect(on('req.url.raw_path', r)).toBe('/x/../%61dmin');
    expect(String(on('req.url', r))).toBe('https://app.example.com/admin?a=1');
    // An absolute-form target is the raw URL as it is.
    const abs = req({ scheme: 'http', path: '/a', rawTarget: 'http://app.example.com/a/./b?q' });
    expect(on('req.url.raw', abs)).toBe('http://app.example.com/a/./b?q');
    expect(on('req.url.raw_path', abs)).toBe('/a/./b');
    expect(on('req.url.raw_path', req({ rawTarget: 'http://app.example.com?q' }))).toBe('/');
    // Without a raw target: the path and query.
    expect(on('req.url.raw + " " + req.url.raw_path', req({ path: '/p', rawQuery: 'x' }))).toBe('https://app.example.com/p?x /p');
  });
});

describe('req.cookies', () => {
  it('is a map of name to the cookies of that name, in the order sent', () => {
    const r = req({ headers: ['Cookie', 'a=1; b=2; a="3"', 'cookie', 'c; a=4'] });
    expect(on("req.cookies['a'].map(c, c.value)", r)).toEqual(['1', '3', '4']);
    expect(on("req.cookies['sessionId'][0].name", req({ headers: ['cookie', 'sessionId=x'] }))).toBe('sessionId');
    expect(on("size(req.cookies) == 3 && req.cookies['c'][0].value == '' && 'b' in req.cookies", r)).toBe(true);
    expect(on("req.cookies['a'][0].path == '' && !req.cookies['a'][0].secure", r)).toBe(true);
    expect(on('size(req.cookies)', req())).toBe(0n);
  });

  it('reads what getReqCookie reads: the same first cookie of each name, the same pairs skipped', () => {
    const lines = [
      ' a=1 ;b = 2;  c="q";d=x y; e=\\; f="; g=a"b; =nameless; h i=1; j=ok; k;;; ü=1; l=é',
      'a=late; m=1=2; n="unterminated; o= spaced ',
    ];
    const r = req({ headers: lines.flatMap((l) => ['Cookie', l]) });
    const names = ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'h i', 'i', 'j', 'k', 'l', 'm', 'n', 'o', 'ü', ''];
    for (const n of names) {
      const q = JSON.stringify(n);
      expect(on(`(${q} in req.cookies) == hasReqCookie(${q})`, r), n).toBe(true);
      expect(on(`!(${q} in req.cookies) || req.cookies[${q}][0].value == getReqCookie(${q}).value`, r), n).toBe(true);
    }
    expect(on("req.cookies['m'][0].value + '|' + req.cookies['o'][0].value", r)).toBe('1=2| spaced');
  });

  it(`is an evaluation error past ${MAX_REQUEST_COOKIES} cookies; sees header edits`, () => {
    expect(() => on('size(req.cookies) > 0', req({ headers: ['cookie', 'a;'.repeat(MAX_REQUEST_COOKIES + 1)] }))).toThrow(/more than 1000 cookies/);
    expect(on('size(req.cookies)', req({ headers: ['cookie', 'a;'.repeat(MAX_REQUEST_COOKIES)] }))).toBe(1n);
    const headers = ['cookie', 'a=1'];
    const r = new CelRequest({ method: 'GET', scheme: 'https', host: 'h', authority: 'h', path: '/', rawQuery: '', headers: () => headers });
    expect(r.cookies.get('a')?.[0]?.value).toBe('1');
    headers[1] = 'b=2';
    r.headersChanged();
    expect([...r.cookies.keys()]).toEqual(['b']);
  });
});

describe('req.ts.header_received', () => {
  it('is when the head was received, as a timestamp', () => {
    const at = performance.now() - 1500;
    const r = req({ receivedAt: at });
    const t = on('req.ts.header_received', r) as Date;
    expect(t).toBeInstanceOf(Date);
    expect(Math.abs(t.getTime() - (Date.now() - 1500))).toBeLessThan(1000);
    expect(on("req.ts.header_received < time.now && req.ts.header_received > timestamp('2023-12-31T00:00:00Z')", r)).toBe(true);
    expect(on("time.now - req.ts.header_received > duration('1s')", r)).toBe(true);
    expect(notCompiling("req.ts.header_received == 'x'")).toMatch(/does not compile/);
  });

  it('unknown (a view without it): reading it is an evaluation error', () => {
    expect(() => on('req.ts.header_received < time.now', req())).toThrow(/not known/);
  });
});

describe('conn.client_port, conn.server_ip', () => {
  it("read the connection's socket: the client's port (an int), the ingress address (IPv4-mapped as IPv4)", () => {
    const conn = new CelConn('203.0.113.7', 443, null, false, null, { remotePort: 51234, localAddress: '::ffff:10.0.0.5' });
    expect(on('conn.client_port', req(), conn)).toBe(51234n);
    expect(on("conn.server_ip == '10.0.0.5' && conn.client_port > 1024", req(), conn)).toBe(true);
    expect(on('conn.server_ip', req(), new CelConn('2001:db8::7', 443, null, false, null, { remotePort: 1, localAddress: '2001:db8::1' }))).toBe('2001:db8::1');
    expect(notCompiling("conn.client_port == '1'")).toMatch(/does not compile/);
  });

  it("without a socket (or once it is closed): 0 and ''", () => {
    expect(on("conn.client_port == 0 && conn.server_ip == ''", req())).toBe(true);
    expect(on("conn.client_port == 0 && conn.server_ip == ''", req(), new CelConn('203.0.113.7', 443, null, false, null, {}))).toBe(true);
  });
});

describe('conn.bytes_in, conn.bytes_out, conn.ts.start, conn.server_region', () => {
  it("read the connection's byte counts (ints), when it was accepted (a timestamp) and the node", () => {
    const startedAt = Date.now() - 2500;
    const conn = new CelConn('203.0.113.7', 443, null, false, null, { remotePort: 1, bytesRead: 1834, bytesWritten: 77 }, { startedAt, region: 'ingress-a' });
    expect(on('conn.bytes_in', req(), conn)).toBe(1834n);
    expect(on('conn.bytes_out', req(), conn)).toBe(77n);
    expect(on('conn.bytes_in > 1000 && conn.bytes_out < 100', req(), conn)).toBe(true);
    expect((on('conn.ts.start', req(), conn) as Date).getTime()).toBe(startedAt);
    expect(on("time.now - conn.ts.start > duration('2s') && conn.ts.start > timestamp('2023-12-31T00:00:00Z')", req(), conn)).toBe(true);
    expect(on("conn.server_region == 'ingress-a'", req(), conn)).toBe(true);
    expect(on("'region ' + conn.server_region", req(), conn)).toBe('region ingress-a');
    expect(notCompiling("conn.bytes_in == '1'")).toMatch(/does not compile/);
    expect(notCompiling("conn.ts.start == 'x'")).toMatch(/does not compile/);
  });

  it("without a socket: 0 bytes and '' for the region; conn.ts.start not known is an evaluation error", () => {
    expect(on("conn.bytes_in == 0 && conn.bytes_out == 0 && conn.server_region == ''", req())).toBe(true);
    expect(() => on('conn.ts.start < time.now', req())).toThrow(/conn\.ts\.start is not known/);
  });
});

describe('req.content_encoding, res.content_encoding, req.location, res.location', () => {
  it('content_encoding: the codings of every Content-Encoding header, in order, trimmed and lower-case', () => {
    expect(on('req.content_encoding', req({ headers: ['Content-Encoding', 'GZip , br', 'content-encoding', ' deflate,,'] }))).toEqual(['gzip', 'br', 'deflate']);
    expect(on("'gzip' in req.content_encoding", req({ headers: ['Content-Encoding', 'gzip'] }))).toBe(true);
    expect(on('size(req.content_encoding)', req())).toBe(0n);
    expect(out("res.content_encoding == ['br'] && !('gzip' in res.content_encoding)", response(200, ['Content-Encoding', 'br']))).toBe(true);
    expect(out('res.content_encoding', response(200, []))).toEqual([]);
    expect(notCompiling("res.content_encoding == 'x'", 'outbound')).toMatch(/does not compile/);
  });

  it(`content_encoding: an evaluation error past ${MAX_CONTENT_CODINGS} codings (empty parts do not count)`, () => {
    const most = req({ headers: ['content-encoding', 'a,'.repeat(MAX_CONTENT_CODINGS) + ', ,\t,'.repeat(1000)] });
    expect(on('size(req.content_encoding)', most)).toBe(BigInt(MAX_CONTENT_CODINGS));
    expect(() => on("'gzip' in req.content_encoding", req({ headers: ['content-encoding', 'a,'.repeat(MAX_CONTENT_CODINGS + 1)] }))).toThrow(/more than 32 codings/);
    expect(() => out("'gzip' in res.content_encoding", response(200, ['content-encoding', 'a,'.repeat(MAX_CONTENT_CODINGS), 'Content-Encoding', 'b']))).toThrow(/res\.content_encoding: Content-Encoding names more than 32/);
  });

  it('location: the first Location header, "" without one', () => {
    expect(on("req.location == '/next'", req({ headers: ['Location', '/next', 'location', '/other'] }))).toBe(true);
    expect(on("req.location == ''", req())).toBe(true);
    expect(out("res.location.startsWith('https://login.example.com/')", response(302, ['Location', 'https://login.example.com/?r=1']))).toBe(true);
    expect(out('res.location', response(200, []))).toBe('');
    expect(notCompiling("res.location == ''")).toMatch(/Unknown variable: res/);
  });

  it('see header edits', () => {
    const headers = ['content-encoding', 'gzip', 'location', '/a'];
    const r = new CelResponse({ status: () => 200, headers: () => headers });
    expect(r.content_encoding).toEqual(['gzip']);
    expect(r.location).toBe('/a');
    headers[1] = 'br';
    headers[3] = '/b';
    r.headersChanged();
    expect(r.content_encoding).toEqual(['br']);
    expect(r.location).toBe('/b');
  });
});

describe('res.cookies', () => {
  const setCookies = (...lines: string[]) => response(200, lines.flatMap((l) => ['Set-Cookie', l]));

  it('is a map of name to the cookies the response sets, with their attributes', () => {
    const r = setCookies('sessionId=abc; Path=/; Secure; HttpOnly; SameSite=lax; Max-Age=60', 'theme=dark; Domain=example.com; Expires=Wed, 21 Oct 2065 07:28:00 GMT; Priority=High');
    expect(out("res.cookies['sessionId'][0].secure && res.cookies['sessionId'][0].http_only", r)).toBe(true);
    expect(out("res.cookies['sessionId'][0].value + '|' + res.cookies['sessionId'][0].same_site + '|' + res.cookies['sessionId'][0].path", r)).toBe('abc|Lax|/');
    expect(out("res.cookies['sessionId'][0].max_age == duration('60s')", r)).toBe(true);
    expect(out("res.cookies['theme'][0].domain == 'example.com' && res.cookies['theme'][0].expires == timestamp('2065-10-21T07:28:00Z')", r)).toBe(true);
    expect(out("res.cookies['theme'][0].unparsed_attributes['Priority']", r)).toBe('High');
    expect(out('size(res.cookies)', r)).toBe(2n);
    expect(out('size(res.cookies)', response(200, []))).toBe(0n);
  });

  it('orders the cookies of one name longest path first, the order sent at a tie', () => {
    const r = setCookies('a=root; Path=/', 'a=deep; Path=/app/admin', 'a=none', 'a=mid; Path=/app', 'a=mid2; Path=/api');
    expect(out("res.cookies['a'].map(c, c.value)", r)).toEqual(['deep', 'mid', 'mid2', 'root', 'none']);
    // getResCookie picks the same first one.
    expect(out("res.cookies['a'][0].value == getResCookie('a').value", r)).toBe(true);
  });

  it('reads what getResCookie reads: the same lines skipped', () => {
    const lines = ['=nameless', 'no equals', 'h i=1', 'ü=1', 'bad="q', ' sp = 1 ; Path=/x', 'ok=1'];
    const r = setCookies(...lines);
    for (const n of ['', 'no equals', 'h i', 'ü', 'bad', 'sp', 'ok']) {
      const q = JSON.stringify(n);
      expect(out(`(${q} in res.cookies) == hasResCookie(${q})`, r), n).toBe(true);
      expect(out(`!(${q} in res.cookies) || res.cookies[${q}][0].value == getResCookie(${q}).value`, r), n).toBe(true);
    }
    expect(out('size(res.cookies)', r)).toBe(2n);
  });

  it('is outbound only and sees header edits', () => {
    expect(notCompiling("size(res.cookies) > 0")).toMatch(/Unknown variable: res/);
    const headers = ['set-cookie', 'a=1'];
    const r = new CelResponse({ status: () => 200, headers: () => headers });
    expect([...r.cookies.keys()]).toEqual(['a']);
    headers[1] = 'b=2';
    r.headersChanged();
    expect([...r.cookies.keys()]).toEqual(['b']);
  });
});
