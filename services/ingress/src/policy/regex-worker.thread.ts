import { parentPort } from 'node:worker_threads';
// Only the find-replace module (and what it needs), not all of @warren/shared.
import { applyFindReplace, compileFindReplace, FIND_REPLACE_WORKER_LIMITS } from '../../../shared/src/traffic-policy/find-replace.js';
import { UrlActionRuntimeError } from '../../../shared/src/traffic-policy/url-actions.js';
import type { CelProgram } from '../../../shared/src/traffic-policy/cel.js';
import type { FindReplaceConfig, PolicyDirection } from '../../../shared/src/traffic-policy/types.js';

/**
 * Worker thread of `regex-worker.ts`: rewrites a body with one find-replace action, within
 * `FIND_REPLACE_WORKER_LIMITS`, off the ingress's event loop. The action comes as its config
 * (compiled here once, kept for the next bodies) and the text of its `${…}` values, which the
 * event loop evaluated, in the order of the compiled action's `programs`.
 */

export interface RegexJob {
  id: number;
  direction: PolicyDirection;
  config: FindReplaceConfig;
  values: string[];
  body: Uint8Array;
}

export type RegexMessage =
  | { type: 'ready' }
  | { type: 'done'; id: number; body: Uint8Array | null }
  | { type: 'failed'; id: number; code?: string; message: string };

const port = parentPort;
if (!port) throw new Error('regex-worker.thread.ts runs as a worker thread');

/** Compiled actions by config, most recent last (a Map keeps insertion order). */
const compiled = new Map<string, ReturnType<typeof compileFindReplace>>();
const KEEP = 64;

function actionOf(direction: PolicyDirection, config: FindReplaceConfig): ReturnType<typeof compileFindReplace> {
  const key = `${direction}\n${JSON.stringify(config)}`;
  let c = compiled.get(key);
  if (c) compiled.delete(key);
  else c = compileFindReplace(direction, config);
  compiled.set(key, c);
  if (compiled.size > KEEP) compiled.delete(compiled.keys().next().value!);
  return c;
}

port.on('message', (job: RegexJob) => {
  try {
    const c = actionOf(job.direction, job.config);
    const values = new Map<CelProgram, string>();
    c.programs.forEach((p, i) => values.set(p, job.values[i] ?? ''));
    const body = Buffer.from(job.body.buffer, job.body.byteOffset, job.body.byteLength);
    const out = applyFindReplace(c, body, (p) => values.get(p) ?? '', FIND_REPLACE_WORKER_LIMITS);
    // A result of its own (Buffer.from pools small ones): moved to the parent, not copied.
    const result = out === null ? null : new Uint8Array(out);
    port.postMessage({ type: 'done', id: job.id, body: result } satisfies RegexMessage, result ? [result.buffer as ArrayBuffer] : []);
  } catch (err) {
    const code = err instanceof UrlActionRuntimeError ? err.code : undefined;
    port.postMessage({ type: 'failed', id: job.id, code, message: err instanceof Error ? err.message : String(err) } satisfies RegexMessage);
  }
});

port.postMessage({ type: 'ready' } satisfies RegexMessage);
