/**
 * Validation of the `jwt-validation` traffic-policy action (the ingress runs it:
 * `services/ingress/src/policy/jwt-action.ts`). Fields and semantics follow ngrok's:
 * https://ngrok.com/docs/traffic-policy/actions/jwt-validation
 *
 *   issuer.allow_list[].value      required, 1–16 issuers, each a URL; `iss` must equal one exactly
 *   audience.allow_list[].value    required when a policy is saved, as ngrok requires it (a token
 *                                  the same issuer minted for another API must not pass); 1–16
 *                                  values. A policy stored before this was required still runs at
 *                                  the ingress without an `aud` check
 *   http.tokens[]                  required, 1–4; {type, method, name, prefix?}; all must be present;
 *                                  method `header` (the default when left out) or `body` (a field
 *                                  of a form or JSON body), unique by method and name (any case)
 *   jws.allowed_algorithms         required, 1–10 distinct asymmetric JWS algorithms
 *   jws.keys.sources.additional_jkus   https URLs of JWK sets (at most 8)
 *   jws.keys.identification[].token_claims   optional, only `kid`: tokens must then carry a kid
 *
 * `jws.keys` and `jws.keys.sources` may be written as a mapping (ngrok's examples) or as a list
 * of mappings (ngrok's reference table); lists are merged.
 *
 * Where Warren differs, the policy is refused with a 400 rather than run differently:
 * - inbound rules only (the request phase), as ngrok (`on_http_request`);
 * - CEL interpolation (`${…}`) is not supported in any field;
 * - `none` and the HMAC algorithms (HS256/384/512) are refused: keys come from JWK sets of
 *   public keys, and a shared secret in a policy would be readable by everyone who can read it.
 * Warren extension: `jws.keys.sources.inline_keys`, a list of at most 32 public JWKs given in
 * the policy itself (RSA of 2048–4096 bits with an exponent of at most 32 bits, EC P-256/P-384/P-521, OKP Ed25519). They are checked
 * here structurally and then imported with `node:crypto` `createPublicKey` (synchronous: jose's
 * `importJWK` is async and `parse.ts` is sync, so jose itself only sees them at the ingress,
 * through `createLocalJWKSet`). At least one key source (a JKU or an inline key) is required.
 *
 * JKU URLs must be `https:` with a host, no credentials and no fragment. When a policy is saved,
 * a host that is a literal private, loopback, link-local or otherwise non-public address (or
 * `localhost`) is refused unless the operator sets `WARREN_JWKS_ALLOW_PRIVATE=1` in the control
 * plane's environment; the ingress checks again, with its own environment, when it fetches, and
 * also checks the addresses the host name resolves to (see the ingress's `jwt-action.ts`).
 *
 * Per-request cost (charged to the policy's total, as `restrict-ips` is): each token is decoded
 * (bounded by the 16 KiB request head; a body token longer than that is refused at the ingress),
 * a body with `body` tokens is scanned once (`JWT_BODY_SCAN_COST`), and each signature checked with at most
 * `JWT_VALIDATION_LIMITS.maxKeyAttempts` candidate keys, each priced by the slowest allowed
 * algorithm (measured with jose 6 on the reference machine, 8 KB claims: RS256 ~0.25 ms, PS256
 * ~0.33 ms, ES256 ~0.39 ms, EdDSA ~0.30 ms, ES384 ~1.0 ms, ES512 ~2.0 ms).
 */
import { createPublicKey } from 'node:crypto';
import { BlockList } from 'node:net';
import { normalizeIp } from '../cidr.js';
import { JWT_MAX_TOKENS } from './jwt-action-vars.js';
import { at, expectList, expectObj, noUnknownKeys, phaseKey, TrafficPolicyError, typeName } from './parse.js';
import type { JwtValidationConfig, PolicyDirection, TrafficPolicy } from './types.js';

export const JWT_VALIDATION_LIMITS = {
  maxIssuers: 16,
  maxAudiences: 16,
  /** Characters of one issuer or audience value. */
  valueChars: 1024,
  maxTokens: JWT_MAX_TOKENS,
  /** Characters of a token `prefix` (`Bearer `). */
  prefixChars: 64,
  /**
   * Characters of a token read from a body field (after decoding): a header token is bounded by
   * the 16 KiB request head, and the result variables' cost (`cost.ts`) assumes that bound.
   */
  bodyTokenChars: 16 * 1024,
  maxAlgorithms: 10,
  /** `additional_jkus`, over all `keys` entries. */
  maxJkus: 8,
  /**
   * Distinct `additional_jkus` URLs over all the policy's jwt-validation actions: the ingress
   * keeps (and refreshes) every set the config names, so a policy's share is bounded.
   */
  maxJkusPerPolicy: 16,
  jkuChars: 2048,
  /** `inline_keys`, over all `keys` entries. */
  maxInlineKeys: 32,
  /** `keys` / `sources` / `identification` written as lists: entries of each. */
  maxListEntries: 8,
  /** Largest RSA modulus accepted (inline keys here; keys of a fetched JWKS at the ingress). */
  maxRsaBits: 4096,
  minRsaBits: 2048,
  /**
   * Largest RSA public exponent, in bits. An RSA verification's cost grows with the exponent's
   * length and OpenSSL bounds it (64 bits) only for moduli over 3072 bits: a 3072-bit key with a
   * 3071-bit exponent took ~6.9 ms per verification (jose, reference machine), 17× the price
   * below. Real keys use 65537 (17 bits), a few 3.
   */
  maxRsaExponentBits: 32,
  /**
   * Candidate keys tried for one token when several match (no `kid`, or a `kid` shared by
   * several keys): enough for a key rotation's overlap.
   */
  maxKeyAttempts: 2,
} as const;

/** The algorithms accepted in `jws.allowed_algorithms` (asymmetric JWS, RFC 7518 / RFC 8037). */
export const JWT_ALGORITHMS = ['RS256', 'RS384', 'RS512', 'PS256', 'PS384', 'PS512', 'ES256', 'ES384', 'ES512', 'EdDSA', 'Ed25519'] as const;

/** `http.tokens[].type` values ngrok documents. */
export const JWT_TOKEN_TYPES = ['id_token', 'access_token', 'at+jwt', 'it+jwt', 'plain', 'jwt'] as const;

/**
 * Verification cost of one signature, ≈ ns (about 1.2× the figures measured, rounded up;
 * RSA priced for a 4096-bit modulus, the largest accepted).
 */
const ALG_COST: Record<(typeof JWT_ALGORITHMS)[number], number> = {
  RS256: 400_000,
  RS384: 400_000,
  RS512: 400_000,
  PS256: 450_000,
  PS384: 450_000,
  PS512: 450_000,
  ES256: 500_000,
  ES384: 1_200_000,
  ES512: 2_400_000,
  EdDSA: 400_000,
  Ed25519: 400_000,
};
/** Finding, un-prefixing and decoding one token (base64url and JSON of at most a 16 KiB head). */
const TOKEN_DECODE_COST = 150_000;

/**
 * Scanning a buffered body (at most 1 MiB) once for the `body` tokens' fields, ≈ ns: the
 * ingress's byte scanners (`services/ingress/src/policy/jwt-body.ts`) take 1–3.5× a bare loop
 * over the same bytes for 1 MiB bodies of the worst shapes (175,000 tiny top-level members,
 * escaped names, numbers, deep nesting, and keys one byte short of the wanted names: four wanted
 * names of 128 characters sharing 127, over 1 MiB of such keys, raw or escaped, in JSON or a
 * form — a candidate name is hashed once and compared byte by byte only on a hash match, so this
 * is no longer ~7× as when each wanted name was compared in turn), a bare loop over 1 MiB being
 * ~0.5 ms on the reference machine (measured on a loaded 2-core machine, where it took
 * 1.3–1.8 ms); 4× it.
 */
export const JWT_BODY_SCAN_COST = 2_000_000;

/** What one run of `jwt-validation` costs at worst (≈ ns), charged to the policy's total. */
export function jwtValidationCost(c: JwtValidationConfig): number {
  const slowest = Math.max(...c.algorithms.map((a) => ALG_COST[a as keyof typeof ALG_COST] ?? 2_400_000));
  const body = c.tokens.some((t) => t.method === 'body') ? JWT_BODY_SCAN_COST : 0;
  return body + c.tokens.length * (TOKEN_DECODE_COST + JWT_VALIDATION_LIMITS.maxKeyAttempts * slowest);
}

/** The environment switch that lets JWK set URLs name private / loopback hosts. */
export const JWKS_ALLOW_PRIVATE_ENV = 'WARREN_JWKS_ALLOW_PRIVATE';

/**
 * True when the operator's switch `name` (`WARREN_JWKS_ALLOW_PRIVATE`, `WARREN_OIDC_ALLOW_PRIVATE`)
 * is `1`: tenant-supplied URLs of that kind may then name private / loopback hosts.
 */
export function privateHostsAllowed(name: string, env: NodeJS.ProcessEnv = process.env): boolean {
  return env[name] === '1';
}

export function jwksPrivateAllowed(env: NodeJS.ProcessEnv = process.env): boolean {
  return privateHostsAllowed(JWKS_ALLOW_PRIVATE_ENV, env);
}

/**
 * Non-public ranges: loopback, private, shared (CGNAT), link-local, multicast, reserved,
 * documentation. One list per family: a BlockList matches an IPv4 address against IPv6 rules as
 * `::ffff:a.b.c.d`, so one list would find every IPv4 address in `::ffff:0:0/96`.
 */
const NON_PUBLIC_V4 = new BlockList();
const NON_PUBLIC_V6 = new BlockList();
for (const [net, prefix] of [
  ['0.0.0.0', 8],
  ['10.0.0.0', 8],
  ['100.64.0.0', 10],
  ['127.0.0.0', 8],
  ['169.254.0.0', 16],
  ['172.16.0.0', 12],
  ['192.0.0.0', 24],
  ['192.0.2.0', 24],
  ['192.168.0.0', 16],
  ['198.18.0.0', 15],
  ['198.51.100.0', 24],
  ['203.0.113.0', 24],
  ['224.0.0.0', 4],
  ['240.0.0.0', 4],
] as const)
  NON_PUBLIC_V4.addSubnet(net, prefix, 'ipv4');
for (const [net, prefix] of [
  ['::', 96], // :: and ::1, and the deprecated IPv4-compatible ::a.b.c.d
  ['::ffff:0:0', 96], // IPv4-mapped: checked as IPv4 below, refused here if that fails
  ['::ffff:0:0:0', 96], // IPv4-translated (RFC 2765)
  ['64:ff9b::', 96], // NAT64
  ['64:ff9b:1::', 48], // local-use NAT64 (RFC 8215)
  ['2002::', 16], // 6to4: carries an IPv4 address, maybe a private one (deprecated, RFC 7526)
  ['100::', 64], // discard
  ['2001:db8::', 32],
  ['fc00::', 7],
  ['fe80::', 10],
  ['fec0::', 10],
  ['ff00::', 8],
] as const)
  NON_PUBLIC_V6.addSubnet(net, prefix, 'ipv6');

/**
 * True when `address` (an IP literal, IPv6 without brackets, maybe with a zone) is not a public
 * unicast address. Not an IP address: false.
 */
export function isNonPublicAddress(address: string): boolean {
  const n = normalizeIp(address);
  if (!n) return false;
  return n.type === 'ipv4' ? NON_PUBLIC_V4.check(n.addr, 'ipv4') : NON_PUBLIC_V6.check(n.addr, 'ipv6');
}

/** The URL's host as an IP literal or name (brackets of IPv6 removed, lower-case, no trailing dot). */
export function urlHost(u: URL): string {
  const h = u.hostname.toLowerCase();
  return (h.startsWith('[') && h.endsWith(']') ? h.slice(1, -1) : h).replace(/\.$/, '');
}

/**
 * Why a host (an IP literal, IPv6 with or without brackets, or a name) may not be fetched from
 * for a tenant — `localhost` / `*.localhost`, or a non-public IP — or null. Names other than
 * `localhost` pass here: the fetcher checks what they resolve to when it connects.
 */
export function nonPublicHostRefusal(host: string): string | null {
  const lower = host.toLowerCase();
  const h = (lower.startsWith('[') && lower.endsWith(']') ? lower.slice(1, -1) : lower).replace(/\.$/, '');
  if (h === 'localhost' || h.endsWith('.localhost')) return `${h} is a loopback host name`;
  if (isNonPublicAddress(h)) return `${h} is not a public address`;
  return null;
}

/** Why the URL's literal host may not be fetched (`localhost`, a non-public IP), or null (JWK sets, OpenID issuers). */
export function privateHostRefusal(u: URL): string | null {
  return nonPublicHostRefusal(urlHost(u));
}

/** The former name of `privateHostRefusal`. */
export const jwksHostRefusal = privateHostRefusal;

/**
 * Checks a JWK set URL: absolute `https:` with a host, no user info, no fragment. Returns the
 * URL as written, or a reason. `checkHost`: refuse literal non-public hosts too.
 */
export function checkJwksUrl(v: string, checkHost: boolean): { ok: true; url: URL } | { ok: false; reason: string } {
  let u: URL;
  try {
    u = new URL(v);
  } catch {
    return { ok: false, reason: `${JSON.stringify(v.slice(0, 200))} is not a valid URL` };
  }
  if (u.protocol !== 'https:') return { ok: false, reason: `must be an https URL, got ${JSON.stringify(u.protocol.slice(0, 20))} (JWK sets are fetched over TLS only)` };
  if (!u.hostname) return { ok: false, reason: 'must name a host' };
  if (u.username || u.password) return { ok: false, reason: 'must not hold credentials (user:password@)' };
  if (u.hash) return { ok: false, reason: 'must not have a fragment (#…)' };
  if (checkHost) {
    const why = privateHostRefusal(u);
    if (why) return { ok: false, reason: `${why}; JWK sets are fetched by the shared ingress, so private and loopback hosts are refused unless the operator sets ${JWKS_ALLOW_PRIVATE_ENV}=1` };
  }
  return { ok: true, url: u };
}

/** Private JWK members: a key holding any of them is not a public key. */
const PRIVATE_MEMBERS = ['d', 'p', 'q', 'dp', 'dq', 'qi', 'oth', 'k'];
const B64URL_RE = /^[A-Za-z0-9_-]+$/;
const EC_CURVES: Record<string, { bytes: number; alg: string }> = { 'P-256': { bytes: 32, alg: 'ES256' }, 'P-384': { bytes: 48, alg: 'ES384' }, 'P-521': { bytes: 66, alg: 'ES512' } };

function b64urlBytes(v: unknown, path: string, what: string): number {
  if (typeof v !== 'string' || v.length === 0 || !B64URL_RE.test(v)) throw new TrafficPolicyError(path, `${what} must be a non-empty base64url string`);
  return Buffer.from(v, 'base64url').length;
}

/** The size in bits of a base64url big-endian integer (an RSA modulus or exponent; leading zero bytes ignored). */
function modulusBits(n: string): number {
  const b = Buffer.from(n, 'base64url');
  let i = 0;
  while (i < b.length && b[i] === 0) i++;
  if (i === b.length) return 0;
  return (b.length - i - 1) * 8 + (32 - Math.clz32(b[i]!));
}

/**
 * Which algorithms of `JWT_ALGORITHMS` a JWK can verify (by its kty / crv), for refusing a key
 * no allowed algorithm could use.
 */
export function jwkAlgorithms(jwk: Record<string, unknown>): string[] {
  if (jwk.kty === 'RSA') return ['RS256', 'RS384', 'RS512', 'PS256', 'PS384', 'PS512'];
  if (jwk.kty === 'EC') return typeof jwk.crv === 'string' && EC_CURVES[jwk.crv] ? [EC_CURVES[jwk.crv]!.alg] : [];
  if (jwk.kty === 'OKP' && jwk.crv === 'Ed25519') return ['EdDSA', 'Ed25519'];
  return [];
}

/**
 * Checks one public JWK, structurally and then by importing it (`createPublicKey`). Returns a
 * copy holding only the members the ingress needs. Exported for the ingress (keys of a fetched
 * JWKS go through the same check; one that fails is skipped there).
 */
export function checkPublicJwk(v: unknown, path: string, algorithms: readonly string[]): Record<string, unknown> {
  const k = expectObj(v, path, 'a JWK');
  for (const m of PRIVATE_MEMBERS) {
    if (m in k) throw new TrafficPolicyError(at(path, m), k.kty === 'oct' ? 'symmetric (oct) keys are not supported; give public keys only' : 'is a private key member; give the public key only');
  }
  const kty = k.kty;
  if (kty !== 'RSA' && kty !== 'EC' && kty !== 'OKP') throw new TrafficPolicyError(at(path, 'kty'), `must be "RSA", "EC" or "OKP", got ${JSON.stringify(kty)}`);
  const out: Record<string, unknown> = { kty };
  if (kty === 'RSA') {
    b64urlBytes(k.n, at(path, 'n'), 'n');
    b64urlBytes(k.e, at(path, 'e'), 'e');
    const bits = modulusBits(k.n as string);
    const L = JWT_VALIDATION_LIMITS;
    if (bits < L.minRsaBits || bits > L.maxRsaBits) throw new TrafficPolicyError(at(path, 'n'), `the RSA modulus must have ${L.minRsaBits} to ${L.maxRsaBits} bits, got ${bits}`);
    const eBits = modulusBits(k.e as string);
    if (eBits < 2 || eBits > L.maxRsaExponentBits) throw new TrafficPolicyError(at(path, 'e'), `the RSA public exponent must have 2 to ${L.maxRsaExponentBits} bits (65537 is usual), got ${eBits}`);
    out.n = k.n;
    out.e = k.e;
  } else if (kty === 'EC') {
    const curve = typeof k.crv === 'string' ? EC_CURVES[k.crv] : undefined;
    if (!curve) throw new TrafficPolicyError(at(path, 'crv'), `must be "P-256", "P-384" or "P-521", got ${JSON.stringify(k.crv)}`);
    for (const c of ['x', 'y'] as const) {
      if (b64urlBytes(k[c], at(path, c), c) !== curve.bytes) throw new TrafficPolicyError(at(path, c), `must hold ${curve.bytes} bytes for ${k.crv as string}`);
    }
    Object.assign(out, { crv: k.crv, x: k.x, y: k.y });
  } else {
    if (k.crv !== 'Ed25519') throw new TrafficPolicyError(at(path, 'crv'), `must be "Ed25519", got ${JSON.stringify(k.crv)}`);
    if (b64urlBytes(k.x, at(path, 'x'), 'x') !== 32) throw new TrafficPolicyError(at(path, 'x'), 'must hold 32 bytes for Ed25519');
    Object.assign(out, { crv: k.crv, x: k.x });
  }
  if (k.kid !== undefined) {
    if (typeof k.kid !== 'string' || k.kid.length === 0 || k.kid.length > 256) throw new TrafficPolicyError(at(path, 'kid'), 'must be a string of 1 to 256 characters');
    out.kid = k.kid;
  }
  if (k.use !== undefined && k.use !== 'sig') throw new TrafficPolicyError(at(path, 'use'), `must be "sig" for a signature key, got ${JSON.stringify(k.use)}`);
  if (k.key_ops !== undefined && (!Array.isArray(k.key_ops) || !k.key_ops.includes('verify'))) throw new TrafficPolicyError(at(path, 'key_ops'), 'must include "verify"');
  const usable = jwkAlgorithms(out).filter((a) => algorithms.includes(a));
  if (k.alg !== undefined) {
    if (typeof k.alg !== 'string' || !jwkAlgorithms(out).includes(k.alg)) throw new TrafficPolicyError(at(path, 'alg'), `${JSON.stringify(k.alg)} is not an algorithm for this ${kty} key`);
    if (!algorithms.includes(k.alg)) throw new TrafficPolicyError(at(path, 'alg'), `${k.alg} is not in jws.allowed_algorithms, so this key could never be used`);
    out.alg = k.alg;
  } else if (usable.length === 0) {
    throw new TrafficPolicyError(path, `this ${kty}${out.crv ? ` ${out.crv as string}` : ''} key fits none of jws.allowed_algorithms (${algorithms.join(', ')})`);
  }
  try {
    const key = createPublicKey({ key: out as import('node:crypto').JsonWebKey, format: 'jwk' });
    if (key.type !== 'public') throw new Error('not a public key');
  } catch (err) {
    throw new TrafficPolicyError(path, `is not a valid public key: ${(err as Error).message.split('\n')[0]!.slice(0, 200)}`);
  }
  return out;
}

function noInterpolation(v: string, path: string): void {
  if (v.includes('${')) throw new TrafficPolicyError(path, 'CEL interpolation (${…}) is not supported in jwt-validation; write the value itself');
}

function nonEmptyList(v: unknown, path: string, max: number, what: string): unknown[] {
  const list = expectList(v, path, false);
  if (list.length === 0) throw new TrafficPolicyError(path, `must have at least one ${what}`);
  if (list.length > max) throw new TrafficPolicyError(path, `must have at most ${max} ${what}s, got ${list.length}`);
  return list;
}

/** A mapping, or a list of 1–8 mappings (ngrok writes `keys` / `sources` both ways). */
function objOrList(v: unknown, path: string, what: string): { obj: Record<string, unknown>; path: string }[] {
  if (Array.isArray(v)) {
    const list = nonEmptyList(v, path, JWT_VALIDATION_LIMITS.maxListEntries, 'entry');
    return list.map((e, i) => ({ obj: expectObj(e, at(path, i), what), path: at(path, i) }));
  }
  if (v === undefined || v === null) throw new TrafficPolicyError(path, 'is required');
  return [{ obj: expectObj(v, path, what), path }];
}

/** `issuer` / `audience`: `{allow_list: [{value}]}`, distinct values. */
function parseAllowList(v: unknown, path: string, what: 'issuer' | 'audience'): string[] {
  const o = expectObj(v, path, what);
  noUnknownKeys(o, path, ['allow_list']);
  const L = JWT_VALIDATION_LIMITS;
  const list = nonEmptyList(o.allow_list, at(path, 'allow_list'), what === 'issuer' ? L.maxIssuers : L.maxAudiences, what);
  const seen = new Set<string>();
  return list.map((e, i) => {
    const p = at(at(path, 'allow_list'), i);
    const entry = expectObj(e, p, `an ${what}`);
    noUnknownKeys(entry, p, ['value']);
    const value = entry.value;
    const vp = at(p, 'value');
    if (value === undefined || value === null) throw new TrafficPolicyError(vp, 'is required');
    if (typeof value !== 'string') throw new TrafficPolicyError(vp, `must be a string, got ${typeName(value)}`);
    if (value.length === 0) throw new TrafficPolicyError(vp, 'must not be empty');
    if (value.length > L.valueChars) throw new TrafficPolicyError(vp, `must have at most ${L.valueChars} characters`);
    noInterpolation(value, vp);
    if (what === 'issuer' && !URL.canParse(value)) throw new TrafficPolicyError(vp, `${JSON.stringify(value.slice(0, 200))} is not a valid URL (the issuer as in the iss claim, e.g. https://example.com/)`);
    if (seen.has(value)) throw new TrafficPolicyError(vp, `${JSON.stringify(value.slice(0, 200))} is listed twice`);
    seen.add(value);
    return value;
  });
}

const HEADER_NAME_RE = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,128}$/;
/** A body field name: 1–128 printable ASCII characters, no spaces. */
const FIELD_NAME_RE = /^[\x21-\x7e]{1,128}$/;
const PREFIX_RE = /^[\x20-\x7e]*$/;

/** `http.tokens[].method` values (ngrok ERR_NGROK_7170). */
export const JWT_TOKEN_METHODS = ['header', 'body'] as const;

function parseTokens(v: unknown, path: string): JwtValidationConfig['tokens'] {
  const list = nonEmptyList(v, path, JWT_VALIDATION_LIMITS.maxTokens, 'token');
  // By method and lower-case name: a token is identified by both (ngrok ERR_NGROK_7189).
  const seen = new Map<string, number>();
  return list.map((e, i) => {
    const p = at(path, i);
    const t = expectObj(e, p, 'a token');
    noUnknownKeys(t, p, ['type', 'method', 'name', 'prefix']);
    for (const k of ['type', 'name']) if (t[k] === undefined || t[k] === null) throw new TrafficPolicyError(at(p, k), 'is required');
    if (!(JWT_TOKEN_TYPES as readonly unknown[]).includes(t.type)) throw new TrafficPolicyError(at(p, 'type'), `must be one of ${JWT_TOKEN_TYPES.join(', ')}, got ${JSON.stringify(t.type)}`);
    const method = t.method ?? 'header';
    if (method !== 'header' && method !== 'body') throw new TrafficPolicyError(at(p, 'method'), `must be "header" or "body", got ${JSON.stringify(method)}`);
    const name = t.name;
    if (typeof name !== 'string') throw new TrafficPolicyError(at(p, 'name'), `must be a string, got ${typeName(name)}`);
    noInterpolation(name, at(p, 'name'));
    if (method === 'header' && !HEADER_NAME_RE.test(name)) throw new TrafficPolicyError(at(p, 'name'), `${JSON.stringify(name.slice(0, 200))} is not a valid header name`);
    if (method === 'body' && !FIELD_NAME_RE.test(name)) throw new TrafficPolicyError(at(p, 'name'), `${JSON.stringify(name.slice(0, 200))} is not a valid body field name (1 to 128 printable ASCII characters, no spaces)`);
    const key = `${method} ${name.toLowerCase()}`;
    const earlier = seen.get(key);
    if (earlier !== undefined) throw new TrafficPolicyError(at(p, 'name'), `${method === 'header' ? 'header' : 'body field'} ${JSON.stringify(name)} is already read by ${at(path, earlier)} (names are not case-sensitive)`);
    seen.set(key, i);
    let prefix = '';
    if (t.prefix !== undefined && t.prefix !== null) {
      if (typeof t.prefix !== 'string') throw new TrafficPolicyError(at(p, 'prefix'), `must be a string, got ${typeName(t.prefix)}`);
      noInterpolation(t.prefix, at(p, 'prefix'));
      if (t.prefix.length > JWT_VALIDATION_LIMITS.prefixChars) throw new TrafficPolicyError(at(p, 'prefix'), `must have at most ${JWT_VALIDATION_LIMITS.prefixChars} characters`);
      if (!PREFIX_RE.test(t.prefix)) throw new TrafficPolicyError(at(p, 'prefix'), 'must hold printable ASCII characters only');
      prefix = t.prefix;
    }
    return { type: t.type as JwtValidationConfig['tokens'][number]['type'], method, name, prefix };
  });
}

function parseAlgorithms(v: unknown, path: string): string[] {
  const list = nonEmptyList(v, path, JWT_VALIDATION_LIMITS.maxAlgorithms, 'algorithm');
  const seen = new Set<string>();
  return list.map((a, i) => {
    const p = at(path, i);
    if (typeof a !== 'string') throw new TrafficPolicyError(p, `must be a string, got ${typeName(a)}`);
    if (a.toLowerCase() === 'none') throw new TrafficPolicyError(p, '"none" is not allowed: unsigned tokens are never accepted');
    if (/^HS(256|384|512)$/i.test(a)) throw new TrafficPolicyError(p, `${a} is not supported: HMAC needs a shared secret, and keys come from JWK sets of public keys; use an asymmetric algorithm (${JWT_ALGORITHMS.join(', ')})`);
    if (!(JWT_ALGORITHMS as readonly string[]).includes(a)) throw new TrafficPolicyError(p, `${JSON.stringify(a.slice(0, 64))} is not a supported algorithm; supported: ${JWT_ALGORITHMS.join(', ')}`);
    if (seen.has(a)) throw new TrafficPolicyError(p, `${a} is listed twice`);
    seen.add(a);
    return a;
  });
}

/** `jws.keys`: merged sources and identification. */
function parseKeys(v: unknown, path: string, algorithms: string[], checkHosts: boolean): Pick<JwtValidationConfig, 'requireKid' | 'jkus' | 'inlineKeys'> {
  const L = JWT_VALIDATION_LIMITS;
  const jkus: string[] = [];
  const inlineKeys: Record<string, unknown>[] = [];
  let requireKid = false;
  const jkuSeen = new Map<string, string>();
  for (const k of objOrList(v, path, 'keys')) {
    noUnknownKeys(k.obj, k.path, ['sources', 'identification']);
    if (k.obj.identification !== undefined && k.obj.identification !== null) {
      for (const id of objOrList(k.obj.identification, at(k.path, 'identification'), 'identification')) {
        noUnknownKeys(id.obj, id.path, ['token_claims']);
        const claims = expectList(id.obj.token_claims, at(id.path, 'token_claims'), false);
        claims.forEach((c, i) => {
          if (c !== 'kid') throw new TrafficPolicyError(at(at(id.path, 'token_claims'), i), `only "kid" is supported, got ${JSON.stringify(c)}`);
          requireKid = true;
        });
      }
    }
    for (const s of objOrList(k.obj.sources, at(k.path, 'sources'), 'sources')) {
      noUnknownKeys(s.obj, s.path, ['additional_jkus', 'inline_keys']);
      if (s.obj.additional_jkus !== undefined && s.obj.additional_jkus !== null) {
        const jp = at(s.path, 'additional_jkus');
        expectList(s.obj.additional_jkus, jp, false).forEach((u, i) => {
          const p = at(jp, i);
          if (typeof u !== 'string') throw new TrafficPolicyError(p, `must be a URL string, got ${typeName(u)}`);
          noInterpolation(u, p);
          if (u.length > L.jkuChars) throw new TrafficPolicyError(p, `must have at most ${L.jkuChars} characters`);
          const r = checkJwksUrl(u, checkHosts);
          if (!r.ok) throw new TrafficPolicyError(p, r.reason);
          const earlier = jkuSeen.get(r.url.href);
          if (earlier) throw new TrafficPolicyError(p, `is already listed at ${earlier}`);
          jkuSeen.set(r.url.href, p);
          if (jkus.length >= L.maxJkus) throw new TrafficPolicyError(p, `at most ${L.maxJkus} JWK set URLs are allowed`);
          jkus.push(r.url.href);
        });
      }
      if (s.obj.inline_keys !== undefined && s.obj.inline_keys !== null) {
        const kp = at(s.path, 'inline_keys');
        expectList(s.obj.inline_keys, kp, false).forEach((jwk, i) => {
          if (inlineKeys.length >= L.maxInlineKeys) throw new TrafficPolicyError(at(kp, i), `at most ${L.maxInlineKeys} inline keys are allowed`);
          inlineKeys.push(checkPublicJwk(jwk, at(kp, i), algorithms));
        });
      }
    }
  }
  if (jkus.length === 0 && inlineKeys.length === 0) throw new TrafficPolicyError(at(path, 'sources'), 'needs at least one key source: additional_jkus (JWK set URLs) or inline_keys');
  return { requireKid, jkus, inlineKeys };
}

/**
 * `jwt-validation` config (see the top of this file). `saving`: the policy is being saved (the
 * control plane), so literal private JKU hosts are refused unless `WARREN_JWKS_ALLOW_PRIVATE=1`
 * and `audience` is required; the ingress, re-validating a stored policy, leaves the first check
 * to its fetcher and runs a stored policy without `audience` as it was saved.
 */
export function parseJwtValidationConfig(raw: unknown, path: string, direction: PolicyDirection, saving: boolean): JwtValidationConfig {
  if (direction !== 'inbound') {
    const typePath = path.endsWith('.config') ? `${path.slice(0, -'.config'.length)}.type` : path;
    throw new TrafficPolicyError(typePath, 'jwt-validation can only be used in inbound rules (it runs on the request)');
  }
  const c = expectObj(raw, path, 'config');
  noUnknownKeys(c, path, ['issuer', 'audience', 'http', 'jws']);
  for (const k of ['issuer', 'http', 'jws']) if (c[k] === undefined || c[k] === null) throw new TrafficPolicyError(at(path, k), 'is required');
  const issuers = parseAllowList(c.issuer, at(path, 'issuer'), 'issuer');
  if (saving && (c.audience === undefined || c.audience === null)) {
    throw new TrafficPolicyError(at(path, 'audience'), "is required (the `aud` values a token must carry: {allow_list: [{value: '<audience>'}]}); without it a token the same issuer minted for another API would pass");
  }
  const audiences = c.audience === undefined || c.audience === null ? null : parseAllowList(c.audience, at(path, 'audience'), 'audience');
  const http = expectObj(c.http, at(path, 'http'), 'http');
  noUnknownKeys(http, at(path, 'http'), ['tokens']);
  const tokens = parseTokens(http.tokens, at(at(path, 'http'), 'tokens'));
  const jws = expectObj(c.jws, at(path, 'jws'), 'jws');
  noUnknownKeys(jws, at(path, 'jws'), ['allowed_algorithms', 'keys']);
  const algorithms = parseAlgorithms(jws.allowed_algorithms, at(at(path, 'jws'), 'allowed_algorithms'));
  const keys = parseKeys(jws.keys, at(at(path, 'jws'), 'keys'), algorithms, saving && !jwksPrivateAllowed());
  return { issuers, audiences, tokens, algorithms, ...keys };
}

/**
 * At most `JWT_VALIDATION_LIMITS.maxJkusPerPolicy` distinct JWK set URLs over all the policy's
 * jwt-validation actions: a 400 naming the action that goes over.
 */
export function checkJwkSetUrls(policy: TrafficPolicy): void {
  const max = JWT_VALIDATION_LIMITS.maxJkusPerPolicy;
  const urls = new Set<string>();
  for (const direction of ['inbound', 'outbound'] as const) {
    policy[direction].forEach((rule, i) =>
      rule.actions.forEach((a, j) => {
        if (a.type !== 'jwt-validation') return;
        for (const u of a.config.jkus) urls.add(u);
        if (urls.size > max)
          throw new TrafficPolicyError(`${phaseKey(policy, direction)}[${i}].actions[${j}].config.jws.keys`, `too many JWK set URLs: a policy names at most ${max} distinct additional_jkus URLs over all its jwt-validation actions, this one takes it to ${urls.size}`);
      }),
    );
  }
}
