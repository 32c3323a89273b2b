import { describe, expect, it } from 'vitest';
import { Counter, Histogram, Registry } from 'prom-client';
import { LeanCounter, LeanHistogram, registerLean } from './lean-metrics.js';
import { createRateLimitMetrics } from './ratelimit/metrics.js';

const BUCKETS = [0.001, 0.01, 0.1, 1];

/** prom-client's registry and ours, with the same default labels. */
function registries() {
  const theirs = new Registry();
  const ours = new Registry();
  theirs.setDefaultLabels({ node: 'n1' });
  ours.setDefaultLabels({ node: 'n1' });
  return { theirs, ours };
}

async function expectSame(theirs: Registry, ours: Registry): Promise<void> {
  expect(await ours.metrics()).toBe(await theirs.metrics());
  expect(await ours.getMetricsAsJSON()).toEqual(await theirs.getMetricsAsJSON());
}

describe('lean metrics read exactly as prom-client’s own', () => {
  it('counters, labelled and not: values, series appearing on first inc, remove and reset', async () => {
    const { theirs, ours } = registries();
    const pc = new Counter({ name: 'c_total', help: 'h', labelNames: ['a', 'b'], registers: [theirs] });
    const pu = new Counter({ name: 'u_total', help: 'h u', registers: [theirs] });
    const lc = registerLean(ours, new LeanCounter('c_total', 'h', ['a', 'b']));
    const lu = registerLean(ours, new LeanCounter('u_total', 'h u'));
    await expectSame(theirs, ours); // the unlabelled one at 0, the labelled one without series
    pc.labels('x', 'y').inc();
    lc.child('x', 'y').inc();
    pc.labels('x', 'z').inc(3);
    lc.child('x', 'z').inc(3);
    lc.child('never', 'used'); // a child made but not incremented has no series, as in prom-client
    pu.inc(2);
    lu.child().inc(2);
    await expectSame(theirs, ours);
    pc.remove('x', 'y');
    lc.remove('x', 'y');
    await expectSame(theirs, ours);
    theirs.resetMetrics();
    ours.resetMetrics();
    await expectSame(theirs, ours);
  });

  it('histograms, labelled and not: bounds, between them, past the last, remove and reset', async () => {
    const { theirs, ours } = registries();
    const ph = new Histogram({ name: 'h_seconds', help: 'h', labelNames: ['r'], buckets: BUCKETS, registers: [theirs] });
    const pu = new Histogram({ name: 'u_seconds', help: 'u', buckets: BUCKETS, registers: [theirs] });
    const lh = registerLean(ours, new LeanHistogram('h_seconds', 'h', BUCKETS, ['r']));
    const lu = registerLean(ours, new LeanHistogram('u_seconds', 'u', BUCKETS));
    await expectSame(theirs, ours);
    for (const v of [0.0001, 0.001, 0.005, 1, 7]) {
      ph.labels('one').observe(v);
      lh.child('one').observe(v);
      pu.observe(v);
      lu.child().observe(v);
    }
    const two = lh.child('two'); // held across the reset below, as the request path holds its children
    ph.labels('two').observe(0.05);
    two.observe(0.05);
    await expectSame(theirs, ours);
    ph.remove('one');
    lh.remove('one');
    await expectSame(theirs, ours);
    theirs.resetMetrics();
    ours.resetMetrics();
    await expectSame(theirs, ours);
    ph.labels('two').observe(0.5);
    two.observe(0.5);
    pu.observe(0.5);
    lu.child().observe(0.5);
    await expectSame(theirs, ours);
  });

  it('a second registration returns the first metric (limiters sharing a registry count together)', async () => {
    const registry = new Registry();
    const a = createRateLimitMetrics(registry);
    const b = createRateLimitMetrics(registry);
    a.decision(false);
    b.decision(false);
    b.decision(true);
    a.redisLatency(0.0002);
    b.redisLatency(0.0003);
    const text = await registry.metrics();
    expect(text).toMatch(/^warren_ingress_ratelimit_decisions_total\{result="admitted"\} 2$/m);
    expect(text).toMatch(/^warren_ingress_ratelimit_decisions_total\{result="limited"\} 1$/m);
    expect(text).toMatch(/^warren_ingress_ratelimit_redis_seconds_count 2$/m);
    expect(() => registerLean(registry, new LeanHistogram('warren_ingress_ratelimit_decisions_total', 'x', BUCKETS))).toThrow(/another kind/);
  });
});
