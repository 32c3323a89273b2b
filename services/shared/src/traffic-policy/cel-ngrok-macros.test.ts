import { describe, expect, it } from 'vitest';
import { EvaluationError } from '@marcbachmann/cel-js';
import { CEL_TIME, CelActions, CelConn, CelRequest, CelResponse } from './cel-vars.js';
import { compileExpression } from './cel.js';
import { charAt, isJson, lower, MAX_BUILT_STRING, MAX_JSON_DECODE_DEPTH, quote, replace, reverse, upper, UPPER_SPECIAL_CODE_POINTS, urlEscape, urlUnescape } from './ngrok-macros.js';
import { crc64Iso, jsonEncode, MAX_JSON_ENCODE_DEPTH, MAX_LIST_RANGE, queryDecode, sortUtf8, xxhash64 } from './ngrok-macros.js';
import { estimateCost, MAX_EXPRESSION_COST } from './cost.js';
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
    expect(() => run('rand.int(0, 10) >= 5')).toThrow(/ngrok's rand\.int\(\) is not supported by Warren/);
    expect(() => run("'a=b'.isQueryString()")).toThrow(/ngrok's string\.isQueryString\(\) is not supported by Warren/);
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
