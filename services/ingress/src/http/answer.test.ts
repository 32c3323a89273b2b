import http from 'node:http';
import net from 'node:net';
import { once } from 'node:events';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { headerWire } from '@warren/shared';
import { sendOutcome } from './public.js';

/** The raw bytes of the answer to one request on a fresh connection. */
async function rawAnswer(port: number): Promise<Buffer> {
  const s = net.connect(port, '127.0.0.1');
  const chunks: Buffer[] = [];
  s.on('data', (c: Buffer) => chunks.push(c));
  s.write('GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n');
  await once(s, 'close');
  return Buffer.concat(chunks);
}

describe('a stage’s own answer with non-ASCII header values', () => {
  let server: http.Server;
  let port: number;
  beforeAll(async () => {
    server = http.createServer((req, res) => {
      sendOutcome(req, res, { status: 200, headers: { 'x-price': headerWire('5 €'), 'content-type': 'text/plain; charset=utf-8' }, body: 'prix: 5 €' });
    });
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    port = (server.address() as AddressInfo).port;
  });
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

  it('sends the header value as its UTF-8 bytes once, with a text body (Node writes a string body in one string with the head, in the body’s encoding)', async () => {
    const raw = await rawAnswer(port);
    const head = raw.subarray(0, raw.indexOf('\r\n\r\n'));
    const line = head.subarray(head.indexOf('x-price: ') + 9);
    expect(line.subarray(0, line.indexOf('\r\n')).toString('hex')).toBe(Buffer.from('5 €', 'utf8').toString('hex'));
    expect(raw.subarray(raw.indexOf('\r\n\r\n') + 4).toString('utf8')).toBe('prix: 5 €');
  });
});

describe('a 205 answer', () => {
  it('carries no content whatever body it was given (RFC 9110 §15.3.6), with Content-Length: 0', async () => {
    const server = http.createServer((req, res) => {
      sendOutcome(req, res, { status: 205, headers: { 'content-type': 'text/plain', 'content-length': '12' }, body: 'form cleared' });
    });
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    try {
      const text = (await rawAnswer((server.address() as AddressInfo).port)).toString('latin1');
      const [head, body] = text.split('\r\n\r\n');
      expect(head).toMatch(/^HTTP\/1\.1 205 Reset Content\r\n/);
      expect(head!.toLowerCase()).toContain('\r\ncontent-length: 0');
      expect(head!.toLowerCase()).not.toContain('content-length: 12');
      expect(body).toBe('');
    } finally {
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });
});
