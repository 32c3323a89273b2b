import os from 'node:os';
import { datadogSchema, parseStored } from './config.js';
import { createAgents, postGzipJsonArray, type HttpAnswer } from './http.js';
import type { EventRecord, LoadedDestination, SendOutcome, Target, TargetEnv, TargetLimits } from './types.js';
import { Secrets, httpOutcome, ofSubset, memoByBody, precheck, retryAfterMs, timeoutOf, utf8Length } from './util.js';


/**
 * Datadog logs intake v2: POST <base>/api/v2/logs, DD-API-KEY, gzip body = JSON array of
 * `{message: <envelope JSON text>, ddsource: "warren", ddtags?, service, hostname}`.
 * A record counts the bytes of its serialized entry plus the separating comma (Datadog's limits
 * are on the uncompressed payload): ≤ 1,000 entries, 4.25 MB per payload (Datadog's limit is
 * 5 MB), 1 MB per entry (Datadog truncates bigger ones; here they are dead instead, whole).
 *
 * 2xx → done; 400 → rejected (a single-record batch: done with that record dead); 401/403 →
 * auth; 404 → auth (wrong site or base URL); 413 → too_large; 429 → throttled with
 * `x-ratelimit-reset` (seconds) or Retry-After; 408/5xx → retry.
 */
export const DATADOG_LIMITS: TargetLimits = { maxRecords: 1000, maxBatchBytes: 4_250_000, maxRecordBytes: 1_000_000, overheadBytes: 1 };
export const DEFAULT_DATADOG_SITE = 'datadoghq.com';

/** The intake URL: `https://http-intake.logs.<site>/api/v2/logs`, or under the override base. */
export function datadogIntakeUrl(ddsite: string | null | undefined, baseOverride?: string): URL {
  const site = (ddsite || DEFAULT_DATADOG_SITE).toLowerCase();
  const base = (baseOverride ?? `https://http-intake.logs.${site}`).replace(/\/+$/, '');
  return new URL(`${base}/api/v2/logs`);
}

export function createDatadogTarget(dest: LoadedDestination, env: TargetEnv): Target {
  const cfg = parseStored(datadogSchema, dest.target);
  const url = datadogIntakeUrl(cfg.ddsite, env.datadogBaseUrl);
  const secrets = new Secrets();
  secrets.add(cfg.api_key);
  const agents = createAgents(env.caPem);
  const timeoutMs = timeoutOf(env);
  const hostname = env.hostname ?? os.hostname();
  const service = cfg.service || 'warren';
  const ddtags = cfg.ddtags || undefined;
  const entryJson = memoByBody((r: EventRecord) => JSON.stringify({ message: r.body, ddsource: 'warren', ...(ddtags ? { ddtags } : {}), service, hostname }));
  const recordBytes = (r: EventRecord) => utf8Length(entryJson(r)) + 1;
  const what = `Datadog ${url.host}`;

  function classify(ans: HttpAnswer, count: number): SendOutcome {
    const s = ans.status;
    const detail = secrets.scrub(ans.body.toString('utf8', 0, 300).replace(/\s+/g, ' ').trim());
    const text = `${what}: HTTP ${s}${detail ? ` ${detail}` : ''}`;
    return httpOutcome(s, text, count, retryAfterMs(ans.headers['x-ratelimit-reset']) ?? retryAfterMs(ans.headers['retry-after']));
  }

  return {
    kind: 'datadog',
    limits: DATADOG_LIMITS,
    recordBytes,
    async send(records, signal): Promise<SendOutcome> {
      const pre = precheck(records, DATADOG_LIMITS, recordBytes);
      if ('outcome' in pre) return pre.outcome;
      const { keep, dead } = pre;
      if (keep.length === 0) return { kind: 'done', retry: [], dead };
      const ans = await postGzipJsonArray({ url, headers: { 'dd-api-key': cfg.api_key, accept: 'application/json' }, entries: keep.map((i) => entryJson(records[i]!)), agents, timeoutMs, ...(signal ? { signal } : {}), what, secrets });
      if ('outcome' in ans) return ans.outcome;
      return ofSubset(classify(ans, keep.length), keep, dead);
    },
    close() {
      agents.destroy();
    },
  };
}
