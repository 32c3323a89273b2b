import { STATUS_CODES, type IncomingMessage, type ServerResponse } from 'node:http';
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
