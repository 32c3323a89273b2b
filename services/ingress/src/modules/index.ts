import { trafficPolicyStage } from '../policy/index.js';
import type { StageFactory } from '../pipeline/types.js';
import { circuitBreakerStage } from './circuit-breaker.js';
import { compressionStage } from './compression.js';
import { ipRestrictionStage } from './ip-restriction.js';
import { oauthStage } from './oauth.js';
import { oidcStage } from './oidc.js';
import { samlStage } from './saml.js';
import { requestHeadersStage } from './request-headers.js';
import { responseHeadersStage } from './response-headers.js';
import { userAgentFilterStage } from './user-agent-filter.js';
import { webhookVerificationStage } from './webhook-verification.js';
import { websocketTcpConverterStage } from './websocket-tcp-converter.js';

/**
 * The route modules as pipeline stages, in the order they run on a request (the edge's
 * `mutualTlsStage` goes before all of them):
 *
 * 1. ip_restriction — cheapest refusal first, before any other work or body buffering;
 * 2. user_agent_filter — header-only refusal;
 * 3. oauth / oidc / saml — sign-in (a cookie check on the hot path), before any body is buffered; it sets
 *    the identity headers that later stages and the traffic policy may read (a route has at most
 *    one of them);
 * 4. webhook_verification — buffers and authenticates the body;
 * 5. websocket_tcp_converter — refuses non-WebSocket requests of a converter route;
 * 6. circuit_breaker — after every refusal, so that only requests that would reach the
 *    upstream are admitted (and a half-open probe is not spent on a refused request);
 * 7. request_headers — edits what is sent on, after the checks that read client headers;
 * 8. response_headers — on the response;
 * 9. compression — last on the response (transformBody sees the final head).
 *
 * The traffic policy runs after the security checks, before the circuit breaker. backend is
 * routing, not a stage.
 */
export const routeStageFactories: Array<{ module: string; factory: StageFactory }> = [
  { module: 'ip_restriction', factory: ipRestrictionStage },
  { module: 'user_agent_filter', factory: userAgentFilterStage },
  { module: 'oauth', factory: oauthStage },
  { module: 'oidc', factory: oidcStage },
  { module: 'saml', factory: samlStage },
  { module: 'webhook_verification', factory: webhookVerificationStage },
  { module: 'websocket_tcp_converter', factory: websocketTcpConverterStage },
  { module: 'circuit_breaker', factory: circuitBreakerStage },
  { module: 'request_headers', factory: requestHeadersStage },
  { module: 'response_headers', factory: responseHeadersStage },
  { module: 'compression', factory: compressionStage },
];

/**
 * Every stage factory of a route in run order: the module stages with the traffic policy after the security checks (it may refuse with 429 or
 * deny) and before the circuit breaker counts anything.
 */
export const pipelineStageFactories: StageFactory[] = [];
for (const { module, factory } of routeStageFactories) {
  if (module === 'websocket_tcp_converter') pipelineStageFactories.push(trafficPolicyStage);
  pipelineStageFactories.push(factory);
}

export { moduleError, type ModuleErrorCode } from './common.js';
export { ipRestrictionStage, ipAllowed, normalizeClientIp } from './ip-restriction.js';
export { userAgentFilterStage, compileUserAgentPattern } from './user-agent-filter.js';
export { oidcStage, createOidcStage, type OidcOptions } from './oidc.js';
export { DiscoveryCache } from './oidc-discovery.js';
export { oauthStage, createOAuthStage, type OAuthOptions } from './oauth.js';
export { samlStage, createSamlStage, type SamlOptions } from './saml.js';
export { webhookVerificationStage, createWebhookVerificationStage, SUPPORTED_WEBHOOK_PROVIDERS, TIMESTAMP_TOLERANCE_MS, type WebhookVerificationOptions } from './webhook-verification.js';
export { SnsCertificateCache, fetchCertificate, isSnsCertificateUrl, type CertificateFetcher } from './webhook-sns.js';
export { circuitBreakerStage, createCircuitBreakerStage, CircuitBreaker, type CircuitBreakerSettings, type CircuitState } from './circuit-breaker.js';
export { requestHeadersStage } from './request-headers.js';
export { responseHeadersStage } from './response-headers.js';
export { compressionStage, negotiateEncoding, MIN_LENGTH as COMPRESSION_MIN_LENGTH } from './compression.js';
export { websocketTcpConverterStage, isWebSocketTcpConverter, type WebSocketTcpConverterStage } from './websocket-tcp-converter.js';
export { acceptWebSocketAsTcp, checkWebSocketUpgrade, WebSocketHandshakeError, type AcceptOptions } from './websocket-tcp.js';
export { mutualTlsStage, mutualTlsCaPems, verifyClientChain } from './mutual-tls.js';
export { edgeSecureContextOptions } from './tls-termination.js';
