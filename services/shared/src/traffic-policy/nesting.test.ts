import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { Document, isMap, isSeq, parseDocument, stringify, visit } from 'yaml';
import { expandedValues, MAX_BLOCK_BOUND, MAX_EXPANDED_VALUES, MAX_FLOW_DEPTH, nestingProblem } from './nesting.js';
import { hasBlankTrafficPolicySecrets, mergeTrafficPolicySecrets, parseTrafficPolicy, redactTrafficPolicySecrets, TrafficPolicyError } from './index.js';
import { MAX_DECODED_TRAFFIC_POLICY_BYTES, MAX_TRAFFIC_POLICY_BYTES } from './parse.js';

const nested = (d: number) => '['.repeat(d) + ']'.repeat(d);
/** The fuzz audit's input: 900 levels in a rule; the backslash makes the secrets pre-check parse it. */
const CRASHER = `{"inbound":[{"name":"\\\\","actions":${nested(900)}}]}`;

describe('nestingProblem', () => {
  it('refuses flow collections nested more than MAX_FLOW_DEPTH, naming the line', () => {
    expect(nestingProblem(nested(MAX_FLOW_DEPTH))).toBeNull();
    expect(nestingProblem(nested(MAX_FLOW_DEPTH + 1))?.message).toBe(`nested more than ${MAX_FLOW_DEPTH} levels deep (flow collections: [ ] and { }) at line 1`);
    expect(nestingProblem(`inbound:\n  - name: x\n    actions: ${'{"a":'.repeat(70)}1${'}'.repeat(70)}\n`)?.line).toBe(3);
    // JSON written the way JSON.stringify writes it, 60 deep (30 objects, 30 lists): fine; its
    // indentation (up to 240 columns) is flow content.
    let v: unknown = 1;
    for (let i = 0; i < 30; i++) v = { k: [v] };
    expect(nestingProblem(JSON.stringify(v, null, 4))).toBeNull();
    for (let i = 0; i < 5; i++) v = { k: [v] };
    expect(nestingProblem(JSON.stringify(v, null, 4))).not.toBeNull();
  });

  it('refuses block nesting beyond MAX_BLOCK_BOUND columns and indicators', () => {
    expect(nestingProblem(`${'- '.repeat(MAX_BLOCK_BOUND)}x\n`)).toBeNull();
    expect(nestingProblem(`${'- '.repeat(MAX_BLOCK_BOUND + 1)}x\n`)?.message).toMatch(/^indented or nested too deeply at line 1/);
    let v: unknown = 'leaf';
    for (let i = 0; i < 60; i++) v = { k: v };
    expect(nestingProblem(stringify(v))).toBeNull(); // 2 columns a level: 120
    for (let i = 0; i < 10; i++) v = { k: v };
    expect(nestingProblem(stringify(v))?.line).toBe(65);
  });

  it('does not count brackets in quoted scalars, comments, block scalars or plain scalars in block context', () => {
    const many = '['.repeat(200);
    expect(nestingProblem(`inbound:\n  - expressions: ["req.path == '${many}'"]\n    actions: [{type: deny}]\n`)).toBeNull();
    expect(nestingProblem(`a: '${many}''${many}'\nb: "${many}\\"${many}"\n`)).toBeNull();
    expect(nestingProblem(`# ${many}\na: 1 # ${many}\n`)).toBeNull();
    expect(nestingProblem(`a: b${many}\n`)).toBeNull();
    expect(nestingProblem(`body: |\n  ${many}\n\n  ${many}\nnext: 1\n`)).toBeNull();
    expect(nestingProblem(`- >-\n   ${many}\n- x\n`)).toBeNull();
    expect(nestingProblem(`- name: x\n  body: |\n    ${many}\n`)).toBeNull();
  });

  it("skips only a block scalar's content: lines indented more than its parent node (the key, else the `-`)", () => {
    const deep = nested(100);
    // Not content for YAML (the parser reads them as something else, and may recurse into them).
    expect(nestingProblem(`- key: |\n ${deep}\n`)).not.toBeNull();
    expect(nestingProblem(`- a: 1\n  key: |\n   x\n  ${deep}\n`)).not.toBeNull();
    expect(nestingProblem(`a:\n  key: |\n   x\n  ${deep}\n`)).not.toBeNull();
    expect(nestingProblem(`- |\n ${deep}\n`)).toBeNull();
  });

  it('cannot be fooled into undercounting by closers in strings, adjacent JSON values or CRLF', () => {
    const closers = ']'.repeat(500);
    expect(nestingProblem(`{"a": "${closers}", "b": ${nested(100)}}`)).not.toBeNull();
    expect(nestingProblem(`a: "${closers}"\nb: ${nested(100)}\n`)).not.toBeNull();
    expect(nestingProblem(`a: '${closers}'\nb: ${nested(100)}\n`)).not.toBeNull();
    expect(nestingProblem(`"a":${nested(100)}\n`)).not.toBeNull();
    expect(nestingProblem(`a: &x ${nested(100)}\n`)).not.toBeNull();
    expect(nestingProblem(`a: 1\r\nb:\r\n  - ${nested(100)}\r\n`)?.line).toBe(3);
  });

  it('lets every policy of the size limit through that is not deeply nested', () => {
    const rule = `  - name: r\n    expressions: ["req.path.startsWith('/a[0-9]{2}')", "'x' in req.headers"]\n    actions:\n      - type: custom-response\n        config: {status_code: 200, body: "{\\"ok\\": [1, {\\"a\\": [2]}]}"}\n`;
    const doc = `inbound:\n${rule.repeat(200)}`;
    expect(nestingProblem(doc)).toBeNull();
  });
});

describe('a deeply nested policy', () => {
  it('is a 400 naming the nesting in every entry point, not a stack overflow', () => {
    const err = (() => {
      try {
        parseTrafficPolicy(CRASHER);
      } catch (e) {
        return e;
      }
    })();
    expect(err).toBeInstanceOf(TrafficPolicyError);
    expect((err as TrafficPolicyError).message).toMatch(/^nested more than 64 levels deep/);
    expect(hasBlankTrafficPolicySecrets(CRASHER)).toBe(false);
    expect(redactTrafficPolicySecrets(CRASHER)).toBe('');
    expect(mergeTrafficPolicySecrets(CRASHER, undefined)).toBe(CRASHER);
    expect(() => parseTrafficPolicy(`inbound:\n${'  '.repeat(1)}${'- '.repeat(2000)}x\n`)).toThrow(TrafficPolicyError);
  });

  it("no longer aborts a fresh process (V8 aborted compiling a regexp with the stack exhausted)", () => {
    // A fresh process, as the control plane right after a start: the old code died with SIGABRT
    // ("RegExpCompiler Allocation failed - process out of memory") on the audit's input.
    const index = fileURLToPath(new URL('./index.ts', import.meta.url));
    const script = `
      const tp = await import(${JSON.stringify(index)});
      const text = ${JSON.stringify(CRASHER)};
      tp.hasBlankTrafficPolicySecrets(text);
      try { tp.parseTrafficPolicy(text); } catch (e) { console.log(e.name + ': ' + e.message); }
    `;
    const r = spawnSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { encoding: 'utf8', timeout: 60_000 });
    expect([r.status, r.signal]).toEqual([0, null]);
    expect(r.stdout).toMatch(/^TrafficPolicyError: nested more than 64 levels deep/);
  }, 60_000);
});

describe('a document whose aliases expand it', () => {
  const list = `[${Array.from({ length: 25_000 }, () => '1').join(',')}]`;

  it('counts the values toJS would build, once per anchor, and stops past the limit', () => {
    expect(expandedValues(parseDocument('a: [1, 2, {b: 3}]'))).toBe(8); // the map, a, the list, 1, 2, {b: 3} (3)
    expect(expandedValues(parseDocument('a: &x [1, 2]\nb: *x\nc: *x'))).toBe(13); // the map, then three keys with a 3-value list each
    const big = parseDocument(`a: &a ${list}\nb: [${Array(20).fill('*a').join(', ')}]`);
    expect(expandedValues(big)).toBeGreaterThan(MAX_EXPANDED_VALUES);
  });

  it('is refused before its aliases are expanded: an unknown top-level key first, then the size', () => {
    // The fuzz audit's 50 KB document: 10 aliases of a 25,000-item list (over a second, twice).
    const audit = `a: &a ${list}\ninbound: [${Array(10).fill('*a').join(', ')}]\n#verify-webhook\n`;
    expect(() => parseTrafficPolicy(audit)).toThrow(/^a: unknown field "a"/);
    const short = `[${Array.from({ length: 5_000 }, () => '1').join(',')}]`;
    const inPlace = `inbound:\n  - name: x\n    actions: [{type: restrict-ips, config: {deny: &a ${short}}}${', {type: restrict-ips, config: {deny: *a}}'.repeat(60)}]\n`;
    expect(() => parseTrafficPolicy(inPlace)).toThrow(/^the document expands to more than 250000 values through its aliases$/);
    expect(hasBlankTrafficPolicySecrets(`${inPlace}#basic-auth`)).toBe(false);
  });
});

describe('the bound holds for generated documents', () => {
  /** mulberry32: reproducible. */
  const rng = (seed: number) => () => {
    seed = (seed + 0x6d2b79f5) >>> 0;
    let t = seed;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  /** Depth of collections in a parsed document (what the parser recurses over). */
  const depth = (text: string): number => {
    let max = 0;
    visit(parseDocument(text), {
      Collection(_k, _n, path) {
        max = Math.max(max, path.filter((p) => isMap(p) || isSeq(p)).length + 1);
      },
    });
    return max;
  };

  it('never lets a document deeper than 2 x 128 + 64 collections through, whatever mix of flow and block styles', () => {
    const r = rng(20261126);
    const strings = ['a', 'x: y', '[b', 'c]', '{', '"q"', "'s'", '# c', 'd - e', '|', '>'];
    let deepAccepted = 0;
    for (let doc = 0; doc < 150; doc++) {
      const target = 1 + Math.floor(r() * 400);
      const build = (d: number): unknown => {
        if (d >= target) return strings[Math.floor(r() * strings.length)];
        const child = build(d + 1);
        const siblings = r() < 0.3 ? [strings[Math.floor(r() * strings.length)]] : [];
        return r() < 0.5 ? [...siblings, child] : { [`k${d}`]: child, ...(siblings.length ? { [`s${d}`]: siblings[0] } : {}) };
      };
      const document = new Document(build(0));
      const flowFrom = r() < 0.5 ? Math.floor(r() * target) : Infinity;
      let level = 0;
      visit(document, {
        Collection(_k, node, path) {
          level = path.filter((p) => isMap(p) || isSeq(p)).length;
          if (level >= flowFrom) node.flow = true;
        },
      });
      const text = document.toString({ lineWidth: 0, indent: 1 + Math.floor(r() * 3) });
      if (nestingProblem(text) !== null) continue;
      const d = depth(text);
      expect(d, text.slice(0, 200)).toBeLessThanOrEqual(2 * MAX_BLOCK_BOUND + MAX_FLOW_DEPTH);
      if (d > MAX_FLOW_DEPTH) deepAccepted++;
    }
    // Not vacuous: block documents deeper than the flow limit do get through.
    expect(deepAccepted).toBeGreaterThan(0);
  }, 60_000);
});

describe('a document whose aliases repeat a long value', () => {
  it('is refused when it would be over the decoded limit as the JSON sent to every node', () => {
    // The quota audit's document: one 50 KB string, the body of 100 custom-response actions.
    const body = 'x'.repeat(50_000);
    const rule = (i: number, first: boolean) => `  - name: r${i}\n    actions: [{type: custom-response, config: {status_code: 200, body: ${first ? `&b "${body}"` : '*b'}}}]\n`;
    const big = `inbound:\n${Array.from({ length: 100 }, (_, i) => rule(i, i === 0)).join('')}`;
    expect(Buffer.byteLength(big)).toBeLessThan(MAX_TRAFFIC_POLICY_BYTES);
    expect(() => parseTrafficPolicy(big)).toThrow(new RegExp(`^the document is over ${MAX_DECODED_TRAFFIC_POLICY_BYTES} bytes once its aliases are expanded`));
    // Four uses of the string stay under it, and aliases themselves are fine.
    const four = `inbound:\n${Array.from({ length: 4 }, (_, i) => rule(i, i === 0)).join('')}`;
    expect(parseTrafficPolicy(four).inbound).toHaveLength(4);
  });
});

describe('documents that made the yaml package work quadratically (an audit: one Bind stalled an ingress for 87 s)', () => {
  it('many aliases are refused in one walk, not one walk of the whole document per alias', () => {
    const aliases = `on_http_request: [&a {actions: [{type: deny}]}${',*a'.repeat(21_000)}]`;
    expect(Buffer.byteLength(aliases)).toBeLessThan(MAX_TRAFFIC_POLICY_BYTES);
    const t = performance.now();
    expect(() => parseTrafficPolicy(aliases)).toThrow(/^not valid YAML or JSON: more than 1000 aliases \(\*name\)$/);
    // 85 s before; about 0.2 s here (the parse itself). Generous: a loaded CI box must not fail it.
    expect(performance.now() - t).toBeLessThan(5_000);
    // Up to 100 still work, and resolve to the last anchor of their name before them (as yaml's Alias.resolve).
    const ok = parseTrafficPolicy(`on_http_request:\n  - &r {actions: [{type: deny}]}\n${'  - *r\n'.repeat(99)}`);
    expect(ok.inbound).toHaveLength(100);
    const redefined = parseTrafficPolicy('on_http_request:\n  - &r {name: one, actions: [{type: deny}]}\n  - &r {name: two, actions: [{type: deny}]}\n  - *r\n');
    expect(redefined.inbound.map((r) => r.name)).toEqual(['one', 'two', 'two']);
  });

  it('a map of thousands of keys is checked for repeated keys in one pass', () => {
    const headers = Object.fromEntries(Array.from({ length: 4_500 }, (_, i) => [`x-${i}`, 'v']));
    const doc = JSON.stringify({ on_http_request: [{ actions: [{ type: 'add-headers', config: { headers } }] }] });
    const t = performance.now();
    expect(() => parseTrafficPolicy(doc)).toThrow(/must have at most 32 headers/);
    expect(performance.now() - t).toBeLessThan(5_000);
    // Repeated keys are still refused, anywhere, with the parser's message and the key.
    expect(() => parseTrafficPolicy('on_http_request: []\non_http_request: []')).toThrow(/^not valid YAML or JSON: Map keys must be unique \("on_http_request" is written twice\)$/);
    expect(() => parseTrafficPolicy('{"on_http_request": [{"actions": [{"type": "add-headers", "config": {"headers": {"a": "1", "a": "2"}}}]}]}')).toThrow(/Map keys must be unique \("a" is written twice\)/);
  });
});
