import { RE2JS } from 're2js';
import { describe, expect, it, vi } from 'vitest';
import { CEL_TIME, CelActions, CelConn, CelRequest } from './cel-vars.js';
import { CelCompileError, compileExpression, type CelProgram } from './cel.js';
import { parseTrafficPolicy, TrafficPolicyError, validateTrafficPolicy } from './parse.js';
import { cachedRegex, compileRegex, estimateProgramSize, MAX_MATCH_INPUT, MAX_REGEX_PATTERN_LENGTH, REGEX_CACHE_SIZE, RegexError, regexCacheSize, regexSearch } from './regex.js';

function activation(path: string, headers: string[] = [], rawQuery = '') {
  return {
    req: new CelRequest({ method: 'GET', scheme: 'https', host: 'app.example.com', authority: 'app.example.com', path, rawQuery, headers: () => headers }),
    conn: new CelConn('203.0.113.7', 443),
    actions: new CelActions(),
    time: CEL_TIME,
  };
}

/** Compiles an inbound rule expression and evaluates it on a request for `path`. */
function run(expr: string, path = '/', headers: string[] = []): unknown {
  return compileExpression('inbound', expr)(activation(path, headers));
}

function compileError(expr: string): string {
  try {
    compileExpression('inbound', expr);
  } catch (err) {
    expect(err).toBeInstanceOf(CelCompileError);
    return (err as CelCompileError).reason;
  }
  throw new Error(`expected ${expr} to be refused`);
}

function policyError(expr: string): TrafficPolicyError {
  try {
    parseTrafficPolicy(JSON.stringify({ inbound: [{ expressions: ['true', expr], actions: [{ type: 'deny' }] }] }));
  } catch (err) {
    expect(err).toBeInstanceOf(TrafficPolicyError);
    return err as TrafficPolicyError;
  }
  throw new Error('expected the policy to be refused');
}

describe('CEL matches() through RE2', () => {
  it('is an unanchored search in both the receiver and the global form', () => {
    expect(run(`'foobar'.matches('oba')`)).toBe(true);
    expect(run(`matches('foobar', 'oba')`)).toBe(true);
    expect(run(`'foobar'.matches('^oba')`)).toBe(false);
    expect(run(`matches('foobar', 'bar$')`)).toBe(true);
    expect(run(`'foobar'.matches('^foo$')`)).toBe(false);
    expect(run(`'foobar'.matches('')`)).toBe(true);
    expect(run(`!'abc'.matches('x')`)).toBe(true);
  });

  it('matches request fields, req.url as its string, and inline flags', () => {
    expect(run(`req.path.matches('^/api/v[0-9]+/')`, '/api/v2/users')).toBe(true);
    expect(run(`req.path.matches('^/api/v[0-9]+/')`, '/web/api/v2/')).toBe(false);
    expect(run(`matches(req.path, '^/admin(/|$)')`, '/admin')).toBe(true);
    expect(run(`req.url.matches('^https://app\\\\.example\\\\.com/x\\\\?')`, '/x')).toBe(false);
    expect(compileExpression('inbound', `req.url.matches('^https://app\\\\.example\\\\.com/x\\\\?q=1$')`)(activation('/x', [], 'q=1'))).toBe(true);
    expect(run(`matches(req.url, 'example[.]com/ADMIN')`, '/admin')).toBe(false);
    expect(run(`matches(req.url, '(?i)example[.]com/ADMIN')`, '/admin')).toBe(true);
    expect(run(`req.url.path.matches('^/a')`, '/abc')).toBe(true);
    expect(run(`req.user_agent.matches('(?i)^curl/')`, '/', ['User-Agent', 'CURL/8.4'])).toBe(true);
    expect(run(`getReqHeader('x-id').exists(v, v.matches('^[0-9a-f]{8}$'))`, '/', ['X-Id', 'nope', 'x-id', 'deadbeef'])).toBe(true);
    expect(run(`r'a\\b'.matches(r'a\\\\b')`)).toBe(true);
  });

  it('works in header interpolations and outbound rules', () => {
    expect(compileExpression('inbound', `req.path.matches('^/v1') ? 'v1' : 'other'`, false)(activation('/v1/x'))).toBe('v1');
    expect(() => compileExpression('outbound', `res.headers['content-type'][0].matches('^text/')`)).not.toThrow();
  });

  it('refuses patterns RE2 does not accept, when the policy is saved, naming the problem', () => {
    const back = compileError(`req.path.matches('(a)\\\\1')`);
    expect(back).toMatch(/^matches\(\): invalid RE2 pattern: invalid escape sequence: `\\1` \(RE2 syntax: no lookaround or backreferences\) \(at column 18\)$/);
    expect(compileError(`matches(req.path, '^/(?=admin)')`)).toMatch(/^matches\(\): invalid RE2 pattern: invalid or unsupported Perl syntax: `\(\?=`.*\(at column 19\)$/);
    expect(compileError(`req.path.matches('(?<!x)y')`)).toMatch(/invalid RE2 pattern: .*no lookaround/);
    expect(compileError(`req.path.matches('[a-')`)).toMatch(/^matches\(\): invalid RE2 pattern: missing closing \]/);
    expect(compileError(`req.path.matches('a{1001}')`)).toMatch(/invalid repeat count/);
    // One line each, and never our internal names.
    for (const r of [back, compileError(`req.path.matches('(')`)]) expect(r).not.toMatch(/\n|URL\.matches|ast/);
  });

  it('reports a refused pattern as a 400-style policy error at inbound[i].expressions[j]', () => {
    const err = policyError(`req.path.matches('(?=x)')`);
    expect(err.path).toBe('inbound[0].expressions[1]');
    expect(err.message).toMatch(/inbound\[0\]\.expressions\[1\].*matches\(\): invalid RE2 pattern/);
  });

  it('caps the pattern length and the compiled program size', () => {
    expect(compileError(`req.path.matches('${'a'.repeat(MAX_REGEX_PATTERN_LENGTH + 1)}')`)).toMatch(/^matches\(\): pattern too long \(4097 characters, at most 4096\)/);
    const t = performance.now();
    // 585 × `.{1000}`: would compile to 585,000 instructions (seconds); refused before compiling.
    expect(compileError(`req.path.matches('${'.{1000}'.repeat(585)}')`)).toMatch(/^matches\(\): pattern too large/);
    expect(compileError(`req.path.matches('.{1000}.{1000}.{1000}')`)).toMatch(/^matches\(\): pattern too large/);
    expect(performance.now() - t).toBeLessThan(1000);
    expect(() => compileRegex('[a-z]{1,1000}')).not.toThrow();
  });

  it('limits the total size of one policy\'s patterns', () => {
    // Five patterns of about 1,990 instructions fit in 10,000; a sixth does not.
    const big = (i: number) => `req.path.matches('^[a-z]{1,${990 + i}}$')`;
    // Validated without the cost check (cost.ts), which would refuse such patterns on a path.
    const doc = (n: number) => ({ inbound: [{ expressions: Array.from({ length: n }, (_, i) => big(i)), actions: [{ type: 'deny' }] }] });
    expect(() => validateTrafficPolicy(doc(5))).not.toThrow();
    let err: unknown;
    try {
      validateTrafficPolicy(doc(6));
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(TrafficPolicyError);
    expect((err as TrafficPolicyError).path).toBe('inbound[0].expressions[5]');
    expect((err as TrafficPolicyError).reason).toMatch(/^matches\(\): the policy's patterns are too large together \(more than 10000 RE2 instructions\)/);
    // The budget is per policy: the same expressions compile one by one, and in another policy.
    for (let i = 0; i < 6; i++) expect(() => compileExpression('inbound', big(i))).not.toThrow();
    expect(() => validateTrafficPolicy(doc(5))).not.toThrow();
  });

  it('type-checks its operands', () => {
    expect(compileError(`req.path.matches(1)`)).toMatch(/found no matching overload for 'string\.matches\(int\)'/);
    expect(compileError(`matches(1, 'a')`)).toMatch(/found no matching overload for 'matches\(int, string\)'/);
    expect(compileError(`conn.server_port.matches('1')`)).toMatch(/found no matching overload for 'int\.matches\(string\)'/);
    expect(compileError(`req.path.matches('a', 'b')`)).toMatch(/does not compile/);
    expect(compileError(`req.path.matches('a') + 1`)).toMatch(/does not compile/);
  });

  it('does not touch "matches(" inside a string literal', () => {
    expect(run(`req.path == 'matches(x)'`, 'matches(x)')).toBe(true);
    expect(run(`req.path == 'matches(x)'`, '/')).toBe(false);
    expect(run(`req.path.contains("a.matches('(?=x)')")`, `/a.matches('(?=x)')`)).toBe(true);
    // The pattern itself may contain "matches(".
    expect(run(`req.path.matches('matches\\\\(x')`, '/matches(x)')).toBe(true);
  });

  it('compiles a pattern read at evaluation time through a bounded cache; a bad one is an evaluation error', () => {
    const p = compileExpression('inbound', `req.path.matches(getReqHeader('x-re')[0])`);
    expect(p(activation('/api/v1', ['X-Re', '^/api/v[0-9]$']))).toBe(true);
    expect(p(activation('/api/v12', ['X-Re', '^/api/v[0-9]$']))).toBe(false);
    expect(() => p(activation('/x', ['X-Re', '(a)\\1']))).toThrow(/matches\(\): invalid RE2 pattern: invalid escape sequence/);
    let err: unknown;
    try {
      p(activation('/x', ['X-Re', '(?=x)']));
    } catch (e) {
      err = e;
    }
    expect((err as { name: string }).name).toBe('EvaluationError');
    expect((err as { summary: string }).summary).toMatch(/^matches\(\): invalid RE2 pattern: invalid or unsupported Perl syntax/);
    // Concatenated patterns are not literals either.
    expect(run(`req.path.matches('^/' + 'adm')`, '/admin')).toBe(true);

    for (let i = 0; i < REGEX_CACHE_SIZE + 50; i++) expect(cachedRegex(`^/p${i}$`).test(`/p${i}`)).toBe(true);
    expect(regexCacheSize()).toBe(REGEX_CACHE_SIZE);
    expect(() => cachedRegex('(?=x)')).toThrow(RegexError);
    expect(() => cachedRegex('(?=x)')).toThrow(/invalid RE2 pattern/);
  });

  it('runs in linear time: a ReDoS pattern on a long string returns quickly', () => {
    const p = compileExpression('inbound', `req.path.matches('^(a+)+$')`);
    const long = 'a'.repeat(MAX_MATCH_INPUT - 1) + '!';
    const t = performance.now();
    expect(p(activation(long))).toBe(false);
    expect(run(`('a'.repeat(3) + '!').matches('^(a+)+$')`.replace(`'a'.repeat(3)`, `'${'a'.repeat(MAX_MATCH_INPUT - 1)}'`))).toBe(false);
    expect(performance.now() - t).toBeLessThan(200);
  });

  it(`does not search a string over ${MAX_MATCH_INPUT} characters: an evaluation error, so the rule does not apply`, () => {
    const p = compileExpression('inbound', `req.path.matches('^/admin')`);
    const at = '/admin/' + 'a'.repeat(MAX_MATCH_INPUT - 7);
    expect(p(activation(at))).toBe(true);
    let err: unknown;
    try {
      p(activation(at + 'a'));
    } catch (e) {
      err = e;
    }
    expect((err as { name: string }).name).toBe('EvaluationError');
    expect((err as { summary: string }).summary).toBe(`matches(): string too long to search (${MAX_MATCH_INPUT + 1} characters, at most ${MAX_MATCH_INPUT})`);
    // Computed and global forms alike, and regexSearch itself.
    expect(() => run(`matches(req.path, '^/' + 'admin')`, at + 'a')).toThrow(/string too long to search/);
    expect(() => regexSearch(compileRegex('a'), 'a'.repeat(MAX_MATCH_INPUT + 1))).toThrow(RegexError);
    // A policy that must apply to longer strings too tests the length first (`||` absorbs the error).
    const closed = compileExpression('inbound', `req.path.size() > ${MAX_MATCH_INPUT} || req.path.matches('^/admin')`);
    expect(closed(activation(at + 'a'))).toBe(true);
    expect(closed(activation('/admin'))).toBe(true);
    expect(closed(activation('/public'))).toBe(false);
  });

  it('compiles a literal pattern once (programs are shared while in use) and costs little per evaluation', () => {
    const compile = vi.spyOn(RE2JS, 'compile');
    try {
      const p = compileExpression('inbound', `req.path.matches('^/api/v[0-9]+/') || req.path == '/once-per-program'`);
      expect(compile).toHaveBeenCalledTimes(1);
      expect(compileExpression('inbound', `req.path.matches('^/api/v[0-9]+/') || req.path == '/once-per-program'`)).toBe(p);
      expect(compile).toHaveBeenCalledTimes(1);
      const acts = ['/api/v1/users', '/api/v22/orders/42', '/web/index.html', '/api/vx/'].map((path) => activation(path));
      const perEval = (prog: CelProgram) => {
        for (let i = 0; i < 2000; i++) prog(acts[i % acts.length]!);
        const n = 20000;
        let hits = 0;
        const t = performance.now();
        for (let i = 0; i < n; i++) if (prog(acts[i % acts.length]!) === true) hits++;
        return { us: ((performance.now() - t) * 1000) / n, hits, n };
      };
      const m = perEval(p);
      expect(compile).toHaveBeenCalledTimes(1);
      const base = perEval(compileExpression('inbound', `req.path.startsWith('/api/v')`));
      console.log(`req.path.matches('^/api/v[0-9]+/'): ${m.us.toFixed(2)} µs per evaluation over ${m.n} (req.path.startsWith('/api/v'): ${base.us.toFixed(2)} µs)`);
      expect(m.hits).toBe(m.n / 2);
      expect(m.us).toBeLessThan(50);
    } finally {
      compile.mockRestore();
    }
  });

  it('estimates program size close to what RE2 compiles', () => {
    for (const pat of ['^/api/v[0-9]+/', '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$', '[a-z]{1,500}', '(?:[ab].{100}){1,10}[yz]', '\\Qa.b\\E+', '[]a]{3}', '[[:alpha:]]{10}', '\\p{Greek}{20}', '((a{10}){10}){10}']) {
      const real = compileRegex(pat).programSize();
      const est = estimateProgramSize(pat);
      expect(est, pat).toBeGreaterThan(real / 2);
      expect(est, pat).toBeLessThan(real * 2 + 10);
    }
  });
});
