import net from 'node:net';

/**
 * A TCP forwarder on a port of its own (held for its whole life) in front of a Redis whose
 * address may change: a process pointed at `url` keeps one address while the test stops its
 * Redis and later starts another one (on whatever port is free then) and `retarget()`s here. A
 * restart on the old port could race another process for that port; this port never changes.
 * While the target is down, connections fail as they would to a dead Redis: accepted, then
 * closed when the target refuses.
 */
export class RedisFront {
  private readonly server = net.createServer((client) => this.accept(client));
  private readonly sockets = new Set<net.Socket>();
  port = 0;

  constructor(private targetPort: number) {}

  async start(): Promise<this> {
    await new Promise<void>((r) => this.server.listen(0, '127.0.0.1', r));
    this.port = (this.server.address() as net.AddressInfo).port;
    return this;
  }

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  /** New connections go to `port`; current ones are dropped (they belong to the old Redis). */
  retarget(port: number): void {
    this.targetPort = port;
    for (const s of this.sockets) s.destroy();
  }

  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((r) => this.server.close(() => r()));
  }

  private accept(client: net.Socket): void {
    const upstream = net.connect({ host: '127.0.0.1', port: this.targetPort });
    this.sockets.add(client).add(upstream);
    const end = () => {
      client.destroy();
      upstream.destroy();
      this.sockets.delete(client);
      this.sockets.delete(upstream);
    };
    client.on('error', end).on('close', end);
    upstream.on('error', end).on('close', end);
    client.pipe(upstream);
    upstream.pipe(client);
  }
}
