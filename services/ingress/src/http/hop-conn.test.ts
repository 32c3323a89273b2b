import { describe, expect, it } from 'vitest';
import { X509Certificate } from 'node:crypto';
import { CelConn, createCertificate } from '@warren/shared';
import { asciiJson, decodeHopConn } from './hop-conn.js';

describe('x-warren-conn (a Bind endpoint policy over a hop)', () => {
  it("shows the client's connection as the sending node saw it", () => {
    const h = decodeHopConn(JSON.stringify({ sip: '10.0.0.5', v: 'TLSv1.2', c: 'ECDHE-RSA-AES128-GCM-SHA256', cs: 'TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256', sni: 'app.test', alpn: 'http/1.1', r: true }), '203.0.113.9:51234')!;
    const conn = new CelConn('203.0.113.9', 443, h.tls, false, null, h.socket);
    expect([conn.tls.version, conn.tls.cipher_suite, conn.tls.sni, conn.tls.negotiated_alpn, conn.tls.session_resumed, conn.client_port, conn.server_ip]).toEqual(['1.2', 'TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256', 'app.test', 'http/1.1', true, 51234n, '10.0.0.5']);
    // No certificates travel: the client's is never shown without mutual TLS anyway, and
    // without a fingerprint (or this node's certificate) the server's reads empty.
    expect(conn.tls.client.subject.common_name).toBe('');
    expect(conn.tls.server.serial_number).toBe('');
  });

  it("shows this node's certificate as conn.tls.server only when it is the one the sending node served", async () => {
    const own = new X509Certificate((await createCertificate({ commonName: 'ingress.test', days: 1, keyType: 'ec' })).certificatePem);
    const other = new X509Certificate((await createCertificate({ commonName: 'other.test', days: 1, keyType: 'ec' })).certificatePem);
    const view = (fp: string | undefined, mine: X509Certificate | null) => {
      const h = decodeHopConn(JSON.stringify({ sip: '10.0.0.5', v: 'TLSv1.3', ...(fp ? { fp } : {}) }), '203.0.113.9:1', mine)!;
      return new CelConn('203.0.113.9', 443, h.tls, false, null, h.socket).tls.server;
    };
    expect(view(own.fingerprint256, own).subject.common_name).toBe('ingress.test');
    expect(view(other.fingerprint256, own).subject.common_name).toBe('');
    expect(view(undefined, own).subject.common_name).toBe('');
    expect(view(own.fingerprint256, null).subject.common_name).toBe('');
  });

  it('plain HTTP: no TLS; an IPv6 client address keeps its port', () => {
    const h = decodeHopConn('{"sip":"::1"}', '[2001:db8::1]:8080')!;
    expect(h.tls).toBeNull();
    expect(h.socket).toEqual({ remotePort: 8080, localAddress: '::1' });
  });

  it('anything unreadable is ignored (the hop socket shows), never thrown', () => {
    for (const v of [undefined, '', 'not json', '[1]', 'null', '7', ['{}'], `{"rt":"${'x'.repeat(200_000)}"}`]) expect(decodeHopConn(v as string, '1.2.3.4:5'), String(v).slice(0, 20)).toBeNull();
    // Fields of the wrong type or too long are dropped one by one.
    const h = decodeHopConn(JSON.stringify({ sip: 5, v: 'TLSv1.3', c: 'x'.repeat(300) }), 'garbage')!;
    expect(h.socket).toEqual({ remotePort: 0, localAddress: '' });
    expect(h.tls!.getCipher()).toBeUndefined();
    // A TLS version too long to be one: no TLS; a raw target over 16 KiB or a bad HTTP version: dropped.
    const long = decodeHopConn(JSON.stringify({ v: 'x'.repeat(300), rt: '/'.repeat(17_000), hv: '1.1; x' }), '1.2.3.4:5')!;
    expect([long.tls, long.rawTarget, long.message]).toEqual([null, undefined, null]);
  });

  it('is ASCII on the wire, whatever the request held', () => {
    const v = { rt: '/caf\u00e9/\u4e00?x=\ud83d\ude00', q: '\u007f"' };
    const wire = asciiJson(v);
    expect(/^[\x20-\x7e]*$/.test(wire)).toBe(true);
    expect(JSON.parse(wire)).toEqual(v);
  });

  it("carries the client's request facts: raw target, HTTP version, how the body's length was stated", () => {
    const h = decodeHopConn(JSON.stringify({ sip: '10.0.0.1', hv: '1.0', cl: '5', rt: '/x/../%61dmin' }), '1.2.3.4:5')!;
    expect([h.rawTarget, h.message]).toEqual(['/x/../%61dmin', { httpVersion: '1.0', headers: { 'content-length': '5', 'transfer-encoding': undefined } }]);
    expect(decodeHopConn(JSON.stringify({ hv: '1.1', te: true }), '1.2.3.4:5')!.message).toEqual({ httpVersion: '1.1', headers: { 'content-length': undefined, 'transfer-encoding': 'chunked' } });
  });

  it("carries the client's JA4 over TLS; a bad value is dropped", () => {
    const ja4 = 't13d1516h2_8daaf6152771_d8a2da3f94cd';
    const view = (j4: unknown) => {
      const h = decodeHopConn(JSON.stringify({ sip: '10.0.0.1', v: 'TLSv1.3', j4 }), '1.2.3.4:5')!;
      return new CelConn('1.2.3.4', 443, h.tls, false, null, h.socket, h.facts).tls.ja4_fingerprint;
    };
    expect(view(ja4)).toBe(ja4);
    for (const bad of [undefined, 7, 'x'.repeat(300), null, `${ja4}0`, ja4.replace('_', '-')]) expect(view(bad), String(bad)).toBe('');
  });

  it("carries the connection's accept time, bytes so far and the sending node's region; bad values dropped", () => {
    const h = decodeHopConn(JSON.stringify({ sip: '10.0.0.1', ts: 1_790_000_000_123, bi: 1834, bo: 77, rg: 'ingress-b' }), '1.2.3.4:5')!;
    const conn = new CelConn('1.2.3.4', 443, h.tls, false, null, h.socket, h.facts);
    expect([conn.ts.start.getTime(), conn.bytes_in, conn.bytes_out, conn.server_region]).toEqual([1_790_000_000_123, 1834n, 77n, 'ingress-b']);
    for (const bad of [-1, 1.5, '7', 2 ** 60, null]) {
      const x = decodeHopConn(JSON.stringify({ ts: bad, bi: bad, bo: bad, rg: typeof bad === 'string' ? bad.repeat(300) : bad }), '1.2.3.4:5')!;
      const c = new CelConn('1.2.3.4', 443, x.tls, false, null, x.socket, x.facts);
      expect([c.bytes_in, c.bytes_out, c.server_region], String(bad)).toEqual([0n, 0n, '']);
      expect(() => c.ts.start, String(bad)).toThrow(/not known/);
    }
  });
});
