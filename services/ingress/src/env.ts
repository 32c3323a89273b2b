import { hostname } from 'node:os';
import { z } from 'zod';
import { envBool, envInt, parseEnv } from '@warren/shared';

/** Ingress configuration, parsed once from the environment. */
export function loadIngressEnv(source: NodeJS.ProcessEnv = process.env) {
  const env = parseEnv(
    {
      /** Stable name of this node (its persisted state and its rows in the control plane). */
      NODE_ID: z.string().regex(/^[A-Za-z0-9._-]{1,64}$/).optional(),
      /** Address the public and agent listeners bind to. */
      HOST: z.string().default('127.0.0.1'),
      HTTP_PORT: envInt(8000, 0, 65535),
      HTTPS_PORT: envInt(8443, 0, 65535),
      AGENT_PORT: envInt(4443, 0, 65535),
      /** Internal listener: hops from other nodes, /metrics, /healthz, /readyz, /status. */
      INTERNAL_HOST: z.string().default('127.0.0.1'),
      INTERNAL_PORT: envInt(9100, 0, 65535),
      /** `host:port` other nodes use to reach the internal listener; default INTERNAL_HOST:port. */
      NODE_ADDRESS: z.string().optional(),
      /** Control-plane gRPC endpoints, comma-separated `host:port`. */
      CONTROL_PLANE_GRPC: z.string().default('127.0.0.1:9090'),
      WARREN_NODE_TOKEN: z.string().optional(),
      /** TLS to the control plane's gRPC: its CA, and a client certificate when it asks for one. */
      CONTROL_PLANE_TLS_CA_FILE: z.string().optional(),
      CONTROL_PLANE_TLS_CERT_FILE: z.string().optional(),
      CONTROL_PLANE_TLS_KEY_FILE: z.string().optional(),
      CONTROL_PLANE_TLS_SERVER_NAME: z.string().optional(),
      /** Where the last good config, remote tunnels and generated certificates are kept. */
      STATE_DIR: z.string().optional(),
      /** PEM files for the public HTTPS and agent listeners; generated under STATE_DIR when absent. */
      TLS_CERT_FILE: z.string().optional(),
      TLS_KEY_FILE: z.string().optional(),
      /** Domain for Bind requests without one: `<random>.<DEFAULT_DOMAIN>`. */
      DEFAULT_DOMAIN: z.string().default('warren.localhost'),
      /** Port shown in Bind tunnels' public URLs; default HTTPS_PORT (443 is left out). */
      PUBLIC_HTTPS_PORT: envInt(0, 0, 65535),
      /**
       * What the plain-HTTP listener does with a request whose Host names an edge (every edge is
       * an HTTPS edge): `redirect` (308 to `https://` on PUBLIC_HTTPS_PORT; Upgrades get the 421 of
       * `refuse`), `refuse` (421 ERR_WARREN_7114) or `serve` (in cleartext: local development and
       * tests only). Bind endpoints are not edges and are served on both listeners as before.
       */
      HTTPS_EDGES_ON_HTTP: z.enum(['redirect', 'serve', 'refuse']).default('redirect'),
      UPSTREAM_TIMEOUT_MS: envInt(60_000, 100),
      MAX_STREAMS_PER_SESSION: envInt(500, 1, 500),
      /**
       * Slots of one agent session's MAX_STREAMS_PER_SESSION one public client address (IPv4, or
       * IPv6 /64) may hold at once; beyond it, 429 ERR_WARREN_7014 (Retry-After: 1) while other
       * addresses are still served. 80 (DEFAULT_MAX_STREAMS_PER_CLIENT, agent-connection.ts):
       * 6 addresses hold 480 of a 500-slot session.
       */
      MAX_STREAMS_PER_CLIENT: envInt(80, 1, 500),
      MAX_STREAMS_PER_TUNNEL: envInt(400, 1, 500),
      MAX_QUEUED_PER_TUNNEL: envInt(1024, 0),
      /** Tunnels one agent session may have at once; StartTunnelWithLabel/Bind beyond it are refused (ERR_WARREN_1110). */
      MAX_TUNNELS_PER_SESSION: envInt(256, 1, 1_000_000),
      /** Tunnels of all agent sessions on this node at once; beyond it, refused (ERR_WARREN_1110). */
      MAX_TUNNELS_PER_NODE: envInt(10_000, 1, 1_000_000),
      /** Tunnels of one account's sessions on this node at once; beyond it, refused (ERR_WARREN_1110). */
      MAX_TUNNELS_PER_ACCOUNT: envInt(1_000, 1, 1_000_000),
      /** Authenticated agent sessions of one credential (authtoken) on this node at once; an Auth beyond it is refused (ERR_WARREN_1110). */
      MAX_SESSIONS_PER_CREDENTIAL: envInt(100, 1, 1_000_000),
      /** Tunnels of one credential's sessions on this node at once; beyond it, refused (ERR_WARREN_1110). */
      MAX_TUNNELS_PER_CREDENTIAL: envInt(500, 1, 1_000_000),
      /** Tunnel starts (StartTunnelWithLabel, Bind) per second per agent session, and at once (0: MAX_TUNNELS_PER_SESSION, at least a second's worth); beyond, refused (ERR_WARREN_8001). */
      TUNNEL_STARTS_PER_SECOND_PER_SESSION: envInt(20, 1, 1_000_000),
      TUNNEL_START_BURST_PER_SESSION: envInt(0, 0, 1_000_000),
      /** Redis for the rate-limit action; without it the limiter counts in memory (per process). */
      REDIS_URL: z.string().optional(),
      /**
       * The rate limiter's own Redis, default REDIS_URL: e.g. unix:///run/redis/redis.sock for a
       * Redis beside this ingress server (capacity is per server, so its counts need nothing shared).
       */
      RATE_LIMIT_REDIS_URL: z
        .string()
        .refine((v) => /^(redis|rediss|unix):\/\//.test(v), 'must be a redis://, rediss:// or unix:// URL')
        .optional(),
      /**
       * The "ingress server" whose capacity a rate limit applies to (spec: per ingress server).
       * Processes with the same id share counts; default NODE_ID.
       */
      RATE_LIMIT_SERVER_ID: z.string().regex(/^[A-Za-z0-9._-]{1,64}$/).optional(),
      /** Longest wait for Redis per decision before the in-memory fallback decides (ms). */
      RATE_LIMIT_TIMEOUT_MS: envInt(50, 1, 5_000),
      /**
       * Capacities up to this keep an exact sliding log in Redis (≤ capacity entries per key);
       * larger ones the two-counter estimate. 0: the estimate everywhere.
       */
      RATE_LIMIT_EXACT_MAX: envInt(10_000, 0, 100_000),
      /**
       * How the limiter reaches Redis: `pipe` (a lean pipelined connection for its one script) or
       * `ioredis` (the measured comparison; see README, "Benchmarks").
       */
      RATE_LIMIT_TRANSPORT: z.enum(['pipe', 'ioredis']).default('pipe'),
      /** ioredis auto-pipelining on the limiter's connection (transport ioredis only; see README). */
      RATE_LIMIT_AUTO_PIPELINING: envBool(false),
      /** Redis of the event pipeline for traffic events; default REDIS_URL; neither: no traffic events. */
      EVENTS_REDIS_URL: z.string().optional(),
      /** Key prefix of the event pipeline (buffers `<prefix>:evbuf:<destId>`, BullMQ queues); the workers use the same. */
      EVENTS_PREFIX: z.string().regex(/^[A-Za-z0-9._:-]{1,64}$/).default('warren'),
      /** Traffic events held in memory at most (queued or being published); beyond it they are dropped and counted. */
      EVENTS_MAX_QUEUED: envInt(10_000, 1, 10_000_000),
      /** Longest wait before queued traffic events are published (ms); 500 queued publish at once. */
      EVENTS_FLUSH_MS: envInt(20, 1, 60_000),
      /**
       * A MaxMind DB file (GeoLite2-City / GeoIP2-City `.mmdb`) for the `conn.geo.*` policy
       * variables; read at start (unreadable: the ingress does not start) and again when it
       * changes. Unset: reading any `conn.geo` field is an evaluation error (a deny rule on it denies).
       */
      WARREN_GEOIP_DB: z.string().optional(),
      /**
       * Drain limit on SIGTERM (ms), and how long the requests a tunnel carries when its agent
       * unbinds it (or the server stops it) may take to finish before they are cut.
       */
      DRAIN_TIMEOUT_MS: envInt(10_000, 0),
      /**
       * Request bodies the route pipelines hold in memory at once, in all (bytes): a body to
       * buffer beyond it is answered 503 ERR_WARREN_7013 at once (each body is also held to 1 MiB).
       */
      MAX_BUFFERED_BODY_BYTES: envInt(128 * 1024 * 1024, 1024 * 1024),
      /**
       * How long a response-body-find-replace waits for a body to arrive whole (ms; the head
       * waits with it): past that, it passes unchanged and streams (`slow`).
       */
      FIND_REPLACE_HOLD_MS: envInt(10_000, 100, 600_000),
      /**
       * How long this node must have known another account's older tunnel for a hostname before it
       * stops its own later Bind of it (ms): past a dead node's tunnel lease (the control plane's
       * TUNNEL_LEASE_MS, 10 s) and sweep, so that a stale report cannot stop a tunnel that would
       * soon hold the host. Routing gives the later Bind no traffic meanwhile.
       */
      OUTHELD_BIND_GRACE_MS: envInt(15_000, 0, 3_600_000),
    },
    source,
  );
  const nodeId = env.NODE_ID ?? `${hostname().replace(/[^A-Za-z0-9._-]/g, '-').slice(0, 40)}-${env.HTTP_PORT}`;
  return {
    ...env,
    NODE_ID: nodeId,
    RATE_LIMIT_SERVER_ID: env.RATE_LIMIT_SERVER_ID ?? nodeId,
    STATE_DIR: env.STATE_DIR ?? `.data/ingress/${nodeId}`,
    CONTROL_PLANE_TARGETS: env.CONTROL_PLANE_GRPC.split(',').map((s) => s.trim()).filter(Boolean),
    EVENTS_REDIS_URL: env.EVENTS_REDIS_URL || env.REDIS_URL || undefined,
    RATE_LIMIT_REDIS_URL: env.RATE_LIMIT_REDIS_URL || env.REDIS_URL || undefined,
  };
}

export type IngressEnv = ReturnType<typeof loadIngressEnv>;
