import { generateKeyPairSync } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { parseTrafficPolicy, TrafficPolicyError, validateTrafficPolicy } from './parse.js';
import { checkJwksUrl, isNonPublicAddress, JWT_BODY_SCAN_COST, JWT_VALIDATION_LIMITS, jwtValidationCost } from './jwt-action.js';
import type { JwtValidationAction } from './types.js';

const rsa = (bits = 2048) => generateKeyPairSync('rsa', { modulusLength: bits }).publicKey.export({ format: 'jwk' }) as Record<string, unknown>;
const ec = (curve = 'P-256') => generateKeyPairSync('ec', { namedCurve: curve }).publicKey.export({ format: 'jwk' }) as Record<string, unknown>;
const ed = () => generateKeyPairSync('ed25519').publicKey.export({ format: 'jwk' }) as Record<string, unknown>;

type Cfg = Record<string, any>;
const base = (): Cfg => ({
  issuer: { allow_list: [{ value: 'https://issuer.example.com/' }] },
  audience: { allow_list: [{ value: 'urn:api' }] },
  http: { tokens: [{ type: 'jwt', method: 'header', name: 'Authorization', prefix: 'Bearer ' }] },
  jws: { allowed_algorithms: ['RS256'], keys: { sources: { additional_jkus: ['https://issuer.example.com/.well-known/jwks.json'] } } },
});
const doc = (config: unknown, direction = 'inbound') => ({ [direction]: [{ actions: [{ type: 'jwt-validation', config }] }] });
const save = (config: unknown, direction = 'inbound') => parseTrafficPolicy(JSON.stringify(doc(config, direction)));
const parsed = (config: unknown) => (save(config).inbound[0]!.actions[0] as JwtValidationAction).config;
function refused(config: unknown, direction = 'inbound'): string {
  try {
    save(config, direction);
  } catch (err) {
    expect(err).toBeInstanceOf(TrafficPolicyError);
    return (err as Error).message;
  }
  throw new Error('accepted');
}
const P = 'inbound[0].actions[0].config';

afterEach(() => {
  delete process.env.WARREN_JWKS_ALLOW_PRIVATE;
});

describe('jwt-validation config', () => {
  it('normalises ngrok’s document', () => {
    expect(parsed(base())).toEqual({
      issuers: ['https://issuer.example.com/'],
      audiences: ['urn:api'],
      tokens: [{ type: 'jwt', method: 'header', name: 'Authorization', prefix: 'Bearer ' }],
      algorithms: ['RS256'],
      requireKid: false,
      jkus: ['https://issuer.example.com/.well-known/jwks.json'],
      inlineKeys: [],
    });
  });

  it('requires audience when a policy is saved (as ngrok does); a policy stored without one still runs', () => {
    const c = base();
    delete c.audience;
    expect(refused(c)).toMatch(/^inbound\[0\]\.actions\[0\]\.config\.audience: is required/);
    c.audience = null;
    expect(refused(c)).toMatch(/config\.audience: is required/);
    // The ingress re-validates stored policies: one saved before audience was required keeps running (no aud check).
    delete c.audience;
    const stored = validateTrafficPolicy(doc(c)).inbound[0]!.actions[0] as JwtValidationAction;
    expect(stored.config.audiences).toBeNull();
  });

  it('accepts keys and sources as lists, identification by kid, inline keys', () => {
    const c = base();
    const key = { ...ec(), kid: 'k1', use: 'sig', alg: 'ES256' };
    c.jws = {
      allowed_algorithms: ['ES256', 'EdDSA'],
      keys: [{ identification: [{ token_claims: ['kid'] }], sources: [{ additional_jkus: ['https://a.example/jwks'] }, { inline_keys: [key, ed()] }] }],
    };
    const out = parsed(c);
    expect(out.audiences).toEqual(['urn:api']);
    expect(out.requireKid).toBe(true);
    expect(out.jkus).toEqual(['https://a.example/jwks']);
    expect(out.inlineKeys).toHaveLength(2);
    expect(out.inlineKeys[0]).toMatchObject({ kty: 'EC', crv: 'P-256', kid: 'k1', alg: 'ES256' });
    expect(out.inlineKeys[0]).not.toHaveProperty('use');
  });

  it.each<[string, (c: Cfg) => void, string]>([
    ['no issuer', (c) => delete c.issuer, `${P}.issuer: is required`],
    ['empty issuer list', (c) => (c.issuer.allow_list = []), `${P}.issuer.allow_list: must have at least one issuer`],
    ['issuer without value', (c) => (c.issuer.allow_list = [{}]), `${P}.issuer.allow_list[0].value: is required`],
    ['issuer not a URL', (c) => (c.issuer.allow_list = [{ value: 'not a url' }]), `${P}.issuer.allow_list[0].value: "not a url" is not a valid URL`],
    ['issuer twice', (c) => c.issuer.allow_list.push({ value: 'https://issuer.example.com/' }), `${P}.issuer.allow_list[1].value: "https://issuer.example.com/" is listed twice`],
    ['too many issuers', (c) => (c.issuer.allow_list = Array.from({ length: 17 }, (_, i) => ({ value: `https://i${i}.example` }))), `${P}.issuer.allow_list: must have at most 16 issuers, got 17`],
    ['empty audience list', (c) => (c.audience = { allow_list: [] }), `${P}.audience.allow_list: must have at least one audience`],
    ['audience mapping without allow_list', (c) => (c.audience = {}), `${P}.audience.allow_list: is required`],
    ['empty audience', (c) => (c.audience.allow_list = [{ value: '' }]), `${P}.audience.allow_list[0].value: must not be empty`],
    ['interpolated audience', (c) => (c.audience.allow_list = [{ value: '${req.host}' }]), `${P}.audience.allow_list[0].value: CEL interpolation`],
    ['unknown top-level key', (c) => (c.lifetime = {}), `${P}.lifetime: unknown field "lifetime"; supported: issuer, audience, http, jws`],
    ['unknown token key', (c) => (c.http.tokens[0].scheme = 'x'), `${P}.http.tokens[0].scheme: unknown field`],
    ['no tokens', (c) => (c.http.tokens = []), `${P}.http.tokens: must have at least one token`],
    ['five tokens', (c) => (c.http.tokens = Array.from({ length: 5 }, (_, i) => ({ type: 'jwt', method: 'header', name: `x-t${i}` }))), `${P}.http.tokens: must have at most 4 tokens, got 5`],
    ['bad token type', (c) => (c.http.tokens[0].type = 'saml'), `${P}.http.tokens[0].type: must be one of id_token, access_token, at+jwt, it+jwt, plain, jwt, got "saml"`],
    ['query method', (c) => (c.http.tokens[0].method = 'query'), `${P}.http.tokens[0].method: must be "header" or "body", got "query"`],
    ['method not a string', (c) => (c.http.tokens[0].method = 1), `${P}.http.tokens[0].method: must be "header" or "body", got 1`],
    ['bad body field name', (c) => (c.http.tokens[0] = { type: 'jwt', method: 'body', name: 'id token' }), `${P}.http.tokens[0].name: "id token" is not a valid body field name`],
    ['same body field twice', (c) => c.http.tokens.push({ type: 'jwt', method: 'body', name: 'tok' }, { type: 'jwt', method: 'body', name: 'TOK' }), `${P}.http.tokens[2].name: body field "TOK" is already read by ${P}.http.tokens[1]`],
    ['bad header name', (c) => (c.http.tokens[0].name = 'Auth orization'), `${P}.http.tokens[0].name: "Auth orization" is not a valid header name`],
    ['same header twice', (c) => c.http.tokens.push({ type: 'jwt', method: 'header', name: 'authorization' }), `${P}.http.tokens[1].name: header "authorization" is already read by ${P}.http.tokens[0]`],
    ['no algorithms', (c) => (c.jws.allowed_algorithms = []), `${P}.jws.allowed_algorithms: must have at least one algorithm`],
    ['none', (c) => (c.jws.allowed_algorithms = ['none']), `${P}.jws.allowed_algorithms[0]: "none" is not allowed`],
    ['HS256', (c) => (c.jws.allowed_algorithms = ['RS256', 'HS256']), `${P}.jws.allowed_algorithms[1]: HS256 is not supported: HMAC needs a shared secret`],
    ['unknown algorithm', (c) => (c.jws.allowed_algorithms = ['RS1']), `${P}.jws.allowed_algorithms[0]: "RS1" is not a supported algorithm`],
    ['algorithm twice', (c) => (c.jws.allowed_algorithms = ['RS256', 'RS256']), `${P}.jws.allowed_algorithms[1]: RS256 is listed twice`],
    ['no keys', (c) => delete c.jws.keys, `${P}.jws.keys: is required`],
    ['no key source', (c) => (c.jws.keys = { sources: {} }), `${P}.jws.keys.sources: needs at least one key source`],
    ['http JKU', (c) => (c.jws.keys.sources.additional_jkus = ['http://issuer.example.com/jwks']), `${P}.jws.keys.sources.additional_jkus[0]: must be an https URL, got "http:"`],
    ['JKU not a URL', (c) => (c.jws.keys.sources.additional_jkus = ['jwks.json']), `${P}.jws.keys.sources.additional_jkus[0]: "jwks.json" is not a valid URL`],
    ['JKU with credentials', (c) => (c.jws.keys.sources.additional_jkus = ['https://u:p@issuer.example.com/jwks']), `${P}.jws.keys.sources.additional_jkus[0]: must not hold credentials`],
    ['JKU with a fragment', (c) => (c.jws.keys.sources.additional_jkus = ['https://issuer.example.com/jwks#x']), `${P}.jws.keys.sources.additional_jkus[0]: must not have a fragment`],
    ['JKU twice', (c) => c.jws.keys.sources.additional_jkus.push('https://issuer.example.com/.well-known/jwks.json'), `${P}.jws.keys.sources.additional_jkus[1]: is already listed at`],
    ['nine JKUs', (c) => (c.jws.keys.sources.additional_jkus = Array.from({ length: 9 }, (_, i) => `https://k${i}.example/jwks`)), `${P}.jws.keys.sources.additional_jkus[8]: at most 8 JWK set URLs are allowed`],
    ['loopback JKU', (c) => (c.jws.keys.sources.additional_jkus = ['https://127.0.0.1:8443/jwks']), `${P}.jws.keys.sources.additional_jkus[0]: 127.0.0.1 is not a public address; JWK sets are fetched by the shared ingress`],
    ['link-local JKU', (c) => (c.jws.keys.sources.additional_jkus = ['https://169.254.169.254/latest']), 'is not a public address'],
    ['private IPv6 JKU', (c) => (c.jws.keys.sources.additional_jkus = ['https://[fd00::1]/jwks']), 'fd00::1 is not a public address'],
    ['localhost JKU', (c) => (c.jws.keys.sources.additional_jkus = ['https://localhost/jwks']), 'localhost is a loopback host name'],
    ['identification other than kid', (c) => (c.jws.keys.identification = { token_claims: ['x5t'] }), `${P}.jws.keys.identification.token_claims[0]: only "kid" is supported`],
    ['unknown source key', (c) => (c.jws.keys.sources.jwks_uri = 'x'), `${P}.jws.keys.sources.jwks_uri: unknown field`],
    ['private key', (c) => (c.jws.keys.sources.inline_keys = [generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey.export({ format: 'jwk' })]), `${P}.jws.keys.sources.inline_keys[0].d: is a private key member`],
    ['symmetric key', (c) => (c.jws.keys.sources.inline_keys = [{ kty: 'oct', k: 'c2VjcmV0' }]), 'symmetric (oct) keys are not supported'],
    ['1024-bit RSA', (c) => (c.jws.keys.sources.inline_keys = [rsa(1024)]), `${P}.jws.keys.sources.inline_keys[0].n: the RSA modulus must have 2048 to 4096 bits, got 1024`],
    ['key for no allowed algorithm', (c) => (c.jws.keys.sources.inline_keys = [ec()]), `${P}.jws.keys.sources.inline_keys[0]: this EC P-256 key fits none of jws.allowed_algorithms (RS256)`],
    ['key alg not allowed', (c) => (c.jws.keys.sources.inline_keys = [{ ...rsa(), alg: 'RS512' }]), `${P}.jws.keys.sources.inline_keys[0].alg: RS512 is not in jws.allowed_algorithms`],
    ['encryption key', (c) => (c.jws.keys.sources.inline_keys = [{ ...rsa(), use: 'enc' }]), `${P}.jws.keys.sources.inline_keys[0].use: must be "sig"`],
    ['EC coordinate of the wrong size', (c) => ((c.jws.allowed_algorithms = ['ES256']), (c.jws.keys.sources.inline_keys = [{ ...ec(), x: 'AAAA' }])), `${P}.jws.keys.sources.inline_keys[0].x: must hold 32 bytes for P-256`],
    ['EC point not on the curve', (c) => ((c.jws.allowed_algorithms = ['ES256']), (c.jws.keys.sources.inline_keys = [{ ...ec(), y: ec().y }])), `${P}.jws.keys.sources.inline_keys[0]: is not a valid public key`],
  ])('refuses %s', (_, change, message) => {
    const c = base();
    change(c);
    expect(refused(c)).toContain(message);
  });

  it('runs on inbound rules only', () => {
    expect(refused(base(), 'outbound')).toBe('outbound[0].actions[0].type: jwt-validation can only be used in inbound rules (it runs on the request)');
  });

  it('refuses literal private JKU hosts only when saving, unless WARREN_JWKS_ALLOW_PRIVATE=1', () => {
    const c = base();
    c.jws.keys.sources.additional_jkus = ['https://127.0.0.1:8443/jwks'];
    expect(refused(c)).toContain('is not a public address');
    // The ingress re-validates stored policies without the check (its fetcher checks, with its own environment).
    expect(() => validateTrafficPolicy(doc(c))).not.toThrow();
    process.env.WARREN_JWKS_ALLOW_PRIVATE = '1';
    expect(parsed(c).jkus).toEqual(['https://127.0.0.1:8443/jwks']);
  });

  it('classifies addresses', () => {
    for (const a of ['127.0.0.1', '10.1.2.3', '172.31.0.1', '192.168.1.1', '169.254.169.254', '100.64.0.1', '0.0.0.0', '::1', '::', 'fe80::1%eth0', 'fc00::1', '::ffff:127.0.0.1', '::ffff:10.0.0.1', '224.0.0.1']) expect(isNonPublicAddress(a), a).toBe(true);
    for (const a of ['8.8.8.8', '1.1.1.1', '2606:4700:4700::1111', '::ffff:8.8.8.8', 'example.com']) expect(isNonPublicAddress(a), a).toBe(false);
    // IPv6 forms that carry an IPv4 address: IPv4-compatible (::a.b.c.d), IPv4-translated,
    // local-use NAT64, 6to4. URL writes [::127.0.0.1] as [::7f00:1].
    for (const a of ['::7f00:1', '::127.0.0.1', '::ffff:0:7f00:1', '64:ff9b:1::a00:1', '2002:7f00:1::1', '2002:a00:1::1']) expect(isNonPublicAddress(a), a).toBe(true);
    expect(checkJwksUrl('https://[::127.0.0.1]/x', true)).toMatchObject({ ok: false });
    expect(checkJwksUrl('https://[::ffff:7f00:1]/x', true)).toMatchObject({ ok: false });
    expect(checkJwksUrl('https://2130706433/x', true)).toMatchObject({ ok: false }); // 127.0.0.1 in decimal, normalised by URL
    expect(checkJwksUrl('https://sub.localhost./x', true)).toMatchObject({ ok: false });
    expect(checkJwksUrl('https://login.example.com/x', true)).toMatchObject({ ok: true });
  });
});

describe('jwt-validation cost', () => {
  it('refuses RSA keys whose public exponent would make a verification cost far more than priced', () => {
    // A 3072-bit modulus with a 3071-bit exponent: OpenSSL bounds the exponent only above 3072
    // bits, and one verification took ~6.9 ms, 17× the 400 µs charged per RSA verification.
    const k = rsa(3072);
    const nBytes = Buffer.from(k.n as string, 'base64url').length;
    const c = base();
    c.jws.keys = { sources: { inline_keys: [{ ...k, e: Buffer.alloc(nBytes - 1, 0xff).toString('base64url') }] } };
    expect(refused(c)).toBe(`${P}.jws.keys.sources.inline_keys[0].e: the RSA public exponent must have 2 to 32 bits (65537 is usual), got 3064`);
    c.jws.keys = { sources: { inline_keys: [{ ...k, e: 'AQ' }] } };
    expect(refused(c)).toContain('the RSA public exponent must have 2 to 32 bits');
    for (const e of ['AQAB', 'Aw', 'AAEAAQ', '_____w']) {
      c.jws.keys = { sources: { inline_keys: [{ ...k, e }] } };
      expect(() => save(c), e).not.toThrow();
    }
  });

  it('reads tokens from headers (the default method) and body fields, one token per method and name', () => {
    const c = base();
    c.http.tokens = [
      { type: 'access_token', name: 'Authorization', prefix: 'Bearer ' },
      { type: 'it+jwt', method: 'body', name: '_id_token' },
      { type: 'jwt', method: 'body', name: 'authorization', prefix: 'JWT ' },
    ];
    expect(parsed(c).tokens).toEqual([
      { type: 'access_token', method: 'header', name: 'Authorization', prefix: 'Bearer ' },
      { type: 'it+jwt', method: 'body', name: '_id_token', prefix: '' },
      { type: 'jwt', method: 'body', name: 'authorization', prefix: 'JWT ' },
    ]);
  });

  it('charges each token for its decoding and the slowest allowed algorithm, tried on a few keys', () => {
    const c = parsed(base());
    expect(jwtValidationCost(c)).toBe(150_000 + JWT_VALIDATION_LIMITS.maxKeyAttempts * 400_000);
    const es512 = base();
    es512.jws.allowed_algorithms = ['RS256', 'ES512'];
    expect(jwtValidationCost(parsed(es512))).toBe(150_000 + JWT_VALIDATION_LIMITS.maxKeyAttempts * 2_400_000);
    // Body tokens: one scan of the body for them all.
    const body = base();
    body.http.tokens = ['a', 'b'].map((name) => ({ type: 'jwt', method: 'body', name }));
    expect(jwtValidationCost(parsed(body))).toBe(JWT_BODY_SCAN_COST + 2 * (150_000 + JWT_VALIDATION_LIMITS.maxKeyAttempts * 400_000));
  });

  it('refuses a policy whose tokens would cost too much together', () => {
    const c = base();
    c.jws.allowed_algorithms = ['ES384'];
    c.http.tokens = ['a', 'b', 'c'].map((n) => ({ type: 'jwt', method: 'header', name: `x-token-${n}` }));
    expect(refused(c)).toMatch(/^inbound\[0\]\.actions\[0\]\.config: jwt-validation: verifying 3 tokens \(ES384\) is estimated at .* more than the .* allowed for a policy$/);
    // The same action with one token fits.
    c.http.tokens = c.http.tokens.slice(0, 1);
    expect(() => save(c)).not.toThrow();
  });

  it('types and bounds the result variables for later rules', () => {
    const policy = {
      inbound: [
        { actions: [{ type: 'jwt-validation', config: base() }] },
        {
          expressions: ["actions.ngrok.jwt_validation.tokens.size() > 0 && actions.ngrok.jwt_validation.tokens[0].verified && actions.ngrok.jwt_validation.tokens[0].payload['sub'] == 'alice'"],
          actions: [{ type: 'add-headers', config: { headers: { 'x-sub': "${actions.ngrok.jwt_validation.tokens[0].payload['sub']}", 'x-kid': "${actions.service.jwt_validation.tokens[0].header['kid']} ${actions.ngrok.jwt_validation.tokens[0].location_property} ${actions.ngrok.jwt_validation.error.code}" } } }],
        },
      ],
    };
    expect(() => parseTrafficPolicy(JSON.stringify(policy))).not.toThrow();
    expect(() => parseTrafficPolicy(JSON.stringify({ inbound: [{ expressions: ['actions.ngrok.jwt_validation.tokens[0].nope'], actions: [{ type: 'deny' }] }] }))).toThrow(TrafficPolicyError);
  });
});

describe('JWK set URLs per policy', () => {
  const withJkus = (urls: string[]) => ({ ...base(), jws: { allowed_algorithms: ['RS256'], keys: { sources: { additional_jkus: urls } } } });
  const policy = (lists: string[][]) => JSON.stringify({ inbound: lists.map((urls) => ({ actions: [{ type: 'jwt-validation', config: withJkus(urls) }] })) });
  const urls = (from: number, n: number) => Array.from({ length: n }, (_, i) => `https://k${from + i}.example/jwks`);

  it(`are at most ${JWT_VALIDATION_LIMITS.maxJkusPerPolicy} distinct over all the jwt-validation actions (the ingress keeps every set the config names)`, () => {
    expect(JWT_VALIDATION_LIMITS.maxJkusPerPolicy).toBe(16);
    // 16 distinct, and the same URLs named again by other actions, are fine.
    expect(() => parseTrafficPolicy(policy([urls(0, 8), urls(8, 8), urls(0, 8), urls(4, 8)]))).not.toThrow();
    let err: unknown;
    try {
      parseTrafficPolicy(policy([urls(0, 8), urls(8, 8), urls(15, 2)]));
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(TrafficPolicyError);
    expect((err as TrafficPolicyError).path).toBe('inbound[2].actions[0].config.jws.keys');
    expect((err as Error).message).toContain('too many JWK set URLs: a policy names at most 16 distinct additional_jkus URLs over all its jwt-validation actions, this one takes it to 17');
    // Checked where the policy is validated again (the ingress), not only when saved.
    expect(() => validateTrafficPolicy(JSON.parse(policy([urls(0, 8), urls(8, 8), urls(16, 1)])) as unknown)).toThrow(TrafficPolicyError);
  });
});
