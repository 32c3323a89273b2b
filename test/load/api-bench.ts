/**
 * Management API load bench (not part of `npm test`):
 *
 *   npx tsx test/load/api-bench.ts          (or: npm run bench:api)
 *
 * Starts the real control-plane process (rate limit off, LOG_LEVEL=warn) on a fresh database
 * seeded with 100,000 reserved addresses for one account (plus 10,000 for a second one), then
 * drives it with autocannon (64 connections, 3 s warm-up + 10 s measured per case):
 * GET by id (random ids), GET list first page, GET list deep page (before_id near the end),
 * POST create; an open-loop GET by id at half the measured max rate; and the cost of one page
 * at the start, middle and end of the 100k rows (and of the 10k account) to show keyset
 * pagination stays flat. Writes test/load/results/api-bench.json and prints a table; drops the
 * database at the end.
 *
 * Env: TEST_DATABASE_URL (admin URL, default postgres://postgres@127.0.0.1:5432/postgres),
 * BENCH_ROWS (100000), BENCH_SMALL_ROWS (10000), BENCH_DURATION (10), BENCH_WARMUP (3),
 * BENCH_CONNECTIONS (64).
 */
import http from 'node:http';
import { mkdirSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { encodeKsuid } from '@warren/shared';
import autocannon, { type Options, type Result } from 'autocannon';
import { startControlPlane, type ControlPlaneProcess } from '../support/processes.js';
import { openLoop } from './open-loop.js';
import { ADMIN_URL, cpuMicros, fmt, log, machine as env, withDatabase } from './support.js';
import { createDb, createPool } from '../../services/control-plane/src/db/pool.js';
import { migrate } from '../../services/control-plane/src/db/migrate.js';
import { createAccountWithKey } from '../../services/control-plane/src/modules/accounts/accounts.service.js';

const ROWS = Number(process.env.BENCH_ROWS ?? 100_000);
const SMALL_ROWS = Number(process.env.BENCH_SMALL_ROWS ?? 10_000);
const DURATION = Number(process.env.BENCH_DURATION ?? 10);
const WARMUP = Number(process.env.BENCH_WARMUP ?? 3);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 64);
const RESULTS = fileURLToPath(new URL('./results/api-bench.json', import.meta.url));
const TCP_HOST = 'tcp.bench.localhost';



// ---------------------------------------------------------------------------------------------
// seeding

/**
 * `n` reserved-address ids (`ra_` + KSUID) for timestamps one second apart ending `endSecondsAgo`
 * before now, ascending: they sort by time exactly like server-made ids.
 */
function makeIds(n: number, endSecondsAgo: number): { ids: string[]; seconds: number[] } {
  const nowS = Math.floor(Date.now() / 1000);
  const ids: string[] = new Array(n);
  const seconds: number[] = new Array(n);
  for (let i = 0; i < n; i++) {
    const s = nowS - endSecondsAgo - (n - i);
    seconds[i] = s;
    ids[i] = `ra_${encodeKsuid(s * 1000, randomBytes(16))}`;
  }
  return { ids, seconds };
}

/**
 * Bulk INSERT … SELECT over generate_series, ids passed as an array. `addr` must be unique across
 * all accounts and the server only hands out ports 10000–59999 per TCP host, so seeded rows get
 * their own hosts (`seed<k>.bench.localhost`) and leave the server's host free for the POST case.
 */
async function seed(pool: pg.Pool, accountId: string, tag: string, ids: string[], seconds: number[], addrOffset: number): Promise<void> {
  const BATCH = 20_000;
  for (let start = 0; start < ids.length; start += BATCH) {
    const chunkIds = ids.slice(start, start + BATCH);
    const chunkSec = seconds.slice(start, start + BATCH);
    await pool.query(
      `INSERT INTO reserved_addrs (id, account_id, description, metadata, region, addr, created_at)
       SELECT ($3::text[])[g], $1, $5 || ' ' || ($4 + g), '', 'us',
              'seed' || (($6 + $4 + g) / 50000) || '.bench.localhost:' || (10000 + ($6 + $4 + g) % 50000),
              to_timestamp(($7::float8[])[g])
         FROM generate_series(1, $2::int) AS g`,
      [accountId, chunkIds.length, chunkIds, start, tag, addrOffset, chunkSec],
    );
  }
}

// ---------------------------------------------------------------------------------------------
// measuring



interface CaseResult {
  name: string;
  connections: number;
  duration_s: number;
  target_rate?: number;
  req_per_s: number;
  requests: number;
  latency_ms: { p50: number; p90: number; p99: number; max: number; mean: number };
  non2xx: number;
  errors: number;
  timeouts: number;
  status_codes: Record<string, number>;
  server_cpu_us_per_req?: number;
}

function summarize(name: string, r: Result, cpuUs: number | undefined, extra: Partial<CaseResult> = {}): CaseResult {
  const codes: Record<string, number> = {};
  for (const [k, v] of Object.entries(r.statusCodeStats ?? {})) codes[k] = Number(v.count);
  return {
    name,
    connections: extra.connections ?? CONNECTIONS,
    duration_s: r.duration,
    ...extra,
    req_per_s: Math.round(r.requests.total / r.duration),
    requests: r.requests.total,
    latency_ms: { p50: r.latency.p50, p90: r.latency.p90, p99: r.latency.p99, max: r.latency.max, mean: Math.round(r.latency.average * 100) / 100 },
    non2xx: r.non2xx,
    errors: r.errors,
    timeouts: r.timeouts,
    status_codes: codes,
    server_cpu_us_per_req: cpuUs === undefined || r.requests.total === 0 ? undefined : Math.round(cpuUs / r.requests.total),
  };
}

async function measure(cp: ControlPlaneProcess, name: string, opts: Omit<Options, 'url'>, warmup = WARMUP, extra: Partial<CaseResult> = {}): Promise<CaseResult> {
  const url = cp.baseUrl;
  if (warmup > 0) await autocannon({ url, connections: CONNECTIONS, ...opts, duration: warmup, amount: undefined });
  const before = cpuMicros(cp.pid);
  const r = await autocannon({ url, connections: CONNECTIONS, duration: DURATION, ...opts });
  const after = cpuMicros(cp.pid);
  const out = summarize(name, r, before !== undefined && after !== undefined ? after - before : undefined, extra);
  log(`${name}: ${out.req_per_s} req/s, p50 ${out.latency_ms.p50} ms, p99 ${out.latency_ms.p99} ms, non2xx ${out.non2xx}, errors ${out.errors}`);
  return out;
}

/** Median of EXPLAIN ANALYZE execution times (ms) of the list query the server runs for one page. */
async function explainPage(pool: pg.Pool, accountId: string, beforeId: string | undefined): Promise<{ exec_ms_median: number; plan: string }> {
  const sql = `EXPLAIN (ANALYZE, FORMAT JSON) SELECT id, account_id, description, metadata, region, addr, created_at FROM reserved_addrs
    WHERE account_id = $1${beforeId ? ' AND id < $3' : ''} ORDER BY id DESC LIMIT $2`;
  const times: number[] = [];
  let plan = '';
  for (let i = 0; i < 25; i++) {
    const { rows } = await pool.query(sql, beforeId ? [accountId, 101, beforeId] : [accountId, 101]);
    type Node = { 'Node Type': string; 'Index Name'?: string; 'Scan Direction'?: string; 'Rows Removed by Filter'?: number; Plans?: Node[] };
    const top = (rows[0] as { 'QUERY PLAN': { 'Execution Time': number; Plan: Node }[] })['QUERY PLAN'][0]!;
    times.push(top['Execution Time']);
    const child = top.Plan.Plans?.[0];
    const removed = child?.['Rows Removed by Filter'];
    plan = `${top.Plan['Node Type']} → ${child?.['Node Type'] ?? '?'}${child?.['Scan Direction'] ? ` ${child['Scan Direction']}` : ''}${child?.['Index Name'] ? ` on ${child['Index Name']}` : ''}${removed ? `, ${removed} rows removed by filter` : ''}`;
  }
  times.sort((a, b) => a - b);
  return { exec_ms_median: Math.round(times[Math.floor(times.length / 2)]! * 1000) / 1000, plan };
}

/**
 * `n` sequential GETs on one keep-alive connection, timed with hrtime (autocannon reports whole
 * milliseconds, too coarse for a single-client page).
 */
async function sequentialTimes(baseUrl: string, path: string, headers: Record<string, string>, n: number): Promise<{ p50: number; p99: number; mean: number; rps: number }> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  const url = new URL(baseUrl);
  const once = () =>
    new Promise<number>((resolve, reject) => {
      const t0 = process.hrtime.bigint();
      const req = http.get({ host: url.hostname, port: url.port, path, headers, agent }, (res) => {
        res.on('data', () => {});
        res.on('end', () => (res.statusCode === 200 ? resolve(Number(process.hrtime.bigint() - t0) / 1e6) : reject(new Error(`${path}: ${res.statusCode}`))));
      });
      req.on('error', reject);
    });
  try {
    for (let i = 0; i < Math.min(100, n); i++) await once(); // warm-up
    const times: number[] = [];
    const start = process.hrtime.bigint();
    for (let i = 0; i < n; i++) times.push(await once());
    const total = Number(process.hrtime.bigint() - start) / 1e9;
    times.sort((a, b) => a - b);
    const q = (p: number) => Math.round(times[Math.min(times.length - 1, Math.floor(p * times.length))]! * 1000) / 1000;
    return { p50: q(0.5), p99: q(0.99), mean: Math.round((times.reduce((a, b) => a + b, 0) / n) * 1000) / 1000, rps: Math.round(n / total) };
  } finally {
    agent.destroy();
  }
}

// ---------------------------------------------------------------------------------------------



async function main(): Promise<void> {
  const dbName = `warren_bench_${Date.now().toString(36)}_${randomBytes(3).toString('hex')}`;
  const admin = new pg.Client({ connectionString: ADMIN_URL });
  await admin.connect();
  let pool: pg.Pool | undefined;
  let cp: ControlPlaneProcess | undefined;
  let cleaned = false;
  const cleanup = async () => {
    if (cleaned) return;
    cleaned = true;
    await cp?.stop().catch((e: unknown) => log('stop failed:', (e as Error).message));
    await pool?.end().catch(() => {});
    await admin.query(`DROP DATABASE IF EXISTS ${dbName} WITH (FORCE)`).catch((e: unknown) => log('drop failed:', (e as Error).message));
    await admin.end().catch(() => {});
    log(`dropped ${dbName}`);
  };
  process.once('SIGINT', () => {
    log('interrupted; cleaning up');
    void cleanup().finally(() => process.exit(130));
  });

  try {
    const pgVersion = (await admin.query<{ server_version: string }>('SHOW server_version')).rows[0]!.server_version;
    await admin.query(`CREATE DATABASE ${dbName}`);
    const url = withDatabase(ADMIN_URL, dbName);
    pool = createPool(url, 4);
    await migrate(pool);
    const big = await createAccountWithKey(createDb(pool), 'bench');
    const small = await createAccountWithKey(createDb(pool), 'bench-small');

    let t = Date.now();
    const bigIds = makeIds(ROWS, 0);
    const smallIds = makeIds(SMALL_ROWS, 0);
    await seed(pool, big.accountId, 'seed', bigIds.ids, bigIds.seconds, 0);
    await seed(pool, small.accountId, 'small', smallIds.ids, smallIds.seconds, ROWS);
    await pool.query('ANALYZE reserved_addrs');
    const seedMs = Date.now() - t;
    const tableSize = (await pool.query<{ n: number; size: string }>(`SELECT count(*)::int AS n, pg_size_pretty(pg_total_relation_size('reserved_addrs')) AS size FROM reserved_addrs`)).rows[0]!;
    log(`seeded ${tableSize.n} rows (${tableSize.size}) in ${seedMs} ms`);

    t = Date.now();
    cp = await startControlPlane({ databaseUrl: url, env: { API_RATE_LIMIT_PER_MINUTE: '0', ACCOUNT_QUOTAS: 'off', LOG_LEVEL: 'warn', TCP_ADDR_HOST: TCP_HOST } });
    log(`control plane pid ${cp.pid} on ${cp.baseUrl}, ready in ${Date.now() - t} ms`);

    const headers = { Authorization: `Bearer ${big.token}`, 'Service-Version': '2' };
    const smallHeaders = { Authorization: `Bearer ${small.token}`, 'Service-Version': '2' };
    const asc = bigIds.ids; // oldest first
    const desc = [...asc].reverse(); // list order
    const deepCursor = asc[300]!; // near the end of the list: 3 pages before the last one

    // sanity: the seeded rows are what the API serves, in the right order
    const first = (await (await fetch(`${cp.baseUrl}/reserved_addrs?limit=100`, { headers })).json()) as { reserved_addrs: { id: string }[]; next_page_uri: string | null };
    if (first.reserved_addrs[0]?.id !== desc[0] || first.reserved_addrs.length !== 100 || !first.next_page_uri) throw new Error(`unexpected first page: ${JSON.stringify(first).slice(0, 300)}`);
    const deep = (await (await fetch(`${cp.baseUrl}/reserved_addrs?limit=100&before_id=${deepCursor}`, { headers })).json()) as { reserved_addrs: { id: string }[] };
    if (deep.reserved_addrs[0]?.id !== asc[299] || deep.reserved_addrs.length !== 100) throw new Error('unexpected deep page');
    const one = await fetch(`${cp.baseUrl}/reserved_addrs/${asc[12345 % ROWS]}`, { headers });
    if (one.status !== 200) throw new Error(`GET by id: ${one.status}`);

    const cases: CaseResult[] = [];
    const randomId = (req: { path?: string }) => ({ ...req, path: `/reserved_addrs/${asc[Math.floor(Math.random() * ROWS)]}` });

    cases.push(await measure(cp, 'GET /reserved_addrs/{id} (random)', { headers, requests: [{ method: 'GET', setupRequest: randomId }] }));
    const maxGet = cases[0]!.req_per_s;
    cases.push(await measure(cp, 'GET /reserved_addrs?limit=100 (first page)', { headers, requests: [{ method: 'GET', path: '/reserved_addrs?limit=100' }] }));
    cases.push(await measure(cp, 'GET /reserved_addrs?limit=100&before_id=… (deep page)', { headers, requests: [{ method: 'GET', path: `/reserved_addrs?limit=100&before_id=${deepCursor}` }] }));

    // Open loop at half the measured max: latency without the closed loop's queueing. autocannon's
    // overallRate fires each connection's share in bursts, so its figure is kept for reference and
    // the even-paced generator (open-loop.ts, latency from each request's scheduled time) is the
    // one to read.
    const rate = Math.max(1, Math.round(maxGet / 2));
    cases.push(
      await measure(cp, 'GET /reserved_addrs/{id} open loop @ 50% max (autocannon, bursty)', { headers, overallRate: rate, requests: [{ method: 'GET', setupRequest: randomId }] }, WARMUP, {
        target_rate: rate,
      }),
    );
    const evenPath = () => `/reserved_addrs/${asc[Math.floor(Math.random() * ROWS)]}`;
    // Even pacing at half the measured max and at 1,500/s (half of the 3,000 GET/s goal).
    for (const evenRate of [rate, 1500]) {
      await openLoop({ url: cp.baseUrl, headers, rate: evenRate, durationS: WARMUP, path: evenPath });
      const cpuBefore = cpuMicros(cp.pid);
      const even = await openLoop({ url: cp.baseUrl, headers, rate: evenRate, durationS: DURATION, path: evenPath });
      const cpuAfter = cpuMicros(cp.pid);
      log(`GET by id, even open loop @ ${evenRate}/s: p50 ${even.p50} ms, p90 ${even.p90} ms, p99 ${even.p99} ms, max ${even.max} ms, non2xx ${even.non2xx}, errors ${even.errors}`);
      cases.push({
        name: `GET /reserved_addrs/{id} open loop @ ${evenRate === rate ? '50% max' : '1,500/s'} (even pacing)`,
        req_per_s: Math.round(even.ok / DURATION),
        latency_ms: { p50: even.p50, p90: even.p90, p99: even.p99, max: even.max } as CaseResult['latency_ms'],
        non2xx: even.non2xx,
        errors: even.errors,
        ...(cpuBefore !== undefined && cpuAfter !== undefined ? { server_cpu_us_per_req: Math.round((cpuAfter - cpuBefore) / Math.max(1, even.sent)) } : {}),
        target_rate: evenRate,
      } as CaseResult);
    }

    // List cost as the table grows: one client, sequential pages at positions of the 100k rows and
    // of the 10k account; plus Postgres's own execution time for the same query.
    const flat: { account_rows: number; position: string; before_id: string | null; p50_ms: number; p99_ms: number; mean_ms: number; req_per_s: number; db_exec_ms_median: number; plan: string }[] = [];
    const positions = (ids: string[]): [string, string | undefined][] => [
      ['start', undefined],
      ['middle', ids[Math.floor(ids.length / 2)]],
      ['end', ids[150]], // the last full page: ids[149..50]
    ];
    for (const [rows, ids, accountId, hdrs] of [
      [SMALL_ROWS, smallIds.ids, small.accountId, smallHeaders],
      [ROWS, asc, big.accountId, headers],
    ] as const) {
      for (const [position, cursor] of positions(ids)) {
        const path = `/reserved_addrs?limit=100${cursor ? `&before_id=${cursor}` : ''}`;
        const r = await sequentialTimes(cp.baseUrl, path, { ...hdrs }, 500);
        const ex = await explainPage(pool, accountId, cursor);
        flat.push({
          account_rows: rows,
          position,
          before_id: cursor ?? null,
          p50_ms: r.p50,
          p99_ms: r.p99,
          mean_ms: r.mean,
          req_per_s: r.rps,
          db_exec_ms_median: ex.exec_ms_median,
          plan: ex.plan,
        });
        log(`list page ${rows} rows @ ${position}: p50 ${r.p50} ms, p99 ${r.p99} ms, db ${ex.exec_ms_median} ms (${ex.plan})`);
      }
    }

    // Writes last: they add rows (and outbox rows) to the big account.
    cases.push(
      await measure(cp, 'POST /reserved_addrs', {
        headers: { ...headers, 'Content-Type': 'application/json' },
        requests: [{ method: 'POST', path: '/reserved_addrs', body: JSON.stringify({ description: 'bench', region: 'eu' }) }],
      }),
    );
    const after = (await pool.query<{ n: number }>(`SELECT count(*)::int AS n FROM reserved_addrs WHERE addr LIKE $1`, [`${TCP_HOST}:%`])).rows[0]!.n;

    const result = {
      when: new Date().toISOString(),
      command: 'npx tsx test/load/api-bench.ts',
      env: { ...env(), postgres: pgVersion, pg_pool_max: 20 },
      setup: {
        seeded_rows: { big_account: ROWS, small_account: SMALL_ROWS, table_total: tableSize.n, table_size: tableSize.size, seed_ms: seedMs },
        connections: CONNECTIONS,
        warmup_s: WARMUP,
        duration_s: DURATION,
        rate_limit: 'off (API_RATE_LIMIT_PER_MINUTE=0)',
        log_level: 'warn',
        note: 'load generator (autocannon) and server share the same cores',
        rows_created_by_post_case: after,
      },
      cases,
      list_cost_by_position: flat,
    };
    mkdirSync(fileURLToPath(new URL('./results/', import.meta.url)), { recursive: true });
    writeFileSync(RESULTS, `${JSON.stringify(result, null, 2)}\n`);

    // table
    const e = result.env as Record<string, unknown>;
    console.log(`\nWarren management API bench — nproc ${e.nproc}, ${e.cpu_model}, node ${e.node}, ${e.kernel}, Postgres ${pgVersion}, governor ${e.governor}`);
    console.log(`${ROWS.toLocaleString('en-US')} reserved_addrs for the bench account (+${SMALL_ROWS.toLocaleString('en-US')} for another), ${CONNECTIONS} connections, ${WARMUP} s warm-up + ${DURATION} s\n`);
    const rowsOut = cases.map((c) => ({
      case: c.name,
      'req/s': fmt(c.req_per_s),
      'p50 ms': fmt(c.latency_ms.p50, 1),
      'p99 ms': fmt(c.latency_ms.p99, 1),
      'max ms': fmt(c.latency_ms.max, 1),
      'cpu µs/req': fmt(c.server_cpu_us_per_req),
      non2xx: c.non2xx,
      errors: c.errors,
      ...(c.target_rate ? { note: `target ${c.target_rate}/s` } : { note: '' }),
    }));
    console.table(rowsOut);
    console.log('\nOne page of 100 (1 connection, 500 sequential requests) by position — keyset pagination should be flat:');
    console.table(
      flat.map((f) => ({
        'account rows': fmt(f.account_rows),
        position: f.position,
        'p50 ms': fmt(f.p50_ms, 2),
        'p99 ms': fmt(f.p99_ms, 2),
        'mean ms': fmt(f.mean_ms, 2),
        'req/s': fmt(f.req_per_s),
        'db exec ms (median)': fmt(f.db_exec_ms_median, 3),
        plan: f.plan,
      })),
    );
    console.log(`\nresults: ${RESULTS}`);
  } finally {
    await cleanup();
  }
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    console.error('[bench] failed:', err instanceof Error ? err.stack ?? err.message : err);
    process.exit(1);
  },
);
