import { z } from 'zod';
import { obj, parseBody } from '../../http/validate.js';

/**
 * Module PUT bodies (wire-conventions.md §8): the bare module (request shape), or the TS 0.11
 * client's wrapper `{id, module: {...}}` (edge modules) / `{id, edge_id, module: {...}}` (route
 * modules). A body is a wrapper when it has a `module` key and nothing besides the wrapper keys;
 * its fields are then reported as `module.<field>`. Returns the parsed module and that prefix.
 */
export function parseModuleBody<T extends z.ZodType>(schema: T, body: Record<string, unknown>, wrapperKeys: readonly string[]): { input: z.output<T>; prefix: string } {
  const keys = Object.keys(body);
  const wrapped = 'module' in body && keys.every((k) => k === 'module' || wrapperKeys.includes(k));
  if (!wrapped) return { input: parseBody(schema, body), prefix: '' };
  const shape: Record<string, z.ZodType> = {};
  for (const k of wrapperKeys) shape[k] = z.string().nullish();
  shape.module = schema;
  const parsed = parseBody(obj(shape), body) as { module: z.output<T> };
  return { input: parsed.module, prefix: 'module' };
}

/** `a.b` path join that tolerates an empty prefix. */
export function joinPath(prefix: string, field: string): string {
  return prefix ? (field ? `${prefix}.${field}` : prefix) : field;
}

/** Order-insensitive deep equality of JSON values (jsonb does not keep key order). */
export function jsonEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== typeof b || a === null || b === null || typeof a !== 'object') return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a)) {
    const bb = b as unknown[];
    return a.length === bb.length && a.every((v, i) => jsonEqual(v, bb[i]));
  }
  const ao = a as Record<string, unknown>;
  const bo = b as Record<string, unknown>;
  const ak = Object.keys(ao).filter((k) => ao[k] !== undefined);
  const bk = Object.keys(bo).filter((k) => bo[k] !== undefined);
  return ak.length === bk.length && ak.every((k) => jsonEqual(ao[k], bo[k]));
}
