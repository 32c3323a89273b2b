import net from 'node:net';
import tls from 'node:tls';
import type { MuxStream, ProxyHeader } from '@warren/shared';

/** Where a tunnel's traffic goes on the agent's side. */
export interface ForwardTarget {
  host: string;
  port: number;
  /** Dial with TLS (an https:// or tls:// target). */
  tls: boolean;
  /** Normalised form sent as ForwardsTo and shown to the user, e.g. `http://localhost:8080`. */
  url: string;
}

/**
 * Parses what the user wants to forward to: `8080`, `host:8080`, `[::1]:8080`, or a URL
 * (`http://`, `https://`, `tcp://`, `tls://`; the port defaults to the scheme's).
 */
export function parseForwardTarget(input: string): ForwardTarget {
  const s = input.trim();
  if (/^\d+$/.test(s)) return checked('localhost', Number(s), 'http');
  const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(s)?.[1]?.toLowerCase();
  if (scheme) {
    if (!['http', 'https', 'tcp', 'tls'].includes(scheme)) throw new Error(`unsupported scheme in ${JSON.stringify(s)}: use http, https, tcp or tls`);
    let u: URL;
    try {
      u = new URL(s);
    } catch {
      throw new Error(`invalid address ${JSON.stringify(s)}`);
    }
    const defaults: Record<string, number> = { http: 80, https: 443 };
    const port = u.port ? Number(u.port) : defaults[scheme];
    if (port === undefined) throw new Error(`${JSON.stringify(s)} needs a port`);
    return checked(u.hostname.replace(/^\[|\]$/g, ''), port, scheme);
  }
  const m = /^(\[[^\]]+\]|[^:]+):(\d+)$/.exec(s);
  if (!m) throw new Error(`invalid address ${JSON.stringify(s)}: use a port, host:port or a URL`);
  return checked(m[1]!.replace(/^\[|\]$/g, ''), Number(m[2]), 'http');
}

function checked(host: string, port: number, scheme: string): ForwardTarget {
  if (!host) throw new Error('the address has no host');
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new Error(`invalid port ${port}`);
  const shownHost = host.includes(':') ? `[${host}]` : host;
  return { host, port, tls: scheme === 'https' || scheme === 'tls', url: `${scheme}://${shownHost}:${port}` };
}

/**
 * How the agent checks the certificate of an https:// or tls:// local service: against the
 * system CAs (the default), against one CA of the user's (`secureContext`, built once), or not
 * at all (`verify: false`, for a local service with a self-signed certificate).
 */
export interface UpstreamTls {
  verify: boolean;
  secureContext?: tls.SecureContext;
}

/** The default: the system CAs. */
const SYSTEM_CAS: UpstreamTls = { verify: true };

/** True when a failed dial should be answered with an HTTP 502 rather than a reset. */
export function speaksHttp(header: ProxyHeader, tunnelProto: string): boolean {
  return header.EdgeType === '3' || header.Proto === 'http' || header.Proto === 'https' || tunnelProto === 'http' || tunnelProto === 'https';
}

function badGateway(target: ForwardTarget, err: Error & { code?: string }): string {
  const body = `warren-agent: could not reach ${target.url} (${err.code ?? err.message})\n`;
  return `HTTP/1.1 502 Bad Gateway\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`;
}

/**
 * Carries one proxy stream to the local service: dials it, then copies both ways with
 * half-close (each direction ends on its own FIN). If the dial fails, an HTTP tunnel answers
 * 502 itself (agent-protocol.md §3 Proxy streams); other tunnels reset the stream.
 */
export function forwardStream(stream: MuxStream, target: ForwardTarget, httpLike: boolean, onError?: (err: Error) => void, upstreamTls: UpstreamTls = SYSTEM_CAS): void {
  const upstream: net.Socket = target.tls
    ? tls.connect({ host: target.host, port: target.port, servername: net.isIP(target.host) ? undefined : target.host, allowHalfOpen: true, rejectUnauthorized: upstreamTls.verify, secureContext: upstreamTls.secureContext } as tls.ConnectionOptions)
    : net.connect({ host: target.host, port: target.port, allowHalfOpen: true });
  let connected = false;
  upstream.setNoDelay(true);
  upstream.once(target.tls ? 'secureConnect' : 'connect', () => {
    connected = true;
    stream.pipe(upstream);
    upstream.pipe(stream);
  });
  upstream.on('error', (err: Error) => {
    if (!connected && httpLike && !stream.destroyed) {
      onError?.(err);
      stream.end(badGateway(target, err));
      stream.resume(); // discard the request
      return;
    }
    if (!connected) onError?.(err);
    stream.destroy();
  });
  // A reset from either side ends the other one too.
  stream.on('close', () => {
    if (!upstream.destroyed && (!stream.readableEnded || !stream.writableFinished)) upstream.destroy();
  });
  upstream.on('close', (hadError) => {
    if (connected && hadError) stream.destroy();
  });
}
