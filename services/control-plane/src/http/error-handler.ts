import type { Request, Response, NextFunction } from 'express';
import { AppError, errorCodeName } from '@warren/shared';
import type { Logger } from '@warren/shared';

const DB_DOWN_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'ENOTFOUND', '57P01', '57P02', '57P03', '08000', '08003', '08006', '53300']);

/** Maps what a handler threw to an AppError; Postgres constraint errors become 409/400. */
export function toAppError(err: unknown, method: string): AppError {
  if (err instanceof AppError) return err;
  const e = err as { code?: string; type?: string; message?: string; constraint?: string; status?: number };
  // The router could not percent-decode a path segment: no resource can have that path.
  if (err instanceof URIError || (e?.status === 400 && e?.message?.startsWith('Failed to decode param'))) return new AppError(4000, 'the path is not valid percent-encoding');
  // Safety net behind the body checks: text Postgres cannot store is a bad value, not a crash.
  if (e?.code === '22021' || e?.code === '22P05') return new AppError(2104, 'a string contains a character that cannot be stored');
  if (e?.code === '23505') return new AppError(4101, 'the value is already in use');
  if (e?.code === '23503') return method === 'DELETE' ? new AppError(4100, 'the resource is still referenced by another resource; remove the reference first') : new AppError(3002, 'a referenced resource no longer exists');
  if (e?.code && DB_DOWN_CODES.has(e.code)) return new AppError(9001, undefined, { headers: { 'Retry-After': '1' } });
  if (e?.message?.includes('timeout exceeded when trying to connect') || e?.message?.includes('Connection terminated')) return new AppError(9001, undefined, { headers: { 'Retry-After': '1' } });
  if (e?.type === 'entity.too.large') return new AppError(2021);
  return new AppError(9000);
}

/** Writes the wire error body (wire-conventions.md §2) for anything thrown. */
export function errorHandler(log: Logger) {
  return (err: unknown, req: Request, res: Response, _next: NextFunction) => {
    const appErr = toAppError(err, req.method);
    const opId = res.locals.operationId as string;
    if (appErr.status >= 500) log.error({ err, op: opId, method: req.method, path: req.path }, 'request failed');
    if (res.headersSent) return res.end();
    for (const [k, v] of Object.entries(appErr.headers)) res.setHeader(k, v);
    if (appErr.status === 401) res.setHeader('WWW-Authenticate', 'Bearer');
    if (appErr.status === 503 && !res.getHeader('Retry-After')) res.setHeader('Retry-After', '1');
    res.status(appErr.status).json({
      error_code: errorCodeName(appErr.code),
      status_code: appErr.status,
      msg: appErr.message,
      details: { ...appErr.details, operation_id: opId },
    });
  };
}
