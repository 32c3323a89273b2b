import type { EventRecord, SendOutcome, TargetEnv, TargetLimits } from './types.js';

export const DEFAULT_REQUEST_TIMEOUT_MS = 30_000;
const MAX_REASON = 500;

export function timeoutOf(env: TargetEnv): number {
  const t = env.requestTimeoutMs;
  return t !== undefined && Number.isFinite(t) && t > 0 ? t : DEFAULT_REQUEST_TIMEOUT_MS;
}

export function utf8Length(s: string): number {
  return Buffer.byteLength(s, 'utf8');
}

/**
 * Secrets one target knows (API key, client secret, AWS secret, temporary credentials, tokens):
 * `scrub` replaces each with "[redacted]" in any text that may end up in an outcome reason, a
 * dead letter or a log line. Reasons are built from status codes and service messages, which
 * carry no secrets; this is the second line of defence.
 */
export class Secrets {
  private readonly values = new Set<string>();
  private readonly temporary: string[] = [];
  /** secrets of the destination's configuration */
  add(...values: Array<string | undefined | null>): void {
    for (const v of values) if (v && v.length >= 4) this.values.add(v);
  }
  /** rotating secrets (tokens, temporary credentials): only the last few are kept */
  addTemporary(...values: Array<string | undefined | null>): void {
    for (const v of values) if (v && v.length >= 4 && !this.temporary.includes(v)) this.temporary.push(v);
    if (this.temporary.length > 16) this.temporary.splice(0, this.temporary.length - 16);
  }
  scrub(text: string): string {
    let out = text;
    for (const v of [...this.values, ...this.temporary]) if (out.includes(v)) out = out.split(v).join('[redacted]');
    return out.length > MAX_REASON ? `${out.slice(0, MAX_REASON)}…` : out;
  }
}

/** `name: message` of anything thrown, without stack. */
export function errorText(err: unknown): string {
  if (err instanceof Error) {
    const code = (err as { code?: unknown }).code;
    const msg = err.message || String(code ?? '');
    return err.name && err.name !== 'Error' ? `${err.name}: ${msg}` : typeof code === 'string' && !msg.includes(code) ? `${code}: ${msg}` : msg;
  }
  return String(err);
}

/** Node error codes meaning the connection was never established: nothing was sent. */
const NOT_CONNECTED = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'ENETUNREACH', 'EHOSTUNREACH', 'EADDRNOTAVAIL', 'ERR_INVALID_URL', 'CERT_HAS_EXPIRED', 'DEPTH_ZERO_SELF_SIGNED_CERT', 'SELF_SIGNED_CERT_IN_CHAIN', 'UNABLE_TO_VERIFY_LEAF_SIGNATURE', 'ERR_TLS_CERT_ALTNAME_INVALID', 'UNABLE_TO_GET_ISSUER_CERT_LOCALLY']);

export function neverConnected(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' && NOT_CONNECTED.has(code);
}

/** Messages of the targets' own "too big" answers (AWS validation errors about sizes or lengths). */
const TOO_LARGE_RE = /too large|too big|exceed|size|length less than or equal|greater than the maximum|maximum allowed|limit of \d+ bytes/i;

export function looksTooLarge(message: string): boolean {
  return TOO_LARGE_RE.test(message);
}

/** A seconds (or HTTP date) header as milliseconds from now; undefined when absent or invalid. */
export function retryAfterMs(value: string | string[] | undefined): number | undefined {
  const v = Array.isArray(value) ? value[0] : value;
  if (v === undefined || v.trim() === '') return undefined;
  const secs = Number(v);
  if (Number.isFinite(secs) && secs >= 0) return Math.round(secs * 1000);
  const at = Date.parse(v);
  if (Number.isFinite(at)) return Math.max(0, at - Date.now());
  return undefined;
}

export type Dead = Array<{ index: number; reason: string }>;

/**
 * Checks a batch against the limits before any call. Records bigger than maxRecordBytes can
 * never be delivered: they are dead at once and the rest is sent (no bisecting down to them).
 * Too many records or too many bytes overall → too_large (the caller splits).
 */
export function precheck(records: EventRecord[], limits: TargetLimits, recordBytes: (r: EventRecord) => number): { keep: number[]; dead: Dead } | { outcome: SendOutcome } {
  if (records.length > limits.maxRecords) return { outcome: { kind: 'too_large', reason: `${records.length} records > ${limits.maxRecords} per call` } };
  const keep: number[] = [];
  const dead: Dead = [];
  let total = 0;
  records.forEach((r, i) => {
    const n = recordBytes(r);
    if (n > limits.maxRecordBytes) dead.push({ index: i, reason: `record too large: ${n} bytes > ${limits.maxRecordBytes}` });
    else {
      keep.push(i);
      total += n;
    }
  });
  if (total > limits.maxBatchBytes) return { outcome: { kind: 'too_large', reason: `batch of ${total} bytes > ${limits.maxBatchBytes} per call` } };
  return { keep, dead };
}

/** Combines the caller's signal with a timeout; `state` tells which fired. */
export function deadline(signal: AbortSignal | undefined, timeoutMs: number): { signal: AbortSignal; state: { timedOut: boolean; callerAborted: boolean }; done(): void } {
  const ac = new AbortController();
  const state = { timedOut: false, callerAborted: false };
  const onAbort = () => {
    state.callerAborted = true;
    ac.abort(signal?.reason ?? new Error('aborted'));
  };
  if (signal?.aborted) onAbort();
  else signal?.addEventListener('abort', onAbort, { once: true });
  const timer = setTimeout(() => {
    state.timedOut = true;
    ac.abort(new Error(`no answer within ${timeoutMs} ms`));
  }, timeoutMs);
  return {
    signal: ac.signal,
    state,
    done() {
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
    },
  };
}

/** A retry outcome for a call that ended without an answer. */
export function noAnswer(what: string, state: { timedOut: boolean; callerAborted: boolean }, timeoutMs: number, sent: boolean, err?: unknown): SendOutcome {
  if (state.callerAborted) return { kind: 'retry', reason: `${what}: aborted`, unknownOutcome: sent };
  if (state.timedOut) return { kind: 'retry', reason: `${what}: no answer within ${timeoutMs} ms`, unknownOutcome: sent };
  return { kind: 'retry', reason: `${what}: ${err === undefined ? 'no answer' : errorText(err)}`, unknownOutcome: sent && !neverConnected(err) };
}

/** 5xx from a gateway (502/504) may hide a processed request; a 500/503 answer means it was not. */
export function unknownFor5xx(status: number): boolean {
  return status === 502 || status === 504;
}

/**
 * Caches a per-record serialization (recordBytes and send both need it, and the caller calls
 * recordBytes while batching). Keyed by the record object and checked against its body, so a
 * record object reused with another body is serialized again.
 */
export function memoByBody(fn: (r: EventRecord) => string): (r: EventRecord) => string {
  const cache = new WeakMap<EventRecord, { body: string; ts: number; id: string; out: string }>();
  return (r) => {
    const hit = cache.get(r);
    if (hit && hit.body === r.body && hit.ts === r.timestamp && hit.id === r.eventId) return hit.out;
    const out = fn(r);
    cache.set(r, { body: r.body, ts: r.timestamp, id: r.eventId, out });
    return out;
  };
}

/**
 * The outcome of an HTTP intake's answer (Datadog, Azure; event-delivery.md §1): 2xx done; 400
 * dead for a one-record batch, else the batch is rejected; 401/403/404 auth (wrong key, role, site,
 * DCR or stream); 413 too large; 429 throttled (after `retryAfter`); 408 and 5xx retried.
 */
export function httpOutcome(status: number, text: string, count: number, retryAfter: number | undefined): SendOutcome {
  const s = status;
  if (s >= 200 && s < 300) return { kind: 'done', retry: [], dead: [] };
  if (s === 400) return count === 1 ? { kind: 'done', retry: [], dead: [{ index: 0, reason: text }] } : { kind: 'rejected', reason: text };
  if (s === 401 || s === 403 || s === 404) return { kind: 'auth', reason: text };
  if (s === 413) return { kind: 'too_large', reason: text };
  if (s === 429) return { kind: 'throttled', reason: text, ...(retryAfter !== undefined ? { retryAfterMs: retryAfter } : {}) };
  if (s === 408) return { kind: 'retry', reason: text, unknownOutcome: false };
  if (s >= 500) return { kind: 'retry', reason: text, unknownOutcome: unknownFor5xx(s) };
  return { kind: 'rejected', reason: text };
}

/**
 * The outcome of a call that sent only the records at `keep` (the others already `dead` before
 * the call): a `done` outcome's indices are mapped back to the caller's, in order.
 */
export function ofSubset(o: SendOutcome, keep: number[], dead: Dead): SendOutcome {
  if (o.kind !== 'done') return o;
  return { kind: 'done', retry: o.retry.map((i) => keep[i]!), dead: [...dead, ...o.dead.map((d) => ({ index: keep[d.index]!, reason: d.reason }))].sort((a, b) => a.index - b.index) };
}
