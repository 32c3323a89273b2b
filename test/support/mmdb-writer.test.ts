import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import maxmind, { Reader, type CityResponse } from 'maxmind';
import { cityRecord, double, encodeValue, float, int32, MmdbWriter, uint128, uint16, uint32, uint64 } from './mmdb-writer.js';

/** The test writer, read back with the `maxmind` package (the reader the ingress uses). */

const dir = mkdtempSync(path.join(tmpdir(), 'warren-mmdb-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const read = (buf: Buffer) => new Reader<any>(buf);

describe('mmdb-writer', () => {
  it('writes a file maxmind.open() reads: metadata, IPv4 at ::/96, IPv6, prefix lengths, misses', async () => {
    const w = new MmdbWriter({ databaseType: 'Warren-Test-City', languages: ['en', 'de'], buildEpoch: 1_700_000_000, description: { en: 'test' } });
    w.insert('127.0.0.0/8', cityRecord({ countryCode: 'XX', country: 'Testland', city: 'Loopback' }));
    w.insert('203.0.113.0/24', cityRecord({ countryCode: 'US', country: 'United States' }));
    w.insert('203.0.113.128/25', cityRecord({ countryCode: 'CA', country: 'Canada' })); // inside the /24: wins there
    w.insert('::1/128', cityRecord({ countryCode: 'XX', country: 'Testland', city: 'Loopback6' }));
    w.insert('2001:db8::/32', cityRecord({ countryCode: 'DE', country: 'Germany' }));
    const file = path.join(dir, 'basic.mmdb');
    writeFileSync(file, w.build());
    const r = await maxmind.open<CityResponse>(file);
    expect(r.metadata).toMatchObject({
      binaryFormatMajorVersion: 2,
      binaryFormatMinorVersion: 0,
      databaseType: 'Warren-Test-City',
      languages: ['en', 'de'],
      description: { en: 'test' },
      ipVersion: 6,
      recordSize: 24,
    });
    expect(r.metadata.buildEpoch.toISOString()).toBe(new Date(1_700_000_000_000).toISOString());
    expect(r.get('127.0.0.1')?.city?.names.en).toBe('Loopback');
    expect(r.get('127.255.255.254')?.country?.iso_code).toBe('XX');
    expect(r.get('::1')?.city?.names.en).toBe('Loopback6');
    expect(r.get('2001:db8:1::5')?.country?.iso_code).toBe('DE');
    expect(r.get('203.0.113.5')?.country?.iso_code).toBe('US');
    expect(r.get('203.0.113.200')?.country?.iso_code).toBe('CA');
    expect(r.get('128.0.0.1')).toBeNull();
    expect(r.get('198.51.100.1')).toBeNull();
    expect(r.get('2001:db9::1')).toBeNull();
    expect(r.get('::2')).toBeNull();
    // Prefix lengths as the reader reports them: IPv4 ones counted from ::/96.
    expect(r.getWithPrefixLength('127.1.2.3')[1]).toBe(8);
    expect(r.getWithPrefixLength('203.0.113.5')[1]).toBe(25);
    expect(r.getWithPrefixLength('203.0.113.200')[1]).toBe(25);
    expect(r.getWithPrefixLength('2001:db8::1')[1]).toBe(32);
    expect(r.getWithPrefixLength('::1')[1]).toBe(128);
  });

  it('stores identical records once', () => {
    const a = new MmdbWriter();
    a.insert('10.0.0.0/8', { a: 'x'.repeat(1000) });
    const one = a.build().length;
    const b = new MmdbWriter();
    b.insert('10.0.0.0/8', { a: 'x'.repeat(1000) }).insert('11.0.0.0/8', { a: 'x'.repeat(1000) });
    expect(b.build().length - one).toBeLessThan(100);
    expect(read(b.build()).get('11.1.1.1')).toEqual({ a: 'x'.repeat(1000) });
  });

  it('encodes every data type the readers decode', () => {
    const value = {
      utf8: 'Zürich – 東京',
      empty: '',
      long: 'y'.repeat(300), // two size bytes
      longer: 'z'.repeat(70_000), // three size bytes
      mid: 'w'.repeat(100), // one size byte
      dbl: double(-97.822),
      dblInt: double(45),
      flt: float(1.5),
      u16: uint16(65535),
      u16zero: uint16(0),
      u32: uint32(4_294_967_295),
      i32: int32(-123456),
      i32pos: int32(42),
      u64: uint64(2n ** 63n + 5n),
      u128: uint128(2n ** 100n + 1n),
      bare: 7,
      bareFraction: 0.25,
      t: true,
      f: false,
      bytes: new Uint8Array([0, 1, 254, 255]),
      list: ['a', uint16(2), [true], { deep: { deeper: 'x' } }],
      emptyList: [],
      emptyMap: {},
    };
    const got = read(new MmdbWriter().insert('1.2.3.0/24', value).build()).get('1.2.3.4');
    expect(got).toMatchObject({ utf8: 'Zürich – 東京', empty: '', long: 'y'.repeat(300), longer: 'z'.repeat(70_000), mid: 'w'.repeat(100) });
    expect(got.dbl).toBe(-97.822);
    expect(got.dblInt).toBe(45);
    expect(got.flt).toBe(1.5);
    expect([got.u16, got.u16zero, got.u32, got.i32, got.i32pos, got.bare, got.bareFraction]).toEqual([65535, 0, 4_294_967_295, -123456, 42, 7, 0.25]);
    // mmdb-lib returns uint64/uint128 as bigint when over 2^53 (or as a decimal string in older versions).
    expect(String(got.u64)).toBe(String(2n ** 63n + 5n));
    expect(String(got.u128)).toBe(String(2n ** 100n + 1n));
    expect([got.t, got.f]).toEqual([true, false]);
    expect(Buffer.from(got.bytes)).toEqual(Buffer.from([0, 1, 254, 255]));
    expect(got.list).toEqual(['a', 2, [true], { deep: { deeper: 'x' } }]);
    expect(got.emptyList).toEqual([]);
    expect(got.emptyMap).toEqual({});
  });

  it('control bytes: extended types put the type byte before the size bytes', () => {
    // A 300-element array: type 0 with size 30, extended type 11-7=4, then 300-285 in two bytes.
    expect([...encodeValue(new Array(300).fill(true)).subarray(0, 4)]).toEqual([0x1e, 0x04, 0x00, 0x0f]);
    // A 29-character string: type 2, size 29, then 0.
    expect([...encodeValue('a'.repeat(29)).subarray(0, 2)]).toEqual([0x5d, 0x00]);
  });

  for (const recordSize of [24, 28, 32] as const) {
    it(`record size ${recordSize}: many networks, IPv4 and IPv6`, () => {
      const w = new MmdbWriter({ recordSize });
      for (let i = 0; i < 300; i++) w.insert(`10.${i >> 8}.${i & 255}.0/24`, { i: uint32(i), pad: 'p'.repeat(i % 40) });
      for (let i = 0; i < 300; i++) w.insert(`2001:db8:${i.toString(16)}::/48`, { v6: uint32(i) });
      const r = read(w.build());
      expect(r.metadata.recordSize).toBe(recordSize);
      for (const i of [0, 1, 77, 255, 256, 299]) {
        expect(r.get(`10.${i >> 8}.${i & 255}.9`)).toEqual({ i, pad: 'p'.repeat(i % 40) });
        expect(r.get(`2001:db8:${i.toString(16)}:1::1`)).toEqual({ v6: i });
      }
      expect(r.get('10.1.44.1')).toBeNull();
    });
  }

  it('28-bit records address beyond 2^24 (the shared nibble)', () => {
    // A data section over 16 MiB puts record values above 2^24: 24-bit records cannot, 28-bit can.
    const half = 'q'.repeat(9 * 1024 * 1024); // a string holds at most 16 MiB + 65821 bytes
    const mk = (recordSize: 24 | 28) => new MmdbWriter({ recordSize, dedupe: false }).insert('1.0.0.0/8', { a: half, b: half }).insert('2.0.0.0/8', { small: 'yes' });
    expect(() => mk(24).build()).toThrow(/cannot address/);
    const r = read(mk(28).build());
    expect(r.get('2.2.2.2')).toEqual({ small: 'yes' });
    expect((r.get('1.1.1.1') as { b: string }).b.length).toBe(half.length);
  });

  it('an IPv4-only database', () => {
    const r = read(new MmdbWriter({ ipVersion: 4 }).insert('192.0.2.0/24', { x: 'y' }).build());
    expect(r.metadata.ipVersion).toBe(4);
    expect(r.get('192.0.2.77')).toEqual({ x: 'y' });
    expect(r.get('192.0.3.1')).toBeNull();
  });
});
