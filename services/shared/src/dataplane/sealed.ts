import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from 'node:crypto';

/**
 * Sealed values (AES-256-GCM) shared by the ingress's sign-in cookies (oidc-session.ts) and the
 * SAML hand-off from the control plane to the ingress nodes (see `SamlHandoff` below).
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
  return h as SamlHandoff;
}
