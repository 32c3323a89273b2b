import { X509Certificate, createPrivateKey, generateKeyPair, randomBytes, sign } from 'node:crypto';
import { promisify } from 'node:util';
import { AsnConvert, OctetString } from '@peculiar/asn1-schema';
import {
  AlgorithmIdentifier,
  AttributeTypeAndValue,
  AttributeValue,
  BasicConstraints,
  Certificate,
  Extension,
  Extensions,
  KeyUsage,
  KeyUsageFlags,
  Name,
  RelativeDistinguishedName,
  SubjectPublicKeyInfo,
  TBSCertificate,
  Validity,
  Version,
  id_ce_basicConstraints,
  id_ce_keyUsage,
  id_ce_subjectAltName,
  id_ce_extKeyUsage,
  id_kp_serverAuth,
  id_kp_clientAuth,
  ExtendedKeyUsage,
  GeneralName,
  SubjectAlternativeName,
} from '@peculiar/asn1-x509';

/**
 * Self-signed X.509 certificates built with node:crypto keys and the ASN.1 layer of
 * `@peculiar/x509` (`@peculiar/asn1-x509`; the high-level `@peculiar/x509` API needs a
 * Reflect metadata polyfill that is not installed). RSA 2048 with SHA-256, the algorithm every
 * SAML IdP accepts for request signatures.
 */

const generateKeyPairAsync = promisify(generateKeyPair);
const SHA256_WITH_RSA = '1.2.840.113549.1.1.11';
const ECDSA_WITH_SHA256 = '1.2.840.10045.4.3.2';
const id_at_commonName = '2.5.4.3';

export interface SelfSigned {
  certificatePem: string;
  /** PKCS#8 PEM of the private key. */
  privateKeyPem: string;
}

function pem(label: string, der: Buffer): string {
  const b64 = der.toString('base64').replace(/(.{64})/g, '$1\n').replace(/\n$/, '');
  return `-----BEGIN ${label}-----\n${b64}\n-----END ${label}-----\n`;
}

function name(commonName: string): Name {
  return new Name([new RelativeDistinguishedName([new AttributeTypeAndValue({ type: id_at_commonName, value: new AttributeValue({ utf8String: commonName }) })])]);
}

/**
 * 16 random bytes for a serial number that is a positive, minimal DER INTEGER: a first byte of
 * 0x00 (1 in 128 when only the sign bit was cleared) makes a non-minimal INTEGER that X.509
 * parsers refuse, so the top two bits are fixed to 01.
 */
export function randomSerial(): Buffer {
  const serial = randomBytes(16);
  serial[0] = (serial[0]! & 0x3f) | 0x40;
  return serial;
}

export interface CertificateOptions {
  commonName: string;
  days: number;
  /** A CA certificate (basicConstraints CA:TRUE, keyCertSign). */
  ca?: boolean;
  /** Signs with this CA instead of self-signing. */
  issuer?: SelfSigned;
  /** subjectAltName entries; a leaf with any gets extendedKeyUsage serverAuth + clientAuth. */
  dnsNames?: string[];
  ipAddresses?: string[];
  /** `rsa` (2048, the default; what every SAML IdP accepts) or `ec` (P-256, fast TLS handshakes). */
  keyType?: 'rsa' | 'ec';
}

/**
 * A new key pair and a certificate for it, valid from a minute ago for `days`: self-signed, or
 * signed by `issuer` when given (a local CA for the ingress and agent TLS of `npm start` and the
 * tests).
 */
export async function createCertificate(opts: CertificateOptions): Promise<SelfSigned> {
  const ec = opts.keyType === 'ec';
  const { publicKey, privateKey } = ec
    ? await generateKeyPairAsync('ec', { namedCurve: 'P-256' })
    : await generateKeyPairAsync('rsa', { modulusLength: 2048 });
  const issuerKey = opts.issuer ? createPrivateKey(opts.issuer.privateKeyPem) : privateKey;
  const issuerName = opts.issuer ? AsnConvert.parse(new X509Certificate(opts.issuer.certificatePem).raw, Certificate).tbsCertificate.subject : name(opts.commonName);
  const issuerEc = issuerKey.asymmetricKeyType === 'ec';
  const spki = AsnConvert.parse(publicKey.export({ type: 'spki', format: 'der' }), SubjectPublicKeyInfo);
  const alg = issuerEc ? new AlgorithmIdentifier({ algorithm: ECDSA_WITH_SHA256 }) : new AlgorithmIdentifier({ algorithm: SHA256_WITH_RSA, parameters: null });
  const now = Date.now();
  const usage = opts.ca
    ? KeyUsageFlags.keyCertSign | KeyUsageFlags.cRLSign | KeyUsageFlags.digitalSignature
    : KeyUsageFlags.digitalSignature | (ec ? 0 : KeyUsageFlags.keyEncipherment);
  const extensions = [
    new Extension({ extnID: id_ce_basicConstraints, critical: true, extnValue: new OctetString(AsnConvert.serialize(new BasicConstraints({ cA: !!opts.ca }))) }),
    new Extension({ extnID: id_ce_keyUsage, critical: true, extnValue: new OctetString(AsnConvert.serialize(new KeyUsage(usage))) }),
  ];
  const san = [...(opts.dnsNames ?? []).map((d) => new GeneralName({ dNSName: d })), ...(opts.ipAddresses ?? []).map((ip) => new GeneralName({ iPAddress: ip }))];
  if (san.length > 0) {
    extensions.push(new Extension({ extnID: id_ce_subjectAltName, critical: false, extnValue: new OctetString(AsnConvert.serialize(new SubjectAlternativeName(san))) }));
    extensions.push(new Extension({ extnID: id_ce_extKeyUsage, critical: false, extnValue: new OctetString(AsnConvert.serialize(new ExtendedKeyUsage([id_kp_serverAuth, id_kp_clientAuth]))) }));
  }
  const tbs = new TBSCertificate({
    version: Version.v3,
    serialNumber: new Uint8Array(randomSerial()).buffer,
    signature: alg,
    issuer: issuerName,
    validity: new Validity({ notBefore: new Date(now - 60_000), notAfter: new Date(now + opts.days * 86_400_000) }),
    subject: name(opts.commonName),
    subjectPublicKeyInfo: spki,
    extensions: new Extensions(extensions),
  });
  const tbsDer = Buffer.from(AsnConvert.serialize(tbs));
  const signature = sign('sha256', tbsDer, issuerKey);
  const cert = new Certificate({ tbsCertificate: tbs, signatureAlgorithm: alg, signatureValue: new Uint8Array(signature).buffer });
  return {
    certificatePem: pem('CERTIFICATE', Buffer.from(AsnConvert.serialize(cert))),
    privateKeyPem: privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(),
  };
}

/** A new key pair and a self-signed certificate for it, valid from now for `days`. */
export function createSelfSignedCertificate(opts: { commonName: string; days: number; ca?: boolean }): Promise<SelfSigned> {
  return createCertificate(opts);
}
