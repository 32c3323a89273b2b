import { hkdfSync } from 'node:crypto';
import { DOMParser } from '@xmldom/xmldom';
import { createSelfSignedCertificate } from '@warren/shared';
import type { StoredModules } from './route-modules.js';

/**
 * SAML module support: the IdP metadata check and parsing, the SP side (URLs and request-signing
 * key), and what of it is pushed to ingress nodes. The SP endpoints are in saml.http.ts.
 *
 * `idp_metadata` is parsed with `@xmldom/xmldom`, a namespace-aware W3C DOM parser (the XML
 * base of the Node SAML/XML-DSig libraries the ingress will need); any parser report (warning,
 * error, fatal) refuses the document, and DOCTYPE declarations are refused up front so no
 * entity expansion ever happens.
 */

export const MAX_IDP_METADATA_BYTES = 256 * 1024;
const MD_NS = 'urn:oasis:names:tc:SAML:2.0:metadata';

interface XmlElement {
  localName: string | null;
  namespaceURI: string | null;
  childNodes: ArrayLike<{ nodeType: number }>;
  getAttribute(name: string): string | null;
}

function childElements(el: XmlElement): XmlElement[] {
  const out: XmlElement[] = [];
  for (let i = 0; i < el.childNodes.length; i++) {
    const n = el.childNodes[i]!;
    if (n.nodeType === 1) out.push(n as unknown as XmlElement);
  }
  return out;
}

const isMd = (el: XmlElement, local: string) => el.localName === local && el.namespaceURI === MD_NS;

function isIdpEntity(el: XmlElement): boolean {
  return isMd(el, 'EntityDescriptor') && !!el.getAttribute('entityID') && childElements(el).some((c) => isMd(c, 'IDPSSODescriptor'));
}

/**
 * `undefined` when `xml` is a well-formed XML document whose root is a SAML 2.0 metadata
 * EntityDescriptor (with an entityID) holding an IDPSSODescriptor, or an EntitiesDescriptor
 * holding exactly one such EntityDescriptor; otherwise the reason.
 */
export function checkIdpMetadata(xml: string): string | undefined {
  if (xml.trim() === '') return 'must not be empty';
  if (/<!DOCTYPE/i.test(xml)) return 'DOCTYPE declarations are not allowed';
  const problems: string[] = [];
  let root: XmlElement | null = null;
  try {
    const doc = new DOMParser({ onError: (_level: string, msg: string) => void problems.push(msg) }).parseFromString(xml, 'text/xml');
    root = doc.documentElement as unknown as XmlElement | null;
  } catch (err) {
    if (problems.length === 0) problems.push((err as Error).message);
  }
  if (problems.length > 0 || !root) return `not well-formed XML: ${(problems[0] ?? 'no root element').split('\n')[0]!.slice(0, 200)}`;
  if (isMd(root, 'EntitiesDescriptor')) {
    const idps = childElements(root).filter(isIdpEntity);
    if (idps.length !== 1) return `an EntitiesDescriptor must hold exactly one IdP EntityDescriptor, found ${idps.length}`;
    return undefined;
  }
  if (!isMd(root, 'EntityDescriptor')) return `the root element must be a SAML 2.0 metadata EntityDescriptor (${MD_NS}), got ${root.localName}`;
  if (!root.getAttribute('entityID')) return 'the EntityDescriptor has no entityID';
  if (!childElements(root).some((c) => isMd(c, 'IDPSSODescriptor'))) return 'the EntityDescriptor has no IDPSSODescriptor: it does not describe an identity provider';
  return undefined;
}

/** The SP endpoints of one route's SAML module, derived from the public base URL and the route id. */
export function samlServiceUrls(baseUrl: string, routeId: string) {
  const root = `${baseUrl}/saml/${routeId}`;
  return {
    entity_id: `${root}/metadata`,
    assertion_consumer_service_url: `${root}/acs`,
    single_logout_url: `${root}/slo`,
    metadata_url: `${root}/metadata`,
  };
}

export interface SamlSigningKey {
  certificate_pem: string;
  /** Never returned by the API. */
  private_key_pem: string;
}

/** A fresh request-signing key pair with a self-signed certificate, valid for ten years. */
export async function newSamlSigningKey(routeId: string): Promise<SamlSigningKey> {
  const c = await createSelfSignedCertificate({ commonName: `Warren SAML SP ${routeId}`, days: 3650 });
  return { certificate_pem: c.certificatePem, private_key_pem: c.privateKeyPem };
}

// ---------------------------------------------------------------- pushed to ingress nodes

export type StoredSaml = NonNullable<StoredModules['saml']>;

/**
 * The per-route secret the ingress nodes seal and open sign-in hand-offs and session cookies with
 * (`samlHandoffKey` in @warren/shared): HKDF-SHA256 over the route's SP private key (salt: route
 * id). The private key itself never leaves the control plane; a new key pair (the module deleted
 * and set again) ends every session of the route.
 */
export function samlHandoffSecret(privateKeyPem: string, routeId: string): string {
  return Buffer.from(hkdfSync('sha256', Buffer.from(privateKeyPem, 'utf8'), Buffer.from(routeId, 'utf8'), Buffer.from('warren/saml/handoff-secret/v1', 'utf8'), 32)).toString('base64url');
}

/** The key sealing RelayState (control plane only). */
export function samlRelayKey(privateKeyPem: string, routeId: string): Buffer {
  return Buffer.from(hkdfSync('sha256', Buffer.from(privateKeyPem, 'utf8'), Buffer.from(routeId, 'utf8'), Buffer.from('warren/saml/relay/v1', 'utf8'), 32));
}

/**
 * The saml module as pushed to ingress nodes: the stored module without the SP signing key pair,
 * plus `handoff_secret`, `login_url` and `logout_url` (under the control plane's public base URL;
 * absent when the reader was given none, and the ingress then refuses the route with 503), and
 * `single_logout`: whether the IdP's metadata has a single logout endpoint we can send a
 * LogoutRequest to (HTTP-Redirect binding), i.e. whether the edge's logout path continues there.
 */
export function samlForDataplane(stored: StoredSaml, routeId: string, baseUrl: string | undefined): Record<string, unknown> {
  const { signing, ...rest } = stored;
  const out: Record<string, unknown> = { ...rest, handoff_secret: signing?.private_key_pem ? samlHandoffSecret(signing.private_key_pem, routeId) : '' };
  if (baseUrl) {
    out.login_url = `${baseUrl}/saml/${routeId}/login`;
    out.logout_url = `${baseUrl}/saml/${routeId}/logout`;
  }
  let singleLogout = false;
  try {
    singleLogout = parseIdpMetadata(stored.idp_metadata).sloRedirect !== null;
  } catch {
    // an unusable idp_metadata: sign-in fails at the control plane with the reason
  }
  out.single_logout = singleLogout;
  return out;
}

// ---------------------------------------------------------------- IdP metadata

/** A SingleLogoutService: where requests go, and responses (`ResponseLocation`, else `Location`). */
export interface LogoutEndpoint {
  location: string;
  responseLocation: string;
}

export interface IdpInfo {
  entityId: string;
  /** SingleSignOnService locations by binding. */
  ssoRedirect: string | null;
  ssoPost: string | null;
  /** SingleLogoutService endpoints by binding (we send logout messages only with HTTP-Redirect). */
  sloRedirect: LogoutEndpoint | null;
  sloPost: LogoutEndpoint | null;
  /** Signing certificates (PEM). */
  certs: string[];
}

const HTTP_REDIRECT = 'urn:oasis:names:tc:SAML:2.0:bindings:HTTP-Redirect';
const HTTP_POST = 'urn:oasis:names:tc:SAML:2.0:bindings:HTTP-POST';
const DS_NS = 'http://www.w3.org/2000/09/xmldsig#';

function descendants(el: XmlElement, ns: string, local: string, out: XmlElement[] = []): XmlElement[] {
  for (const c of childElements(el)) {
    if (c.localName === local && c.namespaceURI === ns) out.push(c);
    descendants(c, ns, local, out);
  }
  return out;
}

/**
 * What the SP needs from `idp_metadata` (already checked by `checkIdpMetadata` when stored): the
 * entity id, the SSO and SLO endpoints (http(s) URLs only; the first of each binding) and the
 * signing certificates (KeyDescriptors with `use="signing"` or no `use`). Throws with a reason
 * when the IdP cannot be used.
 */
export function parseIdpMetadata(xml: string): IdpInfo {
  const problem = checkIdpMetadata(xml);
  if (problem) throw new Error(`idp_metadata: ${problem}`);
  const doc = new DOMParser().parseFromString(xml, 'text/xml');
  let root = doc.documentElement as unknown as XmlElement;
  if (isMd(root, 'EntitiesDescriptor')) root = childElements(root).find(isIdpEntity)!;
  const idp = childElements(root).find((c) => isMd(c, 'IDPSSODescriptor'))!;
  let ssoRedirect: string | null = null;
  let ssoPost: string | null = null;
  for (const s of childElements(idp).filter((c) => isMd(c, 'SingleSignOnService'))) {
    const binding = s.getAttribute('Binding');
    const loc = s.getAttribute('Location');
    if (!loc || !/^https?:\/\//i.test(loc)) continue;
    if (binding === HTTP_REDIRECT) ssoRedirect ??= loc;
    if (binding === HTTP_POST) ssoPost ??= loc;
  }
  let sloRedirect: LogoutEndpoint | null = null;
  let sloPost: LogoutEndpoint | null = null;
  for (const s of childElements(idp).filter((c) => isMd(c, 'SingleLogoutService'))) {
    const loc = s.getAttribute('Location');
    const resp = s.getAttribute('ResponseLocation') || loc;
    if (!loc || !resp || !/^https?:\/\//i.test(loc) || !/^https?:\/\//i.test(resp)) continue;
    const binding = s.getAttribute('Binding');
    if (binding === HTTP_REDIRECT) sloRedirect ??= { location: loc, responseLocation: resp };
    if (binding === HTTP_POST) sloPost ??= { location: loc, responseLocation: resp };
  }
  const certs: string[] = [];
  for (const kd of childElements(idp).filter((c) => isMd(c, 'KeyDescriptor'))) {
    const use = kd.getAttribute('use');
    if (use && use !== 'signing') continue;
    for (const x of descendants(kd, DS_NS, 'X509Certificate')) {
      const b64 = ((x as unknown as { textContent: string | null }).textContent ?? '').replace(/\s+/g, '');
      if (b64) certs.push(`-----BEGIN CERTIFICATE-----\n${b64.replace(/(.{64})/g, '$1\n').replace(/\n$/, '')}\n-----END CERTIFICATE-----\n`);
    }
  }
  if (!ssoRedirect && !ssoPost) throw new Error('idp_metadata: the IDPSSODescriptor has no SingleSignOnService with the HTTP-Redirect or HTTP-POST binding');
  if (certs.length === 0) throw new Error('idp_metadata: the IDPSSODescriptor has no signing certificate (KeyDescriptor with an X509Certificate)');
  return { entityId: root.getAttribute('entityID')!, ssoRedirect, ssoPost, sloRedirect, sloPost, certs };
}
