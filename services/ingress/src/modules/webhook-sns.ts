import { verify, X509Certificate } from 'node:crypto';

/**
 * Amazon SNS message signatures (webhook_verification provider `sns`, no secret): the body is
 * the SNS JSON message; its `Signature` (SignatureVersion 1: SHA1withRSA, 2: SHA256withRSA) over
 * the canonical string of its fields is checked with the certificate at `SigningCertURL`, which
 * must be an `https://sns.<region>.amazonaws.com[.cn]/….pem` URL (`SNS_HOST_RE`; `.eu` for the
 * European Sovereign Cloud). Certificates are fetched through an injectable fetcher and cached
 * (`SnsCertificateCache`: bounded, one hour; failures remembered for a minute; four fetches at
 * a time; a certificate that verified a signature kept apart from the others).
 */

/** Fetches a PEM certificate; throws on failure. */
export type CertificateFetcher = (url: string) => Promise<string>;

/**
 * `sns.<region>.<AWS DNS suffix>`, the region as AWS's partitions shape them (the SDKs'
 * `regionRegex`): `<area>-<direction>-<n>` in the commercial partition (`us-east-1`,
 * `ap-southeast-7`, `il-central-1`, `mx-central-1`) and GovCloud (`us-gov-west-1`) on
 * `amazonaws.com`, China (`cn-north-1`, `cn-northwest-1`) on `amazonaws.com.cn`, the European
 * Sovereign Cloud (`eusc-de-east-1`) on `amazonaws.eu`. Not any `sns.<label>`, since
 * `sns.s3.amazonaws.com` or `sns.execute-api.amazonaws.com` would serve whoever owns the bucket
 * or API named `sns`; and not a made-up area or direction either, so an unsigned message cannot
 * name a fresh host for every certificate fetch (regions to come keep this shape).
 */
const SNS_DIRECTION = '(?:north|south|east|west|central|northeast|northwest|southeast|southwest)';
const SNS_HOST_RE = new RegExp(
  `^sns\\.(?:(?:us|us-gov|eu|ap|ca|sa|me|af|il|mx)-${SNS_DIRECTION}-[1-9]\\d?\\.amazonaws\\.com` +
    `|cn-${SNS_DIRECTION}-[1-9]\\d?\\.amazonaws\\.com\\.cn` +
    `|eusc-de-${SNS_DIRECTION}-[1-9]\\d?\\.amazonaws\\.eu)$`,
);

/** The URL's parts when it is an https URL on an SNS host (no port, no user info), else null. */
function snsUrl(url: string): URL | null {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return null;
  }
  return u.protocol === 'https:' && SNS_HOST_RE.test(u.hostname) && u.port === '' && !u.username && !u.password ? u : null;
}

/** True when `url` is an SNS signing certificate URL (strict allow-list). */
export function isSnsCertificateUrl(url: string): boolean {
  const u = snsUrl(url);
  return u !== null && u.pathname.endsWith('.pem') && !u.search && !u.hash;
}

/**
 * The first key that a JSON object text (already parsed) names twice at its top level, or null.
 * `JSON.parse` keeps the last value of a repeated key; a parser that keeps the first (Go's gjson,
 * jsonparser, …) would show the upstream a value the signature never covered. Keys are compared
 * decoded (`"\u004dessage"` is `"Message"`).
 */
export function repeatedTopLevelKey(text: string): string | null {
  const seen = new Set<string>();
  let depth = 0;
  for (let i = 0; i < text.length; i++) {
    const ch = text.charCodeAt(i);
    if (ch === 0x22 /* " */) {
      const start = i;
      for (i++; i < text.length; i++) {
        const c = text.charCodeAt(i);
        if (c === 0x5c /* \ */) i++;
        else if (c === 0x22) break;
      }
      if (depth !== 1) continue;
      let j = i + 1;
      while (j < text.length && (text[j] === ' ' || text[j] === '\t' || text[j] === '\n' || text[j] === '\r')) j++;
      if (text[j] !== ':') continue;
      const key = JSON.parse(text.slice(start, i + 1)) as string;
      if (seen.has(key)) return key;
      seen.add(key);
    } else if (ch === 0x7b /* { */ || ch === 0x5b /* [ */) depth++;
    else if (ch === 0x7d /* } */ || ch === 0x5d /* ] */) depth--;
  }
  return null;
}

const MAX_CERT_BYTES = 64 * 1024;

/** The production fetcher: global fetch, no redirects, 5 s timeout, at most 64 KiB. */
export const fetchCertificate: CertificateFetcher = async (url) => {
  const res = await fetch(url, { redirect: 'error', signal: AbortSignal.timeout(5000) });
  if (!res.ok) throw new Error(`GET ${url}: HTTP ${res.status}`);
  const len = Number(res.headers.get('content-length') ?? '0');
  if (len > MAX_CERT_BYTES) throw new Error(`GET ${url}: certificate too large`);
  const text = await res.text();
  if (text.length > MAX_CERT_BYTES) throw new Error(`GET ${url}: certificate too large`);
  return text;
};

/** Bounds of an `SnsCertificateCache`. */
export interface SnsCertificateCacheLimits {
  /** Certificates kept after they verified a signature, least recently used dropped first (64). */
  maxVerified?: number;
  /** Certificates fetched but not (yet) seen verifying a signature, oldest dropped first (32). */
  maxFetched?: number;
  /** How long a fetched certificate is used before it is fetched again, in ms (one hour). */
  ttlMs?: number;
  /** Failed fetches remembered, by URL, oldest forgotten first (256). */
  maxFailures?: number;
  /** How long a failed fetch is remembered (not tried again), in ms (one minute). */
  failureTtlMs?: number;
  /** Fetches in flight at once; beyond that a new URL is refused, not fetched (4). */
  maxInflight?: number;
}

interface CachedCertificate {
  at: number;
  cert: X509Certificate;
}

/**
 * Parsed signing certificates by URL, for every route and account of one ingress, bounded
 * whatever unsigned messages name: a fetch of a URL already being fetched is shared, at most
 * `maxInflight` run at once (a new URL beyond that fails at once), a failed URL is not fetched
 * again for `failureTtlMs`, and a certificate that verified a signature (`confirm`) is kept
 * apart from those only fetched, so that certificates named by unsigned messages, however
 * many, never push it out (nor keep it from being fetched again when it expires).
 */
export class SnsCertificateCache {
  private readonly verified = new Map<string, CachedCertificate>();
  private readonly fetched = new Map<string, CachedCertificate>();
  private readonly failed = new Map<string, number>();
  private readonly inflight = new Map<string, Promise<X509Certificate>>();
  private readonly limits: Required<SnsCertificateCacheLimits>;

  constructor(
    private readonly fetcher: CertificateFetcher = fetchCertificate,
    private readonly now: () => number = Date.now,
    limits: SnsCertificateCacheLimits = {},
  ) {
    this.limits = { maxVerified: 64, maxFetched: 32, ttlMs: 3_600_000, maxFailures: 256, failureTtlMs: 60_000, maxInflight: 4, ...limits };
  }

  /** The certificate at `url`: cached, being fetched, or fetched now; rejects when it cannot be had. */
  get(url: string): Promise<X509Certificate> {
    const now = this.now();
    const verified = this.verified.get(url);
    if (verified && now - verified.at < this.limits.ttlMs) {
      // Used most recently: dropped last.
      this.verified.delete(url);
      this.verified.set(url, verified);
      return Promise.resolve(verified.cert);
    }
    const fetched = this.fetched.get(url);
    if (fetched && now - fetched.at < this.limits.ttlMs) return Promise.resolve(fetched.cert);
    if (fetched) this.fetched.delete(url);
    const failedAt = this.failed.get(url);
    if (failedAt !== undefined) {
      if (now - failedAt < this.limits.failureTtlMs) return Promise.reject(new Error(`${url} could not be fetched a moment ago`));
      this.failed.delete(url);
    }
    const running = this.inflight.get(url);
    if (running) return running;
    // An expired certificate that verified a signature is fetched again whatever else is in flight.
    if (!verified && this.inflight.size >= this.limits.maxInflight) return Promise.reject(new Error('too many SNS certificate fetches in flight'));
    const cert = this.fetcher(url).then((pem) => new X509Certificate(pem));
    this.inflight.set(url, cert);
    const wasVerified = () => verified !== undefined && this.verified.get(url) === verified;
    cert.then(
      (c) => {
        this.inflight.delete(url);
        if (wasVerified()) this.verified.set(url, { at: now, cert: c });
        else put(this.fetched, url, { at: now, cert: c }, this.limits.maxFetched);
      },
      () => {
        this.inflight.delete(url);
        if (wasVerified()) this.verified.delete(url);
        put(this.failed, url, this.now(), this.limits.maxFailures);
      },
    );
    return cert;
  }

  /** Records that `cert`, got from `url`, verified a signature: it is kept among the verified. */
  confirm(url: string, cert: X509Certificate): void {
    const known = this.verified.get(url) ?? this.fetched.get(url);
    if (known && known.cert !== cert) return;
    this.fetched.delete(url);
    put(this.verified, url, { at: known?.at ?? this.now(), cert }, this.limits.maxVerified);
  }
}

/** Sets `key` last in `map`, dropping the first entries beyond `max`. */
function put<V>(map: Map<string, V>, key: string, value: V, max: number): void {
  map.delete(key);
  map.set(key, value);
  while (map.size > max) map.delete(map.keys().next().value!);
}

const NOTIFICATION_FIELDS = ['Message', 'MessageId', 'Subject', 'Timestamp', 'TopicArn', 'Type'] as const;
const CONFIRMATION_FIELDS = ['Message', 'MessageId', 'SubscribeURL', 'Timestamp', 'Token', 'TopicArn', 'Type'] as const;

/** The string SNS signs: `Name\nValue\n` for each signed field present, in this fixed order. */
export function snsCanonicalString(msg: Record<string, unknown>): string | null {
  const fields = msg.Type === 'Notification' ? NOTIFICATION_FIELDS : msg.Type === 'SubscriptionConfirmation' || msg.Type === 'UnsubscribeConfirmation' ? CONFIRMATION_FIELDS : null;
  if (!fields) return null;
  let out = '';
  for (const f of fields) {
    const v = msg[f];
    if (v === undefined || v === null) {
      if (f === 'Subject') continue;
      return null;
    }
    if (typeof v !== 'string') return null;
    out += `${f}\n${v}\n`;
  }
  return out;
}

/** What SNS's own request headers say about the message (each undefined when absent). */
export interface SnsHeaders {
  /** `x-amz-sns-message-type` */
  type?: string | undefined;
  /** `x-amz-sns-topic-arn` */
  topicArn?: string | undefined;
  /** `x-amz-sns-message-id` */
  messageId?: string | undefined;
}

/**
 * null when `body` is an SNS message with a valid signature, else the reason. Beyond the
 * signature, what an upstream could read instead of the signed fields must agree with them:
 * no top-level key twice; SNS's `x-amz-sns-message-type`, `-topic-arn` and `-message-id` headers,
 * when sent, equal to the signed `Type`, `TopicArn` and `MessageId` (AWS tells endpoints to branch
 * on the type header); a Notification without the confirmation's `SubscribeURL` or `Token`; and
 * the unsigned `UnsubscribeURL` (and the signed `SubscribeURL`) on an SNS host over https, so an
 * upstream that follows them cannot be sent elsewhere.
 */
export async function verifySnsMessage(body: Buffer, certs: SnsCertificateCache, nowMs: number, headers: SnsHeaders = {}): Promise<string | null> {
  let msg: unknown;
  const text = body.toString('utf8');
  try {
    msg = JSON.parse(text);
  } catch {
    return 'the body is not an SNS JSON message';
  }
  if (!msg || typeof msg !== 'object' || Array.isArray(msg)) return 'the body is not an SNS JSON message';
  const repeated = repeatedTopLevelKey(text);
  if (repeated !== null) return `the SNS message names ${JSON.stringify(repeated)} twice`;
  const m = msg as Record<string, unknown>;
  if (headers.type !== undefined && headers.type !== m.Type) return 'x-amz-sns-message-type does not match the signed Type';
  if (headers.topicArn !== undefined && headers.topicArn !== m.TopicArn) return 'x-amz-sns-topic-arn does not match the signed TopicArn';
  if (headers.messageId !== undefined && headers.messageId !== m.MessageId) return 'x-amz-sns-message-id does not match the signed MessageId';
  if (m.Type === 'Notification' && (m.SubscribeURL !== undefined || m.Token !== undefined)) return 'an SNS Notification carries no SubscribeURL or Token';
  for (const f of ['SubscribeURL', 'UnsubscribeURL'] as const) {
    if (m[f] !== undefined && (typeof m[f] !== 'string' || snsUrl(m[f]) === null)) return `${f} is not an Amazon SNS URL`;
  }
  const alg = m.SignatureVersion === '1' ? 'sha1' : m.SignatureVersion === '2' ? 'sha256' : null;
  if (!alg) return 'unsupported SNS SignatureVersion';
  if (typeof m.Signature !== 'string' || !m.Signature) return 'the SNS message has no Signature';
  if (typeof m.SigningCertURL !== 'string' || !isSnsCertificateUrl(m.SigningCertURL)) return 'SigningCertURL is not an Amazon SNS certificate URL';
  const canonical = snsCanonicalString(m);
  if (canonical === null) return 'the SNS message lacks fields it must sign';
  let cert: X509Certificate;
  try {
    cert = await certs.get(m.SigningCertURL);
  } catch {
    return 'the SNS signing certificate could not be fetched';
  }
  if (Date.parse(cert.validFrom) > nowMs || Date.parse(cert.validTo) < nowMs) return 'the SNS signing certificate is not valid now';
  const ok = verify(alg, Buffer.from(canonical, 'utf8'), cert.publicKey, Buffer.from(m.Signature, 'base64'));
  if (!ok) return 'the SNS signature does not match';
  certs.confirm(m.SigningCertURL, cert);
  return null;
}
