import type { SecureVersion } from 'node:tls';
import type { DpEdge } from '@warren/shared';

/**
 * Edge `tls_termination`: the TLS versions an edge accepts. `min_version` `1.3` → TLSv1.3;
 * `1.2`, unset, or a disabled module → TLSv1.2 (the default). For the SNICallback's secure context.
 */
export function edgeSecureContextOptions(edge: DpEdge | null | undefined): { minVersion: SecureVersion } {
  const t = edge?.tlsTermination;
  if (t && t.enabled && t.minVersion === '1.3') return { minVersion: 'TLSv1.3' };
  return { minVersion: 'TLSv1.2' };
}
