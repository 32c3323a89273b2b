import type http from 'node:http';
import net from 'node:net';

/**
 * The upstream side of {@link upgradeEcho}: `server` answers every Upgrade with 101 (`Upgrade:
 * echo`) and echoes the bytes that follow; then it listens on 127.0.0.1 and resolves with its port.
 */
export function listenEchoingUpgrades(server: http.Server): Promise<number> {
  server.on('upgrade', (_req, socket: net.Socket) => {
    socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n');
    socket.pipe(socket);
  });
  return new Promise<number>((resolve) => server.listen(0, '127.0.0.1', () => resolve((server.address() as net.AddressInfo).port)));
}

/**
 * Sends an HTTP/1.1 upgrade request (`Upgrade: echo`) to 127.0.0.1:`port`, writes `word` once the
 * response head has arrived, and resolves with everything read once the word came back: the
 * upstreams of the tests answer 101 and then echo bytes, as a WebSocket server would frames.
 */
export function upgradeEcho(port: number, host: string, path: string, word = 'ping', timeoutMs = 10_000): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1', () => s.write(`GET ${path} HTTP/1.1\r\nHost: ${host}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n`));
    let buf = '';
    let sent = false;
    const timer = setTimeout(() => {
      s.destroy();
      reject(new Error(`no echo within ${timeoutMs} ms: ${JSON.stringify(buf)}`));
    }, timeoutMs);
    s.on('data', (c: Buffer) => {
      buf += c.toString();
      if (!sent && buf.includes('\r\n\r\n')) {
        sent = true;
        s.write(word);
      }
      if (sent && buf.endsWith(word)) {
        clearTimeout(timer);
        s.destroy();
        resolve(buf);
      }
    });
    s.on('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
  });
}
