/**
 * Validation of the `set-vars` and `log` actions (the ingress runs them:
 * `services/ingress/src/policy/var-actions.ts`). Semantics follow ngrok's:
 * - https://ngrok.com/docs/traffic-policy/actions/set-vars
 * - https://ngrok.com/docs/traffic-policy/actions/log
 *
 * Both take values written as YAML/JSON: strings, numbers, booleans, null, lists and mappings,
 * nested. A string may interpolate CEL (`${expr}`, see `parseTemplate`); a string that is
 * exactly one `${expr}` takes the expression's value with its type (a list stays a list, an int
 * an int), while text with `${…}` inside it is a string. Every `${expr}` is compiled for the
 * rule's direction when the policy is saved (a bad one is a 400 naming it) and costed with the
 * rule expressions.
 *
 * `set-vars`: `vars` is a list of one-entry mappings `name: value`, set in order, so a later
 * entry (or the same name again) can read an earlier one. Variables are scoped to one direction,
 * as ngrok scopes them to a phase: `inbound` rules cannot read what `outbound` rules set, nor the
 * reverse. Reading a variable that was never set is an evaluation error (the rule is skipped),
 * so `has(vars.x)` tests for one. Bounds (ngrok documents none; these are Warren's, so that the
 * cost estimate of expressions reading `vars` holds): names are CEL identifiers of at most
 * `VARS_LIMITS.nameChars` characters, at most `VARS_LIMITS.names` distinct names per direction,
 * and a value weighs at most `VARS_LIMITS.valueWeight` (see `varValueWeight`).
 *
 * `log`: `metadata` is a mapping of at most `LOG_LIMITS.keys` keys; the ingress adds the
 * evaluated mapping to the request's `http_request_complete.v0` event under
 * `traffic_policy.logs[].metadata`, bounded per value, per action and per request (`LOG_LIMITS`).
 */
import { evaluate } from '@marcbachmann/cel-js';
import { CelCompileError, compileExpression, parseTemplate, type CelProgram } from './cel.js';
import { VARS_LIMITS } from './cost.js';
import { at, expectList, expectObj, noUnknownKeys, phaseKey, TrafficPolicyError, typeName } from './parse.js';
import type { LogAction, PolicyDirection, PolicyValue, SetVarsAction, TrafficPolicy } from './types.js';

export { VARS_LIMITS };

/** Nesting of lists and mappings in a written value (set-vars and log). */
const VALUE_DEPTH = 8;

export const SET_VARS_LIMITS = {
  /** Entries in one action's `vars` list. */
  entries: 64,
  /** Nesting of lists and mappings in a written value. */
  depth: VALUE_DEPTH,
} as const;

export const LOG_LIMITS = {
  /** Keys of one action's `metadata`. */
  keys: 32,
  /** Characters of a metadata key. */
  keyChars: 128,
  /**
   * Characters of one value as JSON, written or evaluated: an evaluated value over it is left
   * out of the event (and counted as an evaluation error), never cut.
   */
  valueChars: 4096,
  /** Characters of one action's metadata as JSON: keys past it are left out. */
  entryChars: 16 * 1024,
  /** Log entries one request carries (both directions): later ones are left out. */
  requestEntries: 32,
  /** Characters of all of a request's log entries as JSON: later entries are left out. */
  requestChars: 64 * 1024,
  /** Nesting of lists and mappings in a written value. */
  depth: VALUE_DEPTH,
} as const;

/** A variable name: a CEL identifier, so `vars.<name>` reads it. */
const VAR_NAME_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;
/** Control characters, not allowed in a metadata key. */
const CONTROL_RE = /[\u0000-\u001f\u007f-\u009f]/;

/** Where compiled `${expr}` programs go (the cost check of `parse.ts`). */
export type ProgramSink = (path: string, program: CelProgram) => void;

const isMapping = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** cel-js's `uint` and `duration` value classes (not exported by the package). */
const UINT_CTOR = (evaluate('1u') as object).constructor;
const DURATION_CTOR = (evaluate("duration('1s')") as object).constructor;

/** A cel-js `uint` value's number; undefined for anything else. */
export function celUintValue(v: unknown): bigint | undefined {
  return typeof v === 'object' && v !== null && v.constructor === UINT_CTOR ? (v as { value: bigint }).value : undefined;
}

/** A cel-js `duration` value (prints as `1.5s`). */
export function isCelDuration(v: unknown): boolean {
  return typeof v === 'object' && v !== null && v.constructor === DURATION_CTOR;
}

/**
 * The weight of a value a variable may hold: the characters of its strings (and bytes of its
 * bytes) plus one per scalar, list element and map entry, map keys counted as values, at any
 * depth. Stops counting once past `limit` (returns a number over it), so measuring costs at most
 * `limit` steps whatever the value. Throws `TypeError` for a value that is not plain CEL data
 * (an object such as `req` or `conn.tls`).
 */
export function varValueWeight(v: unknown, limit: number): number {
  let w = 0;
  const stack: unknown[] = [v];
  while (stack.length > 0) {
    if (w > limit) return w;
    const x = stack.pop();
    if (typeof x === 'string') w += x.length;
    else if (x === null || typeof x === 'number' || typeof x === 'bigint' || typeof x === 'boolean') w += 1;
    else if (x instanceof Uint8Array) w += x.length;
    else if (Array.isArray(x) || x instanceof Set) {
      for (const e of x) {
        w += 1;
        if (w > limit) return w;
        stack.push(e);
      }
    } else if (x instanceof Map) {
      for (const [k, e] of x) {
        w += 1;
        if (w > limit) return w;
        stack.push(k, e);
      }
    } else if (typeof x === 'object' && (x.constructor === Object || Object.getPrototypeOf(x) === null)) {
      for (const k in x) {
        w += 1 + k.length;
        if (w > limit) return w;
        stack.push((x as Record<string, unknown>)[k]);
      }
    } else if (x instanceof Date || (typeof x === 'object' && (x.constructor === UINT_CTOR || x.constructor === DURATION_CTOR))) w += 1;
    else throw new TypeError(`a ${cleanTypeName(x)} is not a value a variable or log can hold`);
  }
  return w;
}

function cleanTypeName(x: unknown): string {
  if (typeof x === 'object' && x !== null) return x.constructor?.name ?? 'object';
  return typeof x;
}

/**
 * A written value: scalars as they are (a number must be finite), lists and mappings checked to
 * `depth`, every `${expr}` in a string compiled for `direction` and handed to `sink`.
 */
function parseValue(v: unknown, path: string, direction: PolicyDirection, sink: ProgramSink, depth: number): PolicyValue {
  if (typeof v === 'string') {
    try {
      for (const part of parseTemplate(v)) {
        if (typeof part !== 'string') sink(path, compileExpression(direction, part.expr, false));
      }
    } catch (err) {
      if (err instanceof CelCompileError) throw new TrafficPolicyError(path, `\${…} ${err.reason}`);
      throw err;
    }
    return v;
  }
  if (typeof v === 'number') {
    if (!Number.isFinite(v)) throw new TrafficPolicyError(path, `must be a finite number, got ${String(v)}`);
    return v;
  }
  if (typeof v === 'boolean' || v === null) return v;
  if (Array.isArray(v) || isMapping(v)) {
    if (depth <= 0) throw new TrafficPolicyError(path, `lists and mappings are nested too deep (at most ${VALUE_DEPTH} levels)`);
    if (Array.isArray(v)) return v.map((e, i) => parseValue(e, at(path, i), direction, sink, depth - 1));
    const out: Record<string, PolicyValue> = {};
    for (const [k, e] of Object.entries(v)) {
      Object.defineProperty(out, k, { value: parseValue(e, at(path, k), direction, sink, depth - 1), enumerable: true, writable: true, configurable: true });
    }
    return out;
  }
  throw new TrafficPolicyError(path, `must be a string, number, bool, null, list or mapping, got ${typeName(v)}`);
}

/** `set-vars` config: `vars`, a non-empty list of one-entry mappings `name: value`. */
export function parseSetVarsConfig(raw: unknown, path: string, direction: PolicyDirection, sink: ProgramSink): SetVarsAction['config'] {
  const c = expectObj(raw, path, 'config');
  noUnknownKeys(c, path, ['vars']);
  const listPath = at(path, 'vars');
  const list = expectList(c.vars, listPath, false);
  if (list.length === 0) throw new TrafficPolicyError(listPath, 'must set at least one variable');
  if (list.length > SET_VARS_LIMITS.entries) throw new TrafficPolicyError(listPath, `must have at most ${SET_VARS_LIMITS.entries} entries, got ${list.length}`);
  const vars = list.map((e, i) => {
    const p = at(listPath, i);
    if (!isMapping(e)) throw new TrafficPolicyError(p, `must be a mapping of one variable name to its value (e.g. \`- name: value\`), got ${typeName(e)}`);
    const names = Object.keys(e);
    if (names.length !== 1) throw new TrafficPolicyError(p, `must set exactly one variable (write one \`- name: value\` entry per variable), got ${names.length} keys`);
    const name = names[0]!;
    if (name.length > VARS_LIMITS.nameChars) throw new TrafficPolicyError(p, `variable name is over ${VARS_LIMITS.nameChars} characters`);
    if (!VAR_NAME_RE.test(name))
      throw new TrafficPolicyError(p, `${JSON.stringify(name)} is not a valid variable name: use letters, digits and _, not starting with a digit, so that vars.<name> can read it`);
    const vp = at(p, name);
    const value = parseValue(e[name], vp, direction, sink, SET_VARS_LIMITS.depth);
    const weight = varValueWeight(value, VARS_LIMITS.valueWeight);
    if (weight > VARS_LIMITS.valueWeight)
      throw new TrafficPolicyError(vp, `value is too large: a variable holds at most ${VARS_LIMITS.valueWeight} characters and elements in all`);
    const entry: Record<string, PolicyValue> = {};
    Object.defineProperty(entry, name, { value, enumerable: true, writable: true, configurable: true });
    return entry;
  });
  return { vars };
}

/** `log` config: `metadata`, a non-empty mapping of keys to values. */
export function parseLogConfig(raw: unknown, path: string, direction: PolicyDirection, sink: ProgramSink): LogAction['config'] {
  const c = expectObj(raw, path, 'config');
  noUnknownKeys(c, path, ['metadata']);
  const mp = at(path, 'metadata');
  if (c.metadata === undefined || c.metadata === null) throw new TrafficPolicyError(mp, 'is required');
  const m = expectObj(c.metadata, mp, 'metadata');
  const keys = Object.keys(m);
  if (keys.length === 0) throw new TrafficPolicyError(mp, 'must have at least one key');
  if (keys.length > LOG_LIMITS.keys) throw new TrafficPolicyError(mp, `must have at most ${LOG_LIMITS.keys} keys, got ${keys.length}`);
  const metadata: Record<string, PolicyValue> = {};
  let chars = 2;
  for (const k of keys) {
    const p = at(mp, k);
    if (k.length === 0) throw new TrafficPolicyError(p, 'a metadata key must not be empty');
    if (k.length > LOG_LIMITS.keyChars) throw new TrafficPolicyError(p, `metadata key is over ${LOG_LIMITS.keyChars} characters`);
    if (CONTROL_RE.test(k)) throw new TrafficPolicyError(p, 'metadata key has a control character');
    const value = parseValue(m[k], p, direction, sink, LOG_LIMITS.depth);
    const json = JSON.stringify(value).length;
    if (json > LOG_LIMITS.valueChars) throw new TrafficPolicyError(p, `value is over ${LOG_LIMITS.valueChars} characters (as JSON)`);
    chars += JSON.stringify(k).length + 2 + json;
    if (chars > LOG_LIMITS.entryChars) throw new TrafficPolicyError(p, `the metadata is over ${LOG_LIMITS.entryChars} characters (as JSON) with this key`);
    Object.defineProperty(metadata, k, { value, enumerable: true, writable: true, configurable: true });
  }
  return { metadata };
}

/**
 * Policy-wide bound of `set-vars`: at most `VARS_LIMITS.names` distinct variable names per
 * direction (so `vars` never has more entries). Throws `TrafficPolicyError` naming the entry
 * that introduces one too many.
 */
export function checkVarNames(policy: TrafficPolicy): void {
  for (const direction of ['inbound', 'outbound'] as const) {
    const names = new Set<string>();
    policy[direction].forEach((rule, i) => {
      rule.actions.forEach((a, j) => {
        if (a.type !== 'set-vars') return;
        a.config.vars.forEach((entry, k) => {
          const name = Object.keys(entry)[0]!;
          if (names.has(name)) return;
          names.add(name);
          if (names.size > VARS_LIMITS.names)
            throw new TrafficPolicyError(`${phaseKey(policy, direction)}[${i}].actions[${j}].config.vars[${k}]`, `too many variables: a policy sets at most ${VARS_LIMITS.names} distinct names per direction`);
        });
      });
    });
  }
}
