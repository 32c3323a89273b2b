import dns from 'node:dns';
import type { LookupAddress } from 'node:dns';
import { Agent, buildConnector, fetch as undiciFetch } from 'undici';
import { isNonPublicAddress, nonPublicHostRefusal } from '@warren/shared';

/**
 * Outbound requests to tenant-supplied hosts (SSRF guard): JWK set URLs of `jwt-validation`
 * (`jwt-action.ts`) and OpenID providers of the `oidc` route module and the `openid-connect`
 * action (`modules/oidc-discovery.ts`: discovery, and every request openid-client then makes —
 * token, userinfo, JWKS — whatever hosts the discovery document names).
 *
 * Unless the operator's switch allows it (`WARREN_JWKS_ALLOW_PRIVATE=1`,
 * `WARREN_OIDC_ALLOW_PRIVATE=1`), a connection is refused when its host is `localhost` (or
 * `*.localhost`) or a literal non-public address, or when the name resolves to any non-public
 * address. The check runs where the socket is opened (the lookup the socket itself uses, and the
 * connector for IP literals, which are not looked up), so the address checked is the address
 * connected to: no DNS rebinding between a check and the connection, and redirects (which the
 * fetch here does not follow anyway) or endpoints named in a fetched document are checked alike.
 */

/** The code of a refused connection (the error's `code`, the cause of fetch's `TypeError`). */
export const PRIVATE_HOST_REFUSED = 'EPRIVATEHOST';

type LookupCallback = (err: NodeJS.ErrnoException | null, address: string | LookupAddress[], family?: number) => void;

const refused = (message: string) => Object.assign(new Error(message), { code: PRIVATE_HOST_REFUSED });

/**
 * `dns.lookup` refusing names that resolve to a non-public address (every address is checked).
 * `allowPrivate` is read at each lookup; `envName` is the switch named in the error.
 */
export function guardedLookup(allowPrivate: boolean | (() => boolean), envName = 'WARREN_JWKS_ALLOW_PRIVATE') {
  const allowed = typeof allowPrivate === 'function' ? allowPrivate : () => allowPrivate;
  return (hostname: string, options: dns.LookupOptions, callback: LookupCallback): void => {
    dns.lookup(hostname, { ...options, all: true }, (err, addresses) => {
      if (err) return callback(err, '');
      if (addresses.length === 0) return callback(Object.assign(new Error(`${hostname} has no address`), { code: 'ENOTFOUND' }), '');
      if (!allowed()) {
        const bad = addresses.find((a) => isNonPublicAddress(a.address));
        if (bad) return callback(refused(`${hostname} resolves to ${bad.address}, not a public address (set ${envName}=1 to allow it)`), '');
      }
      if (options.all) callback(null, addresses);
      else callback(null, addresses[0]!.address, addresses[0]!.family);
    });
  };
}

export interface GuardedFetchOptions {
  /** Whether non-public hosts may be reached; read at each connection. */
  allowPrivate: () => boolean;
  /** The operator's switch, named in refusals. */
  envName: string;
  /** Largest response body read, in bytes; a larger one fails the request. */
  maxBytes: number;
  /** Extra trusted CA (PEM), for tests; otherwise Node's CAs and NODE_EXTRA_CA_CERTS. */
  ca?: string;
  /** Connect timeout, ms (the caller's AbortSignal bounds the whole request). */
  connectTimeoutMs?: number;
}

/** The `fetch` signature openid-client's `customFetch` calls. */
export type GuardedFetch = (url: string, init: { method?: string; headers?: Record<string, string> | Headers; body?: unknown; redirect?: string; signal?: AbortSignal }) => Promise<Response>;

/** Statuses whose Response may not carry a body. */
const NULL_BODY = new Set([101, 103, 204, 205, 304]);

/**
 * A `fetch` whose connections are guarded (see the top of this file), that never follows a
 * redirect and reads at most `maxBytes` of a response body. A refused connection rejects as
 * fetch does for any network failure: `TypeError('fetch failed')` whose `cause` has the code
 * `PRIVATE_HOST_REFUSED`. The answer is a global `Response` with the body already read.
 */
export function guardedFetch(o: GuardedFetchOptions): GuardedFetch {
  const lookup = guardedLookup(o.allowPrivate, o.envName);
  const base = buildConnector({ timeout: o.connectTimeoutMs ?? 10_000, lookup: lookup as unknown as typeof dns.lookup, ...(o.ca ? { ca: o.ca } : {}) });
  const connect: buildConnector.connector = (opts, callback) => {
    if (!o.allowPrivate()) {
      const why = nonPublicHostRefusal(opts.hostname);
      if (why) return callback(refused(`${why} (set ${o.envName}=1 to allow it)`), null);
    }
    base(opts, callback);
  };
  const agent = new Agent({ connect });
  return async (url, init) => {
    const headers = init.headers instanceof Headers ? Object.fromEntries(init.headers.entries()) : init.headers;
    const res = await undiciFetch(url, {
      method: init.method,
      headers,
      body: init.body as never,
      // openid-client asks for 'manual' already: a redirect's target is never fetched here.
      redirect: 'manual',
      signal: init.signal,
      dispatcher: agent,
    });
    const declared = Number(res.headers.get('content-length') ?? 0);
    const tooLarge = () => new TypeError('fetch failed', { cause: Object.assign(new Error(`the response from ${new URL(url).host} is over ${o.maxBytes} bytes`), { code: 'ERESPONSETOOLARGE' }) });
    if (declared > o.maxBytes) {
      await res.body?.cancel().catch(() => {});
      throw tooLarge();
    }
    const chunks: Uint8Array[] = [];
    let size = 0;
    if (res.body) {
      for await (const chunk of res.body) {
        size += chunk.byteLength;
        // Leaving the loop cancels the stream (and the connection).
        if (size > o.maxBytes) throw tooLarge();
        chunks.push(chunk);
      }
    }
    const body = NULL_BODY.has(res.status) ? null : Buffer.concat(chunks);
    return new Response(body, { status: res.status, statusText: res.statusText, headers: [...res.headers.entries()] });
  };
}
