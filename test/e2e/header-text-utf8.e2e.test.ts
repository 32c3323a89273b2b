import { createHash, randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { Redis } from 'ioredis';
import { digestKey, redisKeyPattern } from '../../services/ingress/src/ratelimit/index.js';
import { deleteKeys } from '../support/redis-keys.js';
import { startPolicyCluster, type PolicyCluster, type PolicyResponse } from '../support/policy-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * Header values are UTF-8 text, as ngrok (Go) treats them, through real processes (a control
 * plane, two ingress nodes, our agent and an upstream that echoes the bytes of every header that
 * reached it): the traffic policy's CEL reads a header's bytes as UTF-8 (`==`, `size()`,
 * `upper()`, the hash macros, interpolation), rate-limit bucket keys likewise; a byte in no
 * UTF-8 sequence reads as one character (U+DC00 + the byte) that no text equals and that goes
 * out as the same byte (those assertions are in a describe of their own, the last); values written in
 * a policy (add-headers, custom-response, redirect) or a route module (request_headers,
 * response_headers) may hold any Unicode text and go out as their UTF-8 bytes ("5 €" is
 * 35 20 e2 82 ac); a control character or a lone surrogate in one is refused by the API with a
 * 400 naming the field.
 *
 * node:http writes a header value's characters as Latin-1 bytes and reads bytes back the same
 * way: `bytes(text)` is the value that goes out as `text`'s UTF-8 bytes, and `Buffer.from(v,
 * 'latin1')` gives back the bytes of a value received.
 */

const HOST = 'utf8hdr.e2e.test';
const NAME = 'utf8hdr';
const NOT_ALLOWED = 'header value has a character not allowed in a header (a control character or a lone surrogate)';
let c: PolicyCluster;
const prefix = `e2e-utf8-${randomBytes(4).toString('hex')}`;
const redisUrl = inject('redisUrl');

/** `text`'s UTF-8 bytes as a string node:http sends byte for byte. */
const bytes = (text: string): string => Buffer.from(text, 'utf8').toString('latin1');
const utf8Hex = (text: string): string => Buffer.from(text, 'utf8').toString('hex');
/** Raw bytes (given as numbers) as a string node:http sends byte for byte. */
const rawBytes = (...parts: Array<string | number[]>): string => Buffer.concat(parts.map((p) => (typeof p === 'string' ? Buffer.from(p, 'utf8') : Buffer.from(p)))).toString('latin1');

/** What reached the upstream: each header's bytes as hex, in order. */
interface Echo {
  url: string;
  raw: Array<[string, string]>;
}
const echoOf = (r: PolicyResponse): Echo => {
  expect(r.status, r.body).toBe(200);
  return r.json() as Echo;
};
/** The bytes (hex) of every `name` header the upstream received. */
const upstreamHex = (e: Echo, name: string): string[] => e.raw.filter(([n]) => n.toLowerCase() === name).map(([, v]) => v);
/** Every `name` header the upstream received, its bytes read as UTF-8. */
const upstreamText = (e: Echo, name: string): string[] => upstreamHex(e, name).map((h) => Buffer.from(h, 'hex').toString('utf8'));
/** The bytes (hex) of the client's `name` header (undefined when absent). */
const clientHex = (r: PolicyResponse, name: string): string | undefined => {
  const v = r.headers[name];
  return v === undefined ? undefined : Buffer.from(String(v), 'latin1').toString('hex');
};
/** The client's `name` header, its bytes read as UTF-8. */
const clientText = (r: PolicyResponse, name: string): string | undefined => {
  const h = clientHex(r, name);
  return h === undefined ? undefined : Buffer.from(h, 'hex').toString('utf8');
};

/** The upstream's answer header `x-up-name` by path (its UTF-8 bytes, or Latin-1 é). */
const UPSTREAM_SETS: Record<string, string> = {
  utf8: bytes('Zoë ☕'),
  latin1: rawBytes('Zo', [0xeb]),
};

beforeAll(async () => {
  c = await startPolicyCluster({
    name: NAME,
    host: HOST,
    nodes: 2,
    // A run's own rate-limit server ids keep its Redis keys apart.
    ingressEnv: (nodeId) => ({ REDIS_URL: redisUrl, RATE_LIMIT_SERVER_ID: `${prefix}-${nodeId}` }),
    upstream: (req, res) => {
      req.resume();
      req.on('end', () => {
        const raw: Array<[string, string]> = [];
        for (let i = 0; i < req.rawHeaders.length; i += 2) raw.push([req.rawHeaders[i]!, Buffer.from(req.rawHeaders[i + 1]!, 'latin1').toString('hex')]);
        const sets = /\/up-sets-(\w+)/.exec(req.url ?? '')?.[1];
        res.writeHead(200, { 'content-type': 'application/json', ...(sets ? { 'x-up-name': UPSTREAM_SETS[sets]! } : {}) });
        res.end(JSON.stringify({ url: req.url ?? '', raw } satisfies Echo));
      });
    },
  });
}, CLUSTER_HOOK_MS);

afterAll(async () => {
  await c?.stop();
  const redis = new Redis(redisUrl);
  try {
    for (const node of [`${NAME}-a`, `${NAME}-b`]) await deleteKeys(redis, redisKeyPattern(`${prefix}-${node}`));
  } finally {
    redis.disconnect();
  }
}, 60_000);

let rlRoute: Promise<string> | undefined;
/**
 * A route that limits `/rlu/api` by `X-User` (capacity 2 a minute, per node) and then tells the
 * upstream the bucket key (`x-bucket`); created once, its id.
 */
const rateLimitRoute = () =>
  (rlRoute ??= c.policyRoute('/rlu', {
    on_http_request: [
      {
        expressions: ["req.url.path.startsWith('/rlu/api')"],
        actions: [{ type: 'rate-limit', config: { name: 'per-name', algorithm: 'sliding_window', capacity: 2, rate: '60s', bucket_key: ["getReqHeader('X-User')"] } }],
      },
      { expressions: ["req.url.path.startsWith('/rlu/api')"], actions: [{ type: 'add-headers', config: { headers: { 'x-bucket': '${actions.ngrok.rate_limit.bucket_key}' } } }] },
    ],
  }));

/** Both nodes: the agent's, and the one that carries requests over the internal hop to it. */
const nodes = () => [
  ['locally', c.nodes[0]!.http],
  ['over the internal hop', c.nodes[1]!.http],
] as const;

describe('CEL reads request header values as UTF-8 text', () => {
  it('an inbound expression compares a non-ASCII value: only its UTF-8 bytes match (deny, custom-response)', async () => {
    await c.policyRoute('/eq', {
      on_http_request: [
        {
          expressions: ["'x-name' in req.headers && req.headers['x-name'][0] == 'José'"],
          actions: [{ type: 'custom-response', config: { status_code: 200, body: 'matched José', headers: { 'x-matched': 'sí ✓' } } }],
        },
        { expressions: ["getReqHeader('X-Name') == ['こんにちは 😀']"], actions: [{ type: 'deny', config: { status_code: 451 } }] },
      ],
    });
    for (const [where, port] of nodes()) {
      // The UTF-8 bytes of "José" (4a 6f 73 c3 a9) are "José".
      const hit = await c.request('/eq/x', { port, headers: { 'x-name': bytes('José') } });
      // (Its header's bytes are the next describe's: custom-response headers.)
      expect([where, hit.status, hit.body, 'x-matched' in hit.headers]).toEqual([where, 200, 'matched José', true]);

      // Beyond U+00FF and the BMP: denied.
      expect([where, (await c.request('/eq/x', { port, headers: { 'x-name': bytes('こんにちは 😀') } })).status]).toEqual([where, 451]);

      // Other text goes to the upstream, its header unchanged: another case, a prefix, Latin-1
      // é (e9: the Latin-1 reading of which was "José"), the Latin-1 reading of the UTF-8 bytes.
      for (const [what, value] of [
        ['Jose', bytes('Jose')],
        ['JOSÉ', bytes('JOSÉ')],
        ['Josée', bytes('Josée')],
        ['こんにちは', bytes('こんにちは')],
        ['Latin-1 José', rawBytes('Jos', [0xe9])],
        ['JosÃ©', bytes('JosÃ©')],
      ] as const) {
        const e = echoOf(await c.request('/eq/x', { port, headers: { 'x-name': value } }));
        expect([where, what, upstreamHex(e, 'x-name')]).toEqual([where, what, [Buffer.from(value, 'latin1').toString('hex')]]);
      }
    }
  });

  it('size(), upper(), lower(), hash and base64 macros see the text; interpolations send the results as UTF-8', async () => {
    const joseSha = createHash('sha256').update('José', 'utf8').digest('hex');
    // Two routes: the cost check bounds each policy's worst case (a header of any size), and
    // these interpolations together are over one policy's budget.
    await c.policyRoute('/fn', {
      on_http_request: [
        { expressions: ["size(req.headers['x-name'][0]) == 4"], actions: [{ type: 'add-headers', config: { headers: { 'x-size-is-4': 'yes' } } }] },
        { expressions: [`req.headers['x-name'][0].sha256() == '${joseSha}'`], actions: [{ type: 'add-headers', config: { headers: { 'x-sha-matches': 'yes' } } }] },
        {
          actions: [
            {
              type: 'add-headers',
              config: { headers: { 'x-upper': "${req.headers['x-name'][0].upper()}", 'x-size': "${size(req.headers['x-name'][0])}", 'x-sha256': "${req.headers['x-name'][0].sha256()}" } },
            },
          ],
        },
      ],
    });
    await c.policyRoute('/fm', {
      on_http_request: [
        {
          actions: [
            {
              type: 'add-headers',
              config: { headers: { 'x-lower': "${getReqHeader('X-Name')[0].lower()}", 'x-md5': "${hash.md5(req.headers['x-name'][0], 'base64')}", 'x-b64': "${req.headers['x-name'][0].encodeBase64()}" } },
            },
          ],
        },
      ],
    });
    const md5 = (t: string) => createHash('md5').update(t, 'utf8').digest('base64');
    const b64 = (t: string) => Buffer.from(t, 'utf8').toString('base64');
    for (const [where, port] of nodes()) {
      const e = echoOf(await c.request('/fn/x', { port, headers: { 'x-name': bytes('José') } }));
      const m = echoOf(await c.request('/fm/x', { port, headers: { 'x-name': bytes('José') } }));
      const got = (n: string) => [...upstreamText(e, n), ...upstreamText(m, n)];
      expect({ where, ...Object.fromEntries(['x-size-is-4', 'x-sha-matches', 'x-size', 'x-upper', 'x-lower', 'x-sha256', 'x-md5', 'x-b64'].map((n) => [n, got(n)])) }).toEqual({
        where,
        'x-size-is-4': ['yes'],
        'x-sha-matches': ['yes'],
        'x-size': ['4'],
        'x-upper': ['JOSÉ'],
        'x-lower': ['josé'],
        'x-sha256': [joseSha],
        'x-md5': [md5('José')],
        'x-b64': [b64('José')],
      });
      expect(upstreamHex(e, 'x-upper')).toEqual([utf8Hex('JOSÉ')]);

      // Beyond U+00FF and beyond the BMP: code points, not bytes or UTF-16 units.
      const text = 'こんにちは 😀';
      const e2 = echoOf(await c.request('/fn/x', { port, headers: { 'x-name': bytes(text) } }));
      const m2 = echoOf(await c.request('/fm/x', { port, headers: { 'x-name': bytes(text) } }));
      expect([where, upstreamText(e2, 'x-size'), upstreamText(e2, 'x-size-is-4'), upstreamText(e2, 'x-sha256'), upstreamText(m2, 'x-md5'), upstreamText(m2, 'x-b64')]).toEqual([
        where,
        ['7'],
        [],
        [createHash('sha256').update(text, 'utf8').digest('hex')],
        [md5(text)],
        [b64(text)],
      ]);
      expect(upstreamHex(e2, 'x-upper')).toEqual([utf8Hex(text)]);
    }
  });

  it('an interpolated header copies a non-ASCII request header to the upstream byte for byte', async () => {
    await c.policyRoute('/copy', {
      on_http_request: [{ actions: [{ type: 'add-headers', config: { headers: { 'x-copy': "${req.headers['x-name'][0]}", 'x-framed': "« ${getReqHeader('x-name')[0]} » €" } } }] }],
    });
    for (const [where, port] of nodes()) {
      for (const text of ['José', 'café Zoë', '5 €', 'こんにちは', '😀 🇫🇷', 'plain']) {
        const e = echoOf(await c.request('/copy/x', { port, headers: { 'x-name': bytes(text) } }));
        expect({ where, text, name: upstreamHex(e, 'x-name'), copy: upstreamHex(e, 'x-copy'), framed: upstreamHex(e, 'x-framed') }).toEqual({
          where,
          text,
          name: [utf8Hex(text)],
          copy: [utf8Hex(text)],
          framed: [utf8Hex(`« ${text} » €`)],
        });
      }
    }
  });

  it('rate-limit bucket keys are the text: one bucket per text, its key the UTF-8 text (actions.ngrok.rate_limit.bucket_key, the Redis key)', async () => {
    const id = await rateLimitRoute();
    const send = (value: string) => c.request('/rlu/api', { headers: { 'x-user': value } });
    for (const text of ['José', 'こんにちは 😀']) {
      const r = [await send(bytes(text)), await send(bytes(text)), await send(bytes(text))];
      expect([text, r.map((x) => x.status)]).toEqual([text, [200, 200, 429]]);
      // The rules after the limit see the key as text.
      expect([text, upstreamText(echoOf(r[0]!), 'x-bucket')]).toEqual([text, [JSON.stringify([text])]]);
      // The bucket in Redis is keyed by the text (engine.ts: prefix + JSON of the values).
      const digest = digestKey(`tp:${JSON.stringify([id, 'inbound', 'per-name'])}${JSON.stringify([text])}`);
      const redis = new Redis(redisUrl);
      try {
        const keys: string[] = [];
        let cursor = '0';
        do {
          const [next, found] = await redis.scan(cursor, 'MATCH', redisKeyPattern(`${prefix}-${NAME}-a`), 'COUNT', 1000);
          cursor = next;
          keys.push(...found);
        } while (cursor !== '0');
        expect([text, keys.some((k) => k.endsWith(`:${digest}`))]).toEqual([text, true]);
      } finally {
        redis.disconnect();
      }
    }
    // Latin-1 é (4a 6f 73 e9) is another value: its own bucket.
    expect((await send(rawBytes('Jos', [0xe9]))).status).toBe(200);
  });
});

describe('values a policy writes go out as UTF-8', () => {
  it('add-headers with static values beyond ASCII and beyond U+00FF reach the upstream, and the client, as UTF-8 bytes', async () => {
    const inbound = { 'x-cafe': 'café', 'x-price': '5 €', 'x-greet': 'こんにちは', 'x-emoji': '😀 ok', 'x-tab': 'a\tb' };
    const outbound = { 'x-out-price': '5 €', 'x-out-mix': 'Grüße · こんにちは · 🌍' };
    await c.policyRoute('/static', {
      on_http_request: [{ actions: [{ type: 'add-headers', config: { headers: inbound } }] }],
      on_http_response: [{ actions: [{ type: 'add-headers', config: { headers: outbound } }] }],
    });
    for (const [where, port] of nodes()) {
      const r = await c.request('/static/x', { port });
      const e = echoOf(r);
      // The examples of the spec, byte for byte.
      expect([where, upstreamHex(e, 'x-cafe'), upstreamHex(e, 'x-price'), clientHex(r, 'x-out-price')]).toEqual([where, ['636166c3a9'], ['3520e282ac'], '3520e282ac']);
      for (const [n, v] of Object.entries(inbound)) expect([where, n, upstreamHex(e, n)]).toEqual([where, n, [utf8Hex(v)]]);
      for (const [n, v] of Object.entries(outbound)) expect([where, n, clientHex(r, n), clientText(r, n)]).toEqual([where, n, utf8Hex(v), v]);
    }
  });

  it('an outbound rule reads a non-ASCII response header of the upstream as text and adds one to the client', async () => {
    await c.policyRoute('/out', {
      on_http_response: [
        { expressions: ["'x-up-name' in res.headers && res.headers['x-up-name'][0] == 'Zoë ☕'"], actions: [{ type: 'add-headers', config: { headers: { 'x-seen': 'vu ✓' } } }] },
        {
          expressions: ["size(getResHeader('x-up-name')) > 0"],
          actions: [{ type: 'add-headers', config: { headers: { 'x-up-upper': "${getResHeader('X-Up-Name')[0].upper()}", 'x-up-size': "${size(res.headers['x-up-name'][0])}" } } }],
        },
      ],
    });
    for (const [where, port] of nodes()) {
      const r = await c.request('/out/up-sets-utf8', { port });
      expect(r.status, r.body).toBe(200);
      expect({
        where,
        up: clientHex(r, 'x-up-name'),
        seen: clientText(r, 'x-seen'),
        seenHex: clientHex(r, 'x-seen'),
        upper: clientText(r, 'x-up-upper'),
        upperHex: clientHex(r, 'x-up-upper'),
        size: clientText(r, 'x-up-size'),
      }).toEqual({ where, up: utf8Hex('Zoë ☕'), seen: 'vu ✓', seenHex: utf8Hex('vu ✓'), upper: 'ZOË ☕', upperHex: utf8Hex('ZOË ☕'), size: '5' });

      // The upstream's Latin-1 ë (eb) is not "Zoë ☕"; the header itself passes unchanged.
      const l = await c.request('/out/up-sets-latin1', { port });
      expect({ where, status: l.status, up: clientHex(l, 'x-up-name'), seen: clientText(l, 'x-seen'), size: clientText(l, 'x-up-size') }).toEqual({ where, status: 200, up: '5a6feb', seen: undefined, size: '3' });
    }
  });

  it('custom-response headers with non-ASCII values (static and interpolated) reach the client as UTF-8', async () => {
    await c.policyRoute('/gen', {
      on_http_request: [
        {
          expressions: ["req.path.startsWith('/gen/hello')"],
          actions: [{ type: 'custom-response', config: { status_code: 200, body: "hola ${getReqHeader('x-name')[0]}", headers: { 'x-greeting': 'Grüße 🌍', 'x-hello': "hola ${req.headers['x-name'][0]} ¡", 'content-type': 'text/plain; charset=utf-8' } } }],
        },
      ],
    });
    for (const [where, port] of nodes()) {
      const hello = await c.request('/gen/hello', { port, headers: { 'x-name': bytes('Zoë') } });
      expect({ where, status: hello.status, body: hello.body, greeting: clientHex(hello, 'x-greeting'), hello: clientHex(hello, 'x-hello') }).toEqual({
        where,
        status: 200,
        body: 'hola Zoë',
        greeting: utf8Hex('Grüße 🌍'),
        hello: utf8Hex('hola Zoë ¡'),
      });
    }
  });

  it('redirect headers with non-ASCII values (static and interpolated) reach the client as UTF-8', async () => {
    await c.policyRoute('/rdr', {
      on_http_request: [
        { expressions: ["req.path.startsWith('/rdr/moved')"], actions: [{ type: 'redirect', config: { to: 'https://example.test/new', headers: { 'x-why': 'déplacé → ailleurs', 'x-who': "${getReqHeader('x-name')[0]} ✓" } } }] },
      ],
    });
    for (const [where, port] of nodes()) {
      const moved = await c.request('/rdr/moved', { port, headers: { 'x-name': bytes('Zoë') } });
      expect({ where, status: moved.status, location: moved.headers.location, why: clientText(moved, 'x-why'), whyHex: clientHex(moved, 'x-why'), whoHex: clientHex(moved, 'x-who') }).toEqual({
        where,
        status: 302,
        location: 'https://example.test/new',
        why: 'déplacé → ailleurs',
        whyHex: utf8Hex('déplacé → ailleurs'),
        whoHex: utf8Hex('Zoë ✓'),
      });
    }
  });
});

describe('the API refuses control characters and lone surrogates in policy header values, naming the field', () => {
  // YAML escapes put the characters themselves into the parsed policy (the API body is JSON text without them).
  const cases: Array<[string, string, string]> = [
    ['add-headers, a control character', 'inbound:\n  - actions:\n      - type: add-headers\n        config:\n          headers:\n            x-ok: "5 €"\n            x-a: "a\\x01b"\n', 'inbound[0].actions[0].config.headers.x-a'],
    ['add-headers, DEL', 'inbound:\n  - actions:\n      - type: add-headers\n        config: { headers: { x-del: "caf\\u00e9\\x7f" } }\n', 'inbound[0].actions[0].config.headers.x-del'],
    ['add-headers, LF', 'inbound:\n  - actions:\n      - type: add-headers\n        config: { headers: { x-lf: "a\\nX-Evil: 1" } }\n', 'inbound[0].actions[0].config.headers.x-lf'],
    ['add-headers, NUL', 'inbound:\n  - actions:\n      - type: add-headers\n        config: { headers: { x-nul: "a\\0" } }\n', 'inbound[0].actions[0].config.headers.x-nul'],
    ['add-headers, a lone high surrogate', 'inbound:\n  - actions:\n      - type: add-headers\n        config: { headers: { x-s: "a\\ud800b" } }\n', 'inbound[0].actions[0].config.headers.x-s'],
    ['outbound add-headers, a lone low surrogate', 'outbound:\n  - actions:\n      - type: add-headers\n        config: { headers: { x-s: "\\udc00" } }\n', 'outbound[0].actions[0].config.headers.x-s'],
    ['on_http_response add-headers, ESC', 'on_http_response:\n  - actions:\n      - type: add-headers\n        config: { headers: { x-esc: "\\x1b[31m€" } }\n', 'on_http_response[0].actions[0].config.headers.x-esc'],
    ['custom-response headers', 'inbound:\n  - actions:\n      - type: custom-response\n        config: { status_code: 200, body: ok, headers: { x-c: "こんにちは\\r" } }\n', 'inbound[0].actions[0].config.headers.x-c'],
    ['redirect headers', 'inbound:\n  - actions:\n      - type: redirect\n        config: { to: "https://example.test/", headers: { x-r: "\\x00" } }\n', 'inbound[0].actions[0].config.headers.x-r'],
  ];
  for (const [what, policy, field] of cases) {
    it(what, async () => {
      const r = await c.tryPolicy(policy);
      expect([r.status, r.body?.error_code, r.body?.msg]).toEqual([400, 'ERR_WARREN_6900', `traffic_policy.value: ${field}: ${NOT_ALLOWED}`]);
    });
  }

  it('accepts HTAB and any other Unicode text in the same places', async () => {
    const r = await c.tryPolicy(
      'inbound:\n  - expressions: ["false"]\n    actions:\n      - type: add-headers\n        config: { headers: { x-a: "a\\tb € こんにちは 😀 \\u00a0 \\u2028 \\ufeff" } }\n      - type: redirect\n        config: { to: "https://example.test/", headers: { x-r: "→ ✓" } }\n  - actions:\n      - type: custom-response\n        config: { headers: { x-c: "Grüße 🌍" } }\n',
    );
    expect([r.status, r.body?.msg]).toEqual([201, undefined]);
  });
});

describe('route modules', () => {
  it('request_headers / response_headers accept "5 €" and text beyond the BMP, and send them as UTF-8', async () => {
    await c.route('/mod', {
      request_headers: { add: { 'X-Price': '5 €', 'X-Greet': 'こんにちは 😀', 'X-Cafe': 'café' } },
      response_headers: { add: { 'X-Price': '5 €', 'X-Cafe': 'café Zoë' } },
    });
    for (const [where, port] of nodes()) {
      const r = await c.request('/mod/x', { port });
      const e = echoOf(r);
      expect({ where, price: upstreamHex(e, 'x-price'), greet: upstreamText(e, 'x-greet'), cafe: upstreamHex(e, 'x-cafe') }).toEqual({ where, price: ['3520e282ac'], greet: ['こんにちは 😀'], cafe: ['636166c3a9'] });
      expect({ where, price: clientHex(r, 'x-price'), cafe: clientText(r, 'x-cafe'), cafeHex: clientHex(r, 'x-cafe') }).toEqual({ where, price: '3520e282ac', cafe: 'café Zoë', cafeHex: utf8Hex('café Zoë') });
    }
  });
});

describe('bytes that are not UTF-8: each such byte reads as one character (U+DC00 + the byte) that no text equals, and goes out as the same byte', () => {
  it('in an inbound expression and an interpolation: Latin-1 é (e9), ff and a truncated sequence (c3) match no text; size() counts each byte one; the copy is byte for byte', async () => {
    await c.policyRoute('/fffd', {
      on_http_request: [
        { expressions: ["getReqHeader('X-Name') == ['Jos\uFFFD'] || getReqHeader('X-Name') == ['José'] || getReqHeader('X-Name') == ['Jos']"], actions: [{ type: 'deny', config: { status_code: 451 } }] },
        { actions: [{ type: 'add-headers', config: { headers: { 'x-copy': "${getReqHeader('x-name')[0]}", 'x-size': "${size(getReqHeader('x-name')[0])}", 'x-upper': "${getReqHeader('x-name')[0].upper()}" } } }] },
      ],
    });
    for (const [where, port] of nodes()) {
      for (const [tail, size] of [[[0xe9], '4'], [[0xff], '4'], [[0xc3], '4'], [[0xc3, 0x28], '5'], [[0xf0, 0x9f, 0x98], '6'], [[0xed, 0xa0, 0x80], '6']] as const) {
        const sent = rawBytes('Jos', [...tail]);
        const hex = Buffer.from(sent, 'latin1').toString('hex');
        const e = echoOf(await c.request('/fffd/x', { port, headers: { 'x-name': sent } }));
        // upper() maps the text and, as Go's strings.ToUpper, writes each byte in no UTF-8 sequence as U+FFFD.
        const upper = Buffer.from('JOS' + tail.map((b) => (b === 0x28 ? '(' : '\ufffd')).join('')).toString('hex'); // "(" has no upper case
        expect({ where, tail, name: upstreamHex(e, 'x-name'), copy: upstreamHex(e, 'x-copy'), size: upstreamText(e, 'x-size'), upper: upstreamHex(e, 'x-upper') }).toEqual({ where, tail, name: [hex], copy: [hex], size: [size], upper: [upper] });
      }
      // Valid UTF-8 around a bad byte is text: "é" + ff + "€".
      const mixed = rawBytes('é', [0xff], '€');
      const m = echoOf(await c.request('/fffd/x', { port, headers: { 'x-name': mixed } }));
      expect([where, upstreamHex(m, 'x-copy'), upstreamText(m, 'x-size'), upstreamHex(m, 'x-upper')]).toEqual([where, [Buffer.from(mixed, 'latin1').toString('hex')], ['3'], [Buffer.from('É\ufffd€').toString('hex')]]);
    }
  });

  it('in rate-limit bucket keys: "a" + ff, "a" + fe and "a" + 80 are three buckets', async () => {
    await rateLimitRoute();
    const send = (value: string) => c.request('/rlu/api', { headers: { 'x-user': value } });
    const r = [await send(rawBytes('a', [0xff])), await send(rawBytes('a', [0xfe])), await send(rawBytes('a', [0x80]))];
    expect(r.map((x) => x.status)).toEqual([200, 200, 200]);
    expect([await send(rawBytes('a', [0xff])), await send(rawBytes('a', [0xff]))].map((x) => x.status)).toEqual([200, 429]);
    expect(upstreamText(echoOf(r[0]!), 'x-bucket')).toEqual([JSON.stringify(['a\udcff'])]);
  });

  it('in an outbound rule: the upstream\'s Latin-1 ë (eb) is no text ("Zo\uFFFD", "Zoë"); upper() writes it as U+FFFD, as Go does', async () => {
    await c.policyRoute('/offfd', {
      on_http_response: [
        { expressions: ["getResHeader('x-up-name') == ['Zo\uFFFD'] || getResHeader('x-up-name') == ['Zoë']"], actions: [{ type: 'add-headers', config: { headers: { 'x-replacement': 'matched' } } }] },
        { expressions: ["size(getResHeader('x-up-name')) > 0"], actions: [{ type: 'add-headers', config: { headers: { 'x-up-upper': "${getResHeader('X-Up-Name')[0].upper()}" } } }] },
      ],
    });
    for (const [where, port] of nodes()) {
      const l = await c.request('/offfd/up-sets-latin1', { port });
      expect({ where, up: clientHex(l, 'x-up-name'), replacement: clientText(l, 'x-replacement'), upper: clientHex(l, 'x-up-upper') }).toEqual({ where, up: '5a6feb', replacement: undefined, upper: '5a4fefbfbd' });
    }
  });
});
