import { afterEach, describe, expect, it } from 'vitest';
import https from 'node:https';
import type net from 'node:net';
import { createCertificate, type SelfSigned } from '@warren/shared';
import { clearChainVerifyErrors } from './tls-error-queue.js';
import { captureClientHello } from './client-hello.js';

describe('a client certificate chain that fails OpenSSL\'s check', () => {
  const servers: https.Server[] = [];
  afterEach(async () => {
    for (const s of servers.splice(0)) {
      s.closeAllConnections();
      await new Promise((r) => s.close(r));
    }
  });

  async function setup(guard: boolean) {
    const serverCert = await createCertificate({ commonName: 'localhost', days: 1, keyType: 'ec', dnsNames: ['localhost'] });
    const root = await createCertificate({ commonName: 'root', days: 1, ca: true, keyType: 'ec' });
    const intermediate = await createCertificate({ commonName: 'issuing CA', days: 1, ca: true, issuer: root, keyType: 'ec' });
    const otherRoot = await createCertificate({ commonName: 'other root', days: 1, ca: true, keyType: 'ec' });
    // Same name as the real intermediate, another key: its leaf presented with the real one fails on the signature.
    const impostor = await createCertificate({ commonName: 'issuing CA', days: 1, ca: true, issuer: otherRoot, keyType: 'ec' });
    const leaf = await createCertificate({ commonName: 'client', days: 1, issuer: impostor, keyType: 'ec' });
    // As the ingress: a certificate asked of everyone, nothing rejected; the answer comes a little later (a stage awaiting something).
    const srv = https.createServer({ cert: serverCert.certificatePem, key: serverCert.privateKeyPem, requestCert: true, rejectUnauthorized: false }, (req, res) => {
      setTimeout(() => res.end(`served ${(req.socket as import('node:tls').TLSSocket).authorizationError}`), 20);
    });
    captureClientHello(srv);
    if (guard) clearChainVerifyErrors(srv);
    const clientErrors: string[] = [];
    srv.on('clientError', (err: Error & { code?: string }, socket: net.Socket) => {
      clientErrors.push(err.code ?? err.message);
      socket.destroy();
    });
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
    servers.push(srv);
    const port = (srv.address() as net.AddressInfo).port;
    const get = (chain: SelfSigned[], key: string) =>
      new Promise<string>((resolve) => {
        https
          .get({ host: '127.0.0.1', port, path: '/', servername: 'localhost', ca: serverCert.certificatePem, cert: chain.map((c) => c.certificatePem).join(''), key, agent: false }, (res) => {
            let body = '';
            res.setEncoding('utf8');
            res.on('data', (d: string) => (body += d));
            res.on('end', () => resolve(body));
          })
          .on('error', (err: Error & { code?: string }) => resolve(`error ${err.code ?? err.message}`));
      });
    return { get, clientErrors, leaf, intermediate };
  }

  it('is served as any other request once the stale OpenSSL error is cleared', async () => {
    const { get, clientErrors, leaf, intermediate } = await setup(true);
    for (let i = 0; i < 3; i++) expect(await get([leaf, intermediate], leaf.privateKeyPem)).toBe('served CERT_SIGNATURE_FAILURE');
    expect(clientErrors).toEqual([]);
  });

  it('without the guard, the connection fails on the stale error (what this guards against)', async () => {
    const { get, clientErrors, leaf, intermediate } = await setup(false);
    expect(await get([leaf, intermediate], leaf.privateKeyPem)).not.toBe('served CERT_SIGNATURE_FAILURE');
    expect(clientErrors).toEqual(['ERR_SSL_EVP_LIB']);
  });
});
