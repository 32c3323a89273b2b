import { describe, expect, it } from 'vitest';
import { requestHeadersStage } from './request-headers.js';
import { makeState, stageFor } from './testing.js';

describe('request_headers', () => {
  it('is absent when missing, disabled or empty', () => {
    expect(stageFor(requestHeadersStage, {})).toBeNull();
    expect(stageFor(requestHeadersStage, { request_headers: { enabled: false, add: { a: 'b' }, remove: [] } })).toBeNull();
    expect(stageFor(requestHeadersStage, { request_headers: { enabled: true, add: {}, remove: [] } })).toBeNull();
  });

  it('removes case-insensitively, then adds replacing same-named headers', async () => {
    const stage = stageFor(requestHeadersStage, { request_headers: { enabled: true, add: { 'X-Env': 'prod', 'x-new': '1' }, remove: ['X-Secret', 'cookie'] } })!;
    const s = makeState({ headers: ['Host', 'a.test', 'x-secret', 's1', 'X-SECRET', 's2', 'X-ENV', 'dev', 'Accept', '*/*', 'x-env', 'dev2', 'Cookie', 'c=1'] });
    expect(await stage.onRequest!(s)).toBeNull();
    expect(s.headers).toEqual(['Host', 'a.test', 'X-ENV', 'prod', 'Accept', '*/*', 'x-new', '1']);
  });

  it('never touches Host or framing headers', async () => {
    const stage = stageFor(requestHeadersStage, { request_headers: { enabled: true, add: { 'Content-Length': '0', 'X-A': 'a' }, remove: ['host', 'transfer-encoding'] } })!;
    const s = makeState({ headers: ['Host', 'a.test', 'Transfer-Encoding', 'chunked'] });
    await stage.onRequest!(s);
    expect(s.headers).toEqual(['Host', 'a.test', 'Transfer-Encoding', 'chunked', 'X-A', 'a']);
  });
});
