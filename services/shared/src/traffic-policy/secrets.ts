/**
 * Secrets inside a traffic policy document (wire-conventions.md §9): the API returns the document
 * with each secret blanked and keeps the stored secret when a document sends the blank back.
 *
 * The secret fields (inbound or outbound, wherever the action stands; each phase under either
 * of its names, `inbound` / `on_http_request` and `outbound` / `on_http_response`, and under both
 * should a document have both):
 * - `verify-webhook` `config.secret` (not for `sns`, which takes none);
 * - `basic-auth` `config.credentials[k]`: the password only; `alice:pw` is returned as `alice:`,
 *   so the credentials that exist stay visible;
 * - `oauth` and `openid-connect` `config.client_secret`.
 *
 * Output (`redactTrafficPolicySecrets`): the document as written, with only those values replaced
 * by `""` / `"user:"` (double-quoted, a JSON string, which is YAML too). The rest of the text is
 * kept byte for byte — comments, layout, quoting, JSON key order and indentation — by splicing
 * the new values over the old ones' source ranges (`parseDocument` node ranges); a document
 * without secrets is returned unchanged. Where a splice cannot express the change (an anchor
 * shared with a non-secret place, one alias with different values at its places) the document
 * is written out again: YAML through the Document API (`setIn`, `toString`: comments kept,
 * layout normalised), else from its value (JSON: `JSON.stringify` with the document's
 * indentation; YAML: `stringify`, comments lost). Every result is parsed again and must hold
 * exactly the redacted value, or the next way is taken.
 *
 * The result is read again as the ingress reads it (`toJS`) and must hold no secret anywhere an
 * action keeps one; otherwise (a secret the node walk could not locate with certainty, such as
 * one whose key is written as an alias in a document stored before `decodeTrafficPolicy` refused
 * those) the whole value is returned as `""`, as for a document that does not parse. Comments
 * are part of the layout kept: a secret written in a comment is returned as written.
 *
 * Input (`mergeTrafficPolicySecrets`): a blank (`""`, or `"user:"` for a credential) at the same
 * place as in the stored document (same direction, rule and action index; the direction whichever
 * of its names either document writes it under, so `on_http_request[0].actions[1]` is the place
 * of a stored `inbound[0].actions[1]`), with the same action
 * type there, takes the stored value only while the action still addresses what the secret was
 * given for: the same `provider` for `verify-webhook`, the same `provider` and `client_id` for
 * `oauth`, the same `issuer_url` and `client_id` for `openid-connect` (each as written; else
 * whoever may edit the policy could point the issuer at a server of their own and receive the
 * secret at the next sign-in); for `basic-auth` by username (the credential at the same index
 * first). A blank with no such stored counterpart is a `TrafficPolicyError` naming the field. A blank `client_secret` counts only with a `client_id`
 * (without one, none is set: ngrok's managed app). A non-empty value replaces the stored one.
 *
 * Secrets never appear in messages.
 */
import { isDeepStrictEqual } from 'node:util';
import { isMap, isScalar, isSeq, parseDocument, Scalar, stringify, visit, type Document, type Node as YamlNode } from 'yaml';
import { documentProblem, expandedValues, MAX_ALIASES, MAX_EXPANDED_VALUES, nestingProblem, resolveAlias } from './nesting.js';
import { SECRET_FIELDS, TRAFFIC_POLICY_PHASES, TrafficPolicyError, type TrafficPolicyPhaseKey } from './parse.js';

/** Every top-level key whose rules are walked: each phase under both its names (`TRAFFIC_POLICY_PHASES`). */
const PHASE_KEYS = Object.keys(TRAFFIC_POLICY_PHASES) as TrafficPolicyPhaseKey[];

/** As `decodeTrafficPolicy` reads a document. */
const YAML_OPTIONS = { version: '1.2', schema: 'core', merge: false, uniqueKeys: false, strict: true, prettyErrors: false } as const;

type SecretAction = 'verify-webhook' | 'basic-auth' | 'oauth' | 'openid-connect';
const SECRET_ACTIONS: readonly string[] = Object.keys(SECRET_FIELDS);

/** One secret-bearing value of a document. */
interface Slot {
  type: SecretAction;
  /** The action as written: `inbound[0].actions[1]`, `on_http_request[0].actions[1]`. */
  action: string;
  /** The action's place whatever the phase's name: `inbound[0].actions[1]` for both of those. */
  place: string;
  /** The field: `inbound[0].actions[1].config.secret`. */
  path: string;
  /** The same as keys, for `setIn`. */
  keys: (string | number)[];
  /** The value's node as written (a scalar, or an alias to one). */
  node: YamlNode;
  value: unknown;
  /** `verify-webhook`, `oauth`: the provider, lower-case ('' when not a string). */
  provider: string;
  /** `oauth`, `openid-connect`: whether a non-empty `client_id` is given. */
  hasClientId: boolean;
  /** `oauth`, `openid-connect`: the `client_id` as written (null when not a string). */
  clientId: string | null;
  /** `openid-connect`: the `issuer_url` as written (null when not a string). */
  issuer: string | null;
  /** `basic-auth`: the credential's index. */
  index: number;
}

interface Parsed {
  text: string;
  doc: Document;
  /** The document's plain value (computed once; throws on excessive aliasing). */
  value: () => unknown;
}

/**
 * A cheap test that `text` cannot hold a secret: none of the action names appears, and nothing
 * is escaped (a double-quoted YAML/JSON string could spell a name with `\u` escapes).
 */
function mayHoldSecrets(text: string): boolean {
  return text.includes('\\') || SECRET_ACTIONS.some((t) => text.includes(t));
}

/** The document, or null when it does not parse; `lazy` leaves its value to be computed when needed. */
function parse(text: string, lazy = false): Parsed | null {
  // Too deep for the parser (it recurses; see nesting.ts): as a document that does not parse.
  if (nestingProblem(text)) return null;
  try {
    const doc = parseDocument(text, YAML_OPTIONS);
    if (doc.errors.length > 0 || documentProblem(doc) !== null || expandedValues(doc) > MAX_EXPANDED_VALUES) return null;
    let js: { v: unknown } | undefined;
    const value = () => (js ??= { v: doc.toJS({ maxAliasCount: MAX_ALIASES }) }).v;
    if (!lazy) value();
    return { text, doc, value };
  } catch {
    return null;
  }
}

function resolve(doc: Document, n: unknown): unknown {
  return resolveAlias(doc, n);
}

function scalarValue(doc: Document, n: unknown): unknown {
  const r = resolve(doc, n);
  return isScalar(r) ? r.value : undefined;
}

/** Every secret-bearing value of the document, in document order; parts not shaped as a policy are skipped. */
function secretSlots(doc: Document): Slot[] {
  const out: Slot[] = [];
  const top = resolve(doc, doc.contents);
  if (!isMap(top)) return out;
  for (const dir of PHASE_KEYS) {
    const rules = resolve(doc, top.get(dir, true));
    if (!isSeq(rules)) continue;
    rules.items.forEach((r, i) => {
      const rule = resolve(doc, r);
      if (!isMap(rule)) return;
      const actions = resolve(doc, rule.get('actions', true));
      if (!isSeq(actions)) return;
      actions.items.forEach((a, j) => {
        const act = resolve(doc, a);
        if (!isMap(act)) return;
        const type = scalarValue(doc, act.get('type', true));
        if (typeof type !== 'string' || !SECRET_ACTIONS.includes(type)) return;
        const config = resolve(doc, act.get('config', true));
        if (!isMap(config)) return;
        const action = `${dir}[${i}].actions[${j}]`;
        const place = `${TRAFFIC_POLICY_PHASES[dir]}[${i}].actions[${j}]`;
        const keys = [dir, i, 'actions', j, 'config'];
        const provider = scalarValue(doc, config.get('provider', true));
        const clientId = scalarValue(doc, config.get('client_id', true));
        const issuer = scalarValue(doc, config.get('issuer_url', true));
        const slot = (field: string, node: unknown, index = -1): Slot | null => {
          if (node === undefined || node === null) return null;
          const key = index >= 0 ? [field, index] : [field];
          return {
            type: type as SecretAction,
            action,
            place,
            path: `${action}.config.${field}${index >= 0 ? `[${index}]` : ''}`,
            keys: [...keys, ...key],
            node: node as YamlNode,
            value: scalarValue(doc, node),
            provider: typeof provider === 'string' ? provider.toLowerCase() : '',
            hasClientId: typeof clientId === 'string' && clientId !== '',
            clientId: typeof clientId === 'string' ? clientId : null,
            issuer: typeof issuer === 'string' ? issuer : null,
            index,
          };
        };
        if (type === 'basic-auth') {
          const creds = resolve(doc, config.get('credentials', true));
          if (!isSeq(creds)) return;
          creds.items.forEach((c, k) => {
            const s = slot('credentials', c, k);
            if (s) out.push(s);
          });
          return;
        }
        const s = slot(type === 'verify-webhook' ? 'secret' : 'client_secret', config.get(type === 'verify-webhook' ? 'secret' : 'client_secret', true));
        if (s) out.push(s);
      });
    });
  }
  return out;
}

/** What a slot's value is shown as, or undefined when it shows nothing secret already. */
function redactedValue(s: Slot): string | undefined {
  const v = s.value;
  if (s.type === 'basic-auth') {
    if (typeof v === 'string') {
      const colon = v.indexOf(':');
      // Without a colon the whole credential may be a password.
      const shown = colon < 0 ? '' : v.slice(0, colon + 1);
      return shown === v ? undefined : shown;
    }
    return v === null || v === undefined ? undefined : '';
  }
  return v === null || v === undefined || v === '' ? undefined : '';
}

/** The username of a credential `user:password`, or null without a colon. */
function userOf(v: unknown): string | null {
  if (typeof v !== 'string') return null;
  const colon = v.indexOf(':');
  return colon < 0 ? null : v.slice(0, colon);
}

/** A value left blank for the stored secret to be kept. */
function isBlank(s: Slot): boolean {
  const v = s.value;
  switch (s.type) {
    case 'basic-auth':
      return typeof v === 'string' && v.length > 1 && v.indexOf(':') === v.length - 1;
    case 'verify-webhook':
      return v === '' && s.provider !== '' && s.provider !== 'sns';
    case 'oauth':
    case 'openid-connect':
      return v === '' && s.hasClientId;
  }
}

const nonEmptyString = (v: unknown): v is string => typeof v === 'string' && v !== '';

/**
 * Whether a stored secret may serve `b`'s action: the same provider (`verify-webhook`), the same
 * provider and `client_id` (`oauth`), the same `issuer_url` and `client_id` (`openid-connect`),
 * each compared as written. Otherwise whoever may edit the policy could point the action at a
 * server of their own (an issuer's token endpoint receives the client secret) and have the
 * stored secret sent there.
 */
function sameTarget(b: Slot, s: Slot): boolean {
  switch (b.type) {
    case 'basic-auth':
      return true;
    case 'verify-webhook':
      return s.provider === b.provider;
    case 'oauth':
      return s.provider === b.provider && s.clientId === b.clientId;
    case 'openid-connect':
      return s.issuer !== null && s.issuer === b.issuer && s.clientId === b.clientId;
  }
}

/** The stored slot whose value a blank keeps, if any. */
function counterpart(b: Slot, stored: Slot[]): Slot | undefined {
  const here = stored.filter((s) => s.place === b.place && s.type === b.type);
  if (b.type === 'basic-auth') {
    const user = userOf(b.value);
    const usable = here.filter((s) => userOf(s.value) === user && nonEmptyString(s.value) && s.value.length > (user?.length ?? 0) + 1);
    return usable.find((s) => s.index === b.index) ?? usable[0];
  }
  return here.find((s) => nonEmptyString(s.value) && sameTarget(b, s));
}

function missingReason(b: Slot, stored: Slot[]): string {
  const where = `at ${b.action}`;
  // A secret is stored there, for another target.
  const other = b.type === 'oauth' || b.type === 'openid-connect' ? stored.find((s) => s.place === b.place && s.type === b.type && nonEmptyString(s.value)) : undefined;
  if (other && b.type === 'oauth')
    return `is "", which keeps the stored client_secret only while provider and client_id are unchanged, but ${other.provider !== b.provider ? 'provider' : 'client_id'} differs from the stored policy's ${where}; write the client secret`;
  if (other && b.type === 'openid-connect')
    return `is "", which keeps the stored client_secret only while issuer_url and client_id are unchanged, but ${other.issuer !== b.issuer ? 'issuer_url' : 'client_id'} differs from the stored policy's ${where}; write the client secret`;
  switch (b.type) {
    case 'basic-auth':
      return `"username:" with an empty password keeps a stored password, but the stored policy has no basic-auth credential with this username ${where}; write "username:password"`;
    case 'verify-webhook':
      return `is "", which keeps a stored secret, but the stored policy has no verify-webhook secret for provider ${JSON.stringify(b.provider.slice(0, 64))} ${where}; write the secret`;
    case 'oauth':
      return `is "", which keeps a stored client_secret, but the stored policy has no oauth client_secret for provider ${JSON.stringify(b.provider.slice(0, 64))} ${where}; write the client secret`;
    case 'openid-connect':
      return `is "", which keeps a stored client_secret, but the stored policy has no openid-connect client_secret ${where}; write the client secret`;
  }
}

// ---------------------------------------------------------------- rewriting

interface Change {
  slot: Slot;
  value: string;
  /** Source text to write instead of the quoted value (a stored secret as it was written). */
  source?: string;
}

const BLOCK = new Set<string>([Scalar.BLOCK_LITERAL, Scalar.BLOCK_FOLDED]);
const INLINE = new Set<string>([Scalar.PLAIN, Scalar.QUOTE_DOUBLE, Scalar.QUOTE_SINGLE]);

/** `text` with the changed values spliced over their source ranges; null when overlapping edits disagree. */
function splice(text: string, changes: Change[], useSource: boolean): string | null {
  const edits = new Map<number, { end: number; rep: string }>();
  for (const c of changes) {
    const n = c.slot.node;
    const range = n.range;
    if (!range) return null;
    let rep = useSource && c.source !== undefined ? c.source : JSON.stringify(c.value);
    // A block scalar's range takes in its last line break.
    if (isScalar(n) && BLOCK.has(n.type ?? '') && text[range[1] - 1] === '\n') rep += '\n';
    const seen = edits.get(range[0]);
    if (seen) {
      if (seen.end !== range[1] || seen.rep !== rep) return null;
      continue;
    }
    edits.set(range[0], { end: range[1], rep });
  }
  const parts: string[] = [];
  let pos = 0;
  for (const [start, { end, rep }] of [...edits.entries()].sort((a, b) => a[0] - b[0])) {
    if (start < pos) return null;
    parts.push(text.slice(pos, start), rep);
    pos = end;
  }
  parts.push(text.slice(pos));
  return parts.join('');
}

function hasAliases(doc: Document): boolean {
  let found = false;
  visit(doc, {
    Alias() {
      found = true;
      return visit.BREAK;
    },
  });
  return found;
}

function unshared(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(unshared);
  if (v !== null && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, unshared(x)]));
  return v;
}

function setPath(root: unknown, keys: (string | number)[], value: unknown): void {
  let o = root as Record<string | number, unknown>;
  for (const k of keys.slice(0, -1)) o = o[k] as Record<string | number, unknown>;
  o[keys[keys.length - 1]!] = value;
}

function isJson(text: string): boolean {
  try {
    JSON.parse(text);
    return true;
  } catch {
    return false;
  }
}

/** The indentation of a JSON document as written (none when it is on one line). */
function jsonIndent(text: string): string | undefined {
  const m = /\n([ \t]+)\S/.exec(text.trim());
  if (m) return m[1];
  return /\n/.test(text.trim()) ? '' : undefined;
}

/**
 * The document with `changes` applied, its format kept as far as possible (see the top comment).
 * Each candidate must parse to exactly the expected value.
 */
function rewrite(p: Parsed, changes: Change[]): string {
  // Quoted strings over plain or quoted scalars of a document without aliases (each node is one
  // place): a splice cannot change anything else, so the common case skips parsing it again.
  if (changes.every((c) => c.source === undefined && isScalar(c.slot.node) && INLINE.has(c.slot.node.type ?? '')) && !hasAliases(p.doc)) {
    const out = splice(p.text, changes, false);
    if (out !== null) return out;
  }
  // A copy without shared parts: an alias's places are set one by one, as each should read.
  const expected = unshared(p.value());
  for (const c of changes) setPath(expected, c.slot.keys, c.value);
  const json = isJson(p.text);
  const holds = (out: string | null): out is string => {
    if (out === null || (json && !isJson(out))) return false;
    const again = parse(out);
    return again !== null && isDeepStrictEqual(again.value(), expected);
  };
  for (const useSource of [true, false]) {
    const out = splice(p.text, changes, useSource);
    if (holds(out)) return out;
  }
  if (!json) {
    try {
      const doc = parseDocument(p.text, YAML_OPTIONS);
      for (const c of changes) doc.setIn(c.slot.keys, c.value);
      const out = doc.toString();
      if (holds(out)) return out;
    } catch {
      /* an alias on the way: written from the value below */
    }
    return stringify(expected);
  }
  const indent = jsonIndent(p.text);
  return JSON.stringify(expected, null, indent) + (indent !== undefined && p.text.endsWith('\n') ? '\n' : '');
}

/** A secret's plain value that shows nothing secret (what `redactedValue` leaves as it is, or produces). */
function shown(type: string, v: unknown): boolean {
  if (v === null || v === undefined || v === '') return true;
  return type === 'basic-auth' && typeof v === 'string' && v.indexOf(':') === v.length - 1;
}

/** The secret text of each slot: a credential's password (after its first colon), else the value. */
function secretTexts(slots: Slot[]): string[] {
  const out: string[] = [];
  for (const s of slots) {
    if (typeof s.value !== 'string') continue;
    const secret = s.type === 'basic-auth' && s.value.includes(':') ? s.value.slice(s.value.indexOf(':') + 1) : s.value;
    if (secret !== '') out.push(secret);
  }
  return out;
}

/** Whether any string (value or key) in `v` contains one of `needles`. */
function includesAny(v: unknown, needles: string[]): boolean {
  if (needles.length === 0) return false;
  if (typeof v === 'string') return needles.some((n) => v.includes(n));
  if (Array.isArray(v)) return v.some((x) => includesAny(x, needles));
  if (v instanceof Map) return [...v].some(([k, x]) => includesAny(k, needles) || includesAny(x, needles));
  if (typeof v === 'object' && v !== null) return Object.entries(v).some(([k, x]) => includesAny(k, needles) || includesAny(x, needles));
  return false;
}

const plainObj = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/**
 * Whether a document's plain value (as `decodeTrafficPolicy` returns it, so as the ingress reads
 * it) holds a secret anywhere `secretSlots` looks for one: the check that redaction found them all.
 */
function holdsSecret(value: unknown): boolean {
  if (!plainObj(value)) return false;
  for (const dir of PHASE_KEYS) {
    const rules = value[dir];
    if (!Array.isArray(rules)) continue;
    for (const rule of rules) {
      if (!plainObj(rule) || !Array.isArray(rule.actions)) continue;
      for (const act of rule.actions) {
        if (!plainObj(act) || typeof act.type !== 'string' || !SECRET_ACTIONS.includes(act.type) || !plainObj(act.config)) continue;
        const c = act.config;
        if (act.type === 'basic-auth') {
          if (c.credentials === null || c.credentials === undefined) continue;
          if (!Array.isArray(c.credentials) || !c.credentials.every((x) => shown('basic-auth', x))) return true;
        } else if (!shown(act.type, c[act.type === 'verify-webhook' ? 'secret' : 'client_secret'])) return true;
      }
    }
  }
  return false;
}

// ---------------------------------------------------------------- API

/**
 * The document as the API returns it: every secret `""`, basic-auth credentials `user:`. A
 * document without secrets comes back unchanged (the same string). One that cannot be read
 * (it was validated when saved, so only a stricter parser could cause this) but may hold a
 * secret comes back as `""` rather than risk showing one.
 */
export function redactTrafficPolicySecrets(text: string): string {
  if (!mayHoldSecrets(text)) return text;
  const p = parse(text, true);
  if (!p) return '';
  try {
    const changes: Change[] = [];
    const slots = secretSlots(p.doc);
    for (const slot of slots) {
      const value = redactedValue(slot);
      if (value !== undefined) changes.push({ slot, value });
    }
    const out = changes.length === 0 ? text : rewrite(p, changes);
    // Fail closed: the result, read as the ingress reads it, must hold no secret. A secret the
    // node walk did not find (a key written as an alias, which `decodeTrafficPolicy` now refuses
    // but a document stored before may have) or a rewrite that went wrong gives "".
    const again = out === text ? p : parse(out);
    if (again === null || holdsSecret(again.value())) return '';
    // Through an alias a secret can also stand where no secret belongs (`name: *a` after
    // `secret: &a …`); saving such a document is refused now (parse.ts checkSecretAnchors), and
    // one stored before is shown only if no secret's text is anywhere in it.
    if (hasAliases(p.doc) && includesAny(again.value(), secretTexts(slots))) return '';
    return out;
  } catch {
    return '';
  }
}

/**
 * Whether `text` leaves a secret blank (`""`, or `"user:"` for a basic-auth credential) for the
 * stored one to be kept: such a document is validated once `mergeTrafficPolicySecrets` fills it.
 */
export function hasBlankTrafficPolicySecrets(text: string): boolean {
  if (!mayHoldSecrets(text)) return false;
  const p = parse(text);
  return p !== null && secretSlots(p.doc).some(isBlank);
}

/**
 * `text` with each blank secret replaced by the stored document's value at the same place (see
 * the top comment); `text` itself when nothing is blank (or it does not parse: validation
 * reports that). Throws `TrafficPolicyError` naming the first blank without a stored value.
 * The result is not validated here.
 */
export function mergeTrafficPolicySecrets(text: string, stored: string | undefined): string {
  if (!mayHoldSecrets(text)) return text;
  const p = parse(text);
  if (!p) return text;
  const blanks = secretSlots(p.doc).filter(isBlank);
  if (blanks.length === 0) return text;
  const prev = stored !== undefined ? parse(stored) : null;
  const prevSlots = prev ? secretSlots(prev.doc) : [];
  const changes = blanks.map((b): Change => {
    const s = counterpart(b, prevSlots);
    if (!s) throw new TrafficPolicyError(b.path, missingReason(b, prevSlots));
    const n = s.node;
    const source = isScalar(n) && INLINE.has(n.type ?? '') && n.range ? prev!.text.slice(n.range[0], n.range[1]) : undefined;
    return { slot: b, value: s.value as string, source: source !== undefined && !/[\r\n]/.test(source) ? source : undefined };
  });
  return rewrite(p, changes);
}
