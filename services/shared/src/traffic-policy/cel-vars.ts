/**
 * The values traffic-policy expressions read, as lazy views: each field is computed on first
 * read and cached, so a request whose policy reads only `conn.client_ip` never builds a header
 * map or a URL. The classes are registered as CEL types in `cel.ts` (field access reads these
 * getters); the ingress builds one view per request.
 */

/** Raw `[name, value, …]` header pairs → lower-case name → values, in order. */
export function headerMap(pairs: readonly string[]): Map<string, string[]> {
  const m = new Map<string, string[]>();
  for (let i = 0; i + 1 < pairs.length; i += 2) {
    const name = pairs[i]!.toLowerCase();
    const list = m.get(name);
    if (list) list.push(pairs[i + 1]!);
    else m.set(name, [pairs[i + 1]!]);
  }
  return m;
}

/** All values of one header (`lowerName` already lower-case) straight from raw pairs. */
export function headerValues(pairs: readonly string[], lowerName: string): string[] {
  const out: string[] = [];
  for (let i = 0; i + 1 < pairs.length; i += 2) {
    const n = pairs[i]!;
    if (n.length === lowerName.length && n.toLowerCase() === lowerName) out.push(pairs[i + 1]!);
  }
  return out;
}

function queryParams(rawQuery: string): Map<string, string[]> {
  const m = new Map<string, string[]>();
  for (const [k, v] of new URLSearchParams(rawQuery)) {
    const list = m.get(k);
    if (list) list.push(v);
    else m.set(k, [v]);
  }
  return m;
}

/**
 * `req.url`: compares and concatenates as the full URL string (`req.url == 'https://…'`,
 * `req.url.startsWith(…)`), and has parts `req.url.path`, `.query`, … like ngrok's.
 */
export class CelUrl {
  private full?: string;
  private params?: Map<string, string[]>;
  constructor(
    readonly scheme: string,
    /** Host as the client wrote it, with a port when one was given. */
    readonly authority: string,
    readonly path: string,
    readonly raw_query: string,
  ) {}
  /** Host without port, lower-case. */
  get host(): string {
    return hostOnly(this.authority);
  }
  get query(): string {
    return this.raw_query;
  }
  get query_params(): Map<string, string[]> {
    return (this.params ??= queryParams(this.raw_query));
  }
  toString(): string {
    return (this.full ??= `${this.scheme}://${this.authority}${this.path}${this.raw_query ? `?${this.raw_query}` : ''}`);
  }
}

function hostOnly(authority: string): string {
  const a = authority.toLowerCase();
  if (a.startsWith('[')) {
    const end = a.indexOf(']');
    return end > 0 ? a.slice(0, end + 1) : a;
  }
  const colon = a.lastIndexOf(':');
  return colon >= 0 ? a.slice(0, colon) : a;
}

export interface CelRequestInit {
  method: string;
  scheme: 'http' | 'https';
  /** Lower-case host without port. */
  host: string;
  /** The Host header as sent (may carry a port); `host` when absent. */
  authority: string;
  path: string;
  /** The query without `?`, `""` when none. */
  rawQuery: string;
  /** The current request headers, raw pairs (read again after `headersChanged()`). */
  headers: () => readonly string[];
}

/** `req`. */
export class CelRequest {
  private h?: Map<string, string[]>;
  private u?: CelUrl;
  constructor(private readonly init: CelRequestInit) {}
  get method(): string {
    return this.init.method;
  }
  get host(): string {
    return this.init.host;
  }
  get path(): string {
    return this.init.path;
  }
  get query(): string {
    return this.init.rawQuery;
  }
  get url(): CelUrl {
    return (this.u ??= new CelUrl(this.init.scheme, this.init.authority, this.init.path, this.init.rawQuery));
  }
  get headers(): Map<string, string[]> {
    return (this.h ??= headerMap(this.init.headers()));
  }
  get user_agent(): string {
    return this.headers.get('user-agent')?.[0] ?? '';
  }
  /** Values of one header, case-insensitive; `[]` when absent (for `getReqHeader`, bucket keys). */
  header(name: string): string[] {
    const lower = name.toLowerCase();
    return this.h ? (this.h.get(lower) ?? []) : headerValues(this.init.headers(), lower);
  }
  /** Call after editing the request headers so later expressions see the edit. */
  headersChanged(): void {
    this.h = undefined;
  }
}

/** `conn`. */
export class CelConn {
  constructor(
    readonly client_ip: string,
    private readonly port: number,
  ) {}
  get server_port(): bigint {
    return BigInt(this.port);
  }
}

export interface CelResponseInit {
  status: () => number;
  headers: () => readonly string[];
}

/** `res` (outbound rules only). */
export class CelResponse {
  private h?: Map<string, string[]>;
  constructor(private readonly init: CelResponseInit) {}
  get status_code(): bigint {
    return BigInt(this.init.status());
  }
  get headers(): Map<string, string[]> {
    return (this.h ??= headerMap(this.init.headers()));
  }
  header(name: string): string[] {
    const lower = name.toLowerCase();
    return this.h ? (this.h.get(lower) ?? []) : headerValues(this.init.headers(), lower);
  }
  headersChanged(): void {
    this.h = undefined;
  }
}

/** `actions.<ngrok|service>.rate_limit.error`. */
export class CelRateLimitError {
  code = '';
  message = '';
}

/** `actions.<ngrok|service>.rate_limit`: the last rate-limit action's result (mutable). */
export class CelRateLimit {
  bucket_key = '';
  limited = false;
  readonly error = new CelRateLimitError();
}

export class CelActionResults {
  constructor(readonly rate_limit: CelRateLimit) {}
}

/**
 * `actions`: one result object under both names, so `actions.ngrok.rate_limit.limited` and
 * `actions.service.rate_limit.limited` always agree. Before any rate-limit action ran: empty
 * key, not limited, empty error.
 */
export class CelActions {
  readonly ngrok: CelActionResults;
  readonly service: CelActionResults;
  constructor() {
    this.ngrok = this.service = new CelActionResults(new CelRateLimit());
  }
}

/** `time`: `time.now` is read when used. */
export class CelTime {
  get now(): Date {
    return new Date();
  }
}

export const CEL_TIME = new CelTime();
