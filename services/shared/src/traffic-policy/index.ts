export * from './types.js';
export { parseDurationNs } from './duration.js';
export { HEADER_ACTION_LIMITS, MAX_TRAFFIC_POLICY_BYTES, RATE_LIMIT_COST, RATE_LIMIT_LIMITS, SUPPORTED_ACTION_TYPES, rateLimitCost, TrafficPolicyError, decodeTrafficPolicy, parseTrafficPolicy, validateTrafficPolicy, type ValidateOptions } from './parse.js';
export { MAX_EXPRESSION_COST, MAX_POLICY_COST, REQUEST_LIMITS, RESPONSE_LIMITS, TLS_LIMITS, estimateCost } from './cost.js';
export { MAX_MATCH_INPUT } from './regex.js';
export { BASIC_AUTH_LIMITS, DEFAULT_BASIC_AUTH_REALM, IP_POLICY_MAX_RULES, RESTRICT_IPS_LIMITS, restrictIpsPolicyRefs } from './access-actions.js';
export { JWKS_ALLOW_PRIVATE_ENV, JWT_ALGORITHMS, JWT_TOKEN_TYPES, JWT_VALIDATION_LIMITS, checkJwksUrl, checkPublicJwk, isNonPublicAddress, jwksHostRefusal, jwksPrivateAllowed, nonPublicHostRefusal, privateHostRefusal, privateHostsAllowed, urlHost } from './jwt-action.js';
export { CelJwtToken, CelJwtValidation, CelJwtValidationError, JWT_MAX_TOKENS } from './jwt-action-vars.js';
export { LOG_LIMITS, SET_VARS_LIMITS, VARS_LIMITS, celUintValue, isCelDuration, varValueWeight } from './var-actions.js';
export { CelCompileError, compileExpression, parseTemplate, type CelProgram, type TemplatePart } from './cel.js';
export {
  REDIRECT_STATUS_CODES,
  URL_ACTION_LIMITS,
  UrlActionRuntimeError,
  UrlTemplateError,
  applyUrlTemplate,
  compileUrlTemplate,
  type UrlActionErrorCode,
  type UrlTemplate,
  type UrlTemplateResult,
} from './url-actions.js';
export { CelUrlActionError, CelUrlActionResult } from './url-action-vars.js';
export { COMPRESS_ALGORITHMS, VERIFY_WEBHOOK_COST, VERIFY_WEBHOOK_LIMITS, type CompressAlgorithm } from './body-actions.js';
export { CelCompress, CelVerifyWebhook, CelVerifyWebhookError } from './body-action-vars.js';
export { CIRCUIT_BREAKER_COST, CIRCUIT_BREAKER_DEFAULTS, CIRCUIT_BREAKER_LIMITS, CLOSE_CONNECTION_COST, FORWARD_INTERNAL_LIMITS, forwardInternalHost } from './flow-actions.js';
export { FIND_REPLACE_BODY_COST, FIND_REPLACE_LIMITS, FIND_REPLACE_TEMPLATE_LIMITS, FIND_REPLACE_WORKER_LIMITS, applyFindReplace, compileFindReplace, findReplaceCost, type FindReplaceBounds, type FindReplaceType } from './find-replace.js';
export {
  CEL_NO_TLS,
  CEL_TIME,
  CelActionResults,
  CelAddHeaders,
  CelActions,
  CelCertificate,
  CelCertificateExtension,
  CelCertificateValidity,
  CelClientCertificate,
  CelConn,
  CelEndpoint,
  CelDistinguishedName,
  CelRateLimit,
  CelRateLimitError,
  CelRequest,
  CelResponse,
  CelSubjectAltNames,
  CelTime,
  CelTls,
  CelUrl,
  headerMap,
  headerValues,
  type CelRequestInit,
  type CelResponseInit,
  type CelConnSocket,
  type CelConnFacts,
  type CelRequestMessage,
  type CelTlsSocket,
} from './cel-vars.js';
export { MAX_CERTIFICATE_BYTES } from './x509.js';
export { CEL_NO_GEO, CelGeo, GEO_LIMITS, GEO_LOOKUP_COST } from './geo-vars.js';
export { AUTH_ACTION_COST, AUTH_ACTION_LIMITS, OAUTH_PROVIDERS, OIDC_ALLOW_PRIVATE_ENV, issuerProblem, oidcPrivateAllowed, type AuthActionConfig, type OAuthAction, type OAuthProviderKind, type OpenIdConnectAction } from './auth-actions.js';
export { AUTH_IDENTITY_MAX_CHARS, CelAuthError, CelOAuth, CelOAuthIdentity, CelOidc, CelOidcIdentity, recordAuthRun, type AuthRunResult } from './auth-action-vars.js';
export { hasBlankTrafficPolicySecrets, mergeTrafficPolicySecrets, redactTrafficPolicySecrets } from './secrets.js';
export { goTimeText } from './cel-values.js';
