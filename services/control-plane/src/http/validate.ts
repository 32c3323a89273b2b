import { z } from 'zod';
import { AppError, type ErrorCode, isId, type IdPrefix } from '@warren/shared';

/**
 * Schema building blocks shared by every resource. Unknown fields are refused at any depth
 * (`obj`), byte limits are checked in UTF-8 bytes, and each rule carries its Warren error code
 * in `params.code` so `parseBody` can answer with the right code and the field's JSON path.
 */

const utf8Bytes = (s: string) => Buffer.byteLength(s, 'utf8');

/** A string of at most `max` UTF-8 bytes, failing with `code`. */
export function boundedString(max: number, code: ErrorCode = 5003, what = 'value') {
  return z
    .string()
    .max(max)
    .refine((s) => s.length * 3 <= max || utf8Bytes(s) <= max, { message: `${what} is over ${max} bytes`, params: { code } });
}

export const description = () => boundedString(255, 5000, 'description').describe('human-readable description, at most 255 bytes');
export const metadata = () => boundedString(4096, 5001, 'metadata').describe('user-defined machine-readable data, at most 4096 bytes');

/** A list of at most `max` items, failing with 5002. */
export function boundedList<T extends z.ZodType>(item: T, max: number) {
  return z.array(item).max(max, { message: `at most ${max} items are allowed` });
}

/** A strict object: any key not in `shape` is refused with 2101, listing the supported names. */
export function obj<S extends z.ZodRawShape>(shape: S) {
  const supported = Object.keys(shape).join(', ');
  return z.strictObject(shape, {
    error: (iss) => {
      if (iss.code === 'unrecognized_keys') {
        const keys = (iss as { keys: string[] }).keys;
        return `unknown field${keys.length > 1 ? 's' : ''} ${keys.map((k) => JSON.stringify(k)).join(', ')}; supported: ${supported}`;
      }
      return undefined;
    },
  });
}

/** A reference id in a body with the given prefix: malformed → 3000, wrong prefix → 3001. */
export function refId(prefix: IdPrefix) {
  return z.string().superRefine((s, ctx) => {
    if (isId(prefix, s as unknown)) return;
    const m = /^([a-z]+)_[0-9A-Za-z]{27}$/.exec(s);
    if (m) ctx.addIssue({ code: 'custom', message: `expected an id with prefix ${prefix}_, got ${m[1]}_`, params: { code: 3001 } });
    else ctx.addIssue({ code: 'custom', message: `malformed id ${JSON.stringify(s.slice(0, 64))}; expected ${prefix}_<27 characters>`, params: { code: 3000 } });
  });
}

/** uint32 as the spec types it. */
export const uint32 = () => z.number().int().min(0).max(4294967295);

function pathOf(path: readonly PropertyKey[]): string {
  let out = '';
  for (const p of path) out += typeof p === 'number' ? `[${p}]` : out ? `.${String(p)}` : String(p);
  return out;
}

function valueAt(input: unknown, path: readonly PropertyKey[]): unknown {
  let value: unknown = input;
  for (const p of path) value = value == null ? undefined : (value as Record<PropertyKey, unknown>)[p];
  return value;
}

function typeName(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  return typeof v;
}

/** Maps the first zod issue to an AppError with a code, a message naming the field and `details.field`. */
export function issueToError(issue: z.core.$ZodIssue, input: unknown): AppError {
  const field = pathOf(issue.path);
  const at = field ? `${field}: ` : '';
  const params = (issue as { params?: { code?: ErrorCode } }).params;
  if (params?.code) return new AppError(params.code, `${at}${issue.message}`, { field });
  switch (issue.code) {
    case 'unrecognized_keys': {
      const keys = issue.keys;
      const full = keys.map((k) => (field ? `${field}.${k}` : k));
      return new AppError(2101, issue.message.replace(/unknown fields? [^;]*/, `unknown field${keys.length > 1 ? 's' : ''} ${full.map((k) => JSON.stringify(k)).join(', ')}`), { field: full[0] ?? field });
    }
    case 'invalid_type': {
      const value = valueAt(input, issue.path);
      if (value === undefined) return new AppError(2103, `${field || 'body'} is required`, { field });
      return new AppError(2102, `${at}expected ${issue.expected}, got ${typeName(value)}`, { field });
    }
    case 'invalid_value':
    case 'invalid_union':
      // A required enum or union that is simply missing is "required", not "not allowed".
      if (valueAt(input, issue.path) === undefined) return new AppError(2103, `${field || 'body'} is required`, { field });
      return new AppError(2104, `${at}${issue.message}`, { field });
    case 'too_big':
    case 'too_small': {
      if (issue.origin === 'array' && issue.code === 'too_big') return new AppError(5002, `${at}${issue.message}`, { field });
      if (issue.origin === 'string' && issue.code === 'too_big') {
        const last = issue.path[issue.path.length - 1];
        const code: ErrorCode = last === 'description' ? 5000 : last === 'metadata' ? 5001 : 5003;
        return new AppError(code, `${at}must be at most ${String(issue.maximum)} bytes`, { field });
      }
      return new AppError(2104, `${at}${issue.message}`, { field });
    }
    default:
      return new AppError(2104, `${at}${issue.message}`, { field });
  }
}

/** Parses `input` with `schema`, throwing the AppError of the first issue. */
export function parseBody<T extends z.ZodType>(schema: T, input: unknown): z.output<T> {
  const r = schema.safeParse(input);
  if (r.success) return r.data;
  throw issueToError(r.error.issues[0]!, input);
}

/** Drops `null`/`undefined` values: in PATCH an omitted field and `null` both mean unchanged. */
export function defined<T extends object>(o: T): { [K in keyof T]?: Exclude<T[K], null> } {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(o)) if (v !== null && v !== undefined) out[k] = v;
  return out as { [K in keyof T]?: Exclude<T[K], null> };
}
