import type { DpRoute } from '@warren/shared';
import type { Outcome, RequestState } from '../pipeline/types.js';
import { errorAnswer } from '../http/error-page.js';

/** Helpers shared by the route-module stages. */

/** A route module's stored form when it is configured and not disabled (`enabled` defaults to true), else null. */
export function enabledModule<T extends object>(route: DpRoute, name: string): T | null {
  const m = route.modules[name];
  if (!m || typeof m !== 'object') return null;
  if ((m as { enabled?: unknown }).enabled === false) return null;
  return m as T;
}

/** The route modules' refusals: ERR_WARREN_71xx in the shared error table. */
export type ModuleErrorCode = 7100 | 7101 | 7102 | 7103 | 7104 | 7105 | 7106 | 7107 | 7108 | 7109 | 7112;

/** An error answer in the shape of the ingress's own error pages (http/error-page.ts). */
export function moduleError(s: RequestState | null, code: ModuleErrorCode, detail?: string, headers?: Record<string, string>): NonNullable<Outcome> {
  return errorAnswer(s?.req.headers.accept, code, detail, headers);
}

/** First value of header `name` (lower-case) in raw `[name, value, …]` pairs. */
export function rawHeader(pairs: readonly string[], name: string): string | undefined {
  for (let i = 0; i + 1 < pairs.length; i += 2) if (pairs[i]!.toLowerCase() === name) return pairs[i + 1];
  return undefined;
}

/** Removes every pair whose name is in `names` (lower-case). Edits in place. */
export function removeRawHeaders(pairs: string[], names: ReadonlySet<string>): void {
  let w = 0;
  for (let i = 0; i + 1 < pairs.length; i += 2) {
    if (names.has(pairs[i]!.toLowerCase())) continue;
    pairs[w++] = pairs[i]!;
    pairs[w++] = pairs[i + 1]!;
  }
  pairs.length = w;
}

/** Sets header `name` to a single `value`, replacing every value it had (in the position of the first). Edits in place. */
export function setRawHeader(pairs: string[], name: string, value: string): void {
  const lower = name.toLowerCase();
  let w = 0;
  let set = false;
  for (let i = 0; i + 1 < pairs.length; i += 2) {
    if (pairs[i]!.toLowerCase() === lower) {
      if (set) continue;
      set = true;
      pairs[w++] = pairs[i]!;
      pairs[w++] = value;
      continue;
    }
    pairs[w++] = pairs[i]!;
    pairs[w++] = pairs[i + 1]!;
  }
  pairs.length = w;
  if (!set) pairs.push(name, value);
}

/** A client header as Node parsed it (lower-case name; repeated headers joined with ", "), or undefined. */
export function clientHeader(s: RequestState, name: string): string | undefined {
  const v = s.req.headers[name];
  return Array.isArray(v) ? v.join(', ') : v;
}
