import { X509Certificate } from 'node:crypto';
import type { DetailedPeerCertificate, TLSSocket } from 'node:tls';
import type { DataPlaneConfig, DpEdge } from '@warren/shared';
import type { RequestState, RouteStage } from '../pipeline/types.js';
import { moduleError } from './common.js';

/**
 * Edge `mutual_tls`: every request must come over TLS with a client certificate chaining to one
 * of the edge's certificate authorities (`config.certificateAuthorities`, same account). The
 * chain is the one the client presented (`getPeerCertificate(true)`): each link's signature
 * (X509Certificate.verify) and issuer/subject match (checkIssued), each intermediate a CA, every
 * certificate — the trusted CA too — within its validity dates, the leaf usable for client auth
 * when it lists extended key usages, at most MAX_CHAIN presented certificates. No revocation
 * checks. A missing or invalid certificate answers 403 (7104); an edge whose CAs are all gone
 * refuses everything. The verdict is kept per TLS connection (the certificate cannot change on
 * it), per config version.
 *
 * A resumed TLS session (a ticket or session id, as browsers, curl and Go clients use) carries no
 * certificates: OpenSSL keeps only the leaf, so a leaf issued by an intermediate would no longer
 * chain. The intermediates of chains verified in full handshakes are therefore remembered per
 * set of CAs ({@link rememberPath}), and a resumed session's lone leaf is verified again, with
 * every check above, over a remembered path whose first certificate issued it. Sessions are
 * resumed only on the process that issued them (its own ticket keys), which saw the full chain.
 *
 * The HTTPS server must request certificates without rejecting: `requestCert: true,
 * rejectUnauthorized: false` (`mutualTlsCaPems` gives the CA names to advertise).
 */

export const MAX_CHAIN = 8;
const CLIENT_AUTH = '1.3.6.1.5.5.7.3.2';
const ANY_EKU = '2.5.29.37.0';

function validAt(c: X509Certificate, now: number): boolean {
  return Date.parse(c.validFrom) <= now && now <= Date.parse(c.validTo);
}

/** The PEMs of the edge's certificate authorities (for the TLS context's `ca`, the names it advertises). */
export function mutualTlsCaPems(edge: DpEdge, config: DataPlaneConfig): string[] {
  const out: string[] = [];
  for (const id of edge.mutualTls?.certificateAuthorityIds ?? []) {
    const ca = config.certificateAuthorities.get(id);
    if (ca && ca.accountId === edge.accountId) out.push(ca.caPem);
  }
  return out;
}

/** The certificates the client presented, leaf first, as X509Certificates. */
export function presentedChain(peer: DetailedPeerCertificate): X509Certificate[] {
  const chain: X509Certificate[] = [];
  let c: DetailedPeerCertificate | undefined = peer;
  while (c && c.raw && chain.length < MAX_CHAIN + 1) {
    chain.push(new X509Certificate(c.raw));
    const next: DetailedPeerCertificate | undefined = c.issuerCertificate;
    if (!next || next === c || (next.raw && c.raw.equals(next.raw))) break;
    c = next;
  }
  return chain;
}

/** Intermediate paths (issuer of the leaf first) of verified chains, by CA set; bounded, oldest out. */
const learnedPaths = new Map<string, X509Certificate[][]>();
const MAX_CA_SETS = 256;
const MAX_PATHS_PER_SET = 16;

/** Remembers the intermediates of a chain verified in a full handshake (a leaf signed by a CA directly needs none). */
function rememberPath(caKey: string, chain: X509Certificate[]): void {
  if (chain.length < 2) return;
  const path = chain.slice(1);
  let paths = learnedPaths.get(caKey);
  if (paths?.some((p) => p.length === path.length && p.every((c, i) => c.fingerprint256 === path[i]!.fingerprint256))) return;
  if (!paths) {
    if (learnedPaths.size >= MAX_CA_SETS) learnedPaths.delete(learnedPaths.keys().next().value!);
    learnedPaths.set(caKey, (paths = []));
  }
  if (paths.length >= MAX_PATHS_PER_SET) paths.shift();
  paths.push(path);
}

/** A resumed session's lone leaf completed with a remembered path that verifies, or null. */
function resumedChain(caKey: string, leaf: X509Certificate, cas: readonly X509Certificate[], now: number): X509Certificate[] | null {
  for (const path of learnedPaths.get(caKey) ?? []) {
    if (!leaf.checkIssued(path[0]!)) continue;
    const chain = [leaf, ...path];
    if (verifyClientChain(chain, cas, now) === null) return chain;
  }
  return null;
}

/** null when `chain` (leaf first) chains to one of `cas` and is valid at `now`, else the reason. */
export function verifyClientChain(chain: X509Certificate[], cas: readonly X509Certificate[], now: number): string | null {
  const leaf = chain[0];
  if (!leaf) return 'no client certificate was presented';
  if (chain.length > MAX_CHAIN) return 'the client certificate chain is too long';
  const eku = leaf.keyUsage;
  if (eku && eku.length > 0 && !eku.includes(CLIENT_AUTH) && !eku.includes(ANY_EKU)) return 'the client certificate is not for client authentication';
  for (let i = 0; i < chain.length; i++) {
    const c = chain[i]!;
    if (!validAt(c, now)) return i === 0 ? 'the client certificate is expired or not yet valid' : 'a certificate of the client chain is expired or not yet valid';
    for (const ca of cas) {
      if (c.fingerprint256 === ca.fingerprint256) return validAt(ca, now) ? null : 'the certificate authority is expired';
      if (c.checkIssued(ca) && c.verify(ca.publicKey)) return validAt(ca, now) ? null : 'the certificate authority is expired';
    }
    const up = chain[i + 1];
    if (!up) break;
    if (!up.ca || !c.checkIssued(up) || !c.verify(up.publicKey)) return 'the client certificate chain is broken';
  }
  return 'the client certificate is not signed by a trusted certificate authority';
}

/** The edge-level stage (runs before the route's stages), or null when mutual TLS is off for the edge. */
export function mutualTlsStage(edge: DpEdge, config: DataPlaneConfig, now: () => number = Date.now): RouteStage | null {
  if (!edge.mutualTls || !edge.mutualTls.enabled) return null;
  const cas: X509Certificate[] = [];
  for (const pem of mutualTlsCaPems(edge, config)) {
    try {
      cas.push(new X509Certificate(pem));
    } catch {
      /* an unparsable CA trusts nothing */
    }
  }
  const caKey = cas.map((c) => c.fingerprint256).sort().join(',');
  /** Per TLS connection: until when its certificate was found valid (ms); failures are not kept. */
  const validUntil = new WeakMap<object, number>();
  return {
    name: 'mutual_tls',
    onRequest(s: RequestState) {
      const socket = s.req.socket as Partial<TLSSocket>;
      if (s.scheme !== 'https' || typeof socket.getPeerCertificate !== 'function') return moduleError(s, 7104, 'this edge requires TLS with a client certificate');
      const t = now();
      const until = validUntil.get(socket);
      if (until !== undefined && t <= until) return null;
      let verdict: string | null;
      let chain: X509Certificate[] = [];
      try {
        const peer = socket.getPeerCertificate(true);
        if (!peer || !peer.raw) verdict = 'no client certificate was presented';
        else {
          chain = presentedChain(peer);
          verdict = verifyClientChain(chain, cas, t);
          if (verdict === null) rememberPath(caKey, chain);
          else if (chain.length === 1 && socket.isSessionReused?.() === true) {
            const completed = resumedChain(caKey, chain[0]!, cas, t);
            if (completed) {
              chain = completed;
              verdict = null;
            }
          }
        }
      } catch {
        verdict = 'the client certificate could not be parsed';
      }
      if (verdict !== null) return moduleError(s, 7104, `a valid client certificate is required: ${verdict}`);
      validUntil.set(socket, Math.min(...chain.map((c) => Date.parse(c.validTo))));
      return null;
    },
  };
}
