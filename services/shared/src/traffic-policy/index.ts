export * from './types.js';
export { parseDurationNs } from './duration.js';
export { MAX_TRAFFIC_POLICY_BYTES, RATE_LIMIT_LIMITS, SUPPORTED_ACTION_TYPES, TrafficPolicyError, parseTrafficPolicy, validateTrafficPolicy } from './parse.js';
