import { createHash } from 'node:crypto';
import type { DataPlaneConfig, DpCredential, DpEdge, DpRoute } from '@warren/shared';
import type { DpDeletedIds, DpEntityLists } from '../../../shared/src/proto/index.js';
import { applyDelta, buildConfig } from './config-state.js';

/**
 * A large multi-tenant config for the state-store tests and measurements: `routes` routes with
 * traffic policies of `policyKiB` KiB or so each (many rules, varied text), on one edge per
 * 4 routes, and `credentials` credentials.
 */

export const noEntities = (): DpEntityLists => ({ edges: [], routes: [], backends: [], ipPolicies: [], certificateAuthorities: [], credentials: [], eventSubscriptions: [] });
export const noDeletes = (): DpDeletedIds => ({ edges: [], routes: [], backends: [], ipPolicies: [], certificateAuthorities: [], credentials: [], eventSubscriptions: [] });

const hex = (s: string) => createHash('sha256').update(s).digest('hex');

export function policy(seed: string, kib: number): { enabled: boolean; value: unknown } {
  const rules: unknown[] = [];
  let bytes = 0;
  for (let i = 0; bytes < kib * 1024; i++) {
    const rule = {
      name: `rule ${i} of ${seed}`,
      expressions: [`req.headers['x-${hex(seed + i).slice(0, 8)}'][0] == '${hex(`${seed}/${i}`)}'`, `req.url.path.startsWith('/api/v${i % 7}/${hex(seed).slice(i % 40, (i % 40) + 16)}')`],
      actions: [
        { type: 'add-headers', config: { headers: { [`x-rule-${i}`]: hex(`${i}${seed}`), 'x-tenant': seed } } },
        { type: 'custom-response', config: { status_code: 200 + (i % 300), content: `<html><body>${hex(`c${i}${seed}`).repeat(3)}</body></html>` } },
      ],
    };
    bytes += JSON.stringify(rule).length;
    rules.push(rule);
  }
  return { enabled: true, value: { on_http_request: rules } };
}

export const edge = (i: number): DpEdge => ({ id: `edghts_${i}`, accountId: `ac_${i % 500}`, hostports: [`app-${i}.example.com:443`], mutualTls: null, tlsTermination: { enabled: true, minVersion: '1.2' } });

export function route(i: number, kib: number, gen = 0): DpRoute {
  return {
    id: `edghtsrt_${i}`,
    accountId: `ac_${Math.floor(i / 4) % 500}`,
    edgeId: `edghts_${Math.floor(i / 4)}`,
    matchType: 'path_prefix',
    match: `/r${i}`,
    modules: { compression: { enabled: true }, request_headers: { enabled: true, add: { 'x-gen': String(gen) }, remove: [] } },
    backendId: null,
    ipPolicyIds: [],
    trafficPolicy: policy(`${i}-${gen}`, kib),
  };
}

export const credential = (i: number, gen = 0): DpCredential => ({ id: `cr_${i}`, accountId: `ac_${i % 500}`, tokenHash: hex(`token ${i} ${gen}`), acl: [`bind:*.tenant-${i % 500}.example.com`] });

/** Routes' policies are 20-50 KiB (cycling), as in the measurements of the commit message. */
export function largeConfig(o: { routes: number; credentials: number; version?: number }): DataPlaneConfig {
  const e = noEntities();
  for (let i = 0; i < Math.ceil(o.routes / 4); i++) e.edges.push(edge(i));
  for (let i = 0; i < o.routes; i++) e.routes.push(route(i, 20 + (i % 31)));
  for (let i = 0; i < o.credentials; i++) e.credentials.push(credential(i));
  return buildConfig(o.version ?? 1, e);
}

/**
 * The n-th small change of a config (as an account's API write would make): one route's policy
 * replaced, one credential rotated, every 5th change a credential deleted and another added.
 */
export function smallDelta(prev: DataPlaneConfig, n: number, kib = 30): { next: DataPlaneConfig; upserts: DpEntityLists; deletes: DpDeletedIds } {
  const upserts = noEntities();
  const deletes = noDeletes();
  const routeIds = prev.routes.size;
  upserts.routes.push(route((n * 7919) % routeIds, kib, n + 1));
  upserts.credentials.push(credential((n * 104729) % 1000, n + 1));
  if (n % 5 === 4) {
    deletes.credentials.push(`cr_${1000 + n}`);
    upserts.credentials.push(credential(1_000_000 + n));
  }
  return { next: applyDelta(prev, prev.version + 1, upserts, deletes), upserts, deletes };
}

/** A smallish config and `n` deltas after it (deterministic: a parent and a child process build the same). */
export function chainOf(n: number, o: { routes: number; credentials: number } = { routes: 120, credentials: 2000 }) {
  const base = largeConfig({ ...o, version: 10 });
  const deltas: { prev: number; next: DataPlaneConfig; upserts: DpEntityLists; deletes: DpDeletedIds }[] = [];
  let cfg = base;
  for (let i = 0; i < n; i++) {
    const d = smallDelta(cfg, i, 4);
    deltas.push({ prev: cfg.version, ...d });
    cfg = d.next;
  }
  return { base, deltas };
}
