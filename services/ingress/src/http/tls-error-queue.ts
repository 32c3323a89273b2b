import type tls from 'node:tls';
import type { TLSSocket } from 'node:tls';

/**
 * Keeps a client's rejected certificate chain from failing its connection later.
 *
 * The public HTTPS server asks every client for a certificate and does not reject a bad one
 * (`rejectUnauthorized: false`: the edge's `mutual_tls` judges it per request). When OpenSSL's
 * own check of the presented chain fails on a signature (a leaf presented with an intermediate
 * that did not sign it, `CERT_SIGNATURE_FAILURE`), the handshake still succeeds, but OpenSSL's
 * error is left on the thread's error queue. The next `SSL_read` that waits for data sees it
 * (`SSL_get_error` reads the queue first) and node:tls reports `ERR_SSL_EVP_LIB` on the socket:
 * the request being served got a 400 "not valid HTTP/1.1" from the `clientError` handler instead
 * of its answer (the mutual_tls 403, or a normal response on an edge without mutual_tls),
 * depending only on timing. `getPeerCertificate()` runs under node's `ClearErrorOnReturn`, which
 * empties the queue; it is called only for a connection whose chain failed the check.
 */
export function clearChainVerifyErrors(server: tls.Server): void {
  server.prependListener('secureConnection', (socket: TLSSocket) => {
    if (socket.authorizationError) {
      try {
        socket.getPeerCertificate();
      } catch {
        // Nothing to clear if the socket is gone.
      }
    }
  });
}
