import { describe, expect, it } from 'vitest';
import { CEL_TIME, CelActions, CelConn, CelRequest } from './cel-vars.js';
import type { CelProgram } from './cel.js';
import { MAX_POLICY_COST } from './cost.js';
import { parseTrafficPolicy, TrafficPolicyError, validateTrafficPolicy } from './parse.js';
import type { PolicyDirection } from './types.js';
import { applyUrlTemplate, compileUrlTemplate, URL_ACTION_LIMITS, UrlActionRuntimeError, UrlTemplateError, urlTemplateCost, type UrlTemplate } from './url-actions.js';
import { cpuTimings, machineSlowdown, repsFor } from '../../../../test/support/cpu-time.js';

/** A request view for `${…}` (header `x-v` carries test values). */
function act(headers: string[] = []) {
  return {
    req: new CelRequest({ method: 'GET', scheme: 'https', host: 'app.example.com', authority: 'app.example.com', path: '/', rawQuery: '', headers: () => headers }),
    conn: new CelConn('203.0.113.7', 443),
    actions: new CelActions(),
    time: CEL_TIME,
  };
}

const evaluator = (a: object) => (p: CelProgram) => String(p(a));

function apply(from: string | undefined, to: string, url: string, headers: string[] = []) {
  return applyUrlTemplate(compileUrlTemplate('inbound', from, to), url, evaluator(act(headers)));
}

const U = 'https://app.example.com/api/v1/users/42?x=1&y=2';

function refused(doc: unknown, checkCost = true): TrafficPolicyError {
  try {
    if (checkCost) parseTrafficPolicy(JSON.stringify(doc));
    else validateTrafficPolicy(doc);
  } catch (err) {
    expect(err).toBeInstanceOf(TrafficPolicyError);
    return err as TrafficPolicyError;
  }
  throw new Error(`expected ${JSON.stringify(doc)} to be refused`);
}

const rewrite = (config: unknown, direction: PolicyDirection = 'inbound') => ({ [direction]: [{ actions: [{ type: 'url-rewrite', config }] }] });
const redirect = (config: unknown, direction: PolicyDirection = 'inbound') => ({ [direction]: [{ actions: [{ type: 'redirect', config }] }] });

describe('url-rewrite / redirect templates', () => {
  it('replaces every match, with $1, ${1}, $name, ${name}, $0 and $$', () => {
    expect(apply('/v1/', '/v2/', U)?.url).toBe('https://app.example.com/api/v2/users/42?x=1&y=2');
    expect(apply('/users/([0-9]+)', '/people/$1/', U)?.url).toBe('https://app.example.com/api/v1/people/42/?x=1&y=2');
    // ${1}0 is group 1 then "0"; $10 would be group 10.
    expect(apply('/users/([0-9]+)', '/u/${1}0', U)?.url).toBe('https://app.example.com/api/v1/u/420?x=1&y=2');
    expect(apply('/users/(?P<id>[0-9]+)', '/u/$id/${id}', U)?.url).toBe('https://app.example.com/api/v1/u/42/42?x=1&y=2');
    expect(apply('([xy])=([0-9])', '$2=$1', U)?.url).toBe('https://app.example.com/api/v1/users/42?1=x&2=y');
    expect(apply('users', '[$0]', U)?.url).toBe('https://app.example.com/api/v1/[users]/42?x=1&y=2');
    expect(apply('users', 'price$$5', U)?.url).toBe('https://app.example.com/api/v1/price$5/42?x=1&y=2');
    // A `$` before anything else than a name, `$` or `{` is literal (Go).
    expect(apply('users', 'a$/b$', U)?.url).toBe('https://app.example.com/api/v1/a$/b$/42?x=1&y=2');
    // An optional group that did not take part inserts nothing.
    expect(apply('/users/(x)?([0-9]+)', '/u/[$1]$2', U)?.url).toBe('https://app.example.com/api/v1/u/[]42?x=1&y=2');
  });

  it('follows Go: an empty match next to a previous match is skipped', () => {
    expect(apply('a*', '-', 'baaac')?.url).toBe('-b-c-');
    expect(apply('x*', '-', 'ab')?.url).toBe('-a-b-');
  });

  it('without from replaces the whole URL ($0 is it)', () => {
    expect(apply(undefined, '/maintenance', U)).toEqual({ url: '/maintenance', matches: [U] });
    expect(apply(undefined, '$0&z=3', U)?.url).toBe(`${U}&z=3`);
  });

  it('is null when from does not match', () => {
    expect(apply('/nope/', '/x/', U)).toBeNull();
  });

  it('reports the first match and its groups as matches', () => {
    expect(apply('/(api)/(v[0-9])/(?:(x)|users)', '/', U)?.matches).toEqual(['/api/v1/users', 'api', 'v1', '']);
    expect(apply('[0-9]', '#', U)?.matches).toEqual(['1']);
  });

  it('interpolates CEL in to and from; the values are literal text', () => {
    expect(apply('/users/', '/${req.method}/', U)?.url).toBe('https://app.example.com/api/v1/GET/42?x=1&y=2');
    // A `$1` produced by CEL is not a capture reference.
    expect(apply('/users/([0-9]+)', "/${getReqHeader('x-v')[0]}/", U, ['x-v', '$1'])?.url).toBe('https://app.example.com/api/v1/$1/?x=1&y=2');
    // In from, a value matches itself: the dot is not "any character", brackets no class.
    expect(apply('^${req.url.scheme}://${req.url.authority}/api', '/root', U)?.url).toBe('/root/v1/users/42?x=1&y=2');
    expect(apply("${getReqHeader('x-v')[0]}", 'Z', 'https://appXexample.com/a.b', ['x-v', 'a.b'])?.url).toBe('https://appXexample.com/Z');
    expect(apply("${getReqHeader('x-v')[0]}", 'Z', 'https://appXexample.com/axb', ['x-v', 'a.b'])).toBeNull();
    expect(apply("(${getReqHeader('x-v')[0]})", '<$1>', 'https://h/x[a-z](y', ['x-v', '[a-z]('])?.url).toBe('https://h/x<[a-z](>y');
  });

  it('a value in from never changes the pattern: digits and commas after { are no repeat count (review)', () => {
    // Quoting alone leaves `1,400` as it is: `(a|[^z]){${…}}` became `(a|[^z]){1,400}`, a pattern
    // the cost check refuses when written (~130 ms) but accepted here as a literal `{`.
    const from = "(a|[^z]){${getReqHeader('x-v')[0]}}";
    expect(apply(from, 'R', 'https://h/aaaa', ['x-v', '3'])).toBeNull();
    expect(apply(from, 'R', 'https://h/a{3}', ['x-v', '3'])?.url).toBe('https://h/R');
    expect(apply("x${getReqHeader('x-v')[0]}+", '_', 'https://h/xabab', ['x-v', 'ab'])?.url).toBe('https://h/_');
    const t = compileUrlTemplate('inbound', from, 'R');
    const run = () => applyUrlTemplate(t, `https://h/${'a'.repeat(4000)}`, () => '1,400');
    expect(run()).toBeNull();
    // A trailing repeat applies to the whole value, and the estimate counts it so.
    const cost = (from: string) => urlTemplateCost(compileUrlTemplate('inbound', from, 'R'));
    expect(cost('x${req.method}{19}')).toBeGreaterThan(cost('x(?:${req.method}){19}') * 0.9);
  });

  it('refuses at run time: too long a URL or result, too many matches, too much text in from', () => {
    const err = (fn: () => unknown) => {
      try {
        fn();
      } catch (e) {
        expect(e).toBeInstanceOf(UrlActionRuntimeError);
        return (e as UrlActionRuntimeError).code;
      }
      throw new Error('expected a UrlActionRuntimeError');
    };
    const long = `https://h/${'a'.repeat(URL_ACTION_LIMITS.urlChars)}`;
    expect(err(() => apply('a', 'b', long))).toBe('url_too_long');
    expect(err(() => apply('/', '$0'.repeat(2000), `https://h/${'x/'.repeat(20)}`))).toBe('url_too_long');
    expect(err(() => apply(undefined, `$0${'$0'.repeat(2)}`, `https://h/${'a'.repeat(3000)}`))).toBe('url_too_long');
    expect(err(() => apply('/', '_', `https://h/${'x/'.repeat(URL_ACTION_LIMITS.maxMatches)}`))).toBe('too_many_matches');
    expect(apply('/', '_', `https://h${'/x'.repeat(URL_ACTION_LIMITS.maxMatches - 2)}`)?.url).toBe(`https:__h${'_x'.repeat(URL_ACTION_LIMITS.maxMatches - 2)}`);
    expect(err(() => apply("^${getReqHeader('x-v')[0]}", 'b', U, ['x-v', 'y'.repeat(URL_ACTION_LIMITS.fromInterpolatedChars + 1)]))).toBe('invalid_pattern');
    // An evaluation error of a `${…}` comes out as is.
    expect(() => apply('/', "${getReqHeader('x-v')[5]}", U)).toThrow();
  });

  it('compiles or refuses from and to', () => {
    const bad = (from: string | undefined, to: string) => {
      try {
        compileUrlTemplate('inbound', from, to);
      } catch (e) {
        expect(e).toBeInstanceOf(UrlTemplateError);
        return `${(e as UrlTemplateError).field}: ${(e as UrlTemplateError).reason}`;
      }
      throw new Error('expected a UrlTemplateError');
    };
    expect(bad('(', 'x')).toMatch(/^from: invalid RE2 pattern: missing closing \)/);
    expect(bad('(?=a)', 'x')).toMatch(/^from: invalid RE2 pattern: .*\(RE2 syntax: no lookaround or backreferences\)/);
    expect(bad('a', '$1')).toMatch(/^to: \$1 refers to capture group 1, but from has no capture groups/);
    expect(bad('(a)', '${2}')).toMatch(/^to: \$\{2\} refers to capture group 2, but from has 1 capture group;/);
    expect(bad('(?P<id>a)', '$ids')).toMatch(/^to: \$ids refers to no capture group of from \(its named groups: id\)/);
    // `$1x` is the group named "1x" (Go), not $1 then x.
    expect(bad('(a)', '$1x')).toMatch(/^to: \$1x refers to no capture group/);
    expect(bad(undefined, '$1')).toMatch(/^to: \$1 refers to capture group 1, but from has no capture groups \(\$0 is the whole match\)/);
    expect(bad('a', '${nope}')).toMatch(/^to: \$\{nope\} does not compile/);
    expect(bad('a', '${req.path')).toMatch(/^to: unterminated \$\{ at column 1/);
    expect(bad('a', 'x${ }')).toMatch(/^to: empty \$\{\} at column 2/);
    expect(bad('${req.nope}/a', 'x')).toMatch(/^from: \$\{req.nope\} does not compile/);
    // The structure of a dynamic from is checked with the values left out.
    expect(bad('(${req.method}', 'x')).toMatch(/^from: invalid RE2 pattern/);
    // Literal `${` in to: `$$` first.
    const t = compileUrlTemplate('inbound', 'a', '$${1}');
    expect(applyUrlTemplate(t, 'a', () => '')?.url).toBe('${1}');
  });
});

describe('url-rewrite / redirect validation', () => {
  it('accepts the documented shapes', () => {
    const p = parseTrafficPolicy(
      JSON.stringify({
        inbound: [
          { expressions: ["req.url.path == '/products'"], actions: [{ type: 'url-rewrite', config: { from: '/products', to: '/products.php' } }] },
          { actions: [{ type: 'url-rewrite', config: { from: '^${req.url.scheme}://${req.url.authority}/products/?([.*]+)?', to: '/products.php?query=$1' } }] },
          { actions: [{ type: 'redirect', config: { to: '/api/v2/geo?ip=${conn.client_ip}' } }] },
        ],
        outbound: [{ expressions: ['res.status_code == 404'], actions: [{ type: 'redirect', config: { to: '/not-found', headers: { 'x-from': '${req.path}' } } }] }],
      }),
    );
    expect(p.inbound[0]!.actions[0]).toEqual({ type: 'url-rewrite', config: { from: '/products', to: '/products.php' } });
    expect(p.inbound[2]!.actions[0]).toEqual({ type: 'redirect', config: { to: '/api/v2/geo?ip=${conn.client_ip}', status_code: 302, headers: {} } });
    expect(p.outbound[0]!.actions[0]).toMatchObject({ type: 'redirect', config: { status_code: 302, headers: { 'x-from': '${req.path}' } } });
    const q = parseTrafficPolicy(
      JSON.stringify({
        inbound: [
          { actions: [{ type: 'redirect', config: { from: '^(https?://[^/]+)/products(.*)$', to: '$1/store/products$2', status_code: 301, headers: { 'x-redirected': 'true' } } }] },
          { expressions: ["req.url.path.startsWith('/api/')"], actions: [{ type: 'redirect', config: { from: '/api/v1/users?id=([0-9]+)', to: '/api/v2/users/$1/', status_code: 308 } }] },
          { actions: [{ type: 'redirect', config: { from: '^${req.url.scheme}://${req.url.authority}/api/v1/', to: '${req.url.scheme}://${req.url.authority}/api/v2/' } }] },
        ],
      }),
    );
    expect(q.inbound[0]!.actions[0]).toEqual({ type: 'redirect', config: { from: '^(https?://[^/]+)/products(.*)$', to: '$1/store/products$2', status_code: 301, headers: { 'x-redirected': 'true' } } });
  });

  it('refuses bad configs with the path of the field', () => {
    const cases: [unknown, RegExp][] = [
      [rewrite({ from: '/a' }), /^inbound\[0\]\.actions\[0\]\.config\.to: is required$/],
      [{ inbound: [{ actions: [{ type: 'url-rewrite' }] }] }, /^inbound\[0\]\.actions\[0\]\.config: is required$/],
      [rewrite({ to: 5 }), /config\.to: must be a string, got number$/],
      [rewrite({ from: ['a'], to: '/' }), /config\.from: must be a string, got list$/],
      [rewrite({ to: '/', status_code: 301 }), /config\.status_code: unknown field "status_code"; supported: from, to$/],
      [rewrite({ from: '', to: '/' }), /config\.from: must not be empty/],
      [rewrite({ to: '' }), /config\.to: must not be empty when from is omitted/],
      [rewrite({ from: 'a'.repeat(URL_ACTION_LIMITS.fromChars + 1), to: '/' }), /config\.from: is over 4096 characters$/],
      [rewrite({ from: 'a', to: 'b'.repeat(URL_ACTION_LIMITS.toChars + 1) }), /config\.to: is over 4096 characters$/],
      [rewrite({ from: '[a-', to: '/' }), /config\.from: invalid RE2 pattern: missing closing \]/],
      [rewrite({ from: '(\\w+)', to: '/$2' }), /config\.to: \$2 refers to capture group 2, but from has 1 capture group/],
      [rewrite({ to: '/${req.nope}' }), /config\.to: \$\{req.nope\} does not compile/],
      [rewrite({ to: '/x' }, 'outbound'), /^outbound\[0\]\.actions\[0\]\.type: url-rewrite can only be used in inbound rules/],
      [redirect({ from: '/a' }), /config\.to: is required$/],
      [redirect({ to: '/b', status_code: 200 }), /config\.status_code: must be a redirect status \(300, 301, 302, 303, 307, 308\), got 200$/],
      [redirect({ to: '/b', status_code: 304 }), /config\.status_code: must be a redirect status .* got 304$/],
      [redirect({ to: '/b', status_code: '301' }), /config\.status_code: must be an integer, got string "301"$/],
      [redirect({ to: '/b', headers: Object.fromEntries(Array.from({ length: 11 }, (_, i) => [`x-h${i}`, 'v'])) }), /config\.headers: must have at most 10 headers, got 11$/],
      [redirect({ to: '/b', headers: { LOCATION: '/c' } }), /config\.headers\.LOCATION: the redirect sets Location itself/],
      [redirect({ to: '/b', headers: { 'bad name': 'v' } }), /config\.headers\.bad name: "bad name" is not a valid header name$/],
      [redirect({ to: '/b', headers: { 'x-a': 'line\r\nbreak' } }), /config\.headers\.x-a: header value has a character not allowed/],
      [redirect({ to: '/b', headers: { 'content-length': '0' } }), /cannot be changed by a traffic policy/],
      // As an object key it set the prototype: accepted, stored without it, never sent (audit finding).
      [redirect({ to: '/b', headers: JSON.parse('{"__proto__": "v"}') }), /config\.headers\.__proto__: a header named "__proto__" is not supported$/],
      [{ inbound: [{ actions: [{ type: 'custom-response', config: { status_code: 200, headers: JSON.parse('{"__proto__": "v", "x-a": "b"}') } }] }] }, /config\.headers\.__proto__: a header named "__proto__" is not supported$/],
      [{ inbound: [{ actions: [{ type: 'remove-headers', config: { headers: ['__PROTO__'] } }] }] }, /a header named "__proto__" is not supported$/],
      [redirect({ to: '/b', headers: { 'x-a': '${nope}' } }), /config\.headers\.x-a: \$\{…\} does not compile/],
      [redirect({ to: '/b', foo: 1 }), /config\.foo: unknown field "foo"; supported: from, to, status_code, headers$/],
    ];
    for (const [doc, re] of cases) expect(refused(doc).message).toMatch(re);
  });

  it('refuses, on save, a from anchored where a URL never starts (a path, or the anchored form of ngrok\'s url-rewrite page); a stored one still loads', () => {
    for (const from of ['^/old', '^${req.url.authority}/products', '^${ req.host }/a', '^${req.url.path}']) {
      expect(refused(rewrite({ from, to: '/new' })).message, from).toMatch(/config\.from: can never match: it is searched in the full URL/);
      expect(refused(redirect({ from, to: '/new' })).message, from).toMatch(/config\.from: can never match/);
      expect(() => validateTrafficPolicy(rewrite({ from, to: '/new' })), from).not.toThrow();
    }
    for (const from of ['^https?://[^/]+/old', '^${req.url.scheme}://${req.url.authority}/old', '/old', '${req.url.authority}/products', '^(https?)://x/']) {
      expect(() => parseTrafficPolicy(JSON.stringify(rewrite({ from, to: '/new' }))), from).not.toThrow();
    }
  });

  it("charges from to the policy's regexp budget", () => {
    const big = '[a-z]{1,1000}x'; // ~2000 instructions
    const doc = { inbound: Array.from({ length: 6 }, () => ({ actions: [{ type: 'url-rewrite', config: { from: big, to: '/' } }] })) };
    expect(refused(doc, false).message).toMatch(/^inbound\[\d\]\.actions\[0\]\.config\.from: the policy's patterns are too large together/);
  });

  it('costs the regexp work: refuses a pattern whose NFA may thrash, and too many actions together', () => {
    // A small DFA, but up to one NFA thread per instruction: ~8 ns per character and instruction.
    expect(refused(rewrite({ from: '(([^/]*)/){10}', to: '<$2>' })).message).toMatch(/allowed for a policy/);
    const thrash = refused(rewrite({ from: '(a|b)*a(a|b){14}(x)', to: '/$1' }));
    expect(thrash.path).toBe('inbound[0].actions[0].config.from');
    expect(thrash.message).toMatch(/url-rewrite: replacing from in the URL is estimated at .* more than the 5\.00 ms allowed for a policy/);
    // Each accepted alone; not a dozen of them.
    const one = { actions: [{ type: 'url-rewrite', config: { from: '^${req.url.scheme}://${req.url.authority}/p/?(.*)', to: '/q/$1' } }] };
    parseTrafficPolicy(JSON.stringify({ inbound: [one] }));
    expect(refused({ inbound: Array.from({ length: 12 }, () => one) }).message).toMatch(/allowed for a policy/);
    // Without from: nearly free.
    const t = compileUrlTemplate('inbound', undefined, '/x');
    expect(urlTemplateCost(t)).toBeLessThan(MAX_POLICY_COST / 20);
  });
});

/**
 * CPU milliseconds of a run (test/support/cpu-time.ts: wall time also counts the waits for a
 * core of a busy box): the fastest, the median and the slowest of a few batches of `reps` runs,
 * after a warm-up.
 */
function timings(fn: () => unknown, reps: number, runs = 15): { best: number; median: number; worst: number } {
  const ms = cpuTimings(fn, { runs, reps, warmup: 10 });
  return { best: ms[0]!, median: ms[runs >> 1]!, worst: ms[runs - 1]! };
}

describe('url action cost estimates', () => {
  it('bound what the accepted patterns measure on adversarial URLs', () => {
    const n = URL_ACTION_LIMITS.urlChars;
    const cases: { from: string; to: string; url: string; values?: string[] }[] = [
      // one-pass, capturing the whole path
      { from: '^(https?://[^/]+)/ab/(.*)$', to: '$1/x/$2', url: `https://h/ab/${'ab/'.repeat((n - 40) / 3)}` },
      // small unanchored, a match at the very end
      { from: '(ab/)$', to: '/$1', url: `https://h/${'ab/'.repeat((n - 20) / 3)}` },
      // unanchored with an optional capture, the docs' shape
      { from: '/products/?([.*]+)?', to: '/products.php?query=$1', url: `https://h${'/products'.repeat(30)}${'.'.repeat(n - 600)}` },
      // classes and groups, many threads alive on a long run of letters
      { from: '/([a-z]+)-([a-z]+)/([0-9]+)', to: '/$3/$1/$2', url: `https://h/${'a-'.repeat((n - 40) / 2)}/1` },
      // the most matches allowed
      { from: 'x*', to: '-', url: `https://h/${'y'.repeat(URL_ACTION_LIMITS.maxMatches - 12)}` },
      // a dynamic from, the most text inserted, adversarial input (a new value each run: compiled each time)
      {
        from: "^${req.url.scheme}://${getReqHeader('x-v')[0]}/products/?([.*]+)?",
        to: '/p?q=$1',
        url: `https://{v}/products/${'.'.repeat(n - 150)}`,
        values: ['x-v', '{v}'],
      },
    ];
    const report: string[] = [];
    const results: { estimate: number; best: number }[] = [];
    for (const c of cases) {
      const t: UrlTemplate = compileUrlTemplate('inbound', c.from, c.to);
      const estimate = urlTemplateCost(t);
      let unique = 0;
      let outcome = 'replaced';
      // In batches of at least 0.2 ms of estimated work: CPU time counts microseconds.
      const t0 = timings(() => {
        // With `https`, the most text the `${…}` may insert.
        const v = `${'a'.repeat(URL_ACTION_LIMITS.fromInterpolatedChars - 5 - 8)}${String(unique++).padStart(8, '0')}`;
        const a = act((c.values ?? []).map((x) => x.replace('{v}', v)));
        try {
          return applyUrlTemplate(t, c.url.replace('{v}', v), evaluator(a));
        } catch (err) {
          // Refused at run time (too many matches, too long a result): the time is spent all the same.
          outcome = (err as UrlActionRuntimeError).code;
          return null;
        }
      }, repsFor(estimate));
      report.push(`${c.from.slice(0, 60).padEnd(60)} estimated ${(estimate / 1000).toFixed(0)} µs, measured ${(t0.median * 1000).toFixed(0)} µs of CPU (fastest ${(t0.best * 1000).toFixed(0)} µs, slowest ${(t0.worst * 1000).toFixed(0)} µs; ${outcome})`);
      results.push({ estimate, best: t0.best });
    }
    const slowdown = machineSlowdown();
    console.log(report.join('\n'));
    for (const r of results) {
      // Accepted by the cost check.
      expect(r.estimate).toBeLessThanOrEqual(MAX_POLICY_COST);
      // The coefficients come from quiet measurements (see `W` in url-actions.ts); here the
      // estimates are only checked against gross error (a missing term, a size the model ignores:
      // an order of magnitude), on the fastest batch, in CPU time: another process on the box
      // only adds wall time. 5x, as when this was wall time: a fresh-clone CI run on a slow day
      // (2026-11-26, when this box ran Node 2-2.5x slower per operation than the day before)
      // measured 3.3x on the fastest of the runs; a box slower than the calibration one now
      // (`machineSlowdown`) raises the bound with it.
      expect(r.best * 1e6).toBeLessThan(5 * r.estimate * slowdown);
    }
  });
});
