import { randomBytes } from 'node:crypto';
import { MAX_TRAFFIC_POLICY_BYTES, TrafficPolicyError, decodeTrafficPolicy, parseTrafficPolicy, restrictIpsPolicyRefs } from '@warren/shared';

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

/**
 * The most the agent server keeps of the agent's free-form strings, in UTF-8 bytes. They are
 * reported to the control plane and sent again in every full sync of the node (AgentServer
 * `maxReportBytes`), so they are bounded; a value over its limit is refused with an error naming
 * the field and the limit (never shortened: a cut value would be reported as if the agent had
 * sent it). Metadata has the API's limit for metadata (ERR_WARREN_5001); the others 5003.
 */
export const FIELD_LIMITS = {
  /** Auth `Extra.Metadata` (the SDK's session metadata). */
  sessionMetadata: 4096,
  /** Bind `Extra.Metadata` and StartTunnelWithLabel `Metadata`. */
  tunnelMetadata: 4096,
  /** Bind and StartTunnelWithLabel `ForwardsTo`. */
  forwardsTo: 1024,
  /** Auth `Extra.OS`. */
  os: 64,
  /** Auth `Extra.Version` (the agent's version). */
  agentVersion: 64,
} as const;

/**
 * `v` as a string (anything else is ''), or the refusal when it is over `max` bytes: `what` names
 * the field as the agent's owner knows it, `wire` as it is sent.
 */
function bounded(v: unknown, max: number, what: string, wire: string, code: 5001 | 5003): Result<string> {
  const s = str(v);
  const n = Buffer.byteLength(s);
  if (n <= max) return ok(s);
  return fail(`${what} (${wire}) is ${n} bytes, over the limit of ${max} bytes; send at most ${max} (ERR_WARREN_${code})`);
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
  const metadata = bounded(extra.Metadata, FIELD_LIMITS.sessionMetadata, 'session metadata', 'Auth Extra.Metadata', 5001);
  if (!metadata.ok) return metadata;
  const os = bounded(extra.OS, FIELD_LIMITS.os, 'the agent OS', 'Auth Extra.OS', 5003);
  if (!os.ok) return os;
  const agentVersion = bounded(extra.Version, FIELD_LIMITS.agentVersion, 'the agent version', 'Auth Extra.Version', 5003);
  if (!agentVersion.ok) return agentVersion;
  return ok({
    clientId: str(body.ClientId),
    token: str(extra.AuthToken),
    cookie: str(extra.Cookie),
    os: os.value,
    agentVersion: agentVersion.value,
    metadata: metadata.value,
    heartbeatIntervalMs: nsToMs(extra.HeartbeatInterval),
    heartbeatToleranceMs: nsToMs(extra.HeartbeatTolerance),
  });
}

/**
 * Bind `Opts` fields we understand. Everything else is a module (OAuth, IP restrictions, basic
 * auth, …): any value other than "unset" is refused, never ignored, because it may be a
 * security control the agent's owner relies on (§3).
 */
const UNDERSTOOD_OPTS = new Set(['Domain', 'Hostname', 'Subdomain', 'LocalUrlScheme', 'TrafficPolicy']);

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

/**
 * An endpoint's traffic policy (Bind `Opts.TrafficPolicy`, the SDK's `traffic_policy` option),
 * validated as the API validates a route's `traffic_policy.value` (`parseTrafficPolicy`: syntax,
 * shape, CEL, cost).
 */
export interface BindTrafficPolicy {
  /** The decoded document (plain JSON), as a route's policy travels to the ingress (`DpRoute.trafficPolicy.value`). */
  document: unknown;
  /** The IP policies its restrict-ips actions name, with their places in the document (checked against the account's on Bind). */
  ipPolicyRefs: { path: string; id: string }[];
}

const TP_WIRE = 'Bind Opts.TrafficPolicy';

/**
 * `Opts.TrafficPolicy`: absent, null or '' → no policy (null); a YAML or JSON document → the
 * validated policy; one without any rule → null (nothing to run). The deprecated `policy` option
 * of the SDK sends the policy as a structured object (in `TrafficPolicy`, or `Policy` with older
 * SDKs): refused, naming the option to use instead.
 */
export function parseBindTrafficPolicy(opts: Record<string, unknown>): Result<BindTrafficPolicy | null> {
  const deprecated = 'the deprecated policy option (a structured policy object) is not supported by this server; pass the policy document as YAML or JSON with the traffic_policy option (trafficPolicy() on the builder) instead (ERR_WARREN_2104)';
  if (!isUnset(opts.Policy)) return fail(deprecated);
  const raw = opts.TrafficPolicy;
  if (raw === null || raw === undefined || raw === '') return ok(null);
  if (isObject(raw)) return fail(deprecated);
  if (typeof raw !== 'string') return fail(`the traffic policy (${TP_WIRE}) must be a string holding a YAML or JSON document (ERR_WARREN_2102)`);
  const n = Buffer.byteLength(raw);
  if (n > MAX_TRAFFIC_POLICY_BYTES) return fail(`the traffic policy (${TP_WIRE}) is ${n} bytes, over the limit of ${MAX_TRAFFIC_POLICY_BYTES} bytes; send at most ${MAX_TRAFFIC_POLICY_BYTES} (ERR_WARREN_5003)`);
  try {
    const policy = parseTrafficPolicy(raw);
    if (policy.inbound.length === 0 && policy.outbound.length === 0) return ok(null);
    return ok({ document: decodeTrafficPolicy(raw), ipPolicyRefs: restrictIpsPolicyRefs(policy) });
  } catch (err) {
    if (err instanceof TrafficPolicyError) return fail(`invalid traffic policy (${TP_WIRE}): ${err.message.slice(0, 1000)} (ERR_WARREN_6900)`);
    // Never an exception out of Bind handling: the ingress serves every tenant.
    return fail(`the traffic policy (${TP_WIRE}) could not be read: ${String((err as Error)?.message ?? err).slice(0, 300)} (ERR_WARREN_6900)`);
  }
}

/**
 * The size of the traffic policy a Bind request carries (Opts.TrafficPolicy, or the deprecated
 * Opts.Policy), bytes, as {@link parseBindTrafficPolicy} will read it (absent, null or '': none);
 * 0 when it carries none. A value that is not a string (refused when parsed) counts 1.
 */
export function bindTrafficPolicyBytes(body: unknown): number {
  if (!isObject(body) || !isObject(body.Opts)) return 0;
  let n = 0;
  for (const v of [body.Opts.TrafficPolicy, body.Opts.Policy]) {
    if (v === undefined || v === null || v === '') continue;
    n += typeof v === 'string' ? Buffer.byteLength(v) : 1;
  }
  return n;
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
  /** Opts.TrafficPolicy, validated; null when none (or it has no rules). */
  trafficPolicy: BindTrafficPolicy | null;
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
  // Before the generic refusal, which would only name the field.
  if (!isUnset(opts.Policy)) {
    const p = parseBindTrafficPolicy(opts);
    if (!p.ok) return p;
  }
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

  const forwardsTo = bounded(body.ForwardsTo, FIELD_LIMITS.forwardsTo, 'forwards_to', 'Bind ForwardsTo', 5003);
  if (!forwardsTo.ok) return forwardsTo;
  const metadata = bounded(extra.Metadata, FIELD_LIMITS.tunnelMetadata, 'tunnel metadata', 'Bind Extra.Metadata', 5001);
  if (!metadata.ok) return metadata;
  // Last: the most expensive check (parsing and costing the document).
  const trafficPolicy = parseBindTrafficPolicy(opts);
  if (!trafficPolicy.ok) return trafficPolicy;

  return ok({
    id: str(body.Id),
    proto,
    hostname,
    forwardsTo: forwardsTo.value,
    metadata: metadata.value,
    token: str(extra.Token),
    bindings,
    poolingEnabled: extra.PoolingEnabled === true,
    trafficPolicy: trafficPolicy.value,
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
  const forwardsTo = bounded(body.ForwardsTo, FIELD_LIMITS.forwardsTo, 'forwards_to', 'StartTunnelWithLabel ForwardsTo', 5003);
  if (!forwardsTo.ok) return forwardsTo;
  const metadata = bounded(body.Metadata, FIELD_LIMITS.tunnelMetadata, 'tunnel metadata', 'StartTunnelWithLabel Metadata', 5001);
  if (!metadata.ok) return metadata;
  return ok({ labels, forwardsTo: forwardsTo.value, metadata: metadata.value, id: str(body.Id), token: str(body.Token) });
}
