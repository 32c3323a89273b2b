import { describe, expect, it } from 'vitest';
import { EvaluationError } from '@marcbachmann/cel-js';
import { CEL_TIME, CelActions, CelConn, CelRequest, CelResponse } from './cel-vars.js';
import { compileExpression } from './cel.js';
import { charAt, isJson, lower, MAX_BUILT_STRING, MAX_JSON_DECODE_DEPTH, quote, replace, reverse, upper, UPPER_SPECIAL_CODE_POINTS, urlEscape, urlUnescape } from './ngrok-macros.js';
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

  it('Hash: hex by default, or base64', () => {
    const hello: Record<string, [string, string]> = {
      crc32: ['3610a686', 'NhCmhg=='],
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

  it("ngrok's macros of the namespaces Warren lacks are still named", () => {
    expect(() => run("url.parse('https://x').host == 'x'")).toThrow(/ngrok's url\.parse\(\) is not supported by Warren/);
    expect(() => run("hash.xxhash64('hello') == ''")).toThrow(/ngrok's hash\.xxhash64\(\) is not supported by Warren/);
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
