/**
 * User agent filter patterns. ngrok documents them as RE2 regular expressions; the ingress runs
 * them as JavaScript RegExps. A pattern is accepted when it compiles as a JS RegExp after its
 * leading RE2 flag group (`(?i)`, `(?s)`, `(?m)`, `(?is)` …) is turned into RegExp flags, and it
 * uses none of the JS-only constructs RE2 refuses (lookaround, backreferences). The ingress runs
 * them on the request path of a shared process, so a quantified group that itself contains a
 * quantifier (`(a+)+`, `(\w*x)*`: exponential backtracking) is refused too; and the ingress
 * tests at most the first MAX_USER_AGENT_TESTED characters of a User-Agent.
 */

/** How much of a User-Agent the ingress matches against the patterns. */
export const MAX_USER_AGENT_TESTED = 512;

/** A group with a quantifier inside, itself quantified: nested quantifiers backtrack exponentially. */
const NESTED_QUANTIFIER = /\((?:[^()\\]|\\.)*(?:[+*]|\{\d+,?\d*\})(?:[^()\\]|\\.)*\)(?:[+*]|\{\d+,?\d*\})/;

const LEADING_FLAGS_RE = /^\(\?([ims]+)\)/;

/** The RegExp a pattern stands for, or a reason it is refused. */
export function compileUserAgentPattern(pattern: string): RegExp | string {
  let source = pattern;
  let flags = '';
  const m = LEADING_FLAGS_RE.exec(source);
  if (m) {
    flags = [...new Set(m[1]!)].join('');
    source = source.slice(m[0].length);
  }
  if (/\(\?<?[=!]/.test(source)) return 'lookaround assertions are not supported (RE2 syntax)';
  if (/\\[1-9]|\\k</.test(source)) return 'backreferences are not supported (RE2 syntax)';
  if (NESTED_QUANTIFIER.test(source)) return 'a quantified group containing a quantifier (e.g. (a+)+) is not supported: it can backtrack exponentially';
  try {
    return new RegExp(source, flags);
  } catch (err) {
    return `not a valid regular expression: ${(err as Error).message.replace(/^Invalid regular expression: /, '').slice(0, 200)}`;
  }
}

/** `undefined` when the pattern is accepted, else the reason. */
export function checkUserAgentPattern(pattern: string): string | undefined {
  const r = compileUserAgentPattern(pattern);
  return typeof r === 'string' ? r : undefined;
}
