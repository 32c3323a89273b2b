import type { Transform } from 'node:stream';
import type { CompressResponseAction, VerifyWebhookAction } from '@warren/shared';
import { errorAnswer } from '../http/error-page.js';
import { addVary, claimCompression, compressibleResponse, contentEncoded, createCompressor, encodeHead, negotiateEncoding, type Coding } from '../modules/compression.js';
import { createWebhookChecks, type WebhookCheck, type WebhookCheckResult, type WebhookVerificationOptions } from '../modules/webhook-verification.js';
import type { Outcome, RequestState, ResponseState } from '../pipeline/types.js';
import { actionsOf } from './activation.js';
import { originalRequestBody } from './find-replace.js';

/**
 * The traffic-policy body actions at run time (validated by
 * `services/shared/src/traffic-policy/body-actions.ts`), compiled once per config version. Both
 * reuse a route module: what differs is only when they run and what they record.
 *
 * `verify-webhook` (https://ngrok.com/docs/traffic-policy/actions/verify-webhook/) runs the
 * provider check of the `webhook_verification` module (`createWebhookChecks`: the same function
 * per provider, with its timestamp tolerance and SNS certificate cache). It needs the whole
 * request body, so a policy with this action makes the traffic-policy stage declare `needsBody`:
 * every request of the route is then buffered (up to 1 MiB; a larger one is refused with 413
 * `ERR_WARREN_7009` before any rule runs), while policies without it pay nothing. The check reads
 * the request as the provider sent it: its original headers, URL and body (an earlier add-headers
 * or url-rewrite does not change what is verified). Not verified: 403 `ERR_WARREN_7125` naming the
 * reason, and no later rule or action runs; `enforce: false` only records
 * `actions.ngrok.verify_webhook.{verified, error.code, error.message}` (code
 * `verification_failed`). Unsigned handshakes the module answers itself (Dropbox's `?challenge=`,
 * Meta's `hub.mode=subscribe`, X's CRC, Mandrill's HEAD) are answered by the action too, whatever
 * `enforce` says (ngrok: the action "handles endpoint verification challenges"): the answer ends
 * the request there, so nothing unsigned reaches the upstream; `verified` stays false.
 *
 * `compress-response` (https://ngrok.com/docs/traffic-policy/actions/compress-response/) decides
 * when it runs, on the response head, with the `compression` module's rules (negotiation by
 * q-value, compressible media types, `MIN_LENGTH`, no-transform, 204/206/304, ranges; a HEAD gets
 * the GET's head and no compressor) and
 * the action's `algorithms`: it sets `Content-Encoding`, drops `Content-Length` and
 * `Accept-Ranges`, weakens a strong `ETag` and adds `Vary: Accept-Encoding` right away, so later
 * outbound rules see the head as the client will, and records
 * `actions.ngrok.compress.{already_compressed, negotiated_algorithm}`. The body is compressed as
 * it streams, by the stage's `transformBody` (declared only by policies with this action), and
 * only when the final head still carries exactly the `Content-Encoding` the action set. Never
 * twice: not when the upstream already encoded the body (`already_compressed`), not after an
 * earlier compress-response, and not when the route's `compression` module compressed it (the
 * module sees the action's `Content-Encoding` and leaves the response alone; `claimCompression`
 * settles the rest).
 */

export interface CompiledVerifyWebhook {
  kind: 'verify-webhook';
  provider: string;
  enforce: boolean;
  check: WebhookCheck;
}

export interface CompiledCompressResponse {
  kind: 'compress-response';
  algorithms: readonly Coding[];
}

type WebhookChecks = ReturnType<typeof createWebhookChecks>;
/** One builder for every policy: one clock, one SNS certificate cache. */
let sharedChecks: WebhookChecks | null = null;

/** A builder with its own options (tests: a fixed clock, a local SNS certificate fetcher). */
export function webhookChecks(opts: WebhookVerificationOptions): WebhookChecks {
  return createWebhookChecks(opts, 'verify-webhook');
}

/** Throws when the provider cannot be verified here or its secret is unusable (validated when saved). */
export function compileVerifyWebhook(c: VerifyWebhookAction['config'], checks: WebhookChecks = (sharedChecks ??= webhookChecks({}))): CompiledVerifyWebhook {
  return { kind: 'verify-webhook', provider: c.provider, enforce: c.enforce, check: checks(c.provider, c.secret) };
}

export function compileCompressResponse(c: CompressResponseAction['config']): CompiledCompressResponse {
  return { kind: 'compress-response', algorithms: c.algorithms };
}

const NO_BODY = Buffer.alloc(0);

function afterCheck(a: CompiledVerifyWebhook, s: RequestState, result: WebhookCheckResult): Outcome {
  const vars = actionsOf(s).ngrok.verify_webhook;
  if (result === null) {
    vars.record(true);
    return null;
  }
  if (typeof result === 'object') {
    vars.record(false);
    return result.answer;
  }
  vars.record(false, 'verification_failed', result);
  return a.enforce ? errorAnswer(s.req.headers.accept, 7125, `webhook verification failed (${a.provider}): ${result}`) : null;
}

/**
 * Runs `verify-webhook`: null to go on, or the 403 (or a handshake's answer). Synchronous but for
 * SNS (a certificate may have to be fetched).
 */
export function runVerifyWebhook(a: CompiledVerifyWebhook, s: RequestState): Outcome | Promise<Outcome> {
  // The body as the client sent it, even after a request-body-find-replace.
  const result = a.check(s, originalRequestBody(s) ?? NO_BODY);
  return result instanceof Promise ? result.then((r) => afterCheck(a, s, r)) : afterCheck(a, s, result);
}

/** What a compress-response decided for a response, applied by `compressTransform`. */
interface Pending {
  coding: Coding;
  contentLength: number | undefined;
  text: boolean;
}
const pending = new WeakMap<RequestState, Pending>();

/** Runs `compress-response` on the response head `r` (edited in place). */
export function runCompressResponse(a: CompiledCompressResponse, s: RequestState, r: ResponseState): void {
  const vars = actionsOf(s).ngrok.compress;
  vars.already_compressed = contentEncoded(r.headers);
  vars.negotiated_algorithm = '';
  if (vars.already_compressed || !compressibleResponse(r)) return;
  addVary(r.headers);
  const ae = s.req.headers['accept-encoding'];
  const coding = negotiateEncoding(Array.isArray(ae) ? ae.join(',') : ae, a.algorithms);
  if (!coding) return;
  pending.set(s, { coding, ...encodeHead(r.headers, coding) });
  vars.negotiated_algorithm = coding;
}

/** The coding an earlier compress-response set on `s`'s head, its body not compressed yet (find-replace then sees it plain). */
export function compressionPending(s: RequestState): Coding | undefined {
  return pending.get(s)?.coding;
}

/** The stage's `transformBody`: the compressor a compress-response decided on, or null. */
export function compressTransform(s: RequestState, r: ResponseState): Transform | null {
  const p = pending.get(s);
  if (!p) return null;
  pending.delete(s);
  // A later rule may have removed or replaced the Content-Encoding the action set.
  let codings = 0;
  let ours = false;
  for (let i = 0; i + 1 < r.headers.length; i += 2) {
    if (r.headers[i]!.toLowerCase() !== 'content-encoding') continue;
    codings++;
    ours = r.headers[i + 1]!.trim().toLowerCase() === p.coding;
  }
  if (codings !== 1 || !ours || !claimCompression(s)) return null;
  // HEAD: its head is the GET's (`runCompressResponse`), and it has no body to compress.
  if (s.req.method === 'HEAD') return null;
  return createCompressor(p.coding, p.contentLength, p.text);
}

/** True when some rule of `rules` has an action of `kind` (the stage then declares `needsBody` / `transformBody`). */
export function hasActionKind(rules: readonly { actions: readonly { kind: string }[] }[], kind: string): boolean {
  return rules.some((r) => r.actions.some((a) => a.kind === kind));
}
