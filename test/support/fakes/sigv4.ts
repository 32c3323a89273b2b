import { createHash, timingSafeEqual } from 'node:crypto';
import type { IncomingHttpHeaders } from 'node:http';
import aws4 from 'aws4';

/**
 * Server-side AWS Signature Version 4 verification for the AWS fake (aws.ts), done with the
 * independent signer `aws4` rather than the SDK's own `@smithy/signature-v4`, so a bug in how the
 * SDK is configured (wrong region, service, secret, missing session token) cannot be hidden by
 * signing and verifying with the same code.
 *
 * The request is re-signed from exactly the headers the client named in `SignedHeaders` (aws4 is
 * told not to add or drop any: `doNotModifyHeaders` plus `extraHeadersToInclude`), the same
 * `X-Amz-Date`, method, path, query and body bytes. The SDK (3.11xx) signs
 * `amz-sdk-invocation-id;amz-sdk-request;content-length;content-type;host;x-amz-content-sha256;
 * x-amz-date;x-amz-target;x-amz-user-agent` (+ `x-amz-security-token` with temporary
 * credentials). aws4 trusts a signed `x-amz-content-sha256` as the payload hash, so that header
 * is checked against the body here first.
 */

export type SigV4FailureKind =
  | 'missing' // no Authorization header
  | 'incomplete' // malformed Authorization / X-Amz-Date
  | 'signature' // signature, signed header set or payload hash does not match
  | 'skew' // X-Amz-Date more than 5 minutes away from now
  | 'scope' // credential scope names the wrong service or an invalid region
  | 'unknown-key' // access key id not known
  | 'token' // temporary key without (or with a wrong) X-Amz-Security-Token, or a static key with one
  | 'expired'; // temporary credentials past their expiration

export interface SigV4Identity {
  secretAccessKey: string;
  /** Set for temporary credentials: the request must carry and sign exactly this token. */
  sessionToken?: string;
  /** Epoch ms after which the (temporary) credentials are refused. */
  expiresAt?: number;
}

export interface SigV4Scope {
  accessKeyId: string;
  date: string;
  region: string;
  service: string;
}

export type SigV4Result =
  | ({ ok: true; temporary: boolean } & SigV4Scope)
  | { ok: false; kind: SigV4FailureKind; message: string; scope?: SigV4Scope };

export const MAX_CLOCK_SKEW_MS = 5 * 60_000;

const AUTH_RE = /^AWS4-HMAC-SHA256\s+Credential=([^/,\s]+)\/(\d{8})\/([^/,\s]+)\/([^/,\s]+)\/aws4_request,\s*SignedHeaders=([a-z0-9\-;]+),\s*Signature=([0-9a-f]{64})$/;
const REGION_RE = /^[a-z]{2}(-[a-z]+)+-\d+$/;

function headerValue(headers: IncomingHttpHeaders, name: string): string | undefined {
  const v = headers[name];
  return Array.isArray(v) ? v.join(',') : v;
}

function amzDateToMs(d: string): number {
  return Date.UTC(+d.slice(0, 4), +d.slice(4, 6) - 1, +d.slice(6, 8), +d.slice(9, 11), +d.slice(11, 13), +d.slice(13, 15));
}

export function verifySigV4(
  req: { method?: string; url?: string; headers: IncomingHttpHeaders },
  body: Buffer,
  opts: { expectedService: string; lookup: (accessKeyId: string) => SigV4Identity | undefined; now?: number },
): SigV4Result {
  const now = opts.now ?? Date.now();
  const auth = headerValue(req.headers, 'authorization');
  if (!auth) return { ok: false, kind: 'missing', message: 'Missing Authentication Token' };
  const m = AUTH_RE.exec(auth.trim());
  if (!m) return { ok: false, kind: 'incomplete', message: `Authorization header requires 'Credential', 'SignedHeaders' and 'Signature' parameters with AWS4-HMAC-SHA256. Authorization=${auth.slice(0, 60)}` };
  const [, accessKeyId, scopeDate, region, service, signedHeaderList, signature] = m as unknown as [string, string, string, string, string, string, string];
  const scope: SigV4Scope = { accessKeyId, date: scopeDate, region, service };
  const fail = (kind: SigV4FailureKind, message: string): SigV4Result => ({ ok: false, kind, message, scope });

  const amzDate = headerValue(req.headers, 'x-amz-date');
  if (!amzDate || !/^\d{8}T\d{6}Z$/.test(amzDate)) return fail('incomplete', 'Authorization header requires existence of either a \'X-Amz-Date\' or a \'Date\' header.');

  const identity = opts.lookup(accessKeyId);
  if (!identity) return fail('unknown-key', 'The security token included in the request is invalid.');
  const token = headerValue(req.headers, 'x-amz-security-token');
  if (identity.sessionToken === undefined) {
    if (token !== undefined) return fail('token', 'The security token included in the request is invalid.');
  } else {
    if (token === undefined || token !== identity.sessionToken) return fail('token', 'The security token included in the request is invalid.');
    if (identity.expiresAt !== undefined && now >= identity.expiresAt) return fail('expired', 'The security token included in the request is expired');
  }

  if (amzDate.slice(0, 8) !== scopeDate) return fail('signature', `Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date from HTTP: '${scopeDate}' != '${amzDate.slice(0, 8)}', from '${amzDate}'.`);
  const t = amzDateToMs(amzDate);
  if (t < now - MAX_CLOCK_SKEW_MS) return fail('skew', `Signature expired: ${amzDate} is now earlier than ${isoBasic(now - MAX_CLOCK_SKEW_MS)} (${isoBasic(now)} - 5 min.)`);
  if (t > now + MAX_CLOCK_SKEW_MS) return fail('skew', `Signature not yet current: ${amzDate} is still later than ${isoBasic(now + MAX_CLOCK_SKEW_MS)} (${isoBasic(now)} + 5 min.)`);

  if (service !== opts.expectedService) return fail('scope', `Credential should be scoped to correct service: '${opts.expectedService}'. `);
  if (!REGION_RE.test(region)) return fail('scope', `Credential should be scoped to a valid region, not '${region}'. `);

  const signedNames = signedHeaderList.split(';');
  const sorted = [...signedNames].sort();
  if (signedNames.some((n, i) => n !== sorted[i]) || new Set(signedNames).size !== signedNames.length) return fail('signature', 'SignedHeaders must be sorted, lower case and unique.');
  if (!signedNames.includes('host')) return fail('signature', "'Host' must be a signed header.");
  if (!signedNames.includes('x-amz-date')) return fail('signature', "'X-Amz-Date' must be a signed header.");
  if (identity.sessionToken !== undefined && !signedNames.includes('x-amz-security-token')) return fail('signature', "'X-Amz-Security-Token' must be a signed header.");

  const headers: Record<string, string> = {};
  for (const name of signedNames) {
    const v = headerValue(req.headers, name);
    if (v === undefined) return fail('signature', `Signed header '${name}' is missing from the request.`);
    headers[name] = v;
  }
  const payloadHash = headers['x-amz-content-sha256'];
  if (payloadHash !== undefined && payloadHash !== 'UNSIGNED-PAYLOAD' && payloadHash !== createHash('sha256').update(body).digest('hex')) {
    return fail('signature', "The provided 'x-amz-content-sha256' header does not match what was computed.");
  }
  if (payloadHash === 'UNSIGNED-PAYLOAD') return fail('signature', 'UNSIGNED-PAYLOAD is not accepted by this service.');

  // Re-sign with aws4: only the signed headers, no defaults added, none of aws4's ignore list dropped.
  const signer = new aws4.RequestSigner(
    {
      method: req.method ?? 'POST',
      path: req.url ?? '/',
      host: headers.host,
      headers,
      body,
      service,
      region,
      doNotModifyHeaders: true,
      extraHeadersToInclude: Object.fromEntries(signedNames.map((n) => [n, true])),
    } as aws4.Request,
    { accessKeyId, secretAccessKey: identity.secretAccessKey, ...(identity.sessionToken !== undefined ? { sessionToken: identity.sessionToken } : {}) },
  );
  signer.datetime = amzDate;
  if (signer.signedHeaders() !== signedHeaderList) return fail('signature', `aws4 would sign '${signer.signedHeaders()}', the request signed '${signedHeaderList}'.`);
  const expected = Buffer.from(signer.signature(), 'hex');
  const given = Buffer.from(signature, 'hex');
  if (expected.length !== given.length || !timingSafeEqual(expected, given)) {
    return fail('signature', 'The request signature we calculated does not match the signature you provided. Check your AWS Secret Access Key and signing method. Consult the service documentation for details.');
  }
  return { ok: true, temporary: identity.sessionToken !== undefined, ...scope };
}

function isoBasic(ms: number): string {
  return new Date(ms).toISOString().replace(/[:-]|\.\d{3}/g, '');
}
