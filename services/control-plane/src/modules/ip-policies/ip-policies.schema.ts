import { z } from 'zod';
import { IP_POLICY_MAX_RULES } from '@warren/shared';
import { description, metadata, obj, refId } from '../../http/validate.js';
import { RefSchema } from '../common.js';
import { parseCidr } from './cidr.js';

export const IpPolicyCreate = obj({
  description: description().nullish(),
  metadata: metadata().nullish(),
});

export const IpPolicyUpdate = obj({
  id: z.string().nullish().describe('ignored; sent by the official clients'),
  description: description().nullish(),
  metadata: metadata().nullish(),
});

export const IpPolicyResponse = z.object({
  id: z.string(),
  uri: z.string(),
  created_at: z.string(),
  description: z.string().optional(),
  metadata: z.string().optional(),
});
export type IpPolicy = z.infer<typeof IpPolicyResponse>;

export const IpPolicyList = z.object({ ip_policies: z.array(IpPolicyResponse), uri: z.string(), next_page_uri: z.string().nullable() });

export const RULE_ACTIONS = ['allow', 'deny'] as const;
/** Shared with the traffic policy, which charges a restrict-ips `ip_policies` entry at this many CIDRs. */
export const MAX_RULES_PER_POLICY = IP_POLICY_MAX_RULES;

const cidr = () =>
  z
    .string()
    .superRefine((s, ctx) => {
      const r = parseCidr(s);
      if (!r.ok) ctx.addIssue({ code: 'custom', message: r.message, params: { code: 6700 } });
    })
    .describe('IPv4 or IPv6 range in CIDR notation with an explicit prefix length and no host bits set, e.g. 203.0.113.0/24');

export const IpPolicyRuleCreate = obj({
  description: description().nullish(),
  metadata: metadata().nullish(),
  cidr: cidr(),
  ip_policy_id: refId('ipp').describe('IP policy (ipp_) of this account the rule belongs to'),
  // string first, so a missing action is 2103 (required) rather than 2104 (value not allowed)
  action: z
    .string()
    .pipe(z.enum(RULE_ACTIONS, { error: `action must be one of ${RULE_ACTIONS.join(', ')}` }))
    .meta({ enum: [...RULE_ACTIONS], description: 'allow or deny' }),
});

export const IpPolicyRuleUpdate = obj({
  id: z.string().nullish().describe('ignored; sent by the official clients'),
  description: description().nullish(),
  metadata: metadata().nullish(),
  cidr: cidr().nullish(),
});

export const IpPolicyRuleResponse = z.object({
  id: z.string(),
  uri: z.string(),
  created_at: z.string(),
  description: z.string().optional(),
  metadata: z.string().optional(),
  cidr: z.string(),
  ip_policy: RefSchema,
  action: z.enum(RULE_ACTIONS),
});
export type IpPolicyRule = z.infer<typeof IpPolicyRuleResponse>;

export const IpPolicyRuleList = z.object({ ip_policy_rules: z.array(IpPolicyRuleResponse), uri: z.string(), next_page_uri: z.string().nullable() });
