import type http from 'node:http';
import { gunzipSync } from 'node:zlib';
import { FakeListener, FaultQueue, mediaType, playFault, readBody, resetConnection } from './http.js';

/**
 * Datadog logs intake fake: a local `node:http` receiver on 127.0.0.1 (port 0) for
 * `POST /api/v2/logs` (docs/event-delivery.md §1 and §4). Point the worker's Datadog intake base
 * URL at `url`.
 *
 * Checks, in order: path and method (404/405), `DD-API-KEY` (403), the scripted fault (if any),
 * `Content-Type: application/json` and `Content-Encoding: gzip` (400), a gzip body (400) that
 * decompresses to at most 5 MB (413), a JSON array (400) of at most 1,000 entries (413), each an
 * object with a string `message` (400). An entry over 1 MB has its message truncated and is
 * still answered 202, as Datadog does. Success is `202 {}`.
 *
 * Datadog's "MB" is decimal here (5,000,000 / 1,000,000 bytes), the stricter reading; Vector's
 * Datadog sink uses the same numbers (payload ≤ 5,000,000, aiming at 4,250,000).
 */

export type DatadogFault =
  | { kind: 'status'; status: 400 | 401 | 403 | 408 | 413 | 429 | 500 | 503; rateLimitResetSeconds?: number }
  | { kind: 'slow'; ms: number }
  | { kind: 'reset' }
  | { kind: 'accept-then-reset' };

export interface DatadogEntry {
  message: string;
  ddsource?: string;
  ddtags?: string;
  service?: string;
  hostname?: string;
  /** set when the fake truncated an entry over 1 MB. */
  truncated?: true;
}

export interface DatadogRequestRecord {
  /** HTTP status answered; 0 when the connection was reset instead. */
  status: number;
  /** entries in the body (when it could be parsed). */
  entries?: number;
  /** uncompressed body bytes (when it could be decompressed). */
  bytes?: number;
  /** compressed (wire) body bytes. */
  gzipBytes: number;
  gzip: boolean;
  error?: string;
  fault?: DatadogFault['kind'];
}

export interface DatadogFake {
  url: string;
  apiKeys: Set<string>;
  /** accepted entries, in order. */
  entries: DatadogEntry[];
  requests: DatadogRequestRecord[];
  fail(fault: DatadogFault, times?: number): void;
  stop(): Promise<void>;
  start(): Promise<void>;
  reset(): void;
  close(): Promise<void>;
}

export const DATADOG_LIMITS = {
  maxEntries: 1000,
  maxPayloadBytes: 5_000_000,
  maxEntryBytes: 1_000_000,
} as const;

const TITLES: Record<number, string> = {
  400: 'Bad Request',
  401: 'Unauthorized',
  403: 'Forbidden',
  404: 'Not Found',
  405: 'Method Not Allowed',
  408: 'Request Timeout',
  413: 'Payload Too Large',
  429: 'Too Many Requests',
  500: 'Internal Server Error',
  503: 'Service Unavailable',
};

export async function startDatadogFake(o: { apiKeys: string[] }): Promise<DatadogFake> {
  const apiKeys = new Set(o.apiKeys);
  const entries: DatadogEntry[] = [];
  const requests: DatadogRequestRecord[] = [];
  const faults = new FaultQueue<'intake', DatadogFault>();

  const handle = async (req: http.IncomingMessage, res: http.ServerResponse): Promise<void> => {
    const body = await readBody(req);
    const gzip = (req.headers['content-encoding'] ?? '').toString().trim().toLowerCase() === 'gzip';
    const entry: DatadogRequestRecord = { status: 0, gzip, gzipBytes: body.length };
    requests.push(entry);
    const answer = (status: number, detail?: string, headers: Record<string, string> = {}) => {
      entry.status = status;
      const payload = status === 202 ? '{}' : JSON.stringify({ errors: [{ status: String(status), title: TITLES[status] ?? 'Error', ...(detail ? { detail } : {}) }] });
      if (status !== 202) entry.error = detail ?? TITLES[status] ?? String(status);
      res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload), ...headers });
      res.end(payload);
    };

    const path = (req.url ?? '/').split('?')[0];
    if (path !== '/api/v2/logs') return answer(404, `no route ${path}`);
    if (req.method !== 'POST') return answer(405, `method ${req.method}`);
    const key = req.headers['dd-api-key'];
    if (typeof key !== 'string' || !apiKeys.has(key)) return answer(403, 'Forbidden: invalid or missing DD-API-KEY');

    // Parse what we can up front so a faulted request is still described in `requests`.
    let raw: Buffer | undefined;
    let parsed: unknown;
    if (gzip) {
      try {
        raw = gunzipSync(body);
        entry.bytes = raw.length;
        parsed = JSON.parse(raw.toString('utf8'));
        if (Array.isArray(parsed)) entry.entries = parsed.length;
      } catch {
        // answered below
      }
    }

    const fault = await playFault(faults, 'intake', entry, listener, req);
    if (fault === 'reset') return;
    if (fault?.kind === 'status') {
      const headers: Record<string, string> = {};
      if (fault.status === 429) {
        headers['x-ratelimit-limit'] = '1000';
        headers['x-ratelimit-period'] = '60';
        headers['x-ratelimit-remaining'] = '0';
        headers['x-ratelimit-reset'] = String(fault.rateLimitResetSeconds ?? 1);
      } else if (fault.rateLimitResetSeconds !== undefined) {
        headers['x-ratelimit-reset'] = String(fault.rateLimitResetSeconds);
      }
      return answer(fault.status, `injected ${fault.status}`, headers);
    }

    if (mediaType(req.headers['content-type']) !== 'application/json') return answer(400, `Content-Type must be application/json, got '${req.headers['content-type'] ?? ''}'`);
    if (!gzip) return answer(400, 'Content-Encoding: gzip is required');
    if (!raw) return answer(400, 'body is not valid gzip');
    if (raw.length > DATADOG_LIMITS.maxPayloadBytes) return answer(413, `payload of ${raw.length} bytes exceeds ${DATADOG_LIMITS.maxPayloadBytes} bytes uncompressed`);
    if (parsed === undefined) return answer(400, 'body is not valid JSON');
    if (!Array.isArray(parsed)) return answer(400, 'body must be a JSON array of log entries');
    if (parsed.length > DATADOG_LIMITS.maxEntries) return answer(413, `${parsed.length} entries exceed ${DATADOG_LIMITS.maxEntries} per payload`);
    const accepted: DatadogEntry[] = [];
    for (const [i, e] of parsed.entries()) {
      if (typeof e !== 'object' || e === null || Array.isArray(e) || typeof (e as { message?: unknown }).message !== 'string') return answer(400, `entry ${i} must be an object with a string message`);
      const { message, ddsource, ddtags, service, hostname } = e as Record<string, unknown>;
      const out: DatadogEntry = { message: message as string };
      if (typeof ddsource === 'string') out.ddsource = ddsource;
      if (typeof ddtags === 'string') out.ddtags = ddtags;
      if (typeof service === 'string') out.service = service;
      if (typeof hostname === 'string') out.hostname = hostname;
      // Over 1 MB: cut the message until the serialized entry fits (escapes make it iterative).
      let size = Buffer.byteLength(JSON.stringify(e), 'utf8');
      if (size > DATADOG_LIMITS.maxEntryBytes) {
        const rest = { ...(e as Record<string, unknown>) };
        let bytes = Buffer.from(out.message, 'utf8');
        while (size > DATADOG_LIMITS.maxEntryBytes && bytes.length > 0) {
          bytes = bytes.subarray(0, Math.max(0, bytes.length - (size - DATADOG_LIMITS.maxEntryBytes)));
          rest.message = bytes.toString('utf8').replace(/\uFFFD$/, '');
          size = Buffer.byteLength(JSON.stringify(rest), 'utf8');
        }
        out.message = rest.message as string;
        out.truncated = true;
      }
      accepted.push(out);
    }
    entries.push(...accepted);
    if (fault?.kind === 'accept-then-reset') {
      entry.error = 'accept-then-reset';
      resetConnection(req);
      return;
    }
    answer(202);
  };

  const listener = new FakeListener(handle);
  await listener.listen();

  return {
    url: `http://127.0.0.1:${listener.port}`,
    apiKeys,
    entries,
    requests,
    fail(fault, times = 1) {
      faults.push('intake', fault, times);
    },
    stop: () => listener.stop(),
    start: () => listener.start(),
    reset() {
      entries.length = 0;
      requests.length = 0;
      faults.clear();
    },
    close: () => listener.close(),
  };
}
