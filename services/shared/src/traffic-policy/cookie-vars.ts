import { evaluate } from '@marcbachmann/cel-js';

/**
 * Cookies for the `getReqCookie(name)` / `hasReqCookie(name)` (inbound and outbound) and
 * `getResCookie(name)` / `hasResCookie(name)` (outbound) macros, as ngrok documents them
 * (https://ngrok.com/docs/traffic-policy/macros/, the `req.cookies` / `res.cookies` variables
 * for the fields): ngrok's traffic policy is written in Go, so the headers are read as Go's
 * `net/http` reads them.
 *
 * - Request cookies (`Cookie` headers, every one in order, as `http.Request.Cookie`): `name=value`
 *   pairs split at `;`, spaces and tabs around each trimmed; a pair whose name is not an HTTP
 *   token or whose value holds a character outside `%x20-7E` (or `"`, `;`, `\`) is skipped; a value
 *   in double quotes loses them; a part without `=` is a cookie with an empty value.
 *   `getReqCookie` returns the first cookie of that name ("the first from the ordering specified
 *   in the Cookie header").
 * - Response cookies (each `Set-Cookie` header, as `http.Response.Cookies`): the first pair and its
 *   attributes. `getResCookie` returns the one with the longest `path` when several have the
 *   name (the first of those at a tie).
 * - Names are compared exactly (cookie names are case-sensitive, unlike header names).
 * - A cookie has ngrok's fields: `name`, `value`, `path`, `domain`, `expires` (a timestamp;
 *   0001-01-01T00:00:00Z when absent or unreadable: RFC 1123 dates, with spaces or dashes, as Go
 *   reads them), `max_age` (a duration: `Max-Age=0` or negative is -1s as Go records it, absent
 *   0s), `secure`, `http_only`, `same_site` (`'Strict'`, `'Lax'`, `'None'`, or `''` when absent or
 *   another value) and `unparsed_attributes` (any other attribute, name as written → value, `''`
 *   for a flag). A request cookie has only a name and a value; its other fields are empty.
 * - An absent cookie: `get*Cookie` returns an empty cookie (every string `''`, `secure` false, …),
 *   so `getReqCookie('session').value == ''` holds for a request without one and a rule like
 *   `getReqCookie('role').value != 'admin'` applies to it; `has*Cookie` tells the two apart.
 */

/** cel-js's `duration` value class (not exported by the package). */
const DURATION_CTOR = (evaluate("duration('1s')") as object).constructor as new (seconds: bigint, nanos?: number) => object;
/** Go's zero time (0001-01-01T00:00:00Z, CEL's earliest timestamp): `expires` when absent. */
const ZERO_TIME = new Date(Date.parse('0001-01-01T00:00:00Z'));
const ZERO_DURATION = new DURATION_CTOR(0n, 0);
const NO_ATTRIBUTES: ReadonlyMap<string, string> = new Map();

/** A cookie (its CEL type is `Cookie`, registered in `cel.ts`). Built here and never changed after. */
export class CelCookie {
  name = '';
  value = '';
  path = '';
  domain = '';
  expires: Date = ZERO_TIME;
  max_age: object = ZERO_DURATION;
  secure = false;
  http_only = false;
  same_site = '';
  unparsed_attributes = NO_ATTRIBUTES as Map<string, string>;
}

/** What `get*Cookie` returns for a cookie that is not there. */
export const CEL_NO_COOKIE = new CelCookie();

/** An HTTP token (RFC 9110 `tchar`+): what a cookie name must be. */
const TOKEN_RE = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

const isOws = (c: number) => c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d;

/** `s.slice(from, to)` without the spaces, tabs, CRs and LFs at either end (Go's `textproto.TrimString`). */
function trimmed(s: string, from = 0, to = s.length): string {
  while (from < to && isOws(s.charCodeAt(from))) from++;
  while (to > from && isOws(s.charCodeAt(to - 1))) to--;
  return from === 0 && to === s.length ? s : s.slice(from, to);
}

/** A cookie value as Go's `parseCookieValue` takes it: null when it holds a character a value may not. */
function cookieValue(raw: string, allowQuotes: boolean): string | null {
  let v = raw;
  if (allowQuotes && v.length > 1 && v.charCodeAt(0) === 0x22 && v.charCodeAt(v.length - 1) === 0x22) v = v.slice(1, -1);
  for (let i = 0; i < v.length; i++) {
    const c = v.charCodeAt(i);
    if (c < 0x20 || c >= 0x7f || c === 0x22 || c === 0x3b || c === 0x5c) return null;
  }
  return v;
}

/**
 * `getReqCookie(name)` / `hasReqCookie(name)`: the first cookie of that name the request sent
 * (its `Cookie` header values, in order), or `CEL_NO_COOKIE`. The header is searched for the
 * name (a native scan); only where it starts a part (after `;` or the line's start, and spaces)
 * and ends the part's name (spaces, then `=`, `;` or the end) is the value read: a header of
 * thousands of other cookies costs a scan, not a split. After an occurrence that is not the
 * cookie, the search goes on after the next `;` (no later occurrence in that part can start it),
 * so it stays linear whatever the name.
 */
export function requestCookie(lines: readonly string[], name: string): CelCookie {
  if (!TOKEN_RE.test(name)) return CEL_NO_COOKIE;
  for (const line of lines) {
    const n = line.length;
    let from = 0;
    while (from < n) {
      const at = line.indexOf(name, from);
      if (at < 0) break;
      let next = line.indexOf(';', at);
      if (next < 0) next = n;
      from = next + 1;
      let s = at - 1;
      while (s >= 0 && isOws(line.charCodeAt(s))) s--;
      if (s >= 0 && line.charCodeAt(s) !== 0x3b /* ; */) continue;
      let e = at + name.length;
      while (e < next && isOws(line.charCodeAt(e))) e++;
      if (e < next && line.charCodeAt(e) !== 0x3d /* = */) continue;
      // The value: after `=` to the end of the part, its trailing spaces trimmed; none without `=`.
      let end = next;
      while (end > e && isOws(line.charCodeAt(end - 1))) end--;
      const v = e < next ? cookieValue(line.slice(e + 1, end), true) : '';
      if (v === null) continue;
      const c = new CelCookie();
      c.name = name;
      c.value = v;
      return c;
    }
  }
  return CEL_NO_COOKIE;
}

/**
 * The name and value of a `Set-Cookie` line, and where its attributes start; null when it has
 * no `=` or its value does not read, or (given `name`) when it sets another cookie.
 */
function setCookieHead(raw: string, name?: string): { line: string; name: string; value: string; rest: number } | null {
  if (name !== undefined && raw.indexOf(name) < 0) return null;
  const line = trimmed(raw);
  let semi = line.indexOf(';');
  if (semi < 0) semi = line.length;
  const first = trimmed(line, 0, semi);
  const eq = first.indexOf('=');
  if (eq < 0) return null;
  const n = trimmed(first, 0, eq);
  if (name !== undefined && n !== name) return null;
  const value = cookieValue(first.slice(eq + 1), true);
  return value === null ? null : { line, name: n, value, rest: semi + 1 };
}

/**
 * `getResCookie(name)`: the response's cookie of that name with the longest path (the first at a
 * tie), or `CEL_NO_COOKIE`.
 */
export function responseCookie(lines: readonly string[], name: string): CelCookie {
  if (!TOKEN_RE.test(name)) return CEL_NO_COOKIE;
  let best: CelCookie = CEL_NO_COOKIE;
  for (const raw of lines) {
    const head = setCookieHead(raw, name);
    if (!head) continue;
    const c = new CelCookie();
    c.name = name;
    c.value = head.value;
    readAttributes(c, head.line, head.rest);
    if (best === CEL_NO_COOKIE || c.path.length > best.path.length) best = c;
  }
  return best;
}

/**
 * `res.cookies`: every cookie the response sets (one per `Set-Cookie` line whose name is an HTTP
 * token and whose value reads, as Go's `readSetCookies` takes them), name → the cookies of that
 * name, longest path first (the order sent at a tie), as ngrok documents it. A response carries
 * at most RESPONSE_LIMITS.headers lines, which bounds the map.
 */
export function responseCookies(lines: readonly string[]): Map<string, CelCookie[]> {
  const out = new Map<string, CelCookie[]>();
  for (const raw of lines) {
    const head = setCookieHead(raw);
    if (!head || !TOKEN_RE.test(head.name)) continue;
    const c = new CelCookie();
    c.name = head.name;
    c.value = head.value;
    readAttributes(c, head.line, head.rest);
    const list = out.get(head.name);
    if (list) list.push(c);
    else out.set(head.name, [c]);
  }
  // Array#sort is stable: at a tie, the order sent.
  for (const list of out.values()) if (list.length > 1) list.sort((a, b) => b.path.length - a.path.length);
  return out;
}

const SAME_SITE: Record<string, string> = { lax: 'Lax', strict: 'Strict', none: 'None' };
/** strconv.Atoi's syntax; Go refuses a Max-Age with a leading zero (other than `0`). */
const MAX_AGE_RE = /^[+-]?\d{1,18}$/;

/** Whether `line` holds `lower` (lower-case ASCII) at `at`, its letters in any case. */
function attrIs(line: string, at: number, len: number, lower: string): boolean {
  if (len !== lower.length) return false;
  for (let i = 0; i < len; i++) {
    const c = line.charCodeAt(at + i);
    const l = lower.charCodeAt(i);
    if (c !== l && !(l >= 0x61 && l <= 0x7a && c === l - 0x20)) return false;
  }
  return true;
}

/** Whether `line` has only ASCII characters from `from` to `to`. */
function isAscii(line: string, from: number, to: number): boolean {
  for (let i = from; i < to; i++) if (line.charCodeAt(i) > 0x7f) return false;
  return true;
}

/**
 * The attributes of a `Set-Cookie` line from `from`, as Go's `readSetCookies` reads them: each
 * `;`-separated part trimmed, its name (before the first `=`, as written) compared in any case;
 * a part whose name is not ASCII is dropped, one whose value is not a valid cookie value (or
 * that Go does not know, or a Max-Age or Expires it cannot read) kept in `unparsed_attributes`.
 * One pass, slicing only the parts it keeps.
 */
/**
 * Calls `part(a, eq, b)` for each `;`-separated part of `line` from `from`, trimmed of spaces,
 * tabs, CRs and LFs (`[a, b)`), empty ones skipped; `eq` is the index of its first `=`, or `b`
 * without one. `part` returns false to stop.
 */
function eachPart(line: string, from: number, part: (a: number, eq: number, b: number) => boolean | void): void {
  let i = from;
  const n = line.length;
  while (i < n) {
    let j = line.indexOf(';', i);
    if (j < 0) j = n;
    let a = i;
    let b = j;
    i = j + 1;
    while (a < b && isOws(line.charCodeAt(a))) a++;
    while (b > a && isOws(line.charCodeAt(b - 1))) b--;
    if (a === b) continue;
    let eq = a;
    while (eq < b && line.charCodeAt(eq) !== 0x3d /* = */) eq++;
    if (part(a, eq, b) === false) return;
  }
}

/**
 * Most cookies `req.cookies` holds: a request that sends more is not read (reading `req.cookies`
 * is an evaluation error), which bounds what building the map costs (`cost.ts`). Browsers send
 * at most a few hundred (Chrome keeps 180 per domain).
 */
export const MAX_REQUEST_COOKIES = 1000;

/**
 * `req.cookies`: every cookie of the `Cookie` headers (in order), name → the cookies of that name
 * in the order sent, read as `getReqCookie` reads one (Go's `http.Request.Cookies`): each part's
 * name (before its first `=`, trimmed) an HTTP token and its value (after it; `""` without one)
 * as `cookieValue` takes it; other parts are skipped. Each cookie has only its name and value, as
 * ngrok's request cookies do. Throws past `MAX_REQUEST_COOKIES`.
 */
export function requestCookies(lines: readonly string[]): Map<string, CelCookie[]> {
  const out = new Map<string, CelCookie[]>();
  let count = 0;
  for (const line of lines) {
    eachPart(line, 0, (a, eq, b) => {
      let ne = eq;
      while (ne > a && isOws(line.charCodeAt(ne - 1))) ne--;
      const name = line.slice(a, ne);
      if (!TOKEN_RE.test(name)) return;
      const value = eq < b ? cookieValue(line.slice(eq + 1, b), true) : '';
      if (value === null) return;
      if (++count > MAX_REQUEST_COOKIES) throw new Error(`req.cookies: the request has more than ${MAX_REQUEST_COOKIES} cookies`);
      const c = new CelCookie();
      c.name = name;
      c.value = value;
      const list = out.get(name);
      if (list) list.push(c);
      else out.set(name, [c]);
    });
  }
  return out;
}

function readAttributes(c: CelCookie, line: string, from: number): void {
  let unparsed: Map<string, string> | undefined;
  eachPart(line, from, (a, eq, b) => {
    if (!isAscii(line, a, eq)) return;
    const len = eq - a;
    const val = cookieValue(eq < b ? line.slice(eq + 1, b) : '', false);
    if (val !== null) {
      if (len === 4 && attrIs(line, a, len, 'path')) {
        c.path = val;
        return;
      }
      if (len === 6 && attrIs(line, a, len, 'domain')) {
        c.domain = val;
        return;
      }
      if (len === 6 && attrIs(line, a, len, 'secure')) {
        c.secure = true;
        return;
      }
      if (len === 8 && attrIs(line, a, len, 'httponly')) {
        c.http_only = true;
        return;
      }
      if (len === 8 && attrIs(line, a, len, 'samesite')) {
        c.same_site = SAME_SITE[val.toLowerCase()] ?? '';
        return;
      }
      if (len === 7 && attrIs(line, a, len, 'max-age')) {
        if (MAX_AGE_RE.test(val)) {
          const secs = BigInt(val);
          if (secs === 0n || val.charCodeAt(0) !== 0x30) {
            c.max_age = new DURATION_CTOR(secs <= 0n ? -1n : secs, 0);
            return;
          }
        }
      } else if (len === 7 && attrIs(line, a, len, 'expires')) {
        const t = cookieDate(val);
        c.expires = t ?? ZERO_TIME;
        if (t) return;
      }
    }
    (unparsed ??= new Map()).set(line.slice(a, eq), eq < b ? line.slice(eq + 1, b) : '');
  });
  if (unparsed) c.unparsed_attributes = unparsed;
}

const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];
/**
 * `Mon, 02 Jan 2006 15:04:05 MST` (RFC 1123) or `Mon, 02-Jan-2006 15:04:05 MST`, Go's two forms.
 * The zone is an abbreviation, read as UTC (Go gives an abbreviation it does not know a zero
 * offset; ngrok's servers run in UTC).
 */
const DATE_RE = /^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), (\d\d)([ -])(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)\2(\d{4}) (\d\d?):(\d\d):(\d\d) [A-Z]{3,4}$/;

/** An `Expires` date, or null when Go would not read it. */
function cookieDate(s: string): Date | null {
  const m = DATE_RE.exec(s);
  if (!m) return null;
  const [day, month, year, h, min, sec] = [Number(m[1]), MONTHS.indexOf(m[3]!), Number(m[4]), Number(m[5]), Number(m[6]), Number(m[7])];
  if (h > 23 || min > 59 || sec > 59 || day < 1) return null;
  const d = new Date(0);
  d.setUTCFullYear(year, month, day);
  d.setUTCHours(h, min, sec, 0);
  return d.getUTCDate() === day ? d : null;
}
