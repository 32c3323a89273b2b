import { describe, expect, it } from 'vitest';
import { edgeSecureContextOptions } from './tls-termination.js';
import { makeEdge } from './testing.js';

describe('tls_termination', () => {
  it('maps min_version to the TLS minimum version', () => {
    expect(edgeSecureContextOptions(makeEdge())).toEqual({ minVersion: 'TLSv1.2' });
    expect(edgeSecureContextOptions(null)).toEqual({ minVersion: 'TLSv1.2' });
    expect(edgeSecureContextOptions(makeEdge({ tlsTermination: { enabled: true, minVersion: '1.2' } }))).toEqual({ minVersion: 'TLSv1.2' });
    expect(edgeSecureContextOptions(makeEdge({ tlsTermination: { enabled: true, minVersion: null } }))).toEqual({ minVersion: 'TLSv1.2' });
    expect(edgeSecureContextOptions(makeEdge({ tlsTermination: { enabled: true, minVersion: '1.3' } }))).toEqual({ minVersion: 'TLSv1.3' });
    expect(edgeSecureContextOptions(makeEdge({ tlsTermination: { enabled: false, minVersion: '1.3' } }))).toEqual({ minVersion: 'TLSv1.2' });
  });
});
