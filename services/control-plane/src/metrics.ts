import client from 'prom-client';
import type pg from 'pg';

/** Control-plane metrics, declared once. A fresh registry per app keeps tests independent. */
export function createMetrics(pool: pg.Pool) {
  const registry = new client.Registry();
  client.collectDefaultMetrics({ register: registry, prefix: 'warren_control_plane_' });
  const requests = new client.Counter({
    name: 'warren_control_plane_http_requests_total',
    help: 'Management API requests by route, method and status',
    labelNames: ['route', 'method', 'status'] as const,
    registers: [registry],
  });
  const duration = new client.Histogram({
    name: 'warren_control_plane_http_request_duration_seconds',
    help: 'Management API request latency by route, method and status',
    labelNames: ['route', 'method', 'status'] as const,
    buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
    registers: [registry],
  });
  const gauge = (name: string, help: string, read: () => number) =>
    new client.Gauge({ name, help, registers: [registry], collect() { this.set(read()); } });
  gauge('warren_control_plane_pg_pool_total_connections', 'Postgres pool: open connections', () => pool.totalCount);
  gauge('warren_control_plane_pg_pool_idle_connections', 'Postgres pool: idle connections', () => pool.idleCount);
  gauge('warren_control_plane_pg_pool_waiting_requests', 'Postgres pool: queries waiting for a connection', () => pool.waitingCount);
  return { registry, requests, duration };
}

export type Metrics = ReturnType<typeof createMetrics>;
