import { X509Certificate } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createLogger, stopWithParent } from '@warren/shared';
import { AgentClient, AgentRpcError, sleep } from './client.js';
import { onlineLine, parseCli, USAGE } from './cli.js';

/**
 * warren-agent: opens a tunnel from a local service to a Warren ingress and keeps it up
 * (reconnects with jittered backoff, resuming the same session and tunnel ids). One line per
 * tunnel on stdout when it is online; problems on stderr, one line each. SIGINT/SIGTERM unbinds
 * the tunnels, sends GOAWAY and exits 0. Exit 1 when the server refuses us, 2 on bad usage.
 */

const out = (line: string) => process.stdout.write(`${line}\n`);
const err = (line: string) => process.stderr.write(`warren-agent: ${line}\n`);

async function main(): Promise<number> {
  const parsed = parseCli(process.argv.slice(2), process.env);
  if (parsed.kind === 'help') {
    out(USAGE);
    return 0;
  }
  if (parsed.kind === 'error') {
    err(`${parsed.message} (see --help)`);
    return 2;
  }
  const cfg = parsed.config;
  let ca: Buffer | undefined;
  if (cfg.caFile) {
    try {
      ca = readFileSync(cfg.caFile);
    } catch (e) {
      err(`cannot read the CA file ${cfg.caFile}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
      return 2;
    }
  }

  let upstreamCa: Buffer | undefined;
  if (cfg.upstreamCaFile) {
    try {
      upstreamCa = readFileSync(cfg.upstreamCaFile);
    } catch (e) {
      err(`cannot read the upstream CA file ${cfg.upstreamCaFile}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
      return 2;
    }
    // Node takes a file without a certificate in it silently, and every connection would then
    // fail its check: say so now instead.
    if (!holdsCertificate(upstreamCa)) {
      err(`the upstream CA file ${cfg.upstreamCaFile} holds no PEM certificate`);
      return 2;
    }
  }

  let trafficPolicy: string | undefined;
  if (cfg.trafficPolicyFile) {
    try {
      trafficPolicy = readFileSync(cfg.trafficPolicyFile, 'utf8');
    } catch (e) {
      err(`cannot read the traffic policy file ${cfg.trafficPolicyFile}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
      return 2;
    }
    // An empty file would bind the endpoint without any policy: most likely not what was meant.
    if (trafficPolicy.trim() === '') {
      err(`the traffic policy file ${cfg.trafficPolicyFile} is empty`);
      return 2;
    }
  }

  const client = new AgentClient({
    serverAddr: cfg.server,
    authtoken: cfg.authtoken,
    ca,
    metadata: cfg.metadata,
    drainMs: cfg.drainMs,
    upstreamCa,
    upstreamTlsVerify: cfg.upstreamTlsVerify,
    log: createLogger('warren-agent', process.env.LOG_LEVEL ?? 'warn'),
  });
  let stopping = false;
  /** Aborted by the first signal: a wait before retrying the first connection ends at once. */
  const stopped = new AbortController();
  const stop = () => {
    if (stopping) process.exit(1); // second signal: give up on a clean shutdown
    stopping = true;
    stopped.abort();
    void client.close();
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
  // Not a second signal: a parent gone while this process drains lets the drain finish.
  stopWithParent(() => {
    if (!stopping) stop();
  });

  // Set when the server took the last tunnel away: the process exits 1, so that a supervisor
  // sees it rather than a session that serves nothing.
  let lostAll = false;
  const finished = new Promise<number>((resolve) =>
    client.on('closed', (reason, fatal) => {
      if (fatal) err(reason);
      resolve(fatal || lostAll ? 1 : 0);
    }),
  );
  client.on('tunnel', (t) => out(onlineLine(t)));
  client.on('draining', (n, ms) => err(`waiting up to ${Math.ceil(ms / 1000)} s for ${n} connection${n === 1 ? '' : 's'} in progress to finish (signal again to quit now)`));
  client.on('disconnected', (reason) => err(`session lost (${reason}); reconnecting`));
  client.on('tunnelLost', (id, reason) => {
    err(`tunnel ${id} lost: ${reason}`);
    if (client.tunnelCount === 0 && !stopping) {
      err('no tunnel left; exiting');
      lostAll = true;
      stopping = true;
      void client.close();
    }
  });
  client.on('forwardError', (id, e) => err(`tunnel ${id}: cannot reach ${cfg.targetUrl}: ${(e as NodeJS.ErrnoException).code ?? e.message}`));

  // The first connection: an unreachable server is retried (it may be starting), a refusal is final.
  for (let attempt = 0; ; attempt++) {
    try {
      await client.connect();
      break;
    } catch (e) {
      if (stopping) return finished;
      if (e instanceof AgentRpcError) {
        err(e.message);
        return 1;
      }
      const delay = Math.round(Math.min(10_000, 500 * 2 ** Math.min(attempt, 5)) * (0.5 + Math.random() * 0.5));
      err(`cannot reach ${cfg.server}: ${(e as Error).message}; retrying in ${(delay / 1000).toFixed(1)} s`);
      await sleep(delay, stopped.signal);
      if (stopping) return finished;
    }
  }

  try {
    if (cfg.labels) await client.startLabeledTunnel(cfg.labels, cfg.target, { metadata: cfg.metadata });
    else await client.bind({ proto: cfg.scheme, domain: cfg.domain ?? undefined, forwardsTo: cfg.target, pooling: cfg.pooling, bindings: cfg.internal ? ['internal'] : [], metadata: cfg.metadata, trafficPolicy });
  } catch (e) {
    if (stopping) return finished;
    err((e as Error).message);
    await client.close();
    return 1;
  }
  return finished;
}

main().then(
  (code) => process.exit(code),
  (e: unknown) => {
    err((e as Error).message ?? String(e));
    process.exit(1);
  },
);

/** True when `pem` holds at least one certificate Node can parse (PEM, `-----BEGIN CERTIFICATE-----`). */
function holdsCertificate(pem: Buffer): boolean {
  const blocks = pem.toString('latin1').match(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g) ?? [];
  return blocks.some((b) => {
    try {
      new X509Certificate(b);
      return true;
    } catch {
      return false;
    }
  });
}
