/**
 * User agent filter patterns. ngrok documents them as RE2 regular expressions; the ingress runs
 * them as JavaScript RegExps. A pattern is accepted when it compiles as a JS RegExp after its
 * leading RE2 flag group (`(?i)`, `(?s)`, `(?m)`, `(?is)` …) is turned into RegExp flags, and it
 * uses none of the JS-only constructs RE2 refuses (lookaround, backreferences), which also keeps
 * patterns free of the backtracking blow-ups those allow.
 */

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
