import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApi, type Account, type TestApi } from '../../../../../test/support/api.js';

/**
 * request_headers / response_headers: header values are UTF-8 text (as ngrok's): any Unicode text
 * is accepted but control characters and lone surrogates, which are refused with a 400 naming the
 * field, as are names the ingress would silently ignore, on create, PATCH and the module's PUT.
 * Host: request_headers.add rewrites it (host[:port]), request_headers.remove may not name it,
 * response_headers treats it as any header.
 */

let api: TestApi;
let a: Account;
let edge: string;

beforeAll(async () => {
  api = await startTestApi();
  a = await api.account('a');
  edge = (await a.call('POST', '/edges/https', {})).body.id;
});
afterAll(() => api.close());

let n = 0;
const create = (module: string, body: unknown) => a.call('POST', `/edges/https/${edge}/routes`, { match_type: 'path_prefix', match: `/h${++n}`, [module]: body });

async function expectRefused(module: string, body: unknown, field: string, msg: string): Promise<void> {
  const r = await create(module, body);
  expect({ module, body, status: r.status, code: r.body.error_code, field: r.body.details?.field }).toEqual({ module, body, status: 400, code: 'ERR_WARREN_2104', field });
  expect(r.body.msg).toContain(msg);
}

const NOT_ALLOWED = 'header value has a character not allowed in a header (a control character or a lone surrogate)';
/**
 * The API's JSON reader refuses a lone surrogate (or NUL) in any string before the module's own
 * check sees it (Postgres could not store it faithfully), with the same code and field.
 */
const UNSTORABLE = 'strings must not contain NUL characters or unpaired surrogates';

describe('header module values', () => {
  it('refuses control characters (C0 but HTAB, and DEL), naming the field', async () => {
    for (const module of ['request_headers', 'response_headers']) {
      for (const value of ['a\r\nX-Evil: 1', 'bell\u0007', 'del\u007f', 'lf\n', 'cr\r', 'esc\u001b[0m', '5 €\u0001', 'こんにちは\u001f']) {
        await expectRefused(module, { add: { 'X-Price': value } }, `${module}.add.X-Price`, NOT_ALLOWED);
      }
    }
  });

  it('refuses lone surrogates and NUL, naming the field', async () => {
    for (const module of ['request_headers', 'response_headers']) {
      for (const value of ['a\ud800b', '\udc00', 'end\ud83d', 'nul\u0000']) {
        const r = await create(module, { add: { 'X-Price': value } });
        expect({ module, value, status: r.status, code: r.body.error_code, field: r.body.details?.field }).toEqual({ module, value, status: 400, code: 'ERR_WARREN_2104', field: `${module}.add.X-Price` });
        expect([NOT_ALLOWED, UNSTORABLE].some((m) => String(r.body.msg).includes(m)), r.body.msg).toBe(true);
      }
    }
  });

  it('accepts HTAB, SP, visible ASCII and any other Unicode text (beyond U+00FF, beyond the BMP), sent as UTF-8', async () => {
    const add = {
      'X-Ascii': ' !~\tend',
      'X-Latin1': 'café Zoë ÿ\u0080',
      'X-Empty': '',
      'X-Price': '5 €',
      'X-Emoji': '\u{1F600}',
      'X-A-Macron': 'Ā',
      'X-Greet': 'こんにちは',
      'X-Pair': '\ud83d\ude00 🇫🇷',
      'X-Spaces': '\u00a0\u2028\u2029\ufeff',
    };
    for (const module of ['request_headers', 'response_headers']) {
      const r = await create(module, { add });
      expect([r.status, r.body.msg]).toEqual([201, undefined]);
      expect(r.body[module].add).toEqual(add);
      expect((await a.call('GET', `/edges/https/${edge}/routes/${r.body.id}`)).body[module].add).toEqual(add);
    }
  });

  it('counts the 1024-byte value limit in UTF-8 bytes', async () => {
    for (const module of ['request_headers', 'response_headers']) {
      // 341 × "€" (3 bytes each) + "a": 1024 bytes; one more "a": 1025.
      const fits = '€'.repeat(341) + 'a';
      const ok = await create(module, { add: { 'X-Long': fits } });
      expect([ok.status, ok.body.msg, ok.body[module]?.add]).toEqual([201, undefined, { 'X-Long': fits }]);
      const over = await create(module, { add: { 'X-Long': fits + 'a' } });
      expect([over.status, over.body.error_code, over.body.details?.field]).toEqual([400, 'ERR_WARREN_5003', `${module}.add.X-Long`]);
      expect(over.body.msg).toContain('header value is over 1024 bytes');
      // 256 × "😀" (4 bytes, 2 UTF-16 units each): 1024 bytes.
      expect((await create(module, { add: { 'X-Long': '😀'.repeat(256) } })).status).toBe(201);
      expect((await create(module, { add: { 'X-Long': '😀'.repeat(256) + 'a' } })).status).toBe(400);
    }
  });

  it('refuses on the module PUT and the route PATCH too, and accepts text beyond U+00FF there', async () => {
    const route = (await create('request_headers', { add: { 'X-A': 'ok' } })).body;
    const put = await a.call('PUT', `/edges/https/${edge}/routes/${route.id}/response_headers`, { add: { 'X-Price': '5 €\u0007' } });
    expect([put.status, put.body.error_code, put.body.details?.field]).toEqual([400, 'ERR_WARREN_2104', 'add.X-Price']);
    expect(put.body.msg).toContain(NOT_ALLOWED);
    const patch = await a.call('PATCH', `/edges/https/${edge}/routes/${route.id}`, { request_headers: { add: { 'X-Price': '5 €\n' } } });
    expect([patch.status, patch.body.error_code, patch.body.details?.field]).toEqual([400, 'ERR_WARREN_2104', 'request_headers.add.X-Price']);
    expect(patch.body.msg).toContain(NOT_ALLOWED);
    expect((await a.call('GET', `/edges/https/${edge}/routes/${route.id}`)).body.request_headers.add).toEqual({ 'X-A': 'ok' });

    const putOk = await a.call('PUT', `/edges/https/${edge}/routes/${route.id}/response_headers`, { add: { 'X-Price': '5 €' } });
    expect([putOk.status, putOk.body.add]).toEqual([200, { 'X-Price': '5 €' }]);
    const patchOk = await a.call('PATCH', `/edges/https/${edge}/routes/${route.id}`, { request_headers: { add: { 'X-Price': '5 €', 'X-Greet': 'こんにちは 😀' } } });
    expect([patchOk.status, patchOk.body.request_headers?.add]).toEqual([200, { 'X-Price': '5 €', 'X-Greet': 'こんにちは 😀' }]);
    const got = (await a.call('GET', `/edges/https/${edge}/routes/${route.id}`)).body;
    expect([got.request_headers.add, got.response_headers.add]).toEqual([{ 'X-Price': '5 €', 'X-Greet': 'こんにちは 😀' }, { 'X-Price': '5 €' }]);
  });
});

describe('header module names', () => {
  // The ingress never edits these (framing, hop-by-hop), and X-Warren-* are the nodes' own: the
  // same list as the traffic policy's header actions.
  const reserved = ['Connection', 'Content-Length', 'Transfer-Encoding', 'TE', 'Upgrade', 'Trailer', 'Keep-Alive', 'Proxy-Connection', 'X-Warren-Tunnel'];

  it('refuses framing, hop-by-hop and X-Warren-* names in add and remove of both modules, naming the header', async () => {
    for (const module of ['request_headers', 'response_headers']) {
      for (const name of reserved) {
        await expectRefused(module, { add: { [name]: 'v' } }, `${module}.add.${name}`, `header "${name}" cannot be changed by a route module`);
        const lower = name.toLowerCase();
        await expectRefused(module, { remove: ['X-Ok', lower] }, `${module}.remove[1]`, `header "${lower}" cannot be changed by a route module`);
      }
    }
  });

  it('refuses a header named __proto__ (the JSON reader dropped it: asked for, accepted and never sent)', async () => {
    for (const module of ['request_headers', 'response_headers']) {
      await expectRefused(module, { add: { ['__proto__']: 'v', 'X-Ok': '1' } }, `${module}.add.__proto__`, 'a header named "__proto__" is not supported');
      await expectRefused(module, { remove: ['X-Ok', '__proto__'] }, `${module}.remove[1]`, 'a header named "__proto__" is not supported');
    }
  });

  it('refuses adding Expect to requests (the ingress handles 100-continue itself; an added one failed every request with 502); removing it, or adding it to responses, is allowed', async () => {
    await expectRefused('request_headers', { add: { Expect: '100-continue' } }, 'request_headers.add.Expect', 'header "Expect" cannot be added to requests (the ingress handles 100-continue itself)');
    expect((await create('response_headers', { add: { Expect: 'x' } })).status).toBe(201);
  });

  it('still accepts other names, end-to-end headers among them', async () => {
    const r = await create('request_headers', { add: { Authorization: 'Bearer x', 'X-Forwarded-Host': 'a', 'Hostname': 'h', 'X-Warren': 'ok' }, remove: ['Cookie', 'Expect', 'Te-Foo', 'Warren-Error-Code'] });
    expect([r.status, r.body.msg]).toEqual([201, undefined]);
  });
});

describe('Host', () => {
  const HOST_MSG = 'the Host header must be host[:port]';

  it('request_headers.add rewrites Host (as ngrok\'s "Rewrite Host header"), in any case, with a host[:port] value', async () => {
    for (const [name, value] of [['Host', 'localhost'], ['host', 'internal.example:8080'], ['HOST', '10.0.0.7:3000'], ['Host', '[::1]:8443'], ['Host', 'LocalHost.']] as const) {
      const r = await create('request_headers', { add: { [name]: value, 'X-A': 'a' } });
      expect([name, value, r.status, r.body.msg]).toEqual([name, value, 201, undefined]);
      expect(r.body.request_headers.add).toEqual({ [name]: value, 'X-A': 'a' });
    }
  });

  it('request_headers.add refuses a Host that is not host[:port], naming request_headers.add.Host', async () => {
    for (const value of ['', 'user@internal.example', 'u:p@internal.example:80', 'http://internal.example', 'internal.example/path', 'internal example', 'internal.example:', 'internal.example:0', 'internal.example:65536', '::1', '[::1', '[', '[oops', '[oops]', '[]', '[::1]x', '[fe80::1%25eth0]', '999.0.0.1', '-bad.example', '*.example']) {
      await expectRefused('request_headers', { add: { Host: value } }, 'request_headers.add.Host', HOST_MSG);
    }
    await expectRefused('request_headers', { add: { host: 'a/b' } }, 'request_headers.add.host', HOST_MSG);
    // A value a header cannot carry at all gets that message rather than the Host one.
    await expectRefused('request_headers', { add: { Host: 'local\r\nhost' } }, 'request_headers.add.Host', NOT_ALLOWED);
  });

  it('request_headers.remove refuses Host: HTTP/1.1 requires it, and add rewrites it', async () => {
    for (const name of ['Host', 'host']) {
      const r = await create('request_headers', { remove: ['X-Ok', name] });
      expect([r.status, r.body.error_code, r.body.details?.field]).toEqual([400, 'ERR_WARREN_2104', 'request_headers.remove[1]']);
      expect(r.body.msg).toBe(`request_headers.remove[1]: header "${name}" cannot be removed: HTTP/1.1 requires a Host header; to rewrite it, set it in add (e.g. "Host": "localhost")`);
    }
  });

  it('response_headers adds and removes Host like any other header, whatever its value', async () => {
    const r = await create('response_headers', { add: { Host: 'not even a host name' }, remove: ['X-Powered-By'] });
    expect([r.status, r.body.msg]).toEqual([201, undefined]);
    expect(r.body.response_headers).toMatchObject({ add: { Host: 'not even a host name' }, remove: ['X-Powered-By'] });
    const rm = await create('response_headers', { remove: ['host'] });
    expect([rm.status, rm.body.msg, rm.body.response_headers?.remove]).toEqual([201, undefined, ['host']]);
  });

  it('the module PUT and the route PATCH apply the same rules', async () => {
    const route = (await create('request_headers', { add: { Host: 'localhost' } })).body;
    const base = `/edges/https/${edge}/routes/${route.id}`;
    const put = await a.call('PUT', `${base}/request_headers`, { add: { Host: 'http://x' } });
    expect([put.status, put.body.error_code, put.body.details?.field]).toEqual([400, 'ERR_WARREN_2104', 'add.Host']);
    const putRemove = await a.call('PUT', `${base}/request_headers`, { remove: ['Host'] });
    expect([putRemove.status, putRemove.body.error_code, putRemove.body.details?.field]).toEqual([400, 'ERR_WARREN_2104', 'remove[0]']);
    const ok = await a.call('PUT', `${base}/request_headers`, { add: { Host: 'internal.example:8080' } });
    expect([ok.status, ok.body.add]).toEqual([200, { Host: 'internal.example:8080' }]);
    const resp = await a.call('PUT', `${base}/response_headers`, { remove: ['Host'] });
    expect([resp.status, resp.body.remove]).toEqual([200, ['Host']]);
    const patch = await a.call('PATCH', base, { request_headers: { add: { Host: 'user@x' } } });
    expect([patch.status, patch.body.error_code, patch.body.details?.field]).toEqual([400, 'ERR_WARREN_2104', 'request_headers.add.Host']);
    expect((await a.call('GET', base)).body.request_headers.add).toEqual({ Host: 'internal.example:8080' });
  });
});
