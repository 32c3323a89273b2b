import { createHash, randomBytes } from 'node:crypto';

/** API key tokens start with this; agent authtokens with AUTHTOKEN_PREFIX. */
export const API_KEY_PREFIX = 'wrn_api_';
export const AUTHTOKEN_PREFIX = 'wrn_agt_';

const BASE62 = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';

/** 43 base62 characters ≈ 256 bits from the CSPRNG. */
function randomBase62(n = 43): string {
  const bytes = randomBytes(n * 2);
  let out = '';
  for (let i = 0; i < bytes.length && out.length < n; i++) {
    const b = bytes[i]!;
    if (b < 248) out += BASE62[b % 62]; // 248 = 62*4: rejection sampling keeps it unbiased
  }
  return out.length === n ? out : out + randomBase62(n - out.length);
}

export function newApiKeyToken(): string {
  return API_KEY_PREFIX + randomBase62();
}

export function newAuthtoken(): string {
  return AUTHTOKEN_PREFIX + randomBase62();
}

/**
 * Tokens carry 256 random bits, so a plain SHA-256 is a safe, fast at-rest form: there is no
 * low-entropy secret for a slow hash to protect, and lookups stay one indexed equality.
 */
export function hashToken(token: string): string {
  return createHash('sha256').update(token).digest('hex');
}
