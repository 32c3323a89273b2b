import { randomBytes } from 'node:crypto';
import type client from 'prom-client';
import * as grpc from '@grpc/grpc-js';
import type { Logger } from '@warren/shared';
import { configStreamCodec, resourcesToProto } from '../../../shared/src/proto/index.js';
import type { Db } from '../db/pool.js';
import { CONFIG_CHANNEL } from '../events/outbox.js';
import { PgListener } from './listener.js';
import { ConfigFeed } from './config-feed.js';
import { TunnelDirectory } from './tunnel-directory.js';
import { NodeStream, Semaphore } from './node-stream.js';
import { presenceRepo, TUNNELS_CHANNEL } from './presence.repo.js';
import { shutdownGrpcServer, startConfigGrpcServer, type GrpcServerOptions } from './config-push.grpc.js';
import { createConfigPushMetrics } from './metrics.js';
import { DEFAULT_MAX_FULL_SYNC_BYTES, DEFAULT_SNAPSHOT_PART_BYTES } from './snapshot-parts.js';
import { encodeSharedSnapshot, SnapshotCache } from './snapshot-cache.js';
import { readSnapshot } from './config-reader.js';

export interface ConfigPushOptions {
  db: Db;
  /** For the dedicated LISTEN connection. */
  databaseUrl: string;
  log: Logger;
  registry: client.Registry;
  grpc: Omit<GrpcServerOptions, 'log'>;
  /** `PUBLIC_BASE_URL`: the uris in agent session events (`agent_session_start.v0`/`_stop.v0`) are built on it, as the API's. */
  baseUrl: string;
  /** Lease of agent sessions; nodes renew it every `keepaliveIntervalMs`. */
  leaseMs?: number;
  keepaliveIntervalMs?: number;
  /** How often expired leases are swept. */
  sweepIntervalMs?: number;
  helloTimeoutMs?: number;
  maxPendingWrites?: number;
  resumeMaxChanges?: number;
  /** Snapshots or resume deltas read at once (each holds a pooled connection while it reads). */
  maxConcurrentSyncs?: number;
  /**
   * Target size of one message of a snapshot sent in parts (default 4 MiB; an entity larger goes
   * alone in its part). Only to nodes whose hello says they take parts; others get it whole.
   */
  snapshotPartBytes?: number;
  /**
   * While a snapshot goes out in parts, how long a node's stream may take no part before it is
   * ended as a slow reader (default 15 s, as long as a node waits for the next part).
   */
  snapshotStallMs?: number;
  /** How long the newest encoded snapshot is kept once no stream sends from it (default 5 s). */
  snapshotLingerMs?: number;
  /** What one full sync in parts from a node may add up to (default 256 MiB); beyond, its stream is ended. */
  maxFullSyncBytes?: number;
  /** Backoff of the LISTEN connection's reconnects. */
  listenerBackoff?: { initialMs?: number; maxMs?: number };
}

export interface ConfigPush {
  /** The port gRPC listens on (the kernel's pick when asked for 0). */
  port: number;
  replicaId: string;
  /** Ends every node stream (nodes reconnect elsewhere), stops gRPC, LISTEN and the sweeper. */
  stop(graceMs?: number): Promise<void>;
}

/**
 * The config push and presence service of one control-plane replica: LISTEN on `warren_config`
 * and `warren_tunnels`, deltas built once per version range and fanned out to every node stream
 * of this replica, the cluster's tunnel directory, the lease sweeper, and the gRPC server.
 */
export async function startConfigPush(opts: ConfigPushOptions): Promise<ConfigPush> {
  const log = opts.log.child({ component: 'config-push' });
  const leaseMs = opts.leaseMs ?? 10_000;
  const keepaliveIntervalMs = opts.keepaliveIntervalMs ?? 3_000;
  const sweepIntervalMs = opts.sweepIntervalMs ?? 1_000;
  const replicaId = `cp_${randomBytes(6).toString('hex')}`;
  const metrics = createConfigPushMetrics(opts.registry);
  const codec = configStreamCodec();
  const onBadPolicy = (routeId: string, err: Error) => log.error({ route: routeId, err: err.message }, 'stored traffic policy no longer parses; pushed as null');

  const listener = new PgListener({ connectionString: opts.databaseUrl, channels: [CONFIG_CHANNEL, TUNNELS_CHANNEL], log, backoff: opts.listenerBackoff });
  const feed = new ConfigFeed({
    pool: opts.db.pool,
    listener,
    log,
    encode: codec.encodeControl,
    onBadPolicy,
    baseUrl: opts.baseUrl,
    observeBuild: (s) => metrics.deltaBuild.observe(s),
  });
  const directory = new TunnelDirectory(opts.db.pool, listener, log);
  const streams = new Set<NodeStream>();
  const byNode = new Map<string, NodeStream>();

  listener.on('connected', () => {
    if (listener.reconnects > 0) metrics.listenerReconnects.inc();
  });
  feed.on('delta', (d) => {
    metrics.deltas.inc();
    metrics.deltaVersion.set(d.data.version);
    metrics.headVersion.set(feed.headVersion);
    for (const s of streams) s.offerDelta(d);
  });
  feed.on('reset', () => {
    for (const s of streams) s.requestResync(0);
  });
  directory.on('change', (c) => {
    metrics.tunnelsKnown.set(directory.size);
    for (const s of streams) s.offerPresence(c);
  });

  await listener.start();
  await feed.init();
  await directory.init();
  metrics.headVersion.set(feed.headVersion);
  metrics.tunnelsKnown.set(directory.size);

  let sweeping = false;
  const sweeper = setInterval(() => {
    if (sweeping) return;
    sweeping = true;
    presenceRepo
      .sweep(opts.db.pool, opts.baseUrl)
      .then((r) => {
        if (r.sessions > 0) {
          metrics.sweptSessions.inc(r.sessions);
          log.info({ sessions: r.sessions, tunnels: [...r.tunnels.values()].reduce((n, t) => n + t.length, 0) }, 'expired agent sessions removed');
        }
      })
      .catch((err: Error) => log.warn({ err: err.message }, 'lease sweep failed'))
      .finally(() => (sweeping = false));
  }, sweepIntervalMs);
  sweeper.unref();

  const snapshotPartBytes = opts.snapshotPartBytes ?? DEFAULT_SNAPSHOT_PART_BYTES;
  const snapshots = new SnapshotCache({
    lingerMs: opts.snapshotLingerMs ?? 5_000,
    onSize: (bytes) => metrics.snapshotCacheBytes.set(bytes),
    build: async () => {
      metrics.snapshotEncodes.inc();
      const snap = await readSnapshot(opts.db.pool, { onBadPolicy, baseUrl: opts.baseUrl });
      return encodeSharedSnapshot(
        { version: snap.version, epoch: snap.epoch, committedAtMs: snap.committedAtMs, resources: resourcesToProto(snap.entities) },
        { partBytes: snapshotPartBytes, headVersion: () => feed.headVersion, encode: codec.encodeControl },
      );
    },
  });
  // Before the streams' resyncs (registered earlier), so that none of them is served from an
  // entry of the sequence that went back.
  feed.prependListener('reset', () => snapshots.invalidate());
  const deps = {
    db: opts.db,
    feed,
    directory,
    log,
    metrics,
    replicaId,
    baseUrl: opts.baseUrl,
    leaseMs,
    keepaliveIntervalMs,
    helloTimeoutMs: opts.helloTimeoutMs ?? 10_000,
    maxPendingWrites: opts.maxPendingWrites ?? 1_000,
    resumeMaxChanges: opts.resumeMaxChanges ?? 10_000,
    syncSlots: new Semaphore(opts.maxConcurrentSyncs ?? 4),
    snapshotPartBytes,
    snapshots,
    snapshotStallMs: opts.snapshotStallMs ?? 15_000,
    maxFullSyncBytes: opts.maxFullSyncBytes ?? DEFAULT_MAX_FULL_SYNC_BYTES,
    onBadPolicy,
  };
  const grpcServer = await startConfigGrpcServer({ ...opts.grpc, log }, (call) => {
    const s = new NodeStream(
      call,
      deps,
      (attached) => {
        // One stream per node on this replica: a reconnect supersedes the stream it left behind.
        const old = byNode.get(attached.nodeId);
        byNode.set(attached.nodeId, attached);
        metrics.nodesConnected.set(byNode.size);
        if (old && old !== attached) old.end(grpc.status.ABORTED, 'superseded by a newer stream of this node');
      },
      (closed) => {
        streams.delete(closed);
        if (byNode.get(closed.nodeId) === closed) byNode.delete(closed.nodeId);
        metrics.nodesConnected.set(byNode.size);
      },
    );
    streams.add(s);
  });
  log.info({ port: grpcServer.port, replica: replicaId, head_version: feed.headVersion, tunnels: directory.size }, 'config push listening');

  let stopped: Promise<void> | undefined;
  return {
    port: grpcServer.port,
    replicaId,
    stop(graceMs = 5_000) {
      stopped ??= (async () => {
        clearInterval(sweeper);
        for (const s of [...streams]) s.end(grpc.status.UNAVAILABLE, 'control plane shutting down');
        await shutdownGrpcServer(grpcServer.server, graceMs);
        snapshots.clear();
        await Promise.all([directory.stop(), feed.stop()]);
        await listener.stop();
      })();
      return stopped;
    },
  };
}
