/**
 * Validation of the flow-control actions `circuit-breaker` and `close-connection` (the ingress
 * runs them: `services/ingress/src/policy/flow-actions.ts`). Fields, defaults and bounds are
 * ngrok's:
 * - https://ngrok.com/docs/traffic-policy/actions/circuit-breaker/ (phase `on_http_request`,
 *   non-terminating, no result variables): `error_threshold` 0.0–1.0 (default 0.5),
 *   `volume_threshold` 1–2,000,000,000 (default 10), `window_duration` and `tripped_duration`
 *   1s–2m (default 10s), `num_buckets` fixed at 10, `enforce` (default true; false: never trips).
 * - https://ngrok.com/docs/traffic-policy/actions/close-connection/ (phases `on_http_request`
 *   and `on_tcp_connect`, terminating, no configuration fields).
 *
 * Where Warren differs, the policy is refused with a 400 rather than run differently:
 * - both actions run on `inbound` rules only (Warren's `on_http_request`; it has no
 *   `on_tcp_connect` phase);
 * - ngrok's page marks `error_threshold` "required" yet gives it a default: here it may be left
 *   out (0.5), like every other field, and `config` itself may be left out;
 * - `num_buckets` may be given, but only as 10 (ngrok: "fixed at 10");
 * - durations are Go duration strings (`"30s"`, `"1m30s"`), as everywhere in a policy.
 */
import { parseDurationNs } from './duration.js';
import { at, expectObj, noUnknownKeys, onlyInbound, parseEnforce, phaseKey, TrafficPolicyError, typeName } from './parse.js';
import type { CircuitBreakerConfig, ForwardInternalAction, PolicyDirection, TrafficPolicy } from './types.js';

export const CIRCUIT_BREAKER_LIMITS = {
  errorThresholdMin: 0,
  errorThresholdMax: 1,
  volumeThresholdMin: 1,
  volumeThresholdMax: 2_000_000_000,
  /** `window_duration` and `tripped_duration`, in ms: 1s to 2m. */
  durationMinMs: 1_000,
  durationMaxMs: 120_000,
  /** ngrok: "fixed at 10". */
  numBuckets: 10,
  /**
   * circuit-breaker actions in one policy: each is a breaker the ingress keeps per route for as
   * long as the config has it, so a policy's share is bounded.
   */
  perPolicy: 10,
} as const;

export const CIRCUIT_BREAKER_DEFAULTS = {
  error_threshold: 0.5,
  volume_threshold: 10,
  window_duration: '10s',
  tripped_duration: '10s',
  enforce: true,
} as const;

/**
 * What one run of `circuit-breaker` costs at worst (≈ ns), charged to the policy's total
 * (`parse.ts` `checkCost`): the admission check, remembering the request and, once the upstream
 * answers, one count in the current bucket and a sum over the 10 buckets. About 0.3 µs measured
 * in all; counted at 2 µs.
 */
export const CIRCUIT_BREAKER_COST = 2_000;

/** `close-connection`: destroying the socket (the kernel's work is not the policy's). */
export const CLOSE_CONNECTION_COST = 1_000;

const FIELDS = ['error_threshold', 'volume_threshold', 'window_duration', 'tripped_duration', 'num_buckets', 'enforce'] as const;

/** A duration field as written and in ms, within 1s..2m. */
function parseWindow(v: unknown, path: string, fallback: string): { text: string; ms: number } {
  if (v === undefined || v === null) v = fallback;
  if (typeof v !== 'string') throw new TrafficPolicyError(path, `must be a duration string such as "10s" or "1m30s", got ${typeName(v)} ${JSON.stringify(v)}`);
  const ns = parseDurationNs(v);
  if (ns === undefined) throw new TrafficPolicyError(path, `${JSON.stringify(v.slice(0, 64))} is not a duration; write it like "10s", "1m" or "1m30s"`);
  const L = CIRCUIT_BREAKER_LIMITS;
  if (ns < BigInt(L.durationMinMs) * 1_000_000n || ns > BigInt(L.durationMaxMs) * 1_000_000n) throw new TrafficPolicyError(path, `must be from 1s to 2m, got ${JSON.stringify(v)}`);
  return { text: v, ms: Number(ns) / 1e6 };
}

/**
 * `circuit-breaker` config (every field optional): `error_threshold` (a number 0..1, default
 * 0.5), `volume_threshold` (an integer 1..2,000,000,000, default 10), `window_duration` and
 * `tripped_duration` (1s..2m, default 10s), `num_buckets` (10 only) and `enforce` (default true).
 */
export function parseCircuitBreakerConfig(raw: unknown, path: string, direction: PolicyDirection): CircuitBreakerConfig {
  onlyInbound('circuit-breaker', path, direction, 'it decides whether the request goes upstream');
  const c = raw === undefined || raw === null ? {} : expectObj(raw, path, 'config');
  noUnknownKeys(c, path, FIELDS);
  const L = CIRCUIT_BREAKER_LIMITS;
  const D = CIRCUIT_BREAKER_DEFAULTS;

  let error_threshold: number = D.error_threshold;
  if (c.error_threshold !== undefined && c.error_threshold !== null) {
    const v = c.error_threshold;
    const p = at(path, 'error_threshold');
    if (typeof v !== 'number' || !Number.isFinite(v)) throw new TrafficPolicyError(p, `must be a number from 0.0 to 1.0 (a fraction, not a percentage), got ${typeName(v)} ${typeof v === 'number' ? v : JSON.stringify(v)}`);
    if (v < L.errorThresholdMin || v > L.errorThresholdMax) throw new TrafficPolicyError(p, `must be from 0.0 to 1.0 (a fraction, not a percentage), got ${v}`);
    error_threshold = v;
  }

  let volume_threshold: number = D.volume_threshold;
  if (c.volume_threshold !== undefined && c.volume_threshold !== null) {
    const v = c.volume_threshold;
    const p = at(path, 'volume_threshold');
    if (typeof v !== 'number' || !Number.isInteger(v)) throw new TrafficPolicyError(p, `must be an integer, got ${typeName(v)} ${JSON.stringify(v)}`);
    if (v < L.volumeThresholdMin || v > L.volumeThresholdMax) throw new TrafficPolicyError(p, `must be from ${L.volumeThresholdMin} to 2,000,000,000, got ${v}`);
    volume_threshold = v;
  }

  const window = parseWindow(c.window_duration, at(path, 'window_duration'), D.window_duration);
  const tripped = parseWindow(c.tripped_duration, at(path, 'tripped_duration'), D.tripped_duration);

  if (c.num_buckets !== undefined && c.num_buckets !== null && c.num_buckets !== L.numBuckets)
    throw new TrafficPolicyError(at(path, 'num_buckets'), `is fixed at ${L.numBuckets} (as in ngrok); leave it out or write 10, got ${JSON.stringify(c.num_buckets)}`);

  const enforce = parseEnforce(c.enforce, at(path, 'enforce'));

  return {
    error_threshold,
    volume_threshold,
    window_duration: window.text,
    tripped_duration: tripped.text,
    num_buckets: L.numBuckets,
    enforce,
    windowMs: window.ms,
    trippedMs: tripped.ms,
  };
}

/** `close-connection` config: none (absent, null or an empty mapping). */
export function parseCloseConnectionConfig(raw: unknown, path: string, direction: PolicyDirection): Record<string, never> {
  onlyInbound('close-connection', path, direction, 'it closes the connection before any response');
  if (raw === undefined || raw === null) return {};
  const c = expectObj(raw, path, 'config');
  const first = Object.keys(c)[0];
  if (first !== undefined) throw new TrafficPolicyError(at(path, first), `unknown field "${first.slice(0, 64)}"; close-connection has no configuration fields`);
  return {};
}

/** At most `CIRCUIT_BREAKER_LIMITS.perPolicy` circuit-breaker actions in a policy: a 400 naming the first one over. */
export function checkCircuitBreakerCount(policy: TrafficPolicy): void {
  const max = CIRCUIT_BREAKER_LIMITS.perPolicy;
  let n = 0;
  for (const direction of ['inbound', 'outbound'] as const) {
    policy[direction].forEach((rule, i) =>
      rule.actions.forEach((a, j) => {
        if (a.type === 'circuit-breaker' && ++n > max) throw new TrafficPolicyError(`${phaseKey(policy, direction)}[${i}].actions[${j}].type`, `too many circuit-breaker actions: a policy has at most ${max}`);
      }),
    );
  }
}

export const FORWARD_INTERNAL_LIMITS = {
  /** `url`, as written and as interpolated. */
  urlChars: 2048,
  /**
   * forward-internal steps one request may take (an internal endpoint's own policy may forward
   * again): past this, the forward fails (`on_error`), so a loop between endpoints ends.
   */
  maxDepth: 8,
} as const;

/** `forward-internal`: finding the internal endpoint (a map lookup) and, when interpolated, reading the URL. */
export const FORWARD_INTERNAL_COST = 5_000;

/**
 * The lower-case hostname of a `forward-internal` URL (`https://api.internal`,
 * `http://api.internal:8080/`), or why it is not one: http or https, a hostname, no credentials,
 * path, query or fragment (the request keeps its own path).
 */
export function forwardInternalHost(url: string): { host: string } | { problem: string } {
  if (url.length > FORWARD_INTERNAL_LIMITS.urlChars) return { problem: `is over ${FORWARD_INTERNAL_LIMITS.urlChars} characters` };
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return { problem: `${JSON.stringify(url.slice(0, 200))} is not a URL; write it like "https://api.internal"` };
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') return { problem: `must be an http or https URL, got ${JSON.stringify(u.protocol)}` };
  if (u.username || u.password) return { problem: 'must not carry credentials' };
  if ((u.pathname !== '/' && u.pathname !== '') || u.search || u.hash) return { problem: 'must name an endpoint only (no path, query or fragment: the request keeps its own)' };
  if (!u.hostname || u.hostname.startsWith('[') || /^[\d.]+$/.test(u.hostname)) return { problem: 'must name an endpoint by its hostname' };
  return { host: u.hostname.toLowerCase() };
}

/**
 * `forward-internal` config (https://ngrok.com/docs/traffic-policy/actions/forward-internal/):
 * `url` (required; `${…}` allowed, checked when the request runs; a literal one is checked
 * here) and `on_error` (`halt`, the default, or `continue`). Inbound only (ngrok's
 * `on_http_request`; Warren has no `on_tcp_connect`). `compile` compiles a `${…}` part.
 */
export function parseForwardInternalConfig(raw: unknown, path: string, direction: PolicyDirection, templated: (value: string, path: string) => boolean): ForwardInternalAction['config'] {
  onlyInbound('forward-internal', path, direction, 'it chooses where the request goes');
  const c = expectObj(raw, path, 'config');
  noUnknownKeys(c, path, ['url', 'on_error']);
  const url = c.url;
  if (url === undefined || url === null) throw new TrafficPolicyError(at(path, 'url'), 'is required');
  if (typeof url !== 'string') throw new TrafficPolicyError(at(path, 'url'), `must be a string, got ${typeName(url)}`);
  if (url.length > FORWARD_INTERNAL_LIMITS.urlChars) throw new TrafficPolicyError(at(path, 'url'), `is over ${FORWARD_INTERNAL_LIMITS.urlChars} characters`);
  if (!templated(url, at(path, 'url'))) {
    const h = forwardInternalHost(url);
    if ('problem' in h) throw new TrafficPolicyError(at(path, 'url'), h.problem);
  }
  let on_error: 'halt' | 'continue' = 'halt';
  if (c.on_error !== undefined && c.on_error !== null) {
    if (c.on_error !== 'halt' && c.on_error !== 'continue') throw new TrafficPolicyError(at(path, 'on_error'), `must be "halt" or "continue", got ${JSON.stringify(c.on_error)}`);
    on_error = c.on_error;
  }
  return { url, on_error };
}
