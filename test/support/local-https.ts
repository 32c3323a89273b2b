import type https from 'node:https';
import type net from 'node:net';
import type { Duplex } from 'node:stream';

/** Listens on 127.0.0.1 (a free port) and gives a close() that also drops kept-alive connections. */
export async function listenLocal(server: https.Server): Promise<{ port: number; close(): Promise<void> }> {
  const sockets = new Set<Duplex>();
  server.on('connection', (s: Duplex) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  const port = await new Promise<number>((r) => server.listen(0, '127.0.0.1', () => r((server.address() as net.AddressInfo).port)));
  return {
    port,
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}
