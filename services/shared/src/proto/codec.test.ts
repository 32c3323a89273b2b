import { describe, expect, it } from 'vitest';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { DpRoute, DpTunnel } from '../dataplane/types.js';
import { CodecError, configStreamCodec, deletesFromProto, deletesToProto, resourcesFromProto, resourcesToProto, tunnelFromProto, tunnelToProto } from './index.js';

const route: DpRoute = {
  id: 'edghtsrt_1',
  accountId: 'ac_1',
  edgeId: 'edghts_1',
  matchType: 'exact_path',
  match: '/a',
  modules: { backend: { enabled: true, backend_id: 'bkdtg_1' }, webhook_verification: { provider: 'GitHub', secret: 's' } },
  backendId: 'bkdtg_1',
  ipPolicyIds: ['ipp_1', 'ipp_2'],
  trafficPolicy: { enabled: false, value: { inbound: [], outbound: [] } },
};

const tunnel: DpTunnel = {
  id: 'tn_1',
  accountId: 'ac_1',
  sessionId: 'ts_1',
  proto: 'labeled',
  labels: { app: 'web' },
  publicUrl: '',
  bindings: [],
  poolingEnabled: true,
  forwardsTo: 'localhost:80',
  metadata: 'm',
  startedAt: '2026-01-01T00:00:00.000Z',
  nodeId: 'n1',
  nodeAddress: '10.0.0.1:9100',
};

describe('warren.config.v1 codec', () => {
  it('round-trips every entity through the wire encoding', () => {
    const codec = configStreamCodec();
    const lists = {
      edges: [
        {
          id: 'edghts_1',
          accountId: 'ac_1',
          hostports: ['a.example.com:443', 'b.example.com:8443'],
          mutualTls: { enabled: true, certificateAuthorityIds: ['ca_1'] },
          tlsTermination: { enabled: true, minVersion: '1.3' },
          hostportClaimedMs: { 'a.example.com:443': 1_700_000_000_123, 'b.example.com:8443': 1_800_000_000_456 } as Record<string, number>,
        },
        // No claims recorded (hostports stored before they were): an empty map.
        { id: 'edghts_2', accountId: 'ac_1', hostports: [], mutualTls: null, tlsTermination: { enabled: false, minVersion: null }, hostportClaimedMs: {} },
      ],
      routes: [route, { ...route, id: 'edghtsrt_2', backendId: null, ipPolicyIds: [], trafficPolicy: null, modules: {} }],
      backends: [{ id: 'bkdtg_1', accountId: 'ac_1', labels: { a: 'b' } }],
      ipPolicies: [{ id: 'ipp_1', accountId: 'ac_1', rules: [{ id: 'ipr_1', cidr: '10.0.0.0/8', action: 'deny' as const }] }],
      certificateAuthorities: [{ id: 'ca_1', accountId: 'ac_1', caPem: '-----BEGIN CERTIFICATE-----\n' }],
      credentials: [{ id: 'cr_1', accountId: 'ac_1', tokenHash: 'ab'.repeat(32), acl: ['bind:*'] }],
      eventSubscriptions: [
        {
          id: 'esb_1',
          accountId: 'ac_1',
          types: ['tcp_connection_closed.v0' as const, 'http_request_complete.v0' as const],
          destinations: [{ id: 'ed_1', kind: 'datadog' as const }, { id: 'ed_2', kind: 'kinesis' as const }],
        },
      ],
    };
    const deletes = { edges: ['e'], routes: ['r'], backends: [], ipPolicies: ['p'], certificateAuthorities: [], credentials: ['c'], eventSubscriptions: ['esb_9'] };
    const buf = codec.encodeControl({ delta: { fromVersion: 4, version: 9, epoch: 'x', upserts: resourcesToProto(lists), deletes: deletesToProto(deletes), committedAtUnixMs: 1_700_000_000_123 }, headVersion: 10 });
    const back = codec.decodeControl(buf);
    expect(back.msg).toBe('delta');
    expect(back.headVersion).toBe(10);
    expect(back.delta!.committedAtUnixMs).toBe(1_700_000_000_123);
    expect(resourcesFromProto(back.delta!.upserts)).toEqual(lists);
    expect(deletesFromProto(back.delta!.deletes)).toEqual(deletes);

    const t = codec.decodeControl(codec.encodeControl({ tunnels: { up: [tunnelToProto(tunnel)], down: ['tn_2'], replaceAll: false } }));
    expect(tunnelFromProto(t.tunnels!.up[0]!)).toEqual(tunnel);
  });

  it('refuses malformed values instead of passing them on', () => {
    const codec = configStreamCodec();
    const bad = codec.decodeControl(codec.encodeControl({ snapshot: { resources: resourcesToProto({ edges: [], routes: [route], backends: [], ipPolicies: [], certificateAuthorities: [], credentials: [], eventSubscriptions: [] }) } }));
    bad.snapshot!.resources!.routes[0]!.modulesJson = '{not json';
    expect(() => resourcesFromProto(bad.snapshot!.resources)).toThrow(CodecError);
    bad.snapshot!.resources!.routes[0]!.modulesJson = '[]';
    expect(() => resourcesFromProto(bad.snapshot!.resources)).toThrow(/not an object/);
    bad.snapshot!.resources!.routes[0]!.modulesJson = '{}';
    bad.snapshot!.resources!.routes[0]!.matchType = 'regex';
    expect(() => resourcesFromProto(bad.snapshot!.resources)).toThrow(/match_type/);
    const edge = { id: 'edghts_1', accountId: 'ac_1', hostports: ['a.test:443'], mutualTls: null, tlsTermination: null, hostportClaimedMs: { 'a.test:443': -5 } };
    const badEdge = codec.decodeControl(codec.encodeControl({ snapshot: { resources: resourcesToProto({ edges: [edge], routes: [], backends: [], ipPolicies: [], certificateAuthorities: [], credentials: [], eventSubscriptions: [] }) } }));
    expect(() => resourcesFromProto(badEdge.snapshot!.resources)).toThrow(/edge\.hostport_claimed_ms\.a\.test:443: not a time in Unix ms/);
  });

  it('keeps event types and destination kinds it does not know out of a subscription, and refuses malformed ones', () => {
    const codec = configStreamCodec();
    const sub = { id: 'esb_1', accountId: 'ac_1', types: ['http_request_complete.v0', 'udp_datagram.v9', 'ip_policy_created.v0'], destinations: [{ id: 'ed_1', kind: 'datadog' }, { id: 'ed_2', kind: 'pigeon' }] };
    const m = codec.decodeControl(codec.encodeControl({ snapshot: { resources: { eventSubscriptions: [sub] } } }));
    expect(resourcesFromProto(m.snapshot!.resources).eventSubscriptions).toEqual([{ id: 'esb_1', accountId: 'ac_1', types: ['http_request_complete.v0'], destinations: [{ id: 'ed_1', kind: 'datadog' }] }]);
    // A message older than the field (or a control plane without it) carries none.
    expect(resourcesFromProto(codec.decodeControl(codec.encodeControl({ snapshot: { resources: {} } })).snapshot!.resources).eventSubscriptions).toEqual([]);
    expect(deletesFromProto(null).eventSubscriptions).toEqual([]);
    m.snapshot!.resources!.eventSubscriptions[0]!.destinations = 'x' as never;
    expect(() => resourcesFromProto(m.snapshot!.resources)).toThrow(/destinations is not a list/);
  });

  it('committed generated types match the proto (bash proto/gen.sh)', () => {
    const root = fileURLToPath(new URL('../../../..', import.meta.url));
    const committed = path.join(root, 'services/shared/src/proto/generated');
    const fresh = mkdtempSync(path.join(tmpdir(), 'warren-proto-'));
    try {
      execFileSync('bash', [path.join(root, 'proto/gen.sh'), fresh], { cwd: root });
      const files = (dir: string): string[] =>
        readdirSync(dir).flatMap((f) => (statSync(path.join(dir, f)).isDirectory() ? files(path.join(dir, f)).map((g) => path.join(f, g)) : [f])).sort();
      expect(files(fresh)).toEqual(files(committed));
      for (const f of files(fresh)) expect(readFileSync(path.join(fresh, f), 'utf8'), f).toBe(readFileSync(path.join(committed, f), 'utf8'));
    } finally {
      rmSync(fresh, { recursive: true, force: true });
    }
  });
});
