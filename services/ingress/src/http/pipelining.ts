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
