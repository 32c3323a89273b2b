import { createPublicKey, createSign, createVerify, randomBytes, X509Certificate } from 'node:crypto';
import { deflateRawSync, inflateRawSync } from 'node:zlib';
import { SignedXml } from 'xml-crypto';
import xmlenc from 'xml-encryption';
import { createSelfSignedCertificate } from '@warren/shared';

/**
 * A SAML 2.0 identity provider for tests, in the test process: its metadata (for a route's
 * `idp_metadata`), reading the SP's AuthnRequest from an HTTP-Redirect URL (and checking its
 * signature), and signed Responses built with xml-crypto (the assertion signed, RSA-SHA256,
 * exclusive C14N; optionally encrypted with xml-encryption), with knobs to break every check the
 * SP makes. Single logout: reading the SP's LogoutRequest / LogoutResponse from HTTP-Redirect
 * URLs, and building signed LogoutRequests / LogoutResponses in the HTTP-Redirect binding (query
 * signature) and the HTTP-POST binding (XML signature).
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
  /** The AuthnStatement's SessionIndex (default: a random one). */
  sessionIndex?: string;
  /** Also sign the whole Response (after encrypting the assertion, when encrypting). */
  signResponse?: boolean;
}

/** How `encryptedResponse` encrypts the assertion (xml-encryption, as IdPs do). */
export interface EncryptionOptions {
  /** The SP's certificate (its public key encrypts the content key). */
  cert: string;
  /** Content encryption (default AES-256-GCM). */
  algorithm?: 'http://www.w3.org/2009/xmlenc11#aes256-gcm' | 'http://www.w3.org/2009/xmlenc11#aes128-gcm' | 'http://www.w3.org/2001/04/xmlenc#aes256-cbc' | 'http://www.w3.org/2001/04/xmlenc#aes128-cbc' | 'http://www.w3.org/2001/04/xmlenc#tripledes-cbc';
  /** OAEP digest of the key transport (default sha1, the rsa-oaep-mgf1p default). */
  digest?: 'sha1' | 'sha256';
}

/** What the SP sent in an HTTP-Redirect logout message. */
export interface LogoutMessageSeen {
  id: string;
  issuer: string;
  destination: string;
  inResponseTo: string;
  nameId: string;
  nameIdFormat: string | null;
  sessionIndex: string | null;
  status: string | null;
  relayState: string | null;
  /** The query signature verified with `spCert` (RSA-SHA256); null when no cert was given. */
  signatureValid: boolean | null;
  xml: string;
}

export interface LogoutRequestOptions {
  /** The SP's single logout URL (Destination; null: none). */
  destination: string | null;
  nameId?: string;
  nameIdFormat?: string;
  sessionIndex?: string;
  id?: string;
  issuer?: string;
  issueInstantMs?: number;
  notOnOrAfterMs?: number;
  relayState?: string;
  signer?: SamlKey;
  unsigned?: boolean;
  /** Changes the XML after the signature was computed (HTTP-POST: the signed XML; HTTP-Redirect: the XML whose encoding was signed). */
  tamper?: (xml: string) => string;
}

export interface LogoutResponseOptions {
  destination: string | null;
  inResponseTo: string;
  status?: string;
  issuer?: string;
  relayState?: string;
  signer?: SamlKey;
  unsigned?: boolean;
  tamper?: (xml: string) => string;
}

const RSA_SHA256 = 'http://www.w3.org/2001/04/xmldsig-more#rsa-sha256';

const iso = (ms: number) => new Date(ms).toISOString().replace(/\.\d{3}Z$/, 'Z');
const esc = (v: string) => v.replace(/[&<>"]/g, (c) => `&#${c.charCodeAt(0)};`);
const b64Body = (pem: string) => pem.replace(/-----[^-]+-----/g, '').replace(/\s+/g, '');

/** Whether the HTTP-Redirect query of `u` carries a valid RSA-SHA256 signature by `cert`: the signed octets are the query's own encoding of the message, RelayState and SigAlg. */
function querySignatureValid(u: URL, cert: string): boolean {
  const parts = u.search.slice(1).split('&');
  const pick = (k: string) => parts.find((p) => p.startsWith(`${k}=`));
  const signed = ['SAMLRequest', 'SAMLResponse', 'RelayState', 'SigAlg'].map(pick).filter(Boolean).join('&');
  const sig = u.searchParams.get('Signature');
  return !!sig && u.searchParams.get('SigAlg') === RSA_SHA256 && createVerify('RSA-SHA256').update(signed).verify(createPublicKey(cert), sig, 'base64');
}

export async function newSamlKey(cn = 'Warren test IdP'): Promise<SamlKey> {
  const c = await createSelfSignedCertificate({ commonName: cn, days: 30 });
  return { cert: c.certificatePem, key: c.privateKeyPem };
}

export class TestSamlIdp {
  private constructor(
    readonly entityId: string,
    readonly ssoUrl: string,
    readonly signing: SamlKey,
    readonly sloUrl: string,
  ) {}

  static async create(entityId = 'https://idp.saml.test/metadata', ssoUrl = 'https://idp.saml.test/sso', sloUrl = 'https://idp.saml.test/slo'): Promise<TestSamlIdp> {
    return new TestSamlIdp(entityId, ssoUrl, await newSamlKey(), sloUrl);
  }

  /** Where the IdP takes logout responses (the metadata's ResponseLocation). */
  get sloResponseUrl(): string {
    return `${this.sloUrl}/response`;
  }

  /** The IdP metadata; `slo`: its SingleLogoutService binding (default HTTP-Redirect, with a ResponseLocation), or none. */
  metadata(o: { slo?: 'redirect' | 'post' | false } = {}): string {
    const slo = o.slo ?? 'redirect';
    const sloXml = slo
      ? `\n    <md:SingleLogoutService Binding="urn:oasis:names:tc:SAML:2.0:bindings:${slo === 'redirect' ? 'HTTP-Redirect' : 'HTTP-POST'}" Location="${esc(this.sloUrl)}" ResponseLocation="${esc(this.sloResponseUrl)}"/>`
      : '';
    return `<?xml version="1.0"?>
<md:EntityDescriptor xmlns:md="urn:oasis:names:tc:SAML:2.0:metadata" xmlns:ds="http://www.w3.org/2000/09/xmldsig#" entityID="${esc(this.entityId)}">
  <md:IDPSSODescriptor WantAuthnRequestsSigned="true" protocolSupportEnumeration="urn:oasis:names:tc:SAML:2.0:protocol">
    <md:KeyDescriptor use="signing"><ds:KeyInfo><ds:X509Data><ds:X509Certificate>${b64Body(this.signing.cert)}</ds:X509Certificate></ds:X509Data></ds:KeyInfo></md:KeyDescriptor>
    <md:NameIDFormat>urn:oasis:names:tc:SAML:2.0:nameid-format:persistent</md:NameIDFormat>${sloXml}
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
    const signatureValid = spCert ? querySignatureValid(u, spCert) : null;
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

  /** The SP's LogoutRequest (`SAMLRequest`) or LogoutResponse (`SAMLResponse`) in an HTTP-Redirect URL, its signature checked against `spCert` when given. */
  readLogoutMessage(url: string | URL, spCert?: string): LogoutMessageSeen {
    const u = new URL(url);
    const raw = u.searchParams.get('SAMLRequest') ?? u.searchParams.get('SAMLResponse');
    if (!raw) throw new Error(`no SAMLRequest or SAMLResponse in ${u.href}`);
    const xml = inflateRawSync(Buffer.from(raw, 'base64')).toString('utf8');
    const rootAttr = (name: string) => new RegExp(`^(?:<\\?xml[^>]*>)?<[^>]*\\s${name}="([^"]*)"`).exec(xml)?.[1] ?? '';
    return {
      id: rootAttr('ID'),
      issuer: /<saml:Issuer[^>]*>([^<]*)<\/saml:Issuer>/.exec(xml)?.[1] ?? '',
      destination: rootAttr('Destination'),
      inResponseTo: rootAttr('InResponseTo'),
      nameId: /<saml:NameID[^>]*>([^<]*)<\/saml:NameID>/.exec(xml)?.[1] ?? '',
      nameIdFormat: /<saml:NameID[^>]*Format="([^"]*)"/.exec(xml)?.[1] ?? null,
      sessionIndex: /<saml2?p:SessionIndex[^>]*>([^<]*)</.exec(xml)?.[1] ?? null,
      status: /<samlp:StatusCode[^>]*Value="([^"]*)"/.exec(xml)?.[1] ?? null,
      relayState: u.searchParams.get('RelayState'),
      signatureValid: spCert ? querySignatureValid(u, spCert) : null,
      xml,
    };
  }

  private logoutRequestXml(o: LogoutRequestOptions): string {
    const now = Date.now();
    const notOnOrAfter = o.notOnOrAfterMs === undefined ? '' : ` NotOnOrAfter="${iso(now + o.notOnOrAfterMs)}"`;
    const destination = o.destination === null ? '' : ` Destination="${esc(o.destination)}"`;
    return (
      `<samlp:LogoutRequest xmlns:samlp="${SAML_NS.protocol}" xmlns:saml="${SAML_NS.assertion}" ID="${esc(o.id ?? `_l${randomBytes(16).toString('hex')}`)}" Version="2.0" IssueInstant="${iso(now + (o.issueInstantMs ?? 0))}"${destination}${notOnOrAfter}>` +
      `<saml:Issuer>${esc(o.issuer ?? this.entityId)}</saml:Issuer>` +
      `<saml:NameID Format="${esc(o.nameIdFormat ?? 'urn:oasis:names:tc:SAML:2.0:nameid-format:persistent')}">${esc(o.nameId ?? 'alice')}</saml:NameID>` +
      (o.sessionIndex ? `<samlp:SessionIndex>${esc(o.sessionIndex)}</samlp:SessionIndex>` : '') +
      `</samlp:LogoutRequest>`
    );
  }

  private logoutResponseXml(o: LogoutResponseOptions): string {
    const destination = o.destination === null ? '' : ` Destination="${esc(o.destination)}"`;
    return (
      `<samlp:LogoutResponse xmlns:samlp="${SAML_NS.protocol}" xmlns:saml="${SAML_NS.assertion}" ID="_lr${randomBytes(16).toString('hex')}" Version="2.0" IssueInstant="${iso(Date.now())}"${destination} InResponseTo="${esc(o.inResponseTo)}">` +
      `<saml:Issuer>${esc(o.issuer ?? this.entityId)}</saml:Issuer>` +
      `<samlp:Status><samlp:StatusCode Value="${esc(o.status ?? 'urn:oasis:names:tc:SAML:2.0:status:Success')}"/></samlp:Status>` +
      `</samlp:LogoutResponse>`
    );
  }

  /**
   * `target` with the message in the HTTP-Redirect binding: DEFLATE + base64, RelayState, and the
   * query signed (RSA-SHA256) unless `unsigned`; `tamper` changes the XML after the signature was
   * computed (a forged message with the IdP's signature of the original).
   */
  private redirectUrl(target: string, param: 'SAMLRequest' | 'SAMLResponse', xml: string, o: { relayState?: string; signer?: SamlKey; unsigned?: boolean; tamper?: (xml: string) => string }): string {
    const encode = (x: string) => `${param}=${encodeURIComponent(deflateRawSync(Buffer.from(x, 'utf8')).toString('base64'))}`;
    let rest = '';
    if (o.relayState !== undefined) rest += `&RelayState=${encodeURIComponent(o.relayState)}`;
    let signature = '';
    if (!o.unsigned) {
      rest += `&SigAlg=${encodeURIComponent(RSA_SHA256)}`;
      signature = `&Signature=${encodeURIComponent(createSign('RSA-SHA256').update(encode(xml) + rest).sign((o.signer ?? this.signing).key, 'base64'))}`;
    }
    const sent = o.tamper ? encode(o.tamper(xml)) : encode(xml);
    return `${target}${target.includes('?') ? '&' : '?'}${sent}${rest}${signature}`;
  }

  /** A LogoutRequest to the SP at `target` in the HTTP-Redirect binding. */
  logoutRequestUrl(target: string, o: LogoutRequestOptions): string {
    return this.redirectUrl(target, 'SAMLRequest', this.logoutRequestXml(o), o);
  }

  /** A LogoutResponse to the SP at `target` in the HTTP-Redirect binding. */
  logoutResponseUrl(target: string, o: LogoutResponseOptions): string {
    return this.redirectUrl(target, 'SAMLResponse', this.logoutResponseXml(o), o);
  }

  /** The form fields of a LogoutRequest in the HTTP-POST binding (XML-signed unless `unsigned`). */
  logoutRequestPost(o: LogoutRequestOptions): Record<string, string> {
    let xml = this.logoutRequestXml(o);
    if (!o.unsigned) xml = this.sign(xml, 'LogoutRequest', o.signer);
    if (o.tamper) xml = o.tamper(xml);
    return { SAMLRequest: Buffer.from(xml, 'utf8').toString('base64'), ...(o.relayState !== undefined ? { RelayState: o.relayState } : {}) };
  }

  /** The form fields of a LogoutResponse in the HTTP-POST binding (XML-signed unless `unsigned`). */
  logoutResponsePost(o: LogoutResponseOptions): Record<string, string> {
    let xml = this.logoutResponseXml(o);
    if (!o.unsigned) xml = this.sign(xml, 'LogoutResponse', o.signer);
    if (o.tamper) xml = o.tamper(xml);
    return { SAMLResponse: Buffer.from(xml, 'utf8').toString('base64'), ...(o.relayState !== undefined ? { RelayState: o.relayState } : {}) };
  }

  /** The unsigned Assertion and the Response's opening tag for `o`. */
  private parts(o: ResponseOptions): { assertion: string; open: string; issuer: string } {
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
      `<saml:AuthnStatement AuthnInstant="${issue}" SessionIndex="${esc(o.sessionIndex ?? `_s${randomBytes(8).toString('hex')}`)}"><saml:AuthnContext><saml:AuthnContextClassRef>urn:oasis:names:tc:SAML:2.0:ac:classes:PasswordProtectedTransport</saml:AuthnContextClassRef></saml:AuthnContext></saml:AuthnStatement>` +
      (attrs ? `<saml:AttributeStatement>${attrs}</saml:AttributeStatement>` : '') +
      `</saml:Assertion>`;
    const open = `<samlp:Response xmlns:samlp="${SAML_NS.protocol}" xmlns:saml="${SAML_NS.assertion}" ID="_r${randomBytes(16).toString('hex')}" Version="2.0" IssueInstant="${issue}"${destination}${irt}>`;
    return { assertion, open, issuer };
  }

  /** `xml` with an enveloped signature over the element `local` (RSA-SHA256, exclusive C14N), placed after its Issuer. */
  sign(xml: string, local: string, signer: SamlKey = this.signing): string {
    const sig = new SignedXml({
      privateKey: signer.key,
      publicCert: signer.cert,
      signatureAlgorithm: 'http://www.w3.org/2001/04/xmldsig-more#rsa-sha256',
      canonicalizationAlgorithm: 'http://www.w3.org/2001/10/xml-exc-c14n#',
    });
    sig.addReference({
      xpath: `//*[local-name(.)='${local}']`,
      transforms: ['http://www.w3.org/2000/09/xmldsig#enveloped-signature', 'http://www.w3.org/2001/10/xml-exc-c14n#'],
      digestAlgorithm: 'http://www.w3.org/2001/04/xmlenc#sha256',
    });
    sig.computeSignature(xml, { location: { reference: `//*[local-name(.)='${local}']/*[local-name(.)='Issuer']`, action: 'after' } });
    return sig.getSignedXml();
  }

  /** A base64 SAMLResponse with a signed assertion. */
  response(o: ResponseOptions): string {
    const { assertion, open, issuer } = this.parts(o);
    let xml = `${open}<saml:Issuer>${esc(issuer)}</saml:Issuer><samlp:Status><samlp:StatusCode Value="urn:oasis:names:tc:SAML:2.0:status:Success"/></samlp:Status>${assertion}</samlp:Response>`;
    if (!o.unsigned) xml = this.sign(xml, 'Assertion', o.signer);
    if (o.signResponse) xml = this.sign(xml, 'Response', o.signer);
    if (o.tamper) xml = o.tamper(xml);
    return Buffer.from(xml, 'utf8').toString('base64');
  }

  /**
   * A base64 SAMLResponse whose assertion is signed (unless `unsigned`), then encrypted to
   * `enc.cert` in an EncryptedAssertion; with `signResponse` the Response is signed over that.
   * `tamper` edits the final XML.
   */
  async encryptedResponse(o: ResponseOptions, enc: EncryptionOptions): Promise<string> {
    const { assertion, open, issuer } = this.parts(o);
    const signed = o.unsigned ? assertion : this.sign(assertion, 'Assertion', o.signer);
    const encrypted = await new Promise<string>((resolve, reject) =>
      xmlenc.encrypt(
        signed,
        {
          rsa_pub: new X509Certificate(enc.cert).publicKey.export({ type: 'spki', format: 'pem' }),
          pem: enc.cert,
          encryptionAlgorithm: enc.algorithm ?? 'http://www.w3.org/2009/xmlenc11#aes256-gcm',
          keyEncryptionAlgorithm: 'http://www.w3.org/2001/04/xmlenc#rsa-oaep-mgf1p',
          warnInsecureAlgorithm: false,
          ...(enc.digest ? { keyEncryptionDigest: enc.digest } : {}),
        } as Parameters<typeof xmlenc.encrypt>[1],
        (err, out) => (err ? reject(err) : resolve(out.trim())),
      ),
    );
    let xml = `${open}<saml:Issuer>${esc(issuer)}</saml:Issuer><samlp:Status><samlp:StatusCode Value="urn:oasis:names:tc:SAML:2.0:status:Success"/></samlp:Status><saml:EncryptedAssertion>${encrypted}</saml:EncryptedAssertion></samlp:Response>`;
    if (o.signResponse) xml = this.sign(xml, 'Response', o.signer);
    if (o.tamper) xml = o.tamper(xml);
    return Buffer.from(xml, 'utf8').toString('base64');
  }
}
