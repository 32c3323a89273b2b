import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentServer } from '../../ingress/src/agents/server.js';
import { createTestPki, httpRequest, startUpstream, tokenAuthenticator, type Upstream } from '../../ingress/src/agents/testing.js';
import { AGENT_ONLINE_MS, WORK_MS } from '../../../test/support/timeouts.js';

/**
 * The real executable (bin/warren-agent) against an in-process AgentServer. Each test starts the
 * executable (`node --import <tsx> main.ts`: about a second on an idle machine, many times that on
 * a loaded one), so each test may take up to `AGENT_ONLINE_MS` for that (see test/support/timeouts.ts).
 */

const BIN = resolve(import.meta.dirname, '../bin/warren-agent');
const TOKEN = 'wrn_agt_cli_test';

let server: AgentServer;
let port: number;
let up: Upstream;
let dir: string;
let caFile: string;
/** A local https service whose certificate the test CA signed (not one of the system CAs). */
let tlsUp: https.Server;
let tlsPort: number;
const events: Array<[string, string, string]> = [];

beforeAll(async () => {
  const pki = await createTestPki();
  dir = mkdtempSync(join(tmpdir(), 'warren-agent-test-'));
  caFile = join(dir, 'ca.pem');
  writeFileSync(caFile, pki.caPem);
  server = new AgentServer({
    nodeId: 'node-cli',
    tls: { cert: pki.certPem, key: pki.keyPem },
    authenticate: tokenAuthenticator([{ token: TOKEN, identity: { credentialId: 'cr_cli', accountId: 'ac_cli', acl: [] } }]),
  });
  server.on('tunnelClosed', (id, reason) => events.push(['tunnelClosed', id, reason]));
  server.on('sessionClosed', (id, reason) => events.push(['sessionClosed', id, reason]));
  port = await server.listen(0, '127.0.0.1');
  up = await startUpstream();
  tlsUp = https.createServer({ cert: pki.certPem, key: pki.keyPem }, (req, res) => res.end(`tls hello ${req.url}`));
  await new Promise<void>((r) => tlsUp.listen(0, '127.0.0.1', r));
  tlsPort = (tlsUp.address() as AddressInfo).port;
});

afterAll(async () => {
  await server?.close();
  await up?.close();
  tlsUp?.closeAllConnections();
  tlsUp?.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

function run(args: string[], env: Record<string, string> = {}) {
  const child = spawn(BIN, args, { env: { ...process.env, LOG_LEVEL: 'silent', ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  const output = { stdout: '', stderr: '' };
  child.stdout!.on('data', (c: Buffer) => (output.stdout += c.toString()));
  child.stderr!.on('data', (c: Buffer) => (output.stderr += c.toString()));
  const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
  return { child, output, exited };
}

/** Waits for `re` on the child's stdout: a hang detector (the executable's start may be slow), not a performance check. */
async function waitFor(re: RegExp, output: { stdout: string; stderr: string }, child: ChildProcess, timeoutMs = AGENT_ONLINE_MS): Promise<RegExpExecArray> {
  const t0 = Date.now();
  for (;;) {
    const m = re.exec(output.stdout);
    if (m) return m;
    const why = child.exitCode !== null || child.signalCode !== null ? `the agent exited (code ${child.exitCode}, signal ${child.signalCode})` : Date.now() - t0 > timeoutMs ? `not within ${timeoutMs} ms` : null;
    if (why) throw new Error(`no match for ${re}: ${why}; stdout: ${JSON.stringify(output.stdout)}; stderr: ${JSON.stringify(output.stderr)}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe('warren-agent (executable)', { timeout: AGENT_ONLINE_MS + WORK_MS }, () => {
  it('prints one line when the tunnel is online, serves it, and exits 0 on SIGTERM after Unbind', async () => {
    const { child, output, exited } = run(['http', String(up.port), '--label', 'edge=edghts_cli', '--server', `localhost:${port}`, '--ca', caFile], { WARREN_AUTHTOKEN: TOKEN });
    const m = await waitFor(/^tunnel (tn_\w+) online: labels edge=edghts_cli → http:\/\/localhost:(\d+)\n$/, output, child);
    const id = m[1]!;
    const res = await httpRequest({ stream: await server.getTunnel(id)!.openStream({ clientAddr: '1.1.1.1:1', proto: 'https', edgeType: '3' }) }, { path: '/cli' });
    expect(res.body.toString()).toBe('hello /cli');
    child.kill('SIGTERM');
    expect(await exited).toBe(0);
    expect(events.find((e) => e[1] === id)).toEqual(['tunnelClosed', id, 'unbound by the agent']);
    expect(output.stderr).toBe('');
  });

  it('exits 1 with the reason when the server stops its only tunnel (StopTunnel)', async () => {
    const { child, output, exited } = run(['http', String(up.port), '--domain', 'stopped.cli.test', '--server', `localhost:${port}`, '--ca', caFile], { WARREN_AUTHTOKEN: TOKEN });
    const id = (await waitFor(/^tunnel (tn_\w+) online: /, output, child))[1]!;
    expect(server.stopTunnel(id, "the authtoken's ACL no longer allows binding stopped.cli.test (ERR_WARREN_1100)", 'ERR_WARREN_1100')).toBe(true);
    expect(await exited).toBe(1);
    expect(output.stderr).toBe(`warren-agent: tunnel ${id} lost: the authtoken's ACL no longer allows binding stopped.cli.test (ERR_WARREN_1100)\nwarren-agent: no tunnel left; exiting\n`);
  });

  it('an unknown authtoken: the server message on one line, exit 1', async () => {
    const { output, exited } = run(['http', '8080', '--domain', 'x.test', '--authtoken', 'wrn_agt_wrong', '--server', `localhost:${port}`, '--ca', caFile]);
    expect(await exited).toBe(1);
    expect(output.stderr).toBe('warren-agent: authentication failed: the agent authtoken is unknown or revoked (ERR_WARREN_1004)\n');
    expect(output.stdout).toBe('');
  });

  it('bad usage: exit 2 with a hint', async () => {
    const { output, exited } = run(['http', '8080', '--label', 'oops']);
    expect(await exited).toBe(2);
    expect(output.stderr).toMatch(/^warren-agent: invalid label "oops": use key=value \(see --help\)\n$/);
  });

  describe('an https:// local service', () => {
    /** Starts the agent for the https service with `flags`, and sends one request through its tunnel. */
    async function through(domain: string, flags: string[]) {
      const { child, output, exited } = run(['http', `https://127.0.0.1:${tlsPort}`, '--domain', domain, '--server', `localhost:${port}`, '--ca', caFile, ...flags], { WARREN_AUTHTOKEN: TOKEN });
      const id = (await waitFor(/^tunnel (tn_\w+) online: /, output, child))[1]!;
      const res = await httpRequest({ stream: await server.getTunnel(id)!.openStream({ clientAddr: '1.1.1.1:1', proto: 'https', edgeType: '0' }) }, { path: '/tls' });
      child.kill('SIGTERM');
      expect(await exited).toBe(0);
      return { res, output };
    }

    it('its certificate is checked against the system CAs: one a private CA signed gets a 502 naming the failure', async () => {
      const { res, output } = await through('verify.cli.test', []);
      expect(res.status).toBe(502);
      expect(res.body.toString()).toMatch(/^warren-agent: could not reach https:\/\/127\.0\.0\.1:\d+ \(UNABLE_TO_VERIFY_LEAF_SIGNATURE\)\n$/);
      expect(output.stderr).toMatch(/cannot reach https:\/\/127\.0\.0\.1:\d+: UNABLE_TO_VERIFY_LEAF_SIGNATURE/);
    });

    it('--upstream-ca: checked against that CA, and served', async () => {
      const { res, output } = await through('ca.cli.test', ['--upstream-ca', caFile]);
      expect([res.status, res.body.toString()]).toEqual([200, 'tls hello /tls']);
      expect(output.stderr).toBe('');
    });

    it('--upstream-insecure: not checked, and served', async () => {
      const { res, output } = await through('insecure.cli.test', ['--upstream-insecure']);
      expect([res.status, res.body.toString()]).toEqual([200, 'tls hello /tls']);
      expect(output.stderr).toBe('');
    });

    it('an --upstream-ca file without a certificate: exit 2 naming it, before connecting', async () => {
      const bad = join(dir, 'not-a-ca.pem');
      writeFileSync(bad, 'not a certificate\n');
      const { output, exited } = run(['http', `https://127.0.0.1:${tlsPort}`, '--upstream-ca', bad, '--server', `localhost:${port}`, '--authtoken', TOKEN]);
      expect(await exited).toBe(2);
      expect(output.stderr).toBe(`warren-agent: the upstream CA file ${bad} holds no PEM certificate\n`);
    });
  });
});
