import { createHash } from 'node:crypto';

/**
 * Bucket keys. The caller's key is built from request values (host, client IP, header values, up
 * to ten of them) and may be long; it is reduced to a SHA-1 digest (27 base64url characters) so
 * Redis keys and in-memory entries have a bounded size whatever the client sends. Collisions
 * are of no practical concern (and not exploitable for more than sharing someone's bucket).
 */
export function digestKey(key: string): string {
  return createHash('sha1').update(key).digest('base64url');
}

/** Which structure a bucket keeps in Redis (script.ts): the exact sliding log, or the two-counter estimate. */
export type BucketMode = 'log' | 'counter';

/**
 * The Redis key of one bucket: `warren:rl:<serverId>:<windowSeconds>:<digest>` for the counter
 * (a hash), `warren:rl:<serverId>:<windowSeconds>:L:<digest>` for the exact log (a list). The
 * server id scopes capacity to one ingress server (its processes share keys, other servers never
 * do); the window length is part of the key because the window index depends on it; the mode is,
 * because the two structures have different Redis types, so a capacity change across the exact
 * threshold moves a bucket to a fresh key instead of meeting WRONGTYPE. Read from the right, a
 * key is unambiguous: the digest and the mode mark never contain ':', and the segment before the
 * digest is either all digits (the window: counter) or `L` (log, preceded by the window), so keys
 * of different server ids or modes cannot collide. Counter keys are the ones of the versions
 * before the log existed, so their buckets carry over an upgrade.
 */
export function redisKey(serverId: string, windowSeconds: number, digest: string, mode: BucketMode): string {
  return mode === 'log' ? `warren:rl:${serverId}:${windowSeconds}:L:${digest}` : `warren:rl:${serverId}:${windowSeconds}:${digest}`;
}

/** The SCAN pattern matching every key of one server, of both modes (tests and cleanup). */
export function redisKeyPattern(serverId: string): string {
  return `warren:rl:${serverId.replace(/[*?[\]\\]/g, '\\$&')}:*`;
}
