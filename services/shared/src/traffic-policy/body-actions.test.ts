import { generateKeyPairSync } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { oneAction, refusal } from './testing.js';
import { WEBHOOK_PROVIDERS, UNVERIFIABLE_WEBHOOK_PROVIDERS } from '../webhook-providers.js';
import { COMPRESS_ALGORITHMS, VERIFY_WEBHOOK_LIMITS } from './body-actions.js';
import { compileExpression, parseTrafficPolicy, validateTrafficPolicy } from './index.js';
import { estimateCost, MAX_EXPRESSION_COST } from './cost.js';

const fails = (doc: unknown) => refusal(doc, true);
const one = oneAction;
const vw = (config: unknown) => one({ type: 'verify-webhook', config });
const cr = (config: unknown) => one({ type: 'compress-response', config }, 'outbound');
const P = 'inbound[0].actions[0].config';
const O = 'outbound[0].actions[0].config';
const SECRET = 'whsec-very-secret-value';

describe('verify-webhook config', () => {
  it('parses provider (case-insensitive, stored lower-case), secret and enforce (default true)', () => {
    const p = parseTrafficPolicy(`
inbound:
  - actions:
      - type: verify-webhook
        config: {provider: GitHub, secret: "${SECRET}"}
      - type: verify-webhook
        config: {provider: stripe, secret: whsec_abc, enforce: false}
      - type: verify-webhook
        config: {provider: sns}
`);
    expect(p.inbound[0]!.actions).toEqual([
      { type: 'verify-webhook', config: { provider: 'github', secret: SECRET, enforce: true } },
      { type: 'verify-webhook', config: { provider: 'stripe', secret: 'whsec_abc', enforce: false } },
      { type: 'verify-webhook', config: { provider: 'sns', secret: '', enforce: true } },
    ]);
  });

  it('accepts every provider ngrok lists that the ingress can verify, with a secret of the right form', () => {
    const sendgridKey = generateKeyPairSync('ec', { namedCurve: 'P-256' }).publicKey.export({ type: 'spki', format: 'der' }).toString('base64');
    const secretFor = (p: string) =>
      p === 'sns' ? undefined : p === 'sendgrid' ? sendgridKey : ['svix', 'clerk', 'brex'].includes(p) ? 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw' : 'c2VjcmV0LXRva2Vu';
    const usable = WEBHOOK_PROVIDERS.filter((p) => !UNVERIFIABLE_WEBHOOK_PROVIDERS.includes(p));
    expect(usable.length).toBeGreaterThan(60);
    for (const provider of usable) expect(validateTrafficPolicy(vw({ provider, secret: secretFor(provider) }), { checkCost: true }).inbound[0]!.actions[0]).toMatchObject({ config: { provider } });
  });

  it.each([
    [vw({ secret: SECRET }), `${P}.provider`, 'is required'],
    [vw({ provider: 'myhooks', secret: SECRET }), `${P}.provider`, '"myhooks" is not a supported webhook provider; supported: aftership, airship'],
    [vw({ provider: 7, secret: SECRET }), `${P}.provider`, 'must be a string, got number'],
    [vw({ provider: 'Orbit', secret: SECRET }), `${P}.provider`, 'orbit signs webhooks in a way that is not published'],
    [vw({ provider: 'vmware', secret: SECRET }), `${P}.provider`, 'not published'],
    [vw({ provider: 'github' }), `${P}.secret`, 'is required for provider github'],
    [vw({ provider: 'github', secret: '' }), `${P}.secret`, 'is required for provider github'],
    [vw({ provider: 'github', secret: 42 }), `${P}.secret`, 'must be a string, got number'],
    [vw({ provider: 'sns', secret: SECRET }), `${P}.secret`, 'provider sns verifies with AWS certificates and takes no secret'],
    [vw({ provider: 'sendgrid', secret: SECRET }), `${P}.secret`, 'the sendgrid secret must be the base64 ECDSA public verification key'],
    [vw({ provider: 'svix', secret: 'not base64!' }), `${P}.secret`, 'the svix secret must be the signing secret whsec_<base64>'],
    [vw({ provider: 'microsoft_teams', secret: 'not base64!' }), `${P}.secret`, 'base64 security token'],
    [vw({ provider: 'trendmicro_conformity', secret: 'has space' }), `${P}.secret`, 'base64 characters only'],
    [vw({ provider: 'stripe', secret: "${vars.secret}" }), `${P}.secret`, 'CEL interpolation (${…}) is not supported'],
    [vw({ provider: 'stripe', secret: 'x'.repeat(VERIFY_WEBHOOK_LIMITS.secretChars + 1) }), `${P}.secret`, `must have at most ${VERIFY_WEBHOOK_LIMITS.secretChars} characters`],
    [vw({ provider: 'github', secret: SECRET, enforce: 'no' }), `${P}.enforce`, 'must be true or false, got string'],
    [vw({ provider: 'github', secret: SECRET, header: 'x' }), `${P}.header`, 'unknown field "header"; supported: provider, secret, enforce'],
    [one({ type: 'verify-webhook' }), P, 'is required'],
    [one({ type: 'verify-webhook', config: { provider: 'github', secret: SECRET } }, 'outbound'), 'outbound[0].actions[0].type', 'verify-webhook can only be used in inbound rules'],
  ])('refuses %j at %s, never quoting the secret', (doc, path, msg) => {
    const e = fails(doc);
    expect(e.path).toBe(path);
    expect(e.message).toContain(msg);
    expect(e.message).not.toContain(SECRET);
  });

  it("charges each run to the policy's cost: about four fit in a policy", () => {
    const doc = (n: number) => ({ inbound: Array.from({ length: n }, () => ({ actions: [{ type: 'verify-webhook', config: { provider: 'github', secret: SECRET } }] })) });
    expect(validateTrafficPolicy(doc(4), { checkCost: true }).inbound).toHaveLength(4);
    expect(fails(doc(6)).message).toMatch(/verify-webhook: checking a signature over the request body \(up to 1 MiB\) is estimated at 1\.00 ms .* more than the 5\.00 ms allowed/);
  });

  it('declares the result variables', () => {
    for (const e of [
      'actions.ngrok.verify_webhook.verified',
      "!actions.service.verify_webhook.verified && actions.ngrok.verify_webhook.error.code == 'verification_failed'",
      "actions.ngrok.verify_webhook.error.message.contains('timestamp')",
    ]) {
      const program = compileExpression('inbound', e);
      expect(estimateCost(program, { count: 0, bytes: 0 })).toBeLessThan(MAX_EXPRESSION_COST);
    }
    expect(compileExpression('outbound', 'actions.ngrok.verify_webhook.verified')).toBeTypeOf('function');
    expect(() => compileExpression('inbound', 'actions.ngrok.verify_webhook.valid')).toThrow();
  });
});

describe('compress-response config', () => {
  it('parses algorithms (case-insensitive) and defaults to gzip, deflate, br without a config or the field', () => {
    const p = parseTrafficPolicy(`
outbound:
  - actions:
      - type: compress-response
        config: {algorithms: [BR, gzip]}
      - type: compress-response
        config: {}
      - type: compress-response
`);
    expect(p.outbound[0]!.actions).toEqual([
      { type: 'compress-response', config: { algorithms: ['br', 'gzip'] } },
      { type: 'compress-response', config: { algorithms: ['gzip', 'deflate', 'br'] } },
      { type: 'compress-response', config: { algorithms: ['gzip', 'deflate', 'br'] } },
    ]);
    expect(COMPRESS_ALGORITHMS).toEqual(['gzip', 'deflate', 'br']);
  });

  it.each([
    // ngrok's own example lists `compress`: refused, naming the element.
    [cr({ algorithms: ['gzip', 'br', 'deflate', 'compress'] }), `${O}.algorithms[3]`, '"compress" (LZW) is not supported by Warren; use gzip, deflate or br'],
    [cr({ algorithms: ['zstd'] }), `${O}.algorithms[0]`, '"zstd" is not a supported algorithm; supported: br, deflate, gzip'],
    [cr({ algorithms: ['gzip', 'GZIP'] }), `${O}.algorithms[1]`, 'gzip is already listed at outbound[0].actions[0].config.algorithms[0]'],
    [cr({ algorithms: [] }), `${O}.algorithms`, 'must have at least one algorithm'],
    [cr({ algorithms: 'gzip' }), `${O}.algorithms`, 'must be a list, got string'],
    [cr({ algorithms: [1] }), `${O}.algorithms[0]`, 'must be a string, got number'],
    [cr({ level: 9 }), `${O}.level`, 'unknown field "level"; supported: algorithms'],
    [cr(['gzip']), O, 'config must be a mapping, got list'],
    [one({ type: 'compress-response', config: {} }), 'inbound[0].actions[0].type', 'compress-response can only be used in outbound rules'],
  ])('refuses %j at %s', (doc, path, msg) => {
    const e = fails(doc);
    expect(e.path).toBe(path);
    expect(e.message).toContain(msg);
  });

  it('declares the result variables (outbound)', () => {
    for (const e of ["actions.ngrok.compress.negotiated_algorithm == 'br'", '!actions.service.compress.already_compressed']) {
      const program = compileExpression('outbound', e);
      expect(estimateCost(program, { count: 0, bytes: 0 })).toBeLessThan(MAX_EXPRESSION_COST);
    }
    expect(() => compileExpression('outbound', 'actions.ngrok.compress.algorithm')).toThrow();
  });
});
