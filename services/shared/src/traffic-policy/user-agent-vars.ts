import { UAParser } from 'ua-parser-js';
import { isbotMatch } from 'isbot';

/**
 * `req.user_agent` (https://ngrok.com/docs/traffic-policy/variables/req/): compares, concatenates
 * and matches as the `User-Agent` header (the first one; `""` without one), with ngrok's parsed
 * fields `name`, `version`, `os`, `os_version`, `device`, `is_mobile`, `is_tablet`,
 * `is_desktop`, `is_bot` and `url`. ngrok's field set is that of Go's
 * github.com/mileusna/useragent; Warren parses with ua-parser-js (browsers, systems, devices)
 * and isbot (crawlers and tools) and writes the results with that package's names: `Chrome`,
 * `Edge`, `Firefox`, `Safari` (also on iOS), `Opera`, `Opera Mini`, `Internet Explorer`,
 * `Headless Chrome`, …; `Windows`, `macOS`, `iOS`, `Android`, `Linux`, `ChromeOS`, …; a bot's
 * own name (`Googlebot`, `bingbot`, `curl`, …) and the URL it gives (`+http://…`).
 *
 * Parsed when a field is first read, from at most `MAX_USER_AGENT_PARSED` characters (real ones
 * are 100–250; a longer header is parsed from its start, which bounds the parse: it grows faster
 * than the length), and kept per string in a small cache, since a site sees the same few agents
 * again and again.
 */
export const MAX_USER_AGENT_PARSED = 384;

/** What `req.user_agent`'s fields read. */
export interface ParsedUserAgent {
  readonly name: string;
  readonly version: string;
  readonly os: string;
  readonly os_version: string;
  readonly device: string;
  readonly is_mobile: boolean;
  readonly is_tablet: boolean;
  readonly is_desktop: boolean;
  readonly is_bot: boolean;
  readonly url: string;
}

/** ua-parser-js's browser names where ngrok's (mileusna/useragent's) differ. */
const BROWSER_NAMES: Readonly<Record<string, string>> = {
  'Mobile Safari': 'Safari',
  'Chrome WebView': 'Chrome',
  'Chrome Headless': 'Headless Chrome',
  'Mobile Chrome': 'Chrome',
  'Mobile Firefox': 'Firefox',
  IE: 'Internet Explorer',
  IEMobile: 'Internet Explorer',
  'Opera Touch': 'Opera Touch',
  'Opera Mobi': 'Opera',
  Facebook: 'Facebook App',
  Instagram: 'Instagram App',
  TikTok: 'TikTok App',
};

/** ua-parser-js's system names where ngrok's differ. */
const OS_NAMES: Readonly<Record<string, string>> = {
  'Mac OS': 'macOS',
  macOS: 'macOS',
  'Chromium OS': 'ChromeOS',
  'Chrome OS': 'ChromeOS',
};

/** Systems whose agents are desktops unless they say otherwise. */
const DESKTOP_OS = new Set(['Windows', 'macOS', 'Linux', 'ChromeOS', 'FreeBSD', 'OpenBSD', 'NetBSD', 'Ubuntu', 'Debian', 'Fedora', 'Solaris']);

/** `+http://…` or a bare URL in the agent (bots name a page about themselves). */
const URL_IN_AGENT = /https?:\/\/[^\s;)"']+/;

const NO_USER_AGENT: ParsedUserAgent = { name: '', version: '', os: '', os_version: '', device: '', is_mobile: false, is_tablet: false, is_desktop: false, is_bot: false, url: '' };

/** The `User-Agent` value's fields (see the module comment). */
export function parseUserAgent(raw: string): ParsedUserAgent {
  if (raw === '') return NO_USER_AGENT;
  const ua = raw.length > MAX_USER_AGENT_PARSED ? raw.slice(0, MAX_USER_AGENT_PARSED) : raw;
  const r = new UAParser(ua).getResult();
  const bot = isbotMatch(ua);
  const os = r.os.name ? (OS_NAMES[r.os.name] ?? r.os.name) : '';
  const type = r.device.type;
  const is_mobile = type === 'mobile' || (bot !== null && / Mobile\b/.test(ua));
  const is_tablet = type === 'tablet';
  let name = r.browser.name ? (BROWSER_NAMES[r.browser.name] ?? r.browser.name) : '';
  let version = r.browser.version ?? '';
  if (bot !== null) {
    // The bot's own product (`Googlebot/2.1`, `curl/8.5.0`), not the browser it imitates: the
    // token isbot matched in, and the version after its `/`.
    const product = productAt(ua, ua.toLowerCase().indexOf(bot.toLowerCase()));
    name = product?.name ?? bot;
    version = product?.version ?? '';
  } else if (!name) {
    // A tool (`curl/8.5.0`, `python-requests/2.31`): its first product.
    const m = /^([\w.-]+)\/([\w.]+)/.exec(ua);
    if (m) {
      name = m[1]!;
      version = m[2]!;
    }
  }
  return {
    name,
    version,
    os,
    os_version: r.os.version ?? '',
    device: r.device.model ?? '',
    is_mobile,
    is_tablet,
    is_desktop: !is_mobile && !is_tablet && bot === null && DESKTOP_OS.has(os) && type === undefined,
    is_bot: bot !== null,
    url: URL_IN_AGENT.exec(ua)?.[0] ?? '',
  };
}

const isTokenChar = (c: number) => (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5a) || (c >= 0x61 && c <= 0x7a) || c === 0x2d || c === 0x2e || c === 0x5f;

/** The product token (`name/version`) around index `at` of `ua`; null when `at` is -1. */
function productAt(ua: string, at: number): { name: string; version: string } | null {
  if (at < 0) return null;
  let a = at;
  while (a > 0 && isTokenChar(ua.charCodeAt(a - 1))) a--;
  let b = at;
  while (b < ua.length && isTokenChar(ua.charCodeAt(b))) b++;
  let version = '';
  if (ua.charCodeAt(b) === 0x2f /* / */) {
    let v = b + 1;
    while (v < ua.length && isTokenChar(ua.charCodeAt(v))) v++;
    version = ua.slice(b + 1, v);
  }
  return { name: ua.slice(a, b), version };
}

/** Parsed agents kept (each a few hundred bytes): a site's common agents are parsed once. */
const CACHE_SIZE = 1024;
const cache = new Map<string, ParsedUserAgent>();

/** {@link parseUserAgent} through the cache (least recently used out first), keyed by what is parsed. */
export function userAgentOf(raw: string): ParsedUserAgent {
  const key = raw.length > MAX_USER_AGENT_PARSED ? raw.slice(0, MAX_USER_AGENT_PARSED) : raw;
  let p = cache.get(key);
  if (p) {
    cache.delete(key);
    cache.set(key, p);
    return p;
  }
  p = parseUserAgent(key);
  if (cache.size >= CACHE_SIZE) cache.delete(cache.keys().next().value!);
  cache.set(key, p);
  return p;
}

/** `req.user_agent`: the header as a string (`toString`), its parsed fields when read. */
export class CelUserAgent {
  private p?: ParsedUserAgent;
  constructor(readonly raw: string) {}
  toString(): string {
    return this.raw;
  }
  private get parsed(): ParsedUserAgent {
    return (this.p ??= userAgentOf(this.raw));
  }
  get name(): string {
    return this.parsed.name;
  }
  get version(): string {
    return this.parsed.version;
  }
  get os(): string {
    return this.parsed.os;
  }
  get os_version(): string {
    return this.parsed.os_version;
  }
  get device(): string {
    return this.parsed.device;
  }
  get is_mobile(): boolean {
    return this.parsed.is_mobile;
  }
  get is_tablet(): boolean {
    return this.parsed.is_tablet;
  }
  get is_desktop(): boolean {
    return this.parsed.is_desktop;
  }
  get is_bot(): boolean {
    return this.parsed.is_bot;
  }
  get url(): string {
    return this.parsed.url;
  }
}
