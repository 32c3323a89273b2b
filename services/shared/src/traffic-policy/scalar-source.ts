import { isAlias, isMap, isScalar, isSeq, type Document, type Node } from 'yaml';

/**
 * Numbers and booleans as they were written in a policy document. `Document.toJS` gives `1.10`
 * as 1.1, `0x10` as 16 and `1.0` as the integer 1, while Go's YAML decoder (ngrok's) reads a
 * scalar into a string field as its text and `1.0` into an interface as a float64. The decoded
 * document is plain JSON that travels to every ingress node, so what was written is put back
 * into it where it matters, before anything validates it ({@link keepWrittenScalars}):
 * - header values (`add-headers`, `custom-response`, `redirect`) are the scalar's text
 *   (`x-api-version: 1.10` sends `1.10`, `x-flag: True` sends `True`);
 * - in `set-vars` and `log` values, a whole number written as a float (`1.0`, `2e0`) becomes the
 *   template `${1.0}`, which evaluates to the CEL double (an int there made `vars.ratio * 1.5` an
 *   evaluation error, which a deny rule counts as true).
 */
export function keepWrittenScalars(doc: Document, value: unknown): void {
  const sources = scalarSources(doc, value);
  const text = (container: object, key: string | number) => sources.get(container)?.get(key);
  if (!isObject(value)) return;
  for (const phase of Object.values(value)) {
    if (!Array.isArray(phase)) continue;
    for (const rule of phase) {
      const actions = isObject(rule) ? rule.actions : undefined;
      if (!Array.isArray(actions)) continue;
      for (const action of actions) {
        if (!isObject(action) || !isObject(action.config)) continue;
        const config = action.config;
        if ((action.type === 'add-headers' || action.type === 'custom-response' || action.type === 'redirect') && isObject(config.headers)) {
          const h = config.headers;
          for (const k of Object.keys(h)) {
            const t = text(h, k);
            if (t !== undefined && (typeof h[k] === 'number' || typeof h[k] === 'boolean')) h[k] = t;
          }
        } else if (action.type === 'set-vars' && Array.isArray(config.vars)) {
          for (const entry of config.vars) if (isObject(entry)) doubles(entry, text, 0);
        } else if (action.type === 'log' && isObject(config.metadata)) {
          doubles(config.metadata, text, 0);
        }
      }
    }
  }
}

type Obj = Record<string, unknown>;
const isObject = (v: unknown): v is Obj => v !== null && typeof v === 'object' && !Array.isArray(v);

/** Whether a number's text is a float's (`1.0`, `1e3`, `.5`): Go's YAML decodes it as float64. */
function isFloatText(t: string): boolean {
  return !/^[-+]?0[xXoO]/.test(t) && /[.eE]/.test(t);
}

/** In a set-vars / log value: whole numbers written as floats become `${N.0}` (a CEL double). */
function doubles(container: Obj | unknown[], text: (c: object, k: string | number) => string | undefined, depth: number): void {
  if (depth > 16) return;
  const keys: Array<string | number> = Array.isArray(container) ? container.map((_, i) => i) : Object.keys(container);
  for (const k of keys) {
    const v = (container as Record<string | number, unknown>)[k];
    if (typeof v === 'number' && Number.isInteger(v) && Number.isFinite(v)) {
      const t = text(container, k);
      if (t !== undefined && isFloatText(t)) (container as Record<string | number, unknown>)[k] = `\${${Number.isSafeInteger(v) ? `${v}.0` : String(v)}}`;
    } else if (v !== null && typeof v === 'object') doubles(v as Obj | unknown[], text, depth + 1);
  }
}

/** The text of every number and boolean in `value` (what `doc.toJS()` made), by container and key. */
function scalarSources(doc: Document, value: unknown): Map<object, Map<string | number, string>> {
  const out = new Map<object, Map<string | number, string>>();
  const seen = new Set<object>();
  const walk = (node: unknown, js: unknown): void => {
    let n = node as Node | null | undefined;
    // An alias decodes to its anchor's value: the anchor's node holds the text.
    for (let hops = 0; n && isAlias(n) && hops < 64; hops++) n = n.resolve(doc) as Node | undefined;
    if (!n || js === null || typeof js !== 'object' || seen.has(js)) return;
    seen.add(js);
    const note = (key: string | number, child: unknown, childJs: unknown) => {
      if (isScalar(child) && (typeof childJs === 'number' || typeof childJs === 'boolean') && typeof child.source === 'string') {
        let m = out.get(js);
        if (!m) out.set(js, (m = new Map()));
        m.set(key, child.source);
      } else walk(child, childJs);
    };
    if (isMap(n) && !Array.isArray(js)) {
      for (const pair of n.items) {
        if (!isScalar(pair.key)) continue;
        const key = String(pair.key.value);
        if (Object.hasOwn(js, key)) note(key, pair.value, (js as Obj)[key]);
      }
    } else if (isSeq(n) && Array.isArray(js)) {
      n.items.forEach((item, i) => note(i, item, js[i]));
    }
  };
  walk(doc.contents, value);
  return out;
}
