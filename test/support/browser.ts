import http from 'node:http';
import https from 'node:https';
import { isIP } from 'node:net';

/**
 * A tiny scripted "browser" for end-to-end tests of sign-in flows: one request at a time over
 * node:http(s) with a trusted CA, a cookie jar (name, value, path, expiry; per host:port), and a
 * resolver that sends a hostname (e.g. an edge's) to a local port, keeping Host and SNI.
 */

export interface BrowserResponse {
  url: URL;
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
}

interface StoredCookie {
  value: string;
  path: string;
  expiresAt: number | null;
}

export class CookieJar {
  /** `host[:port]` → name → cookie. */
  private readonly hosts = new Map<string, Map<string, StoredCookie>>();

  /** Stores the Set-Cookie headers of a response to `url` (deletes on Max-Age ≤ 0 or a past Expires). */
  store(url: URL, setCookies: string[] | undefined): void {
    for (const line of setCookies ?? []) {
      const [pair, ...attrs] = line.split(';');
      const eq = pair!.indexOf('=');
      if (eq <= 0) continue;
      const name = pair!.slice(0, eq).trim();
      const value = pair!.slice(eq + 1).trim();
      let path = '/';
      let expiresAt: number | null = null;
      for (const a of attrs) {
        const [k, v = ''] = a.trim().split('=');
        const key = k!.toLowerCase();
        if (key === 'path') path = v || '/';
        else if (key === 'max-age') expiresAt = Date.now() + Number(v) * 1000;
        else if (key === 'expires' && expiresAt === null) expiresAt = Date.parse(a.trim().slice(8));
      }
      const jar = this.hosts.get(url.host) ?? new Map<string, StoredCookie>();
      this.hosts.set(url.host, jar);
      if (expiresAt !== null && expiresAt <= Date.now()) jar.delete(name);
      else jar.set(name, { value, path, expiresAt });
    }
  }

  /** The Cookie header for `url`, or undefined. */
  header(url: URL): string | undefined {
    const jar = this.hosts.get(url.host);
    if (!jar) return undefined;
    const parts: string[] = [];
    for (const [name, c] of jar) {
      if (c.expiresAt !== null && c.expiresAt <= Date.now()) continue;
      if (url.pathname === c.path || url.pathname.startsWith(c.path.endsWith('/') ? c.path : `${c.path}/`) || c.path === '/') parts.push(`${name}=${c.value}`);
    }
    return parts.length ? parts.join('; ') : undefined;
  }

  get(host: string, name: string): string | undefined {
    return this.hosts.get(host)?.get(name)?.value;
  }

  set(host: string, name: string, value: string, path = '/'): void {
    const jar = this.hosts.get(host) ?? new Map<string, StoredCookie>();
    this.hosts.set(host, jar);
    jar.set(name, { value, path, expiresAt: null });
  }

  delete(host: string, name: string): void {
    this.hosts.get(host)?.delete(name);
  }

  names(host: string): string[] {
    return [...(this.hosts.get(host)?.keys() ?? [])];
  }
}

export interface BrowserOptions {
  /** PEM CAs to trust for https. */
  ca: string | string[];
  /** Where a hostname really is: `host` → `127.0.0.1:port` (others connect as written). */
  resolve?: (url: URL) => { host: string; port: number } | null;
}

export class Browser {
  readonly jar = new CookieJar();

  constructor(private readonly opts: BrowserOptions) {}

  /** One request (no redirect following); cookies are sent from and stored in the jar. */
  request(url: string | URL, o: { method?: string; headers?: Record<string, string>; body?: string; cookies?: boolean } = {}): Promise<BrowserResponse> {
    const u = new URL(url);
    const target = this.opts.resolve?.(u) ?? { host: u.hostname, port: Number(u.port || (u.protocol === 'https:' ? 443 : 80)) };
    const headers: Record<string, string> = { host: u.host, accept: 'text/html,application/xhtml+xml', 'user-agent': 'warren-e2e-browser', ...o.headers };
    const cookie = o.cookies === false ? undefined : this.jar.header(u);
    if (cookie && headers.cookie === undefined) headers.cookie = cookie;
    if (o.body !== undefined) headers['content-length'] = String(Buffer.byteLength(o.body));
    const mod = u.protocol === 'https:' ? https : http;
    return new Promise((resolve, reject) => {
      const req = mod.request(
        { host: target.host, port: target.port, path: u.pathname + u.search, method: o.method ?? 'GET', headers, agent: false, ca: this.opts.ca, ...(isIP(u.hostname) ? {} : { servername: u.hostname }) },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () => {
            if (o.cookies !== false) this.jar.store(u, res.headers['set-cookie']);
            resolve({ url: u, status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') });
          });
          res.on('error', reject);
        },
      );
      req.setTimeout(15_000, () => req.destroy(new Error(`${u.href} timed out`)));
      req.on('error', reject);
      req.end(o.body);
    });
  }

  /**
   * Follows redirects from `url` (GET after 301/302/303), calling `onPage` for every non-redirect
   * answer that it may turn into the next request (a form post), until `onPage` returns null.
   * Returns every response in order.
   */
  async navigate(
    url: string | URL,
    onPage: (r: BrowserResponse) => { url: URL; method: string; body?: string; headers?: Record<string, string> } | null = () => null,
    maxSteps = 20,
  ): Promise<BrowserResponse[]> {
    const seen: BrowserResponse[] = [];
    let next: { url: URL; method: string; body?: string; headers?: Record<string, string> } | null = { url: new URL(url), method: 'GET' };
    while (next) {
      if (seen.length >= maxSteps) throw new Error(`more than ${maxSteps} steps: ${seen.map((r) => `${r.status} ${r.url.href}`).join(' → ')}`);
      const r = await this.request(next.url, { method: next.method, body: next.body, headers: next.headers });
      seen.push(r);
      if ([301, 302, 303, 307, 308].includes(r.status) && r.headers.location) {
        next = { url: new URL(r.headers.location, r.url), method: 'GET' };
        continue;
      }
      next = onPage(r);
    }
    return seen;
  }
}

/** The first `<form action=…>` of an HTML page with its hidden and given fields, as a POST to make. */
export function formPost(r: BrowserResponse, fields: Record<string, string> = {}): { url: URL; method: string; body: string; headers: Record<string, string> } | null {
  const form = /<form[^>]*action="([^"]*)"[^>]*>([\s\S]*?)<\/form>/i.exec(r.body);
  if (!form) return null;
  const values = new URLSearchParams();
  for (const m of form[2]!.matchAll(/<input[^>]*type="hidden"[^>]*name="([^"]+)"[^>]*value="([^"]*)"/gi)) values.set(m[1]!, m[2]!);
  for (const [k, v] of Object.entries(fields)) values.set(k, v);
  const action = form[1]!.replace(/&amp;/g, '&');
  return { url: new URL(action, r.url), method: 'POST', body: values.toString(), headers: { 'content-type': 'application/x-www-form-urlencoded' } };
}
