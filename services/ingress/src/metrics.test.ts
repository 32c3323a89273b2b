import { describe, expect, it } from 'vitest';
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
});
