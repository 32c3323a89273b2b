import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { once } from 'node:events';
import express from 'express';
import { DOMParser } from '@xmldom/xmldom';
import { SignedXml } from 'xml-crypto';
import { beforeAll, describe, expect, it } from 'vitest';
import { createLogger, openSamlHandoff, samlHandoffKey, unseal } from '@warren/shared';
import { newSamlKey, TestSamlIdp } from '../../../../../test/support/saml-idp.js';
import { acceptResponse, decryptionKey, MAX_RELAY_STATE_CHARS, spMetadata, startLogin, type SpContext } from './saml-sp.js';
import { createSamlRouter, onEdge } from './saml.http.js';
import { memoryReplay, refusal } from './saml.testing.js';
import { newSamlSigningKey, parseIdpMetadata, samlForDataplane, samlHandoffSecret, samlRelayKey, type StoredSaml } from './saml.js';

const BASE = 'https://cp.example.test';
const ROUTE = 'edghtsrt_saml1';
const ACS = `${BASE}/saml/${ROUTE}/acs`;
const ENTITY = `${BASE}/saml/${ROUTE}/metadata`;
const CALLBACK = 'https://app.example.test/.warren/saml/callback';
const STATE = 'state-0123456789abcdef';

let idp: TestSamlIdp;
let module: StoredSaml;

function ctx(over: Partial<StoredSaml> = {}): SpContext {
  return { routeId: ROUTE, baseUrl: BASE, module: { ...module, ...over } };
}

/** A fresh SP-initiated login: the request id and the RelayState the CP sent the IdP. */
async function login(c = ctx()): Promise<{ id: string; relay: string }> {
  const out = await startLogin(c, STATE, CALLBACK, Date.now());
  if (!('redirect' in out)) throw new Error('expected a redirect');
  const req = idp.readRequest(out.redirect, c.module.signing.certificate_pem);
  return { id: req.id, relay: req.relayState! };
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
    nameid_format: 'urn:oasis:names:tc:SAML:2.0:nameid-format:persistent',
    signing: await newSamlSigningKey(ROUTE),
  };
});

describe('saml SP', () => {
  it('reads the IdP metadata', () => {
    const info = parseIdpMetadata(idp.metadata());
    expect(info).toMatchObject({ entityId: idp.entityId, ssoRedirect: idp.ssoUrl, ssoPost: null });
    expect(info.certs).toHaveLength(1);
    expect(() => parseIdpMetadata(idp.metadata().replace(/<md:KeyDescriptor[\s\S]*<\/md:KeyDescriptor>/, ''))).toThrow(/no signing certificate/);
  });

  it('sends a signed AuthnRequest with force_authn and the NameID format; RelayState is sealed', async () => {
    const c = ctx({ force_authn: true, nameid_format: 'urn:oasis:names:tc:SAML:1.1:nameid-format:emailAddress' });
    const out = await startLogin(c, STATE, CALLBACK, Date.now());
    expect('redirect' in out && out.redirect.startsWith(`${idp.ssoUrl}?`)).toBe(true);
    const req = idp.readRequest((out as { redirect: string }).redirect, c.module.signing.certificate_pem);
    expect(req).toMatchObject({ acs: ACS, issuer: ENTITY, forceAuthn: true, nameIdFormat: 'urn:oasis:names:tc:SAML:1.1:nameid-format:emailAddress', signatureValid: true });
    expect(unseal(samlRelayKey(c.module.signing.private_key_pem, ROUTE), 'saml-relay', req.relayState)).toMatchObject({ i: req.id, s: STATE, c: CALLBACK });
    // another key's signature does not verify
    expect(idp.readRequest((out as { redirect: string }).redirect, (await newSamlKey()).cert).signatureValid).toBe(false);
  });

  it('accepts a good response and reads the identity', async () => {
    const { id, relay } = await login();
    const res = idp.response({
      acs: ACS,
      audience: ENTITY,
      inResponseTo: id,
      nameId: 'u-1',
      attributes: { email: ['alice@example.test'], displayName: ['Alice Example'] },
    });
    const ok = await acceptResponse(ctx(), res, relay, Date.now(), memoryReplay());
    expect(ok).toEqual({
      identity: { sub: 'u-1', email: 'alice@example.test', name: 'Alice Example' },
      logout: { f: 'urn:oasis:names:tc:SAML:2.0:nameid-format:persistent', si: expect.stringMatching(/^_s/) },
      relay: { state: STATE, callbackUrl: CALLBACK },
      target: null,
    });
  });

  it('refuses a bad signature, a tampered assertion and an unsigned one', async () => {
    const { id, relay } = await login();
    const other = await newSamlKey('evil');
    const bad = idp.response({ acs: ACS, audience: ENTITY, inResponseTo: id, signer: other });
    expect((await refusal(acceptResponse(ctx(), bad, relay, Date.now(), memoryReplay()))).message).toMatch(/signature/i);
    const tampered = idp.response({ acs: ACS, audience: ENTITY, inResponseTo: id, nameId: 'alice', tamper: (x) => x.replace('>alice</saml:NameID>', '>admin</saml:NameID>') });
    expect((await refusal(acceptResponse(ctx(), tampered, relay, Date.now(), memoryReplay()))).code).toBe(7111);
    const unsigned = idp.response({ acs: ACS, audience: ENTITY, inResponseTo: id, unsigned: true });
    expect((await refusal(acceptResponse(ctx(), unsigned, relay, Date.now(), memoryReplay()))).message).toMatch(/signature/i);
  });

  it('refuses a wrong audience, recipient, destination or issuer', async () => {
    const { id, relay } = await login();
    const cases: Array<[Parameters<TestSamlIdp['response']>[0], RegExp]> = [
      [{ acs: ACS, audience: 'https://other.example/sp', inResponseTo: id }, /audience/i],
      [{ acs: ACS, audience: ENTITY, inResponseTo: id, recipient: 'https://evil.test/acs' }, /Recipient/],
      [{ acs: ACS, audience: ENTITY, inResponseTo: id, destination: 'https://evil.test/acs' }, /Destination/],
      [{ acs: ACS, audience: ENTITY, inResponseTo: id, issuer: 'https://other-idp.test' }, /issuer/],
    ];
    for (const [o, msg] of cases) expect((await refusal(acceptResponse(ctx(), idp.response(o), relay, Date.now(), memoryReplay()))).message).toMatch(msg);
  });

  it('refuses expired, not yet valid and too old assertions', async () => {
    const { id, relay } = await login();
    const expired = idp.response({ acs: ACS, audience: ENTITY, inResponseTo: id, notBeforeMs: -600_000, notOnOrAfterMs: -120_000, issueInstantMs: -600_000 });
    expect((await refusal(acceptResponse(ctx(), expired, relay, Date.now(), memoryReplay()))).message).toMatch(/expired/i);
    const early = idp.response({ acs: ACS, audience: ENTITY, inResponseTo: id, notBeforeMs: 300_000, notOnOrAfterMs: 600_000 });
    expect((await refusal(acceptResponse(ctx(), early, relay, Date.now(), memoryReplay()))).message).toMatch(/not yet valid/i);
    const old = idp.response({ acs: ACS, audience: ENTITY, inResponseTo: id, issueInstantMs: -20 * 60_000, notOnOrAfterMs: 3600_000 });
    expect((await refusal(acceptResponse(ctx(), old, relay, Date.now(), memoryReplay()))).message).toMatch(/too old|expired/i);
  });

  it('refuses a replayed assertion', async () => {
    const { id, relay } = await login();
    const replay = memoryReplay();
    const res = idp.response({ acs: ACS, audience: ENTITY, inResponseTo: id });
    await acceptResponse(ctx(), res, relay, Date.now(), replay);
    expect((await refusal(acceptResponse(ctx(), res, relay, Date.now(), replay))).message).toMatch(/replay/);
  });

  it('checks InResponseTo against the request id sealed in RelayState', async () => {
    const { relay } = await login();
    const other = await login();
    const res = idp.response({ acs: ACS, audience: ENTITY, inResponseTo: other.id });
    expect((await refusal(acceptResponse(ctx(), res, relay, Date.now(), memoryReplay()))).message).toMatch(/another sign-in request/);
    const noRelay = idp.response({ acs: ACS, audience: ENTITY, inResponseTo: other.id });
    expect((await refusal(acceptResponse(ctx(), noRelay, 'https://app.example.test/', Date.now(), memoryReplay()))).message).toMatch(/did not issue/);
  });

  it('refuses an unsolicited assertion passed off as a reply by an InResponseTo on the unsigned Response', async () => {
    // the attacker starts a sign-in of their own (RelayState with their state), then posts an
    // unsolicited assertion with that request's id added to the Response element (not signed)
    const { id, relay } = await login();
    const spliced = idp.response({ acs: ACS, audience: ENTITY, inResponseTo: null, nameId: 'victim', tamper: (x) => x.replace('<samlp:Response ', `<samlp:Response InResponseTo="${id}" `) });
    expect((await refusal(acceptResponse(ctx(), spliced, relay, Date.now(), memoryReplay()))).message).toMatch(/InResponseTo is not in the signed assertion/);
    // with allow_idp_initiated it is an IdP-initiated response: no hand-off for the RelayState's browser
    const again = idp.response({ acs: ACS, audience: ENTITY, inResponseTo: null, nameId: 'victim', tamper: (x) => x.replace('<samlp:Response ', `<samlp:Response InResponseTo="${id}" `) });
    expect(await acceptResponse(ctx({ allow_idp_initiated: true }), again, relay, Date.now(), memoryReplay())).toMatchObject({ relay: null });
  });

  it('refuses an overlong RelayState', async () => {
    const res = idp.response({ acs: ACS, audience: ENTITY, inResponseTo: null });
    expect((await refusal(acceptResponse(ctx({ allow_idp_initiated: true }), res, `https://app.example.test/${'a'.repeat(MAX_RELAY_STATE_CHARS)}`, Date.now(), memoryReplay()))).code).toBe(7111);
  });

  it('takes a callback only on a hostport of the edge (no other port, no plain http for a :443 edge)', () => {
    const row = { hostports: ['app.example.test:443', 'alt.example.test:8443', 'plain.example.test:80'], match: '/' };
    expect(onEdge(row, CALLBACK)?.href).toBe(CALLBACK);
    expect(onEdge(row, 'https://app.example.test:443/.warren/saml/callback')).not.toBeNull();
    expect(onEdge(row, 'https://alt.example.test:8443/.warren/saml/callback')).not.toBeNull();
    expect(onEdge(row, 'http://plain.example.test/.warren/saml/callback')).not.toBeNull();
    for (const bad of ['http://app.example.test/.warren/saml/callback', 'https://app.example.test:9999/.warren/saml/callback', 'https://alt.example.test/.warren/saml/callback', 'https://evil.test/.warren/saml/callback', 'https://u:p@app.example.test/x']) {
      expect(onEdge(row, bad)).toBeNull();
    }
    expect(onEdge({ hostports: ['app.example.test:443', 'other.example.test:443'], match: 'app.example.test/x' }, 'https://other.example.test/x/.warren/saml/callback')).toBeNull();
  });

  it('refuses IdP-initiated responses unless allow_idp_initiated', async () => {
    const res = () => idp.response({ acs: ACS, audience: ENTITY, inResponseTo: null, nameId: 'bob' });
    expect((await refusal(acceptResponse(ctx(), res(), 'https://app.example.test/x', Date.now(), memoryReplay()))).message).toMatch(/IdP-initiated/);
    const ok = await acceptResponse(ctx({ allow_idp_initiated: true }), res(), 'https://app.example.test/x', Date.now(), memoryReplay());
    expect(ok).toMatchObject({ identity: { sub: 'bob' }, relay: null, target: 'https://app.example.test/x' });
  });

  it('checks authorized_groups against the group attributes', async () => {
    const c = ctx({ authorized_groups: ['admins', 'ops'] });
    const { id, relay } = await login(c);
    const outsider = idp.response({ acs: ACS, audience: ENTITY, inResponseTo: id, attributes: { groups: ['staff'] } });
    const r = await refusal(acceptResponse(c, outsider, relay, Date.now(), memoryReplay()));
    expect(r.code).toBe(7109);
    const member = idp.response({ acs: ACS, audience: ENTITY, inResponseTo: id, attributes: { 'http://schemas.microsoft.com/ws/2008/06/identity/claims/groups': ['staff', 'ops'] } });
    expect((await acceptResponse(c, member, relay, Date.now(), memoryReplay())).identity.sub).toBe('alice');
    const memberOf = idp.response({ acs: ACS, audience: ENTITY, inResponseTo: id, attributes: { memberOf: ['admins'] } });
    expect((await acceptResponse(c, memberOf, relay, Date.now(), memoryReplay())).identity.sub).toBe('alice');
  });

  it('accepts an encrypted assertion (signed, then encrypted to the SP certificate) and applies every check to it', async () => {
    const cert = module.signing.certificate_pem;
    for (const enc of [
      { cert },
      { cert, algorithm: 'http://www.w3.org/2001/04/xmlenc#aes256-cbc', digest: 'sha256' },
      { cert, algorithm: 'http://www.w3.org/2009/xmlenc11#aes128-gcm' },
      { cert, algorithm: 'http://www.w3.org/2001/04/xmlenc#aes128-cbc' },
    ] as const) {
      const { id, relay } = await login();
      const res = await idp.encryptedResponse({ acs: ACS, audience: ENTITY, inResponseTo: id, nameId: 'enc-1', sessionIndex: '_sess1', attributes: { email: ['enc@example.test'] } }, enc);
      expect(Buffer.from(res, 'base64').toString()).toContain('<saml:EncryptedAssertion><xenc:EncryptedData');
      expect(Buffer.from(res, 'base64').toString()).not.toContain('enc@example.test');
      const ok = await acceptResponse(ctx(), res, relay, Date.now(), memoryReplay());
      expect(ok).toMatchObject({ identity: { sub: 'enc-1', email: 'enc@example.test' }, relay: { state: STATE, callbackUrl: CALLBACK }, logout: { si: '_sess1', f: 'urn:oasis:names:tc:SAML:2.0:nameid-format:persistent' } });
    }
    // an unsigned assertion is accepted only inside a signed Response
    {
      const { id, relay } = await login();
      const res = await idp.encryptedResponse({ acs: ACS, audience: ENTITY, inResponseTo: id, nameId: 'enc-2', unsigned: true, signResponse: true }, { cert });
      expect((await acceptResponse(ctx(), res, relay, Date.now(), memoryReplay())).identity.sub).toBe('enc-2');
      const bare = await idp.encryptedResponse({ acs: ACS, audience: ENTITY, inResponseTo: id, unsigned: true }, { cert });
      const r = await refusal(acceptResponse(ctx(), bare, relay, Date.now(), memoryReplay()));
      expect(r.code).toBe(7111);
      expect(r.message).toMatch(/could not be decrypted .* or neither it nor the Response carries a valid signature/);
    }
    // the checks of the decrypted assertion: audience, recipient, InResponseTo, time, replay
    const { id, relay } = await login();
    const other = await login();
    const cases: Array<[Parameters<TestSamlIdp['response']>[0], RegExp]> = [
      [{ acs: ACS, audience: 'https://other.example/sp', inResponseTo: id }, /audience/i],
      [{ acs: ACS, audience: ENTITY, inResponseTo: id, recipient: 'https://evil.test/acs' }, /Recipient/],
      [{ acs: ACS, audience: ENTITY, inResponseTo: other.id }, /another sign-in request/],
      [{ acs: ACS, audience: ENTITY, inResponseTo: id, notBeforeMs: -600_000, notOnOrAfterMs: -120_000, issueInstantMs: -600_000 }, /expired/],
      [{ acs: ACS, audience: ENTITY, inResponseTo: id, issuer: 'https://other-idp.test' }, /issuer/],
      [{ acs: ACS, audience: ENTITY, inResponseTo: id, signer: await newSamlKey('evil') }, /could not be decrypted .* valid signature/],
    ];
    for (const [o, msg] of cases) expect((await refusal(acceptResponse(ctx(), await idp.encryptedResponse(o, { cert }), relay, Date.now(), memoryReplay()))).message).toMatch(msg);
    const replay = memoryReplay();
    const once = await idp.encryptedResponse({ acs: ACS, audience: ENTITY, inResponseTo: id }, { cert });
    await acceptResponse(ctx(), once, relay, Date.now(), replay);
    expect((await refusal(acceptResponse(ctx(), once, relay, Date.now(), replay))).message).toMatch(/replay/);
  });

  it('refuses an assertion encrypted to another key, tampered ciphertext, 3DES, and two assertions: 400 with one message, never a crash', async () => {
    const { id, relay } = await login();
    const cert = module.signing.certificate_pem;
    const uniform = /^the encrypted assertion could not be decrypted with this service's key, or neither it nor the Response carries a valid signature of the IdP$/;
    const otherKey = await newSamlKey('other sp');
    const wrongKey = await idp.encryptedResponse({ acs: ACS, audience: ENTITY, inResponseTo: id }, { cert: otherKey.cert });
    // a byte of the encrypted content key changed
    const flip = (x: string) => x.replace(/<e:CipherValue>([A-Za-z0-9+/]{40})/, (_m, v: string) => `<e:CipherValue>${v.slice(0, 30)}${v[30] === 'A' ? 'B' : 'A'}${v.slice(31)}`);
    // a byte of the content ciphertext changed
    const flipContent = (x: string) => {
      const i = x.lastIndexOf('<xenc:CipherValue>') + '<xenc:CipherValue>'.length + 40;
      return x.slice(0, i) + (x[i] === 'A' ? 'B' : 'A') + x.slice(i + 1);
    };
    const cases = [
      wrongKey,
      await idp.encryptedResponse({ acs: ACS, audience: ENTITY, inResponseTo: id, tamper: flipContent }, { cert }),
      await idp.encryptedResponse({ acs: ACS, audience: ENTITY, inResponseTo: id, tamper: flipContent }, { cert, algorithm: 'http://www.w3.org/2001/04/xmlenc#aes256-cbc' }),
      await idp.encryptedResponse({ acs: ACS, audience: ENTITY, inResponseTo: id, tamper: flip }, { cert }),
      await idp.encryptedResponse({ acs: ACS, audience: ENTITY, inResponseTo: id, signResponse: true, tamper: flipContent }, { cert, algorithm: 'http://www.w3.org/2001/04/xmlenc#aes128-cbc' }),
      await idp.encryptedResponse({ acs: ACS, audience: ENTITY, inResponseTo: id, tamper: (x) => x.replace(/<xenc:CipherValue>[^<]*<\/xenc:CipherValue>\s*<\/xenc:CipherData>\s*<\/xenc:EncryptedData>\s*<\/saml:EncryptedAssertion>/, '<xenc:CipherValue>AAAA</xenc:CipherValue></xenc:CipherData></xenc:EncryptedData></saml:EncryptedAssertion>') }, { cert }),
    ];
    for (const res of cases) {
      expect(Buffer.from(res, 'base64').toString()).toContain('EncryptedAssertion');
      const r = await refusal(acceptResponse(ctx(), res, relay, Date.now(), memoryReplay()));
      expect(r.code).toBe(7111);
      expect(r.message).toMatch(uniform);
    }
    const tdes = await idp.encryptedResponse({ acs: ACS, audience: ENTITY, inResponseTo: id }, { cert, algorithm: 'http://www.w3.org/2001/04/xmlenc#tripledes-cbc' });
    expect((await refusal(acceptResponse(ctx(), tdes, relay, Date.now(), memoryReplay()))).message).toMatch(/algorithm this service does not accept \(http:\/\/www.w3.org\/2001\/04\/xmlenc#tripledes-cbc\)/);
    const one = Buffer.from(await idp.encryptedResponse({ acs: ACS, audience: ENTITY, inResponseTo: id }, { cert }), 'base64').toString();
    const enc = /<saml:EncryptedAssertion>[\s\S]*<\/saml:EncryptedAssertion>/.exec(one)![0];
    const two = Buffer.from(one.replace(enc, enc + enc)).toString('base64');
    expect((await refusal(acceptResponse(ctx(), two, relay, Date.now(), memoryReplay()))).code).toBe(7111);
    const mixed = Buffer.from(one.replace(enc, enc + Buffer.from(idp.response({ acs: ACS, audience: ENTITY, inResponseTo: id }), 'base64').toString().match(/<saml:Assertion[\s\S]*<\/saml:Assertion>/)![0])).toString('base64');
    expect((await refusal(acceptResponse(ctx(), mixed, relay, Date.now(), memoryReplay()))).code).toBe(7111);
  });

  it('decrypts only with an RSA key; an EC key pair gets no encryption certificate in the metadata', async () => {
    expect(decryptionKey(module)).toBe(module.signing.private_key_pem);
    const { generateKeyPairSync } = await import('node:crypto');
    const ec = generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
    expect(decryptionKey({ ...module, signing: { ...module.signing, private_key_pem: ec } })).toBeUndefined();
    const { id, relay } = await login();
    const res = await idp.encryptedResponse({ acs: ACS, audience: ENTITY, inResponseTo: id }, { cert: module.signing.certificate_pem });
    expect((await refusal(acceptResponse(ctx({ signing: { ...module.signing, private_key_pem: ec } }), res, relay, Date.now(), memoryReplay()))).message).toMatch(/not an RSA key/);
  });

  it('serves SP metadata with the ACS, SLO and signing certificate', () => {
    const xml = spMetadata(ctx());
    expect(xml).toContain(`entityID="${ENTITY}"`);
    expect(xml).toContain(`Location="${ACS}"`);
    expect(xml).toContain(`${BASE}/saml/${ROUTE}/slo`);
    expect(xml).toContain(module.signing.certificate_pem.replace(/-----[^-]+-----/g, '').replace(/\s+/g, '').slice(0, 60));
    // the same (RSA) certificate as the encryption key, with the content algorithms we decrypt
    expect(xml).toMatch(/<KeyDescriptor use="signing">/);
    expect(xml).toMatch(/<KeyDescriptor use="encryption">[\s\S]*<EncryptionMethod Algorithm="http:\/\/www.w3.org\/2009\/xmlenc11#aes256-gcm"\/>/);
  });

  it('signs the SP metadata with the SP key (enveloped, RSA-SHA256, first child of the EntityDescriptor)', async () => {
    const xml = spMetadata(ctx());
    const doc = new DOMParser().parseFromString(xml, 'text/xml');
    const root = doc.documentElement!;
    const first = Array.from(root.childNodes).find((n) => n.nodeType === 1) as unknown as { localName: string; namespaceURI: string };
    expect(first).toMatchObject({ localName: 'Signature', namespaceURI: 'http://www.w3.org/2000/09/xmldsig#' });
    const verify = (cert: string, text: string) => {
      const sig = new SignedXml({ publicCert: cert });
      sig.loadSignature(first as never);
      try {
        return sig.checkSignature(text);
      } catch {
        return false;
      }
    };
    expect(xml).toContain('<SignatureMethod Algorithm="http://www.w3.org/2001/04/xmldsig-more#rsa-sha256"/>');
    expect(verify(module.signing.certificate_pem, xml)).toBe(true);
    const altered = xml.replace(`Location="${ACS}"`, 'Location="https://evil.test/acs"');
    expect(altered).not.toBe(xml);
    expect(verify(module.signing.certificate_pem, altered)).toBe(false);
    expect(verify((await newSamlKey()).cert, xml)).toBe(false);
  });

  it('pushes a derived hand-off secret, never the private key', () => {
    const pushed = samlForDataplane(module, ROUTE, BASE);
    expect(JSON.stringify(pushed)).not.toContain('PRIVATE KEY');
    expect(pushed).not.toHaveProperty('signing');
    expect(pushed).toMatchObject({ handoff_secret: samlHandoffSecret(module.signing.private_key_pem, ROUTE), login_url: `${BASE}/saml/${ROUTE}/login` });
    const key = samlHandoffKey(pushed.handoff_secret as string, ROUTE);
    expect(openSamlHandoff(key, 'v1.garbage', 0)).toBeNull();
  });
});

describe('saml SP endpoints', () => {
  it('answers a form body it cannot read (charset, content-encoding) with 400, not 500', async () => {
    const app = express();
    app.use(createSamlRouter({ db: {} as never, log: createLogger('saml-test', 'silent'), baseUrl: BASE }));
    const srv = http.createServer(app).listen(0, '127.0.0.1');
    await once(srv, 'listening');
    try {
      const url = `http://127.0.0.1:${(srv.address() as AddressInfo).port}/saml/${ROUTE}/acs`;
      for (const headers of [{ 'content-type': 'application/x-www-form-urlencoded; charset=koi8-r' } as Record<string, string>, { 'content-type': 'application/x-www-form-urlencoded', 'content-encoding': 'x-unknown' }]) {
        const r = await fetch(url, { method: 'POST', headers, body: 'SAMLResponse=abc' });
        expect(r.status).toBe(400);
        expect(await r.json()).toMatchObject({ error_code: 'ERR_WARREN_7111' });
      }
    } finally {
      srv.close();
    }
  });
});
