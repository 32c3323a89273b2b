import { azureSchema, parseStored } from './config.js';
import { HttpFailure, createAgents, httpRequest, postGzipJsonArray, type HttpAnswer } from './http.js';
import type { EventRecord, LoadedDestination, SendOutcome, Target, TargetEnv, TargetLimits } from './types.js';
import { Secrets, errorText, httpOutcome, ofSubset, memoByBody, precheck, retryAfterMs, timeoutOf, utf8Length } from './util.js';


/**
 * Azure Monitor Logs Ingestion API with plain HTTP (no Azure SDK: its upload() chunks, runs
 * chunks concurrently and retries internally, and Azure has no dedup — here one send() is one
 * POST).
 *
 * Token: client credentials at `<authority>/<tenant>/oauth2/v2.0/token`, scope
 * https://monitor.azure.com/.default, cached until 5 minutes before it expires. Token answer
 * 400/401/403 (invalid_client, unauthorized_client, wrong tenant…) → auth; 429 → throttled;
 * 5xx / network → retry (nothing was uploaded).
 *
 * Upload: POST <logs_ingestion_uri>/dataCollectionRules/<dcr>/streams/<stream>?api-version=2023-01-01
 * with Bearer and gzip; body = JSON array of rows. 2xx (204) → done; 400 → rejected (single
 * record: done with it dead); 401 → the cached token is dropped, auth; 403 → auth (app lacks
 * "Monitoring Metrics Publisher" on the DCR); 404 → auth (DCR or stream missing); 413 →
 * too_large; 429 → throttled with Retry-After; 5xx / network → retry.
 *
 * ROW SHAPE — the DCR's stream declaration (`streamDeclarations.<Custom-…>.columns`) must
 * declare these columns (names are case-sensitive; extra undeclared fields are dropped by Azure):
 *   TimeGenerated  datetime  the event timestamp (RFC 3339)
 *   EventId        string    envelope event_id (ev_…), the dedup key (Azure does not dedup)
 *   EventType      string    envelope event_type (e.g. ip_policy_created.v0)
 *   AccountId      string    envelope account_id (ac_…)
 *   Event          dynamic   the whole envelope as an object; when its JSON exceeds 64,000 bytes
 *                            (Azure truncates field values at 64 KB) it is instead a string: the
 *                            envelope JSON cut to 64,000 bytes, and Truncated is true
 *   Truncated      boolean   true when Event was cut (always present)
 *
 * Limits: ≤ 1 MB per call compressed and uncompressed → 1,000,000 bytes of uncompressed JSON
 * (the record's row + a comma each), which also bounds the compressed size.
 */
export const AZURE_LIMITS: TargetLimits = { maxRecords: 10_000, maxBatchBytes: 1_000_000, maxRecordBytes: 1_000_000 - 2, overheadBytes: 1 };
export const AZURE_MAX_FIELD_BYTES = 64_000;
export const AZURE_API_VERSION = '2023-01-01';
const TOKEN_MARGIN_MS = 5 * 60 * 1000;

/** Cuts a string to at most `max` UTF-8 bytes without splitting a character. */
function cutUtf8(s: string, max: number): string {
  const buf = Buffer.from(s, 'utf8');
  if (buf.length <= max) return s;
  let end = max;
  while (end > 0 && (buf[end]! & 0xc0) === 0x80) end--;
  return buf.toString('utf8', 0, end);
}

export interface AzureRow {
  TimeGenerated: string;
  EventId: string;
  EventType: string;
  AccountId: string;
  Event: unknown;
  Truncated: boolean;
}

export function azureRow(r: EventRecord): AzureRow {
  let envelope: Record<string, unknown> | undefined;
  try {
    const v: unknown = JSON.parse(r.body);
    if (v && typeof v === 'object' && !Array.isArray(v)) envelope = v as Record<string, unknown>;
  } catch {
    envelope = undefined;
  }
  const str = (v: unknown) => (typeof v === 'string' ? v : '');
  const ts = Number.isFinite(r.timestamp) ? new Date(r.timestamp) : new Date();
  const tooBig = utf8Length(r.body) > AZURE_MAX_FIELD_BYTES;
  return {
    TimeGenerated: (Number.isNaN(ts.getTime()) ? new Date() : ts).toISOString(),
    EventId: r.eventId || str(envelope?.event_id),
    EventType: str(envelope?.event_type),
    AccountId: str(envelope?.account_id),
    Event: tooBig ? cutUtf8(r.body, AZURE_MAX_FIELD_BYTES) : (envelope ?? r.body),
    Truncated: tooBig,
  };
}

interface CachedToken {
  token: string;
  refreshAt: number;
}

export function createAzureTarget(dest: LoadedDestination, env: TargetEnv): Target {
  const cfg = parseStored(azureSchema, dest.target);
  const authority = (env.azureAuthorityHost ?? 'https://login.microsoftonline.com').replace(/\/+$/, '');
  const tokenUrl = new URL(`${authority}/${encodeURIComponent(cfg.tenant_id)}/oauth2/v2.0/token`);
  const uploadUrl = new URL(
    `${cfg.logs_ingestion_uri.replace(/\/+$/, '')}/dataCollectionRules/${encodeURIComponent(cfg.data_collection_rule_id)}/streams/${encodeURIComponent(cfg.data_collection_stream_name)}?api-version=${AZURE_API_VERSION}`,
  );
  const secrets = new Secrets();
  secrets.add(cfg.client_secret);
  const agents = createAgents(env.caPem);
  const timeoutMs = timeoutOf(env);
  const rowJson = memoByBody((r: EventRecord) => JSON.stringify(azureRow(r)));
  const recordBytes = (r: EventRecord) => utf8Length(rowJson(r)) + 1;
  const what = `Azure Logs Ingestion ${uploadUrl.host}`;
  let cached: CachedToken | undefined;
  let pending: Promise<{ token: string } | { outcome: SendOutcome }> | undefined;

  const describe = (ans: HttpAnswer) => {
    let detail = ans.body.toString('utf8', 0, 400);
    try {
      const j = JSON.parse(ans.body.toString('utf8')) as { error?: unknown; error_description?: unknown };
      if (typeof j.error === 'string') detail = `${j.error}${typeof j.error_description === 'string' ? `: ${j.error_description.split(/\r?\n/)[0]}` : ''}`;
      else if (j.error && typeof j.error === 'object') {
        const e = j.error as { code?: unknown; message?: unknown };
        detail = `${String(e.code ?? '')}: ${String(e.message ?? '')}`;
      }
    } catch {
      // not JSON: keep the text
    }
    return secrets.scrub(`HTTP ${ans.status} ${detail.replace(/\s+/g, ' ').trim()}`.trim());
  };

  async function fetchToken(signal?: AbortSignal): Promise<{ token: string } | { outcome: SendOutcome }> {
    const form = new URLSearchParams({ grant_type: 'client_credentials', client_id: cfg.client_id, client_secret: cfg.client_secret, scope: 'https://monitor.azure.com/.default' });
    let ans: HttpAnswer;
    try {
      ans = await httpRequest({
        url: tokenUrl,
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded', accept: 'application/json' },
        body: Buffer.from(form.toString(), 'utf8'),
        agents,
        timeoutMs,
        ...(signal ? { signal } : {}),
      });
    } catch (err) {
      const why = err instanceof HttpFailure ? (err.callerAborted ? 'aborted' : err.timedOut ? `no answer within ${timeoutMs} ms` : err.message) : errorText(err);
      return { outcome: { kind: 'retry', reason: secrets.scrub(`Azure token: ${why}`), unknownOutcome: false } };
    }
    const s = ans.status;
    if (s >= 200 && s < 300) {
      try {
        const j = JSON.parse(ans.body.toString('utf8')) as { access_token?: unknown; expires_in?: unknown };
        if (typeof j.access_token !== 'string' || !j.access_token) throw new Error('no access_token');
        const expiresIn = Number(j.expires_in);
        const lifeMs = Number.isFinite(expiresIn) && expiresIn > 0 ? expiresIn * 1000 : 3_600_000;
        secrets.addTemporary(j.access_token);
        cached = { token: j.access_token, refreshAt: Date.now() + lifeMs - TOKEN_MARGIN_MS };
        return { token: j.access_token };
      } catch (err) {
        return { outcome: { kind: 'retry', reason: `Azure token: unreadable answer (${(err as Error).message})`, unknownOutcome: false } };
      }
    }
    const text = `Azure token: ${describe(ans)}`;
    if (s === 400 || s === 401 || s === 403 || s === 404) return { outcome: { kind: 'auth', reason: text } };
    if (s === 429) {
      const after = retryAfterMs(ans.headers['retry-after']);
      return { outcome: { kind: 'throttled', reason: text, ...(after !== undefined ? { retryAfterMs: after } : {}) } };
    }
    return { outcome: { kind: 'retry', reason: text, unknownOutcome: false } };
  }

  /** The cached token, or one fetched (concurrent sends share a single token request). */
  async function token(signal?: AbortSignal): Promise<{ token: string } | { outcome: SendOutcome }> {
    if (cached && Date.now() < cached.refreshAt) return { token: cached.token };
    if (!pending) pending = fetchToken(signal).finally(() => (pending = undefined));
    return pending;
  }

  function classify(ans: HttpAnswer, count: number, usedToken: string): SendOutcome {
    const s = ans.status;
    const text = s >= 200 && s < 300 ? '' : `${what}: ${describe(ans)}`;
    // A refused token is not used again.
    if (s === 401 && cached?.token === usedToken) cached = undefined;
    return httpOutcome(s, text, count, retryAfterMs(ans.headers['retry-after']));
  }

  return {
    kind: 'azure_logs_ingestion',
    limits: AZURE_LIMITS,
    recordBytes,
    async send(records, signal): Promise<SendOutcome> {
      const pre = precheck(records, AZURE_LIMITS, recordBytes);
      if ('outcome' in pre) return pre.outcome;
      const { keep, dead } = pre;
      if (keep.length === 0) return { kind: 'done', retry: [], dead };
      if (signal?.aborted) return { kind: 'retry', reason: `${what}: aborted`, unknownOutcome: false };
      const t = await token(signal);
      if ('outcome' in t) return t.outcome;
      const ans = await postGzipJsonArray({ url: uploadUrl, headers: { authorization: `Bearer ${t.token}` }, entries: keep.map((i) => rowJson(records[i]!)), agents, timeoutMs, ...(signal ? { signal } : {}), what, secrets });
      if ('outcome' in ans) return ans.outcome;
      return ofSubset(classify(ans, keep.length, t.token), keep, dead);
    },
    close() {
      agents.destroy();
      cached = undefined;
    },
  };
}
