import type http from 'node:http';
import type { Duplex } from 'node:stream';

/**
 * Waits for the responses to earlier requests pipelined on `socket` (RFC 9112 §9.3.2: responses
 * go in request order). Node emits `upgrade` for a request pipelined behind another while the
 * earlier one's response still owns the socket (`_httpMessage`, queued ones after it): an upgrade
 * answered at once went out before that response, or put it inside the upgraded stream; a
 * close-connection lost it. Null when nothing earlier is still being written (the usual case:
 * one property read). `own`: the request's own response, which does not count.
 */
export function earlierResponsesSent(socket: Duplex, own?: http.ServerResponse): Promise<void> | null {
  const current = (socket as { _httpMessage?: http.ServerResponse | null })._httpMessage;
  if (!current || current === own || current.writableFinished || current.destroyed) return null;
  return new Promise<void>((resolve) => {
    const next = () => {
      current.off('finish', next);
      current.off('close', next);
      // The next queued response (if any) is attached when this one finishes.
      const more = earlierResponsesSent(socket, own);
      if (more) void more.then(resolve);
      else resolve();
    };
    current.once('finish', next);
    current.once('close', next);
  });
}

/** The last request of a connection not yet sent upstream (see {@link DispatchTurn}); absent when none is. */
const PENDING = Symbol('warren.dispatchPending');
type PendingSocket = Duplex & { [PENDING]?: DispatchTurn };

/**
 * A request's place in its connection's order of dispatch to the upstream. Node hands pipelined
 * requests over as soon as it parses them, while the earlier ones may still be in their route's
 * stages (a buffered body, a rate-limit check): without this, a request behind one whose body a
 * stage reads reached the upstream first. A request that cannot be sent at once (its stages went
 * asynchronous) takes a turn synchronously, in its `request` event, so every later request of the
 * connection sees it; a later request sends only once every earlier turn is over. The connection
 * holds its last open turn only, so a request with nothing pending pays one property read
 * ({@link dispatchPending}).
 */
export class DispatchTurn {
  private next: DispatchTurn | null = null;
  /** Every earlier request of the connection was sent upstream or ended without being sent. */
  private earlierOver: boolean;
  /** This request was sent upstream or ended without being sent ({@link done}). */
  private own = false;
  private over = false;
  /** Its `go` runs inside an earlier turn's {@link settle} loop, which goes on to the next turns. */
  private inLoop = false;
  private go: (() => void) | null = null;

  /**
   * This request was sent upstream (its head written: `RequestInfo.written`), or ends without being
   * sent (answered, refused, failed): later ones may go. Idempotent; a bound function (made in the
   * constructor: a named arrow field would cost a `__name` defineProperty per turn under tsx).
   */
  readonly done: () => void;

  constructor(private readonly socket: PendingSocket) {
    this.done = () => this.ownDone();
    const prev = socket[PENDING];
    // The connection's last turn is never over (it is removed when it is): `prev` is still open.
    this.earlierOver = prev === undefined;
    if (prev !== undefined) prev.next = this;
    socket[PENDING] = this;
  }

  /** Every earlier request of the connection is sent upstream (or ended without being sent). */
  get earlierSent(): boolean {
    return this.earlierOver;
  }

  /** Runs `go` once every earlier request of the connection is sent (at once when none is pending). */
  whenEarlierSent(go: () => void): void {
    if (this.earlierOver) go();
    else this.go = go;
  }

  private ownDone(): void {
    if (this.own) return;
    this.own = true;
    if (!this.inLoop) this.settle();
  }

  /** Ends this turn and lets the next ones go, in order, as far as they are done (a loop, not a recursion: a client may pipeline thousands). */
  private settle(): void {
    let t: DispatchTurn = this;
    while (!t.over && t.own && t.earlierOver) {
      t.over = true;
      if (t.socket[PENDING] === t) t.socket[PENDING] = undefined;
      const next = t.next;
      if (next === null) return;
      t.next = null;
      next.earlierOver = true;
      const go = next.go;
      if (go !== null) {
        next.go = null;
        next.inLoop = true;
        try {
          go();
        } finally {
          next.inLoop = false;
        }
      }
      t = next;
    }
  }
}

/** True when a request of `socket` is still waiting to be sent upstream: a later one takes a {@link DispatchTurn}. */
export function dispatchPending(socket: Duplex): boolean {
  return (socket as PendingSocket)[PENDING] !== undefined;
}
