import { AppError } from '@warren/shared';
import type { AuthContext } from '../http/context.js';

/**
 * Per-account management API limit over a rolling 60 s (wire-conventions.md §13), as a
 * two-bucket sliding-window counter kept in this process. `limit` 0 turns it off.
 * Each replica counts on its own; with N replicas an account may reach N × limit.
 */
export function createAccountRateLimiter(limit: number, windowMs = 60_000, maxAccounts = 100_000) {
  const state = new Map<string, { window: number; prev: number; cur: number }>();
  return function check(auth: AuthContext): void {
    if (limit <= 0) return;
    const now = Date.now();
    const window = Math.floor(now / windowMs);
    let s = state.get(auth.accountId);
    if (!s) {
      if (state.size >= maxAccounts) state.clear();
      s = { window, prev: 0, cur: 0 };
      state.set(auth.accountId, s);
    }
    if (s.window !== window) {
      s.prev = s.window === window - 1 ? s.cur : 0;
      s.cur = 0;
      s.window = window;
    }
    const elapsed = (now % windowMs) / windowMs;
    const estimate = s.prev * (1 - elapsed) + s.cur;
    if (estimate >= limit) {
      // Earliest time the weighted estimate drops below the limit, rounded up; never early.
      const waitMs = s.prev > 0 && s.cur < limit ? windowMs * (1 - (limit - 1 - s.cur) / s.prev) - (now % windowMs) : windowMs - (now % windowMs);
      const retry = Math.max(1, Math.ceil(waitMs / 1000));
      throw new AppError(8000, `management API rate limit of ${limit} requests per minute exceeded; retry in ${retry} s`, { headers: { 'Retry-After': String(retry) } });
    }
    s.cur++;
  };
}
