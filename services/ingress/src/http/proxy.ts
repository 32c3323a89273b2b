import http from 'node:http';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import type { Logger } from '@warren/shared';
import type { ErrorCode } from '@warren/shared';
import type { LocalTunnel, ProxyHeaderInit, TunnelStream } from '../agents/server.js';
import type { TunnelRegistry, TunnelTarget } from '../tunnels/registry.js';
import { sendError, sendUpgradeError } from './error-page.js';
import { isOutcome, type RoutePipeline } from '../pipeline/runner.js';
import type { RequestState } from '../pipeline/types.js';

/** A route's pipeline and the request's state, for the response stages and the result. */
export interface ForwardHooks {
  pipeline: RoutePipeline;
  state: RequestState;
}

/** What the public side of a request looked like, carried to the agent and across a hop. */
export interface RequestInfo {
  scheme: 'http' | 'https';
  /** `ip:port` of the public client. */
  clientAddr: string;
  /** `'3'` for an HTTPS edge's labeled tunnel, `'0'` for a Bind endpoint (agent-protocol.md §3). */
  edgeType: '0' | '3';
}

/** Headers a proxy must not pass on (RFC 9110 §7.6.1), plus `expect` (Node has answered it). */
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authenticate', 'proxy-authorization', 'te', 'trailer', 'transfer-encoding', 'upgrade', 'expect']);
/** Headers nodes use among themselves; never accepted from the public side. */
const HOP_PREFIX = 'x-warren-';
export const HOP = {
  tunnel: 'x-warren-tunnel',
  token: 'x-warren-node-token',
  clientAddr: 'x-warren-client-addr',
  scheme: 'x-warren-scheme',
  edgeType: 'x-warren-edge-type',
  miss: 'x-warren-hop-miss',
  /** On a hop upgrade: open a raw stream to the tunnel (no HTTP request head is sent on). */
  raw: 'x-warren-raw',
  proto: 'x-warren-proto',
} as const;

export function ipOf(addr: string): string {
  if (addr.startsWith('[')) return addr.slice(1, addr.indexOf(']'));
  const colon = addr.lastIndexOf(':');
  return colon > 0 && addr.indexOf(':') === colon ? addr.slice(0, colon) : addr;
}

function connectionTokens(raw: string[]): Set<string> | null {
  let out: Set<string> | null = null;
  for (let i = 0; i < raw.length; i += 2) {
    if (raw[i]!.length === 10 && raw[i]!.toLowerCase() === 'connection') {
      for (const t of raw[i + 1]!.split(',')) {
        const v = t.trim().toLowerCase();
        if (v) (out ??= new Set()).add(v);
      }
    }
  }
  return out;
}

/**
 * The request headers sent on to the agent, in the client's order and case: hop-by-hop headers
 * and any `x-warren-*` dropped; X-Forwarded-For appended to, X-Forwarded-Proto and -Host set. An
 * upgrade keeps its `Connection: upgrade` and `Upgrade`.
 */
export function publicRequestHeaders(raw: string[], clientIp: string, scheme: string, upgrade: boolean): string[] {
  const listed = connectionTokens(raw);
  const out: string[] = [];
  let xff: string | null = null;
  let host = '';
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    const lower = name.toLowerCase();
    if (lower === 'x-forwarded-for') {
      xff = xff === null ? raw[i + 1]! : `${xff}, ${raw[i + 1]!}`;
      continue;
    }
    if (lower === 'x-forwarded-proto' || lower === 'x-forwarded-host' || lower.startsWith(HOP_PREFIX)) continue;
    if (lower === 'host') host = raw[i + 1]!;
    if (HOP_BY_HOP.has(lower) || listed?.has(lower)) continue;
    out.push(name, raw[i + 1]!);
  }
  out.push('X-Forwarded-For', xff === null ? clientIp : `${xff}, ${clientIp}`, 'X-Forwarded-Proto', scheme, 'X-Forwarded-Host', host);
  if (upgrade) out.push('Connection', 'Upgrade', 'Upgrade', upgradeOf(raw));
  return out;
}

function upgradeOf(raw: string[]): string {
  for (let i = 0; i < raw.length; i += 2) if (raw[i]!.toLowerCase() === 'upgrade') return raw[i + 1]!;
  return 'websocket';
}

/** Headers of a request that came over a hop: already prepared by the sending node. */
export function hopRequestHeaders(raw: string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < raw.length; i += 2) {
    if (raw[i]!.toLowerCase().startsWith(HOP_PREFIX)) continue;
    out.push(raw[i]!, raw[i + 1]!);
  }
  return out;
}

function responseHeaders(raw: string[]): string[] {
  const listed = connectionTokens(raw);
  const out: string[] = [];
  for (let i = 0; i < raw.length; i += 2) {
    const lower = raw[i]!.toLowerCase();
    if (HOP_BY_HOP.has(lower) || listed?.has(lower) || lower.startsWith(HOP_PREFIX)) continue;
    out.push(raw[i]!, raw[i + 1]!);
  }
  return out;
}

function requestHead(method: string, url: string, headers: string[]): string {
  let head = `${method} ${url} HTTP/1.1\r\n`;
  for (let i = 0; i < headers.length; i += 2) head += `${headers[i]}: ${headers[i + 1]}\r\n`;
  return `${head}\r\n`;
}

/** May a failed attempt be retried on another tunnel? Only when no body byte can have been used. */
function replayable(req: http.IncomingMessage): boolean {
  if (req.method !== 'GET' && req.method !== 'HEAD' && req.method !== 'OPTIONS' && req.method !== 'DELETE') return false;
  const cl = req.headers['content-length'];
  return (cl === undefined || cl === '0') && req.headers['transfer-encoding'] === undefined;
}

class ForwardError extends Error {
  constructor(
    readonly code: ErrorCode,
    message: string,
    /** True when the request never reached the target, so another one may be tried. */
    readonly retryable = false,
  ) {
    super(message);
  }
}

export interface ForwarderOptions {
  registry: TunnelRegistry;
  /** Shared secret nodes put on hop requests; '' = none (loopback-only clusters). */
  hopToken: string;
  log: Logger;
  /** How long to wait for the response head from the agent (ms). */
  upstreamTimeoutMs: number;
  /** Concurrent proxy streams per tunnel kept by its HTTP connection pool (below the session cap). */
  maxStreamsPerTunnel: number;
  /** Requests allowed to wait for a free stream per tunnel before 503. */
  maxQueuedPerTunnel: number;
}

/**
 * Carries HTTP requests and upgrades to tunnels: on this node through a pooled, keep-alive HTTP
 * client whose sockets are the agent's proxy streams (one stream per upstream connection, reused
 * across requests like any keep-alive connection), or to the node that holds the tunnel over a
 * keep-alive hop connection.
 */
export class Forwarder {
  private readonly agents = new Map<string, { agent: http.Agent; inFlight: number }>();
  private readonly hopAgent = new http.Agent({ keepAlive: true, maxSockets: 512, maxFreeSockets: 128, scheduling: 'lifo' });

  constructor(private readonly opts: ForwarderOptions) {}

  /** Drops the connection pool of a tunnel that went away. */
  release(tunnelId: string): void {
    const a = this.agents.get(tunnelId);
    if (a) {
      this.agents.delete(tunnelId);
      a.agent.destroy();
    }
  }

  close(): void {
    for (const id of [...this.agents.keys()]) this.release(id);
    this.hopAgent.destroy();
  }

  private poolFor(tunnel: LocalTunnel) {
    let p = this.agents.get(tunnel.id);
    if (!p) {
      const agent = new http.Agent({ keepAlive: true, maxSockets: this.opts.maxStreamsPerTunnel, maxFreeSockets: 64, scheduling: 'lifo' });
      // Each pooled "socket" is a proxy stream opened on the agent's session. The synchronous form
      // matters: http.Agent counts a socket against maxSockets only once createConnection has
      // returned it, so the callback form would let a burst open more streams than allowed.
      (agent as unknown as { createConnection: unknown }).createConnection = (o: { clientAddr?: string; scheme?: 'http' | 'https'; edgeType?: '0' | '3' }) => {
        const header: ProxyHeaderInit = { clientAddr: o.clientAddr ?? '0.0.0.0:0', proto: o.scheme ?? 'http', edgeType: o.edgeType ?? '3' };
        return tunnel.openStreamSync!(header);
      };
      p = { agent, inFlight: 0 };
      this.agents.set(tunnel.id, p);
    }
    return p;
  }

  /**
   * Forwards `req` to `first` (and, for a replayable request whose target could not be reached at
   * all, to other tunnels from `next`). Resolves with the status sent to the client.
   */
  async forward(
    req: http.IncomingMessage,
    res: http.ServerResponse,
    first: TunnelTarget,
    info: RequestInfo,
    headers: string[],
    next: (exclude: ReadonlySet<string>) => TunnelTarget | null,
    hooks?: ForwardHooks,
  ): Promise<number> {
    let target: TunnelTarget | null = first;
    let tried: Set<string> | null = null;
    for (let attempt = 0; target; attempt++) {
      try {
        return await (target.kind === 'local' ? this.viaLocal(req, res, target.tunnel, info, headers, hooks) : this.viaHop(req, res, target.tunnel.id, target.tunnel.nodeAddress, info, headers, hooks));
      } catch (err) {
        if (res.destroyed) return 499; // the client went away
        const fe = err instanceof ForwardError ? err : new ForwardError(7004, (err as Error).message);
        const failed = target.tunnel.id;
        // A body the pipeline buffered can be sent again; a streamed one cannot.
        if (fe.retryable && attempt < 3 && (replayable(req) || hooks?.state.body)) {
          (tried ??= new Set()).add(failed);
          target = next(tried);
          if (target) continue;
        }
        this.opts.log.debug({ err: fe.message, tunnel: failed }, 'forward failed');
        hooks?.pipeline.onResult(hooks.state, 'error');
        sendError(req, res, fe.code, fe.message);
        return res.statusCode;
      }
    }
    sendError(req, res, 7003);
    return 503;
  }

  /** Serves a request that arrived over a hop for a tunnel of this node. */
  async forwardHop(req: http.IncomingMessage, res: http.ServerResponse): Promise<number> {
    const id = String(req.headers[HOP.tunnel] ?? '');
    const tunnel = this.opts.registry.getLocal(id);
    if (!tunnel) {
      sendError(req, res, 7003, `tunnel ${id} is not on this node`, { [HOP.miss]: '1' });
      return 503;
    }
    const info: RequestInfo = {
      scheme: req.headers[HOP.scheme] === 'https' ? 'https' : 'http',
      clientAddr: String(req.headers[HOP.clientAddr] ?? '0.0.0.0:0'),
      edgeType: req.headers[HOP.edgeType] === '0' ? '0' : '3',
    };
    try {
      return await this.viaLocal(req, res, tunnel, info, hopRequestHeaders(req.rawHeaders));
    } catch (err) {
      const fe = err instanceof ForwardError ? err : new ForwardError(7004, (err as Error).message);
      // A stream that could not even be opened is a miss for the sender, which may try elsewhere.
      sendError(req, res, fe.code, fe.message, fe.retryable ? { [HOP.miss]: '1' } : undefined);
      return res.statusCode;
    }
  }

  private viaLocal(req: http.IncomingMessage, res: http.ServerResponse, tunnel: LocalTunnel, info: RequestInfo, headers: string[], hooks?: ForwardHooks): Promise<number> {
    const pool = this.poolFor(tunnel);
    if (pool.inFlight >= this.opts.maxStreamsPerTunnel + this.opts.maxQueuedPerTunnel) {
      return Promise.reject(new ForwardError(7006, `more than ${this.opts.maxQueuedPerTunnel} requests are waiting for tunnel ${tunnel.id}`, true));
    }
    pool.inFlight++;
    const opts = { agent: pool.agent, method: req.method, path: req.url, headers, setHost: false, clientAddr: info.clientAddr, scheme: info.scheme, edgeType: info.edgeType };
    return this.exchange(req, res, opts as http.RequestOptions, () => pool.inFlight--, true, hooks);
  }

  private viaHop(req: http.IncomingMessage, res: http.ServerResponse, tunnelId: string, nodeAddress: string, info: RequestInfo, headers: string[], hooks?: ForwardHooks): Promise<number> {
    const colon = nodeAddress.lastIndexOf(':');
    const hopHeaders = headers.concat(HOP.tunnel, tunnelId, HOP.clientAddr, info.clientAddr, HOP.scheme, info.scheme, HOP.edgeType, info.edgeType);
    if (this.opts.hopToken) hopHeaders.push(HOP.token, this.opts.hopToken);
    const opts: http.RequestOptions = {
      agent: this.hopAgent,
      host: nodeAddress.slice(0, colon).replace(/^\[|\]$/g, ''),
      port: Number(nodeAddress.slice(colon + 1)),
      method: req.method,
      path: req.url,
      headers: hopHeaders as unknown as http.OutgoingHttpHeaders,
      setHost: false,
    };
    return this.exchange(req, res, opts, undefined, false, hooks);
  }

  /**
   * One request/response exchange. Rejects (before anything was sent to the client) with a
   * ForwardError; resolves with the status once the response has been passed on.
   */
  private exchange(req: http.IncomingMessage, res: http.ServerResponse, opts: http.RequestOptions, done: (() => void) | undefined, local: boolean, hooks?: ForwardHooks): Promise<number> {
    return new Promise<number>((resolve, reject) => {
      let settled = false;
      const finish = (fn: () => void) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        done?.();
        fn();
      };
      const preq = http.request(opts);
      const timer = setTimeout(() => {
        preq.destroy(new ForwardError(7005, `no response from the upstream within ${this.opts.upstreamTimeoutMs} ms`));
      }, this.opts.upstreamTimeoutMs);
      let sent = false;
      preq.on('response', (pres) => {
        clearTimeout(timer);
        if (!local && pres.headers[HOP.miss] && !sent) {
          pres.resume();
          finish(() => reject(new ForwardError(7003, 'the tunnel has moved or gone', true)));
          return;
        }
        sent = true;
        const status = pres.statusCode ?? 502;
        res.on('close', () => {
          if (!res.writableFinished) pres.destroy();
          finish(() => resolve(res.writableFinished ? (res.statusCode ?? 502) : 499));
        });
        pres.on('error', () => res.destroy());
        if (!hooks) {
          res.writeHead(status, pres.statusMessage, responseHeaders(pres.rawHeaders) as unknown as http.OutgoingHttpHeaders);
          pres.pipe(res);
          return;
        }
        hooks.pipeline.onResult(hooks.state, status);
        if (!hooks.pipeline.hasResponseStages) {
          res.writeHead(status, pres.statusMessage, responseHeaders(pres.rawHeaders) as unknown as http.OutgoingHttpHeaders);
          pres.pipe(res);
          return;
        }
        hooks.pipeline.onResponse(hooks.state, status, responseHeaders(pres.rawHeaders)).then(
          (d) => {
            if (isOutcome(d)) {
              pres.resume();
              const body = d.body ?? '';
              res.writeHead(d.status, { 'content-length': Buffer.byteLength(body), ...d.headers });
              res.end(req.method === 'HEAD' ? undefined : body);
              return;
            }
            const decision = d!;
            res.writeHead(decision.status, decision.status === status ? pres.statusMessage : undefined, decision.headers as unknown as http.OutgoingHttpHeaders);
            let body: import('node:stream').Readable = pres;
            for (const t of decision.transforms) body = body.pipe(t);
            body.on('error', () => res.destroy());
            body.pipe(res);
          },
          (err: unknown) => {
            this.opts.log.error({ err }, 'response stages failed');
            pres.resume();
            res.destroy();
          },
        );
      });
      preq.on('error', (err: Error & { code?: string }) => {
        if (sent) {
          res.destroy();
          finish(() => resolve(499));
          return;
        }
        if (err instanceof ForwardError) finish(() => reject(err));
        else if (err.code === 'STREAM_CAP') finish(() => reject(new ForwardError(7006, 'the agent session has no free stream', true)));
        else if (err.code === 'SESSION_CLOSED' || err.code === 'ECONNREFUSED' || err.code === 'EHOSTUNREACH' || (err.code === 'ECONNRESET' && preq.reusedSocket))
          finish(() => reject(new ForwardError(7004, local ? 'the agent session closed' : `the ingress node holding the tunnel is unreachable (${err.code})`, true)));
        else finish(() => reject(new ForwardError(7004, `the tunnel failed: ${err.message}`)));
      });
      // The client went away before the response: stop the upstream request too.
      res.on('close', () => {
        if (!sent) preq.destroy();
      });
      if (hooks?.state.body) preq.end(hooks.state.body);
      else req.pipe(preq);
    });
  }

  /** Carries an upgrade request (WebSocket) to the target as raw bytes, then pipes both ways. */
  async upgrade(req: http.IncomingMessage, socket: Duplex, head: Buffer, target: TunnelTarget, info: RequestInfo, headers: string[]): Promise<void> {
    let upstream: Duplex;
    try {
      if (target.kind === 'local') {
        upstream = await target.tunnel.openStream({ clientAddr: info.clientAddr, proto: info.scheme, edgeType: info.edgeType });
        upstream.write(requestHead(req.method ?? 'GET', req.url ?? '/', headers));
      } else {
        const addr = target.tunnel.nodeAddress;
        const colon = addr.lastIndexOf(':');
        const hopHeaders = headers.concat(HOP.tunnel, target.tunnel.id, HOP.clientAddr, info.clientAddr, HOP.scheme, info.scheme, HOP.edgeType, info.edgeType);
        if (this.opts.hopToken) hopHeaders.push(HOP.token, this.opts.hopToken);
        upstream = await new Promise<net.Socket>((resolve, reject) => {
          const s = net.connect({ host: addr.slice(0, colon).replace(/^\[|\]$/g, ''), port: Number(addr.slice(colon + 1)) }, () => resolve(s));
          s.once('error', reject);
        });
        upstream.write(requestHead(req.method ?? 'GET', req.url ?? '/', hopHeaders));
      }
    } catch (err) {
      sendUpgradeError(socket, (err as { code?: string }).code === 'STREAM_CAP' ? 7006 : 7004, (err as Error).message);
      return;
    }
    splice(socket, upstream, head);
  }

  /**
   * A raw byte stream to a tunnel (TCP semantics; the websocket_tcp_converter): a proxy stream on
   * this node, or a hop upgrade that the holding node answers with 101 and then splices raw.
   */
  async rawStream(target: TunnelTarget, info: RequestInfo & { proto: 'tcp' | 'http' | 'https' }): Promise<Duplex> {
    if (target.kind === 'local') return target.tunnel.openStream({ clientAddr: info.clientAddr, proto: info.proto, edgeType: info.edgeType });
    const addr = target.tunnel.nodeAddress;
    const colon = addr.lastIndexOf(':');
    const headers = ['Host', addr, 'Connection', 'Upgrade', 'Upgrade', 'warren-raw', HOP.tunnel, target.tunnel.id, HOP.raw, '1', HOP.proto, info.proto, HOP.clientAddr, info.clientAddr, HOP.scheme, info.scheme, HOP.edgeType, info.edgeType];
    if (this.opts.hopToken) headers.push(HOP.token, this.opts.hopToken);
    const sock = await new Promise<net.Socket>((resolve, reject) => {
      const s = net.connect({ host: addr.slice(0, colon).replace(/^\[|\]$/g, ''), port: Number(addr.slice(colon + 1)) }, () => resolve(s));
      s.once('error', reject);
    });
    sock.write(requestHead('GET', '/', headers));
    // Read the hop's answer head; anything after it is already tunnel bytes.
    return new Promise<Duplex>((resolve, reject) => {
      let buf = Buffer.alloc(0);
      const onData = (c: Buffer) => {
        buf = Buffer.concat([buf, c]);
        const end = buf.indexOf('\r\n\r\n');
        if (end === -1) {
          if (buf.length > 16 * 1024) fail(new Error('the hop answered with an oversized head'));
          return;
        }
        // Pause first: bytes that came with the 101 (a server that speaks first) must wait for
        // the splice's pipe rather than be emitted with no listener.
        sock.pause();
        sock.off('data', onData);
        sock.off('error', fail);
        if (!buf.subarray(0, 12).toString('latin1').startsWith('HTTP/1.1 101')) {
          sock.destroy();
          reject(Object.assign(new Error(`the node holding the tunnel refused: ${buf.subarray(0, buf.indexOf('\r\n')).toString('latin1')}`), { code: 'SESSION_CLOSED' }));
          return;
        }
        const rest = buf.subarray(end + 4);
        if (rest.length > 0) sock.unshift(rest);
        resolve(sock);
      };
      const fail = (err: Error) => {
        sock.destroy();
        reject(err);
      };
      sock.on('data', onData);
      sock.once('error', fail);
    });
  }

  /** Serves an upgrade that arrived over a hop. */
  async upgradeHop(req: http.IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    const tunnel = this.opts.registry.getLocal(String(req.headers[HOP.tunnel] ?? ''));
    if (!tunnel) {
      sendUpgradeError(socket, 7003, 'the tunnel is not on this node');
      return;
    }
    const info: RequestInfo = {
      scheme: req.headers[HOP.scheme] === 'https' ? 'https' : 'http',
      clientAddr: String(req.headers[HOP.clientAddr] ?? '0.0.0.0:0'),
      edgeType: req.headers[HOP.edgeType] === '0' ? '0' : '3',
    };
    if (req.headers[HOP.raw] === '1') {
      const proto = req.headers[HOP.proto] === 'tcp' ? 'tcp' : info.scheme;
      let upstream: Duplex;
      try {
        upstream = await tunnel.openStream({ clientAddr: info.clientAddr, proto, edgeType: info.edgeType });
      } catch (err) {
        sendUpgradeError(socket, 7004, (err as Error).message);
        return;
      }
      socket.write('HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: warren-raw\r\n\r\n');
      splice(socket, upstream, head);
      return;
    }
    await this.upgrade(req, socket, head, { kind: 'local', tunnel }, info, hopRequestHeaders(req.rawHeaders));
  }
}

/** Pipes two byte streams into each other until either side ends or fails. */
export function splice(client: Duplex, upstream: Duplex, head?: Buffer): void {
  if (head && head.length > 0) upstream.write(head);
  const destroyBoth = () => {
    client.destroy();
    upstream.destroy();
  };
  client.on('error', destroyBoth);
  upstream.on('error', destroyBoth);
  client.on('close', () => upstream.destroy());
  upstream.on('close', () => client.destroy());
  client.pipe(upstream);
  upstream.pipe(client);
}
