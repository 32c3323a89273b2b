import https from 'node:https';
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { exportJWK, generateKeyPair, SignJWT, type JWK } from 'jose';
import { startPolicyCluster, type PolicyCluster } from '../support/policy-cluster.js';

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
let cluster: PolicyCluster;
let jwks: https.Server;
let jwksPort: number;
let jwksHits = 0;
let hang: net.Server;
let hangPort: number;
let closedPort: number;

type Pair = Awaited<ReturnType<typeof generateKeyPair>>;
let rs: Pair;
let es: Pair;
let other: Pair;
let served: JWK[] = [];

/** A GET to the ingress with `headers`; the JWK-set cases take longer than the usual 10 s allows. */
const request = (p: string, headers: Record<string, string> = {}) => cluster.request(p, { headers, timeoutMs: 15_000 });
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
const route = (match: string, policy: unknown): Promise<string> => cluster.policyRoute(match, policy);

async function refused(policy: unknown): Promise<string> {
  const r = await cluster.tryPolicy(policy);
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

  cluster = await startPolicyCluster({
    name: 'jwt',
    host: HOST,
    controlPlaneEnv: { WARREN_JWKS_ALLOW_PRIVATE: '1' },
    ingressEnv: (_nodeId, tls) => ({ NODE_EXTRA_CA_CERTS: tls.caFile, WARREN_JWKS_ALLOW_PRIVATE: '1' }),
  });

  // Served with the cluster's certificate, which the ingress trusts through NODE_EXTRA_CA_CERTS.
  jwks = https.createServer({ cert: cluster.tls.cert, key: cluster.tls.key }, (req, res) => {
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
}, 90_000);

afterAll(async () => {
  await cluster?.stop();
  jwks?.closeAllConnections?.();
  jwks?.close();
  hang?.close();
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
