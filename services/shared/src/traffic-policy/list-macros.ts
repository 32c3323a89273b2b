/**
 * ngrok's list methods from cel-go's lists extension (https://ngrok.com/docs/traffic-policy/macros/,
 * section Lists), with cel-go's semantics:
 *
 * - `l.slice(start, end)`: the elements at `start` … `end - 1`. Negative indexes, `start > end`
 *   and `end > size(l)` are evaluation errors.
 * - `l.flatten()`, `l.flatten(depth)`: lists in `l` replaced by their elements, `depth` levels
 *   down (1 by default, as cel-go: `[1,[2,[3,4]]].flatten()` is `[1, 2, [3, 4]]`). A negative
 *   depth, one over `MAX_FLATTEN_DEPTH`, and a walk over more than `MAX_BUILT_LIST` elements are
 *   evaluation errors (it walks with its own stack, not by recursion).
 * - `l.sort()`: the elements in ascending order; they must all be of one comparable type (int,
 *   uint, double, bool, string, bytes, duration, timestamp), else an evaluation error ("list
 *   elements must be comparable" / "must have the same type", cel-go's). Strings are in Go's
 *   order (by their UTF-8 bytes), bytes by their bytes, `false` before `true`; a NaN cannot be
 *   ordered (an error). Equal elements keep their order (a stable sort).
 * - `l.sortBy(x, key)`: the elements ordered by `key` evaluated with `x` bound to each (once per
 *   element), the keys as `sort()` orders values; equal keys keep the elements' order. A macro
 *   (its key is an expression): a key expression whose type is known and not comparable does
 *   not compile.
 * - `l.distinct()`: the elements without those equal (CEL equality, numbers across types:
 *   `1`, `1u` and `1.0` are equal) to an earlier one, in order.
 *
 * `sort()`, `sortBy()` and `distinct()` refuse a list of more than `MAX_BUILT_LIST` elements,
 * `distinct()` a value nested more than `MAX_VALUE_DEPTH` deep or elements of more than
 * `MAX_DISTINCT_CHARS` characters together. Their worst-case costs are in `cost.ts`.
 */
import type { Environment } from '@marcbachmann/cel-js';
import { celTypeName, className, compareOrderKeys, evalError, listItems, mapEntries, MAX_VALUE_DEPTH, fromUtf8OrderKey, hasLoneSurrogate, toUtf8OrderKey, utf16IsUtf8Order, utf8OrderKeys } from './cel-values.js';
import type { CheckedType, MacroChecker, MacroEvaluator } from './macro-hooks.js';

/** Longest list `flatten()` walks and builds, and `sort()`, `sortBy()`, `distinct()` take: past it, an evaluation error. */
export const MAX_BUILT_LIST = 65_536;
/** Deepest `flatten(depth)` (a nesting that deep is already refused by `json.decode()`). */
export const MAX_FLATTEN_DEPTH = MAX_VALUE_DEPTH;
/** Most characters of the elements `distinct()` compares, together (a key of each is built). */
export const MAX_DISTINCT_CHARS = 1 << 20;

/** The types `sort()` and `sortBy()` order (cel-go's comparable types), by the CEL type name a checker gives. */
export const COMPARABLE_TYPES: readonly string[] = ['int', 'uint', 'double', 'bool', 'string', 'bytes', 'google.protobuf.Duration', 'google.protobuf.Timestamp'];

const tooLongList = (fn: string, n: number) => evalError('invalid_argument', `${fn}: list too long (${n} elements, at most ${MAX_BUILT_LIST})`);

/** `v` as a list, or an evaluation error naming `fn`. */
function asList(v: unknown, fn: string): readonly unknown[] {
  const items = listItems(v);
  if (items === undefined) throw evalError('no_matching_overload', `${fn}: needs a list, got ${celTypeName(v)}`);
  return items;
}

/** `l.slice(start, end)`. */
export function listSlice(list: readonly unknown[], start: bigint, end: bigint): unknown[] {
  if (start < 0n || end < 0n) throw evalError('invalid_argument', `cannot slice(${start}, ${end}), negative indexes not supported`);
  if (start > end) throw evalError('invalid_argument', `cannot slice(${start}, ${end}), start index must be less than or equal to end index`);
  if (end > BigInt(list.length)) throw evalError('invalid_argument', `cannot slice(${start}, ${end}), list is length ${list.length}`);
  return list.slice(Number(start), Number(end));
}

/** `l.flatten(depth)`: depth-first, with an explicit stack of at most `depth + 1` lists. */
export function listFlatten(list: readonly unknown[], depth = 1n): unknown[] {
  if (depth < 0n) throw evalError('invalid_argument', `flatten(): level must be non-negative, got ${depth}`);
  if (depth > BigInt(MAX_FLATTEN_DEPTH)) throw evalError('invalid_argument', `flatten(): depth ${depth} is too large (at most ${MAX_FLATTEN_DEPTH})`);
  if (depth === 0n) return [...list];
  const out: unknown[] = [];
  const stack: { items: readonly unknown[]; next: number; depth: number }[] = [{ items: list, next: 0, depth: Number(depth) }];
  let walked = 0;
  while (stack.length > 0) {
    const top = stack[stack.length - 1]!;
    if (top.next >= top.items.length) {
      stack.pop();
      continue;
    }
    const v = top.items[top.next++];
    if (++walked > MAX_BUILT_LIST) throw evalError('invalid_argument', `flatten(): list too long (more than ${MAX_BUILT_LIST} elements to walk)`);
    const inner = top.depth > 0 ? listItems(v) : undefined;
    if (inner !== undefined) stack.push({ items: inner, next: 0, depth: top.depth - 1 });
    else out.push(v);
  }
  return out;
}

/** Which comparable type a value is (`sort()`'s), undefined for others. */
function comparableKind(v: unknown): string | undefined {
  switch (typeof v) {
    case 'bigint':
      return 'int';
    case 'number':
      return 'double';
    case 'boolean':
      return 'bool';
    case 'string':
      return 'string';
  }
  if (v instanceof Uint8Array) return 'bytes';
  if (v instanceof Date) return 'timestamp';
  if (v !== null && typeof v === 'object') {
    const name = className(v);
    if (name === 'UnsignedInt') return 'uint';
    if (name === 'Duration') return 'duration';
  }
  return undefined;
}

const compareBig = (a: bigint, b: bigint) => (a < b ? -1 : a > b ? 1 : 0);

/** Checks that `keys` can be ordered (one comparable type, no NaN): their kind, or an evaluation error naming `fn`. */
function orderKind(keys: readonly unknown[], fn: string): string | undefined {
  if (keys.length > MAX_BUILT_LIST) throw tooLongList(fn, keys.length);
  if (keys.length === 0) return undefined;
  const kind = comparableKind(keys[0]);
  if (kind === undefined) throw evalError('invalid_argument', `${fn}: list elements must be comparable (int, uint, double, bool, string, bytes, duration or timestamp), got ${celTypeName(keys[0])}`);
  for (const k of keys) {
    if (comparableKind(k) !== kind) throw evalError('invalid_argument', `${fn}: list elements must have the same type (${celTypeName(keys[0])} and ${celTypeName(k)})`);
    if (kind === 'double' && Number.isNaN(k)) throw evalError('invalid_argument', `${fn}: NaN values cannot be ordered`);
    if (kind === 'timestamp' && Number.isNaN((k as Date).getTime())) throw evalError('invalid_argument', `${fn}: invalid timestamp`);
  }
  return kind;
}

/**
 * The order of `keys` as `sort()` orders values (indexes, equal keys in their order), `kind`
 * their type (`orderKind`): each key turned into a number, a BigInt or a string that compares
 * natively, then the indexes sorted by them.
 */
function sortedOrder(keys: readonly unknown[], kind: string): number[] {
  const idx = keys.map((_, i) => i);
  let cmp: (i: number, j: number) => number;
  switch (kind) {
    case 'int':
    case 'uint': {
      const k = kind === 'int' ? BigInt64Array.from(keys as bigint[]) : BigUint64Array.from(keys, (v) => (v as { value: bigint }).value);
      cmp = (i, j) => compareBig(k[i]!, k[j]!);
      break;
    }
    case 'double':
    case 'bool':
    case 'timestamp': {
      const k = Float64Array.from(keys, (v) => (kind === 'timestamp' ? (v as Date).getTime() : Number(v)));
      cmp = (i, j) => k[i]! - k[j]!;
      break;
    }
    case 'duration': {
      const d = keys as readonly { seconds: bigint; nanos: number }[];
      cmp = (i, j) => compareBig(d[i]!.seconds, d[j]!.seconds) || d[i]!.nanos - d[j]!.nanos;
      break;
    }
    case 'bytes': {
      const b = keys.map((k) => Buffer.from((k as Uint8Array).buffer, (k as Uint8Array).byteOffset, (k as Uint8Array).byteLength));
      cmp = (i, j) => Buffer.compare(b[i]!, b[j]!);
      break;
    }
    default: {
      // Strings, in Go's order (UTF-8 bytes).
      const { keys: order, bytes } = utf8OrderKeys(keys as string[]);
      if (bytes) cmp = (i, j) => compareOrderKeys(order[i]!, order[j]!);
      else {
        const k = order as string[];
        cmp = (i, j) => (k[i]! < k[j]! ? -1 : k[i]! > k[j]! ? 1 : 0);
      }
    }
  }
  // Array.prototype.sort is stable: equal keys keep their order.
  return idx.sort(cmp);
}

/** `l.sort()`: ints, doubles and strings (the common lists) sorted natively, others by `sortedOrder`. */
export function listSort(list: readonly unknown[]): unknown[] {
  const kind = orderKind(list, 'sort()');
  if (kind === undefined) return [];
  // Equal values are alike, so the order among them does not matter.
  if (kind === 'int') return Array.from(BigInt64Array.from(list as bigint[]).sort());
  if (kind === 'double') return Array.from(Float64Array.from(list as number[]).sort());
  if (kind === 'string') {
    const strings = list as string[];
    if (utf16IsUtf8Order(strings)) return [...strings].sort();
    if (!strings.some(hasLoneSurrogate)) return strings.map(toUtf8OrderKey).sort().map(fromUtf8OrderKey);
  }
  return sortedOrder(list, kind).map((i) => list[i]);
}

/** `l` ordered by `keys` (one per element: `sortBy()`'s). */
export function sortByKeys(list: readonly unknown[], keys: readonly unknown[]): unknown[] {
  const kind = orderKind(keys, 'sortBy()');
  return kind === undefined ? [] : sortedOrder(keys, kind).map((i) => list[i]);
}

/** What `distinct()` has seen, and what it may still spend building keys. */
interface Seen {
  /** Strings, as they are. */
  strings: Set<string>;
  /** Numbers of any type by value: a JavaScript number when exact (SameValueZero: -0 is 0), else `n<digits>`. */
  numbers: Set<number | string>;
  /** `null`, `true`, `false`. */
  scalars: Set<unknown>;
  /** Other values by their `equalityKey`. */
  keys: Set<string>;
  chars: number;
  ids: WeakMap<object, number>;
  nextId: number;
}

/** A number's entry in `Seen.numbers` (an integral value the same whatever its type), undefined for NaN. */
function numberKey(v: unknown): number | string | undefined {
  if (typeof v === 'number') {
    if (Number.isNaN(v)) return undefined;
    return Number.isInteger(v) && !Number.isSafeInteger(v) ? `n${BigInt(v)}` : v;
  }
  const n = typeof v === 'bigint' ? v : (v as { value: bigint }).value;
  return n >= -(2n ** 53n) && n <= 2n ** 53n ? Number(n) : `n${n}`;
}

/**
 * A string that is the same for values CEL finds equal and differs otherwise (undefined for a
 * value equal to nothing: NaN, or a list or map holding one), its characters charged to
 * `seen.chars`. Numbers of any type are equal when their values are (`1 == 1u == 1.0`); objects
 * of the registered types (a cookie, `req.url`) only to themselves.
 */
function equalityKey(v: unknown, depth: number, seen: Seen): string | undefined {
  if (v === null) return 'z';
  switch (typeof v) {
    case 'string':
      if ((seen.chars -= v.length) < 0) throw tooLargeToCompare();
      return `s${v.length}:${v}`;
    case 'boolean':
      return v ? 't' : 'f';
  }
  if (typeof v === 'bigint' || typeof v === 'number' || (typeof v === 'object' && className(v) === 'UnsignedInt')) {
    const k = numberKey(v);
    return k === undefined ? undefined : `n${k};`;
  }
  if (v instanceof Uint8Array) {
    if ((seen.chars -= v.length) < 0) throw tooLargeToCompare();
    return `b${v.length}:${Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString('latin1')}`;
  }
  if (v instanceof Date) return Number.isNaN(v.getTime()) ? undefined : `T${v.getTime()};`;
  const obj = v as object;
  const name = className(obj);
  if (name === 'Duration') return `D${(v as { seconds: bigint }).seconds}.${(v as { nanos: number }).nanos};`;
  if (name === 'Type') return `Y${(v as { name: string }).name};`;
  const items = listItems(v);
  const entries = items === undefined ? mapEntries(v) : undefined;
  if (items === undefined && entries === undefined) {
    let id = seen.ids.get(obj);
    if (id === undefined) seen.ids.set(obj, (id = seen.nextId++));
    return `o${id};`;
  }
  if (depth >= MAX_VALUE_DEPTH) throw evalError('invalid_argument', `distinct(): value nested more than ${MAX_VALUE_DEPTH} deep`);
  if ((seen.chars -= 1 + (items ?? entries!).length) < 0) throw tooLargeToCompare();
  if (items !== undefined) {
    let key = `l${items.length}[`;
    for (const e of items) {
      const k = equalityKey(e, depth + 1, seen);
      if (k === undefined) return undefined;
      key += k;
    }
    return `${key}]`;
  }
  // A map: its entries' keys, in an order independent of the map's (its keys are unique).
  const pairs: string[] = [];
  for (const [k, e] of entries!) {
    const kk = equalityKey(k, depth + 1, seen);
    const ek = equalityKey(e, depth + 1, seen);
    if (kk === undefined || ek === undefined) return undefined;
    pairs.push(kk + ek);
  }
  return `m${pairs.length}{${pairs.sort().join('')}}`;
}

const tooLargeToCompare = () => evalError('invalid_argument', `distinct(): elements too large to compare (over ${MAX_DISTINCT_CHARS} characters together)`);

/** `l.distinct()`: strings, numbers, bools and null looked up as they are, other values by an equality key. */
export function listDistinct(list: readonly unknown[]): unknown[] {
  if (list.length > MAX_BUILT_LIST) throw tooLongList('distinct()', list.length);
  const seen: Seen = { strings: new Set(), numbers: new Set(), scalars: new Set(), keys: new Set(), chars: MAX_DISTINCT_CHARS, ids: new WeakMap(), nextId: 0 };
  const out: unknown[] = [];
  const first = <T>(set: Set<T>, k: T) => !set.has(k) && (set.add(k), true);
  for (const v of list) {
    let isNew: boolean;
    if (typeof v === 'string') {
      if ((seen.chars -= v.length) < 0) throw tooLargeToCompare();
      isNew = first(seen.strings, v);
    } else if (v === null || typeof v === 'boolean') isNew = first(seen.scalars, v);
    else if (typeof v === 'bigint' || typeof v === 'number' || (typeof v === 'object' && className(v) === 'UnsignedInt')) {
      const k = numberKey(v);
      isNew = k === undefined || first(seen.numbers, k);
    } else {
      const k = equalityKey(v, 0, seen);
      isNew = k === undefined || first(seen.keys, k);
    }
    if (isNew) out.push(v);
  }
  return out;
}

/** A parsed call argument (cel-js AST node). */
interface ArgNode {
  op: string;
  args: unknown;
}
/** A comprehension scope of the checker (`forkWithVariable`), reused at evaluation with each element bound. */
interface BindCtx {
  reuse(parent: unknown): { setIterValue(v: unknown, ev: unknown): unknown };
}
interface SortByMacro {
  bindCtx?: BindCtx;
}

/**
 * `l.sortBy(x, key)`: a macro, as the library's `cel.bind` is one (the variable bound in a scope
 * of its own while the key is type-checked, each element bound in it at evaluation). Every call
 * `a.sortBy(b, c)` is expanded here (the library finds macros by name and argument count); a
 * receiver that is not a list does not compile.
 */
function sortByMacro({ ast, args, receiver }: { ast: unknown; args: ArgNode[]; receiver: unknown }) {
  const [varNode, keyNode] = args as [ArgNode, ArgNode];
  const name = varNode.op === 'id' && typeof varNode.args === 'string' ? varNode.args : undefined;
  return {
    async: false,
    typeCheck(checker: MacroChecker, macro: SortByMacro, ctx: { forkWithVariable(name: string, type: CheckedType): BindCtx }) {
      if (name === undefined) throw checker.createError('invalid_macro_argument', 'sortBy(var, key): the first argument must be a variable name', varNode);
      const lt = checker.check(receiver, ctx);
      if (lt.kind !== 'list' && lt.kind !== 'dyn') throw checker.createError('no_matching_overload', `found no matching overload for '${lt.name}.sortBy(var, key)'`, ast);
      macro.bindCtx = ctx.forkWithVariable(name, lt.kind === 'list' ? lt.valueType! : lt);
      const kt = checker.check(keyNode, macro.bindCtx);
      if (kt.kind !== 'dyn' && kt.kind !== 'param' && !COMPARABLE_TYPES.includes(kt.name)) {
        throw checker.createError('invalid_argument', `sortBy(): the key must be an int, uint, double, bool, string, bytes, duration or timestamp, got ${kt.name}`, keyNode);
      }
      return lt;
    },
    evaluate(ev: MacroEvaluator, macro: SortByMacro, ctx: unknown): unknown[] {
      const list = asList(ev.run(receiver, ctx), 'sortBy()');
      if (list.length > MAX_BUILT_LIST) throw tooLongList('sortBy()', list.length);
      if (!macro.bindCtx) throw evalError('invalid_argument', 'sortBy(): not type-checked');
      const scope = macro.bindCtx.reuse(ctx);
      const keys = list.map((e) => {
        const k = ev.run(keyNode, scope.setIterValue(e, ev));
        if (k instanceof Promise) throw evalError('invalid_argument', 'sortBy(): the key cannot be computed asynchronously');
        return k;
      });
      return sortByKeys(list, keys);
    },
  };
}

/** Registers `slice`, `flatten`, `sort`, `sortBy` and `distinct` on lists. */
export function registerListMacros(env: Environment): void {
  env
    .registerFunction('list<A>.slice(int, int): list<A>', (l: unknown, start: bigint, end: bigint) => listSlice(asList(l, 'slice()'), start, end))
    .registerFunction('list.flatten(): list', (l: unknown) => listFlatten(asList(l, 'flatten()')))
    .registerFunction('list.flatten(int): list', (l: unknown, depth: bigint) => listFlatten(asList(l, 'flatten()'), depth))
    .registerFunction('list<A>.sort(): list<A>', (l: unknown) => listSort(asList(l, 'sort()')))
    .registerFunction('list<A>.distinct(): list<A>', (l: unknown) => listDistinct(asList(l, 'distinct()')))
    .registerFunction('list.sortBy(ast, ast): list', sortByMacro as never);
}
