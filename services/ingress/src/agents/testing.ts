import { createHash } from 'node:crypto';
import { once } from 'node:events';
import http from 'node:http';
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import { afterEach, beforeAll } from 'vitest';
import { createCertificate, createLogger } from '@warren/shared';
import { AgentClient } from '../../../agent/src/client.js';
import { AgentServer, type AgentIdentity, type AgentServerOptions } from './server.js';

/**
 * Fixtures for agent-link tests (server.test.ts, test/compat/ngrok-sdk.compat.test.ts). Pure
 * network on 127.0.0.1, port 0 everywhere; nothing runs on import.
 */

export interface TestPki {
  caPem: string;
  certPem: string;
  keyPem: string;
}

/** A CA and a leaf it signs for localhost / 127.0.0.1 (EC keys: fast handshakes). */
export async function createTestPki(): Promise<TestPki> {
  const ca = await createCertificate({ commonName: 'Warren test CA', days: 1, ca: true, keyType: 'ec' });
  const leaf = await createCertificate({ commonName: 'localhost', days: 1, issuer: ca, dnsNames: ['localhost'], ipAddresses: ['127.0.0.1'], keyType: 'ec' });
  return { caPem: ca.certificatePem, certPem: leaf.certificatePem, keyPem: leaf.privateKeyPem };
}

export const sha256Hex = (s: string | Buffer) => createHash('sha256').update(s).digest('hex');

/** An `authenticate` backed by a map of sha256(token) → identity, like the applied config. */
export function tokenAuthenticator(entries: Array<{ token: string; identity: AgentIdentity }>): (token: string) => AgentIdentity | null {
  const byHash = new Map(entries.map((e) => [sha256Hex(e.token), e.identity]));
  return (token) => byHash.get(sha256Hex(token)) ?? null;
}

export interface Upstream {
  port: number;
  url: string;
  /** TCP connections the upstream has accepted. */
  connections(): number;
  close(): Promise<void>;
}

/**
 * A local HTTP service for the agent to forward to:
 * - `GET /hello…` → `hello <path>` (+ `x-host`);
 * - `POST /sha` → sha256 of the body;
 * - `GET /bytes?n=N` → N bytes (pattern), `x-sha256` header;
 * - `GET /stream?chunks=N` → N chunks 20 ms apart;
 * - `POST /echo` → the body back.
 */
export async function startUpstream(): Promise<Upstream> {
  let conns = 0;
  const server = http.createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://x');
    if (url.pathname === '/sha') {
      const h = createHash('sha256');
      let n = 0;
      req.on('data', (c: Buffer) => {
        h.update(c);
        n += c.length;
      });
      req.on('end', () => res.end(JSON.stringify({ sha256: h.digest('hex'), bytes: n })));
      return;
    }
    if (url.pathname === '/echo') {
      req.pipe(res);
      return;
    }
    if (url.pathname === '/bytes') {
      const n = Number(url.searchParams.get('n') ?? '0');
      const body = Buffer.alloc(n);
      for (let i = 0; i < n; i++) body[i] = (i * 31 + 7) & 0xff;
      res.setHeader('x-sha256', sha256Hex(body));
      res.end(body);
      return;
    }
    if (url.pathname === '/stream') {
      const chunks = Number(url.searchParams.get('chunks') ?? '3');
      res.writeHead(200, { 'content-type': 'text/plain' });
      let i = 0;
      const tick = () => {
        if (i === chunks) return res.end();
        res.write(`chunk ${i++}\n`);
        setTimeout(tick, 20);
      };
      tick();
      return;
    }
    req.resume();
    res.setHeader('x-host', req.headers.host ?? '');
    res.end(`hello ${url.pathname}`);
  });
  server.on('connection', () => conns++);
  server.keepAliveTimeout = 30_000;
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const port = (server.address() as net.AddressInfo).port;
  return {
    port,
    url: `http://127.0.0.1:${port}`,
    connections: () => conns,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

export interface SimpleResponse {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

/** One HTTP/1.1 request over an already-open stream (or through an agent). */
export function httpRequest(
  via: { stream: Duplex } | { agent: http.Agent },
  opts: { method?: string; path?: string; host?: string; body?: Buffer | string; headers?: http.OutgoingHttpHeaders } = {},
): Promise<SimpleResponse> {
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        method: opts.method ?? 'GET',
        path: opts.path ?? '/',
        headers: { host: opts.host ?? 'app.test', ...opts.headers },
        ...('stream' in via ? { createConnection: () => via.stream as net.Socket } : { agent: via.agent }),
      },
      (res) => {
        const parts: Buffer[] = [];
        res.on('data', (c: Buffer) => parts.push(c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(parts) }));
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end(opts.body);
  });
}

/**
 * The set-up agent-link tests share: a test PKI (made in `beforeAll`), an AgentServer on port 0
 * authenticating `tokens` (options overridable per test), our AgentClient with fast backoff, and
 * clean-ups run after each test (newest first). Call it at the top level of a test file.
 */
export function agentServerHarness(o: { nodeId: string; tokens: Array<{ token: string; identity: AgentIdentity }> }) {
  let pki: TestPki | undefined;
  const cleanups: Array<() => unknown> = [];
  beforeAll(async () => {
    pki = await createTestPki();
  });
  afterEach(async () => {
    while (cleanups.length) await cleanups.pop()!();
  });
  const h = {
    cleanups,
    get pki(): TestPki {
      if (!pki) throw new Error('agentServerHarness: the PKI is made in beforeAll');
      return pki;
    },
    async startServer(overrides: Partial<AgentServerOptions> = {}) {
      const server = new AgentServer({
        nodeId: o.nodeId,
        tls: { cert: h.pki.certPem, key: h.pki.keyPem },
        authenticate: tokenAuthenticator(o.tokens),
        log: createLogger('test', 'silent'),
        ...overrides,
      });
      const port = await server.listen(0, '127.0.0.1');
      cleanups.push(() => server.close());
      return { server, port };
    },
    /** Our agent (not connected yet), authenticating with `authtoken` (default: the first token). */
    startClient(port: number, authtoken = o.tokens[0]!.token, overrides: Partial<ConstructorParameters<typeof AgentClient>[0]> = {}) {
      const client = new AgentClient({ serverAddr: `localhost:${port}`, authtoken, ca: h.pki.caPem, backoff: { initialMs: 20, maxMs: 200 }, ...overrides });
      cleanups.push(() => client.close());
      return client;
    },
    /** The TLS connection a hand-made agent speaks muxado on. */
    async tlsTo(port: number): Promise<tls.TLSSocket> {
      const sock = tls.connect({ host: '127.0.0.1', port, ca: h.pki.caPem });
      await once(sock, 'secureConnect');
      cleanups.push(() => sock.destroy());
      return sock;
    },
  };
  return h;
}
