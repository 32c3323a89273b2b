import { describe, expect, it } from 'vitest';
import { refusal } from './testing.js';
import { parseTemplate, parseTrafficPolicy, validateTrafficPolicy } from './index.js';

const fails = (doc: unknown) => refusal(doc, false);
const one = (action: unknown, expressions?: unknown[], dir = 'inbound') => ({ [dir]: [{ expressions, actions: [action] }] });

describe('traffic policy actions', () => {
  it('parses every action from YAML, both directions', () => {
    const p = parseTrafficPolicy(`
inbound:
  - expressions: ["req.method == 'POST'", "'k' in getReqHeader('X-Key')", "actions.ngrok.rate_limit.limited"]
    actions:
      - type: deny
      - type: deny
        config: {status_code: 451}
      - type: custom-response
        config: {status_code: 200, body: "<b>hi</b>", headers: {Content-Type: text/html}}
      - type: add-headers
        config: {headers: {X-Client: "\${conn.client_ip}", X-Static: plain}}
      - type: remove-headers
        config: {headers: [Cookie]}
outbound:
  - expressions: ["res.status_code >= 500", "size(getResHeader('x-a')) > 0"]
    actions:
      - type: add-headers
        config: {headers: {X-Status: "code \${res.status_code}"}}
      - type: custom-response
        config: {status_code: 503}
`);
    expect(p.inbound[0]!.actions).toEqual([
      { type: 'deny', config: { status_code: 403 } },
      { type: 'deny', config: { status_code: 451 } },
      { type: 'custom-response', config: { status_code: 200, body: '<b>hi</b>', headers: { 'Content-Type': 'text/html' } } },
      { type: 'add-headers', config: { headers: { 'X-Client': '${conn.client_ip}', 'X-Static': 'plain' } } },
      { type: 'remove-headers', config: { headers: ['Cookie'] } },
    ]);
    expect(p.outbound[0]!.actions[1]).toEqual({ type: 'custom-response', config: { status_code: 503, body: '', headers: {} } });
  });

  it('parses the same from JSON', () => {
    const doc = JSON.stringify(one({ type: 'deny', config: { status_code: 400 } }, ['req.path.startsWith("/x")'], 'outbound'));
    expect(parseTrafficPolicy(doc).outbound[0]!.actions[0]).toEqual({ type: 'deny', config: { status_code: 400 } });
  });

  it('compiles every expression, naming the failing one', () => {
    const deny = { type: 'deny' };
    let e = fails(one(deny, ['true', 'req.method ==']));
    expect(e.path).toBe('inbound[0].expressions[1]');
    expect(e.message).toMatch(/^inbound\[0\]\.expressions\[1\]: does not compile: /);
    expect(fails(one(deny, ['req.nope == "x"'])).message).toContain('No such key: nope');
    expect(fails(one(deny, ['undeclared_var'])).path).toBe('inbound[0].expressions[0]');
    expect(fails(one(deny, ['req.method'])).message).toContain('must evaluate to a bool');
    expect(fails(one(deny, ['res.status_code == 200'])).path).toBe('inbound[0].expressions[0]'); // res is outbound only
    expect(fails(one(deny, ["getResHeader('a') == []"])).path).toBe('inbound[0].expressions[0]');
    expect(fails(one(deny, ['getReqHeader(1) == []'])).message).toContain('takes a string');
    expect(() => validateTrafficPolicy(one(deny, ['res.status_code == 200'], 'outbound'))).not.toThrow();
    for (const ok of ["req.url == 'https://a.example/x?y=1'", "req.url.path.startsWith('/a')", "req.url.query_params['a'][0] == '1'", "req.headers['x-a'][0] == 'b'", "conn.server_port == 443", "time.now > timestamp('2020-01-01T00:00:00Z')", "actions.service.rate_limit.error.code == ''", "req.user_agent.contains('bot')", "getQueryParam('q').size() == 1", "req.url.startsWith('https://')"])
      expect(() => validateTrafficPolicy(one(deny, [ok])), ok).not.toThrow();
    e = fails(one({ type: 'add-headers', config: { headers: { 'X-A': 'v ${req.nope}' } } }));
    expect(e.path).toBe('inbound[0].actions[0].config.headers.X-A');
  });

  it('checks action configs', () => {
    const path = (a: unknown) => fails(one(a)).path.replace('inbound[0].actions[0].', '');
    expect(path({ type: 'deny', config: { status_code: 399 } })).toBe('config.status_code');
    expect(path({ type: 'deny', config: { status_code: 600 } })).toBe('config.status_code');
    expect(path({ type: 'deny', config: { status: 403 } })).toBe('config.status');
    expect(path({ type: 'custom-response', config: { status_code: 99 } })).toBe('config.status_code');
    expect(path({ type: 'custom-response', config: { status_code: 200, body: 5 } })).toBe('config.body');
    expect(path({ type: 'custom-response', config: { status_code: 200, body: 'x'.repeat(64 * 1024 + 1) } })).toBe('config.body');
    expect(path({ type: 'custom-response', config: { status_code: 200, headers: { 'X-A': 'a\r\nb' } } })).toBe('config.headers.X-A');
    expect(path({ type: 'custom-response' })).toBe('config');
    expect(path({ type: 'add-headers', config: {} })).toBe('config.headers');
    expect(path({ type: 'add-headers', config: { headers: {} } })).toBe('config.headers');
    expect(path({ type: 'add-headers', config: { headers: { 'bad name': 'x' } } })).toBe('config.headers.bad name');
    expect(path({ type: 'add-headers', config: { headers: { 'X-A': 'a', 'x-a': 'b' } } })).toBe('config.headers.x-a');
    expect(path({ type: 'add-headers', config: { headers: { 'Content-Length': '1' } } })).toBe('config.headers.Content-Length');
    // Expect on requests: the ingress answers 100-continue itself (an added one made every request a 502).
    expect(path({ type: 'add-headers', config: { headers: { Expect: '100-continue' } } })).toBe('config.headers.Expect');
    expect(() => validateTrafficPolicy({ outbound: [{ actions: [{ type: 'add-headers', config: { headers: { Expect: 'x' } } }] }] })).not.toThrow();
    expect(() => validateTrafficPolicy({ inbound: [{ actions: [{ type: 'remove-headers', config: { headers: ['Expect'] } }] }] })).not.toThrow();
    expect(path({ type: 'add-headers', config: { headers: { 'X-A': ['1'] } } })).toBe('config.headers.X-A');
    expect(path({ type: 'add-headers', config: { headers: { 'X-A': 'v ${' } } })).toBe('config.headers.X-A');
    expect(path({ type: 'add-headers', config: { headers: Object.fromEntries(Array.from({ length: 33 }, (_, i) => [`X-${i}`, 'v'])) } })).toBe('config.headers');
    expect(path({ type: 'remove-headers', config: { headers: [] } })).toBe('config.headers');
    expect(path({ type: 'remove-headers', config: { headers: 'Cookie' } })).toBe('config.headers');
    expect(path({ type: 'remove-headers', config: { headers: ['ok', 'Transfer-Encoding'] } })).toBe('config.headers[1]');
    expect(path({ type: 'remove-headers', config: { headers: ['X-Warren-Tunnel'] } })).toBe('config.headers[0]');
  });

  it('custom-response: status 200-599 (default 200), body or content, interpolation checked on save', () => {
    const saving = (config: unknown) => refusal(one({ type: 'custom-response', config }), true);
    const config = (c: unknown) => (validateTrafficPolicy(one({ type: 'custom-response', config: c }), { checkCost: true }).inbound[0]!.actions[0] as { config: unknown }).config;
    // 1xx are interim responses: sent as the answer, the client waits for another
    for (const status_code of [100, 101, 103, 199, 600]) {
      const e = saving({ status_code, body: 'x' });
      expect(e.path).toBe('inbound[0].actions[0].config.status_code');
      expect(e.reason).toBe(`must be from 200 to 599, got ${status_code}`);
    }
    expect(config({ status_code: 200 })).toEqual({ status_code: 200, body: '', headers: {} });
    expect(config({ status_code: 599, body: 'x' })).toEqual({ status_code: 599, body: 'x', headers: {} });
    // ngrok: status_code defaults to 200; content is its older name for body
    expect(config({})).toEqual({ status_code: 200, body: '', headers: {} });
    expect(config({ status_code: null, content: '<b>${req.host}</b>', headers: { 'Content-Type': 'text/html' } })).toEqual({ status_code: 200, body: '<b>${req.host}</b>', headers: { 'Content-Type': 'text/html' } });
    expect(parseTrafficPolicy('inbound:\n  - actions:\n      - type: custom-response\n        config:\n          status_code: 503\n          content: "<html>down</html>"\n').inbound[0]!.actions[0]).toEqual({ type: 'custom-response', config: { status_code: 503, body: '<html>down</html>', headers: {} } });
    let e = saving({ body: 'a', content: 'b' });
    expect(e.path).toBe('inbound[0].actions[0].config.content');
    expect(e.reason).toContain('give only one of them');
    expect(saving({ content: 5 }).path).toBe('inbound[0].actions[0].config.content');
    expect(saving({ content: 'x'.repeat(64 * 1024 + 1) }).path).toBe('inbound[0].actions[0].config.content');
    expect(saving({ status_code: 200, bodyy: 'x' }).path).toBe('inbound[0].actions[0].config.bodyy');
    // ${…} in the body and header values is CEL, compiled and costed when saved
    e = saving({ body: 'hi ${req.nope}' });
    expect(e.path).toBe('inbound[0].actions[0].config.body');
    expect(e.reason).toMatch(/^\$\{…\} does not compile/);
    expect(e.reason).toContain("${'${'}");
    expect(saving({ content: 'a ${' }).path).toBe('inbound[0].actions[0].config.content');
    expect(saving({ headers: { 'X-A': '${res.status_code}' } }).path).toBe('inbound[0].actions[0].config.headers.X-A');
    expect(() => validateTrafficPolicy(one({ type: 'custom-response', config: { headers: { 'X-A': '${res.status_code}' } } }, [], 'outbound'), { checkCost: true })).not.toThrow();
    expect(saving({ body: "${[1,2,3,4,5,6,7,8,9,10].exists(a, [1,2,3,4,5,6,7,8,9,10].exists(b, [1,2,3,4,5,6,7,8,9,10].exists(c, req.headers.exists(k, k.matches('^(a|b)*c$')))))}" }).reason).toContain('too expensive');
    expect(config({ body: "literal ${'${'}x}" })).toEqual({ status_code: 200, body: "literal ${'${'}x}", headers: {} });
    // A stored document (not being saved) whose ${…} does not compile is still accepted: the ingress sends it as written
    expect(() => validateTrafficPolicy(one({ type: 'custom-response', config: { status_code: 200, body: 'const a = `${name}`', headers: { 'X-A': '${' } } }))).not.toThrow();
  });

  it('refuses, on save, a rate-limit name an earlier rate-limit of the direction has', () => {
    const rl = (name: string, capacity: number) => ({ type: 'rate-limit', config: { name, algorithm: 'sliding_window', capacity, rate: '60s', bucket_key: ['req.host'] } });
    const doc = { inbound: [{ actions: [rl('a', 2)] }, { actions: [rl('b', 5), rl('a', 100)] }], outbound: [{ actions: [rl('a', 1)] }] };
    const e = refusal(doc, true);
    expect(e.path).toBe('inbound[1].actions[1].config.name');
    expect(e.reason).toContain('already the name of the rate-limit at inbound[0].actions[0]');
    // a stored document that has them still reaches the ingress (it keys them apart)
    expect(() => validateTrafficPolicy(doc)).not.toThrow();
    // one name per direction: inbound and outbound buckets are apart anyway
    expect(() => validateTrafficPolicy({ inbound: [{ actions: [rl('a', 2)] }], outbound: [{ actions: [rl('a', 1)] }] }, { checkCost: true })).not.toThrow();
  });

  it('splits header templates', () => {
    expect(parseTemplate('plain $ text')).toEqual(['plain $ text']);
    expect(parseTemplate('a ${x} b ${ {"k": "}"}["k"] }')).toEqual(['a ', { expr: 'x' }, ' b ', { expr: ' {"k": "}"}["k"] ' }]);
    expect(() => parseTemplate('${x')).toThrow('unterminated');
    expect(() => parseTemplate('${ }')).toThrow('empty');
    // CEL's triple-quoted and raw string literals (a lone quote, or a backslash in a raw one, does not end them; audit finding).
    expect(parseTemplate("${'''it's'''}!")).toEqual([{ expr: "'''it's'''" }, '!']);
    expect(parseTemplate('${"""say "}" """} x')).toEqual([{ expr: '"""say "}" """' }, ' x']);
    expect(parseTemplate("${r'a\\'} ${'b'}")).toEqual([{ expr: "r'a\\'" }, ' ', { expr: "'b'" }]);
    expect(parseTemplate("${br'}\\'}")).toEqual([{ expr: "br'}\\'" }]);
    expect(parseTemplate("${'a\\'}'}")).toEqual([{ expr: "'a\\'}'" }]);
    expect(parseTemplate("${''}${\"\"}")).toEqual([{ expr: "''" }, { expr: '""' }]);
    expect(() => parseTemplate("${'''x''}")).toThrow('unterminated');
  });
});

describe('CEL regular expressions', () => {
  // matches() runs RE2 (linear time); more in regex.test.ts.
  it('accepts matches() with an RE2 pattern, including one that would backtrack in JavaScript', () => {
    const p = parseTrafficPolicy('inbound:\n  - expressions: ["req.path.matches(\'^/(a+)+$\')", "matches(req.url, \'(?i)/ADMIN\')"]\n    actions: [{type: deny}]\n');
    expect(p.inbound[0]!.expressions).toHaveLength(2);
  });

  it('refuses a pattern RE2 does not accept, naming the expression', () => {
    const err = fails('inbound:\n  - expressions: ["req.path.matches(\'^/(?=admin)\')"]\n    actions: [{type: deny}]\n');
    expect(err.path).toBe('inbound[0].expressions[0]');
    expect(err.reason).toMatch(/^matches\(\): invalid RE2 pattern: invalid or unsupported Perl syntax/);
  });
});
