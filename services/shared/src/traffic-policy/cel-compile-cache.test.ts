import { describe, expect, it } from 'vitest';
import { compileExpression } from './cel.js';
import { TrafficPolicyError, validateTrafficPolicy } from './index.js';

describe('compiled expressions', () => {
  it('are shared while in use: the same source, direction and result type compile once', () => {
    // Ingress nodes compile every route of a config on each change; an audit's 400 routes of 6
    // matches() expressions took 250-300 ms per change, 9-26 ms with the programs shared.
    const source = "req.url.path.matches('^/api/v[0-9]+/items/[a-z]+$') && req.method == 'GET'";
    const a = compileExpression('inbound', source);
    expect(compileExpression('inbound', source)).toBe(a);
    expect(compileExpression('outbound', source)).not.toBe(a);
    expect(compileExpression('inbound', source, false)).not.toBe(a);
    expect(compileExpression('inbound', `${source} `)).not.toBe(a);
  });

  it('does not keep failures: a bad expression is refused every time', () => {
    expect(() => compileExpression('inbound', "req.url.path.matches('(')")).toThrow();
    expect(() => compileExpression('inbound', "req.url.path.matches('(')")).toThrow();
  });

  it("charges a shared program's patterns to each policy that uses it", () => {
    // Five patterns of about 1,990 RE2 instructions fit in a policy's 10,000; a sixth does not,
    // also when all six programs were compiled (and are shared) before.
    const big = (i: number) => `req.path.matches('^[a-z]{1,${990 + i}}$') || req.path == '/shared-budget'`;
    const kept = Array.from({ length: 6 }, (_, i) => compileExpression('inbound', big(i)));
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
    expect((err as TrafficPolicyError).reason).toMatch(/the policy's patterns are too large together/);
    expect(kept).toHaveLength(6);
  });
});
