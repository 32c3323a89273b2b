import type { Socket } from 'node:net';
import type { TLSSocket } from 'node:tls';
import type { CelConnSocket, CelTlsSocket } from '@warren/shared';

/**
 * The public connection's facts for a request carried over a hop (header `x-warren-conn`), for a
 * Bind endpoint's traffic policy, which runs on the node holding the tunnel (`serveHop`): there,
 * the request's socket is the hop's, so `conn.tls.*`, `conn.client_port` and `conn.server_ip`
 * would describe the connection between the nodes. The sending node writes what the client's
 * connection negotiated; the holding node shows it. Only nodes send it: the public side drops
 * every `x-warren-` header, and the internal listener takes hops only with the node token.
 *
 * Not carried: certificates (an endpoint has no mutual TLS, so `conn.tls.client` is empty
 * anyway; `conn.tls.server` reads empty over a hop).
 */
export interface HopConn {
  /** What `conn.tls` reads; null when the client came over plain HTTP. */
  tls: CelTlsSocket | null;
  /** What `conn.client_port` and `conn.server_ip` read. */
  socket: CelConnSocket;
}

interface Wire {
  /** Server (ingress) address the client connected to. */
  sip?: string;
  /** TLS: protocol, cipher name and standard name, SNI, ALPN, resumed. */
  v?: string;
  c?: string;
  cs?: string;
  sni?: string;
  alpn?: string;
  r?: boolean;
}

/** Bounds what a header value may make the holding node keep (the header comes from a node, but still). */
const MAX_FIELD = 256;

/** `x-warren-conn` for a request on `socket` (the public client's). */
export function encodeHopConn(socket: Socket): string {
  const w: Wire = { sip: socket.localAddress ?? '' };
  const t = socket as Partial<TLSSocket>;
  if (t.encrypted === true && typeof t.getProtocol === 'function') {
    w.v = t.getProtocol() ?? '';
    const c = t.getCipher?.();
    if (c) {
      w.c = c.name;
      if (c.standardName) w.cs = c.standardName;
    }
    if (typeof t.servername === 'string') w.sni = t.servername;
    if (typeof t.alpnProtocol === 'string') w.alpn = t.alpnProtocol;
    w.r = t.isSessionReused?.() === true;
  }
  return JSON.stringify(w);
}

const str = (v: unknown): string | undefined => (typeof v === 'string' && v.length <= MAX_FIELD ? v : undefined);

/**
 * The facts of `x-warren-conn` (`value`) with the client's port from `clientAddr` (`ip:port`, the
 * hop's `x-warren-client-addr`); null when absent or unreadable (then the hop's socket is shown).
 */
export function decodeHopConn(value: string | string[] | undefined, clientAddr: string): HopConn | null {
  if (typeof value !== 'string' || value.length > 4 * MAX_FIELD) return null;
  let w: Wire;
  try {
    const parsed: unknown = JSON.parse(value);
    if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) return null;
    w = parsed as Wire;
  } catch {
    return null;
  }
  const colon = clientAddr.lastIndexOf(':');
  const port = Number(clientAddr.slice(colon + 1));
  const socket: CelConnSocket = { remotePort: colon > 0 && Number.isInteger(port) && port >= 0 && port < 65536 ? port : 0, localAddress: str(w.sip) ?? '' };
  const version = str(w.v);
  if (version === undefined) return { tls: null, socket };
  const cipher = str(w.c);
  const standardName = str(w.cs);
  const sni = str(w.sni);
  const alpn = str(w.alpn);
  const resumed = w.r === true;
  const tls: CelTlsSocket = {
    getProtocol: () => version || null,
    getCipher: () => (cipher ? { name: cipher, standardName } : undefined),
    servername: sni ?? false,
    alpnProtocol: alpn ?? false,
    isSessionReused: () => resumed,
    getPeerX509Certificate: () => undefined,
    getX509Certificate: () => undefined,
  };
  return { tls, socket };
}
