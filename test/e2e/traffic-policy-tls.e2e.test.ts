import http from 'node:http';
import https from 'node:https';
import path from 'node:path';
import { randomBytes, X509Certificate } from 'node:crypto';
import type { TLSSocket } from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCertificate, type SelfSigned } from '@warren/shared';
import { freshDatabase } from '../support/databases.js';
import { startControlPlane, type ControlPlaneProcess } from '../support/processes.js';
import { callApi, callApiExpecting, cleanupTempDirs, startAgentProcess, startIngress, tempDir, waitFor, type AgentProcess, type IngressProcess } from '../support/cluster.js';
import { createDb, createPool } from '../../services/control-plane/src/db/pool.js';
import { migrate } from '../../services/control-plane/src/db/migrate.js';
import { createAccountWithKey } from '../../services/control-plane/src/modules/accounts/accounts.service.js';
import { ensureLocalTls } from '../../services/ingress/src/tls.js';
import { clientJa4 } from '../support/client-hello.js';
import { CLUSTER_HOOK_MS, WORK_MS } from '../support/timeouts.js';

/**
 * The traffic policy's `conn.tls` variables on live traffic, through real processes: a control
 * plane, two ingress nodes (the agent is connected to A; B reaches it over a hop, and evaluates
 * the policy itself, where TLS ends), our agent in front of an upstream that echoes the request
 * headers, and client certificates made on the fly. Everything is configured through the REST API.
 */

const MTLS_HOST = 'tp-mtls.e2e.test';
const OPEN_HOST = 'tp-open.e2e.test';

let db: Awaited<ReturnType<typeof freshDatabase>>;
let cp: ControlPlaneProcess;
let nodes: IngressProcess[] = [];
let agent: AgentProcess;
let apiKey: string;
let ingressCa: string;
let upstream: http.Server;
let backendId: string;
let ca: SelfSigned;
let allowed: SelfSigned;
let other: SelfSigned;
let foreignAllowed: SelfSigned;
let openEdgeId: string;

const api = (method: string, p: string, body?: unknown) => callApi(cp.baseUrl, apiKey, method, p, body);

const apiOk = (method: string, p: string, body: unknown, status: number) => callApiExpecting(cp.baseUrl, apiKey, status, method, p, body);

interface Res {
  status: number;
  headers: http.IncomingHttpHeaders;
  text: string;
  /** The headers the upstream received (when the request got through). */
  seen?: Record<string, string>;
  protocol?: string | null;
}

function collect(res: http.IncomingMessage, resolve: (r: Res) => void, protocol?: string | null): void {
  const chunks: Buffer[] = [];
  res.on('data', (c: Buffer) => chunks.push(c));
  res.on('end', () => {
    const text = Buffer.concat(chunks).toString();
    let seen: Record<string, string> | undefined;
    if (res.headers['x-upstream'] === 'yes') seen = JSON.parse(text).headers;
    resolve({ status: res.statusCode ?? 0, headers: res.headers, text, seen, protocol });
  });
}

function httpGet(port: number, host: string, p: string): Promise<Res> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path: p, agent: false, headers: { host } }, (res) => collect(res, resolve));
    req.setTimeout(10_000, () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end();
  });
}

/** A GET over HTTPS with SNI and Host `host`, trusting the ingress CA, optionally with a client certificate. */
function httpsGet(port: number, host: string, p: string, o: { cert?: SelfSigned; maxVersion?: 'TLSv1.2' | 'TLSv1.3' } = {}): Promise<Res> {
  return new Promise((resolve, reject) => {
    const req = https.request(
      { host: '127.0.0.1', port, path: p, servername: host, ca: ingressCa, agent: false, headers: { host }, cert: o.cert?.certificatePem, key: o.cert?.privateKeyPem, maxVersion: o.maxVersion },
      (res) => collect(res, resolve, (res.socket as TLSSocket).getProtocol()),
    );
    req.setTimeout(10_000, () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end();
  });
}

/** The policy of both edges: plain HTTP is turned away, then anyone but `allowed` is denied, then the TLS details go upstream as headers. */
const POLICY = `
inbound:
  - name: https only
    expressions: ["conn.tls.version == ''"]
    actions:
      - type: custom-response
        config: { status_code: 426, body: "use https" }
  - name: only the allowed client
    expressions: ["conn.tls.client.subject.common_name != 'allowed'"]
    actions:
      - type: deny
        config: { status_code: 401 }
  - actions:
      - type: add-headers
        config:
          headers:
            x-tls-version: "\${conn.tls.version}"
            x-tls-sni: "\${conn.tls.sni}"
            x-tls-cipher: "\${conn.tls.cipher_suite}"
            x-client-subject: "\${conn.tls.client.subject}"
            x-client-issuer-cn: "\${conn.tls.client.issuer.common_name}"
            x-client-serial: "\${conn.tls.client.serial_number}"
            x-client-dns: "\${conn.tls.client.san.dns_names}"
            x-client-valid: "\${conn.tls.client.validity.not_after > time.now}"
            x-server-cn: "\${conn.tls.server.subject.common_name}"
            x-tls-ja4: "\${conn.tls.ja4_fingerprint}"
`;

async function edgeWithPolicy(host: string): Promise<string> {
  const id = (await apiOk('POST', '/edges/https', { hostports: [`${host}:443`] }, 201)).id;
  await apiOk('POST', `/edges/https/${id}/routes`, { match_type: 'path_prefix', match: '/', backend: { enabled: true, backend_id: backendId }, traffic_policy: { value: POLICY } }, 201);
  return id;
}

beforeAll(async () => {
  db = await freshDatabase();
  const pool = createPool(db.url, 2);
  await migrate(pool);
  apiKey = (await createAccountWithKey(createDb(pool), 'tp-tls-e2e')).token;
  await pool.end();
  const tlsDir = tempDir('warren-tp-tls-');
  const tls = await ensureLocalTls(tlsDir, [MTLS_HOST, OPEN_HOST]);
  ingressCa = tls.caPem!;
  const nodeToken = randomBytes(16).toString('hex');
  cp = await startControlPlane({ databaseUrl: db.url, env: { WARREN_NODE_TOKEN: nodeToken } });
  const env = { TLS_CERT_FILE: path.join(tlsDir, 'cert.pem'), TLS_KEY_FILE: path.join(tlsDir, 'key.pem') };
  nodes = await Promise.all(['tp-tls-a', 'tp-tls-b'].map((nodeId) => startIngress({ nodeId, controlPlane: [`127.0.0.1:${cp.grpcPort}`], nodeToken, env })));

  upstream = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json', 'x-upstream': 'yes' });
      res.end(JSON.stringify({ url: req.url, headers: req.headers }));
    });
  });
  const upPort = await new Promise<number>((r) => upstream.listen(0, '127.0.0.1', () => r((upstream.address() as { port: number }).port)));

  ca = await createCertificate({ commonName: 'e2e client CA', days: 1, ca: true, keyType: 'ec' });
  allowed = await createCertificate({ commonName: 'allowed', days: 1, issuer: ca, keyType: 'ec', dnsNames: ['allowed.client.test'] });
  other = await createCertificate({ commonName: 'someone-else', days: 1, issuer: ca, keyType: 'ec', dnsNames: ['other.client.test'] });
  const foreignCa = await createCertificate({ commonName: 'e2e foreign CA', days: 1, ca: true, keyType: 'ec' });
  foreignAllowed = await createCertificate({ commonName: 'allowed', days: 1, issuer: foreignCa, keyType: 'ec', dnsNames: ['allowed.client.test'] });

  const cred = await apiOk('POST', '/credentials', {}, 201);
  backendId = (await apiOk('POST', '/backends/tunnel_group', { labels: { app: 'tp-tls' } }, 201)).id;
  agent = startAgentProcess(['http', `http://127.0.0.1:${upPort}`, '--label', 'app=tp-tls', '--authtoken', cred.token, '--server', `localhost:${nodes[0]!.agent}`, '--ca', tls.caFile]);
  await agent.waitForOutput('online');

  // One edge with mutual_tls (the client certificate is verified before the policy runs) and
  // one without (the ingress asks for a certificate but checks nothing).
  const caId = (await apiOk('POST', '/certificate_authorities', { ca_pem: ca.certificatePem }, 201)).id;
  const mtls = await edgeWithPolicy(MTLS_HOST);
  await apiOk('PUT', `/edges/https/${mtls}/mutual_tls`, { certificate_authority_ids: [caId] }, 200);
  openEdgeId = await edgeWithPolicy(OPEN_HOST);
  for (const n of nodes) {
    await waitFor(`${n.nodeId} enforces mutual TLS on ${MTLS_HOST}`, async () => (await httpsGet(n.https, MTLS_HOST, '/probe')).headers['warren-error-code'] === 'ERR_WARREN_7104');
    await waitFor(`${n.nodeId} runs the policy on ${OPEN_HOST}`, async () => (await httpGet(n.http, OPEN_HOST, '/probe')).status === 426);
    await waitFor(`${n.nodeId} reaches the tunnel`, async () => (await httpsGet(n.https, MTLS_HOST, '/probe', { cert: allowed })).status === 200);
  }
}, CLUSTER_HOOK_MS + WORK_MS); // and six waits of up to 10 s for the nodes to apply the edges

afterAll(async () => {
  await Promise.allSettled([agent?.stop({ timeoutMs: 10_000 }), ...nodes.map((n) => n.stop({ timeoutMs: 10_000 })), cp?.stop({ timeoutMs: 10_000 })]);
  await new Promise((r) => (upstream ? upstream.close(r) : r(undefined)));
  await db?.drop();
  cleanupTempDirs();
}, 60_000);

describe('traffic policy conn.tls on an edge with mutual_tls', () => {
  it('lets the allowed client certificate through, with the TLS details the policy read', async () => {
    const serial = new X509Certificate(allowed.certificatePem).serialNumber.toLowerCase().replace(/^0+/, '');
    for (const n of nodes) {
      for (const version of ['TLSv1.2', 'TLSv1.3'] as const) {
        const r = await httpsGet(n.https, MTLS_HOST, `/ok/${version}`, { cert: allowed, maxVersion: version });
        expect(r.status, `${n.nodeId}: ${r.text}`).toBe(200);
        expect(r.protocol).toBe(version);
        expect(r.seen).toMatchObject({
          'x-tls-version': version.slice(4),
          'x-tls-sni': MTLS_HOST,
          'x-client-subject': 'CN=allowed',
          'x-client-issuer-cn': 'e2e client CA',
          'x-client-serial': serial,
          'x-client-dns': 'allowed.client.test',
          'x-client-valid': 'true',
          'x-server-cn': 'localhost',
        });
        expect(r.seen!['x-tls-cipher']).toMatch(version === 'TLSv1.3' ? /^TLS_(AES_\d+_GCM|CHACHA20_POLY1305)_SHA\d+$/ : /^TLS_ECDHE_ECDSA_WITH_/);
        // The JA4 of the ClientHello this client sends (read off one sent to a recorder): with
        // SNI, no ALPN, its top version.
        const ja4 = await clientJa4({ servername: MTLS_HOST, ca: ingressCa, cert: allowed.certificatePem, key: allowed.privateKeyPem, maxVersion: version });
        expect(ja4).toMatch(new RegExp(`^t${version.slice(4).replace('.', '')}d\\d{4}00_[0-9a-f]{12}_[0-9a-f]{12}$`));
        expect(r.seen!['x-tls-ja4'], n.nodeId).toBe(ja4);
      }
    }
  });

  it('denies another certificate from the same CA by the policy (401)', async () => {
    for (const n of nodes) {
      const r = await httpsGet(n.https, MTLS_HOST, '/other', { cert: other });
      expect([r.status, r.headers['warren-error-code'], r.headers['x-upstream']], r.text).toEqual([401, undefined, undefined]);
    }
  });

  it('refuses a client without a certificate before the policy runs (mutual_tls, 403)', async () => {
    for (const n of nodes) {
      const r = await httpsGet(n.https, MTLS_HOST, '/none');
      expect([r.status, r.headers['warren-error-code']], r.text).toEqual([403, 'ERR_WARREN_7104']);
      // A certificate named "allowed" from a CA the edge does not trust is refused there too.
      const f = await httpsGet(n.https, MTLS_HOST, '/foreign', { cert: foreignAllowed });
      expect([f.status, f.headers['warren-error-code']], f.text).toEqual([403, 'ERR_WARREN_7104']);
    }
  });
});

describe('traffic policy conn.tls on an edge without mutual_tls', () => {
  it('never trusts a client certificate it did not verify: conn.tls.client reads as absent', async () => {
    for (const n of nodes) {
      for (const cert of [foreignAllowed, allowed, undefined]) {
        const r = await httpsGet(n.https, OPEN_HOST, '/x', { cert });
        expect([r.status, r.headers['x-upstream']], `${n.nodeId} ${cert ? 'with' : 'without'} a certificate: ${r.text}`).toEqual([401, undefined]);
      }
    }
  });

  it("sees plain HTTP as conn.tls.version == ''", async () => {
    for (const n of nodes) {
      const r = await httpGet(n.http, OPEN_HOST, '/plain');
      expect([r.status, r.text]).toEqual([426, 'use https']);
    }
  });

  it('refuses a policy with a TLS variable ngrok does not have, naming the expression', async () => {
    for (const expr of ["conn.tls.client_cert.subject.cn != 'allowed'", "conn.tls.ja3_fingerprint == ''"]) {
      const r = await api('POST', `/edges/https/${openEdgeId}/routes`, {
        match_type: 'path_prefix',
        match: '/bad',
        backend: { enabled: true, backend_id: backendId },
        traffic_policy: { value: JSON.stringify({ inbound: [{ expressions: [expr], actions: [{ type: 'deny' }] }] }) },
      });
      expect(r.status, expr).toBe(400);
      expect(JSON.stringify(r.body)).toContain('inbound[0].expressions[0]');
    }
  });
});
