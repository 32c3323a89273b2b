import { verify, X509Certificate } from 'node:crypto';

/**
 * Amazon SNS message signatures (webhook_verification provider `sns`, no secret): the body is
 * the SNS JSON message; its `Signature` (SignatureVersion 1: SHA1withRSA, 2: SHA256withRSA) over
 * the canonical string of its fields is checked with the certificate at `SigningCertURL`, which
 * must be an `https://sns.<region>.amazonaws.com[.cn]/….pem` URL. Certificates are fetched
 * through an injectable fetcher and cached (bounded, one hour).
 */

/** Fetches a PEM certificate; throws on failure. */
export type CertificateFetcher = (url: string) => Promise<string>;

/**
 * `sns.<region>.amazonaws.com[.cn]`, the region written as AWS writes them (`us-east-1`,
 * `us-gov-west-1`, `cn-north-1`, `eusc-de-east-1`): not any `sns.<label>`, since
 * `sns.s3.amazonaws.com` or `sns.execute-api.amazonaws.com` would serve whoever owns the bucket
 * or API named `sns`.
 */
const SNS_HOST_RE = /^sns\.[a-z]{2,4}(-[a-z]+)+-\d{1,2}\.amazonaws\.com(\.cn)?$/;

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

/** Bounded cache of parsed signing certificates by URL (in-flight fetches shared; failures not kept). */
export class SnsCertificateCache {
  private readonly entries = new Map<string, { at: number; cert: Promise<X509Certificate> }>();

  constructor(
    private readonly fetcher: CertificateFetcher = fetchCertificate,
    private readonly now: () => number = Date.now,
    private readonly maxEntries = 32,
    private readonly ttlMs = 3_600_000,
  ) {}

  get(url: string): Promise<X509Certificate> {
    const now = this.now();
    const hit = this.entries.get(url);
    if (hit && now - hit.at < this.ttlMs) return hit.cert;
    if (hit) this.entries.delete(url);
    const cert = this.fetcher(url).then((pem) => new X509Certificate(pem));
    cert.catch(() => {
      if (this.entries.get(url)?.cert === cert) this.entries.delete(url);
    });
    if (this.entries.size >= this.maxEntries) this.entries.delete(this.entries.keys().next().value!);
    this.entries.set(url, { at: now, cert });
    return cert;
  }
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
  return ok ? null : 'the SNS signature does not match';
}
