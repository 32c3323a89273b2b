import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

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
  const requests = new Counter({ name: 'warren_ingress_requests_total', help: 'HTTP requests by edge, route and status', labelNames: ['edge', 'route', 'status'] as const, registers: [registry] });
  const duration = new Histogram({
    name: 'warren_ingress_request_duration_seconds',
    help: 'Time from request head to the end of the response, by edge and route',
    labelNames: ['edge', 'route'] as const,
    buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
    registers: [registry],
  });
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

  const reqChildren = new Map<string, ReturnType<typeof requests.labels>>();
  const durChildren = new Map<string, ReturnType<typeof duration.labels>>();
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
      const k = `${edge}|${route}|${status}`;
      let c = reqChildren.get(k);
      if (!c) reqChildren.set(k, (c = requests.labels(edge, route, String(status))));
      c.inc();
      const dk = `${edge}|${route}`;
      let h = durChildren.get(dk);
      if (!h) durChildren.set(dk, (h = duration.labels(edge, route)));
      h.observe(seconds);
    },
    /**
     * Removes the request series of edges and routes no longer in the config (a config applied):
     * without it every deleted route kept its series (about 3 KB of /metrics each) until restart.
     * Requests that matched no edge (`''`) and Bind endpoints (`endpoint`) are kept.
     */
    retain(config: { edges: ReadonlyMap<string, unknown>; routes: ReadonlyMap<string, unknown> }): void {
      const gone = (edge: string, route: string) => (edge !== '' && edge !== 'endpoint' && !config.edges.has(edge)) || (route !== '' && !config.routes.has(route));
      for (const k of [...reqChildren.keys()]) {
        const [edge, route, status] = k.split('|') as [string, string, string];
        if (!gone(edge, route)) continue;
        requests.remove(edge, route, status);
        reqChildren.delete(k);
      }
      for (const k of [...durChildren.keys()]) {
        const [edge, route] = k.split('|') as [string, string];
        if (!gone(edge, route)) continue;
        duration.remove(edge, route);
        durChildren.delete(k);
      }
    },
  };
}

export type IngressMetrics = ReturnType<typeof createIngressMetrics>;
