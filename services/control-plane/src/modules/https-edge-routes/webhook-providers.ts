/** The webhook provider list and secret checks live in @warren/shared (the traffic policy's verify-webhook action validates with them too). */
export { WEBHOOK_PROVIDERS, SECRETLESS_PROVIDER, UNVERIFIABLE_WEBHOOK_PROVIDERS, base64SecretProblem, isBase64EcdsaPublicKey, isWebhookProvider } from '@warren/shared';
