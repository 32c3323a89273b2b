import { z } from 'zod';
import { description, metadata, obj, refId } from '../../http/validate.js';
import { RefSchema } from '../common.js';
import { RouteResponse } from '../https-edge-routes/https-edge-routes.schema.js';

/** HTTPS edge bodies and responses (wire-conventions.md §10). */

export const MAX_HOSTPORTS = 10;
export const TLS_MIN_VERSIONS = ['1.2', '1.3'] as const;

const HOSTPORT_RE = /^((?=[^:]{1,253}:)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*):(?<port>\d{1,5})$/;

/** `undefined` when `hp` is `host:port` with a lowercase DNS host and a port 1..65535. */
export function checkHostport(hp: string): string | undefined {
  const m = HOSTPORT_RE.exec(hp);
  if (!m) {
    if (HOSTPORT_RE.test(hp.toLowerCase())) return 'the host must be lowercase';
    return `${JSON.stringify(hp.slice(0, 64))} is not host:port`;
  }
  const port = Number(m.groups!.port);
  if (port < 1 || port > 65535) return `port ${port} is out of range 1..65535`;
  return undefined;
}

function noDuplicates(what: string) {
  return (items: string[], ctx: z.core.$RefinementCtx) => {
    const seen = new Set<string>();
    items.forEach((s, i) => {
      if (seen.has(s)) ctx.addIssue({ code: 'custom', message: `duplicate ${what} ${JSON.stringify(s)}`, path: [i], params: { code: 2104 } });
      seen.add(s);
    });
  };
}

const Hostports = z
  .array(
    z.string().superRefine((hp, ctx) => {
      const problem = checkHostport(hp);
      if (problem) ctx.addIssue({ code: 'custom', message: problem, params: { code: 2104 } });
    }),
  )
  .superRefine((hps, ctx) => {
    if (hps.length > MAX_HOSTPORTS) ctx.addIssue({ code: 'custom', message: `at most ${MAX_HOSTPORTS} hostports are allowed per edge`, params: { code: 6301 } });
  })
  .superRefine(noDuplicates('hostport'))
  .describe(`host:port pairs served by this edge, at most ${MAX_HOSTPORTS}, each unique across all edges`);

export const MutualTlsRequest = obj({
  enabled: z.boolean().nullish().describe('default true'),
  certificate_authority_ids: z.array(refId('ca')).superRefine(noDuplicates('certificate authority id')).nullish().describe('certificate authority ids (ca_) of this account'),
});

export const TlsTerminationRequest = obj({
  enabled: z.boolean().nullish().describe('default true'),
  min_version: z
    .string()
    .refine((v) => v === '' || (TLS_MIN_VERSIONS as readonly string[]).includes(v), { message: 'must be "1.2" or "1.3"', params: { code: 2104 } })
    .nullish()
    .describe('"1.2" (default) or "1.3"'),
});

export const MutualTlsResponse = z.object({ enabled: z.boolean(), certificate_authorities: z.array(RefSchema) });
export const TlsTerminationResponse = z.object({ enabled: z.boolean(), terminate_at: z.literal('edge'), min_version: z.enum(TLS_MIN_VERSIONS) });

export const EdgeCreate = obj({
  description: description().nullish(),
  metadata: metadata().nullish(),
  hostports: Hostports.nullish(),
  mutual_tls: MutualTlsRequest.nullish(),
  tls_termination: TlsTerminationRequest.nullish(),
});

export const EdgeUpdate = obj({
  id: z.string().nullish().describe('ignored; sent by the official clients'),
  description: description().nullish(),
  metadata: metadata().nullish(),
  hostports: Hostports.nullish(),
  mutual_tls: MutualTlsRequest.nullish(),
  tls_termination: TlsTerminationRequest.nullish(),
});

export const EdgeResponse = z.object({
  id: z.string(),
  uri: z.string(),
  created_at: z.string(),
  description: z.string().optional(),
  metadata: z.string().optional(),
  hostports: z.array(z.string()),
  mutual_tls: MutualTlsResponse.nullable(),
  tls_termination: TlsTerminationResponse.nullable(),
  routes: z.array(RouteResponse).describe('the routes of the edge, oldest first'),
});
export type Edge = z.infer<typeof EdgeResponse>;

export const EdgeList = z.object({ https_edges: z.array(EdgeResponse), uri: z.string(), next_page_uri: z.string().nullable() });
