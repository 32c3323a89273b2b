import { describe, expect, it } from 'vitest';
import { AccountQuotas, QUOTA_TABLES, RECOMMENDED_ACCOUNT_QUOTAS } from './quotas.js';

describe('ACCOUNT_QUOTAS', () => {
  it('is off by default (wire-conventions.md); "recommended" puts a quota on every type, which later entries override or lift', () => {
    expect(AccountQuotas.parse(undefined)).toEqual({});
    expect(AccountQuotas.parse('')).toEqual({});
    expect(AccountQuotas.parse(' OFF ')).toEqual({});
    expect(AccountQuotas.parse('https_edges=20, reserved_addrs=500')).toEqual({ https_edges: 20, reserved_addrs: 500 });
    expect(Object.keys(RECOMMENDED_ACCOUNT_QUOTAS).sort()).toEqual([...QUOTA_TABLES].sort());
    expect(AccountQuotas.parse('recommended')).toEqual(RECOMMENDED_ACCOUNT_QUOTAS);
    expect(AccountQuotas.parse('recommended,https_edges=20')).toEqual({ ...RECOMMENDED_ACCOUNT_QUOTAS, https_edges: 20 });
    const lifted = AccountQuotas.parse('recommended, credentials=unlimited');
    expect(lifted.credentials).toBeUndefined();
    expect(lifted.https_edges).toBe(RECOMMENDED_ACCOUNT_QUOTAS.https_edges);
  });

  it('refuses an unknown type or a bad count, naming the entry', () => {
    expect(() => AccountQuotas.parse('edges=5')).toThrow(/edges=5.{0,4} is not <type>=<count\|unlimited>/);
    expect(() => AccountQuotas.parse('https_edges=-1')).toThrow(/https_edges=-1/);
    expect(() => AccountQuotas.parse('https_edges=lots')).toThrow(/https_edges=lots/);
  });
});
