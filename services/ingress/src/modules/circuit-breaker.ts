import type { Logger } from 'pino';
import type { Outcome, RequestState, RouteStage, StageFactory, UpstreamResult } from '../pipeline/types.js';
import { enabledModule, moduleError } from './common.js';

/**
 * `circuit_breaker`: per route and ingress process, a rolling window of `rolling_window` seconds
 * split into `num_buckets` buckets counts upstream results (requests, and errors: 5xx statuses
 * and `'error'` results). After a result, the circuit trips when the window holds at least
 * `volume_threshold` requests, at least one error, and errors/requests ≥
 * `error_threshold_percentage`. While tripped every request is answered 503 (7103) for
 * `tripped_duration` seconds; then the circuit is half-open: one probe request goes through
 * (the others get 503); a non-5xx result closes the circuit (fresh window), an error re-trips it.
 * A probe that ends without an upstream result (`'none'`: refused by a later stage or rule, its
 * client went away before the answer, an Upgrade) frees its place at once: the next request is
 * the probe. One whose end is never reported is given up after `tripped_duration`.
 *
 * State survives config versions while the route's breaker settings are unchanged
 * (`BreakerRegistry`: exactly the breakers of the config last compiled are kept).
 *
 * The traffic-policy `circuit-breaker` action (`policy/flow-actions.ts`) runs the same breaker
 * (`CircuitBreaker`, `BreakerRegistry`, `breakerOpen`, `recordBreakerResult`).
 */

export interface CircuitBreakerSettings {
  trippedDurationMs: number;
  rollingWindowMs: number;
  numBuckets: number;
  volumeThreshold: number;
  errorThreshold: number;
}

export type CircuitState = 'closed' | 'open' | 'half_open';

export class CircuitBreaker {
  private readonly bucketMs: number;
  /** Bucket epochs (bucket index since the clock's 0) and their counts, a ring of numBuckets. */
  private readonly epochs: Float64Array;
  private readonly requests: Uint32Array;
  private readonly errors: Uint32Array;
  private openUntil = 0;
  private tripped = false;
  /** The request admitted as the half-open probe, and when (null: none out). */
  private probe: object | null = null;
  private probeSince: number | null = null;
  /** Probes admitted while tripped whose result may still come (a given-up one's result counts too). */
  private readonly probes = new WeakSet<object>();

  constructor(
    readonly settings: CircuitBreakerSettings,
    private readonly now: () => number = () => performance.now(),
  ) {
    const n = Math.min(128, Math.max(1, Math.floor(settings.numBuckets)));
    this.bucketMs = Math.max(1, settings.rollingWindowMs / n);
    this.epochs = new Float64Array(n).fill(-Infinity);
    this.requests = new Uint32Array(n);
    this.errors = new Uint32Array(n);
  }

  state(): CircuitState {
    if (!this.tripped) return 'closed';
    return this.now() < this.openUntil ? 'open' : 'half_open';
  }

  /** True when the request `token` may go upstream now (it may become the half-open probe). */
  admit(token: object): boolean {
    if (!this.tripped) return true;
    const t = this.now();
    if (t < this.openUntil) return false;
    if (this.probeSince !== null && t - this.probeSince < this.settings.trippedDurationMs) return false;
    this.probeSince = t;
    this.probe = token;
    this.probes.add(token);
    return true;
  }

  /**
   * Records the upstream result of an admitted request; `'none'`: it ended without one (not
   * counted; a probe frees its place). Told more than once, only the first result counts.
   */
  record(token: object, result: UpstreamResult): void {
    if (result === 'none') {
      if (this.probes.delete(token) && this.probe === token) {
        this.probe = null;
        this.probeSince = null;
      }
      return;
    }
    const failed = result === 'error' || result >= 500;
    const t = this.now();
    if (this.tripped) {
      if (!this.probes.has(token)) return;
      this.probes.delete(token);
      this.probe = null;
      this.probeSince = null;
      if (failed) this.trip(t);
      else {
        this.tripped = false;
        this.epochs.fill(-Infinity);
      }
      return;
    }
    const epoch = Math.floor(t / this.bucketMs);
    const i = epoch % this.epochs.length;
    if (this.epochs[i] !== epoch) {
      this.epochs[i] = epoch;
      this.requests[i] = 0;
      this.errors[i] = 0;
    }
    this.requests[i]!++;
    if (failed) this.errors[i]!++;
    // Checked after every result, a success too: 3 errors then a success at volume 4 is a window
    // of 4 requests at 75 % errors, over a 50 % threshold (the check is what Hystrix runs on
    // admission; a success can only lower the ratio, so it trips only where the ratio still holds).
    let requests = 0;
    let errors = 0;
    const oldest = epoch - this.epochs.length;
    for (let j = 0; j < this.epochs.length; j++) {
      if (this.epochs[j]! > oldest) {
        requests += this.requests[j]!;
        errors += this.errors[j]!;
      }
    }
    // At least one error, always: with error_threshold 0, successes alone must not trip it.
    if (errors > 0 && requests >= this.settings.volumeThreshold && errors / requests >= this.settings.errorThreshold) this.trip(t);
  }

  private trip(t: number): void {
    this.tripped = true;
    this.openUntil = t + this.settings.trippedDurationMs;
    this.probe = null;
    this.probeSince = null;
  }
}

/**
 * Breakers kept across config versions, exactly those the config last compiled uses: while a
 * config is compiled (`compiling(config)`, then `get` for each breaker it has), a breaker of the
 * previous config under the same key (route, and action place) with the same settings carries
 * over; the others are new, and the previous config's other breakers are dropped when the next
 * config is compiled. No LRU: one account's breakers cannot push out another's, and memory is
 * bounded by the config (a policy has at most `CIRCUIT_BREAKER_LIMITS.perPolicy`). Each registry
 * has its own clock.
 */
export class BreakerRegistry {
  /** The breakers of the config being (or last) compiled, and of the one before it. */
  private current = new Map<string, { settings: string; breaker: CircuitBreaker }>();
  private previous = new Map<string, { settings: string; breaker: CircuitBreaker }>();
  private config: WeakRef<object> | null = null;

  constructor(private readonly now: () => number = () => performance.now()) {}

  /** `config` is being compiled: from now on `get` builds its set of breakers (a no-op while it is the same config). */
  compiling(config: object): void {
    if (this.config?.deref() === config) return;
    this.config = new WeakRef(config);
    this.previous = this.current;
    this.current = new Map();
  }

  get(key: string, settings: CircuitBreakerSettings): CircuitBreaker {
    const wanted = JSON.stringify(settings);
    let entry = this.current.get(key);
    if (!entry || entry.settings !== wanted) {
      const before = this.previous.get(key);
      entry = before && before.settings === wanted ? before : { settings: wanted, breaker: new CircuitBreaker(settings, this.now) };
      this.current.set(key, entry);
    }
    return entry.breaker;
  }

  /** Breakers kept for the config being (or last) compiled. */
  get size(): number {
    return this.current.size;
  }
}

/** The answer to a request the open circuit refuses: 503 ERR_WARREN_7103, Retry-After the tripped duration. */
export function breakerOpen(s: RequestState, settings: CircuitBreakerSettings): NonNullable<Outcome> {
  return moduleError(s, 7103, undefined, { 'retry-after': String(Math.max(1, Math.ceil(settings.trippedDurationMs / 1000))) });
}

/** Records the upstream result of a request `breaker` admitted; logs when the circuit trips and when it closes again. */
export function recordBreakerResult(breaker: CircuitBreaker, token: object, result: UpstreamResult, log: Logger, context: Record<string, string>): void {
  if (result === 'none') {
    breaker.record(token, result);
    return;
  }
  const before = breaker.state();
  breaker.record(token, result);
  const after = breaker.state();
  if (before !== after && after === 'open') log.warn(context, 'circuit breaker tripped');
  else if (before !== 'closed' && after === 'closed') log.info(context, 'circuit breaker closed');
}

interface CircuitBreakerModule {
  tripped_duration?: number;
  rolling_window?: number;
  num_buckets?: number;
  volume_threshold?: number;
  error_threshold_percentage?: number;
}

/** A circuit_breaker factory with its own clock and breaker registry (per ingress process). */
export function createCircuitBreakerStage(opts: { now?: () => number } = {}): StageFactory {
  const breakers = new BreakerRegistry(opts.now);
  return (route, _edge, config, deps): RouteStage | null => {
    breakers.compiling(config);
    const m = enabledModule<CircuitBreakerModule>(route, 'circuit_breaker');
    if (!m) return null;
    const settings: CircuitBreakerSettings = {
      trippedDurationMs: Math.max(1, m.tripped_duration ?? 10) * 1000,
      rollingWindowMs: Math.max(1, m.rolling_window ?? 10) * 1000,
      numBuckets: Math.min(128, Math.max(1, m.num_buckets ?? 10)),
      volumeThreshold: m.volume_threshold ?? 0,
      errorThreshold: m.error_threshold_percentage ?? 0,
    };
    const breaker = breakers.get(route.id, settings);
    const context = { routeId: route.id };
    return {
      name: 'circuit_breaker',
      onRequest: (s: RequestState) => (breaker.admit(s) ? null : breakerOpen(s, settings)),
      onResult: (s, result) => recordBreakerResult(breaker, s, result, deps.log, context),
    };
  };
}

export const circuitBreakerStage: StageFactory = createCircuitBreakerStage();
