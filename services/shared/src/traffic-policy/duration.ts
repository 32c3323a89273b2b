/**
 * Go-style duration strings (`time.ParseDuration`): one or more `<number><unit>` parts with
 * units ns, us (µs, μs), ms, s, m, h and optional decimal fractions, e.g. `90s`, `1.5m`,
 * `1h30m`. Signs are not accepted (durations here are never negative).
 */

const UNIT_NS: Record<string, bigint> = {
  ns: 1n,
  us: 1_000n,
  'µs': 1_000n,
  'μs': 1_000n,
  ms: 1_000_000n,
  s: 1_000_000_000n,
  m: 60_000_000_000n,
  h: 3_600_000_000_000n,
};

const PART_RE = /(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)/y;

/** The duration in nanoseconds, or `undefined` when `s` is not a duration string. */
export function parseDurationNs(s: string): bigint | undefined {
  if (s.length === 0 || s.length > 128) return undefined;
  if (s === '0') return 0n;
  let total = 0n;
  let pos = 0;
  while (pos < s.length) {
    PART_RE.lastIndex = pos;
    const m = PART_RE.exec(s);
    if (!m) return undefined;
    const [num, unit] = [m[1]!, m[2]!];
    const unitNs = UNIT_NS[unit]!;
    const [intPart = '', frac = ''] = num.split('.');
    total += BigInt(intPart || '0') * unitNs;
    if (frac) total += (BigInt(frac) * unitNs) / 10n ** BigInt(frac.length);
    pos = PART_RE.lastIndex;
  }
  return total;
}
