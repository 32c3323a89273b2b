import { once } from 'node:events';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCertificate, type DpEdge, type SelfSigned } from '@warren/shared';
import type { RouteStage } from '../pipeline/types.js';
import { mutualTlsCaPems, mutualTlsStage } from './mutual-tls.js';
import { ACCOUNT, makeConfig, makeEdge, makeState } from './testing.js';

let root: SelfSigned;
let intermediate: SelfSigned;
let otherCa: SelfSigned;
let server: https.Server;
let port: number;
/** The stage the test server runs for each request. */
let current: RouteStage | null = null;

const edge = (ids: string[], enabled = true): DpEdge => makeEdge({ mutualTls: { enabled, certificateAuthorityIds: ids } });
const config = () =>
  makeConfig({
    certificateAuthorities: [
      { id: 'ca_root', accountId: ACCOUNT, caPem: root.certificatePem },
      { id: 'ca_other', accountId: ACCOUNT, caPem: otherCa.certificatePem },
      { id: 'ca_foreign', accountId: 'acc_else', caPem: root.certificatePem },
    ],
  });

beforeAll(async () => {
  [root, otherCa] = await Promise.all([
    createCertificate({ commonName: 'Client Root CA', days: 1, ca: true, keyType: 'ec' }),
    createCertificate({ commonName: 'Other CA', days: 1, ca: true, keyType: 'ec' }),
  ]);
  intermediate = await createCertificate({ commonName: 'Client Intermediate', days: 1, ca: true, issuer: root, keyType: 'ec' });
  const serverCert = await createCertificate({ commonName: 'localhost', days: 1, dnsNames: ['localhost'], ipAddresses: ['127.0.0.1'], issuer: root, keyType: 'ec' });
  server = https.createServer({ key: serverCert.privateKeyPem, cert: serverCert.certificatePem, requestCert: true, rejectUnauthorized: false }, async (req, res) => {
    const s = makeState({ socket: req.socket, scheme: 'https' });
    Object.defineProperty(s, 'req', { value: req });
    const out = current ? await current.onRequest!(s) : null;
    res.writeHead(out ? out.status : 200, { 'content-type': 'text/plain' });
    res.end(out ? String(out.body) : 'ok');
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  port = (server.address() as AddressInfo).port;
});

afterAll(() => {
  server?.close();
});

async function get(client?: { key: string; cert: string }): Promise<{ status: number; body: string }> {
  const req = https.request({ host: '127.0.0.1', port, path: '/', ca: root.certificatePem, servername: 'localhost', agent: false, ...client });
  req.end();
  const [res] = (await once(req, 'response')) as [import('node:http').IncomingMessage];
  let body = '';
  for await (const c of res) body += c;
  return { status: res.statusCode!, body };
}

describe('mutual_tls', () => {
  it('is absent when the edge has no mutual TLS or it is disabled', () => {
    expect(mutualTlsStage(makeEdge(), config())).toBeNull();
    expect(mutualTlsStage(edge(['ca_root'], false), config())).toBeNull();
    expect(mutualTlsCaPems(edge(['ca_root', 'ca_foreign', 'ca_missing']), config())).toEqual([root.certificatePem]);
  });

  it('admits a client certificate signed by an edge CA', async () => {
    const leaf = await createCertificate({ commonName: 'client-1', days: 1, issuer: root, keyType: 'ec' });
    current = mutualTlsStage(edge(['ca_root']), config());
    expect((await get({ key: leaf.privateKeyPem, cert: leaf.certificatePem })).status).toBe(200);
  });

  it('admits a chain through an intermediate the client presents', async () => {
    const leaf = await createCertificate({ commonName: 'client-2', days: 1, issuer: intermediate, dnsNames: ['client.test'], keyType: 'ec' });
    current = mutualTlsStage(edge(['ca_other', 'ca_root']), config());
    expect((await get({ key: leaf.privateKeyPem, cert: leaf.certificatePem + intermediate.certificatePem })).status).toBe(200);
    // Without the intermediate the chain cannot be built.
    expect((await get({ key: leaf.privateKeyPem, cert: leaf.certificatePem })).status).toBe(403);
  });

  it('refuses a missing certificate', async () => {
    current = mutualTlsStage(edge(['ca_root']), config());
    const r = await get();
    expect(r.status).toBe(403);
    expect(r.body).toMatch(/no client certificate/);
    expect(r.body).toMatch(/ERR_WARREN_7104/);
  });

  it('refuses certificates of other CAs and self-signed ones', async () => {
    current = mutualTlsStage(edge(['ca_root']), config());
    const foreign = await createCertificate({ commonName: 'client-3', days: 1, issuer: otherCa, keyType: 'ec' });
    expect((await get({ key: foreign.privateKeyPem, cert: foreign.certificatePem })).status).toBe(403);
    const self = await createCertificate({ commonName: 'client-4', days: 1, keyType: 'ec' });
    const r = await get({ key: self.privateKeyPem, cert: self.certificatePem });
    expect(r.status).toBe(403);
    expect(r.body).toMatch(/not signed by a trusted/);
  });

  it('refuses expired certificates', async () => {
    const leaf = await createCertificate({ commonName: 'client-5', days: 1, issuer: root, keyType: 'ec' });
    current = mutualTlsStage(edge(['ca_root']), config(), () => Date.now() + 3 * 86_400_000);
    const r = await get({ key: leaf.privateKeyPem, cert: leaf.certificatePem });
    expect(r.status).toBe(403);
    expect(r.body).toMatch(/expired/);
  });

  it('refuses everything when the edge CAs are gone, and plain HTTP', async () => {
    const leaf = await createCertificate({ commonName: 'client-6', days: 1, issuer: root, keyType: 'ec' });
    current = mutualTlsStage(edge(['ca_missing']), config());
    expect((await get({ key: leaf.privateKeyPem, cert: leaf.certificatePem })).status).toBe(403);
    const stage = mutualTlsStage(edge(['ca_root']), config())!;
    expect((await stage.onRequest!(makeState({ scheme: 'http' })))!.status).toBe(403);
  });
});
