import { describe, expect, it, vi } from 'vitest';
import { forwardErrorOf } from './proxy.js';

/**
 * The client-facing message of a forwarding error: known undici/stream codes keep their words, an
 * error of no known kind answers with its code only (its message, e.g. undici's
 * `assert(idx !== -1)` text, goes to the log, never to the client).
 */
describe('forwardErrorOf', () => {
  it('answers an unknown error generically and logs its message', () => {
    const warn = vi.fn();
    const assertion = Object.assign(new Error('The expression evaluated to a falsy value:\n\n  assert(idx !== -1)\n'), { code: 'ERR_ASSERTION' });
    const fe = forwardErrorOf(assertion, false, { warn } as never);
    expect(fe.code).toBe(7004);
    expect(fe.message).toBe('the tunnel failed (ERR_ASSERTION)');
    expect(fe.message).not.toContain('assert');
    expect(warn).toHaveBeenCalledTimes(1);
    expect(JSON.stringify(warn.mock.calls[0])).toContain('assert(idx !== -1)');

    const plain = forwardErrorOf(new Error('secret internals'), true, { warn } as never);
    expect(plain.message).toBe('the tunnel failed (internal error)');
    expect(forwardErrorOf(Object.assign(new Error('x'), { code: 'a b\r\n' }), false).message).toBe('the tunnel failed (internal error)');
  });

  it('keeps the known cases as they were', () => {
    const warn = vi.fn();
    expect(forwardErrorOf(Object.assign(new Error('other side closed'), { code: 'UND_ERR_SOCKET' }), false, { warn } as never).message).toBe('the tunnel failed: other side closed');
    expect(forwardErrorOf(Object.assign(new Error('invalid method'), { code: 'UND_ERR_INVALID_ARG' }), false, { warn } as never)).toMatchObject({ code: 7011, message: 'invalid method' });
    expect(forwardErrorOf(Object.assign(new Error('x'), { code: 'STREAM_CAP' }), false, { warn } as never)).toMatchObject({ code: 7006 });
    expect(forwardErrorOf(Object.assign(new Error('x'), { code: 'ECONNREFUSED' }), true, { warn } as never).message).toBe('the ingress node holding the tunnel is unreachable (ECONNREFUSED)');
    expect(warn).not.toHaveBeenCalled();
  });
});
