export { LocalSlidingWindowLimiter, type LocalLimiterOptions } from './local.js';
export { RedisSlidingWindowLimiter, STORE_ERROR_CODE, type RedisLimiterOptions } from './redis.js';
export { digestKey, redisKey, redisKeyPattern } from './keys.js';
export { admits, retryAfterMs, retryAfterSeconds, viewAt, type WindowState, type WindowView } from './window.js';
export type { BreakerOptions } from './breaker.js';
