import {
  applyUrlTemplate,
  compileUrlTemplate,
  URL_ACTION_LIMITS,
  UrlActionRuntimeError,
  type CelUrlActionResult,
  type PolicyDirection,
  type RedirectAction,
  type UrlRewriteAction,
  type UrlTemplate,
} from '@warren/shared';
import { normalizeTarget } from '../http/target.js';
import type { Outcome } from '../pipeline/types.js';
import { actionsOf, type Activation } from './activation.js';
import { addWithinHead, celToHeaderText, compileHeaderValue, interpolateHeader, isValidHeaderValue, overHeadError, type HeaderValue } from './headers.js';

/**
 * The `url-rewrite` and `redirect` traffic-policy actions at run time (validated, and their
 * `from` / `to` compiled and applied, by `services/shared/src/traffic-policy/url-actions.ts`).
 *
 * url-rewrite (https://ngrok.com/docs/traffic-policy/actions/url-rewrite/), inbound only,
 * non-terminating: the request URL (`req.url`, as rewritten by any earlier url-rewrite) with
 * `from` replaced by `to`. The upstream gets the result's path and query as its request target
 * (`RequestState.target`, which the forwarder sends instead of the client's); later expressions
 * see it in `req.url`, `req.path`, `req.query`, inbound and outbound. A result with another
 * scheme or host does not move the request: ngrok documents no host change for this action (its
 * examples set `Host` with add-headers), so only the path and query are taken, the request goes
 * to the route's backend with its Host header unchanged, and `req.url` keeps the client's scheme
 * and host. The result must make a valid origin-form target: a path starting with `/` (or an
 * absolute URL / `//host` followed by one, or by nothing: `/`), of visible ASCII characters only
 * (no space, control character, non-ASCII character or `#`: percent-encode them); otherwise the
 * rewrite is not applied (an evaluation error: counted, logged once, `error.code` set). The
 * result's path is then normalised as a client's is (`normalizeTarget` in `http/target.ts`:
 * percent-encoded unreserved characters decoded, dot segments removed, repeated slashes merged,
 * the query kept as sent), so that later rules and the upstream see one path: text moved from the
 * query into the path (`/items/$1` with `q=../admin`) cannot step past a later rule on
 * `req.path`. A result whose path holds a backslash (raw or `%5C`), which the ingress refuses
 * from a client, is not applied either (an evaluation error).
 *
 * redirect (https://ngrok.com/docs/traffic-policy/actions/redirect/), inbound and outbound: the
 * same replacement; when it changes the URL, the answer is `status_code` with `Location` = the
 * result resolved against the request URL (a relative `to: /new` gives
 * `https://host/new`, as ngrok's examples show) and normalised as a WHATWG URL (spaces and
 * non-ASCII characters percent-encoded, the host in punycode), plus the configured headers;
 * the body is empty. When the URL is unchanged (`from` did not match, or the result is the same
 * URL) the action does nothing and the rules go on, as ngrok skips such a redirect. A result
 * with a control character (CR/LF: no header injection) or that is not a URL is an evaluation
 * error: no redirect. Outbound, the redirect replaces the upstream's response. The `Location`
 * is not put through `normalizeTarget`: it goes to the client, and the WHATWG parsing already
 * removes dot segments (`%2e` ones too) and reads a backslash as a slash in an http(s) URL; the
 * request the client then sends is normalised (or refused) on arrival, like any other.
 *
 * `actions.ngrok.url_rewrite` / `actions.ngrok.redirect` (`CelUrlActionResult`) are reset by
 * every run of the action.
 */

export interface CompiledUrlRewrite {
  kind: 'url-rewrite';
  /** The action's path in the policy (`inbound[0].actions[1]`), for evaluation errors. */
  where: string;
  t: UrlTemplate;
}

export interface CompiledRedirect {
  kind: 'redirect';
  where: string;
  t: UrlTemplate;
  status: number;
  headers: { name: string; value: HeaderValue }[];
}

export function compileUrlRewrite(c: UrlRewriteAction['config'], direction: PolicyDirection, where: string): CompiledUrlRewrite {
  return { kind: 'url-rewrite', where, t: compileUrlTemplate(direction, c.from, c.to) };
}

export function compileRedirect(c: RedirectAction['config'], direction: PolicyDirection, where: string): CompiledRedirect {
  const headers = Object.entries(c.headers).map(([name, raw]) => ({ name, value: compileHeaderValue(raw, direction) }));
  return { kind: 'redirect', where, t: compileUrlTemplate(direction, c.from, c.to), status: c.status_code, headers };
}

/** Records an evaluation error (the engine's `failed`: counted, logged once per location). */
export type FailedFn = (where: string, err: unknown) => void;

const ABSOLUTE_PREFIX = /^[A-Za-z][A-Za-z0-9+.-]*:\/\/[^/?#]*/;
/** An origin-form request target: `/`, then visible ASCII other than `#`. */
const ORIGIN_FORM = /^\/[\x21-\x22\x24-\x7e]*$/;
const CONTROL = /[\x00-\x1f\x7f]/;

/**
 * The request target (path and query) a rewritten URL gives, or null when it gives no valid
 * one. `https://other:8080/a?b` → `/a?b` (the scheme and host are not applied), `/a` → `/a`,
 * `https://h` → `/`, `//h/a` → `/a`; `a/b`, `/a b`, `/a#x`, `/é` → null.
 */
export function rewrittenTarget(url: string): string | null {
  let rest: string;
  const m = ABSOLUTE_PREFIX.exec(url);
  if (m) rest = url.slice(m[0].length);
  else if (url.startsWith('//')) {
    const end = url.slice(2).search(/[/?#]/);
    rest = end < 0 ? '' : url.slice(2 + end);
  } else if (url.startsWith('/')) rest = url;
  else return null;
  if (rest === '' || rest.startsWith('?')) rest = `/${rest}`;
  return ORIGIN_FORM.test(rest) ? rest : null;
}

/**
 * The `Location` of a redirect to `url` (resolved against `base`, the request URL), or null
 * when it is not a usable URL (a control character anywhere, a backslash before the query, not
 * parseable, too long).
 *
 * The backslash: the URL Standard reads `\` as `/` in http(s) URLs, so `/\evil.example/x`, which
 * passes a policy's usual "a local path: starts with `/`, not `//`" guard, resolved to
 * `http://evil.example/x` (and browsers read it so in a relative Location too). Go, whose
 * reading ngrok's policies are written for, keeps it a path character. Refused, as in a client's
 * request target and in url-rewrite.
 */
export function redirectLocation(url: string, base: string): string | null {
  if (CONTROL.test(url)) return null;
  const backslash = url.indexOf('\\');
  if (backslash >= 0) {
    const query = url.search(/[?#]/);
    if (query < 0 || backslash < query) return null;
  }
  let href: string;
  try {
    href = new URL(url, base).href;
  } catch {
    return null;
  }
  return href.length <= URL_ACTION_LIMITS.urlChars && isValidHeaderValue(href) ? href : null;
}

/** `s`, cut for a message. */
const shown = (s: string) => JSON.stringify(s.length > 200 ? `${s.slice(0, 200)}…` : s);

function setError(vars: CelUrlActionResult, err: unknown): void {
  vars.error.code = err instanceof UrlActionRuntimeError ? err.code : 'evaluation_failed';
  const msg = err instanceof Error ? ((err as { summary?: string }).summary ?? err.message.split('\n')[0]!) : String(err);
  vars.error.message = msg.slice(0, 1024);
}

/** Runs the template on the current request URL; null (after reporting) when it failed. */
function apply(act: Activation, t: UrlTemplate, vars: CelUrlActionResult, where: string, failed: FailedFn): { url: string; result: ReturnType<typeof applyUrlTemplate> } | null {
  const url = act.req.url.toString();
  try {
    return { url, result: applyUrlTemplate(t, url, (p) => celToHeaderText(p(act))) };
  } catch (err) {
    setError(vars, err);
    failed(where, err);
    return null;
  }
}

export function runUrlRewrite(act: Activation, a: CompiledUrlRewrite, failed: FailedFn): void {
  const vars = actionsOf(act.s).ngrok.url_rewrite;
  vars.reset();
  const run = apply(act, a.t, vars, a.where, failed);
  if (!run) return;
  const { url, result } = run;
  if (!result) {
    vars.url = url;
    return;
  }
  vars.matches = result.matches;
  const raw = rewrittenTarget(result.url);
  // Normalised as a client's target is: later rules and the upstream see one path.
  const target = raw === null ? null : normalizeTarget(raw);
  if (target === null) {
    vars.url = url;
    const err = new UrlActionRuntimeError(
      'invalid_url',
      raw === null
        ? `the rewritten URL ${shown(result.url)} gives no valid request target (a path starting with "/", of visible ASCII characters, no "#")`
        : `the rewritten URL ${shown(result.url)} gives a path with a backslash (raw or %5C), which upstreams read differently; the ingress refuses it from a client`,
    );
    setError(vars, err);
    failed(a.where, err);
    return;
  }
  const s = act.s;
  if (target !== (s.target ?? s.req.url)) {
    s.target = target;
    act.urlChanged();
  }
  vars.url = act.req.url.toString();
}

/** The redirect, or null when the action does nothing (the URL is unchanged, or it failed). */
export function runRedirect(act: Activation, a: CompiledRedirect, failed: FailedFn): Outcome {
  const vars = actionsOf(act.s).ngrok.redirect;
  vars.reset();
  const run = apply(act, a.t, vars, a.where, failed);
  if (!run) return null;
  const { url, result } = run;
  if (!result || result.url === url) return null;
  const location = redirectLocation(result.url, url);
  if (location === null) {
    const err = new UrlActionRuntimeError('invalid_url', `the redirect URL ${shown(result.url)} is not a valid URL (or has a control character, or a backslash before its query)`);
    setError(vars, err);
    failed(a.where, err);
    return null;
  }
  if (location === redirectLocation(url, url)) return null;
  vars.matches = result.matches;
  vars.url = location;
  const headers: Record<string, string> = { location };
  let used = 'location'.length + location.length + 4;
  for (const h of a.headers) {
    try {
      const after = addWithinHead(headers, h.name, interpolateHeader(h.value, (p) => p(act)), used);
      if (after < 0) throw overHeadError(h.name);
      used = after;
    } catch (err) {
      failed(`${a.where} headers.${h.name}`, err);
    }
  }
  return { status: a.status, headers, body: '' };
}
