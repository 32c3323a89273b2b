import { isIP, isIPv4 } from 'node:net';

/**
 * A small MaxMind DB (`.mmdb`) writer, for tests only: MaxMind's databases cannot be downloaded
 * here, so tests build their own (format v2.0, https://maxmind.github.io/MaxMind-DB/).
 *
 * Layout: the binary search tree (one node per bit of the address, `recordSize` bits per
 * record: 24, 28 or 32), 16 zero bytes, the data section (each distinct record once; repeated
 * strings, maps and arrays as pointers to their first copy, as MaxMind's writer does), then
 * `\xAB\xCD\xEFMaxMind.com` and the metadata map. An IPv6 database holds IPv4 networks at
 * `::a.b.c.d/(96+len)`, as GeoLite2 does (the readers start IPv4 lookups at the node of `::/96`);
 * unlike MaxMind's writer it does not alias `::ffff:0:0/96` or `2002::/16` to that subtree.
 *
 * Values: strings, booleans, arrays, maps (plain objects), `Uint8Array` (bytes), and numbers as
 * typed by the wrappers below; a bare number is a uint32 when it is an integer in range, else a
 * double. Later `insert`s of an overlapping network win over earlier ones inside it.
 */

export type MmdbValue = string | number | boolean | bigint | Uint8Array | Typed | MmdbValue[] | { [key: string]: MmdbValue };

interface Typed {
  readonly $mmdb: 'double' | 'float' | 'uint16' | 'uint32' | 'int32' | 'uint64' | 'uint128';
  readonly value: number | bigint;
}

export const double = (value: number): Typed => ({ $mmdb: 'double', value });
export const float = (value: number): Typed => ({ $mmdb: 'float', value });
export const uint16 = (value: number): Typed => ({ $mmdb: 'uint16', value });
export const uint32 = (value: number): Typed => ({ $mmdb: 'uint32', value });
export const int32 = (value: number): Typed => ({ $mmdb: 'int32', value });
export const uint64 = (value: number | bigint): Typed => ({ $mmdb: 'uint64', value });
export const uint128 = (value: number | bigint): Typed => ({ $mmdb: 'uint128', value });

const isTyped = (v: unknown): v is Typed => typeof v === 'object' && v !== null && '$mmdb' in v;

// Data types (the control byte's top three bits; 8 and above are "extended").
const T = { pointer: 1, string: 2, double: 3, bytes: 4, uint16: 5, uint32: 6, map: 7, int32: 8, uint64: 9, uint128: 10, array: 11, boolean: 14, float: 15 } as const;

/** The control byte(s) of a value of `type` and `size`. */
function control(type: number, size: number): Buffer {
  const head: number[] = [];
  let sizeBits: number;
  const ext: number[] = [];
  if (size < 29) sizeBits = size;
  else if (size < 29 + 256) {
    sizeBits = 29;
    ext.push(size - 29);
  } else if (size < 285 + 65536) {
    sizeBits = 30;
    const v = size - 285;
    ext.push(v >> 8, v & 0xff);
  } else {
    sizeBits = 31;
    const v = size - 65821;
    if (v >= 1 << 24) throw new Error(`mmdb-writer: value of size ${size} is too large`);
    ext.push((v >> 16) & 0xff, (v >> 8) & 0xff, v & 0xff);
  }
  if (type <= 7) head.push((type << 5) | sizeBits);
  else head.push(sizeBits, type - 7); // extended: type bits 0, then the type minus 7
  return Buffer.from([...head, ...ext]);
}

/** Big-endian unsigned integer in the fewest bytes (zero: no bytes). */
function uintBytes(v: bigint, maxBytes: number): Buffer {
  if (v < 0n) throw new Error('mmdb-writer: negative unsigned integer');
  const out: number[] = [];
  while (v > 0n) {
    out.unshift(Number(v & 0xffn));
    v >>= 8n;
  }
  if (out.length > maxBytes) throw new Error(`mmdb-writer: integer does not fit ${maxBytes} bytes`);
  return Buffer.from(out);
}

const canon = (v: MmdbValue): string =>
  typeof v === 'string' ? `s:${v}` : `j:${JSON.stringify(v, (_k, x: unknown) => (typeof x === 'bigint' ? `${x}n` : x instanceof Uint8Array ? `b:${Buffer.from(x).toString('base64')}` : x))}`;

/**
 * Writes values one after another. With `dedupe` (the data section), a string, map or array
 * already written is written again as a pointer to the first copy, as MaxMind's writer does
 * (GeoLite2's map keys and shared country records are pointers; readers cache what pointers
 * point to). The metadata section has no pointers.
 */
class Encoder {
  private readonly chunks: Buffer[] = [];
  size = 0;
  private readonly seen: Map<string, number> | null;
  constructor(dedupe: boolean) {
    this.seen = dedupe ? new Map() : null;
  }

  private emit(b: Buffer): void {
    this.chunks.push(b);
    this.size += b.length;
  }

  /** Writes a top-level record; its offset (an identical record already written: that one's). */
  record(v: MmdbValue): number {
    const key = canon(v);
    const at = this.seen?.get(key);
    if (at !== undefined) return at;
    const start = this.size;
    this.write(v);
    return start;
  }

  write(v: MmdbValue): void {
    const dedupable = this.seen !== null && ((typeof v === 'string' && Buffer.byteLength(v) >= 2) || Array.isArray(v) || (typeof v === 'object' && !(v instanceof Uint8Array) && !isTyped(v) && Object.keys(v).length > 0));
    const key = dedupable ? canon(v) : null;
    if (key !== null) {
      const at = this.seen!.get(key);
      if (at !== undefined) return this.emit(pointer(at));
    }
    const start = this.size;
    if (Array.isArray(v)) {
      this.emit(control(T.array, v.length));
      for (const e of v) this.write(e);
    } else if (typeof v === 'object' && !(v instanceof Uint8Array) && !isTyped(v)) {
      const entries = Object.entries(v);
      this.emit(control(T.map, entries.length));
      for (const [k, val] of entries) {
        this.write(k);
        this.write(val);
      }
    } else this.emit(scalar(v));
    if (key !== null) this.seen!.set(key, start);
  }

  buffer(): Buffer {
    return Buffer.concat(this.chunks);
  }
}

/** A pointer to `offset` in the data section (001SSVVV and 1–4 more bytes). */
function pointer(offset: number): Buffer {
  if (offset < 2048) return Buffer.from([0x20 | (offset >> 8), offset & 0xff]);
  if (offset < 2048 + 524288) {
    const v = offset - 2048;
    return Buffer.from([0x28 | (v >> 16), (v >> 8) & 0xff, v & 0xff]);
  }
  if (offset < 526336 + 134217728) {
    const v = offset - 526336;
    return Buffer.from([0x30 | (v >>> 24), (v >> 16) & 0xff, (v >> 8) & 0xff, v & 0xff]);
  }
  const b = Buffer.alloc(5);
  b[0] = 0x38;
  b.writeUInt32BE(offset, 1);
  return b;
}

/** Encodes one value in full (no pointers). */
export function encodeValue(v: MmdbValue): Buffer {
  const e = new Encoder(false);
  e.write(v);
  return e.buffer();
}

function scalar(v: Exclude<MmdbValue, MmdbValue[] | { [key: string]: MmdbValue }> | Typed): Buffer {
  if (typeof v === 'string') {
    const b = Buffer.from(v, 'utf8');
    return Buffer.concat([control(T.string, b.length), b]);
  }
  if (typeof v === 'boolean') return control(T.boolean, v ? 1 : 0);
  if (typeof v === 'bigint') return scalar(uint64(v));
  if (typeof v === 'number') return scalar(Number.isInteger(v) && v >= 0 && v <= 0xffffffff ? uint32(v) : double(v));
  if (v instanceof Uint8Array) return Buffer.concat([control(T.bytes, v.length), Buffer.from(v)]);
  switch (v.$mmdb) {
    case 'double': {
      const b = Buffer.alloc(8);
      b.writeDoubleBE(Number(v.value));
      return Buffer.concat([control(T.double, 8), b]);
    }
    case 'float': {
      const b = Buffer.alloc(4);
      b.writeFloatBE(Number(v.value));
      return Buffer.concat([control(T.float, 4), b]);
    }
    case 'int32': {
      // Two's complement in four bytes (a reader takes up to four).
      const b = Buffer.alloc(4);
      b.writeInt32BE(Number(v.value));
      return Buffer.concat([control(T.int32, 4), b]);
    }
    default: {
      const max = { uint16: 2, uint32: 4, uint64: 8, uint128: 16 }[v.$mmdb];
      const b = uintBytes(BigInt(v.value), max);
      return Buffer.concat([control(T[v.$mmdb], b.length), b]);
    }
  }
}

/** A network: `a.b.c.d/len` or `x::/len` (a bare address is a /32 or /128). */
function parseNetwork(cidr: string, ipVersion: 4 | 6): { bits: number[]; length: number } {
  const [addr, lenText] = cidr.split('/') as [string, string | undefined];
  const family = isIP(addr);
  if (family === 0) throw new Error(`mmdb-writer: not an address: ${cidr}`);
  const full = family === 4 ? 32 : 128;
  const length = lenText === undefined ? full : Number(lenText);
  if (!Number.isInteger(length) || length < 0 || length > full) throw new Error(`mmdb-writer: bad prefix length: ${cidr}`);
  const bytes = family === 4 ? addr.split('.').map(Number) : ipv6Bytes(addr);
  const bits: number[] = [];
  for (const byte of bytes) for (let i = 7; i >= 0; i--) bits.push((byte >> i) & 1);
  if (family === 4 && ipVersion === 6) return { bits: [...new Array<number>(96).fill(0), ...bits], length: 96 + length };
  if (family === 6 && ipVersion === 4) throw new Error(`mmdb-writer: IPv6 network ${cidr} in an IPv4 database`);
  return { bits, length };
}

function ipv6Bytes(addr: string): number[] {
  let a = addr;
  // A trailing dotted quad (`::ffff:1.2.3.4`) → two groups.
  const dot = a.lastIndexOf(':');
  const tail = a.slice(dot + 1);
  if (isIPv4(tail)) {
    const q = tail.split('.').map(Number) as [number, number, number, number];
    a = `${a.slice(0, dot + 1)}${((q[0] << 8) | q[1]).toString(16)}:${((q[2] << 8) | q[3]).toString(16)}`;
  }
  const [l, r] = a.split('::') as [string, string | undefined];
  const left = l ? l.split(':') : [];
  const right = r ? r.split(':') : [];
  const groups = r === undefined ? left : [...left, ...new Array<string>(8 - left.length - right.length).fill('0'), ...right];
  if (groups.length !== 8) throw new Error(`mmdb-writer: bad IPv6 address ${addr}`);
  return groups.flatMap((g) => {
    const n = parseInt(g, 16);
    return [n >> 8, n & 0xff];
  });
}

/** A tree record: another node, a data record (index into `records`), or nothing. */
type Rec = { node: TreeNode } | { data: number } | null;
interface TreeNode {
  rec: [Rec, Rec];
}

export interface MmdbWriterOptions {
  /** Default 6 (IPv4 networks at `::/96`). */
  ipVersion?: 4 | 6;
  /** Bits per record: 24 (default), 28 or 32. */
  recordSize?: 24 | 28 | 32;
  /** Default `GeoLite2-City` (a `database_type` beginning "GeoIP" is MaxMind's own). */
  databaseType?: string;
  languages?: string[];
  description?: Record<string, string>;
  /** Unix seconds; default now. */
  buildEpoch?: number;
  /** Write repeated strings, maps and arrays as pointers to their first copy (default true). */
  dedupe?: boolean;
}

export class MmdbWriter {
  private readonly root: TreeNode = { rec: [null, null] };
  private readonly records: MmdbValue[] = [];
  private readonly recordIds = new Map<string, number>();
  readonly ipVersion: 4 | 6;
  readonly recordSize: 24 | 28 | 32;

  constructor(private readonly o: MmdbWriterOptions = {}) {
    this.ipVersion = o.ipVersion ?? 6;
    this.recordSize = o.recordSize ?? 24;
  }

  /** Maps `cidr` (and everything in it) to `value`. */
  insert(cidr: string, value: MmdbValue): this {
    const { bits, length } = parseNetwork(cidr, this.ipVersion);
    if (length === 0) throw new Error('mmdb-writer: a /0 network has no tree node to hang from');
    const key = canon(value);
    let id = this.recordIds.get(key);
    if (id === undefined) {
      id = this.records.push(value) - 1;
      this.recordIds.set(key, id);
    }
    let n = this.root;
    for (let depth = 0; depth < length - 1; depth++) {
      const b = bits[depth] as 0 | 1;
      const r = n.rec[b];
      if (r && 'node' in r) n = r.node;
      else {
        // Split: a data record covering this network is pushed down to both halves.
        const child: TreeNode = { rec: [r, r] };
        n.rec[b] = { node: child };
        n = child;
      }
    }
    n.rec[bits[length - 1] as 0 | 1] = { data: id };
    return this;
  }

  /** The whole `.mmdb` file. */
  build(): Buffer {
    // Number the nodes breadth-first (the root is node 0).
    const nodes: TreeNode[] = [];
    const index = new Map<TreeNode, number>();
    for (let q = [this.root]; q.length > 0; ) {
      const next: TreeNode[] = [];
      for (const n of q) {
        index.set(n, nodes.push(n) - 1);
        for (const r of n.rec) if (r && 'node' in r) next.push(r.node);
      }
      q = next;
    }
    const nodeCount = nodes.length;
    // Data section: each record once (shared parts as pointers unless `dedupe: false`); a
    // record's value is nodeCount + 16 + its offset.
    const data = new Encoder(this.o.dedupe !== false);
    const offsets = this.records.map((r) => data.record(r));
    const off = data.size;
    const value = (r: Rec): number => (r === null ? nodeCount : 'node' in r ? index.get(r.node)! : nodeCount + 16 + offsets[r.data]!);
    const rs = this.recordSize;
    const max = 2 ** rs;
    if (nodeCount + 16 + off >= max) throw new Error(`mmdb-writer: ${rs}-bit records cannot address this database; use a larger recordSize`);
    const nodeBytes = rs / 4;
    const tree = Buffer.alloc(nodeCount * nodeBytes);
    nodes.forEach((n, i) => {
      const o = i * nodeBytes;
      const l = value(n.rec[0]);
      const r = value(n.rec[1]);
      if (rs === 24) {
        tree.writeUIntBE(l, o, 3);
        tree.writeUIntBE(r, o + 3, 3);
      } else if (rs === 28) {
        tree.writeUIntBE(l & 0xffffff, o, 3);
        tree[o + 3] = ((l >>> 24) << 4) | (r >>> 24);
        tree.writeUIntBE(r & 0xffffff, o + 4, 3);
      } else {
        tree.writeUInt32BE(l, o);
        tree.writeUInt32BE(r, o + 4);
      }
    });
    const metadata: MmdbValue = {
      node_count: uint32(nodeCount),
      record_size: uint16(rs),
      ip_version: uint16(this.ipVersion),
      database_type: this.o.databaseType ?? 'GeoLite2-City',
      languages: this.o.languages ?? ['en'],
      binary_format_major_version: uint16(2),
      binary_format_minor_version: uint16(0),
      build_epoch: uint64(BigInt(this.o.buildEpoch ?? Math.floor(Date.now() / 1000))),
      description: this.o.description ?? { en: 'Warren test GeoIP database' },
    };
    return Buffer.concat([tree, Buffer.alloc(16), data.buffer(), Buffer.from('abcdef4d61784d696e642e636f6d', 'hex'), encodeValue(metadata)]);
  }
}

export interface CityFields {
  city?: string;
  country?: string;
  countryCode?: string;
  /** Subdivisions from largest to smallest: `[name, iso code]`. */
  subdivisions?: [string, string][];
  latitude?: number;
  longitude?: number;
  /** `location.accuracy_radius`, kilometres. */
  radius?: number;
  postalCode?: string;
  continentCode?: string;
  timeZone?: string;
  /** Names in these languages too (as GeoLite2 has eight), to make records realistically large. */
  otherLanguages?: string[];
}

/** A GeoLite2-City-shaped record (the field types MaxMind uses: uint32 ids, double coordinates, uint16 radius). */
export function cityRecord(f: CityFields): MmdbValue {
  const names = (en: string): MmdbValue => Object.fromEntries([['en', en], ...(f.otherLanguages ?? []).map((l) => [l, `${en} (${l})`])]);
  let id = 1000;
  const r: Record<string, MmdbValue> = {};
  if (f.city !== undefined) r.city = { geoname_id: uint32(id++), names: names(f.city) };
  if (f.continentCode !== undefined) r.continent = { code: f.continentCode, geoname_id: uint32(id++), names: names(`Continent ${f.continentCode}`) };
  if (f.country !== undefined || f.countryCode !== undefined) {
    const c: Record<string, MmdbValue> = { geoname_id: uint32(id++) };
    if (f.countryCode !== undefined) c.iso_code = f.countryCode;
    if (f.country !== undefined) c.names = names(f.country);
    r.country = c;
    r.registered_country = c;
  }
  if (f.latitude !== undefined || f.longitude !== undefined || f.radius !== undefined) {
    const l: Record<string, MmdbValue> = {};
    if (f.radius !== undefined) l.accuracy_radius = uint16(f.radius);
    if (f.latitude !== undefined) l.latitude = double(f.latitude);
    if (f.longitude !== undefined) l.longitude = double(f.longitude);
    if (f.timeZone !== undefined) l.time_zone = f.timeZone;
    r.location = l;
  }
  if (f.postalCode !== undefined) r.postal = { code: f.postalCode };
  if (f.subdivisions) r.subdivisions = f.subdivisions.map(([name, iso]) => ({ geoname_id: uint32(id++), iso_code: iso, names: names(name) }));
  return r;
}
