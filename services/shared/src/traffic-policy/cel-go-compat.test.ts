import { describe, expect, it } from 'vitest';
import { EvaluationError } from '@marcbachmann/cel-js';
import { CEL_TIME, CelActions, CelConn, CelRequest, CelResponse } from './cel-vars.js';
import { CelCompileError, compileExpression } from './cel.js';
import { estimateCost, MAX_EXPRESSION_COST } from './cost.js';
import { parseQueryValues } from './ngrok-macros.js';
import { indexOf, lastIndexOf, substring } from './string-index.js';
import { fixedOffsetMinutes } from './time-zones.js';

/**
 * Where the CEL library differs from cel-go (ngrok's engine) and Warren follows cel-go:
 * string indices in code points (`string-index.ts`), fixed-offset time zones (`time-zones.ts`),
 * and the query read as Go's `url.ParseQuery` reads it (`parseQueryValues`).
 */

function activation(o: { headers?: string[]; query?: string } = {}) {
  const headers = o.headers ?? [];
  return {
    req: new CelRequest({ method: 'GET', scheme: 'https', host: 'app.example.com', authority: 'app.example.com', path: '/p', rawQuery: o.query ?? '', headers: () => headers }),
    conn: new CelConn('203.0.113.7', 443),
    res: new CelResponse({ status: () => 200, headers: () => [] }),
    actions: new CelActions(),
    time: CEL_TIME,
    vars: new Map<string, unknown>(),
  };
}

const run = (expr: string, o: { headers?: string[]; query?: string } = {}): unknown => compileExpression('inbound', expr, false)(activation(o));

/** The evaluation error `expr` fails with (a CEL EvaluationError, not another exception). */
function evalError(expr: string, o: { headers?: string[]; query?: string } = {}): EvaluationError {
  try {
    run(expr, o);
  } catch (err) {
    expect(err, expr).toBeInstanceOf(EvaluationError);
    return err as EvaluationError;
  }
  throw new Error(`expected ${expr} to fail`);
}

function compileError(expr: string): string {
  try {
    compileExpression('inbound', expr, false);
  } catch (err) {
    expect(err).toBeInstanceOf(CelCompileError);
    return (err as CelCompileError).message;
  }
  throw new Error(`expected ${expr} not to compile`);
}

describe('indexOf(), lastIndexOf(), substring(): code points, as cel-go', () => {
  it('count a character past U+FFFF once, as size() does', () => {
    expect(run("'😀abc'.indexOf('a')")).toBe(1n);
    expect(run("'😀abc'.substring(1, 2)")).toBe('a');
    expect(run("'😀abc'.substring(1)")).toBe('abc');
    expect(run("'😀abc'.substring(0, 1)")).toBe('😀');
    expect(run("'😀abc'.lastIndexOf('c')")).toBe(3n);
    expect(run("'a😀b😀'.lastIndexOf('😀')")).toBe(3n);
    expect(run("'a😀b😀'.indexOf('😀', 2)")).toBe(3n);
    expect(run("'😀😀x'.indexOf('x', 2)")).toBe(2n);
    expect(run("'x😀😀x'.lastIndexOf('x', 2)")).toBe(0n);
    expect(run("'😀'.lastIndexOf('')")).toBe(1n);
    expect(run("size('😀abc') == 4 && '😀abc'.substring(4) == '' && '😀abc'.substring(size('😀abc') - 1) == 'c'")).toBe(true);
  });

  it("cel-spec's string_ext cases", () => {
    const cases: [string, unknown][] = [
      ["'tacocat'.indexOf('')", 0n],
      ["'tacocat'.indexOf('ac')", 1n],
      ["'tacocat'.indexOf('none')", -1n],
      ["'tacocat'.indexOf('', 3)", 3n],
      ["'tacocat'.indexOf('a', 3)", 5n],
      ["'tacocat'.indexOf('at', 3)", 5n],
      ["'ta©o©αT'.indexOf('©')", 2n],
      ["'ta©o©αT'.indexOf('©', 3)", 4n],
      ["'ta©o©αT'.indexOf('©αT', 3)", 4n],
      ["'ta©o©αT'.indexOf('©α', 5)", -1n],
      ["'tacocat'.lastIndexOf('')", 7n],
      ["'tacocat'.lastIndexOf('at')", 5n],
      ["'tacocat'.lastIndexOf('none')", -1n],
      ["'tacocat'.lastIndexOf('', 3)", 3n],
      ["'tacocat'.lastIndexOf('a', 3)", 1n],
      ["'ta©o©αT'.lastIndexOf('©')", 4n],
      ["'ta©o©αT'.lastIndexOf('©', 3)", 2n],
      ["'ta©o©αT'.lastIndexOf('©α', 4)", 4n],
      ["'tacocat'.substring(4)", 'cat'],
      ["'tacocat'.substring(0, 4)", 'taco'],
      ["'tacocat'.substring(7)", ''],
      ["'ta©o©αT'.substring(2, 6)", '©o©α'],
      ["'ta©o©αT'.substring(7, 7)", ''],
    ];
    for (const [e, want] of cases) expect(run(e), e).toEqual(want);
  });

  it('offsets and ranges as cel-go checks them', () => {
    // An offset at or past the end finds nothing; a negative one is an error; an empty search
    // string gives the offset as it is.
    expect(run("'abc'.indexOf('c', 3)")).toBe(-1n);
    expect(run("'abc'.lastIndexOf('a', 5)")).toBe(-1n);
    expect(run("'abc'.indexOf('', 7)")).toBe(7n);
    expect(run("''.indexOf('a')")).toBe(-1n);
    expect(run("''.lastIndexOf('a')")).toBe(-1n);
    expect(run("''.lastIndexOf('')")).toBe(0n);
    expect(evalError("'😀a'.indexOf('a', -1)").message).toMatch(/indexOf\(\): index out of range: -1/);
    expect(evalError("'😀a'.lastIndexOf('a', -2)").message).toMatch(/lastIndexOf\(\): index out of range: -2/);
    expect(evalError("'😀abc'.substring(5)").message).toMatch(/substring\(\): index out of range: 5/);
    expect(evalError("'😀abc'.substring(-1)").message).toMatch(/index out of range: -1/);
    expect(evalError("'😀abc'.substring(2, 1)").message).toMatch(/invalid substring range. start: 2, end: 1/);
    expect(evalError("'😀abc'.substring(1, 5)").message).toMatch(/index out of range: 5/);
    expect(evalError("'abc'.substring(0, 9223372036854775807)").message).toMatch(/index out of range: 9223372036854775807/);
    expect(run("'abc'.indexOf('a', 9223372036854775807)")).toBe(-1n);
  });

  it("a header's byte in no UTF-8 sequence is one code point, U+FFFD to Go", () => {
    // `\xff` is no UTF-8: the header holds it as a lone surrogate (`headerText`).
    const headers = ['x', '\xffb\xf0\x9f\x98\x80c'];
    expect(run("getReqHeader('x')[0].indexOf('b')", { headers })).toBe(1n);
    expect(run("getReqHeader('x')[0].indexOf('c')", { headers })).toBe(3n);
    expect(run("getReqHeader('x')[0].indexOf('\\uFFFD')", { headers })).toBe(0n);
    expect(run("getReqHeader('x')[0].substring(0, 2)", { headers })).toBe('\ufffdb');
    expect(run("getReqHeader('x')[0].lastIndexOf('😀')", { headers })).toBe(2n);
    expect(run("getReqHeader('x')[0].charAt(0) + getReqHeader('x')[0].charAt(2)", { headers })).toBe('\ufffd😀');
    expect(indexOf('\udcff\ud83d\ude00a', '\udcfe')).toBe(0n);
    expect(lastIndexOf('a\ud800', '\ufffd')).toBe(1n);
    expect(substring('\ud83d\ude00\udcff', 1n)).toBe('\ufffd');
  });

  it('on req.url and the other string-like values; operands type-checked', () => {
    const act = activation({ query: 'q=1' });
    expect(compileExpression('inbound', "req.url.indexOf('?')", false)(act)).toBe(BigInt('https://app.example.com/p'.length));
    expect(compileExpression('inbound', 'req.url.substring(0, 5)', false)(act)).toBe('https');
    expect(compileError("'a'.indexOf(1) == 0")).toMatch(/found no matching overload for 'string.indexOf\(int\)'/);
    expect(compileError("'a'.substring('1') == ''")).toMatch(/found no matching overload/);
    expect(compileError("[1].indexOf('a') == 0")).toMatch(/found no matching overload/);
    // A dyn is checked when evaluated.
    expect(evalError("json.decode('1').indexOf('a') == 0").message).toMatch(/found no matching overload for 'double.indexOf\(string\)'/);
    expect(run("json.decode('\"😀a\"').indexOf('a')")).toBe(1n);
  });

  it('keeps the native search for strings without surrogates', () => {
    const s = 'é'.repeat(1000) + 'x';
    expect(indexOf(s, 'x')).toBe(1000n);
    expect(lastIndexOf(s, 'é', 5n)).toBe(5n);
    expect(substring(s, 999n, 1001n)).toBe('éx');
  });

  it('is costed: a search and the code point conversion', () => {
    const c = (e: string) => estimateCost(compileExpression('inbound', e));
    expect(c("req.path.indexOf('a') > 0")).toBeGreaterThan(c("req.path.contains('a')"));
    expect(c("req.path.substring(1) == 'a'")).toBeLessThan(MAX_EXPRESSION_COST);
  });
});

describe('time zones: IANA names and fixed offsets, as cel-go', () => {
  const T = "timestamp('2024-01-01T20:00:00Z')";

  it('reads ±HH:MM offsets', () => {
    expect(run(`${T}.getHours('+05:30')`)).toBe(1n);
    expect(run(`${T}.getMinutes('+05:30')`)).toBe(30n);
    expect(run(`${T}.getDate('+05:30')`)).toBe(2n);
    expect(run(`${T}.getDayOfMonth('+05:30')`)).toBe(1n);
    expect(run(`${T}.getDayOfWeek('+05:30')`)).toBe(2n); // Tuesday, 2 January
    expect(run(`${T}.getDayOfYear('+05:30')`)).toBe(1n);
    expect(run(`${T}.getHours('-08:00')`)).toBe(12n);
    const early = "timestamp('2024-01-01T05:00:00.250Z')";
    expect(run(`${early}.getFullYear('-08:00')`)).toBe(2023n);
    expect(run(`${early}.getMonth('-08:00')`)).toBe(11n);
    expect(run(`${early}.getDayOfYear('-08:00')`)).toBe(364n);
    expect(run(`${early}.getDayOfWeek('-08:00')`)).toBe(0n); // Sunday, 31 December
    expect(run(`${early}.getSeconds('+01:00')`)).toBe(0n);
    expect(run(`${early}.getMilliseconds('+01:00')`)).toBe(250n);
    // As Go's strconv.Atoi reads the parts: no sign, one digit, `-00` (the sign is the zone's).
    expect(run(`${T}.getHours('5:30')`)).toBe(1n);
    expect(run(`${T}.getHours('+5:30')`)).toBe(1n);
    expect(run(`${T}.getHours('-00:30')`)).toBe(19n);
    expect(run(`${T}.getMinutes('-00:30')`)).toBe(30n);
    expect(run(`${T}.getHours('+00:00')`)).toBe(20n);
    expect(fixedOffsetMinutes('-23:59')).toBe(-1439);
    expect(fixedOffsetMinutes('+014:05')).toBe(845);
    expect(fixedOffsetMinutes('-0000000000000000000000005:00')).toBe(-300);
    // A whole header of digits: refused quickly, the message cut short.
    const long = `+${'9'.repeat(16_000)}:00`;
    const t0 = performance.now();
    expect(() => fixedOffsetMinutes(long)).toThrow(/value out of range/);
    expect(performance.now() - t0).toBeLessThan(50);
    expect(() => fixedOffsetMinutes('9223372036854775807:00')).toThrow(/hours out of range/);
    expect(() => fixedOffsetMinutes('-9223372036854775808:00')).toThrow(/hours out of range/);
    expect(() => fixedOffsetMinutes('9223372036854775808:00')).toThrow(/value out of range/);
  });

  it('refuses malformed offsets with an evaluation error naming the zone', () => {
    const cases: [string, RegExp][] = [
      ['+24:00', /timezone offset hours out of range \[-23, 23\]: \+24:00/],
      ['-24:00', /hours out of range/],
      ['+01:60', /timezone offset minutes out of range \[0, 59\]: \+01:60/],
      ['+01:-5', /minutes out of range/],
      ['+05:30:00', /"\+05:30:00".*parsing "30:00": invalid syntax/],
      ['ab:00', /parsing "ab": invalid syntax/],
      ['+5:x', /parsing "x": invalid syntax/],
      [':30', /parsing "": invalid syntax/],
      ['+ 5:30', /invalid syntax/],
      ['99999999999999999999:00', /value out of range/],
    ];
    for (const [tz, re] of cases) expect(evalError(`${T}.getHours('${tz}')`).message, tz).toMatch(re);
    expect(evalError(`${T}.getHours('Mars/Base')`).message).toMatch(/unknown time zone Mars\/Base/);
    // cel-go checks the zone for every accessor, getMilliseconds() too.
    expect(evalError(`${T}.getMilliseconds('Mars/Base')`).message).toMatch(/unknown time zone/);
    expect(evalError(`${T}.getMilliseconds('+99:00')`).message).toMatch(/hours out of range/);
  });

  it('reads IANA names, with their daylight saving time', () => {
    expect(run(`${T}.getHours('America/New_York')`)).toBe(15n);
    expect(run("timestamp('2024-07-01T12:00:00Z').getHours('America/New_York')")).toBe(8n);
    expect(run("timestamp('2023-05-28T23:00:00Z').getMinutes('Asia/Kolkata')")).toBe(30n);
    expect(run(`${T}.getDayOfWeek('Pacific/Kiritimati')`)).toBe(2n);
    expect(run(`${T}.getHours('UTC')`)).toBe(20n);
    expect(run(`${T}.getHours('')`)).toBe(20n);
    // Before the first year: year 0 as Go counts (1 BC).
    expect(run("timestamp('0001-01-01T00:00:00Z').getFullYear('America/New_York')")).toBe(0n);
    expect(run("timestamp('0001-01-01T00:00:00Z').getFullYear('-01:00')")).toBe(0n);
    expect(run("timestamp('0001-01-01T00:00:00Z').getDayOfYear('America/New_York')")).toBe(365n);
    // Without a zone: UTC, the library's.
    expect(run(`${T}.getHours()`)).toBe(20n);
  });

  it('takes a computed zone; refuses operands of other types', () => {
    expect(run("time.now.getHours(getReqHeader('tz')[0]) >= 0", { headers: ['tz', '+09:00'] })).toBe(true);
    expect(run("timestamp('2024-01-01T20:00:00Z').getHours(getReqHeader('tz')[0])", { headers: ['tz', 'Asia/Tokyo'] })).toBe(5n);
    expect(compileError('timestamp(0).getHours(1) == 0')).toMatch(/found no matching overload/);
    expect(compileError("duration('1h').getHours('UTC') == 0")).toMatch(/found no matching overload/);
    expect(evalError("json.decode('1').getHours('UTC') == 0").message).toMatch(/getHours\(\) needs a timestamp/);
  });

  it('is costed: an IANA name looked up, more when computed', () => {
    const c = (e: string) => estimateCost(compileExpression('inbound', e));
    const offset = c("time.now.getHours('+05:30') > 8");
    const named = c("time.now.getHours('Europe/Paris') > 8");
    const computed = c("time.now.getHours(getReqHeader('tz')[0]) > 8");
    expect(offset).toBeLessThan(named);
    expect(named).toBeLessThan(computed);
    expect(computed).toBeLessThan(MAX_EXPRESSION_COST);
  });
});

describe("req.url.query_params: Go's url.ParseQuery", () => {
  const params = (query: string) => Object.fromEntries(run('req.url.query_params', { query }) as Map<string, string[]>);

  it('splits at & only: a pair with ; is dropped', () => {
    expect(params('a=1;b=2&c=3')).toEqual({ c: ['3'] });
    expect(params('a=1&b=x;y&c=3')).toEqual({ a: ['1'], c: ['3'] });
    expect(run("hasQueryParam('a')", { query: 'a=1;b=2' })).toBe(false);
  });

  it('drops a pair with an invalid escape instead of keeping it literally', () => {
    expect(params('x=%zz&y=%41&z%=1&w=%4')).toEqual({ y: ['A'] });
    expect(run("hasQueryParam('x') || getQueryParam('y') != ['A']", { query: 'x=%zz&y=%41' })).toBe(false);
  });

  it('+ is a space; a key without = has the value ""; empty pairs are skipped; order is kept', () => {
    expect(params('q=a+b&k%20x=%2B&flag&e=&&a=1&a=2&')).toEqual({ q: ['a b'], 'k x': ['+'], flag: [''], e: [''], a: ['1', '2'] });
    expect(params('=v')).toEqual({ '': ['v'] });
    expect(params('')).toEqual({});
  });

  it('keeps a leading ? (a target with ??) and bytes in no UTF-8 sequence as they are', () => {
    expect(params('?a=1')).toEqual({ '?a': ['1'] });
    expect(params('a=%E2%82%AC')).toEqual({ a: ['€'] });
    // %FF is no UTF-8: a byte of its own (as a header holds one), not U+FFFD.
    expect(run("size(req.url.query_params) == 1 && !('\\uFFFD' in req.url.query_params) && req.url.query_params.exists(k, size(k) == 1)", { query: '%FF=1' })).toBe(true);
    expect(parseQueryValues('%FF=%C3')).toEqual(new Map([['\udcff', ['\udcc3']]]));
  });
});
