import { describe, expect, it } from 'vitest';
import { AccountQuotas, DEFAULT_ACCOUNT_QUOTAS, QUOTA_TABLES } from './quotas.js';

describe('ACCOUNT_QUOTAS', () => {
  it('defaults to a quota on every resource type, which entries override or lift', () => {
    expect(AccountQuotas.parse(undefined)).toEqual(DEFAULT_ACCOUNT_QUOTAS);
    expect(AccountQuotas.parse('')).toEqual(DEFAULT_ACCOUNT_QUOTAS);
    expect(Object.keys(DEFAULT_ACCOUNT_QUOTAS).sort()).toEqual([...QUOTA_TABLES].sort());
    expect(AccountQuotas.parse('https_edges=20, reserved_addrs=500')).toEqual({ ...DEFAULT_ACCOUNT_QUOTAS, https_edges: 20, reserved_addrs: 500 });
    const lifted = AccountQuotas.parse('credentials=unlimited');
    expect(lifted.credentials).toBeUndefined();
    expect(lifted.https_edges).toBe(DEFAULT_ACCOUNT_QUOTAS.https_edges);
    expect(AccountQuotas.parse('off')).toEqual({});
    expect(AccountQuotas.parse(' OFF ')).toEqual({});
  });

  it('refuses an unknown type or a bad count, naming the entry', () => {
    expect(() => AccountQuotas.parse('edges=5')).toThrow(/edges=5.{0,4} is not <type>=<count\|unlimited>/);
    expect(() => AccountQuotas.parse('https_edges=-1')).toThrow(/https_edges=-1/);
    expect(() => AccountQuotas.parse('https_edges=lots')).toThrow(/https_edges=lots/);
  });
});
