import { z } from 'zod';

const bytes = (s: string) => Buffer.byteLength(s, 'utf8');

/**
 * Labels of tunnel group backends and agents (wire-conventions.md §13): 1–10 pairs, key 1–64
 * bytes without `:` or `=`, value 1–256 bytes without `=`.
 */
export const Labels = z.record(z.string(), z.string()).superRefine((labels, ctx) => {
  const entries = Object.entries(labels);
  if (entries.length < 1 || entries.length > 10)
    ctx.addIssue({ code: 'custom', message: `labels must have 1 to 10 pairs, got ${entries.length}`, params: { code: 6100 } });
  for (const [k, v] of entries) {
    if (bytes(k) < 1 || bytes(k) > 64 || /[:=]/.test(k))
      ctx.addIssue({ code: 'custom', path: [k], message: 'a label key must be 1 to 64 bytes without ":" or "="', params: { code: 6100 } });
    else if (bytes(v) < 1 || bytes(v) > 256 || v.includes('='))
      ctx.addIssue({ code: 'custom', path: [k], message: 'a label value must be 1 to 256 bytes without "="', params: { code: 6100 } });
  }
});
