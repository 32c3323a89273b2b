import { fromTemporaryCredentials } from '@aws-sdk/credential-providers';
import { NodeHttpHandler } from '@smithy/node-http-handler';
import type { AwsCredentialIdentity, AwsCredentialIdentityProvider } from '@smithy/types';
import http from 'node:http';
import https from 'node:https';
import { trustedContext } from './http.js';
import type { LoadedDestination, SendOutcome, TargetEnv } from './types.js';
import { Secrets, errorText, looksTooLarge, neverConnected, retryAfterMs, timeoutOf, unknownFor5xx } from './util.js';

/**
 * What the three AWS targets share: ARN parsing, client configuration (region from the ARN,
 * static or assumed-role credentials, HTTP/1.1 keep-alive handler, no SDK retries), one SDK call
 * under a deadline, and the mapping of SDK errors to outcomes.
 *
 * How SDK v3 errors surface (3.11xx): a service error is thrown as a ServiceException whose
 * `name` is the error code (`__type` / `x-amzn-ErrorType`, e.g. ResourceNotFoundException, or
 * AccessDenied for STS), with `$metadata.httpStatusCode` and `$fault`. Network failures are the
 * plain Node errors (`code` ECONNREFUSED, ECONNRESET…) from the handler, without an HTTP status;
 * the handler renames ECONNRESET / EPIPE / ETIMEDOUT errors to `name: 'TimeoutError'` (keeping
 * `code`), the name of its own timeouts too; an abort is `name: 'AbortError'`. The raw answer is
 * on the non-enumerable `$response` (headers included). Errors from the credential provider (STS
 * AssumeRole) propagate unchanged from the signing step, so the provider is wrapped to tag them
 * (CredentialsError). NodeHttpHandler's `requestTimeout` only logs a warning unless
 * `throwOnRequestTimeout` is set, and covers only the wait for the answer's headers: awsCall puts
 * its own deadline around the whole call.
 */

export interface StoredAwsAuth {
  role: { role_arn: string } | null;
  creds: { aws_access_key_id: string; aws_secret_access_key: string } | null;
}

export interface ParsedArn {
  partition: string;
  service: string;
  region: string;
  account: string;
  resource: string;
}

const ARN_RE = /^arn:(aws[a-z-]*):([a-z0-9-]+):([a-z0-9-]+):(\d{12}):(.+)$/;

export function parseArn(arn: string, service: string): ParsedArn {
  const m = ARN_RE.exec(arn);
  if (!m) throw new Error(`not an ARN: ${arn}`);
  const parsed = { partition: m[1]!, service: m[2]!, region: m[3]!, account: m[4]!, resource: m[5]! };
  if (parsed.service !== service) throw new Error(`ARN service ${parsed.service} is not ${service}: ${arn}`);
  return parsed;
}

/** Credentials could not be obtained (STS AssumeRole failed, or no base identity). */
export class CredentialsError extends Error {
  constructor(override readonly cause: unknown) {
    super(`credentials: ${errorText(cause)}`);
    this.name = 'CredentialsError';
  }
}

/** `warren-<destId>`, at most 64 characters of [\w+=,.@-] (STS RoleSessionName). */
export function roleSessionName(destId: string): string {
  return `warren-${destId}`.replace(/[^\w+=,.@-]/g, '-').slice(0, 64);
}

export function makeHandler(env: TargetEnv): NodeHttpHandler {
  const timeout = timeoutOf(env);
  // One TLS context for every connection (see trustedContext), not `ca`, which rebuilds it per connection.
  const ca = env.caPem ? { secureContext: trustedContext(env.caPem) } : {};
  return new NodeHttpHandler({
    requestTimeout: timeout,
    throwOnRequestTimeout: true, // without it this handler version only logs a warning
    connectionTimeout: Math.min(timeout, 10_000),
    httpAgent: new http.Agent({ keepAlive: true, maxSockets: 16 }),
    httpsAgent: new https.Agent({ keepAlive: true, maxSockets: 16, ...ca }),
  });
}

export interface AwsClientParts {
  config: {
    region: string;
    endpoint?: string;
    credentials: AwsCredentialIdentity | AwsCredentialIdentityProvider;
    maxAttempts: number;
    requestHandler: NodeHttpHandler;
  };
  /** handlers to destroy on close (the STS one is not reachable through the client) */
  extraHandlers: NodeHttpHandler[];
}

/**
 * Client configuration for one destination. `role` auth: AssumeRole with ExternalId = the
 * account id and RoleSessionName `warren-<destId>`, 1 h sessions; the SDK memoizes the
 * provider's result and calls it again when less than 5 minutes remain before `Expiration`
 * (@smithy/core memoizeIdentityProvider, EXPIRATION_MS = 300 000), so credentials are refreshed
 * before they expire; a failed AssumeRole is tried again on the next call.
 */
export function awsClientParts(dest: LoadedDestination, env: TargetEnv, auth: StoredAwsAuth, region: string, secrets: Secrets): AwsClientParts {
  const requestHandler = makeHandler(env);
  const endpoint = env.awsEndpoint ? { endpoint: env.awsEndpoint } : {};
  if (auth.creds) {
    secrets.add(auth.creds.aws_secret_access_key);
    return {
      config: { region, ...endpoint, maxAttempts: 1, requestHandler, credentials: { accessKeyId: auth.creds.aws_access_key_id, secretAccessKey: auth.creds.aws_secret_access_key } },
      extraHandlers: [],
    };
  }
  if (!auth.role?.role_arn) throw new Error('neither role nor creds auth');
  const base = env.awsBaseCredentials;
  if (base) secrets.add(base.secretAccessKey, base.sessionToken);
  const stsHandler = makeHandler(env);
  const assume = fromTemporaryCredentials({
    params: { RoleArn: auth.role.role_arn, RoleSessionName: roleSessionName(dest.id), ExternalId: dest.accountId, DurationSeconds: 3600 },
    ...(base ? { masterCredentials: { accessKeyId: base.accessKeyId, secretAccessKey: base.secretAccessKey, ...(base.sessionToken ? { sessionToken: base.sessionToken } : {}) } } : {}),
    clientConfig: { region, ...endpoint, maxAttempts: 1, requestHandler: stsHandler },
  });
  const credentials: AwsCredentialIdentityProvider = async (props) => {
    try {
      const c = await assume(props);
      secrets.addTemporary(c.secretAccessKey, c.sessionToken);
      return c;
    } catch (err) {
      throw new CredentialsError(err);
    }
  };
  return { config: { region, ...endpoint, maxAttempts: 1, requestHandler, credentials }, extraHandlers: [stsHandler] };
}

/**
 * One SDK client per destination, built lazily and rebuilt after `invalidate()`. With `role`
 * auth the SDK keeps the assumed-role credentials until 5 minutes before their Expiration; if the
 * target refuses them earlier (session revoked, ExpiredToken because of clock skew) the only
 * public way to drop them is a new client, hence invalidate().
 */
export class AwsClientHolder<C extends { destroy(): void }> {
  private current: { client: C; parts: AwsClientParts } | undefined;
  readonly secrets = new Secrets();
  readonly usesRole: boolean;
  constructor(
    private readonly build: (config: AwsClientParts['config']) => C,
    private readonly dest: LoadedDestination,
    private readonly env: TargetEnv,
    private readonly auth: StoredAwsAuth,
    private readonly region: string,
  ) {
    this.usesRole = !auth.creds;
    this.get(); // configuration errors surface at creation
  }
  get(): C {
    if (!this.current) {
      const parts = awsClientParts(this.dest, this.env, this.auth, this.region, this.secrets);
      this.current = { client: this.build(parts.config), parts };
    }
    return this.current.client;
  }
  invalidate(): void {
    this.close();
  }
  close(): void {
    const c = this.current;
    this.current = undefined;
    if (!c) return;
    c.client.destroy();
    for (const h of c.parts.extraHandlers) h.destroy();
  }
}

/** Temporary credentials refused by the target: worth a fresh AssumeRole before pausing. */
const STALE_CREDENTIALS = new Set(['ExpiredTokenException', 'ExpiredToken', 'UnrecognizedClientException', 'InvalidClientTokenId', 'InvalidSignatureException', 'SignatureDoesNotMatch']);

/**
 * classifyAwsError plus credential hygiene: with `role` auth, a refusal of the temporary
 * credentials drops the client (next send assumes the role again); an expired token is then a
 * plain retry rather than a pause.
 */
export function classifyWithHolder(what: string, result: { error: unknown; state: CallState }, timeoutMs: number, holder: AwsClientHolder<{ destroy(): void }>): SendOutcome {
  const outcome = classifyAwsError(what, result, timeoutMs, holder.secrets);
  const name = errName(result.error);
  if (holder.usesRole && !(result.error instanceof CredentialsError) && STALE_CREDENTIALS.has(name) && !isClockSkew(result.error)) {
    holder.invalidate();
    if (name === 'ExpiredTokenException' || name === 'ExpiredToken') return { kind: 'retry', reason: `${'reason' in outcome ? outcome.reason : name} (temporary credentials dropped)`, unknownOutcome: false };
  }
  return outcome;
}

interface SendsCommands {
  send(command: never, options?: { abortSignal?: AbortSignal }): Promise<unknown>;
}
interface HasMiddleware {
  middlewareStack: { add(mw: unknown, opts: { step: string; name: string; priority?: string }): void };
}

export interface CallState {
  /** the signed request went to the HTTP handler */
  reachedNetwork: boolean;
  timedOut: boolean;
  callerAborted: boolean;
}

export type CallResult<T> = { ok: true; value: T } | { ok: false; error: unknown; state: CallState };

/**
 * One SDK call under a deadline (the handler's timeouts do not cover credential resolution nor
 * reading the answer body). Never throws.
 */
export async function awsCall<T>(client: unknown, command: unknown, timeoutMs: number, signal?: AbortSignal): Promise<CallResult<T>> {
  const state: CallState = { reachedNetwork: false, timedOut: false, callerAborted: false };
  if (signal?.aborted) return { ok: false, error: new Error('aborted before sending'), state: { ...state, callerAborted: true } };
  (command as HasMiddleware).middlewareStack.add(
    (next: (args: unknown) => Promise<unknown>) => async (args: unknown) => {
      state.reachedNetwork = true;
      return next(args);
    },
    { step: 'deserialize', name: 'warrenReachedNetwork', priority: 'low' },
  );
  const ac = new AbortController();
  let timer: NodeJS.Timeout | undefined;
  let onAbort: (() => void) | undefined;
  const stop = new Promise<never>((_, reject) => {
    onAbort = () => {
      state.callerAborted = true;
      ac.abort();
      reject(new Error('aborted'));
    };
    signal?.addEventListener('abort', onAbort, { once: true });
    timer = setTimeout(() => {
      state.timedOut = true;
      ac.abort();
      reject(new Error(`no answer within ${timeoutMs} ms`));
    }, timeoutMs);
  });
  stop.catch(() => {});
  try {
    const p = (client as SendsCommands).send(command as never, { abortSignal: ac.signal });
    p.catch(() => {});
    return { ok: true, value: (await Promise.race([p, stop])) as T };
  } catch (error) {
    return { ok: false, error, state };
  } finally {
    clearTimeout(timer);
    if (onAbort) signal?.removeEventListener('abort', onAbort);
  }
}

export function errName(err: unknown): string {
  return (err as { name?: string } | null)?.name ?? '';
}
export function errStatus(err: unknown): number | undefined {
  return (err as { $metadata?: { httpStatusCode?: number } } | null)?.$metadata?.httpStatusCode;
}
function errMessage(err: unknown): string {
  return (err as { message?: string } | null)?.message ?? String(err);
}

const THROTTLE = new Set([
  'ThrottlingException', 'Throttling', 'ThrottledException', 'TooManyRequestsException', 'RequestLimitExceeded', 'SlowDown',
  'ProvisionedThroughputExceededException', 'KMSThrottlingException', 'LimitExceededException', 'ServiceUnavailableException', 'ServiceUnavailable', 'RequestThrottled', 'RequestThrottledException',
]);
const AUTH = new Set([
  'AccessDenied', 'AccessDeniedException', 'InvalidSignatureException', 'SignatureDoesNotMatch', 'IncompleteSignature', 'IncompleteSignatureException',
  'UnrecognizedClientException', 'InvalidClientTokenId', 'MissingAuthenticationToken', 'MissingAuthenticationTokenException',
  'ExpiredToken', 'ExpiredTokenException', 'InvalidAccessKeyId', 'NotAuthorized', 'AuthFailure', 'OptInRequired', 'InvalidKMSResourceException',
  'ResourceNotFoundException', 'RegionDisabledException', 'CredentialsProviderError', 'MalformedPolicyDocument', 'PackedPolicyTooLarge',
]);
/** Clock skew refusals (JSON services say InvalidSignatureException "Signature expired: …"). */
const CLOCK_SKEW_NAMES = new Set(['RequestTimeTooSkewed', 'RequestExpired', 'RequestInTheFuture']);
const CLOCK_SKEW_RE = /signature expired|signature not yet current|too skewed|clock skew/i;
export function isClockSkew(err: unknown): boolean {
  return CLOCK_SKEW_NAMES.has(errName(err)) || CLOCK_SKEW_RE.test(errMessage(err));
}
const BAD_REQUEST = new Set(['InvalidArgumentException', 'ValidationException', 'InvalidParameterException', 'SerializationException', 'InvalidParameterValueException', 'ValidationError']);

/** Maps a failed SDK call to an outcome. `what` names the call in the reason (e.g. "Kinesis PutRecords"). */
export function classifyAwsError(what: string, result: { error: unknown; state: CallState }, timeoutMs: number, secrets: Secrets): SendOutcome {
  const { error, state } = result;
  const scrub = (s: string) => secrets.scrub(s);

  if (error instanceof CredentialsError) {
    const cause = error.cause;
    const name = errName(cause);
    const status = errStatus(cause);
    const text = scrub(`${what}: AssumeRole failed: ${errorText(cause)}`);
    if (THROTTLE.has(name) || status === 429) return { kind: 'throttled', reason: text };
    if (name === 'CredentialsProviderError' || AUTH.has(name) || (status !== undefined && status >= 400 && status < 500)) return { kind: 'auth', reason: text };
    // STS unreachable or 5xx: nothing reached the target
    return { kind: 'retry', reason: text, unknownOutcome: false };
  }

  if (state.callerAborted) return { kind: 'retry', reason: `${what}: aborted`, unknownOutcome: state.reachedNetwork };
  if (state.timedOut) return { kind: 'retry', reason: `${what}: no answer within ${timeoutMs} ms`, unknownOutcome: state.reachedNetwork };

  const name = errName(error);
  const status = errStatus(error);
  const text = scrub(`${what}: ${errorText(error)}${status ? ` (HTTP ${status})` : ''}`);

  if (status === undefined || status === 200) {
    // no answer, or an answer that could not be read
    if (status === 200) return { kind: 'retry', reason: text, unknownOutcome: true };
    if (name === 'AbortError') return { kind: 'retry', reason: text, unknownOutcome: state.reachedNetwork };
    if (name === 'TimeoutError' && /establish a connection/.test(errMessage(error))) return { kind: 'retry', reason: text, unknownOutcome: false };
    return { kind: 'retry', reason: text, unknownOutcome: state.reachedNetwork && !neverConnected(error) };
  }
  if (CLOCK_SKEW_NAMES.has(name) || CLOCK_SKEW_RE.test(errMessage(error))) {
    // the SDK has already taken its clock offset from this answer's Date: the next call is signed right
    return { kind: 'retry', reason: text, unknownOutcome: false };
  }
  if (THROTTLE.has(name) || status === 429) {
    // the raw answer hangs off the error (non-enumerable `$response`); AWS rarely sends Retry-After
    const after = retryAfterMs((error as { $response?: { headers?: Record<string, string> } }).$response?.headers?.['retry-after']);
    return { kind: 'throttled', reason: text, ...(after !== undefined ? { retryAfterMs: after } : {}) };
  }
  if (status === 413) return { kind: 'too_large', reason: text };
  if (AUTH.has(name) || status === 401 || status === 403) return { kind: 'auth', reason: text };
  if (name.startsWith('KMS')) return { kind: 'auth', reason: text };
  if (status >= 500) return { kind: 'retry', reason: text, unknownOutcome: unknownFor5xx(status) };
  if (BAD_REQUEST.has(name) || status === 400) return looksTooLarge(errMessage(error)) ? { kind: 'too_large', reason: text } : { kind: 'rejected', reason: text };
  return { kind: 'rejected', reason: text };
}
