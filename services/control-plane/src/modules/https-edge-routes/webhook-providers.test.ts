import { describe, expect, it } from 'vitest';
import { base64SecretProblem, isWebhookProvider, WEBHOOK_PROVIDERS } from './webhook-providers.js';

describe('webhook providers', () => {
  it('matches provider names case-insensitively', () => {
    for (const p of ['plivo', 'Orb', 'GraphCMS', 'go1', 'hostedhooks', 'pinwheel', 'signal_sciences', 'TrendMicro_Conformity']) expect(isWebhookProvider(p)).toBe(true);
    expect(isWebhookProvider('myhooks')).toBe(false);
    expect(new Set(WEBHOOK_PROVIDERS).size).toBe(WEBHOOK_PROVIDERS.length);
  });

  it('base64 secrets: svix family, microsoft_teams, trendmicro_conformity', () => {
    expect(base64SecretProblem('svix', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw')).toBeNull();
    expect(base64SecretProblem('clerk', 'not base64!')).toMatch(/whsec_/);
    expect(base64SecretProblem('microsoft_teams', 'c2VjdXJpdHktdG9rZW4=')).toBeNull();
    // Conformity accepts only base64 characters in its webhook security token (cloudone.trendmicro.com/docs/conformity/webhook-communication).
    expect(base64SecretProblem('trendmicro_conformity', 'c2VjdXJpdHkrdG9rZW4/MTIz==')).toBeNull();
    expect(base64SecretProblem('TrendMicro_Conformity', 'token-with_dashes')).toMatch(/base64 characters/);
    expect(base64SecretProblem('trendmicro_conformity', 'has space')).toMatch(/base64 characters/);
    // Providers keyed with the secret as written take any text.
    for (const p of ['plivo', 'orb', 'graphcms', 'go1', 'hostedhooks', 'pinwheel', 'signal_sciences']) expect(base64SecretProblem(p, 'any secret: !*#')).toBeNull();
  });
});
