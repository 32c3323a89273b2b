import net from 'node:net';
import tls from 'node:tls';
import { ja4OfRecord } from '../../services/ingress/src/http/client-hello.js';

/**
 * The first TLS record a node:tls client with `options` sends (its ClientHello), read by a
 * server that only records: what an ingress sees from an HTTPS request made with those options.
 */
export async function clientHelloRecord(options: tls.ConnectionOptions = {}): Promise<Buffer> {
  let got = Buffer.alloc(0);
  let whole: () => void = () => {};
  const done = new Promise<void>((r) => (whole = r));
  const sink = net.createServer((s) =>
    s.on('data', (d: Buffer) => {
      got = Buffer.concat([got, d]);
      if (got.length >= 5 && got.length >= 5 + got.readUInt16BE(3)) whole();
    }),
  );
  await new Promise<void>((r) => sink.listen(0, '127.0.0.1', r));
  const client = tls.connect({ ...options, host: '127.0.0.1', port: (sink.address() as net.AddressInfo).port });
  client.on('error', () => {});
  const timer = setTimeout(whole, 5_000);
  await done;
  clearTimeout(timer);
  client.destroy();
  await new Promise((r) => sink.close(r));
  return got.subarray(0, 5 + got.readUInt16BE(3));
}

/** JA4 of the ClientHello a node:tls client with `options` sends (see `clientHelloRecord`). */
export async function clientJa4(options: tls.ConnectionOptions = {}): Promise<string> {
  return ja4OfRecord((await clientHelloRecord(options)).subarray(5));
}
