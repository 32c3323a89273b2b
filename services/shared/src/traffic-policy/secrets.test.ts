import { describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { parseTrafficPolicy, TrafficPolicyError } from './parse.js';
import { hasBlankTrafficPolicySecrets, mergeTrafficPolicySecrets, redactTrafficPolicySecrets } from './secrets.js';

const HOOK = 'whsec-hook-secret-1';
const PW = 'alice-password-1';
const PW2 = 'bob-password-22';
const CS = 'oauth-client-secret-3';
const OS = 'oidc-client-secret-4';
const ALL_SECRETS = [HOOK, PW, PW2, CS, OS];

/** Every secret-bearing action, with comments, every quoting style and a rule without secrets. */
const YAML_DOC = `# the policy
inbound:
  - name: hooks # rule comment
    expressions: ["req.path.startsWith('/hooks')"]
    actions:
      - type: verify-webhook
        config:
          provider: GitHub
          secret: ${HOOK}   # keep me
  - actions:
      - type: add-headers
        config: {headers: {x-a: b}}
      - type: basic-auth
        config:
          realm: staff
          credentials:
            - alice:${PW}
            - 'bob:${PW2}'
  - actions:
      - type: oauth
        config:
          provider: google
          client_id: cid
          client_secret: "${CS}"
      - type: openid-connect
        config: {issuer_url: "https://id.example.com", client_id: oid, client_secret: ${OS}}
outbound:
  - actions:
      - type: add-headers
        config: {headers: {x-b: c}}
`;

const YAML_REDACTED = YAML_DOC.replace(`secret: ${HOOK}   #`, 'secret: ""   #')
  .replace(`- alice:${PW}`, '- "alice:"')
  .replace(`- 'bob:${PW2}'`, '- "bob:"')
  .replace(`client_secret: "${CS}"`, 'client_secret: ""')
  .replace(`client_secret: ${OS}}`, 'client_secret: ""}');

const JSON_VALUE = {
  inbound: [
    { actions: [{ type: 'verify-webhook', config: { secret: HOOK, provider: 'stripe', enforce: true } }] },
    { actions: [{ config: { credentials: [`alice:${PW}`, `bob:${PW2}`] }, type: 'basic-auth' }] },
    { actions: [{ type: 'oauth', config: { provider: 'github', client_id: 'cid', client_secret: CS } }] },
  ],
};

const noSecretIn = (text: string) => {
  for (const s of ALL_SECRETS) expect(text).not.toContain(s);
};

describe('redactTrafficPolicySecrets', () => {
  it('blanks every secret of a YAML document and keeps everything else byte for byte', () => {
    parseTrafficPolicy(YAML_DOC);
    const out = redactTrafficPolicySecrets(YAML_DOC);
    expect(out).toBe(YAML_REDACTED);
    noSecretIn(out);
    expect(out).toContain('# keep me');
  });

  it('keeps JSON as JSON: key order and indentation as written', () => {
    for (const indent of [2, 4, '\t', undefined] as const) {
      const text = JSON.stringify(JSON_VALUE, null, indent) + (indent === undefined ? '' : '\n');
      parseTrafficPolicy(text);
      const out = redactTrafficPolicySecrets(text);
      const expected = structuredClone(JSON_VALUE) as { inbound: { actions: { config: Record<string, unknown> }[] }[] };
      expected.inbound[0]!.actions[0]!.config.secret = '';
      expected.inbound[1]!.actions[0]!.config.credentials = ['alice:', 'bob:'];
      expected.inbound[2]!.actions[0]!.config.client_secret = '';
      expect(out).toBe(JSON.stringify(expected, null, indent) + (indent === undefined ? '' : '\n'));
      expect(Object.keys(JSON.parse(out).inbound[1].actions[0])).toEqual(['config', 'type']);
    }
  });

  it('returns a document without secrets unchanged', () => {
    const docs = [
      'inbound:\n  - actions:\n      - type: deny # no secret\n',
      '{"inbound": [{"actions": [{"type": "deny"}]}]}',
      // sns takes no secret; an oauth action without its own app has none
      'inbound:\n  - actions:\n      - type: verify-webhook\n        config: {provider: sns}\n      - type: oauth\n        config: {provider: github, client_secret: ""}\n',
      // already redacted
      YAML_REDACTED,
    ];
    for (const d of docs) expect(redactTrafficPolicySecrets(d)).toBe(d);
  });

  it('handles block scalars, tags, anchors and aliases', () => {
    const block = `inbound:\n  - actions:\n      - type: verify-webhook\n        config:\n          provider: github\n          secret: |\n            ${HOOK}\n          enforce: false\n`;
    expect(redactTrafficPolicySecrets(block)).toBe('inbound:\n  - actions:\n      - type: verify-webhook\n        config:\n          provider: github\n          secret: ""\n          enforce: false\n');

    const tagged = `inbound:\n  - actions:\n      - type: verify-webhook\n        config: {provider: github, secret: !!str &s ${HOOK}}\n      - type: verify-webhook\n        config: {provider: github, secret: *s}\n`;
    expect(redactTrafficPolicySecrets(tagged)).toBe('inbound:\n  - actions:\n      - type: verify-webhook\n        config: {provider: github, secret: !!str &s ""}\n      - type: verify-webhook\n        config: {provider: github, secret: ""}\n');

    const sharedConfig = `inbound:\n  - actions:\n      - type: basic-auth\n        config: &c {credentials: ["alice:${PW}"]}\n  - actions:\n      - type: basic-auth\n        config: *c\n`;
    const out = redactTrafficPolicySecrets(sharedConfig);
    noSecretIn(out);
    expect(out).toContain('&c');
    expect(parseYaml(out).inbound[1].actions[0].config.credentials).toEqual(['alice:']);

    // A secret that an alias also puts where no secret belongs (a header, a rule's name), stored
    // before saving such documents was refused: the secret's text would be shown, so the whole
    // value is "" (the fuzz audit read these secrets back through GET).
    const sharedWithHeader = `inbound:\n  - actions:\n      - type: add-headers\n        config: {headers: {x-a: &s ${HOOK}}} # comment\n      - type: verify-webhook\n        config: {provider: github, secret: *s}\n`;
    const anchoredSecret = `inbound:\n  - actions:\n      - type: verify-webhook\n        config: {provider: github, secret: &s ${HOOK}}\n      - type: add-headers\n        config: {headers: {x-a: *s}}\n`;
    const inName = `inbound:\n  - name: &a ${HOOK}\n    actions:\n      - type: verify-webhook\n        config:\n          provider: github\n          secret: *a\n`;
    const clientSecretInName = `inbound:\n  - actions:\n      - type: openid-connect\n        config: {issuer_url: "https://idp.example.com", client_id: abc, client_secret: &s ${OS}}\n  - name: *s\n    actions: []\n`;
    for (const doc of [sharedWithHeader, anchoredSecret, inName, clientSecretInName]) {
      expect(redactTrafficPolicySecrets(doc), doc).toBe('');
      // Saving one is refused, naming the secret (or what holds it) that carries the anchor or alias.
      expect(() => parseTrafficPolicy(doc), doc).toThrow(/is not accepted on a secret or on what holds one/);
    }
    expect(() => parseTrafficPolicy(sharedConfig)).toThrow(/^inbound\[0\]\.actions\[0\]\.config: an anchor \(&c\) is not accepted on a secret or on what holds one$/);
    expect(() => parseTrafficPolicy(tagged)).toThrow(/^inbound\[0\]\.actions\[0\]\.config\.secret: an anchor \(&s\)/);
    expect(() => parseTrafficPolicy(inName)).toThrow(/^inbound\[0\]\.actions\[0\]\.config\.secret: an alias \(\*a\) is not accepted/);
    // Anchors and aliases elsewhere stay accepted.
    expect(() => parseTrafficPolicy(`inbound:\n  - name: &n x\n    actions: [{type: verify-webhook, config: {provider: github, secret: s3cr3t}}]\n  - name: *n\n    actions: [{type: deny}]\n`)).not.toThrow();
  });

  it('finds action types spelled with escapes, and fails closed on a document it cannot read', () => {
    const escaped = `{"inbound": [{"actions": [{"type": "basic\\u002dauth", "config": {"credentials": ["alice:${PW}"]}}]}]}`;
    expect(redactTrafficPolicySecrets(escaped)).toBe(`{"inbound": [{"actions": [{"type": "basic\\u002dauth", "config": {"credentials": ["alice:"]}}]}]}`);
    expect(redactTrafficPolicySecrets(`inbound: [ {type: basic-auth, credentials: [alice:${PW}]`)).toBe('');
    // A credential without a colon may be a bare password: blanked whole.
    expect(redactTrafficPolicySecrets(`inbound: [{actions: [{type: basic-auth, config: {credentials: [${PW}, 7]}}]}]`)).toBe('inbound: [{actions: [{type: basic-auth, config: {credentials: ["", ""]}}]}]');
  });

  it('fails closed on a secret it cannot locate: a key written as an alias (stored before the parser refused those; review)', () => {
    const docs = [
      `inbound:\n  - name: &k client_secret\n    actions:\n      - type: openid-connect\n        config:\n          issuer_url: https://idp.example.com\n          client_id: abc\n          *k : ${OS}\n`,
      `inbound:\n  - name: &k secret\n    actions:\n      - type: verify-webhook\n        config:\n          provider: github\n          *k : ${HOOK}\n`,
      `inbound:\n  - name: &k credentials\n    actions:\n      - type: basic-auth\n        config:\n          *k : ["alice:${PW}"]\n`,
      // the action type as an alias key: the action was skipped
      `inbound:\n  - name: &t type\n    actions:\n      - *t : verify-webhook\n        config: {provider: github, secret: ${HOOK}}\n`,
      // the rule's actions under an alias key
      `x: &a actions\ninbound:\n  - *a : [{type: verify-webhook, config: {provider: github, secret: ${HOOK}}}]\n`,
    ];
    for (const d of docs) {
      expect(parseYaml(d), d).toBeTruthy();
      expect(redactTrafficPolicySecrets(d), d).toBe('');
    }
    // An alias value (not key) is located and blanked as before.
    const aliasValue = `inbound:\n  - name: &t openid-connect\n    actions:\n      - type: *t\n        config: {issuer_url: "https://idp.example.com", client_id: abc, client_secret: ${OS}}\n`;
    expect(redactTrafficPolicySecrets(aliasValue)).toBe(aliasValue.replace(OS, '""'));
  });

  it('returns comments as written, a commented-out secret included (documented)', () => {
    const doc = `inbound:\n  - actions:\n      - type: verify-webhook\n        config:\n          provider: github\n          secret: ${HOOK} # old: ${PW}\n`;
    expect(redactTrafficPolicySecrets(doc)).toBe(doc.replace(`${HOOK} #`, '"" #'));
  });

  it('blanks secrets in outbound rules too (refused there on save, but never shown)', () => {
    const doc = `outbound:\n  - actions:\n      - type: verify-webhook\n        config: {provider: github, secret: ${HOOK}}\n`;
    expect(redactTrafficPolicySecrets(doc)).toBe('outbound:\n  - actions:\n      - type: verify-webhook\n        config: {provider: github, secret: ""}\n');
  });
});

describe('mergeTrafficPolicySecrets', () => {
  it('a GET→PUT round trip gives back the stored document byte for byte (YAML and JSON)', () => {
    expect(mergeTrafficPolicySecrets(YAML_REDACTED, YAML_DOC)).toBe(YAML_DOC);
    const json = JSON.stringify(JSON_VALUE, null, 2);
    expect(mergeTrafficPolicySecrets(redactTrafficPolicySecrets(json), json)).toBe(json);
  });

  it('keeps stored secrets in a changed document and validates as the stored one', () => {
    const edited = YAML_REDACTED.replace('realm: staff', 'realm: team').replace('# the policy', '# edited');
    const merged = mergeTrafficPolicySecrets(edited, YAML_DOC);
    expect(merged).toBe(YAML_DOC.replace('realm: staff', 'realm: team').replace('# the policy', '# edited'));
    parseTrafficPolicy(merged);
    // A document converted to JSON keeps the secrets too (as JSON strings).
    const asJson = JSON.stringify(parseYaml(YAML_REDACTED), null, 2);
    expect(parseYaml(mergeTrafficPolicySecrets(asJson, YAML_DOC))).toEqual(parseYaml(YAML_DOC));
    expect(() => JSON.parse(mergeTrafficPolicySecrets(asJson, YAML_DOC))).not.toThrow();
  });

  it('matches basic-auth credentials by username, and takes new values as given', () => {
    const stored = `inbound:\n  - actions:\n      - type: basic-auth\n        config: {credentials: ["alice:${PW}", "bob:${PW2}"]}\n`;
    const reordered = `inbound:\n  - actions:\n      - type: basic-auth\n        config: {credentials: ["bob:", "carol:carol-pass-1", "alice:"]}\n`;
    expect(parseYaml(mergeTrafficPolicySecrets(reordered, stored)).inbound[0].actions[0].config.credentials).toEqual([`bob:${PW2}`, 'carol:carol-pass-1', `alice:${PW}`]);
    const replaced = `inbound:\n  - actions:\n      - type: basic-auth\n        config: {credentials: ["alice:new-password-9"]}\n`;
    expect(mergeTrafficPolicySecrets(replaced, stored)).toBe(replaced);
    // The same username twice keeps each password by index.
    const twice = `inbound:\n  - actions:\n      - type: basic-auth\n        config: {credentials: ["alice:${PW}", "alice:${PW2}"]}\n`;
    expect(parseYaml(mergeTrafficPolicySecrets(redactTrafficPolicySecrets(twice), twice)).inbound[0].actions[0].config.credentials).toEqual([`alice:${PW}`, `alice:${PW2}`]);
  });

  it('refuses a blank without a stored counterpart, naming the field and quoting no secret', () => {
    const blankHook = 'inbound:\n  - actions:\n      - type: deny\n      - type: verify-webhook\n        config: {provider: github, secret: ""}\n';
    const storedHook = `inbound:\n  - actions:\n      - type: deny\n      - type: verify-webhook\n        config: {provider: github, secret: ${HOOK}}\n`;
    const cases: [string, string | undefined, string][] = [
      [blankHook, undefined, 'inbound[0].actions[1].config.secret'],
      // the stored secret is at another place, or for another provider or action type
      [blankHook, storedHook.replace('- type: deny\n      ', ''), 'inbound[0].actions[1].config.secret'],
      [blankHook.replace('github', 'stripe'), storedHook, 'inbound[0].actions[1].config.secret'],
      [blankHook, YAML_DOC, 'inbound[0].actions[1].config.secret'],
      [YAML_REDACTED.replace('"alice:"', '"mallory:"'), YAML_DOC, 'inbound[1].actions[1].config.credentials[0]'],
      [YAML_REDACTED.replace('provider: google', 'provider: github'), YAML_DOC, 'inbound[2].actions[0].config.client_secret'],
      [YAML_REDACTED, YAML_DOC.replace(`client_secret: ${OS}`, 'client_secret: x').replace('type: openid-connect', 'type: oauth'), 'inbound[2].actions[1].config.client_secret'],
    ];
    for (const [text, stored, path] of cases) {
      let err: unknown;
      try {
        mergeTrafficPolicySecrets(text, stored);
      } catch (e) {
        err = e;
      }
      expect(err, path).toBeInstanceOf(TrafficPolicyError);
      expect((err as TrafficPolicyError).path).toBe(path);
      expect((err as Error).message.startsWith(`${path}: `)).toBe(true);
      noSecretIn((err as Error).message);
    }
  });

  it('keeps a client_secret only while the issuer_url / provider and client_id are unchanged (review: the secret followed an issuer the editor chose)', () => {
    const oidc = (issuer: string, clientId: string, secret: string) =>
      `inbound:\n  - actions:\n      - type: openid-connect\n        config:\n          issuer_url: ${issuer}\n          client_id: ${clientId}\n          client_secret: "${secret}"\n`;
    const stored = oidc('https://login.corp.example', 'app', OS);
    expect(mergeTrafficPolicySecrets(redactTrafficPolicySecrets(stored), stored)).toBe(stored);
    const oauth = (provider: string, clientId: string, secret: string) =>
      `inbound:\n  - actions:\n      - type: oauth\n        config: {provider: ${provider}, client_id: ${clientId}, client_secret: "${secret}"}\n`;
    const storedOAuth = oauth('google', 'cid', CS);
    expect(mergeTrafficPolicySecrets(oauth('google', 'cid', ''), storedOAuth)).toBe(storedOAuth);
    const cases: [string, string, RegExp][] = [
      [oidc('https://idp.attacker.example', 'app', ''), stored, /issuer_url and client_id are unchanged, but issuer_url differs/],
      [oidc('https://login.corp.example/', 'app', ''), stored, /issuer_url differs/],
      [oidc('https://login.corp.example', 'other', ''), stored, /but client_id differs/],
      [oauth('google', 'other', ''), storedOAuth, /provider and client_id are unchanged, but client_id differs/],
      [oauth('github', 'cid', ''), storedOAuth, /provider differs/],
    ];
    for (const [text, prev, msg] of cases) {
      let err: unknown;
      try {
        mergeTrafficPolicySecrets(text, prev);
      } catch (e) {
        err = e;
      }
      expect(err, text).toBeInstanceOf(TrafficPolicyError);
      expect((err as TrafficPolicyError).path).toBe('inbound[0].actions[0].config.client_secret');
      expect((err as Error).message).toMatch(msg);
      noSecretIn((err as Error).message);
    }
  });

  it('leaves documents without blanks alone', () => {
    for (const d of [YAML_DOC, 'inbound: [', 'inbound:\n  - actions:\n      - type: verify-webhook\n        config: {provider: SNS, secret: ""}\n'])
      expect(mergeTrafficPolicySecrets(d, undefined)).toBe(d);
  });
});

describe('hasBlankTrafficPolicySecrets', () => {
  it('is true for "" and "user:" where a secret belongs', () => {
    expect(hasBlankTrafficPolicySecrets(YAML_REDACTED)).toBe(true);
    expect(hasBlankTrafficPolicySecrets(YAML_DOC)).toBe(false);
    expect(hasBlankTrafficPolicySecrets('inbound: [{actions: [{type: basic-auth, config: {credentials: ["alice:"]}}]}]')).toBe(true);
    expect(hasBlankTrafficPolicySecrets('inbound: [{actions: [{type: verify-webhook, config: {provider: sns, secret: ""}}]}]')).toBe(false);
    expect(hasBlankTrafficPolicySecrets('inbound: [{actions: [{type: oauth, config: {provider: github, client_secret: ""}}]}]')).toBe(false);
    expect(hasBlankTrafficPolicySecrets('inbound: [{actions: [{type: oauth, config: {provider: github, client_id: c, client_secret: ""}}]}]')).toBe(true);
    expect(hasBlankTrafficPolicySecrets('inbound: [')).toBe(false);
  });
});

describe("ngrok's phase names (on_http_request / on_http_response)", () => {
  /** The document with ngrok's names for its phases. */
  const ngrok = (text: string) => text.replace(/^inbound:/m, 'on_http_request:').replace(/^outbound:/m, 'on_http_response:');
  const NGROK_DOC = ngrok(YAML_DOC);
  const NGROK_REDACTED = ngrok(YAML_REDACTED);
  const { inbound: jsonRules } = JSON_VALUE;
  const NGROK_JSON = { on_http_request: jsonRules };

  const mergeError = (text: string, stored: string | undefined): TrafficPolicyError => {
    try {
      mergeTrafficPolicySecrets(text, stored);
    } catch (e) {
      expect(e).toBeInstanceOf(TrafficPolicyError);
      noSecretIn((e as Error).message);
      return e as TrafficPolicyError;
    }
    throw new Error('expected a refusal');
  };

  it('redacts every secret kind in YAML, byte for byte as under inbound', () => {
    expect(NGROK_DOC).toContain('on_http_request:');
    expect(NGROK_DOC).toContain('on_http_response:');
    expect(parseTrafficPolicy(NGROK_DOC)).toEqual(parseTrafficPolicy(YAML_DOC));
    const out = redactTrafficPolicySecrets(NGROK_DOC);
    expect(out).toBe(NGROK_REDACTED);
    noSecretIn(out);
    expect(hasBlankTrafficPolicySecrets(out)).toBe(true);
    expect(hasBlankTrafficPolicySecrets(NGROK_DOC)).toBe(false);
  });

  it('redacts every secret kind in JSON, key order and indentation kept', () => {
    const withOidc = structuredClone(NGROK_JSON);
    withOidc.on_http_request.push({ actions: [{ type: 'openid-connect', config: { issuer_url: 'https://id.example.com', client_id: 'oid', client_secret: OS } as never }] });
    for (const indent of [2, undefined] as const) {
      const text = JSON.stringify(withOidc, null, indent);
      parseTrafficPolicy(text);
      const out = redactTrafficPolicySecrets(text);
      noSecretIn(out);
      const v = JSON.parse(out);
      expect(Object.keys(v)).toEqual(['on_http_request']);
      expect(v.on_http_request[0].actions[0].config).toEqual({ secret: '', provider: 'stripe', enforce: true });
      expect(v.on_http_request[1].actions[0].config.credentials).toEqual(['alice:', 'bob:']);
      expect(v.on_http_request[2].actions[0].config.client_secret).toBe('');
      expect(v.on_http_request[3].actions[0].config.client_secret).toBe('');
      expect(out).toBe(JSON.stringify(v, null, indent));
    }
  });

  it('redacts in on_http_response rules, and under both names of a phase (a document refused on save, but never shown)', () => {
    const res = `on_http_response:\n  - actions:\n      - type: verify-webhook\n        config: {provider: github, secret: ${HOOK}}\n`;
    expect(redactTrafficPolicySecrets(res)).toBe(res.replace(HOOK, '""'));
    const both = `inbound:\n  - actions:\n      - type: basic-auth\n        config: {credentials: ["alice:${PW}"]}\non_http_request:\n  - actions:\n      - type: oauth\n        config: {provider: google, client_id: cid, client_secret: ${CS}}\n`;
    const out = redactTrafficPolicySecrets(both);
    noSecretIn(out);
    expect(out).toBe(both.replace(`"alice:${PW}"`, '"alice:"').replace(CS, '""'));
  });

  it('fails closed on a secret it cannot locate under the new names (the safety net reads them too)', () => {
    const docs = [
      `on_http_request:\n  - name: &k secret\n    actions:\n      - type: verify-webhook\n        config:\n          provider: github\n          *k : ${HOOK}\n`,
      `on_http_response:\n  - name: &k client_secret\n    actions:\n      - type: oauth\n        config:\n          provider: google\n          client_id: c\n          *k : ${CS}\n`,
      `x: &a actions\non_http_request:\n  - *a : [{type: basic-auth, config: {credentials: ["alice:${PW}"]}}]\n`,
    ];
    for (const d of docs) {
      expect(parseYaml(d), d).toBeTruthy();
      expect(redactTrafficPolicySecrets(d), d).toBe('');
    }
  });

  it('a GET→PUT round trip gives back the stored document byte for byte', () => {
    expect(mergeTrafficPolicySecrets(NGROK_REDACTED, NGROK_DOC)).toBe(NGROK_DOC);
    const json = JSON.stringify(NGROK_JSON, null, 2);
    expect(mergeTrafficPolicySecrets(redactTrafficPolicySecrets(json), json)).toBe(json);
  });

  it('keeps a stored secret across namings of the phase: the place is the direction, rule and action', () => {
    // stored with inbound, sent back with on_http_request …
    const merged = mergeTrafficPolicySecrets(NGROK_REDACTED, YAML_DOC);
    expect(merged).toBe(NGROK_DOC);
    expect(parseTrafficPolicy(merged)).toEqual(parseTrafficPolicy(YAML_DOC));
    // … and the other way round, JSON
    const asJson = JSON.stringify(parseYaml(YAML_REDACTED), null, 2);
    expect(parseYaml(mergeTrafficPolicySecrets(asJson, NGROK_DOC))).toEqual(parseYaml(YAML_DOC));
    // the response phase likewise
    const res = (dir: string, secret: string) => `${dir}:\n  - actions:\n      - type: verify-webhook\n        config: {provider: github, secret: "${secret}"}\n`;
    expect(mergeTrafficPolicySecrets(res('on_http_response', ''), res('outbound', HOOK))).toBe(res('on_http_response', HOOK));
    expect(mergeTrafficPolicySecrets(res('outbound', ''), res('on_http_response', HOOK))).toBe(res('outbound', HOOK));
  });

  it('refuses a blank whose stored counterpart is in the other phase, or for another target, naming the field as written', () => {
    const hook = (dir: string, secret: string, provider = 'github') => `${dir}:\n  - actions:\n      - type: verify-webhook\n        config: {provider: ${provider}, secret: "${secret}"}\n`;
    expect(mergeError(hook('on_http_response', ''), hook('inbound', HOOK)).path).toBe('on_http_response[0].actions[0].config.secret');
    expect(mergeError(hook('on_http_request', ''), hook('outbound', HOOK)).path).toBe('on_http_request[0].actions[0].config.secret');
    expect(mergeError(hook('on_http_request', ''), hook('on_http_response', HOOK)).path).toBe('on_http_request[0].actions[0].config.secret');
    const e = mergeError(hook('on_http_request', '', 'stripe'), hook('inbound', HOOK));
    expect(e.message).toBe('on_http_request[0].actions[0].config.secret: is "", which keeps a stored secret, but the stored policy has no verify-webhook secret for provider "stripe" at on_http_request[0].actions[0]; write the secret');
    // the same rule and action index, but another rule
    expect(mergeError(`on_http_request:\n  - actions: [{type: deny}]\n${hook('', '').slice(2)}`, hook('inbound', HOOK)).path).toBe('on_http_request[1].actions[0].config.secret');
    // oauth / openid-connect: the same provider / issuer and client_id, whichever the naming
    const cases: [string, string, RegExp][] = [
      [NGROK_REDACTED.replace('client_id: cid', 'client_id: other'), YAML_DOC, /^on_http_request\[2\]\.actions\[0\]\.config\.client_secret: .*but client_id differs/],
      [NGROK_REDACTED.replace('provider: google', 'provider: github'), YAML_DOC, /^on_http_request\[2\]\.actions\[0\]\.config\.client_secret: .*but provider differs/],
      [YAML_REDACTED.replace('https://id.example.com', 'https://idp.attacker.example'), NGROK_DOC, /^inbound\[2\]\.actions\[1\]\.config\.client_secret: .*but issuer_url differs/],
      [NGROK_REDACTED.replace('"alice:"', '"mallory:"'), YAML_DOC, /^on_http_request\[1\]\.actions\[1\]\.config\.credentials\[0\]: /],
    ];
    for (const [text, stored, msg] of cases) expect(mergeError(text, stored).message).toMatch(msg);
  });
});
