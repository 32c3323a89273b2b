/**
 * The `url-rewrite` and `redirect` actions: validation, the compiled `from` / `to` template and
 * applying it to a URL (the ingress evaluates the CEL and acts on the result:
 * `services/ingress/src/policy/url-actions.ts`). Semantics follow ngrok's:
 * - https://ngrok.com/docs/traffic-policy/actions/url-rewrite/
 * - https://ngrok.com/docs/traffic-policy/actions/redirect/
 *
 * - `from` is an RE2 pattern searched (unanchored) in the whole request URL,
 *   `scheme://host[:port]/path?query`; every non-overlapping match is replaced by `to` (Go's
 *   `ReplaceAllString`: an empty match right after a match is skipped). Omitted, the whole URL
 *   is replaced by `to`. A `from` that matches nothing leaves the URL as it is.
 * - `to` refers to capture groups Go's way: `$1`, `$name` (the longest run of letters, digits and
 *   `_`: `$1x` is the group named `1x`), `${1}`, `$0` (the whole match), and `$$` is a literal
 *   `$`; a `$` before anything else is literal.
 * - Both interpolate CEL with `${expr}`, evaluated before the pattern is searched (as ngrok
 *   does). ngrok interpolates every `${…}`, so its `${1}` is the CEL integer 1; Warren reads a
 *   `${…}` holding only digits, or the name of a capture group of `from`, as a capture reference
 *   instead (the Go spelling, never a useful CEL expression), and anything else as CEL.
 * - What a `${…}` inserts is literal text: in `from` it matches itself (as if quoted, so
 *   `^${req.url.scheme}://${req.url.authority}/x` anchors on the path for any host, and a value
 *   never changes the pattern's structure or groups); in `to` a `$` it holds is not a capture
 *   reference. (ngrok's docs suggest `^${req.url.authority}/x`, which cannot match: the URL
 *   starts with its scheme.)
 * - URLs over `URL_ACTION_LIMITS.urlChars`, results over it, more than `maxMatches` matches and
 *   `${…}` text in `from` over `fromInterpolatedChars` are evaluation errors at run time (the
 *   action does nothing), which bounds each run; `urlTemplateCost` charges that bound to the
 *   policy's cost (`parse.ts` `checkCost`).
 * - redirect also runs in outbound rules (ngrok documents it for `on_http_request` only): there
 *   it replaces the upstream's response.
 *
 * Refused with a 400 where Warren is stricter than ngrok: an RE2 syntax error, a reference to a
 * capture group `from` does not have (Go would insert nothing; write `$$` for a literal `$`), an
 * empty `from`, an empty `to` without `from`, over-long values, a redirect status outside
 * 300–303/307/308, more than 10 redirect headers or a `Location` among them, and url-rewrite in
 * an outbound rule (ngrok runs it in `on_http_request` only).
 */
import { RE2JS } from 're2js';
import { CelCompileError, chargePolicyRegexBudget, closingBrace, compileExpression, parseTemplate, type CelProgram } from './cel.js';
import { at, expectObj, noUnknownKeys, parseHeaderMap, TrafficPolicyError, typeName } from './parse.js';
import { cachedRegex, compileRegex, MAX_REGEX_PATTERN_LENGTH, MAX_REGEX_PROGRAM_SIZE, RegexError, regexCostInfo, type DfaExploreBudget, type RegexRunInfo } from './regex.js';
import type { PolicyDirection, RedirectAction, UrlRewriteAction } from './types.js';

export const URL_ACTION_LIMITS = {
  /** `from` as written, characters. */
  fromChars: MAX_REGEX_PATTERN_LENGTH,
  /** `to` as written, characters. */
  toChars: 4096,
  /**
   * Characters `${…}` may insert into `from` (all its interpolations together): enough for
   * `${req.url.scheme}://${req.url.authority}`; more is an evaluation error. The pattern is then
   * compiled for the request (through a cache), which costs about a microsecond per character.
   */
  fromInterpolatedChars: 128,
  /**
   * Longest URL the actions work on and produce, characters: half of what common servers accept
   * in a request line (8 KiB), as a search with capture groups costs up to ~20 ns per character
   * and instruction of the pattern (see `W`). A longer request URL, or a longer result, is an
   * evaluation error: the action does nothing. Later `req.url` reads stay within the request
   * bounds `cost.ts` assumes.
   */
  urlChars: 4096,
  /** Matches of `from` replaced in one URL; more is an evaluation error (the action does nothing). */
  maxMatches: 32,
  /** Entries of the `matches` result variable (the whole match and the first groups). */
  resultGroups: 32,
  /** Headers of a redirect (ngrok's limit). */
  redirectHeaders: 10,
} as const;

/** The redirect status codes (RFC 9110 §15.4; 304 to 306 do not redirect). */
export const REDIRECT_STATUS_CODES: readonly number[] = [300, 301, 302, 303, 307, 308];

/** What the cost check (`parse.ts` `checkCost`) charges a url action for its regexp work. */
export interface UrlActionWork {
  path: string;
  what: string;
  cost(): number;
}

/** What parsing a url action records for the cost check (parse.ts's `Gathered`). */
interface Gather {
  programs: { push(e: { path: string; program: CelProgram; interpolation: boolean }): void };
  work: UrlActionWork[];
  /** The policy is being saved: checks that only help a new document (see {@link neverMatches}) run. */
  saving?: boolean;
}

/**
 * A `from` anchored where a URL can never start: `from` is searched in the full URL
 * (`scheme://host[:port]/path?query`), so `^/old` (a path) or `^${req.url.authority}/…` (the
 * anchored form ngrok's own url-rewrite page recommends) never matches and the action silently
 * does nothing. Refused when a policy is saved (a stored one keeps running as it was).
 */
const NEVER_MATCHES_RE = /^\^(?:\/|\$\{\s*req\.(?:url\.authority|url\.host|host|url\.path|path)\s*\})/;
function neverMatches(from: string): boolean {
  return NEVER_MATCHES_RE.test(from);
}

/** A compiled `from`. */
export type UrlFrom =
  /** No `${…}`: compiled once. */
  | { kind: 'static'; re: RE2JS; groups: number }
  /** Pattern text and `${…}` programs (their text is quoted in), compiled per request through a cache. */
  | { kind: 'dynamic'; parts: (string | CelProgram)[]; groups: number; staticSize: number };

/** Part of a compiled `to`: literal text, a capture group's index, or a `${…}` program. */
export type UrlReplacementPart = string | number | CelProgram;

export interface UrlTemplate {
  /** null: `from` omitted, the whole URL is replaced. */
  from: UrlFrom | null;
  to: UrlReplacementPart[];
}

/** A `from` or `to` that cannot be used; `field` is the config key. */
export class UrlTemplateError extends Error {
  constructor(
    readonly field: 'from' | 'to',
    readonly reason: string,
  ) {
    super(`${field}: ${reason}`);
    this.name = 'UrlTemplateError';
  }
}

/**
 * An action that could not run on this request (the ingress counts it as an evaluation error
 * and sets `actions.ngrok.<action>.error`); `code` is one of `URL_ACTION_ERRORS`.
 */
export class UrlActionRuntimeError extends Error {
  constructor(
    readonly code: UrlActionErrorCode,
    message: string,
  ) {
    super(message);
    this.name = 'UrlActionRuntimeError';
  }
}

export type UrlActionErrorCode = 'evaluation_failed' | 'invalid_pattern' | 'url_too_long' | 'too_many_matches' | 'invalid_url';

const NAME_CHAR = /[A-Za-z0-9_]/;
const DIGITS = /^[0-9]+$/;
const IDENT = /^[A-Za-z_][A-Za-z0-9_]*$/;

function compileInterpolation(direction: PolicyDirection, expr: string, field: 'from' | 'to'): CelProgram {
  try {
    return compileExpression(direction, expr, false);
  } catch (err) {
    if (err instanceof CelCompileError) throw new UrlTemplateError(field, `\${${expr.length > 64 ? `${expr.slice(0, 64)}…` : expr}} ${err.reason}`);
    throw err;
  }
}

function compileFrom(direction: PolicyDirection, from: string): { from: UrlFrom; names: Record<string, number> } {
  let parts;
  try {
    parts = parseTemplate(from);
  } catch (err) {
    if (err instanceof CelCompileError) throw new UrlTemplateError('from', err.reason);
    throw err;
  }
  const dynamic = parts.some((p) => typeof p !== 'string');
  // A dynamic pattern's structure is checked with an empty group where each `${…}` goes (its
  // text is quoted in: it adds no group and cannot change the structure).
  const source = dynamic ? parts.map((p) => (typeof p === 'string' ? p : '(?:)')).join('') : from;
  let re: RE2JS;
  try {
    re = compileRegex(source);
  } catch (err) {
    if (err instanceof RegexError) throw new UrlTemplateError('from', err.message);
    throw err;
  }
  const over = chargePolicyRegexBudget(re.programSize());
  if (over) throw new UrlTemplateError('from', over);
  const groups = re.groupCount();
  const names = re.namedGroups();
  if (!dynamic) return { from: { kind: 'static', re, groups }, names };
  const compiled = parts.map((p) => (typeof p === 'string' ? p : compileInterpolation(direction, p.expr, 'from')));
  return { from: { kind: 'dynamic', parts: compiled, groups, staticSize: re.programSize() }, names };
}

function groupRef(ref: string, groups: number, names: Record<string, number>, written: string): number {
  if (DIGITS.test(ref)) {
    const n = ref.length > 6 ? Infinity : Number(ref);
    if (n > groups) {
      const has = groups === 0 ? 'has no capture groups' : `has ${groups} capture group${groups === 1 ? '' : 's'}`;
      throw new UrlTemplateError('to', `${written} refers to capture group ${ref}, but from ${has}${groups === 0 ? ' ($0 is the whole match)' : ''}; write $$ for a literal $`);
    }
    return n;
  }
  const n = names[ref];
  if (n === undefined) {
    const known = Object.keys(names);
    throw new UrlTemplateError('to', `${written} refers to no capture group of from (${known.length ? `its named groups: ${known.join(', ')}` : 'it has no named groups'}); write $$ for a literal $`);
  }
  return n;
}

/**
 * Compiles `to` (see the module comment): literal text, capture group indexes and `${…}`
 * programs, adjacent text merged.
 */
function compileTo(direction: PolicyDirection, to: string, groups: number, names: Record<string, number>): UrlReplacementPart[] {
  const out: UrlReplacementPart[] = [];
  let lit = '';
  const flush = () => {
    if (lit) out.push(lit);
    lit = '';
  };
  let i = 0;
  while (i < to.length) {
    const c = to[i]!;
    if (c !== '$') {
      lit += c;
      i++;
      continue;
    }
    const next = to[i + 1];
    if (next === '$') {
      lit += '$';
      i += 2;
      continue;
    }
    if (next === '{') {
      const end = closingBrace(to, i + 2);
      if (end < 0) throw new UrlTemplateError('to', `unterminated \${ at column ${i + 1}`);
      const expr = to.slice(i + 2, end);
      if (expr.trim() === '') throw new UrlTemplateError('to', `empty \${} at column ${i + 1}`);
      flush();
      if (DIGITS.test(expr) || (IDENT.test(expr) && names[expr] !== undefined)) out.push(groupRef(expr, groups, names, `\${${expr}}`));
      else out.push(compileInterpolation(direction, expr, 'to'));
      i = end + 1;
      continue;
    }
    let j = i + 1;
    while (j < to.length && NAME_CHAR.test(to[j]!)) j++;
    if (j === i + 1) {
      // `$` before anything else: literal (Go's rule).
      lit += '$';
      i++;
      continue;
    }
    flush();
    const ref = to.slice(i + 1, j);
    out.push(groupRef(ref, groups, names, `$${ref}`));
    i = j;
  }
  flush();
  return out;
}

/**
 * Compiles a url action's `from` (undefined: omitted) and `to`. Throws `UrlTemplateError`. With
 * a policy regexp budget (`withPolicyRegexBudget`), `from` is charged to it.
 */
export function compileUrlTemplate(direction: PolicyDirection, from: string | undefined, to: string): UrlTemplate {
  if (from === undefined) return { from: null, to: compileTo(direction, to, 0, {}) };
  const f = compileFrom(direction, from);
  return { from: f.from, to: compileTo(direction, to, f.from.groups, f.names) };
}

// --- Running ---

export interface UrlTemplateResult {
  /** The URL with every match replaced. */
  url: string;
  /** `actions.ngrok.<action>.matches`: the first match and its groups (see `CelUrlActionResult`). */
  matches: string[];
}

/**
 * The pattern of a dynamic `from` for one request: its text with each `${…}` value quoted in.
 * Throws `UrlActionRuntimeError`.
 */
function dynamicPattern(from: Extract<UrlFrom, { kind: 'dynamic' }>, evaluate: (p: CelProgram) => string): RE2JS {
  let pattern = '';
  let inserted = 0;
  for (const p of from.parts) {
    if (typeof p === 'string') {
      pattern += p;
      continue;
    }
    const text = evaluate(p);
    inserted += text.length;
    if (inserted > URL_ACTION_LIMITS.fromInterpolatedChars)
      throw new UrlActionRuntimeError('invalid_pattern', `from: the \${…} values are over ${URL_ACTION_LIMITS.fromInterpolatedChars} characters together`);
    // In a group, as the structure check had `(?:)`: quoting leaves digits and commas as they
    // are, so `{${…}}` would otherwise become a repeat count the cost check never saw.
    pattern += `(?:${RE2JS.quote(text)})`;
  }
  try {
    return cachedRegex(pattern);
  } catch (err) {
    if (err instanceof RegexError) throw new UrlActionRuntimeError('invalid_pattern', `from: ${err.message}`);
    throw err;
  }
}

/**
 * What `applyUrlTemplate` works on: at most `chars` characters in and out, at most `maxMatches`
 * matches; `subject` names the input in messages. The url actions' by default; the body
 * find-replace actions (`find-replace.ts`) pass their own.
 */
export interface TemplateLimits {
  chars: number;
  /** Longest result; `chars` when absent. */
  outChars?: number;
  maxMatches: number;
  subject: string;
}

const URL_LIMITS: TemplateLimits = { chars: URL_ACTION_LIMITS.urlChars, maxMatches: URL_ACTION_LIMITS.maxMatches, subject: 'URL' };

/**
 * Applies `t` to `url`: every match of `from` replaced by `to` (the whole URL when `from` is
 * omitted); null when `from` does not match. `evaluate` gives the text of a `${…}` (and throws
 * when it fails to evaluate); all are evaluated first, then the pattern is searched. Throws
 * `UrlActionRuntimeError` (or what `evaluate` throws).
 */
export function applyUrlTemplate(t: UrlTemplate, url: string, evaluate: (p: CelProgram) => string, limits: TemplateLimits = URL_LIMITS): UrlTemplateResult | null {
  const max = limits.outChars ?? limits.chars;
  const tooLong = (what: string, most = max) => new UrlActionRuntimeError('url_too_long', `${what} is over ${most} characters`);
  if (url.length > limits.chars) throw tooLong(`the request ${limits.subject}`, limits.chars);
  const repl: (string | number)[] = t.to.map((p) => (typeof p === 'string' || typeof p === 'number' ? p : evaluate(p)));
  const from = t.from;
  let re: RE2JS | null = null;
  if (from) re = from.kind === 'static' ? from.re : dynamicPattern(from, evaluate);
  if (!re) {
    // No `from`: the whole URL is the match ($0).
    let out = '';
    for (const p of repl) {
      out += typeof p === 'string' ? p : url;
      if (out.length > max) throw tooLong(`the new ${limits.subject}`);
    }
    return { url: out, matches: [url] };
  }
  const found = re.re2().findAllSubmatchIndex(url, limits.maxMatches + 1) as number[][] | null;
  if (!found || found.length === 0) return null;
  if (found.length > limits.maxMatches) throw new UrlActionRuntimeError('too_many_matches', `from matches more than ${limits.maxMatches} times in the ${limits.subject}`);
  let out = '';
  let last = 0;
  for (const m of found) {
    out += url.slice(last, m[0]);
    for (const p of repl) {
      if (typeof p === 'string') out += p;
      else {
        const s = m[2 * p];
        if (s !== undefined && s >= 0) out += url.slice(s, m[2 * p + 1]);
      }
      if (out.length > max) throw tooLong(`the new ${limits.subject}`);
    }
    last = m[1]!;
  }
  out += url.slice(last);
  if (out.length > max) throw tooLong(`the new ${limits.subject}`);
  const first = found[0]!;
  const matches: string[] = [];
  for (let g = 0; 2 * g < first.length && g < URL_ACTION_LIMITS.resultGroups; g++) {
    const s = first[2 * g]!;
    matches.push(s >= 0 ? url.slice(s, first[2 * g + 1]) : '');
  }
  return { url: out, matches };
}

// --- Cost ---

/**
 * Cost coefficients of the regexp work (≈ ns on `cost.ts`'s reference machine, about twice what
 * was measured on quiet runs; `url-actions.test.ts` reports estimates next to timings).
 * Replacing needs the matches' capture groups, which re2js finds with its one-pass engine
 * (linear) or else its NFA, never with the DFA alone that `matches()` uses: the NFA's work per
 * character grows with the threads alive, up to one per instruction, and a small DFA does not
 * mean few threads (`(([^/]*)/){10}`, whose DFA is small, measured ~8 ns per character and
 * instruction). So, unlike `matches()`, a search is costed by its program size.
 */
const W = {
  /** The call: evaluating the replacement, the search set-up, the result. */
  call: 2_000,
  /** Per character searched by a one-pass (or plain string) program (measured 30–50) … */
  linearChar: 100,
  /**
   * … plus per instruction: a long literal is searched with `String#indexOf`, which on text of
   * near-matches costs about its length per position (`a…ab a…a`, 601 and 2481 instructions, on
   * `aaaa…`: ~0.2 ns per character and instruction measured).
   */
  linearInstChar: 0.4,
  /** Per character of an NFA search (measured 30–65 for the smallest programs) … */
  nfaChar: 110,
  /** … plus per instruction of the pattern as written (measured up to 17, every thread alive) … */
  nfaInstChar: 20,
  /** … or of text a `${…}` inserted (a quoted literal; measured 0.5–1). */
  literalInstChar: 2,
  /** Per match (a new search from the match's end, the groups copied; measured 1.6–4.3 µs). */
  match: 8_000,
  /** Per character of the URL built and (redirect) parsed as a WHATWG URL. */
  outChar: 10,
  /** Per instruction to compile a dynamic `from` for a request (a cache miss; measured ~0.7 µs). */
  compileInst: 1_500,
} as const;

/**
 * Worst-case cost of searching, with capture groups, `chars` characters with a program `info`
 * of which `literal` instructions are text a `${…}` inserted.
 */
function searchCost(info: Partial<RegexRunInfo>, chars: number, literal: number): number {
  if (info.linear) return chars * (W.linearChar + W.linearInstChar * (info.programSize ?? MAX_REGEX_PROGRAM_SIZE));
  const p = info.programSize ?? MAX_REGEX_PROGRAM_SIZE;
  return chars * (W.nfaChar + W.nfaInstChar * (p - literal) + W.literalInstChar * literal);
}

/**
 * Worst-case cost of one run of `t` on a URL of at most `URL_ACTION_LIMITS.urlChars`
 * characters (the CEL of its `${…}` is costed separately, as expressions), or on what `limits`
 * allows. A dynamic `from` is costed as its pattern with the most text its `${…}` may insert
 * (that filler's DFA standing for the request's), compiled for the request.
 */
export function urlTemplateCost(t: UrlTemplate, limits: TemplateLimits = URL_LIMITS): number {
  const n = limits.chars;
  const build = (limits.outChars ?? n) * W.outChar;
  const from = t.from;
  if (!from) return W.call + build;
  let info: Partial<RegexRunInfo>;
  let compile = 0;
  let literal = 0;
  let re: RE2JS | null = null;
  if (from.kind === 'static') info = regexCostInfo((re = from.re), NO_DFA_EXPLORATION, NEVER_SMALL);
  else {
    const holes = from.parts.filter((p) => typeof p !== 'string').length;
    const fill = `(?:${'x'.repeat(Math.floor(URL_ACTION_LIMITS.fromInterpolatedChars / holes))})`; // as dynamicPattern inserts it
    const filled = from.parts.map((p) => (typeof p === 'string' ? p : fill)).join('');
    try {
      info = regexCostInfo((re = compileRegex(filled)), NO_DFA_EXPLORATION, NEVER_SMALL);
      literal = Math.max(0, info.programSize! - from.staticSize);
    } catch {
      info = {}; // too large with the filler: the largest program allowed
    }
    compile = W.compileInst * (info.programSize ?? MAX_REGEX_PROGRAM_SIZE);
  }
  return W.call + compile + searchCost(info, n, literal) + maxMatches(re, limits.maxMatches) * W.match + build;
}

/** Only `linear` is read off `regexCostInfo` here (a search is costed by size, not by its DFA). */
const NO_DFA_EXPLORATION: DfaExploreBudget = { steps: 0 };
const NEVER_SMALL = Number.MAX_SAFE_INTEGER;

/** re2js's `EMPTY_BEGIN_TEXT` start condition: the pattern only matches at the start of the text. */
const BEGIN_TEXT = 4;

/**
 * The most matches a run may replace: one for a pattern anchored at the start of the text
 * (`^…` without `(?m)`: read from re2js's start condition, assumed absent if unreadable).
 */
function maxMatches(re: RE2JS | null, most: number): number {
  const cond = re ? (re.re2() as unknown as { cond?: unknown }).cond : undefined;
  return typeof cond === 'number' && (cond & BEGIN_TEXT) !== 0 ? 1 : most;
}

// --- Validation ---

function optionalString(c: Record<string, unknown>, key: string, path: string, maxChars: number): string | undefined {
  const v = c[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'string') throw new TrafficPolicyError(at(path, key), `must be a string, got ${typeName(v)}`);
  if (v.length > maxChars) throw new TrafficPolicyError(at(path, key), `is over ${maxChars} characters`);
  return v;
}

/** `from` and `to` of a url action's config, validated and compiled (the CEL and the regexp work recorded in `g`). */
function parseFromTo(c: Record<string, unknown>, path: string, direction: PolicyDirection, g: Gather, what: string): { from?: string; to: string } {
  const from = optionalString(c, 'from', path, URL_ACTION_LIMITS.fromChars);
  const to = optionalString(c, 'to', path, URL_ACTION_LIMITS.toChars);
  if (to === undefined) throw new TrafficPolicyError(at(path, 'to'), 'is required');
  if (from === '') throw new TrafficPolicyError(at(path, 'from'), 'must not be empty (omit it to replace the whole URL)');
  if (from === undefined && to === '') throw new TrafficPolicyError(at(path, 'to'), 'must not be empty when from is omitted (it replaces the whole URL)');
  if (g.saving && from !== undefined && neverMatches(from)) {
    throw new TrafficPolicyError(at(path, 'from'), "can never match: it is searched in the full URL (scheme://host[:port]/path?query), which starts with its scheme; anchor with ^${req.url.scheme}://${req.url.authority}/… or drop the ^");
  }
  let t: UrlTemplate;
  try {
    t = compileUrlTemplate(direction, from, to);
  } catch (err) {
    if (err instanceof UrlTemplateError) throw new TrafficPolicyError(at(path, err.field), err.reason);
    throw err;
  }
  const record = (field: 'from' | 'to', parts: readonly unknown[]) => {
    for (const p of parts) if (typeof p === 'function') g.programs.push({ path: at(path, field), program: p as CelProgram, interpolation: true });
  };
  if (t.from?.kind === 'dynamic') record('from', t.from.parts);
  record('to', t.to);
  g.work.push({ path: at(path, from === undefined ? 'to' : 'from'), what, cost: () => urlTemplateCost(t) });
  return from === undefined ? { to } : { from, to };
}

/** The type's path from its config's (`inbound[0].actions[1].config` → `….type`). */
const typePath = (configPath: string) => configPath.replace(/\.config$/, '.type');

export function parseUrlRewriteConfig(raw: unknown, path: string, direction: PolicyDirection, g: Gather): UrlRewriteAction['config'] {
  if (direction !== 'inbound') throw new TrafficPolicyError(typePath(path), 'url-rewrite can only be used in inbound rules (it rewrites the request before it goes upstream)');
  const c = expectObj(raw, path, 'config');
  noUnknownKeys(c, path, ['from', 'to']);
  return parseFromTo(c, path, direction, g, 'url-rewrite: replacing from in the URL is');
}

export function parseRedirectConfig(raw: unknown, path: string, direction: PolicyDirection, g: Gather): RedirectAction['config'] {
  const c = expectObj(raw, path, 'config');
  noUnknownKeys(c, path, ['from', 'to', 'status_code', 'headers']);
  const fromTo = parseFromTo(c, path, direction, g, 'redirect: replacing from in the URL is');
  let status_code = 302;
  if (c.status_code !== undefined && c.status_code !== null) {
    const v = c.status_code;
    if (typeof v !== 'number' || !Number.isInteger(v)) throw new TrafficPolicyError(at(path, 'status_code'), `must be an integer, got ${typeName(v)} ${JSON.stringify(v)}`);
    if (!REDIRECT_STATUS_CODES.includes(v)) throw new TrafficPolicyError(at(path, 'status_code'), `must be a redirect status (${REDIRECT_STATUS_CODES.join(', ')}), got ${v}`);
    status_code = v;
  }
  const hp = at(path, 'headers');
  if (c.headers !== undefined && c.headers !== null) {
    const h = expectObj(c.headers, hp, 'headers');
    const names = Object.keys(h);
    if (names.length > URL_ACTION_LIMITS.redirectHeaders) throw new TrafficPolicyError(hp, `must have at most ${URL_ACTION_LIMITS.redirectHeaders} headers, got ${names.length}`);
    const location = names.find((n) => n.toLowerCase() === 'location');
    if (location !== undefined) throw new TrafficPolicyError(at(hp, location), 'the redirect sets Location itself (from to); it cannot be given as a header');
  }
  // Values may interpolate CEL (recorded for the cost check). They are headers of the redirect,
  // which ends the rules: no later expression sees them, so they add no header growth.
  const headers = parseHeaderMap(c.headers, hp, false, direction, { ...g, growth: { count: 0, bytes: 0 } });
  return { ...fromTo, status_code, headers };
}
