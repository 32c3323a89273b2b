import client from 'prom-client';

/** Metrics of the config client, registered on the registry the ingress gives it (or a private one). */
export function createConfigClientMetrics(registry: client.Registry) {
  const registers = [registry];
  return {
    appliedVersion: new client.Gauge({ name: 'warren_ingress_config_applied_version', help: 'Config version this node serves', registers }),
    headVersion: new client.Gauge({ name: 'warren_ingress_config_head_version', help: 'Newest config version the control plane announced', registers }),
    lag: new client.Gauge({ name: 'warren_ingress_config_lag_versions', help: 'Head version minus applied version', registers }),
    applyLatency: new client.Histogram({
      name: 'warren_ingress_config_apply_latency_seconds',
      help: 'From the commit of a config version on the control plane to its atomic swap on this node (deltas; assumes synchronized clocks)',
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1],
      registers,
    }),
    applies: new client.Counter({ name: 'warren_ingress_config_applies_total', help: 'Snapshots and deltas processed, by result (ok, rejected)', labelNames: ['kind', 'result'] as const, registers }),
    protocolErrors: new client.Counter({
      name: 'warren_ingress_config_protocol_errors_total',
      help: 'Config streams dropped for a broken snapshot in parts, by reason (part_sequence, version_change, delta_mid_snapshot, unexpected_message, snapshot_too_large)',
      labelNames: ['reason'] as const,
      registers,
    }),
    connected: new client.Gauge({ name: 'warren_ingress_config_connected', help: '1 while the config stream to a control plane is up', registers }),
    remoteTunnels: new client.Gauge({ name: 'warren_ingress_config_remote_tunnels', help: 'Tunnels of other nodes known from the control plane', registers }),
    reconnects: new client.Counter({ name: 'warren_ingress_config_reconnects_total', help: 'Connection attempts to the control plane after the first', registers }),
    persistErrors: new client.Counter({ name: 'warren_ingress_config_persist_errors_total', help: 'Failed writes of the last good config or remote tunnels to disk', registers }),
  };
}

export type ConfigClientMetrics = ReturnType<typeof createConfigClientMetrics>;
