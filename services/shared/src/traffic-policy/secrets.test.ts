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

    // An anchor a non-secret field shares: that field keeps its value, the secret field is blanked.
    const sharedWithHeader = `inbound:\n  - actions:\n      - type: add-headers\n        config: {headers: {x-a: &s ${HOOK}}} # comment\n      - type: verify-webhook\n        config: {provider: github, secret: *s}\n`;
    const v = parseYaml(redactTrafficPolicySecrets(sharedWithHeader));
    expect(v.inbound[0].actions[0].config.headers['x-a']).toBe(HOOK);
    expect(v.inbound[0].actions[1].config.secret).toBe('');
    // The anchor on the secret itself, an alias in a header: written again from the value.
    const anchoredSecret = `inbound:\n  - actions:\n      - type: verify-webhook\n        config: {provider: github, secret: &s ${HOOK}}\n      - type: add-headers\n        config: {headers: {x-a: *s}}\n`;
    const w = parseYaml(redactTrafficPolicySecrets(anchoredSecret));
    expect(w.inbound[0].actions[0].config.secret).toBe('');
    expect(w.inbound[0].actions[1].config.headers['x-a']).toBe(HOOK);
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
