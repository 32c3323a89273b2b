import type http from 'node:http';

/** A response read whole, as the e2e tests of the public listeners check it. */
export interface Res {
  status: number;
  headers: http.IncomingHttpHeaders;
  text: string;
  /** The negotiated TLS version (HTTPS only). */
  protocol?: string | null;
}

/** Reads `res` to its end, then resolves with status, headers and body (and `protocol` when given). */
export function collect(res: http.IncomingMessage, resolve: (r: Res) => void, protocol?: string | null): void {
  const chunks: Buffer[] = [];
  res.on('data', (c: Buffer) => chunks.push(c));
  res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, text: Buffer.concat(chunks).toString(), protocol }));
}
