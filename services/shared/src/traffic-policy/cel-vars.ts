import { headerText } from '../http-headers.js';
import { certificatePem, checkCertificateSize, parseCertificate, type ParsedCertificate, type ParsedName, type ParsedSan } from './x509.js';
import { CelUrlActionResult } from './url-action-vars.js';
import { CelJwtValidation } from './jwt-action-vars.js';
import { CelCompress, CelVerifyWebhook } from './body-action-vars.js';
import { CEL_NO_GEO, type CelGeo } from './geo-vars.js';
import { CelOAuth, CelOidc } from './auth-action-vars.js';
import { CelCookie, requestCookie, requestCookies, responseCookie, responseCookies } from './cookie-vars.js';
import { CelUserAgent } from './user-agent-vars.js';
import { parseQueryValues } from './ngrok-macros.js';
export { MAX_REQUEST_COOKIES } from './cookie-vars.js';

/**
 * The values traffic-policy expressions read, as lazy views: each field is computed on first
 * read and cached, so a request whose policy reads only `conn.client_ip` never builds a header
 * map or a URL. The classes are registered as CEL types in `cel.ts` (field access reads these
 * getters); the ingress builds one view per request.
 */

const mapGet = Map.prototype.get;
const mapHas = Map.prototype.has;

/** `Map.get` / `Map.has` that try the lower-case key when the key as given is absent. */
const anyCase: PropertyDescriptorMap = {
  get: {
    value(this: Map<string, string[]>, name: unknown) {
      const v = mapGet.call(this, name);
      return v !== undefined || typeof name !== 'string' ? v : mapGet.call(this, name.toLowerCase());
    },
  },
  has: {
    value(this: Map<string, string[]>, name: unknown) {
      return mapHas.call(this, name) || (typeof name === 'string' && mapHas.call(this, name.toLowerCase()));
    },
  },
};

/**
 * Raw `[name, value, …]` header pairs → lower-case name → values, in order: `req.headers` /
 * `res.headers`, as ngrok's ("a map of lower-case names to values"), but read in any case:
 * `req.headers['X-User']` and `'X-User' in req.headers` find `x-user` (header names are
 * case-insensitive; with only lower-case keys the lookup is a "no such key" evaluation error and
 * the rule never applies, while bucket keys and `getReqHeader()` take any case). Iteration,
 * `size()` and equality see the lower-case keys. A plain `Map` (cel-js types values by their
 * constructor) with its own `get` and `has`. Values are UTF-8 text (`headerText`), as ngrok
 * reads them, not one character per byte as Node holds them.
 */
export function headerMap(pairs: readonly string[]): Map<string, string[]> {
  const m = Object.defineProperties(new Map<string, string[]>(), anyCase);
  for (let i = 0; i + 1 < pairs.length; i += 2) {
    const name = pairs[i]!.toLowerCase();
    const list = m.get(name);
    const value = headerText(pairs[i + 1]!);
    if (list) list.push(value);
    else m.set(name, [value]);
  }
  return m;
}

/** All values of one header (`lowerName` already lower-case) straight from raw pairs, as UTF-8 text. */
export function headerValues(pairs: readonly string[], lowerName: string): string[] {
  const out: string[] = [];
  for (let i = 0; i + 1 < pairs.length; i += 2) {
    const n = pairs[i]!;
    if (n.length === lowerName.length && n.toLowerCase() === lowerName) out.push(headerText(pairs[i + 1]!));
  }
  return out;
}

/** Whether raw pairs hold the header `lowerName` (already lower-case), even with an empty value. */
export function hasHeaderIn(pairs: readonly string[], lowerName: string): boolean {
  for (let i = 0; i + 1 < pairs.length; i += 2) {
    const n = pairs[i]!;
    if (n.length === lowerName.length && n.toLowerCase() === lowerName) return true;
  }
  return false;
}

/** `req.url.query_params`: the query as Go's `url.ParseQuery` reads it (`parseQueryValues`). */
const queryParams = parseQueryValues;

/**
 * `req.url`: compares and concatenates as the full URL string (`req.url == 'https://…'`,
 * `req.url.startsWith(…)`), and has parts `req.url.path`, `.query`, … like ngrok's. It is ngrok's
 * "normalized full URL": the authority is normalised (`normalizeAuthority`), so
 * `Host: ADMIN.example.com:443` gives `https://admin.example.com/…` and a rule on
 * `req.url.startsWith('https://admin.example.com/')` cannot be passed by the spelling of `Host`.
 */
export class CelUrl {
  private full?: string;
  private params?: Map<string, string[]>;
  constructor(
    readonly scheme: string,
    /** The normalised authority: lower-case host (IPv6 in brackets), and the port unless it is the scheme's default. */
    readonly authority: string,
    readonly path: string,
    readonly raw_query: string,
    /** `Host` as the client sent it (`req.url.raw`); the normalised authority when not given. */
    private readonly rawAuthority: string = authority,
    /**
     * The request target as the client sent it, before the ingress normalised it (`req.url.raw`,
     * `.raw_path`): origin-form (`/a/../b?q`) or absolute-form (`http://host/a`). When not
     * given, the path and query.
     */
    private readonly rawTarget?: string,
  ) {}
  /** Host without port, lower-case (an IPv6 address keeps its brackets). */
  get host(): string {
    return hostOnly(this.authority);
  }
  get query(): string {
    return this.raw_query;
  }
  get query_params(): Map<string, string[]> {
    return (this.params ??= queryParams(this.raw_query));
  }
  /**
   * ngrok's `req.url.port` (an int): the port the URL names, the scheme's default (443, 80)
   * when `Host` names none, so `Host: x` and `Host: x:443` give the same 443.
   */
  get port(): bigint {
    const a = this.authority;
    const colon = a.lastIndexOf(':');
    if (colon > a.lastIndexOf(']')) {
      const p = Number(a.slice(colon + 1));
      if (Number.isInteger(p)) return BigInt(p);
    }
    return this.scheme === 'https' ? 443n : this.scheme === 'http' ? 80n : 0n;
  }
  /**
   * ngrok's `req.url.raw`, "the un-normalized full URL": the scheme, `Host` as sent and the
   * request target as sent (an absolute-form target as it is). Not for access rules: its
   * spelling is the client's (`/%61dmin`, `/x/../admin`, `ADMIN.example.com`); `req.url` is
   * what routing and the upstream see.
   */
  get raw(): string {
    const t = this.rawTarget;
    if (t === undefined) return `${this.scheme}://${this.rawAuthority}${this.path}${this.raw_query ? `?${this.raw_query}` : ''}`;
    return t.charCodeAt(0) === 0x2f /* / */ || t === '*' ? `${this.scheme}://${this.rawAuthority}${t}` : t;
  }
  /** ngrok's `req.url.raw_path`: the path of the request target as sent (no query), with its leading `/`. */
  get raw_path(): string {
    const t = this.rawTarget;
    if (t === undefined) return this.path;
    let from = 0;
    if (t.charCodeAt(0) !== 0x2f && t !== '*') {
      // Absolute-form: the path after `scheme://authority`.
      const slashes = t.indexOf('//');
      const start = slashes < 0 ? -1 : t.indexOf('/', slashes + 2);
      const q = t.indexOf('?');
      if (start < 0 || (q >= 0 && q < start)) return '/';
      from = start;
    }
    const q = t.indexOf('?', from);
    return q < 0 ? (from === 0 ? t : t.slice(from)) : t.slice(from, q);
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

/** An authority that `normalizeAuthority` may change: an upper-case letter, a port (or IPv6), a trailing dot. */
const MAY_NEED_NORMALISING = /[A-Z:]|\.$/;
const PORT_RE = /^\d{1,5}$/;

/**
 * `Host` as `req.url` shows it: the host lower-case and without a trailing dot (as the ingress
 * routes it: `Admin.Example.com.` reaches the same edge as `admin.example.com`), an IPv6 address
 * in brackets, and the port only when it is not the scheme's default (80 for http, 443 for
 * https; `:0443` is 443), written without leading zeros. Per request, only when `req.url` is
 * read; a lower-case host without a port (the usual `Host`) is returned as is after one regexp
 * test.
 */
export function normalizeAuthority(scheme: string, authority: string): string {
  if (!MAY_NEED_NORMALISING.test(authority)) return authority;
  const a = authority.toLowerCase();
  const close = a.charCodeAt(0) === 0x5b /* [ */ ? a.indexOf(']') : -1;
  const colon = a.lastIndexOf(':');
  let host = a;
  let port = '';
  if (colon > close && (close >= 0 || a.indexOf(':') === colon)) {
    host = a.slice(0, colon);
    port = a.slice(colon + 1);
  }
  if (close < 0 && host.length > 1 && host.endsWith('.')) host = host.slice(0, -1);
  if (PORT_RE.test(port)) {
    const n = Number(port);
    port = n === (scheme === 'https' ? 443 : scheme === 'http' ? 80 : -1) ? '' : String(n);
  }
  return port === '' ? host : `${host}:${port}`;
}

export interface CelRequestInit {
  method: string;
  scheme: 'http' | 'https';
  /** Lower-case host without port. */
  host: string;
  /**
   * The Host header as sent (may carry a port); `host` when absent. `req.url` shows it
   * normalised (`normalizeAuthority`), when it is read.
   */
  authority: string;
  /**
   * The authority `req.url` shows, computed when it is first read: the ingress gives the host as
   * routed and the port the edge served (not one the client made up); without it, `authority`
   * normalised (`normalizeAuthority`).
   */
  servedAuthority?: () => string;
  path: string;
  /** The query without `?`, `""` when none. */
  rawQuery: string;
  /** The current request headers, raw pairs (read again after `headersChanged()`). */
  headers: () => readonly string[];
  /**
   * The request as received (the ingress passes Node's `IncomingMessage`): `req.version` and
   * `req.content_length` read it, only when an expression reads them. Without it, `req.version`
   * is `""` and `req.content_length` is read from `headers`.
   */
  message?: CelRequestMessage;
  /**
   * The request target exactly as the client sent it (`req.url.raw`, `.raw_path`), before the
   * ingress normalised it; the path and query when not given.
   */
  rawTarget?: string;
  /**
   * When the request head was received, in `performance.now()` milliseconds
   * (`req.ts.header_received`); without it, reading that is an evaluation error.
   */
  receivedAt?: number;
}

/** What `req` reads off the request as received; Node's `http.IncomingMessage` is one. */
export interface CelRequestMessage {
  readonly httpVersion: string;
  readonly headers: { readonly [name: string]: string | string[] | undefined };
}

/** CEL's largest int (int64): a length beyond it reads as this. */
const MAX_INT64 = (1n << 63n) - 1n;
const DIGITS_RE = /^\d+$/;

/**
 * A body length from `Content-Length` (`cl`): its value when it is one (Node's parser has
 * checked a request's); else -1 when there is a body of unknown length (`unknown`: sent chunked,
 * or a response read to its end), as Go's `ContentLength` says it, and 0 when there is none.
 */
function contentLength(cl: string | undefined, unknown: boolean): bigint {
  const v = cl?.trim();
  if (v && DIGITS_RE.test(v)) {
    const n = BigInt(v);
    return n > MAX_INT64 ? MAX_INT64 : n;
  }
  return unknown ? -1n : 0n;
}

/**
 * Longest `Content-Type` whose parameters are read (`parameters` of a longer one is an evaluation
 * error), which bounds what reading them costs (`cost.ts`). Real ones are under a few hundred
 * characters (a multipart boundary is at most 70).
 */
export const MAX_CONTENT_TYPE_PARSED = 4096;

/**
 * `req.content_type` / `res.content_type`: compares and concatenates as the media type of the
 * `Content-Type` header (`application/json` for `Application/JSON; charset=utf-8`), with ngrok's
 * fields `raw` (the header as sent) and `parameters` (lower-case name → value, quotes removed).
 * Read as Go's `mime.ParseMediaType` reads it: a media type that is not `type/subtype` (tokens)
 * or a bare token is `""`; parameters that do not parse (or a repeated name) leave `parameters`
 * empty. `""` and no parameters without the header (the first one counts when several were sent).
 */
export class CelContentType {
  private media?: string;
  private params?: Map<string, string>;
  constructor(readonly raw: string) {}
  get parameters(): Map<string, string> {
    if (!this.params) {
      if (this.raw.length > MAX_CONTENT_TYPE_PARSED) throw new Error(`content_type.parameters: the Content-Type is too long to read (${this.raw.length} characters, at most ${MAX_CONTENT_TYPE_PARSED})`);
      this.parse();
    }
    return this.params!;
  }
  toString(): string {
    if (this.media === undefined) {
      const semi = this.raw.indexOf(';');
      const base = (semi < 0 ? this.raw : this.raw.slice(0, semi)).trim().toLowerCase();
      this.media = MEDIA_TYPE_RE.test(base) ? base : '';
    }
    return this.media;
  }
  private parse(): void {
    const m = new Map<string, string>();
    this.params = m;
    if (this.toString() === '') return;
    const v = this.raw;
    let i = v.indexOf(';');
    if (i < 0) return;
    while (i < v.length) {
      PARAM_RE.lastIndex = i;
      const p = PARAM_RE.exec(v);
      if (!p) {
        // Trailing `;` and spaces are allowed; anything else voids the parameters.
        if (!/^[\s;]*$/.test(v.slice(i))) m.clear();
        return;
      }
      const name = p[1]!.toLowerCase();
      if (m.has(name)) {
        m.clear();
        return;
      }
      m.set(name, p[2] !== undefined ? p[2].replace(/\\(.)/g, '$1') : p[3]!);
      i = PARAM_RE.lastIndex;
    }
  }
}

const TOKEN = "[!#$%&'*+\\-.^_`|~0-9A-Za-z]+";
const MEDIA_TYPE_RE = new RegExp(`^${TOKEN}(?:/${TOKEN})?$`);
/** `; name=value` (a token, or a quoted string with `\` escapes), after any spaces. */
const PARAM_RE = new RegExp(`\\s*;\\s*(${TOKEN})\\s*=\\s*(?:"((?:[^"\\\\]|\\\\.)*)"|(${TOKEN}))`, 'y');

/** A `Content-Type` view over no header. */
const NO_CONTENT_TYPE = new CelContentType('');

/**
 * Most codings `content_encoding` lists: a message that names more is not read (reading it is an
 * evaluation error), which bounds the list a policy iterates (`cost.ts`). A real one names one
 * or two.
 */
export const MAX_CONTENT_CODINGS = 32;

/**
 * `req.content_encoding` / `res.content_encoding`: the codings the `Content-Encoding` headers list,
 * in order (`gzip, br` → `['gzip', 'br']`), each trimmed and lower-cased (codings are
 * case-insensitive, RFC 9110 §8.4.1, so `'gzip' in res.content_encoding` holds for `GZIP`); empty
 * items dropped; `[]` without the header. Throws past `MAX_CONTENT_CODINGS`.
 */
export function contentEncodings(values: readonly string[], side: 'req' | 'res'): string[] {
  const out: string[] = [];
  for (const v of values) {
    let at = 0;
    while (at <= v.length) {
      let end = v.indexOf(',', at);
      if (end < 0) end = v.length;
      // Trimmed of spaces and tabs (OWS) by index: an empty part costs no string.
      let a = at;
      let b = end;
      while (a < b && (v.charCodeAt(a) === 0x20 || v.charCodeAt(a) === 0x09)) a++;
      while (b > a && (v.charCodeAt(b - 1) === 0x20 || v.charCodeAt(b - 1) === 0x09)) b--;
      if (a < b) {
        if (out.length === MAX_CONTENT_CODINGS) throw new Error(`${side}.content_encoding: Content-Encoding names more than ${MAX_CONTENT_CODINGS} codings`);
        out.push(v.slice(a, b).toLowerCase());
      }
      at = end + 1;
    }
  }
  return out;
}

/** `req.ts`: ngrok's request timestamps (only `header_received` is known here). */
export class CelRequestTimestamps {
  constructor(private readonly receivedAt: number | undefined) {}
  /** When the ingress had the request's head (Node's parser finished it), as a wall-clock time. */
  get header_received(): Date {
    if (this.receivedAt === undefined) throw new Error('req.ts.header_received is not known for this request');
    return new Date(performance.timeOrigin + this.receivedAt);
  }
}

/** `tchar` (RFC 9110): the characters of an HTTP token, which a cookie name must be. */
/**
 * The header and cookie lookups `req` and `res` share (the macros `get/hasReqHeader`,
 * `get/hasResHeader`, `get/hasReqCookie`, `get/hasResCookie`): a header read from the raw pairs
 * until the map is built, a cookie read once per name until the headers change. The CEL fields
 * themselves stay on each class.
 */
abstract class CelHeaderView {
  protected h?: Map<string, string[]>;
  private ck?: Map<string, CelCookie>;
  private ce?: string[];
  /** `req` or `res`, for messages. */
  protected abstract readonly side: 'req' | 'res';
  /** The raw header pairs (name, value, …) as they stand. */
  protected abstract pairs(): readonly string[];
  /** The cookie `name` as this side reads it (`requestCookie` / `responseCookie`). */
  protected abstract readCookie(name: string): CelCookie;
  protected headersMap(): Map<string, string[]> {
    return (this.h ??= headerMap(this.pairs()));
  }
  /** Values of one header, case-insensitive; `[]` when absent (for `get*Header`, bucket keys). */
  header(name: string): string[] {
    const lower = name.toLowerCase();
    return this.h ? (this.h.get(lower) ?? []) : headerValues(this.pairs(), lower);
  }
  /** Whether the header is there, case-insensitive (`has*Header`). */
  hasHeader(name: string): boolean {
    const lower = name.toLowerCase();
    return this.h ? this.h.has(lower) : hasHeaderIn(this.pairs(), lower);
  }
  /** The cookie `name` (`get*Cookie`, `has*Cookie`; `cookie-vars.ts`), `CEL_NO_COOKIE` when none. */
  cookie(name: string): CelCookie {
    const ck = (this.ck ??= new Map());
    let c = ck.get(name);
    if (!c) ck.set(name, (c = this.readCookie(name)));
    return c;
  }
  /** `content_encoding`: the codings of `Content-Encoding` (`contentEncodings`). */
  get content_encoding(): string[] {
    return (this.ce ??= contentEncodings(this.header('content-encoding'), this.side));
  }
  /** `location`: the `Location` header (the first one), `""` without one. */
  get location(): string {
    return this.header('location')[0] ?? '';
  }
  /** Call after editing the headers so later expressions see the edit. */
  headersChanged(): void {
    this.h = undefined;
    this.ck = undefined;
    this.ce = undefined;
  }
}

/** `req`. */
export class CelRequest extends CelHeaderView {
  private u?: CelUrl;
  private cks?: Map<string, CelCookie[]>;
  private ct?: CelContentType;
  private t?: CelRequestTimestamps;
  private ua?: CelUserAgent;
  protected readonly side = 'req';
  constructor(private readonly init: CelRequestInit) {
    super();
  }
  protected pairs(): readonly string[] {
    return this.init.headers();
  }
  /** The first cookie of that name the request sent. */
  protected readCookie(name: string): CelCookie {
    return requestCookie(this.header('cookie'), name);
  }
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
    const i = this.init;
    return (this.u ??= new CelUrl(i.scheme, i.servedAuthority ? i.servedAuthority() : normalizeAuthority(i.scheme, i.authority), i.path, i.rawQuery, i.authority, i.rawTarget));
  }
  /** `HTTP/1.1`, `HTTP/1.0` (Go's `Proto`); `""` when the request is not known. */
  get version(): string {
    const v = this.init.message?.httpVersion;
    return v ? `HTTP/${v}` : '';
  }
  /**
   * The body's length: `Content-Length` as received; -1 when the body has no stated length
   * (`Transfer-Encoding: chunked`: the length is not known before it has all arrived, as Go's
   * `ContentLength` says it); 0 without a body.
   */
  get content_length(): bigint {
    const m = this.init.message;
    if (m) {
      const cl = m.headers['content-length'];
      return contentLength(typeof cl === 'string' ? cl : undefined, m.headers['transfer-encoding'] !== undefined);
    }
    return contentLength(this.header('content-length')[0], this.hasHeader('transfer-encoding'));
  }
  get content_type(): CelContentType {
    if (this.ct) return this.ct;
    const v = this.header('content-type')[0];
    return (this.ct = v === undefined ? NO_CONTENT_TYPE : new CelContentType(v));
  }
  /** Name → the cookies of that name, in the order sent (see `requestCookies`). */
  get cookies(): Map<string, CelCookie[]> {
    return (this.cks ??= requestCookies(this.header('cookie')));
  }
  get ts(): CelRequestTimestamps {
    return (this.t ??= new CelRequestTimestamps(this.init.receivedAt));
  }
  get headers(): Map<string, string[]> {
    return this.headersMap();
  }
  /** The `User-Agent` header (the first), a string with ngrok's parsed fields (`user-agent-vars.ts`). */
  get user_agent(): CelUserAgent {
    return (this.ua ??= new CelUserAgent(this.header('user-agent')[0] ?? ''));
  }
  override headersChanged(): void {
    super.headersChanged();
    this.cks = undefined;
    this.ct = undefined;
    this.ua = undefined;
  }
}

/**
 * What `conn.tls` reads off the connection; node:tls `TLSSocket` is one. Nothing is read until
 * an expression reads a `conn.tls` field.
 */
export interface CelTlsSocket {
  getProtocol(): string | null;
  getCipher(): { name: string; standardName?: string } | null | undefined;
  readonly servername?: string | false | null;
  readonly alpnProtocol?: string | false | null;
  isSessionReused(): boolean;
  getPeerX509Certificate(): { readonly raw: Uint8Array } | undefined;
  getX509Certificate(): { readonly raw: Uint8Array } | undefined;
}

/** Go's zero time (0001-01-01T00:00:00Z, CEL's earliest timestamp): the validity of an absent certificate. */
const ZERO_TIME_MS = Date.parse('0001-01-01T00:00:00Z');

/** `conn.tls.<client|server>.<issuer|subject>`: compares and concatenates as its RFC 2253-like string, with fields. */
export class CelDistinguishedName {
  constructor(private readonly n: ParsedName | null) {}
  get common_name(): string {
    return this.n?.commonName ?? '';
  }
  get country(): string[] {
    return this.n?.country ?? [];
  }
  get locality(): string[] {
    return this.n?.locality ?? [];
  }
  get organization(): string[] {
    return this.n?.organization ?? [];
  }
  get organizational_unit(): string[] {
    return this.n?.organizationalUnit ?? [];
  }
  get postal_code(): string[] {
    return this.n?.postalCode ?? [];
  }
  get province(): string[] {
    return this.n?.province ?? [];
  }
  get street_address(): string[] {
    return this.n?.streetAddress ?? [];
  }
  toString(): string {
    return this.n?.text ?? '';
  }
}

/** `conn.tls.<client|server>.san`: compares as `DNS:a, IP Address:1.2.3.4, …`, with the lists as fields. */
export class CelSubjectAltNames {
  constructor(private readonly s: ParsedSan | null) {}
  get dns_names(): string[] {
    return this.s?.dnsNames ?? [];
  }
  get email_addresses(): string[] {
    return this.s?.emailAddresses ?? [];
  }
  get ip_addresses(): string[] {
    return this.s?.ipAddresses ?? [];
  }
  get uris(): string[] {
    return this.s?.uris ?? [];
  }
  toString(): string {
    return this.s?.text ?? '';
  }
}

/** `conn.tls.<client|server>.extensions[i]`. */
export class CelCertificateExtension {
  constructor(
    readonly id: string,
    readonly critical: boolean,
    readonly value: Uint8Array,
  ) {}
}

/** `conn.tls.<client|server>.validity`. */
export class CelCertificateValidity {
  constructor(
    readonly not_before: Date,
    readonly not_after: Date,
  ) {}
}

/**
 * `conn.tls.server` (and the base of `conn.tls.client`): a certificate's fields, parsed from its
 * DER on first read. Without a certificate every string is `""`, every list empty and both
 * validity times Go's zero time (0001-01-01T00:00:00Z). A certificate that cannot be read (or is
 * over `MAX_CERTIFICATE_BYTES`) makes every field read an evaluation error. One instance serves
 * every request of a TLS connection (see `connectionCertificates`), so its values are never
 * modified.
 */
export class CelCertificate {
  private p?: ParsedCertificate | null;
  private err?: Error;
  private views?: { issuer: CelDistinguishedName; subject: CelDistinguishedName; san: CelSubjectAltNames; validity: CelCertificateValidity; extensions: CelCertificateExtension[] };
  constructor(protected readonly der: Uint8Array | null) {}

  private get parsed(): ParsedCertificate | null {
    if (this.err) throw this.err;
    if (this.p === undefined) {
      try {
        this.p = this.der ? parseCertificate(this.der) : null;
      } catch (err) {
        this.err = err as Error;
        throw err;
      }
    }
    return this.p;
  }

  private get v() {
    if (this.views) return this.views;
    const p = this.parsed;
    return (this.views = {
      issuer: new CelDistinguishedName(p?.issuer ?? null),
      subject: new CelDistinguishedName(p?.subject ?? null),
      san: new CelSubjectAltNames(p?.san ?? null),
      validity: new CelCertificateValidity(p?.notBefore ?? new Date(ZERO_TIME_MS), p?.notAfter ?? new Date(ZERO_TIME_MS)),
      extensions: p ? p.extensions.map((e) => new CelCertificateExtension(e.id, e.critical, e.value)) : [],
    });
  }

  get extensions(): CelCertificateExtension[] {
    return this.v.extensions;
  }
  get issuer(): CelDistinguishedName {
    return this.v.issuer;
  }
  get san(): CelSubjectAltNames {
    return this.v.san;
  }
  get serial_number(): string {
    return this.parsed?.serialNumber ?? '';
  }
  get signature_algorithm(): string {
    return this.parsed?.signatureAlgorithm ?? '';
  }
  get subject(): CelDistinguishedName {
    return this.v.subject;
  }
  get validity(): CelCertificateValidity {
    return this.v.validity;
  }
}

/** `conn.tls.client`: the certificate fields plus `pem` (ngrok has `pem` for the client only). */
export class CelClientCertificate extends CelCertificate {
  private pemText?: string;
  get pem(): string {
    if (this.pemText !== undefined) return this.pemText;
    if (!this.der) return (this.pemText = '');
    checkCertificateSize(this.der);
    return (this.pemText = certificatePem(this.der));
  }
}

/** `TLSv1.3` → `1.3` (ngrok's form), `TLSv1` → `1.0`; `""` when unknown. */
function tlsVersion(protocol: string | null): string {
  if (!protocol) return '';
  if (protocol === 'TLSv1') return '1.0';
  return protocol.startsWith('TLSv') ? protocol.slice(4) : protocol;
}

/** The certificates of one TLS connection, each read from the socket and parsed on first use. */
interface ConnectionCertificates {
  client?: CelClientCertificate;
  server?: CelCertificate;
}

const CONNECTION_CERTIFICATES = new WeakMap<CelTlsSocket, ConnectionCertificates>();

/**
 * The certificates of `socket`'s connection, shared by all its requests: a keep-alive connection
 * keeps its certificates, so each is fetched and parsed once per connection, by the first
 * request that reads it (the `mutual_tls` stage likewise verifies the client's once per
 * connection; a TLS 1.2 renegotiation is not looked for by either). Kept as long as the socket.
 */
function connectionCertificates(socket: CelTlsSocket): ConnectionCertificates {
  let c = CONNECTION_CERTIFICATES.get(socket);
  if (!c) CONNECTION_CERTIFICATES.set(socket, (c = {}));
  return c;
}

const NO_CLIENT_CERTIFICATE = new CelClientCertificate(null);
const NO_CERTIFICATE = new CelCertificate(null);

/**
 * `conn.tls`. Over plain HTTP every string is `""`, `session_resumed` false and both
 * certificates absent (see `CelCertificate`), so `conn.tls.version == ''` tells plain HTTP apart.
 * `client` is the certificate the client presented only when `verifiedClient` (the edge's
 * `mutual_tls` checked it before the policy runs); otherwise it reads as absent even if the
 * client sent one, since nothing vouches for it.
 */
export class CelTls {
  private c?: CelClientCertificate;
  private s?: CelCertificate;
  constructor(
    private readonly socket: CelTlsSocket | null,
    private readonly verifiedClient: boolean,
    /** The ClientHello's JA4 fingerprint, read off the connection before its handshake (the ingress's `client-hello.ts`). */
    private readonly ja4 = '',
  ) {}
  get version(): string {
    return this.socket ? tlsVersion(this.socket.getProtocol()) : '';
  }
  /** The IANA name (`TLS_AES_128_GCM_SHA256`, `TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256`), as Go names them. */
  get cipher_suite(): string {
    const c = this.socket?.getCipher();
    return c ? (c.standardName ?? c.name ?? '') : '';
  }
  get sni(): string {
    const n = this.socket?.servername;
    return typeof n === 'string' ? n : '';
  }
  get negotiated_alpn(): string {
    const p = this.socket?.alpnProtocol;
    return typeof p === 'string' ? p : '';
  }
  get session_resumed(): boolean {
    return this.socket ? this.socket.isSessionReused() : false;
  }
  /** JA4 (`t13d1516h2_8daaf6152771_b186095e22b6`); `""` over plain HTTP or when the ClientHello was not read whole. */
  get ja4_fingerprint(): string {
    return this.socket ? this.ja4 : '';
  }
  get client(): CelClientCertificate {
    if (this.c) return this.c;
    const socket = this.socket;
    if (!socket || !this.verifiedClient) return (this.c = NO_CLIENT_CERTIFICATE);
    return (this.c = connectionCertificates(socket).client ??= new CelClientCertificate(socket.getPeerX509Certificate()?.raw ?? null));
  }
  get server(): CelCertificate {
    if (this.s) return this.s;
    const socket = this.socket;
    if (!socket) return (this.s = NO_CERTIFICATE);
    return (this.s = connectionCertificates(socket).server ??= new CelCertificate(socket.getX509Certificate()?.raw ?? null));
  }
}

/** What `conn.client_port` and `conn.server_ip` read off the connection; node:net `Socket` is one. */
export interface CelConnSocket {
  readonly remotePort?: number;
  readonly localAddress?: string;
  /** Bytes received from and sent to the client on this connection so far (`conn.bytes_in`, `conn.bytes_out`). */
  readonly bytesRead?: number;
  readonly bytesWritten?: number;
}

/** What `conn.ts` and `conn.server_region` read. */
export interface CelConnFacts {
  /** When the ingress accepted the client's connection (ms since the epoch); undefined: not known. */
  readonly startedAt: number | undefined;
  /** The ingress node the client connected to (the `Region` its agents are told). */
  readonly region: string;
  /** The JA4 fingerprint of the client's ClientHello (`conn.tls.ja4_fingerprint`); `""` or absent: not known. */
  readonly ja4?: string;
}

/** `conn.ts`: ngrok's connection timestamps (`start`). */
export class CelConnTimestamps {
  constructor(private readonly startedAt: number | undefined) {}
  /** When the ingress accepted the client's TCP connection, as a wall-clock time. */
  get start(): Date {
    if (this.startedAt === undefined) throw new Error('conn.ts.start is not known for this connection');
    return new Date(this.startedAt);
  }
}

/** `::ffff:a.b.c.d` (a dual-stack listener's IPv4 peer) → `a.b.c.d`. */
function unmappedIp(a: string): string {
  return a.length > 7 && a.charCodeAt(0) === 0x3a /* : */ && /^::ffff:\d+\.\d+\.\d+\.\d+$/i.test(a) ? a.slice(7) : a;
}

/** `conn.tls` of a plain-HTTP request. */
export const CEL_NO_TLS = new CelTls(null, false);

/**
 * `conn`. `tls`: the connection's TLS socket (null over plain HTTP), read only if an expression
 * reads `conn.tls`. `geo`: looks the client up (see `geo-vars.ts`), called only if an expression
 * reads `conn.geo`, at most once per view; null: no geolocation (every `conn.geo` field `""`; the
 * ingress never passes null: without a database its lookup throws, so reading is an evaluation error).
 */
export class CelConn {
  private t?: CelTls;
  private g?: CelGeo;
  private cts?: CelConnTimestamps;
  constructor(
    readonly client_ip: string,
    private readonly port: number,
    private readonly tlsSocket: CelTlsSocket | null = null,
    /** The client certificate was verified (the edge's `mutual_tls`): `conn.tls.client` shows it. */
    private readonly verifiedClientCertificate = false,
    private readonly geoLookup: (() => CelGeo) | null = null,
    /** The connection's socket, for `conn.client_port`, `conn.server_ip` and `conn.bytes_*` (read when used). */
    private readonly socket: CelConnSocket | null = null,
    private readonly facts: CelConnFacts | null = null,
  ) {}
  /** Bytes the client has sent on this connection so far, as received (TLS records included). */
  get bytes_in(): bigint {
    return BigInt(this.socket?.bytesRead ?? 0);
  }
  /** Bytes sent to the client on this connection so far (before this request's answer). */
  get bytes_out(): bigint {
    return BigInt(this.socket?.bytesWritten ?? 0);
  }
  get server_region(): string {
    return this.facts?.region ?? '';
  }
  get ts(): CelConnTimestamps {
    return (this.cts ??= new CelConnTimestamps(this.facts?.startedAt));
  }
  get server_port(): bigint {
    return BigInt(this.port);
  }
  /** The client's source port (0 once the socket is closed, or without one). */
  get client_port(): bigint {
    return BigInt(this.socket?.remotePort ?? 0);
  }
  /** The ingress address the client connected to, an IPv4-mapped IPv6 one as IPv4 (as `client_ip`); `""` once closed. */
  get server_ip(): string {
    return unmappedIp(this.socket?.localAddress ?? '');
  }
  get tls(): CelTls {
    return (this.t ??= this.tlsSocket ? new CelTls(this.tlsSocket, this.verifiedClientCertificate, this.facts?.ja4) : CEL_NO_TLS);
  }
  get geo(): CelGeo {
    return (this.g ??= this.geoLookup ? this.geoLookup() : CEL_NO_GEO);
  }
}

/** What `endpoint` shows (`CelEndpoint`). */
export interface CelEndpointInit {
  /** The edge's id (`edghts_…`), or a Bind endpoint's (its tunnel's) id. */
  id: string;
  /** The host the request was routed on, lower-case. */
  host: string;
  /** The port it was served on (read when used). */
  port: () => number;
  /** `http` or `https`. */
  protocol: string;
}

/**
 * `endpoint` (https://ngrok.com/docs/traffic-policy/variables/endpoint/): `id`, `host`, `port`
 * (int), `protocol` and `addr` (`host:port`, an IPv6 literal in brackets). A route's policy
 * belongs to an HTTPS edge, which may serve several hostports: the endpoint is the edge at the
 * hostport that served the request.
 */
export class CelEndpoint {
  constructor(private readonly init: CelEndpointInit) {}
  get id(): string {
    return this.init.id;
  }
  get host(): string {
    return this.init.host;
  }
  get port(): bigint {
    return BigInt(this.init.port());
  }
  get protocol(): string {
    return this.init.protocol;
  }
  /** The host as it is written before a port (an IPv6 literal in brackets). */
  private get hostPart(): string {
    const h = this.init.host;
    return h.includes(':') && !h.startsWith('[') ? `[${h}]` : h;
  }
  get addr(): string {
    return `${this.hostPart}:${this.init.port()}`;
  }
  /** `<protocol>://<host>`, with `:<port>` unless it is the protocol's default (ngrok: `https://my-subdomain.ngrok.app`). */
  get url(): string {
    const host = this.hostPart;
    const port = this.init.port();
    const dflt = this.init.protocol === 'https' ? 443 : this.init.protocol === 'http' ? 80 : -1;
    return `${this.init.protocol}://${host}${port === dflt ? '' : `:${port}`}`;
  }
}

export interface CelResponseInit {
  status: () => number;
  headers: () => readonly string[];
}

/** `res` (outbound rules only). */
export class CelResponse extends CelHeaderView {
  private ct?: CelContentType;
  private cks?: Map<string, CelCookie[]>;
  protected readonly side = 'res';
  constructor(private readonly init: CelResponseInit) {
    super();
  }
  protected pairs(): readonly string[] {
    return this.init.headers();
  }
  /** The response's cookie of that name (the longest path of several). */
  protected readCookie(name: string): CelCookie {
    return responseCookie(this.header('set-cookie'), name);
  }
  get status_code(): bigint {
    return BigInt(this.init.status());
  }
  /**
   * The body's length as the response states it (`Content-Length`, as it stands when read); 0
   * for a status without a body (1xx, 204, 304); else -1: not known (sent chunked, or until the
   * connection closes), as Go's `ContentLength` says it.
   */
  get content_length(): bigint {
    const status = this.init.status();
    return contentLength(this.header('content-length')[0], !(status < 200 || status === 204 || status === 304));
  }
  get content_type(): CelContentType {
    if (this.ct) return this.ct;
    const v = this.header('content-type')[0];
    return (this.ct = v === undefined ? NO_CONTENT_TYPE : new CelContentType(v));
  }
  get headers(): Map<string, string[]> {
    return this.headersMap();
  }
  /** Name → the cookies the response sets, longest path first (see `responseCookies`). */
  get cookies(): Map<string, CelCookie[]> {
    return (this.cks ??= responseCookies(this.header('set-cookie')));
  }
  override headersChanged(): void {
    super.headersChanged();
    this.ct = undefined;
    this.cks = undefined;
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

/** `actions.<ngrok|service>.restrict_ips.error`. */
export class CelRestrictIpsError {
  code = '';
  message = '';
}

/**
 * `actions.<ngrok|service>.restrict_ips`: the last restrict-ips action's result (mutable;
 * https://ngrok.com/docs/traffic-policy/actions/restrict-ips/). `action` is `allow` or `deny`
 * (`''` before any ran); `matched_cidr` the CIDR that decided, `''` when none matched.
 */
export class CelRestrictIps {
  action = '';
  readonly error = new CelRestrictIpsError();
  private matched: string | (() => string) = '';
  /** Looked up on first read: finding which of many CIDRs matched costs more than deciding. */
  get matched_cidr(): string {
    if (typeof this.matched !== 'string') this.matched = this.matched();
    return this.matched;
  }
  /** One run's result; `matched` may be a lookup, run only if something reads `matched_cidr`. */
  record(action: 'allow' | 'deny', matched: string | (() => string), errorCode = '', errorMessage = ''): void {
    this.action = action;
    this.matched = matched;
    this.error.code = errorCode;
    this.error.message = errorMessage;
  }
}

/** `actions.<ngrok|service>.basic_auth.credentials`. */
export class CelBasicAuthCredentials {
  /** A well-formed `Authorization: Basic` header was sent. */
  presented = false;
  /** Its username (never the password); `''` when none was presented. */
  username = '';
  /** It matched one of the action's credentials. */
  authorized = false;
}

/**
 * `actions.<ngrok|service>.basic_auth`: the last basic-auth action's result (mutable;
 * https://ngrok.com/docs/traffic-policy/actions/basic-auth/).
 */
export class CelBasicAuth {
  readonly credentials = new CelBasicAuthCredentials();
}

/**
 * `actions.<ngrok|service>.add_headers`: what the last add-headers action that ran added
 * (https://ngrok.com/docs/traffic-policy/variables/action/): `headers_added`, each added header's
 * lower-case name → its value as sent, read as UTF-8 text (as `req.headers` reads values). A
 * header whose `${…}` failed was not added and is not there. The map is built on first read.
 */
export class CelAddHeaders {
  private pairs: readonly string[] = [];
  private map?: Map<string, string>;
  /** One run's result: `[name, value, …]` as the headers went out (a later name of the same spelling wins). */
  record(pairs: readonly string[]): void {
    this.pairs = pairs;
    this.map = undefined;
  }
  get headers_added(): Map<string, string> {
    if (this.map) return this.map;
    const map = new Map<string, string>();
    for (let i = 0; i + 1 < this.pairs.length; i += 2) map.set(this.pairs[i]!.toLowerCase(), headerText(this.pairs[i + 1]!));
    return (this.map = map);
  }
}

export class CelActionResults {
  constructor(readonly rate_limit: CelRateLimit) {}
  private ah?: CelAddHeaders;
  get add_headers(): CelAddHeaders {
    return (this.ah ??= new CelAddHeaders());
  }
  // The other actions' results are made when first read or written: a request of a rate-limited
  // route builds one of these per request, and seven result objects it never uses cost ~0.4 µs.
  private ri?: CelRestrictIps;
  private ba?: CelBasicAuth;
  private ur?: CelUrlActionResult;
  private rd?: CelUrlActionResult;
  private jv?: CelJwtValidation;
  private vw?: CelVerifyWebhook;
  private cp?: CelCompress;
  get restrict_ips(): CelRestrictIps {
    return (this.ri ??= new CelRestrictIps());
  }
  get basic_auth(): CelBasicAuth {
    return (this.ba ??= new CelBasicAuth());
  }
  get url_rewrite(): CelUrlActionResult {
    return (this.ur ??= new CelUrlActionResult());
  }
  get redirect(): CelUrlActionResult {
    return (this.rd ??= new CelUrlActionResult());
  }
  get jwt_validation(): CelJwtValidation {
    return (this.jv ??= new CelJwtValidation());
  }
  get verify_webhook(): CelVerifyWebhook {
    return (this.vw ??= new CelVerifyWebhook());
  }
  get compress(): CelCompress {
    return (this.cp ??= new CelCompress());
  }
  private oa?: CelOAuth;
  private oi?: CelOidc;
  get oauth(): CelOAuth {
    return (this.oa ??= new CelOAuth());
  }
  get oidc(): CelOidc {
    return (this.oi ??= new CelOidc());
  }
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
