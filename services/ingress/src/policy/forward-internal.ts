import { FORWARD_INTERNAL_LIMITS, forwardInternalHost, type ForwardInternalAction, type PolicyDirection } from '@warren/shared';
import type { Outcome, RequestState } from '../pipeline/types.js';
import { errorAnswer } from '../http/error-page.js';
import { compileTemplate, interpolateHeader, type TextTemplate } from './headers.js';
import type { Activation } from './activation.js';

/**
 * `forward-internal` (https://ngrok.com/docs/traffic-policy/actions/forward-internal/): the
 * request goes to an internal endpoint of the route's account (an agent endpoint bound with the
 * `internal` binding, never reachable from the public listeners) instead of the route's upstream.
 * The internal endpoint's own traffic policy runs on it, on the node holding its tunnel (over a
 * hop, to itself when that is this node), and its answer comes back through this route's outbound
 * rules and modules, as an upstream's does. No later inbound action runs.
 *
 * When it cannot forward (no such endpoint online in the account, a URL that is not one, too many
 * forwards in a row), `on_error: halt` (the default) answers 503 `ERR_WARREN_7003`, and
 * `continue` lets the next action run (ngrok's custom error page pattern: a `custom-response` after
 * it). A request is forwarded at most `FORWARD_INTERNAL_LIMITS.maxDepth` times, so two endpoints
 * forwarding to each other end in that error rather than a loop.
 */

export interface CompiledForwardInternal {
  kind: 'forward-internal';
  where: string;
  url: TextTemplate;
  onError: 'halt' | 'continue';
}

export function compileForwardInternal(config: ForwardInternalAction['config'], direction: PolicyDirection, where: string): CompiledForwardInternal {
  return { kind: 'forward-internal', where, url: compileTemplate(config.url, direction), onError: config.on_error };
}

/**
 * The hop header that counts how many times a request was forwarded (set by the node that
 * forwards it, read by the node holding the internal endpoint). Public requests never carry one:
 * `x-warren-*` headers of clients are dropped, and it is read only on hops.
 */
export const FORWARD_DEPTH_HEADER = 'x-warren-forward-depth';

/** A request stage's answer that sends the request to an internal endpoint instead (see {@link isForward}). */
export interface ForwardOutcome {
  /** Not an HTTP status: this outcome is carried out by the public handler, never sent. */
  readonly status: 0;
  readonly forward: { host: string; accountId: string; depth: number };
}

export function isForward(o: NonNullable<Outcome>): o is NonNullable<Outcome> & ForwardOutcome {
  return (o as Partial<ForwardOutcome>).forward !== undefined;
}

/** Forwards the request has had before reaching this node (0 on a public request). */
function depthOf(s: RequestState): number {
  if (!s.conn) return 0;
  const v = Number(s.req.headers[FORWARD_DEPTH_HEADER] ?? 0);
  return Number.isInteger(v) && v > 0 ? v : 0;
}

/** Whether `accountId` has an internal endpoint `host` online (any node); set by the ingress. */
export type InternalEndpointLookup = (host: string, accountId: string) => boolean;

/**
 * Runs the action: the forward, or, when it cannot, the `halt` answer, or null (`continue`: the
 * error is counted and the rules go on). `failed` counts and logs the reason.
 */
export function runForwardInternal(act: Activation, a: CompiledForwardInternal, lookup: InternalEndpointLookup | undefined, failed: (where: string, err: unknown) => void): Outcome {
  const s = act.s;
  const fail = (why: string): Outcome => {
    failed(a.where, new Error(`forward-internal: ${why}`));
    return a.onError === 'halt' ? errorAnswer(s.req.headers.accept, 7003, `forward-internal: ${why}`) : null;
  };
  let url: string;
  try {
    url = interpolateHeader(a.url, (p) => p(act));
  } catch (err) {
    failed(a.where, err);
    return a.onError === 'halt' ? errorAnswer(s.req.headers.accept, 7003, 'forward-internal: its url could not be evaluated') : null;
  }
  const h = forwardInternalHost(url);
  if ('problem' in h) return fail(`the url ${h.problem}`);
  const depth = depthOf(s) + 1;
  if (depth > FORWARD_INTERNAL_LIMITS.maxDepth) return fail(`the request was forwarded ${FORWARD_INTERNAL_LIMITS.maxDepth} times already (a loop between internal endpoints?)`);
  const accountId = s.route.accountId;
  if (!lookup?.(h.host, accountId)) return fail(`no internal endpoint ${h.host} is online`);
  const out: ForwardOutcome = { status: 0, forward: { host: h.host, accountId, depth } };
  return out as NonNullable<Outcome> & ForwardOutcome;
}
