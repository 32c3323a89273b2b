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

/**
 * A JSON logger for one service. `LOG_LEVEL` picks the level (default info; silent in tests).
 *
 * Lines are written to stdout synchronously, as Node writes its own stdout to files and pipes. Not
 * pino's default asynchronous writer: that one flushes what it holds when the process exits and,
 * should the reader of the pipe be gone by then (the parent that started the service was killed),
 * retries the failed write forever, so the process never exits. The services log little (start,
 * stop, warnings on failures); nothing per request at the default level.
 */
export function createLogger(service: string, level = process.env.LOG_LEVEL ?? (process.env.VITEST ? 'silent' : 'info')): Logger {
  return pino({ name: service, level, redact: { paths: REDACT, censor: '[redacted]' }, base: { service } }, pino.destination({ dest: 1, sync: true }));
}
