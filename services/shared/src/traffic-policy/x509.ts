/**
 * The X.509 fields traffic-policy expressions read from a TLS certificate
 * (`conn.tls.client.*`, `conn.tls.server.*`), parsed from its DER with a small strict DER reader:
 * no ASN.1 library on the request path, and the values come out the way ngrok's (Go) ingress
 * shows them — distinguished names as Go's `pkix.Name.String()` writes them (RFC 2253-like,
 * most specific first: `CN=client,O=Acme,C=US`), serial numbers as lower-case hex, signature
 * algorithms under Go's names (`SHA256-RSA`, `ECDSA-SHA256`, …), IP addresses as Go prints them.
 *
 * Only what a certificate the TLS stack already accepted can hold is expected; anything else
 * (a DER error, an unknown critical structure) throws `CertificateParseError`.
 */

/**
 * Largest certificate (DER bytes) whose fields policies read: a larger one makes any read of its
 * fields an evaluation error (the rule is skipped), like `matches()` on an over-long string. It
 * keeps the cost bound (`cost.ts`) of certificate fields small; real client certificates are 1–3
 * KB. (Without it the bound would be OpenSSL's 100 KiB limit on a whole Certificate message.)
 */
export const MAX_CERTIFICATE_BYTES = 8 * 1024;

export class CertificateParseError extends Error {
  constructor(message: string) {
    super(`the certificate could not be read: ${message}`);
    this.name = 'CertificateParseError';
  }
}

/** One distinguished name (issuer or subject): its string form and the fields ngrok names. */
export interface ParsedName {
  /** Go's `pkix.Name.String()`: `CN=…,OU=…,O=…,POSTALCODE=…,STREET=…,L=…,ST=…,C=…`, then other attributes as `oid=#hex`. */
  text: string;
  /** The last CN (as Go keeps it), `""` when none. */
  commonName: string;
  country: string[];
  locality: string[];
  organization: string[];
  organizationalUnit: string[];
  postalCode: string[];
  province: string[];
  streetAddress: string[];
}

export interface ParsedSan {
  /** OpenSSL's form: `DNS:a.example, IP Address:192.0.2.1, email:x@y, URI:https://…`, in certificate order. */
  text: string;
  dnsNames: string[];
  emailAddresses: string[];
  ipAddresses: string[];
  uris: string[];
}

export interface ParsedExtension {
  id: string;
  critical: boolean;
  value: Uint8Array;
}

export interface ParsedCertificate {
  serialNumber: string;
  signatureAlgorithm: string;
  issuer: ParsedName;
  subject: ParsedName;
  notBefore: Date;
  notAfter: Date;
  san: ParsedSan;
  extensions: ParsedExtension[];
}

// ---- DER ------------------------------------------------------------------------------------

interface Tlv {
  tag: number;
  /** Offset of the first content byte. */
  start: number;
  /** Offset just past the content. */
  end: number;
  /** Offset of the tag byte. */
  at: number;
}

/** The TLV at `pos`, which must end by `limit`. Single-byte tags, definite lengths only (DER). */
function tlv(b: Uint8Array, pos: number, limit: number): Tlv {
  if (pos + 2 > limit) throw new CertificateParseError('truncated');
  const tag = b[pos]!;
  if ((tag & 0x1f) === 0x1f) throw new CertificateParseError('unsupported tag');
  let len = b[pos + 1]!;
  let start = pos + 2;
  if (len & 0x80) {
    const n = len & 0x7f;
    if (n === 0 || n > 4 || start + n > limit) throw new CertificateParseError('bad length');
    len = 0;
    for (let i = 0; i < n; i++) len = len * 256 + b[start + i]!;
    start += n;
  }
  const end = start + len;
  if (end > limit) throw new CertificateParseError('truncated');
  return { tag, start, end, at: pos };
}

/** The children of a constructed TLV. */
function children(b: Uint8Array, t: Tlv): Tlv[] {
  const out: Tlv[] = [];
  for (let p = t.start; p < t.end; ) {
    const c = tlv(b, p, t.end);
    out.push(c);
    p = c.end;
  }
  return out;
}

function want(t: Tlv | undefined, tag: number, what: string): Tlv {
  if (!t || t.tag !== tag) throw new CertificateParseError(`expected ${what}`);
  return t;
}

/** Dotted OIDs already decoded, by their content bytes (up to 6) as a number. */
const OID_CACHE = new Map<number, string>();

function oid(b: Uint8Array, t: Tlv | undefined): string {
  if (!t || t.tag !== 0x06 || t.end <= t.start) throw new CertificateParseError('expected an object identifier');
  if ((b[t.end - 1]! & 0x80) !== 0) throw new CertificateParseError('bad object identifier');
  const short = t.end - t.start <= 6;
  let key = 1;
  if (short) for (let i = t.start; i < t.end; i++) key = key * 256 + b[i]!;
  const hit = short ? OID_CACHE.get(key) : undefined;
  if (hit !== undefined) return hit;
  let out = '';
  let v = 0;
  let big: bigint | null = null;
  let first = true;
  for (let i = t.start; i < t.end; i++) {
    const x = b[i]! & 0x7f;
    if (big !== null) big = (big << 7n) | BigInt(x);
    else if (v >= 2 ** 45) big = (BigInt(v) << 7n) | BigInt(x);
    else v = v * 128 + x;
    if ((b[i]! & 0x80) !== 0) continue;
    if (first) {
      // The first subidentifier holds two arcs: 40·X + Y (X = 2 takes any Y ≥ 40).
      const n = big ?? BigInt(v);
      out = n < 40n ? `0.${n}` : n < 80n ? `1.${n - 40n}` : `2.${n - 80n}`;
      first = false;
    } else out += `.${big ?? v}`;
    v = 0;
    big = null;
  }
  if (short && OID_CACHE.size < 1024) OID_CACHE.set(key, out);
  return out;
}

/** Bytes as characters 0–255. */
function latin1(b: Uint8Array, t: Tlv): string {
  if (t.end - t.start <= 64) {
    let s = '';
    for (let i = t.start; i < t.end; i++) s += String.fromCharCode(b[i]!);
    return s;
  }
  return Buffer.from(b.buffer, b.byteOffset + t.start, t.end - t.start).toString('latin1');
}

function isAscii(b: Uint8Array, t: Tlv): boolean {
  for (let i = t.start; i < t.end; i++) if (b[i]! >= 0x80) return false;
  return true;
}

const utf8 = (b: Uint8Array, t: Tlv) => (isAscii(b, t) ? latin1(b, t) : Buffer.from(b.buffer, b.byteOffset + t.start, t.end - t.start).toString('utf8'));

const LONE_SURROGATE_RE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;

/** A directory string's text, or undefined for a value that is not a string type. */
function asString(b: Uint8Array, t: Tlv): string | undefined {
  switch (t.tag) {
    case 0x0c: // UTF8String
      return utf8(b, t);
    case 0x12: // NumericString
    case 0x13: // PrintableString
    case 0x14: // T61String
    case 0x16: // IA5String
    case 0x1a: // VisibleString
      return latin1(b, t);
    case 0x1e: {
      // BMPString: UTF-16BE, as Go's parseBMPString (even length, a trailing NUL pair dropped,
      // lone surrogates as U+FFFD).
      if ((t.end - t.start) % 2 !== 0) throw new CertificateParseError('bad BMPString');
      let end = t.end;
      if (end - t.start >= 2 && b[end - 1] === 0 && b[end - 2] === 0) end -= 2;
      let s = '';
      for (let i = t.start; i < end; i += 2) s += String.fromCharCode((b[i]! << 8) | b[i + 1]!);
      return s.replace(LONE_SURROGATE_RE, '\ufffd');
    }
    case 0x1c: {
      // UniversalString: UTF-32BE
      if ((t.end - t.start) % 4 !== 0) throw new CertificateParseError('bad UniversalString');
      let s = '';
      for (let i = t.start; i < t.end; i += 4) {
        const cp = ((b[i]! << 24) | (b[i + 1]! << 16) | (b[i + 2]! << 8) | b[i + 3]!) >>> 0;
        if (cp > 0x10ffff) throw new CertificateParseError('bad UniversalString');
        s += String.fromCodePoint(cp >= 0xd800 && cp <= 0xdfff ? 0xfffd : cp);
      }
      return s;
    }
  }
  return undefined;
}

const HEX = Array.from({ length: 256 }, (_, i) => i.toString(16).padStart(2, '0'));

function hex(b: Uint8Array, from: number, to: number): string {
  let s = '';
  for (let i = from; i < to; i++) s += HEX[b[i]!];
  return s;
}

// ---- names ----------------------------------------------------------------------------------

/** Attribute types Go names (`pkix` `attributeTypeNames`). */
const ATTRIBUTE_NAMES: Record<string, string> = {
  '2.5.4.6': 'C',
  '2.5.4.10': 'O',
  '2.5.4.11': 'OU',
  '2.5.4.3': 'CN',
  '2.5.4.5': 'SERIALNUMBER',
  '2.5.4.7': 'L',
  '2.5.4.8': 'ST',
  '2.5.4.9': 'STREET',
  '2.5.4.17': 'POSTALCODE',
};

const NEEDS_ESCAPE_RE = /[,+"\\<>;]|^[ #]| $/;

/** RFC 2253 escaping as Go's `RDNSequence.String()` does it. */
function escapeValue(v: string): string {
  if (!NEEDS_ESCAPE_RE.test(v)) return v;
  let out = '';
  const last = v.length - 1;
  for (let k = 0; k < v.length; k++) {
    const c = v[k]!;
    const esc = c === ',' || c === '+' || c === '"' || c === '\\' || c === '<' || c === '>' || c === ';' || (c === ' ' && (k === 0 || k === last)) || (c === '#' && k === 0);
    out += esc ? `\\${c}` : c;
  }
  return out;
}

/** Go's PrintableString character set (without `*` and `&`), used to re-encode unknown string attributes as Go does. */
const PRINTABLE_RE = /^[A-Za-z0-9 '()+,\-./:=?]*$/;

const hex2 = (x: number) => HEX[x]!;

/** The UTF-8 encoding of `s`: its length and its hex (lone surrogates as U+FFFD, as Node encodes them). */
function utf8Hex(s: string): [number, string] {
  let n = 0;
  let out = '';
  for (const ch of s) {
    let c = ch.codePointAt(0)!;
    if (c >= 0xd800 && c <= 0xdfff) c = 0xfffd;
    if (c < 0x80) {
      out += HEX[c];
      n += 1;
    } else if (c < 0x800) {
      out += HEX[0xc0 | (c >> 6)]! + HEX[0x80 | (c & 63)]!;
      n += 2;
    } else if (c < 0x10000) {
      out += HEX[0xe0 | (c >> 12)]! + HEX[0x80 | ((c >> 6) & 63)]! + HEX[0x80 | (c & 63)]!;
      n += 3;
    } else {
      out += HEX[0xf0 | (c >> 18)]! + HEX[0x80 | ((c >> 12) & 63)]! + HEX[0x80 | ((c >> 6) & 63)]! + HEX[0x80 | (c & 63)]!;
      n += 4;
    }
  }
  return [n, out];
}

/** A DER length in hex. */
function derLength(n: number): string {
  if (n < 0x80) return hex2(n);
  const bytes: number[] = [];
  for (; n > 0; n = Math.floor(n / 256)) bytes.unshift(n % 256);
  return hex2(0x80 + bytes.length) + bytes.map(hex2).join('');
}

/**
 * `oid=#hex` for an attribute Go has no name for: the DER Go's `asn1.Marshal` gives the decoded
 * value (a string becomes a PrintableString when it can, else a UTF8String; any other value is
 * kept as it was).
 */
function unknownAttribute(id: string, b: Uint8Array, v: Tlv, s: string | undefined): string {
  if (s === undefined) return `${id}=#${hex(b, v.at, v.end)}`;
  const tag = PRINTABLE_RE.test(s) ? '13' : '0c';
  if (isAscii(b, v) && v.tag !== 0x1e && v.tag !== 0x1c) return `${id}=#${tag}${derLength(v.end - v.start)}${hex(b, v.start, v.end)}`;
  const [n, body] = utf8Hex(s);
  return `${id}=#${tag}${derLength(n)}${body}`;
}

function parseName(b: Uint8Array, t: Tlv): ParsedName {
  want(t, 0x30, 'a name');
  const n: ParsedName = { text: '', commonName: '', country: [], locality: [], organization: [], organizationalUnit: [], postalCode: [], province: [], streetAddress: [] };
  let serial = '';
  /** Attributes Go does not parse into named fields, in certificate order. */
  const extra: string[] = [];
  for (const rdn of children(b, t)) {
    want(rdn, 0x31, 'a relative distinguished name');
    for (const atv of children(b, rdn)) {
      const [typeTlv, valueTlv] = children(b, want(atv, 0x30, 'an attribute'));
      if (!typeTlv || !valueTlv) throw new CertificateParseError('bad attribute');
      const id = oid(b, typeTlv);
      const value = asString(b, valueTlv);
      const known = ATTRIBUTE_NAMES[id];
      if (!known) {
        extra.push(unknownAttribute(id, b, valueTlv, value));
        continue;
      }
      if (value === undefined) continue; // Go skips a named attribute that is not a string
      switch (known) {
        case 'CN':
          n.commonName = value;
          break;
        case 'SERIALNUMBER':
          serial = value;
          break;
        case 'C':
          n.country.push(value);
          break;
        case 'L':
          n.locality.push(value);
          break;
        case 'ST':
          n.province.push(value);
          break;
        case 'STREET':
          n.streetAddress.push(value);
          break;
        case 'O':
          n.organization.push(value);
          break;
        case 'OU':
          n.organizationalUnit.push(value);
          break;
        case 'POSTALCODE':
          n.postalCode.push(value);
          break;
      }
    }
  }
  // Go: ToRDNSequence() (C, ST, L, STREET, POSTALCODE, O, OU, CN, SERIALNUMBER; several values
  // of one type in one RDN), printed last RDN first, then the unnamed attributes, last first.
  const rdns: string[] = [];
  const add = (type: string, values: string[]) => {
    if (values.length > 0) rdns.push(values.map((v) => `${type}=${escapeValue(v)}`).join('+'));
  };
  if (serial) add('SERIALNUMBER', [serial]);
  if (n.commonName) add('CN', [n.commonName]);
  add('OU', n.organizationalUnit);
  add('O', n.organization);
  add('POSTALCODE', n.postalCode);
  add('STREET', n.streetAddress);
  add('L', n.locality);
  add('ST', n.province);
  add('C', n.country);
  for (let i = extra.length - 1; i >= 0; i--) rdns.push(extra[i]!);
  n.text = rdns.join(',');
  return n;
}

// ---- other fields ---------------------------------------------------------------------------

/** Go's `x509.SignatureAlgorithm` names; others as their dotted OID. */
const SIGNATURE_ALGORITHMS: Record<string, string> = {
  '1.2.840.113549.1.1.2': 'MD2-RSA',
  '1.2.840.113549.1.1.4': 'MD5-RSA',
  '1.2.840.113549.1.1.5': 'SHA1-RSA',
  '1.3.14.3.2.29': 'SHA1-RSA',
  '1.2.840.113549.1.1.11': 'SHA256-RSA',
  '1.2.840.113549.1.1.12': 'SHA384-RSA',
  '1.2.840.113549.1.1.13': 'SHA512-RSA',
  '1.2.840.10040.4.3': 'DSA-SHA1',
  '2.16.840.1.101.3.4.3.2': 'DSA-SHA256',
  '1.2.840.10045.4.1': 'ECDSA-SHA1',
  '1.2.840.10045.4.3.2': 'ECDSA-SHA256',
  '1.2.840.10045.4.3.3': 'ECDSA-SHA384',
  '1.2.840.10045.4.3.4': 'ECDSA-SHA512',
  '1.3.101.112': 'Ed25519',
};
const RSA_PSS = '1.2.840.113549.1.1.10';
const PSS_HASHES: Record<string, string> = {
  '2.16.840.1.101.3.4.2.1': 'SHA256-RSAPSS',
  '2.16.840.1.101.3.4.2.2': 'SHA384-RSAPSS',
  '2.16.840.1.101.3.4.2.3': 'SHA512-RSAPSS',
};

function signatureAlgorithm(b: Uint8Array, t: Tlv): string {
  const [alg, params] = children(b, want(t, 0x30, 'an algorithm identifier'));
  const id = oid(b, want(alg, 0x06, 'an algorithm'));
  if (id !== RSA_PSS) return SIGNATURE_ALGORITHMS[id] ?? id;
  // RSASSA-PSS-params: [0] hashAlgorithm (default SHA-1, which Go does not name).
  try {
    const hash = params && params.tag === 0x30 ? children(b, params).find((c) => c.tag === 0xa0) : undefined;
    const hashAlg = hash ? children(b, children(b, hash)[0]!)[0] : undefined;
    return (hashAlg && PSS_HASHES[oid(b, hashAlg)]) ?? id;
  } catch {
    return id;
  }
}

/** An INTEGER as lower-case hex without leading zeros (Go's `%x` of a big.Int), `-` when negative. */
function serialHex(b: Uint8Array, t: Tlv): string {
  want(t, 0x02, 'a serial number');
  if (t.end === t.start) throw new CertificateParseError('empty serial number');
  let v = BigInt(`0x${hex(b, t.start, t.end)}`);
  if (b[t.start]! & 0x80) v -= 1n << BigInt(8 * (t.end - t.start));
  return v < 0n ? `-${(-v).toString(16)}` : v.toString(16);
}

function time(b: Uint8Array, t: Tlv): Date {
  const s = latin1(b, t);
  let m: RegExpExecArray | null;
  let iso: string | undefined;
  if (t.tag === 0x17 && (m = /^(\d\d)(\d\d)(\d\d)(\d\d)(\d\d)(\d\d)?Z$/.exec(s))) {
    const yy = Number(m[1]);
    iso = `${yy < 50 ? 2000 + yy : 1900 + yy}-${m[2]}-${m[3]}T${m[4]}:${m[5]}:${m[6] ?? '00'}Z`;
  } else if (t.tag === 0x18 && (m = /^(\d{4})(\d\d)(\d\d)(\d\d)(\d\d)(\d\d)(\.\d+)?Z$/.exec(s))) {
    iso = `${m[1]}-${m[2]}-${m[3]}T${m[4]}:${m[5]}:${m[6]}${m[7] ? m[7].slice(0, 4) : ''}Z`;
  }
  const d = iso ? new Date(iso) : new Date(NaN);
  // Date rolls over out-of-range fields (Feb 30, 24:00, :60); Go's time.Parse refuses them.
  if (Number.isNaN(d.getTime()) || d.toISOString().slice(0, 19) !== iso!.slice(0, 19)) throw new CertificateParseError('bad validity time');
  return d;
}

/** An IP address (`b[from..to]`) as Go's `net.IP.String()` prints it. */
export function formatIp(b: Uint8Array, from = 0, to = b.length): string {
  const n = to - from;
  if (n === 0) return '<nil>';
  if (n === 4) return `${b[from]}.${b[from + 1]}.${b[from + 2]}.${b[from + 3]}`;
  if (n !== 16) return `?${hex(b, from, to)}`;
  let mapped = b[from + 10] === 0xff && b[from + 11] === 0xff;
  for (let i = 0; mapped && i < 10; i++) mapped = b[from + i] === 0;
  if (mapped) return `${b[from + 12]}.${b[from + 13]}.${b[from + 14]}.${b[from + 15]}`;
  const group = (i: number) => (b[from + 2 * i]! << 8) | b[from + 2 * i + 1]!;
  // The longest run of two or more zero groups (the first of equals) becomes `::`.
  let best = -1;
  let bestLen = 1;
  for (let i = 0; i < 8; ) {
    if (group(i) !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && group(j) === 0) j++;
    if (j - i > bestLen) {
      best = i;
      bestLen = j - i;
    }
    i = j;
  }
  let out = '';
  for (let i = 0; i < 8; i++) {
    if (i === best) {
      out += '::';
      i += bestLen - 1;
      continue;
    }
    if (out !== '' && !out.endsWith(':')) out += ':';
    out += group(i).toString(16);
  }
  return out;
}

function parseSan(b: Uint8Array, value: Tlv, into: ParsedSan): void {
  const seq = tlv(b, value.start, value.end);
  const text: string[] = into.text ? [into.text] : [];
  for (const g of children(b, want(seq, 0x30, 'subject alternative names'))) {
    switch (g.tag) {
      case 0x81: {
        const s = latin1(b, g);
        into.emailAddresses.push(s);
        text.push(`email:${s}`);
        break;
      }
      case 0x82: {
        const s = latin1(b, g);
        into.dnsNames.push(s);
        text.push(`DNS:${s}`);
        break;
      }
      case 0x86: {
        const s = latin1(b, g);
        into.uris.push(s);
        text.push(`URI:${s}`);
        break;
      }
      case 0x87: {
        const s = formatIp(b, g.start, g.end);
        into.ipAddresses.push(s);
        text.push(`IP Address:${s}`);
        break;
      }
    }
  }
  into.text = text.join(', ');
}

const SUBJECT_ALT_NAME = '2.5.29.17';

/** Throws `CertificateParseError` for a certificate over `MAX_CERTIFICATE_BYTES`. */
export function checkCertificateSize(der: Uint8Array): void {
  if (der.length > MAX_CERTIFICATE_BYTES) throw new CertificateParseError(`it is larger than ${MAX_CERTIFICATE_BYTES} bytes (${der.length})`);
}

/** Parses a DER X.509 certificate of at most `MAX_CERTIFICATE_BYTES`. Throws `CertificateParseError`. */
export function parseCertificate(der: Uint8Array): ParsedCertificate {
  checkCertificateSize(der);
  const cert = want(tlv(der, 0, der.length), 0x30, 'a certificate');
  const [tbs, sigAlg] = children(der, cert);
  const f = children(der, want(tbs, 0x30, 'the certificate body'));
  let i = 0;
  if (f[i]?.tag === 0xa0) i++; // version
  const serialNumber = serialHex(der, f[i++]!);
  i++; // the inner signature algorithm (Go reports the outer one)
  const issuer = parseName(der, f[i++]!);
  const validity = children(der, want(f[i++], 0x30, 'the validity'));
  const subject = parseName(der, f[i++]!);
  i++; // subjectPublicKeyInfo
  const san: ParsedSan = { text: '', dnsNames: [], emailAddresses: [], ipAddresses: [], uris: [] };
  const extensions: ParsedExtension[] = [];
  for (; i < f.length; i++) {
    if (f[i]!.tag !== 0xa3) continue; // issuer/subject unique ids
    const list = want(children(der, f[i]!)[0], 0x30, 'the extensions');
    for (const e of children(der, list)) {
      const parts = children(der, want(e, 0x30, 'an extension'));
      const id = oid(der, parts[0]!);
      let critical = false;
      let k = 1;
      if (parts[k]?.tag === 0x01) {
        const flag = parts[k++]!;
        if (flag.end - flag.start !== 1) throw new CertificateParseError('bad extension criticality');
        critical = der[flag.start] !== 0;
      }
      const value = want(parts[k], 0x04, 'an extension value');
      extensions.push({ id, critical, value: new Uint8Array(der.subarray(value.start, value.end)) });
      if (id === SUBJECT_ALT_NAME) parseSan(der, value, san);
    }
  }
  if (validity.length !== 2) throw new CertificateParseError('bad validity');
  return {
    serialNumber,
    signatureAlgorithm: signatureAlgorithm(der, want(sigAlg, 0x30, 'the signature algorithm')),
    issuer,
    subject,
    notBefore: time(der, validity[0]!),
    notAfter: time(der, validity[1]!),
    san,
    extensions,
  };
}

/** PEM of a DER certificate, `\n` line ends, no newline after the END line (as ngrok's `conn.tls.client.pem`). */
export function certificatePem(der: Uint8Array): string {
  const b64 = Buffer.from(der.buffer, der.byteOffset, der.byteLength).toString('base64');
  let body = '';
  for (let i = 0; i < b64.length; i += 64) body += `${b64.slice(i, i + 64)}\n`;
  return `-----BEGIN CERTIFICATE-----\n${body}-----END CERTIFICATE-----`;
}
