import net from 'node:net';
import type { LocalTunnel, TunnelStream } from '../agents/server.js';

/**
 * Tests: a local tunnel whose streams are plain TCP connections to `port()` on 127.0.0.1 (an
 * upstream the test runs), in place of an agent's proxy streams. `port` is read at each open, so
 * a test may start its upstream after creating the tunnel.
 */
export function tcpTunnel(id: string, labels: Record<string, string>, port: () => number, extra: Partial<LocalTunnel> = {}): LocalTunnel {
  return {
    id, accountId: 'ac_1', sessionId: 'ts_1', proto: 'labeled', labels, publicUrl: '', bindings: [], poolingEnabled: false, forwardsTo: 'x', metadata: '', startedAt: new Date().toISOString(),
    openStreams: 0,
    openStreamSync: () => net.connect(port(), '127.0.0.1') as unknown as TunnelStream,
    openStream: () =>
      new Promise<TunnelStream>((resolve, reject) => {
        const s = net.connect(port(), '127.0.0.1', () => resolve(s as unknown as TunnelStream));
        s.once('error', reject);
      }),
    ...extra,
  };
}
