import type { ApiRoutes } from '../../http/router.js';
import type { ModuleDeps } from '../../http/deps.js';
import { parseBody } from '../../http/validate.js';
import { parsePage } from '../../http/paginate.js';
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

  routes.route(
    '/ip_policies',
    {
      POST: async (req) => ({ status: 201, body: await svc.create(req.ctx, parseBody(IpPolicyCreate, req.body)) }),
      GET: async (req) => ({ status: 200, body: await svc.list(req.ctx, parsePage(req.query, 'ipp')) }),
    },
    {
      POST: { tag, summary: 'Create an IP policy', request: IpPolicyCreate, response: IpPolicyResponse, status: 201 },
      GET: { tag, summary: 'List IP policies', response: IpPolicyList, status: 200, paged: true },
    },
  );
  routes.route(
    '/ip_policies/:id',
    {
      GET: async (req) => ({ status: 200, body: await svc.get(req.ctx, req.params.id!) }),
      PATCH: async (req) => ({ status: 200, body: await svc.update(req.ctx, req.params.id!, parseBody(IpPolicyUpdate, req.body)) }),
      DELETE: async (req) => {
        await svc.delete(req.ctx, req.params.id!);
        return { status: 204 };
      },
    },
    {
      GET: { tag, summary: 'Get an IP policy', response: IpPolicyResponse, status: 200 },
      PATCH: { tag, summary: 'Update an IP policy', request: IpPolicyUpdate, response: IpPolicyResponse, status: 200 },
      DELETE: { tag, summary: 'Delete an IP policy and its rules', status: 204 },
    },
  );

  routes.route(
    '/ip_policy_rules',
    {
      POST: async (req) => ({ status: 201, body: await rules.create(req.ctx, parseBody(IpPolicyRuleCreate, req.body)) }),
      GET: async (req) => ({ status: 200, body: await rules.list(req.ctx, parsePage(req.query, 'ipr')) }),
    },
    {
      POST: { tag: ruleTag, summary: 'Create an IP policy rule', request: IpPolicyRuleCreate, response: IpPolicyRuleResponse, status: 201 },
      GET: { tag: ruleTag, summary: 'List IP policy rules', response: IpPolicyRuleList, status: 200, paged: true },
    },
  );
  routes.route(
    '/ip_policy_rules/:id',
    {
      GET: async (req) => ({ status: 200, body: await rules.get(req.ctx, req.params.id!) }),
      PATCH: async (req) => ({ status: 200, body: await rules.update(req.ctx, req.params.id!, parseBody(IpPolicyRuleUpdate, req.body)) }),
      DELETE: async (req) => {
        await rules.delete(req.ctx, req.params.id!);
        return { status: 204 };
      },
    },
    {
      GET: { tag: ruleTag, summary: 'Get an IP policy rule', response: IpPolicyRuleResponse, status: 200 },
      PATCH: { tag: ruleTag, summary: 'Update an IP policy rule', request: IpPolicyRuleUpdate, response: IpPolicyRuleResponse, status: 200 },
      DELETE: { tag: ruleTag, summary: 'Delete an IP policy rule', status: 204 },
    },
  );
}
