import { parseArgs } from 'node:util';
import { DRAIN_MS } from './client.js';
import { parseForwardTarget } from './forward.js';

/** Command-line parsing for warren-agent (pure: no I/O, testable). */

export const USAGE = `Usage:
  warren-agent http <port|host:port|url> --label <key>=<value> [--label …]   labeled tunnel (routed by an HTTPS edge)
  warren-agent http <port|host:port|url> [--domain <host>] [--pooling] [--internal] [--scheme https|http]
                                         [--traffic-policy-file <file>]      endpoint tunnel

Options:
  --authtoken <token>   agent authtoken (default: $WARREN_AUTHTOKEN)
  --server <host:port>  ingress agent listener (default: $WARREN_SERVER)
  --ca <file>           PEM of the CA that signed the server certificate (default: $WARREN_CA; else system CAs)
  --metadata <text>     opaque session metadata shown by the API
  --drain-timeout <s>   on SIGINT/SIGTERM, seconds the shutdown may take: the tunnels are
                        unbound, the requests in progress finish, the session closes
                        (default: $WARREN_DRAIN_TIMEOUT, else 10; 0: at once)
  --upstream-ca <file>  for an https:// or tls:// local service: PEM of the CA that signed its
                        certificate (default: the system CAs)
  --upstream-insecure   for an https:// or tls:// local service: do not check its certificate
                        (e.g. a self-signed one)
  --traffic-policy-file <file>
                        a traffic policy (YAML or JSON, as a route's traffic_policy) for the
                        endpoint, run by the ingress on each of its requests
  -h, --help            this text`;

export interface CliConfig {
  /** Local service, as typed (port, host:port or URL). */
  target: string;
  /** Normalised local service URL, e.g. `http://localhost:8080`. */
  targetUrl: string;
  labels: Record<string, string> | null;
  domain: string | null;
  pooling: boolean;
  internal: boolean;
  scheme: 'http' | 'https';
  authtoken: string;
  server: string;
  /** Path of a CA PEM file, or null for the system CAs. */
  caFile: string | null;
  metadata: string;
  /** Path of the endpoint's traffic policy file (YAML or JSON), or null. */
  trafficPolicyFile: string | null;
  /** --drain-timeout, in ms. */
  drainMs: number;
  /** --upstream-ca: path of a CA PEM file for an https:// or tls:// local service, or null. */
  upstreamCaFile: string | null;
  /** false with --upstream-insecure. */
  upstreamTlsVerify: boolean;
}

export type CliParse = { kind: 'run'; config: CliConfig } | { kind: 'help' } | { kind: 'error'; message: string };

export function parseCli(argv: readonly string[], env: Readonly<Record<string, string | undefined>>): CliParse {
  let parsed;
  try {
    parsed = parseArgs({
      args: [...argv],
      allowPositionals: true,
      strict: true,
      options: {
        label: { type: 'string', multiple: true },
        domain: { type: 'string' },
        pooling: { type: 'boolean' },
        internal: { type: 'boolean' },
        scheme: { type: 'string' },
        authtoken: { type: 'string' },
        server: { type: 'string' },
        ca: { type: 'string' },
        metadata: { type: 'string' },
        'drain-timeout': { type: 'string' },
        'traffic-policy-file': { type: 'string' },
        'upstream-ca': { type: 'string' },
        'upstream-insecure': { type: 'boolean' },
        help: { type: 'boolean', short: 'h' },
      },
    });
  } catch (err) {
    return { kind: 'error', message: (err as Error).message };
  }
  const { values: v, positionals } = parsed;
  if (v.help) return { kind: 'help' };
  const [command, target, ...extra] = positionals;
  if (!command) return { kind: 'error', message: 'missing command: warren-agent http <port>' };
  if (command !== 'http') return { kind: 'error', message: `unknown command ${JSON.stringify(command)}: only "http" is supported` };
  if (!target) return { kind: 'error', message: 'missing the local service to forward to, e.g. warren-agent http 8080' };
  if (extra.length > 0) return { kind: 'error', message: `unexpected argument ${JSON.stringify(extra[0])}` };

  let forward;
  try {
    forward = parseForwardTarget(target);
  } catch (err) {
    return { kind: 'error', message: (err as Error).message };
  }
  const targetUrl = forward.url;
  if (v['upstream-ca'] !== undefined || v['upstream-insecure']) {
    const flag = v['upstream-ca'] !== undefined ? '--upstream-ca' : '--upstream-insecure';
    if (!forward.tls) return { kind: 'error', message: `${flag} applies to an https:// or tls:// local service, not ${targetUrl}` };
    if (v['upstream-ca'] !== undefined && v['upstream-insecure']) return { kind: 'error', message: '--upstream-ca and --upstream-insecure exclude each other: a certificate is either checked against that CA or not at all' };
    if (v['upstream-ca'] === '') return { kind: 'error', message: '--upstream-ca needs a file name' };
  }

  let labels: Record<string, string> | null = null;
  for (const raw of v.label ?? []) {
    const eq = raw.indexOf('=');
    if (eq <= 0 || eq === raw.length - 1) return { kind: 'error', message: `invalid label ${JSON.stringify(raw)}: use key=value` };
    labels ??= {};
    const key = raw.slice(0, eq);
    if (key in labels) return { kind: 'error', message: `label ${JSON.stringify(key)} given twice` };
    labels[key] = raw.slice(eq + 1);
  }
  if (labels && (v.domain !== undefined || v.pooling || v.internal || v.scheme !== undefined || v['traffic-policy-file'] !== undefined)) {
    return { kind: 'error', message: "--label starts a labeled tunnel; --domain, --pooling, --internal, --scheme and --traffic-policy-file apply to endpoint tunnels only (a labeled tunnel's traffic policy is its edge route's)" };
  }
  if (v['traffic-policy-file'] === '') return { kind: 'error', message: '--traffic-policy-file needs a file name' };
  const scheme = v.scheme ?? 'https';
  if (scheme !== 'http' && scheme !== 'https') return { kind: 'error', message: '--scheme must be http or https' };

  let drainMs = DRAIN_MS;
  const drain = v['drain-timeout'] ?? env.WARREN_DRAIN_TIMEOUT;
  if (drain !== undefined) {
    const seconds = /^\d+(\.\d+)?$/.test(drain.trim()) ? Number(drain.trim()) : NaN;
    const what = v['drain-timeout'] !== undefined ? '--drain-timeout' : 'WARREN_DRAIN_TIMEOUT';
    if (!(seconds <= 3600)) return { kind: 'error', message: `invalid ${what} ${JSON.stringify(drain)}: use seconds from 0 to 3600` };
    drainMs = Math.round(seconds * 1000);
  }

  const authtoken = v.authtoken ?? env.WARREN_AUTHTOKEN ?? '';
  if (!authtoken) return { kind: 'error', message: 'no authtoken: pass --authtoken or set WARREN_AUTHTOKEN' };
  const server = v.server ?? env.WARREN_SERVER ?? '';
  if (!server) return { kind: 'error', message: 'no server: pass --server host:port or set WARREN_SERVER' };
  if (!/^(\[[^\]]+\]|[^:\s]+):\d{1,5}$/.test(server)) return { kind: 'error', message: `invalid --server ${JSON.stringify(server)}: use host:port` };

  return {
    kind: 'run',
    config: {
      target,
      targetUrl,
      labels,
      domain: v.domain ?? null,
      pooling: v.pooling === true,
      internal: v.internal === true,
      scheme,
      authtoken,
      server,
      caFile: v.ca ?? env.WARREN_CA ?? null,
      metadata: v.metadata ?? '',
      trafficPolicyFile: v['traffic-policy-file'] ?? null,
      drainMs,
      upstreamCaFile: v['upstream-ca'] ?? null,
      upstreamTlsVerify: v['upstream-insecure'] !== true,
    },
  };
}

/** The line printed when a tunnel is online. */
export function onlineLine(t: { id: string; url: string; labels: Record<string, string>; forwardsTo: string }): string {
  const what = t.url || `labels ${Object.entries(t.labels).map(([k, v]) => `${k}=${v}`).join(' ')}`;
  return `tunnel ${t.id} online: ${what} → ${t.forwardsTo}`;
}
