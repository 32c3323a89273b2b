/**
 * The views of cel-js's checker, evaluator and parsed call that our macros receive (cel-js
 * declares them loosely): one place for the fields the macros of `cel.ts`, `list-macros.ts`,
 * `string-index.ts` and `time-zones.ts` use.
 */

/** A type as the checker gives it (`list<string>`: kind `list`, `valueType` string). */
export interface CheckedType {
  name: string;
  kind: string;
  valueType?: CheckedType;
}

/** The checker a macro's type-check hook receives. */
export interface MacroChecker {
  check(node: unknown, ctx: unknown): CheckedType;
  createError(code: string, message: string, node: unknown): Error;
  registry: { getListType(t: unknown): unknown; getType(name: string): unknown };
  stringType: unknown;
  boolType: unknown;
  intType: unknown;
}

/** The evaluator a macro's evaluate hook receives. */
export interface MacroEvaluator {
  run(node: unknown, ctx: unknown): unknown;
  createError(code: string, message: string, node: unknown): Error;
}

/** The parsed call a macro expander receives (cel-js AST nodes: `op`, `args`, `start`, …). */
export interface MacroCall<Arg = unknown> {
  ast: unknown;
  args: Arg[];
  receiver: unknown;
}
