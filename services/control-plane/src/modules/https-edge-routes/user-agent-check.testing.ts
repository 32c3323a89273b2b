/** Test helpers of the user_agent_filter cost check (user-agent-check.ts). */

const BOTS = ['googlebot', 'bingbot', 'slurp', 'duckduckbot', 'baiduspider', 'yandexbot', 'sogou', 'exabot', 'facebot', 'ia_archiver', 'ahrefsbot', 'semrushbot', 'mj12bot', 'dotbot', 'petalbot', 'bytespider', 'gptbot', 'ccbot', 'claudebot', 'amazonbot', 'applebot', 'seznambot'];

/** A case-insensitive alternation of bot names of at most 250 characters, each name suffixed with `tag`. */
export function botAlternation(tag: string): string {
  return `(?i)(${BOTS.map((n) => `${n}${tag}`).join('|')})`.slice(0, 250).replace(/\|[^|]*$/, ')');
}

/**
 * A filter built to be costly to check: 32 alternations in each list (or in allow only, half the
 * work), each cheap alone, too costly together (each list is refused, naming the list, after its
 * whole exploration budget). A distinct `tag` gives a filter no cache has seen.
 */
export function hostileUserAgentFilter(tag: string, lists: 'both' | 'allow' = 'both'): { allow: string[]; deny: string[] } {
  return {
    allow: Array.from({ length: 32 }, (_, i) => botAlternation(`${tag}a${i}`)),
    deny: lists === 'both' ? Array.from({ length: 32 }, (_, i) => botAlternation(`${tag}d${i}`)) : [],
  };
}
