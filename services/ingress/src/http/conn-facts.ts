import type net from 'node:net';

/**
 * What a traffic policy's `conn.ts.start`, `conn.bytes_in`, `conn.bytes_out` and
 * `conn.server_region` read on this node (`policy/activation.ts`); over a hop, the sending node's
 * values travel in `x-warren-conn` (`hop-conn.ts`).
 */

const STARTED = Symbol('warren.connectionStartedAt');
type Stamped = net.Socket & { [STARTED]?: number };

/** A public server's `connection` listener: the time the client's TCP connection was accepted. */
export function stampConnection(socket: net.Socket): void {
  (socket as Stamped)[STARTED] = Date.now();
}

/**
 * The TCP socket under a request's socket: an HTTPS request's is a TLSSocket, whose byte counts
 * are the decrypted stream's; the one it wraps (`_parent`, which node:tls sets for a server-side
 * socket) counts what crossed the wire, TLS records included, and carries the accept time.
 */
export function wireSocket(socket: net.Socket): net.Socket {
  const parent = (socket as net.Socket & { _parent?: unknown })._parent;
  return parent !== null && typeof parent === 'object' && typeof (parent as net.Socket).bytesRead === 'number' ? (parent as net.Socket) : socket;
}

/** When the client's connection was accepted (ms since the epoch); undefined when not stamped. */
export function connectionStartedAt(socket: net.Socket | null | undefined): number | undefined {
  return socket ? (wireSocket(socket) as Stamped)[STARTED] : undefined;
}

let region = '';
/** This node's region for `conn.server_region`: its node id, the `Region` its agents are told. */
export function setServerRegion(value: string): void {
  region = value;
}
export function serverRegion(): string {
  return region;
}
