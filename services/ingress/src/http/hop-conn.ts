import type http from 'node:http';
import type { X509Certificate } from 'node:crypto';
import type { TLSSocket } from 'node:tls';
import type { CelConnFacts, CelConnSocket, CelRequestMessage, CelTlsSocket } from '@warren/shared';
import { ja4Of } from './client-hello.js';
import { connectionStartedAt, serverRegion, wireSocket } from './conn-facts.js';

/**
 * The public connection's facts for a request carried over a hop (header `x-warren-conn`), for a
 * Bind endpoint's traffic policy, which runs on the node holding the tunnel (`serveHop`): there,
 * the request's socket is the hop's, so `conn.tls.*`, `conn.client_port` and `conn.server_ip`
 * would describe the connection between the nodes. The sending node writes what the client's
 * connection negotiated; the holding node shows it. Only nodes send it: the public side drops
 * every `x-warren-` header, and the internal listener takes hops only with the node token.
 *
 * The request's own facts that the hop changes go along too: the target exactly as the client
 * sent it (the sending node normalised `req.url`: a rule on `req.url.raw_path` must see `/x/../a`
 * or `/%61dmin` whichever node the client reached), its HTTP version and how its body's length
 * was stated (`req.version`, `req.content_length`).
 *
 * Not carried: certificates. An endpoint has no mutual TLS, so `conn.tls.client` is empty
 * anyway. For `conn.tls.server` the sending node sends the SHA-256 fingerprint of the certificate
 * it served: the holding node shows its own certificate when that is the one (nodes sharing
 * TLS_CERT_FILE, as a cluster behind one name does), and nothing otherwise (each node with a
 * certificate it made itself). The ClientHello's JA4 goes as `j4` (`client-hello.ts`).
 */
export interface HopConn {
  /** What `conn.tls` reads; null when the client came over plain HTTP. */
  tls: CelTlsSocket | null;
  /** What `conn.client_port`, `conn.server_ip` and `conn.bytes_*` read (the bytes as the sending node counted them). */
  socket: CelConnSocket;
  /** What `conn.ts.start` and `conn.server_region` read: the sending node's. */
  facts: CelConnFacts;
  /** What `req.version` and `req.content_length` read (the client's request, not the hop's). */
  message: CelRequestMessage | null;
  /** The request target as the client sent it, when the sending node changed it; else undefined. */
  rawTarget: string | undefined;
}

interface Wire {
  /** Server (ingress) address the client connected to. */
  sip?: string;
  /** The connection: accepted at (ms since the epoch), bytes in and out so far, the node's region. */
  ts?: number;
  bi?: number;
  bo?: number;
  rg?: string;
  /** TLS: protocol, cipher name and standard name, SNI, ALPN, resumed. */
  v?: string;
  c?: string;
  cs?: string;
  sni?: string;
  alpn?: string;
  r?: boolean;
  /** SHA-256 fingerprint of the certificate served (`X509Certificate#fingerprint256`). */
  fp?: string;
  /** JA4 of the client's ClientHello. */
  j4?: string;
  /** The request: HTTP version, Content-Length as sent, sent chunked, raw target (when changed). */
  hv?: string;
  cl?: string;
  te?: boolean;
  rt?: string;
}

/** Bounds what a header value may make the holding node keep (the header comes from a node, but still). */
const MAX_FIELD = 256;
/** A JA4 as `client-hello.ts` writes it (36 characters; the cost model counts on that bound). */
const JA4_SHAPE = /^t[0-9a-z]{2}[di]\d{4}[0-9A-Za-z]{2}_[0-9a-f]{12}_[0-9a-f]{12}$/;
/** A request target is bounded by Node's 16 KiB head limit. */
const MAX_TARGET = 16 * 1024;

/**
 * `x-warren-conn` for `req` (the public client's), with the target as the client sent it when
 * routing changed `req.url`. Pure ASCII (JSON with every other character escaped), so any HTTP
 * client sends it as it is.
 */
export function encodeHopConn(req: http.IncomingMessage, rawTarget?: string): string {
  const socket = req.socket;
  const wire = wireSocket(socket);
  const w: Wire = { sip: socket.localAddress ?? '', hv: req.httpVersion, bi: wire.bytesRead, bo: wire.bytesWritten, rg: serverRegion() };
  const ts = connectionStartedAt(socket);
  if (ts !== undefined) w.ts = ts;
  const cl = req.headers['content-length'];
  if (typeof cl === 'string') w.cl = cl;
  if (req.headers['transfer-encoding'] !== undefined) w.te = true;
  if (rawTarget !== undefined) w.rt = rawTarget;
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
    const fp = servedFingerprint(t);
    if (fp) w.fp = fp;
    const j4 = ja4Of(wire);
    if (j4) w.j4 = j4;
  }
  return asciiJson(w);
}

/** The fingerprint of the certificate a TLS socket served, worked out once per connection. */
const fingerprints = new WeakMap<object, string | null>();
function servedFingerprint(t: Partial<TLSSocket>): string | null {
  let fp = fingerprints.get(t);
  if (fp === undefined) {
    try {
      fp = t.getX509Certificate?.()?.fingerprint256 ?? null;
    } catch {
      fp = null;
    }
    fingerprints.set(t, fp);
  }
  return fp;
}

/** `v` as JSON with every character past ASCII escaped (`\u00e9`): a header value any HTTP client sends as it is. */
export function asciiJson(v: unknown): string {
  return JSON.stringify(v).replace(/[\u007f-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

const str = (v: unknown): string | undefined => (typeof v === 'string' && v.length <= MAX_FIELD ? v : undefined);
/** A count or a time in ms: a non-negative safe integer, else undefined. */
const count = (v: unknown): number | undefined => (typeof v === 'number' && Number.isSafeInteger(v) && v >= 0 ? v : undefined);

/**
 * The facts of `x-warren-conn` (`value`) with the client's port from `clientAddr` (`ip:port`, the
 * hop's `x-warren-client-addr`); null when absent or unreadable (then the hop's socket is shown).
 * `own`: this node's certificate, shown as `conn.tls.server` when it is the one the sending node served.
 */
export function decodeHopConn(value: string | string[] | undefined, clientAddr: string, own: X509Certificate | null = null): HopConn | null {
  if (typeof value !== 'string' || value.length > 8 * MAX_FIELD + 6 * MAX_TARGET) return null;
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
  const socket: CelConnSocket = { remotePort: colon > 0 && Number.isInteger(port) && port >= 0 && port < 65536 ? port : 0, localAddress: str(w.sip) ?? '', bytesRead: count(w.bi), bytesWritten: count(w.bo) };
  const facts: CelConnFacts = { startedAt: count(w.ts), region: str(w.rg) ?? '', ja4: typeof w.j4 === 'string' && JA4_SHAPE.test(w.j4) ? w.j4 : '' };
  const hv = typeof w.hv === 'string' && /^\d\.\d$/.test(w.hv) ? w.hv : undefined;
  const message: CelRequestMessage | null = hv === undefined ? null : { httpVersion: hv, headers: { 'content-length': str(w.cl), 'transfer-encoding': w.te === true ? 'chunked' : undefined } };
  const rawTarget = typeof w.rt === 'string' && w.rt.length <= MAX_TARGET ? w.rt : undefined;
  const version = str(w.v);
  if (version === undefined) return { tls: null, socket, facts, message, rawTarget };
  const cipher = str(w.c);
  const standardName = str(w.cs);
  const sni = str(w.sni);
  const alpn = str(w.alpn);
  const resumed = w.r === true;
  const server = own && typeof w.fp === 'string' && w.fp === own.fingerprint256 ? own : undefined;
  const tls: CelTlsSocket = {
    getProtocol: () => version || null,
    getCipher: () => (cipher ? { name: cipher, standardName } : undefined),
    servername: sni ?? false,
    alpnProtocol: alpn ?? false,
    isSessionReused: () => resumed,
    getPeerX509Certificate: () => undefined,
    getX509Certificate: () => server,
  };
  return { tls, socket, facts, message, rawTarget };
}
