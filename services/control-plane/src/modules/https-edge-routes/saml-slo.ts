import { inflateRawSync } from 'node:zlib';
import { DOMParser } from '@xmldom/xmldom';
import type { Profile } from '@node-saml/node-saml';
import { seal, unseal, type SamlLogoutHandoff } from '@warren/shared';
import { CLOCK_SKEW_MS, MAX_ASSERTION_AGE_MS, newRequestId, REPLAY_WINDOW_MS, SamlRefused, serviceProvider, type ReplayStore, type SpContext, type SpInstance } from './saml-sp.js';
import { samlRelayKey, samlServiceUrls } from './saml.js';

/**
 * SAML single logout of a route's SP, front channel (the browser carries every message): the
 * SAML side, pure apart from the replay store it is given; saml.http.ts has the endpoints and
 * the hand-offs with the edge, the ingress's saml.ts the edge side. Messages are built, signed and
 * verified by node-saml; this file adds the checks node-saml leaves out.
 *
 * SP-initiated: the edge clears its session cookie and hands the session (NameID, format and
 * qualifiers, SessionIndex, sealed) to `/saml/<route>/logout`; `startLogout` answers with the
 * IdP's SingleLogoutService URL carrying our signed LogoutRequest (HTTP-Redirect binding) and, as
 * RelayState, the request id and the edge URL to link back to, sealed (valid LOGOUT_SECONDS).
 * The IdP's LogoutResponse comes back to `/saml/<route>/slo`.
 *
 * IdP-initiated: the IdP's LogoutRequest arrives at `/slo`; once accepted, the browser is bounced
 * through the logout path of each origin of the route's edge (cookies are per host) and back to
 * `/saml/<route>/logout`, which then answers the IdP (`answerLogoutRequest`) with our signed
 * LogoutResponse (Status Success, HTTP-Redirect binding, the IdP's RelayState echoed).
 *
 * Checks on what arrives at `/slo` (HTTP-Redirect: GET query; HTTP-POST: form), all must pass:
 * - HTTP-Redirect: exactly one of SAMLRequest/SAMLResponse, and a Signature with a SigAlg of
 *   SIGNATURE_ALGORITHMS (node-saml would take an unsigned query); each parameter at most once,
 *   and node-saml verifies the signature over the parameters exactly as they were sent. The
 *   DEFLATE data may inflate to at most MAX_LOGOUT_MESSAGE_BYTES. HTTP-POST: node-saml requires an
 *   XML signature over the whole message.
 * - The signature is by a signing certificate of `idp_metadata`; no DOCTYPE; the root is a
 *   LogoutRequest (for SAMLRequest) or LogoutResponse (for SAMLResponse) of SAML 2.0 protocol.
 * - Issuer = the IdP's entityID; Destination, when present, = our SLO URL.
 * - LogoutResponse: the RelayState is one we sealed and it has not expired, InResponseTo = the id
 *   of that LogoutRequest, top-level status Success (otherwise the page says what the IdP answered:
 *   this browser is signed out of the route either way).
 * - LogoutRequest: an ID (remembered in the replay store as `slo:<ID>`, so a replayed request is
 *   refused), IssueInstant at most MAX_ASSERTION_AGE_MS old and not in the future (CLOCK_SKEW_MS),
 *   NotOnOrAfter (node-saml), a NameID (node-saml; an EncryptedID is decrypted with the SP key),
 *   the IdP's RelayState at most MAX_LOGOUT_RELAY_STATE_CHARS.
 * Any failure is a SamlRefused 7112 (400), never a 500.
 *
 * What front-channel logout cannot do: sessions are stateless sealed cookies, so the only session
 * that ends is the one in the browser that carries the messages; a copy of the cookie in another
 * browser (or another session of the same user elsewhere) stays valid until it expires. The
 * LogoutRequest's NameID and SessionIndex are therefore not matched against anything: whatever
 * session this browser holds for the route is ended. Outgoing messages use only the HTTP-Redirect
 * binding (node-saml builds no logout form), so an IdP whose metadata lists only an HTTP-POST
 * SingleLogoutService gets no LogoutRequest, and no LogoutResponse to its requests.
 */

/** How long the IdP may take to answer our LogoutRequest (lifetime of its sealed RelayState). */
export const LOGOUT_SECONDS = 600;
/** The IdP's RelayState of a LogoutRequest travels sealed through the edge; SAML says 80 bytes. */
export const MAX_LOGOUT_RELAY_STATE_CHARS = 1024;
/** A logout message (inflated, for HTTP-Redirect) is at most this large. */
export const MAX_LOGOUT_MESSAGE_BYTES = 256 * 1024;
/** SigAlg values accepted on an HTTP-Redirect message (what xml-crypto accepts on XML signatures). */
export const SIGNATURE_ALGORITHMS: ReadonlySet<string> = new Set([
  'http://www.w3.org/2001/04/xmldsig-more#rsa-sha256',
  'http://www.w3.org/2001/04/xmldsig-more#rsa-sha512',
  'http://www.w3.org/2000/09/xmldsig#rsa-sha1',
]);

const PROTOCOL_NS = 'urn:oasis:names:tc:SAML:2.0:protocol';
const ASSERTION_NS = 'urn:oasis:names:tc:SAML:2.0:assertion';
const SUCCESS = 'urn:oasis:names:tc:SAML:2.0:status:Success';
const RELAY_AAD = 'saml-logout-relay';

/** What the RelayState of our LogoutRequest carries, sealed: its ID, the edge URL to link back to, the expiry (Unix seconds). */
interface LogoutRelay {
  i: string;
  r: string;
  e: number;
}

const refused = (message: string, detail?: string) => new SamlRefused(7112, message.slice(0, 500), detail);
const relayKey = (c: SpContext) => samlRelayKey(c.module.signing.private_key_pem, c.routeId);

// ---------------------------------------------------------------- outgoing

/**
 * SP-initiated: the IdP's single logout URL with our signed LogoutRequest for the session in
 * `h` (NameID, its Format and qualifiers, SessionIndex), or null when the IdP's metadata has no
 * HTTP-Redirect SingleLogoutService. Throws (not SamlRefused) when `idp_metadata` cannot be used.
 */
export async function startLogout(c: SpContext, h: SamlLogoutHandoff, nowMs: number): Promise<string | null> {
  const requestId = newRequestId();
  const sp = serviceProvider(c, requestId, (idp) => idp.sloRedirect?.location);
  if (!sp.idp.sloRedirect) return null;
  const relay: LogoutRelay = { i: requestId, r: h.ret, e: Math.floor(nowMs / 1000) + LOGOUT_SECONDS };
  const user: Profile = {
    issuer: sp.idp.entityId,
    nameID: h.sub,
    // absent attributes are left out of the XML
    nameIDFormat: h.slo?.f as string,
    nameQualifier: h.slo?.q,
    spNameQualifier: h.slo?.sq,
    sessionIndex: h.slo?.si,
  };
  return sp.saml.getLogoutUrlAsync(user, seal(relayKey(c), RELAY_AAD, relay), {});
}

/**
 * IdP-initiated, the last step: the IdP's single logout URL (its ResponseLocation) with our signed
 * LogoutResponse (Status Success) to its request `id`, echoing `relayState`; null when the IdP's
 * metadata has no HTTP-Redirect SingleLogoutService.
 */
export async function answerLogoutRequest(c: SpContext, id: string, relayState: string): Promise<string | null> {
  const sp = serviceProvider(c, undefined, (idp) => idp.sloRedirect?.responseLocation);
  if (!sp.idp.sloRedirect) return null;
  return sp.saml.getLogoutResponseUrlAsync({ ID: id, issuer: sp.idp.entityId, nameID: '', nameIDFormat: '' }, relayState, {}, true);
}

// ---------------------------------------------------------------- incoming

/** A logout message at the SLO endpoint, as its binding delivered it. */
export interface SloMessage {
  kind: 'request' | 'response';
  binding: 'HTTP-Redirect' | 'HTTP-POST';
  /** SAMLRequest / SAMLResponse as sent (base64; of DEFLATE data for HTTP-Redirect). */
  encoded: string;
  relayState: string | undefined;
  /** HTTP-Redirect: Signature and SigAlg, and the query octets they sign, as sent. */
  signature?: string;
  sigAlg?: string;
  signedQuery?: string;
}

const REDIRECT_PARAMS = new Set(['SAMLRequest', 'SAMLResponse', 'RelayState', 'SigAlg', 'Signature']);

function formDecode(v: string): string {
  try {
    return decodeURIComponent(v.replace(/\+/g, ' '));
  } catch {
    throw refused('the query is not validly percent-encoded');
  }
}

/** The message of an HTTP-Redirect binding request, from its raw query string (without `?`). */
export function redirectBindingMessage(rawQuery: string): SloMessage {
  const params = new Map<string, { raw: string; value: string }>();
  for (const part of rawQuery.split('&')) {
    if (!part) continue;
    const eq = part.indexOf('=');
    const name = formDecode(eq < 0 ? part : part.slice(0, eq));
    if (!REDIRECT_PARAMS.has(name)) continue;
    if (params.has(name)) throw refused(`${name} appears more than once in the query`);
    params.set(name, { raw: part, value: formDecode(eq < 0 ? '' : part.slice(eq + 1)) });
  }
  const request = params.get('SAMLRequest');
  const response = params.get('SAMLResponse');
  if (!request === !response) {
    throw refused(request ? 'the query holds both SAMLRequest and SAMLResponse' : 'no SAMLRequest or SAMLResponse: this is the single logout endpoint of a SAML service provider, for the identity provider');
  }
  const message = (request ?? response)!;
  const relay = params.get('RelayState');
  const sigAlg = params.get('SigAlg');
  const signature = params.get('Signature');
  if (!signature?.value || !sigAlg?.value) throw refused('the logout message is not signed (no Signature and SigAlg in the query): an unsigned logout message is never accepted');
  if (!SIGNATURE_ALGORITHMS.has(sigAlg.value)) throw refused(`the signature algorithm ${sigAlg.value.slice(0, 100)} is not accepted; accepted: ${[...SIGNATURE_ALGORITHMS].join(', ')}`);
  return {
    kind: request ? 'request' : 'response',
    binding: 'HTTP-Redirect',
    encoded: message.value,
    relayState: relay?.value,
    signature: signature.value,
    sigAlg: sigAlg.value,
    // what the binding signs (SAML bindings §3.4.4.1), in this order, as sent
    signedQuery: [message.raw, relay?.raw, sigAlg.raw].filter((p) => p !== undefined).join('&'),
  };
}

/** The message of an HTTP-POST binding request, from its form fields. */
export function postBindingMessage(body: Record<string, unknown>): SloMessage {
  const request = typeof body.SAMLRequest === 'string' ? body.SAMLRequest : '';
  const response = typeof body.SAMLResponse === 'string' ? body.SAMLResponse : '';
  if (!request === !response) throw refused(request ? 'the form holds both SAMLRequest and SAMLResponse' : 'no SAMLRequest or SAMLResponse in the form');
  return { kind: request ? 'request' : 'response', binding: 'HTTP-POST', encoded: request || response, relayState: typeof body.RelayState === 'string' ? body.RelayState : undefined };
}

interface Element {
  localName: string | null;
  namespaceURI: string | null;
  textContent: string | null;
  childNodes: ArrayLike<{ nodeType: number }>;
  getAttribute(name: string): string | null;
}

function children(el: Element, ns: string, local: string): Element[] {
  const out: Element[] = [];
  for (let i = 0; i < el.childNodes.length; i++) {
    const n = el.childNodes[i] as unknown as Element & { nodeType: number };
    if (n.nodeType === 1 && n.localName === local && n.namespaceURI === ns) out.push(n);
  }
  return out;
}

/** The message's XML (inflated for HTTP-Redirect, within MAX_LOGOUT_MESSAGE_BYTES) and its root element. */
function readXml(m: SloMessage): { xml: string; root: Element } {
  const raw = Buffer.from(m.encoded, 'base64');
  let xml: string;
  if (m.binding === 'HTTP-Redirect') {
    try {
      xml = inflateRawSync(raw, { maxOutputLength: MAX_LOGOUT_MESSAGE_BYTES }).toString('utf8');
    } catch (err) {
      throw refused(`the ${m.kind === 'request' ? 'SAMLRequest' : 'SAMLResponse'} is not DEFLATE data of at most ${MAX_LOGOUT_MESSAGE_BYTES} bytes (HTTP-Redirect binding)`, (err as Error).message);
    }
  } else {
    if (raw.length > MAX_LOGOUT_MESSAGE_BYTES) throw refused(`the logout message is over ${MAX_LOGOUT_MESSAGE_BYTES} bytes`);
    xml = raw.toString('utf8');
  }
  if (/<!DOCTYPE/i.test(xml)) throw refused('the logout message holds a DOCTYPE declaration');
  let root: Element | null = null;
  try {
    root = new DOMParser({ onError: () => {} }).parseFromString(xml, 'text/xml').documentElement as unknown as Element | null;
  } catch {
    root = null;
  }
  const expected = m.kind === 'request' ? 'LogoutRequest' : 'LogoutResponse';
  if (!root || root.localName !== expected || root.namespaceURI !== PROTOCOL_NS) throw refused(`the ${m.kind === 'request' ? 'SAMLRequest' : 'SAMLResponse'} is not a SAML 2.0 ${expected}`);
  return { xml, root };
}

/** What an accepted message at the SLO endpoint means. */
export type SloResult =
  /** The IdP's answer to our LogoutRequest: this browser is signed out; `ret` is the edge URL to link back to. */
  | { kind: 'logged-out'; ret: string }
  /** The IdP asks to end the session: `id` and `relayState` for the LogoutResponse. */
  | { kind: 'logout-request'; id: string; relayState: string };

/** Verifies a logout message at the SLO endpoint; see the checks at the top. Throws SamlRefused. */
export async function acceptSloMessage(c: SpContext, m: SloMessage, nowMs: number, replay: ReplayStore): Promise<SloResult> {
  if (m.relayState !== undefined && m.relayState.length > MAX_LOGOUT_RELAY_STATE_CHARS && m.kind === 'request') {
    throw refused(`the RelayState is over ${MAX_LOGOUT_RELAY_STATE_CHARS} characters`);
  }
  const { root } = readXml(m);
  let sp: SpInstance;
  try {
    sp = serviceProvider(c);
  } catch (err) {
    throw new SamlRefused(7110, `the route's SAML configuration cannot be used: ${(err as Error).message}`);
  }
  const what = m.kind === 'request' ? 'logout request' : 'logout response';
  try {
    if (m.binding === 'HTTP-Redirect') {
      const container = { [m.kind === 'request' ? 'SAMLRequest' : 'SAMLResponse']: m.encoded, SigAlg: m.sigAlg!, Signature: m.signature!, ...(m.relayState !== undefined ? { RelayState: m.relayState } : {}) };
      await sp.saml.validateRedirectAsync(container, m.signedQuery!);
    } else if (m.kind === 'request') {
      await sp.saml.validatePostRequestAsync({ SAMLRequest: m.encoded });
    } else {
      // a LogoutResponse passes only with an XML signature over the whole message
      const out = await sp.saml.validatePostResponseAsync({ SAMLResponse: m.encoded });
      if (!out.loggedOut) throw new Error('not a logout response');
    }
  } catch (err) {
    throw refused(`the identity provider's ${what} was not accepted: ${String((err as Error)?.message ?? err).slice(0, 300)}`);
  }

  // The message is signed as a whole (query signature, or an XML signature over the root), so
  // its root's attributes and children are what the IdP sent.
  const issuer = children(root, ASSERTION_NS, 'Issuer')[0]?.textContent?.trim() ?? '';
  if (issuer !== sp.idp.entityId) throw refused(`the ${what}'s Issuer is not the IdP of idp_metadata (${sp.idp.entityId})`);
  const slo = samlServiceUrls(c.baseUrl, c.routeId).single_logout_url;
  const destination = root.getAttribute('Destination');
  if (destination && destination !== slo) throw refused(`the ${what}'s Destination is not this service's single logout URL (${slo})`);

  if (m.kind === 'response') {
    const relay = unseal(relayKey(c), RELAY_AAD, m.relayState) as LogoutRelay | null;
    if (!relay || typeof relay.i !== 'string' || typeof relay.r !== 'string' || !(relay.e * 1000 > nowMs)) {
      throw refused('this logout response answers no logout this service started, or came too late; this browser is signed out of the route all the same');
    }
    if (root.getAttribute('InResponseTo') !== relay.i) throw refused("the logout response answers another logout request (InResponseTo); this browser is signed out of the route all the same");
    const status = children(root, PROTOCOL_NS, 'Status')[0];
    const code = status ? children(status, PROTOCOL_NS, 'StatusCode')[0]?.getAttribute('Value') : null;
    if (code !== SUCCESS) {
      const message = status ? (children(status, PROTOCOL_NS, 'StatusMessage')[0]?.textContent ?? '') : '';
      throw refused(`the identity provider did not end its session: it answered ${code ?? 'no status'}${message ? ` (${message.slice(0, 200)})` : ''}; this browser is signed out of the route all the same`);
    }
    return { kind: 'logged-out', ret: relay.r };
  }

  const id = root.getAttribute('ID') ?? '';
  if (!id || id.length > 256) throw refused('the logout request has no ID, or an ID over 256 characters');
  const issued = Date.parse(root.getAttribute('IssueInstant') ?? '');
  if (!Number.isFinite(issued)) throw refused('the logout request has no valid IssueInstant');
  if (issued > nowMs + CLOCK_SKEW_MS) throw refused("the logout request's IssueInstant is in the future");
  if (issued < nowMs - MAX_ASSERTION_AGE_MS - CLOCK_SKEW_MS) throw refused(`the logout request is too old (issued over ${MAX_ASSERTION_AGE_MS / 60_000} minutes ago)`);
  if (!(await replay(`slo:${id}`, nowMs + REPLAY_WINDOW_MS))) throw refused('the logout request was already used (replay)');
  return { kind: 'logout-request', id, relayState: m.relayState ?? '' };
}
