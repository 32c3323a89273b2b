import { isAlias, isMap, isScalar, isSeq, visit, type Document } from 'yaml';

/**
 * A bound on how deeply a traffic policy document nests, read off its text before any YAML
 * parser sees it. The `yaml` package builds and converts documents recursively; a document nested
 * some 900 levels deep exhausts the stack, and when that happens while V8 compiles a regular
 * expression the process aborts (SIGABRT) instead of throwing: one ~2 KB POST took a control
 * plane down. Catching the RangeError is therefore not enough; such a document is refused here.
 *
 * The scan is a conservative lexer, in one pass:
 * - flow collections: `[` / `{` open and `]` / `}` close one level, outside quoted scalars and
 *   comments; in block context only where a node can start (the line's first token, after
 *   `- `, `? `, `: `), since a plain scalar may hold brackets there (`a: b[c`);
 * - block collections: each level needs one more column of indentation or one more indicator on
 *   the same line (`- - x`, `- a: b`), so a line's indentation plus its indicators bounds the
 *   block depth at that line (mappings and their sequences may share a column, hence at most
 *   twice that);
 * - quoted scalars (`"…"` with `\` escapes, `'…'` with `''`), comments and the content lines of
 *   block scalars (`|`, `>`) are skipped.
 * It may overcount (unbalanced brackets in a block scalar's plain text, say), never undercount;
 * the limits are far above what a policy needs and far below what breaks the parser.
 */

/** Flow collections open at once (JSON nesting), at most. */
export const MAX_FLOW_DEPTH = 64;
/** A line's indentation plus its block indicators, at most (outside flow collections). */
export const MAX_BLOCK_BOUND = 128;

export interface NestingProblem {
  /** 1-based line of the first place over a limit. */
  line: number;
  message: string;
}

const isSpace = (c: number) => c === 0x20 || c === 0x09;
const isBreak = (c: number) => c === 0x0a || c === 0x0d;

export function nestingProblem(text: string): NestingProblem | null {
  let line = 1;
  let flow = 0;
  let i = 0;
  const n = text.length;
  /** Indentation of the line that opened a block scalar whose content lines are being skipped; -1 when none. */
  let blockScalarParent = -1;
  while (i < n) {
    // Start of a line: its indentation.
    const lineStart = i;
    let indent = 0;
    while (i < n && text.charCodeAt(i) === 0x20) (indent++, i++);
    if (blockScalarParent >= 0) {
      const c = i < n ? text.charCodeAt(i) : 0x0a;
      if (isBreak(c) || indent > blockScalarParent) {
        // Content (or a blank line) of the block scalar.
        while (i < n && !isBreak(text.charCodeAt(i))) i++;
        if (i < n && text.charCodeAt(i) === 0x0d && text.charCodeAt(i + 1) === 0x0a) i++;
        i++;
        line++;
        continue;
      }
      blockScalarParent = -1;
    }
    const lineIndent = indent;
    const startedInFlow = flow > 0;
    let indicators = 0;
    /** The last token was a quoted scalar or a closed flow collection: a `:` right after it is an indicator (`"a":[`). */
    let jsonLike = false;
    /** Columns of the last token that started (a key, once a `:` follows it) and of the last `-`: a block scalar's content is indented more than its parent node. */
    let tokenCol = indent;
    let keyCol = -1;
    let dashCol = -1;
    // A node may start here (line start, after an indicator, after `[`, `{` or `,` in flow).
    let nodeStart = true;
    let lineEnded = false;
    while (i < n && !lineEnded) {
      const c = text.charCodeAt(i);
      if (isBreak(c)) {
        if (c === 0x0d && text.charCodeAt(i + 1) === 0x0a) i++;
        i++;
        line++;
        lineEnded = true;
        break;
      }
      if (isSpace(c)) {
        i++;
        jsonLike = false;
        continue;
      }
      if (c === 0x23 /* # */ && (i === 0 || isSpace(text.charCodeAt(i - 1)) || isBreak(text.charCodeAt(i - 1)))) {
        while (i < n && !isBreak(text.charCodeAt(i))) i++;
        continue;
      }
      if ((c === 0x22 /* " */ || c === 0x27) /* ' */ && nodeStart) {
        // A quoted scalar, possibly over several lines.
        tokenCol = i - lineStart;
        i++;
        while (i < n) {
          const d = text.charCodeAt(i);
          if (isBreak(d)) line += d === 0x0d && text.charCodeAt(i + 1) === 0x0a ? 0 : 1;
          if (c === 0x22 && d === 0x5c /* \ */) {
            i += 2;
            continue;
          }
          if (d === c) {
            if (c === 0x27 && text.charCodeAt(i + 1) === 0x27) {
              i += 2;
              continue;
            }
            i++;
            break;
          }
          i++;
        }
        nodeStart = false;
        jsonLike = true;
        continue;
      }
      if ((c === 0x5b /* [ */ || c === 0x7b) /* { */ && (flow > 0 || nodeStart)) {
        flow++;
        if (flow > MAX_FLOW_DEPTH) return { line, message: `nested more than ${MAX_FLOW_DEPTH} levels deep (flow collections: [ ] and { }) at line ${line}` };
        i++;
        nodeStart = true;
        continue;
      }
      if ((c === 0x5d /* ] */ || c === 0x7d) /* } */ && flow > 0) {
        flow--;
        i++;
        nodeStart = false;
        jsonLike = true;
        continue;
      }
      if (c === 0x2c /* , */ && flow > 0) {
        i++;
        nodeStart = true;
        continue;
      }
      const next = i + 1 < n ? text.charCodeAt(i + 1) : 0x0a;
      const followedBySpace = isSpace(next) || isBreak(next);
      if ((c === 0x2d /* - */ || c === 0x3f) /* ? */ && nodeStart && followedBySpace) {
        if (flow === 0) indicators++;
        if (c === 0x2d) dashCol = i - lineStart;
        i++;
        continue;
      }
      if (c === 0x3a /* : */ && (followedBySpace || flow > 0 || jsonLike)) {
        if (flow === 0) {
          indicators++;
          keyCol = tokenCol;
        }
        i++;
        nodeStart = true;
        continue;
      }
      if ((c === 0x7c /* | */ || c === 0x3e) /* > */ && nodeStart && flow === 0) {
        // A block scalar: its content is the following lines indented more than its parent node
        // (the key before the `:`, else the `-` of its sequence entry, else the line).
        blockScalarParent = keyCol >= 0 ? keyCol : dashCol >= 0 ? dashCol : lineIndent;
        while (i < n && !isBreak(text.charCodeAt(i))) i++;
        continue;
      }
      jsonLike = false;
      tokenCol = i - lineStart;
      // Anything else: a plain scalar (or a tag / anchor / alias) runs to the next indicator.
      nodeStart = c === 0x26 /* & */ || c === 0x21; /* ! */ // an anchor or tag precedes its node
      if (nodeStart) {
        while (i < n && !isSpace(text.charCodeAt(i)) && !isBreak(text.charCodeAt(i))) i++;
        continue;
      }
      i++;
      while (i < n) {
        const d = text.charCodeAt(i);
        if (isBreak(d)) break;
        if (flow > 0 && (d === 0x2c || d === 0x5b || d === 0x5d || d === 0x7b || d === 0x7d)) break;
        if (d === 0x3a && (i + 1 >= n || isSpace(text.charCodeAt(i + 1)) || isBreak(text.charCodeAt(i + 1)) || flow > 0)) break;
        if (d === 0x23 && isSpace(text.charCodeAt(i - 1))) break;
        i++;
      }
    }
    if (!startedInFlow && flow === 0 && lineIndent + indicators > MAX_BLOCK_BOUND) {
      return { line: lineEnded ? line - 1 : line, message: `indented or nested too deeply at line ${lineEnded ? line - 1 : line} (more than ${MAX_BLOCK_BOUND} columns and block indicators)` };
    }
  }
  return null;
}

/** How often one anchor may be used (`toJS`'s `maxAliasCount`). */
export const MAX_ALIASES = 100;
/** Most aliases (`*name`) in a whole document: refused before anything expands or resolves them. */
export const MAX_DOCUMENT_ALIASES = 1_000;

/** What {@link documentIndex} finds in one walk of a document. */
export interface DocumentIndex {
  /** Each alias node with the node it stands for (undefined: no such anchor before it). */
  targets: Map<unknown, unknown>;
  /** The first key written twice in one map, as text; null when none. */
  duplicateKey: string | null;
}

const indexes = new WeakMap<Document, DocumentIndex>();

/**
 * One walk of `doc` in document order (computed once per document): the node each alias stands
 * for, which is the last node anchored with its name before it, as the `yaml` package's own
 * `Alias.resolve` finds it; but that walks the whole document again for every alias, so 21,000
 * aliases in a 63 KB policy took 85 s, in one Bind or one API call. And the first key repeated in
 * a map, which the parser's `uniqueKeys` finds by comparing every key with every earlier one of its
 * map (6,000 keys: 0.5 s); documents are parsed without it, and this check stands in for it.
 */
export function documentIndex(doc: Document): DocumentIndex {
  const known = indexes.get(doc);
  if (known) return known;
  const anchors = new Map<string, unknown>();
  const ix: DocumentIndex = { targets: new Map(), duplicateKey: null };
  visit(doc, {
    Node(_key, node) {
      if (isAlias(node)) {
        ix.targets.set(node, anchors.get(node.source));
        return;
      }
      if (node.anchor) anchors.set(node.anchor, node);
      if (ix.duplicateKey === null && isMap(node)) {
        const seen = new Set<string>();
        for (const p of node.items) {
          if (!isScalar(p.key)) continue; // (complex keys are never equal to another: as yaml compares them)
          const k = `${typeof p.key.value}:${String(p.key.value)}`;
          if (seen.has(k)) {
            ix.duplicateKey = String(p.key.value).slice(0, 64);
            break;
          }
          seen.add(k);
        }
      }
    },
  });
  indexes.set(doc, ix);
  return ix;
}

/** `n`, or the node it stands for when it is an alias (see {@link documentIndex}). */
export function resolveAlias(doc: Document, n: unknown): unknown {
  return isAlias(n) ? documentIndex(doc).targets.get(n) : n;
}

/**
 * A document's problem that the parser, run without `uniqueKeys`, leaves to us: a key repeated
 * in a map (with the parser's message), or more than {@link MAX_DOCUMENT_ALIASES} aliases; null when none.
 */
export function documentProblem(doc: Document): string | null {
  const ix = documentIndex(doc);
  if (ix.duplicateKey !== null) return `Map keys must be unique (${JSON.stringify(ix.duplicateKey)} is written twice)`;
  if (ix.targets.size > MAX_DOCUMENT_ALIASES) return `more than ${MAX_DOCUMENT_ALIASES} aliases (*name)`;
  return null;
}

/** Values (scalars and collections) a document may expand to through its aliases, at most. */
export const MAX_EXPANDED_VALUES = 250_000;

/**
 * How many values `doc` holds once its aliases are expanded (as `toJS` would build them), counted
 * on the parsed document in time linear in its size, so that a short document whose aliases
 * repeat a long list (a 50 KB one expanded to 250,000 values took over a second, twice: the
 * secrets check parses it too) is refused before it is expanded. Stops counting past `limit`.
 */
export function expandedValues(doc: Document, limit = MAX_EXPANDED_VALUES): number {
  const memo = new Map<unknown, number>();
  const count = (n: unknown): number => {
    const node = resolveAlias(doc, n);
    if (node === undefined || node === null) return 1;
    const known = memo.get(node);
    if (known !== undefined) return known;
    let total = 1;
    if (isMap(node)) {
      for (const p of node.items) {
        total += count(p.key) + count(p.value);
        if (total > limit) break;
      }
    } else if (isSeq(node)) {
      for (const item of node.items) {
        total += count(item);
        if (total > limit) break;
      }
    }
    memo.set(node, total);
    return total;
  };
  return count(doc.contents);
}
