import { describe, expect, it } from 'vitest';
import { celCompileError } from './testing.js';
import { parseTrafficPolicy, TrafficPolicyError, validateTrafficPolicy } from './parse.js';
import type { PolicyDirection } from './types.js';

/**
 * An expression copied from ngrok's documentation that names one of ngrok's variables or macros
 * Warren does not have is refused saying so (`ngrok's req.trailers is not supported by Warren`)
 * rather than with the CEL library's "Unknown variable: endpoint" / "No such key: port" /
 * "found no matching overload for 'string.format(…)'". Names from
 * https://ngrok.com/docs/traffic-policy/variables/ and https://ngrok.com/docs/traffic-policy/macros/.
 */

const message = celCompileError;
const unsupported = (name: string) => new RegExp(`^does not compile: ngrok's ${name.replace(/[.()*]/g, '\\$&')} is not supported by Warren \\(at column \\d+\\)$`);

describe("ngrok's variables Warren does not have", () => {
  it('endpoint.*: the fields ngrok documents compile; others are unknown keys', () => {
    for (const e of ["endpoint.addr == 'x'", "endpoint.host == 'x'", "endpoint.id == 'x'", 'endpoint.port == 443', "endpoint.protocol == 'https'"]) expect(() => validateTrafficPolicy({ inbound: [{ expressions: [e], actions: [{ type: 'deny' }] }] }), e).not.toThrow();
    expect(message("req.method == 'GET' && endpoint.region == 'eu'")).toBe('does not compile: No such key: region (at column 33)');
  });

  it('req, res, conn and action variables', () => {
    const cases: [string, string, PolicyDirection?][] = [
      ["'Fizz' in req.trailers['baz']", 'req.trailers'],
      ["req.ts.body_received > timestamp('2023-12-31T00:00:00Z')", 'req.ts.body_received'],
      ["req.url.uri.contains('/api')", 'req.url.uri'],
      ["req.url.user_password == 'a:b'", 'req.url.user_password'],
      ["'fizz' in res.trailers['baz']", 'res.trailers', 'outbound'],
      ["conn.k8s.pod.metadata.namespace != 'payments'", 'conn.k8s.pod.metadata.namespace'],
      ["'proxy.anonymous.tor' in conn.client_ip.categories", 'conn.client_ip.categories'],
      ['conn.client_ip.as.number == 12345', 'conn.client_ip.as.number'],
      ["conn.client_ip.geo.location.country_code != 'US'", 'conn.client_ip.geo.location.country_code'],
      ["'hosting' in conn.server_ip.categories", 'conn.server_ip.categories'],
      ['actions.ngrok.http_request.res.status_code == 200', 'actions.ngrok.http_request'],
      ["actions.service.log.error.code == ''", 'actions.service.log'],
    ];
    for (const [expr, name, direction] of cases) expect(message(expr, direction), expr).toMatch(unsupported(name));
  });

  it("names the first one in the expression; other errors keep the library's message", () => {
    expect(message("req.url.uri == 'x' && endpoint.id == 'x'")).toMatch(unsupported('req.url.uri'));
    // ngrok's `conn.ts` has only `start`.
    expect(message('conn.ts.end < time.now')).toBe('does not compile: No such key: end (at column 9)');
    expect(message("req.nope == 'x'")).toBe('does not compile: No such key: nope (at column 5)');
    expect(message("nope.x == 'x'")).toBe('does not compile: Unknown variable: nope (at column 1)');
    expect(message('foo(1)')).toBe("does not compile: found no matching overload for 'foo(int)' (at column 1)");
    // A variable Warren has, used where it does not exist: the library's message.
    expect(message("res.content_type == 'x'")).toMatch(/Unknown variable: res/);
    // What Warren has is not reported as missing.
    expect(message("req.content_length > 1 && req.cookies['a'][0].value == 1")).not.toMatch(/ngrok's/);
  });
});

describe("ngrok's macros Warren does not have", () => {
  it('namespaced functions', () => {
    const cases: [string, string][] = [["getReqHeader('x-key')[0] == secrets.get('vault', 'key')", 'secrets.get()']];
    for (const [expr, name] of cases) expect(message(expr), expr).toMatch(unsupported(name));
  });

  it('those of ngrok-macros.ts compile (lower, replace, base64, url, hash, …)', () => {
    const compiles = (expr: string) => validateTrafficPolicy({ inbound: [{ expressions: [expr], actions: [{ type: 'deny' }] }] }, { checkCost: true });
    const exprs = [
      "base64.decode('aGVsbG8=') == b'hello'",
      "base64.encode(b'hello') == 'aGVsbG8='",
      ...['crc32', 'md5', 'sha1', 'sha256', 'sha512'].flatMap((h) => [`hash.${h}(req.path) == 'x'`, `hash.${h}(req.path, 'base64') == 'x'`, `req.path.${h}() == 'x'`, `req.path.${h}('hex') == 'x'`]),
      "url.escape(req.path) == '%2Ffoo'",
      "url.unescape('%2Ffoo') == '/foo'",
      ...['charAt(1)', "replace('a', 'b')", "replace('a', 'b', 1)", 'reverse()', 'decodeBase64()', 'encodeBase64()', 'escapeUrl()', 'unescapeUrl()', 'lower()', 'upper()'].map((m) => `req.path.${m} == 'x'`),
      "req.headers.exists(k, k.lower() == 'x-id')",
      "strings.quote(req.path) == ''",
      'req.path.isJson()',
      "json.decode(getReqHeader('x-json')[0])[0] == 'first entry'",
      "req.path.decodeJson()['a'] == 'b'",
      "basic_auth.encode('u', 'p') == getReqHeader('authorization')[0]",
      ...['crc64', 'xxhash64'].flatMap((h) => [`hash.${h}(req.path) == 'x'`, `req.path.${h}('hex') == 'x'`]),
      'json.encode([1]) == "[1]"',
      "['a'].encodeJson() == ''",
      "{'a': 'b'}.encodeJson() == ''",
      'lists.range(5).size() == 5',
      "queryString.decode(req.url.query)['q'] == 'hello'",
      "queryString.encode({'q': 'policy'}) == req.url.query",
      "{'a': 'b'}.encodeQueryString() == 'a=b'",
      "req.path.decodeQueryString()['a'] == 'b'",
      'rand.double() >= 0.5',
      "url.parse(req.url).host == 'ngrok.com'",
      "req.path.parseUrl().host == 'ngrok.com'",
      'req.path.isURL()',
    ];
    for (const e of exprs) expect(() => compiles(e), e).not.toThrow();
  });

  it('string, list and map methods: all of them are in ngrok-macros.ts now', () => {
    const compiles = (expr: string) => validateTrafficPolicy({ inbound: [{ expressions: [expr], actions: [{ type: 'deny' }] }] }, { checkCost: true });
    for (const e of ["req.path.format(['a']) == 'x'", 'req.path.isPrivateIp()', 'req.path.isQueryString()']) expect(() => compiles(e), e).not.toThrow();
    for (const m of ['slice(1, 2)', 'flatten()', 'sort()', 'sortBy(x, x)', 'distinct()']) expect(() => compiles(`[3, 1].${m}.size() > 0`), m).not.toThrow();
    expect(() => compiles('rand.int(0, 10) >= 5')).not.toThrow();
  });

  it('those Warren has, called in a way it does not take, keep the library message', () => {
    expect(message("req.path.split() == ['a']")).toMatch(/found no matching overload for 'string\.split\(\)'/);
    expect(message('req.path.substring() == ""')).toMatch(/found no matching overload/);
    // ngrok's macros Warren has, with arguments they do not take.
    expect(message("req.path.lower('x') == ''")).toMatch(/found no matching overload for 'string\.lower\(string\)'/);
    expect(message("base64.encode('hello') == ''")).toMatch(/found no matching overload/);
    expect(message("req.path.charAt('1') == ''")).toMatch(/found no matching overload/);
  });
});

describe('through a policy: the 400 names the rule', () => {
  it('says which ngrok name is not supported, at the expression or interpolation', () => {
    const fails = (doc: unknown) => {
      try {
        parseTrafficPolicy(JSON.stringify(doc));
      } catch (err) {
        expect(err).toBeInstanceOf(TrafficPolicyError);
        return (err as Error).message;
      }
      throw new Error('expected the policy to be refused');
    };
    expect(fails({ on_http_request: [{ expressions: ['req.url.user_password != ""'], actions: [{ type: 'deny' }] }] })).toMatch(/expressions\[0\]: does not compile: ngrok's req\.url\.user_password is not supported by Warren \(at column 1\)/);
    expect(fails({ on_http_request: [{ actions: [{ type: 'add-headers', config: { headers: { 'x-trailers': '${req.trailers}' } } }] }] })).toMatch(/\$\{…\} does not compile: ngrok's req\.trailers is not supported by Warren/);
  });
});

describe('has() on a field that does not exist', () => {
  const saving = (expr: string) => () => validateTrafficPolicy({ inbound: [{ expressions: [expr], actions: [{ type: 'deny' }] }] }, { checkCost: true });
  it('is refused when a policy is saved (the CEL library would make it false, so a typo would quietly disable a rule), as cel-go refuses it', () => {
    expect(saving('has(conn.geo.contry)')).toThrow('inbound[0].expressions[0]: does not compile: has(conn.geo.contry) names a field contry that does not exist there (at column 1)');
    expect(saving("req.method == 'GET' && !has(actions.ngrok.rate_limit.limitd)")).toThrow('has(actions.ngrok.rate_limit.limitd) names a field limitd that does not exist there (at column 25)');
    expect(saving('has(req.foo)')).toThrow(/has\(req\.foo\) names a field foo/);
    // In an interpolation too.
    expect(() => validateTrafficPolicy({ inbound: [{ actions: [{ type: 'add-headers', config: { headers: { 'x-a': '${has(req.nope)}' } } }] }] }, { checkCost: true })).toThrow('inbound[0].actions[0].config.headers.x-a: ${…} does not compile: has(req.nope)');
  });

  it('a stored policy with one still runs as before (the ingress does not refuse it): the rule just never applies', () => {
    expect(() => validateTrafficPolicy({ inbound: [{ expressions: ['has(conn.geo.contry)'], actions: [{ type: 'deny' }] }] })).not.toThrow();
  });

  it('fields that exist, and keys of maps, are fine', () => {
    for (const e of ['has(conn.geo.country_code)', 'has(req.headers.x)', 'has(vars.x)', 'has(vars.a.b)', 'has(req.url.query_params.a)', '[1].exists(x, has(req.headers.y))', 'has(actions.ngrok.rate_limit.limited)']) expect(saving(e), e).not.toThrow();
    expect(() => validateTrafficPolicy({ outbound: [{ expressions: ['has(res.headers.x)'], actions: [{ type: 'deny' }] }] }, { checkCost: true })).not.toThrow();
  });
});
