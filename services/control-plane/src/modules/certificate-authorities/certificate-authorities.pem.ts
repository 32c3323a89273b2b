import { X509Certificate } from 'node:crypto';
import { AsnConvert } from '@peculiar/asn1-schema';
import {
  BasicConstraints,
  Certificate,
  ExtendedKeyUsage,
  KeyUsage,
  KeyUsageFlags,
  id_ce_basicConstraints,
  id_ce_extKeyUsage,
  id_ce_keyUsage,
} from '@peculiar/asn1-x509';
import { AppError } from '@warren/shared';

/**
 * Parsing of uploaded CA certificates. `@peculiar/x509` needs a Reflect metadata polyfill that
 * is not installed, so this uses its ASN.1 layer (`@peculiar/asn1-x509`, same vendor) for the
 * fields, and OpenSSL (node:crypto) as a second, strict DER parser that refuses garbage.
 */

export const MAX_CA_PEM_BYTES = 64 * 1024;

const id_at_commonName = '2.5.4.3';

export interface ParsedCa {
  /** Canonical PEM: the one block, base64 in 64-column lines, exactly one trailing "\n". */
  pem: string;
  subjectCommonName: string;
  notBefore: Date;
  notAfter: Date;
  keyUsages: string[];
  extendedKeyUsages: string[];
}

/** Key usage bits in RFC 5280 order, with ngrok's names. */
const KEY_USAGES: [KeyUsageFlags, string][] = [
  [KeyUsageFlags.digitalSignature, 'digital_signature'],
  [KeyUsageFlags.nonRepudiation, 'content_commitment'],
  [KeyUsageFlags.keyEncipherment, 'key_encipherment'],
  [KeyUsageFlags.dataEncipherment, 'data_encipherment'],
  [KeyUsageFlags.keyAgreement, 'key_agreement'],
  [KeyUsageFlags.keyCertSign, 'cert_sign'],
  [KeyUsageFlags.cRLSign, 'crl_sign'],
  [KeyUsageFlags.encipherOnly, 'encipher_only'],
  [KeyUsageFlags.decipherOnly, 'decipher_only'],
];

/** Extended key usages with ngrok's names; any other purpose is returned as its dotted OID. */
const EXTENDED_KEY_USAGES: Record<string, string> = {
  '1.3.6.1.5.5.7.3.1': 'server_auth',
  '1.3.6.1.5.5.7.3.2': 'client_auth',
  '1.3.6.1.5.5.7.3.3': 'code_signing',
  '1.3.6.1.5.5.7.3.4': 'email_protection',
  '1.3.6.1.5.5.7.3.8': 'time_stamping',
  '1.3.6.1.5.5.7.3.9': 'ocsp_signing',
};

const BLOCK_RE = /-----BEGIN ([A-Z0-9 ]+)-----([\s\S]*?)-----END ([A-Z0-9 ]+)-----/g;

/** Total length of the outer DER SEQUENCE from its header, or undefined when malformed. */
function outerDerLength(b: Buffer): number | undefined {
  if (b.length < 2 || b[0] !== 0x30) return undefined;
  const first = b[1]!;
  if (first < 0x80) return 2 + first;
  const n = first & 0x7f;
  if (n === 0 || n > 4 || b.length < 2 + n) return undefined;
  let len = 0;
  for (let i = 0; i < n; i++) len = len * 256 + b[2 + i]!;
  return 2 + n + len;
}

function invalid(msg: string): AppError {
  return new AppError(6200, `ca_pem: ${msg}`, { field: 'ca_pem' });
}

/** Parses one PEM `CERTIFICATE` block that must carry a CA basic constraint (400 6200/6201). */
export function parseCaPem(input: string): ParsedCa {
  const blocks = [...input.matchAll(BLOCK_RE)];
  if (blocks.length === 0) throw invalid('expected one PEM block "-----BEGIN CERTIFICATE-----"');
  if (blocks.length > 1) throw invalid(`expected exactly one PEM block, got ${blocks.length}`);
  const block = blocks[0]!;
  const outside = input.slice(0, block.index) + input.slice(block.index + block[0].length);
  if (outside.trim() !== '') throw invalid('unexpected text outside the PEM block');
  if (block[1] !== 'CERTIFICATE' || block[3] !== 'CERTIFICATE') throw invalid(`expected a CERTIFICATE block, got ${JSON.stringify(block[1])}`);
  const b64 = block[2]!.replace(/\s+/g, '');
  if (b64 === '' || !/^[A-Za-z0-9+/]+={0,2}$/.test(b64) || b64.length % 4 !== 0) throw invalid('the PEM block is not valid base64');
  const der = Buffer.from(b64, 'base64');
  if (outerDerLength(der) !== der.length) throw invalid('the PEM block is not a valid X.509 certificate (bad length or trailing data)');

  try {
    new X509Certificate(der);
  } catch {
    throw invalid('the PEM block is not a valid X.509 certificate');
  }
  let cert: Certificate;
  try {
    cert = AsnConvert.parse(der, Certificate);
  } catch {
    throw invalid('the PEM block is not a valid X.509 certificate');
  }
  const tbs = cert.tbsCertificate;

  let isCa = false;
  let keyUsages: string[] = [];
  let extendedKeyUsages: string[] = [];
  try {
    for (const ext of tbs.extensions ?? []) {
      if (ext.extnID === id_ce_basicConstraints) isCa = AsnConvert.parse(ext.extnValue, BasicConstraints).cA === true;
      else if (ext.extnID === id_ce_keyUsage) {
        const bits = AsnConvert.parse(ext.extnValue, KeyUsage).toNumber();
        keyUsages = KEY_USAGES.filter(([flag]) => (bits & flag) !== 0).map(([, name]) => name);
      } else if (ext.extnID === id_ce_extKeyUsage) {
        extendedKeyUsages = [...AsnConvert.parse(ext.extnValue, ExtendedKeyUsage)].map((oid) => EXTENDED_KEY_USAGES[oid] ?? oid);
      }
    }
  } catch {
    throw invalid('the certificate has a malformed extension');
  }
  if (!isCa) throw new AppError(6201, 'ca_pem: the certificate is not a certificate authority (no basic constraint CA:TRUE)', { field: 'ca_pem' });

  let subjectCommonName = '';
  for (const rdn of tbs.subject) for (const atv of rdn) if (atv.type === id_at_commonName && !subjectCommonName) subjectCommonName = atv.value.toString();

  const lines = der.toString('base64').match(/.{1,64}/g) ?? [];
  return {
    pem: `-----BEGIN CERTIFICATE-----\n${lines.join('\n')}\n-----END CERTIFICATE-----\n`,
    subjectCommonName,
    notBefore: tbs.validity.notBefore.getTime(),
    notAfter: tbs.validity.notAfter.getTime(),
    keyUsages,
    extendedKeyUsages,
  };
}
