import { describe, expect, it } from 'vitest';
import { CEL_TIME, CelActions, CelConn, CelRequest } from './cel-vars.js';
import { compileExpression } from './cel.js';
import { MAX_USER_AGENT_PARSED, parseUserAgent, userAgentOf } from './user-agent-vars.js';

const on = (expr: string, ua?: string): unknown => {
  const headers = ua === undefined ? [] : ['User-Agent', ua];
  const req = new CelRequest({ method: 'GET', scheme: 'https', host: 'h', authority: 'h', path: '/', rawQuery: '', headers: () => headers });
  return compileExpression('inbound', expr, false)({ req, conn: new CelConn('203.0.113.7', 443), actions: new CelActions(), time: CEL_TIME });
};

const EDGE = 'Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36 Edg/120.0.2210.91';
const IPHONE = 'Mozilla/5.0 (iPhone; CPU iPhone OS 10_3_2 like Mac OS X) AppleWebKit/603.2.4 (KHTML, like Gecko) Version/10.0 Mobile/14F89 Safari/602.1';
const IPAD = 'Mozilla/5.0 (iPad; CPU OS 10_3_2 like Mac OS X) AppleWebKit/603.2.4 (KHTML, like Gecko) Version/10.0 Mobile/14F89 Safari/602.1';
const MAC = 'Mozilla/5.0 (Macintosh; Intel Mac OS X 10_12_6) AppleWebKit/603.3.8 (KHTML, like Gecko) Version/10.1.2 Safari/603.3.8';
const ANDROID = 'Mozilla/5.0 (Linux; Android 4.3; GT-I9300 Build/JSS15J) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/59.0.3071.125 Mobile Safari/537.36';
const FIREFOX = 'Mozilla/5.0 (X11; Linux x86_64; rv:121.0) Gecko/20100101 Firefox/121.0';
const GOOGLEBOT = 'Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)';
const GOOGLEBOT_PHONE = 'Mozilla/5.0 (Linux; Android 6.0.1; Nexus 5X Build/MMB29P) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/41.0.2272.96 Mobile Safari/537.36 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)';

describe('req.user_agent: the header as a string, with the fields ngrok parses', () => {
  it('browsers: name and version, system and its version, device, and the kind of device', () => {
    expect(parseUserAgent(EDGE)).toEqual({ name: 'Edge', version: '120.0.2210.91', os: 'Windows', os_version: '10', device: '', is_mobile: false, is_tablet: false, is_desktop: true, is_bot: false, url: '' });
    expect(parseUserAgent(IPHONE)).toMatchObject({ name: 'Safari', version: '10.0', os: 'iOS', os_version: '10.3.2', device: 'iPhone', is_mobile: true, is_tablet: false, is_desktop: false, is_bot: false });
    expect(parseUserAgent(IPAD)).toMatchObject({ name: 'Safari', os: 'iOS', device: 'iPad', is_mobile: false, is_tablet: true, is_desktop: false });
    expect(parseUserAgent(MAC)).toMatchObject({ name: 'Safari', version: '10.1.2', os: 'macOS', os_version: '10.12.6', is_desktop: true });
    expect(parseUserAgent(ANDROID)).toMatchObject({ name: 'Chrome', version: '59.0.3071.125', os: 'Android', os_version: '4.3', device: 'GT-I9300', is_mobile: true, is_desktop: false });
    expect(parseUserAgent(FIREFOX)).toMatchObject({ name: 'Firefox', version: '121.0', os: 'Linux', is_desktop: true });
  });

  it("bots and tools: the bot's own name and version, its URL; a mobile crawler is mobile too", () => {
    expect(parseUserAgent(GOOGLEBOT)).toMatchObject({ name: 'Googlebot', version: '2.1', is_bot: true, is_desktop: false, is_mobile: false, url: 'http://www.google.com/bot.html' });
    expect(parseUserAgent(GOOGLEBOT_PHONE)).toMatchObject({ name: 'Googlebot', version: '2.1', is_bot: true, is_mobile: true, url: 'http://www.google.com/bot.html' });
    expect(parseUserAgent('curl/8.5.0')).toMatchObject({ name: 'curl', version: '8.5.0', is_bot: true, is_desktop: false });
    expect(parseUserAgent('python-requests/2.31.0')).toMatchObject({ name: 'python-requests', version: '2.31.0', is_bot: true });
    // Not a browser, not a known bot: its first product.
    expect(parseUserAgent('AcmeSync/4.2 (build 17)')).toMatchObject({ name: 'AcmeSync', version: '4.2', is_bot: false, is_desktop: false });
  });

  it("ngrok's examples: a rule on the name, and one denying bots", () => {
    expect(on("req.user_agent.name == 'Edge'", EDGE)).toBe(true);
    expect(on("req.user_agent.name == 'Edge'", FIREFOX)).toBe(false);
    expect(on('req.user_agent.is_bot', GOOGLEBOT)).toBe(true);
    expect(on('req.user_agent.is_bot', IPHONE)).toBe(false);
    expect(on("req.user_agent.os == 'iOS' && req.user_agent.is_mobile && req.user_agent.device == 'iPhone'", IPHONE)).toBe(true);
  });

  it('is still the header as a string: compares, concatenates, matches, and reads "" without one', () => {
    expect(on("req.user_agent == 'curl/8.5.0'", 'curl/8.5.0')).toBe(true);
    expect(on("req.user_agent != 'curl/8'", 'curl/8.5.0')).toBe(true);
    expect(on("req.user_agent.startsWith('curl/') && req.user_agent.contains('8.5') && req.user_agent.matches('(?i)^CURL/')", 'curl/8.5.0')).toBe(true);
    expect(on("'ua: ' + req.user_agent", 'curl/8.5.0')).toBe('ua: curl/8.5.0');
    expect(on('size(req.user_agent)', 'curl/8.5.0')).toBe(10n);
    expect(on("req.user_agent.lower() == 'curl/8.5.0'", 'CURL/8.5.0')).toBe(true);
    expect(on("req.user_agent == '' && req.user_agent.name == '' && !req.user_agent.is_bot && !req.user_agent.is_desktop")).toBe(true);
  });

  it(`parses at most ${MAX_USER_AGENT_PARSED} characters, and keeps what it parsed per string`, () => {
    const long = EDGE + ' x'.repeat(5000);
    const t = performance.now();
    expect(parseUserAgent(long)).toMatchObject({ name: 'Edge', os: 'Windows' });
    expect(performance.now() - t).toBeLessThan(200);
    expect(on("size(req.user_agent) > 10000 && req.user_agent.name == 'Edge'", long)).toBe(true);
    expect(userAgentOf(IPHONE)).toBe(userAgentOf(IPHONE));
    // A long agent is kept under what was parsed: many tails, one entry.
    expect(userAgentOf(`${EDGE}${' y'.repeat(300)}a`)).toBe(userAgentOf(`${EDGE}${' y'.repeat(300)}b`));
  });
});
