import dns from 'node:dns';
import https from 'node:https';
import type { LookupAddress } from 'node:dns';
import { createLocalJWKSet, decodeJwt, decodeProtectedHeader, errors as joseErrors, jwtVerify, type JSONWebKeySet, type JWK, type JWTVerifyGetKey, type JWTVerifyOptions, type ProtectedHeaderParameters } from 'jose';
import { CelJwtToken, checkPublicJwk, isNonPublicAddress, JWT_ALGORITHMS, JWT_VALIDATION_LIMITS, jwksHostRefusal, jwksPrivateAllowed, type CelJwtValidation, type JwtValidationConfig } from '@warren/shared';
import { errorAnswer } from '../http/error-page.js';
import type { Outcome, RequestState } from '../pipeline/types.js';
import { actionsOf } from './activation.js';

/**
 * The `jwt-validation` traffic-policy action at run time (validated by
 * `services/shared/src/traffic-policy/jwt-action.ts`), following
 * https://ngrok.com/docs/traffic-policy/actions/jwt-validation:
 *
 * - Every configured token must be in its header (name case-insensitive, sent once), after its
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
 *   location `header`, location_property the header name) and `.error.{code, message}`.
 *
 * JWK sets (`additional_jkus`) are fetched by this ingress, shared by every policy naming the
 * same URL (`JwksRegistry`): https only, through `https.get` (redirects are not followed) with a
 * `JWKS_FETCH.timeoutMs` deadline for the whole exchange and a `JWKS_FETCH.maxBytes` body cap;
 * at most `JWKS_FETCH.maxKeys` usable keys are kept (each checked as inline keys are). A set is
 * used for `ttlMs` (ngrok: "refreshed roughly every 15 minutes"), fetched again early when a token
 * names an unknown `kid` but at most once per `cooldownMs`, and not again for `failureBackoffMs`
 * after a failed fetch ended (one fetch at a time per URL) — so a flood of unknown `kid`s or a dead endpoint costs one fetch per
 * period per ingress, and requests meanwhile are answered at once. After a failed refresh the last
 * good set stays usable for `staleMs` more.
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
  ttlMs: 15 * 60_000,
  cooldownMs: 30_000,
  failureBackoffMs: 5_000,
  staleMs: 60 * 60_000,
  /** JWK set URLs remembered (an LRU over all routes). */
  maxSets: 1_000,
} as const;

export type JwksFetchOptions = { [K in keyof typeof JWKS_FETCH]: number } & {
  /** Extra trusted CA (PEM), for tests; the ingress uses Node's CAs and NODE_EXTRA_CA_CERTS. */
  ca?: string;
  /** Allow non-public hosts; default: `WARREN_JWKS_ALLOW_PRIVATE=1`. */
  allowPrivate?: boolean;
  now?: () => number;
};

class JwksFetchError extends Error {}

/** `dns.lookup` refusing names that resolve to a non-public address (every address is checked). */
export function guardedLookup(allowPrivate: boolean) {
  return (hostname: string, options: dns.LookupOptions, callback: (err: NodeJS.ErrnoException | null, address: string | LookupAddress[], family?: number) => void): void => {
    dns.lookup(hostname, { ...options, all: true }, (err, addresses) => {
      if (err) return callback(err, '');
      if (addresses.length === 0) return callback(Object.assign(new Error(`${hostname} has no address`), { code: 'ENOTFOUND' }), '');
      if (!allowPrivate) {
        const bad = addresses.find((a) => isNonPublicAddress(a.address));
        if (bad) return callback(Object.assign(new Error(`${hostname} resolves to ${bad.address}, not a public address (set WARREN_JWKS_ALLOW_PRIVATE=1 to allow it)`), { code: 'EJWKSPRIVATE' }), '');
      }
      if (options.all) callback(null, addresses);
      else callback(null, addresses[0]!.address, addresses[0]!.family);
    });
  };
}

/** Fetches and checks one JWK set: the usable public keys, or throws `JwksFetchError`. */
export function fetchJwks(url: URL, o: JwksFetchOptions): Promise<JWK[]> {
  const allowPrivate = o.allowPrivate ?? jwksPrivateAllowed();
  if (url.protocol !== 'https:') return Promise.reject(new JwksFetchError('only https JWK set URLs are fetched'));
  const refusal = allowPrivate ? null : jwksHostRefusal(url);
  if (refusal) return Promise.reject(new JwksFetchError(`${refusal} (set WARREN_JWKS_ALLOW_PRIVATE=1 to allow it)`));
  return new Promise<JWK[]>((resolve, reject) => {
    let done = false;
    const finish = (err: Error | null, keys?: JWK[]) => {
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
          finish(null, usable);
        });
      },
    );
    req.on('error', (e) => finish(e));
    const timer = setTimeout(() => finish(new JwksFetchError(`no complete answer within ${o.timeoutMs} ms`)), o.timeoutMs);
  });
}

/** One JWK set URL: its last good keys and the fetch state. */
class RemoteJwks {
  private set: JWTVerifyGetKey | null = null;
  private kids = new Set<string>();
  private fetchedAt = 0;
  private lastAttempt = -Infinity;
  private lastFailed = false;
  private inflight: Promise<void> | null = null;
  private lastError = '';

  constructor(
    readonly url: URL,
    private readonly o: JwksFetchOptions,
  ) {}

  /** The keys to try for a token naming `kid` (maybe undefined), or why there are none. */
  async current(kid: string | undefined): Promise<{ set: JWTVerifyGetKey } | { error: string }> {
    const now = this.o.now?.() ?? Date.now();
    const fresh = this.set !== null && now - this.fetchedAt < this.o.ttlMs;
    const unknownKid = this.set !== null && kid !== undefined && !this.kids.has(kid);
    if (!fresh || unknownKid) {
      const wait = this.lastFailed ? this.o.failureBackoffMs : this.set === null ? 0 : unknownKid && fresh ? this.o.cooldownMs : 0;
      if (this.inflight) await this.inflight;
      else if (now - this.lastAttempt >= wait) await this.refresh(now);
    }
    const t = this.o.now?.() ?? Date.now();
    if (this.set && t - this.fetchedAt < this.o.ttlMs + this.o.staleMs) return { set: this.set };
    return { error: this.lastError || 'the JWK set has not been fetched' };
  }

  private refresh(now: number): Promise<void> {
    this.lastAttempt = now;
    this.inflight = fetchJwks(this.url, this.o).then(
      (keys) => {
        this.set = createLocalJWKSet({ keys } as JSONWebKeySet);
        this.kids = new Set(keys.map((k) => k.kid).filter((k): k is string => typeof k === 'string'));
        this.fetchedAt = this.o.now?.() ?? Date.now();
        this.lastFailed = false;
        this.lastError = '';
      },
      (err: unknown) => {
        // The back-off runs from the failure (a fetch that timed out took the whole timeout).
        this.lastAttempt = this.o.now?.() ?? Date.now();
        this.lastFailed = true;
        this.lastError = `${this.url.origin}${this.url.pathname}: ${(err as Error).message}`.slice(0, 500);
      },
    );
    const p = this.inflight;
    void p.finally(() => {
      if (this.inflight === p) this.inflight = null;
    });
    return p;
  }
}

/** The JWK sets this ingress knows, by URL (shared by every route naming one), bounded LRU. */
export class JwksRegistry {
  private readonly sets = new Map<string, RemoteJwks>();
  readonly options: JwksFetchOptions;
  constructor(o: Partial<JwksFetchOptions> = {}) {
    this.options = { ...JWKS_FETCH, ...o };
  }
  get(href: string): RemoteJwks {
    let s = this.sets.get(href);
    if (s) {
      this.sets.delete(href);
      this.sets.set(href, s);
      return s;
    }
    s = new RemoteJwks(new URL(href), this.options);
    if (this.sets.size >= this.options.maxSets) this.sets.delete(this.sets.keys().next().value!);
    this.sets.set(href, s);
    return s;
  }
}

export const defaultJwksRegistry = new JwksRegistry();

export interface CompiledJwtValidation {
  kind: 'jwt-validation';
  tokens: { name: string; lower: string; prefix: string; lowerPrefix: string; typ: string | undefined }[];
  algorithms: string[];
  requireKid: boolean;
  verify: Omit<JWTVerifyOptions, 'typ'>;
  inline: JWTVerifyGetKey | null;
  jkus: RemoteJwks[];
}

export function compileJwtValidation(c: JwtValidationConfig, registry: JwksRegistry = defaultJwksRegistry): CompiledJwtValidation {
  return {
    kind: 'jwt-validation',
    tokens: c.tokens.map((t) => ({ name: t.name, lower: t.name.toLowerCase(), prefix: t.prefix, lowerPrefix: t.prefix.toLowerCase(), typ: t.type === 'at+jwt' ? 'at+jwt' : undefined })),
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
    jkus: c.jkus.map((u) => registry.get(u)),
  };
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

/** The token in header `t`, or a failure. A header sent more than once is refused (ambiguous). */
function extract(headers: readonly string[], t: CompiledJwtValidation['tokens'][number]): { token: string } | Failure {
  let value: string | undefined;
  for (let i = 0; i + 1 < headers.length; i += 2) {
    const name = headers[i]!;
    if (name.length !== t.lower.length || name.toLowerCase() !== t.lower) continue;
    if (value !== undefined) return { code: 'token_malformed', message: `the ${t.name} header is sent more than once`, presented: true };
    value = headers[i + 1]!;
  }
  if (value === undefined) return { code: 'token_missing', message: `no token in the ${t.name} header`, presented: false };
  let v = value.trim();
  if (t.prefix) {
    if (v.slice(0, t.prefix.length).toLowerCase() !== t.lowerPrefix) return { code: 'token_missing', message: `the ${t.name} header does not start with ${JSON.stringify(t.prefix)}`, presented: false };
    v = v.slice(t.prefix.length).trim();
  }
  if (v === '') return { code: 'token_missing', message: `no token in the ${t.name} header`, presented: false };
  return { token: v };
}

const isFailure = (v: object): v is Failure => 'code' in v;

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
 * Runs `jwt-validation`: the 401 at once when a token is missing, else a promise of null (go on)
 * or the 401 / 503.
 */
export function runJwtValidation(a: CompiledJwtValidation, s: RequestState): Outcome | Promise<Outcome> {
  const vars = actionsOf(s).ngrok.jwt_validation;
  vars.reset();
  const found: string[] = [];
  for (const t of a.tokens) {
    const r = extract(s.headers, t);
    if (isFailure(r)) return fail(vars, s, r);
    found.push(r.token);
  }
  return (async () => {
    for (let i = 0; i < a.tokens.length; i++) {
      const t = a.tokens[i]!;
      const token = found[i]!;
      const r = await verifyToken(a, t, token);
      if (isFailure(r)) {
        const d = decoded(token);
        vars.tokens.push(new CelJwtToken(d.header, d.payload, d.signature, false, 'header', t.name));
        return fail(vars, s, r);
      }
      vars.tokens.push(new CelJwtToken(r.header, r.payload, token.split('.')[2] ?? '', true, 'header', t.name));
    }
    return null;
  })();
}
