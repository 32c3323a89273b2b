import { pino, type Logger } from 'pino';

export type { Logger };

/**
 * Paths that may hold secrets. pino replaces them with "[redacted]" so that a token, key or
 * client secret never reaches a log line, even if an object carrying one is logged by mistake.
 */
const REDACT = [
  'token', '*.token', 'authorization', '*.authorization', 'req.headers.authorization',
  'secret', '*.secret', '*.*.secret', 'client_secret', '*.client_secret', '*.*.client_secret', '*.*.*.client_secret',
  'api_key', '*.api_key', '*.*.api_key', 'aws_secret_access_key', '*.aws_secret_access_key', '*.*.aws_secret_access_key', '*.*.*.aws_secret_access_key',
  'password', '*.password',
];

/** A JSON logger for one service. `LOG_LEVEL` picks the level (default info; silent in tests). */
export function createLogger(service: string, level = process.env.LOG_LEVEL ?? (process.env.VITEST ? 'silent' : 'info')): Logger {
  return pino({ name: service, level, redact: { paths: REDACT, censor: '[redacted]' }, base: { service } });
}
