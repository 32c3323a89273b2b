import { randomFillSync } from 'node:crypto';

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

// Random bytes are drawn 4 KiB at a time: one CSPRNG call per ~340 ids instead of one per id
// (an operation id is made for every API request).
const pool = Buffer.alloc(4096);
let poolOffset = pool.length;

function random12(target: Buffer, at: number): void {
  if (poolOffset + 12 > pool.length) {
    randomFillSync(pool);
    poolOffset = 0;
  }
  pool.copy(target, at, poolOffset, poolOffset + 12);
  poolOffset += 12;
}

const BASE62 = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';
/** KSUID epoch: 2014-05-13T16:53:20Z, in seconds. */
const KSUID_EPOCH = 1_400_000_000;

/**
 * Encodes a KSUID: 4 bytes of seconds since the KSUID epoch and a 16-byte payload, as 27
 * base62 characters (zero-padded, so the text sorts like the bytes). Long division over five
 * 32-bit words; no BigInt on the per-request path.
 */
export function encodeKsuid(unixMs: number, payload: Uint8Array): string {
  const words = new Uint32Array(5);
  words[0] = Math.floor(unixMs / 1000) - KSUID_EPOCH;
  for (let i = 0; i < 4; i++) words[i + 1] = ((payload[i * 4]! << 24) | (payload[i * 4 + 1]! << 16) | (payload[i * 4 + 2]! << 8) | payload[i * 4 + 3]!) >>> 0;
  const out = new Array<string>(27);
  for (let pos = 26; pos >= 0; pos--) {
    let rem = 0;
    for (let i = 0; i < 5; i++) {
      const acc = rem * 0x1_0000_0000 + words[i]!; // < 62 * 2^32: exact in a double
      words[i] = Math.floor(acc / 62);
      rem = acc % 62;
    }
    out[pos] = BASE62[rem]!;
  }
  return out.join('');
}

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
  const payload = Buffer.allocUnsafe(16);
  random12(payload, 4);
  payload.writeUInt16BE(now % 1000, 0);
  payload.writeUInt16BE(seq, 2);
  return encodeKsuid(now, payload);
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
