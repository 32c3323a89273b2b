import { createHash, createHmac, createPublicKey, timingSafeEqual, verify, type KeyObject } from 'node:crypto';
import type { RequestState, RouteStage, StageFactory } from '../pipeline/types.js';
import { enabledModule, moduleError } from './common.js';
import { SnsCertificateCache, verifySnsMessage, type CertificateFetcher } from './webhook-sns.js';

/**
 * `webhook_verification`: `provider` + `secret`. The whole body is buffered (`needsBody`) and
 * the request's signature checked the way that provider signs; a missing or bad signature, or a
 * timestamp more than 5 minutes off, answers 403 (7102) naming the reason. Providers this ingress
 * cannot verify refuse the config (the factory throws) rather than pass traffic unverified.
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

/** null when verified, else the reason. */
type Verifier = (c: VerifyContext) => string | null | Promise<string | null>;

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

/** Unix-seconds timestamp within tolerance: null, or the reason. */
function checkUnixSeconds(ts: string | undefined, nowMs: number): string | null {
  if (!ts || !/^\d{1,12}$/.test(ts)) return 'missing or malformed timestamp';
  return Math.abs(nowMs - Number(ts) * 1000) > TIMESTAMP_TOLERANCE_MS ? 'the timestamp is more than 5 minutes off' : null;
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

/** `t=<unix>,v1=<hex>[,v1=…]` over `<t>.<body>` (Stripe, Mux, Calendly). */
function timestampedV1(header: string): Verifier {
  return (c) => {
    const sig = c.header(header);
    if (!sig) return `missing ${header} header`;
    let t: string | undefined;
    const v1: string[] = [];
    for (const part of sig.split(',')) {
      const eq = part.indexOf('=');
      if (eq < 0) continue;
      const k = part.slice(0, eq).trim();
      const v = part.slice(eq + 1).trim();
      if (k === 't') t = v;
      else if (k === 'v1') v1.push(v);
    }
    if (!t || v1.length === 0) return `${header} lacks t= or v1=`;
    const stale = checkUnixSeconds(t, c.nowMs);
    if (stale) return stale;
    const expected = hmac('sha256', c.secret, t, '.', c.body);
    return v1.some((v) => matches(expected, v, 'hex')) ? null : `${header} does not match`;
  };
}

/** `v0=<hex>` over `v0:<timestamp>:<body>` (Slack, Zoom). */
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

/** The public URL of the request as the provider called it, and the variant with the port toggled. */
function requestUrls(s: RequestState): string[] {
  const host = s.req.headers.host ?? s.host;
  const target = s.req.url ?? '/';
  const path = target.startsWith('/') ? target : (() => {
    try {
      const u = new URL(target);
      return u.pathname + u.search;
    } catch {
      return '/';
    }
  })();
  const defaultPort = s.scheme === 'https' ? '443' : '80';
  const m = /^(.*?)(?::(\d+))?$/.exec(host)!;
  const bare = m[1]!;
  const other = m[2] ? bare : `${bare}:${defaultPort}`;
  return [`${s.scheme}://${host}${path}`, `${s.scheme}://${other}${path}`];
}

/** Twilio: base64 HMAC-SHA1 over the URL plus sorted form params, or over a URL carrying `bodySHA256`. */
const twilio: Verifier = (c) => {
  const sig = c.header('x-twilio-signature');
  if (!sig) return 'missing X-Twilio-Signature header';
  for (const url of requestUrls(c.s)) {
    let data = url;
    const bodySha = new URL(url).searchParams.get('bodySHA256');
    if (bodySha !== null) {
      const actual = createHash('sha256').update(c.body).digest('hex');
      if (!safeEqual(Buffer.from(actual), Buffer.from(bodySha.toLowerCase()))) return 'bodySHA256 does not match the body';
    } else if ((c.s.req.headers['content-type'] ?? '').toLowerCase().startsWith('application/x-www-form-urlencoded')) {
      const params = new Map<string, Set<string>>();
      for (const [k, v] of new URLSearchParams(c.body.toString('utf8'))) {
        let set = params.get(k);
        if (!set) params.set(k, (set = new Set()));
        set.add(v);
      }
      for (const k of [...params.keys()].sort()) for (const v of [...params.get(k)!].sort()) data += k + v;
    }
    if (matches(hmac('sha1', c.secret, data), sig, 'base64')) return null;
  }
  return 'X-Twilio-Signature does not match';
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
  if (Math.abs(c.nowMs - at) > TIMESTAMP_TOLERANCE_MS) return 'the timestamp is more than 5 minutes off';
  return matches(hmac('sha256', c.secret, ts, c.body), sig, 'base64') ? null : 'X-Zendesk-Webhook-Signature does not match';
};

/** PagerDuty v3: `X-PagerDuty-Signature: v1=<hex>[,v1=<hex>]` over the body. */
const pagerduty: Verifier = (c) => {
  const sig = c.header('x-pagerduty-signature');
  if (!sig) return 'missing X-PagerDuty-Signature header';
  const expected = hmac('sha256', c.secret, c.body);
  const ok = sig.split(',').some((p) => {
    const v = p.trim();
    return v.startsWith('v1=') && matches(expected, v.slice(3), 'hex');
  });
  return ok ? null : 'X-PagerDuty-Signature does not match';
};

/** GitLab: the secret token itself in `X-Gitlab-Token` (compared by digest, constant time). */
const gitlab: Verifier = (c) => {
  const token = c.header('x-gitlab-token');
  if (token === undefined) return 'missing X-Gitlab-Token header';
  const d = (v: string) => createHash('sha256').update(v).digest();
  return safeEqual(d(token), d(c.secret)) ? null : 'X-Gitlab-Token does not match';
};

/**
 * Svix and Standard Webhooks (`svix-*` or `webhook-*` headers): `v1,<base64>` signatures,
 * space-separated, HMAC-SHA256 with the base64 key after `whsec_` over `<id>.<timestamp>.<body>`.
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

/** Verifiers by provider (lower-case), built from the module's secret. */
const PROVIDERS: Record<string, (secret: string) => Verifier> = {
  github: () => bodyHmac('x-hub-signature-256', 'sha256', 'hex', 'sha256='),
  bitbucket: () => bodyHmac('x-hub-signature', 'sha256', 'hex', 'sha256='),
  intercom: () => bodyHmac('x-hub-signature', 'sha1', 'hex', 'sha1='),
  shopify: () => bodyHmac('x-shopify-hmac-sha256', 'sha256', 'base64'),
  heroku: () => bodyHmac('heroku-webhook-hmac-sha256', 'sha256', 'base64'),
  xero: () => bodyHmac('x-xero-signature', 'sha256', 'base64'),
  typeform: () => bodyHmac('typeform-signature', 'sha256', 'base64', 'sha256='),
  linear: () => bodyHmac('linear-signature', 'sha256', 'hex'),
  sentry: () => bodyHmac('sentry-hook-signature', 'sha256', 'hex'),
  launch_darkly: () => bodyHmac('x-ld-signature', 'sha256', 'hex'),
  terraform: () => bodyHmac('x-tfe-notification-signature', 'sha512', 'hex'),
  stripe: () => timestampedV1('stripe-signature'),
  mux: () => timestampedV1('mux-signature'),
  calendly: () => timestampedV1('calendly-webhook-signature'),
  slack: () => v0('x-slack-signature', 'x-slack-request-timestamp'),
  zoom: () => v0('x-zm-signature', 'x-zm-request-timestamp'),
  pagerduty: () => pagerduty,
  gitlab: () => gitlab,
  twilio: () => twilio,
  square: () => square,
  zendesk: () => zendesk,
  svix,
  clerk: svix,
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

/** A webhook_verification factory with its own clock and SNS certificate cache (shared by its routes). */
export function createWebhookVerificationStage(opts: WebhookVerificationOptions = {}): StageFactory {
  const now = opts.now ?? Date.now;
  let certs: SnsCertificateCache | null = null;
  return (route): RouteStage | null => {
    const m = enabledModule<WebhookModule>(route, 'webhook_verification');
    if (!m) return null;
    const provider = (m.provider ?? '').toLowerCase();
    let verifier: Verifier;
    if (provider === 'sns') {
      const cache = (certs ??= new SnsCertificateCache(opts.snsCertificateFetcher, now));
      verifier = (c) => verifySnsMessage(c.body, cache, c.nowMs);
    } else {
      const build = PROVIDERS[provider];
      if (!build) throw new Error(`webhook_verification: provider ${JSON.stringify(m.provider ?? '')} is not supported by this ingress (supported: ${SUPPORTED_WEBHOOK_PROVIDERS.join(', ')})`);
      if (!m.secret) throw new Error(`webhook_verification: provider ${provider} needs a secret`);
      verifier = build(m.secret);
    }
    const secret = m.secret ?? '';
    return {
      name: 'webhook_verification',
      needsBody: true,
      async onRequest(s) {
        const c: VerifyContext = {
          s,
          body: s.body ?? Buffer.alloc(0),
          secret,
          nowMs: now(),
          header: (name) => {
            const v = s.req.headers[name];
            return Array.isArray(v) ? v[0] : v;
          },
        };
        let reason: string | null;
        try {
          reason = await verifier(c);
        } catch {
          reason = 'the signature could not be checked';
        }
        return reason === null ? null : moduleError(s, 7102, `webhook verification failed (${provider}): ${reason}`);
      },
    };
  };
}

export const webhookVerificationStage: StageFactory = createWebhookVerificationStage();
