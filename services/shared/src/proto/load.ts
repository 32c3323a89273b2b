import { fileURLToPath } from 'node:url';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import type { ProtoGrpcType } from './generated/config.js';
import type { ControlMessage, ControlMessage__Output } from './generated/warren/config/v1/ControlMessage.js';
import type { NodeMessage, NodeMessage__Output } from './generated/warren/config/v1/NodeMessage.js';

/** The repository's `proto/` directory (import roots of every .proto). */
export const PROTO_DIR = fileURLToPath(new URL('../../../../proto', import.meta.url));

/**
 * Loader options. proto/gen.sh passes the same ones to proto-loader-gen-types, so the committed
 * types describe exactly the objects grpc-js hands out: camelCase fields, 64-bit integers as JS
 * numbers (versions and Unix milliseconds stay far below 2^53), scalar defaults filled in, unset
 * message fields `null`, and a virtual `msg` naming the member of each oneof that is set.
 */
export const PROTO_LOADER_OPTIONS: protoLoader.Options = {
  keepCase: false,
  longs: Number,
  enums: String,
  defaults: true,
  oneofs: true,
  includeDirs: [PROTO_DIR],
};

export type ConfigV1 = ProtoGrpcType['warren']['config']['v1'];

let definition: protoLoader.PackageDefinition | undefined;
let cached: ConfigV1 | undefined;

function packageDefinition(): protoLoader.PackageDefinition {
  definition ??= protoLoader.loadSync('warren/config/v1/config.proto', PROTO_LOADER_OPTIONS);
  return definition;
}

/** `warren.config.v1`, loaded once from proto/warren/config/v1/config.proto. */
export function loadConfigProto(): ConfigV1 {
  cached ??= (grpc.loadPackageDefinition(packageDefinition()) as unknown as ProtoGrpcType).warren.config.v1;
  return cached;
}

/** The (de)serializers of `ConfigService.Connect`, e.g. to encode one message once for many streams. */
export function configStreamCodec() {
  const m = packageDefinition()['warren.config.v1.ConfigService'] as protoLoader.ServiceDefinition;
  const connect = m.Connect!;
  return {
    encodeControl: connect.responseSerialize as (msg: ControlMessage) => Buffer,
    decodeControl: connect.responseDeserialize as (buf: Buffer) => ControlMessage__Output,
    encodeNode: connect.requestSerialize as (msg: NodeMessage) => Buffer,
    decodeNode: connect.requestDeserialize as (buf: Buffer) => NodeMessage__Output,
  };
}
