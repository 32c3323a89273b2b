import { describe, expect, it } from 'vitest';
import { publicRequestHeaders } from '../http/proxy.js';
import { hostHeaderProblem } from '@warren/shared';
import { requestHeadersStage } from './request-headers.js';
import { makeState, stageFor } from './testing.js';

describe('request_headers', () => {
  it('is absent when missing, disabled or empty', () => {
    expect(stageFor(requestHeadersStage, {})).toBeNull();
    expect(stageFor(requestHeadersStage, { request_headers: { enabled: false, add: { a: 'b' }, remove: [] } })).toBeNull();
    expect(stageFor(requestHeadersStage, { request_headers: { enabled: true, add: {}, remove: [] } })).toBeNull();
  });

  it('removes case-insensitively, then adds replacing same-named headers', async () => {
    const stage = stageFor(requestHeadersStage, { request_headers: { enabled: true, add: { 'X-Env': 'prod', 'x-new': '1' }, remove: ['X-Secret', 'cookie'] } })!;
    const s = makeState({ headers: ['Host', 'a.test', 'x-secret', 's1', 'X-SECRET', 's2', 'X-ENV', 'dev', 'Accept', '*/*', 'x-env', 'dev2', 'Cookie', 'c=1'] });
    expect(await stage.onRequest!(s)).toBeNull();
    expect(s.headers).toEqual(['Host', 'a.test', 'X-ENV', 'prod', 'Accept', '*/*', 'x-new', '1']);
  });

  it('never touches framing headers, and never removes Host', async () => {
    const stage = stageFor(requestHeadersStage, { request_headers: { enabled: true, add: { 'Content-Length': '0', 'X-A': 'a' }, remove: ['host', 'transfer-encoding'] } })!;
    const s = makeState({ headers: ['Host', 'a.test', 'Transfer-Encoding', 'chunked'] });
    await stage.onRequest!(s);
    expect(s.headers).toEqual(['Host', 'a.test', 'Transfer-Encoding', 'chunked', 'X-A', 'a']);
    // A stored module that only removes Host edits nothing.
    expect(stageFor(requestHeadersStage, { request_headers: { remove: ['Host'] } })).toBeNull();
  });

  it('add Host rewrites the Host sent upstream: one Host, X-Forwarded-Host and the routing host keep the client\'s', async () => {
    for (const name of ['Host', 'host', 'HOST']) {
      const stage = stageFor(requestHeadersStage, { request_headers: { add: { [name]: 'internal.example:8080', 'X-A': 'a' } } })!;
      const s = makeState({ headers: ['host', 'app.example.test', 'Accept', '*/*'] });
      s.headers = publicRequestHeaders(s.req.rawHeaders, '203.0.113.9', 'https', false);
      expect(await stage.onRequest!(s)).toBeNull();
      expect(s.headers).toEqual([
        'host', 'internal.example:8080', 'Accept', '*/*',
        'X-Forwarded-For', '203.0.113.9', 'X-Forwarded-Proto', 'https', 'X-Forwarded-Host', 'app.example.test', 'X-A', 'a',
      ]);
      // Routing, events, rate-limit keys and the policy's req.host read these: the client's.
      expect([s.host, s.req.headers.host, s.req.rawHeaders[1]]).toEqual(['app.example.test', 'app.example.test', 'app.example.test']);
    }
    // Whatever Host values the headers had, one goes upstream.
    const twice = makeState({ headers: ['Host', 'a.test', 'X-B', 'b', 'host', 'b.test'] });
    await stageFor(requestHeadersStage, { request_headers: { add: { Host: 'localhost' } } })!.onRequest!(twice);
    expect(twice.headers).toEqual(['Host', 'localhost', 'X-B', 'b']);
    // On an Upgrade request too (its Connection and Upgrade stay).
    const stage = stageFor(requestHeadersStage, { request_headers: { add: { Host: 'localhost' } } })!;
    const s = makeState({ headers: ['Host', 'app.example.test', 'Connection', 'Upgrade', 'Upgrade', 'websocket'] });
    s.headers = publicRequestHeaders(s.req.rawHeaders, '203.0.113.9', 'http', true);
    await stage.onRequest!(s);
    expect(s.headers).toEqual(['Host', 'localhost', 'X-Forwarded-For', '203.0.113.9', 'X-Forwarded-Proto', 'http', 'X-Forwarded-Host', 'app.example.test', 'Connection', 'Upgrade', 'Upgrade', 'websocket']);
  });

  it('accepts a Host of host[:port]: names, IPv4, bracketed IPv6', () => {
    for (const ok of ['localhost', 'localhost.', 'internal.example:8080', 'a_b-c.example', '127.0.0.1', '10.0.0.1:65535', '[::1]', '[2001:db8::1]:443', 'xn--bcher-kva.example', 'LOCALHOST:1']) {
      expect(hostHeaderProblem(ok), ok).toBeUndefined();
      expect(stageFor(requestHeadersStage, { request_headers: { add: { Host: ok } } }), ok).not.toBeNull();
    }
  });

  it('refuses a stored Host that is not host[:port] (the route answers 503)', () => {
    const bad = ['', ' ', 'a b', 'user@host', 'user:pw@host:80', 'http://host', 'host/path', 'host?q', 'host#f', 'host:', 'host:0', 'host:65536', 'host:80:80', 'host:http',
      '::1', '[::1', '[::1]x', '[fe80::1%eth0]', '[zz::1]', '-a.example', 'a-.example', 'a..b', '.a', '999.1.1.1', '1.2.3', `${'a'.repeat(64)}.example`, 'caf\u00e9.example', '*.example'];
    for (const value of bad) {
      expect(hostHeaderProblem(value), JSON.stringify(value)).toBeDefined();
      expect(() => stageFor(requestHeadersStage, { request_headers: { add: { Host: value } } }), JSON.stringify(value)).toThrow(/^request_headers: add: the Host .* must be host\[:port\]/);
    }
  });

  it('sends values as their UTF-8 bytes (as ngrok does), whatever their characters', async () => {
    const text = 'Zo\u00eb caf\u00e9\t\u00ff 5 \u20ac \u3053\u3093 \u{1F600}';
    const stage = stageFor(requestHeadersStage, { request_headers: { enabled: true, add: { 'X-Name': text }, remove: [] } })!;
    const s = makeState({ headers: ['Host', 'a.test'] });
    await stage.onRequest!(s);
    // Node and undici hold a header value one character per byte.
    expect(s.headers).toEqual(['Host', 'a.test', 'X-Name', Buffer.from(text, 'utf8').toString('latin1')]);
  });

  it('refuses a stored value or name the request could not carry (the route answers 503 instead of every request throwing)', () => {
    for (const value of ['a\r\nX-Evil: 1', 'nul\u0000', 'del\u007f', 'bell\u0007', 'lone \ud800 surrogate', '\udc00']) {
      expect(() => stageFor(requestHeadersStage, { request_headers: { enabled: true, add: { 'X-Price': value }, remove: [] } }), JSON.stringify(value)).toThrow(
        'request_headers: add: the value of "X-Price": header value has a character not allowed in a header (a control character or a lone surrogate)',
      );
    }
    expect(() => stageFor(requestHeadersStage, { request_headers: { add: { 'bad name': 'v' } } })).toThrow(/"bad name" is not a valid header name/);
    // Disabled: nothing is compiled, nothing refused.
    expect(stageFor(requestHeadersStage, { request_headers: { enabled: false, add: { 'X-Price': 'a\nb' } } })).toBeNull();
    // A protected name is skipped whatever its value; a remove name that is not a token matches nothing.
    expect(stageFor(requestHeadersStage, { request_headers: { add: { 'Content-Length': '\u20ac', 'Transfer-Encoding': '\u0000' }, remove: [] } })).toBeNull();
    expect(stageFor(requestHeadersStage, { request_headers: { remove: ['bad name'] } })).not.toBeNull();
  });
});
