import { z } from 'zod';

/**
 * Parses environment variables once into a typed, frozen object. A failure lists every bad
 * variable in one message (and never a stack trace when printed by `fatal`).
 */
export function parseEnv<S extends z.ZodRawShape>(shape: S, source: NodeJS.ProcessEnv = process.env): Readonly<z.infer<z.ZodObject<S>>> {
  const input: Record<string, unknown> = {};
  for (const key of Object.keys(shape)) {
    const v = source[key];
    if (v !== undefined && v !== '') input[key] = v;
  }
  const result = z.object(shape).safeParse(input);
  if (!result.success) {
    const lines = result.error.issues.map((i) => `  ${i.path.join('.')}: ${i.message}`);
    throw new EnvError(`invalid environment:\n${lines.join('\n')}`);
  }
  return Object.freeze(result.data);
}

export class EnvError extends Error {
  override name = 'EnvError';
}

/** Helpers for common variable kinds. */
export const envBool = (def: boolean) =>
  z
    .enum(['1', '0', 'true', 'false', 'yes', 'no'])
    .default(def ? 'true' : 'false')
    .transform((v) => v === '1' || v === 'true' || v === 'yes');
export const envInt = (def: number, min = 0, max = Number.MAX_SAFE_INTEGER) => z.coerce.number().int().min(min).max(max).default(def);
