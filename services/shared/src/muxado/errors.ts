import { MuxErrorCode, muxErrorCodeName } from './frame.js';

/**
 * Why a stream or session operation failed:
 * - `STREAM_CAP`: the session is at its cap of concurrently open streams;
 * - `STREAMS_EXHAUSTED`: no stream ids are left (2^31);
 * - `SESSION_CLOSED`: the session is gone (closed, GOAWAY, transport error);
 * - `STREAM_RESET`: the peer reset the stream (`muxCode` tells why);
 * - `STREAM_ABORTED`: we reset the stream ourselves (flow-control or protocol violation);
 * - `WRITE_AFTER_FIN`: the peer sent data after its FIN.
 */
export type MuxErrorKind = 'STREAM_CAP' | 'STREAMS_EXHAUSTED' | 'SESSION_CLOSED' | 'STREAM_RESET' | 'STREAM_ABORTED' | 'WRITE_AFTER_FIN';

export class MuxError extends Error {
  readonly code: MuxErrorKind;
  /** The muxado error code on the wire (RST / GOAWAY), when one applies. */
  readonly muxCode: number;

  constructor(code: MuxErrorKind, message: string, muxCode: number = MuxErrorCode.None) {
    super(message);
    this.name = 'MuxError';
    this.code = code;
    this.muxCode = muxCode;
  }

  static reset(code: number): MuxError {
    return new MuxError('STREAM_RESET', `stream reset by peer (${muxErrorCodeName(code)})`, code);
  }
}
