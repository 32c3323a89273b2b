import { z } from 'zod';
import { RefSchema } from '../common.js';

export const TunnelResponse = z.object({
  id: z.string(),
  uri: z.string(),
  public_url: z.string().optional(),
  started_at: z.string(),
  metadata: z.string().optional(),
  proto: z.string().optional(),
  region: z.string(),
  tunnel_session: RefSchema,
  labels: z.record(z.string(), z.string()).optional(),
  backends: z.array(RefSchema).optional(),
  forwards_to: z.string(),
});
export type Tunnel = z.infer<typeof TunnelResponse>;
export const TunnelList = z.object({ tunnels: z.array(TunnelResponse), uri: z.string(), next_page_uri: z.string().nullable() });

export const TunnelSessionResponse = z.object({
  id: z.string(),
  uri: z.string(),
  agent_version: z.string(),
  credential: RefSchema,
  ip: z.string(),
  metadata: z.string().optional(),
  os: z.string(),
  region: z.string(),
  started_at: z.string(),
  transport: z.literal('ngrok/v2'),
});
export type TunnelSession = z.infer<typeof TunnelSessionResponse>;
export const TunnelSessionList = z.object({ tunnel_sessions: z.array(TunnelSessionResponse), uri: z.string(), next_page_uri: z.string().nullable() });
