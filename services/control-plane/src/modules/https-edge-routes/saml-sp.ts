import { createPrivateKey, randomBytes } from 'node:crypto';
import { DOMParser } from '@xmldom/xmldom';
import { SAML, ValidateInResponseTo, type Profile } from '@node-saml/node-saml';
import { MAX_SAML_LOGOUT_FIELD_CHARS, seal, unseal, type SamlLogoutRef } from '@warren/shared';
import { parseIdpMetadata, samlRelayKey, samlServiceUrls, type IdpInfo, type StoredSaml } from './saml.js';

/**
 * The SAML service provider of one route (node-saml for the protocol and XML-DSig): the signed
 * AuthnRequest, the checks on the IdP's Response, and the SP metadata. Pure apart from the replay
 * store it is given; the HTTP side is saml.http.ts.
 *
 * Checks on a Response (all must pass):
 * - node-saml: an XML signature by one of the IdP's signing certificates from `idp_metadata`
 *   over the assertion, or over the whole Response (then the assertion is read from the signed
 *   Response), exactly one assertion, plain or encrypted (`EncryptedAssertion`, see below),
 *   audience = our entity id, NotBefore / NotOnOrAfter of the Conditions and of the bearer
 *   SubjectConfirmation with CLOCK_SKEW_MS, and at most MAX_ASSERTION_AGE_MS after IssueInstant;
 * - here: the assertion's Issuer = the IdP's entityID; IssueInstant not in the future; the
 *   bearer SubjectConfirmationData's Recipient and the Response's Destination (when present) =
 *   our ACS URL; InResponseTo (Response and SubjectConfirmationData, when present) = the request
 *   id sealed in RelayState; no InResponseTo at all is an IdP-initiated Response, refused unless
 *   `allow_idp_initiated`; the assertion ID not seen before for this route (replay store, rows
 *   kept REPLAY_WINDOW_MS); `authorized_groups` against GROUP_ATTRIBUTES.
 *
 * Encrypted assertions: the SP key pair (RSA-2048 from `newSamlSigningKey`, key usage
 * digitalSignature + keyEncipherment) also decrypts, so the SP metadata lists its certificate
 * with `use="encryption"` too (one key for both uses: the IdP has only one certificate to trust,
 * and nothing in our use of it lets one use serve as an oracle for the other). Decryption happens
 * inside node-saml (xml-encryption), and every check above then applies to the decrypted
 * assertion: it must carry the IdP's signature itself, or the Response around the ciphertext
 * must be signed (encryption proves nothing about the sender: our certificate is public). Only
 * ENCRYPTION_ALGORITHMS are accepted (checked before decrypting: no RSA PKCS#1 v1.5, which Node
 * refuses anyway, and no 3DES); a Response with an EncryptedAssertion that fails before a valid
 * signature was found gets one message whatever the cause (bad key, tampered ciphertext, bad
 * padding, no signature), so that the answers are no padding oracle for AES-CBC ciphertexts.
 */

export const CLOCK_SKEW_MS = 60_000;
/** An assertion is accepted at most this long after its IssueInstant (browsers post it at once). */
export const MAX_ASSERTION_AGE_MS = 10 * 60_000;
/** How long an accepted assertion id is remembered: no assertion can pass the time checks after it. */
export const REPLAY_WINDOW_MS = MAX_ASSERTION_AGE_MS + 2 * CLOCK_SKEW_MS;
/**
 * The identity and its single logout details (JSON) together stay within this, so that the
 * sealed session cookie stays well under 4 KiB; past it the details are left out (a later
 * LogoutRequest then names only the NameID, which ends every session of the user at the IdP).
 */
export const MAX_SESSION_IDENTITY_CHARS = 2048;
/** A longer RelayState is refused (ours are sealed values of a few hundred characters; SAML bindings §3.4.3 even say 80 bytes). */
export const MAX_RELAY_STATE_CHARS = 4096;
/** How long the IdP may take to answer a request (RelayState lifetime). */
export const LOGIN_SECONDS = 600;

/**
 * Attribute names whose values are the user's groups for `authorized_groups` (values compared
 * exactly, case-sensitively): `groups`, `group`, `memberOf`, `isMemberOf`, Entra ID's
 * `http://schemas.microsoft.com/ws/2008/06/identity/claims/groups` (object ids, or names when the
 * app is so configured), ADFS's `http://schemas.xmlsoap.org/claims/Group`, and eduPerson's
 * `urn:oid:1.3.6.1.4.1.5923.1.5.1.1` (isMemberOf).
 */
export const GROUP_ATTRIBUTES = [
  'groups',
  'group',
  'memberOf',
  'isMemberOf',
  'http://schemas.microsoft.com/ws/2008/06/identity/claims/groups',
  'http://schemas.xmlsoap.org/claims/Group',
  'urn:oid:1.3.6.1.4.1.5923.1.5.1.1',
];
const EMAIL_ATTRIBUTES = ['email', 'mail', 'emailAddress', 'http://schemas.xmlsoap.org/ws/2005/05/identity/claims/emailaddress', 'urn:oid:0.9.2342.19200300.100.1.3'];
const NAME_ATTRIBUTES = [
  'displayName',
  'name',
  'http://schemas.microsoft.com/identity/claims/displayname',
  'http://schemas.xmlsoap.org/ws/2005/05/identity/claims/name',
  'urn:oid:2.16.840.1.113730.3.1.241',
  'cn',
];
const EMAIL_NAMEID = 'urn:oasis:names:tc:SAML:1.1:nameid-format:emailAddress';

/** A refusal of the IdP's answer or of the request: 400 (7110/7111/7112) or 403 (7109). `detail` is for the log only. */
export class SamlRefused extends Error {
  constructor(
    readonly code: 7109 | 7110 | 7111 | 7112,
    message: string,
    readonly detail?: string,
  ) {
    super(message);
  }
}

const XMLENC = 'http://www.w3.org/2001/04/xmlenc#';
const XMLENC11 = 'http://www.w3.org/2009/xmlenc11#';
/** Content and key-transport algorithms accepted in an EncryptedAssertion (xml-encryption decrypts these). */
export const ENCRYPTION_ALGORITHMS: ReadonlySet<string> = new Set([`${XMLENC11}aes256-gcm`, `${XMLENC11}aes128-gcm`, `${XMLENC}aes256-cbc`, `${XMLENC}aes128-cbc`, `${XMLENC}rsa-oaep-mgf1p`]);

/**
 * The key that decrypts EncryptedAssertions (and EncryptedIDs of logout requests): the SP's
 * private key when it is an RSA key, else undefined (then only plain assertions are accepted).
 */
export function decryptionKey(m: StoredSaml): string | undefined {
  try {
    return createPrivateKey(m.signing.private_key_pem).asymmetricKeyType === 'rsa' ? m.signing.private_key_pem : undefined;
  } catch {
    return undefined;
  }
}

/** Remembers an assertion id until `expiresAtMs`; false when it was already there (a replay). */
export type ReplayStore = (assertionId: string, expiresAtMs: number) => Promise<boolean>;

export interface SpContext {
  routeId: string;
  /** The control plane's public base URL. */
  baseUrl: string;
  module: StoredSaml;
}

/** What RelayState carries, sealed: the request id, the ingress's state and callback URL. */
interface Relay {
  i: string;
  s: string;
  c: string;
  e: number;
}

export interface SpInstance {
  idp: IdpInfo;
  urls: ReturnType<typeof samlServiceUrls>;
  saml: SAML;
}

/**
 * The route's SP (throws with a reason when `idp_metadata` cannot be used). `logoutUrl` picks
 * where its logout messages go (an IdP SingleLogoutService); without one node-saml would send
 * them to the SSO URL, so only saml-slo.ts picks one, and only it builds logout messages.
 */
export function serviceProvider(c: SpContext, requestId?: string, logoutUrl?: (idp: IdpInfo) => string | undefined): SpInstance {
  const idp = parseIdpMetadata(c.module.idp_metadata);
  const logout = logoutUrl?.(idp);
  const urls = samlServiceUrls(c.baseUrl, c.routeId);
  const saml = new SAML({
    idpCert: idp.certs,
    issuer: urls.entity_id,
    audience: urls.entity_id,
    callbackUrl: urls.assertion_consumer_service_url,
    logoutCallbackUrl: urls.single_logout_url,
    entryPoint: idp.ssoRedirect ?? idp.ssoPost ?? undefined,
    ...(logout ? { logoutUrl: logout } : {}),
    // node-saml checks this Issuer on logout messages (saml-slo.ts checks it again, with Destination).
    idpIssuer: idp.entityId,
    authnRequestBinding: idp.ssoRedirect ? 'HTTP-Redirect' : 'HTTP-POST',
    privateKey: c.module.signing.private_key_pem,
    publicCert: c.module.signing.certificate_pem,
    decryptionPvk: decryptionKey(c.module),
    signatureAlgorithm: 'sha256',
    digestAlgorithm: 'sha256',
    identifierFormat: c.module.nameid_format,
    forceAuthn: c.module.force_authn,
    // Many IdPs fail a request that asks for password authentication when the user signed in otherwise.
    disableRequestedAuthnContext: true,
    // Either the Response or the assertion must carry a valid signature (node-saml then reads
    // only the signed part).
    wantAssertionsSigned: false,
    wantAuthnResponseSigned: false,
    acceptedClockSkewMs: CLOCK_SKEW_MS,
    maxAssertionAgeMs: MAX_ASSERTION_AGE_MS,
    // InResponseTo is checked here against the id sealed in RelayState (no shared request cache).
    validateInResponseTo: ValidateInResponseTo.never,
    generateUniqueId: () => requestId ?? newRequestId(),
  });
  return { idp, urls, saml };
}

/** An AuthnRequest ID (an XML NCName). */
export function newRequestId(): string {
  return `_${randomBytes(20).toString('hex')}`;
}

/**
 * Where to send the browser to sign in: the IdP's SSO URL with a signed AuthnRequest (HTTP-Redirect
 * binding), or, for an IdP with only HTTP-POST, an auto-submitting form page.
 */
export async function startLogin(c: SpContext, state: string, callbackUrl: string, nowMs: number): Promise<{ redirect: string } | { form: string }> {
  const requestId = newRequestId();
  const sp = serviceProvider(c, requestId);
  const relay: Relay = { i: requestId, s: state, c: callbackUrl, e: Math.floor(nowMs / 1000) + LOGIN_SECONDS };
  const relayState = seal(samlRelayKey(c.module.signing.private_key_pem, c.routeId), 'saml-relay', relay);
  if (sp.idp.ssoRedirect) return { redirect: await sp.saml.getAuthorizeUrlAsync(relayState, undefined, {}) };
  return { form: await sp.saml.getAuthorizeFormAsync(relayState) };
}

/**
 * The SP metadata: entity id, the ACS (HTTP-POST), the single logout service (HTTP-POST, as
 * node-saml writes it; the endpoint takes HTTP-Redirect too), the NameID format, and the SP
 * certificate as the signing key and, when the key is RSA, as the encryption key (with the
 * content encryption methods xml-encryption supports). The document is signed with the SP key
 * (node-saml `signMetadata`: an enveloped RSA-SHA256 signature over the EntityDescriptor, first
 * child, exclusive C14N); it proves only that the holder of the key in it wrote it, which an IdP
 * that pins the certificate (or fetches the metadata again later) can check.
 */
export function spMetadata(c: SpContext): string {
  const urls = samlServiceUrls(c.baseUrl, c.routeId);
  const decryptionPvk = decryptionKey(c.module);
  const saml = new SAML({
    idpCert: 'unused',
    issuer: urls.entity_id,
    callbackUrl: urls.assertion_consumer_service_url,
    logoutCallbackUrl: urls.single_logout_url,
    identifierFormat: c.module.nameid_format,
    privateKey: c.module.signing.private_key_pem,
    decryptionPvk,
    wantAssertionsSigned: true,
    signMetadata: true,
    signatureAlgorithm: 'sha256',
    digestAlgorithm: 'sha256',
  });
  return saml.generateServiceProviderMetadata(decryptionPvk ? c.module.signing.certificate_pem : null, c.module.signing.certificate_pem);
}

export interface AcceptedLogin {
  identity: { sub: string; email: string; name: string };
  /** What a later LogoutRequest for this sign-in needs (kept in the session cookie; values over MAX_SAML_LOGOUT_FIELD_CHARS left out). */
  logout: SamlLogoutRef;
  /** SP-initiated: the ingress callback and state from RelayState. IdP-initiated: null. */
  relay: { state: string; callbackUrl: string } | null;
  /** IdP-initiated: the RelayState as the IdP sent it (a target URL, unchecked). */
  target: string | null;
}

/** node-saml's refusals of an assertion whose signature was already verified. */
const AFTER_SIGNATURE = /^(SAML assertion |Unable to process multiple conditions|No valid subject confirmation)/;

interface DomElement {
  localName: string | null;
  namespaceURI: string | null;
  childNodes: ArrayLike<{ nodeType: number }>;
  getAttribute(name: string): string | null;
}

function childElementsOf(el: DomElement): DomElement[] {
  const out: DomElement[] = [];
  for (let i = 0; i < el.childNodes.length; i++) if (el.childNodes[i]!.nodeType === 1) out.push(el.childNodes[i] as unknown as DomElement);
  return out;
}

function descendantsNamed(el: DomElement, local: string, out: DomElement[] = []): DomElement[] {
  for (const c of childElementsOf(el)) {
    if (c.localName === local) out.push(c);
    descendantsNamed(c, local, out);
  }
  return out;
}

/** The Response's EncryptedAssertion children (the only place node-saml reads one from). */
function encryptedAssertions(root: DomElement): DomElement[] {
  return childElementsOf(root).filter((e) => e.localName === 'EncryptedAssertion');
}

type Xml2Js = Record<string, unknown> & { $?: Record<string, string> };
const first = (v: unknown): Xml2Js | undefined => (Array.isArray(v) ? (v[0] as Xml2Js) : undefined);
const text = (v: unknown): string => (typeof v === 'string' ? v : v && typeof v === 'object' && typeof (v as { _?: unknown })._ === 'string' ? (v as { _: string })._ : '');

function values(profile: Profile, names: readonly string[]): string[] {
  const attrs = (profile.attributes ?? {}) as Record<string, unknown>;
  const out: string[] = [];
  for (const n of names) {
    const v = attrs[n];
    for (const x of Array.isArray(v) ? v : [v]) {
      const s = text(x);
      if (s) out.push(s);
    }
  }
  return out;
}

/** Validates a posted SAMLResponse (base64) with its RelayState; see the checks at the top. */
export async function acceptResponse(c: SpContext, samlResponse: string, relayState: string | undefined, nowMs: number, replay: ReplayStore): Promise<AcceptedLogin> {
  if (!samlResponse || samlResponse.length > 2 * 1024 * 1024) throw new SamlRefused(7111, 'the SAMLResponse is missing or too large');
  if (relayState !== undefined && relayState.length > MAX_RELAY_STATE_CHARS) throw new SamlRefused(7111, `the RelayState is over ${MAX_RELAY_STATE_CHARS} characters`);
  const xml = Buffer.from(samlResponse, 'base64').toString('utf8');
  if (/<!DOCTYPE/i.test(xml)) throw new SamlRefused(7111, 'the SAMLResponse holds a DOCTYPE declaration');
  let root: DomElement | null = null;
  try {
    root = new DOMParser({ onError: () => {} }).parseFromString(xml, 'text/xml').documentElement as unknown as DomElement | null;
  } catch {
    root = null;
  }
  if (!root || root.localName !== 'Response') throw new SamlRefused(7111, 'the SAMLResponse is not a SAML Response');
  const encrypted = encryptedAssertions(root);
  if (encrypted.length > 0) {
    if (!decryptionKey(c.module)) throw new SamlRefused(7111, "the assertion is encrypted, but this service's key is not an RSA key and cannot decrypt it");
    const algorithms = encrypted.flatMap((e) => descendantsNamed(e, 'EncryptionMethod')).map((m) => m.getAttribute('Algorithm') ?? '');
    const unsupported = algorithms.find((a) => !ENCRYPTION_ALGORITHMS.has(a));
    if (unsupported !== undefined) throw new SamlRefused(7111, `the assertion is encrypted with an algorithm this service does not accept (${unsupported.slice(0, 100) || 'none named'}); accepted: ${[...ENCRYPTION_ALGORITHMS].join(', ')}`);
  }

  const relay = unseal(samlRelayKey(c.module.signing.private_key_pem, c.routeId), 'saml-relay', relayState) as Relay | null;
  let sp: SpInstance;
  try {
    sp = serviceProvider(c);
  } catch (err) {
    throw new SamlRefused(7110, `the route's SAML configuration cannot be used: ${(err as Error).message}`);
  }
  let profile: Profile | null;
  try {
    ({ profile } = await sp.saml.validatePostResponseAsync({ SAMLResponse: samlResponse }));
  } catch (err) {
    const message = String((err as Error)?.message ?? err).slice(0, 300);
    // Past a valid signature (node-saml's checks of the signed assertion) the reason says nothing
    // about the ciphertext; before it, an encrypted assertion gets one answer (no padding oracle).
    if (encrypted.length > 0 && !AFTER_SIGNATURE.test(message)) {
      throw new SamlRefused(7111, 'the encrypted assertion could not be decrypted with this service\'s key, or neither it nor the Response carries a valid signature of the IdP', message);
    }
    throw new SamlRefused(7111, `the SAML response was not accepted: ${message}`);
  }
  if (!profile) throw new SamlRefused(7111, 'the SAML response carries no assertion');
  const acs = sp.urls.assertion_consumer_service_url;

  const destination = root.getAttribute('Destination');
  if (destination && destination !== acs) throw new SamlRefused(7111, `the response's Destination is not this service's ACS URL (${acs})`);
  if (profile.issuer !== sp.idp.entityId) throw new SamlRefused(7111, `the assertion's issuer is not the IdP of idp_metadata (${sp.idp.entityId})`);

  const assertion = (profile.getAssertion?.() as { Assertion?: Xml2Js } | undefined)?.Assertion;
  const attrs = assertion?.$ ?? {};
  const assertionId = attrs.ID ?? '';
  if (!assertionId) throw new SamlRefused(7111, 'the assertion has no ID');
  const issued = Date.parse(attrs.IssueInstant ?? '');
  if (!Number.isFinite(issued) || issued > nowMs + CLOCK_SKEW_MS) throw new SamlRefused(7111, "the assertion's IssueInstant is missing or in the future");
  const confirmations = (first(assertion?.Subject)?.SubjectConfirmation as Xml2Js[] | undefined) ?? [];
  const bearer = confirmations.filter((s) => s.$?.Method === 'urn:oasis:names:tc:SAML:2.0:cm:bearer').map((s) => first(s.SubjectConfirmationData)?.$ ?? {});
  if (bearer.length === 0) throw new SamlRefused(7111, 'the assertion has no bearer SubjectConfirmation');
  if (!bearer.some((d) => d.Recipient === acs)) throw new SamlRefused(7111, `the assertion's Recipient is not this service's ACS URL (${acs})`);

  // Whether this answers our request is decided by the signed assertion's bearer InResponseTo
  // (SAML profiles §4.1.4.2 requires it there): the Response element is often unsigned, so an
  // InResponseTo only there could be added to an unsolicited assertion to redeem it as a reply to
  // someone else's request (RelayState). When both are present, both must match.
  const signedInResponseTo = bearer.map((d) => d.InResponseTo ?? '').filter((v) => v);
  const inResponseTo = [root.getAttribute('InResponseTo') ?? '', ...signedInResponseTo].filter((v) => v);
  if (signedInResponseTo.length === 0 && inResponseTo.length > 0 && !c.module.allow_idp_initiated) {
    throw new SamlRefused(7111, "the response's InResponseTo is not in the signed assertion's SubjectConfirmationData");
  }
  let accepted: AcceptedLogin['relay'] = null;
  if (signedInResponseTo.length > 0) {
    if (!relay || typeof relay.i !== 'string' || relay.e * 1000 <= nowMs) throw new SamlRefused(7111, 'the response answers a sign-in request this service did not issue, or that expired; start again');
    if (inResponseTo.some((v) => v !== relay.i)) throw new SamlRefused(7111, 'the response answers another sign-in request (InResponseTo)');
    accepted = { state: relay.s, callbackUrl: relay.c };
  } else if (!c.module.allow_idp_initiated) {
    throw new SamlRefused(7111, 'IdP-initiated sign-in is not allowed on this route (allow_idp_initiated is false)');
  }

  if (!(await replay(assertionId, nowMs + REPLAY_WINDOW_MS))) throw new SamlRefused(7111, 'the assertion was already used (replay)');

  if (!profile.nameID) throw new SamlRefused(7111, 'the assertion has no NameID');
  if (c.module.authorized_groups.length > 0) {
    const groups = new Set(values(profile, GROUP_ATTRIBUTES));
    if (!c.module.authorized_groups.some((g) => groups.has(g))) throw new SamlRefused(7109, `${profile.nameID} is not a member of any group this route allows`);
  }
  const email = values(profile, EMAIL_ATTRIBUTES)[0] ?? (profile.nameIDFormat === EMAIL_NAMEID ? profile.nameID : '');
  let name = values(profile, NAME_ATTRIBUTES)[0] ?? '';
  if (!name) name = [values(profile, ['givenName', 'http://schemas.xmlsoap.org/ws/2005/05/identity/claims/givenname'])[0], values(profile, ['sn', 'surname', 'http://schemas.xmlsoap.org/ws/2005/05/identity/claims/surname'])[0]].filter(Boolean).join(' ');
  const logout: SamlLogoutRef = {};
  const keep = (k: keyof SamlLogoutRef, v: unknown) => {
    if (typeof v === 'string' && v && v.length <= MAX_SAML_LOGOUT_FIELD_CHARS) logout[k] = v;
  };
  keep('f', profile.nameIDFormat);
  keep('q', profile.nameQualifier);
  keep('sq', profile.spNameQualifier);
  keep('si', profile.sessionIndex);
  const identity = { sub: profile.nameID, email, name };
  const fits = JSON.stringify({ ...identity, slo: logout }).length <= MAX_SESSION_IDENTITY_CHARS;
  return { identity, logout: fits ? logout : {}, relay: accepted, target: accepted ? null : (relayState ?? null) };
}
