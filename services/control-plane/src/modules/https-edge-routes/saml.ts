import { DOMParser } from '@xmldom/xmldom';
import { createSelfSignedCertificate } from '@warren/shared';

/**
 * SAML module support: the IdP metadata check and the SP side (URLs and request-signing key).
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
