import { rfc3339 } from '../time.js';
import type { EventEnvelope } from './types.js';

/**
 * What an audit envelope is built from: an outbox row (control-plane migration 0001/0002).
 * `committed_at` is the moment the change took its config version (just before COMMIT) and is
 * preferred; `created_at` (the start of the change's transaction) is the fallback.
 */
export interface AuditEventRow {
  event_id: string;
  event_type: string;
  account_id: string;
  /** The resource as the API returned it (secrets ""), jsonb as parsed by pg. */
  object: unknown;
  /** jsonb `{id, subject, source, credential}` as stored, or null (changes made outside the API). */
  principal: EventEnvelope['principal'] | null | undefined;
  committed_at?: Date | string | null;
  created_at?: Date | string | null;
}

/**
 * The envelope of an audit event (wire-conventions.md §11): the outbox row's own event id (stable
 * across relay retries, so consumers can dedupe), the timestamp in RFC 3339 UTC whole seconds,
 * and object and principal exactly as stored.
 *
 * @example auditEnvelope({event_id: 'ev_…', event_type: 'ip_policy_created.v0', account_id: 'ac_…', object, principal, committed_at})
 */
export function auditEnvelope(row: AuditEventRow): EventEnvelope {
  const at = row.committed_at ?? row.created_at;
  if (at === undefined || at === null) throw new Error(`outbox row ${row.event_id} has neither committed_at nor created_at`);
  return {
    event_id: row.event_id,
    event_type: row.event_type,
    event_timestamp: rfc3339(at),
    account_id: row.account_id,
    object: row.object,
    principal: row.principal ?? null,
  };
}

/** JSON text of an envelope, keys always in the documented order. */
export function serializeEnvelope(e: EventEnvelope): string {
  return JSON.stringify({
    event_id: e.event_id,
    event_type: e.event_type,
    event_timestamp: e.event_timestamp,
    account_id: e.account_id,
    object: e.object ?? null,
    principal: e.principal ?? null,
  });
}
