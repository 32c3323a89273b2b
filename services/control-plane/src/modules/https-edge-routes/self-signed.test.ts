import { X509Certificate } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { createSelfSignedCertificate, randomSerial } from './self-signed.js';

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
});
