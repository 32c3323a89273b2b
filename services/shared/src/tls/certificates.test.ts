import { X509Certificate } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { createCertificate, createSelfSignedCertificate, randomSerial } from './certificates.js';

describe('self-signed certificates', () => {
  it('draw serials that are positive, minimal DER integers', () => {
    for (let i = 0; i < 10_000; i++) {
      const first = randomSerial()[0]!;
      expect(first >= 0x40 && first <= 0x7f).toBe(true);
    }
  });

  it('encode a CA certificate node:crypto accepts', async () => {
    const x = new X509Certificate((await createSelfSignedCertificate({ commonName: 'x', days: 1, ca: true })).certificatePem);
    expect(x.ca).toBe(true);
    expect(x.subject).toBe('CN=x');
  });

  it('issue a leaf signed by a CA, with SANs, that verifies against it', async () => {
    const ca = await createCertificate({ commonName: 'Warren test CA', days: 1, ca: true, keyType: 'ec' });
    const leaf = await createCertificate({ commonName: 'localhost', days: 1, issuer: ca, dnsNames: ['localhost'], ipAddresses: ['127.0.0.1', '::1'], keyType: 'ec' });
    const x = new X509Certificate(leaf.certificatePem);
    const caX = new X509Certificate(ca.certificatePem);
    expect(x.verify(caX.publicKey)).toBe(true);
    expect(x.checkIssued(caX)).toBe(true);
    expect(x.checkHost('localhost')).toBe('localhost');
    expect(x.checkIP('127.0.0.1')).toBe('127.0.0.1');
    expect(x.checkIP('::1')).toBe('::1');
    expect(x.ca).toBe(false);
  });
});
