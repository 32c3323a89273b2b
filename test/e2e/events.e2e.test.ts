import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import pg from 'pg';
import { Redis } from 'ioredis';
import { bufferKey, type EventTargetKind } from '@warren/shared';
import { redisKeyPattern } from '../../services/ingress/src/ratelimit/index.js';
import { ensureLocalTls } from '../../services/ingress/src/tls.js';
import { createDb, createPool } from '../../services/control-plane/src/db/pool.js';
import { createAccountWithKey } from '../../services/control-plane/src/modules/accounts/accounts.service.js';
import { freshDatabase } from '../support/databases.js';
import { startControlPlane, type ControlPlaneProcess } from '../support/processes.js';
import { callApi, cleanupTempDirs, startAgentProcess, startIngress, tempDir, waitFor, type AgentProcess, type IngressProcess } from '../support/cluster.js';
import { startRedisServer, type RedisServer } from '../support/redis-server.js';
import { startAwsFake, startAzureFake, startDatadogFake, type AwsFake, type AzureFake, type DatadogFake } from '../support/fakes/index.js';
import { deleteKeys, metricValue, redisContents, repeated, runEventsAdmin, startEventWorker, unfinishedFlushJobs, type EventWorkerProcess } from '../support/events.js';
import { AGENT_ONLINE_MS, CLI_RUN_MS, CONTROL_PLANE_START_MS, INGRESS_START_MS, WORKER_START_MS, WORK_MS } from '../support/timeouts.js';

/**
 * The whole event pipeline with real processes (event-delivery.md §4): the control plane (REST
 * API on a fresh Postgres database) writes an outbox row with every change; the worker process
 * (`services/worker/src/main.ts`) relays those rows into the Redis buffers and delivers them with
 * BullMQ to the local receivers that check the real protocols (AWS fake with SigV4 and STS, the
 * Datadog intake, the Azure token + Logs Ingestion endpoints over HTTPS); an ingress + agent adds
 * traffic events. Redis is a private `redis-server` with its append-only file (as production
 * runs it), so it can be restarted mid-run without losing data.
 *
 * Each scenario uses its own account (and so its own destinations): an account's audit events
 * only ever go to its own destinations, which keeps the scenarios apart while sharing one control
 * plane, one worker at a time and one set of receivers. Faults: a receiver stopped for a while,
 * kill -9 of the worker mid-call, SIGTERM mid-call, a Redis restart with API changes during the
 * outage. Invariants checked: every event arrives; fault-free runs have no duplicates; duplicates
 * only from a call whose outcome was unknown; dead letters with a reason; queues drain; no secret
 * in Redis or in the logs.
 */

const IPP_TYPES = ['ip_policy_created.v0', 'ip_policy_updated.v0', 'ip_policy_deleted.v0'];
const REGION = 'eu-west-2';
const AWS_ACCOUNT = '210987654321';
// Secrets: each must never show up in Redis or in a log line.
const AWS_KEY = 'AKIAWARRENE2E0000001';
const AWS_SECRET = 'e2eDestSecretAccessKey/0000000000SECRET01';
const BASE_KEY = 'AKIAWARRENBASEE2E001';
const BASE_SECRET = 'e2eWarrenBaseSecretForAssumeRole/SECRET02';
const ROLE_ARN = `arn:aws:iam::${AWS_ACCOUNT}:role/warren-delivery`;
const DD_KEY = 'dd0e2e0SECRET0api0key0000000003';
const DD_WRONG_KEY = 'dd0e2e0WRONG0api0key00000000004';
const AZ_TENANT = '72f988bf-86f1-41af-91ab-2d7cd011db47';
const AZ_CLIENT = 'b3b1c0de-0000-4000-8000-00000000e2e0';
const AZ_SECRET = 'azE2E~ClientSecret.SECRET05';
const AZ_STREAM = 'Custom-WarrenEvents_CL';
const SECRETS = [AWS_SECRET, BASE_SECRET, DD_KEY, DD_WRONG_KEY, AZ_SECRET];

const HOST = 'delivery.events.e2e.test';
const prefix = `warren_test_${inject('runId')}_${randomBytes(3).toString('hex')}`;
const rlServer = `${prefix}-rl`;

interface Account {
  name: string;
  id: string;
  apiKeyId: string;
  key: string;
}
interface Dest {
  id: string;
  kind: EventTargetKind;
  label: string;
  account: Account;
}
interface Envelope {
  event_id: string;
  event_type: string;
  event_timestamp: string;
  account_id: string;
  object: any;
  principal: any;
}
interface OutboxRow {
  event_id: string;
  event_type: string;
  resource_id: string;
}

let db: Awaited<ReturnType<typeof freshDatabase>>;
let pool: pg.Pool;
let redisServer: RedisServer;
/** The private Redis's data directory (its append-only file), removed at the end. */
let redis: Redis;
let cp: ControlPlaneProcess;
let aws: AwsFake;
let dd: DatadogFake;
let az: AzureFake;
let caFile: string;
let nodeToken: string;
let worker: EventWorkerProcess;
const workers: EventWorkerProcess[] = [];
const dests: Dest[] = [];
const acct: Record<string, Account> = {};
let ingress: IngressProcess | undefined;
let agent: AgentProcess | undefined;
let upstream: http.Server | undefined;
let tlsFiles: { caFile: string; certFile: string; keyFile: string };

// ---------------------------------------------------------------------------------------------
// helpers

function workerEnv(): Record<string, string> {
  return {
    DATABASE_URL: db.url,
    REDIS_URL: redisServer.url,
    EVENTS_PREFIX: prefix,
    METRICS_PORT: '0',
    AWS_ENDPOINT_URL: aws.url,
    DATADOG_BASE_URL: dd.url,
    AZURE_AUTHORITY_HOST: az.url,
    EVENTS_CA_FILE: caFile,
    WARREN_AWS_ACCESS_KEY_ID: BASE_KEY,
    WARREN_AWS_SECRET_ACCESS_KEY: BASE_SECRET,
    RETRY_SCHEDULE_MS: '200,400,800,1600,3200',
    // Short enough that a killed worker's job is taken over within seconds, long enough that a
    // Redis restart (under a second here) does not cost an active job its lock.
    LOCK_DURATION_MS: '5000',
    STALLED_INTERVAL_MS: '1000',
    SHUTDOWN_TIMEOUT_MS: '8000',
    REQUEST_TIMEOUT_MS: '10000',
    WORKER_CONCURRENCY: '10',
    LOG_LEVEL: 'info',
  };
}

async function startWorker(): Promise<EventWorkerProcess> {
  const w = await startEventWorker(workerEnv());
  workers.push(w);
  return w;
}

async function ok(a: Account, method: string, p: string, body: unknown, status: number): Promise<any> {
  const r = await callApi(cp.baseUrl, a.key, method, p, body);
  if (r.status !== status) throw new Error(`${a.name}: ${method} ${p}: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body;
}

function targetFor(kind: EventTargetKind, label: string, o: { auth?: 'creds' | 'role'; apiKey?: string }): Record<string, unknown> {
  const auth = o.auth === 'role' ? { role: { role_arn: ROLE_ARN } } : { creds: { aws_access_key_id: AWS_KEY, aws_secret_access_key: AWS_SECRET } };
  switch (kind) {
    case 'firehose':
      return { firehose: { auth, delivery_stream_arn: `arn:aws:firehose:${REGION}:${AWS_ACCOUNT}:deliverystream/fh-${label}` } };
    case 'kinesis':
      return { kinesis: { auth, stream_arn: `arn:aws:kinesis:${REGION}:${AWS_ACCOUNT}:stream/ks-${label}` } };
    case 'cloudwatch_logs':
      return { cloudwatch_logs: { auth, log_group_arn: `arn:aws:logs:${REGION}:${AWS_ACCOUNT}:log-group:/warren/${label}:*` } };
    case 'datadog':
      return { datadog: { api_key: o.apiKey ?? DD_KEY, ddtags: `dest:${label}`, service: 'warren-e2e', ddsite: 'datadoghq.com' } };
    case 'azure_logs_ingestion':
      return {
        azure_logs_ingestion: {
          tenant_id: AZ_TENANT,
          client_id: AZ_CLIENT,
          client_secret: AZ_SECRET,
          logs_ingestion_uri: az.url,
          data_collection_rule_id: `dcr-${label}`,
          data_collection_stream_name: AZ_STREAM,
        },
      };
  }
}

/** POST /event_destinations; the label names its stream / tags at the receiver. */
async function destination(a: Account, kind: EventTargetKind, label: string, o: { auth?: 'creds' | 'role'; apiKey?: string } = {}): Promise<Dest> {
  const body = await ok(a, 'POST', '/event_destinations', { description: `e2e ${label}`, target: targetFor(kind, label, o) }, 201);
  const d = { id: body.id as string, kind, label, account: a };
  dests.push(d);
  return d;
}

async function subscribe(a: Account, types: string[], ds: Dest[]): Promise<string> {
  return (await ok(a, 'POST', '/event_subscriptions', { description: 'e2e', sources: types.map((type) => ({ type })), destination_ids: ds.map((d) => d.id) }, 201)).id;
}

/** Runs `fns` with at most `n` in flight; results in order. */
async function limit<T>(n: number, fns: Array<() => Promise<T>>): Promise<T[]> {
  const out: T[] = new Array(fns.length);
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(n, fns.length) }, async () => {
      while (next < fns.length) {
        const i = next++;
        out[i] = await fns[i]!();
      }
    }),
  );
  return out;
}

/** `n` new IP policies (n created events), `concurrency` API calls at a time. */
async function createPolicies(a: Account, n: number, tag: string, concurrency = 4): Promise<string[]> {
  return limit(
    concurrency,
    Array.from({ length: n }, (_, i) => async () => (await ok(a, 'POST', '/ip_policies', { description: `${tag}-${i}` }, 201)).id as string),
  );
}

/** Audit events of the account with one of `types`, in commit (version) order: what its subscribed destinations must get. */
async function expected(a: Account, types = IPP_TYPES): Promise<OutboxRow[]> {
  const { rows } = await pool.query<OutboxRow>('SELECT event_id, event_type, resource_id FROM outbox WHERE account_id = $1 AND event_type = ANY($2::text[]) ORDER BY version', [a.id, types]);
  return rows;
}

/** What the receiver accepted for one destination, in arrival order. */
function received(d: Dest): Envelope[] {
  switch (d.kind) {
    case 'firehose':
      return (aws.firehose.get(`fh-${d.label}`) ?? []).map((s) => {
        expect(s.endsWith('\n')).toBe(true);
        return JSON.parse(s) as Envelope;
      });
    case 'kinesis':
      return (aws.kinesis.get(`ks-${d.label}`) ?? []).map((r) => {
        const e = JSON.parse(r.data) as Envelope;
        expect(r.partitionKey).toBe(e.event_id);
        return e;
      });
    case 'cloudwatch_logs':
      return (aws.logs.get(`/warren/${d.label}/warren-${d.id}`) ?? []).map((x) => JSON.parse(x.message) as Envelope);
    case 'datadog':
      return dd.entries
        .filter((x) => x.ddtags === `dest:${d.label}`)
        .map((x) => {
          expect(x).toMatchObject({ ddsource: 'warren', service: 'warren-e2e' });
          return JSON.parse(x.message) as Envelope;
        });
    case 'azure_logs_ingestion':
      return ((az.rows.get(`dcr-${d.label}/${AZ_STREAM}`) ?? []) as Array<{ EventId: string; EventType: string; AccountId: string; Event: Envelope; Truncated: boolean; TimeGenerated: string }>).map((r) => {
        expect(r).toMatchObject({ EventId: r.Event.event_id, EventType: r.Event.event_type, AccountId: r.Event.account_id, Truncated: false });
        expect(Date.parse(r.TimeGenerated)).toBe(Date.parse(r.Event.event_timestamp));
        return r.Event;
      });
  }
}
const receivedIds = (d: Dest) => received(d).map((e) => e.event_id);

async function waitReceived(d: Dest, ids: string[], timeoutMs = 20_000): Promise<void> {
  await waitFor(
    `${ids.length} events at ${d.kind} ${d.label}`,
    () => {
      const got = new Set(receivedIds(d));
      return ids.every((id) => got.has(id));
    },
    timeoutMs,
  ).catch((err: Error) => {
    const got = new Set(receivedIds(d));
    throw new Error(`${err.message}; missing ${ids.filter((id) => !got.has(id)).length} of ${ids.length}\n--- worker log tail ---\n${worker.output().slice(-4000)}`);
  });
}

async function drained(timeoutMs = 20_000): Promise<void> {
  await waitFor('the flush queues to drain', async () => (await unfinishedFlushJobs(redis, prefix)) === 0, timeoutMs);
}

/** The relay has handed every committed outbox row to Redis. */
async function relayCaughtUp(): Promise<boolean> {
  const { rows } = await pool.query<{ caught: boolean }>('SELECT r.version >= c.version AS caught FROM event_relay_state r, config_state c');
  return rows[0]?.caught === true;
}

async function deadLetters(d?: Dest): Promise<Array<{ id: number; destination_id: string; account_id: string; reason: string; event_ids: string[] }>> {
  const { rows } = await pool.query('SELECT id::int AS id, destination_id, account_id, reason, event_ids FROM event_dead_letters WHERE ($1::text IS NULL OR destination_id = $1) ORDER BY id', [d?.id ?? null]);
  return rows;
}

/** An audit envelope matches its outbox row and the API key that made the change. */
function checkAudit(e: Envelope, row: OutboxRow, a: Account): void {
  expect(Object.keys(e)).toEqual(['event_id', 'event_type', 'event_timestamp', 'account_id', 'object', 'principal']);
  expect(e.event_id).toMatch(/^ev_[0-9A-Za-z]{27}$/);
  expect(e).toMatchObject({ event_id: row.event_id, event_type: row.event_type, account_id: a.id });
  expect(e.account_id).toMatch(/^ac_/);
  expect(e.event_timestamp).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
  expect(e.object.id).toBe(row.resource_id);
  expect(e.principal).toMatchObject({ id: a.apiKeyId, source: 'API', credential: { id: a.apiKeyId } });
}

/** Exactly the expected events, each once, in commit order, well-formed. */
function expectExactly(d: Dest, rows: OutboxRow[]): void {
  const got = received(d);
  expect(got.map((e) => e.event_id), `${d.kind} ${d.label}`).toEqual(rows.map((r) => r.event_id));
  got.forEach((e, i) => checkAudit(e, rows[i]!, d.account));
}

/** Log lines of every worker so far that mention a destination and a message. */
function logLines(d: Dest, msg: string | RegExp): number {
  return workers.flatMap((w) => w.logs()).filter((l) => l.dest === d.id && (typeof msg === 'string' ? l.msg === msg : msg.test(String(l.msg)))).length;
}

function expectNoSecrets(text: string, where: string): void {
  for (const s of SECRETS) expect(text.includes(s), `${where} contains the secret ${s.slice(0, 6)}…`).toBe(false);
}

async function nodeAtHead(n: IngressProcess): Promise<void> {
  const head = Number((await pool.query<{ version: string }>('SELECT version FROM config_state')).rows[0]!.version);
  await waitFor(`${n.nodeId} applies the head version`, async () => ((await (await fetch(`${n.internalUrl}/status`)).json()) as { config_version: number }).config_version >= head, 15_000);
}

function request(p: string, headers: Record<string, string>, port: number): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path: p, agent: false, headers: { host: HOST, ...headers } }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.setTimeout(10_000, () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end();
  });
}

// ---------------------------------------------------------------------------------------------
// setup

beforeAll(async () => {
  [db, redisServer, dd] = await Promise.all([freshDatabase(), startRedisServer({ persist: true }), startDatadogFake({ apiKeys: [DD_KEY] })]);
  pool = new pg.Pool({ connectionString: db.url, max: 4 });
  pool.on('error', () => {});
  redis = new Redis(redisServer.url, { maxRetriesPerRequest: null, retryStrategy: () => 100 });
  redis.on('error', () => {});
  const cpPool = createPool(db.url, 2);
  for (const name of ['all', 'other', 'traffic', 'down', 'dead', 'paused', 'kill', 'term', 'restart']) {
    const a = await createAccountWithKey(createDb(cpPool), `events-e2e-${name}`, `e2e key ${name}`);
    acct[name] = { name, id: a.accountId, apiKeyId: a.apiKeyId, key: a.token };
  }
  await cpPool.end();
  [aws, az] = await Promise.all([
    startAwsFake({
      credentials: { [AWS_KEY]: AWS_SECRET, [BASE_KEY]: BASE_SECRET },
      // The role may only be assumed with the ExternalId of the account that configured it.
      roles: { [ROLE_ARN]: { externalId: acct.all!.id } },
      expectedRegion: { 'fh-all': REGION, 'ks-all': REGION, '/warren/all': REGION, 'fh-kill': REGION, 'ks-restart': REGION },
    }),
    startAzureFake({ tenantId: AZ_TENANT, clientId: AZ_CLIENT, clientSecret: AZ_SECRET }),
  ]);
  const dir = tempDir('warren-events-e2e-');
  caFile = path.join(dir, 'azure-fake-ca.pem');
  writeFileSync(caFile, az.caPem);
  const tls = await ensureLocalTls(dir);
  tlsFiles = { caFile: tls.caFile, certFile: tls.caFile.replace(/ca\.pem$/, 'cert.pem'), keyFile: tls.caFile.replace(/ca\.pem$/, 'key.pem') };
  nodeToken = randomBytes(16).toString('hex');
  [cp, worker] = await Promise.all([startControlPlane({ databaseUrl: db.url, env: { WARREN_NODE_TOKEN: nodeToken } }), startWorker()]);
}, Math.max(CONTROL_PLANE_START_MS, WORKER_START_MS) + WORK_MS); // a control plane and a worker at once

afterAll(async () => {
  await Promise.allSettled([agent?.stop({ timeoutMs: 10_000 }), ingress?.stop({ timeoutMs: 10_000 })]);
  upstream?.close();
  await Promise.allSettled([...workers.map((w) => w.stop('SIGKILL', 5_000)), cp?.stop({ timeoutMs: 10_000 })]);
  if (redis) {
    await redisServer?.start().catch(() => {});
    await Promise.allSettled([deleteKeys(redis, `${prefix}:*`), deleteKeys(redis, redisKeyPattern(rlServer))]);
    redis.disconnect();
  }
  await redisServer?.dispose();
  await Promise.allSettled([aws?.close(), dd?.close(), az?.close()]);
  await pool?.end();
  await db?.drop();
  cleanupTempDirs();
}, 60_000);

// ---------------------------------------------------------------------------------------------

describe('event delivery end to end (control plane → outbox → relay → Redis → worker → receivers)', () => {
  let all: Dest[];

  it('every target gets exactly the audit events of its subscription, well-formed; role auth with the account as ExternalId; no secret in Redis or the logs', async () => {
    const a = acct.all!;
    const fh = await destination(a, 'firehose', 'all', { auth: 'creds' });
    const ks = await destination(a, 'kinesis', 'all', { auth: 'role' });
    const cw = await destination(a, 'cloudwatch_logs', 'all', { auth: 'creds' });
    const ddog = await destination(a, 'datadog', 'all');
    const azure = await destination(a, 'azure_logs_ingestion', 'all');
    all = [fh, ks, cw, ddog, azure];
    await subscribe(a, IPP_TYPES, all);
    // An unrelated change type that nobody subscribed to.
    await ok(a, 'POST', '/credentials', { description: 'not subscribed' }, 201);

    const ids = await createPolicies(a, 6, 'all');
    for (const id of ids.slice(0, 3)) await ok(a, 'PATCH', `/ip_policies/${id}`, { description: `patched ${id}` }, 200);
    for (const id of ids.slice(4)) await ok(a, 'DELETE', `/ip_policies/${id}`, undefined, 204);
    const rows = await expected(a);
    expect(rows.map((r) => r.event_type)).toEqual([...Array(6).fill(IPP_TYPES[0]), ...Array(3).fill(IPP_TYPES[1]), ...Array(2).fill(IPP_TYPES[2])]);

    for (const d of all) await waitReceived(d, rows.map((r) => r.event_id));
    await drained();
    for (const d of all) expectExactly(d, rows);

    // Role auth: Warren's own identity assumed the customer's role with the account as ExternalId.
    const assumed = aws.assumeRoleCalls.filter((c) => c.roleArn === ROLE_ARN);
    expect(assumed.length).toBeGreaterThanOrEqual(1);
    for (const c of assumed) expect(c).toMatchObject({ externalId: a.id, sessionName: `warren-${ks.id}`, callerAccessKeyId: BASE_KEY, ok: true });
    // Kinesis was called with the assumed (temporary) identity, signed for the ARN's region.
    const kinesisCalls = aws.requests.filter((r) => r.op === 'PutRecords' && r.status === 200);
    expect(kinesisCalls.length).toBeGreaterThanOrEqual(1);
    for (const r of kinesisCalls) expect(r).toMatchObject({ region: REGION, service: 'kinesis', accessKeyId: expect.stringMatching(/^ASIA/) });
    for (const r of aws.requests.filter((x) => x.op === 'PutRecordBatch')) expect(r).toMatchObject({ region: REGION, service: 'firehose', accessKeyId: AWS_KEY });
    // CloudWatch: the worker created its log stream warren-<destId> in the ARN's group.
    expect(aws.logStreams.has(`/warren/all/warren-${cw.id}`)).toBe(true);
    expect(aws.requests.some((r) => r.op === 'CreateLogStream' && r.status === 200)).toBe(true);
    // Azure: a client-credentials token for the monitor scope, then gzip uploads.
    expect(az.tokenCalls.some((c) => c.ok && c.tenant === AZ_TENANT && c.clientId === AZ_CLIENT && /monitor\.azure\.com\/+\.default/.test(c.scope))).toBe(true);
    expect(dd.requests.every((r) => r.gzip)).toBe(true);

    // Secrets: nowhere in Redis (buffers, job hashes with their data, everything under the prefix), nor in any log.
    const contents = await redisContents(redis, prefix);
    expect(contents.keys.some((k) => k.includes(':events-datadog:'))).toBe(true); // completed jobs are kept for a while
    expect(contents.text).toContain(`"destId\\":\\"${ddog.id}`); // the scan does read job data
    expectNoSecrets(contents.text, 'Redis');
    for (const w of workers) {
      expect(w.output()).toContain('event worker running'); // the logs are there to be checked
      expectNoSecrets(w.output(), `worker ${w.pid} output`);
    }
    expectNoSecrets(cp.output(), 'control plane output');
  }, 60_000);

  it("another account's events never reach this account's destinations", async () => {
    const a = acct.all!;
    const b = acct.other!;
    const bDest = await destination(b, 'datadog', 'other');
    await subscribe(b, IPP_TYPES, [bDest]);
    // B cannot subscribe its events to A's destination (it does not see it).
    const cross = await callApi(cp.baseUrl, b.key, 'POST', '/event_subscriptions', { sources: [{ type: 'ip_policy_created.v0' }], destination_ids: [all[3]!.id] });
    expect(cross.status).toBeGreaterThanOrEqual(400);
    expect(cross.status).toBeLessThan(500);

    await createPolicies(b, 4, 'other');
    const marker = await createPolicies(a, 1, 'marker'); // committed after B's: once it arrives, B's would have too
    const aRows = await expected(a);
    const bRows = await expected(b);
    expect(bRows).toHaveLength(4);
    await waitReceived(bDest, bRows.map((r) => r.event_id));
    for (const d of all) await waitReceived(d, aRows.map((r) => r.event_id));
    await drained();
    expect(aRows.at(-1)!.resource_id).toBe(marker[0]);
    for (const d of all) expectExactly(d, aRows);
    expectExactly(bDest, bRows);
  }, 60_000);

  it('traffic events: requests through the ingress (some rate-limited) reach Datadog, one entry per request, with the rate-limit result', async () => {
    const t = acct.traffic!;
    const d = await destination(t, 'datadog', 'traffic');
    await subscribe(t, ['http_request_complete.v0'], [d]);
    const cred = await ok(t, 'POST', '/credentials', {}, 201);
    const backend = (await ok(t, 'POST', '/backends/tunnel_group', { labels: { app: 'events-delivery' } }, 201)).id;
    const edgeId = (await ok(t, 'POST', '/edges/https', { hostports: [`${HOST}:443`] }, 201)).id;
    const policy = JSON.stringify({
      inbound: [{ name: 'limit', actions: [{ type: 'rate-limit', config: { name: 'per-user', algorithm: 'sliding_window', capacity: 3, rate: '60s', bucket_key: ["getReqHeader('X-User')"] } }] }],
    });
    const routeId = (await ok(t, 'POST', `/edges/https/${edgeId}/routes`, { match_type: 'path_prefix', match: '/rl', backend: { backend_id: backend }, traffic_policy: { value: policy } }, 201)).id;

    upstream = http.createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'text/plain' });
        res.end(`hello ${req.url}`);
      });
    });
    const upPort = await new Promise<number>((r) => upstream!.listen(0, '127.0.0.1', () => r((upstream!.address() as net.AddressInfo).port)));
    ingress = await startIngress({
      nodeId: 'events-delivery',
      controlPlane: [`127.0.0.1:${cp.grpcPort}`],
      nodeToken,
      // A 50 ms Redis timeout on a loaded box (a full suite run beside another) let one request of
      // five be decided by the local fallback, which admits on its own: 4 × 200 instead of 3. This
      // test is about the events, not the limiter's latency.
      env: { TLS_CERT_FILE: tlsFiles.certFile, TLS_KEY_FILE: tlsFiles.keyFile, REDIS_URL: redisServer.url, RATE_LIMIT_SERVER_ID: rlServer, EVENTS_PREFIX: prefix, RATE_LIMIT_TIMEOUT_MS: '2000' },
    });
    agent = startAgentProcess(['http', String(upPort), '--label', 'app=events-delivery', '--authtoken', cred.token, '--server', `localhost:${ingress.agent}`, '--ca', tlsFiles.caFile]);
    await agent.waitForOutput('online');
    await nodeAtHead(ingress);
    const node = ingress;
    await waitFor('the route serves', async () => (await request('/rl/ready', { 'x-user': 'probe' }, node.http)) === 200, 20_000);

    const statuses: number[] = [];
    for (let i = 0; i < 5; i++) statuses.push(await request(`/rl/item-${i}`, { 'x-user': 'alice' }, node.http));
    expect(statuses).toEqual([200, 200, 200, 429, 429]);

    const items = () => received(d).filter((e) => String(e.object?.http?.request?.url?.path).startsWith('/rl/item-'));
    await waitFor('5 traffic events at Datadog', () => items().length >= 5, 20_000);
    // Every event the node emitted arrives, once (probes included).
    const emitted = async () => metricValue(await (await fetch(`${node.internalUrl}/metrics`)).text(), 'warren_ingress_events_emitted_total');
    await waitFor('every emitted traffic event at Datadog', async () => received(d).length >= (await emitted()), 20_000);
    await drained();
    const got = received(d);
    expect(got.length).toBe(await emitted());
    expect(repeated(got.map((e) => e.event_id))).toEqual([]);
    const rl = items().sort((x, y) => String(x.object.http.request.url.path).localeCompare(y.object.http.request.url.path));
    expect(rl.map((e) => e.object.http.request.url.path)).toEqual([0, 1, 2, 3, 4].map((i) => `/rl/item-${i}`));
    expect(rl.map((e) => e.object.http.response.status_code)).toEqual([200, 200, 200, 429, 429]);
    expect(rl.map((e) => e.object.warren.rate_limit.limited)).toEqual([false, false, false, true, true]);
    for (const e of rl) {
      expect(e).toMatchObject({ event_type: 'http_request_complete.v0', account_id: t.id, principal: null });
      expect(e.object.warren).toMatchObject({ edge_id: edgeId, route_id: routeId, rate_limit: { bucket_key: '["alice"]' } });
    }
    await agent.stop({ timeoutMs: 10_000 });
    expect((await ingress.stop({ timeoutMs: 15_000 })).code).toBe(0);
    agent = ingress = undefined;
  }, INGRESS_START_MS + AGENT_ONLINE_MS + 2 * WORK_MS); // a node, an agent, and waits of up to 2 min

  it('a receiver down for a while: retries, then every event arrives once it is back; none lost, none twice', async () => {
    const a = acct.down!;
    const d = await destination(a, 'datadog', 'down');
    await subscribe(a, IPP_TYPES, [d]);
    await dd.stop();
    try {
      await createPolicies(a, 5, 'down');
      // Several attempts fail (connection refused) on the retry schedule before the receiver returns.
      await waitFor('3 failed attempts', () => logLines(d, 'delivery attempt failed') >= 3, 20_000);
      await createPolicies(a, 3, 'down-more');
      expect(received(d)).toEqual([]);
    } finally {
      await dd.start();
    }
    const rows = await expected(a);
    expect(rows).toHaveLength(8);
    await waitReceived(d, rows.map((r) => r.event_id));
    await drained();
    expectExactly(d, rows);
    expect(await deadLetters(d)).toEqual([]);
  }, 60_000);

  it('dead letters: a record the receiver rejects (400) is dead-lettered with a reason, listed by events-admin, and can be replayed', async () => {
    const a = acct.dead!;
    const d = await destination(a, 'datadog', 'dead');
    await subscribe(a, IPP_TYPES, [d]);
    dd.fail({ kind: 'status', status: 400 });
    await createPolicies(a, 1, 'poison');
    const [poison] = await expected(a);
    const [dl] = await waitFor('a dead letter', async () => {
      const x = await deadLetters(d);
      return x.length ? x : null;
    });
    expect(dl).toMatchObject({ destination_id: d.id, account_id: a.id, event_ids: [poison!.event_id] });
    expect(dl!.reason).toMatch(/^record_failed: .*HTTP 400/);
    // The destination keeps flowing: the next event is delivered.
    await createPolicies(a, 1, 'after');
    const rows = await expected(a);
    await waitReceived(d, [rows[1]!.event_id]);
    await drained();
    expect(receivedIds(d)).toEqual([rows[1]!.event_id]);

    const env = { DATABASE_URL: db.url, REDIS_URL: redisServer.url, EVENTS_PREFIX: prefix };
    const list = await runEventsAdmin(['list', '--destination', d.id], env);
    expect(list.code, list.stderr).toBe(0);
    const listed = list.stdout.trim().split('\n').map((l) => JSON.parse(l));
    expect(listed).toHaveLength(1);
    expect(listed[0]).toMatchObject({ id: dl!.id, destination_id: d.id, account_id: a.id, events: 1, event_ids: [poison!.event_id], reason: dl!.reason });
    const replay = await runEventsAdmin(['replay', String(dl!.id)], env);
    expect(replay.code, replay.stderr).toBe(0);
    expect(replay.stdout).toMatch(/replayed 1 events from 1 dead letters/);
    await waitReceived(d, [poison!.event_id]);
    await drained();
    expect(receivedIds(d)).toEqual([rows[1]!.event_id, poison!.event_id]);
    expect(await deadLetters(d)).toEqual([]);
  }, 2 * CLI_RUN_MS + 2 * WORK_MS); // two events-admin runs, and waits of up to 90 s

  it('an auth failure pauses the destination (backlog kept, no dead letters); a PATCH with the right key resumes it and everything arrives in order', async () => {
    const a = acct.paused!;
    const d = await destination(a, 'datadog', 'paused', { apiKey: DD_WRONG_KEY });
    await subscribe(a, [...IPP_TYPES, 'event_destination_updated.v0'], [d]);
    const forbidden = () => dd.requests.filter((r) => r.status === 403).length;
    const before = forbidden();
    await createPolicies(a, 3, 'paused');
    const health = await waitFor('the destination paused', async () => {
      const { rows } = await pool.query('SELECT paused, reason FROM event_destination_health WHERE destination_id = $1', [d.id]);
      return rows[0]?.paused ? rows[0] : null;
    });
    expect(health.reason).toMatch(/403/);
    expect(forbidden() - before).toBe(1); // paused after the first refusal, no retries burnt
    await createPolicies(a, 2, 'while-paused');
    await waitFor('the backlog buffered', async () => (await redis.llen(bufferKey(prefix, d.id))) === 5);
    expect(received(d)).toEqual([]);
    expect(await deadLetters(d)).toEqual([]);

    await ok(a, 'PATCH', `/event_destinations/${d.id}`, { target: targetFor('datadog', 'paused', { apiKey: DD_KEY }) }, 200);
    const rows = await expected(a, [...IPP_TYPES, 'event_destination_updated.v0']);
    expect(rows.map((r) => r.event_type)).toEqual([...Array(5).fill('ip_policy_created.v0'), 'event_destination_updated.v0']);
    await waitReceived(d, rows.map((r) => r.event_id));
    await drained();
    expectExactly(d, rows);
    // The update's event carries the destination with its secret blanked.
    expect(received(d).at(-1)!.object.target.datadog).toMatchObject({ api_key: '', ddtags: 'dest:paused' });
    const { rows: h } = await pool.query('SELECT paused FROM event_destination_health WHERE destination_id = $1', [d.id]);
    expect(h[0]?.paused).toBe(false);
    expect(await deadLetters(d)).toEqual([]);
  }, 60_000);

  it('kill -9 of the worker mid-call: a new worker takes over; every event arrives, duplicates only from the call in flight', async () => {
    const a = acct.kill!;
    const d = await destination(a, 'firehose', 'kill', { auth: 'creds' });
    await subscribe(a, IPP_TYPES, [d]);
    const slow = () => aws.requests.find((r) => r.op === 'PutRecordBatch' && r.fault === 'slow');
    aws.fail('PutRecordBatch', { kind: 'slow', ms: 4000 });
    await createPolicies(a, 30, 'kill', 6);
    await waitFor('the slow call in flight', () => slow());
    // Kill only once the relay has handed every change to Redis (a relay batch cut short would be resent too).
    await waitFor('the relay caught up', relayCaughtUp);
    expect(slow()!.status, 'the call is still in flight').toBe(0);
    const killed = worker;
    expect((await killed.stop('SIGKILL')).signal).toBe('SIGKILL');
    worker = await startWorker();

    const rows = await expected(a);
    expect(rows).toHaveLength(30);
    await waitReceived(d, rows.map((r) => r.event_id), 30_000);
    await drained(30_000);
    const got = receivedIds(d);
    expect(new Set(got)).toEqual(new Set(rows.map((r) => r.event_id)));
    // The call in flight landed (the receiver answered a dead client) and was sent again: its
    // records, the first ones claimed, are the only duplicates.
    const inFlight = slow()!.records!;
    expect(inFlight).toBeGreaterThanOrEqual(1);
    const dups = repeated(got);
    expect(dups.length).toBeLessThanOrEqual(inFlight);
    const order = rows.map((r) => r.event_id);
    for (const x of dups) expect(order.indexOf(x)).toBeLessThan(inFlight);
    for (const x of got) expect(got.filter((y) => y === x).length).toBeLessThanOrEqual(2);
    expect(worker.logs().some((l) => /flush job stalled/.test(String(l.msg))), 'the new worker took the job over as stalled').toBe(true);
    received(d).forEach((e) => checkAudit(e, rows.find((r) => r.event_id === e.event_id)!, a));
  }, WORKER_START_MS + 2 * WORK_MS); // a worker, and waits of up to 80 s

  it('SIGTERM mid-call: the worker finishes the call and exits 0 within its shutdown timeout; the next one delivers the rest, no duplicates', async () => {
    const a = acct.term!;
    const d = await destination(a, 'azure_logs_ingestion', 'term');
    await subscribe(a, IPP_TYPES, [d]);
    const slow = () => az.requests.find((r) => r.kind === 'ingest' && r.fault === 'slow');
    az.fail('ingest', { kind: 'slow', ms: 2000 });
    await createPolicies(a, 20, 'term', 5);
    await waitFor('the slow call in flight', () => slow());
    expect(slow()!.status).toBe(0);
    const t0 = Date.now();
    const exit = await worker.stop('SIGTERM', 15_000);
    const took = Date.now() - t0;
    expect(exit, worker.output().slice(-3000)).toEqual({ code: 0, signal: null });
    expect(took).toBeLessThan(8_000 + 2_000);
    expect(slow()!.status).toBe(204); // the call in flight was answered before the exit
    expect(received(d).length).toBeGreaterThanOrEqual(slow()!.rows!);
    expect(worker.output()).toMatch(/"msg":"stopped"/);
    worker = await startWorker();
    const rows = await expected(a);
    expect(rows).toHaveLength(20);
    await waitReceived(d, rows.map((r) => r.event_id));
    await drained();
    expectExactly(d, rows);
  }, WORKER_START_MS + WORK_MS);

  it('Redis restart: changes made while Redis is down are relayed and delivered after it returns; nothing lost', async () => {
    const a = acct.restart!;
    const d = await destination(a, 'kinesis', 'restart', { auth: 'creds' });
    await subscribe(a, IPP_TYPES, [d]);
    const slow = () => aws.requests.find((r) => r.op === 'PutRecords' && r.fault === 'slow' && r.accessKeyId === AWS_KEY);
    aws.fail('PutRecords', { kind: 'slow', ms: 1500 });
    await createPolicies(a, 10, 'restart-before', 5);
    await waitFor('the slow call in flight', () => slow());
    await waitFor('the relay caught up', relayCaughtUp);
    const relayFailures = () => workers.flatMap((w) => w.logs()).filter((l) => /event relay: attempt failed/.test(String(l.msg))).length;
    const failuresBefore = relayFailures();
    await redisServer.stop(); // SIGTERM: Redis writes its append-only file
    let during: string[];
    try {
      // The control plane does not need Redis: the changes commit with their outbox rows.
      during = await createPolicies(a, 5, 'restart-during', 5);
      await waitFor('the relay to fail against the stopped Redis', () => relayFailures() > failuresBefore, 10_000);
      // The receiver answers the call in flight while Redis is down: the worker records that outcome after the restart.
      await waitFor('the slow call answered', () => slow()!.status !== 0, 10_000);
    } finally {
      await redisServer.start();
    }
    expect(during).toHaveLength(5);
    await createPolicies(a, 5, 'restart-after', 5);
    const rows = await expected(a);
    expect(rows).toHaveLength(20);
    await waitReceived(d, rows.map((r) => r.event_id), 30_000);
    await drained(30_000);
    const got = receivedIds(d);
    expect(new Set(got)).toEqual(new Set(rows.map((r) => r.event_id)));
    const inFlight = slow()!.records ?? 0;
    const order = rows.map((r) => r.event_id);
    for (const x of repeated(got)) expect(order.indexOf(x)).toBeLessThan(inFlight);
    expect(worker.child.exitCode).toBeNull(); // the same worker rode the restart out
  }, 60_000);

  it('afterwards: every receiver got only its own account’s events, no dead letters are left, queues are empty, and no secret is anywhere', async () => {
    await drained();
    for (const d of dests) for (const e of received(d)) expect(e.account_id, `${d.kind} ${d.label}`).toBe(d.account.id);
    expect(await deadLetters()).toEqual([]);
    // Every AWS call was signed correctly (invariant 4); the fakes enforce the limits.
    expect(aws.requests.filter((r) => /Signature|Unrecognized|IncompleteSignature|MissingAuthentication|ExpiredToken/.test(r.error ?? ''))).toEqual([]);
    expect(dd.requests.filter((r) => r.status === 413 || (r.status === 400 && r.fault === undefined))).toEqual([]);
    expect(az.requests.filter((r) => r.status === 401 || r.status === 413)).toEqual([]);
    const contents = await redisContents(redis, prefix);
    expectNoSecrets(contents.text, 'Redis');
    for (const w of workers) expectNoSecrets(w.output(), `worker ${w.pid} output`);
    expectNoSecrets(cp.output(), 'control plane output');
  }, 30_000);
});
