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

/**
 * The Redis key of one bucket: `warren:rl:<serverId>:<windowSeconds>:<digest>`. The server id
 * scopes capacity to one ingress server (its processes share keys, other servers never do); the
 * window length is part of the key because the window index depends on it. The last two
 * segments never contain ':', so keys of different server ids cannot collide.
 */
export function redisKey(serverId: string, windowSeconds: number, digest: string): string {
  return `warren:rl:${serverId}:${windowSeconds}:${digest}`;
}

/** The SCAN pattern matching every key of one server (tests and cleanup). */
export function redisKeyPattern(serverId: string): string {
  return `warren:rl:${serverId.replace(/[*?[\]\\]/g, '\\$&')}:*`;
}
