import { afterAll, describe, expect, it } from 'vitest';
import { AppError, USER_AGENT_FILTER_EXPLORE_STEPS } from '@warren/shared';
import { parseBody } from '../../http/validate.js';
import { UserAgentFilterRequest } from './route-modules.schema.js';
import { checkUserAgentFilter, createUserAgentChecks } from './user-agent-check.js';

/**
 * user_agent_filter validation: RE2 patterns (as the ingress runs them), limits, and a bounded
 * matching cost (checked after the schema, in a worker thread, as a module PUT does).
 */

const checks = createUserAgentChecks();
afterAll(() => checks.close());

async function refusal(body: unknown): Promise<{ code: number; field: string | undefined; message: string } | null> {
  try {
    await checkUserAgentFilter(checks, 'ac_test', parseBody(UserAgentFilterRequest, body), '');
    return null;
  } catch (err) {
    if (!(err instanceof AppError)) throw err;
    return { code: err.code, field: err.details.field, message: err.message };
  }
}

describe('user_agent_filter request', () => {
  it('accepts RE2 patterns: flags, inline flags, ^$, and patterns a backtracking engine would choke on', async () => {
    const ok = ['(?i)curl/.*', 'foo(?i)bar', '(?is)^mozilla.*gecko', '^$', '(?i)google-images', '[Bb]ing', '(a|a)*$', '(a+)+$', '(\\w*x)*', '(ab){2,3}', '\\pL+/\\d', 'Mozilla/5\\.0 \\(X11;.*'];
    expect(await refusal({ allow: ok, deny: ['(?i)google', '(?i)(bad|evil)bot'] })).toBeNull();
    expect(await refusal({})).toBeNull();
    expect(await refusal({ enabled: false, allow: null, deny: Array(32).fill('bot') })).toBeNull();
  });

  it('refuses a pattern RE2 does not compile, naming allow[i] or deny[i] with the RE2 error', async () => {
    expect(await refusal({ allow: ['ok', '(unclosed'] })).toEqual({ code: 2104, field: 'allow[1]', message: expect.stringMatching(/allow\[1\]: invalid RE2 pattern: missing closing \)/) });
    expect(await refusal({ deny: ['[z-a]'] })).toMatchObject({ code: 2104, field: 'deny[0]', message: expect.stringContaining('invalid character class range') });
    expect(await refusal({ deny: ['x', 'bot(?=x)'] })).toMatchObject({ code: 2104, field: 'deny[1]', message: expect.stringContaining('no lookaround or backreferences') });
    expect(await refusal({ deny: ['(a)\\1'] })).toMatchObject({ code: 2104, field: 'deny[0]', message: expect.stringContaining('invalid escape sequence') });
    expect(await refusal({ deny: ['(?<=a)b'] })).toMatchObject({ code: 2104, field: 'deny[0]' });
  });

  it('keeps the count and length limits', async () => {
    expect(await refusal({ allow: Array(33).fill('a') })).toMatchObject({ code: 5002, field: 'allow' });
    expect(await refusal({ deny: ['a'.repeat(257)] })).toMatchObject({ code: 5003, field: 'deny[0]' });
    expect(await refusal({ deny: ['é'.repeat(129)] })).toMatchObject({ code: 5003, field: 'deny[0]' });
    expect(await refusal({ deny: ['a'.repeat(256)] })).toBeNull();
    expect(await refusal({ allow: 'bot' })).toMatchObject({ code: 2102, field: 'allow' });
  });

  it('refuses a pattern whose DFA is too large to match in constant work per character', async () => {
    // RE2 would build a DFA state for nearly every character of a hostile User-Agent: ~100 ms on 16 KiB.
    expect(await refusal({ allow: ['(?i)bot'], deny: ['ok', 'a[ab]{20}b'] })).toMatchObject({ code: 2104, field: 'deny[1]', message: expect.stringContaining('too costly to match') });
    expect(await refusal({ allow: ['x[^y]{12}[^z]{12}y'] })).toMatchObject({ code: 2104, field: 'allow[0]', message: expect.stringContaining('too costly') });
  });

  it('bounds the work of checking a filter: a list too costly to match as one program is refused, naming the list', async () => {
    const names = ['googlebot', 'bingbot', 'slurp', 'duckduckbot', 'baiduspider', 'yandexbot', 'sogou', 'exabot', 'facebot', 'ia_archiver', 'ahrefsbot', 'semrushbot', 'mj12bot', 'dotbot', 'petalbot', 'bytespider', 'gptbot', 'ccbot', 'claudebot', 'amazonbot', 'applebot', 'seznambot'];
    const alternation = (i: number) => `(?i)(${names.map((n) => `${n}${i}`).join('|')})`.slice(0, 250).replace(/\|[^|]*$/, ')');
    // A few large alternations are fine; dozens of them, matched in one pass, would take too long to build.
    expect(await refusal({ deny: [alternation(0)] })).toBeNull();
    expect(await refusal({ deny: [alternation(0), alternation(1), alternation(2), alternation(3)] })).toBeNull();
    const many = Array.from({ length: 32 }, (_, i) => alternation(i));
    expect(await refusal({ allow: ['^curl/'], deny: many })).toEqual({
      code: 2104,
      field: 'deny',
      message: expect.stringMatching(new RegExp(`^deny: the 32 deny patterns are too costly to match together: each list is matched in one pass, as one RE2 program, .*more than ${USER_AGENT_FILTER_EXPLORE_STEPS} transitions`)),
    });
    // Each list is checked on its own: the allow list is named when it is the costly one.
    expect(await refusal({ allow: many, deny: ['(?i)bot'] })).toMatchObject({ code: 2104, field: 'allow' });
  });

  it('accepts lists whose patterns set their own flags, matched as one program', async () => {
    expect(await refusal({ allow: ['(?i)google-images', '[Bb]ing', '^$', 'foo(?i)bar', '(?P<v>x)', '\\Qa)b'], deny: ['(?i)google', '(?P<v>y)', '(?m)^bot$'] })).toBeNull();
    // 32 bot names, case-insensitive, in each list.
    const bots = ['googlebot', 'bingbot', 'slurp', 'duckduckbot', 'baiduspider', 'yandexbot', 'sogou', 'exabot', 'facebot', 'ia_archiver', 'ahrefsbot', 'semrushbot', 'mj12bot', 'dotbot', 'petalbot', 'bytespider', 'gptbot', 'ccbot', 'claudebot', 'amazonbot', 'applebot', 'seznambot', 'curl', 'wget', 'python-requests', 'go-http-client', 'java/', 'okhttp', 'scrapy', 'httpclient', 'libwww', 'masscan'].map((w) => `(?i)${w}`);
    expect(await refusal({ allow: bots, deny: bots })).toBeNull();
  });
});
