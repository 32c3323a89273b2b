/**
 * Finding `jwt-validation` tokens in a buffered request body (`http.tokens[].method: body`,
 * https://ngrok.com/docs/traffic-policy/actions/jwt-validation): the named fields of an
 * `application/x-www-form-urlencoded` or `application/json` body (a member of the top-level
 * object), names compared without regard to ASCII case.
 *
 * The body is up to 1 MiB of the client's bytes, read on every request of the route, so both
 * scanners walk the bytes once, keep no per-field state, allocate only for the fields they
 * return, and never recurse: `JSON.parse` takes ~0.5 s to refuse 1 MiB of `[` and
 * `URLSearchParams` ~0.1 s for 1 MiB of `a&`. The JSON scanner checks the top-level object's
 * syntax, and in nested values their strings and brackets (matched, nesting bounded by
 * `MAX_JSON_DEPTH`): what delimits them for any parser, so the members it reports are the ones a
 * JSON parser at the upstream sees (a body it accepts that a strict parser refuses has junk
 * inside a nested value, or a malformed number: checked by its characters only).
 */
import { randomBytes } from 'node:crypto';
import type http from 'node:http';

/** What was found for one wanted name. */
export interface BodyField {
  /** How many fields had the name (more than one is ambiguous, and refused by the action). */
  count: number;
  /** The (first) field's decoded value, or null with `problem` saying why. */
  value: string | null;
  problem: string;
}

/** Fields by wanted (lower-case) name, or why the body cannot be read. */
export type BodyFields = Map<string, BodyField> | { error: string };

/** Deepest JSON nesting accepted (as many parsers bound it). */
export const MAX_JSON_DEPTH = 512;

/** The names looked for, lower-case ASCII, with the bounds that let most fields be skipped unread. */
export interface WantedFields {
  names: readonly string[];
  /** `names` as bytes. */
  bytes: readonly Uint8Array[];
  /** `nameHash` of each name. */
  hashes: Int32Array;
  /** 1 for each byte a name starts with (either case). */
  first: Uint8Array;
  minLen: number;
  maxLen: number;
}

/**
 * The seed of `nameHash`, drawn once per process: a client cannot compute keys that collide with
 * a wanted name (each collision costs one byte-by-byte comparison, as without the hash).
 */
const HASH_SEED = randomBytes(4).readInt32LE(0) | 1;

const lowerByte = (c: number) => (c >= 0x41 && c <= 0x5a ? c + 0x20 : c);

/** A seeded FNV-1a hash of `b[s, s + len)` with ASCII letters lower-cased. */
function nameHash(b: Uint8Array, s: number, len: number): number {
  let h = HASH_SEED;
  for (let k = s; k < s + len; k++) h = Math.imul(h ^ lowerByte(b[k]!), 0x01000193);
  return h;
}

export function wantedFields(names: readonly string[]): WantedFields {
  const lower = names.map((n) => n.toLowerCase());
  const first = new Uint8Array(256);
  for (const n of lower) first[n.charCodeAt(0)] = first[n.toUpperCase().charCodeAt(0)] = 1;
  const bytes = lower.map((n) => Buffer.from(n, 'latin1'));
  return { names: lower, bytes, hashes: Int32Array.from(bytes.map((n) => nameHash(n, 0, n.length))), first, minLen: Math.min(...lower.map((n) => n.length)), maxLen: Math.max(...lower.map((n) => n.length)) };
}

/**
 * The wanted name `dec[s, s + len)` is, compared without regard to ASCII case, or undefined. One
 * pass over the candidate (its hash) whatever the wanted names: a name is compared byte by byte
 * only when its length and hash are the candidate's, so near-miss keys (sharing a long prefix
 * with several wanted names) cost no more than any other key.
 */
function match(w: WantedFields, dec: Uint8Array, s: number, len: number, hash?: number): string | undefined {
  if (w.first[dec[s]!] === 0) return undefined;
  const all = w.bytes;
  let h = hash ?? 0;
  let hashed = hash !== undefined;
  next: for (let j = 0; j < all.length; j++) {
    const name = all[j]!;
    if (name.length !== len) continue;
    if (!hashed) {
      h = nameHash(dec, s, len);
      hashed = true;
    }
    if (w.hashes[j] !== h) continue;
    for (let k = 0; k < len; k++) if (lowerByte(dec[s + k]!) !== name[k]) continue next;
    return w.names[j];
  }
  return undefined;
}

/** Records a field found for `name`; true when it is the second one (the action fails: the scan can stop). */
function record(out: Map<string, BodyField>, name: string, value: () => string | { problem: string }): boolean {
  const f = out.get(name);
  if (f) return ++f.count > 1;
  const v = value();
  out.set(name, typeof v === 'string' ? { count: 1, value: v, problem: '' } : { count: 1, value: null, problem: v.problem });
  return false;
}

const hex = (c: number) => (c >= 0x30 && c <= 0x39 ? c - 0x30 : c >= 0x41 && c <= 0x46 ? c - 0x37 : c >= 0x61 && c <= 0x66 ? c - 0x57 : -1);

/**
 * Percent-decodes `b[s, e)` as the URL standard's form decoding does (`+` is a space, a `%` not
 * followed by two hex digits stays) into `out`; the decoded length, or -1 when it exceeds
 * `out.length`.
 */
function formDecode(b: Buffer, s: number, e: number, out: Uint8Array): number {
  let n = 0;
  for (let i = s; i < e; i++) {
    if (n === out.length) return -1;
    const c = b[i]!;
    if (c === 0x2b) out[n++] = 0x20;
    else if (c === 0x25 && i + 2 < e && hex(b[i + 1]!) >= 0 && hex(b[i + 2]!) >= 0) {
      out[n++] = hex(b[i + 1]!) * 16 + hex(b[i + 2]!);
      i += 2;
    } else out[n++] = c;
  }
  return n;
}

/** The `nameHash` of the key `formDecodeKey` decoded last. */
let keyHash = 0;

/** `formDecode` for a field name, computing its `nameHash` (in `keyHash`) in the same pass. */
function formDecodeKey(b: Buffer, s: number, e: number, out: Uint8Array): number {
  let n = 0;
  let h = HASH_SEED;
  for (let i = s; i < e; i++) {
    if (n === out.length) return -1;
    let c = b[i]!;
    if (c === 0x2b) c = 0x20;
    else if (c === 0x25 && i + 2 < e && hex(b[i + 1]!) >= 0 && hex(b[i + 2]!) >= 0) {
      c = hex(b[i + 1]!) * 16 + hex(b[i + 2]!);
      i += 2;
    }
    out[n++] = c;
    h = Math.imul(h ^ lowerByte(c), 0x01000193);
  }
  keyHash = h;
  return n;
}

const tooLong = (maxChars: number) => ({ problem: `is longer than ${maxChars} characters` });

/**
 * The wanted fields of an `application/x-www-form-urlencoded` body (stops at a wanted name's
 * second field).
 */
export function formBodyFields(b: Buffer, w: WantedFields, maxChars: number): Map<string, BodyField> {
  const out = new Map<string, BodyField>();
  const key = new Uint8Array(w.maxLen);
  const n = b.length;
  // A name of length L is written in L to 3L bytes.
  const minRaw = w.minLen;
  const maxRaw = 3 * w.maxLen;
  let s = 0;
  let eq = -1;
  for (let i = 0; i <= n; i++) {
    const c = i < n ? b[i]! : 0x26;
    if (c === 0x3d) {
      if (eq < 0) eq = i;
      continue;
    }
    if (c !== 0x26) continue;
    const keyEnd = eq < 0 ? i : eq;
    const raw = keyEnd - s;
    if (raw >= minRaw && raw <= maxRaw) {
      const c0 = b[s]!;
      let name: string | undefined;
      if (c0 !== 0x25 && c0 !== 0x2b && w.first[c0] === 0) name = undefined;
      else {
        const len = formDecodeKey(b, s, keyEnd, key);
        name = len < 0 ? undefined : match(w, key, 0, len, keyHash);
      }
      const vs = eq < 0 ? i : eq + 1;
      const e = i;
      if (
        name !== undefined &&
        record(out, name, () => {
          if (e - vs > 3 * maxChars) return tooLong(maxChars);
          const buf = new Uint8Array(e - vs);
          const v = Buffer.from(buf.buffer, 0, formDecode(b, vs, e, buf)).toString('utf8');
          return v.length > maxChars ? tooLong(maxChars) : v;
        })
      )
        return out;
    }
    s = i + 1;
    eq = -1;
  }
  return out;
}

/**
 * Bytes after a backslash that make a JSON escape (RFC 8259 §7): 1 for `"`, backslash, `/`, `b`, `f`, `n`, `r`, `t`; 5 for `u`
 * (then four hex digits must follow); 0: not an escape (the document is not JSON).
 */
const ESCAPE = new Uint8Array(256);
for (const c of '"\\/bfnrt') ESCAPE[c.charCodeAt(0)] = 1;
ESCAPE[0x75] = 5;

/**
 * The end of the JSON string whose contents start at `b[i]` (the index of its closing quote), or
 * -1 when it is not a valid JSON string: unterminated, a control character, or a malformed escape.
 */
function stringEnd(b: Buffer, i: number): number {
  let c = b[i];
  while (c !== 0x22) {
    if (c === undefined || c < 0x20) return -1;
    if (c === 0x5c) {
      const k = ESCAPE[b[i + 1] ?? 0]!;
      if (k === 0) return -1;
      if (k === 5 && (hex(b[i + 2] ?? 0) < 0 || hex(b[i + 3] ?? 0) < 0 || hex(b[i + 4] ?? 0) < 0 || hex(b[i + 5] ?? 0) < 0)) return -1;
      i += k + 1;
    } else i++;
    c = b[i];
  }
  return i;
}

// jsonBodyFields' states: what comes next.
const VALUE = 0;
const NAME = 1;
const NAME_OR_CLOSE = 2; // after `{`
const AFTER = 3; // after a value: `,` or a close

/**
 * The wanted members of the top-level object of an `application/json` body, or why it is not
 * one (stops at a wanted name's second member). One loop, no recursion, no allocation but for
 * the members returned.
 */
export function jsonBodyFields(b: Buffer, w: WantedFields, maxChars: number): BodyFields {
  const n = b.length;
  const out = new Map<string, BodyField>();
  const invalid = { error: 'the body is not valid JSON' };
  const stack = new Uint8Array(MAX_JSON_DEPTH + 1);
  const key = new Uint8Array(w.maxLen);
  let i = 0;
  let c = b[0];
  while (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d) c = b[++i];
  if (c !== 0x7b) return c === undefined ? invalid : { error: 'the JSON body is not an object' };
  stack[0] = 0x7b;
  let depth = 1;
  let state = NAME_OR_CLOSE;
  i++;
  /** The wanted name whose value is being read, at the top level. */
  let want: string | undefined;
  let valueStart = 0;
  for (;;) {
    c = b[i];
    while (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d) c = b[++i];
    // The top-level object closed: only white space may follow.
    if (depth === 0) return c === undefined ? out : invalid;
    if (c === undefined) return invalid;
    switch (state) {
      case VALUE:
        state = AFTER;
        if (c === 0x7b || c === 0x5b) {
          // A nested object or array, skipped in one tight loop: only its strings and brackets
          // are checked (what delimits it for any parser), not the syntax between them.
          let d = depth;
          for (;;) {
            if (c === 0x22) {
              i = stringEnd(b, i + 1);
              if (i < 0) return invalid;
            } else if (c === 0x7b || c === 0x5b) {
              if (d === MAX_JSON_DEPTH) return invalid;
              stack[d++] = c;
            } else if (c === 0x7d || c === 0x5d) {
              if (stack[--d]! + 2 !== c) return invalid;
              if (d === depth) break;
            } else if (c === undefined) return invalid;
            c = b[++i];
          }
          i++;
        } else if (c === 0x22) {
          const end = stringEnd(b, i + 1);
          if (end < 0) {
            // A wanted member's string that is not JSON (a malformed escape, a control character):
            // that token is malformed (the body is not JSON either).
            if (want !== undefined && depth === 1) {
              record(out, want, () => ({ problem: 'is not a valid JSON string' }));
              return out;
            }
            return invalid;
          }
          i = end + 1;
        } else if (c === 0x74 || c === 0x66 || c === 0x6e) {
          const lit = c === 0x74 ? 'true' : c === 0x66 ? 'false' : 'null';
          for (let k = 1; k < lit.length; k++) if (b[i + k] !== lit.charCodeAt(k)) return invalid;
          i += lit.length;
        } else if (c === 0x2d || (c >= 0x30 && c <= 0x39)) {
          // A number, loosely: its characters.
          do c = b[++i];
          while (c !== undefined && ((c >= 0x30 && c <= 0x39) || c === 0x2d || c === 0x2b || c === 0x2e || c === 0x65 || c === 0x45));
        } else return invalid;
        break;
      case NAME_OR_CLOSE:
      case NAME: {
        if (state === NAME_OR_CLOSE && c === 0x7d) {
          depth--;
          i++;
          state = AFTER;
          break;
        }
        if (c !== 0x22) return invalid;
        const s = i + 1;
        i = stringEnd(b, s);
        if (i < 0) return invalid;
        const e = i++;
        c = b[i];
        while (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d) c = b[++i];
        if (c !== 0x3a) return invalid;
        i++;
        if (depth === 1 && e - s >= w.minLen && e - s <= 6 * w.maxLen) {
          // Escapes are looked for only in a name of a wanted name's length (at most 6× it).
          let escaped = false;
          for (let k = s; k < e && !escaped; k++) escaped = b[k] === 0x5c;
          if (!escaped) want = e - s <= w.maxLen ? match(w, b, s, e - s) : undefined;
          else {
            const len = unescapeName(b, s, e, key);
            want = len < 0 ? undefined : match(w, key, 0, len);
          }
          if (want !== undefined) {
            c = b[i];
            while (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d) c = b[++i];
            valueStart = i;
          }
        }
        state = VALUE;
        break;
      }
      case AFTER: {
        if (want !== undefined && depth === 1) {
          const vs = valueStart;
          const e = i;
          const name = want;
          want = undefined;
          const dup = record(out, name, () => {
            if (b[vs] !== 0x22) return { problem: 'is not a string' };
            if (e - vs > 6 * maxChars + 2) return tooLong(maxChars);
            // The scanner checked the string (escapes included); JSON.parse cannot refuse it, but
            // a refusal must never escape the action (a 401, not a failed route).
            let v: unknown;
            try {
              v = JSON.parse(b.toString('utf8', vs, e));
            } catch {
              return { problem: 'is not a valid JSON string' };
            }
            if (typeof v !== 'string') return { problem: 'is not a string' };
            return v.length > maxChars ? tooLong(maxChars) : v;
          });
          if (dup) return out;
        }
        const open = stack[depth - 1]!;
        if (c === 0x2c) {
          i++;
          state = open === 0x7b ? NAME : VALUE;
        } else if (c === open + 2) {
          // `}` is `{` + 2, `]` is `[` + 2.
          i++;
          depth--;
        } else return invalid;
        break;
      }
    }
  }
}

/** JSON-unescapes the name `b[s, e)` into `out`: its length, or -1 when too long or not ASCII (no wanted name then). */
function unescapeName(b: Buffer, s: number, e: number, out: Uint8Array): number {
  let n = 0;
  for (let i = s; i < e; i++) {
    if (n === out.length) return -1;
    let c = b[i]!;
    if (c === 0x5c) {
      // The scanner checked the escapes (`stringEnd`); checked again, as this must not misread one.
      const x = b[++i] ?? 0;
      if (ESCAPE[x] === 0) return -1;
      if (x === 0x75) {
        const h0 = hex(b[i + 1] ?? 0);
        const h1 = hex(b[i + 2] ?? 0);
        const h2 = hex(b[i + 3] ?? 0);
        const h3 = hex(b[i + 4] ?? 0);
        if (h0 < 0 || h1 < 0 || h2 < 0 || h3 < 0) return -1;
        c = ((h0 * 16 + h1) * 16 + h2) * 16 + h3;
        i += 4;
      } else c = x === 0x62 ? 8 : x === 0x66 ? 12 : x === 0x6e ? 10 : x === 0x72 ? 13 : x === 0x74 ? 9 : x;
    }
    if (c >= 0x80) return -1;
    out[n++] = c;
  }
  return n;
}

/** The media type of a Content-Type value, lower-case, without parameters. */
export function mediaType(v: string | string[] | undefined): string {
  const s = Array.isArray(v) ? (v[0] ?? '') : (v ?? '');
  const semi = s.indexOf(';');
  return (semi < 0 ? s : s.slice(0, semi)).trim().toLowerCase();
}

/** Request methods whose body is read for tokens (ngrok: POST, PUT or PATCH; ERR_NGROK_3415 otherwise). */
export const BODY_TOKEN_METHODS: ReadonlySet<string> = new Set(['POST', 'PUT', 'PATCH']);

/** The request as `bodyFields` reads it. */
export type BodyRequest = Pick<http.IncomingMessage, 'method' | 'headers' | 'rawHeaders'>;

/** The lower-case `charset` parameter of a Content-Type value (quotes removed), '' when absent, null when given twice or malformed. */
export function charsetOf(contentType: string): string | null {
  let charset = '';
  const params = contentType.split(';');
  for (let i = 1; i < params.length; i++) {
    const p = params[i]!;
    const eq = p.indexOf('=');
    if (eq < 0) continue;
    if (p.slice(0, eq).trim().toLowerCase() !== 'charset') continue;
    if (charset !== '') return null;
    let v = p.slice(eq + 1).trim();
    if (v.length >= 2 && v.startsWith('"') && v.endsWith('"')) v = v.slice(1, -1);
    v = v.trim().toLowerCase();
    if (v === '') return null;
    charset = v;
  }
  return charset;
}

/**
 * Why the body of `req` cannot be read as the upstream will read it, or null. The scanners read
 * the bytes as UTF-8 (or ASCII) text, as sent: a body in another charset (`utf-7`, `utf-16`…) or
 * a content encoding (`gzip`…) would be decoded by the upstream's framework into other fields
 * than the ones checked here, and so would a second Content-Type header (Node keeps the first, the
 * upstream is sent both). Such a request has no body token (401, `token_missing`).
 */
function unreadable(req: BodyRequest, type: string): string | null {
  const raw = req.rawHeaders;
  let types = 0;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    if (name.length === 12 && name.toLowerCase() === 'content-type') types++;
  }
  if (types > 1) return 'the request has more than one Content-Type header';
  const encoding = (req.headers['content-encoding'] ?? '').trim().toLowerCase();
  if (encoding !== '' && encoding !== 'identity') return `tokens in the body are read from bodies without a content encoding only, not ${JSON.stringify(encoding.slice(0, 100))}`;
  const charset = charsetOf(req.headers['content-type'] ?? '');
  if (charset === null) return 'the Content-Type charset parameter is malformed or given more than once';
  if (charset !== '' && charset !== 'utf-8' && !(charset === 'us-ascii' && type === 'application/x-www-form-urlencoded'))
    return `tokens in the body are read from UTF-8 bodies only (charset utf-8${type === 'application/json' ? '' : ' or us-ascii'}, or none), not charset ${JSON.stringify(charset.slice(0, 100))}`;
  return null;
}

/** The wanted fields of the body of `req`, by its method and Content-Type. */
export function bodyFields(req: BodyRequest, body: Buffer, w: WantedFields, maxChars: number): BodyFields {
  const method = req.method;
  if (!BODY_TOKEN_METHODS.has(method ?? '')) return { error: `tokens in the body are read from POST, PUT and PATCH requests only, not ${(method ?? '').slice(0, 20)}` };
  const type = mediaType(req.headers['content-type']);
  if (type !== 'application/x-www-form-urlencoded' && type !== 'application/json')
    return { error: `tokens in the body are read from application/x-www-form-urlencoded or application/json bodies only, not ${JSON.stringify(type.slice(0, 100) || '(no Content-Type)')}` };
  const why = unreadable(req, type);
  if (why) return { error: why };
  return type === 'application/json' ? jsonBodyFields(body, w, maxChars) : formBodyFields(body, w, maxChars);
}
