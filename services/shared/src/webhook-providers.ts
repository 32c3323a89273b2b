import { createPublicKey } from 'node:crypto';

/**
 * Webhook verification providers (wire-conventions.md §12); matched case-insensitively. Shared by
 * the route module `webhook_verification` (control plane schema) and the traffic-policy action
 * `verify-webhook` (`traffic-policy/body-actions.ts`); the ingress verifies each of them but
 * `UNVERIFIABLE_WEBHOOK_PROVIDERS` (services/ingress/src/modules/webhook-verification.ts).
 */
export const WEBHOOK_PROVIDERS = [
  'aftership', 'airship', 'alchemy', 'autodesk', 'bitbucket', 'bolt', 'box', 'brex', 'buildkite', 'calendly', 'castle', 'chargify', 'circleci',
  'clearbit', 'clerk', 'coinbase', 'contentful', 'docusign', 'dropbox',
  'facebook_graph_api', 'facebook_messenger', 'frameio', 'github', 'gitlab', 'go1', 'graphcms', 'heroku', 'hostedhooks', 'hubspot', 'instagram',
  'intercom', 'jira', 'launch_darkly', 'linear',
  'mailchimp', 'mailgun', 'microsoft_teams', 'modern_treasury', 'mongodb', 'mux', 'orb', 'orbit', 'pagerduty', 'pinwheel', 'plivo', 'pusher',
  'sendgrid', 'sentry', 'shopify', 'signal_sciences', 'slack', 'sns', 'sonatype', 'square', 'stripe', 'svix',
  'terraform', 'tiktok', 'trendmicro_conformity', 'twilio', 'twitter', 'typeform', 'vmware', 'webex', 'whatsapp', 'worldline', 'xero', 'zendesk', 'zoom',
] as const;

const SET = new Set<string>(WEBHOOK_PROVIDERS);

export function isWebhookProvider(p: string): boolean {
  return SET.has(p.toLowerCase());
}

/** The one provider that signs without a shared secret (AWS SNS uses its own certificates). */
export const SECRETLESS_PROVIDER = 'sns';

/**
 * Providers ngrok lists whose signing schemes are not published, so the ingress cannot verify
 * them: a `webhook_verification` module naming one is saved but its route answers 503
 * (ERR_WARREN_7010); a traffic policy's `verify-webhook` action naming one is refused when saved.
 */
export const UNVERIFIABLE_WEBHOOK_PROVIDERS: readonly string[] = ['orbit', 'vmware'];

/** True when `secret` is a base64 DER (SPKI) ECDSA public key, the SendGrid verification key format. */
export function isBase64EcdsaPublicKey(secret: string): boolean {
  const compact = secret.replace(/\s+/g, '');
  if (!/^[A-Za-z0-9+/]+={0,2}$/.test(compact) || compact.length % 4 !== 0) return false;
  try {
    const key = createPublicKey({ key: Buffer.from(compact, 'base64'), format: 'der', type: 'spki' });
    return key.asymmetricKeyType === 'ec';
  } catch {
    return false;
  }
}

/**
 * Providers whose secret is a base64 key (the ingress decodes it): Standard Webhooks / Svix
 * (`whsec_<base64>`, the prefix optional) and Microsoft Teams' security token; and Trend Micro
 * Conformity, whose webhook security token accepts only base64 characters (it is the HMAC key
 * as written, not decoded: cloudone.trendmicro.com/docs/conformity/webhook-communication), so no
 * other token can be the one Conformity signs with. Returns what is wrong with `secret` for
 * `provider`, or null; checked when the route is saved, so a bad secret is a 400 here rather than
 * a route the ingress cannot serve.
 */
export function base64SecretProblem(provider: string, secret: string): string | null {
  const kind = provider.toLowerCase();
  const b64 = (v: string) => v.length > 0 && /^[A-Za-z0-9+/_-]+={0,2}$/.test(v) && Buffer.from(v, 'base64').length > 0;
  if (kind === 'svix' || kind === 'clerk' || kind === 'brex') {
    const v = secret.startsWith('whsec_') ? secret.slice(6) : secret;
    return b64(v) ? null : `the ${kind} secret must be the signing secret whsec_<base64>`;
  }
  if (kind === 'microsoft_teams') return b64(secret.trim()) ? null : 'the microsoft_teams secret must be the base64 security token';
  if (kind === 'trendmicro_conformity')
    return /^[A-Za-z0-9+/=]+$/.test(secret) ? null : 'the trendmicro_conformity secret must be the webhook security token (base64 characters only)';
  return null;
}
