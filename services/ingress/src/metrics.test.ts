import { describe, expect, it } from 'vitest';
import { Counter, Histogram, Registry } from 'prom-client';
import { createIngressMetrics } from './metrics.js';

describe('ingress metrics', () => {
  it('removes the request series of deleted edges and routes when a config is applied, and keeps the rest', async () => {
    const m = createIngressMetrics('metrics-test');
    m.observe('edghts_1', 'edghtsrt_1', 200, 0.001);
    m.observe('edghts_1', 'edghtsrt_2', 404, 0.001);
    m.observe('edghts_2', 'edghtsrt_3', 200, 0.001);
    m.observe('', '', 404, 0.001); // no edge matched
    m.observe('endpoint', '', 200, 0.001); // a Bind endpoint
    const series = async () => (await m.registry.metrics()).split('\n').filter((l) => l.startsWith('warren_ingress_request'));
    expect((await series()).some((l) => l.includes('edghtsrt_3'))).toBe(true);
    // Route 2 deleted; edge 2 (with its route 3) deleted.
    m.retain({ edges: new Map([['edghts_1', {}]]), routes: new Map([['edghtsrt_1', {}]]) });
    const after = await series();
    expect(after.some((l) => l.includes('edghtsrt_2') || l.includes('edghtsrt_3') || l.includes('edghts_2'))).toBe(false);
    expect(after.some((l) => l.startsWith('warren_ingress_requests_total') && l.includes('route="edghtsrt_1"'))).toBe(true);
    expect(after.some((l) => l.startsWith('warren_ingress_requests_total') && l.includes('edge="",route=""'))).toBe(true);
    expect(after.some((l) => l.startsWith('warren_ingress_requests_total') && l.includes('edge="endpoint"'))).toBe(true);
    // A kept series goes on counting from where it was.
    m.observe('edghts_1', 'edghtsrt_1', 200, 0.001);
    expect((await series()).find((l) => l.startsWith('warren_ingress_requests_total') && l.includes('route="edghtsrt_1"'))).toMatch(/ 2$/);
  });

  it("exposes the request series exactly as prom-client's own Counter and Histogram would (text and JSON)", async () => {
    const reg = new Registry();
    reg.setDefaultLabels({ node: 'n1' });
    const requests = new Counter({ name: 'warren_ingress_requests_total', help: 'HTTP requests by edge, route and status', labelNames: ['edge', 'route', 'status'], registers: [reg] });
    const duration = new Histogram({
      name: 'warren_ingress_request_duration_seconds',
      help: 'Time from request head to the end of the response, by edge and route',
      labelNames: ['edge', 'route'],
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers: [reg],
    });
    const m = createIngressMetrics('n1');
    // On a bucket bound, between bounds, past the last bound, below the first, and a repeat.
    const seen = [['e1', 'r1', 200, 0.0005], ['e1', 'r1', 404, 0.003], ['e1', 'r2', 200, 20], ['', '', 404, 0.0001], ['e1', 'r1', 200, 1], ['e1', 'r1', 200, 1]] as const;
    for (const [e, r, s, v] of seen) {
      requests.labels(e, r, String(s)).inc();
      duration.labels(e, r).observe(v);
      m.observe(e, r, s, v);
    }
    for (const name of ['warren_ingress_requests_total', 'warren_ingress_request_duration_seconds']) {
      expect(await m.registry.getSingleMetricAsString(name)).toBe(await reg.getSingleMetricAsString(name));
    }
    const ours = (await m.registry.getMetricsAsJSON()).filter((x) => x.name.startsWith('warren_ingress_request'));
    expect(ours).toEqual(await reg.getMetricsAsJSON());
  });
});
