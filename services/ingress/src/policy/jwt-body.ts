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
  /** 1 for each byte a name starts with (either case). */
  first: Uint8Array;
  minLen: number;
  maxLen: number;
}

export function wantedFields(names: readonly string[]): WantedFields {
  const lower = names.map((n) => n.toLowerCase());
  const first = new Uint8Array(256);
  for (const n of lower) first[n.charCodeAt(0)] = first[n.toUpperCase().charCodeAt(0)] = 1;
  return { names: lower, bytes: lower.map((n) => Buffer.from(n, 'latin1')), first, minLen: Math.min(...lower.map((n) => n.length)), maxLen: Math.max(...lower.map((n) => n.length)) };
}

const lowerByte = (c: number) => (c >= 0x41 && c <= 0x5a ? c + 0x20 : c);

/** The wanted name `dec[s, s + len)` is, compared without regard to ASCII case, or undefined. */
function match(w: WantedFields, dec: Uint8Array, s: number, len: number): string | undefined {
  if (w.first[dec[s]!] === 0) return undefined;
  const all = w.bytes;
  next: for (let j = 0; j < all.length; j++) {
    const name = all[j]!;
    if (name.length !== len) continue;
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
        const len = formDecode(b, s, keyEnd, key);
        name = len < 0 ? undefined : match(w, key, 0, len);
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
              c = b[++i];
              while (c !== 0x22) {
                if (c === undefined || c < 0x20) return invalid;
                i += c === 0x5c ? 2 : 1;
                c = b[i];
              }
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
          c = b[++i];
          while (c !== 0x22) {
            if (c === undefined || c < 0x20) return invalid;
            i += c === 0x5c ? 2 : 1;
            c = b[i];
          }
          i++;
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
        let escaped = false;
        c = b[++i];
        while (c !== 0x22) {
          if (c === undefined || c < 0x20) return invalid;
          if (c === 0x5c) escaped = true;
          i += c === 0x5c ? 2 : 1;
          c = b[i];
        }
        const e = i++;
        c = b[i];
        while (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d) c = b[++i];
        if (c !== 0x3a) return invalid;
        i++;
        if (depth === 1 && e - s >= w.minLen && e - s <= 6 * w.maxLen) {
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
            const v = JSON.parse(b.toString('utf8', vs, e)) as string;
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
      const x = b[++i]!;
      if (x === 0x75) {
        const h = [1, 2, 3, 4].map((k) => hex(b[i + k]!));
        if (h.some((d) => d < 0)) return -1;
        c = ((h[0]! * 16 + h[1]!) * 16 + h[2]!) * 16 + h[3]!;
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

/** The wanted fields of the body of a `method` request with Content-Type `contentType`. */
export function bodyFields(method: string | undefined, contentType: string | string[] | undefined, body: Buffer, w: WantedFields, maxChars: number): BodyFields {
  if (!BODY_TOKEN_METHODS.has(method ?? '')) return { error: `tokens in the body are read from POST, PUT and PATCH requests only, not ${(method ?? '').slice(0, 20)}` };
  const type = mediaType(contentType);
  if (type === 'application/x-www-form-urlencoded') return formBodyFields(body, w, maxChars);
  if (type === 'application/json') return jsonBodyFields(body, w, maxChars);
  return { error: `tokens in the body are read from application/x-www-form-urlencoded or application/json bodies only, not ${JSON.stringify(type.slice(0, 100) || '(no Content-Type)')}` };
}
