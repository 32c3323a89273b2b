import { createPublicKey, createVerify, randomBytes } from 'node:crypto';
import { inflateRawSync } from 'node:zlib';
import { SignedXml } from 'xml-crypto';
import { createSelfSignedCertificate } from '@warren/shared';

/**
 * A SAML 2.0 identity provider for tests, in the test process: its metadata (for a route's
 * `idp_metadata`), reading the SP's AuthnRequest from an HTTP-Redirect URL (and checking its
 * signature), and signed Responses built with xml-crypto (the assertion signed, RSA-SHA256,
 * exclusive C14N), with knobs to break every check the SP makes.
 */

export const SAML_NS = {
  protocol: 'urn:oasis:names:tc:SAML:2.0:protocol',
  assertion: 'urn:oasis:names:tc:SAML:2.0:assertion',
};

export interface SamlKey {
  cert: string;
  key: string;
}

export interface AuthnRequestSeen {
  id: string;
  acs: string;
  issuer: string;
  forceAuthn: boolean;
  nameIdFormat: string | null;
  relayState: string | null;
  /** The HTTP-Redirect binding's query signature verified with `spCert`; null when no cert was given. */
  signatureValid: boolean | null;
  xml: string;
}

export interface ResponseOptions {
  acs: string;
  audience: string;
  inResponseTo?: string | null;
  nameId?: string;
  nameIdFormat?: string;
  attributes?: Record<string, string[]>;
  /** Offsets from now, ms. */
  notBeforeMs?: number;
  notOnOrAfterMs?: number;
  issueInstantMs?: number;
  issuer?: string;
  assertionId?: string;
  destination?: string | null;
  recipient?: string;
  /** Sign with another key (a bad signature for the SP). */
  signer?: SamlKey;
  /** Changes the XML after signing (tampering). */
  tamper?: (xml: string) => string;
  /** Leave the assertion unsigned. */
  unsigned?: boolean;
}

const iso = (ms: number) => new Date(ms).toISOString().replace(/\.\d{3}Z$/, 'Z');
const esc = (v: string) => v.replace(/[&<>"]/g, (c) => `&#${c.charCodeAt(0)};`);
const b64Body = (pem: string) => pem.replace(/-----[^-]+-----/g, '').replace(/\s+/g, '');

export async function newSamlKey(cn = 'Warren test IdP'): Promise<SamlKey> {
  const c = await createSelfSignedCertificate({ commonName: cn, days: 30 });
  return { cert: c.certificatePem, key: c.privateKeyPem };
}

export class TestSamlIdp {
  private constructor(
    readonly entityId: string,
    readonly ssoUrl: string,
    readonly signing: SamlKey,
  ) {}

  static async create(entityId = 'https://idp.saml.test/metadata', ssoUrl = 'https://idp.saml.test/sso'): Promise<TestSamlIdp> {
    return new TestSamlIdp(entityId, ssoUrl, await newSamlKey());
  }

  metadata(): string {
    return `<?xml version="1.0"?>
<md:EntityDescriptor xmlns:md="urn:oasis:names:tc:SAML:2.0:metadata" xmlns:ds="http://www.w3.org/2000/09/xmldsig#" entityID="${esc(this.entityId)}">
  <md:IDPSSODescriptor WantAuthnRequestsSigned="true" protocolSupportEnumeration="urn:oasis:names:tc:SAML:2.0:protocol">
    <md:KeyDescriptor use="signing"><ds:KeyInfo><ds:X509Data><ds:X509Certificate>${b64Body(this.signing.cert)}</ds:X509Certificate></ds:X509Data></ds:KeyInfo></md:KeyDescriptor>
    <md:NameIDFormat>urn:oasis:names:tc:SAML:2.0:nameid-format:persistent</md:NameIDFormat>
    <md:SingleSignOnService Binding="urn:oasis:names:tc:SAML:2.0:bindings:HTTP-Redirect" Location="${esc(this.ssoUrl)}"/>
  </md:IDPSSODescriptor>
</md:EntityDescriptor>`;
  }

  /** The AuthnRequest in an HTTP-Redirect URL, its signature checked against `spCert` when given. */
  readRequest(url: string | URL, spCert?: string): AuthnRequestSeen {
    const u = new URL(url);
    const raw = u.searchParams.get('SAMLRequest');
    if (!raw) throw new Error(`no SAMLRequest in ${u.href}`);
    const xml = inflateRawSync(Buffer.from(raw, 'base64')).toString('utf8');
    const attr = (name: string) => new RegExp(`<samlp:AuthnRequest[^>]*\\s${name}="([^"]*)"`).exec(xml)?.[1] ?? '';
    let signatureValid: boolean | null = null;
    if (spCert) {
      // The signed octets are the query's own encoding of SAMLRequest, RelayState and SigAlg.
      const parts = u.search.slice(1).split('&');
      const pick = (k: string) => parts.find((p) => p.startsWith(`${k}=`));
      const signed = ['SAMLRequest', 'RelayState', 'SigAlg'].map(pick).filter(Boolean).join('&');
      const sig = u.searchParams.get('Signature');
      signatureValid = !!sig && u.searchParams.get('SigAlg') === 'http://www.w3.org/2001/04/xmldsig-more#rsa-sha256' && createVerify('RSA-SHA256').update(signed).verify(createPublicKey(spCert), sig, 'base64');
    }
    return {
      id: attr('ID'),
      acs: attr('AssertionConsumerServiceURL'),
      issuer: /<saml:Issuer[^>]*>([^<]*)<\/saml:Issuer>/.exec(xml)?.[1] ?? '',
      forceAuthn: attr('ForceAuthn') === 'true',
      nameIdFormat: /<samlp:NameIDPolicy[^>]*Format="([^"]*)"/.exec(xml)?.[1] ?? null,
      relayState: u.searchParams.get('RelayState'),
      signatureValid,
      xml,
    };
  }

  /** A base64 SAMLResponse with a signed assertion. */
  response(o: ResponseOptions): string {
    const now = Date.now();
    const issuer = o.issuer ?? this.entityId;
    const assertionId = o.assertionId ?? `_a${randomBytes(16).toString('hex')}`;
    const issue = iso(now + (o.issueInstantMs ?? 0));
    const notBefore = iso(now + (o.notBeforeMs ?? -30_000));
    const notOnOrAfter = iso(now + (o.notOnOrAfterMs ?? 300_000));
    const irt = o.inResponseTo ? ` InResponseTo="${esc(o.inResponseTo)}"` : '';
    const destination = o.destination === null ? '' : ` Destination="${esc(o.destination ?? o.acs)}"`;
    const attrs = Object.entries(o.attributes ?? {})
      .map(([name, vals]) => `<saml:Attribute Name="${esc(name)}">${vals.map((v) => `<saml:AttributeValue>${esc(v)}</saml:AttributeValue>`).join('')}</saml:Attribute>`)
      .join('');
    const assertion =
      `<saml:Assertion xmlns:saml="${SAML_NS.assertion}" ID="${assertionId}" Version="2.0" IssueInstant="${issue}">` +
      `<saml:Issuer>${esc(issuer)}</saml:Issuer>` +
      `<saml:Subject><saml:NameID Format="${esc(o.nameIdFormat ?? 'urn:oasis:names:tc:SAML:2.0:nameid-format:persistent')}">${esc(o.nameId ?? 'alice')}</saml:NameID>` +
      `<saml:SubjectConfirmation Method="urn:oasis:names:tc:SAML:2.0:cm:bearer"><saml:SubjectConfirmationData NotOnOrAfter="${notOnOrAfter}" Recipient="${esc(o.recipient ?? o.acs)}"${irt}/></saml:SubjectConfirmation></saml:Subject>` +
      `<saml:Conditions NotBefore="${notBefore}" NotOnOrAfter="${notOnOrAfter}"><saml:AudienceRestriction><saml:Audience>${esc(o.audience)}</saml:Audience></saml:AudienceRestriction></saml:Conditions>` +
      `<saml:AuthnStatement AuthnInstant="${issue}" SessionIndex="_s${randomBytes(8).toString('hex')}"><saml:AuthnContext><saml:AuthnContextClassRef>urn:oasis:names:tc:SAML:2.0:ac:classes:PasswordProtectedTransport</saml:AuthnContextClassRef></saml:AuthnContext></saml:AuthnStatement>` +
      (attrs ? `<saml:AttributeStatement>${attrs}</saml:AttributeStatement>` : '') +
      `</saml:Assertion>`;
    let xml =
      `<samlp:Response xmlns:samlp="${SAML_NS.protocol}" xmlns:saml="${SAML_NS.assertion}" ID="_r${randomBytes(16).toString('hex')}" Version="2.0" IssueInstant="${issue}"${destination}${irt}>` +
      `<saml:Issuer>${esc(issuer)}</saml:Issuer><samlp:Status><samlp:StatusCode Value="urn:oasis:names:tc:SAML:2.0:status:Success"/></samlp:Status>` +
      assertion +
      `</samlp:Response>`;
    if (!o.unsigned) {
      const signer = o.signer ?? this.signing;
      const sig = new SignedXml({
        privateKey: signer.key,
        publicCert: signer.cert,
        signatureAlgorithm: 'http://www.w3.org/2001/04/xmldsig-more#rsa-sha256',
        canonicalizationAlgorithm: 'http://www.w3.org/2001/10/xml-exc-c14n#',
      });
      sig.addReference({
        xpath: "//*[local-name(.)='Assertion']",
        transforms: ['http://www.w3.org/2000/09/xmldsig#enveloped-signature', 'http://www.w3.org/2001/10/xml-exc-c14n#'],
        digestAlgorithm: 'http://www.w3.org/2001/04/xmlenc#sha256',
      });
      sig.computeSignature(xml, { location: { reference: "//*[local-name(.)='Assertion']/*[local-name(.)='Issuer']", action: 'after' } });
      xml = sig.getSignedXml();
    }
    if (o.tamper) xml = o.tamper(xml);
    return Buffer.from(xml, 'utf8').toString('base64');
  }
}
