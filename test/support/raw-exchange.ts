import net from 'node:net';

/**
 * Writes `parts` on a new TCP connection to 127.0.0.1:`port` (a number among them is a pause in
 * ms), and collects what comes back, as latin1 text, until nothing has come for `idle` ms, the
 * connection closes, or `max` ms have passed. For tests that speak raw HTTP/1.1 (pipelining,
 * malformed heads) to a public listener.
 */
export function rawExchange(port: number, parts: Array<string | Buffer | number>, idle: number, max = 20_000): Promise<{ out: string; closed: boolean }> {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    const chunks: Buffer[] = [];
    let closed = false;
    let timer: NodeJS.Timeout | undefined;
    const done = () => {
      clearTimeout(timer);
      clearTimeout(maxT);
      s.destroy();
      resolve({ out: Buffer.concat(chunks).toString('latin1'), closed });
    };
    const arm = () => {
      clearTimeout(timer);
      timer = setTimeout(done, idle);
    };
    const maxT = setTimeout(done, max);
    s.on('data', (d: Buffer) => {
      chunks.push(d);
      arm();
    });
    s.on('error', () => {});
    s.on('close', () => {
      closed = true;
      done();
    });
    s.on('connect', async () => {
      for (const p of parts) {
        if (typeof p === 'number') await new Promise((r) => setTimeout(r, p));
        else if (!s.destroyed) s.write(p);
      }
      arm();
    });
  });
}

/** The status codes of the HTTP/1.1 responses in `out`, in order. */
export const statuses = (out: string): number[] => [...out.matchAll(/HTTP\/1\.1 (\d{3})/g)].map((m) => Number(m[1]));
