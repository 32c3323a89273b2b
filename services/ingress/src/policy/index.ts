import { validateTrafficPolicy, type DataPlaneConfig, type DpIpPolicy, type DpRoute } from '@warren/shared';
import type { StageDeps, StageFactory } from '../pipeline/types.js';
import { compilePolicy } from './compile.js';
import { TrafficPolicyStage } from './engine.js';
import { bindAuthActions } from './auth-actions.js';
import { breakersCompiling } from './flow-actions.js';
import { defaultJwksRegistry } from './jwt-action.js';

/**
 * The route's `traffic_policy` module as a pipeline stage, compiled once per config version;
 * null when the route has none, it is disabled, or it has no rules. Throws when the policy is
 * enabled but unusable (the control plane could not parse it, or it no longer validates).
 */
export const trafficPolicyStage: StageFactory = (route, _edge, config, deps) => {
  // Circuit breakers and JWK sets are kept for the config being compiled (carried over when unchanged), the rest dropped.
  breakersCompiling(config);
  defaultJwksRegistry.compiling(config);
  return policyStage(route, config, deps);
};

/**
 * `route`'s traffic policy as a stage, without the per-config bookkeeping of
 * {@link trafficPolicyStage}: for a route of the config being compiled, or a Bind endpoint's
 * synthetic route (`endpoint.ts`), compiled against `config` whenever that is.
 */
export function policyStage(route: DpRoute, config: DataPlaneConfig, deps: StageDeps): TrafficPolicyStage | null {
  const tp = route.trafficPolicy;
  if (!tp || !tp.enabled) return null;
  if (tp.value === null || tp.value === undefined) throw new Error(`route ${route.id}: the traffic policy is enabled but could not be parsed by the control plane`);
  const policy = validateTrafficPolicy(tp.value);
  if (policy.inbound.length === 0 && policy.outbound.length === 0) return null;
  // restrict-ips `ip_policies`: the rules of the route's account's policies in this config version.
  const ipPolicyRules = (id: string) => ownIpPolicy(config, route.accountId, id)?.rules;
  const compiled = compilePolicy(policy, route.id, ipPolicyRules);
  // oauth / openid-connect: their sign-ins on this route (throws, so 503, when one cannot run here).
  compiled.auth = bindAuthActions(compiled.inbound, route, deps.log);
  return new TrafficPolicyStage(compiled, route.id, deps);
}

/** The IP policy `id` of `config` when it is `accountId`'s; another account's is as good as missing. */
export function ownIpPolicy(config: DataPlaneConfig, accountId: string, id: string): DpIpPolicy | undefined {
  const p = config.ipPolicies?.get(id);
  return p && p.accountId === accountId ? p : undefined;
}

export { TrafficPolicyStage } from './engine.js';
export { compilePolicy, type CompiledPolicy } from './compile.js';
