import { AppError, newId, notFound, rfc3339 } from '@warren/shared';
import type { z } from 'zod';
import type { Db, Queryable } from '../../db/pool.js';
import type { RequestContext } from '../../http/context.js';
import { envelope, type Page } from '../../http/paginate.js';
import { audit } from '../../events/outbox.js';
import { optionalStrings, ref } from '../common.js';
import { parseCidr } from './cidr.js';
import { ipPoliciesRepo as repo, ipPolicyRulesRepo as rules, type IpPolicyRow, type IpPolicyRuleRow } from './ip-policies.repo.js';
import {
  MAX_RULES_PER_POLICY,
  type IpPolicy,
  type IpPolicyCreate,
  type IpPolicyRule,
  type IpPolicyRuleCreate,
  type IpPolicyRuleUpdate,
  type IpPolicyUpdate,
} from './ip-policies.schema.js';

export const IP_POLICIES = 'ip_policies';
export const IP_POLICY_RULES = 'ip_policy_rules';
const EVENT = 'ip_policy';
const RULE_EVENT = 'ip_policy_rule';

export function toIpPolicy(row: IpPolicyRow, baseUrl: string): IpPolicy {
  return {
    id: row.id,
    uri: `${baseUrl}/${IP_POLICIES}/${row.id}`,
    created_at: rfc3339(row.created_at),
    ...optionalStrings({ description: row.description, metadata: row.metadata }),
  };
}

export function toIpPolicyRule(row: IpPolicyRuleRow, baseUrl: string): IpPolicyRule {
  return {
    id: row.id,
    uri: `${baseUrl}/${IP_POLICY_RULES}/${row.id}`,
    created_at: rfc3339(row.created_at),
    ...optionalStrings({ description: row.description, metadata: row.metadata }),
    cidr: row.cidr,
    ip_policy: ref(baseUrl, IP_POLICIES, row.ip_policy_id),
    action: row.action,
  };
}

/** A CIDR the schema already accepted, in canonical form. */
function canonicalCidr(s: string): string {
  const r = parseCidr(s);
  if (!r.ok) throw new AppError(6700, `cidr: ${r.message}`, { field: 'cidr' });
  return r.canonical;
}

const isUniqueViolation = (err: unknown) => (err as { code?: string }).code === '23505';

async function duplicateRule(q: Queryable, policyId: string, cidr: string, exceptId?: string): Promise<AppError | undefined> {
  const { rows } = await q.query<{ id: string; cidr: string }>(
    'SELECT id, cidr::text AS cidr FROM ip_policy_rules WHERE ip_policy_id = $1 AND cidr = $2::cidr AND id <> $3 LIMIT 1',
    [policyId, cidr, exceptId ?? ''],
  );
  const hit = rows[0];
  return hit ? new AppError(4101, `cidr: IP policy ${policyId} already has rule ${hit.id} for ${hit.cidr}`, { field: 'cidr', resourceId: hit.id }) : undefined;
}

export function createIpPoliciesService(deps: { db: Db }) {
  const { db } = deps;
  return {
    async create(ctx: RequestContext, input: z.output<typeof IpPolicyCreate>): Promise<IpPolicy> {
      return db.tx(async (q) => {
        const row = await repo.insert(q, { id: newId('ipp'), account_id: ctx.auth.accountId, description: input.description ?? '', metadata: input.metadata ?? '' });
        const out = toIpPolicy(row, ctx.baseUrl);
        await audit(q, ctx, EVENT, 'created', out);
        return out;
      });
    },

    async get(ctx: RequestContext, id: string): Promise<IpPolicy> {
      const row = await repo.get(db, ctx.auth.accountId, id);
      if (!row) throw notFound('IP policy', id);
      return toIpPolicy(row, ctx.baseUrl);
    },

    async list(ctx: RequestContext, page: Page) {
      const rows = await repo.list(db, ctx.auth.accountId, page);
      return envelope(IP_POLICIES, `${ctx.baseUrl}/${IP_POLICIES}`, rows.map((r) => toIpPolicy(r, ctx.baseUrl)), page);
    },

    async update(ctx: RequestContext, id: string, input: z.output<typeof IpPolicyUpdate>): Promise<IpPolicy> {
      return db.tx(async (q) => {
        const before = await repo.get(q, ctx.auth.accountId, id, true);
        if (!before) throw notFound('IP policy', id);
        const next = { description: input.description ?? before.description, metadata: input.metadata ?? before.metadata };
        if (next.description === before.description && next.metadata === before.metadata) return toIpPolicy(before, ctx.baseUrl);
        const row = (await repo.update(q, ctx.auth.accountId, id, next))!;
        const out = toIpPolicy(row, ctx.baseUrl);
        await audit(q, ctx, EVENT, 'updated', out);
        return out;
      });
    },

    /** Deletes the policy and its rules; each rule gets its own `ip_policy_rule_deleted` event. */
    async delete(ctx: RequestContext, id: string): Promise<void> {
      await db.tx(async (q) => {
        const before = await repo.get(q, ctx.auth.accountId, id, true);
        if (!before) throw notFound('IP policy', id);
        const routes = await repo.referencingRoutes(q, id);
        if (routes.length > 0) {
          const where = routes.map((r) => `${r.via === 'module' ? 'the ip_restriction module' : "a restrict-ips action's ip_policies in the traffic policy"} of route ${r.route_id} (edge ${r.edge_id})`);
          throw new AppError(4100, `the IP policy is listed by ${where.join(', ')}; remove it there first`, { resourceId: id });
        }
        const cascaded = await rules.listByPolicy(q, id);
        await repo.delete(q, ctx.auth.accountId, id);
        for (const rule of cascaded)
          await audit(q, ctx, RULE_EVENT, 'deleted', toIpPolicyRule(rule, ctx.baseUrl));
        await audit(q, ctx, EVENT, 'deleted', toIpPolicy(before, ctx.baseUrl));
      });
    },
  };
}

export function createIpPolicyRulesService(deps: { db: Db }) {
  const { db } = deps;
  return {
    async create(ctx: RequestContext, input: z.output<typeof IpPolicyRuleCreate>): Promise<IpPolicyRule> {
      const cidr = canonicalCidr(input.cidr);
      return db.tx(async (q) => {
        // Locking the policy serializes rule changes per policy: the count and the uniqueness
        // check below cannot race.
        const policy = await repo.get(q, ctx.auth.accountId, input.ip_policy_id, true);
        if (!policy)
          throw new AppError(3002, `ip_policy_id: no IP policy with id ${JSON.stringify(input.ip_policy_id)} in this account`, {
            field: 'ip_policy_id',
            resourceId: input.ip_policy_id,
          });
        const dup = await duplicateRule(q, policy.id, cidr);
        if (dup) throw dup;
        if ((await rules.countByPolicy(q, policy.id)) >= MAX_RULES_PER_POLICY)
          throw new AppError(6701, `IP policy ${policy.id} already has the maximum of ${MAX_RULES_PER_POLICY} rules`, { field: 'ip_policy_id', resourceId: policy.id });
        let row: IpPolicyRuleRow;
        try {
          row = await rules.insert(q, {
            id: newId('ipr'),
            account_id: ctx.auth.accountId,
            ip_policy_id: policy.id,
            cidr,
            action: input.action,
            description: input.description ?? '',
            metadata: input.metadata ?? '',
          });
        } catch (err) {
          if (isUniqueViolation(err)) throw new AppError(4101, `cidr: IP policy ${policy.id} already has a rule for ${cidr}`, { field: 'cidr' });
          throw err;
        }
        const out = toIpPolicyRule(row, ctx.baseUrl);
        await audit(q, ctx, RULE_EVENT, 'created', out);
        return out;
      });
    },

    async get(ctx: RequestContext, id: string): Promise<IpPolicyRule> {
      const row = await rules.get(db, ctx.auth.accountId, id);
      if (!row) throw notFound('IP policy rule', id);
      return toIpPolicyRule(row, ctx.baseUrl);
    },

    async list(ctx: RequestContext, page: Page) {
      const rows = await rules.list(db, ctx.auth.accountId, page);
      return envelope(IP_POLICY_RULES, `${ctx.baseUrl}/${IP_POLICY_RULES}`, rows.map((r) => toIpPolicyRule(r, ctx.baseUrl)), page);
    },

    async update(ctx: RequestContext, id: string, input: z.output<typeof IpPolicyRuleUpdate>): Promise<IpPolicyRule> {
      const cidr = input.cidr == null ? undefined : canonicalCidr(input.cidr);
      return db.tx(async (q) => {
        const peek = await rules.get(q, ctx.auth.accountId, id);
        if (!peek) throw notFound('IP policy rule', id);
        // Same lock order as create: the policy first, then the rule.
        await repo.get(q, ctx.auth.accountId, peek.ip_policy_id, true);
        const before = await rules.get(q, ctx.auth.accountId, id, true);
        if (!before) throw notFound('IP policy rule', id);
        const next = {
          cidr: cidr === undefined ? before.cidr : await rules.canonicalCidr(q, cidr),
          description: input.description ?? before.description,
          metadata: input.metadata ?? before.metadata,
        };
        if (next.cidr === before.cidr && next.description === before.description && next.metadata === before.metadata) return toIpPolicyRule(before, ctx.baseUrl);
        if (next.cidr !== before.cidr) {
          const dup = await duplicateRule(q, before.ip_policy_id, next.cidr, id);
          if (dup) throw dup;
        }
        let row: IpPolicyRuleRow;
        try {
          row = (await rules.update(q, ctx.auth.accountId, id, next))!;
        } catch (err) {
          if (isUniqueViolation(err)) throw new AppError(4101, `cidr: IP policy ${before.ip_policy_id} already has a rule for ${next.cidr}`, { field: 'cidr' });
          throw err;
        }
        const out = toIpPolicyRule(row, ctx.baseUrl);
        await audit(q, ctx, RULE_EVENT, 'updated', out);
        return out;
      });
    },

    async delete(ctx: RequestContext, id: string): Promise<void> {
      await db.tx(async (q) => {
        const row = await rules.delete(q, ctx.auth.accountId, id);
        if (!row) throw notFound('IP policy rule', id);
        await audit(q, ctx, RULE_EVENT, 'deleted', toIpPolicyRule(row, ctx.baseUrl));
      });
    },
  };
}
