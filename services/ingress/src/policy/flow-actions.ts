import type http from 'node:http';
import type { Logger } from 'pino';
import type { CircuitBreakerAction } from '@warren/shared';
import { BreakerRegistry, breakerOpen, recordBreakerResult, type CircuitBreaker, type CircuitBreakerSettings } from '../modules/circuit-breaker.js';
import type { Outcome, RequestState, UpstreamResult } from '../pipeline/types.js';
import { earlierResponsesSent } from '../http/pipelining.js';

/**
 * The traffic-policy flow-control actions at run time (validated by
 * `services/shared/src/traffic-policy/flow-actions.ts`), compiled once per config version.
 *
 * `circuit-breaker` (https://ngrok.com/docs/traffic-policy/actions/circuit-breaker/) runs the
 * breaker of the route's `circuit_breaker` module (`modules/circuit-breaker.ts`): a rolling
 * window of `window_duration` in 10 buckets counts the upstream results of the requests the
 * action let through. An error is a 5xx status from the upstream, or the upstream not reached
 * at all (no tunnel online, the agent or tunnel failed: the client got a 502/503 from the
 * ingress). A request refused by a later rule or stage, whose client went away before the
 * answer, or an Upgrade, has no result and is not counted (`'none'`: as a half-open probe it
 * frees its place at once, so such requests cannot hold the circuit open). After
 * an error, the circuit trips when the window holds at least `volume_threshold` results and
 * errors/results ≥ `error_threshold`. While tripped, a request reaching the action gets 503
 * `ERR_WARREN_7103` with `Retry-After` and no later rule runs; after `tripped_duration` one
 * request is let through as a probe: a non-5xx result closes the circuit (fresh window), an
 * error trips it again. Otherwise the action does nothing and the rules go on (non-terminating).
 * `enforce: false` makes the action do nothing at all (ngrok: it never trips). No result
 * variables (as ngrok).
 *
 * Scope: one breaker per route and action (its place, `inbound[i].actions[j]`), per ingress
 * process. It survives config versions while the action stays in its place with the same
 * settings; a policy edit that moves or changes it starts it afresh. The registry keeps exactly
 * the breakers of the config last compiled (`BreakerRegistry`, `breakersCompiling`), and a
 * policy has at most `CIRCUIT_BREAKER_LIMITS.perPolicy` of them.
 *
 * `close-connection` (https://ngrok.com/docs/traffic-policy/actions/close-connection/): the
 * client connection is destroyed without a response (`CLOSE_CONNECTION`, carried out by
 * `http/public.ts`). The public listeners speak HTTP/1.1 only, so this closes the TCP (or TLS)
 * connection, and any request pipelined behind this one on it goes too; the client sees the
 * connection reset / "socket hang up" (curl: "Empty reply from server"). On an Upgrade request
 * the socket is destroyed the same way. Terminating.
 */

export interface CompiledCircuitBreaker {
  kind: 'circuit-breaker';
  /** Null when `enforce` is false: the action does nothing. */
  breaker: CircuitBreaker | null;
  settings: CircuitBreakerSettings;
  /** For logs: `{ routeId, action }`. */
  context: Record<string, string>;
}

export interface CompiledCloseConnection {
  kind: 'close-connection';
}

/** The policy's breakers, per ingress process (see `BreakerRegistry`). */
let breakers = new BreakerRegistry();

/** `config` is being compiled: the policies' breakers are those it names from now on (see `BreakerRegistry`). */
export function breakersCompiling(config: object): void {
  breakers.compiling(config);
}

/** For tests: a registry with its own clock. Returns the one it replaces. */
export function useBreakerRegistry(registry: BreakerRegistry): BreakerRegistry {
  const before = breakers;
  breakers = registry;
  return before;
}

/** `where`: the action's place in the policy, `inbound[0].actions[1]`. */
export function compileCircuitBreaker(c: CircuitBreakerAction['config'], routeId: string, where: string): CompiledCircuitBreaker {
  const settings: CircuitBreakerSettings = {
    trippedDurationMs: c.trippedMs,
    rollingWindowMs: c.windowMs,
    numBuckets: c.num_buckets,
    volumeThreshold: c.volume_threshold,
    errorThreshold: c.error_threshold,
  };
  const breaker = c.enforce ? breakers.get(JSON.stringify([routeId, where]), settings) : null;
  return { kind: 'circuit-breaker', breaker, settings, context: { routeId, action: where } };
}

/** The breakers that let each request through, until its result comes (then dropped with it). */
const admitted = new WeakMap<RequestState, CompiledCircuitBreaker[]>();

/** Runs `circuit-breaker`: null to go on, or the 503 of an open circuit. */
export function runCircuitBreaker(a: CompiledCircuitBreaker, s: RequestState): Outcome {
  const breaker = a.breaker;
  if (!breaker) return null;
  if (!breaker.admit(s)) return breakerOpen(s, a.settings);
  const list = admitted.get(s);
  if (list) list.push(a);
  else admitted.set(s, [a]);
  return null;
}

/** The request's upstream result, counted by every breaker of the policy that let it through. */
export function recordCircuitBreakers(s: RequestState, result: UpstreamResult, log: Logger): void {
  const list = admitted.get(s);
  if (!list) return;
  admitted.delete(s);
  for (const a of list) recordBreakerResult(a.breaker!, s, result, log, a.context);
}

/** True when the rules have a `circuit-breaker` that can trip (the stage then listens for results). */
export function hasCircuitBreaker(rules: readonly { actions: readonly { kind: string }[] }[]): boolean {
  return rules.some((r) => r.actions.some((a) => a.kind === 'circuit-breaker' && (a as CompiledCircuitBreaker).breaker !== null));
}

/**
 * The request stages' answer for `close-connection`: not a response. `http/public.ts` recognises
 * it (by identity) and destroys the connection; its status, 444 (nginx's "closed without a
 * response"), is what the request metrics record.
 */
export const CLOSE_CONNECTION: NonNullable<Outcome> = Object.freeze({ status: 444 });

/**
 * Carries out `CLOSE_CONNECTION` on an HTTP/1.1 request: its connection is destroyed, nothing is
 * written for it. Responses to requests pipelined before it go out first (RFC 9112 §9.3.2: the
 * client gets what it asked for earlier), then the connection closes.
 */
export function closeConnection(req: http.IncomingMessage, res?: http.ServerResponse): number {
  const socket = req.socket;
  const earlier = earlierResponsesSent(socket, res);
  if (earlier) void earlier.then(() => socket.destroySoon());
  else socket.destroy();
  return CLOSE_CONNECTION.status;
}
