import { z } from 'zod';
import { description, metadata, obj } from '../../http/validate.js';
import { MODULES, MODULE_NAMES, type ModuleName } from './route-modules.js';

/** Route bodies and responses (spec "HTTPS edge route"; wire-conventions.md §7, §8, §10). */

export const MATCH_TYPES = ['exact_path', 'path_prefix'] as const;
export const MAX_MATCH_BYTES = 2048;

const HOST_RE = /^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$/;
const PATH_RE = /^\/(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/]|%[0-9A-Fa-f]{2})*$/;

/** `undefined` when `m` is `/path`, `host` or `host/path`; otherwise the reason. */
export function checkMatch(m: string): string | undefined {
  if (m === '') return 'must not be empty';
  const slash = m.indexOf('/');
  const host = slash === -1 ? m : m.slice(0, slash);
  const path = slash === -1 ? '' : m.slice(slash);
  if (host && !HOST_RE.test(host)) {
    return HOST_RE.test(host.toLowerCase()) ? 'the host must be lowercase' : `${JSON.stringify(host.slice(0, 64))} is not a valid host name; use /path, host or host/path`;
  }
  if (path && !PATH_RE.test(path)) return 'the path may contain only URL path characters (no spaces, "?", "#" or bad %-escapes)';
  return undefined;
}

// A string refined to the enum (not z.enum) so that a missing match_type is 2103, not 2104.
const matchType = z
  .string()
  .refine((v): v is (typeof MATCH_TYPES)[number] => (MATCH_TYPES as readonly string[]).includes(v), { message: `must be one of ${MATCH_TYPES.join(', ')}`, params: { code: 2104 } })
  .meta({ enum: [...MATCH_TYPES] })
  .describe('exact_path or path_prefix');
const match = z
  .string()
  .superRefine((m, ctx) => {
    if (Buffer.byteLength(m, 'utf8') > MAX_MATCH_BYTES) return ctx.addIssue({ code: 'custom', message: `must be at most ${MAX_MATCH_BYTES} bytes`, params: { code: 5003 } });
    const problem = checkMatch(m);
    if (problem) ctx.addIssue({ code: 'custom', message: problem, params: { code: 2104 } });
  })
  .describe('route selector: /path, host or host/path');

/** `policy` is always `null` in responses; in requests only `null` is accepted. */
const policy = z
  .unknown()
  .refine((v) => v === null, { message: 'the policy field is not supported; configure the traffic_policy module instead', params: { code: 2104 } })
  .optional()
  .describe('only null; use traffic_policy');

type ModuleRequestShape = { [K in ModuleName]: z.ZodOptional<z.ZodNullable<(typeof MODULES)[K]['request']>> };
type ModuleResponseShape = { [K in ModuleName]: z.ZodNullable<(typeof MODULES)[K]['response']> };

function moduleRequests(): ModuleRequestShape {
  const out: Record<string, z.ZodType> = {};
  for (const name of MODULE_NAMES) out[name] = MODULES[name].request.nullish().describe(`${MODULES[name].title} module; null or omitted: not configured / unchanged`);
  return out as ModuleRequestShape;
}

function moduleResponses(): ModuleResponseShape {
  const out: Record<string, z.ZodType> = {};
  for (const name of MODULE_NAMES) out[name] = MODULES[name].response.nullable();
  return out as ModuleResponseShape;
}

export const RouteCreate = obj({
  edge_id: z.string().nullish().describe('ignored; sent by the official clients'),
  match_type: matchType,
  match,
  description: description().nullish(),
  metadata: metadata().nullish(),
  ...moduleRequests(),
  policy,
});

export const RouteUpdate = obj({
  id: z.string().nullish().describe('ignored; sent by the official clients'),
  edge_id: z.string().nullish().describe('ignored; sent by the official clients'),
  match_type: matchType.nullish(),
  match: match.nullish(),
  description: description().nullish(),
  metadata: metadata().nullish(),
  ...moduleRequests(),
  policy,
});

export const RouteResponse = z.object({
  edge_id: z.string(),
  id: z.string(),
  uri: z.string(),
  created_at: z.string(),
  match_type: z.enum(MATCH_TYPES),
  match: z.string(),
  description: z.string().optional(),
  metadata: z.string().optional(),
  ...moduleResponses(),
  policy: z.null(),
});
export type Route = z.infer<typeof RouteResponse>;
export type RouteCreateInput = z.output<typeof RouteCreate>;
export type RouteUpdateInput = z.output<typeof RouteUpdate>;
