import http from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger, type DataPlaneConfig, type DpRoute } from '@warren/shared';
import { createIngressMetrics } from '../metrics.js';
import type { StageFactory } from '../pipeline/types.js';
import { listen, rawHttpServer, startPublicListener } from './testing.js';

/**
 * A response head Node refuses to write (a header value beyond U+00FF, a control character in the
 * upstream's reason phrase) answers 502 to that client, or cuts a response already started, and
 * never throws out of the forwarder: before, `res.writeHead` threw in `deliver()`'s promise (an
 * unhandled rejection: the process ended) or in undici's `onHeaders`. The node keeps serving.
 */

const log = createLogger('test', 'silent');
const closers: Array<() => void> = [];
const unhandled: unknown[] = [];
const onUnhandled = (err: unknown) => unhandled.push(err);


/** Answers exact bytes per path: `/bad-reason…` with a control character in its reason phrase. */
const rawAnswer = (path: string): string =>
  path.includes('bad-reason') ? 'HTTP/1.1 200 OK\x01\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok' : `HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: ${path.length}\r\n\r\n${path}`;

const route = (id: string, match: string, modules: Record<string, unknown> = {}): [string, DpRoute] => [
  id,
  { id, accountId: 'ac_1', edgeId: 'edghts_1', matchType: 'path_prefix', match, modules, backendId: 'bkdtg_raw', ipPolicyIds: [], trafficPolicy: null },
];

const cfg: DataPlaneConfig = {
  version: 1,
  edges: new Map([['edghts_1', { id: 'edghts_1', accountId: 'ac_1', hostports: ['app.test:443'], mutualTls: null, tlsTermination: null }]]),
  routes: new Map([route('r_plain', '/plain'), route('r_edit', '/edit', { edit: true }), route('r_answer', '/answer', { answer: true }), route('r_ok', '/ok', { ok: true })]),
  backends: new Map([['bkdtg_raw', { id: 'bkdtg_raw', accountId: 'ac_1', labels: { app: 'raw' } }]]),
  ipPolicies: new Map(),
  certificateAuthorities: new Map(),
  credentials: new Map(),
  credentialsByTokenHash: new Map(),
  eventSubscriptions: new Map(),
};

/** Stages that make heads Node refuses, as an older or broken stage could (the header modules now refuse such values when compiled). */
const testStage: StageFactory = (r) => {
  if (r.modules.edit) return { name: 'edit', onResponse: (_s, res) => void res.headers.push('X-Price', '5 €') };
  if (r.modules.answer) return { name: 'answer', onResponse: () => ({ status: 200, headers: { 'x-price': '5 €' }, body: 'replaced' }) };
  if (r.modules.ok) return { name: 'ok', onResponse: (_s, res) => void res.headers.push('X-Name', 'café') };
  return null;
};

let port = 0;

beforeAll(async () => {
  process.on('unhandledRejection', onUnhandled);
  const raw = rawHttpServer((path, sock) => void sock.write(rawAnswer(path)));
  const upstreamPort = await listen(raw);
  const limiter = { hit: async () => ({ limited: false, retryAfterSeconds: 0 }) };
  const pub = await startPublicListener({ cfg, stages: [testStage], limiter, metrics: createIngressMetrics('n1'), log, labels: { app: 'raw' }, upstreamPort });
  port = pub.port;
  closers.push(() => {
    pub.close();
    raw.close();
  });
});

afterAll(() => {
  for (const c of closers) c();
  process.off('unhandledRejection', onUnhandled);
});

function get(path: string): Promise<{ status: number; statusMessage: string; headers: http.IncomingHttpHeaders; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ port, host: '127.0.0.1', path, agent: false, headers: { host: 'app.test' } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode!, statusMessage: res.statusMessage ?? '', headers: res.headers, body: Buffer.concat(chunks).toString('latin1') }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

const expect502 = (r: Awaited<ReturnType<typeof get>>) => {
  expect([r.status, r.statusMessage, r.headers['warren-error-code'], r.headers['x-price']]).toEqual([502, 'Bad Gateway', 'ERR_WARREN_7004', undefined]);
  expect(JSON.parse(r.body).msg).toMatch(/cannot be sent/);
};

describe('response heads Node refuses to write', () => {
  it('a stage-edited head with a value beyond U+00FF: 502, then the node still serves', async () => {
    expect502(await get('/edit/x'));
    expect(await get('/plain/fine')).toMatchObject({ status: 200, body: '/plain/fine' });
  });

  it("a stage's own answer with such a value: 502", async () => {
    expect502(await get('/answer/x'));
  });

  it("an upstream reason phrase with a control character, with or without response stages: 502 (not the upstream's phrase)", async () => {
    expect502(await get('/plain/bad-reason'));
    expect502(await get('/edit/bad-reason'));
    expect(await get('/plain/after')).toMatchObject({ status: 200, body: '/plain/after' });
  });

  it('obs-text (Latin-1) values are written as their bytes', async () => {
    const r = await get('/ok/x');
    expect([r.status, Buffer.from(String(r.headers['x-name']), 'latin1').toString('latin1')]).toEqual([200, 'café']);
  });

  it('nothing was left unhandled', () => {
    expect(unhandled).toEqual([]);
  });
});
