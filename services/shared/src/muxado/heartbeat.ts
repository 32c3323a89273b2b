import { randomBytes } from 'node:crypto';
import type { MuxSession } from './session.js';
import type { MuxStream } from './stream.js';
import { encodeStreamType, StreamType } from './typed.js';

/**
 * Heartbeats (agent-protocol.md §3 Heartbeat): either side may open a stream of type
 * 0xFFFFFFFF and write 4 random bytes every interval; the acceptor echoes them.
 *
 * Never FIN a heartbeat stream while the session lives: the SDK's responder treats end of
 * stream as "echo nothing" in a tight loop. Streams are reset or die with the session.
 */

/**
 * Echoes every complete 4-byte beat on an accepted heartbeat stream (whose type was already
 * read) and calls `onBeat` for each. Honours backpressure: a peer that does not read our echoes
 * stops being read, so nothing piles up.
 */
export function answerHeartbeats(stream: MuxStream, onBeat: () => void): void {
  let partial: Buffer | null = null;
  stream.on('data', (chunk: Buffer) => {
    let data = partial ? Buffer.concat([partial, chunk]) : chunk;
    partial = null;
    const whole = data.length - (data.length % 4);
    if (whole < data.length) partial = Buffer.from(data.subarray(whole));
    if (whole === 0) return;
    data = data.subarray(0, whole);
    for (let i = 0; i < whole; i += 4) onBeat();
    if (!stream.write(data)) {
      stream.pause();
      stream.once('drain', () => stream.resume());
    }
  });
}

export interface HeartbeatOptions {
  intervalMs: number;
  /** Beat once right away (as the SDK does) instead of after the first interval. */
  immediate?: boolean;
  /** Each echoed beat, with its round-trip time. */
  onBeat(latencyMs: number): void;
}

/**
 * Sends our own heartbeats on a stream it opens: 4 random bytes per interval, one beat in flight
 * at a time; a matching echo calls `onBeat`. Liveness decisions (interval + tolerance) are left
 * to the caller, who also hears of echoes on the other side's heartbeat stream.
 *
 * Beats are numbered: `sent` counts the beats written, `echoed` those echoed, in order (one is in
 * flight at a time, so beat k has come back once `echoed >= k`). An echo proves the peer has
 * processed everything we sent before that beat, and has been scheduled since: `probe()` sends
 * extra beats for callers that need that proof (see AgentConnection's stream slots).
 */
export class HeartbeatSender {
  private readonly stream: MuxStream;
  private readonly timer: NodeJS.Timeout;
  private inFlight: { id: Buffer; at: number } | null = null;
  private received: Buffer = Buffer.alloc(0);
  private stopped = false;
  private sentBeats = 0;
  private echoedBeats = 0;
  private probeWanted = false;

  constructor(session: MuxSession, private readonly opts: HeartbeatOptions) {
    this.stream = session.open();
    this.stream.write(encodeStreamType(StreamType.Heartbeat));
    this.stream.on('data', (chunk: Buffer) => this.onEcho(chunk));
    this.stream.on('close', () => this.stop());
    this.timer = setInterval(() => this.beat(), opts.intervalMs);
    this.timer.unref();
    if (opts.immediate) this.beat();
  }

  /** The heartbeat stream itself. */
  get streamRef(): MuxStream {
    return this.stream;
  }

  /** True while our heartbeat stream is open (it counts as one of the session's streams). */
  get active(): boolean {
    return !this.stopped && !this.stream.destroyed;
  }

  /** Beats written so far. */
  get sent(): number {
    return this.sentBeats;
  }

  /** Beats echoed so far. */
  get echoed(): number {
    return this.echoedBeats;
  }

  /** Sends a beat now, or right after the echo of the one in flight (at most one more). */
  probe(): void {
    if (this.stopped) return;
    if (this.inFlight) this.probeWanted = true;
    else this.beat();
  }

  stop(): void {
    if (this.stopped) return;
    this.stopped = true;
    clearInterval(this.timer);
    if (!this.stream.destroyed) this.stream.destroy();
  }

  private beat(): void {
    if (this.stopped || this.inFlight) return;
    const id = randomBytes(4);
    this.inFlight = { id, at: performance.now() };
    this.sentBeats++;
    this.stream.write(id);
  }

  private onEcho(chunk: Buffer): void {
    this.received = this.received.length ? Buffer.concat([this.received, chunk]) : chunk;
    while (this.received.length >= 4) {
      const echo = this.received.subarray(0, 4);
      this.received = this.received.subarray(4);
      const beat = this.inFlight;
      if (!beat || !echo.equals(beat.id)) continue; // unsolicited or stale: ignore
      this.inFlight = null;
      this.echoedBeats++;
      const again = this.probeWanted;
      this.probeWanted = false;
      this.opts.onBeat(performance.now() - beat.at);
      if (again) this.beat(); // unless onBeat already sent one
    }
  }
}

/**
 * Calls `onDead` once `beat()` has not been called for `limitMs` (interval + tolerance). The
 * verdict is taken in the check phase (setImmediate) after the timer fires, so beats already
 * waiting on the socket when the event loop was stalled are counted first: a long GC pause or
 * CPU burst does not kill a healthy session.
 */
export class LivenessTimer {
  private last = performance.now();
  private timer: NodeJS.Timeout | null = null;
  private stopped = false;

  constructor(
    private limitMs: number,
    private readonly onDead: () => void,
  ) {
    this.arm(limitMs);
  }

  beat(): void {
    this.last = performance.now();
  }

  /** Changes the limit and counts from now. */
  reset(limitMs: number): void {
    if (this.stopped) return;
    this.limitMs = limitMs;
    this.last = performance.now();
    this.arm(limitMs);
  }

  stop(): void {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  private arm(ms: number): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = setTimeout(() => setImmediate(() => this.check()), Math.max(1, ms));
    this.timer.unref();
  }

  private check(): void {
    if (this.stopped) return;
    const idle = performance.now() - this.last;
    if (idle < this.limitMs) {
      this.arm(this.limitMs - idle);
      return;
    }
    this.stop();
    this.onDead();
  }
}
