import type { Readable } from 'node:stream';
import { encodeStreamType, readExactly, StreamReadError, StreamType } from './typed.js';

/**
 * JSON messages of the agent protocol (agent-protocol.md §3). Keys are PascalCase. The Rust SDK
 * deserialises replies strictly, so replies carry every field listed here.
 */

export interface AuthExtra {
  OS: string;
  Arch: string;
  AuthToken: string;
  Version: string;
  Hostname: string;
  UserAgent: string;
  Metadata: string;
  Cookie: string;
  /** Nanoseconds. */
  HeartbeatInterval: number;
  /** Nanoseconds. */
  HeartbeatTolerance: number;
  UpdateUnsupportedError: string | null;
  StopUnsupportedError: string | null;
  RestartUnsupportedError: string | null;
  ClientType?: string;
  [k: string]: unknown;
}

export interface AuthMessage {
  Version: string[];
  ClientId: string;
  Extra: AuthExtra;
}

export interface AuthResponse {
  Version: string;
  ClientId: string;
  Extra: { Version: string; Region: string; Cookie: string; AccountName: string; SessionDuration: number; PlanName: string; Banner: string };
  Error?: string;
}

export interface BindMessageExtra {
  Token: string;
  IPPolicyRef: string;
  Metadata: string;
  Bindings?: string[] | null;
  PoolingEnabled?: boolean;
}

export interface BindMessage {
  Id: string;
  Proto: string;
  ForwardsTo: string;
  ForwardsProto?: string;
  Opts: Record<string, unknown>;
  Extra: BindMessageExtra;
}

export interface BindResponse {
  Id: string;
  URL: string;
  Proto: string;
  Opts: Record<string, unknown>;
  Extra: { Token: string };
  Error?: string;
}

export interface LabelTunnelMessage {
  Labels: Record<string, string>;
  ForwardsTo: string;
  ForwardsProto?: string;
  Metadata: string;
  /** Warren extension (ignored by other servers): resume this tunnel id, proven by `Token`. */
  Id?: string;
  /** Warren extension: the `Token` of an earlier reply. */
  Token?: string;
}

export interface LabelTunnelResponse {
  Id: string;
  /** Warren extension (the SDK ignores unknown fields): proves ownership of `Id` on resume. */
  Token: string;
  Error?: string;
}

export interface UnbindMessage {
  Id: string;
}

/** Server → agent (type 9): the API removed what the tunnel depends on. */
export interface StopTunnelMessage {
  Id: string;
  Message: string;
  ErrorCode: string;
}

/**
 * The whole of what the server writes on a StopTunnel stream: type 9 (uint32 BE), then the
 * request, one complete JSON object with all three fields as strings. The Rust SDK reads it in
 * its accept loop until the bytes parse as one JSON value: an incomplete or invalid one ends that
 * loop (no more proxy streams for the session), so it goes out whole, in one write.
 */
export function encodeStopTunnel(m: StopTunnelMessage): Buffer {
  const json = JSON.stringify({ Id: String(m.Id), Message: String(m.Message), ErrorCode: String(m.ErrorCode) });
  return Buffer.concat([encodeStreamType(StreamType.StopTunnel), Buffer.from(json, 'utf8')]);
}

/** EdgeType of a proxy header, as a string (§3 Proxy streams). */
export type EdgeType = '0' | '1' | '2' | '3';

export interface ProxyHeader {
  Id: string;
  ClientAddr: string;
  Proto: string;
  EdgeType: EdgeType;
  PassthroughTLS: boolean;
}

/** Proxy headers longer than this are refused (they are ~120 bytes). */
export const MAX_PROXY_HEADER_BYTES = 64 * 1024;

/**
 * The first bytes of a server-opened proxy stream (§3 Proxy streams): type 3 (uint32 BE), the
 * header length as int64 little-endian, then the ProxyHeader JSON with all five fields.
 */
export function encodeProxyPrelude(h: ProxyHeader): Buffer {
  const json =
    `{"Id":${JSON.stringify(h.Id)},"ClientAddr":${JSON.stringify(h.ClientAddr)},"Proto":${JSON.stringify(h.Proto)},` +
    `"EdgeType":${JSON.stringify(h.EdgeType)},"PassthroughTLS":${h.PassthroughTLS ? 'true' : 'false'}}`;
  const len = Buffer.byteLength(json);
  const out = Buffer.allocUnsafe(12 + len);
  encodeStreamType(StreamType.Proxy).copy(out, 0);
  out.writeUInt32LE(len, 4);
  out.writeUInt32LE(0, 8);
  out.write(json, 12, 'utf8');
  return out;
}

/** Reads the ProxyHeader of a proxy stream whose type has already been read. */
export async function readProxyHeader(stream: Readable, timeoutMs = 10_000): Promise<ProxyHeader> {
  const lenBuf = await readExactly(stream, 8, timeoutMs);
  const low = lenBuf.readUInt32LE(0);
  const high = lenBuf.readUInt32LE(4);
  if (high !== 0 || low > MAX_PROXY_HEADER_BYTES) throw new StreamReadError('TOO_LARGE', 'proxy header too large');
  const raw = await readExactly(stream, low, timeoutMs);
  let v: unknown;
  try {
    v = JSON.parse(raw.toString('utf8'));
  } catch {
    throw new StreamReadError('MALFORMED', 'malformed proxy header');
  }
  const o = v as Partial<ProxyHeader> | null;
  if (!o || typeof o !== 'object' || typeof o.Id !== 'string' || typeof o.ClientAddr !== 'string' || typeof o.Proto !== 'string') {
    throw new StreamReadError('MALFORMED', 'proxy header lacks Id, ClientAddr or Proto');
  }
  const edge = String(o.EdgeType ?? '0');
  return { Id: o.Id, ClientAddr: o.ClientAddr, Proto: o.Proto, EdgeType: (['0', '1', '2', '3'].includes(edge) ? edge : '0') as EdgeType, PassthroughTLS: o.PassthroughTLS === true };
}
