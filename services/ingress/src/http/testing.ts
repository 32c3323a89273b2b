import http from 'node:http';
import net from 'node:net';
import type { DataPlaneConfig, EventEnvelope, Logger, PublishItem } from '@warren/shared';
import type { IngressMetrics } from '../metrics.js';
import { TunnelRegistry } from '../tunnels/registry.js';
import { tcpTunnel } from '../tunnels/testing.js';
import { createPipelineCompiler } from '../pipeline/runner.js';
import type { RateLimiter, StageFactory } from '../pipeline/types.js';
import type { EventPublisher, TrafficEvents } from '../events/traffic-events.js';
import { Forwarder } from './proxy.js';
import { PublicHandler } from './public.js';
import { RoutingTable } from './routing.js';

export function listen(server: net.Server, host = '127.0.0.1'): Promise<number> {
  return new Promise((resolve) => server.listen(0, host, () => resolve((server.address() as net.AddressInfo).port)));
}

export interface PublicListenerOptions {
  cfg: DataPlaneConfig;
  stages: StageFactory[];
  limiter: RateLimiter;
  metrics: IngressMetrics;
  log: Logger;
  events?: TrafficEvents;
  /** One local tunnel (`tn_up`) with these labels, its streams TCP connections to `upstreamPort`. */
  labels: Record<string, string>;
  upstreamPort: number;
  /** The address the public listener binds (default 127.0.0.1; `::` for a dual-stack one). */
  host?: string;
}

/**
 * Tests: a plain-HTTP public listener (PublicHandler over `cfg`, the route pipelines built from
 * `stages`) in front of one TCP-backed tunnel. Resolves with its port and a close().
 */
export async function startPublicListener(o: PublicListenerOptions): Promise<{ port: number; close: () => void }> {
  const registry = new TunnelRegistry('n1');
  const forwarder = new Forwarder({ registry, hopToken: 'secret', log: o.log, upstreamTimeoutMs: 3000, maxStreamsPerTunnel: 4, maxQueuedPerTunnel: 100 });
  const handler = new PublicHandler({ registry, forwarder, metrics: o.metrics, log: o.log, events: o.events });
  handler.setTable(new RoutingTable(o.cfg, createPipelineCompiler(o.stages, { limiter: o.limiter, log: o.log, registry: o.metrics.registry })));
  const pub = http.createServer(handler.handler('http'));
  const port = await listen(pub, o.host);
  registry.addLocal(tcpTunnel('tn_up', o.labels, () => o.upstreamPort));
  return {
    port,
    close: () => {
      pub.closeAllConnections();
      pub.close();
      forwarder.close();
    },
  };
}

/**
 * Tests: an upstream that answers raw bytes: `onRequest` gets each request's target (heads are
 * split on CRLFCRLF; bodies are not expected) and writes what it likes to the socket; returning
 * 'stop' ends the reading of that connection's further requests.
 */
export function rawHttpServer(onRequest: (path: string, sock: net.Socket) => 'stop' | void, onConnection?: (sock: net.Socket) => void): net.Server {
  return net.createServer((sock) => {
    onConnection?.(sock);
    sock.on('error', () => {});
    let buf = '';
    sock.on('data', (c: Buffer) => {
      buf += c.toString('latin1');
      for (let end = buf.indexOf('\r\n\r\n'); end !== -1; end = buf.indexOf('\r\n\r\n')) {
        const head = buf.slice(0, end);
        buf = buf.slice(end + 4);
        if (onRequest(head.split(' ')[1] ?? '/', sock) === 'stop') return;
      }
    });
  });
}

/** Tests: an event publisher that keeps every event it is given, parsed, in `published`. */
export function capturingPublisher(): { publisher: EventPublisher; published: Array<EventEnvelope & { object: any }> } {
  const published: Array<EventEnvelope & { object: any }> = [];
  const publisher: EventPublisher = {
    async publish(items: PublishItem[]) {
      let n = 0;
      for (const i of items) for (const e of i.events) (published.push(JSON.parse(e) as EventEnvelope & { object: any }), n++);
      return { accepted: n, overflowed: 0 };
    },
  };
  return { publisher, published };
}
