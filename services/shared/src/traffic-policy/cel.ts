/**
 * CEL for traffic policies: the variables and macros expressions may use, compiled once with
 * `@marcbachmann/cel-js` (parse + type-check), evaluated per request by the ingress.
 *
 * Variables (ngrok's names where they exist):
 * - `req.method`, `req.host` (lower-case, no port), `req.path`, `req.query` (raw, without `?`),
 *   `req.user_agent`, `req.headers` (map: lower-case name → list of values),
 *   `req.url` (the full URL; compares and concatenates as a string) with `req.url.scheme`,
 *   `.host`, `.authority`, `.path`, `.query`, `.raw_query`, `.query_params` (map → list).
 * - `conn.client_ip`, `conn.server_port` (int).
 * - `conn.geo.{city, country, country_code, latitude, longitude, radius, subdivision}`, all
 *   strings as ngrok's (`""` without a GeoIP database or a match; see `geo-vars.ts`).
 * - `conn.tls.{version, cipher_suite, sni, negotiated_alpn, session_resumed}` and the client
 *   and server certificates `conn.tls.client.*` / `conn.tls.server.*` (ngrok's names):
 *   `issuer` / `subject` (as strings, RFC 2253-like, with `.common_name`, `.country`, …),
 *   `san` (as a string, with `.dns_names`, `.email_addresses`, `.ip_addresses`, `.uris`),
 *   `serial_number`, `signature_algorithm`, `validity.{not_before, not_after}`,
 *   `extensions[i].{id, critical, value}`, and `conn.tls.client.pem`. See `CelTls`.
 * - `res.status_code` (int), `res.headers` — outbound rules only.
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
 * Macros: `getReqHeader(name)`, `getResHeader(name)` (outbound) → list of values,
 * case-insensitive, `[]` when absent; `getQueryParam(name)` → list of values.
 * `s.matches(re)` / `matches(s, re)` (strings, and `req.url` and certificate names as their
 * strings) run RE2, not the library's backtracking JavaScript `RegExp`: see `matchesMacro`; a
 * string over `MAX_MATCH_INPUT` characters is not searched (an evaluation error).
 *
 * A saved policy's expressions are also costed (`cost.ts`): one whose worst case per request is
 * too slow is refused.
 */
import { Environment, type ParseResult } from '@marcbachmann/cel-js';
import {
  CelActionResults,
  CelActions,
  CelBasicAuth,
  CelBasicAuthCredentials,
  CelCertificate,
  CelCertificateExtension,
  CelCertificateValidity,
  CelClientCertificate,
  CelConn,
  CelDistinguishedName,
  CelRateLimit,
  CelRateLimitError,
  CelRequest,
  CelResponse,
  CelRestrictIps,
  CelRestrictIpsError,
  CelSubjectAltNames,
  CelTime,
  CelTls,
  CelUrl,
} from './cel-vars.js';
import type { RegexCostInfo } from './cost.js';
import { cachedRegex, compileRegex, MAX_MATCH_INPUT, MAX_POLICY_REGEX_PROGRAM_SIZE, RegexError, regexCostInfo, regexSearch, type DfaExploreBudget } from './regex.js';
import type { PolicyDirection } from './types.js';
import { CelUrlActionError, CelUrlActionResult } from './url-action-vars.js';
import { CelJwtToken, CelJwtValidation, CelJwtValidationError } from './jwt-action-vars.js';
import { CelCompress, CelVerifyWebhook, CelVerifyWebhookError } from './body-action-vars.js';
import { CelGeo } from './geo-vars.js';
import { CelAuthError, CelOAuth, CelOAuthIdentity, CelOidc, CelOidcIdentity } from './auth-action-vars.js';
import type { RE2JS } from 're2js';

/** A compiled expression: call with an activation (`{req, conn, actions, time[, res]}`). */
export type CelProgram = ParseResult;

/** An expression that does not compile; `reason` is one line, with the column. */
export class CelCompileError extends Error {
  constructor(readonly reason: string) {
    super(reason);
    this.name = 'CelCompileError';
  }
}

/** Minimal view of the checker/evaluator objects a macro hook receives. */
interface MacroChecker {
  check(node: unknown, ctx: unknown): { name: string; kind: string };
  registry: { getListType(t: unknown): unknown };
  stringType: unknown;
  boolType: unknown;
  createError(code: string, message: string, node: unknown): Error;
}
interface MacroEvaluator {
  run(node: unknown, ctx: unknown): unknown;
  createError(code: string, message: string, node: unknown): Error;
}
/** The parsed call a macro expander receives (cel-js AST nodes: `op`, `args`, `start`, …). */
interface MacroCall {
  ast: unknown;
  args: { op: string; args: unknown }[];
  receiver: unknown;
}
interface MacroCtx {
  getValue(name: string): unknown;
}

/** A `name(string): list<string>` macro that reads `header(name)`-style lookups off a variable. */
function lookupMacro(fn: string, read: (ctx: MacroCtx, key: string) => string[]) {
  return ({ args }: { args: unknown[] }) => ({
    arg: args[0],
    typeCheck(checker: MacroChecker, macro: { arg: unknown }, ctx: unknown) {
      const t = checker.check(macro.arg, ctx);
      if (t.name !== 'string' && t.kind !== 'dyn') throw checker.createError('invalid_argument', `${fn}() takes a string, got ${t.name}`, macro.arg);
      return checker.registry.getListType(checker.stringType);
    },
    evaluate(ev: MacroEvaluator, macro: { arg: unknown }, ctx: MacroCtx) {
      const key = ev.run(macro.arg, ctx);
      return typeof key === 'string' ? read(ctx, key) : [];
    },
  });
}

/**
 * Object types that stand for a string where one is expected (`==`, `+`, `string()`,
 * `startsWith`, `endsWith`, `contains`, `size()`, `matches()`) and also have fields:
 * `req.url`, and a certificate's `issuer` / `subject` and `san`, which ngrok types as strings
 * with fields.
 */
const STRING_LIKE = ['URL', 'DistinguishedName', 'SubjectAltNames'] as const;

function stringLikeText(v: unknown): string | undefined {
  return v instanceof CelUrl || v instanceof CelDistinguishedName || v instanceof CelSubjectAltNames ? v.toString() : undefined;
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
        return regexSearch(re, text);
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
      fields: { scheme: str, host: str, authority: str, path: str, query: str, raw_query: str, query_params: 'map<string, list<string>>' },
    })
    .registerType('Request', {
      ctor: CelRequest,
      fields: { method: str, host: str, path: str, query: str, user_agent: str, url: 'URL', headers: 'map<string, list<string>>' },
    })
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
      fields: { version: str, cipher_suite: str, sni: str, negotiated_alpn: str, session_resumed: 'bool', client: 'ClientCertificate', server: 'Certificate' },
    })
    .registerType('Geo', {
      ctor: CelGeo,
      fields: { city: str, country: str, country_code: str, latitude: str, longitude: str, radius: str, subdivision: str },
    })
    .registerType('Connection', { ctor: CelConn, fields: { client_ip: str, server_port: 'int', tls: 'TLS', geo: 'Geo' } })
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
    .registerType('ActionResults', { ctor: CelActionResults, fields: { jwt_validation: 'JwtValidationResult', rate_limit: 'RateLimitResult', restrict_ips: 'RestrictIpsResult', basic_auth: 'BasicAuthResult', url_rewrite: 'UrlActionResult', redirect: 'UrlActionResult', verify_webhook: 'VerifyWebhookResult', compress: 'CompressResult', oauth: 'OAuthResult', oidc: 'OidcResult' } })
    .registerType('AuthError', { ctor: CelAuthError, fields: { code: str, message: str } })
    .registerType('OAuthIdentity', { ctor: CelOAuthIdentity, fields: { id: str, email: str, name: str, provider_user_id: str, current_provider_session_id: str } })
    .registerType('OAuthResult', {
      ctor: CelOAuth,
      fields: { identity: 'OAuthIdentity', error: 'AuthError', access_token: str, refresh_token: str, expires_at: str, session_timed_out: 'bool', session_max_duration_reached: 'bool', userinfo_refreshed: 'bool' },
    })
    .registerType('OidcIdentity', { ctor: CelOidcIdentity, fields: { id: str, email: str, name: str, provider_user_id: str, current_session_id: str } })
    .registerType('OidcResult', {
      ctor: CelOidc,
      fields: { identity: 'OidcIdentity', error: 'AuthError', identity_token: str, access_token: str, refresh_token: str, expires_at: str, session_timed_out: 'bool', session_max_duration_reached: 'bool', user_info_refreshed: 'bool' },
    })
    .registerType('Actions', { ctor: CelActions, fields: { ngrok: 'ActionResults', service: 'ActionResults' } })
    .registerType('Time', { ctor: CelTime, fields: { now: 'google.protobuf.Timestamp' } })
    .registerVariable('req', 'Request')
    .registerVariable('conn', 'Connection')
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
      .registerFunction(`${t}.size(): int`, (a: object) => BigInt(a.toString().length));
  }
  env.registerFunction(
    'getReqHeader(ast): list<string>',
    lookupMacro('getReqHeader', (ctx, k) => (ctx.getValue('req') as CelRequest | undefined)?.header(k) ?? []),
  );
  env.registerFunction(
    'getQueryParam(ast): list<string>',
    lookupMacro('getQueryParam', (ctx, k) => (ctx.getValue('req') as CelRequest | undefined)?.url.query_params.get(k) ?? []),
  );
  env.registerFunction('URL.matches(ast): bool', matchesMacro(true));
  env.registerFunction('matches(ast, ast): bool', matchesMacro(false));
  return env;
}

function buildEnvironments(): Record<PolicyDirection, Environment> {
  const base = baseEnvironment();
  const inbound = base.clone();
  const outbound = base
    .clone()
    .registerType('Response', { ctor: CelResponse, fields: { status_code: 'int', headers: 'map<string, list<string>>' } })
    .registerVariable('res', 'Response');
  outbound.registerFunction(
    'getResHeader(ast): list<string>',
    lookupMacro('getResHeader', (ctx, k) => (ctx.getValue('res') as CelResponse | undefined)?.header(k) ?? []),
  );
  assertRe2Matches(inbound);
  assertRe2Matches(outbound);
  return { inbound, outbound };
}

let environments: Record<PolicyDirection, Environment> | undefined;

/** Creating environments is the expensive part: once per process. */
function env(direction: PolicyDirection): Environment {
  return (environments ??= buildEnvironments())[direction];
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
    throw new CelCompileError(`does not compile: ${describe(checked.error)}`);
  }
  if (wantBool && checked.type !== 'bool' && checked.type !== 'dyn') throw new CelCompileError(`must evaluate to a bool, but its type is ${checked.type}`);
  return program;
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
  for (let j = start; j < value.length; j++) {
    const c = value[j]!;
    if (quote) {
      if (c === '\\') j++;
      else if (c === quote) quote = null;
    } else if (c === '"' || c === "'") quote = c;
    else if (c === '{') depth++;
    else if (c === '}') {
      if (depth === 0) return j;
      depth--;
    }
  }
  return -1;
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
