import {
  CelDistinguishedName,
  CelSubjectAltNames,
  CelUrl,
  celUintValue,
  compileExpression,
  isCelDuration,
  LOG_LIMITS,
  parseTemplate,
  VARS_LIMITS,
  varValueWeight,
  type CelProgram,
  type LogAction,
  type PolicyDirection,
  type PolicyValue,
  type SetVarsAction,
} from '@warren/shared';
import type { RequestState } from '../pipeline/types.js';
import type { Activation } from './activation.js';
import { celToHeaderText } from './headers.js';

/**
 * The `set-vars` and `log` traffic-policy actions at run time (validated by
 * `services/shared/src/traffic-policy/var-actions.ts`), compiled once per config version.
 *
 * `set-vars` (https://ngrok.com/docs/traffic-policy/actions/set-vars): sets `vars.<name>` in the
 * run's activation, entry by entry, so later entries, expressions and `${}` of the same direction
 * read it. ngrok scopes variables to a phase; here the inbound rules and the outbound rules each
 * have their own `vars` (an `Activation` per direction). A value that fails to evaluate, is an
 * object that is not plain data (`${req}`), or weighs over `VARS_LIMITS.valueWeight`, leaves the
 * variable as it was and is counted as an evaluation error.
 *
 * `log` (https://ngrok.com/docs/traffic-policy/actions/log): evaluates `metadata` and appends
 * `{metadata}` to the request's policy logs, which `http_request_complete.v0` carries as
 * `traffic_policy.logs` (ngrok's place for them). Only a request whose account subscribes to that
 * event collects logs (`collectPolicyLogs`, called by the event tracker): elsewhere the action
 * evaluates nothing. Every value is converted to JSON under a character budget, so an
 * interpolation that yields a huge value is cut off while being converted, not after; a value
 * over `LOG_LIMITS.valueChars` is left out (and counted), as are keys past `entryChars` and
 * entries past `requestEntries` / `requestChars`.
 */

/** A written value, compiled. `const`: no `${}` anywhere inside (its CEL value and JSON are ready). */
export type CompiledValue =
  | { k: 'const'; cel: unknown; json: PolicyValue; jsonChars: number }
  /** A string that is exactly one `${expr}`: the expression's value. */
  | { k: 'expr'; program: CelProgram }
  /** Text with `${expr}` parts: a string. */
  | { k: 'text'; parts: (string | CelProgram)[] }
  | { k: 'list'; items: CompiledValue[] }
  | { k: 'map'; entries: [string, CompiledValue][] };

export interface CompiledSetVars {
  kind: 'set-vars';
  vars: { name: string; where: string; value: CompiledValue }[];
}

export interface CompiledLog {
  kind: 'log';
  where: string;
  metadata: { key: string; where: string; value: CompiledValue; keyChars: number }[];
}

/** A written literal as a CEL value: a whole number is an `int` (as ngrok reads YAML), maps are Maps. */
function literalCel(v: PolicyValue): unknown {
  if (typeof v === 'number') return Number.isSafeInteger(v) ? BigInt(v) : v;
  if (Array.isArray(v)) return v.map(literalCel);
  if (v !== null && typeof v === 'object') return new Map(Object.entries(v).map(([k, e]) => [k, literalCel(e)]));
  return v;
}

function constant(v: PolicyValue): CompiledValue {
  return { k: 'const', cel: literalCel(v), json: v, jsonChars: JSON.stringify(v).length };
}

export function compileValue(v: PolicyValue, direction: PolicyDirection): CompiledValue {
  if (typeof v === 'string') {
    const parts = parseTemplate(v);
    if (parts.every((p) => typeof p === 'string')) return constant(v);
    if (parts.length === 1) return { k: 'expr', program: compileExpression(direction, (parts[0] as { expr: string }).expr, false) };
    return { k: 'text', parts: parts.map((p) => (typeof p === 'string' ? p : compileExpression(direction, p.expr, false))) };
  }
  if (Array.isArray(v)) {
    const items = v.map((e) => compileValue(e, direction));
    return items.every((i) => i.k === 'const') ? constant(v) : { k: 'list', items };
  }
  if (v !== null && typeof v === 'object') {
    const entries = Object.entries(v).map(([k, e]) => [k, compileValue(e, direction)] as [string, CompiledValue]);
    return entries.every(([, i]) => i.k === 'const') ? constant(v) : { k: 'map', entries };
  }
  return constant(v);
}

/** `where`: the action's path, e.g. `inbound[0].actions[1]`. */
export function compileSetVars(config: SetVarsAction['config'], direction: PolicyDirection, where: string): CompiledSetVars {
  return {
    kind: 'set-vars',
    vars: config.vars.map((entry, i) => {
      const name = Object.keys(entry)[0]!;
      return { name, where: `${where}.config.vars[${i}]`, value: compileValue(entry[name]!, direction) };
    }),
  };
}

export function compileLog(config: LogAction['config'], direction: PolicyDirection, where: string): CompiledLog {
  return {
    kind: 'log',
    where,
    metadata: Object.entries(config.metadata).map(([key, v]) => ({ key, where: `${where}.config.metadata.${key}`, value: compileValue(v, direction), keyChars: JSON.stringify(key).length + 2 })),
  };
}

/** Reports an evaluation failure at `where` (the engine's `failed`: counted, logged once). */
export type FailedFn = (where: string, err: unknown) => void;

/** `req.url`, a certificate's `subject` / `issuer` / `san`: they stand for their string. */
function stringLike(v: unknown): string | undefined {
  return v instanceof CelUrl || v instanceof CelDistinguishedName || v instanceof CelSubjectAltNames ? v.toString() : undefined;
}

class TooLarge extends Error {}

/**
 * Text with `${}` parts (ngrok: every interpolated part becomes a string): strings as they are,
 * numbers and bools as CEL prints them, null as `''`, timestamps RFC 3339, lists joined with `, `
 * (as add-headers writes them), maps as JSON. Throws `TooLarge` past `limit` characters.
 */
function text(parts: (string | CelProgram)[], act: Activation, limit: number): string {
  let out = '';
  for (const p of parts) {
    out += typeof p === 'string' ? p : partText(p(act), limit - out.length);
    if (out.length > limit) throw new TooLarge(`the interpolated text is over ${limit} characters`);
  }
  return out;
}

function partText(v: unknown, limit: number): string {
  if (typeof v === 'string') return v;
  const s = stringLike(v);
  if (s !== undefined) return s;
  if (v instanceof Uint8Array) return Buffer.from(v).toString('utf8');
  if (Array.isArray(v)) {
    let out = '';
    for (const e of v) {
      out += (out ? ', ' : '') + partText(e, limit - out.length);
      if (out.length > limit) throw new TooLarge(`the interpolated text is over its limit`);
    }
    return out;
  }
  if (v instanceof Map || (typeof v === 'object' && v !== null && (v.constructor === Object || Object.getPrototypeOf(v) === null))) {
    return JSON.stringify(toJson(v, { left: limit }));
  }
  return celToHeaderText(v);
}

// ------------------------------------------------------------------ set-vars

/** A variable's value: evaluated, string-likes as their string. Throws on a failure. */
function varValue(c: CompiledValue, act: Activation): unknown {
  switch (c.k) {
    case 'const':
      return c.cel;
    case 'expr': {
      const v = c.program(act);
      return stringLike(v) ?? v;
    }
    case 'text':
      return text(c.parts, act, VARS_LIMITS.valueWeight);
    case 'list':
      return c.items.map((i) => varValue(i, act));
    case 'map':
      return new Map(c.entries.map(([k, i]) => [k, varValue(i, act)]));
  }
}

export function runSetVars(act: Activation, a: CompiledSetVars, failed: FailedFn): void {
  const vars = act.vars;
  for (const v of a.vars) {
    let value: unknown;
    try {
      value = varValue(v.value, act);
      if (v.value.k !== 'const' && varValueWeight(value, VARS_LIMITS.valueWeight) > VARS_LIMITS.valueWeight)
        throw new TooLarge(`the value of vars.${v.name} is too large (over ${VARS_LIMITS.valueWeight} characters and elements): not set`);
    } catch (err) {
      failed(v.where, err);
      continue;
    }
    vars.set(v.name, value);
  }
}

// ------------------------------------------------------------------ log

/** One executed `log` action, as the event shows it. */
export interface PolicyLogEntry {
  metadata: Record<string, unknown>;
}

/** A request's policy logs (`s.vars.policy_logs`), present only when its traffic event is wanted. */
export class PolicyLogs {
  readonly entries: PolicyLogEntry[] = [];
  /** Characters of the entries as JSON, about. */
  chars = 0;
}

const LOGS = 'policy_logs';
/** `s.vars.policy_logs` of a request that collects logs but has none yet (no allocation per request). */
const COLLECT = Symbol('collect policy logs');

/** Called for a request whose `http_request_complete.v0` will be emitted: its `log` actions record. */
export function collectPolicyLogs(s: RequestState): void {
  if (s.vars[LOGS] === undefined) s.vars[LOGS] = COLLECT;
}

/** The request's log entries, or null when none were recorded. */
export function policyLogsOf(s: RequestState | null): PolicyLogEntry[] | null {
  const logs = s?.vars[LOGS];
  return logs instanceof PolicyLogs && logs.entries.length > 0 ? logs.entries : null;
}

interface Budget {
  left: number;
}

function spend(b: Budget, n: number): void {
  if ((b.left -= n) < 0) throw new TooLarge('the value is too large to log');
}

function jsonNumber(n: bigint): number | string {
  return n >= BigInt(Number.MIN_SAFE_INTEGER) && n <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(n) : n.toString();
}

/**
 * A CEL value as JSON, spending `budget` by the characters it takes (about: structure is counted
 * one character per element), so converting stops as soon as the value is too large. ints beyond
 * 2^53 and non-finite doubles become strings, timestamps RFC 3339, durations `1.5s`, bytes base64,
 * `req.url` and certificate names their string. Throws `TypeError` for other objects.
 */
function toJson(v: unknown, budget: Budget, depth = 0): unknown {
  if (depth > 64) throw new TooLarge('the value is nested too deep to log');
  switch (typeof v) {
    case 'string': {
      if (v.length > budget.left) throw new TooLarge('the value is too large to log');
      spend(budget, JSON.stringify(v).length);
      return v;
    }
    case 'number':
      spend(budget, 24);
      return Number.isFinite(v) ? v : String(v);
    case 'bigint':
      spend(budget, 20);
      return jsonNumber(v);
    case 'boolean':
      spend(budget, 5);
      return v;
  }
  if (v === null) {
    spend(budget, 4);
    return null;
  }
  const s = stringLike(v);
  if (s !== undefined) return toJson(s, budget, depth);
  if (v instanceof Date) return toJson(Number.isNaN(v.getTime()) ? 'Invalid Date' : v.toISOString(), budget, depth);
  if (v instanceof Uint8Array) {
    if (v.byteLength > budget.left) throw new TooLarge('the value is too large to log');
    return toJson(Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString('base64'), budget, depth);
  }
  if (Array.isArray(v) || v instanceof Set) {
    const out: unknown[] = [];
    for (const e of v) {
      spend(budget, 1);
      out.push(toJson(e, budget, depth + 1));
    }
    spend(budget, 2);
    return out;
  }
  const out: Record<string, unknown> = Object.create(null) as Record<string, unknown>;
  if (v instanceof Map) {
    for (const [k, e] of v) {
      const key = typeof k === 'string' ? k : String(k);
      spend(budget, key.length + 4);
      out[key] = toJson(e, budget, depth + 1);
    }
    spend(budget, 2);
    return out;
  }
  if (typeof v === 'object' && v !== null && (v.constructor === Object || Object.getPrototypeOf(v) === null)) {
    for (const k in v) {
      spend(budget, k.length + 4);
      out[k] = toJson((v as Record<string, unknown>)[k], budget, depth + 1);
    }
    spend(budget, 2);
    return out;
  }
  // cel-js uint and duration: their number / text.
  const u = celUintValue(v);
  if (u !== undefined) return toJson(u, budget, depth);
  if (isCelDuration(v)) return toJson(String(v), budget, depth);
  throw new TypeError(`a ${typeof v === 'object' && v !== null ? (v.constructor?.name ?? 'object') : typeof v} cannot be logged`);
}

function logValue(c: CompiledValue, act: Activation, budget: Budget): unknown {
  switch (c.k) {
    case 'const':
      spend(budget, c.jsonChars);
      return c.json;
    case 'expr':
      return toJson(c.program(act), budget);
    case 'text':
      return toJson(text(c.parts, act, budget.left), budget);
    case 'list': {
      const out: unknown[] = [];
      for (const i of c.items) {
        spend(budget, 1);
        out.push(logValue(i, act, budget));
      }
      spend(budget, 2);
      return out;
    }
    case 'map': {
      const out = Object.create(null) as Record<string, unknown>;
      for (const [k, i] of c.entries) {
        spend(budget, JSON.stringify(k).length + 1);
        out[k] = logValue(i, act, budget);
      }
      spend(budget, 2);
      return out;
    }
  }
}

export function runLog(act: Activation, a: CompiledLog, failed: FailedFn): void {
  const mark = act.s.vars[LOGS];
  // Nobody will see the event: nothing to evaluate.
  if (mark === undefined) return;
  const logs = mark instanceof PolicyLogs ? mark : (act.s.vars[LOGS] = new PolicyLogs());
  if (logs.entries.length >= LOG_LIMITS.requestEntries) {
    failed(a.where, new TooLarge(`more than ${LOG_LIMITS.requestEntries} log entries for one request: left out`));
    return;
  }
  const metadata = Object.create(null) as Record<string, unknown>;
  // Counted as `parseLogConfig` counts a written one: `{`, `}` and each `"key": value,`.
  let chars = 2;
  for (const m of a.metadata) {
    const cap = Math.min(LOG_LIMITS.valueChars, LOG_LIMITS.entryChars - chars - m.keyChars);
    const budget = { left: cap };
    try {
      metadata[m.key] = logValue(m.value, act, budget);
    } catch (err) {
      failed(m.where, err instanceof TooLarge ? new TooLarge(`the value is over ${LOG_LIMITS.valueChars} characters as JSON, or the metadata over ${LOG_LIMITS.entryChars}: left out`) : err);
      continue;
    }
    chars += m.keyChars + cap - budget.left;
  }
  if (logs.chars + chars > LOG_LIMITS.requestChars) {
    failed(a.where, new TooLarge(`the request's log entries are over ${LOG_LIMITS.requestChars} characters: left out`));
    return;
  }
  logs.chars += chars;
  logs.entries.push({ metadata });
}
