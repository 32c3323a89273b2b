import { Ngrok } from '@ngrok/ngrok-api';
import { expect } from 'vitest';

/**
 * An error the official client threw for a non-2xx answer (it throws a plain object
 * `{errorCode, statusCode, msg, details: Map}`), turned into an Error naming the call, so a test
 * failure reads "reservedAddrs.create → 404 ERR_WARREN_4000 …" instead of "[object Object]".
 */
export class ApiCallError extends Error {
  constructor(
    readonly call: string,
    readonly statusCode: number,
    readonly errorCode: string,
    readonly apiMsg: string,
    readonly details: Map<string, string>,
  ) {
    const hint = errorCode === 'ERR_WARREN_4000' ? ' [route not registered: resource not implemented yet]' : '';
    super(`${call} → ${statusCode} ${errorCode}: ${apiMsg}${hint} (details ${JSON.stringify(Object.fromEntries(details ?? []))})`);
    this.name = 'ApiCallError';
  }
}

function isClientApiError(e: unknown): e is { statusCode: number; errorCode: string; msg: string; details: Map<string, string> } {
  return typeof e === 'object' && e !== null && !(e instanceof Error) && typeof (e as { statusCode?: unknown }).statusCode === 'number';
}

/** Wraps every method of the client (at any depth) so API errors reject as ApiCallError. The client itself is untouched. */
function wrap<T extends object>(target: T, path: string): T {
  return new Proxy(target, {
    get(t, prop, recv) {
      const v = Reflect.get(t, prop, recv) as unknown;
      if (typeof prop !== 'string' || prop === 'httpClient') return v;
      if (typeof v === 'function') {
        return (...args: unknown[]) => {
          const r = (v as (...a: unknown[]) => unknown).apply(t, args);
          if (r instanceof Promise) {
            return r.catch((e: unknown) => {
              if (isClientApiError(e)) throw new ApiCallError(`${path}.${prop}`, e.statusCode, e.errorCode, e.msg, e.details);
              throw e;
            });
          }
          return r;
        };
      }
      if (v && typeof v === 'object') return wrap(v, `${path}.${prop}`);
      return v;
    },
  });
}

export function officialClient(baseUrl: string, apiToken: string): Ngrok {
  return wrap(new Ngrok({ apiToken, baseUrl }), 'ngrok');
}

/** Expects the call to fail with this HTTP status (and error code). */
export async function expectApiError(p: Promise<unknown>, status: number, code?: string): Promise<ApiCallError> {
  let res: unknown;
  try {
    res = await p;
  } catch (e) {
    if (!(e instanceof ApiCallError)) throw e;
    expect(e.statusCode, e.message).toBe(status);
    if (code) expect(e.errorCode, e.message).toBe(code);
    // the client camelCases the details keys too: operation_id arrives as operationId
    expect(e.details.get('operationId'), e.message).toMatch(/^op_[0-9A-Za-z]{27}$/);
    return e;
  }
  throw new Error(`expected ${status}${code ? ` ${code}` : ''}, but the call succeeded with ${JSON.stringify(res)?.slice(0, 500)}`);
}

/**
 * The TS client 0.11 `delete()` parses the 204's empty body as JSON and rejects with a
 * SyntaxError (a client bug, wire-conventions.md §4). Tolerate exactly that, then prove the
 * deletion with a GET that must answer 404.
 */
export async function deleteAndVerify(del: () => Promise<unknown>, get?: () => Promise<unknown>, code = 'ERR_WARREN_4001'): Promise<void> {
  await tolerateEmptyBody(del());
  if (get) await expectApiError(get(), 404, code);
}

export async function tolerateEmptyBody(p: Promise<unknown>): Promise<void> {
  try {
    await p;
  } catch (e) {
    if (e instanceof ApiCallError) throw e;
    // node-fetch: "invalid json response body at … reason: Unexpected end of JSON input",
    // which the client's onRejected then fails to JSON.parse.
    if (!(e instanceof SyntaxError)) throw e;
  }
}

/**
 * Lists through the client's own pager: in pages of 3 from the start (so ≥ 3 round trips with
 * beforeId from page 2), from a cursor in pages of 2, and with the default page size.
 */
export async function expectPaging<T extends { id: string }>(list: (beforeId?: string, limit?: string) => Promise<T[]>, ids: string[]): Promise<void> {
  const want = [...ids].sort().reverse();
  expect(want.length, 'need more than 6 items to cross 3 pages of 3').toBeGreaterThan(6);
  expect((await list(undefined, '3')).map((x) => x.id)).toEqual(want);
  expect((await list(want[1], '2')).map((x) => x.id)).toEqual(want.slice(2));
  expect((await list()).map((x) => x.id)).toEqual(want);
}

/** The client types maps as Map, but serializes a real Map as `{}` (its key converter walks Object.keys): pass plain objects. */
export function map(o: Record<string, string>): Map<string, string> {
  return o as unknown as Map<string, string>;
}

/** Runs `fn` for 0..n-1 with at most `width` at a time. */
export async function times<T>(n: number, fn: (i: number) => Promise<T>, width = 8): Promise<T[]> {
  const out: T[] = new Array(n);
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(width, n) }, async () => {
      while (next < n) {
        const i = next++;
        out[i] = await fn(i);
      }
    }),
  );
  return out;
}
