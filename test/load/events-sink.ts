import http from 'node:http';
import { gunzipSync } from 'node:zlib';

/**
 * A lean Datadog logs intake for the event-delivery bench (test/load/events-bench.ts), meant to
 * run as its own process on core 0 (`taskset -c 0 node --import tsx test/load/events-sink.ts`).
 *
 * Speaks just enough of the intake protocol (event-delivery.md §1): `POST /api/v2/logs` with a
 * `DD-API-KEY` header and `Content-Encoding: gzip` → `202 {}` at once (keep-alive), else 404/405,
 * 403 or 400. Unlike the Datadog fake in test/support/fakes it checks no limits and keeps no
 * entries: it gunzips and counts entries by their (unescaped) `"ddsource":"warren"` key, which
 * appears once per entry and never inside a message (the message is an escaped JSON string).
 *
 * Parse mode (for the latency phases) also parses every entry's envelope and keeps
 * `(event_id, event_type, object.id, object.metadata, received_at)`.
 *
 * Times are wall clock in ms (`performance.timeOrigin + performance.now()`), comparable across
 * the processes of one box. With an IPC channel (spawned by the bench) it answers messages:
 * `{type:'stats'}` → `{type:'stats', stats}`, `{type:'reset'}`, `{type:'mode', parse}` and
 * `{type:'records'}` → `{type:'records', records}` (then cleared). Standalone it prints its URL
 * (PORT env, default a free port) and a line of stats per second.
 */

export interface SinkStats {
  /** Entries accepted since the last reset. */
  events: number;
  requests: number;
  /** Compressed and uncompressed body bytes. */
  gzipBytes: number;
  rawBytes: number;
  /** Requests answered other than 202. */
  rejected: number;
  /** Receipt time (body complete) of the first and last accepted request. */
  firstAt: number;
  lastAt: number;
}

export interface SinkRecord {
  id: string;
  type: string;
  objectId: string;
  metadata: string;
  at: number;
}

const now = () => performance.timeOrigin + performance.now();
const KEY = Buffer.from('"ddsource":"warren"');

function countEntries(raw: Buffer): number {
  let n = 0;
  let i = raw.indexOf(KEY);
  while (i !== -1) {
    n++;
    i = raw.indexOf(KEY, i + KEY.length);
  }
  return n;
}

let stats: SinkStats = fresh();
let parse = false;
let records: SinkRecord[] = [];

function fresh(): SinkStats {
  return { events: 0, requests: 0, gzipBytes: 0, rawBytes: 0, rejected: 0, firstAt: 0, lastAt: 0 };
}

function answer(res: http.ServerResponse, status: number, body: string): void {
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

const server = http.createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    const at = now();
    stats.requests++;
    const reject = (status: number, why: string) => {
      stats.rejected++;
      answer(res, status, JSON.stringify({ errors: [{ status: String(status), detail: why }] }));
    };
    if ((req.url ?? '').split('?')[0] !== '/api/v2/logs') return reject(404, 'no route');
    if (req.method !== 'POST') return reject(405, 'method');
    if (typeof req.headers['dd-api-key'] !== 'string' || !req.headers['dd-api-key']) return reject(403, 'missing DD-API-KEY');
    if (String(req.headers['content-encoding'] ?? '').toLowerCase() !== 'gzip') return reject(400, 'Content-Encoding: gzip is required');
    const body = chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks);
    let raw: Buffer;
    try {
      raw = gunzipSync(body);
    } catch {
      return reject(400, 'body is not valid gzip');
    }
    // Answer first: the receiver "answers 2xx at once"; counting is the sink's own business.
    answer(res, 202, '{}');
    const n = countEntries(raw);
    stats.events += n;
    stats.gzipBytes += body.length;
    stats.rawBytes += raw.length;
    if (!stats.firstAt) stats.firstAt = at;
    stats.lastAt = at;
    if (parse) {
      try {
        for (const e of JSON.parse(raw.toString('utf8')) as Array<{ message: string }>) {
          const env = JSON.parse(e.message) as { event_id?: string; event_type?: string; object?: { id?: string; metadata?: string } };
          records.push({ id: env.event_id ?? '', type: env.event_type ?? '', objectId: env.object?.id ?? '', metadata: env.object?.metadata ?? '', at });
        }
      } catch {
        /* counted above; a malformed body just yields no records */
      }
    }
  });
});
server.keepAliveTimeout = 120_000;
server.headersTimeout = 121_000;

server.listen(Number(process.env.PORT ?? 0), '127.0.0.1', () => {
  const port = (server.address() as { port: number }).port;
  if (process.send) {
    process.on('message', (m: { type?: string; parse?: boolean }) => {
      if (m?.type === 'stats') process.send!({ type: 'stats', stats });
      else if (m?.type === 'reset') {
        stats = fresh();
        records = [];
        process.send!({ type: 'reset' });
      } else if (m?.type === 'mode') {
        parse = m.parse === true;
        process.send!({ type: 'mode' });
      } else if (m?.type === 'records') {
        process.send!({ type: 'records', records });
        records = [];
      }
    });
    process.on('disconnect', () => process.exit(0));
    process.send({ type: 'listening', port });
  } else {
    console.log(`events sink on http://127.0.0.1:${port} (Datadog intake: POST /api/v2/logs)`);
    let last = 0;
    setInterval(() => {
      if (stats.events !== last) console.log(`${stats.events} events, ${stats.requests} requests, ${stats.rejected} rejected`);
      last = stats.events;
    }, 1000).unref();
  }
});
process.on('SIGTERM', () => process.exit(0));
