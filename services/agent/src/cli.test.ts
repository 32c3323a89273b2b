import { describe, expect, it } from 'vitest';
import { onlineLine, parseCli } from './cli.js';
import { parseForwardTarget } from './forward.js';

const env = { WARREN_AUTHTOKEN: 'tok_env', WARREN_SERVER: 'ingress.test:4443', WARREN_CA: '/etc/warren/ca.pem' };

describe('parseCli', () => {
  it('labeled tunnel with flags', () => {
    const r = parseCli(['http', '8080', '--label', 'edge=edghts_x', '--label', 'k=v=w', '--authtoken', 'wrn_agt_1', '--server', 'localhost:4443', '--ca', 'ca.pem'], {});
    expect(r).toEqual({
      kind: 'run',
      config: {
        target: '8080',
        targetUrl: 'http://localhost:8080',
        labels: { edge: 'edghts_x', k: 'v=w' },
        domain: null,
        pooling: false,
        internal: false,
        scheme: 'https',
        authtoken: 'wrn_agt_1',
        server: 'localhost:4443',
        caFile: 'ca.pem',
        metadata: '',
        trafficPolicyFile: null,
        drainMs: 10_000,
        upstreamCaFile: null,
        upstreamTlsVerify: true,
      },
    });
  });

  it('--upstream-ca and --upstream-insecure: for an https:// or tls:// local service only, and not both', () => {
    expect(parseCli(['http', 'https://localhost:8443', '--upstream-ca', 'local-ca.pem'], env)).toMatchObject({ kind: 'run', config: { upstreamCaFile: 'local-ca.pem', upstreamTlsVerify: true } });
    expect(parseCli(['http', 'tls://db.lan:5433', '--upstream-insecure'], env)).toMatchObject({ kind: 'run', config: { upstreamCaFile: null, upstreamTlsVerify: false } });
    expect(parseCli(['http', '8080', '--upstream-insecure'], env)).toEqual({ kind: 'error', message: '--upstream-insecure applies to an https:// or tls:// local service, not http://localhost:8080' });
    expect(parseCli(['http', 'http://localhost:8080', '--upstream-ca', 'ca.pem'], env)).toEqual({ kind: 'error', message: '--upstream-ca applies to an https:// or tls:// local service, not http://localhost:8080' });
    expect(parseCli(['http', 'https://localhost:8443', '--upstream-ca', 'ca.pem', '--upstream-insecure'], env)).toMatchObject({ kind: 'error', message: /exclude each other/ });
    expect(parseCli(['http', 'https://localhost:8443', '--upstream-ca='], env)).toEqual({ kind: 'error', message: '--upstream-ca needs a file name' });
  });

  it('--drain-timeout in seconds (0 to 3600, fractions allowed); anything else is refused naming the flag', () => {
    expect(parseCli(['http', '8080', '--drain-timeout', '30'], env)).toMatchObject({ kind: 'run', config: { drainMs: 30_000 } });
    expect(parseCli(['http', '8080', '--drain-timeout', '0'], env)).toMatchObject({ kind: 'run', config: { drainMs: 0 } });
    expect(parseCli(['http', '8080', '--drain-timeout', '2.5'], env)).toMatchObject({ kind: 'run', config: { drainMs: 2_500 } });
    for (const bad of ['-1', 'ten', '', '3601', '1e3', '0x10']) {
      expect(parseCli(['http', '8080', `--drain-timeout=${bad}`], env)).toEqual({ kind: 'error', message: `invalid --drain-timeout ${JSON.stringify(bad)}: use seconds from 0 to 3600` });
    }
    // From the environment when the flag is absent; the flag wins.
    expect(parseCli(['http', '8080'], { ...env, WARREN_DRAIN_TIMEOUT: '45' })).toMatchObject({ kind: 'run', config: { drainMs: 45_000 } });
    expect(parseCli(['http', '8080', '--drain-timeout', '5'], { ...env, WARREN_DRAIN_TIMEOUT: '45' })).toMatchObject({ kind: 'run', config: { drainMs: 5_000 } });
    expect(parseCli(['http', '8080'], { ...env, WARREN_DRAIN_TIMEOUT: 'soon' })).toEqual({ kind: 'error', message: 'invalid WARREN_DRAIN_TIMEOUT "soon": use seconds from 0 to 3600' });
  });

  it('an endpoint traffic policy file; not with labels (a labeled tunnel has its edge route\'s)', () => {
    expect(parseCli(['http', '8080', '--domain', 'app.test', '--traffic-policy-file', 'policy.yml'], env)).toMatchObject({ kind: 'run', config: { domain: 'app.test', trafficPolicyFile: 'policy.yml' } });
    expect(parseCli(['http', '8080', '--label', 'a=b', '--traffic-policy-file', 'policy.yml'], env)).toMatchObject({ kind: 'error', message: /--traffic-policy-file apply to endpoint tunnels only/ });
    expect(parseCli(['http', '8080', '--traffic-policy-file', ''], env)).toEqual({ kind: 'error', message: '--traffic-policy-file needs a file name' });
  });

  it('endpoint tunnel; authtoken, server and CA from the environment', () => {
    const r = parseCli(['http', 'http://127.0.0.1:3000', '--domain', 'app.test', '--pooling', '--internal'], env);
    expect(r).toMatchObject({ kind: 'run', config: { targetUrl: 'http://127.0.0.1:3000', labels: null, domain: 'app.test', pooling: true, internal: true, authtoken: 'tok_env', server: 'ingress.test:4443', caFile: '/etc/warren/ca.pem' } });
  });

  it('flags win over the environment', () => {
    const r = parseCli(['http', 'localhost:9', '--authtoken', 'flag', '--server', '[::1]:4443'], env);
    expect(r).toMatchObject({ kind: 'run', config: { authtoken: 'flag', server: '[::1]:4443', targetUrl: 'http://localhost:9' } });
  });

  it('help', () => {
    expect(parseCli(['--help'], {})).toEqual({ kind: 'help' });
    expect(parseCli(['http', '-h'], {})).toEqual({ kind: 'help' });
  });

  it.each([
    [[], /missing command/],
    [['tcp', '22'], /unknown command "tcp"/],
    [['http'], /missing the local service/],
    [['http', '8080', 'extra'], /unexpected argument "extra"/],
    [['http', 'ftp://x:1'], /unsupported scheme/],
    [['http', '99999'], /invalid port/],
    [['http', '8080', '--label', 'novalue'], /invalid label "novalue"/],
    [['http', '8080', '--label', 'a=1', '--label', 'a=2'], /given twice/],
    [['http', '8080', '--label', 'a=1', '--domain', 'x.test'], /labeled tunnel/],
    [['http', '8080', '--scheme', 'tcp'], /--scheme must be/],
    [['http', '8080', '--bogus'], /Unknown option '--bogus'/],
  ])('refuses %j', (argv, message) => {
    const r = parseCli(argv, env);
    expect(r.kind).toBe('error');
    expect((r as { message: string }).message).toMatch(message);
  });

  it('requires an authtoken and a server', () => {
    expect(parseCli(['http', '8080'], {})).toMatchObject({ kind: 'error', message: /no authtoken/ });
    expect(parseCli(['http', '8080', '--authtoken', 't'], {})).toMatchObject({ kind: 'error', message: /no server/ });
    expect(parseCli(['http', '8080', '--authtoken', 't', '--server', 'nohost'], {})).toMatchObject({ kind: 'error', message: /use host:port/ });
  });
});

describe('parseForwardTarget', () => {
  it.each([
    ['8080', { host: 'localhost', port: 8080, tls: false, url: 'http://localhost:8080' }],
    ['10.0.0.5:81', { host: '10.0.0.5', port: 81, tls: false, url: 'http://10.0.0.5:81' }],
    ['[::1]:82', { host: '::1', port: 82, tls: false, url: 'http://[::1]:82' }],
    ['http://app.local', { host: 'app.local', port: 80, tls: false, url: 'http://app.local:80' }],
    ['https://app.local:8443/path', { host: 'app.local', port: 8443, tls: true, url: 'https://app.local:8443' }],
    ['tcp://db:5432', { host: 'db', port: 5432, tls: false, url: 'tcp://db:5432' }],
  ])('%s', (input, expected) => {
    expect(parseForwardTarget(input)).toEqual(expected);
  });

  it('refuses what it cannot dial', () => {
    expect(() => parseForwardTarget('tcp://db')).toThrow(/needs a port/);
    expect(() => parseForwardTarget('just-a-host')).toThrow(/invalid address/);
    expect(() => parseForwardTarget('0')).toThrow(/invalid port/);
  });
});

describe('onlineLine', () => {
  it('labeled and endpoint tunnels', () => {
    expect(onlineLine({ id: 'tn_1', url: '', labels: { edge: 'edghts_x', k: 'v' }, forwardsTo: 'http://localhost:8080' })).toBe('tunnel tn_1 online: labels edge=edghts_x k=v → http://localhost:8080');
    expect(onlineLine({ id: 'tn_2', url: 'https://app.test:8443', labels: {}, forwardsTo: 'http://localhost:8080' })).toBe('tunnel tn_2 online: https://app.test:8443 → http://localhost:8080');
  });
});
