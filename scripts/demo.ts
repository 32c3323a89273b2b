/**
 * The `npm start` demo: an account's first tunnel, end to end. Creates (once) an agent credential,
 * a tunnel group backend labelled `demo=hello`, an HTTPS edge on `demo.warren.localhost:443` and a
 * route `/` to the backend, through the REST API like any user would, and keeps what it needs to
 * run the agent again in `.data/demo.json` (mode 0600: it holds a demo API key and authtoken).
 */
import http from 'node:http';
import { existsSync } from 'node:fs';
import { readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';

export interface DemoState {
  accountId: string;
  apiKey: string;
  authtoken: string;
  backendId: string;
  edgeId: string;
  routeId: string;
  hostname: string;
}

async function api<T>(base: string, key: string, method: string, p: string, body?: unknown): Promise<{ status: number; body: T }> {
  const res = await fetch(`${base}${p}`, {
    method,
    headers: { authorization: `Bearer ${key}`, 'service-version': '2', ...(body ? { 'content-type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await res.text();
  return { status: res.status, body: (text ? JSON.parse(text) : {}) as T };
}

/** The demo resources, created when missing (or when an earlier demo's edge was deleted). */
export async function ensureDemo(dataDir: string, base: string, newApiKey: () => Promise<{ accountId: string; token: string }>): Promise<DemoState> {
  const file = path.join(dataDir, 'demo.json');
  if (existsSync(file)) {
    const state = JSON.parse(await readFile(file, 'utf8')) as DemoState;
    const edge = await api(base, state.apiKey, 'GET', `/edges/https/${state.edgeId}`).catch(() => ({ status: 0 }));
    if (edge.status === 200) return state;
  }
  const { accountId, token: apiKey } = await newApiKey();
  const hostname = 'demo.warren.localhost';
  const must = async <T>(r: Promise<{ status: number; body: T }>, what: string): Promise<T> => {
    const x = await r;
    if (x.status >= 300) throw new Error(`creating the demo ${what} failed: ${x.status} ${JSON.stringify(x.body)}`);
    return x.body;
  };
  const cred = await must(api<{ token: string }>(base, apiKey, 'POST', '/credentials', { description: 'npm start demo agent' }), 'credential');
  const backend = await must(api<{ id: string }>(base, apiKey, 'POST', '/backends/tunnel_group', { description: 'npm start demo', labels: { demo: 'hello' } }), 'backend');
  // An earlier demo's edge may still hold the hostname: reuse nothing, replace it.
  const edges = await api<{ https_edges: Array<{ id: string; hostports: string[] }> }>(base, apiKey, 'GET', '/edges/https?limit=100');
  for (const e of edges.body.https_edges ?? []) if (e.hostports?.includes(`${hostname}:443`)) await api(base, apiKey, 'DELETE', `/edges/https/${e.id}`);
  const edge = await must(api<{ id: string }>(base, apiKey, 'POST', '/edges/https', { description: 'npm start demo', hostports: [`${hostname}:443`] }), 'edge');
  const route = await must(
    api<{ id: string }>(base, apiKey, 'POST', `/edges/https/${edge.id}/routes`, { match_type: 'path_prefix', match: '/', description: 'npm start demo', backend: { enabled: true, backend_id: backend.id } }),
    'route',
  );
  const state: DemoState = { accountId, apiKey, authtoken: cred.token, backendId: backend.id, edgeId: edge.id, routeId: route.id, hostname };
  await writeFile(file, JSON.stringify(state, null, 2), { mode: 0o600 });
  return state;
}

/** The service behind the demo tunnel: a hello page that shows what reached it. */
export function startDemoUpstream(): Promise<{ port: number; close: () => void }> {
  const server = http.createServer((req, res) => {
    const body = `Hello from behind a Warren tunnel!\n\n${req.method} ${req.url}\nHost: ${req.headers.host}\nX-Forwarded-For: ${req.headers['x-forwarded-for'] ?? ''}\nX-Forwarded-Proto: ${req.headers['x-forwarded-proto'] ?? ''}\n`;
    res.writeHead(200, { 'content-type': 'text/plain; charset=utf-8', 'content-length': Buffer.byteLength(body) });
    res.end(body);
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({ port: (server.address() as { port: number }).port, close: () => server.close() })));
}
