/**
 * Proxy throughput bench (not part of `npm test`):
 *
 *   npx tsx test/load/proxy-bench.ts        (or: npm run bench:proxy)
 *
 * Needs `wrk` and `nginx` (Debian: apt-get install wrk nginx). Per ../shared/docs/performance.md §2:
 * the system under test on core 1, the load generator and the upstream on core 0 (taskset), keep-
 * alive everywhere, access logs off, one route, a 2-byte body from an nginx `return 200` upstream.
 *
 * Cases, interleaved for BENCH_ROUNDS (3) rounds of BENCH_WARMUP (5) s discarded + BENCH_DURATION
 * (15) s measured with `wrk -t1 -c64 --latency`:
 *   a    direct: wrk → upstream
 *   b0   nginx reverse proxy (1 worker, upstream keepalive 64) → upstream
 *   b    b0 with limit_req at a huge limit keyed by host + header (the check runs, nothing refused)
 *   h    the ceiling: a Node.js `http` hello world on core 1 (answers "ok" itself, proxies nothing);
 *        no Node.js server can proxy faster than this, so h/b bounds c/b on the box at hand
 *   n    the yardstick: a bare Node.js proxy (node:http + one undici Pool, test/load/bare-proxy.mjs)
 *        on core 1 → upstream; no routing, agent link, policy or metrics: what Node costs by itself
 *   c0   Warren: wrk → ingress A → our agent (muxado stream) → upstream
 *   c    c0 with the `rate-limit` action on (sliding_window, capacity 2e9, key = host + header,
 *        one hot key): one Redis script per request; Redis joins the system under test on core 1
 *   c10k c with 10,000 keys (a wrk Lua script sets a random header per request)
 *   blua b0 with the limiter's own script on the same Redis per request (nginx + Lua, performance.md
 *        §2's optional b′; needs Debian's libnginx-mod-http-lua and lua-resty-core, else skipped):
 *        what the Redis hop costs a C proxy
 *   c50  half the requests refused: the 429 path timed (performance.md §2's variant of c). Two
 *        rules: requests with `x-half: 1` (every other one, set by a wrk Lua script) meet a
 *        rate-limit of capacity 1 and get 429; the others meet case c's. One Redis script per
 *        request either way; an expression per request more than c
 *   hop  Warren: wrk → ingress B → internal hop → ingress A → agent → upstream
 * The agent is the customer's side of a tunnel; it runs on core 0 with the upstream. CPU µs per
 * request is read from /proc for the proxy processes (nginx worker; ingress; agent).
 * Then an open loop at 50 % and 80 % of c's max rate for c0 and c (the latency the check adds).
 * Reports medians (min–max), the ratios c0/a, c0/b0, b0/a, c/c0, c/b0, c/b, n/b, c0/n, c/n, and Redis script calls per
 * request (INFO commandstats). BENCH_CASES=c0,c runs only those; BENCH_POLICY replaces the rate-limit
 * policy of case c (e.g. one whose expression never holds, to time the pipeline alone);
 * BENCH_OPEN_LOOP=1 runs the open loop with BENCH_CASES too; BENCH_OPEN_LOOP_PAIRED=1 adds a paired open
 * loop (c0 and c requests alternating in one run, so both see the same stalls); BENCH_REDIS=unix|tcp|system picks the
 * limiter's Redis (see REDIS_MODE; default unix); BENCH_INGRESS_ENV (JSON) adds ingress variables, e.g. '{"RATE_LIMIT_TRANSPORT":"ioredis"}'.
 * BENCH_SEQUENTIAL=1 adds the idle latency of c0 and c (one connection, one request at a time) and the
 * round trip of a PING to the limiter's Redis from core 1.
 * BENCH_HOLD=1 sets everything up, prints the pids and ports, and waits for SIGINT (for profiling).
 * BENCH_LOADGEN=autocannon drives the closed loop with autocannon instead of wrk (see LOADGEN).
 * Writes test/load/results/proxy.json.
 */
import http from 'node:http';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { createHash, randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { freePort, startControlPlane, type ControlPlaneProcess } from '../support/processes.js';
import { cleanupTempDirs, startAgentProcess, startIngress, tempDir, waitFor, type AgentProcess, type IngressProcess } from '../support/cluster.js';
import { ensureLocalTls } from '../../services/ingress/src/tls.js';
import { SLIDING_WINDOW_LUA } from '../../services/ingress/src/ratelimit/script.js';
import { benchDatabase, cpuMicros, cpuSplit, fmt, log, machine } from './support.js';
import { openLoop, openLoopPaired, type OpenLoopResult } from './open-loop.js';

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const DURATION = Number(process.env.BENCH_DURATION ?? 15);
const WARMUP = Number(process.env.BENCH_WARMUP ?? 5);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 64);
const HOST = 'proxy.bench.test';
/** The same route with the rate-limit action on (capacity 2e9: the check runs, nothing is refused). */
const RL_HOST = 'rl.bench.test';
const RL_POLICY = JSON.stringify({
  inbound: [{ actions: [{ type: 'rate-limit', config: { name: 'bench', algorithm: 'sliding_window', capacity: 2_000_000_000, rate: '60s', bucket_key: ['req.host', "req.headers['x-client']"] } }] }],
});

/** Case c50: every other request refused by the first rule's rate limit, the rest passed by the second's. */
const RL50_HOST = 'rl50.bench.test';
const RL50_POLICY = JSON.stringify({
  inbound: [
    { expressions: ["'x-half' in req.headers && req.headers['x-half'][0] == '1'"], actions: [{ type: 'rate-limit', config: { name: 'refuse', algorithm: 'sliding_window', capacity: 1, rate: '60s', bucket_key: ['req.host'] } }] },
    { actions: [{ type: 'rate-limit', config: { name: 'bench', algorithm: 'sliding_window', capacity: 2_000_000_000, rate: '60s', bucket_key: ['req.host', "req.headers['x-client']"] } }] },
  ],
});

/**
 * The Redis of the rate-limit case (BENCH_REDIS): `unix` (default) a redis-server of its own on
 * core 1 reached over a Unix socket, the deployment the README recommends for the limiter (one
 * Redis per ingress server, beside it); `tcp` the same server over loopback TCP; `system` the
 * machine's Redis on 6379 (shared with anything else running, e.g. tests).
 */
const REDIS_MODE = (process.env.BENCH_REDIS ?? 'unix') as 'unix' | 'tcp' | 'system';
let redisCliArgs = ['-p', '6379'];

/** Redis `INFO commandstats` calls of EVAL + EVALSHA. */
function redisScriptCalls(): number {
  const out = execFileSync('redis-cli', [...redisCliArgs, 'INFO', 'commandstats'], { encoding: 'utf8' });
  let n = 0;
  for (const m of out.matchAll(/cmdstat_(evalsha|eval):calls=(\d+)/g)) n += Number(m[2]);
  return n;
}
/**
 * Round trips of PING to the bench's Redis from a client pinned to core 1 (the ingress's core),
 * one at a time, 1 ms apart: what one call to the limiter's Redis costs in latency on this box.
 */
function redisPingMicros(cliArgs: string[]): { p50: number; p99: number } {
  const target = cliArgs[0] === '-s' ? { path: cliArgs[1] } : { host: '127.0.0.1', port: Number(cliArgs[1]) };
  const script = `const net=require('net');const s=net.connect(${JSON.stringify(target)});s.setNoDelay?.(true);const lat=[];let t0=0,n=0;
s.on('connect',()=>{t0=process.hrtime.bigint();s.write('PING\\r\\n')});
s.on('data',()=>{lat.push(Number(process.hrtime.bigint()-t0)/1e3);if(++n===1500){lat.splice(0,100);lat.sort((x,y)=>x-y);console.log(JSON.stringify({p50:lat[lat.length>>1],p99:lat[Math.floor(lat.length*0.99)]}));s.end();return}setTimeout(()=>{t0=process.hrtime.bigint();s.write('PING\\r\\n')},1)});`;
  return JSON.parse(execFileSync('taskset', ['-c', '1', process.execPath, '-e', script], { encoding: 'utf8' })) as { p50: number; p99: number };
}
const RESULTS = fileURLToPath(new URL('./results/proxy.json', import.meta.url));

interface WrkResult {
  rps: number;
  requests: number;
  p50: number;
  p90: number;
  p99: number;
  max: number;
  non2xx: number;
  socketErrors: number;
}

function ms(v: string): number {
  const m = /^([\d.]+)(us|ms|s)$/.exec(v.trim());
  if (!m) return NaN;
  const n = Number(m[1]);
  return m[2] === 'us' ? n / 1000 : m[2] === 's' ? n * 1000 : n;
}

/**
 * BENCH_LOADGEN=autocannon: the closed loop driven by autocannon (Node.js, on core 0 as wrk is)
 * instead of wrk, as in performance.md's own anchor for its floor ("with the load generator in
 * Node on the same cores"). A Node.js generator caps what it can send on one core, which lowers
 * the fast cases (b, h) much more than the slow ones: the ratios it gives are not comparable with
 * wrk's, and the figures of record use wrk (§2). Cases with a wrk Lua script keep wrk.
 */
const LOADGEN = process.env.BENCH_LOADGEN === 'autocannon' ? 'autocannon' : 'wrk';

function autocannon(port: number, seconds: number, host: string): WrkResult {
  const bin = fileURLToPath(new URL('../../node_modules/autocannon/autocannon.js', import.meta.url));
  const out = execFileSync('taskset', ['-c', '0', process.execPath, bin, '-j', '-c', String(CONNECTIONS), '-d', String(seconds), '-H', `Host: ${host}`, '-H', 'x-client: hot', `http://127.0.0.1:${port}/`], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
  const j = JSON.parse(out) as { duration: number; requests: { total: number }; latency: { p50: number; p90: number; p99: number; max: number }; non2xx: number; errors: number; timeouts: number };
  return { rps: j.requests.total / j.duration, requests: j.requests.total, p50: j.latency.p50, p90: j.latency.p90, p99: j.latency.p99, max: j.latency.max, non2xx: j.non2xx, socketErrors: j.errors + j.timeouts };
}

function wrk(port: number, seconds: number, host = HOST, script?: string): WrkResult {
  if (LOADGEN === 'autocannon' && !script) return autocannon(port, seconds, host);
  const args = ['-c', '0', 'wrk', '-t1', `-c${CONNECTIONS}`, `-d${seconds}s`, '--latency', '-H', `Host: ${host}`];
  if (script) args.push('-s', script);
  else args.push('-H', 'x-client: hot');
  const out = execFileSync('taskset', [...args, `http://127.0.0.1:${port}/`], { encoding: 'utf8' });
  const pct = (p: string) => ms(new RegExp(`^\\s+${p}%\\s+(\\S+)`, 'm').exec(out)?.[1] ?? '');
  if (!/[1-9]\d* requests in/.test(out)) log(`wrk against port ${port} served nothing:\n${out}`);
  const errs = /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/.exec(out);
  return {
    rps: Number(/Requests\/sec:\s+([\d.]+)/.exec(out)?.[1] ?? NaN),
    requests: Number(/(\d+) requests in/.exec(out)?.[1] ?? NaN),
    p50: pct('50'),
    p90: pct('90'),
    p99: pct('99'),
    max: ms(/Latency\s+\S+\s+\S+\s+(\S+)/.exec(out)?.[1] ?? ''),
    non2xx: Number(/Non-2xx or 3xx responses: (\d+)/.exec(out)?.[1] ?? 0),
    socketErrors: errs ? errs.slice(1).reduce((s, x) => s + Number(x), 0) : 0,
  };
}

/** Resident set size of a process, MiB (Linux /proc). */
function rssMiB(pid: number): number {
  try {
    const kb = Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1]);
    return Math.round(kb / 1024);
  } catch {
    return NaN;
  }
}

function pin(pid: number, core: number): void {
  execFileSync('taskset', ['-a', '-pc', String(core), String(pid)], { stdio: 'ignore' });
}

function startNginx(dir: string, name: string, core: number, server: string, upstream?: number, httpExtra = '', mainExtra = ''): Promise<{ child: ChildProcess; port: number; workerPid: () => number }> {
  return (async () => {
    const port = await freePort();
    const conf = path.join(dir, `${name}.conf`);
    writeFileSync(
      conf,
      `${mainExtra}
worker_processes 1;
daemon off;
user root;
pid ${dir}/${name}.pid;
error_log ${dir}/${name}.error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path ${dir}/${name}-body; proxy_temp_path ${dir}/${name}-proxy;
  fastcgi_temp_path ${dir}/${name}-fcgi; uwsgi_temp_path ${dir}/${name}-uwsgi; scgi_temp_path ${dir}/${name}-scgi;
  keepalive_requests 1000000;
  ${upstream ? `upstream up { server 127.0.0.1:${upstream}; keepalive 64; }` : ''}
  ${httpExtra}
  server {
    listen 127.0.0.1:${port};
    ${server}
  }
}
`,
    );
    const child = spawn('taskset', ['-c', String(core), 'nginx', '-c', conf, '-p', dir], { stdio: 'ignore' });
    await waitFor(`nginx ${name}`, () => new Promise<boolean>((resolve) => {
      http.get({ host: '127.0.0.1', port, path: '/', headers: { host: HOST } }, (res) => { res.resume(); resolve(true); }).on('error', () => resolve(false));
    }), 10_000);
    // taskset execs nginx, so the child's pid is the master's; the one worker is its child.
    const workerPid = () => Number(execFileSync('pgrep', ['-P', String(child.pid)], { encoding: 'utf8' }).trim().split('\n')[0]);
    return { child, port, workerPid };
  })();
}

const NGINX_LUA_MODULE = '/usr/share/nginx/modules/ngx_http_lua_module.so';
const NGINX_NDK_MODULE = '/usr/share/nginx/modules/ndk_http_module.so';

/**
 * Case blua: nginx (1 worker, core 1) that, before proxying as b0 does, runs the limiter's own
 * script (SLIDING_WINDOW_LUA, EVALSHA, capacity 2e9, counter mode as case c) on the bench's Redis
 * over a kept-alive cosocket, one call and one round trip per request, and answers 429 when it
 * refuses (never, at this capacity). What the Redis hop costs a C proxy: c/blua compares like
 * with like, where b's limit_req is a shared-memory counter with no hop at all. A request with
 * `x-nolimit: 1` skips the check (b0 on the same nginx): the paired open loop's other class.
 */
async function startNginxLua(dir: string, upstreamPort: number, redisUrl: string): Promise<{ child: ChildProcess; port: number; workerPid: () => number }> {
  const sha = createHash('sha1').update(SLIDING_WINDOW_LUA).digest('hex');
  const u = new URL(redisUrl);
  const connect = u.protocol === 'unix:' ? `sock:connect("unix:${u.pathname}")` : `sock:connect("${u.hostname}", ${Number(u.port || 6379)})`;
  execFileSync('redis-cli', [...redisCliArgs, 'SCRIPT', 'LOAD', SLIDING_WINDOW_LUA], { stdio: 'ignore' });
  const lua = `
    if ngx.var.http_x_nolimit == "1" then return end
    local sock = ngx.socket.tcp()
    sock:settimeout(50)
    local ok = ${connect}
    if not ok then return end
    local key = "warren:bench:blua:" .. (ngx.var.host or "") .. "|" .. (ngx.var.http_x_client or "")
    local args = { "EVALSHA", "${sha}", "1", key, "2000000000", "60000", "", "0" }
    local out = { "*", #args, "\\r\\n" }
    for _, a in ipairs(args) do out[#out + 1] = "$" .. #a .. "\\r\\n" .. a .. "\\r\\n" end
    sock:send(table.concat(out))
    local line = sock:receive()
    if line and line:sub(1, 1) == "*" then for _ = 1, 5 do sock:receive() end end
    sock:setkeepalive(60000, 64)
    if line ~= nil and line ~= ":1" then return ngx.exit(429) end`;
  return startNginx(dir, 'blua', 1, `location / { access_by_lua_block {${lua}
    } proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_set_header Host $host; }`, upstreamPort, '', `load_module ${NGINX_NDK_MODULE};\nload_module ${NGINX_LUA_MODULE};`);
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}

async function main(): Promise<void> {
  // The generator side (this process: the open-loop client) stays on core 0 with wrk.
  execFileSync('taskset', ['-pc', '0', String(process.pid)], { stdio: 'ignore' });
  const dir = tempDir('warren-proxybench-');
  const db = await benchDatabase('proxybench');
  const nodeToken = randomBytes(16).toString('hex');
  const children: ChildProcess[] = [];
  let cp: ControlPlaneProcess | undefined;
  let a: IngressProcess | undefined;
  let b: IngressProcess | undefined;
  let agent: AgentProcess | undefined;
  try {
    // The upstream: nginx `return 200` with a 2-byte body, core 0.
    const upstream = await startNginx(dir, 'upstream', 0, `location / { return 200 "ok"; }`);
    children.push(upstream.child);
    const proxy = await startNginx(dir, 'proxy', 1, `location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_set_header Host $host; }`, upstream.port);
    children.push(proxy.child);
    // (b): the same proxy with limit_req at a huge limit, keyed like case c (host + header): the
    // check runs on every request, nothing is refused. A shared-memory leaky bucket, not Redis.
    const limited = await startNginx(dir, 'limited', 1, `location / { limit_req zone=bench burst=1000000 nodelay; proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_set_header Host $host; }`, upstream.port, 'limit_req_zone "$host$http_x_client" zone=bench:10m rate=1000000r/s;');
    children.push(limited.child);

    // (n): the bare Node.js proxy, pinned as the ingress is, run by node itself (no tsx).
    const bareProxyPort = await freePort();
    const bare = spawn('taskset', ['-c', '1', process.execPath, fileURLToPath(new URL('./bare-proxy.mjs', import.meta.url)), String(upstream.port), String(bareProxyPort)], { stdio: ['ignore', 'ignore', 'pipe'] });
    let bareErr = '';
    bare.stderr!.on('data', (c: Buffer) => { bareErr = (bareErr + c.toString('utf8')).slice(-4000); });
    bare.once('exit', (code, signal) => { if (code !== 0) log(`the bare Node proxy exited (code ${code}, signal ${signal}): ${bareErr}`); });
    children.push(bare);
    await waitFor('bare Node proxy', () => new Promise<boolean>((resolve) => {
      http.get({ host: '127.0.0.1', port: bareProxyPort, path: '/', headers: { host: HOST } }, (res) => { res.resume(); resolve(res.statusCode === 200); }).on('error', () => resolve(false));
    }), 10_000);

    // (h): a Node.js hello world, pinned as the ingress is, run by node itself.
    const helloPort = await freePort();
    const hello = spawn('taskset', ['-c', '1', process.execPath, '-e', `require('node:http').createServer((q, s) => s.end('ok')).listen(${helloPort}, '127.0.0.1')`], { stdio: 'ignore' });
    children.push(hello);
    await waitFor('Node hello world', () => new Promise<boolean>((resolve) => {
      http.get({ host: '127.0.0.1', port: helloPort, path: '/' }, (res) => { res.resume(); resolve(res.statusCode === 200); }).on('error', () => resolve(false));
    }), 10_000);

    const tls = await ensureLocalTls(path.join(dir, 'tls'));
    const grpcPort = await freePort();
    cp = await startControlPlane({ databaseUrl: db.url, env: { GRPC_PORT: String(grpcPort), WARREN_NODE_TOKEN: nodeToken } });
    let rateLimitRedis = 'redis://127.0.0.1:6379';
    if (REDIS_MODE !== 'system') {
      const port = await freePort();
      const sock = path.join(dir, 'redis.sock');
      const child = spawn('taskset', ['-c', '1', 'redis-server', '--port', String(port), '--bind', '127.0.0.1', '--unixsocket', sock, '--unixsocketperm', '700', '--save', '', '--appendonly', 'no', '--dir', dir], { stdio: 'ignore' });
      children.push(child);
      redisCliArgs = REDIS_MODE === 'unix' ? ['-s', sock] : ['-p', String(port)];
      await waitFor('bench redis-server', () => {
        try {
          return execFileSync('redis-cli', [...redisCliArgs, 'PING'], { encoding: 'utf8' }).trim() === 'PONG';
        } catch {
          return false;
        }
      });
      rateLimitRedis = REDIS_MODE === 'unix' ? `unix://${sock}` : `redis://127.0.0.1:${port}`;
    }
    log(`rate-limit Redis: ${REDIS_MODE} (${rateLimitRedis})`);
    // (b′, performance.md §2's optional case): nginx + Lua + Redis, the same script on the same
    // Redis per request, when Debian's libnginx-mod-http-lua (and lua-resty-core) are installed.
    const blua = existsSync(NGINX_LUA_MODULE) && existsSync(NGINX_NDK_MODULE) ? await startNginxLua(dir, upstream.port, rateLimitRedis) : null;
    if (blua) children.push(blua.child);
    else log(`case blua skipped: ${NGINX_LUA_MODULE} not found (apt-get install libnginx-mod-http-lua lua-resty-core)`);
    const ingressEnv = { TLS_CERT_FILE: path.join(dir, 'tls', 'cert.pem'), TLS_KEY_FILE: path.join(dir, 'tls', 'key.pem'), LOG_LEVEL: 'warn', REDIS_URL: 'redis://127.0.0.1:6379', RATE_LIMIT_REDIS_URL: rateLimitRedis, RATE_LIMIT_SERVER_ID: `bench-${randomBytes(3).toString('hex')}`, ...(JSON.parse(process.env.BENCH_INGRESS_ENV ?? '{}') as Record<string, string>) };
    a = await startIngress({ nodeId: 'bench-a', controlPlane: [`127.0.0.1:${grpcPort}`], nodeToken, env: ingressEnv });
    b = await startIngress({ nodeId: 'bench-b', controlPlane: [`127.0.0.1:${grpcPort}`], nodeToken, env: ingressEnv });
    const api = async (method: string, p: string, body?: unknown) => {
      const res = await fetch(cp!.baseUrl + p, { method, headers: { authorization: `Bearer ${db.apiKey}`, 'ngrok-version': '2', 'content-type': 'application/json' }, body: body ? JSON.stringify(body) : undefined });
      const json = (await res.json()) as { id: string; token: string };
      if (res.status >= 300) throw new Error(`${method} ${p}: ${res.status} ${JSON.stringify(json)}`);
      return json;
    };
    const cred = await api('POST', '/credentials', {});
    const backend = await api('POST', '/backends/tunnel_group', { labels: { bench: 'proxy' } });
    const edge = await api('POST', '/edges/https', { hostports: [`${HOST}:443`] });
    await api('POST', `/edges/https/${edge.id}/routes`, { match_type: 'path_prefix', match: '/', backend: { enabled: true, backend_id: backend.id } });
    const rlEdge = await api('POST', '/edges/https', { hostports: [`${RL_HOST}:443`] });
    await api('POST', `/edges/https/${rlEdge.id}/routes`, { match_type: 'path_prefix', match: '/', backend: { enabled: true, backend_id: backend.id }, traffic_policy: { value: process.env.BENCH_POLICY ?? RL_POLICY } });
    const rl50Edge = await api('POST', '/edges/https', { hostports: [`${RL50_HOST}:443`] });
    await api('POST', `/edges/https/${rl50Edge.id}/routes`, { match_type: 'path_prefix', match: '/', backend: { enabled: true, backend_id: backend.id }, traffic_policy: { value: RL50_POLICY } });
    // wrk script for the 10k-keys variant: a random client header per request.
    const keysScript = path.join(dir, 'keys.lua');
    writeFileSync(keysScript, `request = function()\n  wrk.headers["x-client"] = tostring(math.random(1, 10000))\n  return wrk.format(nil, "/")\nend\n`);
    // wrk script for c50: x-half alternates 0, 1 (one hot client key, as in c).
    const halfScript = path.join(dir, 'half.lua');
    writeFileSync(halfScript, `local n = 0\nrequest = function()\n  n = n + 1\n  wrk.headers["x-client"] = "a"\n  wrk.headers["x-half"] = tostring(n % 2)\n  return wrk.format(nil, "/")\nend\n`);
    agent = startAgentProcess(['http', String(upstream.port), '--label', 'bench=proxy', '--authtoken', cred.token, '--server', `localhost:${a.agent}`, '--ca', tls.caFile], { LOG_LEVEL: 'warn' });
    await agent.waitForOutput('online');
    for (const n of [a, b]) for (const host of [HOST, RL_HOST, RL50_HOST]) await waitFor(`${n.nodeId} serves ${host}`, () => new Promise<boolean>((resolve) => {
      http.get({ host: '127.0.0.1', port: n.http, path: '/', headers: { host } }, (res) => { res.resume(); resolve(res.statusCode === 200); }).on('error', () => resolve(false));
    }), 15_000);
    // Redis belongs to the rate-limit case's system under test: core 1 with the ingress.
    const redisPid = Number(execFileSync('redis-cli', [...redisCliArgs, 'INFO', 'server'], { encoding: 'utf8' }).match(/process_id:(\d+)/)?.[1]);
    if (redisPid) pin(redisPid, 1);
    pin(a.pid, 1);
    pin(b.pid, 1);
    pin(agent.pid, 0);
    pin(cp.pid, 0);
    if (process.env.BENCH_HOLD === '1') {
      // Profiling aid: keep the set-up running (pinned as for the cases) until SIGINT or SIGTERM.
      log(`holding: ingress A pid ${a.pid} http ${a.http} (hosts ${HOST}, ${RL_HOST}, ${RL50_HOST}); agent pid ${agent.pid}; nginx proxy ${proxy.port}, with limit_req ${limited.port}; bare Node proxy ${bareProxyPort}; upstream ${upstream.port}; redis ${redisCliArgs.join(' ')}`);
      await new Promise<void>((resolve) => {
        // `on`, not `once`: tsx relays the signal to this process, and `pkill -f proxy-bench`
        // sends it again; a second signal without a handler would kill the process before the
        // `finally` below stops the control plane, ingresses, agent, nginx and Redis.
        process.on('SIGINT', () => resolve());
        process.on('SIGTERM', () => resolve());
      });
      return;
    }

    // Redis' CPU counts for the cases whose check runs in it (it shares core 1 with the proxy).
    const withRedis: Record<string, number> = redisPid ? { redis: redisPid } : {};
    const cases: Array<{ name: string; port: number; host?: string; script?: string; cpuPids: () => Record<string, number> }> = [
      { name: 'a', port: upstream.port, cpuPids: () => ({}) },
      { name: 'b0', port: proxy.port, cpuPids: () => ({ nginx: proxy.workerPid() }) },
      { name: 'b', port: limited.port, cpuPids: () => ({ nginx: limited.workerPid() }) },
      ...(blua ? [{ name: 'blua', port: blua.port, cpuPids: () => ({ nginx: blua.workerPid(), ...withRedis }) }] : []),
      { name: 'h', port: helloPort, cpuPids: () => ({ node: hello.pid! }) },
      { name: 'n', port: bareProxyPort, cpuPids: () => ({ node: bare.pid! }) },
      { name: 'c0', port: a.http, cpuPids: () => ({ ingress: a!.pid, agent: agent!.pid }) },
      { name: 'c', port: a.http, host: RL_HOST, cpuPids: () => ({ ingress: a!.pid, agent: agent!.pid, ...withRedis }) },
      { name: 'c10k', port: a.http, host: RL_HOST, script: keysScript, cpuPids: () => ({ ingress: a!.pid, agent: agent!.pid, ...withRedis }) },
      { name: 'c50', port: a.http, host: RL50_HOST, script: halfScript, cpuPids: () => ({ ingress: a!.pid, agent: agent!.pid, ...withRedis }) },
      { name: 'hop', port: b.http, cpuPids: () => ({ ingress_b: b!.pid, ingress_a: a!.pid, agent: agent!.pid }) },
    ];
    const only = process.env.BENCH_CASES?.split(',');
    if (only) cases.splice(0, cases.length, ...cases.filter((c) => only.includes(c.name)));
    const runs: Record<string, Array<WrkResult & { cpu_us_per_req: Record<string, number>; rss_mib: Record<string, number>; redis_script_calls_per_req: number }>> = {};
    for (let round = 1; round <= ROUNDS; round++) {
      for (const c of cases) {
        wrk(c.port, WARMUP, c.host, c.script);
        const pids = c.cpuPids();
        const before = Object.fromEntries(Object.entries(pids).map(([k, pid]) => [k, cpuMicros(pid) ?? 0]));
        const splitBefore = pids.ingress ? cpuSplit(pids.ingress) : undefined;
        const scriptsBefore = redisScriptCalls();
        const r = wrk(c.port, DURATION, c.host, c.script);
        const redisCallsPerReq = (redisScriptCalls() - scriptsBefore) / r.requests;
        const cpu = Object.fromEntries(Object.entries(pids).map(([k, pid]) => [k, ((cpuMicros(pid) ?? 0) - before[k]!) / r.requests]));
        const splitAfter = pids.ingress ? cpuSplit(pids.ingress) : undefined;
        if (splitBefore && splitAfter) log(`  ingress user ${fmt((splitAfter.user - splitBefore.user) / r.requests, 1)} sys ${fmt((splitAfter.sys - splitBefore.sys) / r.requests, 1)} µs/req`);
        const rss = Object.fromEntries(Object.entries(pids).map(([k, pid]) => [k, rssMiB(pid)]));
        (runs[c.name] ??= []).push({ ...r, cpu_us_per_req: cpu, rss_mib: rss, redis_script_calls_per_req: redisCallsPerReq });
        log(`round ${round} ${c.name}: ${fmt(r.rps)} req/s p50 ${fmt(r.p50, 2)} ms p99 ${fmt(r.p99, 2)} ms non2xx ${r.non2xx} errors ${r.socketErrors} cpu µs/req ${JSON.stringify(Object.fromEntries(Object.entries(cpu).map(([k, v]) => [k, Math.round(v)])))} rss MiB ${JSON.stringify(rss)} redis scripts/req ${redisCallsPerReq.toFixed(3)}`);
      }
    }
    const summary = Object.fromEntries(
      Object.entries(runs).map(([name, rs]) => {
        const rps = rs.map((r) => r.rps);
        const cv = Math.sqrt(rps.reduce((s, x) => s + (x - rps.reduce((a, b) => a + b, 0) / rps.length) ** 2, 0) / rps.length) / (rps.reduce((a, b) => a + b, 0) / rps.length);
        const cpuKeys = Object.keys(rs[0]!.cpu_us_per_req);
        return [name, {
          rps_median: median(rps), rps_min: Math.min(...rps), rps_max: Math.max(...rps), rps_cv: cv,
          p50_ms_median: median(rs.map((r) => r.p50)), p99_ms_median: median(rs.map((r) => r.p99)), p99_ms_max: Math.max(...rs.map((r) => r.p99)),
          cpu_us_per_req_median: Object.fromEntries(cpuKeys.map((k) => [k, median(rs.map((r) => r.cpu_us_per_req[k]!))])),
          non2xx: rs.reduce((s, r) => s + r.non2xx, 0), socket_errors: rs.reduce((s, r) => s + r.socketErrors, 0),
        }];
      }),
    ) as Record<string, { rps_median: number; p99_ms_median: number; rps_cv: number }>;
    const ratio = (x: string, y: string) => (summary[x] && summary[y] ? summary[x]!.rps_median / summary[y]!.rps_median : NaN);
    // c/c0 per round (the two ran back to back), then the median: drift of the box between rounds cancels.
    /** x/y per round (the two ran back to back in each), or [] when either case did not run. */
    const perRoundOf = (x: string, y: string): number[] => (runs[x] && runs[y] ? runs[x].map((r, i) => r.rps / runs[y]![i]!.rps) : []);
    const perRound = perRoundOf('c', 'c0');
    if (perRound.length) log(`c/c0 per round: ${perRound.map((x) => fmt(x, 2)).join(', ')}; median ${fmt(median(perRound), 2)}`);
    const perRoundCb = perRoundOf('c', 'b');
    if (perRoundCb.length) log(`c/b per round: ${perRoundCb.map((x) => fmt(x, 2)).join(', ')}; median ${fmt(median(perRoundCb), 2)}`);
    const perRoundNb = perRoundOf('n', 'b');
    if (perRoundNb.length) log(`n/b per round (bare Node proxy ÷ nginx + limit_req): ${perRoundNb.map((x) => fmt(x, 2)).join(', ')}; median ${fmt(median(perRoundNb), 2)}`);
    const perRoundHb = perRoundOf('h', 'b');
    if (perRoundHb.length) log(`h/b per round (Node hello world ÷ nginx + limit_req: the ceiling of c/b here): ${perRoundHb.map((x) => fmt(x, 2)).join(', ')}; median ${fmt(median(perRoundHb), 2)}`);
    const perRoundC0n = perRoundOf('c0', 'n');
    if (perRoundC0n.length) log(`c0/n per round (ingress ÷ bare Node proxy): ${perRoundC0n.map((x) => fmt(x, 2)).join(', ')}; median ${fmt(median(perRoundC0n), 2)}`);
    const perRoundCblua = perRoundOf('c', 'blua');
    if (perRoundCblua.length) log(`c/blua per round (ingress + rate limit ÷ nginx + Lua + the same Redis script): ${perRoundCblua.map((x) => fmt(x, 2)).join(', ')}; median ${fmt(median(perRoundCblua), 2)}`);
    if (runs.c50) {
      const refused = runs.c50.map((r) => r.non2xx / r.requests);
      const perRoundC50 = perRoundOf('c50', 'c');
      log(`c50 (every other request refused with 429): refused share per round ${refused.map((x) => fmt(x, 3)).join(', ')}${perRoundC50.length ? `; c50/c per round ${perRoundC50.map((x) => fmt(x, 2)).join(', ')}, median ${fmt(median(perRoundC50), 2)}` : ''}`);
    }

    // Open loop at 50 % and 80 % of the rate-limit case's max: the latency the check adds.
    const openLoopResults: Record<string, unknown> = {};
    if (summary.c && summary.c0 && (!process.env.BENCH_CASES || process.env.BENCH_OPEN_LOOP === '1')) {
      // Interleaved rounds (c0, c, c0, c …) at each share; medians of p50/p99 and of the per-round
      // differences c − c0, which cancel what the box was doing during that round.
      const OL_ROUNDS = Number(process.env.BENCH_OPEN_LOOP_ROUNDS ?? 3);
      const OL_RATE = process.env.BENCH_OPEN_LOOP_RATE ? Number(process.env.BENCH_OPEN_LOOP_RATE) : undefined;
      for (const share of [0.5, 0.8]) {
        const rate = Math.round((OL_RATE ?? summary.c.rps_median) * share);
        const rounds: Record<'c0' | 'c', OpenLoopResult[]> = { c0: [], c: [] };
        for (let round = 1; round <= OL_ROUNDS; round++) {
          for (const [name, host] of [['c0', HOST], ['c', RL_HOST]] as const) {
            await openLoop({ url: `http://127.0.0.1:${a.http}/`, headers: { host, 'x-client': 'hot' }, rate, durationS: Math.min(WARMUP, 3) });
            const r = await openLoop({ url: `http://127.0.0.1:${a.http}/`, headers: { host, 'x-client': 'hot' }, rate, durationS: DURATION });
            rounds[name].push(r);
            log(`open loop round ${round} ${name} @ ${rate}/s: p50 ${fmt(r.p50, 2)} ms p99 ${fmt(r.p99, 2)} ms non2xx ${r.non2xx} errors ${r.errors}`);
          }
        }
        const m = await (await fetch(`${a.internalUrl}/metrics`)).text();
        const fallbacks = [...m.matchAll(/^warren_ingress_ratelimit_fallback_total\{[^}]*\} (\d+)/gm)].reduce((n, x) => n + Number(x[1]), 0);
        if (fallbacks > 0) log(`rate-limit fallbacks so far on ingress A: ${fallbacks}`);
        const med = (name: 'c0' | 'c', k: 'p50' | 'p99') => median(rounds[name].map((r) => r[k]));
        const diff = (k: 'p50' | 'p99') => median(rounds.c.map((r, i) => r[k] - rounds.c0[i]![k]));
        openLoopResults[`${share * 100}%`] = { rate, rounds, c0: { p50: med('c0', 'p50'), p99: med('c0', 'p99') }, c: { p50: med('c', 'p50'), p99: med('c', 'p99') }, added_p50_ms: diff('p50'), added_p99_ms: diff('p99') };
        log(`open loop @ ${share * 100}% (${rate}/s), medians of ${OL_ROUNDS}: c0 p50 ${fmt(med('c0', 'p50'), 2)} p99 ${fmt(med('c0', 'p99'), 2)} ms; c p50 ${fmt(med('c', 'p50'), 2)} p99 ${fmt(med('c', 'p99'), 2)} ms; added (median of per-round differences) p50 ${fmt(diff('p50'), 2)} ms, p99 ${fmt(diff('p99'), 2)} ms`);
      }
    }
    // The same paired open loop for nginx: b0 and blua requests on the blua nginx (x-nolimit: 1
    // skips the Lua check), at 50 % and 80 % of blua's max: the latency a Redis hop adds to a C
    // proxy on this box, beside what it adds to the ingress.
    if (summary.blua && blua && process.env.BENCH_OPEN_LOOP_PAIRED === '1') {
      const OL_ROUNDS = Number(process.env.BENCH_OPEN_LOOP_ROUNDS ?? 3);
      const classes: Array<Record<string, string>> = [{ host: HOST, 'x-client': 'hot', 'x-nolimit': '1' }, { host: HOST, 'x-client': 'hot' }];
      for (const share of [0.5, 0.8]) {
        const rate = Math.round(summary.blua.rps_median * share);
        const rounds: Array<{ b0: OpenLoopResult; blua: OpenLoopResult }> = [];
        for (let round = 1; round <= OL_ROUNDS; round++) {
          await openLoopPaired({ url: `http://127.0.0.1:${blua.port}/`, classes, rate, durationS: Math.min(WARMUP, 3) });
          const [b0r, bl] = await openLoopPaired({ url: `http://127.0.0.1:${blua.port}/`, classes, rate, durationS: DURATION });
          rounds.push({ b0: b0r!, blua: bl! });
          log(`paired open loop (nginx) round ${round} @ ${rate}/s: b0 p50 ${fmt(b0r!.p50, 2)} p99 ${fmt(b0r!.p99, 2)} ms; blua p50 ${fmt(bl!.p50, 2)} p99 ${fmt(bl!.p99, 2)} ms; non2xx ${b0r!.non2xx + bl!.non2xx} errors ${b0r!.errors + bl!.errors}`);
        }
        const diff = (k: 'p50' | 'p99') => rounds.map((r) => r.blua[k] - r.b0[k]);
        openLoopResults[`nginx paired ${share * 100}%`] = { rate, rounds, added_p50_ms: median(diff('p50')), added_p99_ms: median(diff('p99')) };
        log(`paired open loop (nginx) @ ${share * 100}% of blua (${rate}/s): the Redis hop adds p50 ${fmt(median(diff('p50')), 2)} ms (per round ${diff('p50').map((x) => fmt(x, 2)).join(', ')}), p99 ${fmt(median(diff('p99')), 2)} ms (per round ${diff('p99').map((x) => fmt(x, 2)).join(', ')})`);
      }
    }
    // Paired open loop: c0 and c requests alternate within one run at the same total rate, so
    // both classes see the same stalls; the per-round difference is the latency the check itself
    // adds to a request (the extra load it puts on the ingress is shared by both classes).
    if (summary.c && process.env.BENCH_OPEN_LOOP_PAIRED === '1') {
      const OL_ROUNDS = Number(process.env.BENCH_OPEN_LOOP_ROUNDS ?? 3);
      const OL_RATE = process.env.BENCH_OPEN_LOOP_RATE ? Number(process.env.BENCH_OPEN_LOOP_RATE) : undefined;
      const classes = [{ host: HOST, 'x-client': 'hot' }, { host: RL_HOST, 'x-client': 'hot' }];
      for (const share of [0.5, 0.8]) {
        const rate = Math.round((OL_RATE ?? summary.c.rps_median) * share);
        const rounds: Array<{ c0: OpenLoopResult; c: OpenLoopResult }> = [];
        for (let round = 1; round <= OL_ROUNDS; round++) {
          await openLoopPaired({ url: `http://127.0.0.1:${a.http}/`, classes, rate, durationS: Math.min(WARMUP, 3) });
          const [c0r, cr] = await openLoopPaired({ url: `http://127.0.0.1:${a.http}/`, classes, rate, durationS: DURATION });
          rounds.push({ c0: c0r!, c: cr! });
          log(`paired open loop round ${round} @ ${rate}/s (half c0, half c): c0 p50 ${fmt(c0r!.p50, 2)} p99 ${fmt(c0r!.p99, 2)} ms; c p50 ${fmt(cr!.p50, 2)} p99 ${fmt(cr!.p99, 2)} ms; non2xx ${c0r!.non2xx + cr!.non2xx} errors ${c0r!.errors + cr!.errors}`);
        }
        const diff = (k: 'p50' | 'p99') => rounds.map((r) => r.c[k] - r.c0[k]);
        openLoopResults[`paired ${share * 100}%`] = { rate, rounds, added_p50_ms: median(diff('p50')), added_p99_ms: median(diff('p99')), added_p99_per_round: diff('p99') };
        log(`paired open loop @ ${share * 100}% (${rate}/s): added p50 ${fmt(median(diff('p50')), 2)} ms (per round ${diff('p50').map((x) => fmt(x, 2)).join(', ')}), added p99 ${fmt(median(diff('p99')), 2)} ms (per round ${diff('p99').map((x) => fmt(x, 2)).join(', ')})`);
      }
    }
    // Idle latency (BENCH_SEQUENTIAL=1): one connection, one request at a time, c0 and c
    // alternating at 200/s, so nothing queues and each request meets idle processes; beside it,
    // the round trip of a PING to the limiter's Redis from core 1 (where the ingress runs). On a
    // VM, waking an idle process costs tens to hundreds of µs, and the check adds one round trip.
    let sequential: Record<string, unknown> | undefined;
    if (process.env.BENCH_SEQUENTIAL === '1') {
      const classes = [{ host: HOST, 'x-client': 'hot' }, { host: RL_HOST, 'x-client': 'hot' }];
      const [c0s, cs] = await openLoopPaired({ url: `http://127.0.0.1:${a.http}/`, classes, rate: 200, durationS: Math.max(5, Math.min(DURATION, 10)), connections: 1 });
      const ping = redisPingMicros(redisCliArgs);
      sequential = { c0: c0s, c: cs, added_p50_ms: cs!.p50 - c0s!.p50, added_p99_ms: cs!.p99 - c0s!.p99, redis_ping_from_core1_us: ping };
      log(`idle latency (1 connection, 200/s): c0 p50 ${fmt(c0s!.p50, 3)} p99 ${fmt(c0s!.p99, 2)} ms; c p50 ${fmt(cs!.p50, 3)} p99 ${fmt(cs!.p99, 2)} ms; added p50 ${fmt(cs!.p50 - c0s!.p50, 3)} ms; Redis PING from core 1 p50 ${fmt(ping.p50, 0)} µs p99 ${fmt(ping.p99, 0)} µs`);
    }
    const result = {
      bench: 'proxy-throughput',
      at: new Date().toISOString(),
      machine: machine(),
      method: { rounds: ROUNDS, warmup_s: WARMUP, duration_s: DURATION, connections: CONNECTIONS, generator: LOADGEN === 'autocannon' ? 'autocannon 9 (Node.js, core 0; wrk for scripted cases)' : 'wrk -t1 (core 0)', upstream: 'nginx return 200 "ok" (core 0)', sut_core: 1, agent_core: 0 },
      summary,
      ratios: { 'c/c0 per-round median': perRound.length ? median(perRound) : NaN, 'c/b per-round median': perRoundCb.length ? median(perRoundCb) : NaN, 'n/b per-round median': perRoundNb.length ? median(perRoundNb) : NaN, 'h/b per-round median': perRoundHb.length ? median(perRoundHb) : NaN, 'c0/n per-round median': perRoundC0n.length ? median(perRoundC0n) : NaN, 'c/n': ratio('c', 'n'), 'c0/a': ratio('c0', 'a'), 'c0/b0': ratio('c0', 'b0'), 'b0/a': ratio('b0', 'a'), 'c/c0': ratio('c', 'c0'), 'c/b0': ratio('c', 'b0'), 'c/b': ratio('c', 'b'), 'b/b0': ratio('b', 'b0'), 'c10k/c0': ratio('c10k', 'c0'), 'c50/c': ratio('c50', 'c'), 'c/blua per-round median': perRoundCblua.length ? median(perRoundCblua) : NaN, 'blua/b': ratio('blua', 'b'), 'hop/c0': ratio('hop', 'c0') },
      open_loop: openLoopResults,
      sequential,
      runs,
    };
    mkdirSync(path.dirname(RESULTS), { recursive: true });
    writeFileSync(RESULTS, `${JSON.stringify(result, null, 2)}\n`);
    console.log(`\nproxy throughput (${ROUNDS} rounds × ${DURATION} s, ${LOADGEN} -c${CONNECTIONS}; medians)`);
    for (const [name, s] of Object.entries(summary)) console.log(`  ${name.padEnd(4)} ${fmt(s.rps_median).padStart(7)} req/s  p99 ${fmt(s.p99_ms_median, 2)} ms  cv ${fmt(s.rps_cv * 100, 1)}%`);
    console.log(`  ratios: ${Object.entries(result.ratios).map(([k, v]) => `${k} ${fmt(v, 2)}`).join('  ')}`);
    console.log(`  (written to ${RESULTS})`);
  } finally {
    try {
      // The machine's Redis was pinned to core 1 for the run: give it both cores back.
      const redisPid = REDIS_MODE === 'system' ? Number(execFileSync('redis-cli', ['-p', '6379', 'INFO', 'server'], { encoding: 'utf8' }).match(/process_id:(\d+)/)?.[1]) : 0;
      if (redisPid) execFileSync('taskset', ['-a', '-pc', '0-1', String(redisPid)], { stdio: 'ignore' });
    } catch {
      /* best effort */
    }
    await agent?.stop().catch(() => {});
    await Promise.allSettled([a?.stop(), b?.stop()]);
    await cp?.stop().catch(() => {});
    for (const c of children) c.kill('SIGTERM');
    await db.drop();
    cleanupTempDirs();
  }
}

main().then(
  // Exit once cleaned up: BENCH_HOLD's signal handlers (and a keep-alive socket or two) would
  // otherwise keep the process waiting after its services are gone.
  () => process.exit(process.exitCode ?? 0),
  (err: unknown) => {
    console.error(err);
    process.exit(1);
  },
);
