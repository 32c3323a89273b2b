import { describe, expect, it } from 'vitest';
import { atv, buildCertificate, derOf, ED25519_PEM, extension, LEAF_PEM, name, oid, PSS_PEM, seq, tlv, utf8 } from './testing.js';
import { CertificateParseError, formatIp, parseCertificate } from './x509.js';

/** mulberry32: a small seeded PRNG, so every run mutates the same way. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A certificate of another shape: every string type, both time types, every SAN kind, an unknown attribute, a critical extension. */
const STRINGS_DER = buildCertificate({
  serial: tlv(0x02, Buffer.from([0x80, 0x01])),
  issuer: name([atv('2.5.4.3', tlv(0x1e, Buffer.from([0, 0x41, 0x20, 0xac, 0, 0])))], [atv('2.5.4.10', tlv(0x1c, Buffer.from([0, 1, 0xf6, 0, 0, 0, 0, 0x42])))]),
  subject: name(
    [atv('2.5.4.6', tlv(0x13, Buffer.from('US'))), atv('2.5.4.7', tlv(0x14, Buffer.from([0x4d, 0xe9])))],
    [atv('2.5.4.3', utf8('h\u00e9llo, <w>')), atv('1.2.840.113549.1.9.1', tlv(0x16, Buffer.from('a@b.c')))],
  ),
  notBefore: tlv(0x18, Buffer.from('20240229120000Z')),
  notAfter: tlv(0x17, Buffer.from('4912312359Z')),
  extensions: [
    extension(
      '2.5.29.17',
      seq(
        tlv(0x82, Buffer.from('a.example')),
        tlv(0x87, Buffer.from([0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1])),
        tlv(0x87, Buffer.from([127, 0, 0, 1])),
        tlv(0x81, Buffer.from('x@y.z')),
        tlv(0x86, Buffer.from('https://u.example/')),
      ),
    ),
    extension('2.5.29.19', seq(tlv(0x01, Buffer.from([0xff]))), true),
  ],
});

const SEEDS: Array<[string, Buffer]> = [
  ['leaf (EC CA, full subject, SANs)', derOf(LEAF_PEM)],
  ['Ed25519 self-signed', derOf(ED25519_PEM)],
  ['RSA-PSS', derOf(PSS_PEM)],
  ['every string and time type', STRINGS_DER],
];

/** One to three random edits: flip a bit, set a byte, truncate, insert, delete, or rewrite a length byte. */
function mutate(seed: Buffer, rnd: () => number): Buffer {
  let b: number[] = [...seed];
  const at = () => Math.floor(rnd() * Math.max(1, b.length));
  const byte = () => Math.floor(rnd() * 256);
  const lengthBytes = [0x00, 0x01, 0x7f, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x88, 0xff];
  for (let n = 1 + Math.floor(rnd() * 3); n > 0; n--) {
    const op = Math.floor(rnd() * 6);
    if (op === 0) {
      const i = at();
      b[i] = (b[i] ?? 0) ^ (1 << Math.floor(rnd() * 8));
    } else if (op === 1) b[at()] = byte();
    else if (op === 2) b = b.slice(0, at());
    else if (op === 3) b.splice(at(), 0, ...Array.from({ length: 1 + Math.floor(rnd() * 4) }, byte));
    else if (op === 4) b.splice(at(), 1 + Math.floor(rnd() * 4));
    else {
      // A length byte: the byte after a tag-like byte (or any byte), set to a short or long form.
      let i = at();
      for (let k = 0; k < 16 && i + 1 < b.length && ![0x30, 0x31, 0x02, 0x04, 0x06, 0x0c, 0x13, 0x17, 0xa0, 0xa3].includes(b[i]!); k++) i = at();
      if (i + 1 < b.length) b[i + 1] = lengthBytes[Math.floor(rnd() * lengthBytes.length)]!;
    }
  }
  return Buffer.from(b);
}

describe('parseCertificate on malformed input', () => {
  it('returns or throws CertificateParseError for 20,000 mutated certificates, each quickly', () => {
    for (const [, der] of SEEDS) expect(() => parseCertificate(der)).not.toThrow();
    const rnd = prng(0x5eed_0509);
    let parsed = 0;
    let refused = 0;
    // The slowest single parse: a pathological input shows here, while a total over the whole
    // loop would measure how busy the machine is (it failed at 5.6 s with two test runs at once).
    let slowest = 0;
    for (let i = 0; i < 20_000; i++) {
      const [label, seed] = SEEDS[i % SEEDS.length]!;
      const input = mutate(seed, rnd);
      const started = performance.now();
      try {
        const c = parseCertificate(input);
        expect(Number.isNaN(c.notBefore.getTime()) || Number.isNaN(c.notAfter.getTime())).toBe(false);
        parsed++;
      } catch (err) {
        if (!(err instanceof CertificateParseError)) throw new Error(`iteration ${i} (${label}): ${String(err)} on ${input.toString('hex')}`);
        refused++;
      }
      slowest = Math.max(slowest, performance.now() - started);
    }
    expect(parsed).toBeGreaterThan(0);
    expect(refused).toBeGreaterThan(0);
    expect(slowest).toBeLessThan(250);
  });

  it('refuses the crashes the fuzzer found', () => {
    const refuses = (der: Buffer, msg: string) => expect(() => parseCertificate(der)).toThrow(new CertificateParseError(msg));
    // An empty Extension SEQUENCE (was a TypeError).
    refuses(buildCertificate({ extensions: [seq()] }), 'expected an object identifier');
    // A UniversalString code point above U+10FFFF (was a RangeError), and one cut short.
    refuses(buildCertificate({ subject: name([atv('2.5.4.3', tlv(0x1c, Buffer.from([0, 0x11, 0, 0])))]) }), 'bad UniversalString');
    refuses(buildCertificate({ subject: name([atv('2.5.4.3', tlv(0x1c, Buffer.from([0, 0, 0])))]) }), 'bad UniversalString');
    // An empty `critical` BOOLEAN (was read from the byte after it).
    refuses(buildCertificate({ extensions: [seq(oid('2.5.29.19'), tlv(0x01, Buffer.alloc(0)), tlv(0x04, seq()))] }), 'bad extension criticality');
    // An odd-length BMPString (Go: invalid BMPString).
    refuses(buildCertificate({ subject: name([atv('2.5.4.3', tlv(0x1e, Buffer.from([0, 0x41, 0])))]) }), 'bad BMPString');
  });

  it('bounds a huge object identifier', () => {
    const started = performance.now();
    const huge = Buffer.concat([Buffer.alloc(7_000, 0x81), Buffer.from([0x01])]);
    const c = parseCertificate(buildCertificate({ subject: name([seq(tlv(0x06, huge), utf8('x'))]) }));
    expect(c.subject.text).toMatch(/^2\.\d{5000,}=#130178$/);
    expect(performance.now() - started).toBeLessThan(1_000);
  });
});

describe('Go formatting', () => {
  const ip = (hex: string) => formatIp(Buffer.from(hex.replace(/[:.]/g, ''), 'hex'));

  it('prints IP addresses as net.IP.String()', () => {
    expect(ip('c0a80101')).toBe('192.168.1.1');
    expect(ip('00000000000000000000ffffc0000201')).toBe('192.0.2.1'); // IPv4-mapped: as IPv4
    expect(ip('00000000000000000000ffff00000000')).toBe('0.0.0.0');
    expect(ip('000000000000000000000000c0000201')).toBe('::c000:201'); // IPv4-compatible: not mapped
    expect(ip('00000000000000000001ffffc0000201')).toBe('::1:ffff:c000:201');
    expect(ip('0001:0000:0000:0002:0000:0000:0003:0004')).toBe('1::2:0:0:3:4'); // a tie: the leftmost run
    expect(ip('0001:0000:0002:0000:0000:0000:0003:0004')).toBe('1:0:2::3:4'); // the longest run
    expect(ip('0001:0000:0002:0003:0004:0005:0006:0007')).toBe('1:0:2:3:4:5:6:7'); // one zero group: kept
    expect(ip('0001:0002:0003:0004:0005:0006:0007:0000')).toBe('1:2:3:4:5:6:7:0');
    expect(ip('0000:0001:0002:0003:0004:0005:0006:0007')).toBe('0:1:2:3:4:5:6:7');
    expect(ip('0001:0000:0000:0000:0000:0000:0000:0000')).toBe('1::');
    expect(ip('0000:0000:0000:0000:0000:0000:0000:0000')).toBe('::');
    expect(ip('ABCD:EF01:0000:0000:0000:0000:0000:00FF')).toBe('abcd:ef01::ff');
    expect(ip('')).toBe('<nil>');
    expect(ip('010203')).toBe('?010203');
  });

  it('decodes each string type', () => {
    const c = parseCertificate(STRINGS_DER);
    // BMPString (trailing NUL pair dropped), UniversalString (beyond the BMP).
    expect(c.issuer.commonName).toBe('A\u20ac');
    expect(c.issuer.organization).toEqual(['\u{1F600}B']);
    expect(c.issuer.text).toBe('CN=A\u20ac,O=\u{1F600}B');
    // PrintableString, TeletexString (as Latin-1), UTF8String (escaped), IA5String (unnamed: re-encoded as Go's asn1.Marshal does, UTF8String for `@`).
    expect(c.subject.country).toEqual(['US']);
    expect(c.subject.locality).toEqual(['M\u00e9']);
    expect(c.subject.text).toBe(`CN=h\u00e9llo\\, \\<w\\>,L=M\u00e9,C=US,1.2.840.113549.1.9.1=#0c05${Buffer.from('a@b.c').toString('hex')}`);
    expect(c.serialNumber).toBe('-7fff');
    expect(c.san.text).toBe('DNS:a.example, IP Address:2001:db8::1:0:0:1, IP Address:127.0.0.1, email:x@y.z, URI:https://u.example/');
    expect(c.extensions.map((e) => [e.id, e.critical])).toEqual([
      ['2.5.29.17', false],
      ['2.5.29.19', true],
    ]);
    // Lone surrogates in a BMPString become U+FFFD, as Go's utf16.Decode.
    const lone = parseCertificate(buildCertificate({ subject: name([atv('2.5.4.3', tlv(0x1e, Buffer.from([0xd8, 0x00, 0, 0x41])))]) }));
    expect(lone.subject.commonName).toBe('\ufffdA');
  });

  it('reads UTCTime (pivot at 50) and GeneralizedTime, refusing out-of-range fields', () => {
    const times = (notBefore: string, notAfter = '350101000000Z') => {
      const tag = (s: string) => tlv(s.length >= 15 ? 0x18 : 0x17, Buffer.from(s));
      const c = parseCertificate(buildCertificate({ notBefore: tag(notBefore), notAfter: tag(notAfter) }));
      return [c.notBefore.toISOString(), c.notAfter.toISOString()];
    };
    expect(times('491231235959Z', '500101000000Z')).toEqual(['2049-12-31T23:59:59.000Z', '1950-01-01T00:00:00.000Z']);
    expect(times('000101000000Z', '991231235959Z')).toEqual(['2000-01-01T00:00:00.000Z', '1999-12-31T23:59:59.000Z']);
    expect(times('2501011230Z')).toEqual(['2025-01-01T12:30:00.000Z', '2035-01-01T00:00:00.000Z']);
    expect(times('20500101000000Z', '19491231235959Z')).toEqual(['2050-01-01T00:00:00.000Z', '1949-12-31T23:59:59.000Z']);
    expect(times('240229000000Z')).toEqual(['2024-02-29T00:00:00.000Z', '2035-01-01T00:00:00.000Z']);
    // Date would roll these over; Go's time.Parse refuses them.
    for (const bad of ['250229000000Z', '250230000000Z', '250101240000Z', '250101006000Z', '250101000060Z', '251301000000Z', '250100000000Z', '20251231240000Z', '250101000000', '2025010100000Z'])
      expect(() => times(bad), bad).toThrow(new CertificateParseError('bad validity time'));
  });
});
