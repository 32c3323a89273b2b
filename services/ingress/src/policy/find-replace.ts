import { isUtf8 } from 'node:buffer';
import * as stream from 'node:stream';
import { Transform, type Duplex, type TransformCallback } from 'node:stream';
import zlib from 'node:zlib';
import { Counter, Gauge, type Registry } from 'prom-client';
import { applyFindReplace, compileFindReplace, FIND_REPLACE_LIMITS, UrlActionRuntimeError, type CelProgram, type FindReplaceConfig, type FindReplaceType, type PolicyDirection } from '@warren/shared';
import { rawHeader, removeRawHeaders, setRawHeader } from '../modules/common.js';
import type { LengthDecidingTransform, RequestState, ResponseState } from '../pipeline/types.js';
import type { Activation } from './activation.js';
import { compressionPending } from './body-actions.js';
import { celToHeaderText } from './headers.js';
import { regexWorkerCounts, regexWorkerJobs, rewriteOnRegexWorker, warmRegexWorker, type RegexJobResult } from './regex-worker.js';
import type { FailedFn } from './url-actions.js';

/**
 * `request-body-find-replace` and `response-body-find-replace` at run time (validated, and the
 * replacements compiled and applied, by `services/shared/src/traffic-policy/find-replace.ts`).
 * ngrok: https://ngrok.com/docs/traffic-policy/actions/request-body-find-replace/ and
 * …/response-body-find-replace/.
 *
 * Which bodies (ngrok documents no content types; binary bodies are never touched):
 * - a text type: `text/*` but `text/event-stream` (ngrok has `sse-find-replace` for streams),
 *   JSON, XML (`application/json`, `…+json`, `application/xml`, `…+xml`), form data
 *   (`application/x-www-form-urlencoded`), JavaScript, GraphQL, NDJSON, YAML; with no charset
 *   or `utf-8` / `us-ascii`, and whose bytes are valid UTF-8. No `Content-Type`: not touched.
 * - no content coding, or exactly one of `gzip` (`x-gzip`), `deflate`, `br` (`br` only for
 *   responses: see `rewrite`): decoded by a streaming decompressor fed 16 KiB at a time and
 *   destroyed as soon as more than the action's bound has come out (a zip bomb stops there),
 *   rewritten, encoded again with the same coding, on libuv's thread pool (off the event loop).
 *   At most `FIND_REPLACE_PROCESS_LIMITS.poolJobs` (2) such bodies are worked on at once in the
 *   process, re-encoding included (up to ~16 ms of pool CPU for a 256 KiB result of random text in gzip);
 *   more at once pass unchanged (`busy`). Anything else (`zstd`, two codings, a corrupt body)
 *   passes unchanged.
 * - at most the action's bound, encoded and once decoded: 128 KiB. An action of literal
 *   replacements rewrites it on the event loop; one with a regex replacement rewrites a body of
 *   up to 4 KiB there (`CompiledFindReplace.bodyBytes`; see the shared module) and a larger one
 *   on the regex worker thread (`regex-worker.ts`: one thread, a 1 s deadline per body, at most
 *   32 bodies queued in the process and 8 of one action, else `busy`; out of time: `timeout`),
 *   each within its replacements' match and result bounds.
 * A body outside these passes on unchanged and is counted in
 * `warren_traffic_policy_find_replace_skipped_total{direction, reason}` (`reason`: `type`,
 * `charset`, `encoding`, `too_large`, `not_utf8`, `too_many_matches`, `partial`, `busy`: the
 * process-wide limits above and below were reached, `timeout`). `${…}` values
 * are evaluated when the action runs; one that fails to evaluate is an evaluation error (counted
 * and logged by the engine) and the action does nothing.
 *
 * Request: the stage buffers the body (`needsBody`, as for verify-webhook: 1 MiB, else 413
 * `ERR_WARREN_7009`; 30 s, else 408 `ERR_WARREN_7012`). The rewritten body replaces
 * `RequestState.body` (what the forwarder sends) and `Content-Length` is set to its length
 * (`Transfer-Encoding` dropped: the body is sent whole); `Content-MD5` / `Content-Digest` /
 * `Repr-Digest`, no longer true, are dropped. verify-webhook still checks the original body
 * (`originalRequestBody`); later actions and the upstream see the new one.
 *
 * Response: the action decides on the head (not for 1xx/204/304, a 206 or `Content-Range`
 * response (a part cannot be rewritten: `partial`), a declared `Content-Length` over the bound)
 * and evaluates its `${…}`; then it drops `Content-Length` (the new length is not known when the
 * head goes out: the response is sent chunked), `Accept-Ranges` and the digests above, and
 * weakens a strong `ETag` (`W/`, as compression does). The stage's `transformBody` buffers at
 * most the largest bound of the actions that ran (128 KiB at most per response) as the body
 * arrives: once it has ended, each action whose bound the (decoded) body fits runs on it, in
 * order, the others are counted (`too_large`), and the result goes out; if it grows past that
 * bound, what was held is sent unchanged and the rest streams through (`too_large`). While it is
 * rewritten a response holds more: the body as it came, decoded, the result (up to twice the
 * bound) and its re-encoding, up to ~6 times the bound (~768 KiB), plus zlib's own state (a br
 * decoder's window: up to 16 MiB while it runs, at most `poolJobs` at once). Every byte it holds
 * counts against `FIND_REPLACE_PROCESS_LIMITS.heldBytes` (64 MiB, process-wide): past that, the
 * response passes unchanged (`busy`). It runs before the compressor of a compress-response (the
 * engine chains them): the text is replaced, then compressed. The route's `compression` module
 * compresses before the policy's transforms run, so a body it compressed is decoded, rewritten
 * and compressed again, as is a body the upstream encoded (which keeps its coding; compress-response
 * sees it as already compressed).
 */

export interface CompiledFindReplace {
  kind: FindReplaceType;
  /** The action's path (`outbound[0].actions[1]`), for evaluation errors. */
  where: string;
  replacements: Replacements;
  /** As validated, for the regex worker thread, which compiles it again. */
  config: FindReplaceConfig;
  direction: PolicyDirection;
}

type Replacements = ReturnType<typeof compileFindReplace>;

export function compileFindReplaceAction(type: FindReplaceType, c: FindReplaceConfig, direction: PolicyDirection, where: string): CompiledFindReplace {
  const replacements = compileFindReplace(direction, c);
  if (replacements.workerBytes > replacements.bodyBytes) warmRegexWorker();
  return { kind: type, where, replacements, config: c, direction };
}

type Direction = 'request' | 'response';
type SkipReason = 'type' | 'charset' | 'encoding' | 'too_large' | 'not_utf8' | 'too_many_matches' | 'partial' | 'busy' | 'timeout' | 'slow';

let skipped: Counter<'direction' | 'reason'> | null = null;

/** Registers the skip counter (once per registry; by each engine with one of these actions). */
export function observeFindReplace(registry: Registry): void {
  const name = 'warren_traffic_policy_find_replace_skipped_total';
  skipped =
    (registry.getSingleMetric(name) as Counter<'direction' | 'reason'> | undefined) ??
    new Counter({ name, help: 'Bodies a request-/response-body-find-replace action passed on unchanged because it could not rewrite them (reason: type, charset, encoding, too_large, not_utf8, too_many_matches, partial, busy, timeout, slow)', labelNames: ['direction', 'reason'], registers: [registry] });
  const jobs = 'warren_traffic_policy_regex_worker_jobs';
  if (!registry.getSingleMetric(jobs)) {
    new Gauge({
      name: jobs,
      help: 'Bodies queued or being rewritten on the regex worker thread now (find-replace actions with a regex, bodies over 4 KiB); at REGEX_WORKER_LIMITS.jobs further bodies pass unchanged (busy)',
      registers: [registry],
      collect() {
        this.set(regexWorkerJobs());
      },
    });
    new Counter({
      name: 'warren_traffic_policy_regex_worker_restarts_total',
      help: 'Times the regex worker thread was replaced: a body ran out of time (timeout) or the thread failed',
      registers: [registry],
      collect() {
        this.reset();
        this.inc(regexWorkerCounts.restarts);
      },
    });
  }
  const held = 'warren_traffic_policy_find_replace_held_bytes';
  if (!registry.getSingleMetric(held)) {
    new Gauge({
      name: held,
      help: 'Bytes response-body-find-replace actions hold in this process now (bodies being taken whole, their rewrites and re-encodings); at FIND_REPLACE_PROCESS_LIMITS.heldBytes further bodies pass unchanged (busy)',
      registers: [registry],
      collect() {
        this.set(heldBytes);
      },
    });
  }
}

function skip(direction: Direction, reason: SkipReason): null {
  skipped?.inc({ direction, reason });
  return null;
}

// --- What a body is ---

const TEXT_TYPES = new Set(['application/json', 'application/xml', 'application/x-www-form-urlencoded', 'application/javascript', 'application/ecmascript', 'application/x-javascript', 'application/graphql', 'application/x-ndjson', 'application/yaml', 'application/x-yaml']);

/** null when the media type is text this action may rewrite, else the reason it is not. */
function typeProblem(contentType: string | undefined): SkipReason | null {
  if (!contentType) return 'type';
  const [media, ...params] = contentType.split(';');
  const t = media!.trim().toLowerCase();
  const text = (t.startsWith('text/') && t !== 'text/event-stream') || TEXT_TYPES.has(t) || (t.startsWith('application/') && (t.endsWith('+json') || t.endsWith('+xml')));
  if (!text) return 'type';
  for (const p of params) {
    const eq = p.indexOf('=');
    if (eq < 0 || p.slice(0, eq).trim().toLowerCase() !== 'charset') continue;
    const cs = p.slice(eq + 1).trim().replace(/^"(.*)"$/, '$1').toLowerCase();
    if (cs !== 'utf-8' && cs !== 'utf8' && cs !== 'us-ascii') return 'charset';
  }
  return null;
}

type BodyCoding = 'identity' | 'gzip' | 'deflate' | 'br';

/** The single content coding of a head, or null when it has one this action cannot undo. */
function codingOf(h: readonly string[]): BodyCoding | null {
  let coding: BodyCoding = 'identity';
  for (let i = 0; i + 1 < h.length; i += 2) {
    if (h[i]!.toLowerCase() !== 'content-encoding') continue;
    for (const c of h[i + 1]!.split(',')) {
      const v = c.trim().toLowerCase();
      if (v === '' || v === 'identity') continue;
      if (coding !== 'identity') return null;
      if (v === 'gzip' || v === 'x-gzip') coding = 'gzip';
      else if (v === 'deflate' || v === 'br') coding = v;
      else return null;
    }
  }
  return coding;
}

/** The largest body any action rewrites (a response holds at most this much). */
const MAX = Math.max(FIND_REPLACE_LIMITS.bodyBytes, FIND_REPLACE_LIMITS.literalBodyBytes, FIND_REPLACE_LIMITS.workerBodyBytes);

/**
 * Process-wide limits of these actions (a shared ingress: every tenant's bodies count). Mutable
 * for tests, and `holdMs` set from FIND_REPLACE_HOLD_MS at start.
 */
export const FIND_REPLACE_PROCESS_LIMITS = {
  /**
   * Encoded bodies decoded, rewritten and encoded again at once. Each job keeps one of libuv's
   * thread-pool threads (4 by default, shared with DNS lookups, files and every other zlib call)
   * busy while it works; with more waiting, the body passes unchanged (`busy`).
   */
  poolJobs: 2,
  /**
   * Bytes held by in-flight response rewrites: what each holds of the body as it arrives, what
   * decoding gives, each result and its re-encoding (up to ~6 times the bound, ~768 KiB, per
   * response). Past it, a response passes unchanged (`busy`).
   */
  heldBytes: 64 * 1024 * 1024,
  /**
   * How long a response body may take to arrive whole (the head waits for it): past that, what
   * was held and the rest pass unchanged (`slow`), so a stream (progress output, long polling)
   * is not held back for as long as the upstream keeps it open.
   */
  holdMs: 10_000,
};

/** Jobs running (`poolJobs`). */
let poolJobs = 0;
/** Bytes held (`heldBytes`). */
let heldBytes = 0;

/** What one response rewrite holds of `heldBytes`. */
class Hold {
  private n = 0;
  private closed = false;

  /** Counts `bytes` more; false (nothing counted) when over the process-wide limit or released. */
  take(bytes: number): boolean {
    if (this.closed || heldBytes + bytes > FIND_REPLACE_PROCESS_LIMITS.heldBytes) return false;
    heldBytes += bytes;
    this.n += bytes;
    return true;
  }

  /** Gives back `bytes` of what it holds (a buffer it no longer keeps). */
  give(bytes: number): void {
    const b = Math.min(bytes, this.n);
    heldBytes -= b;
    this.n -= b;
  }

  /** Gives back everything; later `take`s fail. */
  release(): void {
    this.give(this.n);
    this.closed = true;
  }
}

/** For tests: bytes held and jobs running, process-wide. */
export function findReplaceInFlight(): { heldBytes: number; poolJobs: number } {
  return { heldBytes, poolJobs };
}

/** Input is fed to zlib in slices of this many bytes: each thread-pool run works on at most a slice in and a chunk (16 KiB) out. */
const SLICE = 16 * 1024;

/**
 * Runs `input` through the zlib stream `z` a slice at a time, gathering what comes out; as soon
 * as `keep(chunk)` says no, destroys `z` (its thread-pool work stops before the next chunk) and
 * gives 'stopped'. 'error': the input is corrupt.
 */
function pump(z: zlib.Gzip | zlib.Gunzip | zlib.Deflate | zlib.Inflate | zlib.BrotliCompress | zlib.BrotliDecompress, input: Buffer, keep: (chunk: Buffer) => boolean): Promise<Buffer[] | 'stopped' | 'error'> {
  return new Promise((resolve) => {
    const out: Buffer[] = [];
    let settled = false;
    const end = (r: Buffer[] | 'stopped' | 'error') => {
      if (settled) return;
      settled = true;
      resolve(r);
    };
    z.on('data', (chunk: Buffer) => {
      if (settled) return;
      if (keep(chunk)) return void out.push(chunk);
      z.destroy();
      end('stopped');
    });
    z.on('end', () => end(out));
    z.on('error', () => end('error'));
    z.on('close', () => end('error'));
    for (let i = 0; i < input.length && !settled; i += SLICE) z.write(input.subarray(i, i + SLICE));
    z.end();
  });
}

type Decoded = Buffer | 'too_large' | 'encoding' | 'busy';

/**
 * The decoded body, or why not: more than `max` bytes (`too_large`: decoding stops there, so a zip
 * bomb costs ~`max` of work; brotli excepted, see `rewrite`), corrupt (`encoding`), or `hold`
 * full (`busy`). Asynchronous (thread pool).
 */
async function decodeAsync(raw: Buffer, coding: Exclude<BodyCoding, 'identity'>, max: number, hold: Hold | null): Promise<Decoded> {
  let n = 0;
  let why: 'too_large' | 'busy' = 'too_large';
  const z = coding === 'gzip' ? zlib.createGunzip() : coding === 'deflate' ? zlib.createInflate() : zlib.createBrotliDecompress();
  const out = await pump(z, raw, (chunk) => {
    n += chunk.length;
    if (n > max) return false;
    if (hold && !hold.take(chunk.length)) {
      why = 'busy';
      return false;
    }
    return true;
  });
  if (out === 'error') return 'encoding';
  if (out === 'stopped') return why;
  return Buffer.concat(out, n);
}

/** `body` encoded with `coding` (asynchronous: thread pool), or `busy` when `hold` is full. */
async function encodeAsync(body: Buffer, coding: Exclude<BodyCoding, 'identity'>, hold: Hold | null): Promise<Buffer | 'busy'> {
  const z =
    coding === 'gzip'
      ? zlib.createGzip({ level: 5 })
      : coding === 'deflate'
        ? zlib.createDeflate({ level: 5 })
        : zlib.createBrotliCompress({ params: { [zlib.constants.BROTLI_PARAM_QUALITY]: 4, [zlib.constants.BROTLI_PARAM_MODE]: zlib.constants.BROTLI_MODE_TEXT, [zlib.constants.BROTLI_PARAM_SIZE_HINT]: body.length } });
  const out = await pump(z, body, (chunk) => !hold || hold.take(chunk.length));
  if (out === 'stopped') return 'busy';
  if (out === 'error') throw new Error(`${coding} encoding failed`);
  return Buffer.concat(out);
}

// --- Replacing ---

/** One action's replacements with its `${…}` values, evaluated when it ran. */
interface Step {
  action: CompiledFindReplace;
  replacements: Replacements;
  values: Map<CelProgram, string>;
}

/** Evaluates every `${…}` of `a` now (throws what the CEL throws). */
function evaluateAll(act: Activation, a: CompiledFindReplace): Step {
  const values = new Map<CelProgram, string>();
  for (const p of a.replacements.programs) values.set(p, celToHeaderText(p(act)));
  return { action: a, replacements: a.replacements, values };
}

/**
 * The decoded `body` with the steps' replacements (each step whose bound the body fits, in
 * order; the others counted); null when unchanged or skipped (counted). A step whose body is
 * over its event-loop bound runs on the regex worker thread: then a Promise. Never rejects: a
 * pattern a `${…}` made invalid counts as an evaluation error through `failed`.
 */
function replaceAll(body: Buffer, steps: readonly Step[], direction: Direction, failed: (err: unknown) => void, hold: Hold | null): Buffer | null | Promise<Buffer | null> {
  if (!isUtf8(body)) return skip(direction, 'not_utf8');
  return replaceFrom(body, body, 0, steps, direction, failed, hold);
}

/** `replaceAll` from step `i` on, `out` being the body so far (`body` itself while unchanged). */
function replaceFrom(body: Buffer, out: Buffer, i: number, steps: readonly Step[], direction: Direction, failed: (err: unknown) => void, hold: Hold | null): Buffer | null | Promise<Buffer | null> {
  const changed = () => out !== body;
  /** Takes a step's result; false when the body must be left as it was. */
  const took = (r: Buffer | null): boolean => {
    if (r === null) return true;
    // The previous result is dropped (the decoded body is held to the end).
    if (changed()) hold?.give(out.length);
    if (hold && !hold.take(r.length)) {
      skip(direction, 'busy');
      return false;
    }
    out = r;
    return true;
  };
  /** A step's error: counted, and the body is left as it was (every step, or none). */
  const failedStep = (err: unknown): null => {
    if (err instanceof UrlActionRuntimeError && err.code === 'too_many_matches') return skip(direction, 'too_many_matches');
    if (err instanceof UrlActionRuntimeError && err.code === 'url_too_long') return skip(direction, 'too_large');
    failed(err);
    return null;
  };
  for (; i < steps.length; i++) {
    const st = steps[i]!;
    if (out.length > st.replacements.bodyBytes) {
      if (out.length > st.replacements.workerBytes) {
        skip(direction, 'too_large');
        continue;
      }
      const a = st.action;
      const job = rewriteOnRegexWorker(a, a.direction, a.config, a.replacements.programs.map((p) => st.values.get(p) ?? ''), out);
      if (!job) return skip(direction, 'busy');
      const next = i + 1;
      return job.then((r: RegexJobResult) => {
        if (r.kind === 'timeout') return skip(direction, 'timeout');
        if (r.kind === 'failed') return failedStep(r.code ? new UrlActionRuntimeError(r.code, r.message) : new Error(r.message));
        if (!took(r.body)) return null;
        return replaceFrom(body, out, next, steps, direction, failed, hold);
      });
    }
    let r: Buffer | null;
    try {
      r = applyFindReplace(st.replacements, out, (p) => st.values.get(p) ?? '');
    } catch (err) {
      return failedStep(err);
    }
    if (!took(r)) return null;
  }
  return changed() ? out : null;
}

/** The largest bound of `steps` (what may be decoded or held). */
const boundOf = (steps: readonly Step[]) => Math.max(...steps.map((st) => st.replacements.workerBytes));

/**
 * `raw` (encoded with `coding`) with the steps' replacements, re-encoded; null when unchanged or
 * skipped (counted). Synchronous for an identity body; a Promise (thread pool) for an encoded one.
 * `hold` (responses) counts what it holds against `FIND_REPLACE_PROCESS_LIMITS.heldBytes`.
 *
 * An encoded body is at most the bound too (encoded text is not longer than the text, but for a
 * few bytes), and is one of at most `poolJobs` jobs at once (else `busy`): decoding stops once more
 * than the bound has come out, so gzip/deflate cost ~the bound whatever the input. Brotli cannot
 * be stopped that early: its decoder fills its window (up to 16 MiB, as the stream's header asks)
 * before the first byte comes out, ~40 ms of thread-pool CPU and 16 MiB for a 14-byte body
 * (measured), so request bodies in `br` (anyone can send one) are not decoded (`encoding`);
 * responses (from the endpoint's own upstream) are, within the job limit.
 */
function rewrite(raw: Buffer, coding: BodyCoding, steps: readonly Step[], direction: Direction, failed: (err: unknown) => void, hold: Hold | null = null): Buffer | null | Promise<Buffer | null> {
  const max = boundOf(steps);
  if (raw.length > max) return skip(direction, 'too_large');
  if (coding === 'identity') return replaceAll(raw, steps, direction, failed, hold);
  if (coding === 'br' && direction === 'request') return skip(direction, 'encoding');
  if (poolJobs >= FIND_REPLACE_PROCESS_LIMITS.poolJobs) return skip(direction, 'busy');
  poolJobs++;
  return (async () => {
    try {
      const body = await decodeAsync(raw, coding, max, hold);
      if (typeof body === 'string') return skip(direction, body);
      const out = await replaceAll(body, steps, direction, failed, hold);
      if (!out) return null;
      const encoded = await encodeAsync(out, coding, hold);
      return encoded === 'busy' ? skip(direction, 'busy') : encoded;
    } finally {
      poolJobs--;
    }
  })();
}

/**
 * Whether the action may rewrite a body with head `h` (else counted) and its `${…}` values (an
 * evaluation error is reported through `failed`): null when it does nothing.
 */
function prepare(act: Activation, a: CompiledFindReplace, h: readonly string[], direction: Direction, failed: FailedFn): { step: Step; coding: BodyCoding } | null {
  const problem = typeProblem(rawHeader(h, 'content-type'));
  if (problem) return skip(direction, problem);
  const coding = codingOf(h);
  if (!coding) return skip(direction, 'encoding');
  try {
    return { step: evaluateAll(act, a), coding };
  } catch (err) {
    failed(a.where, err);
    return null;
  }
}

/** Headers a rewritten body makes false. */
const DIGESTS = new Set(['content-md5', 'content-digest', 'repr-digest']);

// --- Request ---

const originals = new WeakMap<RequestState, Buffer>();

/** The request body as the client sent it (before any request-body-find-replace), for verify-webhook. */
export function originalRequestBody(s: RequestState): Buffer | null {
  return originals.get(s) ?? s.body;
}

const REQUEST_FRAMING = new Set(['content-length', 'transfer-encoding', ...DIGESTS]);

/**
 * Runs `request-body-find-replace` on the buffered request body (inbound only). A Promise for an
 * encoded body (decoded and encoded again on the thread pool): the rules go on once it settles.
 */
export function runRequestFindReplace(act: Activation, a: CompiledFindReplace, failed: FailedFn): void | Promise<void> {
  const s = act.s;
  const raw = s.body;
  if (!raw || raw.length === 0) return;
  const ready = prepare(act, a, s.headers, 'request', failed);
  if (!ready) return;
  const out = rewrite(raw, ready.coding, [ready.step], 'request', (err) => failed(a.where, err));
  if (out instanceof Promise)
    return out.then(
      (b) => setRequestBody(act, raw, b),
      (err) => failed(a.where, err),
    );
  setRequestBody(act, raw, out);
}

function setRequestBody(act: Activation, raw: Buffer, out: Buffer | null): void {
  const s = act.s;
  if (!out) return;
  if (!originals.has(s)) originals.set(s, raw);
  s.body = out;
  const h = s.headers.slice();
  removeRawHeaders(h, REQUEST_FRAMING);
  h.push('content-length', String(out.length));
  s.headers = h;
  act.headersChanged();
}

// --- Response ---

interface Pending {
  steps: Step[];
  /** The body's coding as it reaches the rewrite (the upstream's). */
  coding: BodyCoding;
}
const pending = new WeakMap<RequestState, Pending>();
const RESPONSE_DROP = new Set(['content-length', 'accept-ranges', ...DIGESTS]);

/** Runs `response-body-find-replace` on the response head `r` (outbound only; edited in place). */
export function runResponseFindReplace(act: Activation, a: CompiledFindReplace, failed: FailedFn): void {
  const s = act.s;
  const r = act.r!;
  if (r.status < 200 || r.status === 204 || r.status === 304) return;
  const h = r.headers;
  if (r.status === 206 || rawHeader(h, 'content-range') !== undefined) return void skip('response', 'partial');
  const len = rawHeader(h, 'content-length');
  // A declared length over the bound is decided on the head (the decoded body is at least as long when not encoded).
  if (len !== undefined && Number(len) > a.replacements.workerBytes && codingOf(h) === 'identity') return void skip('response', 'too_large');
  const ready = prepare(act, a, h, 'response', failed);
  if (!ready) return;
  // HEAD: the head GET would get (RFC 9110 §9.3.2), with no body to rewrite.
  if (s.req.method === 'HEAD') return void rewrittenHead(act, h);
  const { step } = ready;
  // After a compress-response the head says gzip/br/deflate, but the body is compressed only
  // after this action's rewrite: it arrives as the upstream sent it.
  const compressing = compressionPending(s);
  const coding = compressing !== undefined && compressing === ready.coding ? 'identity' : ready.coding;
  const p = pending.get(s);
  if (p) {
    p.steps.push(step);
    return;
  }
  pending.set(s, { steps: [step], coding });
  rewrittenHead(act, h);
}

/** A head whose body is rewritten: no length (sent chunked), no ranges or digests, a weak ETag. */
function rewrittenHead(act: Activation, h: string[]): void {
  const etag = rawHeader(h, 'etag');
  removeRawHeaders(h, RESPONSE_DROP);
  if (etag && !etag.startsWith('W/')) setRawHeader(h, 'ETag', `W/${etag}`);
  act.headersChanged();
}

/**
 * Buffers a response body up to the bound, then sends it rewritten; past the bound, sends what
 * it held and the rest unchanged.
 */
class FindReplaceTransform extends Transform implements LengthDecidingTransform {
  private held: Buffer[] = [];
  private size = 0;
  private passing = false;
  /** What it holds, counted process-wide (`FIND_REPLACE_PROCESS_LIMITS.heldBytes`). */
  private readonly hold = new Hold();
  /** See {@link LengthDecidingTransform}: settled before the first byte is pushed. */
  readonly finalLength: Promise<number | null>;
  private decide!: (length: number | null) => void;

  /** `holdMs` from the start: then the body passes unchanged. */
  private readonly deadline: NodeJS.Timeout;

  constructor(
    private readonly p: Pending,
    private readonly onError: (err: unknown) => void,
  ) {
    super();
    this.max = Math.min(MAX, boundOf(p.steps));
    this.finalLength = new Promise((resolve) => (this.decide = resolve));
    this.deadline = setTimeout(() => this.passOn('slow'), FIND_REPLACE_PROCESS_LIMITS.holdMs);
    this.deadline.unref();
  }

  /** Gives up on the rewrite (counted as `reason`): what it held goes out unchanged, and so does the rest. */
  private passOn(reason: SkipReason): void {
    if (this.passing || this.flushing) return;
    skip('response', reason);
    this.passing = true;
    this.decide(null);
    this.hold.release();
    for (const c of this.held) this.push(c);
    this.held = [];
  }

  /** The body has ended: the rewrite runs, the deadline no longer applies. */
  private flushing = false;

  /** What it holds at most: the largest bound of its actions. */
  private readonly max: number;

  override _transform(chunk: Buffer, _enc: BufferEncoding, done: TransformCallback): void {
    if (this.passing) return done(null, chunk);
    this.size += chunk.length;
    const over = this.size > this.max;
    if (over || !this.hold.take(chunk.length)) {
      this.passOn(over ? 'too_large' : 'busy');
      return done(null, chunk);
    }
    this.held.push(chunk);
    done();
  }

  override _flush(done: TransformCallback): void {
    clearTimeout(this.deadline);
    if (this.passing) return done();
    this.flushing = true;
    if (this.size === 0) {
      this.decide(0);
      return done();
    }
    // The chunks, then one buffer of them: counted once (the chunks are dropped).
    const raw = Buffer.concat(this.held, this.size);
    this.held = [];
    const finish = (b: Buffer | null) => {
      this.hold.release();
      const out = b ?? raw;
      this.decide(out.length);
      done(null, out);
    };
    let out: ReturnType<typeof rewrite>;
    try {
      out = rewrite(raw, this.p.coding, this.p.steps, 'response', this.onError, this.hold);
    } catch (err) {
      this.onError(err);
      return finish(null);
    }
    if (!(out instanceof Promise)) return finish(out);
    out.then(finish, (err) => {
      this.onError(err);
      finish(null);
    });
  }

  override _destroy(err: Error | null, done: (err: Error | null) => void): void {
    clearTimeout(this.deadline);
    this.hold.release();
    this.held = [];
    this.decide(null);
    done(err);
  }
}

/**
 * The body transform for what response-body-find-replace decided on `s` (null: nothing), chained
 * before `next` (a compress-response compressor) when there is one; `r` is the final head. The
 * route's `compression` module transforms the body before the policy does (the stages' transforms
 * run nearest the upstream first) and only a body the upstream did not encode: when it did, the
 * final head names its coding and the body arrives so encoded, to be decoded, rewritten and
 * encoded again. The result leaves in the coding it arrived in.
 */
export function findReplaceTransform(s: RequestState, r: ResponseState, next: Transform | null, onError: (err: unknown) => void): Transform | null {
  const p = pending.get(s);
  if (!p) return next;
  pending.delete(s);
  let coding = p.coding;
  if (!next && coding === 'identity') {
    const final = codingOf(r.headers);
    if (!final) return null;
    coding = final;
  }
  const t = new FindReplaceTransform({ steps: p.steps, coding }, onError);
  // A Duplex that writes into the rewrite and reads from the compressor: replace, then compress.
  return next ? (compose(t, next) as unknown as Transform) : t;
}

/** `stream.compose` (Node ≥ 16.9; not in this @types/node). */
function compose(first: Duplex, second: Duplex): Duplex {
  return (stream as unknown as { compose(...s: Duplex[]): Duplex }).compose(first, second);
}
