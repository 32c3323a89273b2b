import client from 'prom-client';

/**
 * Metrics of the outbox relay. Registered in `registry` when one is given; otherwise they exist
 * unregistered (tests, several relays in one process), and are still readable through `get()`.
 */
export function createRelayMetrics(registry?: client.Registry) {
  const registers = registry ? [registry] : [];
  return {
    /** Outbox rows the relay moved past (subscribed or not). */
    rows: new client.Counter({ name: 'warren_event_relay_rows_total', help: 'Outbox rows the event relay has handled (its cursor moved past them)', registers }),
    /** Envelopes handed to the producer: one per (row, subscribed destination). */
    events: new client.Counter({ name: 'warren_event_relay_events_total', help: 'Audit events the relay published to destination buffers (one per destination)', registers }),
    overflowed: new client.Counter({
      name: 'warren_event_relay_overflowed_total',
      help: 'Audit events the producer refused because a destination buffer was full (overflow / dead letters)',
      registers,
    }),
    batches: new client.Counter({ name: 'warren_event_relay_batches_total', help: 'Relay transactions committed with at least one row', registers }),
    errors: new client.Counter({ name: 'warren_event_relay_errors_total', help: 'Relay attempts that failed and were rolled back (Redis or Postgres unavailable)', registers }),
    lag: new client.Gauge({ name: 'warren_event_relay_lag_versions', help: 'Config versions committed but not relayed yet (head version minus relay cursor)', registers }),
    cursor: new client.Gauge({ name: 'warren_event_relay_cursor_version', help: 'The relay cursor: the newest outbox version handled', registers }),
  };
}

export type RelayMetrics = ReturnType<typeof createRelayMetrics>;
