import { describe, expect, it } from 'vitest';
import { responseHeadersStage } from './response-headers.js';
import { makeResponse, makeState, stageFor } from './testing.js';

describe('response_headers', () => {
  it('is absent when missing or disabled', () => {
    expect(stageFor(responseHeadersStage, {})).toBeNull();
    expect(stageFor(responseHeadersStage, { response_headers: { enabled: false, add: { a: 'b' }, remove: [] } })).toBeNull();
  });

  it('edits the response head case-insensitively', async () => {
    const stage = stageFor(responseHeadersStage, { response_headers: { enabled: true, add: { 'Strict-Transport-Security': 'max-age=63072000', server: 'warren' }, remove: ['X-Powered-By'] } })!;
    const r = makeResponse(200, ['Server', 'nginx', 'x-powered-by', 'PHP', 'Content-Length', '5', 'Set-Cookie', 'a=1', 'Set-Cookie', 'b=2']);
    expect(await stage.onResponse!(makeState(), r)).toBeUndefined();
    expect(r.headers).toEqual(['Server', 'warren', 'Content-Length', '5', 'Set-Cookie', 'a=1', 'Set-Cookie', 'b=2', 'Strict-Transport-Security', 'max-age=63072000']);
    expect(r.status).toBe(200);
  });

  it('keeps Content-Length and Transfer-Encoding', async () => {
    const stage = stageFor(responseHeadersStage, { response_headers: { enabled: true, add: {}, remove: ['content-length', 'x-a'] } })!;
    const r = makeResponse(200, ['Content-Length', '5', 'X-A', '1']);
    await stage.onResponse!(makeState(), r);
    expect(r.headers).toEqual(['Content-Length', '5']);
  });
});
