import type http from 'node:http';
import type { Duplex } from 'node:stream';
import { ERRORS, errorCodeName, type ErrorCode } from '@warren/shared';

function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

/** The body and head of the ingress's own answer: HTML for browsers, JSON for everything else; never cached. */
export function errorAnswer(accept: string | undefined, code: ErrorCode, detail?: string, headers?: Record<string, string>): { status: number; headers: Record<string, string>; body: string } {
  const { status, msg } = ERRORS[code];
  const name = errorCodeName(code);
  const message = detail ?? msg;
  const html = (accept ?? '').includes('text/html');
  const body = html
    ? `<!doctype html><html><head><meta charset="utf-8"><title>${status} ${name}</title></head><body><h1>${status}</h1><p>${escapeHtml(message)}</p><p><code>${name}</code></p></body></html>\n`
    : `${JSON.stringify({ error_code: name, status_code: status, msg: message })}\n`;
  return { status, headers: { 'content-type': html ? 'text/html; charset=utf-8' : 'application/json', 'cache-control': 'no-store', 'warren-error-code': name, ...headers }, body };
}

/**
 * The ingress's own answer when it cannot carry a request: the right status, a `Warren-Error-Code`
 * header, and a small HTML page for browsers or JSON for everything else. Never cached.
 */
export function sendError(req: http.IncomingMessage, res: http.ServerResponse, code: ErrorCode, detail?: string, headers?: Record<string, string>): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const a = errorAnswer(req.headers.accept, code, detail, headers);
  res.writeHead(a.status, { ...a.headers, 'content-length': Buffer.byteLength(a.body) });
  res.end(req.method === 'HEAD' ? undefined : a.body);
}

/** The same answer written raw on a socket whose request asked for an upgrade, then closed. */
export function sendUpgradeError(socket: Duplex, code: ErrorCode, detail?: string): void {
  const { status, msg } = ERRORS[code];
  const body = `${JSON.stringify({ error_code: errorCodeName(code), status_code: status, msg: detail ?? msg })}\n`;
  if (!socket.writable) {
    socket.destroy();
    return;
  }
  socket.end(
    `HTTP/1.1 ${status} ${status === 404 ? 'Not Found' : status === 400 ? 'Bad Request' : status === 502 ? 'Bad Gateway' : status === 504 ? 'Gateway Timeout' : 'Service Unavailable'}\r\n` +
      `content-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nwarren-error-code: ${errorCodeName(code)}\r\nconnection: close\r\n\r\n${body}`,
  );
}
