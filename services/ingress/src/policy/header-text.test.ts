import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { validateTrafficPolicy } from '@warren/shared';
import type { RouteStage } from '../pipeline/types.js';
import { trafficPolicyStage } from './index.js';
import { CONFIG, deps, EDGE, request, route } from './testing.js';

/**
 * Header values are UTF-8 text in a policy, as in ngrok: CEL reads the bytes a client sent as
 * UTF-8, and what a policy sets goes out as its UTF-8 bytes. Node holds header values one
 * character per byte, hence `wire` below.
 */
const wire = (text: string) => Buffer.from(text, 'utf8').toString('latin1');
const header = (pairs: string[], name: string) => pairs.filter((_, i) => i % 2 === 1 && pairs[i - 1]!.toLowerCase() === name.toLowerCase());

function stage(policy: unknown): RouteStage {
  const s = trafficPolicyStage(route(policy), EDGE, CONFIG, deps());
  if (!s) throw new Error('no stage');
  return s;
}

describe('header values as UTF-8 text', () => {
  const name = 'José 北京 😀';

  it('CEL reads a header sent as UTF-8 bytes as that text: comparisons, size, macros, getReqHeader', async () => {
    const sha = createHash('sha256').update(name, 'utf8').digest('hex');
    const s = stage({
      inbound: [
        {
          expressions: [
            `req.headers['x-name'][0] == '${name}'`,
            `getReqHeader('X-Name')[0] == '${name}'`,
            'size(req.headers["x-name"][0]) == 9',
            `req.headers['x-name'][0].upper() == 'JOSÉ 北京 😀'`,
            `req.headers['x-name'][0].sha256() == '${sha}'`,
          ],
          actions: [{ type: 'custom-response', config: { status_code: 200, body: 'matched' } }],
        },
      ],
    });
    expect(await s.onRequest!(request({ headers: ['Host', 'app.example.com', 'X-Name', wire(name)] }))).toMatchObject({ status: 200, body: 'matched' });
    // The same characters sent one byte each (Latin-1) are other text.
    expect(await s.onRequest!(request({ headers: ['Host', 'app.example.com', 'X-Name', 'Jos\u00e9'] }))).toBeNull();
  });

  it('bytes that are no UTF-8 equal no text, count one character each, and are copied on byte for byte', async () => {
    const s = stage({
      inbound: [
        { expressions: ["req.headers['x-b'][0] == 'a\\uFFFDb\\uFFFD' || req.headers['x-b'][0] == 'a\u00ffb\u00c3'"], actions: [{ type: 'deny', config: { status_code: 403 } }] },
        { expressions: ["size(req.headers['x-b'][0]) == 4", "req.headers['x-b'][0].startsWith('a')"], actions: [{ type: 'add-headers', config: { headers: { 'X-Copy': '<${req.headers["x-b"][0]}>' } } }] },
      ],
    });
    const r = request({ headers: ['Host', 'app.example.com', 'X-B', 'a\u00ffb\u00c3'] });
    expect(await s.onRequest!(r)).toBeNull();
    expect(header(r.headers, 'x-copy')).toEqual(['<a\u00ffb\u00c3>']);
  });

  it('the hash, base64 and URL macros work on the bytes the client sent, whatever they are; upper() writes a stray byte as U+FFFD (as Go)', async () => {
    const sent = 'a\u00ffb\u00c3'; // bytes 61 ff 62 c3
    const raw = Buffer.from(sent, 'latin1');
    const sha = createHash('sha256').update(raw).digest('hex');
    const s = stage({
      inbound: [
        {
          actions: [
            {
              type: 'add-headers',
              config: { headers: { 'X-Sha': "${req.headers['x-b'][0].sha256()}", 'X-B64': "${req.headers['x-b'][0].encodeBase64()}", 'X-Url': "${url.escape(req.headers['x-b'][0])}", 'X-Up': "${req.headers['x-b'][0].upper()}", 'X-Round': "${req.headers['x-b'][0].encodeBase64().decodeBase64()}" } },
            },
          ],
        },
      ],
    });
    const r = request({ headers: ['Host', 'app.example.com', 'X-B', sent] });
    expect(await s.onRequest!(r)).toBeNull();
    expect(header(r.headers, 'x-sha')).toEqual([sha]);
    expect(header(r.headers, 'x-b64')).toEqual([raw.toString('base64')]);
    expect(header(r.headers, 'x-url')).toEqual(['a%FFb%C3']);
    expect(header(r.headers, 'x-up')).toEqual([wire('A\ufffdB\ufffd')]);
    expect(header(r.headers, 'x-round')).toEqual([sent]);
  });

  it('matches() reads a byte in no UTF-8 sequence as U+FFFD, as Go\'s regexp does', async () => {
    const s = stage({ inbound: [{ expressions: ["req.headers['x-b'][0].matches('^a\\\\x{FFFD}b$')"], actions: [{ type: 'deny', config: { status_code: 403 } }] }] });
    expect(await s.onRequest!(request({ headers: ['Host', 'app.example.com', 'X-B', 'a\u00ffb'] }))).toMatchObject({ status: 403 });
    expect(await s.onRequest!(request({ headers: ['Host', 'app.example.com', 'X-B', 'a\u00c3\u00a9b'] }))).toBeNull();
  });

  it('add-headers sends literal and interpolated values as UTF-8 bytes; a copied header arrives byte for byte', async () => {
    const s = stage({
      inbound: [{ actions: [{ type: 'add-headers', config: { headers: { 'X-Price': '5 €', 'X-Hello': 'こんにちは', 'X-Copy': '${req.headers["x-name"][0]}', 'X-Mixed': 'née ${req.headers["x-name"][0].lower()}' } } }] }],
      outbound: [{ expressions: ["res.headers['x-up'][0] == 'Grüße'"], actions: [{ type: 'add-headers', config: { headers: { 'X-Seen': '✓ ${res.headers["x-up"][0]}' } } }] }],
    });
    const r = request({ headers: ['Host', 'app.example.com', 'X-Name', wire(name)] });
    expect(await s.onRequest!(r)).toBeNull();
    expect(header(r.headers, 'x-price')).toEqual([wire('5 €')]);
    expect(header(r.headers, 'x-hello')).toEqual([wire('こんにちは')]);
    expect(header(r.headers, 'x-copy')).toEqual([wire(name)]);
    expect(header(r.headers, 'x-mixed')).toEqual([wire(`née ${name.toLowerCase()}`)]);
    const res = { status: 200, headers: ['X-Up', wire('Grüße')] };
    expect(await s.onResponse!(request(), res)).toBeNull();
    expect(header(res.headers, 'x-seen')).toEqual([wire('✓ Grüße')]);
  });

  it('custom-response and redirect header values go out as UTF-8 bytes; the body stays text (written as UTF-8)', async () => {
    const s = stage({
      inbound: [
        { expressions: ["req.url.path == '/r'"], actions: [{ type: 'redirect', config: { to: '/elsewhere', headers: { 'X-Why': 'déménagé ${req.headers["x-name"][0]}' } } }] },
        { actions: [{ type: 'custom-response', config: { status_code: 200, body: 'héllo ${req.headers["x-name"][0]}', headers: { 'X-Static': '€', 'X-Dyn': '${req.headers["x-name"][0]}' } } }] },
      ],
    });
    const h = ['Host', 'app.example.com', 'X-Name', wire(name)];
    expect(await s.onRequest!(request({ headers: h }))).toMatchObject({ status: 200, body: `héllo ${name}`, headers: { 'X-Static': wire('€'), 'X-Dyn': wire(name) } });
    expect(await s.onRequest!(request({ url: '/r', headers: h }))).toMatchObject({ status: 302, headers: { 'X-Why': wire(`déménagé ${name}`) } });
  });

  it('an interpolated value with a control character is left out, as any failed interpolation', async () => {
    const s = stage({ inbound: [{ actions: [{ type: 'add-headers', config: { headers: { 'X-Ctl': 'a${"\\u0007"}', 'X-Ok': 'ok' } } }] }] });
    const r = request();
    expect(await s.onRequest!(r)).toBeNull();
    expect(header(r.headers, 'x-ctl')).toEqual([]);
    expect(header(r.headers, 'x-ok')).toEqual(['ok']);
  });

  it('the validator takes any text but control characters and lone surrogates, naming the field', () => {
    const policy = (v: string) => ({ inbound: [{ actions: [{ type: 'add-headers', config: { headers: { 'X-V': v } } }] }] });
    for (const ok of ['5 €', 'こんにちは', '😀', 'tab\there', 'C1 \u0085']) expect(() => validateTrafficPolicy(policy(ok)), JSON.stringify(ok)).not.toThrow();
    for (const bad of ['a\nb', 'bell\u0007', 'del\u007f', 'nul\u0000', 'lone \ud800', '\udfff']) {
      expect(() => validateTrafficPolicy(policy(bad)), JSON.stringify(bad)).toThrow(
        'inbound[0].actions[0].config.headers.X-V: header value has a character not allowed in a header (a control character or a lone surrogate)',
      );
    }
  });
});
