import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from 'node:crypto';

/**
 * Sealed values (AES-256-GCM) shared by the ingress's sign-in cookies (oidc-session.ts) and the
 * SAML hand-offs between the control plane and the ingress nodes (`SamlHandoff` for sign-in,
 * `SamlLogoutHandoff` and `SamlLogoutBounce` for single logout, below), each sealed under its
 * own associated data so that one kind cannot be passed off as another.
 */

/** A sealed value: `v1.` + base64url(12-byte IV ‖ AES-256-GCM ciphertext ‖ 16-byte tag). */
const VERSION = 'v1.';
const IV_BYTES = 12;
const TAG_BYTES = 16;
/** Larger values are refused without decrypting (browsers cap a cookie at ~4 KiB anyway). */
const MAX_SEALED_CHARS = 4096;

/** Encrypts and authenticates `payload` (JSON) under `key`; `aad` binds the value to its purpose. */
export function seal(key: Buffer, aad: string, payload: unknown): string {
  const iv = randomBytes(IV_BYTES);
  const cipher = createCipheriv('aes-256-gcm', key, iv);
  cipher.setAAD(Buffer.from(aad, 'utf8'));
  const ct = Buffer.concat([cipher.update(JSON.stringify(payload), 'utf8'), cipher.final()]);
  return VERSION + Buffer.concat([iv, ct, cipher.getAuthTag()]).toString('base64url');
}

/** The payload of a sealed value, or null when it is malformed, tampered with, or sealed under another key or purpose. */
export function unseal(key: Buffer, aad: string, value: string | undefined | null): unknown {
  if (!value || value.length > MAX_SEALED_CHARS || !value.startsWith(VERSION)) return null;
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

// ---------------------------------------------------------------- SAML hand-off

/**
 * What the control plane's SAML assertion consumer service hands to the ingress, sealed, in the
 * query of the route's sign-in callback `https://<edge host><prefix>/.warren/saml/callback`.
 * Times are Unix seconds.
 */
export interface SamlHandoff {
  /** The NameID. */
  sub: string;
  email: string;
  name: string;
  /** The `state` of the ingress's pre-login cookie the sign-in started with (binds the hand-off to that browser). */
  st: string;
  /** The callback URL the hand-off is for. */
  cb: string;
  /** End of validity: at most SAML_HANDOFF_SECONDS after sealing. */
  exp: number;
  /** What single logout needs of the sign-in (absent from control planes older than single logout). */
  slo?: SamlLogoutRef;
}

export const SAML_HANDOFF_SECONDS = 60;
const HANDOFF_AAD = 'saml-handoff';

/**
 * The key sealing a route's hand-offs, from the per-route `handoff_secret` the control plane
 * derives from the route's SP private key and pushes to the ingress nodes in the route's saml
 * module (the private key itself stays on the control plane).
 */
export function samlHandoffKey(handoffSecret: string, routeId: string): Buffer {
  return Buffer.from(hkdfSync('sha256', Buffer.from(handoffSecret, 'utf8'), Buffer.from(routeId, 'utf8'), Buffer.from('warren/saml/handoff/v1', 'utf8'), 32));
}

export function sealSamlHandoff(key: Buffer, h: SamlHandoff): string {
  return seal(key, HANDOFF_AAD, h);
}

/** The hand-off when it is authentic, well-formed and current (`now` in Unix seconds), else null. */
export function openSamlHandoff(key: Buffer, value: string | null | undefined, now: number): SamlHandoff | null {
  const h = unseal(key, HANDOFF_AAD, value) as Partial<SamlHandoff> | null;
  if (!h || typeof h !== 'object') return null;
  if (typeof h.sub !== 'string' || !h.sub || typeof h.email !== 'string' || typeof h.name !== 'string' || typeof h.st !== 'string' || typeof h.cb !== 'string') return null;
  if (typeof h.exp !== 'number' || !Number.isFinite(h.exp) || now >= h.exp || h.exp > now + 2 * SAML_HANDOFF_SECONDS) return null;
  if (h.slo !== undefined && !readSamlLogoutRef(h.slo)) return null;
  return h as SamlHandoff;
}

// ---------------------------------------------------------------- SAML single logout

/**
 * What a SAML session keeps (in its sealed cookie) so that the control plane can later build a
 * LogoutRequest for it; the NameID itself is the session's `sub`. `f`: the NameID's Format, `q`:
 * NameQualifier, `sq`: SPNameQualifier, `si`: the AuthnStatement's SessionIndex. Short keys keep
 * the cookie small; the control plane leaves out a value over MAX_SAML_LOGOUT_FIELD_CHARS.
 */
export interface SamlLogoutRef {
  f?: string;
  q?: string;
  sq?: string;
  si?: string;
}

export const MAX_SAML_LOGOUT_FIELD_CHARS = 256;

/** `v` when it is a SamlLogoutRef (each field absent or a string within the limit, nothing else), else null. */
export function readSamlLogoutRef(v: unknown): SamlLogoutRef | null {
  if (!v || typeof v !== 'object' || Array.isArray(v)) return null;
  for (const [k, x] of Object.entries(v)) {
    if (!['f', 'q', 'sq', 'si'].includes(k) || typeof x !== 'string' || x.length > MAX_SAML_LOGOUT_FIELD_CHARS) return null;
  }
  return v as SamlLogoutRef;
}

/** How long the logout hand-offs below are valid: each is followed by an immediate redirect. */
export const SAML_LOGOUT_SECONDS = 60;

/**
 * SP-initiated single logout, edge → control plane (`<logout_url>?token=…`): the session the
 * edge has just cleared from this browser, sealed by the edge from that session cookie (so no one
 * can name another user's session), and where the control plane's "signed out" page links back
 * to (`ret`, an origin of the edge and the route's prefix; the control plane checks it against
 * the edge's hostports). Times are Unix seconds.
 */
export interface SamlLogoutHandoff {
  /** The NameID. */
  sub: string;
  slo?: SamlLogoutRef;
  ret: string;
  exp: number;
}

/**
 * IdP-initiated single logout, control plane → edge → control plane (`<prefix>/.warren/saml/logout?slo=…`,
 * then `<logout_url>?bounce=…`): the IdP's LogoutRequest being answered (`id`, and the IdP's
 * RelayState `rs` to echo), and `h`, the index of the edge origin the browser is sent to (the
 * control plane visits each origin of the route in turn: cookies are per host).
 */
export interface SamlLogoutBounce {
  id: string;
  rs: string;
  h: number;
  exp: number;
}

const LOGOUT_AAD = 'saml-logout';
const BOUNCE_AAD = 'saml-logout-bounce';

const currentUntil = (exp: unknown, now: number) => typeof exp === 'number' && Number.isFinite(exp) && now < exp && exp <= now + 2 * SAML_LOGOUT_SECONDS;

export function sealSamlLogoutHandoff(key: Buffer, h: SamlLogoutHandoff): string {
  return seal(key, LOGOUT_AAD, h);
}

/** The logout hand-off when it is authentic, well-formed and current (`now` in Unix seconds), else null. */
export function openSamlLogoutHandoff(key: Buffer, value: string | null | undefined, now: number): SamlLogoutHandoff | null {
  const h = unseal(key, LOGOUT_AAD, value) as Partial<SamlLogoutHandoff> | null;
  if (!h || typeof h !== 'object' || typeof h.sub !== 'string' || !h.sub || typeof h.ret !== 'string' || !currentUntil(h.exp, now)) return null;
  if (h.slo !== undefined && !readSamlLogoutRef(h.slo)) return null;
  return h as SamlLogoutHandoff;
}

export function sealSamlLogoutBounce(key: Buffer, b: SamlLogoutBounce): string {
  return seal(key, BOUNCE_AAD, b);
}

/** The bounce when it is authentic, well-formed and current (`now` in Unix seconds), else null. */
export function openSamlLogoutBounce(key: Buffer, value: string | null | undefined, now: number): SamlLogoutBounce | null {
  const b = unseal(key, BOUNCE_AAD, value) as Partial<SamlLogoutBounce> | null;
  if (!b || typeof b !== 'object' || typeof b.id !== 'string' || !b.id || typeof b.rs !== 'string' || typeof b.h !== 'number' || !Number.isInteger(b.h) || b.h < 0 || !currentUntil(b.exp, now)) return null;
  return b as SamlLogoutBounce;
}
