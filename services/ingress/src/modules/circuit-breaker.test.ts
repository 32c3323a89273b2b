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
  });

  it('checks after a success too: at the volume threshold with the ratio still over it, it trips', async () => {
    const { stage } = setup();
    for (let i = 0; i < 3; i++) expect(await send(stage, 500)).toBe(500);
    expect(await send(stage, 200)).toBe(200); // 4 requests, 75 % errors
    expect(await send(stage, 200)).toBe(503);
    const other = setup().stage;
    for (let i = 0; i < 2; i++) expect(await send(other, 500)).toBe(500);
    expect(await send(other, 200)).toBe(200);
    expect(await send(other, 200)).toBe(200); // 4 requests, 50 % errors: at the threshold, trips
    expect(await send(other, 200)).toBe(503);
    // error_threshold 0 still needs an error: successes alone never trip it.
    const zero = setup({ ...SETTINGS, volume_threshold: 2, error_threshold_percentage: 0 }).stage;
    for (let i = 0; i < 5; i++) expect(await send(zero, 200)).toBe(200);
    expect(await send(zero, 500)).toBe(500);
    expect(await send(zero, 200)).toBe(503);
    const below = setup().stage;
    expect(await send(below, 500)).toBe(500);
    for (let i = 0; i < 4; i++) expect(await send(below, 200)).toBe(200); // 20 % errors: stays closed
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

  it('keeps exactly the breakers of the config last compiled: no route can push out another', async () => {
    const c = clock();
    const f = createCircuitBreakerStage({ now: c.now });
    const b = (id: string, config: ReturnType<typeof makeConfig>) => f(makeRoute({ circuit_breaker: SETTINGS }, { id }), makeEdge(), config, testDeps())!;
    const v1 = makeConfig();
    for (let i = 0; i < 4; i++) await send(b('rt_a', v1), 500);
    // The next version: many other routes (once more than the old LRU's 10,000) and rt_a, which carries over.
    const v2 = makeConfig();
    for (let i = 0; i < 10_001; i++) b(`rt_other${i}`, v2);
    expect(await send(b('rt_a', v2), 200)).toBe(503);
    // A version without rt_a drops its breaker (and the others'): it starts afresh when it comes back.
    const v3 = makeConfig();
    b('rt_b', v3);
    expect(await send(b('rt_a', makeConfig()), 200)).toBe(200);
  });

  it('a probe that ends without a result frees its place at once (the client went away, a later stage refused it)', async () => {
    const { stage, c } = setup();
    for (let i = 0; i < 4; i++) await send(stage, 500);
    for (let round = 0; round < 3; round++) {
      c.advance(10_000);
      // Each round someone takes the probe and aborts: told 'none'. The next request probes and closes the circuit.
      const aborted = makeState();
      expect(await stage.onRequest!(aborted)).toBeNull();
      stage.onResult!(aborted, 'none');
      const probe = makeState();
      expect(await stage.onRequest!(probe)).toBeNull();
      expect(await send(stage, 200)).toBe(503); // one probe at a time
      stage.onResult!(probe, round < 2 ? 500 : 200);
    }
    expect(await send(stage, 200)).toBe(200);
  });

  it("'none' does not count, closes nothing, and a late one of a replaced probe leaves the current probe out", async () => {
    const { stage, c } = setup();
    for (let i = 0; i < 2; i++) await send(stage, 500);
    const s = makeState();
    expect(await stage.onRequest!(s)).toBeNull();
    stage.onResult!(s, 'none'); // not a result
    expect(await send(stage, 500)).toBe(500); // 3 results: below the volume threshold
    expect(await send(stage, 200)).toBe(200); // 4 results, 3 errors: trips
    expect(await send(stage, 200)).toBe(503);
    c.advance(10_000);
    const first = makeState();
    expect(await stage.onRequest!(first)).toBeNull();
    c.advance(10_000); // given up
    const second = makeState();
    expect(await stage.onRequest!(second)).toBeNull();
    stage.onResult!(first, 'none');
    expect(await send(stage, 200)).toBe(503); // second is still out
    stage.onResult!(second, 'none');
    expect(await send(stage, 200)).toBe(200);
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
