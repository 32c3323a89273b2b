import { describe, expect, it } from 'vitest';
import { retryHintMs } from './client.js';

describe('retryHintMs (which refusals of a tunnel resume are tried again)', () => {
  it('a start rate limit: the ms it names', () => {
    expect(retryHintMs("this authtoken's sessions start tunnels faster than this server allows (20 a second, 500 at once, across its sessions and reconnects); retry in 37 ms (ERR_WARREN_8001)")).toBe(37);
  });
  it('a node without its configuration yet: half a second', () => {
    expect(retryHintMs('this ingress node has no configuration yet; retry shortly (ERR_WARREN_7008)')).toBe(500);
  });
  it('anything else is final', () => {
    expect(retryHintMs("the authtoken's ACL does not allow binding x.test (ERR_WARREN_1100)")).toBeNull();
    expect(retryHintMs('the hostname x.test is in use by another account (ERR_WARREN_4101)')).toBeNull();
    expect(retryHintMs('retry in 5 ms')).toBeNull();
  });
});
