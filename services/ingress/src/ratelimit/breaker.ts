/**
 * A small circuit breaker for the Redis store, so a dead or stalled Redis does not add the full
 * timeout to every request: after `threshold` consecutive failures the circuit opens and
 * requests skip Redis for `openMs`; then one request probes it (half-open) while the others keep
 * skipping; the probe's success closes the circuit, its failure opens it again.
 */
export interface BreakerOptions {
  /** Consecutive failures that open the circuit (default 3). */
  threshold?: number;
  /** How long an open circuit skips Redis before a probe (default 1000 ms). */
  openMs?: number;
}

export type BreakerState = 'closed' | 'open' | 'half-open';

export class CircuitBreaker {
  private readonly threshold: number;
  private readonly openMs: number;
  private failures = 0;
  private openUntil = 0;
  private probing = false;
  private _state: BreakerState = 'closed';

  constructor(opts: BreakerOptions = {}, private readonly now: () => number = () => performance.now()) {
    this.threshold = Math.max(1, opts.threshold ?? 3);
    this.openMs = Math.max(0, opts.openMs ?? 1000);
  }

  get state(): BreakerState {
    return this._state;
  }

  /** Whether this request may try Redis. In half-open state only the single probe may. */
  allow(): boolean {
    if (this._state === 'closed') return true;
    if (this._state === 'open') {
      if (this.now() < this.openUntil) return false;
      this._state = 'half-open';
      this.probing = false;
    }
    if (this.probing) return false;
    this.probing = true;
    return true;
  }

  /** Reports a successful attempt; returns true when this closed an open circuit. */
  success(): boolean {
    this.failures = 0;
    if (this._state === 'closed') return false;
    this._state = 'closed';
    this.probing = false;
    return true;
  }

  /**
   * Reports an attempt that waited for nothing (Redis not connected: refused at once): neither a
   * success nor a failure, but a half-open probe's place is free again.
   */
  abstain(): void {
    if (this._state === 'half-open') this.probing = false;
  }

  /** Reports a failed attempt; returns true when this opened the circuit. */
  failure(): boolean {
    this.failures++;
    if (this._state === 'half-open' || (this._state === 'closed' && this.failures >= this.threshold)) {
      const opened = this._state === 'closed';
      this._state = 'open';
      this.openUntil = this.now() + this.openMs;
      this.probing = false;
      return opened;
    }
    return false;
  }
}
