// Preloaded with `node --import` into a service process a test starts: that process's wall clock
// (Date.now(), new Date()) runs WARREN_TEST_CLOCK_SKEW_MS milliseconds ahead, as faketime '+5s'
// would make it (performance.md §3, clock skew), without faketime on the machine.
const skew = Number(process.env.WARREN_TEST_CLOCK_SKEW_MS ?? 0);
if (skew) {
  const RealDate = Date;
  const now = () => RealDate.now() + skew;
  class SkewedDate extends RealDate {
    constructor(...args) {
      if (args.length === 0) super(now());
      else super(...args);
    }
    static now() {
      return now();
    }
  }
  globalThis.Date = SkewedDate;
}
