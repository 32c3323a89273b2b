import { randomBytes, randomUUID } from 'node:crypto';
import type http from 'node:http';
import { gunzipSync } from 'node:zlib';
import { createCertificate, type SelfSigned } from '../../../services/shared/src/tls/certificates.js';
import { FakeListener, FaultQueue, mediaType, playFault, readBody, resetConnection } from './http.js';

/**
 * Azure Monitor fake over **HTTPS** (docs/event-delivery.md §1 and §4): one local `node:https`
 * listener on 127.0.0.1 (port 0, addressed as `https://localhost:<port>`) that plays both
 *
 * - the Microsoft identity platform ("authority host"):
 *   `GET /<tenant>/v2.0/.well-known/openid-configuration` and the client-credentials token
 *   endpoint `POST /<tenant>/oauth2/v2.0/token` (form `grant_type=client_credentials`,
 *   `client_id`, `client_secret`, `scope=https://monitor.azure.com/.default` — the double-slash
 *   form `https://monitor.azure.com//.default` used by the Azure SDKs is accepted too), answering
 *   AAD-shaped errors (`invalid_client` 401, `invalid_scope` 400, `unauthorized_client` 400,
 *   `unsupported_grant_type` 400, `invalid_tenant` 400);
 * - the Logs Ingestion endpoint (DCE / DCR ingestion URI):
 *   `POST /dataCollectionRules/<dcrId>/streams/<stream>?api-version=2023-01-01` with
 *   `Authorization: Bearer <a token this fake issued, not expired>` (401), `Content-Type:
 *   application/json` and `Content-Encoding: gzip` (400), ≤ 1 MiB compressed and ≤ 1 MiB
 *   uncompressed (413), a JSON array of objects each with a `TimeGenerated` date (400). String
 *   field values over 64 KiB are truncated, as the service does. Success is 204.
 *
 * The server certificate (EC P-256, SAN `localhost` + `127.0.0.1`) is issued by a throwaway CA
 * made with the repo's own `createCertificate`; give `caPem` to the client (an undici `Agent`
 * with `connect: { ca }`, or `https.Agent({ ca })`). HTTPS matters because the Azure SDK pipeline
 * refuses to send a bearer token over plain http.
 *
 * "1 MB" is taken as 1 MiB (1,048,576 bytes). `@azure/monitor-ingestion` itself chunks at
 * 1,000,000 bytes of serialized rows, which is a safe target for the worker.
 */

export type AzureFault =
  | { kind: 'status'; status: 400 | 401 | 403 | 413 | 429 | 500 | 503; retryAfterSeconds?: number }
  | { kind: 'slow'; ms: number }
  | { kind: 'reset' }
  | { kind: 'accept-then-reset' };

export interface AzureRequestRecord {
  kind: 'token' | 'ingest' | 'discovery' | 'other';
  /** HTTP status answered; 0 when the connection was reset instead. */
  status: number;
  /** ingest: uncompressed body bytes (when it decompressed). */
  bytes?: number;
  /** ingest: wire (gzip) body bytes. */
  gzipBytes?: number;
  rows?: number;
  /** `${dcrId}/${stream}` of an ingest call. */
  target?: string;
  error?: string;
  fault?: AzureFault['kind'];
}

export interface AzureFake {
  url: string;
  caPem: string;
  tokenCalls: Array<{ tenant: string; clientId: string; scope: string; ok: boolean }>;
  /** accepted rows by `${dcrId}/${stream}`. */
  rows: Map<string, unknown[]>;
  requests: AzureRequestRecord[];
  fail(what: 'token' | 'ingest', fault: AzureFault, times?: number): void;
  /** make every access token issued so far expire now. */
  expireTokens(): void;
  stop(): Promise<void>;
  start(): Promise<void>;
  /** clear rows, token calls, requests and faults (issued tokens stay valid). */
  reset(): void;
  close(): Promise<void>;
}

export const AZURE_LIMITS = {
  maxCompressedBytes: 1_048_576,
  maxUncompressedBytes: 1_048_576,
  maxFieldBytes: 65_536,
  apiVersion: '2023-01-01',
  scopes: ['https://monitor.azure.com/.default', 'https://monitor.azure.com//.default'],
} as const;

let certs: Promise<{ ca: SelfSigned; server: SelfSigned }> | undefined;

/** One CA and server certificate per process (EC keys: fast to make and to handshake). */
function fakeCertificates(): Promise<{ ca: SelfSigned; server: SelfSigned }> {
  certs ??= (async () => {
    const ca = await createCertificate({ commonName: 'Warren test Azure fake CA', days: 2, ca: true, keyType: 'ec' });
    const server = await createCertificate({ commonName: 'localhost', days: 2, issuer: ca, dnsNames: ['localhost'], ipAddresses: ['127.0.0.1'], keyType: 'ec' });
    return { ca, server };
  })();
  return certs;
}

function truncateFields(row: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(row)) {
    if (typeof v === 'string' && Buffer.byteLength(v, 'utf8') > AZURE_LIMITS.maxFieldBytes) {
      out[k] = Buffer.from(v, 'utf8').subarray(0, AZURE_LIMITS.maxFieldBytes).toString('utf8').replace(/\uFFFD$/, '');
    } else {
      out[k] = v;
    }
  }
  return out;
}

export async function startAzureFake(o: { tenantId: string; clientId: string; clientSecret: string; tokenSeconds?: number }): Promise<AzureFake> {
  const { ca, server } = await fakeCertificates();
  const tokenSeconds = o.tokenSeconds ?? 3600;
  const tokenCalls: AzureFake['tokenCalls'] = [];
  const rows = new Map<string, unknown[]>();
  const requests: AzureRequestRecord[] = [];
  const faults = new FaultQueue<'token' | 'ingest', AzureFault>();
  const tokens = new Map<string, number>(); // access token -> expiry (epoch ms)
  let url = '';

  const handle = async (req: http.IncomingMessage, res: http.ServerResponse): Promise<void> => {
    const body = await readBody(req);
    const u = new URL(req.url ?? '/', 'https://localhost');
    const entry: AzureRequestRecord = { kind: 'other', status: 0 };
    requests.push(entry);
    const send = (status: number, value?: unknown, headers: Record<string, string> = {}) => {
      entry.status = status;
      const payload = value === undefined ? '' : JSON.stringify(value);
      res.writeHead(status, { ...(payload ? { 'content-type': 'application/json; charset=utf-8' } : {}), 'content-length': Buffer.byteLength(payload), 'x-ms-request-id': randomUUID(), ...headers });
      res.end(payload);
    };
    /** AAD error shape. */
    const aadError = (status: number, error: string, description: string, headers?: Record<string, string>) => {
      entry.error = error;
      send(status, { error, error_description: `${description}\r\nTrace ID: ${randomUUID()}\r\nTimestamp: ${new Date().toISOString()}`, error_codes: [], timestamp: new Date().toISOString(), trace_id: randomUUID(), correlation_id: randomUUID() }, headers);
    };
    /** Azure REST error shape. */
    const restError = (status: number, code: string, message: string, headers?: Record<string, string>) => {
      entry.error = code;
      send(status, { error: { code, message } }, headers);
    };
    /** Answers the call for a `status` fault; true when it did. */
    const answerFault = (fault: AzureFault, rest: boolean): boolean => {
      if (fault.kind === 'status') {
        const headers: Record<string, string> = {};
        if (fault.status === 429 || fault.retryAfterSeconds !== undefined) headers['retry-after'] = String(fault.retryAfterSeconds ?? 1);
        const code = ({ 400: 'BadRequest', 401: 'InvalidToken', 403: 'Forbidden', 413: 'ContentLengthLimitExceeded', 429: 'TooManyRequests', 500: 'InternalServerError', 503: 'ServiceUnavailable' } as const)[fault.status];
        if (rest) restError(fault.status, code, `injected ${fault.status}`, headers);
        else aadError(fault.status, fault.status === 401 ? 'invalid_client' : fault.status >= 500 ? 'temporarily_unavailable' : 'invalid_request', `injected ${fault.status}`, headers);
        return true;
      }
      return false;
    };

    // ------------------------------------------------------------ OpenID discovery
    const disco = /^\/([^/]+)\/v2\.0\/\.well-known\/openid-configuration$/.exec(u.pathname);
    if (disco && req.method === 'GET') {
      entry.kind = 'discovery';
      const tenant = decodeURIComponent(disco[1]!);
      if (tenant !== o.tenantId) return aadError(400, 'invalid_tenant', `AADSTS90002: Tenant '${tenant}' not found.`);
      const base = `${url}/${tenant}`;
      return send(200, {
        token_endpoint: `${base}/oauth2/v2.0/token`,
        token_endpoint_auth_methods_supported: ['client_secret_post', 'private_key_jwt', 'client_secret_basic'],
        jwks_uri: `${base}/discovery/v2.0/keys`,
        response_modes_supported: ['query', 'fragment', 'form_post'],
        subject_types_supported: ['pairwise'],
        id_token_signing_alg_values_supported: ['RS256'],
        response_types_supported: ['code', 'id_token', 'code id_token', 'id_token token'],
        scopes_supported: ['openid', 'profile', 'email', 'offline_access'],
        issuer: `${base}/v2.0`,
        request_uri_parameter_supported: false,
        userinfo_endpoint: `${url}/oidc/userinfo`,
        authorization_endpoint: `${base}/oauth2/v2.0/authorize`,
        device_authorization_endpoint: `${base}/oauth2/v2.0/devicecode`,
        http_logout_supported: true,
        frontchannel_logout_supported: true,
        end_session_endpoint: `${base}/oauth2/v2.0/logout`,
        claims_supported: ['sub', 'iss', 'aud', 'exp', 'iat', 'auth_time', 'nonce', 'tid'],
        tenant_region_scope: 'EU',
        cloud_instance_name: 'microsoftonline.com',
        cloud_graph_host_name: 'graph.windows.net',
        msgraph_host: 'graph.microsoft.com',
        rbac_url: 'https://pas.windows.net',
      });
    }

    // ------------------------------------------------------------ token endpoint
    const tok = /^\/([^/]+)\/oauth2\/v2\.0\/token$/.exec(u.pathname);
    if (tok) {
      entry.kind = 'token';
      if (req.method !== 'POST') return aadError(405, 'invalid_request', 'AADSTS900561: The endpoint only accepts POST requests.');
      const tenant = decodeURIComponent(tok[1]!);
      const form = new URLSearchParams(mediaType(req.headers['content-type']) === 'application/x-www-form-urlencoded' ? body.toString('utf8') : '');
      const clientId = form.get('client_id') ?? '';
      const scope = form.get('scope') ?? '';
      const call = { tenant, clientId, scope, ok: false };
      tokenCalls.push(call);
      const fault = await playFault(faults, 'token', entry, listener, req);
      if (fault === 'reset' || (fault && answerFault(fault, false))) return;
      if (mediaType(req.headers['content-type']) !== 'application/x-www-form-urlencoded') return aadError(400, 'invalid_request', "AADSTS900144: The request body must contain the following parameter: 'grant_type'.");
      if (tenant !== o.tenantId) return aadError(400, 'invalid_tenant', `AADSTS90002: Tenant '${tenant}' not found.`);
      if (form.get('grant_type') !== 'client_credentials') return aadError(400, 'unsupported_grant_type', `AADSTS70003: The app requested an unsupported grant type '${form.get('grant_type') ?? ''}'.`);
      if (clientId !== o.clientId) return aadError(400, 'unauthorized_client', `AADSTS700016: Application with identifier '${clientId}' was not found in the directory '${tenant}'.`);
      if (form.get('client_secret') !== o.clientSecret) return aadError(401, 'invalid_client', `AADSTS7000215: Invalid client secret provided. Ensure the secret being sent in the request is the client secret value, not the client secret ID, for a secret added to app '${clientId}'.`);
      if (!(AZURE_LIMITS.scopes as readonly string[]).includes(scope)) return aadError(400, 'invalid_scope', `AADSTS1002012: The provided value for scope ${scope} is not valid. Client credential flows must have a scope value with /.default suffixed to the resource identifier (application ID URI).`);
      const accessToken = `eyJ0eXAiOiJKV1QifQ.${randomBytes(48).toString('base64url')}.${randomBytes(32).toString('base64url')}`;
      tokens.set(accessToken, Date.now() + tokenSeconds * 1000);
      call.ok = true;
      if (fault?.kind === 'accept-then-reset') {
        entry.error = 'accept-then-reset';
        resetConnection(req);
        return;
      }
      return send(200, { token_type: 'Bearer', expires_in: Math.floor(tokenSeconds), ext_expires_in: Math.floor(tokenSeconds), access_token: accessToken });
    }

    // ------------------------------------------------------------ Logs Ingestion
    const ing = /^\/dataCollectionRules\/([^/]+)\/streams\/([^/]+)$/.exec(u.pathname);
    if (ing) {
      entry.kind = 'ingest';
      entry.gzipBytes = body.length;
      const dcr = decodeURIComponent(ing[1]!);
      const stream = decodeURIComponent(ing[2]!);
      const target = `${dcr}/${stream}`;
      entry.target = target;
      if (req.method !== 'POST') return restError(405, 'MethodNotAllowed', `method ${req.method}`);
      const apiVersion = u.searchParams.get('api-version');
      if (apiVersion !== AZURE_LIMITS.apiVersion) return restError(400, apiVersion === null ? 'MissingApiVersionParameter' : 'InvalidApiVersionParameter', `The api-version '${apiVersion ?? ''}' is invalid. The supported version is '${AZURE_LIMITS.apiVersion}'.`);
      const auth = req.headers.authorization ?? '';
      const bearer = /^Bearer (\S+)$/.exec(auth)?.[1];
      const expiry = bearer === undefined ? undefined : tokens.get(bearer);
      if (expiry === undefined || Date.now() >= expiry) {
        return restError(401, 'InvalidToken', expiry === undefined ? 'The provided access token is invalid or missing.' : 'The provided access token has expired.', { 'www-authenticate': `Bearer authorization_uri="${url}/${o.tenantId}/oauth2/v2.0/authorize", error="invalid_token"` });
      }

      // Describe the body before the fault, so a faulted call still shows its size.
      const gzip = (req.headers['content-encoding'] ?? '').toString().trim().toLowerCase() === 'gzip';
      let raw: Buffer | undefined;
      let parsed: unknown;
      if (gzip) {
        try {
          raw = gunzipSync(body);
          entry.bytes = raw.length;
          parsed = JSON.parse(raw.toString('utf8'));
          if (Array.isArray(parsed)) entry.rows = parsed.length;
        } catch {
          // answered below
        }
      }
      const fault = await playFault(faults, 'ingest', entry, listener, req);
      if (fault === 'reset' || (fault && answerFault(fault, true))) return;

      if (mediaType(req.headers['content-type']) !== 'application/json') return restError(400, 'InvalidContentType', `Content-Type must be application/json, got '${req.headers['content-type'] ?? ''}'.`);
      if (!gzip) return restError(400, 'InvalidContentEncoding', 'Content-Encoding: gzip is required.');
      if (body.length > AZURE_LIMITS.maxCompressedBytes) return restError(413, 'ContentLengthLimitExceeded', `The compressed body of ${body.length} bytes exceeds the limit of ${AZURE_LIMITS.maxCompressedBytes} bytes.`);
      if (!raw) return restError(400, 'InvalidContent', 'The body is not valid gzip.');
      if (raw.length > AZURE_LIMITS.maxUncompressedBytes) return restError(413, 'ContentLengthLimitExceeded', `The uncompressed body of ${raw.length} bytes exceeds the limit of ${AZURE_LIMITS.maxUncompressedBytes} bytes.`);
      if (parsed === undefined) return restError(400, 'InvalidContent', 'The body is not valid JSON.');
      if (!Array.isArray(parsed)) return restError(400, 'InvalidContent', 'The body must be a JSON array of rows.');
      const accepted: unknown[] = [];
      for (const [i, row] of parsed.entries()) {
        if (typeof row !== 'object' || row === null || Array.isArray(row)) return restError(400, 'InvalidContent', `Row ${i} is not a JSON object.`);
        const tg = (row as Record<string, unknown>).TimeGenerated;
        if (typeof tg !== 'string' || Number.isNaN(Date.parse(tg))) return restError(400, 'InvalidContent', `Row ${i} lacks a valid TimeGenerated.`);
        accepted.push(truncateFields(row as Record<string, unknown>));
      }
      const stored = rows.get(target) ?? [];
      stored.push(...accepted);
      rows.set(target, stored);
      if (fault?.kind === 'accept-then-reset') {
        entry.error = 'accept-then-reset';
        resetConnection(req);
        return;
      }
      return send(204);
    }

    return restError(404, 'NotFound', `no route ${req.method} ${u.pathname}`);
  };

  const listener = new FakeListener(handle, { key: server.privateKeyPem, cert: server.certificatePem });
  await listener.listen();
  url = `https://localhost:${listener.port}`;

  return {
    url,
    caPem: ca.certificatePem,
    tokenCalls,
    rows,
    requests,
    fail(what, fault, times = 1) {
      if (what !== 'token' && what !== 'ingest') throw new Error(`unknown fault target ${String(what)}`);
      faults.push(what, fault, times);
    },
    expireTokens() {
      const now = Date.now();
      for (const [t, exp] of tokens) tokens.set(t, Math.min(exp, now));
    },
    stop: () => listener.stop(),
    start: () => listener.start(),
    reset() {
      tokenCalls.length = 0;
      rows.clear();
      requests.length = 0;
      faults.clear();
    },
    close: () => listener.close(),
  };
}
