import http from 'node:http';
import https from 'node:https';
import tls from 'node:tls';
import type { IncomingHttpHeaders } from 'node:http';
import { promisify } from 'node:util';
import zlib from 'node:zlib';
import type { SendOutcome } from './types.js';
import { deadline, errorText, neverConnected, type Secrets } from './util.js';

const gzip = promisify(zlib.gzip);

/**
 * A small HTTP/1.1 client on node:http(s) for Datadog and Azure, instead of `fetch`:
 * - it knows whether the request was fully handed to the OS ('finish') before a failure,
 *   which decides `unknownOutcome` (fetch cannot tell);
 * - extra CA certificates go into an https.Agent (`undici` is only a transitive dev dependency
 *   here, so production would not have it, and Node 20's fetch cannot take a CA without it);
 * - keep-alive agents, owned by the target and destroyed by close().
 */

export interface Agents {
  http: http.Agent;
  https: https.Agent;
  destroy(): void;
}

/** The TLS context trusting the public roots and `EVENTS_CA_FILE`'s certificates, made once per PEM. */
let caContext: { pem: string; context: tls.SecureContext } | undefined;

/**
 * A context, not `ca`, for the agent: given `ca`, tls.connect builds a new SecureContext for every
 * connection, parsing the ~145 public root certificates each time (tens of ms of CPU, blocking
 * the event loop, on every new connection of every target).
 */
export function trustedContext(caPem: string): tls.SecureContext {
  if (caContext?.pem !== caPem) caContext = { pem: caPem, context: tls.createSecureContext({ ca: [...tls.rootCertificates, caPem] }) };
  return caContext.context;
}

export function createAgents(caPem: string | undefined): Agents {
  const httpAgent = new http.Agent({ keepAlive: true, maxSockets: 16 });
  const httpsAgent = new https.Agent({ keepAlive: true, maxSockets: 16, ...(caPem ? { secureContext: trustedContext(caPem) } : {}) });
  return {
    http: httpAgent,
    https: httpsAgent,
    destroy() {
      httpAgent.destroy();
      httpsAgent.destroy();
    },
  };
}

export interface HttpAnswer {
  status: number;
  headers: IncomingHttpHeaders;
  body: Buffer;
}

/** The request got no (complete) answer. `sent`: the whole request had been handed to the OS. */
export class HttpFailure extends Error {
  constructor(
    message: string,
    readonly sent: boolean,
    readonly timedOut: boolean,
    readonly callerAborted: boolean,
    override readonly cause?: unknown,
  ) {
    super(message);
    this.name = 'HttpFailure';
  }
  /** The request may have been processed. */
  get unknownOutcome(): boolean {
    return this.sent && !neverConnected(this.cause);
  }
}

const MAX_ANSWER_BYTES = 256 * 1024;

export function httpRequest(opts: {
  url: URL;
  method: 'POST' | 'GET';
  headers: Record<string, string>;
  body?: Buffer;
  agents: Agents;
  timeoutMs: number;
  signal?: AbortSignal;
}): Promise<HttpAnswer> {
  const { url, body } = opts;
  const dl = deadline(opts.signal, opts.timeoutMs);
  return new Promise<HttpAnswer>((resolve, reject) => {
    let sent = false;
    let settled = false;
    const fail = (message: string, cause?: unknown) => {
      if (settled) return;
      settled = true;
      dl.done();
      reject(new HttpFailure(message, sent, dl.state.timedOut, dl.state.callerAborted, cause));
    };
    if (dl.signal.aborted) return fail('aborted before sending');
    const isHttps = url.protocol === 'https:';
    const lib = isHttps ? https : http;
    const headers: Record<string, string> = { ...opts.headers };
    if (body) headers['content-length'] = String(body.length);
    let req: http.ClientRequest;
    try {
      req = lib.request(url, { method: opts.method, headers, agent: isHttps ? opts.agents.https : opts.agents.http });
    } catch (err) {
      return fail(`bad request: ${(err as Error).message}`, err);
    }
    const onAbort = () => {
      fail(dl.state.timedOut ? `no answer within ${opts.timeoutMs} ms` : 'aborted');
      req.destroy();
    };
    dl.signal.addEventListener('abort', onAbort, { once: true });
    req.on('finish', () => {
      sent = true;
    });
    req.on('error', (err: NodeJS.ErrnoException) => fail(err.code ? `${err.code}: ${err.message}` : err.message, err));
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      let size = 0;
      res.on('data', (c: Buffer) => {
        if (size < MAX_ANSWER_BYTES) chunks.push(c);
        size += c.length;
      });
      res.on('error', (err) => fail(`answer cut: ${err.message}`, err));
      res.on('aborted', () => fail('answer cut'));
      res.on('end', () => {
        if (settled) return;
        settled = true;
        dl.done();
        dl.signal.removeEventListener('abort', onAbort);
        resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) });
      });
    });
    req.end(body);
  });
}

/**
 * POSTs `entries` (JSON texts) as one gzipped JSON array, the body HTTP intakes take (Datadog,
 * Azure). No answer (timeout, reset, refused, aborted) becomes a `retry` outcome, with
 * `unknownOutcome` when the request may have been processed; the reason never holds a secret.
 */
export async function postGzipJsonArray(o: {
  url: URL;
  headers: Record<string, string>;
  entries: string[];
  agents: Agents;
  timeoutMs: number;
  signal?: AbortSignal;
  what: string;
  secrets: Secrets;
}): Promise<HttpAnswer | { outcome: SendOutcome }> {
  const body = await gzip(Buffer.from(`[${o.entries.join(',')}]`, 'utf8'));
  try {
    return await httpRequest({
      url: o.url,
      method: 'POST',
      headers: { ...o.headers, 'content-type': 'application/json', 'content-encoding': 'gzip' },
      body,
      agents: o.agents,
      timeoutMs: o.timeoutMs,
      ...(o.signal ? { signal: o.signal } : {}),
    });
  } catch (err) {
    if (err instanceof HttpFailure) {
      const why = err.callerAborted ? 'aborted' : err.timedOut ? `no answer within ${o.timeoutMs} ms` : err.message;
      return { outcome: { kind: 'retry', reason: o.secrets.scrub(`${o.what}: ${why}`), unknownOutcome: err.unknownOutcome } };
    }
    return { outcome: { kind: 'retry', reason: o.secrets.scrub(`${o.what}: ${errorText(err)}`), unknownOutcome: false } };
  }
}
