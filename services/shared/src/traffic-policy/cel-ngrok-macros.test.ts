import { describe, expect, it } from 'vitest';
import { EvaluationError } from '@marcbachmann/cel-js';
import { CEL_TIME, CelActions, CelConn, CelRequest, CelResponse } from './cel-vars.js';
import { compileExpression } from './cel.js';
import { charAt, isJson, lower, MAX_BUILT_STRING, MAX_JSON_DECODE_DEPTH, quote, replace, reverse, upper, UPPER_SPECIAL_CODE_POINTS, urlEscape, urlUnescape } from './ngrok-macros.js';
import { crc64Iso, jsonEncode, MAX_JSON_ENCODE_DEPTH, MAX_LIST_RANGE, queryDecode, sortUtf8, xxhash64 } from './ngrok-macros.js';
import { estimateCost, MAX_EXPRESSION_COST } from './cost.js';
import { isPrivateIp, isQueryString, MAX_RAND_INT, randInt } from './ngrok-macros.js';
import { formatFixed, formatScientific, formatString, MAX_FORMAT_PRECISION, shortestFixed } from './string-format.js';
import { listDistinct, listFlatten, listSort, MAX_BUILT_LIST, MAX_DISTINCT_CHARS, MAX_FLATTEN_DEPTH } from './list-macros.js';
import { MAX_VALUE_DEPTH } from './cel-values.js';
import { parseTrafficPolicy } from './parse.js';
import { refusal } from './testing.js';

/**
 * ngrok's string, base64, URL and hash macros (`ngrok-macros.ts`): the examples of
 * https://ngrok.com/docs/traffic-policy/macros/ (sections Base64, Hash, String, URL), then edge
 * cases and invalid input (an evaluation error, never another exception).
 */

function activation(headers: string[] = [], path = '/') {
  return {
    req: new CelRequest({ method: 'GET', scheme: 'https', host: 'app.example.com', authority: 'app.example.com', path, rawQuery: '', headers: () => headers }),
    conn: new CelConn('203.0.113.7', 443),
    res: new CelResponse({ status: () => 200, headers: () => [] }),
    actions: new CelActions(),
    time: CEL_TIME,
    vars: new Map<string, unknown>([['name', 'ÄRGER']]),
  };
}

const run = (expr: string, headers: string[] = [], path = '/'): unknown => compileExpression('inbound', expr, false)(activation(headers, path));

/** The evaluation error `expr` fails with (a CEL EvaluationError, not another exception). */
function evalError(expr: string, headers: string[] = []): EvaluationError {
  try {
    run(expr, headers);
  } catch (err) {
    expect(err, expr).toBeInstanceOf(EvaluationError);
    return err as EvaluationError;
  }
  throw new Error(`expected ${expr} to fail`);
}

describe("ngrok's documented examples", () => {
  it('Base64', () => {
    expect(run("base64.decode('aGVsbG8=') == b'hello'")).toBe(true);
    expect(evalError("base64.decode('aGVsbG8')").message).toMatch(/base64\.decode\(\): illegal base64 data/);
    expect(run("base64.encode(b'hello')")).toBe('aGVsbG8=');
    expect(run('"c29tZTp0aGluZw==".decodeBase64()')).toBe('some:thing');
    expect(run('"some:thing".encodeBase64()')).toBe('c29tZTp0aGluZw==');
  });

  it('Hash: hex by default, or base64 (crc64 with the ISO polynomial, xxhash64 with seed 0)', () => {
    const hello: Record<string, [string, string]> = {
      crc32: ['3610a686', 'NhCmhg=='],
      crc64: ['3c3eeee2d8100000', 'PD7u4tgQAAA='],
      xxhash64: ['26c7827d889f6da3', 'JseCfYifbaM='],
      md5: ['5d41402abc4b2a76b9719d911017c592', 'XUFAKrxLKna5cZ2REBfFkg=='],
      sha1: ['aaf4c61ddcc5e8a2dabede0f3b482cd9aea9434d', 'qvTGHdzF6KLavt4PO0gs2a6pQ00='],
      sha256: ['2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824', 'LPJNul+wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ='],
      sha512: [
        '9b71d224bd62f3785d96d46ad3ea3d73319bfbc2890caadae2dff72519673ca72323c3d99ba5c11d7c7acc6e14b8c5da0c4663475c2e5c3adef46f73bcdec043',
        'm3HSJL1i83hdltRq0+o9czGb+8KJDKra4t/3JRlnPKcjI8PZm6XBHXx6zG4UuMXaDEZjR1wuXDre9G9zvN7AQw==',
      ],
    };
    for (const [h, [hex, b64]] of Object.entries(hello)) {
      expect(run(`hash.${h}('hello')`), h).toBe(hex);
      expect(run(`hash.${h}('hello', 'hex')`), h).toBe(hex);
      expect(run(`hash.${h}('hello', 'base64')`), h).toBe(b64);
      expect(run(`'hello'.${h}()`), h).toBe(hex);
      expect(run(`'hello'.${h}('hex')`), h).toBe(hex);
      expect(run(`'hello'.${h}('base64')`), h).toBe(b64);
    }
  });

  it('String: charAt, replace, reverse, lower, upper, escapeUrl, unescapeUrl', () => {
    expect(run("'hello'.charAt(4)")).toBe('o');
    expect(run("'hello'.charAt(5)")).toBe('');
    expect(evalError("'hello'.charAt(-1)").message).toMatch(/charAt\(\): index out of range: -1/);
    expect(run("'hello mellow'.replace('l', 'L')")).toBe('heLLo meLLow');
    expect(run("'hello mellow'.replace('l', 'L', 2)")).toBe('heLLo mellow');
    expect(run("'hello mellow'.replace('x', 'X')")).toBe('hello mellow');
    expect(run("'gums'.reverse()")).toBe('smug');
    expect(run("'John Smith'.reverse()")).toBe('htimS nhoJ');
    expect(run('"Ärger in Österreich, ÉCOLE, İSTANBUL, ЙОГА!".lower()')).toBe('ärger in österreich, école, istanbul, йога!');
    expect(run('"Ärger in Österreich, ÉCOLE, İSTANBUL, ЙОГА!".upper()')).toBe('ÄRGER IN ÖSTERREICH, ÉCOLE, İSTANBUL, ЙОГА!');
    expect(run('"i;md/r/$y".escapeUrl()')).toBe('i%3Bmd%2Fr%2F%24y');
    expect(run('"i%3Bmd%2Fr%2F%24y".unescapeUrl()')).toBe('i;md/r/$y');
  });

  it('URL', () => {
    expect(run('url.escape("i;md/r/$y")')).toBe('i%3Bmd%2Fr%2F%24y');
    expect(run('url.unescape("i%3Bmd%2Fr%2F%24y")')).toBe('i;md/r/$y');
    expect(run("url.unescape('%2Ffoo') == '/foo'")).toBe(true);
    expect(run("url.escape(req.path) == '%2Ffoo'", [], '/foo')).toBe(true);
  });
});

describe('lower() and upper(): Go’s strings.ToLower / ToUpper (simple case mapping)', () => {
  it('maps per code point, never changing the length', () => {
    expect(lower('ΟΔΟΣ')).toBe('οδοσ'); // JavaScript: 'οδος' (final sigma)
    expect(lower('İ')).toBe('i'); // JavaScript: 'i̇'
    expect(upper('ß')).toBe('ß'); // JavaScript: 'SS'
    expect(upper('straße')).toBe('STRAßE');
    expect(upper('ﬀ ŉ ǰ')).toBe('ﬀ ŉ ǰ');
    expect(upper('ᾀ ᾳ ῃ ῳ ᾈ')).toBe('ᾈ ᾼ ῌ ῼ ᾈ');
    expect(upper('aßbᾀc')).toBe('AßBᾈC');
    expect(lower('𐐀BC')).toBe('𐐨bc');
    expect(upper('𐐨bc')).toBe('𐐀BC');
    // Lone surrogates pass through.
    expect(upper('a\ud800b')).toBe('A\ud800B');
    expect(lower('A\udc00Σ')).toBe('a\udc00σ');
    for (const s of ['ß'.repeat(10), 'İΣ'.repeat(5), 'ᾀﬃ'.repeat(7)]) {
      expect(lower(s).length).toBe(s.length);
      expect(upper(s).length).toBe(s.length);
    }
  });

  it("relies on V8's case mappings as checked here: only the listed code points grow", () => {
    const growsUpper: number[] = [];
    const growsLower: number[] = [];
    for (let c = 0; c <= 0x1ffff; c++) {
      if (c >= 0xd800 && c <= 0xdfff) continue;
      const s = String.fromCodePoint(c);
      if (s.toUpperCase().length !== s.length) growsUpper.push(c);
      if (s.toLowerCase().length !== s.length) growsLower.push(c);
    }
    expect(growsUpper).toEqual([...UPPER_SPECIAL_CODE_POINTS].sort((a, b) => a - b));
    expect(growsLower).toEqual([0x130]);
  });

  it('works on req.url and certificate names as their strings, and on dyn values', () => {
    expect(run('req.url.upper()', [], '/a')).toBe('HTTPS://APP.EXAMPLE.COM/A');
    expect(run("vars.name.lower() == 'ärger'")).toBe(true);
    expect(run("dyn('AbC').lower()")).toBe('abc');
  });
});

describe('charAt() and reverse(): code points', () => {
  it('counts a surrogate pair as one character', () => {
    expect(charAt('😀a', 0n)).toBe('😀');
    expect(charAt('😀a', 1n)).toBe('a');
    expect(charAt('😀a', 2n)).toBe('');
    expect(() => charAt('😀a', 3n)).toThrow(EvaluationError);
    expect(() => charAt('', 1n)).toThrow(EvaluationError);
    expect(charAt('', 0n)).toBe('');
    expect(evalError("'ab'.charAt(3)").message).toMatch(/index out of range: 3/);
    expect(reverse('😀ab')).toBe('ba😀');
    expect(reverse('a😀b😀')).toBe('😀b😀a');
    expect(reverse('a\ud800b')).toBe('b\ud800a');
    expect(reverse('')).toBe('');
    expect(reverse('x')).toBe('x');
  });
});

describe('replace(): Go’s strings.Replace', () => {
  it('replaces all, or the first n (n < 0: all; 0: none), from the left, without overlap', () => {
    expect(replace('aaaa', 'aa', 'b')).toBe('bb');
    expect(replace('aaa', 'aa', 'b')).toBe('ba');
    expect(replace('abab', 'ab', 'x', 1n)).toBe('xab');
    expect(replace('abab', 'ab', 'x', 0n)).toBe('abab');
    expect(replace('abab', 'ab', 'x', -1n)).toBe('xx');
    expect(replace('abab', 'ab', 'x', 10n)).toBe('xx');
    expect(run("'hello'.replace('l', 'L', -1)")).toBe('heLLo');
    // The replacement is literal (no `$&` patterns).
    expect(replace('a-b', '-', '$&$1$$')).toBe('a$&$1$$b');
    expect(replace('a-b-c', '-', '$&', 1n)).toBe('a$&b-c');
  });

  it('an empty old string matches before each code point and at the end', () => {
    expect(replace('abc', '', '-')).toBe('-a-b-c-');
    expect(replace('abc', '', '-', 2n)).toBe('-a-bc');
    expect(replace('abc', '', '-', 4n)).toBe('-a-b-c-');
    expect(replace('😀x', '', '-')).toBe('-😀-x-');
    expect(replace('😀x', '', '$', 1n)).toBe('$😀x');
    expect(replace('', '', '-')).toBe('-');
  });

  it(`refuses to build a string over ${MAX_BUILT_STRING} characters (an evaluation error)`, () => {
    expect(() => replace('a'.repeat(30_000), 'a', 'aaa')).toThrow(/replace\(\): result too long \(90000 characters, at most 65536\)/);
    expect(() => replace('a'.repeat(MAX_BUILT_STRING), '', 'x')).toThrow(EvaluationError);
    expect(replace('a'.repeat(30_000), 'a', 'aa').length).toBe(60_000);
    // Only the replacements asked for count.
    expect(replace('a'.repeat(30_000), 'a', 'aaa', 10n).length).toBe(30_020);
    expect(evalError("getReqHeader('x')[0].replace('', getReqHeader('x')[0])", ['x', 'y'.repeat(300)]).message).toMatch(/result too long/);
  });
});

describe('base64', () => {
  it('decodes standard padded base64 only (Go skips line breaks)', () => {
    expect(run("base64.decode('') == b''")).toBe(true);
    expect(run("base64.decode('aGVs\\r\\nbG8=') == b'hello'")).toBe(true);
    for (const bad of ['aGVsbG8', 'aGVsbG8==', 'aGV$bG8=', 'aGVsbG8=a', '====', 'aGVsbG8_', 'aGVs bG8=']) {
      expect(evalError(`base64.decode('${bad}')`).message, bad).toMatch(/illegal base64 data/);
    }
    // URL-safe characters are not the standard alphabet.
    expect(evalError("base64.decode('-_-_')").message).toMatch(/illegal base64 data/);
    expect(evalError("'c29tZTp0aGluZw'.decodeBase64()").message).toMatch(/decodeBase64\(\): illegal base64 data/);
  });

  it('encodes and decodes strings as UTF-8; a byte in no UTF-8 sequence stays that byte (escaped as a header byte is), as in Go', () => {
    expect(run("'あ😀'.encodeBase64().decodeBase64() == 'あ😀'")).toBe(true);
    expect(run("'/w=='.decodeBase64()")).toBe('\udcff');
    expect(run("'/w=='.decodeBase64().encodeBase64()")).toBe('/w==');
    expect(run("'/w=='.decodeBase64() == '\ufffd'")).toBe(false);
    expect(run("base64.encode(base64.decode('/w==')) == '/w=='")).toBe(true);
    expect(run("base64.encode(bytes('あ')) == 'あ'.encodeBase64()")).toBe(true);
  });
});

describe('url.escape / url.unescape: Go’s url.QueryEscape / QueryUnescape', () => {
  it('escapes all but letters, digits and -_.~ (space as +), as UTF-8', () => {
    expect(urlEscape('AZaz09-_.~')).toBe('AZaz09-_.~');
    expect(urlEscape("a b!'()*")).toBe('a+b%21%27%28%29%2A');
    expect(urlEscape('あ/😀')).toBe('%E3%81%82%2F%F0%9F%98%80');
    expect(urlEscape('\ud800')).toBe('%EF%BF%BD');
    expect(urlEscape('\ud800 ')).toBe('%EF%BF%BD+');
    expect(urlEscape('')).toBe('');
  });

  it('unescapes + and %XX (either case); an invalid escape is an evaluation error', () => {
    expect(urlUnescape('a+b%20c%2f%2F')).toBe('a b c//');
    expect(urlUnescape('%E3%81%82')).toBe('あ');
    expect(urlUnescape('%ff')).toBe('\udcff');
    expect(run("url.escape(url.unescape('%FFa')) == '%FFa'")).toBe(true);
    expect(urlUnescape('plain')).toBe('plain');
    expect(run("url.unescape(url.escape('a b/あ')) == 'a b/あ'")).toBe(true);
    for (const bad of ['%', '%4', '%zz', 'a%g1', '100%']) expect(evalError(`url.unescape('${bad}')`).message, bad).toMatch(/url\.unescape\(\): invalid URL escape/);
    expect(evalError("'%x'.unescapeUrl()").message).toMatch(/unescapeUrl\(\): invalid URL escape "%x"/);
  });
});

describe('hashes', () => {
  it('hash the UTF-8 of the string; an unknown format is an evaluation error', () => {
    expect(run("hash.md5('あ')")).toBe('8c0c3027e3cfc3d644caab3847a505b0');
    expect(run("''.sha256()")).toBe('e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855');
    expect(run("''.crc32()")).toBe('00000000');
    expect(evalError("'a'.sha256('HEX')").message).toMatch(/sha256\(\): unknown format "HEX" \(hex or base64\)/);
    expect(evalError("hash.md5('a', 'base32')").message).toMatch(/md5\(\): unknown format/);
    expect(run('hash.sha1(req.url) == req.url.sha1()')).toBe(true);
  });
});

describe('isJson(): Go’s json.Valid', () => {
  it("ngrok's examples, any JSON value, and the nesting limit", () => {
    expect(run(`'{"a":"b","c":"d"}'.isJson()`)).toBe(true);
    expect(run("'not json'.isJson()")).toBe(false);
    for (const ok of ['1', '"x"', 'null', ' [1, {"a": [true]}] ', '"\\ud800"', '-0.5e10']) expect(isJson(ok), ok).toBe(true);
    for (const bad of ['', '{', "{'a': 1}", '[1,]', '01', 'NaN', '\ufeff{}', '{"a":1}x', '\u00a0{}']) expect(isJson(bad), bad).toBe(false);
    expect(isJson('['.repeat(10_000) + ']'.repeat(10_000))).toBe(true);
    expect(isJson('['.repeat(10_001) + ']'.repeat(10_001))).toBe(false);
    // Brackets inside strings do not count.
    expect(isJson(`["${'['.repeat(30_000)}"]`)).toBe(true);
  });
});

describe('json.decode() / decodeJson()', () => {
  it("ngrok's examples: maps, lists, and numbers as doubles", () => {
    expect(run(`json.decode('{"a":"b"}')`)).toEqual({ a: 'b' });
    expect(run(`json.decode('["a","b","c"]')`)).toEqual(['a', 'b', 'c']);
    expect(run(`json.decode(getReqHeader('x-json-array')[0])[0] == "first entry"`, ['x-json-array', '["first entry", 2]'])).toBe(true);
    expect(run(`'{"a":"b"}'.decodeJson().a == 'b'`)).toBe(true);
    expect(run(`json.decode('{"n": 2}').n == 2.0 && json.decode('{"n": 2}').n == 2`)).toBe(true);
    expect(run(`json.decode('[null, true, "x"]')[0] == null`)).toBe(true);
    expect(run(`json.decode('{"a": {"b": [1, 2]}}').a.b.exists(x, x == 2.0)`)).toBe(true);
    // Keys are the document's own (nothing inherited).
    expect(run(`'toString' in json.decode('{}')`)).toBe(false);
  });

  it(`invalid JSON, or nested more than ${MAX_JSON_DECODE_DEPTH} deep, is an evaluation error`, () => {
    expect(evalError(`json.decode('{a: 1}')`).message).toMatch(/json\.decode\(\): invalid JSON/);
    expect(evalError(`'not json'.decodeJson()`).message).toMatch(/decodeJson\(\): invalid JSON/);
    const nested = (d: number) => '['.repeat(d) + ']'.repeat(d);
    expect(run(`size(json.decode(getReqHeader('x')[0])) == 1`, ['x', nested(MAX_JSON_DECODE_DEPTH)])).toBe(true);
    expect(evalError(`size(json.decode(getReqHeader('x')[0])) == 1`, ['x', nested(MAX_JSON_DECODE_DEPTH + 1)]).message).toMatch(/nested more than 100 deep/);
    // What would exhaust the CEL library's stack is refused before it is used.
    expect(evalError(`json.decode(getReqHeader('x')[0]) == json.decode(getReqHeader('x')[0])`, ['x', nested(8000)]).message).toMatch(/nested more than/);
    // Brackets in strings do not count.
    expect(run(`json.decode(getReqHeader('x')[0])[0].size() == 500`, ['x', `["${'['.repeat(500)}"]`])).toBe(true);
  });
});

describe('strings.quote(): cel-go’s', () => {
  it("ngrok's examples, escapes, invalid characters", () => {
    expect(run(`strings.quote('single-quote with "double quote"')`)).toBe('"single-quote with \\"double quote\\""');
    expect(run('strings.quote("two escape sequences \\a\\n")')).toBe('"two escape sequences \\a\\n"');
    expect(quote('\x07\b\f\n\r\t\v\\"')).toBe('"\\a\\b\\f\\n\\r\\t\\v\\\\\\""');
    expect(quote('\x00\x1b é 😀')).toBe('"\x00\x1b é 😀"');
    expect(quote('a\ud800b\udc00')).toBe('"a\ufffdb\ufffd"');
    expect(quote('')).toBe('""');
  });
});

describe('the namespaces are constants', () => {
  it('a comprehension variable of the same name shadows them', () => {
    expect(run('[1, 2].exists(hash, hash == 2)')).toBe(true);
    expect(run("['x'].map(url, url + '!')")).toEqual(['x!']);
  });

  it("ngrok's macros Warren lacks are still named", () => {
    expect(() => run("secrets.get('vault', 'key') == 'x'")).toThrow(/ngrok's secrets\.get\(\) is not supported by Warren/);
  });
});

describe('in policies: rule expressions, header interpolations, set-vars', () => {
  it('accepts them where ngrok documents them, with their cost', () => {
    const doc = `
inbound:
  - actions:
      - type: set-vars
        config:
          vars:
            - user: \${req.headers['x-name'][0].lower()}
            - token: \${hash.sha256(conn.client_ip, 'base64')}
  - expressions: ["base64.decode(req.headers['x-b64'][0]) == b'deny'", "vars.user.upper() == 'EVE'"]
    actions: [{type: deny}]
  - actions:
      - type: add-headers
        config:
          headers:
            x-lower: \${req.method.lower()}
            x-escaped: "\${url.escape(req.path)}"
            x-hash: "\${req.path.sha256()}"
`;
    expect(() => parseTrafficPolicy(doc)).not.toThrow();
  });

  it('refuses a replace() whose result could exceed the budget when chained', () => {
    // Each unbounded replace may grow its string to MAX_BUILT_STRING; several nested take the
    // estimate over the limit.
    const nested = "req.path.replace('', req.path).replace('', req.path).replace('', req.path).replace('', req.path).replace('', req.path).size() > 0";
    expect(refusal({ inbound: [{ expressions: [nested], actions: [{ type: 'deny' }] }] }, true).reason).toMatch(/^too expensive to evaluate/);
  });
});

/** `expr` on a request whose raw query is `query`. */
function withQuery(expr: string, query: string): unknown {
  const act = activation();
  act.req = new CelRequest({ method: 'GET', scheme: 'https', host: 'app.example.com', authority: 'app.example.com', path: '/', rawQuery: query, headers: () => [] });
  return compileExpression('inbound', expr, false)(act);
}

/** xxHash64 (seed 0) straight from its specification, with BigInt: the reference `xxhash64` is checked against. */
function xxhash64Reference(b: Uint8Array): string {
  const M = (1n << 64n) - 1n;
  const [P1, P2, P3, P4, P5] = [0x9e3779b185ebca87n, 0xc2b2ae3d27d4eb4fn, 0x165667b19e3779f9n, 0x85ebca77c2b2ae63n, 0x27d4eb2f165667c5n];
  const rotl = (x: bigint, r: bigint) => ((x << r) | (x >> (64n - r))) & M;
  const r64 = (i: number) => Buffer.from(b).readBigUInt64LE(i);
  const round = (acc: bigint, x: bigint) => (rotl((acc + x * P2) & M, 31n) * P1) & M;
  const merge = (h: bigint, v: bigint) => (((h ^ round(0n, v)) * P1 + P4) & M);
  let i = 0;
  let h: bigint;
  if (b.length >= 32) {
    let [v1, v2, v3, v4] = [(P1 + P2) & M, P2, 0n, (M + 1n - P1) & M];
    for (; i + 32 <= b.length; i += 32) [v1, v2, v3, v4] = [round(v1, r64(i)), round(v2, r64(i + 8)), round(v3, r64(i + 16)), round(v4, r64(i + 24))];
    h = (rotl(v1, 1n) + rotl(v2, 7n) + rotl(v3, 12n) + rotl(v4, 18n)) & M;
    for (const v of [v1, v2, v3, v4]) h = merge(h, v);
  } else h = P5;
  h = (h + BigInt(b.length)) & M;
  for (; i + 8 <= b.length; i += 8) h = (rotl(h ^ round(0n, r64(i)), 27n) * P1 + P4) & M;
  if (i + 4 <= b.length) {
    h = (rotl(h ^ ((BigInt(Buffer.from(b).readUInt32LE(i)) * P1) & M), 23n) * P2 + P3) & M;
    i += 4;
  }
  for (; i < b.length; i++) h = (rotl(h ^ ((BigInt(b[i]!) * P5) & M), 11n) * P1) & M;
  h = ((h ^ (h >> 33n)) * P2) & M;
  h = ((h ^ (h >> 29n)) * P3) & M;
  return (h ^ (h >> 32n)).toString(16).padStart(16, '0');
}

describe("ngrok's documented examples: the second batch", () => {
  it('Basic Auth', () => {
    expect(run("basic_auth.encode('username', 'password1')")).toBe('Basic dXNlcm5hbWU6cGFzc3dvcmQx');
    expect(run("basic_auth.encode('username', 'password1') == 'Basic dXNlcm5hbWU6cGFzc3dvcmQx'")).toBe(true);
  });

  it('JSON: json.encode, list.encodeJson, map.encodeJson', () => {
    expect(run(`json.encode({'a': 'b'})`)).toBe('{"a":"b"}');
    expect(run(`json.encode(["a","b","c"])`)).toBe('["a","b","c"]');
    expect(run(`["a","b","c"].encodeJson()`)).toBe('["a","b","c"]');
    expect(run(`{'a':"b",'c':"d"}.encodeJson()`)).toBe('{"a":"b","c":"d"}');
    expect(run(`json.encode(req.content_type.parameters) == '{"charset":"UTF-8"}'`, ['content-type', 'text/plain; charset=UTF-8'])).toBe(true);
  });

  it('Lists: lists.range', () => {
    expect(run('lists.range(5)')).toEqual([0n, 1n, 2n, 3n, 4n]);
  });

  it('Query string: queryString.decode / encode, decodeQueryString, encodeQueryString', () => {
    expect(run('queryString.decode("a=b&c=d")')).toEqual(new Map([['a', 'b'], ['c', 'd']]));
    expect(run('"a=b&c=d".decodeQueryString()')).toEqual(new Map([['a', 'b'], ['c', 'd']]));
    expect(withQuery(`queryString.decode(req.url.query)["q"] == "hello"`, 'q=hello')).toBe(true);
    expect(run(`queryString.encode({'a': 'b', 'c': 'd'})`)).toBe('a=b&c=d');
    expect(run(`{'a': "b", 'c': "d"}.encodeQueryString()`)).toBe('a=b&c=d');
    expect(withQuery(`queryString.encode({"q":"policy"}) == req.url.query`, 'q=policy')).toBe(true);
  });

  it('Random: rand.double', () => {
    const seen = new Set<unknown>();
    for (let i = 0; i < 20; i++) {
      const d = run('rand.double()') as number;
      expect(d).toBeGreaterThanOrEqual(0);
      expect(d).toBeLessThan(1);
      seen.add(d);
    }
    // Not folded into a constant when compiled.
    expect(seen.size).toBeGreaterThan(1);
    expect(typeof run('rand.double() >= 0.5')).toBe('boolean');
  });

  it('URL: url.parse, parseUrl, isURL', () => {
    expect(run(`url.parse("https://ngrok.com").host`)).toBe('ngrok.com');
    expect(run(`url.parse("https://ngrok.com").scheme`)).toBe('https');
    expect(run(`"https://ngrok.com".parseUrl().host`)).toBe('ngrok.com');
    expect(run(`url.parse(req.url).host == 'app.example.com'`)).toBe(true);
    expect(run(`'https://ngrok.com'.isURL()`)).toBe(true);
    expect(run(`'not a url'.isURL()`)).toBe(false);
  });
});

describe('json.encode(): Go’s json.Marshal', () => {
  it('sorts keys by their UTF-8 bytes, writes no spaces, escapes as Go (HTML-safe)', () => {
    expect(run(`json.encode({'b': 1, 'a': [true, null, 2.5], 'A': {}})`)).toBe('{"A":{},"a":[true,null,2.5],"b":1}');
    expect(run(`json.encode({'<&>': '\\u2028"\\\\\\n\\x01'})`)).toBe('{"\\u003c\\u0026\\u003e":"\\u2028\\"\\\\\\n\\u0001"}');
    // U+FF61 sorts before U+1F600 in UTF-8 (not in UTF-16).
    expect(run(`json.encode({'😀': 1, '｡': 2, 'z': 3})`)).toBe('{"z":3,"｡":2,"😀":1}');
    expect(sortUtf8(['\uffff', '\ud83d\ude00', '\ue000', 'a'])).toEqual(['a', '\ue000', '\uffff', '\ud83d\ude00']);
  });

  it('numbers, bytes, timestamps, uints, and values that stand for a string', () => {
    expect(run(`json.encode([1, -2, 3u, 1.0, -0.0, 0.1, 1e21, 1.5e-7, 123456789.0])`)).toBe('[1,-2,3,1,-0,0.1,1e+21,1.5e-7,123456789]');
    expect(run(`json.encode([b'hello', timestamp('2023-01-01T00:00:00.500Z'), timestamp('2023-01-01T00:00:00Z')])`)).toBe('["aGVsbG8=","2023-01-01T00:00:00.5Z","2023-01-01T00:00:00Z"]');
    expect(run(`json.encode({1: 'a'})`)).toBe('{"1":"a"}');
    expect(run(`json.encode(req.url)`, [], '/p?x=1')).toBe('"https://app.example.com/p?x=1"');
    // Scalars alone are JSON too.
    expect(run(`json.encode('x')`)).toBe('"x"');
    expect(run(`json.encode(null)`)).toBe('null');
    // A header byte in no UTF-8 sequence, as Go writes it: U+FFFD.
    expect(run(`json.encode(getReqHeader('x')[0])`, ['x', 'a\xffb'])).toBe('"a\ufffdb"');
    // What json.decode reads, json.encode writes back (keys sorted).
    expect(run(`json.encode(json.decode('{"b":[1,{"c":null}],"a":"x"}'))`)).toBe('{"a":"x","b":[1,{"c":null}]}');
  });

  it('writes any string as JSON.stringify does, with Go\'s HTML escapes and lone surrogates (escaped header bytes) as U+FFFD', () => {
    // The reference: JSON.stringify of the text with every lone surrogate replaced, then the HTML escapes.
    const reference = (t: string) =>
      JSON.stringify(t.replace(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g, '\ufffd')).replace(/[<>&\u2028\u2029]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
    const alphabet = ['a', 'é', '<', '>', '&', '"', '\\', '\n', '\b', '\x00', '\x1f', '\x7f', '\u2028', '\u2029', '😀', '\ud83d', '\ude00', '\udcff', '\udc80', '\uffff', '\ufffd'];
    for (let i = 0; i < 3000; i++) {
      let t = '';
      for (let k = Math.floor(Math.random() * 12); k > 0; k--) t += alphabet[Math.floor(Math.random() * alphabet.length)];
      expect(jsonEncode(t), JSON.stringify(t)).toBe(reference(t));
    }
    for (let c = 0; c < 0x80; c++) expect(jsonEncode(String.fromCharCode(c)), String(c)).toBe(reference(String.fromCharCode(c)));
  });

  it('values JSON cannot hold are an evaluation error naming the function', () => {
    expect(evalError('json.encode(1.0 / 0.0)').message).toMatch(/json\.encode\(\): unsupported value: \+Inf/);
    expect(evalError('json.encode([0.0 / 0.0])').message).toMatch(/json\.encode\(\): unsupported value: NaN/);
    expect(evalError(`json.encode({'d': duration('1s')})`).message).toMatch(/json\.encode\(\): cannot encode a value of type google\.protobuf\.Duration/);
    expect(evalError(`[req].encodeJson()`).message).toMatch(/encodeJson\(\): cannot encode a value of type Request/);
    expect(() => jsonEncode(new Map([[true, 1]]))).toThrow(/json\.encode\(\): cannot encode a map key of type bool/);
    expect(() => jsonEncode(new Map<unknown, number>([['1', 1], [1n, 2]]))).toThrow(/duplicate key "1"/);
    let deep: unknown = 0;
    for (let i = 0; i < MAX_JSON_ENCODE_DEPTH; i++) deep = [deep];
    expect(() => jsonEncode(deep)).not.toThrow();
    expect(() => jsonEncode([deep])).toThrow(/nested more than 100 deep/);
  });

  it(`refuses to build a string over ${MAX_BUILT_STRING} characters`, () => {
    const big = '<'.repeat(MAX_BUILT_STRING / 6);
    expect(jsonEncode(big.slice(1)).length).toBeLessThanOrEqual(MAX_BUILT_STRING);
    expect(() => jsonEncode(big + '<<')).toThrow(/result too long/);
    expect(() => jsonEncode('x'.repeat(MAX_BUILT_STRING))).toThrow(/result too long/);
    expect(() => jsonEncode(new Map(Array.from({ length: MAX_BUILT_STRING / 5 }, (_, i) => [String(i), 0])))).toThrow(/result too long/);
    expect(evalError(`json.encode(lists.range(10000).map(i, 'xxxxxxx'))`).message).toMatch(/json\.encode\(\): result too long/);
  });
});

describe('queryString: Go’s url.ParseQuery / url.Values.Encode', () => {
  it('decodes as Go does: pairs at &, + and %XX unescaped, the first value of a key', () => {
    expect(queryDecode('a=1&a=2&b&&c=x%3Dy+z&%E3%81%82=%F0%9F%98%80')).toEqual(new Map([['a', '1'], ['b', ''], ['c', 'x=y z'], ['あ', '😀']]));
    expect(queryDecode('')).toEqual(new Map());
    expect(queryDecode('=v&k=')).toEqual(new Map([['', 'v'], ['k', '']]));
    // %26 and %3D decode to & and = inside a key or value, after the split.
    expect(queryDecode('a%26b=c%3Dd')).toEqual(new Map([['a&b', 'c=d']]));
    // Bytes in no UTF-8 sequence: as url.unescape reads them.
    expect(run(`queryString.decode('a=%FF%C3%A9%E3')['a'] == url.unescape('%FF%C3%A9%E3')`)).toBe(true);
  });

  it('a semicolon or an invalid escape is an evaluation error naming the function', () => {
    expect(evalError(`queryString.decode('a=1;b=2')`).message).toMatch(/queryString\.decode\(\): invalid semicolon separator in query/);
    expect(evalError(`queryString.decode('a=%zz')`).message).toMatch(/queryString\.decode\(\): invalid URL escape "%zz"/);
    expect(evalError(`'a=%4'.decodeQueryString()`).message).toMatch(/decodeQueryString\(\): invalid URL escape "%4"/);
  });

  it('encodes sorted by key, escaped as url.QueryEscape; lists of strings repeat the key', () => {
    expect(run(`queryString.encode({'b': 'x y', 'a': ['1', '&'], 'é': '/'})`)).toBe('a=1&a=%26&b=x+y&%C3%A9=%2F');
    expect(run(`queryString.encode({})`)).toBe('');
    expect(withQuery(`queryString.encode(req.url.query_params)`, 'z=1&a=2&z=3')).toBe('a=2&z=1&z=3');
    expect(evalError(`queryString.encode({'a': 1})`).message).toMatch(/queryString\.encode\(\): the value of "a" is not a string or a list of strings \(int\)/);
    expect(evalError(`{'a': [1]}.encodeQueryString()`).message).toMatch(/encodeQueryString\(\): the value of "a" is not a string or a list of strings/);
    expect(evalError(`queryString.encode({'a': lists.range(10000).map(i, 'xxxxxxx')})`).message).toMatch(/result too long/);
  });
});

describe('url.parse(), parseUrl(), isURL(): Go’s url.Parse', () => {
  it('reads every part, unescaping path, user and fragment', () => {
    expect(Object.fromEntries(run(`url.parse('HTTPS://u%40s:p%3A@[::1]:8443/a%2Fb/c%20d?x=1&y#f%20g')`) as Map<string, string>)).toEqual({
      scheme: 'https',
      opaque: '',
      user: 'u%40s:p%3A',
      username: 'u@s',
      password: 'p:',
      host: '[::1]:8443',
      hostname: '::1',
      port: '8443',
      path: '/a/b/c d',
      raw_path: '/a%2Fb/c%20d',
      raw_query: 'x=1&y',
      fragment: 'f g',
      raw_fragment: '',
    });
    expect(run(`url.parse('mailto:x@example.com').opaque`)).toBe('x@example.com');
    expect(run(`url.parse('/just/a/path?q').path`)).toBe('/just/a/path');
    expect(run(`url.parse('//h:80').hostname + ':' + url.parse('//h:80').port`)).toBe('h:80');
    expect(run(`url.parse('http://h/é').path`)).toBe('/é');
  });

  it('an invalid URL is an evaluation error naming the function', () => {
    expect(evalError(`url.parse(':x')`).message).toMatch(/url\.parse\(\): missing protocol scheme/);
    expect(evalError(`url.parse('1a:b/c')`).message).toMatch(/url\.parse\(\): first path segment in URL cannot contain colon/);
    expect(run(`url.parse('ab/c:d').path`)).toBe('ab/c:d');
    expect(run(`'x:1/y'.parseUrl().opaque`)).toBe('1/y');
    expect(evalError(`url.parse('http://h/%zz')`).message).toMatch(/url\.parse\(\): invalid URL escape "%zz"/);
    expect(evalError(`url.parse('http://a b/')`).message).toMatch(/invalid character " " in host name/);
    expect(evalError(`url.parse('http://h:8x/')`).message).toMatch(/invalid port ":8x" after host/);
    expect(evalError(`url.parse('http://[::1/')`).message).toMatch(/missing '\]' in host/);
    expect(evalError(`url.parse('http://u[@h/')`).message).toMatch(/invalid userinfo/);
    expect(evalError(`'http://h/\\n'.parseUrl()`).message).toMatch(/parseUrl\(\): invalid control character in URL/);
  });

  it('isURL(): an absolute URL with a host', () => {
    for (const ok of ['https://ngrok.com', 'http://h:1/p?q#f', 'ftp://u@h']) expect(run(`'${ok}'.isURL()`), ok).toBe(true);
    for (const bad of ['not a url', '/path', 'mailto:x@example.com', 'http://a b', 'http://h/%zz', '', 'https://']) expect(run(`'${bad}'.isURL()`), bad).toBe(false);
  });
});

describe('hash.crc64() / hash.xxhash64()', () => {
  it("crc64 is Go's crc64.ISO; xxhash64 is xxHash64 with seed 0, checked against a BigInt implementation", () => {
    expect(crc64Iso(Buffer.from('')).toString('hex')).toBe('0000000000000000');
    expect(crc64Iso(Buffer.from('123456789')).toString('hex')).toBe('b90956c775a41001');
    expect(xxhash64(Buffer.from('')).toString('hex')).toBe('ef46db3751d8e999');
    expect(xxhash64(Buffer.from('abc')).toString('hex')).toBe('44bc2cf5ad770999');
    // Past 32 bytes (the four-lane loop), as the reference xxHash (Python's xxhash 4.0.1) gives them.
    const bytes768 = Buffer.from(Array.from({ length: 768 }, (_, i) => i % 256));
    expect(xxhash64(Buffer.alloc(32, 'a')).toString('hex')).toBe('856e843298f99ad7');
    expect(xxhash64(Buffer.from('The quick brown fox jumps over the lazy dog'.repeat(3))).toString('hex')).toBe('c652b4dbfcd6b853');
    expect(xxhash64(bytes768).toString('hex')).toBe('8e03c838c596036f');
    expect(crc64Iso(bytes768).toString('hex')).toBe('9844b204852d9205');
    let seed = 7;
    const rnd = () => (seed = (seed * 1103515245 + 12345) & 0x7fffffff) & 0xff;
    for (const len of [0, 1, 3, 4, 7, 8, 15, 31, 32, 33, 63, 64, 100, 1000]) {
      const b = Uint8Array.from({ length: len }, rnd);
      expect(xxhash64(b).toString('hex'), String(len)).toBe(xxhash64Reference(b));
    }
    // The string's UTF-8.
    expect(run(`hash.xxhash64('é')`)).toBe(xxhash64Reference(Buffer.from('é')));
    expect(evalError(`hash.crc64('x', 'hex2')`).message).toMatch(/crc64\(\): unknown format "hex2"/);
  });
});

describe('lists.range()', () => {
  it(`0 … n-1; empty for n ≤ 0; over ${MAX_LIST_RANGE} an evaluation error`, () => {
    expect(run('lists.range(0)')).toEqual([]);
    expect(run('lists.range(-3)')).toEqual([]);
    expect(run(`size(lists.range(${MAX_LIST_RANGE}))`)).toBe(BigInt(MAX_LIST_RANGE));
    expect(evalError(`lists.range(${MAX_LIST_RANGE + 1})`).message).toMatch(/lists\.range\(\): 10001 is too large \(at most 10000\)/);
    expect(evalError(`lists.range(int(getReqHeader('x')[0]))`, ['x', '9223372036854775807']).message).toMatch(/too large/);
    expect(run('lists.range(3).map(i, i * 2)')).toEqual([0n, 2n, 4n]);
  });
});

describe('the second batch in policies, with its cost', () => {
  const cost = (expr: string) => estimateCost(compileExpression('inbound', expr));
  it("accepts ngrok's examples, and charges what each builds", () => {
    const doc = `
inbound:
  - expressions:
      - "basic_auth.encode('username', 'password1') == getReqHeader('authorization')[0]"
      - "queryString.decode(req.url.query)['q'] == 'hello'"
      - "url.parse(req.url).host == 'ngrok.com'"
      - "json.encode(req.content_type.parameters) == '{\\"charset\\":\\"UTF-8\\"}'"
      - "lists.range(5).exists(i, i == 4)"
      - "rand.double() >= 0.5"
    actions: [{type: deny}]
  - actions:
      - type: add-headers
        config:
          headers:
            x-query: "\${queryString.encode({'q': 'policy'})}"
            x-hash: "\${hash.xxhash64(conn.client_ip)}"
`;
    expect(() => parseTrafficPolicy(doc)).not.toThrow();
    expect(() => parseTrafficPolicy(JSON.stringify({ inbound: [{ actions: [{ type: 'add-headers', config: { headers: { 'x-json': "${json.encode({'ip': conn.client_ip})}" } } }] }] }))).not.toThrow();
    // A literal n is charged for n elements; a computed one for MAX_LIST_RANGE.
    expect(cost('lists.range(5).exists(i, i == 4)')).toBeLessThan(cost(`lists.range(int(getReqHeader('n')[0])).exists(i, i == 4)`));
    // What json.encode() and queryString.encode() build is charged to what follows.
    expect(cost("json.encode(req.headers).matches('a')")).toBeGreaterThan(cost("json.encode(req.headers) != ''"));
    // Re-encoding a whole JSON header (json.decode's cost, then up to thousands of keys sorted) is over the budget.
    expect(cost("json.encode(json.decode(getReqHeader('x')[0])) != ''")).toBeGreaterThan(MAX_EXPRESSION_COST);
  });
});

describe("ngrok's documented examples: the third batch (rand.int, format, isPrivateIp, isQueryString, list methods)", () => {
  it('Random: rand.int', () => {
    // The defaults are 0 and 1, both included (`rand.int() == 1` can be true).
    const seen = new Set<unknown>();
    for (let i = 0; i < 64; i++) seen.add(run('rand.int()'));
    expect([...seen].sort()).toEqual([0n, 1n]);
    expect(typeof run('rand.int() == 1')).toBe('boolean');
    expect(typeof run('rand.int(0, 10) >= 5')).toBe('boolean');
    for (let i = 0; i < 64; i++) {
      const n = run('rand.int(0, 10)') as bigint;
      expect(n >= 0n && n <= 10n, String(n)).toBe(true);
    }
  });

  it('String: format', () => {
    expect(run('"hello %s".format(["world"])')).toBe('hello world');
    expect(run('"integer: %d".format([42])')).toBe('integer: 42');
    expect(run('"%f".format([3.14])')).toBe('3.140000');
    expect(run('"%x".format([26])')).toBe('1a');
    expect(run('"binary: %b".format([5])')).toBe('binary: 101');
    expect(run('"bool: %b".format([true])')).toBe('bool: 1');
  });

  it('String: isPrivateIp, isQueryString', () => {
    expect(run("'192.168.1.1'.isPrivateIp()")).toBe(true);
    expect(run("'a=b&c=d'.isQueryString()")).toBe(true);
    expect(run("'not a query string'.isQueryString()")).toBe(false);
  });

  it('Lists: slice, flatten, sort, sortBy, distinct', () => {
    expect(run('[1,2,3,4].slice(1, 3)')).toEqual([2n, 3n]);
    expect(run('[1,2,3,4].slice(2, 4)')).toEqual([3n, 4n]);
    expect(run('[1,[2,3],[4]].flatten()')).toEqual([1n, 2n, 3n, 4n]);
    expect(run('[1,[2,[3,4]]].flatten()')).toEqual([1n, 2n, [3n, 4n]]);
    expect(run('[1,2,[],[],[3,4]].flatten()')).toEqual([1n, 2n, 3n, 4n]);
    expect(run('[1,[2,[3,[4]]]].flatten(2)')).toEqual([1n, 2n, 3n, [4n]]);
    expect(evalError('[1,[2,[3,[4]]]].flatten(-1)').message).toMatch(/flatten\(\): level must be non-negative, got -1/);
    expect(run('[3, 2, 1].sort()')).toEqual([1n, 2n, 3n]);
    expect(run('["b", "c", "a"].sort()')).toEqual(['a', 'b', 'c']);
    expect(evalError('[1, "b"].sort()').message).toMatch(/sort\(\): list elements must have the same type \(int and string\)/);
    expect(evalError('[[1, 2, 3]].sort()').message).toMatch(/sort\(\): list elements must be comparable/);
    // ngrok's example sorts Player messages; maps with the same fields stand for them here.
    const players = `[{'name': "foo", 'score': 0}, {'name': "bar", 'score': -10}, {'name': "baz", 'score': 1000}]`;
    expect(run(`${players}.sortBy(e, e.score).map(e, e.name)`)).toEqual(['bar', 'foo', 'baz']);
    expect(run('[1, 2, 2, 3, 3, 3].distinct()')).toEqual([1n, 2n, 3n]);
    expect(run('["b", "b", "c", "a", "c"].distinct()')).toEqual(['b', 'c', 'a']);
    expect(run('[1, "b", 2, "b"].distinct()')).toEqual([1n, 'b', 2n]);
  });
});

describe('rand.int()', () => {
  it('draws from min to max, both included; refuses negative bounds and min > max', () => {
    expect(run('rand.int(7, 7)')).toBe(7n);
    const seen = new Set<bigint>();
    for (let i = 0; i < 200; i++) seen.add(randInt(3n, 5n));
    expect([...seen].sort()).toEqual([3n, 4n, 5n]);
    // Ranges of 2^48 and more (64-bit draws), up to CEL's largest int.
    for (let i = 0; i < 50; i++) {
      const a = randInt(0n, MAX_RAND_INT);
      expect(a >= 0n && a <= MAX_RAND_INT).toBe(true);
      const b = randInt(2n ** 62n, 2n ** 62n + 2n ** 50n);
      expect(b >= 2n ** 62n && b <= 2n ** 62n + 2n ** 50n).toBe(true);
    }
    expect(new Set(Array.from({ length: 20 }, () => randInt(0n, MAX_RAND_INT))).size).toBeGreaterThan(15);
    expect(run('rand.int(0, 9223372036854775807) >= 0')).toBe(true);
    expect(evalError('rand.int(10, 0)').message).toMatch(/rand\.int\(\): min must not be larger than max \(got 10, 0\)/);
    expect(evalError('rand.int(-1, 5)').message).toMatch(/rand\.int\(\): min and max must not be negative/);
    expect(evalError('rand.int(0, -5)').message).toMatch(/must not be negative/);
    // Computed bounds.
    expect(run("rand.int(int(getReqHeader('n')[0]), 3) == 3", ['n', '3'])).toBe(true);
    expect(() => run('rand.int(1) == 1')).toThrow(/found no matching overload/);
    expect(() => run("rand.int('a', 'b') == 1")).toThrow(/found no matching overload/);
  });
});

describe('format(): cel-go’s string.format', () => {
  it('cel-go’s examples', () => {
    expect(run('"this is a string: %s\\nand an integer: %d".format(["str", 42])')).toBe('this is a string: str\nand an integer: 42');
    expect(run('"a double substituted with %%s: %s".format([64.2])')).toBe('a double substituted with %s: 64.2');
    expect(run('"timestamp: %s".format([timestamp("2023-02-03T23:31:20+00:00")])')).toBe('timestamp: 2023-02-03T23:31:20Z');
    expect(run('"duration: %s".format([duration("1h45m47s")])')).toBe('duration: 6347s');
    expect(run('"5 in binary: %b".format([5])')).toBe('5 in binary: 101');
    expect(run('"26 in hex (uppercase): %X".format([26])')).toBe('26 in hex (uppercase): 1A');
    expect(run('"30 in octal: %o".format([30])')).toBe('30 in octal: 36');
    expect(run('"true bool: %s - false bool: %s\\nbinary bool: %b".format([true, false, true])')).toBe('true bool: true - false bool: false\nbinary bool: 1');
    // cel-go's formatter writes lists and maps' strings without quotes, map keys sorted.
    expect(run(`"a map inside a list: %s".format([[1, 2, 3, {"a": "x", "c": "z", "b": "y"}]])`)).toBe('a map inside a list: [1, 2, 3, {a: x, b: y, c: z}]');
    expect(run('"scientific notation: %e".format([2.71828])')).toBe('scientific notation: 2.718280e+00');
  });

  it('%s: every value that has a string', () => {
    expect(run(`'%s|%s|%s|%s|%s'.format([null, 3u, -7, b'hi', [b'\\xff']])`)).toBe('null|3|-7|hi|[\udcff]');
    expect(run(`'%s %s'.format([type(1), string])`)).toBe('int string');
    expect(run(`'%s'.format([duration('-1.5s')])`)).toBe('-1.5s');
    expect(run(`'%s'.format([timestamp('2023-01-01T00:00:00.250Z')])`)).toBe('2023-01-01T00:00:00.25Z');
    expect(run(`'%s %s %s %s %s %s'.format([1e21, 1.5e-7, -0.0, 0.1 + 0.2, 1.0 / 0.0, 0.0 / 0.0])`)).toBe('1000000000000000000000 0.00000015 -0 0.30000000000000004 Infinity NaN');
    // Map keys in Go's order (UTF-8 bytes), whatever their type.
    expect(run(`'%s'.format([{'😀': 1, '｡': 2, 'z': {'b': [], 'a': {}}}])`)).toBe('{z: {a: {}, b: []}, ｡: 2, 😀: 1}');
    expect(run(`'%s'.format([{2: 'b', 10: 'a'}])`)).toBe('{10: a, 2: b}');
    // Values that stand for a string; a header's bytes as they are.
    expect(run(`'<%s>'.format([req.url])`, [], '/p')).toBe('<https://app.example.com/p>');
    expect(run(`'%s'.format([getReqHeader('x')])`, ['x', 'a\xffb'])).toBe('[a\udcffb]');
    expect(evalError(`'%s'.format([getReqCookie('a')])`).message).toMatch(/format\(\): string clause can only be used on strings, bools, bytes, ints, doubles, maps, lists, types, durations, and timestamps, was given Cookie/);
  });

  it('%d, %f, %e, %b, %x, %X, %o: ints, uints and doubles as Go writes them', () => {
    expect(run(`'%d %d %d %d'.format([-42, 42u, 1.5, 9223372036854775807])`)).toBe('-42 42 1.5 9223372036854775807');
    expect(run(`'%f %.2f %.0f %f'.format([1, 2u, 2.5, -0.0])`)).toBe('1.000000 2.00 2 -0.000000');
    expect(run(`'%.3e %e %.0e'.format([123456, 1e-7, 25.0])`)).toBe('1.235e+05 1.000000e-07 2e+01');
    expect(run(`'%b %b %b %b'.format([-5, 5u, false, 0])`)).toBe('-101 101 0 0');
    expect(run(`'%x %X %x %X %x'.format([-26, 255u, 'hé', b'\\x01\\xab', getReqHeader('x')[0]])`, ['x', '\xff'])).toBe('-1a FF 68c3a9 01AB ff');
    expect(run(`'%o %o'.format([-30, 8u])`)).toBe('-36 10');
    // Precision is read for every clause, used by %f and %e.
    expect(run(`'%.2s %.1d'.format(['abc', 7])`)).toBe('abc 7');
  });

  it('rounds an exact tie to even, as Go (JavaScript rounds it away from zero)', () => {
    expect(run(`'%.0f %.0f %.0f %.0f %.1f %.2f'.format([0.5, 1.5, 2.5, -2.5, 0.25, 1.005])`)).toBe('0 2 2 -2 0.2 1.00');
    expect(formatFixed(0.125, 2)).toBe('0.12');
    expect(formatFixed(0.375, 2)).toBe('0.38');
    expect(formatFixed(2 ** -20, 19)).toBe('0.0000009536743164062');
    expect(formatScientific(125, 1)).toBe('1.2e+02');
    expect(formatScientific(135, 1)).toBe('1.4e+02');
    expect(formatScientific(9.5, 0)).toBe('1e+01');
    expect(formatScientific(35, 0)).toBe('4e+01');
    expect(formatScientific(0.125, 1)).toBe('1.2e-01');
    expect(formatScientific(-2.5, 0)).toBe('-2e+00');
  });

  it('numbers at the edges of doubles', () => {
    expect(formatFixed(1e21, 6)).toBe('1000000000000000000000.000000');
    expect(formatFixed(1.7976931348623157e308, 0)).toBe('179769313486231570814527423731704356798070567525844996598917476803157260780028538760589558632766878171540458953514382464234321326889464182768467546703537516986049910576551282076245490090389328944075868508455133942304583236903222948165808559332123348274797826204144723168738177180919299881250404026184124858368');
    expect(formatFixed(5e-324, 2)).toBe('0.00');
    expect(formatFixed(-1e-10, 3)).toBe('-0.000');
    expect(formatScientific(5e-324, 6)).toBe('4.940656e-324');
    expect(formatScientific(1.7976931348623157e308, 3)).toBe('1.798e+308');
    expect(formatScientific(1e100, 2)).toBe('1.00e+100');
    expect(formatScientific(0, 0)).toBe('0e+00');
    expect(formatFixed(NaN, 2)).toBe('NaN');
    expect(formatScientific(-Infinity, 2)).toBe('-Infinity');
    expect(shortestFixed(5e-324)).toBe(`0.${'0'.repeat(323)}5`);
    expect(shortestFixed(123456789012345680000)).toBe('123456789012345680000');
    expect(formatFixed(0.1, 100)).toBe((0.1).toFixed(100));
  });

  it('other clauses, missing arguments, bad precisions: an evaluation error naming format()', () => {
    for (const bad of ['%q', '%v', '%c', '%i', '%u', '%E', '%g', '%F', '%5d', '%-s', '%+d'])
      expect(evalError(`'${bad}'.format([1])`).message, bad).toMatch(/format\(\): unrecognized formatting clause "%.*" at position 0 \(the clauses are %s, %d, %f, %e, %b, %x, %X, %o/);
    expect(evalError(`'50%'.format([1])`).message).toMatch(/format\(\): the format ends inside a clause at position 2/);
    expect(evalError(`'%.'.format([1])`).message).toMatch(/invalid precision/);
    expect(evalError(`'%.f'.format([1.0])`).message).toMatch(/invalid precision/);
    expect(evalError(`'%.${MAX_FORMAT_PRECISION + 1}f'.format([1.0])`).message).toMatch(/precision 101 is too large \(at most 100\)/);
    expect(evalError(`'%s and %s'.format(['a'])`).message).toMatch(/the clause "%s" at position 7 has no argument \(the list has 1\)/);
    expect(evalError(`'%d'.format(['a'])`).message).toMatch(/decimal clause can only be used on ints, uints, and doubles, was given string/);
    expect(evalError(`'%f'.format(['a'])`).message).toMatch(/fixed-point clause can only be used on ints, uints, and doubles, was given string/);
    expect(evalError(`'%e'.format([true])`).message).toMatch(/scientific clause can only be used on ints, uints, and doubles, was given bool/);
    expect(evalError(`'%b'.format([1.5])`).message).toMatch(/only ints, uints, and bools can be formatted as binary, was given double/);
    expect(evalError(`'%x'.format([1.5])`).message).toMatch(/only ints, uints, bytes, and strings can be formatted as hex, was given double/);
    expect(evalError(`'%o'.format(['a'])`).message).toMatch(/octal clause can only be used on ints and uints, was given string/);
    // Arguments past the last clause are ignored; %% takes none.
    expect(run(`'%d%%'.format([5, 6])`)).toBe('5%');
    expect(run(`'no clause'.format([])`)).toBe('no clause');
    expect(run(`'%%d'.format([])`)).toBe('%d');
  });

  it(`refuses a result over ${MAX_BUILT_STRING} characters and values nested more than ${MAX_VALUE_DEPTH} deep`, () => {
    expect(evalError(`'%s'.format([lists.range(10000).map(i, 'xxxxxxxx')])`).message).toMatch(/format\(\): result too long \(over 65536 characters\)/);
    expect(evalError(`'%x%x'.format([getReqHeader('x')[0], getReqHeader('x')[0]])`, ['x', 'a'.repeat(20000)]).message).toMatch(/result too long/);
    expect(evalError(`'%s'.format([lists.range(3000).map(i, {'k': 'v' + string(i) + 'xxxxxxxxxxxxxxxxxx'})])`).message).toMatch(/result too long/);
    expect(formatString('%s', [Array.from({ length: 20 }, () => 'x'.repeat(3000))]).length).toBe(60_000 + 2 + 19 * 2);
    let deep: unknown = [];
    for (let i = 0; i < MAX_VALUE_DEPTH; i++) deep = [deep];
    expect(() => formatString('%s', [deep])).toThrow(/value nested more than 100 deep/);
    expect(formatString('%s', [(deep as unknown[])[0]])).toBe('['.repeat(MAX_VALUE_DEPTH) + ']'.repeat(MAX_VALUE_DEPTH));
  });

  it('works on req.url and dyn values as their strings', () => {
    expect(run(`dyn('%s!').format(['a'])`)).toBe('a!');
    expect(run(`req.url.format([])`, [], '/a')).toBe('https://app.example.com/a');
    expect(run(`'%s/b'.format([req.url])`, [], '/a')).toBe('https://app.example.com/a/b');
  });
});

describe('isPrivateIp(): Go’s net.IP.IsPrivate', () => {
  it('RFC 1918 and fc00::/7; not loopback, link-local or public addresses', () => {
    for (const ip of ['10.0.0.0', '10.255.255.255', '172.16.0.0', '172.31.255.255', '192.168.0.0', '192.168.255.255', 'fc00::', 'fd12:3456::1', 'FDFF:FFFF::', '::ffff:10.1.2.3', '::ffff:c0a8:101'])
      expect(isPrivateIp(ip), ip).toBe(true);
    for (const ip of ['9.255.255.255', '11.0.0.0', '172.15.255.255', '172.32.0.0', '192.167.1.1', '192.169.0.0', '127.0.0.1', '169.254.1.1', '0.0.0.0', '255.255.255.255', '100.64.0.1', '::1', 'fe80::1', 'fec0::1', 'fbff::1', 'fe00::', '2001:db8::1', '::', '::10.0.0.1', '::ffff:8.8.8.8'])
      expect(isPrivateIp(ip), ip).toBe(false);
    for (const bad of ['', 'x', '10.0.0', '10.0.0.1.2', '010.0.0.1', '10.0.0.256', '10.0.0.1/8', '10.0.0.1:80', ' 10.0.0.1', 'fd00::1%eth0', '[fd00::1]', 'fd00:::1', '10.0.0.1'.padEnd(100, ' ')])
      expect(isPrivateIp(bad), JSON.stringify(bad)).toBe(false);
    expect(run('conn.client_ip.isPrivateIp()')).toBe(false);
    expect(run("getReqHeader('x')[0].isPrivateIp()", ['x', '10.1.1.1'])).toBe(true);
  });
});

describe('isQueryString()', () => {
  it('what url.ParseQuery reads, with keys, and nothing a query cannot hold', () => {
    for (const q of ['a=b&c=d', 'a=b', 'a', 'debug&x=1', 'a=', 'a=b&&c=d', '&a=1&', 'q=hello+world', 'q=%E3%81%82', 'a[]=1&a[]=2', 'x=a/b?c:d@e', 'é=ü', 'a=b=c'])
      expect(isQueryString(q), q).toBe(true);
    for (const q of ['', 'not a query string', 'a=b c', 'a=b\tc', 'a=%zz', 'a=%4', 'a=1;b=2', '=b', 'a=1&=2', '&', '&&', 'a=1#frag', 'a=\n', 'a\u00a0=1'])
      expect(isQueryString(q), JSON.stringify(q)).toBe(false);
    expect(run('req.url.query.isQueryString()')).toBe(false);
    expect(withQuery('req.url.query.isQueryString()', 'a=1&b=2')).toBe(true);
  });
});

describe('slice(), flatten(), sort(), sortBy(), distinct(): cel-go’s lists extension', () => {
  it('slice(): the elements from start to end (excluded); bad indexes are an evaluation error', () => {
    expect(run('[1, 2, 3].slice(0, 0)')).toEqual([]);
    expect(run('[1, 2, 3].slice(3, 3)')).toEqual([]);
    expect(run('[1, 2, 3].slice(0, 3)')).toEqual([1n, 2n, 3n]);
    expect(run("getReqHeader('x').slice(1, 2)", ['x', 'a', 'x', 'b', 'x', 'c'])).toEqual(['b']);
    expect(evalError('[1, 2, 3].slice(-1, 2)').message).toMatch(/cannot slice\(-1, 2\), negative indexes not supported/);
    expect(evalError('[1, 2, 3].slice(2, 1)').message).toMatch(/cannot slice\(2, 1\), start index must be less than or equal to end index/);
    expect(evalError('[1, 2, 3].slice(1, 4)').message).toMatch(/cannot slice\(1, 4\), list is length 3/);
    expect(() => run("'abc'.slice(0, 1) == 'a'")).toThrow(/found no matching overload/);
  });

  it(`flatten(): depth 1 by default; at most ${MAX_FLATTEN_DEPTH} levels and ${MAX_BUILT_LIST} elements walked`, () => {
    expect(run('[[1], [[2]], 3].flatten(0)')).toEqual([[1n], [[2n]], 3n]);
    expect(run('[[1], [[2, [3]]], {"a": [4]}].flatten(5)')).toEqual([1n, 2n, 3n, { a: [4n] }]);
    expect(run('[].flatten()')).toEqual([]);
    let deep: unknown = [1n];
    for (let i = 0; i < 150; i++) deep = [deep];
    expect(listFlatten(deep as unknown[], BigInt(MAX_FLATTEN_DEPTH)).length).toBe(1);
    expect(evalError(`[[1]].flatten(${MAX_FLATTEN_DEPTH + 1})`).message).toMatch(/flatten\(\): depth 101 is too large \(at most 100\)/);
    expect(run('size(lists.range(100).map(i, lists.range(100)).flatten())')).toBe(10000n);
    expect(evalError('lists.range(300).map(i, lists.range(300)).flatten()').message).toMatch(/flatten\(\): list too long \(more than 65536 elements to walk\)/);
    // Empty lists walked count as well (a list of many aliases of one large list).
    const empties = Array.from({ length: MAX_BUILT_LIST + 1 }, () => []);
    expect(() => listFlatten(empties)).toThrow(/list too long/);
  });

  it('sort(): one comparable type, in Go’s order; otherwise an evaluation error', () => {
    expect(run('[3u, 1u, 2u].sort()')).toEqual(run('[1u, 2u, 3u]'));
    expect(run('[2.5, -1.0, 1e100, -0.5].sort()')).toEqual([-1, -0.5, 2.5, 1e100]);
    expect(run('[true, false, true].sort()')).toEqual([false, true, true]);
    expect(run("[b'\\x02', b'\\x01\\xff', b'\\x01'].sort()")).toEqual([new Uint8Array([1]), new Uint8Array([1, 255]), new Uint8Array([2])]);
    expect(run("[duration('2s'), duration('-1s'), duration('1ms')].sort().map(d, '%s'.format([d]))")).toEqual(['-1s', '0.001s', '2s']);
    expect(run("[timestamp('2024-01-02T00:00:00Z'), timestamp('2023-01-01T00:00:00Z')].sort()[0] == timestamp('2023-01-01T00:00:00Z')")).toBe(true);
    // Strings by their UTF-8 bytes (code points), not UTF-16: U+FF61 before U+1F600.
    expect(run(`['😀', '｡', 'z', 'Z', '', 'a'].sort()`)).toEqual(['', 'Z', 'a', 'z', '｡', '😀']);
    expect(listSort(['\udcff', 'a\udc80', 'a'])).toEqual(['a', 'a\udc80', '\udcff']);
    expect(run('[].sort()')).toEqual([]);
    expect(evalError('[1, 2.0].sort()').message).toMatch(/must have the same type \(int and double\)/);
    expect(evalError('[1.0, 0.0 / 0.0].sort()').message).toMatch(/sort\(\): NaN values cannot be ordered/);
    expect(evalError('[{"a": 1}].sort()').message).toMatch(/must be comparable.*got map/);
    expect(evalError('[null, null].sort()').message).toMatch(/must be comparable.*got null/);
  });

  it('sortBy(): the elements by their keys, stably; the key once per element', () => {
    expect(run("['ccc', 'a', 'bb', 'dd'].sortBy(s, s.size())")).toEqual(['a', 'bb', 'dd', 'ccc']);
    expect(run("['b', 'a', 'c'].sortBy(s, s)")).toEqual(['a', 'b', 'c']);
    expect(run('[1, 2, 3].sortBy(x, -x)')).toEqual([3n, 2n, 1n]);
    expect(run("getReqHeader('x').sortBy(v, int(v))", ['x', '10', 'x', '9', 'x', '-1'])).toEqual(['-1', '9', '10']);
    // The variable is scoped to the key; an outer one of the same name is untouched.
    expect(run('[[2, 1], [1]].map(x, x.sortBy(x, x)).sortBy(x, x.size())')).toEqual([[1n], [1n, 2n]]);
    expect(run('cel.bind(x, 5, [3, 1].sortBy(x, x)[0] + x)')).toBe(6n);
    expect(run('[].sortBy(x, x)')).toEqual([]);
    // Keys must be of one comparable type: a key of a known other type does not compile.
    expect(() => run('[1, 2].sortBy(e, [e])')).toThrow(/sortBy\(\): the key must be an int, uint, double, bool, string, bytes, duration or timestamp, got list<int>/);
    expect(() => run('[1].sortBy(1, 1)')).toThrow(/sortBy\(var, key\): the first argument must be a variable name/);
    expect(() => run("'abc'.sortBy(c, c)")).toThrow(/found no matching overload for 'string\.sortBy\(var, key\)'/);
    expect(evalError("[1, 2].sortBy(e, e == 1 ? dyn('a') : dyn(2))").message).toMatch(/sortBy\(\): list elements must have the same type/);
    expect(evalError("dyn('abc').sortBy(c, c)").message).toMatch(/sortBy\(\): needs a list, got string/);
  });

  it('distinct(): the first of each equal element, numbers equal across types', () => {
    expect(run('[1, 1u, 1.0, 2, 2.5, 2.5].distinct()')).toEqual([1n, 2n, 2.5]);
    expect(run('[[1, 2], [1, 2], [2, 1], [1.0, 2u]].distinct()')).toEqual([[1n, 2n], [2n, 1n]]);
    expect(run('[{"a": 1, "b": 2}, {"b": 2, "a": 1}, {"a": 1}].distinct()')).toEqual([{ a: 1n, b: 2n }, { a: 1n }]);
    expect(run("[b'a', b'a', 'a', null, null, true, true, false].distinct()")).toEqual([new Uint8Array([97]), 'a', null, true, false]);
    expect(run("[duration('1s'), duration('1000ms'), timestamp('2023-01-01T00:00:00Z'), timestamp('2023-01-01T00:00:00Z')].distinct().size()")).toBe(2n);
    // -0.0 == 0.0; NaN equals nothing, not even itself.
    expect(run('[0.0, -0.0, 0].distinct()')).toEqual([0]);
    expect(run('[0.0 / 0.0, 0.0 / 0.0].distinct().size()')).toBe(2n);
    expect(run('[1, "1", [1], {"1": 1}].distinct().size()')).toBe(4n);
    expect(run("['ab', 'a' + 'b', getReqHeader('x')[0]].distinct()", ['x', 'ab'])).toEqual(['ab']);
    // Objects of the registered types equal only themselves.
    expect(run('[req.url, req.url, getReqCookie("a"), getReqCookie("a")].distinct().size()')).toBe(2n);
    expect(() => listDistinct(['x'.repeat(MAX_DISTINCT_CHARS)])).not.toThrow();
    expect(() => listDistinct([['x'.repeat(MAX_DISTINCT_CHARS - 10)]])).not.toThrow();
    expect(() => listDistinct(['x'.repeat(MAX_DISTINCT_CHARS / 2), 'y'.repeat(MAX_DISTINCT_CHARS / 2 + 1)])).toThrow(/distinct\(\): elements too large to compare/);
    let deep: unknown = [];
    for (let i = 0; i < MAX_VALUE_DEPTH; i++) deep = [deep];
    expect(() => listDistinct([deep])).toThrow(/distinct\(\): value nested more than 100 deep/);
  });

  it(`sort(), sortBy() and distinct() refuse lists of more than ${MAX_BUILT_LIST} elements`, () => {
    const long = Array.from({ length: MAX_BUILT_LIST + 1 }, (_, i) => BigInt(i));
    expect(() => listSort(long)).toThrow(/sort\(\): list too long \(65537 elements, at most 65536\)/);
    expect(() => listDistinct(long)).toThrow(/distinct\(\): list too long/);
    expect(listSort(long.slice(0, MAX_BUILT_LIST).reverse())[0]).toBe(0n);
  });
});

describe('the third batch in policies, with its cost', () => {
  const cost = (expr: string) => estimateCost(compileExpression('inbound', expr));
  it("accepts ngrok's examples, and charges what each does", () => {
    const doc = `
inbound:
  - expressions:
      - "rand.int() == 1"
      - "rand.int(0, 10) >= 5"
      - "conn.client_ip.isPrivateIp()"
      - "req.url.query.isQueryString()"
      - "getReqHeader('x-tags')[0].split(',').slice(0, 10).distinct().sort()[0] == 'a'"
      - "[[1], [2, 3]].flatten().size() == 3"
      - "getReqHeader('x-ids').sortBy(v, int(v))[0] == '1'"
    actions: [{type: deny}]
  - actions:
      - type: add-headers
        config:
          headers:
            x-who: "\${'%s from %s (%d)'.format([req.method, conn.client_ip, conn.client_port])}"
            x-ratio: "\${'%.2f'.format([rand.double()])}"
`;
    expect(() => parseTrafficPolicy(doc)).not.toThrow();
    // A literal format string: its clauses; a computed one: up to one per two characters.
    expect(cost("'%s'.format([req.path]) != ''")).toBeLessThan(cost("getReqHeader('f')[0].format([req.path]) != ''"));
    expect(cost("getReqHeader('f')[0].format(lists.range(1000).map(i, 2.5)) != ''")).toBeGreaterThan(MAX_EXPRESSION_COST);
    // Literal slice bounds: that many elements.
    expect(cost("getReqHeader('x').slice(0, 2).exists(v, v == 'a')")).toBeLessThan(cost("getReqHeader('x').slice(0, size(getReqHeader('x'))).exists(v, v == 'a')"));
    // sortBy's key runs once per element, as a comprehension's body.
    expect(cost("getReqHeader('x').sortBy(v, v.lower()).size() > 0")).toBeGreaterThan(cost("getReqHeader('x').sort().size() > 0"));
    // Each is charged to what follows.
    expect(cost("getReqHeader('x').sort().exists(v, v.matches('a+b'))")).toBeGreaterThan(cost("getReqHeader('x').exists(v, v.matches('a+b'))"));
  });
});
