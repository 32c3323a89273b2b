import type { EventRecord, LoadedDestination } from './types.js';

/** Test helpers for the target tests (not used by the worker). */

let counter = 0;

/** One record with a realistic envelope; `pad` grows the object to a given number of characters. */
export function record(ts = Date.now(), pad = 0): EventRecord {
  counter += 1;
  const id = `ev_${process.pid.toString(36)}${counter.toString().padStart(8, '0')}`;
  const envelope = {
    event_id: id,
    event_type: 'ip_policy_created.v0',
    event_timestamp: new Date(Math.floor(ts / 1000) * 1000).toISOString().replace(/\.\d{3}Z$/, 'Z'),
    account_id: 'ac_2abcTEST',
    object: { id: 'ipp_1', description: 'x'.repeat(pad), "quote\"d": 'é' },
    principal: null,
  };
  return { eventId: id, body: JSON.stringify(envelope), timestamp: ts };
}

export function records(n: number, ts = Date.now()): EventRecord[] {
  return Array.from({ length: n }, (_, i) => record(ts + i));
}

export function dest(kind: LoadedDestination['kind'], target: unknown, id = `ed_${Math.random().toString(36).slice(2, 10)}`): LoadedDestination {
  return { id, accountId: 'ac_2abcTEST', kind, target };
}
