import { isIPv4 } from 'node:net';
import { readFileSync, statSync, unwatchFile, watchFile, type Stats } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { Reader, type CityResponse } from 'maxmind';
import { CEL_NO_GEO, CelGeo, EnvError, GEO_LIMITS, normalizeIp, type Logger } from '@warren/shared';
import type { RequestState } from '../pipeline/types.js';

/**
 * `conn.geo.*` (ngrok's geolocation variables, see `geo-vars.ts` in the shared package): the
 * client address looked up in a MaxMind-format database (GeoLite2-City, GeoIP2-City, or any
 * `.mmdb` with their record layout; a Country database fills the country fields only) that the
 * operator names with `WARREN_GEOIP_DB`. The file is read once at start (an unreadable one stops
 * the ingress with one line naming it) and again when it changes (a broken new file is logged
 * and the previous one kept). Without it, reading any `conn.geo` field is an evaluation error
 * (`NO_GEO_DATABASE`), never `""`: a rule on it is skipped and counted as any failing expression
 * is, and a rule with a deny action applies (`engine.ts`), so a deny-list such as
 * `conn.geo.country_code in ['RU', 'CN']` denies everyone on such a node rather than no one, as
 * the allow-list form `!(conn.geo.country_code in ['US'])` always did. A `${conn.geo…}`
 * interpolation fails as any failing one does (the header is left out).
 *
 * The lookup is lazy: nothing here runs unless an expression reads `conn.geo`, and then once per
 * request (inbound and outbound rules share it). Fields, from the record:
 * - `city`, `country`: `city.names.en`, `country.names.en`;
 * - `country_code`: `country.iso_code` (ISO 3166-1 alpha-2);
 * - `subdivision`: the first (largest) subdivision's `names.en`, e.g. `California`, `England`
 *   (ngrok's example is a state; MaxMind lists subdivisions from largest to smallest);
 * - `latitude`, `longitude`, `radius`: `location.latitude`, `.longitude`, `.accuracy_radius`
 *   (kilometres) as decimal strings, e.g. `37.751`, `-97.822`, `1000`.
 * A missing value is `""` (an address the database does not hold has every field `""`): not an
 * error. The physical `country` is used, never `registered_country`.
 */

/** The evaluation error of reading `conn.geo` on a node without a database. */
export const NO_GEO_DATABASE = 'no GeoIP database is configured on this node (WARREN_GEOIP_DB)';

/** `conn.geo` without a database: no value to give, an evaluation error (see above). */
function noGeoDatabase(): never {
  throw new Error(NO_GEO_DATABASE);
}

/** How many decoded values the reader keeps at most (maxmind's own default for `open()`). */
const READER_CACHE = 10_000;

/**
 * The reader's cache of decoded values by file offset (records, and what pointers point to):
 * two generations of at most `max / 2` entries each, a value read from the older one moving to
 * the newer, so what is in use stays and the rest ages out, at O(1) per access (a `Map` used as
 * an LRU, deleting and re-inserting per hit, slows down badly as deleted slots pile up).
 */
class GenerationalCache {
  private young = new Map<string | number, unknown>();
  private old = new Map<string | number, unknown>();
  constructor(private readonly max: number) {}
  get(key: string | number): unknown {
    const v = this.young.get(key);
    if (v !== undefined) return v;
    const o = this.old.get(key);
    if (o !== undefined) this.set(key, o);
    return o;
  }
  set(key: string | number, value: unknown): void {
    if (this.young.size >= this.max >> 1) {
      this.old = this.young;
      this.young = new Map();
    }
    this.young.set(key, value);
  }
}

const cut = (v: string, max: number) => (v.length > max ? v.slice(0, max) : v);
const nameOf = (names: unknown): string => {
  const en = (names as { en?: unknown } | undefined)?.en;
  return typeof en === 'string' ? cut(en, GEO_LIMITS.name) : '';
};
const numberOf = (v: unknown): string => ((typeof v === 'number' && Number.isFinite(v)) || typeof v === 'bigint' ? cut(String(v), GEO_LIMITS.number) : '');

/** A City (or Country) record as `conn.geo`. */
export function geoOfRecord(r: CityResponse): CelGeo {
  const code = r.country?.iso_code;
  const loc = r.location;
  return new CelGeo(
    nameOf(r.city?.names),
    nameOf(r.country?.names),
    typeof code === 'string' ? cut(code, GEO_LIMITS.code) : '',
    numberOf(loc?.latitude),
    numberOf(loc?.longitude),
    numberOf(loc?.accuracy_radius),
    nameOf(Array.isArray(r.subdivisions) ? r.subdivisions[0]?.names : undefined),
  );
}

/** `203.0.113.7`, `::ffff:203.0.113.7` → `203.0.113.7`; `fe80::1%eth0` → `fe80::1`; null when not an address. */
export function lookupAddress(ip: string): string | null {
  return normalizeIp(ip)?.addr ?? null;
}

export class GeoDatabaseError extends EnvError {
  override name = 'GeoDatabaseError';
}

const unreadable = (path: string, err: unknown) => new GeoDatabaseError(`WARREN_GEOIP_DB=${path}: cannot read the GeoIP database: ${(err as Error).message}`);

function readDatabase(path: string): Reader<CityResponse> {
  let buf: Buffer;
  try {
    buf = readFileSync(path);
  } catch (err) {
    throw unreadable(path, err);
  }
  return parseDatabase(path, buf);
}

function parseDatabase(path: string, buf: Buffer): Reader<CityResponse> {
  if (buf.length >= 2 && buf[0] === 0x1f && buf[1] === 0x8b) throw new GeoDatabaseError(`WARREN_GEOIP_DB=${path}: the file is gzip-compressed; decompress it (the .mmdb inside the download)`);
  const notMmdb = (why: string) => new GeoDatabaseError(`WARREN_GEOIP_DB=${path}: not a MaxMind DB (.mmdb) file: ${why}`);
  if (buf.lastIndexOf(METADATA_MARKER) < 0) throw notMmdb('no metadata section (\\xAB\\xCD\\xEFMaxMind.com)');
  let reader: Reader<CityResponse>;
  try {
    reader = new Reader<CityResponse>(buf, { cache: new GenerationalCache(READER_CACHE) });
  } catch (err) {
    throw notMmdb(String((err as Error).message).split('\n')[0]!);
  }
  const m = reader.metadata;
  if (m.binaryFormatMajorVersion !== 2) throw notMmdb(`binary format version ${String(m.binaryFormatMajorVersion)}, not 2`);
  if (m.ipVersion !== 4 && m.ipVersion !== 6) throw notMmdb(`ip_version ${String(m.ipVersion)}`);
  if (!Number.isInteger(m.nodeCount) || m.nodeCount <= 0 || m.searchTreeSize + 16 > buf.length) throw notMmdb(`node_count ${String(m.nodeCount)} does not fit the file`);
  return reader;
}

const METADATA_MARKER = Buffer.from('abcdef4d61784d696e642e636f6d', 'hex');

/** One open database: lookups, and reloading when its file changes. */
export class GeoDatabase {
  private reader: Reader<CityResponse>;
  /** Decoded record (the reader's cache hands out the same object) → its `conn.geo`. */
  private views = new WeakMap<object, CelGeo>();
  private watching = false;

  constructor(
    readonly path: string,
    reader?: Reader<CityResponse>,
  ) {
    this.reader = reader ?? readDatabase(path);
  }

  /** `database_type`, build time and size of the loaded file, for the logs. */
  describe(): { database_type: string; build: string; nodes: number; ip_version: number } {
    const m = this.reader.metadata;
    const t = m.buildEpoch.getTime();
    return { database_type: String(m.databaseType), build: Number.isFinite(t) ? m.buildEpoch.toISOString() : '', nodes: m.nodeCount, ip_version: m.ipVersion };
  }

  /** The client's `conn.geo`: every field `""` for an address the database does not hold. */
  lookup(clientIp: string): CelGeo {
    const ip = lookupAddress(clientIp);
    if (ip === null) return CEL_NO_GEO;
    const reader = this.reader;
    // An IPv4-only database has no answer for IPv6 (its tree is 32 levels deep).
    if (reader.metadata.ipVersion === 4 && !isIPv4(ip)) return CEL_NO_GEO;
    const rec = reader.get(ip);
    if (rec === null || typeof rec !== 'object') return CEL_NO_GEO;
    let g = this.views.get(rec);
    if (!g) this.views.set(rec, (g = geoOfRecord(rec)));
    return g;
  }

  /**
   * Swaps in the file as it is now (read without blocking: a GeoLite2-City file is ~60 MB); a
   * file that cannot be read is logged and the loaded one kept, so replace the file atomically
   * (write a new file, then rename it over the old one): a half-written file is refused, and
   * the finished one picked up at the next change.
   */
  async reload(log: Logger): Promise<boolean> {
    try {
      let buf: Buffer;
      try {
        buf = await readFile(this.path);
      } catch (err) {
        throw unreadable(this.path, err);
      }
      this.reader = parseDatabase(this.path, buf);
      this.views = new WeakMap();
      log.info({ path: this.path, ...this.describe() }, 'GeoIP database reloaded');
      return true;
    } catch (err) {
      log.error({ path: this.path, err: (err as Error).message }, 'GeoIP database changed but cannot be read; the previous one stays in use');
      return false;
    }
  }

  /** Reloads when the file changes (polled every `intervalMs`; does not keep the process alive). */
  watch(log: Logger, intervalMs = 10_000): void {
    if (this.watching) return;
    this.watching = true;
    let running: Promise<unknown> | null = null;
    let again = false;
    const run = (): void => {
      if (running) {
        again = true; // changed again while reading: read once more after
        return;
      }
      running = this.reload(log).finally(() => {
        running = null;
        if (again) {
          again = false;
          run();
        }
      });
    };
    watchFile(this.path, { persistent: false, interval: intervalMs }, (cur: Stats, prev: Stats) => {
      // Removed (mtime 0): keep serving the loaded one until a new file appears.
      if (cur.mtimeMs === 0 || (cur.mtimeMs === prev.mtimeMs && cur.size === prev.size && cur.ino === prev.ino)) return;
      run();
    });
  }

  close(): void {
    if (this.watching) unwatchFile(this.path);
    this.watching = false;
  }
}

let database: GeoDatabase | null = null;
/**
 * Where a request keeps its `conn.geo` (on `s.vars`, under a symbol: invisible to the traffic
 * event and to `vars.*`), looked up once and shared by its inbound and outbound rules. A
 * `WeakMap` keyed by request measured ~1 µs more per request (its entries weigh on the GC).
 */
const REQUEST_GEO = Symbol('conn.geo');

/** The database `conn.geo` reads (null: none, reading it is an error); set at start, and by tests. */
export function setGeoDatabase(db: GeoDatabase | null): void {
  database = db;
}

export function geoDatabase(): GeoDatabase | null {
  return database;
}

/** `s`'s `conn.geo`, looked up on the first call for the request; throws `NO_GEO_DATABASE` without a database. */
export function requestGeo(s: RequestState): CelGeo {
  const db = database;
  if (!db) return noGeoDatabase();
  const v = s.vars as Record<symbol, CelGeo | undefined>;
  return (v[REQUEST_GEO] ??= db.lookup(s.clientIp));
}

/**
 * What `CelConn` calls if an expression reads `conn.geo`. Without a database, one that throws
 * `NO_GEO_DATABASE` (never null: `CelConn` would read that as every field `""`, which lets a
 * deny-list rule deny no one).
 */
export function geoLookupOf(s: RequestState): () => CelGeo {
  return database ? () => requestGeo(s) : noGeoDatabase;
}

/**
 * At start: opens `path` (WARREN_GEOIP_DB) and watches it, or says in one line that reading
 * `conn.geo` is an evaluation error. Throws `GeoDatabaseError` (an `EnvError`: the ingress prints one line and exits)
 * when the file cannot be used.
 */
export function startGeo(path: string | undefined, log: Logger): GeoDatabase | null {
  if (!path) {
    setGeoDatabase(null);
    log.info(`WARREN_GEOIP_DB is not set: reading conn.geo.* in a traffic policy is an evaluation error (${NO_GEO_DATABASE}): a rule with a deny action applies, any other is skipped`);
    return null;
  }
  // The path must name a file (a directory reads as EISDIR, but say it plainly).
  try {
    if (statSync(path).isDirectory()) throw new GeoDatabaseError(`WARREN_GEOIP_DB=${path}: is a directory, not a .mmdb file`);
  } catch (err) {
    if (err instanceof GeoDatabaseError) throw err;
    // readDatabase reports a missing or unreadable file.
  }
  const db = new GeoDatabase(path);
  setGeoDatabase(db);
  db.watch(log);
  log.info({ path, ...db.describe() }, 'GeoIP database loaded: conn.geo.* traffic-policy variables are on');
  return db;
}
