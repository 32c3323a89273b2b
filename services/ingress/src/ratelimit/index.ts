export { LocalSlidingWindowLimiter, type LocalLimiterOptions } from './local.js';
export { DEFAULT_EXACT_MAX, RedisSlidingWindowLimiter, STORE_ERROR_CODE, type RedisLimiterOptions } from './redis.js';
export { digestKey, redisKey, redisKeyPattern, type BucketMode } from './keys.js';
export { admits, logAdmits, logRecord, logRetryAfterMs, retryAfterMs, retryAfterSeconds, viewAt, type WindowState, type WindowView } from './window.js';
export type { BreakerOptions } from './breaker.js';
