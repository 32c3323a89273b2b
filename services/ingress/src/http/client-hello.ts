import { createHash } from 'node:crypto';
import type net from 'node:net';
import type tls from 'node:tls';

/**
 * `conn.tls.ja4_fingerprint`: the JA4 fingerprint (FoxIO's JA4, as ngrok, Cloudflare and Envoy
 * compute it) of the ClientHello each HTTPS client sent.
 *
 * Node's TLS server does not show the ClientHello, so the public HTTPS server reads it first
 * ({@link captureClientHello}): each accepted TCP socket is read until its first TLS record is
 * whole, the record is parsed and fingerprinted, its bytes are put back (`unshift`) and the
 * socket is handed to the TLS server's own `connection` listeners, whose TLSSocket takes the
 * put-back bytes first (node:tls `initRead`). The fingerprint is a short string kept on the TCP
 * socket; the record itself is not kept. Whatever is not a whole ClientHello in one record
 * (another protocol, a record over 16 KiB, a client silent for `waitMs`) is handed over as it is,
 * so the TLS server answers it exactly as before, and the fingerprint reads `""`.
 *
 * Costs once per connection: one extra read turn before the handshake, and the parse and two
 * SHA-256 of a few hundred bytes (31 µs for a 377-byte hello on a slow box where the server's
 * handshake costs ~1.5 ms of CPU). The request path reads a symbol property.
 */

const JA4 = Symbol('warren.ja4');
type Fingerprinted = net.Socket & { [JA4]?: string };

/** A TLS record's header: type (22 = handshake), version, length. */
const RECORD_HEADER = 5;
/** TLSPlaintext.length is at most 2^14. */
const MAX_RECORD = 16_384;
/** How long a client may take to send its ClientHello before the socket is handed over without one. */
const DEFAULT_WAIT_MS = 10_000;

/**
 * Makes `server` fingerprint each client's ClientHello before its TLS handshake: its
 * `connection` listeners at the time of the call (node:tls's own) run once the first record is
 * read. Listeners added later (`prependListener` included) run at accept time as before.
 */
export function captureClientHello(server: tls.Server, opts: { waitMs?: number } = {}): void {
  const waitMs = opts.waitMs ?? DEFAULT_WAIT_MS;
  const handlers = server.listeners('connection') as ((socket: net.Socket) => void)[];
  server.removeAllListeners('connection');
  server.on('connection', (socket: net.Socket) => {
    readFirstRecord(socket, waitMs, (record) => {
      if (record) {
        const fp = ja4OfRecord(record);
        if (fp) (socket as Fingerprinted)[JA4] = fp;
      }
      for (const h of handlers) h.call(server, socket);
    });
  });
}

/** The JA4 fingerprint of the ClientHello read on `wire` (the TCP socket, see `wireSocket`); `""` when none was read. */
export function ja4Of(wire: net.Socket | null | undefined): string {
  return (wire as Fingerprinted | null | undefined)?.[JA4] ?? '';
}

/**
 * Reads `socket` until its first TLS record is whole and calls `done` with that record, or with
 * null as soon as the bytes cannot begin a TLS handshake record; every byte read is put back
 * before `done` runs. A socket that fails or ends first is destroyed and `done` is not called.
 */
function readFirstRecord(socket: net.Socket, waitMs: number, done: (record: Buffer | null) => void): void {
  let buf: Buffer | null = null;
  let finished = false;
  const finish = (record: Buffer | null) => {
    if (finished) return;
    finished = true;
    clearTimeout(timer);
    socket.off('data', onData);
    socket.off('error', onGone);
    socket.off('end', onGone);
    socket.off('close', onGone);
    // Paused before the bytes go back: a flowing socket would emit them to no listener.
    socket.pause();
    if (buf) socket.unshift(buf);
    done(record);
  };
  const onGone = () => {
    if (finished) return;
    finished = true;
    clearTimeout(timer);
    socket.off('data', onData);
    socket.destroy();
  };
  const onData = (chunk: Buffer) => {
    buf = buf ? Buffer.concat([buf, chunk]) : chunk;
    if (buf[0] !== 0x16) return finish(null);
    if (buf.length < RECORD_HEADER) return;
    const length = buf.readUInt16BE(3);
    if (length > MAX_RECORD) return finish(null);
    if (buf.length >= RECORD_HEADER + length) finish(buf.subarray(RECORD_HEADER, RECORD_HEADER + length));
  };
  const timer = setTimeout(() => finish(null), waitMs);
  timer.unref();
  socket.on('data', onData);
  socket.on('error', onGone);
  socket.on('end', onGone);
  socket.on('close', onGone);
}

/** RFC 8701's GREASE values (0x0a0a, 0x1a1a, … 0xfafa): ignored everywhere. */
const isGrease = (v: number): boolean => (v & 0x0f0f) === 0x0a0a && v >> 8 === (v & 0xff);

const EXT_SERVER_NAME = 0x0000;
const EXT_SIGNATURE_ALGORITHMS = 0x000d;
const EXT_ALPN = 0x0010;
const EXT_SUPPORTED_VERSIONS = 0x002b;

/** The parts of a ClientHello JA4 reads. */
export interface ClientHelloFacts {
  /** ClientHello.legacy_version. */
  version: number;
  ciphers: number[];
  /** Extension types in the order sent. */
  extensions: number[];
  /** supported_versions' list; null when the extension is absent. */
  supportedVersions: number[] | null;
  /** The first ALPN protocol's bytes; null when there is no ALPN extension or it is empty. */
  firstAlpn: Buffer | null;
  signatureAlgorithms: number[];
}

/**
 * The ClientHello in a handshake record's payload; null when the payload does not hold a whole
 * ClientHello (another message, one split over records, or malformed).
 */
export function parseClientHello(payload: Buffer): ClientHelloFacts | null {
  if (payload.length < 4 || payload[0] !== 0x01) return null;
  const bodyLength = payload.readUIntBE(1, 3);
  if (4 + bodyLength > payload.length) return null;
  const b = payload.subarray(4, 4 + bodyLength);
  let p = 0;
  const need = (n: number) => p + n <= b.length;
  if (!need(2 + 32 + 1)) return null;
  const version = b.readUInt16BE(p);
  p += 2 + 32;
  const sessionIdLength = b[p]!;
  p += 1 + sessionIdLength;
  if (!need(2)) return null;
  const cipherBytes = b.readUInt16BE(p);
  p += 2;
  if (cipherBytes % 2 !== 0 || !need(cipherBytes)) return null;
  const ciphers: number[] = [];
  for (let i = 0; i < cipherBytes; i += 2) ciphers.push(b.readUInt16BE(p + i));
  p += cipherBytes;
  if (!need(1)) return null;
  p += 1 + b[p]!; // compression methods
  const facts: ClientHelloFacts = { version, ciphers, extensions: [], supportedVersions: null, firstAlpn: null, signatureAlgorithms: [] };
  if (p === b.length) return facts; // no extensions (an SSL 3.0-style hello)
  if (!need(2)) return null;
  const end = p + 2 + b.readUInt16BE(p);
  p += 2;
  if (end > b.length) return null;
  while (p < end) {
    if (p + 4 > end) return null;
    const type = b.readUInt16BE(p);
    const length = b.readUInt16BE(p + 2);
    p += 4;
    if (p + length > end) return null;
    const data = b.subarray(p, p + length);
    p += length;
    facts.extensions.push(type);
    if (type === EXT_SUPPORTED_VERSIONS && data.length >= 1) {
      const n = Math.min(data[0]!, data.length - 1);
      facts.supportedVersions = [];
      for (let i = 0; i + 1 < n; i += 2) facts.supportedVersions.push(data.readUInt16BE(1 + i));
    } else if (type === EXT_ALPN && data.length >= 3) {
      const n = data[2]!;
      if (n > 0 && 3 + n <= data.length) facts.firstAlpn = data.subarray(3, 3 + n);
    } else if (type === EXT_SIGNATURE_ALGORITHMS && data.length >= 2) {
      const n = Math.min(data.readUInt16BE(0), data.length - 2);
      for (let i = 0; i + 1 < n; i += 2) facts.signatureAlgorithms.push(data.readUInt16BE(2 + i));
    }
  }
  return facts;
}

const VERSIONS: Readonly<Record<number, string>> = { 0x0304: '13', 0x0303: '12', 0x0302: '11', 0x0301: '10', 0x0300: 's3', 0x0002: 's2' };

const hex4 = (v: number): string => v.toString(16).padStart(4, '0');
const truncatedSha256 = (s: string): string => createHash('sha256').update(s).digest('hex').slice(0, 12);
const twoDigits = (n: number): string => String(Math.min(n, 99)).padStart(2, '0');
const isAlnum = (c: number): boolean => (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5a) || (c >= 0x61 && c <= 0x7a);

/**
 * JA4 (`t13d1516h2_8daaf6152771_b186095e22b6`) of a ClientHello, per FoxIO's JA4 technical
 * details: `t`, the version (the highest non-GREASE supported_versions entry, else the hello's
 * version), `d` with SNI / `i` without, the cipher and extension counts (GREASE excluded, at most
 * 99), the first ALPN value's first and last characters (`00` without ALPN; a non-alphanumeric
 * end gives the first byte's high nibble and the last byte's low nibble in hex); then the first 12
 * hex digits of the SHA-256 of the sorted cipher list, and of the sorted extension list without
 * SNI and ALPN, `_`, the signature algorithms as sent (GREASE excluded, as everywhere; each list comma-separated 4-digit hex; an
 * empty list hashes to twelve zeros).
 */
export function ja4(h: ClientHelloFacts): string {
  let top = 0;
  for (const v of h.supportedVersions ?? []) if (!isGrease(v) && v > top) top = v;
  const version = VERSIONS[top || h.version] ?? '00';
  const ciphers = h.ciphers.filter((c) => !isGrease(c));
  const extensions = h.extensions.filter((e) => !isGrease(e));
  let alpn = '00';
  const a = h.firstAlpn;
  if (a && a.length > 0) {
    const first = a[0]!;
    const last = a[a.length - 1]!;
    alpn = isAlnum(first) && isAlnum(last) ? String.fromCharCode(first, last) : ((first >> 4) & 0xf).toString(16) + (last & 0xf).toString(16);
  }
  const sni = extensions.includes(EXT_SERVER_NAME) ? 'd' : 'i';
  const head = `t${version}${sni}${twoDigits(ciphers.length)}${twoDigits(extensions.length)}${alpn}`;
  const cipherHash = ciphers.length === 0 ? '000000000000' : truncatedSha256(ciphers.sort((x, y) => x - y).map(hex4).join(','));
  const hashed = extensions.filter((e) => e !== EXT_SERVER_NAME && e !== EXT_ALPN).sort((x, y) => x - y);
  let extensionHash = '000000000000';
  if (hashed.length > 0) {
    const algs = h.signatureAlgorithms.filter((s) => !isGrease(s));
    const sigalgs = algs.length > 0 ? `_${algs.map(hex4).join(',')}` : '';
    extensionHash = truncatedSha256(hashed.map(hex4).join(',') + sigalgs);
  }
  return `${head}_${cipherHash}_${extensionHash}`;
}

/** JA4 of a handshake record's payload; `""` when it holds no readable ClientHello. */
export function ja4OfRecord(payload: Buffer): string {
  const h = parseClientHello(payload);
  return h ? ja4(h) : '';
}
