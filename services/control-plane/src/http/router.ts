import express, { type Request, type Response, type NextFunction } from 'express';
import { AppError } from '@warren/shared';
import type { AuthContext, RequestContext } from './context.js';
import type { OpenApiRegistry, OperationDoc } from './openapi.js';

/** JSON bodies are UTF-8 (RFC 8259 §8.1); `fatal` refuses invalid sequences instead of replacing them. */
const STRICT_UTF8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: false });

export type Method = 'GET' | 'POST' | 'PATCH' | 'PUT' | 'DELETE';

/** One parsed API request, as handlers see it. */
export interface ApiRequest {
  ctx: RequestContext;
  params: Record<string, string>;
  query: Record<string, unknown>;
  /** The parsed JSON object for POST/PATCH/PUT (`{}` when the body is empty). */
  body: Record<string, unknown>;
}

export interface ApiResponse {
  status: number;
  body?: unknown;
}

export type ApiHandler = (req: ApiRequest) => Promise<ApiResponse>;

/** What every resource's `*.http.ts` registers against. */
export interface ApiRoutes {
  /** Registers handlers for one path; `docs` feeds GET /openapi.json. */
  route(path: string, handlers: Partial<Record<Method, ApiHandler>>, docs?: Partial<Record<Method, OperationDoc>>): void;
}

export const MAX_BODY_BYTES = 1024 * 1024;

/** Gate run after the route matched and before the body is read (the account rate limit). */
export type AccountGate = (auth: AuthContext) => void;

// NUL and unpaired UTF-16 surrogates are valid in JSON text but cannot be stored faithfully
// (Postgres refuses NUL; a lone surrogate would silently become U+FFFD), so they are refused.
const UNSTORABLE = /\u0000|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/**
 * Refuses a string (or key) Postgres cannot store, naming it by its full path
 * (`traffic_policy.value`, `labels.a\u0000`): walked without recursion, as bodies may nest deeply.
 */
function rejectUnstorableStrings(body: unknown): void {
  const stack: Array<[unknown, string]> = [[body, '']];
  const refuse = (path: string): never => {
    const field = path.slice(0, 128);
    throw new AppError(2104, `${field ? `${field}: ` : ''}strings must not contain NUL characters or unpaired surrogates`, field ? { field } : {});
  };
  while (stack.length > 0) {
    const [v, path] = stack.pop()!;
    if (typeof v === 'string') {
      if (UNSTORABLE.test(v)) refuse(path);
    } else if (Array.isArray(v)) {
      for (let i = 0; i < v.length; i++) stack.push([v[i], `${path}[${i}]`]);
    } else if (v !== null && typeof v === 'object') {
      for (const [k, x] of Object.entries(v)) {
        const p = path ? `${path}.${k}` : k;
        if (UNSTORABLE.test(k)) refuse(p);
        stack.push([x, p]);
      }
    }
  }
}

/** Reads the body (bounded to 1 MiB), checks the content type and parses one JSON object. */
export async function readJsonBody(req: Request): Promise<Record<string, unknown>> {
  const declared = Number(req.headers['content-length'] ?? 0);
  if (declared > MAX_BODY_BYTES) {
    req.resume();
    throw new AppError(2021);
  }
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > MAX_BODY_BYTES) throw new AppError(2021);
    chunks.push(chunk);
  }
  if (size === 0) return {};
  const ct = (req.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase();
  if (ct !== 'application/json' && !ct.endsWith('+json')) throw new AppError(2020, 'Content-Type must be application/json when a body is sent');
  let text: string;
  try {
    // Strict: a body that is not UTF-8 is refused, not stored with U+FFFD in place of its bytes.
    text = STRICT_UTF8.decode(Buffer.concat(chunks, size));
  } catch {
    throw new AppError(2100, 'the request body is not valid UTF-8');
  }
  if (text.trim() === '') return {};
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    throw new AppError(2100, `the request body is not valid JSON: ${(err as Error).message.slice(0, 200)}`);
  }
  rejectUnstorableStrings(parsed);
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) throw new AppError(2100);
  return parsed as Record<string, unknown>;
}

/**
 * Builds an express router from handler tables. Known paths with other methods answer 405 with
 * `Allow`; bodies are read only for POST/PATCH/PUT, after the route and method matched.
 */
export function createApiRouter(baseUrl: string, gate: AccountGate, openapi: OpenApiRegistry): { router: express.Router; routes: ApiRoutes } {
  const router = express.Router({ caseSensitive: true, strict: false });
  const routes: ApiRoutes = {
    route(path, handlers, docs = {}) {
      const r = router.route(path);
      for (const [method, doc] of Object.entries(docs) as [Method, OperationDoc][]) openapi.add(path, method, doc);
      const allow = Object.keys(handlers).join(', ');
      for (const [method, handler] of Object.entries(handlers) as [Method, ApiHandler][]) {
        const hasBody = method === 'POST' || method === 'PATCH' || method === 'PUT';
        r[method.toLowerCase() as 'get'](async (req: Request, res: Response) => {
          const auth = res.locals.auth as AuthContext;
          gate(auth);
          const body = hasBody ? await readJsonBody(req) : {};
          const out = await handler({ ctx: { auth, baseUrl }, params: req.params as Record<string, string>, query: req.query as Record<string, unknown>, body });
          if (out.body === undefined) res.status(out.status).end();
          else res.status(out.status).json(out.body);
        });
      }
      r.all((_req: Request, res: Response, next: NextFunction) => {
        res.setHeader('Allow', allow);
        next(new AppError(2010, `method not allowed; this path supports ${allow}`));
      });
    },
  };
  return { router, routes };
}
