import { PassThrough } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { encodeProxyPrelude, readProxyHeader } from './agent-messages.js';
import { JsonValueScanner, readExactly, readJsonValue, readStreamType, StreamReadError } from './typed.js';

describe('JsonValueScanner', () => {
  it('finds the end of an object without a newline, whatever the chunking', () => {
    const text = '{"Labels":{"edge":"edghts_1","x":"}{\\"]"},"Metadata":"ü{","N":[1,[2,{}]]}';
    const bytes = Buffer.from(text + 'TRAILING');
    for (let cut = 1; cut < bytes.length; cut++) {
      const sc = new JsonValueScanner();
      const first = sc.push(bytes.subarray(0, cut));
      const end = first >= 0 ? first : cut + sc.push(bytes.subarray(cut));
      expect(end).toBe(Buffer.byteLength(text));
    }
  });

  it('refuses a non-object start and values over the size limit', () => {
    expect(() => new JsonValueScanner().push(Buffer.from(' "str"'))).toThrow(StreamReadError);
    const sc = new JsonValueScanner(10);
    expect(() => sc.push(Buffer.from('{"aaaaaaaaaaaaaaa'))).toThrow(/over 10 bytes/);
  });
});

describe('typed stream readers', () => {
  it('reads the type, then one JSON value without FIN, and leaves what follows readable', async () => {
    const s = new PassThrough();
    s.write(Buffer.from([0, 0, 0, 7]));
    s.write('{"Labels":{"a":"b"},');
    const typeP = readStreamType(s);
    expect(await typeP).toBe(7);
    const valueP = readJsonValue(s, { timeoutMs: 1000 });
    s.write('"Metadata":""}\nrest');
    expect(await valueP).toEqual({ Labels: { a: 'b' }, Metadata: '' });
    expect((await readExactly(s, 5)).toString()).toBe('\nrest');
  });

  it('times out and reports EOF', async () => {
    const s = new PassThrough();
    await expect(readJsonValue(s, { timeoutMs: 20 })).rejects.toMatchObject({ code: 'TIMEOUT' });
    s.end('{"a":');
    await expect(readJsonValue(s)).rejects.toMatchObject({ code: 'EOF' });
  });

  it('round-trips a proxy stream prelude (type 3, int64 LE length, all five fields)', async () => {
    const prelude = encodeProxyPrelude({ Id: 'tn_1', ClientAddr: '1.2.3.4:5', Proto: 'https', EdgeType: '3', PassthroughTLS: false });
    expect(prelude.readUInt32BE(0)).toBe(3);
    expect(prelude.readBigInt64LE(4)).toBe(BigInt(prelude.length - 12));
    expect(JSON.parse(prelude.subarray(12).toString())).toEqual({ Id: 'tn_1', ClientAddr: '1.2.3.4:5', Proto: 'https', EdgeType: '3', PassthroughTLS: false });
    const s = new PassThrough();
    s.end(Buffer.concat([prelude, Buffer.from('GET / HTTP/1.1\r\n')]));
    expect(await readStreamType(s)).toBe(3);
    expect(await readProxyHeader(s)).toMatchObject({ Id: 'tn_1', EdgeType: '3' });
    expect((await readExactly(s, 5)).toString()).toBe('GET /');
  });
});
