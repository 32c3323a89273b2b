/** RFC 3339 in UTC with whole seconds, e.g. `2026-03-01T09:30:12Z` (wire-conventions.md §6). */
export function rfc3339(d: Date | string | number): string {
  const date = d instanceof Date ? d : new Date(d);
  return date.toISOString().slice(0, 19) + 'Z';
}
