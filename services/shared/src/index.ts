export * from './errors.js';
export * from './ids.js';
export * from './env.js';
export * from './logger.js';
export * from './time.js';
export * from './traffic-policy/index.js';
export * from './tls/certificates.js';
export * from './dataplane/types.js';
