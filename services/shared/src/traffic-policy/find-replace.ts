/**
 * The `request-body-find-replace` and `response-body-find-replace` actions: validation, cost and
 * applying the replacements to a body's text (the ingress decides which bodies, decodes and
 * re-encodes them: `services/ingress/src/policy/find-replace.ts`). Semantics follow ngrok's:
 * - https://ngrok.com/docs/traffic-policy/actions/request-body-find-replace/
 * - https://ngrok.com/docs/traffic-policy/actions/response-body-find-replace/
 *
 * - `replacements` (required, at least one) is a list of `{from, to}` applied in order, each to
 *   the result of the ones before.
 * - `from` (required) is an RE2 pattern; every non-overlapping match in the body is replaced
 *   (Go's `ReplaceAllString`, as url-rewrite: the same compiled template, `url-actions.ts`).
 * - `to` (default empty: matches are deleted) refers to capture groups as `$1`, `${1}`, `$name`,
 *   `$0`; `$$` is a literal `$`.
 * - Both interpolate CEL with `${expr}`, evaluated when the action runs; what it inserts is
 *   literal text (in `from` it matches itself), as for url-rewrite.
 *
 * Where Warren is stricter than ngrok (a 400 naming the field): an RE2 syntax error, a reference
 * to a capture group `from` does not have, an empty `from`, more than
 * `FIND_REPLACE_LIMITS.replacements` replacements, over-long fields, and the request action in an
 * outbound rule or the response action in an inbound one.
 *
 * Bounds (ngrok documents none). The ingress is shared and a policy's worst case must fit
 * `MAX_POLICY_COST` (5 ms) per request, so each kind of replacement rewrites bodies up to its own
 * size (decoded bytes), and is charged its worst case at that size (`findReplaceCost`):
 * - A literal replacement: `from` has no RE2 metacharacter once simple escapes (`\.`, `\\`,
 *   `\n`…) are undone (its `${…}` insert literal text anyway), its text is at most
 *   `literalNeedleBytes` (128) bytes of UTF-8, and `to` refers to no group but `$0`. It is
 *   replaced by plain byte search (`Buffer.indexOf`), which is what re2js does for a literal too,
 *   minus its per-match overhead: bodies up to `literalBodyBytes` (128 KiB), at most
 *   `literalMaxMatches` matches, a result up to `literalOutBytes`. Search is usually well under
 *   1 ns per byte, but costs up to ~6 ns per byte when nearly every byte starts a partial match
 *   (`aaaa…` searched for `ab`; measured, `find-replace.test.ts`), and a result in fresh memory
 *   up to ~4 ns per byte (page faults: 512 KiB took ~2 ms here); the worst of both on 256 KiB
 *   (`ab` in `aaaa…`, 1024 matches, a 512 KiB result) measured 4.1–4.8 ms, more than the 5 ms
 *   allows with any margin, so the bound is 128 KiB, charged ~3.5 ms (measured worst ~2 ms).
 *   That holds only for short needles: Node's search (Boyer-Moore
 *   over at most the needle's last 250 bytes) is roughly quadratic for longer ones (`a…a b a…a`
 *   of 8001 bytes on 256 KiB of `a`: 717 ms), hence the 128 bytes: a longer literal `from` is a
 *   regex (4 KiB bodies, charged as one), and a `from` whose `${…}` make it longer than that when
 *   the action runs leaves the body as it was (`url_too_long`). As in url-rewrite, its `${…}`
 *   values may insert at most `URL_ACTION_LIMITS.fromInterpolatedChars` (128) characters
 *   together; more is an evaluation error.
 * - Any other (a regex): RE2 via re2js, which costs up to ~300 ns per character on adversarial
 *   text (`url-actions.ts` `W`): bodies up to `bodyBytes` (4 KiB), `maxMatches` matches, a result
 *   up to `outBytes`. re2js's DFA (what `matches()` uses, ~6 ns per character) only answers
 *   whether there is a match, never where: finding match bounds, even only `$0`'s, runs its NFA
 *   (or backtracker), measured as slow without groups as with them, so regexes get no larger
 *   bound without capture groups.
 * An action rewrites a body on the event loop only within the bounds of ALL its replacements
 * (`CompiledFindReplace.bodyBytes`, the smallest): one regex replacement brings that to 4 KiB.
 * A larger body, up to `workerBodyBytes` (128 KiB), is rewritten by the whole action on the
 * ingress's regex worker thread (`services/ingress/src/policy/regex-worker.ts`), within
 * `FIND_REPLACE_WORKER_LIMITS`, off the event loop and under a deadline; the event loop only
 * hands it over, charged `workerHandOffCost`. More matches or a longer result leave the body as
 * it was, and so does a larger body (the ingress counts it).
 */
import { CelCompileError, type CelProgram } from './cel.js';
import { at, expectList, expectObj, noUnknownKeys, onlyInbound, TrafficPolicyError, typeName } from './parse.js';
import { MAX_REGEX_PATTERN_LENGTH } from './regex.js';
import { applyUrlTemplate, compileUrlTemplate, URL_ACTION_LIMITS, UrlActionRuntimeError, urlTemplateCost, UrlTemplateError, type TemplateLimits, type UrlActionWork, type UrlTemplate } from './url-actions.js';
import type { FindReplaceConfig, PolicyDirection } from './types.js';

export const FIND_REPLACE_LIMITS = {
  /** Replacements per action. */
  replacements: 10,
  /** `from` as written, characters. */
  fromChars: MAX_REGEX_PATTERN_LENGTH,
  /** `to` as written, characters. */
  toChars: 4096,
  /** Largest body a regex replacement rewrites, in bytes once decoded (see the module comment); a larger one passes unchanged. */
  bodyBytes: 4 * 1024,
  /** Largest body a regex replacement may produce, bytes (before any re-encoding); a larger result is not applied. */
  outBytes: 8 * 1024,
  /** Matches of one regex replacement in one body; more: the body passes unchanged. */
  maxMatches: 32,
  /** Largest body a literal replacement rewrites, decoded bytes (an action of literal replacements only). */
  literalBodyBytes: 128 * 1024,
  /** Largest body a literal replacement may produce, bytes (twice the action's body bound: 8 KiB with a regex in it). */
  literalOutBytes: 256 * 1024,
  /** Matches of one literal replacement in one body. */
  literalMaxMatches: 1024,
  /**
   * Longest text a literal replacement searches for, bytes of UTF-8 (as written, and again once
   * its `${…}` are evaluated): `Buffer.indexOf` is linear up to ~250 bytes and roughly quadratic
   * past that (see the module comment).
   */
  literalNeedleBytes: 128,
  /**
   * Largest body an action with a regex replacement rewrites on the regex worker thread, decoded
   * bytes: at most this, and less for an action whose estimated worst case on it is over
   * `workerBudgetNs` (`compileFindReplace`).
   */
  workerBodyBytes: 128 * 1024,
  /**
   * Estimated worst-case work of an action on one body on the regex worker thread (≈ ns, the
   * event loop's cost model: about twice what was measured). A typical redaction pattern fits it
   * on 128 KiB; a large pattern gets a smaller bound.
   */
  workerBudgetNs: 100_000_000,
  /** Largest result there, bytes. */
  workerOutBytes: 256 * 1024,
  /** Matches of one regex replacement there. */
  workerMaxMatches: 1024,
} as const;

/** What an action works within: the bounds of a body rewritten on the event loop, or on the regex worker thread. */
export interface FindReplaceBounds {
  /** Largest body rewritten, decoded bytes. */
  bodyBytes: number;
  /** Largest result of a literal replacement, bytes. */
  outBytes: number;
  /** What a regex replacement works within. */
  regex: TemplateLimits;
}

/** The bounds on the regex worker thread (`FIND_REPLACE_LIMITS.worker*`). */
export const FIND_REPLACE_WORKER_LIMITS: FindReplaceBounds = {
  bodyBytes: FIND_REPLACE_LIMITS.workerBodyBytes,
  outBytes: FIND_REPLACE_LIMITS.workerOutBytes,
  regex: { chars: FIND_REPLACE_LIMITS.workerBodyBytes, outChars: FIND_REPLACE_LIMITS.workerOutBytes, maxMatches: FIND_REPLACE_LIMITS.workerMaxMatches, subject: 'body' },
};

/**
 * Event-loop work to hand a body of `bytes` to the regex worker thread and take the result back
 * (≈ ns): checking UTF-8, one copy out and the result's copy in (well under 1 ns a byte each).
 */
export function workerHandOffCost(bytes: number): number {
  return 50_000 + 2 * bytes;
}

/** What `applyFindReplace` works within for a regex (characters: a character is at least a byte in UTF-8). */
export const FIND_REPLACE_TEMPLATE_LIMITS: TemplateLimits = {
  chars: FIND_REPLACE_LIMITS.bodyBytes,
  outChars: FIND_REPLACE_LIMITS.outBytes,
  maxMatches: FIND_REPLACE_LIMITS.maxMatches,
  subject: 'body',
};

/**
 * Work per body on the event loop besides the searches (≈ ns), for a body of up to `bytes`
 * decoded: checking UTF-8 and gathering the chunks (measured ~0.1 ns per byte; the result's
 * copy is charged to each replacement, a regex's text conversion is within its 4 KiB and the
 * 20 µs). A gzip/deflate/br body is decoded and encoded
 * again on libuv's thread pool (node:zlib's asynchronous calls, as compress-response and the
 * compression module compress), off the event loop, within the same bounds.
 */
export function findReplaceBodyCost(bytes: number): number {
  return 20_000 + bytes;
}

/** `findReplaceBodyCost` at the regex bound. */
export const FIND_REPLACE_BODY_COST = findReplaceBodyCost(FIND_REPLACE_LIMITS.outBytes);

export type FindReplaceType = 'request-body-find-replace' | 'response-body-find-replace';

/** One compiled replacement. */
export interface FindReplacement {
  /** `from` and `to` as a regex replacement (always compiled: validation, and the fallback of an empty literal). */
  template: UrlTemplate;
  /** `from` as literal text and `${…}` (inserting literal text) when it is a literal replacement, else null. */
  literal: (string | CelProgram)[] | null;
  /** Largest body this replacement rewrites (decoded bytes). */
  bodyBytes: number;
}

/** An action's compiled replacements. */
export interface CompiledFindReplace {
  replacements: FindReplacement[];
  /** Largest body the action rewrites on the event loop: the smallest of its replacements' bounds. */
  bodyBytes: number;
  /** Longest result of a literal replacement: twice `bodyBytes`. */
  outBytes: number;
  /**
   * Largest body the action rewrites at all: `bodyBytes`, or with a regex replacement
   * `workerBodyBytes`, a body over `bodyBytes` being rewritten on the regex worker thread.
   */
  workerBytes: number;
  /** Every `${…}` program of the replacements (each once), to evaluate when the action runs. */
  programs: CelProgram[];
}

/** RE2's metacharacters: a `from` with one unescaped is a regex. */
const META = new Set([...'.^$*+?()[]{}|']);
/** Escapes RE2 reads as a control character. */
const CONTROL: Record<string, string> = { a: '\x07', f: '\f', t: '\t', n: '\n', r: '\r', v: '\v' };
/** A lone surrogate (not in a pair): such text is no valid UTF-8 to search for. */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/**
 * The text `pattern` matches when it is a literal (no metacharacter once `\` before ASCII
 * punctuation or one of `afnrtv` is undone), else null.
 */
export function literalPattern(pattern: string): string | null {
  let out = '';
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i]!;
    if (c === '\\') {
      const n = pattern[++i];
      if (n === undefined) return null;
      if (CONTROL[n] !== undefined) out += CONTROL[n];
      else if (/^[!-/:-@[-`{-~]$/.test(n)) out += n;
      else return null;
    } else if (META.has(c)) return null;
    else out += c;
  }
  return LONE_SURROGATE.test(out) ? null : out;
}

function literalFrom(t: UrlTemplate, from: string): (string | CelProgram)[] | null {
  if (!t.from || t.to.some((p) => typeof p === 'number' && p !== 0)) return null;
  if (t.from.kind === 'static') {
    const text = literalPattern(from);
    return text && Buffer.byteLength(text, 'utf8') <= FIND_REPLACE_LIMITS.literalNeedleBytes ? [text] : null;
  }
  const parts: (string | CelProgram)[] = [];
  let bytes = 0;
  for (const p of t.from.parts) {
    if (typeof p !== 'string') parts.push(p);
    else {
      const text = literalPattern(p);
      if (text === null) return null;
      bytes += Buffer.byteLength(text, 'utf8');
      parts.push(text);
    }
  }
  // Longer text as written: it could never be searched for as a literal.
  return bytes <= FIND_REPLACE_LIMITS.literalNeedleBytes ? parts : null;
}

/**
 * The text a literal replacement searches for once its `${…}` are evaluated. Throws
 * `UrlActionRuntimeError`: `invalid_pattern` (an evaluation error, as in url-rewrite) when the
 * values insert more than `fromInterpolatedChars` characters together, `url_too_long` (the body
 * is left as it was) when the text is over `literalNeedleBytes` bytes.
 */
function literalNeedle(parts: readonly (string | CelProgram)[], evaluate: (p: CelProgram) => string): string {
  let needle = '';
  let inserted = 0;
  for (const p of parts) {
    if (typeof p === 'string') {
      needle += p;
      continue;
    }
    const text = evaluate(p);
    inserted += text.length;
    if (inserted > URL_ACTION_LIMITS.fromInterpolatedChars)
      throw new UrlActionRuntimeError('invalid_pattern', `from: the \${…} values are over ${URL_ACTION_LIMITS.fromInterpolatedChars} characters together`);
    needle += text;
  }
  if (Buffer.byteLength(needle, 'utf8') > FIND_REPLACE_LIMITS.literalNeedleBytes) throw tooLong('from (once its ${…} are evaluated)', FIND_REPLACE_LIMITS.literalNeedleBytes);
  return needle;
}

/** The compiled replacements of an action, in order (`compileUrlTemplate`'s errors). */
export function compileFindReplace(direction: PolicyDirection, c: FindReplaceConfig): CompiledFindReplace {
  const replacements = c.replacements.map((r) => compileReplacement(direction, r.from, r.to));
  const programs = new Set<CelProgram>();
  for (const r of replacements) {
    const t = r.template;
    for (const p of [...(t.from?.kind === 'dynamic' ? t.from.parts : []), ...t.to]) if (typeof p === 'function') programs.add(p);
  }
  const bodyBytes = Math.min(...replacements.map((r) => r.bodyBytes));
  return { replacements, bodyBytes, outBytes: 2 * bodyBytes, workerBytes: workerBound(replacements, bodyBytes), programs: [...programs] };
}

/**
 * The largest body an action rewrites on the regex worker thread: `workerBodyBytes`, scaled down
 * (to whole KiB) when its replacements' estimated worst case there is over `workerBudgetNs`;
 * `bodyBytes` (no worker) for literal replacements only, or when that leaves no more than it.
 */
function workerBound(replacements: readonly FindReplacement[], bodyBytes: number): number {
  if (replacements.every((r) => r.literal)) return bodyBytes;
  const most = FIND_REPLACE_LIMITS.workerBodyBytes;
  const total = replacements.reduce((t, r) => t + (r.literal ? findReplaceCost(r, most) : urlTemplateCost(r.template, FIND_REPLACE_WORKER_LIMITS.regex)), 0);
  const fit = Math.floor((most * Math.min(1, FIND_REPLACE_LIMITS.workerBudgetNs / total)) / 1024) * 1024;
  return Math.max(bodyBytes, fit);
}

function compileReplacement(direction: PolicyDirection, from: string, to: string): FindReplacement {
  const template = compileUrlTemplate(direction, from, to);
  const literal = literalFrom(template, from);
  return { template, literal, bodyBytes: literal ? FIND_REPLACE_LIMITS.literalBodyBytes : FIND_REPLACE_LIMITS.bodyBytes };
}

/**
 * Cost coefficients of a literal replacement (≈ ns, about twice the worst measured on a 2-core VM:
 * `find-replace.test.ts` reports timings next to estimates).
 */
const LW = {
  /** The call: evaluating `${…}`, encoding needle and replacement. */
  call: 5_000,
  /**
   * Per byte searched (measured up to ~6, best of 7, for needles of at most `literalNeedleBytes`:
   * `aaaa…` searched for `ab`, `aaab`, `a…ab` (128 bytes), periodic `abab…c`; under 1 on
   * ordinary text; `find-replace.test.ts`): twice that.
   */
  byte: 12,
  /** Per match (a `Buffer.indexOf` call and the copies; measured ~100–400 on text of partial matches). */
  match: 400,
  /** Per byte of the result (copying ~0.1–0.5, and page faults on fresh memory: up to ~4 measured). */
  outByte: 5,
} as const;

/** Worst-case cost of one replacement on a body of at most `bodyBytes` (its action's bound). */
export function findReplaceCost(r: FindReplacement, bodyBytes = r.bodyBytes): number {
  if (!r.literal) return urlTemplateCost(r.template, FIND_REPLACE_TEMPLATE_LIMITS);
  return LW.call + bodyBytes * LW.byte + Math.min(FIND_REPLACE_LIMITS.literalMaxMatches, bodyBytes) * LW.match + 2 * bodyBytes * LW.outByte;
}

const tooLong = (what: string, most: number) => new UrlActionRuntimeError('url_too_long', `${what} is over ${most} bytes`);

/**
 * `body` with every match of `needle` replaced by `to`; null when there is none. Throws
 * `UrlActionRuntimeError` for more than `literalMaxMatches` matches or a result over `outBytes`.
 * `body` and `needle` are valid UTF-8, so a byte match is a character match.
 */
function replaceBytes(body: Buffer, needle: Buffer, to: Buffer, outBytes: number): Buffer | null {
  let i = body.indexOf(needle);
  if (i < 0) return null;
  const at: number[] = [];
  const grow = to.length - needle.length;
  while (i >= 0) {
    if (at.length === FIND_REPLACE_LIMITS.literalMaxMatches) throw new UrlActionRuntimeError('too_many_matches', `from matches more than ${FIND_REPLACE_LIMITS.literalMaxMatches} times in the body`);
    at.push(i);
    if (body.length + at.length * grow > outBytes) throw tooLong('the new body', outBytes);
    i = body.indexOf(needle, i + needle.length);
  }
  const out = Buffer.allocUnsafe(body.length + at.length * grow);
  let o = 0;
  let last = 0;
  // TypedArray#set from plain Uint8Array views: Buffer#subarray looks up Symbol.species, and
  // costs ~1 µs a call once anything in the process has touched a typed array's constructor or
  // species (measured under vitest: 2.2 ms instead of 0.09 ms for 1024 matches).
  const src = body.buffer;
  const view = (from: number, to: number) => new Uint8Array(src, body.byteOffset + from, to - from);
  for (const p of at) {
    out.set(view(last, p), o);
    o += p - last;
    out.set(to, o);
    o += to.length;
    last = p + needle.length;
  }
  out.set(view(last, body.length), o);
  return out;
}

/**
 * Applies `c`'s replacements in order to `body` (valid UTF-8, at most `c.bodyBytes`, or within
 * `bounds`: `FIND_REPLACE_WORKER_LIMITS` on the regex worker thread): the new body, or null when
 * nothing matched. `evaluate` gives the text of a `${…}`. Throws `UrlActionRuntimeError` (too
 * many matches; `url_too_long`: the body or a result over a bound; a `from` whose `${…}` make an
 * invalid pattern) or what `evaluate` throws: then the body must be left as it was.
 */
export function applyFindReplace(c: CompiledFindReplace, body: Buffer, evaluate: (p: CelProgram) => string, bounds: FindReplaceBounds = { bodyBytes: c.bodyBytes, outBytes: c.outBytes, regex: FIND_REPLACE_TEMPLATE_LIMITS }): Buffer | null {
  if (body.length > bounds.bodyBytes) throw tooLong('the body', bounds.bodyBytes);
  let buf = body;
  let text: string | null = null;
  let changed = false;
  for (const r of c.replacements) {
    if (r.literal) {
      const needle = literalNeedle(r.literal, evaluate);
      // A lone surrogate is not in valid UTF-8 text: nothing to replace.
      if (LONE_SURROGATE.test(needle)) continue;
      if (needle !== '') {
        const to = r.template.to.map((p) => (typeof p === 'string' ? p : typeof p === 'number' ? needle : evaluate(p))).join('');
        if (text !== null) {
          buf = Buffer.from(text, 'utf8');
          text = null;
        }
        const out = replaceBytes(buf, Buffer.from(needle, 'utf8'), Buffer.from(to, 'utf8'), bounds.outBytes);
        if (out) {
          buf = out;
          changed = true;
        }
        continue;
      }
      // `${…}` made it empty (it matches everywhere): a regex, within a regex's bounds.
      if ((text?.length ?? buf.length) > bounds.regex.chars) throw new UrlActionRuntimeError('too_many_matches', 'from is empty: it matches everywhere in the body');
    }
    if (text === null) text = buf.toString('utf8');
    const res = applyUrlTemplate(r.template, text, evaluate, bounds.regex);
    if (res && res.url !== text) {
      text = res.url;
      changed = true;
    }
  }
  if (!changed) return null;
  return text !== null ? Buffer.from(text, 'utf8') : buf;
}

/** What parsing records for the cost check (parse.ts's `Gathered`). */
interface Gather {
  programs: { push(e: { path: string; program: CelProgram; interpolation: boolean }): void };
  work: UrlActionWork[];
}

function stringField(c: Record<string, unknown>, key: string, path: string, maxChars: number): string | undefined {
  const v = c[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'string') throw new TrafficPolicyError(at(path, key), `must be a string, got ${typeName(v)}`);
  if (v.length > maxChars) throw new TrafficPolicyError(at(path, key), `is over ${maxChars} characters`);
  return v;
}

/** `request-body-find-replace` / `response-body-find-replace` config (see the module comment). */
export function parseFindReplaceConfig(type: FindReplaceType, raw: unknown, path: string, direction: PolicyDirection, g: Gather): FindReplaceConfig {
  if (type === 'request-body-find-replace') onlyInbound(type, path, direction, 'it rewrites the request body before it goes upstream');
  else if (direction !== 'outbound') throw new TrafficPolicyError(path.replace(/\.config$/, '.type'), `${type} can only be used in outbound rules (it rewrites the response body)`);
  const c = expectObj(raw, path, 'config');
  noUnknownKeys(c, path, ['replacements']);
  const lp = at(path, 'replacements');
  const list = expectList(c.replacements, lp, false);
  if (list.length === 0) throw new TrafficPolicyError(lp, 'must have at least one replacement');
  if (list.length > FIND_REPLACE_LIMITS.replacements) throw new TrafficPolicyError(lp, `must have at most ${FIND_REPLACE_LIMITS.replacements} replacements, got ${list.length}`);
  const side = type === 'request-body-find-replace' ? 'request' : 'response';
  const compiled: FindReplacement[] = [];
  const replacements = list.map((e, i) => {
    const p = at(lp, i);
    const r = expectObj(e, p, 'a replacement');
    noUnknownKeys(r, p, ['from', 'to']);
    const from = stringField(r, 'from', p, FIND_REPLACE_LIMITS.fromChars);
    const to = stringField(r, 'to', p, FIND_REPLACE_LIMITS.toChars) ?? '';
    if (from === undefined) throw new TrafficPolicyError(at(p, 'from'), 'is required');
    if (from === '') throw new TrafficPolicyError(at(p, 'from'), 'must not be empty');
    let rep: FindReplacement;
    try {
      rep = compileReplacement(direction, from, to);
    } catch (err) {
      if (err instanceof UrlTemplateError) throw new TrafficPolicyError(at(p, err.field), err.reason);
      if (err instanceof CelCompileError) throw new TrafficPolicyError(at(p, 'from'), err.reason);
      throw err;
    }
    const t = rep.template;
    const record = (field: 'from' | 'to', parts: readonly unknown[]) => {
      for (const q of parts) if (typeof q === 'function') g.programs.push({ path: at(p, field), program: q as CelProgram, interpolation: true });
    };
    if (t.from?.kind === 'dynamic') record('from', t.from.parts);
    record('to', t.to);
    compiled.push(rep);
    return { from, to };
  });
  // The action rewrites bodies within every replacement's bound (the smallest), and each search is charged on that.
  const bound = Math.min(...compiled.map((r) => r.bodyBytes));
  const size = `${bound / 1024} KiB`;
  compiled.forEach((rep, i) => {
    const kind = rep.literal ? `a literal from (plain search, up to ${Math.min(FIND_REPLACE_LIMITS.literalMaxMatches, bound)} matches)` : `from (RE2, up to ${FIND_REPLACE_LIMITS.maxMatches} matches)`;
    g.work.push({ path: at(at(lp, i), 'from'), what: `${type}: replacing ${kind} in a ${side} body of up to ${size} is`, cost: () => findReplaceCost(rep, bound) });
  });
  g.work.push({ path, what: `${type}: checking and copying a ${side} body of up to ${size} is`, cost: () => findReplaceBodyCost(bound) });
  const most = workerBound(compiled, bound);
  if (most > bound) g.work.push({ path, what: `${type}: handing a ${side} body of up to ${most / 1024} KiB to the regex worker thread is`, cost: () => workerHandOffCost(most) });
  return { replacements };
}
