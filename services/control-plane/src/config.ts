import { z } from 'zod';
import { parseEnv, envInt, EnvError } from '@warren/shared';
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
      /** How often the replicas share their rate-limit counts through Postgres; 0: each replica counts on its own. */
      API_RATE_LIMIT_SYNC_MS: envInt(1000, 0, 60_000),
      /** Hostname part of reserved TCP addresses. */
      TCP_ADDR_HOST: z.string().default('tcp.warren.localhost'),
      PG_POOL_MAX: envInt(20, 1, 1000),
      /** Per-account count per resource type, e.g. `reserved_addrs=100,https_edges=20`; empty = none. */
      ACCOUNT_QUOTAS: AccountQuotas,
      TLS_CERT_FILE: z.string().optional(),
      TLS_KEY_FILE: z.string().optional(),
      /**
       * Config push (gRPC) for ingress nodes. Default host: HOST. Port 0: the kernel picks (logged, and
       * sent in the IPC 'listening' message). Unset: 9090, or a free port when 9090 is taken (logged).
       */
      GRPC_HOST: z.string().optional(),
      GRPC_PORT: z.coerce.number().int().min(0).max(65535).optional(),
      /** Shared secret of ingress nodes; unset: nodes are accepted only while gRPC listens on loopback. */
      WARREN_NODE_TOKEN: z.string().optional(),
      /** TLS for gRPC (both files, or neither: plaintext); with a client CA, nodes must present a certificate it signed. */
      GRPC_TLS_CERT_FILE: z.string().optional(),
      GRPC_TLS_KEY_FILE: z.string().optional(),
      GRPC_TLS_CLIENT_CA_FILE: z.string().optional(),
      /** Lease of agent sessions reported by nodes, the keep-alive interval nodes are told to use, and the sweep interval. */
      TUNNEL_LEASE_MS: envInt(10_000, 1_000, 3_600_000),
      NODE_KEEPALIVE_INTERVAL_MS: envInt(3_000, 100, 600_000),
      TUNNEL_SWEEP_INTERVAL_MS: envInt(1_000, 50, 60_000),
      /**
       * The save-time cost check of user_agent_filter lists (worker threads): the CPU time one
       * check may take (the worker thread's on Linux, else wall time), its workers (default 1 or
       * 2: the available cores less one) and how many checks may wait for a worker, all accounts
       * together.
       */
      USER_AGENT_CHECK_TIMEOUT_MS: envInt(5_000, 10, 600_000),
      USER_AGENT_CHECK_WORKERS: z.coerce.number().int().min(1).max(64).optional(),
      USER_AGENT_CHECK_QUEUE: envInt(16, 0, 10_000),
    },
    source,
  );
  if (!!env.GRPC_TLS_CERT_FILE !== !!env.GRPC_TLS_KEY_FILE) throw new EnvError('invalid environment:\n  GRPC_TLS_CERT_FILE: GRPC_TLS_CERT_FILE and GRPC_TLS_KEY_FILE go together');
  if (env.GRPC_TLS_CLIENT_CA_FILE && !env.GRPC_TLS_CERT_FILE) throw new EnvError('invalid environment:\n  GRPC_TLS_CLIENT_CA_FILE: needs GRPC_TLS_CERT_FILE and GRPC_TLS_KEY_FILE');
  if (env.NODE_KEEPALIVE_INTERVAL_MS * 2 > env.TUNNEL_LEASE_MS)
    throw new EnvError('invalid environment:\n  NODE_KEEPALIVE_INTERVAL_MS: must be at most half of TUNNEL_LEASE_MS (a lease must survive a lost keep-alive)');
  // Without PUBLIC_BASE_URL, main.ts derives it from the address it actually listens on.
  return { ...env, PUBLIC_BASE_URL: env.PUBLIC_BASE_URL?.replace(/\/+$/, '') };
}

export type Config = ReturnType<typeof loadConfig>;
