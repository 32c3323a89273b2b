/**
 * `conn.geo.*`, ngrok's geolocation variables of the client address
 * (https://ngrok.com/docs/traffic-policy/variables/connection#connection-geo-variables):
 * `city`, `country`, `country_code`, `latitude`, `longitude`, `radius` and `subdivision`, all
 * `string` as ngrok documents them (`double(conn.geo.latitude) >= 45.0`, `conn.geo.radius <= '5'`).
 *
 * The ingress looks the client address up in a MaxMind-format database (`WARREN_GEOIP_DB`) the
 * first time an expression reads `conn.geo` in a request, once per request. Every field is `""`
 * when the address is not in it, or when the database has no value for the field (so
 * `conn.geo.country_code == 'US'` is then false, and `double(conn.geo.latitude)` an evaluation
 * error: test `conn.geo.latitude != ''` first). An ingress without a database has no answer:
 * reading `conn.geo` there is an evaluation error (its lookup throws; `services/ingress/src/policy/geo.ts`),
 * so a deny rule on it applies and any other rule is skipped, never a silent `""` that a
 * deny-list (`conn.geo.country_code in ['RU', 'CN']`) would let everyone through with.
 */

/** Longest value of each field: longer values in a database are cut (so the cost estimate can bound them). */
export const GEO_LIMITS = {
  /** `city`, `country`, `subdivision`: English names (the longest real ones are under 100 characters). */
  name: 256,
  /** `country_code`: two letters (ISO 3166-1 alpha-2). */
  code: 8,
  /** `latitude`, `longitude`, `radius`: a JavaScript number as a string (`-12.3456`, `1000`). */
  number: 32,
} as const;

/**
 * Worst-case cost of the one lookup of a request (≈ ns, the unit of `cost.ts`): walking the
 * search tree (up to 128 levels) and decoding a record the reader's cache does not hold: the
 * reader decodes the whole record, and a GeoLite2-City one has names in eight languages.
 * Measured by `services/ingress/src/policy/geo.test.ts` on GeoLite2-shaped records: ~15–25 µs
 * uncached, up to ~45 µs with the test suite running beside it; ~1–2 µs cached (most requests:
 * the reader keeps 10,000 decoded values). Charged at about twice the loaded figure.
 */
export const GEO_LOOKUP_COST = 100_000;

/** `conn.geo`: one lookup's result, never modified (the "no data" value is shared). */
export class CelGeo {
  constructor(
    readonly city = '',
    readonly country = '',
    readonly country_code = '',
    readonly latitude = '',
    readonly longitude = '',
    readonly radius = '',
    readonly subdivision = '',
  ) {}
}

/** `conn.geo` of an address the database does not know (or of a view given no lookup at all): every field `""`. */
export const CEL_NO_GEO = new CelGeo();
