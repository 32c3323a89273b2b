import dns from 'node:dns';
import https from 'node:https';
import { Counter, type Registry } from 'prom-client';
import type { Logger } from 'pino';
import { createLocalJWKSet, decodeJwt, decodeProtectedHeader, errors as joseErrors, jwtVerify, type JSONWebKeySet, type JWK, type JWTVerifyGetKey, type JWTVerifyOptions, type ProtectedHeaderParameters } from 'jose';
import { CelJwtToken, checkPublicJwk, JWT_ALGORITHMS, JWT_VALIDATION_LIMITS, jwksPrivateAllowed, privateHostRefusal, type CelJwtValidation, type JwtValidationConfig } from '@warren/shared';
import { errorAnswer } from '../http/error-page.js';
import type { Outcome, RequestState } from '../pipeline/types.js';
import { actionsOf } from './activation.js';
import { guardedLookup } from './guarded-fetch.js';
import { bodyFields, wantedFields, type WantedFields } from './jwt-body.js';

/**
 * The `jwt-validation` traffic-policy action at run time (validated by
 * `services/shared/src/traffic-policy/jwt-action.ts`), following
 * https://ngrok.com/docs/traffic-policy/actions/jwt-validation:
 *
 * - Every configured token must be in its header (name case-insensitive, sent once), or for
 *   `method: body` in its field of the request body (`jwt-body.ts`: a POST, PUT or PATCH with an
 *   `application/x-www-form-urlencoded` or `application/json` body read as the upstream reads it
 *   — no charset or UTF-8 (forms also US-ASCII), no content encoding but `identity`, one
 *   Content-Type header; otherwise no body token, `token_missing` — a top-level member of the
 *   JSON object; name case-insensitive, sent once, a string of at most 16 KiB), after its
 *   `prefix` (matched case-insensitively: `Bearer ` / `bearer `). Each is a compact JWS verified
 *   with jose (`jwtVerify`): `alg` among `allowed_algorithms` (never `none`, never HMAC), a key
 *   of the inline keys or the JWK sets (`kid` selects it; without one, at most
 *   `JWT_VALIDATION_LIMITS.maxKeyAttempts` candidate keys are tried), `iss` exactly one of the
 *   issuers, `aud` containing one of the audiences (when configured), `exp` required and, with
 *   `nbf`, checked with `CLOCK_TOLERANCE_S` of leeway. `type: at+jwt` also requires the JOSE
 *   header `typ: at+jwt` (RFC 9068 §4); the other types are hints only, as in ngrok.
 * - A missing or invalid token: 401 `ERR_WARREN_7122` with an RFC 6750 challenge
 *   (`WWW-Authenticate: Bearer`, plus `error="invalid_token"` when a token was sent), and no later
 *   rule or action runs. When no key was found for a token and a JWK set could not be fetched
 *   (and no earlier copy is usable): 503 `ERR_WARREN_7123` with `Retry-After` — failing closed,
 *   but telling the client it is not its token's fault.
 * - Results: `actions.ngrok.jwt_validation.tokens[i]` (header, payload, signature, verified,
 *   location `header` or `body`, location_property the header or field name as configured) and
 *   `.error.{code, message}`.
 * - A policy with a `body` token makes the traffic-policy stage buffer every request body of the
 *   route (`jwtReadsBody`; the runner's `readBody`: 1 MiB, else 413 `ERR_WARREN_7009`; 30 s, else
 *   408 `ERR_WARREN_7012`), as verify-webhook does; the upstream receives the body unchanged.
 *
 * JWK sets (`additional_jkus`) are fetched by this ingress, shared by every policy naming the
 * same URL (`JwksRegistry`): https only, through `https.get` (redirects are not followed) with a
 * `JWKS_FETCH.timeoutMs` deadline for the whole exchange and a `JWKS_FETCH.maxBytes` body cap;
 * at most `JWKS_FETCH.maxKeys` usable keys are kept (each checked as inline keys are). Caching
 * (`RemoteJwks`), as a production gateway does it:
 * - A set is fresh for its lifetime: `ttlMs` (15 min; ngrok: "refreshed roughly every 15
 *   minutes"), or shorter when the response's `Cache-Control: max-age` (or `s-maxage`) says so,
 *   clamped to `minTtlMs`–`maxTtlMs` (1–15 min; `no-cache` / `no-store`: 1 min). Cache-Control
 *   never lengthens it: a key removed from the set (revoked) is accepted for at most 15 min after
 *   the fetch that still had it (plus the stale grace below while refetches fail).
 * - Refresh ahead: a request that uses a set in the last part of its lifetime (past `refreshAhead`
 *   of it: 12 of 15 minutes) starts a refetch in the background and goes on with the set it has.
 *   No timers: a set no route uses is not refetched (and a route's set is refetched only while
 *   requests come).
 * - Single flight: one fetch at a time per URL in this process, shared by every route naming it
 *   (`JwksRegistry`); requests needing it meanwhile wait for that fetch. The registry keeps the
 *   sets the config last compiled names (carried over across config versions, the others
 *   dropped): no LRU, so one account's URLs cannot push out another's (and with it its stale
 *   grace); a policy names at most `JWT_VALIDATION_LIMITS.maxJkusPerPolicy` URLs.
 * - Stale while refreshing, stale if error: once expired, a set is still used — while its refetch
 *   runs in the background, and while refetches fail — for `staleMs` (1 h) past its expiry; then it
 *   is dropped and requests wait for a fetch (503 `ERR_WARREN_7123` when it fails). Only a request
 *   with no usable set, or whose token names a `kid` the set lacks, waits for a fetch.
 * - An unknown `kid` refetches at most once per `cooldownMs` (30 s) after the last fetch began.
 * - After a failed fetch, none for `failureBackoffMs` (5 s), doubling with each failure in a row
 *   up to `maxFailureBackoffMs` (30 s): a dead endpoint costs one fetch per period per URL per
 *   ingress, and requests meanwhile are answered at once. Fetches are counted by
 *   `warren_ingress_jwks_fetches_total{trigger, result}` and failures logged (`observeJwks`).
 *
 * SSRF: the URL is tenant-supplied. Unless the operator sets `WARREN_JWKS_ALLOW_PRIVATE=1` in the
 * ingress's environment, a host that is a literal non-public address or `localhost` is refused,
 * and so is a name that resolves to any non-public address (checked in the socket's `lookup`, so
 * the address checked is the address connected to).
 */

/** Leeway on `exp` / `nbf`, seconds. */
export const CLOCK_TOLERANCE_S = 30;

export const JWKS_FETCH = {
  timeoutMs: 5_000,
  maxBytes: 256 * 1024,
  maxKeys: 100,
  /** Lifetime of a set whose response has no usable Cache-Control. */
  ttlMs: 15 * 60_000,
  /** Bounds of a lifetime taken from Cache-Control: it may only shorten `ttlMs`. */
  minTtlMs: 60_000,
  maxTtlMs: 15 * 60_000,
  /** Part of its lifetime after which a set in use is refetched in the background. */
  refreshAhead: 0.8,
  cooldownMs: 30_000,
  failureBackoffMs: 5_000,
  maxFailureBackoffMs: 30_000,
  /** How long past its expiry a set is still used (while refetches run or fail). */
  staleMs: 60 * 60_000,
} as const;

/** A fetched set: its usable keys and the lifetime its response gave (null: none). */
export interface FetchedJwks {
  keys: JWK[];
  maxAgeMs: number | null;
}

export type JwksFetchOptions = { [K in keyof typeof JWKS_FETCH]: number } & {
  /** Extra trusted CA (PEM), for tests; the ingress uses Node's CAs and NODE_EXTRA_CA_CERTS. */
  ca?: string;
  /** Allow non-public hosts; default: `WARREN_JWKS_ALLOW_PRIVATE=1`. */
  allowPrivate?: boolean;
  now?: () => number;
  /** Replaces `fetchJwks` (tests). */
  fetch?: (url: URL, o: JwksFetchOptions) => Promise<FetchedJwks>;
};

/**
 * A set's lifetime from its response's Cache-Control (`s-maxage`, as a shared cache, else
 * `max-age`), clamped to `minTtlMs`–`maxTtlMs`; `no-cache` / `no-store` give the minimum; null
 * when it says neither.
 */
export function jwksMaxAge(cacheControl: string | undefined, o: Pick<JwksFetchOptions, 'minTtlMs' | 'maxTtlMs'>): number | null {
  if (!cacheControl) return null;
  let maxAge: number | null = null;
  let sMaxAge: number | null = null;
  for (const part of cacheControl.toLowerCase().split(',')) {
    const [k, v] = part.split('=', 2).map((x) => x.trim().replace(/^"|"$/g, ''));
    if (k === 'no-cache' || k === 'no-store') return o.minTtlMs;
    if ((k === 'max-age' || k === 's-maxage') && v !== undefined && /^\d{1,10}$/.test(v)) {
      if (k === 'max-age') maxAge = Number(v);
      else sMaxAge = Number(v);
    }
  }
  const seconds = sMaxAge ?? maxAge;
  return seconds === null ? null : Math.min(o.maxTtlMs, Math.max(o.minTtlMs, seconds * 1000));
}

class JwksFetchError extends Error {}

/** The guarded `dns.lookup` (now shared with the OpenID providers' requests: `guarded-fetch.ts`). */
export { guardedLookup };

/** Fetches and checks one JWK set: the usable public keys and the lifetime the response gives, or throws `JwksFetchError`. */
export function fetchJwks(url: URL, o: JwksFetchOptions): Promise<FetchedJwks> {
  const allowPrivate = o.allowPrivate ?? jwksPrivateAllowed();
  if (url.protocol !== 'https:') return Promise.reject(new JwksFetchError('only https JWK set URLs are fetched'));
  const refusal = allowPrivate ? null : privateHostRefusal(url);
  if (refusal) return Promise.reject(new JwksFetchError(`${refusal} (set WARREN_JWKS_ALLOW_PRIVATE=1 to allow it)`));
  return new Promise<FetchedJwks>((resolve, reject) => {
    let done = false;
    const finish = (err: Error | null, keys?: FetchedJwks) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      if (err) {
        req.destroy();
        reject(err instanceof JwksFetchError ? err : new JwksFetchError(err.message));
      } else resolve(keys!);
    };
    const req = https.get(
      url,
      {
        agent: false,
        lookup: guardedLookup(allowPrivate) as unknown as typeof dns.lookup,
        headers: { accept: 'application/jwk-set+json, application/json', 'user-agent': 'warren-ingress (jwt-validation)' },
        ...(o.ca ? { ca: o.ca } : {}),
      },
      (res) => {
        if (res.statusCode !== 200) {
          res.resume();
          return finish(new JwksFetchError(`answered HTTP ${res.statusCode}${res.statusCode && res.statusCode >= 300 && res.statusCode < 400 ? ' (redirects are not followed)' : ''}`));
        }
        const declared = Number(res.headers['content-length'] ?? 0);
        if (declared > o.maxBytes) return finish(new JwksFetchError(`the JWK set is over ${o.maxBytes} bytes`));
        const chunks: Buffer[] = [];
        let size = 0;
        res.on('data', (c: Buffer) => {
          size += c.length;
          if (size > o.maxBytes) return finish(new JwksFetchError(`the JWK set is over ${o.maxBytes} bytes`));
          chunks.push(c);
        });
        res.on('error', (e) => finish(e));
        res.on('end', () => {
          if (done) return;
          let doc: unknown;
          try {
            doc = JSON.parse(Buffer.concat(chunks).toString('utf8'));
          } catch {
            return finish(new JwksFetchError('did not serve JSON'));
          }
          const keys = (doc as { keys?: unknown } | null)?.keys;
          if (!Array.isArray(keys)) return finish(new JwksFetchError('did not serve a JWK set ({"keys": [...]})'));
          const usable: JWK[] = [];
          for (const k of keys) {
            if (usable.length >= o.maxKeys) break;
            try {
              usable.push(checkPublicJwk(k, 'key', JWT_ALGORITHMS) as JWK);
            } catch {
              // Not a usable public signature key (symmetric, private, encryption-only, too large…): skipped.
            }
          }
          const cc = res.headers['cache-control'];
          finish(null, { keys: usable, maxAgeMs: jwksMaxAge(Array.isArray(cc) ? cc.join(',') : cc, o) });
        });
      },
    );
    req.on('error', (e) => finish(e));
    const timer = setTimeout(() => finish(new JwksFetchError(`no complete answer within ${o.timeoutMs} ms`)), o.timeoutMs);
  });
}

/** Why a set is fetched: none yet (or dropped), refresh-ahead / expired, a token's unknown `kid`. */
export type JwksTrigger = 'initial' | 'refresh' | 'unknown_kid';

/** Told of every fetch of a JWK set (`observeJwks`: a counter and the log). */
export type JwksObserver = (e: { href: string; trigger: JwksTrigger; ok: boolean; error?: string; failures: number; staleUntil: number | null }) => void;

/** One JWK set URL: its last good keys and the fetch state (see the top of this file). */
class RemoteJwks {
  private set: JWTVerifyGetKey | null = null;
  private kids = new Set<string>();
  private fetchedAt = 0;
  private expiresAt = 0;
  /** When the last fetch began (the unknown-`kid` cooldown runs from it). */
  private lastAttempt = -Infinity;
  /** Failed fetches in a row, and when the last one ended. */
  private failures = 0;
  private lastFailure = -Infinity;
  private inflight: Promise<void> | null = null;
  private lastError = '';

  constructor(
    readonly url: URL,
    private readonly registry: JwksRegistry,
  ) {}

  private get o(): JwksFetchOptions {
    return this.registry.options;
  }

  private now(): number {
    return this.o.now?.() ?? Date.now();
  }

  /** The keys to try for a token naming `kid` (maybe undefined), or why there are none. */
  async current(kid: string | undefined): Promise<{ set: JWTVerifyGetKey } | { error: string }> {
    const now = this.now();
    if (this.set && now >= this.expiresAt + this.o.staleMs) {
      // Past the grace period: unusable, and forgotten.
      this.set = null;
      this.kids = new Set();
    }
    const backoff = this.failures === 0 ? 0 : Math.min(this.o.failureBackoffMs * 2 ** (this.failures - 1), this.o.maxFailureBackoffMs);
    const mayFetch = this.inflight === null && now - this.lastFailure >= backoff;
    if (this.set === null) {
      if (this.inflight) await this.inflight;
      else if (mayFetch) await this.refresh(now, 'initial');
    } else if (kid !== undefined && !this.kids.has(kid) && (this.inflight || (mayFetch && now - this.lastAttempt >= this.o.cooldownMs))) {
      // A key may have been rotated in: wait for the set that may hold it.
      await (this.inflight ?? this.refresh(now, 'unknown_kid'));
    } else if (mayFetch && now >= this.fetchedAt + (this.expiresAt - this.fetchedAt) * this.o.refreshAhead) {
      // In its last part of life, or expired (then stale): refetched in the background, used meanwhile.
      void this.refresh(now, 'refresh');
    }
    if (this.set && this.now() < this.expiresAt + this.o.staleMs) return { set: this.set };
    return { error: this.lastError || 'the JWK set has not been fetched' };
  }

  /** One fetch (never rejects): the set replaced, or the failure recorded and the last good set kept. */
  private refresh(now: number, trigger: JwksTrigger): Promise<void> {
    this.lastAttempt = now;
    const fetch = this.o.fetch ?? fetchJwks;
    const p = fetch(this.url, this.o).then(
      (r) => {
        this.set = createLocalJWKSet({ keys: r.keys } as JSONWebKeySet);
        this.kids = new Set(r.keys.map((k) => k.kid).filter((k): k is string => typeof k === 'string'));
        this.fetchedAt = this.now();
        this.expiresAt = this.fetchedAt + (r.maxAgeMs ?? this.o.ttlMs);
        this.failures = 0;
        this.lastError = '';
        this.registry.observer?.({ href: this.url.href, trigger, ok: true, failures: 0, staleUntil: null });
      },
      (err: unknown) => {
        // The back-off runs from the failure (a fetch that timed out took the whole timeout).
        this.lastFailure = this.now();
        this.failures++;
        this.lastError = `${this.url.origin}${this.url.pathname}: ${(err as Error).message}`.slice(0, 500);
        this.registry.observer?.({ href: this.url.href, trigger, ok: false, error: this.lastError, failures: this.failures, staleUntil: this.set ? this.expiresAt + this.o.staleMs : null });
      },
    );
    this.inflight = p;
    void p.finally(() => {
      if (this.inflight === p) this.inflight = null;
    });
    return p;
  }
}

/**
 * The JWK sets this ingress knows, by URL (shared by every route naming one): exactly those the
 * config last compiled names. While a config is compiled (`compiling(config)`, then `get` for
 * each URL its policies name), a set the previous config named carries over (its keys, its
 * fetch state); the previous config's other sets are dropped when the next one is compiled.
 */
export class JwksRegistry {
  private sets = new Map<string, RemoteJwks>();
  private previous = new Map<string, RemoteJwks>();
  private config: WeakRef<object> | null = null;
  readonly options: JwksFetchOptions;
  /** Told of every fetch (set once, by the first policy engine: `observeJwks`). */
  observer: JwksObserver | null = null;
  constructor(o: Partial<JwksFetchOptions> = {}) {
    this.options = { ...JWKS_FETCH, ...o };
  }
  /** `config` is being compiled: from now on `get` builds its set of URLs (a no-op while it is the same config). */
  compiling(config: object): void {
    if (this.config?.deref() === config) return;
    this.config = new WeakRef(config);
    this.previous = this.sets;
    this.sets = new Map();
  }
  get(href: string): RemoteJwks {
    let s = this.sets.get(href);
    if (s) return s;
    s = this.previous.get(href) ?? new RemoteJwks(new URL(href), this);
    this.sets.set(href, s);
    return s;
  }
  /** Sets kept for the config being (or last) compiled. */
  get size(): number {
    return this.sets.size;
  }
}

/** `warren_ingress_jwks_fetches_total` in `registry` (made once). */
function jwksFetchCounter(registry: Registry): Counter<'trigger' | 'result'> {
  const name = 'warren_ingress_jwks_fetches_total';
  const existing = registry.getSingleMetric(name);
  if (existing) return existing as Counter<'trigger' | 'result'>;
  return new Counter({
    name,
    help: 'JWK set fetches of jwt-validation actions, by trigger (initial: no usable set; refresh: ahead of or past expiry, in the background; unknown_kid) and result (ok, error)',
    labelNames: ['trigger', 'result'],
    registers: [registry],
  });
}

/**
 * Counts (`warren_ingress_jwks_fetches_total`) and logs the JWK set fetches of the policy's
 * jwt-validation actions: a failure as a warning (at most one per back-off period per URL), the
 * first success after failures as info. The first engine to call it for a `JwksRegistry` wins
 * (the ingress has one registry, one metrics registry and one pipeline logger).
 */
export function observeJwks(rules: readonly { actions: readonly { kind: string }[] }[], metrics: Registry, log: Logger): void {
  for (const r of rules)
    for (const a of r.actions) {
      if (a.kind !== 'jwt-validation') continue;
      const reg = (a as CompiledJwtValidation).registry;
      if (reg.observer || (a as CompiledJwtValidation).jkus.length === 0) continue;
      const counter = jwksFetchCounter(metrics);
      const failing = new Set<string>();
      reg.observer = (e) => {
        counter.inc({ trigger: e.trigger, result: e.ok ? 'ok' : 'error' });
        if (!e.ok) {
          if (failing.size < 1_000) failing.add(e.href);
          log.warn(
            { jwks: e.href, trigger: e.trigger, err: e.error, failuresInARow: e.failures, servingStaleUntil: e.staleUntil === null ? null : new Date(e.staleUntil).toISOString() },
            e.staleUntil === null ? 'jwt-validation: JWK set fetch failed; tokens needing it are answered 503' : 'jwt-validation: JWK set refresh failed; the last good set is still used',
          );
        } else if (failing.delete(e.href)) log.info({ jwks: e.href, trigger: e.trigger }, 'jwt-validation: JWK set fetched again after failures');
      };
    }
}

export const defaultJwksRegistry = new JwksRegistry();

export interface CompiledJwtValidation {
  kind: 'jwt-validation';
  tokens: { name: string; lower: string; body: boolean; prefix: string; lowerPrefix: string; typ: string | undefined }[];
  /** The `body` tokens' field names; null when every token is in a header. */
  bodyFields: WantedFields | null;
  algorithms: string[];
  requireKid: boolean;
  verify: Omit<JWTVerifyOptions, 'typ'>;
  inline: JWTVerifyGetKey | null;
  registry: JwksRegistry;
  jkus: RemoteJwks[];
}

export function compileJwtValidation(c: JwtValidationConfig, registry: JwksRegistry = defaultJwksRegistry): CompiledJwtValidation {
  const body = c.tokens.filter((t) => t.method === 'body').map((t) => t.name);
  return {
    kind: 'jwt-validation',
    tokens: c.tokens.map((t) => ({ name: t.name, lower: t.name.toLowerCase(), body: t.method === 'body', prefix: t.prefix, lowerPrefix: t.prefix.toLowerCase(), typ: t.type === 'at+jwt' ? 'at+jwt' : undefined })),
    bodyFields: body.length > 0 ? wantedFields(body) : null,
    algorithms: c.algorithms,
    requireKid: c.requireKid,
    verify: {
      algorithms: c.algorithms,
      issuer: c.issuers,
      ...(c.audiences ? { audience: c.audiences } : {}),
      clockTolerance: CLOCK_TOLERANCE_S,
      requiredClaims: ['exp'],
    },
    inline: c.inlineKeys.length > 0 ? createLocalJWKSet({ keys: c.inlineKeys as JWK[] }) : null,
    registry,
    jkus: c.jkus.map((u) => registry.get(u)),
  };
}

/** True when a jwt-validation action of `rules` reads a token from the body (the stage then declares `needsBody`). */
export function jwtReadsBody(rules: readonly { actions: readonly { kind: string }[] }[]): boolean {
  return rules.some((r) => r.actions.some((a) => a.kind === 'jwt-validation' && (a as CompiledJwtValidation).bodyFields !== null));
}

/** A failed run: the variables' error code and message, and the answer. */
interface Failure {
  code: string;
  message: string;
  /** 503: no key could be found because a JWK set is unavailable. */
  unavailable?: boolean;
  /** A token was sent (the challenge then says `invalid_token`). */
  presented: boolean;
}

type Token = CompiledJwtValidation['tokens'][number];

/** The token in header `t`, or a failure. A header sent more than once is refused (ambiguous). */
function fromHeader(headers: readonly string[], t: Token): { token: string } | Failure {
  let value: string | undefined;
  for (let i = 0; i + 1 < headers.length; i += 2) {
    const name = headers[i]!;
    if (name.length !== t.lower.length || name.toLowerCase() !== t.lower) continue;
    if (value !== undefined) return { code: 'token_malformed', message: `the ${t.name} header is sent more than once`, presented: true };
    value = headers[i + 1]!;
  }
  return unprefixed(value, t, `the ${t.name} header`);
}

/** The token in body field `t` of the fields found, or a failure. A field sent more than once is refused (ambiguous). */
function fromBody(fields: ReturnType<typeof bodyFields>, t: Token): { token: string } | Failure {
  const where = `the body field ${t.name}`;
  if (!(fields instanceof Map)) return { code: 'token_missing', message: `no token in ${where}: ${fields.error}`, presented: false };
  const f = fields.get(t.lower);
  if (f && f.count > 1) return { code: 'token_malformed', message: `${where} is sent more than once`, presented: true };
  if (f && f.value === null) return { code: 'token_malformed', message: `${where} ${f.problem}`, presented: true };
  return unprefixed(f?.value ?? undefined, t, where);
}

/** The token in `value` (of `where`) after the prefix, or a failure. */
function unprefixed(value: string | undefined, t: Token, where: string): { token: string } | Failure {
  if (value === undefined) return { code: 'token_missing', message: `no token in ${where}`, presented: false };
  let v = value.trim();
  if (t.prefix) {
    if (v.slice(0, t.prefix.length).toLowerCase() !== t.lowerPrefix) return { code: 'token_missing', message: `${where} does not start with ${JSON.stringify(t.prefix)}`, presented: false };
    v = v.slice(t.prefix.length).trim();
  }
  if (v === '') return { code: 'token_missing', message: `no token in ${where}`, presented: false };
  return { token: v };
}

const isFailure = (v: object): v is Failure => 'code' in v;
const NO_BODY = Buffer.alloc(0);

/** The candidate keys for a token: from the inline keys first, else from the JWK sets. */
async function candidateKeys(a: CompiledJwtValidation, header: ProtectedHeaderParameters, token: string): Promise<{ keys: unknown[] } | Failure> {
  const max = JWT_VALIDATION_LIMITS.maxKeyAttempts;
  const keys: unknown[] = [];
  const from = async (set: JWTVerifyGetKey): Promise<void> => {
    try {
      keys.push(await set(header as Parameters<JWTVerifyGetKey>[0], { payload: '', signature: '', protected: token.slice(0, token.indexOf('.')) }));
    } catch (err) {
      if (err instanceof joseErrors.JWKSMultipleMatchingKeys) {
        for await (const k of err) {
          keys.push(k);
          if (keys.length >= max) break;
        }
      }
      // No matching key, an algorithm the set cannot serve: none from this set.
    }
  };
  if (a.inline) await from(a.inline);
  if (keys.length > 0) return { keys };
  const kid = typeof header.kid === 'string' ? header.kid : undefined;
  // All the sets at once: the wait is one fetch's timeout at most.
  const sets = await Promise.all(a.jkus.map((j) => j.current(kid)));
  let unavailable = '';
  for (const s of sets) {
    if ('error' in s) {
      unavailable ||= s.error;
      continue;
    }
    await from(s.set);
    if (keys.length > 0) return { keys: keys.slice(0, max) };
  }
  if (unavailable) return { code: 'jwks_unavailable', message: `no key for this token, and a JWK set could not be fetched: ${unavailable}`, unavailable: true, presented: true };
  return { code: 'key_not_found', message: kid === undefined ? 'no key of the JWK sets fits this token' : `no key with kid ${JSON.stringify(kid.slice(0, 100))} in the JWK sets`, presented: true };
}

/** jose's verdict as a result code and message (never quoting the token). */
function verdict(err: unknown): Failure {
  const e = err as { code?: string; claim?: string; message?: string };
  switch (e.code) {
    case joseErrors.JWTExpired.code:
      return { code: 'token_expired', message: 'the token has expired', presented: true };
    case joseErrors.JWTClaimValidationFailed.code:
      return { code: 'claim_invalid', message: `the token's ${e.claim ?? ''} claim is not accepted: ${e.message ?? ''}`.slice(0, 300), presented: true };
    case joseErrors.JOSEAlgNotAllowed.code:
      return { code: 'algorithm_not_allowed', message: 'the token is signed with an algorithm that is not allowed', presented: true };
    case joseErrors.JWSSignatureVerificationFailed.code:
      return { code: 'signature_invalid', message: 'the token signature is not valid', presented: true };
    default:
      return { code: 'token_invalid', message: `the token is not a valid JWT: ${e.message ?? String(err)}`.slice(0, 300), presented: true };
  }
}

/** Decoded parts of a token for the result variables ({} when they do not decode). */
function decoded(token: string): { header: Record<string, unknown>; payload: Record<string, unknown>; signature: string } {
  let header: Record<string, unknown> = {};
  let payload: Record<string, unknown> = {};
  try {
    header = decodeProtectedHeader(token) as Record<string, unknown>;
  } catch {
    /* left empty */
  }
  try {
    payload = decodeJwt(token) as Record<string, unknown>;
  } catch {
    /* left empty */
  }
  return { header, payload, signature: token.split('.')[2] ?? '' };
}

/** Verifies one token: its parts and verdict. */
async function verifyToken(a: CompiledJwtValidation, t: CompiledJwtValidation['tokens'][number], token: string): Promise<{ header: Record<string, unknown>; payload: Record<string, unknown> } | Failure> {
  let header: ProtectedHeaderParameters;
  try {
    header = decodeProtectedHeader(token);
    if (token.split('.').length !== 3) throw new Error('not a compact JWS');
  } catch {
    return { code: 'token_malformed', message: 'the token is not a compact JWS (header.payload.signature)', presented: true };
  }
  if (typeof header.alg !== 'string' || !a.algorithms.includes(header.alg)) return verdict(new joseErrors.JOSEAlgNotAllowed('not allowed'));
  if (a.requireKid && typeof header.kid !== 'string') return { code: 'kid_missing', message: 'the token has no kid header', presented: true };
  const found = await candidateKeys(a, header, token);
  if (isFailure(found)) return found;
  let last: Failure | null = null;
  for (const key of found.keys) {
    try {
      const r = await jwtVerify(token, key as Parameters<typeof jwtVerify>[1] & object, t.typ ? { ...a.verify, typ: t.typ } : a.verify);
      return { header: r.protectedHeader as Record<string, unknown>, payload: r.payload as Record<string, unknown> };
    } catch (err) {
      last = verdict(err);
      // Another candidate may hold the right key; any other verdict is final.
      if (last.code !== 'signature_invalid') return last;
    }
  }
  return last ?? { code: 'key_not_found', message: 'no key fits this token', presented: true };
}

function answer(s: RequestState, f: Failure): Outcome {
  if (f.unavailable) return errorAnswer(s.req.headers.accept, 7123, undefined, { 'retry-after': '30' });
  // RFC 6750 §3: no error code when no token was sent; no description (it could be long, and is in the variables).
  return errorAnswer(s.req.headers.accept, 7122, undefined, { 'www-authenticate': f.presented ? 'Bearer error="invalid_token"' : 'Bearer' });
}

function fail(vars: CelJwtValidation, s: RequestState, f: Failure): Outcome {
  vars.error.code = f.code;
  vars.error.message = f.message;
  return answer(s, f);
}

/**
 * The body tokens' fields of the request. The scanners refuse what they cannot read rather than
 * throw; should one throw all the same, the request has no body token (a 401, never a failed
 * route: the body is the client's).
 */
function scanBody(s: RequestState, w: WantedFields): ReturnType<typeof bodyFields> {
  try {
    return bodyFields(s.req, s.body ?? NO_BODY, w, JWT_VALIDATION_LIMITS.bodyTokenChars);
  } catch (err) {
    return { error: `the body could not be read: ${String((err as Error)?.message ?? err).slice(0, 200)}` };
  }
}

/**
 * Runs `jwt-validation`: the 401 at once when a token is missing, else a promise of null (go on)
 * or the 401 / 503.
 */
export function runJwtValidation(a: CompiledJwtValidation, s: RequestState): Outcome | Promise<Outcome> {
  const vars = actionsOf(s).ngrok.jwt_validation;
  vars.reset();
  const found: string[] = [];
  // The body is scanned once, for all the body tokens (buffered: the stage declares needsBody).
  const fields = a.bodyFields && scanBody(s, a.bodyFields);
  for (const t of a.tokens) {
    const r = t.body ? fromBody(fields!, t) : fromHeader(s.headers, t);
    if (isFailure(r)) return fail(vars, s, r);
    found.push(r.token);
  }
  return (async () => {
    for (let i = 0; i < a.tokens.length; i++) {
      const t = a.tokens[i]!;
      const token = found[i]!;
      let r: Awaited<ReturnType<typeof verifyToken>>;
      try {
        r = await verifyToken(a, t, token);
      } catch (err) {
        // Not expected (jose's verdicts are caught): still the client's token, so a 401, not a failed route.
        r = verdict(err);
      }
      if (isFailure(r)) {
        const d = decoded(token);
        vars.tokens.push(new CelJwtToken(d.header, d.payload, d.signature, false, t.body ? 'body' : 'header', t.name));
        return fail(vars, s, r);
      }
      vars.tokens.push(new CelJwtToken(r.header, r.payload, token.split('.')[2] ?? '', true, t.body ? 'body' : 'header', t.name));
    }
    return null;
  })();
}
