import { X509Certificate } from 'node:crypto';
import type { CelTlsSocket } from './cel-vars.js';
import { CelCompileError, compileExpression } from './cel.js';
import type { PolicyDirection } from './types.js';
import { parseTrafficPolicy, TrafficPolicyError, validateTrafficPolicy } from './parse.js';
import { MAX_CERTIFICATE_BYTES } from './x509.js';

/**
 * Test helpers for `conn.tls`: certificates made with OpenSSL once (fixed bytes, so the expected
 * values below are exact), a DER builder for shapes OpenSSL will not make, and a TLS socket
 * stand-in that counts what is read.
 */

/**
 * A leaf signed by an EC CA (`CN=exampleca.com,O=Example CA,C=US`): serial
 * b53017e79d4a5208b314a55d3574e0a8, a full subject (two countries, a multi-valued OU RDN, an
 * emailAddress attribute, a serialNumber attribute), SANs of every kind, key usage (critical)
 * and client-auth extended key usage. Valid 2026-11-25T14:46:29Z to 2036-11-22T14:46:29Z.
 *
 *     openssl req -newkey rsa:2048 -multivalue-rdn -subj "/C=US/C=CA/ST=California/L=Mountain View/street=1234 Secure Blvd/postalCode=94043/O=Example Corp/OU=Web Services+OU=Ops/CN=www.example.com/emailAddress=admin@example.com/serialNumber=42"
 *     openssl x509 -req -CA ca.pem -set_serial 0x00b53017e79d4a5208b314a55d3574e0a8 -sha256 -extfile <(echo subjectAltName=DNS:www.example.com,DNS:example.com,IP:192.168.1.1,IP:2001:db8::1,email:ngrok-email1@example.com,URI:https://example.com/example …)
 */
export const LEAF_PEM = [
  '-----BEGIN CERTIFICATE-----',
  'MIID2zCCA4GgAwIBAgIRALUwF+edSlIIsxSlXTV04KgwCgYIKoZIzj0EAwIwOjEL',
  'MAkGA1UEBhMCVVMxEzARBgNVBAoMCkV4YW1wbGUgQ0ExFjAUBgNVBAMMDWV4YW1w',
  'bGVjYS5jb20wHhcNMjYxMTI1MTQ0NjI5WhcNMzYxMTIyMTQ0NjI5WjCB9TELMAkG',
  'A1UEBhMCVVMxCzAJBgNVBAYTAkNBMRMwEQYDVQQIDApDYWxpZm9ybmlhMRYwFAYD',
  'VQQHDA1Nb3VudGFpbiBWaWV3MRkwFwYDVQQJDBAxMjM0IFNlY3VyZSBCbHZkMQ4w',
  'DAYDVQQRDAU5NDA0MzEVMBMGA1UECgwMRXhhbXBsZSBDb3JwMSEwCgYDVQQLDANP',
  'cHMwEwYDVQQLDAxXZWIgU2VydmljZXMxGDAWBgNVBAMMD3d3dy5leGFtcGxlLmNv',
  'bTEgMB4GCSqGSIb3DQEJARYRYWRtaW5AZXhhbXBsZS5jb20xCzAJBgNVBAUTAjQy',
  'MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAtB6SP9w/Aa0sSAOSCEnw',
  'GlKBFHWhjrctPRAsKhnRMeVSBl1cszUvZzRH27FYb7J6huEuBOzoSIxngIgQPnXQ',
  'lzPMyqT9eXpXPSMqzJDynDo7X5NWSvgW5M2FSK1RTfQEiwQXF24VWfKBTzBdBLyk',
  'bBXWi4+KgHGvAayWe2Nge7q5hWVMqCb+Ynl/P7IqQ0e8fsjRd3VSYUsdOKXjWPdw',
  '5dj7n+VIx7UwQ+/onh+91qgULbVTDlW7R7FetT+UvNQ5jOpC0R89AhXxcwuCYQk4',
  'DUPKnV9y9nuHRJsEl4W/BtejDFnLc2kLPRx/K2aOTYMJVbuoL+ZhB86Ncp/JHuoA',
  'ywIDAQABo4HgMIHdMHYGA1UdEQRvMG2CD3d3dy5leGFtcGxlLmNvbYILZXhhbXBs',
  'ZS5jb22HBMCoAQGHECABDbgAAAAAAAAAAAAAAAGBGG5ncm9rLWVtYWlsMUBleGFt',
  'cGxlLmNvbYYbaHR0cHM6Ly9leGFtcGxlLmNvbS9leGFtcGxlMA4GA1UdDwEB/wQE',
  'AwIFoDATBgNVHSUEDDAKBggrBgEFBQcDAjAdBgNVHQ4EFgQUoY8Ss/TfN9K5+sHU',
  'Pbdbp/wGiNYwHwYDVR0jBBgwFoAUQ7mB30SQ8+SCxdTjO2OgLsQdzm8wCgYIKoZI',
  'zj0EAwIDSAAwRQIgG6JPar81+o2txQwYRekjJs3AbqOm0zdyJFEV3lDV3CECIQCq',
  'nUeOe0jGmfD9tj5o+8UWn1ZrxCwgXXPPhC8IF+nm1w==',
  '-----END CERTIFICATE-----'
].join('\n');

/** Self-signed Ed25519, subject `OU=x + CN=a, b` (one RDN) and `O=#hash ` (to escape). */
export const ED25519_PEM = [
  '-----BEGIN CERTIFICATE-----',
  'MIIBaTCCARugAwIBAgIUMCOgNZbQC3hdKkl7owy+d5MY/ywwBQYDK2VwMCoxFzAI',
  'BgNVBAsMAXgwCwYDVQQDDARhLCBiMQ8wDQYDVQQKDAYjaGFzaCAwHhcNMjYxMTI1',
  'MTQ0NjQxWhcNMzYxMTIyMTQ0NjQxWjAqMRcwCAYDVQQLDAF4MAsGA1UEAwwEYSwg',
  'YjEPMA0GA1UECgwGI2hhc2ggMCowBQYDK2VwAyEA5G9kaqsNxRABG+ybK6BlQ77k',
  'SPd5qxtENAyJpBwkid+jUzBRMB0GA1UdDgQWBBTqoycvPdo5f1qvhWdaDUZHpy8y',
  'TDAfBgNVHSMEGDAWgBTqoycvPdo5f1qvhWdaDUZHpy8yTDAPBgNVHRMBAf8EBTAD',
  'AQH/MAUGAytlcANBAI3XoaIF1jboYRajVt9bYHxXhGYo65wKQTSpOOuPJyKHUcF0',
  '603R5rT9nJngtqkWuY12qO4C8dgJEra7e6lIog4=',
  '-----END CERTIFICATE-----'
].join('\n');

/** Self-signed RSA-PSS with SHA-384, `CN=pss`. */
export const PSS_PEM = [
  '-----BEGIN CERTIFICATE-----',
  'MIICYDCCAZWgAwIBAgIUUPdWM1jLMkzr4Z8VmVOUOpiFaWMwQQYJKoZIhvcNAQEK',
  'MDSgDzANBglghkgBZQMEAgIFAKEcMBoGCSqGSIb3DQEBCDANBglghkgBZQMEAgIF',
  'AKIDAgFOMA4xDDAKBgNVBAMMA3BzczAeFw0yNjExMjUxNDQ2MzlaFw0zNjExMjIx',
  'NDQ2MzlaMA4xDDAKBgNVBAMMA3BzczCBnzANBgkqhkiG9w0BAQEFAAOBjQAwgYkC',
  'gYEAv/EJZw1W0HRGmHJVkg/MMzRIWnk8dQ0NXkQnuuPzjlECjeGpK/G97bLirGIG',
  'R7fsRk68v98Q/nz9aKw153PviuGnhZLcvmsxli6qCd1s1h5Ugbcc3yonqmjx2M5G',
  'tXi9RLVSGew0qbtwHxBMbAWU20w/CboMkKEVuEa/nkvLrz0CAwEAAaNTMFEwHQYD',
  'VR0OBBYEFCCfvEwKUmk2A0wZXEyVajYExsr/MB8GA1UdIwQYMBaAFCCfvEwKUmk2',
  'A0wZXEyVajYExsr/MA8GA1UdEwEB/wQFMAMBAf8wQQYJKoZIhvcNAQEKMDSgDzAN',
  'BglghkgBZQMEAgIFAKEcMBoGCSqGSIb3DQEBCDANBglghkgBZQMEAgIFAKIDAgFO',
  'A4GBADRYt8hudOcOsphqls9pyqzaj/N6ttqCZ3xLgp6ZlU5GqZiAbufuqqWOj0xA',
  'UBZtiB888ee2FIrJ9s38BOOH+gzIcHm0KZgfoLGXpJILu83eyktSzLB8X6meKiVU',
  'Uc/8I4pwIH0Tq1ZMob4jXzvr/kCL7bHF4ObY3XTyOmlyr+So',
  '-----END CERTIFICATE-----'
].join('\n');

export const derOf = (pem: string): Buffer => new X509Certificate(pem).raw;

// ---- a DER builder -----------------------------------------------------------------------------

function len(n: number): number[] {
  if (n < 0x80) return [n];
  const bytes: number[] = [];
  for (; n > 0; n = Math.floor(n / 256)) bytes.unshift(n % 256);
  return [0x80 + bytes.length, ...bytes];
}
export const tlv = (tag: number, ...body: (Buffer | Uint8Array)[]): Buffer => {
  const b = Buffer.concat(body);
  return Buffer.concat([Buffer.from([tag, ...len(b.length)]), b]);
};
export const seq = (...body: Buffer[]) => tlv(0x30, ...body);
export function oid(dotted: string): Buffer {
  const arcs = dotted.split('.').map(BigInt);
  const out: number[] = [];
  for (const arc of [arcs[0]! * 40n + arcs[1]!, ...arcs.slice(2)]) {
    const groups: number[] = [Number(arc & 0x7fn)];
    for (let v = arc >> 7n; v > 0n; v >>= 7n) groups.unshift(Number(v & 0x7fn) | 0x80);
    out.push(...groups);
  }
  return tlv(0x06, Buffer.from(out));
}
/** An attribute `type = value` (value: a whole TLV). */
export const atv = (type: string, value: Buffer) => seq(oid(type), value);
export const utf8 = (s: string) => tlv(0x0c, Buffer.from(s, 'utf8'));
/** A Name of RDNs, each a list of attributes. */
export const name = (...rdns: Buffer[][]) => seq(...rdns.map((r) => tlv(0x31, ...r)));

export interface CertSpec {
  serial?: Buffer;
  issuer?: Buffer;
  subject?: Buffer;
  notBefore?: Buffer;
  notAfter?: Buffer;
  /** Whole Extension SEQUENCEs. */
  extensions?: Buffer[];
  signatureAlgorithm?: Buffer;
}

/** A certificate's DER (unsigned: the signature is a placeholder; parsing does not verify). */
export function buildCertificate(c: CertSpec = {}): Buffer {
  const alg = c.signatureAlgorithm ?? seq(oid('1.2.840.10045.4.3.2'));
  const tbs = seq(
    tlv(0xa0, tlv(0x02, Buffer.from([2]))),
    c.serial ?? tlv(0x02, Buffer.from([1])),
    alg,
    c.issuer ?? name([atv('2.5.4.3', utf8('test CA'))]),
    seq(c.notBefore ?? tlv(0x17, Buffer.from('250101000000Z')), c.notAfter ?? tlv(0x17, Buffer.from('350101000000Z'))),
    c.subject ?? name([atv('2.5.4.3', utf8('test'))]),
    seq(seq(oid('1.3.101.112')), tlv(0x03, Buffer.alloc(33))),
    ...(c.extensions ? [tlv(0xa3, seq(...c.extensions))] : []),
  );
  return seq(tbs, alg, tlv(0x03, Buffer.alloc(9)));
}

/** An Extension: `critical` written only when true (DER omits the default). */
export const extension = (id: string, value: Buffer, critical = false) => seq(oid(id), ...(critical ? [tlv(0x01, Buffer.from([0xff]))] : []), tlv(0x04, value));

/**
 * The largest certificate of at most `MAX_CERTIFICATE_BYTES` that `build` makes from copies of
 * `part` (for the cost bound's worst cases).
 */
export function largestCertificate(build: (parts: Buffer[]) => Buffer, part: Buffer): Buffer {
  let lo = 1;
  let hi = Math.ceil(MAX_CERTIFICATE_BYTES / part.length);
  while (lo < hi) {
    const mid = Math.ceil((lo + hi) / 2);
    if (build(new Array<Buffer>(mid).fill(part)).length <= MAX_CERTIFICATE_BYTES) lo = mid;
    else hi = mid - 1;
  }
  return build(new Array<Buffer>(lo).fill(part));
}

// ---- a TLS socket stand-in -----------------------------------------------------------------------

export interface FakeTlsSocket extends CelTlsSocket {
  /** Calls per method. */
  calls: Record<string, number>;
}

export function fakeTlsSocket(o: { protocol?: string; cipher?: string; servername?: string | false; alpn?: string | false; resumed?: boolean; peer?: Uint8Array | null; local?: Uint8Array | null } = {}): FakeTlsSocket {
  const calls: Record<string, number> = {};
  const count = (m: string) => (calls[m] = (calls[m] ?? 0) + 1);
  const sock = {
    calls,
    getProtocol: () => (count('getProtocol'), o.protocol ?? 'TLSv1.3'),
    getCipher: () => (count('getCipher'), { name: 'TLS_AES_128_GCM_SHA256', standardName: o.cipher ?? 'TLS_AES_128_GCM_SHA256', version: 'TLSv1.3' }),
    get servername() {
      count('servername');
      return o.servername ?? 'app.example.com';
    },
    get alpnProtocol() {
      count('alpnProtocol');
      return o.alpn ?? false;
    },
    isSessionReused: () => (count('isSessionReused'), o.resumed ?? false),
    getPeerX509Certificate: () => (count('getPeerX509Certificate'), o.peer ? { raw: o.peer } : undefined),
    getX509Certificate: () => (count('getX509Certificate'), o.local ? { raw: o.local } : undefined),
  };
  return sock;
}

/**
 * The error a policy document (YAML/JSON text, or an object) is refused with when saved; throws
 * when it is accepted or fails some other way. `checkCost`: also the save-time cost bound.
 */
export function refusal(doc: unknown, checkCost: boolean): TrafficPolicyError {
  try {
    if (typeof doc === 'string') parseTrafficPolicy(doc);
    else validateTrafficPolicy(doc, { checkCost });
  } catch (err) {
    if (err instanceof TrafficPolicyError) return err;
    throw err;
  }
  throw new Error('expected the document to be refused');
}

/** The message of the CelCompileError `expr` fails to compile with; throws when it compiles or fails some other way. */
export function celCompileError(expr: string, direction: PolicyDirection = 'inbound'): string {
  try {
    compileExpression(direction, expr);
  } catch (err) {
    if (err instanceof CelCompileError) return err.message;
    throw err;
  }
  throw new Error(`expected ${expr} not to compile`);
}

/** A policy of one rule (no expressions) with one action, in `dir`. */
export const oneAction = (action: unknown, dir = 'inbound') => ({ [dir]: [{ actions: [action] }] });
