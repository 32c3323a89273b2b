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

  it('adds and removes Host like any other response header', async () => {
    const add = stageFor(responseHeadersStage, { response_headers: { add: { Host: 'anything goes here' } } })!;
    const r = makeResponse(200, ['host', 'upstream.internal', 'X-A', '1']);
    await add.onResponse!(makeState(), r);
    expect(r.headers).toEqual(['host', 'anything goes here', 'X-A', '1']);
    const remove = stageFor(responseHeadersStage, { response_headers: { remove: ['HOST'] } })!;
    const r2 = makeResponse(200, ['Host', 'upstream.internal', 'X-A', '1']);
    await remove.onResponse!(makeState(), r2);
    expect(r2.headers).toEqual(['X-A', '1']);
  });

  it('refuses a stored value Node cannot write (the route answers 503; the ingress never throws on a response)', () => {
    expect(() => stageFor(responseHeadersStage, { response_headers: { enabled: true, add: { 'X-Price': '5 \ud83d' }, remove: [] } })).toThrow(
      'response_headers: add: the value of "X-Price": header value has a character not allowed in a header (a control character or a lone surrogate)',
    );
    expect(() => stageFor(responseHeadersStage, { response_headers: { add: { 'X-A': 'line\nbreak' } } })).toThrow(/value of "X-A"/);
    expect(() => stageFor(responseHeadersStage, { response_headers: { add: { 'X:A': 'v' } } })).toThrow(/"X:A" is not a valid header name/);
  });

  it('writes values as their UTF-8 bytes', async () => {
    const stage = stageFor(responseHeadersStage, { response_headers: { add: { 'X-Name': 'caf\u00e9', 'X-Price': '5 \u20ac' } } })!;
    const r = makeResponse(200, []);
    await stage.onResponse!(makeState(), r);
    // One character per byte, as Node writes them: c3 a9; e2 82 ac.
    expect(r.headers).toEqual(['X-Name', 'caf\u00c3\u00a9', 'X-Price', '5 \u00e2\u0082\u00ac']);
  });
});
