/**
 * Config propagation bench (not part of `npm test`):
 *
 *   npx tsx test/load/propagation-bench.ts        (or: npm run bench:propagation)
 *
 * A real control plane (REST + gRPC) and BENCH_NODES (3) real ingress processes on a fresh
 * database. One HTTPS edge with one route; each iteration PATCHes the route's `match` to a new
 * path `/p<i>` after a random 50–500 ms gap (so batching cannot flatter the result), and a prober
 * per node sends back-to-back requests for `/p<i>` until the node answers with the route (502: the
 * route has no backend) instead of 404 (no such route). Reports, over BENCH_CHANGES (200) changes,
 * p50/p95/p99/max of (last node enforcing − PATCH response), and also from PATCH sent; then a burst
 * of 100 PATCHes in one second and the time until every node enforces the last one.
 * Writes test/load/results/propagation.json.
 */
import http from 'node:http';
import { mkdirSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { freePort, startControlPlane, type ControlPlaneProcess } from '../support/processes.js';
import { cleanupTempDirs, startIngress, waitFor, type IngressProcess } from '../support/cluster.js';
import { benchDatabase, fmt, log, machine, percentile } from './support.js';

const CHANGES = Number(process.env.BENCH_CHANGES ?? 200);
const NODES = Number(process.env.BENCH_NODES ?? 3);
const RESULTS = fileURLToPath(new URL('./results/propagation.json', import.meta.url));
const HOST = 'prop.bench.test';
const now = () => performance.timeOrigin + performance.now();
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const agent = new http.Agent({ keepAlive: true, maxSockets: 4 });
function status(port: number, path: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path, agent, headers: { host: HOST } }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('error', reject);
    req.end();
  });
}

/** Time at which `port` first answers `path` with something other than 404. */
async function enforcedAt(port: number, path: string, deadline: number): Promise<number> {
  for (;;) {
    const s = await status(port, path);
    const t = now();
    if (s !== 404) return t;
    if (t > deadline) throw new Error(`node on ${port} did not apply ${path} within the deadline`);
  }
}

function stats(xs: number[]) {
  const s = [...xs].sort((x, y) => x - y);
  return { n: s.length, p50: percentile(s, 50), p95: percentile(s, 95), p99: percentile(s, 99), max: s[s.length - 1] ?? NaN, mean: s.reduce((a, b) => a + b, 0) / s.length };
}

async function main(): Promise<void> {
  const db = await benchDatabase('propbench');
  const nodeToken = randomBytes(16).toString('hex');
  let cp: ControlPlaneProcess | undefined;
  const nodes: IngressProcess[] = [];
  try {
    const grpcPort = await freePort();
    cp = await startControlPlane({ databaseUrl: db.url, env: { GRPC_PORT: String(grpcPort), WARREN_NODE_TOKEN: nodeToken } });
    for (let i = 0; i < NODES; i++) nodes.push(await startIngress({ nodeId: `prop-${i}`, controlPlane: [`127.0.0.1:${grpcPort}`], nodeToken }));
    const api = async (method: string, path: string, body?: unknown) => {
      const res = await fetch(cp!.baseUrl + path, {
        method,
        headers: { authorization: `Bearer ${db.apiKey}`, 'ngrok-version': '2', ...(body ? { 'content-type': 'application/json' } : {}) },
        body: body ? JSON.stringify(body) : undefined,
      });
      const json = (await res.json()) as { id: string };
      if (res.status >= 300) throw new Error(`${method} ${path}: ${res.status} ${JSON.stringify(json)}`);
      return json;
    };
    const edge = await api('POST', '/edges/https', { hostports: [`${HOST}:443`] });
    const route = await api('POST', `/edges/https/${edge.id}/routes`, { match_type: 'path_prefix', match: '/p-initial' });
    for (const n of nodes) await waitFor('initial route', async () => (await status(n.http, '/p-initial')) !== 404, 15_000);
    log(`${NODES} nodes up; ${CHANGES} changes with 50–500 ms gaps`);

    const fromResponse: number[] = [];
    const fromSent: number[] = [];
    const patchMs: number[] = [];
    const routePath = `/edges/https/${edge.id}/routes/${route.id}`;
    for (let i = 0; i < CHANGES; i++) {
      await sleep(50 + Math.random() * 450);
      const p = `/p${i}`;
      const t0 = now();
      await api('PATCH', routePath, { match: p });
      const t1 = now();
      const enforced = await Promise.all(nodes.map((n) => enforcedAt(n.http, p, t1 + 10_000)));
      const last = Math.max(...enforced);
      fromResponse.push(last - t1);
      fromSent.push(last - t0);
      patchMs.push(t1 - t0);
      if ((i + 1) % 50 === 0) log(`${i + 1}/${CHANGES}: p99 so far ${fmt(stats(fromResponse).p99, 1)} ms`);
    }

    // Burst: 100 PATCHes in about one second, then convergence on the last.
    const burstStart = now();
    let lastSent = 0;
    for (let i = 0; i < 100; i++) {
      await api('PATCH', routePath, { match: `/burst${i}` });
      lastSent = now();
      const wait = burstStart + (i + 1) * 10 - now();
      if (wait > 0) await sleep(wait);
    }
    const burstEnforced = await Promise.all(nodes.map((n) => enforcedAt(n.http, '/burst99', lastSent + 10_000)));
    const burst = { patches: 100, seconds: (lastSent - burstStart) / 1000, converged_ms_after_last: Math.max(...burstEnforced) - lastSent };

    const result = {
      bench: 'config-propagation',
      at: new Date().toISOString(),
      machine: { ...machine(), postgres: db.pgVersion },
      nodes: NODES,
      changes: CHANGES,
      patch_response_to_all_enforcing_ms: stats(fromResponse),
      patch_sent_to_all_enforcing_ms: stats(fromSent),
      patch_request_ms: stats(patchMs),
      burst,
    };
    mkdirSync(fileURLToPath(new URL('./results/', import.meta.url)), { recursive: true });
    writeFileSync(RESULTS, `${JSON.stringify(result, null, 2)}\n`);
    const r = result.patch_response_to_all_enforcing_ms;
    const s = result.patch_sent_to_all_enforcing_ms;
    console.log(`\nconfig propagation, ${NODES} ingress nodes, ${CHANGES} changes`);
    console.log(`  PATCH response → all enforcing: p50 ${fmt(r.p50, 1)} ms  p95 ${fmt(r.p95, 1)} ms  p99 ${fmt(r.p99, 1)} ms  max ${fmt(r.max, 1)} ms`);
    console.log(`  PATCH sent     → all enforcing: p50 ${fmt(s.p50, 1)} ms  p95 ${fmt(s.p95, 1)} ms  p99 ${fmt(s.p99, 1)} ms  max ${fmt(s.max, 1)} ms`);
    console.log(`  burst of 100 PATCHes in ${fmt(burst.seconds, 2)} s: all nodes on the last one ${fmt(burst.converged_ms_after_last, 1)} ms after it returned`);
    console.log(`  (written to ${RESULTS})`);
  } finally {
    agent.destroy();
    await Promise.allSettled(nodes.map((n) => n.stop()));
    await cp?.stop().catch(() => {});
    await db.drop();
    cleanupTempDirs();
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
