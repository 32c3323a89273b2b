import type { ApiRoutes } from '../../http/router.js';
import { registerCrud } from '../../http/crud.js';
import type { ModuleDeps } from '../../http/deps.js';
import { createIpPoliciesService, createIpPolicyRulesService } from './ip-policies.service.js';
import {
  IpPolicyCreate,
  IpPolicyList,
  IpPolicyResponse,
  IpPolicyRuleCreate,
  IpPolicyRuleList,
  IpPolicyRuleResponse,
  IpPolicyRuleUpdate,
  IpPolicyUpdate,
} from './ip-policies.schema.js';

const tag = 'IP policies';
const ruleTag = 'IP policy rules';

/** IP policies and their rules (wire-conventions.md §10). */
export function registerIpPolicies(routes: ApiRoutes, deps: ModuleDeps): void {
  const svc = createIpPoliciesService(deps);
  const rules = createIpPolicyRulesService(deps);

  registerCrud(
    routes,
    {
      path: '/ip_policies',
      table: 'ip_policies',
      idPrefix: 'ipp',
      tag,
      names: ['an IP policy', 'IP policies'],
      create: IpPolicyCreate,
      update: IpPolicyUpdate,
      response: IpPolicyResponse,
      list: IpPolicyList,
      summaries: { DELETE: 'Delete an IP policy and its rules' },
    },
    svc,
    deps.checkQuota,
  );

  registerCrud(
    routes,
    {
      path: '/ip_policy_rules',
      table: 'ip_policy_rules',
      idPrefix: 'ipr',
      tag: ruleTag,
      names: ['an IP policy rule', 'IP policy rules'],
      create: IpPolicyRuleCreate,
      update: IpPolicyRuleUpdate,
      response: IpPolicyRuleResponse,
      list: IpPolicyRuleList,
    },
    rules,
    deps.checkQuota,
  );
}
