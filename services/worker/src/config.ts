import { readFileSync } from 'node:fs';
import { z } from 'zod';
import { DEFAULT_EVENT_PREFIX, DEFAULT_LINGER_MS, EnvError, envInt, parseEnv } from '@warren/shared';

/** Default waits between attempts of a failing batch (event-delivery.md §2.4): 11 attempts over ~24 h. */
export const DEFAULT_RETRY_SCHEDULE_MS = [5_000, 30_000, 120_000, 600_000, 1_800_000, 3_600_000, 7_200_000, 14_400_000, 28_800_000, 28_800_000];

/** `5s,30s,2m,1h` or plain milliseconds `5000,30000`. */
export function parseDurations(text: string): number[] {
  return text.split(',').map((part) => {
    const m = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$/.exec(part);
    if (!m) throw new EnvError(`invalid environment:\n  RETRY_SCHEDULE_MS: "${part.trim()}" is not a duration (e.g. 5000, 5s, 2m, 1h)`);
    const n = Number(m[1]);
    const unit = m[2] ?? 'ms';
    return Math.round(n * (unit === 'ms' ? 1 : unit === 's' ? 1_000 : unit === 'm' ? 60_000 : 3_600_000));
  });
}

/** Worker configuration, parsed once from the environment. */
export function loadConfig(source: NodeJS.ProcessEnv = process.env) {
  const env = parseEnv(
    {
      DATABASE_URL: z.string().min(1),
      REDIS_URL: z.string().min(1),
      /** Key prefix of the event buffers and BullMQ queues (must match the producers'). */
      EVENTS_PREFIX: z.string().regex(/^[A-Za-z0-9_.-]+$/).default(DEFAULT_EVENT_PREFIX),
      /** Wait before the flush job of a quiet destination runs, so its events go in one call (audit events; ms). */
      EVENTS_LINGER_MS: envInt(DEFAULT_LINGER_MS, 0, 60_000),
      /** Concurrent flush jobs per target queue. */
      WORKER_CONCURRENCY: envInt(50, 1, 10_000),
      METRICS_HOST: z.string().default('127.0.0.1'),
      /** `/metrics` and `/healthz`; 0 = a port the kernel picks (sent in the IPC 'listening' message). */
      METRICS_PORT: envInt(9200, 0, 65535),
      /** Endpoint overrides (tests, self-hosted look-alikes); unset in production. */
      AWS_ENDPOINT_URL: z.string().url().optional(),
      DATADOG_BASE_URL: z.string().url().optional(),
      AZURE_AUTHORITY_HOST: z.string().url().optional(),
      /** PEM file with extra CA certificates trusted for HTTPS targets. */
      EVENTS_CA_FILE: z.string().optional(),
      /** Warren's own AWS identity for AssumeRole (`role` auth); unset: the SDK default chain. */
      WARREN_AWS_ACCESS_KEY_ID: z.string().optional(),
      WARREN_AWS_SECRET_ACCESS_KEY: z.string().optional(),
      WARREN_AWS_SESSION_TOKEN: z.string().optional(),
      REQUEST_TIMEOUT_MS: envInt(30_000, 100, 600_000),
      /** Hard limit of the SIGTERM drain (keep it below the orchestrator's grace period). */
      SHUTDOWN_TIMEOUT_MS: envInt(20_000, 0, 3_600_000),
      /** Waits between attempts of a failing batch; attempts = entries + 1. */
      RETRY_SCHEDULE_MS: z.string().default(DEFAULT_RETRY_SCHEDULE_MS.join(',')),
      /** Paused destinations are re-probed after this long. */
      PAUSE_PROBE_MS: envInt(600_000, 100, 86_400_000),
      /** A destination failing this long without a single success is paused. */
      AUTO_PAUSE_AFTER_MS: envInt(72 * 3_600_000, 1_000, 365 * 86_400_000),
      /** How long a loaded destination (and its secrets) is cached; an update invalidates it. */
      DEST_CACHE_MS: envInt(5_000, 0, 3_600_000),
      /** Safety sweep: buffers without a flush job, overflow lists, failed jobs' records. */
      SWEEP_INTERVAL_MS: envInt(30_000, 100, 3_600_000),
      /** Batches one flush job sends before it hands over to a fresh job. */
      MAX_BATCHES_PER_JOB: envInt(10, 1, 1000),
      PG_POOL_MAX: envInt(10, 1, 1000),
      /** BullMQ lock of an active flush job (§3: 60 s, longer than the worst request), and how often stalled jobs (dead workers) are looked for. */
      LOCK_DURATION_MS: envInt(60_000, 1_000, 3_600_000),
      STALLED_INTERVAL_MS: envInt(30_000, 500, 3_600_000),
    },
    source,
  );
  const retryScheduleMs = parseDurations(env.RETRY_SCHEDULE_MS);
  if (retryScheduleMs.length === 0) throw new EnvError('invalid environment:\n  RETRY_SCHEDULE_MS: empty');
  if ((env.WARREN_AWS_ACCESS_KEY_ID === undefined) !== (env.WARREN_AWS_SECRET_ACCESS_KEY === undefined)) {
    throw new EnvError('invalid environment:\n  WARREN_AWS_ACCESS_KEY_ID and WARREN_AWS_SECRET_ACCESS_KEY go together');
  }
  let caPem: string | undefined;
  if (env.EVENTS_CA_FILE) {
    try {
      caPem = readFileSync(env.EVENTS_CA_FILE, 'utf8');
    } catch (err) {
      throw new EnvError(`invalid environment:\n  EVENTS_CA_FILE: cannot read ${env.EVENTS_CA_FILE}: ${(err as NodeJS.ErrnoException).code ?? String(err)}`);
    }
  }
  return { ...env, retryScheduleMs, caPem };
}

export type WorkerConfig = ReturnType<typeof loadConfig>;
