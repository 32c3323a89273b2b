/**
 * Worst-case evaluation cost of traffic-policy expressions, estimated statically over the
 * compiled CEL AST when a policy is saved (see `parse.ts`): tenants write the expressions and
 * the shared ingress runs them on every request, so an expression whose worst case is too slow
 * (nested comprehensions over large lists, a large regexp on a long header) is refused with a
 * 400 naming it instead of stalling the ingress for everyone.
 *
 * Units: one cost unit is about one nanosecond of evaluation on the reference machine (two
 * cores, Node 20; the coefficients below were measured there with re2js 2.10 and cel-js 8.0).
 * The estimate is an upper bound: every value's size is bounded (literals exactly, request
 * data by the limits Node and the ingress enforce, `REQUEST_LIMITS` / `RESPONSE_LIMITS`), and
 * each operation is charged for the largest inputs it can see. `cost.test.ts` measures the most
 * expensive accepted shapes against their estimates.
 *
 * What the estimate cannot bound statically is checked at run time, cheaply: `matches()` refuses
 * a string over `MAX_MATCH_INPUT` characters (an evaluation error, so the rule is skipped; no
 * request or response string is that long, only strings a policy builds itself), which bounds
 * what a `matches()` on a built string can cost.
 */
import type { CelProgram } from './cel.js';
import { MAX_MATCH_INPUT, MAX_REGEX_PROGRAM_SIZE, type DfaExploreBudget, type RegexRunInfo } from './regex.js';
import { MAX_CERTIFICATE_BYTES } from './x509.js';
import { JWT_MAX_TOKENS } from './jwt-action-vars.js';
import { GEO_LIMITS, GEO_LOOKUP_COST } from './geo-vars.js';
import { MAX_CONTENT_CODINGS, MAX_CONTENT_TYPE_PARSED } from './cel-vars.js';
import { MAX_USER_AGENT_PARSED } from './user-agent-vars.js';
import { MAX_REQUEST_COOKIES } from './cookie-vars.js';
import { HASH_DIGEST_BYTES, MAX_BUILT_STRING, MAX_LIST_RANGE, NGROK_HASHES, type NgrokHash } from './ngrok-macros.js';
import { MAX_BUILT_LIST, MAX_DISTINCT_CHARS, MAX_FLATTEN_DEPTH } from './list-macros.js';
import { formatClauses, MAX_FORMAT_PRECISION } from './string-format.js';
import { CODE_POINT_METHODS } from './string-index.js';
import { ZONED_ACCESSORS } from './time-zones.js';

/** The timestamp accessors that may take a time zone. */
const ZONED: ReadonlySet<string> = new Set(ZONED_ACCESSORS);

/** Largest estimated cost of one expression (or one `${…}` of a header value): about 2 ms. */
export const MAX_EXPRESSION_COST = 2_000_000;
/**
 * Largest estimated cost of all a policy's expressions together (every rule's expressions and
 * interpolations may run on the same request): about 5 ms, room for half a dozen `matches()` on
 * request strings (each charged for a full 16 KB head, about 0.8 ms).
 */
export const MAX_POLICY_COST = 5_000_000;

/**
 * Bounds of request data as the ingress receives it. Node's HTTP parser refuses (431) a request
 * whose head (request line and headers) is over `http.maxHeaderSize` (16 KiB by default; the
 * ingress does not change it) and drops headers past `server.maxHeadersCount` (2000).
 */
export const REQUEST_LIMITS = {
  headBytes: 16 * 1024,
  headers: 2000,
} as const;

/**
 * Bounds of response heads: the ingress reads them with undici, whose `maxHeaderSize` is the
 * same 16 KiB; nothing caps the count, but a header line takes at least 4 bytes (`a:\r\n`).
 */
export const RESPONSE_LIMITS = {
  headBytes: 16 * 1024,
  headers: 4096,
} as const;

/**
 * Bounds of `conn.tls` values. A certificate's fields are read only from a certificate of at
 * most `MAX_CERTIFICATE_BYTES` (a larger one is an evaluation error), so everything derived
 * from one is bounded by a small multiple of that: see `certificateBounds`.
 */
export const TLS_LIMITS = {
  certificateBytes: MAX_CERTIFICATE_BYTES,
  /** The SNI host name: at most 255 bytes (OpenSSL refuses longer ones). */
  serverName: 255,
  /** An ALPN protocol id: at most 255 bytes (RFC 7301). */
  alpn: 255,
  /** `1.3`, `1.2`, … */
  version: 16,
  /** IANA cipher suite names are under 64 characters. */
  cipherSuite: 128,
  /** JA4: `t13d1516h2_8daaf6152771_b186095e22b6`, 36 characters. */
  ja4: 36,
} as const;

/**
 * Bounds of `vars`, the variables `set-vars` sets (`var-actions.ts`): a policy sets at most
 * `names` distinct names per direction, each at most `nameChars` characters (checked when it is
 * saved), and a value weighs at most `valueWeight` (`varValueWeight`: the characters of its
 * strings plus its elements, at any depth): a literal over it is refused when the policy is
 * saved, and the ingress does not store an evaluated one over it (the variable is left as it
 * was: an evaluation error). So `vars` is a map of at most `names` entries, each value a `dyn`
 * of at most `valueWeight`.
 */
export const VARS_LIMITS = {
  names: 64,
  nameChars: 64,
  valueWeight: 4096,
} as const;

/**
 * The ingress adds `X-Forwarded-For` (the client address appended to any sent) and
 * `X-Forwarded-Host` (a copy of `Host`), so the headers a policy sees may hold up to one head
 * more than the client sent, plus this much.
 */
const INGRESS_ADDED_BYTES = 128;

/** Deepest nesting of comprehensions (`exists`, `all`, `map`, …) the estimator accepts. */
export const MAX_COMPREHENSION_NESTING = 6;

/**
 * Headers the policy itself adds (`add-headers`), which later expressions see: counted on top of
 * the limits above. `parse.ts` sums them over the whole policy.
 */
export interface PolicyHeaderGrowth {
  count: number;
  bytes: number;
}

/**
 * Cost coefficients (≈ ns on the reference machine, measured with the policy benchmark of
 * another engineer running, so on the high side; `cost.test.ts` prints the figures it measures).
 */
const C = {
  /** Calling a compiled expression (its root context, the activation lookups). Measured 0.4–0.6 µs. */
  evaluation: 600,
  /** Each AST node evaluated (operator dispatch, overload lookup). */
  node: 10,
  /**
   * Arithmetic on top (cel-js ints are BigInts, range-checked: a step of
   * `l.exists(x, l.exists(y, x + y < 0))` takes ~90–170 ns).
   */
  arithmetic: 60,
  /** Each comprehension step beyond its body's nodes (a step of `l.exists(v, v == 'x')`: ~50 ns). */
  iteration: 30,
  /** Per character scanned, compared, copied or hashed (`contains`, `==`, `+`, map lookups). */
  scanChar: 2,
  /** Per character of `size()` on a string (cel-js counts code points one by one: ~4.5 ns). */
  sizeChar: 8,
  /** Per character of operations that build many values (`split`, `join`, `json`, `base64`). */
  buildChar: 20,
  /** Per list element created or copied (literals: ~17–47 ns with the element's node). */
  element: 30,
  /**
   * Per entry of the header or query map built on first use (2000 distinct headers: ~0.4 ms,
   * 8000 query parameters ~1 ms, under load).
   */
  entry: 150,
  /**
   * Per character of the query string parsed on first use (Go's `url.ParseQuery`:
   * `parseQueryValues`; 16 KB of escapes or of `;`-pairs it drops: 0.3–0.9 ms with the entries).
   */
  parseChar: 5,
  /**
   * Reading a TLS certificate on first use (`conn.tls.client` / `.server`): fetching it from the
   * TLS socket and parsing its DER. It is parsed once per TLS connection (`cel-vars.ts` keeps it
   * per socket), so later requests of a keep-alive connection cost nearly nothing; this charges
   * every request the first request's worst case, since any request may open its connection.
   * Measured: ~5–20 µs for common certificates (1–2 KB).
   */
  certificate: 20_000,
  /**
   * Per DER byte of that certificate: 10–40 ns, the most for 8 KB of tiny IPv6 names or
   * attributes Go has no name for (`cost.test.ts`).
   */
  certificateByte: 40,
  /** Per `matches()` call, whatever the string (RE2 matcher set-up: ~30–130 ns). */
  regexCall: 200,
  /** Per character for a one-pass RE2 program or a plain string (measured: 25–33 ns). */
  regexLinearChar: 40,
  /**
   * Per character for a small RE2 program (at most `DFA_SAFE_PROGRAM_SIZE` instructions): its
   * lazy DFA's states all fit the cache, so they are built once per process and then looked
   * up. Measured: 15–45 ns.
   */
  regexChar: 50,
  /**
   * Per character and instruction for larger programs, whose DFA can be made to thrash (RE2
   * then falls back to the NFA, one step per live instruction per character). Measured: 25–90
   * ns on adversarial input, the higher figures under load.
   */
  regexInstChar: 60,
  /** Per instruction to compile a pattern known only at evaluation time (a cache miss: ~7 µs). */
  regexCompileInst: 5_000,
  /**
   * Per character of `Cookie` values searched for a cookie (`getReqCookie` / `hasReqCookie`,
   * `cookie-vars.ts`): a native search for the name, each occurrence checked. Measured 1 ns for
   * other cookies, up to 26 ns for thousands of invalid pairs of the name.
   */
  reqCookieChar: 40,
  /**
   * Per character of `Set-Cookie` values read for a cookie (`getResCookie`, `hasResCookie`): each
   * line of the name split at `;`, its attributes trimmed and read. Measured 20–40 ns (the most
   * for `Expires` dates).
   */
  resCookieChar: 50,
  /** Per `Set-Cookie` line of the cookie's name (a cookie built, its attributes read): ~150–250 ns. */
  cookieLine: 300,
  /**
   * Per cookie `req.cookies` holds (`requestCookies`: a cookie built and filed under its name),
   * on top of `reqCookieChar` per character of the `Cookie` values: ~200–280 ns under load.
   */
  cookieEntry: 300,
  /**
   * Per character of a `Content-Type` whose parameters are read (`content_type.parameters`, at
   * most `MAX_CONTENT_TYPE_PARSED` characters): 10–100 ns under load, the most for many short
   * parameters (`;p1=v;p2=v…`, each a regexp step and a map entry).
   */
  contentTypeChar: 100,
  /**
   * Reading an address for `inCidrRange` / `inCidrRanges` (`cidr-macros.ts`, the shared IPv4 /
   * IPv6 parsers): ~1 µs for IPv4, 3–9 µs for IPv6 and IPv4-mapped IPv6 under load.
   */
  ipParse: 10_000,
  /** Comparing an address with one parsed CIDR: ~60–120 ns. */
  cidrMatch: 150,
  /**
   * ngrok's string macros (`ngrok-macros.ts`), per UTF-16 unit of the string they work on; the
   * measured worst inputs are in `cost.test.ts`. `lower()` / `upper()`: 0.2 ns for ASCII, 5–15
   * ns (up to ~20 on a busy machine) when a letter Go maps differently from JavaScript (İ, Σ, ß,
   * ᾀ…) forces a pass per unit.
   */
  caseChar: 30,
  /** `reverse()` (~3–5 ns), `charAt()` (counting code points: ~3 ns). */
  codePointChar: 10,
  /**
   * `indexOf()`, `lastIndexOf()`, `substring()` (`string-index.ts`) on top of the search or copy,
   * per unit: a string with surrogates has its lone ones replaced and its indices converted to
   * code points (walks of its units).
   */
  codePointIndexChar: 20,
  /**
   * A timestamp accessor with an IANA time zone (`t.getHours('Europe/Paris')`): the zone's
   * `Intl.DateTimeFormat` asked for the wall clock (~5 µs), made on the name's first use
   * (~120 µs, then kept; an unknown name ~25 µs each time). A literal name is made once per
   * process, a computed one may be new on each request.
   */
  timeZoneCall: 15_000,
  timeZoneLoad: 300_000,
  /** A fixed offset (`'+05:30'`): read, checked, the timestamp shifted (~0.3–1 µs). */
  timeZoneOffset: 2_000,
  /**
   * Per occurrence `replace()` replaces (~20–35 ns each, concatenated); where the searched string
   * can be empty or of unknown length, every unit may be one (an empty one inserts before each
   * code point: 0.5 ns each for ASCII, ~20 ns for astral characters).
   */
  replaceMatch: 60,
  /** base64 of a string's UTF-8 or back (`encodeBase64()`, `base64.decode()`, …): 0.5–8 ns. */
  base64Char: 15,
  /**
   * `url.escape()` / `escapeUrl()`: 2–20 ns (3 bytes of UTF-8 and 9 characters out per unit; the
   * most when a space or `!'()*` makes it escape byte by byte).
   */
  urlEscapeChar: 40,
  /** `strings.quote()`: a pass per unit, escapes doubling it: ~10 ns. */
  quoteChar: 20,
  /** `url.unescape()` / `unescapeUrl()`: ~1–6 ns. */
  urlUnescapeChar: 12,
  /**
   * `isJson()`, `json.decode()`, `decodeJson()`: a `JSON.parse` (12–20 ns per character for
   * many small objects, 25–50 for deeply nested arrays), and a scan of the brackets for a
   * string long enough to nest too deep.
   */
  jsonChar: 80,
  /** Per hash (`hash.sha256()`, `s.md5()`, …): a `node:crypto` hash created and digested, ~0.6–1.1 µs. */
  hashCall: 3_000,
  /** Per unit hashed (its UTF-8: up to 3 bytes): 0.3–5.5 ns, the most for MD5 and SHA-512. */
  hashChar: 12,
  /**
   * `req.user_agent`'s fields: the agent parsed (ua-parser-js and isbot, at most
   * MAX_USER_AGENT_PARSED characters) when a field is first read, unless its string is cached.
   * Real agents took 20–40 µs; the worst shapes found (384 characters of ` Android`) 0.2–0.5
   * ms, growing faster than the length (512 characters: 0.4–0.8 ms).
   */
  userAgentParse: 1_000_000,
  /** `hash.crc64()` / `hash.xxhash64()` (JavaScript, not `node:crypto`): per call, and per unit hashed. */
  hash64Call: 1_000,
  hash64Char: 40,
  /**
   * `json.encode()` / `encodeJson()`, per unit of the value's weight written (a string's
   * characters, escaped; an element; a number formatted).
   */
  jsonEncodeChar: 30,
  /** Per key and comparison of sorting a map's keys (`json.encode()`, `queryString.encode()`): ~12 ns (`Array.prototype.sort`). */
  sortKey: 15,
  /** `queryString.decode()` / `decodeQueryString()`, per character (each pair unescaped and filed). */
  queryDecodeChar: 40,
  /** `url.parse()`, `parseUrl()`, `isURL()`: Go's `url.Parse` byte by byte, per character. */
  urlParseChar: 60,
  /** Per call of those (a map of 13 strings built). */
  urlParseCall: 3_000,
  /** `rand.int()`: crypto randomness (a 64-bit draw for ranges of 2^48 or more). */
  randInt: 1_000,
  /** `isQueryString()`, per character: a few regexp scans and a split at `&`. */
  queryCheckChar: 20,
  /**
   * `format()`, per clause that takes an argument: the clause read, its value formatted (a double
   * exactly as Go writes it: up to 309 digits and 100 decimals, BigInt arithmetic for a tie).
   * Measured: 0.6 µs for most, 2–4 µs for ties and `%.100e` of subnormal doubles.
   */
  formatClause: 8_000,
  /**
   * `format()`, per value `%s` writes inside a list or map: ~0.8 µs for a double (its shortest
   * digits) or a map entry (sorted by key), ~80 ns for an int; a string ~20 ns (`formatString`).
   */
  formatValue: 1_000,
  formatString: 50,
  /** `format()`, per map `%s` writes inside a list or map (its entries formatted on their own, sorted): ~2.5 µs. */
  formatMap: 3_000,
  /** `format()`, per character written (copied, hex-encoded). */
  formatChar: 5,
  /** `sort()` / `sortBy()`, per comparison of two elements (an index sort through a comparator). */
  listCompare: 60,
  /**
   * `distinct()`, per element (its equality key built and looked up: ~100 ns), per value inside a
   * list or map element (its part of the key: ~300 ns), and per character in them.
   */
  distinctElement: 200,
  distinctValue: 500,
  distinctChar: 10,
} as const;

/**
 * A `Set-Cookie` header takes at least 13 bytes of a response head besides its value
 * (`set-cookie:`, CRLF), which bounds how many lines the response-cookie macros may read.
 */
const SET_COOKIE_LINE_BYTES = 13;

/**
 * RE2 programs of at most this size are costed per character only (see `C.regexChar`): at most
 * 2^12 DFA states of a few hundred bytes, which fit re2js's 8 MB DFA cache.
 */
export const DFA_SAFE_PROGRAM_SIZE = 12;

/**
 * DFA transitions explored per policy to find larger patterns whose whole DFA fits the cache
 * (`regexCostInfo`): about 1–2 µs each, so at most ~100 ms when saving a policy of many large
 * patterns (those left unexplored are costed as if their DFA thrashed).
 */
export const DFA_EXPLORE_STEPS = 50_000;

/**
 * What the estimator knows about a `matches()` call (`regexCostInfo` of the macro's literal
 * pattern; empty for a pattern computed at evaluation time).
 */
export type RegexCostInfo = Partial<RegexRunInfo>;

/** Worst-case cost of one `matches()` call on a string of at most `chars` characters. */
export function regexCost(info: RegexCostInfo, chars: number): number {
  const n = Math.min(chars, MAX_MATCH_INPUT);
  const p = info.programSize ?? MAX_REGEX_PROGRAM_SIZE;
  const cached = p <= DFA_SAFE_PROGRAM_SIZE || info.dfaStates !== undefined;
  const perChar = info.linear ? C.regexLinearChar : cached ? C.regexChar : Math.max(C.regexChar, C.regexInstChar * p);
  const compile = info.programSize === undefined ? C.regexCompileInst * MAX_REGEX_PROGRAM_SIZE : 0;
  return C.regexCall + compile + n * perChar;
}

/**
 * An upper bound on a value. `n`: a string's length (UTF-16 units), a list's or map's number of
 * elements; `w`: an upper bound on the value's total size, its characters plus its elements,
 * each element also counting `o` (the least room an element takes in its source: a header
 * takes at least its `:` and CRLF); `elem`: a list's elements or a map's values; `key`: a map's
 * keys; `obj`: one of the registered object types.
 */
interface Shape {
  n: number;
  w: number;
  o?: number;
  elem?: Shape;
  key?: Shape;
  obj?: string;
}

const SCALAR: Shape = { n: 0, w: 1 };
const str = (n: number): Shape => ({ n, w: n });

/** `s` with every size capped at `p` (an element of weight `p` drawn from a collection of `s`). */
function scaled(s: Shape, p: number): Shape {
  if (s.obj) return s;
  if (s.elem === s) return dyn(Math.min(s.w, p));
  return { ...s, n: Math.min(s.n, p), w: Math.min(s.w, p), elem: s.elem && scaled(s.elem, p), key: s.key && scaled(s.key, p) };
}

function widest(a: Shape, b: Shape): Shape {
  if (a === b) return a;
  if (a.obj || b.obj) return a.obj === b.obj ? a : DYN;
  return {
    n: Math.max(a.n, b.n),
    w: Math.max(a.w, b.w),
    o: Math.min(a.o ?? 0, b.o ?? 0),
    elem: a.elem && b.elem ? widest(a.elem, b.elem) : (a.elem ?? b.elem),
    key: a.key && b.key ? widest(a.key, b.key) : (a.key ?? b.key),
  };
}

/**
 * A value of unknown shape (a JSON document parsed from a header, `dyn`): no larger than the
 * largest request head, nested arbitrarily.
 */
function dyn(size: number): Shape {
  const d: Shape = { n: size, w: size };
  d.elem = d;
  d.key = d;
  return d;
}
const DYN_BOUND = 2 * REQUEST_LIMITS.headBytes + INGRESS_ADDED_BYTES;
const DYN = dyn(DYN_BOUND);
/** `vars` (see `VARS_LIMITS`): name → a value of unknown shape, bounded. */
const VARS: Shape = {
  n: VARS_LIMITS.names,
  w: VARS_LIMITS.names * (VARS_LIMITS.nameChars + VARS_LIMITS.valueWeight + 1),
  key: str(VARS_LIMITS.nameChars),
  elem: dyn(VARS_LIMITS.valueWeight),
};

/**
 * Bounds of the values read from one certificate of at most `B` DER bytes. A string attribute
 * decodes to at most one character per byte; an attribute takes at least 9 bytes (its SEQUENCE,
 * OID and value headers), a name in the SAN at least 2. Texts built from several parts are
 * bounded per byte by their worst part: a name's string escapes characters and writes unnamed
 * attributes as `oid=#hex` of their value re-encoded as UTF-8 (≤ 4 characters per byte); the SAN
 * string writes `IP Address:` and a dotted address for 6 bytes (≤ 7 characters per byte with
 * its separator); a dotted OID takes at most 4 characters per byte.
 */
function certificateBounds(B: number) {
  const text = (perByte: number) => str(perByte * B + 64);
  const list = (o: number, elem: Shape, w = B): Shape => ({ n: Math.ceil(B / o), w, o, elem });
  return {
    attribute: str(B),
    attributes: list(9, str(B)),
    name: text(4),
    sanText: text(7),
    sanNames: list(2, str(B)),
    // `192.168.1.1` from 6 bytes, `?` + hex for an address of another length.
    sanIps: list(2, str(2 * B + 1), 4 * B),
    serial: text(2),
    oid: text(4),
    pem: text(2),
    // An extension takes at least 7 bytes (SEQUENCE, OID, OCTET STRING headers).
    extensions: list(7, { n: 0, w: 6 * B, obj: 'CertificateExtension' }, B),
  };
}
const CERT = certificateBounds(TLS_LIMITS.certificateBytes);
/** Fetching and parsing a certificate on a connection's first request that reads it. */
const CERTIFICATE_ONCE = C.certificate + TLS_LIMITS.certificateBytes * C.certificateByte;

/** Bounds of request and response data for one policy. */
interface Bounds {
  /** Longest single string from the request (a header value, the URL, the path). */
  reqString: number;
  reqHeaders: Shape;
  queryParams: Shape;
  resString: number;
  resHeaders: Shape;
  /** `actions.ngrok.add_headers.headers_added`: a subset of what the policy's add-headers before the expression add. */
  addedHeaders: Shape;
}

/** Finding one header in the raw pairs (a name compared per pair), when the map was not built. */
const headerScan = (headers: Shape) => headers.n * C.node + headers.w * C.scanChar;

/**
 * A `Content-Type` value (`ContentType`, `cel-vars.ts`) of at most `chars` characters: as a
 * string it is its media type. `obj` tells the request's from the response's (each parses its
 * parameters once).
 */
const contentTypeShape = (chars: number, obj: 'ReqContentType' | 'ResContentType'): Shape => ({ n: 0, w: chars, obj });
/** `content_type.parameters`: parameters of at least 4 characters each (`;a=b`), from a header read only up to `MAX_CONTENT_TYPE_PARSED`. */
const CONTENT_TYPE_PARAMETERS: Shape = { n: MAX_CONTENT_TYPE_PARSED / 4, w: MAX_CONTENT_TYPE_PARSED, o: 3, key: str(MAX_CONTENT_TYPE_PARSED), elem: str(MAX_CONTENT_TYPE_PARSED) };

function bounds(growth: PolicyHeaderGrowth): Bounds {
  const head = REQUEST_LIMITS.headBytes;
  const reqString = head + INGRESS_ADDED_BYTES + growth.bytes;
  // One name's values: at most the head's bytes (each takes a line: name, `:`, CRLF).
  const reqValues: Shape = { n: REQUEST_LIMITS.headers + 3 + growth.count, w: head + INGRESS_ADDED_BYTES + growth.bytes, o: 3, elem: str(reqString) };
  // All headers: X-Forwarded-Host repeats Host, so up to two heads.
  const reqAll = 2 * head + INGRESS_ADDED_BYTES + growth.bytes;
  const reqHeaders: Shape = { n: REQUEST_LIMITS.headers + 3 + growth.count, w: reqAll, o: 3, key: str(reqString), elem: reqValues };
  // `a&b&…`: a parameter takes at least one character and its `&`.
  const queryValues: Shape = { n: head / 2, w: head, o: 1, elem: str(head) };
  const queryParams: Shape = { n: head / 2, w: head, o: 1, key: str(head), elem: queryValues };
  const rhead = RESPONSE_LIMITS.headBytes;
  const resString = rhead + growth.bytes;
  const resValues: Shape = { n: RESPONSE_LIMITS.headers + growth.count, w: resString, o: 3, elem: str(resString) };
  const resHeaders: Shape = { n: RESPONSE_LIMITS.headers + growth.count, w: resString, o: 3, key: str(resString), elem: resValues };
  // The last add-headers' own headers: at most what the policy's add-headers before the
  // expression add (`growth`: each name, its value, 4 bytes of line), up to 8192 bytes a value.
  const addedHeaders: Shape = { n: growth.count, w: growth.bytes, o: 1, key: str(Math.min(128, growth.bytes)), elem: str(Math.min(8192, growth.bytes)) };
  return { reqString, reqHeaders, queryParams, resString, resHeaders, addedHeaders };
}

/**
 * Fields of the registered object types (`cel.ts`, `cel-vars.ts`) and their bounds. `once`: the
 * cost of building the field's value on first read (the views cache it for the request).
 */
function objectField(b: Bounds, obj: string, field: string): { shape: Shape; cost: number; once?: number; onceKey?: string } | undefined {
  const s = (n: number) => ({ shape: str(n), cost: 0 });
  switch (`${obj}.${field}`) {
    case 'Request.method':
      return s(32); // llhttp accepts only the registered methods, the longest 11 characters
    case 'Request.host':
    case 'Request.path':
    case 'Request.query':
    case 'URL.host':
    case 'URL.authority':
    case 'URL.path':
    case 'URL.query':
    case 'URL.raw_query':
      return s(b.reqString);
    case 'Request.url':
      return { shape: { n: 0, w: b.reqString + 16, obj: 'URL' }, cost: 0 };
    case 'Request.user_agent':
      // The header, found by a scan; its fields parsed on first read (userAgentParse, once).
      return { shape: { n: 0, w: b.reqString, obj: 'UserAgent' }, cost: 0, once: headerScan(b.reqHeaders) };
    case 'UserAgent.name':
    case 'UserAgent.version':
    case 'UserAgent.os':
    case 'UserAgent.os_version':
    case 'UserAgent.device':
    case 'UserAgent.url':
      return { shape: str(MAX_USER_AGENT_PARSED), cost: 0, once: C.userAgentParse, onceKey: 'UserAgent.parse' };
    case 'UserAgent.is_mobile':
    case 'UserAgent.is_tablet':
    case 'UserAgent.is_desktop':
    case 'UserAgent.is_bot':
      // One parse, whichever fields are read.
      return { shape: SCALAR, cost: 0, once: C.userAgentParse, onceKey: 'UserAgent.parse' };
    case 'URL.scheme':
      return s(5);
    // `raw` is the scheme, `Host` and the target as sent: two parts of one head.
    case 'URL.raw':
      return s(b.reqString + 16);
    case 'URL.raw_path':
      return s(b.reqString);
    case 'URL.port':
      return { shape: SCALAR, cost: 0 };
    case 'Request.version':
      return s(16); // `HTTP/1.1`
    case 'Request.content_length':
      // Node's parsed headers of the request (one property read), or one header scan.
      return { shape: SCALAR, cost: 0, once: headerScan(b.reqHeaders) };
    case 'Request.content_type':
      // Found on first read (a header scan, none once the header map is built); its media type
      // cut and lower-cased when compared, its parameters parsed when read.
      return { shape: contentTypeShape(b.reqString, 'ReqContentType'), cost: 0, once: headerScan(b.reqHeaders) + b.reqString * C.scanChar };
    case 'Response.content_type':
      return { shape: contentTypeShape(b.resString, 'ResContentType'), cost: 0, once: headerScan(b.resHeaders) + b.resString * C.scanChar };
    case 'Response.content_length':
      return { shape: SCALAR, cost: 0, once: headerScan(b.resHeaders) };
    case 'ReqContentType.raw':
      return s(b.reqString);
    case 'ResContentType.raw':
      return s(b.resString);
    case 'ReqContentType.parameters':
    case 'ResContentType.parameters':
      return { shape: CONTENT_TYPE_PARAMETERS, cost: 0, once: MAX_CONTENT_TYPE_PARSED * C.contentTypeChar };
    case 'Request.cookies': {
      // Every `Cookie` value read once (on first use, kept for the request): each character,
      // and each cookie kept (at most MAX_REQUEST_COOKIES; more is an evaluation error).
      const values = b.reqHeaders.elem!;
      const cookie: Shape = { n: 0, w: b.reqString, obj: 'Cookie' };
      const list: Shape = { n: MAX_REQUEST_COOKIES, w: values.w, o: 1, elem: cookie };
      const shape: Shape = { n: MAX_REQUEST_COOKIES, w: values.w, o: 1, key: str(b.reqString), elem: list };
      return { shape, cost: 0, once: headerScan(b.reqHeaders) + values.w * C.reqCookieChar + MAX_REQUEST_COOKIES * C.cookieEntry };
    }
    case 'Request.content_encoding':
    case 'Response.content_encoding': {
      // The header's values found by a scan, split at `,` (a part per two characters, `a,`), each
      // trimmed and lower-cased; at most MAX_CONTENT_CODINGS kept (more is an evaluation error).
      const headers = obj === 'Request' ? b.reqHeaders : b.resHeaders;
      const values = headers.elem!;
      return { shape: { n: MAX_CONTENT_CODINGS, w: values.w, o: 1, elem: str(values.w) }, cost: 0, once: headerScan(headers) + values.w * C.parseChar + (values.w / 2) * C.node };
    }
    case 'Request.location':
      return { shape: str(b.reqString), cost: headerScan(b.reqHeaders) };
    case 'Response.location':
      return { shape: str(b.resString), cost: headerScan(b.resHeaders) };
    case 'Response.cookies': {
      // Every `Set-Cookie` line read once (on first use, kept for the response): each character,
      // each line a cookie built and filed, then each name's list sorted by path length.
      const values = b.resHeaders.elem!;
      const lines = Math.min(values.n, Math.floor(values.w / SET_COOKIE_LINE_BYTES));
      const cookie: Shape = { n: 0, w: b.resString, obj: 'Cookie' };
      const list: Shape = { n: lines, w: values.w, o: 1, elem: cookie };
      const shape: Shape = { n: lines, w: values.w, o: 1, key: str(b.resString), elem: list };
      const sort = lines * Math.log2(Math.max(2, lines)) * C.node;
      return { shape, cost: 0, once: headerScan(b.resHeaders) + values.w * C.resCookieChar + lines * (C.cookieLine + C.cookieEntry) + sort };
    }
    case 'Request.ts':
      return { shape: { n: 0, w: 0, obj: 'RequestTimestamps' }, cost: 0 };
    case 'Connection.ts':
      return { shape: { n: 0, w: 0, obj: 'ConnectionTimestamps' }, cost: 0 };
    case 'ConnectionTimestamps.start':
    case 'Connection.bytes_in':
    case 'Connection.bytes_out':
      return { shape: SCALAR, cost: 0 };
    case 'Connection.server_region':
      return s(64); // a node id
    case 'RequestTimestamps.header_received':
      return { shape: SCALAR, cost: 0 };
    case 'Connection.client_port':
      return { shape: SCALAR, cost: 0 };
    case 'Connection.server_ip':
      return s(64);
    // A host name (at most 253 characters) or an IPv6 literal, a port, an id, `https`.
    case 'Endpoint.host':
      return s(256);
    case 'Endpoint.addr':
      return s(264);
    case 'Endpoint.url':
      return s(280);
    case 'Endpoint.id':
      return s(64);
    case 'Endpoint.protocol':
      return s(8);
    case 'Endpoint.port':
      return { shape: SCALAR, cost: 0 };
    // A cookie (`getReqCookie` / `getResCookie`, `cookie-vars.ts`): its strings are parts of one
    // header value, `unparsed_attributes` one entry per other attribute of a `Set-Cookie` line.
    case 'Cookie.name':
    case 'Cookie.value':
    case 'Cookie.path':
    case 'Cookie.domain':
      return s(Math.max(b.reqString, b.resString));
    case 'Cookie.same_site':
      return s(8);
    case 'Cookie.unparsed_attributes':
      return { shape: { n: b.resString / 2, w: b.resString, o: 1, key: str(b.resString), elem: str(b.resString) }, cost: 0 };
    case 'Cookie.expires':
    case 'Cookie.max_age':
    case 'Cookie.secure':
    case 'Cookie.http_only':
      return { shape: SCALAR, cost: 0 };
    case 'URL.query_params':
      // Parsed on first use: one pass and one entry per parameter.
      return { shape: b.queryParams, cost: 0, once: b.queryParams.w * C.parseChar + b.queryParams.n * C.entry };
    case 'Request.headers':
      // Built on first use (and again after a header edit): one entry per header.
      return { shape: b.reqHeaders, cost: 0, once: b.reqHeaders.w * C.scanChar + b.reqHeaders.n * C.entry };
    case 'Response.headers':
      return { shape: b.resHeaders, cost: 0, once: b.resHeaders.w * C.scanChar + b.resHeaders.n * C.entry };
    case 'Connection.client_ip':
      return s(64); // an IPv6 address with a zone
    case 'Connection.tls':
      return { shape: { n: 0, w: 0, obj: 'TLS' }, cost: 0 };
    case 'Connection.geo':
      // Looked up in the GeoIP database on first read, then kept for the request.
      return { shape: { n: 0, w: 0, obj: 'Geo' }, cost: 0, once: GEO_LOOKUP_COST };
    case 'Geo.city':
    case 'Geo.country':
    case 'Geo.subdivision':
      return s(GEO_LIMITS.name);
    case 'Geo.country_code':
      return s(GEO_LIMITS.code);
    case 'Geo.latitude':
    case 'Geo.longitude':
    case 'Geo.radius':
      return s(GEO_LIMITS.number);
    case 'TLS.version':
      return s(TLS_LIMITS.version);
    case 'TLS.cipher_suite':
      return s(TLS_LIMITS.cipherSuite);
    case 'TLS.sni':
      return s(TLS_LIMITS.serverName);
    case 'TLS.negotiated_alpn':
      return s(TLS_LIMITS.alpn);
    case 'TLS.ja4_fingerprint':
      return s(TLS_LIMITS.ja4);
    case 'TLS.client':
      // Fetched and parsed on first use, then cached for the request.
      return { shape: { n: 0, w: 0, obj: 'ClientCertificate' }, cost: 0, once: CERTIFICATE_ONCE };
    case 'TLS.server':
      return { shape: { n: 0, w: 0, obj: 'Certificate' }, cost: 0, once: CERTIFICATE_ONCE };
    case 'Certificate.issuer':
    case 'Certificate.subject':
    case 'ClientCertificate.issuer':
    case 'ClientCertificate.subject':
      return { shape: { ...CERT.name, obj: 'DistinguishedName' }, cost: 0 };
    case 'Certificate.san':
    case 'ClientCertificate.san':
      return { shape: { ...CERT.sanText, obj: 'SubjectAltNames' }, cost: 0 };
    case 'Certificate.serial_number':
    case 'ClientCertificate.serial_number':
      return { shape: CERT.serial, cost: 0 };
    case 'Certificate.signature_algorithm':
    case 'ClientCertificate.signature_algorithm':
    case 'CertificateExtension.id':
      return { shape: CERT.oid, cost: 0 };
    case 'ClientCertificate.pem':
      return { shape: CERT.pem, cost: 0 };
    case 'Certificate.extensions':
    case 'ClientCertificate.extensions':
      return { shape: CERT.extensions, cost: 0 };
    case 'CertificateExtension.value':
      return { shape: CERT.attribute, cost: 0 };
    case 'Certificate.validity':
    case 'ClientCertificate.validity':
      return { shape: { n: 0, w: 0, obj: 'CertificateValidity' }, cost: 0 };
    case 'DistinguishedName.common_name':
      return { shape: CERT.attribute, cost: 0 };
    case 'DistinguishedName.country':
    case 'DistinguishedName.locality':
    case 'DistinguishedName.organization':
    case 'DistinguishedName.organizational_unit':
    case 'DistinguishedName.postal_code':
    case 'DistinguishedName.province':
    case 'DistinguishedName.street_address':
      return { shape: CERT.attributes, cost: 0 };
    case 'SubjectAltNames.dns_names':
    case 'SubjectAltNames.email_addresses':
    case 'SubjectAltNames.uris':
      return { shape: CERT.sanNames, cost: 0 };
    case 'SubjectAltNames.ip_addresses':
      return { shape: CERT.sanIps, cost: 0 };
    case 'Connection.server_port':
    case 'Response.status_code':
    case 'Time.now':
    case 'RateLimitResult.limited':
    case 'TLS.session_resumed':
    case 'CertificateExtension.critical':
    case 'CertificateValidity.not_before':
    case 'CertificateValidity.not_after':
      return { shape: SCALAR, cost: 0 };
    case 'Actions.ngrok':
    case 'Actions.service':
      return { shape: { n: 0, w: 0, obj: 'ActionResults' }, cost: 0 };
    case 'ActionResults.rate_limit':
      return { shape: { n: 0, w: 0, obj: 'RateLimitResult' }, cost: 0 };
    case 'RateLimitResult.error':
      return { shape: { n: 0, w: 0, obj: 'RateLimitError' }, cost: 0 };
    case 'RateLimitResult.bucket_key':
      // JSON of the key's values (host, client IP, whole header values), escapes doubling them.
      return s(2 * DYN_BOUND);
    case 'RateLimitError.code':
    case 'RateLimitError.message':
      return s(1024);
    // url-rewrite / redirect results (`url-action-vars.ts`); the bounds are `URL_ACTION_LIMITS`
    // (not imported: url-actions.ts imports this file): URLs of at most 4096 characters, at most
    // 32 `matches`, each a part of such a URL.
    case 'ActionResults.url_rewrite':
    case 'ActionResults.redirect':
      return { shape: { n: 0, w: 0, obj: 'UrlActionResult' }, cost: 0 };
    case 'UrlActionResult.url':
      return s(4096);
    case 'UrlActionResult.matches':
      return { shape: { n: 32, w: 32 * 4097, o: 1, elem: str(4096) }, cost: 0 };
    case 'UrlActionResult.error':
      return { shape: { n: 0, w: 0, obj: 'UrlActionError' }, cost: 0 };
    case 'UrlActionError.code':
    case 'UrlActionError.message':
      return s(1024);
    // jwt-validation results (`jwt-action-vars.ts`): at most JWT_MAX_TOKENS tokens, each decoded
    // from one request header (so its header, payload and signature are bounded by the head).
    case 'ActionResults.jwt_validation':
      return { shape: { n: 0, w: 0, obj: 'JwtValidationResult' }, cost: 0 };
    case 'JwtValidationResult.tokens':
      return { shape: { n: JWT_MAX_TOKENS, w: JWT_MAX_TOKENS * (REQUEST_LIMITS.headBytes + 1), o: 1, elem: { n: 0, w: REQUEST_LIMITS.headBytes, obj: 'JwtToken' } }, cost: 0 };
    case 'JwtToken.header':
    case 'JwtToken.payload':
      // Converted for CEL on first read: one pass over the decoded JSON.
      return { shape: dyn(REQUEST_LIMITS.headBytes), cost: 0, once: REQUEST_LIMITS.headBytes * C.buildChar };
    case 'JwtToken.signature':
      return s(REQUEST_LIMITS.headBytes);
    case 'JwtToken.location':
      return s(8);
    case 'JwtToken.location_property':
      return s(128);
    case 'JwtToken.verified':
      return { shape: SCALAR, cost: 0 };
    case 'JwtValidationResult.error':
      return { shape: { n: 0, w: 0, obj: 'JwtValidationError' }, cost: 0 };
    case 'JwtValidationError.code':
    case 'JwtValidationError.message':
      return s(1024);
    case 'ActionResults.restrict_ips':
      return { shape: { n: 0, w: 0, obj: 'RestrictIpsResult' }, cost: 0 };
    case 'RestrictIpsResult.action':
      return s(8); // `allow` or `deny`
    case 'RestrictIpsResult.matched_cidr':
      // Looked up on first read: one BlockList check (~0.1 µs) per CIDR of the action, at most
      // 1000 (`RESTRICT_IPS_LIMITS.maxCidrs`; not imported, access-actions.ts imports parse.ts).
      return { shape: str(64), cost: 0, once: 1000 * 150 };
    case 'RestrictIpsResult.error':
      return { shape: { n: 0, w: 0, obj: 'RestrictIpsError' }, cost: 0 };
    case 'RestrictIpsError.code':
    case 'RestrictIpsError.message':
      return s(1024);
    // verify-webhook / compress-response results (`body-action-vars.ts`).
    case 'ActionResults.verify_webhook':
      return { shape: { n: 0, w: 0, obj: 'VerifyWebhookResult' }, cost: 0 };
    case 'VerifyWebhookResult.verified':
    case 'CompressResult.already_compressed':
      return { shape: SCALAR, cost: 0 };
    case 'VerifyWebhookResult.error':
      return { shape: { n: 0, w: 0, obj: 'VerifyWebhookError' }, cost: 0 };
    case 'VerifyWebhookError.code':
    case 'VerifyWebhookError.message':
      return s(1024);
    case 'ActionResults.compress':
      return { shape: { n: 0, w: 0, obj: 'CompressResult' }, cost: 0 };
    case 'ActionResults.add_headers':
      return { shape: { n: 0, w: 0, obj: 'AddHeadersResult' }, cost: 0 };
    case 'AddHeadersResult.headers_added':
      // Built on first read: one entry and one UTF-8 read per header (`Bounds.addedHeaders`).
      return { shape: b.addedHeaders, cost: 0, once: b.addedHeaders.n * C.entry + b.addedHeaders.w * C.scanChar };
    case 'CompressResult.negotiated_algorithm':
      return s(8); // `br`, `gzip` or `deflate`
    // oauth / openid-connect results (`auth-action-vars.ts`): identity values are capped at
    // AUTH_IDENTITY_MAX_CHARS (1024; not imported, to keep this file's imports as they are).
    case 'ActionResults.oauth':
      return { shape: { n: 0, w: 0, obj: 'OAuthResult' }, cost: 0 };
    case 'ActionResults.oidc':
      return { shape: { n: 0, w: 0, obj: 'OidcResult' }, cost: 0 };
    case 'OAuthResult.identity':
      return { shape: { n: 0, w: 0, obj: 'OAuthIdentity' }, cost: 0 };
    case 'OidcResult.identity':
      return { shape: { n: 0, w: 0, obj: 'OidcIdentity' }, cost: 0 };
    case 'OAuthResult.error':
    case 'OidcResult.error':
      return { shape: { n: 0, w: 0, obj: 'AuthError' }, cost: 0 };
    case 'OAuthIdentity.id':
    case 'OAuthIdentity.email':
    case 'OAuthIdentity.name':
    case 'OAuthIdentity.provider_user_id':
    case 'OAuthIdentity.current_provider_session_id':
    case 'OidcIdentity.id':
    case 'OidcIdentity.email':
    case 'OidcIdentity.name':
    case 'OidcIdentity.provider_user_id':
    case 'OidcIdentity.current_session_id':
    case 'OAuthResult.access_token':
    case 'OAuthResult.refresh_token':
    case 'OAuthResult.expires_at':
    case 'OidcResult.identity_token':
    case 'OidcResult.access_token':
    case 'OidcResult.refresh_token':
    case 'OidcResult.expires_at':
    case 'AuthError.code':
    case 'AuthError.message':
      return s(1024);
    case 'OAuthResult.session_timed_out':
    case 'OAuthResult.session_max_duration_reached':
    case 'OAuthResult.userinfo_refreshed':
    case 'OidcResult.session_timed_out':
    case 'OidcResult.session_max_duration_reached':
    case 'OidcResult.user_info_refreshed':
    case 'OidcResult.userinfo_refreshed':
      return { shape: SCALAR, cost: 0 };
    case 'ActionResults.basic_auth':
      return { shape: { n: 0, w: 0, obj: 'BasicAuthResult' }, cost: 0 };
    case 'BasicAuthResult.credentials':
      return { shape: { n: 0, w: 0, obj: 'BasicAuthCredentials' }, cost: 0 };
    case 'BasicAuthCredentials.presented':
    case 'BasicAuthCredentials.authorized':
      return { shape: SCALAR, cost: 0 };
    case 'BasicAuthCredentials.username':
      // Decoded from the Authorization header's base64: shorter than the head.
      return s(REQUEST_LIMITS.headBytes);
  }
  return undefined;
}

/** Macros that look a name up in the request or response headers or the query (`cel.ts`). */
const LOOKUP_MACROS = new Set(['getReqHeader', 'hasReqHeader', 'getResHeader', 'hasResHeader', 'getQueryParam', 'hasQueryParam']);
/** Macros that read a cookie off the `Cookie` or `Set-Cookie` headers (`cookie-vars.ts`). */
const COOKIE_MACROS = new Set(['getReqCookie', 'hasReqCookie', 'getResCookie', 'hasResCookie']);

/** The estimate's result for one node: its cost and the bound of its value. */
interface Est {
  cost: number;
  shape: Shape;
}

/** Minimal view of cel-js AST nodes (`parser.js`): `op`, `args`, and macro metadata. */
interface Node {
  op: string;
  args: unknown;
  meta: { alternate?: Node; macro?: Record<string, unknown> };
}

interface ComprehensionArgs {
  iterable: Node;
  iterVarName: string;
  init: Node;
  step: Node;
  kind?: string;
}

/** Thrown when an expression is beyond what the estimator bounds (e.g. nesting too deep). */
export class CostEstimateError extends Error {}

class Estimator {
  private readonly b: Bounds;
  private readonly scope = new Map<string, Shape[]>();
  /**
   * Values built on first read and then cached by the request's views (the header map, the
   * query parameters): charged once per evaluation, wherever and however often they are read.
   */
  readonly once = new Map<string, number>();
  private depth = 0;

  constructor(
    growth: PolicyHeaderGrowth,
    private readonly dfaBudget: DfaExploreBudget,
  ) {
    this.b = bounds(growth);
  }

  private bind<T>(name: string, shape: Shape, fn: () => T): T {
    const stack = this.scope.get(name) ?? [];
    stack.push(shape);
    this.scope.set(name, stack);
    try {
      return fn();
    } finally {
      stack.pop();
    }
  }

  est(node: Node): Est {
    if (node.meta.alternate) return this.est(node.meta.alternate);
    const r = this.op(node);
    return { cost: r.cost + C.node, shape: r.shape };
  }

  private op(node: Node): Est {
    const args = node.args;
    switch (node.op) {
      case 'value':
        return { cost: 0, shape: typeof args === 'string' ? str(args.length) : args instanceof Uint8Array ? str(args.length) : SCALAR };
      case 'id':
        return { cost: 0, shape: this.variable(args as string) };
      case 'accuValue':
      case 'accuInc':
        return { cost: 0, shape: SCALAR };
      case 'accuPush': {
        const v = this.est(args as Node);
        return { cost: v.cost + C.element, shape: v.shape };
      }
      case '.':
      case '.?':
        return this.field(args as [Node, string]);
      case '[]':
      case '[?]':
        return this.index(args as [Node, Node]);
      case 'list': {
        let cost = 0;
        let elem: Shape | undefined;
        let w = 0;
        for (const e of args as Node[]) {
          const x = this.est(e);
          cost += x.cost + C.element;
          elem = elem ? widest(elem, x.shape) : x.shape;
          w += x.shape.w + 1;
        }
        return { cost, shape: { n: (args as Node[]).length, w, elem: elem ?? SCALAR } };
      }
      case 'map': {
        let cost = 0;
        let key: Shape | undefined;
        let elem: Shape | undefined;
        let w = 0;
        for (const [k, v] of args as [Node, Node][]) {
          const a = this.est(k);
          const x = this.est(v);
          cost += a.cost + x.cost + C.element + a.shape.w * C.scanChar;
          key = key ? widest(key, a.shape) : a.shape;
          elem = elem ? widest(elem, x.shape) : x.shape;
          w += a.shape.w + x.shape.w + 1;
        }
        return { cost, shape: { n: (args as unknown[]).length, w, key: key ?? SCALAR, elem: elem ?? SCALAR } };
      }
      case 'comprehension':
        return this.comprehension(args as ComprehensionArgs);
      case 'call':
      case 'rcall':
        return this.call(node);
      case '?:': {
        const [c, t, f] = (args as Node[]).map((n) => this.est(n)) as [Est, Est, Est];
        return { cost: c.cost + Math.max(t.cost, f.cost), shape: widest(t.shape, f.shape) };
      }
      case '||':
      case '&&': {
        // Both sides may run (an error on the left is absorbed by a true right).
        const [l, r] = (args as Node[]).map((n) => this.est(n)) as [Est, Est];
        return { cost: l.cost + r.cost, shape: SCALAR };
      }
      case '!_':
      case '-_':
        return { cost: this.est(args as Node).cost, shape: SCALAR };
      case '==':
      case '!=':
      case '<':
      case '<=':
      case '>':
      case '>=': {
        const [l, r] = (args as Node[]).map((n) => this.est(n)) as [Est, Est];
        return { cost: l.cost + r.cost + Math.min(l.shape.w, r.shape.w) * C.scanChar, shape: SCALAR };
      }
      case 'in': {
        const [l, r] = (args as Node[]).map((n) => this.est(n)) as [Est, Est];
        const compare = C.node + l.shape.w * C.scanChar;
        // A list is scanned (each element compared); a map is looked up (the key hashed).
        const isMap = r.shape.key !== undefined;
        return { cost: l.cost + r.cost + (isMap ? compare : r.shape.n * compare + r.shape.w * C.scanChar), shape: SCALAR };
      }
      case '+': {
        const [l, r] = (args as Node[]).map((n) => this.est(n)) as [Est, Est];
        const isList = l.shape.elem !== undefined && r.shape.elem !== undefined && !l.shape.key;
        if (isList) {
          const n = l.shape.n + r.shape.n;
          return { cost: l.cost + r.cost + n * C.element, shape: { n, w: l.shape.w + r.shape.w, elem: widest(l.shape.elem!, r.shape.elem!) } };
        }
        // Strings (and req.url as one): the result is as long as both together.
        const n = l.shape.w + r.shape.w;
        return { cost: l.cost + r.cost + C.arithmetic + n * C.scanChar, shape: str(n) };
      }
      case '-':
      case '*':
      case '/':
      case '%': {
        const [l, r] = (args as Node[]).map((n) => this.est(n)) as [Est, Est];
        return { cost: l.cost + r.cost + C.arithmetic, shape: SCALAR };
      }
    }
    throw new CostEstimateError(`unexpected expression node ${JSON.stringify(node.op)}`);
  }

  private variable(name: string): Shape {
    const bound = this.scope.get(name);
    if (bound && bound.length > 0) return bound[bound.length - 1]!;
    switch (name) {
      case 'req':
        return { n: 0, w: 0, obj: 'Request' };
      case 'conn':
        return { n: 0, w: 0, obj: 'Connection' };
      case 'endpoint':
        return { n: 0, w: 0, obj: 'Endpoint' };
      case 'res':
        return { n: 0, w: 0, obj: 'Response' };
      case 'actions':
        return { n: 0, w: 0, obj: 'Actions' };
      case 'time':
        return { n: 0, w: 0, obj: 'Time' };
      case 'vars':
        return VARS;
    }
    return DYN;
  }

  private field([target, name]: [Node, string]): Est {
    const t = this.est(target);
    if (t.shape.obj) {
      const f = objectField(this.b, t.shape.obj, name);
      if (f?.once) this.once.set(f.onceKey ?? `${t.shape.obj}.${name}`, f.once);
      if (f) return { cost: t.cost + f.cost, shape: f.shape };
      return { cost: t.cost, shape: DYN };
    }
    // A map's entry (`m.key`), looked up by a short literal key.
    return { cost: t.cost, shape: t.shape.elem ?? DYN };
  }

  private index([target, key]: [Node, Node]): Est {
    const t = this.est(target);
    const k = this.est(key);
    const cost = t.cost + k.cost + k.shape.w * C.scanChar;
    if (t.shape.obj) {
      const f = key.op === 'value' && typeof key.args === 'string' ? objectField(this.b, t.shape.obj, key.args) : undefined;
      if (f?.once) this.once.set(f.onceKey ?? `${t.shape.obj}.${key.args as string}`, f.once);
      return f ? { cost: cost + f.cost, shape: f.shape } : { cost, shape: DYN };
    }
    return { cost, shape: t.shape.elem ?? DYN };
  }

  /**
   * `range.exists(x, body)` and the other macros: the range's cost, then the body once per
   * element. For a range whose elements vary in size (request data: a header's values), the
   * body's cost is taken at an empty element and at a full-size one, and the total bounded by
   * the most expensive mix that fits in the range's total size `w` (elements each taking
   * their size plus `o`) and count `n`: a linear program over two kinds of element, exact for
   * a body whose cost grows linearly with its element and sound for one that grows faster.
   * `matches()` stops growing at `MAX_MATCH_INPUT`, so that size is tried as a full element too.
   */
  private comprehension(a: ComprehensionArgs): Est {
    if (++this.depth > MAX_COMPREHENSION_NESTING) throw new CostEstimateError(`comprehensions (exists, all, map, filter…) are nested more than ${MAX_COMPREHENSION_NESTING} deep`);
    try {
      const range = this.est(a.iterable);
      const init = this.est(a.init);
      const r = range.shape;
      // A map is iterated over its keys.
      const elem = (r.key ?? r.elem ?? DYN) as Shape;
      const step = (e: Shape) => this.bind(a.iterVarName, e, () => this.est(a.step));
      const full = step(elem);
      // Every element at its largest: always an upper bound.
      const uniform = r.n * (full.cost + C.iteration);
      let mixed = 0;
      if (elem.w > 0) {
        const g0 = step(scaled(elem, 0)).cost + C.iteration;
        for (const p of new Set([elem.w, Math.min(elem.w, MAX_MATCH_INPUT)])) {
          const gp = (p === elem.w ? full : step(scaled(elem, p))).cost + C.iteration;
          mixed = Math.max(mixed, mix(r.n, r.w, r.o ?? 0, p, g0, gp));
        }
      }
      const total = elem.w > 0 ? Math.min(uniform, mixed) : uniform;
      // Result: a bool (quantifiers) or a list as long as the range (map, filter).
      const shape = a.kind === 'quantifier' || init.shape.elem === undefined ? SCALAR : { n: r.n, w: r.n * (full.shape.w + 1), elem: full.shape };
      return { cost: range.cost + init.cost + total, shape };
    } finally {
      this.depth--;
    }
  }

  private call(node: Node): Est {
    const isR = node.op === 'rcall';
    const parts = node.args as unknown[];
    const name = parts[0] as string;
    const receiver = isR ? (parts[1] as Node) : undefined;
    const argNodes = (isR ? parts[2] : parts[1]) as Node[];
    const macro = node.meta.macro;

    if (name === 'matches' && macro) {
      const [subject, pattern] = receiver ? [receiver, argNodes[0]!] : [argNodes[0]!, argNodes[1]!];
      const s = this.est(subject);
      const p = this.est(pattern);
      const describe = macro.regexCost as ((b: DfaExploreBudget, small: number) => RegexCostInfo) | undefined;
      const info = describe ? describe(this.dfaBudget, DFA_SAFE_PROGRAM_SIZE) : {};
      return { cost: s.cost + p.cost + regexCost(info, s.shape.w), shape: SCALAR };
    }
    if (LOOKUP_MACROS.has(name) && macro) {
      const k = this.est(argNodes[0]!);
      const shape = (src: Shape) => (name.startsWith('get') ? src.elem! : SCALAR);
      if (name.endsWith('QueryParam')) {
        // A look-up in `req.url.query_params`, which is parsed on first use (as when read directly).
        const q = objectField(this.b, 'URL', 'query_params')!;
        this.once.set('URL.query_params', q.once!);
        return { cost: k.cost + k.shape.w * C.scanChar, shape: shape(q.shape) };
      }
      // A scan of the raw header pairs, comparing names.
      const src = name.endsWith('ReqHeader') ? this.b.reqHeaders : this.b.resHeaders;
      return { cost: k.cost + src.n * C.node + src.w * C.scanChar, shape: shape(src) };
    }
    if (COOKIE_MACROS.has(name) && macro) {
      const arg = argNodes[0]!;
      const k = this.est(arg);
      const res = name.endsWith('ResCookie');
      const headers = res ? this.b.resHeaders : this.b.reqHeaders;
      // The `Cookie` (or `Set-Cookie`) values found by a scan of the header pairs, then read.
      const values = headers.elem!;
      const perChar = res ? C.resCookieChar : C.reqCookieChar;
      let read = headers.n * C.node + headers.w * C.scanChar;
      if (!res) read += values.w * perChar;
      else {
        // Each Set-Cookie line costs `cookieLine` and takes SET_COOKIE_LINE_BYTES of the head
        // besides its characters: the worst is one line of every character, or as many empty
        // lines as fit.
        const lines = Math.min(values.n, Math.floor(values.w / SET_COOKIE_LINE_BYTES));
        read += Math.max(C.cookieLine + values.w * perChar, lines * C.cookieLine);
      }
      // The views keep each name's cookie for the request (`CelRequest.cookie`, for get and has
      // alike): a literal name is read once per evaluation however often it is asked for.
      const literal = arg.op === 'value' && typeof arg.args === 'string' ? arg.args : undefined;
      let cost = k.cost + k.shape.w * C.scanChar;
      if (literal === undefined) cost += read;
      else this.once.set(`${res ? 'Response' : 'Request'}.cookie\n${literal}`, read);
      return { cost, shape: name.startsWith('get') ? { n: 0, w: 0, obj: 'Cookie' } : SCALAR };
    }
    if ((name === 'inCidrRange' || name === 'inCidrRanges') && macro) {
      const ip = this.est(argNodes[0]!);
      const cidrs = this.est(argNodes[1]!);
      const literal = macro.literalCidrs as number | undefined;
      // The address read once; literal CIDRs were parsed with the policy, computed ones are
      // parsed here (each like an address).
      let cost = ip.cost + cidrs.cost + C.ipParse + ip.shape.w * C.scanChar;
      if (literal !== undefined) cost += literal * C.cidrMatch;
      else {
        const n = name === 'inCidrRange' ? 1 : cidrs.shape.n;
        cost += n * (C.ipParse + C.cidrMatch) + cidrs.shape.w * C.scanChar;
      }
      return { cost, shape: SCALAR };
    }
    if (name === 'has' && macro) {
      const inner = argNodes[0]!;
      return { cost: this.est(inner).cost, shape: SCALAR };
    }
    if (name === 'bind' && macro && receiver) {
      // cel.bind(var, value, expr)
      const v = this.est(argNodes[1]!);
      const e = this.bind((argNodes[0]!.args as string) ?? '', v.shape, () => this.est(argNodes[2]!));
      return { cost: v.cost + e.cost, shape: e.shape };
    }
    if (name === 'sortBy' && macro && receiver) {
      // l.sortBy(x, key): the key once per element (as a comprehension's step, its characters
      // compared once per level of the sort), then the keys sorted.
      if (++this.depth > MAX_COMPREHENSION_NESTING) throw new CostEstimateError(`comprehensions (exists, all, map, filter…) are nested more than ${MAX_COMPREHENSION_NESTING} deep`);
      try {
        const range = this.est(receiver);
        const r = range.shape;
        const n = Math.min(r.n, MAX_BUILT_LIST);
        const levels = n > 1 ? Math.log2(n) + 1 : 0;
        const step = (e: Shape) => {
          const key = this.bind((argNodes[0]!.args as string) ?? '', e, () => this.est(argNodes[1]!));
          return key.cost + C.iteration + C.element + key.shape.w * levels * C.scanChar;
        };
        const elem = r.elem ?? DYN;
        const full = step(elem);
        let total = n * full;
        // As for a comprehension: the most expensive mix of empty and full-size elements that fits the list.
        if (elem.w > 0) {
          const g0 = step(scaled(elem, 0));
          let mixed = 0;
          for (const p of new Set([elem.w, Math.min(elem.w, MAX_MATCH_INPUT)])) mixed = Math.max(mixed, mix(n, r.w, r.o ?? 0, p, g0, p === elem.w ? full : step(scaled(elem, p))));
          total = Math.min(total, mixed);
        }
        return { cost: range.cost + total + (n > 1 ? n * Math.log2(n) * C.listCompare : 0), shape: r };
      } finally {
        this.depth--;
      }
    }
    // cel-go's indexOf / lastIndexOf / substring (`string-index.ts`) and the accessors that take
    // a time zone (`time-zones.ts`) are macros only to take over the library's overloads: costed
    // below as the methods they are.
    if (macro && !CODE_POINT_METHODS.has(name) && !(ZONED.has(name) && argNodes.length === 1)) throw new CostEstimateError(`no cost known for ${name}()`);

    // `base64.decode(s)`, `url.escape(s)`, `hash.sha256(s)`: the namespace is a constant, the
    // call works on its arguments.
    const ns = receiver && receiver.op === 'id' && NAMESPACES.has(receiver.args as string) && !this.scope.get(receiver.args as string)?.length ? (receiver.args as string) : undefined;
    if (ns !== undefined) return this.ngrokMacro(`${ns}.${name}`, argNodes.map((n) => this.est(n)), argNodes);
    const recv = receiver ? this.est(receiver) : undefined;
    const xs = argNodes.map((n) => this.est(n));
    if (recv && NGROK_STRING_METHODS.has(name)) return this.ngrokMacro(name, [recv, ...xs], argNodes, true, receiver);
    const cost0 = (recv?.cost ?? 0) + xs.reduce((t, x) => t + x.cost, 0);
    const self = recv?.shape ?? xs[0]?.shape ?? SCALAR;
    const arg = (recv ? xs[0] : xs[1])?.shape;
    /** Characters of the string the call works on (`req.url` as its string: its `w`). */
    const len = self.w;
    const fn = (cost: number, shape: Shape): Est => ({ cost: cost0 + cost, shape });
    switch (name) {
      case 'size':
        // Strings count code points; lists and maps know their size.
        return fn((self.elem || self.key) && self.elem !== self ? 0 : len * C.sizeChar, SCALAR);
      case 'contains':
      case 'startsWith':
      case 'endsWith':
        return fn((len + (arg?.w ?? 0)) * C.scanChar, SCALAR);
      case 'indexOf':
      case 'lastIndexOf':
        // A search, and for a string with surrogates its indices converted to code points.
        return fn((len + (arg?.w ?? 0)) * (C.scanChar + C.codePointIndexChar), SCALAR);
      case 'substring':
        return fn(len * (C.scanChar + C.codePointIndexChar), str(len));
      case 'lowerAscii':
      case 'upperAscii':
      case 'trim':
        return fn(len * C.scanChar, str(len));
      case 'string':
        // Of a number, a timestamp or a duration: its text, at most ~40 characters.
        return fn(len * C.scanChar, str(Math.max(len, 40)));
      case 'split': {
        // At most one piece per character (and one more); they hold the string's characters.
        const n = len + 1;
        return fn(len * C.buildChar + n * C.element, { n, w: 2 * len + 1, o: 0, elem: str(len) });
      }
      case 'join': {
        const sep = arg?.w ?? 0;
        const n = self.w + self.n * sep;
        return fn(n * C.buildChar, str(n));
      }
      case 'bytes':
        // A string's UTF-8: up to 3 bytes per UTF-16 unit.
        return fn(len * C.buildChar, str(3 * len + 4));
      case 'hex':
      case 'base64':
        return fn(len * C.buildChar, str(2 * len + 4));
      case 'json':
        return fn(len * C.buildChar, DYN);
      case 'int':
      case 'uint':
      case 'double':
      case 'bool':
      case 'duration':
      case 'timestamp':
      case 'type':
      case 'at':
      case 'dyn':
        return fn(len * C.scanChar, name === 'dyn' ? self : SCALAR);
    }
    // Timestamp and duration accessors (getHours(), …): constant work; with a time zone, the
    // zone read (a fixed offset), or its rules looked up (an IANA name: made once per name and
    // kept, unless the name is computed).
    if (ZONED.has(name) && argNodes.length === 1) {
      const z = argNodes[0]!;
      const literal = z.op === 'value' && typeof z.args === 'string' ? z.args : undefined;
      return fn((arg?.w ?? 0) * C.scanChar + (literal === undefined ? C.timeZoneLoad : literal.includes(':') ? C.timeZoneOffset : C.timeZoneCall), SCALAR);
    }
    if (name.startsWith('get')) return fn(len * C.scanChar, SCALAR);
    throw new CostEstimateError(`no cost known for ${name}()`);
  }

  /**
   * ngrok's string, base64, URL, hash and JSON macros (`ngrok-macros.ts`): `xs` are the estimates of
   * the string worked on and the call's arguments (`s.replace(a, b)`: s, a, b; `hash.md5(s)`: s),
   * `argNodes` the call's argument nodes (literals give tighter bounds).
   */
  private ngrokMacro(name: string, xs: Est[], argNodes: Node[], method = false, receiverNode?: Node): Est {
    const cost0 = xs.reduce((t, x) => t + x.cost, 0);
    const len = xs[0]?.shape.w ?? 0;
    const fn = (cost: number, shape: Shape): Est => ({ cost: cost0 + cost, shape });
    const base64Of = (bytes: number) => 4 * Math.ceil(bytes / 3);
    switch (name) {
      case 'lower':
      case 'upper':
        return fn(len * C.caseChar, str(len));
      case 'reverse':
        return fn(len * C.codePointChar, str(len));
      case 'charAt':
        return fn(len * C.codePointChar, str(2));
      case 'replace': {
        const oldNode = argNodes[0]!;
        const newLen = xs[2]!.shape.w;
        const literal = oldNode.op === 'value' && typeof oldNode.args === 'string' ? oldNode.args : undefined;
        const countNode = argNodes[2];
        const count = countNode?.op === 'value' && typeof countNode.args === 'bigint' && countNode.args >= 0n ? Number(countNode.args) : Infinity;
        // Occurrences: one per `old.length` units of a literal, else (an empty `old`) one per
        // unit and one at the end; at most `n`.
        const matches = Math.min(count, literal ? Math.floor(len / literal.length) : len + 1);
        const grows = Math.max(0, newLen - (literal?.length ?? 0));
        // Longer than MAX_BUILT_STRING is refused at run time, after the search.
        const out = Math.min(MAX_BUILT_STRING, len + matches * grows);
        return fn(len * C.scanChar + matches * C.replaceMatch + out * C.scanChar, str(out));
      }
      case 'encodeBase64':
        return fn(len * C.base64Char, str(base64Of(3 * len)));
      case 'base64.encode':
        return fn(len * C.base64Char, str(base64Of(len)));
      case 'decodeBase64':
      case 'base64.decode':
        return fn(len * C.base64Char, str(Math.ceil((3 * len) / 4)));
      case 'escapeUrl':
      case 'url.escape':
        return fn(len * C.urlEscapeChar, str(9 * len));
      case 'unescapeUrl':
      case 'url.unescape':
        return fn(len * C.urlUnescapeChar, str(len));
      case 'strings.quote':
        return fn(len * C.quoteChar, str(2 * len + 2));
      case 'isJson':
        return fn(len * C.jsonChar, SCALAR);
      case 'decodeJson':
      case 'json.decode':
        // A value of unknown shape, no larger than its text.
        return fn(len * C.jsonChar, dyn(len));
      case 'encodeJson':
      case 'json.encode': {
        // The writer stops past MAX_BUILT_STRING characters (each unit of weight writes at least
        // one; a string or map that cannot fit is refused before it is escaped or sorted): work
        // on at most that much. A number writes up to 24 characters, a character up to 6.
        const v = xs[0]!.shape;
        const w = Math.min(v.w, MAX_BUILT_STRING);
        // Keys sorted: each takes at least 5 characters (`"":0,`); a flat map has at most its n.
        const keys = v.key && !(v.elem && hasMap(v.elem)) ? Math.min(v.n, w / 5) : hasMap(v) ? w / 5 : 0;
        return fn(w * C.jsonEncodeChar + sortCost(keys), str(Math.min(MAX_BUILT_STRING, 24 * v.w + 2)));
      }
      case 'decodeQueryString':
      case 'queryString.decode': {
        // At most one pair per 2 characters (`a&`); keys and values no longer than the text.
        const n = Math.floor(len / 2) + 1;
        return fn(len * C.queryDecodeChar + n * C.element, { n, w: len + n, key: str(len), elem: str(len) });
      }
      case 'encodeQueryString':
      case 'queryString.encode': {
        // Each unit of the map's weight escaped (up to 9 characters), its keys sorted; the
        // result stops past MAX_BUILT_STRING.
        const m = xs[0]!.shape;
        const w = Math.min(m.w, MAX_BUILT_STRING);
        return fn(w * C.urlEscapeChar + sortCost(Math.min(m.n, w / 2)), str(Math.min(MAX_BUILT_STRING, 11 * m.w)));
      }
      case 'parseUrl':
      case 'url.parse':
        // 13 strings (`PARSED_URL_KEYS`), each at most the URL's bytes escaped (`user`: 3 per byte).
        return fn(C.urlParseCall + len * C.urlParseChar, { n: 13, w: 13 * (9 * len + 1), key: str(12), elem: str(9 * len) });
      case 'isURL':
        return fn(C.urlParseCall + len * C.urlParseChar, SCALAR);
      case 'basic_auth.encode': {
        const chars = len + (xs[1]?.shape.w ?? 0) + 1;
        return fn(chars * C.base64Char, str(6 + base64Of(3 * chars)));
      }
      case 'lists.range': {
        // A literal n: that many elements; a computed one: up to MAX_LIST_RANGE (past it, an error).
        const nNode = argNodes[0];
        const literal = nNode?.op === 'value' && typeof nNode.args === 'bigint' ? Number(nNode.args) : undefined;
        const n = Math.max(0, Math.min(MAX_LIST_RANGE, literal ?? MAX_LIST_RANGE));
        return fn(C.node + n * C.element, { n, w: 2 * n, elem: SCALAR });
      }
      case 'rand.double':
        return fn(C.node, SCALAR);
      case 'rand.int':
        return fn(C.randInt, SCALAR);
      case 'isQueryString':
        return fn(len * C.queryCheckChar, SCALAR);
      case 'isPrivateIp':
        // Only a string of at most 64 characters is parsed.
        return fn(C.ipParse, SCALAR);
      case 'format': {
        // Clauses: a literal format string's, else one per 2 characters (`%s`); each takes an
        // element of the list (past its end, an error).
        const list = xs[1]!.shape;
        const literal = receiverNode?.op === 'value' && typeof receiverNode.args === 'string' ? formatClauses(receiverNode.args) : undefined;
        const clauses = Math.min(list.n, literal?.clauses ?? Math.floor(len / 2));
        const precision = literal?.precision ?? MAX_FORMAT_PRECISION;
        // Written: the format's text, and per clause a double in fixed point (309 digits, a
        // point, the precision) or its element by %s (each unit of weight up to 330 characters:
        // a double's digits); at most MAX_BUILT_STRING (past it, an error, found as it is written).
        const out = Math.min(MAX_BUILT_STRING, len + clauses * (310 + precision) + 330 * list.w);
        // Values inside lists and maps (each writes at least one character, with its separator).
        const elem = list.elem ?? DYN;
        const inside = Math.min(clauses * elem.n, list.w);
        const nested = Math.min((elem.elem ? formatValuesCost(elem.elem, inside, list.w) : 0) + (elem.key ? formatValuesCost(elem.key, inside, list.w) : 0), out * C.formatValue);
        // Each map's keys sorted (an entry writes at least 4 characters).
        const maps = formatMapKeys(list.elem ?? DYN, out / 4);
        const keys = clauses > 0 && maps.keys > 1 ? Math.min(out / 4, clauses * maps.keys) * Math.log2(Math.max(2, maps.largest)) * C.sortKey : 0;
        return fn(len * C.scanChar + clauses * C.formatClause + nested + out * C.formatChar + keys, str(out));
      }
      case 'slice': {
        // Literal bounds: that many elements; else up to the whole list.
        const l = xs[0]!.shape;
        const [a, b] = argNodes.map((x) => (x.op === 'value' && typeof x.args === 'bigint' ? Number(x.args) : undefined));
        const n = a !== undefined && b !== undefined ? Math.max(0, Math.min(l.n, b - a)) : l.n;
        return fn(C.node + n * C.element, { ...l, n });
      }
      case 'flatten': {
        // Walks every element down to the depth (each counts in the list's weight), at most
        // MAX_BUILT_LIST; the result's elements are of any of those levels.
        const l = xs[0]!.shape;
        const dNode = argNodes[0];
        const depth = dNode === undefined ? 1 : dNode.op === 'value' && typeof dNode.args === 'bigint' ? Math.max(0, Math.min(MAX_FLATTEN_DEPTH, Number(dNode.args))) : MAX_FLATTEN_DEPTH;
        const walked = Math.min(MAX_BUILT_LIST, l.w);
        let elem = l.elem ?? DYN;
        for (let level = elem, i = 0; i < depth && level.elem && !level.key; i++) {
          level = level.elem;
          elem = widest(elem, level);
        }
        return fn(C.node + walked * C.element, { n: walked, w: l.w, elem });
      }
      case 'sort': {
        const l = xs[0]!.shape;
        const n = Math.min(l.n, MAX_BUILT_LIST);
        return fn(n * C.element + listSortCost(n, l.w), l);
      }
      case 'distinct': {
        // An equality key per element, of its characters (at most MAX_DISTINCT_CHARS together).
        const l = xs[0]!.shape;
        const n = Math.min(l.n, MAX_BUILT_LIST);
        const e = l.elem ?? DYN;
        const inside = Math.min(n * e.n, l.w);
        const values = (e.elem ? valuesWithin(e.elem, inside, l.w) : 0) + (e.key ? valuesWithin(e.key, inside, l.w) : 0);
        return fn(n * C.distinctElement + Math.min(values, l.w, MAX_DISTINCT_CHARS) * C.distinctValue + Math.min(l.w, MAX_DISTINCT_CHARS) * C.distinctChar, l);
      }
    }
    const hash = method ? name : name.startsWith('hash.') ? name.slice(5) : '';
    const digest = Object.hasOwn(HASH_DIGEST_BYTES, hash) ? HASH_DIGEST_BYTES[hash as NgrokHash] : undefined;
    // Hex is the longer of the two formats.
    if (digest !== undefined && (hash === 'crc64' || hash === 'xxhash64')) return fn(C.hash64Call + len * C.hash64Char, str(2 * digest));
    if (digest !== undefined) return fn(C.hashCall + len * C.hashChar, str(2 * digest));
    throw new CostEstimateError(`no cost known for ${name}()`);
  }
}

/** The namespaces of ngrok's macros Warren has (`ngrok-macros.ts`): constants, not variables. */
const NAMESPACES = new Set(['base64', 'url', 'hash', 'strings', 'json', 'queryString', 'basic_auth', 'lists', 'rand']);
/** ngrok's string (and list and map) methods (`ngrok-macros.ts`), costed by `ngrokMacro`. */
const NGROK_STRING_METHODS = new Set([
  ...['lower', 'upper', 'reverse', 'charAt', 'replace', 'encodeBase64', 'decodeBase64', 'escapeUrl', 'unescapeUrl', 'isJson', 'decodeJson', ...NGROK_HASHES],
  ...['encodeJson', 'decodeQueryString', 'encodeQueryString', 'parseUrl', 'isURL'],
  ...['isQueryString', 'isPrivateIp', 'format', 'slice', 'flatten', 'sort', 'distinct'],
]);

/** Cost of sorting `n` map keys (Go's order; `sortUtf8`). */
const sortCost = (n: number): number => (n > 1 ? n * Math.log2(n) * C.sortKey : 0);

/**
 * The sum of `each(shape, k)` over `count` values of shape `e` and every value inside them (a
 * list's elements, a map's keys and values, at any depth): the values inside are at most `count`
 * times the elements each holds, and at most what fits in `budget` (the weight of the value they
 * are drawn from, each element taking its `o` besides itself). Infinite for values of unknown
 * shape (callers cap it by what can be written).
 */
function overValuesWithin(e: Shape, count: number, budget: number, each: (s: Shape, k: number) => number, seen = new Set<Shape>()): number {
  if (count <= 0) return 0;
  const here = each(e, count);
  if (!e.elem && !e.key) return here;
  if (seen.has(e)) return Infinity;
  seen.add(e);
  const inside = Math.min(count * e.n, budget / Math.max(1, e.o ?? 0));
  const total = here + (e.elem ? overValuesWithin(e.elem, inside, budget, each, seen) : 0) + (e.key ? overValuesWithin(e.key, inside, budget, each, seen) : 0);
  seen.delete(e);
  return total;
}

/** Cost of `format()`'s `%s` writing `count` values of shape `e` and every value inside them: a string ~`formatString`, a map `formatMap`, any other `formatValue`. */
const formatValuesCost = (e: Shape, count: number, budget: number): number =>
  overValuesWithin(e, count, budget, (s, k) => k * (s.key ? C.formatMap : s.elem !== undefined || s.n === 0 ? C.formatValue : C.formatString));

/** How many values `count` values of shape `e` are, with every value inside them (within `budget`). */
const valuesWithin = (e: Shape, count: number, budget: number): number => overValuesWithin(e, count, budget, (_, k) => k);

/**
 * The map keys inside a value of shape `s` (at any depth, `s` itself included), and the most
 * one map holds; `cap` for a value of unknown shape.
 */
function formatMapKeys(s: Shape, cap: number, seen = new Set<Shape>()): { keys: number; largest: number } {
  if (!s.elem && !s.key) return { keys: 0, largest: 0 };
  if (seen.has(s)) return { keys: cap, largest: cap };
  seen.add(s);
  const inner = [s.elem, s.key].map((e) => (e ? formatMapKeys(e, cap, seen) : { keys: 0, largest: 0 }));
  seen.delete(s);
  const own = s.key ? s.n : 0;
  return { keys: Math.min(cap, own + s.n * (inner[0]!.keys + inner[1]!.keys)), largest: Math.min(cap, Math.max(own, inner[0]!.largest, inner[1]!.largest)) };
}

/**
 * Cost of `sort()` / `sortBy()` over `n` elements (keys) of `w` characters together: n log n
 * comparisons, and their characters: a comparison stops at the first difference, so costs at most
 * the shorter key, which is charged to the key a merge outputs: each key's characters once per
 * level of the merge sort (log n levels), plus a pass putting strings in Go's order.
 */
const listSortCost = (n: number, w: number): number => (n > 1 ? n * Math.log2(n) * C.listCompare + w * (Math.log2(n) + 1) * C.scanChar : 0);

/** Whether a value of shape `s` may hold a map (at any depth). */
function hasMap(s: Shape, seen = new Set<Shape>()): boolean {
  if (s.key !== undefined) return true;
  if (seen.has(s) || !s.elem) return false;
  seen.add(s);
  return hasMap(s.elem, seen);
}

/**
 * The largest total cost of a range of at most `n` elements whose sizes (each plus `o`) add up
 * to at most `w`, when an empty element costs `g0` and one of size `p` costs `gp`: the best
 * vertex of the linear program over `k0` empty and `kp` full elements.
 */
function mix(n: number, w: number, o: number, p: number, g0: number, gp: number): number {
  const cands: [number, number][] = [
    [0, Math.min(n, w / (p + o))],
    [o > 0 ? Math.min(n, w / o) : n, 0],
  ];
  // Both limits reached: k0 + kp = n, k0·o + kp·(p + o) = w.
  const kp = (w - n * o) / p;
  if (kp >= 0 && kp <= n) cands.push([n - kp, kp]);
  return Math.max(...cands.map(([k0, k1]) => k0 * g0 + k1 * gp));
}

/**
 * Worst-case cost of evaluating a compiled (type-checked) expression once, in cost units (≈ ns).
 * `growth`: headers the policy adds, seen by later expressions; `dfaBudget`: shared by a
 * policy's expressions (see `DFA_EXPLORE_STEPS`). Throws `CostEstimateError` for
 * an expression beyond what the estimator bounds (which the caller refuses).
 */
export function estimateCost(program: CelProgram, growth: PolicyHeaderGrowth = { count: 0, bytes: 0 }, dfaBudget: DfaExploreBudget = { steps: DFA_EXPLORE_STEPS }, shared?: Map<string, number>): number {
  const ast = (program as unknown as { ast: Node }).ast;
  const e = new Estimator(growth, dfaBudget);
  const cost = e.est(ast).cost;
  let once = 0;
  for (const [key, c] of e.once) {
    once += c;
    if (shared && POLICY_SHARED_ONCE.has(key)) shared.set(key, Math.max(shared.get(key) ?? 0, c));
  }
  return C.evaluation + cost + once;
}

/**
 * Work done once per request however many of a policy's expressions need it: charged to each
 * expression's own cost, but to the policy's total once (`parse.ts`, `shared` above). The
 * agent parse (`user-agent-vars.ts`) keeps its result per string for the process, so
 * `req.user_agent`'s fields read by several expressions or interpolations parse the agent
 * once; a policy that sets `user-agent` itself may make another string to parse per such
 * header it adds, which `parse.ts` counts.
 */
export const POLICY_SHARED_ONCE: ReadonlySet<string> = new Set(['UserAgent.parse']);

/** `1234567` → `"1.23 ms"`: a cost as the time it stands for. */
export function formatCost(cost: number): string {
  if (cost >= 1e9) return `${(cost / 1e9).toPrecision(3)} s`;
  if (cost >= 1e6) return `${(cost / 1e6).toPrecision(3)} ms`;
  return `${Math.max(1, Math.round(cost / 1e3))} µs`;
}
