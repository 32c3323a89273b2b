import { createPublicKey } from 'node:crypto';

/** Webhook verification providers (wire-conventions.md §12); matched case-insensitively. */
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
