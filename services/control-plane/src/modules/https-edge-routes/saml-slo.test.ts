import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { once } from 'node:events';
import { deflateRawSync } from 'node:zlib';
import express from 'express';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger, openSamlLogoutBounce, samlHandoffKey, sealSamlLogoutBounce, sealSamlLogoutHandoff, unseal, type SamlLogoutHandoff } from '@warren/shared';
import { newSamlKey, TestSamlIdp } from '../../../../../test/support/saml-idp.js';
import { acceptResponse, startLogin, type SpContext } from './saml-sp.js';
import { acceptSloMessage, answerLogoutRequest, MAX_LOGOUT_MESSAGE_BYTES, postBindingMessage, redirectBindingMessage, startLogout, type SloMessage } from './saml-slo.js';
import { createSamlRouter, logoutOrigins } from './saml.http.js';
import { memoryReplay, refusal } from './saml.testing.js';
import { newSamlSigningKey, parseIdpMetadata, samlForDataplane, samlHandoffSecret, samlRelayKey, type StoredSaml } from './saml.js';
import type { SamlRouteRow } from './saml.repo.js';

const BASE = 'https://cp.example.test';
const ROUTE = 'edghtsrt_slo1';
const SLO = `${BASE}/saml/${ROUTE}/slo`;
const ENTITY = `${BASE}/saml/${ROUTE}/metadata`;
const RET = 'https://app.example.test/';
const PERSISTENT = 'urn:oasis:names:tc:SAML:2.0:nameid-format:persistent';

let idp: TestSamlIdp;
let module: StoredSaml;

function ctx(over: Partial<StoredSaml> = {}): SpContext {
  return { routeId: ROUTE, baseUrl: BASE, module: { ...module, ...over } };
}


const handoff = (over: Partial<SamlLogoutHandoff> = {}): SamlLogoutHandoff => ({ sub: 'alice', slo: { f: PERSISTENT, si: '_sess-1' }, ret: RET, exp: Math.floor(Date.now() / 1000) + 60, ...over });
/** The message of an HTTP-Redirect URL, as the endpoint reads it. */
const fromUrl = (url: string) => redirectBindingMessage(new URL(url).search.slice(1));

/** SP-initiated: our LogoutRequest as the IdP reads it. */
async function logoutRequest(c = ctx(), h = handoff()) {
  const url = await startLogout(c, h, Date.now());
  expect(url).not.toBeNull();
  return idp.readLogoutMessage(url!, c.module.signing.certificate_pem);
}

beforeAll(async () => {
  idp = await TestSamlIdp.create();
  module = {
    enabled: true,
    options_passthrough: false,
    cookie_prefix: 'warren.',
    inactivity_timeout: 0,
    maximum_duration: 0,
    idp_metadata: idp.metadata(),
    force_authn: false,
    allow_idp_initiated: false,
    authorized_groups: [],
    nameid_format: PERSISTENT,
    signing: await newSamlSigningKey(ROUTE),
  };
});

describe('saml single logout (SP side)', () => {
  it('reads the single logout endpoints of the IdP metadata; pushes logout_url and single_logout', () => {
    expect(parseIdpMetadata(idp.metadata())).toMatchObject({ sloRedirect: { location: idp.sloUrl, responseLocation: idp.sloResponseUrl }, sloPost: null });
    expect(parseIdpMetadata(idp.metadata({ slo: 'post' }))).toMatchObject({ sloRedirect: null, sloPost: { location: idp.sloUrl } });
    expect(parseIdpMetadata(idp.metadata({ slo: false }))).toMatchObject({ sloRedirect: null, sloPost: null });
    const noResponseLocation = idp.metadata().replace(/ ResponseLocation="[^"]*"/, '');
    expect(parseIdpMetadata(noResponseLocation).sloRedirect).toEqual({ location: idp.sloUrl, responseLocation: idp.sloUrl });
    expect(samlForDataplane(module, ROUTE, BASE)).toMatchObject({ logout_url: `${BASE}/saml/${ROUTE}/logout`, single_logout: true });
    expect(samlForDataplane({ ...module, idp_metadata: idp.metadata({ slo: 'post' }) }, ROUTE, BASE)).toMatchObject({ single_logout: false });
    expect(samlForDataplane({ ...module, idp_metadata: '<nope/>' }, ROUTE, BASE)).toMatchObject({ single_logout: false });
  });

  it('keeps what a LogoutRequest needs from the assertion (NameID format, SessionIndex), leaving out overlong values', async () => {
    const out = await startLogin(ctx(), 'state-0123456789abcdef', 'https://app.example.test/.warren/saml/callback', Date.now());
    const req = idp.readRequest((out as { redirect: string }).redirect);
    const ACS = `${BASE}/saml/${ROUTE}/acs`;
    const ok = await acceptResponse(ctx(), idp.response({ acs: ACS, audience: ENTITY, inResponseTo: req.id, nameId: 'bob', sessionIndex: '_idx-9' }), req.relayState!, Date.now(), memoryReplay());
    expect(ok.logout).toEqual({ f: PERSISTENT, si: '_idx-9' });
    const long = await acceptResponse(ctx(), idp.response({ acs: ACS, audience: ENTITY, inResponseTo: req.id, sessionIndex: `_${'x'.repeat(300)}` }), req.relayState!, Date.now(), memoryReplay());
    expect(long.logout).toEqual({ f: PERSISTENT });
    // a large identity leaves the details out, so that the session cookie stays small
    const big = await acceptResponse(ctx(), idp.response({ acs: ACS, audience: ENTITY, inResponseTo: req.id, sessionIndex: '_idx-9', attributes: { displayName: ['n'.repeat(1990)] } }), req.relayState!, Date.now(), memoryReplay());
    expect(big.logout).toEqual({});
  });

  it('SP-initiated: a signed LogoutRequest for the session to the IdP, RelayState sealed', async () => {
    const url = await startLogout(ctx(), handoff({ slo: { f: PERSISTENT, si: '_sess-1', q: 'https://idp.saml.test', sq: ENTITY } }), Date.now());
    expect(url!.startsWith(`${idp.sloUrl}?SAMLRequest=`)).toBe(true);
    const req = idp.readLogoutMessage(url!, module.signing.certificate_pem);
    expect(req).toMatchObject({ issuer: ENTITY, destination: idp.sloUrl, nameId: 'alice', nameIdFormat: PERSISTENT, sessionIndex: '_sess-1', signatureValid: true });
    expect(req.xml).toContain('NameQualifier="https://idp.saml.test"');
    expect(req.xml).toContain(`SPNameQualifier="${ENTITY}"`);
    expect(unseal(samlRelayKey(module.signing.private_key_pem, ROUTE), 'saml-logout-relay', req.relayState)).toMatchObject({ i: req.id, r: RET });
    expect(idp.readLogoutMessage(url!, (await newSamlKey()).cert).signatureValid).toBe(false);
    // a session from before single logout (no details): the NameID alone, no Format attribute
    const bare = await logoutRequest(ctx(), handoff({ slo: undefined }));
    expect(bare).toMatchObject({ nameId: 'alice', nameIdFormat: null, sessionIndex: null, signatureValid: true });
    // no HTTP-Redirect SingleLogoutService: nothing to send
    expect(await startLogout(ctx({ idp_metadata: idp.metadata({ slo: 'post' }) }), handoff(), Date.now())).toBeNull();
    expect(await startLogout(ctx({ idp_metadata: idp.metadata({ slo: false }) }), handoff(), Date.now())).toBeNull();
  });

  it("accepts the IdP's signed LogoutResponse to our request (HTTP-Redirect and HTTP-POST)", async () => {
    const req = await logoutRequest();
    const viaRedirect = fromUrl(idp.logoutResponseUrl(SLO, { destination: SLO, inResponseTo: req.id, relayState: req.relayState! }));
    expect(await acceptSloMessage(ctx(), viaRedirect, Date.now(), memoryReplay())).toEqual({ kind: 'logged-out', ret: RET });
    const viaPost = postBindingMessage(idp.logoutResponsePost({ destination: SLO, inResponseTo: req.id, relayState: req.relayState! }));
    expect(await acceptSloMessage(ctx(), viaPost, Date.now(), memoryReplay())).toEqual({ kind: 'logged-out', ret: RET });
    // Destination is optional
    const noDest = fromUrl(idp.logoutResponseUrl(SLO, { destination: null, inResponseTo: req.id, relayState: req.relayState! }));
    expect((await acceptSloMessage(ctx(), noDest, Date.now(), memoryReplay())).kind).toBe('logged-out');
  });

  it('refuses a LogoutResponse that is unsigned, signed by another key, tampered, for another request, late, failed, or from another issuer or for another destination', async () => {
    const req = await logoutRequest();
    const other = await logoutRequest();
    const evil = await newSamlKey('evil');
    const ok = { destination: SLO, inResponseTo: req.id, relayState: req.relayState! };
    const cases: Array<[SloMessage | (() => SloMessage), RegExp]> = [
      [() => fromUrl(idp.logoutResponseUrl(SLO, { ...ok, unsigned: true })), /not signed/],
      [fromUrl(idp.logoutResponseUrl(SLO, { ...ok, signer: evil })), /signature/i],
      [postBindingMessage(idp.logoutResponsePost({ ...ok, unsigned: true })), /signature/i],
      [postBindingMessage(idp.logoutResponsePost({ ...ok, signer: evil })), /signature/i],
      [postBindingMessage(idp.logoutResponsePost({ ...ok, tamper: (x) => x.replace(`InResponseTo="${req.id}"`, `InResponseTo="${other.id}"`) })), /signature/i],
      [fromUrl(idp.logoutResponseUrl(SLO, { ...ok, inResponseTo: other.id, tamper: (x) => x.replace(`InResponseTo="${other.id}"`, `InResponseTo="${req.id}"`) })), /signature/i],
      [fromUrl(idp.logoutResponseUrl(SLO, { ...ok, inResponseTo: other.id })), /another logout request/],
      [fromUrl(idp.logoutResponseUrl(SLO, { ...ok, relayState: 'made-up' })), /answers no logout this service started/],
      [fromUrl(idp.logoutResponseUrl(SLO, { ...ok, relayState: undefined })), /answers no logout this service started/],
      [fromUrl(idp.logoutResponseUrl(SLO, { ...ok, status: 'urn:oasis:names:tc:SAML:2.0:status:Responder' })), /Responder|status/],
      [postBindingMessage(idp.logoutResponsePost({ ...ok, status: 'urn:oasis:names:tc:SAML:2.0:status:Requester' })), /did not end its session: it answered urn:oasis:names:tc:SAML:2.0:status:Requester/],
      [fromUrl(idp.logoutResponseUrl(SLO, { ...ok, issuer: 'https://other-idp.test' })), /issuer/i],
      [postBindingMessage(idp.logoutResponsePost({ ...ok, issuer: 'https://other-idp.test' })), /Issuer/],
      [fromUrl(idp.logoutResponseUrl(SLO, { ...ok, destination: 'https://evil.test/slo' })), /Destination/],
    ];
    for (const [m, msg] of cases) {
      const r = await refusal((async () => acceptSloMessage(ctx(), typeof m === 'function' ? m() : m, Date.now(), memoryReplay()))());
      expect(r.code).toBe(7112);
      expect(r.message).toMatch(msg);
    }
    // a RelayState sealed for another route, or expired
    const otherRoute = await startLogout({ ...ctx(), routeId: 'edghtsrt_other' }, handoff(), Date.now());
    const theirs = idp.readLogoutMessage(otherRoute!);
    expect((await refusal(acceptSloMessage(ctx(), fromUrl(idp.logoutResponseUrl(SLO, { destination: SLO, inResponseTo: theirs.id, relayState: theirs.relayState! })), Date.now(), memoryReplay()))).message).toMatch(/answers no logout/);
    expect((await refusal(acceptSloMessage(ctx(), fromUrl(idp.logoutResponseUrl(SLO, ok)), Date.now() + 11 * 60_000, memoryReplay()))).message).toMatch(/too late/);
  });

  it('IdP-initiated: accepts a signed LogoutRequest (both bindings) once; refuses unsigned, forged, stale and replayed ones', async () => {
    const good = { destination: SLO, nameId: 'alice', sessionIndex: '_sess-1', relayState: 'idp-relay' };
    const viaRedirect = fromUrl(idp.logoutRequestUrl(SLO, { ...good, id: '_req-redirect' }));
    const replay = memoryReplay();
    expect(await acceptSloMessage(ctx(), viaRedirect, Date.now(), replay)).toEqual({ kind: 'logout-request', id: '_req-redirect', relayState: 'idp-relay' });
    expect((await refusal(acceptSloMessage(ctx(), viaRedirect, Date.now(), replay))).message).toMatch(/already used/);
    const viaPost = postBindingMessage(idp.logoutRequestPost({ ...good, id: '_req-post', relayState: undefined }));
    expect(await acceptSloMessage(ctx(), viaPost, Date.now(), replay)).toEqual({ kind: 'logout-request', id: '_req-post', relayState: '' });

    const evil = await newSamlKey('evil');
    const cases: Array<[() => SloMessage, RegExp]> = [
      [() => fromUrl(idp.logoutRequestUrl(SLO, { ...good, unsigned: true })), /not signed/],
      [() => postBindingMessage(idp.logoutRequestPost({ ...good, unsigned: true })), /signature/i],
      [() => fromUrl(idp.logoutRequestUrl(SLO, { ...good, signer: evil })), /signature/i],
      [() => postBindingMessage(idp.logoutRequestPost({ ...good, signer: evil })), /signature/i],
      [() => fromUrl(idp.logoutRequestUrl(SLO, { ...good, tamper: (x) => x.replace('>alice<', '>admin<') })), /signature/i],
      [() => postBindingMessage(idp.logoutRequestPost({ ...good, tamper: (x) => x.replace('>alice<', '>admin<') })), /signature/i],
      [() => fromUrl(idp.logoutRequestUrl(SLO, { ...good, issuer: 'https://other-idp.test' })), /issuer/i],
      [() => fromUrl(idp.logoutRequestUrl(SLO, { ...good, destination: 'https://evil.test/slo' })), /Destination/],
      [() => fromUrl(idp.logoutRequestUrl(SLO, { ...good, issueInstantMs: -30 * 60_000 })), /too old/],
      [() => fromUrl(idp.logoutRequestUrl(SLO, { ...good, issueInstantMs: 10 * 60_000 })), /future/],
      [() => fromUrl(idp.logoutRequestUrl(SLO, { ...good, notOnOrAfterMs: -5 * 60_000 })), /expired/],
      [() => fromUrl(idp.logoutRequestUrl(SLO, { ...good, relayState: 'r'.repeat(2000) })), /RelayState is over/],
      // a LogoutResponse passed off as the request, and the other way round
      [() => fromUrl(idp.logoutRequestUrl(SLO, good).replace('SAMLRequest=', 'SAMLResponse=')), /not a SAML 2.0 LogoutResponse/],
    ];
    for (const [m, msg] of cases) {
      const r = await refusal((async () => acceptSloMessage(ctx(), m(), Date.now(), memoryReplay()))(), String(msg));
      expect(r.code).toBe(7112);
      expect(r.message).toMatch(msg);
    }
  });

  it('reads the HTTP-Redirect query strictly: one of each parameter, a known SigAlg, bounded inflation, no DOCTYPE', async () => {
    const url = idp.logoutRequestUrl(SLO, { destination: SLO, relayState: 'r' });
    const q = new URL(url).search.slice(1);
    const cases: Array<[string, RegExp]> = [
      ['', /no SAMLRequest or SAMLResponse/],
      ['foo=bar', /no SAMLRequest or SAMLResponse/],
      [`${q}&SAMLRequest=abc`, /SAMLRequest appears more than once/],
      [`${q}&SAMLResponse=abc`, /both SAMLRequest and SAMLResponse/],
      [q.replace(/SigAlg=[^&]*/, `SigAlg=${encodeURIComponent('http://www.w3.org/2000/09/xmldsig#dsa-sha1')}`), /signature algorithm .*dsa-sha1 is not accepted/],
      [q.replace(/&Signature=[^&]*/, ''), /not signed/],
      ['SAMLRequest=%E0%A4%A&SigAlg=x&Signature=y', /percent-encoded/],
    ];
    for (const [query, msg] of cases) expect(() => redirectBindingMessage(query)).toThrow(msg);
    // unknown parameters are left out of what is verified
    expect((await acceptSloMessage(ctx(), redirectBindingMessage(`x=1&${q}&utm=2`), Date.now(), memoryReplay())).kind).toBe('logout-request');
    // a deflate bomb, garbage and a DOCTYPE: 400, not a crash
    const bomb = deflateRawSync(Buffer.alloc(MAX_LOGOUT_MESSAGE_BYTES + 1, 0x20)).toString('base64');
    const doctype = deflateRawSync(Buffer.from('<!DOCTYPE x [<!ENTITY a "b">]><samlp:LogoutRequest xmlns:samlp="urn:oasis:names:tc:SAML:2.0:protocol"/>')).toString('base64');
    for (const [payload, msg] of [
      [bomb, /DEFLATE data of at most/],
      ['bm90IGRlZmxhdGU=', /DEFLATE|not a SAML 2.0/],
      [doctype, /DOCTYPE/],
    ] as const) {
      const m = redirectBindingMessage(`SAMLRequest=${encodeURIComponent(payload)}&SigAlg=${encodeURIComponent('http://www.w3.org/2001/04/xmldsig-more#rsa-sha256')}&Signature=AAAA`);
      expect((await refusal(acceptSloMessage(ctx(), m, Date.now(), memoryReplay()))).message).toMatch(msg);
    }
    expect((await refusal(acceptSloMessage(ctx(), postBindingMessage({ SAMLRequest: 'PG5vdC1zYW1sLz4=' }), Date.now(), memoryReplay()))).message).toMatch(/not a SAML 2.0 LogoutRequest/);
  });

  it('answers the IdP with a signed LogoutResponse (Success) at its ResponseLocation, echoing RelayState', async () => {
    const url = await answerLogoutRequest(ctx(), '_req-1', 'idp-relay');
    expect(url!.startsWith(`${idp.sloResponseUrl}?SAMLResponse=`)).toBe(true);
    expect(idp.readLogoutMessage(url!, module.signing.certificate_pem)).toMatchObject({
      inResponseTo: '_req-1',
      destination: idp.sloResponseUrl,
      issuer: ENTITY,
      status: 'urn:oasis:names:tc:SAML:2.0:status:Success',
      relayState: 'idp-relay',
      signatureValid: true,
    });
    expect(new URL((await answerLogoutRequest(ctx(), '_req-2', ''))!).searchParams.has('RelayState')).toBe(false);
    expect(await answerLogoutRequest(ctx({ idp_metadata: idp.metadata({ slo: 'post' }) }), '_req-1', '')).toBeNull();
  });

  it('visits every origin of the edge on the host of the match (https except on :80)', () => {
    expect(logoutOrigins({ hostports: ['app.example.test:443', 'alt.example.test:8443', 'plain.example.test:80'], match: '/' })).toEqual(['https://app.example.test', 'https://alt.example.test:8443', 'http://plain.example.test']);
    expect(logoutOrigins({ hostports: ['app.example.test:443', 'other.example.test:443', 'app.example.test:80'], match: 'app.example.test/x' })).toEqual(['https://app.example.test', 'http://app.example.test']);
    expect(logoutOrigins({ hostports: Array.from({ length: 10 }, (_, i) => `h${i}.example.test:443`), match: '/' })).toHaveLength(8);
  });
});

describe('saml single logout endpoints', () => {
  let srv: http.Server;
  let cp: string;
  const row: SamlRouteRow = { id: ROUTE, match_type: 'path_prefix', match: '/app', modules: {}, hostports: ['app.example.test:443', 'alt.example.test:8443'] };
  const key = () => samlHandoffKey(samlHandoffSecret(module.signing.private_key_pem, ROUTE), ROUTE);
  const get = (url: string, accept = 'text/html') => fetch(url.replace(BASE, cp), { redirect: 'manual', headers: { accept } });
  const post = (url: string, fields: Record<string, string>) =>
    fetch(url.replace(BASE, cp), { method: 'POST', redirect: 'manual', headers: { accept: 'text/html', 'content-type': 'application/x-www-form-urlencoded' }, body: new URLSearchParams(fields).toString() });

  beforeAll(async () => {
    row.modules = { saml: module } as SamlRouteRow['modules'];
    const seen = new Set<string>();
    const db = {
      query: async (sql: string, params: unknown[] = []) => {
        if (sql.startsWith('SELECT')) return { rows: params[0] === ROUTE ? [row] : [], rowCount: 0 };
        if (sql.startsWith('INSERT')) {
          const k = `${params[0]}/${params[1]}`;
          const fresh = !seen.has(k);
          seen.add(k);
          return { rows: [], rowCount: fresh ? 1 : 0 };
        }
        return { rows: [], rowCount: 0 };
      },
    };
    const app = express();
    app.use(createSamlRouter({ db: db as never, log: createLogger('saml-slo-test', 'silent'), baseUrl: BASE }));
    srv = http.createServer(app).listen(0, '127.0.0.1');
    await once(srv, 'listening');
    cp = `http://127.0.0.1:${(srv.address() as AddressInfo).port}`;
  });
  afterAll(() => void srv?.close());

  it('SP-initiated: the edge hand-off → the IdP with a LogoutRequest → its LogoutResponse → a signed-out page', async () => {
    const ret = 'https://alt.example.test:8443/app/';
    const token = sealSamlLogoutHandoff(key(), handoff({ ret }));
    const toIdp = await get(`${BASE}/saml/${ROUTE}/logout?token=${encodeURIComponent(token)}`);
    expect(toIdp.status).toBe(302);
    const req = idp.readLogoutMessage(toIdp.headers.get('location')!, module.signing.certificate_pem);
    expect(req).toMatchObject({ nameId: 'alice', sessionIndex: '_sess-1', signatureValid: true });
    const back = await get(idp.logoutResponseUrl(SLO, { destination: SLO, inResponseTo: req.id, relayState: req.relayState! }));
    expect(back.status).toBe(200);
    const page = await back.text();
    expect(page).toContain('<h1>Signed out</h1>');
    expect(page).toContain(`<a href="${ret}">Sign in again</a>`);
    // and in the HTTP-POST binding
    const posted = await post(SLO, idp.logoutResponsePost({ destination: SLO, inResponseTo: req.id, relayState: req.relayState! }));
    expect(posted.status).toBe(200);
  });

  it('refuses a hand-off that is forged, expired, for another purpose, or returns off the edge: 400, no redirect', async () => {
    const other = samlHandoffKey('another-secret', ROUTE);
    const bad = [
      'garbage',
      sealSamlLogoutHandoff(other, handoff()),
      sealSamlLogoutHandoff(key(), handoff({ exp: Math.floor(Date.now() / 1000) - 1 })),
      sealSamlLogoutBounce(key(), { id: '_x', rs: '', h: 0, exp: Math.floor(Date.now() / 1000) + 60 }),
      sealSamlLogoutHandoff(key(), handoff({ ret: 'https://evil.test/app/' })),
      sealSamlLogoutHandoff(key(), handoff({ ret: 'http://app.example.test/app/' })),
      sealSamlLogoutHandoff(key(), handoff({ ret: 'https://app.example.test/elsewhere/' })),
    ];
    for (const t of bad) {
      const r = await get(`${BASE}/saml/${ROUTE}/logout?token=${encodeURIComponent(t)}`);
      expect(r.status).toBe(400);
      expect(r.headers.get('location')).toBeNull();
      const body = await r.text();
      expect(body).toContain('<h1>Sign-out failed</h1>');
      expect(body).toContain('ERR_WARREN_7112');
    }
    expect((await get(`${BASE}/saml/${ROUTE}/logout`, 'application/json')).status).toBe(400);
    expect((await get(`${BASE}/saml/${ROUTE}/logout?bounce=garbage`, 'application/json')).status).toBe(400);
  });

  it('IdP-initiated: the LogoutRequest → each edge origin clears its cookie → a signed LogoutResponse to the IdP', async () => {
    const toEdge = await get(idp.logoutRequestUrl(SLO, { destination: SLO, nameId: 'alice', id: '_idp-req-1', relayState: 'back-to-idp' }));
    expect(toEdge.status).toBe(302);
    const first = new URL(toEdge.headers.get('location')!);
    expect(first.origin + first.pathname).toBe('https://app.example.test/app/.warren/saml/logout');
    const token = first.searchParams.get('slo')!;
    expect(openSamlLogoutBounce(key(), token, Math.floor(Date.now() / 1000))).toMatchObject({ id: '_idp-req-1', rs: 'back-to-idp', h: 0 });
    // the edge comes back with the token: on to the next origin
    const next = await get(`${BASE}/saml/${ROUTE}/logout?bounce=${encodeURIComponent(token)}`);
    expect(next.status).toBe(302);
    const second = new URL(next.headers.get('location')!);
    expect(second.origin + second.pathname).toBe('https://alt.example.test:8443/app/.warren/saml/logout');
    // after the last origin: the answer to the IdP
    const done = await get(`${BASE}/saml/${ROUTE}/logout?bounce=${encodeURIComponent(second.searchParams.get('slo')!)}`);
    expect(done.status).toBe(302);
    expect(idp.readLogoutMessage(done.headers.get('location')!, module.signing.certificate_pem)).toMatchObject({
      inResponseTo: '_idp-req-1',
      status: 'urn:oasis:names:tc:SAML:2.0:status:Success',
      relayState: 'back-to-idp',
      signatureValid: true,
    });
    // the same request again (replay), and the HTTP-POST binding
    expect((await get(idp.logoutRequestUrl(SLO, { destination: SLO, id: '_idp-req-1' }))).status).toBe(400);
    const posted = await post(SLO, idp.logoutRequestPost({ destination: SLO, id: '_idp-req-2' }));
    expect(posted.status).toBe(302);
    expect(posted.headers.get('location')).toMatch(/^https:\/\/app\.example\.test\/app\/\.warren\/saml\/logout\?slo=v1\./);
  });

  it('an unsigned or broken logout message gets 400 with a clear page, never 500', async () => {
    const unsigned = await get(idp.logoutRequestUrl(SLO, { destination: SLO, unsigned: true }));
    expect(unsigned.status).toBe(400);
    const page = await unsigned.text();
    expect(page).toContain('<h1>Sign-out failed</h1>');
    expect(page).toContain('an unsigned logout message is never accepted');
    for (const r of [
      await get(SLO),
      await get(`${SLO}?SAMLRequest=%%%`),
      await get(`${SLO}?SAMLRequest=AAAA&SigAlg=${encodeURIComponent('http://www.w3.org/2001/04/xmldsig-more#rsa-sha256')}&Signature=AAAA`),
      await post(SLO, {}),
      await post(SLO, { SAMLRequest: 'not base64 xml' }),
      await post(SLO, { SAMLResponse: Buffer.from('<samlp:LogoutResponse xmlns:samlp="urn:oasis:names:tc:SAML:2.0:protocol"/>').toString('base64') }),
      await post(SLO, idp.logoutRequestPost({ destination: SLO, unsigned: true })),
      await fetch(`${cp}/saml/${ROUTE}/slo`, { method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded; charset=koi8-r' }, body: 'SAMLRequest=abc' }),
    ]) {
      expect(r.status).toBe(400);
      expect(await r.text()).toContain('ERR_WARREN_7112');
    }
  });
});
