import { readFileSync } from 'node:fs';
import { timingSafeEqual, createHash } from 'node:crypto';
import * as grpc from '@grpc/grpc-js';
import type { Logger } from '@warren/shared';
import { loadConfigProto, type ControlMessage } from '../../../shared/src/proto/index.js';
import type { NodeCall } from './node-stream.js';

export interface GrpcServerOptions {
  host: string;
  port: number;
  /** Shared secret nodes present as `authorization: Bearer <token>`. */
  token?: string;
  tls?: { certFile: string; keyFile: string; clientCaFile?: string };
  /** When `port` is taken, listen on a free port instead of failing (logged). */
  fallbackToFreePort?: boolean;
  log: Logger;
}

export interface ConfigGrpcServer {
  server: grpc.Server;
  port: number;
}

// Full syncs of a busy node can be large; the default 4 MiB would end its stream.
const MAX_RECEIVE_BYTES = 64 * 1024 * 1024;

export function isLoopback(host: string): boolean {
  return host === 'localhost' || host === '::1' || host === '[::1]' || /^127\.\d+\.\d+\.\d+$/.test(host);
}

function sameSecret(given: string, expected: string): boolean {
  // Compare digests: equal lengths for timingSafeEqual, and no early exit on the first byte.
  const a = createHash('sha256').update(given).digest();
  const b = createHash('sha256').update(expected).digest();
  return timingSafeEqual(a, b);
}

/**
 * Serves `warren.config.v1.ConfigService` on host:port. Each call is authenticated from its
 * metadata before `onConnect` sees it: with a token, `authorization: Bearer <token>` must match;
 * without one, calls are accepted only when the server is bound to loopback (and a warning is
 * logged once at start), else refused with UNAUTHENTICATED.
 */
export async function startConfigGrpcServer(opts: GrpcServerOptions, onConnect: (call: NodeCall) => void): Promise<ConfigGrpcServer> {
  const { log } = opts;
  const openWithoutToken = !opts.token && isLoopback(opts.host);
  if (!opts.token) {
    if (openWithoutToken) log.warn({ host: opts.host }, 'WARREN_NODE_TOKEN is not set: ingress nodes are not authenticated (accepted because gRPC listens on loopback only)');
    else log.error({ host: opts.host }, 'WARREN_NODE_TOKEN is not set and gRPC does not listen on loopback: every ingress node is refused');
  }
  const service = loadConfigProto().ConfigService.service;
  // Deltas are encoded once and written to every node's stream as Buffers: pass those through.
  const serialize = service.Connect.responseSerialize;
  const definition = { ...service, Connect: { ...service.Connect, responseSerialize: (v: ControlMessage | Buffer) => (Buffer.isBuffer(v) ? v : serialize(v)) } };

  const server = new grpc.Server({ 'grpc.max_receive_message_length': MAX_RECEIVE_BYTES });
  server.addService(definition as unknown as grpc.ServiceDefinition, {
    Connect: (call: NodeCall) => {
      const auth = call.metadata.get('authorization')[0];
      const token = typeof auth === 'string' && /^bearer /i.test(auth) ? auth.slice(7).trim() : '';
      const ok = opts.token ? sameSecret(token, opts.token) : openWithoutToken;
      if (!ok) {
        log.warn({ peer: call.getPeer() }, 'ingress node refused: bad or missing node token');
        call.emit('error', Object.assign(new Error('bad or missing node token'), { code: grpc.status.UNAUTHENTICATED, details: 'bad or missing node token' }));
        return;
      }
      onConnect(call);
    },
  });
  const creds = opts.tls
    ? grpc.ServerCredentials.createSsl(
        opts.tls.clientCaFile ? readFileSync(opts.tls.clientCaFile) : null,
        [{ private_key: readFileSync(opts.tls.keyFile), cert_chain: readFileSync(opts.tls.certFile) }],
        !!opts.tls.clientCaFile,
      )
    : grpc.ServerCredentials.createInsecure();
  const host = opts.host.includes(':') && !opts.host.startsWith('[') ? `[${opts.host}]` : opts.host;
  const bind = (p: number) => new Promise<number>((resolve, reject) => server.bindAsync(`${host}:${p}`, creds, (err, bound) => (err ? reject(err) : resolve(bound))));
  let port: number;
  try {
    port = await bind(opts.port);
  } catch (err) {
    if (!opts.fallbackToFreePort || opts.port === 0) throw err;
    port = await bind(0);
    log.warn({ wanted: opts.port, port, err: (err as Error).message }, 'gRPC port taken; listening on a free port instead (set GRPC_PORT to make this an error)');
  }
  return { server, port };
}

/** Stops accepting calls and waits up to `graceMs` for open ones to end, then cuts them. */
export async function shutdownGrpcServer(server: grpc.Server, graceMs: number): Promise<void> {
  await new Promise<void>((resolve) => {
    const timer = setTimeout(() => {
      server.forceShutdown();
      resolve();
    }, graceMs);
    timer.unref();
    server.tryShutdown(() => {
      clearTimeout(timer);
      resolve();
    });
  });
}
