import { describe, expect, it } from 'vitest';
import KSUID from 'ksuid';
import { encodeKsuid, isId, looksLikeId, newId } from './ids.js';

describe('ids', () => {
  it('are prefixed 27-character KSUIDs', () => {
    const id = newId('ra');
    expect(id).toMatch(/^ra_[0-9A-Za-z]{27}$/);
    expect(isId('ra', id)).toBe(true);
    expect(isId('ca', id)).toBe(false);
    expect(isId('ra', 'ra_short')).toBe(false);
    expect(looksLikeId(id)).toBe(true);
  });

  it('encode exactly like the reference KSUID implementation', () => {
    for (let i = 0; i < 200; i++) {
      const ms = 1_400_000_000_000 + Math.floor(Math.random() * 3_000_000_000_000);
      const payload = Buffer.from(Array.from({ length: 16 }, () => Math.floor(Math.random() * 256)));
      expect(encodeKsuid(ms, payload)).toBe(KSUID.fromParts(ms, payload).string);
    }
    expect(encodeKsuid(1_400_000_000_000, Buffer.alloc(16))).toBe('0'.repeat(27));
    expect(encodeKsuid(1_400_000_000_000 + 0xffffffff * 1000, Buffer.alloc(16, 255))).toBe('aWgEPTl1tmebfsQzFP4bxwgy80V');
  });

  it('sort in creation order, even within one millisecond', () => {
    const ids = Array.from({ length: 5000 }, () => newId('ed'));
    expect([...ids].sort()).toEqual(ids);
    expect(new Set(ids).size).toBe(ids.length);
  });
});
