/**
 * CEL for traffic policies: the variables and macros expressions may use, compiled once with
 * `@marcbachmann/cel-js` (parse + type-check), evaluated per request by the ingress.
 *
 * Variables (ngrok's names where they exist):
 * - `req.method`, `req.host` (lower-case, no port), `req.path`, `req.query` (raw, without `?`),
 *   `req.user_agent` (the `User-Agent`; compares as a string) with ngrok's parsed `.name`,
 *   `.version`, `.os`, `.os_version`, `.device`, `.is_mobile`, `.is_tablet`, `.is_desktop`,
 *   `.is_bot`, `.url` (`user-agent-vars.ts`), `req.headers` (map: lower-case name → list of values),
 *   `req.url` (the full URL; compares and concatenates as a string) with `req.url.scheme`,
 *   `.host`, `.authority`, `.path`, `.query`, `.raw_query`, `.query_params` (map → list, as Go's
 *   `url.ParseQuery` reads the query: `parseQueryValues`),
 *   `.port` (int: the URL's, else the scheme's default), `.raw` and `.raw_path` (as the client
 *   sent them, un-normalized).
 * - `req.version` (`HTTP/1.1`), `req.content_length` (int: `Content-Length`; -1 for a body of
 *   unknown length, chunked; 0 without a body), `req.content_type` (the media type; compares and
 *   concatenates as a string) with `.raw` and `.parameters` (map), `req.cookies` (map: name →
 *   list of `Cookie`), `req.ts.header_received` (timestamp), `req.content_encoding` (list of
 *   the `Content-Encoding` codings, lower-case), `req.location` (the `Location` header). See `CelRequest`.
 * - `conn.client_ip`, `conn.client_port` (int), `conn.server_ip`, `conn.server_port` (int),
 *   `conn.bytes_in` / `conn.bytes_out` (int: the client connection's bytes so far, on the wire),
 *   `conn.ts.start` (timestamp: when it was accepted), `conn.server_region` (the node's id).
 * - `conn.geo.{city, country, country_code, latitude, longitude, radius, subdivision}`, all
 *   strings as ngrok's (`""` for an address the GeoIP database does not hold; an evaluation
 *   error on an ingress without a database; see `geo-vars.ts` and the ingress's `geo.ts`).
 * - `conn.tls.{version, cipher_suite, sni, negotiated_alpn, session_resumed, ja4_fingerprint}` and the client
 *   and server certificates `conn.tls.client.*` / `conn.tls.server.*` (ngrok's names):
 *   `issuer` / `subject` (as strings, RFC 2253-like, with `.common_name`, `.country`, …),
 *   `san` (as a string, with `.dns_names`, `.email_addresses`, `.ip_addresses`, `.uris`),
 *   `serial_number`, `signature_algorithm`, `validity.{not_before, not_after}`,
 *   `extensions[i].{id, critical, value}`, and `conn.tls.client.pem`. See `CelTls`.
 * - `res.status_code` (int), `res.headers`, `res.content_length` (int; -1 when not known),
 *   `res.content_type` (as `req.content_type`), `res.content_encoding`, `res.location` (as the
 *   request's), `res.cookies` (map: name → list of `Cookie`, longest path first) — outbound rules only.
 * - `endpoint.{id, host, port, protocol, addr}`: the edge (or Bind endpoint) at the hostport that
 *   served the request (`CelEndpoint`).
 * - Other ngrok variables and macros (`req.trailers`, `conn.k8s.*`,
 *   `secrets.get()`, …) do not compile, and the message names them (`unsupportedNgrokName`).
 * - `actions.ngrok.rate_limit.{bucket_key, limited, error.code, error.message}` and the same
 *   under `actions.service.rate_limit` — the last rate-limit action's result.
 * - `actions.ngrok.restrict_ips.{action, matched_cidr, error.code, error.message}` and
 *   `actions.ngrok.basic_auth.credentials.{presented, username, authorized}` (also under
 *   `actions.service`) — the last restrict-ips / basic-auth action's result.
 * - `actions.ngrok.url_rewrite.{matches, url, error.code, error.message}` and the same under
 *   `actions.ngrok.redirect` (also under `actions.service`) — see `url-action-vars.ts`.
 * - `actions.ngrok.jwt_validation.tokens[i].{header, payload, signature, verified, location,
 *   location_property}` and `.error.{code, message}` (also under `actions.service`) — see
 *   `jwt-action-vars.ts`.
 * - `actions.ngrok.verify_webhook.{verified, error.code, error.message}` and
 *   `actions.ngrok.compress.{already_compressed, negotiated_algorithm}` (also under
 *   `actions.service`) — see `body-action-vars.ts`.
 * - `actions.ngrok.oauth.{identity.{id, email, name, provider_user_id, current_provider_session_id},
 *   expires_at, …}` and `actions.ngrok.oidc.{identity.{…, current_session_id}, …}` (also under
 *   `actions.service`) — see `auth-action-vars.ts`.
 * - `time.now` (timestamp).
 * - `vars.<name>`: what `set-vars` actions of the same direction set before (a map of `dyn`;
 *   see `var-actions.ts`).
 * Macros (ngrok's, https://ngrok.com/docs/traffic-policy/macros/): `getReqHeader(name)`,
 * `getResHeader(name)` (outbound) → list of values, case-insensitive, `[]` when absent;
 * `hasReqHeader(name)`, `hasResHeader(name)` (outbound) → bool, case-insensitive;
 * `getQueryParam(name)` → list of values, `hasQueryParam(name)` → bool (names exact);
 * `getReqCookie(name)`, `getResCookie(name)` (outbound) → a `Cookie` (`name`, `value`, `path`,
 * `domain`, `expires`, `max_age`, `secure`, `http_only`, `same_site`, `unparsed_attributes`;
 * an empty one when absent), `hasReqCookie(name)`, `hasResCookie(name)` (outbound) → bool
 * (cookie names exact; see `cookie-vars.ts`); `inCidrRange(ip, cidr)`, `inCidrRanges(ip,
 * [cidrs])` → bool, IPv4 and IPv6, an IPv4-mapped address as IPv4 (see `cidr-macros.ts`; a
 * literal invalid CIDR does not compile).
 * `s.matches(re)` / `matches(s, re)` (strings, and `req.url` and certificate names as their
 * strings) run RE2, not the library's backtracking JavaScript `RegExp`: see `matchesMacro`; a
 * string over `MAX_MATCH_INPUT` characters is not searched (an evaluation error).
 * ngrok's string, base64, URL, hash and JSON macros (`s.lower()`, `s.upper()`, `s.replace()`,
 * `s.charAt()`, `s.reverse()`, `base64.decode()` / `.encode()`, `s.encodeBase64()`,
 * `s.decodeBase64()`, `url.escape()` / `.unescape()`, `s.escapeUrl()`, `s.unescapeUrl()`,
 * `hash.md5|sha1|sha256|sha512|crc32|crc64|xxhash64()`, `s.sha256()`, …, `s.isJson()`,
 * `json.decode()`, `s.decodeJson()`, `json.encode()`, `encodeJson()`, `strings.quote()`,
 * `queryString.decode()` / `.encode()`, `s.decodeQueryString()`, `m.encodeQueryString()`,
 * `url.parse()`, `s.parseUrl()`, `s.isURL()`, `basic_auth.encode()`, `lists.range()`,
 * `rand.double()`, `rand.int()`, `s.isQueryString()`, `s.isPrivateIp()`, `s.format(list)`, and
 * the list methods `slice()`, `flatten()`, `sort()`, `sortBy()`, `distinct()`): see
 * `ngrok-macros.ts`, with their costs in `cost.ts`.
 * `s.indexOf()`, `s.lastIndexOf()`, `s.substring()` count code points, as cel-go's (ngrok's)
 * do, not the library's UTF-16 units (`string-index.ts`); the timestamp accessors that take a
 * time zone (`t.getHours(tz)`, …) take cel-go's fixed offsets (`'+05:30'`) as well as IANA
 * names (`time-zones.ts`).
 *
 * A saved policy's expressions are also costed (`cost.ts`): one whose worst case per request is
 * too slow is refused.
 */
import { Environment, type ParseResult } from '@marcbachmann/cel-js';
import {
  CelActionResults,
  CelAddHeaders,
  CelActions,
  CelBasicAuth,
  CelBasicAuthCredentials,
  CelCertificate,
  CelCertificateExtension,
  CelCertificateValidity,
  CelClientCertificate,
  CelConn,
  CelConnTimestamps,
  CelEndpoint,
  CelContentType,
  CelDistinguishedName,
  CelRateLimit,
  CelRateLimitError,
  CelRequest,
  CelRequestTimestamps,
  CelResponse,
  CelRestrictIps,
  CelRestrictIpsError,
  CelSubjectAltNames,
  CelTime,
  CelTls,
  CelUrl,
} from './cel-vars.js';
import { CelUserAgent } from './user-agent-vars.js';
import type { RegexCostInfo } from './cost.js';
import { cachedRegex, compileRegex, MAX_MATCH_INPUT, MAX_POLICY_REGEX_PROGRAM_SIZE, RegexError, regexCostInfo, regexSearch, type DfaExploreBudget } from './regex.js';
import type { PolicyDirection } from './types.js';
import { CelUrlActionError, CelUrlActionResult } from './url-action-vars.js';
import { CelJwtToken, CelJwtValidation, CelJwtValidationError } from './jwt-action-vars.js';
import { CelCompress, CelVerifyWebhook, CelVerifyWebhookError } from './body-action-vars.js';
import { CelGeo } from './geo-vars.js';
import { CelAuthError, CelOAuth, CelOAuthIdentity, CelOidc, CelOidcIdentity } from './auth-action-vars.js';
import { CEL_NO_COOKIE, CelCookie } from './cookie-vars.js';
import { cidrProblem, inCidr, matchAddress, parseMatchCidr, type MatchCidr } from './cidr-macros.js';
import type { RE2JS } from 're2js';
import { registerNgrokMacros } from './ngrok-macros.js';
import { registerCodePointStringMethods } from './string-index.js';
import type { CheckedType, MacroCall as AnyMacroCall, MacroChecker, MacroEvaluator } from './macro-hooks.js';
import { registerZonedAccessors } from './time-zones.js';
import { codePoints, goTimeText } from './cel-values.js';
import { escapesAsReplacement } from '../http-headers.js';

/** A compiled expression: call with an activation (`{req, conn, actions, time[, res]}`). */
export type CelProgram = ParseResult;

/** An expression that does not compile; `reason` is one line, with the column. */
export class CelCompileError extends Error {
  constructor(readonly reason: string) {
    super(reason);
    this.name = 'CelCompileError';
  }
}

type MacroCall = AnyMacroCall<{ op: string; args: unknown }>;
interface MacroCtx {
  getValue(name: string): unknown;
}

/**
 * A `fn(name)` macro that reads a lookup off a variable (`req.header(name)`, …): `type` is its
 * result type, `absent` its result for a name that is not a string (a `dyn` at evaluation).
 */
function nameMacro<T>(fn: string, type: (checker: MacroChecker) => unknown, read: (ctx: MacroCtx, key: string) => T, absent: () => T) {
  return ({ args }: { args: unknown[] }) => ({
    arg: args[0],
    typeCheck(checker: MacroChecker, macro: { arg: unknown }, ctx: unknown) {
      const t = checker.check(macro.arg, ctx);
      if (t.name !== 'string' && t.kind !== 'dyn') throw checker.createError('invalid_argument', `${fn}() takes a string, got ${t.name}`, macro.arg);
      return type(checker);
    },
    evaluate(ev: MacroEvaluator, macro: { arg: unknown }, ctx: MacroCtx) {
      const key = ev.run(macro.arg, ctx);
      return typeof key === 'string' ? read(ctx, key) : absent();
    },
  });
}

/** A `name(string): list<string>` macro (`getReqHeader`, …): `[]` when absent. */
function lookupMacro(fn: string, read: (ctx: MacroCtx, key: string) => string[]) {
  return nameMacro(fn, (c) => c.registry.getListType(c.stringType), read, () => []);
}

/** A `name(string): bool` macro (`hasReqHeader`, …). */
function presenceMacro(fn: string, test: (ctx: MacroCtx, key: string) => boolean) {
  return nameMacro(fn, (c) => c.boolType, test, () => false);
}

/** A `name(string): Cookie` macro (`getReqCookie`, `getResCookie`): an empty cookie when absent. */
function cookieMacro(fn: string, read: (ctx: MacroCtx, key: string) => CelCookie) {
  return nameMacro(fn, (c) => c.registry.getType('Cookie'), read, () => CEL_NO_COOKIE);
}

const reqOf = (ctx: MacroCtx) => ctx.getValue('req') as CelRequest | undefined;
const resOf = (ctx: MacroCtx) => ctx.getValue('res') as CelResponse | undefined;

/** A parsed call argument (cel-js AST node). */
interface ArgNode {
  op: string;
  args: unknown;
}
const stringLiteral = (n: ArgNode): string | undefined => (n.op === 'value' && typeof n.args === 'string' ? n.args : undefined);
const isStringType = (t: CheckedType | undefined) => t !== undefined && (t.kind === 'dyn' || t.name === 'string');

/**
 * `inCidrRange(ip, cidr)` (`many` false) and `inCidrRanges(ip, [cidr, …])` (`many`): see
 * `cidr-macros.ts`. Literal CIDRs (a string, or a list literal of strings only) are parsed once
 * per parse (a policy), and an invalid one does not compile (a 400 when the policy is saved);
 * computed ones are parsed at each evaluation, and an invalid one is false / skipped, as ngrok
 * documents. The cost estimate (`cost.ts`) reads `literalCidrs`.
 */
function cidrMacro(many: boolean) {
  const fn = many ? 'inCidrRanges' : 'inCidrRange';
  return ({ ast, args }: MacroCall) => {
    const ipArg = args[0]!;
    const cidrArg = args[1]!;
    const nodes = many ? (cidrArg.op === 'list' ? (cidrArg.args as ArgNode[]) : undefined) : [cidrArg];
    let literal: MatchCidr[] | undefined;
    let literalError: string | undefined;
    if (nodes && nodes.every((n) => stringLiteral(n) !== undefined)) {
      literal = [];
      for (const n of nodes) {
        const text = n.args as string;
        const c = parseMatchCidr(text);
        if (c) literal.push(c);
        else literalError ??= `${fn}(): ${cidrProblem(text)}`;
      }
    }
    const matchComputed = (addr: number[], v: unknown, ev: MacroEvaluator): boolean => {
      if (!many) {
        if (typeof v !== 'string') throw ev.createError('no_matching_overload', `${fn}() needs a string CIDR, got ${v === null ? 'null' : typeof v}`, cidrArg);
        const c = parseMatchCidr(v);
        return c !== null && inCidr(addr, c);
      }
      if (!Array.isArray(v)) throw ev.createError('no_matching_overload', `${fn}() needs a list of CIDRs, got ${v === null ? 'null' : typeof v}`, cidrArg);
      for (const e of v as unknown[]) {
        if (typeof e !== 'string') throw ev.createError('no_matching_overload', `${fn}() needs a list of string CIDRs, got an element of type ${e === null ? 'null' : typeof e}`, cidrArg);
        const c = parseMatchCidr(e);
        if (c && inCidr(addr, c)) return true;
      }
      return false;
    };
    return {
      literalCidrs: literal?.length,
      typeCheck(checker: MacroChecker, _macro: unknown, ctx: unknown) {
        const it = checker.check(ipArg, ctx);
        const ct = checker.check(cidrArg, ctx);
        const cidrOk = many ? ct.kind === 'dyn' || (ct.kind === 'list' && (isStringType(ct.valueType) || ct.valueType?.kind === 'param')) : isStringType(ct);
        if (!isStringType(it) || !cidrOk) throw checker.createError('no_matching_overload', `found no matching overload for '${fn}(${it.name}, ${ct.name})'`, ast);
        if (literalError) throw checker.createError('invalid_argument', literalError, cidrArg);
        return checker.boolType;
      },
      evaluate(ev: MacroEvaluator, _macro: unknown, ctx: unknown): boolean {
        const ip = ev.run(ipArg, ctx);
        if (typeof ip !== 'string') throw ev.createError('no_matching_overload', `${fn}() needs a string address, got ${ip === null ? 'null' : typeof ip}`, ipArg);
        const computed = literal ? undefined : ev.run(cidrArg, ctx);
        const addr = matchAddress(ip);
        if (!addr) return false;
        if (!literal) return matchComputed(addr, computed, ev);
        for (const c of literal) if (inCidr(addr, c)) return true;
        return false;
      },
    };
  };
}

/**
 * Object types that stand for a string where one is expected (`==`, `+`, `string()`,
 * `startsWith`, `endsWith`, `contains`, `size()`, `in [list]`, `matches()`) and also have
 * fields: `req.url`, a certificate's `issuer` / `subject` and `san`, and `req.content_type` /
 * `res.content_type`, which ngrok types as strings with fields.
 */
const STRING_LIKE = ['URL', 'DistinguishedName', 'SubjectAltNames', 'ContentType', 'UserAgent'] as const;

function stringLikeText(v: unknown): string | undefined {
  return v instanceof CelUrl || v instanceof CelDistinguishedName || v instanceof CelSubjectAltNames || v instanceof CelContentType || v instanceof CelUserAgent ? v.toString() : undefined;
}

/** The error code a refused `matches()` pattern carries (compile and evaluation time). */
const REGEX_ERROR = 'invalid_regular_expression';

/** What is left of the current policy's regexp budget (see `withPolicyRegexBudget`). */
let policyBudget: { left: number; total: number } | null = null;

/**
 * Runs `fn` (which compiles one policy's expressions, synchronously) with one budget for the
 * total program size of its literal `matches()` patterns: past it, the expression that tips it
 * over does not compile. Without this wrapper (the ingress recompiling saved policies) there is
 * no policy-wide limit.
 */
export function withPolicyRegexBudget<T>(fn: () => T, total = MAX_POLICY_REGEX_PROGRAM_SIZE): T {
  const outer = policyBudget;
  policyBudget = { left: total, total };
  try {
    return fn();
  } finally {
    policyBudget = outer;
  }
}

/**
 * Charges a pattern of `programSize` RE2 instructions compiled outside `matches()` (the
 * url-rewrite / redirect `from`, `url-actions.ts`) to the current policy's budget (see
 * `withPolicyRegexBudget`): the message to refuse it with when that takes the policy over.
 */
export function chargePolicyRegexBudget(programSize: number): string | undefined {
  if (policyBudget && (policyBudget.left -= programSize) < 0) return `the policy's patterns are too large together (more than ${policyBudget.total} RE2 instructions)`;
  return undefined;
}

/**
 * `matches()` through RE2. cel-js implements CEL's `string.matches(string)` with JavaScript's
 * backtracking `RegExp` and refuses a second `string.matches` overload, so the call is taken over
 * as a macro instead: macros are looked up while parsing by name, receiver-or-not and argument
 * count only, so `URL.matches(ast)` (a receiver type that does not overlap the built-in
 * `string.matches`) expands every `x.matches(re)` call, and `matches(ast, ast)` every global
 * one. The macro type-checks the operands itself (a string or one of `STRING_LIKE`, and a
 * string pattern), so the built-in is never reached; `assertRe2Matches` checks that at
 * start-up. A literal pattern is compiled here, once per parse (a policy); a computed one at
 * evaluation, through a cache. A string over `MAX_MATCH_INPUT` characters is not searched: an
 * evaluation error.
 */
function matchesMacro(receiverForm: boolean) {
  return ({ ast, args, receiver }: MacroCall) => {
    const subject = receiverForm ? receiver : args[0];
    const pattern = receiverForm ? args[0]! : args[1]!;
    let literal: RE2JS | undefined;
    let literalError: string | undefined;
    if (pattern.op === 'value' && typeof pattern.args === 'string') {
      try {
        literal = compileRegex(pattern.args);
        if (policyBudget && (policyBudget.left -= literal.programSize()) < 0) {
          literal = undefined;
          literalError = `matches(): the policy's patterns are too large together (more than ${policyBudget.total} RE2 instructions)`;
        }
      } catch (err) {
        if (!(err instanceof RegexError)) throw err;
        literalError = `matches(): ${err.message}`;
      }
    }
    // What the cost estimate (`cost.ts`) reads off this call, worked out only when it asks (the
    // ingress compiling a saved policy never does); a computed pattern is costed as the largest
    // one allowed.
    let info: RegexCostInfo | undefined;
    const regexCost = (budget: DfaExploreBudget, smallProgram: number): RegexCostInfo => (info ??= literal ? regexCostInfo(literal, budget, smallProgram) : {});
    return {
      regexCost,
      typeCheck(checker: MacroChecker, _macro: unknown, ctx: unknown) {
        const st = checker.check(subject, ctx);
        const pt = checker.check(pattern, ctx);
        const subjectOk = st.kind === 'dyn' || st.name === 'string' || (STRING_LIKE as readonly string[]).includes(st.name);
        if (!subjectOk || !(pt.kind === 'dyn' || pt.name === 'string')) {
          const sig = receiverForm ? `${st.name}.matches(${pt.name})` : `matches(${st.name}, ${pt.name})`;
          throw checker.createError('no_matching_overload', `found no matching overload for '${sig}'`, ast);
        }
        if (literalError) throw checker.createError(REGEX_ERROR, literalError, pattern);
        return checker.boolType;
      },
      evaluate(ev: MacroEvaluator, _macro: unknown, ctx: unknown): boolean {
        const s = ev.run(subject, ctx);
        const text = typeof s === 'string' ? s : stringLikeText(s);
        if (text === undefined) throw ev.createError('no_matching_overload', `matches() needs a string, got ${s === null ? 'null' : typeof s}`, ast);
        let re = literal;
        if (!re) {
          const p = ev.run(pattern, ctx);
          if (typeof p !== 'string') throw ev.createError('no_matching_overload', `matches() needs a string pattern, got ${p === null ? 'null' : typeof p}`, pattern);
          try {
            re = cachedRegex(p);
          } catch (err) {
            if (err instanceof RegexError) throw ev.createError(REGEX_ERROR, `matches(): ${err.message}`, pattern);
            throw err;
          }
        }
        // Past MAX_MATCH_INPUT characters: an evaluation error (the rule does not apply).
        if (text.length > MAX_MATCH_INPUT) throw ev.createError('invalid_argument', `matches(): string too long to search (${text.length} characters, at most ${MAX_MATCH_INPUT})`, ast);
        // A header's byte in no UTF-8 sequence (`headerText`'s escape) is U+FFFD to the pattern, as Go's regexp reads it.
        return regexSearch(re, escapesAsReplacement(text));
      },
    };
  };
}

/**
 * Start-up check that `matches()` reaches `matchesMacro` in both forms (a cel-js upgrade that
 * changed how macros are found would otherwise silently bring back backtracking regexps).
 */
function assertRe2Matches(env: Environment): void {
  for (const src of [`'a'.matches('(?=a)')`, `matches('a', '(?=a)')`, `req.url.matches('(?=a)')`]) {
    const checked = env.parse(src).check();
    if (checked.valid || (checked.error as { code?: string } | undefined)?.code !== REGEX_ERROR) {
      throw new Error(`traffic policy CEL: matches() does not run through RE2 (${src}); refusing to start`);
    }
  }
}

/**
 * Start-up check that `indexOf()` / `substring()` count code points and the zoned timestamp
 * accessors take offsets (`string-index.ts`, `time-zones.ts`): a cel-js upgrade that changed how
 * macros are found would otherwise silently bring back the library's UTF-16 indices.
 */
function assertCelGoSemantics(env: Environment): void {
  const src = `'\u{1F600}a'.indexOf('a') == 1 && '\u{1F600}ab'.lastIndexOf('a', 1) == 1 && '\u{1F600}ab'.substring(1, 2) == 'a' && timestamp(0).getHours('+05:30') == 5`;
  let ok: unknown;
  try {
    ok = env.parse(src)({});
  } catch {
    ok = false;
  }
  if (ok !== true) throw new Error(`traffic policy CEL: indexOf()/substring() or zoned timestamp accessors are not cel-go's (${src}); refusing to start`);
}

function baseEnvironment(): Environment {
  const str = 'string';
  const strList = 'list<string>';
  const certFields = {
    extensions: 'list<CertificateExtension>',
    issuer: 'DistinguishedName',
    san: 'SubjectAltNames',
    serial_number: str,
    signature_algorithm: str,
    subject: 'DistinguishedName',
    validity: 'CertificateValidity',
  };
  const env = new Environment({ homogeneousAggregateLiterals: false, limits: { maxAstNodes: 4096 } })
    .registerType('URL', {
      ctor: CelUrl,
      fields: { scheme: str, host: str, authority: str, path: str, query: str, raw_query: str, query_params: 'map<string, list<string>>', port: 'int', raw: str, raw_path: str },
    })
    .registerType('ContentType', { ctor: CelContentType, fields: { raw: str, parameters: 'map<string, string>' } })
    .registerType('UserAgent', {
      ctor: CelUserAgent,
      fields: { name: str, version: str, os: str, os_version: str, device: str, is_mobile: 'bool', is_tablet: 'bool', is_desktop: 'bool', is_bot: 'bool', url: str },
    })
    .registerType('RequestTimestamps', { ctor: CelRequestTimestamps, fields: { header_received: 'google.protobuf.Timestamp' } })
    .registerType('DistinguishedName', {
      ctor: CelDistinguishedName,
      fields: {
        common_name: str,
        country: strList,
        locality: strList,
        organization: strList,
        organizational_unit: strList,
        postal_code: strList,
        province: strList,
        street_address: strList,
      },
    })
    .registerType('SubjectAltNames', { ctor: CelSubjectAltNames, fields: { dns_names: strList, email_addresses: strList, ip_addresses: strList, uris: strList } })
    .registerType('CertificateExtension', { ctor: CelCertificateExtension, fields: { id: str, critical: 'bool', value: 'bytes' } })
    .registerType('CertificateValidity', { ctor: CelCertificateValidity, fields: { not_before: 'google.protobuf.Timestamp', not_after: 'google.protobuf.Timestamp' } })
    .registerType('Certificate', { ctor: CelCertificate, fields: certFields })
    .registerType('ClientCertificate', { ctor: CelClientCertificate, fields: { ...certFields, pem: str } })
    .registerType('TLS', {
      ctor: CelTls,
      fields: { version: str, cipher_suite: str, sni: str, negotiated_alpn: str, session_resumed: 'bool', ja4_fingerprint: str, client: 'ClientCertificate', server: 'Certificate' },
    })
    .registerType('Cookie', {
      ctor: CelCookie,
      fields: {
        name: str,
        value: str,
        path: str,
        domain: str,
        expires: 'google.protobuf.Timestamp',
        max_age: 'google.protobuf.Duration',
        secure: 'bool',
        http_only: 'bool',
        same_site: str,
        unparsed_attributes: 'map<string, string>',
      },
    })
    .registerType('Request', {
      ctor: CelRequest,
      fields: {
        method: str,
        host: str,
        path: str,
        query: str,
        user_agent: 'UserAgent',
        url: 'URL',
        headers: 'map<string, list<string>>',
        version: str,
        content_length: 'int',
        content_type: 'ContentType',
        cookies: 'map<string, list<Cookie>>',
        ts: 'RequestTimestamps',
        content_encoding: strList,
        location: str,
      },
    })
    .registerType('Geo', {
      ctor: CelGeo,
      fields: { city: str, country: str, country_code: str, latitude: str, longitude: str, radius: str, subdivision: str },
    })
    .registerType('ConnectionTimestamps', { ctor: CelConnTimestamps, fields: { start: 'google.protobuf.Timestamp' } })
    .registerType('Connection', {
      ctor: CelConn,
      fields: { client_ip: str, client_port: 'int', server_ip: str, server_port: 'int', server_region: str, bytes_in: 'int', bytes_out: 'int', ts: 'ConnectionTimestamps', tls: 'TLS', geo: 'Geo' },
    })
    .registerType('Endpoint', { ctor: CelEndpoint, fields: { addr: str, host: str, id: str, port: 'int', protocol: str, url: str } })
    .registerType('RateLimitError', { ctor: CelRateLimitError, fields: { code: str, message: str } })
    .registerType('RateLimitResult', { ctor: CelRateLimit, fields: { bucket_key: str, limited: 'bool', error: 'RateLimitError' } })
    .registerType('RestrictIpsError', { ctor: CelRestrictIpsError, fields: { code: str, message: str } })
    .registerType('RestrictIpsResult', { ctor: CelRestrictIps, fields: { action: str, matched_cidr: str, error: 'RestrictIpsError' } })
    .registerType('BasicAuthCredentials', { ctor: CelBasicAuthCredentials, fields: { presented: 'bool', username: str, authorized: 'bool' } })
    .registerType('BasicAuthResult', { ctor: CelBasicAuth, fields: { credentials: 'BasicAuthCredentials' } })
    .registerType('UrlActionError', { ctor: CelUrlActionError, fields: { code: str, message: str } })
    .registerType('UrlActionResult', { ctor: CelUrlActionResult, fields: { matches: strList, url: str, error: 'UrlActionError' } })
    .registerType('VerifyWebhookError', { ctor: CelVerifyWebhookError, fields: { code: str, message: str } })
    .registerType('VerifyWebhookResult', { ctor: CelVerifyWebhook, fields: { verified: 'bool', error: 'VerifyWebhookError' } })
    .registerType('CompressResult', { ctor: CelCompress, fields: { already_compressed: 'bool', negotiated_algorithm: str } })
    .registerType('JwtValidationError', { ctor: CelJwtValidationError, fields: { code: str, message: str } })
    .registerType('JwtToken', { ctor: CelJwtToken, fields: { header: 'map<string, dyn>', payload: 'map<string, dyn>', signature: str, verified: 'bool', location: str, location_property: str } })
    .registerType('JwtValidationResult', { ctor: CelJwtValidation, fields: { tokens: 'list<JwtToken>', error: 'JwtValidationError' } })
    .registerType('AddHeadersResult', { ctor: CelAddHeaders, fields: { headers_added: 'map<string, string>' } })
    .registerType('ActionResults', { ctor: CelActionResults, fields: { add_headers: 'AddHeadersResult', jwt_validation: 'JwtValidationResult', rate_limit: 'RateLimitResult', restrict_ips: 'RestrictIpsResult', basic_auth: 'BasicAuthResult', url_rewrite: 'UrlActionResult', redirect: 'UrlActionResult', verify_webhook: 'VerifyWebhookResult', compress: 'CompressResult', oauth: 'OAuthResult', oidc: 'OidcResult' } })
    .registerType('AuthError', { ctor: CelAuthError, fields: { code: str, message: str } })
    .registerType('OAuthIdentity', { ctor: CelOAuthIdentity, fields: { id: str, email: str, name: str, provider_user_id: str, current_provider_session_id: str } })
    .registerType('OAuthResult', {
      ctor: CelOAuth,
      fields: { identity: 'OAuthIdentity', error: 'AuthError', access_token: str, refresh_token: str, expires_at: str, session_timed_out: 'bool', session_max_duration_reached: 'bool', userinfo_refreshed: 'bool' },
    })
    .registerType('OidcIdentity', { ctor: CelOidcIdentity, fields: { id: str, email: str, name: str, provider_user_id: str, current_session_id: str } })
    .registerType('OidcResult', {
      ctor: CelOidc,
      fields: { identity: 'OidcIdentity', error: 'AuthError', identity_token: str, access_token: str, refresh_token: str, expires_at: str, session_timed_out: 'bool', session_max_duration_reached: 'bool', user_info_refreshed: 'bool', userinfo_refreshed: 'bool' },
    })
    .registerType('Actions', { ctor: CelActions, fields: { ngrok: 'ActionResults', service: 'ActionResults' } })
    .registerType('Time', { ctor: CelTime, fields: { now: 'google.protobuf.Timestamp' } })
    .registerVariable('req', 'Request')
    .registerVariable('conn', 'Connection')
    .registerVariable('endpoint', 'Endpoint')
    .registerVariable('actions', 'Actions')
    .registerVariable('time', 'Time')
    // `set-vars` variables (`var-actions.ts`): any name, any value; reading an unset one is an
    // evaluation error (`has(vars.x)` tests for it).
    .registerVariable('vars', 'map<string, dyn>');
  // `req.url`, `…issuer`, `…subject` and `…san` behave as their string where a string is expected.
  for (const t of STRING_LIKE) {
    env
      .registerOperator(`${t} == string`, (a: object, b: string) => a.toString() === b)
      .registerOperator(`${t} + string: string`, (a: object, b: string) => a.toString() + b)
      .registerOperator(`string + ${t}: string`, (a: string, b: object) => a + b.toString())
      .registerFunction(`string(${t}): string`, (a: object) => a.toString())
      .registerFunction(`${t}.startsWith(string): bool`, (a: object, b: string) => a.toString().startsWith(b))
      .registerFunction(`${t}.endsWith(string): bool`, (a: object, b: string) => a.toString().endsWith(b))
      .registerFunction(`${t}.contains(string): bool`, (a: object, b: string) => a.toString().includes(b))
      // Code points, as size() of a string counts them (a UTF-16 length counts an emoji twice).
      .registerFunction(`${t}.size(): int`, (a: object) => BigInt(codePoints(a.toString())))
      .registerFunction(`size(${t}): int`, (a: object) => BigInt(codePoints(a.toString())))
      .registerOperator(`${t} in list<string>`, (a: object, l: readonly string[]) => l.includes(a.toString()));
  }
  // CEL's identity `timestamp(timestamp)` and `string(timestamp)`: ngrok documents `time.now` as an
  // RFC 3339 string and writes `timestamp(time.now)` in its examples; Warren's `time.now` is the
  // timestamp itself, so those examples work as written, and `string(…)` gives the text.
  env
    .registerFunction('timestamp(google.protobuf.Timestamp): google.protobuf.Timestamp', (d: Date) => d)
    .registerFunction('string(google.protobuf.Timestamp): string', (d: Date) => goTimeText(d));
  // ngrok's string, base64, URL, hash and JSON macros (`ngrok-macros.ts`).
  registerNgrokMacros(env, STRING_LIKE, stringLikeText);
  // cel-go's indexOf / lastIndexOf / substring (code points) and zoned timestamp accessors
  // (fixed offsets), as macros declared on types of ours that overlap no built-in overload.
  registerCodePointStringMethods(env, 'URL', STRING_LIKE, stringLikeText);
  registerZonedAccessors(env, 'Time');
  env.registerFunction('getReqHeader(ast): list<string>', lookupMacro('getReqHeader', (ctx, k) => reqOf(ctx)?.header(k) ?? []));
  env.registerFunction('hasReqHeader(ast): bool', presenceMacro('hasReqHeader', (ctx, k) => reqOf(ctx)?.hasHeader(k) ?? false));
  env.registerFunction('getQueryParam(ast): list<string>', lookupMacro('getQueryParam', (ctx, k) => reqOf(ctx)?.url.query_params.get(k) ?? []));
  env.registerFunction('hasQueryParam(ast): bool', presenceMacro('hasQueryParam', (ctx, k) => reqOf(ctx)?.url.query_params.has(k) ?? false));
  // ngrok: the request's cookies are available to inbound and outbound rules.
  env.registerFunction('getReqCookie(ast): Cookie', cookieMacro('getReqCookie', (ctx, k) => reqOf(ctx)?.cookie(k) ?? CEL_NO_COOKIE));
  env.registerFunction('hasReqCookie(ast): bool', presenceMacro('hasReqCookie', (ctx, k) => (reqOf(ctx)?.cookie(k) ?? CEL_NO_COOKIE) !== CEL_NO_COOKIE));
  env.registerFunction('inCidrRange(ast, ast): bool', cidrMacro(false));
  env.registerFunction('inCidrRanges(ast, ast): bool', cidrMacro(true));
  env.registerFunction('URL.matches(ast): bool', matchesMacro(true));
  env.registerFunction('matches(ast, ast): bool', matchesMacro(false));
  return env;
}

function buildEnvironments(): Record<PolicyDirection, Environment> {
  const base = baseEnvironment();
  const inbound = base.clone();
  const outbound = base
    .clone()
    .registerType('Response', {
      ctor: CelResponse,
      fields: {
        status_code: 'int',
        headers: 'map<string, list<string>>',
        content_length: 'int',
        content_type: 'ContentType',
        content_encoding: 'list<string>',
        location: 'string',
        cookies: 'map<string, list<Cookie>>',
      },
    })
    .registerVariable('res', 'Response');
  outbound.registerFunction('getResHeader(ast): list<string>', lookupMacro('getResHeader', (ctx, k) => resOf(ctx)?.header(k) ?? []));
  outbound.registerFunction('hasResHeader(ast): bool', presenceMacro('hasResHeader', (ctx, k) => resOf(ctx)?.hasHeader(k) ?? false));
  outbound.registerFunction('getResCookie(ast): Cookie', cookieMacro('getResCookie', (ctx, k) => resOf(ctx)?.cookie(k) ?? CEL_NO_COOKIE));
  outbound.registerFunction('hasResCookie(ast): bool', presenceMacro('hasResCookie', (ctx, k) => (resOf(ctx)?.cookie(k) ?? CEL_NO_COOKIE) !== CEL_NO_COOKIE));
  assertRe2Matches(inbound);
  assertRe2Matches(outbound);
  assertCelGoSemantics(inbound);
  assertCelGoSemantics(outbound);
  return { inbound, outbound };
}

let environments: Record<PolicyDirection, Environment> | undefined;

/** Creating environments is the expensive part: once per process. */
function env(direction: PolicyDirection): Environment {
  return (environments ??= buildEnvironments())[direction];
}

/**
 * ngrok's variables Warren does not have (https://ngrok.com/docs/traffic-policy/variables/, the
 * pages req, res, conn, conn.tls, IP intelligence, endpoint, action): an expression naming one
 * does not compile, and says so (`unsupportedNgrokName`). A name stands for itself and anything
 * under it; one ending in `.*` is a namespace, reported as written (`conn.ts.start`).
 */
const NGROK_VARIABLES_NOT_SUPPORTED: readonly string[] = [
  'req.trailers',
  'req.ts.body_received',
  'req.url.uri',
  'req.url.user_password',
  'res.trailers',
  'conn.k8s.*',
  'conn.client_ip.categories',
  'conn.client_ip.as.*',
  'conn.client_ip.geo.*',
  'conn.server_ip.categories',
  'conn.server_ip.as.*',
  'conn.server_ip.geo.*',
  ...['ai_gateway', 'http_request', 'log', 'remove_headers'].flatMap((a) => [`actions.ngrok.${a}`, `actions.service.${a}`]),
];

/**
 * ngrok's namespaced macros (https://ngrok.com/docs/traffic-policy/macros/) Warren does not have.
 * Every method on that page (string, list and map extensions) is in `ngrok-macros.ts`, so none is
 * refused by name: a call of one that does not compile keeps the library's message.
 */
const NGROK_FUNCTIONS_NOT_SUPPORTED: Readonly<Record<string, readonly string[]>> = {
  secrets: ['get'],
};

/** A cel-js AST node (`op`, `args`, `start`; see `cost.ts`). */
interface AstNode {
  op: string;
  args: unknown;
  start?: number;
}

/** `a.b.c` for a chain of field selections from an identifier, else undefined. */
function selectionPath(n: AstNode): string | undefined {
  const parts: string[] = [];
  let cur = n;
  while (cur.op === '.') {
    const [target, field] = cur.args as [AstNode, string];
    parts.push(field);
    cur = target;
  }
  if (cur.op !== 'id' || typeof cur.args !== 'string') return undefined;
  parts.push(cur.args);
  return parts.reverse().join('.');
}

/** What ngrok name (not supported here) the node is, if any: `conn.ts.start`, `base64.decode()`, `string.format()`. */
function ngrokNameOf(n: AstNode): string | undefined {
  if (n.op === '.' || n.op === 'id') {
    const path = selectionPath(n);
    if (path === undefined) return undefined;
    for (const name of NGROK_VARIABLES_NOT_SUPPORTED) {
      const ns = name.endsWith('.*') ? name.slice(0, -2) : undefined;
      const stem = ns ?? name;
      if (path === stem || path.startsWith(`${stem}.`)) return ns !== undefined ? path : name;
    }
    return undefined;
  }
  if (n.op === 'rcall') {
    const [fn, receiver] = n.args as [string, AstNode];
    if (receiver.op === 'id' && typeof receiver.args === 'string' && NGROK_FUNCTIONS_NOT_SUPPORTED[receiver.args]?.includes(fn)) return `${receiver.args}.${fn}()`;
  }
  return undefined;
}

/**
 * The first ngrok variable or macro Warren does not support that `ast` names (in source order),
 * as `ngrok's X is not supported by Warren (at column N)`; undefined when none. Looked for only
 * when an expression does not compile, so the user reads why instead of the library's
 * "No such key: ts" / "No such key: port" / "found no matching overload".
 */
function unsupportedNgrokName(ast: unknown): string | undefined {
  let best: { name: string; start: number } | undefined;
  const stack: unknown[] = [ast];
  while (stack.length > 0) {
    const x = stack.pop();
    if (!x || typeof x !== 'object') continue;
    if (Array.isArray(x)) {
      for (let i = x.length - 1; i >= 0; i--) stack.push(x[i]);
      continue;
    }
    const n = x as AstNode;
    if (typeof n.op !== 'string') {
      // A comprehension's parts (`iterable`, `step`, …).
      if (Object.getPrototypeOf(x) === Object.prototype) stack.push(...Object.values(x).reverse());
      continue;
    }
    if (n.op === 'value') continue;
    const name = ngrokNameOf(n);
    const start = n.start ?? 0;
    if (name !== undefined) {
      if (!best || start < best.start) best = { name, start };
      // Its parts name nothing more useful (`ts` in `conn.ts.start`).
      if (n.op === '.' || n.op === 'id') continue;
    }
    stack.push(n.args);
  }
  return best && `ngrok's ${best.name} is not supported by Warren (at column ${best.start + 1})`;
}

function describe(err: unknown): string {
  const e = err as { summary?: unknown; message?: unknown; range?: { start: number } };
  const text = typeof e.summary === 'string' ? e.summary : String(e.message ?? err).split('\n')[0]!;
  return e.range ? `${text} (at column ${e.range.start + 1})` : text;
}

/**
 * Compiles one expression for rules of `direction`. A rule expression must be a `bool`
 * (`wantBool`); a header-value interpolation may be of any type. Throws `CelCompileError`.
 */
export function compileExpression(direction: PolicyDirection, source: string, wantBool = true): CelProgram {
  // A compiled program is a pure function of these three (150-200 us and ~17 KB each, most of it
  // the RE2 check of matches() patterns), and ingress nodes compile every route of a config on
  // each change: shared while any live pipeline holds it, so a change costs lookups, not compiles
  // (an audit's 400 routes of 6 expressions each took 0.3-0.4 s per change, applying a backlog
  // minutes), and nothing is kept for programs no route uses any more. What its literal patterns
  // take of a policy's regexp budget (withPolicyRegexBudget) is kept with it and charged again.
  const key = `${direction}\n${wantBool ? 1 : 0}\n${source}`;
  const hit = compiledPrograms.get(key);
  const known = hit?.program.deref();
  if (hit && known) {
    if (!policyBudget || hit.charge === 0) return known;
    if (policyBudget.left >= hit.charge) {
      policyBudget.left -= hit.charge;
      return known;
    }
    // It tips the policy over: compiled under the budget, it fails with the budget's message.
    return compileExpressionUncached(direction, source, wantBool);
  }
  const outer = policyBudget;
  const measuring = { left: Number.MAX_SAFE_INTEGER, total: outer?.total ?? MAX_POLICY_REGEX_PROGRAM_SIZE };
  policyBudget = measuring;
  let program: CelProgram;
  try {
    program = compileExpressionUncached(direction, source, wantBool);
  } finally {
    policyBudget = outer;
  }
  const charge = Number.MAX_SAFE_INTEGER - measuring.left;
  if (outer) {
    if (outer.left < charge) return compileExpressionUncached(direction, source, wantBool);
    outer.left -= charge;
  }
  compiledPrograms.set(key, { program: new WeakRef(program), charge });
  forgetProgram.register(program, key);
  return program;
}

const compiledPrograms = new Map<string, { program: WeakRef<CelProgram>; charge: number }>();
/** Drops a collected program's key (unless a newer program took it meanwhile). */
const forgetProgram = new FinalizationRegistry<string>((key) => {
  if (compiledPrograms.get(key)?.program.deref() === undefined) compiledPrograms.delete(key);
});

function compileExpressionUncached(direction: PolicyDirection, source: string, wantBool: boolean): CelProgram {
  let program: CelProgram;
  try {
    program = env(direction).parse(source);
  } catch (err) {
    throw new CelCompileError(`does not compile: ${describe(err)}`);
  }
  const checked = program.check();
  if (!checked.valid) {
    // A refused matches() pattern says so itself ("matches(): invalid RE2 pattern: …").
    if ((checked.error as { code?: string } | undefined)?.code === REGEX_ERROR) throw new CelCompileError(describe(checked.error));
    // An ngrok name Warren does not have says so.
    const ngrok = unsupportedNgrokName((program as unknown as { ast: unknown }).ast);
    throw new CelCompileError(`does not compile: ${ngrok ?? describe(checked.error)}`);
  }
  if (wantBool && checked.type !== 'bool' && checked.type !== 'dyn') throw new CelCompileError(`must evaluate to a bool, but its type is ${checked.type}`);
  return program;
}

/**
 * `has(a.b.f)` naming a field its message does not have (`has(conn.geo.contry)`), as a message,
 * else undefined. The CEL library compiles it as false, so a typo would quietly keep a rule from
 * ever applying (or always apply its negation); cel-go refuses it, and so does a policy being
 * saved (`validateTrafficPolicy` with `checkCost`; a stored one keeps running as before). The
 * selection alone is checked (in the response phase's environment, which has every variable),
 * so fields of maps (`has(req.headers.x)`, `has(vars.x)`) are fine.
 */
export function unknownHasField(program: CelProgram): string | undefined {
  const stack: unknown[] = [(program as unknown as { ast: unknown }).ast];
  while (stack.length > 0) {
    const x = stack.pop();
    if (!x || typeof x !== 'object') continue;
    if (Array.isArray(x)) {
      stack.push(...x);
      continue;
    }
    const n = x as AstNode;
    if (typeof n.op !== 'string') {
      if (Object.getPrototypeOf(x) === Object.prototype) stack.push(...Object.values(x));
      continue;
    }
    if (n.op === 'value') continue;
    const args = n.args as unknown[];
    if (n.op === 'call' && Array.isArray(args) && args[0] === 'has' && Array.isArray(args[1]) && args[1].length === 1) {
      const inner = args[1][0] as AstNode;
      const path = inner.op === '.' ? selectionPath(inner) : undefined;
      if (path !== undefined) {
        if (!env('outbound').parse(path).check().valid) return `has(${path}) names a field ${path.slice(path.lastIndexOf('.') + 1)} that does not exist there (at column ${(n.start ?? 0) + 1})`;
      }
    }
    stack.push(n.args);
  }
  return undefined;
}

/** A header value: literal text and `${expr}` parts, in order. */
export type TemplatePart = string | { expr: string };

/**
 * Index of the `}` closing a `${` whose expression starts at `start`, or -1: braces inside CEL
 * string literals (with their escapes) and nested map literals are skipped.
 */
export function closingBrace(value: string, start: number): number {
  let depth = 0;
  let quote: string | null = null;
  let raw = false;
  for (let j = start; j < value.length; j++) {
    const c = value[j]!;
    if (quote) {
      if (c === '\\' && !raw) j++;
      else if (c === quote[0] && (quote.length === 1 || value.startsWith(quote, j))) {
        j += quote.length - 1;
        quote = null;
      }
    } else if (c === '"' || c === "'") {
      // CEL's string literals: '…', "…", '''…''' and """…""" (a lone quote inside does not end
      // them), each with an optional r/R (raw: a backslash escapes nothing) and b/B prefix.
      quote = value.startsWith(c + c + c, j) ? c + c + c : c;
      raw = rawPrefix(value, j);
      j += quote.length - 1;
    } else if (c === '{') depth++;
    else if (c === '}') {
      if (depth === 0) return j;
      depth--;
    }
  }
  return -1;
}

/** Whether the string literal opening at `q` has a raw prefix (`r'…'`, `br'…'`, `Rb"…"`, …). */
function rawPrefix(value: string, q: number): boolean {
  let k = q;
  let isRaw = false;
  for (let n = 0; n < 2 && k > 0 && /[rRbB]/.test(value[k - 1]!); n++) {
    k--;
    if (value[k] === 'r' || value[k] === 'R') isRaw = true;
  }
  return isRaw && (k === 0 || !/[\w.]/.test(value[k - 1]!));
}

/**
 * Splits `a ${expr} b` into parts. `${` opens an expression that runs to its matching `}`
 * (braces inside CEL string literals and map literals are skipped); a `$` not followed by `{`
 * is literal. Throws `CelCompileError` on an unterminated or empty `${`.
 */
export function parseTemplate(value: string): TemplatePart[] {
  const parts: TemplatePart[] = [];
  let lit = '';
  let i = 0;
  while (i < value.length) {
    if (value[i] !== '$' || value[i + 1] !== '{') {
      lit += value[i++];
      continue;
    }
    const start = i + 2;
    const j = closingBrace(value, start);
    if (j < 0) throw new CelCompileError(`unterminated \${ at column ${i + 1}`);
    const expr = value.slice(start, j);
    if (expr.trim() === '') throw new CelCompileError(`empty \${} at column ${i + 1}`);
    if (lit) parts.push(lit);
    lit = '';
    parts.push({ expr });
    i = j + 1;
  }
  if (lit) parts.push(lit);
  return parts;
}
