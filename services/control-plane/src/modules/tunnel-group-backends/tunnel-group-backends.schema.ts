import { z } from 'zod';
import { description, metadata, obj } from '../../http/validate.js';
import { RefSchema } from '../common.js';
import { Labels } from '../labels.js';

export const TunnelGroupBackendCreate = obj({
  description: description().nullish(),
  metadata: metadata().nullish(),
  labels: Labels,
});

export const TunnelGroupBackendUpdate = obj({
  id: z.string().nullish().describe('ignored; sent by the official clients'),
  description: description().nullish(),
  metadata: metadata().nullish(),
  labels: Labels.nullish(),
});

export const TunnelGroupBackendResponse = z.object({
  id: z.string(),
  uri: z.string(),
  created_at: z.string(),
  description: z.string().optional(),
  metadata: z.string().optional(),
  labels: z.record(z.string(), z.string()),
  tunnels: z.array(RefSchema),
});
export type TunnelGroupBackend = z.infer<typeof TunnelGroupBackendResponse>;

export const TunnelGroupBackendList = z.object({ backends: z.array(TunnelGroupBackendResponse), uri: z.string(), next_page_uri: z.string().nullable() });
