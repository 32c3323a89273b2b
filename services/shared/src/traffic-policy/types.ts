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

/** Every action type the foundation accepts. More types arrive with the traffic-policy issue. */
export type PolicyAction = RateLimitAction;
export type PolicyActionType = PolicyAction['type'];

export interface PolicyRule {
  /** `""` when the document gives none. */
  name: string;
  /**
   * CEL expressions as written. Only their type (list of strings) is checked here: they are not
   * compiled or evaluated yet (the traffic-policy issue adds CEL).
   */
  expressions: string[];
  actions: PolicyAction[];
}

export interface TrafficPolicy {
  inbound: PolicyRule[];
  outbound: PolicyRule[];
}
