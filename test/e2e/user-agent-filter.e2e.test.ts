import http from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPolicyCluster, type PolicyCluster, type PolicyResponse } from '../support/policy-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * `user_agent_filter` on live traffic, through real processes: a control plane, an ingress node,
 * our agent and an upstream echoing what reached it. Filters are saved through the REST API.
 * ngrok's rules (https://ngrok.com/docs/http/user-agent-filter/): a User-Agent matching an allow
 * rule passes; else one matching a deny rule is refused; else it passes if there are deny rules
 * and is refused if there are only allow rules. Requests without a User-Agent are refused unless
 * an allow rule matches the empty string (`^$`). Only the first User-Agent header is checked.
 * Patterns are RE2, so no pattern can make the ingress backtrack.
 */

const HOST = 'uaf.e2e.test';
let c: PolicyCluster;

beforeAll(async () => {
  c = await startPolicyCluster({ name: 'uaf', host: HOST });
}, CLUSTER_HOOK_MS);

afterAll(async () => {
  await c?.stop();
}, 60_000);

/** A GET with `ua` as the User-Agent (none when undefined). */
const get = (path: string, ua?: string, timeoutMs?: number) => c.request(path, { headers: ua === undefined ? {} : { 'user-agent': ua }, timeoutMs });
const status = async (path: string, ua?: string) => (await get(path, ua)).status;

/** Refused by the filter: 403 ERR_WARREN_7101, never reaching the upstream. */
function refused(r: PolicyResponse): void {
  expect([r.status, r.headers['warren-error-code']], r.body).toEqual([403, 'ERR_WARREN_7101']);
}
/** Reached the upstream, which saw `ua`. */
function passed(r: PolicyResponse, ua?: string): void {
  expect(r.status, r.body).toBe(200);
  expect(r.json().headers['user-agent']).toBe(ua);
}

/** A GET sending the raw header pairs as given (e.g. two User-Agent headers). */
function rawGet(path: string, pairs: string[]): Promise<{ status: number; code: string | undefined; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: c.a.http, path, method: 'GET', agent: false, headers: ['Host', HOST, ...pairs] }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (ch: Buffer) => chunks.push(ch));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, code: res.headers['warren-error-code'] as string | undefined, body: Buffer.concat(chunks).toString() }));
    });
    req.setTimeout(10_000, () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end();
  });
}

describe('user_agent_filter on live traffic', () => {
  it('an allow list alone lets only matching User-Agents through', async () => {
    await c.route('/allow-only', { user_agent_filter: { allow: ['^curl/', '(?i)^mozilla/5\\.0 \\(x11'] } });
    passed(await get('/allow-only/x', 'curl/8.4.0'), 'curl/8.4.0');
    passed(await get('/allow-only/x', 'Mozilla/5.0 (X11; Linux x86_64)'), 'Mozilla/5.0 (X11; Linux x86_64)');
    refused(await get('/allow-only/x', 'Wget/1.21'));
    refused(await get('/allow-only/x', 'Mozilla/5.0 (Windows NT 10.0)'));
    refused(await get('/allow-only/x'));
  });

  it('an allow rule overrides deny rules (ngrok: every Google bot but Google Images)', async () => {
    await c.route('/google', { user_agent_filter: { allow: ['(?i)google-images'], deny: ['(?i)google', '[Bb]ing'] } });
    passed(await get('/google/x', 'Google-Images/1.0'), 'Google-Images/1.0');
    refused(await get('/google/x', 'Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)'));
    refused(await get('/google/x', 'Mozilla/5.0 (compatible; bingbot/2.0)'));
    // Matching no deny rule: passes.
    passed(await get('/google/x', 'curl/8'), 'curl/8');
  });

  it('each list is matched as one program: a flag set in one pattern does not reach the next', async () => {
    await c.route('/scoped', { user_agent_filter: { allow: ['(?i)google-images', '[Bb]ing', '^$'] } });
    passed(await get('/scoped/x', 'GOOGLE-IMAGES/1.0'), 'GOOGLE-IMAGES/1.0');
    passed(await get('/scoped/x', 'bingbot/2.0'), 'bingbot/2.0');
    passed(await get('/scoped/x'), undefined);
    refused(await get('/scoped/x', 'BING'));
    refused(await get('/scoped/x', 'Mozilla/5.0'));
  });

  it('a request without a User-Agent is refused, unless an allow rule matches the empty string', async () => {
    await c.route('/no-ua', { user_agent_filter: { deny: ['(?i)badbot'] } });
    await c.route('/no-ua-ok', { user_agent_filter: { allow: ['^$'], deny: ['(?i)badbot'] } });
    refused(await get('/no-ua/x'));
    refused(await get('/no-ua/x', ''));
    passed(await get('/no-ua/x', 'curl/8'), 'curl/8');
    passed(await get('/no-ua-ok/x'), undefined);
    refused(await get('/no-ua-ok/x', 'BadBot/1.0'));
    passed(await get('/no-ua-ok/x', 'curl/8'), 'curl/8');
  });

  it('checks the whole header: a long User-Agent does not hide a deny match', async () => {
    await c.route('/long', { user_agent_filter: { deny: ['(?i)badbot'] } });
    refused(await get('/long/x', `Mozilla/5.0 ${'a'.repeat(600)} BadBot/1.0`));
    refused(await get('/long/x', `Mozilla/5.0 ${'a'.repeat(12_000)} BadBot/1.0`));
    const fine = `Mozilla/5.0 ${'a'.repeat(12_000)} GoodBrowser/1.0`;
    passed(await get('/long/x', fine), fine);
  });

  it('checks only the first User-Agent header', async () => {
    await c.route('/first', { user_agent_filter: { deny: ['(?i)badbot'] } });
    expect(await rawGet('/first/x', ['User-Agent', 'BadBot/1.0', 'User-Agent', 'Mozilla/5.0'])).toMatchObject({ status: 403, code: 'ERR_WARREN_7101' });
    expect(await rawGet('/first/x', ['User-Agent', 'Mozilla/5.0', 'User-Agent', 'BadBot/1.0'])).toMatchObject({ status: 200 });
  });

  it('runs RE2: inline flags, and a pattern that would backtrack forever answers a hostile User-Agent at once', async () => {
    await c.route('/re2', { user_agent_filter: { allow: ['^(a|a)*$', 'foo(?i)bar'] } });
    expect(await status('/re2/x', 'fooBAR')).toBe(200);
    expect(await status('/re2/x', 'FOObar')).toBe(403);
    expect(await status('/re2/x', 'a'.repeat(40))).toBe(200);
    // A JavaScript RegExp takes hours on this one (and blocks the process meanwhile).
    const t0 = Date.now();
    refused(await get('/re2/x', `${'a'.repeat(40)}!`, 5000));
    refused(await get('/re2/x', `${'a'.repeat(12_000)}!`, 5000));
    expect(Date.now() - t0).toBeLessThan(5000);
    // The node still serves other routes.
    passed(await get('/google/x', 'curl/8'), 'curl/8');
  });

  it('the API refuses a pattern RE2 does not compile, or one too costly to match, naming it', async () => {
    const create = (filter: Record<string, unknown>) => c.api('POST', `/edges/https/${c.edgeId}/routes`, c.routeBody(`/bad-${Math.random().toString(36).slice(2, 8)}`, { user_agent_filter: filter }));
    const lookaround = await create({ allow: ['ok'], deny: ['curl', 'bot(?=x)'] });
    expect([lookaround.status, lookaround.body.error_code, lookaround.body.details?.field]).toEqual([400, 'ERR_WARREN_2104', 'user_agent_filter.deny[1]']);
    expect(lookaround.body.msg).toMatch(/user_agent_filter\.deny\[1\]: invalid RE2 pattern: .*no lookaround or backreferences/);
    const unclosed = await create({ allow: ['(unclosed'] });
    expect([unclosed.status, unclosed.body.details?.field]).toEqual([400, 'user_agent_filter.allow[0]']);
    expect(unclosed.body.msg).toMatch(/missing closing \)/);
    // Linear, but with a DFA of ~2^20 states: ~100 ms per pattern on a 16 KiB User-Agent.
    const costly = await create({ deny: ['a[ab]{20}b'] });
    expect([costly.status, costly.body.error_code, costly.body.details?.field]).toEqual([400, 'ERR_WARREN_2104', 'user_agent_filter.deny[0]']);
    expect(costly.body.msg).toMatch(/too costly to match/);
    // Each pattern cheap alone, but the list, matched in one pass, too costly to build: the list is named.
    const names = ['googlebot', 'bingbot', 'slurp', 'duckduckbot', 'baiduspider', 'yandexbot', 'sogou', 'exabot', 'facebot', 'ia_archiver', 'ahrefsbot', 'semrushbot', 'mj12bot', 'dotbot', 'petalbot', 'bytespider', 'gptbot', 'ccbot', 'claudebot', 'amazonbot'];
    const many = Array.from({ length: 32 }, (_, i) => `(?i)(${names.map((n) => `${n}${i}`).join('|')})`.slice(0, 250).replace(/\|[^|]*$/, ')'));
    const together = await create({ allow: ['^curl/'], deny: many });
    expect([together.status, together.body.error_code, together.body.details?.field]).toEqual([400, 'ERR_WARREN_2104', 'user_agent_filter.deny']);
    expect(together.body.msg).toMatch(/user_agent_filter\.deny: the 32 deny patterns are too costly to match together: each list is matched in one pass/);
  });
});
