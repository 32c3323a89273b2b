import type { RouteStage, StageFactory } from '../pipeline/types.js';
import { enabledModule, moduleError } from './common.js';
import { checkWebSocketUpgrade } from './websocket-tcp.js';

/**
 * `websocket_tcp_converter`: the route carries TCP over WebSocket. A client's WebSocket upgrade
 * is accepted by the ingress itself (`acceptWebSocketAsTcp`, websocket-tcp.ts) and the frames'
 * payloads travel to the agent as a raw TCP stream; the agent side never sees HTTP. The stage
 * marks the route (`convertsWebSocketToTcp`) for the upgrade path, and answers any request that
 * is not a valid WebSocket upgrade with 426 (7105).
 */

export interface WebSocketTcpConverterStage extends RouteStage {
  readonly convertsWebSocketToTcp: true;
}

export function isWebSocketTcpConverter(stage: RouteStage): stage is WebSocketTcpConverterStage {
  return (stage as Partial<WebSocketTcpConverterStage>).convertsWebSocketToTcp === true;
}

export const websocketTcpConverterStage: StageFactory = (route): WebSocketTcpConverterStage | null => {
  if (!enabledModule(route, 'websocket_tcp_converter')) return null;
  return {
    name: 'websocket_tcp_converter',
    convertsWebSocketToTcp: true,
    onRequest: (s) => {
      const problem = checkWebSocketUpgrade(s.req);
      return problem ? moduleError(s, 7105, `this route accepts only WebSocket connections: ${problem}`, { upgrade: 'websocket', 'sec-websocket-version': '13' }) : null;
    },
  };
};
