import { describe, expect, it } from 'vitest';
import { compileExpression } from '@warren/shared';
import { celToHeaderText } from './headers.js';

const value = (expr: string) => compileExpression('inbound', expr, false)({} as never);

describe('celToHeaderText', () => {
  it('writes scalars, lists, timestamps, durations and bytes as text', () => {
    expect(celToHeaderText(value("'a'"))).toBe('a');
    expect(celToHeaderText(value('[1, [2, 3], "x"]'))).toBe('1, 2, 3, x');
    // As Go writes a time (RFC 3339, the fraction without trailing zeros), as json.encode and string() do.
    expect(celToHeaderText(value("timestamp('2024-01-01T00:00:00Z')"))).toBe('2024-01-01T00:00:00Z');
    expect(celToHeaderText(value("timestamp('2024-01-01T00:00:00.120Z')"))).toBe('2024-01-01T00:00:00.12Z');
    expect(celToHeaderText(value("duration('90s')"))).toBe(String(value("duration('90s')")));
    expect(celToHeaderText(value("b'caf\\xc3\\xa9'"))).toBe('café'); // bytes as UTF-8, not "99,97,102,195,169"
    expect(celToHeaderText(null)).toBe('');
  });

  it('refuses a map (it used to come out as [object Object] / [object Map]), alone or in a list', () => {
    for (const v of [value("{'a': 1}"), new Map([['x', ['1']]]), value("[1, {'a': 1}]")]) expect(() => celToHeaderText(v)).toThrow(/a map cannot be written as text/);
  });
});
