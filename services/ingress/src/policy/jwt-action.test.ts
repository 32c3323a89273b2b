import https from 'node:https';
import net from 'node:net';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { exportJWK, generateKeyPair, SignJWT, UnsecuredJWT, type JWK } from 'jose';
import { validateTrafficPolicy, type JwtValidationAction } from '@warren/shared';
import type { Outcome, RequestState, RouteStage } from '../pipeline/types.js';
import { ensureLocalTls } from '../tls.js';
import { trafficPolicyStage } from './index.js';
import { compileJwtValidation, JwksRegistry, runJwtValidation, type CompiledJwtValidation } from './jwt-action.js';
import { CONFIG, deps, EDGE, request, route } from './testing.js';

const ISS = 'https://issuer.example.com/';
const AUD = 'urn:example:api';

type Pair = Awaited<ReturnType<typeof generateKeyPair>>;
let rs: Pair;
let rs2: Pair;
let es: Pair;
let rsJwk: JWK;
let rs2Jwk: JWK;

const sign = (claims: Record<string, unknown> = {}, o: { key?: Pair; alg?: string; kid?: string | null; typ?: string; iss?: string; aud?: string | string[]; exp?: number | string; nbf?: number } = {}) => {
  const alg = o.alg ?? 'RS256';
  const header: Record<string, unknown> = { alg };
  if (o.kid !== null) header.kid = o.kid ?? 'rs-1';
  if (o.typ) header.typ = o.typ;
  const j = new SignJWT({ sub: 'alice', ...claims })
    .setProtectedHeader(header as { alg: string })
    .setIssuer(o.iss ?? ISS)
    .setAudience(o.aud ?? AUD)
    .setIssuedAt()
    .setExpirationTime(o.exp ?? '5m');
  if (o.nbf !== undefined) j.setNotBefore(o.nbf);
  return j.sign((o.key ?? rs).privateKey);
};

const config = (over: Record<string, unknown> = {}, keys: unknown = { sources: { inline_keys: [rsJwk] } }) => ({
  issuer: { allow_list: [{ value: ISS }] },
  audience: { allow_list: [{ value: AUD }] },
  http: { tokens: [{ type: 'jwt', method: 'header', name: 'Authorization', prefix: 'Bearer ' }] },
  jws: { allowed_algorithms: ['RS256'], keys },
  ...over,
});

/** The action alone, compiled against `registry`. */
function action(cfg: unknown, registry = new JwksRegistry()): CompiledJwtValidation {
  const p = validateTrafficPolicy({ inbound: [{ actions: [{ type: 'jwt-validation', config: cfg }] }] });
  return compileJwtValidation((p.inbound[0]!.actions[0] as JwtValidationAction).config, registry);
}
const bearer = (t: string, name = 'Authorization') => request({ headers: ['Host', 'app.example.com', name, `Bearer ${t}`] });
const vars = (r: RequestState) => (r.vars.actions as { ngrok: { jwt_validation: { tokens: { verified: boolean; payload: Map<string, unknown>; header: Map<string, unknown>; location: string; location_property: string; signature: string }[]; error: { code: string; message: string } } } }).ngrok.jwt_validation;
const header = (pairs: string[], name: string) => pairs.filter((_, i) => i % 2 === 1 && pairs[i - 1]!.toLowerCase() === name.toLowerCase());

async function run(a: CompiledJwtValidation, r: RequestState): Promise<Exclude<Outcome, null> | null> {
  return (await runJwtValidation(a, r)) as Exclude<Outcome, null> | null;
}
function expect401(out: Exclude<Outcome, null> | null, r: RequestState, code: string, challenge = 'Bearer error="invalid_token"') {
  expect(out).toMatchObject({ status: 401, headers: { 'warren-error-code': 'ERR_WARREN_7122', 'www-authenticate': challenge } });
  expect(vars(r).error.code).toBe(code);
}

beforeAll(async () => {
  rs = await generateKeyPair('RS256', { extractable: true });
  rs2 = await generateKeyPair('RS256', { extractable: true });
  es = await generateKeyPair('ES256', { extractable: true });
  rsJwk = { ...(await exportJWK(rs.publicKey)), kid: 'rs-1' };
  rs2Jwk = { ...(await exportJWK(rs2.publicKey)), kid: 'rs-2' };
});

describe('jwt-validation with inline keys', () => {
  it('accepts a valid token and records its header and claims', async () => {
    const a = action(config());
    const tok = await sign({ scope: 'read', n: 3, ratio: 0.5 });
    const r = bearer(tok);
    expect(await run(a, r)).toBeNull();
    const v = vars(r);
    expect(v.error.code).toBe('');
    expect(v.tokens).toHaveLength(1);
    const t = v.tokens[0]!;
    expect([t.verified, t.location, t.location_property, t.signature]).toEqual([true, 'header', 'Authorization', tok.split('.')[2]]);
    expect(t.header.get('kid')).toBe('rs-1');
    expect(t.payload.get('sub')).toBe('alice');
    expect(t.payload.get('n')).toBe(3n);
    expect(t.payload.get('ratio')).toBe(0.5);
    expect(t.payload.get('aud')).toBe(AUD);
  });

  it('answers a missing token at once (no promise) with a bare Bearer challenge', () => {
    const a = action(config());
    for (const headers of [['Host', 'x'], ['Authorization', 'Basic YTpi'], ['Authorization', 'Bearer   ']]) {
      const r = request({ headers });
      const out = runJwtValidation(a, r);
      expect(out).not.toBeInstanceOf(Promise);
      expect401(out as Exclude<Outcome, null>, r, 'token_missing', 'Bearer');
    }
  });

  it('matches the prefix case-insensitively and reads the header by any case', async () => {
    const a = action(config());
    const tok = await sign();
    expect(await run(a, request({ headers: ['authorization', `bearer ${tok}`] }))).toBeNull();
    expect(await run(a, request({ headers: ['AUTHORIZATION', `BEARER ${tok}`] }))).toBeNull();
    // A header sent twice is ambiguous.
    const r = request({ headers: ['Authorization', `Bearer ${tok}`, 'authorization', `Bearer ${tok}`] });
    expect401(await run(a, r), r, 'token_malformed');
  });

  it.each<[string, () => Promise<string>, string]>([
    ['expired', () => sign({}, { exp: Math.floor(Date.now() / 1000) - 120 }), 'token_expired'],
    ['not yet valid', () => sign({}, { nbf: Math.floor(Date.now() / 1000) + 300 }), 'claim_invalid'],
    ['from another issuer', () => sign({}, { iss: 'https://issuer.example.com' }), 'claim_invalid'],
    ['for another audience', () => sign({}, { aud: 'urn:other' }), 'claim_invalid'],
    ['signed with an algorithm not allowed', () => sign({}, { key: es, alg: 'ES256' }), 'algorithm_not_allowed'],
    ['with an unknown kid', () => sign({}, { kid: 'nope' }), 'key_not_found'],
    ['signed by another key under a known kid', () => sign({}, { key: rs2 }), 'signature_invalid'],
    ['without exp', async () => new SignJWT({ sub: 'a' }).setProtectedHeader({ alg: 'RS256', kid: 'rs-1' }).setIssuer(ISS).setAudience(AUD).sign(rs.privateKey), 'claim_invalid'],
    ['unsigned (alg none)', async () => new UnsecuredJWT({ sub: 'a' }).setIssuer(ISS).setAudience(AUD).setExpirationTime('5m').encode(), 'algorithm_not_allowed'],
    ['not a JWT', async () => 'abc.def', 'token_malformed'],
  ])('refuses a token %s', async (_, make, code) => {
    const a = action(config());
    const tok = await make();
    const r = bearer(tok);
    expect401(await run(a, r), r, code);
    expect(vars(r).error.message).not.toContain(tok);
    if (code !== 'token_malformed') expect(vars(r).tokens[0]?.verified).toBe(false);
  });

  it('accepts exp and nbf within the 30 s clock tolerance', async () => {
    const a = action(config());
    const now = Math.floor(Date.now() / 1000);
    expect(await run(a, bearer(await sign({}, { exp: now - 10, nbf: now + 10 })))).toBeNull();
  });

  it('refuses an HS256 token made with the public key as its secret (algorithm confusion)', async () => {
    const a = action(config());
    const secret = new TextEncoder().encode(JSON.stringify(rsJwk));
    const tok = await new SignJWT({ sub: 'mallory' }).setProtectedHeader({ alg: 'HS256', kid: 'rs-1' }).setIssuer(ISS).setAudience(AUD).setExpirationTime('5m').sign(secret);
    const r = bearer(tok);
    expect401(await run(a, r), r, 'algorithm_not_allowed');
  });

  it('without a kid, tries the candidate keys (at most two)', async () => {
    const a = action(config({ jws: { allowed_algorithms: ['RS256'], keys: { sources: { inline_keys: [rs2Jwk, rsJwk] } } } }));
    expect(await run(a, bearer(await sign({}, { kid: null })))).toBeNull();
    const third = await generateKeyPair('RS256', { extractable: true });
    const b = action(config({ jws: { allowed_algorithms: ['RS256'], keys: { sources: { inline_keys: [rs2Jwk, { ...(await exportJWK(third.publicKey)), kid: 'rs-3' }, rsJwk] } } } }));
    const r = bearer(await sign({}, { kid: null }));
    expect401(await run(b, r), r, 'signature_invalid');
  });

  it('requires a kid when identification lists it', async () => {
    const a = action(config({}, { identification: { token_claims: ['kid'] }, sources: { inline_keys: [rsJwk] } }));
    const r = bearer(await sign({}, { kid: null }));
    expect401(await run(a, r), r, 'kid_missing');
    expect(await run(a, bearer(await sign()))).toBeNull();
  });

  it('requires typ at+jwt for at+jwt tokens', async () => {
    const a = action(config({ http: { tokens: [{ type: 'at+jwt', method: 'header', name: 'Authorization', prefix: 'Bearer ' }] } }));
    const r = bearer(await sign());
    expect401(await run(a, r), r, 'claim_invalid');
    expect(await run(a, bearer(await sign({}, { typ: 'at+jwt' })))).toBeNull();
  });

  it('requires every configured token', async () => {
    const a = action(
      config({
        http: {
          tokens: [
            { type: 'access_token', method: 'header', name: 'Authorization', prefix: 'Bearer ' },
            { type: 'id_token', method: 'header', name: 'X-Id-Token' },
          ],
        },
      }),
    );
    const tok = await sign();
    const only = bearer(tok);
    expect401(await run(a, only), only, 'token_missing', 'Bearer');
    const both = request({ headers: ['Authorization', `Bearer ${tok}`, 'X-Id-Token', await sign({ sub: 'bob' })] });
    expect(await run(a, both)).toBeNull();
    expect(vars(both).tokens.map((t) => [t.location_property, t.payload.get('sub')])).toEqual([
      ['Authorization', 'alice'],
      ['X-Id-Token', 'bob'],
    ]);
  });
});

describe('jwt-validation in the policy engine', () => {
  function stage(policy: unknown): RouteStage {
    const s = trafficPolicyStage(route(policy), EDGE, CONFIG, deps());
    if (!s) throw new Error('no stage');
    return s;
  }

  it('goes on with the same rule’s next action and later rules after the asynchronous check', async () => {
    const s = stage({
      inbound: [
        {
          actions: [
            { type: 'jwt-validation', config: config() },
            { type: 'add-headers', config: { headers: { 'x-sub': "${actions.ngrok.jwt_validation.tokens[0].payload['sub']}" } } },
          ],
        },
        { expressions: ["actions.ngrok.jwt_validation.tokens[0].payload['scope'] == 'admin'"], actions: [{ type: 'add-headers', config: { headers: { 'x-admin': 'yes' } } }] },
        { actions: [{ type: 'remove-headers', config: { headers: ['authorization'] } }] },
      ],
    });
    const r = bearer(await sign({ scope: 'admin' }));
    expect(await s.onRequest!(r)).toBeNull();
    expect([header(r.headers, 'x-sub'), header(r.headers, 'x-admin'), header(r.headers, 'authorization')]).toEqual([['alice'], ['yes'], []]);
    const bad = bearer(await sign({}, { aud: 'urn:other' }));
    expect(await s.onRequest!(bad)).toMatchObject({ status: 401 });
    expect(header(bad.headers, 'x-sub')).toEqual([]);
  });
});

describe('jwt-validation with JWK set URLs', () => {
  let dir: string;
  let ca: string;
  let server: https.Server;
  let port: number;
  let hits = 0;
  type Mode = 'ok' | 'fail' | 'hang' | 'big' | 'redirect' | 'notjson';
  let mode: Mode = 'ok';
  let served: JWK[] = [];
  const sockets = new Set<{ destroy(): void }>();

  beforeAll(async () => {
    dir = mkdtempSync(path.join(tmpdir(), 'warren-jwks-'));
    const tls = await ensureLocalTls(dir);
    ca = tls.caPem!;
    server = https.createServer({ cert: tls.cert, key: tls.key }, (req, res) => {
      hits++;
      if (mode === 'hang') return;
      if (mode === 'fail') return res.writeHead(500).end();
      if (mode === 'redirect') return res.writeHead(302, { location: 'https://127.0.0.1:1/' }).end();
      if (mode === 'notjson') return res.writeHead(200).end('<html>');
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(mode === 'big' ? JSON.stringify({ keys: [], pad: 'x'.repeat(300_000) }) : JSON.stringify({ keys: served }));
    });
    server.on('connection', (s) => {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
    });
    port = await new Promise<number>((r) => server.listen(0, '127.0.0.1', () => r((server.address() as net.AddressInfo).port)));
  });
  afterAll(() => {
    for (const s of sockets) s.destroy();
    server.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const jku = () => ({ sources: { additional_jkus: [`https://127.0.0.1:${port}/jwks`] } });
  const registry = (o: Partial<ConstructorParameters<typeof JwksRegistry>[0]> = {}) => new JwksRegistry({ ca, allowPrivate: true, ...o });

  it('fetches the set once, then uses it from the cache', async () => {
    mode = 'ok';
    served = [rsJwk, { kty: 'oct', k: 'c2VjcmV0', kid: 'hmac' }];
    hits = 0;
    const a = action(config({}, jku()), registry());
    expect(await run(a, bearer(await sign()))).toBeNull();
    expect(await run(a, bearer(await sign()))).toBeNull();
    expect(hits).toBe(1);
  });

  it('refetches for an unknown kid at most once per cooldown', async () => {
    mode = 'ok';
    served = [rsJwk];
    hits = 0;
    let now = 1_000_000;
    const a = action(config({}, jku()), registry({ now: () => now }));
    expect(await run(a, bearer(await sign()))).toBeNull();
    expect(hits).toBe(1);
    const unknownKids = async () => {
      for (let i = 0; i < 20; i++) {
        const r = bearer(await sign({}, { kid: `unknown-${i}` }));
        expect401(await run(a, r), r, 'key_not_found');
      }
    };
    // Just fetched: no refetch at all.
    await unknownKids();
    expect(hits).toBe(1);
    // After the cooldown: one refetch for the whole flood.
    now += 30_001;
    await unknownKids();
    expect(hits).toBe(2);
    // A rotated-in key is picked up at the next refetch, after the cooldown.
    served = [rsJwk, rs2Jwk];
    const early = bearer(await sign({}, { key: rs2, kid: 'rs-2' }));
    expect401(await run(a, early), early, 'key_not_found');
    now += 30_001;
    expect(await run(a, bearer(await sign({}, { key: rs2, kid: 'rs-2' })))).toBeNull();
    expect(hits).toBe(3);
  });

  it.each<[Mode, string]>([
    ['fail', 'answered HTTP 500'],
    ['redirect', 'answered HTTP 302 (redirects are not followed)'],
    ['notjson', 'did not serve JSON'],
    ['big', 'is over 262144 bytes'],
    ['hang', 'no complete answer within 300 ms'],
  ])('fails closed with a 503 when the set cannot be fetched (%s)', async (m, why) => {
    mode = m;
    const a = action(config({}, jku()), registry({ timeoutMs: 300 }));
    const r = bearer(await sign());
    const t = performance.now();
    const out = await run(a, r);
    expect(performance.now() - t).toBeLessThan(2_000);
    expect(out).toMatchObject({ status: 503, headers: { 'warren-error-code': 'ERR_WARREN_7123', 'retry-after': '30' } });
    expect(vars(r).error).toMatchObject({ code: 'jwks_unavailable' });
    expect(vars(r).error.message).toContain(why);
  });

  it('does not hammer a failing endpoint, and recovers', async () => {
    mode = 'fail';
    hits = 0;
    let now = 5_000_000;
    const a = action(config({}, jku()), registry({ now: () => now }));
    for (let i = 0; i < 10; i++) expect(await run(a, bearer(await sign()))).toMatchObject({ status: 503 });
    expect(hits).toBe(1);
    mode = 'ok';
    served = [rsJwk];
    now += 5_001;
    expect(await run(a, bearer(await sign()))).toBeNull();
    expect(hits).toBe(2);
  });

  it('keeps the last good set for a while when a refresh fails', async () => {
    mode = 'ok';
    served = [rsJwk];
    let now = 9_000_000;
    const a = action(config({}, jku()), registry({ now: () => now }));
    expect(await run(a, bearer(await sign()))).toBeNull();
    mode = 'fail';
    now += 16 * 60_000; // past the 15 min TTL
    expect(await run(a, bearer(await sign()))).toBeNull();
    now += 60 * 60_000; // and past the hour of grace
    expect(await run(a, bearer(await sign()))).toMatchObject({ status: 503 });
  });

  it('uses inline keys without fetching, and the sets for other kids', async () => {
    mode = 'fail';
    hits = 0;
    served = [];
    const a = action(config({}, { sources: [{ inline_keys: [rsJwk] }, { additional_jkus: [`https://127.0.0.1:${port}/jwks`] }] }), registry());
    expect(await run(a, bearer(await sign()))).toBeNull();
    expect(hits).toBe(0);
    expect(await run(a, bearer(await sign({}, { key: rs2, kid: 'rs-2' })))).toMatchObject({ status: 503 });
  });

  it('refuses private hosts unless allowed, by literal address and by what a name resolves to', async () => {
    mode = 'ok';
    served = [rsJwk];
    hits = 0;
    const lit = action(config({}, jku()), registry({ allowPrivate: false }));
    const r = bearer(await sign());
    expect(await run(lit, r)).toMatchObject({ status: 503 });
    expect(vars(r).error.message).toContain('127.0.0.1 is not a public address');
    // `localhost` is refused by name; a name for a private address is refused after resolving it.
    const { fetchJwks, JWKS_FETCH } = await import('./jwt-action.js');
    await expect(fetchJwks(new URL(`https://localhost:${port}/jwks`), { ...JWKS_FETCH, ca, allowPrivate: false })).rejects.toThrow('localhost is a loopback host name');
    expect(hits).toBe(0);
    const { guardedLookup } = await import('./jwt-action.js');
    const resolve = (allow: boolean, all: boolean) =>
      new Promise<{ err: NodeJS.ErrnoException | null; address: unknown }>((res) => guardedLookup(allow)('localhost', { all }, (err, address) => res({ err, address })));
    expect((await resolve(false, true)).err?.message).toMatch(/^localhost resolves to (127\.0\.0\.1|::1), not a public address/);
    expect(await resolve(true, false)).toMatchObject({ err: null, address: expect.stringMatching(/^(127\.0\.0\.1|::1)$/) });
    // Allowed: the set is fetched by name.
    expect(await fetchJwks(new URL(`https://localhost:${port}/jwks`), { ...JWKS_FETCH, ca, allowPrivate: true })).toHaveLength(1);
  });
});
