import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ControlPlaneProcess } from '../support/processes.js';
import type { IngressProcess } from '../support/cluster.js';
import type { Browser, BrowserResponse } from '../support/browser.js';
import { newSamlKey, TestSamlIdp, type ResponseOptions } from '../support/saml-idp.js';
import { startSignInCluster, type SignInCluster } from '../support/sign-in-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * The `saml` route module on live traffic: a control plane (the SP endpoints under its public
 * URL), two ingress nodes, our agent and an upstream that echoes the headers it got. The IdP is
 * in this process (test/support/saml-idp.ts): it reads the signed AuthnRequest from the redirect
 * and answers with a Response signed by the key whose certificate is in the route's idp_metadata;
 * a scripted browser (cookie jar) carries everything, posting the Response to the ACS itself.
 * Single logout: the IdP's metadata lists an HTTP-Redirect SingleLogoutService; the test reads
 * our LogoutRequest / LogoutResponse from the redirects to it and answers with signed messages.
 */

const HOST = 'saml.e2e.test';
const ORIGIN = `https://${HOST}`;

let c: SignInCluster<TestSamlIdp>;
let idp: TestSamlIdp;
/** The two ingress nodes, and which one the browser's requests to HOST reach. */
let a: IngressProcess, b: IngressProcess, node: () => IngressProcess;
/** The control plane (its SP endpoints) and the CA the browser trusts (for raw TLS upgrades). */
let cp: ControlPlaneProcess, ca: string;

interface SamlRoute {
  id: string;
  acs: string;
  entityId: string;
  cert: string;
}
let main: SamlRoute;
let admins: SamlRoute;
let unsolicited: SamlRoute;

const browser = (): Browser => c.browser(() => node());

async function route(match: string, saml: Record<string, unknown>): Promise<SamlRoute> {
  const r = await c.route(match, { saml: { idp_metadata: idp.metadata(), ...saml } });
  return { id: r.id, acs: r.saml.assertion_consumer_service_url, entityId: r.saml.entity_id, cert: r.saml.request_signing_certificate_pem };
}

const form = (fields: Record<string, string>) => ({ method: 'POST', body: new URLSearchParams(fields).toString(), headers: { 'content-type': 'application/x-www-form-urlencoded' } });

/**
 * Edge → control plane login → IdP (the AuthnRequest read and its signature checked) → the
 * Response posted to the ACS. Returns the ACS answer, the Response and its RelayState.
 */
async function toAcs(br: Browser, url: string, r: SamlRoute, o: Partial<ResponseOptions> = {}): Promise<{ acs: BrowserResponse; saml: string; relay: string }> {
  const edge = await br.request(url);
  expect(edge.status).toBe(302);
  const login = await br.request(edge.headers.location!);
  expect(login.status, login.body).toBe(302);
  const req = idp.readRequest(login.headers.location!, r.cert);
  expect(req.signatureValid).toBe(true);
  expect(req.acs).toBe(r.acs);
  const saml = idp.response({ acs: r.acs, audience: r.entityId, inResponseTo: req.id, ...o });
  const acs = await br.request(r.acs, form({ SAMLResponse: saml, RelayState: req.relayState! }));
  return { acs, saml, relay: req.relayState! };
}

beforeAll(async () => {
  c = await startSignInCluster({ name: 'saml', host: HOST, providers: () => TestSamlIdp.create() });
  ({ cp, a, b, providers: idp, ca } = c);
  node = () => a;
  main = await route('/', {});
  admins = await route('/admins', { cookie_prefix: 'adm.', authorized_groups: ['admins'] });
  unsolicited = await route('/idp', { cookie_prefix: 'idp.', allow_idp_initiated: true });
}, CLUSTER_HOOK_MS);

afterAll(() => c?.stop(), 60_000);

describe('saml on live traffic', () => {
  it('sends an unauthenticated browser to the control plane login, and an API client gets 401', async () => {
    node = () => a;
    const br = browser();
    const r = await br.request(`${ORIGIN}/app/page?x=1`);
    expect(r.status).toBe(302);
    const loc = new URL(r.headers.location!);
    expect(loc.origin + loc.pathname).toBe(`${cp.baseUrl}/saml/${main.id}/login`);
    expect(loc.searchParams.get('redirect_uri')).toBe(`${ORIGIN}/.warren/saml/callback`);
    expect(r.headers['set-cookie']?.[0]).toMatch(/^__Host-warren\.saml\.login\.[^=]+=v1\..*; Path=\/; Max-Age=600; HttpOnly; SameSite=Lax; Secure$/);
    const apiRes = await br.request(`${ORIGIN}/api/items`, { headers: { accept: 'application/json' }, cookies: false });
    expect(apiRes.status).toBe(401);
    expect(apiRes.headers['www-authenticate']).toContain(`SAML realm=`);
  });

  it('signs in through the IdP and forwards the identity; the cookie works on the other node', async () => {
    node = () => a;
    const br = browser();
    const { acs } = await toAcs(br, `${ORIGIN}/app/page?x=1`, main, { nameId: 'alice', attributes: { email: ['alice@example.test'], displayName: ['Alice Example'] } });
    expect(acs.status, acs.body).toBe(302);
    const cb = new URL(acs.headers.location!);
    expect(cb.origin + cb.pathname).toBe(`${ORIGIN}/.warren/saml/callback`);
    const steps = await br.navigate(cb);
    expect(steps[0]!.status).toBe(302);
    expect(steps[0]!.headers.location).toBe('/app/page?x=1');
    const last = steps.at(-1)!;
    expect(last.status).toBe(200);
    const seen = JSON.parse(last.body);
    expect(seen.url).toBe('/app/page?x=1');
    expect(seen.headers).toMatchObject({ 'ngrok-auth-user-email': 'alice@example.test', 'ngrok-auth-user-id': 'alice', 'ngrok-auth-user-name': 'Alice Example' });
    expect(br.jar.get(HOST, '__Host-warren.saml')).toMatch(/^v1\./);

    // the hand-off is bound to this browser's pre-login cookie: another browser cannot use it
    const thief = browser();
    const stolen = await thief.request(cb);
    expect(stolen.status).toBe(400);

    node = () => b;
    const onB = await br.request(`${ORIGIN}/on-b`, { headers: { accept: 'application/json' } });
    expect(onB.status).toBe(200);
    expect(JSON.parse(onB.body).headers['ngrok-auth-user-id']).toBe('alice');
    node = () => a;
  });

  it('refuses a user outside authorized_groups with 403, and admits a member', async () => {
    node = () => a;
    const out = await toAcs(browser(), `${ORIGIN}/admins/x`, admins, { nameId: 'mallory', attributes: { groups: ['staff'] } });
    expect(out.acs.status).toBe(403);
    expect(out.acs.body).toContain('ERR_WARREN_7109');
    const br = browser();
    const ok = await toAcs(br, `${ORIGIN}/admins/x`, admins, { nameId: 'root', attributes: { groups: ['staff', 'admins'] } });
    expect(ok.acs.status).toBe(302);
    const last = (await br.navigate(ok.acs.headers.location!)).at(-1)!;
    expect(last.status).toBe(200);
    expect(JSON.parse(last.body).headers['ngrok-auth-user-id']).toBe('root');
  });

  it('refuses a tampered response and a replayed one', async () => {
    node = () => a;
    const tampered = await toAcs(browser(), `${ORIGIN}/t`, main, { nameId: 'alice', tamper: (x) => x.replace('>alice</saml:NameID>', '>admin</saml:NameID>') });
    expect(tampered.acs.status).toBe(400);
    expect(tampered.acs.body).toContain('ERR_WARREN_7111');
    const br = browser();
    const first = await toAcs(br, `${ORIGIN}/r`, main, { nameId: 'alice' });
    expect(first.acs.status).toBe(302);
    const again = await br.request(main.acs, form({ SAMLResponse: first.saml, RelayState: first.relay }));
    expect(again.status).toBe(400);
    expect(again.body).toContain('replay');
  });

  it('IdP-initiated: refused unless allow_idp_initiated; allowed, the browser signs in from the edge', async () => {
    node = () => a;
    const br = browser();
    const refused = await br.request(main.acs, form({ SAMLResponse: idp.response({ acs: main.acs, audience: main.entityId, nameId: 'alice' }), RelayState: `${ORIGIN}/x` }));
    expect(refused.status).toBe(400);
    expect(refused.body).toContain('allow_idp_initiated');
    const res = idp.response({ acs: unsolicited.acs, audience: unsolicited.entityId, nameId: 'alice' });
    const acs = await br.request(unsolicited.acs, form({ SAMLResponse: res, RelayState: `${ORIGIN}/idp/page?y=2` }));
    expect(acs.status, acs.body).toBe(302);
    expect(acs.headers.location).toBe(`${ORIGIN}/idp/.warren/saml/login?return_to=${encodeURIComponent('/idp/page?y=2')}`);
    // a RelayState on another host is not followed
    const other = await br.request(unsolicited.acs, form({ SAMLResponse: idp.response({ acs: unsolicited.acs, audience: unsolicited.entityId }), RelayState: 'https://evil.test/x' }));
    expect(other.headers.location).toBe(`${ORIGIN}/idp/.warren/saml/login?return_to=%2Fidp`);
    // the bounce starts an SP-initiated sign-in bound to this browser
    const { acs: second } = await toAcs(br, acs.headers.location!, unsolicited, { nameId: 'alice' });
    expect(second.status).toBe(302);
    const last = (await br.navigate(second.headers.location!)).at(-1)!;
    expect(last.status).toBe(200);
    expect(JSON.parse(last.body)).toMatchObject({ url: '/idp/page?y=2', headers: { 'ngrok-auth-user-id': 'alice' } });
  });

  it('gates WebSocket upgrades, strips identity header spellings, and returns only to this host', async () => {
    node = () => a;
    /** A raw upgrade to the node (the whole answer, read until the connection closes). */
    const upgrade = (headers: string) =>
      new Promise<string>((resolve, reject) => {
        const sock = tls.connect({ host: '127.0.0.1', port: node().https, servername: HOST, ca }, () => {
          sock.write(`GET /ws HTTP/1.1\r\nHost: ${HOST}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n${headers}\r\n`);
        });
        let out = '';
        sock.setEncoding('utf8');
        sock.on('data', (d: string) => (out += d));
        sock.on('end', () => resolve(out));
        sock.on('error', reject);
        sock.setTimeout(10_000, () => sock.destroy(new Error(`upgrade timed out: ${out}`)));
      });
    const anon = await upgrade('ngrok-auth-user-id: root\r\n');
    expect(anon).toMatch(/^HTTP\/1.1 401 /);
    expect(anon).toContain('ERR_WARREN_7106');

    // a return_to whose dot segments resolve to //evil.test is not followed
    const br = browser();
    const { acs } = await toAcs(br, `${ORIGIN}/.warren/saml/login?return_to=${encodeURIComponent('/.//evil.test/x')}`, main, { nameId: 'alice' });
    expect(acs.status, acs.body).toBe(302);
    const steps = await br.navigate(acs.headers.location!);
    expect(steps[0]!.headers.location).toBe('/');
    const session = br.jar.get(HOST, '__Host-warren.saml')!;
    expect(session).toMatch(/^v1\./);

    const signedIn = await upgrade(`Cookie: __Host-warren.saml=${session}\r\nngrok_auth_user_email: evil@x.test\r\nNgrok-Auth-User-Id: root\r\n`);
    expect(signedIn).toMatch(/^HTTP\/1.1 101 /);
    const seen = JSON.parse(signedIn.slice(signedIn.indexOf('\r\n\r\n') + 4)) as Record<string, string>;
    expect(seen['ngrok-auth-user-id']).toBe('alice');
    expect(seen).not.toHaveProperty('ngrok_auth_user_email');
    expect(seen.cookie ?? '').not.toContain('warren.saml');
  });

  it('the SP endpoints: metadata, no open redirect, clear 4xx for bad input', async () => {
    const br = browser();
    const md = await br.request(`${cp.baseUrl}/saml/${main.id}/metadata`);
    expect(md.status).toBe(200);
    expect(md.headers['content-type']).toContain('samlmetadata+xml');
    expect(md.body).toContain(`entityID="${main.entityId}"`);
    expect(md.body).toContain(`Location="${main.acs}"`);
    const open = await br.request(`${cp.baseUrl}/saml/${main.id}/login?state=abcdefghijklmnopqrstuvwxyz&redirect_uri=${encodeURIComponent('https://evil.test/.warren/saml/callback')}`, { headers: { accept: 'application/json' } });
    expect(open.status).toBe(400);
    expect(JSON.parse(open.body)).toMatchObject({ error_code: 'ERR_WARREN_7110', status_code: 400 });
    // the edge's hostname on another port, or over plain http: not a hostport of the edge
    for (const cb of [`https://${HOST}:8443/.warren/saml/callback`, `http://${HOST}/.warren/saml/callback`]) {
      const other = await br.request(`${cp.baseUrl}/saml/${main.id}/login?state=abcdefghijklmnopqrstuvwxyz&redirect_uri=${encodeURIComponent(cb)}`, { headers: { accept: 'application/json' } });
      expect(other.status, cb).toBe(400);
    }
    const noBody = await br.request(main.acs, form({}));
    expect(noBody.status).toBe(400);
    const garbage = await br.request(main.acs, form({ SAMLResponse: 'not base64 xml', RelayState: 'x' }));
    expect(garbage.status).toBe(400);
    const unknown = await br.request(`${cp.baseUrl}/saml/edghtsrt_nope/metadata`, { headers: { accept: 'application/json' } });
    expect(unknown.status).toBe(404);
    // the single logout service without a SAML message: a page saying what it is, 400
    const slo = await br.request(`${cp.baseUrl}/saml/${main.id}/slo`);
    expect(slo.status).toBe(400);
    expect(slo.body).toContain('ERR_WARREN_7112');
  });

  it('accepts an assertion encrypted to the route certificate', async () => {
    node = () => a;
    const br = browser();
    const edge = await br.request(`${ORIGIN}/enc`);
    const login = await br.request(edge.headers.location!);
    const req = idp.readRequest(login.headers.location!, main.cert);
    const saml = await idp.encryptedResponse({ acs: main.acs, audience: main.entityId, inResponseTo: req.id, nameId: 'enc-user' }, { cert: main.cert, algorithm: 'http://www.w3.org/2001/04/xmlenc#aes256-cbc' });
    const acs = await br.request(main.acs, form({ SAMLResponse: saml, RelayState: req.relayState! }));
    expect(acs.status, acs.body).toBe(302);
    const last = (await br.navigate(acs.headers.location!)).at(-1)!;
    expect(JSON.parse(last.body)).toMatchObject({ url: '/enc', headers: { 'ngrok-auth-user-id': 'enc-user' } });
    // the metadata offers the certificate for encryption
    const md = await br.request(`${cp.baseUrl}/saml/${main.id}/metadata`);
    expect(md.body).toContain('<KeyDescriptor use="encryption">');
  });
});

describe('saml single logout on live traffic', () => {
  /** A browser signed in to `r` through `path` as `nameId` with SessionIndex `sessionIndex`. */
  async function signedIn(r: SamlRoute, path: string, nameId: string, sessionIndex: string): Promise<Browser> {
    const br = browser();
    const { acs } = await toAcs(br, `${ORIGIN}${path}`, r, { nameId, sessionIndex, attributes: { groups: ['admins'] } });
    expect(acs.status, acs.body).toBe(302);
    const last = (await br.navigate(acs.headers.location!)).at(-1)!;
    expect(JSON.parse(last.body).headers['ngrok-auth-user-id']).toBe(nameId);
    return br;
  }
  /** Follows redirects from `url` until one points at the IdP; returns the responses and that IdP URL. */
  async function untilIdp(br: Browser, url: string): Promise<{ steps: BrowserResponse[]; idpUrl: URL }> {
    const steps: BrowserResponse[] = [];
    let next = new URL(url);
    for (;;) {
      const r = await br.request(next);
      steps.push(r);
      expect(r.status, `${r.url.href}: ${r.body}`).toBe(302);
      next = new URL(r.headers.location!, r.url);
      if (next.hostname === 'idp.saml.test') return { steps, idpUrl: next };
      if (steps.length > 6) throw new Error('too many redirects');
    }
  }
  /** Whether `br` still has a session at `url`: the upstream answers, rather than a 302 to sign-in. */
  const hasSession = async (br: Browser, url: string) => (await br.request(url)).status === 200;

  it('SP-initiated: the edge clears the cookie, the IdP gets a signed LogoutRequest for the session, its LogoutResponse ends at a signed-out page', async () => {
    node = () => a;
    const br = await signedIn(main, '/app/slo', 'alice', '_e2e-sess-1');
    const cookie = br.jar.get(HOST, '__Host-warren.saml')!;
    const out = await br.request(`${ORIGIN}/.warren/saml/logout`);
    expect(out.status).toBe(302);
    expect(br.jar.get(HOST, '__Host-warren.saml')).toBeUndefined();
    const handoff = new URL(out.headers.location!);
    expect(handoff.origin + handoff.pathname).toBe(`${cp.baseUrl}/saml/${main.id}/logout`);

    const toIdp = await br.request(handoff);
    expect(toIdp.status, toIdp.body).toBe(302);
    const req = idp.readLogoutMessage(toIdp.headers.location!, main.cert);
    expect(toIdp.headers.location!.startsWith(`${idp.sloUrl}?`)).toBe(true);
    expect(req).toMatchObject({ signatureValid: true, issuer: main.entityId, destination: idp.sloUrl, nameId: 'alice', nameIdFormat: 'urn:oasis:names:tc:SAML:2.0:nameid-format:persistent', sessionIndex: '_e2e-sess-1' });

    const slo = `${cp.baseUrl}/saml/${main.id}/slo`;
    const done = await br.request(idp.logoutResponseUrl(slo, { destination: slo, inResponseTo: req.id, relayState: req.relayState! }));
    expect(done.status, done.body).toBe(200);
    expect(done.body).toContain('<h1>Signed out</h1>');
    expect(done.body).toContain(`<a href="${ORIGIN}/">Sign in again</a>`);
    expect(await hasSession(br, `${ORIGIN}/app/slo`)).toBe(false);

    // a forged answer (another request's id) gets 400; the hand-off cannot be reused by another browser to reach another route
    const forged = await br.request(idp.logoutResponseUrl(slo, { destination: slo, inResponseTo: '_not-ours', relayState: req.relayState! }));
    expect(forged.status).toBe(400);
    expect(forged.body).toContain('ERR_WARREN_7112');
    const elsewhere = await browser().request(`${cp.baseUrl}/saml/${admins.id}/logout${handoff.search}`);
    expect(elsewhere.status).toBe(400);

    // stateless sessions: a copy of the cookie in another browser is not revoked (documented)
    const copy = browser();
    copy.jar.set(HOST, '__Host-warren.saml', cookie);
    expect(await hasSession(copy, `${ORIGIN}/app/slo`)).toBe(true);
  });

  it('IdP-initiated: a signed LogoutRequest bounces the browser through the edge (cookie cleared) and the IdP gets a signed LogoutResponse', async () => {
    node = () => a;
    const br = await signedIn(admins, '/admins/x', 'root', '_e2e-sess-2');
    const other = await signedIn(main, '/app/keep', 'bob', '_e2e-sess-3');
    const slo = `${cp.baseUrl}/saml/${admins.id}/slo`;
    // HTTP-Redirect binding: CP /slo → edge logout path → CP /logout?bounce → the IdP
    const { steps, idpUrl } = await untilIdp(br, idp.logoutRequestUrl(slo, { destination: slo, nameId: 'root', sessionIndex: '_e2e-sess-2', id: '_e2e-idp-req-1', relayState: 'idp-state' }));
    expect(steps).toHaveLength(3);
    expect(steps[1]!.url.href).toMatch(new RegExp(`^${ORIGIN}/admins/\\.warren/saml/logout\\?slo=v1\\.`));
    expect(steps[1]!.headers['set-cookie']).toEqual(['__Host-adm.saml=; Path=/; Max-Age=0; HttpOnly; SameSite=Lax; Secure']);
    expect(steps[2]!.url.origin + steps[2]!.url.pathname).toBe(`${cp.baseUrl}/saml/${admins.id}/logout`);
    expect(idpUrl.origin + idpUrl.pathname).toBe(idp.sloResponseUrl);
    expect(idp.readLogoutMessage(idpUrl, admins.cert)).toMatchObject({
      signatureValid: true,
      issuer: admins.entityId,
      inResponseTo: '_e2e-idp-req-1',
      status: 'urn:oasis:names:tc:SAML:2.0:status:Success',
      relayState: 'idp-state',
      destination: idp.sloResponseUrl,
    });
    expect(br.jar.get(HOST, '__Host-adm.saml')).toBeUndefined();
    expect(await hasSession(br, `${ORIGIN}/admins/x`)).toBe(false);
    // another route's session (its own cookie) is untouched
    expect(await hasSession(other, `${ORIGIN}/app/keep`)).toBe(true);

    // HTTP-POST binding, to the main route
    const post = await other.request(`${cp.baseUrl}/saml/${main.id}/slo`, form(idp.logoutRequestPost({ destination: `${cp.baseUrl}/saml/${main.id}/slo`, nameId: 'bob', id: '_e2e-idp-req-2' })));
    expect(post.status, post.body).toBe(302);
    const rest = await untilIdp(other, post.headers.location!);
    expect(rest.steps).toHaveLength(2);
    expect(idp.readLogoutMessage(rest.idpUrl, main.cert)).toMatchObject({ signatureValid: true, inResponseTo: '_e2e-idp-req-2', status: 'urn:oasis:names:tc:SAML:2.0:status:Success' });
    expect(await hasSession(other, `${ORIGIN}/app/keep`)).toBe(false);
  });

  it('refuses an unsigned, forged or replayed LogoutRequest with a 400 page; the session stays', async () => {
    node = () => a;
    const br = await signedIn(main, '/app/stay', 'carol', '_e2e-sess-4');
    const slo = `${cp.baseUrl}/saml/${main.id}/slo`;
    const unsigned = await br.request(idp.logoutRequestUrl(slo, { destination: slo, nameId: 'carol', unsigned: true }));
    expect(unsigned.status).toBe(400);
    expect(unsigned.headers['content-type']).toContain('text/html');
    expect(unsigned.body).toContain('<h1>Sign-out failed</h1>');
    expect(unsigned.body).toContain('an unsigned logout message is never accepted');
    const forged = await br.request(idp.logoutRequestUrl(slo, { destination: slo, nameId: 'carol', signer: await newSamlKey('evil') }));
    expect(forged.status).toBe(400);
    const once = idp.logoutRequestUrl(slo, { destination: slo, nameId: 'carol', id: '_e2e-once' });
    expect((await browser().request(once)).status).toBe(302);
    // (the first use went through another browser; this one keeps its session)
    const replayed = await br.request(once);
    expect(replayed.status).toBe(400);
    expect(replayed.body).toContain('replay');
    expect(await hasSession(br, `${ORIGIN}/app/stay`)).toBe(true);
    // a bounce token that is not the control plane's: the edge clears the cookie and says so
    const bogus = await br.request(`${ORIGIN}/.warren/saml/logout?slo=v1.bogus`);
    expect(bogus.status).toBe(400);
    expect(bogus.body).toContain('ERR_WARREN_7112');
    expect(await hasSession(br, `${ORIGIN}/app/stay`)).toBe(false);
  });
});
