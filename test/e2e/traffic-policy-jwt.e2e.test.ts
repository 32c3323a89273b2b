import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { exportJWK, generateKeyPair, SignJWT, type JWK } from 'jose';
import { freshDatabase } from '../support/databases.js';
import { startControlPlane, type ControlPlaneProcess } from '../support/processes.js';
import { callApi, cleanupTempDirs, startAgentProcess, startIngress, tempDir, waitFor, type AgentProcess, type IngressProcess } from '../support/cluster.js';
import { createDb, createPool } from '../../services/control-plane/src/db/pool.js';
import { migrate } from '../../services/control-plane/src/db/migrate.js';
import { createAccountWithKey } from '../../services/control-plane/src/modules/accounts/accounts.service.js';
import { ensureLocalTls } from '../../services/ingress/src/tls.js';

/**
 * The traffic-policy `jwt-validation` action on live traffic, through real processes: a control
 * plane, an ingress, our agent, an upstream that echoes what reached it, and a JWK set server
 * over HTTPS on 127.0.0.1 (its CA given to the ingress through NODE_EXTRA_CA_CERTS; both the
 * control plane and the ingress run with WARREN_JWKS_ALLOW_PRIVATE=1, as a loopback JKU needs).
 * Keys and tokens are made with jose here. Every policy is saved through the REST API.
 */

const HOST = 'jwt.e2e.test';
const ISS = 'https://issuer.e2e.test/';
const AUD = 'urn:warren:e2e';
let db: Awaited<ReturnType<typeof freshDatabase>>;
let cp: ControlPlaneProcess;
let ing: IngressProcess;
let agent: AgentProcess;
let apiKey: string;
let upstream: http.Server;
let jwks: https.Server;
let jwksPort: number;
let jwksHits = 0;
let hang: net.Server;
let hangPort: number;
let closedPort: number;
let edgeId: string;
let backendId: string;

type Pair = Awaited<ReturnType<typeof generateKeyPair>>;
let rs: Pair;
let es: Pair;
let other: Pair;
let served: JWK[] = [];

const api = (method: string, p: string, body?: unknown) => callApi(cp.baseUrl, apiKey, method, p, body);

interface Res {
  status: number;
  headers: http.IncomingHttpHeaders;
  raw: Buffer;
  json: () => any;
}
function request(p: string, headers: Record<string, string> = {}): Promise<Res> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: ing.http, path: p, agent: false, headers: { host: HOST, ...headers } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const raw = Buffer.concat(chunks);
        resolve({ status: res.statusCode ?? 0, headers: res.headers, raw, json: () => JSON.parse(raw.toString()) });
      });
    });
    req.setTimeout(15_000, () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end();
  });
}
const bearer = (t: string) => ({ authorization: `Bearer ${t}` });

async function sign(o: { key?: Pair; alg?: string; kid?: string; iss?: string; aud?: string; exp?: number | string; sub?: string } = {}): Promise<string> {
  return new SignJWT({ sub: o.sub ?? 'alice', scope: 'read' })
    .setProtectedHeader({ alg: o.alg ?? 'RS256', kid: o.kid ?? 'rs-1' })
    .setIssuer(o.iss ?? ISS)
    .setAudience(o.aud ?? AUD)
    .setIssuedAt()
    .setExpirationTime(o.exp ?? '5m')
    .sign((o.key ?? rs).privateKey);
}

const jwtConfig = (jku: string, algorithms = ['RS256']) => ({
  issuer: { allow_list: [{ value: ISS }] },
  audience: { allow_list: [{ value: AUD }] },
  http: { tokens: [{ type: 'jwt', method: 'header', name: 'Authorization', prefix: 'Bearer ' }] },
  jws: { allowed_algorithms: algorithms, keys: { sources: { additional_jkus: [jku] } } },
});

/** Adds a route; `match` must not be a prefix of another route's. */
async function route(match: string, policy: unknown): Promise<string> {
  const r = await api('POST', `/edges/https/${edgeId}/routes`, { match_type: 'path_prefix', match, backend: { enabled: true, backend_id: backendId }, traffic_policy: { value: typeof policy === 'string' ? policy : JSON.stringify(policy) } });
  if (r.status !== 201) throw new Error(`route ${match}: ${r.status} ${JSON.stringify(r.body)}`);
  await waitFor(`the ingress applies ${match}`, async () => (await request(`${match}/probe`)).headers['warren-error-code'] !== 'ERR_WARREN_7001');
  return r.body.id;
}

async function refused(policy: unknown): Promise<string> {
  const r = await api('POST', `/edges/https/${edgeId}/routes`, { match_type: 'path_prefix', match: `/bad-${randomBytes(3).toString('hex')}`, backend: { enabled: true, backend_id: backendId }, traffic_policy: { value: JSON.stringify(policy) } });
  expect(r.status, JSON.stringify(r.body)).toBe(400);
  expect(r.body.error_code).toBe('ERR_WARREN_6900');
  return r.body.msg as string;
}

const listen = (s: net.Server) => new Promise<number>((r) => s.listen(0, '127.0.0.1', () => r((s.address() as net.AddressInfo).port)));

beforeAll(async () => {
  rs = await generateKeyPair('RS256', { extractable: true });
  es = await generateKeyPair('ES256', { extractable: true });
  other = await generateKeyPair('RS256', { extractable: true });
  served = [
    { ...(await exportJWK(rs.publicKey)), kid: 'rs-1', use: 'sig' },
    { ...(await exportJWK(es.publicKey)), kid: 'es-1', use: 'sig' },
  ];

  db = await freshDatabase();
  const pool = createPool(db.url, 2);
  await migrate(pool);
  apiKey = (await createAccountWithKey(createDb(pool), 'jwt-e2e')).token;
  await pool.end();
  const tls = await ensureLocalTls(tempDir('warren-jwt-tls-'));

  jwks = https.createServer({ cert: tls.cert, key: tls.key }, (req, res) => {
    jwksHits++;
    res.writeHead(200, { 'content-type': 'application/jwk-set+json' });
    res.end(JSON.stringify({ keys: served }));
  });
  jwksPort = await listen(jwks);
  // Accepts connections and never answers.
  hang = net.createServer(() => {});
  hangPort = await listen(hang);
  const closed = net.createServer();
  closedPort = await listen(closed);
  await new Promise((r) => closed.close(r));

  const nodeToken = randomBytes(16).toString('hex');
  cp = await startControlPlane({ databaseUrl: db.url, env: { WARREN_NODE_TOKEN: nodeToken, WARREN_JWKS_ALLOW_PRIVATE: '1' } });
  ing = await startIngress({
    nodeId: 'jwt-a',
    controlPlane: [`127.0.0.1:${cp.grpcPort}`],
    nodeToken,
    env: { TLS_CERT_FILE: tls.caFile.replace(/ca\.pem$/, 'cert.pem'), TLS_KEY_FILE: tls.caFile.replace(/ca\.pem$/, 'key.pem'), NODE_EXTRA_CA_CERTS: tls.caFile, WARREN_JWKS_ALLOW_PRIVATE: '1' },
  });

  upstream = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ url: req.url, headers: req.headers }));
    });
  });
  const upPort = await listen(upstream);

  const cred = await api('POST', '/credentials', {});
  backendId = (await api('POST', '/backends/tunnel_group', { labels: { app: 'jwt' } })).body.id;
  edgeId = (await api('POST', '/edges/https', { hostports: [`${HOST}:443`] })).body.id;
  agent = startAgentProcess(['http', String(upPort), '--label', 'app=jwt', '--authtoken', cred.body.token, '--server', `localhost:${ing.agent}`, '--ca', tls.caFile]);
  await agent.waitForOutput('online');
}, 90_000);

afterAll(async () => {
  await Promise.allSettled([agent?.stop({ timeoutMs: 10_000 }), ing?.stop({ timeoutMs: 10_000 }), cp?.stop({ timeoutMs: 10_000 })]);
  upstream?.close();
  jwks?.closeAllConnections?.();
  jwks?.close();
  hang?.close();
  await db?.drop();
  cleanupTempDirs();
}, 60_000);

describe('jwt-validation on live traffic', () => {
  it('lets a valid Bearer token through, shows its claims to later rules, and refuses bad tokens with 401', async () => {
    await route('/api', {
      inbound: [
        {
          actions: [
            { type: 'jwt-validation', config: jwtConfig(`https://127.0.0.1:${jwksPort}/jwks`) },
            { type: 'add-headers', config: { headers: { 'x-jwt-sub': "${actions.ngrok.jwt_validation.tokens[0].payload['sub']}" } } },
          ],
        },
        { expressions: ["actions.ngrok.jwt_validation.tokens[0].payload['sub'] == 'mallory'"], actions: [{ type: 'deny', config: { status_code: 403 } }] },
      ],
    });
    const tok = await sign();
    const ok = await request('/api/items', bearer(tok));
    expect(ok.status, ok.raw.toString()).toBe(200);
    expect(ok.json().headers['x-jwt-sub']).toBe('alice');
    // As with ngrok, the token reaches the upstream (a remove-headers action could drop it).
    expect(ok.json().headers.authorization).toBe(`Bearer ${tok}`);
    // A later rule decides on the claims.
    expect((await request('/api/items', bearer(await sign({ sub: 'mallory' })))).status).toBe(403);

    const missing = await request('/api/items');
    expect([missing.status, missing.headers['www-authenticate'], missing.headers['warren-error-code']]).toEqual([401, 'Bearer', 'ERR_WARREN_7122']);
    expect(missing.json()).toMatchObject({ error_code: 'ERR_WARREN_7122', status_code: 401 });
    expect((await request('/api/items', { authorization: tok })).status).toBe(401); // no "Bearer " prefix

    const bad: [string, string][] = [
      ['expired', await sign({ exp: Math.floor(Date.now() / 1000) - 300 })],
      ['wrong issuer', await sign({ iss: 'https://evil.e2e.test/' })],
      ['wrong audience', await sign({ aud: 'urn:someone-else' })],
      ['alg not allowed (ES256 key is served, only RS256 allowed)', await sign({ key: es, alg: 'ES256', kid: 'es-1' })],
      ['unknown kid', await sign({ key: other, kid: 'rotated-away' })],
      ['signed by another key', await sign({ key: other })],
      ['tampered', `${tok.slice(0, tok.lastIndexOf('.'))}.${Buffer.from('x'.repeat(256)).toString('base64url')}`],
    ];
    for (const [what, t] of bad) {
      const r = await request('/api/items', bearer(t));
      expect([what, r.status, r.headers['www-authenticate'], r.headers['warren-error-code']]).toEqual([what, 401, 'Bearer error="invalid_token"', 'ERR_WARREN_7122']);
    }
    // The set was fetched once for all of these (the unknown kid's refetch waits for the cooldown).
    expect(jwksHits).toBe(1);
  });

  it('fails closed with 503 while the JWK set cannot be fetched, without hanging', async () => {
    await route('/down', { inbound: [{ actions: [{ type: 'jwt-validation', config: jwtConfig(`https://127.0.0.1:${closedPort}/jwks`) }] }] });
    const tok = await sign();
    for (let i = 0; i < 3; i++) {
      const r = await request('/down/x', bearer(tok));
      expect([r.status, r.headers['warren-error-code'], r.headers['retry-after']]).toEqual([503, 'ERR_WARREN_7123', '30']);
    }
    await route('/slow', { inbound: [{ actions: [{ type: 'jwt-validation', config: jwtConfig(`https://127.0.0.1:${hangPort}/jwks`) }] }] });
    const t = performance.now();
    const r = await request('/slow/x', bearer(tok));
    expect(r.status).toBe(503);
    expect(performance.now() - t).toBeLessThan(7_000);
    // Within the failure back-off, the next request is answered at once.
    const t2 = performance.now();
    expect((await request('/slow/x', bearer(tok))).status).toBe(503);
    expect(performance.now() - t2).toBeLessThan(1_000);
  }, 40_000);

  it('refuses bad configurations with a 400 naming the field', async () => {
    const jku = `https://127.0.0.1:${jwksPort}/jwks`;
    const one = (config: unknown) => ({ inbound: [{ actions: [{ type: 'jwt-validation', config }] }] });
    const P = 'traffic_policy.value: inbound[0].actions[0].config';
    const c = () => jwtConfig(jku) as any;
    expect(await refused(one({ ...c(), issuer: { allow_list: [] } }))).toBe(`${P}.issuer.allow_list: must have at least one issuer`);
    expect(await refused(one({ ...c(), audience: { allow_list: [{ value: 42 }] } }))).toBe(`${P}.audience.allow_list[0].value: must be a string, got number`);
    expect(await refused(one({ ...c(), jws: { allowed_algorithms: ['HS256'], keys: { sources: { additional_jkus: [jku] } } } }))).toContain(`${P}.jws.allowed_algorithms[0]: HS256 is not supported`);
    expect(await refused(one({ ...c(), jws: { allowed_algorithms: ['none'], keys: { sources: { additional_jkus: [jku] } } } }))).toContain(`${P}.jws.allowed_algorithms[0]: "none" is not allowed`);
    expect(await refused(one({ ...c(), jws: { allowed_algorithms: ['RS256'], keys: { sources: { additional_jkus: [`http://127.0.0.1:${jwksPort}/jwks`] } } } }))).toContain(`${P}.jws.keys.sources.additional_jkus[0]: must be an https URL`);
    expect(await refused(one({ ...c(), jws: { allowed_algorithms: ['RS256'], keys: { sources: { inline_keys: [{ kty: 'oct', k: 'c2VjcmV0' }] } } } }))).toContain(`${P}.jws.keys.sources.inline_keys[0].k: symmetric (oct) keys are not supported`);
    expect(await refused(one({ ...c(), lifetime: { max: '1h' } }))).toContain(`${P}.lifetime: unknown field "lifetime"`);
    expect(await refused({ outbound: [{ actions: [{ type: 'jwt-validation', config: c() }] }] })).toContain('outbound[0].actions[0].type: jwt-validation can only be used in inbound rules');
  });
});
