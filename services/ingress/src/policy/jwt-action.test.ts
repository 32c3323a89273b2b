import https from 'node:https';
import net from 'node:net';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Registry } from 'prom-client';
import { exportJWK, generateKeyPair, SignJWT, UnsecuredJWT, type JWK } from 'jose';
import { validateTrafficPolicy, type JwtValidationAction } from '@warren/shared';
import type { Outcome, RequestState, RouteStage } from '../pipeline/types.js';
import { ensureLocalTls } from '../tls.js';
import { trafficPolicyStage } from './index.js';
import { compileJwtValidation, JWKS_FETCH, jwksMaxAge, JwksRegistry, observeJwks, runJwtValidation, type CompiledJwtValidation, type FetchedJwks } from './jwt-action.js';
import { formBodyFields, jsonBodyFields, wantedFields, type BodyField } from './jwt-body.js';
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
      res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'public, max-age=600' });
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
    // Allowed: the set is fetched by name, with the lifetime its Cache-Control gives.
    expect(await fetchJwks(new URL(`https://localhost:${port}/jwks`), { ...JWKS_FETCH, ca, allowPrivate: true })).toMatchObject({ keys: [{ kid: 'rs-1' }], maxAgeMs: 600_000 });
  });
});

describe('JWK set caching (a fake fetcher and clock)', () => {
  const MIN = 60_000;
  const JKU = 'https://issuer.example.com/jwks';
  let now = 0;
  /** Every fetch waits for the test to settle it. */
  function setup(o: Partial<ConstructorParameters<typeof JwksRegistry>[0]> = {}) {
    const calls: { resolve(r: FetchedJwks): void; reject(e: Error): void }[] = [];
    const registry = new JwksRegistry({ now: () => now, fetch: () => new Promise<FetchedJwks>((resolve, reject) => calls.push({ resolve, reject })), ...o });
    const events: { trigger: string; ok: boolean }[] = [];
    registry.observer = (e) => events.push({ trigger: e.trigger, ok: e.ok });
    const a = action(config({}, { sources: { additional_jkus: [JKU] } }), registry);
    return { calls, registry, events, a };
  }
  const keys = (...k: JWK[]): FetchedJwks => ({ keys: k, maxAgeMs: null });
  /** Lets settled fetches' callbacks run (no time passes: the clock is `now`). */
  const settle = () => new Promise<void>((r) => setImmediate(r));
  const ok = async (a: CompiledJwtValidation, o?: Parameters<typeof sign>[1]) => expect(await run(a, bearer(await sign({}, o)))).toBeNull();

  /** A set fetched at `now` = 0. */
  async function fetched(o: Partial<ConstructorParameters<typeof JwksRegistry>[0]> = {}, first = keys(rsJwk)) {
    now = 0;
    const t = setup(o);
    const p = run(t.a, bearer(await sign()));
    await settle();
    t.calls[0]!.resolve(first);
    expect(await p).toBeNull();
    return t;
  }

  it('fetches once for concurrent requests of every route naming the URL (single flight)', async () => {
    now = 0;
    const { calls, registry, a } = setup();
    const b = action(config({ audience: { allow_list: [{ value: 'urn:other' }] } }, { sources: { additional_jkus: [JKU] } }), registry);
    const tok = await sign();
    const runs = [a, b, a, b, a].map((x) => run(x, bearer(tok)));
    await settle();
    expect(calls).toHaveLength(1);
    calls[0]!.resolve(keys(rsJwk));
    const outs = await Promise.all(runs);
    expect(outs.map((o) => o?.status ?? null)).toEqual([null, 401, null, 401, null]); // b wants another audience
    expect(calls).toHaveLength(1);
  });

  it('refreshes ahead of expiry in the background, once, and uses the new set when it arrives', async () => {
    const { calls, events, a } = await fetched();
    now = 11 * MIN; // before 80 % of the 15 minutes
    await ok(a);
    expect(calls).toHaveLength(1);
    now = 12.5 * MIN;
    await ok(a); // answered while the refetch is still pending
    await ok(a);
    expect(calls).toHaveLength(2);
    calls[1]!.resolve(keys(rsJwk, rs2Jwk));
    await settle();
    await ok(a, { key: rs2, kid: 'rs-2' });
    expect(calls).toHaveLength(2);
    expect(events).toEqual([
      { trigger: 'initial', ok: true },
      { trigger: 'refresh', ok: true },
    ]);
    // The new set is fresh for 15 minutes from its fetch.
    now = 12.5 * MIN + 11 * MIN;
    await ok(a);
    expect(calls).toHaveLength(2);
  });

  it('serves the expired set while its refetch runs', async () => {
    const { calls, a } = await fetched();
    now = 16 * MIN;
    const t = performance.now();
    await ok(a);
    await ok(a);
    expect(performance.now() - t).toBeLessThan(1_000);
    expect(calls).toHaveLength(2);
    calls[1]!.resolve(keys(rs2Jwk));
    await settle();
    // Replaced: the old key is gone (an unknown kid, refetched only after the cooldown).
    const r = bearer(await sign());
    expect401(await run(a, r), r, 'key_not_found');
    await ok(a, { key: rs2, kid: 'rs-2' });
  });

  it('keeps the last good set for an hour past expiry while refreshes fail, backing off, then fails closed', async () => {
    const { calls, events, a } = await fetched();
    const fail = async (i: number) => {
      await settle();
      expect(calls).toHaveLength(i + 1);
      calls[i]!.reject(new Error('answered HTTP 500'));
      await settle();
    };
    now = 16 * MIN;
    await ok(a);
    await fail(1);
    now += 4_000; // within the 5 s back-off
    await ok(a);
    expect(calls).toHaveLength(2);
    now += 1_000;
    await ok(a);
    await fail(2);
    now += 9_000; // within the doubled back-off (10 s)
    await ok(a);
    expect(calls).toHaveLength(3);
    now += 1_000;
    await ok(a);
    await fail(3);
    // The back-off stops doubling at 30 s.
    for (let i = 4; i < 7; i++) {
      now += 30_000;
      await ok(a);
      await fail(i);
    }
    expect(events.filter((e) => !e.ok)).toHaveLength(6);
    // Up to an hour past expiry (15 min + 60 min after the fetch)…
    now = 75 * MIN - 1;
    const last = run(a, bearer(await sign()));
    await fail(7);
    expect(await last).toBeNull();
    // …then the set is dropped: a request waits for a fetch, and gets 503 when it fails.
    now = 75 * MIN + 30_000;
    const r = bearer(await sign());
    const out = run(a, r);
    await fail(8);
    expect(await out).toMatchObject({ status: 503, headers: { 'warren-error-code': 'ERR_WARREN_7123' } });
    expect(vars(r).error).toMatchObject({ code: 'jwks_unavailable', message: expect.stringContaining('answered HTTP 500') });
    expect(events.at(-1)).toEqual({ trigger: 'initial', ok: false });
  });

  it('recovers from failed refreshes with the next good fetch', async () => {
    const { calls, events, a } = await fetched();
    now = 20 * MIN;
    await ok(a);
    await settle();
    calls[1]!.reject(new Error('timeout'));
    await settle();
    now += 5_000;
    await ok(a);
    await settle();
    calls[2]!.resolve(keys(rsJwk));
    await settle();
    now += 11 * MIN; // fresh again: no fetch
    await ok(a);
    expect(calls).toHaveLength(3);
    expect(events.map((e) => `${e.trigger}:${e.ok}`)).toEqual(['initial:true', 'refresh:false', 'refresh:true']);
  });

  it('waits for a refresh in flight when a token names a kid the set lacks', async () => {
    const { calls, a } = await fetched();
    now = 13 * MIN;
    await ok(a); // starts the refresh
    const rotated = run(a, bearer(await sign({}, { key: rs2, kid: 'rs-2' })));
    await settle();
    expect(calls).toHaveLength(2);
    calls[1]!.resolve(keys(rsJwk, rs2Jwk));
    expect(await rotated).toBeNull();
  });

  it('uses the lifetime of Cache-Control, clamped to 1 – 15 minutes: it may shorten the default, never lengthen it', async () => {
    const o = { minTtlMs: JWKS_FETCH.minTtlMs, maxTtlMs: JWKS_FETCH.maxTtlMs };
    expect(JWKS_FETCH.maxTtlMs).toBe(JWKS_FETCH.ttlMs);
    expect(
      [undefined, '', 'public', 'max-age=300', 'public, max-age=5', 'max-age=9999999', 'max-age=86400', 'max-age=901', 'no-store', 'no-cache, max-age=600', 's-maxage=120, max-age=30', 'max-age="90"', 'max-age=abc', 'max-age=-1'].map((cc) => jwksMaxAge(cc, o)),
    ).toEqual([null, null, null, 300_000, 60_000, 900_000, 900_000, 900_000, 60_000, 60_000, 120_000, 90_000, null, null]);
    const { calls, a } = await fetched({}, { keys: [rsJwk], maxAgeMs: 2 * MIN });
    now = 90_000; // 75 % of 2 minutes
    await ok(a);
    expect(calls).toHaveLength(1);
    now = 100_000; // past 80 %
    await ok(a);
    expect(calls).toHaveLength(2);
  });

  it('counts fetches by trigger and result, and logs failures', async () => {
    now = 0;
    const { calls, registry, a } = setup();
    registry.observer = null;
    const metrics = new Registry();
    const logged: [string, string][] = [];
    const log = { warn: (_o: unknown, m: string) => logged.push(['warn', m]), info: (_o: unknown, m: string) => logged.push(['info', m]) };
    observeJwks([{ actions: [a] }], metrics, log as never);
    const first = run(a, bearer(await sign()));
    await settle();
    calls[0]!.reject(new Error('refused'));
    expect(await first).toMatchObject({ status: 503 });
    now = 10_000;
    const second = run(a, bearer(await sign()));
    await settle();
    calls[1]!.resolve(keys(rsJwk));
    expect(await second).toBeNull();
    const values = (await metrics.getSingleMetric('warren_ingress_jwks_fetches_total')!.get()).values.map((v) => [v.labels.trigger, v.labels.result, v.value]);
    expect(values).toEqual([
      ['initial', 'error', 1],
      ['initial', 'ok', 1],
    ]);
    expect(logged).toEqual([
      ['warn', 'jwt-validation: JWK set fetch failed; tokens needing it are answered 503'],
      ['info', 'jwt-validation: JWK set fetched again after failures'],
    ]);
  });
});

describe('jwt-validation with tokens in the body', () => {
  const bodyConfig = (tokens: unknown[]) => config({ http: { tokens } });
  const idToken = { type: 'it+jwt', method: 'body', name: '_id_token' };
  function post(body: string | Buffer, contentType: string | undefined, o: { method?: string; headers?: string[] } = {}): RequestState {
    const r = request({ method: o.method ?? 'POST', headers: ['Host', 'app.example.com', ...(o.headers ?? [])] });
    const raw = ['Host', 'app.example.com', ...(o.headers ?? [])];
    if (contentType) raw.push('Content-Type', contentType);
    const h = r.req.headers as Record<string, string>;
    // As Node parses them: the first Content-Type kept, Content-Encoding values joined.
    for (let i = 0; i < raw.length; i += 2) {
      const name = raw[i]!.toLowerCase();
      if (name === 'content-type' && h[name] === undefined) h[name] = raw[i + 1]!;
      if (name === 'content-encoding') h[name] = h[name] === undefined ? raw[i + 1]! : `${h[name]}, ${raw[i + 1]!}`;
    }
    (r.req as { rawHeaders: string[] }).rawHeaders = raw;
    r.body = Buffer.from(body);
    return r;
  }

  it('reads a form field, with its prefix, and records where the token was', async () => {
    const a = action(bodyConfig([{ ...idToken, prefix: 'Bearer ' }]));
    const tok = await sign();
    const r = post(`state=x%26y&_ID_Token=Bearer+${tok}&a=`, 'application/x-www-form-urlencoded; charset=UTF-8');
    expect(await run(a, r)).toBeNull();
    const t = vars(r).tokens[0]!;
    expect([t.verified, t.location, t.location_property, t.payload.get('sub')]).toEqual([true, 'body', '_id_token', 'alice']);
    // Percent-encoded names and values decode.
    expect(await run(a, post(`%5Fid%5Ftoken=Bearer%20${tok}`, 'application/x-www-form-urlencoded'))).toBeNull();
  });

  it('reads a top-level member of a JSON object, name in any case', async () => {
    const a = action(bodyConfig([idToken]));
    const tok = await sign();
    const r = post(JSON.stringify({ nested: { _id_token: 'not this one' }, list: [1, -2.5e3, true, null, { a: [] }], _Id_Token: tok, tail: '\u00e9"\\' }), 'Application/JSON');
    expect(await run(a, r)).toBeNull();
    expect(vars(r).tokens[0]).toMatchObject({ location: 'body', location_property: '_id_token', verified: true });
    // An escaped name is the name it decodes to.
    expect(await run(a, post(`{"\\u005fid_token" : "${tok}"}`, 'application/json'))).toBeNull();
  });

  it('requires header and body tokens alike', async () => {
    const a = action(bodyConfig([{ type: 'access_token', method: 'header', name: 'Authorization', prefix: 'Bearer ' }, idToken]));
    const tok = await sign();
    const both = post(`{"_id_token":"${await sign({ sub: 'bob' })}"}`, 'application/json', { headers: ['Authorization', `Bearer ${tok}`] });
    expect(await run(a, both)).toBeNull();
    expect(vars(both).tokens.map((t) => [t.location, t.location_property, t.payload.get('sub')])).toEqual([
      ['header', 'Authorization', 'alice'],
      ['body', '_id_token', 'bob'],
    ]);
    const headerOnly = post('{}', 'application/json', { headers: ['Authorization', `Bearer ${tok}`] });
    expect401(await run(a, headerOnly), headerOnly, 'token_missing', 'Bearer');
    expect(vars(headerOnly).error.message).toBe('no token in the body field _id_token');
  });

  it.each<[string, () => Promise<RequestState>, string, string]>([
    ['a GET', async () => post(`_id_token=${await sign()}`, 'application/x-www-form-urlencoded', { method: 'GET' }), 'token_missing', 'POST, PUT and PATCH requests only, not GET'],
    ['a text/plain body', async () => post(`_id_token=${await sign()}`, 'text/plain'), 'token_missing', 'not "text/plain"'],
    ['no Content-Type', async () => post(`_id_token=${await sign()}`, undefined), 'token_missing', '(no Content-Type)'],
    ['invalid JSON', async () => post(`{"_id_token":"${await sign()}",}`, 'application/json'), 'token_missing', 'the body is not valid JSON'],
    ['a JSON array', async () => post(`["${await sign()}"]`, 'application/json'), 'token_missing', 'the JSON body is not an object'],
    ['JSON nested too deep', async () => post(`{"_id_token":"${await sign()}","a":${'['.repeat(600)}${']'.repeat(600)}}`, 'application/json'), 'token_missing', 'the body is not valid JSON'],
    ['a field sent twice', async () => post(`_id_token=${await sign()}&_ID_TOKEN=x`, 'application/x-www-form-urlencoded'), 'token_malformed', 'is sent more than once'],
    ['a member sent twice', async () => post(`{"_id_token":"${await sign()}","_id_token":"x"}`, 'application/json'), 'token_malformed', 'is sent more than once'],
    ['a number', async () => post('{"_id_token":42}', 'application/json'), 'token_malformed', 'the body field _id_token is not a string'],
    ['a token over 16 KiB', async () => post(`_id_token=${'a'.repeat(16 * 1024 + 1)}`, 'application/x-www-form-urlencoded'), 'token_malformed', 'is longer than 16384 characters'],
    ['an empty field', async () => post('_id_token=&x=1', 'application/x-www-form-urlencoded'), 'token_missing', 'no token in the body field _id_token'],
    // Read as the upstream reads it, or not at all: another charset or a content encoding would
    // be decoded by the upstream into other fields than the ones checked.
    ['a JSON body in UTF-7', async () => post(`{"_id_token":"${await sign()}","x":"+ACI-,+ACI-_id_token+ACI-:+ACI-evil+ACI-,+ACI-y+ACI-:+ACI-"}`, 'application/json; charset=utf-7'), 'token_missing', 'UTF-8 bodies only (charset utf-8, or none), not charset "utf-7"'],
    ['a quoted UTF-16 charset', async () => post(`{"_id_token":"${await sign()}"}`, 'application/json;Charset="UTF-16"'), 'token_missing', 'not charset "utf-16"'],
    ['a JSON body in us-ascii', async () => post(`{"_id_token":"${await sign()}"}`, 'application/json; charset=us-ascii'), 'token_missing', 'not charset "us-ascii"'],
    ['a form in latin1', async () => post(`_id_token=${await sign()}`, 'application/x-www-form-urlencoded; charset=iso-8859-1'), 'token_missing', '(charset utf-8 or us-ascii, or none), not charset "iso-8859-1"'],
    ['two charset parameters', async () => post(`{"_id_token":"${await sign()}"}`, 'application/json; charset=utf-8; charset=utf-7'), 'token_missing', 'charset parameter is malformed or given more than once'],
    ['a gzip body', async () => post(`{"_id_token":"${await sign()}"}`, 'application/json', { headers: ['Content-Encoding', 'gzip'] }), 'token_missing', 'without a content encoding only, not "gzip"'],
    ['identity then gzip', async () => post(`{"_id_token":"${await sign()}"}`, 'application/json', { headers: ['Content-Encoding', 'identity', 'Content-Encoding', 'gzip'] }), 'token_missing', 'not "identity, gzip"'],
    ['two Content-Type headers', async () => post(`{"_id_token":"${await sign()}"}`, 'application/json', { headers: ['content-type', 'application/json; charset=utf-7'] }), 'token_missing', 'more than one Content-Type header'],
    // A malformed escape in the value: a 401, not a failed route (it used to throw out of the action: 502).
    ['a value with an invalid escape', async () => post('{"_id_token":"\\q"}', 'application/json'), 'token_malformed', 'the body field _id_token is not a valid JSON string'],
    ['a value with a short \\u escape', async () => post('{"_id_token":"\\u12"}', 'application/json'), 'token_malformed', 'the body field _id_token is not a valid JSON string'],
    ['an invalid escape elsewhere', async () => post(`{"_id_token":"${await sign()}","x":"\\x41"}`, 'application/json'), 'token_missing', 'the body is not valid JSON'],
  ])('refuses %s', async (_, make, code, message) => {
    const a = action(bodyConfig([idToken]));
    const r = await make();
    const out = await run(a, r);
    expect(out).toMatchObject({ status: 401, headers: { 'warren-error-code': 'ERR_WARREN_7122' } });
    expect(vars(r).error.code).toBe(code);
    expect(vars(r).error.message).toContain(message);
  });

  it('reads UTF-8 bodies however the charset is written, forms in US-ASCII too, and the identity encoding', async () => {
    const a = action(bodyConfig([idToken]));
    const tok = await sign();
    for (const [body, type, extra] of [
      [`{"_id_token":"${tok}"}`, 'application/json; charset="UTF-8"', []],
      [`{"_id_token":"${tok}"}`, 'application/json;charset=utf-8 ; foo=bar', ['Content-Encoding', 'Identity']],
      [`_id_token=${tok}`, 'application/x-www-form-urlencoded; Charset=US-ASCII', []],
      [`_id_token=${tok}`, 'application/x-www-form-urlencoded; charset="utf-8"', []],
    ] as const) {
      const r = post(body, type, { headers: [...extra] });
      expect(await run(a, r), type).toBeNull();
    }
  });

  it('makes the stage buffer the body only for policies with a body token', () => {
    const stage = (tokens: unknown[]) => trafficPolicyStage(route({ inbound: [{ actions: [{ type: 'jwt-validation', config: bodyConfig(tokens) }] }] }), EDGE, CONFIG, deps())!;
    expect(stage([idToken]).needsBody).toBe(true);
    expect(stage([{ type: 'jwt', method: 'header', name: 'Authorization' }]).needsBody).toBeUndefined();
  });
});

describe('the body scanners', () => {
  const w = wantedFields(['tok', 'Other_Name']);
  it('find what JSON.parse finds at the top level, and refuse what breaks the structure', () => {
    const valid = ['{}', ' { "tok" : "a" } ', '{"x":{"tok":"no"},"tok":"\\u0061\\"b"}', '{"a":[[],{},[{"b":[1,"]}"]}]],"other_name":"c"}', '{"tok":"x","n":-1.5e+3,"t":true,"f":false,"z":null}', '{"TOK":"\\ud83d\\ude00"}'];
    for (const doc of valid) {
      const found = jsonBodyFields(Buffer.from(doc), w, 100);
      expect(found, doc).toBeInstanceOf(Map);
      const parsed = Object.entries(JSON.parse(doc) as Record<string, unknown>).filter(([k]) => ['tok', 'other_name'].includes(k.toLowerCase()));
      expect([...(found as Map<string, BodyField>).entries()].map(([k, f]) => [k, f.value]), doc).toEqual(parsed.map(([k, v]) => [k.toLowerCase(), v]));
    }
    for (const doc of ['', '{', '{"tok":"a"', '{"tok":"a"}x', '{"tok" "a"}', '{"tok":"a",}', '{tok:"a"}', '{"a":[}', '{"a":{]}', '{"a":"\n"}', '{"a":tru}', '{"a":.5}', "{'tok':'a'}"]) {
      expect(jsonBodyFields(Buffer.from(doc), w, 100), JSON.stringify(doc)).toEqual({ error: 'the body is not valid JSON' });
    }
  });

  it('check every escape: a malformed one is not JSON, in a wanted value a malformed token; they never throw', () => {
    for (const doc of ['{"a":"\\q"}', '{"a":"\\u12"}', '{"a":"\\u12g4"}', '{"a":["\\x"]}', '{"\\q":1}', '{"a":"\\', '{"a":"\\u00']) {
      expect(jsonBodyFields(Buffer.from(doc), w, 100), doc).toEqual({ error: 'the body is not valid JSON' });
    }
    for (const doc of ['{"tok":"\\q"}', '{"tok":"\\u12"}', '{"TOK":"ab\\u00"}', '{"tok":"a\nb"}']) {
      const found = jsonBodyFields(Buffer.from(doc), w, 100) as Map<string, BodyField>;
      expect(found.get('tok'), doc).toEqual({ count: 1, value: null, problem: 'is not a valid JSON string' });
    }
    // A name is what it decodes to only when its escapes are JSON's: "t\ok" names nothing.
    expect(jsonBodyFields(Buffer.from('{"t\\ok":"a"}'), w, 100)).toEqual({ error: 'the body is not valid JSON' });
    const ok = jsonBodyFields(Buffer.from('{"t\\u006Fk":"\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9"}'), w, 100) as Map<string, BodyField>;
    expect(ok.get('tok')!.value).toBe('"\\/\b\f\n\r\t\u00e9');
  });

  it('compare names in one pass whatever the wanted names share (hash, then bytes)', () => {
    const long = 'a'.repeat(127);
    const w4 = wantedFields([`${long}b`, `${long}c`, `${long}d`, `${long}E`]);
    const body = `{"${long}z":1,"${long.toUpperCase()}e":"x","${long}c":"y","${long}f":2}`;
    const found = jsonBodyFields(Buffer.from(body), w4, 100) as Map<string, BodyField>;
    expect([...found.entries()].map(([k, f]) => [k.slice(-1), f.value])).toEqual([
      ['e', 'x'],
      ['c', 'y'],
    ]);
    expect([...formBodyFields(Buffer.from(`${long}B=1&${long}g=2`), w4, 100).keys()].map((k) => k.slice(-1))).toEqual(['b']);
  });

  it('decode form fields as browsers encode them', () => {
    const f = formBodyFields(Buffer.from('a=1&&=x&TOK=a+b%2Bc%zz&other%5Fname&x=%F0%9F%98%80'), w, 100);
    expect([...f.entries()]).toEqual([
      ['tok', { count: 1, value: 'a b+c%zz', problem: '' }],
      ['other_name', { count: 1, value: '', problem: '' }],
    ]);
  });
});

describe('the JWK set registry', () => {
  /** A registry whose fetches succeed while `up`, on a clock the test moves. */
  function registry() {
    const t = { now: 1_000_000, up: true, fetches: [] as string[] };
    const reg = new JwksRegistry({
      now: () => t.now,
      fetch: (url) => {
        t.fetches.push(url.href);
        return t.up ? Promise.resolve({ keys: [], maxAgeMs: null } as FetchedJwks) : Promise.reject(new Error('IdP down'));
      },
    });
    return { t, reg };
  }
  const usable = async (reg: JwksRegistry, href: string) => 'set' in (await reg.get(href).current(undefined));
  const victim = 'https://idp.victim.example/jwks';

  it("keeps the sets the config names: another account's URLs cannot push one out (and with it its stale grace)", async () => {
    const { t, reg } = registry();
    reg.compiling({ version: 1 });
    expect(await usable(reg, victim)).toBe(true);
    t.up = false;
    t.now += 16 * 60_000; // expired a minute ago: used stale while refetches fail
    expect(await usable(reg, victim)).toBe(true);
    // The next config version: another account's many URLs (more than the old LRU's 1,000), and the victim's route.
    reg.compiling({ version: 2 });
    for (let i = 0; i < 1_500; i++) reg.get(`https://other.example/${i}`);
    expect(await usable(reg, victim)).toBe(true);
    expect(reg.size).toBe(1_501);
  });

  it('drops the sets the config no longer names, carries over those it still does', async () => {
    const { t, reg } = registry();
    const v1 = { version: 1 };
    reg.compiling(v1);
    const kept = reg.get('https://kept.example/jwks');
    const gone = reg.get('https://gone.example/jwks');
    reg.compiling(v1); // the same config compiled again: nothing changes
    expect([reg.get('https://kept.example/jwks'), reg.get('https://gone.example/jwks')]).toEqual([kept, gone]);
    reg.compiling({ version: 2 });
    expect(reg.get('https://kept.example/jwks')).toBe(kept);
    expect(reg.size).toBe(1);
    reg.compiling({ version: 3 });
    expect(reg.get('https://gone.example/jwks')).not.toBe(gone);
    expect(t.fetches).toEqual([]);
  });

  it('is told of each config by the traffic-policy stage', () => {
    const policy = (urls: string[]) => route({ inbound: [{ actions: [{ type: 'jwt-validation', config: config({}, { sources: { additional_jkus: urls } }) }] }] });
    const v1 = { ...CONFIG };
    const a1 = trafficPolicyStage(policy(['https://a.example/jwks']), EDGE, v1, deps()) as unknown as { policy: { inbound: { actions: CompiledJwtValidation[] }[] } };
    const set = a1.policy.inbound[0]!.actions[0]!.jkus[0]!;
    const again = trafficPolicyStage(policy(['https://a.example/jwks']), EDGE, { ...CONFIG }, deps()) as unknown as typeof a1;
    expect(again.policy.inbound[0]!.actions[0]!.jkus[0]).toBe(set);
  });
});
