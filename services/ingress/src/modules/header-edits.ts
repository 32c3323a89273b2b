import { removeRawHeaders, setRawHeader } from './common.js';

/**
 * The edit both header modules make on raw `[name, value, …]` pairs: first every header named
 * in `remove` goes (case-insensitively, all its values), then every `add` entry is set,
 * replacing any values a header of that name (case-insensitively) still has. Framing and
 * hop-by-hop headers are never touched (`PROTECTED`): editing them would desynchronise the
 * message from its body or the connection.
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

/** The edits of a stored headers module (`extraProtected` adds names this direction must keep), or null when it edits nothing. */
export function compileHeaderEdits(m: HeadersModule, extraProtected: readonly string[] = []): HeaderEdits | null {
  const keep = (name: string) => !PROTECTED.has(name.toLowerCase()) && !extraProtected.includes(name.toLowerCase());
  const remove = new Set((m.remove ?? []).map((n) => n.toLowerCase()).filter(keep));
  const add = Object.entries(m.add ?? {}).filter(([n]) => keep(n));
  if (remove.size === 0 && add.length === 0) return null;
  return { remove, add };
}

export function applyHeaderEdits(pairs: string[], e: HeaderEdits): void {
  if (e.remove.size > 0) removeRawHeaders(pairs, e.remove);
  for (const [name, value] of e.add) setRawHeader(pairs, name, value);
}
