import { compileExpression, type BucketKeyElement, type CelProgram, type PolicyAction, type PolicyDirection, type PolicyRule, type TrafficPolicy } from '@warren/shared';
import { compileBasicAuth, compileRestrictIps, type CompiledBasicAuth, type CompiledRestrictIps, type IpPolicyRules } from './access-actions.js';
import { compileLog, compileSetVars, type CompiledLog, type CompiledSetVars } from './var-actions.js';
import { compileRedirect, compileUrlRewrite, type CompiledRedirect, type CompiledUrlRewrite } from './url-actions.js';
import { compileJwtValidation, type CompiledJwtValidation } from './jwt-action.js';
import { compileCompressResponse, compileVerifyWebhook, type CompiledCompressResponse, type CompiledVerifyWebhook } from './body-actions.js';
import { compileCircuitBreaker, type CompiledCircuitBreaker, type CompiledCloseConnection } from './flow-actions.js';
import { compileFindReplaceAction, type CompiledFindReplace } from './find-replace.js';
import { compileAuthAction, type AuthRouter, type CompiledAuthAction } from './auth-actions.js';
import { compileHeaderValue, compileTemplate, type HeaderValue, type TextTemplate } from './headers.js';
import { compileForwardInternal, type CompiledForwardInternal } from './forward-internal.js';

/**
 * A traffic policy compiled once per config version: every CEL expression parsed and
 * type-checked, every constant response and header list prepared, so a request only evaluates.
 */

export interface CompiledRateLimit {
  kind: 'rate-limit';
  /**
   * Bucket key prefix: route, direction and action name, JSON-encoded (unambiguous). A name that
   * an earlier rate-limit of the same direction already has (a policy stored before the control
   * plane refused that) adds the action's place, so that the two never share a bucket.
   */
  prefix: string;
  capacity: number;
  rateSeconds: number;
  bucketKey: BucketKeyElement[];
  /** false: a request over capacity is only marked (`limited`) and goes on to the next action. */
  enforce: boolean;
}


/** deny and custom-response: a response made here. Body and header values may interpolate (custom-response). */
export interface CompiledRespond {
  kind: 'respond';
  /** The action's place (`inbound[0].actions[1]`), for evaluation errors. */
  where: string;
  status: number;
  body: TextTemplate | undefined;
  headers: { name: string; value: HeaderValue }[] | undefined;
}

export interface CompiledAddHeaders {
  kind: 'add-headers';
  headers: { name: string; lower: string; value: HeaderValue }[];
  /**
   * Lower-case names whose existing values are dropped before adding: only `host`, on a request
   * (one Host, never a second). Every other header is appended after any of its name, as ngrok
   * does (remove-headers first to replace one).
   */
  replace: Set<string>;
  /**
   * Record what was added for `actions.ngrok.add_headers.headers_added`: only in a policy that
   * names `add_headers` somewhere (its expressions or interpolations), so that the many
   * policies that add headers and never read the result pay nothing per request.
   */
  record: boolean;
}

export interface CompiledRemoveHeaders {
  kind: 'remove-headers';
  lower: Set<string>;
}

export type CompiledAction = CompiledRateLimit | CompiledRespond | CompiledAddHeaders | CompiledRemoveHeaders | CompiledRestrictIps | CompiledBasicAuth | CompiledSetVars | CompiledLog | CompiledUrlRewrite | CompiledRedirect | CompiledJwtValidation | CompiledVerifyWebhook | CompiledCompressResponse | CompiledCircuitBreaker | CompiledCloseConnection | CompiledFindReplace | CompiledAuthAction | CompiledForwardInternal;

export interface CompiledRule {
  /** `inbound[0]`, for logs. */
  where: string;
  conditions: { where: string; program: CelProgram }[];
  actions: CompiledAction[];
  /**
   * The rule has a `deny` action: an expression that fails to evaluate (an error, or not a bool)
   * makes it apply rather than be skipped, so a deny that cannot be decided denies (fails closed).
   * Any other rule is skipped on such an error. Either way the error is counted and logged.
   */
  failClosed: boolean;
}

export interface CompiledPolicy {
  inbound: CompiledRule[];
  outbound: CompiledRule[];
  /** The special paths of the oauth / openid-connect actions, once bound to the route (`auth-actions.ts` `bindAuthActions`). */
  auth?: AuthRouter | null;
}

/**
 * `where`: the action's path in the policy (`inbound[0].actions[1]`), for evaluation errors and
 * rate-limit keys. `nameTaken`: a rate-limit whose name an earlier rate-limit of the direction
 * already has (its key takes `where` too). `ipPolicyRules`: for restrict-ips `ip_policies`.
 */
function compileAction(a: PolicyAction, routeId: string, direction: PolicyDirection, where: string, nameTaken: boolean, readsAddHeaders: boolean, ipPolicyRules?: IpPolicyRules): CompiledAction {
  switch (a.type) {
    case 'rate-limit':
      return {
        kind: 'rate-limit',
        prefix: `tp:${JSON.stringify(nameTaken ? [routeId, direction, a.config.name, where] : [routeId, direction, a.config.name])}`,
        capacity: a.config.capacity,
        rateSeconds: a.config.rateSeconds,
        bucketKey: a.config.bucketKey,
        enforce: a.config.enforce,
      };
    case 'deny':
      return { kind: 'respond', where, status: a.config.status_code, body: undefined, headers: undefined };
    case 'custom-response': {
      const headers = Object.entries(a.config.headers).map(([name, raw]) => ({ name, value: compileHeaderValue(raw, direction, true) }));
      return { kind: 'respond', where, status: a.config.status_code, body: compileTemplate(a.config.body, direction, true), headers: headers.length > 0 ? headers : undefined };
    }
    case 'add-headers': {
      const headers = Object.entries(a.config.headers).map(([name, raw]) => ({ name, lower: name.toLowerCase(), value: compileHeaderValue(raw, direction) }));
      const replace = new Set(direction === 'inbound' ? headers.map((h) => h.lower).filter((n) => n === 'host') : []);
      return { kind: 'add-headers', headers, replace, record: readsAddHeaders };
    }
    case 'remove-headers':
      return { kind: 'remove-headers', lower: new Set(a.config.headers.map((h) => h.toLowerCase())) };
    case 'restrict-ips':
      return compileRestrictIps(a.config, ipPolicyRules);
    case 'basic-auth':
      return compileBasicAuth(a.config);
    case 'set-vars':
      return compileSetVars(a.config, direction, where);
    case 'log':
      return compileLog(a.config, direction, where);
    case 'url-rewrite':
      return compileUrlRewrite(a.config, direction, where);
    case 'redirect':
      return compileRedirect(a.config, direction, where);
    case 'jwt-validation':
      return compileJwtValidation(a.config);
    case 'verify-webhook':
      return compileVerifyWebhook(a.config);
    case 'compress-response':
      return compileCompressResponse(a.config);
    case 'circuit-breaker':
      return compileCircuitBreaker(a.config, routeId, where);
    case 'close-connection':
      return { kind: 'close-connection' };
    case 'forward-internal':
      return compileForwardInternal(a.config, direction, where);
    case 'request-body-find-replace':
    case 'response-body-find-replace':
      return compileFindReplaceAction(a.type, a.config, direction, where);
    case 'oauth':
    case 'openid-connect':
      return compileAuthAction(a);
  }
}

function compileRules(rules: PolicyRule[], routeId: string, direction: PolicyDirection, readsAddHeaders: boolean, ipPolicyRules?: IpPolicyRules): CompiledRule[] {
  // Rate-limit names seen so far: the first action of a name keeps the plain key (its bucket
  // survives), a later one of the same name is keyed by its place as well.
  const seen = new Set<string>();
  return rules.map((rule, i) => {
    const where = `${direction}[${i}]`;
    return {
      where: rule.name ? `${where} (${rule.name})` : where,
      conditions: rule.expressions.map((e, j) => ({ where: `${where}.expressions[${j}]`, program: compileExpression(direction, e) })),
      actions: rule.actions.map((a, j) => {
        const nameTaken = a.type === 'rate-limit' && seen.has(a.config.name);
        if (a.type === 'rate-limit') seen.add(a.config.name);
        return compileAction(a, routeId, direction, `${where}.actions[${j}]`, nameTaken, readsAddHeaders, ipPolicyRules);
      }),
      failClosed: rule.actions.some((a) => a.type === 'deny'),
    };
  });
}

/**
 * Compiles a validated policy (`validateTrafficPolicy`). Throws `CelCompileError` if an expression
 * does not compile, and an Error if a restrict-ips IP policy is not found by `ipPolicyRules`.
 */
export function compilePolicy(policy: TrafficPolicy, routeId: string, ipPolicyRules?: IpPolicyRules): CompiledPolicy {
  // A textual test: a string that merely contains `add_headers` only costs the recording.
  const readsAddHeaders = JSON.stringify(policy).includes('add_headers');
  return { inbound: compileRules(policy.inbound, routeId, 'inbound', readsAddHeaders, ipPolicyRules), outbound: compileRules(policy.outbound, routeId, 'outbound', readsAddHeaders, ipPolicyRules) };
}
