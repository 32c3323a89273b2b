/**
 * The timestamp accessors that take a time zone (`t.getHours(tz)`, `getDayOfWeek(tz)`, …) as
 * cel-go computes them (common/types/timestamp.go, `timeZone`), which ngrok's engine runs:
 *
 * - A zone with a `:` is a fixed offset: the part before the first `:` is the hours and the part
 *   after it the minutes, each read as Go's `strconv.Atoi` reads an int (an optional sign, then
 *   decimal digits: `+05:30`, `-08:00`, `5:30`, `-00:30`); the hours must be from -23 to 23 and
 *   the minutes from 0 to 59. The offset is `hours * 60 ± minutes`, minus when the zone starts
 *   with `-` (so `-00:30` is half an hour west). Anything else (`+05:30:00`, `+5:x`, `+24:00`,
 *   `+01:60`) is an evaluation error naming the zone.
 * - A zone without one is an IANA name (`America/New_York`), as Go's `time.LoadLocation` loads
 *   it, `''` being UTC; an unknown name is an evaluation error (`unknown time zone …`). The
 *   library read names through `Date.toLocaleString` (≈100 µs a call, offsets refused): here each
 *   name's `Intl.DateTimeFormat` is made once (≈120 µs) and kept (`MAX_CACHED_ZONES`), ≈5 µs a call.
 *
 * The accessors are cel-go's: `getFullYear`, `getMonth` (0-11), `getDate` (1-31),
 * `getDayOfMonth` (0-30), `getDayOfYear` (0-365), `getDayOfWeek` (0 is Sunday), `getHours`,
 * `getMinutes`, `getSeconds`, `getMilliseconds` (the zone is checked there too). The accessors
 * without a zone (UTC) stay the library's. Each is taken over as a macro (declared on another
 * receiver type, since the library refuses a second overload of its own), as `matches()` is in
 * `cel.ts`; the cost estimate charges them (`cost.ts`, `C.timeZone*`).
 */
import type { Environment } from '@marcbachmann/cel-js';
import { evalError } from './cel-values.js';
import type { CheckedType, MacroCall, MacroChecker, MacroEvaluator } from './macro-hooks.js';

/** The accessors that take a zone. */
export const ZONED_ACCESSORS = ['getFullYear', 'getMonth', 'getDate', 'getDayOfMonth', 'getDayOfYear', 'getDayOfWeek', 'getHours', 'getMinutes', 'getSeconds', 'getMilliseconds'] as const;
export type ZonedAccessor = (typeof ZONED_ACCESSORS)[number];

const MS_PER_DAY = 86_400_000;

const GO_INT = /^[+-]?\d+$/;

/** A zone as a message shows it (a computed one may be a whole header). */
const shown = (tz: string): string => (tz.length > 64 ? `${tz.slice(0, 64)}…` : tz);

/**
 * Go's `strconv.Atoi`: an optional sign and decimal digits, in int64's range; else Go's error.
 * A value past ±1,000,000 reads as that (the caller refuses anything past ±59). No BigInt: a
 * computed zone may be a whole header of digits.
 */
function goAtoi(s: string): { value: number } | { error: string } {
  if (!GO_INT.test(s)) return { error: `strconv.Atoi: parsing ${JSON.stringify(shown(s))}: invalid syntax` };
  const negative = s.charCodeAt(0) === 0x2d;
  const digits = s.replace(/^[+-]?0*/, '');
  if (digits.length <= 7) return { value: (negative ? -1 : 1) * Number(digits || '0') };
  const max = negative ? '9223372036854775808' : '9223372036854775807';
  if (digits.length > max.length || (digits.length === max.length && digits > max)) return { error: `strconv.Atoi: parsing ${JSON.stringify(shown(s))}: value out of range` };
  return { value: negative ? -1_000_000 : 1_000_000 };
}

/** Minutes east of UTC of a zone with a `:` (cel-go's fixed offset), or throws. */
export function fixedOffsetMinutes(tz: string): number {
  const colon = tz.indexOf(':');
  const hr = goAtoi(tz.slice(0, colon));
  if ('error' in hr) throw evalError('invalid_argument', `time zone ${JSON.stringify(shown(tz))}: ${hr.error}`);
  const min = goAtoi(tz.slice(colon + 1));
  if ('error' in min) throw evalError('invalid_argument', `time zone ${JSON.stringify(shown(tz))}: ${min.error}`);
  if (hr.value < -23 || hr.value > 23) throw evalError('invalid_argument', `timezone offset hours out of range [-23, 23]: ${shown(tz)}`);
  if (min.value < 0 || min.value > 59) throw evalError('invalid_argument', `timezone offset minutes out of range [0, 59]: ${shown(tz)}`);
  return tz.charCodeAt(0) === 0x2d /* - */ ? hr.value * 60 - min.value : hr.value * 60 + min.value;
}

/**
 * Most IANA zones kept: Intl reads names case-insensitively, so they are kept by their
 * lower-case name, and there are some 600 (with their aliases, under 1,000). Past this many
 * (names Intl accepts that are not zones of today's list, if any), the cache starts over.
 */
export const MAX_CACHED_ZONES = 2048;
const zones = new Map<string, Intl.DateTimeFormat>();

const ZONE_PARTS: Intl.DateTimeFormatOptions = { hourCycle: 'h23', era: 'short', year: 'numeric', month: 'numeric', day: 'numeric', hour: 'numeric', minute: 'numeric', second: 'numeric' };

function zoneFormat(tz: string): Intl.DateTimeFormat {
  const key = tz.toLowerCase();
  const known = zones.get(key);
  if (known) return known;
  let f: Intl.DateTimeFormat;
  try {
    f = new Intl.DateTimeFormat('en-US', { ...ZONE_PARTS, timeZone: tz });
  } catch {
    throw evalError('invalid_argument', `unknown time zone ${shown(tz)}`);
  }
  if (zones.size >= MAX_CACHED_ZONES) zones.clear();
  zones.set(key, f);
  return f;
}

/** Milliseconds east of UTC of IANA zone `tz` at `d`. */
function zoneOffsetMs(d: Date, tz: string): number {
  const t = d.getTime();
  let era = 'AD';
  let year = 0;
  let month = 0;
  let day = 0;
  let hour = 0;
  let minute = 0;
  let second = 0;
  for (const p of zoneFormat(tz).formatToParts(d)) {
    switch (p.type) {
      case 'era':
        era = p.value;
        break;
      case 'year':
        year = Number(p.value);
        break;
      case 'month':
        month = Number(p.value);
        break;
      case 'day':
        day = Number(p.value);
        break;
      case 'hour':
        hour = Number(p.value);
        break;
      case 'minute':
        minute = Number(p.value);
        break;
      case 'second':
        second = Number(p.value);
        break;
    }
  }
  // The wall clock as if it were UTC (years before 100 and BC as they are, not as Date.UTC reads them).
  const wall = new Date(0);
  wall.setUTCFullYear(era === 'BC' || era === 'B' ? 1 - year : year, month - 1, day);
  wall.setUTCHours(hour, minute, second, 0);
  const wholeSecond = t - (((t % 1000) + 1000) % 1000);
  return wall.getTime() - wholeSecond;
}

/** `d` shifted so that its UTC fields are the wall clock in `tz` (cel-go's `t.In(loc)`), or throws. */
export function inTimeZone(d: Date, tz: string): Date {
  const offset = tz.includes(':') ? fixedOffsetMinutes(tz) * 60_000 : tz === '' || tz === 'UTC' ? 0 : zoneOffsetMs(d, tz);
  return offset === 0 ? d : new Date(d.getTime() + offset);
}

/** Accessor `name` of `d` in zone `tz` (cel-go's values). */
export function zonedField(name: ZonedAccessor, d: Date, tz: string): bigint {
  const z = inTimeZone(d, tz);
  switch (name) {
    case 'getFullYear':
      return BigInt(z.getUTCFullYear());
    case 'getMonth':
      return BigInt(z.getUTCMonth());
    case 'getDate':
      return BigInt(z.getUTCDate());
    case 'getDayOfMonth':
      return BigInt(z.getUTCDate() - 1);
    case 'getDayOfWeek':
      return BigInt(z.getUTCDay());
    case 'getDayOfYear': {
      const start = new Date(0);
      start.setUTCFullYear(z.getUTCFullYear(), 0, 1);
      return BigInt(Math.floor((z.getTime() - start.getTime()) / MS_PER_DAY));
    }
    case 'getHours':
      return BigInt(z.getUTCHours());
    case 'getMinutes':
      return BigInt(z.getUTCMinutes());
    case 'getSeconds':
      return BigInt(z.getUTCSeconds());
    case 'getMilliseconds':
      return BigInt(z.getUTCMilliseconds());
  }
}


const TIMESTAMP = 'google.protobuf.Timestamp';

function zonedMacro(name: ZonedAccessor) {
  return ({ ast, args, receiver }: MacroCall) => {
    const zone = args[0];
    return {
      typeCheck(checker: MacroChecker, _macro: unknown, ctx: unknown) {
        const rt = checker.check(receiver, ctx);
        const zt = checker.check(zone, ctx);
        // A `dyn` (or a type parameter) is checked when evaluated.
        const open = (t: CheckedType) => t.kind === 'dyn' || t.kind === 'param';
        if ((!open(rt) && rt.name !== TIMESTAMP) || (!open(zt) && zt.name !== 'string')) {
          throw checker.createError('no_matching_overload', `found no matching overload for '${rt.name}.${name}(${zt.name})'`, ast);
        }
        return checker.intType;
      },
      evaluate(ev: MacroEvaluator, _macro: unknown, ctx: unknown): bigint {
        const d = ev.run(receiver, ctx);
        const tz = ev.run(zone, ctx);
        if (!(d instanceof Date) || typeof tz !== 'string') {
          throw ev.createError('no_matching_overload', `${name}() needs a timestamp and a string time zone`, ast);
        }
        return zonedField(name, d, tz);
      },
    };
  };
}

/**
 * Registers the accessors that take a zone as macros on `receiverType`, a registered type other
 * than the timestamp's (the library refuses an overload overlapping its own); they apply to
 * timestamps.
 */
export function registerZonedAccessors(env: Environment, receiverType: string): void {
  for (const name of ZONED_ACCESSORS) env.registerFunction(`${receiverType}.${name}(ast): int`, zonedMacro(name) as never);
}
