/**
 * The ingress node's link to the control plane: config push (snapshots and deltas, applied
 * atomically, persisted, ACK/NACK) and tunnel presence (reports up, remote tunnels down).
 */
export { ControlPlaneClient, type ControlPlaneClientEvents, type ControlPlaneClientOptions, type ReportedTunnel } from './control-plane-client.js';
export { ConfigError, applyDelta, buildConfig, checkConfig } from './config-state.js';
export { StateStore, writeFileAtomic, CONFIG_FILE, TUNNELS_FILE } from './state-store.js';
