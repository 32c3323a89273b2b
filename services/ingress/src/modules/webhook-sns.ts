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

const SNS_HOST_RE = /^sns\.[a-z0-9-]{1,40}\.amazonaws\.com(\.cn)?$/;

/** True when `url` is an SNS signing certificate URL (strict allow-list). */
export function isSnsCertificateUrl(url: string): boolean {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return false;
  }
  return u.protocol === 'https:' && SNS_HOST_RE.test(u.hostname) && u.port === '' && !u.username && !u.password && u.pathname.endsWith('.pem') && !u.search && !u.hash;
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

/** null when `body` is an SNS message with a valid signature, else the reason. */
export async function verifySnsMessage(body: Buffer, certs: SnsCertificateCache, nowMs: number): Promise<string | null> {
  let msg: unknown;
  try {
    msg = JSON.parse(body.toString('utf8'));
  } catch {
    return 'the body is not an SNS JSON message';
  }
  if (!msg || typeof msg !== 'object' || Array.isArray(msg)) return 'the body is not an SNS JSON message';
  const m = msg as Record<string, unknown>;
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
