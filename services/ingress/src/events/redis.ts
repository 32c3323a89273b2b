import { Redis } from 'ioredis';
import type { Logger } from '@warren/shared';
import { EventProducer } from '../../../shared/src/events/producer.js';
import { TrafficEvents, type TrafficEventMetrics } from './traffic-events.js';

export interface CreateTrafficEventsOptions {
  /** Redis of the event pipeline (EVENTS_REDIS_URL, default REDIS_URL). */
  url: string;
  /** Key prefix of the event pipeline (EVENTS_PREFIX), the one the workers use. */
  prefix: string;
  maxQueued: number;
  flushMs: number;
  metrics: TrafficEventMetrics;
  log: Logger;
}

/**
 * The node's traffic-event emitter on its own Redis connection (separate from the rate
 * limiter's): no offline queue and one retry per command, so a dead Redis fails a publish at
 * once and the events are counted as dropped instead of piling up in the client.
 */
export function createTrafficEvents(o: CreateTrafficEventsOptions): TrafficEvents {
  const connection = new Redis(o.url, {
    enableOfflineQueue: false,
    maxRetriesPerRequest: 1,
    connectTimeout: 2_000,
    retryStrategy: (times) => Math.min(50 * 2 ** Math.min(times, 6), 2_000),
    connectionName: 'warren-ingress-events',
  });
  let lastLog = 0;
  // Required: ioredis reports errors without a listener as unhandled. Failed publishes are
  // logged (rate-limited) by the queue; this only notes the connection state now and then.
  connection.on('error', (err: Error) => {
    const now = Date.now();
    if (now - lastLog < 10_000) return;
    lastLog = now;
    o.log.warn({ err: err.message }, 'event Redis connection error');
  });
  const producer = new EventProducer({ connection, prefix: o.prefix });
  return new TrafficEvents({
    publisher: producer,
    metrics: o.metrics,
    log: o.log,
    maxQueued: o.maxQueued,
    flushMs: o.flushMs,
    onClosed: () => {
      connection.disconnect();
    },
  });
}
