import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import client from 'prom-client';
import { createLogger, type DpTunnel } from '@warren/shared';
import type { Db } from '../db/pool.js';
import { startConfigPush, type ConfigPush, type ConfigPushOptions } from './index.js';
import { ControlPlaneClient, type ControlPlaneClientOptions } from '../../../ingress/src/config/index.js';

/** Test helpers: an in-process config push and real ingress-side clients, with short timers. */

export const FAST = { leaseMs: 1_500, keepaliveIntervalMs: 300, sweepIntervalMs: 100 } as const;

export async function startTestPush(db: Db, over: Partial<ConfigPushOptions> = {}): Promise<ConfigPush & { registry: client.Registry }> {
  const registry = new client.Registry();
  const push = await startConfigPush({
    db,
    databaseUrl: db.pool.options.connectionString!,
    log: createLogger('config-push-test', process.env.TEST_LOG_LEVEL ?? 'silent'),
    registry,
    grpc: { host: '127.0.0.1', port: 0 },
    // Pass the test API's base URL to get event uris as the API's.
    baseUrl: 'http://127.0.0.1',
    listenerBackoff: { initialMs: 20, maxMs: 200 },
    ...FAST,
    ...over,
  });
  return Object.assign(push, { registry });
}

export interface TestNode {
  client: ControlPlaneClient;
  registry: client.Registry;
  stateDir: string;
  nodeId: string;
}

const nodes: TestNode[] = [];
const dirs: string[] = [];

export async function tempDir(): Promise<string> {
  const d = await mkdtemp(path.join(tmpdir(), 'warren-node-'));
  dirs.push(d);
  return d;
}

/** A ControlPlaneClient (not started) with a temp state dir and fast backoff. */
export async function newNode(targets: string[], over: Partial<ControlPlaneClientOptions> = {}): Promise<TestNode> {
  const registry = new client.Registry();
  const nodeId = over.nodeId ?? `node-${randomBytes(3).toString('hex')}`;
  const stateDir = over.stateDir ?? (await tempDir());
  const c = new ControlPlaneClient({
    targets,
    nodeId,
    nodeAddress: `127.0.0.1:${10_000 + Math.floor(Math.random() * 50_000)}`,
    stateDir,
    registry,
    log: createLogger(`ingress-${nodeId}`, process.env.TEST_LOG_LEVEL ?? 'silent'),
    backoff: { initialMs: 20, maxMs: 200 },
    ...over,
  });
  const node = { client: c, registry, stateDir, nodeId };
  nodes.push(node);
  return node;
}

/**
 * {@link newNode}, started and connected with its first config applied, recording the remote
 * tunnels it hears of (`ups`) and loses (`downs`).
 */
export async function connectedNode(targets: string[], over: Partial<ControlPlaneClientOptions> = {}): Promise<TestNode & { ups: DpTunnel[]; downs: string[] }> {
  const n = await newNode(targets, over);
  const ups: DpTunnel[] = [];
  const downs: string[] = [];
  n.client.on('remoteTunnelUp', (t) => ups.push(t));
  n.client.on('remoteTunnelDown', (id) => downs.push(id));
  const connected = new Promise<void>((r) => n.client.once('connected', () => r()));
  await n.client.start();
  await connected;
  for (const until = Date.now() + 5_000; n.client.config === null; await new Promise((r) => setTimeout(r, 10))) {
    if (Date.now() > until) throw new Error(`${n.nodeId} got no config within 5 s`);
  }
  return Object.assign(n, { ups, downs });
}

/** Stops every node made by newNode and removes the temp dirs. */
export async function cleanupNodes(): Promise<void> {
  await Promise.all(nodes.splice(0).map((n) => n.client.stop()));
  await Promise.all(dirs.splice(0).map((d) => rm(d, { recursive: true, force: true })));
}

/** Value of a metric (no labels, or the given ones). */
export async function metricValue(registry: client.Registry, name: string, labels: Record<string, string> = {}): Promise<number | undefined> {
  const m = await registry.getSingleMetric(name)?.get();
  return m?.values.find((v) => Object.entries(labels).every(([k, x]) => v.labels[k] === x))?.value;
}
