/** Jittered exponential backoff: `next()` gives the delay before the next attempt, `reset()` after a success. */
export class Backoff {
  private attempt = 0;
  constructor(
    private readonly initialMs = 100,
    private readonly maxMs = 5_000,
  ) {}
  /** A delay in [d/2, d] with d = min(max, initial · 2^attempt) ("equal jitter"). */
  next(): number {
    const d = Math.min(this.maxMs, this.initialMs * 2 ** Math.min(this.attempt++, 30));
    return d / 2 + Math.random() * (d / 2);
  }
  reset(): void {
    this.attempt = 0;
  }
}
