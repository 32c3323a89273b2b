import { describe, expect, it } from 'vitest';
import type { DpCredential, DpEdge, DpEventSubscription, DpRoute } from '@warren/shared';
import type { DpDeletedIds, DpEntityLists } from '../../../shared/src/proto/index.js';
import { applyDelta, buildConfig, checkConfig, ConfigError, toLists } from './config-state.js';

const none = (): DpEntityLists => ({ edges: [], routes: [], backends: [], ipPolicies: [], certificateAuthorities: [], credentials: [], eventSubscriptions: [] });
const noDeletes = (): DpDeletedIds => ({ edges: [], routes: [], backends: [], ipPolicies: [], certificateAuthorities: [], credentials: [], eventSubscriptions: [] });

const edge = (id: string, hostports = [`${id}.example.com:443`], cas: string[] = []): DpEdge => ({
  id,
  accountId: 'ac_1',
  hostports,
  mutualTls: cas.length ? { enabled: true, certificateAuthorityIds: cas } : null,
  tlsTermination: null,
});
const route = (id: string, edgeId: string, over: Partial<DpRoute> = {}): DpRoute => ({
  id,
  accountId: 'ac_1',
  edgeId,
  matchType: 'path_prefix',
  match: '/',
  modules: {},
  backendId: null,
  ipPolicyIds: [],
  trafficPolicy: null,
  ...over,
});
const cred = (id: string, tokenHash: string): DpCredential => ({ id, accountId: 'ac_1', tokenHash, acl: [] });

describe('buildConfig / applyDelta', () => {
  it('builds maps and the token-hash index from a snapshot', () => {
    const cfg = buildConfig(7, { ...none(), edges: [edge('e1')], routes: [route('r1', 'e1')], credentials: [cred('c1', 'h1')] });
    expect(cfg.version).toBe(7);
    expect(cfg.routes.get('r1')!.edgeId).toBe('e1');
    expect(cfg.credentialsByTokenHash.get('h1')!.id).toBe('c1');
    expect(Object.isFrozen(cfg)).toBe(true);
    expect(Object.isFrozen(cfg.edges.get('e1'))).toBe(true);
    checkConfig(cfg);
    expect(toLists(cfg).routes).toEqual([route('r1', 'e1')]);
  });

  it('never changes the config it starts from, and shares maps that did not change', () => {
    const prev = buildConfig(1, { ...none(), edges: [edge('e1')], routes: [route('r1', 'e1')], credentials: [cred('c1', 'h1')] });
    const next = applyDelta(prev, 2, { ...none(), routes: [route('r1', 'e1', { match: '/x' }), route('r2', 'e1')] }, noDeletes());
    expect(prev.routes.get('r1')!.match).toBe('/');
    expect(prev.routes.has('r2')).toBe(false);
    expect(next.routes.get('r1')!.match).toBe('/x');
    expect(next.version).toBe(2);
    expect(next.edges).toBe(prev.edges);
    expect(next.credentials).toBe(prev.credentials);
    expect(next.credentialsByTokenHash).toBe(prev.credentialsByTokenHash);
  });

  it('keeps the token-hash index right through updates and deletes', () => {
    const prev = buildConfig(1, { ...none(), credentials: [cred('c1', 'h1'), cred('c2', 'h2')] });
    const next = applyDelta(prev, 2, { ...none(), credentials: [cred('c1', 'h1b')] }, { ...noDeletes(), credentials: ['c2'] });
    expect([...next.credentialsByTokenHash.keys()]).toEqual(['h1b']);
    expect(next.credentialsByTokenHash.get('h1b')!.id).toBe('c1');
    expect(prev.credentialsByTokenHash.size).toBe(2);
  });

  it('applies event subscriptions like other entities; a snapshot persisted without them builds an empty map', () => {
    const sub = (id: string, destId: string): DpEventSubscription => ({ id, accountId: 'ac_1', types: ['http_request_complete.v0'], destinations: [{ id: destId, kind: 'datadog' }] });
    const prev = buildConfig(1, { ...none(), eventSubscriptions: [sub('esb_1', 'ed_1'), sub('esb_2', 'ed_2')] });
    expect(prev.eventSubscriptions.get('esb_1')!.destinations[0]!.id).toBe('ed_1');
    const next = applyDelta(prev, 2, { ...none(), eventSubscriptions: [sub('esb_1', 'ed_3')] }, { ...noDeletes(), eventSubscriptions: ['esb_2', 'esb_unknown'] });
    expect([...next.eventSubscriptions.keys()]).toEqual(['esb_1']);
    expect(next.eventSubscriptions.get('esb_1')!.destinations[0]!.id).toBe('ed_3');
    expect(prev.eventSubscriptions.size).toBe(2);
    // Unchanged subscriptions keep their map (the traffic-event index is rebuilt only on change).
    expect(applyDelta(next, 3, { ...none(), edges: [edge('e1')] }, noDeletes()).eventSubscriptions).toBe(next.eventSubscriptions);
    expect(toLists(next).eventSubscriptions).toEqual([sub('esb_1', 'ed_3')]);
    const { eventSubscriptions: _, ...old } = none();
    expect(buildConfig(1, old as DpEntityLists).eventSubscriptions.size).toBe(0);
    expect(() => checkConfig(buildConfig(1, { ...none(), eventSubscriptions: [{ ...sub('esb_1', 'ed_1'), accountId: '' }] }))).toThrow(/event subscription "esb_1": missing id or account/);
  });

  it('drops the routes of a deleted edge even if their deletes are missing', () => {
    const prev = buildConfig(1, { ...none(), edges: [edge('e1'), edge('e2')], routes: [route('r1', 'e1'), route('r2', 'e2')] });
    const next = applyDelta(prev, 2, none(), { ...noDeletes(), edges: ['e1'] });
    expect([...next.routes.keys()]).toEqual(['r2']);
    checkConfig(next);
  });
});

describe('checkConfig', () => {
  const bad = (lists: Partial<DpEntityLists>) => () => checkConfig(buildConfig(1, { ...none(), ...lists }));

  it('refuses dangling references', () => {
    expect(bad({ routes: [route('r1', 'nope')] })).toThrow(/route r1: unknown edge nope/);
    expect(bad({ edges: [edge('e1')], routes: [route('r1', 'e1', { backendId: 'b9' })] })).toThrow(/unknown backend b9/);
    expect(bad({ edges: [edge('e1')], routes: [route('r1', 'e1', { ipPolicyIds: ['p9'] })] })).toThrow(/unknown IP policy p9/);
    expect(bad({ edges: [edge('e1', undefined, ['ca9'])] })).toThrow(/unknown certificate authority ca9/);
  });

  it('refuses a hostport on two edges and a token hash on two credentials', () => {
    expect(bad({ edges: [edge('e1', ['a.example.com:443']), edge('e2', ['a.example.com:443'])] })).toThrow(ConfigError);
    expect(bad({ credentials: [cred('c1', 'h'), cred('c2', 'h')] })).toThrow(/token hash/);
  });

  it('lists at most five problems', () => {
    const routes = Array.from({ length: 20 }, (_, i) => route(`r${i}`, 'missing'));
    try {
      checkConfig(buildConfig(1, { ...none(), routes }));
      expect.unreachable();
    } catch (err) {
      expect((err as Error).message.split('; ')).toHaveLength(5);
    }
  });
});
