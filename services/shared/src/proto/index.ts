/**
 * `warren.config.v1`: the runtime loader, the generated message types and the conversions to and
 * from the data-plane types. Not in the shared barrel (its generated names would crowd it);
 * import this module directly.
 */
export { configStreamCodec, loadConfigProto, PROTO_DIR, PROTO_LOADER_OPTIONS, type ConfigV1 } from './load.js';
export * from './codec.js';
export { lenField, varintBytes } from './wire-size.js';
export type { ProtoGrpcType } from './generated/config.js';
export type { ConfigServiceClient, ConfigServiceHandlers, ConfigServiceDefinition } from './generated/warren/config/v1/ConfigService.js';
export type { NodeMessage, NodeMessage__Output } from './generated/warren/config/v1/NodeMessage.js';
export type { ControlMessage, ControlMessage__Output } from './generated/warren/config/v1/ControlMessage.js';
export type { Hello__Output } from './generated/warren/config/v1/Hello.js';
export type { Welcome__Output } from './generated/warren/config/v1/Welcome.js';
export type { Snapshot, Snapshot__Output } from './generated/warren/config/v1/Snapshot.js';
export type { Delta, Delta__Output } from './generated/warren/config/v1/Delta.js';
export type { Resources, Resources__Output } from './generated/warren/config/v1/Resources.js';
export type { Deletes, Deletes__Output } from './generated/warren/config/v1/Deletes.js';
export type { TunnelPresence, TunnelPresence__Output } from './generated/warren/config/v1/TunnelPresence.js';
export type { FullSync__Output } from './generated/warren/config/v1/FullSync.js';
export type { AgentSession, AgentSession__Output } from './generated/warren/config/v1/AgentSession.js';
export type { Tunnel, Tunnel__Output } from './generated/warren/config/v1/Tunnel.js';
