import type { RE2JS } from 're2js';
import type { RouteStage, StageFactory } from '../pipeline/types.js';
import {
  compileUserAgentList as compileSharedList,
  compileUserAgentPattern as compileSharedPattern,
  exploreUserAgentDfa,
  escapesAsReplacement,
  headerText,
  USER_AGENT_FILTER_EXPLORE_STEPS,
  USER_AGENT_FILTER_EXPLORE_WORK,
} from '@warren/shared';
import { enabledModule, moduleError, rawHeader } from './common.js';

/**
 * `user_agent_filter`: `allow` and `deny` lists of RE2 regular expressions, each matched anywhere
 * in the request's User-Agent (Go's `MatchString`; `^` and `$` anchor), with ngrok's rules
 * (https://ngrok.com/docs/http/user-agent-filter/, "Rule Evaluation"):
 *
 * 1. Only the first User-Agent header is checked; a missing one is the empty string.
 * 2. A User-Agent matching any allow rule passes (an allow rule more specific than a deny rule
 *    overrides it: allow `(?i)google-images`, deny `(?i)google`).
 * 3. An empty User-Agent (missing or blank) is refused: ngrok denies requests without one by
 *    default; an allow rule matching the empty string (`^$`) lets them through (rule 2).
 * 4. A User-Agent matching any deny rule is refused.
 * 5. Otherwise it passes when there are deny rules (it failed to match all of them), and is
 *    refused when there are only allow rules (an allow list means "only these").
 *
 * Refusals: 403, ERR_WARREN_7101. Rules 2 and 4 only ask whether any pattern of a list matches,
 * so each list is compiled into one RE2 program, the alternation of its patterns (two when it
 * mixes wide Unicode classes such as `\pL` with other patterns; `compileUserAgentList`, shared
 * user-agent.ts): one pass over the header per list, whatever the number of patterns. Lists are
 * compiled when a config arrives, and kept while configs leave them unchanged. The whole header
 * is matched: RE2 takes time linear in it, and the control plane accepts only lists whose
 * programs cost constant work per character once their DFA is built, and whose DFA is small
 * (`userAgentFilterCostProblems`); Node bounds the header (16 KiB head). A list that does not
 * compile refuses the route.
 */

/** A pattern as an RE2 program; one the control plane would refuse refuses this route (fail closed). */
export function compileUserAgentPattern(pattern: string): RE2JS {
  const r = compileSharedPattern(pattern);
  if (typeof r === 'string') throw new Error(`user_agent_filter: ${JSON.stringify(pattern.slice(0, 64))} is not a valid pattern: ${r}`);
  return r;
}

/** A list as its RE2 programs (usually one; `[]` when empty); a list the control plane would refuse refuses this route (fail closed). */
export function compileUserAgentList(list: 'allow' | 'deny', patterns: readonly string[]): RE2JS[] {
  const r = compileSharedList(patterns);
  if (Array.isArray(r)) return r;
  if (r.index === undefined) throw new Error(`user_agent_filter: ${list}: ${r.message}`);
  throw new Error(`user_agent_filter: ${JSON.stringify(patterns[r.index]!.slice(0, 64))} is not a valid pattern: ${r.message}`);
}

/**
 * Programs compiled for the config being compiled and for the one before, by their patterns:
 * every config version recompiles every route, and a list it did not change keeps its programs,
 * with the DFA states they have built (routes with the same list share them). So only a new or
 * changed list costs its compilation (~1–20 ms for 32 patterns) and the building of its DFA by
 * the first requests. Holds the lists of the last two configs that had any.
 */
let cacheConfig: object | null = null;
let cache = new Map<string, RE2JS[]>();
let previousCache = new Map<string, RE2JS[]>();

function cachedUserAgentList(config: object, list: 'allow' | 'deny', patterns: readonly string[]): RE2JS[] {
  if (patterns.length === 0) return [];
  if (config !== cacheConfig) {
    previousCache = cache;
    cache = new Map();
    cacheConfig = config;
  }
  const key = JSON.stringify(patterns);
  const programs = cache.get(key) ?? previousCache.get(key) ?? provenCheap(list, compileUserAgentList(list, patterns));
  cache.set(key, programs);
  return programs;
}

/**
 * The control plane's cost check, once per new list (then cached above): a list stored before the
 * control plane checked it (or under an older check) could otherwise cost seconds per request on
 * a 16 KiB User-Agent, now that the whole header is matched. Too costly refuses the route.
 */
function provenCheap(list: 'allow' | 'deny', programs: RE2JS[]): RE2JS[] {
  const budget = { steps: USER_AGENT_FILTER_EXPLORE_STEPS, work: USER_AGENT_FILTER_EXPLORE_WORK };
  for (const re of programs) {
    if (exploreUserAgentDfa(re, budget) !== 'cheap') throw new Error(`user_agent_filter: ${list}: the list is too costly to match (stored before the control plane checked it); save it again to see which pattern`);
  }
  return programs;
}

interface UserAgentFilterModule {
  allow?: string[] | null;
  deny?: string[] | null;
}

/** The User-Agent as Go's regexp reads it: the first header's bytes as UTF-8, each byte in no UTF-8 sequence as U+FFFD. */
function firstUserAgent(rawHeaders: readonly string[]): string {
  return escapesAsReplacement(headerText(rawHeader(rawHeaders, 'user-agent') ?? ''));
}

/** Whether `ua` passes the `allow` and `deny` lists, as their programs (rules 2–5 above). */
export function userAgentAllowed(ua: string, allow: readonly RE2JS[], deny: readonly RE2JS[]): boolean {
  if (allow.some((re) => re.test(ua))) return true;
  if (ua === '') return false;
  if (deny.some((re) => re.test(ua))) return false;
  return deny.length > 0;
}

export const userAgentFilterStage: StageFactory = (route, _edge, config): RouteStage | null => {
  const m = enabledModule<UserAgentFilterModule>(route, 'user_agent_filter');
  if (!m) return null;
  const allow = cachedUserAgentList(config, 'allow', m.allow ?? []);
  const deny = cachedUserAgentList(config, 'deny', m.deny ?? []);
  if (allow.length === 0 && deny.length === 0) return null;
  return {
    name: 'user_agent_filter',
    onRequest: (s) => (userAgentAllowed(firstUserAgent(s.req.rawHeaders), allow, deny) ? null : moduleError(s, 7101)),
  };
};
