/**
 * Validation of the body actions `verify-webhook` and `compress-response` (the ingress runs
 * them: `services/ingress/src/policy/body-actions.ts`). Semantics follow ngrok's:
 * - https://ngrok.com/docs/traffic-policy/actions/verify-webhook/
 * - https://ngrok.com/docs/traffic-policy/actions/compress-response/
 *
 * `verify-webhook` is checked exactly as the route module `webhook_verification` is when a route
 * is saved (the provider list and secret checks are shared: `../webhook-providers.ts`): the
 * provider must be one ngrok lists (case-insensitive), `sns` takes no secret and every other
 * provider needs one, SendGrid's must be its base64 ECDSA public key, and the Svix family's,
 * Microsoft Teams' and Trend Micro Conformity's must be base64.
 *
 * Where Warren differs, the policy is refused with a 400 rather than run differently:
 * - `verify-webhook` runs on `inbound` rules only, `compress-response` on `outbound` rules only;
 * - `secret` takes no CEL interpolation (`${…}`; ngrok reads secrets from its vaults with it,
 *   Warren has none): write the secret itself;
 * - `orbit` and `vmware`, which ngrok lists but whose signing schemes are not published, are
 *   refused (the route module accepts them and its route then answers 503);
 * - `compress-response` `algorithms` accepts `br`, `gzip` and `deflate`; `compress` (LZW), which
 *   ngrok lists, has no implementation in Node's zlib and is refused naming the element. Left
 *   out, `algorithms` is ngrok's default without `compress`: gzip, deflate, br.
 *
 * Error messages never quote a secret.
 */
import { base64SecretProblem, isBase64EcdsaPublicKey, isWebhookProvider, SECRETLESS_PROVIDER, UNVERIFIABLE_WEBHOOK_PROVIDERS, WEBHOOK_PROVIDERS } from '../webhook-providers.js';
import { at, expectList, expectObj, noUnknownKeys, parseEnforce, TrafficPolicyError, typeName } from './parse.js';
import type { CompressResponseAction, PolicyDirection, VerifyWebhookAction } from './types.js';

/** Codings `compress-response` can apply (Node's zlib), in the order ngrok lists its default. */
export const COMPRESS_ALGORITHMS = ['gzip', 'deflate', 'br'] as const;
export type CompressAlgorithm = (typeof COMPRESS_ALGORITHMS)[number];

export const VERIFY_WEBHOOK_LIMITS = {
  /** Characters of a secret (a SendGrid PEM public key is about 180); ngrok documents no bound. */
  secretChars: 8192,
} as const;

/**
 * What one run of `verify-webhook` costs (≈ ns), charged to the policy's total (`parse.ts`
 * `checkCost`): an HMAC over the largest body the ingress buffers (1 MiB, HMAC-SHA256 measured at
 * ~0.6 ms), rounded up. A policy may then hold about four of them.
 * Not covered (review note): providers that parse the body before comparing a signature (mailgun's
 * JSON or form fields, twilio / mailchimp / plivo's sorted form fields, at most
 * `MAX_SORTED_FORM_FIELDS` in the ingress, sns's JSON) do linear work over it, measured at
 * ~10-20 ms for an unsigned 1 MiB body.
 */
export const VERIFY_WEBHOOK_COST = 1_000_000;

/** The path of the action's `type`, from the path of its `config`. */
function typePath(configPath: string): string {
  return configPath.endsWith('.config') ? `${configPath.slice(0, -'.config'.length)}.type` : configPath;
}

/**
 * `verify-webhook` config: `provider` (required, one of `WEBHOOK_PROVIDERS`, stored lower-case),
 * `secret` (required but for `sns`, which takes none) and `enforce` (default true).
 */
export function parseVerifyWebhookConfig(raw: unknown, path: string, direction: PolicyDirection): VerifyWebhookAction['config'] {
  if (direction !== 'inbound') throw new TrafficPolicyError(typePath(path), 'verify-webhook can only be used in inbound rules (it checks the request)');
  const c = expectObj(raw, path, 'config');
  noUnknownKeys(c, path, ['provider', 'secret', 'enforce']);
  const enforce = parseEnforce(c.enforce, at(path, 'enforce'));

  const pp = at(path, 'provider');
  if (c.provider === undefined || c.provider === null) throw new TrafficPolicyError(pp, 'is required');
  if (typeof c.provider !== 'string') throw new TrafficPolicyError(pp, `must be a string, got ${typeName(c.provider)}`);
  if (!isWebhookProvider(c.provider)) throw new TrafficPolicyError(pp, `${JSON.stringify(c.provider.slice(0, 64))} is not a supported webhook provider; supported: ${WEBHOOK_PROVIDERS.join(', ')}`);
  const provider = c.provider.toLowerCase();
  if (UNVERIFIABLE_WEBHOOK_PROVIDERS.includes(provider)) throw new TrafficPolicyError(pp, `${provider} signs webhooks in a way that is not published, so Warren cannot verify them`);

  const sp = at(path, 'secret');
  const given = c.secret;
  if (given !== undefined && given !== null && typeof given !== 'string') throw new TrafficPolicyError(sp, `must be a string, got ${typeName(given)}`);
  const secret = given ?? '';
  if (provider === SECRETLESS_PROVIDER) {
    if (secret) throw new TrafficPolicyError(sp, 'provider sns verifies with AWS certificates and takes no secret; leave it out');
    return { provider, secret: '', enforce };
  }
  if (!secret) throw new TrafficPolicyError(sp, `is required for provider ${provider}`);
  if (secret.includes('${')) throw new TrafficPolicyError(sp, 'CEL interpolation (${…}) is not supported in verify-webhook secrets; write the secret itself');
  if (secret.length > VERIFY_WEBHOOK_LIMITS.secretChars) throw new TrafficPolicyError(sp, `must have at most ${VERIFY_WEBHOOK_LIMITS.secretChars} characters`);
  if (provider === 'sendgrid' && !isBase64EcdsaPublicKey(secret)) throw new TrafficPolicyError(sp, 'the sendgrid secret must be the base64 ECDSA public verification key');
  const problem = base64SecretProblem(provider, secret);
  if (problem) throw new TrafficPolicyError(sp, problem);
  return { provider, secret, enforce };
}

/**
 * `compress-response` config: `algorithms`, a non-empty list of distinct codings among
 * `COMPRESS_ALGORITHMS` (case-insensitive, stored lower-case); left out (or the whole config left
 * out), all three.
 */
export function parseCompressResponseConfig(raw: unknown, path: string, direction: PolicyDirection): CompressResponseAction['config'] {
  if (direction !== 'outbound') throw new TrafficPolicyError(typePath(path), 'compress-response can only be used in outbound rules (it compresses the response)');
  if (raw === undefined || raw === null) return { algorithms: [...COMPRESS_ALGORITHMS] };
  const c = expectObj(raw, path, 'config');
  noUnknownKeys(c, path, ['algorithms']);
  if (c.algorithms === undefined || c.algorithms === null) return { algorithms: [...COMPRESS_ALGORITHMS] };
  const ap = at(path, 'algorithms');
  const list = expectList(c.algorithms, ap, false);
  if (list.length === 0) throw new TrafficPolicyError(ap, 'must have at least one algorithm (leave the field out for gzip, deflate and br)');
  const seen = new Map<string, number>();
  const algorithms = list.map((e, i) => {
    const p = at(ap, i);
    if (typeof e !== 'string') throw new TrafficPolicyError(p, `must be a string, got ${typeName(e)}`);
    const v = e.toLowerCase();
    if (v === 'compress') throw new TrafficPolicyError(p, '"compress" (LZW) is not supported by Warren; use gzip, deflate or br');
    if (!(COMPRESS_ALGORITHMS as readonly string[]).includes(v)) throw new TrafficPolicyError(p, `${JSON.stringify(e.slice(0, 64))} is not a supported algorithm; supported: br, deflate, gzip`);
    const earlier = seen.get(v);
    if (earlier !== undefined) throw new TrafficPolicyError(p, `${v} is already listed at ${at(ap, earlier)}`);
    seen.set(v, i);
    return v as CompressAlgorithm;
  });
  return { algorithms };
}
