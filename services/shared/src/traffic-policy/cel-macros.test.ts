import { describe, expect, it } from 'vitest';
import { celCompileError } from './testing.js';
import { CEL_TIME, CelActions, CelConn, CelRequest, CelResponse } from './cel-vars.js';
import { compileExpression } from './cel.js';
import { inCidr, matchAddress, parseMatchCidr } from './cidr-macros.js';
import { parseTrafficPolicy, TrafficPolicyError } from './parse.js';
import type { PolicyDirection } from './types.js';

/**
 * The macros ngrok documents besides getReqHeader / getResHeader / getQueryParam
 * (https://ngrok.com/docs/traffic-policy/macros/): hasReqHeader, hasResHeader, hasQueryParam,
 * getReqCookie, hasReqCookie, getResCookie, hasResCookie, inCidrRange, inCidrRanges.
 */

interface Opts {
  headers?: string[];
  resHeaders?: string[];
  query?: string;
  ip?: string;
}

function activation(o: Opts = {}) {
  const headers = o.headers ?? [];
  const resHeaders = o.resHeaders ?? [];
  return {
    req: new CelRequest({ method: 'GET', scheme: 'https', host: 'app.example.com', authority: 'app.example.com', path: '/', rawQuery: o.query ?? '', headers: () => headers }),
    conn: new CelConn(o.ip ?? '203.0.113.7', 443),
    res: new CelResponse({ status: () => 200, headers: () => resHeaders }),
    actions: new CelActions(),
    time: CEL_TIME,
  };
}

const run = (expr: string, o: Opts = {}, direction: PolicyDirection = 'inbound'): unknown => compileExpression(direction, expr, false)(activation(o));
const out = (expr: string, o: Opts = {}): unknown => run(expr, o, 'outbound');

const compileError = celCompileError;

describe('hasReqHeader / hasResHeader / hasQueryParam', () => {
  it('hasReqHeader: true when the header was sent (any case, even empty or repeated), false otherwise', () => {
    const headers = ['X-Version-Id', '7', 'X-Empty', '', 'X-Twice', 'a', 'x-twice', 'b'];
    expect(run("hasReqHeader('X-Version-Id')", { headers })).toBe(true);
    expect(run("hasReqHeader('x-version-id')", { headers })).toBe(true);
    expect(run("hasReqHeader('X-Empty')", { headers })).toBe(true);
    expect(run("hasReqHeader('X-Twice') && getReqHeader('X-Twice') == ['a', 'b']", { headers })).toBe(true);
    expect(run("hasReqHeader('Authorization')", { headers })).toBe(false);
    expect(run("hasReqHeader('')", { headers })).toBe(false);
    // Both directions read the request.
    expect(out("hasReqHeader('x-version-id')", { headers })).toBe(true);
  });

  it('hasReqHeader sees header edits (the header map path)', () => {
    const headers = ['X-A', '1'];
    const act = activation({ headers });
    expect(compileExpression('inbound', "req.headers.size() == 1 && hasReqHeader('x-a') && !hasReqHeader('x-b')")(act)).toBe(true);
    headers.push('X-B', '2');
    act.req.headersChanged();
    expect(compileExpression('inbound', "hasReqHeader('X-B')")(act)).toBe(true);
  });

  it('hasResHeader: the response headers, outbound only', () => {
    const resHeaders = ['Content-Type', 'application/json', 'X-None', ''];
    expect(out("hasResHeader('Content-Type')", { resHeaders })).toBe(true);
    expect(out("hasResHeader('content-type') && hasResHeader('x-none')", { resHeaders })).toBe(true);
    expect(out("hasResHeader('Location')", { resHeaders })).toBe(false);
    expect(compileError("hasResHeader('Content-Type')")).toMatch(/found no matching overload for 'hasResHeader\(string\)'/);
  });

  it('hasQueryParam: a parameter of that exact name, with or without a value', () => {
    expect(run("hasQueryParam('q')", { query: 'q=hello&x=1' })).toBe(true);
    expect(run("hasQueryParam('flag')", { query: 'a=1&flag' })).toBe(true);
    expect(run("hasQueryParam('empty') && getQueryParam('empty') == ['']", { query: 'empty=' })).toBe(true);
    expect(run("hasQueryParam('Q')", { query: 'q=hello' })).toBe(false);
    expect(run("hasQueryParam('q')", { query: '' })).toBe(false);
    expect(run("hasQueryParam('a b')", { query: 'a+b=1' })).toBe(true);
  });

  it('take a string: another type does not compile', () => {
    expect(compileError('hasReqHeader(1)')).toMatch(/hasReqHeader\(\) takes a string, got int/);
    expect(compileError('hasQueryParam([])')).toMatch(/hasQueryParam\(\) takes a string/);
  });
});

describe('getReqCookie / hasReqCookie', () => {
  it("returns the request's cookie as ngrok's cookie struct (name and value; the attributes empty)", () => {
    const headers = ['Cookie', 'theme=dark; session=abc123; lang=en'];
    expect(run("getReqCookie('session').value", { headers })).toBe('abc123');
    expect(run("getReqCookie('session').name", { headers })).toBe('session');
    expect(run("getReqCookie('session').secure || getReqCookie('session').http_only", { headers })).toBe(false);
    expect(run("getReqCookie('session').path == '' && getReqCookie('session').same_site == ''", { headers })).toBe(true);
    expect(run("getReqCookie('session').expires == timestamp('0001-01-01T00:00:00Z') && getReqCookie('session').max_age == duration('0s')", { headers })).toBe(true);
    expect(run("size(getReqCookie('session').unparsed_attributes) == 0", { headers })).toBe(true);
    expect(run("hasReqCookie('theme') && hasReqCookie('lang')", { headers })).toBe(true);
    // Outbound rules read the request's cookies too.
    expect(out("getReqCookie('lang').value == 'en'", { headers })).toBe(true);
  });

  it('an absent cookie: has is false, get gives an empty cookie (so a rule on its value applies to the request)', () => {
    const headers = ['Cookie', 'a=1'];
    expect(run("hasReqCookie('session')", { headers })).toBe(false);
    expect(run("getReqCookie('session').value == '' && getReqCookie('session').name == ''", { headers })).toBe(true);
    expect(run("getReqCookie('role').value != 'admin'", {})).toBe(true);
    expect(run("hasReqCookie('a')", {})).toBe(false);
  });

  it('takes the first of repeated cookies, across Cookie headers in order', () => {
    const headers = ['Cookie', 'x=0; id=first', 'Cookie', 'id=second'];
    expect(run("getReqCookie('id').value", { headers })).toBe('first');
    expect(run("getReqCookie('id').value", { headers: ['Cookie', 'x=0', 'cookie', 'id=second; id=third'] })).toBe('second');
  });

  it('reads Cookie headers as Go does: trimmed parts, quotes dropped, invalid pairs skipped, names exact', () => {
    expect(run("getReqCookie('s').value", { headers: ['Cookie', '  s="quoted"  ;t=1'] })).toBe('quoted');
    // Spaces after `=` belong to the value (Go trims the part and the name only), so quotes there are not a value.
    expect(run("getReqCookie('s').value", { headers: ['Cookie', 's = v'] })).toBe(' v');
    expect(run("hasReqCookie('s')", { headers: ['Cookie', 's = "quoted"'] })).toBe(false);
    expect(run("getReqCookie('s').value", { headers: ['Cookie', 's=a\\b; s=ok'] })).toBe('ok'); // a backslash is not a cookie value
    expect(run("getReqCookie('s').value", { headers: ['Cookie', 's=a"b; s=next'] })).toBe('next');
    expect(run("getReqCookie('s').value", { headers: ['Cookie', 's=caf\u00e9; s=plain'] })).toBe('plain');
    expect(run("getReqCookie('flag').value == '' && hasReqCookie('flag')", { headers: ['Cookie', 'flag; a=1'] })).toBe(true);
    expect(run("getReqCookie('v').value", { headers: ['Cookie', 'v=a=b=c'] })).toBe('a=b=c');
    expect(run("hasReqCookie('Session')", { headers: ['Cookie', 'session=1'] })).toBe(false);
    expect(run("hasReqCookie('session')", { headers: ['Cookie', 'xsession=1; sessions=2; session_=3'] })).toBe(false);
    // A name that is not an HTTP token never matches.
    expect(run("hasReqCookie('a b')", { headers: ['Cookie', 'a b=1'] })).toBe(false);
    expect(run("hasReqCookie('')", { headers: ['Cookie', '=1'] })).toBe(false);
  });

  it('finds a cookie only where a part names it, not inside another cookie', () => {
    expect(run("hasReqCookie('session')", { headers: ['Cookie', 'x=session=1; y=session'] })).toBe(false);
    expect(run("hasReqCookie('session')", { headers: ['Cookie', 'x=1;session;'] })).toBe(true);
    expect(run("getReqCookie('b.c').value", { headers: ['Cookie', 'bxc=1; b.c=2'] })).toBe('2');
  });

  it('is read again after a header edit (add-headers of Cookie)', () => {
    const headers = ['Cookie', 'a=1'];
    const act = activation({ headers });
    expect(compileExpression('inbound', "getReqCookie('a').value == '1' && !hasReqCookie('b')")(act)).toBe(true);
    headers.push('Cookie', 'b=2');
    act.req.headersChanged();
    expect(compileExpression('inbound', "hasReqCookie('b') && getReqCookie('b').value == '2'")(act)).toBe(true);
    const resHeaders: string[] = [];
    const out = activation({ resHeaders });
    expect(compileExpression('outbound', "!hasResCookie('sid')")(out)).toBe(true);
    resHeaders.push('Set-Cookie', 'sid=1; Secure');
    out.res.headersChanged();
    expect(compileExpression('outbound', "hasResCookie('sid') && getResCookie('sid').secure")(out)).toBe(true);
  });

  it('the cookie compares by its fields; getResCookie is outbound only', () => {
    expect(compileError("getResCookie('a').value == ''")).toMatch(/found no matching overload for 'getResCookie\(string\)'/);
    expect(compileError("hasResCookie('a')")).toMatch(/found no matching overload for 'hasResCookie\(string\)'/);
    expect(compileError("getReqCookie('a').nope")).toMatch(/does not compile/);
    expect(compileError("getReqCookie('a') == 'x'")).toMatch(/does not compile/);
  });
});

describe('getResCookie / hasResCookie', () => {
  const resHeaders = [
    'Set-Cookie',
    '_device_id=mobile-phone-14; Path=/; Domain=example.com; Secure; HttpOnly; SameSite=lax; Max-Age=86400; Expires=Wed, 21 Oct 2015 07:28:00 GMT; Priority=High; Partitioned',
    'Content-Type',
    'text/plain',
  ];

  it("reads a Set-Cookie header's attributes into ngrok's fields", () => {
    expect(out("getResCookie('_device_id').value == 'mobile-phone-14'", { resHeaders })).toBe(true);
    expect(out("getResCookie('_device_id').path", { resHeaders })).toBe('/');
    expect(out("getResCookie('_device_id').domain", { resHeaders })).toBe('example.com');
    expect(out("getResCookie('_device_id').secure && getResCookie('_device_id').http_only", { resHeaders })).toBe(true);
    expect(out("getResCookie('_device_id').same_site", { resHeaders })).toBe('Lax');
    expect(out("getResCookie('_device_id').max_age == duration('24h')", { resHeaders })).toBe(true);
    expect(out("getResCookie('_device_id').expires == timestamp('2015-10-21T07:28:00Z')", { resHeaders })).toBe(true);
    expect(out("getResCookie('_device_id').unparsed_attributes", { resHeaders })).toEqual(new Map([['Priority', 'High'], ['Partitioned', '']]));
    expect(out("hasResCookie('_device_id') && !hasResCookie('other') && !hasResCookie('_DEVICE_ID')", { resHeaders })).toBe(true);
  });

  it('an absent cookie: has is false, get is an empty cookie', () => {
    expect(out("hasResCookie('x')", { resHeaders: [] })).toBe(false);
    expect(out("getResCookie('x').value == '' && !getResCookie('x').secure && getResCookie('x').expires == timestamp('0001-01-01T00:00:00Z')", { resHeaders: [] })).toBe(true);
    // A Set-Cookie without `=` or with an invalid value is no cookie.
    expect(out("hasResCookie('x')", { resHeaders: ['Set-Cookie', 'x', 'Set-Cookie', 'x=a;b'.replace(';', '\\')] })).toBe(false);
  });

  it('of several of one name, returns the one with the longest path (the first at a tie)', () => {
    const h = ['Set-Cookie', 'id=root; Path=/', 'Set-Cookie', 'id=deep; Path=/app/admin', 'Set-Cookie', 'id=mid; Path=/app', 'Set-Cookie', 'id=deep2; Path=/app/other'];
    expect(out("getResCookie('id').value", { resHeaders: h })).toBe('deep');
    expect(out("getResCookie('id').value", { resHeaders: ['set-cookie', 'id=1', 'set-cookie', 'id=2'] })).toBe('1');
  });

  it("reads attributes as Go's net/http does", () => {
    const one = (line: string, expr: string) => out(expr, { resHeaders: ['Set-Cookie', line] });
    // Attribute names in any case; SameSite values too; an unknown SameSite is ''.
    expect(one('a=1; PATH=/x; sEcUrE; samesite=STRICT', "getResCookie('a').path == '/x' && getResCookie('a').secure && getResCookie('a').same_site == 'Strict'")).toBe(true);
    expect(one('a=1; SameSite=None', "getResCookie('a').same_site")).toBe('None');
    expect(one('a=1; SameSite=weird', "getResCookie('a').same_site")).toBe('');
    // Max-Age=0 or negative: -1s (delete now, as Go records it); a leading zero is not read.
    expect(one('a=1; Max-Age=0', "getResCookie('a').max_age == duration('-1s')")).toBe(true);
    expect(one('a=1; Max-Age=-5', "getResCookie('a').max_age == duration('-1s')")).toBe(true);
    expect(one('a=1; Max-Age=010', "getResCookie('a').max_age == duration('0s') && getResCookie('a').unparsed_attributes['Max-Age'] == '010'")).toBe(true);
    // Expires: RFC 1123 or with dashes; any other form is unparsed, and the time is zero.
    expect(one('a=1; Expires=Sun, 06-Nov-1994 08:49:37 GMT', "getResCookie('a').expires == timestamp('1994-11-06T08:49:37Z')")).toBe(true);
    expect(one('a=1; Expires=Sunday, 06-Nov-94 08:49:37 GMT', "getResCookie('a').expires == timestamp('0001-01-01T00:00:00Z') && 'Expires' in getResCookie('a').unparsed_attributes")).toBe(true);
    expect(one('a=1; Expires=Mon, 30 Feb 2015 07:28:00 GMT', "getResCookie('a').expires == timestamp('0001-01-01T00:00:00Z')")).toBe(true);
    // A later Path wins; a value Go refuses is unparsed and leaves the field.
    expect(one('a=1; Path=/one; Path=/two', "getResCookie('a').path")).toBe('/two');
    expect(one('a=1; Path=/ok; Domain=bad"quote', "getResCookie('a').path == '/ok' && getResCookie('a').domain == '' && getResCookie('a').unparsed_attributes['Domain'] == 'bad\"quote'")).toBe(true);
    // Empty parts and spaces around them are nothing.
    expect(one('  a="v" ;; ; HttpOnly ;  ', "getResCookie('a').value == 'v' && getResCookie('a').http_only && size(getResCookie('a').unparsed_attributes) == 0")).toBe(true);
  });
});

describe('inCidrRange / inCidrRanges', () => {
  it("ngrok's examples", () => {
    expect(run("inCidrRange('192.168.1.100', '192.168.1.0/24')")).toBe(true);
    expect(run("inCidrRanges('192.168.1.100', ['192.168.1.0/24', '10.0.0.0/8'])")).toBe(true);
    // Host bits set, as in ngrok's `66.249.66.1/24`: the network 66.249.66.0/24.
    expect(run("inCidrRange(conn.client_ip, '66.249.66.1/24')", { ip: '66.249.66.200' })).toBe(true);
    expect(run("inCidrRanges(conn.client_ip, ['66.249.66.1/24', '2001:4860::/32'])", { ip: '2001:4860:4801::8' })).toBe(true);
  });

  it('IPv4: in, out, the edges of a range, /0 and /32', () => {
    expect(run("inCidrRange(conn.client_ip, '203.0.113.0/24')")).toBe(true);
    expect(run("inCidrRange(conn.client_ip, '203.0.112.0/24')")).toBe(false);
    expect(run("inCidrRange('10.255.255.255', '10.0.0.0/8') && !inCidrRange('11.0.0.0', '10.0.0.0/8')")).toBe(true);
    expect(run("inCidrRange('172.31.0.1', '172.16.0.0/12') && !inCidrRange('172.32.0.1', '172.16.0.0/12')")).toBe(true);
    expect(run("inCidrRange(conn.client_ip, '0.0.0.0/0') && inCidrRange(conn.client_ip, '203.0.113.7/32') && !inCidrRange(conn.client_ip, '203.0.113.8/32')")).toBe(true);
  });

  it('IPv6: in, out, /128, and compressed or expanded spellings', () => {
    expect(run("inCidrRange(conn.client_ip, '2001:db8::/32')", { ip: '2001:db8:1::1' })).toBe(true);
    expect(run("inCidrRange(conn.client_ip, '2001:db8::/32')", { ip: '2001:db9::1' })).toBe(false);
    expect(run("inCidrRange(conn.client_ip, '2001:0DB8:0000::0001/128')", { ip: '2001:db8::1' })).toBe(true);
    expect(run("inCidrRange(conn.client_ip, '::/0')", { ip: 'fe80::1' })).toBe(true);
    expect(run("inCidrRange(conn.client_ip, 'fe80::/10')", { ip: 'febf:ffff::1' })).toBe(true);
    expect(run("inCidrRange(conn.client_ip, 'fe80::/10')", { ip: 'fec0::1' })).toBe(false);
  });

  it('an IPv4-mapped IPv6 client matches IPv4 ranges, as ip_restriction and restrict-ips see it; the families stay apart', () => {
    expect(run("inCidrRange(conn.client_ip, '203.0.113.0/24')", { ip: '::ffff:203.0.113.7' })).toBe(true);
    expect(run("inCidrRange(conn.client_ip, '203.0.113.0/24')", { ip: '::FFFF:cb00:7107' })).toBe(true);
    expect(run("inCidrRange(conn.client_ip, '10.0.0.0/8')", { ip: '::ffff:203.0.113.7' })).toBe(false);
    // An IPv4 client is not in an IPv6 range, even ::/0, and an IPv6 one not in 0.0.0.0/0.
    expect(run("inCidrRange(conn.client_ip, '::/0')", { ip: '203.0.113.7' })).toBe(false);
    expect(run("inCidrRange(conn.client_ip, '::/0')", { ip: '::ffff:203.0.113.7' })).toBe(false);
    expect(run("inCidrRange(conn.client_ip, '0.0.0.0/0')", { ip: '2001:db8::1' })).toBe(false);
    // An IPv4-mapped range is the IPv4 range it maps (Go).
    expect(run("inCidrRange(conn.client_ip, '::ffff:203.0.113.0/120')")).toBe(true);
    expect(run("inCidrRange(conn.client_ip, '::ffff:10.0.0.0/104')")).toBe(false);
    // A zone is dropped, as for restrict-ips.
    expect(run("inCidrRange(conn.client_ip, 'fe80::/64')", { ip: 'fe80::1%eth0' })).toBe(true);
  });

  it('an address that is not an IP matches nothing; computed invalid CIDRs are false / skipped (ngrok)', () => {
    expect(run("inCidrRange('not an ip', '0.0.0.0/0') || inCidrRange('', '::/0') || inCidrRange('010.0.0.1', '0.0.0.0/0')")).toBe(false);
    const headers = ['X-Cidr', 'nonsense', 'X-Cidr', '10.0.0.0/33', 'X-Cidr', '203.0.113.0/24', 'X-Bad', '203.0.113.0'];
    expect(run("inCidrRange(conn.client_ip, getReqHeader('x-cidr')[0])", { headers })).toBe(false);
    expect(run("inCidrRange(conn.client_ip, getReqHeader('x-cidr')[1])", { headers })).toBe(false);
    expect(run("inCidrRange(conn.client_ip, getReqHeader('x-cidr')[2])", { headers })).toBe(true);
    expect(run("inCidrRange(conn.client_ip, getReqHeader('x-bad')[0])", { headers })).toBe(false);
    expect(run("inCidrRanges(conn.client_ip, [getReqHeader('x-cidr')[0], getReqHeader('x-cidr')[2]])", { headers })).toBe(true);
    expect(run("inCidrRanges(conn.client_ip, [getReqHeader('x-cidr')[0], getReqHeader('x-cidr')[1]])", { headers })).toBe(false);
    expect(run('inCidrRanges(conn.client_ip, [])')).toBe(false);
  });

  it('a literal invalid CIDR does not compile, naming it (a 400 when the policy is saved)', () => {
    expect(compileError("inCidrRange(conn.client_ip, '10.0.0.0/33')")).toMatch(/inCidrRange\(\): the prefix length of "10\.0\.0\.0\/33" is over 32/);
    expect(compileError("inCidrRange(conn.client_ip, '10.0.0.1')")).toMatch(/inCidrRange\(\): "10\.0\.0\.1" has no prefix length/);
    expect(compileError("inCidrRanges(conn.client_ip, ['10.0.0.0/8', 'office'])")).toMatch(/inCidrRanges\(\): "office" has no prefix length/);
    expect(compileError("inCidrRanges(conn.client_ip, ['10.0.0.0/8', '2001:db8::/129'])")).toMatch(/over 128/);
    expect(compileError("inCidrRange(conn.client_ip, ' 10.0.0.0/8')")).toMatch(/is not a CIDR \(no spaces around it\)/);
    expect(compileError("inCidrRange(conn.client_ip, 'fe80::%eth0/64')")).toMatch(/is not an IPv4 or IPv6 CIDR/);
    const doc = JSON.stringify({ inbound: [{ expressions: ["inCidrRanges(conn.client_ip, ['10.0.0.0/8', '300.0.0.0/8'])"], actions: [{ type: 'deny' }] }] });
    let err: unknown;
    try {
      parseTrafficPolicy(doc);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(TrafficPolicyError);
    expect((err as TrafficPolicyError).path).toBe('inbound[0].expressions[0]');
    expect((err as Error).message).toMatch(/"300\.0\.0\.0\/8" is not an IPv4 or IPv6 CIDR/);
  });

  it('types: an address string, a CIDR string or a list of them', () => {
    expect(compileError("inCidrRange(1, '10.0.0.0/8')")).toMatch(/found no matching overload for 'inCidrRange\(int, string\)'/);
    expect(compileError("inCidrRanges(conn.client_ip, '10.0.0.0/8')")).toMatch(/found no matching overload for 'inCidrRanges\(string, string\)'/);
    expect(compileError('inCidrRanges(conn.client_ip, [1, 2])')).toMatch(/found no matching overload/);
    // A dyn is checked when evaluated.
    expect(() => run('inCidrRange(vars.x, "10.0.0.0/8")')).toThrow();
  });

  it('the parser underneath', () => {
    expect(parseMatchCidr('10.1.2.3/8')).toEqual({ bytes: [10, 0, 0, 0], prefix: 8 });
    expect(parseMatchCidr('::ffff:10.0.0.0/104')).toEqual({ bytes: [10, 0, 0, 0], prefix: 8 });
    expect(parseMatchCidr('10.0.0.0/08')).toBeNull();
    expect(parseMatchCidr('10.0.0.0')).toBeNull();
    expect(matchAddress('::ffff:1.2.3.4')).toEqual([1, 2, 3, 4]);
    expect(matchAddress('1.2.3')).toBeNull();
    expect(inCidr(matchAddress('10.0.0.1')!, parseMatchCidr('10.0.0.0/31')!)).toBe(true);
    expect(inCidr(matchAddress('10.0.0.2')!, parseMatchCidr('10.0.0.0/31')!)).toBe(false);
  });
});
