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
    expect(path({ type: 'custom-response', config: {} })).toBe('config.status_code');
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
    expect(path({ type: 'add-headers', config: { headers: { 'X-A': 1 } } })).toBe('config.headers.X-A');
    expect(path({ type: 'add-headers', config: { headers: { 'X-A': 'v ${' } } })).toBe('config.headers.X-A');
    expect(path({ type: 'add-headers', config: { headers: Object.fromEntries(Array.from({ length: 33 }, (_, i) => [`X-${i}`, 'v'])) } })).toBe('config.headers');
    expect(path({ type: 'remove-headers', config: { headers: [] } })).toBe('config.headers');
    expect(path({ type: 'remove-headers', config: { headers: 'Cookie' } })).toBe('config.headers');
    expect(path({ type: 'remove-headers', config: { headers: ['ok', 'Transfer-Encoding'] } })).toBe('config.headers[1]');
    expect(path({ type: 'remove-headers', config: { headers: ['X-Warren-Tunnel'] } })).toBe('config.headers[0]');
  });

  it('splits header templates', () => {
    expect(parseTemplate('plain $ text')).toEqual(['plain $ text']);
    expect(parseTemplate('a ${x} b ${ {"k": "}"}["k"] }')).toEqual(['a ', { expr: 'x' }, ' b ', { expr: ' {"k": "}"}["k"] ' }]);
    expect(() => parseTemplate('${x')).toThrow('unterminated');
    expect(() => parseTemplate('${ }')).toThrow('empty');
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
