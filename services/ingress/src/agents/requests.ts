import { randomBytes } from 'node:crypto';

/**
 * Validation of the agent's RPC requests (agent-protocol.md §3). Input is untrusted JSON: every
 * function takes `unknown` and returns either a typed value or an error text for the agent.
 * Error texts carry their ERR_WARREN_ code inline (the SDK shows the text as is).
 */

export type Result<T> = { ok: true; value: T } | { ok: false; error: string };

const ok = <T>(value: T): Result<T> => ({ ok: true, value });
const fail = <T>(error: string): Result<T> => ({ ok: false, error });

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function str(v: unknown): string {
  return typeof v === 'string' ? v : '';
}

/** Caps free-form strings we keep (metadata, forwards_to): the API limits metadata to 4096 bytes. */
function clip(s: string, max: number): string {
  return Buffer.byteLength(s) <= max ? s : Buffer.from(s).subarray(0, max).toString('utf8').replace(/\uFFFD$/, '');
}

export interface AuthRequest {
  clientId: string;
  token: string;
  cookie: string;
  os: string;
  agentVersion: string;
  metadata: string;
  /** Milliseconds; 0 when the agent did not say. */
  heartbeatIntervalMs: number;
  heartbeatToleranceMs: number;
}

export function parseAuth(body: unknown): Result<AuthRequest> {
  if (!isObject(body)) return fail('malformed Auth request (ERR_WARREN_2100)');
  const extra = isObject(body.Extra) ? body.Extra : {};
  const nsToMs = (v: unknown) => (typeof v === 'number' && Number.isFinite(v) && v > 0 ? Math.round(v / 1e6) : 0);
  return ok({
    clientId: str(body.ClientId),
    token: str(extra.AuthToken),
    cookie: str(extra.Cookie),
    os: clip(str(extra.OS), 64),
    agentVersion: clip(str(extra.Version), 64),
    metadata: clip(str(extra.Metadata), 4096),
    heartbeatIntervalMs: nsToMs(extra.HeartbeatInterval),
    heartbeatToleranceMs: nsToMs(extra.HeartbeatTolerance),
  });
}

/**
 * Bind `Opts` fields we understand. Everything else is a module (OAuth, IP restrictions, basic
 * auth, …): any value other than "unset" is refused, never ignored, because it may be a
 * security control the agent's owner relies on (§3).
 */
const UNDERSTOOD_OPTS = new Set(['Domain', 'Hostname', 'Subdomain', 'LocalUrlScheme']);

/** null/absent, false, 0, '' and [] mean "not set". An object, even `{}`, enables a module. */
function isUnset(v: unknown): boolean {
  return v === null || v === undefined || v === false || v === 0 || v === '' || (Array.isArray(v) && v.length === 0);
}

/** Names of the Opts fields that ask for something we do not implement. */
export function unsupportedOpts(opts: Record<string, unknown>): string[] {
  return Object.keys(opts)
    .filter((k) => !UNDERSTOOD_OPTS.has(k) && !isUnset(opts[k]))
    .sort();
}

const LABEL = '[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?';
const HOSTNAME_RE = new RegExp(`^${LABEL}(?:\\.${LABEL})*$`);

export function isValidHostname(h: string): boolean {
  return h.length > 0 && h.length <= 253 && HOSTNAME_RE.test(h);
}

export interface BindRequest {
  /** '' for a new tunnel; the old id on reconnect. */
  id: string;
  proto: 'http' | 'https';
  hostname: string;
  forwardsTo: string;
  metadata: string;
  /** Extra.Token: proves ownership of `id` on reconnect. */
  token: string;
  bindings: string[];
  poolingEnabled: boolean;
  /** The request's Opts, echoed in the reply (§3). */
  opts: Record<string, unknown>;
}

/** Checks a Bind request and derives its hostname (Domain, else Hostname, else Subdomain or a random name under `defaultDomain`). */
export function parseBind(body: unknown, defaultDomain: string): Result<BindRequest> {
  if (!isObject(body)) return fail('malformed Bind request (ERR_WARREN_2100)');
  const proto = str(body.Proto).toLowerCase();
  if (proto !== 'http' && proto !== 'https') {
    return fail(`${proto || 'this'} endpoints are not supported by this server; use http or https (ERR_WARREN_2104)`);
  }
  const opts = isObject(body.Opts) ? body.Opts : {};
  const bad = unsupportedOpts(opts);
  if (bad.length > 0) return fail(`endpoint option${bad.length > 1 ? 's' : ''} ${bad.join(', ')} ${bad.length > 1 ? 'are' : 'is'} not supported by this server; remove ${bad.length > 1 ? 'them' : 'it'} (ERR_WARREN_2104)`);
  const extra = isObject(body.Extra) ? body.Extra : {};
  if (str(extra.IPPolicyRef) !== '') return fail('IP policy references on endpoints are not supported by this server (ERR_WARREN_2104)');

  let hostname = (str(opts.Domain) || str(opts.Hostname)).toLowerCase().replace(/\.$/, '');
  const subdomain = str(opts.Subdomain).toLowerCase();
  if (!hostname && subdomain) hostname = `${subdomain}.${defaultDomain}`;
  if (!hostname) hostname = `${randomBytes(6).toString('hex')}.${defaultDomain}`;
  if (hostname.startsWith('*.')) return fail('wildcard domains are not supported by this server (ERR_WARREN_2104)');
  if (!isValidHostname(hostname)) return fail(`invalid domain ${JSON.stringify(hostname.slice(0, 260))} (ERR_WARREN_2104)`);

  const rawBindings = Array.isArray(extra.Bindings) ? extra.Bindings : [];
  if (rawBindings.some((b) => typeof b !== 'string')) return fail('Bindings must be strings (ERR_WARREN_2102)');
  const bindings = (rawBindings as string[]).map((b) => b.toLowerCase());
  if (bindings.length > 1 || (bindings.length === 1 && bindings[0] !== 'public' && bindings[0] !== 'internal')) {
    return fail(`binding ${JSON.stringify(bindings.join(','))} is not supported; use "public" or "internal" (ERR_WARREN_2104)`);
  }

  return ok({
    id: str(body.Id),
    proto,
    hostname,
    forwardsTo: clip(str(body.ForwardsTo), 1024),
    metadata: clip(str(extra.Metadata), 4096),
    token: str(extra.Token),
    bindings,
    poolingEnabled: extra.PoolingEnabled === true,
    opts,
  });
}

export interface LabelTunnelRequest {
  labels: Record<string, string>;
  forwardsTo: string;
  metadata: string;
  /** Warren extension: resume this tunnel id (proven by `token`). */
  id: string;
  token: string;
}

/** Labels: 1–10 pairs; key 1–64 bytes without `:` or `=`; value 1–256 bytes without `=` (wire-conventions). */
export function parseLabelTunnel(body: unknown): Result<LabelTunnelRequest> {
  if (!isObject(body)) return fail('malformed StartTunnelWithLabel request (ERR_WARREN_2100)');
  if (!isObject(body.Labels)) return fail('a labeled tunnel needs labels (ERR_WARREN_6100)');
  const entries = Object.entries(body.Labels);
  if (entries.length < 1 || entries.length > 10) return fail('a labeled tunnel needs 1 to 10 labels (ERR_WARREN_6100)');
  const labels: Record<string, string> = {};
  for (const [k, v] of entries) {
    if (typeof v !== 'string') return fail(`label ${JSON.stringify(k.slice(0, 64))} must have a string value (ERR_WARREN_6100)`);
    const kb = Buffer.byteLength(k);
    const vb = Buffer.byteLength(v);
    if (kb < 1 || kb > 64 || /[:=]/.test(k)) return fail(`invalid label name ${JSON.stringify(k.slice(0, 64))}: 1-64 bytes without ':' or '=' (ERR_WARREN_6100)`);
    if (vb < 1 || vb > 256 || v.includes('=')) return fail(`invalid value for label ${JSON.stringify(k)}: 1-256 bytes without '=' (ERR_WARREN_6100)`);
    labels[k] = v;
  }
  return ok({ labels, forwardsTo: clip(str(body.ForwardsTo), 1024), metadata: clip(str(body.Metadata), 4096), id: str(body.Id), token: str(body.Token) });
}
