import { isUtf8 } from 'node:buffer';
import { describe, expect, it } from 'vitest';
import { HEADER_TEXT_RE, headerText, headerWire, hostHeaderProblem, isValidHostValue } from './http-headers.js';

describe('isValidHostValue', () => {
  const valid = [
    'localhost',
    'example.com',
    'example.com.',
    'EXAMPLE.com:8080',
    'a',
    'a_b-c~d',
    "!$&'()*+,;=",
    'a%20b',
    '127.0.0.1',
    '127.0.0.1:0',
    '10.0.0.1:65535',
    '[::1]',
    '[::1]:8080',
    '[2001:db8::1]:443',
    '[::ffff:1.2.3.4]',
    '[v1.fe80::a+en1]',
    '[V7.x:y]:1',
  ];
  const invalid = [
    '',
    '[',
    '[oops',
    '[::1',
    '[oops]',
    '[]',
    '[::1]x',
    '[::1]:',
    '[::1]:x',
    '[fe80::1%eth0]',
    '[fe80::1%25eth0]',
    '[v1.]',
    '[vx.a]',
    ']',
    ':80',
    'host:',
    'host:123456',
    'host:65536',
    'host:-1',
    'host:8080:1',
    '::1',
    'a b',
    'a\tb',
    'user@host',
    'host/path',
    'host?q',
    'host#f',
    'a%2',
    'a%zz',
    'caf\u00e9',
    'a"b',
    'a<b>',
    'a\\b',
    'a[b]',
  ];
  for (const v of valid) it(`accepts ${JSON.stringify(v)}`, () => expect(isValidHostValue(v)).toBe(true));
  for (const v of invalid) it(`refuses ${JSON.stringify(v)}`, () => expect(isValidHostValue(v)).toBe(false));

  it('accepts everything hostHeaderProblem accepts (the APIs check the stricter one)', () => {
    for (const v of ['localhost', 'internal.example:8080', '[::1]:1', '1.2.3.4', 'a_b.example.', 'x:65535']) {
      expect(hostHeaderProblem(v), v).toBeUndefined();
      expect(isValidHostValue(v), v).toBe(true);
    }
  });
});

describe('header values as UTF-8 text', () => {
  const viaBuffer = (wire: string) => Buffer.from(wire, 'latin1').toString('utf8');

  it('headerText reads the bytes as UTF-8 (ASCII as it is), and headerWire gives them back', () => {
    expect(headerText('plain ascii')).toBe('plain ascii');
    for (const text of ['José', '5 €', 'こんにちは', '😀 ok', 'Grüße', '\u0085', 'x'.repeat(100) + '€', '€'.repeat(3000)]) {
      const wire = headerWire(text);
      expect(wire).toBe(Buffer.from(text, 'utf8').toString('latin1'));
      expect(headerText(wire)).toBe(text);
    }
  });

  it('a byte in no UTF-8 sequence reads as U+DC00 + byte, and goes back out as that byte', () => {
    const cases: Array<[string, string]> = [
      ['\xff', '\udcff'],
      ['\xc3', '\udcc3'],
      ['a\xc3(', 'a\udcc3('],
      ['\xe0\x80\x80', '\udce0\udc80\udc80'],
      ['\xed\xa0\x80', '\udced\udca0\udc80'],
      ['\xf0\x9f\x98', '\udcf0\udc9f\udc98'],
      ['ok\xe2\x82\xacok\xff', 'ok€ok\udcff'],
      ['\xc3\xa9' + 'a'.repeat(100) + '\xff', 'é' + 'a'.repeat(100) + '\udcff'],
    ];
    for (const [wire, text] of cases) {
      expect(headerText(wire), JSON.stringify(wire)).toBe(text);
      expect(headerWire(text), JSON.stringify(text)).toBe(wire);
    }
    // Random values: UTF-8 reads as Node reads it; anything round-trips byte for byte.
    let seed = 7;
    const rand = () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff) % 256);
    for (let t = 0; t < 20000; t++) {
      let w = '';
      const n = 1 + (t % 100);
      for (let i = 0; i < n; i++) {
        const b = rand();
        w += String.fromCharCode(t % 2 ? b : 0x80 | (b & 0x7f));
      }
      const text = headerText(w);
      if (isUtf8(Buffer.from(w, 'latin1'))) expect(text).toBe(viaBuffer(w));
      expect(headerWire(text)).toBe(w);
    }
  });

  it('headerWire sends any other lone surrogate as U+FFFD', () => {
    expect(headerWire('a\ud800b')).toBe(Buffer.from('a\ufffdb', 'utf8').toString('latin1'));
    // A pair is a pair, even when its low half is in the escape range.
    expect(headerWire('\ud83d\udc80')).toBe(Buffer.from('\u{1F480}', 'utf8').toString('latin1'));
  });

  it('HEADER_TEXT_RE refuses control characters and lone surrogates only', () => {
    for (const ok of ['', 'a b\tc', '5 €', '\u0080\u009f', '😀', '\uffff']) expect(HEADER_TEXT_RE.test(ok), JSON.stringify(ok)).toBe(true);
    for (const bad of ['\n', '\r', '\u0000', '\u001f', '\u007f', '\ud800', 'a\udc00', '\ud83d\ud83d']) expect(HEADER_TEXT_RE.test(bad), JSON.stringify(bad)).toBe(false);
  });
});
