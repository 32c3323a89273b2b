import { afterEach, describe, expect, it } from 'vitest';
import https from 'node:https';
import net from 'node:net';
import tls from 'node:tls';
import { createCertificate } from '@warren/shared';
import { captureClientHello, ja4, ja4Of, ja4OfRecord, parseClientHello } from './client-hello.js';
import { wireSocket } from './conn-facts.js';
import { clientHelloRecord, clientJa4 } from '../../../../test/support/client-hello.js';

const u16 = (v: number) => Buffer.from([v >> 8, v & 0xff]);
const withU16Length = (b: Buffer) => Buffer.concat([u16(b.length), b]);
const ext = (type: number, data: Buffer = Buffer.alloc(0)) => Buffer.concat([u16(type), withU16Length(data)]);

/** A ClientHello handshake message (the payload of a record) with the given parts. */
function clientHello(o: { version?: number; ciphers: number[]; extensions: Buffer[] }): Buffer {
  const body = Buffer.concat([
    u16(o.version ?? 0x0303),
    Buffer.alloc(32, 7), // random
    Buffer.from([32]),
    Buffer.alloc(32, 9), // session id
    withU16Length(Buffer.concat(o.ciphers.map(u16))),
    Buffer.from([1, 0]), // compression: null
    ...(o.extensions.length > 0 ? [withU16Length(Buffer.concat(o.extensions))] : []),
  ]);
  return Buffer.concat([Buffer.from([0x01, body.length >> 16, (body.length >> 8) & 0xff, body.length & 0xff]), body]);
}

const alpnExt = (...protocols: string[]) => ext(0x0010, withU16Length(Buffer.concat(protocols.map((p) => Buffer.concat([Buffer.from([p.length]), Buffer.from(p, 'latin1')])))));
const versionsExt = (...v: number[]) => ext(0x002b, Buffer.concat([Buffer.from([v.length * 2]), ...v.map(u16)]));
const sigalgsExt = (...v: number[]) => ext(0x000d, withU16Length(Buffer.concat(v.map(u16))));
const sniExt = (name: string) => ext(0x0000, withU16Length(Buffer.concat([Buffer.from([0]), withU16Length(Buffer.from(name))])));

/**
 * A Chrome 143 ClientHello as browserleaks.com reported it (ja4_ro: ciphers and extensions in
 * the order sent), with GREASE values added where Chrome puts them.
 */
function chrome(): Buffer {
  const order = [0x002d, 0x0033, 0x0010, 0xfe0d, 0x0017, 0x44cd, 0x0000, 0x000b, 0x000a, 0x002b, 0xff01, 0x0023, 0x0012, 0x0005, 0x000d, 0x001b];
  const extensions = order.map((t) =>
    t === 0x0010 ? alpnExt('h2', 'http/1.1') : t === 0x002b ? versionsExt(0x7a7a, 0x0304, 0x0303) : t === 0x000d ? sigalgsExt(0x0403, 0x0804, 0x0401, 0x0503, 0x0805, 0x0501, 0x0806, 0x0601) : t === 0x0000 ? sniExt('tls.browserleaks.com') : ext(t, Buffer.from([0, 1])),
  );
  return clientHello({
    ciphers: [0x2a2a, 0x1301, 0x1302, 0x1303, 0xc02b, 0xc02f, 0xc02c, 0xc030, 0xcca9, 0xcca8, 0xc013, 0xc014, 0x009c, 0x009d, 0x002f, 0x0035],
    extensions: [ext(0x0a0a), ...extensions, ext(0xdada, Buffer.from([0]))],
  });
}

describe('JA4 of a ClientHello', () => {
  it("gives a published browser's fingerprint (GREASE ignored, extensions sorted, SNI and ALPN left out of the hash)", () => {
    expect(ja4OfRecord(chrome())).toBe('t13d1516h2_8daaf6152771_d8a2da3f94cd');
  });

  it('reads the version, SNI, ALPN and empty lists as the spec says', () => {
    const base = { ciphers: [0x1301], extensions: [] as Buffer[] };
    // No extensions at all: the hello's version, no SNI, no ALPN, twelve zeros for the extensions.
    expect(ja4OfRecord(clientHello({ ...base, version: 0x0303 }))).toMatch(/^t12i010000_[0-9a-f]{12}_000000000000$/);
    expect(ja4OfRecord(clientHello({ ...base, version: 0x0301 }))).toMatch(/^t10i010000_/);
    expect(ja4OfRecord(clientHello({ ciphers: [0x0a0a], extensions: [] }))).toBe('t12i000000_000000000000_000000000000');
    // supported_versions wins; GREASE in it is ignored.
    expect(ja4OfRecord(clientHello({ ...base, extensions: [versionsExt(0xfafa, 0x0303, 0x0304)] }))).toMatch(/^t13i0101/);
    // The first ALPN value; http/1.1 → h1; a non-alphanumeric end → hex nibbles.
    expect(ja4OfRecord(clientHello({ ...base, extensions: [alpnExt('http/1.1', 'h2')] }))).toMatch(/^t12i0101h1_/);
    expect(ja4OfRecord(clientHello({ ...base, extensions: [alpnExt('\xab-\xcd')] }))).toMatch(/^t12i0101ad_/);
    expect(ja4OfRecord(clientHello({ ...base, extensions: [sniExt('a.test'), alpnExt('h2')] }))).toMatch(/^t12d0102h2_[0-9a-f]{12}_000000000000$/);
    // Counts stop at 99.
    const many = Array.from({ length: 120 }, (_, i) => 0x0100 + i);
    expect(ja4OfRecord(clientHello({ ciphers: many, extensions: many.map((t) => ext(t)) }))).toMatch(/^t12i9999/);
  });

  it('the extension hash is the sorted types, then the signature algorithms in the order sent', () => {
    const a = ja4(parseClientHello(clientHello({ ciphers: [0x1301], extensions: [ext(0x000a), sigalgsExt(0x0804, 0x0403)] }))!);
    const b = ja4(parseClientHello(clientHello({ ciphers: [0x1301], extensions: [sigalgsExt(0x0804, 0x0403), ext(0x000a)] }))!);
    const c = ja4(parseClientHello(clientHello({ ciphers: [0x1301], extensions: [ext(0x000a), sigalgsExt(0x0403, 0x0804)] }))!);
    expect(a).toBe(b);
    expect(a).not.toBe(c);
  });

  it('anything but a whole ClientHello gives no fingerprint, never a throw', () => {
    const whole = chrome();
    for (let n = 0; n < whole.length; n += 7) expect(ja4OfRecord(whole.subarray(0, n))).toBe('');
    expect(ja4OfRecord(Buffer.from([0x02, 0, 0, 0]))).toBe(''); // a ServerHello
    // Lengths that overrun their parent.
    const bad = Buffer.from(whole);
    bad.writeUInt16BE(0xffff, 4 + 2 + 32 + 1 + 32);
    expect(ja4OfRecord(bad)).toBe('');
    for (let i = 0; i < 500; i++) {
      const fuzz = Buffer.from(whole);
      for (let k = 0; k < 4; k++) fuzz[Math.floor(Math.random() * fuzz.length)] = Math.floor(Math.random() * 256);
      expect(typeof ja4OfRecord(fuzz)).toBe('string');
    }
  });
});

describe('captureClientHello on a real HTTPS server', () => {
  const servers: net.Server[] = [];
  afterEach(async () => {
    for (const s of servers.splice(0)) {
      (s as https.Server).closeAllConnections?.();
      await new Promise((r) => s.close(r));
    }
  });

  async function server(waitMs?: number) {
    const cert = await createCertificate({ commonName: 'localhost', days: 1, keyType: 'ec', dnsNames: ['localhost'] });
    const srv = https.createServer({ cert: cert.certificatePem, key: cert.privateKeyPem }, (req, res) => res.end(ja4Of(wireSocket(req.socket)) || '-'));
    captureClientHello(srv, { waitMs });
    const errors: string[] = [];
    srv.on('tlsClientError', (err: Error & { code?: string }) => errors.push(err.code ?? err.message));
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
    servers.push(srv);
    return { port: (srv.address() as net.AddressInfo).port, errors };
  }

  function get(port: number, o: tls.ConnectionOptions & { path?: string } = {}): Promise<string> {
    return new Promise((resolve, reject) => {
      https
        .get({ host: '127.0.0.1', port, path: o.path ?? '/', rejectUnauthorized: false, agent: false, ...o }, (res) => {
          let body = '';
          res.setEncoding('utf8');
          res.on('data', (d: string) => (body += d));
          res.on('end', () => resolve(body));
        })
        .on('error', reject);
    });
  }

  it("fingerprints Node's own ClientHello; SNI, ALPN and the version change it as JA4 says", async () => {
    const { port } = await server();
    const plain = await get(port);
    expect(plain).toMatch(/^t13i\d{4}00_[0-9a-f]{12}_[0-9a-f]{12}$/);
    expect(plain).toBe(await clientJa4({ rejectUnauthorized: false }));
    expect(await get(port)).toBe(plain); // stable across connections
    expect(await get(port, { servername: 'localhost' })).toMatch(/^t13d/);
    expect(await get(port, { ALPNProtocols: ['http/1.1'] })).toMatch(/^t13i\d{4}h1_/);
    expect(await get(port, { maxVersion: 'TLSv1.2', minVersion: 'TLSv1.2' })).toMatch(/^t12i/);
  });

  /** Sends `bytes` to the server in `step`-byte writes and resolves with its first answer. */
  async function firstAnswer(port: number, bytes: Buffer, step: number, pauseMs = 0): Promise<Buffer> {
    const raw = net.connect(port, '127.0.0.1');
    raw.on('error', () => {});
    const answered = new Promise<Buffer>((resolve) => {
      raw.once('data', resolve);
      raw.once('close', () => resolve(Buffer.alloc(0)));
    });
    await new Promise((r) => raw.once('connect', r));
    if (pauseMs) await new Promise((r) => setTimeout(r, pauseMs));
    for (let i = 0; i < bytes.length; i += step) {
      raw.write(bytes.subarray(i, i + step));
      await new Promise((r) => setImmediate(r));
    }
    const first = await answered;
    raw.destroy();
    return first;
  }

  it('a ClientHello sent a few bytes at a time is put together, and the handshake carries on', async () => {
    const { port } = await server();
    const hello = await clientHelloRecord();
    expect(hello[0]).toBe(0x16);
    expect(ja4OfRecord(hello.subarray(5))).toMatch(/^t13/);
    const first = await firstAnswer(port, hello, 3);
    expect(first[0]).toBe(0x16); // a handshake record: the ServerHello
  });

  it('another protocol on the port, a silent client and a client that leaves are answered as before', async () => {
    const { port, errors } = await server(100);
    // Plain HTTP to the HTTPS port: handed over at once; TLS refuses it and closes.
    const refused = await firstAnswer(port, Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n'), 1024);
    expect(refused[0]).not.toBe(0x16);
    await new Promise((r) => setTimeout(r, 20));
    expect(errors.length).toBe(1);
    // Silent past waitMs: handed over without a fingerprint; its hello, when it comes, is answered.
    const late = await firstAnswer(port, await clientHelloRecord(), 4096, 250);
    expect(late[0]).toBe(0x16);
    // Leaves before a whole record: closed, nothing handed to TLS.
    const gone = net.connect(port, '127.0.0.1');
    gone.on('error', () => {});
    gone.write(Buffer.from([0x16, 0x03, 0x01, 0x02]));
    gone.end();
    await new Promise((r) => gone.on('close', r));
    // The server still serves.
    expect(await get(port)).toMatch(/^t13/);
  });
});
