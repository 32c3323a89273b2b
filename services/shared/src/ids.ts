import { randomBytes } from 'node:crypto';
import KSUID from 'ksuid';

/** Id prefixes of every resource (wire-conventions.md §6). */
export const ID_PREFIX = {
  reservedAddr: 'ra',
  tunnelGroupBackend: 'bkdtg',
  certificateAuthority: 'ca',
  httpsEdge: 'edghts',
  httpsEdgeRoute: 'edghtsrt',
  eventDestination: 'ed',
  eventSubscription: 'esb',
  event: 'ev',
  account: 'ac',
  ipPolicy: 'ipp',
  ipPolicyRule: 'ipr',
  tunnel: 'tn',
  tunnelSession: 'ts',
  apiKey: 'ak',
  credential: 'cr',
  endpointConfiguration: 'ec',
  operation: 'op',
} as const;

export type IdPrefix = (typeof ID_PREFIX)[keyof typeof ID_PREFIX];

const KSUID_RE = /^[0-9A-Za-z]{27}$/;

let lastMs = 0;
let seq = 0;

/**
 * A KSUID whose payload starts with the millisecond within the second and a per-millisecond
 * counter, then 12 random bytes: ids from one process sort in creation order even within the
 * same second (plain KSUIDs order randomly there), so "newest first" lists are exact.
 */
function monotonicKsuid(): string {
  let now = Date.now();
  if (now < lastMs) now = lastMs; // clock stepped back: keep order
  if (now === lastMs) seq++;
  else {
    lastMs = now;
    seq = 0;
  }
  if (seq > 0xffff) {
    lastMs = ++now;
    seq = 0;
  }
  const payload = randomBytes(16);
  payload.writeUInt16BE(now % 1000, 0);
  payload.writeUInt16BE(seq, 2);
  return KSUID.fromParts(now, payload).string;
}

/** A new `<prefix>_<27-char base62 KSUID>`; ids sort by creation time. */
export function newId(prefix: IdPrefix): string {
  return `${prefix}_${monotonicKsuid()}`;
}

/** True when `s` is a well-formed id with exactly this prefix. */
export function isId(prefix: IdPrefix, s: unknown): s is string {
  if (typeof s !== 'string' || s.length !== prefix.length + 28) return false;
  return s.startsWith(prefix) && s.charCodeAt(prefix.length) === 95 /* _ */ && KSUID_RE.test(s.slice(prefix.length + 1));
}

/** True when `s` looks like any Warren id (`<letters>_<ksuid>`). */
export function looksLikeId(s: string): boolean {
  const i = s.lastIndexOf('_');
  return i > 0 && /^[a-z]+$/.test(s.slice(0, i)) && KSUID_RE.test(s.slice(i + 1));
}
