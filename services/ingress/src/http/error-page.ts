import { STATUS_CODES, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { ERRORS, errorCodeName, type ErrorCode } from '@warren/shared';

function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

/** Codes whose answer says when to try again, whichever path answers them. */
const RETRY_AFTER: Partial<Record<ErrorCode, string>> = {
  // The client holds its share of the tunnel's session (MAX_STREAMS_PER_CLIENT): slots come back as its requests finish.
  7014: '1',
};

/** The body and head of the ingress's own answer: HTML for browsers, JSON for everything else; never cached. */
export function errorAnswer(accept: string | undefined, code: ErrorCode, detail?: string, headers?: Record<string, string>): { status: number; headers: Record<string, string>; body: string } {
  const { status, msg } = ERRORS[code];
  const name = errorCodeName(code);
  const message = detail ?? msg;
  const html = (accept ?? '').includes('text/html');
  const body = html
    ? `<!doctype html><html><head><meta charset="utf-8"><title>${status} ${name}</title></head><body><h1>${status}</h1><p>${escapeHtml(message)}</p><p><code>${name}</code></p></body></html>\n`
    : `${JSON.stringify({ error_code: name, status_code: status, msg: message })}\n`;
  const retryAfter = RETRY_AFTER[code];
  const base: Record<string, string> = { 'content-type': html ? 'text/html; charset=utf-8' : 'application/json', 'cache-control': 'no-store', 'warren-error-code': name };
  if (retryAfter !== undefined) base['retry-after'] = retryAfter;
  return { status, headers: { ...base, ...headers }, body };
}

/**
 * The ingress's own answer when it cannot carry a request: the right status, a `Warren-Error-Code`
 * header, and a small HTML page for browsers or JSON for everything else. Never cached.
 */
export function sendError(req: IncomingMessage, res: ServerResponse, code: ErrorCode, detail?: string, headers?: Record<string, string>): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const a = errorAnswer(req.headers.accept, code, detail, headers);
  res.writeHead(a.status, { ...a.headers, 'content-length': Buffer.byteLength(a.body) });
  res.end(req.method === 'HEAD' ? undefined : a.body);
}

/** The same answer (JSON) written raw on a socket whose request asked for an upgrade, then closed. */
export function sendUpgradeError(socket: Duplex, code: ErrorCode, detail?: string): void {
  if (!socket.writable) {
    socket.destroy();
    return;
  }
  const a = errorAnswer(undefined, code, detail);
  let head = `HTTP/1.1 ${a.status} ${STATUS_CODES[a.status] ?? ''}\r\n`;
  for (const [k, v] of Object.entries(a.headers)) head += `${k}: ${v}\r\n`;
  socket.end(`${head}content-length: ${Buffer.byteLength(a.body)}\r\nconnection: close\r\n\r\n${a.body}`);
}

/**
 * A public server's `clientError` (a request Node's parser refused: a control character in a
 * header value, a raw 0xff in the target, a head over the size limit, a head that did not arrive
 * in time): answered as Node's default handler would, when nothing was written on the socket yet
 * and it can still be written, then destroyed. 400 is the ingress's JSON `ERR_WARREN_7011` answer
 * (the request cannot be forwarded as it is), a request timeout 408 `ERR_WARREN_7012`, a head too
 * large 431 (no Warren code), each with `Connection: close`. A reset or broken pipe is only
 * destroyed.
 */
export function answerClientError(err: Error & { code?: string }, socket: Duplex): void {
  const code = err?.code;
  const s = socket as Duplex & { bytesWritten?: number };
  if (code !== 'ECONNRESET' && code !== 'EPIPE' && s.writable && !s.destroyed && (s.bytesWritten ?? 0) === 0) {
    let status: number;
    let headers: Record<string, string>;
    let body: string;
    if (code === 'HPE_HEADER_OVERFLOW') {
      status = 431;
      headers = { 'content-type': 'application/json', 'cache-control': 'no-store' };
      body = `${JSON.stringify({ status_code: 431, msg: 'the request head is too large' })}\n`;
    } else {
      const a = code === 'ERR_HTTP_REQUEST_TIMEOUT' ? errorAnswer(undefined, 7012, 'the request did not arrive in time') : errorAnswer(undefined, 7011, 'the request is not valid HTTP/1.1');
      ({ status, headers, body } = a);
    }
    let head = `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? ''}\r\n`;
    for (const [k, v] of Object.entries(headers)) head += `${k}: ${v}\r\n`;
    try {
      s.write(`${head}content-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
      // Closed once the answer is flushed (a bare destroy could cut it off on a TLS socket).
      const soon = (s as Duplex & { destroySoon?: () => void }).destroySoon;
      if (typeof soon === 'function') {
        soon.call(s);
        setTimeout(() => s.destroy(), 5_000).unref();
        return;
      }
    } catch {
      // The socket went away meanwhile: nothing to answer.
    }
  }
  socket.destroy();
}
