import { describe, expect, it } from 'vitest';
import { auditEnvelope, serializeEnvelope } from './envelope.js';

const principal = { id: 'ak_1', subject: 'ci key', source: 'API' as const, credential: { id: 'ak_1', uri: 'https://api.example/api_keys/ak_1' } };
const row = {
  event_id: 'ev_2qT9abc',
  event_type: 'ip_policy_created.v0',
  account_id: 'ac_1',
  object: { id: 'ipp_1', description: 'd', secret: '' },
  principal,
  committed_at: new Date('2026-03-01T09:30:12.987Z'),
  created_at: new Date('2026-03-01T09:30:11.001Z'),
};

describe('auditEnvelope', () => {
  it('builds the §11 envelope from an outbox row, with committed_at in whole seconds', () => {
    expect(auditEnvelope(row)).toEqual({
      event_id: 'ev_2qT9abc',
      event_type: 'ip_policy_created.v0',
      event_timestamp: '2026-03-01T09:30:12Z',
      account_id: 'ac_1',
      object: { id: 'ipp_1', description: 'd', secret: '' },
      principal,
    });
  });

  it('falls back to created_at, accepts strings, converts to UTC', () => {
    expect(auditEnvelope({ ...row, committed_at: null }).event_timestamp).toBe('2026-03-01T09:30:11Z');
    expect(auditEnvelope({ ...row, committed_at: '2026-03-01T10:30:12.5+01:00' }).event_timestamp).toBe('2026-03-01T09:30:12Z');
    expect(() => auditEnvelope({ ...row, committed_at: undefined, created_at: undefined })).toThrow(/committed_at/);
  });

  it('keeps a missing principal as null (changes made outside the API)', () => {
    expect(auditEnvelope({ ...row, principal: null }).principal).toBeNull();
    expect(auditEnvelope({ ...row, principal: undefined }).principal).toBeNull();
  });
});

describe('serializeEnvelope', () => {
  it('writes the keys in the documented order and round-trips', () => {
    const e = auditEnvelope(row);
    const text = serializeEnvelope(e);
    expect(Object.keys(JSON.parse(text))).toEqual(['event_id', 'event_type', 'event_timestamp', 'account_id', 'object', 'principal']);
    expect(JSON.parse(text)).toEqual(e);
    const shuffled = { principal: e.principal, object: e.object, account_id: e.account_id, event_timestamp: e.event_timestamp, event_type: e.event_type, event_id: e.event_id };
    expect(serializeEnvelope(shuffled)).toBe(text);
  });

  it('writes null for a traffic event principal', () => {
    expect(JSON.parse(serializeEnvelope({ ...auditEnvelope(row), principal: null })).principal).toBeNull();
  });
});
