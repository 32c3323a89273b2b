import type { RouteStage, StageFactory } from '../pipeline/types.js';
import { MAX_USER_AGENT_TESTED, compileUserAgentPattern as compileSharedPattern } from '@warren/shared';
import { enabledModule, moduleError } from './common.js';

/**
 * `user_agent_filter`: `allow` and `deny` lists of regular expressions, each matched anywhere in
 * the `User-Agent` (RE2 `MatchString` semantics; an absent header is the empty string). A UA
 * matching a deny pattern is refused; when there are allow patterns, a UA matching none of them
 * is refused; otherwise it passes. Refusals: 403, 7101.
 *
 * Patterns use the control plane's dialect (control-plane user-agent.ts): RE2 syntax run as
 * JavaScript RegExps, a leading flag group such as `(?i)` becoming RegExp flags. They are
 * compiled once per config; one that does not compile refuses the config.
 */

/** A pattern as a RegExp; one the control plane would refuse refuses this route (fail closed). */
export function compileUserAgentPattern(pattern: string): RegExp {
  const r = compileSharedPattern(pattern);
  if (typeof r === 'string') throw new Error(`user_agent_filter: ${JSON.stringify(pattern.slice(0, 64))} is not a valid pattern: ${r}`);
  return r;
}

interface UserAgentFilterModule {
  allow?: string[] | null;
  deny?: string[] | null;
}

export const userAgentFilterStage: StageFactory = (route): RouteStage | null => {
  const m = enabledModule<UserAgentFilterModule>(route, 'user_agent_filter');
  if (!m) return null;
  const allow = (m.allow ?? []).map(compileUserAgentPattern);
  const deny = (m.deny ?? []).map(compileUserAgentPattern);
  if (allow.length === 0 && deny.length === 0) return null;
  return {
    name: 'user_agent_filter',
    onRequest: (s) => {
      const full = s.req.headers['user-agent'] ?? '';
      const h = full.length > MAX_USER_AGENT_TESTED ? full.slice(0, MAX_USER_AGENT_TESTED) : full;
      if (deny.some((re) => re.test(h))) return moduleError(s, 7101);
      if (allow.length > 0 && !allow.some((re) => re.test(h))) return moduleError(s, 7101);
      return null;
    },
  };
};
