import { z } from 'zod';
import { description, metadata, obj } from '../../http/validate.js';
import { RefSchema } from '../common.js';

export const REGIONS = ['au', 'eu', 'ap', 'us', 'jp', 'in', 'sa'] as const;

export const ReservedAddrCreate = obj({
  description: description().nullish(),
  metadata: metadata().nullish(),
  region: z.enum(REGIONS, { error: `region must be one of ${REGIONS.join(', ')}` }).nullish(),
});

export const ReservedAddrUpdate = obj({
  id: z.string().nullish().describe('ignored; sent by the official clients'),
  description: description().nullish(),
  metadata: metadata().nullish(),
  endpoint_configuration_id: z.string().nullish().describe('only "" (detach) is accepted: endpoint configurations are not offered'),
});

export const ReservedAddrResponse = z.object({
  id: z.string(),
  uri: z.string(),
  created_at: z.string(),
  description: z.string().optional(),
  metadata: z.string().optional(),
  addr: z.string(),
  region: z.enum(REGIONS),
  endpoint_configuration: RefSchema.nullable(),
});
export type ReservedAddr = z.infer<typeof ReservedAddrResponse>;

export const ReservedAddrList = z.object({ reserved_addrs: z.array(ReservedAddrResponse), uri: z.string(), next_page_uri: z.string().nullable() });
