import { AppError, isId, type IdPrefix } from '@warren/shared';

export interface Page {
  limit: number;
  beforeId: string | undefined;
}

const ALLOWED = new Set(['limit', 'before_id', 'beforeId']);

/** Parses `limit` and `before_id`/`beforeId` (wire-conventions.md §5); anything else is 400. */
export function parsePage(query: Record<string, unknown>, prefix: IdPrefix): Page {
  for (const [k, v] of Object.entries(query)) {
    if (!ALLOWED.has(k)) throw new AppError(2200, `unknown query parameter ${JSON.stringify(k)}; supported: limit, before_id`, { param: k });
    if (Array.isArray(v)) throw new AppError(2201, `query parameter ${JSON.stringify(k)} is repeated`, { param: k });
  }
  const str = (k: string) => {
    const v = query[k];
    return typeof v === 'string' && v !== '' ? v : undefined;
  };
  let limit = 100;
  const rawLimit = str('limit');
  if (rawLimit !== undefined) {
    if (!/^\d{1,3}$/.test(rawLimit) || Number(rawLimit) < 1 || Number(rawLimit) > 100)
      throw new AppError(2202, `limit must be an integer from 1 to 100, got ${JSON.stringify(rawLimit.slice(0, 32))}`, { param: 'limit' });
    limit = Number(rawLimit);
  }
  const a = str('before_id');
  const b = str('beforeId');
  if (a !== undefined && b !== undefined && a !== b) throw new AppError(2204, 'before_id and beforeId differ', { param: 'before_id' });
  const beforeId = a ?? b;
  if (beforeId !== undefined && !isId(prefix, beforeId))
    throw new AppError(2203, `before_id must be an id with prefix ${prefix}_`, { param: 'before_id' });
  return { limit, beforeId };
}

/**
 * Builds the list envelope from `limit + 1` fetched rows: the extra row only tells whether a
 * next page exists (never a non-null next_page_uri next to an empty page).
 */
export function envelope<T extends { id: string }>(key: string, collectionUri: string, rows: T[], page: Page): Record<string, unknown> {
  const more = rows.length > page.limit;
  const items = more ? rows.slice(0, page.limit) : rows;
  const last = items[items.length - 1];
  return {
    [key]: items,
    uri: collectionUri,
    next_page_uri: more && last ? `${collectionUri}?limit=${page.limit}&before_id=${last.id}` : null,
  };
}
