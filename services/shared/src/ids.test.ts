import { describe, expect, it } from 'vitest';
import { isId, looksLikeId, newId } from './ids.js';

describe('ids', () => {
  it('are prefixed 27-character KSUIDs', () => {
    const id = newId('ra');
    expect(id).toMatch(/^ra_[0-9A-Za-z]{27}$/);
    expect(isId('ra', id)).toBe(true);
    expect(isId('ca', id)).toBe(false);
    expect(isId('ra', 'ra_short')).toBe(false);
    expect(looksLikeId(id)).toBe(true);
  });

  it('sort in creation order, even within one millisecond', () => {
    const ids = Array.from({ length: 5000 }, () => newId('ed'));
    expect([...ids].sort()).toEqual(ids);
    expect(new Set(ids).size).toBe(ids.length);
  });
});
