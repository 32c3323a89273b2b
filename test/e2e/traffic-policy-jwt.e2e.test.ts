import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { exportJWK, generateKeyPair, SignJWT, type JWK } from 'jose';
import { startPolicyCluster, type PolicyCluster } from '../support/policy-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

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

/** The upstream: answers `{ url, method, headers, body }` (the body as it arrived, base64). */
const echoWithBody: http.RequestListener = (req, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ url: req.url, method: req.method, headers: req.headers, body: Buffer.concat(chunks).toString('base64') }));
  });
};

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
    upstream: echoWithBody,
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
}, CLUSTER_HOOK_MS);

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

describe('jwt-validation with tokens in the body, on live traffic', () => {
  const bodyPolicy = (jku: string) => ({
    inbound: [
      {
        actions: [
          { type: 'jwt-validation', config: { ...jwtConfig(jku), http: { tokens: [{ type: 'it+jwt', method: 'body', name: '_id_token', prefix: 'Bearer ' }] } } },
          { type: 'add-headers', config: { headers: { 'x-jwt-where': '${actions.ngrok.jwt_validation.tokens[0].location}:${actions.ngrok.jwt_validation.tokens[0].location_property}', 'x-jwt-sub': "${actions.ngrok.jwt_validation.tokens[0].payload['sub']}" } } },
        ],
      },
    ],
  });
  const post = (p: string, body: string, contentType: string, method = 'POST') => cluster.request(p, { method, body, headers: { 'content-type': contentType }, timeoutMs: 15_000 });

  it('accepts a token in a form field or a JSON member, and the upstream receives the body unchanged', async () => {
    await route('/bodytok', bodyPolicy(`https://127.0.0.1:${jwksPort}/jwks`));
    const tok = await sign({ sub: 'carol' });
    const form = `state=a%26b&_id_token=Bearer+${tok}&note=${encodeURIComponent('é & ü')}`;
    const json = JSON.stringify({ data: { _id_token: 'nested, ignored', list: [1, 2, 3] }, _ID_TOKEN: `Bearer ${tok}`, text: 'ü'.repeat(1000) });
    for (const [body, type] of [
      [form, 'application/x-www-form-urlencoded'],
      [json, 'application/json; charset=utf-8'],
    ] as const) {
      for (const method of ['POST', 'PUT', 'PATCH']) {
        const r = await post('/bodytok/submit', body, type, method);
        expect([type, method, r.status], r.body).toEqual([type, method, 200]);
        const seen = r.json();
        expect(Buffer.from(seen.body, 'base64').toString('utf8')).toBe(body);
        expect([seen.method, seen.headers['content-length'], seen.headers['x-jwt-where'], seen.headers['x-jwt-sub']]).toEqual([method, String(Buffer.byteLength(body)), 'body:_id_token', 'carol']);
      }
    }
  });

  it('refuses a missing, unreadable or invalid body token with 401', async () => {
    const tok = await sign();
    const cases: [string, Promise<Awaited<ReturnType<typeof post>>>][] = [
      ['no field', post('/bodytok/x', 'a=1', 'application/x-www-form-urlencoded')],
      ['a GET', cluster.request(`/bodytok/x?_id_token=${tok}`, { timeoutMs: 15_000 })],
      ['text/plain', post('/bodytok/x', `_id_token=Bearer+${tok}`, 'text/plain')],
      ['invalid JSON', post('/bodytok/x', `{"_id_token":"Bearer ${tok}"`, 'application/json')],
      ['in a header only', cluster.request('/bodytok/x', { method: 'POST', body: 'a=1', headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: `Bearer ${tok}` }, timeoutMs: 15_000 })],
      ['expired', post('/bodytok/x', `_id_token=Bearer+${await sign({ exp: Math.floor(Date.now() / 1000) - 300 })}`, 'application/x-www-form-urlencoded')],
      // A valid token, in a body the upstream would decode differently (UTF-7 can hide another
      // _id_token member from a UTF-8 reader; gzip, another body altogether): no body token.
      ['UTF-7', post('/bodytok/x', `{"_id_token":"Bearer ${tok}","x":"+ACI-,+ACI-_id_token+ACI-:+ACI-Bearer evil+ACI-,+ACI-y+ACI-:+ACI-"}`, 'application/json; charset=utf-7')],
      ['gzip', cluster.request('/bodytok/x', { method: 'POST', body: `_id_token=Bearer+${tok}`, headers: { 'content-type': 'application/x-www-form-urlencoded', 'content-encoding': 'gzip' }, timeoutMs: 15_000 })],
      // A malformed escape in the member: a 401 (it used to fail the route: 502 and an error logged).
      ['a malformed escape', post('/bodytok/x', '{"_id_token":"Bearer \\q"}', 'application/json')],
      ['a short \\u escape', post('/bodytok/x', '{"_id_token":"\\u12"}', 'application/json')],
    ];
    for (const [what, p] of cases) {
      const r = await p;
      expect([what, r.status, r.headers['warren-error-code']]).toEqual([what, 401, 'ERR_WARREN_7122']);
    }
    // Two Content-Type headers (Node reads the first, the upstream is sent both): no body token.
    const raw = await new Promise<string>((resolve, reject) => {
      const body = `{"_id_token":"Bearer ${tok}"}`;
      const sock = net.connect(cluster.a.http, '127.0.0.1', () =>
        sock.write(`POST /bodytok/x HTTP/1.1\r\nHost: ${cluster.host}\r\nContent-Type: application/json\r\nContent-Type: application/json; charset=utf-7\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`),
      );
      const chunks: Buffer[] = [];
      sock.on('data', (c: Buffer) => chunks.push(c));
      sock.on('error', reject);
      sock.on('close', () => resolve(Buffer.concat(chunks).toString('latin1')));
    });
    expect(raw).toMatch(/^HTTP\/1\.1 401 /);
  });

  it('refuses bad token methods and duplicates with a 400 naming the field', async () => {
    const P = 'traffic_policy.value: inbound[0].actions[0].config.http.tokens';
    const one = (tokens: unknown[]) => ({ inbound: [{ actions: [{ type: 'jwt-validation', config: { ...jwtConfig(`https://127.0.0.1:${jwksPort}/jwks`), http: { tokens } } }] }] });
    expect(await refused(one([{ type: 'jwt', method: 'query', name: 'token' }]))).toBe(`${P}[0].method: must be "header" or "body", got "query"`);
    expect(await refused(one([{ type: 'jwt', method: 'body', name: 'tok' }, { type: 'jwt', method: 'body', name: 'TOK' }]))).toBe(`${P}[1].name: body field "TOK" is already read by inbound[0].actions[0].config.http.tokens[0] (names are not case-sensitive)`);
    expect(await refused(one([{ type: 'jwt', method: 'body', name: 'id token' }]))).toContain(`${P}[0].name: "id token" is not a valid body field name`);
  });
});

describe('jwt-validation when the JWK set server goes down', () => {
  it('goes on with the cached set', async () => {
    let hits = 0;
    const down = https.createServer({ cert: cluster.tls.cert, key: cluster.tls.key }, (_req, res) => {
      hits++;
      res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'max-age=3600' });
      res.end(JSON.stringify({ keys: served }));
    });
    const port = await listen(down);
    await route('/outage', { inbound: [{ actions: [{ type: 'jwt-validation', config: jwtConfig(`https://127.0.0.1:${port}/jwks`) }] }] });
    expect((await request('/outage/a', bearer(await sign()))).status).toBe(200);
    expect(hits).toBe(1);
    down.closeAllConnections();
    await new Promise((r) => down.close(r));
    for (let i = 0; i < 5; i++) {
      const r = await request('/outage/a', bearer(await sign({ sub: `user-${i}` })));
      expect([i, r.status]).toEqual([i, 200]);
    }
    // A token with an unknown key is still a plain 401 (no refetch within the cooldown), not a 503.
    const unknown = await request('/outage/a', bearer(await sign({ key: other, kid: 'rotated-in' })));
    expect([unknown.status, unknown.headers['warren-error-code']]).toEqual([401, 'ERR_WARREN_7122']);
  });
});
