import { HEADER_TEXT_PROBLEM, HEADER_TEXT_RE, HEADER_TOKEN_RE, headerWire, hostHeaderProblem } from '@warren/shared';
import { removeRawHeaders, setRawHeader } from './common.js';

/**
 * The edit both header modules make on raw `[name, value, …]` pairs: first every header named
 * in `remove` goes (case-insensitively, all its values), then every `add` entry is set,
 * replacing any values a header of that name (case-insensitively) still has. Framing and
 * hop-by-hop headers are never touched (`PROTECTED`): editing them would desynchronise the
 * message from its body or the connection. The control plane refuses these names when a module
 * is written; a module stored before that still has them skipped here.
 *
 * `Host` on requests (ngrok's "Rewrite Host header"): an `add` entry replaces the Host header
 * sent upstream (one Host, never a second); the request was already routed, and X-Forwarded-Host
 * set, on the client's Host (http/proxy.ts publicRequestHeaders), and the events, the rate-limit
 * keys and the policy's `req.host` use the client's too (RequestState.host, req.headers). Its value
 * must be host[:port] (`hostHeaderProblem`). A `remove` entry for it is skipped: HTTP/1.1 requires
 * Host (the control plane refuses it). On responses Host is an ordinary header.
 *
 * `add` values are UTF-8 text (`HEADER_TEXT_RE`), sent as their UTF-8 bytes (`headerWire`), as
 * ngrok sends them: "5 €" goes out as `35 20 e2 82 ac`.
 *
 * An `add` name that is not a token, or an `add` value with a control character (CR, LF, NUL…)
 * or a lone surrogate, would make every request or response of the route throw when it is written.
 * The control plane refuses them; one stored before it did (or pushed by an older control plane)
 * refuses the module here, at compile time: the stage factory throws, so the route answers 503
 * (ERR_WARREN_7010, "this route cannot be served") and the ingress logs the route, as for any
 * stored module it cannot apply (routing.ts). Editing some headers but not others could drop a
 * security header the route relies on, so the route fails closed rather than skip the header.
 * A request Host that is not host[:port] is refused the same way.
 */

const PROTECTED = new Set(['content-length', 'transfer-encoding', 'connection', 'keep-alive', 'upgrade', 'te', 'trailer', 'proxy-connection']);

export interface HeaderEdits {
  remove: ReadonlySet<string>;
  add: ReadonlyArray<readonly [string, string]>;
}

export interface HeadersModule {
  add?: Record<string, string> | null;
  remove?: string[] | null;
}

/** Which message a module edits: on a request, `Host` is rewritten by `add` and never removed. */
export type HeadersDirection = 'request' | 'response';

/**
 * The edits of a stored headers module, or null when it edits nothing. `module` names it in the
 * error thrown for a name or value that cannot be sent (see above).
 */
export function compileHeaderEdits(m: HeadersModule, direction: HeadersDirection, module: string): HeaderEdits | null {
  const request = direction === 'request';
  const removed: string[] = [];
  for (const name of m.remove ?? []) {
    // A name that is not a token matches no header: harmless to remove.
    if (typeof name !== 'string') continue;
    const lower = name.toLowerCase();
    if (PROTECTED.has(lower) || (request && lower === 'host')) continue;
    removed.push(lower);
  }
  const add: Array<readonly [string, string]> = [];
  for (const [name, value] of Object.entries(m.add ?? {})) {
    if (!HEADER_TOKEN_RE.test(name)) throw new Error(`${module}: add: ${JSON.stringify(name.slice(0, 64))} is not a valid header name`);
    const lower = name.toLowerCase();
    if (PROTECTED.has(lower)) continue;
    if (typeof value !== 'string' || !HEADER_TEXT_RE.test(value)) throw new Error(`${module}: add: the value of ${JSON.stringify(name)}: ${HEADER_TEXT_PROBLEM}`);
    if (request && lower === 'host') {
      const problem = hostHeaderProblem(value);
      if (problem) throw new Error(`${module}: add: the Host ${JSON.stringify(value.slice(0, 64))} ${problem}`);
    }
    add.push([name, headerWire(value)]);
  }
  const remove = new Set(removed);
  if (remove.size === 0 && add.length === 0) return null;
  return { remove, add };
}

export function applyHeaderEdits(pairs: string[], e: HeaderEdits): void {
  if (e.remove.size > 0) removeRawHeaders(pairs, e.remove);
  for (const [name, value] of e.add) setRawHeader(pairs, name, value);
}
