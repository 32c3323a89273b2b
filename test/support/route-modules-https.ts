import https from 'node:https';
import type http from 'node:http';
import type { TLSSocket } from 'node:tls';

/**
 * An HTTPS request to an ingress node for the route-module end-to-end tests
 * (test/e2e/route-modules-*.e2e.test.ts): SNI and `Host` are the edge's hostname, the ingress's
 * local CA is trusted, and the hostname check is skipped (the policy cluster's local certificate
 * does not name the test hostnames; these tests are about what the ingress does with the request,
 * not about its certificate). A client certificate (with its chain) may be presented.
 */

export interface HttpsAnswer {
  status: number;
  headers: http.IncomingHttpHeaders;
  raw: Buffer;
  body: string;
  json: () => any;
  /** The negotiated TLS version. */
  protocol: string | null;
  /** Whether the TLS session was resumed (`session` given). */
  reused: boolean;
  /** The session the server issued (a ticket), to resume with (see `wantSession`). */
  session: Buffer | undefined;
}

export interface HttpsRequestOptions {
  port: number;
  /** SNI and Host. */
  host: string;
  path: string;
  /** PEM of the CA that signed the ingress certificate. */
  ca: string;
  method?: string;
  headers?: Record<string, string>;
  body?: string | Buffer;
  /** Client certificate PEM: the leaf, optionally followed by the intermediates to present. */
  cert?: string;
  key?: string;
  /** Default 10 s. */
  timeoutMs?: number;
  /** A session to resume (an earlier answer's `session`). */
  session?: Buffer;
  /** Wait for the server's session ticket (TLS 1.3 sends it after the handshake) so the answer's `session` can resume. */
  wantSession?: boolean;
  maxVersion?: 'TLSv1.2' | 'TLSv1.3';
}

export function httpsRequest(o: HttpsRequestOptions): Promise<HttpsAnswer> {
  return new Promise((resolve, reject) => {
    const req = https.request(
      {
        host: '127.0.0.1',
        port: o.port,
        path: o.path,
        method: o.method ?? (o.body === undefined ? 'GET' : 'POST'),
        servername: o.host,
        ca: o.ca,
        checkServerIdentity: () => undefined,
        cert: o.cert,
        key: o.key,
        ...(o.session ? { session: o.session } : {}),
        ...(o.maxVersion ? { maxVersion: o.maxVersion } : {}),
        agent: false,
        headers: { host: o.host, ...o.headers },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        const socket = res.socket as TLSSocket;
        const protocol = socket.getProtocol?.() ?? null;
        const reused = socket.isSessionReused?.() ?? false;
        res.on('end', () => {
          const raw = Buffer.concat(chunks);
          const answer = () => resolve({ status: res.statusCode ?? 0, headers: res.headers, raw, body: raw.toString('utf8'), json: () => JSON.parse(raw.toString('utf8')), protocol, reused, session });
          if (!o.wantSession || session || protocol !== 'TLSv1.3') answer();
          else setTimeout(answer, 50);
        });
        res.on('error', reject);
      },
    );
    let session: Buffer | undefined;
    req.on('socket', (sock) => sock.on('session', (x: Buffer) => (session = x)));
    req.setTimeout(o.timeoutMs ?? 10_000, () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end(o.body);
  });
}
