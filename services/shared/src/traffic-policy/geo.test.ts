import { describe, expect, it, vi } from 'vitest';
import { CEL_TIME, CelActions, CelConn, CelRequest } from './cel-vars.js';
import { CelCompileError, compileExpression } from './cel.js';
import { estimateCost } from './cost.js';
import { CEL_NO_GEO, CelGeo, GEO_LIMITS, GEO_LOOKUP_COST } from './geo-vars.js';
import { parseTrafficPolicy } from './parse.js';

/** `conn.geo.*` as CEL sees it (the lookup itself is the ingress's: services/ingress/src/policy/geo.ts). */

const SF = new CelGeo('San Francisco', 'United States', 'US', '37.7749', '-122.4194', '20', 'California');

function activation(lookup: (() => CelGeo) | null) {
  return {
    req: new CelRequest({ method: 'GET', scheme: 'https', host: 'app.example.com', authority: 'app.example.com', path: '/', rawQuery: '', headers: () => [] }),
    conn: new CelConn('203.0.113.7', 443, null, false, lookup),
    actions: new CelActions(),
    time: CEL_TIME,
  };
}
const run = (expr: string, act: object): unknown => compileExpression('inbound', expr, false)(act);

describe('conn.geo', () => {
  it('has ngrok’s seven fields, all strings', () => {
    const act = activation(() => SF);
    expect(run('[conn.geo.city, conn.geo.country, conn.geo.country_code, conn.geo.latitude, conn.geo.longitude, conn.geo.radius, conn.geo.subdivision]', act)).toEqual([
      'San Francisco',
      'United States',
      'US',
      '37.7749',
      '-122.4194',
      '20',
      'California',
    ]);
    // ngrok's documented examples.
    expect(run("conn.geo.country_code != 'US'", act)).toBe(false);
    expect(run("conn.geo.country == 'United States'", act)).toBe(true);
    expect(run('double(conn.geo.latitude) >= 45.0', act)).toBe(false);
    expect(run('double(conn.geo.longitude) <= -93.0', act)).toBe(true);
    // ngrok's radius example compares strings, lexicographically ('20' < '5'); int() compares numbers.
    expect(run("conn.geo.radius <= '5'", act)).toBe(true);
    expect(run('int(conn.geo.radius) <= 5', act)).toBe(false);
    expect(run("conn.geo.subdivision == 'California'", act)).toBe(true);
    expect(run("conn.geo.country_code in ['US', 'CA'] && conn.geo.city.startsWith('San')", act)).toBe(true);
  });

  it('type-checks: strings, unknown fields refused', () => {
    expect(() => compileExpression('inbound', 'conn.geo.latitude > 45.0')).toThrow(CelCompileError);
    expect(() => compileExpression('inbound', "conn.geo.postal_code == '94107'")).toThrow(/postal_code/);
    expect(() => compileExpression('outbound', "conn.geo.country_code == 'US'")).not.toThrow();
  });

  it('without a lookup every field is "" (so an equality is false and double() an error)', () => {
    const act = activation(null);
    expect(act.conn.geo).toBe(CEL_NO_GEO);
    expect(run("conn.geo.country_code == 'US'", act)).toBe(false);
    expect(run("conn.geo.city + conn.geo.country + conn.geo.country_code + conn.geo.latitude + conn.geo.longitude + conn.geo.radius + conn.geo.subdivision", act)).toBe('');
    expect(() => run('double(conn.geo.latitude) > 0.0', act)).toThrow();
    expect(run("conn.geo.latitude != '' && double(conn.geo.latitude) > 0.0", act)).toBe(false);
  });

  it('a lookup that throws (the ingress without a database) makes reading any field an evaluation error, never ""', () => {
    const lookup = vi.fn((): CelGeo => {
      throw new Error('no GeoIP database is configured on this node (WARREN_GEOIP_DB)');
    });
    const act = activation(lookup);
    for (const field of ['city', 'country', 'country_code', 'latitude', 'longitude', 'radius', 'subdivision']) {
      expect(() => run(`conn.geo.${field} == ''`, act), field).toThrow(/no GeoIP database is configured/);
    }
    expect(() => run("conn.geo.country_code in ['RU', 'CN']", act)).toThrow(/no GeoIP database/);
    expect(() => run("!(conn.geo.country_code in ['US'])", act)).toThrow(/no GeoIP database/);
    // CEL's own error rules: `||` / `&&` decided by their other side still are.
    expect(run("conn.geo.country_code == 'US' || conn.client_ip == '203.0.113.7'", act)).toBe(true);
    expect(run("conn.geo.country_code == 'US' && conn.client_ip == '10.0.0.1'", act)).toBe(false);
    expect(run("conn.client_ip == '203.0.113.7'", act)).toBe(true);
  });

  it('looks up lazily: not for other conn fields, once however often read', () => {
    const lookup = vi.fn(() => SF);
    const act = activation(lookup);
    expect(run("conn.client_ip == '203.0.113.7' && conn.server_port == 443 && conn.tls.version == ''", act)).toBe(true);
    expect(lookup).not.toHaveBeenCalled();
    expect(run("conn.geo.country_code == 'US' && conn.geo.city == 'San Francisco'", act)).toBe(true);
    expect(run('conn.geo.subdivision', act)).toBe('California');
    expect(lookup).toHaveBeenCalledTimes(1);
  });

  it('is charged one lookup per policy in the cost estimate, bounded strings', () => {
    const base = estimateCost(compileExpression('inbound', "conn.client_ip == 'x'"));
    const one = estimateCost(compileExpression('inbound', "conn.geo.country_code == 'XX'"));
    const two = estimateCost(compileExpression('inbound', "conn.geo.country_code == 'XX' || conn.geo.city == 'Y'"));
    expect(one - base).toBeGreaterThanOrEqual(GEO_LOOKUP_COST);
    expect(two - one).toBeLessThan(GEO_LOOKUP_COST / 2);
    // A regexp on a name is bounded by GEO_LIMITS.name, far from the request-string bound.
    const re = estimateCost(compileExpression('inbound', "conn.geo.city.matches('^(a|b)*a(a|b){30}$')"));
    const reqRe = estimateCost(compileExpression('inbound', "req.path.matches('^(a|b)*a(a|b){30}$')"));
    expect(re).toBeLessThan(reqRe / 10);
    expect(GEO_LIMITS.name).toBeGreaterThanOrEqual(128);
    // Saved policies using it are accepted.
    expect(() =>
      parseTrafficPolicy(
        JSON.stringify({
          inbound: [
            { expressions: ["conn.geo.country_code == 'XX'"], actions: [{ type: 'deny' }] },
            { actions: [{ type: 'add-headers', config: { headers: { 'x-geo': '${conn.geo.city}/${conn.geo.subdivision}/${conn.geo.country_code} ${conn.geo.latitude},${conn.geo.longitude}±${conn.geo.radius}km' } } }] },
          ],
        }),
      ),
    ).not.toThrow();
  });
});
