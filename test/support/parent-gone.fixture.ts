/**
 * The process parent-gone.e2e.test.ts kills: it starts a control plane, two ingresses, a worker and
 * our agent the way the test harness does (an IPC channel, output piped to this process), prints
 * their pids as one JSON line, and waits to be killed. Its services must then stop by themselves.
 *
 * Env: FIXTURE_DATABASE_URL, FIXTURE_REDIS_URL, FIXTURE_EVENTS_PREFIX, and FIXTURE_STATE_DIR, where the
 * ingresses keep their state (this process is killed before it could remove temporary directories).
 */
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { startControlPlane } from './processes.js';
import { startAgentProcess, startIngress } from './cluster.js';
import { startEventWorker } from './events.js';

const databaseUrl = process.env.FIXTURE_DATABASE_URL!;
const nodeToken = randomBytes(16).toString('hex');
// LOG_LEVEL info, as `npm start` runs them: they log while they stop, into pipes no one reads
// any more (a log line still buffered at exit once kept the process from exiting).
const cp = await startControlPlane({ databaseUrl, env: { WARREN_NODE_TOKEN: nodeToken, LOG_LEVEL: 'info' } });
const ingress = await startIngress({ nodeId: 'parent-gone', stateDir: path.join(process.env.FIXTURE_STATE_DIR!, 'ingress'), controlPlane: [`127.0.0.1:${cp.grpcPort}`], nodeToken, env: { LOG_LEVEL: 'info' } });
// And one whose control plane is down: it serves (an empty config) and, having little to close,
// stops within milliseconds, before its first log line's broken pipe is even reported.
const lone = await startIngress({ nodeId: 'parent-gone-lone', stateDir: path.join(process.env.FIXTURE_STATE_DIR!, 'lone'), controlPlane: ['127.0.0.1:1'], nodeToken, env: { LOG_LEVEL: 'info' } });
const worker = await startEventWorker({ DATABASE_URL: databaseUrl, REDIS_URL: process.env.FIXTURE_REDIS_URL!, EVENTS_PREFIX: process.env.FIXTURE_EVENTS_PREFIX!, LOG_LEVEL: 'info' });
// A server that refuses connections: the agent keeps retrying its first connection, as one does
// whose server is not up yet.
const agent = startAgentProcess(['http', '1', '--server', '127.0.0.1:1', '--authtoken', 'parent-gone'], { LOG_LEVEL: 'info' });
await agent.waitForOutput('retrying');
process.stdout.write(`${JSON.stringify({ controlPlane: cp.pid, ingress: ingress.pid, loneIngress: lone.pid, worker: worker.pid, agent: agent.pid })}\n`);
setInterval(() => {}, 60_000);
