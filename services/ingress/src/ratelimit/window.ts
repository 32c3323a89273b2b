/**
 * The sliding-window counter (Cloudflare's "two fixed windows" estimate), as pure functions; the
 * exact sliding log used below the limiter's `exactMax` follows further down (`logAdmits`).
 *
 * Time is cut into fixed windows of W ms aligned to the epoch: window k covers [k·W, (k+1)·W).
 * A bucket keeps two counts: P, the requests admitted in the previous window k−1, and C, those
 * admitted so far in the current window k. At e ms into window k the number of requests in the
 * rolling window (now − W, now] is estimated by assuming P's requests were spread evenly over
 * window k−1, of which the fraction (W − e)/W still lies inside the rolling window:
 *
 *     estimate = P · (1 − e/W) + C
 *
 * A request is admitted when estimate + 1 ≤ L (capacity). Only admitted requests increment C,
 * so a client over the limit is let through again as soon as the estimate decays; counting
 * denied requests would keep it blocked for as long as it keeps trying.
 *
 * All quantities are integers (ms, counts) and the comparison is done cross-multiplied,
 *
 *     P · (W − e) ≤ (L − 1 − C) · W,
 *
 * so it is exact in IEEE doubles (and in Redis' Lua 5.1, whose numbers are doubles) while the
 * products stay below 2^53 ≈ 9·10^15: e.g. counts up to 10^8 with W = 24 h. The Lua script in
 * script.ts makes the same decision with the same expression in its counter branch; these
 * functions are its reference (unit-tested) and the implementation of the in-memory limiter.
 *
 * The estimate is not exact: under steady traffic over the limit it disagrees with an exact log
 * on about a fifth of the decisions (test/load/ratelimit-accuracy-sim.ts), which is why buckets
 * of capacity up to `exactMax` keep the exact log instead. It stays for larger capacities, where
 * a log would cost memory and time proportional to L per key.
 */

/** The stored state of one bucket: the window index of `cur` and the two counts. */
export interface WindowState {
  /** Index k of the window `cur` belongs to (floor(ms / W)). */
  window: number;
  /** Admitted in window `window`. */
  cur: number;
  /** Admitted in window `window − 1`. */
  prev: number;
}

/** The counts as seen at `now`: P, C and e of the formulas above, plus the current window index. */
export interface WindowView {
  window: number;
  prev: number;
  cur: number;
  /** Milliseconds elapsed in the current window, 0 ≤ e < W. */
  elapsed: number;
  /** Milliseconds until `window` starts: 0, except when the state came from a later window (clock stepped back). */
  ahead: number;
}

/**
 * Rolls a stored state forward to the window of `nowMs`: the same window keeps its counts, the
 * next one turns cur into prev, anything older is forgotten. A state from a *later* window than
 * `nowMs` (the clock stepped back) is read as if it were the start of that window, the most
 * conservative reading: the whole of P counts, nothing of it has decayed.
 */
export function viewAt(state: WindowState | undefined, nowMs: number, windowMs: number): WindowView {
  const k = Math.floor(nowMs / windowMs);
  const elapsed = nowMs - k * windowMs;
  if (!state || state.window < k - 1) return { window: k, prev: 0, cur: 0, elapsed, ahead: 0 };
  if (state.window === k) return { window: k, prev: state.prev, cur: state.cur, elapsed, ahead: 0 };
  if (state.window === k - 1) return { window: k, prev: state.cur, cur: 0, elapsed, ahead: 0 };
  return { window: state.window, prev: state.prev, cur: state.cur, elapsed: 0, ahead: state.window * windowMs - nowMs };
}

/** True when one more request fits: P·(1 − e/W) + C + 1 ≤ L, evaluated without division. */
export function admits(v: WindowView, capacity: number, windowMs: number): boolean {
  return v.prev * (windowMs - v.elapsed) <= (capacity - 1 - v.cur) * windowMs;
}

/**
 * Milliseconds from the moment of `v` until a request would be admitted, if no other request is
 * admitted meanwhile (0 when one would be admitted now). From performance.md §3:
 *
 * - C < L: the current window still has room once P's share has decayed enough:
 *   P·(1 − (e+d)/W) ≤ L−1−C  ⇔  d ≥ W·(1 − (L−1−C)/P) − e. This is at most W − e, i.e. it never
 *   needs the next window; at the boundary P becomes C ≤ L−1 and the request fits.
 * - C ≥ L: nothing fits in this window; at e′ into the next one P′ = C, C′ = 0 and it fits when
 *   C·(1 − e′/W) ≤ L−1  ⇔  e′ ≥ W·(1 − (L−1)/C), so d = (W − e) + W·(1 − (L−1)/C) < 2W − e.
 *
 * The division is floored where it lowers the threshold, so the result is the exact smallest
 * integer d (in ms) at which `admits` turns true: never early. A view read from a later window
 * (clock stepped back) adds the time until that window starts.
 */
export function retryAfterMs(v: WindowView, capacity: number, windowMs: number): number {
  return v.ahead + untilAdmitted(v, capacity, windowMs);
}

function untilAdmitted(v: WindowView, capacity: number, windowMs: number): number {
  const { prev: p, cur: c, elapsed: e } = v;
  const L = capacity;
  const W = windowMs;
  if (c < L) {
    if (p <= 0 || admits(v, L, W)) return 0;
    // Smallest integer x = e + d with p·(W − x) ≤ (L−1−c)·W  ⇔  x ≥ W − (L−1−c)·W/p.
    const x = W - Math.floor(((L - 1 - c) * W) / p);
    return Math.max(0, x - e);
  }
  // Smallest integer e′ with c·(W − e′) ≤ (L−1)·W  ⇔  e′ ≥ W − (L−1)·W/c.
  const e2 = W - Math.floor(((L - 1) * W) / c);
  return W - e + e2;
}

/**
 * The exact sliding log (script.ts' log mode, for capacities up to the limiter's `exactMax`), as
 * pure functions over one bucket's log: the admission times (ms) of its most recent admitted
 * requests, newest first, at most L of them. They are the reference of the script's log branch
 * (the tests' oracle) the way the functions above are of its counter branch.
 *
 * A request at `now` is admitted iff fewer than L admissions lie in the rolling window
 * (now − W, now]. The log is sorted, so that is: it holds fewer than L entries, or its L-th entry
 * o (index L−1, the L-th most recent admission) is ≤ now − W. Keeping L entries is enough: a
 * decision reads only the L-th, and an older entry can never become the L-th again since entries
 * are only added at the head. (After a capacity increase the dropped ones would have counted: the
 * log then errs once on the lenient side, by at most the increase.) Denied requests are not
 * recorded, as in the counter.
 *
 * Unlike the counter this is exact: the rolling count never exceeds L, whatever the traffic, and
 * a client over the limit is admitted again at exactly o + W.
 */
export function logAdmits(log: readonly number[], nowMs: number, capacity: number, windowMs: number): boolean {
  const o = log[capacity - 1];
  return o === undefined || o <= nowMs - windowMs;
}

/**
 * Milliseconds from `now` until a request would be admitted, if no other request is admitted
 * meanwhile (0 when one would be admitted now): d = o + W − now, the exact smallest d with
 * o ≤ now + d − W, so never early.
 */
export function logRetryAfterMs(log: readonly number[], nowMs: number, capacity: number, windowMs: number): number {
  const o = log[capacity - 1];
  return o === undefined ? 0 : Math.max(0, o + windowMs - nowMs);
}

/**
 * Records an admission at `now` in `log` (in place): pushes `now` at the head (or the head's time
 * again if the clock stepped back below it, so the log stays sorted) and keeps the newest L.
 */
export function logRecord(log: number[], nowMs: number, capacity: number): void {
  const head = log[0];
  log.unshift(head !== undefined && head > nowMs ? head : nowMs);
  if (log.length > capacity) log.length = capacity;
}

/** The Retry-After value: whole seconds, rounded up, at least 1. */
export function retryAfterSeconds(ms: number): number {
  return Math.max(1, Math.ceil(ms / 1000));
}

/** Validates the arguments of `RateLimiter.hit`; throws a RangeError on values no policy can produce. */
export function checkArgs(capacity: number, windowSeconds: number): void {
  if (!Number.isSafeInteger(capacity) || capacity < 1) throw new RangeError(`rate limit capacity must be a positive integer, got ${capacity}`);
  if (!Number.isSafeInteger(windowSeconds) || windowSeconds < 1) throw new RangeError(`rate limit window must be a positive whole number of seconds, got ${windowSeconds}`);
}
