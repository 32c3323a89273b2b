import { lenField, type Resources, type Snapshot, type Tunnel } from '../../../shared/src/proto/index.js';

/**
 * Snapshots in parts (`Snapshot.part`/`more`, to nodes whose hello had `parts`): each part holds
 * entities and remote tunnels up to about this many bytes encoded; an entity larger than that
 * (entities are bounded at save time, e.g. a traffic policy ≤ 256 KiB) goes alone in its part.
 * Far below the 256 MiB a node accepts per message, and small enough that one part is quick to
 * encode and send.
 */
export const DEFAULT_SNAPSHOT_PART_BYTES = 4 * 1024 * 1024;

/** What a full sync a node sends in parts may add up to before its stream is ended. */
export const DEFAULT_MAX_FULL_SYNC_BYTES = 256 * 1024 * 1024;

const RESOURCE_KINDS = ['edges', 'routes', 'backends', 'ipPolicies', 'certificateAuthorities', 'credentials', 'eventSubscriptions'] as const;
type ResourceKind = (typeof RESOURCE_KINDS)[number];


/**
 * An upper bound of the encoded size of a message given as the object the serializer takes
 * (proto-loader's shape: camelCase fields, arrays for repeated fields, a plain object for the
 * `labels` maps). Exact for strings, embedded messages and maps; numbers are counted at their
 * largest (10 bytes) and fields at their default value (empty, 0, false) as if they were sent.
 */
export function messageBytesBound(msg: object): number {
  let n = 0;
  for (const [k, v] of Object.entries(msg)) {
    if (v === null || v === undefined) continue;
    if (k === 'labels' && typeof v === 'object' && !Array.isArray(v)) {
      for (const [mk, mv] of Object.entries(v as Record<string, unknown>)) n += lenField(lenField(Buffer.byteLength(mk)) + lenField(Buffer.byteLength(String(mv))));
      continue;
    }
    n += valueBytesBound(v);
  }
  return n;
}

function valueBytesBound(v: unknown): number {
  switch (typeof v) {
    case 'string':
      return lenField(Buffer.byteLength(v));
    case 'number':
    case 'bigint':
      return 11;
    case 'boolean':
      return 2;
    case 'object': {
      if (v === null) return 0;
      if (Array.isArray(v)) {
        let n = 0;
        for (const x of v) n += valueBytesBound(x);
        return n;
      }
      if (Buffer.isBuffer(v)) return lenField(v.length);
      return lenField(messageBytesBound(v));
    }
    default:
      return 0;
  }
}

export interface SnapshotParts {
  parts: Snapshot[];
  /** Upper bound of the whole snapshot's entities and tunnels, encoded. */
  bytes: number;
}

/**
 * Splits a snapshot into parts of about `targetBytes` each (see DEFAULT_SNAPSHOT_PART_BYTES):
 * every part has the snapshot's version, epoch and commit time, `part` 0, 1, … and `more` on all
 * but the last. The entities keep their order (kind by kind), then the remote tunnels. Always at
 * least one part (an empty config is one empty part).
 */
export function splitSnapshot(s: { version: number; epoch: string; committedAtUnixMs: number; resources: Resources; remoteTunnels: Tunnel[] }, targetBytes: number): SnapshotParts {
  // Version, epoch, commit time, part, more, head_version and the tags of the embedded messages.
  const header = 64 + Buffer.byteLength(s.epoch);
  const parts: Snapshot[] = [];
  let resources: Resources = {};
  let tunnels: Tunnel[] = [];
  let bytes = 0;
  let total = 0;
  const flush = () => {
    parts.push({ version: s.version, epoch: s.epoch, committedAtUnixMs: s.committedAtUnixMs, resources, remoteTunnels: tunnels });
    resources = {};
    tunnels = [];
    bytes = 0;
  };
  const room = (n: number) => {
    if (bytes > 0 && header + bytes + n > targetBytes) flush();
    bytes += n;
    total += n;
  };
  for (const kind of RESOURCE_KINDS) {
    const list = (s.resources[kind] ?? []) as NonNullable<Resources[ResourceKind]>;
    for (const e of list) {
      room(valueBytesBound(e));
      ((resources[kind] ??= []) as object[]).push(e);
    }
  }
  for (const t of s.remoteTunnels) {
    room(valueBytesBound(t));
    tunnels.push(t);
  }
  flush();
  parts.forEach((p, i) => {
    p.part = i;
    p.more = i < parts.length - 1;
  });
  return { parts, bytes: total };
}
