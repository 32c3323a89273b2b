import { z } from 'zod';
import { parseEnv, envInt } from '@warren/shared';
import { AccountQuotas } from './auth/quotas.js';

/** Control-plane configuration, parsed once from the environment. */
export function loadConfig(source: NodeJS.ProcessEnv = process.env) {
  const env = parseEnv(
    {
      DATABASE_URL: z.string().min(1),
      PORT: envInt(8080, 0, 65535),
      HOST: z.string().default('127.0.0.1'),
      /** Base of every uri in responses; a path prefix is allowed, no trailing slash. */
      PUBLIC_BASE_URL: z.string().url().optional(),
      /** Per-account management API requests per rolling minute; 0 turns the limit off. */
      API_RATE_LIMIT_PER_MINUTE: envInt(1200),
      /** Hostname part of reserved TCP addresses. */
      TCP_ADDR_HOST: z.string().default('tcp.warren.localhost'),
      PG_POOL_MAX: envInt(20, 1, 1000),
      /** Per-account count per resource type, e.g. `reserved_addrs=100,https_edges=20`; empty = none. */
      ACCOUNT_QUOTAS: AccountQuotas,
      TLS_CERT_FILE: z.string().optional(),
      TLS_KEY_FILE: z.string().optional(),
    },
    source,
  );
  // Without PUBLIC_BASE_URL, main.ts derives it from the address it actually listens on.
  return { ...env, PUBLIC_BASE_URL: env.PUBLIC_BASE_URL?.replace(/\/+$/, '') };
}

export type Config = ReturnType<typeof loadConfig>;
