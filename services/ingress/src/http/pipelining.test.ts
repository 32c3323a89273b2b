import { PassThrough } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { DispatchTurn, dispatchPending } from './pipelining.js';

describe('DispatchTurn', () => {
  it('nothing pending: a connection without turns, and a lone turn goes at once', () => {
    const socket = new PassThrough();
    expect(dispatchPending(socket)).toBe(false);
    const t = new DispatchTurn(socket);
    expect(dispatchPending(socket)).toBe(true);
    expect(t.earlierSent).toBe(true);
    const ran: string[] = [];
    t.whenEarlierSent(() => ran.push('t'));
    expect(ran).toEqual(['t']);
    t.done();
    expect(dispatchPending(socket)).toBe(false);
  });

  it('later turns go in order, each once the earlier ones are done, whatever order they finish their stages in', () => {
    const socket = new PassThrough();
    const ran: string[] = [];
    const a = new DispatchTurn(socket);
    const b = new DispatchTurn(socket);
    const c = new DispatchTurn(socket);
    // c and b are ready before a.
    c.whenEarlierSent(() => {
      ran.push('c');
      c.done();
    });
    b.whenEarlierSent(() => {
      ran.push('b');
      b.done();
    });
    expect(ran).toEqual([]);
    a.whenEarlierSent(() => ran.push('a'));
    expect(ran).toEqual(['a']);
    expect(dispatchPending(socket)).toBe(true);
    a.done();
    expect(ran).toEqual(['a', 'b', 'c']);
    expect(dispatchPending(socket)).toBe(false);
    a.done(); // idempotent
    expect(ran).toEqual(['a', 'b', 'c']);
  });

  it('a turn that ends without being sent (answered by its stages) lets the later ones go only after the earlier ones', () => {
    const socket = new PassThrough();
    const ran: string[] = [];
    const a = new DispatchTurn(socket);
    const b = new DispatchTurn(socket);
    b.done(); // denied: never sent
    const c = new DispatchTurn(socket);
    c.whenEarlierSent(() => ran.push('c'));
    expect(ran).toEqual([]);
    a.done();
    expect(ran).toEqual(['c']);
    expect(dispatchPending(socket)).toBe(true); // c's head is not written yet
    c.done();
    expect(dispatchPending(socket)).toBe(false);
  });

  it('a request arriving after every earlier turn is done goes at once, and the connection holds nothing', () => {
    const socket = new PassThrough();
    const a = new DispatchTurn(socket);
    const b = new DispatchTurn(socket);
    a.done();
    b.done();
    expect(dispatchPending(socket)).toBe(false);
    expect(new DispatchTurn(socket).earlierSent).toBe(true);
  });

  it('thousands of pipelined requests settle in a loop, not a recursion', () => {
    const socket = new PassThrough();
    const first = new DispatchTurn(socket);
    let ran = 0;
    for (let i = 0; i < 100_000; i++) {
      const t = new DispatchTurn(socket);
      t.whenEarlierSent(() => {
        ran++;
        t.done();
      });
    }
    first.done();
    expect(ran).toBe(100_000);
    expect(dispatchPending(socket)).toBe(false);
  });
});
