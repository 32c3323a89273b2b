import { Counter, Gauge, Registry, collectDefaultMetrics, type Metric } from 'prom-client';

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
  registry.registerMetric(series.counter as unknown as Metric);
  registry.registerMetric(series.histogram as unknown as Metric);
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

const DURATION_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

/** One edge × route: its duration histogram (per-bucket counts, not cumulative) and its counts by status. */
interface RouteSeries {
  labels: { edge: string; route: string };
  buckets: Float64Array;
  sum: number;
  count: number;
  statuses: Map<number, { labels: { edge: string; route: string; status: string }; value: number }>;
}

/**
 * `warren_ingress_requests_total` and `warren_ingress_request_duration_seconds`, counted on the
 * request path with one Map lookup, a bucket search and a few additions. prom-client's own
 * Counter/Histogram validate and hash the label set on every inc/observe (cached children
 * included), which was about 1.5 µs of the ingress's ~38 µs per request in the proxy bench; the
 * exposition (text format, default labels, content types) stays prom-client's: these two are
 * registered as metrics whose `get()` returns what prom-client's own would.
 */
class RequestSeries {
  private readonly byRoute = new Map<string, RouteSeries>();

  readonly counter = {
    name: 'warren_ingress_requests_total',
    help: 'HTTP requests by edge, route and status',
    type: 'counter',
    aggregator: 'sum',
    get: async () => ({ name: this.counter.name, help: this.counter.help, type: 'counter', aggregator: 'sum', values: this.counterValues() }),
    reset: () => this.byRoute.clear(),
  };

  readonly histogram = {
    name: 'warren_ingress_request_duration_seconds',
    help: 'Time from request head to the end of the response, by edge and route',
    type: 'histogram',
    aggregator: 'sum',
    // As prom-client's Histogram: the text format takes `le` as the label and the route's as
    // shared labels (so the series read exactly as before); get() merges them.
    getForPromString: async () => ({ name: this.histogram.name, help: this.histogram.help, type: 'histogram', aggregator: 'sum', values: this.histogramValues() }),
    get: async () => ({
      name: this.histogram.name,
      help: this.histogram.help,
      type: 'histogram',
      aggregator: 'sum',
      values: this.histogramValues().map(({ labels, sharedLabels, ...v }) => ({ ...v, labels: { ...labels, ...sharedLabels } })),
    }),
    reset: () => this.byRoute.clear(),
  };

  observe(edge: string, route: string, status: number, seconds: number): void {
    const k = `${edge}|${route}`;
    let r = this.byRoute.get(k);
    if (r === undefined) {
      r = { labels: { edge, route }, buckets: new Float64Array(DURATION_BUCKETS.length + 1), sum: 0, count: 0, statuses: new Map() };
      this.byRoute.set(k, r);
    }
    let i = 0;
    while (i < DURATION_BUCKETS.length && seconds > DURATION_BUCKETS[i]!) i++;
    r.buckets[i]!++;
    r.sum += seconds;
    r.count++;
    const c = r.statuses.get(status);
    if (c !== undefined) c.value++;
    else r.statuses.set(status, { labels: { edge, route, status: String(status) }, value: 1 });
  }

  retain(gone: (edge: string, route: string) => boolean): void {
    for (const [k, r] of this.byRoute) if (gone(r.labels.edge, r.labels.route)) this.byRoute.delete(k);
  }

  private counterValues() {
    const out: Array<{ labels: Record<string, string>; value: number }> = [];
    for (const r of this.byRoute.values()) for (const c of r.statuses.values()) out.push({ labels: { ...c.labels }, value: c.value });
    return out;
  }

  private histogramValues() {
    const out: Array<{ labels: Record<string, string | number>; sharedLabels: Record<string, string>; value: number; metricName: string; exemplar?: null }> = [];
    const bucket = `${this.histogram.name}_bucket`;
    for (const r of this.byRoute.values()) {
      let acc = 0;
      for (let i = 0; i < DURATION_BUCKETS.length; i++) {
        acc += r.buckets[i]!;
        out.push({ labels: { le: DURATION_BUCKETS[i]! }, sharedLabels: r.labels, value: acc, metricName: bucket, exemplar: null });
      }
      out.push({ labels: { le: '+Inf' }, sharedLabels: r.labels, value: r.count, metricName: bucket, exemplar: null });
      out.push({ labels: {}, sharedLabels: r.labels, value: r.sum, metricName: `${this.histogram.name}_sum` });
      out.push({ labels: {}, sharedLabels: r.labels, value: r.count, metricName: `${this.histogram.name}_count` });
    }
    return out;
  }
}

export type IngressMetrics = ReturnType<typeof createIngressMetrics>;
