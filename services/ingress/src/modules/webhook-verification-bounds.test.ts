import { createHmac, randomBytes } from 'node:crypto';
import { gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import type { Outcome } from '../pipeline/types.js';
import { MAX_BUFFERED_BODY } from '../pipeline/runner.js';
import { createWebhookVerificationStage, MAX_INFLATED_BODY, MAX_SORTED_FORM_FIELDS } from './webhook-verification.js';
import { makeState, seededRandom as rng, stageFor } from './testing.js';

/**
 * What an unsigned request can make the ingress do before a signature is compared: bounded
 * (Airship's gzip, Mailgun's form, Hygraph's escaped envelope), while signed requests still pass.
 */
const NOW = 1_700_000_000_000;
const nowS = String(NOW / 1000);
const factory = createWebhookVerificationStage({ now: () => NOW });

async function run(provider: string, secret: string, headers: string[], body: string | Buffer): Promise<Outcome> {
  const stage = stageFor(factory, { webhook_verification: { enabled: true, provider, secret } })!;
  return stage.onRequest!(makeState({ method: 'POST', url: '/hook', scheme: 'https', headers: ['Host', 'hooks.example.test', ...headers], body }));
}

function expectDenied(out: Outcome, reason: RegExp) {
  expect(out).not.toBeNull();
  expect(out!.status).toBe(403);
  expect(out!.headers!['warren-error-code']).toBe('ERR_WARREN_7102');
  expect(String(out!.body)).toMatch(reason);
}

describe('airship: gzip bodies are inflated to at most the body bound', () => {
  const secret = 'ua-secret';
  const sign = (json: Buffer | string) => createHmac('sha256', secret).update(`${nowS}:`).update(json).digest('hex');
  const headers = (sig: string) => ['Content-Type', 'application/json', 'Content-Encoding', 'gzip', 'X-UA-Timestamp', nowS, 'X-UA-Signature', sig];

  it('bounds the inflated size to the buffered-body bound', () => {
    expect(MAX_INFLATED_BODY).toBe(MAX_BUFFERED_BODY);
    expect(MAX_INFLATED_BODY).toBe(1024 * 1024);
  });

  it('refuses a gzip body that inflates past it (a 16 KiB bomb), signed or not', async () => {
    const inflated = Buffer.alloc(16 * 1024 * 1024 - 1, 0x20);
    const bomb = gzipSync(inflated, { level: 9 });
    expect(bomb.length).toBeLessThan(64 * 1024);
    expectDenied(await run('airship', secret, headers('00'.repeat(32)), bomb), /inflates to more than 1048576 bytes/);
    // Even signed by the secret: what was signed cannot be checked within the bound.
    expectDenied(await run('airship', secret, headers(sign(inflated)), bomb), /inflates to more than 1048576 bytes/);
    const justOver = Buffer.alloc(MAX_INFLATED_BODY + 1, 0x20);
    expectDenied(await run('airship', secret, headers(sign(justOver)), gzipSync(justOver)), /inflates to more than/);
  });

  it('does not inflate for a signature that is not a hex SHA-256 MAC', async () => {
    const bomb = gzipSync(Buffer.alloc(16 * 1024 * 1024 - 1, 0x20), { level: 9 });
    for (const sig of ['00', 'zz'.repeat(32), '00'.repeat(33)]) expectDenied(await run('airship', secret, headers(sig), bomb), /X-UA-Signature does not match/);
  });

  it('still verifies signed gzip bodies up to the bound, and refuses undecodable ones', async () => {
    const json = JSON.stringify({ type: 'OPEN', data: 'x'.repeat(2000) });
    expect(await run('airship', secret, headers(sign(json)), gzipSync(json))).toBeNull();
    const atBound = Buffer.alloc(MAX_INFLATED_BODY, 0x20);
    atBound.write('{"a":1}');
    expect(await run('airship', secret, headers(sign(atBound)), gzipSync(atBound))).toBeNull();
    // Signed over the bytes as sent (not gzip at all): as before, those bytes are what is checked.
    expect(await run('airship', secret, headers(sign(json)), json)).toBeNull();
    expectDenied(await run('airship', secret, headers(sign(json)), Buffer.from('not gzip')), /could not be decoded/);
    expectDenied(await run('airship', secret, headers(sign('{}')), gzipSync(json)), /X-UA-Signature does not match/);
  });
});

describe('mailgun: form bodies', () => {
  const secret = 'mg-key';
  const sign = (ts: string, token: string) => createHmac('sha256', secret).update(ts).update(token).digest('hex');
  const form = ['Content-Type', 'application/x-www-form-urlencoded'];

  it('refuses more fields than MAX_SORTED_FORM_FIELDS before reading them, signed or not', async () => {
    const fields = `timestamp=${nowS}&token=tok&signature=${sign(nowS, 'tok')}`;
    expect(await run('mailgun', secret, form, `${fields}${'&a=1'.repeat(MAX_SORTED_FORM_FIELDS - 3)}`)).toBeNull();
    expectDenied(await run('mailgun', secret, form, `${fields}${'&a=1'.repeat(MAX_SORTED_FORM_FIELDS)}`), /more than 1000 fields/);
    expectDenied(await run('mailgun', secret, form, 'a&'.repeat(512 * 1024)), /more than 1000 fields/);
  });

  it('decodes only the signed fields: a long one is refused, long others are not decoded', async () => {
    const fields = `timestamp=${nowS}&token=tok&signature=${sign(nowS, 'tok')}`;
    // One field of 1 MiB of `+` (~90 ms for URLSearchParams to decode) beside the signed ones.
    expect(await run('mailgun', secret, form, `${fields}&body-plain=${'+'.repeat(1024 * 1024 - 200)}`)).toBeNull();
    expect(await run('mailgun', secret, form, `${'+'.repeat(1024 * 1024 - 200)}=1&${fields}`)).toBeNull();
    // Names are looked for no further than a signed field's name could reach (not to a far `=`).
    expect(await run('mailgun', secret, form, `${fields}&${'a&'.repeat(990)}${'x'.repeat(1024 * 1024 - 4000)}=1`)).toBeNull();
    const longToken = '+'.repeat(1025);
    expectDenied(await run('mailgun', secret, form, `timestamp=${nowS}&token=${longToken}&signature=${sign(nowS, ' '.repeat(1025))}`), /form field token is longer/);
    // Only the first of a repeated field counts, as URLSearchParams.get reads it.
    expect(await run('mailgun', secret, form, `${fields}&token=other&signature=00`)).toBeNull();
    expectDenied(await run('mailgun', secret, form, `token=other&${fields}`), /does not match/);
  });

  it('reads the signed fields as URLSearchParams does (differential)', async () => {
    const r = rng(0x6d61696c);
    const encodeChar = (ch: string): string => {
      const mode = r.int(4);
      if (ch === ' ' && mode === 0) return '+';
      if (mode === 1 || /[&=+%#?]/.test(ch)) return encodeURIComponent(ch).replace(/%[0-9A-F]{2}/g, (e) => (r.int(2) ? e : e.toLowerCase()));
      return ch;
    };
    const encode = (s: string) => [...s].map(encodeChar).join('');
    const alphabet = ['a', 'Z', '0', ' ', '+', '&', '=', '%', '?', 'é', '€', '😀', '\u0000', '~', '.'];
    const junk = () => {
      const options = ['', '&', '%zz', '%', '%e9', '=', '==', '+', 'x=%ff', 'x=%C3', 'timestamp', 'tok%65n', '%74oken=junk', `a=${'%41'.repeat(r.int(5))}`];
      return Array.from({ length: r.int(4) }, () => r.pick(options)).join('&');
    };
    let verified = 0;
    for (let i = 0; i < 300; i++) {
      const token = Array.from({ length: 1 + r.int(20) }, () => r.pick(alphabet)).join('');
      const ts = r.int(5) === 0 ? `0${nowS}` : nowS;
      const sig = r.int(6) === 0 ? '00' : sign(ts, token);
      const named: Array<[string, string]> = [['timestamp', ts], ['token', token], ['signature', sig]];
      const parts = named.map(([k, v]) => `${encode(k)}=${encode(v)}`);
      for (let j = parts.length - 1; j > 0; j--) {
        const k = r.int(j + 1);
        [parts[j], parts[k]] = [parts[k]!, parts[j]!];
      }
      let body = parts.map((p) => `${junk()}&${p}`).join('&') + (r.int(2) ? `&${junk()}` : '');
      if (r.int(8) === 0) body = `?${body}`;
      // What the previous implementation (URLSearchParams over the whole body) decided.
      const f = new URLSearchParams(Buffer.from(body).toString('utf8'));
      const [t, k, s] = [f.get('timestamp'), f.get('token'), f.get('signature')];
      const expected = t !== null && k !== null && !!s && /^\d{1,12}$/.test(t) && Math.abs(Number(t) * 1000 - NOW) <= 300_000 && s === sign(t, k);
      const out = await run('mailgun', secret, form, body);
      expect(out === null, body).toBe(expected);
      if (expected) verified++;
    }
    expect(verified).toBeGreaterThan(100);
  });
});

describe('graphcms (Hygraph): the escaped envelope is hashed as it is written', () => {
  const secret = 'gcms-secret';
  /** The signed text as hygraph-utils writes it, built whole (the previous implementation). */
  const signWhole = (body: Buffer, env: string, t: number) => {
    const text = JSON.stringify({ Body: body.toString('utf8'), EnvironmentName: env, TimeStamp: t }).split('&').join('\\\\u0026').split('<').join('\\\\u003c').split('>').join('\\\\u003e');
    return createHmac('sha256', secret).update(text).digest('base64');
  };
  const header = (sign: string, env = 'master', t = NOW) => ['Content-Type', 'application/json', 'gcms-signature', `sign=${sign}, env=${env}, t=${t}`];

  it('verifies a correctly signed 1 MiB body of `<` (7 MiB once escaped), refuses a wrong one', async () => {
    const body = Buffer.alloc(MAX_BUFFERED_BODY, '<');
    expect(await run('graphcms', secret, header(signWhole(body, 'master', NOW)), body)).toBeNull();
    expectDenied(await run('graphcms', secret, header(Buffer.alloc(32).toString('base64')), body), /gcms-signature does not match/);
    body[body.length - 1] = 0x3e;
    expectDenied(await run('graphcms', secret, header(signWhole(Buffer.alloc(MAX_BUFFERED_BODY, '<'), 'master', NOW)), body), /does not match/);
  });

  it('hashes nothing for a sign= that is not a base64 SHA-256 MAC', async () => {
    const body = Buffer.alloc(1024, '<');
    for (const sign of ['AAAA', Buffer.alloc(31).toString('base64'), Buffer.alloc(33).toString('base64'), '!!!!']) {
      expectDenied(await run('graphcms', secret, header(sign), body), /gcms-signature does not match/);
    }
  });

  it('signs the same text as JSON.stringify and the HTML escapes (differential)', async () => {
    const r = rng(0x68796772);
    const pieces = ['<', '>', '&', '"', '\\', '\n', '\r', '\t', '\b', '\f', '\u0000', '\u001f', '\u007f', '\u2028', 'é', '€', '😀', 'a', ' ', '/', '{"k":"v"}', '<p>x &amp; y</p>'];
    const raw = [Buffer.from([0xff]), Buffer.from([0xc3]), Buffer.from([0xed, 0xa0, 0x80]), Buffer.from([0xf0, 0x9f, 0x98]), Buffer.from([0xe2, 0x82]), Buffer.from([0xef, 0xbb, 0xbf])];
    for (let i = 0; i < 200; i++) {
      const parts: Buffer[] = [];
      const n = r.int(40);
      for (let j = 0; j < n; j++) parts.push(r.int(5) === 0 ? r.pick(raw) : Buffer.from(r.pick(pieces)));
      if (r.int(10) === 0) parts.push(randomBytes(r.int(200)));
      // Long runs across the 64 KiB gathering buffer.
      if (r.int(10) === 0) parts.push(Buffer.alloc(70_000 + r.int(1000), r.pick(['<', 'a', '"', 'é'])));
      const body = Buffer.concat(parts);
      const env = r.pick(['master', 'dev<&>', 'é"env', '']);
      const t = NOW - r.int(1000);
      expect(await run('graphcms', secret, header(signWhole(body, env, t), env, t), body), body.toString('hex').slice(0, 200)).toBeNull();
    }
  });
});
