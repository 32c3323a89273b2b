import { describe, expect, it } from 'vitest';
import { encodeFrame, FLAG_FIN, FLAG_SYN, FrameDecoder, FrameType, MuxErrorCode, readFrameHeader, writeFrameHeader, type FrameSink } from './frame.js';

type Event = [string, ...unknown[]];

function recorder(): { sink: FrameSink; events: Event[] } {
  const events: Event[] = [];
  let data: Buffer[] = [];
  const sink: FrameSink = {
    onDataStart: (id, flags, len) => {
      data = [];
      events.push(['start', id, flags, len]);
    },
    onDataChunk: (c) => data.push(Buffer.from(c)),
    onDataEnd: () => events.push(['data', Buffer.concat(data).toString()]),
    onRst: (id, code) => events.push(['rst', id, code]),
    onWndInc: (id, inc) => events.push(['wndinc', id, inc]),
    onGoAway: (last, code, msg) => events.push(['goaway', last, code, msg.toString()]),
    onProtocolError: (code, msg) => events.push(['error', code, msg]),
  };
  return { sink, events };
}

const u32 = (n: number) => {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n);
  return b;
};

describe('frame header', () => {
  it('round-trips length, type, flags and a 31-bit stream id', () => {
    const b = Buffer.alloc(8);
    writeFrameHeader(b, 0, 0xabcdef, FrameType.Data, FLAG_SYN | FLAG_FIN, 0x7fffffff);
    expect(readFrameHeader(b)).toEqual({ length: 0xabcdef, type: 1, flags: 3, streamId: 0x7fffffff });
  });

  it('matches the SDK heartbeat opener byte for byte (§2 example)', () => {
    expect(encodeFrame(FrameType.Data, FLAG_SYN, 3, u32(0xffffffff)).toString('hex')).toBe('0000041200000003ffffffff');
  });

  it('masks the reserved top bit of the stream id', () => {
    const b = Buffer.from('0000000180000005', 'hex');
    expect(readFrameHeader(b).streamId).toBe(5);
  });
});

describe('FrameDecoder', () => {
  const wire = Buffer.concat([
    encodeFrame(FrameType.Data, FLAG_SYN, 3, Buffer.from('hello')),
    encodeFrame(FrameType.WndInc, 0, 3, u32(1234)),
    encodeFrame(FrameType.Data, FLAG_FIN, 3),
    encodeFrame(FrameType.Rst, 0, 5, u32(MuxErrorCode.FlowControl)),
  ]);
  const expected: Event[] = [
    ['start', 3, FLAG_SYN, 5],
    ['data', 'hello'],
    ['wndinc', 3, 1234],
    ['start', 3, FLAG_FIN, 0],
    ['data', ''],
    ['rst', 5, MuxErrorCode.FlowControl],
  ];

  it('decodes frames delivered in one chunk', () => {
    const { sink, events } = recorder();
    new FrameDecoder(sink).push(wire);
    expect(events).toEqual(expected);
  });

  it('decodes the same frames split at every byte boundary', () => {
    for (let cut = 1; cut < wire.length; cut++) {
      const { sink, events } = recorder();
      const d = new FrameDecoder(sink);
      d.push(wire.subarray(0, cut));
      d.push(wire.subarray(cut));
      expect(events).toEqual(expected);
    }
    const { sink, events } = recorder();
    const d = new FrameDecoder(sink);
    for (const byte of wire) d.push(Buffer.from([byte]));
    expect(events).toEqual(expected);
  });

  it('treats GOAWAY as final, even with the Rust length quirk (length = message only)', () => {
    const { sink, events } = recorder();
    // Header with length 0, then the 8 fixed bytes that length leaves out.
    const header = Buffer.alloc(8);
    writeFrameHeader(header, 0, 0, FrameType.GoAway, 0, 0);
    const goaway = Buffer.concat([header, u32(7), u32(MuxErrorCode.None)]);
    const d = new FrameDecoder(sink);
    d.push(Buffer.concat([goaway, encodeFrame(FrameType.Data, FLAG_SYN, 9, Buffer.from('ignored'))]));
    expect(events).toEqual([['goaway', 7, 0, '']]);
    expect(d.done).toBe(true);
  });

  it('reports malformed frames once and stops', () => {
    for (const [bad, code] of [
      [encodeFrame(FrameType.Data, 0, 0, Buffer.from('x')), MuxErrorCode.Protocol],
      [encodeFrame(FrameType.Rst, 0, 1, Buffer.alloc(3)), MuxErrorCode.FrameSize],
      [encodeFrame(FrameType.WndInc, 0, 0, u32(1)), MuxErrorCode.Protocol],
      [encodeFrame(9, 0, 1), MuxErrorCode.Protocol],
    ] as const) {
      const { sink, events } = recorder();
      const d = new FrameDecoder(sink);
      d.push(Buffer.concat([bad, encodeFrame(FrameType.Data, FLAG_SYN, 3, Buffer.from('x'))]));
      expect(events).toHaveLength(1);
      expect(events[0]![0]).toBe('error');
      expect(events[0]![1]).toBe(code);
    }
  });
});
