import type { DataPlaneConfig, DpEdge, DpRoute, Logger } from '@warren/shared';
import type { BindTrafficPolicy } from '../agents/requests.js';
import type { CompiledRoute } from '../http/routing.js';
import { errorAnswer } from '../http/error-page.js';
import { RoutePipeline } from '../pipeline/runner.js';
import type { StageDeps } from '../pipeline/types.js';
import { ownIpPolicy, policyStage } from './index.js';

/**
 * Traffic policies of Bind endpoints (the SDK's `traffic_policy` option, Bind `Opts.TrafficPolicy`).
 * An endpoint's policy runs as a route's does (`RoutePipeline`, `TrafficPolicyStage`) under a
 * synthetic edge and route of its own: id = the tunnel id, account = the tunnel's, hostports =
 * `<hostname>:443`, no modules. So its rate-limit buckets and circuit breakers are keyed by the
 * tunnel id (never shared with another endpoint or account), and its restrict-ips `ip_policies`
 * resolve only to IP policies of the tunnel's account.
 *
 * The policy lives with the local tunnel (`LocalTunnel.trafficPolicy`) on the node holding the
 * agent's session, and runs there: on the public request path when that node receives the request,
 * or on a hop when another node does (`PublicHandler.serveHop`). Exactly once per request, with
 * the public client's address.
 */

export interface EndpointPolicyRequest {
  tunnelId: string;
  accountId: string;
  hostname: string;
  policy: BindTrafficPolicy;
}

export type EndpointPolicyResult = { ok: true; value: EndpointPolicy } | { ok: false; error: string };

/** One endpoint's policy, compiled. `cr` changes when a config change recompiles it. */
export class EndpointPolicy {
  constructor(
    readonly request: EndpointPolicyRequest,
    public cr: CompiledRoute,
    /** What it was compiled against: the IP policies it names, as in that config ({@link ipPolicyFingerprint}). */
    public compiledAgainst: string,
  ) {}

  /** The policy names IP policies of the config: recompiled when the config changes. */
  get dependsOnConfig(): boolean {
    return this.request.policy.ipPolicyRefs.length > 0;
  }
}

/** The synthetic edge and route an endpoint's policy runs under. */
export function endpointEdgeAndRoute(r: EndpointPolicyRequest): { edge: DpEdge; route: DpRoute } {
  const edge: DpEdge = { id: r.tunnelId, accountId: r.accountId, hostports: [`${r.hostname}:443`], mutualTls: null, tlsTermination: null };
  const route: DpRoute = {
    id: r.tunnelId,
    accountId: r.accountId,
    edgeId: r.tunnelId,
    matchType: 'path_prefix',
    match: '/',
    modules: {},
    backendId: null,
    ipPolicyIds: [],
    trafficPolicy: { enabled: true, value: r.policy.document },
  };
  return { edge, route };
}

/**
 * The IP policies `r` names as `config` has them (their account and rules, in the order named):
 * a config change that leaves this the same needs no recompile.
 */
function ipPolicyFingerprint(r: EndpointPolicyRequest, config: DataPlaneConfig): string {
  if (r.policy.ipPolicyRefs.length === 0) return '';
  return JSON.stringify(r.policy.ipPolicyRefs.map((ref) => {
    const p = config.ipPolicies?.get(ref.id);
    return p ? [p.accountId, p.rules] : null;
  }));
}

/** Throws when the policy cannot be compiled against `config` (an IP policy gone, …). */
function compileRoute(r: EndpointPolicyRequest, config: DataPlaneConfig, deps: StageDeps): CompiledRoute {
  const { edge, route } = endpointEdgeAndRoute(r);
  const stage = policyStage(route, config, deps);
  return { route, edge, host: null, path: '/', exact: false, backend: null, pipeline: stage ? new RoutePipeline([stage]) : null };
}

const WIRE = 'Bind Opts.TrafficPolicy';

/**
 * Compiles an endpoint's policy at Bind, or says why the Bind is refused: an IP policy it names
 * is not one of the account's (as the API answers for a route, 3002), or it cannot run here.
 */
export function compileEndpointPolicy(r: EndpointPolicyRequest, config: DataPlaneConfig | null, deps: StageDeps): EndpointPolicyResult {
  if (!config) return { ok: false, error: 'this ingress node has no configuration yet; retry shortly (ERR_WARREN_7008)' };
  const missing = r.policy.ipPolicyRefs.find((ref) => !ownIpPolicy(config, r.accountId, ref.id));
  if (missing) return { ok: false, error: `invalid traffic policy (${WIRE}): ${missing.path}: no IP policy with id ${JSON.stringify(missing.id.slice(0, 64))} in this account (ERR_WARREN_3002)` };
  try {
    const cr = compileRoute(r, config, deps);
    if (!cr.pipeline) return { ok: false, error: `the traffic policy (${WIRE}) has no rules to run (ERR_WARREN_6900)` };
    return { ok: true, value: new EndpointPolicy(r, cr, ipPolicyFingerprint(r, config)) };
  } catch (err) {
    return { ok: false, error: `the traffic policy (${WIRE}) cannot be applied: ${String((err as Error)?.message ?? err).slice(0, 500)} (ERR_WARREN_6900)` };
  }
}

/**
 * After a config change: the policies whose IP policies changed are compiled again (new rules, a
 * policy deleted); the others are left alone, so a config change costs a lookup per endpoint
 * that names IP policies, not a compile (an audit: 300 endpoints of 60 KB policies stalled a node
 * for 3.8 s on every change). One that no longer compiles answers every request with 503
 * (ERR_WARREN_7010), a security control never skipped, and is returned: the caller stops its
 * tunnel (StopTunnel), since the API removed what the endpoint depends on.
 */
export function recompileEndpointPolicies(policies: Iterable<EndpointPolicy>, config: DataPlaneConfig, deps: StageDeps, log: Logger): Array<{ tunnelId: string; message: string }> {
  const broken: Array<{ tunnelId: string; message: string }> = [];
  for (const ep of policies) {
    if (!ep.dependsOnConfig) continue;
    const now = ipPolicyFingerprint(ep.request, config);
    if (now === ep.compiledAgainst) continue;
    ep.compiledAgainst = now;
    try {
      const cr = compileRoute(ep.request, config, deps);
      if (cr.pipeline) ep.cr = cr;
    } catch (err) {
      const message = String((err as Error)?.message ?? err);
      log.error({ tunnel: ep.request.tunnelId, err: message }, 'endpoint traffic policy not applicable to the new configuration; its tunnel is stopped');
      ep.cr = { ...ep.cr, pipeline: new RoutePipeline([{ name: 'unavailable', onRequest: () => errorAnswer(undefined, 7010, `this endpoint's traffic policy cannot be applied: ${message}`) }]) };
      broken.push({ tunnelId: ep.request.tunnelId, message });
    }
  }
  return broken;
}
