import { describe, expect, it } from 'vitest';
import { CircuitBreaker, createCircuitBreakerStage } from './circuit-breaker.js';
import { makeEdge, makeConfig, makeRoute, makeState, testDeps } from './testing.js';

function clock() {
  let t = 1_000_000;
  return { now: () => t, advance: (ms: number) => (t += ms) };
}

const SETTINGS = { tripped_duration: 10, rolling_window: 10, num_buckets: 10, volume_threshold: 4, error_threshold_percentage: 0.5 };

function setup(mod: Record<string, unknown> = SETTINGS) {
  const c = clock();
  const factory = createCircuitBreakerStage({ now: c.now });
  const build = (m = mod, id = 'rt_1') => factory(makeRoute({ circuit_breaker: { enabled: true, ...m } }, { id }), makeEdge(), makeConfig(), testDeps())!;
  return { c, factory, build, stage: build() };
}

/** Sends one request through the stage with the given upstream result; returns the status the client gets. */
async function send(stage: ReturnType<ReturnType<typeof setup>['build']>, result: number | 'error'): Promise<number> {
  const s = makeState();
  const out = await stage.onRequest!(s);
  if (out) return out.status;
  stage.onResult!(s, result);
  return result === 'error' ? 502 : result;
}

describe('circuit_breaker', () => {
  it('is absent when missing or disabled', () => {
    const f = createCircuitBreakerStage();
    expect(f(makeRoute({}), makeEdge(), makeConfig(), testDeps())).toBeNull();
    expect(f(makeRoute({ circuit_breaker: { ...SETTINGS, enabled: false } }), makeEdge(), makeConfig(), testDeps())).toBeNull();
  });

  it('stays closed below the volume threshold', async () => {
    const { stage } = setup();
    for (let i = 0; i < 3; i++) expect(await send(stage, 500)).toBe(500);
    expect(await send(stage, 200)).toBe(200);
    expect(await send(stage, 200)).toBe(200);
  });

  it('trips at volume and error ratio, answers 503 while open, then half-opens with one probe', async () => {
    const { stage, c } = setup();
    await send(stage, 200);
    await send(stage, 200);
    await send(stage, 500);
    await send(stage, 'error'); // 4 requests, 2 errors: 50% ≥ 0.5 → trips
    const s = makeState();
    const out = (await stage.onRequest!(s))!;
    expect(out.status).toBe(503);
    expect(out.headers!['warren-error-code']).toBe('ERR_WARREN_7103');
    expect(out.headers!['retry-after']).toBe('10');
    c.advance(9_999);
    expect(await send(stage, 200)).toBe(503);
    c.advance(1);
    // Half-open: the first request is the probe; others are refused while it is out.
    const probe = makeState();
    expect(await stage.onRequest!(probe)).toBeNull();
    expect(await send(stage, 200)).toBe(503);
    stage.onResult!(probe, 200);
    // Closed again with a fresh window.
    for (let i = 0; i < 3; i++) expect(await send(stage, 500)).toBe(500);
    expect(await send(stage, 200)).toBe(200);
  });

  it('a failed probe re-trips for tripped_duration', async () => {
    const { stage, c } = setup();
    for (let i = 0; i < 4; i++) await send(stage, 503);
    c.advance(10_000);
    expect(await send(stage, 502)).toBe(502); // the probe fails
    expect(await send(stage, 200)).toBe(503);
    c.advance(10_000);
    expect(await send(stage, 200)).toBe(200); // next probe succeeds
    expect(await send(stage, 200)).toBe(200);
  });

  it('a probe that never reports is given up after tripped_duration', async () => {
    const { stage, c } = setup();
    for (let i = 0; i < 4; i++) await send(stage, 500);
    c.advance(10_000);
    expect(await stage.onRequest!(makeState())).toBeNull(); // probe, never reported
    expect(await send(stage, 200)).toBe(503);
    c.advance(10_000);
    expect(await send(stage, 200)).toBe(200);
  });

  it('forgets results that left the rolling window', async () => {
    const { stage, c } = setup();
    await send(stage, 500);
    await send(stage, 500);
    await send(stage, 500);
    c.advance(10_000);
    expect(await send(stage, 500)).toBe(500); // only 1 request in the window
    expect(await send(stage, 200)).toBe(200);
  });

  it('does not trip below the error ratio; 4xx are not errors', async () => {
    const { stage } = setup();
    for (let i = 0; i < 5; i++) await send(stage, 404);
    for (let i = 0; i < 4; i++) await send(stage, 500); // 4/9 < 0.5
    expect(await send(stage, 200)).toBe(200);
  });

  it('keeps state across config versions while the settings are unchanged', async () => {
    const { build } = setup();
    const a = build();
    for (let i = 0; i < 4; i++) await send(a, 500);
    expect(await send(build(), 200)).toBe(503);
    expect(await send(build({ ...SETTINGS, volume_threshold: 5 }), 200)).toBe(200);
    expect(await send(build(SETTINGS, 'rt_2'), 200)).toBe(200);
  });

  it('bounds the number of breakers kept', async () => {
    const c = clock();
    const f = createCircuitBreakerStage({ now: c.now, maxBreakers: 2 });
    const b = (id: string) => f(makeRoute({ circuit_breaker: SETTINGS }, { id }), makeEdge(), makeConfig(), testDeps())!;
    const first = b('rt_a');
    for (let i = 0; i < 4; i++) await send(first, 500);
    b('rt_b');
    b('rt_c'); // evicts rt_a
    expect(await send(b('rt_a'), 200)).toBe(200);
  });

  it('CircuitBreaker reports its state', () => {
    const c = clock();
    const cb = new CircuitBreaker({ trippedDurationMs: 1000, rollingWindowMs: 1000, numBuckets: 4, volumeThreshold: 1, errorThreshold: 1 }, c.now);
    const t = {};
    expect(cb.admit(t)).toBe(true);
    cb.record(t, 'error');
    expect(cb.state()).toBe('open');
    c.advance(1000);
    expect(cb.state()).toBe('half_open');
  });
});
