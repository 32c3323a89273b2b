import { isAlias, isMap, isScalar, isSeq, parseDocument, type Document, type YAMLMap } from 'yaml';
import { HEADER_TEXT_PROBLEM, HEADER_TEXT_RE, isValidHostValue } from '../http-headers.js';
import { parseDurationNs } from './duration.js';
import { keepWrittenScalars } from './scalar-source.js';
import { CelCompileError, compileExpression, parseTemplate, unknownHasField, withPolicyRegexBudget, type CelProgram } from './cel.js';
import { IP_POLICY_MAX_RULES, parseBasicAuthConfig, parseRestrictIpsConfig, restrictIpsCost, restrictIpsMaxCidrs } from './access-actions.js';
import { checkVarNames, parseLogConfig, parseSetVarsConfig } from './var-actions.js';
import { AUTH_ACTION_COST, checkAuthIds, parseOAuthConfig, parseOpenIdConnectConfig } from './auth-actions.js';
import { parseRedirectConfig, parseUrlRewriteConfig, type UrlActionWork } from './url-actions.js';
import { parseCompressResponseConfig, parseVerifyWebhookConfig, VERIFY_WEBHOOK_COST } from './body-actions.js';
import { checkJwkSetUrls, jwtValidationCost, parseJwtValidationConfig } from './jwt-action.js';
import { CIRCUIT_BREAKER_COST, checkCircuitBreakerCount, CLOSE_CONNECTION_COST, FORWARD_INTERNAL_COST, parseCircuitBreakerConfig, parseCloseConnectionConfig, parseForwardInternalConfig } from './flow-actions.js';
import { parseFindReplaceConfig } from './find-replace.js';
import { documentProblem, expandedValues, MAX_ALIASES, MAX_EXPANDED_VALUES, nestingProblem, resolveAlias } from './nesting.js';
import { CostEstimateError, DFA_EXPLORE_STEPS, estimateCost, formatCost, MAX_EXPRESSION_COST, MAX_POLICY_COST, type PolicyHeaderGrowth } from './cost.js';
import type { BucketKeyElement, CustomResponseAction, PolicyAction, PolicyDirection, PolicyRule, RateLimitConfig, TrafficPolicy } from './types.js';

/** Largest accepted document, in UTF-8 bytes (wire-conventions.md §13). */
export const MAX_TRAFFIC_POLICY_BYTES = 64 * 1024;
/**
 * The most a policy may take decoded, as the JSON the control plane pushes to every ingress node
 * (aliases expanded). The text limit alone let 63 KB of YAML, one 50 KB string repeated through
 * aliases, become 5 MB in every node's config: 55 such routes took the snapshot past the 256 MiB
 * a node accepts, and no new node could join.
 */
export const MAX_DECODED_TRAFFIC_POLICY_BYTES = 4 * MAX_TRAFFIC_POLICY_BYTES;

/** True when `value` written as JSON would be over `limit` bytes (counted as it is walked; stops early). */
function jsonOver(value: unknown, limit: number): boolean {
  let size = 0;
  const walk = (v: unknown): boolean => {
    if (typeof v === 'string') size += Buffer.byteLength(v, 'utf8') + 2;
    else if (Array.isArray(v)) {
      size += 2 + v.length;
      for (const x of v) if (walk(x)) return true;
    } else if (v !== null && typeof v === 'object') {
      const entries = Object.entries(v as Record<string, unknown>);
      size += 2 + entries.length;
      for (const [k, x] of entries) {
        size += Buffer.byteLength(k, 'utf8') + 3;
        if (walk(x)) return true;
      }
    } else size += String(v).length;
    return size > limit;
  };
  return walk(value);
}

/** Action types accepted (wire-conventions.md §12), in both directions. */
export const SUPPORTED_ACTION_TYPES = ['rate-limit', 'deny', 'custom-response', 'add-headers', 'remove-headers', 'restrict-ips', 'basic-auth', 'set-vars', 'log', 'url-rewrite', 'redirect', 'jwt-validation', 'verify-webhook', 'compress-response', 'circuit-breaker', 'close-connection', 'request-body-find-replace', 'response-body-find-replace', 'oauth', 'openid-connect', 'forward-internal'] as const;

export const HEADER_ACTION_LIMITS = {
  /** Headers per add-headers / remove-headers / custom-response action. */
  maxHeaders: 32,
  nameBytes: 128,
  valueBytes: 1024,
  /** custom-response `body`, UTF-8 bytes. */
  bodyBytes: 64 * 1024,
} as const;

/**
 * Headers a policy may not add or remove: they frame the message or belong to the hop (changing
 * them would desynchronise the connection to the agent). `x-warren-*` is ours as well.
 */
const RESERVED_HEADERS = new Set(['content-length', 'transfer-encoding', 'connection', 'keep-alive', 'upgrade', 'te', 'trailer', 'proxy-connection']);

export const RATE_LIMIT_LIMITS = {
  /** `name` must have fewer than this many characters. */
  nameChars: 1024,
  capacityMin: 1,
  capacityMax: 2_000_000_000,
  rateMinSeconds: 60,
  rateMaxSeconds: 24 * 60 * 60,
  rateStepSeconds: 10,
  bucketKeyMax: 10,
} as const;

/**
 * What one `rate-limit` run costs (≈ ns), charged to the policy's total (`checkCost`): asking the
 * limiter (the ingress's side of one pipelined Redis script, ~4 µs, and Redis's own ~10 µs, which
 * the feature costs the box) plus building the bucket key. A header element is read, decoded,
 * JSON-quoted and hashed whole: measured ~6.3 ns a byte (88 µs for a 14 KB value), so one is
 * charged for a value as long as the public listeners read a head (16 KiB); `req.host` and
 * `conn.client_ip` are short. Ten header elements: 1.5 ms, three such actions fit in a policy.
 * Without this a 64 KiB policy of 536 rate-limits keyed on one large header ran 1.2 s per request.
 */
export const RATE_LIMIT_COST = { call: 20_000, headerElement: 150_000, shortElement: 1_000 } as const;

export function rateLimitCost(c: RateLimitConfig): number {
  let cost = RATE_LIMIT_COST.call;
  for (const k of c.bucketKey) cost += k.kind === 'header' ? RATE_LIMIT_COST.headerElement : RATE_LIMIT_COST.shortElement;
  return cost;
}

/**
 * The top-level keys of a document, each naming the phase (direction) of its rules: Warren's
 * `inbound` / `outbound` (the API's names) and ngrok's current `on_http_request` /
 * `on_http_response`, synonyms. A document names each phase at most once (`phaseKeys`); the two
 * phases need not use the same style. The parsed `TrafficPolicy` has `inbound` / `outbound`.
 */
export const TRAFFIC_POLICY_PHASES = { inbound: 'inbound', outbound: 'outbound', on_http_request: 'inbound', on_http_response: 'outbound' } as const satisfies Record<string, PolicyDirection>;
export type TrafficPolicyPhaseKey = keyof typeof TRAFFIC_POLICY_PHASES;
const PHASE_KEYS = Object.keys(TRAFFIC_POLICY_PHASES) as TrafficPolicyPhaseKey[];
/** ngrok's name of each direction. */
const NGROK_PHASE: Record<PolicyDirection, TrafficPolicyPhaseKey> = { inbound: 'on_http_request', outbound: 'on_http_response' };

/**
 * A document that is not a valid traffic policy. `path` locates the offending value inside the
 * document, with the phase key as written (e.g. `inbound[0].actions[1].type` or
 * `on_http_request[0].actions[1].type`, `""` for the document itself); the message starts with it.
 */
export class TrafficPolicyError extends Error {
  readonly path: string;
  readonly reason: string;
  constructor(path: string, reason: string) {
    super(path ? `${path}: ${reason}` : reason);
    this.name = 'TrafficPolicyError';
    this.path = path;
    this.reason = reason;
  }
}

type Obj = Record<string, unknown>;

/**
 * What validating one policy gathers for the cost check (`checkCost`): every compiled
 * expression with its path, and the headers the policy adds (later expressions see them).
 */
interface Gathered {
  programs: GatheredPrograms;
  growth: PolicyHeaderGrowth;
  /** Work other than CEL, charged to the policy's total: the url-rewrite / redirect / body find-replace regexp searches (`url-actions.ts`). */
  work: UrlActionWork[];
  /** The policy is being saved (`checkCost`): checks that depend on the saving process's environment run (jwt-validation JKU hosts, openid-connect issuer hosts). */
  saving?: boolean;
}

/**
 * The expressions gathered, in the order they run (inbound rules, then outbound; in a rule its
 * expressions, then its actions in order), each with the header growth it can see: what the
 * policy's add-headers actions before it add. A later action's headers are not there yet when it
 * runs, so they do not make an earlier expression dearer.
 */
class GatheredPrograms {
  readonly entries: { path: string; program: CelProgram; interpolation: boolean; growth: PolicyHeaderGrowth }[] = [];
  constructor(private readonly growth: PolicyHeaderGrowth) {}
  push(e: { path: string; program: CelProgram; interpolation: boolean }): void {
    this.entries.push({ ...e, growth: { count: this.growth.count, bytes: this.growth.bytes } });
  }
}

/**
 * Longest value an interpolated header can take: the ingress drops a longer result (see
 * `interpolate` in the ingress policy engine).
 */
const MAX_INTERPOLATED_VALUE = 8192;

const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

export function typeName(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'list';
  if (isObj(v)) return 'mapping';
  return typeof v;
}

export const at = (path: string, key: string | number) => (typeof key === 'number' ? `${path}[${key}]` : path ? `${path}.${key}` : key);

/**
 * Refuses an action that runs on the request only (Warren's `inbound`, ngrok's `on_http_request`)
 * in an outbound rule: a 400 naming the action's `type` (`configPath` is the path of its `config`).
 */
export function onlyInbound(type: string, configPath: string, direction: PolicyDirection, why: string): void {
  if (direction !== 'inbound') throw new TrafficPolicyError(configPath.replace(/\.config$/, '.type'), `${type} can only be used in inbound rules (${why})`);
}

export function expectObj(v: unknown, path: string, what: string): Obj {
  if (!isObj(v)) throw new TrafficPolicyError(path, `${what} must be a mapping, got ${typeName(v)}`);
  return v;
}

/** An action's `enforce`: absent means true, anything else but a boolean is refused. */
export function parseEnforce(v: unknown, path: string): boolean {
  if (v === undefined || v === null) return true;
  if (typeof v !== 'boolean') throw new TrafficPolicyError(path, `must be true or false, got ${typeName(v)}`);
  return v;
}

export function noUnknownKeys(o: Obj, path: string, allowed: readonly string[]): void {
  for (const k of Object.keys(o)) {
    if (!allowed.includes(k)) throw new TrafficPolicyError(at(path, k), `unknown field "${k}"; supported: ${allowed.join(', ')}`);
  }
}

/** A list, where a missing or `null` value counts as empty when `optional`. */
export function expectList(v: unknown, path: string, optional: boolean): unknown[] {
  if (v === undefined || v === null) {
    if (optional) return [];
    throw new TrafficPolicyError(path, 'is required');
  }
  if (!Array.isArray(v)) throw new TrafficPolicyError(path, `must be a list, got ${typeName(v)}`);
  return v;
}

const HEADER_TOKEN_RE = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,128}$/;
const REQ_HEADERS_RE = /^req\.headers\[(?:'([^'"]*)'|"([^'"]*)")\]$/;
const GET_REQ_HEADER_RE = /^getReqHeader\((?:'([^'"]*)'|"([^'"]*)")\)$/;

function parseBucketKeyElement(v: unknown, path: string): BucketKeyElement {
  if (typeof v !== 'string') throw new TrafficPolicyError(path, `must be a string, got ${typeName(v)}`);
  if (v === 'req.host') return { kind: 'host', source: v };
  if (v === 'conn.client_ip') return { kind: 'client_ip', source: v };
  const m = REQ_HEADERS_RE.exec(v) ?? GET_REQ_HEADER_RE.exec(v);
  if (m) {
    const name = m[1] ?? m[2] ?? '';
    if (!HEADER_TOKEN_RE.test(name)) throw new TrafficPolicyError(path, `${JSON.stringify(name)} is not a valid header name`);
    return { kind: 'header', name: name.toLowerCase(), source: v };
  }
  throw new TrafficPolicyError(
    path,
    `${JSON.stringify(v.slice(0, 200))} is not a supported bucket key element; use req.host, conn.client_ip, req.headers['<header-name>'] or getReqHeader('<Header-Name>')`,
  );
}

function parseRateLimitConfig(v: unknown, path: string): RateLimitConfig {
  const c = expectObj(v, path, 'config');
  noUnknownKeys(c, path, ['name', 'algorithm', 'capacity', 'rate', 'bucket_key', 'enforce']);
  const L = RATE_LIMIT_LIMITS;
  for (const k of ['name', 'algorithm', 'capacity', 'rate', 'bucket_key']) {
    if (c[k] === undefined || c[k] === null) throw new TrafficPolicyError(at(path, k), 'is required');
  }

  const name = c.name;
  if (typeof name !== 'string') throw new TrafficPolicyError(at(path, 'name'), `must be a string, got ${typeName(name)}`);
  if (name.length === 0) throw new TrafficPolicyError(at(path, 'name'), 'must not be empty');
  if ([...name].length >= L.nameChars) throw new TrafficPolicyError(at(path, 'name'), `must have fewer than ${L.nameChars} characters`);

  if (c.algorithm !== 'sliding_window') throw new TrafficPolicyError(at(path, 'algorithm'), `must be "sliding_window", got ${JSON.stringify(c.algorithm)}`);

  const capacity = c.capacity;
  if (typeof capacity !== 'number' || !Number.isInteger(capacity)) throw new TrafficPolicyError(at(path, 'capacity'), `must be an integer, got ${typeName(capacity)} ${typeof capacity === 'number' ? String(capacity) : JSON.stringify(capacity)}`);
  if (capacity < L.capacityMin || capacity > L.capacityMax) throw new TrafficPolicyError(at(path, 'capacity'), `must be from ${L.capacityMin} to 2,000,000,000, got ${capacity}`);

  const rate = c.rate;
  if (typeof rate !== 'string') throw new TrafficPolicyError(at(path, 'rate'), `must be a duration string such as "60s" or "10m", got ${typeName(rate)}`);
  const ns = parseDurationNs(rate);
  if (ns === undefined) throw new TrafficPolicyError(at(path, 'rate'), `${JSON.stringify(rate.slice(0, 64))} is not a duration; write it like "90s", "10m" or "1h30m"`);
  const step = BigInt(L.rateStepSeconds) * 1_000_000_000n;
  if (ns % step !== 0n) throw new TrafficPolicyError(at(path, 'rate'), `must be a multiple of ${L.rateStepSeconds}s, got ${JSON.stringify(rate)}`);
  const rateSeconds = Number(ns / 1_000_000_000n);
  if (rateSeconds < L.rateMinSeconds || rateSeconds > L.rateMaxSeconds) throw new TrafficPolicyError(at(path, 'rate'), `must be from 60s to 24h, got ${JSON.stringify(rate)}`);

  const keys = expectList(c.bucket_key, at(path, 'bucket_key'), false);
  if (keys.length === 0) throw new TrafficPolicyError(at(path, 'bucket_key'), 'must have at least one element');
  if (keys.length > L.bucketKeyMax) throw new TrafficPolicyError(at(path, 'bucket_key'), `must have at most ${L.bucketKeyMax} elements, got ${keys.length}`);
  const bucketKey = keys.map((k, i) => parseBucketKeyElement(k, at(at(path, 'bucket_key'), i)));
  const enforce = parseEnforce(c.enforce, at(path, 'enforce'));

  return { name, algorithm: 'sliding_window', capacity, rate, rateSeconds, bucket_key: bucketKey.map((b) => b.source), bucketKey, enforce };
}

function checkHeaderName(name: string, path: string): string {
  if (Buffer.byteLength(name, 'utf8') > HEADER_ACTION_LIMITS.nameBytes) throw new TrafficPolicyError(path, `header name is over ${HEADER_ACTION_LIMITS.nameBytes} bytes`);
  if (!HEADER_TOKEN_RE.test(name)) throw new TrafficPolicyError(path, `${JSON.stringify(name)} is not a valid header name`);
  const lower = name.toLowerCase();
  if (RESERVED_HEADERS.has(lower) || lower.startsWith('x-warren-')) throw new TrafficPolicyError(path, `header ${JSON.stringify(name)} cannot be changed by a traffic policy`);
  // A token, but as a key of the JavaScript objects headers travel in it would set the object's prototype: the header was silently lost.
  if (lower === '__proto__') throw new TrafficPolicyError(path, 'a header named "__proto__" is not supported');
  return lower;
}


function checkHeaderValue(raw: unknown, path: string): string {
  // A YAML scalar such as `x-redirected: true` or `x-version: 2` (ngrok's own redirect example)
  // is the header's text, as Go's YAML decoder reads it into a string field.
  const value = typeof raw === 'boolean' || (typeof raw === 'number' && Number.isFinite(raw)) ? String(raw) : raw;
  if (typeof value !== 'string') throw new TrafficPolicyError(path, `must be a string, got ${typeName(value)}`);
  if (Buffer.byteLength(value, 'utf8') > HEADER_ACTION_LIMITS.valueBytes) throw new TrafficPolicyError(path, `header value is over ${HEADER_ACTION_LIMITS.valueBytes} bytes`);
  if (!HEADER_TEXT_RE.test(value)) throw new TrafficPolicyError(path, HEADER_TEXT_PROBLEM);
  return value;
}

/**
 * A `headers` mapping of name → value. With `direction` (add-headers), the `${expr}` parts of
 * the values are compiled, and the expressions and added headers recorded in `g`.
 */
/**
 * An inbound add-headers replaces the request's Host: a value without `${…}` must be
 * `host[:port]` (`isValidHostValue`), else a 400 naming it; an interpolated one is checked when
 * it is known (the ingress keeps the client's Host when it is not).
 */
function checkStaticHost(headers: Record<string, string>, path: string): void {
  for (const [name, value] of Object.entries(headers)) {
    if (name.toLowerCase() !== 'host' || value.includes('${')) continue;
    if (!isValidHostValue(value)) throw new TrafficPolicyError(at(path, name), `${JSON.stringify(value.slice(0, 64))} is not a Host value (host[:port], an IPv6 address in brackets)`);
  }
}

export function parseHeaderMap(v: unknown, path: string, required: boolean, direction: PolicyDirection | null, g: { programs: Pick<GatheredPrograms, 'push'>; growth: PolicyHeaderGrowth } | null): Record<string, string> {
  if (v === undefined || v === null) {
    if (required) throw new TrafficPolicyError(path, 'is required');
    return {};
  }
  const m = expectObj(v, path, 'headers');
  const names = Object.keys(m);
  if (required && names.length === 0) throw new TrafficPolicyError(path, 'must have at least one header');
  if (names.length > HEADER_ACTION_LIMITS.maxHeaders) throw new TrafficPolicyError(path, `must have at most ${HEADER_ACTION_LIMITS.maxHeaders} headers, got ${names.length}`);
  const seen = new Set<string>();
  const out: Record<string, string> = {};
  const added = { count: 0, bytes: 0 };
  for (const name of names) {
    const p = at(path, name);
    const lower = checkHeaderName(name, p);
    if (seen.has(lower)) throw new TrafficPolicyError(p, `header ${JSON.stringify(name)} is given twice (names are case-insensitive)`);
    seen.add(lower);
    const value = checkHeaderValue(m[name], p);
    if (direction) {
      let templated = false;
      try {
        for (const part of parseTemplate(value)) {
          if (typeof part === 'string') continue;
          templated = true;
          const program = compileExpression(direction, part.expr, false);
          g?.programs.push({ path: p, program, interpolation: true });
        }
      } catch (err) {
        if (err instanceof CelCompileError) throw new TrafficPolicyError(p, `\${…} ${err.reason}`);
        throw err;
      }
      // `name: value` and its CRLF.
      added.count++;
      added.bytes += name.length + 4 + (templated ? MAX_INTERPOLATED_VALUE : Buffer.byteLength(value, 'utf8'));
    }
    out[name] = value;
  }
  // Added once every value is worked out (the engine sets the headers after all of them): the
  // action's own interpolations do not see them.
  if (g) {
    g.growth.count += added.count;
    g.growth.bytes += added.bytes;
  }
  return out;
}

function statusCode(v: unknown, path: string, min: number, max: number): number {
  if (typeof v !== 'number' || !Number.isInteger(v)) throw new TrafficPolicyError(path, `must be an integer, got ${typeName(v)} ${JSON.stringify(v)}`);
  if (v < min || v > max) throw new TrafficPolicyError(path, `must be from ${min} to ${max}, got ${v}`);
  return v;
}

/**
 * Status codes a `custom-response` may answer with: final responses only. A 1xx is an interim
 * response (`100 Continue`, `101 Switching Protocols`): sent as the answer, the client waits
 * for a final one that never comes.
 */
export const CUSTOM_RESPONSE_STATUS = { min: 200, max: 599, default: 200 } as const;

/**
 * Compiles the `${expr}` parts of a custom-response value (its body or a header value) and
 * records them for the cost check. When the policy is being saved a part that does not compile
 * is a 400; otherwise (a document stored before custom-response interpolated, re-read by the
 * config push or the ingress) the value stays literal text, as it was then (the ingress's
 * `compile.ts` does the same), so such a route keeps working.
 */
function customResponseTemplate(value: string, path: string, direction: PolicyDirection, g: Gathered): void {
  if (!value.includes('${')) return;
  const programs: CelProgram[] = [];
  try {
    for (const part of parseTemplate(value)) if (typeof part !== 'string') programs.push(compileExpression(direction, part.expr, false));
  } catch (err) {
    if (!(err instanceof CelCompileError)) throw err;
    if (g.saving) throw new TrafficPolicyError(path, `\${…} ${err.reason} (write \${'\${'} for a literal "\${")`);
    return;
  }
  for (const program of programs) g.programs.push({ path, program, interpolation: true });
}

/**
 * `custom-response` (ngrok's fields): `status_code` (200–599, default 200), `body` or ngrok's
 * older name for it, `content` (not both), and `headers`. The body and the header values take
 * `${expr}` CEL interpolation, as in ngrok. The response ends the rules, so its headers add no
 * header growth for later expressions.
 */
function parseCustomResponseConfig(raw: unknown, path: string, direction: PolicyDirection, g: Gathered): CustomResponseAction['config'] {
  const c = expectObj(raw, path, 'config');
  noUnknownKeys(c, path, ['status_code', 'body', 'content', 'headers']);
  const { min, max } = CUSTOM_RESPONSE_STATUS;
  const status_code = c.status_code === undefined || c.status_code === null ? CUSTOM_RESPONSE_STATUS.default : statusCode(c.status_code, at(path, 'status_code'), min, max);
  const hasBody = c.body !== undefined && c.body !== null;
  const hasContent = c.content !== undefined && c.content !== null;
  if (hasBody && hasContent) throw new TrafficPolicyError(at(path, 'content'), 'content is another name for body (ngrok\'s older one): give only one of them');
  const field = hasContent ? 'content' : 'body';
  const rawBody = hasContent ? c.content : c.body;
  let body = '';
  if (rawBody !== undefined && rawBody !== null) {
    if (typeof rawBody !== 'string') throw new TrafficPolicyError(at(path, field), `must be a string, got ${typeName(rawBody)}`);
    if (Buffer.byteLength(rawBody, 'utf8') > HEADER_ACTION_LIMITS.bodyBytes) throw new TrafficPolicyError(at(path, field), `is over ${HEADER_ACTION_LIMITS.bodyBytes} bytes`);
    customResponseTemplate(rawBody, at(path, field), direction, g);
    body = rawBody;
  }
  const headers = parseHeaderMap(c.headers, at(path, 'headers'), false, null, null);
  for (const [name, value] of Object.entries(headers)) customResponseTemplate(value, at(at(path, 'headers'), name), direction, g);
  return { status_code, body, headers };
}

/**
 * Refuses, when a policy is saved, a rate-limit `name` that an earlier rate-limit action of the
 * same direction already has: the ingress keys buckets by route, direction and name
 * (`compile.ts`), so two such actions would share one bucket whatever their capacities. A stored
 * policy that has such names still reaches the ingress, which keys the later ones by their place
 * as well.
 */
function checkRateLimitNames(policy: TrafficPolicy): void {
  for (const dir of ['inbound', 'outbound'] as const) {
    const seen = new Map<string, string>();
    policy[dir].forEach((rule, i) =>
      rule.actions.forEach((a, j) => {
        if (a.type !== 'rate-limit') return;
        const where = at(at(at(phaseKey(policy, dir), i), 'actions'), j);
        const first = seen.get(a.config.name);
        if (first !== undefined) throw new TrafficPolicyError(at(at(where, 'config'), 'name'), `${JSON.stringify(a.config.name.slice(0, 64))} is already the name of the rate-limit at ${first}; give each rate-limit action of a direction its own name (each counts in its own bucket)`);
        seen.set(a.config.name, where);
      }),
    );
  }
}

function parseActionConfig(type: PolicyAction['type'], raw: unknown, path: string, direction: PolicyDirection, g: Gathered): PolicyAction {
  switch (type) {
    case 'rate-limit': {
      const config = parseRateLimitConfig(raw, path);
      const headers = config.bucketKey.filter((k) => k.kind === 'header').length;
      g.work.push({ path, what: `rate-limit: asking the limiter with a bucket key of ${config.bucketKey.length} value${config.bucketKey.length === 1 ? '' : 's'}${headers ? ` (${headers} from request headers, counted at 16 KiB each)` : ''} is`, cost: () => rateLimitCost(config) });
      return { type, config };
    }
    case 'deny': {
      const c = raw === undefined || raw === null ? {} : expectObj(raw, path, 'config');
      noUnknownKeys(c, path, ['status_code']);
      const status_code = c.status_code === undefined || c.status_code === null ? 403 : statusCode(c.status_code, at(path, 'status_code'), 400, 599);
      return { type, config: { status_code } };
    }
    case 'custom-response':
      return { type, config: parseCustomResponseConfig(raw, path, direction, g) };
    case 'add-headers': {
      const c = expectObj(raw, path, 'config');
      noUnknownKeys(c, path, ['headers']);
      const headers = parseHeaderMap(c.headers, at(path, 'headers'), true, direction, g);
      // The ingress answers a client's `Expect: 100-continue` itself and never sends one on; one
      // added towards the upstream made every request of the route fail (undici refuses it: 502).
      const expect = direction === 'inbound' ? Object.keys(headers).find((n) => n.toLowerCase() === 'expect') : undefined;
      if (expect !== undefined) throw new TrafficPolicyError(at(at(path, 'headers'), expect), `header ${JSON.stringify(expect)} cannot be added to requests by a traffic policy (the ingress handles 100-continue itself)`);
      if (direction === 'inbound') checkStaticHost(headers, at(path, 'headers'));
      return { type, config: { headers } };
    }
    case 'remove-headers': {
      const c = expectObj(raw, path, 'config');
      noUnknownKeys(c, path, ['headers']);
      const list = expectList(c.headers, at(path, 'headers'), false);
      if (list.length === 0) throw new TrafficPolicyError(at(path, 'headers'), 'must have at least one header name');
      if (list.length > HEADER_ACTION_LIMITS.maxHeaders) throw new TrafficPolicyError(at(path, 'headers'), `must have at most ${HEADER_ACTION_LIMITS.maxHeaders} names, got ${list.length}`);
      const headers = list.map((n, i) => {
        const p = at(at(path, 'headers'), i);
        if (typeof n !== 'string') throw new TrafficPolicyError(p, `must be a string, got ${typeName(n)}`);
        checkHeaderName(n, p);
        return n;
      });
      return { type, config: { headers } };
    }
    case 'restrict-ips': {
      const config = parseRestrictIpsConfig(raw, path);
      const n = restrictIpsMaxCidrs(config);
      const ipp = config.ip_policies.length > 0 ? ` (${config.ip_policies.length} IP polic${config.ip_policies.length === 1 ? 'y' : 'ies'} counted at their limit of ${IP_POLICY_MAX_RULES} rules)` : '';
      g.work.push({ path, what: `restrict-ips: checking the client address against ${ipp ? 'up to ' : ''}${n} CIDR${n === 1 ? '' : 's'}${ipp} is`, cost: () => restrictIpsCost(config) });
      return { type, config };
    }
    case 'basic-auth':
      return { type, config: parseBasicAuthConfig(raw, path, direction) };
    case 'set-vars':
      return { type, config: parseSetVarsConfig(raw, path, direction, (p, program) => g.programs.push({ path: p, program, interpolation: true })) };
    case 'log':
      return { type, config: parseLogConfig(raw, path, direction, (p, program) => g.programs.push({ path: p, program, interpolation: true })) };
    case 'url-rewrite':
      return { type, config: parseUrlRewriteConfig(raw, path, direction, g) };
    case 'redirect':
      return { type, config: parseRedirectConfig(raw, path, direction, g) };
    case 'jwt-validation': {
      const config = parseJwtValidationConfig(raw, path, direction, g.saving === true);
      const n = config.tokens.length;
      g.work.push({ path, what: `jwt-validation: verifying ${n} token${n === 1 ? '' : 's'} (${config.algorithms.join(', ')}) is`, cost: () => jwtValidationCost(config) });
      return { type, config };
    }
    case 'verify-webhook': {
      const config = parseVerifyWebhookConfig(raw, path, direction);
      g.work.push({ path, what: `verify-webhook: checking a signature over the request body (up to 1 MiB) is`, cost: () => VERIFY_WEBHOOK_COST });
      return { type, config };
    }
    case 'compress-response':
      return { type, config: parseCompressResponseConfig(raw, path, direction) };
    case 'circuit-breaker': {
      const config = parseCircuitBreakerConfig(raw, path, direction);
      g.work.push({ path, what: 'circuit-breaker: admitting the request and counting its result is', cost: () => CIRCUIT_BREAKER_COST });
      return { type, config };
    }
    case 'request-body-find-replace':
    case 'response-body-find-replace':
      // The searches and the body's decoding are charged to the policy's total (`g.work`).
      return { type, config: parseFindReplaceConfig(type, raw, path, direction, g) } as PolicyAction;
    case 'oauth':
      g.work.push({ path, what: 'oauth: reading and opening the session cookie is', cost: () => AUTH_ACTION_COST });
      return { type, config: parseOAuthConfig(raw, path, direction) };
    case 'openid-connect':
      g.work.push({ path, what: 'openid-connect: reading and opening the session cookie is', cost: () => AUTH_ACTION_COST });
      return { type, config: parseOpenIdConnectConfig(raw, path, direction, g.saving === true) };
    case 'close-connection': {
      const config = parseCloseConnectionConfig(raw, path, direction);
      g.work.push({ path, what: 'close-connection: closing the connection is', cost: () => CLOSE_CONNECTION_COST });
      return { type, config };
    }
    case 'forward-internal': {
      const config = parseForwardInternalConfig(raw, path, direction, (value, p) => compileTemplateParts(value, p, direction, g));
      g.work.push({ path, what: 'forward-internal: finding the internal endpoint is', cost: () => FORWARD_INTERNAL_COST });
      return { type, config };
    }
  }
}

/** Compiles the `${…}` parts of `value` (recorded for the cost check); whether it has any. */
function compileTemplateParts(value: string, path: string, direction: PolicyDirection, g: Gathered): boolean {
  let templated = false;
  try {
    for (const part of parseTemplate(value)) {
      if (typeof part === 'string') continue;
      templated = true;
      g.programs.push({ path, program: compileExpression(direction, part.expr, false), interpolation: true });
    }
  } catch (err) {
    if (err instanceof CelCompileError) throw new TrafficPolicyError(path, `\${…} ${err.reason}`);
    throw err;
  }
  return templated;
}

function parseAction(v: unknown, path: string, direction: PolicyDirection, g: Gathered): PolicyAction {
  const a = expectObj(v, path, 'an action');
  noUnknownKeys(a, path, ['type', 'config']);
  if (a.type === undefined || a.type === null) throw new TrafficPolicyError(at(path, 'type'), 'is required');
  if (typeof a.type !== 'string') throw new TrafficPolicyError(at(path, 'type'), `must be a string, got ${typeName(a.type)}`);
  const type = a.type as PolicyAction['type'];
  if (!(SUPPORTED_ACTION_TYPES as readonly string[]).includes(type))
    throw new TrafficPolicyError(at(path, 'type'), `action type ${JSON.stringify(a.type.slice(0, 64))} is not supported; supported: ${SUPPORTED_ACTION_TYPES.join(', ')}`);
  if ((a.config === undefined || a.config === null) && type !== 'deny' && type !== 'compress-response' && type !== 'circuit-breaker' && type !== 'close-connection') throw new TrafficPolicyError(at(path, 'config'), 'is required');
  return parseActionConfig(type, a.config, at(path, 'config'), direction, g);
}

function parseRule(v: unknown, path: string, direction: PolicyDirection, g: Gathered): PolicyRule {
  const r = expectObj(v, path, 'a rule');
  noUnknownKeys(r, path, ['name', 'expressions', 'actions']);
  let name = '';
  if (r.name !== undefined && r.name !== null) {
    if (typeof r.name !== 'string') throw new TrafficPolicyError(at(path, 'name'), `must be a string, got ${typeName(r.name)}`);
    name = r.name;
  }
  const expressions = expectList(r.expressions, at(path, 'expressions'), true).map((e, i) => {
    if (typeof e !== 'string') throw new TrafficPolicyError(at(at(path, 'expressions'), i), `must be a string, got ${typeName(e)}`);
    if (e.trim() === '') throw new TrafficPolicyError(at(at(path, 'expressions'), i), 'must not be empty');
    try {
      g.programs.push({ path: at(at(path, 'expressions'), i), program: compileExpression(direction, e), interpolation: false });
    } catch (err) {
      if (err instanceof CelCompileError) throw new TrafficPolicyError(at(at(path, 'expressions'), i), err.reason);
      throw err;
    }
    return e;
  });
  const rawActions = expectList(r.actions, at(path, 'actions'), false);
  if (rawActions.length === 0) throw new TrafficPolicyError(at(path, 'actions'), 'must have at least one action');
  const actions = rawActions.map((a, i) => parseAction(a, at(at(path, 'actions'), i), direction, g));
  return { name, expressions, actions };
}

/** How many `user-agent` headers the policy's add-headers actions add (each may be a new agent to parse). */
function userAgentsAdded(policy: TrafficPolicy): number {
  let n = 0;
  for (const dir of ['inbound', 'outbound'] as const)
    for (const rule of policy[dir]) for (const a of rule.actions) if (a.type === 'add-headers' && Object.keys(a.config.headers).some((h) => h.toLowerCase() === 'user-agent')) n++;
  return n;
}

/**
 * Refuses a policy whose expressions may cost too much per request (`cost.ts`): one over
 * `MAX_EXPRESSION_COST`, or the one that takes the policy's total over `MAX_POLICY_COST`
 * (every rule's expressions and interpolations may run on the same request).
 */
function checkCost(g: Gathered, policy: TrafficPolicy): void {
  let total = 0;
  const dfaBudget = { steps: DFA_EXPLORE_STEPS };
  // Shared work (`POLICY_SHARED_ONCE`): the most any expression is charged for it, once per
  // string it may be done on: the agent as received, and each `user-agent` the policy adds.
  const sharedMax = new Map<string, number>();
  const copies = 1 + userAgentsAdded(policy);
  let sharedCharged = 0;
  for (const { path, program, interpolation, growth } of g.programs.entries) {
    const what = interpolation ? '${…} ' : '';
    let cost: number;
    const shared = new Map<string, number>();
    try {
      cost = estimateCost(program, growth, dfaBudget, shared);
    } catch (err) {
      if (err instanceof CostEstimateError) throw new TrafficPolicyError(path, `${what}cannot be accepted: ${err.message}`);
      throw err;
    }
    if (cost > MAX_EXPRESSION_COST)
      throw new TrafficPolicyError(
        path,
        `${what}too expensive to evaluate: its worst case is estimated at ${formatCost(cost)} per request, more than the ${formatCost(MAX_EXPRESSION_COST)} allowed for one expression (exists/all/map/filter multiply their body's cost by the size of their list, and matches() grows with the pattern and the string)`,
      );
    for (const [key, c] of shared) {
      cost -= c;
      sharedMax.set(key, Math.max(sharedMax.get(key) ?? 0, c));
    }
    total += cost;
    sharedCharged = 0;
    for (const c of sharedMax.values()) sharedCharged += c * copies;
    if (total + sharedCharged > MAX_POLICY_COST)
      throw new TrafficPolicyError(
        path,
        `${what}the policy's expressions are too expensive together: with this one, their worst case is estimated at ${formatCost(total + sharedCharged)} per request, more than the ${formatCost(MAX_POLICY_COST)} allowed for a policy`,
      );
  }
  total += sharedCharged;
  // One bounded search per action, not an expression: charged to the policy's total only.
  for (const w of g.work) {
    const cost = w.cost();
    total += cost;
    if (total > MAX_POLICY_COST)
      throw new TrafficPolicyError(w.path, `${w.what} estimated at ${formatCost(cost)} per request at worst, which takes the policy to ${formatCost(total)}, more than the ${formatCost(MAX_POLICY_COST)} allowed for a policy`);
  }
}

export interface ValidateOptions {
  /**
   * The checks of a policy being saved: refuse one whose expressions may cost too much per
   * request (`checkCost`), that names two rate-limit actions of a direction alike
   * (`checkRateLimitNames`), or whose custom-response `${…}` does not compile. On when a policy
   * is saved (`parseTrafficPolicy`); off by default here so that a policy stored before these
   * checks existed still reaches the ingress.
   */
  checkCost?: boolean;
}

/** The key each direction's rules are written under in a document (its own name when absent). */
type PhaseKeys = Record<PolicyDirection, TrafficPolicyPhaseKey>;

/**
 * The document's phase keys: refuses an unknown top-level key (another of ngrok's phases, such
 * as `on_tcp_connect`, included) and a phase named twice (`inbound` and `on_http_request`), the
 * second key being the one named. A key counts as given whatever its value (`null` too).
 */
function phaseKeys(top: Obj): PhaseKeys {
  const supported = PHASE_KEYS.join(', ');
  const written: Partial<PhaseKeys> = {};
  for (const k of Object.keys(top)) {
    if (!Object.hasOwn(TRAFFIC_POLICY_PHASES, k)) {
      if (k.startsWith('on_')) throw new TrafficPolicyError(at('', k), `unknown field "${k.slice(0, 64)}": this phase is not supported (only HTTP request and response phases are); supported: ${supported}`);
      throw new TrafficPolicyError(at('', k), `unknown field "${k.slice(0, 64)}"; supported: ${supported}`);
    }
    const key = k as TrafficPolicyPhaseKey;
    const dir = TRAFFIC_POLICY_PHASES[key];
    const first = written[dir];
    if (first !== undefined)
      throw new TrafficPolicyError(at('', key), `${key} and ${first} are two names of the same phase (${dir === 'inbound' ? 'inbound, ngrok\'s on_http_request' : 'outbound, ngrok\'s on_http_response'}): write its rules under one of them only`);
    written[dir] = key;
  }
  return { inbound: written.inbound ?? 'inbound', outbound: written.outbound ?? 'outbound' };
}

/** The phase key each validated policy's rules were written under (see {@link phaseKey}). */
const WRITTEN = new WeakMap<TrafficPolicy, PhaseKeys>();

/**
 * The key `dir`'s rules were written under in the document `policy` was validated from:
 * `inbound` or `on_http_request`, `outbound` or `on_http_response` (`dir` itself for a policy not
 * made by {@link validateTrafficPolicy}). Policy-wide checks build the paths they name with it.
 */
export function phaseKey(policy: TrafficPolicy, dir: PolicyDirection): TrafficPolicyPhaseKey {
  return WRITTEN.get(policy)?.[dir] ?? dir;
}

/**
 * "can only be used in inbound rules" for an action under a phase written with ngrok's name names
 * the phases with ngrok's names (`on_http_request rules`), as the document does.
 */
function asWritten(err: TrafficPolicyError): TrafficPolicyError {
  const phase = /^[a-z_]+/.exec(err.path)?.[0];
  if (phase !== NGROK_PHASE.inbound && phase !== NGROK_PHASE.outbound) return err;
  const reason = err.reason.replace(/^([a-z-]+ can only be used in )(inbound|outbound)( rules\b)/, (_, a: string, d: PolicyDirection, b: string) => `${a}${NGROK_PHASE[d]}${b}`);
  return reason === err.reason ? err : new TrafficPolicyError(err.path, reason);
}

/**
 * Validates a document that is already decoded (a plain JSON value): shape
 * `{inbound?: [{name?, expressions?, actions: [{type, config}]}], outbound?: [...]}`, where
 * `on_http_request` / `on_http_response` (ngrok's names) may stand for `inbound` / `outbound`
 * (`TRAFFIC_POLICY_PHASES`; not both names of one phase). The result has `inbound` /
 * `outbound` whichever names were written; error paths name the key as written. Unknown keys
 * are refused at every level.
 */
export function validateTrafficPolicy(doc: unknown, opts: ValidateOptions = {}): TrafficPolicy {
  const top = expectObj(doc, '', 'the traffic policy');
  const written = phaseKeys(top);
  const growth = { count: 0, bytes: 0 };
  const g: Gathered = { programs: new GatheredPrograms(growth), growth, work: [], saving: opts.checkCost === true };
  try {
    // One budget for all the policy's matches() patterns (cel.ts).
    const policy = withPolicyRegexBudget(() => {
      const rules = (dir: PolicyDirection) => expectList(top[written[dir]], written[dir], true).map((r, i) => parseRule(r, at(written[dir], i), dir, g));
      return { inbound: rules('inbound'), outbound: rules('outbound') };
    });
    WRITTEN.set(policy, written);
    checkVarNames(policy);
    checkAuthIds(policy);
    checkCircuitBreakerCount(policy);
    checkJwkSetUrls(policy);
    if (opts.checkCost) {
      checkRateLimitNames(policy);
      for (const { path, program, interpolation } of g.programs.entries) {
        const unknown = unknownHasField(program);
        if (unknown) throw new TrafficPolicyError(path, `${interpolation ? '${…} ' : ''}does not compile: ${unknown}`);
      }
      checkCost(g, policy);
    }
    return policy;
  } catch (err) {
    throw err instanceof TrafficPolicyError ? asWritten(err) : err;
  }
}

/**
 * Refuses, in the maps that make up a policy (the document, each rule, each action and each
 * action's `config`, followed through aliases), a key written as an alias (`*k : …`), a key
 * that is not a scalar (`? [a] : …`), and `<<` (a YAML merge key; merging is off, so it would be
 * an ordinary key). Such a key is spelt differently in the document than in its value: the
 * secrets of the policy (`secrets.ts`), located in the document as written, could be missed.
 * Keys deeper in a `config` (header names, …) are not concerned.
 */
function checkPolicyKeys(doc: Document): void {
  const resolve = (n: unknown) => resolveAlias(doc, n);
  const keys = (n: unknown, path: string): YAMLMap | null => {
    const m = resolve(n);
    if (!isMap(m)) return null;
    for (const pair of m.items) {
      const k = pair.key;
      if (isAlias(k)) throw new TrafficPolicyError(path, `a key written as an alias (*${k.source.slice(0, 64)}) is not accepted here; write the key itself`);
      if (!isScalar(k)) throw new TrafficPolicyError(path, `a key must be a string, got ${isMap(k) ? 'a mapping' : isSeq(k) ? 'a list' : 'none'}`);
      if (k.value === '<<') throw new TrafficPolicyError(path, '"<<" (a YAML merge key) is not accepted: write the keys out');
    }
    return m;
  };
  const top = keys(doc.contents, '');
  if (!top) return;
  for (const dir of PHASE_KEYS) {
    const rules = resolve(top.get(dir, true));
    if (!isSeq(rules)) continue;
    rules.items.forEach((r, i) => {
      const rule = keys(r, at(dir, i));
      const actions = rule && resolve(rule.get('actions', true));
      if (!isSeq(actions)) return;
      actions.items.forEach((a, j) => {
        const path = at(at(at(dir, i), 'actions'), j);
        const action = keys(a, path);
        if (action) keys(action.get('config', true), at(path, 'config'));
      });
    });
  }
}

/** The fields of an action that hold a secret (secrets.ts blanks them in what the API returns). */
export const SECRET_FIELDS: Readonly<Record<string, string>> = { 'verify-webhook': 'secret', 'basic-auth': 'credentials', oauth: 'client_secret', 'openid-connect': 'client_secret' };

/**
 * Refuses, when a policy is saved, an anchor (`&a`) or an alias (`*a`) on a secret or on any node
 * that holds one (the document, a phase's rules, a rule, its actions, the action, its config, a
 * credentials list or credential): through an alias a secret could be shown in a place that is
 * not blanked (`name: *a` after `secret: &a …`, or `secret: *a` after `name: &a …`), so the API
 * would return it. Documents stored before this check are blanked whole when that happens (see
 * `redactTrafficPolicySecrets`).
 */
function checkSecretAnchors(doc: Document): void {
  const resolve = (n: unknown) => resolveAlias(doc, n);
  const marked = (n: unknown, path: string): void => {
    if (isAlias(n)) throw new TrafficPolicyError(path, `an alias (*${n.source.slice(0, 64)}) is not accepted on a secret or on what holds one; write the value itself`);
    const anchor = (n as { anchor?: string } | null)?.anchor;
    if (anchor) throw new TrafficPolicyError(path, `an anchor (&${anchor.slice(0, 64)}) is not accepted on a secret or on what holds one`);
  };
  const top = resolve(doc.contents);
  if (!isMap(top)) return;
  for (const dir of PHASE_KEYS) {
    const rulesNode = top.get(dir, true);
    const rules = resolve(rulesNode);
    if (!isSeq(rules)) continue;
    rules.items.forEach((r, i) => {
      const rule = resolve(r);
      const actionsNode = isMap(rule) ? rule.get('actions', true) : undefined;
      const actions = resolve(actionsNode);
      if (!isSeq(actions)) return;
      actions.items.forEach((a, j) => {
        const act = resolve(a);
        if (!isMap(act)) return;
        const typeNode = resolve(act.get('type', true));
        const field = isScalar(typeNode) && typeof typeNode.value === 'string' && Object.hasOwn(SECRET_FIELDS, typeNode.value) ? SECRET_FIELDS[typeNode.value] : undefined;
        if (!field) return;
        const configNode = act.get('config', true);
        const config = resolve(configNode);
        if (!isMap(config) || !config.has(field)) return;
        const path = at(at(at(dir, i), 'actions'), j);
        const valueNode = config.get(field, true);
        // Outermost first, so the message names the node that carries the mark.
        marked(doc.contents, '');
        marked(rulesNode, dir);
        marked(r, at(dir, i));
        marked(actionsNode, at(at(dir, i), 'actions'));
        marked(a, path);
        marked(configNode, at(path, 'config'));
        marked(valueNode, at(at(path, 'config'), field));
        const list = resolve(valueNode);
        if (field === 'credentials' && isSeq(list)) list.items.forEach((c, k) => marked(c, at(at(at(path, 'config'), field), k)));
      });
    });
  }
}

/**
 * Decodes a traffic policy written as YAML or JSON into a plain JSON value, without validating it
 * (JSON is read by the same YAML 1.2 parser: every JSON document is YAML). Throws
 * `TrafficPolicyError` on a syntax problem, and on a key of the policy's own maps written as an
 * alias, not a scalar, or `<<` (`checkPolicyKeys`).
 */
export function decodeTrafficPolicy(text: string): unknown {
  return decodeDocument(text).value;
}

function decodeDocument(text: string): { doc: Document; value: unknown } {
  if (Buffer.byteLength(text, 'utf8') > MAX_TRAFFIC_POLICY_BYTES) throw new TrafficPolicyError('', `the document is over ${MAX_TRAFFIC_POLICY_BYTES} bytes`);
  if (text.trim() === '') throw new TrafficPolicyError('', 'the document is empty');
  // Before the parser, which recurses: a deep enough document would abort the process (nesting.ts).
  const deep = nestingProblem(text);
  if (deep) throw new TrafficPolicyError('', deep.message);
  // uniqueKeys off: the parser's check is quadratic in a map's keys; documentProblem does it in one walk.
  const doc = parseDocument(text, { version: '1.2', schema: 'core', merge: false, uniqueKeys: false, strict: true, prettyErrors: false });
  const first = doc.errors[0];
  if (first) throw new TrafficPolicyError('', `not valid YAML or JSON: ${first.message.split('\n')[0]!.slice(0, 300)}`);
  const problem = documentProblem(doc);
  if (problem) throw new TrafficPolicyError('', `not valid YAML or JSON: ${problem}`);
  // Cheap refusals before the aliases are expanded (a short document can expand to a long one).
  checkPolicyKeys(doc);
  if (isMap(doc.contents)) phaseKeys(Object.fromEntries(doc.contents.items.map((p) => [isScalar(p.key) ? String(p.key.value) : '', null])));
  if (expandedValues(doc) > MAX_EXPANDED_VALUES) throw new TrafficPolicyError('', `the document expands to more than ${MAX_EXPANDED_VALUES} values through its aliases`);
  let value: unknown;
  try {
    value = doc.toJS({ maxAliasCount: MAX_ALIASES });
  } catch (err) {
    throw new TrafficPolicyError('', `not valid YAML or JSON: ${(err as Error).message.split('\n')[0]!.slice(0, 300)}`);
  }
  keepWrittenScalars(doc, value);
  return { doc, value };
}

/**
 * Parses and validates a traffic policy written as YAML or JSON, as when it is saved: the cost
 * limits are checked too. Throws `TrafficPolicyError` on any problem.
 */
export function parseTrafficPolicy(text: string): TrafficPolicy {
  const { doc, value } = decodeDocument(text);
  if (jsonOver(value, MAX_DECODED_TRAFFIC_POLICY_BYTES)) throw new TrafficPolicyError('', `the document is over ${MAX_DECODED_TRAFFIC_POLICY_BYTES} bytes once its aliases are expanded (it is sent to every ingress node so)`);
  checkSecretAnchors(doc);
  return validateTrafficPolicy(value, { checkCost: true });
}
