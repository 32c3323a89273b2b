import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { gzipSync } from 'node:zlib';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { afterAll, afterEach, describe, expect, it, vi } from 'vitest';
import { CEL_NO_GEO, CelGeo, EnvError, GEO_LIMITS, GEO_LOOKUP_COST } from '@warren/shared';
import { cpuMicros, machineSlowdown } from '../../../../test/support/cpu-time.js';
import { cityRecord, MmdbWriter, uint16 } from '../../../../test/support/mmdb-writer.js';
import type { RequestState, RouteStage } from '../pipeline/types.js';
import { GeoDatabase, GeoDatabaseError, geoLookupOf, geoOfRecord, lookupAddress, NO_GEO_DATABASE, requestGeo, setGeoDatabase, startGeo } from './geo.js';
import { trafficPolicyStage } from './index.js';
import { CONFIG, deps, EDGE, request, route } from './testing.js';

const dir = mkdtempSync(path.join(tmpdir(), 'warren-geo-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
afterEach(() => setGeoDatabase(null));
const silent = pino({ level: 'silent' });

/** GeoLite2-like data: loopback in "XX", documentation ranges in real-looking places. */
function testDatabase(o: { recordSize?: 24 | 28 | 32; xxCity?: string } = {}): Buffer {
  const w = new MmdbWriter({ recordSize: o.recordSize, languages: ['en', 'de', 'fr'] });
  w.insert('127.0.0.0/8', cityRecord({ countryCode: 'XX', country: 'Testland', city: o.xxCity ?? 'Loopback', subdivisions: [['Localshire', 'LS']] }));
  w.insert('::1/128', cityRecord({ countryCode: 'XX', country: 'Testland', city: o.xxCity ?? 'Loopback' }));
  w.insert(
    '203.0.113.0/24',
    cityRecord({
      city: 'Strongsville',
      country: 'United States',
      countryCode: 'US',
      subdivisions: [['Ohio', 'OH']],
      latitude: 41.3197,
      longitude: -81.8358,
      radius: 5,
      postalCode: '44149',
      continentCode: 'NA',
      timeZone: 'America/New_York',
      otherLanguages: ['de', 'fr'],
    }),
  );
  // Two levels of subdivisions: ngrok's `subdivision` is the first (largest).
  w.insert('198.51.100.0/24', cityRecord({ city: 'London', country: 'United Kingdom', countryCode: 'GB', subdivisions: [['England', 'ENG'], ['Wandsworth', 'WND']], latitude: 51.4567, longitude: -0.1910, radius: 20 }));
  // A country-level record (no city, subdivision or location): those fields are "".
  w.insert('2001:db8::/32', cityRecord({ country: 'Germany', countryCode: 'DE', continentCode: 'EU' }));
  // A record with only a registered country (an anycast network): no `country`, so all "".
  w.insert('192.0.2.0/25', { registered_country: { iso_code: 'US', names: { en: 'United States' } }, location: { accuracy_radius: uint16(1000), latitude: 37.751, longitude: -97.822 } });
  // Oversized and oddly typed values are cut or ignored.
  w.insert('192.0.2.128/25', { city: { names: { en: 'N'.repeat(1000) } }, country: { iso_code: 'TOOLONGCODE', names: { de: 'Nur Deutsch' } }, subdivisions: 'not a list', location: { latitude: 'north' } });
  return w.build();
}

function dbFile(name: string, buf: Buffer = testDatabase()): string {
  const file = path.join(dir, name);
  writeFileSync(file, buf);
  return file;
}

describe('the GeoIP reader', () => {
  it('maps City records to ngrok’s fields', () => {
    const db = new GeoDatabase(dbFile('map.mmdb'));
    expect(db.describe()).toMatchObject({ database_type: 'GeoLite2-City', ip_version: 6 });
    expect({ ...db.lookup('203.0.113.9') }).toEqual({
      city: 'Strongsville',
      country: 'United States',
      country_code: 'US',
      latitude: '41.3197',
      longitude: '-81.8358',
      radius: '5',
      subdivision: 'Ohio',
    });
    expect({ ...db.lookup('198.51.100.1') }).toMatchObject({ city: 'London', country_code: 'GB', subdivision: 'England', latitude: '51.4567', longitude: '-0.191', radius: '20' });
    expect({ ...db.lookup('2001:db8::77') }).toEqual({ ...CEL_NO_GEO, country: 'Germany', country_code: 'DE' });
    expect({ ...db.lookup('192.0.2.1') }).toEqual({ ...new CelGeo('', '', '', '37.751', '-97.822', '1000', '') });
    const odd = db.lookup('192.0.2.200');
    expect([odd.city.length, odd.country, odd.country_code, odd.subdivision, odd.latitude]).toEqual([GEO_LIMITS.name, '', 'TOOLONGC', '', '']);
  });

  it('looks up the public address: IPv4-mapped IPv6 as IPv4, zones dropped, misses empty', () => {
    const db = new GeoDatabase(dbFile('addr.mmdb'));
    expect(db.lookup('127.0.0.1').country_code).toBe('XX');
    expect(db.lookup('::ffff:127.0.0.1').country_code).toBe('XX');
    expect(db.lookup('::FFFF:203.0.113.1').city).toBe('Strongsville');
    expect(db.lookup('::1').country_code).toBe('XX');
    expect(db.lookup('2001:db8::1%eth0').country_code).toBe('DE');
    for (const miss of ['10.0.0.1', '2001:db9::1', '::2', 'not-an-ip', '', '::ffff:1.2.3', '999.1.1.1']) expect(db.lookup(miss)).toBe(CEL_NO_GEO);
    expect([lookupAddress('::ffff:10.1.2.3'), lookupAddress('fe80::1%lo0'), lookupAddress('x')]).toEqual(['10.1.2.3', 'fe80::1', null]);
  });

  it('reads 24-, 28- and 32-bit record sizes and IPv4-only databases', () => {
    for (const recordSize of [24, 28, 32] as const) {
      expect(new GeoDatabase(dbFile(`rs${recordSize}.mmdb`, testDatabase({ recordSize }))).lookup('203.0.113.1').country_code).toBe('US');
    }
    const v4 = new GeoDatabase(dbFile('v4.mmdb', new MmdbWriter({ ipVersion: 4 }).insert('203.0.113.0/24', cityRecord({ countryCode: 'US' })).build()));
    expect(v4.lookup('203.0.113.1').country_code).toBe('US');
    expect(v4.lookup('::ffff:203.0.113.1').country_code).toBe('US');
    expect(v4.lookup('2001:db8::1')).toBe(CEL_NO_GEO); // no IPv6 in an IPv4 tree
  });

  it('gives the same view for the same record (mapped once per record)', () => {
    const db = new GeoDatabase(dbFile('same.mmdb'));
    expect(db.lookup('203.0.113.1')).toBe(db.lookup('203.0.113.200'));
    expect(geoOfRecord({})).toEqual(CEL_NO_GEO);
  });

  it('refuses an unusable file in one line naming the path and variable', () => {
    const cases: [string, RegExp][] = [
      [path.join(dir, 'missing.mmdb'), /^WARREN_GEOIP_DB=.*missing\.mmdb: cannot read the GeoIP database: ENOENT/],
      [dbFile('zipped.mmdb.gz', gzipSync(testDatabase())), /gzip-compressed/],
      [dbFile('text.mmdb', Buffer.from('hello, not a database\n')), /: not a MaxMind DB \(\.mmdb\) file: no metadata section/],
      [dbFile('truncated.mmdb', testDatabase().subarray(0, 40)), /not a MaxMind DB|cannot read/],
    ];
    const d = path.join(dir, 'adir.mmdb');
    mkdirSync(d, { recursive: true });
    cases.push([d, /is a directory/]);
    for (const [file, message] of cases) {
      let err: unknown;
      try {
        startGeo(file, silent);
      } catch (e) {
        err = e;
      }
      expect(err, file).toBeInstanceOf(GeoDatabaseError);
      expect(err).toBeInstanceOf(EnvError); // main() prints an EnvError as one line and exits 1
      expect((err as Error).message).toMatch(message);
      expect((err as Error).message).not.toContain('\n');
    }
  });

  it('reloads a changed file, keeps the previous one when the new one is broken', async () => {
    const file = dbFile('reload.mmdb');
    const logged: string[] = [];
    const log = pino({ level: 'info' }, { write: (line: string) => logged.push(JSON.parse(line).msg as string) });
    const db = new GeoDatabase(file);
    expect(db.lookup('127.0.0.1').city).toBe('Loopback');
    writeFileSync(file, testDatabase({ xxCity: 'Reloaded' }));
    expect(await db.reload(log)).toBe(true);
    expect(db.lookup('127.0.0.1').city).toBe('Reloaded');
    writeFileSync(file, 'garbage');
    expect(await db.reload(log)).toBe(false);
    expect(db.lookup('127.0.0.1').city).toBe('Reloaded');
    expect(logged).toEqual(['GeoIP database reloaded', 'GeoIP database changed but cannot be read; the previous one stays in use']);
    // Watching: a new file is picked up by polling.
    db.watch(log, 20);
    try {
      // fs.watchFile takes its first stat asynchronously: a file written before that stat is its
      // baseline, not a change (seen under a loaded test run). So the file is written again, a
      // little longer each time, until the watcher has picked a version up.
      let n = 0;
      await vi.waitFor(
        () => {
          const city = String(db.lookup('127.0.0.1').city);
          if (!city.startsWith('Watched')) writeFileSync(file, testDatabase({ xxCity: `Watched, a longer name${'!'.repeat(++n)}` }));
          expect(city).toMatch(/^Watched, a longer name!+$/);
        },
        { timeout: 10_000, interval: 100 },
      );
    } finally {
      db.close();
    }
  });
});

describe('conn.geo in traffic policies', () => {
  const stage = (policy: unknown): RouteStage => trafficPolicyStage(route(policy), EDGE, CONFIG, deps())!;
  const header = (r: RequestState, name: string) => r.headers.filter((_, i) => i % 2 === 1 && r.headers[i - 1]!.toLowerCase() === name)[0];
  const DENY_XX = { inbound: [{ expressions: ["conn.geo.country_code == 'XX'"], actions: [{ type: 'deny', config: { status_code: 451 } }] }] };
  const DENY_LIST = { inbound: [{ expressions: ["conn.geo.country_code in ['XX', 'GB']"], actions: [{ type: 'deny' }] }] };
  const ALLOW_LIST = { inbound: [{ expressions: ["!(conn.geo.country_code in ['US'])"], actions: [{ type: 'deny' }] }] };
  const SHOW = {
    inbound: [
      {
        actions: [
          {
            type: 'add-headers',
            config: { headers: { 'x-geo': '${conn.geo.city}|${conn.geo.country}|${conn.geo.country_code}|${conn.geo.subdivision}|${conn.geo.latitude}|${conn.geo.longitude}|${conn.geo.radius}' } },
          },
        ],
      },
    ],
  };

  it('denies by country and shows every field', async () => {
    setGeoDatabase(new GeoDatabase(dbFile('policy.mmdb')));
    const deny = stage(DENY_XX);
    expect(await deny.onRequest!(request({ ip: '127.0.0.1' }))).toMatchObject({ status: 451 });
    expect(await deny.onRequest!(request({ ip: '::ffff:127.0.0.9' }))).toMatchObject({ status: 451 });
    expect(await deny.onRequest!(request({ ip: '::1' }))).toMatchObject({ status: 451 });
    expect(await deny.onRequest!(request({ ip: '203.0.113.7' }))).toBeNull();
    const show = stage(SHOW);
    const r = request({ ip: '203.0.113.7' });
    expect(await show.onRequest!(r)).toBeNull();
    expect(header(r, 'x-geo')).toBe('Strongsville|United States|US|Ohio|41.3197|-81.8358|5');
    const miss = request({ ip: '10.9.9.9' });
    await show.onRequest!(miss);
    expect(header(miss, 'x-geo')).toBe('||||||');
  });

  it('without a database: reading conn.geo is an evaluation error, so a deny rule on it denies everyone and other rules are skipped', async () => {
    setGeoDatabase(null);
    const d = deps();
    const warn = vi.spyOn(d.log, 'warn');
    const s = trafficPolicyStage(route({
      inbound: [
        { expressions: ["conn.geo.country_code == 'US'"], actions: [{ type: 'add-headers', config: { headers: { 'x-us': 'yes' } } }] },
        ...SHOW.inbound,
        { actions: [{ type: 'add-headers', config: { headers: { 'x-after': 'a' } } }] },
      ],
    }), EDGE, CONFIG, d)!;
    for (const ip of ['127.0.0.1', '203.0.113.7', '10.9.9.9']) {
      // The deny-list form (H3 of the audit) denies, as the allow-list form does.
      expect(await stage(DENY_LIST).onRequest!(request({ ip })), ip).toMatchObject({ status: 403 });
      expect(await stage(ALLOW_LIST).onRequest!(request({ ip })), ip).toMatchObject({ status: 403 });
      expect(await stage(DENY_XX).onRequest!(request({ ip })), ip).toMatchObject({ status: 451 });
      // Not a deny: the rule is skipped and the interpolated header left out, the rest goes on.
      const r = request({ ip });
      expect(await s.onRequest!(r)).toBeNull();
      expect([header(r, 'x-us'), header(r, 'x-geo'), header(r, 'x-after')]).toEqual([undefined, undefined, 'a']);
      expect(() => requestGeo(r)).toThrow(NO_GEO_DATABASE);
    }
    // Counted (expression and interpolation, per request), logged once each, naming the cause.
    expect(await d.registry.getSingleMetricAsString('warren_traffic_policy_expression_errors_total')).toContain('direction="inbound"} 6');
    expect(warn.mock.calls.map((c) => JSON.stringify(c[0]))).toEqual([
      expect.stringContaining('"where":"inbound[0].expressions[0]","err":"no GeoIP database is configured on this node (WARREN_GEOIP_DB)'),
      expect.stringContaining('"where":"add-headers x-geo","err":"no GeoIP database is configured on this node (WARREN_GEOIP_DB)'),
    ]);
    // A policy that does not read conn.geo is unaffected; the lookup without a database allocates nothing per request.
    expect(await stage({ inbound: [{ expressions: ["conn.client_ip == '1.2.3.4'"], actions: [{ type: 'deny' }] }] }).onRequest!(request())).toBeNull();
    expect(geoLookupOf(request())).toBe(geoLookupOf(request()));
  });

  it('with a database: a deny-list rule denies the listed countries only; an address not in the database reads "" (not an error)', async () => {
    setGeoDatabase(new GeoDatabase(dbFile('deny-list.mmdb')));
    const d = deps();
    const deny = trafficPolicyStage(route(DENY_LIST), EDGE, CONFIG, d)!;
    expect(await deny.onRequest!(request({ ip: '127.0.0.1' }))).toMatchObject({ status: 403 }); // XX
    expect(await deny.onRequest!(request({ ip: '198.51.100.7' }))).toMatchObject({ status: 403 }); // GB
    expect(await deny.onRequest!(request({ ip: '203.0.113.7' }))).toBeNull(); // US
    expect(await deny.onRequest!(request({ ip: '10.9.9.9' }))).toBeNull(); // not in the database
    expect(await deny.onRequest!(request({ ip: '2001:db9::1' }))).toBeNull();
    expect(requestGeo(request({ ip: '10.9.9.9' }))).toBe(CEL_NO_GEO);
    expect(await d.registry.getSingleMetricAsString('warren_traffic_policy_expression_errors_total')).not.toContain('direction="inbound"} ');
  });

  it('looks up only when an expression reads conn.geo, once per request (inbound and outbound)', async () => {
    const db = new GeoDatabase(dbFile('lazy.mmdb'));
    const lookup = vi.spyOn(db, 'lookup');
    setGeoDatabase(db);
    const other = stage({ inbound: [{ expressions: ["conn.client_ip == '1.2.3.4' || req.path == '/x'"], actions: [{ type: 'deny' }] }], outbound: [{ expressions: ['conn.server_port == 1'], actions: [{ type: 'deny' }] }] });
    const r0 = request({ ip: '127.0.0.1' });
    await other.onRequest!(r0);
    await other.onResponse!(r0, { status: 200, headers: [] });
    expect(lookup).not.toHaveBeenCalled();
    const both = stage({
      inbound: [
        { expressions: ["conn.geo.country_code == 'US'"], actions: [{ type: 'add-headers', config: { headers: { 'x-city': '${conn.geo.city}' } } }] },
        { expressions: ["conn.geo.city == 'Strongsville'"], actions: [{ type: 'add-headers', config: { headers: { 'x-sub': '${conn.geo.subdivision}' } } }] },
      ],
      outbound: [{ expressions: ["conn.geo.country_code == 'US'"], actions: [{ type: 'add-headers', config: { headers: { 'x-out': '${conn.geo.radius}' } } }] }],
    });
    const r = request({ ip: '203.0.113.7' });
    await both.onRequest!(r);
    const res = { status: 200, headers: [] as string[] };
    await both.onResponse!(r, res);
    expect([header(r, 'x-city'), header(r, 'x-sub'), res.headers[1]]).toEqual(['Strongsville', 'Ohio', '5']);
    expect(lookup).toHaveBeenCalledTimes(1);
    await both.onRequest!(request({ ip: '203.0.113.8' }));
    expect(lookup).toHaveBeenCalledTimes(2);
  });
});

/**
 * The lookup's cost, for `GEO_LOOKUP_COST`: a GeoLite2-City-sized tree walk (IPv4 /24s, 120
 * levels deep) and records of GeoLite2's shape with names in eight languages, each record
 * distinct and more of them than the reader caches, so every lookup decodes (the worst case);
 * then the same lookups with the records cached.
 */
describe('lookup cost', () => {
  it('is within GEO_LOOKUP_COST', () => {
    const N = 12_000;
    const w = new MmdbWriter({ recordSize: 28, languages: ['en', 'de', 'es', 'fr', 'ja', 'pt-BR', 'ru', 'zh-CN'] });
    const ips: string[] = [];
    for (let i = 0; i < N; i++) {
      const net = `${11 + (i >> 16)}.${(i >> 8) & 255}.${i & 255}`;
      ips.push(`${net}.77`);
      w.insert(`${net}.0/24`, cityRecord({
        city: `City ${i}`,
        country: `Country ${i % 250}`,
        countryCode: `C${i % 10}`,
        continentCode: 'EU',
        subdivisions: [[`Region ${i}`, 'R'], [`District ${i}`, 'D']],
        latitude: 40 + i / 1e4,
        longitude: -70 - i / 1e4,
        radius: 10 + (i % 500),
        postalCode: String(10000 + i),
        timeZone: 'Europe/Berlin',
        otherLanguages: ['de', 'es', 'fr', 'ja', 'pt-BR', 'ru', 'zh-CN'],
      }));
    }
    const buf = w.build();
    const db = new GeoDatabase(dbFile('bench.mmdb', buf));
    // Cycling through more records than the LRU holds: every lookup misses and decodes. In CPU
    // time (test/support/cpu-time.ts, ns a lookup): wall time also counts the waits for a core of
    // a busy box.
    const time = (ipList: string[], rounds: number) => {
      let sink = 0;
      const c0 = cpuMicros();
      for (let k = 0; k < rounds; k++) for (const ip of ipList) sink += db.lookup(ip).city.length;
      const ns = ((cpuMicros() - c0) * 1e3) / (rounds * ipList.length);
      expect(sink).toBeGreaterThan(0);
      return ns;
    };
    const slowdown = machineSlowdown();
    time(ips, 1); // warm-up (JIT)
    // The fastest of up to 8 passes, stopping once one is within the charge.
    let uncached = Infinity;
    for (let i = 0; i < 8 && uncached >= GEO_LOOKUP_COST; i++) uncached = Math.min(uncached, time(ips, 1));
    const hot = ips.slice(0, 1000);
    time(hot, 3);
    const cached = Math.min(time(hot, 5), time(hot, 5));
    // The ingress path: through the policy stage (a deny on the country that never matches).
    setGeoDatabase(db);
    const s = trafficPolicyStage(route({ inbound: [{ expressions: ["conn.geo.country_code == 'ZZ'"], actions: [{ type: 'deny' }] }] }), EDGE, CONFIG, deps())!;
    const plain = trafficPolicyStage(route({ inbound: [{ expressions: ["conn.client_ip == '0.0.0.0'"], actions: [{ type: 'deny' }] }] }), EDGE, CONFIG, deps())!;
    const reqs = hot.map((ip) => request({ ip }));
    const perRequest = (st: RouteStage) => {
      for (const r of reqs) st.onRequest!(r);
      // Fresh request states: the per-request cache starts empty (the reader's cache is warm).
      const fresh = Array.from({ length: 5 }, () => reqs.map((x) => ({ ...x, vars: {} })));
      const c0 = cpuMicros();
      for (const round of fresh) for (const r of round) st.onRequest!(r);
      return ((cpuMicros() - c0) * 1e3) / (5 * reqs.length);
    };
    const geoReq = perRequest(s);
    const plainReq = perRequest(plain);
    console.log(
      `GeoIP lookup (${(buf.length / 1e6).toFixed(1)} MB test database, ${N} GeoLite2-shaped records): ` +
        `uncached ${(uncached / 1000).toFixed(2)} µs of CPU, cached ${(cached / 1000).toFixed(2)} µs; ` +
        `policy "conn.geo.country_code == 'ZZ'" ${(geoReq / 1000).toFixed(2)} µs/request vs "conn.client_ip == …" ${(plainReq / 1000).toFixed(2)} µs; charged ${GEO_LOOKUP_COST / 1000} µs`,
    );
    // The charge (100 µs) was set from quiet-machine figures: 16 µs alone, 45 µs beside one test
    // run (wall time). With two full test runs at once on a slow day the best of 8 wall-clock
    // passes reached 100.4 µs, mostly waits for a core, which CPU time leaves out; but a walk of a
    // 6.9 MB tree shares the caches with the other processes, which CPU time counts: 20-37 µs of
    // CPU with a test run beside it, 67 µs beside two and four busy loops. Held to twice the
    // charge (raised on a box slower than the calibration one now, `machineSlowdown`): a guard
    // against a regression of a different order, a speed target is a benchmark's job; the figure
    // above is what to read.
    expect(uncached).toBeLessThan(2 * GEO_LOOKUP_COST * slowdown);
    expect(cached).toBeLessThan(uncached);
  }, 300_000); // builds a 6.9 MB database: about 4 s alone (8 s of CPU), 16 s with two test runs at once, 2 min beside more; up to 8 timed passes
});
