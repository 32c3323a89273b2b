import type { RouteStage, StageFactory } from '../pipeline/types.js';
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

const LEADING_FLAGS_RE = /^\(\?([ims]+)\)/;

export function compileUserAgentPattern(pattern: string): RegExp {
  let source = pattern;
  let flags = '';
  const m = LEADING_FLAGS_RE.exec(source);
  if (m) {
    flags = [...new Set(m[1]!)].join('');
    source = source.slice(m[0].length);
  }
  try {
    return new RegExp(source, flags);
  } catch (err) {
    throw new Error(`user_agent_filter: ${JSON.stringify(pattern.slice(0, 64))} is not a valid pattern: ${(err as Error).message}`);
  }
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
      const h = s.req.headers['user-agent'] ?? '';
      if (deny.some((re) => re.test(h))) return moduleError(s, 7101);
      if (allow.length > 0 && !allow.some((re) => re.test(h))) return moduleError(s, 7101);
      return null;
    },
  };
};
