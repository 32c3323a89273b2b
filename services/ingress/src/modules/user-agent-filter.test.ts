import { describe, expect, it } from 'vitest';
import { userAgentFilterStage } from './user-agent-filter.js';
import { makeState, stageFor } from './testing.js';

async function status(mod: Record<string, unknown>, ua: string | null): Promise<number> {
  const s = stageFor(userAgentFilterStage, { user_agent_filter: mod })!;
  const out = await s.onRequest!(makeState({ headers: ua === null ? ['Host', 'a.test'] : ['Host', 'a.test', 'User-Agent', ua] }));
  return out ? out.status : 200;
}

describe('user_agent_filter', () => {
  it('is absent when missing, disabled or empty', () => {
    expect(stageFor(userAgentFilterStage, {})).toBeNull();
    expect(stageFor(userAgentFilterStage, { user_agent_filter: { enabled: false, allow: [], deny: ['.*'] } })).toBeNull();
    expect(stageFor(userAgentFilterStage, { user_agent_filter: { enabled: true, allow: [], deny: [] } })).toBeNull();
  });

  it('denies matching user agents (unanchored match)', async () => {
    const m = { enabled: true, allow: [], deny: ['curl/', '(?i)python-requests'] };
    expect(await status(m, 'curl/8.4.0')).toBe(403);
    expect(await status(m, 'Python-Requests/2.31')).toBe(403);
    expect(await status(m, 'Mozilla/5.0')).toBe(200);
    expect(await status(m, null)).toBe(200);
  });

  it('with allow rules, denies user agents matching none', async () => {
    const m = { enabled: true, allow: ['^Mozilla/5\\.0 '], deny: [] };
    expect(await status(m, 'Mozilla/5.0 (X11)')).toBe(200);
    expect(await status(m, 'curl/8')).toBe(403);
    expect(await status(m, null)).toBe(403);
  });

  it('deny wins over allow', async () => {
    const m = { enabled: true, allow: ['Mozilla'], deny: ['(?i)bot'] };
    expect(await status(m, 'Mozilla/5.0 Googlebot')).toBe(403);
    expect(await status(m, 'Mozilla/5.0')).toBe(200);
  });

  it('answers 403 with ERR_WARREN_7101', async () => {
    const s = stageFor(userAgentFilterStage, { user_agent_filter: { enabled: true, allow: [], deny: ['x'] } })!;
    const out = (await s.onRequest!(makeState({ headers: ['User-Agent', 'x'] })))!;
    expect(out.headers!['warren-error-code']).toBe('ERR_WARREN_7101');
  });

  it('refuses a pattern that does not compile', () => {
    expect(() => stageFor(userAgentFilterStage, { user_agent_filter: { enabled: true, allow: ['('], deny: [] } })).toThrow(/user_agent_filter/);
  });
});
