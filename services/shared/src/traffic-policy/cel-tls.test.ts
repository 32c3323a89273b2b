import { X509Certificate } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { CEL_TIME, CelActions, CelConn, CelRequest, type CelTlsSocket } from './cel-vars.js';
import { compileExpression } from './cel.js';
import { TrafficPolicyError, validateTrafficPolicy } from './parse.js';
import { atv, buildCertificate, derOf, ED25519_PEM, extension, fakeTlsSocket, LEAF_PEM, name, oid, PSS_PEM, seq, tlv, utf8 } from './testing.js';
import { formatIp, MAX_CERTIFICATE_BYTES, parseCertificate } from './x509.js';

/** An activation whose `conn` has `socket` (null: plain HTTP); `verified`: the edge's mutual_tls checked the client certificate. */
function activation(socket: CelTlsSocket | null, verified = true) {
  return {
    req: new CelRequest({ method: 'GET', scheme: socket ? 'https' : 'http', host: 'app.example.com', authority: 'app.example.com', path: '/', rawQuery: '', headers: () => [] }),
    conn: new CelConn('203.0.113.7', socket ? 443 : 80, socket, verified),
    actions: new CelActions(),
    time: CEL_TIME,
  };
}
const run = (expr: string, act: object): unknown => compileExpression('inbound', expr, false)(act);
const leafSocket = () => fakeTlsSocket({ peer: derOf(LEAF_PEM), local: derOf(ED25519_PEM) });

describe('X.509 fields as ngrok (Go) shows them', () => {
  it('reads a full certificate', () => {
    const c = parseCertificate(derOf(LEAF_PEM));
    expect(c.serialNumber).toBe('b53017e79d4a5208b314a55d3574e0a8');
    expect(c.signatureAlgorithm).toBe('ECDSA-SHA256');
    expect(c.issuer.text).toBe('CN=exampleca.com,O=Example CA,C=US');
    // Go's pkix.Name.String(): most specific first, several values of a type in one RDN, the
    // attributes Go has no name for last, as `oid=#` + the DER of their value re-encoded.
    expect(c.subject.text).toBe(
      'SERIALNUMBER=42,CN=www.example.com,OU=Ops+OU=Web Services,O=Example Corp,POSTALCODE=94043,STREET=1234 Secure Blvd,L=Mountain View,ST=California,C=US+C=CA,' +
        `1.2.840.113549.1.9.1=#0c11${Buffer.from('admin@example.com').toString('hex')}`,
    );
    expect(c.subject).toMatchObject({
      commonName: 'www.example.com',
      country: ['US', 'CA'],
      province: ['California'],
      locality: ['Mountain View'],
      streetAddress: ['1234 Secure Blvd'],
      postalCode: ['94043'],
      organization: ['Example Corp'],
      organizationalUnit: ['Ops', 'Web Services'],
    });
    expect(c.san).toEqual({
      text: 'DNS:www.example.com, DNS:example.com, IP Address:192.168.1.1, IP Address:2001:db8::1, email:ngrok-email1@example.com, URI:https://example.com/example',
      dnsNames: ['www.example.com', 'example.com'],
      ipAddresses: ['192.168.1.1', '2001:db8::1'],
      emailAddresses: ['ngrok-email1@example.com'],
      uris: ['https://example.com/example'],
    });
    expect(c.extensions.map((e) => [e.id, e.critical])).toEqual([
      ['2.5.29.17', false],
      ['2.5.29.15', true],
      ['2.5.29.37', false],
      ['2.5.29.14', false],
      ['2.5.29.35', false],
    ]);
    // ngrok's example value for a key usage of digitalSignature + keyEncipherment.
    expect(Buffer.from(c.extensions[1]!.value).toString('hex')).toBe('030205a0');
    // Dates and serial agree with OpenSSL's reading.
    const x = new X509Certificate(LEAF_PEM);
    expect([c.notBefore.getTime(), c.notAfter.getTime()]).toEqual([Date.parse(x.validFrom), Date.parse(x.validTo)]);
    expect(c.notBefore.toISOString()).toBe('2026-11-25T14:46:29.000Z');
    expect(c.serialNumber).toBe(x.serialNumber.toLowerCase().replace(/^0+/, ''));
  });

  it('escapes names, and names signature algorithms as Go does', () => {
    const ed = parseCertificate(derOf(ED25519_PEM));
    expect(ed.subject.text).toBe('CN=a\\, b,OU=x,O=\\#hash\\ ');
    expect(ed.subject.commonName).toBe('a, b');
    expect(ed.signatureAlgorithm).toBe('Ed25519');
    expect(parseCertificate(derOf(PSS_PEM)).signatureAlgorithm).toBe('SHA384-RSAPSS');
    expect(parseCertificate(buildCertificate({ signatureAlgorithm: seq(oid('1.2.840.113549.1.1.11'), tlv(0x05)) })).signatureAlgorithm).toBe('SHA256-RSA');
    expect(parseCertificate(buildCertificate({ signatureAlgorithm: seq(oid('1.2.3.4')) })).signatureAlgorithm).toBe('1.2.3.4');
  });

  it('reads the shapes OpenSSL does not make by default', () => {
    const c = parseCertificate(
      buildCertificate({
        serial: tlv(0x02, Buffer.from([0xff, 0x01])), // negative
        notBefore: tlv(0x18, Buffer.from('19991231235959Z')),
        notAfter: tlv(0x18, Buffer.from('20500101000000.5Z')),
        subject: name(
          [atv('2.5.4.3', tlv(0x1e, Buffer.from([0x00, 0x68, 0x00, 0xe9])))], // BMPString "hé"
          [atv('2.5.4.10', tlv(0x1c, Buffer.from([0, 1, 0xf6, 0x00])))], // UniversalString 😀
          [atv('2.5.4.3', utf8('last'))], // the last CN wins, as in Go
          [atv('2.5.4.4', tlv(0x13, Buffer.from('Doe')))], // surname: no Go name
          [atv('2.5.4.11', tlv(0x04, Buffer.from([1])))], // not a string: skipped
          [atv('2.25.329800735698586629295641978511506172918', tlv(0x02, Buffer.from([5])))],
        ),
        extensions: [extension('2.5.29.17', seq(tlv(0x87, Buffer.from([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1])), tlv(0x87, Buffer.from([1, 2])), tlv(0xa4, seq())))],
      }),
    );
    expect(c.serialNumber).toBe('-ff');
    expect(c.notBefore.toISOString()).toBe('1999-12-31T23:59:59.000Z');
    expect(c.notAfter.toISOString()).toBe('2050-01-01T00:00:00.500Z');
    expect(c.subject.commonName).toBe('last');
    expect(c.subject.organization).toEqual(['😀']);
    expect(c.subject.organizationalUnit).toEqual([]);
    expect(c.subject.text).toBe(`CN=last,O=😀,2.25.329800735698586629295641978511506172918=#020105,2.5.4.4=#1303446f65`);
    // A mapped IPv4 address prints as IPv4, a malformed one as `?hex`; a directory name is left out.
    expect(c.san.ipAddresses).toEqual(['10.0.0.1', '?0102']);
    expect(c.san.text).toBe('IP Address:10.0.0.1, IP Address:?0102');
  });

  it('prints IP addresses as Go does', () => {
    const v6 = (s: string) => formatIp(Buffer.from(s.replace(/:/g, ''), 'hex'));
    expect(v6('2001:0db8:0000:0000:0000:0000:0000:0001')).toBe('2001:db8::1');
    expect(v6('0000:0000:0000:0000:0000:0000:0000:0000')).toBe('::');
    expect(v6('0000:0000:0000:0000:0000:0000:0000:0001')).toBe('::1');
    expect(v6('2001:0db8:0000:0001:0000:0000:0000:0001')).toBe('2001:db8:0:1::1');
    expect(v6('2001:0db8:0000:0000:0001:0000:0000:0001')).toBe('2001:db8::1:0:0:1');
    expect(v6('fe80:0000:0000:0000:0000:0000:0000:0000')).toBe('fe80::');
    expect(v6('2001:0db8:0001:0002:0003:0004:0005:0006')).toBe('2001:db8:1:2:3:4:5:6');
  });

  it('refuses malformed and oversized certificates', () => {
    expect(() => parseCertificate(Buffer.from([0x30, 0x05, 0x02]))).toThrow('could not be read: truncated');
    expect(() => parseCertificate(buildCertificate({ notBefore: tlv(0x17, Buffer.from('yesterday')) }))).toThrow('bad validity time');
    const big = buildCertificate({ extensions: [extension('1.2.3', Buffer.alloc(MAX_CERTIFICATE_BYTES))] });
    expect(() => parseCertificate(big)).toThrow(`larger than ${MAX_CERTIFICATE_BYTES} bytes`);
  });
});

describe('conn.tls in expressions', () => {
  it('reads the connection: version, cipher suite, SNI, ALPN, resumption', () => {
    const act = activation(fakeTlsSocket({ protocol: 'TLSv1.2', cipher: 'TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256', servername: 'App.Example.com', alpn: 'http/1.1', resumed: true }));
    expect(run('conn.tls.version', act)).toBe('1.2');
    expect(run('conn.tls.cipher_suite', act)).toBe('TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256');
    expect(run('conn.tls.sni', act)).toBe('App.Example.com');
    expect(run('conn.tls.negotiated_alpn', act)).toBe('http/1.1');
    expect(run('conn.tls.session_resumed', act)).toBe(true);
    expect(run("conn.tls.version == '1.3'", activation(fakeTlsSocket()))).toBe(true);
    expect(run("conn.tls.version == '1.0'", activation(fakeTlsSocket({ protocol: 'TLSv1' })))).toBe(true);
    expect(run("conn.tls.negotiated_alpn == ''", activation(fakeTlsSocket({ alpn: false })))).toBe(true);
  });

  it("reads the ClientHello's JA4 from the connection's facts; \"\" when unknown or over plain HTTP", () => {
    const ja4 = 't13d1516h2_8daaf6152771_d8a2da3f94cd';
    const withFacts = (socket: CelTlsSocket | null, facts: { ja4?: string } | null) => ({
      ...activation(socket),
      conn: new CelConn('203.0.113.7', 443, socket, false, null, null, facts ? { startedAt: undefined, region: '', ...facts } : null),
    });
    expect(run('conn.tls.ja4_fingerprint', withFacts(fakeTlsSocket(), { ja4 }))).toBe(ja4);
    expect(run("conn.tls.ja4_fingerprint.startsWith('t13d')", withFacts(fakeTlsSocket(), { ja4 }))).toBe(true);
    expect(run('conn.tls.ja4_fingerprint', withFacts(fakeTlsSocket(), {}))).toBe('');
    expect(run('conn.tls.ja4_fingerprint', withFacts(fakeTlsSocket(), null))).toBe('');
    // Plain HTTP has no TLS, whatever the facts say.
    expect(run('conn.tls.ja4_fingerprint', withFacts(null, { ja4 }))).toBe('');
  });

  it('reads the verified client certificate with ngrok names and types', () => {
    const act = activation(leafSocket());
    const yes = [
      "conn.tls.client.subject.common_name == 'www.example.com'",
      "conn.tls.client.subject.organization == ['Example Corp']",
      "conn.tls.client.subject.country == ['US', 'CA']",
      "'Web Services' in conn.tls.client.subject.organizational_unit",
      "conn.tls.client.subject.startsWith('SERIALNUMBER=42,CN=www.example.com,OU=Ops')",
      "conn.tls.client.subject.contains('O=Example Corp')",
      "conn.tls.client.subject.matches('(?i)cn=www[.]example[.]com')",
      "matches(conn.tls.client.subject, ',C=US[+]C=CA,')",
      "conn.tls.client.issuer == 'CN=exampleca.com,O=Example CA,C=US'",
      "'CN=exampleca.com,O=Example CA,C=US' == conn.tls.client.issuer",
      "conn.tls.client.issuer != 'CN=other'",
      "conn.tls.client.issuer.common_name == 'exampleca.com'",
      "string(conn.tls.client.issuer) + '!' == 'CN=exampleca.com,O=Example CA,C=US!'",
      'conn.tls.client.issuer.size() == 34',
      "conn.tls.client.san == 'DNS:www.example.com, DNS:example.com, IP Address:192.168.1.1, IP Address:2001:db8::1, email:ngrok-email1@example.com, URI:https://example.com/example'",
      "conn.tls.client.san.dns_names == ['www.example.com', 'example.com']",
      "conn.tls.client.san.ip_addresses == ['192.168.1.1', '2001:db8::1']",
      "conn.tls.client.san.email_addresses == ['ngrok-email1@example.com']",
      "conn.tls.client.san.uris == ['https://example.com/example']",
      "conn.tls.client.san.dns_names.exists(d, d.endsWith('.example.com'))",
      "conn.tls.client.serial_number == 'b53017e79d4a5208b314a55d3574e0a8'",
      "conn.tls.client.signature_algorithm == 'ECDSA-SHA256'",
      "conn.tls.client.validity.not_before == timestamp('2026-11-25T14:46:29Z')",
      "conn.tls.client.validity.not_after > timestamp('2036-01-01T00:00:00Z')",
      'size(conn.tls.client.extensions) == 5',
      "conn.tls.client.extensions[1].id == '2.5.29.15' && conn.tls.client.extensions[1].critical",
      "conn.tls.client.extensions.exists(e, e.id == '2.5.29.15' && e.value == b'\\x03\\x02\\x05\\xa0')",
      "conn.tls.client.pem.startsWith('-----BEGIN CERTIFICATE-----\\nMIID2zCCA4Gg')",
      "conn.tls.client.pem.endsWith('\\n-----END CERTIFICATE-----')",
      // The server's certificate (the ingress's own), without `pem` (ngrok has none there).
      "conn.tls.server.subject.common_name == 'a, b'",
      "conn.tls.server.signature_algorithm == 'Ed25519'",
    ];
    for (const e of yes) expect(run(e, act), e).toBe(true);
    expect(run('conn.tls.client.pem', act)).toBe(LEAF_PEM);
    expect(run('conn.tls.client.subject.locality', act)).toEqual(['Mountain View']);
  });

  it('shows no client certificate unless the edge verified it, and none over plain HTTP', () => {
    // The ingress asks every HTTPS client for a certificate but checks it only for mutual_tls:
    // an unchecked one is anybody's, so it reads as absent.
    const unverified = leafSocket();
    const plain = activation(null);
    for (const act of [activation(unverified, false), activation(fakeTlsSocket({ peer: null })), plain]) {
      for (const e of [
        "conn.tls.client.subject.common_name == ''",
        "conn.tls.client.subject == ''",
        "conn.tls.client.issuer == ''",
        'conn.tls.client.subject.organization == []',
        "conn.tls.client.san == '' && conn.tls.client.san.dns_names == []",
        "conn.tls.client.serial_number == '' && conn.tls.client.signature_algorithm == ''",
        "conn.tls.client.pem == ''",
        'size(conn.tls.client.extensions) == 0',
        // Go's zero time: never valid now.
        "conn.tls.client.validity.not_after == timestamp('0001-01-01T00:00:00Z')",
        'conn.tls.client.validity.not_after < time.now',
        // A deny on "not the allowed client" applies.
        "conn.tls.client.subject.common_name != 'www.example.com'",
      ])
        expect(run(e, act), e).toBe(true);
    }
    expect(unverified.calls.getPeerX509Certificate).toBeUndefined();
    for (const e of ["conn.tls.version == ''", "conn.tls.cipher_suite == ''", "conn.tls.sni == ''", "conn.tls.negotiated_alpn == ''", '!conn.tls.session_resumed', "conn.tls.server.subject == ''", "conn.tls.ja4_fingerprint == ''"])
      expect(run(e, plain), e).toBe(true);
  });

  it('reads nothing from the socket until an expression reads conn.tls, and parses once', () => {
    const sock = leafSocket();
    const act = activation(sock);
    expect(run("conn.client_ip == '203.0.113.7' && conn.server_port == 443", act)).toBe(true);
    expect(sock.calls).toEqual({});
    expect(run("conn.tls.version == '1.3'", act)).toBe(true);
    expect(sock.calls).toEqual({ getProtocol: 1 });
    for (let i = 0; i < 3; i++) expect(run("conn.tls.client.subject.common_name == 'www.example.com' && conn.tls.client.serial_number != ''", act)).toBe(true);
    expect(sock.calls).toEqual({ getProtocol: 1, getPeerX509Certificate: 1 });
  });

  it('fetches and parses each certificate once per TLS connection, shared by its requests', () => {
    const sock = leafSocket();
    const read = "conn.tls.client.subject.common_name == 'www.example.com' && conn.tls.server.signature_algorithm == 'Ed25519'";
    const first = activation(sock);
    expect(run(read, first)).toBe(true);
    for (let i = 0; i < 3; i++) expect(run(read, activation(sock)), `request ${i + 2}`).toBe(true);
    expect(sock.calls).toEqual({ getPeerX509Certificate: 1, getX509Certificate: 1 });
    expect(activation(sock).conn.tls.client).toBe(first.conn.tls.client);
    // Whether the client certificate shows is still decided per request (its edge's mutual_tls).
    expect(run("conn.tls.client.subject == ''", activation(sock, false))).toBe(true);
    // Another connection has its own.
    const other = fakeTlsSocket({ peer: derOf(ED25519_PEM) });
    expect(run("conn.tls.client.subject.common_name == 'a, b'", activation(other))).toBe(true);
    expect(run(read, activation(sock))).toBe(true);
    expect(other.calls).toEqual({ getPeerX509Certificate: 1 });
    // A certificate that cannot be read stays an error for the connection, without reading it again.
    const broken = fakeTlsSocket({ peer: Buffer.from([0x30, 0x03, 0x02, 0x01]) });
    for (let i = 0; i < 2; i++) expect(() => run("conn.tls.client.serial_number == 'x'", activation(broken))).toThrow('the certificate could not be read');
    expect(broken.calls).toEqual({ getPeerX509Certificate: 1 });
  });

  it('makes a certificate that cannot be read an evaluation error (the rule is skipped)', () => {
    const broken = activation(fakeTlsSocket({ peer: Buffer.from([0x30, 0x03, 0x02, 0x01]) }));
    expect(() => run("conn.tls.client.subject.common_name == 'x'", broken)).toThrow('the certificate could not be read');
    expect(() => run("conn.tls.client.serial_number == 'x'", broken)).toThrow('the certificate could not be read');
    expect(run("conn.tls.version == '1.3'", broken)).toBe(true);
    const big = activation(fakeTlsSocket({ peer: buildCertificate({ extensions: [extension('1.2.3', Buffer.alloc(MAX_CERTIFICATE_BYTES))] }) }));
    expect(() => run("conn.tls.client.pem != ''", big)).toThrow('larger than');
  });

  it('checks the names when the policy is saved: ngrok names only', () => {
    const policy = (e: string) => ({ inbound: [{ expressions: [e], actions: [{ type: 'deny' }] }] });
    for (const ok of [
      "conn.tls.client.subject.common_name != 'allowed'",
      "conn.tls.version == '1.3' && conn.tls.cipher_suite.contains('GCM')",
      "conn.tls.sni == req.host",
      "conn.tls.client.validity.not_after < time.now + duration('720h')",
      "conn.tls.client.san.dns_names.exists(d, d.endsWith('.corp.example'))",
      "conn.tls.server.san.dns_names.size() > 0",
    ])
      expect(() => validateTrafficPolicy(policy(ok), { checkCost: true }), ok).not.toThrow();
    for (const bad of ['conn.tls.client_cert.subject.cn == ""', 'conn.tls.client.subject.cn == ""', 'conn.tls.server.pem == ""', 'conn.tls.client.subject.common_name == 1']) {
      let err: unknown;
      try {
        validateTrafficPolicy(policy(bad), { checkCost: true });
      } catch (e) {
        err = e;
      }
      expect(err, bad).toBeInstanceOf(TrafficPolicyError);
      expect((err as TrafficPolicyError).path).toBe('inbound[0].expressions[0]');
    }
  });

  it('interpolates certificate names as their strings', () => {
    const act = activation(leafSocket());
    expect(String(run('conn.tls.client.issuer', act))).toBe('CN=exampleca.com,O=Example CA,C=US');
    expect(run("'cn=' + conn.tls.client.subject.common_name + ' v' + conn.tls.version", act)).toBe('cn=www.example.com v1.3');
  });
});
