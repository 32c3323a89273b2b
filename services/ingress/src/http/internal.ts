import http from 'node:http';
import { timingSafeEqual } from 'node:crypto';
import type { Duplex } from 'node:stream';
import type { Registry } from 'prom-client';
import type { Logger } from '@warren/shared';
import { sendError, sendUpgradeError } from './error-page.js';
import { HOP, HOP_MAX_HEADER_BYTES, type Forwarder } from './proxy.js';

function tokenOk(expected: Buffer | null, got: string | string[] | undefined): boolean {
  if (!expected) return true;
  if (typeof got !== 'string') return false;
  const g = Buffer.from(got);
  return g.length === expected.length && timingSafeEqual(g, expected);
}

export interface InternalServerOptions {
  forwarder: Forwarder;
  registry: Registry;
  hopToken: string;
  isReady: () => boolean;
  /**
   * Serves a hop request itself when its tunnel is an endpoint of this node with a traffic policy
   * (the policy runs on the node holding the tunnel: `PublicHandler.serveHop`); false otherwise.
   */
  hopPolicy?: {
    request(req: http.IncomingMessage, res: http.ServerResponse): boolean;
    upgrade(req: http.IncomingMessage, socket: Duplex, head: Buffer): boolean;
  };
  /** Extra state for /status (config version, connections). */
  status: () => Record<string, unknown>;
  log: Logger;
}

/**
 * The node's internal listener: requests other nodes carry here for tunnels of this node's agents
 * (`x-warren-tunnel`, authenticated by the shared node token), and the operational endpoints
 * `/metrics`, `/healthz`, `/readyz` and `/status`. Bind it to a private address.
 */
export function createInternalServer(o: InternalServerOptions): http.Server {
  const expected = o.hopToken ? Buffer.from(o.hopToken) : null;
  // Hops carry a client's request head (up to the public listeners' 16 KiB) plus the hop's own
  // headers (x-warren-conn, …): read more than the default 16 KiB, or a request the client's node
  // accepted would be refused here (431).
  const server = http.createServer({ maxHeaderSize: HOP_MAX_HEADER_BYTES }, (req, res) => {
    if (req.headers[HOP.tunnel] !== undefined) {
      if (!tokenOk(expected, req.headers[HOP.token])) {
        res.writeHead(403, { 'content-type': 'text/plain' }).end('bad node token\n');
        return;
      }
      if (o.hopPolicy?.request(req, res)) return;
      void o.forwarder.forwardHop(req, res);
      return;
    }
    const path = (req.url ?? '/').split('?')[0];
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { allow: 'GET, HEAD' }).end();
      return;
    }
    if (path === '/healthz') {
      res.writeHead(200, { 'content-type': 'application/json' }).end('{"status":"ok"}\n');
    } else if (path === '/readyz') {
      const ready = o.isReady();
      res.writeHead(ready ? 200 : 503, { 'content-type': 'application/json' }).end(JSON.stringify({ status: ready ? 'ready' : 'no configuration applied yet' }) + '\n');
    } else if (path === '/status') {
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(o.status()) + '\n');
    } else if (path === '/metrics') {
      o.registry.metrics().then(
        (text) => res.writeHead(200, { 'content-type': o.registry.contentType }).end(text),
        (err: unknown) => {
          o.log.error({ err }, 'metrics failed');
          res.writeHead(500).end();
        },
      );
    } else {
      sendError(req, res, 7001, 'no such internal path');
    }
  });
  server.on('upgrade', (req: http.IncomingMessage, socket: Duplex, head: Buffer) => {
    socket.on('error', () => socket.destroy());
    if (req.headers[HOP.tunnel] === undefined || !tokenOk(expected, req.headers[HOP.token])) {
      sendUpgradeError(socket, 7003, 'not a hop request');
      return;
    }
    if (o.hopPolicy?.upgrade(req, socket, head)) return;
    void o.forwarder.upgradeHop(req, socket, head);
  });
  server.keepAliveTimeout = 75_000;
  return server;
}
