import client from 'prom-client';

/** Config push and presence metrics of the control plane, registered on the app's registry. */
export function createConfigPushMetrics(registry: client.Registry) {
  const registers = [registry];
  return {
    nodesConnected: new client.Gauge({ name: 'warren_control_plane_config_nodes_connected', help: 'Ingress nodes with a config stream to this replica', registers }),
    headVersion: new client.Gauge({ name: 'warren_control_plane_config_head_version', help: 'Newest config version this replica has seen', registers }),
    deltaVersion: new client.Gauge({ name: 'warren_control_plane_config_delta_version', help: 'Config version of the last delta this replica built', registers }),
    deltas: new client.Counter({ name: 'warren_control_plane_config_deltas_total', help: 'Deltas built (each covers one or more versions)', registers }),
    deltaBuild: new client.Histogram({
      name: 'warren_control_plane_config_delta_build_seconds',
      help: 'From a version notification to its delta being ready to send',
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1],
      registers,
    }),
    pushLatency: new client.Histogram({
      name: 'warren_control_plane_config_push_latency_seconds',
      help: 'From the commit of a config version to the ACK of a node that applied it',
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
      registers,
    }),
    syncs: new client.Counter({ name: 'warren_control_plane_config_syncs_total', help: 'Initial syncs and resyncs of node streams, by kind (snapshot, resume)', labelNames: ['kind'] as const, registers }),
    snapshotParts: new client.Counter({ name: 'warren_control_plane_config_snapshot_parts_total', help: 'Messages of snapshots sent in parts (to nodes that take parts)', registers }),
    snapshotEncodes: new client.Counter({
      name: 'warren_control_plane_config_snapshot_encodes_total',
      help: 'Snapshots read and encoded for nodes that take parts (each shared by the nodes that sync while it is current)',
      registers,
    }),
    snapshotCacheBytes: new client.Gauge({ name: 'warren_control_plane_config_snapshot_cache_bytes', help: 'Encoded snapshot parts held for node streams', registers }),
    nacks: new client.Counter({ name: 'warren_control_plane_config_nacks_total', help: 'Config versions refused by nodes', registers }),
    streamErrors: new client.Counter({ name: 'warren_control_plane_config_stream_errors_total', help: 'Node streams ended by the control plane, by reason', labelNames: ['reason'] as const, registers }),
    tunnelsKnown: new client.Gauge({ name: 'warren_control_plane_tunnels_known', help: 'Live tunnels of the cluster this replica knows of', registers }),
    sweptSessions: new client.Counter({ name: 'warren_control_plane_presence_swept_sessions_total', help: 'Agent sessions removed because their lease expired', registers }),
    listenerReconnects: new client.Counter({ name: 'warren_control_plane_config_listener_reconnects_total', help: 'Reconnects of the LISTEN connection', registers }),
  };
}

export type ConfigPushMetrics = ReturnType<typeof createConfigPushMetrics>;
