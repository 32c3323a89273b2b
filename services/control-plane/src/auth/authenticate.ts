import { AppError } from '@warren/shared';
import type { Queryable } from '../db/pool.js';
import type { AuthContext } from '../http/context.js';
import { API_KEY_PREFIX, AUTHTOKEN_PREFIX, hashToken } from './tokens.js';

export interface Authenticator {
  /** Resolves an `Authorization` header to the caller, or throws 401/403. */
  authenticate(header: string | undefined): Promise<AuthContext>;
  /** Drops cached entries of a deleted key on this replica at once. */
  forgetKey(apiKeyId: string): void;
}

interface CacheEntry {
  ctx: AuthContext | null;
  disabled: boolean;
  expires: number;
}

/**
 * API-key authentication with a short positive/negative cache (keyed by token hash), so the hot
 * path does not pay a Postgres round trip per request. A key deleted on this replica stops at
 * once; on other replicas within `ttlMs` (default 2 s).
 */
export function createAuthenticator(db: Queryable, ttlMs = 2000, maxEntries = 10_000): Authenticator {
  const cache = new Map<string, CacheEntry>();

  async function lookup(hash: string): Promise<CacheEntry> {
    const now = Date.now();
    const hit = cache.get(hash);
    if (hit && hit.expires > now) return hit;
    const { rows } = await db.query<{ id: string; account_id: string; description: string; disabled: boolean }>(
      `SELECT k.id, k.account_id, k.description, a.disabled
         FROM api_keys k JOIN accounts a ON a.id = k.account_id
        WHERE k.token_hash = $1`,
      [hash],
    );
    const row = rows[0];
    const entry: CacheEntry = row
      ? { ctx: { accountId: row.account_id, apiKeyId: row.id, apiKeyDescription: row.description }, disabled: row.disabled, expires: now + ttlMs }
      : { ctx: null, disabled: false, expires: now + ttlMs };
    if (cache.size >= maxEntries) cache.clear(); // bounded: a flood of bad tokens cannot grow memory
    cache.set(hash, entry);
    return entry;
  }

  return {
    async authenticate(header) {
      if (!header) throw new AppError(1000);
      const m = /^bearer\s+(\S+)\s*$/i.exec(header);
      if (!m) throw new AppError(1001);
      const token = m[1]!;
      if (token.startsWith(AUTHTOKEN_PREFIX)) throw new AppError(1003);
      if (!token.startsWith(API_KEY_PREFIX) || token.length > 128) throw new AppError(1002);
      const entry = await lookup(hashToken(token));
      if (!entry.ctx) throw new AppError(1002);
      if (entry.disabled) throw new AppError(1101);
      return entry.ctx;
    },
    forgetKey(apiKeyId) {
      for (const [k, v] of cache) if (v.ctx?.apiKeyId === apiKeyId) cache.delete(k);
    },
  };
}
