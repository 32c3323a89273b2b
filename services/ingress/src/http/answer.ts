import type { Outcome } from '../pipeline/types.js';

/** A stage's own answer (deny, 429, custom response, error page, …). */
export type Answer = Exclude<Outcome, null>;

/**
 * Statuses whose responses have no body (RFC 9110 §6.4.1, §15.3.5, §15.4.5): 1xx, 204 and 304.
 * They are sent without Content-Length too: RFC 9110 §8.6 forbids it on 1xx and 204, and on a
 * 304 it could only state the length of a 200 the ingress does not have.
 */
export function bodilessStatus(status: number): boolean {
  return status < 200 || status === 204 || status === 304;
}

/** Statuses whose answers carry no content: the bodiless ones and 205 Reset Content (RFC 9110 §15.3.6, sent with `Content-Length: 0`). */
export function noContentStatus(status: number): boolean {
  return bodilessStatus(status) || status === 205;
}

/**
 * The head of an answer as raw `[name, value, …]` pairs (an array value is one field per value,
 * as `writeHead` sends it) with `Content-Length`, the length of its body, unless the answer
 * states one; a bodiless status gets none (and any it states is dropped), a 205 `0` (it carries no
 * content, RFC 9110 §15.3.6, whatever body it was given). A HEAD request gets the
 * same head as a GET would, without the body.
 */
export function answerHeaders(out: Answer): string[] {
  const h: string[] = [];
  let length = false;
  const bodiless = bodilessStatus(out.status);
  // 205 Reset Content: no content (RFC 9110 §15.3.6), stated as Content-Length: 0.
  const reset = out.status === 205;
  if (out.headers) {
    for (const name in out.headers) {
      const isLength = name.length === 14 && name.toLowerCase() === 'content-length';
      if (isLength && (bodiless || reset)) continue;
      length ||= isLength;
      const v = out.headers[name]!;
      if (typeof v === 'string') h.push(name, v);
      else for (const one of v) h.push(name, one);
    }
  }
  if (!length && !bodiless) h.push('content-length', reset || out.body === undefined ? '0' : String(Buffer.byteLength(out.body)));
  return h;
}

/**
 * What goes out as the answer's body: nothing for HEAD, a bodiless status or 205. Text as its UTF-8
 * bytes: Node writes a string body given to the head's first write in one string with the head,
 * in the body's encoding, so a header value's bytes 0x80-0xff (a policy's UTF-8 text, one
 * character per byte) would go out encoded a second time.
 */
export function answerBody(out: Answer, method: string | undefined): Buffer | undefined {
  if (method === 'HEAD' || noContentStatus(out.status)) return undefined;
  const b = out.body ?? '';
  return typeof b === 'string' ? Buffer.from(b, 'utf8') : b;
}
