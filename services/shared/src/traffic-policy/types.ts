/**
 * Typed form of a traffic policy document (spec: "Rate-limit traffic policy action";
 * wire-conventions.md §12, §13). Produced by `parseTrafficPolicy`; the ingress evaluates it.
 */

export type PolicyDirection = 'inbound' | 'outbound';

/** One element of a rate-limit `bucket_key`, as written (`source`) and as resolved. */
export type BucketKeyElement =
  | { kind: 'host'; source: string }
  | { kind: 'client_ip'; source: string }
  /** `req.headers['x-name']` or `getReqHeader('X-Name')`; `name` is lowercased (headers are case-insensitive). */
  | { kind: 'header'; name: string; source: string };

export interface RateLimitConfig {
  /** Name of this rate limit configuration, fewer than 1024 characters. */
  name: string;
  algorithm: 'sliding_window';
  /** Requests allowed per bucket within `rate`, 1..2,000,000,000. */
  capacity: number;
  /** The duration as written, e.g. `90s` or `1h30m`. */
  rate: string;
  /** `rate` in whole seconds: a multiple of 10 within 60..86,400. */
  rateSeconds: number;
  /** The bucket key elements as written. */
  bucket_key: string[];
  /** The bucket key elements, resolved. */
  bucketKey: BucketKeyElement[];
}

export interface RateLimitAction {
  type: 'rate-limit';
  config: RateLimitConfig;
}

/** `deny`: answers with `status_code` (400–599, default 403) instead of the upstream. */
export interface DenyAction {
  type: 'deny';
  config: { status_code: number };
}

/** `custom-response`: answers with this status, body and headers, returned as is. */
export interface CustomResponseAction {
  type: 'custom-response';
  config: { status_code: number; body: string; headers: Record<string, string> };
}

/**
 * `add-headers`: sets these headers on the request (inbound) or response (outbound), replacing
 * any of the same name. Values may interpolate CEL: `${expr}` (see `parseTemplate`).
 */
export interface AddHeadersAction {
  type: 'add-headers';
  config: { headers: Record<string, string> };
}

/** `remove-headers`: removes every header of these names (case-insensitive). */
export interface RemoveHeadersAction {
  type: 'remove-headers';
  config: { headers: string[] };
}

export type PolicyAction = RateLimitAction | DenyAction | CustomResponseAction | AddHeadersAction | RemoveHeadersAction;
export type PolicyActionType = PolicyAction['type'];

export interface PolicyRule {
  /** `""` when the document gives none. */
  name: string;
  /**
   * CEL expressions as written; each compiles (type-checks to bool) against the variables of
   * the rule's direction (see `cel.ts`). The rule applies when all are true.
   */
  expressions: string[];
  actions: PolicyAction[];
}

export interface TrafficPolicy {
  inbound: PolicyRule[];
  outbound: PolicyRule[];
}
