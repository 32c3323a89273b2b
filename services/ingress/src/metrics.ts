import { Counter, Gauge, Registry, collectDefaultMetrics } from 'prom-client';
import { LeanCounter, LeanHistogram, registerLean } from './lean-metrics.js';

/**
 * Ingress metrics. Request series are labelled by edge and route id (bounded by the config) and
 * status; requests that match no edge are counted with empty labels, so a flood of random Host
 * headers cannot grow the series. Children are cached per label set: the request path does one
 * Map lookup per metric instead of hashing a label object.
 */
export function createIngressMetrics(nodeId: string) {
  const registry = new Registry();
  registry.setDefaultLabels({ node: nodeId });
  collectDefaultMetrics({ register: registry });
  const series = new RequestSeries();
  registerLean(registry, series.counter);
  registerLean(registry, series.histogram);
  const sessions = new Gauge({ name: 'warren_ingress_agent_sessions', help: 'Agent sessions connected to this node', registers: [registry] });
  const tunnels = new Gauge({ name: 'warren_ingress_tunnels', help: 'Tunnels known to this node, local (its agents) or remote (other nodes)', labelNames: ['location'] as const, registers: [registry] });
  const hops = new Counter({ name: 'warren_ingress_hops_total', help: 'Requests carried to another node that holds the tunnel', registers: [registry] });
  const upgrades = new Counter({ name: 'warren_ingress_upgrades_total', help: 'Upgrade (WebSocket) requests by result', labelNames: ['result'] as const, registers: [registry] });

  // Traffic events (events/traffic-events.ts). Counters count event records: one per event and destination.
  const eventsEmitted = new Counter({ name: 'warren_ingress_events_emitted_total', help: 'Traffic event records (one per event and destination) appended to a destination buffer in Redis', registers: [registry] });
  const eventsDropped = new Counter({
    name: 'warren_ingress_events_dropped_total',
    help: 'Traffic event records (one per event and destination) not delivered to a destination buffer: queue_full (the in-memory queue was full), redis_error (the publish failed), buffer_full (the destination buffer was full; sent to its overflow/dead letters), shutdown (still queued when the drain timed out)',
    labelNames: ['reason'] as const,
    registers: [registry],
  });
  let eventQueueProbe: () => number = () => 0;
  new Gauge({
    name: 'warren_ingress_event_queue',
    help: 'Traffic events held in memory (queued or being published)',
    registers: [registry],
    collect() {
      this.set(eventQueueProbe());
    },
  });

  return {
    registry,
    sessions,
    tunnels,
    hops,
    upgrades,
    events: {
      emitted: eventsEmitted,
      dropped: eventsDropped,
      /** Where the `warren_ingress_event_queue` gauge reads its value at scrape time. */
      setQueueProbe(fn: () => number): void {
        eventQueueProbe = fn;
      },
    },
    /** One finished request. */
    observe(edge: string, route: string, status: number, seconds: number): void {
      series.observe(edge, route, status, seconds);
    },
    /**
     * Removes the request series of edges and routes no longer in the config (a config applied):
     * without it every deleted route kept its series (about 3 KB of /metrics each) until restart.
     * Requests that matched no edge (`''`) and Bind endpoints (`endpoint`) are kept.
     */
    retain(config: { edges: ReadonlyMap<string, unknown>; routes: ReadonlyMap<string, unknown> }): void {
      series.retain((edge, route) => (edge !== '' && edge !== 'endpoint' && !config.edges.has(edge)) || (route !== '' && !config.routes.has(route)));
    },
  };
}

/** What one edge × route counts with: its duration histogram and its request counter by status. */
interface RouteSeries {
  edge: string;
  route: string;
  duration: { observe(v: number): void };
  statuses: Map<number, { inc(): void }>;
}

/**
 * `warren_ingress_requests_total` and `warren_ingress_request_duration_seconds`, counted on the
 * request path with one Map lookup per request and lean children (lean-metrics.ts): prom-client's
 * own Counter/Histogram validate and hash the label set on every inc/observe, cached children
 * included, which was about 1.5 µs of the ingress's ~38 µs per request in the proxy bench.
 */
class RequestSeries {
  readonly counter = new LeanCounter('warren_ingress_requests_total', 'HTTP requests by edge, route and status', ['edge', 'route', 'status']);
  readonly histogram = new LeanHistogram(
    'warren_ingress_request_duration_seconds',
    'Time from request head to the end of the response, by edge and route',
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
    ['edge', 'route'],
  );
  private readonly byRoute = new Map<string, RouteSeries>();

  observe(edge: string, route: string, status: number, seconds: number): void {
    const k = `${edge}|${route}`;
    let r = this.byRoute.get(k);
    if (r === undefined) {
      r = { edge, route, duration: this.histogram.child(edge, route), statuses: new Map() };
      this.byRoute.set(k, r);
    }
    r.duration.observe(seconds);
    let c = r.statuses.get(status);
    if (c === undefined) r.statuses.set(status, (c = this.counter.child(edge, route, String(status))));
    c.inc();
  }

  retain(gone: (edge: string, route: string) => boolean): void {
    for (const [k, r] of this.byRoute) {
      if (!gone(r.edge, r.route)) continue;
      this.histogram.remove(r.edge, r.route);
      for (const status of r.statuses.keys()) this.counter.remove(r.edge, r.route, String(status));
      this.byRoute.delete(k);
    }
  }
}

export type IngressMetrics = ReturnType<typeof createIngressMetrics>;
