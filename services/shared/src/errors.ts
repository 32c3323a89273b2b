/**
 * The one table of Warren error codes (wire-conventions.md §3). Each code maps to its HTTP
 * status and a default message; the domain throws `AppError(code)` and transports map it.
 */
export const ERRORS = {
  1000: { status: 401, msg: 'missing Authorization header' },
  1001: { status: 401, msg: 'Authorization must be a Bearer credential' },
  1002: { status: 401, msg: 'the API key is unknown, revoked or malformed' },
  1003: { status: 401, msg: 'an agent authtoken was sent instead of an API key' },
  1004: { status: 401, msg: 'the agent authtoken is unknown or revoked' },
  1100: { status: 403, msg: 'operation not permitted' },
  1101: { status: 403, msg: 'the account is disabled' },
  1110: { status: 403, msg: 'the account quota for this resource type is reached' },
  2000: { status: 400, msg: 'the Service-Version header is required; send Service-Version: 2' },
  2001: { status: 400, msg: 'unsupported API version; send Service-Version: 2' },
  2010: { status: 405, msg: 'method not allowed' },
  2020: { status: 415, msg: 'Content-Type must be application/json' },
  2021: { status: 413, msg: 'the request body is over 1 MiB' },
  2100: { status: 400, msg: 'the request body must be a JSON object' },
  2101: { status: 400, msg: 'unknown field' },
  2102: { status: 400, msg: 'wrong JSON type' },
  2103: { status: 400, msg: 'required field missing' },
  2104: { status: 400, msg: 'value not allowed' },
  2105: { status: 400, msg: 'fields that must come together or exclude each other' },
  2200: { status: 400, msg: 'unknown query parameter' },
  2201: { status: 400, msg: 'repeated query parameter' },
  2202: { status: 400, msg: 'limit must be an integer from 1 to 100' },
  2203: { status: 400, msg: 'malformed pagination cursor' },
  2204: { status: 400, msg: 'before_id and beforeId differ' },
  3000: { status: 400, msg: 'malformed id' },
  3001: { status: 400, msg: 'wrong id prefix for this field' },
  3002: { status: 400, msg: 'referenced id not found in this account' },
  4000: { status: 404, msg: 'no such path' },
  4001: { status: 404, msg: 'no such resource' },
  4002: { status: 404, msg: 'the module is not configured' },
  4100: { status: 409, msg: 'the resource is still referenced' },
  4101: { status: 409, msg: 'the value is already in use' },
  4102: { status: 409, msg: 'the last API key of the account cannot be deleted' },
  4200: { status: 400, msg: 'the field cannot change after create' },
  5000: { status: 400, msg: 'description is over 255 bytes' },
  5001: { status: 400, msg: 'metadata is over 4096 bytes' },
  5002: { status: 400, msg: 'the list is too long' },
  5003: { status: 400, msg: 'the string is too long' },
  6000: { status: 400, msg: 'invalid reserved address' },
  6100: { status: 400, msg: 'invalid labels' },
  6200: { status: 400, msg: 'invalid certificate authority PEM' },
  6201: { status: 400, msg: 'the certificate is not a certificate authority' },
  6300: { status: 400, msg: 'invalid HTTPS edge' },
  6301: { status: 400, msg: 'too many hostports' },
  6400: { status: 400, msg: 'invalid route' },
  6401: { status: 400, msg: 'invalid route module' },
  6402: { status: 400, msg: 'at most one of oauth, saml and oidc may be configured' },
  6403: { status: 400, msg: 'too many routes on this edge' },
  6500: { status: 400, msg: 'invalid event destination' },
  6501: { status: 400, msg: 'invalid ARN' },
  6600: { status: 400, msg: 'invalid event subscription' },
  6601: { status: 400, msg: 'unknown event source type' },
  6700: { status: 400, msg: 'invalid IP policy rule' },
  6701: { status: 400, msg: 'too many rules in this IP policy' },
  6800: { status: 400, msg: 'invalid credential' },
  6900: { status: 400, msg: 'invalid traffic policy' },
  7000: { status: 404, msg: 'no endpoint is configured for this host' },
  7001: { status: 404, msg: 'no route of this edge matches the request' },
  7002: { status: 502, msg: 'the route has no enabled backend' },
  7003: { status: 503, msg: 'no tunnel is online for this endpoint' },
  7004: { status: 502, msg: 'the tunnel failed to carry the request to the agent' },
  7005: { status: 504, msg: 'the upstream service did not answer in time' },
  7006: { status: 503, msg: 'too many requests are waiting for this tunnel' },
  7007: { status: 400, msg: 'the request has no valid Host header' },
  7008: { status: 503, msg: 'this ingress has no configuration yet' },
  7009: { status: 413, msg: 'the request body is over 1 MiB, the most this route can verify' },
  7010: { status: 503, msg: 'this route has a configuration the ingress cannot apply' },
  7011: { status: 400, msg: 'the request cannot be forwarded as it is' },
  7012: { status: 408, msg: 'the request body did not arrive in time (this route reads the whole body before forwarding it)' },
  7013: { status: 503, msg: 'this ingress holds as many request bodies for its routes as it may at once; retry shortly' },
  7014: { status: 429, msg: 'this client has too many requests open to this tunnel; retry when some have finished' },
  7100: { status: 403, msg: 'the client IP address is not allowed by the IP restriction of this route' },
  7101: { status: 403, msg: 'the User-Agent is not allowed by the user agent filter of this route' },
  7102: { status: 403, msg: 'the webhook verification of this route failed' },
  7103: { status: 503, msg: 'the circuit breaker of this route is open' },
  7104: { status: 403, msg: 'a valid client certificate is required by this edge' },
  7105: { status: 426, msg: 'this route accepts only WebSocket connections' },
  7106: { status: 401, msg: 'sign-in through the OpenID provider of this route is required' },
  7107: { status: 502, msg: 'the OpenID provider of this route could not be reached' },
  7108: { status: 400, msg: 'the sign-in through the OpenID provider could not be completed' },
  7109: { status: 403, msg: 'the signed-in user is not allowed by the sign-in rules of this route' },
  7110: { status: 400, msg: 'the SAML sign-in request is not valid' },
  7111: { status: 400, msg: 'the SAML response of the identity provider was not accepted' },
  7112: { status: 400, msg: 'the SAML single logout message or hand-off was not accepted' },
  7113: { status: 421, msg: 'this edge requires a newer TLS version than this connection uses (tls_termination min_version); retry on a new connection' },
  7114: { status: 421, msg: 'this edge is served over HTTPS only, not over plain HTTP; retry over HTTPS on a new connection' },
  7120: { status: 403, msg: 'the client IP address is not allowed by the traffic policy of this route (restrict-ips)' },
  7121: { status: 401, msg: 'valid credentials are required by the traffic policy of this route (basic-auth)' },
  7122: { status: 401, msg: 'a valid JSON Web Token is required by the traffic policy of this route (jwt-validation)' },
  7123: { status: 503, msg: 'the signing keys for the JWT validation of this route could not be fetched' },
  7125: { status: 403, msg: 'the webhook signature was not verified by the traffic policy of this route (verify-webhook)' },
  8000: { status: 429, msg: 'management API rate limit exceeded' },
  8001: { status: 429, msg: 'the agent session starts tunnels faster than this server allows; retry later' },
  9000: { status: 500, msg: 'internal error' },
  9001: { status: 503, msg: 'the database is unavailable' },
  9002: { status: 503, msg: 'the server is starting or draining' },
  9003: { status: 503, msg: 'no free TCP address is left for this host; try again later or configure another TCP_ADDR_HOST' },
} as const satisfies Record<number, { status: number; msg: string }>;

export type ErrorCode = keyof typeof ERRORS;

/** Wire name of a code, e.g. `ERR_WARREN_2101`. */
export function errorCodeName(code: ErrorCode): string {
  return `ERR_WARREN_${code}`;
}

/**
 * A domain error carrying a Warren error code. `details` values are strings only (the Go
 * client decodes a string→string map); `field` names the JSON path of the offending value.
 */
export class AppError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly details: Record<string, string>;
  readonly headers: Record<string, string>;

  constructor(
    code: ErrorCode,
    message?: string,
    opts: { field?: string; param?: string; resourceId?: string; headers?: Record<string, string> } = {},
  ) {
    super(message ?? ERRORS[code].msg);
    this.name = 'AppError';
    this.code = code;
    this.status = ERRORS[code].status;
    this.details = {};
    if (opts.field !== undefined) this.details.field = opts.field;
    if (opts.param !== undefined) this.details.param = opts.param;
    if (opts.resourceId !== undefined) this.details.resource_id = opts.resourceId;
    this.headers = opts.headers ?? {};
  }
}

/** Shorthand for a 404 on a resource that is missing or belongs to another account. */
export function notFound(what: string, id: string): AppError {
  const shown = id.length > 64 ? `${id.slice(0, 64)}…` : id;
  return new AppError(4001, `no ${what} with id ${JSON.stringify(shown)}`, { resourceId: shown });
}
