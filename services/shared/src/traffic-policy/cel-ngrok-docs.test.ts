import { describe, expect, it } from 'vitest';
import { CEL_TIME, CelActions, CelConn, CelEndpoint, CelRequest, CelResponse } from './cel-vars.js';
import { compileExpression } from './cel.js';
import { parseTrafficPolicy } from './parse.js';

/**
 * Expressions as ngrok's traffic-policy docs write them (an audit compared Warren with the
 * variables and macros pages): each must save and give the documented result.
 */
const bytes = (s: string) => Buffer.from(s, 'utf8').toString('latin1');
function act(o: { headers?: string[]; port?: number; protocol?: string; host?: string } = {}) {
  const headers = (o.headers ?? ['Host', 'app.example.com', 'User-Agent', 'curl/8.1']).map(bytes);
  return {
    req: new CelRequest({ method: 'GET', scheme: 'https', host: 'app.example.com', authority: 'app.example.com', path: '/', rawQuery: '', headers: () => headers }),
    conn: new CelConn('203.0.113.7', 443, null, false, null, null, { startedAt: Date.parse('2024-06-01T00:00:00.120Z'), region: 'us' }),
    res: new CelResponse({ status: () => 200, headers: () => [] }),
    endpoint: new CelEndpoint({ id: 'edghts_1', host: o.host ?? 'app.example.com', port: () => o.port ?? 443, protocol: o.protocol ?? 'https' }),
    actions: new CelActions(),
    time: CEL_TIME,
    vars: new Map<string, unknown>(),
  };
}
const run = (expr: string, o: Parameters<typeof act>[0] = {}) => compileExpression('outbound', expr, false)(act(o));

describe("ngrok's documented expressions", () => {
  it('timestamp(time.now), as ngrok writes it (its time.now is an RFC 3339 string; Warren\'s is the timestamp), and string(timestamp)', () => {
    expect(run("timestamp(time.now) > timestamp('2023-12-31T00:00:00Z')")).toBe(true);
    expect(run('conn.ts.start < timestamp(time.now)')).toBe(true);
    expect(run('string(conn.ts.start)')).toBe('2024-06-01T00:00:00.12Z');
    expect(run("string(time.now).startsWith('20')")).toBe(true);
    // The res.cookies example of ngrok's docs saves.
    expect(() => parseTrafficPolicy(`outbound:\n  - expressions: ["res.cookies['sessionId'][0].expires > timestamp(time.now)"]\n    actions: [{type: deny}]\n`)).not.toThrow();
  });

  it('endpoint.url: the scheme and host, with the port unless it is the default', () => {
    expect(run("endpoint.url == 'https://app.example.com'")).toBe(true);
    expect(run('endpoint.url', { port: 8443 })).toBe('https://app.example.com:8443');
    expect(run('endpoint.url', { protocol: 'http', port: 80 })).toBe('http://app.example.com');
    expect(run('endpoint.url', { host: '2001:db8::1', port: 443 })).toBe('https://[2001:db8::1]');
  });

  it("actions.ngrok.oidc.userinfo_refreshed, ngrok's other spelling of user_info_refreshed", () => {
    expect(run('actions.ngrok.oidc.userinfo_refreshed == actions.ngrok.oidc.user_info_refreshed')).toBe(true);
  });

  it('size() of a string-like value counts code points, as size() of a string does', () => {
    const o = { headers: ['Host', 'app.example.com', 'User-Agent', '😀x'] };
    expect(run('size(req.user_agent)', o)).toBe(2n);
    expect(run('req.user_agent.size()', o)).toBe(2n);
    expect(run("size(getReqHeader('user-agent')[0])", o)).toBe(2n);
  });
});
