import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { EventTargetKind } from '@warren/shared';

/** Bounded dead-letter reasons (the metric label; the stored reason may carry a detail after ': '). */
export const DEAD_LETTER_REASONS = [
  'record_too_large',
  'rejected',
  'record_failed',
  'timestamp_out_of_range',
  'invalid_envelope',
  'exhausted',
  'buffer_full',
  'destination_deleted',
  'job_failed',
] as const;
export type DeadLetterReason = (typeof DEAD_LETTER_REASONS)[number];

export interface MetricsSources {
  /** BullMQ job counts per target kind (on scrape). */
  jobCounts?: () => Promise<Array<{ kind: string; counts: Record<string, number> }>>;
  /** Buffered events per target kind over the destinations this worker knows (on scrape, bounded). */
  bufferSizes?: () => Promise<Array<{ kind: string; events: number }>>;
  /** Paused destinations (on scrape). */
  pausedCount?: () => Promise<number>;
}

/**
 * Worker metrics (own registry). Every series is labelled by target kind; dead letters also by a
 * bounded reason. Gauges that need Redis or Postgres are read when scraped.
 */
export function createWorkerMetrics() {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  const sources: MetricsSources = {};
  const kind = ['kind'] as const;
  const delivered = new Counter({ name: 'warren_events_delivered_total', help: 'Events accepted by their destination', labelNames: kind, registers: [registry] });
  const failed = new Counter({ name: 'warren_events_failed_total', help: 'Events in failed delivery attempts (each attempt counted)', labelNames: kind, registers: [registry] });
  const retried = new Counter({ name: 'warren_events_retried_total', help: 'Events scheduled for another attempt on the retry schedule', labelNames: kind, registers: [registry] });
  const deadLettered = new Counter({ name: 'warren_events_dead_lettered_total', help: 'Events moved to the dead letters, by reason', labelNames: ['kind', 'reason'] as const, registers: [registry] });
  const throttled = new Counter({ name: 'warren_events_throttled_total', help: 'Delivery calls the destination throttled', labelNames: kind, registers: [registry] });
  const autoPaused = new Counter({ name: 'warren_event_destinations_auto_paused_total', help: 'Destinations paused after failing continuously (AUTO_PAUSE_AFTER_MS)', labelNames: kind, registers: [registry] });
  const pausedTotal = new Counter({ name: 'warren_event_destination_pauses_total', help: 'Destinations paused (auth failures and auto pauses)', labelNames: kind, registers: [registry] });
  const deliverySeconds = new Histogram({
    name: 'warren_event_delivery_seconds',
    help: 'From the flush job creation (about the first buffered event) to acceptance by the destination',
    labelNames: kind,
    buckets: [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600, 14400, 86400],
    registers: [registry],
  });
  new Gauge({
    name: 'warren_event_queue_jobs',
    help: 'Flush jobs per target queue and state',
    labelNames: ['kind', 'state'] as const,
    registers: [registry],
    async collect() {
      this.reset();
      const rows = (await scrapeRead(sources.jobCounts?.(), [])) ?? [];
      for (const { kind: k, counts } of rows) for (const [state, n] of Object.entries(counts)) this.labels(k, state).set(n);
    },
  });
  new Gauge({
    name: 'warren_event_buffer_events',
    help: 'Events waiting in destination buffers (destinations this worker has seen, bounded)',
    labelNames: kind,
    registers: [registry],
    async collect() {
      this.reset();
      const rows = (await scrapeRead(sources.bufferSizes?.(), [])) ?? [];
      for (const { kind: k, events } of rows) this.labels(k).set(events);
    },
  });
  new Gauge({
    name: 'warren_event_destinations_paused',
    help: 'Paused event destinations',
    registers: [registry],
    async collect() {
      const n = await scrapeRead(sources.pausedCount?.(), undefined);
      if (n !== undefined) this.set(n);
    },
  });
  return {
    registry,
    sources,
    delivered: (k: EventTargetKind, n: number) => n > 0 && delivered.labels(k).inc(n),
    failed: (k: EventTargetKind, n: number) => n > 0 && failed.labels(k).inc(n),
    retried: (k: EventTargetKind, n: number) => n > 0 && retried.labels(k).inc(n),
    deadLettered: (k: string, reason: DeadLetterReason, n: number) => n > 0 && deadLettered.labels(k, reason).inc(n),
    throttled: (k: EventTargetKind) => throttled.labels(k).inc(),
    paused: (k: EventTargetKind, auto: boolean) => {
      pausedTotal.labels(k).inc();
      if (auto) autoPaused.labels(k).inc();
    },
    delivery: (k: EventTargetKind, seconds: number) => deliverySeconds.labels(k).observe(Math.max(0, seconds)),
  };
}

export type WorkerMetrics = ReturnType<typeof createWorkerMetrics>;

/** A scrape must answer even while Redis or Postgres does not: reads give up after this long. */
const SCRAPE_READ_TIMEOUT_MS = 1000;

/** `read`'s value, or `fallback` when it fails or takes longer than SCRAPE_READ_TIMEOUT_MS. */
async function scrapeRead<T, F>(read: Promise<T> | undefined, fallback: F): Promise<T | F> {
  if (!read) return fallback;
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<F>((resolve) => {
    timer = setTimeout(() => resolve(fallback), SCRAPE_READ_TIMEOUT_MS);
  });
  try {
    return await Promise.race([read.catch(() => fallback), late]);
  } finally {
    clearTimeout(timer);
  }
}
