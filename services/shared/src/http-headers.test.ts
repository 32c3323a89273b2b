import { describe, expect, it } from 'vitest';
import { hostHeaderProblem, isValidHostValue } from './http-headers.js';

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
