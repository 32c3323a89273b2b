import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from 'node:crypto';

/**
 * The pure parts of the `oidc` route module (see oidc.ts): key derivation, the sealed cookies,
 * session expiry, return-to sanitizing and the identity headers. No network, no clock of its own.
 */

/** A cookie value: `v1.` + base64url(12-byte IV ‖ AES-256-GCM ciphertext ‖ 16-byte tag). */
const VERSION = 'v1.';
const IV_BYTES = 12;
const TAG_BYTES = 16;
/** Larger cookies are refused without decrypting (browsers cap a cookie at ~4 KiB anyway). */
const MAX_COOKIE_CHARS = 4096;

export interface OidcKeys {
  /** Seals the session cookie. */
  session: Buffer;
  /** Seals the short-lived pre-login cookie. */
  login: Buffer;
}

/**
 * The route's cookie keys, the same on every ingress node with no shared state and no extra
 * config: HKDF-SHA256 with the route's `client_secret` as input key material, the route id as
 * salt and `warren/oidc/<purpose>/v1 ‖ issuer ‖ client_id` as info. Changing the secret, the
 * issuer or the client id (or recreating the route) therefore ends every session of the route.
 */
export function deriveOidcKeys(clientSecret: string, routeId: string, issuer: string, clientId: string): OidcKeys {
  const derive = (purpose: string) => Buffer.from(hkdfSync('sha256', Buffer.from(clientSecret, 'utf8'), Buffer.from(routeId, 'utf8'), Buffer.from(`warren/oidc/${purpose}/v1\0${issuer}\0${clientId}`, 'utf8'), 32));
  return { session: derive('session'), login: derive('login') };
}

/** Encrypts and authenticates `payload` (JSON) under `key`; `aad` binds the value to its cookie's purpose. */
export function seal(key: Buffer, aad: string, payload: unknown): string {
  const iv = randomBytes(IV_BYTES);
  const cipher = createCipheriv('aes-256-gcm', key, iv);
  cipher.setAAD(Buffer.from(aad, 'utf8'));
  const ct = Buffer.concat([cipher.update(JSON.stringify(payload), 'utf8'), cipher.final()]);
  return VERSION + Buffer.concat([iv, ct, cipher.getAuthTag()]).toString('base64url');
}

/** The payload of a sealed value, or null when it is malformed, tampered with, or sealed under another key or purpose. */
export function unseal(key: Buffer, aad: string, value: string | undefined): unknown {
  if (!value || value.length > MAX_COOKIE_CHARS || !value.startsWith(VERSION)) return null;
  const raw = Buffer.from(value.slice(VERSION.length), 'base64url');
  if (raw.length < IV_BYTES + TAG_BYTES + 2) return null;
  try {
    const decipher = createDecipheriv('aes-256-gcm', key, raw.subarray(0, IV_BYTES));
    decipher.setAAD(Buffer.from(aad, 'utf8'));
    decipher.setAuthTag(raw.subarray(raw.length - TAG_BYTES));
    const pt = Buffer.concat([decipher.update(raw.subarray(IV_BYTES, raw.length - TAG_BYTES)), decipher.final()]);
    return JSON.parse(pt.toString('utf8')) as unknown;
  } catch {
    return null;
  }
}

// ---------------------------------------------------------------- session

/** What the session cookie holds. Times are Unix seconds. */
export interface Session {
  /** Subject (`sub`) of the ID token. */
  sub: string;
  email: string;
  name: string;
  /** When the user signed in. */
  iat: number;
  /** When the session was last seen (refreshed at most once a minute, see SESSION_REFRESH_SECONDS). */
  seen: number;
  /** Hard end of the session: `iat + maximum_duration`. */
  exp: number;
}

/** `maximum_duration: 0` (never set) means this: one day. */
export const DEFAULT_MAXIMUM_DURATION = 24 * 3600;
/** A sliding session's last-seen time (and its cookie) is rewritten at most this often. */
export const SESSION_REFRESH_SECONDS = 60;

export interface SessionPolicy {
  /** Seconds; 0 → DEFAULT_MAXIMUM_DURATION. */
  maximumDuration: number;
  /** Seconds of inactivity after which the session ends; 0 → no inactivity limit. */
  inactivityTimeout: number;
}

export function newSession(identity: { sub: string; email: string; name: string }, now: number, p: SessionPolicy): Session {
  return { ...identity, iat: now, seen: now, exp: now + (p.maximumDuration || DEFAULT_MAXIMUM_DURATION) };
}

/** The session in a cookie value when it is well-formed and current, else null. */
export function readSession(key: Buffer, value: string | undefined, now: number, p: SessionPolicy): Session | null {
  const s = unseal(key, 'session', value) as Partial<Session> | null;
  if (!s || typeof s !== 'object') return null;
  if (typeof s.sub !== 'string' || !s.sub || typeof s.email !== 'string' || typeof s.name !== 'string') return null;
  if (!Number.isFinite(s.iat) || !Number.isFinite(s.seen) || !Number.isFinite(s.exp)) return null;
  return sessionCurrent(s as Session, now, p) ? (s as Session) : null;
}

/**
 * True while a session may be used: before its hard end, within `maximum_duration` of sign-in
 * (so lowering `maximum_duration` also shortens sessions already issued), not idle for
 * `inactivity_timeout` or longer, and not from the future (60 s of clock skew between nodes allowed).
 */
export function sessionCurrent(s: Session, now: number, p: SessionPolicy): boolean {
  if (s.iat > now + 60 || s.seen > now + 60) return false;
  if (now >= s.exp) return false;
  if (now >= s.iat + (p.maximumDuration || DEFAULT_MAXIMUM_DURATION)) return false;
  if (p.inactivityTimeout > 0 && now >= s.seen + p.inactivityTimeout) return false;
  return true;
}

/** Whether this request should rewrite the cookie with a new last-seen time: only sliding sessions, at most once a minute. */
export function needsRefresh(s: Session, now: number, p: SessionPolicy): boolean {
  return p.inactivityTimeout > 0 && now - s.seen >= SESSION_REFRESH_SECONDS;
}

// ---------------------------------------------------------------- pre-login state

/** The pre-login cookie: what the callback checks the IdP's answer against. */
export interface LoginState {
  state: string;
  nonce: string;
  /** PKCE code verifier. */
  verifier: string;
  /** Same-host relative URL to return to (already sanitized). */
  returnTo: string;
  /** Unix seconds after which the login attempt is void. */
  exp: number;
}

/** How long a sign-in at the IdP may take. */
export const LOGIN_STATE_SECONDS = 600;

export function readLoginState(key: Buffer, value: string | undefined, now: number): LoginState | null {
  const l = unseal(key, 'login', value) as Partial<LoginState> | null;
  if (!l || typeof l !== 'object') return null;
  if (typeof l.state !== 'string' || typeof l.nonce !== 'string' || typeof l.verifier !== 'string' || typeof l.returnTo !== 'string' || !Number.isFinite(l.exp)) return null;
  if (now >= l.exp!) return null;
  return l as LoginState;
}

// ---------------------------------------------------------------- cookies

/** The value of cookie `name` in a `Cookie` header (the first one), or undefined. */
export function getCookie(header: string | undefined, name: string): string | undefined {
  if (!header) return undefined;
  let i = 0;
  while (i < header.length) {
    let end = header.indexOf(';', i);
    if (end < 0) end = header.length;
    const eq = header.indexOf('=', i);
    if (eq > i && eq < end && header.slice(i, eq).trim() === name) return header.slice(eq + 1, end).trim();
    i = end + 1;
  }
  return undefined;
}

/** A `Cookie` header without the cookies `drop` says to drop; null when nothing is left. */
export function withoutCookies(header: string, drop: (name: string) => boolean): string | null {
  const kept: string[] = [];
  for (const part of header.split(';')) {
    const p = part.trim();
    if (!p) continue;
    const eq = p.indexOf('=');
    const name = eq < 0 ? p : p.slice(0, eq).trim();
    if (!drop(name)) kept.push(p);
  }
  return kept.length ? kept.join('; ') : null;
}

export interface CookieAttributes {
  path: string;
  maxAge: number;
  secure: boolean;
}

/** A `Set-Cookie` value: HttpOnly, SameSite=Lax, Secure on HTTPS. */
export function setCookie(name: string, value: string, a: CookieAttributes): string {
  return `${name}=${value}; Path=${a.path}; Max-Age=${Math.max(0, Math.floor(a.maxAge))}; HttpOnly; SameSite=Lax${a.secure ? '; Secure' : ''}`;
}

// ---------------------------------------------------------------- return-to

const CONTROL = /[\u0000-\u001f\u007f]/;

/**
 * A same-host relative URL (path and query) to return to after sign-in, or `fallback`. Refuses
 * anything that a browser could resolve to another origin: absolute URLs, scheme-relative
 * `//host`, backslashes (browsers read `/\host` as `//host`), control characters, and overlong
 * values; also refuses the module's own reserved paths (no redirect loop).
 */
export function sanitizeReturnTo(raw: string | null | undefined, fallback: string, reserved: (path: string) => boolean = () => false): string {
  if (!raw || raw.length > 2048 || raw[0] !== '/' || raw[1] === '/' || raw.includes('\\') || CONTROL.test(raw)) return fallback;
  let u: URL;
  try {
    u = new URL(raw, 'https://warren.invalid');
  } catch {
    return fallback;
  }
  if (u.origin !== 'https://warren.invalid') return fallback;
  if (reserved(u.pathname)) return fallback;
  return u.pathname + u.search;
}

// ---------------------------------------------------------------- identity headers

/** Upstream identity headers (ngrok's names; see oidc.ts). */
export const IDENTITY_HEADERS = { email: 'ngrok-auth-user-email', id: 'ngrok-auth-user-id', name: 'ngrok-auth-user-name' } as const;
/** Every client header with this prefix is dropped, so that only the ingress sets identity headers. */
export const IDENTITY_HEADER_PREFIX = 'ngrok-auth-';

/** Drops every `ngrok-auth-*` header (any case) from raw pairs. Edits in place. */
export function stripIdentityHeaders(pairs: string[]): void {
  let w = 0;
  for (let i = 0; i + 1 < pairs.length; i += 2) {
    if (pairs[i]!.toLowerCase().startsWith(IDENTITY_HEADER_PREFIX)) continue;
    pairs[w++] = pairs[i]!;
    pairs[w++] = pairs[i + 1]!;
  }
  pairs.length = w;
}

/**
 * A claim as a header value: control characters dropped, and non-ASCII text sent as its UTF-8
 * bytes (what most proxies do; Node refuses characters above U+00FF in a header).
 */
export function headerValue(v: string): string {
  // eslint-disable-next-line no-control-regex
  const clean = v.replace(/[\u0000-\u001f\u007f]/g, '').slice(0, 1024);
  return /^[\x20-\x7e]*$/.test(clean) ? clean : Buffer.from(clean, 'utf8').toString('latin1');
}
