import type { DataPlaneConfig, DpCredential } from '@warren/shared';
import type { DpDeletedIds, DpEntityLists } from '../../../shared/src/proto/index.js';

/**
 * Building and checking `DataPlaneConfig` values. Pure functions: a snapshot builds a config from
 * scratch, a delta builds a new one from the previous (copy-on-write maps); neither touches the
 * config it started from, so a failed apply leaves the served config as it was.
 */

export class ConfigError extends Error {
  override name = 'ConfigError';
}

function freezeAll<T extends object>(items: T[]): T[] {
  for (const i of items) Object.freeze(i);
  return items;
}

/** A config from a snapshot. `eventSubscriptions` may be missing (a config persisted before they existed). */
export function buildConfig(version: number, e: DpEntityLists): DataPlaneConfig {
  const credentials = new Map(freezeAll(e.credentials).map((c) => [c.id, c]));
  return Object.freeze({
    version,
    edges: new Map(freezeAll(e.edges).map((x) => [x.id, x])),
    routes: new Map(freezeAll(e.routes).map((x) => [x.id, x])),
    backends: new Map(freezeAll(e.backends).map((x) => [x.id, x])),
    ipPolicies: new Map(freezeAll(e.ipPolicies).map((x) => [x.id, x])),
    certificateAuthorities: new Map(freezeAll(e.certificateAuthorities).map((x) => [x.id, x])),
    credentials,
    credentialsByTokenHash: new Map([...credentials.values()].map((c) => [c.tokenHash, c])),
    eventSubscriptions: new Map(freezeAll(e.eventSubscriptions ?? []).map((x) => [x.id, x])),
  });
}

function patched<T extends { id: string }>(prev: ReadonlyMap<string, T>, upserts: T[], deletes: string[]): Map<string, T> {
  if (upserts.length === 0 && deletes.length === 0) return prev as Map<string, T>; // unchanged maps are shared
  const next = new Map(prev);
  for (const id of deletes) next.delete(id);
  for (const x of freezeAll(upserts)) next.set(x.id, x);
  return next;
}

/**
 * The config after a delta: upserts replace whole entities, deletes remove them. Routes of a
 * deleted edge go too (the control plane also sends their deletes; this keeps a config
 * consistent even if it did not).
 */
export function applyDelta(prev: DataPlaneConfig, version: number, upserts: DpEntityLists, deletes: DpDeletedIds): DataPlaneConfig {
  const edges = patched(prev.edges, upserts.edges, deletes.edges);
  let routeDeletes = deletes.routes;
  if (deletes.edges.length > 0) {
    const gone = new Set(deletes.edges.filter((id) => !edges.has(id)));
    const orphans = [...prev.routes.values()].filter((r) => gone.has(r.edgeId)).map((r) => r.id);
    if (orphans.length > 0) routeDeletes = [...routeDeletes, ...orphans];
  }
  const credentials = patched(prev.credentials, upserts.credentials, deletes.credentials);
  let byHash = prev.credentialsByTokenHash as Map<string, DpCredential>;
  if (credentials !== prev.credentials) {
    byHash = new Map(byHash);
    for (const id of [...deletes.credentials, ...upserts.credentials.map((c) => c.id)]) {
      const old = prev.credentials.get(id);
      if (old && byHash.get(old.tokenHash)?.id === id) byHash.delete(old.tokenHash);
    }
    for (const c of upserts.credentials) if (credentials.get(c.id) === c) byHash.set(c.tokenHash, c);
  }
  return Object.freeze({
    version,
    edges,
    routes: patched(prev.routes, upserts.routes, routeDeletes),
    backends: patched(prev.backends, upserts.backends, deletes.backends),
    ipPolicies: patched(prev.ipPolicies, upserts.ipPolicies, deletes.ipPolicies),
    certificateAuthorities: patched(prev.certificateAuthorities, upserts.certificateAuthorities, deletes.certificateAuthorities),
    credentials,
    credentialsByTokenHash: byHash,
    eventSubscriptions: patched(prev.eventSubscriptions, upserts.eventSubscriptions, deletes.eventSubscriptions),
  });
}

const MAX_PROBLEMS = 5;

/**
 * Structural checks before a config is served: ids present, every reference resolves (route →
 * edge, backend, IP policies; edge → certificate authorities), no hostport on two edges, no token
 * hash on two credentials. Throws `ConfigError` naming the first few problems.
 */
export function checkConfig(cfg: DataPlaneConfig): void {
  const problems: string[] = [];
  const add = (p: string) => {
    if (problems.length < MAX_PROBLEMS) problems.push(p);
  };
  const hostports = new Map<string, string>();
  for (const [id, e] of cfg.edges) {
    if (!id || e.id !== id || !e.accountId) add(`edge ${JSON.stringify(id)}: missing id or account`);
    for (const hp of e.hostports) {
      const other = hostports.get(hp);
      if (other) add(`edge ${id}: hostport ${hp} is also on edge ${other}`);
      else hostports.set(hp, id);
    }
    for (const ca of e.mutualTls?.certificateAuthorityIds ?? []) if (!cfg.certificateAuthorities.has(ca)) add(`edge ${id}: unknown certificate authority ${ca}`);
  }
  for (const [id, r] of cfg.routes) {
    if (!id || r.id !== id || !r.accountId) add(`route ${JSON.stringify(id)}: missing id or account`);
    if (!cfg.edges.has(r.edgeId)) add(`route ${id}: unknown edge ${r.edgeId}`);
    if (r.backendId && !cfg.backends.has(r.backendId)) add(`route ${id}: unknown backend ${r.backendId}`);
    for (const p of r.ipPolicyIds) if (!cfg.ipPolicies.has(p)) add(`route ${id}: unknown IP policy ${p}`);
  }
  for (const [id, p] of cfg.ipPolicies) if (!id || p.id !== id) add(`IP policy ${JSON.stringify(id)}: missing id`);
  for (const [id, s] of cfg.eventSubscriptions) {
    if (!id || s.id !== id || !s.accountId) add(`event subscription ${JSON.stringify(id)}: missing id or account`);
    for (const d of s.destinations) if (!d.id) add(`event subscription ${id}: destination without id`);
  }
  for (const [id, b] of cfg.backends) if (!id || b.id !== id) add(`backend ${JSON.stringify(id)}: missing id`);
  for (const [id, c] of cfg.certificateAuthorities) if (!id || c.id !== id) add(`certificate authority ${JSON.stringify(id)}: missing id`);
  const hashes = new Set<string>();
  for (const [id, c] of cfg.credentials) {
    if (!id || c.id !== id || !c.tokenHash) add(`credential ${JSON.stringify(id)}: missing id or token hash`);
    if (hashes.has(c.tokenHash)) add(`credential ${id}: token hash shared with another credential`);
    hashes.add(c.tokenHash);
  }
  if (problems.length > 0) throw new ConfigError(problems.join('; '));
}

/** Plain lists of a config (for disk). */
export function toLists(cfg: DataPlaneConfig): DpEntityLists {
  return {
    edges: [...cfg.edges.values()],
    routes: [...cfg.routes.values()],
    backends: [...cfg.backends.values()],
    ipPolicies: [...cfg.ipPolicies.values()],
    certificateAuthorities: [...cfg.certificateAuthorities.values()],
    credentials: [...cfg.credentials.values()],
    eventSubscriptions: [...cfg.eventSubscriptions.values()],
  };
}
