import { isUtf8 } from 'node:buffer';
import { createHash, createHmac, createPublicKey, timingSafeEqual, verify, type KeyObject } from 'node:crypto';
import { escape as qsEscape } from 'node:querystring';
import { gunzipSync } from 'node:zlib';
import { MAX_BUFFERED_BODY } from '../pipeline/runner.js';
import type { Outcome, RequestState, RouteStage, StageFactory } from '../pipeline/types.js';
import { enabledModule, moduleError } from './common.js';
import { SnsCertificateCache, verifySnsMessage, type CertificateFetcher } from './webhook-sns.js';

/**
 * `webhook_verification`: `provider` + `secret`. The whole body is buffered (`needsBody`) and
 * the request's signature checked the way that provider signs; a missing or bad signature, or a
 * signed timestamp more than 5 minutes off (10 for Box, as Box documents), answers 403 (7102)
 * naming the reason. Each provider's scheme (headers, signed bytes, algorithm, encoding) is
 * described, with its source, beside its verifier below.
 *
 * Some providers probe the endpoint with an unsigned request before they send signed events
 * (Dropbox's `?challenge=`, Meta's `hub.mode=subscribe`, X/Twitter's `crc_token`, Mandrill's
 * HEAD). The ingress answers those itself (echoing the challenge, or computing the CRC response
 * token with the secret) so that no unsigned request reaches the upstream; events are checked.
 *
 * Providers this ingress cannot verify refuse the config (the factory throws) rather than pass
 * traffic unverified.
 */

/** Signed timestamps may be this far from the ingress's clock, either way. */
export const TIMESTAMP_TOLERANCE_MS = 5 * 60_000;

interface VerifyContext {
  s: RequestState;
  body: Buffer;
  secret: string;
  nowMs: number;
  header(name: string): string | undefined;
}

/** The ingress answers a provider's unsigned handshake itself (nothing is forwarded). */
export interface Answer {
  answer: NonNullable<Outcome>;
}

/** null when verified, else the reason (or a handshake answer). */
type Verifier = (c: VerifyContext) => string | null | Answer | Promise<string | null | Answer>;

const hmac = (alg: string, key: string | Buffer, ...parts: Array<string | Buffer>): Buffer => {
  const h = createHmac(alg, key);
  for (const p of parts) h.update(p);
  return h.digest();
};

/** Constant-time comparison of a computed MAC with a received one. */
export function safeEqual(a: Buffer, b: Buffer): boolean {
  return a.length === b.length && timingSafeEqual(a, b);
}

const HEX_RE = /^[0-9a-fA-F]+$/;
const B64_RE = /^[A-Za-z0-9+/_-]+={0,2}$/;

function decode(value: string, encoding: 'hex' | 'base64'): Buffer | null {
  const v = value.trim();
  if (encoding === 'hex') return HEX_RE.test(v) && v.length % 2 === 0 ? Buffer.from(v, 'hex') : null;
  return B64_RE.test(v) ? Buffer.from(v, 'base64') : null;
}

function matches(expected: Buffer, given: string, encoding: 'hex' | 'base64'): boolean {
  const g = decode(given, encoding);
  return g !== null && safeEqual(expected, g);
}

/**
 * Unix-seconds timestamp within tolerance: null, or the reason. Whole seconds on both sides, as
 * the providers' SDKs compare (`floor(now) - t`: stripe-node, svix, Slack's): the signer floored
 * its clock, so comparing with milliseconds would age a message by up to a second more.
 */
function checkUnixSeconds(ts: string | undefined, nowMs: number, toleranceMs = TIMESTAMP_TOLERANCE_MS): string | null {
  if (!ts || !/^\d{1,12}$/.test(ts)) return 'missing or malformed timestamp';
  return checkMs(Number(ts) * 1000, Math.floor(nowMs / 1000) * 1000, toleranceMs);
}

/** A timestamp (ms since the epoch) within tolerance: null, or the reason. */
function checkMs(atMs: number, nowMs: number, toleranceMs = TIMESTAMP_TOLERANCE_MS): string | null {
  if (Number.isNaN(atMs)) return 'missing or malformed timestamp';
  return Math.abs(nowMs - atMs) > toleranceMs ? `the timestamp is more than ${toleranceMs / 60_000} minutes off` : null;
}

/** Signature of the body alone, in `header`, optionally after a `prefix` such as `sha256=`. */
function bodyHmac(header: string, alg: string, encoding: 'hex' | 'base64', prefix = ''): Verifier {
  return (c) => {
    const sig = c.header(header);
    if (!sig) return `missing ${header} header`;
    if (prefix && !sig.startsWith(prefix)) return `${header} must start with ${prefix}`;
    return matches(hmac(alg, c.secret, c.body), sig.slice(prefix.length), encoding) ? null : `${header} does not match`;
  };
}

/** The `key=value` pairs of a comma-separated header value, by key (repeated keys kept in order). */
function commaPairs(value: string): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const part of value.split(',')) {
    const eq = part.indexOf('=');
    if (eq < 0) continue;
    const k = part.slice(0, eq).trim();
    const list = out.get(k) ?? [];
    list.push(part.slice(eq + 1).trim());
    out.set(k, list);
  }
  return out;
}

/**
 * `<tsKey>=<unix>,<sigKey>=<hex>[,<sigKey>=…]`, hex HMAC-SHA256 over `<ts>.<body>`: Stripe, Mux,
 * Calendly and Go1 (`t=`/`v1=`), TikTok and HostedHooks (`t=`/`s=`), Buildkite (`timestamp=`/`signature=`).
 */
function timestampedHmac(header: string, tsKey = 't', sigKey = 'v1'): Verifier {
  return (c) => {
    const sig = c.header(header);
    if (!sig) return `missing ${header} header`;
    const pairs = commaPairs(sig);
    const t = pairs.get(tsKey)?.[0];
    const sigs = pairs.get(sigKey) ?? [];
    if (!t || sigs.length === 0) return `${header} lacks ${tsKey}= or ${sigKey}=`;
    const stale = checkUnixSeconds(t, c.nowMs);
    if (stale) return stale;
    const expected = hmac('sha256', c.secret, t, '.', c.body);
    return sigs.some((v) => matches(expected, v, 'hex')) ? null : `${header} does not match`;
  };
}

/** `<version>=<hex>[,<version>=<hex>]` over the body, any one matching (PagerDuty v3 and CircleCI, `v1=`). */
function versionedBodyHmac(header: string, version: string): Verifier {
  return (c) => {
    const sig = c.header(header);
    if (!sig) return `missing ${header} header`;
    const expected = hmac('sha256', c.secret, c.body);
    return (commaPairs(sig).get(version) ?? []).some((v) => matches(expected, v, 'hex')) ? null : `${header} does not match`;
  };
}

/** `v0=<hex>` over `v0:<timestamp>:<body>` (Slack, Zoom, Frame.io). */
function v0(sigHeader: string, tsHeader: string): Verifier {
  return (c) => {
    const sig = c.header(sigHeader);
    if (!sig) return `missing ${sigHeader} header`;
    const ts = c.header(tsHeader);
    const stale = checkUnixSeconds(ts, c.nowMs);
    if (stale) return `${tsHeader}: ${stale}`;
    if (!sig.startsWith('v0=')) return `${sigHeader} must start with v0=`;
    return matches(hmac('sha256', c.secret, `v0:${ts}:`, c.body), sig.slice(3), 'hex') ? null : `${sigHeader} does not match`;
  };
}

/** The secret itself sent in `header` (compared by digest, constant time): GitLab, Buildkite's token mode. */
function tokenHeader(header: string): Verifier {
  return (c) => {
    const token = c.header(header);
    if (token === undefined) return `missing ${header} header`;
    const d = (v: string) => createHash('sha256').update(v).digest();
    return safeEqual(d(token), d(c.secret)) ? null : `${header} does not match`;
  };
}

/** The request target (path and query) as the client sent it. */
function requestTarget(s: RequestState): string {
  const target = s.req.url ?? '/';
  if (target.startsWith('/')) return target;
  try {
    const u = new URL(target);
    return u.pathname + u.search;
  } catch {
    return '/';
  }
}

/** The public URL of the request as the provider called it, and the variant with the port toggled. */
function requestUrls(s: RequestState): string[] {
  const host = s.req.headers.host ?? s.host;
  const path = requestTarget(s);
  const defaultPort = s.scheme === 'https' ? '443' : '80';
  const m = /^(.*?)(?::(\d+))?$/.exec(host)!;
  const bare = m[1]!;
  const other = m[2] ? bare : `${bare}:${defaultPort}`;
  return [`${s.scheme}://${host}${path}`, `${s.scheme}://${other}${path}`];
}

/** The request's query parameters. */
function queryParams(s: RequestState): URLSearchParams {
  const target = requestTarget(s);
  const q = target.indexOf('?');
  return new URLSearchParams(q < 0 ? '' : target.slice(q + 1));
}

/** Twilio and Mandrill sign the URL and the form fields: any other body would go on unsigned. */
const UNSIGNED_BODY = 'the body is not form-encoded (and the URL carries no bodySHA256), so the signature does not cover it';

const isForm = (c: VerifyContext) => (c.s.req.headers['content-type'] ?? '').toLowerCase().startsWith('application/x-www-form-urlencoded');

/**
 * Most fields of a form body the providers that sign sorted fields (Twilio, Mandrill, Plivo)
 * have sorted: their callbacks carry tens (Mandrill one, `mandrill_events`). Parsing and sorting
 * a 1 MiB body of ~120,000 fields took 230-320 ms (Twilio, once per URL variant) before any
 * signature was compared, for any unauthenticated client; verify-webhook is priced at 1 ms.
 * Mailgun, whose form posts are parsed for the signed fields, is held to the same bound.
 */
export const MAX_SORTED_FORM_FIELDS = 1_000;

/** Why a form body has too many fields to be sorted for a signature, or null (counted before parsing). */
function tooManyFormFields(body: Buffer): string | null {
  let n = 1;
  for (let i = body.indexOf(0x26); i >= 0; i = body.indexOf(0x26, i + 1)) {
    if (++n > MAX_SORTED_FORM_FIELDS) return `the form body has more than ${MAX_SORTED_FORM_FIELDS} fields, more than this provider sends`;
  }
  return null;
}

/** `c` (a byte) as a hex digit's value, or -1. */
function hexDigit(c: number): number {
  if (c >= 0x30 && c <= 0x39) return c - 0x30;
  const l = c | 0x20;
  return l >= 0x61 && l <= 0x66 ? l - 0x57 : -1;
}

/**
 * `body[start, end)` (a form field's name or value, as sent) decoded as the URL Standard's
 * urlencoded parser decodes it: `+` as a space, `%XX` as that byte (a `%` without two hex digits
 * after it kept), the bytes then read as UTF-8 (U+FFFD for invalid sequences). Bytes sent raw that
 * are not UTF-8 are U+FFFD (EF BF BD) before percent-decoding, as when the body was read as text
 * first: `\xC3` then `%A9` is two U+FFFD, not `é`.
 */
function formBytesDecode(body: Buffer, start: number, end: number): string {
  const raw = body.subarray(start, end);
  if (raw.indexOf(0x2b /* + */) < 0 && raw.indexOf(0x25 /* % */) < 0) return raw.toString('utf8');
  const src = isUtf8(raw) ? raw : Buffer.from(raw.toString('utf8'), 'utf8');
  const out = Buffer.allocUnsafe(src.length);
  let n = 0;
  for (let i = 0; i < src.length; i++) {
    const c = src[i]!;
    if (c === 0x2b) {
      out[n++] = 0x20;
    } else if (c === 0x25 && i + 2 < src.length) {
      const hi = hexDigit(src[i + 1]!);
      const lo = hi < 0 ? -1 : hexDigit(src[i + 2]!);
      if (lo < 0) {
        out[n++] = c;
      } else {
        out[n++] = (hi << 4) | lo;
        i += 2;
      }
    } else {
      out[n++] = c;
    }
  }
  return out.toString('utf8', 0, n);
}

/**
 * A form body's fields as `[name, value]`, in order, as `[...new URLSearchParams(body.toString('utf8'))]`
 * reads them (the URL Standard's application/x-www-form-urlencoded parsing: a leading `?` dropped
 * as that constructor drops it, fields split on `&`, empty ones skipped, the name ending at the
 * first `=`), but decoded from the bytes field by field: URLSearchParams took ~100 ms for one
 * 1 MiB field of `+`, this a few ms, linear in the body's length whatever its fields. One
 * difference, where Node 20's URLSearchParams departs from the standard: a name or value whose
 * percent-escapes are not UTF-8 and that also holds non-ASCII text (`%E9é`) was decoded by
 * querystring's fallback, which keeps the low byte of each non-ASCII character (two U+FFFD);
 * here it is the standard's `\uFFFDé` (a provider's percent-encoded UTF-8 is never such a field).
 */
export function parseForm(body: Buffer): Array<[string, string]> {
  const fields: Array<[string, string]> = [];
  for (let start = body[0] === 0x3f /* ? */ ? 1 : 0; start < body.length; ) {
    let end = body.indexOf(0x26 /* & */, start);
    if (end < 0) end = body.length;
    if (end > start) {
      const eq = body.subarray(start, end).indexOf(0x3d /* = */);
      const nameEnd = eq < 0 ? end : start + eq;
      fields.push([formBytesDecode(body, start, nameEnd), nameEnd < end ? formBytesDecode(body, nameEnd + 1, end) : '']);
    }
    start = end + 1;
  }
  return fields;
}

/** Form fields sorted by name, each name followed by its values (sorted), no separators (Twilio, Mandrill). */
function sortedFormFields(body: Buffer): string {
  const params = new Map<string, Set<string>>();
  for (const [k, v] of parseForm(body)) {
    let set = params.get(k);
    if (!set) params.set(k, (set = new Set()));
    set.add(v);
  }
  let data = '';
  for (const k of [...params.keys()].sort()) for (const v of [...params.get(k)!].sort()) data += k + v;
  return data;
}

/** Twilio: base64 HMAC-SHA1 over the URL plus sorted form params, or over a URL carrying `bodySHA256`. */
const twilio: Verifier = (c) => {
  const sig = c.header('x-twilio-signature');
  if (!sig) return 'missing X-Twilio-Signature header';
  let fields: string | undefined;
  for (const url of requestUrls(c.s)) {
    let data = url;
    const bodySha = new URL(url).searchParams.get('bodySHA256');
    if (bodySha !== null) {
      const actual = createHash('sha256').update(c.body).digest('hex');
      if (!safeEqual(Buffer.from(actual), Buffer.from(bodySha.toLowerCase()))) return 'bodySHA256 does not match the body';
    } else if (c.body.length > 0) {
      // Without bodySHA256 Twilio signs the URL and the form fields, nothing else: another body
      // would reach the upstream unsigned (twilio-node's validateIncomingRequest signs the parsed
      // body, so a JSON body fails there too).
      if (!isForm(c)) return UNSIGNED_BODY;
      if (fields === undefined) {
        const tooMany = tooManyFormFields(c.body);
        if (tooMany) return tooMany;
        fields = sortedFormFields(c.body);
      }
      data += fields;
    }
    if (matches(hmac('sha1', c.secret, data), sig, 'base64')) return null;
  }
  return 'X-Twilio-Signature does not match';
};

/**
 * Mailchimp Transactional (Mandrill): `X-Mandrill-Signature`, base64 HMAC-SHA1 with the webhook
 * key over the webhook URL followed by each POST field's name and value, sorted by name
 * (mailchimp.com/developer/transactional/guides/track-respond-activity-webhooks, "Authenticating
 * webhook requests"). Mandrill checks a new webhook URL with a HEAD request, answered here.
 */
const mandrill: Verifier = (c) => {
  if (c.s.req.method === 'HEAD') return { answer: { status: 200, headers: { 'content-type': 'text/plain; charset=utf-8' }, body: '' } };
  const sig = c.header('x-mandrill-signature');
  if (!sig) return 'missing X-Mandrill-Signature header';
  if (c.body.length > 0 && !isForm(c)) return UNSIGNED_BODY;
  const tooMany = isForm(c) ? tooManyFormFields(c.body) : null;
  if (tooMany) return tooMany;
  const fields = isForm(c) ? sortedFormFields(c.body) : '';
  return requestUrls(c.s).some((url) => matches(hmac('sha1', c.secret, url, fields), sig, 'base64')) ? null : 'X-Mandrill-Signature does not match';
};

/** Square: base64 HMAC-SHA256 over the notification URL followed by the body. */
const square: Verifier = (c) => {
  const sig = c.header('x-square-hmacsha256-signature');
  if (!sig) return 'missing X-Square-HmacSha256-Signature header';
  return requestUrls(c.s).some((url) => matches(hmac('sha256', c.secret, url, c.body), sig, 'base64')) ? null : 'X-Square-HmacSha256-Signature does not match';
};

/** Zendesk: base64 HMAC-SHA256 over the (ISO 8601) timestamp followed by the body. */
const zendesk: Verifier = (c) => {
  const sig = c.header('x-zendesk-webhook-signature');
  if (!sig) return 'missing X-Zendesk-Webhook-Signature header';
  const ts = c.header('x-zendesk-webhook-signature-timestamp');
  const at = ts ? Date.parse(ts) : NaN;
  if (!ts || Number.isNaN(at)) return 'missing or malformed X-Zendesk-Webhook-Signature-Timestamp';
  const stale = checkMs(at, c.nowMs);
  if (stale) return stale;
  return matches(hmac('sha256', c.secret, ts, c.body), sig, 'base64') ? null : 'X-Zendesk-Webhook-Signature does not match';
};

/**
 * Svix and Standard Webhooks (`svix-*` or `webhook-*` headers): `v1,<base64>` signatures,
 * space-separated, HMAC-SHA256 with the base64 key after `whsec_` over `<id>.<timestamp>.<body>`.
 * Clerk signs through Svix; Brex follows Standard Webhooks (`webhook-*`, its secret is the
 * base64 key, with or without `whsec_`: developer.brex.com "Webhooks", verifying signatures).
 */
function svix(secret: string): Verifier {
  const key = Buffer.from(secret.startsWith('whsec_') ? secret.slice(6) : secret, 'base64');
  if (key.length === 0) throw new Error('webhook_verification: the svix secret must be whsec_<base64>');
  return (c) => {
    const prefix = c.header('svix-id') !== undefined ? 'svix' : 'webhook';
    const id = c.header(`${prefix}-id`);
    const ts = c.header(`${prefix}-timestamp`);
    const sigs = c.header(`${prefix}-signature`);
    if (!id || !sigs) return `missing ${prefix}-id or ${prefix}-signature header`;
    const stale = checkUnixSeconds(ts, c.nowMs);
    if (stale) return `${prefix}-timestamp: ${stale}`;
    const expected = hmac('sha256', key, `${id}.${ts}.`, c.body);
    const ok = sigs.split(' ').some((p) => p.startsWith('v1,') && matches(expected, p.slice(3), 'base64'));
    return ok ? null : `${prefix}-signature does not match`;
  };
}

/** SendGrid Event Webhook: ECDSA P-256 / SHA-256 signature (base64 DER) over `<timestamp><body>`. */
function sendgrid(secret: string): Verifier {
  let key: KeyObject;
  try {
    key = secret.includes('BEGIN')
      ? createPublicKey(secret)
      : createPublicKey({ key: Buffer.from(secret.replace(/\s+/g, ''), 'base64'), format: 'der', type: 'spki' });
  } catch {
    throw new Error('webhook_verification: the sendgrid secret must be the base64 ECDSA public verification key');
  }
  if (key.asymmetricKeyType !== 'ec') throw new Error('webhook_verification: the sendgrid secret must be an ECDSA public key');
  return (c) => {
    const sig = c.header('x-twilio-email-event-webhook-signature');
    const ts = c.header('x-twilio-email-event-webhook-timestamp');
    if (!sig) return 'missing X-Twilio-Email-Event-Webhook-Signature header';
    const stale = checkUnixSeconds(ts, c.nowMs);
    if (stale) return `X-Twilio-Email-Event-Webhook-Timestamp: ${stale}`;
    const raw = decode(sig, 'base64');
    if (!raw) return 'X-Twilio-Email-Event-Webhook-Signature is not base64';
    const ok = verify('sha256', Buffer.concat([Buffer.from(ts!), c.body]), { key, dsaEncoding: 'der' }, raw);
    return ok ? null : 'X-Twilio-Email-Event-Webhook-Signature does not match';
  };
}

/** An in-ingress answer to a provider's unsigned handshake (plain text, never sniffed as HTML). */
const textAnswer = (body: string): Answer => ({
  answer: { status: 200, headers: { 'content-type': 'text/plain; charset=utf-8', 'x-content-type-options': 'nosniff' }, body },
});

/** A GET without a body: the shape of every handshake below (events are POSTs). */
const isBodilessGet = (c: VerifyContext) => c.s.req.method === 'GET' && c.body.length === 0;

/**
 * Meta (Facebook Graph API, Messenger, Instagram, WhatsApp): `X-Hub-Signature-256: sha256=<hex>`,
 * HMAC-SHA256 of the body with the app secret (developers.facebook.com/docs/graph-api/webhooks
 * /getting-started, "Validate payloads"). The subscription check is a GET with
 * `hub.mode=subscribe&hub.challenge=…&hub.verify_token=…`, answered here by echoing the challenge:
 * a URL subscribed by another app still only passes events signed with this app's secret.
 */
function meta(): Verifier {
  const events = bodyHmac('x-hub-signature-256', 'sha256', 'hex', 'sha256=');
  return (c) => {
    if (isBodilessGet(c)) {
      const q = queryParams(c.s);
      const challenge = q.get('hub.challenge');
      if (q.get('hub.mode') === 'subscribe' && challenge) return textAnswer(challenge);
    }
    return events(c);
  };
}

/**
 * Dropbox: `X-Dropbox-Signature`, hex HMAC-SHA256 of the body with the app secret; a new webhook
 * URI is verified by a GET `?challenge=…` that must be echoed (www.dropbox.com/developers/reference
 * /webhooks), answered here.
 */
function dropbox(): Verifier {
  const events = bodyHmac('x-dropbox-signature', 'sha256', 'hex');
  return (c) => {
    const challenge = isBodilessGet(c) ? queryParams(c.s).get('challenge') : null;
    return challenge ? textAnswer(challenge) : events(c);
  };
}

/** X's CRC tokens (random, base64-like); only these are answered. */
const CRC_TOKEN_RE = /^[A-Za-z0-9+/=_-]{1,512}$/;

/**
 * X (Twitter) Account Activity: `X-Twitter-Webhooks-Signature: sha256=<base64>`, HMAC-SHA256 of the
 * body with the consumer secret. The CRC check, a GET `?crc_token=…`, is answered here with
 * `{"response_token":"sha256=<base64 HMAC-SHA256(consumer secret, crc_token)>"}`
 * (developer.x.com, Account Activity API "Securing webhooks").
 */
function twitter(): Verifier {
  const events = bodyHmac('x-twitter-webhooks-signature', 'sha256', 'base64', 'sha256=');
  return (c) => {
    const crc = isBodilessGet(c) ? queryParams(c.s).get('crc_token') : null;
    if (!crc || !CRC_TOKEN_RE.test(crc)) {
      // The CRC answer is the HMAC of a caller-chosen token with the key events are signed with:
      // a body spelled only in the token alphabet (never an X event, which is JSON) could carry
      // such an answer as its signature, so it is refused.
      if (CRC_TOKEN_RE.test(c.body.toString('latin1'))) return 'the body is not an X event';
      return events(c);
    }
    const token = `sha256=${hmac('sha256', c.secret, crc).toString('base64')}`;
    return { answer: { status: 200, headers: { 'content-type': 'application/json; charset=utf-8' }, body: JSON.stringify({ response_token: token }) } };
  };
}

/**
 * Buildkite: `X-Buildkite-Signature: timestamp=<unix>,signature=<hex>`, HMAC-SHA256 with the
 * webhook token over `<timestamp>.<body>`; or, when the webhook is set to send the token in clear,
 * `X-Buildkite-Token` equal to it (buildkite.com/docs/apis/webhooks, "Webhook signature").
 */
function buildkite(): Verifier {
  const signed = timestampedHmac('x-buildkite-signature', 'timestamp', 'signature');
  const token = tokenHeader('x-buildkite-token');
  return (c) => (c.header('x-buildkite-signature') === undefined && c.header('x-buildkite-token') !== undefined ? token(c) : signed(c));
}

/**
 * Most bytes Airship's check inflates a gzip body to: the bound the route buffers request bodies to
 * (`MAX_BUFFERED_BODY`, 1 MiB). Inflation is synchronous and comes before any signature is known
 * to be right: up to 16 MiB, a 16 KiB upload cost the event loop 22-46 ms; at 1 MiB it stops
 * within about 2 ms.
 */
export const MAX_INFLATED_BODY = MAX_BUFFERED_BODY;

/**
 * Airship (Open Channels webhooks, "Signature Hash"): `X-UA-Signature`, hex HMAC-SHA256 with the
 * secret over `<X-UA-Timestamp>:<body JSON>` (unix seconds); Airship may gzip the body, the
 * signature is over the JSON (support.airship.com, "Implementing a Signature Hash and Validating
 * an Open Channel Webhook"). A gzip body is inflated only when the signature is well-formed and
 * does not match the bytes as sent, and to at most `MAX_INFLATED_BODY` bytes: one that inflates
 * to more is refused like any other unverified request (403, a reason), since what was signed
 * cannot be checked within the bound. Not the body reader's 413: the body as sent was within
 * the bound, and a reason (unlike an answer) leaves `verify-webhook` with `enforce: false` to
 * record the failure and go on, as for any other.
 */
const airship: Verifier = (c) => {
  const sig = c.header('x-ua-signature');
  if (!sig) return 'missing X-UA-Signature header';
  const ts = c.header('x-ua-timestamp');
  const stale = checkUnixSeconds(ts, c.nowMs);
  if (stale) return `X-UA-Timestamp: ${stale}`;
  const given = decode(sig, 'hex');
  const signs = (b: Buffer) => given !== null && safeEqual(hmac('sha256', c.secret, `${ts}:`, b), given);
  if (signs(c.body)) return null;
  if (given !== null && given.length === 32 && (c.header('content-encoding') ?? '').trim().toLowerCase() === 'gzip') {
    let inflated: Buffer;
    try {
      inflated = gunzipSync(c.body, { maxOutputLength: MAX_INFLATED_BODY });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ERR_BUFFER_TOO_LARGE') return `the gzip body inflates to more than ${MAX_INFLATED_BODY} bytes`;
      return 'the gzip body could not be decoded';
    }
    if (signs(inflated)) return null;
  }
  return 'X-UA-Signature does not match';
};

/** Box allows a delivery timestamp up to 10 minutes old (developer.box.com/guides/webhooks/v2/signatures-v2). */
const BOX_TOLERANCE_MS = 10 * 60_000;

/**
 * Box: `BOX-SIGNATURE-PRIMARY` / `BOX-SIGNATURE-SECONDARY` (one per signature key, for rotation),
 * base64 HMAC-SHA256 over the body followed by `BOX-DELIVERY-TIMESTAMP` (RFC 3339), no older than
 * 10 minutes; `BOX-SIGNATURE-VERSION` 1, `BOX-SIGNATURE-ALGORITHM` HmacSHA256
 * (developer.box.com/guides/webhooks/v2/signatures-v2). The secret is either key.
 */
const box: Verifier = (c) => {
  const sigs = [c.header('box-signature-primary'), c.header('box-signature-secondary')].filter((v): v is string => !!v);
  if (sigs.length === 0) return 'missing BOX-SIGNATURE-PRIMARY header';
  const version = c.header('box-signature-version');
  if (version !== undefined && version.trim() !== '1') return 'unsupported BOX-SIGNATURE-VERSION';
  const alg = c.header('box-signature-algorithm');
  if (alg !== undefined && alg.trim() !== 'HmacSHA256') return 'unsupported BOX-SIGNATURE-ALGORITHM';
  const ts = c.header('box-delivery-timestamp');
  const stale = checkMs(ts ? Date.parse(ts) : NaN, c.nowMs, BOX_TOLERANCE_MS);
  if (stale) return `BOX-DELIVERY-TIMESTAMP: ${stale}`;
  const expected = hmac('sha256', c.secret, c.body, ts!);
  return sigs.some((s) => matches(expected, s, 'base64')) ? null : 'BOX-SIGNATURE-PRIMARY does not match';
};

/**
 * DocuSign Connect: one `X-DocuSign-Signature-<n>` header per HMAC key configured (up to 100),
 * each the base64 HMAC-SHA256 of the body (developers.docusign.com, Connect "HMAC security";
 * docusign.com/blog/developers/manually-authenticating-hmac-signatures-docusign-connect-webhook-configurations).
 */
const docusign: Verifier = (c) => {
  const expected = hmac('sha256', c.secret, c.body);
  let seen = false;
  for (let n = 1; n <= 100; n++) {
    const sig = c.header(`x-docusign-signature-${n}`);
    if (sig === undefined) continue;
    seen = true;
    if (matches(expected, sig, 'base64')) return null;
  }
  return seen ? 'X-DocuSign-Signature does not match' : 'missing X-DocuSign-Signature-1 header';
};

/**
 * Contentful: `x-contentful-signature`, hex HMAC-SHA256 over `<METHOD>\n<path>\n<headers>\n<body>`,
 * where the headers are those named in `x-contentful-signed-headers` (lower-case, trimmed, sorted
 * by name, `name:value` joined by `;`, with `x-contentful-signed-headers` itself re-listed and
 * `x-contentful-timestamp`, in ms) and the path is URI-encoded, its query escaped first
 * (@contentful/node-apps-toolkit src/requests/verify-request.ts, sign-request.ts, utils.ts).
 */
const contentful: Verifier = (c) => {
  const sig = c.header('x-contentful-signature');
  const signed = c.header('x-contentful-signed-headers');
  if (!sig || !signed) return 'missing x-contentful-signature or x-contentful-signed-headers header';
  const ts = c.header('x-contentful-timestamp');
  if (!ts || !/^\d{1,15}$/.test(ts.trim())) return 'missing or malformed x-contentful-timestamp';
  const atMs = Number.parseInt(ts, 10);
  const stale = checkMs(atMs, c.nowMs);
  if (stale) return stale;
  const headers = new Map<string, string>();
  for (const raw of signed.split(',')) {
    const name = raw.trim().toLowerCase();
    const v = name ? c.header(name) : undefined;
    if (v !== undefined) headers.set(name, v.trim());
  }
  const names = new Set([...headers.keys(), 'x-contentful-signed-headers', 'x-contentful-timestamp']);
  const sorted = [...names].sort();
  headers.set('x-contentful-timestamp', String(atMs));
  headers.set('x-contentful-signed-headers', sorted.join(','));
  const canonicalHeaders = sorted.map((k) => `${k}:${headers.get(k)}`).join(';');
  const target = requestTarget(c.s);
  const [pathname = '/', search] = target.split('?');
  const paths = new Set([encodeURI(search ? `${pathname}?${qsEscape(search)}` : pathname), encodeURI(pathname)]);
  const method = c.s.req.method ?? 'POST';
  for (const path of paths) {
    if (matches(hmac('sha256', c.secret, `${method}\n${path}\n${canonicalHeaders}\n`, c.body), sig, 'hex')) return null;
  }
  return 'x-contentful-signature does not match';
};

/** Characters HubSpot decodes in the request URI before signing (v3). */
const HUBSPOT_DECODE: Record<string, string> = {
  '%3A': ':', '%2F': '/', '%3F': '?', '%40': '@', '%21': '!', '%24': '$', '%27': "'", '%28': '(', '%29': ')', '%2A': '*', '%2C': ',', '%3B': ';',
};

/**
 * HubSpot v3: `X-HubSpot-Signature-v3`, base64 HMAC-SHA256 with the app's client secret over
 * `<METHOD><URI><body><X-HubSpot-Request-Timestamp>` (ms, at most 5 minutes old), the URI with a
 * few percent-escapes decoded (developers.hubspot.com/docs/api/webhooks/validating-requests;
 * @hubspot/api-client src/utils/signature.ts). The v1/v2 schemes (an unkeyed SHA-256 of
 * secret + request, without a timestamp) are not accepted.
 */
const hubspot: Verifier = (c) => {
  const sig = c.header('x-hubspot-signature-v3');
  if (!sig) return 'missing X-HubSpot-Signature-v3 header';
  const ts = c.header('x-hubspot-request-timestamp');
  if (!ts || !/^\d{1,15}$/.test(ts)) return 'missing or malformed X-HubSpot-Request-Timestamp';
  const stale = checkMs(Number(ts), c.nowMs);
  if (stale) return stale;
  const method = c.s.req.method ?? 'POST';
  for (const url of requestUrls(c.s)) {
    const decoded = url.replace(/%(3A|2F|3F|40|21|24|27|28|29|2A|2C|3B)/gi, (e) => HUBSPOT_DECODE[e.toUpperCase()]!);
    for (const u of new Set([url, decoded])) {
      if (matches(hmac('sha256', c.secret, method, u, c.body, ts), sig, 'base64')) return null;
    }
  }
  return 'X-HubSpot-Signature-v3 does not match';
};

/** A form field's name or value (text as sent) decoded as `parseForm` decodes it (`+`, `%XX`, UTF-8). */
const formDecode = (raw: string): string => {
  const bytes = Buffer.from(raw, 'utf8');
  return formBytesDecode(bytes, 0, bytes.length);
};

/**
 * The first value of each of `names` (ASCII) in a form body, read as `new URLSearchParams(text)`
 * reads it (a leading `?` dropped, fields split on `&`, empty ones skipped, the name ending at the
 * first `=`), but decoding only the names that can be one of `names` and those names' values; a
 * value longer than `maxLength` characters as sent is refused (the reason is returned).
 */
function formValues(body: Buffer, names: readonly string[], maxLength: number): Map<string, string> | string {
  const text = body.toString('utf8');
  const out = new Map<string, string>();
  // An ASCII character is at most 3 as sent (%XX): longer names cannot be one of these.
  const longestName = 3 * Math.max(...names.map((n) => n.length));
  for (let start = text.startsWith('?') ? 1 : 0; start < text.length; ) {
    let end = text.indexOf('&', start);
    if (end < 0) end = text.length;
    // The name ends at the field's first `=`, looked for only as far as a name that matters.
    let nameEnd = end;
    for (let i = start; i < end && i <= start + longestName; i++) {
      if (text.charCodeAt(i) === 0x3d /* = */) {
        nameEnd = i;
        break;
      }
    }
    if (end > start && nameEnd - start <= longestName) {
      const name = formDecode(text.slice(start, nameEnd));
      if (names.includes(name) && !out.has(name)) {
        const raw = nameEnd < end ? text.slice(nameEnd + 1, end) : '';
        if (raw.length > maxLength) return `the form field ${name} is longer than this provider sends`;
        out.set(name, formDecode(raw));
      }
    }
    start = end + 1;
  }
  return out;
}

/** The form fields Mailgun signs, or carry the signature. */
const MAILGUN_FORM_FIELDS = ['timestamp', 'token', 'signature'] as const;
/** Longest of those fields' values read (as sent): Mailgun's are 10, 50 and 64 characters. */
const MAX_MAILGUN_FIELD = 1024;

/**
 * Mailgun: the body carries `timestamp`, `token` and `signature` (JSON webhooks under `signature`,
 * form posts as fields); `signature` (or, for subaccounts, `parent-signature`) is the hex
 * HMAC-SHA256 with the webhook signing key over `<timestamp><token>`
 * (documentation.mailgun.com, "Securing Webhooks"). That signature does not cover the rest of the
 * body, so the 5-minute timestamp window is what bounds a replay. A form body of more than
 * `MAX_SORTED_FORM_FIELDS` fields is refused before it is read, as for Twilio, and of the others
 * only `timestamp`, `token` and `signature` are decoded (each at most `MAX_MAILGUN_FIELD`
 * characters).
 */
const mailgun: Verifier = (c) => {
  let ts: unknown;
  let token: unknown;
  const sigs: unknown[] = [];
  const ct = (c.s.req.headers['content-type'] ?? '').toLowerCase();
  if (ct.startsWith('application/json')) {
    let sig: Record<string, unknown> | undefined;
    try {
      const parsed = JSON.parse(c.body.toString('utf8')) as { signature?: unknown };
      if (parsed && typeof parsed.signature === 'object' && parsed.signature) sig = parsed.signature as Record<string, unknown>;
    } catch {
      return 'the JSON body could not be parsed';
    }
    if (!sig) return 'missing signature in the body';
    ts = sig.timestamp;
    token = sig.token;
    sigs.push(sig.signature, sig['parent-signature']);
  } else if (isForm(c)) {
    // Mailgun's form posts carry tens of fields: a body of ~500,000 empty fields took ~30 ms to
    // parse, one field of 1 MiB of `+` ~90 ms. Only the three signed fields are decoded.
    const tooMany = tooManyFormFields(c.body);
    if (tooMany) return tooMany;
    const f = formValues(c.body, MAILGUN_FORM_FIELDS, MAX_MAILGUN_FIELD);
    if (typeof f === 'string') return f;
    ts = f.get('timestamp');
    token = f.get('token');
    sigs.push(f.get('signature'));
  } else {
    return 'Mailgun webhooks must be JSON or form-encoded';
  }
  const given = sigs.filter((s): s is string => typeof s === 'string' && s.length > 0);
  if (typeof token !== 'string' || given.length === 0) return 'missing signature, token or timestamp in the body';
  const tsText = typeof ts === 'number' ? String(ts) : ts;
  if (typeof tsText !== 'string') return 'missing or malformed timestamp';
  const stale = checkUnixSeconds(tsText, c.nowMs);
  if (stale) return stale;
  const expected = hmac('sha256', c.secret, tsText, token);
  return given.some((s) => matches(expected, s, 'hex')) ? null : 'the signature does not match';
};

/**
 * Microsoft Teams outgoing webhooks: `Authorization: HMAC <base64>`, HMAC-SHA256 of the body keyed
 * with the base64-decoded security token Teams shows when the webhook is created
 * (learn.microsoft.com/microsoftteams/platform/webhooks-and-connectors/how-to/add-outgoing-webhook).
 */
function microsoftTeams(secret: string): Verifier {
  const key = decode(secret, 'base64');
  if (!key || key.length === 0) throw new Error('webhook_verification: the microsoft_teams secret must be the base64 security token');
  return (c) => {
    const auth = c.header('authorization');
    if (!auth) return 'missing Authorization header';
    const m = /^HMAC\s+(\S+)$/i.exec(auth.trim());
    if (!m) return 'Authorization must be HMAC <signature>';
    return matches(hmac('sha256', key, c.body), m[1]!, 'base64') ? null : 'Authorization does not match';
  };
}

/**
 * An ISO 8601 date-time in ms since the epoch (UTC when it names no offset), or NaN. Only
 * `YYYY-MM-DD[T ]hh:mm…` shapes are read, never the platform's looser Date formats.
 */
function isoMs(value: string): number {
  const v = value.trim();
  if (!/^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}/.test(v)) return NaN;
  return Date.parse(/(?:Z|[+-]\d{2}:?\d{2})$/i.test(v) ? v : `${v}Z`);
}

/**
 * Orb: `X-Orb-Signature: v1=<hex>` (several may be sent, space-separated), HMAC-SHA256 keyed with
 * the webhook secret (its UTF-8 bytes) over `v1:<X-Orb-Timestamp>:<body>`; the timestamp is
 * ISO 8601, UTC when it carries no offset, refused when more than 5 minutes off either way
 * (orbcorp/orb-node src/resources/webhooks.ts and orbcorp/orb-python src/orb/resources/webhooks.py,
 * `verifySignature` / `verify_signature`).
 */
const orb: Verifier = (c) => {
  const sig = c.header('x-orb-signature');
  if (!sig) return 'missing X-Orb-Signature header';
  const ts = c.header('x-orb-timestamp');
  if (!ts) return 'missing X-Orb-Timestamp header';
  const stale = checkMs(isoMs(ts), c.nowMs);
  if (stale) return `X-Orb-Timestamp: ${stale}`;
  const expected = hmac('sha256', c.secret, `v1:${ts}:`, c.body);
  const ok = sig.split(' ').some((p) => p.startsWith('v1=') && matches(expected, p.slice(3), 'hex'));
  return ok ? null : 'X-Orb-Signature does not match';
};

/**
 * Pinwheel: `x-pinwheel-signature: v2=<hex>`, HMAC-SHA256 keyed with the API secret over the
 * UTF-8 `v2:<x-timestamp>:` followed by the raw body bytes (docs.pinwheelapi.com/docs
 * /webhook-signature-verification, "Signature Algorithm"). The documentation does not name the
 * timestamp's format: Unix seconds, Unix ms or ISO 8601 are read and held to the 5-minute
 * tolerance; any other value is refused rather than let through unchecked.
 */
const pinwheel: Verifier = (c) => {
  const sig = c.header('x-pinwheel-signature');
  if (!sig) return 'missing X-Pinwheel-Signature header';
  const ts = c.header('x-timestamp');
  if (!ts) return 'missing X-Timestamp header';
  const atMs = /^\d{1,11}$/.test(ts) ? Number(ts) * 1000 : /^\d{12,15}$/.test(ts) ? Number(ts) : isoMs(ts);
  const stale = checkMs(atMs, c.nowMs);
  if (stale) return `X-Timestamp: ${stale}`;
  if (!sig.startsWith('v2=')) return 'X-Pinwheel-Signature must start with v2=';
  return matches(hmac('sha256', c.secret, `v2:${ts}:`, c.body), sig.slice(3), 'hex') ? null : 'X-Pinwheel-Signature does not match';
};

/** Go's HTML-safe escapes of `&`, `<` and `>`, as Hygraph writes them (the backslash doubled). */
const HYGRAPH_HTML_ESCAPES: Record<string, string> = { '&': '\\\\u0026', '<': '\\\\u003c', '>': '\\\\u003e' };

/**
 * What each byte of the body becomes in Hygraph's signed text (undefined: itself): what
 * `JSON.stringify` escapes in a string (`"`, `\\`, control characters), and then
 * `HYGRAPH_HTML_ESCAPES`.
 */
const HYGRAPH_BYTE_ESCAPES: ReadonlyArray<Buffer | undefined> = (() => {
  const table: Array<Buffer | undefined> = new Array<Buffer | undefined>(256).fill(undefined);
  for (const ch of [...Array.from({ length: 0x20 }, (_, b) => String.fromCharCode(b)), '"', '\\']) {
    table[ch.charCodeAt(0)] = Buffer.from(JSON.stringify(ch).slice(1, -1));
  }
  for (const [ch, esc] of Object.entries(HYGRAPH_HTML_ESCAPES)) table[ch.charCodeAt(0)] = Buffer.from(esc);
  return table;
})();

/** Bytes of Hygraph's signed text gathered per HMAC update. */
const HYGRAPH_CHUNK = 64 * 1024;

/**
 * HMAC-SHA256 of Hygraph's signed text, written into a small buffer as it is hashed: the text is
 * up to 7 times the body (each `<` becomes 7 characters), and `JSON.stringify` then `.replace`
 * built it whole in ~60 ms and ~7 MiB for a 1 MiB body of `<`, for any unsigned request. The
 * body is the UTF-8 text Node decodes (malformed bytes as U+FFFD, as `toString` reads them),
 * encoded again when it is not valid UTF-8: only ASCII bytes are escaped and multi-byte
 * characters pass as they are, as `JSON.stringify` leaves them (that text has no lone
 * surrogates, the only non-ASCII characters it escapes).
 */
function hygraphHmac(secret: string, body: Buffer, env: string, t: number): Buffer {
  const h = createHmac('sha256', secret);
  h.update('{"Body":"');
  const bytes = isUtf8(body) ? body : Buffer.from(body.toString('utf8'), 'utf8');
  const out = Buffer.allocUnsafe(HYGRAPH_CHUNK);
  let n = 0;
  for (let i = 0; i < bytes.length; i++) {
    const b = bytes[i]!;
    const esc = HYGRAPH_BYTE_ESCAPES[b];
    if (n + 7 > HYGRAPH_CHUNK) {
      h.update(out.subarray(0, n));
      n = 0;
    }
    if (esc === undefined) out[n++] = b;
    else for (let k = 0; k < esc.length; k++) out[n++] = esc[k]!;
  }
  h.update(out.subarray(0, n));
  const tail = `","EnvironmentName":${JSON.stringify(env)},"TimeStamp":${JSON.stringify(t)}}`;
  h.update(tail.replace(/[&<>]/g, (ch) => HYGRAPH_HTML_ESCAPES[ch]!));
  return h.digest();
}

/**
 * Hygraph (formerly GraphCMS): `gcms-signature: sign=<base64>, env=<environment>, t=<ms>`, base64
 * HMAC-SHA256 keyed with the webhook's secret key over the JSON text
 * `{"Body":<body as a JSON string>,"EnvironmentName":<env>,"TimeStamp":<t>}` in which `&`, `<` and
 * `>` are then written as `\\u0026`, `\\u003c`, `\\u003e` (hygraph/hygraph-utils index.js,
 * `verifyWebhookSignature` with `rawPayload`; hygraph.com/blog/introducing-signed-webhooks).
 * `t` (ms) is held to the 5-minute tolerance. The text is hashed as it is escaped, never built
 * whole (`hygraphHmac`), and only for a `sign=` that is a SHA-256 MAC in base64.
 */
const graphcms: Verifier = (c) => {
  const header = c.header('gcms-signature');
  if (!header) return 'missing gcms-signature header';
  const pairs = commaPairs(header);
  const sign = pairs.get('sign')?.[0];
  const env = pairs.get('env')?.[0];
  const t = pairs.get('t')?.[0];
  if (!sign || env === undefined || !t) return 'gcms-signature lacks sign=, env= or t=';
  if (!/^\d{1,15}$/.test(t)) return 'gcms-signature: missing or malformed timestamp';
  const stale = checkMs(Number(t), c.nowMs);
  if (stale) return `gcms-signature: ${stale}`;
  const given = decode(sign, 'base64');
  if (given === null || given.length !== 32) return 'gcms-signature does not match';
  return safeEqual(hygraphHmac(c.secret, c.body, env, Number(t)), given) ? null : 'gcms-signature does not match';
};

/**
 * HostedHooks: `t=<unix>,s=<hex>`, hex HMAC-SHA256 keyed with the endpoint's signing secret over
 * `<t>.<body>` (docs.hostedhooks.com/security/security-features/webhook-signatures). The
 * documentation names the header by its Rack/CGI variable, `HTTP_HOSTEDHOOKS_SIGNATURE`, which
 * either spelling below arrives as; HostedHooks re-signs retries with a fresh timestamp, so the
 * 5-minute tolerance applies.
 */
function hostedhooks(): Verifier {
  const spellings = ['hostedhooks-signature', 'hostedhooks_signature'].map((h) => ({ h, verify: timestampedHmac(h, 't', 's') }));
  return (c) => (spellings.find(({ h }) => c.header(h) !== undefined) ?? spellings[0]!).verify(c);
}

/** Query or form fields as `[name, value]`, names sorted and each name's values sorted. */
function sortedFields(params: Iterable<[string, string]>): Array<[string, string]> {
  const byName = new Map<string, string[]>();
  for (const [k, v] of params) {
    const list = byName.get(k) ?? [];
    list.push(v);
    byName.set(k, list);
  }
  const out: Array<[string, string]> = [];
  for (const k of [...byName.keys()].sort()) for (const v of byName.get(k)!.sort()) out.push([k, v]);
  return out;
}

/** The string's UTF-8 bytes read back as Latin-1: one more layer of UTF-8 once re-encoded. */
const latin1View = (s: string) => Buffer.from(s, 'utf8').toString('latin1');

/**
 * Plivo, signature V3: `X-Plivo-Signature-V3` (the account's or subaccount's Auth Token) or
 * `X-Plivo-Signature-Ma-V3` (the main account's), each a comma-separated list of base64
 * HMAC-SHA256 over `<url>.<X-Plivo-Signature-V3-Nonce>`. <url> is the callback URL without its
 * query, then `?` and the query re-serialized (decoded `name=value`, sorted by name then value,
 * joined by `&`); for a POST with form parameters, `?<query>` (plus `.` when the query is not
 * empty) followed by every parameter as `<name><value>`, sorted the same way
 * (plivo/plivo-python plivo/utils/signature_v3.py `validate_v3_signature`; plivo/plivo-node
 * lib/utils/v3Security.js `validateV3Signature`; docs.plivo.com/docs/voice/xml/request/validation).
 * On non-ASCII text the SDKs differ (Node signs the UTF-8 text; Python encodes that UTF-8 once
 * more, each byte read as a character): both are accepted. The nonce is random and there is no timestamp. Plivo
 * calls back with GET or POST; a body that is not form-encoded would be outside the signature,
 * so it is refused. The older V2 scheme (URL and nonce only, nothing of the request) is not accepted.
 */
const plivo: Verifier = (c) => {
  const sigs = [c.header('x-plivo-signature-v3'), c.header('x-plivo-signature-ma-v3')].filter((v): v is string => !!v);
  if (sigs.length === 0) return 'missing X-Plivo-Signature-V3 header';
  const nonce = c.header('x-plivo-signature-v3-nonce');
  if (!nonce) return 'missing X-Plivo-Signature-V3-Nonce header';
  const method = c.s.req.method ?? 'POST';
  if (method !== 'GET' && method !== 'POST') return 'Plivo calls back with GET or POST';
  let form: Array<[string, string]> = [];
  if (c.body.length > 0) {
    if (method !== 'POST' || !isForm(c)) return 'the body is not form-encoded, so it is not covered by the signature';
    const tooMany = tooManyFormFields(c.body);
    if (tooMany) return tooMany;
    form = sortedFields(parseForm(c.body));
  }
  const params = form.map(([k, v]) => k + v).join('');
  for (const url of requestUrls(c.s)) {
    const q = url.indexOf('?');
    const base = q < 0 ? url : url.slice(0, q);
    const query = sortedFields(new URLSearchParams(q < 0 ? '' : url.slice(q + 1))).map(([k, v]) => `${k}=${v}`).join('&');
    const signedUrl = base + (query || params ? `?${query}` : '') + (query && params ? '.' : '') + params;
    const candidates = [hmac('sha256', c.secret, Buffer.from(`${signedUrl}.${nonce}`, 'utf8'))];
    if (/[^\x00-\x7f]/.test(signedUrl)) candidates.push(hmac('sha256', c.secret, Buffer.from(`${latin1View(signedUrl)}.${nonce}`, 'utf8')));
    for (const header of sigs) {
      for (const sig of header.split(',')) if (candidates.some((expected) => matches(expected, sig, 'base64'))) return null;
    }
  }
  return 'X-Plivo-Signature-V3 does not match';
};

/**
 * Verifiers by provider (lower-case), built from the module's secret. Body-HMAC providers, with
 * their sources: AfterShip `aftership-hmac-sha256` base64 SHA-256 (aftership.com/docs/tracking
 * /webhook/webhook-signature); Alchemy `X-Alchemy-Signature` hex SHA-256 (docs.alchemy.com,
 * Notify API FAQ); Autodesk APS `x-adsk-signature: sha1hash=<hex>` SHA-1
 * (aps.autodesk.com/en/docs/webhooks/v1/tutorials/how-to-verify-payload-signature); Bolt
 * `X-Bolt-Hmac-Sha256` base64 SHA-256 (help.bolt.com/developers/webhooks/hook-verification;
 * bolt/bolt-magento2 Hook helper); Castle `X-Castle-Signature` base64 SHA-256 with the API secret
 * (castle/castle-ruby lib/castle/webhooks/verify.rb); Chargify/Maxio
 * `X-Chargify-Webhook-Signature-Hmac-Sha-256` hex SHA-256 with the site's shared key; CircleCI
 * `circleci-signature: v1=<hex>` SHA-256 (circleci.com/docs/webhooks); Clearbit
 * `X-Request-Signature: sha1=<hex>` SHA-1 with the API key (clearbit/clearbit-ruby
 * lib/clearbit/webhook_signature.rb); Coinbase Commerce `X-CC-Webhook-Signature` hex SHA-256
 * (coinbase/coinbase-commerce-node lib/Webhook.js); Jira `X-Hub-Signature: sha256=<hex>`
 * (developer.atlassian.com, Jira webhooks "Secure admin webhooks"); Modern Treasury `X-Signature`
 * hex SHA-256 (docs.moderntreasury.com, "Verifying webhook signatures"); MongoDB Atlas
 * `X-MMS-Signature` base64 SHA-1 (mongodb.com/docs/atlas/tutorial/webhook-integration); Pusher
 * `X-Pusher-Signature` hex SHA-256 with the app secret (pusher/pusher-http-go Webhook); Sonatype
 * Nexus `X-Nexus-Webhook-Signature` hex SHA-1 (help.sonatype.com/repomanager3/integrations
 * /webhooks/working-with-hmac-payloads); Webex `X-Spark-Signature` hex SHA-1
 * (developer.webex.com/docs/webhooks, "Handling requests from Webex"); Worldline (Connect /
 * GlobalCollect) `X-GCS-Signature` base64 SHA-256 (docs.connect.worldline-solutions.com
 * /documentation/webhooks; Ingenico Connect SDK WebhooksHelper); Signal Sciences (Fastly)
 * `X-SigSci-Signature` hex SHA-256 with the generic webhook's signing key
 * (docs.fastly.com/signalsciences/integrations/generic-webhooks); Trend Micro Cloud One
 * Conformity `X-Conformity-Signature` hex SHA-256 with the webhook security token
 * (cloudone.trendmicro.com/docs/conformity/webhook-communication, "Validating payloads"; its
 * example re-serializes the parsed JSON, the raw body is what is checked here). Go1 signs like
 * Stripe (`Go1-Signature: t=<unix>,v1=<hex>` over `<t>.<body>`, developers.go1.com/docs
 * /developer-tools/webhooks/security; go1com/webhook-verifier-js src/signature-verifier.ts),
 * held to the 5-minute tolerance (that SDK's default is 60 s, configurable). Frame.io signs like Slack
 * (`X-Frameio-Signature: v0=…` over `v0:<X-Frameio-Request-Timestamp>:<body>`,
 * developer.frame.io, "Verifying webhook signatures"); TikTok like Stripe with `t=`/`s=`
 * (`TikTok-Signature`, developers.tiktok.com/doc/webhooks-verification).
 */
const PROVIDERS: Record<string, (secret: string) => Verifier> = {
  github: () => bodyHmac('x-hub-signature-256', 'sha256', 'hex', 'sha256='),
  bitbucket: () => bodyHmac('x-hub-signature', 'sha256', 'hex', 'sha256='),
  jira: () => bodyHmac('x-hub-signature', 'sha256', 'hex', 'sha256='),
  intercom: () => bodyHmac('x-hub-signature', 'sha1', 'hex', 'sha1='),
  shopify: () => bodyHmac('x-shopify-hmac-sha256', 'sha256', 'base64'),
  heroku: () => bodyHmac('heroku-webhook-hmac-sha256', 'sha256', 'base64'),
  xero: () => bodyHmac('x-xero-signature', 'sha256', 'base64'),
  typeform: () => bodyHmac('typeform-signature', 'sha256', 'base64', 'sha256='),
  linear: () => bodyHmac('linear-signature', 'sha256', 'hex'),
  sentry: () => bodyHmac('sentry-hook-signature', 'sha256', 'hex'),
  launch_darkly: () => bodyHmac('x-ld-signature', 'sha256', 'hex'),
  terraform: () => bodyHmac('x-tfe-notification-signature', 'sha512', 'hex'),
  aftership: () => bodyHmac('aftership-hmac-sha256', 'sha256', 'base64'),
  alchemy: () => bodyHmac('x-alchemy-signature', 'sha256', 'hex'),
  autodesk: () => bodyHmac('x-adsk-signature', 'sha1', 'hex', 'sha1hash='),
  bolt: () => bodyHmac('x-bolt-hmac-sha256', 'sha256', 'base64'),
  castle: () => bodyHmac('x-castle-signature', 'sha256', 'base64'),
  chargify: () => bodyHmac('x-chargify-webhook-signature-hmac-sha-256', 'sha256', 'hex'),
  clearbit: () => bodyHmac('x-request-signature', 'sha1', 'hex', 'sha1='),
  coinbase: () => bodyHmac('x-cc-webhook-signature', 'sha256', 'hex'),
  modern_treasury: () => bodyHmac('x-signature', 'sha256', 'hex'),
  mongodb: () => bodyHmac('x-mms-signature', 'sha1', 'base64'),
  pusher: () => bodyHmac('x-pusher-signature', 'sha256', 'hex'),
  sonatype: () => bodyHmac('x-nexus-webhook-signature', 'sha1', 'hex'),
  webex: () => bodyHmac('x-spark-signature', 'sha1', 'hex'),
  worldline: () => bodyHmac('x-gcs-signature', 'sha256', 'base64'),
  signal_sciences: () => bodyHmac('x-sigsci-signature', 'sha256', 'hex'),
  trendmicro_conformity: () => bodyHmac('x-conformity-signature', 'sha256', 'hex'),
  stripe: () => timestampedHmac('stripe-signature'),
  mux: () => timestampedHmac('mux-signature'),
  calendly: () => timestampedHmac('calendly-webhook-signature'),
  tiktok: () => timestampedHmac('tiktok-signature', 't', 's'),
  go1: () => timestampedHmac('go1-signature'),
  hostedhooks,
  orb: () => orb,
  pinwheel: () => pinwheel,
  graphcms: () => graphcms,
  plivo: () => plivo,
  buildkite,
  slack: () => v0('x-slack-signature', 'x-slack-request-timestamp'),
  zoom: () => v0('x-zm-signature', 'x-zm-request-timestamp'),
  frameio: () => v0('x-frameio-signature', 'x-frameio-request-timestamp'),
  pagerduty: () => versionedBodyHmac('x-pagerduty-signature', 'v1'),
  circleci: () => versionedBodyHmac('circleci-signature', 'v1'),
  gitlab: () => tokenHeader('x-gitlab-token'),
  twilio: () => twilio,
  mailchimp: () => mandrill,
  square: () => square,
  zendesk: () => zendesk,
  airship: () => airship,
  box: () => box,
  docusign: () => docusign,
  contentful: () => contentful,
  hubspot: () => hubspot,
  mailgun: () => mailgun,
  microsoft_teams: microsoftTeams,
  facebook_graph_api: meta,
  facebook_messenger: meta,
  instagram: meta,
  whatsapp: meta,
  dropbox,
  twitter,
  svix,
  clerk: svix,
  brex: svix,
  sendgrid,
};

/** Providers this ingress verifies (lower-case), `sns` included. */
export const SUPPORTED_WEBHOOK_PROVIDERS: readonly string[] = [...Object.keys(PROVIDERS), 'sns'].sort();

export interface WebhookVerificationOptions {
  /** Clock (ms since the epoch) for timestamp tolerance and certificate validity. */
  now?: () => number;
  /** Fetches SNS signing certificates (default: HTTPS GET); tests inject a local one. */
  snsCertificateFetcher?: CertificateFetcher;
}

interface WebhookModule {
  provider?: string;
  secret?: string;
}

/**
 * The result of checking one request: null when verified, else the reason, or the ingress's own
 * answer to a provider's unsigned handshake (nothing is forwarded).
 */
export type WebhookCheckResult = string | null | Answer;

/**
 * Checks one request (its original headers and target, and `body`, the whole request body) the
 * way one provider signs. Synchronous but for SNS, which may fetch a certificate.
 */
export type WebhookCheck = (s: RequestState, body: Buffer) => WebhookCheckResult | Promise<WebhookCheckResult>;

const UNCHECKABLE = 'the signature could not be checked';

/**
 * Builds the check of one provider (matched case-insensitively) and secret: what the route module
 * `webhook_verification` and the traffic-policy action `verify-webhook` both run. The returned
 * builder has its own clock and SNS certificate cache, shared by every check it builds. Throws
 * (messages prefixed with `what`) when the provider is not supported here or the secret is
 * missing or unusable.
 */
export function createWebhookChecks(opts: WebhookVerificationOptions = {}, what = 'webhook_verification'): (provider: string, secret: string | undefined) => WebhookCheck {
  const now = opts.now ?? Date.now;
  let certs: SnsCertificateCache | null = null;
  return (name, secret = '') => {
    const provider = name.toLowerCase();
    let verifier: Verifier;
    if (provider === 'sns') {
      const cache = (certs ??= new SnsCertificateCache(opts.snsCertificateFetcher, now));
      verifier = (c) => verifySnsMessage(c.body, cache, c.nowMs, { type: c.header('x-amz-sns-message-type'), topicArn: c.header('x-amz-sns-topic-arn'), messageId: c.header('x-amz-sns-message-id') });
    } else {
      const build = PROVIDERS[provider];
      if (!build) throw new Error(`${what}: provider ${JSON.stringify(name)} is not supported by this ingress (supported: ${SUPPORTED_WEBHOOK_PROVIDERS.join(', ')})`);
      if (!secret) throw new Error(`${what}: provider ${provider} needs a secret`);
      try {
        verifier = build(secret);
      } catch (err) {
        throw new Error((err as Error).message.replace(/^webhook_verification:/, `${what}:`));
      }
    }
    return (s, body) => {
      // No provider sends an Upgrade, and the bytes after one would pass unsigned.
      if (s.req.headers.upgrade !== undefined) return 'an Upgrade request carries bytes no signature covers';
      const c: VerifyContext = {
        s,
        body,
        secret,
        nowMs: now(),
        header: (h) => {
          const v = s.req.headers[h];
          return Array.isArray(v) ? v[0] : v;
        },
      };
      try {
        const result = verifier(c);
        return result instanceof Promise ? result.catch(() => UNCHECKABLE) : result;
      } catch {
        return UNCHECKABLE;
      }
    };
  };
}

/** A webhook_verification factory with its own clock and SNS certificate cache (shared by its routes). */
export function createWebhookVerificationStage(opts: WebhookVerificationOptions = {}): StageFactory {
  const checks = createWebhookChecks(opts);
  return (route): RouteStage | null => {
    const m = enabledModule<WebhookModule>(route, 'webhook_verification');
    if (!m) return null;
    const provider = (m.provider ?? '').toLowerCase();
    const check = checks(m.provider ?? '', m.secret);
    return {
      name: 'webhook_verification',
      needsBody: true,
      async onRequest(s) {
        const result = await check(s, s.body ?? Buffer.alloc(0));
        if (result === null) return null;
        if (typeof result === 'object') return result.answer;
        return moduleError(s, 7102, `webhook verification failed (${provider}): ${result}`);
      },
    };
  };
}

export const webhookVerificationStage: StageFactory = createWebhookVerificationStage();
